"""CPU checks of scripts/ (the GPU check, sweep and probe scripts; scripts/README.md lists them):
every script answers --help on a machine without a GPU, none edits sys.path or imports a private
name of the library without saying why, the README lists exactly the scripts there are; the
sanitizer driver's case list builds (configs validated, every Hopper variant, flag and planner
candidate covered) without launching and its log summary parses compute-sanitizer output; the
shell scripts parse (bash -n) and run end to end against a fake compute-sanitizer and a fake
python (gpu_check.sh's summary of the saved bench runs included); ab.py and hopper_check.py
resolve their variants / checks for an H100 on the CPU; compile_time.py's parent/child plumbing
works in the interpreter (--smoke)."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import stat
import subprocess
import sys
import textwrap

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SCRIPTS = os.path.join(ROOT, "scripts")
CHECKS = os.path.join(SCRIPTS, "checks")
SWEEPS = os.path.join(SCRIPTS, "sweeps")


#: Interpreter runs need a machine without a GPU: there conftest turns the interpreter on, and the
#: GPU image's numpy 2.5 breaks the triton 3.6 interpreter (pyproject keeps numpy < 2.3 for it);
#: the real runs of these scripts are the GPU commands.
_CPU_INTERPRETER_ONLY = pytest.mark.skipif(torch.cuda.is_available(),
                                           reason="interpreter smoke test for machines without a GPU")


def _scripts(ext: str) -> list[str]:
    """Paths (relative to scripts/) of every ``ext`` file under scripts/."""
    out = []
    for d, _, files in os.walk(SCRIPTS):
        if "__pycache__" in d:
            continue
        out += [os.path.relpath(os.path.join(d, f), SCRIPTS) for f in files if f.endswith(ext)]
    return sorted(out)


PY_SCRIPTS = _scripts(".py")
SH_SCRIPTS = _scripts(".sh")


def _load(rel: str):
    name = "_scripts_" + re.sub(r"\W", "_", rel)
    spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, rel))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def san():
    return _load("checks/sanitize.py")


@pytest.fixture(scope="module")
def cases(san):
    return san.build_cases()


#: gpu_check.sh / sanitize.sh knobs: a caller's settings (e.g. SANITIZE=1 while gpu_check.sh runs
#: this suite on the GPU machine) must not leak into the scripts these tests run
_KNOBS = ("SANITIZE", "COMPILE_TIME", "COMPILE_TIME_LIMIT", "SANITIZE_ONLY", "SANITIZE_SKIP", "SANITIZE_BUDGET",
          "TOOLS", "BENCH_STEPS", "SKIP_BENCH", "SKIP_PYTEST", "PYTEST_LIMIT", "PYTEST_EXTRA", "HOPPER_CHECK",
          "HOPPER_CHECK_LIMIT", "SKIP_WARMUP", "OUT")


def _env(**kw):
    env = {k: v for k, v in os.environ.items() if k not in _KNOBS}
    env.update(kw)
    return env


def _cpu_env(**kw):
    """No GPU visible, no interpreter: what a laptop without CUDA sees."""
    env = _env(CUDA_VISIBLE_DEVICES="", **kw)
    env.pop("TRITON_INTERPRET", None)
    return env


# ------------------------------------------------------------------------- the set of scripts
def test_the_kept_set():
    """Few scripts, in their folders; test.sh where CI and the README call it."""
    assert "test.sh" in SH_SCRIPTS
    for rel in PY_SCRIPTS + SH_SCRIPTS:
        assert rel == "test.sh" or rel.split(os.sep)[0] in ("checks", "sweeps", "probes"), rel
    # 12 before the MX/NV kernels; their two GPU sweeps (mx_decode, mx_tiles) set planner constants
    # and stay until those are measured, host_cost.py measures the eager host path,
    # and carry_triton.sh takes other triton releases to the GPU machine (the MX / NV kernels' release gates);
    # moe_gemv_probe.py is the grouped Gluon GEMV, to time on the GPU before the library takes it (the multicast
    # and dense Gluon GEMV probes' findings are recorded: NOTES, forty-first and forty-second sessions)
    assert len(PY_SCRIPTS + SH_SCRIPTS) <= 17, "keep scripts/ small: record one-off findings in benchmarks/NOTES.md"


def test_readme_lists_every_script():
    text = open(os.path.join(SCRIPTS, "README.md")).read()
    listed = re.findall(r"^\| `([^`]+)` \|", text, flags=re.M)
    assert sorted(listed) == sorted(PY_SCRIPTS + SH_SCRIPTS), listed
    for rel in listed:  # each row names its command
        row = next(line for line in text.splitlines() if line.startswith(f"| `{rel}` |"))
        assert f"scripts/{rel}" in row, row


@pytest.mark.parametrize("rel", PY_SCRIPTS + SH_SCRIPTS)
def test_no_sys_path_edits(rel):
    """Scripts import the installed package; editing sys.path would hide a broken install."""
    text = open(os.path.join(SCRIPTS, rel)).read()
    assert not re.search(r"sys\.path\.(insert|append)|PYTHONPATH=[^\n]*\.\./src", text), rel


def _private_uses(path: str) -> list[tuple[int, str]]:
    """(line, what) of every private name of the library a script reaches: a module path component
    or an imported name with a leading underscore, an attribute ``x._name`` of a name imported
    from blockscaled, or a string naming a private blockscaled module (importlib)."""
    tree = ast.parse(open(path).read(), path)
    bound, out = set(), []

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for al in node.names:
                if al.name.split(".")[0] == "blockscaled":
                    bound.add(al.asname or al.name.split(".")[0])
                    if any(private(c) for c in al.name.split(".")):
                        out.append((node.lineno, al.name))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "blockscaled":
            if any(private(c) for c in node.module.split(".")):
                out.append((node.lineno, node.module))
            for al in node.names:
                bound.add(al.asname or al.name)
                if private(al.name):
                    out.append((node.lineno, f"{node.module}.{al.name}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"blockscaled(\.\w+)*\._\w+(\.\w+)*", node.value):
                out.append((node.lineno, node.value))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in bound):
            out.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return out


@pytest.mark.parametrize("rel", PY_SCRIPTS)
def test_no_private_names(rel):
    """Public API or the explicitly internal modules only; where a private name is unavoidable, a
    ``# private: <why>`` comment on the line or the two lines above says why."""
    path = os.path.join(SCRIPTS, rel)
    lines = open(path).read().splitlines()
    for lineno, what in _private_uses(path):
        near = " ".join(lines[max(0, lineno - 3):lineno])
        assert re.search(r"# private: \S", near), f"{rel}:{lineno} uses {what} without a '# private: <why>' comment"


