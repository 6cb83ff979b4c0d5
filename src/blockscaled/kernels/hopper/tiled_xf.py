"""The sm_90a tiled MX / NV GEMM with a decode warpgroup: bf16 activations x mxfp4 / nvfp4 / mxfp8
weights, prefill-sized M.

``C[m, n] = sum_k x[m, k] * dequantize(W)[n, k]`` (+ bias), the same call and numerics as
``tiled.py``. Kernel body only; the host launcher is ``blockscaled.ops._tiled``.

Why a second kernel: ``tiled.py``'s math warps decode each K step's weights themselves, then meet at
a CTA barrier before the wgmma (the decoded buffer must be complete, and the two math warpgroups
must both be done with the slot the producer refills next). ncu put 41 % of its cycles at those
barriers, tensor pipe ~37 %: the decode and the wgmma of a step take turns instead of overlapping.
Here each job has warps of its own, joined only by mbarriers, so a consumer waits only where the
data it needs is not there yet:

* a TMA producer warp fills ring slot ``s`` with one box of activations ([BM, 64] bf16) and one of
  packed weights ([BN, 64 elements] as int32 words), once the slot's consumers and its decoder have
  released it;
* a decode warpgroup (4 warps) turns the slot's packed weights into bf16 (the streaming kernel's
  exact integer decode, ``tiled._decode``) in the slot's own [BN, 64] bf16 buffer, then signals
  ``decoded[s]``; it runs up to STAGES steps ahead of the tensor cores;
* one consumer warpgroup per 64 output rows (BM / 64 of them, each its own partition) issues one
  ``[64, 64] x [64, BN]`` wgmma per step on ``decoded[s]`` with one left in flight, and releases the
  slot of the previous step once that wgmma completed.

The decoded buffer of a slot is written only after both consumers released the slot's previous
use, so no wgmma ever reads a buffer being written. K must be a multiple of 32 (as ``tiled.py``);
TMA zero-fills activations and codes past M, N and K; scale loads past K read 2**0 / 0.

Split-K (SPLIT > 1): each consumer's fp32 partial [64, BN] to a workspace, the last split of that
half-tile to arrive sums the partials in split order (deterministic) and stores the output.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                               warpgroup_mma_wait)

from ._compat import cta_barrier, tma_load
from .stream import _FMT_MXFP8, _FMT_NVFP4, _scale_factor
from .tiled import BLOCK_K, _decode

__all__ = ["tiled_xf_kernel", "xf_word_layouts", "XF_DECODE_WARPS"]

#: warps of the decode partition: one warpgroup (32 fp4 elements per thread and step at BN = 128)
XF_DECODE_WARPS = gl.constexpr(4)
#: setmaxnreg of the worker partitions. Triton gives the default partition (consumer 0) what is
#: left of 384 threads x 168 (12 warps, BM = 128): (64512 - 128 x 200 - 128 x 104) / 128 = 200, so
#: both consumers get 200: a [64, 256] fp32 accumulator (128 per thread) and its epilogue. (A
#: producer warp of its own would make 13 warps, which Triton pads to 16: 128 registers each, too
#: few for the 256-column wgmma.) The decoder holds one step's words, their factors and 64 decoded
#: bf16 pairs at BN = 256.
XF_CONSUMER_REGS = gl.constexpr(192)
XF_DECODE_REGS = gl.constexpr(120)


@gluon.constexpr_function
def xf_word_layouts(bn, ns, wps, num_warps):
    """(2-D, 3-D) layouts of one step's packed weight words, [BN, NS * WPS] and [BN, NS, WPS], over
    ``num_warps`` warps: a thread holds 16-byte runs (4 words) of a row, lanes the row's further
    runs and then rows (8 lanes read 128 contiguous bytes: no bank conflicts), warps further rows,
    registers the rows left over."""
    wpr = ns * wps
    lg = lambda v: (v).bit_length() - 1  # noqa: E731 (log2 of a power of two)
    cols = [1 << i for i in range(lg(wpr))]
    vec = min(lg(wpr), 2)
    reg_c, lane_c = cols[:vec], cols[vec:]
    lane_r = [1 << i for i in range(5 - len(lane_c))]
    warp_r = [(1 << len(lane_r)) << i for i in range(lg(num_warps))]
    covered = (1 << len(lane_r)) * num_warps
    reps = [covered << i for i in range(lg(bn // covered))]

    def c3(c):  # word index c = block * WPS + word -> [row, block, word]
        return [0, 0, c] if c < wps else [0, c // wps, 0]

    two = gl.DistributedLinearLayout(
        reg_bases=[[0, c] for c in reg_c] + [[r, 0] for r in reps],
        lane_bases=[[0, c] for c in lane_c] + [[r, 0] for r in lane_r],
        warp_bases=[[r, 0] for r in warp_r], block_bases=[], shape=[bn, wpr])
    three = gl.DistributedLinearLayout(
        reg_bases=[c3(c) for c in reg_c] + [[r, 0, 0] for r in reps],
        lane_bases=[c3(c) for c in lane_c] + [[r, 0, 0] for r in lane_r],
        warp_bases=[[r, 0, 0] for r in warp_r], block_bases=[], shape=[bn, ns, wps])
    return two, three


@gluon.jit
def _xf_load_x(x_desc, x_bufs, x_ready, slot, off_m, kstep, pred):
    """Step ``kstep``'s activation box into x-ring slot ``slot`` (TMA)."""
    bar = x_ready.index(slot)
    mbarrier.expect(bar, x_desc.block_type.nbytes, pred=pred)
    tma_load(x_desc, [off_m, kstep * BLOCK_K], bar, x_bufs.index(slot), pred=pred)


