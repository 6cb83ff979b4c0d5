#!/usr/bin/env python
"""One small call of every kernel variant, each checked against its reference.

This is the workload ``scripts/checks/sanitize.sh`` runs under compute-sanitizer (memcheck,
racecheck, synccheck), so a clean sanitizer run also proves the results correct:

* quantize: fp8_block 1x128 (EXACT / RCEIL) and 128x128 (2-D and per-expert 3-D), mxfp8
  (RCEIL / FLOOR), mxfp4, nvfp4 (computed and given global scale), strided rows with a base
  not 16-byte aligned; silu_mul_quantize (fp8_block, mxfp8, mxfp4); tensor_amax; dequantize
  of every format and block shape. Quantizers bitwise vs the CPU reference.
* portable gemm (``gemm(..., config=GemmConfig(...))``): every format, promote on/off,
  split_k 1 and > 1, weight-only bf16/fp16 activations, the dequant + cuBLAS strategy, the
  planner's plan (config=None) and the forced "hopper" strategy; linear() with the planner's
  split-K. vs the float64 reference (``assert_gemm_close``, outputs NaN-poisoned first).
* Hopper kernels (``gemm(..., config=HopperConfig(...))``; the plan that ran must be the
  Hopper kernel asked for): every variant in ``config.hopper.VARIANTS`` x every combination of
  the flag fields it reads (``VARIANT_FLAGS``: bools such as ``split_wg``; ``epilogue`` over
  ``EPILOGUES``) x the first two tiles of ``_TILES`` the variant accepts (e.g. 128x128 and
  128x256 with 2 stages), run with the SM count patched to 3 so that persistent programs walk
  several tiles (ring phases carried across tiles); plus every Hopper candidate of the planner
  (``plan.dense.fp8_candidates``) at an odd, an aligned, an N=322 (output rows not 16-byte
  aligned: TMA-store epilogues fall back) and a decode shape, with the real SM count; fused
  split-K and tail splits with both reductions. New variants / flags are picked up from
  ``config/hopper.py`` without editing this file.
* grouped_gemm contiguous (all formats, an empty and a 1-row segment) and masked (with
  per-expert nvfp4 global scales), weight-only; swiglu dense / contiguous / masked;
  grouped_gemm_list (nvfp4, mxfp8, fp8_block).

Shapes are small with tails: M=200, N=320, K=656 (= 5*128 + 16; TMA needs K % 16 == 0),
quantizers K=651 (odd: packed-fp4 tail), plus one aligned shape 256x256x512.

    python scripts/checks/sanitize.py                   # run all on the GPU (exit 1 if any fails)
    python scripts/checks/sanitize.py --list            # print the cases (no GPU needed)
    python scripts/checks/sanitize.py --only hopper/ --skip split_wg
    python scripts/checks/sanitize.py --shard 0/8       # every 8th case (parallel cache warm-up)
    python scripts/checks/sanitize.py --device cpu --only quantize/   # Triton interpreter

Exit status: 0 all passed (skips allowed), 1 a case failed, 2 no CUDA device, 3 a case hung
(watchdog, --case-timeout).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import itertools
import json
import os
import re
import sys
import threading
import time
import traceback
from typing import Callable

# ---------------------------------------------------------------------------------- shapes
M, N, K = 200, 320, 656  # tails in M and N vs every tile; K = 5*128 + 16 (K % 16 == 0 for TMA)
KQ = 651  # quantizer K: odd (packed fp4 tail), partial last block for every block size
ALIGNED = (256, 256, 512)
SEGMENTS = (0, 1, 77, 122)  # contiguous grouped: an empty and a 1-row segment; sum = M
MASKED = (0, 80, 33)  # masked grouped: counts for E=3, max_m=80 (empty, full, partial)
MAX_M = 80
LIST_GROUPS = ((M, N, K), (1, 128, 256), (77, 64, 130))  # grouped_gemm_list: own M, N, K each
FEW_SMS = 3  # SM count the Hopper grid is computed with in the explicit-config cases


class Skip(Exception):
    """The case cannot run here (reason in the message); not a failure."""


@dataclasses.dataclass
class Case:
    name: str
    run: Callable  # run(ctx) -> str (detail); raises on failure, Skip to skip
    config: object = None  # what --list prints
    needs_sm90: bool = False


@dataclasses.dataclass
class Ctx:
    dev: object  # torch.device
    sm90: bool
    interpret: bool


# ---------------------------------------------------------------------------------- helpers
def _imports():
    """Import lazily so that argument parsing (and TRITON_INTERPRET) comes first."""
    global torch, R, RG, ref_gemm, HC, HopperConfig, MODE_CONTIGUOUS, MODE_MASKED
    global quantize, dequantize, silu_mul_quantize, tensor_amax, gemm, linear, grouped_gemm
    global grouped_gemm_list, swiglu, GemmConfig, assert_gemm_close, assert_scaled_equal
    global bitwise_equal, gemm_errors, randn_like_activations, INTERPRET
    global Plan, Problem, H100_SXM, observe_plans, fp8_candidates, hopper_fill_stages, grouped_raster, launch
    import torch  # noqa: F401

    # what the kernels were defined with: TRITON_INTERPRET is read when blockscaled is imported
    INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

    from blockscaled import (GemmConfig, dequantize, gemm, grouped_gemm, grouped_gemm_list, linear,  # noqa: F401
                             quantize, silu_mul_quantize, swiglu, tensor_amax)
    from blockscaled.config.hopper import HopperConfig  # noqa: F401
    from blockscaled.ops.grouped import MODE_CONTIGUOUS, MODE_MASKED, launch  # noqa: F401
    from blockscaled.plan import H100_SXM, Plan, Problem, observe_plans  # noqa: F401
    from blockscaled.plan.dense import fp8_candidates, hopper_fill_stages  # noqa: F401
    from blockscaled.plan.grouped import grouped_raster  # noqa: F401

    # submodules by name: blockscaled.reference re-exports functions named like them
    HC = importlib.import_module("blockscaled.config.hopper")
    ref_gemm = importlib.import_module("blockscaled.reference.gemm")
    RG = importlib.import_module("blockscaled.reference.grouped")
    R = importlib.import_module("blockscaled.reference.quantize")
    from blockscaled.testing.compare import assert_scaled_equal, bitwise_equal  # noqa: F401
    from blockscaled.testing.inputs import randn_like_activations  # noqa: F401
    from blockscaled.testing.tolerances import assert_gemm_close, gemm_errors  # noqa: F401


def _dt(name: str):
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _x(shape, dtype="bf16", seed=0):
    """CPU activations with outlier channels (per-block scales differ)."""
    return randn_like_activations(*shape, dtype=_dt(dtype), device="cpu", seed=seed)


def _w(shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 0.05).to(torch.bfloat16)


def _wblock(fmt: str, rows: int):
    return (rows, 128) if fmt == "fp8_block" else None


def _qa(shape, fmt, seed=2):
    return R.quantize(_x(shape, seed=seed), fmt)


def _qw(shape, fmt, seed=1, rows=128):
    return R.quantize(_w(shape, seed), fmt, block=_wblock(fmt, rows))


def _nan(shape, dtype, dev):
    return torch.full(shape, float("nan"), dtype=dtype, device=dev)


def _close(out, ref, fmt, out_dtype, what) -> str:
    rel, mx = assert_gemm_close(out.detach().cpu(), ref, fmt, out_dtype, what=what)
    return f"rel_fro={rel:.1e} norm_max={mx:.1e}"


def _close_masked(out, ref, fmt, out_dtype, what) -> str:
    """Masked grouped outputs: rows past a count must still hold the NaN poison; the rest
    is compared (the reference writes NaN in the uncomputed rows)."""
    o = out.detach().cpu()
    computed = ~torch.isnan(ref)
    if not torch.isnan(o[~computed]).all():
        raise AssertionError(f"{what}: rows past masked_m were written")
    zero = torch.zeros((), dtype=o.dtype)
    return _close(torch.where(computed, o, zero), torch.where(computed, ref, 0.0), fmt, out_dtype, what)


def _equal_or_interp_ulp(got, want, what) -> None:
    """Bitwise; in the Triton interpreter bf16 outputs may be 1 ulp off (it truncates
    fp32 -> bf16 instead of rounding to nearest; docs/design.md, "Interpreter caveats"). On the
    GPU: bitwise."""
    got = got.cpu()
    if bitwise_equal(got, want):
        return
    if INTERPRET and got.dtype == torch.bfloat16 and got.shape == want.shape:
        d = (got.view(torch.int16).int() - want.view(torch.int16).int()).abs()
        fin = torch.isfinite(want)
        if int(d[fin].max()) <= 1 and torch.equal(torch.isnan(got), torch.isnan(want)):
            return
    bad = (got.float() != want.float()) & ~(torch.isnan(got.float()) & torch.isnan(want.float()))
    idx = tuple(bad.nonzero()[0].tolist()) if bad.any() else None
    raise AssertionError(f"{what}: not bitwise equal to the reference; {int(bad.sum())} elements differ"
                         + (f", first at {idx}: got {got[idx].item()!r} want {want[idx].item()!r}" if idx else ""))


@contextlib.contextmanager
def _sm_count(n: int | None):
    """Launch the persistent Hopper grids as if the GPU had ``n`` SMs (None: the real count), so
    that each program walks several tiles at these small shapes. The launchers size their grids
    with the ``num_sms`` they import; no public switch sets it, so it is patched there (restored
    afterwards)."""
    if n is None:
        yield
        return
    # private: the Hopper launchers' module is the only place the grid's SM count can be changed
    hopper_launch = importlib.import_module("blockscaled.ops._hopper")
    orig = hopper_launch.num_sms
    hopper_launch.num_sms = lambda device: n
    try:
        yield
    finally:
        hopper_launch.num_sms = orig


def _ran(plans, kernel: str, what: str) -> None:
    """The plans observed during one call must include ``kernel`` (e.g. "hopper_wide"): a forced
    Hopper config that could not run (the planner's fallback, or Gluon not buildable here) must
    not pass as a Hopper check."""
    kinds = [p.kernel for p in plans]
    if kernel not in kinds or kinds[-1] != kernel:
        raise AssertionError(f"{what}: expected the {kernel} kernel to run, the plans were {kinds}")


# ---------------------------------------------------------------------------------- cases
def quantize_cases() -> list[Case]:
    out = []

    def q(name, shape, fmt, dtype="bf16", block=None, rounding=None, gs=None, col0=None, seed=3):
        cfg = dict(shape=shape, fmt=fmt, dtype=dtype, block=block, rounding=rounding, gs=gs, col0=col0)

        def run(ctx):
            if col0 is None:
                x = _x(shape, dtype, seed)
            else:  # rows of a wider tensor, base offset col0 elements (not 16-byte aligned)
                wide = _x((*shape[:-1], shape[-1] + col0 + 5), dtype, seed)
                x = wide[..., col0:col0 + shape[-1]]
            want = R.quantize(x, fmt, block=block, rounding=rounding,
                              global_scale=None if gs is None else torch.tensor(gs))
            xd = x.to(ctx.dev) if col0 is None else wide.to(ctx.dev)[..., col0:col0 + shape[-1]]
            got = quantize(xd, fmt, block=block, rounding=rounding,
                           global_scale=None if gs is None else torch.tensor(gs, device=ctx.dev))
            assert_scaled_equal(got.to("cpu"), want)
            return "bitwise"

        out.append(Case(f"quantize/{name}", run, cfg))

    q("fp8_block-1x128-exact", (M, KQ), "fp8_block")
    q("fp8_block-1x128-rceil-fp32in", (M, KQ), "fp8_block", dtype="fp32", rounding="rceil")
    q("fp8_block-1x128-strided-unaligned", (M, KQ), "fp8_block", col0=3)
    q("fp8_block-1x128-aligned", ALIGNED[::2], "fp8_block")
    q("fp8_block-128x128", (M, KQ), "fp8_block", block=(128, 128))
    q("fp8_block-128x128-3d", (2, M, KQ), "fp8_block", block=(128, 128), rounding="rceil")
    q("mxfp8-rceil-fp16in", (M, KQ), "mxfp8", dtype="fp16")
    q("mxfp8-floor", (M, KQ), "mxfp8", rounding="floor")
    q("mxfp4-oddK", (M, KQ), "mxfp4")
    q("mxfp4-aligned", ALIGNED[::2], "mxfp4")
    q("nvfp4-computed-gs", (M, KQ), "nvfp4")
    q("nvfp4-given-gs", (M, KQ), "nvfp4", gs=0.37)
    q("nvfp4-computed-gs-strided-unaligned", (M, KQ), "nvfp4", col0=3)

    def silu(fmt):
        def run(ctx):
            gu = _x((M, 2 * KQ), seed=4)
            want = R.silu_mul_quantize(gu, fmt)
            got = silu_mul_quantize(gu.to(ctx.dev), fmt).to("cpu")
            # exp differs by an ulp between libdevice / numpy / torch CPU: not bitwise
            # (tests/test_quantize.py::_assert_silu_close). Scales within one bf16 ulp,
            # dequantized values within quantization noise of one flipped element.
            if got.shape != want.shape or got.scale.shape != want.scale.shape:
                raise AssertionError(f"shape {got.shape}/{got.scale.shape} vs {want.shape}/{want.scale.shape}")
            dg = R.dequantize(got, torch.float32).double()
            dw = R.dequantize(want, torch.float32).double()
            rel = float((dg - dw).norm() / dw.norm())
            if not rel <= 2e-2:
                raise AssertionError(f"silu_mul_quantize {fmt}: dequantized rel_fro {rel:.2e} > 2e-2")
            return f"deq rel_fro={rel:.1e}"

        out.append(Case(f"silu_mul_quantize/{fmt}", run, dict(shape=(M, 2 * KQ), fmt=fmt)))

    for fmt in ("fp8_block", "mxfp8", "mxfp4"):
        silu(fmt)

    def amax(ctx):
        x = _x((M, KQ), seed=5)
        got = tensor_amax(x.to(ctx.dev)).cpu()
        want = R.tensor_amax(x)
        if not bitwise_equal(got.reshape(()), want.reshape(())):
            raise AssertionError(f"tensor_amax {got} vs {want}")
        return "bitwise"

    out.append(Case("tensor_amax/bf16", amax, dict(shape=(M, KQ))))

    def dq(name, shape, fmt, dtype, block=None, seed=6):
        def run(ctx):
            x = _x(shape, seed=seed) if block is None else _w(shape, seed)
            qx = R.quantize(x, fmt, block=block)
            want = R.dequantize(qx, _dt(dtype))
            got = dequantize(qx.to(ctx.dev), _dt(dtype))
            _equal_or_interp_ulp(got, want, f"dequantize {name}")
            return "bitwise"

        out.append(Case(f"dequantize/{name}", run, dict(shape=shape, fmt=fmt, dtype=dtype, block=block)))

    dq("fp8_block-1x128-bf16", (M, KQ), "fp8_block", "bf16")
    dq("fp8_block-128x128-fp32", (M, KQ), "fp8_block", "fp32", block=(128, 128))
    dq("fp8_block-128x128-3d-bf16", (2, M, KQ), "fp8_block", "bf16", block=(128, 128))
    dq("mxfp8-fp16", (M, KQ), "mxfp8", "fp16")
    dq("mxfp4-bf16", (M, KQ), "mxfp4", "bf16")
    dq("nvfp4-fp32", (M, KQ), "nvfp4", "fp32")
    dq("nvfp4-bf16-aligned", ALIGNED[::2], "nvfp4", "bf16")
    return out


def gemm_cases() -> list[Case]:
    out = []

    def g(name, fmt, cfg, out_dtype="bf16", a_kind="q", rows=128, shape=(M, N, K), bias=False):
        def run(ctx):
            m, n, k = shape
            b = _qw((n, k), fmt, rows=rows)
            a = _qa((m, k), fmt) if a_kind == "q" else _x((m, k), a_kind, seed=2)
            bias_t = (torch.randn(n, generator=torch.Generator().manual_seed(7))).to(_dt(out_dtype)) if bias else None
            ref = ref_gemm.gemm(a, b, bias=bias_t)
            o = _nan((m, n), _dt(out_dtype), ctx.dev)
            gemm(a.to(ctx.dev), b.to(ctx.dev), _dt(out_dtype), o, config=cfg,
                 bias=None if bias_t is None else bias_t.to(ctx.dev))
            return _close(o, ref, fmt, _dt(out_dtype), name)

        out.append(Case(f"gemm/{name}", run, dict(fmt=fmt, shape=shape, a=a_kind, out=out_dtype, config=cfg)))

    C = GemmConfig
    g("fp8_block-w128x128-64x64x128", "fp8_block", C(64, 64, 128, 4, 3))
    g("fp8_block-w128x128-16x64x128-splitk3", "fp8_block", C(16, 64, 128, 4, 2, split_k=3), "fp32")
    g("fp8_block-w128x128-64x128x64-bias", "fp8_block", C(64, 128, 64, 4, 4), "bf16", bias=True)
    g("fp8_block-w1x128-128x128x128", "fp8_block", C(128, 128, 128, 8, 3), "fp16", rows=1)
    g("mxfp8-promote-64x64x32", "mxfp8", C(64, 64, 32, 4, 3, promote=True))
    g("mxfp8-dequant-tile-64x64x128", "mxfp8", C(64, 64, 128, 4, 3, promote=False), "fp32")
    g("mxfp4-promote-64x64x32-K650", "mxfp4", C(64, 64, 32, 4, 3, promote=True), shape=(M, N, 650))
    g("mxfp4-dequant-tile-64x128x128-splitk2", "mxfp4", C(64, 128, 128, 4, 3, split_k=2, promote=False), "fp16")
    g("nvfp4-64x64x128", "nvfp4", C(64, 64, 128, 4, 3, promote=False))
    g("nvfp4-32x64x64-splitk2-bias", "nvfp4", C(32, 64, 64, 4, 2, split_k=2, promote=False), "fp32", bias=True)
    g("w4a16-mxfp4-bf16act", "mxfp4", C(64, 64, 128, 4, 3, promote=False), a_kind="bf16")
    # the MX/NV bf16 tiles (plan.portable.MX_BF16_TILES): swap-AB with the weight as the wgmma's
    # register operand, weight-only and quantized A, fused split-K
    g("w4a16-nvfp4-bf16act-swap-16x128x128-splitk2", "nvfp4",
      C(16, 128, 128, 4, 4, split_k=2, promote=False, swap_ab=True), a_kind="bf16", shape=(16, N, K))
    g("mxfp4-swap-16x64x128", "mxfp4", C(16, 64, 128, 4, 4, promote=False, swap_ab=True), "fp32", shape=(16, N, K))
    g("mxfp8-swap-32x128x128-splitk2-bias", "mxfp8", C(32, 128, 128, 4, 4, split_k=2, promote=False, swap_ab=True),
      bias=True, shape=(32, N, K))
    g("w8a16-fp8_block-fp16act", "fp8_block", C(64, 64, 128, 4, 3, promote=True), "fp16", a_kind="fp16")
    g("w4a16-nvfp4-fp16act-promote-bk16", "nvfp4", C(64, 64, 16, 4, 3, promote=True), "fp16", a_kind="fp16")
    g("dequant_matmul-nvfp4", "nvfp4", C(strategy="dequant_matmul"))
    g("dequant_matmul-fp8_block-fp16", "fp8_block", C(strategy="dequant_matmul"), "fp16")
    g("strategy-hopper-fp8_block", "fp8_block", C(strategy="hopper"))
    # the CUDA-core decode GEMV: K in 3 chunks with a tail (650), 4-row programs over M=3, bias;
    # per-row weight scales with 2-row programs, one M row per program
    g("gemv-w128x128-4x8x256-M3-K650-bias", "fp8_block", C(4, 8, 256, 8, 1, strategy="gemv"), "fp32",
      shape=(3, N, 650), bias=True)
    g("gemv-w1x128-1x2x128-M2", "fp8_block", C(1, 2, 128, 4, 1, strategy="gemv"), rows=1, shape=(2, N, K))
    # the MX / NV decode GEMV (kernels/triton/mx_gemv.py): both modes, 32 / 16 / 8-element slices,
    # K in several chunks with a partial one, odd K (element masks), rows past M, bias, nvfp4 scales
    g("mx_gemv-mxfp4-wxa-1x8x1024-M1", "mxfp4", C(1, 8, 1024, 1, 1, strategy="gemv"), shape=(1, N, 2080))
    g("mx_gemv-mxfp4-bf16act-2x4x512-M2-K650", "mxfp4", C(2, 4, 512, 1, 1, strategy="gemv"), a_kind="bf16",
      shape=(2, N, 650))
    g("mx_gemv-nvfp4-wxa-4x2x512-M3-bias", "nvfp4", C(4, 2, 512, 1, 1, strategy="gemv"), "fp32", shape=(3, N, K),
      bias=True)
    g("mx_gemv-nvfp4-bf16act-1x4x1024-M1", "nvfp4", C(1, 4, 1024, 1, 1, strategy="gemv"), a_kind="bf16",
      shape=(1, N, 2080))
    g("mx_gemv-nvfp4-fp16act-8x8x256-M5", "nvfp4", C(8, 8, 256, 1, 1, strategy="gemv"), "fp16", a_kind="fp16",
      shape=(5, N, K))
    g("mx_gemv-mxfp8-wxa-8x4x256-M8-K650", "mxfp8", C(8, 4, 256, 1, 1, strategy="gemv"), shape=(8, N, 650))
    for fmt in ("fp8_block", "mxfp8", "mxfp4", "nvfp4"):
        g(f"plan-{fmt}-aligned", fmt, None, shape=ALIGNED)
    g("plan-fp8_block-M1", "fp8_block", None, shape=(1, N, K))

    def lin(name, fmt, shape, out_dtype="bf16", bias=False, weight_only=False):
        def run(ctx):
            m, n, k = shape
            w = _qw((n, k), fmt)
            x = _x((m, k), seed=8)
            bias_t = torch.randn(n, generator=torch.Generator().manual_seed(9)).to(_dt(out_dtype)) if bias else None
            ref = ref_gemm.linear(x, w, bias_t, out_dtype=None, weight_only=weight_only)
            o = _nan((m, n), _dt(out_dtype), ctx.dev)
            linear(x.to(ctx.dev), w.to(ctx.dev), None if bias_t is None else bias_t.to(ctx.dev),
                   out_dtype=_dt(out_dtype), out=o, weight_only=weight_only)
            return _close(o, ref, fmt, _dt(out_dtype), name)

        out.append(Case(f"linear/{name}", run, dict(fmt=fmt, shape=shape, bias=bias, weight_only=weight_only)))

    # M=5, K=2064: the planner splits K on the GPU (few tiles, many K blocks)
    lin("fp8_block-M5-plan", "fp8_block", (5, 256, 2064), bias=True)
    lin("nvfp4-M5", "nvfp4", (5, 256, 2064))
    lin("mxfp4-weight-only-M5", "mxfp4", (5, 256, 2064), weight_only=True)
    return out


#: HopperConfig fields set per tile (not varied as flags); of the others, bools run both values and
#: ``epilogue`` every value of EPILOGUES, the rest keep their default.
_GEOMETRY = ("variant", "block_m", "block_n", "num_warps", "stages", "group_m")
#: (block_m, block_n, stages) candidates; each variant runs the first two it accepts.
#: K=656 -> 6 K blocks, so 2-3 stage rings wrap several times.
_TILES = ((128, 128, 2), (128, 256, 2), (16, 64, 3), (64, 128, 3))
_SMEM_LIMIT = 232448  # H100 opt-in shared memory per block
#: shapes of the planner cases: odd, aligned, output rows not 16-byte aligned (N=322 bf16), decode
_PLANNER_SHAPES = ((M, N, K), ALIGNED, (M, 322, K), (5, N, K))


def _field_choices() -> dict:
    out = {}
    for f in dataclasses.fields(HopperConfig):
        if f.name in _GEOMETRY:
            continue
        if f.type in (bool, "bool"):
            out[f.name] = (False, True)
        elif f.name == "epilogue":
            out[f.name] = tuple(HC.EPILOGUES)
    return out


def _fits(cfg) -> str | None:
    """Why ``cfg`` cannot launch on an H100 (shared memory), None if it can."""
    need = cfg.smem_bytes(4)  # fp32 output: the largest epilogue buffer
    return None if need <= _SMEM_LIMIT else f"needs {need} B of shared memory > {_SMEM_LIMIT}"


#: explicit-tile cases per variant: the first tile gets every flag combination while there are at
#: most this many (else default + each single change + all changed), the second tile default +
#: each single change + all changed.
_MAX_FULL_PRODUCT = 16


def _flag_combos(choices: dict, defaults: dict, full: bool) -> list[dict]:
    names = list(choices)
    n_full = 1
    for vals in choices.values():
        n_full *= len(vals)
    if full and n_full <= _MAX_FULL_PRODUCT:
        return [dict(zip(names, c)) for c in itertools.product(*choices.values())]
    base = {f: defaults.get(f, choices[f][0]) for f in names}
    combos = [base]
    for f in names:
        combos += [{**base, f: val} for val in choices[f] if val != base[f]]
    alt = {f: next((val for val in choices[f] if val != base[f]), base[f]) for f in names}
    if alt not in combos:
        combos.append(alt)
    return combos


def _planner_hopper_configs(shape) -> list:
    """The Hopper candidates the planner ranks for an fp8_block GEMM of ``shape`` on an H100."""
    m, n, k = shape
    p = Problem("gemm", "fp8_block", m, n, k)
    return [c for c in fp8_candidates(p, H100_SXM, gemv=False, portable=False, dequant=False)
            if isinstance(c, HopperConfig)]


def hopper_cases() -> list[Case]:
    """Every variant in ``config.hopper.VARIANTS`` x every combination of the flag fields it reads
    (bools, plus ``epilogue``; see _flag_combos) x two tiles the variant accepts, run with the SM
    count patched to 3 so that persistent programs loop over tiles; plus every Hopper candidate of
    the planner at _PLANNER_SHAPES with the real SM count; fused split-K and tail splits."""
    out = []
    dtypes = itertools.cycle(("bf16", "fp16", "fp32"))
    choices = _field_choices()
    defaults = {f.name: f.default for f in dataclasses.fields(HopperConfig)}

    def h(name, cfg, shape, out_dtype, sms, err=None):
        def run(ctx):
            if err is not None:
                raise Skip(err)
            m, n, k = shape
            a = _qa((m, k), "fp8_block", seed=10)
            b = _qw((n, k), "fp8_block", seed=11)
            ref = ref_gemm.gemm(a, b)
            o = _nan((m, n), _dt(out_dtype), ctx.dev)
            with _sm_count(sms), observe_plans() as plans:
                gemm(a.to(ctx.dev), b.to(ctx.dev), _dt(out_dtype), o, config=cfg)
            _ran(plans, "hopper_" + cfg.variant, name)
            return _close(o, ref, "fp8_block", _dt(out_dtype), name)

        out.append(Case(f"hopper/{name}", run, dict(config=cfg if err is None else err, shape=shape,
                                                     out=out_dtype, sms=sms or "device"), needs_sm90=True))

    for v in HC.VARIANTS:
        tiles = []
        for bm, bn, st in _TILES:
            try:
                cfg = HopperConfig(v, block_m=bm, block_n=bn, num_warps=4 if v == "skinny" else bm // 16,
                                   stages=st, group_m=2)
            except (ValueError, TypeError):
                continue
            if _fits(cfg) is None:
                tiles.append(cfg)
        if not tiles:
            h(f"{v}-explicit-tiles", None, (M, N, K), "bf16", FEW_SMS,
              f"no tile of {_TILES} is valid for variant {v!r}: extend sanitize.py _TILES")
        # the flag fields the variant reads (HopperConfig.VARIANT_FLAGS); the others keep their default
        used = (getattr(HC, "VARIANT_FLAGS", None) or {}).get(v)
        mine = {f: vals for f, vals in choices.items() if used is None or f in used}
        for ti, tile in enumerate(tiles[:2]):
            # the skinny kernel takes at most block_m activation rows
            shape = (M, N, K) if v != "skinny" else (tile.block_m - 3, N, K)
            for flags in _flag_combos(mine, defaults, full=ti == 0):
                tag = "".join(f"+{f}" if val is True else f"+{f}={val}" for f, val in flags.items()
                              if val is True or (not isinstance(val, bool) and val != defaults.get(f)))
                name = f"{v}{tag}-{tile.block_m}x{tile.block_n}-s{tile.stages}-sms{FEW_SMS}"
                try:
                    cfg, err = dataclasses.replace(tile, **flags), None
                    err = _fits(cfg)
                except (ValueError, TypeError) as e:
                    cfg, err = None, f"invalid config for this variant: {e}"
                h(name, cfg, shape, next(dtypes), FEW_SMS, err)
        for shape in _PLANNER_SHAPES:
            for cfg in _planner_hopper_configs(shape):
                if cfg.variant != v:
                    continue
                tag = (f"-split{cfg.split_k}" if cfg.split_k > 1 else "") + \
                    (f"-tail{cfg.tail_split}" if cfg.tail_split > 1 else "")
                h(f"{v}-planner-{'x'.join(map(str, shape))}-{cfg.block_m}x{cfg.block_n}-s{cfg.stages}{tag}", cfg,
                  shape, "bf16", None)
    # the wide kernel's fused split-K (dense small M): splits 2 and 3 (K = 656: 6 K blocks -> 3+3
    # and 2+2+2), both epilogues, with 3 SMs (programs loop over units) and the device's count;
    # both reductions ("spread": units wait for each other, launched cooperatively; "last")
    for split, epi, sms, red in ((2, "tma", FEW_SMS, "spread"), (3, "masked", FEW_SMS, "spread"),
                                 (3, "tma", None, "spread"), (3, "tma", FEW_SMS, "last"),
                                 (2, "masked", None, "last")):
        cfg = hopper_fill_stages(HopperConfig("wide", 128, 128, 8, 2, epilogue=epi, split_k=split,
                                              split_reduce=red), 2)
        h(f"wide-split{split}-{red}-{epi}-{'sms' + str(sms) if sms else 'device'}", cfg, (M, N, K), "bf16", sms)
    # 64-row tiles (one math partition) with the spread reduction, M=50
    cfg = HopperConfig("wide", 64, 128, 4, 4, epilogue="tma", split_k=3, split_reduce="spread")
    h("wide-split3-spread-64x128-M50-sms3", cfg, (50, N, K), "fp16", FEW_SMS)
    # the wide kernel's tail split (whole tiles, then the last partial wave's tiles in K ranges):
    # 128x256 -> 4 tiles on 3 SMs = 3 whole + 1 in 3 ranges (2+2+2 K blocks); 128x128 -> 6 tiles
    # on 4 SMs = 4 whole + 2 in 2 ranges; both epilogues
    for bn, ts, epi, sms, red in ((256, 3, "tma", FEW_SMS, "spread"), (256, 3, "masked", FEW_SMS, "spread"),
                                  (128, 2, "tma", 4, "spread"), (256, 3, "tma", FEW_SMS, "last")):
        cfg = HopperConfig("wide", 128, bn, 8, 3, epilogue=epi, tail_split=ts, split_reduce=red)
        h(f"wide-tail{ts}-{red}-128x{bn}-{epi}-sms{sms}", cfg, (M, N, K), "bf16", sms)
    # the one-buffer TMA epilogue ("tma1": both halves through one shared tile per math
    # partition) with 4 stages: whole tiles (several per program on 3 SMs), and a tail split
    if "tma1" in HC.EPILOGUES:
        h("wide-tma1-128x256-s4-sms3", HopperConfig("wide", 128, 256, 8, 4, epilogue="tma1"), (M, N, K), "bf16",
          FEW_SMS)
        h("wide-tail3-spread-128x256-tma1-s4-sms3", HopperConfig("wide", 128, 256, 8, 4, epilogue="tma1",
                                                                 tail_split=3), (M, N, K), "bf16", FEW_SMS)
    # the skinny decode kernel (M <= 64): both weight tiles, padded activation rows 8 / 16 / 64
    # with row tails, splits 1 and 3 (K = 656: 2 + 2 + 2 blocks)
    if "skinny" in HC.VARIANTS:
        for m, bm, bn, st, split, dt in ((13, 16, 64, 5, 3, "bf16"), (1, 8, 128, 2, 1, "fp32"),
                                         (50, 64, 128, 3, 3, "fp16"), (7, 8, 64, 4, 1, "bf16")):
            cfg = HopperConfig("skinny", block_m=bm, block_n=bn, num_warps=4, stages=st, split_k=split)
            h(f"skinny-{bm}x{bn}-s{st}-split{split}-M{m}", cfg, (m, N, K), dt, None)
    return out


def grouped_cases() -> list[Case]:
    out = []

    def _offsets():
        offs = [0]
        for s in SEGMENTS:
            offs.append(offs[-1] + s)
        return torch.tensor(offs, dtype=torch.int32)

    def _operands(fmt, mode, a_kind, seed, n=N, k=K):
        e = len(SEGMENTS) if mode == "contig" else len(MASKED)
        a_shape = (sum(SEGMENTS), k) if mode == "contig" else (e, MAX_M, k)
        if a_kind == "q":
            a = R.quantize(_x(a_shape, seed=seed), fmt)
        else:
            a = _x(a_shape, a_kind, seed=seed)
        seg = _offsets() if mode == "contig" else torch.tensor(MASKED, dtype=torch.int32)
        return a, seg, e

    def gg(name, fmt, mode, cfg=None, out_dtype="bf16", a_kind="q", per_expert_gs=False):
        def run(ctx):
            a, seg, e = _operands(fmt, mode, a_kind, 12)
            b = R.quantize(_w((e, N, K), 13), fmt, block=_wblock(fmt, 128))
            gs = b.global_scale.reshape(()) * (1.0 + 0.25 * torch.arange(e)) if per_expert_gs else None
            key = "offsets" if mode == "contig" else "masked_m"
            ref = RG.grouped_gemm(a, b, **{key: seg}, b_global_scale=gs)
            shape = (a.shape[0], N) if mode == "contig" else (e, MAX_M, N)
            o = _nan(shape, _dt(out_dtype), ctx.dev)
            grouped_gemm(a.to(ctx.dev), b.to(ctx.dev), **{key: seg.to(ctx.dev)}, out_dtype=_dt(out_dtype), out=o,
                         config=cfg, b_global_scale=None if gs is None else gs.float().to(ctx.dev))
            chk = _close if mode == "contig" else _close_masked
            return chk(o, ref, fmt, _dt(out_dtype), name)

        out.append(Case(f"grouped/{name}", run, dict(fmt=fmt, mode=mode, a=a_kind, out=out_dtype, config=cfg)))

    C = GemmConfig
    for fmt in ("fp8_block", "mxfp8", "mxfp4", "nvfp4"):
        gg(f"contig-{fmt}-plan", fmt, "contig")
    gg("contig-fp8_block-64x128x128", "fp8_block", "contig", C(64, 128, 128, 4, 3, promote=True), "fp32")
    gg("contig-mxfp8-dequant-tile-128x64x128", "mxfp8", "contig", C(128, 64, 128, 8, 3, promote=False), "fp16")
    gg("masked-fp8_block-plan", "fp8_block", "masked")
    gg("masked-nvfp4-per-expert-gs", "nvfp4", "masked", per_expert_gs=True)
    gg("contig-w4a16-mxfp4-bf16act", "mxfp4", "contig", a_kind="bf16")

    def hg(name, mode, bm, bn, tail=1, reduce="spread", sms=None):
        # explicit grouped tiles on the wide kernel (the planner's 128 x 128 with GROUP_M 1 needs
        # more experts x N tiles than these shapes give it); ``tail``: HopperConfig.tail_split,
        # with ``sms`` SMs so that the grid has a partial last wave. ``ops.grouped.launch`` runs
        # a Plan as given (the public ops take only a GemmConfig).
        def run(ctx):
            a, seg, e = _operands("fp8_block", mode, "q", 17)
            b = R.quantize(_w((e, N, K), 18), "fp8_block", block=(128, 128))
            key = "offsets" if mode == "contig" else "masked_m"
            ref = RG.grouped_gemm(a, b, **{key: seg})
            shape = (a.shape[0], N) if mode == "contig" else (e, MAX_M, N)
            o = _nan(shape, torch.bfloat16, ctx.dev)
            cfg = hopper_fill_stages(HopperConfig("wide", block_m=bm, block_n=bn, num_warps=4 * (bm // 64), stages=2,
                                                  group_m=grouped_raster(bm, bn), epilogue="masked",
                                                  tail_split=tail, split_reduce=reduce), 2)
            with _sm_count(sms), observe_plans() as plans:
                launch(a.to(ctx.dev), b.to(ctx.dev), None, None, seg.to(ctx.dev), o, torch.bfloat16,
                       MODE_CONTIGUOUS if mode == "contig" else MODE_MASKED, Plan("grouped", "cuda", cfg))
            _ran(plans, "hopper_wide", name)
            chk = _close if mode == "contig" else _close_masked
            return chk(o, ref, "fp8_block", torch.bfloat16, name)

        out.append(Case(f"grouped/{name}", run, dict(fmt="fp8_block", mode=mode, tile=(bm, bn), tail=tail,
                                                     reduce=reduce, sms=sms or "device"), needs_sm90=True))

    hg("masked-fp8_block-hopper-128x128-g1", "masked", 128, 128)
    hg("contig-fp8_block-hopper-64x128-g8", "contig", 64, 128)
    # the grouped tail split (the kernel applies it on the device, from the real tile count),
    # 128x128 tiles on 4 SMs: contiguous 3 row tiles x 3 = 9 tiles -> 8 whole + 1 in 2 K ranges;
    # masked (2 x 3 = 6) -> 4 whole + 2 split; both reductions
    hg("contig-fp8_block-hopper-128x128-tail2-spread-sms4", "contig", 128, 128, 2, "spread", 4)
    hg("masked-fp8_block-hopper-128x128-tail2-spread-sms4", "masked", 128, 128, 2, "spread", 4)
    hg("contig-fp8_block-hopper-128x128-tail2-last-sms4", "contig", 128, 128, 2, "last", 4)

    def sw(name, fmt, mode, out_dtype="bf16", cfg=None):
        def run(ctx):
            if mode == "dense":
                a, seg, e = R.quantize(_x((M, K), seed=14), fmt), None, None
                wshape = (N, K)
            else:
                a, seg, e = _operands(fmt, mode, "q", 14)
                wshape = (e, N, K)
            bg = R.quantize(_w(wshape, 15), fmt, block=_wblock(fmt, 128))
            bu = R.quantize(_w(wshape, 16), fmt, block=_wblock(fmt, 128))
            kw = {} if mode == "dense" else {("offsets" if mode == "contig" else "masked_m"): seg}
            ref = RG.swiglu(a, bg, bu, **kw)
            o = _nan(tuple(ref.shape), _dt(out_dtype), ctx.dev)
            swiglu(a.to(ctx.dev), bg.to(ctx.dev), bu.to(ctx.dev), **{k_: v.to(ctx.dev) for k_, v in kw.items()},
                   out_dtype=_dt(out_dtype), out=o, config=cfg)
            chk = _close_masked if mode == "masked" else _close
            return chk(o, ref, fmt, _dt(out_dtype), name)

        hopper = cfg is not None and cfg.strategy == "hopper"
        out.append(Case(f"swiglu/{name}", run, dict(fmt=fmt, mode=mode, out=out_dtype, config=cfg),
                        needs_sm90=hopper))

    sw("dense-fp8_block", "fp8_block", "dense")
    # the Hopper wide kernel in DUAL mode (gate | up halves), each grouping, and the portable
    # kernel forced where the planner picks Hopper
    for mode in ("dense", "contig", "masked"):
        sw(f"{mode}-fp8_block-hopper", "fp8_block", mode, "fp32" if mode == "contig" else "bf16",
           C(strategy="hopper"))
    sw("dense-fp8_block-portable", "fp8_block", "dense", cfg=C(64, 64, 128, 4, 3, promote=True))
    sw("contig-mxfp8", "mxfp8", "contig", "fp32")  # fp16: silu(g)*u of these inputs overflows 65504
    sw("masked-nvfp4", "nvfp4", "masked")
    sw("contig-mxfp4", "mxfp4", "contig")

    def gl(fmt, out_dtype="fp16"):
        def run(ctx):
            a_list = [R.quantize(_x((m, k), seed=20 + i), fmt) for i, (m, n, k) in enumerate(LIST_GROUPS)]
            b_list = [R.quantize(_w((n, k), 30 + i), fmt, block=_wblock(fmt, 128))
                      for i, (m, n, k) in enumerate(LIST_GROUPS)]
            refs = RG.grouped_gemm_list(a_list, b_list)
            outs = [_nan((m, n), _dt(out_dtype), ctx.dev) for m, n, _ in LIST_GROUPS]
            grouped_gemm_list([a.to(ctx.dev) for a in a_list], [b.to(ctx.dev) for b in b_list],
                              _dt(out_dtype), out_list=outs)
            return "; ".join(_close(o, r, fmt, _dt(out_dtype), f"list {fmt} group {i}")
                             for i, (o, r) in enumerate(zip(outs, refs)))

        out.append(Case(f"grouped_gemm_list/{fmt}", run, dict(fmt=fmt, groups=LIST_GROUPS, out=out_dtype)))

    gl("nvfp4")
    gl("mxfp8", "bf16")
    gl("fp8_block")
    return out


def build_cases() -> list[Case]:
    """All cases (configs constructed and validated here; no tensor, no CUDA)."""
    _imports()
    return quantize_cases() + gemm_cases() + hopper_cases() + grouped_cases()


# ---------------------------------------------------------------------------------- log summary
_RE_ERR = re.compile(r"ERROR SUMMARY: (\d+) errors?")
_RE_RACE = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
_RE_DRIVER = re.compile(r"# sanitize\.py: (\d+) ok, (\d+) failed, (\d+) skipped")
_RE_CASE = re.compile(r"^\[\s*\d+/\d+\] (\S+)\s+(\S+)")
# compute-sanitizer report headlines ("========= Invalid __global__ read of size 4 bytes", ...)
_RE_HEAD = re.compile(r"^=+ (?!COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|Target application|\s)(.+)$")
_RE_API = re.compile(r"Program hit .* on CUDA API call|CUDA API call .* failed|Program hit cuda")


def summarize_log(path: str, tool: str, rc: int | None = None, seconds: float | None = None,
                  strict_warnings: bool = False) -> tuple[bool, str]:
    """(passed, one-line verdict) for one compute-sanitizer log of this driver (stdout of
    both interleaved). Errors: the sum of "ERROR SUMMARY: N errors" lines (one per sanitized
    process) and, for racecheck, of "RACECHECK SUMMARY: .. (E errors, W warnings)". Report
    headlines are attributed to the driver case printed next after them (best effort: the
    driver synchronises after each case before printing). Fails when no summary line is
    found (crash / timeout), errors > 0, the driver reported a failed case, or (strict)
    racecheck warnings > 0. CUDA API errors are counted and shown, and fail the run only
    through ERROR SUMMARY (they are included there)."""
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        return False, f"{tool:9s}: FAIL no log ({e})"
    err = None
    race = None
    driver = None
    api = 0
    pending: list[str] = []
    by_case: dict[str, int] = {}
    heads: dict[str, int] = {}
    for ln in lines:
        m = _RE_ERR.search(ln)
        if m:
            err = (err or 0) + int(m.group(1))
            continue
        m = _RE_RACE.search(ln)
        if m:
            h, e, w = (int(g) for g in m.groups())
            race = tuple(a + b for a, b in zip(race or (0, 0, 0), (h, e, w)))
            continue
        m = _RE_DRIVER.search(ln)
        if m:
            driver = tuple(int(g) for g in m.groups())
            continue
        if _RE_API.search(ln):
            api += 1
        m = _RE_HEAD.match(ln)
        if m and not ln.startswith("=========     "):
            head = re.sub(r"0x[0-9a-fA-F]+", "0x..", m.group(1).strip())[:120]
            heads[head] = heads.get(head, 0) + 1
            pending.append(head)
            continue
        m = _RE_CASE.match(ln)
        if m and pending:
            by_case[m.group(2)] = by_case.get(m.group(2), 0) + len(pending)
            pending = []
    if pending:
        by_case["(after the last case)"] = by_case.get("(after the last case)", 0) + len(pending)
    n_err = max(err or 0, race[1] if race else 0)  # racecheck errors may or may not be in ERROR SUMMARY
    n_warn = race[2] if race else 0
    problems = []
    if err is None and race is None:
        problems.append("no ERROR/RACECHECK SUMMARY line (sanitizer crashed or timed out"
                        + (f", rc={rc}" if rc is not None else "") + ")")
    if n_err:
        problems.append(f"{n_err} error(s)")
    if strict_warnings and n_warn:
        problems.append(f"{n_warn} racecheck warning(s)")
    if driver is None:
        problems.append("driver did not finish")
    elif driver[1]:
        problems.append(f"driver: {driver[1]} case(s) failed")
    if rc is not None and rc in (124, 137):
        problems.append("timed out")
    ok = not problems
    parts = [f"{tool:9s}: {'PASS' if ok else 'FAIL'} errors={n_err}" + (f" warnings={n_warn} hazards={race[0]}" if race else "")
                 + f" api_errors={api}"]
    if driver:
        parts.append(f"driver {driver[0]} ok/{driver[1]} failed/{driver[2]} skipped")
    if seconds is not None:
        parts.append(f"{seconds:.0f} s")
    if n_err and api and api >= n_err:
        problems.append("all errors are CUDA API errors (see the 'Program hit' lines); if they come from "
                        "torch/triton internals rerun with SANITIZER_ARGS='--report-api-errors no'")
    if problems:
        parts.append("; ".join(problems))
    if heads:
        top = sorted(heads.items(), key=lambda kv: -kv[1])[:3]
        parts.append("reports: " + " | ".join(f"{c}x {h}" for h, c in top))
    if by_case:
        top = sorted(by_case.items(), key=lambda kv: -kv[1])[:5]
        parts.append("near cases: " + ", ".join(f"{c} ({n})" for c, n in top))
    return ok, "; ".join(parts)


# ---------------------------------------------------------------------------------- runner
_PROGRESS = {"t": time.time(), "what": "start"}


def _watchdog(limit_s: float) -> None:
    # A pipeline bug (mbarrier phase, missing arrive) hangs the GPU rather than failing:
    # name the case and exit instead of eating the whole sanitizer budget.
    while True:
        time.sleep(2)
        if time.time() - _PROGRESS["t"] > limit_s:
            print(f"\nHANG: no progress for {limit_s:.0f} s in case {_PROGRESS['what']}; rerun with "
                  f"--skip '{re.escape(_PROGRESS['what'])}'", flush=True)
            os._exit(3)


def _select(cases, only, skip, shard):
    if only:
        cases = [c for c in cases if re.search(only, c.name)]
    if skip:
        cases = [c for c in cases if not re.search(skip, c.name)]
    if shard:
        i, n = (int(v) for v in shard.split("/"))
        if not 0 <= i < n:
            raise SystemExit(f"--shard: expected I/N with 0 <= I < N, got {shard!r}")
        cases = cases[i::n]
    return cases


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--list", action="store_true", help="print the cases and their configs; launch nothing")
    p.add_argument("--only", default=os.environ.get("SANITIZE_ONLY"), help="regex: run matching case names only")
    p.add_argument("--skip", default=os.environ.get("SANITIZE_SKIP"), help="regex: skip matching case names")
    p.add_argument("--shard", default=None, help="I/N: every N-th case starting at I (parallel warm-up)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu = Triton interpreter (sets TRITON_INTERPRET=1; slow, for checking this script)")
    p.add_argument("--case-timeout", type=float, default=float(os.environ.get("SANITIZE_CASE_TIMEOUT", 300)),
                   help="seconds without progress before the watchdog exits with status 3")
    p.add_argument("--json", default=None, help="write per-case results to this file")
    p.add_argument("-x", "--exitfirst", action="store_true", help="stop at the first failure")
    p.add_argument("--summarize", metavar="LOG", help="print the one-line verdict of a compute-sanitizer log of "
                   "this driver and exit 0 (pass) / 1 (fail); needs --tool; no torch import")
    p.add_argument("--tool", default="sanitizer", help="tool name for --summarize")
    p.add_argument("--rc", type=int, default=None, help="exit status of the sanitizer run (--summarize)")
    p.add_argument("--seconds", type=float, default=None, help="duration of the sanitizer run (--summarize)")
    p.add_argument("--strict-warnings", action="store_true", help="--summarize: racecheck warnings fail too")
    args = p.parse_args(argv)

    if args.summarize:
        ok, line = summarize_log(args.summarize, args.tool, args.rc, args.seconds, args.strict_warnings)
        print(line)
        return 0 if ok else 1

    if args.device == "cpu" and not args.list:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
    cases = _select(build_cases(), args.only, args.skip, args.shard)

    if args.list:
        for i, c in enumerate(cases):
            print(f"{i:3d} {c.name:60s} {c.config}")
        print(f"{len(cases)} cases")
        return 0

    if args.device == "cuda" and not torch.cuda.is_available():
        print("sanitize.py: no CUDA device (torch.cuda.is_available() is False); use --list, or "
              "--device cpu with the Triton interpreter", file=sys.stderr)
        return 2
    if args.device == "cpu" and not INTERPRET:
        print("sanitize.py: --device cpu needs TRITON_INTERPRET=1 set before kernels are imported", file=sys.stderr)
        return 2
    import triton

    dev = torch.device(args.device)
    sm90 = dev.type == "cuda" and torch.cuda.get_device_capability(dev) == (9, 0)
    ctx = Ctx(dev, sm90, INTERPRET)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (Triton interpreter)"
    print(f"# sanitize.py: {len(cases)} cases on {name}; torch {torch.__version__}, triton {triton.__version__}; "
          f"TRITON_CACHE_DIR={os.environ.get('TRITON_CACHE_DIR', '(default)')}; "
          f"PYTORCH_NO_CUDA_MEMORY_CACHING={os.environ.get('PYTORCH_NO_CUDA_MEMORY_CACHING', '(unset)')}", flush=True)
    threading.Thread(target=_watchdog, args=(args.case_timeout,), daemon=True).start()

    results, t_all = [], time.time()
    for i, c in enumerate(cases):
        _PROGRESS.update(t=time.time(), what=c.name)
        t0 = time.time()
        status, detail = "ok", ""
        try:
            if c.needs_sm90 and not ctx.sm90:
                raise Skip("needs an sm_90 GPU")
            detail = c.run(ctx) or ""
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)  # surface asynchronous launch errors in this case
        except Skip as e:
            status, detail = "skip", str(e)
        except Exception as e:  # noqa: BLE001 - report every failure, keep going
            status = "FAIL"
            detail = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            traceback.print_exc(limit=-3, file=sys.stdout)
        dt = time.time() - t0
        print(f"[{i + 1:3d}/{len(cases)}] {status:4s} {c.name} ({dt:.2f} s) {detail}", flush=True)
        results.append(dict(name=c.name, status=status, detail=detail, seconds=round(dt, 3)))
        if status == "FAIL" and args.exitfirst:
            break
    n_ok = sum(r["status"] == "ok" for r in results)
    n_fail = sum(r["status"] == "FAIL" for r in results)
    n_skip = sum(r["status"] == "skip" for r in results)
    print(f"# sanitize.py: {n_ok} ok, {n_fail} failed, {n_skip} skipped in {time.time() - t_all:.1f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=name, results=results), f, indent=1)
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
