"""The MoE-layer suite (``blockscaled bench --suite moe-layer``, issue 20): our whole MoE layer
(:class:`blockscaled.nn.MoE`: router, top-k, permutation, quantized experts, combine) against the
same layer in bf16, on the layer dimensions of public MoE models, decode to prefill.

Rows per case (one architecture, one token count T, one weight format):

  ``moe``                  ours, W x A (activations quantized to the weights' format)
  ``moe-weight-only``      ours, bf16 activations x quantized weights
  ``moe-kernels`` /        the same module's expert work alone (``Experts.expert_rows`` on rows
  ``moe-weight-only-kernels``  already in expert order, the grouped GEMMs without metadata checks
                           as in the forward, whose combine checks the permutation): layer time
                           minus this = the glue (router, top-k, permutation, combine, launches
                           between them)
  ``grouped-mm-bf16``      the bf16 layer with ``torch._grouped_mm`` experts (transformers'
                           "grouped_mm" experts implementation does the same), same router code
  ``bf16-loop``            the bf16 layer with one GEMM pair per expert that has tokens (the
                           "eager" experts implementation; it reads the routing on the host)

Both bf16 layers use the unquantized weights the quantized ones came from and our
:func:`blockscaled.nn.route`, so every row routes identically. Routing: a per-expert router bias
``-log(rank)`` (Zipf 1 over a seeded permutation, as the ``mx-moe`` cases' skewed routing) on
random router weights, so popular experts get many rows and many experts none at decode.

Every row is checked against its float64 twin (:func:`blockscaled.reference.experts.experts`;
the bf16 layers against the float64 layer on bf16 weights) within :data:`LAYER_TOLERANCE`, timed
as a CUDA graph where it can be captured (the bf16 loop cannot: events, eager) and eagerly
(wall clock per back-to-back call). Input copies differ in their tokens, so successive calls
route to different experts (L2 holds no previous call's weights, as in decoding). Bytes for
the % of floor: the quantized weights of the experts set 0 routes to (+ the router) + input +
output. :func:`table` gives the ratios, the glue share and the verdict of issue 20's target (glue
< 15 % of the layer's time at decode, T <= 64).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from types import SimpleNamespace

import torch

from .. import _checks
from ..nn.experts import Experts, permute
from ..nn.moe import MoE, route
from ..reference.experts import experts as ref_experts
from .counting import Count, quantized_nbytes
from .tables import count_verdicts
from .tables import timed as _ok
from .tables import us as _us

__all__ = ["MoeArch", "ARCHS", "LAYER_TOKENS", "LAYER_TOLERANCE", "GLUE_TARGET_PCT", "arch_of", "tiny_arch",
           "run_moe_layer", "bf16_layer", "table", "verdict_counts", "KINDS", "MODES"]

KINDS = ("moe-layer",)
OURS = "blockscaled"
#: our ops -> the mode's name in the table, and the op of their kernels-only row
MODES = {"moe": "WxA", "moe-weight-only": "W-only"}
KERNELS = {"moe": "moe-kernels", "moe-weight-only": "moe-weight-only-kernels"}
#: the registered baseline names (bench/baselines.py BASELINE_NAMES: ``--baselines all`` selects by
#: them; the first GPU run had "bf16-grouped-mm", which no selection named, so it never ran) and
#: the ``bf16_layer`` impl each one times
BASELINES = ("grouped-mm-bf16", "bf16-loop")
_BF16_IMPL = {"grouped-mm-bf16": "grouped-mm", "bf16-loop": "loop"}
#: issue 20: the glue (routing + permutation + combine) under this share of the layer's time
#: at decode (token counts up to GLUE_DECODE_T)
GLUE_TARGET_PCT = 15.0
GLUE_DECODE_T = 64
#: (rel_fro, norm_max) of a layer against its float64 twin. Two chained GEMMs with the
#: intermediate rounded to bf16 and (W x A) quantized again: where our fp32 gate / up differ
#: from float64 in the last bit, the bf16 intermediate may differ by one ulp and its quantized
#: code by one step. The CPU tests of Experts measured rel_fro < 1e-2 over four formats, both
#: modes, both activations (tests/test_nn.py); these limits leave 2x on that and hold the bf16
#: layers to the same.
LAYER_TOLERANCE = (2e-2, 6e-2)


@dataclass(frozen=True)
class MoeArch:
    """An MoE layer's dimensions and routing, from the model's published config."""

    name: str
    experts: int
    top_k: int
    hidden: int
    intermediate: int
    activation: str = "silu"  # "silu" | "gpt_oss" (biases, clamp, alpha; gpt-oss)
    score: str = "softmax"
    n_group: int | None = None
    topk_group: int | None = None
    routed_scaling_factor: float = 1.0
    formats: tuple[str, ...] = ()  # the formats its checkpoints ship in (the suite's default)


ARCHS: dict[str, MoeArch] = {a.name: a for a in (
    # Qwen3-30B-A3B: hidden 2048, 128 experts of 768, top-8 softmax (FP8 block and NVFP4 releases)
    MoeArch("qwen3-30b-a3b", 128, 8, 2048, 768, formats=("fp8_block", "nvfp4", "mxfp4")),
    # gpt-oss-20b: hidden 2880, 32 experts of 2880, top-4, biased router and experts (MXFP4 release)
    MoeArch("gpt-oss-20b", 32, 4, 2880, 2880, activation="gpt_oss", formats=("mxfp4", "nvfp4")),
    # Mixtral 8x7B: hidden 4096, 8 experts of 14336, top-2
    MoeArch("mixtral-8x7b", 8, 2, 4096, 14336, formats=("fp8_block", "nvfp4")),
    # DeepSeek-V3: hidden 7168, 256 experts of 2048, top-8 sigmoid, 8 groups (best 4), x2.5
    MoeArch("deepseek-v3", 256, 8, 7168, 2048, score="sigmoid", n_group=8, topk_group=4,
            routed_scaling_factor=2.5, formats=("fp8_block", "nvfp4")),
)}
LAYER_TOKENS = (1, 8, 64, 512, 4096)


def tiny_arch(a: MoeArch) -> MoeArch:
    """A small stand-in of ``a`` for the interpreter (CPU): 8 experts (4 groups where ``a``
    groups them), top-2, a hidden size of 96-192 that differs between architectures (a multiple
    of 8: transformers' bf16 experts run ``torch._grouped_mm``, which needs 16-byte strides;
    unaligned K has the kernel suites' tests), intermediate 128 (a whole fp8_block scale block)."""
    groups = dict(n_group=4, topk_group=2) if a.n_group else {}
    return replace(a, name=f"tiny:{a.name}", experts=8, top_k=2, hidden=96 + 8 * (a.hidden % 13),
                   intermediate=128, **groups)


def arch_of(case) -> MoeArch:
    """The architecture a ``moe-layer`` / ``model`` case runs (``case.arch``; "tiny:<name>" for
    a CPU stand-in)."""
    name = case.arch
    if name.startswith("tiny:"):
        return tiny_arch(ARCHS[name[5:]])
    return ARCHS[name]


# --------------------------------------------------------------------------- the layers
@contextlib.contextmanager
def cpu_reference_quantizer(device):
    """On the CPU, quantize the weights with the reference twins (bit-identical to the kernels:
    tests/test_quantize*.py; the forward still runs the kernels). Measured before the
    interpreter's block-amax fix (e5bd1b2): the interpreter's mxfp4 quantizer took 176 s for the
    4-layer stand-in model's weights and a CPU ``--suite moe-layer --limit 1 --formats mxfp4`` 80 s
    instead of 11 s; the reference is still the faster of the two."""
    if str(device) != "cpu" or not _checks.INTERPRET:
        yield
        return
    _checks.INTERPRET = False
    try:
        yield
    finally:
        _checks.INTERPRET = True


def _randw(r, shape, seed: int, scale: float) -> torch.Tensor:
    """N(0, scale^2) bf16 made in bf16 on the device (DeepSeek-V3's gate|up experts are 7.5 G
    elements: 30 GB as the fp32 the runner's ``_randn`` draws first)."""
    g = torch.Generator(device=r.device)
    g.manual_seed(seed)
    return torch.randn(*shape, generator=g, device=r.device, dtype=torch.bfloat16).mul_(scale)


class _Weights:
    """One architecture's bf16 layer (made once per architecture, on the device) and its
    quantized modules per (format, mode), kept while the suite stays on that architecture."""

    def __init__(self, r, a: MoeArch, seed: int):
        e, h, i = a.experts, a.hidden, a.intermediate
        self.arch = a
        self.w_gate_up = _randw(r, (e, 2 * i, h), seed, h ** -0.5)
        self.w_down = _randw(r, (e, h, i), seed + 1, i ** -0.5)
        self.router = _randw(r, (e, h), seed + 2, h ** -0.5)
        g = torch.Generator().manual_seed(seed)
        rank = torch.randperm(e, generator=g).double() + 1.0
        self.router_bias = (-torch.log(rank)).to(torch.bfloat16).to(r.device)  # Zipf(1) popularity
        gpt = a.activation == "gpt_oss"
        self.gate_up_bias = r._randn(e, 2 * i, seed=seed + 3, outliers=False, scale=0.1).float() if gpt else None
        self.down_bias = r._randn(e, h, seed=seed + 4, outliers=False, scale=0.1).float() if gpt else None
        self.correction_bias = (r._randn(e, seed=seed + 5, outliers=False, scale=0.01).float()
                                if a.score == "sigmoid" else None)
        self._ours: dict[tuple[str, bool], MoE] = {}

    def routing(self) -> dict:
        a = self.arch
        return dict(top_k=a.top_k, score=a.score, n_group=a.n_group, topk_group=a.topk_group,
                    correction_bias=self.correction_bias, routed_scaling_factor=a.routed_scaling_factor)

    def ours(self, fmt: str, weight_only: bool) -> MoE:
        key = (fmt, weight_only)
        if key not in self._ours:
            other = self._ours.get((fmt, not weight_only))
            if other is not None:  # the same quantized weights, the other activation mode
                ex = other.experts
                experts = Experts(ex.w_gate, ex.w_up, ex.w_down, w_gate_up=ex.w_gate_up, activation=ex.activation,
                                  gate_bias=ex.gate_bias, up_bias=ex.up_bias, down_bias=ex.down_bias,
                                  act_format=None if weight_only else "weights")
            else:
                kw = {}
                if self.arch.activation == "gpt_oss":
                    kw = dict(activation="gpt_oss", gate_up_bias=self.gate_up_bias, down_bias=self.down_bias)
                with cpu_reference_quantizer(self.w_down.device):
                    experts = Experts.from_dense(self.w_gate_up, self.w_down, fmt,
                                                 act_format=None if weight_only else "weights", **kw)
            self._ours[key] = MoE.from_experts(experts, self.router, router_bias=self.router_bias, **self.routing())
        return self._ours[key]

    def bf16_experts(self):
        """The bf16 weights in the attribute layout the float64 twin reads (``w_gate [E, I, H]``...)."""
        i = self.arch.intermediate
        gb = self.gate_up_bias
        return SimpleNamespace(w_gate=self.w_gate_up[:, :i], w_up=self.w_gate_up[:, i:], w_down=self.w_down,
                               gate_bias=None if gb is None else gb[:, :i], up_bias=None if gb is None else gb[:, i:],
                               down_bias=self.down_bias, activation=self.arch.activation, alpha=1.702, limit=7.0,
                               act_format=None, hidden=self.arch.hidden, intermediate=i)


def _route(w: _Weights, x: torch.Tensor):
    logits = torch.nn.functional.linear(x, w.router, w.router_bias)
    return route(logits, **w.routing())


def bf16_layer(w: _Weights, x: torch.Tensor, impl: str) -> torch.Tensor:
    """The bf16 MoE layer of ``w`` on ``x [T, H]``: ``impl`` "grouped-mm" (``torch._grouped_mm``
    over the permuted rows, no host sync) or "loop" (one GEMM pair per expert that has rows, the
    routing read on the host). Same router, top-k and combine as ours, fp32 accumulation of the
    combine, output bf16."""
    a = w.arch
    i = a.intermediate
    if impl == "loop" and x.is_cuda and torch.cuda.is_current_stream_capturing():
        # before any launch: the timer's graph capture stops cleanly and it times eager calls
        raise RuntimeError("the per-expert loop reads the routing on the host: not capturable")
    weights, idx = _route(w, x)
    out = torch.zeros((x.shape[0], a.hidden), dtype=torch.float32, device=x.device)

    def act(gu: torch.Tensor, e_row: torch.Tensor) -> torch.Tensor:
        gu = gu.float()
        if w.gate_up_bias is not None:
            gu = gu + w.gate_up_bias[e_row]
        g, u = gu[:, :i], gu[:, i:]
        if a.activation == "gpt_oss":
            g, u = g.clamp(max=7.0), u.clamp(-7.0, 7.0)
            return ((u + 1) * g * torch.sigmoid(1.702 * g)).to(x.dtype)
        return (torch.nn.functional.silu(g) * u).to(x.dtype)

    def down(y: torch.Tensor, e_row: torch.Tensor) -> torch.Tensor:
        y = y.float()
        return y if w.down_bias is None else y + w.down_bias[e_row]

    if impl == "grouped-mm":
        order, token, offsets = permute(idx, a.experts)
        e_row = idx.reshape(-1)[order]
        ends = offsets[1:]
        h = act(torch._grouped_mm(x[token], w.w_gate_up.transpose(1, 2), offs=ends), e_row)
        y = down(torch._grouped_mm(h, w.w_down.transpose(1, 2), offs=ends), e_row)
        out.index_add_(0, token, y * weights.reshape(-1)[order, None])
    elif impl == "loop":
        for e in torch.unique(idx).tolist():
            tok, slot = torch.where(idx == e)
            e_row = torch.full_like(tok, e)
            h = act(x[tok] @ w.w_gate_up[e].T, e_row)
            y = down(h @ w.w_down[e].T, e_row)
            out.index_add_(0, tok, y * weights[tok, slot, None])
    else:
        raise ValueError(f"impl: expected 'grouped-mm' or 'loop', got {impl!r}")
    return out.to(x.dtype)


# --------------------------------------------------------------------------- running
def _check(r, ref_fn):
    return r._check_close(None, ref_fn, LAYER_TOLERANCE)


def _weights_for(r, a: MoeArch, seed: int) -> _Weights:
    """The runner keeps one architecture's layers at a time (DeepSeek-V3's bf16 experts are 22.5 GB)."""
    held = getattr(r, "_moe_layer_weights", None)
    if held is None or held.arch != a:
        r._moe_layer_weights = None
        if r.device == "cuda":
            torch.cuda.empty_cache()
        r._moe_layer_weights = _Weights(r, a, seed)
    return r._moe_layer_weights


def run_moe_layer(r, case, fmt: str, ops, seed: int) -> None:
    """One ``moe-layer`` case (architecture ``case.arch``, ``case.m`` tokens) in one format."""
    import zlib

    a = arch_of(case)
    w = _weights_for(r, a, seed=zlib.crc32(a.name.encode()) % 10_000)
    t, h, i, e = case.m, a.hidden, a.intermediate, a.experts
    x0 = r._randn(t, h, seed=seed, dtype=r._act_dtype())
    weights0, idx0 = _route(w, x0)
    active = int(torch.unique(idx0).numel()) if t else 0
    wq = active * quantized_nbytes(fmt, (3 * i, h)) + e * h * 2
    xb = t * h * x0.element_size()
    n_sets = r._n_sets(2 * xb + wq)
    xs = [x0] + [r._randn(t, h, seed=seed + 7919 * j, dtype=x0.dtype) for j in range(1, n_sets)]
    flops = 2 * t * a.top_k * 3 * h * i
    count = Count(flops, wq + 2 * xb)
    refs: dict = {}

    def ref_of(key, module_experts):
        if key not in refs:
            refs.clear()  # one float64 reference at a time
            refs[key] = ref_experts(module_experts, x0, idx0, weights0)
        return refs[key]

    for op in ("moe", "moe-weight-only"):
        if op not in ops:
            continue
        moe = w.ours(fmt, weight_only=op == "moe-weight-only")
        ex = moe.experts
        r._measure(case, fmt, op, OURS, lambda x, moe=moe: moe(x), [(x,) for x in xs], count,
                   _check(r, lambda key=op, ex=ex: ref_of(key, ex)))
        # the expert work alone, on each input copy's rows already permuted (made now, untimed)
        sets = []
        for x in xs:
            wt, ix = _route(w, x)
            order, token, offsets = permute(ix, e)
            sets.append((x[token], offsets, ix.reshape(-1)[order], token, wt.reshape(-1)[order]))

        def combined(row, out, ex=ex, op=op, s=sets[0]):  # check: weight and combine the rows as the layer does
            y = torch.zeros(t, h, dtype=torch.float64, device=out.device)
            y.index_add_(0, s[3], out.double() * s[4].double()[:, None])
            _check(r, lambda: ref_of(op, ex))(row, y)

        r._measure(case, fmt, KERNELS[op], OURS, lambda rows, off, er, tok, wt, ex=ex: ex.expert_rows(rows, off, er, checked_after=True),
                   sets, count, combined)
    if r.cfg.baselines:
        bw = Count(flops, active * 3 * i * h * 2 + e * h * 2 + 2 * xb)
        ref_bf16 = lambda: ref_of("bf16", w.bf16_experts())  # noqa: E731
        for impl in BASELINES:
            if impl in r.cfg.baselines:
                r._measure(case, fmt, "moe-bf16", impl, lambda x, impl=impl: bf16_layer(w, x, _BF16_IMPL[impl]),
                           [(x,) for x in xs], bw, _check(r, ref_bf16))


# --------------------------------------------------------------------------- table
def glue_pct(layer_ms: float | None, kernels_ms: float | None) -> float | None:
    """The layer's time outside its expert work, in % of the layer: ``100 (1 - kernels / layer)``."""
    if not layer_ms or kernels_ms is None:
        return None
    return 100.0 * (1.0 - kernels_ms / layer_ms)


def table(rows: list[dict], kind: str = "moe-layer") -> tuple[list[str], list[list[str]]]:
    """(head, body): one line per layer row of ours with eager / graph times, % of the memory
    floor, the ratio to each bf16 layer (baseline graph time / ours), the glue share (graph
    times), issue 20's glue target at decode and its verdict, the plans, the check."""
    key = lambda r: (r.get("suite"), r["case"], r["format"])  # noqa: E731
    base = {(key(r), r["impl"]): r for r in rows if r.get("kind") == kind and r["impl"] != OURS and _ok(r)}
    kern = {(key(r), r["op"]): r for r in rows if r.get("kind") == kind and r["impl"] == OURS and _ok(r)}
    head = ["case", "format", "mode", "tokens", "eager us", "graph us", "% floor"]
    head += [f"vs {b}" for b in BASELINES] + ["glue", "target", "verdict", "plan", "check"]
    body = []
    for r in rows:
        if r.get("kind") != kind or r["impl"] != OURS or r["op"] not in MODES:
            continue
        ok = _ok(r)
        ratios = []
        for b in BASELINES:
            br = base.get((key(r), b))
            ratios.append(br["median_ms"] / r["median_ms"] if br and ok and r["median_ms"] > 0 else None)
        kr = kern.get((key(r), KERNELS[r["op"]]))
        glue = glue_pct(r.get("median_ms"), kr["median_ms"] if kr else None) if ok else None
        if r["M"] <= GLUE_DECODE_T:
            tt = f"glue < {GLUE_TARGET_PCT:.0f}%"
            v = "-" if glue is None else ("PASS" if glue < GLUE_TARGET_PCT else "MISS")
        else:
            tt, v = "-", "-"
        if r.get("check") == "FAIL" or r.get("status") != "ok" or (kr is not None and kr.get("check") == "FAIL"):
            v = "FAIL"
        check = r.get("check") or r.get("status", "-")
        if r.get("rel_err") is not None:
            check = f"{check} {r['rel_err']:.1e}"
        floor = r.get("mem_floor_pct") if ok else None
        body.append([r.get("requested") or r["case"], r["format"], MODES[r["op"]], str(r["M"]),
                     _us(r.get("eager_ms")), _us(r.get("median_ms")), "-" if floor is None else f"{floor:.0f}%",
                     *["-" if x is None else f"{x:.2f}x" for x in ratios], "-" if glue is None else f"{glue:.0f}%",
                     tt, v, r.get("config") or "-", check])
    return head, body


def verdict_counts(rows: list[dict]) -> dict:
    """{"PASS": n, "MISS": n, "FAIL": n, "-": n} over the table's verdicts."""
    return count_verdicts(table(rows))


def has_rows(rows: list[dict]) -> bool:
    return any(r.get("kind") in KINDS for r in rows)
