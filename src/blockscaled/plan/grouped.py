"""Grouped (MoE), SwiGLU and list plans: ``plan_grouped`` and ``plan_grouped_list``.

fp8_block x 128x128 weights on sm_90 where TMA can take the operands: the Hopper wide kernel
with the tile rules below (measured on the moe suite and the masked rows); everything else: the
portable grouped kernel or dequantize + cuBLAS (plan/grouped_portable.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from ..config.hopper import HopperConfig
from .dense import MIN_KB_PER_SPLIT, hopper_fill_stages
from .direct import grouped_direct_config, grouped_direct_reason
from .device import DeviceInfo
from .stream import STREAM_GROUPED_MAX_ROWS, grouped_stream_config, grouped_stream_reason, grouped_stream_split_why
from ..config.gemm import GemmConfig
from .grouped_portable import (batched_rows_unaligned, check_grouped_config, choose_grouped_config,
                               dequant_matmul_reason)
from .tiled import (dequant_matmul_us, grouped_tiled_config, grouped_tiled_reason, grouped_tiles_words,
                    kernel_words)
from .splits import cdiv as _cdiv
from .types import DTYPES, Plan, Problem

__all__ = ["plan_grouped", "plan_grouped_list", "grouped_hopper_config", "swiglu_hopper_config",
           "tail_split_for", "SWIGLU_HOPPER_MIN_M", "stacked_swiglu_plan"]

_DTYPES = DTYPES
_MODES = {"dense": 0, "contiguous": 1, "masked": 2}

#: Most K ranges a tail-split tile is cut into. H100 (tail-split sweep with the spread reduction,
#: results/h100/archive/tail-split-sweep-spread-20261122.json, us by split): 1024x2112x7168 (4
#: tail tiles) 5: 39.0, 8: 37.3, 11: 37.2, 14: 36.5 (off: 54.0); 16 = the most a 4-tile tail of
#: K=7168 can use with >= 4 K blocks per range.
TAIL_SPLIT_MAX = 16
#: Fewest K blocks for a grouped tail split: E=4 m=512 N=7168 K=7168 1.08-1.10x, K=4096
#: 1.05-1.06x, none at K=2048 (split 2 measured 0.94x; results/h100/archive/grouped-tail-ab-20261123.json).
TAIL_SPLIT_MIN_KB = 32
#: Dense SwiGLU runs the Hopper kernel from this many rows. H100 (CUDA-graph medians, K=7168, N=18432 /
#: 2048 / 4096): Hopper vs portable 0.90 / 0.66 / 0.84x at M=16, 0.90 / 0.85 / 0.90x at M=64,
#: 1.06 / 1.32 / 1.26x at M=128, 1.3-1.9x above.
SWIGLU_HOPPER_MIN_M = 128


def tail_split_for(tiles: int, k: int, num_sms: int) -> int:
    """Tail split of ``tiles`` 128x256 tiles: the last partial wave's tiles in as many K ranges as
    still fit one wave (<= TAIL_SPLIT_MAX, >= MIN_KB_PER_SPLIT blocks each), only after a full wave
    and at K >= TAIL_SPLIT_MIN_KB blocks; 1 = none."""
    full = (tiles // num_sms) * num_sms
    tail = tiles - full
    nk = _cdiv(max(k, 1), 128)
    if full == 0 or tail == 0 or nk < TAIL_SPLIT_MIN_KB:
        return 1
    split = min(num_sms // tail, nk // MIN_KB_PER_SPLIT, TAIL_SPLIT_MAX)
    return split if split >= 2 else 1


def grouped_raster(block_m: int, block_n: int) -> int:
    """GROUP_M of the grouped wide kernel: 1 for 128x128 (within 1% of the best of 1 / 8 on 17 of
    20 m=128 moe rows, geomean 0.974 vs 0.963 with 8), else 8 (64x128: min 0.969 vs 0.921)."""
    return 1 if (block_m, block_n) == (128, 128) else 8


@functools.lru_cache(maxsize=4096)
def grouped_hopper_config(rows_per_expert: float, n: int, k: int, num_sms: int = 132, out_elem_bytes: int = 2,
                          experts: int = 8) -> HopperConfig:
    """Grouped tiles on the wide kernel (H100 sweep of 8 tiles on the moe suite's E=8 / E=4 and masked
    rows, results/h100/archive/grouped-sweep-20261122.json, geomean of the per-row best):
      * <= 64 rows per expert: 64x128 (0.990, min 0.969; 64x256 0.914);
      * <= 128: 128x128 (0.974; 128x256 0.854), unless experts x cdiv(N, 128) < SMs / 2: 64x128
        (twice the tiles; E=4 m=128 N=2048 1.09-1.18x);
      * more: 128x256 (best or within 3% on the 18 m=512 rows), 128x128 below N = 2048;
    masked epilogue (a tile may cover the next expert's rows); tail split of 128x256 tiles for the
    tile count of equal segments (the kernel splits only where the real last wave fits)."""
    if rows_per_expert <= 64:
        bm, bn = 64, 128
    elif rows_per_expert <= 128:
        bm, bn = (64, 128) if experts * _cdiv(n, 128) < num_sms // 2 else (128, 128)
    else:
        bm, bn = 128, (256 if n >= 2048 else 128)
    est_tiles = experts * _cdiv(math.ceil(rows_per_expert), bm) * _cdiv(n, bn)
    cfg = HopperConfig(variant="wide", block_m=bm, block_n=bn, num_warps=4 * (bm // 64), stages=2,
                       group_m=grouped_raster(bm, bn), epilogue="masked",
                       tail_split=tail_split_for(est_tiles, k, num_sms) if bn == 256 else 1)
    return hopper_fill_stages(cfg, out_elem_bytes)


@functools.lru_cache(maxsize=4096)
def swiglu_hopper_config(mode: int, rows: int, rows_per_expert: float, n: int, num_sms: int = 132,
                         out_elem_bytes: int = 2) -> HopperConfig:
    """SwiGLU tiles on the wide kernel (DUAL): block_n 256 = 128 gate rows + the 128 up rows of the
    same output columns. block_m: grouped 64 up to 64 rows per expert else 128; dense 128 unless
    fewer 128-row tiles than SMs (then 64). Dense: TMA-store epilogue, grouped: masked store."""
    if mode == 0:
        bm = 128 if _cdiv(rows, 128) * _cdiv(n, 128) >= num_sms else 64
    else:
        bm = 64 if rows_per_expert <= 64 else 128
    cfg = HopperConfig(variant="wide", block_m=bm, block_n=256, num_warps=4 * (bm // 64), stages=2,
                       epilogue="tma" if mode == 0 else "masked")
    return hopper_fill_stages(cfg, out_elem_bytes, dual=True)


def _a_dtype(p: Problem):
    return None if not p.weight_only else _DTYPES[p.a]


def plan_grouped(p: Problem, dev: DeviceInfo, forced=None, *, hopper_why: str | None = None,
                 a_row_stride: int = 0) -> Plan:
    """The plan of a grouped GEMM (``p.op == "grouped"``) or SwiGLU (``"swiglu"``).

    ``hopper_why``: why the Hopper wide kernel cannot take these operands (None: it can; the
    caller checks format, device and TMA). ``forced``: ``config=`` (GemmConfig / dict, checked;
    ``strategy="hopper"`` asks for the Hopper tiles and raises where they cannot run; a
    HopperConfig runs as given)."""
    mode = _MODES[p.grouping]
    out_dtype = _DTYPES[p.out_dtype]
    a_dtype = _a_dtype(p)
    device = torch.device("cuda" if dev.kind == "cuda" else "cpu")
    backend = "cuda" if dev.kind == "cuda" else "interpreter"
    forced_hopper = isinstance(forced, HopperConfig) or (
        forced is not None and _strategy(forced) == "hopper")
    if forced_hopper and hopper_why is not None:
        raise ValueError(f"config.strategy: 'hopper' cannot run this call: {hopper_why}")
    if dev.kind == "cpu" and not p.interpret:
        return Plan(p.op, "reference", None, p, reasons=(
            "CPU tensors without TRITON_INTERPRET=1: the float64 reference, rounded once to the output dtype",))
    preferred = hopper_why is None and (p.op != "swiglu" or mode != 0 or p.m >= SWIGLU_HOPPER_MIN_M)
    if isinstance(forced, HopperConfig):
        return Plan(p.op, backend, forced, p, reasons=("forced by config=",))
    if forced_hopper or (forced is None and preferred):
        if p.dual:
            cfg = swiglu_hopper_config(mode, p.m, p.rows_per_expert, p.n, dev.sm_count, p.out_bytes)
            rule = ("SwiGLU tiles: block_n 256 = 128 gate + 128 up rows; block_m from the rows per expert "
                    "(dense: 64 where 128-row tiles leave SMs idle)")
        else:
            cfg = grouped_hopper_config(p.rows_per_expert, p.n, p.k, dev.sm_count, p.out_bytes, p.experts)
            rule = (f"grouped tiles for ~{p.rows_per_expert:g} rows per expert: 64x128 up to 64 rows, 128x128 up "
                    "to 128, 128x256 above (moe-suite sweep); masked epilogue")
        tiles = p.experts * _cdiv(math.ceil(max(p.rows_per_expert, 1)), cfg.block_m) * _cdiv(p.n, cfg.block_n // (2 if p.dual else 1))
        reasons = ["fp8_block x 128x128 weights on sm_90: the Hopper wide kernel" +
                   (" (forced by config=)" if forced_hopper else ""), rule,
                   f"~{tiles} tiles on {dev.sm_count} SMs ({tiles / dev.sm_count:.2f} waves)"]
        if cfg.tail_split > 1:
            reasons.append(f"tail split {cfg.tail_split}: the last partial wave's tiles in K ranges "
                           "(decided on the device from the real tile count)")
        return Plan(p.op, backend, cfg, p, reasons=tuple(reasons))
    if forced is not None and _strategy(forced) == "tiled":
        if p.dual and p.fmt in SPLIT_SWIGLU_FORMATS and p.grouping != "dense":
            # a SwiGLU runs the tiled kernel only split (``_split_swiglu_plan``): gate and up each the
            # forced grouped GEMM with fp32 output
            one = _forced_tiled(_projection(p), dev, forced, backend)
            return Plan(p.op, backend, one.config, p, reasons=(
                "forced by config=: the split SwiGLU, gate and up each the grouped tiled kernel with fp32 output, "
                "then silu(gate) * up in one pass",))
        return _forced_tiled(p, dev, forced, backend)
    if forced is not None:
        cfg = check_grouped_config(forced, p.fmt, a_dtype=a_dtype, grouping=p.grouping, out_dtype=out_dtype,
                                   n=p.n, k=p.k, device=device, a_row_stride=a_row_stride)
        return Plan(p.op, backend, cfg, p, reasons=("forced by config=",))
    if p.dual and forced is None and SPLIT_SWIGLU and p.fmt in SPLIT_SWIGLU_FORMATS and p.grouping != "dense":
        split = _split_swiglu_plan(p, dev, backend, hopper_why, a_row_stride)
        if split is not None:
            return split
    stream_why = grouped_stream_reason(p, dev)
    if grouped_direct_reason(p, dev, stream_why) is None:
        split, split_why = grouped_stream_split_why(p, 8, dev)
        cfg = grouped_direct_config(p, split)
        return Plan(p.op, backend, cfg, p, reasons=(
            f"{p.fmt} weight-only on sm_90, ~{p.rows_per_expert:g} rows per expert",
            f"register-streaming kernel, grouped (kernels/hopper/direct.py): one program per expert slot x 64-row "
            f"tile, the experts' rows in blocks of 8 on mma.sync, no shared memory in the K loop (plan/direct.py "
            f"DIRECT_GROUPED_MAX_ROWS); {split_why}"))
    if stream_why is None:
        cfg = grouped_stream_config(p, dev)
        return Plan(p.op, backend, cfg, p, reasons=(
            (f"{p.fmt} weight-only" if p.weight_only else f"{p.fmt} x {p.fmt} (activations " + (
                "dequantized to bf16 by one pass first" if cfg.dequant_a else "decoded in the kernel's gather")
             + ", STREAM_GATHER_MAX_MP)") + f" on sm_90, ~{p.rows_per_expert:g} rows per expert",
            f"streaming kernel, grouped (kernels/hopper/stream.py): one program per expert x 64-row tile, "
            f"an expert without rows exits at once, its rows in blocks of {cfg.block_m} (plan/stream.py, "
            f"STREAM_GROUPED_MAX_ROWS); {grouped_stream_split_why(p, cfg.block_m, dev)[1]}"))
    if stream_why is not None and grouped_tiled_reason(p, dev, p.tma) is None:
        cfg, t = grouped_tiled_config(p, dev)
        dq_why = (dequant_matmul_reason(p.fmt, p.grouping, out_dtype, a_dtype, p.n, p.k, dev, a_row_stride)
                  or batched_rows_unaligned(p.grouping, p.n, p.k))
        t_dq = dequant_matmul_us(p, dev) if dq_why is None else math.inf
        tiles = grouped_tiles_words(p, cfg.block_m, cfg.block_n)
        if t <= t_dq:
            return Plan(p.op, backend, cfg, p, predicted_us=t, reasons=(
                (f"{p.fmt} weight-only" if p.weight_only else f"{p.fmt} x {p.fmt} (activations dequantized to bf16 "
                 "by one pass first)") + f" on sm_90, ~{p.rows_per_expert:g} rows per expert (above the streaming "
                f"kernel's {STREAM_GROUPED_MAX_ROWS:g})",
                f"{kernel_words(cfg)}, grouped: tiles numbered over the experts' rows on the device; {tiles}; "
                f"predicted {t:.1f} us",
                "dequantize + grouped cuBLAS: " + (f"predicted {t_dq:.1f} us" if dq_why is None else dq_why)))
        return Plan(p.op, backend, GemmConfig(strategy="dequant_matmul"), p, predicted_us=t_dq, reasons=(
            f"{p.fmt} on sm_90, ~{p.rows_per_expert:g} rows per expert",
            f"dequantize + grouped cuBLAS bf16: predicted {t_dq:.1f} us against the grouped tiled kernel's {t:.1f} us "
            f"({tiles}; plan/tiled.py)"))
    cfg = choose_grouped_config(p.fmt, p.rows_per_expert, p.n, p.k, dev if dev.kind == "cuda" else device,
                                dual=p.dual, a_dtype=a_dtype, grouping=p.grouping, experts=p.experts,
                                out_dtype=out_dtype, a_row_stride=a_row_stride)
    if cfg.strategy == "dequant_matmul":
        why = "dequantize + cuBLAS (torch._grouped_mm / bmm): the roofline model predicts it faster"
    else:
        why = "portable grouped kernel: tiles from the rows per expert (plan/grouped_portable.py)"
    first = (f"the Hopper kernel cannot take it: {hopper_why}" if hopper_why else
             f"dense SwiGLU below {SWIGLU_HOPPER_MIN_M} rows: the portable kernel measured faster")
    return Plan(p.op, backend, cfg, p, reasons=(first, why))


#: MX / NV SwiGLU (grouped) runs as two grouped GEMMs on the sm_90 MX kernels plus one activation
#: pass where the single projection is planned on one of them (``_split_swiglu_plan``); False keeps
#: the fused portable / dequantize + cuBLAS SwiGLU (the A/B switch)
SPLIT_SWIGLU = True
#: the formats whose grouped GEMM has sm_90 kernels (register-streaming, streaming, tiled) and
#: whose SwiGLU has none: their fused SwiGLU is the portable kernel or dequantize + cuBLAS
SPLIT_SWIGLU_FORMATS = ("mxfp8", "mxfp4", "nvfp4")
#: the strategies a split SwiGLU runs each projection on
_SPLIT_STRATEGIES = ("direct", "stream", "tiled")


def _projection(p: Problem) -> Problem:
    """One projection of a split SwiGLU: the grouped GEMM of the same operands with fp32 output."""
    return dataclasses.replace(p, op="grouped", dual=False, out_dtype="float32")


def _split_swiglu_plan(p: Problem, dev: DeviceInfo, backend: str, hopper_why, a_row_stride: int) -> Plan | None:
    """A grouped MX / NV SwiGLU as gate and up each a grouped GEMM with fp32 output on the kernel
    the grouped planner picks for one projection, then ``silu(gate) * up`` in one elementwise pass
    (ops/_grouped_mx.py ``split_swiglu``); None where that projection would not run on an sm_90 MX
    kernel (the fused kernels stay). Why: the SwiGLU's fused forms are the portable kernel (no
    register-decoded MMA; in the layer suite's MX / NV layers it ran where the down projection
    ran the sm_90 kernels, moe-layer-20261128-1449) and dequantize + cuBLAS, whose bf16 products
    round gate and up before the activation (a quantized intermediate then flips codes: Mixtral nvfp4 W x A at
    4096 tokens was 2.9e-2 from float64, above the layer tolerance). The split's products are fp32
    (the portable kernel's numerics); it costs the up GEMM's launch and the epilogue's (plus an
    offsets rebase per chunk past ``SPLIT_SWIGLU_CHUNK_BYTES``), the fp32 products' bytes
    (2 x rows x N x 4) written and read once, and for quantized activations their one pre-pass
    shared by both GEMMs. The single projection is planned with fp32 output, which leaves
    dequantize + cuBLAS out for contiguous calls (bf16 output only): the split was measured against
    the fused plans up to 4096 tokens (NOTES twenty-ninth session). ``predicted_us``: the two
    GEMMs' prediction (the epilogue not counted)."""
    single = plan_grouped(_projection(p), dev, None, hopper_why=hopper_why, a_row_stride=a_row_stride)
    cfg = single.config
    if not isinstance(cfg, GemmConfig) or cfg.strategy not in _SPLIT_STRATEGIES:
        return None
    t = None if single.predicted_us is None else 2 * single.predicted_us
    return Plan(p.op, backend, cfg, p, predicted_us=t, reasons=(
        f"{p.fmt} SwiGLU on sm_90 split: gate and up each a grouped GEMM with fp32 output on the kernel below, "
        "then silu(gate) * up in one pass (no fused MX / NV SwiGLU kernel; fp32 products, one rounding)",
        *single.reasons))


