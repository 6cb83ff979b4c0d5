"""The cost model: predicted GPU time of one kernel configuration on one problem.

Every tile kernel (portable Triton, Hopper wide, Hopper skinny) is described by the same terms
(docs/design.md, "The planner"):

* **units**: output tiles x K ranges (split-K), each a program's piece of work; a unit walks
  ``kb`` K blocks of 128 and then stores its tile (or an fp32 partial);
* **slots**: programs resident at once = SMs x programs per SM (one for the persistent wide
  kernel, shared memory / registers for the others); units run in rounds of ``slots``;
* **per-unit time** = ``c0 + kb * max(ckb, bytes_per_kb / bw_cta)``: a fixed cost (ring fill,
  epilogue), then per K block the larger of the tile's math time at full load (``ckb``) and the
  time one program needs to stream that K block's A and B bytes (``bw_cta``: a single program's
  pipeline keeps only so many bytes in flight);
* split units add ``split_us`` (fp32 partial store, arrival, the reduction's read-back);
* the whole launch can go no faster than its unique DRAM bytes at the copy bandwidth, nor its
  L2 -> SM bytes (every unit's K blocks) at the L2 bandwidth;
* plus the launch's fixed cost.

``c0``, ``ckb``, ``bw_cta`` and ``split_us`` are measured per kernel and tile size by
scripts/checks/calibrate.py and stored per device (plan/calibration.py). The decode GEMV is a
stream of the weight bytes at a measured fraction of the copy bandwidth; dequantize + cuBLAS is
two dequantize passes plus cuBLAS bf16 at a measured rate.
"""

from __future__ import annotations

import math

from ..config.gemm import GemmConfig
from ..config.hopper import HopperConfig
from ..formats import FORMATS
from .calibration import Calibration
from .device import DeviceInfo
from .splits import split_plan_kb

__all__ = ["tile_key", "programs_per_sm", "predict_us", "Estimate"]

_REG_FILE = 65536
#: registers per thread ~ _REG_BASE + accumulator registers (x2 with promotion: the per-chunk dot
#: result is a second fp32 tile). Fitted to ptxas -v for sm_90 (fp8_block promote, 4 warps): 64x64
#: 130 registers, 64x128 232, 128x64 220; 8 warps 128x128 225 (formula: 164, 228, 228, 228).
_REG_BASE = 100
#: programs per SM the skinny kernel's ring is sized for (plan/dense.py, SKINNY_PROGRAMS_PER_SM)
SKINNY_PROGRAMS_PER_SM = 4


def tile_key(cfg) -> str:
    """The calibration key of a configuration: kernel and tile size."""
    if isinstance(cfg, HopperConfig):
        if cfg.variant == "skinny":
            return f"skinny:{cfg.block_n}"
        return f"wide:{cfg.block_m}x{cfg.block_n}"
    if cfg.strategy == "gemv":
        return "gemv"
    if cfg.strategy == "dequant_matmul":
        return "dequant_matmul"
    return f"portable:{cfg.block_m}x{cfg.block_n}{'s' if cfg.swap_ab else ''}"


def _bytes(fmt_name: str):
    f = FORMATS[fmt_name]
    return f.elem_bytes, f.block_k, f.scale_bytes


