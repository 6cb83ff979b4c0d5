"""H100 sweep of the CUDA-core decode GEMV (strategy "gemv", kernels/triton/gemv.py) against ``gemm()``.

    python scripts/gemv_sweep.py [--ms 1,2,4] [--shapes NxK,..] [--json OUT.json]

For every shape and M: each (chunk bytes, warps) candidate is checked once against the float64
reference of the same quantized inputs, then timed with the bench's timer (CUDA-graph medians,
inputs rotated past L2) and printed as % of the memory floor (bytes read once + output written
once at the copy bandwidth measured in the same run), next to today's ``gemm()`` dispatch.
"""

from __future__ import annotations

import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from blockscaled.bench.runner import measure_roofline  # noqa: E402
from blockscaled.bench.timing import time_op  # noqa: E402
from blockscaled.config.gemm import choose_gemm_config, gemv_config  # noqa: E402
from blockscaled.ops.gemm import gemm  # noqa: E402

from hopper_small_m import case_inputs, checked_us, save_json, sweep_cli  # noqa: E402  (scripts/ is on sys.path when run as a script)

CHUNKS = (8192, 16384, 32768, 65536)


def candidates(m, n, k):
    seen = set()
    for chunk in CHUNKS:
        for warps in (4, 8, 16):
            cfg = gemv_config(m, n, k, chunk_bytes=chunk, num_warps=warps)
            if cfg not in seen:
                seen.add(cfg)
                yield chunk, cfg


def main():
    args = sweep_cli(__doc__, "1,2,4")
    bw = measure_roofline(iterations=10)["copy_gbps"] * 1e9
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s")
    rows = []
    for m in args.ms:
        for n, k in args.shapes:
            floor_us, sets, ref = case_inputs(m, n, k, bw)
            disp = choose_gemm_config("fp8_block", m, n, k, sets[0][0].data.device)
            t_gemm = time_op(lambda a, b: gemm(a, b), sets, warmup=5, iterations=30).median_ms * 1e3
            cands = []
            for chunk, cfg in candidates(m, n, k):
                t = checked_us(lambda a, b, cfg=cfg: gemm(a, b, config=cfg), sets, ref, f"{m}x{n}x{k} {cfg}")
                cands.append({"chunk": chunk, "block_m": cfg.block_m, "block_n": cfg.block_n, "block_k": cfg.block_k,
                              "warps": cfg.num_warps, "programs": triton.cdiv(n, cfg.block_n), "us": t})
            best = min(cands, key=lambda c: c["us"])
            rows.append({"m": m, "n": n, "k": k, "floor_us": floor_us, "gemm_us": t_gemm, "gemm_cfg": str(disp),
                         "best": best, "candidates": cands})
            print(f"M={m:>2} {n:>6}x{k:<6} floor {floor_us:6.2f} us | gemm() {t_gemm:7.2f} "
                  f"{100 * floor_us / t_gemm:4.0f}% | gemv best {best['us']:7.2f} {100 * floor_us / best['us']:4.0f}% "
                  f"chunk {best['chunk'] // 1024}K rows {best['block_n']} w{best['warps']} p{best['programs']} | "
                  + " ".join(f"{c['chunk'] // 1024}K/w{c['warps']}:{100 * floor_us / c['us']:.0f}" for c in cands),
                  flush=True)
            del sets
            torch.cuda.empty_cache()
    save_json(args.json, copy_gbps=bw / 1e9, rows=rows)


if __name__ == "__main__":
    main()
