"""Float64 pure-torch twins of the grouped (MoE) GEMMs and the fused SwiGLU dual GEMM.

Every function dequantizes its operands with :func:`blockscaled.reference.quantize.dequantize`
(exact in fp32), promotes to float64, and loops over experts / groups. These are the
definitions the Triton kernels are tested against (docs/design.md, "Numerics"): the comparison is
always with the *same* quantized inputs, never with the unquantized originals.

They read ``offsets`` / ``masked_m`` with ``.tolist()`` (a host sync): references are for
tests, never for the hot path.

Conventions shared with :mod:`blockscaled.ops.grouped`:

* contiguous: ``a`` ``[sum_m, K]``, ``b`` ``[E, N, K]``, ``offsets`` int32 ``[E+1]``; rows
  ``offsets[e]:offsets[e+1]`` of ``a`` multiply expert ``e``. Output ``[sum_m, N]``.
* masked: ``a`` ``[E, max_m, K]``, ``masked_m`` int32 ``[E]``; rows ``0:masked_m[e]`` of
  expert ``e`` are computed. Output ``[E, max_m, N]``; the reference writes **NaN** in the
  rows past a count (the kernels leave them untouched), so comparisons must mask them.
* nvfp4 per-expert B global scale: ``b_global_scale`` fp32 ``[E]`` (MoE checkpoints store
  one per expert) overrides ``b.global_scale``; the B operand of expert ``e`` dequantizes as
  ``e2m1 * sf / b_global_scale[e]``.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..kernels.triton.check import BAD_ABOVE, BAD_FIRST, BAD_LAST, BAD_NEGATIVE, BAD_ORDER
from ..tensor import ScaledTensor
from .gemm import gemm
from .quantize import dequantize

__all__ = [
    "dequantize_experts",
    "grouped_gemm_contiguous",
    "grouped_gemm_masked",
    "grouped_gemm",
    "grouped_gemm_list",
    "swiglu",
    "metadata_errors",
]


def _deq64(q) -> torch.Tensor:
    """float64 operand: dequantized ScaledTensor, or a dense (weight-only) Tensor as is."""
    if isinstance(q, torch.Tensor):
        return q.double()
    return dequantize(q).double()


def dequantize_experts(b: ScaledTensor, b_global_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``[E, N, K]`` float64 dequantization of stacked expert weights.

    With ``b_global_scale`` (fp32 ``[E]``, nvfp4 only) expert ``e`` is divided by
    ``b_global_scale[e]`` instead of ``b.global_scale``.
    """
    if b_global_scale is None:
        return _deq64(b)
    if not b.format.has_global_scale:
        raise ValueError(f"b_global_scale: {b.format.name} has no global scale")
    # e2m1 * sf is exact in fp32: dequantize with a unit global scale, divide in float64.
    one = torch.ones((), dtype=torch.float32, device=b.device)
    raw = _deq64(replace(b, global_scale=one))
    return raw / b_global_scale.double().reshape(-1, 1, 1)


