"""Does the tile order of a weight stream matter for DRAM bandwidth? (H100 probe, ~30 s)

    python scripts/tile_read_probe.py

Reads a row-major [N, K] fp8 weight (2112x7168 and 7168x2048, the 15 MB DeepSeek-V3 shapes)
with one program per (R rows, K range) unit, every load of the unit issued at once, in chunks of
R rows x CK bytes; prints the time (bench timer: CUDA-graph medians, inputs rotated past L2) and
% of the copy-bandwidth floor, next to a contiguous read of the same bytes.
"""

from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from blockscaled.bench.runner import measure_roofline  # noqa: E402
from blockscaled.bench.timing import rotation_count, time_op  # noqa: E402


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def _tile_read(w_ptr, out_ptr, N, K, KSPLIT: tl.constexpr, R: tl.constexpr, CK: tl.constexpr,
               ITERS: tl.constexpr):
    # unit = (row tile, K range of ITERS * CK bytes); data read as int32 words
    pid = tl.program_id(0)
    tile = pid // KSPLIT
    sp = pid % KSPLIT
    rows = tile * R + tl.arange(0, R)
    cw = tl.arange(0, CK // 4)
    acc = tl.zeros([R, CK // 4], dtype=tl.int32)
    base = w_ptr + rows.to(tl.int64)[:, None] * (K // 4)
    for i in tl.static_range(ITERS):
        col = (sp * ITERS + i) * (CK // 4) + cw
        acc ^= tl.load(base + col[None, :], mask=(rows < N)[:, None] & (col < K // 4)[None, :], other=0)
    tl.store(out_ptr + pid, tl.reduce(tl.reduce(acc, 1, _xor), 0, _xor))


def main():
    bw = measure_roofline(iterations=10)["copy_gbps"] * 1e9
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s")
    dev = torch.device("cuda")
    for n, k in ((2112, 7168), (7168, 2048), (4096, 7168)):
        nbytes = n * k
        sets = [(torch.empty(n, k // 4, dtype=torch.int32, device=dev).random_(),)
                for _ in range(rotation_count(nbytes))]
        floor = nbytes / bw * 1e6
        print(f"{n}x{k}: floor {floor:.2f} us")
        for r, ck, ksplit in ((64, 128, 4), (64, 128, 8), (64, 256, 4), (64, 512, 4), (32, 512, 4), (16, 1024, 4),
                              (8, 1024, 7), (16, 512, 2), (8, 1024, 1), (4, 2048, 1), (64, 128, 14), (32, 256, 7), (16, 1024, 7), (128, 128, 7)):
            if k % (ck * ksplit):
                continue
            iters = k // (ck * ksplit)
            grid = triton.cdiv(n, r) * ksplit
            o = torch.empty(grid, dtype=torch.int32, device=dev)
            t = time_op(lambda w: _tile_read[(grid,)](w, o, n, k, KSPLIT=ksplit, R=r, CK=ck, ITERS=iters,
                                                         num_warps=4), sets, warmup=3, iterations=20).median_ms * 1e3
            print(f"  R={r:>3} CK={ck:>5} ksplit={ksplit:>2} iters={iters:>3} programs={grid:>5}: {t:6.2f} us "
                  f"{100 * floor / t:4.0f}%", flush=True)


if __name__ == "__main__":
    main()
