"""The README's Python snippets run as written.

All ```python blocks of README.md are joined in order (later ones continue earlier ones, as the
README says) and run in a fresh interpreter without TRITON_INTERPRET, the way a new user pastes
them: on a CPU machine that is the reference path, on a GPU machine the kernels. A snippet that
names an undefined variable, a wrong argument or a shape that does not fit fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
SRC = str(Path(__file__).resolve().parents[1] / "src")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_readme_has_snippets():
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 2, "README lost its Python quick start"
    assert "blockscaled as bs" in blocks[0]


def test_readme_snippets_run_as_written():
    script = "\n".join(python_blocks(README.read_text()))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"README snippets failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    # the quick start prints its own accuracy line: the GEMM must agree with float64
    m = re.search(r"max rel\. error ([0-9.e+-]+)", r.stdout)
    assert m, r.stdout
    assert float(m.group(1)) < 1e-2, r.stdout
