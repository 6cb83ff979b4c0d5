"""The plan of a mixed dense GEMM: MX activations (mxfp4 / mxfp8, 1 x 32) x an fp8_block weight with
128 x 128 blocks (``Problem.a_fmt``), the form ``layouts.mxfp4_to_fp8_block`` gives an mxfp4 weight
so that Hopper's FP8 tensor cores can run it (reference/mx_pack.py has the numerics).

On sm_90 with the Gluon kernels: the activations are re-encoded by one pass (ops/mx_pack.py) and
the wide fp8_block kernel runs with per-32 A scales (ASUB 4), promoting once per 128 K on tiles
whose rows were encoded with one scale per 128-K group. Its tiles are the fp8_block cost model's
best unsplit wide candidate for the same shape (the kernel's main loop is the fp8_block one on such
tiles; the H200 probe put the planned and a fixed 128 x 256 tile within 1-3 % of each other on 26
of 28 rows, ab-mxwide2 in results/h200/archive/mx-fp8-path-ab-20261128.json). Split-K and the tail
split are left out: their ASUB builds are not GPU-tested (and the tail-split build spills 44 B).
A bias is added in place after the kernel. Elsewhere (CPU interpreter, other GPUs, operands TMA
cannot describe): both operands are dequantized to fp32 and multiplied by torch (exact products;
the bias added in fp32)."""

from __future__ import annotations

import functools
from dataclasses import replace

from ..config.gemm import GemmConfig
from ..config.hopper import HopperConfig
from .dense import _rank, fp8_candidates
from .tiled import dequant_matmul_us
from .device import DeviceInfo
from .types import Plan, Problem

__all__ = ["MIXED_PAIRS", "ENCODE_BW_SHARE", "plan_mixed", "encode_us", "prefer_packed", "mixed_config_ok"]

#: (activation format, weight format) pairs ``gemm`` takes with different formats.
MIXED_PAIRS = (("mxfp4", "fp8_block"), ("mxfp8", "fp8_block"))

#: The encoder's rate as a share of the device's copy bandwidth, per activation format: H200,
#: out/enc_time.py (results/h200/archive/mx-fp8-path-ab-20261128.json "encoder_after_fix"): mxfp4
#: 0.21-0.35 of a copy of the same bytes (median 0.26), mxfp8 0.52-0.67 (median 0.55).
ENCODE_BW_SHARE = {"mxfp4": 0.26, "mxfp8": 0.55}


def mixed_config_ok(cfg) -> bool:
    """The Hopper configs a mixed pair runs: the wide kernel with 128-row tiles, unsplit (the
    split-K and tail-split builds with per-32 A scales are not GPU-tested; the tail split's spills
    44 B). The planner picks only these, and a ``config=`` outside them is refused."""
    return (isinstance(cfg, HopperConfig) and cfg.variant == "wide" and cfg.block_m == 128 and cfg.split_k == 1
            and cfg.tail_split == 1)


