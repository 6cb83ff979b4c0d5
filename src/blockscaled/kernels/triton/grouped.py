"""Portable Triton kernels for grouped (MoE) block-scaled GEMMs and the fused SwiGLU dual GEMM.

Only @triton.jit bodies live here; launchers, validation and config choice are in
:mod:`blockscaled.ops.grouped` and :mod:`blockscaled.ops.swiglu`.

One kernel, :func:`grouped_gemm_kernel`, serves three row-to-expert mappings (``MODE``):

* ``MODE_DENSE`` (0): one weight ``[N, K]`` (expert stride 0), rows ``0:M``.
* ``MODE_CONTIGUOUS`` (1): ``A [sum_m, K]`` sorted by expert, ``offsets [E+1]`` on the device.
  Program ``pid_m`` finds its expert without a host sync: it loads all ``E`` segment bounds
  as one vector (``E_POW2`` lanes), turns them into per-expert M-tile counts, prefix-sums
  them (``tl.cumsum``) and counts how many inclusive prefix sums are ``<= pid_m``. Empty
  experts own no tile. The launcher sizes the grid from shapes only with the worst case
  ``sum_e ceil(m_e / BM) <= (sum_m + E * (BM - 1)) // BM``; programs past the real tile count
  exit at once. No segment needs padding: tile rows past ``offsets[e+1]`` are masked.
* ``MODE_MASKED`` (2): ``A [E, max_m, K]``, ``masked_m [E]`` on the device, grid axis 2 is
  the expert; programs whose first row is ``>= masked_m[e]`` exit without writing.

``A_DENSE``: A is bf16 / fp16 activations (weight-only W8A16 / W4A16 MoE); the core's
``FMT_DENSE`` path multiplies them with the decoded B values.

``DUAL`` computes two products sharing every A load (``acc_g = A @ B.T``, ``acc_u = A @ B2.T``)
and stores ``silu(acc_g) * acc_u`` (fp32, one cast): the SwiGLU of an MoE up-projection.

:func:`grouped_list_kernel` is the GPU MODE NVFP4 group GEMM: ``G`` independent problems
with their own M, N, K in one launch, through a device table of pointers and shapes.

Tile math: :func:`blockscaled.kernels.triton._mma.scaled_mma` (shared with the dense GEMM;
``DUAL`` shares its A loads between the two B operands). nvfp4 global scales are applied in
the epilogue here (``1 / (gs_a * gs_b[e])``, per-expert ``gs_b`` with ``GSB_PER_EXPERT``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._interp import cast_out
from ._mma import FMT_DENSE, scaled_mma

FMT_NAMES = ("fp8_block", "mxfp8", "mxfp4", "nvfp4")

MODE_DENSE = 0
MODE_CONTIGUOUS = 1
MODE_MASKED = 2
MODE_NAMES = ("dense", "contig", "masked")


@triton.jit
def _silu_mul_f32(g, u):
    return g / (1.0 + tl.exp(-g)) * u


# --------------------------------------------------------------------------- profiler hooks
def _grouped_repr(spec) -> str:
    c = spec.constants
    name = "bs_swiglu" if c.get("DUAL") else "bs_grouped"
    a = "dense" if c.get("A_DENSE") else ""
    return (
        f"{name}_{MODE_NAMES[c.get('MODE', 0)]}_{a + 'x' if a else ''}{FMT_NAMES[c.get('FMT', 0)]}"
        f"_{c.get('BLOCK_M')}x{c.get('BLOCK_N')}x{c.get('BLOCK_K')}"
    )


_DATA_BITS = (8, 8, 4, 4)
_SCALE_BITS_PER_ELEM = (32 / 128, 8 / 32, 8 / 32, 8 / 16)


def _grouped_launch_metadata(grid, metadata, args) -> dict:
    """Name, flops and bytes (data + scales + output) for profilers. Masked mode reports the
    ``max_m`` upper bound: the real counts are on the device and are never read on the host."""
    fmt, mode, dual = args.get("FMT", 0), args.get("MODE", 0), bool(args.get("DUAL", False))
    m, n, k, e = args["M"], args["N"], args["K"], args["E"]
    rows = m * e if mode == MODE_MASKED else m
    nb = 2 if dual else 1
    a_bits = 16 if args.get("A_DENSE") else _DATA_BITS[fmt] + _SCALE_BITS_PER_ELEM[fmt]
    b_bits = _DATA_BITS[fmt] + _SCALE_BITS_PER_ELEM[fmt] / args.get("B_BR", 1)  # 128x128 blocks: 1 scale / 16K
    b_experts = 1 if mode == MODE_DENSE else e
    out_bytes = args["c_ptr"].element_size() * rows * n
    nbytes = int(rows * k * a_bits / 8 + nb * b_experts * n * k * b_bits / 8 + out_bytes)
    return {
        "name": f"{_grouped_repr(type('S', (), {'constants': args})())} [M={m},N={n},K={k},E={e}]",
        "flops": 2 * nb * rows * n * k,
        "bytes": nbytes,
    }


# --------------------------------------------------------------------------- grouped kernel
@triton.jit(repr=_grouped_repr, launch_metadata=_grouped_launch_metadata)
def grouped_gemm_kernel(
    a_ptr, as_ptr, b_ptr, bs_ptr, b2_ptr, b2s_ptr, c_ptr,
    gsa_ptr, gsb_ptr, gsb2_ptr, seg_ptr,
    M, N, K, E,
    stride_ae, stride_am, stride_ase, stride_asm,
    stride_be, stride_bn, stride_bse, stride_bsn,
    stride_ce, stride_cm,
    FMT: tl.constexpr, A_DENSE: tl.constexpr, B_BR: tl.constexpr,
    MODE: tl.constexpr, DUAL: tl.constexpr, GSB_PER_EXPERT: tl.constexpr, E_POW2: tl.constexpr,
    PROMOTE: tl.constexpr, DOT_DTYPE: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One ``[BLOCK_M, BLOCK_N]`` output tile of a dense / contiguous / masked grouped GEMM.

    Grid: ``(m_tiles, cdiv(N, BLOCK_N), 1 or E)``; see the module docstring for ``m_tiles``.
    ``M``: rows of A (dense, contiguous: ``sum_m``) or ``max_m`` (masked).
    ``B_BR``: rows of B sharing one scale row (1, or 128 for 128x128 fp8_block weights).
    ``A_DENSE``: A is bf16 / fp16 activations (weight-only, W8A16 / W4A16); ``as_ptr`` unused.
    ``seg_ptr``: int32 offsets ``[E+1]`` (contiguous) or counts ``[E]`` (masked); unused (dense).
    Data and scales have unit stride along K (checked by the launcher).
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if MODE == 1:
        oe = tl.arange(0, E_POW2)
        # clamped to [0, M]: unvalidated bad offsets give wrong rows, never out-of-bounds access
        lo = tl.minimum(tl.maximum(tl.load(seg_ptr + oe, mask=oe < E, other=0), 0), M)
        hi = tl.minimum(tl.maximum(tl.load(seg_ptr + oe + 1, mask=oe < E, other=0), 0), M)
        ntiles = (tl.maximum(hi - lo, 0) + BLOCK_M - 1) // BLOCK_M
        cum = tl.cumsum(ntiles, 0)  # inclusive prefix sum of M tiles per expert
        e = tl.sum((cum <= pid_m).to(tl.int32), 0)
        if e >= E:
            return  # past the real tile count (grid is sized for the worst case)
        tile0 = tl.sum(tl.where(oe < e, ntiles, 0), 0)
        row0 = tl.sum(tl.where(oe == e, lo, 0), 0) + (pid_m - tile0) * BLOCK_M
        row_end = tl.sum(tl.where(oe == e, hi, 0), 0)
    elif MODE == 2:
        e = tl.program_id(2)
        row_end = tl.minimum(tl.load(seg_ptr + e), M)
        row0 = pid_m * BLOCK_M
        if row0 >= row_end:
            return  # rows past the count: not computed, not written
    else:
        e = 0
        row0 = pid_m * BLOCK_M
        row_end = M
    if MODE == 0:
        e64 = 0
    else:
        e64 = e.to(tl.int64)

    offs_m = row0 + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < row_end
    mask_n = offs_n < N

    acc, acc2 = scaled_mma(
        a_ptr + e64 * stride_ae, as_ptr + e64 * stride_ase, stride_am, 1, stride_asm, 1,
        b_ptr + e64 * stride_be, bs_ptr + e64 * stride_bse,
        b2_ptr + e64 * stride_be, b2s_ptr + e64 * stride_bse, stride_bn, 1, stride_bsn, 1,
        offs_m, offs_n, mask_m, mask_n, 0, K,
        FMT_DENSE if A_DENSE else FMT, FMT, B_BR, PROMOTE, DUAL, DOT_DTYPE, EVEN_K,
        BLOCK_M, BLOCK_N, BLOCK_K,
    )
    if FMT == 3:
        if A_DENSE:
            gsa = 1.0
        else:
            gsa = tl.load(gsa_ptr)
        if GSB_PER_EXPERT:
            gsb = tl.load(gsb_ptr + e)
        else:
            gsb = tl.load(gsb_ptr)
        acc = acc * (1.0 / (gsa * gsb))
        if DUAL:
            if GSB_PER_EXPERT:
                gsb2 = tl.load(gsb2_ptr + e)
            else:
                gsb2 = tl.load(gsb2_ptr)
            acc2 = acc2 * (1.0 / (gsa * gsb2))
    if DUAL:
        acc = _silu_mul_f32(acc, acc2)

    c_ptrs = c_ptr + e64 * stride_ce + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n.to(tl.int64)[None, :]
    tl.store(c_ptrs, cast_out(acc, c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


# --------------------------------------------------------------------------- list (GPU MODE) kernel
#: Columns of the int64 group table built by the launcher (one row per group).
LIST_A, LIST_AS, LIST_B, LIST_BS, LIST_C, LIST_M, LIST_N, LIST_K, LIST_TILE0 = range(9)
LIST_NCOLS = 9


def _list_repr(spec) -> str:
    c = spec.constants
    return f"bs_grouped_list_{FMT_NAMES[c.get('FMT', 3)]}_{c.get('BLOCK_M')}x{c.get('BLOCK_N')}x{c.get('BLOCK_K')}"


def _list_launch_metadata(grid, metadata, args) -> dict:
    return {"name": f"{_list_repr(type('S', (), {'constants': args})())} [G={args.get('G')}]",
            "flops": args.get("FLOPS", 0), "bytes": args.get("BYTES", 0)}


@triton.jit(repr=_list_repr, launch_metadata=_list_launch_metadata)
def grouped_list_kernel(
    table_ptr, alpha_ptr, G, FLOPS, BYTES,
    FMT: tl.constexpr, B_BR: tl.constexpr, OUT_DTYPE: tl.constexpr, G_POW2: tl.constexpr,
    PROMOTE: tl.constexpr, DOT_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One output tile of one of ``G`` independent GEMMs ``C_g = A_g @ B_g.T`` (own M, N, K).

    ``table_ptr``: int64 ``[G, LIST_NCOLS]``: data/scale pointers of A and B, C pointer, M, N,
    K and the group's first tile index (exclusive prefix sum of its tile counts). All tensors
    are row-contiguous; ``B_BR`` rows of B share a scale row (1, or 128 for fp8_block
    128x128 weights). ``alpha_ptr``: fp32 ``[G]`` epilogue factor (``1/(gs_a*gs_b)`` for
    nvfp4, else unused). Grid: ``(total tiles,)``.
    """
    pid = tl.program_id(0)
    og = tl.arange(0, G_POW2)
    starts = tl.load(table_ptr + og * 9 + 8, mask=og < G, other=0x7FFFFFFF)
    g = tl.sum((starts <= pid).to(tl.int32), 0) - 1
    row = table_ptr + g * 9
    M = tl.load(row + 5).to(tl.int32)
    N = tl.load(row + 6).to(tl.int32)
    K = tl.load(row + 7).to(tl.int32)
    local = pid - tl.load(row + 8).to(tl.int32)
    n_tiles = (N + BLOCK_N - 1) // BLOCK_N
    pid_m = local // n_tiles
    pid_n = local % n_tiles
    if FMT == 0:
        a_ptr = tl.load(row + 0).to(tl.pointer_type(tl.float8e4nv))
        as_ptr = tl.load(row + 1).to(tl.pointer_type(tl.float32))
        b_ptr = tl.load(row + 2).to(tl.pointer_type(tl.float8e4nv))
        bs_ptr = tl.load(row + 3).to(tl.pointer_type(tl.float32))
        kd = K
        ks = (K + 127) // 128
    elif FMT == 1:
        a_ptr = tl.load(row + 0).to(tl.pointer_type(tl.float8e4nv))
        as_ptr = tl.load(row + 1).to(tl.pointer_type(tl.uint8))
        b_ptr = tl.load(row + 2).to(tl.pointer_type(tl.float8e4nv))
        bs_ptr = tl.load(row + 3).to(tl.pointer_type(tl.uint8))
        kd = K
        ks = (K + 31) // 32
    elif FMT == 2:
        a_ptr = tl.load(row + 0).to(tl.pointer_type(tl.uint8))
        as_ptr = tl.load(row + 1).to(tl.pointer_type(tl.uint8))
        b_ptr = tl.load(row + 2).to(tl.pointer_type(tl.uint8))
        bs_ptr = tl.load(row + 3).to(tl.pointer_type(tl.uint8))
        kd = (K + 1) // 2
        ks = (K + 31) // 32
    else:
        a_ptr = tl.load(row + 0).to(tl.pointer_type(tl.uint8))
        as_ptr = tl.load(row + 1).to(tl.pointer_type(tl.float8e4nv))
        b_ptr = tl.load(row + 2).to(tl.pointer_type(tl.uint8))
        bs_ptr = tl.load(row + 3).to(tl.pointer_type(tl.float8e4nv))
        kd = (K + 1) // 2
        ks = (K + 15) // 16
    c_ptr = tl.load(row + 4).to(tl.pointer_type(OUT_DTYPE))

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc, _unused = scaled_mma(
        a_ptr, as_ptr, kd, 1, ks, 1,
        b_ptr, bs_ptr, b_ptr, bs_ptr, kd, 1, ks, 1,
        offs_m, offs_n, mask_m, mask_n, 0, K,
        FMT, FMT, B_BR, PROMOTE, False, DOT_DTYPE, False,
        BLOCK_M, BLOCK_N, BLOCK_K,
    )
    if FMT == 3:
        acc = acc * tl.load(alpha_ptr + g)
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n.to(tl.int64)[None, :]
    tl.store(c_ptrs, cast_out(acc, OUT_DTYPE), mask=mask_m[:, None] & mask_n[None, :])


