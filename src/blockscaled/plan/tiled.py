"""When the sm_90 tiled MX / NV kernels (kernels/hopper/tiled.py, tiled_rs.py) run, with which
split, and what they cost against the other plans of an MX / NV call above the streaming kernel's
rows.

Cost model (per-program time, measured). Three regimes, each a chain of 64-element K steps per
program, ``rounds = ceil(programs / (programs per SM x SMs))``:

* R1: 128 x 128 tiles, a 5-slot ring with a TMA producer warp, one program per SM, any K split
  <= 8: ``rounds x (steps x TILED_STEP_US[fmt] + (TILED_SPLIT_US + TILED_SPLIT_PART_US x split if
  split))``;
* R2 (fp4): 128 x 128 tiles, a 3-slot ring without the producer, two programs per SM, unsplit,
  planned only where the grid has more programs than SMs: ``rounds x steps x TILED_STEP2_US``;
* R3: the register-operand kernel (tiled_rs.py): 256 tokens x 128 weight rows, two consumer
  warpgroups with the decoded weights as the wgmma's register operand (no shared-memory round
  trip), a 4-slot ring with the producer, unsplit: ``rounds x steps x TILED_STEP3_US``. It replaced
  tiled.py's 256 x 128 regime (16 math warps sharing one decoded tile; 1.088 / 1.137 us per step),
  which it beats by 1.1-1.35x (mxfp4) and 1.0-1.1x (nvfp4) at M >= 2048 (twenty-eighth session,
  rs-ab-20261128.json; its own fit below, at TILED_STEP3_US).

* R4: the register-operand kernel with 64-token tiles and a K split, for the band between the
  streaming kernel's rows and prefill (RS_SMALL_MIN_M <= M): ``rounds x (steps x TILED_STEP4_US +
  (TILED_SPLIT4_US + TILED_SPLIT4_PART_US x split if split)) + TILED_FIX4_US``. Its time hardly grows with M up to 64 tokens (the
  weights' decode sets it, each weight tile decoded once per 64 tokens), where the streaming
  kernel's grows with the activation rows it gathers per 64 weight rows (thirty-first session,
  rs-small-ab-20261128.json: 1.16-1.68x the streaming kernel at M = 64 on 7 of 7 shapes, 0.86-1.15x
  at M = 32 with 32-token tiles, no gain at M = 16).
* R5: the same with four consumer warpgroups (256 weight rows per program), unsplit:
  ``rounds x steps x TILED_STEP5_US + TILED_FIX4_US``. Half the programs of R4 for a wide N, so a
  grid that would leave R4 a second, partial round fits in one (28672 x 4096 at M = 64: 1.22x R4
  mxfp4, 1.31x nvfp4); per 128 rows and step it is only ~15 % cheaper than R4, and its split
  epilogue spills (four 64 x 64 partials per program), so it is planned unsplit.

The planner takes the regime and split with the smallest prediction. R1 / R2 fitted (least squares)
on the H200 A/B of that kernel (benchmarks/results/h200/archive/tiled-ab4-20261127.json: mxfp4 /
nvfp4 weight-only, 2880 x 2880, 5760 x 2880, 8192 x 8192, 28672 x 8192 at M = 256-2048, every
regime, splits 1 / 2 / 4): unsplit rows within -8 / +4 % (R1) and -16 / +4 % (R2) of the fit;
the fixed cost per round came out near zero once the epilogue stored straight from the wgmma
layout; a K split cost 5-8 us more per round then (the fp32 partial tiles; refitted per partial since,
TILED_SPLIT_US). ncu of an
earlier build (M = 2048, 8192 x 8192, no producer warp): 2 warps per scheduler, 41 % of the cycles
stalled at CTA barriers, tensor pipe 37 %: latency-bound, hence the producer warp, the second
program per SM and (then) 256-row tiles. mxfp8 runs ~17 % slower per step than mxfp4 on R1
(tiled-ws-ab). R3 / R4 / R5 decode mxfp8 too (e4m3 bytes placed into bf16 in registers, as the
streaming kernel does; thirty-fourth session, rs-mxfp8-ab-20261129.json: forced against the plans
of the time, mxfp8 weight-only at 33-64 rows 1.03-1.30x, W x A at 48-64 rows 1.18-1.80x, R3 at 256
rows on a wide N 1.63x, grouped MoE experts 1.24-1.75x).

The alternative above 64 rows is dequantize + cuBLAS bf16 (the portable kernel, and the experimental
bf16 tiles, are not candidates where the tiled kernel can run: plan/gemm.py ``_plan_tiled``):
dequantize bytes (packed read, bf16 write; activations too for W x A) at
the copy bandwidth times the dequantize kernel's measured efficiency ``DEQUANT_EFF`` (H200, thirty-third
session: mxfp4 74 %, nvfp4 50 %, mxfp8 86 % of the copy bandwidth), then cuBLAS at
``max(flops / bf16 rate, bytes / bandwidth)``. On the A/B rows that model picks the faster of the
two on 33 of 36 (the three misses within 8 %).
"""

