"""Shared helpers of the checkpoint converters: key lookup and the checks every loader runs.

Every check raises with the checkpoint key it is about, what was expected and what came, so a
malformed checkpoint fails at the tensor that is wrong rather than inside a kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch

from .._checks import resolve_rounding
from ..formats import MXFP4, Format, ScaleRounding
from ..tensor import ScaledTensor

__all__ = ["LoadedWeight"]

#: torch's E8M0 dtype where this torch has it (same bits as our uint8 E8M0 codes).
E8M0_DTYPE = getattr(torch, "float8_e8m0fnu", None)


class LoadedWeight(NamedTuple):
    """A weight loaded from a checkpoint layout that may also carry a static activation scale.

    ``weight``: the :class:`~blockscaled.ScaledTensor`.
    ``input_global_scale``: 0-d fp32 tensor on the weight's device, or ``None`` when the
    checkpoint has none. It is in *our* convention, the nvfp4 *encode* scale of the
    activations (``bs.quantize(x, "nvfp4", global_scale=input_global_scale)``); each loader
    states how it is derived from what the layout stores.
    """

    weight: ScaledTensor
    input_global_scale: torch.Tensor | None = None


def key(prefix: str, name: str) -> str:
    """``prefix.name`` (just ``name`` for an empty prefix)."""
    return f"{prefix}.{name}" if prefix else name


def check_prefix(prefix) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"prefix: expected a str (module path such as 'model.layers.0.mlp.down_proj'), "
                        f"got {type(prefix).__name__}")
    return prefix


class _SafeOpenView(Mapping):
    """Mapping view of a ``safetensors.safe_open`` handle: tensors are read on access."""

    def __init__(self, handle):
        self._h = handle
        self._keys = list(handle.keys())
        self._set = set(self._keys)

    def __getitem__(self, k):
        if k not in self._set:
            raise KeyError(k)
        return self._h.get_tensor(k)

    def __contains__(self, k):
        return k in self._set

    def __iter__(self):
        return iter(self._keys)

    def __len__(self):
        return len(self._keys)


def as_mapping(tensors) -> Mapping:
    """Accept a ``dict``-like mapping of names to tensors or a ``safetensors.safe_open`` handle."""
    if isinstance(tensors, Mapping):
        return tensors
    if hasattr(tensors, "get_tensor") and hasattr(tensors, "keys"):
        return _SafeOpenView(tensors)
    raise TypeError(
        f"tensors: expected a mapping of checkpoint names to torch.Tensor (a state dict, "
        f"safetensors.torch.load_file's result) or a safetensors.safe_open handle, got {type(tensors).__name__}"
    )


def _nearby(tensors: Mapping, k: str) -> list[str]:
    """Keys sharing ``k``'s module path, to show in a missing-key error."""
    stem = k.rsplit(".", 1)[0] if "." in k else ""
    near = sorted(n for n in tensors if isinstance(n, str) and (n.startswith(stem + ".") if stem else "." not in n))
    return near[:12]


def get(tensors: Mapping, k: str, what: str) -> torch.Tensor:
    """``tensors[k]`` as a tensor; KeyError naming ``k``, ``what`` it should hold and the keys
    that are there under the same module path."""
    if k not in tensors:
        near = _nearby(tensors, k)
        raise KeyError(
            f"{k}: missing, expected {what}; keys under that module path: {near if near else 'none'}"
        )
    t = tensors[k]
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{k}: expected a torch.Tensor ({what}), got {type(t).__name__}")
    return t


def check_dtype(k: str, t: torch.Tensor, dtypes, what: str) -> None:
    dtypes = tuple(d for d in dtypes if d is not None)
    if t.dtype not in dtypes:
        want = dtypes[0] if len(dtypes) == 1 else [str(d) for d in dtypes]
        raise TypeError(f"{k}: expected dtype {want} ({what}), got {t.dtype}")


def check_shape(k: str, t: torch.Tensor, want: tuple[int, ...], what: str) -> None:
    if tuple(t.shape) != tuple(want):
        raise ValueError(f"{k}: expected shape {tuple(want)} ({what}), got {tuple(t.shape)}")


def check_min_ndim(k: str, t: torch.Tensor, n: int, what: str) -> None:
    if t.ndim < n:
        raise ValueError(f"{k}: expected at least {n} dimensions ({what}), got shape {tuple(t.shape)}")


