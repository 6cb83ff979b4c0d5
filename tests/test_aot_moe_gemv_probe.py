"""The grouped (MoE decode) Gluon GEMV of scripts/probes/moe_gemv_probe.py builds for sm_90a with the dense Gluon
GEMV's K loop (tests/test_aot_mx_gemv_gluon.py) inside its loop over an expert's rows, on every release CI runs:
one 128-bit load per weight row and four for the activation row per K step, no shared or local memory in
the K loop, no spills; with SWIGLU (gate and up rows in one program) the same per weight byte. Its GPU run (against float64 and the planner's grouped plan) is the probe's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(600)

PROBE = os.path.join(os.path.dirname(__file__), os.pardir, "scripts", "probes", "moe_gemv_probe.py")


def test_moe_gemv_probe_builds_the_dense_k_loop():
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, PROBE, "--aot"], capture_output=True, text=True, env=env, timeout=580)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert {(d["fmt"], d["block_n"], d["warps"], d["swiglu"]) for d in recs} == {
        (f, n, w, sw) for f in ("mxfp4", "nvfp4") for n, w, sw in ((4, 2, False), (2, 1, False), (4, 4, False),
                                                                  (2, 2, True), (2, 4, True))}
    for d in recs:
        assert d["loop_ldg128"] == d["weight_rows"] + 4, d  # SWIGLU: gate and up rows
        assert d["loop_shared_ops"] == [] and d["local_memory_ops"] == [], d
        assert d["spill_stores"] in (None, 0), d
        # the dense Gluon GEMV's limits at these rows (tests/test_aot_mx_gemv_gluon.py)
        assert d["loop_per_weight_byte"] <= {4: 13.0, 2: 15.5}[d["weight_rows"]], d
