"""H100 sweep of the wide kernel's tiles on the grouped (MoE) rows that miss their targets.

    python scripts/grouped_sweep.py [--json OUT.json]     # ~2-3 min on an H100

Rows: masked E=8, max_m=256, m=128 per expert at (N, K) = (4096, 7168) and (7168, 2048) (DeepGEMM
604 / 485 TFLOP/s, docs/design.md, "Measurements older than NOTES.md") and contiguous E=8 m=128
N=4096 K=7168 (DeepGEMM 592). For each: today's choice (``ops._hopper.choose_grouped_config``) and
every (block_m, block_n, ring depth, GROUP_M, split_wg) candidate, checked once against the float64
reference of the same quantized inputs, timed with the bench's timer (CUDA-graph medians, inputs
rotated past L2).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from blockscaled.bench.timing import rotation_count, time_op  # noqa: E402
from blockscaled.ops import _hopper as H  # noqa: E402
from blockscaled.ops.quantize import quantize  # noqa: E402
from blockscaled.reference.quantize import dequantize  # noqa: E402
from blockscaled.testing.tolerances import assert_gemm_close  # noqa: E402

DEV = torch.device("cuda")
# (label, masked, experts, max_m (masked) / rows per expert, m per expert, N, K)
ROWS = (("masked m=128 4096x7168", True, 8, 256, 128, 4096, 7168),
        ("masked m=128 7168x2048", True, 8, 256, 128, 7168, 2048),
        ("contig m=128 4096x7168", False, 8, 128, 128, 4096, 7168))


def operands(masked, e, max_m, m, n, k, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    rows = (e, max_m, k) if masked else (e * m, k)
    x = torch.randn(*rows, device=DEV, generator=g).to(torch.bfloat16)
    w = (torch.randn(e, n, k, device=DEV, generator=g) * 0.05).to(torch.bfloat16)
    seg = (torch.full((e,), m, dtype=torch.int32, device=DEV) if masked
           else torch.arange(0, e * m + 1, m, dtype=torch.int32, device=DEV))
    return quantize(x, "fp8_block"), quantize(w, "fp8_block", block=(128, 128)), seg


def run(a, b, seg, masked, n, cfg):
    mode = 2 if masked else 1
    shape = (a.shape[0], a.shape[1], n) if masked else (a.shape[0], n)
    out = torch.empty(shape, dtype=torch.bfloat16, device=DEV)
    H.grouped_fp8_block_hopper_impl(a.data, a.scale, b.data, b.scale, seg, mode, out, cfg)
    return out


def moe_rows():
    """The moe suite's E=8 / E=4 rows (contiguous; E=1 runs the dense gemm()) and the masked
    suite's uniform rows (max_m 256)."""
    for e in (8, 4):
        for m in (64, 128, 512):
            for n in (2048, 4096, 7168):
                for k in (2048, 4096, 7168):
                    yield (f"contig E={e} m={m} {n}x{k}", False, e, m, m, n, k)
    for m in (64, 128):
        for n, k in ((4096, 7168), (7168, 2048)):
            yield (f"masked m={m} {n}x{k}", True, 8, 256, m, n, k)


def candidates(m, n, k, nsm, short=False):
    """today's choice, then every (block_m, block_n, ring depth, GROUP_M, split_wg) candidate;
    ``short``: the fullest ring only, both math partitions (the --moe sweep)."""
    base = H.choose_grouped_config(m, n, k, nsm, 2)
    yield "today", base
    for bm in (64, 128):
        for bn in (128, 256):
            c0 = H._fill_stages(H.HopperConfig("wide", block_m=bm, block_n=bn, num_warps=4 * (bm // 64), stages=2,
                                               epilogue="masked"), 2)
            for st in ((c0.stages,) if short else sorted({c0.stages, max(2, c0.stages - 1)})):
                for gm in (1, 8):
                    for swg in ((True, False) if bm == 128 and not short else (True,)):
                        cfg = dataclasses.replace(c0, stages=st, group_m=gm, split_wg=swg)
                        if cfg != base:
                            yield f"{bm}x{bn} s{st} g{gm}{'' if swg else ' one-partition'}", cfg


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    p.add_argument("--moe", action="store_true", help="all moe-suite E=8/4 rows and the masked rows, short candidate list")
    args = p.parse_args()
    rows = list(moe_rows()) if args.moe else ROWS
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    out_rows = []
    for label, masked, e, max_m, m, n, k in rows:
        nbytes = e * n * k + (e * max_m if masked else e * m) * k
        sets = [operands(masked, e, max_m, m, n, k, s) for s in range(min(rotation_count(nbytes), 8))]
        a, b, seg = sets[0]
        da, db = dequantize(a).double(), dequantize(b).double()
        ref = (torch.stack([da[i, :m] @ db[i].T for i in range(e)]) if masked
               else torch.cat([da[i * m:(i + 1) * m] @ db[i].T for i in range(e)]))
        flops = 2.0 * e * m * n * k
        res = []
        for name, cfg in candidates(m, n, k, nsm, short=args.moe):
            y = run(a, b, seg, masked, n, cfg)
            y = y[:, :m] if masked else y
            assert_gemm_close(y, ref, "fp8_block", torch.bfloat16, what=f"{label} {name}")
            t = time_op(lambda a, b, s, cfg=cfg: run(a, b, s, masked, n, cfg), sets, warmup=5,
                        iterations=30).median_ms
            res.append({"cfg": name, "us": t * 1e3, "tflops": flops / t / 1e9})
            print(f"{label:<24} {name:<30} {t * 1e3:8.1f} us {flops / t / 1e9:7.1f} TFLOP/s", flush=True)
        best = max(res, key=lambda r: r["tflops"])
        print(f"== {label}: today {res[0]['tflops']:.1f}, best {best['cfg']} {best['tflops']:.1f} TFLOP/s", flush=True)
        out_rows.append({"row": label, "results": res})
        del sets
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": out_rows}, f, indent=1)


if __name__ == "__main__":
    main()
