"""The planner's values: a :class:`Problem` (what is asked) and a :class:`Plan` (what runs)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..config.gemm import GemmConfig
from ..config.hopper import HopperConfig

__all__ = ["Problem", "Plan", "OPS", "BACKENDS", "KERNELS", "DTYPES", "DTYPE_NAMES"]

#: Problem.a / Problem.out_dtype names <-> torch dtypes
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}

#: Problem.op values
OPS = ("gemm", "grouped", "swiglu", "grouped_list", "quantize", "dequantize")
#: Plan.backend values: a CUDA kernel, the same kernel in Triton's CPU interpreter, or the pure
#: torch float64 reference (CPU tensors without the interpreter)
BACKENDS = ("cuda", "interpreter", "reference")
#: Plan.kernel values (derived from the config)
KERNELS = ("portable", "gemv", "dequant_matmul", "hopper_wide", "hopper_skinny", "portable_grouped",
           "grouped_dequant_matmul", "quantize", "reference", "hopper_stream", "hopper_tiled", "hopper_direct",
           "gemv_gluon")


@dataclass(frozen=True)
class Problem:
    """One call as the planner sees it (plain values; no tensors).

    op: one of OPS. fmt: format name. m, n, k: rows of A (grouped: all rows, sum of the
    experts' rows or E * max_m), output columns, logical K. a: "quantized" or the dense
    activation dtype name ("bfloat16" / "float16": weight-only). out_dtype: dtype name.
    bias: a bias is added. b_block_rows: rows per weight-scale block (fp8_block: 1 or 128).
    grouping: "dense", "contiguous" or "masked". experts, rows_per_expert: grouped calls (the
    expected rows per expert: the tile choice's hint). dual: SwiGLU (two weights).
    tma: the operands suit TMA (16-byte aligned bases and row strides, unit K stride).
    interpret: CPU tensors run the kernels in Triton's interpreter (else: the reference).
    a_fmt: the quantized activations' format where it differs from the weight's ("" = the same):
    the mixed pairs of plan/mx_packed.py (MX activations x an fp8_block 128 x 128 weight).
    """

    op: str = "gemm"
    fmt: str = "fp8_block"
    m: int = 0
    n: int = 0
    k: int = 0
    a: str = "quantized"
    out_dtype: str = "bfloat16"
    bias: bool = False
    b_block_rows: int = 128
    grouping: str = "dense"
    experts: int = 1
    rows_per_expert: float = 0.0
    dual: bool = False
    tma: bool = True
    interpret: bool = False
    a_fmt: str = ""

    @property
    def weight_only(self) -> bool:
        return self.a != "quantized"

    @property
    def out_bytes(self) -> int:
        return 4 if self.out_dtype == "float32" else 2

    @property
    def a_dense_bytes(self) -> int:
        return 0 if self.a == "quantized" else 2

    def short(self) -> str:
        s = f"{self.op} {self.fmt}{' weight-only ' + self.a if self.weight_only else ''} M={self.m} N={self.n} K={self.k}"
        if self.op in ("grouped", "swiglu") and self.grouping != "dense":
            s += f" {self.grouping} E={self.experts} rows/expert~{self.rows_per_expert:g}"
        return s


def _config_desc(cfg) -> str:
    if cfg is None:
        return "float64 reference"
    if isinstance(cfg, HopperConfig):
        s = f"{cfg.block_m}x{cfg.block_n} {cfg.stages} stages"
        if cfg.split_k > 1:
            s += f", split-K {cfg.split_k} ({cfg.split_reduce})"
        if cfg.tail_split > 1:
            s += f", tail split {cfg.tail_split}"
        if cfg.group_m != 8:
            s += f", group_m {cfg.group_m}"
        return s
    if cfg.strategy == "dequant_matmul":
        return "dequantize to bf16 + torch.matmul"
    if cfg.strategy == "stream":
        return (f"64x128 steps, {cfg.block_m} rows, {cfg.num_stages}-slot ring"
                + (f", split-K {cfg.split_k}" if cfg.split_k > 1 else "")
                + (", activations dequantized first" if cfg.dequant_a else ""))
    if cfg.strategy == "direct":
        return (f"64x128 steps, {cfg.block_m} rows, mma.sync, no ring"
                + (f", split-K {cfg.split_k}" if cfg.split_k > 1 else "")
                + (f", {cfg.maxnreg} registers" if cfg.maxnreg else "")
                + (", activations dequantized first" if cfg.dequant_a else ""))
    if cfg.strategy == "tiled":
        return (f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} tiles"
                + (" (weights as the register operand)" if cfg.is_register_operand else "") + f", {cfg.num_stages}-slot ring"
                + (f", split-K {cfg.split_k}" if cfg.split_k > 1 else "")
                + (", activations dequantized first" if cfg.dequant_a else ""))
    if cfg.strategy == "gemv":
        rows = f", {cfg.block_m} activation rows" if cfg.block_m > 1 else ""
        return (f"{cfg.block_n} weight rows x {cfg.block_k} K per chunk{rows}, {cfg.num_warps} warps"
                + (", Gluon layouts" if cfg.gluon else ""))
    s = (f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k}{' swap-AB' if cfg.swap_ab else ''}"
         f"{' bf16-dequant' if cfg.promote is False else ''} {cfg.num_warps} warps {cfg.num_stages} stages")
    if cfg.split_k > 1:
        s += f", split-K {cfg.split_k}"
    return s


@dataclass(frozen=True)
class Plan:
    """What one call runs: the backend, the kernel's full configuration, and why.

    Equality and the custom-op encoding (plan/encoding.py) cover ``op``, ``backend`` and
    ``config`` (what runs); ``problem``, ``predicted_us``, ``reasons`` and ``alternatives``
    explain it. ``str(plan)`` is a short human-readable account.

    Example::

        plan = bs.explain("gemm", a, b)     # the plan bs.gemm(a, b) runs
        print(plan)                         # kernel, tiles, split, waves, the rule behind it
        plan.kernel, plan.config            # "hopper_wide", HopperConfig(...)
    """

    op: str
    backend: str
    config: GemmConfig | HopperConfig | None
    problem: Problem | None = field(default=None, compare=False)
    predicted_us: float | None = field(default=None, compare=False)
    reasons: tuple[str, ...] = field(default=(), compare=False)
    alternatives: tuple[tuple[str, float], ...] = field(default=(), compare=False)

    @property
    def kernel(self) -> str:
        cfg = self.config
        if self.backend == "reference" or cfg is None:
            return "quantize" if self.op in ("quantize", "dequantize") and self.backend != "reference" else "reference"
        if isinstance(cfg, HopperConfig):
            return "hopper_" + cfg.variant
        if cfg.strategy == "gemv" and cfg.gluon:
            return "gemv_gluon"
        if cfg.strategy in ("stream", "tiled", "direct"):
            return "hopper_" + cfg.strategy
        if self.op in ("grouped", "swiglu", "grouped_list") and cfg.strategy != "gemv":
            return "grouped_dequant_matmul" if cfg.strategy == "dequant_matmul" else "portable_grouped"
        return {"triton": "portable", "gemv": "gemv", "dequant_matmul": "dequant_matmul",
                "stream": "hopper_stream", "tiled": "hopper_tiled", "direct": "hopper_direct"}[cfg.strategy]

    def describe(self) -> str:
        """One line: kernel and tiles (the bench's config column)."""
        if self.op in ("quantize", "dequantize"):
            return f"{self.kernel} ({self.backend})"
        # plan/grouped.py: stacked_swiglu_plan (one GEMM over a [E, 2N, K] gate_up weight), _split_swiglu_plan
        stacked = self.op == "swiglu" and self.problem is not None and not self.problem.dual and self.config is not None
        split = (self.op == "swiglu" and not stacked and isinstance(self.config, GemmConfig)
                 and self.config.strategy in ("stream", "tiled", "direct"))
        head = "gate_up: " if stacked else "gate, up: " if split else ""
        return (head + f"{self.kernel} {_config_desc(self.config)}" + (" + silu * mul pass" if head else "")
                + ("" if self.backend == "cuda" else f" ({self.backend})"))

    def __str__(self) -> str:
        lines = [f"{self.problem.short() if self.problem else self.op}", f"  runs: {self.describe()}"]
        if self.predicted_us is not None:
            lines.append(f"  predicted: {self.predicted_us:.1f} us")
        lines += [f"  - {r}" for r in self.reasons]
        if self.alternatives:
            alts = ", ".join(f"{d} {t:.1f} us" for d, t in self.alternatives[:4])
            lines.append(f"  next best: {alts}")
        return "\n".join(lines)
