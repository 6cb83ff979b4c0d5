"""Public ``linear``: quantize activations as the weight's format wants, then the GEMM."""

from __future__ import annotations

import torch

from .. import _checks
from .._checks import check_row_contiguous, check_tensor
from ..formats import Format, ScaleRounding
from ..reference.gemm import activation_quant_args
from ..reference.gemm import linear as _ref_linear
from ..tensor import ScaledTensor
from . import quantize as _quant
from . import _autograd
from ._explain import emit, explaining
from .gemm import OUT_DTYPES, _check_bias, _eager_ok, gemm_impl, gemm_problem, make_plan

__all__ = ["linear", "activation_quant_args"]


def _quantize_activations(x2: torch.Tensor, fmt: Format, rounding: ScaleRounding):
    """The one call into ops/quantize.py's internal quantize (no validation, no custom-op
    dispatch): 1 x block_k blocks with the weight's rounding; nvfp4 computes the activations'
    global scale on the device. Returns (data, scale, gs or None)."""
    return _quant.quantize_1xk(x2, fmt, rounding, None)


def linear_impl(x2: torch.Tensor, w_data, w_scale, w_gs, w_rows: int, fmt: Format, k: int,
                rounding: ScaleRounding, bias, out_dtype, weight_only: bool,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """``out [M, N] = x2 [M, K] @ w.T`` from the weight's fields (no validation)."""
    m, n = x2.shape[0], w_data.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=x2.device)
    if m == 0 or n == 0:
        return out
    if weight_only:
        gemm_impl(x2, None, None, w_data, w_scale, w_gs, w_rows, fmt, k, out, bias, None, out_dtype)
    else:
        data, scale, gs = _quantize_activations(x2, fmt, rounding)
        gemm_impl(data, scale, gs, w_data, w_scale, w_gs, w_rows, fmt, k, out, bias, None, out_dtype)
    return out


def _linear_plan(x2: torch.Tensor, w: ScaledTensor, bias, out_dtype, weight_only: bool):
    """The GEMM plan ``linear`` runs: the same Problem as the quantized activations give (a fresh
    row-contiguous ``[M, K]`` tensor of the format's data dtype, allocated here without a kernel)."""
    fmt, k = w.format, w.shape[-1]
    m, n = x2.shape[0], w.shape[0]
    if weight_only:
        a2, a_s2 = x2, None
    else:
        a2 = torch.empty((m, fmt.packed_k(k)), dtype=fmt.data_dtype, device=x2.device)
        a_s2 = torch.empty((m, fmt.scale_k(k)), dtype=fmt.scale_dtype, device=x2.device)
    return make_plan(gemm_problem(a2, a_s2, w.data, w.block[0], fmt, k, m, n, out_dtype, bias), w.device)


