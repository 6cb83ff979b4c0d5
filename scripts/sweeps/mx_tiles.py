"""MX/NV tile sweep for the planner's bf16 rules (plan/portable.py, MX_BF16_*): every candidate tile
of the bf16-dequantizing portable kernel against the current plan, the plan before the bf16 rules,
dequantize + cuBLAS and cuBLAS bf16 on pre-dequantized weights, every output checked.

    python scripts/sweeps/mx_tiles.py --json mx_tiles.json     # the whole sweep: one command, < 5 min on an H100
    python scripts/sweeps/mx_tiles.py --quick                  # M = 16, 64 on three shapes (~1 min)
    python scripts/sweeps/mx_tiles.py --list                   # the candidates per row (no GPU: an H100's plans)

Rows: formats mxfp8 / mxfp4 / nvfp4 x modes W x A (quantized activations) and weight-only (bf16
activations) x shapes N x K in {2880x2880, 5760x2880, 8192x8192, 28672x8192, 7168x16384, 4096x14336}
x M in {16, 64, 256, 2048} (``--formats``, ``--modes``, ``--shapes``, ``--ms`` select).

Candidates per row (labels in the output):
  plan            the planner's plan (config=None)
  before          the plan without the bf16 rules (plan.portable.choose_portable(mx_bf16=False))
  dequant         dequantize + cuBLAS bf16 (GemmConfig(strategy="dequant_matmul"))
  bf16            cuBLAS bf16 on weights (and activations) dequantized beforehand: the bar
  <tile>/pps<P>   a tile class (TILE_CLASSES: swap-AB, block_m cap, block_n, block_k, warps, stages)
                  with the planner's K split for P programs per SM (plan.portable.mx_bf16_config);
                  each M's first class also with P = 1 and 4 (MX_BF16_PROGRAMS_PER_SM is 2).

Method: compiles first, in ``--jobs`` worker processes (each Triton kernel the rows will launch,
on small operands with the same specializations; the main process then hits Triton's disk cache).
Then per row: operand sets rotated past 2x L2 (copies of one set), the float64 reference of that
set, every candidate run once on it and checked on the GPU with the tolerances of
``testing.tolerances`` (a failing or crashing candidate is reported, never counted as best), then
timed with ``bench.timing.time_op`` (CUDA-graph replays). % floor: the packed A, B, scales and the
bf16 output at the device's copy bandwidth (plan.device_info(...).mem_bw). Printed: one line per row
as it is measured, then the table (best candidate per row, its us, % floor, ratio vs bf16 and vs the
plan) and the "rules" block: the values of MX_BF16_TILES / MX_BF16_PROGRAMS_PER_SM /
MX_BF16_DEQUANT_M these rows measured, each line naming the rows it comes from. ``--json`` writes
every row and candidate. ``--budget-s``: no new row starts after that many seconds (the summary
covers what ran).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

FORMATS = ("mxfp8", "mxfp4", "nvfp4")
MODES = ("wxa", "wo")
SHAPES = ((2880, 2880), (5760, 2880), (8192, 8192), (28672, 8192), (7168, 16384), (4096, 14336))
MS = (16, 64, 256, 2048)
#: measured M -> tile classes (plan.portable.MX_BF16_TILES values: swap_ab, block_m cap, block_n,
#: block_k, num_warps, num_stages). Swap-AB tiles for decode (the weight is the wgmma's 64-row
#: register operand), 64- and 128-row tiles above; block_k 64..256 (bf16 dot chunks independent of
#: the scale block). Every class compiles spill-free for sm_90 (ptxas -v, triton 3.6; the 4-warp
#: 16x128x256 and 64x128x256 tiles spilled 4-172 bytes, so block_k 256 comes with 64 weight rows
#: per warpgroup: 16x64x256 / 4 warps, 16x128x256 and 64x128x256 / 8 warps), except 128x256x64 with
#: a K split (its reduction: 240 bytes), which the rules give only M = 2048 rows (unsplit).
TILE_CLASSES = {
    16: ((True, 16, 128, 128, 4, 4), (True, 16, 64, 128, 4, 4), (True, 16, 64, 256, 4, 3),
         (True, 16, 128, 256, 8, 3), (False, 64, 128, 128, 4, 4)),
    64: ((False, 64, 128, 128, 4, 4), (True, 64, 128, 128, 4, 4), (False, 64, 64, 128, 4, 4),
         (False, 64, 128, 256, 8, 3)),
    256: ((False, 128, 128, 128, 8, 3), (False, 64, 128, 128, 4, 4), (False, 128, 128, 64, 8, 4)),
    2048: ((False, 128, 128, 128, 8, 3), (False, 128, 256, 64, 8, 3)),
}
#: programs-per-SM targets timed besides the default for the first tile class of these M
PPS_VARIANTS = (1, 4)
PPS_MS = (16, 64)
QUICK = {"ms": (16, 64), "shapes": ((2880, 2880), (28672, 8192), (7168, 16384))}
#: where rows run ("cpu": the Triton interpreter, for the script's own tests)
DEVICE = "cuda"


def _sync():
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def tile_label(t) -> str:
    swap, bm, bn, bk, w, s = t
    return f"{'swap' if swap else ''}{bm}x{bn}x{bk}w{w}s{s}"


def parse_list(text, conv=str):
    return tuple(conv(x) for x in text.split(",") if x)


def parse_shapes(text):
    return tuple(tuple(int(v) for v in s.lower().split("x")) for s in text.split(",") if s)


# ------------------------------------------------------------------------------ candidates
def candidates(fmt, mode, m, n, k, dev):
    """[(label, kind, config, aliases)] for one row: kind "plan" (config None), "before", "dequant",
    "bf16" (config None: cuBLAS on dequantized operands), "tile" (a GemmConfig); ``aliases``: the
    other tile labels that resolve to the same config (timed once)."""
    import torch

    import blockscaled as bs
    from blockscaled.plan import portable as pp

    wo = mode == "wo"
    out = [("plan", "plan", None, [])]
    before = pp.choose_portable(fmt, m, n, k, dev, torch.bfloat16 if wo else None, torch.bfloat16, mx_bf16=False)
    if before.strategy == "dequant_matmul":  # the same run as "dequant"
        out.append(("dequant", "dequant", bs.GemmConfig(strategy="dequant_matmul"), ["before"]))
    else:
        out.append(("before", "before", before, []))
        out.append(("dequant", "dequant", bs.GemmConfig(strategy="dequant_matmul"), []))
    out.append(("bf16", "bf16", None, []))
    seen = {}
    classes = TILE_CLASSES.get(m) or TILE_CLASSES[min(TILE_CLASSES, key=lambda r: abs(r - m))]
    for i, t in enumerate(classes):
        for pps in (pp.MX_BF16_PROGRAMS_PER_SM,) + (PPS_VARIANTS if i == 0 and m in PPS_MS else ()):
            cfg = pp.mx_bf16_config(fmt, m, n, k, dev, wo, tile=t, programs_per_sm=pps)
            label = f"{tile_label(t)}/pps{pps}"
            if cfg in seen:
                seen[cfg][3].append(label)
                continue
            seen[cfg] = (label, "tile", cfg, [])
            out.append(seen[cfg])
    return out


def compile_key(fmt, mode, k, cfg):
    """What a Triton specialization of gemm_kernel depends on for these rows (all M, N, K are
    multiples of 16): format, mode, the config and whether every K chunk is full (EVEN_K)."""
    from blockscaled.plan.splits import split_plan

    split, per = split_plan(k, cfg.block_k, cfg.split_k)
    return (fmt, mode, k, cfg, k % cfg.block_k == 0 and per % cfg.block_k == 0)


def _warm_one(task):
    """Worker: launch one config on small operands with the row's K (same specialization), so the
    compile lands in Triton's cache. Returns (task index, error text or None)."""
    i, fmt, mode, k, cfg = task
    try:
        import torch

        import blockscaled as bs

        g = torch.Generator(device="cuda").manual_seed(i)
        x = torch.randn(16, k, device="cuda", generator=g).to(torch.bfloat16)
        b = bs.quantize((torch.randn(128, k, device="cuda", generator=g) * 0.05).to(torch.bfloat16), fmt)
        a = x if mode == "wo" else bs.quantize(x, fmt)
        bs.gemm(a, b, config=cfg)
        torch.cuda.synchronize()
        return i, None
    except Exception as e:  # reported, the row marks the candidate failed
        return i, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def warm_compiles(rows, dev, jobs):
    """Compile every Triton config the rows use, in ``jobs`` processes. Returns {key: error}."""
    import multiprocessing as mp

    tasks, keys = [], {}
    for fmt, mode, m, n, k in rows:
        for _, kind, cfg, _ in candidates(fmt, mode, m, n, k, dev):
            if kind in ("tile", "before") and cfg is not None and cfg.strategy == "triton":
                key = compile_key(fmt, mode, k, cfg)
                if key not in keys:
                    keys[key] = len(tasks)
                    tasks.append((len(tasks), fmt, mode, k, cfg))
    t0 = time.time()
    print(f"compiling {len(tasks)} kernels in {jobs} processes ...", flush=True)
    errors = {}
    if tasks:
        with mp.get_context("spawn").Pool(jobs) as pool:
            for i, err in pool.imap_unordered(_warm_one, tasks, chunksize=1):
                if err:
                    errors[i] = err
    print(f"compiled in {time.time() - t0:.0f} s ({len(errors)} failed)", flush=True)
    return {key: errors[i] for key, i in keys.items() if i in errors}


