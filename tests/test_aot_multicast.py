"""Issue 19's lever built ahead of time (no GPU): scripts/probes/multicast_probe.py's 2-CTA cluster fp8
GEMM, whose weight tile reaches both CTAs by one TMA multicast, compiles for sm_90a on triton 3.8 (the
release its cluster protocol is written for; torch 2.14's pin) and emits what the protocol relies on.
The probe's GPU run (correctness against float64, multicast vs one load per CTA) is separate."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import triton

pytestmark = pytest.mark.timeout(600)

PROBE = os.path.join(os.path.dirname(__file__), os.pardir, "scripts", "probes", "multicast_probe.py")


@pytest.mark.skipif(tuple(int(x) for x in triton.__version__.split(".")[:2]) != (3, 8),
                    reason="the multicast probe's cluster protocol is written for triton 3.8")
@pytest.mark.parametrize("pipeline", ["async", "persistent"])
def test_multicast_probe_builds_for_sm90(pipeline):
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, PROBE, "--aot", "--pipeline", pipeline], capture_output=True, text=True,
                       env=env, timeout=580)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = {d["variant"]: d for d in map(json.loads, r.stdout.strip().splitlines())}
    assert set(recs) == {"multicast", "two_loads", "one_cta"}, recs
    for v, d in recs.items():
        assert d["wgmma"] == ["m64n256k32"], d  # fp8 e4m3 x e4m3 -> fp32, 64-row warpgroups x 256 columns
        assert d["tma_boxes"] == [[128, 128], [256, 128]], d  # A: each CTA its 128 rows; B: the whole tile
        assert d["wgmma_waits"] == ["0", "1"], d  # one wgmma kept in flight, all drained before the epilogue
    mc, two, one = recs["multicast"], recs["two_loads"], recs["one_cta"]
    # a cluster of two; the B tile by multicast (prologue + loop), issued by one CTA for both
    assert mc["ctas_per_cluster"] == ["2"] and mc["multicast_loads"] >= 2, mc
    # the stage-release barrier lives in CTA 0: the other CTA arrives on it across the cluster
    assert mc["cluster_arrives"] >= 1, mc
    assert two["ctas_per_cluster"] == ["2"] and two["multicast_loads"] == 0, two
    assert one["ctas_per_cluster"] == [] and one["multicast_loads"] == 0 and one["cluster_arrives"] == 0, one
