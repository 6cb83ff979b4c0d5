"""Triton bodies of the quantizers, dequantizers, tensor amax and fused SiLU-mul-quantize.

Numerics: bit-for-bit the pure-torch reference (``blockscaled.reference.quantize``), which is
the definition. What that takes (each point was a mismatch before it was handled):

* fp32 division is ``tl.math.div_rn`` (IEEE round-to-nearest; plain ``/`` lowers to the
  approximate ``div.full.f32`` on sm_90). A division by a power of two is a multiplication by
  its exact reciprocal (the same correctly rounded result, denormals included). fp8_block EXACT
  divides every element by its block scale: one IEEE reciprocal per block and an FMA
  correction per element (:func:`_div_by_block_scale`, Markstein), the IEEE quotient.
* Block amax is a NaN-propagating max of ``|x|`` (``max.NaN.f32``; ``tl.max`` on floats ignores
  NaN in the interpreter and on the GPU). The tensor amax (nvfp4) is an int32 max over the bit
  patterns of ``|x|`` (non-negative floats: integer order = float order, NaN above +Inf).
* NaN payloads and signs (fp32 / e4m3 outputs) are outside the contract; e2m1 has no NaN code
  and the reference encodes every NaN as the positive code 7, so no NaN-sign bookkeeping.
* e4m3: on the GPU the hardware ``cvt.rn.satfinite`` (RNE, saturating = torch's clamp then
  cast); in the interpreter integer rounding (its cast drops the carry into the next binade).
* fp32 -> bf16 (SiLU intermediates, bf16 dequantize): RNE from the bit pattern (the
  interpreter's cast truncates).
* e2m1: one float add on a magic number (:func:`_e2m1_codes`), proved equal to the
  reference's threshold chain on all 2**32 fp32 inputs. E8M0 and power-of-two scales from
  the fp32 bit pattern, as in the reference.

Layouts: inputs are ``[rows, K]`` with a row stride and unit last-dim stride (the launcher
flattens leading dims without copying); outputs are contiguous ``[rows, packed K]`` data and
row-major ``[rows, ceil(K / block)]`` scales.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._interp import INTERPRETING, e4m3_to_f32

# Format / rounding codes (constexpr kernel arguments).
FMT_FP8_BLOCK = tl.constexpr(0)
FMT_MXFP8 = tl.constexpr(1)
FMT_MXFP4 = tl.constexpr(2)
FMT_NVFP4 = tl.constexpr(3)
ROUND_EXACT = tl.constexpr(0)
ROUND_RCEIL = tl.constexpr(1)
ROUND_FLOOR = tl.constexpr(2)
ROUND_NVFP4 = tl.constexpr(3)
# nvfp4 global scale source: 1 = read gs from a pointer, 2 = compute gs from the tensor amax.
GS_GIVEN = tl.constexpr(1)
GS_FROM_AMAX = tl.constexpr(2)

FMT_NAMES = ("fp8_block", "mxfp8", "mxfp4", "nvfp4")


# --------------------------------------------------------------------------- scalar helpers
@triton.jit
def _bits(v):
    return v.to(tl.int32, bitcast=True)


@triton.jit
def _f32(b):
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _max_nan(a, b):
    """NaN-propagating max (``max.NaN.f32``): the block amax is NaN if any element is."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _block_amax(xf, AXIS: tl.constexpr):
    """max |x| along AXIS (fp32; NaN if any element is NaN, payload unspecified). One
    ``max.NaN.f32`` per element (|x| is a free operand modifier in SASS).

    In the interpreter a reduction with our own combine function runs it element by element in
    Python (a 2048 x 128 mxfp8 quantize took 23 s, 92 % of it here); ``tl.max`` there is numpy's
    ``nanmax``, so the NaN case is added from a count of NaNs (same result, bit for bit)."""
    if INTERPRETING:
        a = tl.where(xf != xf, 0.0, tl.abs(xf))  # (an all-NaN block would make nanmax warn)
        nans = tl.sum((xf != xf).to(tl.int32), AXIS)
        out = tl.where(nans > 0, float("nan"), tl.max(a, AXIS))
    else:
        out = tl.reduce(tl.abs(xf), AXIS, _max_nan)
    return out


