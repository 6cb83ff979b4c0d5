"""H100 timing of fp8_block SwiGLU: the Hopper wide kernel (DUAL) vs the portable Triton kernel.

    python scripts/swiglu_check.py [--json OUT.json]      # ~1-2 min on an H100

For each shape: median of CUDA-graph replays (blockscaled.bench.timing.time_op, inputs rotated
past L2) of ``swiglu`` forced onto the Hopper kernel and onto the portable kernel's heuristic
config, a correctness check of the Hopper result against the float64 reference, and the
TFLOP/s (4 * M * N * K per call: two GEMMs). Dense rows choose ``SWIGLU_HOPPER_MIN_M``
(ops/swiglu.py); grouped rows show what the MoE layouts gain.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from blockscaled.bench.timing import rotation_count, time_op  # noqa: E402
from blockscaled.config.gemm import GemmConfig  # noqa: E402
from blockscaled.config.grouped import choose_grouped_config  # noqa: E402
from blockscaled.ops.quantize import quantize  # noqa: E402
from blockscaled.ops.swiglu import swiglu  # noqa: E402
from blockscaled.reference import grouped as ref  # noqa: E402
from blockscaled.testing.tolerances import assert_gemm_close  # noqa: E402

DEV = torch.device("cuda")
HOPPER = GemmConfig(strategy="hopper")


def make(rows_shape, w_lead, n, k, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(*rows_shape, k, device=DEV, generator=g).to(torch.bfloat16)
    ws = [(torch.randn(*w_lead, n, k, device=DEV, generator=g) * 0.05).to(torch.bfloat16) for _ in range(2)]
    return quantize(x, "fp8_block"), *(quantize(w, "fp8_block", block=(128, 128)) for w in ws)


def case(kind, e, m, n, k):
    """kind dense: m rows; contiguous: e experts of m rows; masked: e experts, max_m 2m, count m."""
    if kind == "dense":
        rows_shape, lead, kw, rpe, mode = (m,), (), {}, m, "dense"
    elif kind == "contiguous":
        rows_shape, lead, rpe, mode = (e * m,), (e,), m, "contiguous"
        kw = {"offsets": torch.arange(0, e * m + 1, m, dtype=torch.int32, device=DEV)}
    else:
        rows_shape, lead, rpe, mode = (e, 2 * m), (e,), 2 * m, "masked"
        kw = {"masked_m": torch.full((e,), m, dtype=torch.int32, device=DEV)}
    bytes_per_set = (e if kind != "dense" else 1) * 2 * n * k + rows_shape[0] * k
    n_sets = min(rotation_count(bytes_per_set), 4)
    sets = [make(rows_shape, lead, n, k, seed) for seed in range(n_sets)]
    a, bg, bu = sets[0]
    y = swiglu(a, bg, bu, config=HOPPER, **kw)
    want = ref.swiglu(a, bg, bu, **kw)
    if kind == "masked":
        y, want = y[:, :m], want[:, :m]
    assert_gemm_close(y, want, "fp8_block", torch.bfloat16, what=f"{kind} e={e} m={m} n={n} k={k}")
    portable = choose_grouped_config("fp8_block", rpe, n, k, DEV, dual=True, grouping=mode,
                                     experts=e if kind != "dense" else 1)
    flops = 4.0 * (e if kind != "dense" else 1) * m * n * k
    res = {"kind": kind, "e": e, "m": m, "n": n, "k": k}
    for name, cfg in (("hopper", HOPPER), ("portable", portable), ("auto", None)):
        t = time_op(lambda a, bg, bu: swiglu(a, bg, bu, config=cfg, **kw), sets, warmup=3, iterations=20)
        res[name + "_ms"] = t.median_ms
        res[name + "_tflops"] = flops / (t.median_ms * 1e-3) / 1e12
    res["hopper_vs_portable"] = res["portable_ms"] / res["hopper_ms"]
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rows = []
    cases = [("dense", 1, m, n, k) for (n, k) in ((18432, 7168), (2048, 7168), (4096, 7168))
             for m in (16, 64, 128, 256, 512, 4096)]
    cases += [("contiguous", 8, m, 2048, 7168) for m in (64, 128, 512)]
    cases += [("contiguous", 8, 128, 4096, 7168), ("masked", 8, 64, 2048, 7168), ("masked", 8, 128, 2048, 7168)]
    print(f"{'kind':<11}{'E':>3}{'m':>6}{'N':>7}{'K':>6} | {'hopper':>8} {'portable':>9} {'auto':>8} TFLOP/s | h/p")
    for c in cases:
        try:
            r = case(*c)
        except Exception as ex:  # keep going: one failing shape must not hide the others
            print(c, "FAILED:", type(ex).__name__, str(ex)[:300], flush=True)
            rows.append({"case": list(c), "error": f"{type(ex).__name__}: {ex}"})
            continue
        rows.append(r)
        print(f"{r['kind']:<11}{r['e']:>3}{r['m']:>6}{r['n']:>7}{r['k']:>6} | {r['hopper_tflops']:8.1f} "
              f"{r['portable_tflops']:9.1f} {r['auto_tflops']:8.1f}         | {r['hopper_vs_portable']:.2f}x",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
