"""Tests of the `blockscaled bench` CLI: arguments, suites, FLOP/byte counting, reports, plots,
the CPU (interpreter) fallback end to end, and an AOT compile of the tl.dot_scaled baseline."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from blockscaled.bench import counting, suites
from blockscaled.bench.cli import parse_args, select_cases
from blockscaled.bench.report import ab_pairs, markdown_report, print_report, ratio_stats, write_results
from blockscaled.bench.timing import Timing, combine_rounds, quantiles, rotation_count

ROOT = Path(__file__).resolve().parents[1]
HAS_CUDA = torch.cuda.is_available()


# --------------------------------------------------------------------------- arguments
@pytest.mark.parametrize("bad", ["1,2", "a,b,c", "1,2,3,4", "-1,2,3", "4,0,8", "4,8,", ""])
def test_bad_custom_is_a_usage_error(bad, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--custom", bad])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err and "--custom" in err and "M,N,K" in err


@pytest.mark.parametrize(
    "argv",
    [["--suite", "nope"], ["--test-cases", "huge"], ["--dtype", "int8"], ["--iterations", "0"],
     ["--formats", "fp8"], ["--ops", "conv"], ["--output", "x.txt"], ["--plot", "x.pdf"], ["--baselines", "mkl"]],
)
def test_bad_options_are_usage_errors(argv):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2


def test_defaults_and_bench_prefix():
    a = parse_args(["bench"])
    assert a.dtype == "bfloat16" and a.iterations == 100 and a.rounds == 3 and not a.use_profiler
    assert [s for s, _ in select_cases(a)] == ["test-cases"]
    names = {c.suite for c in select_cases(a)[0][1]}
    assert names == {"small", "medium", "large"}
    a = parse_args(["--custom", "512,1024,2048", "--custom", "1, 7168, 2048", "--suite", "deepseek,moe", "--suite", "moe"])
    assert a.custom == [(512, 1024, 2048), (1, 7168, 2048)]
    assert a.suite == ("deepseek", "moe")
    plan = select_cases(a)
    assert [s for s, _ in plan] == ["custom", "deepseek", "moe"]  # no default test cases with --custom/--suite
    a = parse_args(["--test-cases", "all", "--baselines", "none", "--formats", "mxfp8,nvfp4"])
    assert len(select_cases(a)[0][1]) == sum(len(v) for v in suites.TEST_CASES.values())
    assert a.baselines == () and a.formats == ("mxfp8", "nvfp4")
    assert "cublas-fp8-block" in parse_args([]).baselines


# --------------------------------------------------------------------------- suites
def test_moe_suite_has_81_configs():
    cs = suites.get_suite("moe")
    assert len(cs) == 81 and len(set(cs)) == 81
    assert {c.experts for c in cs} == {1, 4, 8}
    assert {c.ms[0] for c in cs} == {64, 128, 512}
    assert {c.n for c in cs} == {c.k for c in cs} == {2048, 4096, 7168}
    assert all(c.m == sum(c.ms) and c.kind == "grouped" for c in cs)


def test_deepseek_suite():
    cs = suites.get_suite("deepseek")
    assert len(cs) == 18
    assert {(c.n, c.k) for c in cs} == {(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)}
    assert {c.m for c in cs} == {64, 128, 4096}
    assert {c.m for c in suites.get_suite("deepseek", deepseek_small_m=True)} == {1, 16, 64, 128, 4096}


def test_gpumode_and_other_suites():
    g = suites.get_suite("nvfp4-group")
    assert [(c.ms, c.n, c.k) for c in g][0] == ((80, 176, 128, 72, 64, 248, 96, 160), 4096, 7168)
    assert len(g) == 4 and all(c.kind == "grouped" for c in g)
    d = suites.get_suite("dual-gemm")
    assert [(c.m, c.n, c.k) for c in d] == [(256, 4096, 7168), (512, 4096, 7168), (256, 3072, 4096), (512, 3072, 7168)]
    q = suites.get_suite("quantize")
    assert (16384, 7168) in {(c.m, c.k) for c in q}
    m = suites.get_suite("masked")
    assert all(c.kind == "masked" and max(c.ms) <= c.m for c in m) and any(0 in c.ms for c in m)
    # tiny versions keep the kind and odd shapes but shrink
    for c in g + d + m + q:
        t = suites.tiny(c)
        assert t.kind == c.kind and t.k <= 192 and t.n <= 64 and t.m <= 12


# --------------------------------------------------------------------------- counting
def test_quantized_bytes_hand_computed():
    # fp8_block activations 4096 x 7168: 1 B/elem + fp32 per 128
    assert counting.quantized_nbytes("fp8_block", (4096, 7168)) == 4096 * 7168 + 4096 * 56 * 4
    # fp8_block weights 2112 x 7168, 128x128 blocks: ceil(2112/128)=17 x 56 fp32
    assert counting.quantized_nbytes("fp8_block", (2112, 7168), (128, 128)) == 2112 * 7168 + 17 * 56 * 4
    # mxfp4, odd K = 33: 17 packed bytes + 2 E8M0 scales per row
    assert counting.quantized_nbytes("mxfp4", (3, 33)) == 3 * (17 + 2)
    # nvfp4: half a byte per element, e4m3 per 16, + 4 B global scale
    assert counting.quantized_nbytes("nvfp4", (16384, 7168)) == 16384 * 3584 + 16384 * 448 + 4
    # quantize traffic = bf16 read + everything written (the quantizer target's 16384x7168 shape, docs/design.md 'The bar')
    c = counting.quantize_count("mxfp8", (16384, 7168), torch.bfloat16)
    assert c.bytes == 16384 * 7168 * 2 + 16384 * 7168 + 16384 * 224 and c.flops == 0
    assert math.isclose(c.gbps(0.1), c.bytes / 1e-4 / 1e9)


@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("shape,block", [((5, 77), None), ((130, 200), "weight"), ((2, 3, 40), None)])
def test_byte_counter_matches_real_tensors(fmt, shape, block):
    from blockscaled.reference.quantize import quantize

    blk = counting.weight_block(fmt) if block == "weight" else None
    q = quantize(torch.randn(*shape), fmt, block=blk)
    assert counting.quantized_nbytes(fmt, shape, blk) == q.nbytes()


def test_gemm_count_matches_design_memory_floor():
    # M=64, N=2112, K=7168 fp8_block has a 5.3 us floor at 3.0 TB/s
    c = counting.gemm_count(64, 2112, 7168, "fp8_block", "fp8_block", torch.bfloat16)
    assert c.flops == 2 * 64 * 2112 * 7168
    want = 64 * 7168 + 64 * 56 * 4 + 2112 * 7168 + 17 * 56 * 4 + 64 * 2112 * 2
    assert c.bytes == want
    assert abs(c.bytes / 3.0e12 * 1e6 - 5.3) < 0.05
    assert math.isclose(c.tflops(1.0), c.flops / 1e-3 / 1e12)


def test_grouped_and_swiglu_counts():
    c = counting.grouped_count((3, 0, 5), 256, 128, "fp8_block", torch.bfloat16)
    a = 8 * 128 + 8 * 1 * 4
    b = 3 * (256 * 128 + 2 * 1 * 4)
    assert c.bytes == a + b + 8 * 256 * 2 and c.flops == 2 * 8 * 256 * 128
    s = counting.swiglu_count(4, 64, 32, "nvfp4", torch.float16)
    assert s.flops == 4 * 4 * 64 * 32
    assert s.bytes == (4 * 16 + 4 * 2 + 4) + 2 * (64 * 16 + 64 * 2 + 4) + 4 * 64 * 2
    l = counting.linear_count(2, 8, 32, "mxfp8")
    assert l.bytes == 2 * 32 * 2 + (8 * 32 + 8) + 2 * 8 * 2


# --------------------------------------------------------------------------- timing helpers
def test_quantiles_and_rotation():
    med, p20, p80, mn = quantiles([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (med, mn) == (3.0, 1.0) and math.isclose(p20, 1.8) and math.isclose(p80, 4.2)
    assert rotation_count(10 * 2**20, l2=50 * 2**20) == 10  # 100 MB rotated > 2 x 50 MB
    assert rotation_count(10**9, l2=50 * 2**20) == 1
    assert rotation_count(1, l2=50 * 2**20) == 64  # capped


# --------------------------------------------------------------------------- reports
def _fake_result():
    rows = []
    for i, (ours, base) in enumerate([(1.0, 1.0), (1.0, 2.0), (2.0, 8.0)]):
        common = {"suite": "deepseek", "case": f"M={64 * (i + 1)} N=2112 K=7168", "kind": "gemm", "format": "fp8_block",
                  "M": 64 * (i + 1), "N": 2112, "K": 7168, "E": "", "status": "ok", "note": ""}
        c = counting.gemm_count(common["M"], 2112, 7168, "fp8_block", "fp8_block")
        for impl, ms in ((("blockscaled"), ours), ("cublas-fp8-block", base)):
            rows.append({**common, "op": "gemm", "impl": impl, "median_ms": ms, "p20_ms": ms, "p80_ms": ms,
                         "flops": c.flops, "bytes": c.bytes, "tflops": c.tflops(ms), "gbps": c.gbps(ms),
                         "roof_pct": 50.0, "mem_floor_pct": 40.0, "check": "ok", "rel_err": 1e-3})
        rows.append({**common, "op": "quantize", "impl": "blockscaled", "median_ms": 0.01, "gbps": 2600.0,
                     "mem_floor_pct": 87.0, "check": "bitwise", "flops": 0, "bytes": 100,
                     "tags": "target" if i == 0 else ""})
    return {"env": {"gpu": "NVIDIA H100 80GB HBM3", "git_rev": "abc"}, "timing": True, "notes": ["n1"], "rows": rows,
            "roofline": {"copy_gbps": 3000.0, "bf16_tflops": 700.0, "fp8_tflops": 1300.0}, "args": {"iterations": 5}}


def test_combine_rounds():
    """Rounds -> one Timing: medians over the rounds (a slow round moves none of them), the
    smallest min, all samples counted, "graph" only if every round was."""
    def t(med, p20, p80, mn, runs=10, method="graph"):
        return Timing(med, p20, p80, mn, 0.0, runs, method, 4)

    c = combine_rounds([t(1.0, 0.9, 1.1, 0.8), t(5.0, 4.0, 6.0, 3.0), t(1.2, 1.0, 1.3, 0.7)], first_call_ms=12.5)
    assert (c.median_ms, c.p20_ms, c.p80_ms, c.min_ms) == (1.2, 1.0, 1.3, 0.7)
    assert (c.first_call_ms, c.runs, c.method, c.n_sets) == (12.5, 30, "graph", 4)
    assert combine_rounds([t(2.0, 2, 2, 2), t(1.0, 1, 1, 1, method="events")], 0.0).method == "events"
    assert combine_rounds([t(2.0, 2, 2, 2), t(1.0, 1, 1, 1)], 0.0).median_ms == 1.5
    assert combine_rounds([], 0.0) is None


def test_runner_times_a_case_in_interleaved_rounds(monkeypatch):
    """_measure queues the timing; the end of the case times ours and the baselines round by
    round (ours r0, base r0, ours r1, ...), ceil(iterations / rounds) samples each (>= 5), and
    appends the rows in measurement order with the median over the rounds; a failing round
    turns that row into an error row without stopping the others."""
    from blockscaled.bench.runner import RunConfig, Runner

    cfg = RunConfig(iterations=30, warmup=1, rounds=3, timing=True, correctness=False, log=lambda m: None)
    runner = Runner(cfg)
    calls = []
    times = {"ours": iter([3.0, 1.0, 2.0]), "base": iter([6.0, 2.0, 4.0]), "bad": iter([1.0])}

    def fake_time(fn, arg_sets, best_of_eager=False, iterations=None, budget_ms=None):
        name = fn()
        calls.append((name, iterations))
        assert budget_ms == pytest.approx(2000.0 / 3)  # the time cap split over the rounds
        ms = next(times[name])  # "bad" raises StopIteration in its second round
        return Timing(ms, ms, ms, ms, 0.0, iterations, "graph", 1)

    monkeypatch.setattr(runner, "_time", fake_time)
    case = suites.Case("custom", "gemm", 128, 256, 512)
    count = counting.Count(flops=2 * 128 * 256 * 512, bytes=1000)
    for impl in ("ours", "base", "bad"):
        runner._measure(case, "fp8_block", "gemm", impl, lambda impl=impl: impl, [()], count)
    assert runner.rows == [] and len(runner._pending) == 3  # nothing timed yet
    runner._time_pending()
    # odd rounds in reverse order: a steady drift does not favour whoever is timed first
    assert calls == [("ours", 10), ("base", 10), ("bad", 10), ("bad", 10), ("base", 10), ("ours", 10),
                     ("ours", 10), ("base", 10)]
    ours, base, bad = runner.rows
    assert (ours["impl"], ours["median_ms"], ours["rounds"]) == ("ours", 2.0, 3)
    assert (base["impl"], base["median_ms"], base["runs"]) == ("base", 4.0, 30)
    assert bad["status"] == "error" and bad.get("median_ms") is None
    assert runner._pending == []


def test_runner_interrupted_rounds_keep_the_rows(monkeypatch):
    """An interrupt during the rounds (the bench's time limit) still yields every queued row:
    timed from the rounds done so far, or untimed and marked, then the interrupt propagates."""
    from blockscaled.bench.runner import RunConfig, Runner

    runner = Runner(RunConfig(iterations=30, warmup=1, rounds=3, timing=True, correctness=False,
                              log=lambda m: None))
    n = {"calls": 0}

    def fake_time(fn, arg_sets, best_of_eager=False, iterations=None, budget_ms=None):
        n["calls"] += 1
        if n["calls"] == 2:
            raise KeyboardInterrupt
        return Timing(1.0, 1.0, 1.0, 1.0, 0.0, iterations, "graph", 1)

    monkeypatch.setattr(runner, "_time", fake_time)
    case = suites.Case("custom", "gemm", 128, 256, 512)
    count = counting.Count(flops=1, bytes=1)
    for impl in ("ours", "base"):
        runner._measure(case, "fp8_block", "gemm", impl, lambda: None, [()], count)
    with pytest.raises(KeyboardInterrupt):
        runner._time_pending()
    ours, base = runner.rows
    assert ours["median_ms"] == 1.0 and ours["rounds"] == 1
    assert base.get("median_ms") is None and "interrupted" in base["note"]


def test_runner_deferred_timing_calls_the_right_op(monkeypatch):
    """The timing of a case runs after all its ops were set up: each timed function must still
    call its own op (a lambda reading a rebound local would time the last op with the first
    op's arguments: the first H100 run of --rounds errored on every quantize / gemm row so).
    CPU: the ops run on the reference twin; the fake timer calls each function once."""
    from blockscaled.bench.runner import RunConfig, Runner

    cfg = RunConfig(formats=("fp8_block",), iterations=5, warmup=0, rounds=2, timing=True, baselines=(),
                    log=lambda m: None)
    runner = Runner(cfg)

    def fake_time(fn, arg_sets, best_of_eager=False, iterations=None, budget_ms=None):
        fn(*arg_sets[0])
        return Timing(1.0, 1.0, 1.0, 1.0, 0.0, iterations, "events", 1)

    monkeypatch.setattr(runner, "_time", fake_time)
    runner.run_case(suites.Case("custom", "gemm", 16, 256, 512), "fp8_block")
    rows = {r["op"]: r for r in runner.rows}
    assert set(rows) == {"quantize", "gemm", "linear"}, [(r["op"], r["status"], r["note"]) for r in runner.rows]
    for op, r in rows.items():
        assert r["status"] == "ok" and r["median_ms"] == 1.0 and r["rounds"] == 2, (op, r["note"])


def test_ratio_stats_and_ab_pairs():
    st = ratio_stats([1.0, 2.0, 4.0, float("nan"), None])
    assert st["n"] == 3 and st["min"] == 1.0 and st["max"] == 4.0 and st["median"] == 2.0
    assert math.isclose(st["geomean"], 2.0)
    pairs = ab_pairs(_fake_result()["rows"])
    assert list(pairs) == ["cublas-fp8-block"]
    assert [p["ratio"] for p in pairs["cublas-fp8-block"]] == [1.0, 2.0, 4.0]


def test_report_text_and_files(tmp_path):
    from rich.console import Console

    res = _fake_result()
    con = Console(record=True, width=200)
    print_report(res, con)
    text = con.export_text()
    assert "A/B vs cublas-fp8-block" in text and "geomean=2.00x" in text and "min=1.00x" in text and "max=4.00x" in text
    assert "Summary" in text and "Quantize" in text and "copy 3000 GB/s" in text
    assert "The bar" in text
    from blockscaled.bench.report import bar_checks

    bar = {b[0]: b for b in bar_checks(res["rows"])}
    small = bar["fp8_block GEMM, M<=128: % of memory floor (worst of 2)"]
    assert small[1] == "40%" and small[3] == "MISS"
    q = [b for k, b in bar.items() if k.startswith("quantize")]
    assert len(q) == 1 and q[0][3] == "PASS"
    md = markdown_report(res)
    assert "| case |" in md and "geomean=2.00x" in md and "## Notes" in md
    for ext in ("json", "csv", "md"):
        write_results(res, str(tmp_path / f"r.{ext}"))
    data = json.loads((tmp_path / "r.json").read_text())
    assert len(data["rows"]) == 9 and data["roofline"]["copy_gbps"] == 3000.0
    assert (tmp_path / "r.csv").read_text().splitlines()[0].startswith("suite,case")


def test_save_results_appends_runs_and_rewrites_latest(tmp_path):
    """--save-results: each save appends one line to <gpu>/runs.jsonl (earlier lines kept) and
    rewrites latest/<suite>.md with the newest run; load_runs reads the lines back in order."""
    from blockscaled.bench.report import load_runs, save_results_dir

    first, second, other = _fake_result(), _fake_result(), _fake_result()
    first["date"], second["date"], other["date"] = ("2026-11-22T12:00:00+00:00", "2026-11-23T05:12:07+00:00",
                                                    "2026-11-23T06:00:00+00:00")
    second["env"]["git_rev"] = "def"
    second["rows"][0]["median_ms"] = float("nan")  # strict JSON: written as null
    md1, runs1 = save_results_dir(first, str(tmp_path), "deepseek")
    md2, runs2 = save_results_dir(second, str(tmp_path), "deepseek")
    save_results_dir(other, str(tmp_path), "moe")
    gpu_dir = tmp_path / "h100-80gb-hbm3"
    assert md1 == md2 == str(gpu_dir / "latest" / "deepseek.md")
    assert runs1 == runs2 == str(gpu_dir / "runs.jsonl")
    lines = (gpu_dir / "runs.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["rows"] for line in lines)
    runs = load_runs(gpu_dir, suite="deepseek")
    assert [r["id"] for r in runs] == ["deepseek-20261122-1200", "deepseek-20261123-0512"]
    assert [r["env"]["git_rev"] for r in runs] == ["abc", "def"] and runs[1]["rows"][0]["median_ms"] is None
    assert len(runs[1]["rows"]) == len(second["rows"]) and runs[1]["notes"] == ["n1"]
    assert [r["suite"] for r in load_runs(gpu_dir / "runs.jsonl")] == ["deepseek", "deepseek", "moe"]
    latest = (gpu_dir / "latest" / "deepseek.md").read_text()
    assert "Run: `deepseek-20261123-0512`" in latest and "git def" in latest and "2026-11-22" not in latest
    assert sorted(p.name for p in (gpu_dir / "latest").iterdir()) == ["deepseek.md", "moe.md"]
    assert not list(gpu_dir.glob("*.png")) and not list(gpu_dir.glob("*.json"))
    # a committed folder with a short name keeps receiving its GPU's runs
    gpu_dir.rename(tmp_path / "h100")
    _, runs3 = save_results_dir(other, str(tmp_path), "moe")
    assert runs3 == str(tmp_path / "h100" / "runs.jsonl") and len(load_runs(tmp_path / "h100")) == 4
    # the same suite saved twice within one minute (a suite run in parts): distinct ids
    assert [r["id"] for r in load_runs(tmp_path / "h100", suite="moe")] == ["moe-20261123-0600", "moe-20261123-0600-2"]
    assert not gpu_dir.exists()


def test_committed_results_load():
    """The committed record parses, in date order, and each suite's latest/ report is its newest run."""
    from blockscaled.bench.report import load_runs

    d = ROOT / "benchmarks" / "results" / "h100"
    runs = load_runs(d)
    assert runs and [r["date"] for r in runs] == sorted(r["date"] for r in runs)
    assert len({r["id"] for r in runs}) == len(runs)
    for md in (d / "latest").glob("*.md"):
        newest = load_runs(d, suite=md.stem)[-1]
        assert f"Run: `{newest['id']}`" in md.read_text()


def test_plot_writes_png(tmp_path):
    """A timed result gives a PNG; a result with nothing to draw (no timed row, no A/B pair:
    every CPU run) gives None and no file, never an empty chart."""
    from blockscaled.bench.plot import has_plot_data, plot_results

    p = tmp_path / "a.png"
    assert has_plot_data(_fake_result()) and plot_results(_fake_result(), str(p)) == str(p)
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    untimed = _fake_result()
    for r in untimed["rows"]:  # what a CPU run records: checks, no times
        for k in ("median_ms", "p20_ms", "p80_ms", "tflops", "gbps"):
            r.pop(k, None)
    for res in ({"rows": [], "env": {}}, untimed):
        assert not has_plot_data(res)
        assert plot_results(res, str(tmp_path / "b.png")) is None
    assert not (tmp_path / "b.png").exists()


# --------------------------------------------------------------------------- CPU (interpreter) runs
GPU_ENV_KEYS = ("gpu", "sm", "num_sms", "l2_mb", "driver", "cuda")


def test_interpreter_stand_ins_name_what_was_requested():
    """Every case a CPU run executes names the requested case it stands in for; cases already
    small run unchanged; stand-ins of one shape are merged, keeping every requested name."""
    big, small = suites.Case("custom", "gemm", 256, 512, 1024), suites.Case("custom", "gemm", 3, 40, 100)
    got = suites.for_interpreter([big, small])
    assert [c.requested for c in got] == [big.name, small.name]
    assert got[0].name == suites.tiny(big).name != big.name and (got[0].m, got[0].k) == (5, 96 + 1024 % 97)
    assert got[1] == small and got[1].name == small.name
    assert suites.for_interpreter([big], full=True)[0].name == big.name  # --full-shapes
    twin = suites.Case("custom", "gemm", 512, 512, 1024)  # same stand-in as `big`
    merged = suites.for_interpreter([big, twin])
    assert len(merged) == 1 and merged[0].requested == f"{big.name}; {twin.name}"
    # a stand-in is equal to the bare case of its shape (requested is not part of equality)
    assert merged[0] == suites.tiny(big)


@pytest.mark.skipif(HAS_CUDA, reason="a CPU-only fact")
def test_environment_has_no_gpu_facts_on_cpu():
    from blockscaled.bench.env import environment, gpu_slug

    env = environment()
    assert env["device"] == "cpu" and env["cpu"]
    assert not [k for k in GPU_ENV_KEYS if k in env], env  # no L2 size, CUDA version, GPU name
    assert gpu_slug() == "cpu" and gpu_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"


def test_cpu_report_header():
    """An untimed (CPU) result's header says so and names no GPU, L2 or CUDA version; the
    correctness table shows requested -> ran."""
    from rich.console import Console

    rows = [{"suite": "custom", "case": "M=5 N=49 K=150", "requested": "M=256 N=512 K=1024", "kind": "gemm",
             "op": "gemm", "impl": "blockscaled", "format": "fp8_block", "M": 5, "N": 49, "K": 150,
             "status": "ok", "note": "", "check": "ok", "rel_err": 1e-3}]
    res = {"env": {"device": "cpu", "cpu": "x86_64, 2 cores", "torch": "t", "triton": "3.6.0", "git_rev": "g"},
           "timing": False, "rows": rows, "notes": [], "args": {"iterations": 100, "rounds": 3},
           "shapes": [{"suite": "custom", "requested": "M=256 N=512 K=1024", "ran": "M=5 N=49 K=150", "scaled": True}],
           "shapes_reason": "the interpreter is slow"}
    con = Console(record=True, width=200)
    print_report(res, con)
    for text in (con.export_text(), markdown_report(res)):
        assert "CPU run through the Triton interpreter" in text and "no timings" in text
        assert "1 of 1 cases ran scaled down" in text and "the interpreter is slow" in text
        assert "M=256 N=512 K=1024" in text and "M=5 N=49 K=150" in text
        for bad in ("GPU:", "L2 ", "CUDA-graph", "driver", "sm "):
            assert bad not in text, bad


def _run_cli(args, tmp_path, env_extra=None, timeout=240):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the CLI must set it itself
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "blockscaled.bench", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """One CPU bench run as a user would start it (a new process, TRITON_INTERPRET unset,
    every warning shown): a shape too big for the interpreter, one that runs as asked, the
    quantize and dual-GEMM (SwiGLU) suites, profiler, plot and saved results asked for. ~8 s on 2 cores."""
    if HAS_CUDA:
        pytest.skip("the CPU fallback runs only without CUDA")
    d = tmp_path_factory.mktemp("cpu_bench")
    args = ["bench", "--custom", "256,512,1024", "--custom", "3,40,100", "--suite", "quantize,dual-gemm",
            "--formats", "fp8_block,nvfp4", "--use-profiler", "--trace-file", "t.json", "--plot", "p.png",
            "--output", "r.json", "--save-results", "res"]
    r = _run_cli(args, d, env_extra={"PYTHONWARNINGS": "default"})
    data = json.loads((d / "r.json").read_text()) if (d / "r.json").exists() else None
    return r, d, data


def test_cpu_run_passes_and_says_so(cpu_run):
    r, d, data = cpu_run
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = " ".join(r.stdout.split())  # rich wraps long lines
    assert "no CUDA GPU found - CPU run through the Triton interpreter" in out and "no timings" in out
    jobs = 2 * len(data["shapes"])  # two formats per case that ran
    assert re.search(rf"PASS: \d+ checks passed, 0 failed, 0 errors over {jobs} of {jobs} \(case, format\) jobs",
                     out), out[-500:]
    assert data["timing"] is False and data["env"]["triton_interpret"] == "1"
    assert "CPU run through the Triton interpreter" in data["mode"] and "no timings" in data["mode"]
    ours = [x for x in data["rows"] if x["impl"] == "blockscaled"]
    assert {x["op"] for x in ours} == {"quantize", "gemm", "linear", "swiglu"}
    assert all(x["status"] == "ok" and x["check"] in ("ok", "bitwise") for x in ours), ours
    q = {x["format"] for x in ours if x["op"] == "quantize"}
    assert q == {"fp8_block", "nvfp4", "nvfp4 static-gs"}
    assert all(x["check"] == "bitwise" for x in ours if x["op"] == "quantize")  # Triton == reference
    # no timing numbers at all: interpreter wall clock says nothing about a GPU
    timed = [k for x in data["rows"] for k in ("median_ms", "first_call_ms", "tflops", "gbps") if k in x]
    assert not timed


def test_cpu_run_saves_one_run_and_its_summary(cpu_run):
    """--save-results on a CPU run: one line in res/cpu/runs.jsonl (the same result as --output),
    the summary in latest/, no plot among the saved results."""
    from blockscaled.bench.report import load_runs

    r, d, data = cpu_run
    runs = load_runs(d / "res" / "cpu")
    label = "custom+quantize+dual-gemm"
    assert len(runs) == 1 and runs[0]["suite"] == label and runs[0]["id"].startswith(label + "-")
    assert runs[0]["rows"] == data["rows"] and runs[0]["command"] == data["command"]
    assert "Correctness" in (d / "res" / "cpu" / "latest" / f"{label}.md").read_text()
    assert sorted(p.name for p in (d / "res" / "cpu").rglob("*")) == sorted(["latest", f"{label}.md", "runs.jsonl"])


def test_cpu_run_records_requested_and_ran_shapes(cpu_run):
    """Observation 9: --custom 256,512,1024 ran M=5 N=49 K=150 without a word."""
    r, d, data = cpu_run
    big, small = suites.Case("custom", "gemm", 256, 512, 1024), suites.Case("custom", "gemm", 3, 40, 100)
    ran = suites.tiny(big).name
    out = " ".join(r.stdout.split())
    assert f"requested {big.name} -> ran {ran}" in out
    assert f"requested {small.name} (ran as requested)" in out
    assert "because the Triton interpreter" in out and "--full-shapes" in out
    shapes = {(x["suite"], x["requested"]): x for x in data["shapes"]}
    assert shapes[("custom", big.name)] == {"suite": "custom", "requested": big.name, "ran": ran, "scaled": True}
    assert shapes[("custom", small.name)]["scaled"] is False
    # every requested case is accounted for (stand-ins of one shape answer for several)
    asked = [c.name for c in [big, small] + suites.get_suite("quantize") + suites.get_suite("dual-gemm")]
    answered = [n for x in data["shapes"] for n in x["requested"].split("; ")]
    assert sorted(answered) == sorted(asked)
    assert "interpreter" in data["shapes_reason"]
    rows = [x for x in data["rows"] if x["suite"] == "custom"]
    assert {x["requested"] for x in rows if x["case"] == ran} == {big.name}
    assert {x["requested"] for x in rows if x["case"] == small.name} == {small.name}
    assert all(x["requested"] and x["case"] for x in data["rows"])


def test_cpu_run_has_no_gpu_facts_no_plot_no_profiler_noise(cpu_run):
    r, d, data = cpu_run
    assert not [k for k in GPU_ENV_KEYS if k in data["env"]], data["env"]
    assert not [k for x in data["rows"] for k in GPU_ENV_KEYS if k in x]
    out = " ".join(r.stdout.split())
    assert not re.search(r"GPU: |L2 \d|CUDA:? \d|driver ", out), out[:2000]
    assert "plot: skipped, nothing to draw" in out and not (d / "p.png").exists()
    assert "--use-profiler: skipped" in out and not (d / "t.json").exists()
    # stderr: no kineto lines, no warnings (known interpreter noise is filtered, ours would show)
    assert not re.search(r"ERROR|USDT|kineto|Warning", r.stderr), r.stderr[-3000:]


def _record_jobs(monkeypatch):
    from blockscaled.bench import runner as R

    jobs = []
    monkeypatch.setattr(R.Runner, "run_case", lambda self, case, fmt: jobs.append((case, fmt)))
    return jobs


@pytest.mark.skipif(HAS_CUDA, reason="the CPU fallback runs only without CUDA")
def test_default_cpu_bench_stays_small(monkeypatch, capsys):
    """`blockscaled bench` (the README's command) on a CPU machine: every default case runs as
    a small stand-in (measured ~13 s of CPU for the whole default run on 2 cores), exit 0."""
    from blockscaled.bench.cli import main

    jobs = _record_jobs(monkeypatch)
    assert main(["bench"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert len(jobs) == 9 * 4, len(jobs)  # small, medium, large x 4 formats
    assert all(c.kind == "gemm" and c.m <= 5 and c.n <= 64 and c.k <= 192 for c, _ in jobs)
    assert out.count("-> ran M=") == 9 and "M=8192 N=8192 K=8192 -> ran" in out
    assert "PASS: 0 checks passed, 0 failed, 0 errors over 36 of 36" in out
    jobs.clear()  # --full-shapes: as requested, and said so
    assert main(["--custom", "256,512,1024", "--formats", "nvfp4", "--full-shapes"]) == 0
    assert [(c.m, c.n, c.k, f) for c, f in jobs] == [(256, 512, 1024, "nvfp4")]
    assert "requested M=256 N=512 K=1024 (ran as requested)" in capsys.readouterr().out


@pytest.mark.skipif(HAS_CUDA, reason="the CPU fallback runs only without CUDA")
def test_cpu_bench_fails_on_a_failed_check(monkeypatch, capsys, tmp_path):
    """Exit 1 when a correctness check fails or one of our ops raises (not only with --strict)."""
    from blockscaled.bench import runner as R
    from blockscaled.bench.cli import main

    argv = ["--custom", "3,40,100", "--formats", "fp8_block", "--ops", "gemm", "--output", str(tmp_path / "r.json")]
    assert main(argv) == 0
    assert "PASS: 1 checks passed" in capsys.readouterr().out
    monkeypatch.setattr(R, "tolerance", lambda fmt, dt: (0.0, 0.0))  # nothing passes a zero limit
    assert main(argv) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "FAIL: 0 checks passed, 1 failed, 0 errors" in out
    assert json.loads((tmp_path / "r.json").read_text())["rows"][0]["check"] == "FAIL"
    monkeypatch.undo()

    import blockscaled.ops.gemm as G

    def broken(*a, **k):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(G, "gemm", broken)
    assert main(argv) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "FAIL: 0 checks passed, 0 failed, 1 errors" in out and "kernel exploded" in out


@pytest.mark.skipif(HAS_CUDA, reason="the CPU fallback runs only without CUDA")
def test_cpu_bench_without_numpy_says_what_to_install(monkeypatch, capsys):
    """Observation 1 (bench side): the interpreter imports numpy only when a kernel runs; the
    CLI checks first and says what to install instead of a ModuleNotFoundError from Triton."""
    from blockscaled.bench.cli import main

    jobs = _record_jobs(monkeypatch)
    monkeypatch.setitem(sys.modules, "numpy", None)  # `import numpy` now raises ImportError
    assert main(["--custom", "3,40,100"]) == 1
    err = capsys.readouterr().err
    assert "Triton interpreter, which needs numpy" in err and "pip install 'numpy" in err
    assert jobs == []  # nothing ran


# --------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_bench_small_run(tmp_path):
    r = _run_cli(["--custom", "256,512,1024", "--formats", "fp8_block,mxfp8", "--iterations", "5", "--warmup", "1",
                  "--no-roofline", "--output", "g.json", "--use-profiler", "--trace-file", "t.json", "--plot", "g.png"],
                 tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((tmp_path / "g.json").read_text())
    timed = [x for x in data["rows"] if x.get("median_ms")]
    assert timed and all(x["median_ms"] > 0 for x in timed)
    assert all(x["rounds"] == 3 for x in timed)  # the default: interleaved rounds
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    # the GPU facts are recorded; a GPU run names no requested/stand-in shapes
    assert all(data["env"].get(k) not in (None, "") for k in GPU_ENV_KEYS), data["env"]
    assert data["env"]["device"] == "cuda" and "shapes" not in data and "mode" not in data
    assert not [x for x in data["rows"] if "requested" in x]
    assert "PASS:" in r.stdout and (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"


# --------------------------------------------------------------------------- AOT compile of the baseline kernel
_AOT = r"""
import sys, triton
from triton.backends.compiler import GPUTarget
from blockscaled.bench.triton_baseline import _mx_dot_scaled_kernel as k
fmt = sys.argv[1]
sig = {"a_ptr": "*u8", "as_ptr": "*u8", "b_ptr": "*u8", "bs_ptr": "*u8", "c_ptr": "*bf16",
       "M": "i32", "N": "i32", "K": "i32", "stride_am": "i32", "stride_asm": "i32", "stride_bn": "i32",
       "stride_bsn": "i32", "stride_cm": "i32", "FMT": "constexpr", "BLOCK_M": "constexpr",
       "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
src = triton.compiler.ASTSource(fn=k, signature=sig, constexprs={"FMT": fmt, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128})
c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3})
print("WGMMA" if "wgmma.mma_async" in c.asm["ptx"] else "NO-WGMMA")
"""


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
def test_dot_scaled_baseline_compiles_for_hopper(fmt):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT / "src")
    r = subprocess.run([sys.executable, "-c", _AOT, fmt], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "WGMMA" in r.stdout  # emulated via bf16 wgmma on sm_90


def test_time_op_events_path_with_fake_cuda(monkeypatch):
    """The eager / CUDA-events path of the timing helper, with a fake CUDA clock (CPU only)."""
    import time

    from blockscaled.bench import timing

    class FakeEvent:
        def __init__(self, enable_timing=True):
            self.t = None

        def record(self, stream=None):
            self.t = time.perf_counter()

        def elapsed_time(self, other):
            return (other.t - self.t) * 1e3

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    calls = []

    def fn(x):
        calls.append(x)
        time.sleep(0.002)

    t = timing.time_op(fn, [(0,), (1,), (2,)], warmup=2, iterations=7, use_graph=False)
    assert t.method == "events" and t.runs == 7 and t.n_sets == 3
    assert len(calls) == 1 + 2 + 7 and set(calls) == {0, 1, 2}  # inputs rotated
    assert 1.5 < t.median_ms < 50 and t.p20_ms <= t.median_ms <= t.p80_ms and t.first_call_ms > 1.5
    # the time budget caps slow functions at >= 5 samples
    t = timing.time_op(fn, [(0,)], warmup=1, iterations=1000, use_graph=False, budget_ms=20)
    assert 5 <= t.runs < 1000


def test_families_suite_and_issue19_checks():
    """The ``families`` suite is the broad dense set (every FAMILY_PAIRS shape at every M band,
    fp8_block), and the bar reports issue 19's targets per M band from its rows only: the geomean and
    the worst row against DeepGEMM, the geomean against cuBLAS fp8_block at M >= 2048."""
    from blockscaled.bench.models import FAMILY_PAIRS
    from blockscaled.bench.report import bar_checks
    from blockscaled.bench.suites import DEFAULT_FORMATS, FAMILIES_M, get_suite

    from blockscaled.bench.models import MODEL_LINEARS

    cases = get_suite("families")
    shapes = {(n, k) for f, layer, n, k in MODEL_LINEARS if (f, layer) in FAMILY_PAIRS}
    assert len(cases) == len(shapes) * len(FAMILIES_M) and DEFAULT_FORMATS["families"] == ("fp8_block",)
    assert {c.m for c in cases} == set(FAMILIES_M) and {(c.n, c.k) for c in cases} == shapes
    assert any(c.label == "llama3-70b gate_up" and (c.n, c.k) == (57344, 8192) for c in cases)

    def row(case, m, impl, ms, suite="families"):
        return {"suite": suite, "kind": "gemm", "case": case, "format": "fp8_block", "op": "gemm", "impl": impl,
                "status": "ok", "median_ms": ms, "M": m, "N": 64, "K": 128}

    rows = []
    # M = 32: ratios 1.2 and 0.85 (geomean 1.01, worst 0.85 -> MISS); M = 2048: 1.1 / 1.3 vs DeepGEMM and
    # 1.2 / 1.2 vs cuBLAS (PASS both); a deepseek-suite row must not count
    for case, m, ours, dg, cub in (("a", 32, 1.0, 1.2, None), ("b", 32, 1.0, 0.85, None), ("c", 2048, 1.0, 1.1, 1.2),
                                   ("d", 2048, 1.0, 1.3, 1.2)):
        rows += [row(case, m, "blockscaled", ours), row(case, m, "deepgemm", dg)]
        if cub:
            rows.append(row(case, m, "cublas-fp8-block", cub))
    rows += [row("z", 32, "blockscaled", 1.0, "deepseek"), row("z", 32, "deepgemm", 0.1, "deepseek")]
    bar = {b[0]: b for b in bar_checks(rows)}
    m32 = bar["families fp8_block GEMM M=32 vs deepgemm (geomean; worst of 2)"]
    assert m32[1] == "1.01x; 0.85x" and m32[3] == "MISS"
    m2k = bar["families fp8_block GEMM M=2048 vs deepgemm (geomean; worst of 2)"]
    assert m2k[1] == "1.20x; 1.10x" and m2k[3] == "PASS"
    cub = bar["families fp8_block GEMM M=2048 vs cublas-fp8-block (geomean; worst of 2)"]
    assert cub[1] == "1.20x; 1.20x" and cub[3] == "PASS"
    assert not any("M=32 vs cublas" in k for k in bar)


def test_skip_and_limit_select_a_part_of_each_suite():
    """--skip N --limit L runs cases N .. N + L - 1 of each suite (a long suite in parts)."""
    from blockscaled.bench.cli import parse_args, select_cases
    from blockscaled.bench.suites import get_suite

    full = get_suite("families")
    (_, part), = select_cases(parse_args(["--suite", "families", "--skip", "5", "--limit", "3"]))
    assert part == full[5:8]
    (_, rest), = select_cases(parse_args(["--suite", "families", "--skip", "100"]))
    assert rest == full[100:]


def test_cublas_block_baseline_refuses_what_cublas_gets_wrong():
    """cuBLAS' block-scaled fp8 GEMM is a baseline only where it computes the right answer (H200: K / 128
    not a multiple of 4 gives wrong outputs silently) and runs at all (M % 4 == 0)."""
    from blockscaled.bench.baselines import _cublas_block_unavailable

    assert _cublas_block_unavailable(128, 8192) is None and _cublas_block_unavailable(None, 7168) is None
    assert "K % 128" in _cublas_block_unavailable(128, 2880)
    assert "wrong outputs" in _cublas_block_unavailable(128, 8960)  # 70 K blocks
    assert "wrong outputs" in _cublas_block_unavailable(32, 1408)  # 11
    assert "M % 4" in _cublas_block_unavailable(1, 4096)


def test_deepgemm_prewarm_shapes_and_no_op_without_deepgemm(monkeypatch):
    """The DeepGEMM JIT warm-up takes the distinct dense fp8_block shapes DeepGEMM will run (K % 128 == 0),
    splits them over the processes, and starts none where deep_gemm cannot be imported or there is one
    shape."""
    import io
    import subprocess
    import types

    from blockscaled.bench import baselines
    from blockscaled.bench.suites import Case

    cases = [Case("x", "gemm", 4, 256, 1024), Case("x", "gemm", 4, 256, 1024), Case("x", "gemm", 8, 256, 2880),
             Case("x", "grouped", 8, 256, 1024, ms=(4, 4)), Case("x", "gemm", 16, 512, 2048),
             Case("x", "gemm", 32, 512, 4096)]
    jobs = [(c, f) for c in cases for f in ("fp8_block", "mxfp4")]
    shapes = baselines.deepgemm_shapes(jobs)
    assert shapes == [(4, 256, 1024), (16, 512, 2048), (32, 512, 4096)]

    started = []

    class FakeProc:
        def __init__(self, cmd, stdin=None, text=None, env=None):
            assert cmd[0] == sys.executable and "_deepgemm_warm_worker" in cmd[-1]
            self.stdin = io.StringIO()
            self.stdin.close = lambda: started.append(json.loads(self.stdin.getvalue()))

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", FakeProc)
    monkeypatch.setitem(sys.modules, "deep_gemm", None)  # not importable
    assert baselines.prewarm_deepgemm(shapes, 4) is None and not started
    monkeypatch.setitem(sys.modules, "deep_gemm", types.ModuleType("deep_gemm"))
    assert baselines.prewarm_deepgemm(shapes[:1], 4) is None and not started
    note = baselines.prewarm_deepgemm(shapes, 2)
    assert "3 shapes in 2 processes" in note
    assert started == [[[4, 256, 1024], [32, 512, 4096]], [[16, 512, 2048]]]


def test_run_in_processes_deals_items_round_robin(tmp_path, monkeypatch):
    """The warm-ups' process split: each process gets items[j::processes] as JSON and runs to the end."""
    from blockscaled.bench.workers import run_in_processes

    monkeypatch.chdir(tmp_path)
    (tmp_path / "_rip_target.py").write_text(
        "import json, os\n"
        "def record(part):\n"
        "    open(f'part-{os.getpid()}.json', 'w').write(json.dumps(part))\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    assert run_in_processes("_rip_target", "record", [[1, 2], [3, 4], [5, 6]], 2) == 2
    parts = sorted(json.loads(p.read_text()) for p in tmp_path.glob("part-*.json"))
    assert parts == [[[1, 2], [5, 6]], [[3, 4]]]
    assert run_in_processes("_rip_target", "record", [], 4) == 0
