"""When the sm_90 tiled MX / NV kernel (kernels/hopper/tiled.py) runs, with which split, and what
it costs against the other plans of an MX / NV call above the streaming kernel's rows.

Cost model (per-program time, measured): the kernel runs 128 x 128 output tiles, each program a
chain of 64-element K steps, in one of two regimes: a 5-slot ring (148 KB of shared memory, one
program per SM: a program's time is ``steps x TILED_STEP_US[fmt] + TILED_FIX_US``) or, fp4 only, a
3-slot ring (108 KB: two programs per SM, ``steps x TILED_STEP2_US[fmt] + TILED_FIX2_US`` each, the
two overlapping each other's prologue and barriers); the call takes ``ceil(programs / (regime x
SMs))`` such rounds, and the planner takes the regime and K split with the smallest prediction.
Fitted on two H200 A/Bs of the twentieth session (benchmarks/results/h200/archive/tiled-ab-20261127.json
and tiled-ab2-20261127.json: mxfp4 / nvfp4 (/ mxfp8) weight-only, N x K in 2880 x 2880, 5760 x 2880,
6144 x 4096, 8192 x 8192, 4096 x 14336, 28672 x 8192, M 128-2048, splits 1 / 2 / 4, both rings):
one program per SM (since the TMA producer warp, ops/_tiled.py TILED_WS_MIN_STAGES; its A/B against
the kernel without it: archive/tiled-ws-ab-20261127.json), mxfp4: 8192 x 8192 at M = 256 (128 steps,
one round) 87.7 us and 2880 x 2880 at M = 256 split 2 (23 steps) 26.0 us give 0.588 us per step and
12.5 us per round (nvfp4 0.662, mxfp8 0.703 from their M = 256 8192 x 8192 rows); two per SM, mxfp4:
M = 512 on 2880 x 2880 / 5760 x 2880 / 6144 x 4096 / 8192 x 8192 and M = 128 on 28672 x 8192 (one
round each, 45-128 steps) 54-159 us give 1.17 us per step, ~3 us per round (the prologue hides
behind the other program). Within 10 % of the A/B rows the model was fitted on; the 2-per-SM
regime measured 1.17-1.26x faster per SM wherever the grid holds two rounds or more (ncu, M = 2048
8192 x 8192 with one per SM: 2 warps per scheduler, 41 % of the cycles stalled at CTA barriers,
tensor pipe 37 % busy: latency-bound, so a second program per SM helps). nvfp4 and mxfp8 ran 8-10 %
slower per step; mxfp8's 3-slot ring (120 KB) does not fit twice in an SM. Two per SM is planned
without a K split only: with one, the A/B measured it 1.6-1.9x slower than the model (M = 256 on
8192 x 8192, split 2: 142.7 us, as long as M = 512 unsplit with twice the steps; not understood).

The alternative above 64 rows is dequantize + cuBLAS bf16 (or the portable kernel where the
portable rules keep it): dequantize bytes (packed read, bf16 write; activations too for W x A) at
the copy bandwidth times the dequantize kernel's measured efficiency ``DEQUANT_EFF`` (H200, same
session: mxfp4 58 %, nvfp4 46 %, mxfp8 86 % of a same-run copy), then cuBLAS at
``max(flops / bf16 rate, bytes / bandwidth)``. On the A/B rows that model picks the faster of the
two on 33 of 36 (the three misses within 8 %).
"""

from __future__ import annotations

import math

from .._experimental import mx_kernel_enabled
from ..config.gemm import GemmConfig
from .device import DeviceInfo
from .stream import STREAM_MAX_M, _triton_release
from .types import Problem

__all__ = ["TILED_FORMATS", "tiled_reason", "tiled_config", "tiled_us", "dequant_matmul_us", "TILED_MIN_M",
           "DEQUANT_MATMUL_FIX_US"]

#: weight formats the kernel decodes (the streaming kernel's decode)
TILED_FORMATS = ("mxfp4", "nvfp4", "mxfp8")
#: activations it takes: bf16 (weight-only) or quantized in the weight's format (dequantized exactly
#: to bf16 first); fp16 would need an fp16 decode
TILED_ACTIVATIONS = ("bfloat16", "quantized")
#: planned above the streaming kernel's rows
TILED_MIN_M = STREAM_MAX_M + 1
#: one program per SM (TILED_STAGES_1 slots): per 64-element K step of a 128 x 128 tile, us (fit above,
#: H200); per round of programs (launch, ring fill, epilogue, split-K sum), us
TILED_STAGES_1 = 5
TILED_STEP_US = {"mxfp4": 0.588, "nvfp4": 0.662, "mxfp8": 0.703}
TILED_FIX_US = 12.5
#: two programs per SM (TILED_STAGES_2 slots, fp4 only): per step and per round of 2 x SMs programs
TILED_STAGES_2 = 3
TILED_STEP2_US = {"mxfp4": 1.17, "nvfp4": 1.28}
TILED_FIX2_US = 3.0
#: splits the planner considers (each split keeps >= TILED_MIN_STEPS steps)
TILED_MAX_SPLIT = 8
TILED_MIN_STEPS = 4
#: the dequantize kernel's rate as a fraction of the copy bandwidth (H200, twentieth session:
#: dequantize of 8192 x 28672 / 5760 x 2880 / 8192 x 8192 weights to bf16 against a same-run copy of
#: as many bytes; nvfp4 after its two-division change, 26 % before)
DEQUANT_EFF = {"mxfp4": 0.58, "nvfp4": 0.46, "mxfp8": 0.86}
#: dequantize + cuBLAS beyond its bytes and flops: two launches and the gap between them (H200, same
#: A/B: the plan's measured time over the model's bytes-and-flops time at M = 256 / 2048 on the
#: 2880 x 2880 and 5760 x 2880 rows, +3.0 .. +7.1 us, median 4.5)
DEQUANT_MATMUL_FIX_US = 4.5
#: cuBLAS bf16 rate at prefill sizes (plan/portable.py _BF16_FLOPS: H100 measured 735-785 TFLOP/s)
_BF16_FLOPS = 750e12
#: Triton releases the kernel was checked on (AOT: tests/test_aot_tiled.py; GPU: the H200 A/B)
TILED_TRITON = ((3, 6),)
_TRITON_OK = _triton_release() in TILED_TRITON


