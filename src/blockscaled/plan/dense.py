"""Dense GEMM plans (``gemm``, ``linear``): candidates, the cost model's choice, the reasons.

fp8_block with quantized activations on sm_90 (the DeepSeek-style path) is planned by the cost
model (plan/cost.py) over every candidate below; MX/NV formats, weight-only GEMMs and other GPUs
keep the portable rules of plan/portable.py (a roofline between the portable kernel and
dequantize + cuBLAS), which the same Plan carries.

Candidates for fp8_block x fp8_block on sm_90 (:func:`fp8_candidates`):
* GEMV (M = 1): the CUDA-core decode kernel;
* Hopper skinny (M <= 64, TMA-able operands): swap-AB, 64 / 128 weight rows per program, K split;
* Hopper wide (TMA-able, no bias, 128x128 weight blocks): 64x128, 128x128, 128x256 tiles; split-K
  over every tile while tiles x split fit one wave, else unsplit or a tail split of the last wave;
* portable: swap-AB 16/32-row tiles (M <= 32), 64x64 / 64x128 (M <= 128), 128x64 / 128x128,
  each with the K splits that keep <= 2 rounds of programs;
* dequantize + cuBLAS bf16 (not for fp32 output: bf16 operands would miss its tolerance).
Split counts come from SPLITS (each a separate compile of the kernels' SPLIT constexpr).
"""

from __future__ import annotations

from dataclasses import replace

from ..config.gemm import GemmConfig, gemv_config
from ..config.hopper import HopperConfig
from .calibration import load_calibration
from .cost import SKINNY_PROGRAMS_PER_SM, pad_words, predict_us, programs_per_sm
from . import tuned as _tuned
from .device import DeviceInfo
from .encoding import config_from_key
from .splits import cdiv as _cdiv
from .splits import split_plan_kb
from .types import Plan, Problem

__all__ = ["plan_fp8", "fp8_candidates", "ranked_candidates", "hopper_takes", "SPLITS", "hopper_fill_stages"]

#: K splits the planner considers: each is a separate compile (SPLIT is a constexpr of both
#: kernel families), so the set is kept short; the gaps cost at most 1/7 of a round's fill.
SPLITS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)
#: Fewest 128-wide K blocks per split range: below 4 a 3-6 stage ring never reaches its steady
#: state and the per-unit fixed cost dominates (a choice, not measured).
MIN_KB_PER_SPLIT = 4
#: Rounds of programs a portable split may take (more rounds only add partial traffic).
PORTABLE_MAX_ROUNDS = 2
#: Raster height of the wide kernel at short K (<= SHORT_K_MAX_KB blocks): the output write
#: dominates and each group of GROUP_M row tiles re-reads all of B. H100, M=4096 N=32768 K=512
#: (5 interleaved rounds, ratio to group_m 8): 16 1.04x, 32 1.09x; at K >= 1536 no group_m beat 8.
SHORT_K_GROUP_M = 32
SHORT_K_MAX_KB = 4
#: H100 opt-in shared memory per block (227 KB), the default budget of the stage counts
SMEM_LIMIT = 232448
_SMEM_LIMIT = SMEM_LIMIT


