"""Tuned plans: where ``blockscaled.tune`` timed the cost model's top candidates on this GPU, the
planner runs the fastest of them (the model's own pick unless another beat it by more than
``tune.TUNE_MARGIN``).

Why: the cost model (plan/cost.py) picks a plan within 5 % of the best candidate on 74-84 % of
shapes (H100: 378 of 449 shapes of the plan-sweep-20261125 record; H200: 197 of 266,
plan-sweep-h200-20261128), and refits did not move that (benchmarks/NOTES.md, twelfth,
twenty-third and twenty-fourth sessions): the model's form is the limit. Its ranking is still
good near the top: on the same timings the best of its top :data:`TOP` predictions is within 5 %
of the best candidate on 437 of 449 (H100) and 260 of 266 (H200) shapes, worst 1.18x / 1.11x. So
timing those few once per shape, on the user's GPU, gives the measured choice at a small cost
(each candidate compiles once and runs a few dozen times), and every other shape keeps the model.

What is stored: per (device name, format, activation kind, M, N, K, output dtype, bias, weight
block rows, TMA-ability), the fastest timed config (as :func:`plan.encoding.config_key`), its
time, the model's own pick and its time, how many were timed and when. A stored config that is
not among today's candidates for that problem (a kernel changed, a file from another version) is
not used and the plan says so. Exact M only: M = 24 does not use M = 32's entry.

Where it lives: this module's process-wide store, filled by ``blockscaled.tune`` or
:func:`load`; ``BLOCKSCALED_TUNED_PLANS=path`` loads that JSON file at import and ``tune`` saves
there. Anything that changes the store drops the memoised plans (:func:`on_change`), so the next
call plans again; a CUDA graph captured before keeps the kernel it captured.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .device import DeviceInfo
from .types import Problem

__all__ = ["TOP", "ENV", "problem_key", "lookup", "record", "load", "save", "clear", "entries", "on_change",
           "tunable"]

#: candidates ``tune`` times per shape: the cost model's best TOP predictions (the model's pick
#: among them). Offline, on the sweeps' timings, the best of the top 1 / 4 / 6 / 8 is within 5 % of
#: the best candidate on 378 / 427 / 437 / 440 of 449 H100 shapes and 197 / 243 / 260 / 263 of 266
#: H200 shapes (worst 1.64 / 1.18 / 1.18 / 1.18x and 3.55 / 1.41 / 1.11 / 1.09x): 6 is where the
#: worst row falls under 1.15x on both.
TOP = 6
#: environment variable naming the JSON file of tuned plans (read at import, written by tune)
ENV = "BLOCKSCALED_TUNED_PLANS"
_SCHEMA = 1

_STORE: dict[str, dict] = {}
_HOOKS: list = []


def tunable(p: Problem, dev: DeviceInfo) -> bool:
    """The problems whose plan the cost model chooses among timed-able candidates: dense fp8_block
    with quantized activations on sm_90 (every other op keeps its measured rules)."""
    return p.op == "gemm" and p.fmt == "fp8_block" and not p.weight_only and dev.is_hopper and not p.interpret


def problem_key(p: Problem, dev: DeviceInfo) -> str:
    """The store's key of a problem on a device (the fields the candidates and their times follow)."""
    return (f"{dev.name}|{p.fmt}|{p.a}|{p.m}x{p.n}x{p.k}|{p.out_dtype}|bias={int(p.bias)}|"
            f"brows={p.b_block_rows}|tma={int(p.tma)}")


def lookup(p: Problem, dev: DeviceInfo) -> dict | None:
    """The stored entry of ``p`` on ``dev``, or None."""
    if not _STORE:
        return None
    return _STORE.get(problem_key(p, dev))


def on_change(fn) -> None:
    """Call ``fn()`` whenever the store changes (memoised plans register their ``clear`` here)."""
    _HOOKS.append(fn)


def _changed() -> None:
    for fn in _HOOKS:
        fn()


def record(p: Problem, dev: DeviceInfo, entry: dict) -> None:
    """Store ``entry`` (keys: config, us, model_config, model_us, timed, date) for ``p`` on ``dev``."""
    missing = {"config", "us", "model_config", "model_us", "timed", "date"} - set(entry)
    if missing:
        raise ValueError(f"entry: missing {sorted(missing)}")
    _STORE[problem_key(p, dev)] = dict(entry)
    _changed()


def entries() -> dict[str, dict]:
    """A copy of the store."""
    return {k: dict(v) for k, v in _STORE.items()}


def clear() -> None:
    """Forget every tuned plan (the cost model decides again)."""
    _STORE.clear()
    _changed()


def load(path: str | os.PathLike) -> int:
    """Merge the tuned plans of the JSON file ``path`` into the store; returns how many it held.
    Raises ValueError naming the file for a file of another layout."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or data.get("schema") != _SCHEMA or not isinstance(data.get("entries"), dict):
        raise ValueError(f"{path}: expected a blockscaled tuned-plans file (schema {_SCHEMA}), got another layout")
    _STORE.update(data["entries"])
    _changed()
    return len(data["entries"])


def save(path: str | os.PathLike) -> None:
    """Write the store to ``path`` (merged over the entries the file already holds)."""
    path = Path(path)
    old = {}
    if path.exists():
        with open(path) as f:
            prev = json.load(f)
        if isinstance(prev, dict) and prev.get("schema") == _SCHEMA:
            old = prev.get("entries", {})
    old.update(_STORE)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"schema": _SCHEMA, "entries": old}, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


if os.environ.get(ENV) and Path(os.environ[ENV]).exists():
    load(os.environ[ENV])
