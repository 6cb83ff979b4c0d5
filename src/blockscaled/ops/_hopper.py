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
import math
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
from ..tensor import ScaledTensor
from ._splitk import _splitk_counters

__all__ = [
    "gluon_unavailable_reason",
    "choose_small_m_hopper_config",
    "tail_split_for",
    "skinny_dispatch_config",
    "skinny_stages",
    "choose_swiglu_config",
    "grouped_fp8_block_hopper_impl",
    "grouped_unsupported_reason",
    "HopperConfig",
    "HopperUnsupported",
    "VARIANTS",
    "choose_hopper_config",
    "gemm_fp8_block_hopper",
    "gemm_fp8_block_hopper_impl",
    "unsupported_reason",
]

OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# 16 bytes: TMA (cuTensorMapEncodeTiled) requires a 16-byte aligned global base address and
# 16-byte multiple strides for all but the innermost dimension. fp8 is 1 byte per element, so
# the row stride (>= K) must be a multiple of 16 elements -> K % 16 == 0 for contiguous data.
_TMA_ALIGN = 16
# H100 usable shared memory per block (227 KB = 232448 bytes, opt-in maximum on sm_90).
_SMEM_LIMIT = 232448


class HopperUnsupported(NotImplementedError):
    """The Hopper fast path cannot take these arguments; the message says why (fall back)."""


# --------------------------------------------------------------------------- Gluon availability
#: Why the Gluon kernels cannot be built on this triton: None until a failure is seen (then never
#: reset: one warning per process, no retry). ``_GLUON["imported"]``: the kernel modules imported.
_GLUON: dict = {"reason": None, "imported": False}


