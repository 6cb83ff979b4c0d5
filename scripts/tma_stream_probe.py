"""Does the weight layout limit the wide kernel's DRAM stream? (H100 probe, ~30 s)

    python scripts/tma_stream_probe.py [--json OUT.json]

Streams a [N, K] fp8 weight through a TMA ring of 128x128 boxes exactly as the wide kernel's
producer loads B (one program per (128-row tile, K range), STAGES boxes in flight, no math), from
the row-major layout (each box = 128 rows x 128 B, rows K bytes apart) and from a pre-packed
layout in which every box is 16 KB contiguous; prints the CUDA-graph median (inputs rotated past
L2) and GB/s per grid and ring depth. H100 (benchmarks/NOTES.md 2026-11-23, "Is the tiled weight
read what keeps small M from the floor? No."): pre-packed was only 1-5% faster (e.g. 7168x7168 split
2, 4 stages: 19.2 vs 19.0 us), so DRAM page locality of the tiled reads is not what keeps the
small-M GEMMs from the floor; the row-major stream itself reached 2.0 TB/s on the 15 MB shapes (7.2
us, launch and ramp included) and 2.5-2.9 TB/s on 51-117 MB ones.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from blockscaled.bench.timing import rotation_count, time_op  # noqa: E402
from hopper_small_m import save_json  # noqa: E402

SHAPES = ((7168, 7168), (2048, 7168), (4096, 7168), (7168, 16384), (7168, 2048))


@gluon.jit
def _stream(b_desc, out_ptr, nkb, kb_per, SPLIT: gl.constexpr, PACKED: gl.constexpr, STAGES: gl.constexpr,
            num_warps: gl.constexpr):
    pid = gl.program_id(0)
    tile = pid // SPLIT
    kb_lo = (pid % SPLIT) * kb_per
    n = gl.minimum(kb_lo + kb_per, nkb) - kb_lo
    bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, 128, 128], b_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    for i in range(0, n + STAGES):
        if i >= STAGES:  # the box issued STAGES iterations ago has landed: its slot is free
            j = i - STAGES
            mbarrier.wait(bars.index(j % STAGES), (j // STAGES) & 1)
        if i < n:
            s = i % STAGES
            kb = kb_lo + i
            mbarrier.expect(bars.index(s), b_desc.block_type.nbytes)
            if PACKED:
                tma.async_copy_global_to_shared(b_desc, [(tile * nkb + kb) * 128, 0], bars.index(s), bufs.index(s))
            else:
                tma.async_copy_global_to_shared(b_desc, [tile * 128, kb * 128], bars.index(s), bufs.index(s))
    x = bufs.index(0).load(gl.BlockedLayout([1, 16], [32, 1], [num_warps, 1], [1, 0]))
    gl.store(out_ptr + pid, gl.sum(gl.sum(x.to(gl.float32), 1), 0))  # keeps the loads alive


def stream_us(n, k, split, stages, packed, sets):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    nkb = k // 128
    layout = gl.NVMMASharedLayout.get_default_for([128, 128], gl.float8e4nv)

    def f(w, out):
        if packed:  # the same bytes viewed as [N/128 * K/128 boxes of 128 rows, 128 B]
            v = w.view(-1, 128)
            d = TensorDescriptor(v, [v.shape[0], 128], [128, 1], [128, 128], layout)
        else:
            d = TensorDescriptor(w, [n, k], [k, 1], [128, 128], layout)
        _stream[(n // 128 * split,)](d, out, nkb, triton.cdiv(nkb, split), SPLIT=split, PACKED=packed,
                                     STAGES=stages, num_warps=4)

    return time_op(f, sets, warmup=3, iterations=30).median_ms * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rows = []
    for n, k in SHAPES:
        sets = [(torch.randint(-100, 100, (n, k), device="cuda", dtype=torch.int8).view(torch.float8_e4m3fn),
                 torch.empty(4096, device="cuda")) for _ in range(max(2, rotation_count(n * k)))]
        tiles = n // 128
        for split in sorted({max(1, 132 // tiles), max(1, 96 // tiles + 1), max(1, 264 // tiles), max(1, 528 // tiles)}):
            for stages in (4, 6, 12):
                for packed in (False, True):
                    us = stream_us(n, k, split, stages, packed, sets)
                    rows.append({"n": n, "k": k, "split": split, "programs": tiles * split, "stages": stages,
                                 "packed": packed, "us": us, "gbps": n * k / us / 1e3})
                    print(f"{n}x{k} split {split:2d} ({tiles * split:4d} programs) stages {stages:2d} "
                          f"{'packed  ' if packed else 'rowmajor'}: {us:7.2f} us {n * k / us / 1e3:6.0f} GB/s", flush=True)
        del sets
        torch.cuda.empty_cache()
    save_json(args.json, rows=rows)


if __name__ == "__main__":
    main()