def test_private_name_detector(tmp_path):
    p = tmp_path / "s.py"
    p.write_text("import blockscaled as bs\nfrom blockscaled.ops import _hopper\nfrom blockscaled.x import _y, z\n"
                 "bs._checks\nimport importlib\nimportlib.import_module('blockscaled.ops._hopper')\nbs.gemm\n")
    assert [ln for ln, _ in _private_uses(str(p))] == [2, 3, 6, 4]


@pytest.mark.parametrize("rel", PY_SCRIPTS)
def test_help_on_cpu(rel):
    r = subprocess.run([sys.executable, os.path.join(SCRIPTS, rel), "--help"], capture_output=True, text=True,
                       env=_cpu_env(), timeout=180, cwd="/")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("usage:") and len(r.stdout.splitlines()) > 3, r.stdout
    # Each subcommand's help too: argparse formats a help string only when it is printed, so a stray
    # '%' in one crashes `<script> <sub> --help` while the top level prints.
    subs = re.search(r"^usage: \S+ \[-h\] \{([\w,-]+)\}", r.stdout, re.M)
    for sub in subs.group(1).split(",") if subs else ():
        rs = subprocess.run([sys.executable, os.path.join(SCRIPTS, rel), sub, "--help"], capture_output=True,
                            text=True, env=_cpu_env(), timeout=180, cwd="/")
        assert rs.returncode == 0 and rs.stdout.startswith("usage:"), f"{rel} {sub}: " + rs.stdout + rs.stderr


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
    """Every variant in config.hopper.VARIANTS, every flag it reads (VARIANT_FLAGS: bools both
    ways, epilogue every value) with at least two explicit tiles, every Hopper candidate the
    planner ranks at the planner shapes, fused split-K and tail splits with both reductions:
    new variants, flags and candidates are covered without editing the driver."""
    HC = san.HC
    hop = [c for c in cases if c.name.startswith("hopper/")]
    assert all(c.needs_sm90 for c in hop)
    valid = [c for c in hop if isinstance(c.config["config"], san.HopperConfig)]
    assert len(valid) == len(hop), [c.name for c in hop if c not in valid]
    for v in HC.VARIANTS:
        mine = [c for c in valid if c.config["config"].variant == v]
        explicit = [c for c in mine if re.match(rf"hopper/{v}[+-].*-sms{san.FEW_SMS}$", c.name)]
        assert len({(c.config["config"].block_m, c.config["config"].block_n) for c in explicit}) >= 2, v
        for f in HC.VARIANT_FLAGS.get(v, ()):
            values = {getattr(c.config["config"], f) for c in explicit}
            want = set(HC.EPILOGUES) if f == "epilogue" else {False, True}
            assert values == want, (v, f, values)
        for shape in san._PLANNER_SHAPES:
            want = {c for c in san._planner_hopper_configs(shape) if c.variant == v}
            got = {c.config["config"] for c in mine if "-planner-" in c.name and c.config["shape"] == shape}
            assert got == want, (v, shape)
        assert any("-planner-" in c.name for c in mine), v
    cfgs = [c.config["config"] for c in valid]
    for red in ("spread", "last"):
        assert any(c.split_k > 1 and c.split_reduce == red and c.variant == "wide" for c in cfgs), red
        assert any(c.tail_split > 1 and c.split_reduce == red for c in cfgs), red
    assert any(c.split_k > 1 and c.variant == "skinny" for c in cfgs)
    assert any(c.config["sms"] == san.FEW_SMS for c in hop), "persistent grids must loop over tiles somewhere"
    grouped_hopper = [c for c in cases if c.name.startswith("grouped/") and c.needs_sm90]
    assert {c.config["mode"] for c in grouped_hopper} == {"contig", "masked"}
    assert {c.config["reduce"] for c in grouped_hopper if c.config["tail"] > 1} == {"spread", "last"}


