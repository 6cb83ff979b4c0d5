"""A/B timer: one op on a few shapes under several variants (the plan, forced configs), each checked
against the float64 reference, then timed in interleaved rounds.

    python scripts/sweeps/ab.py --shapes 128x7168x2048,4096x2112x7168 --variants plan,hopper,portable
    python scripts/sweeps/ab.py --shapes 4096x2112x7168 --variants plan,wide@block_n=128,wide@tail_split=1
    python scripts/sweeps/ab.py --shapes 16x7168x2048 --variants plan,cands:hopper_skinny --rounds 3
    python scripts/sweeps/ab.py --op grouped --layout masked --experts 8 --shapes 128x4096x7168 \\
        --variants plan,wide@tail_split=2,portable
    python scripts/sweeps/ab.py --op swiglu --layout dense --shapes 256x18432x7168 --variants plan,hopper,portable
    python scripts/sweeps/ab.py --fmt mxfp4 --weight-only --shapes 16x8192x8192 \\
        --variants plan,stream@split_k=1,stream@split_k=2,stream@split_k=4,stream@split_k=8,portable
    python scripts/sweeps/ab.py --fmt nvfp4 --weight-only --shapes 2048x8192x8192 \\
        --variants plan,tiled:r1,tiled:r3,dequant_matmul
    python scripts/sweeps/ab.py --shapes 64x7168x2048 --variants plan,cands --list   # resolve only (CPU: an H100)

Ops: ``gemm`` (``blockscaled.gemm``; ``--fmt``, ``--weight-only`` for bf16 activations), ``grouped``
(``blockscaled.grouped_gemm``, ``--layout contiguous|masked``, ``--experts``) and ``swiglu``
(``blockscaled.swiglu``, ``--layout dense|contiguous|masked``). Shapes: MxNxK; grouped layouts: M
rows per expert (masked: max_m = M, every count M).

Variants (comma list; the first is the baseline of the ratio column):
  plan            the planner's plan (config=None)
  hopper          GemmConfig(strategy="hopper"): the planner's best Hopper tiles
  wide, skinny    dense: the cost model's best candidate of that Hopper kernel; grouped / SwiGLU:
                  the planner's wide-kernel tiles (plan/grouped.py)
  portable        the portable Triton kernel: dense fp8_block on sm_90 the cost model's best
                  portable candidate, else the portable rules (plan/portable.py, grouped_portable.py)
  gemv            dense fp8_block at M = 1: the decode GEMV; MX / NV weights at M <= 8: their GEMV
                  (plan/mx_gemv.py tiles), also on releases where the planner keeps it off
  gemv_gluon      mxfp4 / nvfp4 weight-only at M <= 2: the GEMV with explicit layouts (kernels/hopper/
                  mx_gemv_gluon.py) with the planner's one-row tiles (plan/mx_gemv.py gluon_gemv_config;
                  at 2 rows at most 4 weight rows), also where the planner does not run it (triton 3.6,
                  large weights)
  dequant_matmul  dequantize to bf16 + cuBLAS
  cublas_bf16     dense gemm: cuBLAS bf16 (torch.matmul) on the operands dequantized to bf16 before
                  timing (the mx suite's baseline: what the same weights cost unquantized)
  deepgemm        dense fp8_block: DeepGEMM's fp8_gemm_nt on the same operands (bench.baselines.DeepGemmDense;
                  `import deep_gemm` must work: ../shared/deepgemm/README)
  stream          dense mxfp4 / nvfp4 / mxfp8, weight-only or W x A, M <= 64, sm_90: the streaming
                  kernel with the planner's split and ring (plan/stream.py); stream@split_k=N
                  times another split (the measurement behind STREAM_PROGRAMS_PER_SM /
                  STREAM_MIN_CHUNKS)
  direct          dense mxfp4 / nvfp4, M <= 8, sm_90: the register-streaming kernel with the planner's split
                  (plan/direct.py), also where the planner does not send it (M = 1; W x A: the activations
                  dequantized to bf16 first); direct@split_k=N: another split
  tiled[:rN]      mxfp4 / nvfp4 / mxfp8 above 64 rows on sm_90 (dense or grouped): the tiled kernels'
                  regime the planner predicts fastest (plan/tiled.py tiled_config / grouped_tiled_config),
                  or regime N unsplit (r1: kernels/hopper/tiled.py 128 x 128; r3 / r4 / r5: the
                  register-operand kernel kernels/hopper/tiled_rs.py, 256 tokens x 128 rows / 64 x 128 /
                  64 x 256): the measurement behind TILED_STEP_US / TILED_STEP3_US / TILED_STEP4_US
                  (tiled@split_k=2, tiled:r4@split_k=2: another split)
  KIND@f=v:f=v    KIND's config with fields replaced, e.g. wide@block_n=128:epilogue=masked,
                  portable@split_k=2; Hopper rings are refilled to what fits unless stages= is given
  cands[:PREFIX]  dense fp8_block on sm_90: every candidate the planner ranks (plan.dense.fp8_candidates)
                  whose kernel name starts with PREFIX (hopper_wide, hopper_skinny, portable, gemv, ...)

Every variant runs once first: its output (NaN-poisoned) is checked with
``testing.tolerances.assert_gemm_close`` and the plan that ran is recorded (``plan.observe_plans``: a
forced Hopper config the operands do not allow shows the planner's fallback). Then all variants are
timed in ``--rounds`` interleaved rounds (each round times every variant once with
``blockscaled.bench.timing.time_op``: CUDA-graph replays, inputs rotated past L2; odd rounds in
reverse order), so that a drift of the GPU's clock reaches all variants alike. Printed per variant:
median us over the rounds, TFLOP/s, % of the memory floor (inputs read once + output written once at
the device's copy bandwidth) and the ratio to the baseline (median over the rounds of baseline us /
variant us: > 1 is faster). ``--json`` writes every row.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys

KINDS = ("plan", "hopper", "wide", "skinny", "portable", "gemv", "gemv_gluon", "dequant_matmul", "stream", "direct",
         "tiled", "cands", "cublas_bf16", "deepgemm")
#: the cublas_bf16 variant's "config": not a plan, cuBLAS on bf16 copies of the dequantized operands
CUBLAS_BF16 = "cublas_bf16"
#: the deepgemm variant's "config": DeepGEMM's fp8 NT GEMM on the same fp8_block operands (the bench's baseline)
DEEPGEMM = "deepgemm"
BASELINES = (CUBLAS_BF16, DEEPGEMM)
LAYOUTS = {"gemm": ("dense",), "grouped": ("contiguous", "masked"), "swiglu": ("dense", "contiguous", "masked")}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
#: HopperConfig fields whose change calls for another ring depth (unless stages= is given too)
_RING_FIELDS = ("block_m", "block_n", "epilogue", "variant")


@dataclasses.dataclass(frozen=True)
class Case:
    """One shape of the op under test (m: rows, or rows per expert for grouped layouts)."""

    op: str
    fmt: str
    m: int
    n: int
    k: int
    layout: str
    experts: int
    out_dtype: str
    weight_only: bool

    @property
    def grouped(self) -> bool:
        return self.layout != "dense"

    @property
    def rows(self) -> int:
        return self.m * (self.experts if self.grouped else 1)

    @property
    def flops(self) -> float:
        return (4.0 if self.op == "swiglu" else 2.0) * self.rows * self.n * self.k

    def label(self) -> str:
        g = f" {self.layout} E={self.experts} m/expert" if self.grouped else ""
        return f"{self.op} {self.fmt}{g} M={self.m} N={self.n} K={self.k}"

    def problem(self):
        """The planner's view of this case (blockscaled.plan.Problem)."""
        from blockscaled.plan import Problem

        op = {"gemm": "gemm", "grouped": "grouped", "swiglu": "swiglu"}[self.op]
        return Problem(op, self.fmt, self.rows, self.n, self.k, DTYPES["bf16"] if self.weight_only else "quantized",
                       DTYPES[self.out_dtype], grouping=self.layout, experts=self.experts if self.grouped else 1,
                       rows_per_expert=float(self.m), dual=self.op == "swiglu")


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``"MxNxK,MxNxK"`` -> [(M, N, K), ...]."""
    out = []
    for s in filter(None, text.split(",")):
        parts = s.lower().split("x")
        if len(parts) != 3:
            raise SystemExit(f"--shapes: expected MxNxK, got {s!r}")
        out.append(tuple(int(p) for p in parts))
    return out


def _value(v: str):
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    try:
        return int(v)
    except ValueError:
        return v


def parse_variant(tok: str) -> tuple[str, str, dict]:
    """``"wide@block_n=128:stages=3"`` -> ("wide", "", {"block_n": 128, "stages": 3});
    ``"cands:hopper_skinny"`` -> ("cands", "hopper_skinny", {})."""
    kind, _, over = tok.partition("@")
    kind, _, prefix = kind.partition(":")
    if kind not in KINDS:
        raise SystemExit(f"--variants: unknown kind {kind!r} in {tok!r}; expected one of {KINDS}")
    kw = {}
    for item in filter(None, over.split(":")):
        key, eq, val = item.partition("=")
        if not eq:
            raise SystemExit(f"--variants: expected FIELD=VALUE after '@', got {item!r} in {tok!r}")
        kw[key] = _value(val)
    return kind, prefix, kw


def _best(case: Case, dev, keep) -> object | None:
    """The cost model's best fp8_block candidate among those ``keep(cfg)`` accepts (None: none)."""
    from blockscaled.plan.calibration import load_calibration
    from blockscaled.plan.cost import predict_us
    from blockscaled.plan.dense import fp8_candidates

    p = case.problem()
    cal = load_calibration(dev.name, dev.sm_count, dev.mem_bw)
    scored = [(predict_us(c, p.fmt, p.m, p.n, p.k, dev, cal, out_bytes=p.out_bytes).us, i, c)
              for i, c in enumerate(fp8_candidates(p, dev)) if keep(c)]
    return min(scored)[2] if scored else None


