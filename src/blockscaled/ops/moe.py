"""The MoE layer's glue: top-k routing in one kernel (:func:`route_topk`), the permutation of
``[T, k]`` expert assignments into expert order (:func:`permute`), both in one launch at decode
sizes (:func:`route_permute`), and the weighted combine of the experts' rows back into tokens, which
can also check the permutation (:func:`combine`). kernels/triton/moe.py on CUDA and in the
interpreter; the same results in torch on the reference path, while torch.compile traces (Inductor
fuses the torch glue itself) and, for the permutation, above :data:`PERMUTE_MAX` assignments. No host
synchronisation on any path."""

from __future__ import annotations

import torch

from .. import _checks
from ..kernels.triton.moe import combine_kernel, permute_kernel, route_kernel, route_permute_kernel
from .errors import MODE_CONTIGUOUS, OP_EXPERTS, check_metadata, check_metadata_host, flags_of
from ._launch import fast
from ._splitk import splitk_counters
from .quantize import _pow2

__all__ = ["permute", "combine", "permute_block", "PERMUTE_MAX", "route_topk", "ROUTE_MAX_EXPERTS", "route_permute"]

#: Largest T x k sorted by the one-program counting sort. Its n x n comparisons grow as n^2 on one
#: SM: on the H200 at n = 512 (Qwen3-30B-A3B T=64, top-8) the layer's graph time rose by ~35 us
#: over the torch sort + histogram + scan (~10 small kernels, ~25 us), while at n <= 64 (T = 1
#: and 8) it fell by 30 us (moe-layer runs -0440 vs this session's A/B, benchmarks/NOTES.md
#: sixteenth session). At 128 the quadratic cost is 1/16 of n = 512's. Two compiled sizes
#: (64, 128): bs.warmup keys on ``permute_block``.
PERMUTE_MAX = 128
_CHUNK = 32
_E_CHUNK = 32
#: columns per combine program (H of the models in the suites: 2048-7168): one 16-byte vector of each
#: of the k rows per thread at 4 warps, so that small T still spreads over several SMs (1024 before:
#: 2 programs for one token of H = 2048)
_COMBINE_BLOCK_H = 512


def permute_block(rows: int, device: torch.device) -> int | None:
    """The counting sort's BLOCK for ``rows`` = T x k assignments on ``device`` (None: the torch
    path). A compile-time size, so :func:`blockscaled.warmup` runs each one."""
    if rows > PERMUTE_MAX or (device.type == "cpu" and not _checks.INTERPRET) or torch.compiler.is_compiling():
        return None
    return 64 if rows <= 64 else PERMUTE_MAX


def permute(experts: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                 torch.Tensor]:
    """Sort ``experts [T, k]`` (int, device-resident) by expert, stably.

    Returns ``(order int64 [T*k], token int64 [T*k], offsets int32 [E+1], inv int32 [T*k])``:
    sorted row ``r`` is assignment ``order[r]`` of token ``token[r]``, expert ``e`` owns rows
    ``offsets[e]:offsets[e+1]``, and assignment ``i`` sits at row ``inv[i]``. Ids outside
    ``[0, E)`` are left out of ``offsets`` (``offsets[E] < T*k``: the grouped GEMM's metadata
    check then fails the call).

    Example::

        order, token, offsets, inv = permute(torch.tensor([[2, 0], [2, 1]]), 4)
        # order [1, 3, 0, 2], token [0, 1, 0, 1], offsets [0, 1, 2, 4, 4], inv [2, 0, 3, 1]
    """
    flat = experts.reshape(-1)
    n = flat.numel()
    dev = flat.device
    block = permute_block(n, dev)
    if block is None or n == 0:
        return _permute_torch(flat, max(1, experts.shape[-1] if experts.ndim else 1), num_experts)
    order = torch.empty(n, dtype=torch.int64, device=dev)
    token = torch.empty(n, dtype=torch.int64, device=dev)
    inv = torch.empty(n, dtype=torch.int32, device=dev)
    offsets = torch.empty(num_experts + 1, dtype=torch.int32, device=dev)
    flat = flat if flat.is_contiguous() else flat.contiguous()
    fast(permute_kernel)[(1,)](flat, order, token, inv, offsets, n, num_experts, experts.shape[-1],
                               BLOCK=block, CHUNK=_CHUNK, E_CHUNK=_E_CHUNK, num_warps=4)
    return order, token, offsets, inv


