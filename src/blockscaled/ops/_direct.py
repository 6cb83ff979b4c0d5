"""Host launcher of the sm_90 register-streaming decode kernel (kernels/hopper/direct.py).

``out [M, N] = x [M, K] @ dequantize(w).T`` for mxfp4 / nvfp4 weights and bf16 activations (quantized
ones arrive dequantized to bf16 by ``ops.gemm.stream_activations``), M <= 8 (dense) or grouped,
K % 32 == 0, on sm_90: the plan's ``GemmConfig(strategy="direct")`` carries the padded rows
(block_m), the K split and the register budget (maxnreg); plan/direct.py decides where it runs. No validation here (ops/gemm.py validates the call and
checks a forced config).
"""

from __future__ import annotations

import functools

import torch
import triton

from ..config.gemm import GemmConfig
from . import _stream
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
                  bias: torch.Tensor | None = None, seg: torch.Tensor | None = None, grouping: int = 0) -> None:
    """One launch over ``out``. Dense (``grouping`` 0): (64-row tiles) x (K splits) programs over
    ``out [M, N]``. Grouped (1 contiguous: ``seg`` = offsets [E+1], x [sum_m, K], out [sum_m, N];
    2 masked: ``seg`` = counts [E], x [E, max_m, K], out [E, max_m, N]), as the streaming kernel's
    grouped launch (ops/_stream.py): contiguous grids compacted to min(E, sum_m) expert slots and
    split ``cfg.split_k`` ways; masked: every expert, no split.

    x: bf16 (K contiguous, dense M <= cfg.block_m); w_data: packed e2m1 ``[(E,) N, K / 2]`` uint8
    with 16-byte aligned rows; w_scale: uint8 E8M0 ``[(E,) N, K / 32]`` (mxfp4) or e4m3
    ``[(E,) N, K / 16]`` (nvfp4); w_gs: nvfp4's fp32 global scale (0-d, or one per expert) or None;
    x_gs: the activations' 0-d fp32 global scale (nvfp4 activations dequantized without it) or
    None; out: bf16 / fp16 / fp32, unit column stride; bias: ``[N]`` (dense only) or None.
    """
    kernel = _kernel()
    n = w_data.shape[-2]
    w32 = w_data.reshape(-1, w_data.shape[-1]).view(torch.int32)  # [(E *) N, K / 8], a view
    tiles = triton.cdiv(n, 64)
    chunks = triton.cdiv(k, 128)
    gs = w_gs if w_gs is not None else w_scale  # not read unless nvfp4
    ags = x_gs if x_gs is not None else gs  # not read unless HAS_AGS
    if grouping:
        if bias is not None:
            raise ValueError("bias: the grouped register-streaming kernel takes none")
        e = w_data.shape[0]
        masked = grouping == 2
        if masked and cfg.split_k != 1:
            raise ValueError(f"config.split_k: the masked grouped kernel does not split K, got {cfg.split_k}")
        m = x.shape[1] if masked else x.shape[0]
        slots = e if masked or m >= e or not _stream.GROUPED_COMPACT else max(m, 1)
        per = triton.cdiv(chunks, cfg.split_k)
        nsplit = triton.cdiv(chunks, per)
        part = cnt = out  # not read unless split (SPLIT = 1 is specialised away)
        if nsplit > 1:  # fp32 partials [nsplit, sum_m, N] and one counter per (slot, tile)
            part, cnt = splitk_scratch(out.device, slots * tiles, nsplit * m * n)
        kernel[(slots * tiles * nsplit,)](
            w32, w_scale, x, gs, ags, gs, out, part, cnt, seg, m, n, k, per, nsplit,
            w32.stride(0), w_scale.stride(-2), w_scale.stride(0), x.stride(-2), x.stride(0) if masked else 0,
            out.stride(-2), out.stride(0) if masked else 0,
            FMT=_FMT[fmt_name], MP=cfg.block_m, HAS_AGS=x_gs is not None, HAS_BIAS=False, num_warps=4,
            GROUPING=grouping, GS_PER_E=w_gs is not None and w_gs.numel() > 1, NUM_E=e if slots < e else 0)
        return
    per = triton.cdiv(chunks, cfg.split_k)
    nsplit = triton.cdiv(chunks, per)  # no empty split
    part = cnt = out  # not read unless split
    if nsplit > 1:  # flat fp32 partials [nsplit, tiles, 64, MP] (reused per stream) and zeroed counters
        part, cnt = splitk_scratch(out.device, tiles, nsplit * tiles * 64 * cfg.block_m)
    kernel[(tiles * nsplit,)](
        w32, w_scale, x, gs, ags, bias if bias is not None else gs, out, part, cnt, cnt, x.shape[0], n, k, per, nsplit,
        w32.stride(0), w_scale.stride(0), 0, x.stride(0), 0, out.stride(0), 0,
        FMT=_FMT[fmt_name], MP=cfg.block_m, HAS_AGS=x_gs is not None, HAS_BIAS=bias is not None, num_warps=4,
        **({"maxnreg": cfg.maxnreg} if getattr(cfg, "maxnreg", 0) else {}))
