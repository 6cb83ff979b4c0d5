"""Autograd: one documented behaviour on every path (docs/errors.md).

Each test runs on the Triton-interpreter path (CPU with TRITON_INTERPRET=1, or CUDA) and on the
float64 reference path (CPU tensors with the interpreter off), and compares gradients with
float64 references: the documented formulas, and torch.autograd through the float64 reference
twins (``blockscaled.reference.gemm``), which carry the same straight-through semantics.
"""

from __future__ import annotations

import pytest
import torch

import blockscaled as bs
import blockscaled._checks as checks
from blockscaled.reference import gemm as ref_gemm
from blockscaled.reference.quantize import dequantize as ref_dequantize
from blockscaled.reference.quantize import quantize as ref_quantize

FORMATS = ("fp8_block", "mxfp8", "mxfp4", "nvfp4")
M, N, K = 6, 12, 160  # K: a partial last block in every format


def _x(*shape, device, seed=0, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)


def _w(fmt, device, seed=1, requires_grad=False):
    """A weight [N, K] (fp8_block: 128x128 blocks) and the float tensor it came from."""
    w = _x(N, K, device=device, seed=seed, scale=0.1).requires_grad_(requires_grad)
    return bs.quantize(w, fmt, block=(128, 128) if fmt == "fp8_block" else None), w


def _deq64(q) -> torch.Tensor:
    return ref_dequantize(q, torch.float32).double()


_EPS32 = torch.finfo(torch.float32).eps


def _close(got: torch.Tensor, want64: torch.Tensor, what: str, bound64: torch.Tensor | None = None) -> None:
    """``got`` (fp32 or 16-bit) against a float64 value. The backward products are fp32
    matmuls cast once to the input's dtype: error <= one rounding of that dtype plus the fp32
    accumulation error, <= K * eps32 * ``bound64`` (the sum of |products|; default: max |want|)."""
    eps = torch.finfo(got.dtype).eps
    if bound64 is None:
        bound64 = want64.abs().max().expand_as(want64)
    err = (got.double() - want64).abs()
    tol = eps * want64.abs() + 2 * K * _EPS32 * bound64 + 1e-30
    assert got.shape == want64.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want64.shape)}"
    assert (err <= tol).all(), f"{what}: max error {err.max().item():.3g}, tolerance {tol.max().item():.3g}"


def _close_mm(got: torch.Tensor, x64: torch.Tensor, y64: torch.Tensor, what: str) -> None:
    """``got`` against the float64 product ``x64 @ y64``."""
    _close(got, (x64 @ y64).reshape(got.shape), what, (x64.abs() @ y64.abs()).reshape(got.shape))


def _ref_q(x, fmt, **kw):
    """The reference quantizer with the straight-through link of ``blockscaled.quantize``."""
    from blockscaled.ops._autograd import attach_source

    return attach_source(ref_quantize(x.detach(), fmt, **kw), x)


# --------------------------------------------------------------------------- quantize / dequantize
@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_is_straight_through(path, device, fmt):
    x = _x(M, K, device=device, scale=3.0).requires_grad_()
    q = bs.quantize(x, fmt)
    for t in (q.data, q.scale, q.global_scale):  # the fields are constants
        assert t is None or not t.requires_grad
    y = bs.dequantize(q, torch.float32)
    assert y.requires_grad
    assert torch.equal(y.detach(), bs.dequantize(bs.quantize(x.detach(), fmt), torch.float32))
    g = _x(M, K, device=device, seed=5)
    (y * g).sum().backward()
    assert torch.equal(x.grad, g)  # d dequantize(quantize(x)) / dx = identity, whatever the format
    # bf16 output of a bf16 source: the gradient comes back in the source's dtype
    xb = _x(M, K, device=device, dtype=torch.bfloat16).requires_grad_()
    yb = bs.dequantize(bs.quantize(xb, fmt), torch.bfloat16)
    yb.backward(torch.ones_like(yb))
    assert xb.grad.dtype == torch.bfloat16 and (xb.grad == 1).all()


