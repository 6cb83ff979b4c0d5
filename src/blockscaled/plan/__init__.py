"""The planner: the one place that decides which kernel runs, with which configuration, and why.

A pure function of plain values: a :class:`Problem` (op, format, M/N/K, groups, dtypes, bias,
whether TMA can take the operands) and a :class:`DeviceInfo` (SM version and count, shared
memory, L2, bandwidth) give a :class:`Plan` (backend, kernel, its full config, the reasons and
the predicted time). ``ops/`` validates a call, builds its Problem, asks for the Plan and
launches exactly that; grouped plans cross the custom-op boundary whole (plan/encoding.py).
``blockscaled.explain(op, *args, **kwargs)`` returns the Plan a call would run;
``BLOCKSCALED_LOG_PLANS=1`` logs every new plan once (logger ``blockscaled.plan``).

Example (on any machine, for an H100)::

    from blockscaled.plan import H100_SXM, Problem, plan_gemm
    print(plan_gemm(Problem("gemm", "fp8_block", 128, 7168, 2048), H100_SXM))
"""

from __future__ import annotations

import contextlib
import logging
import os

from .device import CPU_INTERPRETER, DEVICES, H100_SXM, H200_SXM, DeviceInfo, device_info, num_sms
from .gemm import plan_gemm
from .types import BACKENDS, KERNELS, OPS, Plan, Problem

__all__ = ["Problem", "Plan", "DeviceInfo", "device_info", "num_sms", "H100_SXM", "H200_SXM", "DEVICES", "CPU_INTERPRETER",
           "plan_gemm", "log_plan", "observe_plans", "OPS", "BACKENDS", "KERNELS"]

_LOG = logging.getLogger("blockscaled.plan")
#: BLOCKSCALED_LOG_PLANS=1: log each new plan once (read at import, or set LOG_PLANS at run time)
LOG_PLANS = os.environ.get("BLOCKSCALED_LOG_PLANS", "0").strip() not in ("", "0")
_SEEN: set = set()
_OBSERVERS: list[list] = []


@contextlib.contextmanager
def observe_plans():
    """Collect every plan the ops run inside the ``with`` block (a list, in launch order): the
    bench's config column reports what ran from it.

    Example::

        with observe_plans() as plans:
            bs.gemm(a, b)
        print(plans[0].describe())
    """
    seen: list = []
    _OBSERVERS.append(seen)
    try:
        yield seen
    finally:
        _OBSERVERS.remove(seen)


def log_plan(plan: Plan) -> None:
    """Called by the ops with every plan they run: hands it to :func:`observe_plans` blocks and,
    when LOG_PLANS is on, logs it at INFO level the first time it is seen (a handler is attached
    to the ``blockscaled.plan`` logger if it has none, so the switch alone shows them)."""
    for seen in _OBSERVERS:
        seen.append(plan)
    if not LOG_PLANS:
        return
    key = (plan.problem, plan)
    if key in _SEEN:
        return
    _SEEN.add(key)
    if not _LOG.handlers and not logging.getLogger().handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("[blockscaled.plan] %(message)s"))
        _LOG.addHandler(h)
        _LOG.setLevel(logging.INFO)
    _LOG.info("%s", plan)