def gluon_unavailable_reason() -> str | None:
    """Why the sm_90a Gluon kernels cannot run in this process (None: they can, as far as is
    known). The first call imports the kernel modules (``kernels/hopper/wide.py``, ``skinny.py``,
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

            from ..kernels.hopper import skinny, wide  # noqa: F401
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


def _portable_gemm(a2: torch.Tensor, a_s2: torch.Tensor, b_data: torch.Tensor, b_scale: torch.Tensor,
                   out2: torch.Tensor) -> None:
    """The portable kernels' fp8_block GEMM into ``out2`` (arguments as for
    :func:`gemm_fp8_block_hopper_impl`): the config the dispatcher chooses without Hopper."""
    from ..config.gemm import choose_gemm_config
    from ..formats import FORMATS
    from .gemm import gemm_impl

    m, n = out2.shape
    k = a2.shape[1]
    cfg = choose_gemm_config("fp8_block", m, n, k, out2.device, out_dtype=out2.dtype, allow_hopper=False)
    gemm_impl(a2, a_s2, None, b_data, b_scale, None, 128, FORMATS["fp8_block"], k, out2, None, cfg, out2.dtype)


def _portable_grouped(a_data, a_scale, b_data, b_scale, seg, mode: int, out, b2_data=None, b2_scale=None) -> None:
    """The portable grouped kernel (or SwiGLU with ``b2_*``) into ``out``; arguments as for
    :func:`grouped_fp8_block_hopper_impl` (mode 0: ``b_data [N, K]``)."""
    from ..kernels.triton._mma import FORMAT_CODES
    from .grouped import _launch_impl, resolve_config

    n, k = b_data.shape[-2], b_data.shape[-1]
    e = 1 if mode == 0 else b_data.shape[0]
    rows_per_expert = a_data.shape[1] if mode == 2 else a_data.shape[0] / max(e, 1)
    cfg = resolve_config(None, "fp8_block", rows_per_expert, n, k, out.device, dual=b2_data is not None,
                         mode=mode, experts=e, out_dtype=out.dtype, allow_dequant=False)
    _launch_impl(a_data, a_scale, None, b_data, b_scale, None, b2_data, b2_scale, None, seg, out,
                 FORMAT_CODES["fp8_block"], mode, k, 128, cfg)


#: Most K ranges a tail-split tile is cut into (each range is one unit of the last wave). With the
#: last-arriver reduction each range added a serial read-back, and past ~8 the last wave got
#: slower again (1024x2112x7168: split 8 42.8 us, 14: 46.6). With the spread reduction (default)
#: more ranges keep paying a little. H100 (scripts/tail_split_ab.py --sweep with the caps lifted,
#: results/h100/tail-split-sweep-spread-20261122.json, us by split): 1024x2112x7168 (4 tail tiles)
#: 5: 39.0, 8: 37.3, 11: 37.2, 14: 36.5 (off: 54.0); 2048x2112x7168 (12) 7: 64.3, 8: 65.5, 11: 64.8
#: (off: 81.5). 16 = the most a 4-tile tail of K=7168 can use with >= 4 K blocks per range.
TAIL_SPLIT_MAX = 16
#: Fewest K blocks for a tail split (re-checked with the spread reduction: 2048x7168x2048 split 2
#: 63.8 -> 65.7 us, still a loss). Each split unit pays a fixed cost (fp32 partial tile store,
#: arrival atomic, the reduction's read-back) that only a long tile amortises. H100
#: (scripts/tail_split_ab.py, benchmarks/results/h100/tail-split-ab-20261122.json, time without /
#: with): K = 7168 and 16384 won on all 7 rows (1.03-1.17x; 4096x2112x7168 140.0 -> 129.2 us),
#: K = 1536 won 1.04x twice, K = 2048 lost twice (0.93x / 0.94x: 2048x7168, 3000x7168).
TAIL_SPLIT_MIN_KB = 32


def tail_split_for(tiles: int, k: int, num_sms: int) -> int:
    """HopperConfig.tail_split for a dense wide launch of ``tiles`` tiles: split the last partial
    wave's T - (T // S) * S tiles into as many K ranges as still fit in one wave (at most
    TAIL_SPLIT_MAX, each >= _SPLITK_MIN_KB K blocks); 1 where there is no partial wave after a full
    one, it is more than half full (then at most 1 split per tile fits) or K is shorter than
    TAIL_SPLIT_MIN_KB blocks. Model: the last wave then costs about 1/split of a tile-time plus
    one reduction, instead of a whole tile-time. The result is deterministic (fixed-order
    reduction) but not bitwise equal to the unsplit kernel's (another fp32 summation order)."""
    full = (tiles // num_sms) * num_sms
    tail = tiles - full
    if full == 0 or tail == 0 or triton.cdiv(max(k, 1), 128) < TAIL_SPLIT_MIN_KB:
        return 1
    split = min(num_sms // tail, triton.cdiv(max(k, 1), 128) // _SPLITK_MIN_KB, TAIL_SPLIT_MAX)
    return split if split >= 2 else 1


#: Raster height of the dense wide kernel at short K (<= SHORT_K_MAX_KB K blocks). There the
#: output write dominates the DRAM traffic and each group of GROUP_M row tiles re-reads all of B:
#: a group of 32 row tiles (4096 rows) reads B once per 4096 rows while its A rows (32 x 128 x K
#: bytes, 2 MB at K=512) stay in L2. H100, M=4096 N=32768 K=512 (scripts/wide_sweep.py, 5
#: interleaved rounds, median ratio to group_m 8): group_m 16 1.04x, 32 1.09x; at K >= 1536 no
#: group_m was better than 8 beyond the run's noise (7168x2048: 32 -> 0.95x).
SHORT_K_GROUP_M = 32
SHORT_K_MAX_KB = 4


#: Time of a 128x128 tile of the wide kernel relative to a 128x256 tile of the same K (for
#: :func:`wide_tile_cost`). H100 M=4096 (scripts/wide_sweep.py): 128x128 tiles ran at 0.80-0.95x
#: the 128x256 throughput on the six DeepSeek-V3 shapes, i.e. half the columns in 0.53-0.63 of
#: the time (128x256 reads 25% fewer L2 bytes per FLOP).
WIDE_128_TILE_COST = 0.6
#: Fewest rows for which the dense wide tile width follows the wave model (choose_hopper_config).
WIDE_TILE_MODEL_MIN_M = 257


def wide_tile_cost(tiles: int, k: int, num_sms: int, tile_cost: float = 1.0) -> float:
    """Model of a dense wide launch's time in tile-times: whole waves of ``tiles`` on
    ``num_sms`` programs (ceil), or tiles / SMs where the last partial wave is tail-split
    (:func:`tail_split_for`), times the tile's cost."""
    if tail_split_for(tiles, k, num_sms) > 1:
        return tiles / num_sms * tile_cost
    return triton.cdiv(tiles, num_sms) * tile_cost


@functools.lru_cache(maxsize=4096)
def choose_hopper_config(m: int, n: int, k: int, variant: str = "wide",
                         num_sms: int = 132, out_elem_bytes: int = 2) -> HopperConfig:
    """The tile configuration of ``variant`` for an M x N x K GEMM (rules in the comments below):
    * "wide" (default): 128-row tiles, 128 x 256 or 128 x 128 by the wave model, a tail split of
      the last partial wave where it pays, as many ring stages as fit (``_fill_stages``).
    * "skinny" (M <= 64): activation rows padded to 8..64, 64-row weight tiles, split-K to fill
      the SMs.
    Raises ValueError for another variant (or "skinny" with M > 64).
    """
    if variant == "skinny":
        # decode kernel: activation rows padded to a power of two >= 8 (at most 64), 64-row weight
        # tiles, K split so that tiles x splits fill the SMs with >= 2 K blocks per split (what
        # gemm() runs is skinny_dispatch_config: unsplit, where it was measured faster)
        if m > 64:
            raise ValueError(f"variant 'skinny' takes M <= 64 (activation rows on the wgmma N side), got M={m}")
        bm = max(8, triton.next_power_of_2(max(m, 1)))
        tiles = triton.cdiv(max(n, 1), 64)
        split = max(1, min(triton.cdiv(max(k, 1), 128) // 2, num_sms // tiles))
        return HopperConfig("skinny", block_m=bm, block_n=64, num_warps=4, stages=skinny_stages(bm, 64),
                            split_k=split)
    if variant == "wide":
        # 128 x 256 unless 128 x 128 tiles take fewer tile-times by the wave model
        # (wide_tile_cost): one wave of either -> 128 x 128; 112 tiles of 128 x 256 (one wave)
        # vs 224 of 128 x 128 (two) -> 128 x 256. H100 (scripts/wide_sweep.py --ms 512,1024,2048
        # --only block_n, 3 interleaved rounds, benchmarks/results/h100/wide-bn-20261123.json):
        # the model picks the faster width on all 18 rows; the rule before it ("128 x 256 when it
        # gives >= SMs tiles") lost 1.12x / 1.13x / 1.17x at 512x7168x16384 / 512x7168x2048 /
        # 1024x4096x7168, and a tail split turns 1024x2112x7168's 136 tiles of 128 x 128 into
        # ~1.03 waves (1.26x faster than 72 tiles of 128 x 256).
        # At M <= 256 (WIDE_TILE_MODEL_MIN_M) the launch streams weights rather than computes:
        # there the rule stays "128 x 256 when that alone gives >= SMs tiles" (more, narrower
        # tiles keep more SMs reading), as before the model.
        t256 = triton.cdiv(m, 128) * triton.cdiv(n, 256)
        t128 = triton.cdiv(m, 128) * triton.cdiv(n, 128)
        if m < WIDE_TILE_MODEL_MIN_M:
            bn = 256 if t256 >= num_sms else 128
        else:
            bn = 256 if (wide_tile_cost(t256, k, num_sms)
                         <= wide_tile_cost(t128, k, num_sms, WIDE_128_TILE_COST)) else 128
        cfg = HopperConfig(variant="wide", block_m=128, block_n=bn, num_warps=8, stages=2, epilogue="tma",
                           tail_split=tail_split_for(triton.cdiv(m, 128) * triton.cdiv(n, bn), k, num_sms),
                           group_m=SHORT_K_GROUP_M if triton.cdiv(max(k, 1), 128) <= SHORT_K_MAX_KB else 8)
        return _fill_stages(cfg, out_elem_bytes)
    raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")


@functools.lru_cache(maxsize=4096)
def choose_dispatch_config(m: int, n: int, k: int, out_elem_bytes: int = 2, num_sms: int = 132) -> HopperConfig:
    """The configuration ``gemm()`` runs on sm_90 (config.gemm.choose_gemm_config picked the
    "hopper" strategy): :func:`small_m_dispatch_config` where it applies, else the wide kernel's
    128x256 / 128x128 tiles. H100, M=4096, six DeepSeek-V3 shapes (scripts/hopper_check.py,
    2026-11-22): wide 128x256 760-1141 TFLOP/s vs the best of tma / ws+overlap 697-870 on every
    shape."""
    skinny = skinny_dispatch_config(m, n, k, num_sms)
    if skinny is not None:
        return skinny
    small = small_m_dispatch_config(m, n, k, num_sms, out_elem_bytes)
    if small is not None:
        return small
    return choose_hopper_config(m, n, k, variant="wide", num_sms=num_sms, out_elem_bytes=out_elem_bytes)


#: Programs per SM the skinny kernel's ring is sized for (shared memory / 4): the H100 sweep's
#: fastest ring on all 24 rows (scripts/skinny_sweep.py; rings for 1 or 2 programs per SM, up to
#: 16 stages, were 5-50% slower even with one program per SM).
SKINNY_PROGRAMS_PER_SM = 4


def skinny_stages(block_m: int, block_n: int) -> int:
    """Ring depth of the skinny kernel: shared memory for SKINNY_PROGRAMS_PER_SM programs per SM
    (ring + the epilogue's fp32 C^T conversion scratch + barriers), at least 2."""
    stage = (block_n + block_m) * 128
    return max(2, (_SMEM_LIMIT // SKINNY_PROGRAMS_PER_SM - block_n * block_m * 4 - 2048) // stage)


@functools.lru_cache(maxsize=4096)
def skinny_dispatch_config(m: int, n: int, k: int, num_sms: int = 132) -> HopperConfig | None:
    """The skinny (swap-AB, TMA ring) config where it beat the portable kernel on the H100, else
    None. Rule: K <= 2048, no K split, at least num_sms / 2 weight tiles of 64 rows, block_n
    128 when that still gives >= num_sms tiles (else 64), ring from :func:`skinny_stages`, and
    1 <= M <= 16, or M <= 32 with 64-row tiles, or M <= 64 when K <= 512.
    Measured (scripts/skinny_sweep.py, benchmarks/results/h100/skinny-sweep-20261122.json, CUDA-
    graph medians, gemm() before -> skinny, us): 7168x2048 M=1 9.24 -> 8.15, M=16 9.74 -> 8.40,
    M=32 10.70 -> 8.92 (64-row tiles, 112 programs); 32768x512 M=1 7.95 -> 7.69, M=16 8.11 -> 7.99,
    M=32 8.81 -> 8.27, M=64 9.97 -> 9.28 (128-row tiles); 24576x1536 M=1 15.58 -> 15.40, M=16
    16.51 -> 16.04. Not taken: 24576x1536 at M=32 (128-row tiles, 16.44 -> 16.71); K >= 7168 (2112x7168, 4096x7168,
    7168x16384), where the unsplit kernel has too few programs (33-112) and its split-K was 0-60%
    slower than the portable kernel at every split tried (1-19); 7168x2048 at M=64 (0.85x)."""
    if m < 1 or k > 2048 or k < 1 or m > (64 if k <= 512 else 32):
        return None
    if triton.cdiv(n, 64) < num_sms // 2:
        return None
    bn = 128 if triton.cdiv(n, 128) >= num_sms else 64
    if 16 < m <= 32 and bn == 128 and k > 512:
        return None
    bm = max(8, triton.next_power_of_2(m))
    return HopperConfig("skinny", block_m=bm, block_n=bn, num_warps=4, stages=skinny_stages(bm, bn), split_k=1)


#: Rows up to which dense fp8_block GEMMs may take the split-K wide kernel
#: (:func:`small_m_dispatch_config`); above, the plain wide rule of config.gemm applies.
SMALL_M_HOPPER_MAX = 512
#: Work units (tiles x K ranges) the small-M split aims for. H100, spread reduction
#: (scripts/spread_sweep.py, benchmarks/results/h100/spread-sweep-20261122.json): the best split
#: gave 68-128 units on every row with fewer than 48 tiles, e.g. 17 tiles (M=128 2112x7168) split
#: 4 / 5 / 6 / 7: 14.4 / 14.7 / 14.8 / 14.7 us, split 3: 16.4; 34 tiles (M=256 2112x7168) split 2 /
#: 3: 20.4 / 17.4; 32 tiles (M=128 4096x7168) split 2 / 3 / 4: 21.7 / 20.8 / 20.5.
SMALL_M_TARGET_UNITS = 96
#: Fewest K blocks per range once the tiles alone occupy >= SMALL_M_MANY_TILES SMs: there a split
#: only pays with long ranges. H100: 56 tiles (N=7168, M=64 / 128) split 2 lost with 16 blocks per
#: range (K=4096: 15.1 -> 17.7 us, 17.6 -> 20.5) and tied with 28 (K=7168: 27.5 -> 26.9, 30.2 ->
#: 30.7); 51 / 64 tiles (M=384 2112x7168, M=512 2048x7168) with 28 blocks won (27.4 -> 21.4,
#: 27.5 -> 21.6), 64 tiles with 16 blocks tied (M=512 2048x4096: 17.1 -> 16.8).
SMALL_M_MANY_TILES = 48
SMALL_M_MANY_TILES_MIN_KB = 24


#: 64-row tiles above 256 rows (:func:`small_m_dispatch_config`): where the unsplit 128-row tiles
#: leave SMs idle and 64-row tiles fill one wave at least SMALL_M_64_ROW_FILL full, with at least
#: SMALL_M_64_ROW_MIN_KB K blocks. H100 (scripts/wide_sweep.py --only block_m, 3 interleaved
#: rounds, benchmarks/results/h100/wide-bm-20261123.json; 128-row dispatch -> 64-row, us):
#: 384x2048x2048 10.7 -> 7.8, 384x2048x4096 17.2 -> 13.3, 512x2048x2048 10.7 -> 7.9 (the portable
#: kernel gemm() ran there: 9.6-10.8), 512x2048x4096 17.1 -> 13.3. Lost 0.70-0.84x on the 24 other
#: rows (M = 384-1024): where 64-row tiles need two waves, or where the 128-row rule splits K
#: (512x2048x7168 split 2: 22.2 vs 30.2).
SMALL_M_64_ROW_MIN_M = 257
SMALL_M_64_ROW_FILL = 0.7
SMALL_M_64_ROW_MIN_KB = 16

#: 64-row tiles at 64 < M <= SMALL_M_64_ROW_ANY_MAX_M: one wave of them, unsplit or split in up to
#: SMALL_M_64_ROW_MAX_SPLIT K ranges of >= SMALL_M_64_ROW_MIN_KB blocks each, filled >=
#: SMALL_M_64_ROW_FILL, whatever the 128-row rule gives. H100 (benchmarks/NOTES.md, 2026-11-23,
#: "64-row tiles at 64 < M <= 256"; 3-5 interleaved rounds; results/h100/small-m-64row-20261123.txt):
#: * sweep, 24 rows at M = 96-256 (128-row dispatch -> 64-row, us): 128x7168x7168 split 2 31.0 ->
#:   26.7 unsplit, 128x7168x4096 18.4 -> 15.3, 128x7168x16384 56.1 -> 52.9, 192x4096x7168 split 2
#:   27.5 -> 22.0, 256x4096x7168 split 2 23.7 -> 21.8; split 2: 128x4096x7168 split 3 20.5 ->
#:   19.2, 192x2112x7168 split 3 18.4 -> 16.3. Lost where 64-row tiles need two waves (192 / 256
#:   x 7168: 0.70-0.87x) or fill less than 70% (128x2112x7168, 68 units: 0.91x);
#: * through gemm(), the 19 rows the rule changes (old rule's choice -> this one): 1.05-1.32x, e.g.
#:   128x7168x2048 10.8 -> 9.3 (the portable kernel ran before), 192x4096x4096 18.2 -> 13.8,
#:   256x4096x2048 10.3 -> 8.1 (portable before);
#: * short K: split 2 at 32 K blocks 128x4096x4096 14.7 -> 13.7, 96x4096x4096 13.8 -> 13.2; at 16
#:   K blocks split 2 lost (128x4096x2048 0.74x), unsplit tiles filling 48% too (0.91x);
#: * split 3 (34 tiles x 3 = 102 units, vs the 128-row tiles' split 6): 128x2112x7168 14.5 ->
#:   13.4, 96x2112x7168 14.0 -> 13.0, 128x2048x7168 14.3 -> 13.2, 256x1280x7168 (split 5) 14.6 ->
#:   13.2, 128x2048x16384 22.8 -> 22.3; at 32 K blocks (10-11 per range) 0.98x: ranges of >= 16.
#: Above 256 rows the 128-row split won (benchmarks/NOTES.md 2026-11-23, "64-row tiles above 256
#: rows": 512x2048x7168 split 2 22.2 vs 30.2 us), so there only the SMALL_M_64_ROW_MIN_M rule
#: applies; at M <= 64 the tiles are 64 rows already.
SMALL_M_64_ROW_ANY_MAX_M = 256
SMALL_M_64_ROW_MAX_SPLIT = 3

#: At 32 < M <= 64, unsplit 64x128 tiles wherever they number SMALL_M_MANY_TILES (48) up to this
#: (exclusive), with >= SMALL_M_64_ROW_MIN_KB K blocks: neither a K split (the rule before split 2
#: from 48 K blocks) nor the portable kernel (below 24 K blocks). H100 at 75809a9 (64x128 tiles with
#: the A-scale ring; out/s10/rows64.py, 5 interleaved rounds, results/h100/small-m-64-unsplit-20261123.txt;
#: gemm() -> unsplit, us): M=64 7168x7168 27.1 -> 24.3, 6144x7168 24.3 -> 22.4, 7168x16384 50.7 ->
#: 48.4, M=40 7168x7168 25.9 -> 24.0 (split 2 before); M=64 7168x2048 9.6 -> 9.3, 8192x2048 10.3
#: -> 9.9, M=40 8192x2048 10.1 -> 9.8 (portable before). 96 tiles (12288x2048) tied (0.98-1.00x),
#: hence the bound; at M <= 32 the portable / skinny kernels stay faster (32x7168x16384 0.98x,
#: 32x7168x2048 0.96x).
SMALL_M_64_UNSPLIT_MAX_TILES = 96


#: Most K ranges of a small-M split: each SPLIT value is its own compile (the spread reduction
#: unrolls over the ranges), and the sweep's best splits were <= 14.
SMALL_M_SPLIT_MAX = 16


def small_m_split(tiles: int, nk: int, num_sms: int = 132) -> int:
    """K split of the small-M wide kernel (spread reduction) for ``tiles`` output tiles of nk K
    blocks: about SMALL_M_TARGET_UNITS units, all in one wave (tiles * split <= SMs), at most
    SMALL_M_SPLIT_MAX, every range of the launcher's plan (_split_plan_kb: whole ranges of
    cdiv(nk, split) blocks, the last one shorter) >= 4 K blocks (_SPLITK_MIN_KB), >=
    SMALL_M_MANY_TILES_MIN_KB where the tiles alone fill SMALL_M_MANY_TILES SMs. Returns the
    split the launcher will run (its plan may merge ranges: 7184 = 57 blocks in 14 -> 12 of 5)."""
    s = max(1, min(triton.cdiv(SMALL_M_TARGET_UNITS, max(tiles, 1)), num_sms // max(tiles, 1), SMALL_M_SPLIT_MAX))
    min_kb = SMALL_M_MANY_TILES_MIN_KB if tiles >= SMALL_M_MANY_TILES else _SPLITK_MIN_KB
    while s > 1:
        launched, per = _split_plan_kb(nk, s)
        if launched > 1 and nk - (launched - 1) * per >= min_kb:
            return launched
        s -= 1
    return 1


@functools.lru_cache(maxsize=4096)
def small_m_dispatch_config(m: int, n: int, k: int, num_sms: int = 132,
                            out_elem_bytes: int = 2) -> HopperConfig | None:
    """The wide kernel config for 32 < M <= SMALL_M_HOPPER_MAX where it beat the portable kernel
    on the H100, else None. H100 sweep with the spread reduction (scripts/spread_sweep.py,
    benchmarks/results/h100/spread-sweep-20261122.json: 57 (M, N, K) rows, the DeepSeek-V3 shapes
    at M=16..384 and the moe suite's one-expert shapes at M=64/128/512). Rule:
      * block_m 64 at M <= 64 (one warpgroup; half the wasted wgmma rows of 128), else 128;
        block_n 128 (128 x 256 tiles with a split were 10-60% slower than 128 x 128 at the same
        units on every row);
      * tiles = cdiv(M, block_m) * cdiv(N, 128) >= SMs (every SM has a tile): no split; at
        64 < M <= 256 the cost model's unsplit tile (:func:`choose_small_m_hopper_config`: M=128
        24576x1536 27.1 -> 21.0 us, 32768x512 14.4 -> 11.5), at M <= 64 never (24576x1536 18.5
        vs 19.1), above 256 the plain wide rule;
      * else a split from :func:`small_m_split`, taken where K >= 48 blocks, or K >= 24 blocks
        with >= SMALL_M_MANY_TILES tiles. Lost at K = 2048 / 4096 with fewer tiles (M=128 2048x4096
        9.9 -> 11.1, 4096x4096 14.6 -> 15.1, 4096x2048 7.0 -> 10.6; M=64 4096x2048 7.2 -> 8.0).
      * above 256 rows, one unsplit wave of 64-row tiles (4 warps) where the 128-row rule gives
        no split and the 64-row tiles fill >= 70% of the SMs with >= 16 K blocks
        (SMALL_M_64_ROW_MIN_M; 512x2048x2048 and 4096: 1.29-1.37x);
      * first of all, at 64 < M <= 256: one wave of 64-row tiles, unsplit or split 2 / 3, filled
        >= 70% with >= 16 K blocks per range, whatever the 128-row rule gives
        (SMALL_M_64_ROW_ANY_MAX_M: 1.02-1.32x on the rows it changed);
      * at 32 < M <= 64 with 48-95 tiles of 64x128 and >= 16 K blocks: unsplit
        (SMALL_M_64_UNSPLIT_MAX_TILES: 1.02-1.12x over split 2 / the portable kernel).
    Measured, today's dispatch -> this rule (us): M=64 2112x7168 12.5 -> 12.1, 4096x7168 18.4 ->
    17.5, 7168x16384 53.1 -> 51.2, 7168x4096 17.1 -> 15.1; M=128 2112x7168 15.5 -> 14.8, 4096x7168
    21.8 -> 20.8, 7168x4096 21.9 -> 17.6, 7168x7168 32.7 -> 30.7; M=256 2112x7168 20.5 -> 17.4,
    4096x7168 25.0 -> 23.8; M=384 2112x7168 23.0 -> 21.4; M=512 2048x4096 18.2 -> 17.1, 2048x7168
    23.0 -> 21.6; every other row within 1%."""
    if m <= 32 or m > SMALL_M_HOPPER_MAX:
        return None
    nk = triton.cdiv(max(k, 1), 128)
    t64 = triton.cdiv(m, 64) * triton.cdiv(n, 128)
    if 64 < m <= SMALL_M_64_ROW_ANY_MAX_M:
        wave = _one_wave_of_64_rows(t64, nk, SMALL_M_64_ROW_MAX_SPLIT, num_sms, out_elem_bytes)
        if wave is not None:
            return wave
    cfg = _small_m_split_config(m, n, k, nk, num_sms, out_elem_bytes)
    if m >= SMALL_M_64_ROW_MIN_M and (cfg is None or cfg.split_k == 1):
        # unsplit only: above 256 rows a 128-row split beat it (SMALL_M_64_ROW_MIN_M)
        return _one_wave_of_64_rows(t64, nk, 1, num_sms, out_elem_bytes) or cfg
    return cfg


def _wide_64_rows(split: int, out_elem_bytes: int) -> HopperConfig:
    """The 64x128 wide config (one 4-warp math partition, TMA-store epilogue, fullest ring) with
    ``split`` K ranges."""
    return _fill_stages(HopperConfig(variant="wide", block_m=64, block_n=128, num_warps=4, stages=2,
                                     epilogue="tma", split_k=split), out_elem_bytes)


def _one_wave_of_64_rows(t64: int, nk: int, max_split: int, num_sms: int, out_elem_bytes: int) -> HopperConfig | None:
    """The 64-row wide config for ``t64`` 64x128 tiles of ``nk`` K blocks, with the fewest K
    ranges (1..max_split, each >= SMALL_M_64_ROW_MIN_KB blocks) that fill one wave at least
    SMALL_M_64_ROW_FILL full; None if none does."""
    for split in range(1, max_split + 1):
        if SMALL_M_64_ROW_FILL * num_sms <= t64 * split <= num_sms and nk >= SMALL_M_64_ROW_MIN_KB * split:
            return _wide_64_rows(split, out_elem_bytes)
    return None


def _small_m_split_config(m: int, n: int, k: int, nk: int, num_sms: int, out_elem_bytes: int) -> HopperConfig | None:
    """small_m_dispatch_config's rule before the 64-row tiles above 256 rows (its docstring)."""
    bm = 64 if m <= 64 else 128
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, 128)
    if tiles >= num_sms:
        if bm == 64 or m > 256:
            return None
        cfg = choose_small_m_hopper_config(m, n, k, num_sms, out_elem_bytes)
        return cfg if cfg.split_k == 1 else None
    if bm == 64 and SMALL_M_MANY_TILES <= tiles < SMALL_M_64_UNSPLIT_MAX_TILES and nk >= SMALL_M_64_ROW_MIN_KB:
        return _wide_64_rows(1, out_elem_bytes)
    if nk < SMALL_M_MANY_TILES_MIN_KB or (nk < 2 * SMALL_M_MANY_TILES_MIN_KB and tiles < SMALL_M_MANY_TILES):
        return None
    cfg = HopperConfig(variant="wide", block_m=bm, block_n=128, num_warps=bm // 16, stages=2, epilogue="tma",
                       split_k=small_m_split(tiles, nk, num_sms), split_reduce="spread")
    return _fill_stages(cfg, out_elem_bytes)


#: Fewest K blocks (128 wide) per split-K range: below 4 the per-unit fixed cost (ring fill, the
#: fp32 partial tile store, the reduction's read-back of the partials) is not amortised, and a
#: 3-6 stage ring never reaches its steady state. A choice, not measured.
_SPLITK_MIN_KB = 4
#: Per-unit fixed cost of a split unit in K-block equivalents for :func:`choose_small_m_hopper_config`:
#: a 128 x 256 fp32 partial is 128 KB written + read back once, about 2.7 x the 48 KB a K block
#: loads, plus the ring fill of the unit's first blocks. An estimate, not measured (tune on the H100).
_SPLITK_UNIT_COST_KB = 4


@functools.lru_cache(maxsize=4096)
def choose_small_m_hopper_config(m: int, n: int, k: int, num_sms: int = 132, out_elem_bytes: int = 2) -> HopperConfig:
    """Wide-kernel config with fused split-K for few output tiles (decode / small prefill: M <= 256,
    or generally cdiv(M, 128) * cdiv(N, block_n) < num_sms), where unsplit tiles leave most SMs
    idle. Its cost model ranks configs; ``small_m_dispatch_config`` decides from H100
    measurements where they run.

    Rule: over block_n in (256, 128) and split s in 1..max(1, nk // 4) (nk = cdiv(K, 128); every
    split keeps >= 4 K blocks, ``_SPLITK_MIN_KB``; only s = 1 is tried where tiles >= num_sms), minimise
    the modelled time of the busiest SM
        waves(s) * (block_n / 128) * (cdiv(nk, s) + 4),   waves(s) = cdiv(tiles * s, num_sms)
    (per unit: its K blocks of block_n / 128 halves each, plus ``_SPLITK_UNIT_COST_KB`` for the
    partial store / reduction and ring fill). ``waves`` charges for wave quantisation: 140 units on
    132 SMs take two rounds, so "the smallest s with units >= num_sms" is not always best (M=128,
    N=7168, K=16384: 28 tiles of 256 x 5 = 140 units is worse than 56 tiles of 128 x 2 = 112).
    Ties: fewer units (less workspace traffic), then block_n 256 (A read once per 256 columns).
    Examples (132 SMs): M=128 N=2112 K=7168 -> 128 x 128 tiles, split 7 (119 units of 8 K blocks);
    M=128 N=7168 K=16384 -> 128 x 128, split 2 (112 units of 64 K blocks).
    Stages: as many as fit next to the TMA-store tile (_fill_stages)."""
    nk = triton.cdiv(max(k, 1), 128)
    max_split = max(1, nk // _SPLITK_MIN_KB)
    best = None
    for bn in (256, 128):
        tiles = triton.cdiv(max(m, 1), 128) * triton.cdiv(max(n, 1), bn)
        # every SM has a tile already: splitting would only trade wave quantisation against
        # workspace traffic, which the model's unmeasured unit cost cannot judge
        for s in range(1, (max_split if tiles < num_sms else 1) + 1):
            units = tiles * s
            cost = triton.cdiv(units, num_sms) * (bn // 128) * (triton.cdiv(nk, s) + _SPLITK_UNIT_COST_KB)
            key = (cost, units, -bn)
            if best is None or key < best[0]:
                best = (key, bn, s)
    _, bn, s = best
    cfg = HopperConfig(variant="wide", block_m=128, block_n=bn, num_warps=8, stages=2, epilogue="tma", split_k=s)
    return _fill_stages(cfg, out_elem_bytes)


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


@functools.lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms_of(device: torch.device) -> int:
    """SM count of a CUDA device (cached query): the tile choosers balance work over it."""
    return _num_sms(_dev_index(device))


def _tma_2d_reason(name: str, t: torch.Tensor) -> str | None:
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
            r = _tma_2d_reason(name, t)
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


def _split_plan_kb(num_k: int, split_k: int) -> tuple[int, int]:
    """(splits launched, K blocks per split) for ``split_k`` requested splits of ``num_k`` K
    blocks: the portable launcher's plan (ops/gemm.py::_split_plan) in 128-wide K blocks, so
    no split is empty. 9 blocks in 3 -> 3, 3, 3; 5 in 2 -> 3, 2; 5 in 4 -> 3 splits of 2, 2, 1."""
    from .gemm import _split_plan

    splits, per = _split_plan(num_k * 128, 128, split_k)
    return splits, per // 128


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
        from ..kernels.hopper.skinny import fp8_block_gemm_skinny_kernel

        return fp8_block_gemm_skinny_kernel
    if variant == "wide":
        from ..kernels.hopper.wide import fp8_block_gemm_wide_kernel

        return fp8_block_gemm_wide_kernel
    raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")


_GL_OUT = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


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
                               out2: torch.Tensor, cfg: HopperConfig) -> None:
    """Launch into ``out2 [M, N]`` (written in full). No validation beyond what TMA needs:
    ``a2 [M, K]`` e4m3 (K stride 1, 16-byte row stride/base), ``a_s2 [M, ceil(K/128)]`` fp32 (any
    strides), ``b_data [N, K]`` e4m3 (same TMA constraints), ``b_scale [ceil(N/128),
    ceil(K/128)]`` fp32 (any strides), ``out2`` bf16/fp16/fp32 with unit column stride.
    Raises :class:`HopperUnsupported` if A/B violate the TMA constraints, or for a spread split-K
    whose splits outnumber the programs (each split of a tile needs its own). No host synchronisation.
    ``cfg.split_k > 1`` or ``cfg.tail_split > 1`` ("wide"; :func:`_wide_split_plan`): fused
    split-K of all tiles / of the last partial wave's tiles; allocates an fp32 workspace
    ``[split tiles, splits, block_m, block_n]`` per call (one tile-shaped slot per unit; at
    32 < M <= 128 up to 4x the M x N partials of a [splits, M, N] layout, the rows past M are
    never touched) (torch.empty; inside a CUDA-graph capture it comes from the graph's pool) and uses
    the shared self-resetting tile counters of the portable kernel (``ops.gemm._splitk_counters``:
    one buffer per (device, stream), one per device for graph captures).
    Where the Gluon kernels cannot be built on this triton (:func:`gluon_unavailable_reason`, or
    this launch's compile / load fails: recorded, one warning per process), the portable kernel
    computes ``out2`` instead."""
    if gluon_unavailable_reason() is None:
        try:
            _gemm_gluon(a2, a_s2, b_data, b_scale, out2, cfg)
            return
        except Exception as e:
            if not _is_build_failure(e):
                raise
            _record_gluon_failure(f"compiling the {cfg.variant!r} kernel failed: {_failure_text(e)}")
    _portable_gemm(a2, a_s2, b_data, b_scale, out2)


def _gemm_gluon(a2: torch.Tensor, a_s2: torch.Tensor, b_data: torch.Tensor, b_scale: torch.Tensor,
                out2: torch.Tensor, cfg: HopperConfig) -> None:
    """:func:`gemm_fp8_block_hopper_impl` on the Gluon kernels (no fallback)."""
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
        reason = _tma_2d_reason(name, t)  # host-side only, no sync
        if reason is not None:
            raise HopperUnsupported(reason)
    bk = 128
    if cfg.variant == "skinny":
        _launch_skinny(a2, a_s2, b_data, b_scale, out2, cfg)
        return
    la = _smem_layout(cfg.block_m, bk, "float8e4nv")
    lb = _smem_layout(cfg.block_n, bk, "float8e4nv")
    a_desc = TensorDescriptor(a2, [m, k], [a2.stride(0), 1], [cfg.block_m, bk], la)
    b_desc = TensorDescriptor(b_data, [n, k], [b_data.stride(0), 1], [cfg.block_n, bk], lb)
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    grid = (min(tiles, _num_sms(_dev_index(out2.device))),)
    if cfg.variant == "wide":
        # TMA store when the output allows it; the masked store otherwise (any N, any row stride).
        epi = _EPI_CODE.get(cfg.epilogue, 1) if (_tma_store_ok(out2)
                                                 and cfg.smem_bytes(out2.element_size()) <= _SMEM_LIMIT) else 1
        split = cfg.split_wg and cfg.block_m == 128
        rows = cfg.block_m // 2 if split else cfg.block_m
        if epi >= 2:
            lc = _smem_layout(rows, 128, _GL_OUT[out2.dtype])
            c_desc = TensorDescriptor(out2, [m, n], [out2.stride(0), 1], [rows, 128], lc)
        else:
            c_desc = a_desc  # unused by the kernel when EPI == 1
        nsm = _num_sms(_dev_index(out2.device))
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
            TAIL=split_from > 0 and nsplit > 1, SPREAD=spread, num_warps=4 if split else cfg.num_warps)
        return
    raise ValueError(f"cfg.variant: expected one of {VARIANTS}, got {cfg.variant!r}")


def _launch_wide(grid, spread: bool, *args, **kwargs) -> None:
    """Launch the wide kernel; a spread split-K launch is cooperative: its units wait for each
    other, so the driver must co-schedule the whole grid (or fail the launch) instead of the
    kernel relying on a GPU of its own. Such a failure is re-raised with the way out."""
    try:
        _kernel_for("wide")[grid](*args, launch_cooperative_grid=spread, **kwargs)
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
    _kernel_for("skinny")[(tiles * nsplit,)](
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
        config: :class:`HopperConfig` (variant + tiles); default :func:`choose_hopper_config`.

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
    cfg = config or choose_dispatch_config(m, n, k, out.element_size(), num_sms=_num_sms(_dev_index(b.data.device)))
    gemm_fp8_block_hopper_impl(a2, a_s2, b.data, b.scale, out.view(m, n), cfg)
    return out


def grouped_raster(block_m: int, block_n: int) -> int:
    """GROUP_M of the grouped (MoE) wide kernel for a tile: 1 (plain row-major tile order) for
    128 x 128, else 8. H100 (scripts/grouped_sweep.py --moe, benchmarks/results/h100/
    grouped-sweep-20261122.json): 128 x 128 with GROUP_M 1 was within 1% of the best of 1 / 8 on 17
    of the 20 m=128 rows (geomean 0.974 of the best candidate vs 0.963 with 8); 64 x 128: 8 (0.990
    vs 0.993 geomean at m=64, but min 0.969 vs 0.921)."""
    return 1 if (block_m, block_n) == (128, 128) else 8


@functools.lru_cache(maxsize=4096)
def choose_grouped_config(rows_per_expert: float, n: int, k: int, num_sms: int = 132,
                          out_elem_bytes: int = 2, experts: int = 8) -> HopperConfig:
    """Grouped (MoE) tiles on the wide kernel, from an H100 sweep of the moe suite's E=8 / E=4
    rows and the masked rows (scripts/grouped_sweep.py --moe; 8 candidates per row, CUDA-graph
    medians; benchmarks/results/h100/grouped-sweep-20261122.json):
      * <= 64 rows per expert: 64 x 128 (one math warpgroup, no 64-row expert padded to 128)
        -- geomean 0.990 of the best candidate over 20 rows, min 0.969; the 64 x 256 tile used
        before: 0.914, min 0.719 (E=4 N=2048: 64 tiles of 256 columns leave half the SMs idle);
      * 64 < rows <= 128: 128 x 128 (GROUP_M 1) -- 0.974 of the best, vs 0.854 for the 128 x 256
        tile used before (e.g. masked m=128 N=7168 K=2048: 465 -> 523 TFLOP/s; N=4096 K=7168
        583 -> 618); unless experts x cdiv(N, 128) < num_sms / 2, where 64 x 128 (twice the tiles)
        won (E=4 m=128 N=2048: 1.09-1.18x the 128 x 128 tile);
      * more rows: 128 x 256 (two 128-column halves; A read once per 256 columns): the best or
        within 3% on the 18 m=512 rows (128 x 128: 0.917); 128 x 128 below N = 2048.
    Stages fill the shared memory next to the masked-store scratch (_fill_stages: 6 for 64x128,
    5 for 128x128 since the A-scale ring, 4 for 128x256); grouped tiles use the masked epilogue.
    Tail split (:func:`tail_split_for`) of the 128 x 256 tiles, for the tile count of ``experts``
    experts of ceil(rows_per_expert) rows each (exact for equal segments; masked: for full
    counts); the kernel splits only where the real count's last wave fits the split
    (``_grouped_plan``). H100, moe rows with 3 waves + 52 tiles, tail split 2 vs none (5
    interleaved rounds, scripts/grouped_tail_ab.py, results/h100/grouped-tail-ab-20261123.json
    and an earlier run, benchmarks/NOTES.md 2026-11-23, "A grouped tail split"): E=4 m=512
    N=7168 K=7168 1.08-1.10x (216.3 -> 197.0 us), K=4096 1.05-1.06x; none at K=2048 (below
    TAIL_SPLIT_MIN_KB; split 2 measured 0.94x). Not for the 64 / 128-row tiles of m <= 128: those
    launches stream weights (81-88% of the memory floor), the last wave's idle SMs cost nothing
    there: E=8 m=64 / m=128 N=7168 K=4096 / 7168 split 2 measured 0.975-1.006x."""
    if rows_per_expert <= 64:
        bm, bn = 64, 128
    elif rows_per_expert <= 128:
        bm, bn = (64, 128) if experts * triton.cdiv(n, 128) < num_sms // 2 else (128, 128)
    else:
        bm, bn = 128, (256 if n >= 2048 else 128)
    est_tiles = experts * triton.cdiv(math.ceil(rows_per_expert), bm) * triton.cdiv(n, bn)
    cfg = HopperConfig(variant="wide", block_m=bm, block_n=bn, num_warps=4 * (bm // 64), stages=2,
                       group_m=grouped_raster(bm, bn), epilogue="masked",
                       tail_split=tail_split_for(est_tiles, k, num_sms) if bn == 256 else 1)
    return _fill_stages(cfg, out_elem_bytes)


def _fill_stages(cfg: HopperConfig, out_elem_bytes: int, dual: bool = False) -> HopperConfig:
    """As many ring stages as fit in shared memory next to the epilogue buffer (2..6)."""
    stage_bytes = cfg.stage_bytes()
    fixed = cfg.smem_bytes(out_elem_bytes, dual=dual) - cfg.stages * stage_bytes
    stages = max(2, min(6, (_SMEM_LIMIT - fixed) // stage_bytes))
    return dataclasses.replace(cfg, stages=stages)


@functools.lru_cache(maxsize=4096)
def choose_swiglu_config(mode: int, rows: int, rows_per_expert: float, n: int, num_sms: int = 132,
                         out_elem_bytes: int = 2) -> HopperConfig:
    """SwiGLU tiles on the wide kernel (DUAL): block_n is always 256 = 128 gate rows + the 128 up
    rows of the same output columns (both halves one 128-row weight-scale block). block_m:
    grouped as :func:`choose_grouped_config`; dense 128 unless fewer 128-row tiles than SMs
    (then 64: twice the tiles for small M). Dense: TMA-store epilogue, grouped: masked store."""
    if mode == 0:
        bm = 128 if triton.cdiv(rows, 128) * triton.cdiv(n, 128) >= num_sms else 64
    else:
        bm = 64 if rows_per_expert <= 64 else 128
    cfg = HopperConfig(variant="wide", block_m=bm, block_n=256, num_warps=4 * (bm // 64), stages=2,
                       epilogue="tma" if mode == 0 else "masked")
    return _fill_stages(cfg, out_elem_bytes, dual=True)


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
            r = _tma_2d_reason(name, t)
            if r is not None:
                return r
    return None


def grouped_fp8_block_hopper_impl(a_data: torch.Tensor, a_scale: torch.Tensor, b_data: torch.Tensor,
                                  b_scale: torch.Tensor, seg: torch.Tensor | None, mode: int, out: torch.Tensor,
                                  cfg: HopperConfig | None = None, b2_data: torch.Tensor | None = None,
                                  b2_scale: torch.Tensor | None = None) -> None:
    """Grouped fp8_block GEMM (or SwiGLU with ``b2_*``) on the wide Gluon kernel, written into ``out``.
    No host sync.

    mode 1 (contiguous): ``a_data [sum_m, K]`` e4m3, ``a_scale [sum_m, ceil(K/128)]`` fp32,
        ``seg`` int32 offsets ``[E+1]`` (device), ``out [sum_m, N]``.
    mode 2 (masked): ``a_data [E, max_m, K]``, ``a_scale [E, max_m, nk]``, ``seg`` int32 counts
        ``[E]`` (device), ``out [E, max_m, N]``: rows past a count are not written.
    mode 0 (dense; SwiGLU only): ``a_data [M, K]``, ``b_data [N, K]``, ``out [M, N]``, ``seg`` unused.
    ``b_data [E, N, K]`` e4m3 (experts stacked contiguously), ``b_scale [E, ceil(N/128), nk]`` fp32.
    ``b2_data`` / ``b2_scale`` (SwiGLU up weights; ``b_*`` are the gate): same shapes and strides;
    ``out = silu(A @ B.T) * (A @ B2.T)``.
    Callers check :func:`grouped_unsupported_reason` first (for both weights when dual).
    Where the Gluon kernels cannot be built on this triton (as :func:`gemm_fp8_block_hopper_impl`),
    the portable grouped kernel computes ``out`` instead (its own tiles; ``cfg`` is ignored); so it
    does where an operand's base address is not 16-byte aligned, which only a plan made while
    torch.compile traced (no addresses) can bring here."""
    if gluon_unavailable_reason() is None and not _misaligned_base(a_data, b_data, b2_data):
        try:
            _grouped_gluon(a_data, a_scale, b_data, b_scale, seg, mode, out, cfg, b2_data, b2_scale)
            return
        except Exception as e:
            if not _is_build_failure(e):
                raise
            _record_gluon_failure(f"compiling the 'wide' kernel failed: {_failure_text(e)}")
    _portable_grouped(a_data, a_scale, b_data, b_scale, seg, mode, out, b2_data, b2_scale)


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
    nsm = _num_sms(_dev_index(out.device))
    if cfg is None:
        cfg = (choose_swiglu_config(mode, rows, rows_per_expert, n, nsm, out.element_size()) if dual
               else choose_grouped_config(rows_per_expert, n, k, nsm, out.element_size(), e))
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
    epi = 1
    c_desc = a_desc  # unused by the kernel when EPI == 1
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
    if (mode == 0 and cfg.epilogue in _EPI_CODE and _tma_store_ok(out2)
            and cfg.smem_bytes(out2.element_size(), dual=dual) <= _SMEM_LIMIT):
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
