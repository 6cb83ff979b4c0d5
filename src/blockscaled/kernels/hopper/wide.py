"""The sm_90a (Hopper) "wide" fp8_block GEMM kernel in Gluon (kernel bodies only; host logic in
``blockscaled.ops._hopper``).

``fp8_block_gemm_wide_kernel``: persistent + warp-specialised (a 1-warp TMA producer, one math
partition per 64-row warpgroup), 128 x 256 tile as two 128-column halves, TMA-store epilogue;
dense, grouped contiguous and masked (MODE), and SwiGLU (DUAL: the halves are the gate and up
rows of the same 128 output columns); dense: fused deterministic split-K (SPLIT) of every tile
(few tiles) or of the tiles from ``split_from`` on (the last partial wave: "tail split", TAIL),
reduced by the last unit to arrive or spread over all of a tile's units (SPREAD). Operands,
numerics and tails as in ``_common.py``.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ._common import (
    B_SCALE_ROWS,
    _issue_load,
    _launch_metadata,
    _pin,
    _store_tile,
    _tile_coords,
    _warp_uniform,
    mma_layout_for,
)

# Spellings that differ between triton releases (TMA / cp.async loads and stores, the CTA
# barrier): one alias each, the same Gluon builtin as the release's own name (_compat.py).
from ._compat import cp_async_load, cta_barrier, tma_load, tma_store

__all__ = ["fp8_block_gemm_wide_kernel"]

# --------------------------------------------------------------------------------------------
# Persistent + warp-specialised, tile 128 x (NH * 128), TMA-store epilogue; the same kernel
# runs the grouped (MoE) GEMMs: contiguous (offsets) and masked (counts).
# --------------------------------------------------------------------------------------------
# Why: a 128x128 tile re-reads A and B from L2 for every 128x128 block of C: 32 KB per
# 4.2 MFLOP, i.e. 7.6 TB/s of L2->SM traffic at 1000 TFLOP/s, above what the H100's L2 delivers
# (the 128x128 kernels plateau at 700-870 TFLOP/s). A 128x256 tile moves 48 KB per 8.4 MFLOP
# (5.7 TB/s at 1000 TFLOP/s); measured 760-1141 TFLOP/s on the DeepSeek-V3 shapes at M=4096.
# The tile is computed as NH 128-column halves, each with its own fp32 accumulator and its own
# weight scale (one 128-row weight-scale block per half), sharing the A stage: registers per
# thread (8 math warps) = NH * 64 (acc) + 64 (wgmma part tile), i.e. 192 for NH=2, where a single
# 128x256 wgmma tile would need 256 (+ acc) and spill. Per K block and half: wgmma chain
# (4 x k32, from zero) -> wait -> promote; the two math warpgroups run independently.
# Epilogue (EPI): 1 = masked st.global after a layout conversion (any N / stride; grouped modes),
# 16-byte vectors per thread where the compiler can vectorise the output's stores (N and the row
# stride multiples of 16 elements); 0 = the same where it cannot: one output per thread, a warp
# writes 32 consecutive outputs (store_layout_for says why),
# 2 = registers -> NVMMA shared tile -> TMA store per half (needs a 16-byte aligned output base
# and row stride; the host checks), asynchronous so the store overlaps the next tile; one shared
# tile per half (128x256 bf16: 64 KB, which leaves room for only 3 ring stages);
# 3 = the same through one shared half tile per math partition, the halves stored one after the
# other (a store_wait between them: the first half's TMA store must have read the buffer before
# the second half overwrites it): 32 KB at 128x256 bf16, so a 4th ring stage fits.
#
# MODE 0 dense: A [M, K], B [N, K], C [M, N].
# MODE 1 contiguous grouped: A [M = sum_m, K] rows sorted by expert, ``seg`` int32 offsets [E+1];
#   B viewed as [E * N, K], weight scales as [E * ceil(N/128), nk], C [sum_m, N]. M tiles never
#   straddle experts: expert e owns ceil(m_e / 128) tiles (computed on the device from seg, no
#   host sync); the grid is sized for the worst case cdiv(sum_m, 128) + E tiles, and the
#   persistent loop walks only the tiles with rows (counted on the device, ``_grouped_plan``).
# MODE 2 masked grouped: A viewed as [E * max_m, K] (M = max_m), ``seg`` int32 counts [E]; C as
#   [E * max_m, N]; tiles are numbered densely over the counted rows (as MODE 1) and only those
#   are walked; rows past a count are not computed or written.
# Both grouped modes may tail-split (TAIL): the last partial wave's tiles in SPLIT K ranges, as
#   the dense tail split, decided on the device from the real tile count.
# In both grouped modes a tile's TMA boxes may read rows of the next expert (A) or past N (B):
# those rows/columns are masked at the store, so they never reach C.


@gluon.jit
def _add_i32(a, b):
    return a + b


@gluon.jit
def _segments(seg_ptr, M, E, MODE: gl.constexpr, E_POW2: gl.constexpr, BLOCK_M: gl.constexpr,
              layout: gl.constexpr):
    """Per-expert vectors [E_POW2] (grouped modes): (lo, hi, inclusive prefix sum of M tiles).
    Offsets are clamped to [0, M]: unvalidated bad offsets give wrong rows, never out-of-bounds."""
    gl.static_assert(MODE == 1 or MODE == 2, "per-expert segments exist in the grouped modes only")
    oe = gl.arange(0, E_POW2, layout=layout)
    if MODE == 1:
        lo = gl.minimum(gl.maximum(gl.load(seg_ptr + oe, mask=oe < E, other=0), 0), M)
        hi = gl.minimum(gl.maximum(gl.load(seg_ptr + oe + 1, mask=oe < E, other=0), 0), M)
        hi = gl.maximum(hi, lo)
        cum = gl.associative_scan((hi - lo + BLOCK_M - 1) // BLOCK_M, 0, _add_i32)
    else:
        # masked: expert e owns rows [e * max_m, e * max_m + count_e) of the 2-D view; its tiles
        # are numbered densely after the previous experts' (as in MODE 1), so the tiles past the
        # counts all come last instead of being spread over the persistent grid (with max_m=256
        # and 64 rows per expert the spread left some SMs two tiles and others none: 217 vs
        # 280 TFLOP/s measured)
        lo = oe * M
        hi = lo + gl.minimum(gl.maximum(gl.load(seg_ptr + oe, mask=oe < E, other=0), 0), M)
        cum = gl.associative_scan((hi - lo + BLOCK_M - 1) // BLOCK_M, 0, _add_i32)
    return oe, lo, hi, cum


@gluon.jit
def _grouped_plan(seg_ptr, M, E, num_pid_n, split_from, MODE: gl.constexpr, E_POW2: gl.constexpr,
                  BLOCK_M: gl.constexpr, SPLIT: gl.constexpr, TAIL: gl.constexpr, layout: gl.constexpr):
    """Grouped modes: (M tiles that hold rows, first split tile) from the per-expert counts on the
    device (no host sync). The tile space is then exactly the tiles with rows (the host's
    num_pid_m is only an upper bound, for the grid), so every tile id is valid. TAIL: the tiles
    of the last, partial wave of the persistent grid are split into SPLIT K ranges (as the dense
    tail split) where there is a full wave before it and the split units fit in one wave (the
    spread reduction needs all units of a tile resident; the host sized the workspace for
    num_programs // SPLIT split tiles); else none is split (split_from = all tiles). Without
    TAIL, ``split_from`` is returned as given. Every partition computes the same values."""
    oe, lo, hi, cum = _segments(seg_ptr, M, E, MODE, E_POW2, BLOCK_M, layout)
    tm = _warp_uniform(gl.max(cum, 0))  # inclusive prefix sum: its last entry is the total
    if TAIL:
        tiles = tm * num_pid_n
        nprog = gl.num_programs(0)
        full = (tiles // nprog) * nprog
        tail = tiles - full
        ok = (full > 0) & (tail > 0) & (tail * SPLIT <= nprog)
        split_from = gl.where(ok, full, tiles)
    return tm, split_from


# Registers of the 1-warp TMA producer of the wide kernel (setmaxnreg); the math warps get the rest
# (232-240). Giving the producer 56 spilled 68 B in the math warps (contiguous-grouped mode).
PRODUCER_REGS = gl.constexpr(40)
# Registers of the second math partition (SPLIT_WG). Triton gives the default partition what is
# left of 384 threads x 168: (64512 - 128 x 232 - 128 x 40) / 128 = 232 (setmaxnreg in the PTX),
# so both math warpgroups get 232.
MATH_REGS = gl.constexpr(232)


@gluon.jit
def _wide_tile(tile, seg_ptr, M, N, E, num_pid_m, num_pid_n, GROUP_M: gl.constexpr, MODE: gl.constexpr,
               E_POW2: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, seg_layout: gl.constexpr):
    """Tile -> (valid, first row of A/C, end row (exclusive) of the tile's expert, expert, off_n);
    the producer and the math partitions call it with the same arguments, so they agree.
    Grouped modes reload the per-expert vectors per tile (L1-resident) rather than once per
    program: vectors kept live across the K loop cost the math warps registers (36 B of spills).
    Dense: the tiles of the partial last column (N % BLOCK_N != 0) come after all full tiles, so
    the last wave of the persistent grid holds the cheap tiles (a partial tile with no second
    half skips that half's wgmma). 2112 = 8 x 256 + 64: 256 full + 32 partial tiles; grouped
    order gave some SMs three full tiles (3 tile-times), this order 2 full + 1 partial."""
    if MODE == 0:
        nfull = N // BLOCK_N
        full_tiles = num_pid_m * nfull
        pm, pn = _tile_coords(tile, num_pid_m, gl.maximum(nfull, 1), GROUP_M)
        tail = (tile >= full_tiles).to(gl.int32)
        pid_m = pm + (tile - full_tiles - pm) * tail
        pid_n = pn + (nfull - pn) * tail
    else:
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
    off_n = pid_n * BLOCK_N
    if MODE == 0:
        valid = pid_m >= 0
        row0 = pid_m * BLOCK_M
        row_end = M
        e = pid_m * 0
    else:  # MODE 1 and 2: dense tile numbering from the per-expert tile prefix sums
        oe, lo, hi, cum = _segments(seg_ptr, M, E, MODE, E_POW2, BLOCK_M, seg_layout)
        e = _warp_uniform(gl.sum((cum <= pid_m).to(gl.int32), 0))
        valid = e < E
        tile0 = gl.sum(gl.where(oe == e - 1, cum, 0), 0)  # tiles of experts before e
        row0 = _warp_uniform(gl.sum(gl.where(oe == e, lo, 0), 0) + (pid_m - tile0) * BLOCK_M)
        row_end = _warp_uniform(gl.sum(gl.where(oe == e, hi, 0), 0))
    return valid, row0, row_end, e, off_n


@gluon.jit
def _wide_units(num_tiles, split_from, SPLIT: gl.constexpr):
    """Work units of the persistent grid: tiles [0, split_from) whole, tiles [split_from,
    num_tiles) SPLIT K ranges each (``_wide_unit``)."""
    return split_from + (num_tiles - split_from) * SPLIT


@gluon.jit
def _wide_unit(u, num_k, kb_per_split, split_from, SPLIT: gl.constexpr):
    """Work unit -> (tile, split, first K block, end K block (exclusive), split unit?).
    Units [0, split_from) are the whole tiles 0..split_from-1 (no split). From split_from on,
    order is tile-major over the remaining tiles: u = split_from + (tile - split_from) * SPLIT +
    split. ``split_from`` = 0: every tile split (few tiles, small M); = the tiles of the full
    waves: only the last, partial wave's tiles are split ("tail split", large M), so that wave
    takes about 1/SPLIT of a tile-time instead of a whole one.
    Tile-major: the persistent grid hands consecutive units to consecutive programs, so the SPLIT
    units of a tile run side by side in the same wave: the last of them (the one that reduces)
    finishes shortly after the others instead of a wave later, the partials it reads back were
    written moments before (still in L2), and only about one wave's worth of tiles has partials
    live in the workspace. (Split-major order, u = split * tiles + tile, puts a tile's splits
    ``tiles`` units apart: in different waves once units > programs.) With the last-arriver
    reduction any order is correct (no unit waits for another). The spread reduction (SPREAD)
    needs this order: a unit waits only for the other units of its tile, which belong to other
    programs (SPLIT <= programs, checked by the launcher) that reach them after lower tiles
    only, so the lowest unfinished tile always has all its units running (every program must
    get an SM: HopperConfig.split_reduce). The producer and the math
    partitions call this with the same arguments, so they walk the same K blocks (the ring
    phase ``it`` depends on it). SPLIT == 1: the whole K range of tile u."""
    if SPLIT == 1:
        tile = u
        sp = u * 0
        kb_lo = u * 0
        kb_hi = num_k
        is_split = u < 0
    else:
        is_split = u >= split_from
        sel = is_split.to(gl.int32)
        v = gl.maximum(u - split_from, 0)
        tile = u + (split_from + v // SPLIT - u) * sel
        sp = (v % SPLIT) * sel
        kb_lo = sp * kb_per_split
        kb_hi = num_k + (gl.minimum(kb_lo + kb_per_split, num_k) - num_k) * sel
    return tile, sp, kb_lo, kb_hi, is_split


# cp.async arrivals per ring slot with SA_SMEM: one per thread of the 1-warp producer
SA_ARRIVALS = gl.constexpr(32)


@gluon.jit
def _stage_a_scales(dst, bar, src, ok):
    """Copy the tile's A scales of one K block (``src``: one pointer per tile row; rows with ``ok``
    False, past M or the expert's last row, get 0) into the ring slot's ``dst`` [BLOCK_M] fp32 with
    cp.async, and make the slot's ``ready`` barrier wait for them: each of the producer warp's 32
    threads arrives (.noinc) once its copies have landed, so the barrier counts 1 + 32 arrivals
    (``SA_ARRIVALS``). (Without .noinc the arrive-on adds a pending arrival of its own: also
    correct, but compute-sanitizer's synccheck reported it as a barrier overflow.)
    Why (benchmarks/NOTES.md 2026-11-23, "A scales through shared memory"): the math warps loaded
    these with ld.global one K block ahead, 64 scattered 4-byte reads per warpgroup and K block
    (canonical row-major [M, sk] scales: rows sk * 4 bytes apart) on the chain that feeds the next
    wgmma. A one-tile probe put the K block of a 128x256 tile at 686 ns with the scale loads and 608
    ns with constants in their place. The producer issues the copies STAGES blocks ahead instead and
    the math warps read 2 floats per thread from shared memory. Measured gains are in the kernel's
    ``SA_SMEM`` comment (128-column tiles only)."""
    cp_async_load(dst, src, mask=ok)
    async_copy.mbarrier_arrive(bar, increment_count=False)


@gluon.jit
def _wide_producer(a_desc, b_desc, b2_desc, a_bufs, b_bufs, sa_bufs, ready, empty, sa_ptr, seg_ptr, M, N, K, E,
                   num_pid_m, kb_per_split, split_from, stride_sam, stride_sak, GROUP_M: gl.constexpr,
                   STAGES: gl.constexpr, MODE: gl.constexpr, E_POW2: gl.constexpr, DUAL: gl.constexpr,
                   SPLIT: gl.constexpr, SA_SMEM: gl.constexpr):
    """TMA producer (1 warp) of the wide kernel: per K block of each unit, the A and B boxes (TMA)
    and, with SA_SMEM, the tile's A scales (``_stage_a_scales``) into ring slot ``it % STAGES``,
    all tracked by that slot's ``ready`` barrier."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BOX_N: gl.constexpr = b_desc.block_type.shape[0]
    TILE_N: gl.constexpr = BOX_N  # output columns per tile (DUAL: the gate and the up box share them)
    seg_layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    sa_layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    num_pid_n = gl.cdiv(N, TILE_N)
    num_k = gl.cdiv(K, BLOCK_K)
    if MODE != 0:
        num_pid_m, split_from = _grouped_plan(seg_ptr, M, E, num_pid_n, split_from, MODE, E_POW2, BLOCK_M, SPLIT,
                                              SPLIT > 1, seg_layout)
    it = 0
    for u in range(pid, _wide_units(num_pid_m * num_pid_n, split_from, SPLIT), nprog):
        tile, sp, kb_lo, kb_hi, is_split = _wide_unit(u, num_k, kb_per_split, split_from, SPLIT)
        valid, row0, row_end, e, off_n = _wide_tile(tile, seg_ptr, M, N, E, num_pid_m, num_pid_n, GROUP_M, MODE,
                                                    E_POW2, BLOCK_M, TILE_N, seg_layout)
        if valid:
            b_row = e * N + off_n
            if SA_SMEM:
                sa_rows = row0 + gl.arange(0, BLOCK_M, layout=sa_layout)
                sa_src = sa_ptr + sa_rows.to(gl.int64) * stride_sam
                sa_ok = sa_rows < row_end
            for kb in range(kb_lo, kb_hi):
                s = it % STAGES
                # Slot s is free once the consumer released use (it // STAGES) - 1; the first pass is free.
                mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1, pred=it >= STAGES)
                if SA_SMEM:
                    _stage_a_scales(sa_bufs.index(s), ready.index(s), sa_src + kb * stride_sak, sa_ok)
                if DUAL:
                    # gate rows -> the slot's first BOX_N rows, up rows -> the next BOX_N
                    bar = ready.index(s)
                    b_s = b_bufs.index(s)
                    mbarrier.expect(bar, a_desc.block_type.nbytes + 2 * b_desc.block_type.nbytes)
                    tma_load(a_desc, [row0, kb * BLOCK_K], bar, a_bufs.index(s))
                    tma_load(b_desc, [b_row, kb * BLOCK_K], bar, b_s.slice(0, BOX_N, dim=0))
                    tma_load(b2_desc, [b_row, kb * BLOCK_K], bar, b_s.slice(BOX_N, BOX_N, dim=0))
                else:
                    _issue_load(a_desc, b_desc, a_bufs, b_bufs, ready, s, row0, b_row, kb * BLOCK_K, True)
                it += 1


@gluon.constexpr_function
def c_buffer(wg, h, nout, epi):
    """Shared output tile of half ``h`` of math partition ``wg`` (``nout`` output halves per
    partition): one per half with EPI 2, one per partition with EPI 3."""
    return wg if epi == 3 else wg * nout + h


@gluon.constexpr_function
def masked_vec(epi):
    """Outputs per thread of the masked store: 8 (16-byte vectors) for EPI 1, 1 for EPI 0."""
    return 8 if epi == 1 else 1


@gluon.constexpr_function
def spread_vec(epi):
    """Outputs per thread of the spread split-K reduction: 4 (16-byte partial loads), 1 for EPI 0."""
    return 1 if epi == 0 else 4


@gluon.jit
def _wide_store_half(c_desc, c_smem, c_ptr, acc, row0, row_end, off_n, N, stride_cm, idx: gl.constexpr,
                     EPI: gl.constexpr, ROWS: gl.constexpr, HALF: gl.constexpr, num_warps: gl.constexpr):
    """Store one ROWS x HALF output half tile: TMA through shared tile ``idx`` (EPI 2 / 3; EPI 3
    first waits until this thread's earlier TMA stores have read their buffer: one buffer per
    partition) or masked st.global (EPI 1: 16-byte vectors; EPI 0: one output per thread)."""
    if EPI >= 2:
        if EPI == 3:
            tma.store_wait(0)
        buf = c_smem.index(idx)
        buf.store(acc.to(c_desc.dtype))
        fence_async_shared()
        tma_store(c_desc, [row0, off_n], buf)
    else:
        _store_tile(c_ptr, acc, row0, off_n, row_end, N, stride_cm, ROWS, HALF, num_warps, masked_vec(EPI))


@gluon.jit
def _wide_store_tile(c_desc, c_smem, c_ptr, acc0, acc1, row0, row_end, off_n, N, stride_cm, NH: gl.constexpr,
                     EPI: gl.constexpr, WG: gl.constexpr, ROWS: gl.constexpr, HALF: gl.constexpr,
                     num_warps: gl.constexpr):
    """The plain epilogue of one math partition: its NH half tiles (acc1 unused when NH == 1)."""
    if EPI == 2:
        tma.store_wait(0)  # the previous tile's TMA stores have finished reading c_smem
    _wide_store_half(c_desc, c_smem, c_ptr, acc0, row0, row_end, off_n, N, stride_cm, c_buffer(WG, 0, NH, EPI), EPI,
                     ROWS, HALF, num_warps)
    if NH == 2:
        _wide_store_half(c_desc, c_smem, c_ptr, acc1, row0, row_end, off_n + HALF, N, stride_cm,
                         c_buffer(WG, 1, NH, EPI), EPI, ROWS, HALF, num_warps)


@gluon.jit
def _wide_splitk_sum(row_ptrs, c, mask, split_stride, SPLIT: gl.constexpr):
    """Sum of the SPLIT fp32 partials of one half tile (``row_ptrs``: the split-0 partial's
    address of each of the partition's rows at the half's first column; ``c``: column offsets
    within the half), in the fixed order s = 0..SPLIT-1, every partial read back from the
    workspace (the caller's own included: the same fp32 bits it stored; its registers are free
    for the sum) -> bitwise the same result whichever split finished last. Plain loads: the
    arrival's acq_rel atomic invalidated this SM's L1 and the broadcast of its result orders the
    other threads' loads after it (stream._splitk_sum_store; ``.cg``, strong GPU-scope loads in the
    SASS, made the tiled kernels' sum 1.27x slower, thirty-eighth session)."""
    tot = gl.load(row_ptrs[:, None] + c[None, :], mask=mask, other=0.0)
    # One partial per loop trip. Two per trip (both loads issued before the adds, as the
    # portable kernel's reduction does) spilled 160-192 B in the math partitions (232 registers:
    # 2 x 64 loaded + 64 running sum; ptxas sm_90, 128x256 fp32 / 128x128 bf16 split configs).
    for s in range(1, SPLIT):
        tot += gl.load((row_ptrs + s * split_stride)[:, None] + c[None, :], mask=mask, other=0.0)
    return tot


@gluon.jit
def _wide_splitk_spread(c_ptr, ws_ptr, cnt, row0, row_end, off_n, N, stride_cm, sp, arrived, SPLIT: gl.constexpr,
                        ROWS: gl.constexpr, W: gl.constexpr, UNIT: gl.constexpr, num_warps: gl.constexpr,
                        VEC: gl.constexpr = 4):
    """Spread reduction of one (split tile, math partition) after this unit's partial is stored
    and its arrival counted (``arrived``: the counter's value before it): wait until all SPLIT
    partials have arrived (a gpu-scope acquire poll of the counter), then reduce only this
    unit's share of the partition's ROWS x W region: chunks j = sp, sp + SPLIT, ... of CHUNK
    consecutive fp32 (row-major, 4 per thread: 16-byte loads), each the sum of the SPLIT partials
    in the fixed order 0..SPLIT-1 (bitwise the same as the last-arriver reduction), stored to C
    (masked to rows < row_end, columns < N). Each unit reads about one partial's worth of bytes instead of the last
    one reading all SPLIT (that serial read-back at one SM's L2 bandwidth was the split unit's
    cost). Then a second count (departure); the unit that sees 2 * SPLIT - 1 before its own
    resets the counter to 0: every unit has left the wait by then.
    Forward progress: a unit waits only for the other units of its own tile, which the
    persistent walk (``_wide_unit``, tile-major) gives to SPLIT different programs; each of
    them reaches that unit after finishing units of lower tiles only, so the lowest unfinished
    tile always has all its units running. This needs every program of the grid resident at
    once (grid <= SMs, one CTA per SM: the launcher's persistent grid; ``SPLIT <= grid``)."""
    # VEC 4: 16-byte partial loads; VEC 1 where the output rows are not 16-byte aligned (EPI 0): the
    # stores cannot be vectorised there, and with 4 outputs per thread each store instruction would
    # write 2 of every 8 bytes (store_layout_for says what that cost the whole-tile store). The
    # chunk stays 4 x 32 outputs per warp either way (VEC 1: 4 scalar loads per partial and thread,
    # each a warp's 128 contiguous bytes): 32 x 1 per warp made 4x the latency-bound chunk trips
    # and ran slower than 4 per thread (H200, 3125 x 3071 x 1472 tail split 3: 62.9 us against
    # 56.8, the unsplit tile 41.6)
    red_layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [num_warps], [0])
    CHUNK: gl.constexpr = 4 * 32 * num_warps
    NCHUNK: gl.constexpr = ROWS * W // CHUNK
    gl.static_assert(NCHUNK * CHUNK == ROWS * W, "the partition's region is a whole number of chunks")
    seen = arrived + 1
    while seen < SPLIT:
        seen = gl.atomic_add(cnt, 0, sem="acquire", scope="gpu")
    idx = gl.arange(0, CHUNK, layout=red_layout)
    rows_left = row_end - row0
    cols_left = N - off_n
    for j in range(sp, NCHUNK, SPLIT):
        e = j * CHUNK + idx
        r = e // W
        c = e % W
        mask = (r < rows_left) & (c < cols_left)
        src = ws_ptr + e
        tot = gl.load(src, mask=mask, other=0.0)  # plain: the acquire poll invalidated L1 (_wide_splitk_sum)
        for s in gl.static_range(1, SPLIT):
            tot += gl.load(src + s * UNIT, mask=mask, other=0.0)
        dst = c_ptr + (row0 + r).to(gl.int64) * stride_cm + (off_n + c)
        gl.store(dst, tot.to(c_ptr.dtype.element_ty), mask=mask)
    left = gl.atomic_add(cnt, 1, sem="relaxed", scope="gpu")
    if left == 2 * SPLIT - 1:
        gl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")


@gluon.jit
def _wide_splitk_finish(c_desc, c_smem, c_ptr, ws_ptr, cnt_ptr, acc0, acc1, stile, sp, row0, row_end, off_n, N, stride_cm,
                        SPLIT: gl.constexpr, NH: gl.constexpr, EPI: gl.constexpr, WG: gl.constexpr,
                        NCONS: gl.constexpr, ROWS: gl.constexpr, HALF: gl.constexpr, mma_layout: gl.constexpr,
                        num_warps: gl.constexpr, SPREAD: gl.constexpr = False):
    """Fused split-K of one (tile, math partition) unit (the portable kernel's protocol,
    kernels/triton/gemm.py): store this split's fp32 partials (rows [row0, row0 + ROWS), the
    tile's NH halves; masked to rows < ``row_end`` (M dense, the expert's last row + 1 grouped)
    and columns < N) to ``ws[stile, sp]`` (fp32 [split tiles, SPLIT, NCONS *
    ROWS, NH * HALF] contiguous: one tile-shaped slot per unit, ``stile`` = the tile's index
    among the split tiles, so the workspace holds only the split tiles' partials: a [SPLIT, M, N]
    one would be 173 MB for a tail split at M=4096); partition barrier (every thread's stores
    happen-before the release below); one gpu-scope acq_rel atomic on the (split tile,
    partition) counter ``cnt[stile * NCONS + WG]``. The unit that sees
    SPLIT - 1 arrivals before its own is the last: all partials are visible to it (acquire; the
    broadcast of the atomic's result orders its other threads after it); it sums them in fixed
    order (``_wide_splitk_sum``, one 128-column half at a time: two half tiles live at most),
    runs the normal epilogue and resets the counter to 0, so the buffer is all zeros again for
    the next launch or CUDA-graph replay. The others skip the epilogue.
    SPREAD (HopperConfig.split_reduce="spread", the default): instead of the last unit reading
    every partial back (SPLIT x the tile through one SM's L2 port: the split unit's main cost,
    benchmarks/NOTES.md 2026-11-22, "Where a split unit's time goes"), every unit waits for all
    SPLIT arrivals and sums its 1/SPLIT share of the partition's region in the same order
    (``_wide_splitk_spread``).
    Addresses: one int64 pointer per row (2 per thread in the wgmma layout) + the int32 column
    offsets, which LLVM folds into the loads'/stores' immediate offsets. A [ROWS, HALF] offset
    tensor (``r * W + c``) is loop-invariant: LLVM hoisted its 64 int64 values out of the
    persistent loop, live through the K loop (2876 B of spills)."""
    W: gl.constexpr = NH * HALF  # workspace row length: the tile's columns
    UNIT: gl.constexpr = NCONS * ROWS * W  # elements of one unit's partial tile
    r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma_layout))
    c = gl.arange(0, HALF, layout=gl.SliceLayout(0, mma_layout))
    row_ok = (r < row_end - row0)[:, None]
    mask0 = row_ok & (c < N - off_n)[None, :]
    # ws[stile, 0, WG * ROWS + r, 0]
    rows0 = ws_ptr + stile.to(gl.int64) * (SPLIT * UNIT) + ((WG * ROWS) + r) * W
    own = rows0 + sp * UNIT
    gl.store(own[:, None] + c[None, :], acc0, mask=mask0)
    if NH == 2:
        mask1 = row_ok & (c < N - off_n - HALF)[None, :]
        gl.store((own + HALF)[:, None] + c[None, :], acc1, mask=mask1)
    cta_barrier()
    cnt = cnt_ptr + stile * NCONS + WG
    arrived = gl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
    if SPREAD:
        # (the partition's region is recomputed here: kept from rows0 above, the 64-bit base stayed
        # live across the partial stores and the 128x256 split build spilled 16 B, ptxas sm_90)
        _wide_splitk_spread(c_ptr, ws_ptr + stile.to(gl.int64) * (SPLIT * UNIT) + WG * ROWS * W, cnt, row0, row_end,
                            off_n, N, stride_cm, sp, arrived, SPLIT, ROWS, W, UNIT, num_warps, spread_vec(EPI))
    elif arrived == SPLIT - 1:
        if EPI == 2:
            tma.store_wait(0)  # the previous tile's TMA stores have finished reading c_smem
        tot = _wide_splitk_sum(rows0, c, mask0, UNIT, SPLIT)
        _wide_store_half(c_desc, c_smem, c_ptr, tot, row0, row_end, off_n, N, stride_cm, c_buffer(WG, 0, NH, EPI), EPI,
                         ROWS, HALF, num_warps)
        if NH == 2:
            tot = _wide_splitk_sum(rows0 + HALF, c, mask1, UNIT, SPLIT)
            _wide_store_half(c_desc, c_smem, c_ptr, tot, row0, row_end, off_n + HALF, N, stride_cm,
                             c_buffer(WG, 1, NH, EPI), EPI, ROWS, HALF, num_warps)
        # leave the counter buffer all zeros for the next launch / graph replay
        gl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")


