"""Switches for the MX / NV kernels whose GPU checks are recent (``BLOCKSCALED_MX_KERNELS``,
read once, at import):

* ``gemv``: the MX / NV decode GEMV (kernels/triton/mx_gemv.py) for MX/NV dense GEMMs at small M
  (plan/mx_gemv.py, ``MX_GEMV_ROWS``). **On by default** since the fifteenth session: its
  tests passed on an H100 and its rows in ``bench --suite mx`` / scripts/sweeps/mx_decode.py on
  an H200 were checked against float64 (benchmarks/NOTES.md, fifteenth session).
* ``bf16``: the portable kernel's in-register MX/NV dequantization straight to bf16
  (kernels/triton/_mma.py: fp4 bit patterns, packed ``fma.rn.bf16x2`` scale multiplies) and the
  planner's MX/NV bf16-tile rules for 8 < M <= 512 (plan/portable.py, ``MX_BF16_*``). Off by
  default: correct on the GPU, but its tile rules lost to the previous plan on 6 of 13 sweep rows
  and no tile beat cuBLAS bf16 at M = 16 (same NOTES entry).
* ``stream``: the sm_90 streaming kernel (kernels/hopper/stream.py) for mxfp4 / nvfp4 (and,
  where it measured faster, mxfp8) weights at M <= 64, weight-only or W x A, dense and grouped
  (plan/stream.py). **On by default**: its GPU tests and every row of ``bench --suite mx`` passed
  the float64 checks on an H200.
* ``tiled``: the sm_90 tiled kernels (kernels/hopper/tiled.py; tiled_rs.py for mxfp4 / nvfp4 on
  256-token tiles) for mxfp4 / nvfp4 / mxfp8 weights
  with bf16 or quantized activations at M > 64, where its cost model predicts it faster than the
  portable kernel or dequantize + cuBLAS (plan/tiled.py). **On by default**: its GPU tests and A/B
  rows passed the float64 checks on an H200 (benchmarks/NOTES.md, twentieth session).
* ``direct``: the sm_90 register-streaming decode kernel (kernels/hopper/direct.py) for mxfp4 /
  nvfp4 weights with bf16 activations at 2 <= M <= 8 (plan/direct.py). **On by default**: its A/B
  rows and corner checks passed the float64 checks on an H200 (benchmarks/NOTES.md,
  twenty-second session).
* ``all`` (or ``1``): all five; ``none`` (or ``0``): none. Comma lists work:
  ``BLOCKSCALED_MX_KERNELS=gemv,bf16``. Unset: ``gemv,stream,tiled,direct``.
"""

from __future__ import annotations

import os

__all__ = ["MX_KERNELS", "mx_kernel_enabled"]


_NAMES = frozenset({"gemv", "bf16", "stream", "tiled", "direct"})


def _parse(value: str) -> frozenset[str]:
    parts = {p.strip().lower() for p in value.split(",") if p.strip()}
    if parts & {"1", "all", "on", "true"}:
        return frozenset(_NAMES)
    unknown = parts - _NAMES - {"0", "off", "false", "none"}
    if unknown:
        raise ValueError(f"BLOCKSCALED_MX_KERNELS: expected 'all', 'gemv', 'bf16', 'stream', 'tiled', 'direct' or a comma "
                         f"list of them, got {value!r}")
    return frozenset(parts & _NAMES)


#: the experimental kernels switched on in this process
MX_KERNELS: frozenset[str] = _parse(os.environ.get("BLOCKSCALED_MX_KERNELS", "gemv,stream,tiled,direct"))


def mx_kernel_enabled(name: str) -> bool:
    """Whether the experimental kernel ``name`` ("gemv", "bf16", "stream", "tiled" or "direct") is on in this process."""
    return name in MX_KERNELS
