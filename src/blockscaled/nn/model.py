"""``quantize_model``: replace a model's ``torch.nn.Linear`` layers with ``blockscaled.nn.Linear``."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

import torch

from .._checks import check_flag
from ..formats import Format, ScaleRounding, get_format
from ..tensor import ScaledTensor
from .experts import Experts, hf_experts_layout
from .linear import Linear, default_weight_block
from .router import fuse_routers as _fuse_routers

__all__ = ["quantize_model", "QuantizationReport", "DEFAULT_EXCLUDE", "quantization_report"]

#: Layers ``quantize_model`` leaves in their float dtype unless ``exclude`` says otherwise
#: (fnmatch patterns on qualified module names, case-sensitive):
#:
#: * the LM head (``lm_head``; often tied to the embedding, and the logits are precision-sensitive);
#: * MoE routers: expert-choice logits are tiny GEMMs whose rounding flips top-k choices.
#:   HF names them ``mlp.gate`` (Mixtral ``block_sparse_moe.gate``, Qwen2/3-MoE, OLMoE,
#:   DeepSeek; note ``"*.gate"`` does not match the dense MLP's ``gate_proj`` or Phi-3's
#:   ``gate_up_proj``, which are quantized), ``router`` (gpt-oss, Granite-MoE, DBRX
#:   ``router.layer``, Jamba) and Qwen2-MoE's one-output ``shared_expert_gate``.
#:   (In transformers 5 most routers are router modules, not ``nn.Linear``, and are never
#:   touched; the patterns cover older and remote-code models whose routers are ``nn.Linear``.)
DEFAULT_EXCLUDE: tuple[str, ...] = ("lm_head", "*.lm_head", "gate", "*.gate", "*router*", "*shared_expert_gate")

_REPORT_ATTR = "_blockscaled_report"


@dataclass
class QuantizationReport:
    """What :func:`quantize_model` did to each candidate layer.

    Attributes:
        format: the format name.
        weight_only: whether the new layers run weight-only.
        quantized: qualified names of the ``nn.Linear`` modules replaced by ``blockscaled.nn.Linear``.
        skipped: ``{name: reason}`` for ``nn.Linear`` (and subclass) modules left as they were:
            excluded by a pattern, not included, K not a multiple of the format's K block, a
            subclass of ``nn.Linear`` (whose users may read ``.weight`` directly), or already a
            ``blockscaled.nn.Linear`` (a second call).
        quantized_experts: qualified names of fused MoE experts modules (transformers'
            ``MixtralExperts``, ``Qwen3MoeExperts``, ``DeepseekV3Experts``, ``GptOssExperts``, ...)
            replaced by :class:`blockscaled.nn.Experts`.
        experts: ``{name: reason}`` of modules holding 3-D (fused expert) weights that were left
            in their float dtype (not a recognised layout, excluded, K not a multiple of the block).
        bytes_before / bytes_after: weight (and bias) bytes of the replaced layers and experts.
        fused_routers: qualified names of transformers router modules whose top-k now runs as one
            kernel (:func:`blockscaled.nn.fuse_routers`; their weights stay in float).
        routers: ``{name: reason}`` of recognised router modules left as they were.
        prepacked: names of the quantized layers holding an exact fp8_block copy
            (``prepack=True``, :meth:`blockscaled.nn.Linear.prepack`); ``not_prepacked``:
            ``{name: reason}`` of those that could not.

    Example::

        model = quantize_model(model, "fp8_block")
        print(quantization_report(model))       # one line per category
    """

    format: str
    weight_only: bool
    quantized: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    quantized_experts: list[str] = field(default_factory=list)
    experts: dict[str, str] = field(default_factory=dict)
    bytes_before: int = 0
    bytes_after: int = 0
    fused_routers: list[str] = field(default_factory=list)
    routers: dict[str, str] = field(default_factory=dict)
    prepacked: list[str] = field(default_factory=list)
    not_prepacked: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        mode = "weight-only" if self.weight_only else "W x A"
        lines = [f"blockscaled {self.format} ({mode}): {len(self.quantized)} Linear layers and "
                 f"{len(self.quantized_experts)} experts modules quantized "
                 f"({self.bytes_before / 2**20:.2f} MiB -> {self.bytes_after / 2**20:.2f} MiB)"
                 + (f", {len(self.fused_routers)} routers fused" if self.fused_routers else "")
                 + (f", {len(self.prepacked)} with an fp8_block copy" if self.prepacked else "")]
        for name, why in self.skipped.items():
            lines.append(f"  kept {name}: {why}")
        for name, why in self.experts.items():
            lines.append(f"  kept experts {name}: {why}")
        for name, why in self.routers.items():
            lines.append(f"  router {name} not fused: {why}")
        for name, why in self.not_prepacked.items():
            lines.append(f"  no fp8_block copy of {name}: {why}")
        return "\n".join(lines)


def quantization_report(model: torch.nn.Module) -> QuantizationReport | None:
    """The :class:`QuantizationReport` of the last :func:`quantize_model` call on ``model``
    (None if it was never quantized). Example: ``print(quantization_report(model))``."""
    return getattr(model, _REPORT_ATTR, None)


def _patterns(name: str, value) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    try:
        pats = tuple(value)
    except TypeError:
        raise TypeError(f"{name}: expected None, a pattern string or a sequence of them, got "
                        f"{type(value).__name__}") from None
    for p in pats:
        if not isinstance(p, str):
            raise TypeError(f"{name}: expected pattern strings, got {p!r} ({type(p).__name__})")
    return pats


def _matches(qualname: str, patterns: tuple[str, ...]) -> str | None:
    return next((p for p in patterns if fnmatchcase(qualname, p)), None)


def child_format(m: torch.nn.Module) -> str:
    return m.format.name if isinstance(m, Linear) else m.w_gate.format.name


def _experts_bytes(q: Experts) -> int:
    ts = [q.w_gate, q.w_up, q.w_down, q.gate_bias, q.up_bias, q.down_bias]
    if q.w_gate_up is not None:  # w_gate / w_up are views of its rows (nn/experts.py)
        ts[:2] = [q.w_gate_up]
    n = 0
    for t in ts:
        if t is None:
            continue
        if isinstance(t, ScaledTensor):
            n += t.data.numel() * t.data.element_size() + t.scale.numel() * t.scale.element_size()
        else:
            n += t.numel() * t.element_size()
    return n


def _experts_reason(mod: torch.nn.Module, name: str, f: Format, inc, exc) -> str | None:
    """None if ``mod`` (a module with 3-D parameters) is to be replaced by Experts, else why not."""
    layout = hf_experts_layout(mod)
    if layout is None:
        params = ", ".join(n for n, p in mod.named_parameters(recurse=False) if p.ndim >= 3)
        return f"{type(mod).__name__} ({params}): not a recognised experts layout"
    if inc is not None and _matches(name, inc) is None:
        return "not matched by include"
    pat = _matches(name, exc)
    if pat is not None:
        return f"excluded by pattern {pat!r}"
    gu, dn = mod.gate_up_proj, mod.down_proj
    h, i = (gu.shape[1], dn.shape[1]) if layout == "gpt_oss" else (gu.shape[2], dn.shape[2])
    for what, k in (("hidden", h), ("intermediate", i)):
        if k % f.block_k:
            return f"{what} size {k} is not a multiple of {f.name}'s {f.block_k}-element block"
    return None


def _set_report(model: torch.nn.Module, report: QuantizationReport) -> None:
    setattr(model, _REPORT_ATTR, report)


def _linear_bytes(m: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*m.parameters(recurse=False), *m.buffers(recurse=False)))


def quantize_model(model: torch.nn.Module, fmt: str | Format, *, include=None, exclude=DEFAULT_EXCLUDE,
                   weight_only: bool = False, block: tuple[int, int] | None = None,
                   rounding: ScaleRounding | str | None = None, inplace: bool = True,
                   fuse_routers: bool = True, prepack: bool = False) -> torch.nn.Module:
    """Replace the ``torch.nn.Linear`` layers of ``model`` with :class:`blockscaled.nn.Linear`.

    Args:
        model: any module (e.g. a Hugging Face ``*ForCausalLM``), weights bf16/fp16/fp32 on the
            device the quantization should run on (CUDA kernels; CPU: the reference quantizer,
            or the Triton interpreter under ``TRITON_INTERPRET=1``).
        fmt: ``"fp8_block"`` (128x128 weight blocks by default), ``"mxfp8"``, ``"mxfp4"``,
            ``"nvfp4"`` (any case) or a Format.
        include: fnmatch pattern(s) on qualified module names (``"model.layers.0.mlp.down_proj"``);
            ``None`` (default): every layer. A layer is a candidate if it matches one.
        exclude: pattern(s) of layers to keep in float, checked after ``include``; default
            :data:`DEFAULT_EXCLUDE` (LM head, MoE routers and gates; ``gate_proj`` stays
            quantized). Pass ``()`` to quantize everything included.
        weight_only: the new layers multiply bf16/fp16 activations by the dequantized weight
            (W8A16 / W4A16) instead of quantizing activations too.
        block / rounding: weight block and scale rounding (default: 128x128 for fp8_block, the
            format's defaults otherwise).
        inplace: modify ``model`` (default) or a deep copy of it.
        fuse_routers: also give transformers' MoE router modules (Mixtral, Qwen2/3-MoE, OLMoE,
            gpt-oss, DeepSeek-V3) a forward whose top-k is one kernel
            (:func:`blockscaled.nn.fuse_routers`: the same outputs, checked on random inputs
            first; their weights stay in float). ``include`` / ``exclude`` do not apply to it
            (they choose what is quantized); ``fuse_routers=False`` leaves every router as it is.
        prepack: mxfp4 W x A only: give each new layer an exact fp8_block copy of its weight
            (:meth:`blockscaled.nn.Linear.prepack`), which large token counts run on Hopper's FP8
            tensor cores (measured 1.13-1.62x at M >= 2048); 2x the mxfp4 weight bytes more.
            Layers whose weight cannot be re-encoded exactly keep only the mxfp4 weight (listed
            in the report). Host-synchronising.

    Only modules whose type is exactly ``torch.nn.Linear`` are replaced: subclasses (e.g.
    ``nn.MultiheadAttention``'s ``out_proj``) may read ``.weight`` directly. Layers whose K
    (``in_features``) is not a multiple of the format's K block (128 fp8_block, 32 MX, 16
    nvfp4) are kept: their last block would be partial.

    Fused MoE experts modules of transformers models (``MixtralExperts``, ``Qwen2MoeExperts``,
    ``Qwen3MoeExperts``, ``DeepseekV3Experts``, ``OlmoeExperts``: SiLU, gate rows then up rows;
    ``GptOssExperts``: interleaved gate / up, biases, clamped activation; see
    :func:`blockscaled.nn.hf_experts_layout`) matched by ``include`` / ``exclude`` like a layer
    are replaced by :class:`blockscaled.nn.Experts`, which takes the same
    ``(hidden_states, top_k_index, top_k_weights)`` call: the model's router keeps its float weights
    (``fuse_routers`` only moves its top-k into one kernel). Other modules holding 3-D weights are kept in float and listed with the reason.

    Returns the (same or copied) model, with a :class:`QuantizationReport` attached (read it
    with :func:`quantization_report`). Activations reaching the new layers must be bf16/fp16.

    Example::

        from transformers import AutoModelForCausalLM
        import blockscaled.nn as bsnn
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16, device_map="cuda")
        bsnn.quantize_model(model, "fp8_block")
        print(bsnn.quantization_report(model))
        model.generate(**inputs, max_new_tokens=32)
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    f = get_format(fmt)
    inc = _patterns("include", include)
    exc = _patterns("exclude", exclude) or ()
    check_flag("weight_only", weight_only)
    check_flag("inplace", inplace)
    check_flag("fuse_routers", fuse_routers)
    check_flag("prepack", prepack)
    if prepack and (f.name != "mxfp4" or weight_only):
        raise ValueError(f"prepack: the fp8_block copy is for mxfp4 W x A layers, got {f.name}"
                         f"{' weight-only' if weight_only else ''}")
    blk = default_weight_block(f) if block is None else block
    if not inplace:
        model = copy.deepcopy(model)
    report = QuantizationReport(format=f.name, weight_only=weight_only)
    # Collect first: replacing children while named_modules() walks them would skip some.
    todo: list[tuple[torch.nn.Module, str, str, torch.nn.Linear]] = []
    experts_todo: list[tuple[torch.nn.Module, str, str, torch.nn.Module]] = []
    for qualname, mod in model.named_modules():
        fused = [n for n, p in mod.named_parameters(recurse=False) if p.ndim >= 3]
        if fused and not qualname:
            report.experts[""] = f"3-D parameters {', '.join(fused)} of the root module"
        for child_name, child in mod.named_children():
            name = f"{qualname}.{child_name}" if qualname else child_name
            if isinstance(child, (Linear, Experts)):
                what = "Linear" if isinstance(child, Linear) else "Experts"
                report.skipped[name] = f"already a blockscaled.nn.{what} ({child_format(child)})"
                continue
            if any(p.ndim >= 3 for p in child.parameters(recurse=False)):
                why = _experts_reason(child, name, f, inc, exc)
                if why is None:
                    experts_todo.append((mod, child_name, name, child))
                else:
                    report.experts[name] = why
                continue
            if not isinstance(child, torch.nn.Linear):
                continue
            if inc is not None and _matches(name, inc) is None:
                report.skipped[name] = "not matched by include"
                continue
            pat = _matches(name, exc)
            if pat is not None:
                report.skipped[name] = f"excluded by pattern {pat!r}"
                continue
            if type(child) is not torch.nn.Linear:
                report.skipped[name] = (f"{type(child).__name__} is a subclass of nn.Linear (its users may read "
                                        f".weight directly)")
                continue
            k = child.in_features
            if k % f.block_k:
                report.skipped[name] = f"K={k} is not a multiple of {f.name}'s {f.block_k}-element block"
                continue
            todo.append((mod, child_name, name, child))
    for parent, child_name, name, child in todo:
        q = Linear.from_linear(child, f, weight_only=weight_only, block=blk, rounding=rounding)
        if prepack:
            why = q.prepack()
            if why is None:
                report.prepacked.append(name)
            else:
                report.not_prepacked[name] = why
        report.bytes_before += _linear_bytes(child)
        report.bytes_after += _linear_bytes(q)  # (the buffers: a packed copy counts)
        setattr(parent, child_name, q)
        report.quantized.append(name)
    for parent, child_name, name, child in experts_todo:
        q = Experts.from_hf(child, f, weight_only=weight_only)
        report.bytes_before += _linear_bytes(child)
        report.bytes_after += _experts_bytes(q)
        setattr(parent, child_name, q)
        report.quantized_experts.append(name)
    if fuse_routers:
        for name, why in _fuse_routers(model).items():
            if why is None:
                report.fused_routers.append(name)
            else:
                report.routers[name] = why
    _set_report(model, report)
    return model