@gluon.jit
def _mma_sub(a_s, b_s, part, acc, s, j: gl.constexpr, SUBK: gl.constexpr):
    """K slice ``j`` (SUBK wide) of one ring slot (ASUB > 1): a wgmma from zero, its wait, and the
    promotion with that slice's combined scale ``s`` [rows] (A scale x B scale). Returns (wgmma
    destination, new accumulator). The slice of the 128-byte-swizzled K-major tiles is a start
    address offset of the wgmma descriptors (the k32 steps of one 128-wide wgmma chain)."""
    a_j = a_s.slice(j * SUBK, SUBK, dim=1)
    b_j = b_s.slice(j * SUBK, SUBK, dim=1)
    part = warpgroup_mma(a_j, b_j.permute((1, 0)), part, use_acc=False, is_async=True)
    part, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(part, a_j, b_j))
    return part, _pin(acc + part * s[:, None])


@gluon.jit
def _mma_block(a_s, b_s, part, acc, sa0, sa1, sa2, sa3, sb, uni, SUBK: gl.constexpr):
    """One ring slot's K block with per-SUBK A scales ``sa0..sa3`` [rows] (ASUB 4) and the weight
    scale ``sb``: ``uni`` (the rows' four scales are equal, the activation encoder's uniform
    rows): one 128-wide wgmma chain, one promotion; else four K slices, each promoted with its
    own scale (``_mma_sub``)."""
    if uni:
        part = warpgroup_mma(a_s, b_s.permute((1, 0)), part, use_acc=False, is_async=True)
        part, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(part, a_s, b_s))
        acc = _pin(acc + part * (sa0 * sb)[:, None])
    else:
        part, acc = _mma_sub(a_s, b_s, part, acc, sa0 * sb, 0, SUBK)
        part, acc = _mma_sub(a_s, b_s, part, acc, sa1 * sb, 1, SUBK)
        part, acc = _mma_sub(a_s, b_s, part, acc, sa2 * sb, 2, SUBK)
        part, acc = _mma_sub(a_s, b_s, part, acc, sa3 * sb, 3, SUBK)
    return part, acc