def encode_us(a_fmt: str, m: int, k: int, dev: DeviceInfo) -> float:
    """Predicted encoder time: bytes read (data + E8M0 scales) and written (e4m3 data, fp32
    scales per 32 K, row flags) at ENCODE_BW_SHARE of the copy bandwidth."""
    rd = m * k * (0.5 if a_fmt == "mxfp4" else 1.0) + m * -(-k // 32)
    wr = m * k + 4 * m * 4 * -(-k // 128) + 4 * m
    return (rd + wr) / (dev.mem_bw * ENCODE_BW_SHARE[a_fmt]) * 1e6


def plan_mixed(p: Problem, dev: DeviceInfo, gluon_ok: bool = True) -> Plan:
    """The plan of ``gemm(a, b)`` with ``p.a_fmt`` activations and an fp8_block 128 x 128 weight."""
    head = f"{p.a_fmt} activations x fp8_block (128x128) weight"
    if dev.kind == "cpu":
        if not p.interpret:
            return Plan("gemm", "reference", None, p, reasons=(
                "CPU tensors without TRITON_INTERPRET=1: the float64 reference, rounded once to the output dtype",))
        return Plan("gemm", "interpreter", GemmConfig(strategy="dequant_matmul"), p, reasons=(
            head, "both operands dequantized to fp32 and multiplied by torch (exact products)"))
    why_not = None
    if not dev.is_hopper:
        why_not = f"sm_{dev.capability[0]}{dev.capability[1]}: the FP8 path is an sm_90 kernel"
    elif not gluon_ok:
        why_not = "the Gluon kernels cannot be built with this triton"
    elif not p.tma:
        why_not = "TMA cannot describe the operands (16-byte aligned bases and row strides, unit K stride)"
    elif p.b_block_rows != 128 or p.k == 0:
        why_not = "the weight needs 128 x 128 blocks and K > 0"
    if why_not is not None:
        return Plan("gemm", "cuda", GemmConfig(strategy="dequant_matmul"), p, reasons=(
            head, "both operands dequantized to fp32 and multiplied by torch (exact products)",
            f"not the FP8 tensor-core path: {why_not}"))
    fp8 = replace(p, a_fmt="", bias=False)  # (the bias is added after the kernel)
    scored, cal = _rank(fp8, dev, fp8_candidates(fp8, dev, hopper=True, gemv=False, portable=False, dequant=False))
    wide = [(t, c, e) for t, c, e in scored if mixed_config_ok(c)]
    if wide:
        t, cfg, est = wide[0]
        tiles = est.describe()
    else:  # (small M: the cost model's wide candidates are all split or 64-row)
        cfg = HopperConfig("wide", 128, 256, 8, 3, epilogue="tma")
        t, tiles = None, "no unsplit 128-row wide candidate: the default 128x256 3-stage tile"
    enc = encode_us(p.a_fmt, p.m, p.k, dev)
    bias = (f"; the bias added in place after the kernel (one pass over the output, ~{_bias_us(p, dev):.1f} us; a "
            f"second rounding of a 16-bit output: the wide kernel has no bias epilogue)") if p.bias else ""
    total = None if t is None else t + enc + (_bias_us(p, dev) if p.bias else 0.0)
    return Plan("gemm", "cuda", cfg, p, predicted_us=total, reasons=(
        f"{head} on sm_90",
        f"the activations re-encoded as e4m3 with fp32 scales per 32 K by one pass (ops/mx_pack.py, ~{enc:.1f} us "
        f"predicted), then the wide fp8_block kernel with per-32 A scales: one promotion per 128 K on tiles whose "
        f"rows the encoder gave one scale per 128-K group, four elsewhere (kernels/hopper/wide.py ASUB)",
        f"tiles: the fp8_block cost model's best unsplit 128-row wide candidate ({tiles}; constants: {cal.source})"
        f"{bias}"))


def _bias_us(p: Problem, dev: DeviceInfo) -> float:
    """The in-place bias add: the output read and written at the copy bandwidth."""
    return 2 * p.m * p.n * p.out_bytes / dev.mem_bw * 1e6


@functools.lru_cache(maxsize=4096)
def prefer_packed(fmt: str, m: int, n: int, k: int, out_dtype: str, bias: bool, dev: DeviceInfo,
                  gluon_ok: bool = True) -> bool:
    """Whether a W x A ``linear`` of an ``fmt`` weight ``[N, K]`` with an exact fp8_block copy
    (``nn.Linear.prepack``) should run the copy (MX activations x the packed weight, this module)
    rather than the canonical weight: only where the canonical plan has a predicted time (the
    tiled kernel and dequantize + cuBLAS, M above the streaming kernel's rows; the decode kernels
    have none and stay) and the mixed plan's prediction is lower. Measured (H200,
    mx-fp8-path-ab-20261128.json): at M = 2048 / 8192 the mixed pair ran 1.13-1.62x the canonical
    plan on all 13 shapes."""
    # Local: import cycle plan/gemm -> plan/mx_packed -> plan/gemm (plan_gemm routes mixed pairs here).
    from .gemm import plan_gemm

    if fmt not in ("mxfp4", "mxfp8") or dev.kind != "cuda" or m < 1:
        return False
    pc = Problem("gemm", fmt, m, n, k, "quantized", out_dtype, bias, 1)
    canon = plan_gemm(pc, dev, gluon_ok=gluon_ok)
    t_canon = canon.predicted_us
    if t_canon is None and getattr(canon.config, "strategy", None) == "dequant_matmul":
        # (the portable planner's dequantize + cuBLAS, where the tiled kernel is not offered, e.g.
        # on triton releases without it, carries no time: the same cost model as plan/tiled.py's)
        t_canon = dequant_matmul_us(pc, dev)
    if t_canon is None:
        return False
    mixed = plan_mixed(Problem("gemm", "fp8_block", m, n, k, "quantized", out_dtype, bias, 128, tma=k % 16 == 0,
                               a_fmt=fmt), dev, gluon_ok)
    return isinstance(mixed.config, HopperConfig) and mixed.predicted_us is not None and mixed.predicted_us < t_canon
