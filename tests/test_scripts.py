"""CPU checks of the GPU check scripts (scripts/sanitize.py, sanitize.sh, compile_time.py,
gpu_check.sh): the sanitizer driver's case list builds (configs validated, every Hopper variant and
flag covered) without launching; its log summary parses compute-sanitizer output; the shell
scripts parse (bash -n) and run end to end against a fake compute-sanitizer and a fake python;
compile_time.py's parent/child plumbing works in the interpreter (--smoke)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import stat
import subprocess
import sys
import textwrap

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SCRIPTS = os.path.join(ROOT, "scripts")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_scripts_{name}", os.path.join(SCRIPTS, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def san():
    return _load("sanitize")


@pytest.fixture(scope="module")
def cases(san):
    return san.build_cases()


#: gpu_check.sh / sanitize.sh knobs: a caller's settings (e.g. SANITIZE=1 while gpu_check.sh runs
#: this suite on the GPU machine) must not leak into the scripts these tests run
_KNOBS = ("SANITIZE", "COMPILE_TIME", "COMPILE_TIME_LIMIT", "SANITIZE_ONLY", "SANITIZE_SKIP", "SANITIZE_BUDGET",
          "TOOLS", "BENCH_STEPS", "SKIP_BENCH", "SKIP_PYTEST", "PYTEST_LIMIT", "PYTEST_EXTRA", "SWIGLU_CHECK",
          "SKIP_WARMUP", "OUT")


def _env(**kw):
    env = {k: v for k, v in os.environ.items() if k not in _KNOBS}
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(kw)
    return env


# ------------------------------------------------------------------------- sanitize.py cases
def test_case_list_covers_every_op(cases):
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "case names must be unique (--only/--skip select by name)"
    for prefix in ("quantize/", "dequantize/", "silu_mul_quantize/", "tensor_amax/", "gemm/", "linear/", "hopper/",
                   "grouped/contig-", "grouped/masked-", "swiglu/dense-", "swiglu/contig-", "swiglu/masked-",
                   "grouped_gemm_list/"):
        assert any(n.startswith(prefix) for n in names), prefix
    for fmt in ("fp8_block", "mxfp8", "mxfp4", "nvfp4"):
        assert any(n.startswith("quantize/" + fmt) for n in names), fmt
        assert any(n.startswith("dequantize/" + fmt) for n in names), fmt
        assert any(n.startswith(f"gemm/{fmt}") for n in names), fmt
        assert any(n.startswith(f"grouped/contig-{fmt}") for n in names), fmt
    assert any(n.startswith("quantize/fp8_block-128x128") for n in names)
    gemm_cfgs = [c.config["config"] for c in cases if c.name.startswith("gemm/") and c.config["config"] is not None]
    assert any(g.split_k > 1 for g in gemm_cfgs) and any(g.split_k == 1 for g in gemm_cfgs)
    assert {g.strategy for g in gemm_cfgs} >= {"triton", "dequant_matmul", "hopper", "gemv"}
    assert {g.promote for g in gemm_cfgs if g.strategy == "triton"} >= {True, False}


def test_hopper_cases_follow_the_module(san, cases):
    """Every variant in _hopper.VARIANTS and every boolean HopperConfig field (both values)
    appears, with at least two launchable explicit configs per variant: new variants/flags
    added by the lead are covered without editing the driver."""
    H = san.H
    hop = [c for c in cases if c.name.startswith("hopper/")]
    assert all(c.needs_sm90 for c in hop)
    bools = [f.name for f in dataclasses.fields(H.HopperConfig) if f.type in (bool, "bool")]
    for v in H.VARIANTS:
        mine = [c for c in hop if c.name.split("/")[1].split("-")[0].split("+")[0] == v]
        valid = [c for c in mine if isinstance(c.config["config"], H.HopperConfig)]
        explicit = [c for c in valid if "heuristic" not in c.name]
        assert len({(c.config["config"].block_m, c.config["config"].block_n) for c in explicit}) >= 2, v
        assert any("heuristic" in c.name for c in valid), v
        for c in valid:
            assert c.config["config"].variant == v
        used = (getattr(H, "VARIANT_FLAGS", None) or {}).get(v)  # flags the variant reads (None: all)
        for b in bools:
            if used is not None and b not in used:
                continue
            assert {getattr(c.config["config"], b) for c in explicit} == {False, True}, (v, b)
    assert any(c.config["sms"] == san.FEW_SMS for c in hop), "persistent grids must loop over tiles somewhere"


def test_select_and_shard(san, cases):
    part = [san._select(cases, None, None, f"{i}/3") for i in range(3)]
    assert sorted(c.name for p in part for c in p) == sorted(c.name for c in cases)
    only = san._select(cases, "^hopper/", "heuristic", None)
    assert only and all(c.name.startswith("hopper/") and "heuristic" not in c.name for c in only)
    with pytest.raises(SystemExit):
        san._select(cases, None, None, "3/3")


def test_list_cli():
    r = subprocess.run([sys.executable, os.path.join(SCRIPTS, "sanitize.py"), "--list", "--only", "hopper/|gemm/"],
                       capture_output=True, text=True, env=_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "hopper/" in r.stdout and "gemm/" in r.stdout and "quantize/" not in r.stdout
    assert r.stdout.strip().splitlines()[-1].endswith("cases")


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter smoke test for machines without a GPU (the GPU "
                    "image's numpy 2.5 breaks the triton 3.6 interpreter; the real runs are the GPU commands)")
def test_driver_runs_one_case_in_the_interpreter():
    """The runner itself (inputs, launch, reference check, exit status) on one small case."""
    r = subprocess.run([sys.executable, os.path.join(SCRIPTS, "sanitize.py"), "--device", "cpu",
                        "--only", "^gemm/fp8_block-w128x128-64x64x128$|^hopper/wide-heuristic-256"],
                       capture_output=True, text=True, env=_env(TRITON_INTERPRET="1"), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "] ok   gemm/fp8_block-w128x128-64x64x128" in r.stdout
    assert "] skip hopper/wide-heuristic-256x256x512" in r.stdout  # needs sm_90
    assert "1 ok, 0 failed, 1 skipped" in r.stdout


def test_no_cuda_is_a_clear_error():
    r = subprocess.run([sys.executable, os.path.join(SCRIPTS, "sanitize.py"), "--only", "^tensor_amax/"],
                       capture_output=True, text=True, env=_env(CUDA_VISIBLE_DEVICES=""), timeout=120)
    assert r.returncode == 2 and "no CUDA device" in r.stderr


# ------------------------------------------------------------------------- log summaries
MEMCHECK_FAIL = """\
========= COMPUTE-SANITIZER
# sanitize.py: 3 cases on NVIDIA H100
[  1/3] ok   quantize/a (0.1 s) bitwise
========= Invalid __global__ read of size 4 bytes
=========     at gemm_kernel+0x1a0
=========     by thread (0,0,0) in block (1,0,0)
=========     Address 0x7f00001234 is out of bounds
[  2/3] ok   gemm/b (0.2 s) rel_fro=1e-3
[  3/3] ok   hopper/c (0.2 s) rel_fro=1e-3
# sanitize.py: 3 ok, 0 failed, 0 skipped in 1.0 s
========= ERROR SUMMARY: 1 error
"""
RACECHECK = """\
========= COMPUTE-SANITIZER
[  1/1] ok   hopper/ws (0.1 s) x
# sanitize.py: 1 ok, 0 failed, 0 skipped in 1.0 s
========= RACECHECK SUMMARY: {h} hazards displayed ({e} errors, {w} warnings)
"""


def _summ(san, tmp_path, text, tool, **kw):
    p = tmp_path / f"{tool}.log"
    p.write_text(text)
    return san.summarize_log(str(p), tool, **kw)


def test_summarize_logs(san, tmp_path):
    ok, line = _summ(san, tmp_path, MEMCHECK_FAIL, "memcheck", rc=0, seconds=3)
    assert not ok and "errors=1" in line and "Invalid __global__ read" in line and "gemm/b" in line
    ok, line = _summ(san, tmp_path, MEMCHECK_FAIL.replace("1 error", "0 errors"), "memcheck")
    assert ok and "errors=0" in line  # the summary line decides; headlines are context
    ok, line = _summ(san, tmp_path, RACECHECK.format(h=0, e=0, w=0), "racecheck")
    assert ok and line.startswith("racecheck: PASS")
    ok, line = _summ(san, tmp_path, RACECHECK.format(h=2, e=0, w=2), "racecheck")
    assert ok and "warnings=2" in line
    ok, _ = _summ(san, tmp_path, RACECHECK.format(h=2, e=0, w=2), "racecheck", strict_warnings=True)
    assert not ok
    ok, line = _summ(san, tmp_path, RACECHECK.format(h=1, e=1, w=0), "racecheck")
    assert not ok and "errors=1" in line
    ok, line = _summ(san, tmp_path, "\n".join(RACECHECK.splitlines()[:2]), "synccheck", rc=124)
    assert not ok and "no ERROR/RACECHECK SUMMARY" in line and "timed out" in line and "driver did not finish" in line
    api = MEMCHECK_FAIL.replace("Invalid __global__ read of size 4 bytes",
                                'Program hit cudaErrorInvalidValue (error 1) due to "invalid argument" on CUDA API call '
                                "to cudaPointerGetAttributes.")
    ok, line = _summ(san, tmp_path, api, "memcheck")
    assert not ok and "api_errors=1" in line and "--report-api-errors no" in line
    failed = RACECHECK.format(h=0, e=0, w=0).replace("1 ok, 0 failed", "0 ok, 1 failed")
    ok, line = _summ(san, tmp_path, failed, "racecheck")
    assert not ok and "1 case(s) failed" in line


# ------------------------------------------------------------------------- shell scripts
@pytest.mark.parametrize("script", ["sanitize.sh", "gpu_check.sh"])
def test_shell_syntax(script):
    r = subprocess.run(["bash", "-n", os.path.join(SCRIPTS, script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _exe(path, text):
    path.write_text(textwrap.dedent(text))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.fixture
def fakes(tmp_path):
    """A fake compute-sanitizer (runs the command after the options, then prints a summary with
    $FAKE_ERRORS errors) and a fake python (torch check passes, the driver prints one ok case,
    --summarize goes to the real interpreter)."""
    cs = _exe(tmp_path / "compute-sanitizer", """\
        #!/usr/bin/env bash
        case "$1" in
          --version) echo "Compute Sanitizer Version 2099.1.0 (fake)"; exit 0;;
          --help) echo "--tool --target-processes --print-limit --show-backtrace --padding"; exit 0;;
        esac
        tool=""; prev=""
        while [ $# -gt 0 ]; do
          [ "$prev" = "--tool" ] && tool=$1
          case "$1" in *scripts/sanitize.py) "$prev" "$@"; break;; esac
          prev=$1; shift
        done
        echo "FAKE-SANITIZER ran tool=$tool"
        echo "========= ERROR SUMMARY: ${FAKE_ERRORS:-0} errors"
        """)
    py = _exe(tmp_path / "python", f"""\
        #!/usr/bin/env bash
        [ "$1" = "-c" ] && exit 0
        [ "$1" = "-" ] && {{ cat >/dev/null; exit 0; }}
        for a in "$@"; do [ "$a" = "--summarize" ] && exec "{sys.executable}" "$@"; done
        for a in "$@"; do [ "$a" = "-m" ] && exit 0; done
        case "$1" in
          *sanitize.py)
            echo "[  1/1] ok   quantize/x (0.1 s) bitwise"
            echo "# sanitize.py: 1 ok, 0 failed, 0 skipped in 0.1 s";;
          *compile_time.py) echo "fake compile_time $*";;
        esac
        exit 0
        """)
    return cs, py


def _run_sh(args, env, timeout=120):
    return subprocess.run(["bash", *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def test_sanitize_sh_end_to_end_with_fakes(fakes, tmp_path):
    cs, py = fakes
    out = tmp_path / "out"
    env = _env(COMPUTE_SANITIZER=cs, PYTHON=py, OUT=str(out), WARMUP_SHARDS="2")
    r = _run_sh([os.path.join(SCRIPTS, "sanitize.sh")], env)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = (out / "sanitize" / "summary.txt").read_text()
    for t in ("memcheck", "racecheck", "synccheck"):
        assert f"{t:9s}: PASS errors=0" in summary, summary
        log = (out / "sanitize" / f"{t}.log").read_text()
        assert f"FAKE-SANITIZER ran tool={t}" in log and "] ok   quantize/x" in log
    assert "--padding 64" in (out / "sanitize" / "memcheck.log").read_text()  # option known -> used
    assert "warm-up  : 2 ok, 0 failed" in summary
    assert "sanitize : PASS" in summary
    files = sorted(os.listdir(out / "sanitize"))
    assert files == ["memcheck.log", "racecheck.log", "summary.txt", "synccheck.log", "warmup.log"], files

    # errors in one tool -> exit 1 and a FAIL line; --out instead of OUT; one tool only
    env = _env(COMPUTE_SANITIZER=cs, PYTHON=py, FAKE_ERRORS="3", TOOLS="racecheck", SKIP_WARMUP="1")
    env.pop("OUT", None)
    r = _run_sh([os.path.join(SCRIPTS, "sanitize.sh"), "--out", str(tmp_path / "o2")], env)
    assert r.returncode == 1
    assert "racecheck: FAIL errors=3" in r.stdout and "sanitize : FAIL" in r.stdout


def test_sanitize_sh_without_sanitizer(fakes, tmp_path):
    _, py = fakes
    env = _env(COMPUTE_SANITIZER=str(tmp_path / "missing"), PYTHON=py, OUT=str(tmp_path / "o"))
    r = _run_sh([os.path.join(SCRIPTS, "sanitize.sh")], env)
    assert r.returncode == 2 and "compute-sanitizer not found" in r.stdout


def test_gpu_check_optional_steps(fakes, tmp_path):
    """SANITIZE=1 / COMPILE_TIME=1 run their steps; default behaviour (no such env) does not."""
    cs, py = fakes
    base = dict(COMPUTE_SANITIZER=cs, PYTHON=py, SKIP_PYTEST="1", SKIP_BENCH="1", SKIP_WARMUP="1")
    r = _run_sh([os.path.join(SCRIPTS, "gpu_check.sh")], _env(OUT=str(tmp_path / "a"), **base))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "=== sanitize" not in r.stdout and "=== compile time" not in r.stdout
    r = _run_sh([os.path.join(SCRIPTS, "gpu_check.sh")],
                _env(OUT=str(tmp_path / "b"), SANITIZE="1", COMPILE_TIME="1", TOOLS="memcheck", **base))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "=== compile time" in r.stdout and "fake compile_time" in r.stdout
    assert "memcheck : PASS" in r.stdout and (tmp_path / "b" / "sanitize" / "summary.txt").exists()


# ------------------------------------------------------------------------- compile_time.py
def test_compile_time_report_verdicts():
    ct = _load("compile_time")
    call = {"n": 2112, "k": 7168, "m": 1, "first_s": 3.0, "steady_s": 0.001, "new_cubins": 2, "new_launchers": 1,
            "finite": True, "config": "triton 64x64x128 w4 s4"}
    phases = {"interpreter_start": 0.1, "import_torch": 3.0, "cuda_context": 0.5, "import_triton": 0.3,
              "import_blockscaled": 0.2, "setup_inputs": 1.0, "first_calls": 3.0, "steady_calls": 0.01}

    def run(label, lib):
        return {"label": label, "calls": [dict(call)], "phases": dict(phases), "library_s": lib,
                "process_wall_s": lib + 5, "cache_after": {"cubins": 2}}

    text, ok = ct.report([run("cold", 30.0), run("warm", 1.5)])
    assert ok and "cold : PASS" in text and "warm : PASS" in text and "excludes" in text
    text, ok = ct.report([run("cold", 61.0), run("warm", 2.5)])
    assert not ok and "cold : MISS" in text and "warm : MISS" in text
    text, ok = ct.report([{"label": "cold", "error": "child exit 1", "process_wall_s": 1.0}])
    assert not ok and "ERROR" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter smoke test for machines without a GPU (the GPU "
                    "image's numpy 2.5 breaks the triton 3.6 interpreter; the real runs are the GPU commands)")
def test_compile_time_smoke(tmp_path):
    """Parent/child plumbing end to end in the interpreter (two processes, tiny shapes)."""
    out = tmp_path / "ct.json"
    r = subprocess.run([sys.executable, os.path.join(SCRIPTS, "compile_time.py"), "--smoke", "--out", str(out)],
                       capture_output=True, text=True, env=_env(), timeout=300)
    assert "cold :" in r.stdout and "warm :" in r.stdout, r.stdout + r.stderr
    import json

    data = json.loads(out.read_text())
    assert data["smoke"] and [x["label"] for x in data["runs"]] == ["cold", "warm"]
    assert all(len(x["calls"]) == 2 and x["library_s"] > 0 for x in data["runs"])
