"""Validate the planner on a broad shape set: the planned plan vs every candidate, and time vs M.

On the GPU (writes one JSON line per shape; needs the installed package):
    python scripts/checks/validate_plans.py run --out plans.jsonl [--set family|random|all] [--jobs 14]
        [--budget 500] [--part 0/2]
Report (any machine; re-plans every recorded shape with the installed planner and looks its
choice up among the timed candidates, so a new calibration is judged on the same timings):
    python scripts/checks/validate_plans.py report plans.jsonl [...] [--md out.md] [--device h200] [--residuals]
(with shapes recorded in two of the files it also prints the noise floor: one run's fastest candidate
judged by the other's timings; a shape whose record has a ``confirm`` re-timing (``run --confirm``, on by
default: the planned and the sweep's fastest other candidate timed again head to head) is judged on it,
since the fastest of many single timings is biased low)

Targets (docs/design.md, "The planner"): the chosen plan within 5% of the best candidate on >= 95%
of shapes and never worse than 15%; time non-decreasing in M for fixed N, K (within 3% noise).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict

from blockscaled.bench.plan_sweep import (calibration_shapes, config_from_key, config_key, load_records, mid_band_shapes,
                                          run_sweep, validation_shapes)
from blockscaled.plan import DEVICES, Problem, plan_gemm
from blockscaled.plan import tuned as tuned_plans
from blockscaled.plan.calibration import load_calibration
from blockscaled.plan.cost import predict_us, tile_key


def _replan(rec: dict, device: str = "h100"):
    """The installed planner's choice for a recorded shape on the device of the record's run
    (``device``: a key of ``blockscaled.plan.DEVICES``; its calibration file, or the H100 file scaled
    to it, is what the planner reads)."""
    p = Problem("gemm", "fp8_block", rec["m"], rec["n"], rec["k"], tma=rec["k"] % 16 == 0)
    return plan_gemm(p, DEVICES[device])


def _canonical(key: str) -> str:
    """A recorded config key as today's configs spell it: fields added to the config types after the
    record was made take their defaults (a record from before ``GemmConfig.dequant_a`` / ``maxnreg``
    names the same config as today's key with ``false`` / ``0``; compared as written, such plans were
    "not among the timed candidates": 153 of the 449 shapes of plan-sweep-20261125 went unjudged)."""
    return config_key(config_from_key(key))


def _timed(r: dict) -> dict:
    """{canonical config key: us} of a record's correct, timed candidates."""
    return {_canonical(c["key"]): c["us"] for c in r["cands"] if "us" in c and c.get("ok", False)}


def noise_floor(runs: list[list[dict]]) -> list[str]:
    """What one sweep can show: for shapes recorded in two runs (files of the same GPU; a shape recorded
    twice in one file counts with its last record), the first run's fastest candidate judged by the
    second run's timings (a perfect planner fitted to one run scores this on another)."""
    out = []
    for i, ra in enumerate(runs):
        for rb in runs[i + 1:]:
            a = {(r["m"], r["n"], r["k"]): _timed(r) for r in ra}
            ratios = []
            for r in rb:
                ta, tb = a.get((r["m"], r["n"], r["k"])), _timed(r)
                keys = set(ta or {}) & set(tb)
                if keys:
                    ratios.append(tb[min(keys, key=ta.get)] / min(tb[k] for k in keys))
            if ratios:
                w = sum(1 for x in ratios if x <= 1.05)
                out.append(f"- noise floor: {len(ratios)} shapes timed in two runs; one run's fastest judged by the "
                           f"other's timings within 5% on {w}/{len(ratios)} = {w / len(ratios):.1%}, geomean "
                           f"{statistics.geometric_mean(ratios):.3f}, worst {max(ratios):.3f}")
    return out


def residuals(recs: list[dict], device: str) -> list[str]:
    """Measured / predicted time of every timed candidate, by kernel tile (+ split), M band and
    whether the output rows are 16-byte aligned: where the cost model is biased, and for which
    shapes (the unaligned-row rows of this table found the wide kernel's slow masked store)."""
    dev = DEVICES[device]
    cal = load_calibration(dev.name, dev.sm_count, dev.mem_bw)
    groups = defaultdict(list)
    for r in recs:
        band = next(b for b in (16, 128, 1024, 1 << 30) if r["m"] <= b)
        rows = "aligned" if r["n"] % 8 == 0 else "unaligned"
        for c in r["cands"]:
            if "us" not in c or not c.get("ok", False):
                continue
            cfg = config_from_key(c["key"])
            key = tile_key(cfg) + ("+split" if getattr(cfg, "split_k", 1) > 1 else "") + (
                "+tail" if getattr(cfg, "tail_split", 1) > 1 else "")
            groups[(key, band, rows)].append(c["us"] / predict_us(cfg, "fp8_block", r["m"], r["n"], r["k"], dev, cal).us)
    out = ["", "## Model residuals (measured / predicted)", "", "| tile | M | output rows | n | geomean | 10-90 % |",
           "|---|---|---|---|---|---|"]
    for (key, band, rows), v in sorted(groups.items()):
        if len(v) >= 4:
            q = sorted(v)
            band = "M>1024" if band > 1024 else f"M<={band}"
            out.append(f"| {key} | {band} | {rows} | {len(v)} | {statistics.geometric_mean(v):.2f} | "
                       f"{q[len(q) // 10]:.2f}-{q[9 * len(q) // 10]:.2f} |")
    return out


