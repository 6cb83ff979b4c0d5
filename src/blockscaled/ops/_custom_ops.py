"""torch custom ops for the GEMM family, so torch.compile(fullgraph=True) traces one opaque
op per call and CUDA graphs capture it (the implementations never synchronise the host).

ScaledTensor is not a Tensor, so each op takes its fields: data, scale, global scale (or
None), format name, logical K, block rows (1 or 128) and rounding name. The public functions
in ``gemm.py`` / ``linear.py`` unpack and call these.

Ops (namespace ``blockscaled``):
  gemm(a, a_scale?, a_gs?, b_data, b_scale, b_gs?, fmt, k, b_block_rows, rounding, bias?,
       out_dtype) -> Tensor[M, N]
  gemm_out(..., out!) -> ()                        same, writes into ``out`` [M, N]
  linear(x, w_data, w_scale, w_gs?, fmt, k, w_block_rows, rounding, bias?, out_dtype,
         weight_only) -> Tensor[M, N]               x: [M, K] bf16/fp16
  linear_out(x, ..., bias?, weight_only, out!) -> ()  same, writes into ``out`` [M, N]
"""

from __future__ import annotations

import torch

from ..formats import ScaleRounding, get_format
from ..tensor import ScaledTensor

__all__ = ["gemm_op", "gemm_out_op", "linear_op", "linear_out_op"]


def _scaled(data, scale, gs, fmt_name: str, k: int, rows: int, rounding: str) -> ScaledTensor:
    fmt = get_format(fmt_name)
    shape = torch.Size((*data.shape[:-1], k))
    block = (rows, fmt.block_k)
    return ScaledTensor(data, scale, fmt, shape, block, ScaleRounding(rounding), gs)


def _a_parts(a, a_scale, a_gs, fmt, k):
    """Custom-op A arguments -> (a2, a_s2, a_gs, a_dense, a_q)."""
    if a_scale is None:
        return a, None, None, True, None
    a_q = ScaledTensor(a, a_scale, fmt, torch.Size((a.shape[0], k)), (1, fmt.block_k),
                       fmt.default_rounding, a_gs)
    return a, a_scale, a_gs, False, a_q


@torch.library.custom_op("blockscaled::gemm_out", mutates_args=("out",))
def _gemm_out(
    a: torch.Tensor, a_scale: torch.Tensor | None, a_gs: torch.Tensor | None,
    b_data: torch.Tensor, b_scale: torch.Tensor, b_gs: torch.Tensor | None,
    fmt: str, k: int, b_block_rows: int, rounding: str, bias: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    from .gemm import gemm_impl

    b = _scaled(b_data, b_scale, b_gs, fmt, k, b_block_rows, rounding)
    a2, a_s2, a_gs2, a_dense, a_q = _a_parts(a, a_scale, a_gs, b.format, k)
    gemm_impl(a2, a_s2, a_gs2, b, out, bias, b.format, a_dense, None, out.dtype, a_q)


@torch.library.custom_op("blockscaled::gemm", mutates_args=())
def _gemm(
    a: torch.Tensor, a_scale: torch.Tensor | None, a_gs: torch.Tensor | None,
    b_data: torch.Tensor, b_scale: torch.Tensor, b_gs: torch.Tensor | None,
    fmt: str, k: int, b_block_rows: int, rounding: str, bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    from .gemm import gemm_impl

    out = torch.empty((a.shape[0], b_data.shape[0]), dtype=out_dtype, device=b_data.device)
    b = _scaled(b_data, b_scale, b_gs, fmt, k, b_block_rows, rounding)
    a2, a_s2, a_gs2, a_dense, a_q = _a_parts(a, a_scale, a_gs, b.format, k)
    gemm_impl(a2, a_s2, a_gs2, b, out, bias, b.format, a_dense, None, out_dtype, a_q)
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
    from .linear import linear_impl

    w = _scaled(w_data, w_scale, w_gs, fmt, k, w_block_rows, rounding)
    return linear_impl(x, w, bias, out_dtype, weight_only)


@torch.library.custom_op("blockscaled::linear_out", mutates_args=("out",))
def _linear_out(
    x: torch.Tensor, w_data: torch.Tensor, w_scale: torch.Tensor, w_gs: torch.Tensor | None,
    fmt: str, k: int, w_block_rows: int, rounding: str, bias: torch.Tensor | None,
    weight_only: bool, out: torch.Tensor,
) -> None:
    from .linear import linear_impl

    w = _scaled(w_data, w_scale, w_gs, fmt, k, w_block_rows, rounding)
    linear_impl(x, w, bias, out.dtype, weight_only, out)


@_linear.register_fake
def _linear_fake(x, w_data, w_scale, w_gs, fmt, k, w_block_rows, rounding, bias, out_dtype, weight_only):
    return x.new_empty((x.shape[0], w_data.shape[0]), dtype=out_dtype)


def gemm_op(a2, a_s2, a_gs, b: ScaledTensor, bias, out_dtype) -> torch.Tensor:
    return torch.ops.blockscaled.gemm(a2, a_s2, a_gs, b.data, b.scale, b.global_scale, b.format.name,
                                      b.shape[-1], b.block[0], b.rounding.value, bias, out_dtype)


def gemm_out_op(a2, a_s2, a_gs, b: ScaledTensor, out2, bias) -> None:
    torch.ops.blockscaled.gemm_out(a2, a_s2, a_gs, b.data, b.scale, b.global_scale, b.format.name,
                                   b.shape[-1], b.block[0], b.rounding.value, bias, out2)


def linear_out_op(x2, w: ScaledTensor, bias, weight_only: bool, out2) -> None:
    torch.ops.blockscaled.linear_out(x2, w.data, w.scale, w.global_scale, w.format.name, w.shape[-1],
                                     w.block[0], w.rounding.value, bias, weight_only, out2)


def linear_op(x2, w: ScaledTensor, bias, out_dtype, weight_only: bool) -> torch.Tensor:
    return torch.ops.blockscaled.linear(x2, w.data, w.scale, w.global_scale, w.format.name, w.shape[-1],
                                        w.block[0], w.rounding.value, bias, out_dtype, weight_only)
