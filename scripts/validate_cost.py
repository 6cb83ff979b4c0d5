"""What does checking MoE metadata cost? (GPU; about a minute on an H100)

    python scripts/validate_cost.py [--shapes E:m,E:m,...] [--n 4096] [--k 7168] [--swiglu] [--iters 50]
    python scripts/validate_cost.py --smoke      # CPU plumbing check (Triton interpreter, tiny shapes)

For fp8_block MoE GEMMs (1x128 activations, 128x128 expert weights; E experts of m rows each,
N x K weights) in the contiguous (``offsets``) and masked (``masked_m``) layouts, prints per call:

* graph: CUDA-graph replay time without the device check, with it (``validate=False``, the CUDA
  default), and the check kernel alone;
* eager: back-to-back eager calls (host overhead included) without the check, with it, and with
  ``validate=True`` (host read of offsets / masked_m: one sync per call).

"Without the check" replaces ``blockscaled.ops.grouped._device_check`` by a no-op for the
measurement (the only way to turn the device check off; the public API always checks unless
validate=True). Times are medians over repeated timing windows; percentages are relative to
the unchecked call. docs/errors.md describes the check.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import blockscaled as bs  # noqa: E402
from blockscaled.ops import errors as _errors  # noqa: E402
from blockscaled.ops import grouped as _grouped  # noqa: E402


@contextlib.contextmanager
def device_check(enabled: bool):
    """Run the grouped ops with (True) or without (False) the device-side metadata check."""
    saved = _grouped._device_check
    if not enabled:
        _grouped._device_check = lambda *args, **kwargs: None
    try:
        yield
    finally:
        _grouped._device_check = saved


def make_inputs(e: int, m: int, n: int, k: int, dev: str, masked: bool):
    """fp8_block activations ([E*m, K] or [E, m, K]), weights [E, N, K] quantized one expert at a
    time (bounded temporary memory), and offsets / masked_m."""
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(e * m, k, generator=g).to(dev, torch.bfloat16)
    if masked:
        x = x.view(e, m, k)
    a = bs.quantize(x, "fp8_block")
    parts = [bs.quantize((torch.randn(n, k, generator=g) * 0.02).to(dev, torch.bfloat16), "fp8_block",
                         block=(128, 128)) for _ in range(e)]
    data = torch.stack([p.data for p in parts])
    scale = torch.stack([p.scale for p in parts])
    b = bs.ScaledTensor(data, scale, parts[0].format, torch.Size((e, n, k)), parts[0].block, parts[0].rounding)
    del parts
    if masked:
        meta = {"masked_m": torch.full((e,), m, dtype=torch.int32, device=dev), "expected_m": m}
    else:
        meta = {"offsets": torch.arange(0, (e + 1) * m, m, dtype=torch.int32, device=dev)}
    return a, b, meta


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def time_eager(fn, dev: str, iters: int, reps: int = 5) -> float:
    """Median over ``reps`` windows of ``iters`` back-to-back calls: microseconds per call."""
    fn()
    _sync(dev)
    res = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        _sync(dev)
        res.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(res)


def time_graph(fn, iters: int, reps: int = 5) -> float:
    """Median replay time per call (us) of a CUDA graph holding ``iters`` calls of ``fn``."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # warm-up outside the capture (compiles, creates the flag buffer)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    res = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        res.append(start.elapsed_time(end) * 1e3 / iters)
    return statistics.median(res)


