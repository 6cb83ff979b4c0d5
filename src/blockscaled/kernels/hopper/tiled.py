"""The sm_90a tiled MX / NV GEMM in Gluon: bf16 activations x mxfp4 / nvfp4 / mxfp8 weights, M > 64.

``C[m, n] = sum_k x[m, k] * dequantize(W)[n, k]`` (+ bias) for prefill-sized M, where the tensor
cores, not the weight bytes, set the time. Kernel body only; the host launcher is
``blockscaled.ops._tiled``.

Why a kernel of its own (benchmarks/NOTES.md, twentieth session): above 64 rows the library ran
dequantize-to-bf16 + cuBLAS (0.2-0.5x cuBLAS bf16 on the pre-dequantized weights at M = 256: the
pass writes and cuBLAS re-reads 2 bytes per weight element), and the streaming kernel
(``stream.py``) decodes its weights into the wgmma's register operand, which forces a wait after
every wgmma and re-reads the whole activation block per 64 weight rows. Here the decoded weights
go to shared memory instead, so both wgmma operands are in shared memory and one wgmma stays in
flight while the next K step decodes:

* a ring of STAGES slots, each one TMA box of the activations ([BM, 64] bf16, 128-byte swizzle)
  and one of the packed weights ([BN, 64] elements as int32 words: 8 e2m1 or 4 e4m3 per word);
* per K step every thread decodes 32 weight elements (one 16- or 32-byte run of a row: one MX
  scale block, two nvfp4 blocks) with the streaming kernel's integer decode (``_DECODE_*``: exact
  bf16 products of code and block scale), stores them in natural K order to a bf16 [BN, 64]
  buffer (three buffers: the one a wgmma may still read is never the one being written), then
  one wgmma [BM, 64] x [64, BN] per warpgroup is issued and the previous one waited for;
* the slot of step i - 2 is refilled at step i, after the barrier that every warp passes only
  once its own wgmma of step i - 2 has completed (two warpgroups do not finish in lockstep).

Numerics: as the streaming kernel (exact products, fp32 accumulation in the tensor core, one
rounding at the store; nvfp4's 2**-8 decode factor undone with the global scale in the epilogue).
K must be a multiple of 32 (the planner checks; 16-byte TMA rows of packed e2m1): TMA zero-fills
the codes and activations past K, N and M; scale loads past K read 2**0 / 0, never a NaN code.

Split-K (SPLIT > 1): fp32 partial tiles and a deterministic last-arriver sum in split order, as
the streaming and skinny kernels.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                               warpgroup_mma_wait)

from ._compat import cta_barrier, tma_load
from .stream import (_DECODE_E4M3, _DECODE_MX, _DECODE_NV, _FMT_MXFP8, _FMT_NVFP4, _scale_factor, _splitk_sum_store,
                     mma_slot_offsets)
from .wide import _segments

__all__ = ["tiled_kernel", "BLOCK_K", "word_layouts"]

#: K elements per pipeline step: one 128-byte swizzled row of bf16 activations
BLOCK_K = gl.constexpr(64)


@gluon.constexpr_function
def word_layouts(bn, ns, wps, num_warps):
    """(2-D, 3-D) layouts of one step's packed weight words, [BN, NS * WPS] and [BN, NS, WPS]: NS
    scale blocks per row and step, WPS int32 words per scale block. A thread holds ``wt`` contiguous
    words of a row (the step's BN x 64 elements over the threads: 32 elements each with 8 warps),
    lanes the next word bit and 16 rows, warps the remaining word bits and further rows,
    registers the rows past what the warps cover."""
    wpr = ns * wps
    wt = bn * wpr // (32 * num_warps)  # words per thread
    lg = lambda v: (v).bit_length() - 1  # noqa: E731 (log2 of a power of two)
    cols = [1 << i for i in range(lg(wpr))]
    reg_c, lane_c, warp_c = cols[:lg(wt)], cols[lg(wt):lg(wt) + 1], cols[lg(wt) + 1:]
    warp_r = [16 << i for i in range(lg(num_warps) - len(warp_c))]
    covered = 16 << len(warp_r)
    reps = [covered << i for i in range(lg(bn // covered))]

    def c3(c):  # word index c = block * WPS + word -> [row, block, word]
        return [0, 0, c] if c < wps else [0, c // wps, 0]

    two = gl.DistributedLinearLayout(
        reg_bases=[[0, c] for c in reg_c] + [[r, 0] for r in reps],
        lane_bases=[[0, c] for c in lane_c] + [[1 << i, 0] for i in range(4)],
        warp_bases=[[0, c] for c in warp_c] + [[r, 0] for r in warp_r], block_bases=[], shape=[bn, wpr])
    three = gl.DistributedLinearLayout(
        reg_bases=[c3(c) for c in reg_c] + [[r, 0, 0] for r in reps],
        lane_bases=[c3(c) for c in lane_c] + [[1 << i, 0, 0] for i in range(4)],
        warp_bases=[c3(c) for c in warp_c] + [[r, 0, 0] for r in warp_r], block_bases=[], shape=[bn, ns, wps])
    return two, three


@gluon.constexpr_function
def acc_layout(bm, bn, num_warps):
    """wgmma accumulator [BM, BN]: one warpgroup per 64 rows, instruction N = BN."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, bn, 16])


@gluon.jit
def _decode(words, fac, FMT: gl.constexpr, BN: gl.constexpr):
    """[BN, NS, WPS] int32 words and their [BN, NS, 1] bf16x2 factors -> bf16 [BN, 64] in natural
    K order (element 8 w + j of a word of e2m1 is nibble j; e4m3: byte j of 4 w + j)."""
    if FMT == _FMT_MXFP8:
        p0, p1 = gl.inline_asm_elementwise(_DECODE_E4M3, "=r,=r,r,r", [words, fac], dtype=(gl.int32, gl.int32),
                                           is_pure=True, pack=1)
        pr = gl.join(p0, p1)  # [.., b]: bytes (2b, 2b + 1)
        lo = pr.to(gl.int16)
        hi = (pr >> 16).to(gl.int16)
        h = gl.join(lo, hi).to(gl.bfloat16, bitcast=True)  # [.., b, h]: byte 2b + h
        return gl.reshape(h, [BN, BLOCK_K])
    else:
        if FMT == _FMT_NVFP4:
            p0, p1, p2, p3 = gl.inline_asm_elementwise(_DECODE_NV, "=r,=r,=r,=r,r,r", [words, fac],
                                                       dtype=(gl.int32, gl.int32, gl.int32, gl.int32),
                                                       is_pure=True, pack=1)
        else:
            p0, p1, p2, p3 = gl.inline_asm_elementwise(_DECODE_MX, "=r,=r,=r,=r,r,r", [words, fac],
                                                       dtype=(gl.int32, gl.int32, gl.int32, gl.int32),
                                                       is_pure=True, pack=1)
        pr = gl.join(gl.join(p0, p2), gl.join(p1, p3))  # [.., a1, a0]: the pair j = 2 a1 + a0 is (j, j + 4)
        lo = pr.to(gl.int16)
        hi = (pr >> 16).to(gl.int16)
        h = gl.join(lo, hi).to(gl.bfloat16, bitcast=True)  # [.., a1, a0, h]: nibble 4h + 2a1 + a0
        return gl.reshape(gl.permute(h, (0, 1, 2, 5, 3, 4)), [BN, BLOCK_K])


@gluon.jit
def _load_step(x_desc, w_desc, x_bufs, w_bufs, bars, slot, off_m, w_row, kstep, WPR: gl.constexpr, pred):
    bar = bars.index(slot)
    mbarrier.expect(bar, x_desc.block_type.nbytes + w_desc.block_type.nbytes, pred=pred)
    tma_load(x_desc, [off_m, kstep * BLOCK_K], bar, x_bufs.index(slot), pred=pred)
    tma_load(w_desc, [w_row, kstep * WPR], bar, w_bufs.index(slot), pred=pred)


@gluon.jit
def _tiled_producer(x_desc, w_desc, x_bufs, w_bufs, ready, empty, off_m, w_row, k_lo, n_k, WPR: gl.constexpr,
                    STAGES: gl.constexpr):
    """TMA producer (1 warp): the activation and packed-weight boxes of each K step into ring slot
    ``it % STAGES`` once the consumers released it (``empty``), tracked by the slot's ``ready``."""
    for it in range(n_k):
        s = it % STAGES
        # slot s is free once the consumers released use (it // STAGES) - 1; the first pass is free
        mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1, pred=it >= STAGES)
        bar = ready.index(s)
        mbarrier.expect(bar, x_desc.block_type.nbytes + w_desc.block_type.nbytes)
        tma_load(x_desc, [off_m, (k_lo + it) * BLOCK_K], bar, x_bufs.index(s))
        tma_load(w_desc, [w_row, (k_lo + it) * WPR], bar, w_bufs.index(s))


