"""``blockscaled.warmup``: compile, ahead of the first request, every kernel a set of weights can hit.

Triton compiles a kernel at its first launch (seconds for the Hopper kernels): a server that
does not warm up pays it inside its first requests. The planner knows which plan each token count
M runs, so warm-up asks it for every M up to ``max_tokens``, keeps the distinct plans (kernel,
config and the integer specialisations Triton compiles separately: M = 1, M % 16; with quantized
activations also the activation quantizer's tiles, which follow M), and runs each once on zero
inputs of that shape. Integer kernel arguments derived from M other than M itself are not
specialised (``do_not_specialize``), so these keys cover every launch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ._checks import use_reference
from .formats import get_format
from .nn.experts import Experts
from .nn.linear import Linear
from .nn.moe import MoE
from .nn.router import KINDS as _ROUTER_KINDS, is_fused
from .ops._hopper import gluon_unavailable_reason
from .ops.gemm import gemm_problem, make_plan
from .ops.linear import linear
from .ops.moe import permute_block
from .ops.quantize import activation_tiles, dequant_tiles
from .plan.device import device_info
from .plan.mx_packed import prefer_packed
from .plan.types import DTYPE_NAMES
from .tensor import ScaledTensor

__all__ = ["warmup", "WarmupReport", "quantized_weights"]


@dataclass
class WarmupReport:
    """What :func:`warmup` ran: one entry per distinct plan, with the token counts it covers."""

    #: (weight or experts label, M range (rows: tokens for Linear, tokens x top_k for Experts),
    #: plan description, seconds)
    entries: list = field(default_factory=list)
    seconds: float = 0.0

    def __str__(self) -> str:
        lines = [f"warm-up: {len(self.entries)} distinct plans in {self.seconds:.1f} s"]
        for label, (lo, hi), desc, s in self.entries:
            lines.append(f"  {label} M={lo}..{hi}: {desc} ({s * 1e3:.0f} ms)")
        return "\n".join(lines)


def quantized_weights(model_or_weights):
    """(label, ScaledTensor, weight_only, bias) of every quantized weight."""
    if isinstance(model_or_weights, ScaledTensor):
        return [("weight", model_or_weights, False, None)]
    if isinstance(model_or_weights, torch.nn.Module):
        out = []
        for name, mod in model_or_weights.named_modules():
            w = getattr(mod, "scaled_weight", None)
            if isinstance(w, ScaledTensor):
                out.append((name or "weight", w, bool(getattr(mod, "weight_only", False)), getattr(mod, "bias", None)))
        return out
    if isinstance(model_or_weights, (list, tuple)):
        out = []
        for i, w in enumerate(model_or_weights):
            if not isinstance(w, ScaledTensor):
                raise TypeError(f"model_or_weights[{i}]: expected a ScaledTensor, got {type(w).__name__}")
            out.append((f"weights[{i}]", w, False, None))
        return out
    raise TypeError("model_or_weights: expected a torch.nn.Module holding blockscaled.nn.Linear layers, a "
                    f"ScaledTensor or a list of them, got {type(model_or_weights).__name__}")


def _packed_layers(model_or_weights) -> dict[str, Linear]:
    """``{label: module}`` of the blockscaled.nn.Linear layers holding an fp8_block copy
    (``prepack``), labelled as :func:`quantized_weights` labels them."""
    if not isinstance(model_or_weights, torch.nn.Module):
        return {}
    return {(name or "weight"): m for name, m in model_or_weights.named_modules()
            if isinstance(m, Linear) and m.packed_weight is not None}


def _runs_packed(mod: Linear, m: int, activations: torch.dtype) -> bool:
    """Whether ``mod``'s forward runs its packed copy for ``m`` rows (the forward's own test)."""
    dev = mod.packed_data.device
    return prefer_packed(mod.format.name, m, mod.out_features, mod.in_features, DTYPE_NAMES[activations],
                         mod.bias is not None, device_info(dev), gluon_unavailable_reason() is None)


def _experts(model_or_weights) -> list[tuple[str, Experts]]:
    if not isinstance(model_or_weights, torch.nn.Module):
        return []
    return [(name or "experts", m) for name, m in model_or_weights.named_modules() if isinstance(m, Experts)]


def _routing_calls(model_or_weights, activations: torch.dtype) -> list[tuple]:
    """(label, router weight, a one-token call, description) of every routing-kernel user: each
    blockscaled.nn.MoE (its ``route`` on zero logits) and each fused transformers router (its
    forward on a zero token, in the model's dtype; DeepSeek-V3's fp32 router casts itself)."""
    if not isinstance(model_or_weights, torch.nn.Module):
        return []
    out = []
    for name, m in model_or_weights.named_modules():
        if isinstance(m, MoE):
            w = m.router_weight
            out.append(((name or "moe") + ".route", w, lambda m=m, w=w: m.route(
                torch.zeros((1, m.num_experts), dtype=activations, device=w.device)), "routing (ops/moe.py route_topk)"))
            out.append(((name or "moe") + ".route_permute", w, lambda m=m, w=w: _route_permute_sizes(m, activations, w),
                        "decode routing + permutation, every token block (ops/moe.py route_permute)"))
        elif is_fused(m):
            w = m.weight
            dtype = activations if _ROUTER_KINDS[type(m).__name__].logits_fp32 else w.dtype
            out.append(((name or "router") + ".route", w, lambda m=m, w=w, d=dtype: m(
                torch.zeros((1, w.shape[1]), dtype=d, device=w.device)), "routing (fused router, ops/moe.py route_topk)"))
    return out


def _route_permute_sizes(m: MoE, activations: torch.dtype, w: torch.Tensor) -> None:
    """Run ``m.route_permute`` once per compiled form it takes (its kernel is compiled per sort size:
    ops/moe.py), from 1 token until it declines."""
    seen, t = set(), 1
    while True:
        key = permute_block(t * m.top_k, w.device)
        if key not in seen:
            seen.add(key)
            if m.route_permute(torch.zeros((t, m.num_experts), dtype=activations, device=w.device)) is None:
                return
        t += 1


def _top_k(model: torch.nn.Module, top_k: int | None) -> int:
    """Experts per token: the argument, else the model's ``config.num_experts_per_tok``
    (transformers), else the largest ``top_k`` of its modules (blockscaled.nn.MoE, transformers'
    MoE blocks), else 1."""
    if top_k is not None:
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise ValueError(f"top_k: expected a positive int or None, got {top_k!r}")
        return top_k
    k = getattr(getattr(model, "config", None), "num_experts_per_tok", None)
    if isinstance(k, int) and k > 0:
        return k
    ks = [getattr(m, "top_k", None) for m in model.modules()]
    ks = [k for k in ks if isinstance(k, int) and not isinstance(k, bool) and k > 0]
    return max(ks, default=1)


def _prepass(plan, act_format, m: int, k: int):
    """The tiles of the exact bf16 dequantization that a streaming- or tiled-kernel plan with
    ``dequant_a`` runs first on quantized activations (``ops.gemm.stream_activations``; its
    kernel's tiles follow the rows), else None."""
    cfg = plan.config
    if act_format is None or getattr(cfg, "strategy", None) not in ("stream", "tiled", "direct") or not cfg.dequant_a:
        return None
    return dequant_tiles(act_format, m, k)


def _m_grid(max_tokens: int) -> list[int]:
    """Token counts whose plans stand for all M <= max_tokens: 1..64 each (decode: the plans change
    often there), then every multiple of 16 and its neighbour (Triton specialises on M % 16)."""
    ms = list(range(1, min(max_tokens, 64) + 1))
    m = 80
    while m <= max_tokens:
        ms += [m, m + 1] if m + 1 <= max_tokens else [m]
        m += 16 if m < 1024 else (64 if m < 8192 else 512)
    return sorted(set(ms))


def warmup(model_or_weights, max_tokens: int = 8192, *, activations: torch.dtype = torch.bfloat16,
           progress: bool = True, top_k: int | None = None) -> WarmupReport:
    """Compile every kernel that ``linear(x, w)`` can launch for token counts 1..``max_tokens``.

    Args:
        model_or_weights: a module holding ``blockscaled.nn.Linear`` layers (any module with a
            ``scaled_weight`` ScaledTensor attribute) and / or ``blockscaled.nn.Experts`` modules
            (their grouped GEMMs are planned for every row count tokens x top_k), a ScaledTensor
            weight ``[N, K]``, or a list of them.
        max_tokens: the most tokens (rows of x) a call will have.
        activations: dtype of the activations ``x`` (bf16 / fp16).
        progress: show a progress bar (rich) while compiling.
        top_k: experts per token of the model's MoE layers (default: ``config.num_experts_per_tok``
            or the MoE modules' ``top_k``, else 1).

    Returns a :class:`WarmupReport` (``str()`` lists each distinct plan and the M range it serves).
    On CPU tensors without the Triton interpreter nothing needs compiling: the report is empty.

    Example::

        w = bs.quantize(W, "fp8_block", block=(128, 128))
        print(bs.warmup(w, max_tokens=4096))     # compiles once; later bs.linear(x, w) calls launch at once
    """
    from rich.progress import Progress

    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError(f"max_tokens: expected a positive int, got {max_tokens!r}")
    report = WarmupReport()
    t0 = time.perf_counter()
    jobs = []
    packed = _packed_layers(model_or_weights)
    for label, w, weight_only, bias in quantized_weights(model_or_weights):
        fmt = get_format(w.format)
        n, k = w.shape[-2], w.shape[-1]
        groups: dict = {}
        pgroups: dict = {}
        mod = packed.get(label)
        for m in _m_grid(max_tokens):
            if mod is not None and _runs_packed(mod, m, activations):
                # the layer's forward runs its fp8_block copy at this M (nn.Linear.prepack)
                a2 = torch.empty((m, fmt.packed_k(k)), dtype=fmt.data_dtype, device=w.device)
                a_s2 = torch.empty((m, fmt.scale_k(k)), dtype=fmt.scale_dtype, device=w.device)
                pw = mod.packed_weight
                plan = make_plan(gemm_problem(a2, a_s2, pw.data, 128, pw.format, k, m, n, activations, bias,
                                              a_fmt=fmt.name), w.device)
                key = (plan, m == 1, m % 16 == 0, activation_tiles(fmt, m, k, w.device))
                lo, hi = pgroups.get(key, (m, m))
                pgroups[key] = (min(lo, m), max(hi, m))
                continue
            a2 = torch.empty((m, k if weight_only else fmt.packed_k(k)),
                             dtype=activations if weight_only else fmt.data_dtype, device=w.device)
            a_s2 = None if weight_only else torch.empty((m, fmt.scale_k(k)), dtype=fmt.scale_dtype, device=w.device)
            plan = make_plan(gemm_problem(a2, a_s2, w.data, w.block[0], fmt, k, m, n, activations, bias), w.device)
            if plan.backend == "reference":
                continue
            quant = None if weight_only else activation_tiles(fmt, m, k, w.device)
            key = (plan, m == 1, m % 16 == 0, quant, _prepass(plan, None if weight_only else fmt, m, k))
            lo, hi = groups.get(key, (m, m))
            groups[key] = (min(lo, m), max(hi, m))
        for (plan, *_), (lo, hi) in groups.items():
            jobs.append((label, w, weight_only, bias, plan, lo, hi))
        for (plan, *_), (lo, hi) in pgroups.items():
            jobs.append((label + " (fp8_block copy)", mod, weight_only, bias, plan, lo, hi))
    ex_jobs = []
    experts = _experts(model_or_weights)
    k = _top_k(model_or_weights, top_k) if experts else 1
    for label, ex in experts:
        groups = {}
        for r in _m_grid(max_tokens * k):
            plans = ex.plans(r, activations)
            if any(p.backend == "reference" for p in plans):
                break
            quant = None if ex.act_format is None else tuple(
                activation_tiles(ex.act_format, r, d, ex.w_gate.data.device) for d in (ex.hidden, ex.intermediate))
            # (the permutation kernel's size follows the rows too: ops/moe.py::permute_block)
            pre = tuple(_prepass(p, ex.act_format, r, p.problem.k if p.problem else 0) for p in plans)
            key = (tuple(p.describe() for p in plans), r == 1, r % 16 == 0, quant,
                   permute_block(r, ex.w_gate.data.device), pre)
            lo, hi = groups.get(key, (r, r))
            groups[key] = (min(lo, r), max(hi, r))
        for (descs, *_), (lo, hi) in groups.items():
            ex_jobs.append((label, ex, " | ".join(descs), lo, hi))
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("compiling kernels", total=len(jobs) + len(ex_jobs))
        for label, w, weight_only, bias, plan, lo, hi in jobs:
            if isinstance(w, Linear):  # a prepacked layer's copy: its own forward takes that path at lo
                dev = w.packed_data.device
                x = torch.zeros((lo, w.in_features), dtype=activations, device=dev)
                s = time.perf_counter()
                with torch.no_grad():
                    w(x)
            else:
                dev = w.device
                x = torch.zeros((lo, w.shape[-1]), dtype=activations, device=dev)
                s = time.perf_counter()
                linear(x, w, bias, weight_only=weight_only)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            report.entries.append((label, (lo, hi), plan.describe(), time.perf_counter() - s))
            bar.advance(task)
        for label, ex, desc, lo, hi in ex_jobs:
            dev = ex.w_gate.data.device
            # top_k experts per token as the model routes (the combine kernel specialises on it:
            # top-1 warm-up rows left one build for the captured call; H200, NOTES seventeenth session)
            tok = -(-lo // k)
            x = torch.zeros((tok, ex.hidden), dtype=activations, device=dev)
            idx = (torch.arange(tok * k, device=dev) % ex.num_experts).reshape(tok, k)
            s = time.perf_counter()
            ex(x, idx, torch.full((tok, k), 1.0 / k, device=dev))
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            report.entries.append((label, (lo, hi), desc, time.perf_counter() - s))
            bar.advance(task)
    # the routing kernel, once per routing form (its build follows the routing settings, not T):
    # blockscaled.nn.MoE layers and transformers routers fused by nn.fuse_routers (quantize_model)
    for label, w, run, desc in _routing_calls(model_or_weights, activations):
        if use_reference(w):
            continue
        s = time.perf_counter()
        with torch.no_grad():
            run()
        if w.device.type == "cuda":
            torch.cuda.synchronize(w.device)
        report.entries.append((label, (1, max_tokens), desc, time.perf_counter() - s))
    report.seconds = time.perf_counter() - t0
    return report
