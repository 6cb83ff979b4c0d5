"""GEMM configuration: a frozen GemmConfig and the analytic heuristic that picks one.

The heuristic enumerates nothing it cannot explain: every choice below is one rule with its
reason. Tests force any variant with ``gemm(..., config=GemmConfig(...))``.

Strategies
----------
``"triton"``: the portable block-scaled Triton kernel (``kernels/triton/gemm.py``).
``"dequant_matmul"``: dequantize both operands to bf16 with our Triton dequantize kernel
(``blockscaled.ops.quantize.dequantize``), then ``torch.matmul`` (cuBLAS). Rule: chosen on
Hopper (sm_90) for MX/NV formats and weight-only GEMMs whenever the roofline model below
predicts it faster than the Triton kernel; in practice from M of a few hundred up. Reason
(design.md section 7, run C, H100): a plain Triton MX kernel is instruction-bound at about
220 TFLOP/s while cuBLAS bf16 on pre-dequantized operands runs at about 750, and the
dequantization costs only one pass over the operands at 3 TB/s. The issue's bar ("no op slower
than dequantize + torch.matmul at M = 4096") is met by construction for these formats.
fp8_block keeps the Triton FP8 kernel (FP8 wgmma; H100 at M = 4096: 554-655 TFLOP/s on the
DeepSeek-V3 shapes, see _TRITON_FP8_FLOPS) except where the model predicts dequantize + cuBLAS
bf16 at least 10% faster: short K (measured at M = 4096: K = 512 404 vs 554 TFLOP/s, K = 1536
600 vs 644).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch

__all__ = ["GemmConfig", "choose_gemm_config", "STRATEGIES", "DeviceInfo", "device_info"]

STRATEGIES = ("triton", "dequant_matmul", "hopper")

#: fp8_block x fp8_block on sm_90 takes the Gluon TMA/wgmma kernels (ops/_hopper.py) from this
#: many rows on. H100, bf16 out, do_bench medians (scripts/hopper_check.py, 2026-11-22): at
#: M=4096 the Hopper kernels beat the portable kernel on all six DeepSeek-V3 shapes (690-870 vs
#: 559-679 TFLOP/s); at M=128 the portable kernel was faster on all six. The crossover between
#: 128 and 4096 is not measured yet; 1024 is a guess on the safe side of it.
HOPPER_MIN_M = 1024
#: Hopper variant by K: the non-persistent "tma" kernel won at K >= 7168 (691/870/830 vs
#: ws+overlap 635/774/780), the warp-specialized one with overlap at K <= 2048 (743/583/731 vs
#: 688/433/718). Same measurement as HOPPER_MIN_M.
HOPPER_TMA_MIN_K = 4096

#: elements sharing one scale along K
_SCALE_K = {"fp8_block": 128, "mxfp8": 32, "mxfp4": 32, "nvfp4": 16}
#: bytes per element of packed data
_ELEM_BYTES = {"fp8_block": 1.0, "mxfp8": 1.0, "mxfp4": 0.5, "nvfp4": 0.5}
#: scale bytes per scale
_SCALE_BYTES = {"fp8_block": 4, "mxfp8": 1, "mxfp4": 1, "nvfp4": 1}

# Roofline constants for the strategy model, H100 SXM, design.md section 7:
#: copy bandwidth, bytes/s (measured 3.0 TB/s)
_BW = 3.0e12
#: cuBLAS bf16 on dequantized operands at large M (run C: 735-785 TFLOP/s)
_BF16_FLOPS = 750e12
#: plain Triton MX/NV kernel, bf16 upcast or per-32 promotion (run C: 197-248 TFLOP/s)
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
#: cuBLAS bf16 efficiency drop at short K (implied by the dequant+matmul rows above after
#: removing the dequantization at 3 TB/s: ~600 TFLOP/s at K=512, ~710-750 at K >= 1536):
#: rate = _BF16_FLOPS_FP8_MODEL * K / (K + _BF16_K_HALF)
_BF16_FLOPS_FP8_MODEL = 760e12
_BF16_K_HALF = 136
#: fp8_block takes dequant_matmul only when the model predicts it >= 10% faster: bf16 operands
#: cost accuracy (fp32-scaled values rounded to 2**-9). The model's t_dq / t_triton for the six
#: rows above: 0.73 (32768x512) and 0.87 (24576x1536), where dequant+matmul measured 37% and 7%
#: faster, vs 0.92 (7168x2048), 0.99-1.01 (K >= 7168 square-ish) and 1.13 (2112x7168) for the
#: four rows where Triton was within 2% or faster.
_FP8_DEQUANT_MARGIN = 0.9
#: fp8_block 128x128 tiles: 3 pipeline stages (3 vs 4 measured within noise on all six rows;
#: 3 uses 34 KB less shared memory and fills the pipeline sooner at short K).
_FP8_LARGE_TILE_STAGES = 3


@dataclass(frozen=True)
class GemmConfig:
    """One GEMM launch configuration (hashable; use as a cache key).

    block_m/block_n/block_k: output tile and K chunk. fp8_block needs block_k dividing 128;
        ``promote`` needs block_k dividing the scale block (128 / 32 / 16).
    num_warps, num_stages: Triton launch options (stages of the software pipeline).
    split_k: K splits; > 1 writes fp32 partials and reduces them in a second, deterministic
        kernel (no atomics). Each split covers a multiple of block_k.
    strategy: "triton" or "dequant_matmul" (see module docstring).
    promote: apply scales per K chunk after an FP8 / raw-value dot (True) or dequantize
        tiles to bf16 in registers (False); None = the format's default.
    group_m: rows of tiles walked together (L2 reuse of B).
    """

    block_m: int = 128
    block_n: int = 128
    block_k: int = 128
    num_warps: int = 8
    num_stages: int = 3
    split_k: int = 1
    strategy: str = "triton"
    promote: bool | None = None
    group_m: int = 8

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"GemmConfig.strategy: expected one of {STRATEGIES}, got {self.strategy!r}")
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"GemmConfig.{name}: expected a power of two >= 16, got {v}")
        if self.split_k < 1:
            raise ValueError(f"GemmConfig.split_k: expected >= 1, got {self.split_k}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"GemmConfig.num_warps: expected a power of two <= 16, got {self.num_warps}")
        if self.num_stages < 1:
            raise ValueError(f"GemmConfig.num_stages: expected >= 1, got {self.num_stages}")

    def replace(self, **kw) -> "GemmConfig":
        return replace(self, **kw)


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cuda" or "cpu"
    sm_count: int
    capability: tuple[int, int]
    smem_bytes: int  # opt-in shared memory per block


def device_info(device: torch.device) -> DeviceInfo:
    if device.type == "cuda":
        return _cuda_info(device.index if device.index is not None else torch.cuda.current_device())
    # CPU: the Triton interpreter; numbers only steer tile sizes
    return DeviceInfo("cpu", 4, (0, 0), 1 << 30)


_CUDA_CACHE: dict[int, DeviceInfo] = {}


def _cuda_info(index: int) -> DeviceInfo:
    info = _CUDA_CACHE.get(index)
    if info is None:
        p = torch.cuda.get_device_properties(index)
        smem = getattr(p, "shared_memory_per_block_optin", 0) or 232448
        info = DeviceInfo("cuda", p.multi_processor_count, (p.major, p.minor), int(smem))
        _CUDA_CACHE[index] = info
    return info


def default_promote(fmt: str, m: int, a_dtype: torch.dtype | None) -> bool:
    """Whether scales are applied after the dot (per K chunk) by default.

    fp8_block: always (fp32 scales are not exact in bf16; DeepSeek promotion). Weight-only with
    fp16 activations: always (scaled B values can leave fp16's range; raw e4m3/e2m1 values are
    exact in fp16). nvfp4 with quantized A: never (FP8 wgmma needs K >= 32 > 16-element blocks).
    mxfp8/mxfp4 with quantized A: at M <= 128 (design.md run C: per-32 FP8 promotion 112 vs
    bf16 upcast 87 TFLOP/s at M=128, 46 vs 36 at M=64; equal at M=4096). Weight-only bf16:
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


