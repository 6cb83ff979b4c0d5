"""``blockscaled bench``: time block-scaled quantize / GEMM / linear / grouped / SwiGLU ops
against cuBLAS, Triton and DeepGEMM baselines on the same inputs, with correctness checks.

Examples::

    blockscaled bench                                  # test cases small, medium, large
    blockscaled bench --test-cases small --use-profiler
    blockscaled bench --custom 512,1024,2048 --custom 1,7168,2048 --formats mxfp8,nvfp4
    blockscaled bench --suite deepseek --output ds.json --plot ds.png
    blockscaled bench --suite moe --iterations 30 --save-results benchmarks/results
    python -m blockscaled.bench --suite quantize
    blockscaled bench --suite mx --iterations 15 --warmup 2   # issue 18's MX/NV suite and its targets
    blockscaled bench --suite moe-layer,model                  # issue 20: MoE layers and model tokens/s vs bf16

Without a CUDA GPU it runs the correctness part of the chosen suites through the Triton
interpreter (which needs numpy): no timings, no GPU facts, no plot, no profiler trace. Cases
too big for the interpreter run as small stand-ins; each one is listed as requested -> ran
(``--full-shapes`` runs them as requested). The default command finishes in well under a minute
on 2 cores. Exit code: 0 when every correctness check of ours passed, 1 when one failed or one
of our ops raised (``--strict``: a baseline too), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import shlex
import signal
import sys
import time

from . import baselines, suites
from .baselines import BASELINE_NAMES
from .env import environment, has_cuda
from .plot import has_plot_data, plot_results
from .report import CPU_MODE_LINE, print_report, save_results_dir, write_results
from .runner import RunConfig, Runner, measure_roofline
from .workers import run_in_processes
from ..tune import tune

__all__ = ["main", "build_parser", "parse_args", "select_cases"]

TEST_CASE_NAMES = ("small", "medium", "large")
SUITE_NAMES = ("deepseek", "families", "moe", "masked", "nvfp4-group", "dual-gemm", "quantize", "mx", "moe-layer", "model")
OP_NAMES = ("quantize", "gemm", "linear", "grouped", "swiglu", "weight-only", "moe", "moe-weight-only", "prefill",
            "decode", "generate", "packed", "packed-linear")
FORMAT_NAMES = ("fp8_block", "mxfp8", "mxfp4", "nvfp4")
DTYPES = ("bfloat16", "float16", "float32")


def _mnk(text: str) -> tuple[int, int, int]:
    parts = text.split(",")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"expected M,N,K (three comma-separated integers), got {text!r}")
    try:
        m, n, k = (int(p.strip()) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected M,N,K as integers, got {text!r}") from None
    if m < 0 or n <= 0 or k <= 0:
        raise argparse.ArgumentTypeError(f"expected M >= 0 and N, K > 0, got {text!r}")
    return m, n, k


def _choices_list(allowed: tuple[str, ...], what: str, extra: tuple[str, ...] = ()):
    def parse(text: str) -> tuple[str, ...]:
        items = tuple(t.strip() for t in text.split(",") if t.strip())
        bad = [t for t in items if t not in allowed + extra]
        if not items or bad:
            raise argparse.ArgumentTypeError(
                f"invalid {what} {', '.join(map(repr, bad)) or repr(text)}; choose from {', '.join(allowed + extra)}"
            )
        return items

    return parse


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _nonneg(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="blockscaled bench",
        description="Profile blockscaled ops against cuBLAS / Triton / DeepGEMM on the same inputs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Ratios in A/B tables are baseline time / blockscaled time (> 1: blockscaled faster).",
    )
    g = p.add_argument_group("what to run")
    g.add_argument("--test-cases", type=_choices_list(TEST_CASE_NAMES, "test case", ("all",)), default=None,
                   metavar="small|medium|large|all",
                   help="comma-separated test-case sets (default small,medium,large when no --suite/--custom)")
    g.add_argument("--custom", type=_mnk, action="append", default=[], metavar="M,N,K",
                   help="a custom GEMM shape; repeatable")
    g.add_argument("--suite", type=_choices_list(SUITE_NAMES, "suite"), action="append", default=[],
                   metavar="|".join(SUITE_NAMES), help="named suite(s), comma-separated or repeated")
    g.add_argument("--formats", type=_choices_list(FORMAT_NAMES, "format"), default=None,
                   metavar=",".join(FORMAT_NAMES), help="formats to run (default: per suite)")
    g.add_argument("--ops", type=_choices_list(OP_NAMES, "op"), default=None, metavar="|".join(OP_NAMES),
                   help="ops to run (default: quantize,gemm,linear for GEMM cases; grouped / swiglu for MoE / dual-GEMM suites)")
    g.add_argument("--baselines", type=_choices_list(BASELINE_NAMES, "baseline", ("all", "none")), default=("all",),
                   metavar="all|none|" + ",".join(BASELINE_NAMES), help="baselines to run (default all available)")
    g.add_argument("--deepseek-small-m", action="store_true", help="deepseek suite: also M in {1, 16}")
    g.add_argument("--limit", type=_positive, default=None, help="run only the first N cases (quick looks)")
    g.add_argument("--skip", type=_nonneg, default=0,
                   help="leave out the first N cases of each suite (with --limit: a suite run in parts)")
    g.add_argument("--full-shapes", action="store_true",
                   help="without a GPU: run the requested shapes as given instead of small stand-ins "
                        "(slow: the interpreter needs minutes once M, N, K reach the hundreds); no effect on a GPU")
    t = p.add_argument_group("how to time")
    t.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="output dtype (default bfloat16)")
    t.add_argument("--iterations", type=_positive, default=100, help="timed samples per measurement (default 100)")
    t.add_argument("--warmup", type=_nonneg, default=10, help="untimed calls before timing (default 10)")
    t.add_argument("--rounds", type=_positive, default=3,
                   help="split the samples into this many rounds, interleaved over ours and the baselines of "
                        "each case; report the median over the rounds (default 3: GPU clocks drift within a "
                        "minute, and one implementation timed during a dip would move the ratio)")
    t.add_argument("--no-graph", action="store_true", help="time eager calls with CUDA events, no CUDA-graph replay")
    t.add_argument("--no-correctness", action="store_true", help="skip the float64 reference checks")
    t.add_argument("--no-roofline", action="store_true", help="skip measuring copy BW and cuBLAS peaks")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--tune", type=_positive, default=None, metavar="TOP",
                   help="first run blockscaled.tune on the dense fp8_block cases (the planner's TOP best "
                        "candidates timed, the fastest kept), so the rows time the tuned plans (GPU only)")
    o = p.add_argument_group("output")
    o.add_argument("--use-profiler", action="store_true",
                   help="write a torch.profiler Chrome trace (kernels named by shape) to --trace-file")
    o.add_argument("--trace-file", default="blockscaled_trace.json", help="Chrome trace path (default %(default)s)")
    o.add_argument("--output", default=None, metavar="FILE.json|FILE.csv|FILE.md", help="write results (tidy rows)")
    o.add_argument("--plot", default=None, metavar="FILE.png", help="roofline + A/B ratio charts")
    o.add_argument("--save-results", default=None, metavar="DIR",
                   help="also append the run to DIR/<gpu>/runs.jsonl and rewrite DIR/<gpu>/latest/<suite>.md "
                        "(e.g. benchmarks/results; --plot stays a file of its own)")
    o.add_argument("--strict", action="store_true",
                   help="also exit 1 when a baseline errors (a failing check or an error of ours always does)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":  # `blockscaled bench ...` (console script) == `python -m blockscaled.bench ...`
        argv = argv[1:]
    p = build_parser()
    a = p.parse_args(argv)
    a.suite = tuple(dict.fromkeys(s for group in a.suite for s in group))
    if a.output and not a.output.endswith((".json", ".csv", ".md")):
        p.error(f"--output: expected a .json, .csv or .md file name, got {a.output!r}")
    if a.plot and not a.plot.endswith(".png"):
        p.error(f"--plot: expected a .png file name, got {a.plot!r}")
    if a.baselines == ("none",):
        a.baselines = ()
    elif "all" in a.baselines:
        a.baselines = BASELINE_NAMES
    return a


def select_cases(a: argparse.Namespace):
    """[(suite label, [Case])] in run order."""
    out = []
    tc = a.test_cases
    if tc is None and not a.suite and not a.custom:
        tc = TEST_CASE_NAMES
    if tc:
        names = TEST_CASE_NAMES if "all" in tc else tuple(n for n in TEST_CASE_NAMES if n in tc)
        out.append(("test-cases", suites.test_case_suite(list(names))))
    if a.custom:
        out.append(("custom", suites.custom_cases(a.custom)))
    for s in a.suite:
        out.append((s, suites.get_suite(s, deepseek_small_m=a.deepseek_small_m)))
    if a.skip or a.limit:
        out = [(s, cs[a.skip:][: a.limit]) for s, cs in out]
    return out


def _ensure_interpreter(argv_given: bool) -> None:
    """No GPU: kernels must run in the Triton interpreter, which has to be chosen before any
    @triton.jit kernel is defined. Re-exec ourselves with TRITON_INTERPRET=1 when run as a
    command; when called in-process (tests) just set it (conftest sets it first anyway)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    os.environ["TRITON_INTERPRET"] = "1"
    kernels_loaded = any(m.startswith("blockscaled.kernels") for m in sys.modules)
    if kernels_loaded and not argv_given:
        os.execv(sys.executable, [sys.executable, "-m", "blockscaled.bench", *sys.argv[1:]])


