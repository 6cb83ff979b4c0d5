"""The grouped GEMM on the sm_90 MX / NV kernels (register-streaming, streaming, tiled) and the
split SwiGLU built on them, the stacked SwiGLU (one grouped GEMM over a ``[E, 2N, K]`` gate_up
weight, any kernel), plus the elementwise epilogue shared with ``dequant_matmul``
(``ops/grouped.py`` runs these for the plans of ``plan/grouped.py``; no validation here)."""

from __future__ import annotations

import torch

from ..config.gemm import GemmConfig
from ..formats import get_format
from ..kernels.triton._mma import FORMAT_CODES
from ..kernels.triton.grouped import MODE_MASKED, dq_epilogue_kernel
from ._direct import launch_direct
from ._launch import fast
from ._stream import launch_stream
from ._tiled import launch_tiled
from .gemm import _cdiv, _tiled_activations, stream_activations
from .quantize import _pow2  # (host arithmetic, not triton's constexpr functions: ~2-5 us a call)

__all__ = ["MX_STRATEGIES", "SPLIT_SWIGLU_CHUNK_BYTES", "mx_grouped", "split_swiglu", "stacked_swiglu", "epilogue"]

#: format name by the kernels' code (ops/grouped.py uses it too)
_FMT_BY_CODE = {v: k for k, v in FORMAT_CODES.items()}
#: the strategies of the sm_90 MX / NV grouped kernels (register-streaming, streaming, tiled)
MX_STRATEGIES = ("direct", "stream", "tiled")


def mx_grouped(a_data, a_scale, a_gs, weights, seg, fmt_id: int, grouping: int, k: int, cfg: GemmConfig) -> None:
    """The grouped GEMM of the activations with each ``(data, scale, global scale, out)`` of
    ``weights`` (one, or SwiGLU's gate and up) on ``cfg``'s sm_90 kernel; the activations' pre-pass
    (quantized ones dequantized to bf16, where the kernel does not decode them itself) runs once."""
    fmt = _FMT_BY_CODE[fmt_id]
    if cfg.strategy == "tiled":
        x, x_gs = _tiled_activations(a_data, a_scale, a_gs, get_format(fmt), k, cfg)
        for d, s, gs, o in weights:
            launch_tiled(x, d, s, gs, fmt, k, o, cfg, x_gs=x_gs, seg=seg, grouping=grouping)
        return
    x, x_scale, x_gs = stream_activations(a_data, a_scale, a_gs, get_format(fmt), k, cfg)
    for d, s, gs, o in weights:
        if cfg.strategy == "direct":
            launch_direct(x, d, s, gs, fmt, k, o, cfg, x_gs=x_gs, seg=seg, grouping=grouping)
        else:
            launch_stream(x, d, s, gs, fmt, k, o, cfg, seg=seg, grouping=grouping, x_scale=x_scale, x_gs=x_gs)


#: fp32 products a split SwiGLU holds at once (gate and up: 2 x rows x N x 4 bytes); a larger call
#: runs in row chunks (contiguous) or expert chunks (masked) of at most this, so that a long
#: prefill does not hold gigabytes of products (Mixtral 8x7B experts at 4096 tokens: 0.94 GB, one
#: chunk; at 32k tokens 7.5 GB unchunked)
SPLIT_SWIGLU_CHUNK_BYTES = 1 << 30


