"""Dense block-scaled GEMM kernels (portable Triton): ``out = A @ B.T`` on the ``_mma`` core.

``gemm_kernel``: one program per (BLOCK_M x BLOCK_N output tile, K split). With SPLIT_K == 1
it applies the epilogue (nvfp4 ``1/(gs_a*gs_b)``, optional bias, cast, masked store) directly;
with SPLIT_K > 1 it writes fp32 partials ``ws [SPLIT_K, M, N]`` and ``splitk_reduce_kernel``
sums them in a fixed order (deterministic, no atomics) and applies the same epilogue.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._mma import FMT_DENSE, FMT_NVFP4, nvfp4_output_scale, scaled_mma


def _gemm_repr(specialization):
    c = specialization.constants
    names = {0: "fp8_block", 1: "mxfp8", 2: "mxfp4", 3: "nvfp4", 4: "dense"}
    a = names.get(c.get("A_FMT"), "?")
    b = names.get(c.get("B_FMT"), "?")
    return (
        f"bs_gemm_{a}x{b}_{c.get('BLOCK_M')}x{c.get('BLOCK_N')}x{c.get('BLOCK_K')}"
        f"_sk{c.get('SPLIT_K')}{'_promote' if c.get('PROMOTE') else ''}"
    )


_ELEM_BYTES = {0: 1.0, 1: 1.0, 2: 0.5, 3: 0.5}
_SCALE_K = {0: 128, 1: 32, 2: 32, 3: 16}
_SCALE_BYTES = {0: 4, 1: 1, 2: 1, 3: 1}


def _gemm_launch_metadata(grid, kernel, args):
    """Profiler metadata: name with M/N/K and tile, FLOPs, bytes moved incl. scales."""
    m, n, k = args["M"], args["N"], args["K"]
    bf, af = args.get("B_FMT", 0), args.get("A_FMT", 0)
    sk = _SCALE_K[bf]
    nk = -(-k // sk)
    a_bytes = m * k * (args["a_ptr"].element_size() if af == 4 else _ELEM_BYTES[bf])
    a_bytes += 0 if af == 4 else m * nk * _SCALE_BYTES[bf]
    b_bytes = n * k * _ELEM_BYTES[bf] + -(-n // args.get("B_SCALE_ROWS", 1)) * nk * _SCALE_BYTES[bf]
    split = args.get("SPLIT_K", 1)
    c_bytes = m * n * (4 * split if split > 1 else args["c_ptr"].element_size())
    return {
        "name": f"{kernel.name} [M={m}, N={n}, K={k}, tile={args.get('BLOCK_M')}x{args.get('BLOCK_N')}x{args.get('BLOCK_K')}]",
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
):
    """``c[M, N] = A[M, K] @ B[N, K].T`` (SPLIT_K == 1) or fp32 partials
    ``c[SPLIT_K, M, N]`` (SPLIT_K > 1, epilogue deferred to ``splitk_reduce_kernel``).
    Grid: (ceil(M/BLOCK_M) * ceil(N/BLOCK_N), SPLIT_K); tiles in GROUP_M-row swizzle for L2."""
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

    acc, _unused = scaled_mma(
        a_ptr, a_s_ptr, stride_am, stride_ak, stride_asm, stride_ask,
        b_ptr, b_s_ptr, b_ptr, b_s_ptr, stride_bn, stride_bk, stride_bsn, stride_bsk,
        offs_m, offs_n, mask_m, mask_n, k_lo, k_hi,
        A_FMT, B_FMT, B_SCALE_ROWS, PROMOTE, False, DOT_DTYPE, EVEN_K,
        BLOCK_M, BLOCK_N, BLOCK_K,
    )

    c_off = offs_m.to(tl.int64)[:, None] * stride_cm + offs_n.to(tl.int64)[None, :] * stride_cn
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        if B_FMT == FMT_NVFP4:
            acc = acc * nvfp4_output_scale(gs_a_ptr, gs_b_ptr, A_FMT == FMT_DENSE)
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
            acc = acc + bias[None, :]
        tl.store(c_ptr + c_off, acc.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(c_ptr + pid_k.to(tl.int64) * stride_cs + c_off, acc, mask=mask)


@triton.jit
def splitk_reduce_kernel(
    ws_ptr, gs_a_ptr, gs_b_ptr, bias_ptr, c_ptr, M, N,
    stride_ws, stride_wm, stride_cm, stride_cn,
    A_DENSE: tl.constexpr, IS_NVFP4: tl.constexpr, HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """``c = epilogue(sum_s ws[s])``, summed in order s = 0..SPLIT_K-1 (bitwise reproducible).
    ``ws`` is fp32 ``[SPLIT_K, M, N]`` with unit stride along N."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    mask = (offs_m < M)[:, None] & mask_n[None, :]
    w_off = offs_m.to(tl.int64)[:, None] * stride_wm + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + tl.full([], s, tl.int64) * stride_ws + w_off, mask=mask, other=0.0)
    if IS_NVFP4:
        acc = acc * nvfp4_output_scale(gs_a_ptr, gs_b_ptr, A_DENSE)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    c_off = offs_m.to(tl.int64)[:, None] * stride_cm + offs_n.to(tl.int64)[None, :] * stride_cn
    tl.store(c_ptr + c_off, acc.to(c_ptr.dtype.element_ty), mask=mask)
