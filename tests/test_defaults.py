"""One default output dtype, bf16, for every public op (grouped_gemm_list
defaulted to fp16, where 230400 silently became inf; linear followed x's dtype).

Every public callable of ``blockscaled`` must be listed below, either as an op with its default
output dtype or as a non-op, so a new op cannot join without this test noticing. Both the
signature default and the dtype a call with defaults returns are checked, on the kernel path
(interpreter on CPU, or CUDA) and on the float64 reference path.
"""

from __future__ import annotations

import inspect

import pytest
import torch

import blockscaled as bs

#: op -> (name of the dtype argument, its default). dequantize is the one exception: it is a
#: conversion whose fp32 result is exact for every format (bf16 would round fp8_block values).
DTYPE_DEFAULTS = {
    "gemm": ("out_dtype", torch.bfloat16),
    "linear": ("out_dtype", torch.bfloat16),
    "grouped_gemm": ("out_dtype", torch.bfloat16),
    "grouped_gemm_list": ("out_dtype", torch.bfloat16),
    "swiglu": ("out_dtype", torch.bfloat16),
    "silu_mul_quantize": ("intermediate_dtype", torch.bfloat16),
    "dequantize": ("dtype", torch.float32),
}
#: public callables without a floating-point output dtype
NOT_OPS = {"quantize", "tensor_amax", "get_format", "check_errors", "Format", "ScaleRounding", "ScaledTensor",
           "GemmConfig", "QuantizationRangeWarning", "explain", "warmup", "quantize_model", "tune"}


def test_every_public_callable_is_classified():
    public = {n for n in bs.__all__ if callable(getattr(bs, n))}
    assert public == set(DTYPE_DEFAULTS) | NOT_OPS, (
        f"classify new public callables here: {sorted(public - set(DTYPE_DEFAULTS) - NOT_OPS)}; "
        f"gone: {sorted((set(DTYPE_DEFAULTS) | NOT_OPS) - public)}"
    )


@pytest.mark.parametrize("name", sorted(DTYPE_DEFAULTS))
def test_signature_default(name):
    arg, want = DTYPE_DEFAULTS[name]
    params = inspect.signature(getattr(bs, name)).parameters
    assert arg in params, f"{name}: no {arg} argument"
    assert params[arg].default == want, f"{name}: {arg} defaults to {params[arg].default}, expected {want}"


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
def test_calls_with_defaults_return_bf16(path, device, x_dtype):
    fmt, k = "mxfp8", 64
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, k, generator=g).to(device=device, dtype=x_dtype)
    a = bs.quantize(x, fmt)
    w = bs.quantize(torch.randn(8, k, generator=g).to(device) * 0.1, fmt)
    we = bs.quantize(torch.randn(2, 8, k, generator=g).to(device) * 0.1, fmt)
    offs = torch.tensor([0, 2, 5], dtype=torch.int32, device=device)
    got = {
        "gemm": bs.gemm(a, w),
        "gemm (weight-only)": bs.gemm(x, w),
        "linear": bs.linear(x, w),
        "linear (weight-only)": bs.linear(x, w, weight_only=True),
        "grouped_gemm": bs.grouped_gemm(a, we, offsets=offs),
        "grouped_gemm_list": bs.grouped_gemm_list([a], [w])[0],
        "swiglu": bs.swiglu(a, w, w),
        "swiglu (grouped)": bs.swiglu(a, we, we, offsets=offs),
        "dequantize": bs.dequantize(a),
    }
    for name, y in got.items():
        want = torch.float32 if name == "dequantize" else torch.bfloat16
        assert y.dtype == want, f"{name}: {y.dtype}, expected {want} (x {x_dtype})"


def test_bf16_default_keeps_large_values(path, device):
    """The reason for the rule: fp16's 65504 limit silently turned 230400 into inf."""
    fmt, k = "fp8_block", 128
    x = torch.full((1, k), 30.0, device=device)
    w = torch.full((1, k), 60.0, device=device)
    y = bs.grouped_gemm_list([bs.quantize(x, fmt)], [bs.quantize(w, fmt)])[0]
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all() and y.item() == 30.0 * 60.0 * k
