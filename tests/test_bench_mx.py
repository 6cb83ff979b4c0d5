"""Tests of the bench's MX/NV suite (``blockscaled bench --suite mx``, bench/mx.py): the cases and
their skewed routing, issue 18's targets, the runner's rows for both kinds (our ops checked
against float64 on the CPU, timings faked), the eager wall-clock timer, the suite's tables and
verdicts, and the CPU (interpreter) run end to end on a few stand-ins."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from blockscaled.bench import counting, mx, suites
from blockscaled.bench.cli import parse_args, select_cases
from blockscaled.bench.timing import Timing

HAS_CUDA = torch.cuda.is_available()


# --------------------------------------------------------------------------- cases
def test_mx_suite_cases():
    """36 dense cases (6 linears x 6 token counts) and 36 MoE cases (6 layers x 6 token counts);
    each MoE case runs only its model's format; 144 (case, format) jobs in all."""
    cs = suites.get_suite("mx")
    dense = [c for c in cs if c.kind == "mx"]
    moe = [c for c in cs if c.kind == "mx-moe"]
    assert len(dense) == 36 and len(moe) == 36 and len(set(cs)) == 72
    assert {c.m for c in dense} == set(suites.MX_M) == {1, 16, 64, 256, 2048, 8192}
    assert {(c.n, c.k) for c in dense} == {(5760, 2880), (2880, 2880), (6144, 4096), (4096, 14336), (8192, 8192),
                                           (57344, 8192)}
    assert all(c.formats == () for c in dense)
    assert {c.formats for c in moe} == {("mxfp4",), ("nvfp4",)}
    assert {c.experts for c in moe} == {128, 32}
    a = parse_args(["--suite", "mx"])
    [(name, cases)] = select_cases(a)
    fmts = suites.DEFAULT_FORMATS[name]
    assert fmts == ("mxfp8", "mxfp4", "nvfp4")
    jobs = [(c, f) for c in cases for f in fmts if not c.formats or f in c.formats]
    assert len(jobs) == 36 * 3 + 36
    assert suites.DEFAULT_OPS["mx"] == ("weight-only", "gemm", "linear", "packed", "packed-linear")
    assert suites.DEFAULT_OPS["mx-moe"] == ("weight-only", "grouped")


@pytest.mark.parametrize("tokens,experts,top_k", [(1, 128, 4), (16, 32, 4), (2048, 128, 8), (8192, 32, 4)])
def test_skewed_routing(tokens, experts, top_k):
    """Counts sum to tokens x top_k, none above tokens (top-k experts are distinct), the same on
    every call; skewed: the busiest expert holds several times the mean, and at decode sizes
    most experts have no rows."""
    ms = suites.skewed_routing(tokens, experts, top_k, seed=7)
    assert len(ms) == experts and sum(ms) == tokens * top_k and max(ms) <= tokens
    assert ms == suites.skewed_routing(tokens, experts, top_k, seed=7)
    assert ms != suites.skewed_routing(tokens, experts, top_k, seed=8) or tokens == 1
    if tokens >= 2048:
        assert max(ms) > 3 * tokens * top_k / experts
    if tokens * top_k < experts:
        assert sum(1 for m in ms if m == 0) >= experts - tokens * top_k


def test_interpreter_stand_ins():
    """A CPU run: tiny stand-ins (M 1 or 5; two MoE stand-ins per layer: decode and prefill),
    each naming what it answers for, every requested case answered."""
    cs = suites.get_suite("mx")
    ran = suites.for_interpreter(cs)
    assert len(ran) == 12 + 8
    assert all(c.m <= 12 and c.n <= 64 and c.k <= 192 for c in ran)
    assert sorted(n for c in ran for n in c.requested.split("; ")) == sorted(c.name for c in cs)
    assert all(c.formats for c in ran if c.kind == "mx-moe")


