"""ScaledTensor: the frozen container every quantizer returns and every GEMM takes."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ._checks import resolve_block, resolve_rounding
from .formats import Format, ScaleRounding, get_format

#: Instance attribute (outside the dataclass fields) holding the float tensor a ScaledTensor was
#: quantized from, when that one requires grad: its straight-through gradient link (ops/_autograd.py).
GRAD_SOURCE_ATTR = "_grad_source"

__all__ = ["ScaledTensor", "scale_shape"]


def scale_shape(shape: tuple[int, ...], fmt: Format, block: tuple[int, int]) -> tuple[int, ...]:
    """Canonical scale shape for a logical ``shape`` quantized with ``block``.

    ``(1, bk)`` blocks: ``shape[:-1] + (ceil(K / bk),)`` (row-major, one row per data row).
    ``(128, 128)`` blocks: ``shape[:-2] + (ceil(R / 128), ceil(K / 128))``.
    """
    br, bk = block
    k = shape[-1]
    if br == 1:
        return (*shape[:-1], (k + bk - 1) // bk)
    r = shape[-2]
    return (*shape[:-2], (r + br - 1) // br, (k + bk - 1) // bk)


@dataclass(frozen=True, repr=False)
class ScaledTensor:
    """A block-scaled tensor: quantized ``data`` plus per-block ``scale`` (not a Tensor subclass).

    Fields
    ------
    data: ``[..., K]`` float8_e4m3fn for fp8_block/mxfp8; ``[..., ceil(K/2)]`` uint8 for
        mxfp4/nvfp4 (two e2m1 codes per byte, element ``2i`` in the low nibble).
    scale: canonical row-major layout, see :func:`scale_shape`. fp32 for fp8_block, uint8
        biased E8M0 exponents for MX formats (value ``2**(s - 127)``, 255 = NaN),
        float8_e4m3fn for nvfp4.
    format: the :class:`~blockscaled.formats.Format` descriptor (the constructor also takes
        its name, any case).
    shape: logical (unpacked) shape, ``torch.Size`` (the constructor takes any sequence of ints).
    block: ``(rows, cols)`` sharing one scale: ``(1, block_k)`` or ``(128, 128)`` (a tuple; the
        constructor also takes a 2-element list).
    rounding: how the scales were chosen (:class:`~blockscaled.formats.ScaleRounding`; the
        constructor also takes its value, any case); one the format allows.
    global_scale: nvfp4 only: 0-d fp32 tensor ``gs`` on the data's device, the *encode*
        scale; ``dequantize = e2m1 * sf / gs``.
    """

    data: torch.Tensor
    scale: torch.Tensor
    format: Format
    shape: torch.Size
    block: tuple[int, int]
    rounding: ScaleRounding
    global_scale: torch.Tensor | None = None

    def __post_init__(self) -> None:
        # Normalise the spellings ``quantize`` accepts (format / rounding names in any case, a
        # block list, any sequence of ints as shape); reject the rest with the field's name.
        # (the ops build ScaledTensors on every call with canonical fields: those skip the work)
        fmt = self.format if isinstance(self.format, Format) else get_format(self.format, name="ScaledTensor.format")
        object.__setattr__(self, "format", fmt)
        for name in ("data", "scale"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"ScaledTensor.{name}: expected a torch.Tensor, got {type(t).__name__}")
        try:
            if isinstance(self.shape, (str, bytes, torch.Tensor)):
                raise TypeError
            shape = self.shape if isinstance(self.shape, torch.Size) else torch.Size(self.shape)
        except TypeError:
            raise TypeError(
                f"ScaledTensor.shape: expected the logical shape as a torch.Size or tuple of ints, got "
                f"{self.shape!r} ({type(self.shape).__name__})"
            ) from None
        object.__setattr__(self, "shape", shape)
        if not (type(self.block) is tuple and all(type(b) is int for b in self.block) and self.block in fmt.blocks):
            object.__setattr__(self, "block", resolve_block("ScaledTensor.block", self.block, fmt))
        if not (isinstance(self.rounding, ScaleRounding) and self.rounding in fmt.roundings):
            object.__setattr__(self, "rounding", resolve_rounding("ScaledTensor.rounding", self.rounding, fmt))
        if len(shape) < 1:
            raise ValueError(f"ScaledTensor.shape: expected at least 1 dimension, got {tuple(shape)}")
        if self.data.dtype != fmt.data_dtype:
            raise ValueError(
                f"ScaledTensor.data: expected dtype {fmt.data_dtype} for {fmt.name}, got {self.data.dtype}"
            )
        want = (*shape[:-1], fmt.packed_k(shape[-1]))
        if tuple(self.data.shape) != want:
            raise ValueError(
                f"ScaledTensor.data: expected shape {want} for logical shape {tuple(shape)} "
                f"in {fmt.name}, got {tuple(self.data.shape)}"
            )
        if self.block[0] > 1 and len(shape) < 2:
            raise ValueError(f"ScaledTensor.block: {self.block} needs a tensor of rank >= 2")
        if self.scale.dtype != fmt.scale_dtype:
            raise ValueError(
                f"ScaledTensor.scale: expected dtype {fmt.scale_dtype} for {fmt.name}, got {self.scale.dtype}"
            )
        want_s = scale_shape(tuple(shape), fmt, self.block)
        if tuple(self.scale.shape) != want_s:
            raise ValueError(
                f"ScaledTensor.scale: expected shape {want_s}, got {tuple(self.scale.shape)}"
            )
        if self.scale.device != self.data.device:
            raise ValueError(
                f"ScaledTensor.scale: on {self.scale.device}, data on {self.data.device}"
            )
        gs = self.global_scale
        if gs is not None and not isinstance(gs, torch.Tensor):
            raise TypeError(
                f"ScaledTensor.global_scale: expected None or a 1-element fp32 torch.Tensor, got "
                f"{type(gs).__name__} (a float: torch.tensor(gs, dtype=torch.float32, device=data.device))"
            )
        if fmt.has_global_scale:
            if gs is None or gs.dtype != torch.float32 or gs.numel() != 1:
                raise ValueError(
                    f"ScaledTensor.global_scale: {fmt.name} needs a 1-element fp32 tensor, got "
                    f"{None if gs is None else (gs.dtype, tuple(gs.shape))}"
                )
            if gs.device != self.data.device:
                raise ValueError(
                    f"ScaledTensor.global_scale: on {gs.device}, data on {self.data.device}"
                )
        elif self.global_scale is not None:
            raise ValueError(f"ScaledTensor.global_scale: {fmt.name} has no global scale")

    @classmethod
    def _trusted(cls, data, scale, fmt: Format, shape: torch.Size, block: tuple[int, int], rounding: ScaleRounding,
                 global_scale=None) -> "ScaledTensor":
        """A ScaledTensor from fields an op has just made consistent (canonical types, shapes and
        dtypes as :meth:`__post_init__` would check them), without checking them again: the checks
        cost ~6 us of an eager quantize call's host time (CPU, this repository's benchmark), and
        the op's own validation of its inputs already guarantees them. Not for user input."""
        obj = object.__new__(cls)
        obj.__dict__.update(data=data, scale=scale, format=fmt, shape=shape, block=block, rounding=rounding,
                            global_scale=global_scale)
        return obj

    # --- tensor-like conveniences -------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "ScaledTensor":
        """Move data, scale and global scale to ``device`` (a new ScaledTensor). The copy keeps
        the straight-through gradient link to the float tensor ``quantize`` made it from
        (docs/errors.md); ``dataclasses.replace`` does not."""
        gs = self.global_scale
        moved = replace(
            self,
            data=self.data.to(device, non_blocking=non_blocking),
            scale=self.scale.to(device, non_blocking=non_blocking),
            global_scale=None if gs is None else gs.to(device, non_blocking=non_blocking),
        )
        return self._with_grad_source(moved)

    def cuda(self) -> "ScaledTensor":
        return self.to("cuda")

    def cpu(self) -> "ScaledTensor":
        return self.to("cpu")

    def contiguous(self) -> "ScaledTensor":
        """Data and scale as contiguous tensors (a copy only where one is a strided view, e.g. the
        gate rows of a stacked ``[E, 2I, K]`` weight): what the ops need, which copy nothing
        themselves. Example: ``experts.w_gate.contiguous().dequantize()``."""
        if self.data.is_contiguous() and self.scale.is_contiguous():
            return self
        return self._with_grad_source(replace(self, data=self.data.contiguous(), scale=self.scale.contiguous()))

    def _with_grad_source(self, copy: "ScaledTensor") -> "ScaledTensor":
        """``copy`` (a new ScaledTensor of the same values) with this one's straight-through link to
        the float tensor ``quantize`` made it from, which ``dataclasses.replace`` drops."""
        src = getattr(self, GRAD_SOURCE_ATTR, None)
        if src is not None:
            object.__setattr__(copy, GRAD_SOURCE_ATTR, src)
        return copy

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``data * scale`` (and ``/ global_scale`` for nvfp4) as a ``dtype`` tensor of ``shape``."""
        # Local: import cycle tensor -> ops.quantize -> ops._autograd -> tensor.
        from .ops.quantize import dequantize

        return dequantize(self, dtype=dtype)

    def nbytes(self) -> int:
        """Bytes of data, scales and global scale (what a kernel reading this tensor moves)."""
        n = self.data.numel() * self.data.element_size() + self.scale.numel() * self.scale.element_size()
        return n + (4 if self.global_scale is not None else 0)

    def __repr__(self) -> str:
        gs = ""
        if self.global_scale is not None:
            gs = f", global_scale=<{self.global_scale.dtype} on {self.global_scale.device}>"
        return (
            f"ScaledTensor({self.format.name}, shape={tuple(self.shape)}, block={self.block}, "
            f"rounding={self.rounding.name}, data={self.data.dtype}{tuple(self.data.shape)}, "
            f"scale={self.scale.dtype}{tuple(self.scale.shape)}, device={self.device}{gs})"
        )