@gluon.jit
def _wide_consumer(a_desc, b_desc, c_desc, a_bufs, b_bufs, sa_bufs, c_smem, ready, empty, sa_ptr, sb_ptr, sb2_ptr,
                   c_ptr, seg_ptr, ws_ptr, cnt_ptr, M, N, K, E, num_pid_m, kb_per_split, split_from, stride_sam,
                   stride_sak, stride_sbe, stride_sbn, stride_sbk, stride_cm, GROUP_M: gl.constexpr,
                   STAGES: gl.constexpr,
                   NH: gl.constexpr, EPI: gl.constexpr, MODE: gl.constexpr, E_POW2: gl.constexpr,
                   DUAL: gl.constexpr, SPLIT: gl.constexpr, TAIL: gl.constexpr, SPREAD: gl.constexpr,
                   WG: gl.constexpr, ROWS: gl.constexpr, SA_SMEM: gl.constexpr, num_warps: gl.constexpr,
                   ASUB: gl.constexpr = 1, aflag_ptr=None):
    """Math partition: rows [WG * ROWS, (WG + 1) * ROWS) of each 128-row tile (ROWS = BLOCK_M when
    one partition does all rows). With two 4-warp partitions (one per warpgroup) each releases
    its ring slots itself (empty barriers count 2), so nothing synchronises the two warpgroups:
    a barrier across both (the single 8-warp partition has one per K block, before its arrive)
    makes them promote at the same time while the tensor cores idle.
    DUAL (SwiGLU): half 0 of the ring slot holds gate rows, half 1 the up rows of the same 128
    output columns; the epilogue stores ``silu(acc0) * acc1`` (fp32) for those columns.
    SPLIT > 1 (dense only): a unit is one K range of a tile; the partition's partials go to the
    workspace and the last of the SPLIT units of (tile, WG) to finish reduces and stores them,
    or with SPREAD every unit waits for the others and stores its share (``_wide_splitk_finish``)."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BOX_N: gl.constexpr = b_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = 2 * BOX_N if DUAL else BOX_N  # rows of a B ring slot
    TILE_N: gl.constexpr = BOX_N  # output columns per tile
    HALF: gl.constexpr = BLOCK_N // NH
    gl.static_assert(HALF == B_SCALE_ROWS, "each half spans exactly one 128-row weight-scale block")
    gl.static_assert(NH == 2 or not DUAL, "DUAL: one half for gate, one for up")
    gl.static_assert(ASUB == 1 or (ASUB == 4 and not SA_SMEM), "ASUB: 1 or 4 A-scale K slices, loaded by the math warps")
    SUBK: gl.constexpr = BLOCK_K // ASUB
    mma_layout: gl.constexpr = mma_layout_for(ROWS, HALF, num_warps)
    seg_layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    num_pid_n = gl.cdiv(N, TILE_N)
    num_k = gl.cdiv(K, BLOCK_K)
    if MODE != 0:
        num_pid_m, split_from = _grouped_plan(seg_ptr, M, E, num_pid_n, split_from, MODE, E_POW2, BLOCK_M, SPLIT,
                                              TAIL, seg_layout)
    it = 0
    for u in range(pid, _wide_units(num_pid_m * num_pid_n, split_from, SPLIT), nprog):
        tile, sp, kb_lo, kb_hi, is_split = _wide_unit(u, num_k, kb_per_split, split_from, SPLIT)
        valid, row0, row_end, e, off_n = _wide_tile(tile, seg_ptr, M, N, E, num_pid_m, num_pid_n, GROUP_M, MODE,
                                                    E_POW2, BLOCK_M, TILE_N, seg_layout)
        if valid:
            my_row0 = row0 + WG * ROWS
            sb_off = e.to(gl.int64) * stride_sbe + (off_n // B_SCALE_ROWS) * stride_sbn
            sb_row = sb_ptr + sb_off
            acc0 = gl.zeros((ROWS, HALF), dtype=gl.float32, layout=mma_layout)
            # wgmma destination, carried through the K loop so use_acc=False reuses its registers;
            # created per tile so it is dead during the epilogue.
            part = gl.zeros((ROWS, HALF), dtype=gl.float32, layout=mma_layout)
            if NH == 2:
                acc1 = gl.zeros((ROWS, HALF), dtype=gl.float32, layout=mma_layout)
                if DUAL:
                    has1 = off_n < N  # the up half covers the gate half's columns: always computed
                    sb1_row = sb2_ptr + sb_off
                else:
                    has1 = off_n + HALF < N
                    sb1_row = sb_row + stride_sbn
            # SA_SMEM: the A scales of each K block come with the ring slot (the producer's
            # cp.async, ``_stage_a_scales``). Else they and the first half's weight scale are
            # loaded one K block ahead: the loads for block kb + 1 are issued while block kb is
            # multiplied, so the promotion never waits for them. Loaded in the same iteration
            # (the earlier version) they were still in flight at the combined-scale multiply, which
            # ptxas places between the wgmma issues: 5.6% of the warp samples were long-scoreboard
            # stalls there (ncu, M=4096 4096x7168), holding back the rest of the wgmma chain.
            # (Index clamped into [0, num_k): an empty K range must not read past the scales.)
            # The second half's weight scale stays a same-iteration load (consumed a whole wgmma
            # chain later): prefetched, ptxas carried it across the loop in a uniform register
            # and put its R2UR right after the first wgmma of the chain, stalling on the load
            # there (3.5% of the samples, ncu M=4096 7168x16384); this way the chain issues back
            # to back (SASS) and M=4096 measured 0.99-1.09x (7168x16384) against that version.
            kb_first = gl.minimum(kb_lo, num_k - 1)
            if not SA_SMEM:
                rows = my_row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma_layout))
                row_ok = rows < row_end
                sa_rows = sa_ptr + rows.to(gl.int64) * stride_sam
                sa_next = gl.load(sa_rows + kb_first * ASUB * stride_sak, mask=row_ok, other=0.0)
                if ASUB > 1:  # the other K slices' A scales (columns kb * ASUB + j of [M, K / SUBK])
                    sa1_next = gl.load(sa_rows + (kb_first * ASUB + 1) * stride_sak, mask=row_ok, other=0.0)
                    sa2_next = gl.load(sa_rows + (kb_first * ASUB + 2) * stride_sak, mask=row_ok, other=0.0)
                    sa3_next = gl.load(sa_rows + (kb_first * ASUB + 3) * stride_sak, mask=row_ok, other=0.0)
            if ASUB > 1:
                # uniform: none of this partition's rows has a 128-K block whose ASUB scales differ
                # (``aflag`` 0 per row: the encoder wrote every block of the row with one scale,
                # repeated ASUB times), so each K block takes one 128-wide wgmma chain and one
                # promotion, the fp8_block rate; else every K slice is promoted on its own
                uni = gl.max(gl.load(aflag_ptr + rows, mask=row_ok, other=0), 0) == 0
            sb0_next = gl.load(sb_row + kb_first * stride_sbk)
            for kb in range(kb_lo, kb_hi):
                s = it % STAGES
                if not SA_SMEM:
                    sa = sa_next
                    if ASUB > 1:
                        sa1 = sa1_next
                        sa2 = sa2_next
                        sa3 = sa3_next
                sb0 = sb0_next
                kb_next = gl.minimum(kb + 1, num_k - 1)
                if not SA_SMEM:
                    sa_next = gl.load(sa_rows + kb_next * ASUB * stride_sak, mask=row_ok, other=0.0)
                    if ASUB > 1:
                        sa1_next = gl.load(sa_rows + (kb_next * ASUB + 1) * stride_sak, mask=row_ok, other=0.0)
                        sa2_next = gl.load(sa_rows + (kb_next * ASUB + 2) * stride_sak, mask=row_ok, other=0.0)
                        sa3_next = gl.load(sa_rows + (kb_next * ASUB + 3) * stride_sak, mask=row_ok, other=0.0)
                sb0_next = gl.load(sb_row + kb_next * stride_sbk)
                if NH == 2:
                    sb1 = gl.load(sb1_row + kb * stride_sbk, mask=has1, other=0.0)
                mbarrier.wait(ready.index(s), (it // STAGES) & 1)
                if SA_SMEM:
                    sa = sa_bufs.index(s).slice(WG * ROWS, ROWS).load(gl.SliceLayout(1, mma_layout))
                if ROWS == BLOCK_M:
                    a_s = a_bufs.index(s)
                else:
                    a_s = a_bufs.index(s).slice(WG * ROWS, ROWS, dim=0)
                b_s = b_bufs.index(s)
                if ASUB > 1:
                    # per-SUBK A scales (MX activations)
                    b0 = b_s.slice(0, HALF, dim=0)
                    part, acc0 = _mma_block(a_s, b0, part, acc0, sa, sa1, sa2, sa3, sb0, uni, SUBK)
                    if NH == 2:
                        if has1:
                            b1 = b_s.slice(HALF, HALF, dim=0)
                            part, acc1 = _mma_block(a_s, b1, part, acc1, sa, sa1, sa2, sa3, sb1, uni, SUBK)
                    mbarrier.arrive(empty.index(s), count=1)
                elif NH == 2:
                    b0 = b_s.slice(0, HALF, dim=0)
                    part = warpgroup_mma(a_s, b0.permute((1, 0)), part, use_acc=False, is_async=True)
                    part, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(part, a_s, b0))
                    acc0 = _pin(acc0 + part * (sa * sb0)[:, None])
                    if has1:
                        b1 = b_s.slice(HALF, HALF, dim=0)
                        part = warpgroup_mma(a_s, b1.permute((1, 0)), part, use_acc=False, is_async=True)
                        part, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(part, a_s, b1))
                        mbarrier.arrive(empty.index(s), count=1)
                        acc1 = acc1 + part * (sa * sb1)[:, None]
                    else:  # the tile's second half lies beyond N: nothing to compute
                        mbarrier.arrive(empty.index(s), count=1)
                else:
                    part = warpgroup_mma(a_s, b_s.permute((1, 0)), part, use_acc=False, is_async=True)
                    part, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(part, a_s, b_s))
                    if SA_SMEM:
                        # every warp's read of the slot's A scales happens-before the release
                        # below, which one elected thread performs (the producer's next cp.async
                        # into the slot waits on it); compute-sanitizer's racecheck still reports
                        # the ring, as it does a minimal correct one (scripts/probes/ws_racecheck_probe.py
                        # probe4)
                        cta_barrier()
                    mbarrier.arrive(empty.index(s), count=1)
                    acc0 = acc0 + part * (sa * sb0)[:, None]
                it += 1
            if NH == 1:
                acc1 = acc0  # unused
            if SPLIT > 1 and not TAIL:  # every unit is a split unit
                _wide_splitk_finish(c_desc, c_smem, c_ptr, ws_ptr, cnt_ptr, acc0, acc1, tile - split_from, sp,
                                    my_row0, row_end, off_n, N, stride_cm, SPLIT, NH, EPI, WG, BLOCK_M // ROWS, ROWS,
                                    HALF, mma_layout, num_warps, SPREAD)
            elif SPLIT > 1:  # tail split: whole tiles before split_from, split units after
                if is_split:
                    _wide_splitk_finish(c_desc, c_smem, c_ptr, ws_ptr, cnt_ptr, acc0, acc1, tile - split_from, sp,
                                        my_row0, row_end, off_n, N, stride_cm, SPLIT, NH, EPI, WG, BLOCK_M // ROWS,
                                        ROWS, HALF, mma_layout, num_warps, SPREAD)
                else:
                    _wide_store_tile(c_desc, c_smem, c_ptr, acc0, acc1, my_row0, row_end, off_n, N, stride_cm, NH,
                                     EPI, WG, ROWS, HALF, num_warps)
            elif DUAL:
                if EPI == 2:
                    tma.store_wait(0)  # the previous tile's TMA stores have finished reading c_smem
                # silu(g) * u in fp32 (the portable kernel's formula), one cast at the store
                y = acc0 / (1.0 + gl.exp(-acc0)) * acc1
                _wide_store_half(c_desc, c_smem, c_ptr, y, my_row0, row_end, off_n, N, stride_cm,
                                 c_buffer(WG, 0, 1, EPI), EPI, ROWS, HALF, num_warps)
            else:
                _wide_store_tile(c_desc, c_smem, c_ptr, acc0, acc1, my_row0, row_end, off_n, N, stride_cm, NH, EPI,
                                 WG, ROWS, HALF, num_warps)
    if EPI >= 2:
        tma.store_wait(0)


# num_pid_m and split_from follow the token count M: left to Triton's integer specialisation
# (== 1, % 16 == 0) they compile new variants inside one plan's M range, which bs.warmup cannot
# foresee (H200, scripts/sweeps/compile_time.py --warmup: 9 cubins built after warm-up at
# M = 128 / 4096, 1-3 s each). The kernel uses them only as loop bounds and tile counts.
@gluon.jit(launch_metadata=_launch_metadata, do_not_specialize=["num_pid_m", "split_from"])
def fp8_block_gemm_wide_kernel(a_desc, b_desc, b2_desc, c_desc, sa_ptr, sb_ptr, sb2_ptr, c_ptr, seg_ptr, ws_ptr,
                               cnt_ptr, M, N, K, E, num_pid_m, kb_per_split, split_from, stride_sam, stride_sak,
                               stride_sbe, stride_sbn, stride_sbk, stride_cm, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                               NH: gl.constexpr, EPI: gl.constexpr, MODE: gl.constexpr, E_POW2: gl.constexpr,
                               SPLIT_WG: gl.constexpr, DUAL: gl.constexpr, SPLIT: gl.constexpr,
                               num_warps: gl.constexpr, TAIL: gl.constexpr = False,
                               SPREAD: gl.constexpr = False, ASUB: gl.constexpr = 1, aflag_ptr=None):
    """Dense (MODE 0) or grouped (MODE 1 contiguous, 2 masked) fp8_block GEMM; see above.
    ``num_pid_m``: M tiles of the tile space (dense cdiv(M, 128); grouped: unused by the kernel,
    which counts the tiles with rows on the device, ``_grouped_plan``; the host's bound sizes the
    grid: contiguous cdiv(sum_m, 128) + E, masked E * cdiv(max_m, 128)). SPLIT_WG (BLOCK_M = 128, num_warps = 4): one
    4-warp math partition per 64-row warpgroup instead of one 8-warp partition (num_warps = 8).
    c_desc block: [rows per math partition, 128].
    DUAL (SwiGLU, NH = 2): ``C = silu(A @ B.T) * (A @ B2.T)``; b_desc / b2_desc boxes [128, 128]
    (gate / up, same shape and strides, scales ``sb_ptr`` / ``sb2_ptr`` with the same strides),
    tiles BLOCK_M x 128 output columns, each K block one 256-row ring slot (gate | up).
    Not DUAL: b2_desc / sb2_ptr are unused (pass b_desc / sb_ptr).
    SPLIT (not DUAL; grouped modes with TAIL only): fused deterministic split-K over SPLIT K ranges of
    ``kb_per_split`` K blocks each (the host keeps every split non-empty, (SPLIT - 1) *
    kb_per_split < cdiv(K, 128), for efficiency: an empty split stores zeros and is still
    correct) for the tiles from ``split_from`` on; tiles before it run whole (``_wide_unit``:
    0 = every tile split, the small-M split-K; the full waves' tile count = tail split; grouped
    modes compute it on the device and ignore the argument).
    ``ws_ptr``: fp32 workspace [tiles - split_from, SPLIT, BLOCK_M, BLOCK_N] contiguous;
    ``cnt_ptr``: int32 [>= (tiles - split_from) * math partitions], all zeros on entry, left all
    zeros on exit (``_wide_splitk_finish``).
    SPREAD (SPLIT > 1): the spread reduction (``_wide_splitk_spread``): units wait for the other
    units of their tile, so every program must get an SM while others spin, and SPLIT <=
    programs (the launcher checks it; HopperConfig.split_reduce has the conditions).
    TAIL: split_from may be > 0 (tail split): the math partitions then also compile the whole-tile
    epilogue next to the split one (a runtime branch per unit). False: split_from must be 0 with
    SPLIT > 1 (every unit a split unit; the branch would cost registers for nothing).
    SPLIT == 1: ws_ptr, cnt_ptr, split_from and TAIL unused (pass any), today's code path."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = 2 * b_desc.block_type.shape[0] if DUAL else b_desc.block_type.shape[0]
    ROWS: gl.constexpr = BLOCK_M // 2 if SPLIT_WG else BLOCK_M
    NCONS: gl.constexpr = 2 if SPLIT_WG else 1
    NOUT: gl.constexpr = 1 if DUAL else NH  # output tiles of 128 columns per math partition
    gl.static_assert(BLOCK_K == 128, "BLOCK_K must equal the 128-wide fp8_block scale block")
    gl.static_assert(STAGES >= 2, "need at least 2 pipeline stages")
    gl.static_assert(NH == 1 or NH == 2, "NH: one or two 128-column halves")
    gl.static_assert(EPI == 0 or EPI == 1 or EPI == 2 or EPI == 3,
                     "EPI: 1 = masked store (0: rows not 16-byte aligned), 2 = TMA store (a buffer per half), "
                     "3 = TMA store (one per partition)")
    gl.static_assert(MODE == 0 or EPI <= 1, "grouped tiles may cover rows of the next expert: masked store only")
    gl.static_assert(ROWS == 16 * num_warps, "one warpgroup (4 warps) per 64 rows")
    gl.static_assert(SPLIT >= 1, "SPLIT: number of K splits, >= 1")
    gl.static_assert(SPLIT == 1 or not DUAL, "split-K: not SwiGLU")
    gl.static_assert(SPLIT == 1 or MODE == 0 or TAIL, "grouped modes split the tail only (TAIL)")
    gl.static_assert(not TAIL or SPLIT > 1, "TAIL: a tail split needs SPLIT > 1")

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    # A scales through shared memory (``_stage_a_scales``) for 128-column tiles: H100, 5 interleaved
    # rounds against the ld.global path (benchmarks/NOTES.md 2026-11-23, "A scales through
    # shared memory"): 64x128 tiles 1.03-1.08x (128x7168x7168 26.7 -> 24.8 us, 128x7168x16384
    # 52.3 -> 49.5, 256x4096x7168 22.4 -> 21.0), 128x128 tiles 1.01-1.04x even with one ring stage
    # less (6 -> 5: the 3 KB of scales do not fit next to 6), 128x256 tiles 0.97-1.01x (M=4096
    # DeepSeek-V3 shapes, grouped m=512): those keep the loads.
    SA_SMEM: gl.constexpr = NH == 1 and ASUB == 1
    if SA_SMEM:
        # the tile's fp32 A scales of each ring slot's K block
        sa_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    else:
        sa_bufs = a_bufs  # unused
    if EPI == 2:
        c_smem = gl.allocate_shared_memory(c_desc.dtype, [NCONS * NOUT, ROWS, BLOCK_N // NH], c_desc.layout)
    elif EPI == 3:
        c_smem = gl.allocate_shared_memory(c_desc.dtype, [NCONS, ROWS, BLOCK_N // NH], c_desc.layout)
    else:
        c_smem = a_bufs  # unused
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        # the expect's arrival, plus the scale copies' (``_stage_a_scales``)
        mbarrier.init(ready.index(i), count=1 + (SA_ARRIVALS if SA_SMEM else 0))
        mbarrier.init(empty.index(i), count=NCONS)

    if SPLIT_WG:
        gl.warp_specialize([
            (_wide_consumer, (a_desc, b_desc, c_desc, a_bufs, b_bufs, sa_bufs, c_smem, ready, empty, sa_ptr, sb_ptr,
                              sb2_ptr, c_ptr, seg_ptr, ws_ptr, cnt_ptr, M, N, K, E, num_pid_m, kb_per_split,
                              split_from, stride_sam, stride_sak, stride_sbe, stride_sbn, stride_sbk, stride_cm,
                              GROUP_M, STAGES, NH, EPI, MODE, E_POW2, DUAL, SPLIT, TAIL, SPREAD, 0, ROWS, SA_SMEM,
                              num_warps, ASUB, aflag_ptr)),
            (_wide_consumer, (a_desc, b_desc, c_desc, a_bufs, b_bufs, sa_bufs, c_smem, ready, empty, sa_ptr, sb_ptr,
                              sb2_ptr, c_ptr, seg_ptr, ws_ptr, cnt_ptr, M, N, K, E, num_pid_m, kb_per_split,
                              split_from, stride_sam, stride_sak, stride_sbe, stride_sbn, stride_sbk, stride_cm,
                              GROUP_M, STAGES, NH, EPI, MODE, E_POW2, DUAL, SPLIT, TAIL, SPREAD, 1, ROWS, SA_SMEM,
                              num_warps, ASUB, aflag_ptr)),
            (_wide_producer, (a_desc, b_desc, b2_desc, a_bufs, b_bufs, sa_bufs, ready, empty, sa_ptr, seg_ptr, M, N,
                              K, E, num_pid_m, kb_per_split, split_from, stride_sam, stride_sak, GROUP_M, STAGES, MODE,
                              E_POW2, DUAL, SPLIT, SA_SMEM)),
        ], [num_warps, 1], [MATH_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_wide_consumer, (a_desc, b_desc, c_desc, a_bufs, b_bufs, sa_bufs, c_smem, ready, empty, sa_ptr, sb_ptr,
                              sb2_ptr, c_ptr, seg_ptr, ws_ptr, cnt_ptr, M, N, K, E, num_pid_m, kb_per_split,
                              split_from, stride_sam, stride_sak, stride_sbe, stride_sbn, stride_sbk, stride_cm,
                              GROUP_M, STAGES, NH, EPI, MODE, E_POW2, DUAL, SPLIT, TAIL, SPREAD, 0, ROWS, SA_SMEM,
                              num_warps, ASUB, aflag_ptr)),
            (_wide_producer, (a_desc, b_desc, b2_desc, a_bufs, b_bufs, sa_bufs, ready, empty, sa_ptr, seg_ptr, M, N,
                              K, E, num_pid_m, kb_per_split, split_from, stride_sam, stride_sak, GROUP_M, STAGES, MODE,
                              E_POW2, DUAL, SPLIT, SA_SMEM)),
        ], [1], [PRODUCER_REGS])
    # No mbarrier.invalidate after the warp-specialised region: the kernel ends here and nothing
    # reuses the barrier memory; compute-sanitizer racecheck reported the invalidate writes as
    # racing with the worker warps' shared-memory reads of Triton's partition-switch loop.
