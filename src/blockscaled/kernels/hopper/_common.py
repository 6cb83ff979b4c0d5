"""Gluon helpers shared by the sm_90a (Hopper) fp8_block GEMM kernels (``wide.py``, ``skinny.py``).

C[M, N] (bf16/fp16/fp32) = (A * sa) @ (B * sb).T with
  A  [M, K] float8_e4m3fn, row-major (K contiguous), scales sa [M, ceil(K/128)] fp32 (1x128 blocks);
  B  [N, K] float8_e4m3fn, row-major (K contiguous), scales sb [ceil(N/128), ceil(K/128)] fp32
     (128x128 blocks).

Numerics (same as the portable kernel, docs/design.md, "Numerics"): per 128-wide K block one FP8
wgmma chain (fp32 accumulation inside the tensor core, starting from zero) gives ``part``; it is
promoted into the fp32 accumulator as ``acc += part * sa[row] * sb[col // 128]``. No fast
accumulation across K blocks.

Tails: TMA zero-fills out-of-bounds rows/cols/K of the loaded boxes, so M, N and the K tail
need no masks in the main loop (a zero-filled K tail contributes 0); scale loads are masked and
the masked epilogue store is masked on M and N. BLOCK_K must be 128 (= the scale block) so each K block
has exactly one scale per row.

Here: the profiler metadata hook, the wgmma and store layouts, the grouped tile raster, the
masked tile store, the TMA load of one ring slot, and two instruction-level helpers (``_pin``,
``_warp_uniform``) that steer LLVM / ptxas.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

# Spellings that differ between triton releases (TMA / cp.async loads and stores, the CTA
# barrier): one alias each, the same Gluon builtin as the release's own name (_compat.py).
from ._compat import tma_load

# Rows (of B / columns of C) sharing one fp32 weight scale: fp8_block weights are 128x128 blocks.
B_SCALE_ROWS = gl.constexpr(128)


def _launch_metadata(grid, kernel, args):
    """Profiler metadata (only evaluated with a profiler hook): name with M/N/K, tile and stages,
    FLOPs, bytes moved once (A, B, both fp32 scale tensors, output)."""
    m, n, k = args["M"], args["N"], args["K"]
    bm, bk = args["a_desc"].block_shape
    bn = args["b_desc"].block_shape[0]
    nb = 2 if args.get("DUAL") else 1  # SwiGLU: two weights (gate, up) per output column
    nk = -(-k // 128)
    nbytes = m * k + m * nk * 4 + nb * (n * k + -(-n // 128) * nk * 4) + m * n * args["c_ptr"].element_size()
    dual = ", swiglu" if args.get("DUAL") else ""
    sk = args.get("SPLIT") or 1
    splitk = ""
    if sk > 1:  # fused split-K: fp32 partials of the split tiles written once and read back once
        tiles = args["num_pid_m"] * -(-n // bn)
        split_tiles = tiles - args.get("split_from", 0)
        # (masked to the valid rows / columns: all of M x N when every tile is split)
        nbytes += 2 * sk * 4 * (m * n if split_tiles == tiles else split_tiles * bm * bn)
        splitk = f", split_k={sk}" + (f" (last {split_tiles} tiles)" if split_tiles < tiles else "")
    return {
        "name": f"{kernel.name} [M={m}, N={n}, K={k}, tile={bm}x{nb * bn}x{bk}, stages={args.get('STAGES')}"
                f"{dual}{splitk}, grid={grid[0]}]",
        "flops": 2.0 * nb * m * n * k,
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
def store_layout_for(block_n, num_warps, vec=8):
    """Coalesced layout for the masked epilogue store: ``vec`` contiguous outputs per thread along
    N, a warp covers 32 * vec contiguous columns (or wraps). vec 8: 16-byte vector stores of
    16-bit outputs, where the compiler can vectorise them (ops/_hopper.py, ``_masked_epi``). vec 1
    where it cannot: with 8 per thread each scalar store instruction wrote 2 of every 16 bytes
    across 16 sectors (8x the L2 sector writes of the data), which made the wide kernel 1.5-2.4x
    slower at N % 8 != 0 (H200, 3125 x 3071 x 1472 87.7 us against 35.8 at N = 3072:
    benchmarks/NOTES.md, thirty-fifth session); with one per thread a warp writes 32
    consecutive outputs, whole sectors."""
    tpn = max(1, min(32, block_n // vec))
    return gl.BlockedLayout([1, vec], [32 // tpn, tpn], [num_warps, 1], [1, 0])


@gluon.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    # Grouped (L2-friendly) order: GROUP_M row-tiles share each B column tile while it is in L2.
    group_size = GROUP_M * num_pid_n
    group_id = tile_id // group_size
    first_m = group_id * GROUP_M
    # Clamped to >= 1: callers may pass tile ids past the grouped tile space (the wide kernel's
    # partial-column tiles, whose coordinates it replaces) and must not divide by zero.
    rows = gl.maximum(gl.minimum(num_pid_m - first_m, GROUP_M), 1)
    in_group = tile_id % group_size
    pid_m = first_m + in_group % rows
    pid_n = in_group // rows
    return pid_m, pid_n


@gluon.jit
def _store_tile(c_ptr, acc, off_m, off_n, M, N, stride_cm, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                num_warps: gl.constexpr, VEC: gl.constexpr = 8):
    # Masked store (any M, N, any 16-bit/32-bit output row stride); TMA store would need
    # N * elem_size % 16 == 0. VEC: outputs per thread along N (store_layout_for).
    out_layout: gl.constexpr = store_layout_for(BLOCK_N, num_warps, VEC)
    out = gl.convert_layout(acc.to(c_ptr.dtype.element_ty), out_layout)
    rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_layout))
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out_layout))
    ptrs = c_ptr + rows.to(gl.int64)[:, None] * stride_cm + cols[None, :]
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    gl.store(ptrs, out, mask=mask)


@gluon.jit
def _issue_load(a_desc, b_desc, a_bufs, b_bufs, bars, slot, off_m, off_n, k, pred):
    # One ring slot: the A box at (off_m, k) and the B box at (off_n, k), both counted by the
    # slot's barrier (expect: their bytes). pred False issues nothing.
    bar = bars.index(slot)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
    tma_load(a_desc, [off_m, k], bar, a_bufs.index(slot), pred=pred)
    tma_load(b_desc, [off_n, k], bar, b_bufs.index(slot), pred=pred)


@gluon.jit
def _pin(x):
    # An opaque (side-effecting) register move: LLVM may not sink the promotion that produces
    # ``x`` below the next wgmma chain. Without it LLVM computed half 0's promotion after half 1's
    # chain was issued, so both wgmma result tiles were live (256 registers: 80-208 B of spills;
    # the wgmma accumulator operand is tied even with use_acc=False, which forced a copy).
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=False, pack=1)


@gluon.jit
def _warp_uniform(x):
    # Lane 0's value to every lane (shfl.sync.idx): equal in all lanes already, but ptxas can now
    # prove it (the broadcast idiom CUTLASS uses for the warp index). The grouped modes' tile
    # coordinates come out of cross-lane reductions (``_wide_tile``) that ptxas cannot prove
    # uniform; as branch conditions they made the whole K loop divergent.
    return gl.inline_asm_elementwise("shfl.sync.idx.b32 $0, $1, 0, 31, -1;", "=r,r", [x], dtype=gl.int32,
                                     is_pure=True, pack=1)