def _permute_torch(flat: torch.Tensor, k: int, num_experts: int):
    """The torch twin of permute_kernel (reference path, and T x k > PERMUTE_MAX): a stable sort,
    the counts by a scatter-add (``torch.bincount`` would read the maximum back to the host)."""
    ok = (flat >= 0) & (flat < num_experts)
    key = torch.where(ok, flat, num_experts)
    order = torch.sort(key, stable=True).indices
    token = order // k
    counts = torch.zeros(num_experts + 1, dtype=torch.int32, device=flat.device)
    counts.scatter_add_(0, key, torch.ones_like(key, dtype=torch.int32))
    offsets = torch.zeros(num_experts + 1, dtype=torch.int32, device=flat.device)
    offsets[1:] = torch.cumsum(counts[:-1], 0)
    inv = torch.empty_like(order, dtype=torch.int32)
    inv[order] = torch.arange(order.numel(), dtype=torch.int32, device=flat.device)
    return order, token, offsets, inv


def combine(y: torch.Tensor, weights: torch.Tensor, inv: torch.Tensor, out_dtype: torch.dtype,
            offsets: torch.Tensor | None = None) -> torch.Tensor:
    """``out [T, H] = sum_j weights[t, j] * y[inv[t*k + j]]`` in fp32, one rounding to ``out_dtype``.

    ``y`` fp32 ``[T*k, H]`` (rows in expert order, :func:`permute`), ``weights`` ``[T, k]`` (any
    float dtype; taken in fp32), ``inv`` int32 ``[T*k]``. The sum runs in ``j`` order
    (deterministic; the torch twin's ``index_add_`` used atomics on CUDA).

    ``offsets`` (int32 ``[E+1]``, :func:`permute`'s): also check that they end at ``T*k``, i.e.
    that every expert id was in ``[0, E)``; when not, the output is NaN and the call is recorded for
    :func:`blockscaled.check_errors` (no host sync; in the kernel itself on CUDA and in the
    interpreter, else by the metadata check of ops/errors.py). With it the grouped GEMMs between
    :func:`permute` and this call need no metadata check of their own (``nn.Experts``).

    Example::

        out = combine(y, top_k_weights, inv, torch.bfloat16)
    """
    t, k = weights.shape
    h = y.shape[1]
    if y.dtype != torch.float32 or inv.dtype != torch.int32 or tuple(inv.shape) != (t * k,) or y.shape[0] != t * k:
        raise ValueError(f"combine: expected y fp32 [{t * k}, H] and inv int32 [{t * k}] for weights [{t}, {k}], got "
                         f"y {y.dtype} {tuple(y.shape)}, inv {inv.dtype} {tuple(inv.shape)}")
    if offsets is not None and (offsets.dtype != torch.int32 or offsets.ndim != 1 or offsets.numel() < 1
                                or offsets.device != y.device):
        raise ValueError(f"offsets: expected int32 [E+1] on {y.device}, got {offsets.dtype} {tuple(offsets.shape)} "
                         f"on {offsets.device}")
    y = y if h <= 1 or y.stride(1) == 1 else y.contiguous()
    w = weights if weights.dtype == torch.float32 and weights.stride(-1) == 1 else weights.float().contiguous()
    if _checks.use_reference(y) or t == 0 or h == 0 or torch.compiler.is_compiling():
        rows = y.index_select(0, inv.long()).view(t, k, h)
        out = (rows * w.unsqueeze(-1)).sum(1).to(out_dtype)
        if offsets is not None:
            if _checks.use_reference(y):
                check_metadata_host(offsets, out, OP_EXPERTS, MODE_CONTIGUOUS, t * k)
            elif t and h:
                check = check_metadata if not torch.compiler.is_compiling() else torch.ops.blockscaled.check_metadata
                check(offsets, out, OP_EXPERTS, MODE_CONTIGUOUS, t * k)
        return out
    out = torch.empty((t, h), dtype=out_dtype, device=y.device)
    block_h = min(_COMBINE_BLOCK_H, _pow2(h))
    check = offsets is not None
    flags = flags_of(y.device) if check else y
    fast(combine_kernel)[(t, -(-h // block_h))](y, w, inv, out, h, y.stride(0), w.stride(0), out.stride(0),
                                                 offsets if check else inv, flags,
                                                 offsets.numel() - 1 if check else 0, t * k, TOPK=k,
                                                 BLOCK_H=block_h, CHECK=check, OP=OP_EXPERTS, num_warps=4)
    return out


#: Most experts the one-program routing kernel takes (one token's scores in one block of registers:
#: 512 fp32 values over 4 warps); more go through the torch twin. The models in the suites have 8-384.
ROUTE_MAX_EXPERTS = 512


def route_topk(logits: torch.Tensor, top_k: int, sigmoid: bool, n_group: int | None, topk_group: int | None,
               correction_bias: torch.Tensor | None, norm_topk_prob: bool, scale: float):
    """``(weights fp32 [T, k], experts int64 [T, k])`` of ``blockscaled.nn.route`` in one kernel launch
    (kernels/triton/moe.py ``route_kernel``: scores, bias, grouped top-k, top-k, renormalisation and
    scale for one token per program), or None where the torch twin must run: the reference path,
    torch.compile tracing (Inductor fuses the torch ops), inputs that require grad, more than
    :data:`ROUTE_MAX_EXPERTS` experts, grouped top-k over a number of experts that is not a power
    of two, or fewer experts in the kept groups than ``top_k``. Arguments are ``route``'s, already validated.

    Why: the torch routing is 6-12 small kernels (softmax or sigmoid, add, topk, gather, sum,
    divide, multiply; the grouped form adds view / topk / scatter / masked_fill), which at decode
    are most of the MoE layer's glue (benchmarks/NOTES.md, sixteenth session: after the permute and
    combine kernels the glue was still 52 % of the Qwen3-30B-A3B fp8_block layer's graph time at T = 1)."""
    t, e = logits.shape
    ok = _route_ok(logits, top_k, n_group, topk_group, correction_bias)
    if ok is None:
        return None
    grouped, bias = ok
    w = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int64, device=logits.device)
    fast(route_kernel)[(t,)](logits, logits if bias is None else bias, w, ids, t, e, logits.stride(0), float(scale),
                             TOPK=top_k, K_PAD=_pow2(top_k), BLOCK_E=_pow2(e), SIGMOID=bool(sigmoid),
                             HAS_BIAS=bias is not None, N_GROUP=n_group if grouped else 1,
                             TOPK_GROUP=topk_group if grouped else 1, NORM=bool(norm_topk_prob), num_warps=4)
    return w, ids


def _route_ok(logits, top_k, n_group, topk_group, correction_bias):
    """(grouped, bias) when the routing kernels can take the call, else None (see :func:`route_topk`)."""
    t, e = logits.shape
    if (_checks.use_reference(logits) or torch.compiler.is_compiling() or t == 0 or e > ROUTE_MAX_EXPERTS
            or logits.stride(1) != 1):
        return None
    if torch.is_grad_enabled() and (logits.requires_grad or (correction_bias is not None
                                                             and correction_bias.requires_grad)):
        return None  # the kernel has no backward: the twin keeps the weights' gradient
    grouped = n_group is not None and n_group > 1
    if grouped and (e & (e - 1) or top_k > topk_group * (e // n_group)):
        return None
    bias = correction_bias
    if bias is not None and (bias.device != logits.device or bias.stride(0) != 1):
        bias = bias.to(logits.device).contiguous()
    return grouped, bias


#: Where :func:`route_permute` takes the call: at least this many experts (padded to a power of two)
#: and at most this many assignments (T x k), with ROUTE_PERMUTE_WARPS warps per program. Measured
#: (H200, CUDA graphs of back-to-back calls, one process: benchmarks/NOTES.md, thirty-seventh
#: session, h200/archive/route-permute-warps-20261129.json), the one launch against route_topk +
#: permute: 128 experts top-8 at 1-8 tokens 6.5-6.7 us on one warp vs 8.1-8.4 (four warps 8.3-8.7),
#: 256 experts (grouped top-k) 8.8-9.0 vs 10.6-10.9; but at 16 tokens (128 assignments: the larger
#: sort) 10.9-16.5 vs 10.3-14.0 at any warp count, and with 32 experts top-4 4.8-5.5 vs 4.6-5.1 at
#: every token count: there the program's count-and-sort tail costs what the launch it saves does.
ROUTE_PERMUTE_MIN_EXPERTS = 128
ROUTE_PERMUTE_MAX_ASSIGNMENTS = 64
ROUTE_PERMUTE_WARPS = 1


def route_permute(logits: torch.Tensor, top_k: int, sigmoid: bool, n_group: int | None, topk_group: int | None,
                  correction_bias: torch.Tensor | None, norm_topk_prob: bool, scale: float):
    """:func:`route_topk` and :func:`permute` of its expert ids in ONE kernel launch, at decode sizes:
    ``(weights fp32 [T, k], experts int64 [T, k], (order, token, offsets, inv))`` as the two would
    return them, or None where the two must run apart (what :func:`route_topk` leaves to the torch
    twin, and outside the measured band: :data:`ROUTE_PERMUTE_MIN_EXPERTS`,
    :data:`ROUTE_PERMUTE_MAX_ASSIGNMENTS`). The experts are route_topk's; the weights may differ from
    its in the last fp32 bit (one warp per program here, four there: the softmax and renormalising
    sums round in another order). Arguments are ``blockscaled.nn.route``'s,
    already validated. One program per token routes it; the last to finish sorts
    (kernels/triton/moe.py ``route_permute_kernel``; its counter is a split-K counter of
    ``ops/_splitk.py``, under the same concurrency rule).

    Why: at decode each launch of the MoE glue costs a few microseconds of a ~40 us layer; routing and
    permutation were two of them."""
    t, e = logits.shape
    n = t * top_k
    block = permute_block(n, logits.device)
    if block is None or n > ROUTE_PERMUTE_MAX_ASSIGNMENTS or _pow2(e) < ROUTE_PERMUTE_MIN_EXPERTS:
        return None
    ok = _route_ok(logits, top_k, n_group, topk_group, correction_bias)
    if ok is None:
        return None
    grouped, bias = ok
    dev = logits.device
    w = torch.empty((t, top_k), dtype=torch.float32, device=dev)
    ids = torch.empty((t, top_k), dtype=torch.int64, device=dev)
    order = torch.empty(n, dtype=torch.int64, device=dev)
    token = torch.empty(n, dtype=torch.int64, device=dev)
    inv = torch.empty(n, dtype=torch.int32, device=dev)
    offsets = torch.empty(e + 1, dtype=torch.int32, device=dev)
    fast(route_permute_kernel)[(t,)](
        logits, logits if bias is None else bias, w, ids, order, token, inv, offsets, splitk_counters(dev, 1), t, e,
        logits.stride(0), float(scale), TOPK=top_k, K_PAD=_pow2(top_k), BLOCK_E=_pow2(e), SIGMOID=bool(sigmoid),
        HAS_BIAS=bias is not None, N_GROUP=n_group if grouped else 1, TOPK_GROUP=topk_group if grouped else 1,
        NORM=bool(norm_topk_prob), BLOCK=block, CHUNK=_CHUNK, E_CHUNK=_E_CHUNK, num_warps=ROUTE_PERMUTE_WARPS)
    return w, ids, (order, token, offsets, inv)
