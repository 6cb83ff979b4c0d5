"""Host launcher of the fp4 decode GEMV with explicit layouts (kernels/hopper/mx_gemv_gluon.py).

``out [M, N] = x [M, K] @ dequantize(w).T`` for mxfp4 / nvfp4 weights and bf16 / fp16 activations,
K % 32 == 0: the plan's ``GemmConfig(strategy="gemv", gluon=True)`` carries the activation rows per
program (block_m 1 or 2), the weight rows per program (block_n) and the warps (a chunk of block_k =
1024 x num_warps K elements); plan/mx_gemv.py decides where it runs and checks a forced config.
"""

from __future__ import annotations

import functools

import torch
import triton

from ..config.gemm import GemmConfig
from ._launch import fast

__all__ = ["launch_mx_gemv_gluon"]


@functools.lru_cache(maxsize=None)
def _kernel():
    """The kernel with direct launches, imported once."""
    # Local and optional: the Gluon kernels fail to import on some triton versions.
    from ..kernels.hopper.mx_gemv_gluon import mx_gemv_gluon_kernel

    return fast(mx_gemv_gluon_kernel)


@functools.lru_cache(maxsize=64)
def _constexprs(fmt_name: str, rows: int, block_n: int, warps: int) -> dict:
    # Local and optional, as _kernel's import.
    from ..kernels.hopper.mx_gemv_gluon import constexprs

    return constexprs(fmt_name, rows, block_n, warps)


def launch_mx_gemv_gluon(x: torch.Tensor, b_data: torch.Tensor, b_scale: torch.Tensor, b_gs, fmt_name: str, k: int,
                         out: torch.Tensor, cfg: GemmConfig, bias: torch.Tensor | None = None) -> None:
    """One launch: (N / block_n) x (M / block_m) programs. The planner has checked the call against the
    kernel (plan/mx_gemv.py ``gluon_gemv_forced_error`` for a forced config); here only the strides, which the
    plan does not see (a ValueError naming config.gluon).

    x: bf16 / fp16 ``[M, K]``, K-contiguous; b_data: packed e2m1 ``[N, K / 2]`` uint8 with 16-byte aligned
    rows; b_scale: E8M0 uint8 ``[N, K / 32]`` (mxfp4) or e4m3 ``[N, K / 16]`` (nvfp4), K-contiguous; b_gs: nvfp4's fp32 global scale (0-d) or None;
    out: ``[M, N]`` any float dtype, unit column stride; bias: ``[N]`` or None."""
    if x.stride(-1) != 1 or b_data.stride(-1) != 1 or b_scale.stride(-1) != 1:
        raise ValueError("config.gluon: the Gluon GEMV needs K-contiguous activations, weights and scales")
    m, n = out.shape
    ce = _constexprs(fmt_name, cfg.block_m, cfg.block_n, cfg.num_warps)
    gs = b_gs if b_gs is not None else b_scale  # not read unless nvfp4
    _kernel()[(triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m))](
        x, b_data, b_scale, gs, bias if bias is not None else out, out, m, n, k, x.stride(0), b_data.stride(0),
        b_scale.stride(0), out.stride(0), HAS_BIAS=bias is not None, num_warps=cfg.num_warps, **ce)