from __future__ import annotations

import math

from .._experimental import mx_kernel_enabled
from ..config.gemm import GemmConfig
from .cost import pad_copy_bytes, pad_launches
from .device import DeviceInfo
from .stream import STREAM_MAX_M, _triton_release
from .types import Problem

__all__ = ["TILED_FORMATS", "tiled_reason", "tiled_config", "tiled_us", "dequant_matmul_us", "TILED_MIN_M",
           "DEQUANT_MATMUL_FIX_US", "grouped_tiled_reason", "grouped_tiled_config", "regime_config", "rs_reason",
           "RS_DEQUANT_MARGIN", "RS_FORMATS", "RS_SMALL_MIN_M",
           "grouped_tiles_words", "kernel_words"]

#: weight formats the kernel decodes (the streaming kernel's decode)
TILED_FORMATS = ("mxfp4", "nvfp4", "mxfp8")
#: activations it takes: bf16 (weight-only) or quantized in the weight's format (dequantized exactly
#: to bf16 first); fp16 would need an fp16 decode
TILED_ACTIVATIONS = ("bfloat16", "quantized")
#: planned above the streaming kernel's rows
TILED_MIN_M = STREAM_MAX_M + 1
#: R1: 5-slot ring (producer warp), one 128 x 128 program per SM: us per 64-element K step (fit above)
TILED_STAGES_1 = 5
TILED_STEP_US = {"mxfp4": 0.62, "nvfp4": 0.69, "mxfp8": 0.725}
#: a K split's extra cost per round of programs, us: ``TILED_SPLIT_US + TILED_SPLIT_PART_US x split``
#: (each program's fp32 partial store and arrival, then the last arriver reads every partial).
#: Least squares (relative) with TILED_STEP_US and no fixed term kept, on the H200 sweep of the
#: thirty-ninth session (split-terms-20261129.json `r1`: forced splits 1 / 2 / 3 / 4 / 6 / 8 at M = 128,
#: mxfp4 weight-only, 11 shapes 896 x 4864 .. 5120 x 17408 and 14336 x 4096; the epilogue of the
#: thirty-eighth session, partials in wgmma register order read with plain loads): 4.07 + 0.50 per
#: partial, 66 rows -21 .. +22 % (one-round rows rms 8.6 %). Was 7.0 flat (the epilogue before).
TILED_SPLIT_US = 4.07
TILED_SPLIT_PART_US = 0.50
#: R2: 3-slot ring without the producer, two 128 x 128 programs per SM (fp4): us per step and program
TILED_STAGES_2 = 3
TILED_STEP2_US = {"mxfp4": 1.255, "nvfp4": 1.347}
#: R3: the register-operand kernel, 4-slot ring, one 256 x 128 program per SM: us per step.
#: Fitted (relative least squares) on the H200 A/B of twenty-eighth session (rs-ab-20261128.json:
#: 2880 x 2880 .. 28672 x 8192 and 8192 x 28672, M = 256 / 2048 / 8192, three runs): mxfp4 0.843
#: (rows -15 .. +19 %: per-step time rises from ~0.75 us with a few programs to ~0.95 at full
#: load), nvfp4 1.020 (-8 .. +6 %). Then divided by the speed-up of the scales loaded two steps ahead
#: (thirty-second session, rs-pipeline-scales-20261129.json `scales_ahead`: forced R3 at M = 256 /
#: 1024 / 2048 against the one-step loop, geomean of 3 shapes): mxfp4 1.030 -> 0.818, nvfp4 1.134 -> 0.900
#: mxfp8 (e4m3 bytes placed into bf16 in registers, 16 words per row and step): 0.872, the geometric
#: mean over 12 forced rows of the thirty-fourth session (rs-mxfp8-ab-20261129.json: 2880 x 2880 ..
#: 28672 x 4096 at M = 128 / 256 / 2048, -16 .. +29 %: as mxfp4, ~0.75 with a few programs, ~1.0 at
#: full load)
TILED_STAGES_3 = 4
TILED_STEP3_US = {"mxfp4": 0.818, "nvfp4": 0.900, "mxfp8": 0.872}
#: R4: the register-operand kernel with 64-token tiles, a 6-slot ring, any K split: us per
#: step, per round of programs with a split (its fp32 partials and last-arriver sum) and per call.
#: Fitted (log least squares) on the H200 A/B of the thirty-first session (rs-small-ab-20261128.json:
#: 7 shapes 2880 x 2880 .. 28672 x 4096 x splits 1 / 2 / 4 at M = 64 and 1 / 2 at M = 128, mxfp4):
#: rows within -11 .. +7 %, and on the 33 held-out rows of the same session (12 shapes of Qwen2.5-14B,
#: Mistral-Small, Phi-3, Gemma-2, Qwen3-8B sizes and odd N at M = 40 / 48 / 64) -12 .. +3 %. nvfp4's
#: step (its split and per-call terms mxfp4's) from 4 forced shapes x splits 1 / 2 / 4 and those 24
#: held-out plan rows (rs-small-ab, so in sample): -12 .. +19 %; then divided by the speed-up of
#: nvfp4's scales loaded two steps ahead (rs-pipeline-scales-20261129.json `scales_ahead`, the planned
#: R4 rows with 27 or more steps per program, geomean of 3: 1.103): 0.61 -> 0.553
#: mxfp8: 0.536, the geometric mean of its 54 forced R4 rows (split 1 / 2 / 4)
#: of the thirty-fourth session (rs-mxfp8-ab-20261129.json: 12 shapes at M = 33-128, the split and
#: per-call terms mxfp4's): -21 .. +20 %
TILED_STAGES_4 = 6
TILED_STEP4_US = {"mxfp4": 0.44, "nvfp4": 0.553, "mxfp8": 0.536}
#: R4's split terms as R1's (``TILED_SPLIT4_US + TILED_SPLIT4_PART_US x split`` per round): least
#: squares with the step and per-call terms kept, thirty-ninth session (split-terms-20261129.json `r4`:
#: the same 11 shapes at M = 64, forced splits 1 .. 8): 1.88 + 0.37 per partial, 66 rows -12 .. +22 %
#: (one-round rows -5 .. +6 %, rms 2.8 %). Was 5.0 flat (the epilogue before).
TILED_SPLIT4_US = 1.88
TILED_SPLIT4_PART_US = 0.37
TILED_FIX4_US = 3.0
#: R5: four consumer warpgroups (256 weight rows), 64-token tiles, unsplit: us per step (H200, the
#: thirty-first session's A/B rs-small-ab-20261128.json `nc4`, unsplit rows of 7 shapes at M = 64:
#: mxfp4 0.70-0.76, nvfp4 0.84-1.02); nvfp4 then divided by the speed-up of its scales loaded two
#: steps ahead on the one R5 row of rs-pipeline-scales-20261129.json `scales_ahead` (64 x 28672 x
#: 4096: 1.113; the grouped R5 row 1.069): 0.95 -> 0.854; mxfp8 the geometric mean of its 21 forced
#: rows of the thirty-fourth session (rs-mxfp8-ab-20261129.json, -4 .. +6 %)
TILED_STEP5_US = {"mxfp4": 0.75, "nvfp4": 0.854, "mxfp8": 0.86}
#: R4's tokens per tile
RS_SMALL_TOKENS = 64
#: calls from this M on go to this module's planner (R4 among the regimes) instead of the streaming
#: (or, mxfp8, the portable) kernel: fp4 at M = 64 R4 ran 1.16-1.68x the streaming kernel on all 7 A/B
#: shapes, at M = 32 (32-token tiles) 0.86-1.15x (rs-small-ab-20261128.json), so the streaming kernel
#: keeps M <= 32; mxfp8 from 33 rows 0.94-1.30x the plans of the time on 12 shapes at M = 33-64
#: (rs-mxfp8-ab-20261129.json `fit_64`, `fit_33_48`)
RS_SMALL_MIN_M = 33
#: a dense call takes R3 over dequantize + cuBLAS only when predicted this much faster (else the
#: best of the other regimes is compared plainly): within it the two measured either way
#: (twenty-eighth session, H200, M = 2048: rs-ab rows predicted 1-4 % apart measured 0.87-1.13x;
#: the mx suite's Llama 3 8B qkv and 70B gate_up rows, predicted 3.7 / 1.1 % faster on R3, ran 13 /
#: 10 % slower than dequantize + cuBLAS had: the misprediction measured at M = 2048). Grouped calls
#: compare plainly (their dequantize pass writes every expert's weights; no row of the grouped A/B
#: was within 10 %).
RS_DEQUANT_MARGIN = 0.10
#: splits the planner considers (each split keeps >= TILED_MIN_STEPS steps)
TILED_MAX_SPLIT = 8
TILED_MIN_STEPS = 4
#: the dequantize kernel's rate as a fraction of the copy bandwidth (its packed read and bf16 write
#: over 4.23 TB/s). H200, thirty-third session, after the pass lost its per-element integer bf16
#: rounding (dequant-rounding-ab-20261129.json `dequant`: 57344 x 8192, 8192 x 8192, 5760 x 2880,
#: 4096 x 14336 to bf16, geometric mean): mxfp4 0.74 (0.65-0.79; 0.55 before), nvfp4 0.50 (0.41-0.55;
#: 0.44), mxfp8 0.86 (0.86-0.88). (The twentieth session's 0.58 / 0.46 / 0.86 were the pass before.)
DEQUANT_EFF = {"mxfp4": 0.74, "nvfp4": 0.50, "mxfp8": 0.86}
#: dequantize + cuBLAS beyond its bytes and flops: two launches and the gap between them (H200, same
#: A/B: the plan's measured time over the model's bytes-and-flops time at M = 256 / 2048 on the
#: 2880 x 2880 and 5760 x 2880 rows, +3.0 .. +7.1 us, median 4.5)
DEQUANT_MATMUL_FIX_US = 4.5
#: each launch that unaligned rows add to dequantize + cuBLAS (ops/gemm.py, _dequant_matmul: the
#: padded product's copy, the zero padding columns): half the fixed cost above, which covers two
PAD_LAUNCH_US = DEQUANT_MATMUL_FIX_US / 2
#: cuBLAS bf16 rate at prefill sizes (plan/portable.py _BF16_FLOPS: H100 measured 735-785 TFLOP/s)
_BF16_FLOPS = 750e12
#: Triton releases the kernel was checked on (AOT: tests/test_aot_tiled.py; GPU: the H200 A/B; others
#: keep the portable kernels until checked)
#: 3.7 / 3.8: GPU-checked with the streaming kernel (plan/stream.py, STREAM_TRITON, says how)
TILED_TRITON = ((3, 6), (3, 7), (3, 8))
_TRITON_OK = _triton_release() in TILED_TRITON


