"""``load_quantized``: put a pre-quantized checkpoint straight into a model built from its config.

The checkpoint's block-scaled tensors are read with :mod:`blockscaled.checkpoint` (the layout of
each module is detected from its keys: DeepSeek-V3 / FineGrainedFP8, ModelOpt NVFP4,
compressed-tensors, gpt-oss MXFP4) and become :class:`~blockscaled.nn.Linear` /
:class:`~blockscaled.nn.Experts` modules in place of the model's ``nn.Linear`` layers and fused
experts modules; every other tensor (embeddings, norms, routers, LM head, biases) is loaded into
the model as it is. Nothing is dequantized or re-encoded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from ..checkpoint import (detect_layout, load_compressed_tensors, load_file, load_fp8_block, load_gpt_oss_mxfp4,
                          load_modelopt_nvfp4)
from ..checkpoint._common import as_mapping
from ..tensor import ScaledTensor
from .experts import Experts, _deinterleave, _rows, hf_experts_layout
from .linear import Linear
from .model import QuantizationReport, _experts_bytes, _linear_bytes, _set_report

__all__ = ["load_quantized"]

#: per-expert projection names in checkpoints that store experts one by one (DeepSeek-V3,
#: Qwen2/3-MoE: gate_proj / up_proj / down_proj; Mixtral: w1 / w3 / w2)
_EXPERT_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))
#: the loaders' suffixes: every key a quantized module consumes
_QUANT_SUFFIXES = ("weight", "weight_scale", "weight_scale_inv", "weight_scale_2", "input_scale", "weight_packed",
                   "weight_global_scale", "input_global_scale", "weight_shape", "weight_zero_point")


def _load_weight(tensors, prefix: str, layout: str) -> ScaledTensor:
    if layout == "fp8_block":
        return load_fp8_block(tensors, prefix)
    if layout == "modelopt_nvfp4":
        return load_modelopt_nvfp4(tensors, prefix).weight
    if layout == "compressed_tensors":
        return load_compressed_tensors(tensors, prefix).weight
    raise ValueError(f"{prefix}: layout {layout!r} holds no single weight matrix")


def _stack(ws: list[ScaledTensor], name: str) -> ScaledTensor:
    gs = [w.global_scale for w in ws]
    if gs[0] is not None and any(not torch.equal(g, gs[0]) for g in gs[1:]):
        raise ValueError(f"{name}: the experts' nvfp4 global scales differ; a fused experts weight holds one "
                         f"(quantize the experts with a shared global scale)")
    w0 = ws[0]
    return ScaledTensor(torch.stack([w.data for w in ws]), torch.stack([w.scale for w in ws]), w0.format,
                        torch.Size((len(ws), *w0.shape)), w0.block, w0.rounding, global_scale=gs[0])


def _expert_keys(tensors, prefix: str, e: int):
    for names in _EXPERT_NAMES:
        ps = [[f"{prefix}.{i}.{n}" for i in range(e)] for n in names]
        if detect_layout(tensors, ps[0][0]) is not None:
            return ps
    return None


def _load_experts(tensors, prefix: str, mod: torch.nn.Module, weight_only: bool, used: set) -> Experts | None:
    layout = hf_experts_layout(mod)
    e = mod.gate_up_proj.shape[0]
    kw = dict(act_format=None if weight_only else "weights")
    if layout == "gpt_oss" and detect_layout(tensors, f"{prefix}.gate_up_proj") == "gpt_oss_mxfp4":
        gu = _deinterleave(load_gpt_oss_mxfp4(tensors, f"{prefix}.gate_up_proj"))
        dn = load_gpt_oss_mxfp4(tensors, f"{prefix}.down_proj")
        i = gu.shape[1] // 2
        b = tensors.get(f"{prefix}.gate_up_proj_bias")
        if b is not None:
            b = torch.cat([b[:, 0::2], b[:, 1::2]], dim=1).float()
        db = tensors.get(f"{prefix}.down_proj_bias")
        for n in ("gate_up_proj", "down_proj"):
            used.update({f"{prefix}.{n}_blocks", f"{prefix}.{n}_scales", f"{prefix}.{n}_bias"})
        return Experts(_rows(gu, 0, i), _rows(gu, i, 2 * i), dn, w_gate_up=gu, activation="gpt_oss",
                       gate_bias=None if b is None else b[:, :i], up_bias=None if b is None else b[:, i:],
                       down_bias=None if db is None else db.float(), alpha=float(mod.alpha),
                       limit=float(mod.limit), **kw)
    if layout == "silu":
        ps = _expert_keys(tensors, prefix, e)
        if ps is None:
            return None
        ws = []
        for group in ps:
            ws.append(_stack([_load_weight(tensors, p, detect_layout(tensors, p)) for p in group], group[0]))
            used.update(k for k in tensors if any(k.startswith(p + ".") for p in group))
        return Experts(ws[0], ws[1], ws[2], **kw)
    return None


def load_quantized(model: torch.nn.Module, checkpoint, *, weight_only: bool = False, strict: bool = True,
                   device: str | torch.device | None = None) -> torch.nn.Module:
    """Load a block-scaled checkpoint into ``model`` (e.g. ``AutoModelForCausalLM.from_config``).

    Args:
        model: the float model whose module names match the checkpoint's keys.
        checkpoint: a state dict (names -> tensors), a ``safetensors`` file path, or a list of
            either (sharded checkpoints).
        weight_only: the quantized layers multiply bf16/fp16 activations by the dequantized
            weights instead of quantizing activations.
        strict: raise if a model tensor is missing from the checkpoint or a checkpoint tensor is
            left unused (``KeyError`` naming them); False loads what matches.
        device: where the quantized weights go (default: the checkpoint tensors' device).

    Every ``nn.Linear`` whose prefix holds a block-scaled layout (:func:`blockscaled.checkpoint.
    detect_layout`) becomes a :class:`~blockscaled.nn.Linear` (its bias, if the checkpoint has
    one, kept); every fused experts module (:func:`~blockscaled.nn.hf_experts_layout`) whose
    weights the checkpoint holds quantized (gpt-oss ``*_blocks`` / ``*_scales``, or one tensor set
    per expert: ``experts.{e}.gate_proj`` ... / Mixtral's ``w1`` / ``w3`` / ``w2``) becomes an
    :class:`~blockscaled.nn.Experts`. All other tensors are copied into the model.

    Returns the model (modified in place), with a :class:`~blockscaled.nn.QuantizationReport`.

    Example::

        cfg = transformers.AutoConfig.from_pretrained(path)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        bs.nn.load_quantized(model, [f"{path}/{f}" for f in shard_files])
        print(bs.nn.quantization_report(model))
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    parts = checkpoint if isinstance(checkpoint, (list, tuple)) else [checkpoint]
    tensors: dict[str, torch.Tensor] = {}
    for part in parts:
        if isinstance(part, (str, os.PathLike)):
            part = load_file(part)
        elif not isinstance(part, Mapping):
            raise TypeError(f"checkpoint: expected a state dict, a safetensors path or a list of them, got "
                            f"{type(part).__name__}")
        tensors.update(as_mapping(part))
    if device is not None:
        tensors = {k: v.to(device) for k, v in tensors.items()}
    fmt = None
    used: set[str] = set()
    report = QuantizationReport(format="", weight_only=weight_only)
    swaps = []
    for qualname, mod in model.named_modules():
        for child_name, child in mod.named_children():
            name = f"{qualname}.{child_name}" if qualname else child_name
            new = None
            if type(child) is torch.nn.Linear:
                layout = detect_layout(tensors, name)
                if layout is not None and layout != "gpt_oss_mxfp4":
                    w = _load_weight(tensors, name, layout)
                    if tuple(w.shape) != (child.out_features, child.in_features):
                        raise ValueError(f"{name}: the checkpoint's weight is {tuple(w.shape)}, the model's Linear "
                                         f"{(child.out_features, child.in_features)}")
                    bias = tensors.get(f"{name}.bias")
                    used.update(f"{name}.{s}" for s in (*_QUANT_SUFFIXES, "bias"))
                    new = Linear.from_scaled(w, bias, weight_only=weight_only)
                    report.quantized.append(name)
            elif hf_experts_layout(child) is not None:
                new = _load_experts(tensors, name, child, weight_only, used)
                if new is not None:
                    if tuple(new.w_gate.shape[:1]) != (child.gate_up_proj.shape[0],):
                        raise ValueError(f"{name}: the checkpoint has {new.w_gate.shape[0]} experts, the model "
                                         f"{child.gate_up_proj.shape[0]}")
                    report.quantized_experts.append(name)
            if new is not None:
                fmt = fmt or (new.format.name if isinstance(new, Linear) else new.w_gate.format.name)
                report.bytes_before += _linear_bytes(child)
                report.bytes_after += _linear_bytes(new) if isinstance(new, Linear) else _experts_bytes(new)
                swaps.append((mod, child_name, new))
    for parent, child_name, new in swaps:
        setattr(parent, child_name, new)
    report.format = fmt or "none"
    rest = {k: v for k, v in tensors.items() if k not in used}
    missing, unexpected = model.load_state_dict(rest, strict=False)
    quantized = tuple(report.quantized) + tuple(report.quantized_experts)
    missing = [k for k in missing if not k.startswith(tuple(q + "." for q in quantized))]
    if strict and (missing or unexpected):
        raise KeyError(f"checkpoint: {len(missing)} model tensors missing (first: {missing[:5]}), "
                       f"{len(unexpected)} checkpoint tensors unused (first: {unexpected[:5]})")
    _set_report(model, report)
    return model
