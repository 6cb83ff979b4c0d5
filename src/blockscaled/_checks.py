"""Argument validation shared by the ops and their reference twins.

Every check raises with the argument's name, what was expected and what came, so that bad
input never reaches a kernel.
"""

from __future__ import annotations

import math
import numbers
import operator
import os
import warnings

import torch
import triton

from .config.gemm import GemmConfig
from .config.hopper import HopperConfig
from .formats import Format, QuantizationRangeWarning, ScaleRounding, get_format
from .kernels.triton._interp import INTERPRETING as _KERNELS_INTERPRETED

FLOAT_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: output dtypes of every GEMM-family op (the epilogue casts fp32 accumulators to one of these)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

#: Whether this package's Triton kernels run in Triton's interpreter. Triton decides that
#: when a kernel is *defined* (``triton.jit`` reads TRITON_INTERPRET then), i.e. when
#: blockscaled is imported: this is what it decided (kernels/triton/_interp.py::INTERPRETING).
#: Tests monkeypatch it to False to send CPU tensors to the reference twins.
INTERPRET = bool(_KERNELS_INTERPRETED)

try:  # what Triton itself reads (TRITON_INTERPRET, or triton.knobs.runtime.interpret = ...)
    _RUNTIME_KNOBS = triton.knobs.runtime
except AttributeError:  # pragma: no cover - triton without knobs
    _RUNTIME_KNOBS = None


#: The last TRITON_INTERPRET value found to agree with the kernels' mode (the fast path).
_SEEN_OK: str | None | object = object()


