"""Plans cross the custom-op boundary whole (plan/encoding.py): for every plan the planner can
return, ``decode_plan(encode_plan(p)) == p`` and ``decode_config(encode_config(c)) == c``, and
the encodings are injective. The planner is a pure function of plain values, so the grid covers
the H100's plans (cost-model choices, tail splits, split-K, skinny, GEMV) on a CPU machine."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from blockscaled.config.gemm import GemmConfig
from blockscaled.config.hopper import EPILOGUES, SPLIT_REDUCE, VARIANTS, HopperConfig
from blockscaled.plan import CPU_INTERPRETER, H100_SXM, OPS, BACKENDS, DeviceInfo, Plan, Problem, plan_gemm
from blockscaled.plan.dense import fp8_candidates
from blockscaled.plan.encoding import CONFIG_TAGS, decode_config, decode_plan, encode_config, encode_plan
from blockscaled.plan.grouped import grouped_hopper_config, plan_grouped, plan_grouped_list, swiglu_hopper_config
from blockscaled.plan.grouped_portable import check_grouped_config

FORMATS = ("fp8_block", "mxfp8", "mxfp4", "nvfp4")
#: activations: quantized, and the weight-only dtypes
A_KINDS = ("quantized", "bfloat16", "float16")
MS = (1, 2, 3, 8, 16, 31, 64, 100, 128, 256, 512, 1024, 4096, 16384)
#: odd sizes included (N not a multiple of a tile, K not a multiple of 128 or of 16)
NS = (1, 7, 100, 128, 2112, 7168)
KS = (16, 33, 128, 1000, 2048, 7168)
#: the H100 (cost model, Hopper kernels), the same part with fewer SMs, and the CPU interpreter
DEVICES = (H100_SXM, dataclasses.replace(H100_SXM, sm_count=78), CPU_INTERPRETER)
OUT_DTYPES = ("bfloat16", "float16", "float32")
HOPPER_WHY = (None, "weight-only (dense activations) runs the portable kernel")


def _roundtrip_configs(configs) -> dict:
    """Round-trip every config; return {code: config} (asserting no two configs share a code)."""
    seen: dict[tuple, object] = {}
    for c in configs:
        code = encode_config(c)
        assert all(type(v) is int for v in code), code
        assert len(code) == 1 + len(dataclasses.fields(c)), (c, code)
        back = decode_config(code)
        assert type(back) is type(c) and back == c, (c, code, back)
        assert seen.setdefault(tuple(code), c) == c, f"two configs share the code {code}: {seen[tuple(code)]}, {c}"
    return seen


def _roundtrip_plans(plans) -> dict:
    """Round-trip every plan (and its config); return {code: plan}, asserting injectivity."""
    seen: dict[tuple, Plan] = {}
    for p in plans:
        code = encode_plan(p)
        assert all(type(v) is int for v in code), code
        back = decode_plan(code)
        assert back == p and back.kernel == p.kernel, (p, code, back)
        assert type(back.config) is type(p.config), (p, back)
        assert seen.setdefault(tuple(code), p) == p, f"two plans share the code {code}: {seen[tuple(code)]}, {p}"
    _roundtrip_configs({p.config for p in plans if p.config is not None})
    return seen


def _dense_plans() -> set:
    plans = set()
    for dev, fmt, a, m, n, k in itertools.product(DEVICES, FORMATS, A_KINDS, MS, NS, KS):
        interp = (True, False) if dev.kind == "cpu" else (False,)
        for it in interp:
            plans.add(plan_gemm(Problem("gemm", fmt, m, n, k, a=a, interpret=it), dev))
    # the other inputs of the planner at a few shapes: out dtype, bias, 1x128 weight blocks, no TMA
    for fmt, m, n, k, out, bias, br, tma in itertools.product(
            FORMATS, (1, 16, 128, 4096), (128, 7168), (128, 7168), OUT_DTYPES, (False, True), (1, 128),
            (True, False)):
        if br == 1 and fmt != "fp8_block":
            continue
        plans.add(plan_gemm(Problem("gemm", fmt, m, n, k, out_dtype=out, bias=bias, b_block_rows=br, tma=tma),
                            H100_SXM))
    return plans


def test_every_dense_plan_roundtrips():
    """plan_gemm over formats x quantized / weight-only x M x N x K on the H100, a smaller sm_90
    part and the CPU interpreter (and reference), plus out dtypes, bias, block rows and TMA."""
    plans = _dense_plans()
    _roundtrip_plans(plans)
    kinds = {p.kernel for p in plans}
    assert kinds >= {"portable", "gemv", "dequant_matmul", "hopper_wide", "hopper_skinny", "reference"}, kinds
    assert {p.backend for p in plans} == {"cuda", "interpreter", "reference"}
    hop = [p.config for p in plans if isinstance(p.config, HopperConfig)]
    assert any(c.split_k > 1 for c in hop) and any(c.tail_split > 1 for c in hop)
    assert any(c.variant == "skinny" and c.split_k > 1 for c in hop)


def test_mx_gemv_plans_roundtrip(mx_kernels, monkeypatch):
    """The MX / NV decode GEMV plans (strategy "gemv" with mxfp8 / mxfp4 / nvfp4 weights, M <= 8,
    both modes, odd K): every field comes back, and the configs differ from each other where the
    tiles differ (block_m, block_n, chunk, warps). The planner's row thresholds are raised to the
    kernel's 8 rows so that every block_m is planned."""
    from blockscaled.plan import direct, mx_gemv

    monkeypatch.setattr(direct, "DIRECT_ENABLED", False)  # it takes fp4 weight-only 2..8 rows first
    monkeypatch.setattr(mx_gemv, "MX_GEMV_ROWS", dict.fromkeys(mx_gemv.MX_GEMV_ROWS, mx_gemv.MX_GEMV_MAX_M))
    plans = set()
    for dev, fmt, a, m, n, k in itertools.product(DEVICES[:2], ("mxfp8", "mxfp4", "nvfp4"), A_KINDS,
                                                  range(1, 9), (7, 2880, 28672), (45, 2880, 8192, 17920)):
        plan = plan_gemm(Problem("gemm", fmt, m, n, k, a=a), dev)
        assert plan.kernel == "gemv", plan
        plans.add(plan)
    _roundtrip_plans(plans)
    cfgs = {p.config for p in plans}
    assert {c.block_m for c in cfgs} == {1, 2, 4, 8} and len({c.block_n for c in cfgs}) > 2
    assert len({c.block_k for c in cfgs}) > 2 and len({c.num_warps for c in cfgs}) > 1


