"""Host launchers of the sm_90a tiled MX / NV GEMMs (kernels/hopper/tiled.py, and tiled_rs.py for
4-warp configs): bf16 activations x mxfp4 / nvfp4 / mxfp8 weights, prefill-sized M.

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

__all__ = ["launch_tiled", "launch_tiled_rs", "TILED_FMT", "TILED_WS_MIN_STAGES"]

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
def _gluon_rs():
    # Local and optional: the Gluon kernels fail to import on some triton versions.
    from ..kernels.hopper.tiled_rs import tiled_rs_kernel

    return fast(tiled_rs_kernel)


@functools.lru_cache(maxsize=None)
def _layouts(block_m: int):
    from triton.experimental.gluon import language as gl

    # activations: 64 bf16 = one 128-byte swizzled row per box row (the wgmma's A operand);
    # weights: unswizzled int32 words (each thread reads its 16 or 32 contiguous bytes of a row)
    return (gl.NVMMASharedLayout.get_default_for([block_m, 64], gl.bfloat16),
            gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))


def launch_tiled(x: torch.Tensor, w_data: torch.Tensor, w_scale: torch.Tensor, w_gs, fmt_name: str, k: int,
                 out: torch.Tensor, cfg: GemmConfig, bias: torch.Tensor | None = None, x_gs=None,
                 seg: torch.Tensor | None = None, grouping: int = 0) -> None:
    """``out [M, N] = x [M, K] @ dequantize(w).T`` (+ bias) with ``cfg`` (strategy "tiled"; block_m
    256: the register-operand kernel, :func:`launch_tiled_rs`).

    ``x``: bf16, K contiguous, 16-byte aligned base and row stride; ``w_data``: the packed weights
    ``[N, K / 2]`` uint8 (e2m1) or ``[N, K]`` e4m3, rows contiguous and 16-byte aligned; ``w_scale``
    ``[N, K / 32]`` E8M0 or ``[N, K / 16]`` e4m3 (K contiguous); ``w_gs``: nvfp4's 0-d fp32
    global scale (None otherwise); ``bias`` fp32/bf16 ``[N]`` or None; ``out``: N contiguous;
    ``x_gs``: nvfp4 W x A, the activations' 0-d global scale (``x`` is their exact dequantization
    without it), applied in the epilogue.

    Grouped (``grouping`` 1 contiguous: ``seg`` = int32 offsets [E + 1], x [sum_m, K], out
    [sum_m, N]; 2 masked: ``seg`` = int32 counts [E], x [E, max_m, K], out [E, max_m, N]): weights
    ``[E, N, ...]`` with scales ``[E, N, ...]`` and nvfp4 global scales 0-d or [E]; no bias, no
    K split. Example (gpt-oss experts, bf16 tokens sorted by expert)::

        launch_tiled(x, w.data, w.scale, None, "mxfp4", 2880, out,
                     GemmConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=5,
                                strategy="tiled"), seg=offsets, grouping=1)
    """
    if cfg.is_register_operand:  # kernels/hopper/tiled_rs.py (GemmConfig: 4 warps)
        launch_tiled_rs(x, w_data, w_scale, w_gs, fmt_name, k, out, cfg, bias, x_gs, seg, grouping)
        return
    desc_cls, kernel = _gluon()
    fmt, wpr = TILED_FMT[fmt_name]
    n = w_data.shape[-2]
    x_layout, w_layout = _layouts(cfg.block_m)
    x, rows_x, e, o2 = _grouped_views(x, out, w_data, k, grouping)
    if x.shape[0] == 0 or n == 0:  # nothing to compute (a TMA descriptor takes no empty dimension)
        return
    target = o2 if o2 is not None else out.contiguous().view(-1, n)
    m = target.shape[0]
    x_desc = _descriptor(desc_cls, x, [x.shape[0], k], [x.stride(0), 1], [cfg.block_m, 64], x_layout)
    w32 = w_data.reshape(-1, w_data.shape[-1]).view(torch.int32)  # [(E *) N, K'] (validated contiguous rows)
    w_desc = _descriptor(desc_cls, w32, [w32.shape[0], k * wpr // 64], [w32.stride(0), 1], [cfg.block_n, wpr], w_layout)
    tiles = _tiles_m(grouping, rows_x, e, m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    steps = triton.cdiv(k, 64)
    per = triton.cdiv(steps, cfg.split_k if not grouping else 1)
    nsplit = triton.cdiv(steps, per)  # every split non-empty
    gs = w_gs if w_gs is not None else w_scale  # not read unless nvfp4
    part = cnt = gs
    if nsplit > 1:
        part, cnt = splitk_scratch(out.device, tiles, nsplit * tiles * cfg.block_m * cfg.block_n)
    kernel[(tiles * nsplit,)](
        x_desc, w_desc, w_scale, gs, x_gs if x_gs is not None else gs, bias if bias is not None else gs, target, part,
        cnt, rows_x if grouping else m, n, k, per, nsplit, w_scale.stride(-2), target.stride(0),
        seg if seg is not None else gs, e, w_scale.stride(0) if grouping else 0, FMT=fmt, BN=cfg.block_n,
        STAGES=cfg.num_stages, HAS_AGS=x_gs is not None, HAS_BIAS=bias is not None,
        WS=cfg.num_stages >= TILED_WS_MIN_STAGES, MODE=grouping, E_POW2=triton.next_power_of_2(e) if grouping else 1,
        GS_PER_E=w_gs is not None and w_gs.numel() > 1, num_warps=cfg.num_warps)
    if o2 is None:
        out.copy_(target.view(out.shape))


def _tiles_m(grouping: int, rows_x: int, e: int, m: int, bm: int) -> int:
    """M tiles of the grid: contiguous, an upper bound (sum over experts of ceil(rows_e / BM) <=
    ceil(sum_m / BM) + E); masked, every expert's max_m rows; dense, M's."""
    if grouping == 1:
        return triton.cdiv(rows_x, bm) + e
    if grouping == 2:
        return e * triton.cdiv(rows_x, bm)
    return triton.cdiv(m, bm)


def _grouped_views(x, out, w_data, k, grouping):
    """(x as 2-D, rows of x per expert or in all, experts, the output as 2-D, or None where a masked
    out= is not evenly strided or the call is empty: no rows or N = 0)."""
    if grouping == 2:  # one 2-D view each: [E * max_m, K] and [E * max_m, N] (uniform row strides)
        e, max_m = x.shape[0], x.shape[1]
        if x.stride(0) != max_m * x.stride(1):
            x = x.contiguous()
        x = x.reshape(-1, k)
        rows_x = max_m
    else:
        e = w_data.shape[0] if grouping else 1
        rows_x = x.shape[0]
    n = w_data.shape[-2]
    if x.shape[0] == 0 or n == 0:  # nothing to compute: the caller returns (no view of an empty out)
        return x, rows_x, e, None
    # one 2-D [rows, N] view of the output; a masked out= whose experts are not evenly strided is
    # computed in a copy of itself (rows past the counts must keep their content) and copied back
    uniform = grouping != 2 or out.stride(0) == out.shape[1] * out.stride(1)
    return x, rows_x, e, (out.reshape(-1, n) if uniform else None)


def launch_tiled_rs(x: torch.Tensor, w_data: torch.Tensor, w_scale: torch.Tensor, w_gs, fmt_name: str, k: int,
                    out: torch.Tensor, cfg: GemmConfig, bias: torch.Tensor | None = None, x_gs=None,
                    seg: torch.Tensor | None = None, grouping: int = 0) -> None:
    """``out [M, N] = x [M, K] @ dequantize(w).T`` (+ bias) on the register-operand tiled kernel
    (kernels/hopper/tiled_rs.py; :func:`launch_tiled` sends 4-warp configs here): mxfp4 / nvfp4 /
    mxfp8 weights, ``cfg.block_m`` tokens (16 .. 256) x ``cfg.block_n`` weight rows per program (128: two
    consumer warpgroups, 256: four),
    ``cfg.num_stages`` ring slots, ``cfg.split_k`` K splits (dense; lowered so that none is empty).
    Operands, grouping and layouts as :func:`launch_tiled`. Example (Llama 3 70B o, a prefill)::

        launch_tiled_rs(x, w.data, w.scale, None, "mxfp4", 8192, out,
                        GemmConfig(block_m=256, block_n=128, block_k=64, num_warps=4, num_stages=4,
                                   strategy="tiled"))
    """
    desc_cls, _ = _gluon()
    kernel = _gluon_rs()
    fmt, wpr = TILED_FMT[fmt_name]
    n = w_data.shape[-2]
    x, rows_x, e, o2 = _grouped_views(x, out, w_data, k, grouping)
    if x.shape[0] == 0 or n == 0:  # nothing to compute (a TMA descriptor takes no empty dimension)
        return
    target = o2 if o2 is not None else out.contiguous().view(-1, n)
    x_layout, w_layout = _layouts(cfg.block_m)
    x_desc = _descriptor(desc_cls, x, [x.shape[0], k], [x.stride(0), 1], [cfg.block_m, 64], x_layout)
    w32 = w_data.reshape(-1, w_data.shape[-1]).view(torch.int32)
    w_desc = _descriptor(desc_cls, w32, [w32.shape[0], k * wpr // 64], [w32.stride(0), 1], [cfg.block_n, wpr],
                         w_layout)
    tiles = _tiles_m(grouping, rows_x, e, target.shape[0], cfg.block_m) * triton.cdiv(n, cfg.block_n)
    steps = triton.cdiv(k, 64)
    per = triton.cdiv(steps, cfg.split_k if not grouping else 1)
    nsplit = triton.cdiv(steps, per)  # every split non-empty
    gs = w_gs if w_gs is not None else w_scale  # not read unless nvfp4
    part = cnt = gs  # not read unsplit
    if nsplit > 1:  # a counter per tile and consumer warpgroup (64 weight rows): each sums its part apart
        part, cnt = splitk_scratch(out.device, cfg.block_n // 64 * tiles, nsplit * tiles * cfg.block_m * cfg.block_n)
    kernel[(tiles * nsplit,)](
        x_desc, w_desc, w_scale, gs, x_gs if x_gs is not None else gs, bias if bias is not None else gs, target,
        part, cnt, rows_x if grouping else target.shape[0], n, k, per, nsplit, w_scale.stride(-2), target.stride(0),
        seg if seg is not None else gs, e, w_scale.stride(0) if grouping else 0, FMT=fmt, STAGES=cfg.num_stages,
        HAS_AGS=x_gs is not None, HAS_BIAS=bias is not None, MODE=grouping,
        E_POW2=triton.next_power_of_2(e) if grouping else 1, GS_PER_E=w_gs is not None and w_gs.numel() > 1,
        num_warps=4)
    if o2 is None:
        out.copy_(target.view(out.shape))
