"""The MoE layer's glue as kernels: top-k routing, the permutation into expert order, both in one
program at decode sizes, and the weighted combine, which also checks the permutation (ops/moe.py
launches them; nn/moe.py and nn/experts.py are the callers).

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
from .check import BAD_LAST

_BAD_LAST = tl.constexpr(BAD_LAST)


@triton.jit
def _sort_assignments(ids_ptr, order_ptr, token_ptr, inv_ptr, offsets_ptr, n, num_experts, topk,
                      BLOCK: tl.constexpr, CHUNK: tl.constexpr, E_CHUNK: tl.constexpr, IDS_CACHE: tl.constexpr):
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
    e_i = tl.load(ids_ptr + i, mask=valid_i, other=0, cache_modifier=IDS_CACHE).to(tl.int32)
    ok_i = valid_i & (e_i >= 0) & (e_i < num_experts)
    key_i = tl.where(ok_i, e_i, num_experts)
    rank = tl.zeros([BLOCK], dtype=tl.int32)
    for j0 in tl.static_range(0, BLOCK, CHUNK):
        j = j0 + tl.arange(0, CHUNK)
        valid_j = j < n
        e_j = tl.load(ids_ptr + j, mask=valid_j, other=0, cache_modifier=IDS_CACHE).to(tl.int32)
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



@triton.jit(do_not_specialize=["n", "num_experts", "topk"])
def permute_kernel(ids_ptr, order_ptr, token_ptr, inv_ptr, offsets_ptr, n, num_experts, topk,
                   BLOCK: tl.constexpr, CHUNK: tl.constexpr, E_CHUNK: tl.constexpr):
    """:func:`_sort_assignments` as a kernel of one program (ops/moe.py ``permute``)."""
    _sort_assignments(ids_ptr, order_ptr, token_ptr, inv_ptr, offsets_ptr, n, num_experts, topk, BLOCK, CHUNK,
                      E_CHUNK, "")


@triton.jit(do_not_specialize=["num_experts", "n_rows"])
def combine_kernel(y_ptr, w_ptr, inv_ptr, out_ptr, H, stride_y, stride_w, stride_o, offsets_ptr, flag_ptr,
                   num_experts, n_rows, TOPK: tl.constexpr, BLOCK_H: tl.constexpr, CHECK: tl.constexpr,
                   OP: tl.constexpr):
    """``out[t, h] = sum_j w[t, j] * y[inv[t * TOPK + j], h]`` for one token ``t`` (program 0) and
    BLOCK_H columns (program 1): fp32 products and sum in ``j`` order (deterministic: no atomics),
    one rounding to ``out``'s dtype. ``y`` fp32 ``[R, H]`` in expert order, ``w`` ``[T, TOPK]``
    fp32 routing weights, ``inv`` int32 ``[T * TOPK]`` (permute_kernel's). The TOPK rows are an
    unrolled loop, so all their loads are in flight at once: a rolled loop waited for each row's
    index and then its row, TOPK times (~2.8 us at one token, top-8; benchmarks/NOTES.md,
    thirty-seventh session).

    CHECK: the permutation's ``offsets [E+1]`` must end at ``n_rows`` (= T * topk; it ends lower when
    an expert id was outside [0, E), which the sort leaves out). When it does not, every program
    writes NaN over its output and program (0, 0) records the call in the error flag words
    (ops/errors.py layout, op ``OP``): the grouped GEMMs between the sort and this kernel
    then need no metadata check of their own (ops/moe.py ``combine``)."""
    t = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = h < H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOPK):
        r = tl.load(inv_ptr + t * TOPK + j).to(tl.int64)
        w = tl.load(w_ptr + t * stride_w + j)
        acc += w * tl.load(y_ptr + r * stride_y + h, mask=mask, other=0.0)
    if CHECK:
        last = tl.load(offsets_ptr + num_experts)
        if last != n_rows:
            acc = tl.full([BLOCK_H], float("nan"), tl.float32)
            if (t == 0) & (tl.program_id(1) == 0):
                tl.atomic_add(flag_ptr, 1)
                if tl.atomic_cas(flag_ptr + 1, 0, 1) == 0:
                    tl.store(flag_ptr + 2, OP)
                    tl.store(flag_ptr + 3, 1)  # contiguous offsets
                    tl.store(flag_ptr + 4, _BAD_LAST)
                    tl.store(flag_ptr + 5, num_experts)
                    tl.store(flag_ptr + 6, last)
                    tl.store(flag_ptr + 7, 0)
                    tl.store(flag_ptr + 8, n_rows)
                    tl.store(flag_ptr + 9, num_experts)
    # (cast_out: round to nearest in the interpreter too, whose fp32 -> bf16 cast truncates)
    tl.store(out_ptr + t.to(tl.int64) * stride_o + h, cast_out(acc, out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _route_rows(logits_ptr, bias_ptr, t, t_ok, num_experts, stride_l, scale,
                TOPK: tl.constexpr, K_PAD: tl.constexpr, BLOCK_E: tl.constexpr, SIGMOID: tl.constexpr,
                HAS_BIAS: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, NORM: tl.constexpr):
    """Top-k routing of the tokens ``t [TB]`` (rows past T: ``t_ok`` False, routed on zeros and
    not stored by the callers) at once: ``logits [T, E]`` (any float dtype, row stride
    ``stride_l``) -> ``(w [TB, K_PAD] fp32, ids [TB, K_PAD] int32)``, columns past TOPK unused.

    Scores in fp32: softmax over the E experts, or the sigmoid. The choice adds ``bias [E]``
    (DeepSeek-V3's correction bias, HAS_BIAS); with ``N_GROUP > 1`` (E == BLOCK_E, a power of two)
    the experts form N_GROUP equal groups, each scored by the sum of its two best choice values,
    and only the TOPK_GROUP best groups stay open. Then TOPK rounds each take the open expert of the
    largest choice (NaN above +inf, the lowest index among equal values) and close it, its score
    without the bias as the weight; NORM divides the weights
    by their sum (at least 1e-20), and all are multiplied by ``scale``. The rounds give the experts
    in descending order of choice, as ``torch.topk`` does. Every reduction runs along the experts
    of each token. Both kernels route one token per program (TB = 1): routing up to 16 tokens in
    one program grew with T x E and lost to a program per token (benchmarks/NOTES.md,
    thirty-seventh session)."""
    TB: tl.constexpr = t.shape[0]
    e = tl.arange(0, BLOCK_E)
    valid = (e < num_experts)[None, :]
    lm = valid & t_ok[:, None]
    x = tl.load(logits_ptr + t.to(tl.int64)[:, None] * stride_l + e[None, :], mask=lm, other=0.0).to(tl.float32)
    if SIGMOID:
        s = 1.0 / (1.0 + tl.exp(-x))
    else:
        x = tl.where(valid, x, float("-inf"))
        p = tl.exp(x - tl.max(x, axis=1)[:, None])
        p = tl.where(valid, p, 0.0)
        s = p / tl.sum(p, axis=1)[:, None]
    choice = s
    if HAS_BIAS:
        choice = choice + tl.load(bias_ptr + e, mask=e < num_experts, other=0.0).to(tl.float32)[None, :]
    # NaN ranks above every number, as in torch.topk (a NaN row then routes somewhere valid and its
    # NaN weights make the output NaN, loudly); the picks below only ever take open lanes, so neither
    # a padding lane nor an expert twice can be chosen whatever the values
    choice = tl.where(choice != choice, float("inf"), choice)
    avail = tl.broadcast_to(valid, [TB, BLOCK_E])
    if N_GROUP > 1:
        G: tl.constexpr = BLOCK_E // N_GROUP
        c3 = tl.reshape(choice, [TB, N_GROUP, G])
        gi = tl.arange(0, G)[None, None, :]
        first = tl.max(c3, axis=2)
        if G > 1:
            at = tl.min(tl.where(c3 == first[:, :, None], gi, G), axis=2)
            second = tl.max(tl.where(gi == at[:, :, None], float("-inf"), c3), axis=2)
            gscore = first + second
            gscore = tl.where(gscore != gscore, float("inf"), gscore)  # inf + -inf
        else:
            gscore = first
        gn = tl.arange(0, N_GROUP)[None, :]
        gopen = tl.broadcast_to(gn >= 0, [TB, N_GROUP])
        for _ in tl.static_range(TOPK_GROUP):
            top = tl.max(tl.where(gopen, gscore, float("-inf")), axis=1)
            pick = tl.min(tl.where(gopen & (gscore == top[:, None]), gn, N_GROUP), axis=1)
            gopen = gopen & (gn != pick[:, None])
        # an expert stays open where its group was picked (is no longer open)
        shut = tl.reshape(tl.broadcast_to(tl.where(gopen, 0, 1)[:, :, None], [TB, N_GROUP, G]), [TB, BLOCK_E])
        avail = avail & (shut != 0)
    kk = tl.arange(0, K_PAD)[None, :]
    wk = tl.zeros([TB, K_PAD], dtype=tl.float32)
    ik = tl.zeros([TB, K_PAD], dtype=tl.int32)
    for j in tl.static_range(TOPK):
        top = tl.max(tl.where(avail, choice, float("-inf")), axis=1)
        best = tl.min(tl.where(avail & (choice == top[:, None]), e[None, :], BLOCK_E), axis=1)
        wj = tl.sum(tl.where(e[None, :] == best[:, None], s, 0.0), axis=1)
        wk = tl.where(kk == j, wj[:, None], wk)
        ik = tl.where(kk == j, best[:, None], ik)
        avail = avail & (e[None, :] != best[:, None])
    if NORM:
        wk = wk / tl.maximum(tl.sum(wk, axis=1), 1e-20)[:, None]
    return wk * scale, ik


@triton.jit
def _store_routes(w_ptr, ids_ptr, t, t_ok, wk, ik, TOPK: tl.constexpr):
    kk = tl.arange(0, wk.shape[1])[None, :]
    at = t.to(tl.int64)[:, None] * TOPK + kk
    m = t_ok[:, None] & (kk < TOPK)
    tl.store(w_ptr + at, wk, mask=m)
    tl.store(ids_ptr + at, ik.to(tl.int64), mask=m)


@triton.jit(do_not_specialize=["T", "num_experts", "stride_l"])
def route_kernel(logits_ptr, bias_ptr, w_ptr, ids_ptr, T, num_experts, stride_l, scale,
                 TOPK: tl.constexpr, K_PAD: tl.constexpr, BLOCK_E: tl.constexpr, SIGMOID: tl.constexpr,
                 HAS_BIAS: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, NORM: tl.constexpr):
    """Top-k routing of token ``program`` (:func:`_route_rows` on a block of one token) ->
    ``w [T, TOPK]`` fp32 and ``ids [T, TOPK]`` int64."""
    t = tl.program_id(0) + tl.arange(0, 1)
    t_ok = t < T
    wk, ik = _route_rows(logits_ptr, bias_ptr, t, t_ok, num_experts, stride_l, scale, TOPK, K_PAD, BLOCK_E, SIGMOID,
                         HAS_BIAS, N_GROUP, TOPK_GROUP, NORM)
    _store_routes(w_ptr, ids_ptr, t, t_ok, wk, ik, TOPK)


@triton.jit(do_not_specialize=["T", "num_experts", "stride_l"])
def route_permute_kernel(logits_ptr, bias_ptr, w_ptr, ids_ptr, order_ptr, token_ptr, inv_ptr, offsets_ptr, cnt_ptr, T,
                         num_experts, stride_l, scale,
                         TOPK: tl.constexpr, K_PAD: tl.constexpr, BLOCK_E: tl.constexpr, SIGMOID: tl.constexpr,
                         HAS_BIAS: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr,
                         NORM: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr, E_CHUNK: tl.constexpr):
    """Decode-size routing and permutation in ONE launch (ops/moe.py ``route_permute``): program ``t``
    routes token ``t`` as ``route_kernel`` does (stored the same way), then counts itself in
    ``cnt[0]``; the last of the T programs to arrive sorts the ``T * TOPK <= BLOCK`` assignments
    (:func:`_sort_assignments`, ids read through L2) and resets the counter to 0.

    Ordering as the split-K reduction of kernels/triton/gemm.py: a CTA barrier orders every
    thread's stores before the gpu-scope acq_rel increment, whose acquire side orders the last
    program's loads after every release; ``.cg`` loads never see a stale L1 line. The sort is the
    same whichever program arrives last. Why one launch: at decode each small launch of the MoE glue
    costs a few microseconds of a ~40 us layer (routing 4.0 us and permutation 3.7 us at T = 1:
    benchmarks/NOTES.md, thirtieth session); routing all T tokens in one program instead grew with
    T x E (thirty-seventh session), one program per token does not."""
    pid = tl.program_id(0)
    t = pid + tl.arange(0, 1)
    t_ok = t < T
    wk, ik = _route_rows(logits_ptr, bias_ptr, t, t_ok, num_experts, stride_l, scale, TOPK, K_PAD, BLOCK_E, SIGMOID,
                         HAS_BIAS, N_GROUP, TOPK_GROUP, NORM)
    _store_routes(w_ptr, ids_ptr, t, t_ok, wk, ik, TOPK)
    tl.debug_barrier()
    arrived = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == T - 1:
        _sort_assignments(ids_ptr, order_ptr, token_ptr, inv_ptr, offsets_ptr, T * TOPK, num_experts, TOPK, BLOCK,
                          CHUNK, E_CHUNK, ".cg")
        # leave the counter buffer all zeros for the next launch / graph replay
        tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")
