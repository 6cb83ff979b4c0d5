"""H100 sweep of the portable GEMM at small M (decode): configs vs the memory floor.

For each DeepSeek-V3 weight shape (N x K) and M in {1, 16, 64, 128}: times a grid of forced
``GemmConfig``s around the heuristic's choice (``heur``) and the pre-fusion heuristic's choice
(``old``; it now runs with the fused split-K too) with CUDA-graph replay
(``blockscaled.bench.timing.time_op``; inputs rotated over copies that together exceed 2x L2
so B is never L2-resident), checks every config's output (vs dequantize + fp32 matmul of the
same operands; NaN-poisoned output; split-K twice -> bitwise equal) and prints

    shape, M, config, programs, us, % of memory floor, model us (config/gemm.py::small_m_model)

plus the best config per (shape, M). ``--out PATH`` writes all rows as JSON.

Budget (one device call, < 4 min on an H100): every distinct kernel specialization compiles
once; ``--jobs`` worker processes compile them in parallel first (each runs every config once
on small copies of the same shapes; Triton's on-disk cache then serves the timing process).

    python scripts/sweep_small_m.py --out $OUT/sweep_small_m.json
    python scripts/sweep_small_m.py --fmt mxfp8 --ms 1,64 --out ...      # other formats / subsets
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

SHAPES = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
MS = (1, 16, 64, 128)


# --------------------------------------------------------------------------- configs
def _old_choice(fmt, m, n, k, sms):
    """The small-M heuristic before the fused split-K (git history of config/gemm.py), for
    reference: 128-wide tiles halved to 64 below one wave, split-K to about one wave."""
    from blockscaled.config import GemmConfig
    from blockscaled.config.gemm import _FP8_LARGE_TILE_STAGES, _SCALE_K, _stages, default_promote

    promote = default_promote(fmt, m, None)
    bm = 16 if m <= 16 else 32 if m <= 32 else 64 if m <= 64 else 128
    bk = min(128, _SCALE_K[fmt]) if promote else 128
    if promote:
        bm = max(bm, 64)
    bn = 128
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    if tiles < sms:
        bn = 64
        tiles = math.ceil(m / bm) * math.ceil(n / bn)
    split, kiters = 1, math.ceil(k / bk)
    if tiles * 2 <= sms and kiters >= 16:
        split = max(1, min(sms // tiles, kiters // 8, 16))
    warps = 8 if bm * bn >= 128 * 128 else 4
    stages = _stages(bm, bn, bk, fmt, 0, promote, 232448)
    if fmt == "fp8_block" and bm == 128:
        stages = min(stages, _FP8_LARGE_TILE_STAGES)
    return GemmConfig(bm, bn, bk, warps, stages, split, "triton", promote, 8)


def candidates(fmt, m, n, k, info):
    """[(label, GemmConfig)]: heur, old, and <= 10 grid points around them (BLOCK_N 64 / 128,
    a few split counts around ~2 programs per SM, deeper pipelines, the other BLOCK_M at M > 64)."""
    from blockscaled.config import choose_gemm_config

    import torch

    # the portable tensor-core kernel's configs only (not the Hopper kernels, not the M=1 GEMV)
    heur = choose_gemm_config(fmt, m, n, k, torch.device("cuda"), allow_hopper=False, allow_gemv=False)
    old = _old_choice(fmt, m, n, k, info.sm_count)
    out = [("heur", heur)] + ([("old", old)] if old != heur else [])
    if heur.strategy != "triton":
        return out[:1]
    bm, bk = heur.block_m, heur.block_k
    kiters = math.ceil(k / bk)
    smax = max(1, min(16, kiters // 2))

    def splits(bm_, bn_):
        tiles = math.ceil(m / bm_) * math.ceil(n / bn_)
        s = min(smax, max(1, round(2 * info.sm_count / tiles)))
        return s, sorted({1, max(1, s // 2), s, min(smax, 2 * s)})

    grid = []
    for bn in (64, 128):
        warps = 8 if bm * bn >= 128 * 128 else 4
        lo, hi = (4, 6) if bn == 64 else (3, 4)
        s_star, ss = splits(bm, bn)
        grid += [heur.replace(block_n=bn, num_warps=warps, num_stages=lo, split_k=s) for s in ss]
        grid.append(heur.replace(block_n=bn, num_warps=warps, num_stages=hi, split_k=s_star))
    if heur.swap_ab:  # the unswapped 64-row tile at the heuristic's split, for comparison
        grid.insert(0, heur.replace(block_m=64, swap_ab=False))
    if m > 64:
        obm = 64 if bm == 128 else 128
        warps = 8 if obm * 128 >= 128 * 128 else 4
        grid.append(heur.replace(block_m=obm, block_n=128, num_warps=warps, num_stages=3,
                                 split_k=splits(obm, 128)[0]))
    seen = {c for _, c in out}
    for c in grid:
        if c not in seen and len(out) < 12:
            seen.add(c)
            out.append(("grid", c))
    return out


def label(c) -> str:
    if c.strategy != "triton":
        return c.strategy
    return (f"{c.block_m}x{c.block_n}x{c.block_k} w{c.num_warps} s{c.num_stages}"
            + (f" sk{c.split_k}" if c.split_k > 1 else "") + (" swap" if c.swap_ab else ""))


def programs(c, m, n, k) -> int:
    from blockscaled.ops.gemm import _split_plan

    if c.strategy != "triton":
        return 0
    split = _split_plan(k, c.block_k, c.split_k)[0]
    return math.ceil(m / c.block_m) * math.ceil(n / c.block_n) * split


# --------------------------------------------------------------------------- inputs
def make_weight(fmt, n, k, seed):
    import torch

    from blockscaled.ops.quantize import quantize

    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, k, device="cuda", generator=g).mul_(0.05).to(torch.bfloat16)
    return quantize(w, fmt, block=(128, 128) if fmt == "fp8_block" else None)


def make_act(fmt, m, k, seed):
    import torch

    from blockscaled.ops.quantize import quantize

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    return quantize(x, fmt)


# --------------------------------------------------------------------------- one config
def check_and_time(row, c, a0, b0, ref, sets, iters, floor_us):
    """Correctness first (NaN-poisoned output vs ``ref``, relative Frobenius error < 1e-2, two runs
    bitwise equal, no NaN left), then the CUDA-graph time over the rotated ``sets``; fills ``row``
    (check, rel_err, bitwise_repeat, us, p20_us, p80_us, method, pct_floor). Errors (e.g. out of
    shared memory) go to row["check"] as "ERR ..." so that a sweep keeps going."""
    import torch

    from blockscaled.bench.timing import time_op
    from blockscaled.ops.gemm import gemm

    m, n = a0.shape[0], b0.shape[0]
    try:
        y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=ref.device)
        gemm(a0, b0, out=y, config=c)
        y2 = gemm(a0, b0, config=c)
        err = ((y.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        same = torch.equal(y.view(torch.int16), y2.view(torch.int16))
        nan = bool(torch.isnan(y).any())
        row["rel_err"], row["bitwise_repeat"] = err, same
        row["check"] = "ok" if (err < 1e-2 and same and not nan) else f"BAD(err={err:.1e},rep={same},nan={nan})"
        t = time_op(lambda a, b, o: gemm(a, b, out=o, config=c), sets, warmup=3, iterations=iters, budget_ms=150.0)
        row["us"] = t.median_ms * 1e3
        row["p20_us"], row["p80_us"], row["method"] = t.p20_ms * 1e3, t.p80_ms * 1e3, t.method
        row["pct_floor"] = 100.0 * floor_us / row["us"]
    except Exception as e:  # e.g. out of shared memory: keep going
        row["check"] = f"ERR {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
        torch.cuda.synchronize()
    return row


# --------------------------------------------------------------------------- precompile
def _compile_worker(job):
    """Run each config once on fresh inputs of the same shapes (same Triton specialization as
    the timing process), filling Triton's on-disk cache. Returns (n, k, m, errors)."""
    import torch

    from blockscaled.ops.gemm import gemm

    fmt, n, k, m, cfgs = job
    b = make_weight(fmt, n, k, 1)
    a = make_act(fmt, m, k, 2)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    errs = []
    for c in cfgs:
        try:
            gemm(a, b, out=out, config=c)
        except Exception as e:  # reported again (and kept) by the timing pass
            errs.append(f"{label(c)}: {type(e).__name__}")
    torch.cuda.synchronize()
    return n, k, m, errs