def _override(cfg, kw: dict, out_bytes: int):
    """``cfg`` with the fields of ``kw`` replaced; a Hopper ring refilled when the tile changed."""
    from blockscaled.config.hopper import HopperConfig
    from blockscaled.plan.dense import hopper_fill_stages

    if not kw:
        return cfg
    if isinstance(cfg, HopperConfig) and cfg.variant == "wide" and "block_m" in kw and "num_warps" not in kw:
        kw = {**kw, "num_warps": kw["block_m"] // 16}
    new = dataclasses.replace(cfg, **kw)
    if isinstance(new, HopperConfig) and new.variant == "wide" and "stages" not in kw and any(
            f in kw for f in _RING_FIELDS):
        new = hopper_fill_stages(dataclasses.replace(new, stages=2), out_bytes)
    return new


def resolve(case: Case, tokens: list[str], dev) -> list[tuple[str, object]]:
    """(label, config) per variant for ``case`` on DeviceInfo ``dev`` (config None: the plan)."""
    import blockscaled as bs
    from blockscaled.config.hopper import HopperConfig
    from blockscaled.plan import Plan, plan_gemm
    from blockscaled.plan.grouped import grouped_hopper_config, swiglu_hopper_config
    from blockscaled.plan.grouped_portable import choose_grouped_config
    from blockscaled.plan.portable import choose_portable

    p = case.problem()
    fp8_hopper = case.op == "gemm" and case.fmt == "fp8_block" and not case.weight_only and dev.is_hopper
    out = []
    for tok in tokens:
        kind, prefix, kw = parse_variant(tok)
        mx_gemv = kind == "gemv" and case.op == "gemm" and case.fmt != "fp8_block"
        if kind in ("wide", "skinny", "gemv", "cands") and case.op == "gemm" and not fp8_hopper and not mx_gemv:
            raise SystemExit(f"variant {tok!r}: needs fp8_block quantized activations on sm_90 (ops gemm)")
        if kind in ("skinny", "gemv", "cands") and case.op != "gemm":
            raise SystemExit(f"variant {tok!r}: dense gemm only")
        if kind == "cands":
            for c in _candidates(case, dev):
                d = Plan("gemm", "cuda", c).describe()
                if d.startswith(prefix):
                    out.append((f"cand {d}", c))
            continue
        if kind == "plan":
            cfg = None
        elif kind == "cublas_bf16":
            if case.op != "gemm":
                raise SystemExit(f"variant {tok!r}: dense gemm only")
            out.append((tok, CUBLAS_BF16))
            continue
        elif kind == "deepgemm":
            if not fp8_hopper or case.out_dtype != "bf16":
                raise SystemExit(f"variant {tok!r}: dense fp8_block, quantized activations, bf16 out, sm_90 only")
            out.append((tok, DEEPGEMM))
            continue
        elif kind == "dequant_matmul":
            cfg = bs.GemmConfig(strategy="dequant_matmul")
        elif kind == "hopper":
            cfg = bs.GemmConfig(strategy="hopper")
            if kw and case.op == "gemm":
                cfg = plan_gemm(p, dev, cfg).config
            elif kw:
                kind = "wide"  # the grouped Hopper tiles are the wide kernel's
        if kind in ("wide", "skinny") and case.op == "gemm":
            cfg = _best(case, dev, lambda c, v=kind: isinstance(c, HopperConfig) and c.variant == v)
        elif kind == "wide":
            sms = dev.sm_count
            cfg = (swiglu_hopper_config({"dense": 0, "contiguous": 1, "masked": 2}[case.layout], case.rows,
                                        case.m, case.n, sms, p.out_bytes) if case.op == "swiglu"
                   else grouped_hopper_config(case.m, case.n, case.k, sms, p.out_bytes, case.experts))
        elif kind == "gemv_gluon":
            from blockscaled.plan.mx_gemv import gluon_gemv_config

            if case.op != "gemm" or case.fmt not in ("mxfp4", "nvfp4") or case.m > 2 or not case.weight_only:
                raise SystemExit(f"variant {tok!r}: dense mxfp4 / nvfp4 weight-only at M <= 2")
            cfg = gluon_gemv_config(dataclasses.replace(p, m=1), dev)
            if case.m == 2:  # two activation rows: 4 weight rows (8 spill: tests/test_aot_mx_gemv_gluon.py)
                cfg = dataclasses.replace(cfg, block_m=2, block_n=min(cfg.block_n, 4))
        elif mx_gemv:
            from blockscaled.plan.mx_gemv import MX_GEMV_MAX_M, mx_gemv_config

            if case.m > MX_GEMV_MAX_M:
                raise SystemExit(f"variant {tok!r}: the MX / NV GEMV takes M <= {MX_GEMV_MAX_M}")
            cfg = mx_gemv_config(case.fmt, case.m, case.n, case.k, dev)
        elif kind == "gemv":
            cfg = _best(case, dev, lambda c: not isinstance(c, HopperConfig) and c.strategy == "gemv")
        elif kind == "stream":
            from blockscaled.plan.stream import STREAM_FORMATS, STREAM_MAX_M, stream_config

            if case.op != "gemm" or case.fmt not in STREAM_FORMATS or case.m > STREAM_MAX_M:
                raise SystemExit(f"variant {tok!r}: dense {' / '.join(STREAM_FORMATS)} at M <= {STREAM_MAX_M}")
            cfg = stream_config(p, dev)
        elif kind == "direct":
            from blockscaled.plan.direct import DIRECT_FORMATS, DIRECT_MP, direct_config

            if case.op != "gemm" or case.fmt not in DIRECT_FORMATS or case.m > DIRECT_MP:
                raise SystemExit(f"variant {tok!r}: dense {' / '.join(DIRECT_FORMATS)} at M <= {DIRECT_MP}")
            # W x A: the activations dequantized to bf16 by one pass first (the kernel takes bf16)
            cfg = dataclasses.replace(direct_config(p, dev), dequant_a=not case.weight_only)
        elif kind == "tiled":
            from blockscaled.plan.tiled import (RS_FORMATS, TILED_FORMATS, grouped_tiled_config, regime_config,
                                                tiled_config)

            if case.op == "swiglu" or case.fmt not in TILED_FORMATS:
                raise SystemExit(f"variant {tok!r}: gemm / grouped with {' / '.join(TILED_FORMATS)} weights")
            if prefix:
                if prefix not in ("r1", "r3", "r4", "r5"):
                    raise SystemExit(f"variant {tok!r}: expected tiled:r1, r3, r4 or r5")
                if prefix != "r1" and case.fmt not in RS_FORMATS:
                    raise SystemExit(f"variant {tok!r}: the register-operand kernel takes {' / '.join(RS_FORMATS)}")
                cfg = regime_config(int(prefix[1]), 1, case.weight_only)
            else:
                cfg = (grouped_tiled_config(p, dev) if case.grouped else tiled_config(p, dev))[0]
        elif kind == "portable" and fp8_hopper:
            cfg = _best(case, dev, lambda c: not isinstance(c, HopperConfig) and c.strategy == "triton")
        elif kind == "portable" and case.op == "gemm":
            import torch

            a_dtype = torch.bfloat16 if case.weight_only else None
            out_dtype = getattr(torch, DTYPES[case.out_dtype])
            cfg = choose_portable(case.fmt, case.m, case.n, case.k, dev, a_dtype, out_dtype)
            if cfg.strategy != "triton":  # the rules pick dequantize + cuBLAS here: default tiles
                cfg = bs.GemmConfig()
        elif kind == "portable":
            import torch

            cfg = choose_grouped_config(case.fmt, case.m, case.n, case.k, dev, dual=case.op == "swiglu",
                                        grouping=case.layout, experts=case.experts if case.grouped else 1,
                                        out_dtype=getattr(torch, DTYPES[case.out_dtype]), allow_dequant=False,
                                        a_dtype=torch.bfloat16 if case.weight_only else None)
        if cfg is None and kind != "plan":
            raise SystemExit(f"variant {tok!r}: the planner has no such candidate for {case.label()}")
        try:
            out.append((tok, _override(cfg, kw, p.out_bytes)))
        except ValueError as e:  # a field the config cannot take (e.g. a split of the 256-token tiles)
            raise SystemExit(f"variant {tok!r}: {e}") from None
    return out


def _candidates(case: Case, dev) -> list:
    from blockscaled.plan.dense import fp8_candidates

    return fp8_candidates(case.problem(), dev)


def describe(case: Case, cfg, dev) -> str:
    """What a variant resolves to on ``dev`` (planned on the CPU; the run records what ran)."""
    from blockscaled.plan import Plan, plan_gemm
    from blockscaled.plan.grouped import plan_grouped

    if isinstance(cfg, Plan):
        return cfg.describe()
    if cfg == CUBLAS_BF16:
        return "cuBLAS bf16 on the dequantized operands"
    if cfg == DEEPGEMM:
        return "DeepGEMM fp8_gemm_nt on the same operands"
    if case.op == "gemm":
        return plan_gemm(case.problem(), dev, cfg).describe()
    if cfg is None or (not hasattr(cfg, "variant") and cfg.strategy == "hopper"):
        why = (None if case.fmt == "fp8_block" and not case.weight_only and dev.is_hopper
               else "not fp8_block x 128x128 on sm_90")
        return plan_grouped(case.problem(), dev, cfg, hopper_why=why).describe()
    return Plan(case.problem().op, "cuda", cfg).describe()


# ------------------------------------------------------------------------------------ GPU side
def make_set(case: Case, seed: int, device):
    """One set of operands: (a, b) dense gemm, (a, b, seg) grouped, (a, bg, bu[, seg]) SwiGLU."""
    import torch

    import blockscaled as bs

    g = torch.Generator(device=device).manual_seed(seed)

    def w(*shape):
        x = (torch.randn(*shape, device=device, generator=g) * 0.05).to(torch.bfloat16)
        return bs.quantize(x, case.fmt, block=(128, 128) if case.fmt == "fp8_block" else None)

    rows = (case.experts, case.m) if case.layout == "masked" else (case.rows,)
    x = torch.randn(*rows, case.k, device=device, generator=g).to(torch.bfloat16)
    a = x if case.weight_only else bs.quantize(x, case.fmt)
    lead = (case.experts,) if case.grouped else ()
    weights = (w(*lead, case.n, case.k),) + ((w(*lead, case.n, case.k),) if case.op == "swiglu" else ())
    if case.layout == "contiguous":
        seg = (torch.arange(case.experts + 1, dtype=torch.int32, device=device) * case.m,)
    elif case.layout == "masked":
        seg = (torch.full((case.experts,), case.m, dtype=torch.int32, device=device),)
    else:
        seg = ()
    return (a, *weights, *seg)


def runner(case: Case, cfg):
    """``fn(*set) -> output`` running ``case`` with ``cfg`` (None: the plan). A HopperConfig for
    a grouped / SwiGLU call is run through ``ops.grouped.launch`` as a Plan: the public grouped ops
    take only a GemmConfig."""
    import torch

    import blockscaled as bs
    from blockscaled.config.hopper import HopperConfig

    out_dtype = getattr(torch, DTYPES[case.out_dtype])
    key = {"contiguous": "offsets", "masked": "masked_m"}.get(case.layout)
    if cfg == CUBLAS_BF16:
        # bf16 copies per operand set, made once here (outside the timing), found by identity
        copies = {}

        def bf16(t):
            c = copies.get(id(t))
            if c is None:
                c = copies[id(t)] = (t.dequantize() if hasattr(t, "dequantize") else t).to(torch.bfloat16)
            return c

        return lambda a, b: torch.matmul(bf16(a), bf16(b).T).to(out_dtype)
    if cfg == DEEPGEMM:
        from blockscaled.bench.baselines import DeepGemmDense, GemmInputs

        dg = DeepGemmDense()
        prepared = {}  # per operand set, outside the timing (DeepGEMM's scale layout, the output)

        def run_dg(a, b):
            args = prepared.get((id(a), id(b)))
            if args is None:
                args = prepared[(id(a), id(b))] = dg.prepare(GemmInputs(None, a, b, torch.bfloat16))
            return dg.run(*args)
        return run_dg
    if case.op == "gemm":
        return lambda a, b: bs.gemm(a, b, out_dtype, config=cfg)
    if isinstance(cfg, HopperConfig):
        from blockscaled.ops.grouped import MODE_CONTIGUOUS, MODE_DENSE, MODE_MASKED, launch
        from blockscaled.plan import Plan

        mode = {"dense": MODE_DENSE, "contiguous": MODE_CONTIGUOUS, "masked": MODE_MASKED}[case.layout]
        plan = Plan(case.problem().op, "cuda", cfg, case.problem())
        if case.op == "grouped":
            return lambda a, b, seg: launch(a, b, None, None, seg, None, out_dtype, mode, plan)
        if case.grouped:
            return lambda a, bg, bu, seg: launch(a, bg, None, bu, seg, None, out_dtype, mode, plan)
        return lambda a, bg, bu: launch(a, bg, None, bu, None, None, out_dtype, mode, plan)
    if case.op == "grouped":
        return lambda a, b, seg: bs.grouped_gemm(a, b, **{key: seg}, out_dtype=out_dtype, config=cfg)
    if case.grouped:
        return lambda a, bg, bu, seg: bs.swiglu(a, bg, bu, **{key: seg}, out_dtype=out_dtype, config=cfg)
    return lambda a, bg, bu: bs.swiglu(a, bg, bu, out_dtype=out_dtype, config=cfg)


def reference(case: Case, args):
    """The float64 reference of one operand set."""
    from blockscaled.reference import gemm as ref_gemm
    from blockscaled.reference import grouped as ref_grouped

    if case.op == "gemm":
        return ref_gemm.gemm(*args)
    kw = {}
    if case.grouped:
        kw = {{"contiguous": "offsets", "masked": "masked_m"}[case.layout]: args[-1]}
        args = args[:-1]
    return (ref_grouped.grouped_gemm if case.op == "grouped" else ref_grouped.swiglu)(*args, **kw)


def set_bytes(args, out_bytes: int) -> int:
    """Bytes of one operand set (ScaledTensor data + scales) plus the output."""
    total = out_bytes
    for t in args:
        for part in (getattr(t, "data", t), getattr(t, "scale", None)):
            if part is not None and hasattr(part, "element_size"):
                total += part.numel() * part.element_size()
    return total


def run_case(case: Case, variants: list[tuple[str, object]], args) -> list[dict]:
    """Check every variant once, then time all of them in interleaved rounds."""
    import torch

    from blockscaled.bench.timing import rotation_count, time_op
    from blockscaled.plan import device_info, observe_plans
    from blockscaled.testing.tolerances import assert_gemm_close

    dev = torch.device("cuda")
    out_dtype = getattr(torch, DTYPES[case.out_dtype])
    first = make_set(case, 0, dev)
    out_bytes = case.rows * case.n * out_dtype.itemsize
    nbytes = set_bytes(first, out_bytes)
    sets = [first] + [make_set(case, s, dev) for s in range(1, min(args.max_sets, rotation_count(nbytes)))]
    ref = reference(case, first)
    fns, ran = {}, {}
    for label, cfg in variants:
        fn = runner(case, cfg)
        if cfg in BASELINES:
            for s in sets:  # the bf16 copies / DeepGEMM's inputs of every set before any timing
                fn(*s)
        with observe_plans() as plans:
            y = fn(*first)
        torch.cuda.synchronize()
        ran[label] = plans[-1].describe() if plans else {CUBLAS_BF16: "cuBLAS bf16", DEEPGEMM: "DeepGEMM"}.get(cfg, "?")
        assert_gemm_close(y, ref, case.fmt, out_dtype, what=f"{case.label()} {label}")
        fns[label] = fn
    del ref
    us = {label: [] for label in fns}
    for r in range(args.rounds):
        for label in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            t = time_op(fns[label], sets, warmup=args.warmup, iterations=args.iterations)
            us[label].append(t.median_ms * 1e3)
    base = variants[0][0]
    floor_us = nbytes / device_info(dev).mem_bw * 1e6
    rows = []
    for label, _ in variants:
        med = statistics.median(us[label])
        ratio = statistics.median(b / t for b, t in zip(us[base], us[label]))
        rows.append({"case": case.label(), "m": case.m, "n": case.n, "k": case.k, "variant": label,
                     "ran": ran[label], "us": med, "us_rounds": us[label], "tflops": case.flops / med / 1e6,
                     "floor_pct": 100 * floor_us / med, "vs_" + base: ratio})
        print(f"  {label:<34} {med:9.1f} us {case.flops / med / 1e6:7.0f} TFLOP/s {100 * floor_us / med:5.0f}% "
              f"{ratio:6.3f}x  [{ran[label]}]", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", default="gemm", choices=sorted(LAYOUTS))
    p.add_argument("--layout", default=None, help="dense (gemm, swiglu), contiguous or masked (grouped, swiglu)")
    p.add_argument("--experts", type=int, default=8, help="grouped layouts: experts (default 8)")
    p.add_argument("--fmt", default="fp8_block", choices=("fp8_block", "mxfp8", "mxfp4", "nvfp4"))
    p.add_argument("--weight-only", action="store_true", help="bf16 activations (W8A16 / W4A16)")
    p.add_argument("--out-dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--shapes", required=True, help="MxNxK,... (grouped layouts: M rows per expert)")
    p.add_argument("--variants", default="plan,hopper,portable", help="comma list (see below); first = baseline")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iterations", type=int, default=20, help="graph replays timed per round and variant")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--max-sets", type=int, default=4, help="at most this many rotated operand copies")
    p.add_argument("--list", action="store_true", help="print what each variant resolves to and exit "
                   "(no GPU needed: plans for an H100 where there is none)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    layout = args.layout or LAYOUTS[args.op][0]
    if layout not in LAYOUTS[args.op]:
        raise SystemExit(f"--layout: {args.op} takes {LAYOUTS[args.op]}, got {layout!r}")
    tokens = [t for t in args.variants.split(",") if t]
    cases = [Case(args.op, args.fmt, m, n, k, layout, args.experts, args.out_dtype, args.weight_only)
             for m, n, k in parse_shapes(args.shapes)]

    import torch

    from blockscaled.plan import H100_SXM, device_info

    cuda = torch.cuda.is_available()
    dev = device_info(torch.device("cuda")) if cuda else H100_SXM
    resolved = [(c, resolve(c, tokens, dev)) for c in cases]
    if args.list or not cuda:
        for c, variants in resolved:
            print(f"{c.label()} ({dev.name or dev.kind}):")
            for label, cfg in variants:
                print(f"  {label:<34} {describe(c, cfg, dev)}")
        if not cuda and not args.list:
            print("ab.py: no CUDA device; the variants above are resolved for an H100, nothing was timed",
                  file=sys.stderr)
            return 2
        return 0
    rows = []
    for c, variants in resolved:
        print(f"--- {c.label()} on {torch.cuda.get_device_name()}", flush=True)
        rows += run_case(c, variants, args)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "argv": sys.argv[1:], "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
