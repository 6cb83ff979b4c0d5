"""Host launcher of the sm_90a weight-streaming kernel (kernels/hopper/stream.py).

``out [M, N] = x [M, K] @ dequantize(w).T`` for mxfp4 / nvfp4 / mxfp8 weights and bf16 or quantized
(the weight's format) activations, M <= 64, K % 32 == 0, on sm_90: the plan's
``GemmConfig(strategy="stream")`` carries the padded rows (block_m), the K split, the ring depth
and whether quantized activations were dequantized first (``dequant_a``); plan/stream.py decides
where it runs.
No validation here (ops/gemm.py validates the call and checks a forced config).
"""

from __future__ import annotations

import functools

import torch
import triton

from ..config.gemm import GemmConfig
from ._launch import fast
from ._splitk import splitk_scratch

__all__ = ["launch_stream"]


@functools.lru_cache(maxsize=None)
def _w_layout(swizzle: int = 0):
    """Shared layout of a weight box of int32 words: fp4 [64, 16] unswizzled (each thread reads 16
    contiguous bytes of a 64-byte row: a warp's 8 row pairs hit distinct banks); mxfp8 [64, 32]
    with the 128-byte swizzle (each thread reads 32 bytes of a 128-byte row: unswizzled, the rows
    of a quarter-warp would share banks) (kernels/hopper/stream.py)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=32, rank=2)


#: contiguous grouped launches compact their grid to min(E, sum_m) expert slots (the kernel's
#: ``NUM_E``); False launches E x tiles programs as before (the A/B switch)
GROUPED_COMPACT = True

#: per weight format: (kernel FMT code, int32 words per row and 128-K step, box swizzle)
_FMT = {"mxfp8": (1, 32, 128), "mxfp4": (2, 16, 0), "nvfp4": (3, 16, 0)}


@functools.lru_cache(maxsize=None)
def _gluon():
    """(Gluon's TensorDescriptor class, the kernel with direct launches), imported once: an import
    statement per call was ~2 us of the eager host path."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # Local and optional: the Gluon kernels fail to import on some triton versions.
    from ..kernels.hopper.stream import stream_kernel

    return TensorDescriptor, fast(stream_kernel)


#: the stream kernel's block scales two K steps ahead (kernels/hopper/stream.py ``_k_loop``): -1 its
#: rule, 0 / 1 forced off / on (same-process A/B; every value computes the same result)
SCALES_AHEAD = -1


#: the fields of Gluon's TensorDescriptor this module fills directly (triton 3.6); another
#: release's class with other fields is built through its constructor
_DESC_FIELDS = ("base", "shape", "strides", "block_shape", "layout", "padding")


def _descriptor(cls, base, shape, strides, block, layout):
    """``cls(base, shape, strides, block, layout)`` without its ``__post_init__`` checks (~10 us of
    the ~95 us eager host path of an M = 16 call, H200 cProfile, benchmarks/NOTES.md eighteenth
    session): the caller's plan already required what they check (16-byte aligned base and row
    stride: ``ops.gemm._tma_ok`` / the grouped plan's TMA check; unit last stride; a valid box)."""
    if tuple(getattr(cls, "__dataclass_fields__", ())) != _DESC_FIELDS:
        return cls(base, shape, strides, block, layout)
    d = object.__new__(cls)
    d.base, d.shape, d.strides, d.block_shape, d.layout, d.padding = base, shape, strides, block, layout, "zero"
    return d


def words_aligned(t: torch.Tensor, row_stride: int) -> bool:
    """Quantized activations the kernel's gather can read as int32 words: 4-byte aligned rows and
    base address. While torch.compile traces, tensors have no address: the launcher checks the
    real one (and raises)."""
    return (row_stride * t.element_size()) % 4 == 0 and (torch.compiler.is_compiling() or t.data_ptr() % 4 == 0)


def launch_stream(x: torch.Tensor, w_data: torch.Tensor, w_scale: torch.Tensor, w_gs, fmt_name: str, k: int,
                  out: torch.Tensor, cfg: GemmConfig, seg: torch.Tensor | None = None, grouping: int = 0,
                  x_scale: torch.Tensor | None = None, x_gs: torch.Tensor | None = None,
                  bias: torch.Tensor | None = None) -> None:
    """One launch over ``out``. Dense (``grouping`` 0): (64-row tiles) x (K splits) programs over
    ``out [M, N]``. Grouped (1 contiguous: ``seg`` = offsets [E+1], x [sum_m, K], out [sum_m, N];
    2 masked: ``seg`` = counts [E], x [E, max_m, K], out [E, max_m, N]): experts x 64-row tiles
    programs (contiguous: min(E, sum_m) expert slots, x ``cfg.split_k`` K splits; masked: no K
    split, ``cfg.split_k`` must be 1).

    x: bf16 (K contiguous); w_data: packed e2m1 ``[(E,) N, K / 2]`` (mxfp4 / nvfp4) or e4m3
    ``[(E,) N, K]`` (mxfp8), 16-byte aligned rows; w_scale: uint8 E8M0 ``[(E,) N, K / 32]`` (mx) or
    e4m3 ``[(E,) N, K / 16]`` (nvfp4); w_gs: the nvfp4 global scale (0-d or one per expert, fp32)
    or None; out: bf16 / fp16 / fp32, unit column stride; bias: [N] (dense only) or None.
    Quantized activations (W x A, the weight's format), two ways (``cfg.dequant_a``, the plan's
    choice): decoded in the kernel's gather: ``x`` their data (packed e2m1 ``[..., K / 2]`` uint8 or
    e4m3 ``[..., K]``, rows 4-byte aligned), ``x_scale`` their 1 x 32 / 1 x 16 block scales
    ``[..., K / 32 | K / 16]``; or dequantized first: ``x`` their exact bf16 dequantization with a
    unit global scale (``ops.gemm.stream_activations``), ``x_scale`` None. Either way ``x_gs``
    (nvfp4) is their 0-d fp32 global scale, applied in the epilogue.
    """
    desc_cls, kernel = _gluon()
    fmt, wps, swz = _FMT[fmt_name]
    n = w_data.shape[-2]
    w2 = w_data.reshape(-1, w_data.shape[-1])  # [(E *) N, K'], a view (validated contiguous rows)
    w32 = w2.view(torch.int32)
    w_desc = _descriptor(desc_cls, w32, [w32.shape[0], k * wps // 128], [w32.stride(0), 1], [64, wps], _w_layout(swz))
    tiles = triton.cdiv(n, 64)
    chunks = triton.cdiv(k, 128)
    gs = w_gs if w_gs is not None else w_scale  # not read unless nvfp4
    gs_per_e = w_gs is not None and w_gs.numel() > 1
    a_quant = x_scale is not None
    if a_quant:  # the data as int32 words (8 e2m1 / 4 e4m3 each); strides in words
        if x.data_ptr() % 4:  # planned while torch.compile traced (no address then): say so, loudly
            raise ValueError(f"a: the streaming kernel reads quantized activations as 4-byte words; their base "
                             f"address is not 4-byte aligned (data_ptr % 4 = {x.data_ptr() % 4}): pass a "
                             f"contiguous copy")
        x = x.view(torch.int32)
    xs = x_scale if a_quant else gs  # not read unless quantized
    ags = x_gs if x_gs is not None else gs  # not read unless HAS_AGS
    if grouping:
        if bias is not None:
            raise ValueError("bias: the grouped streaming kernel takes none")
        e = w_data.shape[0]
        masked = grouping == 2
        if masked and cfg.split_k != 1:
            raise ValueError(f"config.split_k: the masked grouped streaming kernel does not split K, got {cfg.split_k}")
        m = x.shape[1] if masked else x.shape[0]
        # contiguous: at most sum_m experts hold rows; fewer slots than experts compact the grid
        slots = e if masked or m >= e or not GROUPED_COMPACT else max(m, 1)
        per = triton.cdiv(chunks, cfg.split_k)
        nsplit = triton.cdiv(chunks, per)  # no empty split
        part = cnt = out  # not read unless split (SPLIT = 1 is specialised away)
        if nsplit > 1:  # fp32 partials [nsplit, sum_m, N] and one counter per (slot, tile)
            part, cnt = splitk_scratch(out.device, slots * tiles, nsplit * m * n)
        kernel[(slots * tiles * nsplit,)](
            w_desc, w_scale, x, xs, gs, ags, gs, out, part, cnt, seg, m, n, k, per, nsplit,
            w_scale.stride(-2), w_scale.stride(0), x.stride(-2), x.stride(0) if masked else 0,
            xs.stride(-2) if a_quant else 0, xs.stride(0) if a_quant and masked else 0,
            out.stride(-2), out.stride(0) if masked else 0,
            FMT=fmt, MP=cfg.block_m, STAGES=cfg.num_stages, GROUPING=grouping, GS_PER_E=gs_per_e,
            A_QUANT=a_quant, HAS_AGS=x_gs is not None, HAS_BIAS=False, num_warps=4, NUM_E=e if slots < e else 0,
            SAHEAD=SCALES_AHEAD)
        return
    m = x.shape[0]
    per = triton.cdiv(chunks, cfg.split_k)
    nsplit = triton.cdiv(chunks, per)  # no empty split
    part = cnt = out  # not read unless split
    if nsplit > 1:  # flat fp32 partials [nsplit, tiles, 64, MP] (reused per stream) and zeroed counters
        part, cnt = splitk_scratch(out.device, tiles, nsplit * tiles * 64 * cfg.block_m)
    kernel[(tiles * nsplit,)](
        w_desc, w_scale, x, xs, gs, ags, bias if bias is not None else gs, out, part, cnt, cnt, m, n, k, per,
        nsplit, w_scale.stride(0), 0, x.stride(0), 0, xs.stride(0) if a_quant else 0, 0, out.stride(0), 0,
        FMT=fmt, MP=cfg.block_m, STAGES=cfg.num_stages, GROUPING=0, GS_PER_E=False, A_QUANT=a_quant,
        HAS_AGS=x_gs is not None, HAS_BIAS=bias is not None, num_warps=4, SAHEAD=SCALES_AHEAD)

