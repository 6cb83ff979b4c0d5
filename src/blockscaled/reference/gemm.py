"""Pure-torch float64 reference of the GEMM ops (the definition kernels are tested against).

Autograd: these twins are differentiable with the semantics of the public ops (docs/errors.md,
"Autograd"), in float64, so tests can compare gradients against them: a ScaledTensor operand
passes its gradient straight through to the float tensor it was quantized from (when that one
requires grad), its fields are constants, and ``linear`` quantizes ``x`` straight-through.
"""

from __future__ import annotations

import torch

from ..tensor import ScaledTensor
from .quantize import dequantize, quantize

__all__ = ["gemm", "linear", "activation_quant_args"]


def activation_quant_args(w: ScaledTensor) -> dict:
    """How ``linear`` quantizes activations for weight ``w``: 1 x block_k blocks with ``w``'s
    scale rounding (so UE8M0 / power-of-two fp8_block weights get power-of-two activation
    scales, FLOOR MX weights FLOOR activations); nvfp4 has one rounding and the activations
    get their own per-tensor global scale (quantize computes it when none is given)."""
    return {"block": (1, w.format.block_k), "rounding": w.rounding}


def _straight_through(value64: torch.Tensor, src: torch.Tensor | None) -> torch.Tensor:
    """``value64`` whose gradient goes unchanged to ``src`` (when it requires grad)."""
    if src is None or not src.requires_grad or not torch.is_grad_enabled():
        return value64
    s = src.double()
    return value64 + (s - s.detach())


def _operand64(x) -> torch.Tensor:
    if isinstance(x, ScaledTensor):
        # Local: import cycle reference.gemm -> ops._autograd -> reference.gemm.
        from ..ops._autograd import source_of

        with torch.no_grad():  # the fields are constants
            v = dequantize(x, dtype=torch.float32).double()
        return _straight_through(v, source_of(x))
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
    reference quantizer as ``w``'s format wants (unless ``weight_only``), then :func:`gemm`.
    Differentiable: ``x`` straight through its quantization (module docstring)."""
    if weight_only:
        return gemm(x, w, out_dtype=out_dtype, bias=bias)
    kw = activation_quant_args(w)
    a = (quantize_fn or quantize)(x.detach(), w.format.name, **kw)
    y = _straight_through(_operand64(a), x) @ _operand64(w).transpose(-1, -2)
    if bias is not None:
        y = y + bias.double()
    return y if out_dtype is None else y.to(out_dtype)