def test_moved_copy_keeps_the_link(path, device):
    """``q.to(...)`` (a device move, here to the same device) keeps the straight-through link:
    the gradient reaches x instead of silently not arriving."""
    x = _x(M, K, device=device).requires_grad_()
    w, _ = _w("fp8_block", device)
    q = bs.quantize(x, "fp8_block").to(device)
    y = bs.gemm(q, w, out_dtype=torch.float32)
    y.sum().backward()
    assert x.grad is not None
    want = torch.ones(M, N, dtype=torch.float64, device=device) @ _deq64(w)
    _close(x.grad, want, "dx through q.to()")


@pytest.mark.parametrize("op", ["gemm", "linear", "grouped_gemm", "swiglu"])
def test_out_that_requires_grad_is_refused(path, device, op):
    """The kernels write out= in place: an out that requires grad is refused on every path (the
    reference path's copy_ used to raise torch's own error, the kernel paths wrote silently)."""
    w, _ = _w("fp8_block", device)
    x = _x(M, K, device=device, dtype=torch.bfloat16)
    q = bs.quantize(x, "fp8_block")
    out = torch.zeros(M, N, dtype=torch.bfloat16, device=device, requires_grad=True)
    w3 = bs.ScaledTensor(w.data[None], w.scale[None], w.format, torch.Size((1, N, K)), w.block, w.rounding)
    offs = torch.tensor([0, M], dtype=torch.int32, device=device)
    call = {"gemm": lambda: bs.gemm(q, w, out=out), "linear": lambda: bs.linear(x, w, out=out),
            "grouped_gemm": lambda: bs.grouped_gemm(q, w3, offsets=offs, out=out),
            "swiglu": lambda: bs.swiglu(q, w, w, out=out)}[op]
    with pytest.raises(RuntimeError, match=r"out: expected a tensor that does not require grad"):
        call()
    with torch.no_grad():  # no grad mode: nothing to record, so out= is fine
        call()


def test_constants_and_no_grad_pay_nothing(path, device):
    x = _x(M, K, device=device)
    q = bs.quantize(x, "mxfp8")
    assert not hasattr(q, "_grad_source")
    assert not bs.dequantize(q).requires_grad
    w, _ = _w("mxfp8", device)
    assert bs.gemm(q, w).grad_fn is None
    xr = x.requires_grad_()
    with torch.no_grad():
        qn = bs.quantize(xr, "mxfp8")
        assert not hasattr(qn, "_grad_source") and not bs.dequantize(qn).requires_grad
        assert not bs.linear(xr.detach().bfloat16().requires_grad_(), w).requires_grad
    assert not bs.tensor_amax(xr).requires_grad  # a statistic: no gradient


# --------------------------------------------------------------------------- gemm / linear
@pytest.mark.parametrize("fmt", FORMATS)
def test_gemm_gradients(path, device, fmt):
    """y = gemm(quantize(xa), quantize(W)) + bias: dxa = dy @ deq(b), dW = dy.T @ deq(a),
    dbias = dy.sum(0); also through torch.autograd of the float64 reference twin."""
    xa = _x(2, 3, K, device=device, scale=2.0).requires_grad_()  # leading dims flatten
    a = bs.quantize(xa, fmt)
    b, w = _w(fmt, device, requires_grad=True)
    bias = _x(N, device=device, seed=7).requires_grad_()
    y = bs.gemm(a, b, torch.float32, bias=bias)
    assert y.shape == (2, 3, N) and y.requires_grad
    gy = _x(2, 3, N, device=device, seed=9)
    y.backward(gy)
    g64 = gy.double().reshape(-1, N)
    _close_mm(xa.grad, g64, _deq64(b), "dA")
    _close_mm(w.grad, g64.t(), _deq64(a).reshape(-1, K), "dW")
    _close(bias.grad, g64.sum(0), "dbias", g64.abs().sum(0))
    # the float64 reference twin, differentiated by torch (same straight-through semantics)
    xa2, w2, bias2 = (t.detach().clone().requires_grad_() for t in (xa, w, bias))
    y64 = ref_gemm.gemm(_ref_q(xa2, fmt), _ref_weight(w2, fmt), None, bias=bias2)
    _reference_grads(y64, gy, (xa2, w2, bias2), (xa.grad, w.grad, bias.grad))


