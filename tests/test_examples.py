"""The runnable example runs as documented (on the CPU: the reference path)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_generate_example_runs():
    pytest.importorskip("transformers")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "blockscaled.examples.generate", "--device", "cpu", "--formats",
                        "fp8_block,mxfp4", "--hidden", "128", "--tokens", "2"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    cos = {m.group(1): float(m.group(2)) for m in re.finditer(r"(\w+)\s+logits cos ([0-9.]+)", r.stdout)}
    assert set(cos) == {"fp8_block", "mxfp4"} and cos["fp8_block"] > 0.99 and cos["mxfp4"] > 0.9, r.stdout
    assert r.stdout.count("generated [") == 2
