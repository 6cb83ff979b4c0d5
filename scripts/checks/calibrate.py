"""Calibrate the planner's cost model (plan/cost.py) for one GPU and store it (plan/devices/).

1. On the GPU, time every candidate plan on the random calibration shapes (none from a model
   table; the validation set of scripts/checks/validate_plans.py stays out of the fit):
       python scripts/checks/calibrate.py run --out cal.jsonl [--jobs 14] [--budget 500]
2. Anywhere, fit the constants to those timings and write the device file:
       python scripts/checks/calibrate.py fit cal.jsonl [...] --device-file src/blockscaled/plan/devices/h100.json

The fit: per kernel and tile size (its "c0_us", "ckb_us", "bw_cta", "split_us", "odd_k",
"dram_eff", "odd_n_us"; the GEMV is a tile kernel too), cuBLAS's constants (its unaligned rows are
padded by the library: no factor for them), then the launch costs, L2 bandwidth
and the overlap exponent, alternately, by coordinate descent on multiplicative steps. The loss is
what the planner needs: the mean log regret of the selection (measured time of each shape's
predicted-fastest candidate over its measured best) plus MSE_WEIGHT x the weighted mean squared
log error of predicted vs measured time (candidates near their shape's best weigh most).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import subprocess
import sys
from collections import defaultdict

from blockscaled.bench.plan_sweep import calibration_shapes, config_from_key, load_records, run_sweep
from blockscaled.plan import DEVICES, H100_SXM
from blockscaled.plan.calibration import Calibration
from blockscaled.plan.cost import FEATURES, features, tile_key, time_us

_STEPS = (0.3, 0.6, 0.8, 0.9, 0.97, 1.03, 1.1, 1.25, 1.6, 3.0)


def _samples(records: list[dict], dev=H100_SXM):
    """Per tile key: the features (numpy columns), measured us and weights of every timed,
    correct candidate (``dev``: the GPU the records were timed on)."""
    import numpy as np

    rows = defaultdict(list)
    shape_id = 0
    for r in records:
        ok = [c for c in r["cands"] if "us" in c and c.get("ok", False)]
        if not ok:
            continue
        best = min(c["us"] for c in ok)
        for c in ok:
            cfg = config_from_key(c["key"])
            f = features(cfg, "fp8_block", r["m"], r["n"], r["k"], dev)
            w = 1.0 / (1.0 + 4.0 * (c["us"] / best - 1.0))
            rows[tile_key(cfg)].append((f, c["us"], w, shape_id, best))
        shape_id += 1
    out = {}
    for key, lst in rows.items():
        cols = {name: np.array([x[0][name] for x in lst], dtype=np.float64) for name in FEATURES}
        out[key] = (cols, np.array([x[1] for x in lst]), np.array([x[2] for x in lst]),
                    np.array([x[3] for x in lst]), np.array([x[4] for x in lst]))
    return out


#: weight of the prediction error next to the selection regret in the fitted loss (keeps the
#: predicted times meaningful for the plans' reasons while the regret decides the ranking)
MSE_WEIGHT = 0.2


def _loss(cal, samples, keys=None) -> float:
    """MSE_WEIGHT x weighted mean squared log error + the mean log regret of the selection
    (measured time of the predicted-fastest candidate / the measured best, per shape)."""
    import numpy as np

    tot = wsum = 0.0
    preds, meas, sids, bests = [], [], [], []
    for key, (cols, us, w, sid, best) in samples.items():
        t, _ = time_us(key, cols, cal, mx=np.maximum)
        preds.append(t), meas.append(us), sids.append(sid), bests.append(best)
        if keys is not None and key not in keys:
            continue
        tot += float((w * np.log(t / us) ** 2).sum())
        wsum += float(w.sum())
    t = np.concatenate(preds)
    us = np.concatenate(meas)
    sid = np.concatenate(sids)
    best = np.concatenate(bests)
    order = np.lexsort((t, sid))            # per shape, fastest predicted first
    first = np.ones(len(order), dtype=bool)
    first[1:] = sid[order][1:] != sid[order][:-1]
    chosen = order[first]
    regret = float(np.log(us[chosen] / best[chosen]).mean())
    return MSE_WEIGHT * tot / max(wsum, 1e-9) + regret


def _descend(cal, samples, params, keys=None, rounds: int = 30) -> float:
    """Coordinate descent over ``params``: (getter, setter) pairs on ``cal``, multiplicative steps."""
    best = _loss(cal, samples, keys)
    for _ in range(rounds):
        improved = False
        for get, put in params:
            v0 = get(cal)
            for s in _STEPS:
                put(cal, v0 * s)
                cur = _loss(cal, samples, keys)
                if cur < best - 1e-12:
                    best, v0, improved = cur, v0 * s, True
            put(cal, v0)
        if not improved:
            break
    return best


def _setter(d, field, cap=None, floor=None):
    def put(c, v):
        v = min(v, cap) if cap is not None else v
        d(c)[field] = max(v, floor) if floor is not None else v
    return (lambda c: d(c)[field]), put


def fit_restarts(records: list[dict], start: dict, restarts: int = 4, log=print, dev=H100_SXM) -> dict:
    """:func:`fit` from ``start`` and from ``restarts - 1`` starts with every tile constant scaled by
    a random factor in [0.6, 1.6] (seeded): the loss is rugged (coordinate descent stops in local
    minima), so keep the fit with the lowest loss on the calibration shapes. On the H100 record the
    held-out family shapes followed that loss: the lowest of 6 fits also ranked best there (304 of
    360 within 5%; the others 281-300)."""
    import random

    best = None
    samples = _samples(records, dev)
    for seed in range(restarts):
        st = copy.deepcopy(start)
        if seed:
            rng = random.Random(seed)
            for t in st["tiles"].values():
                for k in t:
                    t[k] *= rng.uniform(0.6, 1.6)
        fitted = fit(records, st, log=lambda s: None, dev=dev)
        cal = Calibration(fitted)
        cal.source = "fit"
        loss = _loss(cal, samples)
        log(f"start {seed}: loss {loss:.4f}")
        if best is None or loss < best[0]:
            best = (loss, fitted)
    return best[1]


def fit(records: list[dict], start: dict, log=print, dev=H100_SXM) -> dict:
    cal = Calibration(copy.deepcopy(start))
    cal.source = "fit"
    samples = _samples(records, dev)
    n = sum(len(v[1]) for v in samples.values())
    log(f"{n} timed candidates over {len(records)} shapes; loss before {_loss(cal, samples):.4f}")
    for t in cal["tiles"].values():
        t.setdefault("odd_k", 4.0)
        t.setdefault("dram_eff", 0.9)
        t["odd_n_us"] = max(t.get("odd_n_us", 0.0), 0.5)  # (multiplicative steps cannot leave 0)
    cal["cublas_bf16"].pop("odd", None)  # (pre-padding files: ops/gemm.py, _CUBLAS_ROW_ALIGN)
    cal.setdefault("overlap_p", 6.0)
    glob = [_setter(lambda c, f=f: c["launch_us"], f) for f in cal["launch_us"]]
    glob += [_setter(lambda c: c, "l2_bw"), _setter(lambda c: c, "overlap_p")]
    for sweep in range(4):
        for key in sorted(samples):
            if key in cal["tiles"]:
                # dram_eff at most 1: no kernel streams DRAM faster than the copy bandwidth (a fit of
                # 282.7 for the GEMV switched its DRAM bound off and let it win M = 1 shapes of
                # 90+ MB at 1.2-1.5x the best candidate's time: NOTES, twenty-third session)
                params = [_setter(lambda c, key=key: c["tiles"][key], f, cap=1.0 if f == "dram_eff" else None)
                          for f in ("c0_us", "ckb_us", "bw_cta", "split_us", "odd_k", "dram_eff", "odd_n_us")]
            else:
                params = [_setter(lambda c: c["cublas_bf16"], "tflops"), _setter(lambda c: c["cublas_bf16"], "k_half")]
            _descend(cal, samples, params, keys={key}, rounds=6)
        loss = _descend(cal, samples, glob, rounds=6)
        log(f"sweep {sweep}: loss {loss:.4f}")
    return dict(cal)


def _git() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except Exception:
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", required=True)
    r.add_argument("--jobs", type=int, default=1)
    r.add_argument("--budget", type=float, default=1e9)
    f = sub.add_parser("fit")
    f.add_argument("paths", nargs="+")
    f.add_argument("--set", default="random", help="which recorded shape set to fit on (random | family | all)")
    f.add_argument("--device-file", required=True)
    f.add_argument("--restarts", type=int, default=4, help="fits from perturbed starts; the lowest loss wins")
    f.add_argument("--device", default="h100", choices=sorted(DEVICES),
                   help="the GPU the sweep ran on (its SM count and copy bandwidth enter the model)")
    f.add_argument("--start", default=None,
                   help="device file to start from (default: --device-file); a new device starts from "
                        "another's file and takes its own name, match string and copy bandwidth")
    a = ap.parse_args(argv)
    if a.cmd == "run":
        run_sweep(calibration_shapes(), a.out, jobs=a.jobs, budget_s=a.budget, log=lambda s: print(s, flush=True))
        return 0
    recs = [x for p in a.paths for x in load_records(p) if a.set == "all" or x["set"] == a.set]
    dev = DEVICES[a.device]
    with open(a.start or a.device_file) as fh:
        start = json.load(fh)
    # the device's copy bandwidth: DeviceInfo's, which names the measurement it comes from
    start.update(device=dev.name, match=a.device.upper(), mem_bw=dev.mem_bw)
    start.get("measured", {}).pop("clamped", None)
    new = fit_restarts(recs, start, a.restarts, dev=dev)
    new["measured"] = {"date": datetime.date.today().isoformat(), "git": _git(),
                       "shapes": len(recs), "set": a.set,
                       "how": "scripts/checks/calibrate.py fit over every timed candidate of the calibration sweep"}
    with open(a.device_file, "w") as fh:
        json.dump(new, fh, indent=1, sort_keys=True)
        fh.write("\n")
    print(f"wrote {a.device_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
