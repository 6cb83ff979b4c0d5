"""H100 A/B for small-M fp8_block GEMMs: today's dispatch (``gemm()``) vs the Hopper wide kernel
with fused split-K (``ops._hopper.choose_small_m_hopper_config``), plus optional forced splits.

    python scripts/hopper_small_m.py [--ms 1,16,64,128,256] [--json OUT.json]   # ~1-2 min

CUDA-graph medians (blockscaled.bench.timing.time_op) with inputs rotated past L2; % of the
memory floor = bytes read once + output written once (scales included) at 3.0 TB/s (the copy
bandwidth the bench measures on this machine, 3.00-3.02 TB/s). Every Hopper result is checked
against the float64 reference of the same quantized inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from blockscaled.bench.timing import rotation_count, time_op  # noqa: E402
from blockscaled.ops import _hopper as H  # noqa: E402
from blockscaled.ops.gemm import gemm  # noqa: E402
from blockscaled.testing import fp8_block_operands  # noqa: E402
from blockscaled.reference.gemm import gemm as ref_gemm  # noqa: E402
from blockscaled.testing.tolerances import assert_gemm_close  # noqa: E402

DEV = torch.device("cuda")
NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
COPY_BW = 3.0e12


def floor_bytes(m, n, k):
    """Bytes of the memory floor of an fp8_block GEMM: A, B and their fp32 scales read once (1x128
    / 128x128 blocks), the bf16 output written once."""
    nk = -(-k // 128)
    return m * k + n * k + m * nk * 4 + (-(-n // 128)) * nk * 4 + m * n * 2


def operands(m, n, k, seed):
    return fp8_block_operands(m, n, k, seed, device=DEV)


# ------------------------------------------------- shared by the H100 sweep scripts in scripts/
def sweep_cli(doc, ms_default, shapes=True, extra=None):
    """Parse the sweep scripts' command line: --ms (comma list), --shapes (NxK,...; default the six
    DeepSeek-V3 shapes NK), --json; ``extra(parser)`` adds more. Returns the namespace with ``ms``
    a list of ints and ``shapes`` a list of (N, K)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--ms", default=ms_default)
    if shapes:
        p.add_argument("--shapes", default=None, help="NxK,NxK,... (default: the six DeepSeek-V3 shapes)")
    p.add_argument("--json", default=None)
    if extra is not None:
        extra(p)
    args = p.parse_args()
    args.ms = [int(x) for x in args.ms.split(",")]
    if shapes:
        args.shapes = list(NK) if not args.shapes else [tuple(int(v) for v in s.split("x"))
                                                        for s in args.shapes.split(",")]
    return args


def case_inputs(m, n, k, bw=COPY_BW, max_sets=8):
    """(memory-floor us at ``bw`` bytes/s, operand sets rotated past L2, float64 reference of the
    first set) for one fp8_block GEMM case."""
    nbytes = floor_bytes(m, n, k)
    sets = [operands(m, n, k, s) for s in range(min(rotation_count(nbytes), max_sets))]
    return nbytes / bw * 1e6, sets, ref_gemm(*sets[0])


def checked_us(fn, sets, ref, what, warmup=5, iterations=30):
    """``fn(a, b)`` checked once on the first set against ``ref`` (NaN-free, within the fp8_block
    bf16 tolerance), then its CUDA-graph median over the rotated sets, in us."""
    assert_gemm_close(fn(*sets[0]), ref, "fp8_block", torch.bfloat16, what=what)
    return time_op(fn, sets, warmup=warmup, iterations=iterations).median_ms * 1e3


def interleaved_us(fns, sets, rounds, iterations=20, warmup=3):
    """Time every ``fns[name](*args)`` in ``rounds`` interleaved rounds (each round times every
    candidate once, odd rounds in reverse order, so that a drift of the GPU's speed during the run
    reaches all candidates alike: the H100 drifted by up to 11% within minutes, benchmarks/NOTES.md
    2026-11-23, "The H100's run-to-run noise").
    ``sets``: one list of rotated argument tuples for all, or a dict name -> list. Returns name
    -> [CUDA-graph median us per round]."""
    us = {name: [] for name in fns}
    for r in range(rounds):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            arg_sets = sets[name] if isinstance(sets, dict) else sets
            us[name].append(time_op(fns[name], arg_sets, warmup=warmup, iterations=iterations).median_ms * 1e3)
    return us


def save_json(path, **payload):
    """Write ``{"device": <GPU name>, **payload}`` to ``path`` (nothing when path is None)."""
    if path:
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), **payload}, f, indent=1)


def main():
    args = sweep_cli(__doc__, "1,16,64,128,256")
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    print(f"{'M':>5}{'N':>7}{'K':>7} | {'gemm() us':>10} {'%':>4} | {'hopper split us':>16} {'%':>4} | cfg")
    for m in args.ms:
        for n, k in args.shapes:
            floor_us, sets, ref = case_inputs(m, n, k)
            cfg = H.choose_small_m_hopper_config(m, n, k, nsm)
            t0 = time_op(lambda a, b: gemm(a, b), sets, warmup=5, iterations=30).median_ms * 1e3
            t1 = checked_us(lambda a, b: H.gemm_fp8_block_hopper(a, b, torch.bfloat16, config=cfg), sets, ref,
                            f"{m}x{n}x{k} {cfg}")
            r = {"m": m, "n": n, "k": k, "floor_us": floor_us, "gemm_us": t0, "hopper_us": t1,
                 "cfg": f"{cfg.block_m}x{cfg.block_n} s{cfg.stages} split{cfg.split_k}"}
            rows.append(r)
            print(f"{m:>5}{n:>7}{k:>7} | {t0:10.1f} {100 * floor_us / t0:4.0f} | {t1:16.1f} "
                  f"{100 * floor_us / t1:4.0f} | {r['cfg']}", flush=True)
    save_json(args.json, rows=rows)


if __name__ == "__main__":
    main()