#: ``BLOCKSCALED_MX_KERNELS`` without ``tiled`` turns the kernel off
TILED_ENABLED = mx_kernel_enabled("tiled")


def _kernel_reason(p: Problem, dev: DeviceInfo, gluon_ok: bool) -> str | None:
    """What the dense and the grouped form both need: a weight format it decodes, an sm_90 device
    whose triton builds it, the kernel switched on, bf16 or quantized activations."""
    if p.fmt not in TILED_FORMATS:
        return f"{p.fmt} weights (it takes {', '.join(TILED_FORMATS)})"
    if not dev.is_hopper or not gluon_ok:
        return "not an sm_90 device whose triton builds the Gluon kernels"
    if not TILED_ENABLED or not _TRITON_OK:
        return f"switched off (BLOCKSCALED_MX_KERNELS) or triton {'.'.join(map(str, _triton_release()))} unchecked"
    if p.a not in TILED_ACTIVATIONS:
        return f"{p.a} activations (it takes bf16 or quantized {p.fmt})"
    return None


def _operand_reason(p: Problem) -> str | None:
    if p.k % 32 or p.k <= 0:
        return f"K = {p.k} not a positive multiple of 32 (16-byte TMA rows of packed e2m1)"
    if not p.tma:
        return "weights not 16-byte aligned for TMA"
    return None