def hopper_fill_stages(cfg: HopperConfig, out_elem_bytes: int, dual: bool = False,
                       smem: int = _SMEM_LIMIT) -> HopperConfig:
    """As many ring stages as fit in shared memory next to the epilogue buffer (2..6)."""
    stage_bytes = cfg.stage_bytes()
    fixed = cfg.smem_bytes(out_elem_bytes, dual=dual) - cfg.stages * stage_bytes
    return replace(cfg, stages=max(2, min(6, (smem - fixed) // stage_bytes)))


def skinny_stages(block_m: int, block_n: int, smem: int = _SMEM_LIMIT) -> int:
    """Ring depth of the skinny kernel: shared memory for SKINNY_PROGRAMS_PER_SM programs per SM
    (ring + the epilogue's fp32 C^T scratch + barriers), at least 2."""
    stage = (block_n + block_m) * 128
    return max(2, (smem // SKINNY_PROGRAMS_PER_SM - block_n * block_m * 4 - 2048) // stage)


def gemv_for(m: int, n: int, k: int) -> GemmConfig:
    """The decode GEMV's configuration: 8 KB weight chunks per program (16 KB above K = 8192),
    8 warps where a program holds one weight row of K <= 8192, else 4. H100 sweep of 12 chunk x
    warps candidates on the DeepSeek-V3 shapes, % of the memory floor: 2112x7168 59 (8 KB, 1 row, 8
    warps; 32 KB chunks 47-50), 4096x7168 70, 7168x16384 97 (16 KB, 1 row, 4 warps), 7168x2048 64
    (8 KB = 4 rows, 4 warps; 8 warps 57)."""
    cfg = gemv_config(m, n, k, chunk_bytes=16384 if k > 8192 else 8192, num_warps=4)
    if cfg.block_n == 1 and k <= 8192:
        cfg = replace(cfg, num_warps=8)
    return cfg


def _splits(tiles: int, nk: int, max_units: int) -> list[int]:
    """Distinct launched split counts from SPLITS with >= MIN_KB_PER_SPLIT blocks per range and
    tiles x split <= max_units (split 1 always)."""
    out = [1]
    for s in SPLITS[1:]:
        launched, per = split_plan_kb(nk, s)
        if launched <= 1 or launched in out or per < MIN_KB_PER_SPLIT or tiles * launched > max_units:
            continue
        out.append(launched)
    return out


def _tail_split(tiles: int, nk: int, sms: int) -> int:
    """Tail split of a wide launch with a partial last wave: the last wave's tiles cut into as many
    K ranges (from SPLITS) as still fit one wave, each >= MIN_KB_PER_SPLIT blocks; 1 if none."""
    full = (tiles // sms) * sms
    tail = tiles - full
    if full == 0 or tail == 0:
        return 1
    best = 1
    for s in SPLITS[1:]:
        launched, per = split_plan_kb(nk, s)
        if tail * launched <= sms and per >= MIN_KB_PER_SPLIT and launched > best:
            best = launched
    return best


def fp8_candidates(p: Problem, dev: DeviceInfo, *, hopper: bool = True, gemv: bool = True,
                   portable: bool = True, dequant: bool = True) -> list:
    """Every configuration the planner considers for fp8_block x fp8_block (quantized A) on sm_90."""
    m, n, k = p.m, p.n, p.k
    nk = max(1, _cdiv(k, 128))
    sms = dev.sm_count
    out = []
    if gemv and m == 1 and p.b_block_rows in (1, 128) and k > 0:
        out.append(gemv_for(m, n, k))
    if hopper and p.tma and not p.bias and p.b_block_rows == 128 and k > 0:
        if m <= 64:
            bm = max(8, 1 << max(0, (m - 1).bit_length()))
            for bn in (64, 128):
                tiles = _cdiv(n, bn)
                for s in _splits(tiles, nk, SKINNY_PROGRAMS_PER_SM * sms):
                    out.append(HopperConfig("skinny", block_m=bm, block_n=bn, num_warps=4,
                                            stages=skinny_stages(bm, bn, dev.smem_bytes), split_k=s))
        group_m = SHORT_K_GROUP_M if nk <= SHORT_K_MAX_KB else 8
        for bm, bn in ((64, 128), (128, 128), (128, 256)):
            if bm == 64 and m > 1024:
                continue
            tiles = _cdiv(m, bm) * _cdiv(n, bn)
            base = HopperConfig("wide", block_m=bm, block_n=bn, num_warps=bm // 16, stages=2, epilogue="tma",
                                group_m=group_m)
            if tiles < sms:
                # no split-K of 128x256 tiles: at the same unit count they measured 10-60% slower than
                # split 128x128 tiles on every H100 row tried (57-row spread-reduction sweep, and the
                # planner validation sweep: e.g. M=256 8192x8192 split 2 47.3 us vs 128x128 34.9)
                for s in (_splits(tiles, nk, sms) if bn == 128 else [1]):
                    out.append(hopper_fill_stages(replace(base, split_k=s), p.out_bytes, smem=dev.smem_bytes))
            else:
                out.append(hopper_fill_stages(base, p.out_bytes, smem=dev.smem_bytes))
                ts = _tail_split(tiles, nk, sms)
                # no tail split where the compiler cannot vectorise the output's stores (N % 16 != 0:
                # ops/_hopper.py, _masked_epi): its spread reduction then stores scalars. H200, 3125 x
                # 3071 x 1472, 128x256: tail split 3 56.8 us (4 outputs per thread), 54.3 with one per
                # thread (wide.py, spread_vec), against 41.8 unsplit; N = 3072: 37.1 / 35.9; N = 2104:
                # 68.8 against 26.0 unsplit (benchmarks/NOTES.md, thirty-fifth and thirty-sixth
                # sessions). Split-K of every tile stays: at small M it was the best measured
                # candidate there (89 x 308 x 18752: 11.9 us against 45.8 unsplit, H200).
                if ts > 1 and n % 16 == 0:
                    out.append(hopper_fill_stages(replace(base, tail_split=ts), p.out_bytes, smem=dev.smem_bytes))
    if portable:
        tiles_list = []
        if m <= 32:
            rows = 16 if m <= 16 else 32
            tiles_list += [(rows, 64, True), (rows, 128, True)]
        if m <= 128:
            tiles_list += [(64, 64, False), (64, 128, False)]
        # 128-row tiles at every M: a candidate of a larger M stays a candidate of every smaller M
        tiles_list += [(128, 64, False), (128, 128, False)]
        for bm, bn, swap in tiles_list:
            warps = 8 if bm * bn >= 128 * 128 else 4
            stages = 3 if bm * bn >= 128 * 128 else 4
            tiles = _cdiv(m, bm) * _cdiv(n, bn)
            cfg = GemmConfig(bm, bn, 128, warps, stages, 1, "triton", True, 8, swap)
            slots = sms * programs_per_sm(cfg, "fp8_block", 0, True, dev)
            for s in _splits(tiles, nk, PORTABLE_MAX_ROUNDS * slots):
                out.append(replace(cfg, split_k=s))
    if dequant and p.out_dtype != "float32" and m > 0 and k > 0:
        out.append(GemmConfig(strategy="dequant_matmul"))
    return out


def _rank(p: Problem, dev: DeviceInfo, cands: list):
    cal = load_calibration(dev.name, dev.sm_count, dev.mem_bw)
    scored = []
    for c in cands:
        e = predict_us(c, p.fmt, p.m, p.n, p.k, dev, cal, a_dense_bytes=p.a_dense_bytes,
                       out_bytes=p.out_bytes, promote=True, b_scale_rows=p.b_block_rows)
        scored.append((e.us, c, e))
    scored.sort(key=lambda t: t[0])
    return scored, cal


def hopper_takes(p: Problem, dev: DeviceInfo, gluon_ok: bool = True) -> bool:
    """The sm_90 Gluon kernels can take this dense fp8_block x fp8_block problem: a Hopper GPU whose
    Gluon kernels build, TMA-describable operands, no bias, 128x128 weight blocks, K > 0."""
    return (dev.is_hopper and gluon_ok and p.fmt == "fp8_block" and not p.weight_only and p.tma and not p.bias
            and p.b_block_rows == 128 and p.k > 0)


def ranked_candidates(p: Problem, dev: DeviceInfo, *, gluon_ok: bool = True) -> list[tuple[float, object]]:
    """(predicted us, config) of every candidate of ``p`` (fp8_block x fp8_block on sm_90) that
    ``plan_gemm`` ranks, the cost model's fastest first: what ``blockscaled.tune`` times the head of."""
    return [(t, c) for t, c, _ in _rank(p, dev, fp8_candidates(p, dev, hopper=hopper_takes(p, dev, gluon_ok)))[0]]


def plan_fp8(p: Problem, dev: DeviceInfo, *, hopper: bool = True, forced_strategy: str | None = None) -> Plan:
    """The cost model's choice for fp8_block x fp8_block on sm_90."""
    kinds = dict(hopper=hopper, gemv=True, portable=True, dequant=True)
    if forced_strategy is not None:
        kinds = {k: False for k in kinds}
        kinds[{"hopper": "hopper", "gemv": "gemv", "triton": "portable", "dequant_matmul": "dequant"}[forced_strategy]] = True
    cands = fp8_candidates(p, dev, **kinds)
    if not cands:  # e.g. forced hopper where TMA cannot take the operands
        cands = fp8_candidates(p, dev, hopper=False, gemv=False, dequant=False)
    scored, cal = _rank(p, dev, cands)
    t, best, est = scored[0]
    tuned_why = None
    entry = _tuned.lookup(p, dev) if forced_strategy is None else None
    if entry is not None:
        try:
            want = config_from_key(entry["config"])
            model_desc = Plan("gemm", "cuda", config_from_key(entry["model_config"])).describe()
        except (KeyError, TypeError, ValueError):  # written by another version: fields it lacks or adds
            want = model_desc = None
        hit = next((s for s in scored if s[1] == want), None) if want is not None else None
        if hit is None:
            tuned_why = ("a tuned plan is stored for this problem but is not among today's candidates "
                         "(another library version?): the cost model's pick runs")
        else:
            model_t = ("failed its correctness check" if entry["model_us"] is None
                       else f"measured {entry['model_us']:.1f} us")
            tuned_why = (f"tuned on this GPU ({entry['date']}): the fastest of {entry['timed']} timed candidates, "
                         f"{entry['us']:.1f} us; the cost model's pick ({model_desc}) {model_t}")
            t, best, est = hit
    plan_ = Plan("gemm", "cuda", best)
    reasons = [
        f"fp8_block x fp8_block on sm_90: {len(scored)} candidates ranked by the cost model "
        f"(constants: {cal.source})",
        f"chosen: {est.describe()}",
    ]
    if tuned_why is not None:
        reasons.insert(1, tuned_why)
    pad = pad_words(p.n, p.k, p.out_bytes) if isinstance(best, GemmConfig) and best.strategy == "dequant_matmul" else ""
    if pad:
        reasons.append(pad)
    if not hopper:
        reasons.append("the Hopper kernels cannot take these operands (bias, 1x128 weight blocks, "
                       "or a stride / base address TMA cannot describe)")
    if forced_strategy is not None:
        reasons.append(f"strategy forced to {forced_strategy!r} by config=")
    alts = []
    for u, c, _ in scored:
        if c == best:
            continue
        d = Plan("gemm", "cuda", c).describe()
        if d != plan_.describe():
            alts.append((d, u))
    return replace(plan_, problem=p, predicted_us=t, reasons=tuple(reasons), alternatives=tuple(alts[:6]))
