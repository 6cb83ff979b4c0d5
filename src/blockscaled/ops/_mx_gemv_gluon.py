"""Host launcher of the fp4 decode GEMV with explicit layouts (kernels/hopper/mx_gemv_gluon.py).

``out [M, N] = x [M, K] @ dequantize(w).T`` for mxfp4 / nvfp4 weights and bf16 / fp16 activations,
K % 32 == 0: the plan's ``GemmConfig(strategy="gemv", gluon=True)`` carries the activation rows per
program (block_m 1 or 2), the weight rows per program (block_n) and the warps (a chunk of block_k =
1024 x num_warps K elements); plan/mx_gemv.py decides where it runs. ops/gemm.py validates the call.
"""

from __future__ import annotations

import functools

import torch
import triton

from ..config.gemm import GemmConfig
from ..plan import device_info
from . import _hopper
from ._launch import fast

__all__ = ["launch_mx_gemv_gluon", "gluon_gemv_operands_error"]


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


def gluon_gemv_operands_error(fmt_name: str, a2: torch.Tensor, a_s2, b_data: torch.Tensor, b_scale: torch.Tensor,
                              k: int, cfg: GemmConfig) -> str | None:
    """Why these operands cannot run on the kernel (a forced config; the planner never plans them), or None:
    the formats, activations, K and layouts first, then the device (sm_90) and whether Gluon builds."""
    if fmt_name not in ("mxfp4", "nvfp4"):
        return f"config.gluon: the Gluon GEMV takes mxfp4 / nvfp4 weights, got {fmt_name}"
    if a_s2 is not None or a2.dtype not in (torch.bfloat16, torch.float16):
        return (f"config.gluon: the Gluon GEMV takes bf16 / fp16 activations (weight-only), got "
                f"{'quantized' if a_s2 is not None else a2.dtype} activations")
    if k % 32 or k <= 0:
        return f"config.gluon: the Gluon GEMV needs K a positive multiple of 32, got K={k}"
    if a2.stride(-1) != 1 or b_data.stride(-1) != 1 or b_scale.stride(-1) != 1:
        return "config.gluon: the Gluon GEMV needs K-contiguous activations, weights and scales"
    if cfg.block_k != 1024 * cfg.num_warps:
        return (f"config.block_k: the Gluon GEMV's chunk is 1024 x num_warps K elements (one 32-element slice per "
                f"thread), got block_k={cfg.block_k} with num_warps={cfg.num_warps}")
    if not device_info(a2.device).is_hopper:
        return f"config.gluon: the Gluon GEMV is an sm_90 (Hopper) kernel, got a {a2.device} tensor"
    if _hopper.gluon_unavailable_reason() is not None:
        return f"config.gluon: the Gluon kernels do not build here ({_hopper.gluon_unavailable_reason()})"
    return None


def launch_mx_gemv_gluon(x: torch.Tensor, x_scale, b_data: torch.Tensor, b_scale: torch.Tensor, b_gs, fmt_name: str,
                         k: int, out: torch.Tensor, cfg: GemmConfig, bias: torch.Tensor | None = None) -> None:
    """One launch: (N / block_n) x (M / block_m) programs, after ``gluon_gemv_operands_error`` (a ValueError
    naming the argument where the operands do not fit).

    x: bf16 / fp16 ``[M, K]``, K-contiguous (x_scale: None; quantized activations are refused); b_data:
    packed e2m1 ``[N, K / 2]`` uint8 with 16-byte aligned rows; b_scale: E8M0 uint8 ``[N, K / 32]``
    (mxfp4) or e4m3 ``[N, K / 16]`` (nvfp4), K-contiguous; b_gs: nvfp4's fp32 global scale (0-d) or None;
    out: ``[M, N]`` any float dtype, unit column stride; bias: ``[N]`` or None."""
    why = gluon_gemv_operands_error(fmt_name, x, x_scale, b_data, b_scale, k, cfg)
    if why is not None:
        raise ValueError(why)
    m, n = out.shape
    ce = _constexprs(fmt_name, cfg.block_m, cfg.block_n, cfg.num_warps)
    gs = b_gs if b_gs is not None else b_scale  # not read unless nvfp4
    _kernel()[(triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m))](
        x, b_data, b_scale, gs, bias if bias is not None else out, out, m, n, k, x.stride(0), b_data.stride(0),
        b_scale.stride(0), out.stride(0), HAS_BIAS=bias is not None, num_warps=cfg.num_warps, **ce)