def precompile(fmt, cases, jobs):
    import multiprocessing as mp

    work = [(fmt, n, k, m, [c for _, c in cands]) for (n, k, m), cands in cases.items()]
    if jobs <= 1:
        for w in work:
            _compile_worker(w)
        return
    with mp.get_context("spawn").Pool(jobs) as pool:
        for _ in pool.imap_unordered(_compile_worker, work):
            pass


# --------------------------------------------------------------------------- main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="write the rows as JSON here")
    p.add_argument("--fmt", default="fp8_block")
    p.add_argument("--ms", default=",".join(map(str, MS)))
    p.add_argument("--shapes", default="all", help="'all' or indices into the six shapes, e.g. 0,3")
    p.add_argument("--jobs", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 2)),
                   help="compile worker processes (0: compile lazily in the timing process)")
    p.add_argument("--iters", type=int, default=15, help="timed graph replays per config")
    args = p.parse_args(argv)

    import torch

    from blockscaled.bench.counting import gemm_count
    from blockscaled.bench.timing import rotation_count
    from blockscaled.config.gemm import device_info, small_m_model
    import blockscaled.ops.gemm as gemm_mod
    from blockscaled.ops.quantize import dequantize

    t_start = time.time()
    fmt = args.fmt
    ms = [int(x) for x in args.ms.split(",")]
    shapes = SHAPES if args.shapes == "all" else [SHAPES[int(i)] for i in args.shapes.split(",")]
    dev = torch.device("cuda")
    info = device_info(dev)
    cases = {(n, k, m): candidates(fmt, m, n, k, info) for n, k in shapes for m in ms}
    t0 = time.time()
    if args.jobs > 0:
        try:
            precompile(fmt, cases, args.jobs)
        except Exception as e:  # e.g. no multiprocessing here: kernels then compile on first use
            print(f"# precompile failed ({type(e).__name__}: {e}); compiling lazily", flush=True)
    print(f"# {fmt}: {sum(len(v) for v in cases.values())} configs, {len(cases)} cases; precompile "
          f"({args.jobs} procs) {time.time() - t0:.0f} s; {torch.cuda.get_device_name()}, {info.sm_count} SMs",
          flush=True)
    print(f"{'shape':>12} {'M':>4}  {'kind':4} {'config':28} {'progs':>5} {'us':>7} {'%floor':>6} {'model':>6} check")
    rows, best = [], []
    for n, k in shapes:
        b_sets = None
        for m in ms:
            cnt = gemm_count(m, n, k, fmt, fmt, torch.bfloat16)
            floor_us = cnt.bytes / 3.0e12 * 1e6
            a0 = make_act(fmt, m, k, 2)
            per_set = cnt.bytes
            n_sets = rotation_count(per_set)
            if b_sets is None or len(b_sets) < n_sets:
                b_sets = [make_weight(fmt, n, k, 100 + i) for i in range(n_sets)]
            a_sets = [a0] + [make_act(fmt, m, k, 200 + i) for i in range(n_sets - 1)]
            outs = [torch.empty(m, n, dtype=torch.bfloat16, device=dev) for _ in range(n_sets)]
            sets = [(a_sets[i], b_sets[i], outs[i]) for i in range(n_sets)]
            ref = (dequantize(a0, torch.float32) @ dequantize(b_sets[0], torch.float32).t())
            case_rows = []
            for kind, c in cases[(n, k, m)]:
                row = {"fmt": fmt, "n": n, "k": k, "m": m, "kind": kind, "config": label(c),
                       "cfg": dataclasses.asdict(c), "programs": programs(c, m, n, k),
                       "floor_us": floor_us, "n_sets": n_sets}
                # correctness first: poisoned output, vs fp32 matmul, split-K bitwise repeatable
                check_and_time(row, c, a0, b_sets[0], ref, sets, args.iters, floor_us)
                if "us" in row and c.strategy == "triton":
                    row["model_us"] = 1e6 * small_m_model(fmt, m, n, k, info, None, c.promote, c.block_m, c.block_n,
                                                          c.block_k, c.num_warps, c.num_stages, c.split_k)
                rows.append(row)
                case_rows.append(row)
                print(f"{n:>6}x{k:<5} {m:>4}  {kind:4} {row['config']:28} {row['programs']:>5} "
                      f"{row.get('us', float('nan')):7.2f} {row.get('pct_floor', float('nan')):6.1f} "
                      f"{row.get('model_us', float('nan')):6.1f} {row['check']}", flush=True)
            # counters must be back at zero after all of this (the kernels reset them)
            nz = sum(int((buf != 0).sum().item()) for buf in
                     [*gemm_mod._COUNTERS.values(), *gemm_mod._GRAPH_COUNTERS.values()])
            if nz:
                print(f"!! {nz} split-K counters not zero after {n}x{k} M={m}", flush=True)
            good = [r for r in case_rows if r.get("check") == "ok" and "us" in r]
            if good:
                bst = min(good, key=lambda r: r["us"])
                heur = next((r for r in case_rows if r["kind"] == "heur"), None)
                best.append((n, k, m, bst, heur))
            del sets, outs, a_sets
    print("\n# best per (shape, M)   [heur = the heuristic's choice]")
    for n, k, m, bst, heur in best:
        h = f"heur {heur['config']} {heur.get('pct_floor', float('nan')):.0f}%" if heur else ""
        print(f"{n:>6}x{k:<5} M={m:<4} best {bst['config']:28} {bst['us']:7.2f} us "
              f"{bst['pct_floor']:5.1f}% floor ({bst['kind']})   {h}")
    print(f"# total {time.time() - t_start:.0f} s")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
        try:
            import triton

            env["triton"] = triton.__version__
        except Exception:
            pass
        Path(args.out).write_text(json.dumps({"env": env, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