# --------------------------------------------------------------------------- dequant_matmul epilogue
def _epilogue_repr(spec) -> str:
    c = spec.constants
    what = "swiglu" if c.get("SWIGLU") else "copy"
    post = "_post" if c.get("HAS_POST") else ""
    return f"bs_dq_epilogue_{what}_{MODE_NAMES[c.get('MODE', 0)]}{post}_{c.get('BLOCK_M')}x{c.get('BLOCK_N')}"


def _epilogue_launch_metadata(grid, metadata, args) -> dict:
    """Bytes moved (upper bound: masked mode counts all ``max_m`` rows); no flops worth counting."""
    nx = 2 if args.get("SWIGLU") else 1
    rows = args["M"] * args["E"]
    nbytes = rows * args["N"] * (nx * args["x_ptr"].element_size() + args["out_ptr"].element_size())
    return {"name": f"{_epilogue_repr(type('S', (), {'constants': args})())} [M={args['M']},N={args['N']},"
                    f"E={args['E']}]", "bytes": nbytes}


@triton.jit(repr=_epilogue_repr, launch_metadata=_epilogue_launch_metadata)
def dq_epilogue_kernel(
    x_ptr, x2_ptr, out_ptr, seg_ptr, post_ptr, post2_ptr,
    M, N, E, n_exp,
    stride_xe, stride_xm, stride_oe, stride_om, stride_post,
    MODE: tl.constexpr, SWIGLU: tl.constexpr, HAS_POST: tl.constexpr, E_POW2: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Epilogue of the ``dequant_matmul`` strategy (cuBLAS computed the products).

    ``y = x * post[e]`` (``HAS_POST``: nvfp4's ``1 / (gs_a * gs_b[e])``, ``stride_post`` 0 for
    one scale), or with ``SWIGLU`` ``y = silu(x * post[e]) * (x2 * post2[e])``, all in fp32,
    cast once to ``out``'s dtype. ``x`` / ``x2`` (same strides) hold the fp32 or bf16 products.
    Grid ``(cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), E)``.
    ``MODE_DENSE``: ``[M, N]`` (E = 1). ``MODE_MASKED``: ``[E, M = max_m, N]``; rows at or past
    ``min(seg[e], M)`` are neither read nor written (the op's masked contract).
    ``MODE_CONTIGUOUS``: ``[M = sum_m, N]`` (E = 1 in the grid, ``seg`` holds the ``n_exp``
    non-decreasing segment *ends*, ``n_exp <= E_POW2``); a row's expert is the number of ends
    ``<= row`` (only needed for per-expert ``post``).
    """
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_end = M
    if MODE == 2:
        row_end = tl.minimum(tl.maximum(tl.load(seg_ptr + e), 0), M)
        if pid_m * BLOCK_M >= row_end:
            return
    mask_m = rows < row_end
    mask = mask_m[:, None] & (cols < N)[None, :]
    e64 = e.to(tl.int64)
    offs_x = e64 * stride_xe + rows.to(tl.int64)[:, None] * stride_xm + cols.to(tl.int64)[None, :]
    g = tl.load(x_ptr + offs_x, mask=mask, other=0.0).to(tl.float32)
    if SWIGLU:
        u = tl.load(x2_ptr + offs_x, mask=mask, other=0.0).to(tl.float32)
    if HAS_POST:
        if MODE == 1:
            lane = tl.arange(0, E_POW2)
            # lanes past the n_exp experts read as segments that never end
            ends = tl.load(seg_ptr + lane, mask=lane < n_exp, other=2147483647)
            ex = tl.sum((ends[None, :] <= rows[:, None]).to(tl.int32), 1)
            ex = tl.minimum(ex, n_exp - 1)  # rows past the last end (invalid offsets): last expert
            p = tl.load(post_ptr + ex * stride_post, mask=mask_m, other=1.0)[:, None]
            g = g * p
            if SWIGLU:
                u = u * tl.load(post2_ptr + ex * stride_post, mask=mask_m, other=1.0)[:, None]
        else:
            g = g * tl.load(post_ptr + e * stride_post)
            if SWIGLU:
                u = u * tl.load(post2_ptr + e * stride_post)
    if SWIGLU:
        g = _silu_mul_f32(g, u)
    offs_o = e64 * stride_oe + rows.to(tl.int64)[:, None] * stride_om + cols.to(tl.int64)[None, :]
    tl.store(out_ptr + offs_o, cast_out(g, out_ptr.dtype.element_ty), mask=mask)
