"""Config choice for the grouped (MoE) and fused SwiGLU ops (``ops/grouped.py``, ``ops/swiglu.py``).

Reuses :class:`blockscaled.config.gemm.GemmConfig` (tests force variants with ``config=``).
Every rule below uses shapes only (host metadata), never device-resident offsets or counts.

Strategies
----------
``"triton"``: the portable kernels of ``kernels/triton/grouped.py`` (``split_k=1`` only;
``group_m`` is ignored: tiles are walked expert by expert).

``"dequant_matmul"``: dequantize A and the expert weights to bf16 with our Triton dequantize
kernel, then cuBLAS: contiguous grouping ``torch._grouped_mm`` (one launch, segment ends read
on the device), masked grouping and dense SwiGLU ``torch.bmm``; a small Triton epilogue
(``dq_epilogue_kernel``) applies nvfp4 global scales, the SwiGLU activation and the masked
row contract where needed. The same reasoning as the dense GEMM's strategy
(:mod:`blockscaled.plan.portable`): a plain Triton MX/NV kernel is instruction-bound at about
220 TFLOP/s on the H100 while cuBLAS bf16 runs at about 750, and dequantizing costs one pass
over the operands. Rule: chosen on sm_90 when the roofline model (:func:`_dequant_matmul_faster`,
constants from plan/portable.py) predicts it faster and the call is eligible
(:func:`dequant_matmul_reason`); in practice from a few thousand rows in total. Eligible:
mxfp8 / mxfp4 / nvfp4 with quantized A, and bf16 weight-only activations with any weight
format (fp8_block weights only for bf16 outputs: bf16-rounded fp32-scaled weights need the
fp8_block bf16 tolerance row); fp8_block x fp8_block keeps its FP8 Triton kernel.
Contiguous grouping needs bf16 outputs (the sync-free fast path of ``torch._grouped_mm`` is
bf16 in / bf16 out; other dtypes fall back to a loop that reads the offsets on the host).
"""

from __future__ import annotations

import math

import torch

from ..config.gemm import GemmConfig
from .device import DeviceInfo, device_info
from .portable import _BF16_FLOPS, _BW, _ELEM_BYTES, _SCALE_K, _TRITON_MX_FLOPS, _stages, default_promote

__all__ = ["choose_grouped_config", "check_grouped_config", "dequant_matmul_reason", "batched_rows_unaligned",
           "GROUPED_STRATEGIES"]

GROUPED_STRATEGIES = ("triton", "dequant_matmul")
GROUPINGS = ("dense", "contiguous", "masked")

#: Accumulator elements per program (DUAL counts both) from which a dequantizing
#: (promote=False) tile uses 8 warps. ptxas -v (sm_90a, triton 3.6, 3 stages, block_k 128,
#: quantized A) on grouped_gemm_kernel, bytes of spill stores with 4 warps -> 8 warps:
#:   mxfp8: DUAL 128x64 400 -> 0, 128x64 36 -> 0 (64x128 and DUAL 64x64: 0 at 255 registers)
#:   nvfp4: DUAL 128x64 344 -> 0, 64x128 84 -> 0, DUAL 64x64 12 -> 0 (128x64: 0 at 255)
#:   mxfp4: DUAL 128x64 128 -> 0 (others 0 at 255 registers)
#: Every 4-warp variant of this size sat at the 255-register cap; with 8 warps none spills
#: (128-254 registers). bf16 weight-only A: no spills either way (184-187 registers).
_DEQUANT_8WARP_ACC = 128 * 64
#: Any tile with this many accumulator elements uses 8 warps (128 fp32 registers per thread
#: with 4 warps leave nothing for the pipeline).
_ANY_8WARP_ACC = 128 * 128


def dequant_matmul_reason(
    fmt: str, grouping: str, out_dtype: torch.dtype, a_dtype: torch.dtype | None, n: int, k: int,
    info: DeviceInfo, a_row_stride: int = 0,
) -> str | None:
    """Why the ``dequant_matmul`` strategy cannot take this call; None when it can.
    ``grouping``: "dense" (SwiGLU only), "contiguous" or "masked". ``a_row_stride``: row stride
    of a bf16 weight-only A (fed to ``torch._grouped_mm`` as is; 0 = not applicable)."""
    if a_dtype is None and fmt == "fp8_block":
        return ("fp8_block x fp8_block keeps the FP8 Triton kernel (bf16 operands would round the "
                "fp32-scaled values; the FP8 kernel is not the slow one)")
    if a_dtype is not None and a_dtype != torch.bfloat16:
        return (f"weight-only needs bf16 activations, got {a_dtype} (fp16: dequantized weights may leave "
                f"fp16's range, and cuBLAS' grouped GEMM is bf16 only)")
    if fmt == "fp8_block" and out_dtype != torch.bfloat16:
        return (f"fp8_block weights dequantize to bf16 with one rounding: only bf16 outputs meet the "
                f"tolerance, got out_dtype={out_dtype}")
    if grouping == "contiguous":
        if out_dtype != torch.bfloat16:
            return (f"contiguous grouping runs torch._grouped_mm, whose sync-free fast path is bf16 in / "
                    f"bf16 out, got out_dtype={out_dtype}")
        if info.kind == "cuda":
            if not hasattr(torch, "_grouped_mm"):
                return "torch._grouped_mm is not available in this torch"
            if info.capability[0] not in (9, 10):
                return (f"torch._grouped_mm has its sync-free bf16 kernel on sm_90 / sm_100 only, got "
                        f"sm_{info.capability[0]}{info.capability[1]}")
            if k == 0 or k % 8 or n % 8:
                return f"torch._grouped_mm needs K and N multiples of 8 (16-byte strides), got N={n}, K={k}"
            if a_row_stride % 8:
                return f"torch._grouped_mm needs A's row stride to be a multiple of 8 elements, got {a_row_stride}"
    return None


