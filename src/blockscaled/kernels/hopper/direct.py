"""The sm_90 register-streaming decode GEMM in Gluon: mxfp4 / nvfp4 weights x bf16 activations,
8 or 16 padded rows (the planner runs 8: 2..8 rows dense, <= 4 rows per expert grouped), on
``mma.sync`` tensor cores with no shared memory and no barrier in the K loop.

``C[m, n] = sum_k x[m, k] * dequantize(W)[n, k]``, dense or grouped (MoE: contiguous / masked, as
the stream kernel's grouped form). Kernel body only; the host launcher is ``blockscaled.ops._direct``,
plan/direct.py decides where it runs (and the register budget: ``GemmConfig.maxnreg``).

Why a second streaming kernel. The wgmma kernel (kernels/hopper/stream.py) needs its B operand
(the activations) in shared memory, so every 128-K step stores them there and the warpgroup meets
at a barrier before the wgmma; its weights come through a TMA ring read back with shared loads. At
decode sizes that kernel is latency-bound (ncu, H200, benchmarks/NOTES.md twenty-first session:
issue slots 51 % busy, long-scoreboard, barrier and wait stalls ahead, 342 SASS per thread and
step). Here each warp works alone: it loads its 16 weight rows of a step straight into registers
(two 128-bit global loads per thread, a step ahead of their use), decodes them with the same
integer + packed-bf16 code (stream.py ``_decode_fp4``: its registers are the A fragment of
``mma.sync.m16n8k16`` as they are the wgmma's), loads the activations of the step into the B
fragment (each thread 32 contiguous elements of one activation row, permuted in registers to the
decode's K order) and issues 8 (MP = 8) or 16 (MP = 16) ``mma.sync`` per step. A program is 4 such
warps (64 weight rows, the stream kernel's tile), so the split-K workspace and epilogue are the
stream kernel's (``_splitk_sum_store``).

The K order inside a step (stream.py module docstring): thread t of a quad holds physical
elements 32t .. 32t + 31 of its rows, the A fragment's K index is q = [i1 i0 a1 a0 t1 t0 h] for
p = 32t + 8i + a + 4h. The B fragment of ``mma.sync`` (k_width 2) gives the thread of lane quad t
and column n exactly the K indices whose p lie in 32t .. 32t + 31: its activations are one
contiguous 64-byte run of row n (four 128-bit loads), permuted in registers (checked at compile
time: ``assert_trivial``).

Numerics as the stream kernel: every e2m1 x E8M0 / e4m3 product exact in bf16, fp32 accumulation
in the tensor core, one rounding at the store; nvfp4's 2**-8 decode factor and the global scales in
the epilogue. K % 32 == 0 (the planner checks): a last step past K loads zero codes (masked per
32-element block), scale 2**0 / 0 and zero activations; rows past N read row N - 1 (never stored),
activation rows past M read zeros.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from .stream import (BLOCK_N, CHUNK, _FMT_NVFP4, _active_expert, _decode_fp4, _grouped_split_sum, _scale_factor,
                     _splitk_sum_store, word2_layout, word_layout)

__all__ = ["direct_kernel"]


@gluon.constexpr_function
def mma_layout(mp):
    """[64, MP] fp32 accumulator of ``mma.sync.m16n8k16``: warp w owns rows 16w .. 16w + 15."""
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])


@gluon.constexpr_function
def xrun_layout(mp):
    """[MP, 4 (t), 32] bf16 activations of a step: lane = 4 n + t for columns n < 8, one thread
    holds the 32 contiguous elements 32t .. 32t + 31 of row n (registers), columns 8 .. 15 in
    registers too (MP = 16: the second n8 block of the B fragment), every warp the same (the
    fragment is replicated across the warps)."""
    regs = [[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [0, 0, 16]]
    if mp == 16:
        regs = regs + [[8, 0, 0]]
    return gl.DistributedLinearLayout(
        reg_bases=regs, lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[0, 0, 0], [0, 0, 0]], block_bases=[], shape=[mp, 4, 32])


@gluon.jit
def _x_step(x_base, xr, x_ok, xt, xe, k0, K, stride_xm, ok, MP: gl.constexpr):
    """Activations of the step at k0 as [MP, 4, 32] (row, t, element of the thread's run); rows
    past M, blocks past K and ``ok`` False: zeros (a masked load fetches nothing)."""
    kb = k0 + xt * 32  # first element of each thread's run
    m = (x_ok[:, None] & (kb < K)[None, :] & ok)[:, :, None]
    ptrs = x_base + xr.to(gl.int64)[:, None, None] * stride_xm + (kb[None, :, None] + xe[None, None, :])
    return gl.load(ptrs, mask=m, other=0.0)


@gluon.jit
def _x_operand(x, MP: gl.constexpr):
    """[MP, 4, 32] activations -> the B operand [128 (q), MP] in the decode's K order."""
    # p = 32 t + 8 i + 4 h + a: bits [t1 t0 i1 i0 h a1 a0] -> q = [i1 i0 a1 a0 t1 t0 h]
    x = gl.reshape(x, [MP, 2, 2, 2, 2, 2, 2, 2])
    x = gl.permute(x, (0, 3, 4, 6, 7, 1, 2, 5))
    return gl.permute(gl.reshape(x, [MP, CHUNK]), (1, 0))


@gluon.jit
def _w_step(w_rows, wcol, c, NB, ok):
    """The packed weights of step c as [64, 16] int32 words (word 4t + i of a row: block t's
    16 bytes); blocks at or past NB (= K / 32) and ``ok`` False: zero codes."""
    blk = c * 4 + wcol // 4
    return gl.load(w_rows + (c * 16 + wcol)[None, :], mask=(blk < NB)[None, :] & ok, other=0)


@gluon.jit
def _k_loop(w_rows, wcol, ws_ptr, srow, scol, ncol, x_base, xr, x_ok, xt, xe, K, stride_xm, c_lo, n_c, NB,
            FMT: gl.constexpr, MP: gl.constexpr, SPC: gl.constexpr):
    """acc [64, MP] of the weight rows ``w_rows`` (K steps c_lo .. c_lo + n_c) times the activation
    rows ``x_base + xr * stride_xm`` (``x_ok`` masks them)."""
    acc_l: gl.constexpr = mma_layout(MP)
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=acc_l, k_width=2)
    # the loads of a step are issued a step ahead of its decode and MMAs (ptxas places them after
    # most of the current step's MMAs: benchmarks/NOTES.md, twenty-second session, ncu)
    w_nxt = _w_step(w_rows, wcol, c_lo, NB, n_c > 0)
    f_nxt = _scale_factor(ws_ptr, srow, scol + c_lo * SPC, ncol, FMT)
    x_nxt = _x_step(x_base, xr, x_ok, xt, xe, c_lo * CHUNK, K, stride_xm, n_c > 0, MP)
    acc = gl.zeros((BLOCK_N, MP), dtype=gl.float32, layout=acc_l)
    for it in range(n_c):
        w_cur = w_nxt
        f_cur = f_nxt
        x_cur = x_nxt
        more = it + 1 < n_c
        c = c_lo + gl.minimum(it + 1, n_c - 1)
        w_nxt = _w_step(w_rows, wcol, c, NB, more)
        f_nxt = _scale_factor(ws_ptr, srow, scol + c * SPC, ncol, FMT)
        x_nxt = _x_step(x_base, xr, x_ok, xt, xe, c * CHUNK, K, stride_xm, more, MP)
        a = gl.convert_layout(_decode_fp4(w_cur, f_cur, FMT), a_l, assert_trivial=True)
        b = gl.convert_layout(_x_operand(x_cur, MP), b_l, assert_trivial=True)
        acc = mma_v2(a, b, acc)
    return acc