# --------------------------------------------------------------------------- targets
@pytest.mark.parametrize("fmt,op,m,floor,ratio", [
    ("mxfp4", "weight-only", 1, 85.0, 3.0), ("nvfp4", "linear", 16, 85.0, 3.0), ("mxfp8", "gemm", 1, 85.0, 1.7),
    ("mxfp8", "weight-only", 64, 70.0, None), ("mxfp4", "gemm", 256, None, 1.5), ("nvfp4", "weight-only", 256, None, 1.5),
    ("mxfp4", "weight-only", 2048, None, 1.0), ("nvfp4", "gemm", 8192, None, 1.0), ("mxfp8", "gemm", 2048, None, 1.3),
    ("mxfp4", "linear", 8192, None, 1.3), ("mxfp8", "weight-only", 8192, None, 1.0),
])
def test_targets(fmt, op, m, floor, ratio):
    t = mx.target("mx", fmt, op, m)
    assert (t.floor_pct, t.ratio, t.baseline) == (floor, ratio, "cublas-bf16")


def test_target_verdicts():
    assert mx.target("mx", "mxfp8", "gemm", 256) is None  # the issue states none for mxfp8 at M=256
    t = mx.target("mx-moe", "mxfp4", "weight-only", 4)
    assert (t.ratio, t.baseline) == (2.0, "bf16-loop")
    both = mx.target("mx", "mxfp4", "gemm", 1)
    assert both.verdict(90.0, 3.5) == "PASS" and both.verdict(80.0, 3.5) == "MISS" and both.verdict(90.0, 2.9) == "MISS"
    assert both.verdict(None, 3.5) == "-" and both.verdict(90.0, None) == "-"  # no roofline / no baseline


# --------------------------------------------------------------------------- runner (CPU, fake timings)
def _fake_runner(monkeypatch, copy_gbps=3000.0):
    from blockscaled.bench.runner import RunConfig, Runner

    cfg = RunConfig(formats=("mxfp4",), iterations=6, warmup=0, rounds=2, timing=True, baselines=(),
                    log=lambda m: None)
    runner = Runner(cfg, roofline={"copy_gbps": copy_gbps})
    calls = {"graph": 0, "eager": 0}

    def fake_time(fn, arg_sets, best_of_eager=False, iterations=None, budget_ms=None):
        fn(*arg_sets[0])
        calls["graph"] += 1
        assert runner._adaptive  # MX cases: slow calls graphed one per input copy
        return Timing(0.010, 0.010, 0.010, 0.010, 0.0, iterations, "graph", 1)

    def fake_eager(fn, arg_sets, iterations, budget_ms):
        calls["eager"] += 1
        return Timing(0.030, 0.025, 0.035, 0.020, 0.0, iterations, "eager", 1)

    monkeypatch.setattr(runner, "_time", fake_time)
    monkeypatch.setattr(runner, "_time_eager", fake_eager)
    return runner, calls


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
def test_runner_dense_rows(fmt, monkeypatch):
    """One dense case: the three modes, each checked against its own float64 reference (odd N,
    K not a multiple of 32), timed as a graph and eagerly in every round, with the bytes of the
    mode (bf16 x for weight-only / E2E, quantized x for W x A) and the plan that ran."""
    runner, calls = _fake_runner(monkeypatch)
    case = suites.Case("mx", "mx", 3, 37, 80)
    runner.run_case(case, fmt)
    rows = {r["op"]: r for r in runner.rows}
    assert list(rows) == ["weight-only", "gemm", "linear"]
    assert calls == {"graph": 6, "eager": 6}  # 3 rows x 2 rounds
    for op, r in rows.items():
        assert r["status"] == "ok" and r["check"] == "ok", (op, r)
        assert r["median_ms"] == 0.010 and r["eager_ms"] == 0.030 and r["rounds"] == 2
        # the plan that ran: portable, or the MX kernels where BLOCKSCALED_MX_KERNELS turns them on
        assert r["config"].split()[0] in ("portable", "gemv", "mx_bf16"), r["config"]
    w = counting.quantized_nbytes(fmt, (37, 80))
    assert rows["weight-only"]["bytes"] == rows["linear"]["bytes"] == 3 * 80 * 2 + w + 3 * 37 * 2
    assert rows["gemm"]["bytes"] == counting.quantized_nbytes(fmt, (3, 80)) + w + 3 * 37 * 2


