"""Portable-kernel rules: tiles, K split and the dequantize + cuBLAS roofline for the calls the
cost model does not plan (MX/NV formats, weight-only GEMMs, GPUs other than sm_90, the CPU
interpreter; fp8_block elsewhere than sm_90). plan/gemm.py calls :func:`choose_portable`.

Strategies it returns: ``"triton"`` (the portable block-scaled kernel, kernels/triton/gemm.py) or
``"dequant_matmul"`` (dequantize both operands with our Triton kernel, then cuBLAS bf16). On sm_90
MX/NV take dequantize + cuBLAS where the roofline below predicts it faster: a plain Triton MX
kernel is instruction-bound at about 220 TFLOP/s while cuBLAS bf16 on pre-dequantized operands
runs at about 750, and the dequantization costs one pass over the operands at 3 TB/s
(docs/design.md, "Measurements older than NOTES.md").
"""

from __future__ import annotations

import functools
import math

import torch

from .._experimental import mx_kernel_enabled
from ..config.gemm import GemmConfig
from ..formats import FORMATS
from .device import DeviceInfo
from .splits import split_counts as _split_counts

__all__ = ["choose_portable", "default_promote", "small_m_model", "mx_bf16_applies", "mx_bf16_config",
           "mx_bf16_tile", "mx_bf16_split", "MX_BF16_TILES"]

#: elements sharing one scale along K, bytes per element of packed data, bytes per scale
_SCALE_K = {f.name: f.block_k for f in FORMATS.values()}
_ELEM_BYTES = {f.name: f.elem_bytes for f in FORMATS.values()}
_SCALE_BYTES = {f.name: f.scale_bytes for f in FORMATS.values()}


# Roofline constants for the strategy model, H100 SXM, measured before benchmarks/NOTES.md was
# started (docs/design.md, "Measurements older than NOTES.md"):
#: copy bandwidth, bytes/s (measured 3.0 TB/s)
_BW = 3.0e12
#: cuBLAS bf16 on dequantized operands at large M (measured 735-785 TFLOP/s at M = 4096)
_BF16_FLOPS = 750e12
#: plain Triton MX/NV kernel, bf16 upcast or per-32 promotion (measured 197-248 TFLOP/s at M = 4096)
_TRITON_MX_FLOPS = 220e12
#: Triton fp8_block kernel (128x128x128 tile, 8 warps, 3-4 stages), fitted to the H100 run at
#: M = 4096 (TFLOP/s, Triton vs dequantize + cuBLAS bf16, both eager via do_bench):
#:   N x K = 2112x7168 554 vs 565, 24576x1536 600 vs 644, 32768x512 404 vs 554,
#:           7168x16384 655 vs 659, 4096x7168 654 vs 629, 7168x2048 577 vs ~570.
#: Model: rate = _TRITON_FP8_FLOPS * kiter / (kiter + _TRITON_FP8_KOVH). It reproduces five rows
#: within -2%..+8% (K=512: 403 predicted vs 404; K=2048: 577 vs 577; K=16384: 661 vs 655;
#: K=1536: 551 vs 600); 2112x7168 (644 vs 554) loses ~18% to wave quantization (544 tiles =
#: 4.1 waves on 132 SMs), which is not modelled: cuBLAS quantizes too, and the model was fitted
#: at M = 4096 only. Other tiles (128x256, 256x128, 4 warps, 64x256) measured 2-5x slower, so
#: the tile is fixed.
_TRITON_FP8_FLOPS = 675e12
#: per-tile prologue/epilogue cost in K iterations (fitted: K=512 vs K=16384 rows above)
_TRITON_FP8_KOVH = 2.7
#: fp8_block takes dequant_matmul only when the model predicts it >= 10% faster: bf16 operands
#: cost accuracy (fp32-scaled values rounded to 2**-9). The model's t_dq / t_triton for the six
#: rows above: 0.73 (32768x512) and 0.87 (24576x1536), where dequant+matmul measured 37% and 7%
#: faster, vs 0.92 (7168x2048), 0.99-1.01 (K >= 7168 square-ish) and 1.13 (2112x7168) for the
#: four rows where Triton was within 2% or faster.
_FP8_DEQUANT_MARGIN = 0.9
#: fp8_block 128x128 tiles: 3 pipeline stages (3 vs 4 measured within noise on all six rows;
#: 3 uses 34 KB less shared memory and fills the pipeline sooner at short K).
_FP8_LARGE_TILE_STAGES = 3


