"""``MoE``: a mixture-of-experts layer on the grouped kernels, routing to combine on the device.

forward(x [T, H]):
1. router: ``logits = x @ router_weight.T`` (bf16, not quantized), scores = softmax or sigmoid;
2. top-k (:func:`route`): plain, or DeepSeek-V3 grouped top-k (``n_group`` groups scored by their
   top-2 scores plus ``correction_bias``, the best ``topk_group`` groups kept), the weights taken
   from the scores without the bias, optionally renormalised, times ``routed_scaling_factor``
   (steps 1's scores and 2 in one kernel launch on CUDA: ``ops.moe.route_topk``; at decode sizes with
   step 3 too: ``ops.moe.route_permute``);
3. permutation (:func:`permute`): the T x k assignments sorted by expert (a stable sort), expert
   row counts by a scatter-add (no host sync: ``torch.bincount`` would read the maximum back), the
   int32 ``offsets`` by a cumulative sum;
4. experts (:class:`blockscaled.nn.Experts`, which also holds steps 3 and 5): quantize the sorted
   rows, ``bs.swiglu`` (gate / up in one fused kernel; MX / NV on sm_90 two grouped GEMMs and one
   activation pass, the planner's split) for SwiGLU experts, or ``bs.grouped_gemm`` of the
   fused gate|up weight plus the gpt-oss activation (``(up + 1) * gate * sigmoid(alpha * gate)``
   with both clamped at ``limit``, per-expert biases); quantize the intermediate,
   ``bs.grouped_gemm`` down (per-expert down bias for gpt-oss);
5. combine: the weighted sum of each token's k rows in fp32, cast once (it also checks step 3's
   offsets: ``nn.Experts``).

Every step stays on the device: the layer can be captured in a CUDA graph. The contiguous layout
serves prefill and decode alike here (masked decode layouts are not wired yet).
"""

from __future__ import annotations

import torch

from ..formats import get_format
from ..ops.moe import route_permute, route_topk
from ..ops.quantize import quantize
from ..tensor import ScaledTensor
from .experts import Experts, _deinterleave, _rows, permute

__all__ = ["MoE", "route", "permute"]

_SCORES = ("softmax", "sigmoid")
_ACTIVATIONS = ("silu", "gpt_oss")


