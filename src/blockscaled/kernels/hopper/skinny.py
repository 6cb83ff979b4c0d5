"""The sm_90a (Hopper) "skinny" fp8_block GEMM kernel in Gluon: decode / small M (M <= 64).

Swap-AB wgmma (the weight tile on the wgmma's 64-row M side, the activation rows padded to its N),
one program per (weight tile, K split), a deep TMA ring and fused deterministic split-K. Kernel
body only; the host launcher is ``blockscaled.ops._hopper`` (``HopperConfig.variant == "skinny"``).
Operands, numerics and tails as in ``_common.py``.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from ._common import B_SCALE_ROWS, _issue_load, _launch_metadata, mma_layout_for
from ._compat import cta_barrier

__all__ = ["fp8_block_gemm_skinny_kernel"]

# Why: at M <= 64 the GEMM is a weight stream (2112x7168: 15 MB, 5 us at 3 TB/s) and what counts
# is bytes in flight from the first microsecond. The portable kernel (cp.async, 3 chunks of 8 KB
# in flight per program) reached 51-87% of the memory floor at M=1 where a plain streaming read
# of the same bytes reached 71-99% (scripts/probes/stream_ceiling.py, H100). Here each program owns one
# (BLOCK_N weight rows, K range) unit, keeps STAGES - 1 weight boxes of BLOCK_N x 128 bytes in
# flight through TMA (up to ~200 KB of shared memory), and the weight tile is the wgmma's M side
# (64 rows per instruction) with the activation rows padded only to the wgmma N (MP = 8..64, TMA
# zero-fills rows >= M): C^T[n, m] = sum_k W[n, k] X[m, k].
# Promotion per 128-wide K block as everywhere: acc += part * sb[n // 128, kb] * sa[m, kb].
# Split-K (SPLIT > 1): each unit writes its fp32 partial C^T tile [BLOCK_N, MP] to
# ws[sp, tile] (contiguous 4-32 KB), and the last unit of the tile (gpu-scope acq_rel counter,
# self-resetting) sums the SPLIT partials in split order (deterministic) and stores.


@gluon.constexpr_function
def skinny_store_layout(block_n, mp, num_warps):
    """Blocked layout of the C^T tile [BLOCK_N, MP] for the epilogue: each thread holds 8 output
    columns n (16 contiguous bytes of an output row in bf16), a warp spans up to 256 of them."""
    t0 = max(1, min(32, block_n // 8))
    t1 = 32 // t0
    w1 = max(1, min(num_warps, mp // t1))
    return gl.BlockedLayout([8, 1], [t0, t1], [num_warps // w1, w1], [0, 1])


@gluon.jit
def _skinny_scales(sa_rows, row_ok, sb_row, sk, kb0, kb_end, stride_sak, stride_sbk):
    """Promotion scales of K blocks kb0 .. kb0 + SC - 1 (0 past kb_end): [MP, SC] =
    sa[m, kb] * sb[tile's 128-row block, kb]."""
    kbs = kb0 + sk
    ok = kbs < kb_end
    sb = gl.load(sb_row + kbs * stride_sbk, mask=ok, other=0.0)
    sa = gl.load(sa_rows + (kbs * stride_sak)[None, :], mask=row_ok & ok[None, :], other=0.0)
    return sa * sb[None, :]


@gluon.jit(launch_metadata=_launch_metadata)
def fp8_block_gemm_skinny_kernel(a_desc, b_desc, sa_ptr, sb_ptr, c_ptr, ws_ptr, cnt_ptr, M, N, K, kb_per_split,
                                 SPLIT, stride_sam, stride_sak, stride_sbn, stride_sbk, stride_cm,
                                 STAGES: gl.constexpr, num_warps: gl.constexpr):
    """One program per (weight tile of BLOCK_N rows, K split). ``a_desc`` boxes [MP, 128] of A
    [M, K] (M <= MP), ``b_desc`` boxes [BLOCK_N, 128] of B [N, K]; ``ws_ptr`` fp32
    [SPLIT, cdiv(N, BLOCK_N), BLOCK_N, MP] and ``cnt_ptr`` int32 [>= cdiv(N, BLOCK_N)] zeros
    (SPLIT > 1; any pointers otherwise). The host keeps every split non-empty. SPLIT is a
    runtime argument (one compiled kernel per tile shape and ring depth; the JIT specialises
    SPLIT == 1 on its own)."""
    MP: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    gl.static_assert(BLOCK_K == 128, "BLOCK_K must equal the 128-wide fp8_block scale block")
    gl.static_assert(B_SCALE_ROWS % BLOCK_N == 0, "BLOCK_N must divide the 128-row weight-scale block")
    gl.static_assert(num_warps == 4, "one warpgroup: the weight tile is the wgmma's 64-row M side")
    gl.static_assert(STAGES >= 2, "need at least 2 pipeline stages")
    mma_layout: gl.constexpr = mma_layout_for(BLOCK_N, MP, num_warps)

    pid = gl.program_id(0)
    tile = pid // SPLIT
    sp = pid % SPLIT
    off_n = tile * BLOCK_N
    num_k = gl.cdiv(K, BLOCK_K)
    kb_lo = sp * kb_per_split
    n_kb = gl.minimum(kb_per_split, num_k - kb_lo)

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, MP, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    # Fill the ring: STAGES - 1 boxes in flight before the first wgmma (the last slot is refilled
    # one iteration later, after the wgmma that read it has completed).
    for i in gl.static_range(STAGES - 1):
        _issue_load(b_desc, a_desc, b_bufs, a_bufs, bars, i, off_n, 0, (kb_lo + i) * BLOCK_K, i < n_kb)

    # Scales: a global load per K block right before its promotion costs one DRAM latency per
    # iteration (the first H100 sweep of this kernel: 14 blocks per program took ~10 us, slower
    # than the portable kernel). They are loaded SC K blocks at a time as the product
    # sa[m, kb] * sb[n // 128, kb] ([MP, SC] registers), the next chunk prefetched while the
    # current one is used, and column i % SC is extracted per iteration (a masked row sum).
    SC: gl.constexpr = 32
    scl: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])
    sm = gl.arange(0, MP, layout=gl.SliceLayout(1, scl))
    sk = gl.arange(0, SC, layout=gl.SliceLayout(0, scl))
    sa_rows = sa_ptr + sm.to(gl.int64)[:, None] * stride_sam
    row_ok = (sm < M)[:, None]
    sb_row = sb_ptr + (off_n // B_SCALE_ROWS) * stride_sbn
    kb_end = kb_lo + n_kb
    cur = _skinny_scales(sa_rows, row_ok, sb_row, sk, kb_lo, kb_end, stride_sak, stride_sbk)
    nxt = _skinny_scales(sa_rows, row_ok, sb_row, sk, kb_lo + SC, kb_end, stride_sak, stride_sbk)
    acc = gl.zeros((BLOCK_N, MP), dtype=gl.float32, layout=mma_layout)
    part = gl.zeros((BLOCK_N, MP), dtype=gl.float32, layout=mma_layout)
    for i in range(n_kb):
        # refill the slot read by iteration i - 1 (its wgmma completed: wait(0) below)
        p = i + STAGES - 1
        _issue_load(b_desc, a_desc, b_bufs, a_bufs, bars, p % STAGES, off_n, 0, (kb_lo + p) * BLOCK_K, p < n_kb)
        j = i % SC
        if (j == 0) & (i > 0):
            cur = nxt
            nxt = _skinny_scales(sa_rows, row_ok, sb_row, sk, kb_lo + i + SC, kb_end, stride_sak, stride_sbk)
        scale = gl.convert_layout(gl.sum(gl.where(sk[None, :] == j, cur, 0.0), axis=1),
                                  gl.SliceLayout(0, mma_layout))
        s = i % STAGES
        mbarrier.wait(bars.index(s), (i // STAGES) & 1)
        part = warpgroup_mma(b_bufs.index(s), a_bufs.index(s).permute((1, 0)), part, use_acc=False,
                             is_async=True)
        part, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(part, a_bufs.index(s), b_bufs.index(s)))
        acc = acc + part * scale[None, :]
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))

    out_layout: gl.constexpr = skinny_store_layout(BLOCK_N, MP, num_warps)
    r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, out_layout))
    c = gl.arange(0, MP, layout=gl.SliceLayout(0, out_layout))
    mask = (r < N - off_n)[:, None] & (c < M)[None, :]
    c_ptrs = c_ptr + c.to(gl.int64)[None, :] * stride_cm + (off_n + r)[:, None]
    if SPLIT == 1:
        gl.store(c_ptrs, gl.convert_layout(acc, out_layout).to(c_ptr.dtype.element_ty), mask=mask)
    else:
        # partial tile ws[sp, tile] ([BLOCK_N, MP] column-major, 4-32 KB contiguous: a thread's 8
        # columns n are 32 contiguous bytes and a warp's lanes run along them, whole lines per
        # access; row-major spread each access over 8 lines, stream.mma_slot_offsets). With the
        # plain loads below: split calls 1.15-1.65x (H200, thirty-ninth session, 32 x 2112 x 7168
        # split 8 12.7 -> 9.9 us; results/h200/archive/split-sum-ab-20261129.json)
        tile_elems: gl.constexpr = BLOCK_N * MP
        split_stride = (gl.num_programs(0) // SPLIT).to(gl.int64) * tile_elems
        offs = (c * BLOCK_N)[None, :] + r[:, None]
        base = ws_ptr + tile.to(gl.int64) * tile_elems
        gl.store(base + sp * split_stride + offs, gl.convert_layout(acc, out_layout))
        cta_barrier()  # every thread's partial store happens-before the release below
        cnt = cnt_ptr + tile
        arrived = gl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:
            # last unit of the tile: all partials are visible (acquire); fixed order s = 0..SPLIT-1,
            # its own read back too, so the bits do not depend on which unit finished last.
            # Plain loads: the acquire invalidates this SM's L1 (stream._splitk_sum_store).
            # Several partials in flight per step (one L2 round trip per step, not per split),
            # added in split order: 4 per step, 2 for the 128x64 tile (4 x 64 fp32 registers
            # per thread spilled, ptxas).
            tot = gl.load(base + offs)
            if BLOCK_N * MP <= 4096:
                for s2 in range(1, SPLIT, 4):
                    p1 = gl.load(base + s2 * split_stride + offs)
                    p2 = gl.load(base + (s2 + 1) * split_stride + offs, mask=s2 + 1 < SPLIT, other=0.0)
                    p3 = gl.load(base + (s2 + 2) * split_stride + offs, mask=s2 + 2 < SPLIT, other=0.0)
                    p4 = gl.load(base + (s2 + 3) * split_stride + offs, mask=s2 + 3 < SPLIT, other=0.0)
                    tot = (((tot + p1) + p2) + p3) + p4
            else:
                for s2 in range(1, SPLIT, 2):
                    p1 = gl.load(base + s2 * split_stride + offs)
                    p2 = gl.load(base + (s2 + 1) * split_stride + offs, mask=s2 + 1 < SPLIT, other=0.0)
                    tot = (tot + p1) + p2
            gl.store(c_ptrs, tot.to(c_ptr.dtype.element_ty), mask=mask)
            gl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")  # all zeros for the next launch
