"""Public ``linear``: quantize activations as the weight's format wants, then the GEMM."""

from __future__ import annotations

import torch

from .._checks import check_row_contiguous, check_tensor
from ..reference.gemm import activation_quant_args
from ..tensor import ScaledTensor
from .gemm import OUT_DTYPES, _check_bias, gemm_impl

__all__ = ["linear", "activation_quant_args"]


def linear_impl(x2: torch.Tensor, w: ScaledTensor, bias, out_dtype, weight_only: bool,
                out: torch.Tensor | None = None) -> torch.Tensor:
    from .quantize import quantize

    m, n = x2.shape[0], w.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=x2.device)
    if m == 0 or n == 0:
        return out
    fmt = w.format
    if weight_only:
        gemm_impl(x2, None, None, w, out, bias, fmt, True, None, out_dtype)
    else:
        q = quantize(x2, fmt.name, **activation_quant_args(w))
        gemm_impl(q.data, q.scale, q.global_scale, w, out, bias, fmt, False, None, out_dtype, q)
    return out


def linear(x: torch.Tensor, w: ScaledTensor, bias: torch.Tensor | None = None, *,
           out_dtype: torch.dtype | None = None, out: torch.Tensor | None = None,
           weight_only: bool = False) -> torch.Tensor:
    """``y = x @ dequantize(w).T + bias`` with x quantized on the fly as ``w``'s format wants.

    Args:
        x: bf16/fp16 ``[..., K]`` activations (K stride 1; leading dims flatten as a view).
        w: ``ScaledTensor [N, K]`` weight (fp8_block 128x128 or 1x128; mxfp8/mxfp4 1x32;
            nvfp4 1x16 with its global scale).
        bias: optional ``[N]`` (bf16/fp16/fp32), added in fp32 before the output cast.
        out_dtype: output dtype (default ``x.dtype``); bf16, fp16 or fp32.
        out: optional contiguous ``[..., N]`` output of ``out_dtype``.
        weight_only: skip activation quantization (W8A16 / W4A16): bf16/fp16 ``x`` times the
            dequantized weight, fp32 accumulation.

    Quantization: fp8_block 1x128 and mxfp8/mxfp4 1x32 with ``w``'s scale rounding; nvfp4
    1x16 with the activations' own global scale ``448*6/amax(x)`` (computed on the device).
    Returns ``[..., N]`` of ``out_dtype``. No host synchronisation.
    """
    check_tensor("x", x, dtypes=(torch.bfloat16, torch.float16), min_ndim=1)
    if not isinstance(w, ScaledTensor):
        raise TypeError(f"w: expected a ScaledTensor [N, K], got {type(w).__name__}")
    if w.ndim != 2:
        raise ValueError(f"w: expected a 2-D ScaledTensor [N, K], got shape {tuple(w.shape)}")
    if x.device != w.device:
        raise ValueError(f"x: on {x.device}, w on {w.device}; both must be on one device")
    if x.shape[-1] != w.shape[-1]:
        raise ValueError(f"x: K mismatch: x has K={x.shape[-1]} (shape {tuple(x.shape)}), w has "
                         f"K={w.shape[-1]} (shape {tuple(w.shape)})")
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype: expected one of {[str(d) for d in OUT_DTYPES]}, got {out_dtype}")
    check_row_contiguous("x", x)
    n = w.shape[0]
    _check_bias(bias, n, w.device)
    lead = tuple(x.shape[:-1])
    x2 = x.reshape(-1, x.shape[-1])  # a view: check_row_contiguous guaranteed it
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out: expected a torch.Tensor, got {type(out).__name__}")
        if tuple(out.shape) != (*lead, n) or out.dtype != out_dtype or out.device != w.device:
            raise ValueError(f"out: expected a {out_dtype} tensor of shape {(*lead, n)} on {w.device}, got "
                             f"{out.dtype} {tuple(out.shape)} on {out.device}")
        if not out.is_contiguous():
            raise ValueError(f"out: expected a contiguous tensor, got strides {out.stride()}")
    if x2.shape[0] == 0 or n == 0:
        return out if out is not None else torch.empty((*lead, n), dtype=out_dtype, device=w.device)
    from ._custom_ops import linear_op, linear_out_op

    if out is not None:
        linear_out_op(x2, w, bias, weight_only, out.view(-1, n))
        return out
    return linear_op(x2, w, bias, out_dtype, weight_only).view(*lead, n)
