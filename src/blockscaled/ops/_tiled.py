"""Host launcher of the sm_90a tiled MX / NV GEMM (kernels/hopper/tiled.py): bf16 activations x
mxfp4 / nvfp4 / mxfp8 weights, prefill-sized M.

No validation here (ops/gemm.py validates the call and checks a forced config; the planner plans
the kernel only for operands it can take: plan/tiled.py).
"""

from __future__ import annotations

import functools

import torch
import triton

from ..config.gemm import GemmConfig
from ._launch import fast
from ._splitk import splitk_scratch
from ._stream import _descriptor

__all__ = ["launch_tiled", "launch_tiled_xf", "TILED_FMT", "TILED_WS_MIN_STAGES"]

#: rings of at least this many slots run with a TMA producer warp (warp-specialised: the math warps
#: keep one barrier of their own per step instead of four; H200 A/B, twentieth session: 1.03-1.12x
#: at one program per SM); the 3-slot ring runs without it, two programs per SM (the producer's
#: registers would not let two fit: the warp-specialised 3-slot ring measured 1.3-1.8x slower there)
TILED_WS_MIN_STAGES = 4
#: per weight format: (kernel FMT code, int32 words per row and 64-element K step)
TILED_FMT = {"mxfp8": (1, 16), "mxfp4": (2, 8), "nvfp4": (3, 8)}


@functools.lru_cache(maxsize=None)
def _gluon():
    """(Gluon's TensorDescriptor class, the kernel with direct launches), imported once (an import
    statement per call costs microseconds of the eager host path)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # Local and optional: the Gluon kernels fail to import on some triton versions.
    from ..kernels.hopper.tiled import tiled_kernel

    return TensorDescriptor, fast(tiled_kernel)


@functools.lru_cache(maxsize=None)
def _gluon_xf():
    """The decode-warpgroup kernel (kernels/hopper/tiled_xf.py) with direct launches, imported once."""
    # Local and optional: the Gluon kernels fail to import on some triton versions.
    from ..kernels.hopper.tiled_xf import tiled_xf_kernel

    return fast(tiled_xf_kernel)


@functools.lru_cache(maxsize=None)
def _layouts(block_m: int):
    from triton.experimental.gluon import language as gl

    # activations: 64 bf16 = one 128-byte swizzled row per box row (the wgmma's A operand);
    # weights: unswizzled int32 words (each thread reads its 16 or 32 contiguous bytes of a row)
    return (gl.NVMMASharedLayout.get_default_for([block_m, 64], gl.bfloat16),
            gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))


def launch_tiled(x: torch.Tensor, w_data: torch.Tensor, w_scale: torch.Tensor, w_gs, fmt_name: str, k: int,
                 out: torch.Tensor, cfg: GemmConfig, bias: torch.Tensor | None = None, x_gs=None) -> None:
    """``out [M, N] = x [M, K] @ dequantize(w).T`` (+ bias) with ``cfg`` (strategy "tiled").

    ``x``: bf16, K contiguous, 16-byte aligned base and row stride; ``w_data``: the packed weights
    ``[N, K / 2]`` uint8 (e2m1) or ``[N, K]`` e4m3, rows contiguous and 16-byte aligned; ``w_scale``
    ``[N, K / 32]`` E8M0 or ``[N, K / 16]`` e4m3 (K contiguous); ``w_gs``: nvfp4's 0-d fp32
    global scale (None otherwise); ``bias`` fp32/bf16 ``[N]`` or None; ``out``: N contiguous;
    ``x_gs``: nvfp4 W x A, the activations' 0-d global scale (``x`` is their exact dequantization
    without it), applied in the epilogue."""
    desc_cls, kernel = _gluon()
    fmt, wpr = TILED_FMT[fmt_name]
    m, n = out.shape
    x_layout, w_layout = _layouts(cfg.block_m)
    x_desc = _descriptor(desc_cls, x, [m, k], [x.stride(0), 1], [cfg.block_m, 64], x_layout)
    w32 = w_data.view(torch.int32)
    w_desc = _descriptor(desc_cls, w32, [n, k * wpr // 64], [w32.stride(0), 1], [cfg.block_n, wpr], w_layout)
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    steps = triton.cdiv(k, 64)
    per = triton.cdiv(steps, cfg.split_k)
    nsplit = triton.cdiv(steps, per)  # every split non-empty
    gs = w_gs if w_gs is not None else w_scale  # not read unless nvfp4
    part = cnt = gs
    if nsplit > 1:
        part, cnt = splitk_scratch(out.device, tiles, nsplit * tiles * cfg.block_m * cfg.block_n)
    kernel[(tiles * nsplit,)](
        x_desc, w_desc, w_scale, gs, x_gs if x_gs is not None else gs, bias if bias is not None else gs, out, part,
        cnt, m, n, k, per, nsplit,
        w_scale.stride(0), out.stride(0), FMT=fmt, BN=cfg.block_n, STAGES=cfg.num_stages,
        HAS_AGS=x_gs is not None, HAS_BIAS=bias is not None, WS=cfg.num_stages >= TILED_WS_MIN_STAGES,
        num_warps=cfg.num_warps)


def launch_tiled_xf(x: torch.Tensor, w_data: torch.Tensor, w_scale: torch.Tensor, w_gs, fmt_name: str, k: int,
                    out: torch.Tensor, block_m: int, block_n: int, stages: tuple[int, int, int], split_k: int,
                    bias: torch.Tensor | None = None, x_gs=None) -> None:
    """As :func:`launch_tiled` on the decode-warpgroup kernel (kernels/hopper/tiled_xf.py):
    ``block_m`` 64 or 128 (one consumer warpgroup per 64 rows), ``block_n`` 128 or 256 (256: no
    bias), ``stages`` the (activation, packed-weight, decoded-weight) ring slots, ``split_k`` K splits (lowered so that none is empty)."""
    desc_cls = _gluon()[0]
    kernel = _gluon_xf()
    fmt, wpr = TILED_FMT[fmt_name]
    m, n = out.shape
    x_layout, w_layout = _layouts(block_m)
    x_desc = _descriptor(desc_cls, x, [m, k], [x.stride(0), 1], [block_m, 64], x_layout)
    w32 = w_data.view(torch.int32)
    w_desc = _descriptor(desc_cls, w32, [n, k * wpr // 64], [w32.stride(0), 1], [block_n, wpr], w_layout)
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    steps = triton.cdiv(k, 64)
    per = triton.cdiv(steps, split_k)
    nsplit = triton.cdiv(steps, per)  # every split non-empty
    gs = w_gs if w_gs is not None else w_scale  # not read unless nvfp4
    part = cnt = gs
    if nsplit > 1:  # one counter per consumer warpgroup's half-tile
        part, cnt = splitk_scratch(out.device, tiles * (block_m // 64), nsplit * tiles * block_m * block_n)
    kernel[(tiles * nsplit,)](
        x_desc, w_desc, w_scale, gs, x_gs if x_gs is not None else gs, bias if bias is not None else gs, out, part,
        cnt, m, n, k, per, nsplit, w_scale.stride(0), out.stride(0), FMT=fmt, BN=block_n, XSTAGES=stages[0],
        WSTAGES=stages[1], DSTAGES=stages[2], HAS_AGS=x_gs is not None, HAS_BIAS=bias is not None, num_warps=4)