@triton.jit
def _e4m3_bytes(v, HW_CVT: tl.constexpr):
    """fp32 -> float8_e4m3fn bits (uint8): clamp to +-448, round to nearest even, NaN -> NaN
    (0x7F / 0xFF; the NaN's sign is outside the contract).

    HW_CVT (GPU): the hardware cast, ``cvt.rn.satfinite.e4m3x2.f32`` on sm_90: RNE, finite
    values beyond +-448 and +-Inf saturate to +-448 (= torch's clamp then cast), NaN -> 0x7F.
    Otherwise integer rounding: the triton 3.6 interpreter's cast loses the carry when the
    mantissa rounds up into the next binade (127.9 -> 64); this path is exact everywhere and
    is the fallback should a GPU disagree (flip HW_CVT in the launcher)."""
    if HW_CVT:
        return v.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    c = tl.minimum(tl.maximum(v, -448.0), 448.0)
    a = _bits(c) & 0x7FFFFFFF
    # normal e4m3 (|c| >= 2**-6): keep 3 mantissa bits, round half to even on the integer
    # pattern (a carry into the exponent is the correct result), rebias 127 -> 7.
    r = a + 0x7FFFF + ((a >> 20) & 1)
    normal = (r >> 20) - ((127 - 7) << 3)
    # subnormal e4m3 (|c| < 2**-6): code = rne(|c| * 2**9); |c| * 512 is exact and adding
    # 2**23 rounds it to an integer, half to even (code 8 is 2**-6, the first normal).
    f = _f32(a) * 512.0
    sub = _bits(f + 8388608.0) - 0x4B000000
    code = tl.where(a < 0x3C800000, sub, normal) | ((_bits(v) >> 24) & 0x80)
    code = tl.where(v != v, tl.where(_bits(v) < 0, 0xFF, 0x7F), code)
    return code.to(tl.uint8)


@triton.jit
def _e2m1_codes(v, GPU: tl.constexpr):
    """fp32 -> e2m1 codes (int32 0..15): RNE, saturating to +-6, NaN -> +6 (code 7), the
    sign from the fp32 sign bit (-0.1 -> code 8). Equal to the reference's threshold chain on
    all 2**32 fp32 inputs (checked exhaustively with numpy; tests/test_quantize.py sweeps the
    interesting ranges).

    How: clamp to [-6, 6] (PTX ``min/max.f32`` return the non-NaN operand, so NaN -> +6).
    The e2m1 grid step near |v| is ``2**(m - 1)`` with ``m = max(floor(log2|v|), 0)`` in
    {0, 1, 2} (0.5 on [0, 2), 1 on [2, 4), 2 on [4, 6]). Add to |v| the magic
    ``c = 2**(m + 22) + (2m + 8 * sign) * 2**(m - 1)``, whose fp32 ulp is exactly that step:
    the IEEE add rounds |v| to the grid, ties to even (the offset 2m + 8 sign is even, so the
    parity of the rounded step count k decides the tie as in the reference), and leaves
    ``8 sign + 2m + k`` = the code in the low 4 mantissa bits of the sum. Returns the sum's
    bits: the caller takes ``& 15`` (the fp4 packing folds it into its nibble merge). Per
    element: 3 FP min/max, 1 FP add, 2 shifts, 1 LOP3 and 1 multiply-add (the threshold chain
    was 7 setp + 7 selp + sign and NaN fix-ups)."""
    if not GPU:
        # the interpreter's minimum/maximum are numpy's (NaN-propagating): map NaN to +6 here
        v = tl.where(v != v, 6.0, v)
    v2 = tl.maximum(tl.minimum(v, 6.0), -6.0)
    a = tl.abs(v2)
    # biased exponent of max(|v|, 1) = 127 + m; c bits = 0x4A800000 (2**22) + m * (2**23 + 2)
    # + 8 * sign = (127 + m) * 0x800002 + (0x4A800000 - 127 * 0x800002) + 8 * sign
    eb = _bits(tl.maximum(a, 1.0)) >> 23
    # (0x0AFFFF02 has bit 3 clear, so "| sign8" adds it: one LOP3 for sign and constant)
    c = _f32(eb * 0x800002 + (((_bits(v2) >> 28) & 8) | (0x4A800000 - 127 * 0x800002)))
    return _bits(a + c)  # the code is bits & 15; the packing masks it (one op per pair)


@triton.jit
def _e2m1_decode(code):
    """e2m1 codes (int32 0..15) -> fp32 (0, .5, 1, 1.5, 2, 3, 4, 6 and negatives)."""
    m = code & 7
    # m >= 2: 2**((m >> 1) - 1) * (1 + (m & 1) / 2) built from the bit pattern.
    big = _f32((((m >> 1) + 126) << 23) | ((m & 1) << 22))
    mag = tl.where(m >= 2, big, tl.where(m == 1, 0.5, 0.0))
    # sign via the bit (Triton's unary minus is 0 - x, which turns -0 into +0)
    return _f32(_bits(mag) | ((code & 8) << 28))


