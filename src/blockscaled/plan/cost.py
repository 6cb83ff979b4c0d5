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
* where the output rows are not 16-byte aligned (``odd_n``: N % 8 != 0 in bf16) every unit adds
  ``odd_n_us`` and every split unit ``odd_split_us`` (its share of the reduction): such rows are
  stored without vectors; dequantize + cuBLAS pads such rows (its bf16 operands' too) and pays a
  copy of the output and the padding's launches instead;
* the whole launch can go no faster than its unique DRAM bytes at the copy bandwidth, nor its
  L2 -> SM bytes (every unit's K blocks) at the L2 bandwidth;
* plus the launch's fixed cost.

``c0``, ``ckb``, ``bw_cta`` and ``split_us`` are measured per kernel and tile size by
scripts/checks/calibrate.py and stored per device (plan/calibration.py). The decode GEMV is a
stream of the weight bytes at a measured fraction of the copy bandwidth; dequantize + cuBLAS is
two dequantize passes plus cuBLAS bf16 at a measured rate.
"""

from __future__ import annotations

from ..config.hopper import HopperConfig
from ..formats import FORMATS
from .calibration import Calibration
from .device import DeviceInfo
from .splits import cdiv as _cdiv
from .splits import split_plan_kb

__all__ = ["tile_key", "programs_per_sm", "predict_us", "Estimate", "PAD_COPY_SLOWDOWN", "pad_copy_bytes", "pad_launches",
           "pad_words"]

#: dequantize + cuBLAS at unaligned output rows copies its padded product into the output
#: (ops/gemm.py, _CUBLAS_ROW_ALIGN): that copy (a strided read, unaligned 2-byte writes) ran at
#: 1.5-1.9 TB/s on the H200 (4.8 peak), i.e. its bytes cost ~2.5x the copy bandwidth's time:
#: mxfp4 weight-only 2048 x 5759 x 2880 +25.5 us over N = 5760 for 47 MB read + written, mxfp8
#: 4096 x 5759 x 2880 +52 us for 94 MB, fp8_block 4096 x 4095 x 4096 +45 us for 67 MB
#: (benchmarks/NOTES.md, thirty-sixth session)
PAD_COPY_SLOWDOWN = 2.5


def _unaligned(n: int, k: int, out_bytes: int) -> tuple[bool, bool]:
    """(output rows, bf16 operand rows) not 16-byte aligned: what ops/gemm.py pads for cuBLAS (it
    also checks the output's stride and base, which a plan does not know)."""
    return (n * out_bytes) % 16 != 0, (k * 2) % 16 != 0


def pad_launches(n: int, k: int, out_bytes: int) -> int:
    """Launches that dequantize + cuBLAS adds for unaligned rows (ops/gemm.py, _dequant_matmul):
    the copy of the padded product (N), the zero padding columns of both operands (K)."""
    odd_n, odd_k = _unaligned(n, k, out_bytes)
    return (1 if odd_n else 0) + (2 if odd_k else 0)


def pad_words(n: int, k: int, out_bytes: int) -> str:
    """The plan's account of dequantize + cuBLAS's padding ("" where the rows are aligned)."""
    odd_n, odd_k = _unaligned(n, k, out_bytes)
    what = [w for w, odd in ((f"output rows (N = {n})", odd_n), (f"bf16 operand rows (K = {k})", odd_k)) if odd]
    if not what:
        return ""
    return (f"{' and '.join(what)} not 16-byte aligned: cuBLAS gets zero-padded operands and an aligned "
            f"product{', copied into the output' if odd_n else ''} (its unaligned kernels ran "
            f"7.2x slower; ops/gemm.py, _CUBLAS_ROW_ALIGN)")


def pad_copy_bytes(m: int, n: int, k: int, out_bytes: int, a_dense_bytes: int) -> float:
    """Bytes (weighted by PAD_COPY_SLOWDOWN where measured) that dequantize + cuBLAS adds for
    unaligned rows: the padded product copied into the output (N), weight-only activations
    copied into zero-padded rows (K)."""
    odd_n, odd_k = _unaligned(n, k, out_bytes)
    extra = 2.0 * m * n * out_bytes * PAD_COPY_SLOWDOWN if odd_n else 0.0
    if a_dense_bytes and odd_k:
        extra += 2.0 * m * k * a_dense_bytes
    return extra

_REG_FILE = 65536
#: registers per thread ~ _REG_BASE + accumulator registers (x2 with promotion: the per-chunk dot
#: result is a second fp32 tile). Fitted to ptxas -v for sm_90 (fp8_block promote, 4 warps): 64x64
#: 130 registers, 64x128 232, 128x64 220; 8 warps 128x128 225 (formula: 164, 228, 228, 228).
_REG_BASE = 100
#: Programs per SM the skinny kernel's ring is sized for (shared memory / 4, plan/dense.py::
#: skinny_stages): the fastest ring on all 24 rows of an H100 sweep (rings for 1 or 2 programs per
#: SM were 5-50% slower).
SKINNY_PROGRAMS_PER_SM = 4
#: resident GEMV programs per SM (4-8 warps, no shared-memory ring: the register file allows 8)
GEMV_PROGRAMS_PER_SM = 8


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
    if cfg.strategy == "gemv":
        return GEMV_PROGRAMS_PER_SM
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


#: Feature columns of one (config, problem) pair: everything of the model that does not depend
#: on the calibrated constants (so the calibration fits vectors of them at once).
FEATURES = ("full_rounds", "nk", "rounds", "kb", "split", "per_kb_bytes", "unique_bytes", "partial_bytes",
            "l2_bytes", "odd_k", "odd_n", "tile_bytes", "flops", "dq_bytes", "mm_bytes", "k", "m", "b_bytes",
            "dq_launches", "rows_pad")


def features(cfg, fmt_name: str, m: int, n: int, k: int, dev: DeviceInfo, *, a_dense_bytes: int = 0,
             out_bytes: int = 2, promote: bool = True, b_scale_rows: int = 128) -> dict:
    """The model's inputs for ``cfg`` on ``[m, k] @ [n, k].T`` (see the module docstring)."""
    eb, sk, sb = _bytes(fmt_name)
    nk = max(1, _cdiv(k, 128))
    a_row = k * (a_dense_bytes or eb) + (0 if a_dense_bytes else _cdiv(k, sk) * sb)
    b_bytes = n * k * eb + _cdiv(n, b_scale_rows) * _cdiv(k, sk if fmt_name != "fp8_block" else 128) * sb
    unique = m * a_row + b_bytes + m * n * out_bytes
    f = dict.fromkeys(FEATURES, 0.0)
    f.update(nk=nk, unique_bytes=unique, k=k, m=m, b_bytes=b_bytes, flops=2.0 * m * n * k,
             odd_k=1.0 if (k * (a_dense_bytes or eb)) % 16 else 0.0,
             odd_n=1.0 if (n * out_bytes) % 16 else 0.0)
    key = tile_key(cfg)
    if key == "dequant_matmul":
        f["dq_bytes"] = b_bytes + n * k * 2 + (0 if a_dense_bytes else m * a_row + m * k * 2)
        f["mm_bytes"] = (m + n) * k * 2 + m * n * out_bytes
        # unaligned rows are padded for cuBLAS (ops/gemm.py, _CUBLAS_ROW_ALIGN)
        f["dq_bytes"] += pad_copy_bytes(m, n, k, out_bytes, a_dense_bytes)
        f["dq_launches"] = pad_launches(n, k, out_bytes)
        f["odd_k"] = f["odd_n"] = 0.0
        return f
    if isinstance(cfg, HopperConfig) and cfg.variant == "skinny":
        rows_a, rows_b = min(m, cfg.block_m), cfg.block_n
        f["rows_pad"] = cfg.block_m
        tiles = _cdiv(n, cfg.block_n)
        splits, kb_per = split_plan_kb(nk, cfg.split_k)
        full_tiles = 0
    elif key == "gemv":  # whole weight rows per program, no split
        rows_a, rows_b = min(m, cfg.block_m), min(n, cfg.block_n)
        tiles = _cdiv(n, cfg.block_n) * _cdiv(m, cfg.block_m)
        splits, kb_per, full_tiles = 1, nk, 0
    else:
        bm, bn = cfg.block_m, cfg.block_n
        rows_a, rows_b = min(m, bm), min(n, bn)
        tiles = _cdiv(m, bm) * _cdiv(n, bn)
        full_tiles = 0
        if isinstance(cfg, HopperConfig):
            splits, kb_per = split_plan_kb(nk, cfg.split_k if cfg.split_k > 1 else cfg.tail_split)
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
    slots = dev.sm_count * programs_per_sm(cfg, fmt_name, a_dense_bytes, promote, dev)
    units = (tiles - full_tiles) * splits
    # bytes one unit streams per K block from DRAM: an A panel is shared by the tile row's N tiles
    # and a B panel by the tile column's M tiles (the first reader brings it into L2, the others
    # hit it), so each unit's share is its panels divided by their readers
    if isinstance(cfg, HopperConfig) and cfg.variant == "skinny" or key == "gemv":
        m_tiles, n_tiles = 1, max(1, tiles)
    else:
        m_tiles, n_tiles = max(1, _cdiv(m, cfg.block_m)), max(1, _cdiv(n, cfg.block_n))
    per_kb_bytes = (rows_a * (a_dense_bytes or eb) / n_tiles + rows_b * eb / m_tiles) * 128
    l2_kb_bytes = (rows_a * (a_dense_bytes or eb) + rows_b * eb) * 128
    partial = units * cfg.block_m * cfg.block_n * 4 if splits > 1 else 0
    f.update(full_rounds=_cdiv(full_tiles, slots) if full_tiles else 0, rounds=_cdiv(units, slots), kb=kb_per,
             split=1.0 if splits > 1 else 0.0, per_kb_bytes=per_kb_bytes, partial_bytes=partial,
             l2_bytes=(full_tiles * nk + units * kb_per) * l2_kb_bytes + 2 * partial,
             tile_bytes=cfg.block_m * cfg.block_n * 8.0,
             units=units, slots=slots, splits=splits)
    return f


def _family(key: str) -> str:
    return key.split(":")[0].replace("wide", "hopper").replace("skinny", "hopper")  # gemv stays gemv


def time_us(key: str, f, cal: Calibration, mx=max):
    """Predicted microseconds from :func:`features` (``f``: a dict of numbers, or of numpy arrays
    with ``mx=numpy.maximum``: the calibration evaluates many at once with the same formula).
    Returns (time, bound) where bound names the limiting term (scalars only)."""
    bw = cal["mem_bw"]
    if key == "dequant_matmul":
        c = cal["cublas_bf16"]
        rate = c["tflops"] * 1e12 * f["k"] / (f["k"] + c["k_half"])
        mm = mx(f["flops"] / rate, f["mm_bytes"] / bw)
        # (each padding launch at the fixed cost of a small Triton launch: the portable kernel's)
        return (f["dq_bytes"] / bw * 1e6 + mm * 1e6 + cal["launch_us"]["dequant_matmul"]
                + f["dq_launches"] * cal["launch_us"]["portable"]), "dequantize + cuBLAS bf16"
    tc = cal.tile(key)
    slow = 1.0 + f["odd_k"] * (tc.get("odd_k", 1.0) - 1.0)
    # the skinny kernel's wgmma has the padded activation rows as its N: its math per K block grows
    # with them past the 16 rows the decode shapes use (``row_ckb`` per further 16 rows)
    ckb = tc["ckb_us"] * (1.0 + tc.get("row_ckb", 0.0) * mx(f["rows_pad"] / 16.0 - 1.0, 0.0))
    t_kb = mx(ckb * slow, f["per_kb_bytes"] / tc["bw_cta"] * 1e6 * slow)
    split_us = f["split"] * (tc["split_us"] + f["odd_n"] * tc.get("odd_split_us", 0.0)
                             + f["tile_bytes"] / tc["bw_cta"] * 1e6)
    c0 = tc["c0_us"] + f["odd_n"] * tc.get("odd_n_us", 0.0)
    t_rounds = f["full_rounds"] * (c0 + f["nk"] * t_kb) + f["rounds"] * (c0 + f["kb"] * t_kb + split_us)
    # split-K partials are written and read back within the launch (L2-resident): their bytes move
    # at the calibrating device's rate ("partial_bw"), not scaled with another device's DRAM
    pbw = cal.get("partial_bw", bw)
    t_dram = (f["unique_bytes"] / bw + 2 * f["partial_bytes"] / pbw) / tc.get("dram_eff", 1.0) * 1e6
    t_l2 = f["l2_bytes"] / cal["l2_bw"] * 1e6
    # the three limits overlap imperfectly: a p-norm (p = cal["overlap_p"], measured) instead of max
    pw = cal.get("overlap_p", 8.0)
    t = (t_rounds ** pw + t_dram ** pw + t_l2 ** pw) ** (1.0 / pw) + cal["launch_us"][_family(key)]
    if mx is max:
        bound = "tile-time" if t_rounds >= max(t_dram, t_l2) else ("DRAM" if t_dram >= t_l2 else "L2")
        return t, bound
    return t, ""


def predict_us(cfg, fmt_name: str, m: int, n: int, k: int, dev: DeviceInfo, cal: Calibration, *,
               a_dense_bytes: int = 0, out_bytes: int = 2, promote: bool = True,
               b_scale_rows: int = 128) -> Estimate:
    """Predicted GPU time (us) of ``cfg`` on ``[m, k] @ [n, k].T`` in ``fmt_name``."""
    f = features(cfg, fmt_name, m, n, k, dev, a_dense_bytes=a_dense_bytes, out_bytes=out_bytes, promote=promote,
                 b_scale_rows=b_scale_rows)
    key = tile_key(cfg)
    t, bound = time_us(key, f, cal)
    if "units" not in f:
        return Estimate(t, bound=bound)
    rounds = f["units"] / f["slots"] if f["units"] <= f["slots"] else f["rounds"]
    return Estimate(t, f["units"], f["slots"], rounds, f["kb"], bound, f["splits"])
