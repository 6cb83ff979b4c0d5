"""What fraction of the memory floor can ANY kernel reach at decode sizes on this GPU?

    python scripts/stream_ceiling.py [--json OUT.json]     # ~1 min on an H100

The small-M target (docs/design.md, "The bar") is 85% of the memory floor (bytes read once + output
written once at the copy bandwidth the bench measures, 256 MiB copies). At 15-30 MB a launch lasts
5-10 us, so a fixed per-launch cost (graph launch gap, DRAM latency of the first loads, the last
wave's tail) weighs 10-40%. This script measures, with the bench's own timer (CUDA-graph replays,
inputs rotated past L2):
  * an empty kernel (the per-launch cost of a graph node on its own);
  * a pure streaming read of exactly the bytes of each DeepSeek-V3 shape at M=1 (weights, weight
    scales, one activation row), the best of several grid shapes: the ceiling for a GEMV that
    must read those bytes;
  * our ``gemm()`` at M=1 and M=16 on the same shapes, for the gap to that ceiling.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from blockscaled.bench.runner import measure_roofline  # noqa: E402
from blockscaled.bench.timing import rotation_count, time_op  # noqa: E402
from blockscaled.ops.gemm import gemm  # noqa: E402

from hopper_small_m import DEV, NK, case_inputs, save_json  # noqa: E402  (scripts/ is on sys.path when run as a script)


@triton.jit
def _empty_kernel(x_ptr):
    pass


@triton.jit
def _read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    # Each program reads ITERS consecutive BLOCK-element int64 chunks (16-byte vector loads) and
    # writes one word, so the compiler cannot drop the loads.
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.int64)
    base = pid.to(tl.int64) * BLOCK * ITERS
    for i in tl.static_range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(x_ptr + offs, mask=offs < n, other=0, cache_modifier=".cg")
    tl.store(out_ptr + pid, tl.reduce(acc, 0, _xor))


@triton.jit
def _xor(a, b):
    return a ^ b


def kernel_times(fn, sets, reps=40):
    """Per-kernel device time (us, mean over a graph of ``reps`` calls) from the CUDA profiler:
    compared with the graph per-call time it shows the gap between back-to-back kernels."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(*sets[0])
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for i in range(reps):
            fn(*sets[i % len(sets)])
    g.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    res = {}
    for ev in prof.key_averages():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.count:
            res[ev.key[:60]] = round(getattr(ev, "device_time_total", None) or ev.cuda_time_total, 2) / reps
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rl = measure_roofline(iterations=20)
    bw = rl["copy_gbps"] * 1e9
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s ({torch.cuda.get_device_name()})")
    out = {"copy_gbps": rl["copy_gbps"], "rows": []}
    x = torch.zeros(16, device=DEV)
    t = time_op(lambda x: _empty_kernel[(132,)](x), [(x,)], warmup=5, iterations=30, reps_per_graph=100)
    out["empty_us"] = t.median_ms * 1e3
    print(f"empty kernel, graph per-call: {out['empty_us']:.2f} us")
    print(f"{'N':>6}{'K':>7}{'MB':>7}{'floor us':>9} | {'read us':>8}{'%':>5} {'cfg':>14} | "
          f"{'gemm M=1':>9}{'%':>5} | {'M=16':>7}{'%':>5}")
    for n, k in NK:
        nk = -(-k // 128)
        read_bytes = n * k + (-(-n // 128)) * nk * 4 + k + nk * 4  # weights, their scales, x row + scales
        words = -(-read_bytes // 8)
        floor_us = (read_bytes + 2 * n) / bw * 1e6
        sets = [(torch.empty(words, dtype=torch.int64, device=DEV).random_(), ) for _ in
                range(rotation_count(words * 8))]
        best = None
        for block, iters in ((1024, 4), (2048, 4), (1024, 8), (2048, 8), (4096, 4), (512, 16)):
            grid = triton.cdiv(words, block * iters)
            o = torch.empty(grid, dtype=torch.int64, device=DEV)
            t = time_op(lambda x: _read_kernel[(grid,)](x, o, words, BLOCK=block, ITERS=iters, num_warps=8),
                        sets, warmup=5, iterations=30).median_ms * 1e3
            if best is None or t < best[0]:
                best = (t, f"{block}x{iters} g{grid}")
        row = {"n": n, "k": k, "bytes": read_bytes, "floor_us": floor_us, "read_us": best[0], "read_cfg": best[1]}
        for m in (1, 16):
            fl, qs, _ = case_inputs(m, n, k, bw)
            tg = time_op(lambda a, b: gemm(a, b), qs, warmup=5, iterations=30).median_ms * 1e3
            row[f"gemm_m{m}_us"] = tg
            row[f"gemm_m{m}_pct"] = 100 * fl / tg
            row[f"gemm_m{m}_kernels"] = kernel_times(lambda a, b: gemm(a, b), qs)
            del qs
        out["rows"].append(row)
        print("   kernels M=1:", row["gemm_m1_kernels"], " M=16:", row["gemm_m16_kernels"])
        print(f"{n:>6}{k:>7}{read_bytes / 1e6:7.1f}{floor_us:9.2f} | {best[0]:8.2f}{100 * floor_us / best[0]:5.0f} "
              f"{best[1]:>14} | {row['gemm_m1_us']:9.2f}{row['gemm_m1_pct']:5.0f} | {row['gemm_m16_us']:7.2f}"
              f"{row['gemm_m16_pct']:5.0f}", flush=True)
        del sets
        torch.cuda.empty_cache()
    save_json(args.json, **out)


if __name__ == "__main__":
    main()
