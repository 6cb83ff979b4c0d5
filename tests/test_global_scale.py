"""nvfp4 global scales: a user-given one is validated, and blocks lost to the scale range are
reported (rules in docs/formats.md, "Range of nvfp4").

* A Python number or CPU tensor that is not finite and > 0 raises ValueError naming
  ``global_scale`` (inf gave all zeros, 0 / NaN all NaN, 1e6 clipped everything, -1 passed).
* A CUDA tensor is not read back (no host sync): the kernel turns a bad value into NaN scales,
  so the result dequantizes to all NaN (tested here through the kernel launcher on CPU
  tensors in the interpreter, and end to end on a GPU).
* ``check_range``: a QuantizationRangeWarning with the number of blocks whose scale underflowed
  to 0 (one outlier flushing the rest of the tensor) or saturated (gs too large).
"""

from __future__ import annotations

import importlib
import re
import warnings

import pytest
import torch

import blockscaled as bs
from blockscaled import _checks
from blockscaled.formats import NVFP4, QuantizationRangeWarning, ScaleRounding
from blockscaled.ops import quantize as ops_q

# the module (the package re-exports its function under the same name)
R = importlib.import_module("blockscaled.reference.quantize")

BAD = (float("inf"), float("-inf"), float("nan"), 0.0, -0.0, -1.0, 0)


def _x(device, seed=0, shape=(4, 256)):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device)


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_bad_python_global_scale_raises(bad, device):
    with pytest.raises(ValueError, match=r"global_scale: expected a finite value > 0 .*got"):
        bs.quantize(_x(device), "nvfp4", global_scale=bad)


@pytest.mark.parametrize("bad", BAD[:-1], ids=repr)
def test_bad_cpu_tensor_global_scale_raises(bad):
    for fn in (bs.quantize, R.quantize):
        with pytest.raises(ValueError, match=r"global_scale: expected a finite value > 0 .*got"):
            fn(_x("cpu"), "nvfp4", global_scale=torch.tensor(bad))


def test_global_scale_type_errors():
    x = _x("cpu")
    with pytest.raises(TypeError, match=r"global_scale: expected a float or a 1-element fp32 tensor, got bool"):
        bs.quantize(x, "nvfp4", global_scale=True)
    with pytest.raises(TypeError, match=r"global_scale: expected a float or a 1-element fp32 tensor, got str"):
        bs.quantize(x, "nvfp4", global_scale="1.0")


