"""Baseline only: the plain ``tl.dot_scaled`` MX GEMM a Triton user would write first.

Not a library kernel (the library's kernels live in ``blockscaled.kernels``); it exists so the
bench can show what Triton's own block-scaled dot gives on this GPU (on Hopper it is emulated
by upcasting to bf16; H100 measured ~205 TFLOP/s at M=4096 for MXFP8, docs/design.md,
"Measurements older than NOTES.md").
Requires K % BLOCK_K == 0 (checked by the caller) to stay the simplest possible kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _mx_dot_scaled_kernel(
    a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr,
    M, N, K,
    stride_am, stride_asm, stride_bn, stride_bsn, stride_cm,
    FMT: tl.constexpr,  # "e4m3" or "e2m1"
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    PACK: tl.constexpr = 2 if FMT == "e2m1" else 1
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rkp = tl.arange(0, BLOCK_K // PACK)
    rks = tl.arange(0, BLOCK_K // 32)
    mask_m = rm < M
    mask_n = rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rm[:, None] * stride_am + (k0 // PACK + rkp)[None, :], mask=mask_m[:, None], other=0)
        b = tl.load(b_ptr + rn[None, :] * stride_bn + (k0 // PACK + rkp)[:, None], mask=mask_n[None, :], other=0)
        sa = tl.load(as_ptr + rm[:, None] * stride_asm + (k0 // 32 + rks)[None, :], mask=mask_m[:, None], other=127)
        sb = tl.load(bs_ptr + rn[:, None] * stride_bsn + (k0 // 32 + rks)[None, :], mask=mask_n[:, None], other=127)
        acc = tl.dot_scaled(a, sa, FMT, b, sb, FMT, acc)
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :], c, mask=mask_m[:, None] & mask_n[None, :])


def mx_dot_scaled_gemm(a_data, a_scale, b_data, b_scale, fmt_elem: str, k: int, out_dtype=torch.bfloat16,
                       block_m: int = 128, block_n: int = 128, block_k: int = 128, num_warps: int = 8,
                       num_stages: int = 3):
    """``[M,K] x [N,K]^T`` for MX operands (data as stored by ScaledTensor, E8M0 uint8 scales)."""
    m, n = a_data.shape[0], b_data.shape[0]
    c = torch.empty((m, n), dtype=out_dtype, device=a_data.device)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    # fp8 data goes in as uint8 bytes (tl.dot_scaled takes either) so masked loads can use 0.
    a_u8, b_u8 = a_data.view(torch.uint8), b_data.view(torch.uint8)
    _mx_dot_scaled_kernel[grid](
        a_u8, a_scale, b_u8, b_scale, c, m, n, k,
        a_data.stride(0), a_scale.stride(0), b_data.stride(0), b_scale.stride(0), c.stride(0),
        FMT=fmt_elem, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages,
    )
    return c