def default_promote(fmt: str, m: int, a_dtype: torch.dtype | None) -> bool:
    """Whether scales are applied after the dot (per K chunk) by default.

    fp8_block: always (fp32 scales are not exact in bf16; DeepSeek promotion). Weight-only with
    fp16 activations: always (scaled B values can leave fp16's range; raw e4m3/e2m1 values are
    exact in fp16). nvfp4 with quantized A: never (FP8 wgmma needs K >= 32 > 16-element blocks).
    mxfp8/mxfp4 with quantized A: at M <= 128 (H100, docs/design.md, "Measurements older than
    NOTES.md": per-32 FP8 promotion 112 vs bf16 upcast 87 TFLOP/s at M=128, 46 vs 36 at M=64;
    about equal at M=4096). Weight-only bf16:
    never (dequantize B to bf16, exact, long K chunks)."""
    if fmt == "fp8_block":
        return True
    if a_dtype is not None:  # weight-only
        return a_dtype == torch.float16
    if fmt == "nvfp4":
        return False
    return m <= 128


def _stages(block_m, block_n, block_k, fmt, a_dense_bytes, promote, smem) -> int:
    """Pipeline depth from the shared-memory budget: each stage holds the A and B chunks and
    their scales; dequantizing kernels also need a bf16 copy of the operands for the MMA."""
    a_b = a_dense_bytes if a_dense_bytes else _ELEM_BYTES[fmt]
    sk = _SCALE_K[fmt]
    scale_cols = max(1, block_k // sk)
    per_stage = block_m * block_k * a_b + block_n * block_k * _ELEM_BYTES[fmt]
    per_stage += (block_m + block_n) * scale_cols * _SCALE_BYTES[fmt]
    fixed = 0 if promote else (block_m + block_n) * block_k * 2
    fixed += block_m * block_n * 4 // 2  # epilogue layout conversion scratch (conservative)
    budget = smem - 4096 - fixed
    return int(max(2, min(4, budget // per_stage)))


@functools.lru_cache(maxsize=4096)
def choose_portable(fmt: str, m: int, n: int, k: int, info: DeviceInfo, a_dtype, out_dtype, *,
                    mx_bf16: bool = True) -> GemmConfig:
    """The portable kernel's configuration (or dequantize + cuBLAS) for ``[m, k] @ [n, k].T`` in
    ``fmt`` (``a_dtype``: the dense activation dtype of a weight-only GEMM, else None). Pure and
    cached. ``mx_bf16=False``: without the MX/NV bf16-tile rules (:func:`mx_bf16_config`), i.e. the
    plans before them (scripts/sweeps/mx_tiles.py times both)."""
    if mx_bf16 and mx_bf16_applies(fmt, m, info, a_dtype):
        if _mx_bf16_dequant(fmt, m, n, k, info, a_dtype, out_dtype):
            return GemmConfig(strategy="dequant_matmul")
        return mx_bf16_config(fmt, m, n, k, info, a_dtype is not None)
    if _use_dequant_matmul(fmt, m, n, k, info, a_dtype, out_dtype):
        return GemmConfig(strategy="dequant_matmul")

    promote = default_promote(fmt, m, a_dtype)
    # Tile rows: small-M (decode) tiles so that tensor-core work is not wasted on padding;
    # 16 is the smallest tl.dot M.
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64 if m <= 64 else 128
    block_n = 128
    if promote:
        block_k = min(128, _SCALE_K[fmt])
    else:
        block_k = 128
    if promote and a_dtype is None and info.capability >= (9, 0):
        # FP8 dots: below 64 rows Triton falls back to mma.sync, which on sm_90 upcasts the
        # FP8 tiles to fp16 first (seen in the PTX: mma...f16.f16); a 64-row wgmma tile reads
        # FP8 straight from shared memory. Padded rows are free at small M (memory-bound).
        block_m = max(block_m, 64)
    if info.kind == "cpu":
        # Interpreter: cost is per program and per op, not per FLOP; small tiles keep the
        # CPU suite fast on tiny shapes.
        block_m = 16 if m <= 16 else 32 if m <= 32 else 64
        block_n = 32 if n <= 32 else 64
        return GemmConfig(block_m, block_n, block_k, 4, 1, 1, "triton", promote, 8)
    if m <= _SMALL_M_MAX:
        return _choose_small_m(fmt, m, n, k, info, a_dtype, promote, block_m, block_k)
    # Waves: with fewer tiles than SMs, halve BLOCK_N (down to 64), then split K.
    tiles = math.ceil(m / block_m) * math.ceil(n / block_n)
    if tiles < info.sm_count and block_n > 64:
        block_n = 64
        tiles = math.ceil(m / block_m) * math.ceil(n / block_n)
    split_k = 1
    kiters = math.ceil(k / block_k)
    if tiles * 2 <= info.sm_count and kiters >= 16:
        # Fill about one wave, keeping >= 8 K chunks per split so the pipeline still runs.
        split_k = max(1, min(info.sm_count // tiles, kiters // 8, 16))
    num_warps = 8 if block_m * block_n >= 128 * 128 else 4
    a_dense_bytes = 0 if a_dtype is None else 2
    num_stages = _stages(block_m, block_n, block_k, fmt, a_dense_bytes, promote, info.smem_bytes)
    if fmt == "fp8_block" and a_dtype is None and block_m == 128:
        num_stages = min(num_stages, _FP8_LARGE_TILE_STAGES)
    return GemmConfig(block_m, block_n, block_k, num_warps, num_stages, split_k, "triton", promote, 8)


# ---------------------------------------------------------------------------- small M
# Decode / small prefill (M <= _SMALL_M_MAX) is memory-bound: the floor is (A + B + scales +
# output bytes) / 3.0 TB/s, 5-40 us on the DeepSeek-V3 shapes. What limits the portable kernel
# there is not MMA throughput but (1) memory-level parallelism: Little's law at 3.0 TB/s and
# ~1-2 us loaded DRAM latency needs several MB in flight; each CTA keeps (num_stages - 1) B
# chunks in flight (cp.async pipeline), so enough programs (tiles x K splits) must be resident;
# (2) extra traffic: split-K fp32 partials (fused reduction, kernels/triton/gemm.py) grow with
# M x N x splits, and every N tile re-reads its A rows from L2 (M x K bytes per tile: at M=128,
# K=7168, 64-wide tiles that is twice B's bytes through L2). _choose_small_m enumerates tile
# widths and split counts and takes the smallest modelled time
#     t = max(DRAM bytes / (BW * min(1, bytes in flight / (BW * latency))), L2 bytes / L2 BW)
#         + the last split's serial read of the other partials (tail).
# H100 before these rules (CUDA-graph medians, % of the memory floor, fp8_block, six shapes):
# M=1 45-71 %, M=64 39-71 %, M=128 32-63 % with 132 programs per launch and a second reduce
# launch. NOT MEASURED YET: the constants below are analytic first guesses; the H100 sweep
# scripts/sweeps/ab.py times these choices against others (variant "portable@...").

#: rows up to which the small-M model applies (the measured decode / small-prefill range; from
#: M = 256 on, FLOPs start to matter: 2112x7168 at M=256 is ~13 us of MMA at 600 TFLOP/s)
_SMALL_M_MAX = 128
#: loaded DRAM latency (s) for the in-flight target BW x latency = 6 MB (~45 KB per SM):
#: ~1 us is the H100's idle latency; 2 us because the measured 132-program launches with
#: ~24 KB in flight each (3.2 MB) reached only 45-70 % of the floor
_SMALL_M_LATENCY = 2.0e-6
#: L2 -> SM bandwidth, bytes/s (H100 SXM: ~5.5 TB/s published microbenchmarks, not measured here)
_L2_BW = 5.5e12
#: DRAM bytes per byte of split-K partial written (dirty lines are written back eventually;
#: the fused reduction reads them back from L2, counted in the L2 term)
_PARTIAL_DRAM = 1.0
#: one SM's L2 read bandwidth, bytes/s (~64 B/clk at ~1.7 GHz; a guess): the tile's last program
#: reads (split - 1) partial tiles alone at the end of the launch (the tail term of the model)
_SM_L2_BW = 1.0e11
#: B bytes each CTA should keep in flight -> num_stages (fp8 BLOCK_N=64 x BLOCK_K=128: 4 stages)
_SMALL_M_INFLIGHT = 24 * 1024
#: pipeline depth bounds: >= 3 so loads overlap at all; <= 6 (deeper rings only cost shared
#: memory, i.e. co-resident CTAs, once the in-flight target is met)
_SMALL_M_STAGES = (3, 6)
#: fewest K chunks per split: with 4 stages the first 3 chunks are the pipeline fill, so
#: shorter splits spend most of their time waiting for the first load
_SMALL_M_MIN_CHUNKS = 4
#: most K splits (the reducing program reads its tile's partials serially)
_SMALL_M_MAX_SPLIT = 16
#: swap-AB tiles (GemmConfig.swap_ab) for FP8 dots at M <= 32: the weight tile is the wgmma's
#: 64-row M side and 16/32 activation rows its N side, instead of padding A to 64 rows. sm_90
#: PTX (AOT): 16x64x128 fp8 tile, 4 stages: wgmma m64n16k32 e4m3, 40 KB shared, 56 registers
#: (unswapped 64x64: m64n64k32, 64 KB, 130-168 registers) -> more CTAs per SM, 4x less MMA work.
#: Not measured on a GPU yet: set False to fall back to the 64-row tiles.
_SMALL_M_SWAP_AB = True
#: registers per thread ~ _REG_BASE + accumulator registers (x2 with PROMOTE: the per-chunk
#: dot result is a second fp32 tile). Fitted to ptxas -v for sm_90 (fp8_block promote, 4 warps):
#: 64x64 130 regs, 64x128 232, 128x64 220; 8 warps 128x128 225 (formula: 164, 228, 228, 228)
_REG_BASE = 100


def _ctas_per_sm(block_m, block_n, block_k, num_warps, num_stages, fmt, a_dense_bytes, promote,
                 info: DeviceInfo) -> int:
    """Co-resident CTAs per SM, limited by shared memory (stages of A + B + scales, plus the
    dequantize path's bf16 operand copies) and by registers (64K 32-bit registers per SM)."""
    a_b = a_dense_bytes if a_dense_bytes else _ELEM_BYTES[fmt]
    scale_cols = max(1, block_k // _SCALE_K[fmt])
    per_stage = block_m * block_k * a_b + block_n * block_k * _ELEM_BYTES[fmt]
    per_stage += (block_m + block_n) * scale_cols * _SCALE_BYTES[fmt]
    smem = num_stages * per_stage + (0 if promote else (block_m + block_n) * block_k * 2) + 1024
    by_smem = (info.smem_bytes + 1024) // smem  # per-SM total = opt-in per-block max + 1 KB
    acc_regs = block_m * block_n // (32 * num_warps) * (2 if promote else 1)
    by_regs = 65536 // ((_REG_BASE + acc_regs) * 32 * num_warps)
    return int(max(1, min(by_smem, by_regs, 4)))


def small_m_model(fmt, m, n, k, info: DeviceInfo, a_dtype, promote, block_m, block_n, block_k, num_warps,
                  num_stages, split) -> float:
    """Modelled seconds of one small-M launch (see the comment block above); for the heuristic
    as the small-M sweep printed it next to the measured times (NOTES 2026-11-22)."""
    eb = _ELEM_BYTES[fmt]
    a_row = k * (2 if a_dtype is not None else eb)
    nk = math.ceil(k / _SCALE_K[fmt])
    b_bytes = n * k * eb + math.ceil(n / (128 if fmt == "fp8_block" else 1)) * nk * _SCALE_BYTES[fmt]
    a_bytes = m * (a_row + (0 if a_dtype is not None else nk * _SCALE_BYTES[fmt]))
    m_tiles, n_tiles = math.ceil(m / block_m), math.ceil(n / block_n)
    kiters = max(1, math.ceil(k / block_k))
    per = math.ceil(kiters / min(split, kiters))
    split = math.ceil(kiters / per)  # what the launcher runs (ops/gemm.py::_split_plan)
    partial = m * n * 4 * split if split > 1 else 0
    dram = a_bytes + b_bytes + m * n * 2 + _PARTIAL_DRAM * partial
    a_dense_bytes = 0 if a_dtype is None else 2
    occ = _ctas_per_sm(block_m, block_n, block_k, num_warps, num_stages, fmt, a_dense_bytes, promote, info)
    programs = min(m_tiles * n_tiles * split, occ * info.sm_count)
    inflight = programs * (min(num_stages, per + 1) - 1) * block_n * block_k * eb
    util = min(1.0, inflight / (_BW * _SMALL_M_LATENCY))
    l2 = a_bytes * n_tiles + b_bytes * m_tiles + 2 * partial + m * n * 2
    tail = (split - 1) * min(m, block_m) * min(n, block_n) * 4 / _SM_L2_BW
    return max(dram / (_BW * util), l2 / _L2_BW) + tail


#: fp8_block, 32 < M <= 128: 64-row tiles, BLOCK_N 128 only above this many 64x64 tiles. H100 sweep
#: (small-M sweep, 2026-11-22, % of the memory floor, CUDA-graph medians): 24576x1536
#: M=64 64x64 p384 74% vs 64x128 p192 69%; 32768x512 M=64 64x128 p256 65% vs 64x64 p512 56%.
_FP8_WIDE_N_TILES = 450


#: fewest K blocks per split for the fp8 row rule's tie-break towards more splits (H100 sweep,
#: benchmarks/NOTES.md 2026-11-22, "Portable split-K: the reducing program's loads": splits of
#: 14-64 blocks won their ties, 7 blocks lost)
_FP8_TIE_MIN_KB = 12

def _fp8_rows_rule(m, n, kiters, info: DeviceInfo, promote, max_split) -> GemmConfig:
    """fp8_block at 32 < M <= 128, fitted to the H100 sweep (the model above mis-ranked these:
    its picks reached 22-69% where the best measured 35-75%): 64x64x128 tiles (64x128 when there
    are more than _FP8_WIDE_N_TILES), 4 warps, 4 stages, and the K split (at most two waves of
    programs) whose program count fills the last wave best (programs / (waves * SMs)), the most
    splits on ties while each keeps >= _FP8_TIE_MIN_KB K blocks (split-K sweep with the
    grouped reduction loads, benchmarks/NOTES.md 2026-11-22, "Portable split-K: the reducing
    program's loads"; H100 us: 2112x7168 M=128 sk2 15.55 -> sk4 14.99, 4096x7168 M=64 sk2 18.76
    -> sk4 18.33, M=128 sk1 24.05 -> sk2 21.91, 7168x16384 M=64 sk1 60.03 -> sk2 52.29: all four
    ties went to the larger split; 2112x7168 M=64 sk4 12.80 vs sk8 (7 blocks) 14.77 did not).
    Before that (fewest splits on ties) it picked the sweep's best config for 2112x7168 (M=64 sk4,
    M=128 sk2), 4096x7168 M=64 sk2, 7168x2048, 24576x1536 M=64 and 32768x512; within 3-10% of it for
    4096x7168 M=128 (44 vs 47%), 7168x16384 M=64 (67 vs 75%); 7168x16384 M=128 is the worst (best
    128x128 sk2, 60%)."""
    mt = math.ceil(m / 64)
    block_n = 128 if mt * math.ceil(n / 64) > _FP8_WIDE_N_TILES else 64
    tiles = mt * math.ceil(n / block_n)
    best = (-1.0, 1)
    for split in _split_counts(kiters, max_split):
        p = tiles * split
        if split > 1 and p > 2 * info.sm_count:
            break  # more than two waves of split programs: the sweep's worst rows (sk8-sk16)
        util = p / (math.ceil(p / info.sm_count) * info.sm_count)
        longer = math.ceil(kiters / split) >= _FP8_TIE_MIN_KB  # ties: more splits if long enough
        if util > best[0] + 1e-9 or (util > best[0] - 1e-9 and longer):
            best = (util, split)
    return GemmConfig(64, block_n, 128, 4, 4, best[1], "triton", promote, 8, False)


def _choose_small_m(fmt, m, n, k, info: DeviceInfo, a_dtype, promote, block_m, block_k) -> GemmConfig:
    """Small-M (memory-bound) config on a GPU: the smallest small_m_model time over BLOCK_N in
    (64, 128), BLOCK_M in (the row rule's, 64 instead of 128: two M tiles share B through L2),
    swap-AB tiles first where FP8 dots would pad A to 64 rows (_SMALL_M_SWAP_AB), stages from
    _SMALL_M_INFLIGHT, 4 warps (8 for 128x128: the promote path's two fp32 tiles need 256
    registers per thread at 4 warps) and K splits that keep >= _SMALL_M_MIN_CHUNKS chunks each;
    ties go to the first candidate (swap-AB, narrow tiles, fewer splits)."""
    kiters = max(1, math.ceil(k / block_k))
    max_split = max(1, min(_SMALL_M_MAX_SPLIT, kiters // _SMALL_M_MIN_CHUNKS))
    rows = 16 if m <= 16 else 32 if m <= 32 else 64 if m <= 64 else 128
    if fmt == "fp8_block" and a_dtype is None and m > 32 and block_k == 128:
        return _fp8_rows_rule(m, n, kiters, info, promote, max_split)
    tiles = [(block_m, False)] + ([(64, False)] if block_m == 128 else [])
    if _SMALL_M_SWAP_AB and rows < block_m and promote and a_dtype is None:
        # block_m was raised to 64 for the FP8 wgmma: swap instead (weight rows fill the MMA's M)
        tiles.insert(0, (rows, True))
    best = None
    for bm, swap in tiles:
        for block_n in (64, 128):
            if swap and fmt == "fp8_block" and 128 % block_n:
                continue
            warps = 8 if bm * block_n >= 128 * 128 else 4
            stage_b = block_n * block_k * _ELEM_BYTES[fmt]
            stages = min(max(1 + math.ceil(_SMALL_M_INFLIGHT / stage_b), _SMALL_M_STAGES[0]), _SMALL_M_STAGES[1])
            for split in _split_counts(kiters, max_split):
                t = small_m_model(fmt, m, n, k, info, a_dtype, promote, bm, block_n, block_k, warps, stages, split)
                if best is None or t < best[0] * (1 - 1e-9):
                    best = (t, bm, swap, block_n, warps, stages, split)
    _, bm, swap, block_n, warps, stages, split = best
    return GemmConfig(bm, block_n, block_k, warps, stages, split, "triton", promote, 8, swap)


# ---------------------------------------------------------------------------- MX/NV bf16 tiles
# MX/NV GEMMs (quantized or bf16 activations) at MX_BF16_M_MIN < M <= MX_BF16_M_MAX on sm_90: the
# portable kernel dequantizes the weight (and a quantized A) straight to bf16 in registers
# (kernels/triton/_mma.py: fp4 bit patterns, packed bf16 scale multiplies) and runs bf16 wgmma;
# swap-AB tiles make the weight the wgmma's 64-row M side and its register operand, so 16-32
# activation rows are not padded to 64. sm_90 PTX per weight element of the K loop fell from
# 15.8-32.3 to 4.6-10.7 (tests/test_mx_tiles_aot.py). The constants below are NOT MEASURED YET:
# analytic first choices; scripts/sweeps/mx_tiles.py times them (and the plans before them,
# dequantize + cuBLAS, cuBLAS on bf16 weights) on the H100 and prints the measured table to set
# here (its "rules" block: one line per constant, named after the sweep row it comes from).

#: rows above which the rules apply (M <= 8: the decode GEMV's rules)
MX_BF16_M_MIN = 8
#: whether the rules below apply at all (blockscaled._experimental, "bf16"); tests patch it
MX_BF16_ENABLED = mx_kernel_enabled("bf16")
#: rows up to which they apply (the sweep measures M = 16, 64, 256, 2048)
MX_BF16_M_MAX = 512
#: (format, mode, rows up to) -> tile class ``(swap_ab, block_m cap, block_n, block_k, num_warps,
#: num_stages)``; mode "wxa" (quantized A) or "wo" (bf16 A, weight-only); swap-AB tiles take
#: block_m = the power of two >= M, at least 16, at most the cap, others the cap. NOT MEASURED YET
#: (analytic): swap-AB 16 / 32-row tiles up to M = 32 (no padded rows; the weight is the wgmma's
#: register operand), 64x128 at M <= 64 (the fewest instructions per weight element among the
#: AOT-counted tiles: 4.6-7.3 PTX), 128x128 with 8 warps above (one warpgroup per 64 rows).
MX_BF16_TILES: dict[tuple[str, str, int], tuple[bool, int, int, int, int, int]] = {
    (fmt, mode, rows): tile
    for fmt in ("mxfp8", "mxfp4", "nvfp4") for mode in ("wxa", "wo")
    for rows, tile in ((32, (True, 32, 128, 128, 4, 4)), (64, (False, 64, 128, 128, 4, 4)),
                       (MX_BF16_M_MAX, (False, 128, 128, 128, 8, 3)))
}
#: fewest K chunks per split (a split shorter than the ring spends most of its time filling it).
#: NOT MEASURED YET: 4, as _SMALL_M_MIN_CHUNKS.
MX_BF16_MIN_CHUNKS = 4
#: K splits the rules use: each is a separate compile (SPLIT_K is a constexpr), so the set is short
#: (as plan.dense.SPLITS). A choice, not measured.
MX_BF16_SPLITS = (1, 2, 4, 8, 16)
#: programs per SM the K split aims for (tiles x split <= this x SMs). NOT MEASURED YET: 2, the
#: resident CTAs per SM that ptxas's register counts allow (sm_90, tests/test_mx_tiles_aot.py:
#: 152-255 registers x 128 threads -> 2-3 CTAs of the 4-warp tiles); the sweep times 1, 2 and 4.
MX_BF16_PROGRAMS_PER_SM = 2
#: (format, mode) -> M from which dequantize + cuBLAS runs instead (measured crossovers, from the
#: sweep's "dequant" rows). Empty = NOT MEASURED YET: the roofline of _use_dequant_matmul decides,
#: with _TRITON_MX_FLOPS (the kernel before the bf16 tiles) as the portable kernel's rate.
MX_BF16_DEQUANT_M: dict[tuple[str, str], int] = {}


def mx_bf16_applies(fmt: str, m: int, info: DeviceInfo, a_dtype) -> bool:
    """Whether :func:`mx_bf16_config` plans this call: an MX/NV format on a CUDA sm_90+ GPU, quantized
    or bf16 activations (fp16 ones need the promote path), MX_BF16_M_MIN < M <= MX_BF16_M_MAX, and
    the bf16 kernels switched on (``BLOCKSCALED_MX_KERNELS``: blockscaled._experimental; off until
    they have run on a GPU)."""
    if not MX_BF16_ENABLED:
        return False
    return (fmt in ("mxfp8", "mxfp4", "nvfp4") and info.kind == "cuda" and info.capability >= (9, 0)
            and a_dtype in (None, torch.bfloat16) and MX_BF16_M_MIN < m <= MX_BF16_M_MAX)


def mx_bf16_tile(fmt: str, m: int, weight_only: bool) -> tuple[bool, int, int, int, int, int]:
    """The MX_BF16_TILES entry of the smallest bucket holding ``m`` (rows up to)."""
    mode = "wo" if weight_only else "wxa"
    buckets = sorted(r for (f, md, r) in MX_BF16_TILES if f == fmt and md == mode)
    rows = next((r for r in buckets if m <= r), buckets[-1])
    return MX_BF16_TILES[(fmt, mode, rows)]


def mx_bf16_split(m: int, n: int, k: int, sm_count: int, block_m: int, block_n: int, block_k: int,
                  programs_per_sm: int | None = None) -> int:
    """K split of a bf16 tile: the most splits (launched counts from MX_BF16_SPLITS) with
    tiles x split <= programs_per_sm (default MX_BF16_PROGRAMS_PER_SM) x SMs, each split keeping
    >= MX_BF16_MIN_CHUNKS chunks of block_k."""
    per_sm = MX_BF16_PROGRAMS_PER_SM if programs_per_sm is None else programs_per_sm
    kiters = max(1, math.ceil(k / block_k))
    tiles = math.ceil(m / block_m) * math.ceil(n / block_n)
    best = 1
    for split in _split_counts(kiters, max(1, min(_SMALL_M_MAX_SPLIT, kiters // MX_BF16_MIN_CHUNKS))):
        if split in MX_BF16_SPLITS and tiles * split <= per_sm * sm_count:
            best = split
    return best


def mx_bf16_config(fmt: str, m: int, n: int, k: int, info: DeviceInfo, weight_only: bool, tile=None,
                   programs_per_sm: int | None = None) -> GemmConfig:
    """The bf16-dequantizing portable config of an MX/NV GEMM: ``tile`` (a MX_BF16_TILES value;
    default: the table's for ``m``; swap-AB tiles get block_m = the power of two >= M, >= 16, <= the
    cap, other tiles the cap) and the K split of :func:`mx_bf16_split`; promote=False (the bf16 path)."""
    swap, bm_cap, bn, bk, warps, stages = tile or mx_bf16_tile(fmt, m, weight_only)
    # swap-AB: the activation rows are the wgmma's N side (any multiple of 8): fit them to M; other
    # tiles keep their rows (the wgmma's M side, 64 per warpgroup)
    bm = min(bm_cap, max(16, 1 << max(0, (m - 1).bit_length()))) if swap else bm_cap
    split = mx_bf16_split(m, n, k, info.sm_count, bm, bn, bk, programs_per_sm)
    return GemmConfig(bm, bn, bk, warps, stages, split, "triton", False, 8, swap)


def _mx_bf16_dequant(fmt, m, n, k, info: DeviceInfo, a_dtype, out_dtype) -> bool:
    """dequantize + cuBLAS for an MX/NV call the bf16 rules cover: from the measured crossover
    (MX_BF16_DEQUANT_M) where there is one, else the roofline."""
    at = MX_BF16_DEQUANT_M.get((fmt, "wo" if a_dtype is not None else "wxa"))
    if at is not None:
        return m >= at
    return _use_dequant_matmul(fmt, m, n, k, info, a_dtype, out_dtype)


def _use_dequant_matmul(fmt, m, n, k, info: DeviceInfo, a_dtype, out_dtype) -> bool:
    """Roofline model: t(Triton kernel) vs t(dequantize both operands) + t(cuBLAS bf16)."""
    if info.kind != "cuda" or info.capability[0] != 9 or m == 0:
        return False
    if fmt == "fp8_block" and (a_dtype is None and out_dtype == torch.float32):
        return False  # bf16 operands would not meet the fp32-output tolerance
    flops = 2.0 * m * n * k
    eb = _ELEM_BYTES[fmt]
    a_packed = m * k * (2 if a_dtype is not None else eb)
    b_packed = n * k * eb
    if fmt == "fp8_block":  # weight-only here: quantized fp8_block on sm_90 is the cost model's (plan/dense.py)
        kiters = max(1, math.ceil(k / 128))
        rate = _TRITON_FP8_FLOPS * kiters / (kiters + _TRITON_FP8_KOVH)
        bf16_rate = _BF16_FLOPS
    else:
        rate = _TRITON_MX_FLOPS
        bf16_rate = _BF16_FLOPS
    t_triton = max(flops / rate, (a_packed + b_packed + m * n * 2) / _BW)
    # dequantize: read packed, write bf16 (A only when quantized); matmul reads bf16, writes out
    dq_bytes = b_packed + n * k * 2 + (0 if a_dtype is not None else a_packed + m * k * 2)
    t_dq = dq_bytes / _BW + max(flops / bf16_rate, ((m + n) * k * 2 + m * n * 2) / _BW)
    if fmt == "fp8_block":
        return t_dq < _FP8_DEQUANT_MARGIN * t_triton
    return t_dq < t_triton
