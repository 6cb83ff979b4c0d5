"""H100 sweep of the portable GEMM's split-K at small M and large K (fp8_block), with an A/B of
the split-K reduction.

Question (small M, the 85%-of-the-memory-floor target of docs/design.md, "The bar"): at
2 <= M <= 128 on K >= 7168 the portable kernel needs a K split to fill 132 SMs, and "many short
units" is what pays at decode (benchmarks/NOTES.md 2026-11-22, "The ceiling"), but more splits
cost more reduction. For each case it times, with CUDA-graph replay and inputs rotated
past L2 (blockscaled.bench.timing.time_op):

  * the heuristic's choice (``heur``) and a grid: the tile candidates below at every split the
    launcher runs (config/gemm.py::_split_counts, <= 16) with at most ``--max-waves`` waves of
    programs;
  * with ``--old PATH`` (a copy of an older kernels/triton/gemm.py): the same split configs
    through that kernel (``old``), same run, same inputs: the reduction A/B.

Tile candidates: M <= 32: swap-AB 16/32 x 64 (wgmma) and 16/32 x 16 / 32 (mma.sync, deep ring);
M > 32: 64x64 w4, 64x128 w4, 128x64 w8, 128x128 w8. Every output is checked first (NaN-poisoned,
vs dequantize + fp32 matmul, two runs bitwise equal). Prints one line per config and the best
per case; ``--out`` writes all rows as JSON.

    python scripts/splitk_sweep.py --old out/ab_old_gemm.py --out $OUT/splitk_sweep.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = "2112x7168,4096x7168,7168x16384"
MS = "16,32,64,128"


def load_old_kernel(path: str):
    """Import ``gemm_kernel`` from an older copy of kernels/triton/gemm.py (its relative import
    of ``_mma`` made absolute; written next to the copy so Triton can read the source)."""
    src = Path(path).read_text().replace("from ._mma import", "from blockscaled.kernels.triton._mma import")
    dst = Path(path).with_name("_ab_old_gemm_abs.py")
    dst.write_text(src)
    spec = importlib.util.spec_from_file_location("_ab_old_gemm", dst)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.gemm_kernel


@contextlib.contextmanager
def kernel_swapped(kernel):
    import blockscaled.ops.gemm as gemm_mod

    if kernel is None:
        yield
        return
    saved = gemm_mod.gemm_kernel
    gemm_mod.gemm_kernel = kernel
    try:
        yield
    finally:
        gemm_mod.gemm_kernel = saved


def candidates(m, n, k, sms, max_waves):
    import torch

    from blockscaled.config import GemmConfig, choose_gemm_config
    from blockscaled.config.gemm import _split_counts, default_promote

    heur = choose_gemm_config("fp8_block", m, n, k, torch.device("cuda"), allow_hopper=False, allow_gemv=False)
    promote = default_promote("fp8_block", m, None)
    rows = 16 if m <= 16 else 32
    if m <= 32:
        tiles = [(rows, 64, 4, 4, True), (rows, 128, 4, 4, True), (rows, 32, 4, 8, True), (rows, 16, 4, 8, True)]
    else:
        tiles = [(64, 64, 4, 4, False), (64, 128, 4, 4, False), (128, 64, 8, 4, False), (128, 128, 8, 3, False)]
    kiters = math.ceil(k / 128)
    counts = list(_split_counts(kiters, 16))
    keep = {1, 2, 3, 4, 6, 8, counts[-1]}  # a subset: every split is one more compile
    out = [("heur", heur)]
    for bm, bn, w, st, swap in tiles:
        t = math.ceil(m / bm) * math.ceil(n / bn)
        for s in counts:
            if t * s > max_waves * sms and s > 1:
                break
            if s not in keep:
                continue
            c = GemmConfig(bm, bn, 128, w, st, s, "triton", promote, 8, swap)
            if c != heur:
                out.append(("grid", c))
    return out


def _compile_worker(job):
    """Run one config once on small inputs with the same Triton specialization as the timed
    cases (every M, N, K there is a multiple of 16, K of 128), filling the on-disk cache."""
    import torch

    from blockscaled.ops.gemm import gemm
    from sweep_small_m import make_act, make_weight

    old_path, c = job
    kernel = load_old_kernel(old_path) if old_path else None
    b = make_weight("fp8_block", 512, 7168, 1)
    a = make_act("fp8_block", 16 if c.swap_ab else 128, 7168, 2)
    try:
        with kernel_swapped(kernel):
            gemm(a, b, config=c)
        torch.cuda.synchronize()
        return None
    except Exception as e:
        return f"{c}: {type(e).__name__}"


def precompile(jobs, procs):
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(procs) as pool:
        errs = [e for e in pool.imap_unordered(_compile_worker, jobs) if e]
    return errs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=SHAPES, help="NxK,...")
    p.add_argument("--ms", default=MS)
    p.add_argument("--old", default=None, help="older kernels/triton/gemm.py for the A/B ('old' rows)")
    p.add_argument("--max-waves", type=float, default=3.0)
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--jobs", type=int, default=12, help="compile worker processes (0: compile lazily)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    import torch

    import blockscaled.ops.gemm as gemm_mod
    from blockscaled.bench.counting import gemm_count
    from blockscaled.bench.timing import rotation_count
    from blockscaled.ops.quantize import dequantize
    from sweep_small_m import check_and_time, label, make_act, make_weight, programs

    t_start = time.time()
    old = load_old_kernel(args.old) if args.old else None
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    ms = [int(x) for x in args.ms.split(",")]
    dev = torch.device("cuda")
    print(f"# {torch.cuda.get_device_name()} {sms} SMs; old kernel: {args.old}", flush=True)
    cases = {(n, k, m): candidates(m, n, k, sms, args.max_waves) for n, k in shapes for m in ms}
    if args.old:  # the reduction A/B: every split config of the heuristic's tile, through the old kernel
        for key, cands in cases.items():
            h = cands[0][1]
            cands += [("old", c) for _, c in cands if c.split_k > 1 and
                      (c.block_m, c.block_n, c.swap_ab) == (h.block_m, h.block_n, h.swap_ab)]
    jobs = sorted({(args.old if kind == "old" else None, c) for cands in cases.values() for kind, c in cands},
                  key=lambda j: (j[0] or "", str(j[1])))
    t0 = time.time()
    errs = precompile(jobs, args.jobs) if args.jobs > 0 else []
    print(f"# precompiled {len(jobs)} specializations in {time.time() - t0:.0f} s ({args.jobs} procs); "
          f"{sum(len(v) for v in cases.values())} configs; errors: {errs[:5]}", flush=True)
    rows, best = [], []
    for n, k in shapes:
        b_sets = None
        for m in ms:
            cnt = gemm_count(m, n, k, "fp8_block", "fp8_block", torch.bfloat16)
            floor_us = cnt.bytes / 3.0e12 * 1e6
            n_sets = rotation_count(cnt.bytes)
            if b_sets is None or len(b_sets) < n_sets:
                b_sets = [make_weight("fp8_block", n, k, 100 + i) for i in range(n_sets)]
            a_sets = [make_act("fp8_block", m, k, 200 + i) for i in range(n_sets)]
            outs = [torch.empty(m, n, dtype=torch.bfloat16, device=dev) for _ in range(n_sets)]
            sets = [(a_sets[i], b_sets[i], outs[i]) for i in range(n_sets)]
            ref = dequantize(a_sets[0], torch.float32) @ dequantize(b_sets[0], torch.float32).t()
            cands = cases[(n, k, m)]
            case = []
            for kind, c in cands:
                row = {"n": n, "k": k, "m": m, "kind": kind, "config": label(c), "cfg": dataclasses.asdict(c),
                       "programs": programs(c, m, n, k), "floor_us": floor_us}
                with kernel_swapped(old if kind == "old" else None):
                    check_and_time(row, c, a_sets[0], b_sets[0], ref, sets, args.iters, floor_us)
                rows.append(row)
                case.append(row)
                print(f"{n:>6}x{k:<5} {m:>4} {kind:4} {row['config']:30} {row['programs']:>5} "
                      f"{row.get('us', float('nan')):7.2f} {row.get('pct_floor', float('nan')):5.1f} {row['check']}",
                      flush=True)
            nz = sum(int((buf != 0).sum().item()) for buf in
                     [*gemm_mod._COUNTERS.values(), *gemm_mod._GRAPH_COUNTERS.values()])
            if nz:
                print(f"!! {nz} split-K counters not zero after {n}x{k} M={m}", flush=True)
            good = [r for r in case if r.get("check") == "ok" and "us" in r and r["kind"] != "old"]
            if good:
                bst = min(good, key=lambda r: r["us"])
                heur = case[0]
                best.append((n, k, m, bst, heur))
            del sets, outs, a_sets
    print("\n# best per case (new kernel)   [heur = the heuristic's choice]")
    for n, k, m, bst, heur in best:
        print(f"{n:>6}x{k:<5} M={m:<4} best {bst['config']:30} {bst['us']:7.2f} us {bst['pct_floor']:5.1f}%   "
              f"heur {heur['config']} {heur.get('us', float('nan')):.2f} us {heur.get('pct_floor', float('nan')):.1f}%")
    if old is not None:
        print("\n# reduction A/B: new / old time, per split count (geomean over configs)")
        by = {}
        olds = {(r["n"], r["k"], r["m"], r["config"]): r for r in rows if r["kind"] == "old" and "us" in r}
        for r in rows:
            o = olds.get((r["n"], r["k"], r["m"], r["config"]))
            if r["kind"] != "old" and o and "us" in r:
                by.setdefault(r["cfg"]["split_k"], []).append(r["us"] / o["us"])
        for s, v in sorted(by.items()):
            print(f"split {s:>2}: {math.exp(sum(map(math.log, v)) / len(v)):.3f} over {len(v)} configs "
                  f"(min {min(v):.3f}, max {max(v):.3f})")
    print(f"# total {time.time() - t_start:.0f} s")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        import triton

        env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
        Path(args.out).write_text(json.dumps({"env": env, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