def _chunks(a_data, seg, grouping: int, e: int, row_bytes: int):
    """(rows or experts slice, contiguous row offset or None, the chunk's segment tensor) per chunk of
    at most ``SPLIT_SWIGLU_CHUNK_BYTES`` of fp32 products (``row_bytes`` per row). Contiguous chunks
    take rows ``[r0, r0 + rc)`` with the offsets rebased on the device (``clamp(offsets - r0, 0, rc)``:
    no sync, CUDA-graph safe); masked chunks take experts."""
    if grouping == MODE_MASKED:
        step = max(1, SPLIT_SWIGLU_CHUNK_BYTES // max(1, row_bytes * a_data.shape[1]))
        return [(slice(e0, min(e, e0 + step)), None, seg[e0:min(e, e0 + step)]) for e0 in range(0, e, step)]
    rows = a_data.shape[0]
    step = max(1, SPLIT_SWIGLU_CHUNK_BYTES // max(1, row_bytes))
    if rows <= step:
        return [(slice(0, rows), 0, seg)]
    return [(slice(r0, min(rows, r0 + step)), r0, (seg - r0).clamp_(0, min(rows, r0 + step) - r0))
            for r0 in range(0, rows, step)]


def _experts(w, sl: slice):
    """Experts ``sl`` of a weight's (data, scale, global scale): a one-element global scale is every
    expert's (the kernels' ``GS_PER_E`` rule), a per-expert one is sliced."""
    d, sc, g = w
    return d[sl], sc[sl], (g if g is None or g.numel() == 1 else g[sl])


def split_swiglu(a_data, a_scale, a_gs, gate, up, seg, out, fmt_id: int, grouping: int, k: int,
                 cfg: GemmConfig) -> None:
    """``out = silu(a @ gate.T) * (a @ up.T)`` as two grouped GEMMs into fp32 products on ``cfg``'s
    kernel and ``epilogue`` (one rounding), in chunks of at most ``SPLIT_SWIGLU_CHUNK_BYTES`` of
    products (``_chunks``). ``gate`` / ``up``: (data, scale, global scale) of the ``[E, N, K']`` weights."""
    n, e = gate[0].shape[-2], gate[0].shape[0]
    for sl, r0, seg_c in _chunks(a_data, seg, grouping, e, 8 * n):
        s_c = None if a_scale is None else a_scale[sl]
        if r0 is None:  # masked: experts sl of everything (one global scale is every chunk's)
            w = [_experts(wt, sl) for wt in (gate, up)]
        else:
            w = [gate, up]
        a_c, out_c = a_data[sl], out[sl]
        prods = torch.empty((2, *out_c.shape), dtype=torch.float32, device=out.device)
        mx_grouped(a_c, s_c, a_gs, ((*w[0], prods[0]), (*w[1], prods[1])), seg_c, fmt_id, grouping, k, cfg)
        # (contiguous: no per-expert factor, so the epilogue needs no segment ends)
        epilogue(prods[0], prods[1], out_c, seg_c if grouping == MODE_MASKED else None, None, None, grouping,
                 w[0][0].shape[0])


def stacked_swiglu(gemm, a_data, a_scale, b_data, b_scale, b_gs, seg, out, grouping: int) -> None:
    """``out [.., N] = silu(g) * u`` with ``[g | u] = a @ b.T`` for a stacked ``[E, 2N, K']`` gate_up
    weight ``b`` (plan/grouped.py ``stacked_swiglu_plan``): per chunk of at most
    ``SPLIT_SWIGLU_CHUNK_BYTES`` of fp32 products (``_chunks``), ``gemm(a, a_scale, b_data, b_scale,
    b_gs, seg, products)`` (the planned grouped GEMM into fp32 ``[.., 2N]``), then ``epilogue`` over
    the products' two halves (one rounding)."""
    n, e = out.shape[-1], b_data.shape[0]
    for sl, r0, seg_c in _chunks(a_data, seg, grouping, e, 8 * n):
        w = (b_data, b_scale, b_gs) if r0 is not None else _experts((b_data, b_scale, b_gs), sl)
        a_c, out_c = a_data[sl], out[sl]
        prods = torch.empty((*out_c.shape[:-1], 2 * n), dtype=torch.float32, device=out.device)
        gemm(a_c, None if a_scale is None else a_scale[sl], *w, seg_c, prods)
        epilogue(prods[..., :n], prods[..., n:], out_c, seg_c if grouping == MODE_MASKED else None, None, None,
                 grouping, w[0].shape[0])


def epilogue(Y, Y2, res, seg_k, post, post2, mode: int, e: int) -> None:
    """``res = Y * post`` or (``Y2`` given) ``silu(Y * post) * (Y2 * post2)`` in fp32, cast once
    (``dq_epilogue_kernel``; ``post`` None: no factor). ``Y`` / ``Y2``: products with ``res``'s
    rows (masked: ``[E, max_m, N]``, rows past the counts ``seg_k`` neither read nor written;
    contiguous: ``seg_k`` the segment ends, read only for a per-expert ``post``)."""
    n = res.shape[-1]
    if mode == MODE_MASKED:
        grid_m, ge = res.shape[1], e
        sxe, sxm, soe, som = Y.stride(0), Y.stride(1), res.stride(0), res.stride(1)
    else:
        grid_m, ge = res.shape[0], 1
        x2d = Y if Y.ndim == 2 else Y[0]
        sxe, sxm, soe, som = 0, x2d.stride(0), 0, res.stride(0)
    if grid_m == 0 or n == 0 or ge == 0:
        return
    bm, bn = 32, 128
    post_t = post if post is not None else res
    fast(dq_epilogue_kernel)[(_cdiv(grid_m, bm), _cdiv(n, bn), ge)](
        Y, Y2 if Y2 is not None else Y, res, seg_k if seg_k is not None else res, post_t,
        post2 if post2 is not None else post_t,
        grid_m, n, ge, e, sxe, sxm, soe, som, (post.stride(0) if post is not None and post.numel() > 1 else 0),
        MODE=mode, SWIGLU=Y2 is not None, HAS_POST=post is not None, E_POW2=max(16, _pow2(e)),
        BLOCK_M=bm, BLOCK_N=bn, num_warps=4,
    )
