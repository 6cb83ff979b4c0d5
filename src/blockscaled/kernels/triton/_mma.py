"""Block-scaled tile MMA core: the K loop every portable GEMM kernel shares.

``scaled_mma`` returns the fp32 accumulator tile ``A[rows] @ B[cols].T`` for one
``[BLOCK_M, BLOCK_N]`` output tile of a block-scaled (or weight-only) GEMM. Dense, grouped,
masked and dual (SwiGLU) kernels call it with pointers already offset to the right
batch / expert and with their own row / column index vectors.

Operands (logical shapes; pointers and strides in elements of the stored dtype)
-----------------------------------------------------------------------------
A: ``[M, K]`` row-major-ish data (``stride_ak`` along K, normally 1). Quantized formats
   store one scale per 1 x SCALE_K block: ``a_s [M, ceil(K/SCALE_K)]``. Dense A
   (``A_FMT == FMT_DENSE``): bf16/fp16 values, ``a_s_ptr`` ignored.
B: ``[N, K]`` (the weight, K contiguous). Scales ``b_s [ceil(N/B_SCALE_ROWS), ceil(K/SCALE_K)]``
   (``B_SCALE_ROWS`` = 128 for fp8_block 128x128 weights, else 1).
Packed fp4 (mxfp4, nvfp4): data is bytes ``[rows, ceil(K/2)]``, element ``2i`` in the low
nibble of byte ``i``; strides are byte strides; ``K`` is the logical (element) count and may
be odd.

Two ways to apply the scales (constexpr ``PROMOTE``)
----------------------------------------------------
* ``PROMOTE=True`` (fp8_block always): one ``tl.dot`` per K chunk of raw element values
  (e4m3 FP8 dot; fp4 codes decoded to e4m3 exactly, every e2m1 value is an e4m3 value;
  weight-only: raw B values cast to A's dtype, exact in fp16/bf16), then
  ``acc += part * a_scale[:, None] * b_scale[None, :]`` in fp32. Needs the chunk inside one
  scale block: ``SCALE_K % BLOCK_K == 0``. This is DeepSeek's "promotion" recipe.
* ``PROMOTE=False`` (dequantize in registers): each tile is dequantized to ``DOT_DTYPE`` (bf16
  on GPUs), then one dot per ``BLOCK_K`` (any power of two >= 16, independent of the scale
  block). Compiled bf16 path (``BLOCK_K >= 32`` for fp4, mxfp8 any): straight to bf16 bit
  patterns and packed bf16 multiplies (:func:`fp4_bf16`, :func:`scale_bf16`, :func:`_mul_bf16`;
  nvfp4 operands carry 2**-NVFP4_BF16_SHIFT, multiplied back on the accumulator after the loop);
  the interpreter (and 16-wide fp4 chunks) decode to fp32, multiply by the scale and cast. Loads: data as one
  vector load per byte ([R, BK] fp8, [R, BK // 2] packed fp4 split into nibbles and
  interleaved), scales as [R, BK // SCALE_K] broadcast by a reshape (one scale load per block,
  not per element), so Triton pipelines both through cp.async; tests/test_mma_perf_aot.py
  checks the sm_90 PTX (H100: per-element gathers made mxfp8 9x and nvfp4 24x slower than
  fp8_block at M=256 N=512 K=1024); tests/test_mx_tiles_aot.py counts the bf16 path's K-loop
  instructions per weight element (4.6-10.7 PTX, from 15.8-32.3). For MX/NV formats this is
  exact in bf16: e4m3/e2m1 times a power of two (E8M0) or times an e4m3 scale has at most
  6 significant bits (< 8 of bf16) and bf16 has fp32's exponent range. NOT exact for
  fp8_block (fp32 scales), so fp8_block must use PROMOTE.

Choice (the planner's, plan/portable.py): nvfp4 cannot promote through an FP8 dot (FP8 wgmma needs
K >= 32 per instruction, nvfp4 blocks are 16) and MX promotion per 32 K pays a full accumulator FMA
pass per 32 K; MXFP8 per-32 promotion measured >= the earlier fp32-decode bf16 path at M <= 128
(112 vs 87 TFLOP/s at M=128; docs/design.md, "Measurements older than NOTES.md"), which the bf16
path above replaces at 8 < M <= 512 on sm_90 (plan.portable.MX_BF16_*, not measured yet).

Interpreter: triton 3.6's interpreter returns garbage for bf16 ``tl.dot`` (and bf16
elementwise math), so launchers pass ``DOT_DTYPE=tl.float32`` there; the products are
exact in either dtype, only the (fp32) accumulation order differs. Two more interpreter
defects (triton 3.6 - 3.9, ``_convert_float`` in triton/runtime/interpreter.py) are worked
around by the helpers of :mod:`._interp`, only where ``INTERPRETING`` (a module constant: the
GPU code is unchanged, the branches fold away at compile time;
tests/test_interpreter_numerics.py compares the PTX):
  * its fp32 -> bf16 cast truncates (the GPU's ``cvt.rn.bf16.f32`` rounds to nearest even):
    every portable kernel's output goes through :func:`cast_out`;
  * its e4m3 -> fp32 cast decodes the NaN code ``S.1111.111`` as +-480: e4m3 data and scales
    go through :func:`e4m3_to_f32` / :func:`upcast`.

Indexing: row offsets are widened to int64 before multiplying by strides (``rows * K`` can
exceed 2**31); K offsets stay int32 (K < 2**31).

Global scales (nvfp4) are NOT applied here: the epilogue multiplies by ``1/(gs_a*gs_b)``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..._experimental import mx_kernel_enabled
from ._interp import INTERPRETING, cast_out, e4m3_to_f32, upcast  # noqa: F401 (re-exported)

# Operand format codes (pass as tl.constexpr). Host code maps Format.name -> code with
# FORMAT_CODES.
FMT_FP8_BLOCK = tl.constexpr(0)
FMT_MXFP8 = tl.constexpr(1)
FMT_MXFP4 = tl.constexpr(2)
FMT_NVFP4 = tl.constexpr(3)
FMT_DENSE = tl.constexpr(4)  # A only: bf16 / fp16 activations (weight-only GEMM)

#: The in-register dequantization straight to bf16 (_load_bf16_values, scale_bf16, _mul_bf16) on
#: compiled kernels: off unless BLOCKSCALED_MX_KERNELS switches "bf16" on (blockscaled._experimental:
#: not yet run on a GPU); otherwise the fp32 decode, multiply and cast. The interpreter always
#: takes the fp32 path (it cannot do bf16 arithmetic).
MX_BF16_DECODE = tl.constexpr(mx_kernel_enabled("bf16") and not INTERPRETING.value)

FORMAT_CODES = {"fp8_block": 0, "mxfp8": 1, "mxfp4": 2, "nvfp4": 3, "dense": 4}
#: elements sharing one scale along K, per format code
SCALE_K_OF = {0: 128, 1: 32, 2: 32, 3: 16, 4: 1}


@triton.jit
def decode_e2m1(code):
    """e2m1 codes (int32, 0..15) -> exact fp32 values (0, .5, 1, 1.5, 2, 3, 4, 6, signed).

    Integer-only (fewer live temporaries than an fp32 select): magnitude ``mag >= 2`` has
    exponent ``(mag >> 1) - 1`` and mantissa bit ``mag & 1``, i.e. fp32 bits
    ``((mag >> 1) + 126) << 23 | (mag & 1) << 22 == (mag << 22) + (126 << 23)``; mag 1 is 0.5
    (bits 0x3F000000), mag 0 is 0; the sign bit is code bit 3 moved to bit 31."""
    mag = code & 7
    bits = tl.where(mag >= 2, (mag << 22) + (126 << 23), mag * 0x3F000000)
    bits = bits | ((code & 8) << 28)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def decode_scale(s, FMT: tl.constexpr):
    """Stored scale -> fp32: fp32 as is; E8M0 uint8 -> 2**(s-127) (0 -> 2**-127, 255 -> NaN);
    e4m3 -> its value."""
    if FMT == FMT_FP8_BLOCK:
        r = s.to(tl.float32)
    elif FMT == FMT_NVFP4:
        r = e4m3_to_f32(s)
    else:
        si = s.to(tl.int32)
        r = (si << 23).to(tl.float32, bitcast=True)
        r = tl.where(si == 0, tl.full(si.shape, 0x00400000, tl.int32).to(tl.float32, bitcast=True), r)
        r = tl.where(si == 255, float("nan"), r)
    return r


@triton.jit
def _load_fp4_bytes(ptr, row_off, mask_r, k0, stride_k, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """Packed fp4 tile at K indices ``[k0, k0 + BLOCK_K)`` as its bytes [R, BLOCK_K // 2] (uint8,
    element ``2j`` in the low nibble of byte ``j``). Masked -> 0; odd K: the last byte's high
    nibble (element K, padding) is cleared, whatever it holds.

    One load per byte, K contiguous, so it vectorizes / is cp.async pipelined (the former
    per-element gather, byte ``k // 2`` + variable shift, issued scalar byte loads that were
    never pipelined: measured in tests/test_mma_perf_aot.py). ``k0`` is even (a multiple of
    BLOCK_K), so byte ``k0 // 2 + j`` holds both elements."""
    offs_b = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    if EVEN_K:
        mask = mask_r[:, None]
    else:
        # bytes holding any element < K: ceil(K / 2), written K - K // 2 so that Triton's
        # divisibility analysis keeps K's (x16 -> x8): mask constant over 8 bytes, loads
        # stay vectorized / cp.async-pipelined (``offs_b * 2 < K`` made them byte loads).
        mask = mask_r[:, None] & (offs_b < K - K // 2)[None, :]
    byte = tl.load(ptr + row_off[:, None] + offs_b[None, :] * stride_k, mask=mask, other=0)
    if not EVEN_K:
        byte = tl.where((offs_b * 2 + 1 < K)[None, :], byte, byte & 15)
    return byte


@triton.jit
def _load_fp4_codes(ptr, row_off, mask_r, k0, stride_k, K, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """Packed fp4 tile at K indices ``[k0, k0 + BLOCK_K)`` as int32 e2m1 codes [R, BLOCK_K]
    (:func:`_load_fp4_bytes` with the nibbles split by shifts and interleaved, low nibble = even
    element). Masked -> 0."""
    byte = _load_fp4_bytes(ptr, row_off, mask_r, k0, stride_k, K, BLOCK_K, EVEN_K)
    return _interleave(byte & 15, byte >> 4).to(tl.int32)


#: bf16 bits of 2**126 (:func:`fp4_bf16` patterns are e2m1 * 2**-126)
BF16_2POW126 = tl.constexpr(0x7E80)
#: nvfp4 tiles dequantized by :func:`scale_bf16` carry a factor 2**-NVFP4_BF16_SHIFT (one bf16
#: multiply instead of two, see there); scaled_mma multiplies its accumulator back (exact)
NVFP4_BF16_SHIFT = tl.constexpr(8)
_NVFP4_BF16_FACTOR = tl.constexpr(2.0 ** (126 - 8))  # 2**(126 - NVFP4_BF16_SHIFT)


@triton.jit
def fp4_bf16(byte):
    """Packed e2m1 bytes [R, H] (uint8, element ``2j`` in the low nibble of byte ``j``) -> bf16
    [R, 2H] holding ``e2m1 * 2**-126``, from integer ops only (GPU code: the interpreter cannot
    do bf16 arithmetic on the result).

    Magnitude bits ``e1 e0 m`` of a nibble placed at bf16 bits 8..6 (exponent field ``e1 e0``,
    mantissa MSB ``m``) and its sign at bit 15 are exactly ``e2m1 * 2**-126`` for all 16 codes:
    ``E = e1e0 >= 1`` gives ``2**(E - 127) * (1 + m/2) = 2**(E-1) * (1 + m/2) * 2**-126``, and
    ``E = 0`` is bf16's subnormal ``m * 2**-127 = (m/2) * 2**-126`` (e2m1 0.5 and +-0). One
    32-bit word per byte holds both elements (low half = even element), the layout of a bf16x2
    MMA operand register: ``b * 0x40040 = b << 6 | b << 18`` puts the low nibble's magnitude at
    bits 6..8 and the high nibble's at 22..24, ``b * 0x1001000 = b << 12 | b << 24`` the signs at
    bits 15 and 31 (neither product carries: the shifted copies do not overlap).
    Multiplying by 2**126 (:data:`BF16_2POW126`) gives the e2m1 values; :func:`scale_bf16` for the
    block scales."""
    b = byte.to(tl.uint32)
    w = ((b * 0x40040) & 0x01C001C0) | ((b * 0x1001000) & 0x80008000)
    lo = w.to(tl.uint16)
    hi = (w >> 16).to(tl.uint16)
    return _interleave(lo, hi).to(tl.bfloat16, bitcast=True)


@triton.jit
def scale_bf16(s, FMT: tl.constexpr):
    """Stored MX/NV block scales -> the bf16 factor of the in-register bf16 dequantization (GPU code).

    E8M0 (mxfp8 / mxfp4): ``2**(e-127)`` exactly: bits ``e << 7`` for e in 1..254, 2**-127 is bf16's
    subnormal 0x0040 (e = 0), e = 255 is NaN; every E8M0 value is a bf16 value. A product
    ``element * 2**(e-127)`` is exact in bf16 unless it is below 2**-126 and not a multiple of
    2**-133 (bf16's subnormal step): never for e2m1 (multiples of 2**-128); for e4m3 (multiples of
    2**(E-10), E its exponent field, 2**-9 for subnormals) only where ``E + e < 4`` (normal) or
    ``e < 3`` (subnormal), i.e. with E8M0 codes 0..2 (scales <= 2**-125). Those round to nearest
    even, as the fp32 -> bf16 cast of the earlier fp32 dequantization did (exact fp32 product, one
    rounding): tests/test_mx_bf16.py::test_mxfp8_lowest_scales_round_like_bf16_operands.
    nvfp4 (e4m3 scale s, 2**-9 <= |s| <= 448 or 0): ``s * 2**(126 - NVFP4_BF16_SHIFT)``, a normal
    bf16 below 2**127, so that one multiply of an :func:`fp4_bf16` pattern gives
    ``e2m1 * s * 2**-8`` exactly (>= 2**-18: normal; <= 6 significant bits); without the shift the
    factor ``s * 2**126`` would overflow bf16 for s >= 4."""
    if FMT == FMT_NVFP4:
        r = (e4m3_to_f32(s) * _NVFP4_BF16_FACTOR).to(tl.bfloat16)
    else:
        e = s.to(tl.int32)
        bits = tl.where(e == 0, 0x0040, tl.where(e == 255, 0x7FC0, e << 7))
        r = bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
    return r


@triton.jit
def _mul_bf16(x, y):
    """``x * y`` for bf16 tensors of one shape, as packed ``fma.rn.bf16x2(x, y, -0.0)`` (sm_80+; exact
    products are what the callers multiply, so the rounding mode does not matter; -0.0 keeps the
    sign of zero products). Triton's own ``*`` emitted scalar ``mul.bf16`` on the MMA operand
    layout, which ptxas paired into HMUL2 with a half-swapping PRMT before and after each one."""
    return tl.inline_asm_elementwise("{ .reg .b32 nz; mov.b32 nz, 0x80008000; fma.rn.bf16x2 $0, $1, $2, nz; }",
                                     "=r,r,r", [x, y], dtype=tl.bfloat16, is_pure=True, pack=2)


@triton.jit
def _interleave(lo, hi):
    """[R, H] x 2 -> [R, 2H] with ``out[:, 2j] = lo[:, j]``, ``out[:, 2j + 1] = hi[:, j]``."""
    R: tl.constexpr = lo.shape[0]
    H: tl.constexpr = lo.shape[1]
    return tl.join(lo, hi).reshape([R, 2 * H])


@triton.jit
def _apply_block_scale(v, s, SPAN: tl.constexpr):
    """``v [R, NS * SPAN] * s [R, NS]`` with ``s[:, j]`` covering columns ``[j*SPAN, (j+1)*SPAN)``
    (a reshape broadcast: one scale load per block instead of one per element)."""
    R: tl.constexpr = v.shape[0]
    C: tl.constexpr = v.shape[1]
    NS: tl.constexpr = C // SPAN
    return (v.reshape([R, NS, SPAN]) * s[:, :, None]).reshape([R, C])


@triton.jit
def _load_values(ptr, row_off, mask_r, k0, offs_kb, stride_k, K, FMT: tl.constexpr, EVEN_K: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """Raw element values of a [R, BK] tile at K indices ``k0 + offs_kb``.

    fp8 formats and dense: the stored dtype. fp4: fp32 decoded values. Masked -> 0."""
    if (FMT == FMT_MXFP4 or FMT == FMT_NVFP4) and BLOCK_K >= 32:
        v = decode_e2m1(_load_fp4_codes(ptr, row_off, mask_r, k0, stride_k, K, BLOCK_K, EVEN_K))
    elif FMT == FMT_MXFP4 or FMT == FMT_NVFP4:
        # BLOCK_K == 16 (8 packed bytes per row): the join/reshape unpacking above computed wrong
        # values on the H100 (triton 3.6; rel. error ~1, right in the interpreter), so 16-wide
        # chunks gather each element's byte instead (the pre-join code, correct on the GPU).
        offs_k = k0 + offs_kb
        if EVEN_K:
            mask = mask_r[:, None]
        else:
            mask = mask_r[:, None] & (offs_k < K)[None, :]
        byte = tl.load(ptr + row_off[:, None] + (offs_k // 2)[None, :] * stride_k, mask=mask, other=0)
        v = decode_e2m1((byte.to(tl.int32) >> ((offs_k % 2) * 4)[None, :]) & 15)
    else:
        offs_k = k0 + offs_kb
        if EVEN_K:
            mask = mask_r[:, None]
        else:
            mask = mask_r[:, None] & (offs_k < K)[None, :]
        v = tl.load(ptr + row_off[:, None] + offs_k[None, :] * stride_k, mask=mask, other=0.0)
    return v


@triton.jit
def _load_block_scales(s_ptr, s_row_off, mask_r, k0, stride_sk, K, FMT: tl.constexpr, SCALE_K: tl.constexpr,
                       NS: tl.constexpr, EVEN_K: tl.constexpr, BF16: tl.constexpr = False):
    """Scales [R, NS] of the NS scale blocks starting at block ``k0 // SCALE_K``: fp32
    (:func:`decode_scale`) or, with BF16, the bf16 factors of :func:`scale_bf16`.
    Blocks at or past K are masked: they read 0 (E8M0 0 -> 2**-127, e4m3 0 -> 0; never the E8M0
    NaN code 255), and multiply only masked (zero) elements."""
    # k0 is a multiple of BLOCK_K = NS * SCALE_K (scaled_mma's contract): the NS scales of a row
    # are one aligned vector (what lets Triton vectorize the load and pipeline it with cp.async)
    offs_s = tl.max_contiguous(tl.multiple_of(k0 // SCALE_K + tl.arange(0, NS), NS), NS)
    if EVEN_K:
        mask = mask_r[:, None]
    else:
        mask = mask_r[:, None] & (offs_s * SCALE_K < K)[None, :]
    s = tl.load(s_ptr + s_row_off[:, None] + offs_s[None, :] * stride_sk, mask=mask, other=0.0)
    if BF16:
        r = scale_bf16(s, FMT)
    else:
        r = decode_scale(s, FMT)
    return r


@triton.jit
def _load_bf16_values(ptr, row_off, mask_r, k0, offs_kb, stride_k, K, FMT: tl.constexpr, EVEN_K: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    """A quantized [R, BK] tile at K indices ``k0 + offs_kb`` as bf16 element values for the
    in-register bf16 dequantization (GPU code, BLOCK_K >= 32 for fp4): e4m3 -> fp32 -> bf16 (the
    hardware conversions; exact, NaN kept); e2m1 -> :func:`fp4_bf16` patterns (``e2m1 * 2**-126``),
    times 2**126 for mxfp4 (exact: the e2m1 values; nvfp4 folds 2**126 into its scale factor,
    :func:`scale_bf16`). Masked -> 0."""
    if FMT == FMT_MXFP4 or FMT == FMT_NVFP4:
        v = fp4_bf16(_load_fp4_bytes(ptr, row_off, mask_r, k0, stride_k, K, BLOCK_K, EVEN_K))
        if FMT == FMT_MXFP4:
            v = _mul_bf16(v, tl.full(v.shape, BF16_2POW126, tl.int16).to(tl.bfloat16, bitcast=True))
    else:
        v = _load_values(ptr, row_off, mask_r, k0, offs_kb, stride_k, K, FMT, EVEN_K, BLOCK_K)
        v = v.to(tl.float32).to(tl.bfloat16)
    return v


@triton.jit
def _load_tile(
    ptr, s_ptr, row_off, s_row_off, mask_r, k0, offs_kb, stride_k, stride_sk, K,
    FMT: tl.constexpr, SCALE_K: tl.constexpr, PROMOTE: tl.constexpr, DOT_DTYPE: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One operand K chunk starting at ``k0``: returns (tile [R, BK] in the dot dtype,
    per-row fp32 scale [R] (PROMOTE only; ones otherwise or for dense)).

    Non-promote loads are vector loads of the stored bytes ([R, BK] fp8, [R, BK // 2] packed fp4)
    plus one [R, BK // SCALE_K] scale load; scales are broadcast in registers by a reshape."""
    if FMT == FMT_DENSE:
        v = _load_values(ptr, row_off, mask_r, k0, offs_kb, stride_k, K, FMT, EVEN_K, BLOCK_K)
        tile = v.to(DOT_DTYPE)
        sc = tl.full(mask_r.shape, 1.0, tl.float32)
    elif PROMOTE:
        v = _load_values(ptr, row_off, mask_r, k0, offs_kb, stride_k, K, FMT, EVEN_K, BLOCK_K)
        # whole chunk inside one scale block: one scale per row
        s = tl.load(s_ptr + s_row_off + (k0 // SCALE_K) * stride_sk, mask=mask_r, other=0.0)
        sc = decode_scale(s, FMT)
        tile = upcast(v, DOT_DTYPE)
    elif MX_BF16_DECODE and DOT_DTYPE == tl.bfloat16 and (FMT == FMT_MXFP8 or BLOCK_K >= 32):
        # in-register dequantization straight to bf16 (scale_bf16: every product exact)
        sc = tl.full(mask_r.shape, 1.0, tl.float32)
        v = _load_bf16_values(ptr, row_off, mask_r, k0, offs_kb, stride_k, K, FMT, EVEN_K, BLOCK_K)
        if BLOCK_K <= SCALE_K:
            s_raw = tl.load(s_ptr + s_row_off + (k0 // SCALE_K) * stride_sk, mask=mask_r, other=0.0)
            tile = _mul_bf16(v, tl.broadcast_to(scale_bf16(s_raw, FMT)[:, None], v.shape))
        else:
            s_bf = _load_block_scales(s_ptr, s_row_off, mask_r, k0, stride_sk, K, FMT, SCALE_K,
                                      BLOCK_K // SCALE_K, EVEN_K, True)
            R: tl.constexpr = v.shape[0]
            NS: tl.constexpr = BLOCK_K // SCALE_K
            s_full = tl.broadcast_to(s_bf[:, :, None], (R, NS, SCALE_K)).reshape([R, BLOCK_K])
            tile = _mul_bf16(v, s_full)
    else:
        sc = tl.full(mask_r.shape, 1.0, tl.float32)
        if BLOCK_K <= SCALE_K:
            # chunk inside one scale block (both powers of two, k0 a multiple of BLOCK_K)
            s = tl.load(s_ptr + s_row_off + (k0 // SCALE_K) * stride_sk, mask=mask_r, other=0.0)
            srow = decode_scale(s, FMT)[:, None]
            v = _load_values(ptr, row_off, mask_r, k0, offs_kb, stride_k, K, FMT, EVEN_K, BLOCK_K)
            tile = (upcast(v, tl.float32) * srow).to(DOT_DTYPE)
        else:
            s = _load_block_scales(s_ptr, s_row_off, mask_r, k0, stride_sk, K, FMT, SCALE_K,
                                   BLOCK_K // SCALE_K, EVEN_K)
            v = _load_values(ptr, row_off, mask_r, k0, offs_kb, stride_k, K, FMT, EVEN_K, BLOCK_K)
            tile = _apply_block_scale(upcast(v, tl.float32), s, SCALE_K).to(DOT_DTYPE)
    return tile, sc


@triton.jit
def scaled_mma(
    a_ptr, a_s_ptr, stride_am, stride_ak, stride_asm, stride_ask,
    b_ptr, b_s_ptr, b2_ptr, b2_s_ptr, stride_bn, stride_bk, stride_bsn, stride_bsk,
    offs_m, offs_n, mask_m, mask_n, k_lo, k_hi,
    A_FMT: tl.constexpr, B_FMT: tl.constexpr, B_SCALE_ROWS: tl.constexpr,
    PROMOTE: tl.constexpr, DUAL: tl.constexpr, DOT_DTYPE: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """fp32 ``(acc, acc2)``, each [BLOCK_M, BLOCK_N]: ``sum_k A[offs_m, k] * B[offs_n, k]`` over
    ``k in [k_lo, k_hi)`` with all block scales applied (not nvfp4 global scales).
    ``acc2`` uses ``b2_ptr`` / ``b2_s_ptr`` (same shape, strides, format as B) when DUAL,
    sharing the A loads; without DUAL ``acc2`` is ``acc`` (ignore it).

    ``k_lo`` must be a multiple of BLOCK_K (and of the scale block when PROMOTE); rows /
    columns with ``mask_m`` / ``mask_n`` False and ``k >= k_hi`` read as zero.
    ``EVEN_K``: caller guarantees ``(k_hi - k_lo) % BLOCK_K == 0`` (drops the K mask).
    """
    # the quantized operand's format (B's; A's when B is the dense one: swap-AB weight-only tiles)
    Q_FMT: tl.constexpr = A_FMT if B_FMT == FMT_DENSE else B_FMT
    SCALE_K: tl.constexpr = 128 if Q_FMT == FMT_FP8_BLOCK else (16 if Q_FMT == FMT_NVFP4 else 32)
    if PROMOTE:
        tl.static_assert(SCALE_K % BLOCK_K == 0, "PROMOTE needs BLOCK_K dividing the scale block")
    else:
        tl.static_assert(Q_FMT != FMT_FP8_BLOCK, "fp8_block needs PROMOTE (fp32 scales are not exact in bf16)")
    tl.static_assert(Q_FMT != FMT_DENSE, "one operand must be quantized")
    if A_FMT != FMT_DENSE and B_FMT != FMT_DENSE:
        tl.static_assert(A_FMT == B_FMT, "A and B formats differ")
    tl.static_assert(not DUAL or B_FMT != FMT_DENSE, "DUAL needs quantized B operands")

    a_row = offs_m.to(tl.int64) * stride_am
    a_srow = offs_m.to(tl.int64) * stride_asm
    b_row = offs_n.to(tl.int64) * stride_bn
    b_srow = (offs_n // B_SCALE_ROWS).to(tl.int64) * stride_bsn
    offs_kb = tl.arange(0, BLOCK_K)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        a, sa = _load_tile(a_ptr, a_s_ptr, a_row, a_srow, mask_m, k0, offs_kb, stride_ak, stride_ask,
                           k_hi, A_FMT, SCALE_K, PROMOTE, DOT_DTYPE, EVEN_K, BLOCK_K)
        b, sb = _load_tile(b_ptr, b_s_ptr, b_row, b_srow, mask_n, k0, offs_kb, stride_bk, stride_bsk,
                           k_hi, B_FMT, SCALE_K, PROMOTE, DOT_DTYPE, EVEN_K, BLOCK_K)
        if PROMOTE:
            part = tl.dot(a, tl.trans(b))
            if A_FMT == FMT_DENSE:
                acc += part * sb[None, :]
            elif B_FMT == FMT_DENSE:
                acc += part * sa[:, None]
            else:
                acc += part * sa[:, None] * sb[None, :]
        else:
            acc = tl.dot(a, tl.trans(b), acc)
        if DUAL:
            b2, sb2 = _load_tile(b2_ptr, b2_s_ptr, b_row, b_srow, mask_n, k0, offs_kb, stride_bk, stride_bsk,
                                 k_hi, B_FMT, SCALE_K, PROMOTE, DOT_DTYPE, EVEN_K, BLOCK_K)
            if PROMOTE:
                part2 = tl.dot(a, tl.trans(b2))
                if A_FMT == FMT_DENSE:
                    acc2 += part2 * sb2[None, :]
                else:
                    acc2 += part2 * sa[:, None] * sb2[None, :]
            else:
                acc2 = tl.dot(a, tl.trans(b2), acc2)
    # nvfp4 operands dequantized by scale_bf16 carry 2**-NVFP4_BF16_SHIFT each: multiply it back
    # (a power of two: exact in fp32)
    NV_BF16: tl.constexpr = MX_BF16_DECODE and (not PROMOTE) and DOT_DTYPE == tl.bfloat16 and BLOCK_K >= 32
    SHIFT: tl.constexpr = NVFP4_BF16_SHIFT * ((A_FMT == FMT_NVFP4) + (B_FMT == FMT_NVFP4)) if NV_BF16 else 0
    if SHIFT > 0:
        acc = acc * (2.0 ** SHIFT)
        if DUAL:
            acc2 = acc2 * (2.0 ** SHIFT)
    if DUAL:
        return acc, acc2
    else:
        return acc, acc


@triton.jit
def nvfp4_output_scale(gs_a_ptr, gs_b_ptr, A_DENSE: tl.constexpr):
    """fp32 ``1 / (gs_a * gs_b)`` (``1 / gs_b`` for weight-only) from device memory."""
    gb = tl.load(gs_b_ptr).to(tl.float32)
    one = tl.full([], 1.0, tl.float32)
    if A_DENSE:
        r = tl.math.div_rn(one, gb)  # IEEE division (``/`` lowers to the approximate div.full)
    else:
        ga = tl.load(gs_a_ptr).to(tl.float32)
        r = tl.math.div_rn(one, ga * gb)
    return r