def choose_gemm_config(
    fmt: str,
    m: int,
    n: int,
    k: int,
    device: torch.device,
    *,
    a_dtype: torch.dtype | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    allow_hopper: bool = True,
) -> GemmConfig:
    """Analytic choice for ``[m, k] @ [n, k].T`` in format ``fmt`` (``a_dtype`` set = weight-only
    with dense activations of that dtype). Deterministic in its inputs; no device sync.
    ``allow_hopper=False``: the portable choice (the launcher's fallback when the Hopper
    kernels cannot take the operands)."""
    info = device_info(device)
    if (allow_hopper and fmt == "fp8_block" and a_dtype is None and info.kind == "cuda"
            and info.capability == (9, 0) and m >= HOPPER_MIN_M):
        return GemmConfig(strategy="hopper")
    return _choose(fmt, m, n, k, info, a_dtype, out_dtype)


@functools.lru_cache(maxsize=4096)
def _choose(fmt: str, m: int, n: int, k: int, info: DeviceInfo, a_dtype, out_dtype) -> GemmConfig:
    """Cached body of choose_gemm_config (pure function of its hashable arguments)."""
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
    if fmt == "fp8_block" and a_dtype is None:
        kiters = max(1, math.ceil(k / 128))
        rate = _TRITON_FP8_FLOPS * kiters / (kiters + _TRITON_FP8_KOVH)
        bf16_rate = _BF16_FLOPS_FP8_MODEL * k / (k + _BF16_K_HALF)
    elif fmt == "fp8_block":
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
