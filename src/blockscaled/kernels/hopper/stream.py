"""The sm_90a weight-streaming GEMM in Gluon: mxfp4 / nvfp4 / mxfp8 weights x bf16 activations, M <= 64.

``C[m, n] = sum_k x[m, k] * dequantize(W)[n, k]`` for decode and small-batch sizes, where the
quantized weights are the traffic. Kernel body only; the host launcher is
``blockscaled.ops._stream``. Written for packed e2m1 (below); mxfp8 (FMT 1) follows the same
plan with 8 KB steps of e4m3 (``_DECODE_E4M3``, ``word8_layout``, ``_x_chunk``).

Why a kernel of its own (H200 ncu, benchmarks/NOTES.md, seventeenth session): the portable
kernel's bf16 swap-AB tile ran mxfp4 28672x8192 at M=16 in 156 us (the fp4 bytes' floor is 28 us)
with 6.1 issued instructions per weight element and 1.7 warps eligible per scheduler (190
registers, 1.7 programs per SM); the CUDA-core GEMV at M=1 issued 5.4 per element at 70 % issue
utilisation (instruction bound). Here:

* the weight chunk (64 rows x 128 elements = 4 KB) arrives by TMA into an unswizzled ring of
  STAGES slots; each thread reads 16 contiguous bytes of two rows per chunk with one 128-bit
  shared load per row (a warp's 8 row pairs x 4 threads cover 512 contiguous bytes: no bank
  conflicts);
* the 16 bytes (32 elements, one MX scale block) become bf16 pairs in registers with integer ops
  and packed bf16 multiplies (_DECODE_ASM: ~4 SASS per pair plus one or two HFMA2), and those
  registers ARE the wgmma's A operand: no shared-memory round trip, no layout conversion;
* the price: the wgmma's K order within each 128-element chunk is a permutation of the
  weight's, so the activations are loaded in that order (a gather from L2; [MP, 128] per chunk,
  one eighth of the weight chunk's bytes at MP = 16) and stored to shared memory as the wgmma's
  B operand.

The K permutation. Thread t (= lane % 4) of a quad holds words 4t .. 4t + 3 of a row's 16
32-bit words of the chunk (physical elements 32t .. 32t + 31). Word i (of the four) holds 8
e2m1 codes, element j in nibble j; the decode makes bf16 pairs (j, j + 4) for j = 0..3 (their
magnitude and sign bits sit 16 bits apart, so one shift pair places both). The wgmma's register
operand (k_width 2) wants, per row and k16 block, lane quad t holding k = 2t, 2t + 1 and
2t + 8, 2t + 9. With q = the wgmma's K index, bits [i1 i0 a1 a0 t1 t0 h] (a = j, h = which of
the pair) and the physical element p = 32t + 8i + a + 4h, the decoded registers are exactly that
layout (checked at compile time: the conversion is ``assert_trivial``). The activations follow
the same map: B[q, m] = x[m, chunk + p(q)].

Numerics: every e2m1 x E8M0 and e2m1 x e4m3 product is exact in bf16 (kernels/triton/_mma.py,
``fp4_bf16`` / ``scale_bf16``: the same bit patterns and factors), fp32 accumulation in the
tensor core, one rounding at the store; only the summation order differs from the float64
reference (the tolerance table). nvfp4: the factor carries 2**-8 (``NVFP4_BF16_SHIFT``), undone
with the global scale in the epilogue. K must be a multiple of 32 (16-byte TMA rows; the planner
checks): a last step past K reads zero-filled codes (TMA), scales of 2**0 / 0 (masked loads: a
NaN scale code there would poison the zeros) and zero activations; TMA also zero-fills the rows
past N and masked loads the activation rows past M.

Split-K (SPLIT > 1, dense only): as the skinny fp8_block kernel, fp32 partial tiles and a
deterministic last-arriver sum in split order. Grouped (contiguous / masked MoE): see
``stream_kernel``.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                               warpgroup_mma_wait)

from ._compat import cta_barrier, tma_load

__all__ = ["stream_kernel", "BLOCK_N", "CHUNK"]

#: weight rows per program (the wgmma's M: one warpgroup)
BLOCK_N = gl.constexpr(64)
#: K elements per pipeline step: 16 32-bit words of packed e2m1 per row
CHUNK = gl.constexpr(128)

_FMT_MXFP8 = gl.constexpr(1)
_FMT_MXFP4 = gl.constexpr(2)
_FMT_NVFP4 = gl.constexpr(3)

# One 32-bit word of 8 e2m1 codes ($4) and the bf16x2 block-scale factor ($5) -> four bf16x2
# registers $0..$3 = elements (j, j + 4), j = 0..3, each ``e2m1 * factor`` (mxfp4: times 2**126
# first: the placed bits are e2m1 * 2**-126, see _mma.fp4_bf16). fma with -0.0 keeps the sign of
# zero products.
# Nibbles j and j + 4 of the word to bf16 bits: magnitudes to bits 6..8 / 22..24 (a shift of
# 6 - 4j, left for j < 2, right above), signs to bits 15 / 31 (left by 12 - 4j).
_PAIR = """
{op}.b32 m, $4, {ms};
and.b32 m, m, 0x01C001C0;
shl.b32 s, $4, {ss};
and.b32 s, s, 0x80008000;
or.b32 m, m, s;
"""


def _decode_asm(two_mul: bool) -> str:
    body = ["{", ".reg .b32 m, s, nz, c;", "mov.b32 nz, 0x80008000;", "mov.b32 c, 0x7E807E80;"]
    for j in range(4):
        ms = 6 - 4 * j
        body.append(_PAIR.format(op="shl" if ms >= 0 else "shr", ms=abs(ms), ss=12 - 4 * j))
        if two_mul:
            body.append("fma.rn.bf16x2 m, m, c, nz;")
        body.append(f"fma.rn.bf16x2 ${j}, m, $5, nz;")
    body.append("}")
    return "\n".join(body)


_DECODE_MX = gl.constexpr(_decode_asm(True))
_DECODE_NV = gl.constexpr(_decode_asm(False))

# mxfp8: one 32-bit word of 4 e4m3 codes ($2) and the E8M0 factor ($3) -> two bf16x2 registers,
# $0 = bytes (0, 1), $1 = bytes (2, 3). Each byte's 7 magnitude bits go to bf16 bits 4..10 (its
# exponent field's low 4 bits and the top 3 mantissa bits: the value e4m3 * 2**-120, subnormals
# included), the sign to bit 15; times 2**120 (0x7B80), then times the scale, both exact. A word
# holding an e4m3 NaN code (magnitude 0x7F; + 0x01 carries into bit 7) multiplies by NaN instead,
# so the NaN reaches the output as the float64 reference's does (its 3 neighbours too: the output
# column is NaN either way).
_E4M3_PAIR = """
prmt.b32 v, m, z, {sel};
shr.b32 v, v, 4;
prmt.b32 s, $2, z, {sel};
and.b32 s, s, 0x80008000;
or.b32 v, v, s;
fma.rn.bf16x2 v, v, c, nz;
fma.rn.bf16x2 ${out}, v, $3, nz;
"""
_DECODE_E4M3 = gl.constexpr("\n".join([
    "{", ".reg .b32 m, v, s, t, c, z, nz;", ".reg .pred p;", "mov.b32 z, 0;", "mov.b32 nz, 0x80008000;",
    "and.b32 m, $2, 0x7F7F7F7F;", "add.u32 t, m, 0x01010101;", "and.b32 t, t, 0x80808080;",
    "setp.ne.u32 p, t, 0;", "selp.b32 c, 0x7FC07FC0, 0x7B807B80, p;",
    # byte j of each pair into bits 8..15 of its half: selector nibbles (b = z is bytes 4..7)
    _E4M3_PAIR.format(sel="0x1404", out=0), _E4M3_PAIR.format(sel="0x3424", out=1), "}"]))


@gluon.constexpr_function
def word_layout():
    """[64 rows, 4 (t), 2 (i1), 2 (i0)] int32 words of a chunk: lane = (row % 8) * 4 + t, registers
    i1, i0 and row bit 3, warps row bits 4-5 (the wgmma A fragment's rows)."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 0, 1], [0, 0, 1, 0], [8, 0, 0, 0]],
        lane_bases=[[0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]],
        warp_bases=[[16, 0, 0, 0], [32, 0, 0, 0]], block_bases=[], shape=[64, 4, 2, 2])


