"""The simulated twin of a quantized model: what its quantized modules should compute.

:func:`simulated_model` copies a model that :func:`blockscaled.nn.quantize_model` (or
``load_quantized``) produced and puts, in place of every :class:`blockscaled.nn.Linear` and
:class:`blockscaled.nn.Experts`, its reference twin: :class:`SimulatedLinear` /
:class:`SimulatedExperts`, which compute from the *same* quantized weights (dequantized) and the
format's reference activation quantizer, in float64, then cast to the activations' dtype. Every
other module (embeddings, attention, norms, routers, the LM head) runs the same code on the same
parameters in the same dtype.

Two comparisons of a quantized ``model`` with its twins, both free of the quantization error
itself (the twins read the same quantized weights):

* :func:`module_errors`: every call of every quantized module against its twin *on the same
  inputs*: what the kernels differ from float64 in one call (fp32 accumulation, the bf16 output's
  rounding: ~1.7e-3 relative), nothing else, so a tight limit holds and names the module;
* the logits of ``model`` against those of ``simulated_model(model)``: the whole model, but a
  model propagates an ulp of difference. In an MoE model an ulp flips a token's expert where its
  k-th and (k+1)-th router scores are nearly tied (random-init models have many such tokens):
  :func:`record_routing` records the routing ``model``'s experts got and
  ``simulated_model(model, routing=...)`` replays it (the routers are not quantized: the same
  module in both). Still, W x A, an ulp moves an activation code across a rounding boundary and,
  nvfp4, the per-tensor activation global scale, re-quantizing a whole tensor.

Measured on the CPU on gpt-oss-20b's real dimensions (4 layers, the fp32 twins standing in for
the kernels' fp32 accumulation, against the float64 ones; cosines against bf16 equal to the
H200's to 2-3 digits), logits cosine, own routing / replayed: mxfp4 W x A 0.99904 / 0.99935
(64 decode tokens), 0.99961 / 0.99964 (512-token prefill); weight-only 0.9947-0.99976 /
>= 0.99990; nvfp4 W x A 0.9915 / 0.9942 (decode), 0.8905 / 0.9549 (prefill: 425 of 512 tokens
routed differently in layer 3); Qwen3-30B-A3B fp8_block W x A >= 0.99974, nvfp4 W x A 0.9935.
The worst module error stayed at 1.66e-3-1.98e-3 throughout, and an experts module 5 % off in
the last layer moved the logits cosine to 0.99923 (gpt-oss mxfp4) / 0.99991 (Qwen3 fp8) only,
its module error to 5.0e-2: the per-module errors are what can judge a kernel; the logits
cosine bounds the whole (bench/model_suite.py uses both).

What it does not check: the quantized weights themselves (both models read them), the modules
left unquantized (both run them). The weight quantizer has its own bitwise tests.

Cost: no weight is copied (the copy shares every parameter and buffer; a twin holds its
module). Each twin dequantizes its weight on every call, an expert at a time for the experts
(:func:`blockscaled.reference.experts.experts`), and frees it: peak extra memory is one
layer's float64 weight plus float64 activations, never a float64 copy of the model. Experts
twins read the routing back to the host (an expert loop): for checks, not for timing.
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass, field

import torch

from ..nn.experts import Experts
from ..nn.linear import Linear
from .experts import experts as ref_experts
from .gemm import linear as ref_linear

__all__ = ["SimulatedLinear", "SimulatedExperts", "simulated_model", "RoutingRecord", "record_routing",
           "ModuleErrors", "module_errors"]


class SimulatedLinear(torch.nn.Module):
    """The reference twin of a :class:`blockscaled.nn.Linear` ``q`` (held, not copied).

    ``forward(x)``: ``x`` bf16 / fp16 ``[..., K]`` -> ``[..., N]`` of ``x``'s dtype:
    ``quantize(x) @ dequantize(q.weight).T + q.bias`` in float64 with the reference quantizer
    (1 x block_k blocks, the weight's rounding, nvfp4 with the activations' own global scale:
    :func:`blockscaled.reference.gemm.linear`), ``x`` itself where ``q.weight_only``.
    """

    def __init__(self, q: Linear):
        super().__init__()
        self.q = q

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q
        return ref_linear(x, q.weight, q.bias, weight_only=q.weight_only, out_dtype=x.dtype)


class RoutingRecord:
    """The routing each :class:`~blockscaled.nn.Experts` module of a model received, call by call:
    ``calls[module]`` is a list of ``(top_k_index int [T, k], top_k_weights [T, k])`` in call
    order (a few KB per call). Filled by :func:`record_routing`; :meth:`take` hands the calls out
    again, first in first out, to the module's twin."""

    def __init__(self) -> None:
        self.calls: dict[torch.nn.Module, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def take(self, ex: torch.nn.Module, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next recorded call of ``ex``; ``tokens`` (T of the twin's call) must match it.
        Raises ``RuntimeError`` where none is left or T differs: the two models ran differently."""
        left = self.calls.get(ex)
        if not left:
            raise RuntimeError(f"routing: no recorded call left for {type(ex).__name__} ({ex.extra_repr()}); the "
                               f"simulated model must run the same inputs as the recorded forward, once")
        idx, w = left.pop(0)
        if idx.shape[0] != tokens:
            raise RuntimeError(f"routing: the recorded call routed {idx.shape[0]} tokens, the twin got {tokens}")
        return idx, w

    def remaining(self) -> int:
        """Recorded calls not yet taken (0 after a twin forward on the recorded inputs)."""
        return sum(len(v) for v in self.calls.values())


@contextlib.contextmanager
def record_routing(model: torch.nn.Module):
    """Within the block, every :class:`~blockscaled.nn.Experts` call of ``model`` appends its
    ``(top_k_index, top_k_weights)`` to the yielded :class:`RoutingRecord` (forward pre-hooks,
    removed on exit: nothing stays on ``model``, e.g. for a CUDA graph captured later).

    Example::

        with record_routing(q) as rec:
            ours = q(ids).logits
        want = simulated_model(q, routing=rec)(ids).logits    # the twins route as q did
    """
    rec = RoutingRecord()

    def hook(mod, args, kwargs):
        idx = args[1] if len(args) > 1 else kwargs["top_k_index"]
        w = args[2] if len(args) > 2 else kwargs["top_k_weights"]
        rec.calls.setdefault(mod, []).append((idx.detach(), w.detach()))

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in model.modules() if isinstance(m, Experts)]
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()


@dataclass
class ModuleErrors:
    """Per quantized module of a model (qualified name): the largest relative error
    ``||out - twin|| / ||twin||`` (Frobenius, float64) of its calls within :func:`module_errors`,
    NaN where an output held a NaN / Inf the twin did not."""

    errors: dict[str, float] = field(default_factory=dict)
    calls: int = 0

    def worst(self) -> tuple[str, float]:
        """``(name, error)`` of the worst module (a NaN counts as the worst); ``("", 0.0)`` if none ran."""
        if not self.errors:
            return "", 0.0
        return max(self.errors.items(), key=lambda kv: math.inf if math.isnan(kv[1]) else kv[1])


def _rel_error(out: torch.Tensor, want: torch.Tensor) -> float:
    """``||out - want|| / ||want||`` in float64 (0 where both are 0; NaN where ``out`` is not finite
    and ``want`` is)."""
    o, w = out.double(), want.double()
    if not bool(torch.isfinite(o).all()) and bool(torch.isfinite(w).all()):
        return math.nan
    den = float(w.norm())
    num = float((o - w).norm())
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


@contextlib.contextmanager
def module_errors(model: torch.nn.Module):
    """Within the block, every call of a :class:`~blockscaled.nn.Linear` / :class:`~blockscaled.nn.Experts`
    of ``model`` is compared with its float64 twin *on the same inputs* (forward hooks, removed on
    exit); the yielded :class:`ModuleErrors` keeps each module's worst relative error.

    Unlike the logits of a :func:`simulated_model`, these do not depend on what happened upstream:
    an ulp of difference amplified by later layers (a flipped expert choice, an activation code or
    an nvfp4 activation global scale that the ulp moves, re-quantizing a whole tensor) cannot move
    them, so their limit can be tight: what the kernels differ from float64 in one call (fp32
    accumulation, the output's rounding, one ulp of the experts' intermediate re-quantized). Cost:
    one twin call per module call (float64, outside any timing).

    Example::

        with module_errors(q) as errs:
            q(ids)
        name, err = errs.worst()        # e.g. ("model.layers.0.mlp.experts", 1.7e-3)
    """
    found = ModuleErrors()
    names = {m: n for n, m in model.named_modules() if isinstance(m, (Linear, Experts))}

    def hook(mod, args, kwargs, out):
        with torch.no_grad():
            if isinstance(mod, Linear):
                x = args[0] if args else kwargs["x"]
                want = ref_linear(x, mod.weight, mod.bias, weight_only=mod.weight_only)
            else:
                a = dict(zip(("hidden_states", "top_k_index", "top_k_weights"), args), **kwargs)
                want = ref_experts(mod, a["hidden_states"], a["top_k_index"], a["top_k_weights"])
        err = _rel_error(out, want)
        name = names[mod]
        if name not in found.errors or math.isnan(err) or err > found.errors[name]:  # a NaN stays
            found.errors[name] = err
        found.calls += 1

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in names]
    try:
        yield found
    finally:
        for h in handles:
            h.remove()


class SimulatedExperts(torch.nn.Module):
    """The reference twin of a :class:`blockscaled.nn.Experts` ``ex`` (held, not copied).

    ``forward(hidden_states [T, H], top_k_index int [T, k], top_k_weights [T, k])`` -> ``[T, H]``
    of hidden_states' dtype: :func:`blockscaled.reference.experts.experts` (float64, the
    activations quantized as ``ex`` quantizes them), cast once at the end as ``ex`` does. With
    ``routing`` (a :class:`RoutingRecord` of ``ex``'s calls) the recorded routing replaces the
    arguments' (module docstring, "Routing").
    """

    def __init__(self, ex: Experts, routing: RoutingRecord | None = None):
        super().__init__()
        self.ex = ex
        self.routing = routing

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        if self.routing is not None:
            top_k_index, top_k_weights = self.routing.take(self.ex, hidden_states.shape[0])
        return ref_experts(self.ex, hidden_states, top_k_index, top_k_weights).to(hidden_states.dtype)


def simulated_model(model: torch.nn.Module, routing: RoutingRecord | None = None) -> torch.nn.Module:
    """A copy of ``model`` with every :class:`~blockscaled.nn.Linear` / :class:`~blockscaled.nn.Experts`
    replaced by :class:`SimulatedLinear` / :class:`SimulatedExperts` around it; with ``routing``
    (from :func:`record_routing` on ``model``) the experts twins replay the recorded routing.

    The copy shares all of ``model``'s parameters and buffers (no tensor is copied: weight
    memory is not doubled), so it must not be trained or loaded into apart from ``model``.
    ``model`` itself is left as it was. Raises ``ValueError`` where ``model`` holds no quantized
    module (the comparison would be vacuous).

    Example::

        q = bsnn.quantize_model(model, "mxfp4", inplace=False)
        with record_routing(q) as rec:
            ours = q(ids).logits
        want = simulated_model(q, routing=rec)(ids).logits       # or simulated_model(q): own routing
        cos = F.cosine_similarity(ours.double().flatten(), want.double().flatten(), 0)
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    # deepcopy's memo maps an object to its copy: the tensors map to themselves (shared), each
    # quantized module to its twin (deepcopy does not descend into a memo entry).
    memo: dict[int, object] = {id(t): t for t in (*model.parameters(), *model.buffers())}
    twins = 0
    for m in model.modules():
        if isinstance(m, Linear):
            memo[id(m)] = SimulatedLinear(m)
        elif isinstance(m, Experts):
            memo[id(m)] = SimulatedExperts(m, routing)
        else:
            continue
        twins += 1
    if not twins:
        raise ValueError(f"model: {type(model).__name__} holds no blockscaled.nn.Linear or Experts module to simulate")
    if isinstance(model, (Linear, Experts)):
        return memo[id(model)]
    return copy.deepcopy(model, memo)
