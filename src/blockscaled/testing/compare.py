"""Comparisons: bitwise equality for quantizers, error metrics for GEMMs."""

from __future__ import annotations

import torch

from ..tensor import ScaledTensor


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Reinterpret a tensor as integers of its width, with every NaN mapped to one pattern:
    NaN payloads (and the sign of NaN) are not part of the numerics contract, CPU and GPU
    produce different quiet-NaN bits. Everything else, including the sign of zero, counts."""
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    b = t.contiguous().view(view)
    if t.is_floating_point():
        b = torch.where(torch.isnan(t.float()), torch.full_like(b, -1), b)
    return b


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a.cpu()), _bits(b.cpu()))


def _first_mismatch(a: torch.Tensor, b: torch.Tensor) -> str:
    ba, bb = _bits(a.cpu()), _bits(b.cpu())
    bad = (ba != bb).nonzero()
    n = bad.shape[0]
    if n == 0:
        return "no mismatch"
    idx = tuple(bad[0].tolist())
    return (
        f"{n} of {a.numel()} elements differ; first at {idx}: "
        f"got {a.cpu()[idx].float().item()!r} (bits {int(ba[idx])}), "
        f"want {b.cpu()[idx].float().item()!r} (bits {int(bb[idx])})"
    )


def assert_scaled_equal(got: ScaledTensor, want: ScaledTensor) -> None:
    """Assert two ScaledTensors are bit-for-bit identical (data, scale, global scale, metadata)."""
    assert got.format == want.format, (got.format, want.format)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.block == want.block, (got.block, want.block)
    assert got.rounding == want.rounding, (got.rounding, want.rounding)
    for field in ("scale", "data"):
        g, w = getattr(got, field), getattr(want, field)
        assert g.shape == w.shape and g.dtype == w.dtype, (field, g.shape, g.dtype, w.shape, w.dtype)
        assert bitwise_equal(g, w), f"{field}: {_first_mismatch(g, w)}"
    if want.global_scale is not None:
        assert got.global_scale is not None
        assert bitwise_equal(got.global_scale.reshape(()), want.global_scale.reshape(())), (
            got.global_scale,
            want.global_scale,
        )