def test_runner_packed_rows(monkeypatch):
    """mxfp4 from PACKED_MIN_M rows on: the two packed modes (the mixed pair on an exact fp8_block
    copy of the weight, with and without the activation quantizer) next to the three others, each
    checked against its own reference, with the copy's bytes (e4m3 + fp32 tile scales)."""
    runner, calls = _fake_runner(monkeypatch)
    case = suites.Case("mx", "mx", mx.PACKED_MIN_M, 37, 160)
    runner.run_case(case, "mxfp4")
    rows = {r["op"]: r for r in runner.rows}
    assert list(rows) == ["weight-only", "gemm", "linear", "packed", "packed-linear"]
    for op, r in rows.items():
        assert r["status"] == "ok" and r["check"] == "ok", (op, r)
    w8 = 37 * 160 + 1 * 2 * 4
    m = mx.PACKED_MIN_M
    assert rows["packed"]["bytes"] == counting.quantized_nbytes("mxfp4", (m, 160)) + w8 + m * 37 * 2
    assert rows["packed-linear"]["bytes"] == m * 160 * 2 + w8 + m * 37 * 2
    head, body = mx.table(runner.rows, "mx")
    modes = [b[head.index("mode")] for b in body]
    assert modes == ["W-only", "WxA", "E2E", "WxA-fp8", "E2E-fp8"]
    assert body[3][head.index("target")] == ">= 1.5x bf16"  # M = 256, fp4 weights
    runner.rows.clear()
    runner.run_case(case, "nvfp4")  # no copy for other formats
    assert [r["op"] for r in runner.rows] == ["weight-only", "gemm", "linear"]
    floor = rows["gemm"]["bytes"] / 3000e9 * 1e6
    assert math.isclose(rows["gemm"]["mem_floor_pct"], 100 * floor / 10.0)


def test_runner_moe_rows(monkeypatch):
    """One MoE case with empty experts: weight-only (bf16 activations) and W x A grouped rows,
    checked against the per-expert float64 reference, bytes of the experts that have rows."""
    runner, _ = _fake_runner(monkeypatch)
    ms = (2, 0, 5, 0)
    case = suites.Case("mx", "mx-moe", sum(ms), 40, 64, ms=ms, label="toy top-1 T=7", formats=("nvfp4",))
    runner.run_case(case, "nvfp4")
    rows = {r["op"]: r for r in runner.rows}
    assert list(rows) == ["weight-only", "grouped"]
    for r in rows.values():
        assert r["status"] == "ok" and r["check"] == "ok" and r["eager_ms"] == 0.030, r
    w = 2 * counting.quantized_nbytes("nvfp4", (40, 64))  # two experts have rows
    assert rows["weight-only"]["bytes"] == 7 * 64 * 2 + w + 7 * 40 * 2


def test_runner_with_baselines_on_cpu(monkeypatch):
    """The MX baselines (their CUDA requirement lifted: torch runs them on the CPU too): cuBLAS
    bf16 next to the weight-only row, the expert loop and torch._grouped_mm next to the MoE rows,
    each checked against the same float64 reference, all paired with ours in the tables."""
    from blockscaled.bench import baselines as B

    for cls in (B.CublasBf16Weight, B.ExpertLoopBf16, B.GroupedMmBf16):
        monkeypatch.setattr(cls, "check", lambda self, case, fmt: None)
    runner, _ = _fake_runner(monkeypatch)
    runner.cfg.baselines = B.BASELINE_NAMES
    runner.run_case(suites.Case("mx", "mx", 2, 40, 64, label="toy"), "mxfp4")
    ms = (3, 0, 2)
    runner.run_case(suites.Case("mx", "mx-moe", 5, 40, 64, ms=ms, label="toy top-1 T=5"), "mxfp4")
    got = [(r["kind"], r["op"], r["impl"], r["check"]) for r in runner.rows]
    assert got == [("mx", "weight-only", "blockscaled", "ok"), ("mx", "bf16", "cublas-bf16", "ok"),
                   ("mx", "gemm", "blockscaled", "ok"), ("mx", "linear", "blockscaled", "ok"),
                   ("mx-moe", "weight-only", "blockscaled", "ok"), ("mx-moe", "bf16-moe", "bf16-loop", "ok"),
                   ("mx-moe", "bf16-moe", "grouped-mm-bf16", "ok"), ("mx-moe", "grouped", "blockscaled", "ok")]
    base = [r for r in runner.rows if r["impl"] != "blockscaled"]
    assert all(r["eager_ms"] == 0.030 for r in base)
    assert base[0]["bytes"] == 2 * 64 * 2 + 40 * 64 * 2 + 2 * 40 * 2  # bf16 x, bf16 W, bf16 out
    assert base[1]["bytes"] == 5 * 64 * 2 + 2 * 40 * 64 * 2 + 5 * 40 * 2  # two experts with rows
    head, body = mx.table(runner.rows, "mx")
    assert [b[head.index("vs cublas-bf16")] for b in body] == ["1.00x"] * 3  # the fake timer: same times
    head, body = mx.table(runner.rows, "mx-moe")
    assert [b[head.index("verdict")] for b in body] == ["MISS", "MISS"]  # 1.00x < 2x the loop