def _missing_interpreter_deps() -> str | None:
    """Why the Triton interpreter cannot run here (a missing numpy), or None. The interpreter
    imports numpy only when a kernel first runs, so without this check the CPU bench would die
    in the middle of Triton with a bare ModuleNotFoundError."""
    try:
        import numpy  # noqa: F401
    except ImportError as e:
        req = "numpy"
        try:  # the range this install declares (pyproject), e.g. "numpy<2.3,>=1.26"
            from importlib.metadata import requires

            req = next((r.split(";")[0].strip() for r in requires("blockscaled") or []
                        if r.replace(" ", "").lower().startswith("numpy")), req)
        except Exception:
            pass
        return (f"blockscaled bench: no CUDA GPU here, so the kernels run in the Triton interpreter, which needs "
                f"numpy ({type(e).__name__}: {e}). Install it: pip install '{req}'")
    return None


def _check_counts(rows: list[dict], notes: list[str]) -> dict:
    """Tally of our rows: checks passed / failed, ops that raised, ops not importable."""
    ours = [r for r in rows if r["impl"] == "blockscaled"]
    return {
        "passed": sum(r.get("check") in ("ok", "bitwise") for r in ours),
        "failed": sum(r.get("check") == "FAIL" for r in ours),
        "errors": sum(r.get("status") == "error" for r in ours),
        "unchecked": sum(r.get("status") == "ok" and r.get("check") is None for r in ours),
        "missing_ops": sum(n.startswith("op not available") for n in notes),
        "baseline_errors": sum(r.get("status") == "error" for r in rows if r["impl"] != "blockscaled"),
    }