def linear(x: torch.Tensor, w: ScaledTensor, bias: torch.Tensor | None = None, *,
           out_dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None,
           weight_only: bool = False) -> torch.Tensor:
    """``y = x @ dequantize(w).T + bias`` with x quantized on the fly as ``w``'s format wants.

    Args:
        x: bf16/fp16 ``[..., K]`` activations (K stride 1; leading dims flatten as a view).
        w: ``ScaledTensor [N, K]`` weight (fp8_block 128x128 or 1x128; mxfp8/mxfp4 1x32;
            nvfp4 1x16 with its global scale).
        bias: optional ``[N]`` (bf16/fp16/fp32), added in fp32 before the output cast.
        out_dtype: output dtype: bf16 (default, as every op, also for fp16 ``x``), fp16 or fp32.
        out: optional contiguous ``[..., N]`` output of ``out_dtype``.
        weight_only: skip activation quantization (W8A16 / W4A16): bf16/fp16 ``x`` times the
            dequantized weight, fp32 accumulation.

    Quantization: fp8_block 1x128 and mxfp8/mxfp4 1x32 with ``w``'s scale rounding; nvfp4
    1x16 with the activations' own global scale ``448*6/amax(x)`` (computed on the device).
    Returns ``[..., N]`` of ``out_dtype``. No host synchronisation. CPU tensors without the
    Triton interpreter (``blockscaled._checks.use_reference``): the float64 reference twin,
    rounded once to ``out_dtype``.

    Autograd (same on every path; docs/errors.md): ``dx = dY @ dequantize(w)`` (straight
    through the activation quantization), ``dbias = dY.sum(rows)``, and when ``w`` was
    quantized from a float tensor that requires grad, ``dY.T @ dequantize(quantize(x))`` to
    it (``x`` when weight-only); fp32 torch.matmul. ``out=`` with an input that requires grad
    raises RuntimeError.

    Example::

        w = bs.quantize(weight, "fp8_block", block=(128, 128))   # [N, K]
        y = bs.linear(x, w)                                      # x [..., K] bf16 -> [..., N] bf16
    """
    check_tensor("x", x, dtypes=(torch.bfloat16, torch.float16), min_ndim=1)
    _checks.check_flag("weight_only", weight_only)  # a truthy string used to pass silently
    if not isinstance(w, ScaledTensor):
        raise TypeError(f"w: expected a ScaledTensor [N, K], got {type(w).__name__}")
    if w.ndim != 2:
        raise ValueError(f"w: expected a 2-D ScaledTensor [N, K], got shape {tuple(w.shape)}")
    if x.device != w.device:
        raise ValueError(f"x: on {x.device}, w on {w.device}; both must be on one device")
    if x.shape[-1] != w.shape[-1]:
        raise ValueError(f"x: K mismatch: x has K={x.shape[-1]} (shape {tuple(x.shape)}), w has "
                         f"K={w.shape[-1]} (shape {tuple(w.shape)})")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype: expected one of {[str(d) for d in OUT_DTYPES]}, got {out_dtype}")
    check_row_contiguous("x", x)
    n = w.shape[0]
    _check_bias(bias, n, w.device)
    lead = tuple(x.shape[:-1])
    # a view (check_row_contiguous guaranteed it); none for 2-D x (a view op is ~1-3 us of host time)
    x2 = x if x.ndim == 2 else x.reshape(-1, x.shape[-1])
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out: expected a torch.Tensor, got {type(out).__name__}")
        _checks.check_out_no_grad(out)
        if tuple(out.shape) != (*lead, n) or out.dtype != out_dtype or out.device != w.device:
            raise ValueError(f"out: expected a {out_dtype} tensor of shape {(*lead, n)} on {w.device}, got "
                             f"{out.dtype} {tuple(out.shape)} on {out.device}")
        if not out.is_contiguous():
            raise ValueError(f"out: expected a contiguous tensor, got strides {out.stride()}")
    if explaining():
        emit(_linear_plan(x2, w, bias, out_dtype, weight_only))
    if _autograd.wants_grad(x, w, bias):
        return _autograd.linear(x, w, bias, out_dtype, out, weight_only)
    if _checks.use_reference(x):
        # CPU tensors without the Triton interpreter: the float64 reference (reference
        # quantizer for the activations), rounded once to out_dtype, as the kernels' epilogue
        # rounds (docs/design.md, "How `bs.gemm(a, b)` reaches a kernel", step 2).
        with torch.no_grad():
            y = _ref_linear(x, w, bias, out_dtype=None, weight_only=weight_only)
        if out is None:
            return y.to(out_dtype)
        out.copy_(y)
        return out
    if x2.shape[0] == 0 or n == 0:
        return out if out is not None else torch.empty((*lead, n), dtype=out_dtype, device=w.device)
    if _eager_ok(x2, w.data):
        if out is None:
            out2 = torch.empty((x2.shape[0], n), dtype=out_dtype, device=w.device)
            out = out2 if len(lead) == 1 else out2.view(*lead, n)
        else:
            out2 = out if out.ndim == 2 else out.view(-1, n)
        linear_impl(x2, w.data, w.scale, w.global_scale, w.block[0], w.format, w.shape[-1], w.rounding, bias,
                    out_dtype, weight_only, out2)
        return out
    # Local: import cycle ops.linear -> ops._custom_ops -> ops.linear.
    from ._custom_ops import linear_op, linear_out_op

    if out is not None:
        linear_out_op(x2, w, bias, weight_only, out.view(-1, n))
        return out
    return linear_op(x2, w, bias, out_dtype, weight_only).view(*lead, n)
