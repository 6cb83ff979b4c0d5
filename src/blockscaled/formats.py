"""Block-scaled formats: one frozen descriptor per format, the single source of truth.

Every other module (quantizers, GEMMs, layout converters, the bench) reads element sizes,
block sizes, scale encodings and limits from here instead of repeating literals.

Exact definitions (docs/formats.md, "The four formats"):

============  ==============  =====================  ==========================================
format        data            scale                  block
============  ==============  =====================  ==========================================
fp8_block     e4m3fn          fp32                   1x128 activations, 128x128 weights
mxfp8         e4m3fn          E8M0 (uint8)           1x32
mxfp4         e2m1, 2/byte    E8M0 (uint8)           1x32
nvfp4         e2m1, 2/byte    e4m3fn                 1x16, plus an fp32 per-tensor global scale
============  ==============  =====================  ==========================================

Packed fp4 stores element ``2*i`` in the low nibble and ``2*i+1`` in the high nibble of byte
``i`` (OCP MX v1.0 and what cuBLAS / CUTLASS / torch.float4_e2m1fn_x2 expect). An odd last
dimension leaves the high nibble of the last byte zero.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

__all__ = [
    "Format",
    "ScaleRounding",
    "FP8_BLOCK",
    "MXFP8",
    "MXFP4",
    "NVFP4",
    "FORMATS",
    "get_format",
    "E4M3_MAX",
    "E2M1_MAX",
    "QuantizationRangeWarning",
]

#: Largest finite float8_e4m3fn value (S.1111.110 = 1.75 * 2**8).
E4M3_MAX = 448.0
#: Largest e2m1 value (S.11.1 = 1.5 * 2**2).
E2M1_MAX = 6.0


class QuantizationRangeWarning(UserWarning):
    """``quantize`` lost whole blocks to the range of a format's scales: nvfp4 blocks whose
    scale underflowed to 0 (they dequantize to all zeros; typically one outlier set the global
    scale) or saturated (their largest elements clip; a user-given global scale too large).
    See ``quantize(check_range=...)`` and docs/formats.md ("Range of nvfp4").
    ``warnings.simplefilter("error", QuantizationRangeWarning)`` turns it into an exception."""


class ScaleRounding(enum.Enum):
    """How a block's scale is derived from the block's absolute maximum ``amax``.

    ``elem_max`` is the largest value of the element type (448 for e4m3, 6 for e2m1) and
    ``emax_elem`` its largest exponent (8 for e4m3, 2 for e2m1).
    """

    EXACT = "exact"
    """``scale = max(amax / elem_max, 2**-126)`` in fp32 (fp8_block default; DeepSeek recipe).
    The floor at the smallest normal fp32 keeps zero and denormal blocks finite: their data
    is exactly zero (or the denormals scaled up) and their scale is 2**-126."""

    RCEIL = "rceil"
    """``scale = 2**ceil(log2(amax / elem_max))``: ``amax / elem_max`` in fp32, rounded *up*
    to a power of two (what cuBLAS, TransformerEngine and PTX ``cvt.rp.satfinite.ue8m0x2``
    do). The block maximum never saturates. For fp8_block this gives the UE8M0 power-of-two
    scales of DeepSeek-V3.1/DeepGEMM's ``ceil_to_ue8m0``. Default for MX formats: it never
    clips the largest element of a block, so it has lower error than FLOOR on real data."""

    FLOOR = "floor"
    """OCP MX v1.0: ``scale = 2**(floor(log2(amax)) - emax_elem)``. The top binade of the
    block may exceed ``elem_max`` after scaling and saturates to it. MX formats only."""

    NVFP4 = "nvfp4"
    """NVFP4 (TensorRT-LLM / ModelOpt / torchao): ``sf = e4m3_rn_satfinite(gs * amax16 / 6)``
    with ``gs = 448 * 6 / amax_tensor`` the fp32 global (encode) scale. NVFP4 only."""


@dataclass(frozen=True)
class Format:
    """Descriptor of one block-scaled format. Compare formats with ``is`` or ``==``."""

    name: str
    #: torch dtype of ``ScaledTensor.data`` (packed fp4 is ``torch.uint8``).
    data_dtype: torch.dtype
    #: element type name: "e4m3" or "e2m1".
    elem: str
    #: largest finite element value.
    elem_max: float
    #: exponent of the largest element (floor(log2(elem_max))), used by FLOOR rounding.
    elem_emax: int
    #: elements stored per byte of ``data`` (2 for packed fp4).
    elems_per_byte: int
    #: torch dtype of ``ScaledTensor.scale``; E8M0 is stored as ``torch.uint8`` (biased exponent).
    scale_dtype: torch.dtype
    #: "fp32", "e8m0" or "e4m3".
    scale_kind: str
    #: number of consecutive elements along K sharing a scale.
    block_k: int
    #: block shapes (rows, cols) that ``quantize`` accepts; the first is the default.
    blocks: tuple[tuple[int, int], ...]
    #: scale roundings this format accepts; the first is the default.
    roundings: tuple[ScaleRounding, ...]
    #: whether the format carries an fp32 per-tensor global scale.
    has_global_scale: bool

    @property
    def default_rounding(self) -> ScaleRounding:
        return self.roundings[0]

    @property
    def is_fp4(self) -> bool:
        return self.elem == "e2m1"

    @property
    def elem_bytes(self) -> float:
        """Bytes per element of ``data`` (0.5 for packed fp4)."""
        return 1.0 / self.elems_per_byte

    @property
    def scale_bytes(self) -> int:
        """Bytes per scale."""
        return self.scale_dtype.itemsize

    def packed_k(self, k: int) -> int:
        """Size of the last dimension of ``data`` for a logical last dimension ``k``."""
        return (k + self.elems_per_byte - 1) // self.elems_per_byte

    def scale_k(self, k: int) -> int:
        """Number of scale columns for a logical last dimension ``k`` (``ceil(k / block_k)``)."""
        return (k + self.block_k - 1) // self.block_k

    def __repr__(self) -> str:  # short: formats show up in many reprs
        return f"Format({self.name})"


FP8_BLOCK = Format(
    name="fp8_block",
    data_dtype=torch.float8_e4m3fn,
    elem="e4m3",
    elem_max=E4M3_MAX,
    elem_emax=8,
    elems_per_byte=1,
    scale_dtype=torch.float32,
    scale_kind="fp32",
    block_k=128,
    # (1, 128): activations (per token, per 128 channels); (128, 128): weights.
    blocks=((1, 128), (128, 128)),
    roundings=(ScaleRounding.EXACT, ScaleRounding.RCEIL),
    has_global_scale=False,
)

MXFP8 = Format(
    name="mxfp8",
    data_dtype=torch.float8_e4m3fn,
    elem="e4m3",
    elem_max=E4M3_MAX,
    elem_emax=8,
    elems_per_byte=1,
    scale_dtype=torch.uint8,
    scale_kind="e8m0",
    block_k=32,
    blocks=((1, 32),),
    roundings=(ScaleRounding.RCEIL, ScaleRounding.FLOOR),
    has_global_scale=False,
)

MXFP4 = Format(
    name="mxfp4",
    data_dtype=torch.uint8,
    elem="e2m1",
    elem_max=E2M1_MAX,
    elem_emax=2,
    elems_per_byte=2,
    scale_dtype=torch.uint8,
    scale_kind="e8m0",
    block_k=32,
    blocks=((1, 32),),
    roundings=(ScaleRounding.RCEIL, ScaleRounding.FLOOR),
    has_global_scale=False,
)

NVFP4 = Format(
    name="nvfp4",
    data_dtype=torch.uint8,
    elem="e2m1",
    elem_max=E2M1_MAX,
    elem_emax=2,
    elems_per_byte=2,
    scale_dtype=torch.float8_e4m3fn,
    scale_kind="e4m3",
    block_k=16,
    blocks=((1, 16),),
    roundings=(ScaleRounding.NVFP4,),
    has_global_scale=True,
)

FORMATS: dict[str, Format] = {f.name: f for f in (FP8_BLOCK, MXFP8, MXFP4, NVFP4)}


def get_format(fmt: str | Format, name: str = "fmt") -> Format:
    """Return the descriptor for a format name (any case: ``"nvfp4"``, ``"NVFP4"``) or
    descriptor; raise ValueError naming the argument ``name`` otherwise."""
    if isinstance(fmt, Format):
        return fmt
    if isinstance(fmt, str):
        f = FORMATS.get(fmt.strip().lower())
        if f is not None:
            return f
    raise ValueError(
        f"{name}: expected one of {sorted(FORMATS)} (any case) or a blockscaled.Format, got {fmt!r}"
        + ("" if isinstance(fmt, str) else f" ({type(fmt).__name__})")
    )
