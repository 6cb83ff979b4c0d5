"""ScaledTensor container and format descriptors: validation, repr, device moves, nbytes,
dequantize; formats.get_format; ScaleRounding documentation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from blockscaled.formats import (
    E2M1_MAX,
    E4M3_MAX,
    FORMATS,
    FP8_BLOCK,
    MXFP4,
    MXFP8,
    NVFP4,
    Format,
    ScaleRounding,
    get_format,
)
from blockscaled.reference import dequantize as ref_dequantize
from blockscaled.reference import quantize as ref_quantize
from blockscaled.tensor import ScaledTensor, scale_shape
from blockscaled.testing.inputs import randn_like_activations

R = ScaleRounding


def _parts(fmt: Format, shape=(3, 40), block=None):
    """Valid (data, scale, global_scale) zeros for a logical shape."""
    block = block or fmt.blocks[0]
    data = torch.zeros((*shape[:-1], fmt.packed_k(shape[-1])), dtype=torch.uint8).view(fmt.data_dtype)
    scale = torch.zeros(scale_shape(shape, fmt, block), dtype=torch.uint8)
    scale = scale.float() if fmt.scale_dtype == torch.float32 else scale.view(fmt.scale_dtype)
    gs = torch.tensor(1.0) if fmt.has_global_scale else None
    return data, scale, gs


def _make(fmt, shape=(3, 40), block=None, **kw):
    data, scale, gs = _parts(fmt, shape, block)
    args = dict(data=data, scale=scale, format=fmt, shape=torch.Size(shape),
                block=block or fmt.blocks[0], rounding=fmt.default_rounding, global_scale=gs)
    args.update(kw)
    return ScaledTensor(**args)


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: f.name)
def test_valid_construction(fmt):
    q = _make(fmt)
    assert q.shape == torch.Size((3, 40)) and isinstance(q.shape, torch.Size)
    assert q.ndim == 2 and q.size() == q.shape and q.size(-1) == 40
    assert q.device == torch.device("cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.data = q.data  # frozen


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: f.name)
def test_wrong_data_dtype_and_shape(fmt):
    data, scale, gs = _parts(fmt)
    wrong = torch.float16
    with pytest.raises(ValueError, match=r"ScaledTensor.data: expected dtype"):
        _make(fmt, data=data.view(torch.uint8).to(wrong))
    with pytest.raises(ValueError, match=r"ScaledTensor.data: expected shape"):
        _make(fmt, data=torch.zeros(3, 41, dtype=torch.uint8).view(fmt.data_dtype))
    with pytest.raises(ValueError, match=r"ScaledTensor.data: expected shape"):
        _make(fmt, data=data[:2])


def test_fp4_data_is_packed_with_odd_k():
    q = _make(MXFP4, shape=(2, 33))
    assert q.data.shape == (2, 17)  # ceil(33 / 2)
    with pytest.raises(ValueError, match="expected shape"):
        _make(MXFP4, shape=(2, 33), data=torch.zeros(2, 33, dtype=torch.uint8))


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: f.name)
def test_wrong_scale_dtype_and_shape(fmt):
    data, scale, gs = _parts(fmt)
    other = torch.float16
    with pytest.raises(ValueError, match=r"ScaledTensor.scale: expected dtype"):
        _make(fmt, scale=torch.zeros(scale.shape, dtype=other))
    bad = torch.zeros((3, scale.shape[-1] + 1), dtype=torch.uint8)
    bad = bad.float() if fmt.scale_dtype == torch.float32 else bad.view(fmt.scale_dtype)
    with pytest.raises(ValueError, match=r"ScaledTensor.scale: expected shape"):
        _make(fmt, scale=bad)


def test_fp8_block_weight_scale_shape():
    q = _make(FP8_BLOCK, shape=(300, 257), block=(128, 128))
    assert q.scale.shape == (3, 3)
    with pytest.raises(ValueError, match=r"expected shape \(3, 3\)"):
        _make(FP8_BLOCK, shape=(300, 257), block=(128, 128), scale=torch.zeros(300, 3))
    with pytest.raises(ValueError, match="rank >= 2"):
        ScaledTensor(torch.zeros(256, dtype=torch.uint8).view(torch.float8_e4m3fn), torch.zeros(2, 2),
                     FP8_BLOCK, torch.Size((256,)), (128, 128), R.EXACT)


def test_global_scale_missing_extra_and_wrong():
    with pytest.raises(ValueError, match="global_scale: nvfp4 needs"):
        _make(NVFP4, global_scale=None)
    with pytest.raises(ValueError, match="global_scale: nvfp4 needs"):
        _make(NVFP4, global_scale=torch.tensor(1.0, dtype=torch.float64))
    with pytest.raises(ValueError, match="global_scale: nvfp4 needs"):
        _make(NVFP4, global_scale=torch.ones(2))
    for fmt in (FP8_BLOCK, MXFP8, MXFP4):
        with pytest.raises(ValueError, match=f"{fmt.name} has no global scale"):
            _make(fmt, global_scale=torch.tensor(1.0))


def test_bad_block_and_rank():
    with pytest.raises(ValueError, match=r"ScaledTensor.block: mxfp8 allows"):
        _make(MXFP8, block=(1, 16))
    with pytest.raises(ValueError, match=r"ScaledTensor.block: fp8_block allows"):
        _make(FP8_BLOCK, block=(1, 64))
    with pytest.raises(ValueError, match="at least 1 dimension"):
        ScaledTensor(torch.zeros((), dtype=torch.uint8).view(torch.float8_e4m3fn),
                     torch.zeros((), dtype=torch.uint8), MXFP8, torch.Size(()), (1, 32), R.RCEIL)


def _meta_device_tensor(t):
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def test_device_mismatch():
    data, scale, gs = _parts(NVFP4)
    with pytest.raises(ValueError, match=r"ScaledTensor.scale: on meta, data on cpu"):
        _make(NVFP4, scale=_meta_device_tensor(scale))
    with pytest.raises(ValueError, match=r"ScaledTensor.global_scale: on meta, data on cpu"):
        _make(NVFP4, global_scale=torch.empty((), device="meta"))


@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8", "mxfp4", "nvfp4"])
def test_repr_readable(fmt):
    q = ref_quantize(randn_like_activations(4, 64, seed=0), fmt)
    r = repr(q)
    assert r.startswith(f"ScaledTensor({fmt}, shape=(4, 64)")
    assert "rounding=" in r and "device=cpu" in r and str(q.scale.dtype) in r
    assert ("global_scale" in r) == (fmt == "nvfp4")
    assert "tensor(" not in r  # no tensor contents dumped
    assert len(r) < 300
    assert repr(get_format(fmt)) == f"Format({fmt})"


@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8", "mxfp4", "nvfp4"])
def test_to_and_cpu_keep_bits(fmt, device):
    q = ref_quantize(randn_like_activations(5, 70, seed=1), fmt)
    for moved in (q.to(device), q.to(device).cpu(), q.cpu(), q.to(torch.device("cpu"))):
        assert moved.data.view(torch.uint8).cpu().tolist() == q.data.view(torch.uint8).tolist()
        assert moved.scale.view(torch.uint8).cpu().tolist() == q.scale.view(torch.uint8).tolist()
        assert moved.shape == q.shape and moved.format is q.format and moved.block == q.block
        assert moved.rounding == q.rounding
        if q.global_scale is not None:
            assert moved.global_scale.device == moved.data.device
            assert moved.global_scale.cpu().item() == q.global_scale.item()
    assert q.to(device).device.type == torch.device(device).type


@pytest.mark.parametrize(
    "fmt,shape,block,want",
    [
        # data bytes + scale bytes (+ 4 for the nvfp4 global scale)
        ("fp8_block", (3, 300), None, 3 * 300 + 3 * 3 * 4),
        ("fp8_block", (300, 257), (128, 128), 300 * 257 + 3 * 3 * 4),
        ("mxfp8", (3, 70), None, 3 * 70 + 3 * 3),
        ("mxfp4", (3, 71), None, 3 * 36 + 3 * 3),
        ("nvfp4", (3, 33), None, 3 * 17 + 3 * 3 + 4),
    ],
)
def test_nbytes(fmt, shape, block, want):
    q = ref_quantize(randn_like_activations(*shape, seed=2), fmt, block=block)
    assert q.nbytes() == want


@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 5, 33), (129, 130)])
def test_dequantize_method_equals_reference(fmt, shape):
    q = ref_quantize(randn_like_activations(*shape, seed=3), fmt)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        a = q.dequantize(dtype)
        b = ref_dequantize(q, dtype)
        assert a.dtype == dtype and a.shape == shape
        # bitwise in every dtype, also in the interpreter (the dequantize kernels round
        # fp32 -> bf16 to nearest even from the bits, like the GPU)
        assert torch.equal(a, b)
    assert torch.equal(q.dequantize(), ref_dequantize(q))


def test_get_format():
    assert get_format("mxfp4") is MXFP4
    assert get_format("MXFP4") is MXFP4 and get_format(" NvFp4 ") is NVFP4  # names in any case
    assert get_format(NVFP4) is NVFP4
    for bad in ("fp8", "", None, 3):
        with pytest.raises(ValueError, match=r"fmt: expected one of \['fp8_block', 'mxfp4', 'mxfp8', 'nvfp4'\]"):
            get_format(bad)


def test_format_descriptors():
    assert FP8_BLOCK.blocks[0] == (1, 128) and (128, 128) in FP8_BLOCK.blocks
    assert FP8_BLOCK.default_rounding is R.EXACT and R.RCEIL in FP8_BLOCK.roundings
    for f in (MXFP8, MXFP4):
        assert f.default_rounding is R.RCEIL and R.FLOOR in f.roundings and f.block_k == 32
        assert f.scale_dtype == torch.uint8
    assert NVFP4.roundings == (R.NVFP4,) and NVFP4.block_k == 16 and NVFP4.has_global_scale
    assert (MXFP4.packed_k(33), MXFP8.packed_k(33)) == (17, 33)
    assert (NVFP4.scale_k(33), FP8_BLOCK.scale_k(128), FP8_BLOCK.scale_k(129)) == (3, 1, 2)
    assert (E4M3_MAX, E2M1_MAX) == (448.0, 6.0)
    assert torch.finfo(torch.float8_e4m3fn).max == E4M3_MAX
    assert 2 ** FP8_BLOCK.elem_emax <= E4M3_MAX < 2 ** (FP8_BLOCK.elem_emax + 1)
    assert 2 ** MXFP4.elem_emax <= E2M1_MAX < 2 ** (MXFP4.elem_emax + 1)


def test_scale_rounding_documented():
    assert ScaleRounding.__doc__ and "amax" in ScaleRounding.__doc__
    # Each member's formula is an attribute docstring in formats.py (not visible at runtime,
    # so read the source) and is repeated in docs/formats.md.
    import inspect

    import blockscaled.formats as formats_mod

    src = inspect.getsource(formats_mod.ScaleRounding)
    for r in ScaleRounding:
        body = src.split(f'{r.name} = "{r.value}"', 1)[1]
        assert body.lstrip().startswith('"""'), f"ScaleRounding.{r.name} has no docstring"
    assert "2**ceil(log2(amax / elem_max))" in src
    assert "floor(log2(amax)) - emax_elem" in src