def test_gluon_gemv_plans_roundtrip(mx_kernels, monkeypatch):
    """The Gluon GEMV's plans (triton 3.7 / 3.8: fp4 weight-only at one row on small weights): every field,
    gluon=True included, comes back; the tiles vary (rows, warps) over the shapes."""
    from blockscaled.plan import mx_gemv

    monkeypatch.setattr(mx_gemv, "_GLUON_TRITON_OK", True)
    monkeypatch.setattr(mx_gemv, "MX_GEMV_ROWS", mx_gemv.MX_GEMV_ROWS_BY_RELEASE[(3, 8)])
    plans = set()
    for dev, fmt, n, k in itertools.product(DEVICES[:2], ("mxfp4", "nvfp4"), (7, 1024, 2880, 7168),
                                            (32, 1536, 2048, 2880, 5120, 8192)):
        plan = plan_gemm(Problem("gemm", fmt, 1, n, k, a="bfloat16", b_block_rows=1), dev)
        if n * k // 2 <= mx_gemv.MX_GEMV_GLUON_MAX_BYTES and dev.is_hopper:
            assert plan.kernel == "gemv_gluon" and plan.config.gluon, plan
            plans.add(plan)
    _roundtrip_plans(plans)
    cfgs = {p.config for p in plans}
    assert len({c.block_n for c in cfgs}) > 1 and {c.num_warps for c in cfgs} == set(mx_gemv.MX_GEMV_GLUON_WARPS)


