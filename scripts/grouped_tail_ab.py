"""H100 A/B of the grouped tail split (HopperConfig.tail_split on the grouped wide kernel): the moe
suite's contiguous rows whose tiles leave a partial last wave, today's config (choose_grouped_config)
against no split and splits 2-4, every candidate checked against the float64 reference first, then
timed in ``--rounds`` interleaved rounds (CUDA-graph medians, inputs rotated past L2); the ratio is
the median of the per-round ratios to "off". ``--vs-dense`` also times the same FLOPs as one dense
GEMM with the grouped config (how the grouped K loop's divergent code was found, benchmarks/NOTES.md
2026-11-23, "Grouped tiles were 15-18% slower than dense tiles doing the same work"); equal bytes
only at m=512, where B's traffic is small next to the math: at m <= 128 the grouped launch reads E
weights, the dense one reads one, so the dense time is no bar there.

    python scripts/grouped_tail_ab.py [--rounds 5] [--vs-dense] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from blockscaled.ops import _hopper as H  # noqa: E402
from blockscaled.reference import grouped as ref  # noqa: E402
from blockscaled.testing.tolerances import assert_gemm_close  # noqa: E402
from grouped_sweep import operands, run  # noqa: E402
from hopper_small_m import case_inputs, interleaved_us, save_json  # noqa: E402

#: (experts, rows per expert, N, K): 3 waves + 52 tiles (128x256 at m=512, 64/128-row tiles at
#: m=64/128), K below and above TAIL_SPLIT_MIN_KB, and a 6.8-wave row
ROWS = ((4, 512, 7168, 7168), (4, 512, 7168, 4096), (4, 512, 7168, 2048), (8, 64, 7168, 7168),
        (8, 64, 7168, 4096), (8, 128, 7168, 7168), (8, 128, 7168, 4096), (8, 512, 7168, 7168))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--vs-dense", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for e, m, n, k in ROWS:
        cfg = H.choose_grouped_config(m, n, k, nsm, 2, e)
        sets = [operands(False, e, m, m, n, k, s) for s in range(3)]
        a, b, seg = sets[0]
        y = ref.grouped_gemm(a, b, offsets=seg)
        cands = [("today", cfg), ("off", dataclasses.replace(cfg, tail_split=1))]
        cands += [(f"tail{t}", dataclasses.replace(cfg, tail_split=t)) for t in (2, 3, 4) if t != cfg.tail_split]
        fns = {}
        for name, c in cands:
            assert_gemm_close(run(a, b, seg, False, n, c), y, "fp8_block", torch.bfloat16, what=f"E={e} m={m} {name}")
            fns[name] = lambda a, b, s, c=c: run(a, b, s, False, n, c)
        all_sets = {name: sets for name in fns}
        if args.vs_dense:
            _, dsets, dref = case_inputs(e * m, n, k, max_sets=3)
            dcfg = dataclasses.replace(cfg, tail_split=1)
            assert_gemm_close(H.gemm_fp8_block_hopper(*dsets[0], torch.bfloat16, config=dcfg), dref, "fp8_block",
                              torch.bfloat16, what="dense")
            fns["dense, same tiles"] = lambda a, b, c=dcfg: H.gemm_fp8_block_hopper(a, b, torch.bfloat16, config=c)
            all_sets["dense, same tiles"] = dsets
        us = interleaved_us(fns, all_sets, args.rounds)
        fl = 2.0 * e * m * n * k
        print(f"--- E={e} m={m} {n}x{k}: today {cfg.block_m}x{cfg.block_n} tail_split {cfg.tail_split}", flush=True)
        for name in fns:
            med = statistics.median(us[name])
            ratio = statistics.median(o / t for o, t in zip(us["off"], us[name]))
            rows.append({"experts": e, "m": m, "n": n, "k": k, "name": name, "us": med, "us_rounds": us[name],
                         "tflops": fl / med / 1e6, "vs_off": ratio})
            print(f"  {name:<18} {med:8.1f} us {fl / med / 1e6:7.0f} TFLOP/s  {ratio:5.3f}x off  "
                  f"(rounds {min(us[name]):.1f}-{max(us[name]):.1f})", flush=True)
        del sets
        torch.cuda.empty_cache()
    save_json(args.json, rows=rows)


if __name__ == "__main__":
    main()
