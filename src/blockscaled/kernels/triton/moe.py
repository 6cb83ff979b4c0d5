"""The MoE layer's glue as two kernels: the permutation into expert order and the weighted
combine (ops/moe.py launches them; nn/experts.py is the caller).

Why: an eager decode step of an MoE layer ran ~25 torch kernels of glue around its 3-4 GEMM
launches (sort, a scatter-add histogram, a cumsum, index, zeros, index_add_, casts ...), which
was 60-70 % of the layer's CUDA-graph time at T = 1 (moe-layer-20261127-0134 / -0440: Qwen3-30B-A3B
fp8_block 66-68 % glue) and most of its eager host time. These two replace about 14 of them: the
sort's 8 (sort, divide, zeros x2, ones, scatter-add, cumsum, copy) and the combine's 6 (zeros,
cast, index, multiply, index_add_, cast).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._interp import cast_out


@triton.jit(do_not_specialize=["n", "num_experts", "topk"])
def permute_kernel(ids_ptr, order_ptr, token_ptr, inv_ptr, offsets_ptr, n, num_experts, topk,
                   BLOCK: tl.constexpr, CHUNK: tl.constexpr, E_CHUNK: tl.constexpr):
    """One program sorts ``n <= BLOCK`` expert assignments ``ids [n]`` (``[T, topk]`` flattened,
    any int dtype) by expert, stably: ``order[r]`` (int64) is the assignment at sorted row ``r``,
    ``token[r] = order[r] // topk`` (int64), ``inv[i]`` (int32) the sorted row of assignment
    ``i``, and ``offsets[e]`` (int32, ``e = 0..E``) the first row of expert ``e``.

    The sorted row of ``i`` is its rank: the number of assignments ``j`` with a smaller expert, or
    the same expert and ``j < i`` (a counting sort of ``n x n`` comparisons, CHUNK columns at a
    time: at decode sizes this is one small program instead of a sort, a histogram and a scan).
    An id outside ``[0, E)`` sorts after every valid one and is not counted in ``offsets``, so
    ``offsets[E] < n`` and the grouped GEMM's metadata check fails the call loudly (NaN output)."""
    i = tl.arange(0, BLOCK)
    valid_i = i < n
    e_i = tl.load(ids_ptr + i, mask=valid_i, other=0).to(tl.int32)
    ok_i = valid_i & (e_i >= 0) & (e_i < num_experts)
    key_i = tl.where(ok_i, e_i, num_experts)
    rank = tl.zeros([BLOCK], dtype=tl.int32)
    for j0 in tl.static_range(0, BLOCK, CHUNK):
        j = j0 + tl.arange(0, CHUNK)
        valid_j = j < n
        e_j = tl.load(ids_ptr + j, mask=valid_j, other=0).to(tl.int32)
        key_j = tl.where(valid_j & (e_j >= 0) & (e_j < num_experts), e_j, num_experts)
        before = (key_j[None, :] < key_i[:, None]) | ((key_j[None, :] == key_i[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum((before & valid_j[None, :]).to(tl.int32), axis=1)
    tl.store(order_ptr + rank, i.to(tl.int64), mask=valid_i)
    tl.store(token_ptr + rank, (i // topk).to(tl.int64), mask=valid_i)
    tl.store(inv_ptr + i, rank, mask=valid_i)
    for e0 in range(0, num_experts + 1, E_CHUNK):
        ev = e0 + tl.arange(0, E_CHUNK)
        below = (key_i[None, :] < ev[:, None]) & ok_i[None, :]
        tl.store(offsets_ptr + ev, tl.sum(below.to(tl.int32), axis=1), mask=ev <= num_experts)


@triton.jit(do_not_specialize=["topk"])
def combine_kernel(y_ptr, w_ptr, inv_ptr, out_ptr, H, topk, stride_y, stride_w, stride_o, BLOCK_H: tl.constexpr):
    """``out[t, h] = sum_j w[t, j] * y[inv[t * topk + j], h]`` for one token ``t`` (program 0) and
    BLOCK_H columns (program 1): fp32 products and sum in ``j`` order (deterministic: no atomics),
    one rounding to ``out``'s dtype. ``y`` fp32 ``[R, H]`` in expert order, ``w`` ``[T, topk]``
    fp32 routing weights, ``inv`` int32 ``[T * topk]`` (permute_kernel's)."""
    t = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = h < H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in range(0, topk):
        r = tl.load(inv_ptr + t * topk + j).to(tl.int64)
        w = tl.load(w_ptr + t * stride_w + j)
        acc += w * tl.load(y_ptr + r * stride_y + h, mask=mask, other=0.0)
    # (cast_out: round to nearest in the interpreter too, whose fp32 -> bf16 cast truncates)
    tl.store(out_ptr + t.to(tl.int64) * stride_o + h, cast_out(acc, out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["num_experts", "stride_l"])
def route_kernel(logits_ptr, bias_ptr, w_ptr, ids_ptr, num_experts, stride_l, scale,
                 TOPK: tl.constexpr, K_PAD: tl.constexpr, BLOCK_E: tl.constexpr, SIGMOID: tl.constexpr,
                 HAS_BIAS: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, NORM: tl.constexpr):
    """Top-k routing of one token (program 0) in one program: ``logits [T, E]`` (any float dtype,
    row stride ``stride_l``) -> ``w [T, TOPK]`` fp32 and ``ids [T, TOPK]`` int64.

    Scores in fp32: softmax over the E experts, or the sigmoid. The choice adds ``bias [E]``
    (DeepSeek-V3's correction bias, HAS_BIAS); with ``N_GROUP > 1`` (E == BLOCK_E, a power of two)
    the experts form N_GROUP equal groups, each scored by the sum of its two best choice values,
    and only the TOPK_GROUP best groups stay open. Then TOPK rounds each take the open expert of the
    largest choice (NaN above +inf, the lowest index among equal values) and close it, its score
    without the bias as the weight; NORM divides the weights
    by their sum (at least 1e-20), and all are multiplied by ``scale``. The rounds give the experts
    in descending order of choice, as ``torch.topk`` does."""
    t = tl.program_id(0)
    e = tl.arange(0, BLOCK_E)
    valid = e < num_experts
    x = tl.load(logits_ptr + t.to(tl.int64) * stride_l + e, mask=valid, other=0.0).to(tl.float32)
    if SIGMOID:
        s = 1.0 / (1.0 + tl.exp(-x))
    else:
        x = tl.where(valid, x, float("-inf"))
        p = tl.exp(x - tl.max(x, axis=0))
        p = tl.where(valid, p, 0.0)
        s = p / tl.sum(p, axis=0)
    choice = s
    if HAS_BIAS:
        choice = choice + tl.load(bias_ptr + e, mask=valid, other=0.0).to(tl.float32)
    # NaN ranks above every number, as in torch.topk (a NaN row then routes somewhere valid and its
    # NaN weights make the output NaN, loudly); the picks below only ever take open lanes, so neither
    # a padding lane nor an expert twice can be chosen whatever the values
    choice = tl.where(choice != choice, float("inf"), choice)
    avail = valid
    if N_GROUP > 1:
        G: tl.constexpr = BLOCK_E // N_GROUP
        c2 = tl.reshape(choice, [N_GROUP, G])
        gi = tl.arange(0, G)
        first = tl.max(c2, axis=1)
        if G > 1:
            at = tl.min(tl.where(c2 == first[:, None], gi[None, :], G), axis=1)
            second = tl.max(tl.where(gi[None, :] == at[:, None], float("-inf"), c2), axis=1)
            gscore = first + second
            gscore = tl.where(gscore != gscore, float("inf"), gscore)  # inf + -inf
        else:
            gscore = first
        gn = tl.arange(0, N_GROUP)
        gopen = gn >= 0
        for _ in tl.static_range(TOPK_GROUP):
            top = tl.max(tl.where(gopen, gscore, float("-inf")), axis=0)
            pick = tl.min(tl.where(gopen & (gscore == top), gn, N_GROUP), axis=0)
            gopen = gopen & (gn != pick)
        # an expert stays open where its group was picked (is no longer open)
        closed = tl.sum(tl.where(((e // G)[:, None] == gn[None, :]) & gopen[None, :], 1, 0), axis=1)
        avail = valid & (closed == 0)
    kk = tl.arange(0, K_PAD)
    wk = tl.zeros([K_PAD], dtype=tl.float32)
    ik = tl.zeros([K_PAD], dtype=tl.int32)
    for j in tl.static_range(TOPK):
        top = tl.max(tl.where(avail, choice, float("-inf")), axis=0)
        best = tl.min(tl.where(avail & (choice == top), e, BLOCK_E), axis=0)
        wj = tl.sum(tl.where(e == best, s, 0.0), axis=0)
        wk = tl.where(kk == j, wj, wk)
        ik = tl.where(kk == j, best, ik)
        avail = avail & (e != best)
    if NORM:
        wk = wk / tl.maximum(tl.sum(wk, axis=0), 1e-20)
    wk = wk * scale
    tl.store(w_ptr + t.to(tl.int64) * TOPK + kk, wk, mask=kk < TOPK)
    tl.store(ids_ptr + t.to(tl.int64) * TOPK + kk, ik.to(tl.int64), mask=kk < TOPK)