def batched_rows_unaligned(grouping: str, n: int, k: int) -> str | None:
    """Why the planner does not choose dequantize + cuBLAS for a masked / dense grouped call (it
    still runs where forced); None where it may. ``torch.bmm`` gets the bf16 operands and products
    as they are (ops/grouped.py: no padding there; the dense GEMM pads, ops/gemm.py), and cuBLAS at
    rows that are not 16-byte aligned ran 4.9x slower: H200, masked mxfp4 weight-only, 8 experts x
    512 rows, 2881 x 2880 761.5 us against 155.8 at N = 2880 (the tiled kernel 122.7; NOTES,
    thirty-sixth session). Contiguous calls refuse such rows already (torch._grouped_mm)."""
    if grouping != "contiguous" and (n % 8 or k % 8):
        return (f"cuBLAS's batched GEMM at bf16 rows that are not 16-byte aligned (N={n}, K={k}) ran 4.9x slower "
                f"than at aligned rows (plan/grouped_portable.py, batched_rows_unaligned)")
    return None


def _dequant_matmul_faster(fmt: str, grouping: str, e: int, rows: int, n: int, k: int, dual: bool,
                           a_dtype: torch.dtype | None, out_dtype: torch.dtype) -> bool:
    """Roofline model (constants of plan/portable.py, H100): t(Triton kernel) vs t(dequantize) +
    t(cuBLAS bf16) + t(epilogue). ``rows``: rows of A (masked: ``E * max_m``, the padded rows
    that both strategies may compute; the counts are on the device)."""
    nb = 2 if dual else 1
    w = nb * (1 if grouping == "dense" else e) * n * k  # weight elements
    flops = 2.0 * rows * n * k * nb
    eb = _ELEM_BYTES[fmt]
    a_packed = rows * k * (2 if a_dtype is not None else eb)
    out_b = rows * n * out_dtype.itemsize
    t_triton = max(flops / _TRITON_MX_FLOPS, (a_packed + w * eb + out_b) / _BW)
    # dequantize: read packed, write bf16 (A only when quantized)
    dq = w * eb + w * 2 + (0 if a_dtype is not None else a_packed + rows * k * 2)
    # products: bf16 (contiguous; bf16 outputs except nvfp4 SwiGLU) or fp32 (the others),
    # written by cuBLAS and read back by the epilogue (none for a bf16 GEMM)
    nv = fmt == "nvfp4"  # as ops.grouped._dequant_matmul
    prod_b = 2 if grouping == "contiguous" or (out_dtype == torch.bfloat16 and not (dual and nv)) else 4
    epi = 0 if (not dual and prod_b == 2 and grouping != "masked") else nb * rows * n * prod_b + out_b
    t_mm = max(flops / _BF16_FLOPS, ((rows + w // n) * k * 2 + nb * rows * n * prod_b) / _BW)
    return dq / _BW + t_mm + epi / _BW < t_triton


def check_grouped_config(cfg, fmt: str, a_dtype: torch.dtype | None = None, *, grouping: str = "contiguous",
                         out_dtype: torch.dtype = torch.bfloat16, n: int = 8, k: int = 8,
                         device: torch.device | None = None, a_row_stride: int = 0,
                         allow_dequant: bool = True) -> GemmConfig:
    """Validate a forced config for the grouped ops; raise ValueError naming the field.
    ``a_dtype``: bf16 / fp16 for weight-only (dense A), None for quantized A. ``grouping``,
    ``out_dtype``, ``n``, ``k``, ``device``: checked for ``strategy="dequant_matmul"``."""
    if isinstance(cfg, dict):
        cfg = GemmConfig(**cfg)
    if not isinstance(cfg, GemmConfig):
        raise TypeError(f"config: expected a blockscaled.config.GemmConfig or a dict, got {type(cfg).__name__}")
    if cfg.strategy not in GROUPED_STRATEGIES:
        raise ValueError(f"config.strategy: the grouped ops run {GROUPED_STRATEGIES}, got {cfg.strategy!r}")
    if cfg.strategy == "dequant_matmul":
        if not allow_dequant:
            raise ValueError("config.strategy: this op runs 'triton' only, got 'dequant_matmul'")
        info = device_info(device if device is not None else torch.device("cpu"))
        why = dequant_matmul_reason(fmt, grouping, out_dtype, a_dtype, n, k, info, a_row_stride)
        if why:
            raise ValueError(f"config.strategy: 'dequant_matmul' cannot run this call: {why}")
        return cfg
    if cfg.split_k != 1:
        raise ValueError(f"config.split_k: the grouped kernels do not split K, got {cfg.split_k}")
    promote = default_promote(fmt, 10**9, a_dtype) if cfg.promote is None else cfg.promote
    if fmt == "fp8_block" and not promote:
        raise ValueError("config.promote: fp8_block needs promote=True (fp32 scales are not exact in bf16)")
    if promote and _SCALE_K[fmt] % cfg.block_k:
        raise ValueError(
            f"config.block_k: promote=True needs block_k dividing the {fmt} scale block "
            f"({_SCALE_K[fmt]}), got {cfg.block_k}"
        )
    if a_dtype == torch.float16 and not promote:
        raise ValueError("config.promote: fp16 activations need promote=True (scaled B values can leave fp16's range)")
    if promote and fmt == "nvfp4" and a_dtype is None:
        raise ValueError("config.promote: nvfp4 cannot promote (16-element scale blocks < the FP8 dot's K of 32)")
    return cfg.replace(promote=promote)


def choose_grouped_config(
    fmt: str, rows_per_expert: float, n: int, k: int, device: torch.device, *, dual: bool = False,
    a_dtype: torch.dtype | None = None, grouping: str = "contiguous", experts: int = 1,
    out_dtype: torch.dtype = torch.bfloat16, a_row_stride: int = 0, allow_dequant: bool = True,
) -> GemmConfig:
    """Analytic choice for a grouped GEMM with about ``rows_per_expert`` rows per expert
    (``experts`` of them; dense SwiGLU: 1 and all rows). ``allow_dequant=False``: Triton only
    (the list op).

    * strategy: ``"dequant_matmul"`` on CUDA sm_90 when eligible (:func:`dequant_matmul_reason`)
      and :func:`_dequant_matmul_faster` predicts it faster; else ``"triton"`` with:
    * promote: :func:`blockscaled.config.gemm.default_promote` at ``rows_per_expert`` (MoE
      segments are short: per-32 FP8 promotion for MX at <= 128 rows, measured faster than
      bf16 upcast there, docs/design.md, "Measurements older than NOTES.md";
      weight-only: bf16 dequantizes B, fp16 promotes).
    * block_m: 64 up to 64 rows per expert (a segment wastes at most 63 padded rows and the
      DeepSeek decode case, m <= 64 per expert, fills one tile), else 128.
    * block_n: 128 (each program reads one B tile, the big operand); DUAL holds two
      accumulators, so block_n 64 keeps the register budget of one 128-wide tile.
    * block_k: the promotion chunk (128 fp8_block, 32 MX) or 128 for dequantizing kernels.
    * num_warps: 8 from 128x128 accumulator elements (DUAL counts both), and for dequantizing
      tiles already from 128x64 (see ``_DEQUANT_8WARP_ACC``: 4-warp 128x64x128 MX/NV tiles spilled).
    * stages: from the shared-memory budget (plan/portable.py::_stages).
    Interpreter (CPU): small tiles, one stage (cost is per program and per op there).
    """
    if grouping not in GROUPINGS:
        raise ValueError(f"grouping: expected one of {GROUPINGS}, got {grouping!r}")
    info = device_info(device)
    if allow_dequant and info.kind == "cuda" and info.capability == (9, 0) and rows_per_expert > 0 and n and k:
        e = max(experts, 1)
        rows = int(math.ceil(rows_per_expert * (1 if grouping == "dense" else e)))
        if (dequant_matmul_reason(fmt, grouping, out_dtype, a_dtype, n, k, info, a_row_stride) is None
                and batched_rows_unaligned(grouping, n, k) is None
                and _dequant_matmul_faster(fmt, grouping, e, rows, n, k, dual, a_dtype, out_dtype)):
            return GemmConfig(strategy="dequant_matmul")
    promote = default_promote(fmt, int(rows_per_expert), a_dtype)
    block_k = min(128, _SCALE_K[fmt]) if promote else 128
    if info.kind == "cpu":
        bm = 16 if rows_per_expert <= 16 else 32 if rows_per_expert <= 32 else 64
        return GemmConfig(bm, 32 if n <= 32 else 64, block_k, 4, 1, 1, "triton", promote, 8)
    block_m = 64 if rows_per_expert <= 64 else 128
    block_n = 64 if dual else 128
    acc = block_m * block_n * (2 if dual else 1)
    num_warps = 8 if acc >= _ANY_8WARP_ACC or (not promote and acc >= _DEQUANT_8WARP_ACC) else 4
    a_dense_bytes = 0 if a_dtype is None else 2
    stages = _stages(block_m, block_n * (2 if dual else 1), block_k, fmt, a_dense_bytes, promote, info.smem_bytes)
    return GemmConfig(block_m, block_n, block_k, num_warps, stages, 1, "triton", promote, 8)
