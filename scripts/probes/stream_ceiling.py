"""What fraction of the memory floor can ANY kernel reach at decode sizes on this GPU?

    python scripts/probes/stream_ceiling.py [--shapes NxK,...] [--json OUT.json]     # ~1 min on an H100

The small-M target (docs/design.md, "The bar") is 85% of the memory floor (bytes read once + output
written once at the copy bandwidth the bench measures, 256 MiB copies). At 15-30 MB a launch lasts
5-10 us, so a fixed per-launch cost (graph launch gap, DRAM latency of the first loads, the last
wave's tail) weighs 10-40%. This probe measures, with the bench's timer
(``blockscaled.bench.timing.time_op``: CUDA-graph replays, inputs rotated past L2):
  * an empty kernel (the per-launch cost of a graph node on its own);
  * a pure streaming read of exactly the bytes of each shape at M=1 (weights, weight scales, one
    activation row), the best of several grid shapes: the ceiling for a GEMV that must read
    those bytes;
  * ``blockscaled.gemm`` at M=1 and M=16 on the same shapes (the planner's plan), for the gap to
    that ceiling, with the plan that ran and the device time of each of its kernels (profiler).
"""

from __future__ import annotations

import argparse
import json

import triton
import triton.language as tl

#: the DeepSeek-V3 dense (N, K) shapes
NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))


def floor_bytes(m: int, n: int, k: int) -> int:
    """Bytes of the memory floor of an fp8_block GEMM: A, B and their fp32 scales read once (1x128
    / 128x128 blocks), the bf16 output written once."""
    nk = -(-k // 128)
    return m * k + n * k + m * nk * 4 + (-(-n // 128)) * nk * 4 + m * n * 2


@triton.jit
def _empty_kernel(x_ptr):
    pass


@triton.jit
def _xor(a, b):
    return a ^ b


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


def kernel_device_us(fn, sets, calls: int = 20) -> dict:
    """Mean device time (us) of each kernel that ``fn`` launches, from the CUDA profiler over
    ``calls`` eager calls: next to the graph time per call it shows the gap between kernels."""
    import torch

    for args in sets[:2]:
        fn(*args)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            fn(*sets[i % len(sets)])
        torch.cuda.synchronize()
    res = {}
    for ev in prof.key_averages():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.count:
            total = getattr(ev, "device_time_total", None) or ev.cuda_time_total
            res[ev.key[:60]] = round(total / calls, 2)
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--shapes", default=None, help="NxK,NxK,... (default: the six DeepSeek-V3 shapes)")
    p.add_argument("--json", default=None, help="write the rows to this file")
    args = p.parse_args()
    shapes = NK if not args.shapes else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]

    import torch

    import blockscaled as bs
    from blockscaled.bench.runner import measure_roofline
    from blockscaled.bench.timing import rotation_count, time_op
    from blockscaled.plan import observe_plans
    from blockscaled.testing import fp8_block_operands

    if not torch.cuda.is_available():
        print("stream_ceiling.py: needs a CUDA GPU")
        return 2
    dev = torch.device("cuda")
    bw = measure_roofline(iterations=20)["copy_gbps"] * 1e9
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s ({torch.cuda.get_device_name()})")
    out = {"device": torch.cuda.get_device_name(), "copy_gbps": bw / 1e9, "rows": []}
    x = torch.zeros(16, device=dev)
    t = time_op(lambda x: _empty_kernel[(132,)](x), [(x,)], warmup=5, iterations=30, reps_per_graph=100)
    out["empty_us"] = t.median_ms * 1e3
    print(f"empty kernel, graph per-call: {out['empty_us']:.2f} us")
    print(f"{'N':>6}{'K':>7}{'MB':>7}{'floor us':>9} | {'read us':>8}{'%':>5} {'cfg':>14} | "
          f"{'gemm M=1':>9}{'%':>5} | {'M=16':>7}{'%':>5}")
    for n, k in shapes:
        nk = -(-k // 128)
        read_bytes = n * k + (-(-n // 128)) * nk * 4 + k + nk * 4  # weights, their scales, x row + scales
        words = -(-read_bytes // 8)
        floor_us = (read_bytes + 2 * n) / bw * 1e6
        sets = [(torch.empty(words, dtype=torch.int64, device=dev).random_(),)
                for _ in range(rotation_count(words * 8))]
        best = None
        for block, iters in ((1024, 4), (2048, 4), (1024, 8), (2048, 8), (4096, 4), (512, 16)):
            grid = triton.cdiv(words, block * iters)
            o = torch.empty(grid, dtype=torch.int64, device=dev)
            t = time_op(lambda x: _read_kernel[(grid,)](x, o, words, BLOCK=block, ITERS=iters, num_warps=8),
                        sets, warmup=5, iterations=30).median_ms * 1e3
            if best is None or t < best[0]:
                best = (t, f"{block}x{iters} g{grid}")
        del sets
        row = {"n": n, "k": k, "bytes": read_bytes, "floor_us": floor_us, "read_us": best[0], "read_cfg": best[1]}
        for m in (1, 16):
            fl = floor_bytes(m, n, k) / bw * 1e6
            n_sets = min(8, rotation_count(floor_bytes(m, n, k)))
            qs = [fp8_block_operands(m, n, k, s, device=dev) for s in range(n_sets)]
            with observe_plans() as plans:
                bs.gemm(*qs[0])
            tg = time_op(lambda a, b: bs.gemm(a, b), qs, warmup=5, iterations=30).median_ms * 1e3
            row[f"gemm_m{m}_us"] = tg
            row[f"gemm_m{m}_pct"] = 100 * fl / tg
            row[f"gemm_m{m}_plan"] = plans[-1].describe() if plans else "?"
            row[f"gemm_m{m}_kernels"] = kernel_device_us(lambda a, b: bs.gemm(a, b), qs)
            del qs
        out["rows"].append(row)
        print(f"{n:>6}{k:>7}{read_bytes / 1e6:7.1f}{floor_us:9.2f} | {best[0]:8.2f}{100 * floor_us / best[0]:5.0f} "
              f"{best[1]:>14} | {row['gemm_m1_us']:9.2f}{row['gemm_m1_pct']:5.0f} | {row['gemm_m16_us']:7.2f}"
              f"{row['gemm_m16_pct']:5.0f}", flush=True)
        for m in (1, 16):
            print(f"   M={m}: {row[f'gemm_m{m}_plan']}; kernels (us): {row[f'gemm_m{m}_kernels']}")
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
