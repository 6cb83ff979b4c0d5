"""H100 A/B of the wide kernel's split-K reduction: HopperConfig.split_reduce "last" (the last
unit of a tile reads every partial back) vs "spread" (every unit waits for the others, then sums
1/split of the tile), same configs, same inputs, same run; both checked against the float64
reference and against each other (bitwise: the same fixed summation order).

The library launches "spread" cooperatively (triton's launch_cooperative_grid: the driver
co-schedules the whole grid, the spread wait's co-residency condition, see
HopperConfig.split_reduce). ``--plain`` adds "spread" launched without it (the H100 A/B that
enabled it, benchmarks/NOTES.md 2026-11-23, "Cooperative launch of the spread reduction": the same
times within 0.2 us on all 14 rows), checked bitwise against
"last".

``--probe`` adds two edited copies of the kernel, timing only (their results are wrong): "noread"
(the last unit stores its own partial instead of reading all partials back) and "nopart" (no
partial stores, no atomics: every unit stores its accumulator straight to C). last - noread is
the read-back, noread - nopart the partial store + arrival, nopart - unsplit the rest.

    python scripts/split_reduce_ab.py [--probe] [--json OUT.json]     # ~2-4 min (compiles)
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import re
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from blockscaled.bench.timing import time_op  # noqa: E402
from blockscaled.ops import _hopper as H  # noqa: E402
from blockscaled.ops.gemm import gemm  # noqa: E402
from hopper_small_m import case_inputs, checked_us, save_json, sweep_cli  # noqa: E402

# (M, N, K, block_n, split_k or "tail"): small-M split-K rows (every tile split; the splits the
# chooser or the portable kernel's neighbours use) and tail splits at prefill M (dispatch config)
CASES = [
    (64, 2112, 7168, 128, 7), (128, 2112, 7168, 128, 7), (128, 2112, 7168, 128, 4),
    (128, 4096, 7168, 128, 4), (128, 7168, 4096, 128, 2), (128, 7168, 16384, 128, 2),
    (256, 4096, 7168, 128, 2), (512, 2048, 7168, 128, 2), (128, 4096, 7168, 256, 8),
    (512, 4096, 7168, 256, 2), (64, 7168, 7168, 128, 2),
    (1024, 2112, 7168, None, "tail"), (4096, 2112, 7168, None, "tail"), (2048, 7168, 7168, None, "tail"),
]
PROBE_CASES = {(128, 2112, 7168, 128, 7), (128, 4096, 7168, 128, 4), (128, 7168, 4096, 128, 2),
               (128, 4096, 7168, 256, 8), (4096, 2112, 7168, None, "tail")}


def edited_kernel(kind: str):
    """The wide kernel from an edited copy of kernels/hopper/wide.py (timing probes)."""
    src_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "blockscaled", "kernels",
                            "hopper", "wide.py")
    src = open(src_path).read()
    if kind == "noread":
        src, n = re.subn(r"tot = _wide_splitk_sum\(rows0, c, mask0, UNIT, SPLIT\)", "tot = acc0", src)
        src, n2 = re.subn(r"tot = _wide_splitk_sum\(rows0 \+ HALF, c, mask1, UNIT, SPLIT\)", "tot = acc1", src)
        assert n == 1 and n2 == 1, "noread edit"
    elif kind == "nopart":
        store = ("_wide_store_tile(c_desc, c_smem, c_ptr, acc0, acc1, my_row0, row_end, off_n, N, stride_cm, NH, "
                 "EPI, WG, ROWS, HALF, num_warps)")
        src, n = re.subn(r"_wide_splitk_finish\(c_desc, c_smem, c_ptr, ws_ptr, cnt_ptr, acc0, acc1, tile - split_from,[^)]*\)", store,
                         src)
        assert n == 2, "nopart edit"
    else:
        raise ValueError(kind)
    d = tempfile.mkdtemp(prefix=f"wide_{kind}_")
    path = os.path.join(d, f"wide_{kind}.py")
    with open(path, "w") as f:
        f.write(src)
    # named inside the kernels package so that its relative imports (._common, ._compat) resolve
    spec = importlib.util.spec_from_file_location(f"blockscaled.kernels.hopper._wide_{kind}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.fp8_block_gemm_wide_kernel


class _Plain:
    """The wide kernel launched without the cooperative attribute."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kw):
            kw.pop("launch_cooperative_grid", None)
            return launch(*args, **kw)
        return run


