"""Test setup: without a GPU, run every Triton kernel through the interpreter.

TRITON_INTERPRET must be set before any @triton.jit function is defined, i.e. before the
blockscaled kernels are imported, so it is done here at collection start.

The skip reasons are folded into one summary line at the end (``-rfE`` in pyproject.toml
keeps pytest's own per-reason list for failures and errors only): on a CPU machine about a
thousand GPU tests skip for the same two or three reasons, and listing each location buried the
failures.
"""

import collections
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if HAS_CUDA else "cpu"


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
    else:
        reason = str(longrepr)
    return reason.removeprefix("Skipped: ").strip()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons = collections.Counter(_skip_reason(r) for r in skipped)
    parts = ", ".join(f"{n} {reason}" for reason, n in reasons.most_common())
    terminalreporter.write_line(f"skipped {len(skipped)}: {parts}")


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(params=["kernels", "reference"])
def path(request, monkeypatch, device):
    """Run a test on the kernel path (the interpreter on CPU, or CUDA) and on the float64
    reference path (CPU tensors with the interpreter off): public ops must behave the same."""
    # imported here, not at the top: blockscaled must be imported after TRITON_INTERPRET is set
    import blockscaled._checks as checks

    if request.param == "reference":
        if device != "cpu":
            pytest.skip("the reference path takes CPU tensors")
        monkeypatch.setattr(checks, "INTERPRET", False)
    elif device == "cpu" and not checks.INTERPRET:
        pytest.skip("needs TRITON_INTERPRET=1 (tests/conftest.py sets it without a GPU)")
    return request.param


@pytest.fixture
def mx_kernels(monkeypatch):
    """Switch the experimental MX/NV planner rules on for one test (blockscaled._experimental: the
    decode GEMV at M <= 8, the bf16 tiles at 8 < M <= 512; the register-streaming kernel off, so
    that the GEMV keeps its rows), with the plan caches cleared before and
    after. Only the planner's choices: the compiled kernels' bf16 decode is a module constant set
    at import (AOT tests set BLOCKSCALED_MX_KERNELS in their compile subprocess)."""
    from blockscaled.plan import gemm as plan_gemm_mod
    from blockscaled.plan import portable

    from blockscaled.ops import gemm as ops_gemm

    def clear():
        plan_gemm_mod.plan_gemm.cache_clear()
        portable.choose_portable.cache_clear()
        ops_gemm._PLANS.clear()  # the eager path's plan memo (keyed by shapes, not by these switches)

    clear()
    monkeypatch.setattr(portable, "MX_BF16_ENABLED", True)
    try:
        from blockscaled.plan import mx_gemv
    except ImportError:  # before the decode GEMV
        mx_gemv = None
    try:  # the register-streaming kernel takes fp4 weight-only 2..8 rows before the GEMV: off here
        from blockscaled.plan import direct as plan_direct
    except ImportError:  # before it
        plan_direct = None
    if plan_direct is not None:
        monkeypatch.setattr(plan_direct, "DIRECT_ENABLED", False)
    if mx_gemv is not None:
        monkeypatch.setattr(mx_gemv, "MX_GEMV_ENABLED", True)
        if hasattr(mx_gemv, "_TRITON_OK"):  # the planner's rules are tested on every triton release
            monkeypatch.setattr(mx_gemv, "_TRITON_OK", True)
        if hasattr(mx_gemv, "MX_GEMV_ROWS_BY_RELEASE"):  # with the rows measured on 3.6 (3.8 has its own)
            monkeypatch.setattr(mx_gemv, "MX_GEMV_ROWS", mx_gemv.MX_GEMV_ROWS_BY_RELEASE[(3, 6)])
    yield
    clear()
