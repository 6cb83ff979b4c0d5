"""The fp4 decode GEMV with explicit layouts (scripts/probes/gemv_gluon_probe.py; the Triton GEMV's fp4
builds lose their register layout on triton 3.7 / 3.8, benchmarks/NOTES.md forty-first session) builds
for sm_90a with the same K loop on every release: one 128-bit load per weight row and four for the
activations' slice, no shared memory in the loop, no spills. Its GPU run (against float64 and the
library's plans) is separate."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(600)

PROBE = os.path.join(os.path.dirname(__file__), os.pardir, "scripts", "probes", "gemv_gluon_probe.py")


def test_gluon_gemv_loop_is_release_stable():
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, PROBE, "--aot"], capture_output=True, text=True, env=env, timeout=580)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert {(d["fmt"], d["rows"], d["block_n"]) for d in recs} == {
        (f, r, n) for f in ("mxfp4", "nvfp4") for r, n in ((1, 8), (1, 4), (1, 2), (2, 4))}
    for d in recs:
        # per K step and thread: one 16-byte load per weight row, four per activation row (32 bf16)
        assert d["loop_ldg128"] == d["block_n"] + 4 * d["rows"], d
        assert d["loop_shared_ops"] == [] and d["local_memory_ops"] == [], d
        assert d["spill_stores"] in (None, 0), d
        # the Triton GEMV's 3.6 build: 10-11 SASS per weight byte at 8 rows (tests/test_aot_mx_gemv.py)
        if d["block_n"] == 8:
            assert d["loop_per_weight_byte"] <= 12.5, d
        if d["rows"] == 2:  # the Triton GEMV's 3.6 build: 13-14 at 2 rows (plan/mx_gemv.py)
            assert d["loop_per_weight_byte"] <= 17, d