def test_every_fp8_candidate_roundtrips():
    """Every candidate the cost model ranks (plan.dense.fp8_candidates), chosen or not, encodes:
    a forced config or a recalibrated model may run any of them."""
    cands = set()
    for dev, m, n, k, out in itertools.product(DEVICES[:2], MS, NS, KS, ("bfloat16", "float32")):
        p = Problem("gemm", "fp8_block", m, n, k, out_dtype=out)
        cands.update(fp8_candidates(p, dev))
    _roundtrip_configs(cands)
    for c in cands:
        assert decode_plan(encode_plan(Plan("gemm", "cuda", c))) == Plan("gemm", "cuda", c)
    hop = [c for c in cands if isinstance(c, HopperConfig)]
    assert {c.variant for c in hop} == set(VARIANTS)
    assert any(c.split_k > 1 for c in hop) and any(c.tail_split > 1 for c in hop)
    gem = [c for c in cands if isinstance(c, GemmConfig)]
    assert {c.strategy for c in gem} == {"triton", "gemv", "dequant_matmul"}
    assert any(c.swap_ab for c in gem) and any(c.split_k > 1 for c in gem)


def _grouped_problems():
    """Contiguous and masked grouped GEMMs, and contiguous / masked / dense SwiGLU problems."""
    for op, grouping in (("grouped", "contiguous"), ("grouped", "masked"), ("swiglu", "contiguous"),
                         ("swiglu", "masked"), ("swiglu", "dense")):
        dual = op == "swiglu"
        experts_list = (1,) if grouping == "dense" else (1, 4, 8, 64)
        for fmt, a, e, rpe, n, k in itertools.product(FORMATS, A_KINDS, experts_list, (1, 16, 64, 100, 128, 512, 4096),
                                                      (128, 2048, 7168), (128, 2048, 7168)):
            m = rpe if grouping == "dense" else e * rpe
            yield Problem(op, fmt, m, n, k, a=a, grouping=grouping, experts=e, rows_per_expert=float(rpe),
                          dual=dual)


def test_every_grouped_plan_roundtrips():
    """plan_grouped for contiguous / masked grouped GEMMs and contiguous / masked / dense SwiGLU,
    with the Hopper kernel available (hopper_why None) and not (a reason), on the H100 (tail
    splits, 64/128-row tiles, dequant_matmul) and the CPU (interpreter and reference)."""
    plans = set()
    for p in _grouped_problems():
        for why in HOPPER_WHY:
            plans.add(plan_grouped(p, H100_SXM, hopper_why=why))
        for it in (True, False):
            plans.add(plan_grouped(dataclasses.replace(p, interpret=it), CPU_INTERPRETER, hopper_why=HOPPER_WHY[1]))
    seen = _roundtrip_plans(plans)
    assert len(seen) == len(plans)
    from blockscaled.plan import direct as plan_direct
    from blockscaled.plan import stream as plan_stream

    kinds = {"hopper_wide", "portable_grouped", "grouped_dequant_matmul", "reference"}
    if plan_stream._TRITON_OK and plan_stream.STREAM_ENABLED:  # mxfp4 / nvfp4 decode problems
        kinds.add("hopper_stream")
        if plan_direct._TRITON_OK and plan_direct.DIRECT_ENABLED:  # the bf16 ones at <= 4 rows per expert
            kinds.add("hopper_direct")
    from blockscaled.plan import tiled as plan_tiled

    if plan_tiled._TRITON_OK and plan_tiled.TILED_ENABLED:  # MX / NV prefill: the grouped tiled kernel
        kinds.add("hopper_tiled")
    assert {p.kernel for p in plans} == kinds
    assert {p.op for p in plans} == {"grouped", "swiglu"}
    hop = [p.config for p in plans if isinstance(p.config, HopperConfig)]
    assert any(c.tail_split > 1 for c in hop) and {c.block_m for c in hop} == {64, 128}
    assert {c.epilogue for c in hop} == {"tma", "masked"}
    gem = [p.config for p in plans if isinstance(p.config, GemmConfig) and p.config.strategy == "triton"]
    assert {c.promote for c in gem} == {True, False}  # resolved by the chooser


