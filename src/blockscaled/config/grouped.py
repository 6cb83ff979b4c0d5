"""Config choice for the grouped (MoE) and fused SwiGLU kernels (``kernels/triton/grouped.py``).

Reuses :class:`blockscaled.config.gemm.GemmConfig` (tests force variants with ``config=``).
The grouped kernels support ``strategy="triton"`` and ``split_k=1`` only; ``group_m`` is
ignored (tiles are walked expert by expert). Every rule below uses shapes only (host metadata),
never device-resident offsets or counts.
"""

from __future__ import annotations

import torch

from .gemm import GemmConfig, _stages, default_promote, device_info

__all__ = ["choose_grouped_config", "check_grouped_config"]

#: elements sharing one scale along K
_SCALE_K = {"fp8_block": 128, "mxfp8": 32, "mxfp4": 32, "nvfp4": 16}


def check_grouped_config(cfg, fmt: str, a_dtype: torch.dtype | None = None) -> GemmConfig:
    """Validate a forced config for the grouped kernels; raise ValueError naming the field.
    ``a_dtype``: bf16 / fp16 for weight-only (dense A), None for quantized A."""
    if isinstance(cfg, dict):
        cfg = GemmConfig(**cfg)
    if not isinstance(cfg, GemmConfig):
        raise TypeError(f"config: expected a blockscaled.config.GemmConfig or a dict, got {type(cfg).__name__}")
    if cfg.strategy != "triton":
        raise ValueError(f"config.strategy: the grouped kernels only run 'triton', got {cfg.strategy!r}")
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
    a_dtype: torch.dtype | None = None,
) -> GemmConfig:
    """Analytic choice for a grouped GEMM with about ``rows_per_expert`` rows per expert.

    * promote: :func:`blockscaled.config.gemm.default_promote` at ``rows_per_expert`` (MoE
      segments are short: per-32 FP8 promotion for MX at <= 128 rows, design.md run C;
      weight-only: bf16 dequantizes B, fp16 promotes).
    * block_m: 64 up to 64 rows per expert (a segment wastes at most 63 padded rows and the
      DeepSeek decode case, m <= 64 per expert, fills one tile), else 128.
    * block_n: 128 (each program reads one B tile, the big operand); DUAL holds two
      accumulators, so block_n 64 keeps the register budget of one 128-wide tile.
    * block_k: the promotion chunk (128 fp8_block, 32 MX) or 128 for dequantizing kernels.
    * stages: from the shared-memory budget (config.gemm._stages).
    Interpreter (CPU): small tiles, one stage (cost is per program and per op there).
    """
    info = device_info(device)
    promote = default_promote(fmt, int(rows_per_expert), a_dtype)
    block_k = min(128, _SCALE_K[fmt]) if promote else 128
    if info.kind == "cpu":
        bm = 16 if rows_per_expert <= 16 else 32 if rows_per_expert <= 32 else 64
        return GemmConfig(bm, 32 if n <= 32 else 64, block_k, 4, 1, 1, "triton", promote, 8)
    block_m = 64 if rows_per_expert <= 64 else 128
    block_n = 64 if dual else 128
    num_warps = 8 if block_m * block_n >= 128 * 128 else 4
    a_dense_bytes = 0 if a_dtype is None else 2
    stages = _stages(block_m, block_n * (2 if dual else 1), block_k, fmt, a_dense_bytes, promote, info.smem_bytes)
    return GemmConfig(block_m, block_n, block_k, num_warps, stages, 1, "triton", promote, 8)