@gluon.jit
def _tiled_consumer(x_desc, w_desc, x_bufs, w_bufs, wd_bufs, ready, empty, ws_ptr, gs_ptr, ags_ptr, bias_ptr, c_ptr,
                    part_ptr, cnt_ptr, row_end, N, K, SPLIT, stride_wsn, stride_cm, tile, sp, off_m, off_n, w_row, e,
                    stride_wse, k_lo, n_k, FMT: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                    STAGES: gl.constexpr, HAS_AGS: gl.constexpr, HAS_BIAS: gl.constexpr, WS: gl.constexpr,
                    GS_PER_E: gl.constexpr, num_warps: gl.constexpr):
    """The math warps (two warpgroups): per K step, decode the weight slot into a bf16 buffer, one
    wgmma per warpgroup left in flight, and free the slot of step i - 2 (WS: release it to the
    producer warp; else refill it here); then the epilogue (rows below ``row_end``: M, or the end
    of the tile's expert). ``w_row``: the weight tile's first row in the 2-D view of the packed
    weights, ``e``: its expert (grouped modes; 0 dense)."""
    NS: gl.constexpr = 2 if FMT != _FMT_NVFP4 else 4  # scale blocks per row and step
    WPR: gl.constexpr = 16 if FMT == _FMT_MXFP8 else 8  # int32 words per row and step
    WPS: gl.constexpr = WPR // NS
    SPB: gl.constexpr = 16 if FMT == _FMT_NVFP4 else 32  # elements per scale
    L2: gl.constexpr = word_layouts(BN, NS, WPS, num_warps)[0]
    L3: gl.constexpr = word_layouts(BN, NS, WPS, num_warps)[1]
    SL: gl.constexpr = gl.SliceLayout(2, L3)
    mma_l: gl.constexpr = acc_layout(BM, BN, num_warps)

    # the scales of a thread's rows and blocks, one step ahead (a global load per step)
    sr = gl.arange(0, BN, layout=gl.SliceLayout(1, SL))
    sc = gl.arange(0, NS, layout=gl.SliceLayout(0, SL))
    srow = e.to(gl.int64) * stride_wse + (off_n + gl.minimum(sr, N - 1 - off_n)).to(gl.int64)[:, None] * stride_wsn
    ncol = gl.cdiv(K, SPB)
    f_cur = _scale_factor(ws_ptr, srow, (k_lo * NS + sc)[None, :], ncol, FMT)

    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=mma_l)
    for i in range(n_k):
        s = i % STAGES
        f_nxt = _scale_factor(ws_ptr, srow, ((k_lo + gl.minimum(i + 1, n_k - 1)) * NS + sc)[None, :], ncol, FMT)
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        w2 = w_bufs.index(s).load(L2)
        words = gl.convert_layout(gl.reshape(w2, [BN, NS, WPS]), L3, assert_trivial=True)
        vals = _decode(words, gl.expand_dims(f_cur, 2), FMT, BN)
        wd = wd_bufs.index(i % 3)  # last read by the wgmma of step i - 3
        wd.store(vals)
        fence_async_shared()
        # every math warp: stored its decoded rows, read slot s, and completed its wgmma of step
        # i - 2 (the wait(1) of step i - 1): the producer may refill the slot of step i - 2
        cta_barrier()
        if WS:
            mbarrier.arrive(empty.index((i + STAGES - 2) % STAGES), count=1, pred=i >= 2)
        else:
            _load_step(x_desc, w_desc, x_bufs, w_bufs, ready, (i + STAGES - 2) % STAGES, off_m, w_row,
                       k_lo + i - 2 + STAGES, WPR, (i >= 2) & (i - 2 + STAGES < n_k))
        acc = warpgroup_mma(x_bufs.index(s), wd.permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        f_cur = f_nxt
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    if FMT == _FMT_NVFP4:
        if GS_PER_E:
            gb = gl.load(gs_ptr + e).to(gl.float32)
        else:
            gb = gl.load(gs_ptr).to(gl.float32)
        if HAS_AGS:
            gb = gb * gl.load(ags_ptr).to(gl.float32)
        acc = acc * gl.div_rn(gl.full([], 256.0, gl.float32), gb)
    # stored from the wgmma layout itself (pairs of adjacent columns per thread): a layout
    # conversion needs shared-memory scratch, which the warp-specialised kernel cannot take from
    # its ring (allocated for the whole kernel): 128-row tiles would use 160 KB
    out_l: gl.constexpr = mma_l
    rows = gl.arange(0, BM, layout=gl.SliceLayout(1, out_l))
    cols = gl.arange(0, BN, layout=gl.SliceLayout(0, out_l))
    mask = (rows < row_end - off_m)[:, None] & (cols < N - off_n)[None, :]
    c_ptrs = c_ptr + (off_m + rows).to(gl.int64)[:, None] * stride_cm + (off_n + cols)[None, :]
    if HAS_BIAS:
        bias = gl.load(bias_ptr + off_n + cols, mask=cols < N - off_n, other=0.0).to(gl.float32)[None, :]
    else:
        bias = 0.0
    if SPLIT == 1:
        res = acc
        if HAS_BIAS:
            res = res + bias
        gl.store(c_ptrs, res.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        offs = mma_slot_offsets(rows[:, None], cols[None, :], BN, num_warps)
        _splitk_sum_store(acc, part_ptr, cnt_ptr, tile, sp, SPLIT, offs, c_ptrs, mask, bias, BM * BN, HAS_BIAS)


@gluon.jit
def tile_rows(pid_m, off_n, n_k, seg_ptr, M, N, E, MODE: gl.constexpr, E_POW2: gl.constexpr, BM: gl.constexpr,
              num_warps: gl.constexpr):
    """(first row, end of the valid rows, expert, first weight row in the [E x N, K'] view, K steps)
    of M tile ``pid_m``. Dense (MODE 0): rows of M. Grouped (1 contiguous, 2 masked): the M tiles
    numbered densely over the experts from ``seg_ptr`` on the device (``wide._segments``); a program
    past the real count gets any expert, no K step and no valid row."""
    if MODE == 0:
        off_m = pid_m * BM
        row_end = M
        e = pid_m * 0
        w_row = off_n
    else:
        seg_l: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        oe, lo, hi, cum = _segments(seg_ptr, M, E, MODE, E_POW2, BM, seg_l)
        e = gl.sum((cum <= pid_m).to(gl.int32), 0)
        valid = e < E
        e = gl.minimum(e, E - 1)  # a program past the tiles: any expert, no K step, nothing stored
        tile0 = gl.sum(gl.where(oe == e - 1, cum, 0), 0)  # M tiles of the experts before e
        off_m = gl.sum(gl.where(oe == e, lo, 0), 0) + (pid_m - tile0) * BM
        row_end = gl.where(valid, gl.sum(gl.where(oe == e, hi, 0), 0), off_m)
        n_k = gl.where(valid, n_k, 0)
        w_row = e * N + off_n
    return off_m, row_end, e, w_row, n_k


#: registers of the TMA producer warp (it holds a few indices)
PRODUCER_REGS = gl.constexpr(40)


@gluon.jit(do_not_specialize=["M", "ks_per_split"])
def tiled_kernel(x_desc, w_desc, ws_ptr, gs_ptr, ags_ptr, bias_ptr, c_ptr, part_ptr, cnt_ptr, M, N, K, ks_per_split, SPLIT,
                 stride_wsn, stride_cm, seg_ptr, E, stride_wse, FMT: gl.constexpr, BN: gl.constexpr,
                 STAGES: gl.constexpr, HAS_AGS: gl.constexpr, HAS_BIAS: gl.constexpr, WS: gl.constexpr,
                 MODE: gl.constexpr, E_POW2: gl.constexpr, GS_PER_E: gl.constexpr, num_warps: gl.constexpr):
    """One program per (BM x BN output tile, K split), tiles N-major within a row of M tiles
    (consecutive programs share the activation rows). ``x_desc``: TMA boxes [BM, 64] of bf16 x
    [M, K]; ``w_desc``: boxes [BN, 64 elements] of the packed weights as int32 [N, K / 8] (e2m1) or
    [N, K / 4] (e4m3); ``ws_ptr``: E8M0 [N, K / 32] (mx) or e4m3 [N, K / 16] (nvfp4) scales, row
    stride ``stride_wsn``; ``gs_ptr``: nvfp4's fp32 global scale (any pointer otherwise); ``ags_ptr``
    (HAS_AGS, nvfp4 W x A): the activations' fp32 global scale (they were dequantized exactly without it);
    ``bias_ptr`` [N] (HAS_BIAS); ``c_ptr`` [M, N] (N contiguous); ``part_ptr`` / ``cnt_ptr``: fp32
    [SPLIT, tiles, BM, BN] and int32 zeros [tiles] (SPLIT > 1). Every split non-empty (the host).

    Grouped (MODE 1 contiguous: ``seg_ptr`` = offsets [E + 1] of the experts' rows in x [M, K];
    MODE 2 masked: ``seg_ptr`` = row counts [E], x the 2-D view [E * M, K] of [E, M, K]): the
    weights are the 2-D views [E * N, K / 8 | K / 4] and their scales expert ``e`` at
    ``e * stride_wse``; the M tiles are numbered densely over the experts' rows from the counts on
    the device (no host sync; ``wide._segments``), the grid covers an upper bound and programs past
    the real count run no K step and store nothing; a tile's rows past its expert's are computed
    (the next expert's activations) and masked at the store. ``GS_PER_E``: nvfp4 global scales [E].
    The grouped modes take no bias and no K split."""
    BM: gl.constexpr = x_desc.block_type.shape[0]
    # 128-row tiles, one warpgroup per 64 rows (256-token tiles are kernels/hopper/tiled_rs.py's,
    # which replaced this kernel's 16-warp form: faster on all A/B rows but one, by 1 %)
    gl.static_assert(BM == 128 and num_warps == 8, "128 x 128 tiles with 8 math warps")
    gl.static_assert(STAGES >= 3, "the slot of step i - 2 is refilled at step i")
    WPR: gl.constexpr = 16 if FMT == _FMT_MXFP8 else 8  # int32 words per row and step
    wd_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BLOCK_K], gl.bfloat16)

    pid = gl.program_id(0)
    tile = pid // SPLIT
    sp = pid % SPLIT
    tiles_n = gl.cdiv(N, BN)
    pid_m = tile // tiles_n
    off_n = (tile % tiles_n) * BN
    num_k = gl.cdiv(K, BLOCK_K)
    k_lo = sp * ks_per_split
    n_k = gl.minimum(ks_per_split, num_k - k_lo)
    off_m, row_end, e, w_row, n_k = tile_rows(pid_m, off_n, n_k, seg_ptr, M, N, E, MODE, E_POW2, BM, num_warps)

    x_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BLOCK_K], x_desc.layout)
    w_bufs = gl.allocate_shared_memory(gl.int32, [STAGES, BN, WPR], w_desc.layout)
    wd_bufs = gl.allocate_shared_memory(gl.bfloat16, [3, BN, BLOCK_K], wd_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    if WS:
        gl.warp_specialize([
            (_tiled_consumer, (x_desc, w_desc, x_bufs, w_bufs, wd_bufs, ready, empty, ws_ptr, gs_ptr, ags_ptr, bias_ptr,
                               c_ptr, part_ptr, cnt_ptr, row_end, N, K, SPLIT, stride_wsn, stride_cm, tile, sp, off_m,
                               off_n, w_row, e, stride_wse, k_lo, n_k, FMT, BM, BN, STAGES, HAS_AGS, HAS_BIAS, True,
                               GS_PER_E, num_warps)),
            (_tiled_producer, (x_desc, w_desc, x_bufs, w_bufs, ready, empty, off_m, w_row, k_lo, n_k, WPR, STAGES)),
        ], [1], [PRODUCER_REGS])
        # no mbarrier.invalidate after the warp-specialised region (as kernels/hopper/wide.py: nothing
        # reuses the barrier memory, and the invalidates raced with the partition-switch loop there)
    else:
        # the math warps issue the TMA loads themselves: the ring filled here, then one refill per step
        for i in gl.static_range(STAGES):
            _load_step(x_desc, w_desc, x_bufs, w_bufs, ready, i, off_m, w_row, k_lo + i, WPR, i < n_k)
        _tiled_consumer(x_desc, w_desc, x_bufs, w_bufs, wd_bufs, ready, empty, ws_ptr, gs_ptr, ags_ptr, bias_ptr,
                        c_ptr, part_ptr, cnt_ptr, row_end, N, K, SPLIT, stride_wsn, stride_cm, tile, sp, off_m, off_n,
                        w_row, e, stride_wse, k_lo, n_k, FMT, BM, BN, STAGES, HAS_AGS, HAS_BIAS, False, GS_PER_E,
                        num_warps)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i))
            mbarrier.invalidate(empty.index(i))