def test_hopper_grouped_tiles_roundtrip():
    """Every grouped / SwiGLU Hopper tile choice over rows, N, K, SM counts, out dtypes and experts,
    tail splits included (the field that was once lost crossing the op)."""
    rows = (1, 16, 64, 65, 128, 129, 256, 512, 2048, 16384)
    got = {grouped_hopper_config(r, n, k, sms, ob, e) for r, n, k, sms, ob, e in itertools.product(
        rows, (128, 2048, 2112, 7168), (512, 2048, 4096, 7168), (132, 114, 78), (2, 4), (1, 4, 8, 256))}
    got |= {swiglu_hopper_config(mode, r, rpe, n, sms, ob) for mode, r, n, sms, ob in itertools.product(
        (0, 1, 2), rows, (128, 2048, 7168), (132, 78), (2, 4)) for rpe in (r, max(1.0, r / 8))}
    _roundtrip_configs(got)
    assert max(c.tail_split for c in got) > 1
    # E=4 m=512 N=7168 K=7168 on 132 SMs: the tail split survives the round trip
    c = grouped_hopper_config(512, 7168, 7168, 132, 2, 4)
    assert c.tail_split > 1 and decode_config(encode_config(c)).tail_split == c.tail_split


def test_grouped_list_and_forced_plans_roundtrip():
    """plan_grouped_list, forced configs (checked grouped ones with promote resolved, forced
    dense GemmConfig / HopperConfig), and the plain GemmConfig values (promote None)."""
    plans = set()
    for dev, fmt, m, n, k in itertools.product((H100_SXM, CPU_INTERPRETER), FORMATS, (1, 64, 256, 4096),
                                               (128, 7168), (256, 7168)):
        plans.add(plan_grouped_list(Problem("grouped_list", fmt, m, n, k, experts=8, interpret=True), dev))
    for fmt, bk in (("fp8_block", 128), ("mxfp8", 32), ("nvfp4", 128), ("mxfp4", 64)):
        for c in (GemmConfig(64, 32, bk, 4, 2), GemmConfig(16, 16, bk, 2, 1, promote=fmt != "nvfp4")):
            try:
                c = check_grouped_config(c, fmt)
            except ValueError:
                continue  # a combination the format cannot run: no call launches it
            plans.add(Plan("grouped", "cuda", c))
            plans.add(plan_grouped(Problem("grouped", fmt, 64, 128, 256, grouping="masked", experts=2,
                                           rows_per_expert=32.0), H100_SXM, c, hopper_why="x"))
    forced = (GemmConfig(64, 64, 128, 4, 3, 2, "triton", True, 8, False), GemmConfig(strategy="hopper"),
              HopperConfig("wide", 128, 256, 8, 4, tail_split=3), HopperConfig("skinny", 16, 128, 4, 6, split_k=4))
    for f in forced:
        plans.add(plan_gemm(Problem("gemm", "fp8_block", 64, 7168, 2048), H100_SXM, f))
        plans.add(plan_gemm(Problem("gemm", "fp8_block", 64, 7168, 2048, bias=True), H100_SXM, f))
    plans.add(Plan("quantize", "cuda", None))
    plans.add(Plan("dequantize", "interpreter", None))
    _roundtrip_plans(plans)
    _roundtrip_configs([GemmConfig(), GemmConfig(promote=None), GemmConfig(promote=False, swap_ab=True, group_m=1)])


