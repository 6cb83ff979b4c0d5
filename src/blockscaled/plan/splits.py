"""How a requested K split becomes launched K ranges (shared by the planner and the launchers)."""

from __future__ import annotations

__all__ = ["split_plan", "split_plan_kb", "split_counts", "saturation_split", "cdiv"]


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints (not triton.cdiv: a @jit function, ~10x slower to call from the host)."""
    return -(-a // b)


_cdiv = cdiv


def split_plan(k: int, bk: int, split_k: int) -> tuple[int, int]:
    """(splits launched, K elements per split) for ``split_k`` requested splits of K in chunks of
    ``bk``. Each split covers whole chunks; the count is lowered so that no split is empty (5
    chunks in 4 splits -> 3 splits of 2, 2, 1). K = 0: one split (the epilogue still writes zeros
    + bias)."""
    kiters = _cdiv(k, bk)
    if split_k <= 1 or kiters <= 1:
        return 1, max(kiters, 1) * bk
    per = _cdiv(kiters, min(split_k, kiters)) * bk
    return _cdiv(k, per), per


def split_plan_kb(num_k: int, split_k: int) -> tuple[int, int]:
    """:func:`split_plan` in 128-wide K blocks: (splits launched, K blocks per split).
    9 blocks in 3 -> 3, 3, 3; 5 in 2 -> 3, 2; 5 in 4 -> 3 splits of 2, 2, 1."""
    splits, per = split_plan(num_k * 128, 128, split_k)
    return splits, per // 128


def split_counts(kiters: int, max_split: int):
    """The distinct split counts launched for requests 1..max_split over ``kiters`` chunks,
    ascending (a request whose plan equals a smaller one's is skipped)."""
    for want in range(1, max_split + 1):
        per = _cdiv(kiters, want)
        if _cdiv(kiters, per) == want:
            yield want


def saturation_split(units: int, chunks: int, slots: int, sm_count: int, fixed_steps: float, per_sm: float,
                     min_steps: int, max_split: int) -> tuple[int, float]:
    """(K split, its cost in 128-K step units) of a grid of ``units`` programs per split over
    ``chunks`` K steps, on ``sm_count`` SMs that hold ``slots`` programs at once: each program runs at
    its own latency-bound pace until ``per_sm`` share an SM, past which the SM's issue rate limits,
    and past the resident slots a partial round costs a whole program. Cost of split s:
    ``(steps per split + fixed_steps) x max(ceil(units x s / slots), ceil(units x s / sm_count) /
    per_sm)``; the smallest s at the minimum among the launched counts (``split_counts``) with at
    least ``min_steps`` steps each (split 1 always a candidate). The register-streaming kernel's
    split (plan/direct.py) and the grouped streaming kernels' (plan/stream.py) are this model with
    their own constants."""
    best, best_t = 1, None
    for s in split_counts(chunks, max_split):
        per = _cdiv(chunks, s)
        if s > 1 and per < min_steps:
            continue
        progs = units * s
        t = (per + fixed_steps) * max(_cdiv(progs, slots), _cdiv(progs, sm_count) / per_sm)
        if best_t is None or t < best_t - 1e-9:
            best, best_t = s, t
    return best, best_t