def tiled_reason(p: Problem, dev: DeviceInfo, gluon_ok: bool) -> str | None:
    """None when the kernel can take the call, else why not (plain words, for ``explain``): from
    TILED_MIN_M rows, and for fp4 weights from RS_SMALL_MIN_M (R4, the 64-token tiles)."""
    why = _kernel_reason(p, dev, gluon_ok)
    if why is not None:
        return why
    if p.op != "gemm" or p.grouping != "dense":
        return "not a dense GEMM"
    if p.m < TILED_MIN_M and (p.m < RS_SMALL_MIN_M or rs_reason(p) is not None):
        low = RS_SMALL_MIN_M if rs_reason(p) is None else TILED_MIN_M
        return f"M = {p.m} < {low} (the streaming kernel's rows)"
    return _operand_reason(p)


def tiled_us(p: Problem, dev: DeviceInfo, split: int, regime: int = 1) -> float:
    """Predicted time of the kernel in ``regime`` (1, 2 or 3: module docstring) with ``split``,
    the activations' dequantize pass included (W x A)."""
    steps = -(-p.k // 64)
    per = -(-steps // split)
    bm = {3: 256, 4: RS_SMALL_TOKENS, 5: RS_SMALL_TOKENS}.get(regime, 128)
    parts = -(-steps // per)  # the K splits that run (a split past the steps runs none)
    programs = -(-p.m // bm) * -(-p.n // (256 if regime == 5 else 128)) * parts
    if regime == 5:
        t = math.ceil(programs / dev.sm_count) * per * TILED_STEP5_US[p.fmt] + TILED_FIX4_US
    elif regime == 4:
        t = (math.ceil(programs / dev.sm_count) * (per * TILED_STEP4_US[p.fmt] + _split_us(parts, TILED_SPLIT4_US, TILED_SPLIT4_PART_US))
             + TILED_FIX4_US)
    elif regime == 2:
        t = math.ceil(programs / (2 * dev.sm_count)) * per * TILED_STEP2_US[p.fmt]
    elif regime == 3:
        t = math.ceil(programs / dev.sm_count) * per * TILED_STEP3_US[p.fmt]
    else:
        t = math.ceil(programs / dev.sm_count) * (per * TILED_STEP_US[p.fmt] + _split_us(parts, TILED_SPLIT_US, TILED_SPLIT_PART_US))
    if not p.weight_only:  # the exact bf16 dequantization of the activations first
        t += _dequant_bytes(p.fmt, p.m, p.k) / (dev.mem_bw * DEQUANT_EFF[p.fmt]) * 1e6
    return t


def _split_us(parts: int, per_round: float, per_part: float) -> float:
    """A K split's epilogue per round of programs (the R1 / R4 fits above); nothing unsplit."""
    return per_round + per_part * parts if parts > 1 else 0.0


def _dequant_bytes(fmt: str, rows: int, k: int) -> float:
    eb = 1.0 if fmt == "mxfp8" else 0.5
    scale = 1.0 / (16 if fmt == "nvfp4" else 32)
    return rows * k * (eb + scale + 2)


def dequant_matmul_us(p: Problem, dev: DeviceInfo) -> float:
    """Predicted dequantize (the weights, every expert's for a grouped call; the activations too
    for W x A) + cuBLAS bf16 time (one GEMM, or the grouped GEMM over all ``p.m`` rows)."""
    dq = p.experts * _dequant_bytes(p.fmt, p.n, p.k) + (0 if p.weight_only else _dequant_bytes(p.fmt, p.m, p.k))
    byts = (p.experts * p.n + p.m) * p.k * 2 + p.m * p.n * p.out_bytes
    if p.op == "gemm":  # unaligned rows are padded for cuBLAS (ops/gemm.py, _CUBLAS_ROW_ALIGN)
        byts += pad_copy_bytes(p.m, p.n, p.k, p.out_bytes, 2 if p.weight_only else 0)
    mm = max(2.0 * p.m * p.n * p.k / _BF16_FLOPS, byts / dev.mem_bw)
    pads = pad_launches(p.n, p.k, p.out_bytes) if p.op == "gemm" else 0
    return (dq / (dev.mem_bw * DEQUANT_EFF[p.fmt]) + mm) * 1e6 + DEQUANT_MATMUL_FIX_US + pads * PAD_LAUNCH_US


def tiled_config(p: Problem, dev: DeviceInfo, allow_rs: bool = True) -> tuple[GemmConfig, float]:
    """(the config of the regime and split the model predicts fastest, its predicted us); without
    R3 where ``allow_rs`` is False (plan/gemm.py: R3 predicted faster than dequantize + cuBLAS by
    less than RS_DEQUANT_MARGIN)."""
    steps = -(-p.k // 64)
    splits = [s for s in range(1, TILED_MAX_SPLIT + 1) if s == 1 or steps >= TILED_MIN_STEPS * s]
    cands = [(1, s) for s in splits]
    if p.fmt in TILED_STEP2_US and -(-p.m // 128) * -(-p.n // 128) > dev.sm_count:
        cands.append((2, 1))
    if allow_rs and rs_reason(p, 3) is None:
        cands.append((3, 1))
    if rs_reason(p) is None:
        cands += [(4, s) for s in splits] + [(5, 1)]
    if p.m < TILED_MIN_M:  # only R4 / R5 were measured below the tiled kernel's rows
        cands = [c for c in cands if c[0] >= 4]
    best = None  # (a loop, not min() over a generator with key=: torch.compile(fullgraph) traces this)
    for r, s in cands:
        t = tiled_us(p, dev, s, r)
        if best is None or t < best[2]:
            best = (r, s, t)
    regime, split, t = best
    return regime_config(regime, split, p.weight_only), t


def regime_config(regime: int, split: int, weight_only: bool) -> GemmConfig:
    """The GemmConfig of a regime (4 warps: the register-operand kernel, 256 tokens R3, 64 R4 / R5;
    R5 with 256 weight rows)."""
    bm, warps, stages = {1: (128, 8, TILED_STAGES_1), 2: (128, 8, TILED_STAGES_2), 3: (256, 4, TILED_STAGES_3),
                         4: (RS_SMALL_TOKENS, 4, TILED_STAGES_4), 5: (RS_SMALL_TOKENS, 4, TILED_STAGES_4)}[regime]
    return GemmConfig(block_m=bm, block_n=256 if regime == 5 else 128, block_k=64, num_warps=warps, num_stages=stages,
                      split_k=split, strategy="tiled", dequant_a=not weight_only)


#: weight formats the register-operand kernel decodes (a forced config may run it on any of them)
RS_FORMATS = ("mxfp4", "nvfp4", "mxfp8")


def rs_reason(p: Problem, regime: int = 4) -> str | None:
    """None when the planner may give the call to the register-operand kernel in ``regime`` (3: 256
    tokens; 4 / 5: 64 tokens): a weight format whose per-step time in that regime was measured
    (TILED_STEP3_US / TILED_STEP4_US)."""
    measured = TILED_STEP3_US if regime == 3 else TILED_STEP4_US
    if p.fmt in measured:
        return None
    return f"{p.fmt} weights (its {'256' if regime == 3 else '64'}-token tiles are planned for {' / '.join(measured)})"


# ----------------------------------------------------------------------------- grouped (MoE prefill)
# The same kernels over the experts' rows (kernels/hopper/tiled.py / tiled_rs.py MODE 1 / 2): R1's
# 128 x 128 or, for fp4, R3's 256-token or R4 / R5's 64-token tiles numbered densely over the
# experts (M tiles from the per-expert counts on the device), no K split, no bias. Their alternative there is dequantize +
# torch._grouped_mm / bmm, whose dequantize
# pass writes every expert's weights in bf16 (2 bytes per element for each of E x N x K: 4.2 GB for
# gpt-oss-120b's gate_up), which the tiled kernel never does; the portable grouped kernel ran at
# 0.3-0.5x a per-expert cuBLAS loop there (mx-20261127-2312).


def grouped_tiled_reason(p: Problem, dev: DeviceInfo, gluon_ok: bool) -> str | None:
    """None when a grouped call (contiguous / masked, not SwiGLU) can take the tiled kernel."""
    if p.op != "grouped" or p.dual or p.grouping not in ("contiguous", "masked"):
        return "not a contiguous / masked grouped GEMM"
    why = _kernel_reason(p, dev, gluon_ok) or _operand_reason(p)
    if why is not None and not p.tma and why.startswith("weights not"):
        # (the grouped Problem's tma also holds the streaming kernel's word alignment of quantized A)
        why += ", or quantized activations not 4-byte aligned"
    return why


def _grouped_m_tiles(p: Problem, bm: int = 128) -> int:
    """Expected M tiles: the experts holding rows (at most the rows) x their tiles at the mean."""
    rpe = max(p.rows_per_expert, 1.0)
    active = min(p.experts, max(p.m, 1)) if p.grouping == "contiguous" else p.experts
    return active * math.ceil(rpe / bm)


def kernel_words(cfg: GemmConfig) -> str:
    """Which tiled kernel a config runs, in words (for the plans' reasons)."""
    if cfg.is_register_operand:
        return (f"register-operand tiled kernel (kernels/hopper/tiled_rs.py): {cfg.block_m} tokens x {cfg.block_n} "
                f"weight rows, the decoded weights the wgmma's register operand (swap-AB), {cfg.block_n // 64} consumer "
                f"warpgroups")
    return ("tiled kernel (kernels/hopper/tiled.py): 128 x 128 tiles, weights decoded to bf16 in shared memory, "
            "both wgmma operands in shared memory, one wgmma in flight")


def grouped_tiles_words(p: Problem, bm: int = 128, bn: int = 128) -> str:
    """The expected tile grid in words (for the plan's reasons): ``bm`` token rows x ``bn`` weight rows."""
    return f"~{_grouped_m_tiles(p, bm)} M tiles of {bm} rows x {-(-p.n // bn)} N tiles of {bn} rows"


#: the grouped form's extra time per round of tiles, us (the expert lookup from the offsets before the
#: first load, the masked epilogue): H200 A/B of the forced kernel against dequantize + grouped cuBLAS
#: (benchmarks/results/h200/archive/grouped-tiled-ab-20261128.json, 27 rows: 8 / 32 experts x 256-2048
#: rows on DeepSeek-V3 and gpt-oss expert shapes, mxfp4 / nvfp4), measured minus the R1 model per
#: round: median 2.9 (-3.6 .. 4.1)
TILED_GROUPED_ROUND_US = 2.9


def grouped_tiled_config(p: Problem, dev: DeviceInfo) -> tuple[GemmConfig, float]:
    """(the grouped regime the model predicts fastest, unsplit, and its predicted us): R1 (128 x 128
    tiles) or, for fp4 weights, the register-operand kernel's R3 (256 tokens x 128 rows), R4 (64
    tokens x 128 rows) or R5 (64 tokens x 256 rows): rounds of tiles x (steps x the regime's step
    time + TILED_GROUPED_ROUND_US) (+ TILED_FIX4_US for R4 / R5), the activations' dequantize pass
    included for W x A. Each pays for the tile rows its experts leave empty: R1 and R3 where experts
    hold a few dozen rows, R4 / R5 where they hold hundreds (more decode per token)."""
    steps = -(-p.k // 64)
    n128 = -(-p.n // 128)
    # (regime, tiles, us per step, fixed us): R3 / R4 / R5 the register-operand kernel (fp4)
    cands = [(1, _grouped_m_tiles(p, 128) * n128, TILED_STEP_US[p.fmt], 0.0)]
    if rs_reason(p, 3) is None:
        cands.append((3, _grouped_m_tiles(p, 256) * n128, TILED_STEP3_US[p.fmt], 0.0))
    if rs_reason(p) is None:
        cands += [(4, _grouped_m_tiles(p, RS_SMALL_TOKENS) * n128, TILED_STEP4_US[p.fmt], TILED_FIX4_US),
                  (5, _grouped_m_tiles(p, RS_SMALL_TOKENS) * -(-p.n // 256), TILED_STEP5_US[p.fmt], TILED_FIX4_US)]
    best = None  # (a loop, not min() over a generator with key=: torch.compile(fullgraph) traces this)
    for r, tiles, step, fix in cands:
        t = math.ceil(tiles / dev.sm_count) * (steps * step + TILED_GROUPED_ROUND_US) + fix
        if best is None or t < best[1]:
            best = (r, t)
    regime, t = best
    if not p.weight_only:
        t += _dequant_bytes(p.fmt, p.m, p.k) / (dev.mem_bw * DEQUANT_EFF[p.fmt]) * 1e6
    return regime_config(regime, 1, p.weight_only), t
