"""Host launcher for the sm_90a (Hopper) fp8_block GEMM kernels (``kernels/hopper/wide.py``, ``skinny.py``).

Private: the lead wires :func:`gemm_fp8_block_hopper_impl` into ``gemm()`` dispatch once the
kernels are proven on the GPU. Shapes/layouts this path cannot take raise
:class:`HopperUnsupported` (a ``NotImplementedError``) whose message says why, so the caller
can fall back to the portable Triton kernel; :func:`unsupported_reason` returns the same text
without raising (for dispatch).

Variants (``HopperConfig.variant``), one kernel each:
  * ``"wide"``   persistent + warp-specialised, 128 x 256 tile computed as two 128-column
                 halves (half the L2->SM traffic per FLOP of 128 x 128), TMA-store epilogue;
                 fused split-K of every tile (``split_k``: few tiles, small M) or of the
                 last partial wave's tiles only (``tail_split``: large M, :func:`tail_split_for`).
  * ``"skinny"`` decode / small M (M <= 64): swap-AB (weight rows on the wgmma's M side),
                 one program per (weight tile, K split), deep TMA ring, fused split-K.

Triton versions: the kernels build on triton 3.6-3.9 (``kernels/hopper/_compat.py`` holds the
Gluon spellings that changed). Where they cannot be built on the installed triton (Gluon not
importable, an API renamed again, a compile or load error), the launchers run the portable
Triton kernels instead: :func:`gluon_unavailable_reason` says why, the first failure issues ONE
``RuntimeWarning`` per process (triton version and reason) and is recorded so that the rest of
the process neither retries nor warns again; the reason checks (:func:`unsupported_reason`,
:func:`grouped_unsupported_reason`) report it, so the dispatchers choose the portable kernels.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings

import torch
import triton

# HopperConfig and its value tables live in config/hopper.py; re-exported here for the kernels'
# callers (tests, scripts) that know them as ops._hopper names
from ..config.hopper import (  # noqa: F401
    _EPI_CODE,
    EPILOGUES,
    SPLIT_REDUCE,
    VARIANT_FLAGS,
    VARIANTS,
    HopperConfig,
)
from .. import _checks
from ..config.gemm import GemmConfig
from ..plan import Problem, device_info, plan_gemm
from ..plan.dense import SMEM_LIMIT
from ..plan.device import num_sms
from ..plan.grouped import grouped_hopper_config, swiglu_hopper_config
from ..plan import stream as plan_stream
from ..plan.splits import split_plan_kb as _split_plan_kb
from ..tensor import ScaledTensor
from ._launch import fast
from ._splitk import _splitk_counters

__all__ = [
    "gluon_unavailable_reason",
    "grouped_fp8_block_hopper_impl",
    "grouped_unsupported_reason",
    "HopperConfig",
    "HopperUnsupported",
    "VARIANTS",
    "gemm_fp8_block_hopper",
    "gemm_fp8_block_hopper_impl",
    "tma_2d_reason",
    "unsupported_reason",
]

OUT_DTYPES = _checks.OUT_DTYPES

# 16 bytes: TMA (cuTensorMapEncodeTiled) requires a 16-byte aligned global base address and
# 16-byte multiple strides for all but the innermost dimension. fp8 is 1 byte per element, so
# the row stride (>= K) must be a multiple of 16 elements -> K % 16 == 0 for contiguous data.
_TMA_ALIGN = 16
_SMEM_LIMIT = SMEM_LIMIT


class HopperUnsupported(NotImplementedError):
    """The Hopper fast path cannot take these arguments; the message says why (fall back)."""


# --------------------------------------------------------------------------- Gluon availability
#: Why the Gluon kernels cannot be built on this triton: None until a failure is seen (then never
#: reset: one warning per process, no retry). ``_GLUON["imported"]``: the kernel modules imported.
_GLUON: dict = {"reason": None, "imported": False}


def gluon_unavailable_reason() -> str | None:
    """Why the sm_90a Gluon kernels cannot run in this process (None: they can, as far as is
    known). The first call imports the kernel modules (``kernels/hopper/wide.py``, ``skinny.py``,
    ``stream.py``,
    whose ``_compat`` resolves the Gluon spellings of the installed triton) and TMA descriptors; a
    failure there, or a compile / load failure recorded by a launcher, is returned from then on.
    No GPU work, cached (cheap enough for every dispatch).

    Example::

        >>> gluon_unavailable_reason() is None  # triton 3.6-3.9 with Gluon
        True
    """
    if _GLUON["reason"] is None and not _GLUON["imported"]:
        try:
            from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: F401

            # Local and optional: the Gluon kernels fail to import on some triton versions.
            from ..kernels.hopper import stream, skinny, wide  # noqa: F401
        except Exception as e:  # ImportError / GluonCompatError, or any error while defining the kernels
            _record_gluon_failure(f"importing the Gluon kernels failed: {type(e).__name__}: {e}")
        else:
            _GLUON["imported"] = True
    return _GLUON["reason"]


def _record_gluon_failure(reason: str) -> None:
    """Remember that the Gluon kernels cannot be built here and warn, once per process."""
    if _GLUON["reason"] is not None:
        return
    _GLUON["reason"] = f"triton {triton.__version__}: {reason}"
    warnings.warn(
        f"blockscaled: the sm_90a Gluon (Hopper) kernels cannot be built with triton {triton.__version__} "
        f"({reason}); this process uses the portable Triton kernels instead (correct, slower on Hopper). "
        f"The Gluon kernels are tested with triton 3.6-3.9.",
        RuntimeWarning, stacklevel=3)


_MX_RELEASE_WARNED = [False]


def warn_unchecked_mx_release(fmt: str, info) -> None:
    """Once per process: an MX / NV call on an sm_90 GPU whose triton release the MX / NV sm_90 kernels
    were not checked on (plan/stream.py ``STREAM_TRITON``) plans the portable kernels, correct and
    several times slower; say so rather than be silently slow. Nothing when the kernels are
    switched off on purpose (``BLOCKSCALED_MX_KERNELS``) or the device is not an sm_90 GPU."""
    if (plan_stream._TRITON_OK or _MX_RELEASE_WARNED[0] or fmt not in plan_stream.STREAM_FORMATS
            or not info.is_hopper or not plan_stream.STREAM_ENABLED):
        return
    _MX_RELEASE_WARNED[0] = True
    checked = plan_stream.releases_str(plan_stream.STREAM_TRITON)
    warnings.warn(
        f"blockscaled: the MX / NV sm_90 kernels are checked on triton {checked}; with triton "
        f"{triton.__version__} this process runs {fmt} (and the other MX / NV formats) on the portable "
        f"kernels instead (correct, slower). `blockscaled.explain(...)` names the plan.",
        RuntimeWarning, stacklevel=4)


def _is_build_failure(exc: BaseException) -> bool:
    """Whether ``exc`` came from building or loading a kernel (triton's front end, MLIR passes,
    ptxas, module load: all run under ``triton/compiler/``) rather than from launching it or
    from the host code around it (those keep propagating)."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources

    if isinstance(exc, CompilationError):
        return True
    # a config that asks for more shared memory / registers than the SM has is a chooser bug for
    # that config, not a triton that cannot build the kernels: it must not disable them all
    if isinstance(exc, OutOfResources):
        return False
    tb = exc.__traceback__
    sep = os.sep
    while tb is not None:
        if f"{sep}triton{sep}compiler{sep}" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def _failure_text(exc: BaseException) -> str:
    # the message's last line: a CompilationError shows the kernel source first, the cause last
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:400]


