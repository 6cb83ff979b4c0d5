"""Decode GEMV for MXFP8 / MXFP4 / NVFP4 weights (portable Triton, CUDA cores): ``out = A @ B.T``
for a few activation rows, weight-only (bf16 / fp16 A) or W x A (A quantized in B's format, its
own 1 x block scales; nvfp4 with both global scales).

PROTOTYPE (layout / instruction-count experiments).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._interp import INTERPRETING, cast_out, e4m3_to_f32
from ._mma import FMT_MXFP8, FMT_NVFP4, decode_e2m1, decode_scale, nvfp4_output_scale

#: e2m1 magnitudes 0, .5, 1, 1.5 (bytes 0-3) and 2, 3, 4, 6 (bytes 4-7) as the high byte of their
#: fp16 encoding (the low byte is 0 for all eight): the PRMT lookup table of _fp4_values
_F16_HI_LUT_0 = tl.constexpr(0x3E3C3800)
_F16_HI_LUT_1 = 0x46444240

_FP4_ASM = tl.constexpr(f"""
{{
.reg .b32 m, mh, l0, l1, f, s;
.reg .b16 h0, h1;
and.b32 m, $8, 0x77777777;
shr.u32 mh, m, 16;
prmt.b32 l0, $9, {_F16_HI_LUT_1:#x}, m;
prmt.b32 l1, $9, {_F16_HI_LUT_1:#x}, mh;
prmt.b32 f, l0, l1, 0x4C08;
shl.b32 s, $8, 12;
lop3.b32 f, f, s, 0x80008000, 0xF8;
mov.b32 {{h0, h1}}, f;
cvt.f32.f16 $0, h0;
cvt.f32.f16 $2, h1;
prmt.b32 f, l0, l1, 0x5D19;
shl.b32 s, $8, 8;
lop3.b32 f, f, s, 0x80008000, 0xF8;
mov.b32 {{h0, h1}}, f;
cvt.f32.f16 $4, h0;
cvt.f32.f16 $6, h1;
prmt.b32 f, l0, l1, 0x6E2A;
shl.b32 s, $8, 4;
lop3.b32 f, f, s, 0x80008000, 0xF8;
mov.b32 {{h0, h1}}, f;
cvt.f32.f16 $1, h0;
cvt.f32.f16 $3, h1;
prmt.b32 f, l0, l1, 0x7F3B;
lop3.b32 f, f, $8, 0x80008000, 0xF8;
mov.b32 {{h0, h1}}, f;
cvt.f32.f16 $5, h0;
cvt.f32.f16 $7, h1;
}}
""")


@triton.jit
def _fp4_values(b):
    """Packed e2m1 bytes (uint8, any shape) -> (lo, hi) fp32 values of the low / high nibble."""
    if INTERPRETING:
        bi = b.to(tl.int32)
        lo = decode_e2m1(bi & 15)
        hi = decode_e2m1((bi >> 4) & 15)
    else:
        lut = tl.full(b.shape, _F16_HI_LUT_0, tl.int32)  # a register operand (PRMT's first source)
        lo, hi = tl.inline_asm_elementwise(_FP4_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r", [b, lut],
                                           dtype=(tl.float32, tl.float32), is_pure=True, pack=4)
    return lo, hi


@triton.jit
def _load_data(ptr, mask_r, ks, K, FP4: tl.constexpr, EPS: tl.constexpr, EVEN_K: tl.constexpr,
               ROWS: tl.constexpr):
    """Stored data of the slices that start at K elements ``ks [G]``: ROWS: ``ptr``, ``mask_r``
    [R] (R weight rows) -> [G, R, SB]; else ``ptr`` one row -> [G, SB]. SB = EPS // 2 packed fp4
    bytes or EPS e4m3 values (as [.., 2, 16] above 16: every run of the last dim is <= 16 bytes,
    so that one thread owns a whole slice). Masked -> 0."""
    if FP4:
        SB: tl.constexpr = EPS // 2
        j = tl.arange(0, SB)
        off = ks[:, None] // 2 + j[None, :]  # [G, SB] byte offsets
        if EVEN_K:
            m = (ks < K)[:, None]
        else:
            m = (ks[:, None] + 2 * j[None, :]) < K
        if ROWS:
            v = tl.load(ptr[None, :, None] + off[:, None, :], mask=m[:, None, :] & mask_r[None, :, None], other=0)
        else:
            v = tl.load(ptr + off, mask=m, other=0)
    else:
        H: tl.constexpr = 2 if EPS > 16 else 1
        W: tl.constexpr = EPS // H
        j = tl.arange(0, H)[:, None] * W + tl.arange(0, W)[None, :]  # [H, W]
        off = ks[:, None, None] + j[None, :, :]  # [G, H, W]
        if EVEN_K:
            m = (ks < K)[:, None, None]
        else:
            m = off < K
        if ROWS:
            v = tl.load(ptr[None, :, None, None] + off[:, None, :, :],
                        mask=m[:, None, :, :] & mask_r[None, :, None, None], other=0.0)
            v = tl.reshape(v, (v.shape[0], v.shape[1], EPS))
        else:
            v = tl.reshape(tl.load(ptr + off, mask=m, other=0.0), (off.shape[0], EPS))
    return v


@triton.jit
def _row_partial(a_ptr, a_s_ptr, r, M, stride_am, stride_asm, stride_ask, ks, K, nsk, wa, wb, sb,
                 FMT: tl.constexpr, A_DENSE: tl.constexpr, EPS: tl.constexpr, NSB: tl.constexpr,
                 EVEN_K: tl.constexpr):
    """[G, BLOCK_N] partial dot products of activation row ``r`` with the weight slices: per slice
    sum(w * x) (an FMA chain in each thread), times the block scales (``sb`` [G, BN(, NSB)],
    and A's own for a quantized A). Rows r >= M read zeros."""
    FP4: tl.constexpr = FMT != FMT_MXFP8
    G: tl.constexpr = ks.shape[0]
    BN: tl.constexpr = sb.shape[1]
    SK: tl.constexpr = 16 if FMT == FMT_NVFP4 else 32
    ok = r < M
    row = a_ptr + r.to(tl.int64) * stride_am
    if A_DENSE:
        # [G, EPS // 8, 8]: 16-byte runs, so that one thread loads its slice's EPS values
        xoff = ks[:, None, None] + tl.arange(0, EPS // 8)[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
        if EVEN_K:
            xm = (ks < K)[:, None, None] & ok
        else:
            xm = (xoff < K) & ok
        x = tl.load(row + xoff, mask=xm, other=0.0).to(tl.float32)
        if FP4:
            xa, xb = tl.split(tl.reshape(x, (G, EPS // 2, 2)))  # even / odd elements
        else:
            xa = tl.reshape(x, (G, EPS))
            xb = xa
    else:
        v = _load_data(row, ok, ks, K, FP4, EPS, EVEN_K, False)
        if FP4:
            xa, xb = _fp4_values(v)
        else:
            xa = e4m3_to_f32(v)
            xb = xa
    if NSB > 1:
        SPB: tl.constexpr = SK // 2  # bytes per scale block
        pa = tl.sum(tl.reshape(wa * xa[:, None, :], (G, BN, NSB, SPB)), axis=3)
        pb = tl.sum(tl.reshape(wb * xb[:, None, :], (G, BN, NSB, SPB)), axis=3)
        p = pa + pb
    elif FP4:
        p = tl.sum(wa * xa[:, None, :], axis=2) + tl.sum(wb * xb[:, None, :], axis=2)
    else:
        p = tl.sum(wa * xa[:, None, :], axis=2)
    if A_DENSE:
        sc = sb
    else:
        srow = a_s_ptr + r.to(tl.int64) * stride_asm
        if NSB > 1:
            si = ks[:, None] // SK + tl.arange(0, NSB)[None, :]
            sa = decode_scale(tl.load(srow + si * stride_ask, mask=(si < nsk) & ok, other=0.0), FMT)
            sc = sb * sa[:, None, :]
        else:
            si = ks // SK
            sa = decode_scale(tl.load(srow + si * stride_ask, mask=(si < nsk) & ok, other=0.0), FMT)
            sc = sb * sa[:, None]
    if NSB > 1:
        part = tl.sum(p * sc, axis=2)
    else:
        part = p * sc
    return part


@triton.jit
def _store_row(acc, r, M, offs_n, mask_n, gs_a_ptr, gs_b_ptr, bias_ptr, c_ptr, stride_cm,
               FMT: tl.constexpr, A_DENSE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Output row ``r``: the slices' partials summed (one cross-thread reduction), nvfp4
    ``1 / (gs_a * gs_b)`` (``1 / gs_b`` weight-only), bias in fp32, one cast, masked store."""
    out = tl.sum(acc, axis=0)
    if FMT == FMT_NVFP4:
        out = out * nvfp4_output_scale(gs_a_ptr, gs_b_ptr, A_DENSE)
    if HAS_BIAS:
        out = out + tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    tl.store(c_ptr + r.to(tl.int64) * stride_cm + offs_n, cast_out(out, c_ptr.dtype.element_ty), mask=mask_n & (r < M))


@triton.jit
def mx_gemv_kernel(
    a_ptr, a_s_ptr, b_ptr, b_s_ptr, gs_a_ptr, gs_b_ptr, bias_ptr, c_ptr,
    M, N, K,
    stride_am, stride_asm, stride_ask, stride_bn, stride_bsn, stride_bsk, stride_cm,
    FMT: tl.constexpr, A_DENSE: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    tl.static_assert(BLOCK_M == 1 or BLOCK_M == 2 or BLOCK_M == 4 or BLOCK_M == 8, "BLOCK_M: 1, 2, 4 or 8")
    FP4: tl.constexpr = FMT != FMT_MXFP8
    SK: tl.constexpr = 16 if FMT == FMT_NVFP4 else 32
    EPS: tl.constexpr = 32 if BLOCK_M <= 2 else (16 if BLOCK_M <= 4 else 8)
    G: tl.constexpr = BLOCK_K // EPS
    NSB: tl.constexpr = EPS // SK if EPS > SK else 1
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    sl = tl.arange(0, G)
    b_rows = b_ptr + offs_n.to(tl.int64) * stride_bn
    bs_rows = b_s_ptr + offs_n.to(tl.int64) * stride_bsn
    nsk = tl.cdiv(K, SK)
    r0 = pid_m * BLOCK_M
    acc0 = tl.zeros((G, BLOCK_N), dtype=tl.float32)
    acc1 = tl.zeros((G, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((G, BLOCK_N), dtype=tl.float32)
    acc3 = tl.zeros((G, BLOCK_N), dtype=tl.float32)
    acc4 = tl.zeros((G, BLOCK_N), dtype=tl.float32)
    acc5 = tl.zeros((G, BLOCK_N), dtype=tl.float32)
    acc6 = tl.zeros((G, BLOCK_N), dtype=tl.float32)
    acc7 = tl.zeros((G, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + sl * EPS  # first K element of each slice
        # the weight chunk first: every byte of it in flight before any math
        w = _load_data(b_rows, mask_n, ks, K, FP4, EPS, EVEN_K, True)  # [G, BLOCK_N, SB]
        if NSB > 1:
            si = ks[:, None] // SK + tl.arange(0, NSB)[None, :]
            sb = decode_scale(tl.load(bs_rows[None, :, None] + si[:, None, :] * stride_bsk,
                                      mask=mask_n[None, :, None] & (si < nsk)[:, None, :], other=0.0), FMT)
        else:
            si = ks // SK
            sb = decode_scale(tl.load(bs_rows[None, :] + si[:, None] * stride_bsk,
                                      mask=mask_n[None, :] & (si < nsk)[:, None], other=0.0), FMT)
        if FP4:
            wa, wb = _fp4_values(w)
            if not EVEN_K:
                # odd K: the last byte's high nibble is padding (element K), whatever it holds
                hk = ks[:, None] + 2 * tl.arange(0, EPS // 2)[None, :] + 1
                wb = tl.where((hk < K)[:, None, :], wb, 0.0)
        else:
            wa = e4m3_to_f32(w)
            wb = wa
        acc0 += _row_partial(a_ptr, a_s_ptr, r0, M, stride_am, stride_asm, stride_ask, ks, K, nsk, wa, wb, sb,
                             FMT, A_DENSE, EPS, NSB, EVEN_K)
        if BLOCK_M > 1:
            acc1 += _row_partial(a_ptr, a_s_ptr, r0 + 1, M, stride_am, stride_asm, stride_ask, ks, K, nsk, wa, wb,
                                 sb, FMT, A_DENSE, EPS, NSB, EVEN_K)
        if BLOCK_M > 2:
            acc2 += _row_partial(a_ptr, a_s_ptr, r0 + 2, M, stride_am, stride_asm, stride_ask, ks, K, nsk, wa, wb,
                                 sb, FMT, A_DENSE, EPS, NSB, EVEN_K)
            acc3 += _row_partial(a_ptr, a_s_ptr, r0 + 3, M, stride_am, stride_asm, stride_ask, ks, K, nsk, wa, wb,
                                 sb, FMT, A_DENSE, EPS, NSB, EVEN_K)
        if BLOCK_M > 4:
            acc4 += _row_partial(a_ptr, a_s_ptr, r0 + 4, M, stride_am, stride_asm, stride_ask, ks, K, nsk, wa, wb,
                                 sb, FMT, A_DENSE, EPS, NSB, EVEN_K)
            acc5 += _row_partial(a_ptr, a_s_ptr, r0 + 5, M, stride_am, stride_asm, stride_ask, ks, K, nsk, wa, wb,
                                 sb, FMT, A_DENSE, EPS, NSB, EVEN_K)
            acc6 += _row_partial(a_ptr, a_s_ptr, r0 + 6, M, stride_am, stride_asm, stride_ask, ks, K, nsk, wa, wb,
                                 sb, FMT, A_DENSE, EPS, NSB, EVEN_K)
            acc7 += _row_partial(a_ptr, a_s_ptr, r0 + 7, M, stride_am, stride_asm, stride_ask, ks, K, nsk, wa, wb,
                                 sb, FMT, A_DENSE, EPS, NSB, EVEN_K)
    _store_row(acc0, r0, M, offs_n, mask_n, gs_a_ptr, gs_b_ptr, bias_ptr, c_ptr, stride_cm, FMT, A_DENSE, HAS_BIAS)
    if BLOCK_M > 1:
        _store_row(acc1, r0 + 1, M, offs_n, mask_n, gs_a_ptr, gs_b_ptr, bias_ptr, c_ptr, stride_cm, FMT, A_DENSE,
                   HAS_BIAS)
    if BLOCK_M > 2:
        _store_row(acc2, r0 + 2, M, offs_n, mask_n, gs_a_ptr, gs_b_ptr, bias_ptr, c_ptr, stride_cm, FMT, A_DENSE,
                   HAS_BIAS)
        _store_row(acc3, r0 + 3, M, offs_n, mask_n, gs_a_ptr, gs_b_ptr, bias_ptr, c_ptr, stride_cm, FMT, A_DENSE,
                   HAS_BIAS)
    if BLOCK_M > 4:
        _store_row(acc4, r0 + 4, M, offs_n, mask_n, gs_a_ptr, gs_b_ptr, bias_ptr, c_ptr, stride_cm, FMT, A_DENSE,
                   HAS_BIAS)
        _store_row(acc5, r0 + 5, M, offs_n, mask_n, gs_a_ptr, gs_b_ptr, bias_ptr, c_ptr, stride_cm, FMT, A_DENSE,
                   HAS_BIAS)
        _store_row(acc6, r0 + 6, M, offs_n, mask_n, gs_a_ptr, gs_b_ptr, bias_ptr, c_ptr, stride_cm, FMT, A_DENSE,
                   HAS_BIAS)
        _store_row(acc7, r0 + 7, M, offs_n, mask_n, gs_a_ptr, gs_b_ptr, bias_ptr, c_ptr, stride_cm, FMT, A_DENSE,
                   HAS_BIAS)