# ------------------------------------------------------------------------------ one row
def make_sets(fmt, mode, m, n, k, max_sets):
    """(sets for bs.gemm, sets for the bf16 baseline, packed bytes of one set incl. the output)."""
    import torch

    import blockscaled as bs
    from blockscaled.bench.timing import rotation_count

    g = torch.Generator(device=DEVICE).manual_seed(m * 7 + n + k)
    w = (torch.randn(n, k, device=DEVICE, generator=g) * 0.05).to(torch.bfloat16)
    x = torch.randn(m, k, device=DEVICE, generator=g).to(torch.bfloat16)
    b = bs.quantize(w, fmt)
    a = x if mode == "wo" else bs.quantize(x, fmt)
    del w

    def nbytes(t):
        return sum(p.numel() * p.element_size() for p in (getattr(t, "data", t), getattr(t, "scale", None))
                   if p is not None)

    packed = nbytes(a) + nbytes(b) + m * n * 2
    A16 = x if mode == "wo" else bs.dequantize(a, torch.bfloat16)
    W16 = bs.dequantize(b, torch.bfloat16)
    bf16_bytes = A16.numel() * 2 + W16.numel() * 2 + m * n * 2

    def clone(t):
        if isinstance(t, torch.Tensor):
            return t.clone()
        return bs.ScaledTensor(t.data.clone(), t.scale.clone(), t.format, t.shape, t.block, t.rounding,
                               global_scale=None if t.global_scale is None else t.global_scale.clone())

    sets = [(a, b)] + [(clone(a), clone(b)) for _ in range(min(max_sets, rotation_count(packed)) - 1)]
    sets16 = [(A16, W16)] + [(A16.clone(), W16.clone()) for _ in range(min(max_sets, rotation_count(bf16_bytes)) - 1)]
    return sets, sets16, packed