@contextlib.contextmanager
def wide_kernel(kernel):
    real = H._kernel_for
    if kernel is not None:
        H._kernel_for = lambda v: kernel if v == "wide" else real(v)
    try:
        yield
    finally:
        H._kernel_for = real


def config_for(m, n, k, bn, split, nsm):
    if split == "tail":
        return H.choose_dispatch_config(m, n, k, num_sms=nsm)
    return H._fill_stages(H.HopperConfig("wide", 128, bn, 8, 2, epilogue="tma", split_k=split), 2)


def main():
    args = sweep_cli(__doc__, "0", shapes=False, extra=lambda p: (
        p.add_argument("--probe", action="store_true", help="time the edited kernels"),
        p.add_argument("--plain", action="store_true", help="also time 'spread' launched non-cooperatively")))
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    probes = {k: edited_kernel(k) for k in ("noread", "nopart")} if args.probe else {}
    rows = []
    print(f"{'M':>5}{'N':>7}{'K':>7} {'cfg':>22} | {'gemm()':>7} {'unsplit':>8} {'last':>7} {'spread':>7} "
          f"{'last/spr':>8} | probes (us)")
    for case in CASES:
        m, n, k, bn, split = case
        cfg = config_for(m, n, k, bn, split, nsm)
        if split == "tail" and cfg.tail_split == 1:
            print(f"{m:>5}{n:>7}{k:>7}: no tail split on {nsm} SMs")
            continue
        _, sets, ref = case_inputs(m, n, k, max_sets=4)
        # (HopperConfig's default reduction is "spread": "last" must be asked for)
        cfg = dataclasses.replace(cfg, split_reduce="last")
        spread = dataclasses.replace(cfg, split_reduce="spread")
        unsplit = dataclasses.replace(cfg, split_k=1, tail_split=1)

        def run(c):
            return lambda a, b: H.gemm_fp8_block_hopper(a, b, torch.bfloat16, config=c)

        t = {"gemm": time_op(lambda a, b: gemm(a, b), sets, warmup=5, iterations=30).median_ms * 1e3}
        for name, c in (("unsplit", unsplit), ("last", cfg), ("spread", spread)):
            t[name] = checked_us(run(c), sets, ref, f"{m}x{n}x{k} {c}")
        o_last, o_spread = run(cfg)(*sets[0]), run(spread)(*sets[0])
        same = bool(torch.equal(o_last, o_spread))
        if args.plain:
            with wide_kernel(_Plain(H._kernel_for("wide"))):
                t["plain"] = checked_us(run(spread), sets, ref, f"{m}x{n}x{k} {spread} non-cooperative")
                same = same and bool(torch.equal(run(spread)(*sets[0]), o_last))
        for name, kern in probes.items():
            if case in PROBE_CASES:
                with wide_kernel(kern):
                    t[name] = time_op(run(cfg), sets, warmup=5, iterations=30).median_ms * 1e3
        label = f"{cfg.block_m}x{cfg.block_n} s{cfg.stages} " + (f"tail{cfg.tail_split}" if split == "tail"
                                                                 else f"split{cfg.split_k}")
        rows.append({"m": m, "n": n, "k": k, "cfg": label, "bitwise_equal": same, **{f"{kk}_us": v for kk, v in t.items()}})
        pr = " ".join(f"{kk}:{t[kk]:.1f}" for kk in (*probes, "plain") if kk in t)
        print(f"{m:>5}{n:>7}{k:>7} {label:>22} | {t['gemm']:7.1f} {t['unsplit']:8.1f} {t['last']:7.1f} "
              f"{t['spread']:7.1f} {t['last'] / t['spread']:8.3f} | {pr}{'' if same else '  NOT BITWISE EQUAL'}",
              flush=True)
        assert same, f"{m}x{n}x{k} {label}: spread and last reductions differ"
    save_json(args.json, rows=rows)


if __name__ == "__main__":
    main()
