"""The planner (blockscaled.plan): pure, H100 plans computed on the CPU, carried and explained.

GPU-side checks that the launched kernel equals the plan: tests/test_plan_carried_gpu.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
import torch

import blockscaled as bs
from blockscaled.config import GemmConfig, HopperConfig
from blockscaled.plan import CPU_INTERPRETER, H100_SXM, DeviceInfo, Plan, Problem, observe_plans, plan_gemm
from blockscaled.plan import calibration as cal_mod
from blockscaled.plan.cost import predict_us
from blockscaled.plan.dense import SPLITS, fp8_candidates
from blockscaled.plan.encoding import decode_plan, encode_plan
from blockscaled.plan.table import dispatch_table

MS = (1, 2, 3, 8, 16, 31, 32, 33, 64, 100, 128, 129, 256, 384, 512, 1000, 1024, 2048, 4096, 8192, 16384)
NK = ((7168, 2048), (2112, 7168), (32768, 512), (4096, 14336), (57344, 8192), (1000, 4096), (3000, 1040),
      (256, 256), (129, 7168))


@pytest.mark.parametrize("n,k", NK)
def test_fp8_plans_are_candidates_and_valid(n, k):
    """Every dense fp8_block plan on an H100 is one of its candidates, costed, explained and
    round-trips through the custom-op encoding; Hopper only where TMA can take the operands."""
    for m in MS:
        p = Problem("gemm", "fp8_block", m, n, k)
        plan = plan_gemm(p, H100_SXM)
        assert plan.config in fp8_candidates(p, H100_SXM), (m, n, k, plan)
        assert plan.predicted_us and plan.predicted_us > 0
        assert plan.reasons and "candidates" in plan.reasons[0]
        assert plan.kernel in str(plan)
        assert decode_plan(encode_plan(plan)) == plan
        # no TMA (e.g. a misaligned base or K % 16 != 0) or a bias: never a Hopper kernel
        for q in (dataclasses.replace(p, tma=False), dataclasses.replace(p, bias=True)):
            assert not isinstance(plan_gemm(q, H100_SXM).config, HopperConfig)


def test_candidates_cover_the_kernel_families():
    p = Problem("gemm", "fp8_block", 1, 7168, 2048)
    kinds = {Plan("gemm", "cuda", c).kernel for c in fp8_candidates(p, H100_SXM)}
    assert kinds == {"gemv", "hopper_skinny", "hopper_wide", "portable", "dequant_matmul"}
    splits = {c.split_k for c in fp8_candidates(p, H100_SXM)}
    assert splits <= set(SPLITS) | {7, 9, 11, 13, 14, 15}  # launched counts of the requested SPLITS
    big = Problem("gemm", "fp8_block", 8192, 7168, 2048, out_dtype="float32")
    assert all(c.strategy != "dequant_matmul" for c in fp8_candidates(big, H100_SXM)
               if isinstance(c, GemmConfig)), "fp32 output must not take bf16 operands"


def test_forced_configs():
    p = Problem("gemm", "fp8_block", 64, 4096, 4096)
    forced = GemmConfig(64, 64, 128, 4, 4, 2, "triton", True)
    assert plan_gemm(p, H100_SXM, forced).config == forced
    h = HopperConfig("wide", 64, 128, 4, 4)
    assert plan_gemm(p, H100_SXM, h).config == h
    # "hopper" as a strategy: the best Hopper candidate; without TMA: the portable plan, said so
    assert isinstance(plan_gemm(p, H100_SXM, GemmConfig(strategy="hopper")).config, HopperConfig)
    fb = plan_gemm(dataclasses.replace(p, tma=False), H100_SXM, h)
    assert not isinstance(fb.config, HopperConfig) and "cannot take" in fb.reasons[0]


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
def test_other_formats_and_devices(fmt, mx_kernels):
    from blockscaled.plan import stream as plan_stream, tiled as plan_tiled

    for m in (1, 64, 4096):
        plan = plan_gemm(Problem("gemm", fmt, m, 4096, 4096), H100_SXM)
        # M = 1: the MX / NV decode GEMV (tests/test_mx_gemv.py); M = 64: the streaming kernel
        # where its triton gate is open (tests/test_planner.py::test_stream_*)
        want = ("portable", "dequant_matmul")
        if m == 1:
            want = ("gemv",)
        elif m == 64 and plan_tiled._TRITON_OK and plan_tiled.TILED_ENABLED:
            want = ("hopper_tiled",)  # from 33 rows: the register-operand kernel's 64-token tiles
        elif m == 64 and plan_stream._TRITON_OK and plan_stream.STREAM_ENABLED:
            want = ("hopper_stream",)
        assert plan.kernel in want and plan.reasons, (m, plan)
    a100 = DeviceInfo("cuda", 108, (8, 0), 166912, name="NVIDIA A100")
    for f in (fmt, "fp8_block"):
        plan = plan_gemm(Problem("gemm", f, 4096, 4096, 4096), a100)
        assert plan.kernel == "portable" and "portable kernels only" in plan.reasons[0]
    assert plan_gemm(Problem("gemm", fmt, 8, 64, 64), CPU_INTERPRETER).backend == "reference"
    assert plan_gemm(Problem("gemm", fmt, 8, 64, 64, interpret=True), CPU_INTERPRETER).backend == "interpreter"


def test_unknown_gpu_uses_scaled_h100_constants():
    h200 = DeviceInfo("cuda", 132, (9, 0), 232448, 50 * 2**20, 4.4e12, "NVIDIA H200 (test)")
    cal = cal_mod.load_calibration(h200.name, h200.sm_count, h200.mem_bw)
    assert "scaled" in cal.source and cal["mem_bw"] == 4.4e12
    plan = plan_gemm(Problem("gemm", "fp8_block", 1, 7168, 16384), h200)
    assert "scaled" in plan.reasons[0]
    fast = predict_us(plan.config, "fp8_block", 1, 7168, 16384, h200, cal).us
    slow = predict_us(plan.config, "fp8_block", 1, 7168, 16384, H100_SXM,
                      cal_mod.load_calibration(H100_SXM.name, 132, H100_SXM.mem_bw)).us
    assert fast < slow  # more bandwidth, faster weight stream
    # only what the device changes is scaled: DRAM bandwidth; the L2 -> SM bandwidth with the SM count;
    # per-program streaming rates (latency-bound) and per-unit times stay the H100's
    h100 = cal_mod.load_calibration(H100_SXM.name, 132, H100_SXM.mem_bw)
    assert cal["l2_bw"] == h100["l2_bw"] and cal["tiles"] == h100["tiles"]
    half = cal_mod.load_calibration("NVIDIA Hopper with 66 SMs (test)", 66, 2.0e12)
    assert half["l2_bw"] == h100["l2_bw"] / 2 and half["mem_bw"] == 2.0e12 and half["tiles"] == h100["tiles"]


def test_device_files_are_physical():
    """No tile reaches more than the measured copy bandwidth (dram_eff <= 1; a fitted 282.7 for the GEMV
    switched its DRAM bound off), and rates and times are positive."""
    for path in cal_mod.DEVICES_DIR.glob("*.json"):
        d = json.loads(path.read_text())
        for key, t in d["tiles"].items():
            assert 0 < t["dram_eff"] <= 1.0, (path.name, key, t["dram_eff"])
            assert t["bw_cta"] > 0 and t["ckb_us"] >= 0 and t["c0_us"] >= 0 and t["split_us"] >= 0, (path.name, key)


def test_device_file_is_complete():
    d = json.loads((cal_mod.DEVICES_DIR / "h100.json").read_text())
    assert d["measured"].get("git") and d["measured"].get("shapes", 0) >= 50, "constants must come from a calibration run"
    tiles = {Plan("gemm", "cuda", c).config for c in fp8_candidates(Problem("gemm", "fp8_block", 16, 7168, 2048), H100_SXM)}
    from blockscaled.plan.cost import tile_key

    for c in tiles:
        key = tile_key(c)
        assert key == "dequant_matmul" or key in d["tiles"], key


def test_dispatch_table_in_readme_is_current(monkeypatch, regs_36):
    """The README's table is the planner's output on an H100 with the GPU image's Triton (3.6, where
    the MX / NV decode GEMV, the streaming, the register-streaming and the tiled kernel run:
    MX_GEMV_TRITON, STREAM_TRITON, DIRECT_TRITON, TILED_TRITON; 3.6's register tables and GEMV rows:
    regs_36),
    whichever Triton runs the test."""
    from pathlib import Path

    from blockscaled.plan import direct as plan_direct
    from blockscaled.plan import gemm as plan_gemm_mod
    from blockscaled.plan import mx_gemv, stream as plan_stream, tiled as plan_tiled

    monkeypatch.setattr(plan_direct, "_TRITON_OK", True)
    monkeypatch.setattr(plan_direct, "DIRECT_ENABLED", True)
    monkeypatch.setattr(mx_gemv, "_TRITON_OK", True)
    monkeypatch.setattr(plan_stream, "_TRITON_OK", True)
    monkeypatch.setattr(plan_stream, "STREAM_ENABLED", True)
    monkeypatch.setattr(plan_tiled, "_TRITON_OK", True)
    monkeypatch.setattr(plan_tiled, "TILED_ENABLED", True)
    plan_gemm_mod.plan_gemm.cache_clear()
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    begin, end = "<!-- dispatch-table:begin -->\n", "<!-- dispatch-table:end -->"
    assert begin in readme and end in readme
    current = readme.split(begin, 1)[1].split(end, 1)[0]
    table = dispatch_table()
    plan_gemm_mod.plan_gemm.cache_clear()
    assert current == table, "regenerate: python -m blockscaled.plan.table (README between the markers)"


# ------------------------------------------------------------------------------ explain, on CPU
def _operands(device="cpu", m=5, n=70, k=256, e=3):
    torch.manual_seed(0)
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    a = bs.quantize(x, "fp8_block")
    b = bs.quantize(torch.randn(n, k, dtype=torch.bfloat16, device=device), "fp8_block", block=(128, 128))
    be = bs.quantize(torch.randn(e, 64, k, dtype=torch.bfloat16, device=device), "fp8_block", block=(128, 128))
    offs = torch.tensor([0, 2, 2, m], dtype=torch.int32, device=device)
    return x, a, b, be, offs


def test_explain_every_op(path, device):
    x, a, b, be, offs = _operands(device)
    backend = "reference" if path == "reference" else ("cuda" if device == "cuda" else "interpreter")
    calls = {"gemm": ((a, b), {}), "linear": ((x, b), {}), "grouped_gemm": ((a, be), {"offsets": offs}),
             "swiglu": ((a, be, be), {"offsets": offs}), "grouped_gemm_list": (([a], [b]), {}),
             "quantize": ((x, "fp8_block"), {}), "dequantize": ((a,), {})}
    for op, (args, kw) in calls.items():
        plan = bs.explain(op, *args, **kw)
        assert isinstance(plan, Plan) and plan.backend == backend, (op, plan)
        assert str(plan) and plan.describe()
    with pytest.raises(ValueError, match="op_name"):
        bs.explain("gemmm", a, b)
    with pytest.raises(ValueError, match="K mismatch"):  # the op's own validation runs
        bs.explain("gemm", a, bs.quantize(torch.randn(8, 128, device=device), "fp8_block", block=(128, 128)))


def test_explain_is_what_runs(path, device, monkeypatch):
    if path != "kernels":
        pytest.skip("the reference path launches no kernel")
    from blockscaled.ops import gemm as gemm_mod
    from blockscaled.ops import grouped as grouped_mod

    x, a, b, be, offs = _operands(device)
    ran = []
    real_run, real_impl = gemm_mod.run_plan, grouped_mod.grouped_impl
    monkeypatch.setattr(gemm_mod, "run_plan", lambda plan, *r, **k: (ran.append(plan), real_run(plan, *r, **k))[1])
    monkeypatch.setattr(grouped_mod, "grouped_impl",
                        lambda *r, **k: (ran.append(r[16]), real_impl(*r, **k))[1])
    bs.gemm(a, b)
    assert ran[-1] == bs.explain("gemm", a, b)
    bs.grouped_gemm(a, be, offsets=offs)
    assert ran[-1] == bs.explain("grouped_gemm", a, be, offsets=offs)  # the whole plan reaches the launcher
    with observe_plans() as seen:
        bs.linear(x, b)
        bs.swiglu(a, be, be, offsets=offs)
        bs.swiglu(a, be, offsets=offs)  # be as a stacked gate_up weight: one grouped GEMM over its rows
    assert [p.op for p in seen] == ["gemm", "swiglu", "swiglu"]
    assert seen[0] == bs.explain("linear", x, b) and seen[1] == bs.explain("swiglu", a, be, be, offsets=offs)
    stacked = bs.explain("swiglu", a, be, offsets=offs)
    # the launcher gets the stacked plan, then runs its config's grouped GEMM over the 2N rows
    assert seen[2] == stacked and ran[-2:] == [stacked, stacked.config] and stacked.describe().startswith("gate_up: ")


def test_log_plans_once(path, device, monkeypatch, caplog):
    import blockscaled.plan as plan_pkg

    monkeypatch.setattr(plan_pkg, "LOG_PLANS", True)
    monkeypatch.setattr(plan_pkg, "_SEEN", set())
    _, a, b, _, _ = _operands(device)
    if path != "kernels":
        pytest.skip("the reference path makes no kernel plan to log")
    with caplog.at_level(logging.INFO, logger="blockscaled.plan"):
        bs.gemm(a, b)
        bs.gemm(a, b)
    logged = [r for r in caplog.records if r.name == "blockscaled.plan"]
    assert len(logged) == 1 and bs.explain("gemm", a, b).describe() in logged[0].getMessage()


# ------------------------------------------------------------------------------ streaming kernel
@pytest.fixture
def regs_36(monkeypatch):
    """The streaming kernel's registers per program as triton 3.6 builds it (plan/stream.py keeps
    3.8's own table; the rules below were measured with 3.6's builds) and the decode GEMV's rows on
    3.6 (plan/mx_gemv.py keeps 3.7 / 3.8's), whichever release runs."""
    from blockscaled.plan import mx_gemv, stream as plan_stream

    monkeypatch.setattr(mx_gemv, "MX_GEMV_ROWS", mx_gemv.MX_GEMV_ROWS_BY_RELEASE[(3, 6)])

    monkeypatch.setattr(plan_stream, "STREAM_REGS", plan_stream._STREAM_REGS_36[0])
    monkeypatch.setattr(plan_stream, "STREAM_REGS_BIAS", plan_stream._STREAM_REGS_36[1])


@pytest.fixture
def stream_on(monkeypatch, regs_36):
    """The streaming kernel's Triton gate open, plans uncached, 3.6's builds; the
    register-streaming kernel off (it takes fp4 weight-only 2..8 rows first: ``direct_on``), and
    the tiled kernels off (their 64-token tiles take MX / NV from 33 rows: ``test_small_tiles_*``)."""
    from blockscaled.plan import direct as plan_direct, mx_gemv, stream as plan_stream, tiled as plan_tiled

    monkeypatch.setattr(plan_direct, "DIRECT_ENABLED", False)
    monkeypatch.setattr(plan_tiled, "TILED_ENABLED", False)
    monkeypatch.setattr(plan_stream, "_TRITON_OK", True)
    monkeypatch.setattr(plan_stream, "STREAM_ENABLED", True)
    monkeypatch.setattr(mx_gemv, "_TRITON_OK", True)
    plan_gemm.cache_clear()
    yield
    plan_gemm.cache_clear()


def _wo(fmt, m, n=5760, k=2880, dev=H100_SXM, gluon_ok=True, **kw):
    kw.setdefault("a", "bfloat16")
    return plan_gemm(Problem("gemm", fmt, m, n, k, b_block_rows=1, **kw), dev, gluon_ok=gluon_ok)


def test_stream_takes_weight_only_fp4_decode(stream_on):
    """mxfp4 / nvfp4 weights x bf16 activations at the M the GEMV leaves, up to 64 rows, on sm_90:
    the streaming kernel, rows padded to the wgmma N, explained in words."""
    for fmt, ms in (("mxfp4", (3, 4, 9, 16, 17, 33, 64)), ("nvfp4", (2, 8, 32, 64)), ("mxfp8", (3, 16))):
        for m in ms:
            plan = _wo(fmt, m, n=28672, k=8192) if fmt == "mxfp8" else _wo(fmt, m)
            assert plan.kernel == "hopper_stream", (fmt, m, plan)
            assert plan.config.block_m == next(s for s in (8, 16, 32, 64) if s >= m), (fmt, m, plan)
            assert "streaming kernel" in str(plan) and f"split {plan.config.split_k}" in str(plan)
    # the decode GEMV keeps its rows (mx M <= 2, nvfp4 M = 1)
    assert _wo("mxfp4", 2).kernel == "gemv" and _wo("nvfp4", 1).kernel == "gemv" and _wo("mxfp8", 2).kernel == "gemv"
    # mxfp8: 8 KB steps, a 4-slot ring; e4m3 named in the explanation
    p8 = _wo("mxfp8", 16, n=28672, k=8192)
    assert p8.config.num_stages == 4 and "e4m3" in str(p8) and "8 KB" in str(p8)
    # explain names the split rule that decided: the per-SM cap, or rounds where the tiles exceed it
    assert "programs per SM" in str(_wo("mxfp4", 16, n=8192, k=8192))
    big = _wo("mxfp4", 16, n=57344, k=8192)
    assert big.config.split_k == 2 and "896 tiles > 528" in str(big) and "stream_rounds_split" in str(big), str(big)


@pytest.fixture
def direct_on(stream_on, monkeypatch):
    """``stream_on`` with the register-streaming kernel on too (the default planner on sm_90)."""
    from blockscaled.plan import direct as plan_direct

    monkeypatch.setattr(plan_direct, "DIRECT_ENABLED", True)
    monkeypatch.setattr(plan_direct, "_TRITON_OK", True)
    plan_gemm.cache_clear()
    yield
    plan_gemm.cache_clear()


def test_direct_takes_fp4_weight_only_2_to_8_rows(direct_on):
    """mxfp4 / nvfp4 weights x bf16 activations at 2..8 rows on sm_90: the register-streaming kernel
    (8 padded rows, its split model named in explain); 1 row stays on the GEMV, 9+ rows and W x A on
    the wgmma streaming kernel, mxfp4 at 2 rows on small weights on the GEMV; off Hopper, with fp16
    activations, K % 32 != 0 or unaligned weights it does not run, and explain says why."""
    from blockscaled.plan.direct import DIRECT_GEMV_MIN_BYTES, direct_reason, direct_split

    for fmt in ("mxfp4", "nvfp4"):
        for m in range(2, 9):
            plan = _wo(fmt, m, n=8192, k=8192)
            assert plan.kernel == "hopper_direct", (fmt, m, plan)
            assert plan.config.block_m == 8 and plan.config.split_k == direct_split(8192, 8192, fmt, 132)
            assert "register-streaming" in str(plan) and "direct_split" in str(plan), str(plan)
        assert _wo(fmt, 1, n=8192, k=8192).kernel == "gemv"
        assert _wo(fmt, 9, n=8192, k=8192).kernel == "hopper_stream"
        assert _wo(fmt, 4, n=8192, k=8192, a="quantized").kernel == "hopper_stream"
        for bad in (dict(a="float16"), dict(k=8192 + 16), dict(tma=False)):
            p = _wo(fmt, 4, **{"n": 8192, "k": 8192, **bad})
            assert p.kernel != "hopper_direct", (bad, p)
            assert direct_reason(p.problem, H100_SXM, True) is not None
        a100 = DeviceInfo("cuda", 108, (8, 0), 166912, 40 * 2**20, 2.0e12, "A100")
        assert _wo(fmt, 4, n=8192, k=8192, dev=a100).kernel != "hopper_direct"
        assert _wo(fmt, 4, n=8192, k=8192, gluon_ok=False).kernel != "hopper_direct"
    # mxfp4 at 2 rows: the GEMV below DIRECT_GEMV_MIN_BYTES of weights (explained), the kernel above
    small = _wo("mxfp4", 2, n=2880, k=2880)
    assert 2880 * 2880 // 2 < DIRECT_GEMV_MIN_BYTES and small.kernel == "gemv"
    assert "not the register-streaming kernel" not in str(small)  # the GEMV's plan explains itself
    assert "DIRECT_GEMV_MIN_BYTES" in direct_reason(small.problem, H100_SXM, True)
    assert _wo("nvfp4", 2, n=2880, k=2880).kernel == "hopper_direct"


def test_direct_takes_one_row_where_the_gemv_does_not_run(direct_on, monkeypatch):
    """A triton whose GEMV does not take fp4 (3.7 / 3.8: MX_GEMV_ROWS_BY_RELEASE), one outside MX_GEMV_TRITON,
    or the GEMV switched off:
    weight-only fp4 at 1 row, and mxfp4 at 2 rows on small weights, take the register-streaming kernel
    (DIRECT_MIN_M_WITHOUT_GEMV; measured 1.10-1.19x the streaming kernel there), explained; W x A and
    mxfp8 keep the streaming kernel (the kernel takes bf16 activations and fp4 weights)."""
    from blockscaled.plan import mx_gemv
    from blockscaled.plan.direct import direct_min_m

    assert direct_min_m("mxfp4", 8192) == 2  # the GEMV on: it keeps the single row
    monkeypatch.setattr(mx_gemv, "_GLUON_TRITON_OK", False)  # its Gluon build too (test_gluon_gemv_rule)
    monkeypatch.setattr(mx_gemv, "_TRITON_OK", False)
    plan_gemm.cache_clear()
    assert direct_min_m("mxfp4", 8192) == 1
    for fmt in ("mxfp4", "nvfp4"):
        for n, k in ((8192, 8192), (2880, 2880), (4096, 14336)):
            one = _wo(fmt, 1, n=n, k=k)
            assert one.kernel == "hopper_direct", (fmt, n, k, one)
            assert "GEMV does not take M = 1" in str(one), str(one)
        assert _wo(fmt, 1, n=8192, k=8192, a="quantized").kernel == "hopper_stream"
    assert _wo("mxfp4", 2, n=2880, k=2880).kernel == "hopper_direct"
    assert _wo("mxfp8", 1, n=8192, k=8192).kernel == "hopper_stream"
    monkeypatch.setattr(mx_gemv, "_TRITON_OK", True)
    monkeypatch.setattr(mx_gemv, "MX_GEMV_ROWS", mx_gemv.MX_GEMV_ROWS_BY_RELEASE[(3, 8)])  # 3.8: mxfp8's row only
    plan_gemm.cache_clear()
    for fmt in ("mxfp4", "nvfp4"):
        assert _wo(fmt, 1, n=8192, k=8192).kernel == "hopper_direct"
        assert _wo(fmt, 1, n=8192, k=8192, a="quantized").kernel == "hopper_stream"
    assert _wo("mxfp8", 1, n=8192, k=8192).kernel == "gemv" and _wo("mxfp8", 1, a="quantized").kernel == "gemv"
    assert _wo("mxfp8", 2, n=8192, k=8192).kernel != "gemv"
    monkeypatch.setattr(mx_gemv, "MX_GEMV_ENABLED", False)
    plan_gemm.cache_clear()
    assert _wo("nvfp4", 1, n=8192, k=8192).kernel == "hopper_direct"


def test_gluon_gemv_rule(direct_on, monkeypatch):
    """Triton 3.7 / 3.8 (MX_GEMV_GLUON_TRITON; 3.8's GEMV rows): weight-only fp4 at one row on weights up to
    MX_GEMV_GLUON_MAX_BYTES runs the Gluon GEMV (kernel "gemv_gluon", explained), larger ones the
    register-streaming kernel; its tiles keep >= MX_GEMV_GLUON_WARPS_PER_SM warps per SM with the least K
    padding (the grid's rows of gemv-gluon-20261130.json); not for 2 rows, W x A, mxfp8, K % 32 != 0, off
    Hopper, without Gluon, or on 3.6 (the Triton GEMV takes the row there)."""
    from blockscaled.plan import mx_gemv
    from blockscaled.plan.mx_gemv import MX_GEMV_GLUON_MAX_BYTES, gluon_gemv_reason

    monkeypatch.setattr(mx_gemv, "_GLUON_TRITON_OK", True)
    monkeypatch.setattr(mx_gemv, "MX_GEMV_ROWS", mx_gemv.MX_GEMV_ROWS_BY_RELEASE[(3, 8)])
    plan_gemm.cache_clear()
    from blockscaled.plan import H200_SXM as h200
    # (n, k): (block_n, warps) of the rule on 132 SMs
    tiles = {(2880, 2880): (2, 1), (7168, 2048): (4, 2), (1536, 1536): (2, 2), (5760, 2880): (4, 1),
             (4096, 4096): (4, 4), (1024, 8192): (2, 4), (2048, 5120): (2, 2), (3584, 3584): (4, 4)}
    for fmt in ("mxfp4", "nvfp4"):
        for (n, k), (bn, warps) in tiles.items():
            p = _wo(fmt, 1, n=n, k=k, dev=h200)
            assert p.kernel == "gemv_gluon" and (p.config.block_n, p.config.num_warps) == (bn, warps), (n, k, p)
            assert p.config.block_k == 1024 * warps and p.config.block_m == 1
            assert "MX_GEMV_GLUON_MAX_BYTES" in str(p) and "gluon_gemv_config" in str(p), str(p)
            # every tile keeps >= 8 warps per SM in flight, or none could (then 4 warps)
            assert -(-n // bn) * warps >= 8 * 132 or warps == 4
        big = _wo(fmt, 1, n=4608, k=7168, dev=h200)
        assert 4608 * 7168 // 2 > MX_GEMV_GLUON_MAX_BYTES and big.kernel == "hopper_direct", big
        assert "MX_GEMV_GLUON_MAX_BYTES" in gluon_gemv_reason(big.problem, h200, True)
        assert "not the Gluon decode GEMV: 15.8 MB of weights > 12 MB" in str(big), str(big)  # explained
        assert _wo(fmt, 2, n=2880, k=2880, dev=h200).kernel == "hopper_direct"
        assert _wo(fmt, 1, n=2880, k=2880, a="quantized", dev=h200).kernel == "hopper_stream"
        assert _wo(fmt, 1, n=2880, k=2880 + 16, dev=h200).kernel != "gemv_gluon"
        assert _wo(fmt, 1, n=2880, k=2880, gluon_ok=False, dev=h200).kernel != "gemv_gluon"
        a100 = DeviceInfo("cuda", 108, (8, 0), 166912, 40 * 2**20, 2.0e12, "A100")
        assert _wo(fmt, 1, n=2880, k=2880, dev=a100).kernel != "gemv_gluon"
    assert _wo("mxfp8", 1, n=2880, k=2880, dev=h200).kernel == "gemv"  # the Triton build's mxfp8 row
    monkeypatch.setattr(mx_gemv, "MX_GEMV_ROWS", mx_gemv.MX_GEMV_ROWS_BY_RELEASE[(3, 6)])  # 3.6: Triton's fp4 row
    plan_gemm.cache_clear()
    assert _wo("mxfp4", 1, n=2880, k=2880, dev=h200).kernel == "gemv"
    monkeypatch.setattr(mx_gemv, "_GLUON_TRITON_OK", False)
    monkeypatch.setattr(mx_gemv, "MX_GEMV_ROWS", mx_gemv.MX_GEMV_ROWS_BY_RELEASE[(3, 8)])
    plan_gemm.cache_clear()
    assert _wo("mxfp4", 1, n=2880, k=2880, dev=h200).kernel == "hopper_direct"


def test_direct_split_model():
    """The split model of plan/direct.py on the A/B rows it was chosen on (H200 132 SMs, the
    measured best splits): small weights split to ~4 programs per SM with >= 4 steps per split,
    large N splits no more than its resident rounds pay for (nvfp4 holds 6 programs per SM, mxfp4 8)."""
    from blockscaled.plan.direct import direct_resident, direct_split

    assert direct_resident("mxfp4") == 8 and direct_resident("nvfp4") == 6
    # the best measured splits (1..4, 6, 8 timed): 4 / 8; 5760 x 2880 and 6144 x 4096 best at 4 of
    # those, the model picks the untimed 5 between them
    measured_best = {(4096, 14336): (8,), (8192, 8192): (4,), (5760, 2880): (4, 5), (6144, 4096): (4, 5)}
    for (n, k), best in measured_best.items():
        for fmt in ("mxfp4", "nvfp4"):
            assert direct_split(n, k, fmt, 132) in best, (n, k, fmt)
    # measured: mxfp4 best 2, nvfp4 best 3 with 4 within 3 %
    assert direct_split(28672, 8192, "mxfp4", 132) == 2 and direct_split(28672, 8192, "nvfp4", 132) in (3, 4)
    assert direct_split(57344, 8192, "nvfp4", 132) > 1  # one partial round unsplit: 896 programs > 792 resident
    for n, k in ((64, 32), (130, 96), (100000, 128), (64, 65536)):
        for fmt in ("mxfp4", "nvfp4"):
            s = direct_split(n, k, fmt, 132)
            chunks = -(-k // 128)
            assert 1 <= s <= 8 and (s == 1 or -(-chunks // s) >= 4), (n, k, s)


def test_stream_mxfp8_rule(stream_on):
    """mxfp8 weights (plan/stream.py STREAM_FP8_*): up to 32 rows only from 32 MB of weights,
    above 32 rows only W x A; the grouped form planned for mxfp8 too (timed); explain says why."""
    from blockscaled.plan.stream import STREAM_FP8_MIN_BYTES, stream_reason, grouped_stream_reason
    from blockscaled.plan.grouped import plan_grouped

    big, small = (14336, 4096), (4096, 4096)  # 56 MB, 16 MB
    assert big[0] * big[1] >= STREAM_FP8_MIN_BYTES > small[0] * small[1]
    for a in ("bfloat16", "quantized"):
        for m in (16, 32):
            assert _wo("mxfp8", m, *big, a=a).kernel == "hopper_stream"
            small16 = _wo("mxfp8", m, *small, a=a)
            assert small16.kernel != "hopper_stream"
            assert "measured faster" in stream_reason(small16.problem, H100_SXM, True)
            assert "not the streaming kernel: mxfp8 weights of 16.0 MB < 32 MB" in str(small16)  # explain says why
    for n, k in (big, small):
        assert _wo("mxfp8", 64, n, k, a="quantized").kernel == "hopper_stream"
        assert _wo("mxfp8", 64, n, k).kernel != "hopper_stream"
    g = Problem("grouped", "mxfp8", 64, 5760, 2880, "bfloat16", "float32", False, 1, "contiguous", 128, 0.5)
    assert grouped_stream_reason(g, H100_SXM) is None
    assert plan_grouped(g, H100_SXM, hopper_why="not fp8_block").kernel == "hopper_stream"


def test_stream_takes_w_x_a_and_bias(stream_on):
    """Quantized activations of the weight's format and a bias (added in the dense epilogue) take
    the streaming kernel with the weight-only plan's tiles; quantized activations are decoded in
    the kernel's gather up to STREAM_GATHER_MAX_MP padded rows of fp4 and dequantized by one pass
    above it and for mxfp8 (``dequant_a``; the explanation says which); the grouped form takes
    quantized activations too, by the same rule."""
    import dataclasses

    from blockscaled.plan.grouped import plan_grouped
    from blockscaled.plan.stream import STREAM_GATHER_MAX_MP

    for fmt in ("mxfp4", "nvfp4"):
        for m in (3, 16, 64):
            wo = _wo(fmt, m)
            assert not wo.config.dequant_a
            pre = wo.config.block_m > STREAM_GATHER_MAX_MP[fmt]
            assert pre == (m == 64)
            for plan in (_wo(fmt, m, a="quantized"), _wo(fmt, m, a="quantized", bias=True)):
                assert plan.kernel == "hopper_stream" and plan.config == dataclasses.replace(
                    wo.config, dequant_a=pre, split_k=plan.config.split_k)
                assert ("dequantized exactly to bf16 by one pass first" if pre else
                        "decoded to bf16 in the kernel's gather") in str(plan), plan
            # a bias costs registers at 64 rows (stream_resident): fewer programs, so no larger a split
            wb = _wo(fmt, m, bias=True).config
            assert wb == dataclasses.replace(wo.config, split_k=wb.split_k) and wb.split_k <= wo.config.split_k
        big = (_wo(fmt, 64, 8192, 8192), _wo(fmt, 64, 8192, 8192, bias=True))  # 3 programs per SM, 2 with a bias
        assert (big[0].config.split_k, big[1].config.split_k) == (3, 2), big
        for rows, pre in ((0.5, False), (12.0, True)):  # padded to 8 / 32 rows per expert block
            g = Problem("grouped", fmt, 64, 5760, 2880, "quantized", "float32", False, 1, "contiguous", 128, rows)
            plan = plan_grouped(g, H100_SXM, hopper_why="not fp8_block")
            assert plan.kernel == "hopper_stream" and plan.config.dequant_a == pre, plan
    plan = _wo("mxfp8", 16, 57344, 8192, a="quantized")
    assert plan.kernel == "hopper_stream" and plan.config.dequant_a  # mxfp8: the pass at every M


def test_stream_not_where_it_cannot_run(stream_on):
    """fp16 activations, K % 32 != 0, M > 64, fp8_block, no TMA alignment, no Gluon, a non-Hopper
    device: another kernel (it decodes e2m1 / e4m3 with E8M0 or e4m3 block scales, into a bf16
    wgmma)."""
    from blockscaled.plan.stream import stream_reason

    a100 = DeviceInfo("cuda", 108, (8, 0), 166912, 40 * 2**20, 1.5e12, "A100")
    others = [_wo("mxfp4", 16, a="float16"), _wo("mxfp4", 16, k=2900, a="quantized"), _wo("mxfp4", 65),
              _wo("mxfp4", 65, a="quantized"), _wo("fp8_block", 16), _wo("fp8_block", 16, a="quantized"),
              _wo("nvfp4", 16, tma=False), _wo("nvfp4", 16, gluon_ok=False), _wo("mxfp4", 16, dev=a100)]
    for plan in others:
        assert plan.kernel != "hopper_stream", plan
    assert "float16" in stream_reason(Problem("gemm", "mxfp4", 16, 64, 128, a="float16"), H100_SXM, True)
    assert "sm_90" in stream_reason(Problem("gemm", "mxfp4", 16, 64, 128, a="bfloat16"), a100, True)
    assert "M = 65" in stream_reason(Problem("gemm", "mxfp4", 65, 64, 128, a="bfloat16"), H100_SXM, True)
    assert "K = 2900" in stream_reason(Problem("gemm", "mxfp4", 8, 64, 2900, a="bfloat16"), H100_SXM, True)
    assert stream_reason(Problem("gemm", "nvfp4", 8, 64, 2880, a="bfloat16"), H100_SXM, True) is None


def test_stream_switch(stream_on, monkeypatch):
    """BLOCKSCALED_MX_KERNELS without 'stream' (STREAM_ENABLED False) keeps the other kernels,
    dense and grouped, and says why."""
    from blockscaled.plan import stream as plan_stream
    from blockscaled.plan.stream import stream_reason, grouped_stream_reason
    from blockscaled.plan.grouped import plan_grouped

    monkeypatch.setattr(plan_stream, "STREAM_ENABLED", False)
    plan_gemm.cache_clear()
    assert _wo("mxfp4", 16).kernel != "hopper_stream"
    assert "switched off" in stream_reason(Problem("gemm", "mxfp4", 16, 64, 128, a="bfloat16"), H100_SXM, True)
    g = Problem("grouped", "mxfp4", 64, 5760, 2880, "bfloat16", "float32", False, 1, "contiguous", 128, 0.5)
    assert "switched off" in grouped_stream_reason(g, H100_SXM)
    assert plan_grouped(g, H100_SXM, hopper_why="weight-only").kernel != "hopper_stream"
    monkeypatch.setattr(plan_stream, "STREAM_ENABLED", True)
    assert grouped_stream_reason(g, H100_SXM) is None
    assert plan_grouped(g, H100_SXM, hopper_why="weight-only").kernel == "hopper_stream"


def test_stream_split_rule(regs_36):
    """The K split from programs per SM, the programs the SMs hold at once and 128-K steps per split
    (plan/stream.py), at rows of the H200 split A/B whose best split it picks (132 SMs): any
    integer, never past one round of resident programs at 64 rows."""
    from blockscaled.plan.stream import stream_resident, stream_split

    # ncu (mxfp4): 6 at 16, 3 at 64; the table holds the most of any planned build (nvfp4's gather: 82
    # registers, allocated as 88), so 5 at <= 16
    assert [stream_resident("mxfp4", mp) for mp in (8, 16, 32, 64)] == [5, 5, 4, 3]
    assert stream_resident("mxfp8", 16) == 5 and stream_resident("mxfp4", 64, bias=True) == 2
    cases = {(8192, 8192, 64): 3, (8192, 28672, 64): 3, (3584, 18944, 64): 7, (4096, 14336, 16): 8,
             (8192, 8192, 16): 4, (37888, 3584, 16): 1, (24576, 1536, 64): 1, (9216, 3072, 64): 2,
             (10240, 8192, 16): 3, (64, 128, 1): 1}
    for (n, k, m), want in cases.items():
        assert stream_split(n, k, m, 132) == want, (n, k, m)
    assert stream_split(28672, 4096, 16, 132, "mxfp8") == 1
    # never an empty split, never past the cap, never past the SMs' resident programs
    for n, k, m in ((64, 128, 8), (128, 4096, 16), (200000, 1 << 16, 64), (2880, 2880, 64), (100, 1 << 20, 33)):
        s = stream_split(n, k, m, 132)
        per = -(-(-(-k // 128)) // s)
        assert 1 <= s <= 8 and -(-(-(-k // 128)) // per) == s, (n, k, m, s)
        mp = next(x for x in (8, 16, 32, 64) if x >= m)
        cap = min({8: 4, 16: 4, 32: 4, 64: 3}[mp], stream_resident("mxfp4", mp)) * 132
        # past one round of resident programs only where the tiles alone exceed the cap (rounds model)
        assert s == 1 or -(-n // 64) * s <= stream_resident("mxfp4", mp) * 132 or -(-n // 64) > cap
        assert s == 1 or -(-k // 128) >= {8: 3, 16: 3, 32: 6, 64: 8}[mp] * s  # steps per split, on average
    assert stream_split(64, 13 * 128, 16, 132) == 4  # not 5: 13 steps would split 3-3-3-3-1


def test_unchecked_triton_release_warns_once(monkeypatch):
    """On an sm_90 GPU with a triton the MX / NV sm_90 kernels were not checked on (3.9 today), MX / NV
    calls plan the portable kernels: the ops say so once per process (RuntimeWarning naming the
    checked releases) instead of running silently slower; not for fp8_block, not off Hopper, not where
    the release is checked or the kernels are switched off on purpose."""
    import warnings

    from blockscaled.ops import _hopper
    from blockscaled.plan import stream as plan_stream

    monkeypatch.setattr(_hopper, "_MX_RELEASE_WARNED", [False])
    monkeypatch.setattr(plan_stream, "STREAM_ENABLED", True)
    monkeypatch.setattr(plan_stream, "_TRITON_OK", True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _hopper.warn_unchecked_mx_release("mxfp4", H100_SXM)  # a checked release: silent
    monkeypatch.setattr(plan_stream, "_TRITON_OK", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _hopper.warn_unchecked_mx_release("fp8_block", H100_SXM)  # not an MX / NV format
        _hopper.warn_unchecked_mx_release("nvfp4", CPU_INTERPRETER)  # not an sm_90 device
        monkeypatch.setattr(plan_stream, "STREAM_ENABLED", False)
        _hopper.warn_unchecked_mx_release("nvfp4", H100_SXM)  # switched off on purpose
        monkeypatch.setattr(plan_stream, "STREAM_ENABLED", True)
    with pytest.warns(RuntimeWarning, match=r"checked on triton 3\.6, 3\.7, 3\.8; .*portable"):
        _hopper.warn_unchecked_mx_release("nvfp4", H100_SXM)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _hopper.warn_unchecked_mx_release("mxfp8", H100_SXM)  # once per process


def test_stream_residency_on_triton_38(monkeypatch):
    """triton 3.8's builds of the 64-row kernel take 189-199 registers (3.6: 161-167), so on 3.8 two
    programs fit an SM, not three, and the 64-row split is sized for two: 8192 x 8192 at 64 rows splits
    2, not 3 (3 x 128 tiles would need 384 resident programs, 132 SMs hold 264)."""
    from blockscaled.plan import stream as plan_stream
    from blockscaled.plan.stream import stream_resident, stream_split

    monkeypatch.setattr(plan_stream, "STREAM_REGS", plan_stream._STREAM_REGS_38[0])
    monkeypatch.setattr(plan_stream, "STREAM_REGS_BIAS", plan_stream._STREAM_REGS_38[1])
    assert [stream_resident("mxfp4", mp) for mp in (8, 16, 32, 64)] == [5, 5, 4, 2]
    assert stream_resident("mxfp4", 64, bias=True) == 2
    assert stream_split(8192, 8192, 64, 132) == 2
    assert stream_split(8192, 8192, 16, 132) == 4  # <= 32 rows: as on 3.6
    if plan_stream._triton_release() == (3, 8):  # the running release reads its own table
        assert plan_stream.STREAM_REGS[64] == 192 and plan_stream.STREAM_REGS_BIAS[64] == 200


def test_stream_rounds_split(regs_36):
    """More tiles than the programs-per-SM cap: rounds of resident programs, a partial last round
    costing a whole program (plan/stream.py ``stream_rounds_split``; H200 split sweep: 57344 x 8192
    at 16 rows 180 us unsplit, 143 split 2; at 64 rows 330 / 292 split 3; 43008 x 5120 nvfp4
    93 / 85 split 4; 36864 x 7168 flat within 3 %: unsplit)."""
    from blockscaled.plan.stream import STREAM_PROGRAM_FIXED_STEPS, stream_rounds_split, stream_split

    assert STREAM_PROGRAM_FIXED_STEPS == 2
    assert stream_split(57344, 8192, 16, 132) == 2
    assert stream_split(57344, 8192, 64, 132) == 3
    assert stream_split(43008, 5120, 16, 132, "nvfp4") == 4
    assert stream_split(36864, 7168, 16, 132) == 1
    assert stream_split(37888, 3584, 16, 132) == 1  # 28 steps: 1.8 rounds of 16 cost more than one of 30
    # one round of slots or less: unsplit; the split limits hold (steps per split, no empty split)
    assert stream_rounds_split(600, 64, 16, 660) == 1
    assert stream_rounds_split(700, 64, 16, 660) == 4  # unsplit 2 rounds x 66; split 4: 5 x 18
    for tiles in (529, 700, 896, 1500, 5000):
        for chunks in (3, 13, 40, 64, 200):
            s = stream_rounds_split(tiles, chunks, 16, 660)
            per = -(-chunks // s)
            assert 1 <= s <= 8 and -(-chunks // per) == s and (s == 1 or chunks >= 3 * s), (tiles, chunks, s)


def test_stream_config_checked():
    GemmConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=6, split_k=4, strategy="stream")
    GemmConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=6, strategy="stream", dequant_a=True)
    for strategy, extra in (("triton", {}), ("gemv", dict(block_m=1, block_n=8, num_stages=1)), ("dequant_matmul", {})):
        with pytest.raises(ValueError, match="dequant_a"):
            GemmConfig(strategy=strategy, dequant_a=True, **extra)
    for bad in (dict(block_m=12), dict(block_n=128), dict(block_k=64), dict(num_warps=8), dict(num_stages=1),
                dict(num_stages=9), dict(split_k=0)):
        kw = dict(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=6, split_k=1, strategy="stream")
        kw.update(bad)
        with pytest.raises(ValueError, match="stream|split_k"):
            GemmConfig(**kw)


def test_tiled_plans_and_config_checks(monkeypatch):
    """plan/tiled.py on an H100 (any machine): above the streaming kernel's rows an MX / NV call with
    bf16 or quantized activations gets the tiled kernel or dequantize + cuBLAS, whichever the cost
    model predicts faster (large weights at M = 128-256: tiled; M = 8192: dequantize), its config
    valid and its reasons naming both predictions; fp16 activations say why not; a large fp4 call
    at M = 256 takes the register-operand kernel (256-token tiles, with or without a bias), mxfp8 too;
    GemmConfig rejects tiles, rings and splits the kernels cannot build."""
    from blockscaled.config.gemm import GemmConfig
    from blockscaled.plan import H100_SXM, Problem
    from blockscaled.plan import gemm as plan_gemm_mod
    from blockscaled.plan import tiled as plan_tiled

    monkeypatch.setattr(plan_tiled, "_TRITON_OK", True)
    monkeypatch.setattr(plan_tiled, "TILED_ENABLED", True)
    plan_gemm_mod.plan_gemm.cache_clear()
    try:
        for fmt in ("mxfp4", "nvfp4", "mxfp8"):
            for a in ("bfloat16", "quantized"):
                p = plan_gemm_mod.plan_gemm(Problem("gemm", fmt, 128, 28672, 8192, a, tma=True), H100_SXM)
                assert p.kernel == "hopper_tiled" and p.config.dequant_a == (a == "quantized"), str(p)
                assert "dequantize + cuBLAS" in str(p) and p.alternatives[0][0] == "dequant_matmul", str(p)
                big = plan_gemm_mod.plan_gemm(Problem("gemm", fmt, 8192, 8192, 8192, a, tma=True), H100_SXM)
                assert big.kernel == "dequant_matmul" and big.alternatives[0][0] == "hopper_tiled", str(big)
            fp16 = plan_gemm_mod.plan_gemm(Problem("gemm", fmt, 128, 28672, 8192, "float16", tma=True), H100_SXM)
            assert fp16.kernel != "hopper_tiled" and "not the tiled kernel: float16 activations" in str(fp16)
        for fmt in ("mxfp4", "nvfp4", "mxfp8"):
            for bias in (False, True):
                p = plan_gemm_mod.plan_gemm(Problem("gemm", fmt, 256, 28672, 8192, "bfloat16", bias=bias, tma=True),
                                            H100_SXM)
                assert p.kernel == "hopper_tiled" and p.config.block_m == 256, str(p)
                if p.config.block_m == 256:
                    assert p.config.num_warps == 4 and p.config.split_k == 1 and "tiled_rs.py" in str(p), str(p)
    finally:
        plan_gemm_mod.plan_gemm.cache_clear()
    base = dict(block_n=128, block_k=64, strategy="tiled")
    GemmConfig(block_m=128, num_warps=8, num_stages=6, split_k=2, **base)
    GemmConfig(block_m=256, num_warps=4, num_stages=4, split_k=1, **base)
    GemmConfig(block_m=64, num_warps=4, num_stages=6, split_k=4, **base)  # R4: 64-token tiles, a K split
    for bad in (dict(block_m=256, num_warps=4, num_stages=5), dict(block_m=48, num_warps=4, num_stages=4),
                dict(block_m=128, num_warps=8, num_stages=2), dict(block_m=256, num_warps=16, num_stages=4),
                dict(block_m=256, num_warps=4, num_stages=4, split_k=2),
                dict(block_m=128, num_warps=4, num_stages=4, split_k=2), dict(block_m=256, num_warps=4, num_stages=4,
                                                                            block_n=256),
                dict(block_m=64, num_warps=4, num_stages=6, block_n=256, split_k=2)):
        with pytest.raises(ValueError, match="GemmConfig"):
            GemmConfig(**{"split_k": 1, **base, **bad})

def test_grouped_tiled_plans(monkeypatch):
    """plan/tiled.py's grouped form on an H100 (any machine): MoE calls above the streaming kernel's
    16 rows per expert get the tiled kernel where its prediction beats dequantize + grouped cuBLAS
    (gpt-oss-120b prefill: 128 experts, whose bf16 weights alone would be 4.2 GB to write), and
    dequantize + cuBLAS where few experts hold thousands of rows each; both predictions are in the
    reasons; SwiGLU and fp8_block keep their kernels."""
    from blockscaled.plan import stream as plan_stream
    from blockscaled.plan import tiled as plan_tiled
    from blockscaled.plan.grouped import plan_grouped

    # the GPU image's triton (3.6), where all three sm_90 MX kernels are checked
    for mod, flag in ((plan_tiled, "TILED_ENABLED"), (plan_stream, "STREAM_ENABLED")):
        monkeypatch.setattr(mod, "_TRITON_OK", True)
        monkeypatch.setattr(mod, flag, True)
    why = "mx weights: not the fp8_block Hopper kernel"
    for fmt in ("mxfp4", "nvfp4", "mxfp8"):
        for a in ("bfloat16", "quantized"):
            for t in (2048, 8192):
                p = Problem("grouped", fmt, 4 * t, 5760, 2880, a=a, grouping="contiguous", experts=128,
                            rows_per_expert=4 * t / 128, tma=True)
                plan = plan_grouped(p, H100_SXM, hopper_why=why)
                assert plan.kernel == "hopper_tiled" and plan.config.dequant_a == (a == "quantized"), str(plan)
                assert "dequantize + grouped cuBLAS: predicted" in str(plan) and plan.predicted_us > 0, str(plan)
            masked = Problem("grouped", fmt, 32 * 256, 5760, 2880, a=a, grouping="masked", experts=32,
                             rows_per_expert=256.0, tma=True)
            assert plan_grouped(masked, H100_SXM, hopper_why=why).kernel == "hopper_tiled"
    # 8 experts with 16k rows each: the dequantize pass is small against the GEMM, cuBLAS's rate wins
    big = Problem("grouped", "mxfp4", 8 * 16384, 14336, 4096, a="bfloat16", grouping="contiguous", experts=8,
                  rows_per_expert=16384.0, tma=True)
    plan = plan_grouped(big, H100_SXM, hopper_why=why)
    assert plan.kernel == "grouped_dequant_matmul" and "grouped tiled kernel" in str(plan), str(plan)
    # decode sizes stay on the streaming kernel, untileable K on its kernel; SwiGLU runs each
    # projection on the tiled kernel (the split: test_swiglu_split_plans)
    small = dataclasses.replace(big, m=64, rows_per_expert=8.0, n=5760, k=2880)
    assert plan_grouped(small, H100_SXM, hopper_why=why).kernel in ("hopper_stream", "hopper_direct")
    sw = Problem("swiglu", "mxfp4", 4096, 2880, 2880, a="bfloat16", grouping="contiguous", experts=32,
                 rows_per_expert=128.0, dual=True, tma=True)
    assert plan_grouped(sw, H100_SXM, hopper_why=why).describe().startswith("gate, up: hopper_tiled")
    odd = Problem("grouped", "mxfp4", 4096, 2880, 2880 + 16, a="bfloat16", grouping="contiguous", experts=32,
                  rows_per_expert=128.0, tma=True)
    assert plan_grouped(odd, H100_SXM, hopper_why=why).kernel != "hopper_tiled"
    # config= forces it where it can run, with the plan's dequant_a; refuses with the reason elsewhere
    cfg = GemmConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=5, strategy="tiled")
    forced = plan_grouped(dataclasses.replace(big, a="quantized"), H100_SXM, cfg, hopper_why=why)
    assert forced.kernel == "hopper_tiled" and forced.config.dequant_a and "forced" in str(forced)
    with pytest.raises(ValueError, match="'tiled' cannot run this grouped call: K = 2896"):
        plan_grouped(odd, H100_SXM, cfg, hopper_why=why)
    with pytest.raises(ValueError, match="'tiled' cannot run this grouped call: not an sm_90"):
        plan_grouped(dataclasses.replace(big, interpret=True), CPU_INTERPRETER, cfg, hopper_why=why)
    with pytest.raises(ValueError, match="config.split_k"):
        plan_grouped(big, H100_SXM, dataclasses.replace(cfg, split_k=2), hopper_why=why)
    rs = GemmConfig(block_m=256, block_n=128, block_k=64, num_warps=4, num_stages=4, strategy="tiled")
    assert plan_grouped(big, H100_SXM, rs, hopper_why=why).config.block_m == 256
    assert plan_grouped(dataclasses.replace(big, fmt="mxfp8"), H100_SXM, rs, hopper_why=why).config == rs
    monkeypatch.setattr(plan_tiled, "TILED_ENABLED", False)
    p = Problem("grouped", "mxfp4", 8192, 5760, 2880, a="bfloat16", grouping="contiguous", experts=128,
                rows_per_expert=64.0, tma=True)
    assert plan_grouped(p, H100_SXM, hopper_why=why).kernel != "hopper_tiled"



def test_forced_sm90_mx_configs_fail_loudly_elsewhere():
    """A forced ``strategy="stream"`` / ``"tiled"`` config on operands those sm_90 kernels cannot take
    raises naming the strategy and what came (ops/gemm.py ``_check_sm90_mx``), never runs another
    kernel silently: CPU tensors (not an sm_90 device) and fp16 activations."""
    import torch

    import blockscaled as bs
    from blockscaled import _checks
    from blockscaled.config.gemm import GemmConfig

    if not _checks.INTERPRET:
        pytest.skip("the reference path makes no kernel plan (needs TRITON_INTERPRET=1)")
    cfgs = {"stream": GemmConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4, strategy="stream"),
            "tiled": GemmConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4, strategy="tiled")}
    w = bs.quantize(torch.randn(64, 64), "mxfp4")
    for name, cfg in cfgs.items():
        with pytest.raises(ValueError, match=f"'{name}' is an sm_90"):
            bs.gemm(torch.randn(4, 64, dtype=torch.bfloat16), w, config=cfg)
        with pytest.raises(ValueError, match=f"'{name}' takes mxfp4 / nvfp4 / mxfp8 weights with bf16"):
            bs.gemm(torch.randn(4, 64, dtype=torch.float16), w, config=cfg)


def test_grouped_fp4_weight_only_decode_takes_the_register_streaming_kernel(direct_on):
    """MoE decode with mxfp4 / nvfp4 experts and bf16 activations (<= DIRECT_GROUPED_MAX_ROWS rows per
    expert, contiguous or masked): the register-streaming kernel's grouped form, the grouped split
    in its account; quantized activations, more rows per expert and a switched-off kernel keep the
    wgmma streaming kernel."""
    from blockscaled.plan import direct as plan_direct
    from blockscaled.plan.grouped import plan_grouped

    def g(fmt, m, rows, a="bfloat16", grouping="contiguous", e=128):
        return plan_grouped(Problem("grouped", fmt, m, 5760, 2880, a, "bfloat16", False, 1, grouping, e, rows), H100_SXM,
                            hopper_why="not fp8_block")

    for fmt in ("mxfp4", "nvfp4"):
        for grouping in ("contiguous", "masked"):
            p = g(fmt, 4, 4 / 128, grouping=grouping)
            assert p.kernel == "hopper_direct" and p.config.block_m == 8, p
            assert "register-streaming" in str(p), str(p)
            if grouping == "masked":
                assert p.config.split_k == 1 and "masked: no K split" in str(p)
            else:
                assert "grouped_stream_split_why" in str(p), str(p)
        assert g(fmt, 4, 4 / 128, a="quantized").kernel == "hopper_stream"
        assert g(fmt, 1024, 8.0).kernel == "hopper_stream"  # > DIRECT_GROUPED_MAX_ROWS
    assert g("mxfp8", 4, 4 / 128).kernel == "hopper_stream"
    plan_direct.DIRECT_ENABLED = False
    try:
        assert g("mxfp4", 4, 4 / 128).kernel == "hopper_stream"
    finally:
        plan_direct.DIRECT_ENABLED = True


def test_direct_register_budget(direct_on):
    """The register-streaming plan asks ptxas for 128 registers (loads issued before the MMAs) where
    its grid needs no more than 4 programs per SM, and leaves the budget to ptxas where more
    programs must be resident; only strategy 'direct' takes a budget (a multiple of 8 in 32..255)."""
    from blockscaled.config.gemm import GemmConfig
    from blockscaled.plan.direct import DIRECT_HOIST_REGS

    small = _wo("mxfp4", 4, n=8192, k=8192)  # 128 tiles x split 4 = 512 programs <= 528
    assert small.config.maxnreg == DIRECT_HOIST_REGS and f"{DIRECT_HOIST_REGS} registers" in small.describe()
    assert f"{DIRECT_HOIST_REGS} registers per thread for ptxas" in str(small)  # explain says why
    big = _wo("mxfp4", 4, n=57344, k=8192)  # 896 programs: 8 resident per SM at ptxas' own 64 registers
    assert big.kernel == "hopper_direct" and big.config.maxnreg == 0 and "registers left to ptxas" in str(big)
    with pytest.raises(ValueError, match="maxnreg"):
        GemmConfig(8, 64, 128, 4, 1, 1, "stream", maxnreg=128)
    with pytest.raises(ValueError, match="maxnreg"):
        GemmConfig(8, 64, 128, 4, 1, 1, "direct", maxnreg=100)
    assert GemmConfig(8, 64, 128, 4, 1, 1, "direct", maxnreg=96).maxnreg == 96


def test_small_tiles_between_stream_and_prefill(stream_on, monkeypatch):
    """fp4 calls from RS_SMALL_MIN_M (33) to 64 rows on sm_90 (H100 and H200 DeviceInfo, any machine):
    the tiled planner's R4, the register-operand kernel with 64-token tiles and the K split its cost
    model predicts fastest, or R5 (four consumer warpgroups, unsplit) where that saves a round of
    programs on a wide N, weight-only and
    W x A (activations dequantized first), explained, mxfp8 as the fp4 formats; 32 rows stay on the
    streaming kernel, and with the tiled kernels switched off the streaming kernel keeps its rows."""
    from blockscaled.plan import H200_SXM
    from blockscaled.plan import tiled as plan_tiled

    monkeypatch.setattr(plan_tiled, "TILED_ENABLED", True)
    monkeypatch.setattr(plan_tiled, "_TRITON_OK", True)
    plan_gemm.cache_clear()
    for dev in (H100_SXM, H200_SXM):
        for fmt in ("mxfp4", "nvfp4", "mxfp8"):
            for m in (33, 48, 64):
                for n, k in ((8192, 8192), (4096, 14336), (28672, 4096)):
                    for a in ("bfloat16", "quantized"):
                        plan = plan_gemm(Problem("gemm", fmt, m, n, k, a=a, tma=True), dev)
                        cfg = plan.config
                        assert plan.kernel == "hopper_tiled" and cfg.is_register_operand, (fmt, m, n, k, plan)
                        assert cfg.block_m == 64 and cfg.dequant_a == (a == "quantized"), cfg
                        best = min([plan_tiled.tiled_us(plan.problem, dev, s, 4) for s in range(1, 9)]
                                   + [plan_tiled.tiled_us(plan.problem, dev, 1, 5)])
                        assert plan.predicted_us == pytest.approx(best), (plan.predicted_us, best)
                        assert cfg.block_n == 128 or cfg.split_k == 1, cfg  # R5: 256 rows, unsplit
                        assert f"64 tokens x {cfg.block_n} weight rows" in str(plan), str(plan)
                below = plan_gemm(Problem("gemm", fmt, 32, 8192, 8192, a="bfloat16", tma=True), dev).kernel
                # (mxfp8 at 32 rows: the streaming or the portable kernel, plan/stream.py decides)
                assert below == "hopper_stream" if fmt != "mxfp8" else below != "hopper_tiled", (fmt, below)
            # 224 tiles of 128 rows take two rounds, 112 of 256 rows one: R5 (four consumers), unsplit
            wide_plan = plan_gemm(Problem("gemm", fmt, 64, 28672, 4096, a="bfloat16", tma=True), dev)
            wide = wide_plan.config
            assert (wide.block_n, wide.split_k) == (256, 1), wide
            assert "(112 tiles of 64x256 x split 1" in str(wide_plan), str(wide_plan)  # the grid that runs
            # K = 14336 on 32 weight tiles: split
            assert plan_gemm(Problem("gemm", fmt, 64, 4096, 14336, a="bfloat16", tma=True), dev).config.split_k > 1
    monkeypatch.setattr(plan_tiled, "TILED_ENABLED", False)
    plan_gemm.cache_clear()
    assert plan_gemm(Problem("gemm", "mxfp4", 48, 8192, 8192, a="bfloat16", tma=True), H100_SXM).kernel == (
        "hopper_stream")
    plan_gemm.cache_clear()


def test_tiled_regimes_and_the_register_operand_margin(monkeypatch):
    """plan/tiled.py's regimes (any machine, an H200): the register-operand kernel (R3, block_m 256,
    4 warps) never split; grouped calls take it where the experts hold
    256-token tiles' worth of rows, the 128 x 128 regime where they hold ~100, and its 64-token
    tiles of 256 weight rows (R5) where they hold a few dozen; a dense call whose
    R3 prediction is within RS_DEQUANT_MARGIN of dequantize + cuBLAS compares the other regimes
    plainly instead (its reasons say so); the reasons name the kernel that runs."""
    from blockscaled.plan import H200_SXM
    from blockscaled.plan import gemm as plan_gemm_mod
    from blockscaled.plan import tiled as plan_tiled

    monkeypatch.setattr(plan_tiled, "_TRITON_OK", True)
    monkeypatch.setattr(plan_tiled, "TILED_ENABLED", True)
    for fmt in ("mxfp4", "nvfp4", "mxfp8"):
        for m, n, k in ((256, 28672, 8192), (2048, 8192, 8192), (8192, 6144, 4096), (300, 2880, 2880)):
            p = Problem("gemm", fmt, m, n, k, "bfloat16", tma=True)
            cfg, t = plan_tiled.tiled_config(p, H200_SXM)
            assert t > 0, (fmt, m, cfg)
            assert cfg.block_m == 128 or cfg.num_warps == 4 and (cfg.block_m == 64 or cfg.split_k == 1), cfg
            no_rs, t2 = plan_tiled.tiled_config(p, H200_SXM, allow_rs=False)  # without R3 (R4 stays)
            assert no_rs.block_m != 256 and t2 >= t, (no_rs, t, t2)
        # experts of a few dozen rows: 64-token tiles of 256 weight rows (R5); ~100: 128 x 128 (R1);
        # a thousand: 256-token tiles (R3)
        for rows, bm, bn in ((48, 64, 256), (100, 128, 128), (1024, 256, 128)):
            g = Problem("grouped", fmt, 32 * rows, 5760, 2880, "bfloat16", grouping="contiguous", experts=32,
                        rows_per_expert=float(rows), tma=True)
            cfg, _ = plan_tiled.grouped_tiled_config(g, H200_SXM)
            assert (cfg.block_m, cfg.block_n, cfg.split_k) == (bm, bn, 1), (fmt, rows, cfg)
            words = plan_tiled.grouped_tiles_words(g, cfg.block_m, cfg.block_n)
            assert f"of {cfg.block_m} rows x {-(-5760 // cfg.block_n)} N tiles of {cfg.block_n} rows" in words, words
    assert "tiled_rs.py" in plan_tiled.kernel_words(plan_tiled.regime_config(3, 1, True))
    assert "kernels/hopper/tiled.py" in plan_tiled.kernel_words(plan_tiled.regime_config(1, 2, False))
    # the margin: find a shape where R3 is predicted faster than dequantize + cuBLAS by less than it
    plan_gemm_mod.plan_gemm.cache_clear()
    try:
        seen = 0
        for m in (1024, 1536, 2048, 3072):
            for n, k in ((8192, 8192), (6144, 4096), (4096, 14336), (28672, 8192)):
                p = Problem("gemm", "mxfp4", m, n, k, "bfloat16", tma=True)
                cfg, t = plan_tiled.tiled_config(p, H200_SXM)
                t_dq = plan_tiled.dequant_matmul_us(p, H200_SXM)
                plan = plan_gemm_mod.plan_gemm(p, H200_SXM)
                if cfg.block_m == 256 and t < t_dq <= t * (1 + plan_tiled.RS_DEQUANT_MARGIN):
                    seen += 1
                    assert plan.config.strategy == "dequant_matmul" or plan.config.block_m == 128, str(plan)
                    assert "RS_DEQUANT_MARGIN" in str(plan), str(plan)
                elif cfg.block_m == 256 and t * (1 + plan_tiled.RS_DEQUANT_MARGIN) < t_dq:
                    assert plan.config.block_m == 256 and "tiled_rs.py" in str(plan), str(plan)
        assert seen, "no shape inside the margin: widen the grid"
    finally:
        plan_gemm_mod.plan_gemm.cache_clear()


def test_swiglu_split_plans(direct_on, monkeypatch):
    """A grouped MX / NV SwiGLU on sm_90 runs as gate and up, each the grouped GEMM (fp32 output)
    the planner picks for one projection, where that is an sm_90 MX kernel (register-streaming at
    decode, streaming, tiled at prefill), plus one activation pass; the fused SwiGLU (portable
    kernel) where it is not (fp16 activations, no TMA), for a forced config and with the switch off. The plan says so, and crosses the custom op whole."""
    import dataclasses

    from blockscaled.plan import grouped as pg, tiled as plan_tiled
    from blockscaled.plan.encoding import decode_plan, encode_plan
    from blockscaled.plan.grouped import plan_grouped

    monkeypatch.setattr(plan_tiled, "_TRITON_OK", True)
    monkeypatch.setattr(plan_tiled, "TILED_ENABLED", True)
    why = "mx weights: not the fp8_block Hopper kernel"
    seen = set()
    for fmt in ("mxfp4", "nvfp4", "mxfp8"):
        for a in ("bfloat16", "quantized"):
            for grouping, rows in (("contiguous", 0.5), ("contiguous", 12.0), ("contiguous", 600.0), ("masked", 4.0)):
                p = Problem("swiglu", fmt, int(128 * rows), 1536, 2048, a, "bfloat16", False, 1, grouping, 128, rows,
                            True, True)
                plan = plan_grouped(p, H100_SXM, hopper_why=why)
                one = plan_grouped(dataclasses.replace(p, op="grouped", dual=False, out_dtype="float32"), H100_SXM,
                                   hopper_why=why)
                assert plan.config == one.config and plan.kernel == one.kernel, (plan, one)
                assert plan.describe().startswith("gate, up: hopper_") and plan.describe().endswith("silu * mul pass")
                assert "gate and up each a grouped GEMM with fp32 output" in str(plan)
                assert decode_plan(encode_plan(plan)) == plan
                seen.add(plan.kernel)
    assert seen == {"hopper_direct", "hopper_stream", "hopper_tiled"}
    p = Problem("swiglu", "mxfp4", 64, 1536, 2048, "bfloat16", "bfloat16", False, 1, "contiguous", 128, 0.5,
                True, True)
    for other in (dataclasses.replace(p, a="float16"), dataclasses.replace(p, tma=False)):
        assert plan_grouped(other, H100_SXM, hopper_why=why).kernel == "portable_grouped", other
    forced = GemmConfig(block_m=64, block_n=64, block_k=32, num_warps=4, num_stages=4)
    assert plan_grouped(p, H100_SXM, forced, hopper_why=why).kernel == "portable_grouped"
    # a forced tiled config runs the split on it (the plan's own config passed back runs as planned)
    big = dataclasses.replace(p, m=128 * 600, rows_per_expert=600.0)
    planned = plan_grouped(big, H100_SXM, hopper_why=why)
    again = plan_grouped(big, H100_SXM, planned.config, hopper_why=why)
    assert again.config == planned.config and again.describe().startswith("gate, up: hopper_tiled"), again
    with pytest.raises(ValueError, match="'tiled' cannot run this grouped call: K = 2056"):
        plan_grouped(dataclasses.replace(big, k=2056), H100_SXM, planned.config, hopper_why=why)
    monkeypatch.setattr(pg, "SPLIT_SWIGLU", False)
    assert plan_grouped(p, H100_SXM, hopper_why=why).kernel == "portable_grouped"
