"""sm_90a (Hopper) fp8_block x fp8_block GEMM kernels in Gluon (kernel bodies only; host logic in
``blockscaled.ops._hopper``).

C[M, N] (bf16/fp16/fp32) = (A * sa) @ (B * sb).T with
  A  [M, K] float8_e4m3fn, row-major (K contiguous), scales sa [M, ceil(K/128)] fp32 (1x128 blocks);
  B  [N, K] float8_e4m3fn, row-major (K contiguous), scales sb [ceil(N/128), ceil(K/128)] fp32
     (128x128 blocks).

Numerics (same as the portable kernel, design.md section 5): per 128-wide K block one FP8 wgmma
chain (fp32 accumulation inside the tensor core, starting from zero) gives ``part``; it is
promoted into the fp32 accumulator as ``acc += part * sa[row] * sb[col // 128]``. No fast
accumulation across K blocks.

Three variants, all selectable by the launcher (one kernel each so each can be timed):
  * ``fp8_block_gemm_tma_kernel``        step 1: one output tile per program, STAGES-deep TMA ring
                                           (mbarrier per slot), wgmma FP8, promotion per K block.
  * ``fp8_block_gemm_persistent_kernel`` step 2: grid = #SMs, each program walks tiles
                                           ``pid, pid + nprog, ...`` in grouped (GROUP_M) order; the
                                           (tile, k-block) iteration space is flattened so TMA
                                           loads of the next tile are issued while the current
                                           tile's last blocks are multiplied and stored.
  * ``fp8_block_gemm_ws_kernel``         step 3: persistent + warp-specialised: a 1-warp TMA
                                           producer partition fills the ring (ready/empty
                                           mbarriers); the default partition (num_warps math warps
                                           = 2 warpgroups for BLOCK_M=128) issues wgmma, promotes
                                           and stores.
The persistent and ws kernels share the math loop ``_consume`` and take ``OVERLAP`` (constexpr):
False = per K block wgmma -> wait(0) -> promote; True = the wgmma chain of block k+1 is issued
before block k is waited for and promoted (software-pipelined promotion, loop unrolled by two).

Tails: TMA zero-fills out-of-bounds rows/cols/K of the loaded boxes, so M, N and the K tail
need no masks in the main loop (a zero-filled K tail contributes 0); scale loads are masked and
the bf16 store is masked on M and N.
BLOCK_K must be 128 (= the scale block) so each K block has exactly one scale per row; BLOCK_N
must divide 128 so a tile has one weight scale per K block (Gluon block shapes are powers of two,
and BLOCK_N=256 would need 2 x 128 fp32 accumulator registers per thread -> spills).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,  # noqa: F401  (kept for a future TMA-store epilogue)
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# Rows (of B / columns of C) sharing one fp32 weight scale: fp8_block weights are 128x128 blocks.
B_SCALE_ROWS = gl.constexpr(128)


def _launch_metadata(grid, kernel, args):
    """Profiler metadata (only evaluated with a profiler hook): name with M/N/K, tile and stages,
    FLOPs, bytes moved once (A, B, both fp32 scale tensors, output)."""
    m, n, k = args["M"], args["N"], args["K"]
    bm, bk = args["a_desc"].block_shape
    bn = args["b_desc"].block_shape[0]
    nk = -(-k // 128)
    nbytes = m * k + m * nk * 4 + n * k + -(-n // 128) * nk * 4 + m * n * args["c_ptr"].element_size()
    ov = args.get("OVERLAP")
    return {
        "name": f"{kernel.name} [M={m}, N={n}, K={k}, tile={bm}x{bn}x{bk}, stages={args.get('STAGES')}"
                f"{'' if ov is None else f', overlap={bool(ov)}'}, grid={grid[0]}]",
        "flops": 2.0 * m * n * k,
        "bytes": int(nbytes),
    }


@gluon.constexpr_function
def mma_layout_for(block_m, block_n, num_warps):
    """wgmma accumulator layout: warps stacked along M (4 warps = one warpgroup = 64 rows),
    remaining warps along N; instruction N = the whole per-warpgroup N extent (largest wgmma,
    fewest instructions; n <= 256 and divides it), k = 32 for 8-bit inputs."""
    wm = 4
    wn = 1
    while wm * wn < num_warps:
        if block_m > 16 * wm:
            wm *= 2
        else:
            wn *= 2
    n = min(256, block_n // wn)
    while block_n % n != 0 or n % 8 != 0:
        n -= 8
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[wm, wn], instr_shape=[16, n, 32])


@gluon.constexpr_function
def store_layout_for(block_n, num_warps):
    """Coalesced layout for the masked epilogue store: 8 contiguous 16-bit outputs (16 bytes) per
    thread along N, a warp covers 256 contiguous columns (or wraps)."""
    tpn = max(1, min(32, block_n // 8))
    return gl.BlockedLayout([1, 8], [32 // tpn, tpn], [num_warps, 1], [1, 0])


@gluon.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    # Grouped (L2-friendly) order: GROUP_M row-tiles share each B column tile while it is in L2.
    group_size = GROUP_M * num_pid_n
    group_id = tile_id // group_size
    first_m = group_id * GROUP_M
    # Clamped to >= 1: look-ahead iterations past the last tile compute (unused, predicated-off)
    # coordinates and must not divide by zero.
    rows = gl.maximum(gl.minimum(num_pid_m - first_m, GROUP_M), 1)
    in_group = tile_id % group_size
    pid_m = first_m + in_group % rows
    pid_n = in_group // rows
    return pid_m, pid_n


@gluon.jit
def _load_scales(sa_ptr, sb_ptr, off_m, off_n, kb, M, stride_sam, stride_sak, stride_sbn, stride_sbk,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, mma_layout: gl.constexpr):
    """Combined promotion scale ``[BLOCK_M, 1]`` = sa[row, kb] * sb[off_n // 128, kb]. BLOCK_N
    divides 128, so a tile lies in one 128-row weight-scale block and sb is one scalar load."""
    gl.static_assert(B_SCALE_ROWS % BLOCK_N == 0, "BLOCK_N must divide the 128-row weight-scale block")
    rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma_layout))
    sa = gl.load(sa_ptr + rows.to(gl.int64) * stride_sam + kb * stride_sak, mask=rows < M, other=0.0)
    sb = gl.load(sb_ptr + (off_n // B_SCALE_ROWS) * stride_sbn + kb * stride_sbk)
    return (sa * sb)[:, None]


@gluon.jit
def _store_tile(c_ptr, acc, off_m, off_n, M, N, stride_cm, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                num_warps: gl.constexpr):
    # Masked store (any M, N, any 16-bit/32-bit output row stride); TMA store would need
    # N * elem_size % 16 == 0.
    out_layout: gl.constexpr = store_layout_for(BLOCK_N, num_warps)
    out = gl.convert_layout(acc.to(c_ptr.dtype.element_ty), out_layout)
    rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_layout))
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out_layout))
    ptrs = c_ptr + rows.to(gl.int64)[:, None] * stride_cm + cols[None, :]
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    gl.store(ptrs, out, mask=mask)


@gluon.jit
def _issue_load(a_desc, b_desc, a_bufs, b_bufs, bars, slot, off_m, off_n, k, pred):
    bar = bars.index(slot)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(a_desc, [off_m, k], bar, a_bufs.index(slot), pred=pred)
    tma.async_copy_global_to_shared(b_desc, [off_n, k], bar, b_bufs.index(slot), pred=pred)


# --------------------------------------------------------------------------------------------
# Step 1: one tile per program.
# --------------------------------------------------------------------------------------------
@gluon.jit(launch_metadata=_launch_metadata)
def fp8_block_gemm_tma_kernel(a_desc, b_desc, sa_ptr, sb_ptr, c_ptr, M, N, K,
                              stride_sam, stride_sak, stride_sbn, stride_sbk, stride_cm,
                              GROUP_M: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    gl.static_assert(BLOCK_K == 128, "BLOCK_K must equal the 128-wide fp8_block scale block")
    gl.static_assert(STAGES >= 2, "need at least 2 pipeline stages")
    mma_layout: gl.constexpr = mma_layout_for(BLOCK_M, BLOCK_N, num_warps)

    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _tile_coords(gl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)

    num_k = gl.cdiv(K, BLOCK_K)
    for i in gl.static_range(STAGES - 1):
        _issue_load(a_desc, b_desc, a_bufs, b_bufs, bars, i, off_m, off_n, i * BLOCK_K, i < num_k)

    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma_layout)
    # wgmma destination, loop-carried so use_acc=False reuses its registers (a separate zero
    # tile would pin 64 more registers per thread).
    part = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma_layout)
    for kb in range(num_k):
        # Refill the slot consumed by iteration kb-1 (its wgmma has completed: wait(0) below).
        p = kb + STAGES - 1
        _issue_load(a_desc, b_desc, a_bufs, b_bufs, bars, p % STAGES, off_m, off_n, p * BLOCK_K, p < num_k)
        scale = _load_scales(sa_ptr, sb_ptr, off_m, off_n, kb, M, stride_sam, stride_sak, stride_sbn,
                             stride_sbk, BLOCK_M, BLOCK_N, mma_layout)
        s = kb % STAGES
        mbarrier.wait(bars.index(s), (kb // STAGES) & 1)
        part = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), part, use_acc=False,
                             is_async=True)
        part, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(part, a_bufs.index(s), b_bufs.index(s)))
        acc = acc + part * scale

    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    _store_tile(c_ptr, acc, off_m, off_n, M, N, stride_cm, BLOCK_M, BLOCK_N, num_warps)


# --------------------------------------------------------------------------------------------
# Step 2: persistent, flattened (tile, k-block) loop.
# --------------------------------------------------------------------------------------------
@gluon.jit
def _flat_coords(it, num_k, pid, nprog, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    t = it // num_k
    kb = it - t * num_k
    pid_m, pid_n = _tile_coords(pid + t * nprog, num_pid_m, num_pid_n, GROUP_M)
    return pid_m, pid_n, kb


@gluon.jit
def _block_scale(it, sa_ptr, sb_ptr, M, N, num_k, pid, nprog, num_pid_m, num_pid_n,
                 stride_sam, stride_sak, stride_sbn, stride_sbk, GROUP_M: gl.constexpr,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, mma_layout: gl.constexpr):
    """Promotion scale ``[BLOCK_M, 1]`` of flat iteration ``it`` (loaded one block ahead of its
    use so the global-load latency hides behind a wgmma chain). ``it`` may be one past the last
    iteration: its coordinates are then beyond the matrix and the masked loads return 0."""
    cm, cn, kb = _flat_coords(it, num_k, pid, nprog, num_pid_m, num_pid_n, GROUP_M)
    off_m = cm * BLOCK_M
    off_n = cn * BLOCK_N
    rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma_layout))
    sa = gl.load(sa_ptr + rows.to(gl.int64) * stride_sam + kb * stride_sak, mask=rows < M, other=0.0)
    sb = gl.load(sb_ptr + (off_n // B_SCALE_ROWS) * stride_sbn + kb * stride_sbk, mask=off_n < N, other=0.0)
    return (sa * sb)[:, None]


@gluon.jit
def _finish_block(it, cur, scale, acc, empty, a_bufs, b_bufs, c_ptr, M, N, num_k, pid, nprog,
                  num_pid_m, num_pid_n, stride_cm, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                  PRODUCE: gl.constexpr, WAIT_N: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  mma_layout: gl.constexpr, num_warps: gl.constexpr):
    """Wait for block ``it``'s wgmma (``cur``; WAIT_N newer groups may stay in flight), release
    its slot (ws), promote into ``acc`` with ``scale``, store the tile after its last K block.
    Returns (acc, finished part tile)."""
    cm, cn, kb = _flat_coords(it, num_k, pid, nprog, num_pid_m, num_pid_n, GROUP_M)
    s = it % STAGES
    done, _, _ = warpgroup_mma_wait(num_outstanding=WAIT_N, deps=(cur, a_bufs.index(s), b_bufs.index(s)))
    if not PRODUCE:
        mbarrier.arrive(empty.index(s), count=1)
    acc = acc + done * scale
    if kb == num_k - 1:
        _store_tile(c_ptr, acc, cm * BLOCK_M, cn * BLOCK_N, M, N, stride_cm, BLOCK_M, BLOCK_N, num_warps)
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma_layout)
    return acc, done


@gluon.jit
def _refill(it, a_desc, b_desc, a_bufs, b_bufs, ready, total, num_k, pid, nprog, num_pid_m, num_pid_n,
            GROUP_M: gl.constexpr, STAGES: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
            BLOCK_K: gl.constexpr):
    # Load block it+STAGES-1 into the slot of block it-1 (whose wgmma has completed).
    p = it + STAGES - 1
    pm, pn, pk = _flat_coords(p, num_k, pid, nprog, num_pid_m, num_pid_n, GROUP_M)
    _issue_load(a_desc, b_desc, a_bufs, b_bufs, ready, p % STAGES, pm * BLOCK_M, pn * BLOCK_N, pk * BLOCK_K,
                p < total)


@gluon.jit
def _issue_block(it, spare, ready, a_bufs, b_bufs, STAGES: gl.constexpr):
    # Wait for block it's operands and start its wgmma chain into ``spare``'s registers
    # (use_acc=False: the chain starts from zero).
    s = it % STAGES
    mbarrier.wait(ready.index(s), (it // STAGES) & 1)
    return warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), spare, use_acc=False, is_async=True)


@gluon.jit
def _consume(a_desc, b_desc, a_bufs, b_bufs, ready, empty, sa_ptr, sb_ptr, c_ptr, M, N, K,
             stride_sam, stride_sak, stride_sbn, stride_sbk, stride_cm,
             GROUP_M: gl.constexpr, STAGES: gl.constexpr, PRODUCE: gl.constexpr, OVERLAP: gl.constexpr,
             num_warps: gl.constexpr):
    """Math loop over this program's flattened (tile, k-block) iterations.

    PRODUCE=True (persistent kernel): this partition also refills the TMA ring, STAGES-1 blocks
    ahead (the caller issued the first STAGES-1 loads); ``empty`` is unused. PRODUCE=False (ws):
    a producer partition fills the ring; slots are released by arriving on ``empty``.
    OVERLAP=False: per block, wgmma chain -> wait(0) -> promote. OVERLAP=True: the wgmma chain of
    block it+1 is issued before waiting for block it (wait(1)), so the promotion of block it runs
    while the tensor cores work on it+1 (3 fp32 tiles live: acc and two part tiles X, Y). The
    loop is unrolled by two so X and Y swap roles without register copies: a copy of an
    in-flight wgmma accumulator makes ptxas serialise all wgmma (warning C7514).
    Scales: block it+1's are loaded right after block it is promoted, so their global-load
    latency hides behind block it+1's wgmma chain (overlap) / the next refill and issue.
    """
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    mma_layout: gl.constexpr = mma_layout_for(BLOCK_M, BLOCK_N, num_warps)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    num_k = gl.cdiv(K, BLOCK_K)
    total = gl.cdiv(num_pid_m * num_pid_n - pid, nprog) * num_k  # >= 1: grid <= #tiles, K > 0

    acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma_layout)
    # wgmma destination registers, loop-carried so use_acc=False reuses them (a fresh zero tile
    # per block would pin another 64 registers per thread at 128x128).
    y = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma_layout)
    scale = _block_scale(0, sa_ptr, sb_ptr, M, N, num_k, pid, nprog, num_pid_m, num_pid_n, stride_sam, stride_sak,
                         stride_sbn, stride_sbk, GROUP_M, BLOCK_M, BLOCK_N, mma_layout)
    if OVERLAP:
        x = _issue_block(0, gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma_layout), ready, a_bufs,
                         b_bufs, STAGES)
        n_pairs = (total - 1) // 2
        for j in range(n_pairs):
            it = 2 * j
            if PRODUCE:
                _refill(it, a_desc, b_desc, a_bufs, b_bufs, ready, total, num_k, pid, nprog, num_pid_m, num_pid_n,
                        GROUP_M, STAGES, BLOCK_M, BLOCK_N, BLOCK_K)
            y = _issue_block(it + 1, y, ready, a_bufs, b_bufs, STAGES)
            acc, x = _finish_block(it, x, scale, acc, empty, a_bufs, b_bufs, c_ptr, M, N, num_k, pid, nprog,
                                   num_pid_m, num_pid_n, stride_cm, GROUP_M, STAGES, PRODUCE, 1, BLOCK_M, BLOCK_N,
                                   mma_layout, num_warps)
            scale = _block_scale(it + 1, sa_ptr, sb_ptr, M, N, num_k, pid, nprog, num_pid_m, num_pid_n, stride_sam,
                                 stride_sak, stride_sbn, stride_sbk, GROUP_M, BLOCK_M, BLOCK_N, mma_layout)
            if PRODUCE:
                _refill(it + 1, a_desc, b_desc, a_bufs, b_bufs, ready, total, num_k, pid, nprog, num_pid_m,
                        num_pid_n, GROUP_M, STAGES, BLOCK_M, BLOCK_N, BLOCK_K)
            x = _issue_block(it + 2, x, ready, a_bufs, b_bufs, STAGES)
            acc, y = _finish_block(it + 1, y, scale, acc, empty, a_bufs, b_bufs, c_ptr, M, N, num_k, pid, nprog,
                                   num_pid_m, num_pid_n, stride_cm, GROUP_M, STAGES, PRODUCE, 1, BLOCK_M, BLOCK_N,
                                   mma_layout, num_warps)
            scale = _block_scale(it + 2, sa_ptr, sb_ptr, M, N, num_k, pid, nprog, num_pid_m, num_pid_n, stride_sam,
                                 stride_sak, stride_sbn, stride_sbk, GROUP_M, BLOCK_M, BLOCK_N, mma_layout)
        # 1 or 2 blocks left; block `it` is in flight in x. No wgmma is in flight after either branch.
        it = 2 * n_pairs
        if total - it == 2:
            if PRODUCE:
                _refill(it, a_desc, b_desc, a_bufs, b_bufs, ready, total, num_k, pid, nprog, num_pid_m, num_pid_n,
                        GROUP_M, STAGES, BLOCK_M, BLOCK_N, BLOCK_K)
            y_last = _issue_block(it + 1, y, ready, a_bufs, b_bufs, STAGES)
            acc, _ = _finish_block(it, x, scale, acc, empty, a_bufs, b_bufs, c_ptr, M, N, num_k, pid, nprog,
                                   num_pid_m, num_pid_n, stride_cm, GROUP_M, STAGES, PRODUCE, 1, BLOCK_M, BLOCK_N,
                                   mma_layout, num_warps)
            scale = _block_scale(it + 1, sa_ptr, sb_ptr, M, N, num_k, pid, nprog, num_pid_m, num_pid_n, stride_sam,
                                 stride_sak, stride_sbn, stride_sbk, GROUP_M, BLOCK_M, BLOCK_N, mma_layout)
            acc, _ = _finish_block(it + 1, y_last, scale, acc, empty, a_bufs, b_bufs, c_ptr, M, N, num_k, pid,
                                   nprog, num_pid_m, num_pid_n, stride_cm, GROUP_M, STAGES, PRODUCE, 0, BLOCK_M,
                                   BLOCK_N, mma_layout, num_warps)
        else:
            acc, _ = _finish_block(it, x, scale, acc, empty, a_bufs, b_bufs, c_ptr, M, N, num_k, pid, nprog,
                                   num_pid_m, num_pid_n, stride_cm, GROUP_M, STAGES, PRODUCE, 0, BLOCK_M, BLOCK_N,
                                   mma_layout, num_warps)
    else:
        for it in range(total):
            if PRODUCE:
                _refill(it, a_desc, b_desc, a_bufs, b_bufs, ready, total, num_k, pid, nprog, num_pid_m, num_pid_n,
                        GROUP_M, STAGES, BLOCK_M, BLOCK_N, BLOCK_K)
            y = _issue_block(it, y, ready, a_bufs, b_bufs, STAGES)
            scale_n = _block_scale(it + 1, sa_ptr, sb_ptr, M, N, num_k, pid, nprog, num_pid_m, num_pid_n, stride_sam,
                                   stride_sak, stride_sbn, stride_sbk, GROUP_M, BLOCK_M, BLOCK_N, mma_layout)
            acc, y = _finish_block(it, y, scale, acc, empty, a_bufs, b_bufs, c_ptr, M, N, num_k, pid, nprog,
                                   num_pid_m, num_pid_n, stride_cm, GROUP_M, STAGES, PRODUCE, 0, BLOCK_M, BLOCK_N,
                                   mma_layout, num_warps)
            scale = scale_n


@gluon.jit(launch_metadata=_launch_metadata)
def fp8_block_gemm_persistent_kernel(a_desc, b_desc, sa_ptr, sb_ptr, c_ptr, M, N, K,
                                     stride_sam, stride_sak, stride_sbn, stride_sbk, stride_cm,
                                     GROUP_M: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr,
                                     num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    gl.static_assert(BLOCK_K == 128, "BLOCK_K must equal the 128-wide fp8_block scale block")
    gl.static_assert(STAGES >= 2, "need at least 2 pipeline stages")

    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    num_k = gl.cdiv(K, BLOCK_K)
    total = gl.cdiv(num_pid_m * num_pid_n - pid, nprog) * num_k

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    for i in gl.static_range(STAGES - 1):
        pm, pn, pk = _flat_coords(i, num_k, pid, nprog, num_pid_m, num_pid_n, GROUP_M)
        _issue_load(a_desc, b_desc, a_bufs, b_bufs, bars, i, pm * BLOCK_M, pn * BLOCK_N, pk * BLOCK_K, i < total)

    _consume(a_desc, b_desc, a_bufs, b_bufs, bars, bars, sa_ptr, sb_ptr, c_ptr, M, N, K,
             stride_sam, stride_sak, stride_sbn, stride_sbk, stride_cm, GROUP_M, STAGES, True, OVERLAP, num_warps)

    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))


# --------------------------------------------------------------------------------------------
# Step 3: persistent + warp-specialised (1-warp TMA producer, math warps in the default partition).
# --------------------------------------------------------------------------------------------
@gluon.jit
def _ws_producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP_M: gl.constexpr,
                 STAGES: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    num_k = gl.cdiv(K, BLOCK_K)
    total = gl.cdiv(num_pid_m * num_pid_n - pid, nprog) * num_k
    for it in range(total):
        s = it % STAGES
        # Slot s is free once the consumer released use (it // STAGES) - 1; the first pass is free.
        mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1, pred=it >= STAGES)
        pm, pn, kb = _flat_coords(it, num_k, pid, nprog, num_pid_m, num_pid_n, GROUP_M)
        _issue_load(a_desc, b_desc, a_bufs, b_bufs, ready, s, pm * BLOCK_M, pn * BLOCK_N, kb * BLOCK_K, True)


@gluon.jit
def _ws_consumer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, sa_ptr, sb_ptr, c_ptr, M, N, K,
                 stride_sam, stride_sak, stride_sbn, stride_sbk, stride_cm,
                 GROUP_M: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr, num_warps: gl.constexpr):
    _consume(a_desc, b_desc, a_bufs, b_bufs, ready, empty, sa_ptr, sb_ptr, c_ptr, M, N, K,
             stride_sam, stride_sak, stride_sbn, stride_sbk, stride_cm, GROUP_M, STAGES, False, OVERLAP, num_warps)


@gluon.jit(launch_metadata=_launch_metadata)
def fp8_block_gemm_ws_kernel(a_desc, b_desc, sa_ptr, sb_ptr, c_ptr, M, N, K,
                             stride_sam, stride_sak, stride_sbn, stride_sbk, stride_cm,
                             GROUP_M: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr,
                             num_warps: gl.constexpr):
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    gl.static_assert(BLOCK_K == 128, "BLOCK_K must equal the 128-wide fp8_block scale block")
    gl.static_assert(STAGES >= 2, "need at least 2 pipeline stages")

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)

    gl.warp_specialize([
        (_ws_consumer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, sa_ptr, sb_ptr, c_ptr, M, N, K,
                        stride_sam, stride_sak, stride_sbn, stride_sbk, stride_cm, GROUP_M, STAGES, OVERLAP,
                        num_warps)),
        (_ws_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP_M, STAGES)),
    ], [1], [40])

    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))
