"""Where does an eager gemm() call spend host time? (H100 diagnostics, ~30 s)

    python scripts/eager_overhead.py [fmt] [M] [N] [K]

Prints graph-replay (GPU) time, eager time per call, and the top host functions of 200 eager
calls under cProfile."""

import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from blockscaled.bench.timing import time_op  # noqa: E402
from blockscaled.ops.gemm import gemm  # noqa: E402
from blockscaled.ops.quantize import quantize  # noqa: E402

fmt = sys.argv[1] if len(sys.argv) > 1 else "mxfp4"
m, n, k = (int(x) for x in (sys.argv[2:5] if len(sys.argv) > 4 else (4096, 2112, 7168)))
x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
a = quantize(x, fmt)
b = quantize(w, fmt, block=(128, 128)) if fmt == "fp8_block" else quantize(w, fmt)
gemm(a, b)
torch.cuda.synchronize()
g = time_op(lambda: gemm(a, b), [()], warmup=3, iterations=20).median_ms
t0 = time.perf_counter()
for _ in range(200):
    gemm(a, b)
torch.cuda.synchronize()
eager = (time.perf_counter() - t0) / 200 * 1e3
print(f"{fmt} {m}x{n}x{k}: graph {g:.3f} ms, eager {eager:.3f} ms/call")
pr = cProfile.Profile()
pr.enable()
for _ in range(200):
    gemm(a, b)
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(18)
