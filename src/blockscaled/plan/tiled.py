"""When the sm_90 tiled MX / NV kernel (kernels/hopper/tiled.py) runs, with which split, and what
it costs against the other plans of an MX / NV call above the streaming kernel's rows.

Cost model (per-tile time, measured): the kernel runs 128 x 128 output tiles, one program per SM
(130 KB of shared memory), each a chain of 64-element K steps; a program's time is
``steps x TILED_STEP_US[fmt] + TILED_FIX_US`` and the call takes
``ceil(programs / SMs)`` such rounds. Fitted on the H200 A/B of the twentieth session
(benchmarks/results/h200/archive/tiled-ab-20261127.json: mxfp4 / nvfp4 / mxfp8 weight-only, N x K in
2880 x 2880, 5760 x 2880, 8192 x 8192, 28672 x 8192, M in 128 / 256 / 2048, splits 1 / 2 / 4):
mxfp4 M = 256 8192 x 8192 (128 steps, one round) 98.4 us and M = 128 2880 x 2880 split 4 (12 steps,
one round) 20.5 us give 0.672 us per step and 12.4 us per round; the model then gives the other
mxfp4 rows within -7 % .. +9 % (M = 2048 28672 x 8192, 28 rounds: 2671 predicted, 2680 measured).
nvfp4 and mxfp8 ran 8-10 % slower per step (their M = 256 8192 x 8192 rows).

The alternative above 64 rows is dequantize + cuBLAS bf16 (or the portable kernel where the
portable rules keep it): dequantize bytes (packed read, bf16 write; activations too for W x A) at
the copy bandwidth times the dequantize kernel's measured efficiency ``DEQUANT_EFF`` (H200, same
session: mxfp4 58 %, nvfp4 46 %, mxfp8 86 % of a same-run copy), then cuBLAS at
``max(flops / bf16 rate, bytes / bandwidth)``. On the A/B rows that model picks the faster of the
two on 33 of 36 (the three misses within 8 %).
"""

from __future__ import annotations

import math

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
#: per 64-element K step of a 128 x 128 tile, us (fit above, H200)
TILED_STEP_US = {"mxfp4": 0.672, "nvfp4": 0.74, "mxfp8": 0.735}
#: per round of programs (launch, ring fill, epilogue, split-K sum), us (fit above)
TILED_FIX_US = 12.4
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


def _enabled() -> bool:
    from .._experimental import mx_kernel_enabled

    return mx_kernel_enabled("tiled")


#: ``BLOCKSCALED_MX_KERNELS`` without ``tiled`` turns the kernel off
TILED_ENABLED = _enabled()


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


def tiled_us(p: Problem, dev: DeviceInfo, split: int) -> float:
    """Predicted time of the kernel with ``split`` (module docstring), activation pass included."""
    steps = -(-p.k // 64)
    per = -(-steps // split)
    programs = -(-p.m // 128) * -(-p.n // 128) * -(-steps // per)
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
    """(the config with the split the model predicts fastest, its predicted us)."""
    steps = -(-p.k // 64)
    best = None
    for s in range(1, TILED_MAX_SPLIT + 1):
        if s > 1 and steps < TILED_MIN_STEPS * s:
            break
        t = tiled_us(p, dev, s)
        if best is None or t < best[1] - 1e-9:
            best = (s, t)
    split, t = best
    return GemmConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4, split_k=split,
                      strategy="tiled", dequant_a=not p.weight_only), t
