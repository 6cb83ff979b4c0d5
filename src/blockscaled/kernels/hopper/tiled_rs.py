"""The sm_90a tiled MX / NV GEMM with the weights as the wgmma's register operand (swap-AB), in Gluon.

``C[m, n] = sum_k x[m, k] * dequantize(W)[n, k]`` (+ bias) for prefill-sized M, bf16 activations x
mxfp4 / nvfp4 / mxfp8 weights. Kernel body only; the host launcher is ``blockscaled.ops._tiled``.

Why a second tiled kernel (benchmarks/NOTES.md, twenty-eighth session): ``tiled.py`` stores each
decoded weight tile to shared memory as a bf16 wgmma operand, so every weight element is written
and read back at 2 bytes and the math warpgroups meet at a CTA barrier per K step; it runs at
~0.55-0.75x cuBLAS bf16's rate, and moving the decode to a warpgroup of its own did not change that.
Here the decoded weights never leave the registers:

* the output tile is BN = 128 (or 256) weight rows x BT tokens (BT = 16 .. 256), computed
  transposed: two (or four) consumer warpgroups each own 64 weight rows, the wgmma's M side, as
  its register operand A; the tokens are the wgmma's N side, B = the activation box [BT, 64] from
  shared memory (TMA, 128-byte swizzle), shared by the consumers;
* a TMA producer warp fills a ring of STAGES slots (the activations and the packed weights of
  one 64-element K step: [BN rows, 8 int32 words]); each slot's ``empty`` barrier takes one
  arrival per consumer, so the consumers never wait for each other;
* the weights stay in natural K order: the wgmma's A fragment gives lane quad t the element
  pairs (2t, 2t + 1) and (2t + 8, 2t + 9) of each 16-element block, i.e. byte t of every 32-bit
  word of packed e2m1 (word i of a step holds elements 8i .. 8i + 7, byte b the pair (2b, 2b+1));
  each thread loads its rows' 8 words whole (two 128-bit shared loads per row, the quad's four
  threads read the same addresses: a broadcast) and selects its byte per word with one ``prmt``
  that also places the byte's high nibble 16 bits above its low one: the streaming kernel's pair
  decode then yields the bf16x2 register of the pair (exact products of code and block scale);
  mxfp8: 16 words per row and step, the pair is bytes 2t, 2t + 1 of words 2i, 2i + 1 (one prmt over
  both, then the streaming kernel's e4m3 decode: ``_RS_PAIR_E4M3``);
* the decoded registers are the wgmma's A operand as they are (the conversion is asserted
  trivial at compile time); each consumer waits for its own wgmma before its next decode, and the
  other consumer's wgmma can keep the tensor cores busy meanwhile. Decoding the next step under
  the in-flight wgmma, half steps, and a ping-pong order of the two consumers were built and
  measured no faster (docs/design.md, "The register-operand tiled kernel").

Measured (H200, benchmarks/NOTES.md twenty-eighth session): at M >= 2048 1.1-1.35x the planner's
previous tiled config (tiled.py's 16-warp 256-row form, which this kernel replaced) on mxfp4 and
1.0-1.1x on nvfp4; 0.61-0.86x (mxfp4) / 0.54-0.80x (nvfp4) cuBLAS bf16 on pre-dequantized weights.

Numerics: as ``tiled.py`` (exact products, fp32 accumulation in the tensor core, one rounding at
the store; nvfp4's 2**-8 decode factor undone with the global scale in the epilogue). K must be a
multiple of 32 (16-byte TMA rows of packed e2m1, 32-byte rows of e4m3; the planner checks): TMA zero-fills the codes and
activations past K, N and M; scale loads past K read 2**0 / 0, never a NaN code.

Token tiles, K split, consumers: BT (the activation box's rows, the wgmma's N) is 256 for prefill
(R3 of plan/tiled.py) and 64 between the streaming kernel's rows and prefill (R4 with a K split,
R5 with four consumers, unsplit). With SPLIT > 1 each program runs K steps ``k_lo ..`` of its tile,
and each consumer's fp32 partial of its 64 rows is summed in split order by the last of that
part's splits to arrive (``stream._splitk_sum_store``: deterministic; one counter per consumer).
The split epilogue holds the partial, its sum and the output pointers at once: above 64 tokens or
with four consumers ptxas spills there, so those forms run unsplit (GemmConfig refuses the split).
Four consumers (BN = 256, the weight box's rows) halve the programs of a wide N (H200: 1.15-1.31x
the two-consumer form where that saves a round of programs; per 128 rows and step only ~15 %
cheaper).

Grouped (MODE 1 contiguous, 2 masked): as ``tiled.py``, the token tiles numbered densely over the
experts on the device (``wide._segments``), weights the 2-D view [E x N, K / 8].
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from .direct import _out_scale
from .stream import (_FMT_MXFP4, _FMT_MXFP8, _FMT_NVFP4, _LD_U8, _scale_bits, _scale_factor, _splitk_sum_store,
                     mma_slot_offsets)
from .tiled import BLOCK_K, _tiled_producer, tile_rows

__all__ = ["tiled_rs_kernel", "RS_ROWS", "rs_layouts"]

#: weight rows per consumer warpgroup (the wgmma's M) and per program (two consumers)
RS_ROWS = gl.constexpr(64)

# One pair of e2m1 codes -> its bf16x2 register: $1 = the 32-bit word holding the pair's byte,
# $2 = the prmt selector of this thread's byte (t | (t + 4) << 8: the byte to bits 0..7 and the
# word shifted right by 4 to bits 16..23, so the high nibble sits 16 bits above the low one), $3 =
# the block's bf16x2 factor. Then the streaming kernel's pair code (stream._PAIR with j = 0):
# magnitudes to bf16 bits 6..8 / 22..24, signs to 15 / 31, times 2**126 (mx: the placed bits are
# e2m1 * 2**-126) and times the factor; fma with -0.0 keeps the sign of zero products.
_RS_PAIR = """
{{
.reg .b32 h, v, m, s, nz, c;
mov.b32 nz, 0x80008000;
mov.b32 c, 0x7E807E80;
shr.b32 h, $1, 4;
prmt.b32 v, $1, h, $2;
shl.b32 m, v, 6;
and.b32 m, m, 0x01C001C0;
shl.b32 s, v, 12;
and.b32 s, s, 0x80008000;
or.b32 m, m, s;
{mx}fma.rn.bf16x2 $0, m, $3, nz;
}}
"""
_RS_PAIR_MX = gl.constexpr(_RS_PAIR.format(mx="fma.rn.bf16x2 m, m, c, nz;\n"))
_RS_PAIR_NV = gl.constexpr(_RS_PAIR.format(mx=""))

# mxfp8: one pair of e4m3 codes -> its bf16x2 register. A step's 64 codes of a row are 16 words; the
# pair (8i + 2t, 8i + 2t + 1) of lane quad t is bytes 2t, 2t + 1 of words (2i, 2i + 1) = $1, $2, so
# one prmt ($3 = its selector) places the two bytes in bits 8..15 and 24..31. Then the streaming
# kernel's e4m3 decode (stream._DECODE_E4M3): the 7 magnitude bits to bf16 bits 4..10 (the value
# e4m3 * 2**-120, subnormals included), the sign to bit 15, times 2**120 (0x7B80: exact), times the
# E8M0 factor $4 (exact); a NaN code (magnitude 0x7F: + 1 carries into bit 7) multiplies by NaN, so
# the output element is NaN as the float64 reference's is.
_RS_PAIR_E4M3 = gl.constexpr("""
{
.reg .b32 v, m, s, t, c, nz;
.reg .pred p;
mov.b32 nz, 0x80008000;
prmt.b32 v, $1, $2, $3;
and.b32 m, v, 0x7F007F00;
add.u32 t, m, 0x01000100;
and.b32 t, t, 0x80008000;
setp.ne.u32 p, t, 0;
selp.b32 c, 0x7FC07FC0, 0x7B807B80, p;
shr.b32 m, m, 4;
and.b32 s, v, 0x80008000;
or.b32 m, m, s;
fma.rn.bf16x2 m, m, c, nz;
fma.rn.bf16x2 $0, m, $4, nz;
}
""")


@gluon.constexpr_function
def rs_layouts(ns):
    """(words [64, 8], pairs [64, NS, WPB, 4]) register layouts of one consumer's step (4 warps):
    NS scale blocks per row and step (2 mx, 4 nvfp4), WPB = 8 / NS words per block, 4 = the lane
    quad t. A thread holds rows r and r + 8 (r = lane / 4 + 16 warp), all 8 words of each (the
    quad's lanes hold the same words), and in the pair layout only its own t."""
    wpb = 8 // ns

    def c4(i):  # word index bit -> [row, block, word, t]
        return [0, 0, i, 0] if i < wpb else [0, i // wpb, 0, 0]

    words = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [8, 0]],
        lane_bases=[[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 8])
    pairs = gl.DistributedLinearLayout(
        reg_bases=[c4(1), c4(2), c4(4), [8, 0, 0, 0]],
        lane_bases=[[0, 0, 0, 1], [0, 0, 0, 2], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]],
        warp_bases=[[16, 0, 0, 0], [32, 0, 0, 0]], block_bases=[], shape=[64, ns, wpb, 4])
    return words, pairs