def test_select_and_shard(san, cases):
    part = [san._select(cases, None, None, f"{i}/3") for i in range(3)]
    assert sorted(c.name for p in part for c in p) == sorted(c.name for c in cases)
    only = san._select(cases, "^hopper/", "planner", None)
    assert only and all(c.name.startswith("hopper/") and "planner" not in c.name for c in only)
    with pytest.raises(SystemExit):
        san._select(cases, None, None, "3/3")


def test_list_cli():
    r = subprocess.run([sys.executable, os.path.join(CHECKS, "sanitize.py"), "--list", "--only", "hopper/|gemm/"],
                       capture_output=True, text=True, env=_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "hopper/" in r.stdout and "gemm/" in r.stdout and "quantize/" not in r.stdout
    assert r.stdout.strip().splitlines()[-1].endswith("cases")


@_CPU_INTERPRETER_ONLY
def test_driver_runs_one_case_in_the_interpreter():
    """The runner itself (inputs, launch, reference check, exit status) on one small case."""
    r = subprocess.run([sys.executable, os.path.join(CHECKS, "sanitize.py"), "--device", "cpu",
                        "--only", "^gemm/fp8_block-w128x128-64x64x128$|^hopper/wide-128x128-s2-sms3$"],
                       capture_output=True, text=True, env=_env(TRITON_INTERPRET="1"), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "] ok   gemm/fp8_block-w128x128-64x64x128" in r.stdout
    assert "] skip hopper/wide-128x128-s2-sms3" in r.stdout  # needs sm_90
    assert "1 ok, 0 failed, 1 skipped" in r.stdout


def test_no_cuda_is_a_clear_error():
    r = subprocess.run([sys.executable, os.path.join(CHECKS, "sanitize.py"), "--only", "^tensor_amax/"],
                       capture_output=True, text=True, env=_cpu_env(), timeout=120)
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
@pytest.mark.parametrize("rel", SH_SCRIPTS)
def test_shell_syntax(rel):
    r = subprocess.run(["bash", "-n", os.path.join(SCRIPTS, rel)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_carry_triton_usage():
    """carry_triton.sh names its three commands and refuses anything else (it edits the git index:
    a mistyped command must do nothing)."""
    r = subprocess.run(["bash", os.path.join(CHECKS, "carry_triton.sh"), "hid"], capture_output=True, text=True)
    assert r.returncode == 2 and "build VERSION | hide | restore" in r.stderr, r
    r = subprocess.run(["bash", os.path.join(CHECKS, "carry_triton.sh"), "build"], capture_output=True, text=True)
    assert r.returncode != 0 and "usage: carry_triton.sh build VERSION" in r.stderr, r


def _exe(path, text):
    path.write_text(textwrap.dedent(text))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.fixture
def fakes(tmp_path):
    """A fake compute-sanitizer (runs the command after the options, then prints a summary with
    $FAKE_ERRORS errors) and a fake python (torch check passes, the driver prints one ok case,
    --summarize goes to the real interpreter; the bench saves its run as ``--save-results DIR``
    does: DIR/<gpu>/runs.jsonl + DIR/<gpu>/latest/<suite>.md)."""
    cs = _exe(tmp_path / "compute-sanitizer", """\
        #!/usr/bin/env bash
        case "$1" in
          --version) echo "Compute Sanitizer Version 2099.1.0 (fake)"; exit 0;;
          --help) echo "--tool --target-processes --print-limit --show-backtrace --padding"; exit 0;;
        esac
        tool=""; prev=""
        while [ $# -gt 0 ]; do
          [ "$prev" = "--tool" ] && tool=$1
          case "$1" in *scripts/checks/sanitize.py) "$prev" "$@"; break;; esac
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
        if [ "$1" = "-m" ]; then
          [ "$2" = "blockscaled.bench" ] || exit 0
          suite=default; res=""; prev=""
          for a in "$@"; do
            [ "$prev" = "--suite" ] && suite=$a
            [ "$prev" = "--save-results" ] && res=$a
            prev=$a
          done
          [ -n "$res" ] || exit 0
          mkdir -p "$res/fakegpu/latest"
          echo "{{\\"suite\\": \\"$suite\\"}}" >> "$res/fakegpu/runs.jsonl"
          echo "# fake bench summary of $suite" > "$res/fakegpu/latest/$suite.md"
          exit 0
        fi
        case "$1" in
          *checks/sanitize.py)
            echo "[  1/1] ok   quantize/x (0.1 s) bitwise"
            echo "# sanitize.py: 1 ok, 0 failed, 0 skipped in 0.1 s";;
          *compile_time.py) echo "fake compile_time $*";;
          *hopper_check.py) echo "fake hopper_check $*";;
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
    r = _run_sh([os.path.join(CHECKS, "sanitize.sh")], env)
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
    r = _run_sh([os.path.join(CHECKS, "sanitize.sh"), "--out", str(tmp_path / "o2")], env)
    assert r.returncode == 1
    assert "racecheck: FAIL errors=3" in r.stdout and "sanitize : FAIL" in r.stdout


def test_sanitize_sh_without_sanitizer(fakes, tmp_path):
    _, py = fakes
    env = _env(COMPUTE_SANITIZER=str(tmp_path / "missing"), PYTHON=py, OUT=str(tmp_path / "o"))
    r = _run_sh([os.path.join(CHECKS, "sanitize.sh")], env)
    assert r.returncode == 2 and "compute-sanitizer not found" in r.stdout


def test_sanitize_sh_help_from_elsewhere():
    r = subprocess.run(["bash", os.path.join(CHECKS, "sanitize.sh"), "--help"], capture_output=True, text=True,
                       cwd="/", timeout=30)
    assert r.returncode == 0 and "compute-sanitizer" in r.stdout and "set -u" not in r.stdout


def test_gpu_check_optional_steps(fakes, tmp_path):
    """HOPPER_CHECK=1 / SANITIZE=1 / COMPILE_TIME=1 run their steps (at their new paths); default
    behaviour (no such env) does not."""
    cs, py = fakes
    base = dict(COMPUTE_SANITIZER=cs, PYTHON=py, SKIP_PYTEST="1", SKIP_BENCH="1", SKIP_WARMUP="1")
    r = _run_sh([os.path.join(CHECKS, "gpu_check.sh")], _env(OUT=str(tmp_path / "a"), **base))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "=== sanitize" not in r.stdout and "=== compile time" not in r.stdout and "=== hopper" not in r.stdout
    r = _run_sh([os.path.join(CHECKS, "gpu_check.sh")],
                _env(OUT=str(tmp_path / "b"), SANITIZE="1", COMPILE_TIME="1", HOPPER_CHECK="1", TOOLS="memcheck",
                     **base))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "=== compile time" in r.stdout and "fake compile_time" in r.stdout
    assert "fake hopper_check scripts/checks/hopper_check.py --json " + str(tmp_path / "b" / "hopper_check.json") \
        in r.stdout
    assert "memcheck : PASS" in r.stdout and (tmp_path / "b" / "sanitize" / "summary.txt").exists()


def test_gpu_check_bench_summary(fakes, tmp_path):
    """The summary collects the newest run of each bench step (<gpu>/latest/<suite>.md) and the
    archive keeps runs.jsonl."""
    cs, py = fakes
    out = tmp_path / "o"
    r = _run_sh([os.path.join(CHECKS, "gpu_check.sh")],
                _env(OUT=str(out), PYTHON=py, SKIP_PYTEST="1", BENCH_STEPS="quantize moe"))
    assert r.returncode == 0, r.stdout + r.stderr
    summary = (out / "summary.md").read_text()
    assert "# fake bench summary of quantize" in summary and "# fake bench summary of moe" in summary, summary
    assert "# fake bench summary of quantize" in r.stdout
    listing = subprocess.run(["tar", "-tzf", str(out / "results.tar.gz")], capture_output=True, text=True).stdout
    assert "fakegpu/runs.jsonl" in listing and "fakegpu/latest/moe.md" in listing, listing


# ------------------------------------------------------------------------- ab.py / hopper_check.py
def _run_py(rel, *argv, timeout=180, extra_env=None):
    return subprocess.run([sys.executable, os.path.join(SCRIPTS, rel), *argv], capture_output=True, text=True,
                          env={**_cpu_env(), **(extra_env or {})}, timeout=timeout, cwd="/")


def test_ab_resolves_variants_for_an_h100():
    r = _run_py("sweeps/ab.py", "--list", "--shapes", "4096x2112x7168,16x7168x2048",
                "--variants", "plan,hopper,wide@block_n=128:tail_split=1,portable,dequant_matmul,cands:hopper_skinny")
    assert r.returncode == 0, r.stdout + r.stderr
    blocks = r.stdout.split("gemm fp8_block M=16")
    assert "wide@block_n=128:tail_split=1" in blocks[0] and "hopper_wide 128x128" in blocks[0]
    assert re.search(r"^  portable +portable ", blocks[0], flags=re.M)
    assert "cand " not in blocks[0]  # no skinny candidate at M=4096
    assert re.search(r"^  cand hopper_skinny 16x", blocks[1], flags=re.M)
    r = _run_py("sweeps/ab.py", "--list", "--op", "grouped", "--layout", "masked", "--shapes", "128x4096x7168",
                "--variants", "plan,wide@tail_split=2:block_n=256,portable")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "tail split 2" in r.stdout and "portable_grouped" in r.stdout
    r = _run_py("sweeps/ab.py", "--list", "--op", "swiglu", "--shapes", "256x2048x7168", "--variants", "plan,hopper")
    assert r.returncode == 0 and "hopper_wide" in r.stdout, r.stdout + r.stderr


def test_ab_resolves_the_stream_splits():
    """The streaming kernel's variants (the planner's split, other splits and rings) resolve for
    an H100 on the CPU, mxfp8 and W x A included; fp8_block and M > 64 are refused."""
    r = _run_py("sweeps/ab.py", "--list", "--fmt", "nvfp4", "--weight-only", "--shapes", "16x8192x8192",
                "--variants", "stream,stream@split_k=8:num_stages=4")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^  stream +hopper_stream 64x128 steps, 16 rows, 6-slot ring, split-K 4", r.stdout, flags=re.M)
    assert "4-slot ring, split-K 8" in r.stdout
    r = _run_py("sweeps/ab.py", "--list", "--fmt", "mxfp8", "--shapes", "16x8192x8192", "--variants", "stream")
    assert r.returncode == 0 and re.search(r"^  stream +hopper_stream 64x128 steps, 16 rows, 4-slot ring", r.stdout,
                                           flags=re.M), r.stdout + r.stderr
    for fmt, shape in (("fp8_block", "16x8192x8192"), ("mxfp4", "65x8192x8192")):
        r = _run_py("sweeps/ab.py", "--list", "--fmt", fmt, "--shapes", shape, "--variants", "stream")
        assert r.returncode != 0 and "mxfp4 / nvfp4 / mxfp8 at M <= 64" in r.stderr, (fmt, r.stderr)


def test_ab_errors_and_no_gpu():
    r = _run_py("sweeps/ab.py", "--shapes", "128x7168x2048", "--variants", "plan")
    assert r.returncode == 2 and "no CUDA device" in r.stderr and "hopper_wide" in r.stdout
    r = _run_py("sweeps/ab.py", "--list", "--shapes", "128x7168x2048", "--variants", "plan,bogus")
    assert r.returncode != 0 and "unknown kind 'bogus'" in r.stderr
    r = _run_py("sweeps/ab.py", "--list", "--fmt", "mxfp8", "--shapes", "128x7168x2048", "--variants", "wide")
    assert r.returncode != 0 and "needs fp8_block" in r.stderr


def test_ab_parsing():
    ab = _load("sweeps/ab.py")
    assert ab.parse_variant("wide@block_n=128:epilogue=masked:split_wg=false") == (
        "wide", "", {"block_n": 128, "epilogue": "masked", "split_wg": False})
    assert ab.parse_variant("cands:hopper_skinny") == ("cands", "hopper_skinny", {})
    assert ab.parse_shapes("1x2x3,4X5X6") == [(1, 2, 3), (4, 5, 6)]
    with pytest.raises(SystemExit):
        ab.parse_shapes("1x2")
    from blockscaled.config.hopper import HopperConfig

    base = HopperConfig("wide", 128, 256, 8, 3, epilogue="tma")
    # a new tile refills the ring; num_warps follows block_m; stages= is kept as given
    assert ab._override(base, {"block_n": 128}, 2).stages > base.stages
    assert ab._override(base, {"block_m": 64}, 2).num_warps == 4
    assert ab._override(base, {"block_n": 128, "stages": 2}, 2).stages == 2


def test_hopper_check_lists_its_checks_on_cpu():
    r = _run_py("checks/hopper_check.py", "--list", "--quick")
    assert r.returncode == 0, r.stdout + r.stderr
    names = r.stdout.splitlines()
    assert any(n.startswith("dense 4096x4096x7168 hopper_wide") for n in names)
    assert any(n.startswith("dense 1x2112x7168 hopper_skinny") for n in names)
    for group in ("grouped contiguous", "grouped masked cuda graph", "swiglu dense", "swiglu masked"):
        assert any(n.startswith(group) for n in names), group
    full = _run_py("checks/hopper_check.py", "--list", "--candidates", "--only", "^dense 128x2112x7168 ")
    assert full.returncode == 0 and len(full.stdout.splitlines()) > 4, full.stdout
    r = _run_py("checks/hopper_check.py")
    assert r.returncode == 2 and "sm_90" in r.stderr


# ------------------------------------------------------------------------- mx_tiles.py
def test_mx_tiles_lists_candidates_on_cpu():
    r = _run_py("sweeps/mx_tiles.py", "--list", "--formats", "nvfp4", "--modes", "wo", "--shapes", "7168x16384",
                "--ms", "16,256")
    assert r.returncode == 0, r.stdout + r.stderr
    blocks = r.stdout.split("nvfp4 wo M=256")
    for label in ("plan", "before", "dequant", "bf16", "swap16x128x128w4s4/pps2", "swap16x128x128w4s4/pps4"):
        assert re.search(rf"^  {re.escape(label)} ", blocks[0], flags=re.M), label
    assert "swap_ab=True" in blocks[0] and "128x128x128w8s3/pps2" in blocks[1]
    r = _run_py("sweeps/mx_tiles.py", "--quick", "--formats", "mxfp4")
    assert r.returncode == 2 and "no CUDA device" in r.stderr


@_CPU_INTERPRETER_ONLY
def test_mx_tiles_row_runs_in_the_interpreter(monkeypatch):
    """One small row end to end on the CPU (Triton interpreter, timings faked): every candidate kind
    runs and passes the GPU-side check's logic, a bad candidate is reported, the summary and the
    rules block build from the row."""
    import types

    import blockscaled.bench.timing as timing
    from blockscaled.plan import H100_SXM

    mt = _load("sweeps/mx_tiles.py")
    monkeypatch.setattr(mt, "DEVICE", "cpu")
    monkeypatch.setattr(mt, "TILE_CLASSES", {16: ((True, 16, 64, 64, 4, 2), (False, 64, 64, 128, 4, 2))})
    monkeypatch.setattr(mt, "PPS_MS", ())
    calls = []

    def fake_time_op(fn, sets, **kw):
        calls.append(len(sets))
        return types.SimpleNamespace(median_ms=0.01 * len(calls))

    monkeypatch.setattr(timing, "time_op", fake_time_op)
    args = types.SimpleNamespace(max_sets=2, iterations=1)
    res = mt.run_row("mxfp4", "wo", 16, 64, 128, H100_SXM, args, compile_errors={})
    kinds = {c["kind"] for c in res["cands"]}
    assert kinds == {"plan", "before", "dequant", "bf16", "tile"}, res
    assert all(c.get("ok") and "us" in c for c in res["cands"]), res["cands"]
    assert res["cands"][0]["ran"].startswith("portable") and calls
    best, plan, before, dq, b16 = mt.summarize_row(res)
    assert best["label"] == "plan" and b16 is not None and "vs bf16" in mt.row_line(res)
    # a compile failure recorded by the warm-up is reported and never timed
    tiles = [c for c in mt.candidates("mxfp4", "wo", 16, 64, 128, H100_SXM) if c[1] == "tile"]
    key = mt.compile_key("mxfp4", "wo", 128, tiles[0][2])
    res2 = mt.run_row("mxfp4", "wo", 16, 64, 128, H100_SXM, args, compile_errors={key: "OutOfResources: smem"})
    bad = next(c for c in res2["cands"] if c["label"] == tiles[0][0])
    assert bad["error"].startswith("OutOfResources") and "FAILED" in mt.row_line(res2)
    assert mt.rules([res, res2])[0].startswith("# --- rules")


def test_mx_tiles_rules_from_rows():
    """The rules block turns measured rows into MX_BF16_* lines: the tile class with the best geomean
    per (format, mode, M), the programs-per-SM target, the dequantize + cuBLAS crossover."""
    mt = _load("sweeps/mx_tiles.py")
    from blockscaled.plan import portable as pp

    pps = pp.MX_BF16_PROGRAMS_PER_SM
    a, b = (mt.tile_label(t) for t in mt.TILE_CLASSES[16][:2])
    rows = []
    for m, tile_us, dq in ((16, (10.0, 12.0), 50.0), (64, (30.0, 31.0), 60.0), (2048, (900.0, 950.0), 700.0)):
        for n, k in ((2880, 2880), (7168, 16384)):
            cands = [{"label": f"{a}/pps{pps}", "aliases": [f"{a}/pps1"], "kind": "tile", "ok": True, "us": tile_us[1]},
                     {"label": f"{b}/pps{pps}", "aliases": [], "kind": "tile", "ok": True, "us": tile_us[0]},
                     {"label": f"{a}/pps4", "aliases": [], "kind": "tile", "ok": True, "us": tile_us[0] * 0.9},
                     {"label": "dequant", "kind": "dequant", "ok": True, "us": dq},
                     {"label": "broken", "kind": "tile", "error": "OutOfResources"}]
            if m != 16:
                cands = [dict(c, label=c["label"].replace(a, mt.tile_label(mt.TILE_CLASSES[m][0])).replace(
                    b, mt.tile_label(mt.TILE_CLASSES[m][1])), aliases=[]) for c in cands if "pps4" not in c["label"]]
            rows.append({"fmt": "mxfp4", "mode": "wo", "m": m, "n": n, "k": k, "floor_us": 5.0, "cands": cands})
    text = "\n".join(mt.rules(rows))
    assert f"('mxfp4', 'wo', 16): {mt.TILE_CLASSES[16][1]!r}," in text, text
    assert f"('mxfp4', 'wo', 64): {mt.TILE_CLASSES[64][1]!r}," in text, text
    assert "('mxfp4', 'wo', 2048)" not in text  # above MX_BF16_M_MAX: not a tile rule
    assert "MX_BF16_PROGRAMS_PER_SM = 4" in text, text
    assert "MX_BF16_DEQUANT_M[('mxfp4', 'wo')] = 2048" in text, text
    best, plan, *_ = mt.summarize_row(rows[0])
    assert best["us"] == 9.0 and plan is None and "FAILED: broken" in mt.row_line(rows[0])


# ------------------------------------------------------------------------- mx_decode.py
def test_mx_decode_lists_its_cases_for_an_h100():
    # the GEMV is the planner's choice only with the experimental switch (blockscaled._experimental)
    r = _run_py("sweeps/mx_decode.py", "--list", "--quick", extra_env={"BLOCKSCALED_MX_KERNELS": "gemv"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "54 cases" in r.stdout, r.stdout[-300:]
    blocks = r.stdout.split("\nmx")
    m1 = next(b for b in blocks if b.startswith("fp4 wo  2880x2880 M=1 "))
    assert re.search(r"^  plan +gemv(_gluon)? 8 weight rows", m1, flags=re.M) and re.search(r"^  portable +portable ", m1, flags=re.M)
    assert re.search(r"^  g1x4/4096/w4 +gemv 4 weight rows", m1, flags=re.M)  # the grid
    m16 = next(b for b in blocks if b.startswith("fp4 wxa 28672x8192 M=16 "))
    assert re.search(r"^  plan +portable ", m16, flags=re.M) and re.search(r"^  gemv +gemv ", m16, flags=re.M)
    r = _run_py("sweeps/mx_decode.py", "--shapes", "2880x2880", "--ms", "1")
    assert r.returncode == 2 and "no CUDA device" in r.stderr


def test_mx_decode_grid_tiles():
    mx = _load("sweeps/mx_decode.py")
    from blockscaled.plan import H100_SXM
    from blockscaled.plan.mx_gemv import mx_gemv_config

    base = mx_gemv_config("mxfp4", 1, 2880, 2880, H100_SXM)
    full, quick = mx.grid_configs(base, False), mx.grid_configs(base, True)
    assert base not in full and len(set(full)) == len(full) and set(quick) <= set(full)
    assert [(c.block_n, c.num_warps, c.block_k) for c in full] == [(4, 4, 4096), (8, 2, 2048), (8, 8, 8192),
                                                                  (8, 4, 8192)]
    assert quick == full[:1]
    assert mx.parse_shapes("2880x2880,5120X17920") == ((2880, 2880), (5120, 17920))


@_CPU_INTERPRETER_ONLY
def test_mx_decode_smoke_run():
    """The whole measuring path (operands, checks against the reference, timing, host cost) on the
    CPU through Triton's interpreter, one tiny shape."""
    r = _run_py("sweeps/mx_decode.py", "--smoke", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "smoke run done: 2 cases, 0 failed variants" in r.stdout
    assert "bs.linear(x, w, weight_only=True)" in r.stdout


# ------------------------------------------------------------------------- compile_time.py
def test_compile_time_report_verdicts():
    ct = _load("sweeps/compile_time.py")
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


@_CPU_INTERPRETER_ONLY
def test_compile_time_smoke(tmp_path):
    """Parent/child plumbing end to end in the interpreter (two processes, tiny shapes), with the
    --warmup phase (bs.warmup of the dense layers and an experts module, then first calls)."""
    out = tmp_path / "ct.json"
    r = subprocess.run([sys.executable, os.path.join(SWEEPS, "compile_time.py"), "--smoke", "--warmup", "--out",
                        str(out)],
                       capture_output=True, text=True, env=_env(), timeout=300)
    assert "cold :" in r.stdout and "warm :" in r.stdout, r.stdout + r.stderr
    import json

    data = json.loads(out.read_text())
    assert data["smoke"] and [x["label"] for x in data["runs"]] == ["cold", "warm"]
    assert all(len(x["calls"]) == 2 and x["library_s"] > 0 for x in data["runs"])
    assert all(len(x["experts_calls"]) == 2 and x["phases"]["warmup"] > 0 for x in data["runs"])
    assert "after bs.warmup the first calls built" in r.stdout


def test_validate_plans_judges_records_made_before_new_config_fields():
    """A sweep record's candidate key written before ``GemmConfig`` gained ``dequant_a`` / ``maxnreg`` names
    the same config as today's key (the fields take their defaults), so the report judges that shape
    instead of counting the plan as untimed."""
    import json

    from blockscaled.bench.plan_sweep import config_key
    from blockscaled.config.gemm import GemmConfig

    vp = _load("checks/validate_plans.py")
    cfg = GemmConfig(strategy="gemv", block_m=1, block_n=2, block_k=4096, num_warps=4, num_stages=1)
    old = json.loads(config_key(cfg))
    old.pop("dequant_a"), old.pop("maxnreg")
    assert vp._canonical(json.dumps(old, sort_keys=True)) == config_key(cfg)


def test_validate_plans_report_judges_tunes_choice_on_the_device_named(tmp_path, capsys):
    """``report --device h200`` re-plans for the H200 and judges a record's ``tuned`` config (what
    ``run --tune`` stores) on the sweep's own timings."""
    import json

    from blockscaled.plan import H200_SXM, Problem
    from blockscaled.plan.dense import ranked_candidates
    from blockscaled.plan.encoding import config_key

    vp = _load("checks/validate_plans.py")
    p = Problem("gemm", "fp8_block", 128, 4096, 7168)
    ranked = [c for _, c in ranked_candidates(p, H200_SXM)]
    cands = [{"key": config_key(c), "desc": str(i), "ok": True, "us": 10.0 + i} for i, c in enumerate(ranked)]
    cands[2]["us"] = 5.0  # the third-ranked is fastest: the model's pick is 2x, tune's choice 1x
    rec = {"set": "family", "family": "f", "layer": "l", "m": 128, "n": 4096, "k": 7168, "planned": cands[0]["key"],
           "cands": cands, "tuned": cands[2]["key"], "tuned_top": 6}
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    assert vp.report([str(path)], None, False, "h200") == 0
    out = capsys.readouterr().out
    assert "(h200: 1 shapes recorded, 1 judged)" in out
    assert "within 5% of the best candidate: 0/1" in out
    assert "blockscaled.tune's choice (top 6 timed apart, judged on the sweep's timings): 1/1" in out


def test_validate_plans_confirmation(tmp_path, capsys):
    """``confirm_pair`` picks the sweep's fastest other candidate within 25 % of the planned one (none when the
    planned was not timed or the gap is larger); the report judges a shape with a ``confirm`` re-timing on it
    (here the sweep's single timings put the planned one 1.2x off, the head-to-head 1.02x: within 5 %)."""
    import json

    from blockscaled.bench.plan_sweep import confirm_pair
    from blockscaled.plan import H100_SXM, Problem
    from blockscaled.plan.dense import ranked_candidates
    from blockscaled.plan.encoding import config_key

    assert confirm_pair("a", [{"key": "a", "ok": True, "us": 12.0}, {"key": "b", "ok": True, "us": 10.0},
                              {"key": "c", "ok": True, "us": 11.0}, {"key": "d", "ok": False, "us": 1.0}]) == "b"
    assert confirm_pair("a", [{"key": "a", "ok": True, "us": 13.0}, {"key": "b", "ok": True, "us": 10.0}]) is None
    assert confirm_pair("a", [{"key": "a", "ok": True}, {"key": "b", "ok": True, "us": 10.0}]) is None
    assert confirm_pair("a", [{"key": "a", "ok": True, "us": 9.0}, {"key": "b", "ok": True, "us": 10.0}]) == "b"
    vp = _load("checks/validate_plans.py")
    p = Problem("gemm", "fp8_block", 128, 4096, 7168)
    ranked = [c for _, c in ranked_candidates(p, H100_SXM)][:4]
    cands = [{"key": config_key(c), "desc": str(i), "ok": True, "us": 12.0 + i} for i, c in enumerate(ranked)]
    cands[1]["us"] = 10.0
    rec = {"set": "family", "family": "f", "layer": "l", "m": 128, "n": 4096, "k": 7168, "planned": cands[0]["key"],
           "cands": cands, "confirm": {cands[0]["key"]: 10.2, cands[1]["key"]: 10.0}, "confirm_rounds": 5}
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    assert vp.report([str(path)], None, True, "h100") == 0
    out = capsys.readouterr().out
    assert "within 5% of the best candidate: 1/1" in out, out
    assert "re-timing (5 interleaved rounds)" in out and "by the sweep's single timing 0/1, after the re-timing 1/1" in out


def test_validate_plans_report_noise_floor_and_residuals(tmp_path, capsys):
    """A shape recorded in two runs gives the noise floor (the first run's fastest candidate judged by
    the second's timings); ``--residuals`` adds measured / predicted per tile, M band and output-row
    alignment."""
    import json

    from blockscaled.plan import H100_SXM, Problem
    from blockscaled.plan.dense import ranked_candidates
    from blockscaled.plan.encoding import config_key

    vp = _load("checks/validate_plans.py")
    p = Problem("gemm", "fp8_block", 128, 4096, 7168)
    ranked = [c for _, c in ranked_candidates(p, H100_SXM)][:4]
    paths = []
    for run, fastest in enumerate((1, 2)):  # run 0: candidate 1 fastest; run 1: candidate 2, 1 at 1.2x
        cands = [{"key": config_key(c), "desc": str(i), "ok": True, "us": 10.0 + i} for i, c in enumerate(ranked)]
        cands[fastest]["us"] = 5.0
        if run == 1:
            cands[1]["us"] = 6.0
        rec = {"set": "family", "family": "f", "layer": "l", "m": 128, "n": 4096, "k": 7168, "planned": cands[0]["key"],
               "cands": cands}
        paths.append(tmp_path / f"s{run}.jsonl")
        paths[-1].write_text(json.dumps(rec) + "\n")
    assert vp.report([str(x) for x in paths], None, False, "h100", show_residuals=True) == 0
    out = capsys.readouterr().out
    assert "noise floor: 1 shapes timed in two runs" in out and "within 5% on 0/1" in out and "worst 1.200" in out
    assert "## Model residuals (measured / predicted)" in out
    assert "| M<=128 | aligned |" in out
