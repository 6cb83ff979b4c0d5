"""H100 sweep of the dense wide kernel's remaining knobs at prefill M (default M=4096, the six
DeepSeek-V3 shapes): the tile raster (HopperConfig.group_m), the ring depth (stages, up to what
fits), the epilogue (TMA store through a shared tile per half or one per math partition, or masked
store), one 8-warp math partition vs two 4-warp ones (split_wg), and the tile width (128x256 vs 128x128), each varied alone around the dispatch config
(ops/_hopper.choose_dispatch_config). Every candidate is checked against the float64 reference
first, then timed (CUDA-graph median, inputs rotated past L2). Prints us and the ratio to the
dispatch config per candidate, and the best per shape; ``--json`` writes the rows.

    python scripts/wide_sweep.py [--ms 4096] [--json OUT.json]      # ~4-6 min (one compile per candidate)
"""

from __future__ import annotations

import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from blockscaled.ops import _hopper as H  # noqa: E402
from hopper_small_m import case_inputs, checked_us, save_json, sweep_cli  # noqa: E402


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
    out.append(("dispatch again", cfg))  # drift within the run: the noise floor of the ratios
    return out


def main():
    args = sweep_cli(__doc__, "4096")
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for m in args.ms:
        for n, k in args.shapes:
            cfg = H.choose_dispatch_config(m, n, k, num_sms=nsm)
            if cfg.variant != "wide":
                continue
            _, sets, ref = case_inputs(m, n, k, max_sets=4)
            fl = 2.0 * m * n * k
            base = None
            print(f"--- {m}x{n}x{k}: dispatch {cfg}", flush=True)
            for name, c in candidates(cfg, m, n, k, nsm):
                us = checked_us(lambda a, b, c=c: H.gemm_fp8_block_hopper(a, b, torch.bfloat16, config=c), sets, ref,
                                f"{m}x{n}x{k} {name}", iterations=40)
                base = us if base is None else base
                rows.append({"m": m, "n": n, "k": k, "name": name, "cfg": repr(c), "us": us,
                             "tflops": fl / us / 1e6, "vs_dispatch": base / us})
                print(f"  {name:<28} {us:9.1f} us {fl / us / 1e6:7.0f} TFLOP/s  {base / us:5.3f}x", flush=True)
            best = max((r for r in rows if (r["m"], r["n"], r["k"]) == (m, n, k)), key=lambda r: r["vs_dispatch"])
            print(f"  best: {best['name']} {best['vs_dispatch']:.3f}x", flush=True)
    save_json(args.json, rows=rows)


if __name__ == "__main__":
    main()
