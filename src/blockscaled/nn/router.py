"""Fused transformers MoE routers: the top-k of a router module as one kernel (``nn.route``).

Why: ``quantize_model`` puts :class:`blockscaled.nn.Experts` in place of a transformers model's
experts but leaves the model's router module, whose forward is 5-12 small torch kernels (the
gate GEMM, softmax or sigmoid, top-k, sum, divide, cast; DeepSeek-V3's grouped top-k adds a view,
a second top-k, a scatter and a masked fill). :func:`blockscaled.nn.route` does everything after
the gate GEMM in one launch (``ops.moe.route_topk``). Measured with :class:`blockscaled.nn.MoE`
(H100, fp8_block, graph replays, benchmarks/NOTES.md twenty-fifth session): Qwen3-30B-A3B T = 1
67.0 -> 50.5 us per layer, DeepSeek-V3 224.5 -> 176.7 us; eager calls lose more (one launch for
several torch ops).

:func:`fuse_routers` gives each recognised router module (transformers 5's ``*TopKRouter``
classes, :data:`KINDS`) that forward on the instance: class, parameters (float, never quantized),
state-dict keys and outputs ``(router_logits, router_scores, router_indices)`` (shapes, dtypes)
stay as they were. It does so only after comparing the two forwards on random inputs (the
logits, the scores, and the chosen experts wherever no tie decides them): a transformers release
whose router math changed is left alone, with the reason returned.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .moe import route

__all__ = ["fuse_routers", "unfuse_routers", "is_fused", "KINDS"]


@dataclass(frozen=True)
class _Kind:
    """One transformers router class: how its forward computes (see the module docstring).

    score: "softmax" | "sigmoid"; norm: None (the module's ``norm_topk_prob``) or a fixed flag;
    scores_fp32: the scores come out in fp32 (else in the logits' dtype); flat: the module
    flattens its input to ``[T, H]`` (else outputs keep the input's leading dims); logits_fp32:
    the gate GEMM runs in fp32 (DeepSeek-V3); grouped: DeepSeek-V3's grouped top-k with its
    correction bias and routed scaling factor; bias: the gate GEMM adds the module's ``bias``."""

    score: str = "softmax"
    norm: bool | None = None
    scores_fp32: bool = False
    flat: bool = True
    logits_fp32: bool = False
    grouped: bool = False
    bias: bool = False

    @property
    def attrs(self) -> tuple[str, ...]:
        """The module attributes the fused forward reads."""
        base = ("weight", "top_k", "hidden_dim") + (() if self.norm is not None else ("norm_topk_prob",))
        if self.grouped:
            return base + ("num_group", "topk_group", "routed_scaling_factor", "e_score_correction_bias")
        return base + (("bias",) if self.bias else ())


#: transformers router classes (by name) -> their math, read from transformers 5.x's modelling code
KINDS: dict[str, _Kind] = {
    "MixtralTopKRouter": _Kind(norm=True, scores_fp32=True),
    "Qwen2MoeTopKRouter": _Kind(),
    "Qwen3MoeTopKRouter": _Kind(),
    "OlmoeTopKRouter": _Kind(),
    # top-k of the biased logits, then a softmax over the k values: the same weights as the
    # softmax over all experts renormalised over the k chosen
    "GptOssTopKRouter": _Kind(norm=True, flat=False, bias=True),
    "DeepseekV3TopkRouter": _Kind(score="sigmoid", scores_fp32=True, logits_fp32=True, grouped=True),
}


def _kind_of(module: torch.nn.Module) -> _Kind | None:
    return KINDS.get(type(module).__name__)


def _fused_forward(module: torch.nn.Module, hidden_states: torch.Tensor):
    """The router's forward with everything after the gate GEMM in :func:`blockscaled.nn.route`
    (bound to the module by :func:`fuse_routers`; reads the module's own attributes per call, so
    moved or reloaded weights are followed)."""
    k = KINDS[type(module).__name__]
    if not k.flat and hidden_states.ndim > 2:
        # gpt-oss's class softmaxes 3-D input over dim 1 (not the k scores); its MLP always passes
        # 2-D: keep the class's behaviour for anything else
        return type(module).forward(module, hidden_states)
    h = hidden_states.reshape(-1, module.hidden_dim)
    if k.logits_fp32:
        logits = F.linear(h.float(), module.weight.float())
    else:
        logits = F.linear(h, module.weight, module.bias if k.bias else None)
    norm = k.norm if k.norm is not None else bool(module.norm_topk_prob)
    if k.grouped:
        weights, experts = route(logits, module.top_k, score=k.score, n_group=module.num_group,
                                 topk_group=module.topk_group, correction_bias=module.e_score_correction_bias,
                                 norm_topk_prob=norm, routed_scaling_factor=module.routed_scaling_factor)
    else:
        weights, experts = route(logits, module.top_k, score=k.score, norm_topk_prob=norm)
    scores = weights if k.scores_fp32 else weights.to(logits.dtype)
    if not k.flat:
        lead = hidden_states.shape[:-1]
        return logits.view(*lead, -1), scores.view(*lead, module.top_k), experts.view(*lead, module.top_k)
    return logits, scores, experts


def is_fused(module: torch.nn.Module) -> bool:
    """Whether :func:`fuse_routers` gave ``module`` the fused forward."""
    f = module.__dict__.get("forward")
    return isinstance(f, functools.partial) and f.func is _fused_forward


def _agree(module: torch.nn.Module, dtype: torch.dtype, tokens: int = 16, seed: int = 0) -> str | None:
    """None if the fused forward returns what ``module``'s own forward returns on random hidden
    states, else what differs. The logits must be equal (the same GEMM); the scores compare sorted
    per token (a tie may pick either expert); the chosen experts compare on the tokens whose choice
    no tie decides (the k-th and (k+1)-th largest choice keys differ)."""
    k = _kind_of(module)
    w = module.weight
    g = torch.Generator(device=w.device).manual_seed(seed)
    h = torch.randn(tokens, module.hidden_dim, generator=g, device=w.device, dtype=torch.float32).to(dtype)
    with torch.no_grad():
        lo, so, io = type(module).forward(module, h)
        ln, sn, in_ = _fused_forward(module, h)
    if lo.shape != ln.shape or so.shape != sn.shape or io.shape != in_.shape:
        return f"shapes differ: {tuple(so.shape)} / {tuple(io.shape)} vs fused {tuple(sn.shape)} / {tuple(in_.shape)}"
    if so.dtype != sn.dtype or lo.dtype != ln.dtype or io.dtype != in_.dtype:
        return (f"dtypes differ: scores {so.dtype}, logits {lo.dtype}, experts {io.dtype} vs fused {sn.dtype}, "
                f"{ln.dtype}, {in_.dtype}")
    if not torch.equal(lo, ln):
        return "the router logits differ"
    rtol = 1e-5 if so.dtype == torch.float32 else 2 ** -7  # fp32: a few ulp; 16-bit: one rounding
    a, b = so.float().sort(-1).values, sn.float().sort(-1).values
    if not torch.allclose(a, b, rtol=rtol, atol=1e-6):
        return f"the scores differ (max abs {float((a - b).abs().max()):.3g})"
    top_k, e = io.shape[-1], lo.shape[-1]
    so, sn, io, in_ = so.reshape(-1, top_k), sn.reshape(-1, top_k), io.reshape(-1, top_k), in_.reshape(-1, top_k)
    key = lo.float().reshape(-1, e)
    if k.grouped:  # the grouped router's choice key (its group choice is not tie-checked)
        key = key.sigmoid() + module.e_score_correction_bias.float()
    if top_k < e:
        top = key.topk(top_k + 1, dim=-1).values
        clear = top[:, top_k - 1] != top[:, top_k]
    else:
        clear = torch.ones(key.shape[0], dtype=torch.bool, device=key.device)
    if not torch.equal(io.sort(-1).values[clear], in_.sort(-1).values[clear]):
        return "the chosen experts differ"
    # each expert with its own weight: the dense [T, E] routing weights of those tokens
    dense_o = torch.zeros(key.shape, dtype=torch.float32, device=key.device).scatter_(1, io, so.float())
    dense_n = torch.zeros(key.shape, dtype=torch.float32, device=key.device).scatter_(1, in_, sn.float())
    if not torch.allclose(dense_o[clear], dense_n[clear], rtol=rtol, atol=1e-6):
        return "the weights go to other experts"
    return None


def fuse_routers(model: torch.nn.Module, *, check: bool = True) -> dict[str, str | None]:
    """Give the transformers router modules of ``model`` (:data:`KINDS`) a forward whose top-k is
    one kernel launch (:func:`blockscaled.nn.route`); everything else about them stays.

    The module keeps its class, parameters and state-dict keys (transformers' router-logit
    recording, ``output_router_logits``, finds it by class) and returns what it returned:
    ``(router_logits, router_scores, router_indices)``, same shapes and dtypes. Only the instance's
    ``forward`` is replaced (a partial bound to the module: a shallow copy of the module, as
    ``nn.DataParallel`` replicas are, still calls the original); :func:`unfuse_routers` puts the
    class's back. Modules whose forward something else already replaced (accelerate hooks) or
    whose weight is on the meta device are left alone.

    ``check`` (default True): first compare the two forwards on 16 random tokens (activations in
    the router weight's dtype, bf16 for an fp32 weight) and keep the original where they differ
    (a transformers release whose router math changed). Returns ``{qualified name: None (fused) or
    why it was kept}``; routers already fused are not listed. ``quantize_model`` calls it
    (``fuse_routers=True``).

    Example::

        print(bs.nn.fuse_routers(model))     # {'model.layers.0.mlp.gate': None, ...}
    """
    done: dict[str, str | None] = {}
    for name, mod in model.named_modules():
        if _kind_of(mod) is None or is_fused(mod):
            continue
        if "forward" in mod.__dict__ or hasattr(mod, "_hf_hook"):
            # another wrapper (e.g. accelerate's offload / device-map hook) owns the forward
            done[name] = f"{type(mod).__name__}: kept, its forward is already replaced (a hook?)"
            continue
        if getattr(mod, "weight", None) is not None and mod.weight.device.type == "meta":
            done[name] = f"{type(mod).__name__}: kept, its weight is on the meta device (offloaded?)"
            continue
        missing = [a for a in _kind_of(mod).attrs if not hasattr(mod, a)]
        if missing:  # a release whose router names a field differently
            done[name] = f"{type(mod).__name__}: kept, it has no {', '.join(missing)}"
            continue
        if check:
            w = mod.weight
            # the model's activations have the router weight's dtype, except DeepSeek-V3's fp32
            # router in a 16-bit model (it casts to fp32 itself)
            dtype = torch.bfloat16 if _kind_of(mod).logits_fp32 else w.dtype
            try:
                why = _agree(mod, dtype)
            except Exception as e:  # noqa: BLE001 - any failure of the comparison keeps the module
                why = f"the comparison failed ({type(e).__name__}: {e})"
            if why is not None:
                done[name] = f"{type(mod).__name__}: kept, {why} on random inputs"
                continue
        # a partial of a module-level function, not a bound method: pickle (torch.save of the
        # model) looks a bound method up by name on the instance, where this one is not found
        mod.forward = functools.partial(_fused_forward, mod)
        done[name] = None
    return done


def unfuse_routers(model: torch.nn.Module) -> list[str]:
    """Undo :func:`fuse_routers`: the routers run their class's forward again. Returns their names."""
    names = []
    for name, mod in model.named_modules():
        if is_fused(mod):
            del mod.forward
            names.append(name)
    return names