def test_non_mx_cases_keep_their_timing():
    """Other suites are timed as before: no eager wall clock, no adaptive graphs."""
    from blockscaled.bench.runner import RunConfig, Runner

    runner = Runner(RunConfig(timing=False, log=lambda m: None))
    runner.run_case(suites.Case("custom", "gemm", 2, 40, 64), "mxfp4")
    assert not runner._eager and not runner._adaptive
    assert all("eager_ms" not in r for r in runner.rows)


# --------------------------------------------------------------------------- tables
def _row(case, kind, fmt, op, impl, m, ms_=None, floor=None, check="ok"):
    r = {"suite": "mx", "case": case, "kind": kind, "format": fmt, "op": op, "impl": impl, "M": m, "N": 64, "K": 64,
         "status": "ok", "check": check, "rel_err": 1e-3, "median_ms": ms_, "eager_ms": 0.05,
         "mem_floor_pct": floor, "config": "portable 16x128x32"}
    return r


def test_tables_and_verdicts():
    rows = [
        # M=1: 90% of the floor, 4x bf16 -> PASS; 90%, 2x -> MISS (mxfp4 needs 3x)
        _row("a M=1", "mx", "mxfp4", "weight-only", "blockscaled", 1, 0.010, 90.0),
        _row("a M=1", "mx", "mxfp4", "gemm", "blockscaled", 1, 0.020, 90.0),
        _row("a M=1", "mx", "mxfp4", "bf16", "cublas-bf16", 1, 0.040, 60.0),
        # M=256 mxfp8: no target; a failed check is FAIL whatever the speed
        _row("b M=256", "mx", "mxfp8", "gemm", "blockscaled", 256, 0.010),
        _row("b M=256", "mx", "mxfp8", "linear", "blockscaled", 256, 0.010, check="FAIL"),
        _row("b M=256", "mx", "mxfp8", "bf16", "cublas-bf16", 256, 0.020),
        # MoE: 2.5x the loop -> PASS; no loop row -> "-"
        _row("g T=4 E=8", "mx-moe", "mxfp4", "weight-only", "blockscaled", 16, 0.010),
        _row("g T=4 E=8", "mx-moe", "mxfp4", "bf16-moe", "bf16-loop", 16, 0.025),
        _row("g T=4 E=8", "mx-moe", "mxfp4", "bf16-moe", "grouped-mm-bf16", 16, 0.012),
        _row("h T=9 E=8", "mx-moe", "mxfp4", "weight-only", "blockscaled", 36, 0.010),
    ]
    head, body = mx.table(rows, "mx")
    v, ratio = head.index("verdict"), head.index("vs cublas-bf16")
    assert [b[v] for b in body] == ["PASS", "MISS", "-", "FAIL"]
    assert [b[ratio] for b in body] == ["4.00x", "2.00x", "2.00x", "2.00x"]
    assert body[0][head.index("eager us")] == "50.0" and body[0][head.index("graph us")] == "10.0"
    assert body[0][head.index("mode")] == "W-only" and body[1][head.index("mode")] == "WxA"
    head, body = mx.table(rows, "mx-moe")
    assert [b[head.index("verdict")] for b in body] == ["PASS", "-"]
    assert body[0][head.index("tokens")] == "4"
    assert body[0][head.index("vs grouped-mm-bf16")] == "1.20x"
    assert mx.verdict_counts(rows) == {"PASS": 2, "MISS": 1, "FAIL": 1, "-": 2}

    from rich.console import Console

    from blockscaled.bench.report import markdown_report, print_report

    res = {"env": {"gpu": "NVIDIA H100 80GB HBM3"}, "timing": True, "rows": rows, "notes": [],
           "roofline": {"copy_gbps": 3000.0}}
    con = Console(record=True, width=250)
    print_report(res, con)
    for text in (con.export_text(), markdown_report(res)):
        assert "MX suite: dense" in text and "MX suite: MoE" in text
        assert "targets: 2 PASS, 1 MISS, 1 FAIL" in text
        assert "Summary (blockscaled)" not in text  # the MX rows are not squeezed into the generic table


