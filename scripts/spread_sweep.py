"""H100 sweep for the small-M dispatch rule of the wide kernel with the spread split-K reduction
(HopperConfig.split_reduce="spread"): per (M, N, K), the portable kernel's choice, today's
``gemm()`` and every wide candidate (block_m, block_n, split) that fits one wave, CUDA-graph
medians with inputs rotated past L2, each candidate checked against the float64 reference.

Candidates: block_m 64 (M <= 64) / 128 (M >= 64), block_n 128 / 256, split 1 and every split
s >= 2 with tiles * s <= SMs, tiles * s >= SMs / 3 and >= 3 K blocks per split.
Rows: the DeepSeek-V3 shapes at M = 16..256 and the moe suite's one-expert shapes (M = 64, 128,
512 on N, K in {2048, 4096, 7168}).

    python scripts/spread_sweep.py [--ms ...] [--shapes ...] [--budget 500] --json OUT.json
"""

from __future__ import annotations

import itertools
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from blockscaled.bench.timing import time_op  # noqa: E402
from blockscaled.config.gemm import choose_gemm_config  # noqa: E402
from blockscaled.ops import _hopper as H  # noqa: E402
from blockscaled.ops.gemm import gemm  # noqa: E402
from hopper_small_m import case_inputs, checked_us, save_json, sweep_cli  # noqa: E402

MOE_E1 = [(m, n, k) for m in (64, 128, 512) for n, k in itertools.product((2048, 4096, 7168), repeat=2)]
SPLITS = (2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16)


def candidates(m, n, k, nsm):
    nk = -(-k // 128)
    out = []
    for bm in ((64, 128) if m == 64 else (64,) if m < 64 else (128,)):
        for bn in (128, 256):
            tiles = -(-m // bm) * -(-n // bn)
            for s in (1,) + SPLITS:
                if s > 1 and not (tiles * s <= nsm and 3 * tiles * s >= nsm and nk // s >= 3):
                    continue
                if s == 1 and tiles > 2 * nsm:
                    continue
                cfg = H.HopperConfig("wide", bm, bn, bm // 16, 2, epilogue="tma", split_k=s, split_reduce="spread")
                out.append(H._fill_stages(cfg, 2))
    return out


def main():
    args = sweep_cli(__doc__, "16,32,64,128,256", extra=lambda p: (
        p.add_argument("--budget", type=float, default=500.0, help="seconds; stop starting new shapes after"),
        p.add_argument("--moe", action="store_true", help="also the moe suite's one-expert shapes"),
        p.add_argument("--cases", default="", help="MxNxK,... instead of --ms x --shapes")))
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    dev = torch.device("cuda")
    cases = ([tuple(int(v) for v in c.split("x")) for c in args.cases.split(",")] if args.cases else
             [(m, n, k) for m in args.ms for n, k in args.shapes]) + (MOE_E1 if args.moe else [])
    t_start = time.time()
    rows = []
    for m, n, k in cases:
        if time.time() - t_start > args.budget:
            print(f"# budget reached: stopped before {m}x{n}x{k}", flush=True)
            break
        floor_us, sets, ref = case_inputs(m, n, k, max_sets=4)
        port = choose_gemm_config("fp8_block", m, n, k, dev, allow_hopper=False)
        t_port = checked_us(lambda a, b: gemm(a, b, config=port), sets, ref, f"{m}x{n}x{k} portable {port}",
                            warmup=3, iterations=20)
        t_gemm = time_op(lambda a, b: gemm(a, b), sets, warmup=3, iterations=20).median_ms * 1e3
        cand = {}
        for cfg in candidates(m, n, k, nsm):
            label = f"{cfg.block_m}x{cfg.block_n} s{cfg.stages} split{cfg.split_k}"
            try:
                cand[label] = checked_us(lambda a, b, c=cfg: H.gemm_fp8_block_hopper(a, b, torch.bfloat16, config=c),
                                         sets, ref, f"{m}x{n}x{k} {cfg}", warmup=3, iterations=20)
            except H.HopperUnsupported as e:
                cand[label] = None
                print(f"   {label}: {e}")
        best = min((v, kk) for kk, v in cand.items() if v is not None)
        rule = H.small_m_dispatch_config(m, n, k, nsm)
        rows.append({"m": m, "n": n, "k": k, "floor_us": floor_us, "portable_us": t_port, "portable": str(port),
                     "gemm_us": t_gemm, "rule": None if rule is None else
                     f"{rule.block_m}x{rule.block_n} s{rule.stages} split{rule.split_k}", "wide_spread_us": cand, "best": best[1], "best_us": best[0]})
        top = sorted((v, kk) for kk, v in cand.items() if v is not None)[:3]
        print(f"{m:>5}{n:>7}{k:>7} floor {floor_us:5.1f} | portable {t_port:6.1f} gemm() {t_gemm:6.1f} | best "
              + "  ".join(f"{kk} {v:.1f}" for v, kk in top)
              + f" | best/portable {t_port / best[0]:.2f}x | rule {rows[-1]['rule']}", flush=True)
        save_json(args.json, rows=rows)


if __name__ == "__main__":
    main()
