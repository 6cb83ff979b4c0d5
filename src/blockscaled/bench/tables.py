"""Cells and tallies shared by the suites that print tables of their own (bench/mx.py,
bench/layers.py, bench/model_suite.py)."""

from __future__ import annotations

__all__ = ["timed", "us", "count_verdicts"]


def timed(row: dict) -> bool:
    """A row that ran and was timed."""
    return row.get("status") == "ok" and row.get("median_ms") is not None


def us(ms) -> str:
    """Milliseconds as a microseconds cell ("-" when not measured)."""
    return "-" if ms is None else f"{ms * 1e3:.1f}"


def count_verdicts(*tables: tuple[list[str], list[list[str]]]) -> dict:
    """{"PASS": n, "MISS": n, "FAIL": n, "-": n} over the "verdict" column of (head, body) tables."""
    out = {"PASS": 0, "MISS": 0, "FAIL": 0, "-": 0}
    for head, body in tables:
        i = head.index("verdict")
        for b in body:
            out[b[i]] = out.get(b[i], 0) + 1
    return out