def _cast(y: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    return y if out_dtype is None else y.to(out_dtype)


def grouped_gemm_contiguous(
    a: ScaledTensor,
    b: ScaledTensor,
    offsets: torch.Tensor,
    *,
    b_global_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``y[offsets[e]:offsets[e+1]] = A[rows of e] @ B[e].T`` in float64 (cast to ``out_dtype``
    if given). ``a`` ``[sum_m, K]``, ``b`` ``[E, N, K]``, ``offsets`` ``[E+1]``."""
    af = _deq64(a)
    bf = dequantize_experts(b, b_global_scale)
    offs = [int(v) for v in offsets.cpu().tolist()]
    y = torch.zeros(af.shape[0], bf.shape[1], dtype=torch.float64, device=af.device)
    for e in range(bf.shape[0]):
        lo, hi = offs[e], offs[e + 1]
        if hi > lo:
            y[lo:hi] = af[lo:hi] @ bf[e].T
    return _cast(y, out_dtype)


def grouped_gemm_masked(
    a: ScaledTensor,
    b: ScaledTensor,
    masked_m: torch.Tensor,
    *,
    b_global_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``y[e, :masked_m[e]] = A[e, :masked_m[e]] @ B[e].T`` in float64; rows past a count are
    NaN here (undefined in the kernels). ``a`` ``[E, max_m, K]``, ``b`` ``[E, N, K]``."""
    af = _deq64(a)
    bf = dequantize_experts(b, b_global_scale)
    counts = [int(v) for v in masked_m.cpu().tolist()]
    e_, max_m = af.shape[0], af.shape[1]
    y = torch.full((e_, max_m, bf.shape[1]), float("nan"), dtype=torch.float64, device=af.device)
    for e in range(e_):
        m = counts[e]
        if m > 0:
            y[e, :m] = af[e, :m] @ bf[e].T
    return _cast(y, out_dtype)


def grouped_gemm(a, b, *, offsets=None, masked_m=None, b_global_scale=None, out_dtype=None):
    """Reference twin of :func:`blockscaled.ops.grouped.grouped_gemm` (float64 unless
    ``out_dtype`` is given)."""
    if (offsets is None) == (masked_m is None):
        raise ValueError("exactly one of offsets= (contiguous) or masked_m= (masked) must be given")
    if offsets is not None:
        return grouped_gemm_contiguous(a, b, offsets, b_global_scale=b_global_scale, out_dtype=out_dtype)
    return grouped_gemm_masked(a, b, masked_m, b_global_scale=b_global_scale, out_dtype=out_dtype)


def grouped_gemm_list(a_list, b_list, out_dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """Reference twin of :func:`blockscaled.ops.grouped_list.grouped_gemm_list`: one
    ``dequantize(a_g) @ dequantize(b_g).T`` per group, float64 unless ``out_dtype``."""
    return [_cast(gemm(a, b, out_dtype=None), out_dtype) for a, b in zip(a_list, b_list, strict=True)]


def _silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return g / (1.0 + torch.exp(-g)) * u


def swiglu(
    a: ScaledTensor,
    b_gate: ScaledTensor,
    b_up: ScaledTensor | None = None,
    *,
    offsets: torch.Tensor | None = None,
    masked_m: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    b_gate_global_scale: torch.Tensor | None = None,
    b_up_global_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference twin of :func:`blockscaled.ops.swiglu.swiglu`:
    ``silu(A @ Bg.T) * (A @ Bu.T)`` in float64 (dense ``b`` ``[N, K]``, or ``[E, N, K]`` with
    ``offsets`` or ``masked_m``; masked rows past a count are NaN). ``b_up`` None: ``b_gate`` is
    a stacked ``[E, 2N, K]`` gate_up weight (gate rows, then up rows)."""
    if b_up is None:
        kw = {"b_global_scale": b_gate_global_scale}
        if masked_m is not None:
            gu = grouped_gemm_masked(a, b_gate, masked_m, **kw)
        else:
            gu = grouped_gemm_contiguous(a, b_gate, offsets, **kw)
        n = gu.shape[-1] // 2
        return _cast(_silu_mul(gu[..., :n], gu[..., n:]), out_dtype)
    gk = {"b_global_scale": b_gate_global_scale}
    uk = {"b_global_scale": b_up_global_scale}
    if masked_m is not None:
        g = grouped_gemm_masked(a, b_gate, masked_m, **gk)
        u = grouped_gemm_masked(a, b_up, masked_m, **uk)
    elif offsets is None:
        g = gemm(a, b_gate, out_dtype=None)
        u = gemm(a, b_up, out_dtype=None)
    else:
        g = grouped_gemm_contiguous(a, b_gate, offsets, **gk)
        u = grouped_gemm_contiguous(a, b_up, offsets, **uk)
    return _cast(_silu_mul(g, u), out_dtype)


def metadata_errors(seg: torch.Tensor, mode: int, limit: int) -> tuple[int, int, int, int]:
    """The MoE metadata rules (twin of ``kernels/triton/check.py``), on the host.

    ``mode`` 1: ``seg`` = offsets ``[E+1]``; valid when ``offsets[0] == 0``, non-decreasing and
    ``offsets[E] == limit`` (rows of ``a``). ``mode`` 2: ``seg`` = ``masked_m [E]``; valid when
    every count is in ``[0, limit]`` (``limit`` = ``max_m``). Returns ``(kinds, first, value,
    prev)``: the bit set of violated rules (``kernels.triton.check.BAD_*``; 0 when valid), the
    index of the first bad entry, its value and the entry before it (offsets; else 0)."""
    v = [int(x) for x in seg.cpu().tolist()]
    bad = [False] * len(v)
    kinds = 0
    if mode == 1:
        e = len(v) - 1
        for i, x in enumerate(v):
            if i == 0 and x != 0:
                kinds, bad[i] = kinds | BAD_FIRST, True
            if i >= 1 and x < v[i - 1]:
                kinds, bad[i] = kinds | BAD_ORDER, True
            if i == e and x != limit:
                kinds, bad[i] = kinds | BAD_LAST, True
    else:
        for i, x in enumerate(v):
            if x < 0:
                kinds, bad[i] = kinds | BAD_NEGATIVE, True
            if x > limit:
                kinds, bad[i] = kinds | BAD_ABOVE, True
    if not kinds:
        return 0, 0, 0, 0
    first = bad.index(True)
    prev = v[first - 1] if mode == 1 and first >= 1 else 0
    return kinds, first, v[first], prev