def _ref_weight(w, fmt):
    return _ref_q(w, fmt, block=(128, 128) if fmt == "fp8_block" else None)


def _reference_grads(y64, gy, leaves, got):
    """Gradients of the float64 reference twin (cast by torch to each leaf's dtype) against
    ours: both round nearly the same value once, so one ulp apart at most (plus fp32 sums)."""
    y64.backward(gy.double())
    for leaf, g in zip(leaves, got):
        want = leaf.grad
        assert want is not None, "the reference twin did not reach the leaf"
        assert want.dtype == g.dtype
        _close(g, want.double(), "vs reference autograd")


def test_gemm_weight_only_and_bias_dtype(path, device):
    fmt = "mxfp4"
    x = _x(M, K, device=device, dtype=torch.bfloat16).requires_grad_()
    b, _ = _w(fmt, device)
    bias = _x(N, device=device, dtype=torch.bfloat16).requires_grad_()
    y = bs.gemm(x, b, bias=bias)  # bf16 default output
    gy = _x(M, N, device=device, seed=3, dtype=torch.bfloat16)
    y.backward(gy)
    assert x.grad.dtype == torch.bfloat16 and bias.grad.dtype == torch.bfloat16
    _close_mm(x.grad, gy.double(), _deq64(b), "dx")
    _close(bias.grad, gy.double().sum(0), "dbias", gy.double().abs().sum(0))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("weight_only", [False, True], ids=["quantized", "weight_only"])
def test_linear_gradients(path, device, fmt, weight_only):
    x = _x(M, K, device=device, dtype=torch.bfloat16, scale=2.0).requires_grad_()
    w, wf = _w(fmt, device, requires_grad=True)
    bias = _x(N, device=device, seed=4).requires_grad_()
    y = bs.linear(x, w, bias, out_dtype=torch.float32, weight_only=weight_only)
    gy = _x(M, N, device=device, seed=8)
    y.backward(gy)
    g64 = gy.double()
    _close_mm(x.grad, g64, _deq64(w), "dx: straight through the activation quantization")
    xa = x.detach().double() if weight_only else _deq64(ref_quantize(x.detach(), fmt,
                                                                      **ref_gemm.activation_quant_args(w)))
    _close_mm(wf.grad, g64.t(), xa, "dW")
    _close(bias.grad, g64.sum(0), "dbias", g64.abs().sum(0))
    x2, wf2, bias2 = (t.detach().clone().requires_grad_() for t in (x, wf, bias))
    y64 = ref_gemm.linear(x2, _ref_weight(wf2, fmt), bias2, weight_only=weight_only)
    _reference_grads(y64, gy, (x2, wf2, bias2), (x.grad, wf.grad, bias.grad))


def test_linear_frozen_weight_only_x_gets_a_gradient(path, device):
    x = _x(M, K, device=device, dtype=torch.float16).requires_grad_()
    w, _ = _w("fp8_block", device)
    y = bs.linear(x, w)
    assert y.dtype == torch.bfloat16
    y.sum().backward()
    assert x.grad.dtype == torch.float16
    _close_mm(x.grad, torch.ones(M, N, dtype=torch.float64, device=device), _deq64(w), "dx")