def _tune_cases(jobs, top: int, out_dtype_name: str) -> str:
    """``--tune``: compile the dense fp8_block cases' top candidates in parallel processes, then
    ``blockscaled.tune`` them in this process (the plans the rows then run and report)."""
    shapes = list(dict.fromkeys((c.m, c.n, c.k) for _, c, f in jobs
                                if f == "fp8_block" and c.kind == "gemm" and min(c.m, c.n, c.k) > 0))
    if not shapes:
        return "--tune: no dense fp8_block case to tune"
    if out_dtype_name != "bfloat16":
        return f"--tune: skipped (tuned plans are for bf16 outputs; this run's --dtype is {out_dtype_name})"
    t0 = time.perf_counter()
    run_in_processes("blockscaled.tune", "compile_worker", [[m, n, k, top] for m, n, k in shapes],
                     min(14, os.cpu_count() or 1))
    t1 = time.perf_counter()
    try:
        rep = tune(shapes, top=top, save="")
    except ValueError as exc:  # not an sm_90 GPU with the Gluon kernels: nothing the cost model plans
        return f"--tune: skipped ({exc})"
    changed = sum(1 for r in rep.rows if r[3] != r[5])
    return (f"--tune {top}: {len(rep.rows)} dense fp8_block problems tuned (compile {t1 - t0:.0f} s in processes, "
            f"timing {rep.seconds:.0f} s); the tuned plan differs from the cost model's on {changed}")