@gluon.constexpr_function
def word2_layout():
    """The same words as [64, 16] (word index 4t + 2 i1 + i0) for the shared-memory load."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [8, 0]],
        lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 16])


@gluon.constexpr_function
def word8_layout():
    """mxfp8: [64 rows, 4 (t), 8 (w)] int32 words of a step (128 e4m3 per row): lane = (row % 8) *
    4 + t, registers w and row bit 3, warps row bits 4-5; thread t holds words 8t .. 8t + 7 of a
    row (physical elements 32t .. 32t + 31: one MX scale block)."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [8, 0, 0]],
        lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16, 0, 0], [32, 0, 0]], block_bases=[], shape=[64, 4, 8])


@gluon.constexpr_function
def word8_2d_layout():
    """The same words as [64, 32] (word index 8t + w) for the shared-memory load (two 128-bit
    loads per row and thread)."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [8, 0]],
        lane_bases=[[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 32])


@gluon.constexpr_function
def acc_layout(mp):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, mp, 16])


@gluon.constexpr_function
def x_layout(mp):
    """[MP, 16, 8] activations of a chunk (physical element 8g + j): a thread loads 8 consecutive
    elements (16 bytes), lanes along g (16) and 2 rows, warps along rows."""
    return gl.BlockedLayout([1, 1, 8], [2, 16, 1], [4, 1, 1], [2, 1, 0])


@gluon.jit
def _x_chunk(x_ptr, rows, row_ok, g, j, k0, K, stride_xm, MP: gl.constexpr, FMT: gl.constexpr):
    """Activations of the chunk at k0 in the wgmma's K order q ([MP, 128]), loaded as [MP, g, j]
    (16-byte vectors of physical elements p = 8g + j), then the bits permuted in registers. Past
    K / M: 0. fp4 (module docstring): p = 32t + 8i + a + 4h, q = [i1 i0 a1 a0 t1 t0 h]. mxfp8: word
    w of thread t holds p = 32t + 4w + 2b + h (b: which pair of the word), q = [w2 w1 w0 b t1 t0 h]."""
    kk = k0 + g[:, None] * 8 + j[None, :]  # [16, 8]
    ptrs = x_ptr + rows.to(gl.int64)[:, None, None] * stride_xm + kk[None, :, :]
    x = gl.load(ptrs, mask=row_ok[:, None, None] & (kk < K)[None, :, :], other=0.0)
    x = gl.reshape(x, [MP, 2, 2, 2, 2, 2, 2, 2])  # the 7 bits of p, most significant first
    if FMT == _FMT_MXFP8:
        # p = [t1 t0 w2 w1 w0 b h] -> q = [w2 w1 w0 b t1 t0 h]
        x = gl.permute(x, (0, 3, 4, 5, 6, 1, 2, 7))
    else:
        # p = [t1 t0 i1 i0 h a1 a0] -> q = [i1 i0 a1 a0 t1 t0 h]
        x = gl.permute(x, (0, 3, 4, 6, 7, 1, 2, 5))
    return gl.reshape(x, [MP, CHUNK])


@gluon.jit
def _xq_load(x_ptr, xs_ptr, rows, row_ok, k0, K, stride_xm, stride_xsm, MP: gl.constexpr, FMT: gl.constexpr):
    """Quantized activations (W x A, the weight's format) of the chunk at k0, as stored: ``x_ptr``
    int32 words of the packed data (8 e2m1 or 4 e4m3 per word), ``xs_ptr`` their block scales (row
    stride ``stride_xsm``). A thread takes the 8 physical elements p = 8g + j of (row, g) as the
    bf16 path does (one word of e2m1, two of e4m3) and their block scale: (words [MP, 16, NW],
    scales [MP, 16]); past K / M: zero codes. ``_xq_decode`` turns them into the B operand. The K
    loop loads them a step before it decodes them: a decode right after the load waits out the L2
    latency (H200, mxfp4 W x A at 16 rows on 57344 x 8192: 160 -> 128 us)."""
    NW: gl.constexpr = 2 if FMT == _FMT_MXFP8 else 1  # words per (row, g)
    WL: gl.constexpr = gl.BlockedLayout([1, 1, NW], [2, 16, 1], [4, 1, 1], [2, 1, 0])  # [MP, g, word]
    SL: gl.constexpr = gl.SliceLayout(2, WL)  # [MP, g]: one scale block per (row, g)
    r = gl.convert_layout(rows, gl.SliceLayout(1, SL))
    rok = gl.convert_layout(row_ok, gl.SliceLayout(1, SL))
    g = gl.arange(0, 16, layout=gl.SliceLayout(0, SL))
    gw = gl.arange(0, 16, layout=gl.SliceLayout(1, gl.SliceLayout(0, WL)))
    wd = gl.arange(0, NW, layout=gl.SliceLayout(0, gl.SliceLayout(0, WL)))
    col = ((k0 // 8 + gw) * NW)[:, None] + wd[None, :]  # [16, NW] word index in the row
    ok = rok[:, None, None] & ((k0 + g * 8) < K)[None, :, None]
    words = gl.load(x_ptr + r.to(gl.int64)[:, None, None] * stride_xm + col[None, :, :], mask=ok, other=0)
    srow = (gl.where(rok, r, 0).to(gl.int64) * stride_xsm)[:, None]  # rows past M: row 0's scales
    if FMT == _FMT_NVFP4:
        sc = _scale_raw(xs_ptr, srow, (k0 // 16 + g // 2)[None, :], gl.cdiv(K, 16), FMT)
    else:
        sc = _scale_raw(xs_ptr, srow, (k0 // 32 + g // 4)[None, :], gl.cdiv(K, 32), FMT)
    return words, sc


@gluon.jit
def _xq_decode(words, sc, MP: gl.constexpr, FMT: gl.constexpr):
    """``_xq_load``'s words and scales -> bf16 [MP, 128] in the wgmma's K order, decoded with the
    weights' code (nvfp4: times 2**-8 like the weights, undone in the epilogue) and permuted to q
    as the bf16 path does."""
    fac = gl.expand_dims(_scale_bits(sc, FMT), 2)
    if FMT == _FMT_MXFP8:
        p0, p1 = gl.inline_asm_elementwise(_DECODE_E4M3, "=r,=r,r,r", [words, fac], dtype=(gl.int32, gl.int32),
                                           is_pure=True, pack=1)
        pr = gl.join(p0, p1)  # [MP, g, word, b]: element 4 word + 2b (+ h below)
    else:
        if FMT == _FMT_NVFP4:
            p0, p1, p2, p3 = gl.inline_asm_elementwise(_DECODE_NV, "=r,=r,=r,=r,r,r", [words, fac],
                                                       dtype=(gl.int32, gl.int32, gl.int32, gl.int32),
                                                       is_pure=True, pack=1)
        else:
            p0, p1, p2, p3 = gl.inline_asm_elementwise(_DECODE_MX, "=r,=r,=r,=r,r,r", [words, fac],
                                                       dtype=(gl.int32, gl.int32, gl.int32, gl.int32),
                                                       is_pure=True, pack=1)
        pr = gl.join(gl.join(p0, p2), gl.join(p1, p3))  # [MP, g, 1, a1, a0]: pair j = 2 a1 + a0 is (j, j + 4)
    lo = pr.to(gl.int16)
    hi = (pr >> 16).to(gl.int16)
    x = gl.join(lo, hi).to(gl.bfloat16, bitcast=True)  # [..., h]
    # m, the 4 bits of g, then the element's 3 bits: fp4 (a1, a0, h) = j [h a1 a0]; mxfp8 (word, b, h) = j
    x = gl.reshape(x, [MP, 2, 2, 2, 2, 2, 2, 2])
    # fp4: p = [t1 t0 i1 i0 | h a1 a0] -> q = [i1 i0 a1 a0 t1 t0 h]; mxfp8: p = [t1 t0 w2 w1 | w0 b h] ->
    # q = [w2 w1 w0 b t1 t0 h]: with the element bits held as above, one permutation serves both
    x = gl.permute(x, (0, 3, 4, 5, 6, 1, 2, 7))
    return gl.reshape(x, [MP, CHUNK])


@gluon.jit
def _scale_raw(ws_ptr, srow, scol, ncol, FMT: gl.constexpr):
    """The stored block scales at srow / scol; columns >= ncol (the K tail's zero-filled codes)
    read as 0 (nvfp4) / 2**0 (mxfp4: E8M0 127), never a NaN code. Apart from ``_scale_bits`` for
    the gather of quantized activations, which decodes a step after its loads (``_xq_load``)."""
    if FMT == _FMT_NVFP4:
        s = gl.load(ws_ptr + srow + scol, mask=scol < ncol, other=0.0)
    else:
        s = gl.load(ws_ptr + srow + scol, mask=scol < ncol, other=127)
    return s


@gluon.jit
def _scale_factor(ws_ptr, srow, scol, ncol, FMT: gl.constexpr):
    """bf16x2 factor (int32 bits, both halves equal) of the block scales at srow / scol
    (``_scale_raw`` then ``_scale_bits``)."""
    return _scale_bits(_scale_raw(ws_ptr, srow, scol, ncol, FMT), FMT)


@gluon.jit
def _scale_bits(s, FMT: gl.constexpr):
    """Stored block scales -> their bf16x2 decode factor (int32 bits, both halves equal)."""
    if FMT == _FMT_NVFP4:
        f = (s.to(gl.float32) * 2.0 ** 118).to(gl.bfloat16).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
    else:
        e = s.to(gl.int32)
        f = gl.where(e == 0, 0x0040, gl.where(e == 255, 0x7FC0, e << 7))
    return f | (f << 16)


@gluon.jit
def _acts(x_base, xs_base, xr, x_ok, xg, xj, k0, K, stride_xm, stride_xsm, MP: gl.constexpr, FMT: gl.constexpr,
          A_QUANT: gl.constexpr):
    """The activation chunk at k0 as the wgmma's B operand (bf16 [MP, 128] in K order q), loaded
    and (A_QUANT) decoded at once."""
    if A_QUANT:
        xw, xsc = _xq_load(x_base, xs_base, xr, x_ok, k0, K, stride_xm, stride_xsm, MP, FMT)
        return _xq_decode(xw, xsc, MP, FMT)
    else:
        return _x_chunk(x_base, xr, x_ok, xg, xj, k0, K, stride_xm, MP, FMT)


#: one stored block scale into a 32-bit register (ld.global.nc: the scales are read-only here). An
#: asm result cannot be narrowed: carried a few steps as Triton bytes, the loop would pack them two
#: to a register at once, which waits for the loads in the step that issued them
_LD_U8 = gl.constexpr("ld.global.nc.u8 $0, [$1];")


@gluon.jit
def _scale_ahead(ws_ptr, srow, scol, ncol, c, num_c, SPC: gl.constexpr):
    """The raw block scales of K step ``c`` (clamped into the row: always a valid address), loaded
    into int32 registers that nothing reads until the step comes (``_scale_landed``)."""
    col = gl.minimum(scol + gl.minimum(c, num_c - 1) * SPC, ncol - 1)
    return gl.inline_asm_elementwise(_LD_U8, "=r,l", [ws_ptr + srow + col], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _scale_landed(r, scol, ncol, c, SPC: gl.constexpr, FMT: gl.constexpr):
    """Step ``c``'s bf16x2 factors from ``_scale_ahead``'s registers; columns past K read as
    ``_scale_raw`` reads them (0 for nvfp4, 2**0 for mx)."""
    ok = (scol + c * SPC) < ncol
    if FMT == _FMT_NVFP4:
        v = gl.where(ok, r, 0).to(gl.uint8).to(gl.float8e4nv, bitcast=True)
    else:
        v = gl.where(ok, r, 127).to(gl.uint8)
    return _scale_bits(v, FMT)


@gluon.jit
def _k_step(acc, it, f_a, f_b, x_cur, xw, xsc, w_desc, w_bufs, x_bufs, bars, step0, w_row, ws_ptr, srow, scol, ncol,
            num_c, x_base, xs_base, x_ok, xr, xg, xj, stride_xm, stride_xsm, K, c_lo, n_c, FMT: gl.constexpr,
            MP: gl.constexpr, STAGES: gl.constexpr, A_QUANT: gl.constexpr, XQ2: gl.constexpr, SA: gl.constexpr):
    """K step ``it`` of ``_k_loop``: store the step's activations ``x_cur`` as the B operand and
    load the next step's (XQ2: decode the words ``xw`` / ``xsc`` loaded a step earlier and load the
    step after next), wait for the weight slot, refill it, decode into the A operand, one wgmma
    waited for. The block-scale factors: SA, ``f_a`` (``f_b`` unused); else ``f_a`` / ``f_b`` are
    this and the next step's, and step ``it + 2``'s are loaded here. Returns (acc, f_a, f_b, x_cur,
    xw, xsc) for the next step."""
    L2: gl.constexpr = word2_layout()
    L8: gl.constexpr = word8_layout()
    L82: gl.constexpr = word8_2d_layout()
    acc_l: gl.constexpr = acc_layout(MP)
    dot_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
    WPS: gl.constexpr = 32 if FMT == _FMT_MXFP8 else 16  # int32 words per row and step
    g = step0 + it
    s = g % STAGES
    xb = x_bufs.index(it % 2)
    xb.store(x_cur)
    if XQ2:  # (past the split's last step: decodes / loads masked zeros, unused)
        x_cur = _xq_decode(xw, xsc, MP, FMT)
        xw, xsc = _xq_load(x_base, xs_base, xr, x_ok, (c_lo + it + 2) * CHUNK, K, stride_xm, stride_xsm, MP, FMT)
    elif it + 1 < n_c:
        x_cur = _acts(x_base, xs_base, xr, x_ok, xg, xj, (c_lo + it + 1) * CHUNK, K, stride_xm, stride_xsm, MP,
                      FMT, A_QUANT)
    f_use = f_a
    if not SA:
        SPC: gl.constexpr = 8 if FMT == _FMT_NVFP4 else 4
        f_a = f_b
        f_b = _scale_factor(ws_ptr, srow, scol + gl.minimum(c_lo + it + 2, num_c - 1) * SPC, ncol, FMT)
    mbarrier.wait(bars.index(s), (g // STAGES) & 1)
    if FMT == _FMT_MXFP8:
        w2 = w_bufs.index(s).load(L82)
    else:
        w2 = w_bufs.index(s).load(L2)
    fence_async_shared()
    cta_barrier()  # every warp read slot s and wrote its activations before the refill / wgmma
    nxt = it + STAGES
    ok = nxt < n_c
    mbarrier.expect(bars.index(s), w_desc.block_type.nbytes, pred=ok)
    tma_load(w_desc, [w_row, (c_lo + nxt) * WPS], bars.index(s), w_bufs.index(s), pred=ok)

    if FMT == _FMT_MXFP8:
        w8 = gl.convert_layout(gl.reshape(w2, [BLOCK_N, 4, 8]), L8, assert_trivial=True)
        fac = gl.expand_dims(f_use, 2)
        p0, p1 = gl.inline_asm_elementwise(_DECODE_E4M3, "=r,=r,r,r", [w8, fac], dtype=(gl.int32, gl.int32),
                                           is_pure=True, pack=1)
        pr = gl.join(p0, p1)  # [64, t, w, b]
        lo = pr.to(gl.int16)
        hi = (pr >> 16).to(gl.int16)
        h = gl.join(lo, hi).to(gl.bfloat16, bitcast=True)  # [64, t, w, b, h]
        a = gl.reshape(gl.permute(h, (0, 2, 3, 1, 4)), [BLOCK_N, CHUNK])  # q = [w b t h]
    else:
        a = _decode_fp4(w2, f_use, FMT)
    a = gl.convert_layout(a, dot_l, assert_trivial=True)
    acc = warpgroup_mma(a, xb.permute((1, 0)), acc, is_async=True)
    # wait for it before the next chunk's decode: the wgmma reads its register operand until
    # it completes, and keeping that operand live across the next decode (waiting on one
    # outstanding wgmma) gave wrong results on the H200 (its registers were reused)
    acc, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a, xb))
    return acc, f_a, f_b, x_cur, xw, xsc


@gluon.jit
def _k_loop(w_desc, w_bufs, x_bufs, bars, step0, w_row, ws_ptr, srow, scol, ncol, x_base, xs_base, x_ok, xr, xg,
            xj, stride_xm, stride_xsm, K, c_lo, n_c, num_c, FMT: gl.constexpr, MP: gl.constexpr,
            STAGES: gl.constexpr, A_QUANT: gl.constexpr, SAHEAD: gl.constexpr):
    """acc [64, MP] = the weight tile at TMA row ``w_row`` (K steps c_lo .. c_lo + n_c) times the
    activation rows ``x_base + xr * stride_xm`` (``x_ok`` masks them; A_QUANT: quantized, scales at
    ``xs_base + xr * stride_xsm``). ``step0``: TMA steps this program ran before (ring slot and
    barrier phase continue from it). SAHEAD (-1: the rule below, 0 / 1: forced) loads the block
    scales two steps ahead."""
    acc_l: gl.constexpr = acc_layout(MP)
    SPC: gl.constexpr = 8 if FMT == _FMT_NVFP4 else 4
    WPS: gl.constexpr = 32 if FMT == _FMT_MXFP8 else 16  # int32 words per row and step
    for i in gl.static_range(STAGES):
        s0 = (step0 + i) % STAGES
        mbarrier.expect(bars.index(s0), w_desc.block_type.nbytes, pred=i < n_c)
        tma_load(w_desc, [w_row, (c_lo + i) * WPS], bars.index(s0), w_bufs.index(s0), pred=i < n_c)
    x_cur = _acts(x_base, xs_base, xr, x_ok, xg, xj, c_lo * CHUNK, K, stride_xm, stride_xsm, MP, FMT, A_QUANT)
    # The activations are loaded a step ahead (their first use is the next iteration's store).
    # Quantized ones (fp4 up to 16 rows, where the planner decodes in the gather: XQ2) are loaded
    # two steps ahead and decoded one step ahead (``_xq_load``); at 32 rows the words in flight
    # cost 15 registers (128 -> 143 with a bias), for mxfp8 22: there load and decode stay together.
    XQ2: gl.constexpr = A_QUANT and MP <= 16 and FMT != _FMT_MXFP8
    if XQ2:
        xw, xsc = _xq_load(x_base, xs_base, xr, x_ok, (c_lo + 1) * CHUNK, K, stride_xm, stride_xsm, MP, FMT)
    else:
        xw = 0  # (placeholders: unused without XQ2)
        xsc = 0
    acc = gl.zeros((BLOCK_N, MP), dtype=gl.float32, layout=acc_l)
    # The block scales are the loop's only other global loads. Loaded a step ahead as Triton values,
    # their conversion to factors sits in the step that issued them and waits for them there (the
    # register-operand tiled kernel measured the same: tiled_rs.py). SA: two steps in turn, each
    # with its own scale registers (asm loads into 32-bit registers), refilled with step j + 2's
    # right after use and read by nothing before then. Measured against the one-step loop (H200,
    # same process, bitwise equal; benchmarks/NOTES.md thirty-third session, 6 shapes x M 12 / 16 /
    # 32): fp4 weight-only at 12-16 rows 1.08-1.09x geomean (1.01-1.15), W x A 1.04-1.05x, 32 rows
    # 1.01x (0.98-1.04), grouped decode 1.03-1.12x; mxfp8 1.00-1.02x (0.98-1.03: left off). 64 rows
    # unmeasured (and at the register budget: plan/stream.py STREAM_REGS): left off. Activations
    # decoded in the gather (XQ2: W x A up to 16 rows, where the W x A rows above gained 1.04-1.05x)
    # left off too: at 16 rows 80 -> 101 registers for mxfp4, 119 for nvfp4 with a bias (AOT sm_90),
    # past the 96 the planner counts programs per SM with; the other builds stay within it.
    SA: gl.constexpr = SAHEAD == 1 or (SAHEAD == -1 and FMT != _FMT_MXFP8 and MP <= 32 and not XQ2)
    if SA:
        r0 = _scale_ahead(ws_ptr, srow, scol, ncol, c_lo, num_c, SPC)
        r1 = _scale_ahead(ws_ptr, srow, scol, ncol, c_lo + 1, num_c, SPC)
        for j in range(0, n_c, 2):
            f = _scale_landed(r0, scol, ncol, c_lo + j, SPC, FMT)
            r0 = _scale_ahead(ws_ptr, srow, scol, ncol, c_lo + j + 2, num_c, SPC)
            acc, f, _, x_cur, xw, xsc = _k_step(acc, j, f, 0, x_cur, xw, xsc, w_desc, w_bufs, x_bufs, bars, step0,
                                                w_row, ws_ptr, srow, scol, ncol, num_c, x_base, xs_base, x_ok, xr,
                                                xg, xj, stride_xm, stride_xsm, K, c_lo, n_c, FMT, MP, STAGES,
                                                A_QUANT, XQ2, SA)
            if j + 1 < n_c:
                f = _scale_landed(r1, scol, ncol, c_lo + j + 1, SPC, FMT)
                r1 = _scale_ahead(ws_ptr, srow, scol, ncol, c_lo + j + 3, num_c, SPC)
                acc, f, _, x_cur, xw, xsc = _k_step(acc, j + 1, f, 0, x_cur, xw, xsc, w_desc, w_bufs, x_bufs, bars,
                                                    step0, w_row, ws_ptr, srow, scol, ncol, num_c, x_base, xs_base,
                                                    x_ok, xr, xg, xj, stride_xm, stride_xsm, K, c_lo, n_c, FMT, MP,
                                                    STAGES, A_QUANT, XQ2, SA)
    else:
        f_cur = _scale_factor(ws_ptr, srow, scol + c_lo * SPC, ncol, FMT)
        f_nxt = _scale_factor(ws_ptr, srow, scol + gl.minimum(c_lo + 1, num_c - 1) * SPC, ncol, FMT)
        for it in range(n_c):
            acc, f_cur, f_nxt, x_cur, xw, xsc = _k_step(acc, it, f_cur, f_nxt, x_cur, xw, xsc, w_desc, w_bufs, x_bufs,
                                                        bars, step0, w_row, ws_ptr, srow, scol, ncol, num_c, x_base,
                                                        xs_base, x_ok, xr, xg, xj, stride_xm, stride_xsm, K, c_lo,
                                                        n_c, FMT, MP, STAGES, A_QUANT, XQ2, SA)
    return acc


@gluon.jit
def _decode_fp4(w2, f_use, FMT: gl.constexpr):
    """[64, 16] words of packed e2m1 (one step) and their block-scale factors -> the bf16 [64, 128]
    operand in the wgmma's K order (module docstring)."""
    L4: gl.constexpr = word_layout()
    w4 = gl.convert_layout(gl.reshape(w2, [BLOCK_N, 4, 2, 2]), L4, assert_trivial=True)
    if FMT == _FMT_NVFP4:
        fac = gl.expand_dims(f_use, 3)
        p0, p1, p2, p3 = gl.inline_asm_elementwise(_DECODE_NV, "=r,=r,=r,=r,r,r", [w4, fac],
                                                   dtype=(gl.int32, gl.int32, gl.int32, gl.int32),
                                                   is_pure=True, pack=1)
    else:
        fac = gl.expand_dims(gl.expand_dims(f_use, 2), 3)
        p0, p1, p2, p3 = gl.inline_asm_elementwise(_DECODE_MX, "=r,=r,=r,=r,r,r", [w4, fac],
                                                   dtype=(gl.int32, gl.int32, gl.int32, gl.int32),
                                                   is_pure=True, pack=1)
    # join appends a trailing dimension: the inner joins' is a1 (p0 | p2), the outer one's a0
    pr = gl.join(gl.join(p0, p2), gl.join(p1, p3))  # [64, t, i1, i0, a1, a0]
    lo = pr.to(gl.int16)
    hi = (pr >> 16).to(gl.int16)
    h = gl.join(lo, hi).to(gl.bfloat16, bitcast=True)  # [..., h]
    return gl.reshape(gl.permute(h, (0, 2, 3, 4, 5, 1, 6)), [BLOCK_N, CHUNK])


@gluon.jit
def _splitk_sum_store(part, part_ptr, cnt_ptr, tile, sp, SPLIT, offs, c_ptrs, mask, bias, TILE_ELEMS: gl.constexpr,
                      HAS_BIAS: gl.constexpr):
    """Split-K epilogue of this kernel and the tiled ones: store this split's fp32 partial tile
    (``part`` at ``offs``: any bijection onto [0, TILE_ELEMS), the workspace is private to the
    kernel; the tiled kernels pass ``mma_slot_offsets``, this kernel and direct.py column-major
    offsets, whose warp accesses are whole lines: direct.py's M = 2-8 split calls ran 1.04-1.15x
    faster than with row-major ones) to the workspace [SPLIT, tiles, TILE_ELEMS]; the last split of
    the tile to arrive sums the partials in split order (deterministic), adds ``bias`` (HAS_BIAS),
    stores the output and resets the tile's counter."""
    split_stride = (gl.num_programs(0) // SPLIT).to(gl.int64) * TILE_ELEMS
    base = part_ptr + tile.to(gl.int64) * TILE_ELEMS
    gl.store(base + sp * split_stride + offs, part)
    cta_barrier()  # every thread's partial store happens-before the release below
    cnt = cnt_ptr + tile
    arrived = gl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
    if arrived == SPLIT - 1:
        # the last unit of the tile sums the partials in split order. Plain loads: the acquire
        # above invalidates this SM's L1 (CCTL.IVALL) and the barrier orders the other threads'
        # loads after it, so no line of another split's partial can be stale here; ``.cg``
        # (strong GPU-scope loads in the SASS) was 1.27x slower in this sum (H200, 64 x 2880 x
        # 2880 mxfp4, split 5: 8.3k -> 6.6k cycles; benchmarks/NOTES.md, thirty-eighth session)
        tot = gl.load(base + offs)
        for s2 in range(1, SPLIT):
            tot = tot + gl.load(base + s2 * split_stride + offs)
        if HAS_BIAS:
            tot = tot + bias
        gl.store(c_ptrs, tot.to(c_ptrs.dtype.element_ty), mask=mask)
        gl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")


@gluon.jit
def mma_slot_offsets(r, c, COLS: gl.constexpr, WARPS: gl.constexpr):
    """Split-K workspace offsets of the elements (r [R, 1], c [1, COLS]) of an NVMMA v3 (wgmma)
    accumulator [R, COLS] over WARPS warps along its rows, in the threads' register order:
    register j of the W x 32 threads at j * 32 W + thread. So a warp's store or load of one
    register is one 128-byte line; row-major offsets spread it over 8 lines (a wgmma fragment
    holds 2 adjacent columns of 8 rows per quad of lanes), and the partial's store and sum ran
    at ~10 bytes per cycle per SM (H200, thirty-eighth session). Any bijection onto [0, R x COLS)
    is correct: the split that writes and the one that sums use the same. The fragment: warp
    (r // 16) % W, lane 4 (r % 8) + (c % 8) // 2, register c % 2 + 2 ((r // 8) % 2) + 4 (c // 8),
    plus COLS / 2 per repeat of the W x 16 rows."""
    w = (r // 16) % WARPS
    lane = (r % 8) * 4 + (c % 8) // 2
    reg = (c % 2) + 2 * ((r // 8) % 2) + 4 * (c // 8) + (COLS // 2) * (r // (16 * WARPS))
    return reg * (32 * WARPS) + w * 32 + lane


@gluon.jit
def _add_i32(a, b):
    return a + b


@gluon.jit
def _active_expert(seg_ptr, slot, M, NUM_E: gl.constexpr):
    """(the ``slot``-th expert, counting from 0, whose clamped offsets hold rows; whether there is
    one) from the contiguous offsets ``seg [NUM_E + 1]``; without one, expert 0 (its rows unused)."""
    P: gl.constexpr = _pow2(NUM_E)
    L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    idx = gl.arange(0, P, layout=L)
    ok = idx < NUM_E
    lo = gl.minimum(gl.maximum(gl.load(seg_ptr + idx, mask=ok, other=0), 0), M)
    hi = gl.minimum(gl.maximum(gl.load(seg_ptr + idx + 1, mask=ok, other=0), 0), M)
    act = ok & (hi > lo)
    hit = act & (gl.associative_scan(act.to(gl.int32), 0, _add_i32) == slot + 1)
    return gl.sum(gl.where(hit, idx, 0), axis=0), gl.sum(hit.to(gl.int32), axis=0) > 0


@gluon.constexpr_function
def _pow2(n):
    return 1 << max(0, (int(n) - 1).bit_length())


@gluon.jit
def _grouped_split_sum(part_ptr, cnt, SPLIT, M, N, m_e, row0, off_n, c_base, stride_cm, r, c, MP: gl.constexpr):
    """Split-K epilogue of the contiguous grouped form: after every row block's partial is stored
    (``[SPLIT, M, N]`` fp32 at the rows' places), arrive at the (slot, tile) counter ``cnt``; the
    last split to arrive sums the partials of every row block in split order (deterministic),
    stores the output and resets the counter. Every program arrives, with rows or without."""
    cta_barrier()  # every thread's partial stores happen-before the release below
    arrived = gl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
    if arrived == SPLIT - 1:
        for rb in range(gl.cdiv(m_e, MP)):
            mask = (r < N - off_n)[:, None] & (c < m_e - rb * MP)[None, :]
            prow = (row0 + rb * MP + c).to(gl.int64)[None, :] * N + (off_n + r)[:, None]
            tot = gl.load(part_ptr + prow, mask=mask, other=0.0, cache_modifier=".cg")
            for s2 in range(1, SPLIT):
                tot = tot + gl.load(part_ptr + s2 * M.to(gl.int64) * N + prow, mask=mask, other=0.0,
                                    cache_modifier=".cg")
            c_ptrs = c_base + (rb * MP + c).to(gl.int64)[None, :] * stride_cm + (off_n + r)[:, None]
            gl.store(c_ptrs, tot.to(c_base.dtype.element_ty), mask=mask)
        gl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")


# M and the steps per split follow the call (decode M, contiguous sum_m): one build serves them all
@gluon.jit(do_not_specialize=["M", "kc_per_split"])
def stream_kernel(w_desc, ws_ptr, x_ptr, xs_ptr, gs_ptr, ags_ptr, bias_ptr, c_ptr, part_ptr, cnt_ptr, seg_ptr, M, N,
                  K, kc_per_split, SPLIT, stride_wsn, stride_wse, stride_xm, stride_xe, stride_xsm, stride_xse,
                  stride_cm, stride_ce, FMT: gl.constexpr, MP: gl.constexpr, STAGES: gl.constexpr,
                  GROUPING: gl.constexpr, GS_PER_E: gl.constexpr, A_QUANT: gl.constexpr, HAS_AGS: gl.constexpr,
                  HAS_BIAS: gl.constexpr, num_warps: gl.constexpr, NUM_E: gl.constexpr = 0,
                  SAHEAD: gl.constexpr = -1):
    """Dense (GROUPING 0): one program per (64 weight rows, K split); ``w_desc``: TMA boxes [64, 16]
    of the packed weights viewed as int32 [N, K / 8] (mxfp8: boxes [64, 32] of [N, K / 4], 128-byte
    swizzle); ``ws_ptr``: uint8 E8M0 [N, K / 32] (mx) or e4m3 [N, K / 16] (nvfp4) block scales, row stride ``stride_wsn``; ``x_ptr``: bf16 [M, K]
    (K contiguous, M <= MP); ``gs_ptr``: nvfp4's fp32 global scale (any pointer for mxfp4);
    A_QUANT: ``x_ptr`` holds quantized activations of the weight's format as int32 words of their
    data ([M, K / 8] e2m1, [M, K / 4] e4m3; strides in words), ``xs_ptr`` their block scales (row
    stride ``stride_xsm``, expert stride ``stride_xse``), decoded in the gather (``_xq_load`` / ``_xq_decode``);
    ``ags_ptr`` (HAS_AGS, nvfp4): the activations' fp32 global scale (decoded here, or dequantized
    to bf16 by the host without it: exact, e2m1 x e4m3); ``bias_ptr`` (HAS_BIAS, dense only): [N]
    added in fp32 before the output's rounding;
    ``c_ptr``: [M, N] (N contiguous); ``part_ptr`` / ``cnt_ptr``: the split-K workspace fp32
    [SPLIT, tiles, 64, MP] and int32 zeros [tiles] (SPLIT > 1). Every split non-empty (the host).

    Grouped: one program per (expert e, 64-row tile) (x SPLIT K splits, contiguous only: the
    partials go to ``part_ptr`` as fp32 [SPLIT, M, N], the counters ``cnt_ptr`` are one per
    (slot, tile), ``_grouped_split_sum``); weights [E, N, K / 2] as int32
    [E * N, K / 8] (a tile's box may run into the next expert's rows: never stored), scales with
    expert stride ``stride_wse``, ``gs_ptr`` [E] where GS_PER_E. GROUPING 1 (contiguous): expert
    e owns rows ``seg[e] .. seg[e + 1]`` of x [sum_m, K] / c [sum_m, N]; GROUPING 2 (masked):
    ``seg[e]`` rows (at most M = max_m) of x [E, max_m, K] / c [E, max_m, N] (expert strides
    ``stride_xe`` / ``stride_ce``). An expert's rows run in blocks of MP, each streaming the tile's
    weights again; an expert without rows exits at once (decode: most of them). NUM_E > 0
    (contiguous only): the grid is compacted to fewer expert slots than the NUM_E experts (the host
    launches min(E, sum_m) slots x tiles: at most sum_m experts have rows), slot j taking the j-th
    expert with rows (``_active_expert``): at decode most of E x tiles programs would exit at once
    (gpt-oss-120b, T = 1: 4 of 128 experts)."""
    gl.static_assert(num_warps == 4, "one warpgroup")
    gl.static_assert(STAGES >= 2, "need at least 2 pipeline stages")
    L4: gl.constexpr = word_layout()
    xl: gl.constexpr = x_layout(MP)
    xs_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([MP, CHUNK], gl.bfloat16)

    pid = gl.program_id(0)
    if GROUPING == 0:
        tile = pid // SPLIT
        sp = pid % SPLIT
        e = pid * 0
        row0 = pid * 0
        m_e = M
    else:
        tiles = gl.cdiv(N, BLOCK_N)
        # contiguous grids may split K (SPLIT > 1): pid = (slot x tiles + tile) x SPLIT + split
        sp = pid % SPLIT
        e = (pid // SPLIT) // tiles
        tile = (pid // SPLIT) % tiles
        unit = pid // SPLIT  # the (slot, tile) whose split-K counter this program arrives at
        # offsets / counts clamped to [0, M]: unvalidated bad metadata gives wrong rows (the device
        # check flags it), never an out-of-bounds access (tests/test_grouped.py, memory safety)
        if GROUPING == 1:
            if NUM_E > 0:  # a compacted grid: program slot e takes the e-th expert that has rows
                e, has = _active_expert(seg_ptr, e, M, NUM_E)
            row0 = gl.minimum(gl.maximum(gl.load(seg_ptr + e), 0), M)
            m_e = gl.maximum(gl.minimum(gl.maximum(gl.load(seg_ptr + e + 1), 0), M) - row0, 0)
            if NUM_E > 0:
                m_e = gl.where(has, m_e, 0)
        else:
            row0 = pid * 0
            m_e = gl.minimum(gl.maximum(gl.load(seg_ptr + e), 0), M)
    off_n = tile * BLOCK_N
    num_c = gl.cdiv(K, CHUNK)
    c_lo = sp * kc_per_split
    n_c = gl.minimum(kc_per_split, num_c - c_lo)
    e64 = e.to(gl.int64)
    x_base = x_ptr + e64 * stride_xe + row0.to(gl.int64) * stride_xm
    xs_base = xs_ptr + e64 * stride_xse + row0.to(gl.int64) * stride_xsm
    c_base = c_ptr + e64 * stride_ce + row0.to(gl.int64) * stride_cm
    ws_e = ws_ptr + e64 * stride_wse
    w_row = e * N + off_n

    WPS: gl.constexpr = 32 if FMT == _FMT_MXFP8 else 16  # int32 words per row and step
    w_bufs = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, WPS], w_desc.layout)
    x_bufs = gl.allocate_shared_memory(gl.bfloat16, [2, MP, CHUNK], xs_layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)

    # block scales: per thread rows r and r + 8 of its warp, block t (mx) or 2t + i1 (nvfp4)
    SL3: gl.constexpr = gl.SliceLayout(3, L4)
    if FMT == _FMT_MXFP8:
        SL8: gl.constexpr = gl.SliceLayout(2, word8_layout())
        r3 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, SL8))
        t3 = gl.arange(0, 4, layout=gl.SliceLayout(0, SL8))
        srow = gl.expand_dims((off_n + gl.minimum(r3, N - 1 - off_n)).to(gl.int64) * stride_wsn, 1)
        scol = gl.expand_dims(t3, 0)
        ncol = gl.cdiv(K, 32)
    elif FMT == _FMT_NVFP4:
        r3 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.SliceLayout(2, SL3)))
        t3 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, SL3)))
        i3 = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, SL3)))
        srow = gl.expand_dims(gl.expand_dims((off_n + gl.minimum(r3, N - 1 - off_n)).to(gl.int64) * stride_wsn, 1), 2)
        scol = gl.expand_dims(gl.expand_dims(t3 * 2, 0), 2) + gl.expand_dims(gl.expand_dims(i3, 0), 1)
        ncol = gl.cdiv(K, 16)
    else:
        SL2: gl.constexpr = gl.SliceLayout(2, SL3)
        r3 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, SL2))
        t3 = gl.arange(0, 4, layout=gl.SliceLayout(0, SL2))
        srow = gl.expand_dims((off_n + gl.minimum(r3, N - 1 - off_n)).to(gl.int64) * stride_wsn, 1)
        scol = gl.expand_dims(t3, 0)
        ncol = gl.cdiv(K, 32)

    xr = gl.arange(0, MP, layout=gl.SliceLayout(1, gl.SliceLayout(2, xl)))
    xg = gl.arange(0, 16, layout=gl.SliceLayout(1, gl.SliceLayout(0, xl)))
    xj = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(0, xl)))

    out_l: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, 4], [0, 1])
    r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, out_l))
    c = gl.arange(0, MP, layout=gl.SliceLayout(0, out_l))
    if FMT == _FMT_NVFP4:
        if GS_PER_E:
            gb = gl.load(gs_ptr + e).to(gl.float32)
        else:
            gb = gl.load(gs_ptr).to(gl.float32)
        if HAS_AGS:  # the activations' global scale (decoded here or dequantized by the host without it)
            gb = gb * gl.load(ags_ptr).to(gl.float32)
        if A_QUANT:  # activations decoded here carry the weights' 2**-8 decode factor too
            out_scale = gl.div_rn(gl.full([], 65536.0, gl.float32), gb)
        else:
            out_scale = gl.div_rn(gl.full([], 256.0, gl.float32), gb)

    if GROUPING == 0:
        # dense: M <= MP, one row block (no loop: the loop nest cost ~75 registers per thread in
        # the sm_90 build, 77 -> 151, and with them programs per SM)
        acc = _k_loop(w_desc, w_bufs, x_bufs, bars, 0, w_row, ws_e, srow, scol, ncol, x_base, xs_base, xr < m_e, xr,
                      xg, xj, stride_xm, stride_xsm, K, c_lo, n_c, num_c, FMT, MP, STAGES, A_QUANT, SAHEAD)
        if FMT == _FMT_NVFP4:
            acc = acc * out_scale
        if HAS_BIAS:  # loaded after the K loop: no registers held across it
            bias = gl.load(bias_ptr + off_n + r, mask=r < N - off_n, other=0.0).to(gl.float32)[:, None]
        else:
            bias = 0.0
        mask = (r < N - off_n)[:, None] & (c < m_e)[None, :]
        c_ptrs = c_base + c.to(gl.int64)[None, :] * stride_cm + (off_n + r)[:, None]
        if SPLIT == 1:
            res = gl.convert_layout(acc, out_l)
            if HAS_BIAS:
                res = res + bias
            gl.store(c_ptrs, res.to(c_ptr.dtype.element_ty), mask=mask)
        else:
            # column-major: a thread's 8 rows are 32 contiguous bytes, a warp's lanes along them 256
            offs = (c * BLOCK_N)[None, :] + r[:, None]
            _splitk_sum_store(gl.convert_layout(acc, out_l), part_ptr, cnt_ptr, tile, sp, SPLIT, offs, c_ptrs, mask,
                              bias, BLOCK_N * MP, HAS_BIAS)
    else:
        gl.static_assert(not HAS_BIAS, "the grouped form takes no bias")
        for rb in range(gl.cdiv(m_e, MP)):
            rows_left = m_e - rb * MP
            acc = _k_loop(w_desc, w_bufs, x_bufs, bars, rb * n_c, w_row, ws_e, srow, scol, ncol,
                          x_base + (rb * MP).to(gl.int64) * stride_xm, xs_base + (rb * MP).to(gl.int64) * stride_xsm,
                          xr < rows_left, xr, xg, xj, stride_xm, stride_xsm, K, c_lo, n_c, num_c, FMT, MP, STAGES,
                          A_QUANT, SAHEAD)
            if FMT == _FMT_NVFP4:
                acc = acc * out_scale
            mask = (r < N - off_n)[:, None] & (c < rows_left)[None, :]
            if SPLIT == 1:
                c_ptrs = c_base + (rb * MP + c).to(gl.int64)[None, :] * stride_cm + (off_n + r)[:, None]
                gl.store(c_ptrs, gl.convert_layout(acc, out_l).to(c_ptr.dtype.element_ty), mask=mask)
            else:  # this split's fp32 partial of the rows, at their place in [SPLIT, M, N]
                prow = (row0 + rb * MP + c).to(gl.int64)[None, :] * N + (off_n + r)[:, None]
                gl.store(part_ptr + sp.to(gl.int64) * M * N + prow, gl.convert_layout(acc, out_l), mask=mask)
        if SPLIT > 1:
            _grouped_split_sum(part_ptr, cnt_ptr + unit, SPLIT, M, N, m_e, row0, off_n, c_base, stride_cm, r, c, MP)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