@gluon.jit
def _xf_load_w(w_desc, w_bufs, w_ready, slot, off_n, kstep, WPR: gl.constexpr, pred):
    """Step ``kstep``'s packed-weight box into w-ring slot ``slot`` (TMA)."""
    bar = w_ready.index(slot)
    mbarrier.expect(bar, w_desc.block_type.nbytes, pred=pred)
    tma_load(w_desc, [off_n, kstep * WPR], bar, w_bufs.index(slot), pred=pred)


@gluon.jit
def _xf_factors(ws_ptr, srow, sc, kstep, ncol, FMT: gl.constexpr):
    """bf16x2 decode factors [DR, NS] of K step ``kstep``'s scale blocks of the rows at ``srow``."""
    NS: gl.constexpr = 2 if FMT != _FMT_NVFP4 else 4
    return _scale_factor(ws_ptr, srow, (kstep * NS + sc)[None, :], ncol, FMT)


@gluon.jit
def _xf_decode_rows(w_s, wd_s, f, FMT: gl.constexpr, DR: gl.constexpr):
    """``DR`` rows of a slot: packed words in ``w_s`` -> bf16 in ``wd_s`` (natural K order)."""
    NS: gl.constexpr = 2 if FMT != _FMT_NVFP4 else 4
    WPR: gl.constexpr = 16 if FMT == _FMT_MXFP8 else 8
    WPS: gl.constexpr = WPR // NS
    L2: gl.constexpr = xf_word_layouts(DR, NS, WPS, XF_DECODE_WARPS)[0]
    L3: gl.constexpr = xf_word_layouts(DR, NS, WPS, XF_DECODE_WARPS)[1]
    w2 = w_s.load(L2)
    words = gl.convert_layout(gl.reshape(w2, [DR, NS, WPS]), L3, assert_trivial=True)
    wd_s.store(_decode(words, gl.expand_dims(f, 2), FMT, DR))


