"""Runs cases: makes inputs, times our ops and the baselines, checks correctness, makes rows.

One row per measurement (tidy): ``(case, format, op, impl)`` with its time, throughput,
roofline percentages, correctness and the environment. Library ops are imported lazily; a
missing op gives one line ``op not available: <reason>`` and the run goes on.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import json
import os
import tempfile
import time
import zlib
from dataclasses import dataclass, replace
from typing import Callable

import torch

from ..formats import get_format
from ..plan import observe_plans
from ..reference.quantize import dequantize as deq
from ..reference.quantize import quantize as ref_quantize
from ..testing.compare import bitwise_equal
from ..testing.tolerances import gemm_tolerance
from . import counting, layers, model_suite, mx
from .baselines import GemmInputs, GroupedInputs, SwigluInputs, baselines_for
from .env import environment, has_cuda
from .suites import ALLOWED_OPS, DEFAULT_OPS, Case
from .timing import combine_rounds, rotation_count, time_eager_wall, time_op

__all__ = ["RunConfig", "Runner", "measure_roofline", "rel_error", "OP_SOURCES"]

#: our op -> (module, function)
OP_SOURCES = {
    "quantize": ("blockscaled.ops.quantize", "quantize"),
    "gemm": ("blockscaled.ops.gemm", "gemm"),
    "linear": ("blockscaled.ops.linear", "linear"),
    "grouped": ("blockscaled.ops.grouped", "grouped_gemm"),
    "swiglu": ("blockscaled.ops.swiglu", "swiglu"),
}

@dataclass
class RunConfig:
    formats: tuple[str, ...] | None = None  # None: the suite's defaults
    ops: tuple[str, ...] | None = None  # None: per case kind defaults
    baselines: tuple[str, ...] = ()
    out_dtype: torch.dtype = torch.bfloat16
    iterations: int = 100
    warmup: int = 10
    #: timed samples are split into this many rounds, interleaved over ours and the baselines of
    #: a case (round r of every implementation before round r + 1 of any); reported: the median
    #: over the rounds. The H100 drifted by up to 11% within a minute (benchmarks/NOTES.md
    #: 2026-11-23, "The H100's run-to-run noise"): timing ours and then the baselines once each put
    #: that drift into the ratio.
    rounds: int = 3
    correctness: bool = True
    timing: bool = True  # False: correctness only (CPU / interpreter)
    use_graph: bool = True
    profiler_trace: str | None = None
    seed: int = 0
    log: Callable[[str], None] = print


def rel_error(y: torch.Tensor, ref: torch.Tensor) -> tuple[float, int, float]:
    """(relative Frobenius error ``|y - ref|_F / |ref|_F``, number of non-finite outputs,
    normalised max error ``max|y - ref| / max|ref|``), in float64 on ``ref``'s device
    (``ref`` is float64). Same metrics as :func:`blockscaled.testing.tolerances.gemm_errors`."""
    yd = y.double()
    bad = int((~torch.isfinite(yd)).sum())
    d = torch.nan_to_num(yd, nan=0.0, posinf=0.0, neginf=0.0) - ref
    if ref.numel() == 0:
        return 0.0, bad, 0.0
    den, num = float(torch.linalg.vector_norm(ref)), float(torch.linalg.vector_norm(d))
    rmax, dmax = float(ref.abs().max()), float(d.abs().max())
    fro = num / den if den > 0 else num
    nmax = dmax / rmax if rmax > 0 else dmax
    return fro, bad, nmax


def tolerance(fmt: str, out_dtype: torch.dtype) -> tuple[float, float]:
    """(rel_fro, norm_max) limits from the one tolerance table (blockscaled.testing.tolerances).
    The same limits on the CPU: the interpreter
    rounds bf16 outputs to nearest like the GPU (``kernels/triton/_interp.py::cast_out``; it
    truncated before, which doubled the error), so a CPU bench run would flag that coming back
    (measured: <= 2.1e-3 rel_fro on the default CPU run against the 4e-3 bf16 limit)."""
    t = gemm_tolerance(fmt, out_dtype)
    return t.rel_fro, t.norm_max


def measure_roofline(iterations: int = 20, log=print) -> dict:
    """Same-run roofline: device copy bandwidth and cuBLAS bf16 / FP8 tensorwise at 8192^3."""
    out: dict = {}
    if not has_cuda():
        return out
    dev = "cuda"
    n = 256 * 2**20  # 256 MiB per buffer, well over L2
    src = torch.empty(n, dtype=torch.uint8, device=dev).random_(0, 255)
    dst = torch.empty_like(src)
    t = time_op(lambda s, d: d.copy_(s), [(src, dst)], warmup=3, iterations=iterations)
    out["copy_gbps"] = 2 * n / (t.median_ms * 1e-3) / 1e9
    del src, dst
    s = 8192
    a = torch.randn(s, s, device=dev, dtype=torch.bfloat16)
    b = torch.randn(s, s, device=dev, dtype=torch.bfloat16)
    t = time_op(lambda x, y: torch.matmul(x, y.t()), [(a, b)], warmup=3, iterations=iterations)
    out["bf16_tflops"] = 2 * s**3 / (t.median_ms * 1e-3) / 1e12
    try:
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        one = torch.ones((), device=dev)
        t = time_op(lambda x, y: torch._scaled_mm(x, y.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                    [(a8, b8)], warmup=3, iterations=iterations)
        out["fp8_tflops"] = 2 * s**3 / (t.median_ms * 1e-3) / 1e12
    except Exception as e:
        log(f"roofline: FP8 peak not measured ({type(e).__name__}: {str(e)[:80]})")
    torch.cuda.empty_cache()
    return out


def _clone_q(q):
    gs = q.global_scale
    return replace(q, data=q.data.clone(), scale=q.scale.clone(), global_scale=None if gs is None else gs.clone())


def _accepts(fn, name: str) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return name in sig.parameters or any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())


class Runner:
    def __init__(self, cfg: RunConfig, roofline: dict | None = None):
        self.cfg = cfg
        self.roofline = roofline or {}
        self.rows: list[dict] = []
        self.notes: list[str] = []
        self._ops: dict[str, Callable | str] = {}
        self._noted: set[str] = set()
        self._trace_events: list = []
        self._pending: list = []  # timing jobs of the current case (_measure -> _time_pending)
        #: the current case's timing profile (run_case sets it): also time eager wall clock per
        #: call (time_eager_wall), and let graphs of slow calls hold one call per input copy
        self._eager = False
        self._adaptive = False
        self.device = "cuda" if has_cuda() else "cpu"
        self.env = environment()

    # ------------------------------------------------------------------ helpers
    def note(self, msg: str) -> None:
        if msg not in self._noted:
            self._noted.add(msg)
            self.notes.append(msg)
            self.cfg.log(msg)

    def op(self, name: str) -> Callable | None:
        if name not in self._ops:
            mod, fn = OP_SOURCES[name]
            try:
                self._ops[name] = getattr(importlib.import_module(mod), fn)
            except Exception as e:  # ImportError/AttributeError, or a kernel that fails at import
                self._ops[name] = f"{mod}.{fn}: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        v = self._ops[name]
        if isinstance(v, str):
            self.note(f"op not available: {v}")
            return None
        return v

    def _quantize_inputs(self, x, fmt, block=None):
        """Quantize with our op when it is there, else with the reference (inputs only). On the
        CPU always the reference: it is bit-identical to our op (the quantize rows check that),
        and our op in the Triton interpreter made ~70% of the default CPU bench's time."""
        q = self.op("quantize") if self.device != "cpu" else None
        try:
            if q is not None:
                return q(x, fmt, block=block)
        except Exception:
            pass
        return ref_quantize(x, fmt, block=block)

    def _randn(self, *shape, seed, outliers=True, dtype=torch.bfloat16, scale=1.0):
        """Random non-zero inputs made on the device (fast for GB-sized MoE weights): N(0,1)
        with, for activations, ~1/64 outlier channels x20 and a per-row spread of binades
        (as :func:`blockscaled.testing.inputs.randn_like_activations`)."""
        g = torch.Generator(device=self.device)
        g.manual_seed(seed)
        x = torch.randn(*shape, generator=g, device=self.device, dtype=torch.float32)
        if outliers and x.numel() and shape[-1] > 1:
            k = shape[-1]
            chans = torch.randint(0, k, (max(1, k // 64),), generator=g, device=self.device)
            x[..., chans] *= 20.0
            rows = torch.randint(-6, 6, (*shape[:-1], 1), generator=g, device=self.device).float()
            x = x * torch.exp2(rows)
        return (x * scale).to(dtype)

    def _n_sets(self, bytes_per_set: int) -> int:
        return rotation_count(bytes_per_set) if (self.cfg.timing and has_cuda()) else 1

    def _base_row(self, case: Case, fmt: str, op: str, impl: str) -> dict:
        row = {
            "suite": case.suite, "case": case.name, "kind": case.kind, "op": op, "impl": impl, "format": fmt,
            "M": case.m, "N": case.n, "K": case.k, "E": case.experts or "",
            "ms": ",".join(map(str, case.ms)), "out_dtype": str(self.cfg.out_dtype).replace("torch.", ""),
            "status": "ok", "note": "", "tags": ",".join(case.tags),
        }
        if case.requested:  # a CPU run: the case the user asked for, which this one stands in for
            row["requested"] = case.requested
        return row

    def _finish_row(self, row: dict, count: counting.Count, timing, fmt: str) -> dict:
        row["flops"] = count.flops
        row["bytes"] = count.bytes
        if timing is not None:
            row.update(timing.asdict())
            ms = timing.median_ms
            row["tflops"] = count.tflops(ms) if count.flops else None
            row["gbps"] = count.gbps(ms)
            rl = self.roofline
            bw = rl.get("copy_gbps")
            if bw:
                row["mem_floor_us"] = count.bytes / (bw * 1e9) * 1e6
                row["mem_floor_pct"] = 100.0 * row["mem_floor_us"] / (ms * 1e3)
            # e4m3 formats can run on FP8 tensor cores; fp4 formats are dequantized into bf16 MMAs on Hopper.
            peak = rl.get("fp8_tflops") if get_format(fmt.split()[0]).elem == "e4m3" else rl.get("bf16_tflops")
            if peak and count.flops:
                row["compute_pct"] = 100.0 * row["tflops"] / peak
            parts = [row.get("mem_floor_pct"), row.get("compute_pct")]
            parts = [p for p in parts if p is not None]
            if parts:
                row["roof_pct"] = max(parts)
        row.update({k: v for k, v in self.env.items()})
        return row

    # ------------------------------------------------------------------ timing / profiling
    def _time(self, fn, arg_sets, best_of_eager=False, iterations=None, budget_ms=2000.0):
        if not self.cfg.timing:
            return None
        iterations = iterations or self.cfg.iterations
        t = time_op(fn, arg_sets, warmup=self.cfg.warmup, iterations=iterations, use_graph=self.cfg.use_graph,
                    budget_ms=budget_ms, adaptive_reps=self._adaptive)
        if best_of_eager and t.method == "graph":
            te = time_op(fn, arg_sets, warmup=2, iterations=iterations, use_graph=False, budget_ms=budget_ms)
            if te.median_ms < t.median_ms:
                t = te
        return t

    def _time_eager(self, fn, arg_sets, iterations, budget_ms):
        """Eager wall clock per call (:func:`~blockscaled.bench.timing.time_eager_wall`)."""
        return time_eager_wall(fn, arg_sets, warmup=max(1, min(self.cfg.warmup, 5)), iterations=iterations,
                               budget_ms=budget_ms)

    def _error_row(self, row: dict, fmt: str, e: Exception) -> None:
        """Mark ``row`` failed with the exception's first line, log it, let the device settle."""
        row["status"] = "error"
        row["note"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        self.cfg.log(f"  {row['impl']} {row['op']} {fmt} {row['case']}: {row['note']}")
        if has_cuda():
            torch.cuda.synchronize()

    def _time_pending(self) -> None:
        """Time the jobs ``_measure`` queued for this case in ``cfg.rounds`` interleaved rounds of
        ceil(iterations / rounds) samples (at least 5) and 1/rounds of time_op's time budget
        each, the job order reversed on odd rounds (a steady drift then does not favour the
        implementation timed first), then finish their rows in queue order. An interrupt
        (the bench's time limit: SIGTERM -> KeyboardInterrupt) still finishes every row, with the
        rounds measured so far or untimed with note "interrupted"."""
        jobs, self._pending = self._pending, []
        rounds = max(1, self.cfg.rounds)
        per_round = max(5, -(-self.cfg.iterations // rounds)) if rounds > 1 else self.cfg.iterations
        results: list[list] = [[] for _ in jobs]
        eager: list[list] = [[] for _ in jobs]
        try:
            for r in range(rounds):
                order = range(len(jobs)) if r % 2 == 0 else reversed(range(len(jobs)))
                for j in order:
                    row, fn, arg_sets, count, fmt, best_of_eager, first_ms, wall = jobs[j]
                    if row["status"] != "ok":
                        continue
                    try:
                        results[j].append(self._time(fn, arg_sets, best_of_eager, per_round, 2000.0 / rounds))
                        if wall:
                            eager[j].append(self._time_eager(fn, arg_sets, per_round, 2000.0 / rounds))
                    except Exception as e:  # keep going: one failing op must not stop a sweep
                        self._error_row(row, fmt, e)
        finally:
            for (row, fn, arg_sets, count, fmt, best_of_eager, first_ms, wall), ts, es in zip(jobs, results, eager):
                te = combine_rounds(es, first_ms) if row["status"] == "ok" else None
                if te is not None:  # the eager wall clock per call, beside the graph timing
                    row.update(eager_ms=te.median_ms, eager_p20_ms=te.p20_ms, eager_p80_ms=te.p80_ms)
                timing = combine_rounds(ts, first_ms) if row["status"] == "ok" else None
                if timing is None:
                    row["first_call_ms"] = first_ms
                    if row["status"] == "ok":
                        row["note"] = (row.get("note") or "") + "interrupted: not timed"
                else:
                    row["rounds"] = len(ts)
                self.rows.append(self._finish_row(row, count, timing, fmt))

    def _profile(self, label: str, fn, args):
        if not self.cfg.profiler_trace:
            return
        from torch.profiler import ProfilerActivity, profile, record_function

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if has_cuda() else [])
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.json")
            with profile(activities=acts) as prof:
                for _ in range(3):
                    with record_function(label):
                        fn(*args)
                if has_cuda():
                    torch.cuda.synchronize()
            prof.export_chrome_trace(path)
            with open(path) as f:
                self._trace_events += json.load(f).get("traceEvents", [])

    def write_trace(self) -> str | None:
        path = self.cfg.profiler_trace
        if not path:
            return None
        with open(path, "w") as f:
            json.dump({"traceEvents": self._trace_events, "displayTimeUnit": "ms"}, f)
        return path

    # ------------------------------------------------------------------ measuring one thing
    def _measure(self, case, fmt, op, impl, fn, arg_sets, count, check=None, best_of_eager=False):
        """Run ``fn`` (ours or a baseline): first call and correctness on set 0 now; the timing
        is queued and run with the case's other implementations, interleaved in rounds
        (``_time_pending``, called at the end of ``run_case``), which appends the row."""
        row = self._base_row(case, fmt, op, impl)
        try:
            if has_cuda():
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with observe_plans() as plans:
                out = fn(*arg_sets[0])  # the very first call: compile / autotune / first launch
            if impl == "blockscaled":
                # the config column: the plans this call ran, as the planner made them
                row["config"] = "; ".join(dict.fromkeys(p.describe() for p in plans))
            if has_cuda():
                torch.cuda.synchronize()
            first_ms = (time.perf_counter() - t0) * 1e3
            if check is not None and self.cfg.correctness:
                check(row, out)
            del out
            shape = f"M={case.m},N={case.n},K={case.k}" + (f",E={case.experts}" if case.experts else "")
            tile = row.get("config") or ""
            self._profile(f"{impl}:{op}:{fmt}:{shape}" + (f":tile={tile}" if tile else ""), fn, arg_sets[0])
        except Exception as e:  # keep going: one failing op must not stop a sweep
            self._error_row(row, fmt, e)
        if row["status"] == "ok" and self.cfg.timing:
            self._pending.append((row, fn, arg_sets, count, fmt, best_of_eager, first_ms, self._eager))
        else:  # untimed (CPU: the interpreter's wall clock says nothing about a GPU, so none is kept)
            self.rows.append(self._finish_row(row, count, None, fmt))

    def _check_close(self, fmt, ref_fn, limits: tuple[float, float] | None = None):
        """A row check against the float64 ``ref_fn()``: the GEMM tolerance of ``fmt``, or
        ``limits`` (rel_fro, norm_max) where the op is more than one GEMM (bench/layers.py)."""
        lim_fro, lim_max = limits or tolerance(fmt, self.cfg.out_dtype)

        def check(row, out):
            err, bad, nmax = rel_error(out, ref_fn())
            row["rel_err"] = err
            row["norm_max_err"] = nmax
            row["nonfinite"] = bad
            row["check"] = "ok" if (err <= lim_fro and nmax <= lim_max and bad == 0) else "FAIL"
            row["tol"] = f"rel_fro<={lim_fro:.1e}, norm_max<={lim_max:.1e}"

        return check

    def _baselines(self, case, fmt, op, inputs: list, count, check=None):
        for b in baselines_for(op, self.cfg.baselines):
            why = b.unavailable(case, fmt)
            if why is not None:
                if not why.startswith("not a ") and " not supported (only " not in why:  # expected: silent
                    self.note(f"baseline {b.name} skipped for {op}/{fmt}: {why}")
                continue
            try:
                sets = [b.prepare(inp) for inp in inputs]
            except Exception as e:
                self.note(f"baseline {b.name} skipped for {op}/{fmt}: prepare failed: {type(e).__name__}: {str(e)[:100]}")
                continue
            self._measure(case, fmt, op, b.name, b.run, sets, count, check, best_of_eager=b.best_of_eager_and_graph)

    # ------------------------------------------------------------------ cases
    def ops_for(self, case: Case) -> tuple[str, ...]:
        if self.cfg.ops is None:
            return DEFAULT_OPS[case.kind]
        return tuple(o for o in self.cfg.ops if o in ALLOWED_OPS[case.kind])

    def run_case(self, case: Case, fmt: str) -> None:
        seed = self.cfg.seed + zlib.crc32(f"{case.name}/{fmt}".encode()) % 10_000  # stable across runs
        ops = self.ops_for(case)
        if not ops:
            return
        # MX suite cases (bench/mx.py): eager wall clock timed too, slow calls graphed one per copy
        self._eager = self._adaptive = case.kind in ("mx", "mx-moe", "moe-layer", "model")
        if case.kind in ("gemm", "quantize"):
            self._run_dense(case, fmt, ops, seed)
        elif case.kind == "mx":
            mx.run_dense(self, case, fmt, ops, seed)
        elif case.kind == "mx-moe":
            mx.run_moe(self, case, fmt, ops, seed)
        elif case.kind == "moe-layer":
            layers.run_moe_layer(self, case, fmt, ops, seed)
        elif case.kind == "model":
            model_suite.run_model(self, case, fmt, ops, seed)
        elif case.kind in ("grouped", "masked"):
            self._run_grouped(case, fmt, ops, seed)
        elif case.kind == "swiglu":
            self._run_swiglu(case, fmt, ops, seed)
        self._time_pending()
        if has_cuda():
            torch.cuda.empty_cache()

    def _act_dtype(self):
        return self.cfg.out_dtype if self.cfg.out_dtype in (torch.bfloat16, torch.float16) else torch.bfloat16

    # (Ops are bound into the lambdas handed to _measure as default arguments: their timing runs
    # at the end of the case, after later ops have rebound the local names.)
    def _run_dense(self, case: Case, fmt: str, ops, seed: int) -> None:
        m, n, k = case.m, case.n, case.k
        dt = self.cfg.out_dtype
        x0 = self._randn(m, k, seed=seed, dtype=self._act_dtype())
        qa0 = self._quantize_inputs(x0, fmt)
        need_w = case.kind == "gemm" and any(o in ops for o in ("gemm", "linear", "swiglu"))
        if need_w:
            w0 = self._randn(n, k, seed=seed + 1, outliers=False, scale=0.05)
            qb0 = self._quantize_inputs(w0, fmt, block=counting.weight_block(fmt))
            per_set = qa0.nbytes() + qb0.nbytes() + x0.numel() * x0.element_size()
        else:
            w0 = qb0 = None
            per_set = x0.numel() * x0.element_size() + qa0.nbytes()
        n_sets = self._n_sets(per_set)
        xs = [x0] + [x0.clone() for _ in range(n_sets - 1)]
        qas = [qa0] + [_clone_q(qa0) for _ in range(n_sets - 1)]
        qbs = [qb0] + [_clone_q(qb0) for _ in range(n_sets - 1)] if need_w else [None] * n_sets
        inputs = [GemmInputs(x, qa, qb, dt) for x, qa, qb in zip(xs, qas, qbs)]

        if "quantize" in ops:
            f = self.op("quantize")
            count = counting.quantize_count(fmt, (m, k), x0.dtype)
            if f is not None:
                def check_q(row, out, x=x0):
                    ref = ref_quantize(x, fmt)
                    ok = bitwise_equal(out.data, ref.data) and bitwise_equal(out.scale, ref.scale)
                    row["check"] = "bitwise" if ok else "FAIL"
                    row["rel_err"] = 0.0 if ok else rel_error(deq(out), deq(ref).double())[0]

                self._measure(case, fmt, "quantize", "blockscaled", lambda x, f=f: f(x, fmt), [(x,) for x in xs], count, check_q)
                if fmt == "nvfp4":
                    # Serving engines quantize nvfp4 activations with a calibrated (static) global
                    # scale: one pass over x. The row above computes gs on the fly (amax pass +
                    # quantize pass, two reads of x, bytes counted once).
                    gss = [qa.global_scale for qa in qas]

                    def check_gs(row, out, x=x0, gs=gss[0]):
                        ref = ref_quantize(x, fmt, global_scale=gs.cpu() if x.device.type == "cpu" else gs)
                        ok = bitwise_equal(out.data, ref.data) and bitwise_equal(out.scale, ref.scale)
                        row["check"] = "bitwise" if ok else "FAIL"

                    self._measure(case, "nvfp4 static-gs", "quantize", "blockscaled",
                                  lambda x, gs, f=f: f(x, fmt, global_scale=gs), list(zip(xs, gss)), count, check_gs)
            self._baselines(case, fmt, "quantize", inputs, count)

        if not need_w:
            return
        ref_cache: dict = {}

        def ref_gemm():
            if "y" not in ref_cache:
                ref_cache["y"] = deq(qa0).double() @ deq(qb0).double().T
            return ref_cache["y"]

        if "gemm" in ops:
            f = self.op("gemm")
            count = counting.gemm_count(m, n, k, fmt, fmt, dt)
            if f is not None:
                self._measure(case, fmt, "gemm", "blockscaled", lambda a, b, f=f: f(a, b, out_dtype=dt),
                              [(i.qa, i.qb) for i in inputs], count, self._check_close(fmt, ref_gemm))
            self._baselines(case, fmt, "gemm", inputs, count)

        if "linear" in ops:
            f = self.op("linear")
            count = counting.linear_count(m, n, k, fmt, x0.dtype, x0.dtype)
            if f is not None:
                def ref_linear():
                    return deq(ref_quantize(x0, fmt)).double() @ deq(qb0).double().T

                # out_dtype given: linear's default is bf16 whatever x is (--dtype float16 / float32
                # would check a bf16 output against the fp16 / fp32 limits)
                kw = {"out_dtype": dt} if _accepts(f, "out_dtype") else {}
                self._measure(case, fmt, "linear", "blockscaled", lambda x, w, f=f, kw=kw: f(x, w, **kw),
                              [(i.x, i.qb) for i in inputs], count, self._check_close(fmt, ref_linear))
            self._baselines(case, fmt, "linear", inputs, count)

        if "swiglu" in ops:
            u0 = self._randn(n, k, seed=seed + 2, outliers=False, scale=0.05)
            qu0 = self._quantize_inputs(u0, fmt, block=counting.weight_block(fmt))
            sw = [SwigluInputs(i.x, i.qa, i.qb, qu0 if j == 0 else _clone_q(qu0), dt) for j, i in enumerate(inputs)]
            self._swiglu_measure(case, fmt, sw)

    def _swiglu_measure(self, case, fmt, sw: list) -> None:
        m, n, k = case.m, case.n, case.k
        dt = self.cfg.out_dtype
        count = counting.swiglu_count(m, n, k, fmt, dt)
        f = self.op("swiglu")
        if f is not None:
            s0 = sw[0]

            def ref():
                a = deq(s0.qa).double()
                g = a @ deq(s0.qg).double().T
                return torch.nn.functional.silu(g) * (a @ deq(s0.qu).double().T)

            kw = {"out_dtype": dt} if _accepts(f, "out_dtype") else {}
            self._measure(case, fmt, "swiglu", "blockscaled", lambda a, g, u, f=f: f(a, g, u, **kw),
                          [(s.qa, s.qg, s.qu) for s in sw], count, self._check_close(fmt, ref))
        self._baselines(case, fmt, "swiglu", sw, count)

    def _run_swiglu(self, case: Case, fmt: str, ops, seed: int) -> None:
        m, n, k = case.m, case.n, case.k
        x0 = self._randn(m, k, seed=seed, dtype=self._act_dtype())
        qa0 = self._quantize_inputs(x0, fmt)
        wb = counting.weight_block(fmt)
        qg0 = self._quantize_inputs(self._randn(n, k, seed=seed + 1, outliers=False, scale=0.05), fmt, block=wb)
        qu0 = self._quantize_inputs(self._randn(n, k, seed=seed + 2, outliers=False, scale=0.05), fmt, block=wb)
        n_sets = self._n_sets(qa0.nbytes() + qg0.nbytes() + qu0.nbytes())
        sw = [SwigluInputs(x0, qa0, qg0, qu0, self.cfg.out_dtype)]
        sw += [SwigluInputs(x0, _clone_q(qa0), _clone_q(qg0), _clone_q(qu0), self.cfg.out_dtype) for _ in range(n_sets - 1)]
        if "swiglu" in ops:
            self._swiglu_measure(case, fmt, sw)

    def _run_grouped(self, case: Case, fmt: str, ops, seed: int) -> None:
        if "grouped" not in ops:
            return
        e, n, k = case.experts, case.n, case.k
        ms = case.ms
        dt = self.cfg.out_dtype
        masked = case.kind == "masked"
        if masked:
            x0 = self._randn(e, case.m, k, seed=seed, dtype=self._act_dtype())
        else:
            x0 = self._randn(sum(ms), k, seed=seed, dtype=self._act_dtype())
        qa0 = self._quantize_inputs(x0, fmt)
        w0 = self._randn(e, n, k, seed=seed + 1, outliers=False, scale=0.05)
        qb0 = self._quantize_inputs(w0, fmt, block=counting.weight_block(fmt))
        del w0
        offs = torch.tensor([0] + list(itertools.accumulate(ms)), dtype=torch.int32, device=self.device)
        counts = torch.tensor(ms, dtype=torch.int32, device=self.device)
        n_sets = self._n_sets(qa0.nbytes() + qb0.nbytes())
        inputs = [GroupedInputs(x0, qa0, qb0, offs, counts, ms, masked, dt)]
        inputs += [GroupedInputs(x0, _clone_q(qa0), _clone_q(qb0), offs.clone(), counts.clone(), ms, masked, dt)
                   for _ in range(n_sets - 1)]
        count = counting.grouped_count(ms, n, k, fmt, dt)
        f = self.op("grouped")
        if f is not None:
            kw = {"out_dtype": dt} if _accepts(f, "out_dtype") else {}

            def ref():
                a = deq(qa0).double()
                outs = []
                for i, mi in enumerate(ms):
                    b = deq(_index_q(qb0, i)).double()
                    if masked:
                        outs.append(a[i, :mi] @ b.T)
                    else:
                        s = int(offs[i])
                        outs.append(a[s:s + mi] @ b.T)
                return torch.cat(outs) if outs else torch.zeros(0, n, dtype=torch.float64)

            check = self._check_close(fmt, ref)

            def check_valid(row, out):  # masked: only rows below each count are defined
                if masked:
                    out = torch.cat([out[i, :mi] for i, mi in enumerate(ms)])
                check(row, out)

            if masked:
                # typical rows per expert as a host hint (DeepGEMM's expected_m): tile choice only
                kw_m = dict(kw, expected_m=max(1, round(sum(ms) / max(len(ms), 1))))
                fn = lambda a, b, c: f(a, b, masked_m=c, **kw_m)  # noqa: E731
                sets = [(i.qa, i.qb, i.counts) for i in inputs]
            else:
                fn = lambda a, b, o: f(a, b, offsets=o, **kw)  # noqa: E731
                sets = [(i.qa, i.qb, i.offsets) for i in inputs]
            self._measure(case, fmt, "grouped", "blockscaled", fn, sets, count, check_valid)
        self._baselines(case, fmt, "grouped", inputs, count)


def _index_q(q, i: int):
    """Expert ``i`` of a batched ``[E, N, K]`` ScaledTensor as an ``[N, K]`` ScaledTensor."""
    return replace(q, data=q.data[i], scale=q.scale[i], shape=torch.Size(q.shape[1:]))