def main(argv: list[str] | None = None) -> int:
    t_start = time.perf_counter()
    a = parse_args(argv)
    import torch

    cuda = has_cuda()
    if not cuda:
        why = _missing_interpreter_deps()
        if why:
            print(why, file=sys.stderr)
            return 1
        _ensure_interpreter(argv is not None)
        # Known noise, not ours: triton 3.6's interpreter turns 1-element arrays into ints with
        # int(ndarray), which numpy >= 1.25 deprecates (hidden by Python's default filters, shown
        # under -W default / PYTHONWARNINGS). Triton 3.7 and later do not do it.
        import warnings

        warnings.filterwarnings("ignore", message="Conversion of an array with ndim > 0 to a scalar",
                                category=DeprecationWarning, module="triton.runtime.interpreter")
        # Known noise of our SwiGLU epilogue under numpy: silu(g) = g / (1 + exp(-g)) overflows
        # exp for g < -88 and gives the right limit (-0); the GPU computes the same inf silently.
        warnings.filterwarnings("ignore", message="overflow encountered in exp", category=RuntimeWarning,
                                module="triton.runtime.interpreter")
    if cuda and a.plot:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:  # say so now, not after a long sweep
            print("blockscaled bench: --plot needs matplotlib: pip install 'blockscaled[plot]' (or matplotlib)",
                  file=sys.stderr)
            return 2

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.markup import escape

    console = Console()
    if not console.is_terminal:  # logs / CI: wide enough for the A/B tables
        console = Console(width=180)
    dtype = getattr(torch, a.dtype)
    plan = select_cases(a)
    env = environment()
    shapes = []
    if cuda:
        console.print(f"GPU: {env['gpu']}   CUDA: {env['cuda']}   torch: {env['torch']}   triton: {env['triton']}   git: {env['git_rev']}")
    else:
        plan = [(s, suites.for_interpreter(cs, full=a.full_shapes)) for s, cs in plan]
        shapes = [{"suite": s, "requested": c.requested, "ran": c.name, "scaled": c.requested != c.name}
                  for s, cs in plan for c in cs]
        console.print(f"[yellow]no CUDA GPU found[/yellow] - {escape(CPU_MODE_LINE)}")
        console.print(f"CPU: {env['cpu']}   torch: {env['torch']}   triton: {env['triton']}   git: {env['git_rev']}")
        n_scaled = sum(x["scaled"] for x in shapes)
        if n_scaled:
            console.print(f"shapes: {n_scaled} of {len(shapes)} cases run scaled down, because {suites.INTERPRETER_REASON} "
                          "(--full-shapes runs them as requested):", highlight=False)
        for x in shapes:
            how = f"-> ran {x['ran']}" if x["scaled"] else "(ran as requested)"
            console.print(f"  [{x['suite']}] requested {x['requested']} {how}", markup=False, highlight=False)
        if a.use_profiler:
            console.print("--use-profiler: skipped: its trace shows GPU kernels, and without a GPU the kernels run "
                          "in the Triton interpreter, whose profile says nothing about them (no trace written)")

    roofline = {}
    if cuda and not a.no_roofline:
        console.print("measuring the roofline (copy bandwidth, cuBLAS bf16 and FP8 at 8192^3) ...")
        roofline = measure_roofline(iterations=min(a.iterations, 30), log=console.print)

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, transient=True, disable=not console.is_terminal)
    profile = a.use_profiler and cuda
    cfg = RunConfig(
        formats=a.formats, ops=a.ops, baselines=tuple(a.baselines) if cuda else (), out_dtype=dtype,
        iterations=a.iterations, warmup=a.warmup, rounds=a.rounds, correctness=not a.no_correctness, timing=cuda,
        use_graph=not a.no_graph, profiler_trace=a.trace_file if profile else None, seed=a.seed,
        log=lambda m: progress.console.print(m),
    )
    runner = Runner(cfg, roofline)
    jobs = []
    for suite, cases in plan:
        fmts = a.formats or suites.DEFAULT_FORMATS.get(suite, suites.DEFAULT_FORMATS["test-cases"])
        jobs += [(suite, c, f) for c in cases for f in fmts if not c.formats or f in c.formats]
    if "deepgemm" in cfg.baselines and (a.ops is None or "gemm" in a.ops or "linear" in a.ops):
        note = baselines.prewarm_deepgemm(baselines.deepgemm_shapes([(c, f) for _, c, f in jobs]),
                                          min(14, os.cpu_count() or 1))
        if note:
            console.print(note)
            runner.note(note)
    if a.tune:
        note = _tune_cases(jobs, a.tune, a.dtype) if cuda else "--tune: skipped (no CUDA GPU: nothing to time)"
        console.print(note)
        runner.note(note)
    # SIGTERM (e.g. `timeout`) ends the sweep early but still reports and writes what was measured.
    def _term(signum, frame):
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, _term)
    done = 0
    try:
        with progress:
            task = progress.add_task("bench", total=len(jobs))
            for suite, case, fmt in jobs:
                progress.update(task, description=f"{suite}: {case.name} {fmt}")
                if not progress.console.is_terminal:
                    console.print(f"[{suite}] {case.name} {fmt}", markup=False, highlight=False)
                runner.run_case(case, fmt)
                done += 1
                progress.advance(task)
    except KeyboardInterrupt:
        runner.note(f"interrupted: {done} of {len(jobs)} (case, format) jobs measured; the rest were not run")
    finally:
        signal.signal(signal.SIGTERM, old_term)

    result = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "blockscaled bench " + " ".join(shlex.quote(x) for x in (sys.argv[1:] if argv is None else argv)),
        "args": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(a).items()},
        "env": env,
        "roofline": roofline,
        "timing": cuda,
        "notes": runner.notes,
        "rows": runner.rows,
    }
    if not cuda:  # what this correctness-only run is, said in the file itself
        result["mode"] = CPU_MODE_LINE
        result["shapes"] = shapes
        result["shapes_reason"] = suites.INTERPRETER_REASON if any(x["scaled"] for x in shapes) else ""
    print_report(result, console)
    if profile:
        console.print(f"Chrome trace: {runner.write_trace()} (open in chrome://tracing or ui.perfetto.dev)")
    if a.output:
        write_results(result, a.output)
        console.print(f"results: {a.output}")
    if a.save_results:
        label = "+".join(s for s, _ in plan) or "bench"
        md, runs = save_results_dir(result, a.save_results, label)
        console.print(f"saved: run appended to {runs}; summary {md}")
    if a.plot:
        if has_plot_data(result):
            console.print(f"plot: {plot_results(result, a.plot)}")
        else:
            why = "a CPU run times nothing" if not cuda else "no op was timed"
            console.print(f"plot: skipped, nothing to draw ({why}); {a.plot} not written")

    c = _check_counts(runner.rows, runner.notes)
    bad = c["failed"] + c["errors"] + c["missing_ops"] + (c["baseline_errors"] if a.strict else 0)
    parts = [f"{c['passed']} checks passed", f"{c['failed']} failed", f"{c['errors']} errors"]
    if c["missing_ops"]:
        parts.append(f"{c['missing_ops']} ops not available")
    if a.strict and c["baseline_errors"]:
        parts.append(f"{c['baseline_errors']} baseline errors")
    if c["unchecked"]:
        parts.append(f"{c['unchecked']} unchecked" + (" (--no-correctness)" if a.no_correctness else ""))
    verdict = "[red]FAIL[/red]" if bad else "[green]PASS[/green]"
    where = "CPU, Triton interpreter, no timings" if not cuda else env.get("gpu", "GPU")
    console.print(f"{verdict}: {', '.join(parts)} over {done} of {len(jobs)} (case, format) jobs "
                  f"({escape(where)}; {time.perf_counter() - t_start:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