def programs_per_sm(cfg, fmt_name: str, a_dense_bytes: int, promote: bool, dev: DeviceInfo) -> int:
    """Resident programs per SM: 1 for the persistent wide kernel, SKINNY_PROGRAMS_PER_SM for the
    skinny kernel's ring, and for the portable kernel the smaller of the shared-memory (stages of
    A + B + scales, plus the dequantize path's bf16 operand copies) and register limits (<= 4)."""
    if isinstance(cfg, HopperConfig):
        return 1 if cfg.variant == "wide" else SKINNY_PROGRAMS_PER_SM
    eb, sk, sb = _bytes(fmt_name)
    a_b = a_dense_bytes if a_dense_bytes else eb
    scale_cols = max(1, cfg.block_k // sk)
    per_stage = cfg.block_m * cfg.block_k * a_b + cfg.block_n * cfg.block_k * eb
    per_stage += (cfg.block_m + cfg.block_n) * scale_cols * sb
    smem = cfg.num_stages * per_stage + (0 if promote else (cfg.block_m + cfg.block_n) * cfg.block_k * 2) + 1024
    by_smem = (dev.smem_bytes + 1024) // smem
    acc_regs = cfg.block_m * cfg.block_n // (32 * cfg.num_warps) * (2 if promote else 1)
    by_regs = _REG_FILE // ((_REG_BASE + acc_regs) * 32 * cfg.num_warps)
    return int(max(1, min(by_smem, by_regs, 4)))


class Estimate:
    """A predicted time and the numbers behind it (for the plan's reasons)."""

    __slots__ = ("us", "units", "slots", "rounds", "kb", "bound", "split")

    def __init__(self, us, units=0, slots=0, rounds=0.0, kb=0, bound="", split=1):
        self.us, self.units, self.slots, self.rounds, self.kb, self.bound, self.split = (
            us, units, slots, rounds, kb, bound, split)

    def describe(self) -> str:
        if not self.units:
            return f"{self.us:.1f} us ({self.bound})"
        return (f"{self.us:.1f} us: {self.units} units of {self.kb} K blocks on {self.slots} slots "
                f"({self.rounds:.2f} rounds), {self.bound}-bound")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def predict_us(cfg, fmt_name: str, m: int, n: int, k: int, dev: DeviceInfo, cal: Calibration, *,
               a_dense_bytes: int = 0, out_bytes: int = 2, promote: bool = True,
               b_scale_rows: int = 128) -> Estimate:
    """Predicted GPU time (us) of ``cfg`` on ``[m, k] @ [n, k].T`` in ``fmt_name``."""
    eb, sk, sb = _bytes(fmt_name)
    nk = max(1, _cdiv(k, 128))
    a_row = k * (a_dense_bytes or eb) + (0 if a_dense_bytes else _cdiv(k, sk) * sb)
    b_bytes = n * k * eb + _cdiv(n, b_scale_rows) * _cdiv(k, sk if fmt_name != "fp8_block" else 128) * sb
    unique = m * a_row + b_bytes + m * n * out_bytes
    bw = cal["mem_bw"]
    key = tile_key(cfg)
    if key == "gemv":
        g = cal["gemv"]
        t = cal["launch_us"]["gemv"] + (b_bytes / (bw * g["eff"])) * 1e6 * (1 + g["row_cost"] * (m - 1))
        return Estimate(t, bound="weight stream at the GEMV's measured share of the copy bandwidth")
    if key == "dequant_matmul":
        c = cal["cublas_bf16"]
        dq = b_bytes + n * k * 2 + (0 if a_dense_bytes else m * a_row + m * k * 2)
        rate = c["tflops"] * 1e12 * k / (k + c["k_half"])
        mm = max(2.0 * m * n * k / rate, ((m + n) * k * 2 + m * n * out_bytes) / bw)
        t = dq / bw * 1e6 + mm * 1e6 + cal["launch_us"]["dequant_matmul"]
        return Estimate(t, bound="dequantize passes + cuBLAS bf16")
    tc = cal.tile(key)
    if isinstance(cfg, HopperConfig) and cfg.variant == "skinny":
        rows_a, rows_b = min(m, cfg.block_m), cfg.block_n
        tiles = _cdiv(n, cfg.block_n)
        splits, kb_per = split_plan_kb(nk, cfg.split_k)
        tail_tiles, full_tiles = tiles, 0
    else:
        bm, bn = cfg.block_m, cfg.block_n
        rows_a, rows_b = min(m, bm), min(n, bn)
        tiles = _cdiv(m, bm) * _cdiv(n, bn)
        if isinstance(cfg, HopperConfig):
            splits, kb_per = split_plan_kb(nk, cfg.split_k if cfg.split_k > 1 else cfg.tail_split)
            full_tiles = 0
            if cfg.split_k <= 1 and cfg.tail_split > 1:
                full = (tiles // dev.sm_count) * dev.sm_count
                if 0 < full < tiles and splits > 1:
                    full_tiles = full
                else:
                    splits, kb_per = 1, nk
        else:
            kchunks = max(1, _cdiv(k, cfg.block_k))
            splits = 1 if cfg.split_k <= 1 or kchunks <= 1 else _cdiv(kchunks, _cdiv(kchunks, min(cfg.split_k, kchunks)))
            kb_per = _cdiv(nk, splits)
            full_tiles = 0
        tail_tiles = tiles - full_tiles
    slots = dev.sm_count * programs_per_sm(cfg, fmt_name, a_dense_bytes, promote, dev)
    per_kb_bytes = (rows_a * (a_dense_bytes or eb) + rows_b * eb) * 128
    t_kb = max(tc["ckb_us"], per_kb_bytes / tc["bw_cta"] * 1e6)
    split_us = tc["split_us"] + (cfg.block_m * cfg.block_n * 8 / tc["bw_cta"] * 1e6 if splits > 1 else 0.0)
    # rounds: whole tiles first (tail split), then the split units
    t_full = _cdiv(full_tiles, slots) * (tc["c0_us"] + nk * t_kb) if full_tiles else 0.0
    units = tail_tiles * splits
    unit_t = tc["c0_us"] + kb_per * t_kb + (split_us if splits > 1 else 0.0)
    rounds = units / slots if units <= slots else _cdiv(units, slots)
    t_rounds = t_full + _cdiv(units, slots) * unit_t
    partial = tail_tiles * splits * cfg.block_m * cfg.block_n * 4 if splits > 1 else 0
    t_dram = (unique + 2 * partial) / bw * 1e6
    l2 = (full_tiles * nk + units * kb_per) * per_kb_bytes + 2 * partial
    t_l2 = l2 / cal["l2_bw"] * 1e6
    t, bound = max((t_rounds, "tile-time"), (t_dram, "DRAM"), (t_l2, "L2"))
    launch = cal["launch_us"]["hopper" if isinstance(cfg, HopperConfig) else "portable"]
    return Estimate(t + launch, full_tiles + units, slots,
                    (full_tiles / slots if full_tiles else 0.0) + rounds, kb_per, bound, splits)
