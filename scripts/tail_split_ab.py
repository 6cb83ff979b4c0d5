"""H100 A/B of the wide kernel's tail split (HopperConfig.tail_split) at prefill M.

For each (M, N, K): the dispatch config (ops/_hopper.choose_dispatch_config) with its tail split
vs the same config with tail_split=1 and vs the other tile width (128 <-> 256 columns, its own
tail split from ops/_hopper.tail_split_for: "alt"), CUDA-graph medians (blockscaled.bench.timing.time_op) with
inputs rotated past L2, both outputs checked against the float64 reference first. Prints tiles,
waves, the split, us and TFLOP/s of both and the ratio; ``--json`` writes the rows.

    python scripts/tail_split_ab.py --json $OUT/tail_split_ab.json      # ~1 min
"""

from __future__ import annotations

import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from blockscaled.bench.timing import time_op  # noqa: E402
from blockscaled.ops import _hopper as H  # noqa: E402
from hopper_small_m import case_inputs, checked_us, save_json, sweep_cli  # noqa: E402  (scripts/ is on sys.path when run as a script)

MS = (1024, 2048, 3000, 4096, 8192)


def main():
    args = sweep_cli(__doc__, ",".join(map(str, MS)), extra=lambda p: p.add_argument(
        "--sweep", action="store_true", help="also time every tail split 2..the chooser's (the 'splits' field)"))
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    print(f"{'M':>5}{'N':>7}{'K':>7} {'tiles':>6} {'waves':>6} {'split':>5} | {'off us':>8} {'TF':>5} | "
          f"{'tail us':>8} {'TF':>5} | ratio")
    for m in args.ms:
        for n, k in args.shapes:
            cfg = H.choose_dispatch_config(m, n, k, num_sms=nsm)
            if cfg.variant != "wide" or cfg.tail_split == 1:
                continue
            off = dataclasses.replace(cfg, tail_split=1)
            abn = 384 - cfg.block_n
            alt = H._fill_stages(dataclasses.replace(cfg, block_n=abn, stages=2, tail_split=H.tail_split_for(
                -(-m // 128) * -(-n // abn), k, nsm)), 2)
            _, sets, ref = case_inputs(m, n, k, max_sets=4)
            t = {name: checked_us(lambda a, b, c=c: H.gemm_fp8_block_hopper(a, b, torch.bfloat16, config=c), sets,
                                  ref, f"{m}x{n}x{k} {c}")
                 for name, c in (("tail", cfg), ("off", off), ("alt", alt))}
            if args.sweep:
                t["splits"] = {}
                for ts in range(2, cfg.tail_split + 1):
                    c = dataclasses.replace(cfg, tail_split=ts)
                    t["splits"][ts] = time_op(lambda a, b, c=c: H.gemm_fp8_block_hopper(a, b, torch.bfloat16, config=c),
                                              sets, warmup=5, iterations=30).median_ms * 1e3
                print("   splits:", " ".join(f"{ts}:{v:.1f}" for ts, v in t["splits"].items()), flush=True)
            tiles = -(-m // 128) * -(-n // cfg.block_n)
            fl = 2.0 * m * n * k
            r = {"m": m, "n": n, "k": k, "tiles": tiles, "waves": tiles / nsm, "tail_split": cfg.tail_split,
                 "cfg": f"{cfg.block_m}x{cfg.block_n} s{cfg.stages}", "off_us": t["off"], "tail_us": t["tail"],
                 "off_tflops": fl / t["off"] / 1e6, "tail_tflops": fl / t["tail"] / 1e6,
                 "alt_cfg": f"{alt.block_m}x{alt.block_n} s{alt.stages} tail{alt.tail_split}", "alt_us": t["alt"],
                 "splits_us": t.get("splits")}
            rows.append(r)
            print(f"{m:>5}{n:>7}{k:>7} {tiles:>6} {tiles / nsm:6.2f} {cfg.tail_split:>5} | {t['off']:8.1f} "
                  f"{r['off_tflops']:5.0f} | {t['tail']:8.1f} {r['tail_tflops']:5.0f} | {t['off'] / t['tail']:.3f} | "
                  f"alt {r['alt_cfg']} {t['alt']:8.1f} ({t['alt'] / t['tail']:.3f}x tail)",
                  flush=True)
    save_json(args.json, sms=nsm, rows=rows)


if __name__ == "__main__":
    main()
