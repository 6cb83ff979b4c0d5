"""One-command H100 check of the sm_90a fp8_block GEMM kernels (``blockscaled.ops._hopper``).

    python scripts/hopper_check.py            # ~2-4 min on an H100
    python scripts/hopper_check.py --variants wide,wide@block_n=128 --no-bench --quick -v

For each variant (``HopperConfig.variant`` with optional field overrides, e.g.
``wide@block_n=128:epilogue=masked``; plus the portable Triton ``gemm`` for comparison) and
each shape (the six DeepSeek-V3 (N, K) at M in {128, 4096}, plus odd shapes M=1, 77, N=200,
K=320): correctness against the float64 reference (``assert_gemm_close``, fp8_block, bf16 out;
outputs poisoned with NaN first), then timing (median of CUDA-graph replays)
next to cuBLAS fp8_block (``torch._scaled_mm`` with 1x128 / 128x128 scales) measured
in the same run. One row per (variant, shape); exceptions are caught per row and printed
(first line) so one failure does not hide the rest. Exit status 1 if any row failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
import time
import traceback

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))  # no PYTHONPATH needed

from blockscaled.ops._hopper import (  # noqa: E402
    choose_hopper_config, gemm_fp8_block_hopper, unsupported_reason)
from blockscaled.ops.quantize import quantize  # noqa: E402
from blockscaled.reference import gemm as ref_gemm  # noqa: E402
from blockscaled.testing.tolerances import assert_gemm_close  # noqa: E402

DSV3_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
# DeepGEMM v2.6.1 on the same kind of H100 at M=4096 (docs/design.md, "Measurements older than
# NOTES.md"), TFLOP/s
DEEPGEMM_4096 = {(2112, 7168): 1186, (24576, 1536): 1175, (32768, 512): 935, (7168, 16384): 1257,
                 (4096, 7168): 1307, (7168, 2048): 1216}
ODD = [(1, 2112, 7168), (77, 7168, 2048), (128, 200, 7168), (4096, 200, 1536), (77, 200, 320), (4096, 4096, 320),
       (1, 128, 128), (300, 384, 2048)]


def shapes(quick: bool, ms: str | None = None, odd: bool = True):
    m_list = (128, 4096) if not ms else tuple(int(x) for x in ms.split(","))
    out = [(m, n, k) for m in m_list for (n, k) in DSV3_NK] + (ODD if odd else [])
    if quick:
        out = [(4096, 4096, 7168), (128, 7168, 2048)] + ODD[:4]
    return out


_PROGRESS = {"t": time.time(), "what": "start"}


def _mark(what: str) -> None:
    _PROGRESS["t"] = time.time()
    _PROGRESS["what"] = what


def _watchdog(limit_s: float) -> None:
    # A pipeline bug (mbarrier phase / missing arrive) hangs the GPU instead of failing: report
    # which variant and shape and exit instead of blocking the whole run.
    while True:
        time.sleep(5)
        if time.time() - _PROGRESS["t"] > limit_s:
            print(f"\n# HANG: no progress for {limit_s:.0f} s during: {_PROGRESS['what']}\n"
                  f"# rerun without that variant: --variants ...", flush=True)
            os._exit(3)


def gbench(fn) -> float:
    """Median ms of CUDA-graph replays (blockscaled.bench.timing): host launch overhead excluded.
    (triton.testing.do_bench timed eager launches: at < 100 us per kernel the Python launch of a
    Gluon kernel with TMA descriptors dominated and results varied 2x run to run.)"""
    from blockscaled.bench.timing import time_op

    return time_op(lambda: fn(), [()], warmup=3, iterations=20).median_ms


def cublas_fn(a, b):
    a8, sa = a.data, a.scale
    b8, sb = b.data, b.scale
    sa_cm = sa.t().contiguous().t()  # cuBLAS wants the 1x128 activation scales M-major
    sbt = sb.T

    def f():
        return torch._scaled_mm(a8, b8.T, sa_cm, sbt, out_dtype=torch.bfloat16)

    return f


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="wide,wide@epilogue=masked,portable")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--m", default=None, help="comma-separated M values for the DeepSeek-V3 shapes (default 128,4096)")
    ap.add_argument("--no-odd", action="store_true", help="skip the odd-shape correctness rows")
    ap.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of failing rows")
    ap.add_argument("--hang-s", type=float, default=90.0, help="watchdog: exit if one step takes longer")
    args = ap.parse_args()
    threading.Thread(target=_watchdog, args=(args.hang_s,), daemon=True).start()
    variants = [v for v in args.variants.split(",") if v]
    if not torch.cuda.is_available():
        print("needs a CUDA GPU (sm_90 / H100)")
        return 2
    dev = torch.device("cuda")
    nsm = torch.cuda.get_device_properties(dev).multi_processor_count
    print(f"# {torch.cuda.get_device_name(dev)} cc={torch.cuda.get_device_capability(dev)} torch {torch.__version__} "
          f"triton {triton.__version__}")
    hdr = (f"{'variant':<36} {'M':>5} {'N':>6} {'K':>6} {'cfg':<14} {'TFLOP/s':>8} {'cuBLAS':>8} {'ratio':>6} "
           f"{'DG4096':>6} {'rel_fro':>9} {'nmax':>9} {'==1st':>5} {'1st_s':>6}  status")
    # TFLOP/s: ours (median of CUDA-graph replays); cuBLAS: torch._scaled_mm fp8_block same run; ratio = ours/cuBLAS;
    # DG4096: DeepGEMM's H100 figure at M=4096 (DEEPGEMM_4096 above); rel_fro / nmax: vs float64 reference;
    # ==1st: bitwise equal to the first Hopper variant's output (same promotion order, expected "yes"
    # unless a tail split or split-K changes the summation order);
    # 1st_s: wall time of the first call (includes the JIT compile when the config is new).
    print(hdr)
    print("-" * len(hdr))
    failures = 0
    t_start = time.time()
    for (m, n, k) in shapes(args.quick, args.m, not args.no_odd):
        g = torch.Generator(device=dev).manual_seed(m * 7 + n * 3 + k)
        x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
        w = torch.randn(n, k, device=dev, generator=g).mul_(0.05).to(torch.bfloat16)
        a = quantize(x, "fp8_block")
        b = quantize(w, "fp8_block", block=(128, 128))
        ref = ref_gemm.gemm(a, b)  # float64 on the GPU
        flops = 2.0 * m * n * k
        cub_tf = None
        _mark(f"cuBLAS {m}x{n}x{k}")
        if not args.no_bench:
            try:
                f = cublas_fn(a, b)
                f()
                cub_tf = flops / (gbench(f) * 1e-3) / 1e12
            except Exception:  # cuBLAS refuses some shapes (e.g. K % 128 != 0 in some versions)
                cub_tf = None
        first_out = None
        for v in variants:
            cfg_s, tf, rel, nmax, same, status, first = "-", None, None, None, "", "ok", None
            _mark(f"variant {v} at M={m} N={n} K={k}")
            try:
                if v == "portable":
                    from blockscaled.ops.gemm import gemm

                    def run(out=None, a=a, b=b):
                        return gemm(a, b, out_dtype=torch.bfloat16, out=out)
                else:
                    # "name[@key=val:...]": overrides of the heuristic's HopperConfig fields, e.g.
                    # wide@block_n=128:stages=5:epilogue=masked
                    name, _, over = v.partition("@")
                    cfg = choose_hopper_config(m, n, k, variant=name, num_sms=nsm)
                    kw = {}
                    for item in filter(None, over.split(":")):
                        key, _, val = item.partition("=")
                        kw[key] = val if key in ("variant", "epilogue") else int(val)
                    cfg = dataclasses.replace(cfg, **kw)
                    cfg_s = f"{cfg.block_m}x{cfg.block_n}s{cfg.stages}g{cfg.group_m}"
                    reason = unsupported_reason(a, b, torch.bfloat16, cfg)
                    if reason is not None:
                        raise NotImplementedError(reason)

                    def run(out=None, cfg=cfg, a=a, b=b):
                        return gemm_fp8_block_hopper(a, b, torch.bfloat16, out, config=cfg)

                out = torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)
                torch.cuda.synchronize()
                t0 = time.time()
                run(out)
                torch.cuda.synchronize()
                first = time.time() - t0
                d = out.double() - ref
                rel = (d.norm() / ref.norm().clamp_min(1e-300)).item()
                nmax = (d.abs().max() / ref.abs().max().clamp_min(1e-300)).item() if out.numel() else 0.0
                if v != "portable":
                    if first_out is None:
                        first_out = out
                    else:
                        same = "yes" if torch.equal(out, first_out) else "NO"
                try:
                    assert_gemm_close(out, ref, "fp8_block", torch.bfloat16, what=f"{v} {m}x{n}x{k}")
                except AssertionError as e:
                    status = "FAIL accuracy: " + str(e).splitlines()[0][:120]
                    failures += 1
                if not args.no_bench:
                    tf = flops / (gbench(lambda: run()) * 1e-3) / 1e12
            except Exception as e:
                failures += 1
                status = f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                if args.verbose:
                    traceback.print_exc()
            dg = DEEPGEMM_4096.get((n, k)) if m == 4096 else None
            fmt = lambda x, p=1: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
            ratio = None if (tf is None or not cub_tf) else tf / cub_tf
            print(f"{v:<36} {m:>5} {n:>6} {k:>6} {cfg_s:<14} {fmt(tf):>8} {fmt(cub_tf):>8} {fmt(ratio, 2):>6} "
                  f"{'-' if dg is None else dg:>6} {('-' if rel is None else f'{rel:.2e}'):>9} "
                  f"{('-' if nmax is None else f'{nmax:.2e}'):>9} {same:>5} {fmt(first, 2):>6}  {status}", flush=True)
        del x, w, a, b, ref, first_out
        torch.cuda.empty_cache()
    print(f"# done in {time.time() - t_start:.0f} s, {failures} failing row(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
