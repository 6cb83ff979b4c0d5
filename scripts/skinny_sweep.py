"""H100 sweep of the "skinny" (swap-AB, deep TMA ring, split-K) decode kernel against ``gemm()``.

    python scripts/skinny_sweep.py [--ms 1,16,32,64] [--shapes NxK,..] [--json OUT.json]

For every shape and M: each (block_n, ring depth, K split) candidate is checked once against the
float64 reference of the same quantized inputs, then timed with the bench's timer (CUDA-graph
medians, inputs rotated past L2); printed as % of the memory floor (bytes read once + output
written once, at the copy bandwidth measured in the same run). The best candidate per row and
today's ``gemm()`` dispatch are printed side by side; the JSON keeps every candidate so the
dispatch rule can be fitted to it.
"""

from __future__ import annotations

import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from blockscaled.bench.runner import measure_roofline  # noqa: E402
from blockscaled.bench.timing import time_op  # noqa: E402
from blockscaled.ops import _hopper as H  # noqa: E402
from blockscaled.ops.gemm import gemm  # noqa: E402

# the same operands, shapes and command line as the other sweep scripts
from hopper_small_m import case_inputs, checked_us, save_json, sweep_cli  # noqa: E402  (scripts/ is on sys.path when run as a script)


def candidates(m, n, k, nsm):
    """(block_n, stages, split) grid: ring depths filling shared memory per
    SM (1, 2 or 4 programs), and every distinct split plan with at least 2 K blocks per split and at most 3 programs
    per SM."""
    mp = max(8, triton.next_power_of_2(m))
    nk = triton.cdiv(k, 128)
    seen = set()
    for bn in (64, 128):
        tiles = triton.cdiv(n, bn)
        stage = (bn + mp) * 128
        for per_sm in (1, 2, 4):
            st = max(2, min(16, (H._SMEM_LIMIT // per_sm - bn * mp * 4 - 2048) // stage))
            for want in range(1, 33):
                splits, per = H._split_plan_kb(nk, want)
                if splits != want or (splits > 1 and per < 2) or tiles * splits > 3 * nsm:
                    continue
                key = (bn, st, splits)
                if key in seen:
                    continue
                seen.add(key)
                yield H.HopperConfig("skinny", block_m=mp, block_n=bn, num_warps=4, stages=key[1], split_k=splits)


def main():
    args = sweep_cli(__doc__, "1,16,32,64")
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    bw = measure_roofline(iterations=10)["copy_gbps"] * 1e9
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s, {nsm} SMs")
    rows = []
    for m in args.ms:
        for n, k in args.shapes:
            floor_us, sets, ref = case_inputs(m, n, k, bw)
            t_gemm = time_op(lambda a, b: gemm(a, b), sets, warmup=5, iterations=20).median_ms * 1e3
            cands = []
            for cfg in candidates(m, n, k, nsm):
                t = checked_us(lambda a, b, cfg=cfg: H.gemm_fp8_block_hopper(a, b, torch.bfloat16, config=cfg), sets,
                               ref, f"{m}x{n}x{k} {cfg}", warmup=3, iterations=20)
                cands.append({"block_n": cfg.block_n, "stages": cfg.stages, "split": cfg.split_k, "us": t,
                              "units": triton.cdiv(n, cfg.block_n) * cfg.split_k})
            best = min(cands, key=lambda c: c["us"])
            rows.append({"m": m, "n": n, "k": k, "floor_us": floor_us, "gemm_us": t_gemm, "best": best,
                         "candidates": cands})
            print(f"M={m:>3} {n:>6}x{k:<6} floor {floor_us:6.2f} us | gemm() {t_gemm:7.2f} "
                  f"{100 * floor_us / t_gemm:4.0f}% | skinny best {best['us']:7.2f} {100 * floor_us / best['us']:4.0f}% "
                  f"bn{best['block_n']} st{best['stages']} sk{best['split']} units {best['units']} "
                  f"({len(cands)} tried)", flush=True)
            del sets
            torch.cuda.empty_cache()
    save_json(args.json, copy_gbps=bw / 1e9, rows=rows)


if __name__ == "__main__":
    main()