@gluon.constexpr_function
def rs_words8_layout():
    """mxfp8: one consumer's step of e4m3 codes as int32 words [64 rows, 2 (scale block), 4 (w), 2 (j)]
    (word 8 block + 2 w + j): a thread holds rows r and r + 8 whole (four 128-bit shared loads per row,
    the quad's lanes reading the same addresses), j in its lowest register bit so that a split
    gives the words 2i and 2i + 1 (i = 4 block + w) in ``rs_layouts(2)``'s word layout."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 0, 1], [0, 0, 1, 0], [0, 0, 2, 0], [0, 1, 0, 0], [8, 0, 0, 0]],
        lane_bases=[[0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]],
        warp_bases=[[16, 0, 0, 0], [32, 0, 0, 0]], block_bases=[], shape=[64, 2, 4, 2])


@gluon.constexpr_function
def rs_words8_2d_layout():
    """The same words as [64, 16] (the shared-memory load)."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [8, 0]],
        lane_bases=[[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 16])


@gluon.constexpr_function
def rs_acc_layout(bt):
    """One consumer's accumulator [64 weight rows, BT tokens]: wgmma m64 nBT."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, bt, 16])


@gluon.jit
def _rs_decode(words, fac, sel, FMT: gl.constexpr):
    """words [64, NS, WPB, 1] (mxfp8: a pair of them, words 2i and 2i + 1), factors [64, NS, 1, 1],
    selectors [1, 1, 1, 4] -> the bf16 A operand [64, 64] (K order 8i + 2t + h, natural)."""
    if FMT == _FMT_MXFP8:  # words: (word 2i, word 2i + 1)
        pr = gl.inline_asm_elementwise(_RS_PAIR_E4M3, "=r,r,r,r,r", [words[0], words[1], sel, fac], dtype=gl.int32,
                                       is_pure=True, pack=1)
    elif FMT == _FMT_NVFP4:
        pr = gl.inline_asm_elementwise(_RS_PAIR_NV, "=r,r,r,r", [words, sel, fac], dtype=gl.int32, is_pure=True,
                                       pack=1)
    else:
        pr = gl.inline_asm_elementwise(_RS_PAIR_MX, "=r,r,r,r", [words, sel, fac], dtype=gl.int32, is_pure=True,
                                       pack=1)
    pr = gl.reshape(pr, [64, 8, 4])  # [row, word i, t]
    lo = pr.to(gl.int16)
    hi = (pr >> 16).to(gl.int16)
    h = gl.join(lo, hi).to(gl.bfloat16, bitcast=True)  # [row, i, t, h]: element 8i + 2t + h
    return gl.reshape(h, [64, BLOCK_K])


@gluon.jit
def _scale_ahead(sbase, k_lo, j, n_k, sc, ncol, NS: gl.constexpr):
    """The raw scales of this program's K step ``j`` (clamped into the row: always a valid address),
    loaded into int32 registers that nothing reads until the step comes (``_scale_landed``)."""
    col = gl.minimum((k_lo + gl.maximum(gl.minimum(j, n_k - 1), 0)) * NS + sc, ncol - 1)
    return gl.inline_asm_elementwise(_LD_U8, "=r,l", [sbase + col[None, :]], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _scale_landed(r, k_lo, i, sc, ncol, NS: gl.constexpr, FMT: gl.constexpr):
    """Step ``i``'s scales from ``_scale_ahead``'s registers in the stored type; columns past K (the
    zero-filled codes) as ``stream._scale_raw`` reads them: 0 (nvfp4) / 2**0 (mxfp4)."""
    col = (k_lo + i) * NS + sc
    if FMT == _FMT_NVFP4:
        v = gl.where((col < ncol)[None, :], r, 0).to(gl.uint8).to(gl.float8e4nv, bitcast=True)
    else:
        v = gl.where((col < ncol)[None, :], r, 127).to(gl.uint8)
    return v


@gluon.jit
def _rs_kstep(acc, x_bufs, w_bufs, ready, empty, i, f, sel, G: gl.constexpr, NS: gl.constexpr, WPB: gl.constexpr,
              FMT: gl.constexpr, STAGES: gl.constexpr, WL: gl.constexpr, W3: gl.constexpr, a_l: gl.constexpr):
    """K step ``i`` of consumer G: wait for its slot, decode its words with the factors ``f`` into the
    A operand, one wgmma [64, 64] x [64, BT] waited for, release the slot."""
    s = i % STAGES
    mbarrier.wait(ready.index(s), (i // STAGES) & 1)
    w2 = w_bufs.index(s).slice(G * 64, 64).load(WL)
    if FMT == _FMT_MXFP8:
        w4 = gl.convert_layout(gl.reshape(w2, [64, NS, WPB, 2]), rs_words8_layout(), assert_trivial=True)
        w_even, w_odd = gl.split(w4)
        words = (gl.expand_dims(gl.convert_layout(w_even, W3, assert_trivial=True), 3),
                 gl.expand_dims(gl.convert_layout(w_odd, W3, assert_trivial=True), 3))
    else:
        words = gl.expand_dims(gl.convert_layout(gl.reshape(w2, [64, NS, WPB]), W3, assert_trivial=True), 3)
    a = _rs_decode(words, gl.expand_dims(gl.expand_dims(f, 2), 3), sel, FMT)
    a = gl.convert_layout(a, a_l, assert_trivial=True)
    acc = warpgroup_mma(a, x_bufs.index(s).permute((1, 0)), acc, is_async=True)
    acc, a = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a))
    mbarrier.arrive(empty.index(s), count=1)
    return acc


@gluon.jit
def _rs_consumer(x_bufs, w_bufs, ready, empty, ws_ptr, gs_ptr, ags_ptr, bias_ptr, c_ptr, part_ptr, cnt_ptr, SPLIT,
                 tile, sp, row_end, N, K, stride_wsn, stride_cm, off_m, off_n, e, stride_wse, k_lo, n_k,
                 G: gl.constexpr, FMT: gl.constexpr, BT: gl.constexpr, STAGES: gl.constexpr, HAS_AGS: gl.constexpr,
                 HAS_BIAS: gl.constexpr, GS_PER_E: gl.constexpr):
    """Consumer warpgroup G (0 / 1): weight rows off_n + 64 G .. + 63 of the tile. Per K step:
    wait for the slot, load and decode its words into the A operand, one wgmma [64, 64] x [64, BT]
    and wait for it, release the slot; then the epilogue (tokens below ``row_end``). SPLIT > 1:
    this program's K steps ``k_lo ..`` give an fp32 partial of the half tile, summed in split order
    by the last of its splits to arrive (each half its own counter: ``cnt_ptr`` holds two per
    tile, the second half's after all the first ones)."""
    NS: gl.constexpr = 4 if FMT == _FMT_NVFP4 else 2
    WPB: gl.constexpr = 8 // NS
    SPB: gl.constexpr = 16 if FMT == _FMT_NVFP4 else 32  # elements per scale
    WL: gl.constexpr = rs_words8_2d_layout() if FMT == _FMT_MXFP8 else rs_layouts(NS)[0]
    PL: gl.constexpr = rs_layouts(NS)[1]
    W3: gl.constexpr = gl.SliceLayout(3, PL)
    FL: gl.constexpr = gl.SliceLayout(2, W3)  # [64, NS] factors
    acc_l: gl.constexpr = rs_acc_layout(BT)
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)

    tq = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, PL))))
    if FMT == _FMT_MXFP8:  # bytes 2t, 2t + 1 of the word pair to bytes 1 and 3 (bytes 0 and 2: masked off)
        sel = (((2 * tq) * 0x11) | ((2 * tq + 1) * 0x1100))[None, None, None, :]
    else:
        sel = (tq | ((tq + 4) << 8))[None, None, None, :]

    row0 = off_n + G * 64
    sr = gl.arange(0, 64, layout=gl.SliceLayout(1, FL))
    sc = gl.arange(0, NS, layout=gl.SliceLayout(0, FL))
    srow = e.to(gl.int64) * stride_wse + (row0 + gl.minimum(sr, N - 1 - row0)).to(gl.int64)[:, None] * stride_wsn
    ncol = gl.cdiv(K, SPB)

    acc = gl.zeros((64, BT), dtype=gl.float32, layout=acc_l)
    # The scales are the K loop's only global loads. Loaded one step ahead, the factor's decode
    # waits for them within the step that issued them (H200, the loads left out: nvfp4 1.30-1.61x,
    # mxfp4 1.09-1.16x faster; their conversion left in costs only 2-11 %). AHEAD: two steps in
    # turn, each with its own scale registers, refilled with step j + 2's right after use and read
    # by nothing before then (a copy between registers would wait for the load): two steps to land.
    # Measured against the one-step loop (benchmarks/NOTES.md thirty-second session): nvfp4 (eight
    # scale bytes per thread and step) 0.98-1.21x on 12 rows (geomean 1.10), mxfp4 at 256 tokens
    # 1.01-1.04x, mxfp4 at 64 tokens 0.97-1.00x (four bytes: the one-step loop stays there)
    AHEAD: gl.constexpr = FMT == _FMT_NVFP4 or BT == 256
    if AHEAD:
        sbase = ws_ptr + srow
        r0 = _scale_ahead(sbase, k_lo, 0, n_k, sc, ncol, NS)
        r1 = _scale_ahead(sbase, k_lo, 1, n_k, sc, ncol, NS)
        for j in range(0, n_k, 2):
            f = _scale_bits(_scale_landed(r0, k_lo, j, sc, ncol, NS, FMT), FMT)
            r0 = _scale_ahead(sbase, k_lo, j + 2, n_k, sc, ncol, NS)
            acc = _rs_kstep(acc, x_bufs, w_bufs, ready, empty, j, f, sel, G, NS, WPB, FMT, STAGES, WL, W3, a_l)
            if j + 1 < n_k:
                f = _scale_bits(_scale_landed(r1, k_lo, j + 1, sc, ncol, NS, FMT), FMT)
                r1 = _scale_ahead(sbase, k_lo, j + 3, n_k, sc, ncol, NS)
                acc = _rs_kstep(acc, x_bufs, w_bufs, ready, empty, j + 1, f, sel, G, NS, WPB, FMT, STAGES, WL, W3,
                                a_l)
    else:
        f_cur = _scale_factor(ws_ptr, srow, (k_lo * NS + sc)[None, :], ncol, FMT)
        for i in range(n_k):
            f_nxt = _scale_factor(ws_ptr, srow, ((k_lo + gl.minimum(i + 1, n_k - 1)) * NS + sc)[None, :], ncol, FMT)
            acc = _rs_kstep(acc, x_bufs, w_bufs, ready, empty, i, f_cur, sel, G, NS, WPB, FMT, STAGES, WL, W3, a_l)
            f_cur = f_nxt

    if FMT == _FMT_NVFP4:
        acc = acc * _out_scale(gs_ptr, ags_ptr, e, GS_PER_E, HAS_AGS)
    # stored from the wgmma layout (transposed: a thread's column pairs are two tokens, i.e. two
    # output rows); a conversion would need shared-memory scratch next to the ring
    wr = gl.arange(0, 64, layout=gl.SliceLayout(1, acc_l))
    tk = gl.arange(0, BT, layout=gl.SliceLayout(0, acc_l))
    mask = (wr < N - row0)[:, None] & (tk < row_end - off_m)[None, :]
    c_ptrs = c_ptr + (off_m + tk).to(gl.int64)[None, :] * stride_cm + (row0 + wr)[:, None]
    if HAS_BIAS:
        bias = gl.load(bias_ptr + row0 + wr, mask=wr < N - row0, other=0.0).to(gl.float32)[:, None]
    else:
        bias = 0.0
    if SPLIT == 1:
        res = acc
        if HAS_BIAS:
            res = res + bias
        gl.store(c_ptrs, res.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        # this half's partial: the G-th 64 x BT block of the tile's workspace, in register order
        NC: gl.constexpr = w_bufs.shape[1] // 64  # consumer warpgroups of the program
        offs = G * 64 * BT + mma_slot_offsets(wr[:, None], tk[None, :], BT, 4)
        cnt = cnt_ptr + G * (gl.num_programs(0) // SPLIT)
        _splitk_sum_store(acc, part_ptr, cnt, tile, sp, SPLIT, offs, c_ptrs, mask, bias, NC * 64 * BT, HAS_BIAS)


#: registers of the TMA producer warp (it holds a few indices)
RS_PRODUCER_REGS = gl.constexpr(40)
#: registers of the second consumer warpgroup (the first, the default partition, gets what the
#: producer and this one leave): a 64 x 256 fp32 accumulator is 128 per thread
RS_CONSUMER_REGS = gl.constexpr(232)
#: with four consumer warpgroups (256 weight rows per program): each of the three worker consumers
#: (the 21 warps' launch leaves ~96 registers per thread; a 64 x 64 accumulator is 32)
RS_CONSUMER4_REGS = gl.constexpr(112)
RS_PRODUCER4_REGS = gl.constexpr(24)


@gluon.jit(do_not_specialize=["M", "ks_per_split"])
def tiled_rs_kernel(x_desc, w_desc, ws_ptr, gs_ptr, ags_ptr, bias_ptr, c_ptr, part_ptr, cnt_ptr, M, N, K, ks_per_split,
                    SPLIT, stride_wsn, stride_cm, seg_ptr, E, stride_wse, FMT: gl.constexpr, STAGES: gl.constexpr,
                    HAS_AGS: gl.constexpr, HAS_BIAS: gl.constexpr, MODE: gl.constexpr, E_POW2: gl.constexpr, GS_PER_E: gl.constexpr,
                    num_warps: gl.constexpr):
    """One program per (output tile of BT tokens x BN weight rows, K split), the weight tiles
    innermost (consecutive programs share the activation rows). ``x_desc``: TMA boxes [BT, 64] of
    bf16 x [M, K] (128-byte swizzle); ``w_desc``: boxes [BN, 8] (BN = 128 or 256: two or four
    consumer warpgroups) of the packed e2m1 weights as int32 [N, K / 8] (mxfp8: boxes [BN, 16] of
    the e4m3 weights as int32 [N, K / 4]; unswizzled); ``part_ptr`` /
    ``cnt_ptr``: fp32 [SPLIT, tiles, BN, BT] and int32 zeros [BN / 64 x tiles] (SPLIT > 1), each split
    ``ks_per_split`` 64-element K steps (every split non-empty: the host); ``ws_ptr``: E8M0 [N, K / 32] (mxfp4 / mxfp8) or e4m3 [N, K / 16]
    (nvfp4) scales, row stride ``stride_wsn``; ``gs_ptr``: nvfp4's fp32 global scale; ``ags_ptr``
    (HAS_AGS): the activations' fp32 global scale (nvfp4 W x A); ``bias_ptr`` [N] (HAS_BIAS);
    ``c_ptr`` [M, N] (N contiguous). Grouped modes: as ``tiled.tiled_kernel`` (no bias)."""
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    WPR: gl.constexpr = 16 if FMT == _FMT_MXFP8 else 8  # int32 words per row and 64-element K step
    BT: gl.constexpr = x_desc.block_type.shape[0]
    BN: gl.constexpr = w_desc.block_type.shape[0]  # 128 or 256 weight rows: 2 or 4 consumer warpgroups
    gl.static_assert(BN == 2 * RS_ROWS or BN == 4 * RS_ROWS, "128 or 256 weight rows per program")

    pid = gl.program_id(0)
    tile = pid // SPLIT
    sp = pid % SPLIT
    tiles_n = gl.cdiv(N, BN)
    pid_m = tile // tiles_n
    off_n = (tile % tiles_n) * BN
    k_lo = sp * ks_per_split
    n_k = gl.minimum(ks_per_split, gl.cdiv(K, BLOCK_K) - k_lo)
    off_m, row_end, e, w_row, n_k = tile_rows(pid_m, off_n, n_k, seg_ptr, M, N, E, MODE, E_POW2, BT, num_warps)

    x_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, BLOCK_K], x_desc.layout)
    w_bufs = gl.allocate_shared_memory(gl.int32, [STAGES, BN, WPR], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=BN // RS_ROWS)
    if BN == 4 * RS_ROWS:
        gl.warp_specialize([
            (_rs_consumer, (x_bufs, w_bufs, ready, empty, ws_ptr, gs_ptr, ags_ptr, bias_ptr, c_ptr, part_ptr, cnt_ptr,
                            SPLIT, tile, sp, row_end, N, K, stride_wsn, stride_cm, off_m, off_n, e, stride_wse, k_lo,
                            n_k, 0, FMT, BT, STAGES, HAS_AGS, HAS_BIAS, GS_PER_E)),
            (_rs_consumer, (x_bufs, w_bufs, ready, empty, ws_ptr, gs_ptr, ags_ptr, bias_ptr, c_ptr, part_ptr, cnt_ptr,
                            SPLIT, tile, sp, row_end, N, K, stride_wsn, stride_cm, off_m, off_n, e, stride_wse, k_lo,
                            n_k, 1, FMT, BT, STAGES, HAS_AGS, HAS_BIAS, GS_PER_E)),
            (_rs_consumer, (x_bufs, w_bufs, ready, empty, ws_ptr, gs_ptr, ags_ptr, bias_ptr, c_ptr, part_ptr, cnt_ptr,
                            SPLIT, tile, sp, row_end, N, K, stride_wsn, stride_cm, off_m, off_n, e, stride_wse, k_lo,
                            n_k, 2, FMT, BT, STAGES, HAS_AGS, HAS_BIAS, GS_PER_E)),
            (_rs_consumer, (x_bufs, w_bufs, ready, empty, ws_ptr, gs_ptr, ags_ptr, bias_ptr, c_ptr, part_ptr, cnt_ptr,
                            SPLIT, tile, sp, row_end, N, K, stride_wsn, stride_cm, off_m, off_n, e, stride_wse, k_lo,
                            n_k, 3, FMT, BT, STAGES, HAS_AGS, HAS_BIAS, GS_PER_E)),
            (_tiled_producer, (x_desc, w_desc, x_bufs, w_bufs, ready, empty, off_m, w_row, k_lo, n_k, WPR, STAGES)),
        ], [4, 4, 4, 1], [RS_CONSUMER4_REGS, RS_CONSUMER4_REGS, RS_CONSUMER4_REGS, RS_PRODUCER4_REGS])
        return
    gl.warp_specialize([
        (_rs_consumer, (x_bufs, w_bufs, ready, empty, ws_ptr, gs_ptr, ags_ptr, bias_ptr, c_ptr, part_ptr, cnt_ptr,
                        SPLIT, tile, sp, row_end, N, K, stride_wsn, stride_cm, off_m, off_n, e, stride_wse, k_lo, n_k,
                        0, FMT, BT, STAGES, HAS_AGS, HAS_BIAS, GS_PER_E)),
        (_rs_consumer, (x_bufs, w_bufs, ready, empty, ws_ptr, gs_ptr, ags_ptr, bias_ptr, c_ptr, part_ptr, cnt_ptr,
                        SPLIT, tile, sp, row_end, N, K, stride_wsn, stride_cm, off_m, off_n, e, stride_wse, k_lo, n_k,
                        1, FMT, BT, STAGES, HAS_AGS, HAS_BIAS, GS_PER_E)),
        (_tiled_producer, (x_desc, w_desc, x_bufs, w_bufs, ready, empty, off_m, w_row, k_lo, n_k, WPR, STAGES)),
    ], [4, 1], [RS_CONSUMER_REGS, RS_PRODUCER_REGS])
