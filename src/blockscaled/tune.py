"""``blockscaled.tune``: time the cost model's top candidates of dense fp8_block GEMMs on this GPU and
keep the fastest as the plan (plan/tuned.py says why and what is stored).

For each (M, N, K): random e4m3 operands with DeepSeek-style scales (1x128 activations, 128x128
weights; rotated copies past L2), the model's :data:`plan.tuned.TOP` best predicted candidates, each
run once and checked against the float64 reference on up to 32 sampled rows (a candidate outside
the GEMM tolerance is never chosen), then timed as CUDA-graph replays (the bench's
``time_op``). The fastest is stored; later ``gemm`` / ``linear`` calls of that exact problem run
it and ``explain`` says so.
"""

from __future__ import annotations

import datetime
import os
import statistics
import time
from dataclasses import dataclass, field

import torch

from .bench.timing import rotation_count, time_op
from .formats import get_format
from .ops.gemm import gemm, gemm_problem
from .ops._hopper import gluon_unavailable_reason
from .ops.quantize import quantize
from .plan import Plan, device_info
from .plan import tuned as _tuned
from .plan.dense import ranked_candidates
from .plan.encoding import config_key
from .reference.gemm import gemm as ref_gemm
from .tensor import ScaledTensor
from .testing.tolerances import gemm_errors, gemm_tolerance
from .warmup import quantized_weights

__all__ = ["tune", "TuneReport", "compile_worker", "time_candidates", "reference_rows", "random_operands", "choose", "TUNE_MARGIN",
           "TUNE_ROUNDS"]

#: the cost model's pick stays unless a timed candidate beats it by more than this: differences of a
#: few % are within the timing noise of back-to-back runs, and on the H100 families suite (bench runs
#: families with and without --tune, same machine, twenty-fourth session) 3 of 42 changed plans ran
#: 5-10 % slower than the model's pick at M = 8192 after tuning without it. Offline, on the sweeps'
#: timings, 3 % costs 2 of 449 H100 and 1 of 363 H200 shapes within 5 % of the best (437 -> 435, 353 -> 352).
TUNE_MARGIN = 0.03
#: interleaved timing rounds per candidate in ``tune`` (each candidate's time: the median of the rounds)
TUNE_ROUNDS = 2


@dataclass
class TuneReport:
    """One row per tuned problem: (M, N, K, chosen plan, its us, the model's pick, its us (None: it
    failed its check), timed)."""

    rows: list = field(default_factory=list)
    seconds: float = 0.0
    path: str | None = None

    def __str__(self) -> str:
        lines = [f"tuned {len(self.rows)} problems in {self.seconds:.1f} s"
                 + (f" (saved to {self.path})" if self.path else "")]
        for m, n, k, desc, us, model_desc, model_us, timed in self.rows:
            if desc == model_desc:
                gain = "the model's pick"
            elif model_us is None:
                gain = f"the model's pick ({model_desc}) failed its check"
            else:
                gain = f"{model_us / us:.2f}x the model's pick ({model_desc})"
            lines.append(f"  M={m} N={n} K={k}: {desc} {us:.1f} us, {gain}; {timed} timed")
        return "\n".join(lines)


def _shapes(target, ms) -> list[tuple[int, int, int]]:
    """(M, N, K) triples from a list of triples, or from fp8_block weights x ``ms`` (the layers
    ``warmup`` finds; weight-only and biased layers are left out: the cost model does not plan the
    first, and the second never takes the Hopper tiles the timed problem would)."""
    if isinstance(target, (ScaledTensor, torch.nn.Module)) or (
            isinstance(target, (list, tuple)) and target and all(isinstance(w, ScaledTensor) for w in target)):
        weights = [w for _, w, weight_only, bias in quantized_weights(target) if not weight_only and bias is None]
    else:
        out = []
        for i, s in enumerate(target):
            if not (isinstance(s, (tuple, list)) and len(s) == 3
                    and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in s)):
                raise ValueError(f"shapes[{i}]: expected (M, N, K) positive ints, got {s!r}")
            out.append(tuple(s))
        return out
    if ms is None:
        raise ValueError("ms: tuning weights needs the token counts M to tune for (e.g. ms=(1, 2, 4, 8, 16, 32)); "
                         "plans of other M stay the cost model's")
    out = []
    for w in weights:
        if get_format(w.format).name != "fp8_block" or tuple(w.block) != (128, 128):
            continue  # other formats and 1x128 weights are planned by measured rules, not the cost model
        out += [(int(m), w.shape[-2], w.shape[-1]) for m in ms]
    return sorted(set(out))


