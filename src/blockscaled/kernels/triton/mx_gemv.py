"""Decode GEMV for MXFP8 / MXFP4 / NVFP4 weights (portable Triton, CUDA cores): ``out = A @ B.T``
for 1-8 activation rows per program, weight-only (bf16 / fp16 A) or W x A (A quantized in B's
format with its own 1 x 32 / 1 x 16 block scales; nvfp4 with both fp32 global scales).

Why: at decode sizes the GEMM is a stream of the packed weights, and what decides the time is how
many bytes each SM keeps in flight (kernels/triton/gemv.py, the fp8_block GEMV: MANY SHORT
programs that load a whole 8-16 KB chunk before any math reached 59-97 % of the floor on the
H100; benchmarks/NOTES.md 2026-11-22). The same structure here: a program owns BLOCK_N whole
weight rows (no K split, no reduction between programs: deterministic) and walks K in chunks of
BLOCK_K; each chunk's weights (and scales and activations) are loaded before its math.

Layout. A chunk is G = BLOCK_K / SLICE slices; one thread owns one slice (SLICE consecutive K
elements: 32 = 16 packed fp4 bytes, one 128-bit load, for 1-2 activation rows; 16 for 4; 8 for
8, where registers run out: config.gemm.gemv_slice_elems) of each of the program's BLOCK_N rows,
so every tensor is [G, ...] with G across the threads and the rows in registers. Every load's
last dimension is a run of at most 16 contiguous bytes (dense activations of a slice load as
[G, SLICE // 8, 8]): Triton gives a wider contiguous run to several threads, and the activations
of a slice would then reach their thread through shared memory.

Math, fp32 on the CUDA cores. Packed e2m1 (low nibble = even element) is decoded four bytes at a
time by PTX (``_FP4_ASM``): the magnitudes' fp16 high bytes come from a PRMT lookup table, pairs
of nibbles 16 bits apart get their signs with one shift and one LOP3, and each fp16 value becomes
fp32 exactly (e2m1 values are exact in fp16); e4m3 converts with Triton's cast (cvt e4m3x2 ->
f16x2 -> f32). Per slice and row the products are summed by an FMA chain inside the thread (even
and odd elements in two chains for fp4), then the block scale is applied once to that partial
sum (one multiply per 32 or 16 elements; for a quantized A the product of both block scales,
``sb * sa``); the partials of a row accumulate in [G, BLOCK_N] registers across chunks and are
summed over the threads once, at the end. Epilogue as kernels/triton/gemm.py: nvfp4
``* 1/(gs_a*gs_b)`` (``1/gs_b`` weight-only, ``div_rn``), bias in fp32, one cast. Every product
of decoded values is exact in fp32; only the summation order differs from the tensor-core kernels
and the float64 reference (the same tolerance table).

sm_90 SASS of the K loop (tests/test_aot_mx_gemv.py; 8 weight rows, 1 activation row, 4 warps):
~10 instructions per mxfp4 / nvfp4 weight byte (decode ~5.8, FMAs 2, activations and addresses
the rest), ~3.5 per mxfp8 byte; each further activation row adds an FMA per weight element.

Rows: BLOCK_M activation rows (1, 2, 4 or 8) per program, unrolled into eight accumulators (the
unused ones fold away); rows past M read zeros and are not stored. K not a multiple of 32
(EVEN_K False): per-element masks (byte loads; correct, slower) and the odd-K padding nibble is
zeroed. NaN / Inf propagate (E8M0 255 decodes to NaN). PTX False (a non-NVIDIA build) and the
interpreter decode fp4 with the portable integer path of kernels/triton/_mma.py.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._interp import INTERPRETING, cast_out, e4m3_to_f32
from ._mma import FMT_MXFP8, FMT_NVFP4, decode_e2m1, decode_scale, nvfp4_output_scale

#: e2m1 magnitudes 0, .5, 1, 1.5 (bytes 0-3) and 2, 3, 4, 6 (bytes 4-7) as the high byte of
#: their fp16 encodings (the low bytes are all 0): the PRMT lookup table of _FP4_ASM
_F16_HI_LUT = (0x3E3C3800, 0x46444240)

#: 4 packed e2m1 bytes ($8) -> 8 fp32 values: $0-$3 the low nibbles of bytes 0-3, $4-$7 the high
#: nibbles. Nibble j of the word (element j) and nibble j + 4 sit 16 bits apart: PRMT picks both
#: magnitudes' fp16 high bytes from l0 / l1 (the table applied to nibbles 0-3 / 4-7; selector
#: nibbles 8-15 read a byte's sign, 0 for the table: the fp16 low bytes) into one f16x2, one shift
#: moves both sign bits to bits 15 and 31, and the two halves convert to fp32 (exact).
_FP4_ASM = tl.constexpr(f"""
{{
.reg .b32 m, mh, l0, l1, f, s;
.reg .b16 h0, h1;
and.b32 m, $8, 0x77777777;
shr.u32 mh, m, 16;
prmt.b32 l0, {_F16_HI_LUT[0]:#x}, {_F16_HI_LUT[1]:#x}, m;
prmt.b32 l1, {_F16_HI_LUT[0]:#x}, {_F16_HI_LUT[1]:#x}, mh;
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


def _mx_gemv_repr(specialization):
    c = specialization.constants
    names = {1: "mxfp8", 2: "mxfp4", 3: "nvfp4"}
    return (f"bs_gemv_{'dense' if c.get('A_DENSE') else names.get(c.get('FMT'), '?')}x{names.get(c.get('FMT'), '?')}"
            f"_{c.get('BLOCK_M')}x{c.get('BLOCK_N')}x{c.get('BLOCK_K')}_s{c.get('SLICE')}")


def _mx_gemv_launch_metadata(grid, kernel, args):
    """Profiler metadata: name with M/N/K and tiles, FLOPs, bytes (packed weights and scales,
    activations, output)."""
    m, n, k = args["M"], args["N"], args["K"]
    fmt = args.get("FMT", 2)
    eb = 1.0 if fmt == 1 else 0.5
    sk = 16 if fmt == 3 else 32
    nk = -(-k // sk)
    a_bytes = m * k * args["a_ptr"].element_size() if args.get("A_DENSE") else m * (k * eb + nk)
    nbytes = n * (k * eb + nk) + a_bytes + m * n * args["c_ptr"].element_size()
    return {"name": f"{kernel.name} [M={m}, N={n}, K={k}, rows={args.get('BLOCK_N')}, chunk={args.get('BLOCK_K')}]",
            "flops": 2.0 * m * n * k, "bytes": int(nbytes)}


@triton.jit
def _fp4_values(b, PTX: tl.constexpr):
    """Packed e2m1 bytes (uint8, any shape with a multiple of 4 elements per thread) -> fp32
    values (lo, hi) of the low / high nibbles, i.e. of the even / odd elements."""
    if INTERPRETING or not PTX:
        bi = b.to(tl.int32)
        lo = decode_e2m1(bi & 15)
        hi = decode_e2m1((bi >> 4) & 15)
    else:
        lo, hi = tl.inline_asm_elementwise(_FP4_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r", [b],
                                           dtype=(tl.float32, tl.float32), is_pure=True, pack=4)
    return lo, hi


@triton.jit
def _load_data(ptr, mask_r, ks, K, FP4: tl.constexpr, SLICE: tl.constexpr, EVEN_K: tl.constexpr,
               ROWS: tl.constexpr):
    """Stored data of the slices that start at K elements ``ks [G]``. ROWS: ``ptr`` / ``mask_r``
    are [R] (R weight rows) -> [G, R, SB]; else ``ptr`` is one row, ``mask_r`` a scalar -> [G, SB].
    SB = SLICE // 2 packed fp4 bytes or SLICE e4m3 values (loaded as [.., 2, 16] above 16: the
    runs of the last dimension stay <= 16 bytes, one thread per slice). Masked -> 0."""
    if FP4:
        SB: tl.constexpr = SLICE // 2
        j = tl.arange(0, SB)
        off = ks[:, None] // 2 + j[None, :]  # [G, SB] byte offsets
        if EVEN_K:
            m = (ks < K)[:, None]  # whole slices: the mask is constant along a slice (vector loads)
        else:
            m = (ks[:, None] + 2 * j[None, :]) < K
        if ROWS:
            v = tl.load(ptr[None, :, None] + off[:, None, :], mask=m[:, None, :] & mask_r[None, :, None], other=0)
        else:
            v = tl.load(ptr + off, mask=m & mask_r, other=0)
    else:
        H: tl.constexpr = 2 if SLICE > 16 else 1
        W: tl.constexpr = SLICE // H
        j = tl.arange(0, H)[:, None] * W + tl.arange(0, W)[None, :]  # [H, W]
        off = ks[:, None, None] + j[None, :, :]  # [G, H, W]
        if EVEN_K:
            m = (ks < K)[:, None, None]
        else:
            m = off < K
        if ROWS:
            v = tl.load(ptr[None, :, None, None] + off[:, None, :, :],
                        mask=m[:, None, :, :] & mask_r[None, :, None, None], other=0.0)
            v = tl.reshape(v, (v.shape[0], v.shape[1], SLICE))
        else:
            v = tl.reshape(tl.load(ptr + off, mask=m & mask_r, other=0.0), (off.shape[0], SLICE))
    return v


@triton.jit
def _load_scales(s_row, mask_r, ks, nsk, stride_sk, SK: tl.constexpr, NSB: tl.constexpr, ROWS: tl.constexpr):
    """Raw block scales of the slices ``ks [G]``: ROWS: rows ``s_row [R]`` -> [G, R] (one block
    per slice) or [G, R, NSB] (a slice spans NSB blocks: nvfp4 with 32-element slices); else one
    row -> [G] or [G, NSB]. Blocks at or past K read 0 (never the E8M0 NaN code 255) and scale
    zero partials."""
    if NSB > 1:
        si = ks[:, None] // SK + tl.arange(0, NSB)[None, :]  # [G, NSB]
        if ROWS:
            s = tl.load(s_row[None, :, None] + si[:, None, :] * stride_sk,
                        mask=mask_r[None, :, None] & (si < nsk)[:, None, :], other=0.0)
        else:
            s = tl.load(s_row + si * stride_sk, mask=(si < nsk) & mask_r, other=0.0)
    else:
        si = ks // SK
        if ROWS:
            s = tl.load(s_row[None, :] + si[:, None] * stride_sk, mask=mask_r[None, :] & (si < nsk)[:, None],
                        other=0.0)
        else:
            s = tl.load(s_row + si * stride_sk, mask=(si < nsk) & mask_r, other=0.0)
    return s


@triton.jit
def _row_partial(a_ptr, a_s_ptr, r, M, stride_am, stride_asm, stride_ask, ks, K, nsk, wa, wb, sb,
                 FMT: tl.constexpr, A_DENSE: tl.constexpr, SLICE: tl.constexpr, NSB: tl.constexpr,
                 EVEN_K: tl.constexpr, PTX: tl.constexpr):
    """[G, BN] partial dot products of activation row ``r`` with the chunk's weight slices:
    per slice sum(w * x) (FMA chains inside the thread; fp4: ``wa`` / ``wb`` even / odd
    elements), times the block scales ``sb`` [G, BN(, NSB)] (times A's own when quantized).
    Rows r >= M read zeros."""
    FP4: tl.constexpr = FMT != FMT_MXFP8
    SK: tl.constexpr = 16 if FMT == FMT_NVFP4 else 32
    G: tl.constexpr = ks.shape[0]
    BN: tl.constexpr = sb.shape[1]
    ok = r < M
    row = a_ptr + r.to(tl.int64) * stride_am
    if A_DENSE:
        # [G, SLICE // 8, 8]: 16-byte runs, one thread loads its slice's SLICE values
        xoff = ks[:, None, None] + tl.arange(0, SLICE // 8)[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
        if EVEN_K:
            xm = (ks < K)[:, None, None] & ok
        else:
            xm = (xoff < K) & ok
        x = tl.load(row + xoff, mask=xm, other=0.0).to(tl.float32)
        if FP4:
            xa, xb = tl.split(tl.reshape(x, (G, SLICE // 2, 2)))  # even / odd elements
        else:
            xa = tl.reshape(x, (G, SLICE))
            xb = xa
    else:
        v = _load_data(row, ok, ks, K, FP4, SLICE, EVEN_K, False)
        if FP4:
            xa, xb = _fp4_values(v, PTX)
        else:
            xa = e4m3_to_f32(v)
            xb = xa
    if NSB > 1:
        SPB: tl.constexpr = SK // 2  # packed bytes per scale block
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
        sa = decode_scale(_load_scales(a_s_ptr + r.to(tl.int64) * stride_asm, ok, ks, nsk, stride_ask, SK, NSB,
                                       False), FMT)
        if NSB > 1:
            sc = sb * sa[:, None, :]
        else:
            sc = sb * sa[:, None]
    if NSB > 1:
        part = tl.sum(p * sc, axis=2)
    else:
        part = p * sc
    return part


@triton.jit
def _store_row(acc, r, M, offs_n, mask_n, gs_a_ptr, gs_b_ptr, bias_ptr, c_ptr, stride_cm,
               FMT: tl.constexpr, A_DENSE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Output row ``r``: the slices' partials summed over the threads, nvfp4 ``1/(gs_a*gs_b)``
    (``1/gs_b`` weight-only), bias in fp32, one cast (round to nearest even), masked store."""
    out = tl.sum(acc, axis=0)
    if FMT == FMT_NVFP4:
        out = out * nvfp4_output_scale(gs_a_ptr, gs_b_ptr, A_DENSE)
    if HAS_BIAS:
        out = out + tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    tl.store(c_ptr + r.to(tl.int64) * stride_cm + offs_n, cast_out(out, c_ptr.dtype.element_ty),
             mask=mask_n & (r < M))


@triton.jit(repr=_mx_gemv_repr, launch_metadata=_mx_gemv_launch_metadata)
def mx_gemv_kernel(
    a_ptr, a_s_ptr, b_ptr, b_s_ptr, gs_a_ptr, gs_b_ptr, bias_ptr, c_ptr,
    M, N, K,
    stride_am, stride_asm, stride_ask, stride_bn, stride_bsn, stride_bsk, stride_cm,
    FMT: tl.constexpr, A_DENSE: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SLICE: tl.constexpr,
    PTX: tl.constexpr,
):
    """``c[M, N] = A[M, K] @ B[N, K].T`` (+ bias) for B in FMT (1 mxfp8, 2 mxfp4, 3 nvfp4).

    B: data ``[N, K']`` (e4m3, or uint8 packed fp4 with K' = ceil(K/2)), unit K stride; scales
    ``[N, ceil(K/SK)]`` (E8M0 uint8 per 32, e4m3 per 16 for nvfp4). A_DENSE: A is bf16 / fp16
    ``[M, K]``; else A is quantized like B with scales ``[M, ceil(K/SK)]``. ``gs_a_ptr`` /
    ``gs_b_ptr``: nvfp4 fp32 global scales (0-d; read only for nvfp4, gs_a only with a quantized
    A). Bias: fp32-added before the cast; c: bf16 / fp16 / fp32, unit N stride.
    Grid: (cdiv(N, BLOCK_N) * cdiv(M, BLOCK_M),), activation-row blocks fastest. BLOCK_M in
    {1, 2, 4, 8} activation rows, BLOCK_N (<= 8) weight rows, BLOCK_K K elements per chunk, a
    power-of-two multiple of SLICE (32, 16 or 8: K elements per thread and row). EVEN_K: K % 32 == 0 (whole slices: vector loads). PTX: inline PTX allowed."""
    tl.static_assert(BLOCK_M == 1 or BLOCK_M == 2 or BLOCK_M == 4 or BLOCK_M == 8, "BLOCK_M: 1, 2, 4 or 8")
    tl.static_assert(BLOCK_K % SLICE == 0, "BLOCK_K must be a multiple of SLICE")
    FP4: tl.constexpr = FMT != FMT_MXFP8
    SK: tl.constexpr = 16 if FMT == FMT_NVFP4 else 32
    G: tl.constexpr = BLOCK_K // SLICE
    NSB: tl.constexpr = SLICE // SK if SLICE > SK else 1  # scale blocks per slice
    # activation-row blocks fastest: the programs that share weight rows run next to each other,
    # so all but the first read the weights from L2
    num_m = tl.cdiv(M, BLOCK_M)
    pid = tl.program_id(0)
    pid_m = pid % num_m
    pid_n = pid // num_m
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
        ks = k0 + sl * SLICE  # first K element of each slice
        # the weight chunk first: every byte of it in flight before any math
        w = _load_data(b_rows, mask_n, ks, K, FP4, SLICE, EVEN_K, True)  # [G, BLOCK_N, SB]
        sb = decode_scale(_load_scales(bs_rows, mask_n, ks, nsk, stride_bsk, SK, NSB, True), FMT)
        if FP4:
            wa, wb = _fp4_values(w, PTX)
            if not EVEN_K:
                # odd K: the last byte's high nibble is padding (element K), whatever it holds
                hk = ks[:, None] + 2 * tl.arange(0, SLICE // 2)[None, :] + 1
                wb = tl.where((hk < K)[:, None, :], wb, 0.0)
        else:
            wa = e4m3_to_f32(w)
            wb = wa
        acc0 += _row_partial(a_ptr, a_s_ptr, r0, M, stride_am, stride_asm, stride_ask, ks, K, nsk, wa, wb, sb,
                             FMT, A_DENSE, SLICE, NSB, EVEN_K, PTX)
        if BLOCK_M > 1:
            acc1 += _row_partial(a_ptr, a_s_ptr, r0 + 1, M, stride_am, stride_asm, stride_ask, ks, K, nsk, wa, wb,
                                 sb, FMT, A_DENSE, SLICE, NSB, EVEN_K, PTX)
        if BLOCK_M > 2:
            acc2 += _row_partial(a_ptr, a_s_ptr, r0 + 2, M, stride_am, stride_asm, stride_ask, ks, K, nsk, wa, wb,
                                 sb, FMT, A_DENSE, SLICE, NSB, EVEN_K, PTX)
            acc3 += _row_partial(a_ptr, a_s_ptr, r0 + 3, M, stride_am, stride_asm, stride_ask, ks, K, nsk, wa, wb,
                                 sb, FMT, A_DENSE, SLICE, NSB, EVEN_K, PTX)
        if BLOCK_M > 4:
            acc4 += _row_partial(a_ptr, a_s_ptr, r0 + 4, M, stride_am, stride_asm, stride_ask, ks, K, nsk, wa, wb,
                                 sb, FMT, A_DENSE, SLICE, NSB, EVEN_K, PTX)
            acc5 += _row_partial(a_ptr, a_s_ptr, r0 + 5, M, stride_am, stride_asm, stride_ask, ks, K, nsk, wa, wb,
                                 sb, FMT, A_DENSE, SLICE, NSB, EVEN_K, PTX)
            acc6 += _row_partial(a_ptr, a_s_ptr, r0 + 6, M, stride_am, stride_asm, stride_ask, ks, K, nsk, wa, wb,
                                 sb, FMT, A_DENSE, SLICE, NSB, EVEN_K, PTX)
            acc7 += _row_partial(a_ptr, a_s_ptr, r0 + 7, M, stride_am, stride_asm, stride_ask, ks, K, nsk, wa, wb,
                                 sb, FMT, A_DENSE, SLICE, NSB, EVEN_K, PTX)
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
