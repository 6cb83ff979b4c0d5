"""CPU tensors on a machine where Triton compiles for the GPU cannot go to a kernel: the public
grouped ops run their float64 reference twin instead (policy in blockscaled._checks.use_reference).
Forced here by switching the interpreter flag off for the call."""

import pytest
import torch

import blockscaled as bs
import blockscaled._checks as checks
from blockscaled.reference import grouped as ref
from blockscaled.reference.quantize import quantize


@pytest.fixture
def no_interpreter(monkeypatch):
    monkeypatch.setattr(checks, "INTERPRET", False)


def test_grouped_ops_fall_back_to_reference_on_cpu(no_interpreter):
    torch.manual_seed(0)
    a = quantize(torch.randn(10, 64), "mxfp8")
    b = quantize(torch.randn(3, 16, 64), "mxfp8")
    offs = torch.tensor([0, 4, 4, 10], dtype=torch.int32)
    want = ref.grouped_gemm(a, b, offsets=offs).to(torch.bfloat16)
    assert torch.equal(bs.grouped_gemm(a, b, offsets=offs), want)
    assert torch.equal(bs.swiglu(a, b, b, offsets=offs), ref.swiglu(a, b, b, offsets=offs).to(torch.bfloat16))

    a3 = quantize(torch.randn(3, 5, 64), "mxfp8")
    cnt = torch.tensor([2, 0, 5], dtype=torch.int32)
    out = torch.full((3, 5, 16), float("nan"), dtype=torch.float32)
    bs.grouped_gemm(a3, b, masked_m=cnt, out=out, out_dtype=torch.float32)
    rows = torch.arange(5)[None, :] < cnt[:, None]
    assert not out[rows].isnan().any() and out[~rows].isnan().all()  # rows past a count untouched

    bl = quantize(torch.randn(7, 64), "mxfp8")
    (y,) = bs.grouped_gemm_list([a], [bl])  # bf16, the default of every op
    assert torch.equal(y, ref.grouped_gemm_list([a], [bl])[0].to(torch.bfloat16))


def test_quantizers_fall_back_to_reference_on_cpu(no_interpreter):
    import importlib

    rq = importlib.import_module("blockscaled.reference.quantize")
    from blockscaled.testing import assert_scaled_equal, bitwise_equal

    x = torch.randn(6, 200, dtype=torch.bfloat16)
    for fmt in ("fp8_block", "mxfp8", "mxfp4", "nvfp4"):
        got = bs.quantize(x, fmt)
        assert_scaled_equal(got, rq.quantize(x, fmt))
        assert bitwise_equal(bs.dequantize(got, torch.bfloat16), rq.dequantize(got, torch.bfloat16))
    assert bitwise_equal(bs.tensor_amax(x), rq.tensor_amax(x))
    gu = torch.randn(4, 256)
    assert_scaled_equal(bs.silu_mul_quantize(gu), rq.silu_mul_quantize(gu))