@triton.jit
def _pow2_ceil(v):
    """Positive normal fp32 rounded up to a power of two via the bits; non-finite unchanged."""
    b = _bits(v)
    e = (b >> 23) & 0xFF
    up = e + ((b & 0x7FFFFF) != 0).to(tl.int32)
    out = _f32(up << 23)
    return tl.where(e == 255, v, out)


@triton.jit
def _fp8_block_scale(amax, ROUND: tl.constexpr):
    """fp32 scale = max(amax / 448, 2**-126) (NaN stays NaN); RCEIL: rounded up to 2**k."""
    s = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
    s = tl.where(s < 1.1754943508222875e-38, 1.1754943508222875e-38, s)
    if ROUND == ROUND_RCEIL:
        s = _pow2_ceil(s)
    return s


@triton.jit
def _fma(a, b, c, GPU: tl.constexpr):
    """Fused a * b + c, one rounding. The triton 3.6 interpreter's fma is an unfused numpy
    a * b + c; there it is emulated in float64 (exact product; the sum is exact for the
    remainder below and rounds twice only on an exact fp32 midpoint, which the quotient
    correction never produced in 41M numpy-checked cases)."""
    if GPU:
        return tl.fma(a, b, c)
    else:
        return tl.fma(a.to(tl.float64), b.to(tl.float64), c.to(tl.float64)).to(tl.float32)


@triton.jit
def _div_by_block_scale(xf, s, GPU: tl.constexpr):
    """IEEE ``xf [R, G, BK] / s [R, G]`` (correctly rounded where the e4m3 result depends on
    it) with one reciprocal per block and 4 FMA-pipe ops per element, instead of a
    ``div.rn.f32`` per element (~8 instructions incl. MUFU.RCP and a slow-path branch).

    Per block: ``p = 2**(127 - e_s)`` (exact power of two), ``s' = s * p`` in [1, 2),
    ``y = RN(1 / s')`` (one IEEE division). Per element: ``x' = x * p`` (exact unless it
    underflows, and then ``|x / s| < 2**-126`` encodes as e4m3 +-0 either way), ``q = RN(x' y)``
    (faithful), ``r = fma(q, s', -x')`` (exact), ``q' = fma(r, -y, q)`` = RN(x / s) by Markstein's
    theorem (y correctly rounded, q faithful, no underflow). The remainder is taken as
    ``q s' - x'`` and subtracted so that signed zeros come out as IEEE division gives them
    (x = -0: q = -0, r = +0, q' = -0 + -0 = -0). s = Inf (Inf block): p = 1, s' = 0, y = 0
    gives +-0 for finite x and NaN for x = +-Inf, like x / Inf; s = NaN: NaN. Checked against
    numpy float32 division on 41M (x, s) pairs over all scale exponents, e4m3 ties, bf16/fp32
    inputs and denormal quotients (FMAs emulated exactly): 0 fp32 mismatches."""
    e = (_bits(s) >> 23) & 0xFF
    finite = e != 255
    p = tl.where(finite, _f32((254 - e) << 23), 1.0)
    sp = tl.where(finite, s * p, tl.where(s != s, s, 0.0))
    y = tl.where(sp == 0.0, 0.0, tl.math.div_rn(tl.full(sp.shape, 1.0, tl.float32), tl.where(sp == 0.0, 1.0, sp)))
    # Negations ride on the per-block constants (-p, -y): multiplying by a negated operand is
    # an exact IEEE negation, signed zeros included (Triton's unary minus is 0 - v: -0 -> +0).
    npb = tl.broadcast_to((0.0 - p)[:, :, None], xf.shape)
    sb = tl.broadcast_to(sp[:, :, None], xf.shape)
    ny = _f32(_bits(y) ^ -2147483648)  # -y, also -0 for y = +0 (Inf block)
    nyb = tl.broadcast_to(ny[:, :, None], xf.shape)
    xn = xf * npb  # -x'
    q = xn * nyb  # x' y
    r = _fma(q, sb, xn, GPU)  # q s' - x'
    qc = _fma(r, nyb, q, GPU)  # q - r y
    # Sign from x (s > 0): Triton flushes fp32 denormals on the GPU (libdevice FTZ reflect), so
    # for quotients below 2**-126 the FMA chain above can return a zero of the wrong sign
    # ((+0) + (-0) = +0); seen on the H100 as e4m3 0x00 where IEEE division gives 0x80.
    return _f32((_bits(qc) & 0x7FFFFFFF) | (_bits(xf) & -2147483648))


