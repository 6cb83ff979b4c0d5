"""Decode GEMV for fp8_block x fp8_block (portable Triton, CUDA cores): ``out = A @ B.T`` for a
few activation rows (M <= 4; gemm() dispatches it at M = 1 only, where it measured faster).

Why a separate kernel: at M = 1-4 the GEMM is a pure weight stream (15-120 MB on the DeepSeek-V3
shapes, a 5-40 us floor at 3 TB/s) and what decides the time is how many bytes each SM keeps in
flight, not the MMA. H100 measurements that shaped it (benchmarks/NOTES.md 2026-11-22, "The
ceiling"):
  * a plain streaming read of the same bytes reached 71-99 % of the floor only with MANY SHORT
    programs that issue all their loads at once (best grid: 32 KB per program, 225-3586
    programs); 132 programs of 14 chunks each reached 25 %;
  * the tensor-core decode kernels (portable swap-AB split-K, Hopper "skinny") need a K split to
    get that many programs on K >= 7168, and their last-arriver reduction costs 2-3 us per call.
So one program here owns BLOCK_N whole weight rows (no K split, no reduction, deterministic by
construction) and loads its [BLOCK_N, CHUNK_KB, 128] weight chunk with one vectorised load before
any math. BLOCK_N is the most rows whose whole K fits one chunk (config.gemm.gemv_config); longer
K loops over chunks. The H100 sweep preferred 8-16 KB chunks over the read probe's 32 KB (32 KB
took 245 registers at 4 warps, and every program re-reads the activation row from L2), so
gemm() runs 1 row x 8192 K at K = 7168, 1 x 16384 at K = 16384 and 4 x 2048 at K = 2048
(config.gemm.gemv_dispatch_config has the measurements).

Math (CUDA cores, fp32): for each K block kb the activation row is pre-scaled once per program,
``xs[kb, :] = x[kb, :] * (sa[kb] * sb[kb])`` (128-row weight-scale blocks: one sb per block for the
whole program, BLOCK_N divides 128), and each weight element costs one fp32 FMA; the products are
summed over the 128-wide axis, then over the K blocks (two tl.sum; see the kernel for why not
one). 1x128 weight scales (per row): the products are also scaled per (row, block). fp32 accumulation throughout, the
products and sums differ from the tensor-core kernels only in rounding order (same tolerance
table).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._interp import cast_out, e4m3_to_f32


def _gemv_repr(specialization):
    c = specialization.constants
    return (f"bs_gemv_fp8_block_{c.get('BLOCK_M')}x{c.get('BLOCK_N')}x{128 * c.get('CHUNK_KB', 0)}"
            f"{'_rowscale' if c.get('B_SCALE_ROWS') == 1 else ''}")


def _gemv_launch_metadata(grid, kernel, args):
    m, n, k = args["M"], args["N"], args["K"]
    nk = -(-k // 128)
    b_rows = args.get("B_SCALE_ROWS", 128)
    nbytes = n * k + -(-n // b_rows) * nk * 4 + m * (k + nk * 4) + m * n * args["c_ptr"].element_size()
    return {"name": f"{kernel.name} [M={m}, N={n}, K={k}, rows={args.get('BLOCK_N')}]",
            "flops": 2.0 * m * n * k, "bytes": int(nbytes)}


@triton.jit(repr=_gemv_repr, launch_metadata=_gemv_launch_metadata)
def gemv_kernel(
    a_ptr, a_s_ptr, b_ptr, b_s_ptr, bias_ptr, c_ptr,
    M, N, K,
    stride_am, stride_asm, stride_ask, stride_bn, stride_bsn, stride_bsk, stride_cm,
    B_SCALE_ROWS: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNK_KB: tl.constexpr,
):
    """``c[M, N] = A[M, K] @ B[N, K].T`` (+ bias), fp8_block operands with unit K stride.

    Grid: (cdiv(N, BLOCK_N), cdiv(M, BLOCK_M)). A program computes rows
    ``[pid_m * BLOCK_M, +BLOCK_M)`` x columns ``[pid_n * BLOCK_N, +BLOCK_N)`` over the whole K, in
    chunks of CHUNK_KB 128-wide K blocks (one load of BLOCK_N x CHUNK_KB x 128 bytes each).
    Scales: ``a_s [M, cdiv(K, 128)]`` fp32 (strides stride_asm / stride_ask), ``b_s`` fp32
    ``[cdiv(N, B_SCALE_ROWS), cdiv(K, 128)]``; B_SCALE_ROWS is 128 (BLOCK_N must divide it: one
    scale row per program) or 1. Bias: fp32-added before the cast; c: bf16 / fp16 / fp32."""
    tl.static_assert(B_SCALE_ROWS == 1 or B_SCALE_ROWS % BLOCK_N == 0, "BLOCK_N must divide the weight-scale block")
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    kb = tl.arange(0, CHUNK_KB)
    kk = tl.arange(0, 128)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    nkb = tl.cdiv(K, 128)
    b_rows = b_ptr + offs_n.to(tl.int64) * stride_bn  # [BLOCK_N]
    if B_SCALE_ROWS == 1:
        sb_rows = b_s_ptr + offs_n.to(tl.int64) * stride_bsn  # [BLOCK_N]
    else:
        sb_row = b_s_ptr + ((pid_n * BLOCK_N) // B_SCALE_ROWS).to(tl.int64) * stride_bsn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb0 in range(0, nkb, CHUNK_KB):
        kbs = kb0 + kb  # [CHUNK_KB] K-block indices of this chunk
        kidx = kbs[:, None] * 128 + kk[None, :]  # [CHUNK_KB, 128]
        kmask = kidx < K
        # the weight chunk first: every byte of it in flight before any math
        w = tl.load(b_rows[:, None, None] + kidx[None, :, :], mask=mask_n[:, None, None] & kmask[None, :, :],
                    other=0.0)
        if B_SCALE_ROWS == 1:
            sb = tl.load(sb_rows[:, None] + kbs[None, :] * stride_bsk, mask=mask_n[:, None] & (kbs < nkb)[None, :],
                         other=0.0)  # [BLOCK_N, CHUNK_KB]
        else:
            sb = tl.load(sb_row + kbs * stride_bsk, mask=kbs < nkb, other=0.0)  # [CHUNK_KB]
        for i in tl.static_range(BLOCK_M):
            r = pid_m * BLOCK_M + i
            ok = r < M
            x = e4m3_to_f32(tl.load(a_ptr + r.to(tl.int64) * stride_am + kidx, mask=kmask & ok, other=0.0))
            sa = tl.load(a_s_ptr + r.to(tl.int64) * stride_asm + kbs * stride_ask, mask=(kbs < nkb) & ok, other=0.0)
            if B_SCALE_ROWS == 1:
                prod = e4m3_to_f32(w) * (x * sa[:, None])[None, :, :] * sb[:, :, None]
            else:
                prod = e4m3_to_f32(w) * (x * (sa * sb)[:, None])[None, :, :]
            # (one tl.sum over a [BLOCK_N, CHUNK_KB * 128] reshape of prod was miscompiled for
            # BLOCK_N = 2 on sm_90 with triton 3.6: outputs ~1e31, H100; correct in the interpreter)
            dot = tl.sum(tl.sum(prod, axis=2), axis=1)  # [BLOCK_N]
            acc += tl.where((rows == r)[:, None], dot[None, :], 0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    c_off = rows.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptr + c_off, cast_out(acc, c_ptr.dtype.element_ty), mask=(rows < M)[:, None] & mask_n[None, :])
