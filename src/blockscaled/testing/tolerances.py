"""GEMM accuracy thresholds: ONE table keyed by (format, output dtype), each with its reason.

GEMMs are compared with the float64 ``dequantize(a) @ dequantize(b).T`` of the *same*
quantized inputs (docs/design.md, "Numerics"), so the only error sources are (1) fp32 accumulation
(products of e4m3/e2m1 values and their scales are exact in fp32; the order of the sum
differs), (2) the output rounding, and (3) on the "dequant_matmul" path, 16-bit rounding of
fp8_block operands (fp32 scales) and one extra rounding for nvfp4's global scale / bias.

Metrics
-------
``rel_fro``: ``||out - ref||_F / ||ref||_F`` (the typical error).
``norm_max``: ``max |out - ref| / max |ref|`` (the worst element, in units of the output's
scale, so that cancellation near zero does not blow it up).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import INTERPRET

__all__ = ["Tolerance", "GEMM_TOLERANCES", "gemm_tolerance", "gemm_errors", "assert_gemm_close",
           "assert_no_nan_survivors"]


@dataclass(frozen=True)
class Tolerance:
    rel_fro: float
    norm_max: float
    reason: str


# Reasons per output dtype (identical for every format, see below).
_BF16 = Tolerance(
    rel_fro=4e-3,
    norm_max=1.2e-2,
    reason="bf16 output rounding is <= 2**-9 relative per element (RMS ~1.1e-3); dequant_matmul adds "
    "bf16 operand rounding for fp8_block (~2e-3 RMS) and up to two more roundings for nvfp4 global "
    "scale / bias, so the worst element may be off by ~3 half-ulps of the largest value (2**-9 * 3 = 6e-3, "
    "x2 margin).",
)
_FP16 = Tolerance(
    rel_fro=8e-4,
    norm_max=2.5e-3,
    reason="fp16 output rounding is <= 2**-12 relative (RMS ~1.4e-4); dequant_matmul rounds fp8_block "
    "operands to fp16 (2**-12 each, ~3e-4 RMS); worst element a few half-ulps of the largest value.",
)
_FP32 = Tolerance(
    rel_fro=6e-4,
    norm_max=1e-3,
    reason="exact products, but Hopper's FP8 wgmma adds them with a reduced-precision accumulator "
    "(about 14 significant bits, DeepSeek-V3 report 3.3.2) until the kernel promotes the chunk into "
    "fp32 every scale block: measured 1.6e-4 rel_fro / 2.2e-4 norm_max for fp8_block on the H100 at "
    "K=100 (one chunk); the limits leave ~4x. The interpreter (exact fp32) lands near 1e-6, so CPU "
    "runs are checked at 2e-5 / 5e-5 (fp32 sums over K <= 16384 in a different order than float64).",
)
#: fp32-output limits where the products are summed in true fp32 (CPU / interpreter).
_FP32_EXACT_ACC = (2e-5, 5e-5)

#: (format name, out dtype) -> Tolerance. Formats share a row per dtype because every
#: format's products are exact in fp32 (e4m3 x e4m3 x fp32 scale x fp32 scale: 4+4+24+24
#: significant bits need rounding only in fp8_block's scale product, 2**-24 relative).
GEMM_TOLERANCES: dict[tuple[str, torch.dtype], Tolerance] = {
    (fmt, dt): tol
    for fmt in ("fp8_block", "mxfp8", "mxfp4", "nvfp4")
    for dt, tol in ((torch.bfloat16, _BF16), (torch.float16, _FP16), (torch.float32, _FP32))
}
GEMM_TOLERANCES[("fp8_block", torch.bfloat16)] = Tolerance(
    rel_fro=8e-3,
    norm_max=1.6e-2,
    reason="the dequant_matmul path rounds both fp32-scaled fp8_block operands to bf16 (2**-9 each); with "
    "outlier channels a few products dominate and the errors do not average out (measured 5.3e-3 "
    "rel_fro, 8.9e-3 norm_max on randn_like_activations); the Triton FP8 path stays ~1e-3.",
)


def gemm_tolerance(fmt: str, out_dtype: torch.dtype) -> Tolerance:
    try:
        return GEMM_TOLERANCES[(fmt, out_dtype)]
    except KeyError:
        raise KeyError(f"no GEMM tolerance for format {fmt!r} and out dtype {out_dtype}") from None


def gemm_errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(rel_fro, norm_max) of ``out`` against ``ref`` (computed in float64 on the CPU)."""
    o = out.detach().double().cpu()
    r = ref.detach().double().cpu()
    if o.shape != r.shape:
        raise AssertionError(f"shape mismatch: out {tuple(o.shape)} vs ref {tuple(r.shape)}")
    if r.numel() == 0:
        return 0.0, 0.0
    d = o - r
    rn = r.norm().item()
    rm = r.abs().max().item()
    rel_fro = d.norm().item() / rn if rn > 0 else d.norm().item()
    norm_max = d.abs().max().item() / rm if rm > 0 else d.abs().max().item()
    return rel_fro, norm_max


def assert_no_nan_survivors(out: torch.Tensor, ref: torch.Tensor | None = None) -> None:
    """Outputs are poisoned with NaN before a run: any NaN where the reference is finite is an
    element the kernel never wrote (or computed wrongly)."""
    o = out.detach().cpu()
    bad = torch.isnan(o)
    if ref is not None:
        bad &= ~torch.isnan(ref.detach().cpu())
    n = int(bad.sum())
    if n:
        idx = tuple(bad.nonzero()[0].tolist())
        raise AssertionError(f"{n} of {o.numel()} output elements are NaN (unwritten?); first at {idx}")


def assert_gemm_close(out: torch.Tensor, ref: torch.Tensor, fmt: str, out_dtype: torch.dtype,
                      *, what: str = "") -> tuple[float, float]:
    """Assert ``out`` (dtype ``out_dtype``) matches the float64 reference within the table's
    thresholds; report both metrics and the reason on failure. Returns (rel_fro, norm_max)."""
    if out.dtype != out_dtype:
        raise AssertionError(f"{what} out dtype {out.dtype}, expected {out_dtype}")
    assert_no_nan_survivors(out, ref)
    tol = gemm_tolerance(fmt, out_dtype)
    lim_fro, lim_max = tol.rel_fro, tol.norm_max
    # (No bf16 allowance for the interpreter any more: its truncating fp32 -> bf16 cast is
    # worked around in the kernels' epilogues, kernels/triton/_interp.py::cast_out, so the
    # interpreter rounds to nearest like the GPU; tests/test_interpreter_numerics.py.)
    if out_dtype == torch.float32 and INTERPRET:
        lim_fro, lim_max = _FP32_EXACT_ACC  # see the _FP32 reason: no tensor-core accumulator here
    rel_fro, norm_max = gemm_errors(out, ref)
    if not (rel_fro <= lim_fro and norm_max <= lim_max):
        raise AssertionError(
            f"{what} {fmt}/{out_dtype}: rel_fro={rel_fro:.3e} (limit {lim_fro:.1e}), "
            f"norm_max={norm_max:.3e} (limit {lim_max:.1e}); shape {tuple(out.shape)}. "
            f"Threshold reason: {tol.reason}"
        )
    return rel_fro, norm_max