def random_operands(m: int, n: int, k: int, sets: int, device, seed: int) -> list:
    """``sets`` copies of (activations fp8_block 1x128 ``[m, k]``, weights fp8_block 128x128 ``[n, k]``,
    bf16 output ``[m, n]``) from seeded normal bf16 data (the timing rotates through them)."""
    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for _ in range(sets):
        x = torch.randn(m, k, generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
        w = torch.randn(n, k, generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
        out.append((quantize(x, "fp8_block"), quantize(w, "fp8_block", block=(128, 128)),
                    torch.empty(m, n, dtype=torch.bfloat16, device=device)))
    return out


def reference_rows(a: ScaledTensor, b: ScaledTensor, rows: torch.Tensor) -> torch.Tensor:
    """float64 ``dequantize(a)[rows] @ dequantize(b).T`` (the reference twin on those rows)."""
    sub = ScaledTensor(a.data[rows], a.scale[rows], a.format, torch.Size((len(rows), a.shape[-1])), a.block,
                       a.rounding)
    return ref_gemm(sub, b, out_dtype=torch.float64)


def time_candidates(ops: list, cfgs: list, *, iterations: int = 15, rounds: int = 1) -> list[dict]:
    """Run each config of ``cfgs`` on ``ops`` (rotated (a, b, out) sets), check it against the float64
    reference on up to 32 sampled rows, and time the correct ones in ``rounds`` interleaved rounds
    (every other round in reverse order, so that no config always runs first or after the heaviest;
    its time is the median of the rounds' medians). One dict per config: key, desc, ok, rel_fro,
    us (only when correct), or error."""
    a0, b0, o0 = ops[0]
    m = o0.shape[0]
    rows = torch.randperm(m, device=o0.device)[:32] if m > 32 else torch.arange(m, device=o0.device)
    ref = reference_rows(a0, b0, rows)
    tol = gemm_tolerance("fp8_block", o0.dtype)
    out = []
    for cfg in cfgs:
        entry = {"key": config_key(cfg), "desc": Plan("gemm", "cuda", cfg).describe()}
        try:
            o0.fill_(float("nan"))  # a candidate that writes nothing must not pass on another's output
            gemm(a0, b0, out=o0, config=cfg)
            rel, nmax = gemm_errors(o0[rows].double(), ref)
            entry.update(ok=bool(rel <= tol.rel_fro and nmax <= tol.norm_max), rel_fro=rel)
        except Exception as exc:  # a candidate that cannot run is reported, never chosen
            entry["error"] = f"{type(exc).__name__}: {exc}"[:300]
        out.append(entry)
    runs = [(cfg, e, []) for cfg, e in zip(cfgs, out) if e.get("ok")]
    for r in range(rounds):
        for cfg, entry, times in (runs if r % 2 == 0 else runs[::-1]):
            if "error" in entry:
                continue
            try:
                t = time_op(lambda a, b, o, c=cfg: gemm(a, b, out=o, config=c), ops, warmup=3,
                            iterations=iterations, budget_ms=400.0)
                times.append(t.median_ms * 1e3)
            except Exception as exc:  # noqa: BLE001 - reported, never chosen
                entry["error"] = f"{type(exc).__name__}: {exc}"[:300]
    for _, entry, times in runs:
        if times and "error" not in entry:
            entry["us"] = statistics.median(times)
    return out


def choose(timed: list[dict], model_key: str, margin: float = None) -> dict:
    """The entry ``tune`` keeps among the timed (correct) ones: the fastest, unless the cost model's
    pick (``model_key``) is within ``margin`` (default :data:`TUNE_MARGIN`) of it."""
    margin = TUNE_MARGIN if margin is None else margin
    best = min(timed, key=lambda e: e["us"])
    model = next((e for e in timed if e["key"] == model_key), None)
    return model if model is not None and model["us"] <= best["us"] * (1.0 + margin) else best


def _top_configs(ops, m: int, n: int, k: int, top: int, dev) -> tuple:
    """The Problem of ``ops``' first set and the cost model's ``top`` best configs for it."""
    a0, b0, o0 = ops[0]
    p = gemm_problem(a0.data, a0.scale, b0.data, 128, get_format("fp8_block"), k, m, n, torch.bfloat16, None, o0)
    if not _tuned.tunable(p, dev) or gluon_unavailable_reason() is not None:
        raise ValueError(f"tune: M={m} N={n} K={k} on {dev.name}: only dense fp8_block GEMMs on an sm_90 GPU "
                         f"with the Gluon kernels are planned by the cost model, so only they can be tuned")
    return p, [c for _, c in ranked_candidates(p, dev)[:top]]


def compile_worker(items: list) -> None:
    """One process of a parallel compile ahead of :func:`tune` (``bench.workers.run_in_processes``):
    runs each ``[m, n, k, top]`` item's top candidates once, so that Triton's on-disk cache holds them
    (``blockscaled bench --tune`` uses it: compiling one candidate after another would take most of
    a run)."""
    dev = device_info(torch.device("cuda"))
    for m, n, k, top in items:
        try:
            ops = random_operands(m, n, k, 1, "cuda", 0)
            a0, b0, o0 = ops[0]
            for cfg in _top_configs(ops, m, n, k, top, dev)[1]:
                gemm(a0, b0, out=o0, config=cfg)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - the timing process reports what cannot run
            print(f"compile {m}x{n}x{k}: {type(exc).__name__}: {exc}"[:300], flush=True)
        torch.cuda.empty_cache()


def tune(target, ms=None, *, top: int = _tuned.TOP, device=None, save: str | None = None,
         iterations: int = 15, seed: int = 0, log=None) -> TuneReport:
    """Time the cost model's ``top`` best candidates of each dense fp8_block GEMM on this GPU and make
    the fastest the plan of that problem (``gemm``, ``linear``, ``explain`` follow it).

    Args:
        target: (M, N, K) triples, or fp8_block weights with 128x128 blocks (a ScaledTensor
            ``[N, K]``, a list of them, or a module holding ``blockscaled.nn.Linear`` layers) with
            ``ms``.
        ms: token counts to tune each weight for (exact M: other M keep the cost model's plan).
        top: candidates timed per problem (the model's best predictions; its own pick is among them).
        device: the CUDA device (default: the current one).
        save: JSON file to merge the tuned plans into (default: ``$BLOCKSCALED_TUNED_PLANS`` if
            set); load it in another process with ``BLOCKSCALED_TUNED_PLANS=path`` or
            ``blockscaled.plan.tuned.load(path)``.
        iterations: timed samples per candidate (CUDA-graph replays, median).

    Only problems the cost model plans are tuned: fp8_block activations x fp8_block 128x128
    weights, bf16 output, on an sm_90 GPU whose Gluon kernels build; others raise ValueError.
    Each candidate compiles on first use (seconds each); a tuned problem costs ~0.1-1 s after that.

    Example::

        w = bs.quantize(W, "fp8_block", block=(128, 128))        # [N, K]
        print(bs.tune(w, ms=(1, 8, 64, 4096), save="tuned.json"))
        y = bs.linear(x, w)            # x with 1, 8, 64 or 4096 rows: the fastest timed plan runs
    """
    if not torch.cuda.is_available():
        raise RuntimeError("tune: timing the candidates needs a CUDA GPU; none is available")
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise ValueError(f"top: expected a positive int, got {top!r}")
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    dev = device_info(device)
    save = save if save is not None else _env_path()
    report = TuneReport(path=save)
    t0 = time.perf_counter()
    for m, n, k in _shapes(target, ms):
        sets = rotation_count(m * k + n * k + 2 * m * n, max_sets=8)
        ops = random_operands(m, n, k, sets, device, seed)
        p, cfgs = _top_configs(ops, m, n, k, top, dev)
        timed = [e for e in time_candidates(ops, cfgs, iterations=iterations, rounds=TUNE_ROUNDS) if "us" in e]
        if not timed:
            raise RuntimeError(f"tune: M={m} N={n} K={k}: no candidate ran within the tolerance")
        model_key = config_key(cfgs[0])
        best = choose(timed, model_key)
        model = next((e for e in timed if e["key"] == model_key), None)  # None: it failed its check
        _tuned.record(p, dev, dict(config=best["key"], us=best["us"], model_config=model_key,
                                   model_us=None if model is None else model["us"], timed=len(timed),
                                   date=datetime.date.today().isoformat()))
        report.rows.append((m, n, k, best["desc"], best["us"], Plan("gemm", "cuda", cfgs[0]).describe(),
                            None if model is None else model["us"], len(timed)))
        if log is not None:
            log(str(report).splitlines()[-1])
        del ops
        torch.cuda.empty_cache()
    if save:
        _tuned.save(save)
    report.seconds = time.perf_counter() - t0
    return report


def _env_path() -> str | None:
    return os.environ.get(_tuned.ENV) or None
