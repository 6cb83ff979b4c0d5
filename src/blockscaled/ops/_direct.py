"""Host launcher of the sm_90 register-streaming decode kernel (kernels/hopper/direct.py).

``out [M, N] = x [M, K] @ dequantize(w).T`` for mxfp4 / nvfp4 weights and bf16 activations (quantized
ones arrive dequantized to bf16 by ``ops.gemm.stream_activations``), M <= 16, K % 32 == 0, on sm_90:
the plan's ``GemmConfig(strategy="direct")`` carries the padded rows (block_m) and the K split;
plan/stream.py decides where it runs. No validation here (ops/gemm.py validates the call and
checks a forced config).
"""

from __future__ import annotations

import functools

import torch
import triton

from ..config.gemm import GemmConfig
from ._launch import fast
from ._splitk import splitk_scratch

__all__ = ["launch_direct"]

#: kernel FMT codes (kernels/hopper/stream.py)
_FMT = {"mxfp4": 2, "nvfp4": 3}


@functools.lru_cache(maxsize=None)
def _kernel():
    """The kernel with direct launches, imported once."""
    # Local and optional: the Gluon kernels fail to import on some triton versions.
    from ..kernels.hopper.direct import direct_kernel

    return fast(direct_kernel)


def launch_direct(x: torch.Tensor, w_data: torch.Tensor, w_scale: torch.Tensor, w_gs, fmt_name: str, k: int,
                  out: torch.Tensor, cfg: GemmConfig, x_gs: torch.Tensor | None = None,
                  bias: torch.Tensor | None = None) -> None:
    """One launch of (64-row tiles) x (K splits) programs over ``out [M, N]``.

    x: bf16 ``[M, K]`` (K contiguous, M <= cfg.block_m); w_data: packed e2m1 ``[N, K / 2]`` uint8 with
    16-byte aligned rows; w_scale: uint8 E8M0 ``[N, K / 32]`` (mxfp4) or e4m3 ``[N, K / 16]`` (nvfp4);
    w_gs: nvfp4's 0-d fp32 global scale or None; x_gs: the activations' 0-d fp32 global scale (nvfp4
    activations dequantized without it) or None; out: bf16 / fp16 / fp32 ``[M, N]``, unit column
    stride; bias: ``[N]`` or None.
    """
    kernel = _kernel()
    n = w_data.shape[0]
    w32 = w_data.view(torch.int32)
    tiles = triton.cdiv(n, 64)
    chunks = triton.cdiv(k, 128)
    per = triton.cdiv(chunks, cfg.split_k)
    nsplit = triton.cdiv(chunks, per)  # no empty split
    gs = w_gs if w_gs is not None else w_scale  # not read unless nvfp4
    ags = x_gs if x_gs is not None else gs  # not read unless HAS_AGS
    part = cnt = out  # not read unless split
    if nsplit > 1:  # flat fp32 partials [nsplit, tiles, 64, MP] (reused per stream) and zeroed counters
        part, cnt = splitk_scratch(out.device, tiles, nsplit * tiles * 64 * cfg.block_m)
    kernel[(tiles * nsplit,)](
        w32, w_scale, x, gs, ags, bias if bias is not None else gs, out, part, cnt, x.shape[0], n, k, per, nsplit,
        w32.stride(0), w_scale.stride(0), x.stride(0), out.stride(0),
        FMT=_FMT[fmt_name], MP=cfg.block_m, HAS_AGS=x_gs is not None, HAS_BIAS=bias is not None, num_warps=4)
