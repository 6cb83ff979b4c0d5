"""The MX/NV suite (``blockscaled bench --suite mx``, issue 18): cases, counts, targets, tables.

Dense cases (kind ``mx``, one per linear and token count M), each format (mxfp8, mxfp4, nvfp4)
in three modes, all against cuBLAS bf16 on the weight dequantized ahead of time (baseline
``cublas-bf16``, op ``bf16``):

  ``weight-only``  ``bs.linear(x, w, weight_only=True)``: bf16 activations x quantized weight
  ``gemm``         ``bs.gemm(qa, w)``: W x A on activations quantized beforehand (same format:
                   ``bs.gemm`` takes one format for both operands, so the issue's mxfp4 x mxfp8
                   row runs as mxfp4 x mxfp4 and is held to that row's target)
  ``linear``       ``bs.linear(x, w)``: E2E, the activation quantizer included
  ``packed``       mxfp4 at M >= PACKED_MIN_M: ``bs.gemm(qa, w8)`` with ``w8 =
                   bs.layouts.mxfp4_to_fp8_block(w)`` (the mixed pair on the FP8 tensor cores,
                   plan/mx_packed.py; packing outside the timing), W x A on mxfp4 activations
  ``packed-linear`` the same from bf16 ``x``, as a prepacked ``nn.Linear`` runs it at these M (E2E):
                   ``ops.mx_linear.packed_linear(x, w8)``, one fused quantize-and-encode pass and
                   the GEMM (the numbers of ``bs.gemm(bs.quantize(x, "mxfp4"), w8)``)

MoE cases (kind ``mx-moe``): contiguous ``bs.grouped_gemm`` with skewed routing
(:func:`blockscaled.bench.suites.skewed_routing`), ``weight-only`` (bf16 activations: the
grouped ops take a bf16 ``a``, weight-only grouped is supported) and ``grouped`` (W x A,
activations quantized to the weight's format), against a per-expert cuBLAS bf16 loop
(``bf16-loop``) and ``torch._grouped_mm`` (``grouped-mm-bf16``), both on bf16 weights
dequantized ahead of time.

Every row, ours and the baselines', is checked against the float64 reference, timed as a CUDA
graph (``median_ms``) and eagerly (``eager_ms``: wall clock of back-to-back calls), and its
bytes give the % of the memory floor at the copy bandwidth measured in the run: quantized
weight + activation (bf16, or quantized for W x A) + output, only the experts that have rows.
:func:`target` gives each row its target (issue 18, H100) and :func:`table` the verdicts.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import torch

from ..layouts import mxfp4_to_fp8_block
from ..ops.mx_linear import packed_linear
from ..reference.quantize import dequantize as deq
from ..reference.quantize import quantize as ref_quantize
from .baselines import GemmInputs, GroupedInputs
from .counting import Count, quantized_nbytes
from .tables import count_verdicts
from .tables import timed as _ok
from .tables import us as _us

__all__ = ["run_dense", "run_moe", "Target", "target", "table", "verdict_counts", "has_rows", "MODES", "KINDS"]

KINDS = ("mx", "mx-moe")
#: our op -> the mode's name in the tables
MODES = {"weight-only": "W-only", "gemm": "WxA", "linear": "E2E", "grouped": "WxA", "packed": "WxA-fp8",
         "packed-linear": "E2E-fp8"}
#: the packed modes run from this M on (below it the planner keeps a prepacked layer on its mxfp4
#: weight at decode sizes, and the mixed pair's 128-row tiles are mostly padding)
PACKED_MIN_M = 256
OURS = "blockscaled"


# --------------------------------------------------------------------------- running
def _clone_q(q):
    # Local: bench/runner imports this module (the runner's helper; a module-level import would
    # close a cycle)
    from .runner import _clone_q as clone

    return clone(q)


class _Refs:
    """float64 references of one case, computed when first asked and kept one at a time (the
    largest, M=8192 x N=57344, is 3.8 GB in float64)."""

    def __init__(self, make):
        self.make = make
        self.key = self.value = None

    def __call__(self, key):
        if key != self.key:
            self.key = self.value = None
            self.value, self.key = self.make(key), key
        return self.value


def run_dense(r, case, fmt: str, ops, seed: int) -> None:
    """One ``mx`` case in one format: our ops in ``ops`` and the ``bf16`` baselines (Runner ``r``)."""
    m, n, k = case.m, case.n, case.k
    dt = r.cfg.out_dtype
    x0 = r._randn(m, k, seed=seed, dtype=r._act_dtype())
    w = r._randn(n, k, seed=seed + 1, outliers=False, scale=0.05)
    qb0 = r._quantize_inputs(w, fmt)
    del w
    qa0 = r._quantize_inputs(x0, fmt)
    n_sets = r._n_sets(x0.numel() * x0.element_size() + qa0.nbytes() + qb0.nbytes())
    inputs = [GemmInputs(x0, qa0, qb0, dt)]
    inputs += [GemmInputs(x0.clone(), _clone_q(qa0), _clone_q(qb0), dt) for _ in range(n_sets - 1)]
    wd = deq(qb0).double()

    def make(which):
        if which == "x":
            a = x0.double()
        elif which == "qa":
            a = deq(qa0).double()
        else:  # E2E: the reference quantizer's activations (independent of our quantize kernel)
            a = deq(ref_quantize(x0, fmt)).double()
        return a @ wd.T

    refs = _Refs(make)
    xb, ob = m * k * x0.element_size(), m * n * torch.empty((), dtype=dt).element_size()
    wq = quantized_nbytes(fmt, (n, k))
    if "weight-only" in ops:
        f = r.op("linear")
        if f is not None:
            r._measure(case, fmt, "weight-only", OURS, lambda x, b, f=f: f(x, b, weight_only=True, out_dtype=dt),
                       [(i.x, i.qb) for i in inputs], Count(2 * m * n * k, xb + wq + ob),
                       r._check_close(fmt, lambda: refs("x")))
    # the baseline next to the weight-only row: both are checked against x @ W
    bf16 = Count(2 * m * n * k, xb + n * k * 2 + ob)
    r._baselines(case, fmt, "bf16", inputs, bf16, check=r._check_close(fmt, lambda: refs("x")))
    if "gemm" in ops:
        f = r.op("gemm")
        if f is not None:
            r._measure(case, fmt, "gemm", OURS, lambda a, b, f=f: f(a, b, out_dtype=dt),
                       [(i.qa, i.qb) for i in inputs], Count(2 * m * n * k, qa0.nbytes() + wq + ob),
                       r._check_close(fmt, lambda: refs("qa")))
    if "linear" in ops:
        f = r.op("linear")
        if f is not None:
            r._measure(case, fmt, "linear", OURS, lambda x, b, f=f: f(x, b, out_dtype=dt),
                       [(i.x, i.qb) for i in inputs], Count(2 * m * n * k, xb + wq + ob),
                       r._check_close(fmt, lambda: refs("e2e")))
    if fmt == "mxfp4" and m >= PACKED_MIN_M and {"packed", "packed-linear"} & set(ops):
        _run_packed(r, case, fmt, ops, inputs, qa0, refs, ob, xb)


def _run_packed(r, case, fmt, ops, inputs, qa0, refs, ob, xb) -> None:
    """The ``packed`` / ``packed-linear`` rows of one mxfp4 case (module doc)."""
    m, n, k = case.m, case.n, case.k
    dt = r.cfg.out_dtype
    g, q = r.op("gemm"), r.op("quantize")
    if g is None or q is None:
        return
    try:
        w8s = [mxfp4_to_fp8_block(i.qb) for i in inputs]
    except ValueError as e:  # a tile the copy cannot hold exactly: no packed rows for this case
        r.note(f"{case.label}: no fp8_block copy ({str(e)[:80]})")
        return
    w8b = w8s[0].data.numel() + w8s[0].scale.numel() * 4
    if "packed" in ops:
        r._measure(case, fmt, "packed", OURS, lambda a, w: g(a, w, out_dtype=dt),
                   [(i.qa, w) for i, w in zip(inputs, w8s)], Count(2 * m * n * k, qa0.nbytes() + w8b + ob),
                   r._check_close(fmt, lambda: refs("qa")))
    if "packed-linear" in ops:  # what a prepacked nn.Linear runs: one fused quantize-encode pass, the GEMM
        r._measure(case, fmt, "packed-linear", OURS, lambda x, w: packed_linear(x, w, out_dtype=dt),
                   [(i.x, w) for i, w in zip(inputs, w8s)], Count(2 * m * n * k, xb + w8b + ob),
                   r._check_close(fmt, lambda: refs("e2e")))


def run_moe(r, case, fmt: str, ops, seed: int) -> None:
    """One ``mx-moe`` case (contiguous, ``case.ms`` rows per expert) in one format."""
    from .runner import _index_q  # Local: bench/runner imports this module (cycle)

    ms, e, n, k = case.ms, case.experts, case.n, case.k
    rows = sum(ms)
    dt = r.cfg.out_dtype
    x0 = r._randn(rows, k, seed=seed, dtype=r._act_dtype())
    w = r._randn(e, n, k, seed=seed + 1, outliers=False, scale=0.05)
    qb0 = r._quantize_inputs(w, fmt)
    del w
    qa0 = r._quantize_inputs(x0, fmt)
    offs = torch.tensor([0] + list(itertools.accumulate(ms)), dtype=torch.int32, device=r.device)
    counts = torch.tensor(ms, dtype=torch.int32, device=r.device)
    n_sets = r._n_sets(x0.numel() * x0.element_size() + qa0.nbytes() + qb0.nbytes())
    inputs = [GroupedInputs(x0, qa0, qb0, offs, counts, ms, False, dt)]
    inputs += [GroupedInputs(x0.clone(), _clone_q(qa0), _clone_q(qb0), offs.clone(), counts.clone(), ms, False, dt)
               for _ in range(n_sets - 1)]

    def make(which):
        a = x0.double() if which == "x" else deq(qa0).double()
        y = torch.zeros(rows, n, dtype=torch.float64, device=a.device)
        start = 0
        for i, mi in enumerate(ms):
            if mi:  # experts without rows: nothing to compute (and 128 dequantized experts to skip)
                y[start:start + mi] = a[start:start + mi] @ deq(_index_q(qb0, i)).double().T
            start += mi
        return y

    refs = _Refs(make)
    active = sum(1 for mi in ms if mi)
    wq = active * quantized_nbytes(fmt, (n, k))
    xb, ob = rows * k * x0.element_size(), rows * n * torch.empty((), dtype=dt).element_size()
    f = r.op("grouped")
    if "weight-only" in ops and f is not None:
        r._measure(case, fmt, "weight-only", OURS, lambda x, b, o, f=f: f(x, b, offsets=o, out_dtype=dt),
                   [(i.x, i.qb, i.offsets) for i in inputs], Count(2 * rows * n * k, xb + wq + ob),
                   r._check_close(fmt, lambda: refs("x")))
    r._baselines(case, fmt, "bf16-moe", inputs, Count(2 * rows * n * k, xb + active * n * k * 2 + ob),
                 check=r._check_close(fmt, lambda: refs("x")))
    if "grouped" in ops and f is not None:
        r._measure(case, fmt, "grouped", OURS, lambda a, b, o, f=f: f(a, b, offsets=o, out_dtype=dt),
                   [(i.qa, i.qb, i.offsets) for i in inputs], Count(2 * rows * n * k, qa0.nbytes() + wq + ob),
                   r._check_close(fmt, lambda: refs("qa")))


# --------------------------------------------------------------------------- targets
@dataclass(frozen=True)
class Target:
    """A row's target: % of the memory floor and / or a speed ratio to its baseline (baseline
    time / ours: > 1 is faster), both required where both are given."""

    text: str
    floor_pct: float | None = None
    ratio: float | None = None
    baseline: str = "cublas-bf16"

    def verdict(self, floor_pct, ratio) -> str:
        """PASS / MISS, or "-" when a quantity it needs was not measured."""
        if (self.floor_pct is not None and floor_pct is None) or (self.ratio is not None and ratio is None):
            return "-"
        ok = (self.floor_pct is None or floor_pct >= self.floor_pct) and (self.ratio is None or ratio >= self.ratio)
        return "PASS" if ok else "MISS"


def target(kind: str, fmt: str, op: str, m: int) -> Target | None:
    """Issue 18's target (H100) of one of our rows; None where the issue states none.

    Dense, by M: <= 16: >= 85% of the memory floor and >= 3x cuBLAS bf16 for fp4 weights (1.7x
    mxfp8); <= 64: >= 70% of the floor; <= 256: >= 1.5x bf16 for fp4 weights (none for mxfp8);
    >= 2048: >= 1.0x for weight-only and nvfp4, >= 1.3x for mxfp8 x mxfp8 and mxfp4 x mxfp4 (the
    issue's mxfp4 x mxfp8, which bs.gemm cannot take), E2E held to its format's W x A row.
    MoE: >= 2x the per-expert bf16 cuBLAS loop at every token count (the issue states it for
    gpt-oss mxfp4 weight-only; applied to every grouped row)."""
    fp4 = fmt in ("mxfp4", "nvfp4")
    if kind == "mx-moe":
        return Target(">= 2.0x bf16 loop", ratio=2.0, baseline="bf16-loop")
    if m <= 16:
        need = 3.0 if fp4 else 1.7
        return Target(f">= 85% floor, >= {need:.1f}x bf16", floor_pct=85.0, ratio=need)
    if m <= 64:
        return Target(">= 70% floor", floor_pct=70.0)
    if m <= 256:
        return Target(">= 1.5x bf16", ratio=1.5) if fp4 else None
    if m >= 2048:
        need = 1.0 if (op == "weight-only" or fmt == "nvfp4") else 1.3
        return Target(f">= {need:.1f}x bf16", ratio=need)
    return None


# --------------------------------------------------------------------------- tables
def _tokens(row) -> int:
    t = re.search(r"\bT=(\d+)", row.get("case", ""))
    return int(t.group(1)) if t else row.get("M", 0)


def table(rows: list[dict], kind: str) -> tuple[list[str], list[list[str]]]:
    """(head, body) of the MX suite's table of ``kind`` ("mx" dense or "mx-moe"): one line per
    row of ours with eager and graph times, % of the memory floor, the ratio to each baseline
    (same case and format, baseline graph time / ours), the target and its verdict, the plan
    that ran and the check."""
    ours = [r for r in rows if r.get("kind") == kind and r["impl"] == OURS]
    base: dict[tuple, dict] = {}
    for r in rows:
        if r.get("kind") == kind and r["impl"] != OURS and _ok(r):
            base[(r.get("suite"), r["case"], r["format"], r["impl"])] = r
    names = ["cublas-bf16"] if kind == "mx" else ["bf16-loop", "grouped-mm-bf16"]
    head = ["case", "format", "mode", "M" if kind == "mx" else "tokens", "eager us", "graph us", "% floor"]
    head += [f"vs {b}" for b in names] + ["target", "verdict", "plan", "check"]
    body = []
    for r in ours:
        ratios = []
        for b in names:
            br = base.get((r.get("suite"), r["case"], r["format"], b))
            ratios.append(br["median_ms"] / r["median_ms"] if br and _ok(r) and r["median_ms"] > 0 else None)
        t = target(kind, r["format"], r["op"], r["M"])
        floor = r.get("mem_floor_pct") if _ok(r) else None
        if t is None:
            tt, v = "-", "-"
        else:
            tt = t.text
            v = t.verdict(floor, ratios[names.index(t.baseline)])
        if r.get("check") == "FAIL" or r.get("status") != "ok":
            v = "FAIL"
        check = r.get("check") or r.get("status", "-")
        if r.get("rel_err") is not None and check != "bitwise":
            check = f"{check} {r['rel_err']:.1e}"
        body.append([r.get("requested") or r["case"], r["format"], MODES.get(r["op"], r["op"]),
                     str(r["M"] if kind == "mx" else _tokens(r)), _us(r.get("eager_ms")), _us(r.get("median_ms")),
                     "-" if floor is None else f"{floor:.0f}%",
                     *["-" if x is None else f"{x:.2f}x" for x in ratios], tt, v, r.get("config") or "-", check])
    return head, body


def verdict_counts(rows: list[dict]) -> dict:
    """{"PASS": n, "MISS": n, "FAIL": n, "-": n} over both tables (rows without a target: "-")."""
    return count_verdicts(*(table(rows, kind) for kind in KINDS))


def has_rows(rows: list[dict]) -> bool:
    return any(r.get("kind") in KINDS for r in rows)

