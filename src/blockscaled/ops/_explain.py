"""The switch between ``blockscaled.explain`` and the ops (a leaf module: every op imports it)."""

from __future__ import annotations

import threading

__all__ = ["explaining", "emit", "Explained", "STATE"]

STATE = threading.local()


class Explained(Exception):
    """Raised by :func:`emit` at an op's launch point while ``explain`` runs; carries the plan."""

    def __init__(self, plan):
        super().__init__("explain")
        self.plan = plan


def explaining() -> bool:
    """True while ``explain`` runs an op on this thread (the op then calls :func:`emit`)."""
    return getattr(STATE, "on", False)


def emit(plan) -> None:
    """Hand ``plan`` back to ``explain`` (never returns)."""
    raise Explained(plan)