@functools.lru_cache(maxsize=None)
def _smem_layout(rows: int, cols: int, dtype_name: str):
    """NVMMA shared layout of a TMA box (cached: host launch overhead matters for eager calls)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for([rows, cols], getattr(gl, dtype_name))


def _dev_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    # cached: the grouped ops ask on every call (torch's query is not free on the host)
    return torch.cuda.get_device_capability(index)


def tma_2d_reason(name: str, t: torch.Tensor) -> str | None:
    if t.ndim != 2:
        return f"{name}: TMA path needs a 2-D [rows, K] view, got shape {tuple(t.shape)}"
    if t.stride(1) != 1:
        return f"{name}: TMA needs the K dimension contiguous (stride 1), got strides {t.stride()}"
    if (t.stride(0) * t.element_size()) % _TMA_ALIGN:
        return (f"{name}: TMA needs a 16-byte multiple row stride; got stride {t.stride(0)} elements of "
                f"{t.element_size()} byte(s) (for contiguous fp8 data this means K % 16 == 0)")
    # While torch.compile traces, tensors have no address: the base is checked again on the real
    # tensors inside the op (_misaligned_base), which then runs the portable kernel.
    if not torch.compiler.is_compiling() and t.data_ptr() % _TMA_ALIGN:
        return f"{name}: TMA needs a 16-byte aligned base address, got data_ptr % 16 = {t.data_ptr() % 16}"
    return None


def _misaligned_base(*ts: torch.Tensor | None) -> bool:
    """Some operand's base address is not 16-byte aligned (TMA cannot read it); only reachable
    when the plan was made while tracing, where addresses are unknown (_tma_2d_reason)."""
    return any(t is not None and t.data_ptr() % _TMA_ALIGN for t in ts)


def unsupported_reason(a: ScaledTensor, b: ScaledTensor, out_dtype=torch.bfloat16,
                       config: HopperConfig | None = None) -> str | None:
    """Why the Hopper path cannot compute ``gemm(a, b)`` (None when it can). Checks the device
    (CUDA sm_90), format (fp8_block, 1x128 x 128x128), fp32 scales, output dtype, TMA
    alignment of A and B data, and the shared-memory budget of ``config``."""
    if not isinstance(a, ScaledTensor) or not isinstance(b, ScaledTensor):
        return "a and b must both be ScaledTensors (dense-activation GEMMs use the portable kernel)"
    if a.format.name != "fp8_block" or b.format.name != "fp8_block":
        return f"only fp8_block x fp8_block is implemented, got {a.format.name} x {b.format.name}"
    if a.block != (1, 128):
        return f"a.block: expected (1, 128) activation blocks, got {a.block}"
    if b.block != (128, 128):
        return f"b.block: expected (128, 128) weight blocks, got {b.block} (1x128 weights: portable kernel)"
    if b.ndim != 2:
        return f"b: expected a 2-D [N, K] weight, got shape {tuple(b.shape)}"
    dev = b.data.device
    if dev.type != "cuda" or a.data.device != dev:
        return f"needs both operands on one CUDA device, got a on {a.data.device}, b on {dev}"
    if _capability(_dev_index(dev)) != (9, 0):
        return (f"needs an sm_90 (Hopper) GPU: wgmma/TMA kernels compiled for sm_90a, got compute capability "
                f"{_capability(_dev_index(dev))}")
    gluon = gluon_unavailable_reason()
    if gluon is not None:
        return f"the Gluon kernels cannot be built: {gluon}"
    if out_dtype not in OUT_DTYPES:
        return f"out_dtype: expected one of {OUT_DTYPES}, got {out_dtype}"
    if a.scale.dtype != torch.float32 or b.scale.dtype != torch.float32:
        return f"scales must be fp32, got a.scale {a.scale.dtype}, b.scale {b.scale.dtype}"
    if a.shape[-1] != b.shape[-1]:
        return f"K mismatch: a has K={a.shape[-1]}, b has K={b.shape[-1]}"
    try:
        a2 = a.data.view(-1, a.shape[-1]) if a.data.ndim != 2 else a.data
    except RuntimeError:
        return f"a.data: leading dims of shape {tuple(a.data.shape)} / strides {a.data.stride()} do not flatten"
    if a2.shape[0] > 0 and b.shape[0] > 0 and a.shape[-1] > 0:
        for name, t in (("a.data", a2), ("b.data", b.data)):
            r = tma_2d_reason(name, t)
            if r is not None:
                return r
    if config is not None:
        es = out_dtype.itemsize
        need = config.smem_bytes(es)
        if config.variant == "wide" and config.epilogue in _EPI_CODE and need > _SMEM_LIMIT:
            # the launcher falls back to the masked epilogue when the TMA-store buffers do not fit
            need = dataclasses.replace(config, epilogue="masked").smem_bytes(es)
        if need > _SMEM_LIMIT:
            return f"config needs {need} bytes of shared memory > {_SMEM_LIMIT} (H100 limit)"
    return None


def _wide_split_plan(tiles: int, num_k: int, cfg: HopperConfig, num_sms: int) -> tuple[int, int, int]:
    """(split_from, splits, K blocks per split) of a dense "wide" launch: tiles [0, split_from)
    run whole, the rest in ``splits`` K ranges (kernels/hopper/wide.py::_wide_unit).
    split_k > 1: every tile split (split_from 0). tail_split > 1: the last partial wave's tiles,
    only where there are full waves before it and a partial one at all. Else no split."""
    if cfg.split_k > 1:
        nsplit, kb_per = _split_plan_kb(num_k, cfg.split_k)
        return (0, nsplit, kb_per) if nsplit > 1 else (tiles, 1, num_k)
    full = (tiles // num_sms) * num_sms
    if cfg.tail_split > 1 and 0 < full < tiles:
        nsplit, kb_per = _split_plan_kb(num_k, cfg.tail_split)
        if nsplit > 1:
            return full, nsplit, kb_per
    return tiles, 1, num_k


def _kernel_for(variant: str):
    """The Gluon kernel of ``HopperConfig.variant`` (imported on first use)."""
    if variant == "skinny":
        # Local and optional: the Gluon kernels fail to import on some triton versions.
        from ..kernels.hopper.skinny import fp8_block_gemm_skinny_kernel

        return fp8_block_gemm_skinny_kernel
    if variant == "wide":
        # Local and optional: the Gluon kernels fail to import on some triton versions.
        from ..kernels.hopper.wide import fp8_block_gemm_wide_kernel

        return fp8_block_gemm_wide_kernel
    raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")


_GL_OUT = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def _masked_epi(out2: torch.Tensor) -> int:
    """The wide kernel's masked-store EPI for ``out2`` (2D: rows x N): 1 (16-byte vector stores, 8
    outputs per thread) where the compiler can vectorise the store, else 0 (one output per thread:
    kernels/hopper/_common.py, ``store_layout_for``). It vectorises only where it knows N and the
    row stride are multiples of 16 elements (what Triton specialises integer arguments on) and the
    base is 16-byte aligned: with 16-byte rows alone (bf16 N % 8 == 0, N % 16 != 0; fp32 N % 4 == 0)
    the 8-per-thread layout compiled to scalar stores (PTX, sm_90: 256 st.global.b16 / b32 per
    thread, against 32 st.global.v4.b32 with both specialised)."""
    n = out2.shape[-1]
    return 1 if n % 16 == 0 and out2.stride(0) % 16 == 0 and out2.data_ptr() % _TMA_ALIGN == 0 else 0


def _tma_store_ok(out2: torch.Tensor) -> bool:
    """TMA store constraints (cuTensorMapEncodeTiled): 16-byte aligned base and row stride, unit
    column stride."""
    es = out2.element_size()
    return out2.stride(1) == 1 and (out2.stride(0) * es) % _TMA_ALIGN == 0 and out2.data_ptr() % _TMA_ALIGN == 0


def _spread_allowed() -> bool:
    """Whether the spread split-K reduction may run (HopperConfig.split_reduce): not where the
    environment asks for "last" (BLOCKSCALED_SPLIT_REDUCE=last) or limits this process to part of
    the SMs through MPS (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE < 100), where the persistent grid's
    programs might not all be resident at once and a waiting unit could wait forever."""
    if os.environ.get("BLOCKSCALED_SPLIT_REDUCE", "").strip().lower() == "last":
        return False
    pct = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "").strip()
    try:
        return not pct or float(pct) >= 100.0
    except ValueError:
        return False


def gemm_fp8_block_hopper_impl(a2: torch.Tensor, a_s2: torch.Tensor, b_data: torch.Tensor, b_scale: torch.Tensor,
                               out2: torch.Tensor, cfg: HopperConfig, asub: int = 1,
                               aflag: torch.Tensor | None = None) -> bool:
    """Launch into ``out2 [M, N]`` (written in full) and return True; False (nothing launched)
    where the Gluon kernels cannot be built on this triton (:func:`gluon_unavailable_reason`, or
    this launch's compile / load fails: recorded, one warning per process): the caller then runs
    the planner's plan without them. No validation beyond what TMA needs:
    ``a2 [M, K]`` e4m3 (K stride 1, 16-byte row stride/base), ``a_s2 [M, ceil(K/128)]`` fp32 (any
    strides), ``b_data [N, K]`` e4m3 (same TMA constraints), ``b_scale [ceil(N/128),
    ceil(K/128)]`` fp32 (any strides), ``out2`` bf16/fp16/fp32 with unit column stride.
    Raises :class:`HopperUnsupported` if A/B violate the TMA constraints, or for a spread split-K
    whose splits outnumber the programs (each split of a tile needs its own). No host synchronisation.
    ``asub`` 4 / ``aflag``: MX activations encoded by ops/mx_pack.py (``a_s2 [M, 4 * ceil(K/128)]``
    per 32 K, int32 row flags): the wide kernel's ASUB path (:func:`_gemm_gluon`).
    ``cfg.split_k > 1`` or ``cfg.tail_split > 1`` ("wide"; :func:`_wide_split_plan`): fused
    split-K of all tiles / of the last partial wave's tiles; allocates an fp32 workspace
    ``[split tiles, splits, block_m, block_n]`` per call (one tile-shaped slot per unit; at
    32 < M <= 128 up to 4x the M x N partials of a [splits, M, N] layout, the rows past M are
    never touched) (torch.empty; inside a CUDA-graph capture it comes from the graph's pool) and uses
    the shared self-resetting tile counters of the portable kernel (``ops.gemm._splitk_counters``:
    one buffer per (device, stream), one per device for graph captures).
    """
    if gluon_unavailable_reason() is None:
        try:
            _gemm_gluon(a2, a_s2, b_data, b_scale, out2, cfg, asub, aflag)
            return True
        except Exception as e:
            if not _is_build_failure(e):
                raise
            _record_gluon_failure(f"compiling the {cfg.variant!r} kernel failed: {_failure_text(e)}")
    return False


def _gemm_gluon(a2: torch.Tensor, a_s2: torch.Tensor, b_data: torch.Tensor, b_scale: torch.Tensor,
                out2: torch.Tensor, cfg: HopperConfig, asub: int = 1, aflag: torch.Tensor | None = None) -> None:
    """:func:`gemm_fp8_block_hopper_impl` on the Gluon kernels (no fallback). ``asub`` 4: the A
    scales are per 32 K (``a_s2 [M, 4 * ceil(K/128)]``) with the per-row flags ``aflag`` int32 [M]
    of ``encode_mx_activations`` (MX activations; the wide kernel's ASUB, "wide" only)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    m, k = a2.shape
    n = b_data.shape[0]
    if m == 0 or n == 0:
        return
    if k == 0:  # empty sum; TMA descriptors cannot describe a zero-size dimension
        out2.zero_()
        return
    if out2.stride(1) != 1:
        raise HopperUnsupported(f"out: expected unit column stride, got strides {out2.stride()}")
    for name, t in (("a", a2), ("b", b_data)):
        reason = tma_2d_reason(name, t)  # host-side only, no sync
        if reason is not None:
            raise HopperUnsupported(reason)
    bk = 128
    if asub != 1 and (cfg.variant != "wide" or cfg.split_k != 1 or cfg.tail_split != 1):
        raise HopperUnsupported(f"per-32 A scales (asub={asub}) run on the unsplit wide kernel only, got {cfg}")
    if cfg.variant == "skinny":
        _launch_skinny(a2, a_s2, b_data, b_scale, out2, cfg)
        return
    la = _smem_layout(cfg.block_m, bk, "float8e4nv")
    lb = _smem_layout(cfg.block_n, bk, "float8e4nv")
    a_desc = TensorDescriptor(a2, [m, k], [a2.stride(0), 1], [cfg.block_m, bk], la)
    b_desc = TensorDescriptor(b_data, [n, k], [b_data.stride(0), 1], [cfg.block_n, bk], lb)
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    grid = (min(tiles, num_sms(out2.device)),)
    if cfg.variant == "wide":
        # TMA store when the output allows it; the masked store otherwise (any N, any row stride).
        epi = _EPI_CODE.get(cfg.epilogue, 1) if (_tma_store_ok(out2)
                                                 and cfg.smem_bytes(out2.element_size()) <= _SMEM_LIMIT) else 1
        if epi == 1:
            epi = _masked_epi(out2)
        split = cfg.split_wg and cfg.block_m == 128
        rows = cfg.block_m // 2 if split else cfg.block_m
        if epi >= 2:
            lc = _smem_layout(rows, 128, _GL_OUT[out2.dtype])
            c_desc = TensorDescriptor(out2, [m, n], [out2.stride(0), 1], [rows, 128], lc)
        else:
            c_desc = a_desc  # unused by the kernel with a masked store (EPI 0 / 1)
        nsm = num_sms(out2.device)
        split_from, nsplit, kb_per = _wide_split_plan(tiles, triton.cdiv(k, bk), cfg, nsm)
        ws = cnt = out2  # unused by the kernel when SPLIT == 1
        spread = False
        if nsplit > 1:
            # fp32 partials [split tiles, split, block_m, block_n], written and read back by this
            # launch; counters per (split tile, math partition), all zero between launches (the
            # kernel resets them)
            ws = torch.empty((tiles - split_from, nsplit, cfg.block_m, cfg.block_n), dtype=torch.float32,
                             device=out2.device)
            cnt = _splitk_counters(out2.device, (tiles - split_from) * (2 if split else 1))
            grid = (min(split_from + (tiles - split_from) * nsplit, nsm),)
            spread = cfg.split_reduce == "spread" and _spread_allowed()
            if spread and _masked_epi(out2) == 0:
                # the spread reduction stores through pointers with the EPI's layout (wide.py,
                # spread_vec): one output per thread where the compiler cannot vectorise the rows
                epi, c_desc = 0, a_desc
            if spread and nsplit > grid[0]:
                # the spread reduction waits for the tile's other units: each must have its own program
                raise HopperUnsupported(f"split_reduce 'spread': {nsplit} splits need as many programs, "
                                        f"the grid has {grid[0]}")
        _launch_wide(
            grid, spread,
            a_desc, b_desc, b_desc, c_desc, a_s2, b_scale, b_scale, out2, out2, ws, cnt, m, n, k, 1,
            triton.cdiv(m, cfg.block_m), kb_per, split_from, a_s2.stride(0), a_s2.stride(1), 0,
            b_scale.stride(0), b_scale.stride(1), out2.stride(0), GROUP_M=cfg.group_m, STAGES=cfg.stages,
            NH=cfg.block_n // 128, EPI=epi, MODE=0, E_POW2=1, SPLIT_WG=split, DUAL=False, SPLIT=nsplit,
            TAIL=split_from > 0 and nsplit > 1, SPREAD=spread, num_warps=4 if split else cfg.num_warps,
            **({"ASUB": asub, "aflag_ptr": aflag} if asub != 1 else {}))
        return
    raise ValueError(f"cfg.variant: expected one of {VARIANTS}, got {cfg.variant!r}")


def _launch_wide(grid, spread: bool, *args, **kwargs) -> None:
    """Launch the wide kernel; a spread split-K launch is cooperative: its units wait for each
    other, so the driver must co-schedule the whole grid (or fail the launch) instead of the
    kernel relying on a GPU of its own. Such a failure is re-raised with the way out."""
    try:
        fast(_kernel_for("wide"))[grid](*args, launch_cooperative_grid=spread, **kwargs)
    except RuntimeError as e:
        # (only the cooperative launch's own failure, e.g. CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
        # "too many blocks in cooperative launch"; an earlier kernel's sticky error surfacing
        # here keeps its own message)
        if not spread or "cooperative" not in str(e).lower():
            raise
        raise RuntimeError(
            f"blockscaled: the cooperative launch of the spread split-K reduction ({grid[0]} programs, one "
            f"per SM) failed: {e}. Where this process cannot have that many programs resident at once "
            f"(MPS limits, green contexts), set BLOCKSCALED_SPLIT_REDUCE=last.") from e


def _launch_skinny(a2, a_s2, b_data, b_scale, out2, cfg: HopperConfig) -> None:
    """Variant "skinny" (M <= cfg.block_m): grid = weight tiles x K splits, one unit each."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    m, k = a2.shape
    n = b_data.shape[0]
    if m > cfg.block_m:
        raise HopperUnsupported(f"variant 'skinny' takes M <= block_m = {cfg.block_m} rows, got M={m}")
    a_desc = TensorDescriptor(a2, [m, k], [a2.stride(0), 1], [cfg.block_m, 128],
                              _smem_layout(cfg.block_m, 128, "float8e4nv"))
    b_desc = TensorDescriptor(b_data, [n, k], [b_data.stride(0), 1], [cfg.block_n, 128],
                              _smem_layout(cfg.block_n, 128, "float8e4nv"))
    tiles = triton.cdiv(n, cfg.block_n)
    nsplit, kb_per = _split_plan_kb(triton.cdiv(k, 128), cfg.split_k)
    ws = cnt = out2  # unused by the kernel when SPLIT == 1
    if nsplit > 1:
        ws = torch.empty((nsplit, tiles, cfg.block_n, cfg.block_m), dtype=torch.float32, device=out2.device)
        cnt = _splitk_counters(out2.device, tiles)
    fast(_kernel_for("skinny"))[(tiles * nsplit,)](
        a_desc, b_desc, a_s2, b_scale, out2, ws, cnt, m, n, k, kb_per, nsplit,
        a_s2.stride(0), a_s2.stride(1), b_scale.stride(0), b_scale.stride(1), out2.stride(0),
        STAGES=cfg.stages, num_warps=4,
    )


def gemm_fp8_block_hopper(a: ScaledTensor, b: ScaledTensor, out_dtype: torch.dtype = torch.bfloat16,
                          out: torch.Tensor | None = None, *, config: HopperConfig | None = None) -> torch.Tensor:
    """``dequantize(a) @ dequantize(b).T`` on the Hopper fast path.

    Args:
        a: fp8_block ``ScaledTensor [..., K]``, 1x128 blocks (data e4m3 ``[..., K]``, scale fp32
            ``[..., ceil(K/128)]``); leading dims must flatten without a copy.
        b: fp8_block ``ScaledTensor [N, K]``, 128x128 blocks (scale fp32 ``[ceil(N/128), ceil(K/128)]``).
        out_dtype: bf16 (default), fp16 or fp32. out: optional ``[..., N]`` tensor (unit column stride).
        config: :class:`HopperConfig` (variant + tiles); default: the planner's Hopper choice.

    Returns ``[..., N]`` of ``out_dtype``. Raises :class:`HopperUnsupported` (NotImplementedError)
    with the reason for inputs the TMA/wgmma path cannot take (non-sm_90 device, K % 16 != 0,
    unaligned base/stride, other formats or block shapes) -> use the portable ``gemm``.
    """
    reason = unsupported_reason(a, b, out_dtype, config)
    if reason is not None:
        raise HopperUnsupported(reason)
    k = a.shape[-1]
    n = b.shape[0]
    a2 = a.data.view(-1, k) if a.data.ndim != 2 else a.data
    a_s2 = a.scale.view(-1, a.scale.shape[-1]) if a.scale.ndim != 2 else a.scale
    m = a2.shape[0]
    lead = tuple(a.shape[:-1])
    if out is None:
        out = torch.empty((*lead, n), dtype=out_dtype, device=b.data.device)
    elif out.dtype != out_dtype or tuple(out.shape) != (*lead, n) or out.device != b.data.device:
        raise ValueError(f"out: expected {out_dtype} {(*lead, n)} on {b.data.device}, got {out.dtype} "
                         f"{tuple(out.shape)} on {out.device}")
    if config is None:
        out_name = str(out_dtype).removeprefix("torch.")
        plan = plan_gemm(Problem("gemm", "fp8_block", m, n, k, out_dtype=out_name), device_info(b.data.device),
                         GemmConfig(strategy="hopper"))
        config = plan.config
    if not gemm_fp8_block_hopper_impl(a2, a_s2, b.data, b.scale, out.view(m, n), config):
        raise HopperUnsupported(f"the Gluon kernels cannot be built: {gluon_unavailable_reason()}")
    return out


def grouped_unsupported_reason(a_data: torch.Tensor, b_data: torch.Tensor, a_scale: torch.Tensor,
                               b_scale: torch.Tensor, a_block, b_block, out_dtype, mode: int) -> str | None:
    """Why the Hopper grouped path cannot run (None when it can): fp8_block 1x128 x 128x128, fp32
    scales, sm_90, TMA-describable A ([rows, K] or [E, max_m, K] viewed 2-D) and B ([E, N, K]
    viewed as [E * N, K]: needs rows contiguous across experts). mode 0 (dense SwiGLU): B [N, K]."""
    if mode == 0 and b_data.ndim == 2:
        b_data = b_data.unsqueeze(0)
    if a_data.dtype != torch.float8_e4m3fn or b_data.dtype != torch.float8_e4m3fn:
        return f"needs e4m3 data, got a {a_data.dtype}, b {b_data.dtype}"
    if tuple(a_block) != (1, 128) or tuple(b_block) != (128, 128):
        return f"needs 1x128 activations and 128x128 weights, got {tuple(a_block)} x {tuple(b_block)}"
    if a_scale.dtype != torch.float32 or b_scale.dtype != torch.float32:
        return f"scales must be fp32, got {a_scale.dtype}, {b_scale.dtype}"
    dev = b_data.device
    if dev.type != "cuda" or _capability(_dev_index(dev)) != (9, 0):
        return "needs an sm_90 (Hopper) GPU"
    gluon = gluon_unavailable_reason()
    if gluon is not None:
        return f"the Gluon kernels cannot be built: {gluon}"
    if out_dtype not in OUT_DTYPES:
        return f"out_dtype: expected one of {OUT_DTYPES}, got {out_dtype}"
    e, n, k = b_data.shape
    if a_data.numel() == 0 or b_data.numel() == 0:
        return None  # nothing to load: the launcher returns (or zero-fills for K = 0) without a kernel
    if b_data.stride(2) != 1 or b_data.stride(0) != n * b_data.stride(1):
        return f"b.data: experts must be stacked contiguously ([E*N, K] view), got strides {b_data.stride()}"
    try:
        a2 = a_data.view(-1, k)
    except RuntimeError:
        return f"a.data: shape {tuple(a_data.shape)} / strides {a_data.stride()} do not flatten to [rows, K]"
    if mode == 2 and a_data.stride(0) != a_data.shape[1] * a_data.stride(1):
        return f"a.data: masked experts must be stacked contiguously, got strides {a_data.stride()}"
    if a2.shape[0] and n and k:
        for name, t in (("a.data", a2), ("b.data", b_data.view(-1, k))):
            r = tma_2d_reason(name, t)
            if r is not None:
                return r
    return None


def grouped_fp8_block_hopper_impl(a_data: torch.Tensor, a_scale: torch.Tensor, b_data: torch.Tensor,
                                  b_scale: torch.Tensor, seg: torch.Tensor | None, mode: int, out: torch.Tensor,
                                  cfg: HopperConfig | None = None, b2_data: torch.Tensor | None = None,
                                  b2_scale: torch.Tensor | None = None) -> bool:
    """Grouped fp8_block GEMM (or SwiGLU with ``b2_*``) on the wide Gluon kernel, written into ``out``;
    True, or False (nothing launched: the caller runs the portable plan) where the Gluon kernels
    cannot be built or an operand's base address is not 16-byte aligned (only a plan made while
    torch.compile traced, without addresses, can bring one here). No host sync.

    mode 1 (contiguous): ``a_data [sum_m, K]`` e4m3, ``a_scale [sum_m, ceil(K/128)]`` fp32,
        ``seg`` int32 offsets ``[E+1]`` (device), ``out [sum_m, N]``.
    mode 2 (masked): ``a_data [E, max_m, K]``, ``a_scale [E, max_m, nk]``, ``seg`` int32 counts
        ``[E]`` (device), ``out [E, max_m, N]``: rows past a count are not written.
    mode 0 (dense; SwiGLU only): ``a_data [M, K]``, ``b_data [N, K]``, ``out [M, N]``, ``seg`` unused.
    ``b_data [E, N, K]`` e4m3 (experts stacked contiguously), ``b_scale [E, ceil(N/128), nk]`` fp32.
    ``b2_data`` / ``b2_scale`` (SwiGLU up weights; ``b_*`` are the gate): same shapes and strides;
    ``out = silu(A @ B.T) * (A @ B2.T)``.
    Callers check :func:`grouped_unsupported_reason` first (for both weights when dual).
    """
    if gluon_unavailable_reason() is None and not _misaligned_base(a_data, b_data, b2_data):
        try:
            _grouped_gluon(a_data, a_scale, b_data, b_scale, seg, mode, out, cfg, b2_data, b2_scale)
            return True
        except Exception as e:
            if not _is_build_failure(e):
                raise
            _record_gluon_failure(f"compiling the 'wide' kernel failed: {_failure_text(e)}")
    return False


def _grouped_gluon(a_data: torch.Tensor, a_scale: torch.Tensor, b_data: torch.Tensor, b_scale: torch.Tensor,
                   seg: torch.Tensor | None, mode: int, out: torch.Tensor, cfg: HopperConfig | None = None,
                   b2_data: torch.Tensor | None = None, b2_scale: torch.Tensor | None = None) -> None:
    """:func:`grouped_fp8_block_hopper_impl` on the Gluon wide kernel (no fallback)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    dual = b2_data is not None
    if (b2_scale is None) == dual:
        raise ValueError("b2_scale: give b2_data and b2_scale together (SwiGLU up weight) or neither")
    if dual and (b2_data.shape != b_data.shape or b2_data.stride() != b_data.stride()
                 or b2_scale.shape != b_scale.shape or b2_scale.stride() != b_scale.stride()):
        raise ValueError(
            f"b2_data/b2_scale: the up weight must match the gate's shapes and strides (one set of strides in "
            f"the kernel), got data {tuple(b2_data.shape)}/{b2_data.stride()} vs {tuple(b_data.shape)}/"
            f"{b_data.stride()}, scale {tuple(b2_scale.shape)}/{b2_scale.stride()} vs {tuple(b_scale.shape)}/"
            f"{b_scale.stride()}")
    if mode == 0:
        b_data, b_scale = b_data.unsqueeze(0), b_scale.unsqueeze(0)
        if dual:
            b2_data, b2_scale = b2_data.unsqueeze(0), b2_scale.unsqueeze(0)
    e, n, k = b_data.shape
    if out.numel() == 0 or e == 0:
        return
    if k == 0:
        out.zero_()  # the empty sum (masked: rows past counts are unspecified, zero is fine); silu(0) * 0 = 0
        return
    a2 = a_data.view(-1, k)
    rows = a2.shape[0]
    out2 = out.view(-1, n)
    a_s2 = a_scale.view(rows, -1)
    if mode == 2:
        max_m = a_data.shape[1]
        rows_per_expert = max_m
    else:
        max_m = rows
        rows_per_expert = rows / e
    nsm = num_sms(out.device)
    if cfg is None:
        cfg = (swiglu_hopper_config(mode, rows, rows_per_expert, n, nsm, out.element_size()) if dual
               else grouped_hopper_config(rows_per_expert, n, k, nsm, out.element_size(), e))
    bm, bn = cfg.block_m, cfg.block_n
    if cfg.split_k != 1 or (dual and cfg.tail_split != 1):
        raise ValueError(f"cfg.split_k / cfg.tail_split: grouped GEMMs split only the last wave's tiles "
                         f"(tail_split) and SwiGLU not at all, got split_k={cfg.split_k}, "
                         f"tail_split={cfg.tail_split}{' (SwiGLU)' if dual else ''}")
    if dual and bn != 256:
        raise ValueError(f"cfg.block_n: SwiGLU on the wide kernel needs block_n 256 (gate | up halves), got {bn}")
    box_n = 128 if dual else bn
    la = _smem_layout(bm, 128, "float8e4nv")
    lb = _smem_layout(box_n, 128, "float8e4nv")
    a_desc = TensorDescriptor(a2, [rows, k], [a2.stride(0), 1], [bm, 128], la)
    b2v = b_data.view(e * n, k)
    b_desc = TensorDescriptor(b2v, [e * n, k], [b2v.stride(0), 1], [box_n, 128], lb)
    if dual:
        u2v = b2_data.view(e * n, k)
        u_desc = TensorDescriptor(u2v, [e * n, k], [u2v.stride(0), 1], [box_n, 128], lb)
        u_scale = b2_scale
    else:
        u_desc, u_scale = b_desc, b_scale
    if mode == 1:
        num_pid_m = triton.cdiv(rows, bm) + e  # upper bound on sum_e cdiv(m_e, bm)
    elif mode == 2:
        num_pid_m = e * triton.cdiv(max_m, bm)
    else:
        num_pid_m = triton.cdiv(rows, bm)
    tiles = num_pid_m * triton.cdiv(n, box_n)
    grid = (max(1, min(tiles, nsm)),)
    split = cfg.split_wg and bm == 128
    epi = _masked_epi(out2)
    c_desc = a_desc  # unused by the kernel with a masked store (EPI 0 / 1)
    # Tail split (HopperConfig.tail_split): the kernel counts the real tiles on the device and
    # splits the last partial wave only where its tiles x splits fit in the grid, so the fp32
    # workspace and the counters are sized for grid // splits split tiles.
    nsplit, kb_per = 1, triton.cdiv(k, 128)
    ws = cnt = out2  # unused by the kernel when SPLIT == 1
    spread = False
    if cfg.tail_split > 1 and mode != 0 and tiles > grid[0]:  # (else no full wave: nothing to split)
        nsplit, kb_per = _split_plan_kb(triton.cdiv(k, 128), cfg.tail_split)
        if nsplit > grid[0]:
            nsplit, kb_per = 1, triton.cdiv(k, 128)
    if nsplit > 1:
        slots = grid[0] // nsplit
        ws = torch.empty((slots, nsplit, bm, bn), dtype=torch.float32, device=out.device)
        cnt = _splitk_counters(out.device, slots * (2 if split else 1))
        spread = cfg.split_reduce == "spread" and _spread_allowed()
    # (a spread reduction at rows the compiler cannot vectorise keeps EPI 0: wide.py, spread_vec)
    if (mode == 0 and cfg.epilogue in _EPI_CODE and _tma_store_ok(out2)
            and cfg.smem_bytes(out2.element_size(), dual=dual) <= _SMEM_LIMIT
            and not (spread and epi == 0)):
        epi = _EPI_CODE[cfg.epilogue]
        r = bm // 2 if split else bm
        c_desc = TensorDescriptor(out2, [rows, n], [out2.stride(0), 1], [r, 128], _smem_layout(r, 128, _GL_OUT[out2.dtype]))
    _launch_wide(
        grid, spread,
        a_desc, b_desc, u_desc, c_desc, a_s2, b_scale, u_scale, out2, seg if seg is not None else out2,
        ws, cnt, max_m, n, k, e, num_pid_m, kb_per, 0,
        a_s2.stride(0), a_s2.stride(1), b_scale.stride(0), b_scale.stride(1), b_scale.stride(2), out2.stride(0),
        GROUP_M=cfg.group_m, STAGES=cfg.stages, NH=bn // 128, EPI=epi, MODE=mode,
        E_POW2=max(16, triton.next_power_of_2(e)) if mode else 1, SPLIT_WG=split, DUAL=dual, SPLIT=nsplit,
        TAIL=nsplit > 1, SPREAD=spread, num_warps=4 if split else cfg.num_warps)
