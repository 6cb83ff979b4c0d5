"""``blockscaled.explain``: the plan a call would run, from the same code path as the call.

Each public op validates its arguments and asks the planner exactly as when it runs; while
:func:`explain` is active on this thread, the op hands that plan back (by raising an internal
exception at its launch point) instead of launching. So the answer is the plan the same call
runs, by construction, and bad arguments raise the same errors.
"""

from __future__ import annotations

from ..plan import Plan
from ._explain import STATE, Explained
from .gemm import gemm
from .grouped import grouped_gemm
from .grouped_list import grouped_gemm_list
from .linear import linear
from .quantize import dequantize, quantize
from .swiglu import swiglu

__all__ = ["explain"]

_OPS = {"gemm": gemm, "linear": linear, "grouped_gemm": grouped_gemm, "grouped_gemm_list": grouped_gemm_list,
        "swiglu": swiglu, "quantize": quantize, "dequantize": dequantize}


def explain(op_name: str, *args, **kwargs) -> Plan:
    """The :class:`~blockscaled.plan.Plan` that ``blockscaled.<op_name>(*args, **kwargs)`` would run,
    without running it (no kernel is launched; ``linear`` may quantize its activations first).

    ``op_name``: "gemm", "linear", "grouped_gemm" (contiguous or masked), "grouped_gemm_list",
    "swiglu", "quantize", "dequantize". The arguments are those of the op and are validated the
    same way. ``str(plan)`` is a short account: kernel, tiles, split, waves, the rule and numbers
    behind the choice; ``plan.kernel`` and ``plan.config`` say exactly what runs.

    Example::

        a = bs.quantize(x, "fp8_block"); w = bs.quantize(W, "fp8_block", block=(128, 128))
        plan = bs.explain("gemm", a, w)
        print(plan)             # e.g. hopper_wide 128x256 4 stages, tail split 5 ... predicted 812.3 us
    """
    fn = _OPS.get(op_name)
    if fn is None:
        raise ValueError(f"op_name: expected one of {sorted(_OPS)}, got {op_name!r}")
    STATE.on = True
    try:
        fn(*args, **kwargs)
    except Explained as e:
        return e.plan
    finally:
        STATE.on = False
    raise RuntimeError(f"explain: {op_name} returned without reaching its plan (a bug: every path must emit)")