def stacked_swiglu_plan(single: Plan, out_dtype: str) -> Plan:
    """The plan of a grouped SwiGLU on one stacked ``[E, 2N, K]`` gate_up weight (gate rows, then up
    rows: the checkpoint layout of Mixtral / Qwen / DeepSeek ``gate_up_proj``) from ``single``, the
    plan of the grouped GEMM over all 2N rows with fp32 output: that GEMM on ``single``'s kernel and
    config, then ``silu(gate) * up`` over the two halves of its products in one pass (fp32, one
    rounding: the portable kernel's numerics). Why: one launch of the GEMM where the split runs two
    (at decode a launch's fixed cost is most of its time: Qwen3-30B-A3B gate + up at 1 token, 24 ->
    14 us on the H200, benchmarks/results/h200/archive/stack-gate-up-ab-20261128.json), both halves'
    programs in one grid, and the activations read (or quantized) once."""
    p = single.problem
    if p is not None:
        p = dataclasses.replace(p, op="swiglu", n=p.n // 2, out_dtype=out_dtype)
    return dataclasses.replace(single, op="swiglu", problem=p, reasons=(
        "stacked gate_up: one grouped GEMM over the gate and up rows with fp32 output on the kernel below, "
        "then silu(gate) * up over its two halves in one pass (fp32, one rounding)", *single.reasons))


def _strategy(forced) -> str | None:
    """The strategy a forced ``config=`` (GemmConfig or dict) names."""
    return forced.get("strategy") if isinstance(forced, dict) else forced.strategy


def _forced_tiled(p: Problem, dev: DeviceInfo, forced, backend: str) -> Plan:
    """``config=`` with ``strategy="tiled"`` on a grouped call: the grouped tiled kernel with those
    tiles where it can run (else ValueError with the reason); activations dequantized first for
    W x A whatever ``dequant_a`` says (the kernel reads bf16)."""
    why = grouped_tiled_reason(p, dev, p.tma)
    if why is not None:
        raise ValueError(f"config.strategy: 'tiled' cannot run this grouped call: {why}")
    cfg = forced if isinstance(forced, GemmConfig) else GemmConfig(**forced)
    if cfg.split_k != 1:
        raise ValueError(f"config.split_k: the grouped tiled kernel does not split K, got {cfg.split_k}")
    cfg = dataclasses.replace(cfg, dequant_a=not p.weight_only)
    return Plan(p.op, backend, cfg, p, reasons=("forced by config=",))


def plan_grouped_list(p: Problem, dev: DeviceInfo, forced=None) -> Plan:
    """The list op (G independent GEMMs in one launch): the portable list kernel, tiles for the
    largest group (``p.m``, ``p.n``, ``p.k`` = the largest M, N, K)."""
    backend = "cuda" if dev.kind == "cuda" else "interpreter"
    device = torch.device("cuda" if dev.kind == "cuda" else "cpu")
    if forced is not None:
        cfg = check_grouped_config(forced, p.fmt, grouping="dense", n=p.n, k=p.k, device=device,
                                   allow_dequant=False)
        return Plan(p.op, backend, cfg, p, reasons=("forced by config=",))
    cfg = choose_grouped_config(p.fmt, p.m, p.n, p.k, dev if dev.kind == "cuda" else device, grouping="dense",
                                allow_dequant=False)
    return Plan(p.op, backend, cfg, p, reasons=(
        "one launch over all groups' tiles (pointer table); portable kernel, tiles for the largest group",))