@triton.jit
def _e8m0_biased(amax, ELEM_MAX: tl.constexpr, ELEM_EMAX: tl.constexpr, ROUND: tl.constexpr):
    """Biased E8M0 exponent (int32 0..255) of an MX block (reference ``e8m0_scale``)."""
    if ROUND == ROUND_FLOOR:
        e = (_bits(amax) >> 23) & 0xFF
        b = tl.minimum(tl.maximum(e - ELEM_EMAX, 0), 254)
    else:
        v = tl.math.div_rn(amax, tl.full(amax.shape, ELEM_MAX, tl.float32))
        bv = _bits(v)
        e = (bv >> 23) & 0xFF
        b = e + ((bv & 0x7FFFFF) != 0).to(tl.int32)
        b = tl.where(bv <= 0x00400000, 0, b)
        b = tl.minimum(tl.maximum(b, 0), 254)
    return tl.where(e == 255, 255, b)


@triton.jit
def _e8m0_reciprocal(b):
    """fp32 2**(127 - b) for b in 0..253 (exact, from bits); +NaN for 255."""
    r = _f32(tl.maximum(254 - b, 0) << 23)
    return tl.where(b == 255, _f32(tl.full(b.shape, 0x7FC00000, tl.int32)), r)


@triton.jit
def _nvfp4_gs_from_amax(amax):
    """Reference ``nvfp4_global_scale``: IEEE ``2688 / amax``, 1.0 for amax == 0, capped at
    the largest fp32 (tiny amax), NaN for NaN amax, 0 for infinite amax."""
    num = tl.full(amax.shape, 2688.0, tl.float32)
    den = tl.where(amax == 0.0, 1.0, amax)  # (the 0 lane is replaced below: no division by 0)
    gs = tl.where(amax == 0.0, 1.0, tl.math.div_rn(num, den))
    return tl.where(gs > 3.4028234663852886e38, 3.4028234663852886e38, gs)


@triton.jit
def _round_bf16(v):
    """fp32 -> the nearest bf16 value (ties to even), still as fp32, from the bit pattern.
    (The triton 3.6 interpreter's fp32 -> bf16 cast truncates; the GPU's is RNE. Casting the
    result to bf16 is exact on both.) Overflow rounds to Inf; NaN stays NaN."""
    b = _bits(v)
    r = (b + 0x7FFF + ((b >> 16) & 1)) & -65536
    return tl.where(v != v, v, _f32(r))


# --------------------------------------------------------------------------- 1 x BK quantize
@triton.jit
def _quantize_tile(xf, amax, gs, FMT: tl.constexpr, ROUND: tl.constexpr, HW_CVT: tl.constexpr,
                   GPU: tl.constexpr):
    """Quantize an fp32 tile ``xf [R, G, BK]`` with its block amax ``[R, G]``.

    Returns (codes [R, G, BK] uint8 e4m3 bytes or int32 e2m1 codes in the low 4 bits (see
    ``_e2m1_codes``), scale [R, G] in its
    storage type: fp32 / uint8 E8M0 / uint8 e4m3 bits). Per-element work is one multiply (or
    the IEEE division of fp8_block EXACT) and the element encode; everything else is per block.
    NaN and Inf need no per-element fix-up: a NaN/Inf block has a NaN (or infinite, fp8_block)
    scale whose reciprocal turns every element into NaN / +-0, which the encoders map to the
    reference's bits (e4m3 NaN; e2m1 code 7)."""
    if FMT == FMT_FP8_BLOCK:
        s = _fp8_block_scale(amax, ROUND)
        if ROUND == ROUND_RCEIL:
            # s is a power of two in [2**-126, 2**120], so x / s == x * 2**(127 - e) exactly
            # (one correctly rounded result of the same real, denormals included). s = Inf:
            # x * 0 gives the +-0 and the NaN (Inf * 0) that x / Inf gives; s = NaN: NaN.
            inv = _f32(254 * 8388608 - _bits(s))
            inv = tl.where(s == float("inf"), 0.0, tl.where(s != s, s, inv))
            q = xf * tl.broadcast_to(inv[:, :, None], xf.shape)
        else:
            q = _div_by_block_scale(xf, s, GPU)
        return _e4m3_bytes(q, HW_CVT), s
    elif FMT == FMT_NVFP4:
        # Per block (reference order): t = (gs * amax) / 6 (IEEE), NaN for an infinite amax
        # (an Inf block dequantizes to NaN, also with a user gs), sf = e4m3(t), inv = gs / sf
        # (0 where sf == 0). Then one multiply per element.
        t = tl.math.div_rn(gs * amax, tl.full(amax.shape, 6.0, tl.float32))
        t = tl.where(amax == float("inf"), float("nan"), t)
        sf = _e4m3_bytes(t, HW_CVT)
        sff = sf.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        # (the triton 3.6 interpreter decodes the e4m3 NaN code 0x7F as a finite number; with
        # gs = 0 that would give inv = 0 instead of NaN. One select per block.)
        sff = tl.where(t != t, t, sff)
        gsb = tl.broadcast_to(gs, sff.shape)
        den = tl.where(sff == 0.0, 1.0, sff)  # (the 0 lanes are replaced: no division by zero)
        inv = tl.where(sff == 0.0, 0.0, tl.math.div_rn(gsb, den))
        v = xf * tl.broadcast_to(inv[:, :, None], xf.shape)
        return _e2m1_codes(v, GPU), sf
    else:
        if FMT == FMT_MXFP8:
            b = _e8m0_biased(amax, 448.0, 8, ROUND)
        else:
            b = _e8m0_biased(amax, 6.0, 2, ROUND)
        # (NaN block, b = 255: the reciprocal is NaN, so every element encodes as NaN / code 7)
        v = xf * tl.broadcast_to(_e8m0_reciprocal(b)[:, :, None], xf.shape)
        if FMT == FMT_MXFP8:
            return _e4m3_bytes(v, HW_CVT), b.to(tl.uint8)
        else:
            return _e2m1_codes(v, GPU), b.to(tl.uint8)