def report(paths: list[str], md: str | None, use_recorded_plan: bool, device: str = "h100",
           show_residuals: bool = False) -> int:
    tuned_plans.clear()  # judge the cost model's plans, not tuned ones loaded from the environment
    runs = [load_records(p) for p in paths]
    recs = [r for run in runs for r in run]
    rows, misses, errors, confirmed = [], [], [], []
    by_nk = defaultdict(list)
    for r in recs:
        ok = [c for c in r["cands"] if "us" in c and c.get("ok", False)]
        bad = [c for c in r["cands"] if "error" in c or not c.get("ok", True)]
        errors += [(r, c) for c in bad]
        if not ok:
            continue
        best = min(ok, key=lambda c: c["us"])
        key = _canonical(r["planned"]) if use_recorded_plan else config_key(_replan(r, device).config)
        chosen = next((c for c in ok if _canonical(c["key"]) == key), None)
        if chosen is None:
            misses.append(r)
            continue
        ratio = chosen["us"] / best["us"]
        conf = {_canonical(k): v for k, v in r.get("confirm", {}).items()}
        if key in conf:  # re-timed head to head against the sweep's fastest other candidate
            confirmed.append((ratio, conf[key] / min(conf.values())))
            ratio = confirmed[-1][1]
        rows.append((r, chosen, best, ratio))
        by_nk[(r["family"], r["layer"], r["n"], r["k"])].append((r["m"], chosen["us"]))
    n = len(rows)
    within5 = sum(1 for *_, x in rows if x <= 1.05)
    worst = sorted(rows, key=lambda t: -t[3])[:15]
    mono = []
    for key, pts in by_nk.items():
        pts.sort()
        for (m0, t0), (m1, t1) in zip(pts, pts[1:]):
            if t1 < t0 / 1.03:
                mono.append((key, m0, t0, m1, t1))
    out = [f"# Planner validation ({device}: {len(recs)} shapes recorded, {n} judged)", ""]
    out.append(f"- planned within 5% of the best candidate: {within5}/{n} = {within5 / max(n, 1):.1%} (target >= 95%)")
    out.append(f"- worst planned / best: {max((x for *_, x in rows), default=0):.3f} (target <= 1.15); "
               f"geomean {statistics.geometric_mean([x for *_, x in rows]) if rows else 0:.3f}")
    for name in ("family", "random"):
        sub = [x for r, *_, x in rows if r["set"] == name]
        if sub:
            out.append(f"  - {name} shapes: {sum(1 for x in sub if x <= 1.05)}/{len(sub)} within 5%, geomean "
                       f"{statistics.geometric_mean(sub):.3f}, worst {max(sub):.3f}")
    if confirmed:
        rounds = sorted({r.get("confirm_rounds") for r in recs if "confirm" in r} - {None})
        out.append(f"  - judged on a head-to-head re-timing ({'/'.join(map(str, rounds))} interleaved rounds) against the "
                   f"sweep's fastest other candidate: {len(confirmed)} shapes; within 5% by the sweep's single timing "
                   f"{sum(1 for a, _ in confirmed if a <= 1.05)}/{len(confirmed)}, after the re-timing "
                   f"{sum(1 for _, b in confirmed if b <= 1.05)}/{len(confirmed)}")
    out.append(f"- time decreasing with M (> 3%) on the same N, K: {len(mono)} pairs (target 0)")
    tuned = []
    tuned_nk = defaultdict(list)
    for r in recs:
        ok = {_canonical(c["key"]): c["us"] for c in r["cands"] if "us" in c and c.get("ok", False)}
        if "tuned" in r and ok and _canonical(r["tuned"]) in ok:
            us = ok[_canonical(r["tuned"])]
            tuned.append(us / min(ok.values()))
            tuned_nk[(r["family"], r["layer"], r["n"], r["k"])].append((r["m"], us))
    if tuned:
        top = {r.get("tuned_top") for r in recs if "tuned" in r}
        t_mono = sum(1 for pts in tuned_nk.values() for (_, t0), (_, t1) in zip(sorted(pts), sorted(pts)[1:])
                     if t1 < t0 / 1.03)
        out.append(f"- blockscaled.tune's choice (top {'/'.join(map(str, sorted(top)))} timed apart, judged on the "
                   f"sweep's timings): {sum(1 for x in tuned if x <= 1.05)}/{len(tuned)} = "
                   f"{sum(1 for x in tuned if x <= 1.05) / len(tuned):.1%} within 5%, geomean "
                   f"{statistics.geometric_mean(tuned):.3f}, worst {max(tuned):.3f}; time decreasing with M "
                   f"(> 3%): {t_mono} pairs")
    out.append(f"- candidates that failed or missed the tolerance: {len(errors)}; planned plan not among "
               f"the timed candidates: {len(misses)}")
    out += noise_floor(runs)
    if use_recorded_plan:
        planned_gap = [r["planned_us"] / next(c["us"] for c in r["cands"] if c["key"] == r["planned"] and "us" in c)
                       for r in recs if "planned_us" in r and any(c["key"] == r["planned"] and "us" in c for c in r["cands"])]
        if planned_gap:
            out.append(f"- bs.gemm (planned, no config) vs the same plan forced: median "
                       f"{statistics.median(planned_gap):.3f}, max {max(planned_gap):.3f}")
    out += ["", "## Worst rows", "", "| set | family / layer | M | N | K | chosen | us | best | us | ratio |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r, c, b, x in worst:
        out.append(f"| {r['set']} | {r['family']} {r['layer']} | {r['m']} | {r['n']} | {r['k']} | {c['desc']} | "
                   f"{c['us']:.1f} | {b['desc']} | {b['us']:.1f} | {x:.3f} |")
    if mono:
        out += ["", "## Non-monotone in M", "", "| shape | M | us | M' | us' |", "|---|---|---|---|---|"]
        for key, m0, t0, m1, t1 in mono[:40]:
            out.append(f"| {key[0]} {key[1]} {key[2]}x{key[3]} | {m0} | {t0:.1f} | {m1} | {t1:.1f} |")
    if show_residuals:
        out += residuals(recs, device)
    if errors:
        out += ["", "## Failed candidates", ""]
        for r, c in errors[:30]:
            out.append(f"- {r['m']}x{r['n']}x{r['k']} {c['desc']}: {c.get('error') or ('rel_fro %.2e' % c.get('rel_fro', -1))}")
    text = "\n".join(out) + "\n"
    print(text)
    if md:
        with open(md, "w") as f:
            f.write(text)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--set", default="family", choices=("family", "random", "random-mid", "all"))
    r.add_argument("--jobs", type=int, default=1)
    r.add_argument("--budget", type=float, default=1e9, help="seconds; stop starting shapes after it")
    r.add_argument("--part", default="0/1", help="i/n: every n-th shape from the i-th")
    r.add_argument("--limit", type=int, default=0)
    r.add_argument("--unaligned", action="store_true",
                   help="only shapes whose bf16 output rows the compiler cannot store in vectors (N %% 16 != 0)")
    r.add_argument("--skip", type=int, default=0, help="skip the first shapes (a run that continues another)")
    r.add_argument("--confirm", type=int, default=5, metavar="ROUNDS",
                   help="re-time the planned and the fastest other candidate head to head in ROUNDS interleaved "
                        "rounds where they are within 25%% (0: off); the report judges the shape on it")
    r.add_argument("--tune", type=int, default=0, metavar="TOP",
                   help="also run blockscaled.tune (top TOP candidates, its own timings) on each shape and record its choice")
    rep = sub.add_parser("report")
    rep.add_argument("paths", nargs="+")
    rep.add_argument("--md", default=None)
    rep.add_argument("--recorded", action="store_true",
                     help="judge the plan recorded in the run instead of re-planning with the installed planner")
    rep.add_argument("--device", default="h100", choices=("h100", "h200"),
                     help="the GPU the sweep ran on: re-plan for it (its calibration file, or the H100 file scaled)")
    rep.add_argument("--residuals", action="store_true",
                     help="add the cost model's measured / predicted time per tile, M band and output-row alignment")
    a = ap.parse_args(argv)
    if a.cmd == "report":
        return report(a.paths, a.md, a.recorded, a.device, a.residuals)
    shapes = []
    if a.set in ("family", "all"):
        shapes += validation_shapes()
    if a.set in ("random", "all"):
        shapes += calibration_shapes()
    if a.set == "random-mid":
        shapes += mid_band_shapes()
    if a.unaligned:
        shapes = [s for s in shapes if s["n"] % 16]
    i, n = (int(x) for x in a.part.split("/"))
    shapes = shapes[i::n][a.skip:]
    if a.limit:
        shapes = shapes[:a.limit]
    print(f"{len(shapes)} shapes", flush=True)
    run_sweep(shapes, a.out, jobs=a.jobs, budget_s=a.budget, log=lambda s: print(s, flush=True), tune_top=a.tune,
              confirm_rounds=a.confirm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
