#!/usr/bin/env python
"""Compile time of the DeepSeek-V3 fp8_block serving path: cold start and warm (cached) start.

Targets (docs/design.md, "The bar"): cold start for all DeepSeek-V3 shapes under 60 s, warm
(cached) under 2 s.

What is measured. Each measurement is a NEW Python process (spawned by this script) that
imports torch, creates the CUDA context, imports triton and blockscaled, builds inputs, then
makes the first ``blockscaled.linear(x, w)`` call (activation quantize 1x128 + GEMM;
the planner picks the kernels, so several distinct kernels compile) for every DeepSeek-V3
dense shape N x K in {2112x7168, 24576x1536, 32768x512, 7168x16384, 4096x7168, 7168x2048} at
every M in {1, 16, 64, 128, 4096} (30 calls), each followed by ``torch.cuda.synchronize()``;
then the same 30 calls again (steady state, for comparison).

* cold: ``TRITON_CACHE_DIR`` = a fresh empty temporary directory (kernels AND their C launcher
  stubs are built; Gluon/Hopper and Triton kernels share that cache).
* warm: a second fresh process with the cache the cold run filled.

The verdict quantity ("library start") = import triton + import blockscaled + the 30 first
calls (compile or cache load, launcher build/load, the run itself). It EXCLUDES the Python
interpreter start, ``import torch``, CUDA context creation and building the random inputs:
those are reported separately (a serving engine pays them anyway), as is the whole process's
wall-clock time (spawn to exit). New ``*.cubin`` files in the cache after each call show which
calls compiled kernels.

With ``--warmup`` each process first runs ``bs.warmup`` over the dense weights and one routed-experts
module of DeepSeek-V3's size (256 experts, 7168 -> 2048, top-8; random fp8_block weights) for
1..4096 tokens, then the same first calls plus the experts' first forwards: the warm-up's own cold
/ warm start (issue 20), and whether anything was left for the calls to compile.

    python scripts/sweeps/compile_time.py --out $OUT/compile_time.json   # ~1-2 min on an H100
    python scripts/sweeps/compile_time.py --warmup --cold-timeout 500   # the warm-up of a DeepSeek-V3 layer set
    python scripts/sweeps/compile_time.py --smoke                        # CPU interpreter plumbing check

Exit status: 0 both targets met, 1 a target missed or a run failed, 2 no CUDA device.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

DSV3_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
MS = [1, 16, 64, 128, 4096]
COLD_TARGET_S = 60.0
WARM_TARGET_S = 2.0
#: --smoke: tiny shapes for the CPU interpreter (checks this script, measures nothing)
SMOKE_NK = [(128, 256)]
SMOKE_MS = [1, 3]
#: --warmup: DeepSeek-V3's routed experts (E, I, H, top-k), one MoE layer's worth (11.3 GB fp8)
DSV3_EXPERTS = (256, 2048, 7168, 8)
SMOKE_EXPERTS = (4, 128, 256, 2)


def _cache_count(d: str) -> tuple[int, int]:
    """(cubin files, shared objects) under a Triton cache dir (<dir>/<hash>/<files>)."""
    cubins = sos = 0
    try:
        for e in os.scandir(d):
            if e.is_dir():
                for f in os.scandir(e.path):
                    cubins += f.name.endswith(".cubin")
                    sos += f.name.endswith(".so")
    except FileNotFoundError:
        pass
    return cubins, sos


# ---------------------------------------------------------------------------------- child
def child(args) -> int:
    t_start = time.time()
    t_spawn = float(os.environ.get("BS_COMPILE_TIME_T0", t_start))
    res = {"label": args.label, "pid": os.getpid(), "cache_dir": os.environ.get("TRITON_CACHE_DIR"),
           "phases": {"interpreter_start": t_start - t_spawn}}
    ph = res["phases"]

    def done(code: int) -> int:
        with open(args.result, "w") as f:
            json.dump(res, f, indent=1)
        return code

    t = time.perf_counter()
    import torch

    ph["import_torch"] = time.perf_counter() - t
    dev = torch.device("cpu" if args.smoke else "cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        res["error"] = "no CUDA device (torch.cuda.is_available() is False)"
        return done(2)
    t = time.perf_counter()
    if dev.type == "cuda":
        torch.cuda.init()
        torch.empty(1, device=dev)
        torch.cuda.synchronize()
        res["device"] = torch.cuda.get_device_name(dev)
    else:
        res["device"] = "cpu (Triton interpreter)"
    ph["cuda_context"] = time.perf_counter() - t

    t = time.perf_counter()
    import triton

    ph["import_triton"] = time.perf_counter() - t
    t = time.perf_counter()
    import blockscaled  # the package import: defines every kernel
    from blockscaled import ScaledTensor, ScaleRounding, get_format, linear

    ph["import_blockscaled"] = time.perf_counter() - t
    res["versions"] = {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0]}

    # inputs (excluded from the verdict): random e4m3 weights + fp32 128x128 scales, bf16 acts
    t = time.perf_counter()
    nk = SMOKE_NK if args.smoke else DSV3_NK
    ms = SMOKE_MS if args.smoke else MS
    fmt = get_format("fp8_block")
    g = torch.Generator(device=dev).manual_seed(0)
    weights, acts = {}, {}
    for n, k in nk:
        data = torch.randn(n, k, device=dev, generator=g).mul_(0.5).to(torch.float8_e4m3fn)
        scale = torch.rand(-(-n // 128), -(-k // 128), device=dev, generator=g).mul_(1e-3).add_(1e-4)
        weights[(n, k)] = ScaledTensor(data, scale, fmt, torch.Size((n, k)), (128, 128), ScaleRounding.EXACT)
        for m in ms:
            acts[(m, k)] = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    ph["setup_inputs"] = time.perf_counter() - t

    experts = None
    if args.warmup:  # one routed-experts module of DeepSeek-V3's size, random fp8_block weights
        t = time.perf_counter()
        e, i, h, top_k = SMOKE_EXPERTS if args.smoke else DSV3_EXPERTS

        def w3(n, k):
            data = torch.randn(e, n, k, device=dev, generator=g).mul_(0.5).to(torch.float8_e4m3fn)
            scale = torch.rand(e, -(-n // 128), -(-k // 128), device=dev, generator=g).mul_(1e-3).add_(1e-4)
            return ScaledTensor(data, scale, fmt, torch.Size((e, n, k)), (128, 128), ScaleRounding.EXACT)

        experts = blockscaled.nn.Experts(w3(i, h), w3(i, h), w3(h, i))
        layers = torch.nn.ModuleList([blockscaled.nn.Linear.from_scaled(w) for w in weights.values()] + [experts])
        if dev.type == "cuda":
            torch.cuda.synchronize()
        ph["setup_inputs"] += time.perf_counter() - t
        t = time.perf_counter()
        res["warmup_report"] = str(blockscaled.warmup(layers, max_tokens=max(ms), top_k=top_k, progress=False))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        ph["warmup"] = time.perf_counter() - t

    cache = os.environ.get("TRITON_CACHE_DIR", "")
    calls = []
    t_first = time.perf_counter()
    for n, k in nk:
        for m in ms:
            c0 = _cache_count(cache)
            t = time.perf_counter()
            y = linear(acts[(m, k)], weights[(n, k)])
            if dev.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t
            c1 = _cache_count(cache)
            calls.append({"n": n, "k": k, "m": m, "first_s": dt, "new_cubins": c1[0] - c0[0],
                          "new_launchers": c1[1] - c0[1], "finite": bool(torch.isfinite(y).all())})
    if experts is not None:  # after warm-up: the experts' first forwards (routing random, top-k distinct)
        res["experts_calls"] = []
        for m in ms:
            x = torch.randn(m, experts.hidden, device=dev, generator=g).to(torch.bfloat16)
            idx = torch.rand(m, experts.num_experts, device=dev, generator=g).topk(top_k, dim=1).indices
            wts = torch.full((m, top_k), 1.0 / top_k, device=dev)
            c0 = _cache_count(cache)
            t = time.perf_counter()
            experts(x, idx, wts)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            res["experts_calls"].append({"m": m, "first_s": time.perf_counter() - t,
                                         "new_cubins": _cache_count(cache)[0] - c0[0]})
    ph["first_calls"] = time.perf_counter() - t_first
    t = time.perf_counter()
    for c in calls:
        t1 = time.perf_counter()
        linear(acts[(c["m"], c["k"])], weights[(c["n"], c["k"])])
        if dev.type == "cuda":
            torch.cuda.synchronize()
        c["steady_s"] = time.perf_counter() - t1
    ph["steady_calls"] = time.perf_counter() - t
    for c in calls:
        c["config"] = blockscaled.explain("linear", acts[(c["m"], c["k"])], weights[(c["n"], c["k"])]).describe()
    res["calls"] = calls
    res["library_s"] = ph["import_triton"] + ph["import_blockscaled"] + ph.get("warmup", 0.0) + ph["first_calls"]
    res["cache_after"] = dict(zip(("cubins", "launchers"), _cache_count(cache)))
    return done(0)


# ---------------------------------------------------------------------------------- parent
def run_child(label: str, cache: str, timeout: float, smoke: bool, log_dir: str, warmup: bool = False) -> dict:
    fd, result = tempfile.mkstemp(prefix=f"ct_{label}_", suffix=".json")
    os.close(fd)
    env = dict(os.environ)
    env["TRITON_CACHE_DIR"] = cache
    if smoke:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--label", label, "--result", result]
    if smoke:
        cmd.append("--smoke")
    if warmup:
        cmd.append("--warmup")
    log = os.path.join(log_dir, f"{label}.log")
    t0 = time.time()
    env["BS_COMPILE_TIME_T0"] = repr(t0)
    w0 = time.perf_counter()
    with open(log, "w") as lf:
        try:
            rc = subprocess.run(cmd, env=env, stdout=lf, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.perf_counter() - w0
    try:
        with open(result) as f:
            res = json.load(f)
    except (OSError, ValueError):
        res = {"label": label}
    finally:
        os.unlink(result)
    res["process_wall_s"] = wall
    res["rc"] = rc
    if rc != 0 and "error" not in res:
        with open(log, errors="replace") as f:
            tail = f.read()[-3000:]
        res["error"] = f"child exit {rc}; log tail:\n{tail}"
    return res


def _fmt_s(v) -> str:
    return "-" if v is None else f"{v:8.3f}"


def report(runs: list[dict]) -> tuple[str, bool]:
    ok_all = True
    out = []
    ok_runs = [r for r in runs if "calls" in r]
    if ok_runs:
        out.append("per call (seconds): first call in each process; steady = second call in the cold process")
        hdr = f"{'N':>6} {'K':>6} {'M':>5}  {'kernel (plan)':52s}" + "".join(
            f" {r['label'] + ' 1st':>10} {'+cubin':>6}" for r in ok_runs) + f" {'steady':>9}"
        out.append(hdr)
        for i, c in enumerate(ok_runs[0]["calls"]):
            row = f"{c['n']:6d} {c['k']:6d} {c['m']:5d}  {c['config'][:52]:52s}"
            for r in ok_runs:
                rc = r["calls"][i]
                row += f" {rc['first_s']:10.3f} {rc['new_cubins']:6d}"
            row += f" {c['steady_s']:9.4f}"
            out.append(row)
        out.append("")
    names = ["interpreter_start", "import_torch", "cuda_context", "import_triton", "import_blockscaled",
             "setup_inputs", "warmup", "first_calls", "steady_calls"]
    out.append(f"{'phase (s)':24s}" + "".join(f" {r['label']:>9s}" for r in runs))
    for nm in names:
        out.append(f"{nm:24s}" + "".join(f" {_fmt_s(r.get('phases', {}).get(nm)):>9s}" for r in runs))
    out.append(f"{'library start (verdict)':24s}" + "".join(f" {_fmt_s(r.get('library_s')):>9s}" for r in runs))
    out.append(f"{'process wall (spawn-exit)':24s}" + "".join(f" {_fmt_s(r.get('process_wall_s')):>9s}" for r in runs))
    out.append(f"{'cubins in cache after':24s}" + "".join(
        f" {str(r.get('cache_after', {}).get('cubins', '-')):>9s}" for r in runs))
    out.append("")
    for r in ok_runs:
        if "experts_calls" in r:  # --warmup: what the calls after it still compiled
            new = sum(c["new_cubins"] for c in r["calls"]) + sum(c["new_cubins"] for c in r["experts_calls"])
            firsts = ", ".join(f"M={c['m']} {c['first_s']:.3f} s" for c in r["experts_calls"])
            out.append(f"{r['label']}: after bs.warmup the first calls built {new} new cubins (0: warm-up complete); "
                       f"experts' first forwards: {firsts}")
    out.append("library start = import triton + import blockscaled (+ bs.warmup with --warmup) + the first linear() call of all "
               f"{len(ok_runs[0]['calls']) if ok_runs else '?'} (shape, M) pairs, each synchronised; excludes "
               "interpreter start, import torch, CUDA context and input setup (listed above).")
    for r in runs:
        if "error" in r:
            ok_all = False
            out.append(f"{r['label']}: ERROR {r['error']}")
            continue
        bad = [c for c in r["calls"] if not c["finite"]]
        if bad:
            out.append(f"{r['label']}: WARNING {len(bad)} outputs with non-finite values (random inputs; not a "
                       f"correctness check)")
        target = COLD_TARGET_S if r["label"] == "cold" else WARM_TARGET_S
        ok = r["library_s"] < target
        ok_all &= ok
        out.append(f"{r['label']:5s}: {'PASS' if ok else 'MISS'} library start {r['library_s']:.2f} s "
                   f"(target < {target:.0f} s); whole process {r['process_wall_s']:.2f} s incl. import torch "
                   f"{r['phases']['import_torch']:.2f} s and CUDA context {r['phases']['cuda_context']:.2f} s")
    return "\n".join(out), ok_all


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="JSON output file (a directory: compile_time.json inside); "
                   "default $OUT/compile_time.json when OUT is set")
    p.add_argument("--warm-runs", type=int, default=1, help="warm processes after the cold one (default 1)")
    p.add_argument("--cold-timeout", type=float, default=300.0, help="seconds for the cold process")
    p.add_argument("--warm-timeout", type=float, default=120.0, help="seconds for each warm process")
    p.add_argument("--keep-cache", action="store_true", help="do not delete the temporary Triton cache")
    p.add_argument("--smoke", action="store_true", help="CPU Triton interpreter, tiny shapes: checks this "
                   "script's plumbing only (nothing compiles; the numbers mean nothing)")
    p.add_argument("--warmup", action="store_true", help="bs.warmup first (the dense shapes plus one DeepSeek-V3 "
                   "routed-experts module, tokens 1..4096, top-8), then the first calls and the experts' first "
                   "forwards, which should compile nothing")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--label", default="cold", help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)

    out = args.out or (os.path.join(os.environ["OUT"], "compile_time.json") if os.environ.get("OUT") else None)
    if out and (os.path.isdir(out) or out.endswith(os.sep)):
        out = os.path.join(out, "compile_time.json")
    cache = tempfile.mkdtemp(prefix="bs_triton_cold_")
    logs = tempfile.mkdtemp(prefix="bs_compile_time_logs_")
    print(f"# compile_time: fresh TRITON_CACHE_DIR={cache}", flush=True)
    runs = []
    try:
        for i in range(1 + args.warm_runs):
            label = "cold" if i == 0 else ("warm" if args.warm_runs == 1 else f"warm{i}")
            r = run_child(label, cache, args.cold_timeout if i == 0 else args.warm_timeout, args.smoke, logs,
                          args.warmup)
            runs.append(r)
            msg = (f"library start {r['library_s']:.2f} s, process {r['process_wall_s']:.2f} s"
                   if "library_s" in r else r.get("error", "?").splitlines()[0])
            print(f"# {label}: {msg}", flush=True)
            if r.get("rc") == 2:
                print(r.get("error", ""), file=sys.stderr)
                return 2
            if "calls" not in r and i == 0:
                break  # no point in a warm run after a failed cold one
    finally:
        if not args.keep_cache:
            shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)
    text, ok = report(runs)
    print(text)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump({"targets_s": {"cold": COLD_TARGET_S, "warm": WARM_TARGET_S}, "pass": ok, "smoke": args.smoke,
                       "shapes_nk": SMOKE_NK if args.smoke else DSV3_NK, "ms": SMOKE_MS if args.smoke else MS,
                       "runs": runs}, f, indent=1)
        print(f"# wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
