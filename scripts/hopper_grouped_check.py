"""One-command H100 check of the Hopper grouped (MoE) fp8_block path (wide Gluon kernel).

    python scripts/hopper_grouped_check.py            # ~1-2 min on an H100

Correctness (float64 reference of the same quantized inputs, outputs poisoned with NaN):
contiguous with empty / single-row / skewed experts and N, K tails; masked with counts 0, 1,
max_m and partial tiles; rows past a count must keep their poison. A CUDA graph captures the
masked GEMM and is replayed with changed counts. Timing (median of CUDA-graph replays) on the MoE
shapes DeepGEMM reports (docs/design.md, "Measurements older than NOTES.md"), next to the portable
grouped kernel.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from blockscaled.ops import _hopper as H  # noqa: E402
from blockscaled.ops.grouped import grouped_gemm  # noqa: E402
from blockscaled.ops.quantize import quantize  # noqa: E402
from blockscaled.reference import grouped as ref  # noqa: E402
from blockscaled.testing.tolerances import assert_gemm_close  # noqa: E402

DEV = torch.device("cuda")


def inputs(rows_shape, e, n, k, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(*rows_shape, k, device=DEV, generator=g).to(torch.bfloat16)
    w = (torch.randn(e, n, k, device=DEV, generator=g) * 0.05).to(torch.bfloat16)
    a = quantize(x, "fp8_block")
    b = quantize(w, "fp8_block", block=(128, 128))
    return a, b


def run_hopper(a, b, seg, mode, out, cfg=None):
    H.grouped_fp8_block_hopper_impl(a.data, a.scale, b.data, b.scale, seg, mode, out, cfg)
    return out


def check_contiguous(sizes, n, k, cfg=None, seed=0):
    e = len(sizes)
    offs = torch.tensor([0] + list(torch.tensor(sizes).cumsum(0).tolist()), dtype=torch.int32, device=DEV)
    a, b = inputs((sum(sizes),), e, n, k, seed)
    reason = H.grouped_unsupported_reason(a.data, b.data, a.scale, b.scale, a.block, b.block, torch.bfloat16, 1)
    assert reason is None, reason
    out = torch.full((sum(sizes), n), float("nan"), device=DEV, dtype=torch.bfloat16)
    run_hopper(a, b, offs, 1, out, cfg)
    y = ref.grouped_gemm(a, b, offsets=offs)
    assert_gemm_close(out, y, "fp8_block", torch.bfloat16, what=f"contiguous {sizes} N={n} K={k}")
    return a, b, offs


def check_masked(counts, max_m, n, k, cfg=None, seed=1):
    e = len(counts)
    cnt = torch.tensor(counts, dtype=torch.int32, device=DEV)
    a, b = inputs((e, max_m), e, n, k, seed)
    out = torch.full((e, max_m, n), float("nan"), device=DEV, dtype=torch.bfloat16)
    run_hopper(a, b, cnt, 2, out, cfg)
    y = ref.grouped_gemm(a, b, masked_m=cnt)
    rows = torch.arange(max_m, device=DEV)[None, :] < cnt[:, None]
    assert torch.isnan(out[~rows].float()).all(), "masked: rows past a count were written"
    assert_gemm_close(out[rows], y[rows], "fp8_block", torch.bfloat16, what=f"masked {counts} N={n} K={k}")
    return a, b, cnt


def graph_check():
    e, max_m, n, k = 4, 192, 512, 1024
    a, b = inputs((e, max_m), e, n, k, 7)
    cnt = torch.tensor([5, 0, 192, 70], dtype=torch.int32, device=DEV)
    out = torch.full((e, max_m, n), float("nan"), device=DEV, dtype=torch.bfloat16)
    run_hopper(a, b, cnt, 2, out)  # compile outside the capture
    torch.cuda.synchronize()
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        run_hopper(a, b, cnt, 2, out)
    for counts in ([1, 2, 3, 4], [192, 191, 0, 128], [0, 0, 0, 0]):
        cnt.copy_(torch.tensor(counts, dtype=torch.int32))
        out.fill_(float("nan"))
        gr.replay()
        torch.cuda.synchronize()
        y = ref.grouped_gemm(a, b, masked_m=cnt)
        rows = torch.arange(max_m, device=DEV)[None, :] < cnt[:, None]
        assert torch.isnan(out[~rows].float()).all()
        if rows.any():
            assert_gemm_close(out[rows], y[rows], "fp8_block", torch.bfloat16, what=f"graph replay {counts}")


def bench(fn):
    """Seconds: median of CUDA-graph replays (host launch overhead excluded)."""
    from blockscaled.bench.timing import time_op

    return time_op(lambda: fn(), [()], warmup=3, iterations=20).median_ms * 1e-3


def main() -> int:
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    fails = 0
    checks = [
        ("contiguous skewed", lambda: check_contiguous([0, 1, 130, 127, 300, 0, 64, 1000], 384, 1040)),
        ("contiguous N=4096", lambda: check_contiguous([128] * 8, 4096, 7168)),
        ("contiguous bm64 bn128", lambda: check_contiguous([3, 64, 65, 0], 200, 512,
                                                           H.HopperConfig("wide", 64, 128, 4, 4, epilogue="masked"))),
        ("contiguous 1 expert", lambda: check_contiguous([77], 256, 256)),
        ("contiguous E=64", lambda: check_contiguous([(i * 37) % 150 for i in range(64)], 256, 512)),
        ("masked", lambda: check_masked([0, 200, 1, 77, 128, 129], 200, 320, 1024)),
        ("masked bm128 bn256", lambda: check_masked([64, 0, 3], 64, 512, 2048,
                                                    H.HopperConfig("wide", 128, 256, 8, 4, epilogue="masked"))),
        ("cuda graph masked", graph_check),
    ]
    for name, fn in checks:
        t0 = time.time()
        try:
            fn()
            print(f"ok    {name} ({time.time() - t0:.1f} s)", flush=True)
        except Exception as e:  # report every check
            fails += 1
            print(f"FAIL  {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            traceback.print_exc()
    # timing: (mode, E, m per expert, N, K, DeepGEMM TFLOP/s from docs/design.md, "Measurements
    # older than NOTES.md")
    rows = [(1, 8, 128, 4096, 7168, 592), (1, 8, 512, 4096, 7168, None), (1, 8, 256, 7168, 2048, None),
            (2, 8, 64, 4096, 7168, 311), (2, 8, 128, 4096, 7168, 604), (2, 8, 64, 7168, 2048, 268),
            (2, 8, 128, 7168, 2048, 485), (1, 32, 64, 4096, 7168, None), (1, 256, 32, 2048, 7168, None)]
    print(f"{'mode':<10} {'E':>4} {'m':>5} {'N':>6} {'K':>6} {'hopper':>8} {'cfg':>12} {'portable':>9} {'DeepGEMM':>8}")
    for mode, e, m, n, k, dg in rows:
        try:
            if mode == 1:
                offs = torch.arange(0, (e + 1) * m, m, dtype=torch.int32, device=DEV)
                a, b = inputs((e * m,), e, n, k, 3)
                seg, out = offs, torch.empty(e * m, n, device=DEV, dtype=torch.bfloat16)
                port = lambda: grouped_gemm(a, b, offsets=offs)  # noqa: E731
            else:
                seg = torch.full((e,), m, dtype=torch.int32, device=DEV)
                a, b = inputs((e, m), e, n, k, 3)
                out = torch.empty(e, m, n, device=DEV, dtype=torch.bfloat16)
                port = lambda: grouped_gemm(a, b, masked_m=seg)  # noqa: E731
            cfg = H.choose_grouped_config(m, n, k)
            flops = 2.0 * e * m * n * k
            th = flops / bench(lambda: run_hopper(a, b, seg, mode, out)) / 1e12
            tp = flops / bench(port) / 1e12
            print(f"{'contig' if mode == 1 else 'masked':<10} {e:>4} {m:>5} {n:>6} {k:>6} {th:>8.1f} "
                  f"{f'{cfg.block_m}x{cfg.block_n}s{cfg.stages}':>12} {tp:>9.1f} {dg or '-':>8}", flush=True)
        except Exception as ex:
            fails += 1
            print(f"FAIL timing {mode} {e} {m} {n} {k}: {type(ex).__name__}: {str(ex)[:200]}")
    print(f"# {fails} failure(s)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
