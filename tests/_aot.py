"""Shared helper for the ahead-of-time compile tests (tests/test_aot_*.py).

Kernels must be compiled for sm_90 by a process WITHOUT TRITON_INTERPRET (the interpreter is
chosen when kernels are defined, and conftest.py sets it on machines without a GPU), so each
AOT test runs a script in a subprocess and reads the JSON it prints last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def run_compile_script(script: str, timeout: int = 900) -> dict:
    """Run ``script`` with ``src/`` on the path and no interpreter; return the JSON object of
    its last stdout line (a leading ``JSON`` marker is allowed)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    lines = [ln for ln in r.stdout.strip().splitlines() if ln.strip()]
    marked = [ln for ln in lines if ln.startswith("JSON")]
    last = marked[-1][4:] if marked else lines[-1]
    return json.loads(last)
