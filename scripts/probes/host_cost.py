"""Eager host cost of decode-size calls: what a model running without CUDA graphs pays per call.

    python scripts/probes/host_cost.py [--json OUT.json] [--profile mxfp4:linear-wo:2880]   # ~1 min on an H100
    python scripts/probes/host_cost.py --stub                                             # CPU, no GPU needed

Issue 18: "a decode-size call should cost a few microseconds of Python, not tens". For each format
(fp8_block as the reference, mxfp8, mxfp4, nvfp4), M = 1 on N x K = 2880 x 2880 (gpt-oss) and
8192 x 8192 (Llama 3 70B o), and each call

  gemm       ``bs.gemm(qa, w)``              W x A, activations quantized beforehand
  linear-wo  ``bs.linear(x, w, weight_only=True)``  bf16 activations
  linear     ``bs.linear(x, w)``             W x A with the activation quantizer (E2E)
  quantize   ``bs.quantize(x, fmt)``         the activations alone (W x A callers' other call)

it prints (us per call):

  eager      wall clock of back-to-back eager calls, one sync per sample
             (``blockscaled.bench.timing.time_eager_wall``): host-bound at these sizes
  via op     the same through the torch.library custom op (``blockscaled.ops.gemm.EAGER_FAST_PATH =
             False``: what torch.compile / dispatch modes see; the cost of the dispatcher round trip)
  graph      CUDA-graph replay per call (``time_op``): the GPU's own time
  host/GPU   eager / graph: how many times the GPU idles on the host

then a cProfile top-15 (by own time) of one of the calls (``--profile FMT:CALL:N``), 3000 eager calls.

``--stub`` (any machine, no GPU): the same calls on CPU tensors through the Triton interpreter's
kernel objects replaced by no-ops, planned as for an H100 (``blockscaled.plan.H100_SXM``): the
library's own host path up to the launch (validation, planning, allocation, launch arguments),
without Triton's launcher and the driver; CPU process time, best of several rounds (use it for
A/B comparisons of the host path on one machine: a shared CPU makes single runs noisy).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

FORMATS = ("fp8_block", "mxfp8", "mxfp4", "nvfp4")
SHAPES = ((2880, 2880), (8192, 8192))
CALLS = ("gemm", "linear-wo", "linear", "quantize")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--json", default=None, help="write the measurements to this file")
    p.add_argument("--profile", default="mxfp4:linear-wo:2880",
                   help="FMT:CALL:N of the call profiled with cProfile (default %(default)s; 'none': skip)")
    p.add_argument("--stub", action="store_true",
                   help="CPU: the library's host path with the kernel launches stubbed out (no GPU)")
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated formats (default all)")
    p.add_argument("--rounds", type=int, default=7, help="--stub: rounds (best of) per call (default 7)")
    return p.parse_args(argv)


def _inputs(bs, torch, fmt, n, k, dev, quantize=None):
    """``quantize``: the quantizer of the inputs (--stub: the reference twin, bitwise the same;
    the interpreted kernel takes minutes on an 8192 x 8192 weight)."""
    quantize = quantize or bs.quantize
    g = torch.Generator(device=dev).manual_seed(n + k)
    w = quantize((torch.randn(n, k, generator=g, device=dev) * 0.05).to(torch.bfloat16), fmt,
                    block=(128, 128) if fmt == "fp8_block" else None)
    x = torch.randn(1, k, generator=g, device=dev).to(torch.bfloat16)
    return x, quantize(x, fmt), w


def _calls(bs, x, qa, w):
    fmt = w.format.name
    return {"gemm": (lambda: bs.gemm(qa, w)), "linear-wo": (lambda: bs.linear(x, w, weight_only=True)),
            "linear": (lambda: bs.linear(x, w)), "quantize": (lambda: bs.quantize(x, fmt, check_range=False))}


def _profile(fn, calls: int = 3000) -> str:
    for _ in range(20):
        fn()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(15)
    return s.getvalue()


def run_gpu(a) -> dict:
    import torch

    import blockscaled as bs
    import blockscaled.ops.gemm as gemm_mod
    from blockscaled.bench.timing import time_eager_wall, time_op
    from blockscaled.plan import observe_plans

    if not torch.cuda.is_available():
        sys.exit("host_cost.py: needs a CUDA GPU (or --stub for the CPU host path)")
    dev = "cuda"
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    print(f"{out['gpu']}  torch {torch.__version__}")
    print(f"{'format':9s} {'N x K':11s} {'call':9s} {'eager us':>9s} {'via op':>8s} {'graph us':>9s} "
          f"{'host/GPU':>8s}  plan")
    profiled = None
    pf = a.profile.split(":") if a.profile != "none" else None
    for n, k in SHAPES:
        for fmt in a.formats.split(","):
            x, qa, w = _inputs(bs, torch, fmt, n, k, dev)
            for name, fn in _calls(bs, x, qa, w).items():
                with observe_plans() as plans:
                    fn()
                plan = plans[0].describe() if plans else "-"
                te = time_eager_wall(lambda: fn(), [()], warmup=20, iterations=30).median_ms
                gemm_mod.EAGER_FAST_PATH = False
                try:
                    to = time_eager_wall(lambda: fn(), [()], warmup=20, iterations=30).median_ms
                finally:
                    gemm_mod.EAGER_FAST_PATH = True
                tg = time_op(lambda: fn(), [()], warmup=5, iterations=30).median_ms
                row = {"format": fmt, "n": n, "k": k, "call": name, "eager_us": te * 1e3, "via_op_us": to * 1e3,
                       "graph_us": tg * 1e3, "plan": plan}
                out["rows"].append(row)
                print(f"{fmt:9s} {n}x{k:<6d} {name:9s} {te * 1e3:9.1f} {to * 1e3:8.1f} {tg * 1e3:9.1f} "
                      f"{te / tg:8.1f}  {plan}", flush=True)
                if pf and (fmt, name, str(n)) == (pf[0], pf[1], pf[2]):
                    profiled = (f"{fmt} {name} M=1 {n}x{k}", _profile(fn))
            del x, qa, w
            torch.cuda.empty_cache()
    if profiled:
        print(f"\ncProfile, {profiled[0]}, 3000 eager calls, top 15 by own time:\n{profiled[1]}")
        out["profile"] = {"call": profiled[0], "text": profiled[1]}
    return out


def run_stub(a) -> dict:
    os.environ["TRITON_INTERPRET"] = "1"  # CPU tensors take the kernels' path, not the reference twin
    import warnings

    warnings.simplefilter("ignore")  # nvfp4 range warnings of the random inputs
    import torch

    import blockscaled as bs
    import blockscaled.ops.gemm as gemm_mod
    import blockscaled.ops.quantize as quant_mod
    import blockscaled.reference  # noqa: F401  (bs.reference.quantize: the inputs)
    from blockscaled.plan import H100_SXM

    class _NoLaunch:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

        def __getattr__(self, name):  # the kernels module: every kernel a no-op
            return self

    stub = _NoLaunch()
    # private: the launch points are module globals of ops/ (no public hook): stubbing them keeps
    # the whole host path above them and drops the interpreter's kernel execution
    gemm_mod.gemm_kernel = gemm_mod.gemv_kernel = gemm_mod.mx_gemv_kernel = stub
    quant_mod._k = stub  # private: the quantize kernels' module, stubbed as above
    # plan as on an H100 (the interpreter's own plans are small tiles, other code paths)
    gemm_mod.device_info = quant_mod.device_info = lambda d: H100_SXM
    out = {"mode": "stub", "rows": []}
    fns = {}
    for n, k in SHAPES:
        for fmt in a.formats.split(","):
            x, qa, w = _inputs(bs, torch, fmt, n, k, "cpu", quantize=bs.reference.quantize)
            for name, fn in _calls(bs, x, qa, w).items():
                fns[(fmt, n, k, name)] = fn
    best = {key: float("inf") for key in fns}
    for f in fns.values():
        for _ in range(30):
            f()
    for _ in range(a.rounds):  # round-robin over the calls: a noisy neighbour hits them alike
        for key, f in fns.items():
            t = time.process_time()
            for _ in range(200):
                f()
            best[key] = min(best[key], (time.process_time() - t) / 200 * 1e6)
    print(f"host path up to the launch (stubbed), CPU process time, best of {a.rounds} rounds of 200 calls")
    print(f"{'format':9s} {'N x K':11s} {'call':9s} {'host us':>8s}")
    for (fmt, n, k, name), us in best.items():
        out["rows"].append({"format": fmt, "n": n, "k": k, "call": name, "host_us": us})
        print(f"{fmt:9s} {n}x{k:<6d} {name:9s} {us:8.1f}")
    pf = a.profile.split(":") if a.profile != "none" else None
    if pf:
        key = (pf[0], int(pf[2]), int(pf[2]), pf[1])
        if key in fns:
            text = _profile(fns[key])
            print(f"\ncProfile (stubbed launches), {pf[0]} {pf[1]} M=1 {pf[2]}x{pf[2]}:\n{text}")
            out["profile"] = {"call": a.profile, "text": text}
    return out


def main(argv=None) -> int:
    a = parse_args(argv)
    out = run_stub(a) if a.stub else run_gpu(a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"json: {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