def test_every_field_travels():
    """Each field, changed alone from a base config, changes the code and comes back: no field is
    dropped (the bug this encoding replaced: tail_split was lost between the chooser and the kernel)."""
    base_h = HopperConfig("wide", 128, 256, 8, 4, epilogue="masked")
    variants_h = [dataclasses.replace(base_h, **kw) for kw in (
        {"block_m": 64, "num_warps": 4}, {"block_n": 128}, {"stages": 5}, {"group_m": 1},
        {"epilogue": "tma"}, {"epilogue": "tma1"}, {"split_wg": False}, {"split_k": 3}, {"tail_split": 7},
        {"split_reduce": "last"})]
    variants_h += [HopperConfig("skinny", 16, 128, 4, 6, split_k=4)]
    base_g = GemmConfig(64, 128, 32, 4, 3, 1, "triton", True, 8, False)
    variants_g = [dataclasses.replace(base_g, **kw) for kw in (
        {"block_m": 128}, {"block_n": 64}, {"block_k": 128}, {"num_warps": 8}, {"num_stages": 5}, {"split_k": 2},
        {"strategy": "dequant_matmul"}, {"strategy": "hopper"}, {"promote": False}, {"promote": None},
        {"group_m": 4}, {"swap_ab": True})]
    variants_g += [GemmConfig(16, 64, 128, 4, 4, 2, "stream", dequant_a=True),
                   GemmConfig(8, 64, 128, 4, 1, 3, "direct", maxnreg=128),
                   GemmConfig(1, 8, 2048, 2, 1, 1, "gemv", gluon=True)]
    for base, variants in ((base_h, variants_h), (base_g, variants_g)):
        seen = _roundtrip_configs([base, *variants])
        assert len(seen) == 1 + len(variants)
    changed = {f.name for v in variants_h for f in dataclasses.fields(v) if getattr(v, f.name) != getattr(base_h, f.name)}
    assert changed == {f.name for f in dataclasses.fields(HopperConfig)}
    changed = {f.name for v in variants_g for f in dataclasses.fields(v) if getattr(v, f.name) != getattr(base_g, f.name)}
    assert changed == {f.name for f in dataclasses.fields(GemmConfig)}
    assert set(EPILOGUES) <= {v.epilogue for v in variants_h} and set(SPLIT_REDUCE) <= {
        v.split_reduce for v in [base_h, *variants_h]}
    # a plan's op and backend travel too
    plans = [Plan(op, be, base_g) for op in OPS for be in BACKENDS]
    assert len(_roundtrip_plans(plans)) == len(plans)


def test_tags_and_bad_codes():
    assert set(CONFIG_TAGS) == {GemmConfig, HopperConfig}
    good = encode_config(HopperConfig("wide", 128, 256, 8, 4))
    with pytest.raises(ValueError, match="non-empty list"):
        decode_config([])
    with pytest.raises(ValueError, match=r"code\[0\].*tag"):
        decode_config([9, *good[1:]])
    with pytest.raises(ValueError, match=f"takes {len(good)} ints"):
        decode_config(good[:-1])
    with pytest.raises(ValueError, match="variant index"):
        decode_config([good[0], len(VARIANTS), *good[2:]])
    bad = list(encode_config(GemmConfig()))
    bad[8] = 2  # promote: 0 / 1 / -1 only
    with pytest.raises(ValueError, match="promote must be 0 / 1 / -1"):
        decode_config(bad)
    with pytest.raises(ValueError, match="block_m"):  # the dataclass validates the decoded fields
        decode_config([1, 48, *encode_config(GemmConfig())[2:]])
    with pytest.raises(TypeError, match="GemmConfig or a HopperConfig"):
        encode_config({"block_m": 64})
    with pytest.raises(TypeError, match=r"GemmConfig.group_m: expected an int"):  # the dataclass checks types
        GemmConfig(group_m=8.0)
    plan_code = encode_plan(Plan("grouped", "cuda", HopperConfig()))
    with pytest.raises(ValueError, match="list of ints from encode_plan"):
        decode_plan(plan_code[:2])
    with pytest.raises(ValueError, match="out of range"):
        decode_plan([len(OPS), *plan_code[1:]])
    with pytest.raises(ValueError, match="out of range"):
        decode_plan([plan_code[0], len(BACKENDS), *plan_code[2:]])
    assert encode_plan(Plan("quantize", "reference", None))[2:] == [0]


def test_devices_are_plain_values():
    """A DeviceInfo built by hand plans like the preset: the grid above needs no GPU."""
    dev = DeviceInfo("cuda", 132, (9, 0), 232448, H100_SXM.l2_bytes, H100_SXM.mem_bw, H100_SXM.name)
    assert dev == H100_SXM
    p = Problem("gemm", "fp8_block", 4096, 2112, 7168)
    assert plan_gemm(p, dev) == plan_gemm(p, H100_SXM)