def test_same_gradients_on_both_paths(device, monkeypatch):
    """The backward is the same torch code on every path: bitwise equal gradients."""
    if device != "cpu" or not checks.INTERPRET:
        pytest.skip("compares the interpreter with the reference path on the CPU")
    grads = []
    for interp in (True, False):
        monkeypatch.setattr(checks, "INTERPRET", interp)
        x = _x(M, K, device=device, dtype=torch.bfloat16).requires_grad_()
        w, wf = _w("nvfp4", device, requires_grad=True)
        bs.linear(x, w, out_dtype=torch.float32).backward(_x(M, N, device=device, seed=2))
        grads.append((x.grad, wf.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_silu_mul_quantize_is_straight_through(path, device):
    gu = _x(M, 2 * K, device=device, scale=2.0).requires_grad_()
    q = bs.silu_mul_quantize(gu, "mxfp8")
    y = bs.dequantize(q)
    gy = _x(M, K, device=device, seed=6)
    y.backward(gy)
    gu2 = gu.detach().clone().requires_grad_()
    g, u = gu2[:, :K], gu2[:, K:]
    ((g * torch.sigmoid(g) * u).to(torch.bfloat16).float() * gy).sum().backward()
    torch.testing.assert_close(gu.grad, gu2.grad, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- errors
def test_out_with_grad_raises(path, device):
    x = _x(M, K, device=device, dtype=torch.bfloat16).requires_grad_()
    w, _ = _w("mxfp8", device)
    out = torch.empty(M, N, dtype=torch.bfloat16, device=device)
    with pytest.raises(RuntimeError, match="linear: out= cannot be used while an input requires grad"):
        bs.linear(x, w, out=out)
    with pytest.raises(RuntimeError, match="gemm: out= cannot be used"):
        bs.gemm(x, w, out=out)
    with torch.no_grad():
        assert bs.linear(x, w, out=out) is out


def test_grouped_ops_raise_when_an_input_requires_grad(path, device):
    fmt = "mxfp8"
    xa = _x(5, 64, device=device).requires_grad_()
    a = bs.quantize(xa, fmt)
    b = bs.quantize(_x(2, 8, 64, device=device, scale=0.1), fmt)
    offs = torch.tensor([0, 2, 5], dtype=torch.int32, device=device)
    with pytest.raises(RuntimeError, match=r"grouped_gemm: autograd is not supported .* a \(through the float"):
        bs.grouped_gemm(a, b, offsets=offs)
    with pytest.raises(RuntimeError, match=r"swiglu: autograd is not supported"):
        bs.swiglu(a, b, b, offsets=offs)
    dense = _x(5, 64, device=device, dtype=torch.bfloat16).requires_grad_()
    with pytest.raises(RuntimeError, match=r"a \(a torch.bfloat16 tensor\) requires grad"):
        bs.grouped_gemm(dense, b, offsets=offs)
    bl = bs.quantize(_x(8, 64, device=device), fmt)
    with pytest.raises(RuntimeError, match=r"grouped_gemm_list: .*a_list\[0\]"):
        bs.grouped_gemm_list([a], [bl])
    with torch.no_grad():
        assert bs.grouped_gemm(a, b, offsets=offs).shape == (5, 8)
        assert bs.grouped_gemm_list([a], [bl])[0].shape == (5, 8)
    # a detached quantization is a constant: fine with grad mode on
    assert not bs.grouped_gemm(bs.quantize(xa.detach(), fmt), b, offsets=offs).requires_grad


def test_custom_ops_have_the_same_backward(device):
    """torch.ops.blockscaled.linear / gemm called directly (what torch.compile traces) carry the
    registered autograd: dx = dy @ dequantize(w), dbias = dy.sum(0)."""
    if device == "cpu" and not checks.INTERPRET:
        pytest.skip("the custom ops run kernels: needs TRITON_INTERPRET=1 on the CPU")
    from blockscaled.ops import _custom_ops

    w, _ = _w("mxfp8", device)
    x = _x(M, K, device=device, dtype=torch.bfloat16).requires_grad_()
    bias = _x(N, device=device).requires_grad_()
    y = _custom_ops.linear_op(x, w, bias, torch.float32, False)
    gy = _x(M, N, device=device, seed=1)
    y.backward(gy)
    _close_mm(x.grad, gy.double(), _deq64(w), "linear op dx")
    _close(bias.grad, gy.double().sum(0), "linear op dbias", gy.double().abs().sum(0))
    x.grad = None
    y = _custom_ops.gemm_op(x, None, None, w, None, torch.float32)
    y.backward(gy)
    _close_mm(x.grad, gy.double(), _deq64(w), "gemm op dx (weight-only)")
    w4, _ = _w("mxfp4", device)  # uint8 fields: opcheck cannot multiply fp8 tensors on the CPU
    torch.library.opcheck(torch.ops.blockscaled.linear.default,
                          (x.detach().requires_grad_(), w4.data, w4.scale, None, "mxfp4", K, 1, w4.rounding.value,
                           None, torch.float32, False),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
