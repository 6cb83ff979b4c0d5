"""GPU A/B of bs.grouped_gemm's eager fast path and of the config it carries (H100 / H200).

Per case (fp8_block, 128x128 weights, bf16 out, default validate=False: the GEMM + the device
metadata check per call) and per path -- "fast": the eager fast path (implementation called
directly), "op": through the torch.library custom op (``blockscaled.ops.gemm.EAGER_FAST_PATH =
False``) -- it prints the host time per call (``--iters`` back-to-back calls issued, no sync) and
the wall time per call (the same calls until the GPU is done), the CUDA-graph time of one call,
and the HopperConfig that ops._hopper.choose_grouped_config picks for the shape. The two paths'
outputs must be bitwise equal (checked first). For E=4 m=512 N=7168 K=7168 it also times, in
CUDA graphs, the launcher with the chosen config and with its tail split removed: the
``bs.grouped_gemm`` row should match the split one (before the config crossed the custom op whole,
it ran unsplit: 226.5 us vs 209.8 split on an H100).

    python scripts/grouped_eager_ab.py [--iters 200] [--rounds 7] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch

import blockscaled as bs
from blockscaled.ops import _hopper as H
from blockscaled.ops import gemm as gemm_mod

#: (name, layout, experts, rows per expert, N, K)
CASES = (("E8 m64 contiguous", "contiguous", 8, 64, 4096, 7168),
         ("E8 m64 masked", "masked", 8, 64, 4096, 7168),
         ("E4 m512 contiguous", "contiguous", 4, 512, 7168, 7168))


def operands(layout, e, m, n, k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    rows = (e * m,) if layout == "contiguous" else (e, m)
    x = torch.randn(*rows, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(e, n, k, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
    a, b = bs.quantize(x, "fp8_block"), bs.quantize(w, "fp8_block", block=(128, 128))
    if layout == "contiguous":
        meta = {"offsets": torch.arange(0, (e + 1) * m, m, dtype=torch.int32, device="cuda")}
    else:
        meta = {"masked_m": torch.full((e,), m, dtype=torch.int32, device="cuda")}
    return a, b, meta


def eager_us(fn, iters: int) -> tuple[float, float]:
    """(host us per call, wall us per call) of ``iters`` back-to-back calls."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / iters * 1e6, (t2 - t0) / iters * 1e6


def graph_us(fn, rounds: int, reps: int = 10) -> float:
    """Median over ``rounds`` replays of a CUDA graph holding ``reps`` calls, us per call."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    times = []
    for _ in range(rounds):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit("needs an sm_90 (Hopper) GPU")
    nsm = H.num_sms_of(torch.device("cuda"))
    print(f"{torch.cuda.get_device_name()}  {nsm} SMs  torch {torch.__version__}  iters {args.iters}  "
          f"rounds {args.rounds}")
    rows = []
    hdr = f"{'case':<20} {'path':<5} {'host us':>8} {'wall us':>8} {'graph us':>9}  config"
    print(hdr)
    print("-" * len(hdr))
    for name, layout, e, m, n, k in CASES:
        a, b, meta = operands(layout, e, m, n, k)
        cfg = H.choose_grouped_config(m, n, k, nsm, 2, e)
        desc = f"{cfg.block_m}x{cfg.block_n} stages {cfg.stages} tail_split {cfg.tail_split}"
        outs = {}
        for path, fast in (("fast", True), ("op", False)):
            gemm_mod.EAGER_FAST_PATH = fast
            try:
                def fn():
                    return bs.grouped_gemm(a, b, **meta)

                outs[path] = fn()
                for _ in range(3):
                    fn()
                # interleave nothing else: the path is a process-wide switch; take the best of
                # three batches (host time is noisy on a shared host)
                batches = [eager_us(fn, args.iters) for _ in range(3)]
                host = min(t[0] for t in batches)
                wall = min(t[1] for t in batches)
                gus = graph_us(fn, args.rounds)
            finally:
                gemm_mod.EAGER_FAST_PATH = True
            rows.append({"case": name, "path": path, "host_us": host, "wall_us": wall, "graph_us": gus,
                         "config": dataclasses.asdict(cfg)})
            print(f"{name:<20} {path:<5} {host:8.1f} {wall:8.1f} {gus:9.1f}  {desc}")
        if not torch.equal(outs["fast"].view(torch.int16), outs["op"].view(torch.int16)):
            raise SystemExit(f"{name}: the fast path and the custom op gave different bits")
        if cfg.tail_split > 1:
            # the launcher alone, with the chosen config and without its tail split
            seg = meta.get("offsets", meta.get("masked_m"))
            mode = 1 if layout == "contiguous" else 2
            out = torch.empty(outs["fast"].shape, dtype=torch.bfloat16, device="cuda")
            for label, c in (("launcher, chosen", cfg), ("launcher, no split", dataclasses.replace(cfg, tail_split=1))):
                gus = graph_us(lambda c=c: H.grouped_fp8_block_hopper_impl(a.data, a.scale, b.data, b.scale, seg,
                                                                              mode, out, c), args.rounds)
                rows.append({"case": name, "path": label, "graph_us": gus, "config": dataclasses.asdict(c)})
                print(f"{name:<20} {'':<5} {'':>8} {'':>8} {gus:9.1f}  {label} (tail_split {c.tail_split})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "sms": nsm, "torch": torch.__version__,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