def _interpret_requested() -> bool:
    if _RUNTIME_KNOBS is not None:
        return bool(_RUNTIME_KNOBS.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def check_interpret_mode() -> None:
    """Raise if TRITON_INTERPRET now disagrees with the mode the kernels were defined in.

    Setting (or clearing) TRITON_INTERPRET after ``import blockscaled`` has no effect on the
    kernels, which Triton built at import; before this check such a change was silently
    ignored. Read at every op call: one environment lookup while the value is the one seen
    last (~0.5 us), Triton's own parsing of it when it changed."""
    global _SEEN_OK
    if torch.compiler.is_compiling():  # traced: the eager calls around it check it
        return
    raw = os.environ.get("TRITON_INTERPRET")
    if raw == _SEEN_OK:
        return
    if _interpret_requested() == _KERNELS_INTERPRETED:
        _SEEN_OK = raw  # e.g. "1" -> "true": the same mode
        return
    if _KERNELS_INTERPRETED:
        was = "defined for Triton's interpreter (TRITON_INTERPRET was set at import)"
        fix = "unset TRITON_INTERPRET before importing blockscaled to use compiled kernels"
    else:
        was = "compiled, not interpreted (TRITON_INTERPRET was not set at import)"
        fix = ("set TRITON_INTERPRET=1 in the environment before blockscaled (or anything that "
               "imports it) is first imported, e.g. `TRITON_INTERPRET=1 python script.py`")
    raise RuntimeError(
        f"TRITON_INTERPRET: expected the value the kernels were defined with, got "
        f"TRITON_INTERPRET={raw!r} now, but blockscaled's Triton kernels were {was}. Triton "
        f"chooses interpreter or compiler once, when a kernel is defined, i.e. at "
        f"`import blockscaled`; changing it afterwards has no effect. To change mode, {fix}."
    )


def use_reference(t: torch.Tensor) -> bool:
    """True when ``t`` lives on the CPU and the Triton interpreter is off: compiled Triton
    kernels cannot read host memory, so public ops run their pure-torch reference twin
    instead (bit-identical for the quantizers by definition; float64-accurate for GEMMs).

    Every public op calls this first, so it also checks that TRITON_INTERPRET still says
    what it said when the kernels were defined (:func:`check_interpret_mode`)."""
    check_interpret_mode()
    return t.device.type == "cpu" and not INTERPRET


def check_size(name: str, value, minimum: int = 0) -> int:
    """``value`` as a Python int >= ``minimum`` (ints and integer scalars; not bool, float, str)."""
    if isinstance(value, bool):
        ok = False
    else:
        try:
            value = operator.index(value)
            ok = True
        except TypeError:
            ok = False
    want = "a non-negative int" if minimum == 0 else f"an int >= {minimum}"
    if not ok:
        raise TypeError(f"{name}: expected {want}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name}: expected {want}, got {value}")
    return value


def resolve_block(name: str, block, f: Format) -> tuple[int, int]:
    """A ``(rows, cols)`` block of format ``f`` (None: the format's default, ``f.blocks[0]``).

    Tuples and lists of two ints are accepted; nothing else is guessed: an int is ambiguous
    (fp8_block has 1x128 activation and 128x128 weight blocks) and strings like "1x128" are
    not a spelling we document."""
    if block is None:
        return f.blocks[0]
    allowed = [tuple(b) for b in f.blocks]
    if not isinstance(block, (tuple, list, torch.Size)) or len(block) != 2 or not all(
        isinstance(b, numbers.Integral) and not isinstance(b, bool) for b in block
    ):
        raise TypeError(
            f"{name}: expected a (rows, cols) tuple of ints, one of {allowed} for {f.name}, got "
            f"{block!r} ({type(block).__name__})"
        )
    block = (int(block[0]), int(block[1]))
    if block not in f.blocks:
        raise ValueError(f"{name}: {f.name} allows {allowed}, got {block}")
    return block


def resolve_rounding(name: str, rounding, f: Format) -> ScaleRounding:
    """A :class:`ScaleRounding` from the enum or its value / name in any case (None: the
    format's default), checked against the roundings ``f`` allows."""
    if rounding is None:
        return f.default_rounding
    if isinstance(rounding, str):
        try:
            rounding = ScaleRounding(rounding.strip().lower())
        except ValueError:
            raise ValueError(
                f"{name}: expected one of {[r.value for r in f.roundings]} for {f.name} (any case) or a "
                f"blockscaled.ScaleRounding, got {rounding!r}"
            ) from None
    elif not isinstance(rounding, ScaleRounding):
        raise TypeError(
            f"{name}: expected a blockscaled.ScaleRounding or one of {[r.value for r in f.roundings]} for "
            f"{f.name}, got {rounding!r} ({type(rounding).__name__})"
        )
    if rounding not in f.roundings:
        raise ValueError(f"{name}: {f.name} allows {[r.name for r in f.roundings]}, got {rounding.name}")
    return rounding


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
    block = resolve_block("block", block, f)
    if block[0] > 1 and x.ndim < 2:
        raise ValueError(f"block: {block} needs x with at least 2 dimensions, got shape {tuple(x.shape)}")
    rounding = resolve_rounding("rounding", rounding, f)
    if global_scale is not None:
        if not f.has_global_scale:
            raise ValueError(f"global_scale: {f.name} has no global scale, got {global_scale!r}")
        check_global_scale(global_scale, x.device)
    check_row_contiguous("x", x)
    return f, block, rounding


def check_global_scale(global_scale, device: torch.device) -> None:
    """A user-given nvfp4 encode scale must be finite and > 0 (``gs = 448 * 6 / amax`` maps the
    tensor's amax onto the top of the e4m3 x e2m1 range; inf gave all zeros, 0 / NaN all NaN,
    a negative one flipped nothing visibly). Checked here where that costs no host sync: a
    Python number, or a tensor on the CPU (read directly). A CUDA tensor is not read back: the
    quantize kernel turns a bad value into NaN scales, so the result dequantizes to all NaN."""
    if isinstance(global_scale, torch.Tensor):
        check_tensor("global_scale", global_scale, dtypes=(torch.float32,), device=device)
        if global_scale.numel() != 1:
            raise ValueError(f"global_scale: expected 1 element, got shape {tuple(global_scale.shape)}")
        if global_scale.device.type != "cpu":
            return
        value = float(global_scale.reshape(()))
    elif isinstance(global_scale, numbers.Real) and not isinstance(global_scale, bool):
        value = float(global_scale)
    else:
        raise TypeError(
            f"global_scale: expected a float or a 1-element fp32 tensor, got {type(global_scale).__name__}"
        )
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"global_scale: expected a finite value > 0 (the nvfp4 encode scale, 448 * 6 / amax(|x|) "
            f"for a tensor of amax(|x|)), got {value!r}"
        )


def as_global_scale(global_scale, device: torch.device) -> torch.Tensor:
    """A user-given global scale as a 0-d fp32 tensor on ``device``."""
    if isinstance(global_scale, torch.Tensor):
        if global_scale.numel() != 1:
            raise ValueError(f"global_scale: expected 1 element, got shape {tuple(global_scale.shape)}")
        return global_scale.reshape(()).to(torch.float32)
    if not isinstance(global_scale, numbers.Real) or isinstance(global_scale, bool):
        raise TypeError(
            f"global_scale: expected a float or a 1-element fp32 tensor, got {type(global_scale).__name__}"
        )
    return torch.tensor(float(global_scale), dtype=torch.float32, device=device)