#: ``BLOCKSCALED_MX_KERNELS`` without ``tiled`` turns the kernel off
TILED_ENABLED = mx_kernel_enabled("tiled")


def tiled_reason(p: Problem, dev: DeviceInfo, gluon_ok: bool) -> str | None:
    """None when the kernel can take the call, else why not (plain words, for ``explain``)."""
    if p.fmt not in TILED_FORMATS:
        return f"{p.fmt} weights (it takes {', '.join(TILED_FORMATS)})"
    if not dev.is_hopper or not gluon_ok:
        return "not an sm_90 device whose triton builds the Gluon kernels"
    if not TILED_ENABLED or not _TRITON_OK:
        return f"switched off (BLOCKSCALED_MX_KERNELS) or triton {'.'.join(map(str, _triton_release()))} unchecked"
    if p.a not in TILED_ACTIVATIONS:
        return f"{p.a} activations (it takes bf16 or quantized {p.fmt})"
    if p.op != "gemm" or p.grouping != "dense":
        return "not a dense GEMM"
    if p.m < TILED_MIN_M:
        return f"M = {p.m} < {TILED_MIN_M} (the streaming kernel's rows)"
    if p.k % 32 or p.k <= 0:
        return f"K = {p.k} not a positive multiple of 32 (16-byte TMA rows of packed e2m1)"
    if not p.tma:
        return "weights not 16-byte aligned for TMA"
    return None


def tiled_us(p: Problem, dev: DeviceInfo, split: int, per_sm: int = 1) -> float:
    """Predicted time of the kernel with ``split`` and ``per_sm`` programs per SM (1: the
    TILED_STAGES_1 ring, 2: TILED_STAGES_2, fp4 only) (module docstring), activation pass included."""
    steps = -(-p.k // 64)
    per = -(-steps // split)
    programs = -(-p.m // 128) * -(-p.n // 128) * -(-steps // per)
    if per_sm == 2:
        t = math.ceil(programs / (2 * dev.sm_count)) * (per * TILED_STEP2_US[p.fmt] + TILED_FIX2_US)
    else:
        t = math.ceil(programs / dev.sm_count) * (per * TILED_STEP_US[p.fmt] + TILED_FIX_US)
    if not p.weight_only:  # the exact bf16 dequantization of the activations first
        t += _dequant_bytes(p.fmt, p.m, p.k) / (dev.mem_bw * DEQUANT_EFF[p.fmt]) * 1e6
    return t


def _dequant_bytes(fmt: str, rows: int, k: int) -> float:
    eb = 1.0 if fmt == "mxfp8" else 0.5
    scale = 1.0 / (16 if fmt == "nvfp4" else 32)
    return rows * k * (eb + scale + 2)


def dequant_matmul_us(p: Problem, dev: DeviceInfo) -> float:
    """Predicted dequantize (weights; activations too for W x A) + cuBLAS bf16 time."""
    dq = _dequant_bytes(p.fmt, p.n, p.k) + (0 if p.weight_only else _dequant_bytes(p.fmt, p.m, p.k))
    mm = max(2.0 * p.m * p.n * p.k / _BF16_FLOPS, ((p.m + p.n) * p.k * 2 + p.m * p.n * p.out_bytes) / dev.mem_bw)
    return (dq / (dev.mem_bw * DEQUANT_EFF[p.fmt]) + mm) * 1e6 + DEQUANT_MATMUL_FIX_US


def tiled_config(p: Problem, dev: DeviceInfo) -> tuple[GemmConfig, float]:
    """(the config with the ring (programs per SM) and split the model predicts fastest, its us)."""
    steps = -(-p.k // 64)
    best = None
    for per_sm in ((1, 2) if p.fmt in TILED_STEP2_US else (1,)):
        for s in range(1, TILED_MAX_SPLIT + 1 if per_sm == 1 else 2):
            if s > 1 and steps < TILED_MIN_STEPS * s:
                break
            t = tiled_us(p, dev, s, per_sm)
            if best is None or t < best[2] - 1e-9:
                best = (per_sm, s, t)
    per_sm, split, t = best
    return GemmConfig(block_m=128, block_n=128, block_k=64, num_warps=8,
                      num_stages=TILED_STAGES_2 if per_sm == 2 else TILED_STAGES_1, split_k=split,
                      strategy="tiled", dequant_a=not p.weight_only), t