def test_time_eager_wall_with_fake_cuda(monkeypatch):
    """Back-to-back calls, one sync per sample, inputs rotated; inner calls chosen from the warm-up."""
    from blockscaled.bench import timing

    syncs = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: syncs.append(1))
    calls = []

    def fn(x):
        calls.append(x)
        time.sleep(0.0004)

    t = timing.time_eager_wall(fn, [(0,), (1,), (2,)], warmup=2, iterations=4, sample_ms=1.0)
    assert t.method == "eager" and t.runs == 4 and t.n_sets == 3
    inner = (len(calls) - 3) // 4
    assert 1 <= inner <= 3 and len(calls) == 3 + 4 * inner and set(calls) == {0, 1, 2}
    assert len(syncs) == 3 + 4  # before and after the first call, after the warm-up, one per sample
    assert 0.3 < t.median_ms < 20


def test_adaptive_reps(monkeypatch):
    """time_op(adaptive_reps=True): a slow call is captured once per input copy, a fast one at
    least 10 times (the default)."""
    from blockscaled.bench import timing

    seen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(timing, "_time_graph", lambda fn, sets, it, reps, first, budget: seen.append(reps) or
                        Timing(1, 1, 1, 1, first, it, "graph", len(sets)))
    timing.time_op(lambda: time.sleep(0.001), [()], warmup=1, iterations=5, adaptive_reps=True)
    timing.time_op(lambda: None, [()], warmup=1, iterations=5, adaptive_reps=True)
    timing.time_op(lambda: time.sleep(0.001), [()], warmup=1, iterations=5)
    assert seen == [1, None, None]


# --------------------------------------------------------------------------- CPU run end to end
@pytest.mark.skipif(HAS_CUDA, reason="the CPU fallback runs only without CUDA")
def test_cpu_mx_run(tmp_path, capsys):
    """`blockscaled bench --suite mx` without a GPU, cut to a few stand-ins (--limit): every row
    of ours checked against float64 (dense: three modes; MoE: weight-only and W x A), exit 0."""
    from blockscaled.bench.cli import main

    out = tmp_path / "r.json"
    assert main(["--suite", "mx", "--limit", "1", "--formats", "nvfp4", "--output", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["op"] for r in rows] == ["weight-only", "gemm", "linear"]
    assert all(r["check"] == "ok" for r in rows)
    text = " ".join(capsys.readouterr().out.split())
    assert "PASS: 3 checks passed, 0 failed, 0 errors" in text


@pytest.mark.skipif(HAS_CUDA, reason="the CPU fallback runs only without CUDA")
def test_cpu_mx_moe_stand_in():
    """One MoE stand-in through the interpreter, both ops."""
    from blockscaled.bench.runner import RunConfig, Runner

    moe = [c for c in suites.for_interpreter(suites.get_suite("mx")) if c.kind == "mx-moe"][0]
    runner = Runner(RunConfig(timing=False, log=lambda m: None))
    runner.run_case(moe, moe.formats[0])
    assert [(r["op"], r["check"]) for r in runner.rows] == [("weight-only", "ok"), ("grouped", "ok")]