def scalar_fp32(k: str, t: torch.Tensor, what: str, device) -> torch.Tensor:
    """A 1-element fp32 checkpoint tensor (shape ``[]`` or ``[1]``) as a 0-d tensor on ``device``."""
    check_dtype(k, t, (torch.float32,), what)
    if t.numel() != 1:
        raise ValueError(f"{k}: expected a single value, shape [] or [1] ({what}), got shape {tuple(t.shape)}")
    return t.reshape(()).to(device)


def e8m0_codes(k: str, t: torch.Tensor, what: str) -> torch.Tensor:
    """E8M0 scales as our uint8 codes: uint8 as is, ``torch.float8_e8m0fnu`` viewed (same bits)."""
    check_dtype(k, t, (torch.uint8, E8M0_DTYPE), what)
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def reciprocal(x: torch.Tensor) -> torch.Tensor:
    """fp32 ``1 / x``, one IEEE division (torch.reciprocal is not guaranteed correctly rounded)."""
    return torch.div(torch.ones_like(x, dtype=torch.float32), x.float())


def check_scaled(name: str, w, fmts: tuple[str, ...], blocks=None) -> ScaledTensor:
    if not isinstance(w, ScaledTensor):
        raise TypeError(f"{name}: expected a blockscaled.ScaledTensor, got {type(w).__name__}")
    if w.format.name not in fmts:
        raise ValueError(f"{name}: expected a ScaledTensor in {' or '.join(fmts)}, got {w.format.name}")
    if blocks is not None and w.block not in blocks:
        raise ValueError(f"{name}: expected block {' or '.join(map(str, blocks))} for this layout, got {w.block}")
    if w.ndim < 2:
        raise ValueError(f"{name}: expected a weight of rank >= 2 ([..., N, K]), got shape {tuple(w.shape)}")
    return w


def fp4_logical_k(k_key: str, layout_k: int, k, data: torch.Tensor) -> int:
    """The logical K of packed fp4 ``data`` whose layout holds ``layout_k`` elements per row.

    ``k=None``: ``layout_k``. Otherwise ``0 < k <= layout_k`` and every code beyond column ``k``
    must be zero: the columns a layout pads with (a wrong ``k`` would otherwise silently drop
    weights). The caller cuts the data with :func:`trim_fp4` and the scales to ``ceil(k / B)``."""
    if k is None:
        return layout_k
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k: expected an int (the logical K) or None, got {type(k).__name__}")
    if not 0 < k <= layout_k:
        raise ValueError(f"k: expected 1..{layout_k} (the {layout_k} columns {k_key} holds), got {k}")
    if k < layout_k:
        tail = data[..., k // 2:]
        bad = bool((tail[..., 0] >> 4).any()) or bool(tail[..., 1:].any()) if k % 2 else bool(tail.any())
        if bad:
            raise ValueError(
                f"{k_key}: k={k} leaves nonzero fp4 codes beyond column {k} (of {layout_k}); those columns "
                f"must be zero padding, so k is not this weight's K"
            )
    return k


def trim_fp4(data: torch.Tensor, k: int) -> torch.Tensor:
    """Packed fp4 bytes cut to ``ceil(k/2)`` per row (``fp4_logical_k`` has checked that what is
    cut, and an odd K's last high nibble, are zero, as ``ScaledTensor`` stores them)."""
    return data[..., : -(-k // 2)].contiguous()


def pad_last(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` zero-padded along the last dimension to ``n`` (itself when already ``n`` wide)."""
    if t.shape[-1] == n:
        return t
    return torch.nn.functional.pad(t, (0, n - t.shape[-1]))


def make(data, scale, fmt: Format, shape, block, rounding, gs=None) -> ScaledTensor:
    return ScaledTensor(data.contiguous(), scale.contiguous(), fmt, torch.Size(shape), block,
                        rounding if rounding is not None else fmt.default_rounding, global_scale=gs)


def resolve_mx_rounding(rounding) -> ScaleRounding:
    """MX checkpoints do not record how their E8M0 exponents were chosen: RCEIL unless told."""
    if rounding is None:
        return ScaleRounding.RCEIL
    return resolve_rounding("rounding", rounding, MXFP4)
