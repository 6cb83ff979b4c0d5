"""Dense block-scaled GEMM kernel (portable Triton): ``out = A @ B.T`` on the ``_mma`` core.

``gemm_kernel``: one program per (BLOCK_M x BLOCK_N output tile, K split). With SPLIT_K == 1
it applies the epilogue (nvfp4 ``1/(gs_a*gs_b)``, optional bias, cast, masked store) directly.

Fused, deterministic split-K (SPLIT_K > 1), one launch:
  1. every (tile, split) program stores its fp32 partial into ``ws [SPLIT_K, M, N]``
     (contiguous; only the valid rows / columns are written), then increments the tile's
     counter ``cnt[tile]`` (int32, ``atomic_add`` with acq_rel semantics at gpu scope, after a
     CTA barrier so that every thread's partial stores are ordered before the release);
  2. the program that sees the old value ``SPLIT_K - 1`` (it arrived last) sums the SPLIT_K
     partials in the fixed order s = 0..SPLIT_K-1 (plain loads: the acquire invalidated its SM's
     L1, so no line is stale), so the result is bitwise the same whichever program arrives last; it applies the
     SPLIT_K == 1 epilogue and stores the output;
  3. it resets ``cnt[tile]`` to 0: the counter buffer is all zeros again when the kernel ends,
     so one buffer serves every later launch on the same stream and every replay of a CUDA
     graph (ops/gemm.py::_splitk_counters owns the buffers and their concurrency rule).
Empty splits (``k_lo >= K``) run no K iteration, store a zero partial and count like the rest.
The reducing program reads its own partial back like the others (the same fp32 bits it stored), so
the sum does not depend on which split arrived last.

Programmatic Dependent Launch (``PDL=True``; the launcher then also passes ``launch_pdl=True``,
sm_90+ only, see ops/gemm.py::_use_pdl): the kernel is launched with the programmatic
stream-serialization attribute, so its CTAs may be scheduled as soon as the preceding kernel
on the stream allows it (all its CTAs executed ``griddepcontrol.launch_dependents`` or
exited) instead of after that grid has completed and flushed its memory. Protocol:
  * ``gdc_wait()`` (``griddepcontrol.wait``) comes before the kernel's first global memory
    access of any kind: it returns once every prerequisite grid has completed and its memory
    operations are visible. Only tile-index arithmetic on kernel arguments runs before it, so
    the kernel is correct whatever produced A, A's scales, B, the bias or the nvfp4 global
    scales, and whatever reads or writes the output after us. It matters most for memory the
    launcher shares between consecutive launches: the split-K tile counters (one buffer per
    stream / graph, reset to zero by the previous launch's reducing programs) and the fp32
    workspace / output (the caching allocator hands the previous launch's freed blocks to the
    next one in stream order). Nothing is prefetched before the wait (not even B, which is
    usually a static weight): a producer of B would otherwise race with us.
  * ``gdc_launch_dependents()`` right after the wait: the next PDL kernel on the stream may
    start launching once every CTA of this grid has executed it (so all of our CTAs are
    already resident; the dependents only take leftover SM slots). Its own wait still blocks
    until this grid has completed, so the early trigger costs nothing in correctness; the
    kernel has no inter-CTA spin-wait (split-K uses one atomic per tile, no polling), so
    resident dependents cannot starve it.
What it buys: the dependent's launch latency, CTA dispatch and index prologue overlap this
grid's tail. Measured on the H100 (a PDL on/off A/B, CUDA graphs of back-to-back decode
GEMMs): +-0.2..0.7 us per call, a loss on some shapes (M=128 7168x16384 71 -> 91 us), so the
launcher keeps it off unless ``BLOCKSCALED_PDL=1`` (ops/gemm.py). It does not hide the
pipeline fill: the first A/B loads are issued after the wait (sm_90 SASS: ``ACQBULK`` within
the first ~8 instructions, the first ``LDGSTS`` 120-240 instructions later). Without the
launch attribute (older GPUs, PDL off) both instructions are no-ops; the launcher passes
PDL=False there anyway, and always in the Triton interpreter, which cannot execute them
(triton 3.6 raises in ``gdc_wait``).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ._interp import cast_out
from ._mma import FMT_DENSE, FMT_NVFP4, nvfp4_output_scale, scaled_mma


def _gemm_repr(specialization):
    c = specialization.constants
    names = {0: "fp8_block", 1: "mxfp8", 2: "mxfp4", 3: "nvfp4", 4: "dense"}
    a = names.get(c.get("A_FMT"), "?")
    b = names.get(c.get("B_FMT"), "?")
    return (
        f"bs_gemm_{a}x{b}_{c.get('BLOCK_M')}x{c.get('BLOCK_N')}x{c.get('BLOCK_K')}"
        f"_sk{c.get('SPLIT_K')}{'_promote' if c.get('PROMOTE') else ''}{'_swapab' if c.get('SWAP_AB') else ''}"
        f"{'_pdl' if c.get('PDL') else ''}"
    )


_ELEM_BYTES = {0: 1.0, 1: 1.0, 2: 0.5, 3: 0.5}
_SCALE_K = {0: 128, 1: 32, 2: 32, 3: 16}
_SCALE_BYTES = {0: 4, 1: 1, 2: 1, 3: 1}


def _gemm_launch_metadata(grid, kernel, args):
    """Profiler metadata: name with M/N/K, tile and split, FLOPs, bytes moved incl. scales
    (split-K: + the fp32 partials written and read back once each)."""
    m, n, k = args["M"], args["N"], args["K"]
    bf, af = args.get("B_FMT", 0), args.get("A_FMT", 0)
    sk = _SCALE_K[bf]
    nk = -(-k // sk)
    a_bytes = m * k * (args["a_ptr"].element_size() if af == 4 else _ELEM_BYTES[bf])
    a_bytes += 0 if af == 4 else m * nk * _SCALE_BYTES[bf]
    b_bytes = n * k * _ELEM_BYTES[bf] + -(-n // args.get("B_SCALE_ROWS", 1)) * nk * _SCALE_BYTES[bf]
    split = args.get("SPLIT_K", 1)
    c_bytes = m * n * args["c_ptr"].element_size() + (m * n * 4 * 2 * split if split > 1 else 0)
    return {
        "name": (f"{kernel.name} [M={m}, N={n}, K={k}, tile={args.get('BLOCK_M')}x{args.get('BLOCK_N')}"
                 f"x{args.get('BLOCK_K')}, split_k={split}]"),
        "flops": 2.0 * m * n * k,
        "bytes": int(a_bytes + b_bytes + c_bytes),
    }


@triton.jit(repr=_gemm_repr, launch_metadata=_gemm_launch_metadata)
def gemm_kernel(
    a_ptr, a_s_ptr, b_ptr, b_s_ptr, gs_a_ptr, gs_b_ptr, bias_ptr, c_ptr,
    M, N, K, k_per_split,
    stride_am, stride_ak, stride_asm, stride_ask,
    stride_bn, stride_bk, stride_bsn, stride_bsk,
    stride_cs, stride_cm, stride_cn,
    A_FMT: tl.constexpr, B_FMT: tl.constexpr, B_SCALE_ROWS: tl.constexpr,
    PROMOTE: tl.constexpr, DOT_DTYPE: tl.constexpr, EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ws_ptr=None, cnt_ptr=None, SWAP_AB: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """``c[M, N] = epilogue(A[M, K] @ B[N, K].T)``.

    Grid: (ceil(M/BLOCK_M) * ceil(N/BLOCK_N), SPLIT_K); tiles in GROUP_M-row swizzle for L2.
    Split ``s`` covers K ``[s * k_per_split, min((s+1) * k_per_split, K))`` (k_per_split a
    multiple of BLOCK_K; a split past K is empty and contributes zeros).
    SPLIT_K > 1 (fused split-K, module docstring): ``ws_ptr`` fp32 ``[SPLIT_K, M, N]``
    contiguous except the split stride ``stride_cs`` (elements); ``cnt_ptr`` int32
    ``[>= grid[0]]``, all zeros on entry and on exit. SPLIT_K == 1: both unused (None).
    SWAP_AB: the tile is computed as ``(B_tile @ A_tile.T).T`` so that the weight rows
    (BLOCK_N, >= 64) fill the MMA's M dimension and few activation rows (BLOCK_M = 16) its N
    dimension (FP8 wgmma needs M = 64: unswapped decode tiles pad A to 64 rows, 4x the MMA work
    and A shared memory). Quantized A only; with 128-row B scale blocks BLOCK_N must divide 128
    (the tile's weight rows then share one scale row: scale pointer offset, row stride 0).
    PDL: programmatic dependent launch (module docstring): ``griddepcontrol.wait`` before the
    first global memory access, then ``griddepcontrol.launch_dependents``. Launch with
    ``launch_pdl=True`` for it to have an effect; correct (the two are no-ops) without."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * num_n
    group = pid // width
    first_m = group * GROUP_M
    gsize = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % gsize
    pid_n = (pid % width) // gsize

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)

    if PDL:
        # Everything above is index arithmetic on arguments; every global access (A, B, scales,
        # bias, gs, workspace, counters, output) is below the wait (module docstring).
        gdc_wait()
        gdc_launch_dependents()

    if SWAP_AB:
        tl.static_assert(A_FMT == B_FMT or (A_FMT == FMT_DENSE and not PROMOTE),
                         "SWAP_AB needs a quantized A, or a dense A with PROMOTE=False")
        if B_SCALE_ROWS == 1:
            w_s_ptr = b_s_ptr
            stride_wsn = stride_bsn
        else:
            tl.static_assert(B_SCALE_ROWS % BLOCK_N == 0, "SWAP_AB: BLOCK_N must divide B's scale block")
            w_s_ptr = b_s_ptr + ((pid_n * BLOCK_N) // B_SCALE_ROWS).to(tl.int64) * stride_bsn
            stride_wsn = 0
        acc_t, _unused = scaled_mma(
            b_ptr, w_s_ptr, stride_bn, stride_bk, stride_wsn, stride_bsk,
            a_ptr, a_s_ptr, a_ptr, a_s_ptr, stride_am, stride_ak, stride_asm, stride_ask,
            offs_n, offs_m, mask_n, mask_m, k_lo, k_hi,
            B_FMT, A_FMT, 1, PROMOTE, False, DOT_DTYPE, EVEN_K,
            BLOCK_N, BLOCK_M, BLOCK_K,
        )
        acc = tl.trans(acc_t)
    else:
        acc, _unused = scaled_mma(
            a_ptr, a_s_ptr, stride_am, stride_ak, stride_asm, stride_ask,
            b_ptr, b_s_ptr, b_ptr, b_s_ptr, stride_bn, stride_bk, stride_bsn, stride_bsk,
            offs_m, offs_n, mask_m, mask_n, k_lo, k_hi,
            A_FMT, B_FMT, B_SCALE_ROWS, PROMOTE, False, DOT_DTYPE, EVEN_K,
            BLOCK_M, BLOCK_N, BLOCK_K,
        )

    mask = mask_m[:, None] & mask_n[None, :]
    # partials loaded together by the reducing program (see there): 4 for tiles of <= 64x64, 2
    # above (ptxas sm_90: 4 at a time spilled in 64x128 w4 / 128x128 w8 tiles, 2 did not)
    REDUCE_GROUP: tl.constexpr = min(SPLIT_K, 4 if BLOCK_M * BLOCK_N <= 4096 else 2)
    if SPLIT_K == 1:
        _epilogue(acc, gs_a_ptr, gs_b_ptr, bias_ptr, c_ptr, offs_m, offs_n, mask_n, mask, stride_cm, stride_cn,
                  A_FMT, B_FMT, HAS_BIAS)
    else:
        w_off = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(ws_ptr + pid_k.to(tl.int64) * stride_cs + w_off, acc, mask=mask)
        # every thread's partial stores happen-before thread 0's release (CTA barrier, then the
        # gpu-scope acq_rel atomic is cumulative over what the barrier ordered)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            # last program of this tile: all SPLIT_K partials are visible (acquire above; the
            # broadcast of ``arrived`` orders the other threads after it). Fixed order s = 0..
            # SPLIT_K - 1, its own partial included (read back: the same fp32 bits it stored, so
            # the sum does not depend on which program arrived last).
            # Loads go REDUCE_GROUP partials at a time (an unrolled inner loop): their L2 round
            # trips overlap, where a plain runtime loop waited for each partial before loading the
            # next. Not all SPLIT_K at once: the compiler hoists every unrolled load above the
            # adds, and 8 partials of a 64x64 tile took 255 registers and spilled (ptxas, sm_90).
            # Plain loads: the acquire invalidated this SM's L1 (CCTL.IVALL after the atomic in the
            # SASS) before the broadcast; ``.cg`` compiles to strong GPU-scope loads, 1.27x slower in
            # the Gluon kernels' sum (kernels/hopper/stream.py _splitk_sum_store).
            tot = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for g in range(0, SPLIT_K, REDUCE_GROUP):
                for j in tl.static_range(REDUCE_GROUP):
                    s = g + j
                    # the scalar bound as a full tile: triton 3.9's interpreter rejects a tensor
                    # mask combined with a scalar bool ("mask has unsupported dtype")
                    part = tl.load(ws_ptr + s.to(tl.int64) * stride_cs + w_off,
                                   mask=mask & (tl.full((BLOCK_M, BLOCK_N), s, tl.int32) < SPLIT_K),
                                   other=0.0)
                    tot = tl.where(s < SPLIT_K, tot + part, tot)
            _epilogue(tot, gs_a_ptr, gs_b_ptr, bias_ptr, c_ptr, offs_m, offs_n, mask_n, mask, stride_cm,
                      stride_cn, A_FMT, B_FMT, HAS_BIAS)
            # leave the counter buffer all zeros for the next launch / graph replay
            tl.atomic_xchg(cnt_ptr + pid, 0, sem="relaxed", scope="gpu")


@triton.jit
def _epilogue(acc, gs_a_ptr, gs_b_ptr, bias_ptr, c_ptr, offs_m, offs_n, mask_n, mask, stride_cm, stride_cn,
              A_FMT: tl.constexpr, B_FMT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """nvfp4 ``1/(gs_a*gs_b)``, bias (fp32), cast to c's dtype (round to nearest even, also in
    the interpreter: ``_mma.cast_out``), masked store."""
    if B_FMT == FMT_NVFP4:
        acc = acc * nvfp4_output_scale(gs_a_ptr, gs_b_ptr, A_FMT == FMT_DENSE)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    c_off = offs_m.to(tl.int64)[:, None] * stride_cm + offs_n.to(tl.int64)[None, :] * stride_cn
    tl.store(c_ptr + c_off, cast_out(acc, c_ptr.dtype.element_ty), mask=mask)