def test_good_global_scales_accepted(device):
    x = _x(device)
    for gs in (1.0, 3, 1e-30, 3.4e38, torch.tensor(0.5, device=device), torch.tensor([2.0], device=device)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", QuantizationRangeWarning)  # 1e-30 underflows, 3.4e38 saturates
            q = bs.quantize(x, "nvfp4", global_scale=gs)
        assert q.global_scale.shape == ()


@pytest.mark.parametrize("bad", (float("inf"), float("nan"), 0.0, -1.0, -float("inf")), ids=repr)
def test_kernel_turns_a_bad_device_global_scale_into_nan(bad, device):
    """The path a CUDA tensor takes (no host check): the kernel's own guard, reached through the
    launcher with the value as a device tensor. Every scale NaN, every element dequantizes to
    NaN, bitwise as the reference's rule (``nvfp4_checked_global_scale``)."""
    x = _x(device).to(torch.bfloat16)
    gs = torch.tensor(bad, dtype=torch.float32, device=device)
    data, scale, _ = ops_q._quantize_impl(x, NVFP4, (1, 16), ScaleRounding.NVFP4, gs)
    assert (scale.view(torch.uint8) & 0x7F == 0x7F).all(), "not every scale is NaN"
    assert (data == 0x77).all()  # NaN elements: e2m1 code 7 (both nibbles)
    q = bs.ScaledTensor(data, scale, NVFP4, x.shape, (1, 16), ScaleRounding.NVFP4, global_scale=gs)
    assert torch.isnan(bs.dequantize(q)).all()
    assert torch.isnan(R.nvfp4_checked_global_scale(gs))
    # a good value goes through the same guard unchanged
    good = torch.tensor(7.5, device=device)
    assert R.nvfp4_checked_global_scale(good).item() == 7.5
    d2, s2, _ = ops_q._quantize_impl(x, NVFP4, (1, 16), ScaleRounding.NVFP4, good)
    ref = R.quantize(x.cpu(), "nvfp4", global_scale=7.5)
    assert torch.equal(d2.cpu(), ref.data) and torch.equal(s2.cpu().view(torch.uint8), ref.scale.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("bad", (float("inf"), float("nan"), 0.0, -1.0), ids=repr)
def test_cuda_bad_global_scale_is_loud_without_sync(bad):
    x = _x("cuda").to(torch.bfloat16)
    q = bs.quantize(x, "nvfp4", global_scale=torch.tensor(bad, device="cuda"))  # no raise, no sync
    assert torch.isnan(bs.dequantize(q)).all()


# --------------------------------------------------------------------------- range check
def _outlier_x(device):
    x = _x(device)
    x[0, 0] = 1e30
    return x


def _ours(rec) -> list[str]:
    """Messages of our warnings among those recorded (the interpreter adds numpy's)."""
    return [str(w.message) for w in rec if issubclass(w.category, QuantizationRangeWarning)]


def _count_zero_blocks(q) -> int:
    d = bs.dequantize(q).cpu().view(-1, 16)
    return int((d == 0).all(-1).sum())


def test_outlier_flush_warns_with_counts(device):
    x = _outlier_x(device)
    with pytest.warns(QuantizationRangeWarning, match=r"underflowed") as rec:
        q = bs.quantize(x, "nvfp4", check_range=True)
    msg = _ours(rec)[0]
    under, n = map(int, re.search(r"(\d+) of (\d+) blocks", msg).groups())
    assert n == 64 and under == _count_zero_blocks(q) == 63, msg
    assert "global_scale" not in msg or "check_range=False" in msg
    assert "1e+30" in msg  # the outlier's magnitude is named


def test_default_checks_cpu_tensors():
    with pytest.warns(QuantizationRangeWarning, match=r"63 of 64 blocks"):
        bs.quantize(_outlier_x("cpu"), "nvfp4")


def test_reference_path_warns_the_same(monkeypatch):
    monkeypatch.setattr(_checks, "INTERPRET", False)  # CPU tensors take the reference twin
    with pytest.warns(QuantizationRangeWarning, match=r"63 of 64 blocks"):
        bs.quantize(_outlier_x("cpu"), "nvfp4")
    with pytest.warns(QuantizationRangeWarning, match=r"63 of 64 blocks"):
        R.quantize(_outlier_x("cpu"), "nvfp4")


def test_check_range_false_and_clean_inputs_are_silent(device):
    with warnings.catch_warnings():
        warnings.simplefilter("error", QuantizationRangeWarning)
        bs.quantize(_outlier_x(device), "nvfp4", check_range=False)
        x = _x(device, shape=(8, 128))
        x[3] = 0.0  # all-zero blocks are not "lost": they were zero
        x[5, :16] = float("nan")  # NaN / Inf blocks dequantize to NaN, not counted either
        x[6, 16:32] = float("inf")
        bs.quantize(x, "nvfp4", global_scale=1.0, check_range=True)
        bs.quantize(x, "nvfp4", check_range=True)  # computed gs = 2688 / inf = 0: all NaN, not "lost"
        bs.quantize(_x(device) * 1e-20, "nvfp4", check_range=True)  # a small tensor: gs scales up
        for fmt in ("mxfp4", "mxfp8", "fp8_block"):  # per-block scales only: nothing to check
            bs.quantize(_outlier_x(device), fmt, check_range=True)


def test_too_large_user_global_scale_warns_saturation(device):
    x = _x(device)
    with pytest.warns(QuantizationRangeWarning, match=r"64 of 64 blocks have gs \* amax / 6 above 464") as rec:
        q = bs.quantize(x, "nvfp4", global_scale=1e6, check_range=True)
    assert "fits it" in _ours(rec)[0]
    assert (q.scale.view(torch.uint8) == 0x7E).all()  # every scale saturated at 448


def test_range_stats_match_the_quantized_result(device):
    """The counts are computed from x and the result; check them against a direct count on a
    tensor with blocks spread over 40 binades (some underflow, none saturate)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 64, generator=g) * torch.logspace(0, -12, 16)[:, None]
    x = x.to(device)
    q = bs.quantize(x, "nvfp4", check_range=False)
    n, under, sat, top = R.nvfp4_range_stats(x, q).tolist()
    assert n == 64 and sat == 0 and top == x.abs().max().item()
    assert under == _count_zero_blocks(q) and 0 < under < 64


def test_check_range_type_error(device):
    with pytest.raises(TypeError, match=r"check_range: expected True, False or None, got 'yes'"):
        bs.quantize(_x(device), "nvfp4", check_range="yes")
