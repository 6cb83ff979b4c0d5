"""torch custom ops for the GEMM family, so torch.compile(fullgraph=True) traces one opaque
op per call and CUDA graphs capture it (the implementations never synchronise the host).

ScaledTensor is not a Tensor, so each op takes its fields: data, scale, global scale (or
None), format name (``gemm``: ``"<a format>/<b format>"`` for a mixed pair, ``split_pair``),
logical K, block rows (1 or 128) and rounding name (used by ``linear`` for the activation
quantization; ignored by ``gemm``). The implementations take the fields
directly (no ScaledTensor is rebuilt per call). The public functions in ``gemm.py`` /
``linear.py`` call these ops under torch.compile / export; plain eager calls run the same
implementations directly (``gemm._eager_ok``), skipping the ~100 us dispatcher round trip.

Ops (namespace ``blockscaled``):
  gemm(a, a_scale?, a_gs?, b_data, b_scale, b_gs?, fmt, k, b_block_rows, rounding, bias?,
       out_dtype) -> Tensor[M, N]
  gemm_out(..., out!) -> ()                        same, writes into ``out`` [M, N]
  linear(x, w_data, w_scale, w_gs?, fmt, k, w_block_rows, rounding, bias?, out_dtype,
         weight_only) -> Tensor[M, N]               x: [M, K] bf16/fp16
  linear_out(x, ..., bias?, weight_only, out!) -> ()  same, writes into ``out`` [M, N]

Autograd (``ops/_autograd.py``, registered below): ``gemm`` differentiates with respect to a
dense ``a`` (weight-only) and ``bias``, ``linear`` with respect to ``x`` (straight through
its quantization) and ``bias``: ``dA = dY @ dequantize(B)``, ``dbias = dY.sum(0)``. The
weight's fields are constants. The ``_out`` ops mutate ``out`` and have no autograd (torch
allows formulas for functional ops only; the public functions refuse ``out=`` with grad).
"""

from __future__ import annotations

import torch

from ..formats import ScaleRounding, get_format
from ..plan.mx_packed import MIXED_PAIRS
from ..tensor import ScaledTensor
from ._autograd import register_custom_op_autograd
from .gemm import gemm_impl
from .linear import linear_impl

__all__ = ["gemm_op", "gemm_out_op", "linear_op", "linear_out_op"]


@torch.library.custom_op("blockscaled::gemm_out", mutates_args=("out",))
def _gemm_out(
    a: torch.Tensor, a_scale: torch.Tensor | None, a_gs: torch.Tensor | None,
    b_data: torch.Tensor, b_scale: torch.Tensor, b_gs: torch.Tensor | None,
    fmt: str, k: int, b_block_rows: int, rounding: str, bias: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    a_fmt, b_fmt = split_pair(fmt)
    gemm_impl(a, a_scale, a_gs, b_data, b_scale, b_gs, b_block_rows, get_format(b_fmt), k, out, bias, None,
              out.dtype, a_fmt)


@torch.library.custom_op("blockscaled::gemm", mutates_args=())
def _gemm(
    a: torch.Tensor, a_scale: torch.Tensor | None, a_gs: torch.Tensor | None,
    b_data: torch.Tensor, b_scale: torch.Tensor, b_gs: torch.Tensor | None,
    fmt: str, k: int, b_block_rows: int, rounding: str, bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    out = torch.empty((a.shape[0], b_data.shape[0]), dtype=out_dtype, device=b_data.device)
    a_fmt, b_fmt = split_pair(fmt)
    gemm_impl(a, a_scale, a_gs, b_data, b_scale, b_gs, b_block_rows, get_format(b_fmt), k, out, bias, None,
              out_dtype, a_fmt)
    return out


@_gemm.register_fake
def _gemm_fake(a, a_scale, a_gs, b_data, b_scale, b_gs, fmt, k, b_block_rows, rounding, bias, out_dtype):
    return a.new_empty((a.shape[0], b_data.shape[0]), dtype=out_dtype)


@torch.library.custom_op("blockscaled::linear", mutates_args=())
def _linear(
    x: torch.Tensor, w_data: torch.Tensor, w_scale: torch.Tensor, w_gs: torch.Tensor | None,
    fmt: str, k: int, w_block_rows: int, rounding: str, bias: torch.Tensor | None,
    out_dtype: torch.dtype, weight_only: bool,
) -> torch.Tensor:
    return linear_impl(x, w_data, w_scale, w_gs, w_block_rows, get_format(fmt), k, ScaleRounding(rounding),
                       bias, out_dtype, weight_only)


@torch.library.custom_op("blockscaled::linear_out", mutates_args=("out",))
def _linear_out(
    x: torch.Tensor, w_data: torch.Tensor, w_scale: torch.Tensor, w_gs: torch.Tensor | None,
    fmt: str, k: int, w_block_rows: int, rounding: str, bias: torch.Tensor | None,
    weight_only: bool, out: torch.Tensor,
) -> None:
    linear_impl(x, w_data, w_scale, w_gs, w_block_rows, get_format(fmt), k, ScaleRounding(rounding),
                bias, out.dtype, weight_only, out)


@_linear.register_fake
def _linear_fake(x, w_data, w_scale, w_gs, fmt, k, w_block_rows, rounding, bias, out_dtype, weight_only):
    return x.new_empty((x.shape[0], w_data.shape[0]), dtype=out_dtype)


register_custom_op_autograd()


def split_pair(fmt: str) -> tuple[str, str]:
    """The ops' ``fmt`` string -> (A's format name or "", B's format name): a mixed pair
    (plan/mx_packed.py) travels as ``"<a format>/<b format>"``, one format as its name."""
    a_fmt, sep, b_fmt = fmt.rpartition("/")
    if not sep:
        return "", fmt
    if (a_fmt, b_fmt) not in MIXED_PAIRS:
        raise ValueError(f"fmt: expected one format name or a mixed pair of {MIXED_PAIRS} as 'a/b', got {fmt!r}")
    return a_fmt, b_fmt


def _pair(a_fmt: str, b: ScaledTensor) -> str:
    return f"{a_fmt}/{b.format.name}" if a_fmt else b.format.name


def gemm_op(a2, a_s2, a_gs, b: ScaledTensor, bias, out_dtype, a_fmt: str = "") -> torch.Tensor:
    return torch.ops.blockscaled.gemm(a2, a_s2, a_gs, b.data, b.scale, b.global_scale, _pair(a_fmt, b),
                                      b.shape[-1], b.block[0], b.rounding.value, bias, out_dtype)


def gemm_out_op(a2, a_s2, a_gs, b: ScaledTensor, out2, bias, a_fmt: str = "") -> None:
    torch.ops.blockscaled.gemm_out(a2, a_s2, a_gs, b.data, b.scale, b.global_scale, _pair(a_fmt, b),
                                   b.shape[-1], b.block[0], b.rounding.value, bias, out2)


def linear_out_op(x2, w: ScaledTensor, bias, weight_only: bool, out2) -> None:
    torch.ops.blockscaled.linear_out(x2, w.data, w.scale, w.global_scale, w.format.name, w.shape[-1],
                                     w.block[0], w.rounding.value, bias, weight_only, out2)


def linear_op(x2, w: ScaledTensor, bias, out_dtype, weight_only: bool) -> torch.Tensor:
    return torch.ops.blockscaled.linear(x2, w.data, w.scale, w.global_scale, w.format.name, w.shape[-1],
                                        w.block[0], w.rounding.value, bias, out_dtype, weight_only)
