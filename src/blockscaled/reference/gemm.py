"""Pure-torch float64 reference of the GEMM ops (the definition kernels are tested against)."""

from __future__ import annotations

import torch

from ..tensor import ScaledTensor
from .quantize import dequantize

__all__ = ["gemm", "linear", "activation_quant_args"]


def activation_quant_args(w: ScaledTensor) -> dict:
    """How ``linear`` quantizes activations for weight ``w``: 1 x block_k blocks with ``w``'s
    scale rounding (so UE8M0 / power-of-two fp8_block weights get power-of-two activation
    scales, FLOOR MX weights FLOOR activations); nvfp4 has one rounding and the activations
    get their own per-tensor global scale (quantize computes it when none is given)."""
    return {"block": (1, w.format.block_k), "rounding": w.rounding}


def _operand64(x) -> torch.Tensor:
    if isinstance(x, ScaledTensor):
        return dequantize(x, dtype=torch.float32).double()
    if isinstance(x, torch.Tensor):
        return x.double()
    raise TypeError(f"expected a ScaledTensor or a Tensor, got {type(x).__name__}")


def gemm(a, b: ScaledTensor, out_dtype: torch.dtype | None = torch.float64, out=None, *, config=None,
         bias: torch.Tensor | None = None) -> torch.Tensor:
    """float64 ``dequantize(a) @ dequantize(b).T`` (+ bias), cast to ``out_dtype``.

    ``a``: ScaledTensor ``[..., K]`` or dense Tensor ``[..., K]`` (weight-only); ``b``:
    ScaledTensor ``[N, K]``. Dequantization is the fp32 reference (exact for every format
    except nvfp4's division by the global scale, one fp32 rounding). ``out_dtype=None`` or
    float64 keeps float64 (what tests compare against). ``config`` is ignored.
    """
    A = _operand64(a)
    B = _operand64(b)
    y = A @ B.transpose(-1, -2)
    if bias is not None:
        y = y + bias.double()
    if out_dtype is not None:
        y = y.to(out_dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y


def linear(x: torch.Tensor, w: ScaledTensor, bias=None, *, out_dtype=None, weight_only: bool = False,
           quantize_fn=None) -> torch.Tensor:
    """float64 reference of :func:`blockscaled.ops.linear.linear`: quantize ``x`` with the
    reference quantizer as ``w``'s format wants (unless ``weight_only``), then :func:`gemm`."""
    from .quantize import quantize

    if weight_only:
        a = x
    else:
        kw = activation_quant_args(w)
        a = (quantize_fn or quantize)(x, w.format.name, **kw)
    return gemm(a, w, out_dtype=out_dtype, bias=bias)
