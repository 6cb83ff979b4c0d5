"""Autograd of the public ops: one behaviour on every path (CPU reference, Triton interpreter,
GPU kernels and the torch custom ops). The user-facing statement is docs/errors.md, "Autograd".

* ScaledTensor fields (data, scale, global scales) are constants: no gradient reaches them.
* ``quantize(x)`` is straight-through: when ``x`` requires grad (grad mode on) the returned
  ScaledTensor remembers ``x`` as its *source* (``attach_source``). Only the object quantize
  returned carries the link (``dataclasses.replace`` / ``.to()`` copies do not).
* ``dequantize(q)`` passes its output's gradient unchanged to q's source (``link_source``):
  the derivative of ``dequantize(quantize(x))`` with respect to ``x`` is the identity.
* ``gemm(a, b)``: ``dA = dY @ dequantize(b)`` to a dense ``a`` or to a's source,
  ``dB = dY.T @ dequantize(a)`` (or ``a``) to b's source, ``dbias = dY.sum(rows)``.
* ``linear(x, w)``: the same with ``A = quantize(x)`` straight-through: ``dx = dY @
  dequantize(w)``; w's source gets ``dY.T @ dequantize(quantize(x))`` (``x`` if weight-only).
* grouped_gemm / grouped_gemm_list / swiglu raise RuntimeError when an input requires grad.

Backward products are fp32 ``torch.matmul`` of the dequantized operands (exact operands, fp32
accumulation), cast once to each input's dtype: a correct reference gradient, not a fast
training kernel. Calls whose inputs do not require grad (or run under no_grad /
inference_mode) skip all of this: one ``torch.is_grad_enabled()`` plus one attribute check per
operand.
"""

from __future__ import annotations

import dataclasses

import torch

from ..formats import ScaleRounding, get_format
from ..reference.gemm import activation_quant_args
from ..tensor import GRAD_SOURCE_ATTR, ScaledTensor

__all__ = ["attach_source", "link_source", "source_of", "wants_grad", "requires_grad_name", "gemm", "linear"]

#: Attribute of a ScaledTensor holding the float tensor it was quantized from (grad mode only).
_SOURCE = GRAD_SOURCE_ATTR


def source_of(q) -> torch.Tensor | None:
    """The float tensor ``q`` was quantized from, when that one requires grad; else None."""
    return getattr(q, _SOURCE, None)


def attach_source(q: ScaledTensor, x: torch.Tensor) -> ScaledTensor:
    """Record ``x`` as the straight-through source of ``q`` (``quantize``'s result) when ``x``
    requires grad and grad mode is on. Returns ``q``. ScaledTensor is a frozen dataclass
    without slots: the link is an instance attribute outside its fields."""
    if x.requires_grad and torch.is_grad_enabled():
        object.__setattr__(q, _SOURCE, x)
    return q


