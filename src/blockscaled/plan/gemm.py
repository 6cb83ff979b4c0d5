"""``plan_gemm``: the one decision for a dense GEMM (``gemm`` / ``linear``)."""

from __future__ import annotations

import functools
from dataclasses import replace

from ..config.gemm import GemmConfig
from ..config.hopper import HopperConfig
from .cost import pad_words
from .dense import hopper_takes, plan_fp8
from .direct import DIRECT_FORMATS, DIRECT_MAX_M, direct_config, direct_min_m, direct_reason, direct_split_why
from .stream import (STREAM_FORMATS, STREAM_GATHER_MAX_MP, STREAM_MAX_M, stream_config, stream_reason,
                     stream_split_why, use_stream)
from . import tuned as _tuned
from .device import DeviceInfo
from .mx_gemv import (MX_GEMV_GLUON_MAX_BYTES, MX_GEMV_GLUON_WARPS_PER_SM, MX_GEMV_ROWS, gluon_gemv_config,
                      gluon_gemv_forced_error, gluon_gemv_reason, mx_gemv_config, use_mx_gemv)
from .mx_packed import mixed_config_ok, plan_mixed
from .portable import choose_portable, mx_bf16_applies
from .tiled import (RS_DEQUANT_MARGIN, TILED_MIN_M, TILED_STAGES_2, dequant_matmul_us, kernel_words, tiled_config,
                    tiled_reason)
from .types import DTYPES, Plan, Problem

__all__ = ["plan_gemm"]

_DTYPES = DTYPES


