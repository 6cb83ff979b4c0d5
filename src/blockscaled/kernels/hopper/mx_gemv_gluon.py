"""The fp4 decode GEMV with explicit layouts (Gluon): mxfp4 / nvfp4 weights x bf16 / fp16 activations,
one or two activation rows per program, on the CUDA cores.

``C[m, n] = sum_k x[m, k] * dequantize(W)[n, k]``. The host launcher is ``blockscaled.ops._mx_gemv_gluon``;
plan/mx_gemv.py decides where it runs (``GemmConfig(strategy="gemv", gluon=True)``).

Why a second GEMV. The Triton GEMV (kernels/triton/mx_gemv.py) relies on the layout the compiler assigns.
Triton 3.6 puts all 32 threads of a warp across K slices and keeps every weight row of the program in a
thread's registers; 3.7 and 3.8 spread a warp over 8 weight rows x 4 slices and the activations over 4
threads per slice, convert between the two through shared memory every K step and spill (benchmarks/NOTES.md,
forty-first session). Those are the releases torch 2.12-2.14 install. Here the 3.6 structure is written
down as layouts, so no release can choose another:

- a program owns BLOCK_N (<= 8) weight rows and walks K in chunks of G = 32 x warps slices of 32
  elements; **thread t owns slice t of every row** (``W3``: [G, BLOCK_N, 16] packed bytes, 16
  contiguous bytes per row and thread = one 128-bit load, the rows in registers);
- the activations of a slice are that thread's 32 contiguous values (``X2`` [G, 32]: four 128-bit
  loads), split into even / odd elements in registers (the conversions are asserted trivial);
- e2m1 decoded by the Triton GEMV's PRMT inline assembly (``_FP4_ASM``: the same instructions), the
  block scale (E8M0 per 32, or two e4m3 per 16 for nvfp4) applied once per slice and row, partials in
  [G, BLOCK_N] registers, summed over the threads once at the end.

AOT on sm_90a (tests/test_aot_mx_gemv_gluon.py, triton 3.6-3.9): per K step 12 128-bit loads at 8 rows,
no shared or local memory in the loop, no spills, 10.0-11.1 SASS per weight byte at 8 rows and 12.4-12.7
at 2 (the Triton GEMV's 3.6 build: 10.1-11.2 at 8).

Numerics as the Triton GEMV: every product of decoded values exact in fp32, FMA chains per slice,
one multiply by the block scale per slice and row, nvfp4 ``* 1 / gs`` (IEEE division), bias in fp32,
one rounding at the store. K % 32 == 0 (the planner and the launcher check): slices past K are masked
whole. Rows past N read row 0 (never stored); a second activation row past M reads zeros and is not
stored. E8M0 255 decodes to NaN and propagates.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..triton.mx_gemv import _FP4_ASM

#: kernel FMT codes (kernels/triton/_mma.py's: 2 mxfp4, 3 nvfp4)
FMT_CODES = {"mxfp4": 2, "nvfp4": 3}
#: K elements per thread and row per chunk: 16 packed bytes, one 128-bit load
SLICE = gl.constexpr(32)
SLICE_ELEMS = 32


def layouts(block_n: int, warps: int):
    """(W3: weight bytes [G, BLOCK_N, 16]; X2: activations [G, 32]; S3: nvfp4 scales [G, BLOCK_N, 2]) for
    ``warps`` warps (G = 32 x warps slices per chunk)."""
    w3 = gl.BlockedLayout(size_per_thread=[1, block_n, 16], threads_per_warp=[32, 1, 1], warps_per_cta=[warps, 1, 1],
                          order=[2, 1, 0])
    x2 = gl.BlockedLayout(size_per_thread=[1, 32], threads_per_warp=[32, 1], warps_per_cta=[warps, 1], order=[1, 0])
    s3 = gl.BlockedLayout(size_per_thread=[1, block_n, 2], threads_per_warp=[32, 1, 1], warps_per_cta=[warps, 1, 1],
                          order=[2, 1, 0])
    return w3, x2, s3


def constexprs(fmt: str, rows: int, block_n: int, warps: int) -> dict:
    """The kernel's compile-time arguments for ``fmt`` weights, ``rows`` (1 or 2) activation rows per
    program, ``block_n`` weight rows and ``warps`` warps (a chunk: 1024 x warps K elements)."""
    w3, x2, s3 = layouts(block_n, warps)
    return {"FMT": FMT_CODES[fmt], "ROWS": rows, "BLOCK_N": block_n, "G": 32 * warps, "W3": w3, "X2": x2, "S3": s3}


@gluon.jit
def _e8m0(s):
    """E8M0 bytes -> fp32 2**(s - 127) (0 -> 2**-127, 255 -> NaN), as kernels/triton/_mma.py decode_scale."""
    si = s.to(gl.int32)
    r = (si << 23).to(gl.float32, bitcast=True)
    r = gl.where(si == 0, (si * 0 + 0x00400000).to(gl.float32, bitcast=True), r)
    return gl.where(si == 255, float("nan"), r)


@gluon.jit
def _row_part(x, wa, wb, s_ptr, s_mask, FMT: gl.constexpr, G: gl.constexpr, BLOCK_N: gl.constexpr,
              W3: gl.constexpr, S3: gl.constexpr):
    """[G, BLOCK_N] partials of one activation row ``x`` ([G, 32] fp32) with the chunk's decoded weights
    ``wa`` / ``wb`` (even / odd elements), times the block scales. The scales are loaded and decoded
    after the products: decoded ahead, they stayed live across them (191-206 registers at 8 rows, AOT,
    instead of 96-151)."""
    xa, xb = gl.split(gl.reshape(x, [G, SLICE // 2, 2]))  # even / odd elements, in the thread's registers
    xa = gl.convert_layout(xa, gl.SliceLayout(1, W3), assert_trivial=True)
    xb = gl.convert_layout(xb, gl.SliceLayout(1, W3), assert_trivial=True)
    pa = wa * xa[:, None, :]
    pb = wb * xb[:, None, :]
    if FMT == 3:
        # two e4m3 blocks of 16 per slice: halves of the 16 packed bytes (8 bytes = 16 elements each)
        part = gl.convert_layout(gl.sum(gl.reshape(pa + pb, [G, BLOCK_N, 2, 8]), axis=3), S3, assert_trivial=True)
        sc = gl.load(s_ptr, mask=s_mask, other=0.0)
        r = gl.convert_layout(gl.sum(part * sc.to(gl.float32), axis=2), gl.SliceLayout(2, W3), assert_trivial=True)
    else:
        sc = gl.load(s_ptr, mask=s_mask, other=0)
        r = (gl.sum(pa, axis=2) + gl.sum(pb, axis=2)) * _e8m0(sc)  # two FMA chains, as the Triton GEMV
    return r


@gluon.jit
def _store_row(c_ptr, acc, bias_ptr, gs_ptr, offs_n, mask_n, FMT: gl.constexpr, HAS_BIAS: gl.constexpr):
    r = gl.sum(acc, axis=0)
    if FMT == 3:
        r = r * gl.div_rn(gl.full([], 1.0, gl.float32), gl.load(gs_ptr))  # IEEE, as the Triton GEMV
    if HAS_BIAS:
        r = r + gl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(gl.float32)
    gl.store(c_ptr + offs_n, r.to(c_ptr.dtype.element_ty), mask=mask_n)


@gluon.jit
def mx_gemv_gluon_kernel(x_ptr, b_ptr, bs_ptr, gs_ptr, bias_ptr, c_ptr, M, N, K, stride_xm, stride_bn, stride_bsn,
                         stride_cm, FMT: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, G: gl.constexpr,
                         W3: gl.constexpr, X2: gl.constexpr, S3: gl.constexpr, HAS_BIAS: gl.constexpr):
    """``c[M, N] = x[M, K] @ B[N, K].T``: program (i, j) computes weight rows i * BLOCK_N.. and activation
    rows j * ROWS.. (ROWS 1 or 2). B packed e2m1 ``[N, K / 2]`` with E8M0 scales ``[N, K / 32]`` (FMT 2)
    or e4m3 scales ``[N, K / 16]`` and an fp32 global scale (FMT 3), both K-contiguous; x bf16 / fp16,
    K-contiguous; c any float dtype, unit column stride; bias ``[N]`` or unused."""
    WS: gl.constexpr = gl.SliceLayout(2, W3)  # [G, BN]: a slice's partial per row
    pid = gl.program_id(0)
    row0 = gl.program_id(1) * ROWS
    offs_n = pid * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, WS))
    mask_n = offs_n < N
    offs_n = gl.where(mask_n, offs_n, 0)  # rows past N read row 0 (never stored): the loads stay unmasked
    g_w = gl.arange(0, G, layout=gl.SliceLayout(1, WS))
    j_w = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, W3)))
    w_off = (offs_n.to(gl.int64) * stride_bn)[None, :, None] + (g_w * 16)[:, None, None] + j_w[None, None, :]
    g_x = gl.arange(0, G, layout=gl.SliceLayout(1, X2))
    x_off = (g_x * SLICE)[:, None] + gl.arange(0, SLICE, layout=gl.SliceLayout(0, X2))[None, :]
    x_row = x_ptr + row0.to(gl.int64) * stride_xm
    if FMT == 3:
        g_s = gl.arange(0, G, layout=gl.SliceLayout(1, gl.SliceLayout(2, S3)))
        n_s = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, gl.SliceLayout(2, S3)))
        t_s = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, S3)))
        rows_s = gl.where(pid * BLOCK_N + n_s < N, pid * BLOCK_N + n_s, 0)
        s_off = (rows_s.to(gl.int64) * stride_bsn)[None, :, None] + (g_s * 2)[:, None, None] + t_s[None, None, :]
    else:
        s_off = (offs_n.to(gl.int64) * stride_bsn)[None, :] + g_w[:, None]
    acc0 = gl.zeros([G, BLOCK_N], gl.float32, WS)
    acc1 = gl.zeros([G, BLOCK_N], gl.float32, WS)
    has1 = row0 + 1 < M
    for k0 in range(0, K, G * SLICE):
        kmask_w = (k0 + g_w * SLICE) < K  # whole slices (K % 32 == 0)
        w = gl.load(b_ptr + k0 // 2 + w_off, mask=kmask_w[:, None, None], other=0)
        # the activations' loads issued before the weights' decode waits for its load
        xmask = ((k0 + g_x * SLICE) < K)[:, None]
        x0 = gl.load(x_row + k0 + x_off, mask=xmask, other=0.0).to(gl.float32)
        if ROWS == 2:
            x1 = gl.load(x_row + stride_xm + k0 + x_off, mask=xmask & has1, other=0.0).to(gl.float32)
        wa, wb = gl.inline_asm_elementwise(_FP4_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r", [w],
                                           dtype=(gl.float32, gl.float32), is_pure=True, pack=4)
        if FMT == 3:
            s_ptr = bs_ptr + k0 // 16 + s_off
            s_mask = ((k0 + g_s * SLICE) < K)[:, None, None]
        else:
            s_ptr = bs_ptr + k0 // 32 + s_off
            s_mask = kmask_w[:, None]
        acc0 += _row_part(x0, wa, wb, s_ptr, s_mask, FMT, G, BLOCK_N, W3, S3)
        if ROWS == 2:
            acc1 += _row_part(x1, wa, wb, s_ptr, s_mask, FMT, G, BLOCK_N, W3, S3)
    c_row = c_ptr + row0.to(gl.int64) * stride_cm
    _store_row(c_row, acc0, bias_ptr, gs_ptr, offs_n, mask_n, FMT, HAS_BIAS)
    if ROWS == 2:
        _store_row(c_row + stride_cm, acc1, bias_ptr, gs_ptr, offs_n, mask_n & has1, FMT, HAS_BIAS)
