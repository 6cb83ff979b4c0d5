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
import tempfile
import warnings
from pathlib import Path

try:  # POSIX: serialise the read-merge-write of a shared file (several ranks tuning into one)
    import fcntl
except ImportError:  # pragma: no cover - other platforms: no lock
    fcntl = None

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


_FIELDS = ("config", "us", "model_config", "model_us", "timed", "date")


def _entry_problem(entry) -> str | None:
    """What is wrong with a stored entry (None: nothing). ``model_us`` may be None (the model's pick
    failed its check)."""
    if not isinstance(entry, dict):
        return f"expected a dict, got {type(entry).__name__}"
    missing = [f for f in _FIELDS if f not in entry]
    if missing:
        return f"missing {missing}"
    if not isinstance(entry["config"], str) or not isinstance(entry["model_config"], str):
        return "config / model_config must be config_key strings"
    if not isinstance(entry["us"], (int, float)) or not (entry["model_us"] is None
                                                          or isinstance(entry["model_us"], (int, float))):
        return "us / model_us must be numbers"
    return None


def record(p: Problem, dev: DeviceInfo, entry: dict) -> None:
    """Store ``entry`` (keys: config, us, model_config, model_us (None if the model's pick failed
    its check), timed, date) for ``p`` on ``dev``."""
    why = _entry_problem(entry)
    if why is not None:
        raise ValueError(f"entry: {why}")
    _STORE[problem_key(p, dev)] = dict(entry)
    _changed()


def entries() -> dict[str, dict]:
    """A copy of the store."""
    return {k: dict(v) for k, v in _STORE.items()}


def clear() -> None:
    """Forget every tuned plan (the cost model decides again)."""
    _STORE.clear()
    _changed()


def _read(path) -> dict:
    """The entries of a tuned-plans file; ValueError naming the file for another layout."""
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a JSON file of tuned plans ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != _SCHEMA or not isinstance(data.get("entries"), dict):
        raise ValueError(f"{path}: expected a blockscaled tuned-plans file (schema {_SCHEMA}), got another layout")
    return data["entries"]


def load(path: str | os.PathLike) -> int:
    """Merge the tuned plans of the JSON file ``path`` into the store; returns how many it took.
    Raises ValueError naming the file for a file of another layout; entries that are malformed
    are left out with a warning naming them."""
    entries_ = _read(path)
    good = {}
    for key, entry in entries_.items():
        why = _entry_problem(entry)
        if why is None:
            good[key] = entry
        else:
            warnings.warn(f"{path}: tuned plan {key!r} left out: {why}", stacklevel=2)
    _STORE.update(good)
    _changed()
    return len(good)


def save(path: str | os.PathLike) -> None:
    """Write the store to ``path``, merged over the entries the file already holds (under a lock,
    through a temporary file in the same folder: several processes may tune into one file).
    Raises ValueError, leaving the file alone, if it holds something other than tuned plans."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        old = _read(path) if path.exists() else {}
        old.update(_STORE)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"schema": _SCHEMA, "entries": old}, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


if os.environ.get(ENV) and Path(os.environ[ENV]).exists():
    try:
        load(os.environ[ENV])
    except (OSError, ValueError) as _exc:  # a bad file must not break the import: the model plans instead
        warnings.warn(f"{ENV}={os.environ[ENV]}: not loaded ({_exc}); the cost model plans every shape",
                      stacklevel=1)
