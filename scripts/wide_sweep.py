"""H100 sweep of the dense wide kernel's remaining knobs at prefill M (default M=4096, the six
DeepSeek-V3 shapes): the tile raster (HopperConfig.group_m), the ring depth (stages, up to what
fits), the epilogue (TMA store through a shared tile per half or one per math partition, or masked
store), one 8-warp math partition vs two 4-warp ones (split_wg), the tile width (128x256 vs
128x128) and height (64-row tiles with the dispatch's K split, unsplit and split 2), each varied
alone around the dispatch config (ops/_hopper.choose_dispatch_config), and
the taller rasters combined with the one-buffer TMA epilogue. Every candidate is checked against the float64 reference
first, then timed in ``--rounds`` interleaved rounds (each round times every candidate once:
CUDA-graph median of ``--iterations`` replays, inputs rotated past L2), and each candidate's
ratio to the dispatch config is the median of its per-round ratios. Why rounds: the first H100
run timed candidates one after the other and the dispatch config, timed again at the end of
its shape, had drifted by up to 11% (4096x4096x7168: 196.2 -> 220.7 us), more than most of the
differences being measured. ``--only`` keeps the named candidates (comma list, prefix match).
Prints us and the ratio per candidate and the best per shape; ``--json`` writes the rows.

    python scripts/wide_sweep.py [--ms 4096] [--rounds 5] [--only group_m=32,epilogue=tma1] [--json OUT.json]
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from blockscaled.ops import _hopper as H  # noqa: E402
from hopper_small_m import case_inputs, checked_us, interleaved_us, save_json, sweep_cli  # noqa: E402


def candidates(cfg: H.HopperConfig, m: int, n: int, k: int, nsm: int):
    """(name, config) pairs: the dispatch config first, then one knob changed at a time."""
    out = [("dispatch", cfg)]
    for g in (1, 2, 4, 16, 32):
        if g != cfg.group_m:
            out.append((f"group_m={g}", dataclasses.replace(cfg, group_m=g)))
    for s in range(2, cfg.stages):
        out.append((f"stages={s}", dataclasses.replace(cfg, stages=s)))
    for epi in H.EPILOGUES:
        if epi != cfg.epilogue:
            alt = H._fill_stages(dataclasses.replace(cfg, epilogue=epi, stages=2), 2)
            out.append((f"epilogue={epi} s{alt.stages}", alt))
            if alt.stages != cfg.stages:  # the epilogue alone, at the dispatch config's ring
                out.append((f"epilogue={epi} s{cfg.stages}", dataclasses.replace(cfg, epilogue=epi)))
    out.append((f"split_wg={not cfg.split_wg}", dataclasses.replace(cfg, split_wg=not cfg.split_wg)))
    bn = 384 - cfg.block_n
    alt = H._fill_stages(dataclasses.replace(cfg, block_n=bn, stages=2, tail_split=H.tail_split_for(
        -(-m // 128) * -(-n // bn), k, nsm)), 2)
    out.append((f"block_n={bn} s{alt.stages} tail{alt.tail_split}", alt))
    if cfg.block_m == 128:  # one 64-row warpgroup per tile: twice the tiles
        alt = H._fill_stages(dataclasses.replace(cfg, block_m=64, num_warps=4, stages=2), 2)
        out.append((f"block_m=64 s{alt.stages}", alt))
        # ... unsplit / split 2 whatever the dispatch splits (small M: 64-row tiles won there,
        # benchmarks/NOTES.md 2026-11-23, "64-row tiles at 64 < M <= 256")
        for sk in (1, 2):
            if sk != cfg.split_k and -(-m // 64) * -(-n // 128) * sk <= nsm:
                out.append((f"block_m=64 sk{sk}", dataclasses.replace(alt, split_k=sk, tail_split=1)))
    for g in (16, 32):
        alt = H._fill_stages(dataclasses.replace(cfg, group_m=g, epilogue="tma1", stages=2), 2)
        out.append((f"group_m={g}+tma1 s{alt.stages}", alt))
    return out


def main():
    args = sweep_cli(__doc__, "4096", extra=lambda p: (
        p.add_argument("--rounds", type=int, default=5),
        p.add_argument("--iterations", type=int, default=20),
        p.add_argument("--only", default="", help="candidate names to keep (comma list, prefix match)")))
    only = [x for x in args.only.split(",") if x]
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for m in args.ms:
        for n, k in args.shapes:
            cfg = H.choose_dispatch_config(m, n, k, num_sms=nsm)
            if cfg.variant != "wide":
                continue
            _, sets, ref = case_inputs(m, n, k, max_sets=4)
            fl = 2.0 * m * n * k
            cands = [(name, c) for name, c in candidates(cfg, m, n, k, nsm)
                     if name == "dispatch" or not only or any(name.startswith(o) for o in only)]
            fns = {name: (lambda a, b, c=c: H.gemm_fp8_block_hopper(a, b, torch.bfloat16, config=c))
                   for name, c in cands}
            print(f"--- {m}x{n}x{k}: dispatch {cfg}", flush=True)
            for name, fn in fns.items():  # compile + check before any timing
                checked_us(fn, sets, ref, f"{m}x{n}x{k} {name}", warmup=1, iterations=5)
            us = interleaved_us(fns, sets, args.rounds, args.iterations)
            for name, c in cands:
                ratio = statistics.median(d / t for d, t in zip(us["dispatch"], us[name]))
                med = statistics.median(us[name])
                rows.append({"m": m, "n": n, "k": k, "name": name, "cfg": repr(c), "us": med, "us_rounds": us[name],
                             "tflops": fl / med / 1e6, "vs_dispatch": ratio})
                print(f"  {name:<28} {med:9.1f} us {fl / med / 1e6:7.0f} TFLOP/s  {ratio:5.3f}x  "
                      f"(rounds {min(us[name]):.1f}-{max(us[name]):.1f})", flush=True)
            best = max((r for r in rows if (r["m"], r["n"], r["k"]) == (m, n, k)), key=lambda r: r["vs_dispatch"])
            print(f"  best: {best['name']} {best['vs_dispatch']:.3f}x", flush=True)
    save_json(args.json, rows=rows)


if __name__ == "__main__":
    main()