def test_direct_plans_roundtrip(monkeypatch):
    """The register-streaming kernel's plans (strategy "direct": 8 padded rows, the split; forced
    with dequant_a for quantized activations) cross the custom-op boundary whole."""
    from blockscaled.config.gemm import GemmConfig
    from blockscaled.plan import direct as plan_direct

    monkeypatch.setattr(plan_direct, "_TRITON_OK", True)
    monkeypatch.setattr(plan_direct, "DIRECT_ENABLED", True)
    plan_gemm.cache_clear()
    plans = set()
    for fmt, m, n, k in itertools.product(("mxfp4", "nvfp4"), (2, 5, 8), (7, 2880, 28672, 57344), (32, 2880, 8192)):
        plan = plan_gemm(Problem("gemm", fmt, m, n, k, a="bfloat16", b_block_rows=1), H100_SXM)
        if fmt == "mxfp4" and m == 2 and n * k // 2 < plan_direct.DIRECT_GEMV_MIN_BYTES:
            continue
        assert plan.kernel == "hopper_direct", plan
        plans.add(plan)
    plan_gemm.cache_clear()
    forced = GemmConfig(block_m=8, block_n=64, block_k=128, num_warps=4, num_stages=1, split_k=3, strategy="direct",
                        dequant_a=True)
    plans.add(Plan("gemm", "cuda", forced))
    _roundtrip_plans(plans)
    assert len({p.config.split_k for p in plans}) > 2


def test_stream_plans_roundtrip(monkeypatch):
    """The streaming kernel's plans (strategy "stream": padded rows, split, ring depth)
    cross the custom-op boundary whole."""
    from blockscaled.plan import direct as plan_direct, stream as plan_stream, tiled as plan_tiled

    monkeypatch.setattr(plan_tiled, "TILED_ENABLED", False)  # it takes MX / NV from 33 rows (below)
    monkeypatch.setattr(plan_stream, "_TRITON_OK", True)
    monkeypatch.setattr(plan_stream, "STREAM_ENABLED", True)
    monkeypatch.setattr(plan_direct, "DIRECT_ENABLED", False)  # it takes 2..8 rows first (below)
    plan_gemm.cache_clear()
    plans = set()
    for fmt, m, n, k in itertools.product(("mxfp4", "nvfp4"), (3, 8, 16, 32, 64), (7, 2880, 28672), (32, 2880, 8192)):
        plan = plan_gemm(Problem("gemm", fmt, m, n, k, a="bfloat16", b_block_rows=1), H100_SXM)
        assert plan.kernel == "hopper_stream", plan
        plans.add(plan)
    plan_gemm.cache_clear()
    _roundtrip_plans(plans)
    cfgs = {p.config for p in plans}
    assert {c.block_m for c in cfgs} == {8, 16, 32, 64} and len({c.split_k for c in cfgs}) > 2
    assert len({c.num_stages for c in cfgs}) > 1
    # the tiled planner's 64-token tiles with a K split (plan/tiled.py R4, from 33 rows)
    monkeypatch.setattr(plan_tiled, "TILED_ENABLED", True)
    monkeypatch.setattr(plan_tiled, "_TRITON_OK", True)
    plan_gemm.cache_clear()
    r4 = set()
    for fmt, m, n, k, a in itertools.product(("mxfp4", "nvfp4"), (33, 64), (2880, 28672), (2880, 8192),
                                             ("bfloat16", "quantized")):
        plan = plan_gemm(Problem("gemm", fmt, m, n, k, a=a, b_block_rows=1), H100_SXM)
        assert plan.kernel == "hopper_tiled" and plan.config.is_register_operand and plan.config.block_m == 64, plan
        r4.add(plan)
    plan_gemm.cache_clear()
    _roundtrip_plans(r4)
    assert len({p.config.split_k for p in r4}) > 1 and {p.config.dequant_a for p in r4} == {False, True}
