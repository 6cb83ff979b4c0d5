"""The dispatch table: which kernel the planner runs, for a set of shapes, as markdown.

``python -m blockscaled.plan.table`` prints it for an H100 (computed on any machine: the planner is a
pure function of the problem and the device's properties); the README's "Which kernel runs" table is
this output (tests/test_planner.py checks that it is up to date).
"""

from __future__ import annotations

import sys

from .device import H100_SXM, DeviceInfo
from .gemm import plan_gemm
from .grouped import plan_grouped, stacked_swiglu_plan
from .types import Problem

__all__ = ["dispatch_table", "TABLE_SHAPES"]

#: (label, N, K): a decode-heavy projection, a wide MLP, a short-K projection (Llama 3 8B QKV,
#: Llama 3 70B gate|up, DeepSeek-V3 kv_b)
TABLE_SHAPES = (("Llama 3 8B qkv", 6144, 4096), ("Llama 3 70B gate_up", 57344, 8192),
                ("DeepSeek-V3 kv_b", 32768, 512))
TABLE_MS = (1, 4, 16, 64, 256, 1024, 8192)


def dispatch_table(dev: DeviceInfo = H100_SXM) -> str:
    """Markdown: the dense fp8_block plan per shape and M, other formats, and grouped plans."""
    lines = ["| shape (N x K) | " + " | ".join(f"M={m}" for m in TABLE_MS) + " |",
             "|---|" + "---|" * len(TABLE_MS)]
    for label, n, k in TABLE_SHAPES:
        cells = []
        for m in TABLE_MS:
            p = plan_gemm(Problem("gemm", "fp8_block", m, n, k), dev)
            cells.append(f"{p.describe()} ({p.predicted_us:.0f} us)")
        lines.append(f"| fp8_block {label} {n}x{k} | " + " | ".join(cells) + " |")
    for fmt in ("mxfp8", "mxfp4", "nvfp4"):
        cells = [plan_gemm(Problem("gemm", fmt, m, 6144, 4096), dev).describe() for m in TABLE_MS]
        lines.append(f"| {fmt} 6144x4096 | " + " | ".join(cells) + " |")
    for fmt in ("mxfp4", "nvfp4"):
        cells = [plan_gemm(Problem("gemm", fmt, m, 6144, 4096, a="bfloat16", b_block_rows=1), dev).describe()
                 for m in TABLE_MS]
        lines.append(f"| {fmt} weight-only (bf16 x) 6144x4096 | " + " | ".join(cells) + " |")
    lines += ["", "| grouped fp8_block (E experts, rows per expert) | plan |", "|---|---|"]
    for grouping, e, rows, n, k, dual in (("contiguous", 8, 64, 4096, 7168, False),
                                          ("contiguous", 8, 512, 4096, 7168, False),
                                          ("masked", 32, 128, 7168, 2048, False),
                                          ("contiguous", 8, 512, 2048, 7168, True)):
        op = "swiglu" if dual else "grouped"
        p = Problem(op, "fp8_block", e * rows, n, k, grouping=grouping, experts=e, rows_per_expert=float(rows),
                    dual=dual)
        plan = plan_grouped(p, dev)
        lines.append(f"| {op} {grouping} E={e} x {rows} rows, N={n} K={k} | {plan.describe()} |")
    lines += ["", "| grouped mxfp4 weight-only (gpt-oss-120b gate_up: E=128, N=5760, K=2880) | plan |", "|---|---|"]
    for rows in (2, 16, 64, 256):
        p = Problem("grouped", "mxfp4", 128 * rows, 5760, 2880, a="bfloat16", b_block_rows=1, grouping="contiguous",
                    experts=128, rows_per_expert=float(rows))
        plan = plan_grouped(p, dev, hopper_why="mxfp4 weights")
        lines.append(f"| {rows} rows per expert (T = {32 * rows} tokens, top-4) | {plan.describe()} |")
    lines += ["", "| grouped mxfp4 SwiGLU (Qwen3-30B-A3B experts: E=128, N=768, K=2048, bf16 x) | plan |", "|---|---|"]
    for rows in (0.5, 8, 256):
        p = Problem("swiglu", "mxfp4", int(128 * rows), 768, 2048, a="bfloat16", b_block_rows=1,
                    grouping="contiguous", experts=128, rows_per_expert=float(rows), dual=True)
        plan = plan_grouped(p, dev, hopper_why="mxfp4 weights")
        lines.append(f"| {rows:g} rows per expert, w_gate and w_up (T = {int(16 * rows)} tokens, top-8) | "
                     f"{plan.describe()} |")
        # the stacked form, bs.swiglu(x, w_gate_up) (what nn.Experts runs for MX / NV weights): the grouped
        # GEMM over the 2N rows with fp32 output (ops/grouped.py grouped_plan)
        p2 = Problem("grouped", "mxfp4", int(128 * rows), 2 * 768, 2048, a="bfloat16", out_dtype="float32",
                     b_block_rows=1, grouping="contiguous", experts=128, rows_per_expert=float(rows))
        plan = stacked_swiglu_plan(plan_grouped(p2, dev, hopper_why="mxfp4 weights"), "bfloat16")
        lines.append(f"| {rows:g} rows per expert, stacked w_gate_up (T = {int(16 * rows)} tokens, top-8) | "
                     f"{plan.describe()} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(dispatch_table())
