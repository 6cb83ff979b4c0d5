"""MX / NV decode sweep: the CUDA-core GEMV (kernels/triton/mx_gemv.py) vs the previous plan and cuBLAS.

    python scripts/sweeps/mx_decode.py --json mx_decode.json          # ~4 min on an H100 (default grid)
    python scripts/sweeps/mx_decode.py --quick --json mx_quick.json   # ~1.5 min
    python scripts/sweeps/mx_decode.py --list [--quick]               # what would run (CPU: plans for an H100)
    python scripts/sweeps/mx_decode.py --smoke                        # CPU, interpreter: the code path only

Cases: N x K in {2880x2880, 5760x2880, 8192x8192, 28672x8192, 4096x14336, 5120x17920, 6144x4096},
M in {1, 2, 4, 8, 16}, formats mxfp8 / mxfp4 / nvfp4, weight-only (bf16 activations, ``wo``) and
W x A (activations quantized in the weight's format beforehand, ``wxa``). Variants per case:
  plan       ``bs.gemm(a, w)``: the planner (the GEMV at M <= plan.mx_gemv.MX_GEMV_MAX_M)
  portable   the previous plan, forced: ``config=`` choose_portable's GemmConfig (plan/portable.py)
  gemv       M above the GEMV threshold: the GEMV forced with plan.mx_gemv.mx_gemv_config's tiles
  grid       on the grid rows (--grid-shapes x --grid-ms): the GEMV with block_n, warps, the chunk or
             block_m varied, one at a time, around the planner's tiles (``g<block_m>x<block_n>/<block_k>/w<warps>``)
  bf16       cuBLAS bf16 on the pre-dequantized weight (``torch.matmul(x, W.T)``), once per shape and M
Every variant's first output (NaN-poisoned) is checked against the float64 reference
(``testing.tolerances.assert_gemm_close``; a failure is reported in the row, the sweep goes on).
Timing: ``blockscaled.bench.timing.time_op`` (CUDA-graph replays, input copies rotated past 2x L2),
``--rounds`` interleaved rounds, median over the rounds. Printed per case: us, % of the memory
floor (weights + scales + activations + output bytes at the copy bandwidth measured at the start,
256 MiB copies), speed-up of the plan vs bf16 and vs the portable kernel, the best grid tiles.
Last, the eager host cost: per-call wall time of ``bs.gemm`` / ``bs.linear`` at M = 1 on one shape.

Kernels are compiled first, in parallel (``--jobs`` worker processes run every case x variant once
into the shared Triton cache), so the timed phase only loads them. ``--budget-s`` stops starting new
cases past that many seconds (the rest are listed as skipped). ``--smoke`` runs one tiny shape per
mode through Triton's interpreter on the CPU with a wall-clock timer (tests/test_scripts.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

SHAPES = ((2880, 2880), (5760, 2880), (8192, 8192), (28672, 8192), (4096, 14336), (5120, 17920), (6144, 4096))
MS = (1, 2, 4, 8, 16)
FORMATS = ("mxfp8", "mxfp4", "nvfp4")
MODES = ("wo", "wxa")
GRID_SHAPES = ((2880, 2880), (8192, 8192), (5120, 17920))
GRID_MS = (1, 2, 4, 8)
QUICK = {"shapes": ((2880, 2880), (8192, 8192), (28672, 8192)), "ms": (1, 4, 16), "grid_shapes": ((2880, 2880),
         (28672, 8192)), "grid_ms": (1,)}
#: the eager host-cost probe: (format, N, K) at M = 1
HOST_CASE = ("mxfp4", 2880, 2880)


@dataclasses.dataclass(frozen=True)
class Case:
    fmt: str
    mode: str  # "wo" (weight-only bf16 activations) or "wxa" (quantized activations)
    m: int
    n: int
    k: int

    def label(self) -> str:
        return f"{self.fmt:5s} {self.mode:3s} {self.n}x{self.k} M={self.m}"


def parse_shapes(text: str) -> tuple:
    """``"NxK,NxK"`` -> ((N, K), ...)."""
    out = []
    for s in filter(None, text.split(",")):
        parts = s.lower().split("x")
        if len(parts) != 2:
            raise SystemExit(f"expected NxK, got {s!r}")
        out.append((int(parts[0]), int(parts[1])))
    return tuple(out)


def _tag(cfg) -> str:
    return f"g{cfg.block_m}x{cfg.block_n}/{cfg.block_k}/w{cfg.num_warps}"


def grid_configs(base, quick: bool) -> list:
    """GEMV tiles around ``base`` (the planner's), one field at a time: block_n halved / doubled
    (1..8); half / twice the warps with one slice per thread (block_k follows); two slices per
    thread (a chunk twice as long); half the activation rows per program (block_m > 1: two
    programs per weight block with longer slices). ``quick``: the block_n pair only."""
    from blockscaled.config import GemmConfig
    from blockscaled.config.gemm import gemv_slice_elems

    eps = gemv_slice_elems(base.block_m)
    out = [dataclasses.replace(base, block_n=bn) for bn in (base.block_n // 2, base.block_n * 2) if 1 <= bn <= 8]
    if not quick:
        out += [dataclasses.replace(base, num_warps=w, block_k=32 * w * eps)
                for w in (base.num_warps // 2, base.num_warps * 2) if 1 <= w <= 8]
        out.append(dataclasses.replace(base, block_k=2 * base.block_k))
        if base.block_m > 1:  # half the activation rows per program (longer slices; weights re-read from L2)
            bm = base.block_m // 2
            out.append(dataclasses.replace(base, block_m=bm, block_k=32 * base.num_warps * gemv_slice_elems(bm)))
    seen, uniq = set(), []
    for c in out:
        if c not in seen and c != base:
            seen.add(c)
            uniq.append(GemmConfig(**dataclasses.asdict(c)))
    return uniq


def variants(case: Case, dev, grid: bool, quick: bool) -> list:
    """(label, config) per variant of ``case`` on DeviceInfo ``dev`` (config None: the plan)."""
    import torch

    from blockscaled.plan.mx_gemv import MX_GEMV_MAX_M, mx_gemv_config
    from blockscaled.plan.portable import choose_portable

    a_dtype = torch.bfloat16 if case.mode == "wo" else None
    out = [("plan", None)]
    port = choose_portable(case.fmt, case.m, case.n, case.k, dev, a_dtype, torch.bfloat16)
    out.append(("portable", port))
    gemv = mx_gemv_config(case.fmt, min(case.m, MX_GEMV_MAX_M), case.n, case.k, dev)
    if case.m > MX_GEMV_MAX_M:
        out.append(("gemv", gemv))
    if grid:
        out += [(_tag(c), c) for c in grid_configs(gemv, quick)]
    return out


def build_cases(args) -> list:
    return [Case(fmt, mode, m, n, k) for (n, k) in args.shapes for fmt in args.formats for mode in MODES
            for m in args.ms]


def is_grid(case: Case, args) -> bool:
    return (case.n, case.k) in args.grid_shapes and case.m in args.grid_ms


# ---------------------------------------------------------------------------------- GPU side
def make_weights(fmt: str, n: int, k: int, seeds, device):
    """Quantized weights (one per seed) of 0.05 * N(0, 1) bf16 [n, k]."""
    import torch

    import blockscaled as bs

    out = []
    for s in seeds:
        g = torch.Generator(device=device).manual_seed(1000 + s)
        w = (torch.randn(n, k, device=device, generator=g) * 0.05).to(torch.bfloat16)
        out.append(bs.quantize(w, fmt))
    return out


def make_acts(case: Case, seeds, device):
    """Activations (one per seed): bf16 [m, k] (``wo``) or quantized like the weight (``wxa``)."""
    import torch

    import blockscaled as bs

    out = []
    for s in seeds:
        g = torch.Generator(device=device).manual_seed(s)
        x = torch.randn(case.m, case.k, device=device, generator=g).to(torch.bfloat16)
        out.append(x if case.mode == "wo" else bs.quantize(x, case.fmt))
    return out


def nbytes(*ts) -> int:
    """Bytes of tensors / ScaledTensors (data, scales, global scale)."""
    total = 0
    for t in ts:
        for part in (getattr(t, "data", t), getattr(t, "scale", None), getattr(t, "global_scale", None)):
            if part is not None and hasattr(part, "element_size"):
                total += part.numel() * part.element_size()
    return total


def _warm(task) -> str:
    """Worker: run every config of one case once (compiles into the shared Triton cache)."""
    case, cfgs = task
    try:
        import torch

        import blockscaled as bs

        dev = torch.device("cuda")
        w = make_weights(case.fmt, case.n, case.k, [0], dev)[0]
        a = make_acts(case, [0], dev)[0]
        for cfg in cfgs:
            bs.gemm(a, w, config=cfg)
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # reported; the main process compiles (and reports) it again
        return f"{case.label()}: {type(e).__name__}: {str(e)[:200]}"


def warm_all(cases, plans, jobs: int) -> None:
    import concurrent.futures as cf
    import multiprocessing as mp

    tasks = [(c, [cfg for _, cfg in plans[c]]) for c in cases]
    t0 = time.time()
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as ex:
        errors = [e for e in ex.map(_warm, tasks) if e]
    print(f"compiled {sum(len(t[1]) for t in tasks)} case x variant runs in {time.time() - t0:.0f} s "
          f"({jobs} processes){'; warm-up errors: ' + '; '.join(errors[:3]) if errors else ''}", flush=True)


def run(args) -> dict:
    import torch

    import blockscaled as bs
    from blockscaled.bench.runner import measure_roofline
    from blockscaled.bench.timing import rotation_count, time_op
    from blockscaled.plan import device_info, observe_plans
    from blockscaled.reference import gemm as ref_gemm
    from blockscaled.testing.tolerances import assert_gemm_close

    t_start = time.time()
    dev = torch.device("cpu" if args.smoke else "cuda")
    info = device_info(dev)
    if args.smoke:  # the interpreter: nothing to measure, only the code path
        bw, name = 3.0e12, "cpu (interpreter smoke run)"
    else:
        bw, name = measure_roofline(iterations=10)["copy_gbps"] * 1e9, torch.cuda.get_device_name()
    print(f"{name}: copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    cases = build_cases(args)
    plans = {c: variants(c, info, is_grid(c, args), args.quick) for c in cases}
    if args.jobs > 1 and not args.smoke:
        warm_all(cases, plans, args.jobs)

    def timed(fn, sets) -> float:
        if args.smoke:
            t0 = time.perf_counter()
            fn(*sets[0])
            return (time.perf_counter() - t0) * 1e6
        return time_op(fn, sets, warmup=2, iterations=args.iterations).median_ms * 1e3

    def n_copies(b: int) -> int:
        return 1 if args.smoke else rotation_count(b)

    rows, skipped = [], []
    bf16_us: dict = {}
    for (n, k) in args.shapes:
        for fmt in args.formats:
            shape_cases = [c for c in cases if (c.n, c.k, c.fmt) == (n, k, fmt)]
            if time.time() - t_start > args.budget_s:
                skipped += [c.label() for c in shape_cases]
                continue
            w_one = make_weights(fmt, n, k, [0], dev)[0]
            n_sets = n_copies(nbytes(w_one))
            weights = [w_one] + make_weights(fmt, n, k, range(1, n_sets), dev)
            for case in shape_cases:
                if time.time() - t_start > args.budget_s:
                    skipped.append(case.label())
                    continue
                acts = make_acts(case, range(n_sets), dev)
                sets = list(zip(acts, weights))
                ref = ref_gemm.gemm(acts[0], weights[0])
                row = {"fmt": fmt, "mode": case.mode, "m": case.m, "n": n, "k": k, "variants": {}}
                floor_us = (nbytes(acts[0], weights[0]) + case.m * n * 2) / bw * 1e6
                row["floor_us"] = floor_us
                fns = {}
                for label, cfg in plans[case]:
                    fn = (lambda a, w, c=cfg: bs.gemm(a, w, config=c))
                    out = torch.full((case.m, n), float("nan"), device=dev, dtype=torch.bfloat16)
                    v = {"config": None if cfg is None else dataclasses.asdict(cfg)}
                    try:
                        with observe_plans() as seen:
                            bs.gemm(acts[0], weights[0], out=out, config=cfg)
                        if not args.smoke:
                            torch.cuda.synchronize()
                        v["ran"] = seen[-1].describe() if seen else "?"
                        v["rel_fro"], v["norm_max"] = assert_gemm_close(out, ref, fmt, torch.bfloat16, what=label)
                        fns[label] = fn
                    except Exception as e:
                        v["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                        print(f"  FAILED {case.label()} {label}: {v['error']}", flush=True)
                    row["variants"][label] = v
                del ref
                us = {label: [] for label in fns}
                for r in range(args.rounds):
                    for label in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                        us[label].append(timed(fns[label], sets))
                for label in fns:
                    row["variants"][label]["us"] = statistics.median(us[label])
                    row["variants"][label]["us_rounds"] = us[label]
                key = (case.m, n, k)
                if key not in bf16_us:  # cuBLAS bf16 on the dequantized weight: once per shape and M
                    wd = [bs.dequantize(w, torch.bfloat16) for w in weights[:n_copies(n * k * 2)]]
                    xs = [torch.randn(case.m, k, device=dev).to(torch.bfloat16) for _ in wd]
                    y = torch.matmul(xs[0], wd[0].t())
                    bf16_ok = ""
                    try:
                        assert_gemm_close(y, ref_gemm.gemm(xs[0], weights[0]), fmt, torch.bfloat16, what="bf16")
                    except AssertionError as e:
                        bf16_ok = str(e)[:200]
                    bf16_us[key] = (statistics.median(timed(lambda x, wt: torch.matmul(x, wt.t()), list(zip(xs, wd)))
                                                      for _ in range(args.rounds)), bf16_ok)
                    del wd, xs
                row["bf16_us"], row["bf16_error"] = bf16_us[key]
                rows.append(row)
                print_row(case, row, flush=True)
            del weights
            if not args.smoke:
                torch.cuda.empty_cache()
    host = host_cost(args, dev) if time.time() - t_start <= args.budget_s + 30 else {}
    return {"device": name, "copy_gbps": bw / 1e9, "rows": rows, "skipped": skipped, "host": host,
            "seconds": time.time() - t_start}


def print_row(case: Case, row: dict, flush=True) -> None:
    v = row["variants"]
    fl = row["floor_us"]

    def cell(label):
        x = v.get(label, {})
        if "us" not in x:
            return f"{label} {'FAIL' if 'error' in x else '-'}"
        return f"{x['us']:8.1f} us {100 * fl / x['us']:4.0f}%"

    plan = v["plan"]
    p_us = plan.get("us")
    grid = {lab: x["us"] for lab, x in v.items() if lab.startswith("g") and "us" in x}
    if "gemv" in v and "us" in v["gemv"]:
        grid["gemv"] = v["gemv"]["us"]
    best = min(grid.items(), key=lambda t: t[1]) if grid else None
    speed = ""
    if p_us:
        speed = f" x{row['bf16_us'] / p_us:4.2f} vs bf16"
        if "us" in v.get("portable", {}):
            speed += f" x{v['portable']['us'] / p_us:5.2f} vs portable"
    extra = f" | best gemv {best[0]} {best[1]:.1f} us ({100 * fl / best[1]:.0f}%)" if best else ""
    print(f"{case.label():30s} plan {cell('plan')} [{plan.get('ran', '?')}] | portable {cell('portable')} | "
          f"bf16 {row['bf16_us']:8.1f} us{speed}{extra}", flush=flush)


def host_cost(args, dev) -> dict:
    """Eager per-call wall time at M = 1 (no graph): the host cost the GPU idles on."""
    import torch

    import blockscaled as bs

    fmt, n, k = HOST_CASE if not args.smoke else (args.formats[0], *args.shapes[0])
    calls_n = 3 if args.smoke else 200

    def sync():
        if not args.smoke:
            torch.cuda.synchronize()

    w = make_weights(fmt, n, k, [0], dev)[0]
    x = torch.randn(1, k, device=dev).to(torch.bfloat16)
    a = bs.quantize(x, fmt)
    calls = {"bs.gemm(x_bf16, w)": lambda: bs.gemm(x, w), "bs.gemm(a_q, w)": lambda: bs.gemm(a, w),
             "bs.linear(x, w, weight_only=True)": lambda: bs.linear(x, w, weight_only=True),
             "bs.linear(x, w)": lambda: bs.linear(x, w)}
    out = {}
    print(f"eager host cost, {fmt} {n}x{k} M=1 (wall time per call, {calls_n} calls, synchronized at the end):")
    for name, fn in calls.items():
        for _ in range(min(20, calls_n)):
            fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(calls_n):
            fn()
        sync()
        out[name] = (time.perf_counter() - t0) / calls_n * 1e6
        print(f"  {name:36s} {out[name]:7.1f} us/call", flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="3 shapes, M in {1, 4, 16}, a 2-tile grid at M = 1")
    p.add_argument("--shapes", default=None, help="NxK,... (default: the seven issue shapes)")
    p.add_argument("--ms", default=None, help="comma list of M (default 1,2,4,8,16)")
    p.add_argument("--grid-shapes", default=None, help="NxK,... that also time the GEMV tile grid")
    p.add_argument("--grid-ms", default=None, help="comma list of M that time the grid (default 1,2,4,8)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 2; --quick 1)")
    p.add_argument("--iterations", type=int, default=10, help="graph replays timed per round and variant")
    p.add_argument("--jobs", type=int, default=min(14, os.cpu_count() or 1), help="compile worker processes")
    p.add_argument("--budget-s", type=float, default=270.0, help="start no new case after this many seconds")
    p.add_argument("--formats", default=",".join(FORMATS), help="comma list (default mxfp8,mxfp4,nvfp4)")
    p.add_argument("--list", action="store_true", help="print the cases and variants and exit (CPU: an H100)")
    p.add_argument("--smoke", action="store_true", help="CPU: one tiny shape, Triton's interpreter, wall clock")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    q = QUICK if args.quick else {}
    args.shapes = parse_shapes(args.shapes) if args.shapes else q.get("shapes", SHAPES)
    args.ms = tuple(int(m) for m in args.ms.split(",")) if args.ms else q.get("ms", MS)
    args.grid_shapes = parse_shapes(args.grid_shapes) if args.grid_shapes else q.get("grid_shapes", GRID_SHAPES)
    args.grid_ms = tuple(int(m) for m in args.grid_ms.split(",")) if args.grid_ms else q.get("grid_ms", GRID_MS)
    args.rounds = args.rounds or (1 if args.quick or args.smoke else 2)
    args.formats = tuple(f for f in args.formats.split(",") if f)
    if args.smoke:
        # before blockscaled is imported: the kernels run in Triton's interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")
        args.shapes = args.shapes if args.shapes != SHAPES else ((24, 96),)
        args.ms = args.ms if args.ms != MS else (1,)
        args.formats = args.formats if args.formats != FORMATS else ("mxfp4",)
        args.grid_shapes, args.grid_ms, args.quick = args.shapes, (1,), True

    import torch

    from blockscaled.plan import H100_SXM, Plan, device_info, plan_gemm
    from blockscaled.plan import Problem

    cuda = torch.cuda.is_available()
    if args.smoke:
        res = run(args)
        print(f"smoke run done: {len(res['rows'])} cases, "
              f"{sum('error' in v for r in res['rows'] for v in r['variants'].values())} failed variants")
        return 0 if all("error" not in v for r in res["rows"] for v in r["variants"].values()) else 1
    if args.list or not cuda:
        info = device_info(torch.device("cuda")) if cuda else H100_SXM
        cases = build_cases(args)
        n_var = 0
        for c in cases:
            vs = variants(c, info, is_grid(c, args), args.quick)
            n_var += len(vs)
            prob = Problem("gemm", c.fmt, c.m, c.n, c.k, "bfloat16" if c.mode == "wo" else "quantized")
            print(f"{c.label()} ({info.name or info.kind}):")
            for label, cfg in vs:
                d = plan_gemm(prob, info).describe() if cfg is None else Plan("gemm", "cuda", cfg).describe()
                print(f"  {label:24s} {d}")
        print(f"{len(cases)} cases, {n_var} case x variant runs (+ cuBLAS bf16 per shape and M)")
        if not cuda and not args.list:
            print("mx_decode.py: no CUDA device; the cases above are resolved for an H100, nothing was timed",
                  file=sys.stderr)
            return 2
        return 0
    res = run(args)
    if res["skipped"]:
        print(f"budget {args.budget_s:.0f} s reached: {len(res['skipped'])} cases skipped")
    print(f"done in {res['seconds']:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
