"""Argument validation shared by the ops and their reference twins.

Every check raises with the argument's name, what was expected and what came, so that bad
input never reaches a kernel.
"""

from __future__ import annotations

import os

import torch

from .formats import Format, ScaleRounding, get_format

FLOAT_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

#: Triton's interpreter is chosen when kernels are defined (TRITON_INTERPRET=1 at import).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_reference(t: torch.Tensor) -> bool:
    """True when ``t`` lives on the CPU and the Triton interpreter is off: compiled Triton
    kernels cannot read host memory, so public ops run their pure-torch reference twin
    instead (bit-identical for the quantizers by definition; float64-accurate for GEMMs)."""
    return t.device.type == "cpu" and not INTERPRET


def check_tensor(
    name: str,
    t,
    *,
    dtypes: tuple[torch.dtype, ...] | None = None,
    min_ndim: int | None = None,
    ndim: int | None = None,
    device: torch.device | None = None,
) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if ndim is not None and t.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if min_ndim is not None and t.ndim < min_ndim:
        raise ValueError(f"{name}: expected at least {min_ndim} dimension(s), got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device}, got one on {t.device}")


def check_row_contiguous(name: str, t: torch.Tensor) -> None:
    """Kernels read rows with unit stride; leading dims must flatten without a copy."""
    if t.numel() == 0:
        return
    if t.stride(-1) != 1 and t.shape[-1] != 1:
        raise ValueError(
            f"{name}: the last dimension must have stride 1 (got strides {t.stride()}); "
            f"call .contiguous() explicitly if a copy is acceptable"
        )
    if t.ndim > 2:
        try:
            t.view(-1, t.shape[-1])
        except RuntimeError:
            raise ValueError(
                f"{name}: leading dimensions of shape {tuple(t.shape)} with strides {t.stride()} "
                f"cannot be flattened without a copy; call .contiguous() explicitly"
            ) from None


def resolve_quantize_args(
    x,
    fmt: str | Format,
    block: tuple[int, int] | None,
    rounding: ScaleRounding | str | None,
    global_scale,
) -> tuple[Format, tuple[int, int], ScaleRounding]:
    """Validate ``quantize`` arguments; return the resolved (format, block, rounding)."""
    f = get_format(fmt)
    check_tensor("x", x, dtypes=FLOAT_INPUT_DTYPES, min_ndim=1)
    if block is None:
        block = f.blocks[0]
    block = tuple(int(b) for b in block)
    if block not in f.blocks:
        raise ValueError(f"block: {f.name} allows {list(f.blocks)}, got {block}")
    if block[0] > 1 and x.ndim < 2:
        raise ValueError(f"block: {block} needs x with at least 2 dimensions, got shape {tuple(x.shape)}")
    if rounding is None:
        rounding = f.default_rounding
    elif isinstance(rounding, str):
        try:
            rounding = ScaleRounding(rounding.lower())
        except ValueError:
            raise ValueError(
                f"rounding: expected one of {[r.value for r in f.roundings]}, got {rounding!r}"
            ) from None
    if rounding not in f.roundings:
        raise ValueError(
            f"rounding: {f.name} allows {[r.name for r in f.roundings]}, got {rounding.name}"
        )
    if global_scale is not None:
        if not f.has_global_scale:
            raise ValueError(f"global_scale: {f.name} has no global scale, got {global_scale!r}")
        if isinstance(global_scale, torch.Tensor):
            check_tensor("global_scale", global_scale, dtypes=(torch.float32,), device=x.device)
            if global_scale.numel() != 1:
                raise ValueError(
                    f"global_scale: expected 1 element, got shape {tuple(global_scale.shape)}"
                )
        elif not isinstance(global_scale, (int, float)):
            raise TypeError(
                f"global_scale: expected a float or a 1-element fp32 tensor, got {type(global_scale).__name__}"
            )
    check_row_contiguous("x", x)
    return f, block, rounding


def as_global_scale(global_scale, device: torch.device) -> torch.Tensor:
    """A user-given global scale as a 0-d fp32 tensor on ``device``."""
    if isinstance(global_scale, torch.Tensor):
        return global_scale.reshape(()).to(torch.float32)
    return torch.tensor(float(global_scale), dtype=torch.float32, device=device)