def _quant_repr(specialization):
    c = specialization.constants
    return (
        f"quantize_{FMT_NAMES[c['FMT']]}_1x{c['BK']}_r{c['ROUND']}"
        f"_tile{c['ROWS']}x{c['GROUPS'] * c['BK']}{'_silu' if c['SILU'] else ''}"
    )


def _quant_meta(grid, kernel, args):
    """Profiler metadata: name with shape, bytes read + written (data and scales)."""
    try:
        m, k, fmt = args["M"], args["K"], int(args["FMT"])
        in_bytes = args["x_ptr"].element_size() * m * k * (2 if args["SILU"] else 1)
        data = m * (k if fmt < 2 else (k + 1) // 2)
        nsc = m * triton.cdiv(k, int(args["BK"])) * (4 if fmt == 0 else 1)
        return {"name": f"quantize_{FMT_NAMES[fmt]} M={m} K={k}", "bytes": in_bytes + data + nsc}
    except Exception:  # never let profiler metadata break a launch
        return {"name": "quantize_1xk"}


@triton.jit(repr=_quant_repr, launch_metadata=_quant_meta)
def quantize_1xk_kernel(
    x_ptr, q_ptr, s_ptr, gs_ptr, gs_out_ptr,
    M, K, KP, stride_xm, stride_qm, stride_sm, n_part,
    FMT: tl.constexpr, ROUND: tl.constexpr, BK: tl.constexpr,
    ROWS: tl.constexpr, GROUPS: tl.constexpr, GS_MODE: tl.constexpr, SILU: tl.constexpr,
    INTER: tl.constexpr = tl.bfloat16, GPU: tl.constexpr = True, HW_CVT: tl.constexpr = True,
    PART_BLOCK: tl.constexpr = 1,
):
    """Quantize ``x [M, K]`` (row stride ``stride_xm``, unit column stride) in 1 x BK blocks.

    1-D grid, one program per ``ROWS x (GROUPS * BK)`` tile (row-major tile order), loaded
    once as ``[ROWS, GROUPS, BK]``. Writes ``q [M, K]`` (e4m3 bytes) or ``[M, KP = ceil(K/2)]``
    (packed e2m1, element 2i in the low nibble) with row stride ``stride_qm`` and scales
    ``[M, ceil(K/BK)]`` (``stride_sm``).
    SILU: ``x`` is ``gate_up [M, 2K]``; the tile is ``INTER(silu(g) * u)`` (fp32 math,
    rounded to the intermediate dtype INTER, bf16 by default).
    nvfp4: GS_MODE 1 reads gs from ``gs_ptr`` (NaN unless finite and > 0); 2 computes it from
    the tensor amax, the max of
    the ``n_part`` (<= PART_BLOCK) int32 partial maxima at ``gs_ptr`` (``tensor_amax_kernel``),
    and program (0, 0) stores it to ``gs_out_ptr``. GS_MODE 2 visits the tiles in reverse: the
    amax pass read the end of ``x`` last, so that part is still in L2 (~10% of a large x).
    GPU: compiled for a GPU (libdevice exp; PTX min/max NaN semantics); False = interpreter.
    """
    pid = tl.program_id(0)
    if GS_MODE == GS_FROM_AMAX:
        pid = tl.num_programs(0) - 1 - pid
    n_k = tl.cdiv(K, GROUPS * BK)
    pid_m = pid // n_k
    pid_k = pid - pid_m * n_k
    rows = pid_m * ROWS + tl.arange(0, ROWS)
    grp = pid_k * GROUPS + tl.arange(0, GROUPS)
    col = tl.arange(0, BK)
    cols = grp[None, :, None] * BK + col[None, None, :]  # [1, G, BK]
    rmask = rows < M
    mask = rmask[:, None, None] & (cols < K)
    roff = rows.to(tl.int64)[:, None, None] * stride_xm
    if SILU:
        g = tl.load(x_ptr + roff + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + roff + K + cols, mask=mask, other=0.0).to(tl.float32)
        # silu(g) * u = g / (1 + exp(-g)) * u in fp32, then rounded to bf16 (reference
        # silu_mul + .to(bfloat16)); libdevice expf may differ from the CPU's by 1 ulp.
        if GPU:
            e = tl.extra.cuda.libdevice.exp(0.0 - g)
        else:  # interpreter: numpy's expf
            e = tl.exp(0.0 - g)
        h = tl.math.div_rn(g, 1.0 + e) * u
        if INTER == tl.bfloat16:
            xf = _round_bf16(h)
        else:
            xf = h.to(INTER).to(tl.float32)
    else:
        xf = tl.load(x_ptr + roff + cols, mask=mask, other=0.0).to(tl.float32)

    amax = _block_amax(xf, 2)  # [ROWS, G]
    if FMT == FMT_NVFP4:
        if GS_MODE == GS_FROM_AMAX:
            po = tl.arange(0, PART_BLOCK)
            part = tl.load(gs_ptr + po, mask=po < n_part, other=0)
            gs = _nvfp4_gs_from_amax(_f32(tl.max(part, 0)))
            if pid == 0:
                tl.store(gs_out_ptr, gs)
        else:
            gs = tl.load(gs_ptr)
            # A given gs must be finite and > 0. The host checks Python numbers and CPU
            # tensors; a CUDA tensor is not read back (no sync), so a bad one becomes NaN here:
            # every scale NaN, the whole tensor dequantizes to NaN (reference: the same rule).
            gs = tl.where((gs > 0.0) & (gs < float("inf")), gs, float("nan"))
    else:
        gs = 0.0
    codes, s = _quantize_tile(xf, amax, gs, FMT, ROUND, HW_CVT, GPU)

    smask = rmask[:, None] & (grp[None, :] * BK < K)
    tl.store(s_ptr + rows.to(tl.int64)[:, None] * stride_sm + grp[None, :], s, mask=smask)

    if FMT == FMT_FP8_BLOCK or FMT == FMT_MXFP8:
        tl.store(q_ptr + rows.to(tl.int64)[:, None, None] * stride_qm + cols, codes, mask=mask)
    else:
        # Pack as a 2-D [ROWS, GROUPS * BK / 2] tile so the row's bytes are one contiguous
        # run per thread (16-byte stores; a 3-D [.., G, BK/2] pointer gave 8-byte ones for nvfp4).
        HALF: tl.constexpr = GROUPS * BK // 2
        lo, hi = tl.split(tl.reshape(codes, (ROWS, HALF, 2)))
        # codes are e2m1 sums (code = bits & 15): the bits that hi << 4 moves above the byte
        # fall off in the uint8 cast, so one AND-OR (LOP3) + one shift per byte
        byte = ((lo & 15) | (hi << 4)).to(tl.uint8)
        pc = pid_k * HALF + tl.arange(0, HALF)
        pmask = rmask[:, None] & (pc < KP)[None, :]
        tl.store(q_ptr + rows.to(tl.int64)[:, None] * stride_qm + pc[None, :], byte, mask=pmask)


# --------------------------------------------------------------------------- 128 x 128 quantize
def _w_meta(grid, kernel, args):
    try:
        e, n, k = args["E"], args["N"], args["K"]
        byt = e * n * k * (args["x_ptr"].element_size() + 1) + 4 * e * triton.cdiv(n, 128) * triton.cdiv(k, 128)
        return {"name": f"quantize_fp8_block_128x128 E={e} N={n} K={k}", "bytes": byt}
    except Exception:  # never let profiler metadata break a launch
        return {"name": "quantize_fp8_block_128x128"}


@triton.jit(launch_metadata=_w_meta)
def quantize_128x128_kernel(
    x_ptr, q_ptr, s_ptr, E, N, K, stride_xe, stride_xn, stride_qe, stride_qn, stride_se, stride_sn,
    ROUND: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, HW_CVT: tl.constexpr = True,
    GPU: tl.constexpr = True,
):
    """fp8_block weights: ``x [E, N, K]`` -> e4m3 ``q [E, N, K]`` and fp32 scales
    ``[E, ceil(N/128), ceil(K/128)]``; one program per 128 x 128 block (BR = BC = 128)."""
    pid_k = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_e = tl.program_id(2).to(tl.int64)
    rows = pid_n * BR + tl.arange(0, BR)
    cols = pid_k * BC + tl.arange(0, BC)
    mask = (rows < N)[:, None] & (cols < K)[None, :]
    x = tl.load(x_ptr + pid_e * stride_xe + rows.to(tl.int64)[:, None] * stride_xn + cols[None, :],
                mask=mask, other=0.0).to(tl.float32)
    m = tl.max(tl.max(_bits(x) & 0x7FFFFFFF, axis=1, keep_dims=True), axis=0, keep_dims=True)  # [1, 1]
    amax = _f32(tl.where(m > 0x7F800000, 0x7FC00000, m))
    codes, s = _quantize_tile(tl.reshape(x, (1, BR, BC)), amax, 0.0, FMT_FP8_BLOCK, ROUND, HW_CVT, GPU)
    codes = tl.reshape(codes, (BR, BC))
    tl.store(q_ptr + pid_e * stride_qe + rows.to(tl.int64)[:, None] * stride_qn + cols[None, :], codes, mask=mask)
    s1 = tl.reshape(s, (1,))
    tl.store(s_ptr + pid_e * stride_se + pid_n * stride_sn + pid_k + tl.arange(0, 1), s1)


# --------------------------------------------------------------------------- tensor amax
@triton.jit
def tensor_amax_kernel(x_ptr, part_ptr, M, K, stride_xm, tiles_k, iters,
                       ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """``part[pid]`` (int32) = bits of max |x| over the tiles ``pid, pid + P, pid + 2P, ...``
    (P = number of programs, ``iters`` tiles each, ``ROWS x BLOCK_K`` tiles in row-major
    order, ``tiles_k`` per tile row) of ``x [M, K]``. The max of the partials is the tensor
    amax (int order of non-negative float bits = float order, NaN above +Inf).

    Partials instead of one atomic_max: no zero-initialised buffer (no memset launch), and
    deterministic. The consumer (nvfp4 quantize, or torch.amax for ``tensor_amax``) reduces
    the <= 2 * #SM partials. Grid-stride so that few programs (2 per SM) each keep two 16 KB
    tiles' loads in flight; the last tiles read are the end of x (the quantize pass that
    follows starts there, while they are in L2)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros((ROWS, BLOCK_K), tl.int32)
    for i in range(iters):
        t = pid + i * nprog
        tm = t // tiles_k
        tk = t - tm * tiles_k
        rows = tm * ROWS + tl.arange(0, ROWS)  # t >= #tiles: rows >= M, fully masked
        cols = tk * BLOCK_K + tl.arange(0, BLOCK_K)
        mask = (rows < M)[:, None] & (cols < K)[None, :]
        x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0)
        acc = tl.maximum(acc, _bits(x.to(tl.float32)) & 0x7FFFFFFF)
    tl.store(part_ptr + pid, tl.max(tl.max(acc, axis=1), axis=0))


# --------------------------------------------------------------------------- dequantize
@triton.jit
def _nvfp4_values(code, s, smask, gs):
    """``(v * s) / gs`` per element (v the e2m1 value of ``code`` [ROWS, GROUPS, BK], s the e4m3
    block scale [ROWS, GROUPS]), bit for bit as the reference divides, with two divisions per block
    instead of one per element. An e2m1 value is +-m * 2**e with m in {1, 1.5} and e in -1..2, and
    ``v * s`` is exact, so ``(v * s) / gs = +-2**e * ((m * s) / gs)``: the power of two commutes
    with the rounding wherever the quotients are normal (also at overflow). A program whose
    blocks are not all so (a quotient below 2**-125, not finite: zero / NaN scales, a zero / NaN
    global scale, masked blocks excepted) divides per element as before. (The per-element IEEE
    division made the nvfp4 pass instruction-bound: ncu on the H200, 8192 x 8192 to bf16, 19 %
    of DRAM bandwidth at 80 % issue, 3x mxfp4's instructions per element.)"""
    d1 = tl.math.div_rn(s, tl.broadcast_to(gs, s.shape))
    d3 = tl.math.div_rn(s * 1.5, tl.broadcast_to(gs, s.shape))  # 1.5 x an e4m3 value: exact
    ok = ((tl.abs(d1) >= 2.0 ** -125) & (tl.abs(d1) < float("inf"))) | (smask == 0)
    if tl.min(ok.to(tl.int32)) == 1:
        m = code & 7
        base = tl.where(((m & 1) == 1) & (m > 1), tl.broadcast_to(d3[:, :, None], code.shape),
                        tl.broadcast_to(d1[:, :, None], code.shape))
        mag = tl.where(m == 0, base * 0.0, base * _f32(((m >> 1) + 126) << 23))  # 2**e, e = (m >> 1) - 1
        out = _f32(_bits(mag) ^ ((code & 8) << 28))  # the code's sign (the quotient's is in mag)
    else:
        v = _e2m1_decode(code)
        out = tl.math.div_rn(v * tl.broadcast_to(s[:, :, None], v.shape), tl.broadcast_to(gs, v.shape))
    return out


@triton.jit
def dequantize_1xk_kernel(
    q_ptr, s_ptr, gs_ptr, out_ptr, M, K, KP, stride_qm, stride_sm, stride_om,
    FMT: tl.constexpr, BK: tl.constexpr, ROWS: tl.constexpr, GROUPS: tl.constexpr,
):
    """``out [M, K] = decode(q) * scale`` (``/ gs`` for nvfp4), computed in fp32, stored in
    out's dtype. Tiles as in ``quantize_1xk_kernel``."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * ROWS + tl.arange(0, ROWS)
    grp = pid_k * GROUPS + tl.arange(0, GROUPS)
    cols = grp[None, :, None] * BK + tl.arange(0, BK)[None, None, :]
    rmask = rows < M
    mask = rmask[:, None, None] & (cols < K)
    smask = rmask[:, None] & (grp[None, :] * BK < K)
    srow = rows.to(tl.int64)[:, None] * stride_sm
    qrow = rows.to(tl.int64)[:, None, None] * stride_qm
    if FMT == FMT_FP8_BLOCK or FMT == FMT_MXFP8:
        v = e4m3_to_f32(tl.load(q_ptr + qrow + cols, mask=mask, other=0).to(tl.float8e4nv, bitcast=True))
    else:
        pc = grp[None, :, None] * (BK // 2) + tl.arange(0, BK // 2)[None, None, :]
        pmask = rmask[:, None, None] & (pc < KP)
        byte = tl.load(q_ptr + qrow + pc, mask=pmask, other=0).to(tl.int32)
        code = tl.reshape(tl.join(byte & 15, byte >> 4), (ROWS, GROUPS, BK))
        if FMT != FMT_NVFP4:  # (nvfp4 decodes only where it divides per element)
            v = _e2m1_decode(code)
    if FMT == FMT_FP8_BLOCK:
        s = tl.load(s_ptr + srow + grp[None, :], mask=smask, other=1.0)
    elif FMT == FMT_NVFP4:
        s = e4m3_to_f32(tl.load(s_ptr + srow + grp[None, :], mask=smask, other=0).to(tl.float8e4nv, bitcast=True))
    else:
        b = tl.load(s_ptr + srow + grp[None, :], mask=smask, other=127).to(tl.int32)
        s = _f32(tl.where(b == 0, 0x00400000, tl.where(b == 255, 0x7FC00000, b << 23)))
    if FMT == FMT_NVFP4:
        out = _nvfp4_values(code, s, smask, tl.load(gs_ptr))
    else:
        out = v * tl.broadcast_to(s[:, :, None], v.shape)
    if INTERPRETING and out_ptr.dtype.element_ty == tl.bfloat16:
        out = _round_bf16(out)  # the interpreter's cast truncates; the GPU's cvt.rn.bf16.f32 is this rounding
    tl.store(out_ptr + rows.to(tl.int64)[:, None, None] * stride_om + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def dequantize_128x128_kernel(
    q_ptr, s_ptr, out_ptr, N, K, stride_qe, stride_qn, stride_se, stride_sn, stride_oe, stride_on,
    BR: tl.constexpr, BC: tl.constexpr,
):
    """fp8_block weights ``q [E, N, K]`` * scales ``[E, ceil(N/128), ceil(K/128)]``."""
    pid_k = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_e = tl.program_id(2).to(tl.int64)
    rows = pid_n * BR + tl.arange(0, BR)
    cols = pid_k * BC + tl.arange(0, BC)
    mask = (rows < N)[:, None] & (cols < K)[None, :]
    v = e4m3_to_f32(tl.load(q_ptr + pid_e * stride_qe + rows.to(tl.int64)[:, None] * stride_qn + cols[None, :],
                            mask=mask, other=0).to(tl.float8e4nv, bitcast=True))
    s = tl.load(s_ptr + pid_e * stride_se + pid_n * stride_sn + pid_k)
    sb = tl.broadcast_to(s, v.shape)
    out = v * sb
    if INTERPRETING and out_ptr.dtype.element_ty == tl.bfloat16:
        out = _round_bf16(out)  # the interpreter's cast truncates; the GPU's cvt.rn.bf16.f32 is this rounding
    tl.store(out_ptr + pid_e * stride_oe + rows.to(tl.int64)[:, None] * stride_on + cols[None, :],
             out.to(out_ptr.dtype.element_ty), mask=mask)