@functools.lru_cache(maxsize=8192)
def plan_gemm(p: Problem, dev: DeviceInfo, forced=None, *, gluon_ok: bool = True) -> Plan:
    """The plan of a dense GEMM ``[M, K] @ [N, K].T`` (``p.op == "gemm"``).

    ``forced``: a config the caller passed (``config=``): a GemmConfig runs as given, except
    ``strategy="hopper"``, which asks for the best Hopper tiles; a HopperConfig runs as given where
    the Hopper kernels can take the operands. ``gluon_ok``: the Gluon kernels can be built with
    the installed triton (else the portable kernels stand in)."""
    if p.a_fmt:
        return _plan_mixed_forced(p, dev, forced, gluon_ok)
    if isinstance(forced, GemmConfig) and forced.gluon:
        why = gluon_gemv_forced_error(p, dev, gluon_ok)
        if why is not None:
            raise ValueError(why)
    if dev.kind == "cpu":
        if not p.interpret:
            return Plan("gemm", "reference", None, p, reasons=(
                "CPU tensors without TRITON_INTERPRET=1: the float64 reference, rounded once to the output dtype",))
        if isinstance(forced, GemmConfig) and forced.strategy != "hopper":
            return Plan("gemm", "interpreter", forced, p, reasons=("forced by config= (Triton's interpreter)",))
        cfg = choose_portable(p.fmt, p.m, p.n, p.k, dev, _a_dtype(p), _DTYPES[p.out_dtype])
        return Plan("gemm", "interpreter", cfg, p, reasons=(
            "Triton's interpreter on the CPU: small tiles keep it fast (cost is per program and op)",))
    fp8_q = p.fmt == "fp8_block" and not p.weight_only
    hopper_ok = hopper_takes(p, dev, gluon_ok)
    if isinstance(forced, HopperConfig):
        if hopper_ok:
            return Plan("gemm", "cuda", forced, p, reasons=("forced by config=",))
        fallback = plan_gemm(p, dev, None, gluon_ok=gluon_ok)
        return replace(fallback, reasons=("config= asked for a Hopper kernel, which cannot take these operands "
                                          "(see below); the planner's portable choice runs",) + fallback.reasons)
    if isinstance(forced, GemmConfig) and forced.strategy != "hopper":
        return Plan("gemm", "cuda", forced, p, reasons=("forced by config=",))
    if fp8_q and dev.is_hopper:
        strat = "hopper" if isinstance(forced, GemmConfig) else None
        if strat == "hopper" and not hopper_ok:
            strat = None
        return plan_fp8(p, dev, hopper=hopper_ok, forced_strategy=strat)
    scope = ("sm_90" if dev.is_hopper else f"sm_{dev.capability[0]}{dev.capability[1]} (portable kernels only)")
    if gluon_gemv_reason(p, dev, gluon_ok) is None:
        cfg = gluon_gemv_config(p, dev)
        chunks = -(-p.k // cfg.block_k)
        return Plan("gemm", "cuda", cfg, p, reasons=(
            f"{p.fmt} weight-only on {scope}, one activation row",
            f"decode GEMV with explicit layouts (kernels/hopper/mx_gemv_gluon.py; the Triton GEMV's fp4 build loses "
            f"its register layout on this triton): {p.n * p.k / 2**21:.1f} MB of weights <= "
            f"{MX_GEMV_GLUON_MAX_BYTES >> 20} MB, where its fixed cost beats the register-streaming kernel's "
            f"(MX_GEMV_GLUON_MAX_BYTES)",
            f"{cfg.block_n} weight rows x {cfg.block_k} K per chunk, {cfg.num_warps} warps: {-(-p.n // cfg.block_n)} "
            f"programs, {chunks} chunk(s) covering K = {chunks * cfg.block_k} of {p.k}; the least K padding among "
            f"the tiles that keep >= {MX_GEMV_GLUON_WARPS_PER_SM} warps per SM (plan/mx_gemv.py gluon_gemv_config)"))
    if direct_reason(p, dev, gluon_ok) is None:
        cfg = direct_config(p, dev)
        return Plan("gemm", "cuda", cfg, p, reasons=(
            f"{p.fmt} weight-only on {scope}",
            f"register-streaming decode kernel (kernels/hopper/direct.py): {direct_min_m(p.fmt, p.k)} <= M = {p.m} "
            f"<= {DIRECT_MAX_M} rows{' (the decode GEMV does not take M = 1 here)' if p.m == 1 else ''} padded to "
            f"the mma.sync N of {cfg.block_m}; each warp loads its 16 weight rows "
            f"straight into registers a 128-K step ahead, decodes them into the A fragment, no shared memory "
            f"or barrier in the K loop; {direct_split_why(p.n, p.k, p.fmt, dev.sm_count)[1]}",
            (f"{cfg.maxnreg} registers per thread for ptxas (the grid needs <= 4 programs per SM: it then issues "
             f"each step's loads before the MMAs; plan/direct.py DIRECT_HOIST_REGS)" if cfg.maxnreg else
             "registers left to ptxas (more than 4 programs per SM must be resident: DIRECT_HOIST_REGS)"))
            + ((f"not the Gluon decode GEMV: {gluon_gemv_reason(p, dev, gluon_ok)}",) if p.m == 1 else ()))
    if use_mx_gemv(p.fmt, p.m, p.k):
        cfg = mx_gemv_config(p.fmt, p.m, p.n, p.k, dev)
        chunk_kb = cfg.block_n * min(p.k, cfg.block_k) * (1 if p.fmt == "mxfp8" else 0.5) / 1024
        return Plan("gemm", "cuda", cfg, p, reasons=(
            f"{p.fmt}{' weight-only' if p.weight_only else ''} on {scope}",
            f"decode GEMV on the CUDA cores (kernels/triton/mx_gemv.py): M = {p.m} <= {MX_GEMV_ROWS[p.fmt]} rows "
            f"stream the packed weights; {cfg.block_n} weight rows x {cfg.block_k} K per chunk "
            f"({chunk_kb:.1f} KB), {cfg.num_warps} warps (plan/mx_gemv.py: rows per format from the mx_decode "
            f"sweep, tiles from the instruction-count model)"))
    if p.m < TILED_MIN_M and tiled_reason(p, dev, gluon_ok) is None:
        # fp4 between the streaming kernel's rows and prefill: the tiled planner's 64-token tiles
        # (plan/tiled.py RS_SMALL_MIN_M)
        return _plan_tiled(p, dev, scope)
    if use_stream(p, dev, gluon_ok):
        cfg = stream_config(p, dev)
        return Plan("gemm", "cuda", cfg, p, reasons=(
            f"{p.fmt} weight-only on {scope}" if p.weight_only else
            f"{p.fmt} x {p.fmt} on {scope}: the activations " + (
                f"dequantized exactly to bf16 by one pass first ({cfg.block_m} rows > STREAM_GATHER_MAX_MP "
                f"{STREAM_GATHER_MAX_MP[p.fmt]}: every program would decode them again)" if cfg.dequant_a else
                "decoded to bf16 in the kernel's gather (STREAM_GATHER_MAX_MP)"),
            f"streaming kernel (kernels/hopper/stream.py): TMA ring of {cfg.num_stages} x "
            f"{8 if p.fmt == 'mxfp8' else 4} KB weight steps, {'e4m3' if p.fmt == 'mxfp8' else 'e2m1'} decoded in "
            f"registers into the bf16 wgmma's register operand, {p.m} activation rows padded to "
            f"{cfg.block_m}; {-(-p.n // 64)} tiles of 64 rows x K split {cfg.split_k} (plan/stream.py: "
            f"{stream_split_why(p.n, p.k, p.m, dev.sm_count, p.fmt, dev.smem_bytes, p.bias)[1]})"))
    if tiled_reason(p, dev, gluon_ok) is None:
        return _plan_tiled(p, dev, scope)
    cfg = choose_portable(p.fmt, p.m, p.n, p.k, dev, _a_dtype(p), _DTYPES[p.out_dtype])
    if cfg.strategy == "dequant_matmul":
        why = ("dequantize both operands to bf16, then cuBLAS: the roofline model (or the measured MX_BF16_DEQUANT_M "
               "crossover) predicts it faster than the portable kernel (plan/portable.py)")
        pad = pad_words(p.n, p.k, p.out_bytes)
        why += f"; {pad}" if pad else ""
    elif mx_bf16_applies(p.fmt, p.m, dev, _a_dtype(p)):
        why = ("portable Triton kernel with the MX/NV tiles dequantized to bf16 in registers (bf16 wgmma; swap-AB: "
               "the weight is the wgmma's register operand): plan/portable.py MX_BF16_TILES for this M, K split "
               "for MX_BF16_PROGRAMS_PER_SM programs per SM (constants not measured yet: "
               "scripts/sweeps/mx_tiles.py)")
    else:
        why = "portable Triton kernel, tiles and K split from the portable rules (plan/portable.py)"
    scope = ("sm_90" if dev.is_hopper else f"sm_{dev.capability[0]}{dev.capability[1]} (portable kernels only)")
    reasons = (f"{p.fmt}{' weight-only' if p.weight_only else ''} on {scope}", why)
    if dev.is_hopper and p.fmt in DIRECT_FORMATS and direct_min_m(p.fmt, p.k) <= p.m <= DIRECT_MAX_M:
        reasons += (f"not the register-streaming kernel: {direct_reason(p, dev, gluon_ok)}",)
    if dev.is_hopper and p.fmt in STREAM_FORMATS and 1 <= p.m <= STREAM_MAX_M:
        reasons += (f"not the streaming kernel: {stream_reason(p, dev, gluon_ok)}",)
    elif dev.is_hopper and p.fmt in STREAM_FORMATS and p.m > STREAM_MAX_M:
        reasons += (f"not the tiled kernel: {tiled_reason(p, dev, gluon_ok)}",)
    return Plan("gemm", "cuda", cfg, p, reasons=reasons)


def _plan_mixed_forced(p: Problem, dev: DeviceInfo, forced, gluon_ok: bool) -> Plan:
    """A mixed pair (plan/mx_packed.py); ``config=`` may force its two paths: a wide HopperConfig
    (unsplit, 128-row tiles) where the FP8 path can run, or ``GemmConfig(strategy="dequant_matmul")``."""
    plan = plan_mixed(p, dev, gluon_ok)
    if forced is None:
        return plan
    if isinstance(forced, GemmConfig) and forced.strategy == "dequant_matmul":
        return replace(plan, config=forced, reasons=("forced by config=",)) if plan.backend != "reference" else plan
    if isinstance(forced, HopperConfig) and isinstance(plan.config, HopperConfig):
        if not mixed_config_ok(forced):
            raise ValueError(f"config: a {p.a_fmt} x fp8_block GEMM runs the wide kernel unsplit with 128-row tiles, "
                             f"got {forced}")
        return replace(plan, config=forced, reasons=("forced by config=",))
    raise ValueError(f"config: a {p.a_fmt} x fp8_block GEMM takes a wide HopperConfig (on sm_90 with TMA-able "
                     f"operands) or GemmConfig(strategy='dequant_matmul'), got {forced!r} (plan: {plan.describe()})")


def _plan_tiled(p: Problem, dev: DeviceInfo, scope: str) -> Plan:
    """Above the streaming kernel's rows on sm_90: the tiled kernel or dequantize + cuBLAS, whichever
    the cost model of plan/tiled.py predicts faster (the portable kernel lost to the tiled one on
    all 12 M = 128 rows of the A/B it was fitted on, 1.08-3.0x, so it is not a candidate here)."""
    cfg, t_tiled = tiled_config(p, dev)
    t_dq = dequant_matmul_us(p, dev)
    margin_note = ""
    if cfg.is_register_operand and cfg.block_m == 256 and t_tiled * (1 + RS_DEQUANT_MARGIN) >= t_dq:
        # R3 within its margin of dequantize + cuBLAS: the other regimes compete plainly
        margin_note = (f" (the register-operand kernel's {t_tiled:.1f} us is within RS_DEQUANT_MARGIN = "
                       f"{RS_DEQUANT_MARGIN:.0%} of it)")
        cfg, t_tiled = tiled_config(p, dev, allow_rs=False)
    head = f"{p.fmt}{' weight-only' if p.weight_only else ' x ' + p.fmt} on {scope}"
    steps = -(-p.k // 64)
    per_sm = 2 if (cfg.block_m, cfg.num_stages, cfg.num_warps) == (128, TILED_STAGES_2, 8) else 1
    model = (f"plan/tiled.py cost model: tiled {t_tiled:.1f} us "
             f"({-(-p.m // cfg.block_m) * -(-p.n // cfg.block_n)} tiles of {cfg.block_m}x{cfg.block_n} x split "
             f"{cfg.split_k}, {-(-steps // cfg.split_k)} K steps each, {per_sm} program(s) per SM), "
             f"dequantize + cuBLAS {t_dq:.1f} us" + margin_note)
    if t_tiled < t_dq:
        return Plan("gemm", "cuda", cfg, p, predicted_us=t_tiled, alternatives=(("dequant_matmul", t_dq),), reasons=(
            head, kernel_words(cfg) + (
                "; the activations dequantized exactly to bf16 by one pass first" if cfg.dequant_a else ""), model))
    pad = pad_words(p.n, p.k, p.out_bytes)
    return Plan("gemm", "cuda", GemmConfig(strategy="dequant_matmul"), p, predicted_us=t_dq,
                alternatives=(("hopper_tiled", t_tiled),),
                reasons=(head, "dequantize both operands to bf16, then cuBLAS", model) + ((pad,) if pad else ()))


# a tuned plan stored or cleared (plan/tuned.py) changes the answer for its problem
_tuned.on_change(plan_gemm.cache_clear)


def _a_dtype(p: Problem):
    return None if not p.weight_only else _DTYPES[p.a]