class _StraightThrough(torch.autograd.Function):
    """``value`` forward, the gradient unchanged (cast to the source's dtype) backward."""

    @staticmethod
    def forward(ctx, src: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        ctx.src_dtype, ctx.src_device = src.dtype, src.device
        return value

    @staticmethod
    def backward(ctx, g):
        # the quantized copy may live on another device than its source (ScaledTensor.to)
        return g.to(device=ctx.src_device, dtype=ctx.src_dtype), None


def link_source(q: ScaledTensor, value: torch.Tensor) -> torch.Tensor:
    """``dequantize``'s result ``value`` of ``q``, differentiable with respect to q's source
    (identity gradient) when it has one that requires grad; else ``value`` itself."""
    src = getattr(q, _SOURCE, None)
    if src is None or not torch.is_grad_enabled() or not src.requires_grad:
        return value
    return _StraightThrough.apply(src, value)


def _grad_tensor(obj) -> torch.Tensor | None:
    """The float tensor that would receive ``obj``'s gradient: a Tensor that requires grad,
    or a ScaledTensor's source that does."""
    if isinstance(obj, torch.Tensor):
        return obj if obj.requires_grad else None
    src = getattr(obj, _SOURCE, None)
    return src if src is not None and src.requires_grad else None


def wants_grad(*operands) -> bool:
    """Grad mode is on and some operand (Tensor, ScaledTensor with a source, or None) needs a
    gradient. The cheap test every differentiable public op runs first."""
    if not torch.is_grad_enabled():
        return False
    return any(_grad_tensor(o) is not None for o in operands if o is not None)


def requires_grad_name(**operands) -> str | None:
    """Name (for error messages) of the first operand that would need a gradient, or None."""
    for name, obj in operands.items():
        if isinstance(obj, torch.Tensor):
            if obj.requires_grad:
                return f"{name} (a {obj.dtype} tensor)"
        elif obj is not None and _grad_tensor(obj) is not None:
            return f"{name} (through the float tensor it was quantized from)"
    return None


def _const(obj):
    """``obj`` without any autograd link: a detached Tensor, or a ScaledTensor copy without
    its source (and with detached fields)."""
    if obj is None:
        return None
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    gs = obj.global_scale
    return dataclasses.replace(obj, data=obj.data.detach(), scale=obj.scale.detach(),
                               global_scale=None if gs is None else gs.detach())


def _dense_f32(obj) -> torch.Tensor:
    """fp32 value of an operand constant: dequantized ScaledTensor, or the Tensor itself."""
    if isinstance(obj, ScaledTensor):
        # Local: import cycle ops._autograd -> ops.quantize -> ops._autograd.
        from .quantize import dequantize

        return dequantize(obj, torch.float32)
    return obj.float()


def _no_out(op: str, out) -> None:
    if out is not None:
        raise RuntimeError(
            f"{op}: out= cannot be used while an input requires grad (autograd cannot record a write into "
            f"out); call it without out=, or under torch.no_grad()"
        )


def _product_grads(gy: torch.Tensor, a_val, b_val, need_a: bool, need_b: bool, need_bias: bool):
    """(dA [M, K], dB [N, K], dbias [N]) in fp32 for ``y = A @ B.T + bias``; ``a_val`` /
    ``b_val`` operand constants (ScaledTensor or Tensor, A flattened to rows), or a callable
    giving the fp32 value (so it is only computed when needed)."""
    g = gy.reshape(-1, gy.shape[-1]).float()
    ga = gb = gbias = None
    if need_a:
        ga = g @ (b_val() if callable(b_val) else _dense_f32(b_val))
    if need_b:
        av = a_val() if callable(a_val) else _dense_f32(a_val)
        gb = g.t() @ av.reshape(-1, av.shape[-1])
    if need_bias:
        gbias = g.sum(0)
    return ga, gb, gbias


class _Gemm(torch.autograd.Function):
    """``gemm(a, b) (+ bias)`` with the straight-through backward of the module docstring.
    ``a_t`` / ``b_t``: the tensors receiving dA / dB (dense a or a's source, b's source;
    None when not needed); ``a``, ``b``: the operands as constants."""

    @staticmethod
    def forward(ctx, a_t, b_t, bias, a, b, out_dtype, config):
        # Local: import cycle ops._autograd -> ops.gemm -> ops._autograd.
        from .gemm import gemm

        y = gemm(a, b, out_dtype, config=config, bias=None if bias is None else bias.detach())
        ctx.a, ctx.b = a, b
        ctx.dtypes = (None if a_t is None else a_t.dtype, None if b_t is None else b_t.dtype,
                      None if bias is None else bias.dtype)
        ctx.a_shape = tuple(a.shape)
        return y

    @staticmethod
    def backward(ctx, gy):
        need_a, need_b, need_bias = ctx.needs_input_grad[:3]
        ga, gb, gbias = _product_grads(gy, ctx.a, ctx.b, need_a, need_b, need_bias)
        da, db, dbias = ctx.dtypes
        return (None if ga is None else ga.reshape(ctx.a_shape).to(da), None if gb is None else gb.to(db),
                None if gbias is None else gbias.to(dbias), None, None, None, None)


def gemm(a, b: ScaledTensor, out_dtype, out, config, bias) -> torch.Tensor:
    """``blockscaled.gemm`` when an input requires grad (validated arguments)."""
    _no_out("gemm", out)
    return _Gemm.apply(_grad_tensor(a), _grad_tensor(b), bias, _const(a), _const(b), out_dtype, config)


class _Linear(torch.autograd.Function):
    """``linear(x, w, bias)``: x straight-through its activation quantization; ``w_t``: w's
    source (or None); ``w``: the weight as a constant."""

    @staticmethod
    def forward(ctx, x, w_t, bias, w, out_dtype, weight_only):
        # Local: import cycle ops._autograd -> ops.linear -> ops._autograd.
        from .linear import linear

        y = linear(x.detach(), w, None if bias is None else bias.detach(), out_dtype=out_dtype,
                   weight_only=weight_only)
        ctx.x, ctx.w, ctx.weight_only = x.detach(), w, weight_only
        ctx.dtypes = (x.dtype, None if w_t is None else w_t.dtype, None if bias is None else bias.dtype)
        return y

    @staticmethod
    def backward(ctx, gy):
        need_x, need_w, need_bias = ctx.needs_input_grad[:3]
        x, w = ctx.x, ctx.w

        def a_val():  # the activations the forward multiplied: quantize(x) (or x), in fp32
            if ctx.weight_only:
                return x.float()
            # Local: import cycle ops._autograd -> ops.quantize -> ops._autograd.
            from .quantize import dequantize, quantize

            return dequantize(quantize(x, w.format, **activation_quant_args(w)), torch.float32)

        ga, gb, gbias = _product_grads(gy, a_val, w, need_x, need_w, need_bias)
        dx, dw, dbias = ctx.dtypes
        return (None if ga is None else ga.reshape(x.shape).to(dx), None if gb is None else gb.to(dw),
                None if gbias is None else gbias.to(dbias), None, None, None)


def linear(x: torch.Tensor, w: ScaledTensor, bias, out_dtype, out, weight_only: bool) -> torch.Tensor:
    """``blockscaled.linear`` when an input requires grad (validated arguments)."""
    _no_out("linear", out)
    return _Linear.apply(x, _grad_tensor(w), bias, _const(w), out_dtype, weight_only)


# --------------------------------------------------------------------------- custom ops
# The same formulas for the functional custom ops (``blockscaled::gemm`` / ``blockscaled::linear``,
# registered in ops/_custom_ops.py), for code that calls them directly: their float inputs are
# the dense A / x and the bias; the weight's fields are constants. The ``_out`` variants mutate
# their output and cannot carry autograd (torch refuses formulas for non-functional ops).
def _weight_from_fields(b_data, b_scale, b_gs, fmt: str, k: int, block_rows: int, rounding: str) -> ScaledTensor:
    f = get_format(fmt)
    block = (block_rows, f.block_k) if block_rows == 1 else (block_rows, block_rows)
    return ScaledTensor(b_data, b_scale, f, torch.Size((*b_data.shape[:-1], k)), block, ScaleRounding(rounding),
                        global_scale=b_gs)


def _gemm_op_setup(ctx, inputs, output) -> None:
    a, a_scale, _, b_data, b_scale, b_gs, fmt, k, b_block_rows, rounding, bias, _ = inputs
    fmt = fmt.rpartition("/")[2]  # a mixed pair "<a format>/<b format>" (ops/_custom_ops.py split_pair)
    ctx.w = _weight_from_fields(b_data, b_scale, b_gs, fmt, k, b_block_rows, rounding)
    ctx.dtypes = (a.dtype, None if bias is None else bias.dtype)
    ctx.a_dense = a_scale is None


def _gemm_op_backward(ctx, gy):
    need_a = ctx.needs_input_grad[0] and ctx.a_dense
    ga, _, gbias = _product_grads(gy, None, ctx.w, need_a, False, ctx.needs_input_grad[10])
    return (None if ga is None else ga.to(ctx.dtypes[0]), None, None, None, None, None, None, None, None, None,
            None if gbias is None else gbias.to(ctx.dtypes[1]), None)


def _linear_op_setup(ctx, inputs, output) -> None:
    x, w_data, w_scale, w_gs, fmt, k, w_block_rows, rounding, bias, _, _ = inputs
    ctx.w = _weight_from_fields(w_data, w_scale, w_gs, fmt, k, w_block_rows, rounding)
    ctx.dtypes = (x.dtype, None if bias is None else bias.dtype)


def _linear_op_backward(ctx, gy):
    ga, _, gbias = _product_grads(gy, None, ctx.w, ctx.needs_input_grad[0], False, ctx.needs_input_grad[8])
    return (None if ga is None else ga.to(ctx.dtypes[0]), None, None, None, None, None, None, None,
            None if gbias is None else gbias.to(ctx.dtypes[1]), None, None)


def register_custom_op_autograd() -> None:
    """Called once by ops/_custom_ops.py after it defines the ops."""
    torch.library.register_autograd("blockscaled::gemm", _gemm_op_backward, setup_context=_gemm_op_setup)
    torch.library.register_autograd("blockscaled::linear", _linear_op_backward, setup_context=_linear_op_setup)
