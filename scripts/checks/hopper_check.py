"""Correctness of the sm_90a Hopper kernels on the model shapes (one command, H100; no timing:
``scripts/sweeps/ab.py`` times).

    python scripts/checks/hopper_check.py                     # ~2-4 min on an H100 (mostly compiles)
    python scripts/checks/hopper_check.py --quick --only dense -v
    python scripts/checks/hopper_check.py --list              # the checks, planned for an H100 (no GPU)

dense    ``blockscaled.gemm`` on the six DeepSeek-V3 (N, K) at M in {128, 4096} (``--m``) and odd
         shapes (M = 1, 40, 77, 300; N = 200, 384; K = 320): the plan, the planner's best Hopper
         config (``GemmConfig(strategy="hopper")``) and, for a wide one, the same with the masked
         epilogue; ``--candidates``: every Hopper candidate the planner ranks there instead
         (``plan.dense.fp8_candidates``: wide tiles, K splits, tail splits; skinny at M <= 64;
         ~200 checks, ~10 min). Hopper configs are forced through ``gemm(config=HopperConfig)``.
         Each output (NaN-poisoned first) against the float64 reference
         (``testing.tolerances.assert_gemm_close``), a second run bitwise equal (deterministic,
         split-K included), and the plan that ran must be the kernel asked for.
grouped  ``blockscaled.grouped_gemm`` (the planner's wide-kernel tiles) on contiguous experts with
         empty / single-row / skewed segments, N and K tails, E = 64, and masked counts 0, 1,
         max_m and partial tiles (rows past a count keep their poison); explicit 64x128 and
         128x256 tiles (``ops.grouped.launch`` of a Plan); a CUDA graph of the masked GEMM replayed
         with changed counts.
swiglu   ``blockscaled.swiglu(config=GemmConfig(strategy="hopper"))``: dense, contiguous, masked.

One line per check (ok / FAIL with the first line of the error); exit status 1 if any failed,
2 without an sm_90 GPU. ``--json`` writes the results.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import threading
import time
import traceback
from typing import Callable

DSV3_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
ODD = ((1, 2112, 7168), (77, 7168, 2048), (128, 200, 7168), (4096, 200, 1536), (77, 200, 320), (4096, 4096, 320),
       (1, 128, 128), (300, 384, 2048), (40, 384, 2048))
QUICK = ((4096, 4096, 7168), (128, 7168, 2048), (1, 2112, 7168), (77, 200, 320), (300, 384, 2048))


@dataclasses.dataclass
class Check:
    name: str
    group: str
    run: Callable  # run() -> detail; raises on failure
    what: str = ""  # what --list prints


# ---------------------------------------------------------------------------------- helpers
def _inputs(rows_shape, lead, n, k, seed, dev, count=1):
    """bf16 N(0,1) activations ``[*rows_shape, k]`` quantized 1x128, and ``count`` weights
    ``[*lead, n, k]`` (0.05 N(0,1)) quantized 128x128."""
    import torch

    import blockscaled as bs

    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(*rows_shape, k, device=dev, generator=g).to(torch.bfloat16)
    ws = [(torch.randn(*lead, n, k, device=dev, generator=g) * 0.05).to(torch.bfloat16) for _ in range(count)]
    return (bs.quantize(x, "fp8_block"), *(bs.quantize(w, "fp8_block", block=(128, 128)) for w in ws))


def _ran(plans, kernel: str, what: str) -> str:
    """The last plan that ran must use ``kernel``; returns its description."""
    kinds = [p.kernel for p in plans]
    if not kinds or kinds[-1] != kernel:
        raise AssertionError(f"{what}: expected the {kernel} kernel to run, the plans were "
                             f"{[p.describe() for p in plans]}")
    return plans[-1].describe()


def _nan(shape, dev):
    import torch

    return torch.full(shape, float("nan"), dtype=torch.bfloat16, device=dev)


def _rows_mask(counts, max_m):
    import torch

    return torch.arange(max_m, device=counts.device)[None, :] < counts[:, None]


def _check_masked(out, ref, counts, max_m, what):
    """Rows past a count keep their NaN poison; the computed rows match the reference."""
    import torch

    from blockscaled.testing.tolerances import assert_gemm_close

    rows = _rows_mask(counts, max_m)
    if not torch.isnan(out[~rows].float()).all():
        raise AssertionError(f"{what}: rows past masked_m were written")
    if rows.any():
        assert_gemm_close(out[rows], ref[rows], "fp8_block", torch.bfloat16, what=what)


# ---------------------------------------------------------------------------------- dense
def dense_shapes(quick: bool, ms: str | None):
    if quick:
        return list(QUICK)
    m_list = (128, 4096) if not ms else tuple(int(x) for x in ms.split(","))
    return [(m, n, k) for m in m_list for n, k in DSV3_NK] + list(ODD)


def dense_configs(m, n, k, dev_info, candidates: bool = False):
    """(label, config) of one dense shape: the plan, the planner's best Hopper config (or every
    Hopper candidate of the planner), and the best wide config with the masked epilogue."""
    import blockscaled as bs
    from blockscaled.config.hopper import HopperConfig
    from blockscaled.plan import Plan, Problem, plan_gemm
    from blockscaled.plan.dense import fp8_candidates

    p = Problem("gemm", "fp8_block", m, n, k, tma=k % 16 == 0)
    out = [("plan", None)]
    best = plan_gemm(p, dev_info, bs.GemmConfig(strategy="hopper")).config
    hop = [c for c in fp8_candidates(p, dev_info, gemv=False, portable=False, dequant=False)
           if isinstance(c, HopperConfig) and (candidates or c == best)]
    out += [(Plan("gemm", "cuda", c).describe(), c) for c in hop]
    if isinstance(best, HopperConfig) and best.variant == "wide" and best.epilogue != "masked":
        alt = dataclasses.replace(best, epilogue="masked")
        out.append((Plan("gemm", "cuda", alt).describe() + " masked epilogue", alt))
    return out


def dense_checks(args, dev_info) -> list[Check]:
    out = []
    for m, n, k in dense_shapes(args.quick, args.m):
        for label, cfg in dense_configs(m, n, k, dev_info, args.candidates):
            out.append(Check(f"dense {m}x{n}x{k} {label}", "dense", _dense_run(m, n, k, cfg, label),
                             "planner's choice" if cfg is None else repr(cfg)))
    return out


def _dense_run(m, n, k, cfg, label):
    def run():
        import torch

        import blockscaled as bs
        from blockscaled.plan import observe_plans
        from blockscaled.reference import gemm as ref_gemm
        from blockscaled.testing.tolerances import assert_gemm_close

        dev = torch.device("cuda")
        a, b = _inputs((m,), (), n, k, m * 7 + n * 3 + k, dev)
        ref = ref_gemm.gemm(a, b)
        out = _nan((m, n), dev)
        with observe_plans() as plans:
            bs.gemm(a, b, out=out, config=cfg)
        ran = plans[-1].describe() if cfg is None else _ran(plans, "hopper_" + cfg.variant, label)
        rel, nmax = assert_gemm_close(out, ref, "fp8_block", torch.bfloat16, what=f"{m}x{n}x{k} {label}")
        again = bs.gemm(a, b, config=cfg)
        if not torch.equal(again, out):
            raise AssertionError(f"{m}x{n}x{k} {label}: a second run is not bitwise equal to the first")
        return f"rel_fro={rel:.1e} norm_max={nmax:.1e} [{ran}]"

    return run


# ---------------------------------------------------------------------------------- grouped
def grouped_checks(args, dev_info) -> list[Check]:
    from blockscaled.config.hopper import HopperConfig
    from blockscaled.plan.grouped import grouped_hopper_config

    def contiguous(sizes, n, k, cfg=None, seed=0):
        def run():
            import torch

            import blockscaled as bs
            from blockscaled.ops.grouped import MODE_CONTIGUOUS, launch
            from blockscaled.plan import Plan, observe_plans
            from blockscaled.reference import grouped as ref
            from blockscaled.testing.tolerances import assert_gemm_close

            dev = torch.device("cuda")
            offs = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32, device=dev)
            a, b = _inputs((sum(sizes),), (len(sizes),), n, k, seed, dev)
            out = _nan((sum(sizes), n), dev)
            with observe_plans() as plans:
                if cfg is None:
                    bs.grouped_gemm(a, b, offsets=offs, out=out)
                else:  # explicit tiles: the public op takes only a GemmConfig
                    launch(a, b, None, None, offs, out, torch.bfloat16, MODE_CONTIGUOUS, Plan("grouped", "cuda", cfg))
            ran = _ran(plans, "hopper_wide", "contiguous")
            rel, _ = assert_gemm_close(out, ref.grouped_gemm(a, b, offsets=offs), "fp8_block", torch.bfloat16,
                                       what=f"contiguous {sizes} N={n} K={k}")
            return f"rel_fro={rel:.1e} [{ran}]"

        return run

    def masked(counts, max_m, n, k, cfg=None, seed=1):
        def run():
            import torch

            import blockscaled as bs
            from blockscaled.ops.grouped import MODE_MASKED, launch
            from blockscaled.plan import Plan, observe_plans
            from blockscaled.reference import grouped as ref

            dev = torch.device("cuda")
            e = len(counts)
            cnt = torch.tensor(counts, dtype=torch.int32, device=dev)
            a, b = _inputs((e, max_m), (e,), n, k, seed, dev)
            out = _nan((e, max_m, n), dev)
            with observe_plans() as plans:
                if cfg is None:
                    bs.grouped_gemm(a, b, masked_m=cnt, out=out)
                else:
                    launch(a, b, None, None, cnt, out, torch.bfloat16, MODE_MASKED, Plan("grouped", "cuda", cfg))
            ran = _ran(plans, "hopper_wide", "masked")
            _check_masked(out, ref.grouped_gemm(a, b, masked_m=cnt), cnt, max_m, f"masked {counts} N={n} K={k}")
            return f"[{ran}]"

        return run

    def graph():
        import torch

        import blockscaled as bs
        from blockscaled.reference import grouped as ref

        dev = torch.device("cuda")
        e, max_m, n, k = 4, 192, 512, 1024
        a, b = _inputs((e, max_m), (e,), n, k, 7, dev)
        cnt = torch.tensor([5, 0, 192, 70], dtype=torch.int32, device=dev)
        out = _nan((e, max_m, n), dev)
        bs.grouped_gemm(a, b, masked_m=cnt, out=out)  # compile outside the capture
        torch.cuda.synchronize()
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            bs.grouped_gemm(a, b, masked_m=cnt, out=out)
        for counts in ([1, 2, 3, 4], [192, 191, 0, 128], [0, 0, 0, 0]):
            cnt.copy_(torch.tensor(counts, dtype=torch.int32))
            out.fill_(float("nan"))
            gr.replay()
            torch.cuda.synchronize()
            _check_masked(out, ref.grouped_gemm(a, b, masked_m=cnt), cnt, max_m, f"graph replay {counts}")
        bs.check_errors()
        return "3 replays"

    t64 = HopperConfig("wide", 64, 128, 4, 4, epilogue="masked")
    # one expert: grouped_gemm runs the dense gemm() then, so the grouped tiles go through launch
    one = grouped_hopper_config(77, 256, 256, dev_info.sm_count, 2, 1)
    t256 = HopperConfig("wide", 128, 256, 8, 4, epilogue="masked")
    return [
        Check("grouped contiguous skewed", "grouped", contiguous([0, 1, 130, 127, 300, 0, 64, 1000], 384, 1040)),
        Check("grouped contiguous N=4096 K=7168", "grouped", contiguous([128] * 8, 4096, 7168)),
        Check("grouped contiguous 64x128 tiles", "grouped", contiguous([3, 64, 65, 0], 200, 512, t64), repr(t64)),
        Check("grouped contiguous 1 expert", "grouped", contiguous([77], 256, 256, one), repr(one)),
        Check("grouped contiguous E=64", "grouped", contiguous([(i * 37) % 150 for i in range(64)], 256, 512)),
        Check("grouped masked", "grouped", masked([0, 200, 1, 77, 128, 129], 200, 320, 1024)),
        Check("grouped masked 128x256 tiles", "grouped", masked([64, 0, 3], 64, 512, 2048, t256), repr(t256)),
        Check("grouped masked cuda graph", "grouped", graph),
    ]


# ---------------------------------------------------------------------------------- swiglu
def swiglu_checks(args, dev_info) -> list[Check]:
    def case(kind, e, m, n, k):
        def run():
            import torch

            import blockscaled as bs
            from blockscaled.plan import observe_plans
            from blockscaled.reference import grouped as ref
            from blockscaled.testing.tolerances import assert_gemm_close

            dev = torch.device("cuda")
            if kind == "dense":
                a, bg, bu = _inputs((m,), (), n, k, 11, dev, count=2)
                kw = {}
            elif kind == "contiguous":
                a, bg, bu = _inputs((e * m,), (e,), n, k, 12, dev, count=2)
                kw = {"offsets": torch.arange(0, e * m + 1, m, dtype=torch.int32, device=dev)}
            else:
                a, bg, bu = _inputs((e, 2 * m), (e,), n, k, 13, dev, count=2)
                kw = {"masked_m": torch.full((e,), m, dtype=torch.int32, device=dev)}
            with observe_plans() as plans:
                y = bs.swiglu(a, bg, bu, config=bs.GemmConfig(strategy="hopper"), **kw)
            ran = _ran(plans, "hopper_wide", f"swiglu {kind}")
            want = ref.swiglu(a, bg, bu, **kw)
            if kind == "masked":
                y, want = y[:, :m], want[:, :m]
            rel, _ = assert_gemm_close(y, want, "fp8_block", torch.bfloat16, what=f"swiglu {kind} {m}x{n}x{k}")
            return f"rel_fro={rel:.1e} [{ran}]"

        return run

    rows = [("dense", 1, 256, 2048, 7168), ("dense", 1, 4096, 4096, 7168), ("dense", 1, 77, 384, 1040),
            ("contiguous", 8, 128, 2048, 7168), ("masked", 8, 64, 2048, 7168)]
    return [Check(f"swiglu {kind} E={e} m={m} N={n} K={k}", "swiglu", case(kind, e, m, n, k))
            for kind, e, m, n, k in rows]


# ---------------------------------------------------------------------------------- runner
_PROGRESS = {"t": time.time(), "what": "start"}


def _watchdog(limit_s: float) -> None:
    # A pipeline bug (mbarrier phase, missing arrive) hangs the GPU instead of failing: name the
    # check and exit instead of blocking the whole run.
    while True:
        time.sleep(5)
        if time.time() - _PROGRESS["t"] > limit_s:
            print(f"\n# HANG: no progress for {limit_s:.0f} s during: {_PROGRESS['what']}", flush=True)
            os._exit(3)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=None, help="regex over check names (e.g. '^dense', 'masked')")
    p.add_argument("--quick", action="store_true", help="five dense shapes instead of twenty-one")
    p.add_argument("--candidates", action="store_true", help="dense: every Hopper candidate of the planner")
    p.add_argument("--m", default=None, help="comma-separated M values for the DeepSeek-V3 shapes (default 128,4096)")
    p.add_argument("--list", action="store_true", help="print the checks (planned for an H100 without a GPU)")
    p.add_argument("--json", default=None, help="write the results to this file")
    p.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of failing checks")
    p.add_argument("--hang-s", type=float, default=120.0, help="watchdog: exit if one check takes longer")
    args = p.parse_args(argv)

    import torch

    from blockscaled.plan import H100_SXM, device_info

    sm90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    dev_info = device_info(torch.device("cuda")) if sm90 else H100_SXM
    checks = dense_checks(args, dev_info) + grouped_checks(args, dev_info) + swiglu_checks(args, dev_info)
    if args.only:
        checks = [c for c in checks if re.search(args.only, c.name)]
    if args.list:
        for c in checks:
            print(f"{c.name:<70} {c.what}")
        print(f"{len(checks)} checks")
        return 0
    if not sm90:
        print("hopper_check.py: needs an sm_90 (Hopper) GPU; --list prints the checks", file=sys.stderr)
        return 2
    import triton

    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}; "
          f"{len(checks)} checks", flush=True)
    threading.Thread(target=_watchdog, args=(args.hang_s,), daemon=True).start()
    results, t_all = [], time.time()
    for c in checks:
        _PROGRESS.update(t=time.time(), what=c.name)
        t0 = time.time()
        try:
            status, detail = "ok", c.run() or ""
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - report every check, keep going
            status = "FAIL"
            detail = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            if args.verbose:
                traceback.print_exc()
        dt = time.time() - t0
        print(f"{status:<4} {c.name} ({dt:.1f} s) {detail}", flush=True)
        results.append({"name": c.name, "group": c.group, "status": status, "detail": detail, "seconds": round(dt, 2)})
        torch.cuda.empty_cache()
    fails = sum(r["status"] != "ok" for r in results)
    print(f"# {len(results) - fails} ok, {fails} failed in {time.time() - t_all:.0f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
