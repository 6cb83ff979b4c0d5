"""Host launcher of the sm_90a fp4-weight streaming kernel (kernels/hopper/fp4_stream.py).

``out [M, N] = x [M, K] @ dequantize(w).T`` for mxfp4 / nvfp4 weights and bf16 activations,
M <= 64, K % 32 == 0, on sm_90: the plan's ``GemmConfig(strategy="fp4_stream")`` carries the
padded rows (block_m), the K split and the ring depth; plan/fp4_stream.py decides where it runs.
No validation here (ops/gemm.py validates the call and checks a forced config).
"""

from __future__ import annotations

import functools

import torch
import triton

from ..config.gemm import GemmConfig
from ._splitk import splitk_counters

__all__ = ["launch_fp4_stream"]


@functools.lru_cache(maxsize=None)
def _w_layout():
    """Unswizzled shared layout of a [64, 16] int32 weight box: each thread reads 16 contiguous
    bytes of a row (kernels/hopper/fp4_stream.py)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def launch_fp4_stream(x: torch.Tensor, w_data: torch.Tensor, w_scale: torch.Tensor, w_gs, fmt_name: str, k: int,
                      out: torch.Tensor, cfg: GemmConfig) -> None:
    """One launch over ``out [M, N]``: (64-row tiles) x (K splits) programs.

    x: bf16 ``[M, K]`` (K contiguous); w_data: uint8 ``[N, K / 2]`` packed e2m1 (16-byte aligned
    rows); w_scale: uint8 E8M0 ``[N, K / 32]`` (mxfp4) or e4m3 ``[N, K / 16]`` (nvfp4); w_gs: the
    nvfp4 global scale (0-d fp32) or None; out: ``[M, N]`` bf16 / fp16 / fp32, unit column stride.
    """
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # Local and optional: the Gluon kernels fail to import on some triton versions.
    from ..kernels.hopper.fp4_stream import fp4_stream_kernel

    m = x.shape[0]
    n = w_data.shape[0]
    w32 = w_data.view(torch.int32)
    w_desc = TensorDescriptor(w32, [n, k // 8], [w32.stride(0), 1], [64, 16], _w_layout())
    tiles = triton.cdiv(n, 64)
    chunks = triton.cdiv(k, 128)
    per = triton.cdiv(chunks, cfg.split_k)
    nsplit = triton.cdiv(chunks, per)  # no empty split
    part = cnt = out  # not read unless split
    if nsplit > 1:
        part = torch.empty((nsplit, tiles, 64, cfg.block_m), dtype=torch.float32, device=out.device)
        cnt = splitk_counters(out.device, tiles)
    gs = w_gs if w_gs is not None else w_scale  # not read unless nvfp4
    fp4_stream_kernel[(tiles * nsplit,)](
        w_desc, w_scale, x, gs, out, part, cnt, m, n, k, per, nsplit,
        w_scale.stride(0), x.stride(0), out.stride(0),
        FMT=3 if fmt_name == "nvfp4" else 2, MP=cfg.block_m, STAGES=cfg.num_stages, num_warps=4)