@gluon.jit
def _out_scale(gs_ptr, ags_ptr, e, GS_PER_E: gl.constexpr, HAS_AGS: gl.constexpr):
    """nvfp4's epilogue factor: 2**8 (the decode's factor) / (weight global scale [x the
    activations' own])."""
    if GS_PER_E:
        gb = gl.load(gs_ptr + e).to(gl.float32)
    else:
        gb = gl.load(gs_ptr).to(gl.float32)
    if HAS_AGS:
        gb = gb * gl.load(ags_ptr).to(gl.float32)
    return gl.div_rn(gl.full([], 256.0, gl.float32), gb)


# M and the steps per split follow the call: one build serves every decode M up to MP
@gluon.jit(do_not_specialize=["M", "kc_per_split"])
def direct_kernel(w_ptr, ws_ptr, x_ptr, gs_ptr, ags_ptr, bias_ptr, c_ptr, part_ptr, cnt_ptr, seg_ptr, M, N, K,
                  kc_per_split, SPLIT, stride_wn, stride_wsn, stride_wse, stride_xm, stride_xe, stride_cm, stride_ce,
                  FMT: gl.constexpr, MP: gl.constexpr, HAS_AGS: gl.constexpr, HAS_BIAS: gl.constexpr,
                  num_warps: gl.constexpr, GROUPING: gl.constexpr = 0, GS_PER_E: gl.constexpr = False,
                  NUM_E: gl.constexpr = 0):
    """Dense (GROUPING 0): one program per (64 weight rows, K split). ``w_ptr``: the packed e2m1
    weights as int32 words [N, K / 8], row stride ``stride_wn`` words (16-byte aligned rows);
    ``ws_ptr``: uint8 E8M0 [N, K / 32] (mxfp4) or e4m3 [N, K / 16] (nvfp4) block scales, row stride
    ``stride_wsn``; ``x_ptr``: bf16 [M, K] (K contiguous, M <= MP); ``gs_ptr``: nvfp4's fp32
    global scale (any pointer for mxfp4); ``ags_ptr`` (HAS_AGS): the activations' fp32 global scale
    (nvfp4 activations dequantized by the host without it); ``bias_ptr`` (HAS_BIAS, dense only): [N],
    added in fp32 before the output's rounding; ``c_ptr``: [M, N] (N contiguous); ``part_ptr`` /
    ``cnt_ptr``: the split-K workspace fp32 [SPLIT, tiles, 64, MP] and int32 zeros [tiles] (SPLIT >
    1; every split non-empty: the host).

    Grouped, as the stream kernel's grouped form (kernels/hopper/stream.py): weights [E, N, K / 2] as
    int32 [E * N, K / 8] (rows clamped inside the expert), scales with expert stride ``stride_wse``,
    ``gs_ptr`` [E] where GS_PER_E. GROUPING 1 (contiguous): expert e owns rows ``seg[e] ..
    seg[e + 1]`` of x [sum_m, K] / c [sum_m, N]; NUM_E > 0: the grid is min(E, sum_m) expert slots
    (``_active_expert``); SPLIT K splits with partials at the rows' places in [SPLIT, M, N] and one
    counter per (slot, tile) (``_grouped_split_sum``). GROUPING 2 (masked, SPLIT 1): ``seg[e]`` rows
    of x [E, max_m, K] / c [E, max_m, N] (expert strides ``stride_xe`` / ``stride_ce``). An
    expert's rows run in blocks of MP, each streaming the tile's weights again."""
    gl.static_assert(num_warps == 4, "four warps of 16 weight rows")
    gl.static_assert(MP == 8 or MP == 16, "8 or 16 padded activation rows")
    L2: gl.constexpr = word2_layout()
    L4: gl.constexpr = word_layout()
    xl: gl.constexpr = xrun_layout(MP)

    pid = gl.program_id(0)
    sp = pid % SPLIT
    if GROUPING == 0:
        tile = pid // SPLIT
        e = pid * 0
        row0 = pid * 0
        m_e = M
    else:
        tiles = gl.cdiv(N, BLOCK_N)
        unit = pid // SPLIT  # the (slot, tile) whose split-K counter this program arrives at
        e = unit // tiles
        tile = unit % tiles
        # offsets / counts clamped to [0, M]: bad metadata gives wrong rows (the device check flags
        # it), never an out-of-bounds access
        if GROUPING == 1:
            if NUM_E > 0:
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
    NB = K // 32
    e64 = e.to(gl.int64)

    # weights: rows past N read row N - 1 of the expert (their outputs are never stored)
    wr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, L2))
    wcol = gl.arange(0, 16, layout=gl.SliceLayout(0, L2))
    if GROUPING == 0:
        w_rows = w_ptr + ((off_n + gl.minimum(wr, N - 1 - off_n)).to(gl.int64) * stride_wn)[:, None]
        ws_e = ws_ptr
    else:
        w_rows = w_ptr + ((e64 * N + off_n + gl.minimum(wr, N - 1 - off_n)) * stride_wn)[:, None]
        ws_e = ws_ptr + e64 * stride_wse

    # block scales: per thread rows r and r + 8 of its warp, block t (mxfp4) or 2t + i1 (nvfp4)
    SL3: gl.constexpr = gl.SliceLayout(3, L4)
    if FMT == _FMT_NVFP4:
        r3 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.SliceLayout(2, SL3)))
        t3 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, SL3)))
        i3 = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, SL3)))
        srow = gl.expand_dims(gl.expand_dims((off_n + gl.minimum(r3, N - 1 - off_n)).to(gl.int64) * stride_wsn, 1), 2)
        scol = gl.expand_dims(gl.expand_dims(t3 * 2, 0), 2) + gl.expand_dims(gl.expand_dims(i3, 0), 1)
        SPC: gl.constexpr = 8
        ncol = gl.cdiv(K, 16)
    else:
        SL2: gl.constexpr = gl.SliceLayout(2, SL3)
        r3 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, SL2))
        t3 = gl.arange(0, 4, layout=gl.SliceLayout(0, SL2))
        srow = gl.expand_dims((off_n + gl.minimum(r3, N - 1 - off_n)).to(gl.int64) * stride_wsn, 1)
        scol = gl.expand_dims(t3, 0)
        SPC: gl.constexpr = 4
        ncol = gl.cdiv(K, 32)

    xr = gl.arange(0, MP, layout=gl.SliceLayout(1, gl.SliceLayout(2, xl)))
    xt = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, xl)))
    xe = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, xl)))
    if GROUPING == 0:
        x_base = x_ptr
        c_base = c_ptr
    else:
        x_base = x_ptr + e64 * stride_xe + row0.to(gl.int64) * stride_xm
        c_base = c_ptr + e64 * stride_ce + row0.to(gl.int64) * stride_cm

    out_l: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, 4], [0, 1])
    r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, out_l))
    cc = gl.arange(0, MP, layout=gl.SliceLayout(0, out_l))

    if GROUPING == 0:
        acc = _k_loop(w_rows, wcol, ws_e, srow, scol, ncol, x_base, xr, xr < M, xt, xe, K, stride_xm, c_lo, n_c, NB,
                      FMT, MP, SPC)
        if FMT == _FMT_NVFP4:  # after the K loop: no registers held across it
            acc = acc * _out_scale(gs_ptr, ags_ptr, e, GS_PER_E, HAS_AGS)
        if HAS_BIAS:  # loaded after the K loop: no registers held across it
            bias = gl.load(bias_ptr + off_n + r, mask=r < N - off_n, other=0.0).to(gl.float32)[:, None]
        else:
            bias = 0.0
        mask = (r < N - off_n)[:, None] & (cc < M)[None, :]
        c_ptrs = c_base + cc.to(gl.int64)[None, :] * stride_cm + (off_n + r)[:, None]
        if SPLIT == 1:
            res = gl.convert_layout(acc, out_l)
            if HAS_BIAS:
                res = res + bias
            gl.store(c_ptrs, res.to(c_ptr.dtype.element_ty), mask=mask)
        else:
            # the partial column-major: a warp's lanes run along the weight rows, whole lines per
            # access (row-major offsets, 8 rows of MP apart per lane, were 1.04-1.15x slower at
            # M = 2-8, H200, thirty-ninth session; stream._splitk_sum_store)
            offs = (cc * BLOCK_N)[None, :] + r[:, None]
            _splitk_sum_store(gl.convert_layout(acc, out_l), part_ptr, cnt_ptr, tile, sp, SPLIT, offs, c_ptrs, mask,
                              bias, BLOCK_N * MP, HAS_BIAS)
    else:
        gl.static_assert(not HAS_BIAS, "the grouped form takes no bias")
        for rb in range(gl.cdiv(m_e, MP)):
            rows_left = m_e - rb * MP
            acc = _k_loop(w_rows, wcol, ws_e, srow, scol, ncol, x_base + (rb * MP).to(gl.int64) * stride_xm, xr,
                          xr < rows_left, xt, xe, K, stride_xm, c_lo, n_c, NB, FMT, MP, SPC)
            if FMT == _FMT_NVFP4:
                acc = acc * _out_scale(gs_ptr, ags_ptr, e, GS_PER_E, HAS_AGS)
            mask = (r < N - off_n)[:, None] & (cc < rows_left)[None, :]
            if SPLIT == 1:
                c_ptrs = c_base + (rb * MP + cc).to(gl.int64)[None, :] * stride_cm + (off_n + r)[:, None]
                gl.store(c_ptrs, gl.convert_layout(acc, out_l).to(c_ptr.dtype.element_ty), mask=mask)
            else:  # this split's fp32 partial of the rows, at their place in [SPLIT, M, N]
                prow = (row0 + rb * MP + cc).to(gl.int64)[None, :] * N + (off_n + r)[:, None]
                gl.store(part_ptr + sp.to(gl.int64) * M * N + prow, gl.convert_layout(acc, out_l), mask=mask)
        if SPLIT > 1:
            _grouped_split_sum(part_ptr, cnt_ptr + unit, SPLIT, M, N, m_e, row0, off_n, c_base, stride_cm, r, cc, MP)