def route(logits: torch.Tensor, top_k: int, *, score: str = "softmax", n_group: int | None = None,
          topk_group: int | None = None, correction_bias: torch.Tensor | None = None,
          norm_topk_prob: bool = True, routed_scaling_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing: ``(weights fp32 [T, k], experts int64 [T, k])`` from router ``logits [T, E]``.

    ``score``: "softmax" (Mixtral, Qwen3-MoE, gpt-oss) or "sigmoid" (DeepSeek-V3). ``n_group`` /
    ``topk_group``: DeepSeek-V3 grouped top-k (experts in ``n_group`` equal groups, a group scored by
    the sum of its two best biased scores, experts outside the best ``topk_group`` groups dropped).
    ``correction_bias [E]``: added to the scores for the choice only. ``norm_topk_prob``: the k
    weights renormalised to sum 1. No host synchronisation. On CUDA (and in Triton's interpreter)
    one kernel does all of it (``ops.moe.route_topk``); this function's torch code is its twin (the
    reference path, torch.compile, and the cases the kernel does not take).

    Example::

        w, e = route(torch.randn(4, 8), 2)        # 4 tokens, 8 experts, top-2 softmax
    """
    _check_routing(logits, top_k, score, n_group, topk_group, correction_bias)
    return _route_checked(logits, top_k, score, n_group, topk_group, correction_bias, norm_topk_prob,
                          routed_scaling_factor)


def _route_checked(logits, top_k, score, n_group, topk_group, correction_bias, norm_topk_prob,
                   routed_scaling_factor):
    """:func:`route` with its arguments already checked: the kernel, else the torch twin."""
    fused = route_topk(logits, top_k, score == "sigmoid", n_group, topk_group, correction_bias, norm_topk_prob,
                       routed_scaling_factor)
    if fused is not None:
        return fused
    return _route_torch(logits, top_k, score, n_group, topk_group, correction_bias, norm_topk_prob,
                        routed_scaling_factor)


def _check_routing(logits, top_k, score, n_group, topk_group, correction_bias) -> None:
    """:func:`route`'s argument checks (clear errors naming the argument)."""
    if score not in _SCORES:
        raise ValueError(f"score: expected one of {_SCORES}, got {score!r}")
    t, n_exp = logits.shape
    if not 1 <= top_k <= n_exp:
        raise ValueError(f"top_k: expected 1..{n_exp} (the number of experts), got {top_k}")
    if n_group is not None and n_group > 1 and (
            n_exp % n_group or topk_group is None or not 1 <= topk_group <= n_group):
        raise ValueError(f"n_group/topk_group: {n_exp} experts need n_group dividing them and 1 <= topk_group "
                         f"<= n_group, got n_group={n_group}, topk_group={topk_group}")
    if correction_bias is not None and (not isinstance(correction_bias, torch.Tensor)
                                        or tuple(correction_bias.shape) != (n_exp,)):
        got = tuple(correction_bias.shape) if isinstance(correction_bias, torch.Tensor) else type(correction_bias).__name__
        raise ValueError(f"correction_bias: expected a tensor of shape ({n_exp},) (one per expert), got {got}")


def _route_torch(logits, top_k, score, n_group, topk_group, correction_bias, norm_topk_prob, routed_scaling_factor):
    """The torch twin of :func:`route` (arguments validated)."""
    t, n_exp = logits.shape
    s = torch.softmax(logits.float(), dim=-1) if score == "softmax" else torch.sigmoid(logits.float())
    choice = s if correction_bias is None else s + correction_bias.float()
    if n_group is not None and n_group > 1:
        g = choice.view(t, n_group, n_exp // n_group)
        group_score = g.topk(min(2, g.shape[-1]), dim=-1).values.sum(-1)
        keep = torch.zeros_like(group_score).scatter_(1, group_score.topk(topk_group, dim=-1).indices, 1.0)
        choice = choice.masked_fill(keep.repeat_interleave(n_exp // n_group, dim=1) == 0, float("-inf"))
    experts = choice.topk(top_k, dim=-1).indices
    weights = s.gather(1, experts)
    if norm_topk_prob:
        weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-20)
    return weights * routed_scaling_factor, experts


class MoE(torch.nn.Module):
    """Mixture-of-experts layer on quantized expert weights (any format of ``bs.quantize``).

    Args:
        w_gate_up: ScaledTensor ``[E, 2I, H]``: gate rows ``[0, I)`` then up rows ``[I, 2I)``
            (``activation="silu"``), or gpt-oss's fused weight with gate and up rows interleaved
            (``activation="gpt_oss"``; de-interleave with ``interleaved=True``).
        w_down: ScaledTensor ``[E, H, I]``.
        router_weight: ``[E, H]`` bf16 / fp32 (kept unquantized). router_bias: optional ``[E]``.
        top_k, score, n_group, topk_group, correction_bias, norm_topk_prob, routed_scaling_factor:
            routing (:func:`route`).
        activation: "silu" (``silu(gate) * up``, one fused kernel) or "gpt_oss"
            (``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)``, ``g = clamp(gate, max=limit)``).
        gate_up_bias ``[E, 2I]`` / down_bias ``[E, H]``: per-expert biases (gpt-oss).
        act_format: the format activations are quantized to before each grouped GEMM (default:
            the weights'; None keeps weight-only bf16 activations).

    ``forward(x [T, H] bf16) -> [T, H]`` of x's dtype. Example::

        moe = MoE.from_dense(w1, w3, w2, router, "fp8_block", top_k=2)   # bf16 [E, I, H] x2, [E, H, I]
        y = moe(x)                                                      # x [T, H] bf16
    """

    def __init__(self, w_gate_up: ScaledTensor, w_down: ScaledTensor, router_weight: torch.Tensor, *, top_k: int,
                 score: str = "softmax", n_group: int | None = None, topk_group: int | None = None,
                 correction_bias: torch.Tensor | None = None, norm_topk_prob: bool = True,
                 routed_scaling_factor: float = 1.0, router_bias: torch.Tensor | None = None,
                 activation: str = "silu", interleaved: bool = False, gate_up_bias: torch.Tensor | None = None,
                 down_bias: torch.Tensor | None = None, alpha: float = 1.702, limit: float = 7.0,
                 act_format: str | None = "weights"):
        super().__init__()
        for name, w in (("w_gate_up", w_gate_up), ("w_down", w_down)):
            if not isinstance(w, ScaledTensor) or w.ndim != 3:
                raise TypeError(f"{name}: expected a 3-D ScaledTensor [E, N, K], got "
                                f"{type(w).__name__} {getattr(w, 'shape', '')}")
        e, two_i, h = w_gate_up.shape
        if two_i % 2 or tuple(w_down.shape) != (e, h, two_i // 2):
            raise ValueError(f"w_down: expected shape {(e, h, two_i // 2)} for w_gate_up {tuple(w_gate_up.shape)}, "
                             f"got {tuple(w_down.shape)}")
        if tuple(router_weight.shape) != (e, h):
            raise ValueError(f"router_weight: expected shape {(e, h)}, got {tuple(router_weight.shape)}")
        if interleaved:
            w_gate_up = _deinterleave(w_gate_up)
            if gate_up_bias is not None:
                gate_up_bias = torch.cat([gate_up_bias[:, 0::2], gate_up_bias[:, 1::2]], dim=1)
        i = two_i // 2
        self.experts = Experts(_rows(w_gate_up, 0, i), _rows(w_gate_up, i, two_i), w_down, w_gate_up=w_gate_up,
                               activation=activation,
                               gate_bias=None if gate_up_bias is None else gate_up_bias[:, :i],
                               up_bias=None if gate_up_bias is None else gate_up_bias[:, i:],
                               down_bias=down_bias, alpha=alpha, limit=limit, act_format=act_format)
        self._set_router(router_weight, router_bias, correction_bias, top_k=top_k, score=score, n_group=n_group,
                         topk_group=topk_group, norm_topk_prob=norm_topk_prob,
                         routed_scaling_factor=routed_scaling_factor)

    def _set_router(self, router_weight, router_bias, correction_bias, **routing) -> None:
        self.register_buffer("router_weight", router_weight)
        self.register_buffer("router_bias", router_bias)
        self.register_buffer("correction_bias", correction_bias)
        ex = self.experts
        self.num_experts, self.hidden, self.intermediate = ex.num_experts, ex.hidden, ex.intermediate
        for name, v in routing.items():
            setattr(self, name, v)

    @classmethod
    def from_experts(cls, experts: Experts, router_weight: torch.Tensor, *, top_k: int, score: str = "softmax",
                     n_group: int | None = None, topk_group: int | None = None,
                     correction_bias: torch.Tensor | None = None, norm_topk_prob: bool = True,
                     routed_scaling_factor: float = 1.0, router_bias: torch.Tensor | None = None) -> "MoE":
        """The layer around an existing :class:`Experts` module (any activation, biases and
        activation format it holds; gate and up may be separate tensors, e.g. fp8_block with an
        intermediate size that is not a multiple of 128), with the routing arguments of the
        constructor. Example::

            moe = MoE.from_experts(Experts.from_dense(w_gate_up, w_down, "fp8_block"), router, top_k=8)
        """
        if not isinstance(experts, Experts):
            raise TypeError(f"experts: expected a blockscaled.nn.Experts, got {type(experts).__name__}")
        if tuple(router_weight.shape) != (experts.num_experts, experts.hidden):
            raise ValueError(f"router_weight: expected shape {(experts.num_experts, experts.hidden)}, "
                             f"got {tuple(router_weight.shape)}")
        if score not in _SCORES:
            raise ValueError(f"score: expected one of {_SCORES}, got {score!r}")
        self = cls.__new__(cls)
        torch.nn.Module.__init__(self)
        self.experts = experts
        self._set_router(router_weight, router_bias, correction_bias, top_k=top_k, score=score, n_group=n_group,
                         topk_group=topk_group, norm_topk_prob=norm_topk_prob,
                         routed_scaling_factor=routed_scaling_factor)
        return self

    # the expert weights and settings live on ``self.experts``; read-only views for callers
    w_gate_up = property(lambda self: self.experts.w_gate_up)
    w_gate = property(lambda self: self.experts.w_gate)
    w_up = property(lambda self: self.experts.w_up)
    w_down = property(lambda self: self.experts.w_down)
    down_bias = property(lambda self: self.experts.down_bias)
    activation = property(lambda self: self.experts.activation)
    act_format = property(lambda self: self.experts.act_format)

    @property
    def gate_up_bias(self):
        """``[E, 2I]`` gate biases then up biases (de-interleaved), or None."""
        g, u = self.experts.gate_bias, self.experts.up_bias
        return None if g is None else torch.cat([g, u], dim=1)

    @classmethod
    def from_dense(cls, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, router_weight: torch.Tensor,
                   fmt: str, **kwargs) -> "MoE":
        """Quantize bf16 / fp32 expert weights (``w_gate``, ``w_up`` ``[E, I, H]``, ``w_down``
        ``[E, H, I]``) to ``fmt`` (fp8_block: 128x128 blocks) and build the layer."""
        f = get_format(fmt, "fmt")
        block = (128, 128) if f.name == "fp8_block" else None
        gu = quantize(torch.cat([w_gate, w_up], dim=1).contiguous(), f, block=block)
        dn = quantize(w_down.contiguous(), f, block=block)
        return cls(gu, dn, router_weight, **kwargs)

    def _act(self, rows: torch.Tensor):
        return self.experts._act(rows)

    #: CUDA graphs of eager calls (nn/graphs.py ``enable_cuda_graphs``); None: off
    _graphs = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._graphs is not None:
            return self._graphs(self._forward, x)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 2 or x.shape[1] != self.hidden:
            raise ValueError(f"x: expected [T, {self.hidden}], got {tuple(x.shape)}")
        logits = torch.nn.functional.linear(x, self.router_weight.to(x.dtype),
                                            None if self.router_bias is None else self.router_bias.to(x.dtype))
        # the routing arguments checked once per call (route / route_permute below take them checked)
        _check_routing(logits, self.top_k, self.score, self.n_group, self.topk_group, self.correction_bias)
        if self.experts._graphs is None:
            fused = route_permute(logits, self.top_k, self.score == "sigmoid", self.n_group, self.topk_group,
                                  self.correction_bias, self.norm_topk_prob, self.routed_scaling_factor)
            if fused is not None:
                weights, experts, perm = fused
                return self.experts._sorted_forward(x, experts, weights, perm)
        weights, experts = _route_checked(logits, self.top_k, self.score, self.n_group, self.topk_group,
                                          self.correction_bias, self.norm_topk_prob, self.routed_scaling_factor)
        return self.experts(x, experts, weights)

    def route_permute(self, logits: torch.Tensor):
        """At decode sizes, this layer's :meth:`route` and the permutation of its experts in one kernel
        launch (``ops.moe.route_permute``: ``(weights, experts, (order, token, offsets, inv))``); None
        where they run apart (outside its measured band of experts and assignments, the reference
        path, ...). The forward makes the same call; ``blockscaled.warmup`` uses this one."""
        _check_routing(logits, self.top_k, self.score, self.n_group, self.topk_group, self.correction_bias)
        return route_permute(logits, self.top_k, self.score == "sigmoid", self.n_group, self.topk_group,
                             self.correction_bias, self.norm_topk_prob, self.routed_scaling_factor)

    def route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's top-k routing of router ``logits [T, E]``: :func:`route` with its settings."""
        return route(logits, self.top_k, score=self.score, n_group=self.n_group, topk_group=self.topk_group,
                     correction_bias=self.correction_bias, norm_topk_prob=self.norm_topk_prob,
                     routed_scaling_factor=self.routed_scaling_factor)