def check(y, ref, fmt):
    """(ok, rel_fro, norm_max) against the float64 reference with testing.tolerances' bf16 row,
    computed on the GPU; NaN where the reference is finite fails."""
    import torch

    from blockscaled.testing.tolerances import gemm_tolerance

    tol = gemm_tolerance(fmt, torch.bfloat16)
    yd = y.double()
    if bool((torch.isnan(yd) & ~torch.isnan(ref)).any()):
        return False, float("nan"), float("nan")
    d = yd - ref
    rel_fro = (d.norm() / ref.norm()).item()
    norm_max = (d.abs().max() / ref.abs().max()).item()
    return rel_fro <= tol.rel_fro and norm_max <= tol.norm_max, rel_fro, norm_max


def run_row(fmt, mode, m, n, k, dev, args, compile_errors):
    import torch

    import blockscaled as bs
    from blockscaled.bench.timing import time_op
    from blockscaled.plan import observe_plans
    from blockscaled.reference import gemm as ref_gemm

    sets, sets16, packed = make_sets(fmt, mode, m, n, k, args.max_sets)
    a, b = sets[0]
    ref = ref_gemm.gemm(a, b)
    floor_us = packed / dev.mem_bw * 1e6
    res = {"fmt": fmt, "mode": mode, "m": m, "n": n, "k": k, "floor_us": floor_us, "cands": []}
    for label, kind, cfg, aliases in candidates(fmt, mode, m, n, k, dev):
        c = {"label": label, "aliases": aliases, "kind": kind, "config": None if cfg is None else repr(cfg)}
        res["cands"].append(c)
        if kind in ("tile", "before") and cfg.strategy == "triton":
            err = compile_errors.get(compile_key(fmt, mode, k, cfg))
            if err:
                c["error"] = err
                continue
        if kind == "bf16":
            fn, tsets = (lambda A, W: torch.mm(A, W.t())), sets16
        else:
            fn, tsets = (lambda x, w, cfg=cfg: bs.gemm(x, w, config=cfg)), sets
        try:
            with observe_plans() as plans:
                y = fn(*tsets[0])
            _sync()
            c["ran"] = plans[-1].describe() if plans else "cuBLAS bf16"
            c["ok"], c["rel_fro"], c["norm_max"] = check(y, ref, fmt)
            del y
            t = time_op(fn, tsets, warmup=2, iterations=args.iterations)
            c["us"] = t.median_ms * 1e3
        except Exception as e:
            c["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            _sync()
    del sets, sets16, ref
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return res


def summarize_row(r):
    """Best candidate (checked, timed) of the row, and the reference columns."""
    ok = [c for c in r["cands"] if c.get("ok") and "us" in c]
    by = {label: c for c in r["cands"] for label in [c["label"]] + c.get("aliases", [])}
    best = min(ok, key=lambda c: c["us"]) if ok else None
    us = lambda lab: by.get(lab, {}).get("us") if by.get(lab, {}).get("ok") else None  # noqa: E731
    return best, us("plan"), us("before"), us("dequant"), us("bf16")


def row_line(r) -> str:
    best, plan, before, dq, b16 = summarize_row(r)
    f = lambda v: f"{v:8.1f}" if v else "       -"  # noqa: E731
    fails = [c["label"] for c in r["cands"] if c.get("error") or c.get("ok") is False]
    head = f"{r['fmt']:<6} {r['mode']:<3} M={r['m']:<5} {r['n']}x{r['k']:<6}"
    if best is None:
        return f"{head} no candidate passed ({', '.join(fails)})"
    pct = 100 * r["floor_us"] / best["us"]
    return (f"{head} {best['label']:<28} {best['us']:8.1f} us {pct:4.0f}% | plan {f(plan)} "
            f"before {f(before)} dequant {f(dq)} bf16 {f(b16)} | vs bf16 {(b16 or math.nan) / best['us']:5.2f}x "
            f"vs plan {(plan or math.nan) / best['us']:5.2f}x" + (f" | FAILED: {', '.join(fails)}" if fails else ""))


# ------------------------------------------------------------------------------ rules
def _geo(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else float("nan")


def rules(results) -> list[str]:
    """The MX_BF16_* values these rows measured (plan/portable.py), as Python lines to paste."""
    from blockscaled.plan import portable as pp

    lines = ["# --- rules (scripts/sweeps/mx_tiles.py): paste into src/blockscaled/plan/portable.py ---"]
    groups = {}
    for r in results:
        groups.setdefault((r["fmt"], r["mode"], r["m"]), []).append(r)
    tiles, pps_score = {}, {}
    for (fmt, mode, m), rs in sorted(groups.items()):
        if m > pp.MX_BF16_M_MAX:
            continue
        score = {}  # tile class label -> per-row ratios row-best-tile / class us (pps default)
        for r in rs:
            cands = [c for c in r["cands"] if c["kind"] == "tile" and c.get("ok") and "us" in c]
            if not cands:
                continue
            best = min(c["us"] for c in cands)
            for c in cands:
                for label in [c["label"]] + c.get("aliases", []):
                    cls, pps = label.split("/pps")
                    if int(pps) == pp.MX_BF16_PROGRAMS_PER_SM:
                        score.setdefault(cls, []).append(best / c["us"])
                    pps_score.setdefault(int(pps), {}).setdefault((fmt, mode, m, r["n"], r["k"], cls), c["us"])
        full = {cls: v for cls, v in score.items() if len(v) == len(rs)}
        if not full:
            continue
        ranked = sorted(full, key=lambda cls: -_geo(full[cls]))
        cls = ranked[0]
        t = next(t for t in TILE_CLASSES.get(m, ()) if tile_label(t) == cls)
        tiles[(fmt, mode, m)] = t
        runner = f", next {ranked[1]} {_geo(full[ranked[1]]):.2f}" if len(ranked) > 1 else ""
        lines.append(f"#   ({fmt!r}, {mode!r}, {m}): {cls} geomean {_geo(full[cls]):.2f} of the row-best tile over "
                     f"{len(rs)} shapes{runner}")
    if tiles:
        lines.append("MX_BF16_TILES = {")
        lines += [f"    ({f!r}, {md!r}, {m}): {t!r}," for (f, md, m), t in sorted(tiles.items())]
        lines.append("}  # keys: rows up to (M of the sweep rows); M above the largest key uses the largest")
    # programs per SM: rows where the first class ran with every target
    base = pp.MX_BF16_PROGRAMS_PER_SM
    common = set.intersection(*(set(v) for v in pps_score.values())) if pps_score else set()
    if common and len(pps_score) > 1:
        ratios = {p: _geo([min(pps_score[q][key] for q in pps_score) / v[key] for key in common])
                  for p, v in pps_score.items()}
        best = max(ratios, key=ratios.get)
        lines.append(f"MX_BF16_PROGRAMS_PER_SM = {best}  # geomean of row-best / us over {len(common)} rows: "
                     + ", ".join(f"{p}: {ratios[p]:.2f}" for p in sorted(ratios)) + f" (was {base})")
    # dequantize + cuBLAS crossover
    for fmt in FORMATS:
        for mode in MODES:
            ms = sorted(m for (f, md, m) in groups if (f, md) == (fmt, mode))
            verdict = {}
            for m in ms:
                rat = []
                for r in groups[(fmt, mode, m)]:
                    tl_ = [c["us"] for c in r["cands"] if c["kind"] == "tile" and c.get("ok") and "us" in c]
                    dq = next((c.get("us") for c in r["cands"] if c["kind"] == "dequant" and c.get("ok")), None)
                    if tl_ and dq:
                        rat.append(min(tl_) / dq)
                verdict[m] = _geo(rat)
            if not verdict:
                continue
            desc = ", ".join(f"M={m} {v:.2f}" for m, v in verdict.items())
            cross = next((m for m in ms if all(verdict[x] > 1.0 for x in ms if x >= m)), None)
            if cross is None:
                lines.append(f"# MX_BF16_DEQUANT_M[({fmt!r}, {mode!r})]: the best bf16 tile beat dequant + cuBLAS at "
                             f"every M (best-tile us / dequant us: {desc}); consider MX_BF16_M_MAX above {ms[-1]}")
            else:
                lines.append(f"MX_BF16_DEQUANT_M[({fmt!r}, {mode!r})] = {cross}  # best-tile us / dequant us "
                             f"geomean: {desc}")
    return lines


# ------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--formats", default=",".join(FORMATS))
    p.add_argument("--modes", default=",".join(MODES), help="wxa (quantized A), wo (bf16 A)")
    p.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES), help="NxK,...")
    p.add_argument("--ms", default=",".join(map(str, MS)))
    p.add_argument("--quick", action="store_true", help="M = 16, 64 on 2880x2880, 28672x8192, 7168x16384")
    p.add_argument("--iterations", type=int, default=6, help="graph replays timed per candidate")
    p.add_argument("--max-sets", type=int, default=48, help="at most this many rotated operand copies")
    p.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1), help="compile processes")
    p.add_argument("--budget-s", type=float, default=270.0, help="no new row after this many seconds")
    p.add_argument("--list", action="store_true", help="print each row's candidates and exit (no GPU needed)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    fmts, modes = parse_list(args.formats), parse_list(args.modes)
    shapes, ms = parse_shapes(args.shapes), parse_list(args.ms, int)
    if args.quick:
        ms, shapes = QUICK["ms"], QUICK["shapes"]
    bad = [f for f in fmts if f not in FORMATS] + [md for md in modes if md not in MODES]
    if bad:
        raise SystemExit(f"unknown format / mode: {bad}")
    rows = [(f, md, m, n, k) for m in ms for f in fmts for md in modes for n, k in shapes]

    import torch

    from blockscaled.plan import H100_SXM, device_info

    cuda = torch.cuda.is_available()
    dev = device_info(torch.device("cuda")) if cuda else H100_SXM
    if args.list or not cuda:
        for r in rows:
            print(f"{r[0]} {r[1]} M={r[2]} {r[3]}x{r[4]} ({dev.name}):")
            for label, kind, cfg, aliases in candidates(*r, dev):
                print(f"  {label:<28} {kind:<8} {cfg!r}" + (f" (= {', '.join(aliases)})" if aliases else ""))
        if not cuda and not args.list:
            print("mx_tiles.py: no CUDA device; the candidates above are planned for an H100, nothing was timed",
                  file=sys.stderr)
            return 2
        return 0
    t_start = time.time()
    print(f"mx_tiles on {torch.cuda.get_device_name()} ({dev.sm_count} SMs, copy {dev.mem_bw / 1e12:.2f} TB/s), "
          f"torch {torch.__version__}, {len(rows)} rows", flush=True)
    compile_errors = warm_compiles(rows, dev, args.jobs)
    results = []
    for r in rows:
        if time.time() - t_start > args.budget_s:
            print(f"budget of {args.budget_s:.0f} s reached: {len(rows) - len(results)} rows not run", flush=True)
            break
        res = run_row(*r, dev, args, compile_errors)
        results.append(res)
        print(row_line(res), flush=True)
    print(f"\n=== best per row ({len(results)} rows, {time.time() - t_start:.0f} s) ===")
    print(f"{'fmt':<6} {'mode':<4} {'M':>5} {'N x K':>12} {'best':<28} {'us':>8} {'%floor':>6} {'vs bf16':>7} "
          f"{'vs plan':>7} {'plan us':>8} {'before':>8}")
    for r in results:
        best, plan, before, _, b16 = summarize_row(r)
        if best is None:
            print(f"{r['fmt']:<6} {r['mode']:<4} {r['m']:>5} {r['n']:>5}x{r['k']:<6} no candidate passed")
            continue
        print(f"{r['fmt']:<6} {r['mode']:<4} {r['m']:>5} {r['n']:>5}x{r['k']:<6} {best['label']:<28} "
              f"{best['us']:8.1f} {100 * r['floor_us'] / best['us']:5.0f}% {(b16 or math.nan) / best['us']:6.2f}x "
              f"{(plan or math.nan) / best['us']:6.2f}x {plan or math.nan:8.1f} {before or math.nan:8.1f}")
    print()
    print("\n".join(rules(results)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "argv": sys.argv[1:], "mem_bw": dev.mem_bw,
                       "rows": results, "rules": rules(results)}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