@gluon.jit
def _xf_decoder(w_desc, w_bufs, wd_bufs, w_ready, decoded, d_free, ws_ptr, N, K, stride_wsn, off_n, k_lo, n_k,
                FMT: gl.constexpr, BN: gl.constexpr, WSTAGES: gl.constexpr, DSTAGES: gl.constexpr):
    """Decode warpgroup: the packed words of step i (w-ring slot i % WSTAGES) -> bf16 [BN, 64] in
    decoded-ring slot i % DSTAGES (natural K order), written once the consumers released that
    slot's previous use; then ``decoded``, and the w slot refilled with step i + WSTAGES (it is the
    slot's only reader). At BN = 256 in two halves of 128 rows (one half's words and bf16 values
    live at a time: the whole tile's spilled), each with its scales loaded a step ahead."""
    NS: gl.constexpr = 2 if FMT != _FMT_NVFP4 else 4  # scale blocks per row and step
    WPR: gl.constexpr = 16 if FMT == _FMT_MXFP8 else 8  # int32 words per row and step
    SPB: gl.constexpr = 16 if FMT == _FMT_NVFP4 else 32  # elements per scale
    DR: gl.constexpr = 128 if BN > 128 else BN  # rows decoded at once
    L3: gl.constexpr = xf_word_layouts(DR, NS, WPR // NS, XF_DECODE_WARPS)[1]
    SL: gl.constexpr = gl.SliceLayout(2, L3)

    sr = gl.arange(0, DR, layout=gl.SliceLayout(1, SL))
    sc = gl.arange(0, NS, layout=gl.SliceLayout(0, SL))
    ncol = gl.cdiv(K, SPB)
    srow0 = (off_n + gl.minimum(sr, N - 1 - off_n)).to(gl.int64)[:, None] * stride_wsn
    f0 = _xf_factors(ws_ptr, srow0, sc, k_lo, ncol, FMT)
    if BN > DR:
        srow1 = (off_n + gl.minimum(DR + sr, N - 1 - off_n)).to(gl.int64)[:, None] * stride_wsn
        f1 = _xf_factors(ws_ptr, srow1, sc, k_lo, ncol, FMT)
    for i in range(n_k):
        sw = i % WSTAGES
        sd = i % DSTAGES
        knext = k_lo + gl.minimum(i + 1, n_k - 1)
        # the next step's scales (a global load) in flight while this step decodes
        f0_nxt = _xf_factors(ws_ptr, srow0, sc, knext, ncol, FMT)
        mbarrier.wait(w_ready.index(sw), (i // WSTAGES) & 1)
        mbarrier.wait(d_free.index(sd), ((i // DSTAGES) & 1) ^ 1, pred=i >= DSTAGES)
        if BN > DR:
            f1_nxt = _xf_factors(ws_ptr, srow1, sc, knext, ncol, FMT)
            _xf_decode_rows(w_bufs.index(sw).slice(0, DR, dim=0), wd_bufs.index(sd).slice(0, DR, dim=0), f0, FMT, DR)
            _xf_decode_rows(w_bufs.index(sw).slice(DR, DR, dim=0), wd_bufs.index(sd).slice(DR, DR, dim=0), f1, FMT,
                            DR)
            f1 = f1_nxt
        else:
            _xf_decode_rows(w_bufs.index(sw), wd_bufs.index(sd), f0, FMT, DR)
        fence_async_shared()
        # all four warps stored their rows and read the w slot before one thread signals / refills
        cta_barrier()
        mbarrier.arrive(decoded.index(sd), count=1)
        _xf_load_w(w_desc, w_bufs, w_ready, sw, off_n, k_lo + i + WSTAGES, WPR, i + WSTAGES < n_k)
        f0 = f0_nxt


@gluon.jit
def _xf_consumer(x_desc, x_bufs, wd_bufs, x_ready, decoded, x_free, d_free, gs_ptr, ags_ptr, bias_ptr, c_ptr,
                 part_ptr, cnt_ptr, M, N, SPLIT, stride_cm, tile, sp, off_m, off_n, k_lo, n_k, FMT: gl.constexpr,
                 BN: gl.constexpr, XSTAGES: gl.constexpr, DSTAGES: gl.constexpr, HAS_AGS: gl.constexpr,
                 HAS_BIAS: gl.constexpr, WG: gl.constexpr, NCONS: gl.constexpr):
    """Consumer warpgroup ``WG``: output rows ``off_m + 64 WG`` .. ``+ 64``; one wgmma per step,
    one in flight; once the previous step's wgmma completed, its x and decoded slots are released
    and consumer 0 refills that x slot (TMA) when every consumer released it; then the epilogue."""
    mma_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
    acc = gl.zeros((64, BN), dtype=gl.float32, layout=mma_l)
    for i in range(n_k):
        sx = i % XSTAGES
        sd = i % DSTAGES
        mbarrier.wait(decoded.index(sd), (i // DSTAGES) & 1)
        mbarrier.wait(x_ready.index(sx), (i // XSTAGES) & 1)
        a_s = x_bufs.index(sx).slice(WG * 64, 64, dim=0)
        acc = warpgroup_mma(a_s, wd_bufs.index(sd).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        px = (i + XSTAGES - 1) % XSTAGES
        mbarrier.arrive(d_free.index((i + DSTAGES - 1) % DSTAGES), count=1, pred=i >= 1)
        mbarrier.arrive(x_free.index(px), count=1, pred=i >= 1)
        if WG == 0:
            # step i - 1 + XSTAGES into the x slot of step i - 1, once every consumer's wgmma of
            # step i - 1 completed
            refill = (i >= 1) & (i - 1 + XSTAGES < n_k)
            mbarrier.wait(x_free.index(px), ((i - 1) // XSTAGES) & 1, pred=refill)
            _xf_load_x(x_desc, x_bufs, x_ready, px, off_m, k_lo + i - 1 + XSTAGES, refill)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    if FMT == _FMT_NVFP4:
        gb = gl.load(gs_ptr).to(gl.float32)
        if HAS_AGS:
            gb = gb * gl.load(ags_ptr).to(gl.float32)
        acc = acc * gl.div_rn(gl.full([], 256.0, gl.float32), gb)
    rows = WG * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, mma_l))
    cols = gl.arange(0, BN, layout=gl.SliceLayout(0, mma_l))
    mask = (rows < M - off_m)[:, None] & (cols < N - off_n)[None, :]
    # 32-bit offsets from the half-tile's corner (64-bit addresses per element spilled at BN = 256)
    c_base = c_ptr + (off_m + WG * 64).to(gl.int64) * stride_cm + off_n
    c_ptrs = c_base + ((rows - WG * 64) * stride_cm)[:, None] + cols[None, :]
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
        # this warpgroup's half-tile is its own unit of the split-K sum (counter tile * NCONS + WG)
        unit = tile * NCONS + WG
        offs = ((rows - WG * 64) * BN)[:, None] + cols[None, :]
        split_stride = (gl.num_programs(0) // SPLIT).to(gl.int64) * (NCONS * 64 * BN)
        base = part_ptr + unit.to(gl.int64) * (64 * BN)
        gl.store(base + sp * split_stride + offs, acc)
        cta_barrier()  # every thread's partial store happens-before the release below
        cnt = cnt_ptr + unit
        arrived = gl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:
            tot = gl.load(base + offs, cache_modifier=".cg")
            for s2 in range(1, SPLIT):
                tot = tot + gl.load(base + s2 * split_stride + offs, cache_modifier=".cg")
            if HAS_BIAS:
                tot = tot + bias
            gl.store(c_ptrs, tot.to(c_ptr.dtype.element_ty), mask=mask)
            gl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")




@gluon.jit(do_not_specialize=["M", "ks_per_split"])
def tiled_xf_kernel(x_desc, w_desc, ws_ptr, gs_ptr, ags_ptr, bias_ptr, c_ptr, part_ptr, cnt_ptr, M, N, K,
                    ks_per_split, SPLIT, stride_wsn, stride_cm, FMT: gl.constexpr, BN: gl.constexpr,
                    XSTAGES: gl.constexpr, WSTAGES: gl.constexpr, DSTAGES: gl.constexpr, HAS_AGS: gl.constexpr,
                    HAS_BIAS: gl.constexpr, num_warps: gl.constexpr):
    """One program per (BM x BN output tile, K split), tiles N-major within a column of M tiles.
    Arguments as ``tiled.tiled_kernel`` (``part_ptr``: fp32 [SPLIT, tiles, BM, BN], ``cnt_ptr``:
    int32 zeros [tiles * BM / 64] when SPLIT > 1). BM = the activation box's rows, 64 or 128;
    ``num_warps`` = 4 (the default partition: consumer 0). Three rings: activations (XSTAGES
    slots), packed weights (WSTAGES) and decoded weights (DSTAGES)."""
    BM: gl.constexpr = x_desc.block_type.shape[0]
    NCONS: gl.constexpr = BM // 64
    gl.static_assert(NCONS == 1 or NCONS == 2, "64 or 128 rows per tile")
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    WPR: gl.constexpr = 16 if FMT == _FMT_MXFP8 else 8  # int32 words per row and step
    wd_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BLOCK_K], gl.bfloat16)

    pid = gl.program_id(0)
    tile = pid // SPLIT
    sp = pid % SPLIT
    tiles_n = gl.cdiv(N, BN)
    off_m = (tile // tiles_n) * BM
    off_n = (tile % tiles_n) * BN
    num_k = gl.cdiv(K, BLOCK_K)
    k_lo = sp * ks_per_split
    n_k = gl.minimum(ks_per_split, num_k - k_lo)

    x_bufs = gl.allocate_shared_memory(gl.bfloat16, [XSTAGES, BM, BLOCK_K], x_desc.layout)
    w_bufs = gl.allocate_shared_memory(gl.int32, [WSTAGES, BN, WPR], w_desc.layout)
    wd_bufs = gl.allocate_shared_memory(gl.bfloat16, [DSTAGES, BN, BLOCK_K], wd_layout)
    x_ready = gl.allocate_shared_memory(gl.int64, [XSTAGES, 1], mbarrier.MBarrierLayout())
    x_free = gl.allocate_shared_memory(gl.int64, [XSTAGES, 1], mbarrier.MBarrierLayout())
    w_ready = gl.allocate_shared_memory(gl.int64, [WSTAGES, 1], mbarrier.MBarrierLayout())
    decoded = gl.allocate_shared_memory(gl.int64, [DSTAGES, 1], mbarrier.MBarrierLayout())
    d_free = gl.allocate_shared_memory(gl.int64, [DSTAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(XSTAGES):
        mbarrier.init(x_ready.index(i), count=1)
        mbarrier.init(x_free.index(i), count=NCONS)
    for i in gl.static_range(WSTAGES):
        mbarrier.init(w_ready.index(i), count=1)
    for i in gl.static_range(DSTAGES):
        mbarrier.init(decoded.index(i), count=1)
        mbarrier.init(d_free.index(i), count=NCONS)
    # the rings filled before the partitions start; consumer 0 refills the x ring, the decoder the w ring
    for i in gl.static_range(XSTAGES):
        _xf_load_x(x_desc, x_bufs, x_ready, i, off_m, k_lo + i, i < n_k)
    for i in gl.static_range(WSTAGES):
        _xf_load_w(w_desc, w_bufs, w_ready, i, off_n, k_lo + i, WPR, i < n_k)
    if NCONS == 2:
        gl.warp_specialize([
            (_xf_consumer, (x_desc, x_bufs, wd_bufs, x_ready, decoded, x_free, d_free, gs_ptr, ags_ptr, bias_ptr, c_ptr,
                            part_ptr, cnt_ptr, M, N, SPLIT, stride_cm, tile, sp, off_m, off_n, k_lo, n_k, FMT, BN,
                            XSTAGES, DSTAGES, HAS_AGS, HAS_BIAS, 0, NCONS)),
            (_xf_consumer, (x_desc, x_bufs, wd_bufs, x_ready, decoded, x_free, d_free, gs_ptr, ags_ptr, bias_ptr, c_ptr,
                            part_ptr, cnt_ptr, M, N, SPLIT, stride_cm, tile, sp, off_m, off_n, k_lo, n_k, FMT, BN,
                            XSTAGES, DSTAGES, HAS_AGS, HAS_BIAS, 1, NCONS)),
            (_xf_decoder, (w_desc, w_bufs, wd_bufs, w_ready, decoded, d_free, ws_ptr, N, K, stride_wsn, off_n, k_lo,
                           n_k, FMT, BN, WSTAGES, DSTAGES)),
        ], [4, XF_DECODE_WARPS], [XF_CONSUMER_REGS, XF_DECODE_REGS])
    else:
        gl.warp_specialize([
            (_xf_consumer, (x_desc, x_bufs, wd_bufs, x_ready, decoded, x_free, d_free, gs_ptr, ags_ptr, bias_ptr, c_ptr,
                            part_ptr, cnt_ptr, M, N, SPLIT, stride_cm, tile, sp, off_m, off_n, k_lo, n_k, FMT, BN,
                            XSTAGES, DSTAGES, HAS_AGS, HAS_BIAS, 0, NCONS)),
            (_xf_decoder, (w_desc, w_bufs, wd_bufs, w_ready, decoded, d_free, ws_ptr, N, K, stride_wsn, off_n, k_lo,
                           n_k, FMT, BN, WSTAGES, DSTAGES)),
        ], [XF_DECODE_WARPS], [XF_DECODE_REGS])
    # no mbarrier.invalidate after the warp-specialised region (as wide.py and tiled.py)
