"""Per-device constants of the cost model (plan/cost.py), measured on the GPU.

``scripts/checks/calibrate.py`` measures them (per-tile times of every kernel and tile size the
planner can choose, the copy bandwidth, the split-K reduction's fixed cost, cuBLAS bf16 rates for
the dequantize + matmul path) and writes ``plan/devices/<key>.json``. The planner loads the file
whose ``match`` string occurs in the device name; a device without one uses the H100 file scaled to
it (``load_calibration``: its DRAM bandwidth, the L2 bandwidth by SM count; said in the plan's reasons).

Layout of a file (all times in microseconds, bandwidths in bytes/s):
    {"device": name, "match": substring, "measured": {"date", "git", "torch", "triton"},
     "mem_bw": copy bandwidth, "l2_bw": L2 -> SM bandwidth, "partial_bw": the rate of split-K
     partials (L2-resident within a launch; not scaled to another device's DRAM),
     "launch_us": {kernel: fixed cost of one launch},
     "tiles": {"<kernel>:<tile>": {"c0_us": fixed per unit, "ckb_us": per 128-wide K block at
               full load, "bw_cta": one program's streaming rate, "split_us": per split unit,
               "dram_eff": share of mem_bw it reaches, "odd_k": slowdown where rows are not 16-byte
               aligned, "odd_n_us": added per unit where the output rows are not 16-byte aligned
               (the stores of such rows cannot be vectorised)}} (the GEMV is a tile kernel too: key "gemv"),
     "overlap_p": how the time limits combine (a p-norm),
     "cublas_bf16": {"tflops": rate at long K, "k_half": K at half rate}}
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

__all__ = ["Calibration", "load_calibration", "measured_bandwidth", "DEVICES_DIR"]

DEVICES_DIR = Path(__file__).with_name("devices")


class Calibration(dict):
    """The parsed JSON of one device file (a dict) plus ``source``: the file it came from and
    whether it was scaled from another device's numbers."""

    source: str = ""

    def tile(self, key: str) -> dict:
        t = self["tiles"].get(key)
        if t is None:
            raise KeyError(f"no calibrated constants for tile {key!r} in {self.source}")
        return t


def _read_files() -> tuple[tuple[str, dict], ...]:
    return tuple((p.name, json.loads(p.read_text())) for p in sorted(DEVICES_DIR.glob("*.json")))


#: the device files, read once at import: planning runs while torch.compile traces the grouped ops,
#: and dynamo cannot trace file-system calls
_FILES = _read_files()


def _files() -> tuple[tuple[str, dict], ...]:
    return _FILES


def measured_bandwidth(name: str) -> float | None:
    """The calibrated copy bandwidth of the device called ``name``, or None."""
    for _, d in _files():
        if d.get("match", "\0") in name:
            return float(d["mem_bw"])
    return None


#: SMs of the device the H100 file was measured on (H100 SXM)
BASE_SMS = 132


@functools.lru_cache(maxsize=64)
def load_calibration(name: str, sm_count: int, mem_bw: float) -> Calibration:
    """Constants for a device: its own file, else the H100 file scaled to it. Only what the device
    changes is scaled: the DRAM bandwidth is ``mem_bw``; the L2 -> SM bandwidth scales with the SM
    count (the L2 fabric feeds the SMs); per-unit compute times and one program's streaming rate
    (``bw_cta``: bytes in flight over the memory latency, a property of the SM) stay. An H200 is the
    H100's die with faster HBM: scaling the L2 and per-program rates by its DRAM bandwidth too (1.4x,
    the rule before) made the planner expect 1.4x faster tiles than the H200 runs and pick narrower,
    split plans: benchmarks/NOTES.md, twenty-third session, measured both rules on the H200."""
    files = _files()
    for fname, d in files:
        if d.get("match", "\0") in name:
            c = Calibration(d)
            c.source = f"plan/devices/{fname}"
            return c
    base = dict(next(d for f, d in files if f == "h100.json"))
    base = json.loads(json.dumps(base))
    base.setdefault("partial_bw", base["mem_bw"])  # (the calibrating device's: split partials stay in L2)
    base["mem_bw"] = mem_bw
    base["l2_bw"] *= sm_count / BASE_SMS
    c = Calibration(base)
    c.source = f"plan/devices/h100.json scaled to {name or 'this device'} ({sm_count} SMs, {mem_bw / 1e12:.2f} TB/s)"
    return c
