"""Kernels that are built and tested on the CPU but have not yet run on a GPU: off by default.

``BLOCKSCALED_MX_KERNELS`` (read once, at import) switches them on, for the GPU checks that must
pass before they become the default (benchmarks/NOTES.md, thirteenth session, says which):

* ``gemv``: the MX / NV decode GEMV (kernels/triton/mx_gemv.py) for MX/NV dense GEMMs at M <= 8
  (plan/mx_gemv.py);
* ``bf16``: the portable kernel's in-register MX/NV dequantization straight to bf16
  (kernels/triton/_mma.py: fp4 bit patterns, packed ``fma.rn.bf16x2`` scale multiplies) and the
  planner's MX/NV bf16-tile rules for 8 < M <= 512 (plan/portable.py, ``MX_BF16_*``);
* ``all`` (or ``1``): both. Comma-separated lists work: ``BLOCKSCALED_MX_KERNELS=gemv,bf16``.

Why off: both decode packed e2m1 with inline PTX whose results were checked only against an
emulation of the PTX and in the Triton interpreter (which runs the portable integer decode
instead); a wrong decode on the GPU would be a silent wrong answer.
"""

from __future__ import annotations

import os

__all__ = ["MX_KERNELS", "mx_kernel_enabled"]


def _parse(value: str) -> frozenset[str]:
    parts = {p.strip().lower() for p in value.split(",") if p.strip()}
    if parts & {"1", "all", "on", "true"}:
        return frozenset({"gemv", "bf16"})
    unknown = parts - {"gemv", "bf16", "0", "off", "false", "none"}
    if unknown:
        raise ValueError(f"BLOCKSCALED_MX_KERNELS: expected 'all', 'gemv', 'bf16' or a comma list of them, got "
                         f"{value!r}")
    return frozenset(parts & {"gemv", "bf16"})


#: the experimental kernels switched on in this process
MX_KERNELS: frozenset[str] = _parse(os.environ.get("BLOCKSCALED_MX_KERNELS", ""))


def mx_kernel_enabled(name: str) -> bool:
    """Whether the experimental kernel ``name`` ("gemv" or "bf16") is on in this process."""
    return name in MX_KERNELS