def measure(op: str, e: int, m: int, n: int, k: int, masked: bool, dev: str, iters: int) -> dict:
    a, b, meta = make_inputs(e, m, n, k, dev, masked)
    if op == "swiglu":
        meta.pop("expected_m", None)

        def call(validate):
            return bs.swiglu(a, b, b, validate=validate, **meta)
    else:
        def call(validate):
            return bs.grouped_gemm(a, b, validate=validate, **meta)

    out = call(False)
    seg = meta.get("masked_m", meta.get("offsets"))
    limit = a.shape[1] if masked else a.shape[0]
    check_op = _errors.OP_SWIGLU if op == "swiglu" else _errors.OP_GROUPED_GEMM
    mode = _errors.MODE_MASKED if masked else _errors.MODE_CONTIGUOUS
    row = {"op": op, "layout": "masked" if masked else "contiguous", "E": e, "m": m, "N": n, "K": k}
    if dev == "cuda":
        with device_check(False):
            row["graph_base"] = time_graph(lambda: call(False), iters)
        with device_check(True):
            row["graph_check"] = time_graph(lambda: call(False), iters)
        row["graph_kernel"] = time_graph(lambda: _errors.check_metadata(seg, out, check_op, mode, limit), iters)
    with device_check(False):
        row["eager_base"] = time_eager(lambda: call(False), dev, iters)
    with device_check(True):
        row["eager_check"] = time_eager(lambda: call(False), dev, iters)
    row["eager_validate"] = time_eager(lambda: call(True), dev, iters)
    bs.check_errors()  # valid metadata throughout: must be quiet
    return row


def _pct(x: float, base: float) -> str:
    return f"{(x / base - 1) * 100:+.1f}%"


def print_table(rows: list[dict]) -> None:
    head = (f"{'op':<12} {'layout':<10} {'E':>4} {'m':>5} {'N':>6} {'K':>6} | {'graph':>9} {'+check':>9} {'':>7} "
            f"{'kernel':>7} | {'eager':>9} {'+check':>9} {'':>7} {'valid=T':>9} {'':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        g = "" if "graph_base" not in r else (f"{r['graph_base']:9.1f} {r['graph_check']:9.1f} "
                                              f"{_pct(r['graph_check'], r['graph_base']):>7} {r['graph_kernel']:7.2f}")
        if not g:
            g = f"{'-':>9} {'-':>9} {'':>7} {'-':>7}"
        print(f"{r['op']:<12} {r['layout']:<10} {r['E']:>4} {r['m']:>5} {r['N']:>6} {r['K']:>6} | {g} | "
              f"{r['eager_base']:9.1f} {r['eager_check']:9.1f} {_pct(r['eager_check'], r['eager_base']):>7} "
              f"{r['eager_validate']:9.1f} {_pct(r['eager_validate'], r['eager_base']):>7}")
    print("times in us per call (medians); graph = CUDA-graph replay; eager includes host time; "
          "valid=T = validate=True (host read, one sync per call)")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="8:64,8:128,32:64", help="E:m pairs (experts : rows per expert)")
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--k", type=int, default=7168)
    p.add_argument("--swiglu", action="store_true", help="also time the fused SwiGLU (b_gate = b_up)")
    p.add_argument("--iters", type=int, default=50, help="calls per timing window / per captured graph")
    p.add_argument("--smoke", action="store_true", help="tiny shapes in the CPU interpreter (plumbing only)")
    args = p.parse_args(argv)
    if args.smoke:
        dev, shapes, n, k, iters = "cpu", [(2, 3)], 16, 128, 2
    else:
        if not torch.cuda.is_available():
            sys.exit("validate_cost.py: needs a CUDA GPU (use --smoke for the CPU plumbing check)")
        dev, n, k, iters = "cuda", args.n, args.k, args.iters
        try:
            shapes = [tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")]
        except ValueError:
            sys.exit(f"--shapes: expected comma-separated E:m pairs, got {args.shapes!r}")
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    bs.check_errors()
    ops = ["grouped_gemm"] + (["swiglu"] if args.swiglu else [])
    rows = []
    for op in ops:
        for e, m in shapes:
            for masked in (False, True):
                rows.append(measure(op, e, m, n, k, masked, dev, iters))
                if dev == "cuda":
                    torch.cuda.empty_cache()
    print_table(rows)


if __name__ == "__main__":
    main()