def check_flag(name: str, value, *, allow_none: bool = False) -> None:
    """``value`` must be a bool (or None when ``allow_none``)."""
    if value is None and allow_none:
        return
    if not isinstance(value, bool):
        want = "True, False or None" if allow_none else "True or False"
        raise TypeError(f"{name}: expected {want}, got {value!r} ({type(value).__name__})")


def warn_quantize_range(x: torch.Tensor, q, check_range: bool | None, stacklevel: int = 3) -> None:
    """The documented outlier rule of ``quantize`` (docs/formats.md, "Range of nvfp4"): for
    nvfp4, count the blocks with finite nonzero input whose scale underflowed to 0 (they
    dequantize to all zeros) or saturated (their largest elements clip), from the input and
    the result (``reference.quantize.nvfp4_range_stats``), and emit one
    :class:`QuantizationRangeWarning` per kind found.

    ``check_range``: None (default) checks tensors on the CPU and skips CUDA tensors, where
    reading the counts back would synchronise the host with the device; True checks on any
    device (one sync on CUDA); False never checks. Skipped while torch.compile traces.
    Other formats have per-block scales only (a block cannot be flushed by another block's
    outlier), so there is nothing to check."""
    if check_range is None:
        check_range = x.device.type == "cpu"
    if not check_range or not q.format.has_global_scale or x.numel() == 0:
        return
    if torch.compiler.is_compiling() or x.device.type == "meta":
        return
    # Local: import cycle _checks -> reference.quantize -> _checks.
    from .reference.quantize import nvfp4_range_stats

    n, under, sat, top = nvfp4_range_stats(x, q).tolist()  # the one host read
    if not (under or sat):
        return
    gs = float(q.global_scale.reshape(()))
    fit = 448.0 * 6.0 / top if top > 0 else float("nan")
    if under:
        warnings.warn(
            f"quantize(nvfp4): {int(under)} of {int(n)} blocks with finite nonzero input got a scale that "
            f"underflowed to 0 and dequantize to all zeros (their gs * amax / 6 is at most 2**-10, half of "
            f"e4m3's smallest value). The global scale gs = {gs:.6g} maps |x| = {448.0 * 6.0 / gs:.6g} onto the "
            f"top of the nvfp4 range, and every block more than 448 * 2**10 (~4.6e5) times smaller is lost: "
            f"one large outlier "
            f"(amax(|x|) = {top:.6g}) sets the computed gs = 448 * 6 / amax(|x|). Clip or split off the "
            f"outliers, or use a format with per-block scales only (mxfp4, mxfp8, fp8_block). "
            f"check_range=False skips this check (docs/formats.md, 'Range of nvfp4').",
            QuantizationRangeWarning, stacklevel=stacklevel,
        )
    if sat:
        warnings.warn(
            f"quantize(nvfp4): {int(sat)} of {int(n)} blocks have gs * amax / 6 above 464, beyond e4m3's "
            f"largest scale 448: their scale saturates and their largest elements clip. The global scale "
            f"gs = {gs:.6g} is too large for this tensor (448 * 6 / amax(|x|) = {fit:.6g} fits it; "
            f"global_scale=None computes that). check_range=False skips this check "
            f"(docs/formats.md, 'Range of nvfp4').",
            QuantizationRangeWarning, stacklevel=stacklevel,
        )


def check_config_arg(config) -> None:
    """``config``: None, a ``GemmConfig`` (or a dict of its fields) or a ``HopperConfig``; checked
    before any path is taken, so that the CPU reference path rejects what the kernels would reject."""
    if config is not None and not isinstance(config, (GemmConfig, HopperConfig, dict)):
        raise TypeError(
            f"config: expected a blockscaled.config.GemmConfig (or a dict of its fields) or a HopperConfig, got "
            f"{type(config).__name__}"
        )


def check_out_no_grad(out) -> None:
    """``out=`` is written in place by the kernels, which autograd cannot record: an ``out`` that
    requires grad (with grad mode on) is refused on every path, not only where torch's own
    in-place check happens to run (the CPU reference path's copy)."""
    if isinstance(out, torch.Tensor) and out.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(
            "out: expected a tensor that does not require grad (the kernels write it in place, which "
            "autograd cannot record), got one with requires_grad=True; pass out=None or use torch.no_grad()"
        )
