"""The one timing helper of the bench.

Method (docs/design.md, "Measuring"):
  * first call timed apart (wall clock, synchronised): compile / autotune / first-launch cost;
  * ``warmup`` untimed calls;
  * inputs rotated over ``n_sets`` copies so the working set exceeds 2x the L2 size (read
    from the device; 50 MB default), so no run hits data a previous run left in L2;
  * CUDA graph of ``reps_per_graph`` calls (cycling over the input copies) replayed
    ``iterations`` times, each replay bracketed by CUDA events: per-call time = replay time /
    calls. Graphs remove the Python launch overhead that would otherwise dominate 5-20 us
    kernels. If capture fails (an op that syncs or allocates unsafely), CUDA events around
    each eager call are used instead and the row says ``method=events``.
  * reported: median, p20 and p80 over the replays / calls, and min.

:func:`time_eager_wall` times what an eager caller pays instead: the wall clock of back-to-back
calls (host work and launches included, no graph), one synchronisation per sample.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import torch

from .env import l2_bytes

__all__ = ["Timing", "time_op", "time_eager_wall", "rotation_count", "quantiles", "combine_rounds"]


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    min_ms: float
    first_call_ms: float  # compile + first launch, wall clock
    runs: int
    method: str  # "graph" | "events"
    n_sets: int  # input copies rotated

    def asdict(self) -> dict:
        return asdict(self)


def quantiles(xs: Sequence[float]) -> tuple[float, float, float, float]:
    """(median, p20, p80, min) of ``xs`` (linear interpolation)."""
    s = sorted(xs)
    if not s:
        nan = float("nan")
        return nan, nan, nan, nan

    def q(p: float) -> float:
        pos = p * (len(s) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    return statistics.median(s), q(0.2), q(0.8), s[0]


def combine_rounds(timings: Sequence[Timing], first_call_ms: float) -> Timing | None:
    """One Timing from the rounds of an interleaved measurement (the bench's ``--rounds``):
    median / p20 / p80 = the medians over the rounds of each round's value (one slow round,
    e.g. a clock dip while this implementation was timed, moves none of them), min = the
    smallest, runs = the samples of all rounds; method "graph" only if every round was graphed;
    None for no rounds."""
    ts = [t for t in timings if t is not None]
    if not ts:
        return None
    med = statistics.median
    method = "graph" if all(t.method == "graph" for t in ts) else "events"
    return Timing(med([t.median_ms for t in ts]), med([t.p20_ms for t in ts]), med([t.p80_ms for t in ts]),
                  min(t.min_ms for t in ts), first_call_ms, sum(t.runs for t in ts), method, ts[0].n_sets)


def rotation_count(bytes_per_set: int, l2: int | None = None, max_sets: int = 64) -> int:
    """Number of input copies so that all copies together exceed 2x L2 (at least 1)."""
    l2 = l2_bytes() if l2 is None else l2
    if bytes_per_set <= 0:
        return 1
    return max(1, min(max_sets, -(-2 * l2 // bytes_per_set)))


def _cap(iterations: int, sample_ms: float, budget_ms: float) -> int:
    if sample_ms <= 0:
        return iterations
    return max(min(5, iterations), min(iterations, int(budget_ms / sample_ms)))


#: graph length (ms of calls) above which ``adaptive_reps`` captures one call per input copy:
#: samples stay >= ~1 ms either way (CUDA-event resolution ~0.5 us), not measured beyond that
ADAPTIVE_GRAPH_MS = 2.0


def _sync():
    torch.cuda.synchronize()


def _first_and_warmup(fn, arg_sets, warmup: int) -> tuple[float, float]:
    """Run the first call alone (its wall time, ms: compiles, allocations) and ``warmup`` more
    (their mean wall time per call, ms; the first call's if none)."""
    n_sets = len(arg_sets)
    _sync()
    t0 = time.perf_counter()
    fn(*arg_sets[0])
    _sync()
    first_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    for i in range(warmup):
        fn(*arg_sets[i % n_sets])
    _sync()
    return first_ms, ((time.perf_counter() - t0) * 1e3 / warmup if warmup else first_ms)


def time_op(
    fn: Callable,
    arg_sets: Sequence[tuple],
    *,
    warmup: int = 10,
    iterations: int = 100,
    use_graph: bool = True,
    reps_per_graph: int | None = None,
    budget_ms: float = 2000.0,
    adaptive_reps: bool = False,
) -> Timing:
    """Time ``fn(*arg_sets[i % len(arg_sets)])`` on the current CUDA device (see module doc).

    ``arg_sets``: rotated input copies (make them with :func:`rotation_count` copies).
    ``iterations``: number of timed samples (graph replays or eager calls); lowered (to no
    fewer than 5) when the samples would take more than ``budget_ms`` in total, so that a slow
    baseline (e.g. the eager torch reference quantizer on 300M elements) cannot eat a sweep's
    time budget. ``adaptive_reps`` (with ``reps_per_graph`` None): a graph holds one call per
    input copy instead of at least 10 when 10 calls would take over ``ADAPTIVE_GRAPH_MS``
    (per-call time from the warm-up), so that a 10 ms call costs ~1/10 of the samples' time."""
    if not torch.cuda.is_available():
        raise RuntimeError("timings need CUDA")
    n_sets = len(arg_sets)
    first_ms, per_call_ms = _first_and_warmup(fn, arg_sets, warmup)
    iterations = _cap(iterations, per_call_ms, budget_ms)
    if adaptive_reps and reps_per_graph is None and per_call_ms * max(n_sets, 10) > ADAPTIVE_GRAPH_MS:
        reps_per_graph = n_sets

    if use_graph:
        try:
            return _time_graph(fn, arg_sets, iterations, reps_per_graph, first_ms, budget_ms)
        except Exception:  # capture not possible for this fn: fall back to eager + events
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
    return _time_events(fn, arg_sets, iterations, first_ms)


def _time_events(fn, arg_sets, iterations, first_ms) -> Timing:
    n_sets = len(arg_sets)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    for i in range(iterations):
        args = arg_sets[i % n_sets]
        starts[i].record()
        fn(*args)
        ends[i].record()
    _sync()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    med, p20, p80, mn = quantiles(times)
    return Timing(med, p20, p80, mn, first_ms, iterations, "events", n_sets)


def _time_graph(fn, arg_sets, iterations, reps_per_graph, first_ms, budget_ms) -> Timing:
    n_sets = len(arg_sets)
    reps = reps_per_graph or max(n_sets, 10)
    reps = -(-reps // n_sets) * n_sets  # every input copy equally often
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm the side stream (allocator pools) before capture
        for i in range(n_sets):
            fn(*arg_sets[i])
    torch.cuda.current_stream().wait_stream(stream)
    _sync()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fn(*arg_sets[i % n_sets])
    g.replay()
    _sync()
    # Keep each sample >= ~1 ms so event resolution (~0.5 us) does not matter.
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    g.replay()
    t1.record()
    _sync()
    one = t0.elapsed_time(t1)
    inner = max(1, min(50, int(1.0 / max(one, 1e-3))))
    iterations = _cap(iterations, one * inner, budget_ms)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    for i in range(iterations):
        starts[i].record()
        for _ in range(inner):
            g.replay()
        ends[i].record()
    _sync()
    times = [s.elapsed_time(e) / (inner * reps) for s, e in zip(starts, ends)]
    del g
    med, p20, p80, mn = quantiles(times)
    return Timing(med, p20, p80, mn, first_ms, iterations, "graph", n_sets)


def time_eager_wall(fn: Callable, arg_sets: Sequence[tuple], *, warmup: int = 3, iterations: int = 20,
                    budget_ms: float = 2000.0, sample_ms: float = 1.0) -> Timing:
    """Eager per-call wall time of ``fn`` on the current CUDA device: each sample runs ``inner``
    back-to-back calls (inputs rotated as in :func:`time_op`) and synchronises once; the time
    per call is the sample's wall clock / ``inner``, with ``inner`` chosen from the warm-up so
    that a sample lasts >= ``sample_ms`` (at most 200 calls). Host-bound calls (decode sizes)
    measure the host path, GPU-bound ones the kernels with launch overheads hidden behind them:
    what a model running eagerly pays per call. ``method`` is ``"eager"``."""
    if not torch.cuda.is_available():
        raise RuntimeError("timings need CUDA")
    n_sets = len(arg_sets)
    first_ms, per_call_ms = _first_and_warmup(fn, arg_sets, warmup)
    inner = max(1, min(200, int(sample_ms / max(per_call_ms, 1e-4))))
    iterations = _cap(iterations, per_call_ms * inner, budget_ms)
    times = []
    j = 0
    for _ in range(iterations):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn(*arg_sets[j % n_sets])
            j += 1
        _sync()
        times.append((time.perf_counter() - t0) * 1e3 / inner)
    med, p20, p80, mn = quantiles(times)
    return Timing(med, p20, p80, mn, first_ms, iterations, "eager", n_sets)
