"""Public quantize / dequantize ops (launchers: validate, allocate, launch)."""

from __future__ import annotations

import torch

from ..reference import quantize as _ref
from ..tensor import ScaledTensor


def quantize(x, fmt, *, block=None, rounding=None, global_scale=None) -> ScaledTensor:
    # TEMPORARY: reference path until the Triton kernels land.
    return _ref.quantize(x, fmt, block=block, rounding=rounding, global_scale=global_scale)


def dequantize(q: ScaledTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return _ref.dequantize(q, dtype=dtype)
