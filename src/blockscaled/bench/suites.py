"""Shape suites as data: each suite is a list of :class:`Case` records.

Kinds of case:
  ``gemm``     dense ``[M,K] x [N,K]^T`` (ops: quantize, gemm, linear)
  ``grouped``  MoE contiguous: ``ms[e]`` rows per expert, weights ``[E,N,K]`` (op: grouped)
  ``masked``   MoE masked: A ``[E, max_m, K]``, ``ms[e]`` valid rows (op: grouped)
  ``swiglu``   dual GEMM ``silu(A Wg^T) * (A Wu^T)`` (op: swiglu)
  ``quantize`` quantizer only, input ``[M, K]`` (op: quantize)
  ``mx``       dense MX/NV ``[M,K] x [N,K]^T`` in three modes (ops: weight-only = bf16 x with
               ``linear(weight_only=True)``, gemm = W x A on quantized A, linear = E2E with the
               activation quantizer) and, for mxfp4 from M = 256, two on an exact fp8_block copy
               of the weight (ops: packed, packed-linear), vs cuBLAS bf16 on the dequantized
               weight (bench/mx.py)
  ``mx-moe``   MoE contiguous with skewed routing, bf16 (weight-only) or quantized activations
               (ops: weight-only, grouped), vs a per-expert bf16 cuBLAS loop and torch._grouped_mm
  ``moe-layer`` the whole ``nn.MoE`` layer of an architecture at T tokens (ops: moe = W x A,
               moe-weight-only), vs the bf16 layer (bench/layers.py)
  ``model``    a few layers of a transformers MoE model, quantized vs bf16 (ops = phases:
               prefill, decode, generate; bench/model_suite.py)

Sources:
  deepseek     DeepSeek-V3 dense N,K (the six shapes of docs/design.md, "Measurements older than
               NOTES.md") x M in {64,128,4096}; M in {1,16} with ``--deepseek-small-m``.
  moe          E in {1,4,8} x m/expert in {64,128,512} x N,K in {2048,4096,7168} (81).
  masked       the shapes of DeepGEMM's masked figures (docs/design.md, "Measurements older than
               NOTES.md"): E=8, max_m=256, m in {64,128}, (N,K) in {(4096,7168),(7168,2048)},
               plus skewed/empty counts.
  nvfp4-group  GPU MODE ``nvfp4_group_gemm`` benchmarks, an earlier revision of its task.yml
               (varying M per group, one N,K per case).
  dual-gemm    GPU MODE ``nvfp4_dual_gemm`` task.yml benchmarks (M,N,K; L=1).
  quantize     16384x7168 bf16 (the quantizer target of docs/design.md, "The bar": >= 2500 GB/s)
               plus a few engine shapes.
  small/medium/large  an MXFP8 profiling script's test cases.
  families     issue 19's broad dense fp8_block set (:func:`_families`): the attention and MLP linears
               of 11 public model families (bench/models.py FAMILY_PAIRS, the planner's validation
               pairs) x M in {1, 32, 128, 2048, 8192}, against DeepGEMM and cuBLAS fp8_block.
  mx           issue 18's MX/NV suite (:func:`_mx`): gpt-oss and Llama 3 8B / 70B linears x M in
               {1, 16, 64, 256, 2048, 8192} (``mx`` cases), gpt-oss-120b / -20b MoE (mxfp4) and
               Qwen3-30B-A3B MoE (nvfp4) at the same token counts (``mx-moe`` cases).
  moe-layer    issue 20's layer suite: the MoE layers of Qwen3-30B-A3B, gpt-oss-20b, Mixtral 8x7B
               and DeepSeek-V3 (bench/layers.py ARCHS) at T in {1, 8, 64, 512, 4096}, each in the
               formats its checkpoints ship in.
  model        issue 20's model suite: Qwen3-30B-A3B and gpt-oss-20b, 4 layers (bench/model_suite.py):
               decode steps at B in {1, 8, 64}, prefill of 512 and 4096 tokens, generate at B in {1, 8}.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from .layers import ARCHS, LAYER_TOKENS, tiny_arch
from .models import FAMILY_PAIRS, linear_nk
from .model_suite import CONTEXT, DECODE_BATCH, MODELS, PREFILL_TOKENS

__all__ = [
    "Case",
    "SUITES",
    "TEST_CASES",
    "DEEPSEEK_NK",
    "get_suite",
    "test_case_suite",
    "custom_cases",
    "tiny",
    "dedupe",
    "for_interpreter",
    "MX_LINEARS",
    "MX_MOE",
    "MX_M",
    "FAMILIES_M",
    "skewed_routing",
    "DEFAULT_FORMATS",
    "DEFAULT_OPS",
]


@dataclass(frozen=True)
class Case:
    """One benchmark configuration (no tensors; inputs are made by the runner)."""

    suite: str
    kind: str  # gemm | grouped | masked | swiglu | quantize
    m: int  # rows (gemm/swiglu/quantize); max_m for masked; sum of ms for grouped
    n: int
    k: int
    ms: tuple[int, ...] = ()  # rows per expert / group (grouped, masked)
    label: str = ""
    tags: tuple[str, ...] = field(default=())
    #: the name of the case the user asked for, when this one runs in its place (a CPU run
    #: through the interpreter, see :func:`for_interpreter`); "" on a GPU. Not part of equality.
    requested: str = field(default="", compare=False)
    #: the formats this case runs (within --formats / the suite's defaults); () = all of them
    formats: tuple[str, ...] = ()
    #: moe-layer / model cases: the architecture (bench/layers.py ARCHS; "tiny:<name>" on a CPU)
    arch: str = ""
    #: model cases: the prompt length of a generate case
    context: int = 0

    @property
    def experts(self) -> int:
        return len(self.ms)

    @property
    def name(self) -> str:
        if self.kind == "moe-layer":
            return f"{self.arch} T={self.m}"
        if self.kind == "model":  # label: the phase
            size = {"prefill": f"P={self.m}", "decode": f"B={self.m}"}.get(self.label, f"B={self.m} ctx={self.context}")
            return f"{self.arch} {self.label} {size}"
        if self.kind in ("grouped", "masked", "mx-moe"):
            ms = set(self.ms)
            mdesc = f"m={self.ms[0]}" if len(ms) == 1 else f"m={min(self.ms)}..{max(self.ms)}"
            base = f"E={self.experts} {mdesc} N={self.n} K={self.k}"
            if self.kind == "masked":
                base += f" max_m={self.m}"
        else:
            base = f"M={self.m} N={self.n} K={self.k}" if self.kind != "quantize" else f"{self.m}x{self.k}"
        return f"{self.label} {base}".strip() if self.label else base


# DeepSeek-V3 dense GEMM (N, K) pairs, in the order of docs/design.md, "Measurements older than
# NOTES.md" (the DeepGEMM figures the scripts compare with).
DEEPSEEK_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))


def _deepseek(small_m: bool = False) -> list[Case]:
    ms = (1, 16, 64, 128, 4096) if small_m else (64, 128, 4096)
    return [Case("deepseek", "gemm", m, n, k) for m in ms for (n, k) in DEEPSEEK_NK]


#: issue 19's M bands (its targets: per band, the geomean against DeepGEMM and the worst row)
FAMILIES_M = (1, 32, 128, 2048, 8192)


def _families() -> list[Case]:
    shapes: dict[tuple[int, int], str] = {}  # one case per shape (Mixtral's expert down is Llama 3 8B's down)
    for pair in FAMILY_PAIRS:
        shapes.setdefault(linear_nk(*pair), " ".join(pair))
    return [Case("families", "gemm", m, n, k, label=label) for m in FAMILIES_M for (n, k), label in shapes.items()]


def _moe() -> list[Case]:
    out = []
    dims = (2048, 4096, 7168)
    # E=8 first: the DeepSeek-V3-like configs come first in a sweep cut short by a time limit.
    for e, m, n, k in itertools.product((8, 4, 1), (64, 128, 512), dims, dims):
        out.append(Case("moe", "grouped", e * m, n, k, ms=(m,) * e))
    return out


def _masked() -> list[Case]:
    out = []
    for (n, k), m in itertools.product(((4096, 7168), (7168, 2048)), (64, 128)):
        out.append(Case("masked", "masked", 256, n, k, ms=(m,) * 8))
    # Skewed and empty experts (correctness-relevant; timing shows load imbalance).
    out.append(Case("masked", "masked", 256, 4096, 7168, ms=(256, 0, 1, 64, 0, 200, 17, 128), label="skewed"))
    return out


# GPU MODE nvfp4_group_gemm benchmarks (an earlier revision of task.yml: M varies per group,
# N and K fixed per case). A later revision of gpu-mode/reference-kernels task.yml
# (commit ca68dc5) uses M=128 for all groups with varying N; no suite has it yet.
NVFP4_GROUP = (
    ((80, 176, 128, 72, 64, 248, 96, 160), 4096, 7168),
    ((40, 76, 168, 72, 164, 148, 196, 160), 7168, 2048),
    ((192, 320), 3072, 4096),
    ((128, 384), 4096, 1536),
)


def _nvfp4_group() -> list[Case]:
    return [
        Case("nvfp4-group", "grouped", sum(ms), n, k, ms=ms, label=f"gpumode#{i}")
        for i, (ms, n, k) in enumerate(NVFP4_GROUP, 1)
    ]


# GPU MODE nvfp4_dual_gemm task.yml benchmarks (M, N, K), L = 1.
DUAL_GEMM = ((256, 4096, 7168), (512, 4096, 7168), (256, 3072, 4096), (512, 3072, 7168))


def _dual_gemm() -> list[Case]:
    return [Case("dual-gemm", "swiglu", m, n, k, label=f"gpumode#{i}") for i, (m, n, k) in enumerate(DUAL_GEMM, 1)]


def _quantize() -> list[Case]:
    shapes = ((16384, 7168), (4096, 7168), (128, 7168), (8192, 2048), (16384, 18432))
    return [Case("quantize", "quantize", m, 0, k, tags=("target",) if (m, k) == (16384, 7168) else ()) for m, k in shapes]


# An MXFP8 profiling script's test cases, including the shapes its kernel failed on (M=256, N=512,
# K=1024; N not a multiple of 256).
TEST_CASES: dict[str, tuple[tuple[int, int, int], ...]] = {
    "small": ((128, 256, 512), (256, 512, 1024), (1, 384, 640)),
    "medium": ((512, 1024, 2048), (1024, 2048, 4096), (777, 1536, 2112)),
    "large": ((4096, 4096, 4096), (8192, 8192, 8192), (4096, 7168, 2048)),
}


# Issue 18's MX/NV suite. Dense linears (family, layer, N, K): gpt-oss (both sizes: hidden 2880,
# the per-expert gate_up N = 5760 and down 2880 x 2880 run as dense GEMMs), Llama 3 8B and 70B
# (two projections each: a short-N one and a long-K / wide one). Token counts: decode to prefill.
MX_LINEARS = (
    ("gpt-oss", "gate_up", 5760, 2880), ("gpt-oss", "down", 2880, 2880),
    ("llama3-8b", "qkv", 6144, 4096), ("llama3-8b", "down", 4096, 14336),
    ("llama3-70b", "o", 8192, 8192), ("llama3-70b", "gate_up", 57344, 8192),
)
MX_M = (1, 16, 64, 256, 2048, 8192)
#: MoE layers (model, layer, experts, top-k, N, K, weight format): gpt-oss-120b (128 experts) and
#: -20b (32), top-4, MXFP4 experts as released; Qwen3-30B-A3B (128 experts, top-8, expert
#: intermediate 768, hidden 2048) as NVIDIA's NVFP4 checkpoint quantizes it.
MX_MOE = (
    ("gpt-oss-120b", "gate_up", 128, 4, 5760, 2880, "mxfp4"), ("gpt-oss-120b", "down", 128, 4, 2880, 2880, "mxfp4"),
    ("gpt-oss-20b", "gate_up", 32, 4, 5760, 2880, "mxfp4"), ("gpt-oss-20b", "down", 32, 4, 2880, 2880, "mxfp4"),
    ("qwen3-30b-a3b", "gate_up", 128, 8, 1536, 2048, "nvfp4"), ("qwen3-30b-a3b", "down", 128, 8, 2048, 768, "nvfp4"),
)
#: Zipf exponent of the expert popularity of the skewed routing (expert of rank r drawn with weight
#: r**-alpha): with 128 experts the most popular one gets ~18% of the draws, the median one ~0.4%.
ROUTING_ZIPF = 1.0


def skewed_routing(tokens: int, experts: int, top_k: int, seed: int) -> tuple[int, ...]:
    """Rows per expert of ``tokens`` tokens routed to ``top_k`` distinct experts each, drawn
    (Gumbel top-k, torch's CPU generator seeded with ``seed``: the same counts on every machine)
    from a Zipf(:data:`ROUTING_ZIPF`) popularity over a seeded permutation of the experts.
    Sums to ``tokens * top_k``; every count <= ``tokens``; popular experts hold many rows, many
    others none at decode sizes."""
    import torch

    g = torch.Generator().manual_seed(seed)
    rank = torch.randperm(experts, generator=g).double() + 1.0
    logits = -ROUTING_ZIPF * torch.log(rank)
    u = torch.rand(tokens, experts, generator=g, dtype=torch.float64).clamp_(1e-12, 1 - 1e-12)
    choice = (logits - torch.log(-torch.log(u))).topk(top_k, dim=1).indices
    return tuple(int(c) for c in torch.bincount(choice.reshape(-1), minlength=experts))


def _mx() -> list[Case]:
    out = [Case("mx", "mx", m, n, k, label=f"{fam} {layer}") for m in MX_M for fam, layer, n, k in MX_LINEARS]
    for i, (model, layer, e, top_k, n, k, fmt) in enumerate(MX_MOE):
        for t in MX_M:
            ms = skewed_routing(t, e, top_k, seed=1000 * i + t)
            out.append(Case("mx", "mx-moe", sum(ms), n, k, ms=ms, label=f"{model} {layer} top-{top_k} T={t}",
                            formats=(fmt,)))
    return out


def _moe_layer() -> list[Case]:
    return [Case("moe-layer", "moe-layer", t, a.hidden, a.intermediate, arch=name, formats=a.formats)
            for name, a in ARCHS.items() for t in LAYER_TOKENS]


def _model() -> list[Case]:
    out = []
    for name in MODELS:
        a = ARCHS[name]
        kw = dict(arch=name, formats=a.formats)
        out += [Case("model", "model", b, a.hidden, a.intermediate, label="decode", **kw) for b in DECODE_BATCH]
        out += [Case("model", "model", p, a.hidden, a.intermediate, label="prefill", **kw) for p in PREFILL_TOKENS]
        out += [Case("model", "model", b, a.hidden, a.intermediate, label="generate", context=CONTEXT, **kw)
                for b in DECODE_BATCH[:2]]
    return out


def test_case_suite(names: list[str]) -> list[Case]:
    out = []
    for name in names:
        out += [Case(name, "gemm", m, n, k) for (m, n, k) in TEST_CASES[name]]
    return out


def custom_cases(triples: list[tuple[int, int, int]]) -> list[Case]:
    return [Case("custom", "gemm", m, n, k) for (m, n, k) in triples]


SUITES = {
    "deepseek": _deepseek,
    "families": _families,
    "moe": _moe,
    "masked": _masked,
    "nvfp4-group": _nvfp4_group,
    "dual-gemm": _dual_gemm,
    "quantize": _quantize,
    "mx": _mx,
    "moe-layer": _moe_layer,
    "model": _model,
}

#: formats run when --formats is not given
DEFAULT_FORMATS = {
    "deepseek": ("fp8_block",),
    "families": ("fp8_block",),
    "moe": ("fp8_block",),
    "masked": ("fp8_block",),
    "nvfp4-group": ("nvfp4",),
    "dual-gemm": ("nvfp4",),
    "quantize": ("fp8_block", "mxfp8", "mxfp4", "nvfp4"),
    "mx": ("mxfp8", "mxfp4", "nvfp4"),
    "moe-layer": ("fp8_block", "mxfp8", "mxfp4", "nvfp4"),  # each case keeps its architecture's formats
    "model": ("fp8_block", "mxfp8", "mxfp4", "nvfp4"),
    "test-cases": ("fp8_block", "mxfp8", "mxfp4", "nvfp4"),
}

#: ops run per case kind when --ops is not given
DEFAULT_OPS = {
    "gemm": ("quantize", "gemm", "linear"),
    "grouped": ("grouped",),
    "masked": ("grouped",),
    "swiglu": ("swiglu",),
    "quantize": ("quantize",),
    "mx": ("weight-only", "gemm", "linear", "packed", "packed-linear"),
    "mx-moe": ("weight-only", "grouped"),
    "moe-layer": ("moe", "moe-weight-only"),
    "model": ("prefill", "decode", "generate"),
}

#: ops a case kind can run at all
ALLOWED_OPS = {
    "gemm": ("quantize", "gemm", "linear", "swiglu"),
    "grouped": ("grouped",),
    "masked": ("grouped",),
    "swiglu": ("swiglu",),
    "quantize": ("quantize",),
    "mx": ("weight-only", "gemm", "linear", "packed", "packed-linear"),
    "mx-moe": ("weight-only", "grouped"),
    "moe-layer": ("moe", "moe-weight-only"),
    "model": ("prefill", "decode", "generate"),
}


def get_suite(name: str, *, deepseek_small_m: bool = False) -> list[Case]:
    if name == "deepseek":
        return _deepseek(deepseek_small_m)
    return SUITES[name]()


def dedupe(cases: list[Case]) -> list[Case]:
    """Drop cases with the same kind and shape as an earlier one (keeps order). The kept case
    also answers for the dropped ones: their ``requested`` names are appended to its own."""
    index: dict[tuple, int] = {}
    out: list[Case] = []
    for c in cases:
        key = (c.kind, c.m, c.n, c.k, c.ms, c.formats, c.arch, c.label if c.kind == "model" else "", c.context)
        if key not in index:
            index[key] = len(out)
            out.append(c)
        elif c.requested:
            kept = out[index[key]]
            names = [n for n in kept.requested.split("; ") if n]
            if c.requested not in names:
                out[index[key]] = replace(kept, requested="; ".join(names + [c.requested]))
    return out


def tiny(case: Case) -> Case:
    """A small stand-in of ``case`` for the interpreter (CPU) correctness run: keeps the kind,
    the expert count (capped at 3) and some of the awkwardness (unaligned N and K derived from
    the original sizes, so different cases stay different) but shrinks every dimension."""
    if case.kind in ("moe-layer", "model"):  # the architecture's stand-in (bench/layers.py tiny_arch)
        a = tiny_arch(ARCHS[case.arch])
        m = min(case.m, {"prefill": 8, "generate": 2}.get(case.label, 5))
        n = 128 if case.kind == "model" else a.hidden  # model_suite.build_model: a whole fp8_block block
        return replace(case, m=m, n=n, k=a.intermediate, arch=a.name, context=min(case.context, 6))
    m = min(case.m, 5)
    n = (case.n if case.n <= 64 else 32 + case.n % 33) if case.n else 0
    k = case.k if case.k <= 192 else 96 + case.k % 97
    ms = tuple(min(x, 4) for x in case.ms[:3])
    if case.kind == "mx-moe":
        # one skewed decode and one prefill stand-in per layer (the routing's own draws would
        # give every token count a stand-in of its own, each minutes of interpreter in all):
        # an empty expert, one row, a partial tile
        ms = (1, 0, 3) if case.m <= 64 * 8 else (4, 2, 5)
    if case.kind == "masked":
        m = max(ms) if ms else 1
    elif case.kind in ("grouped", "mx-moe"):
        m = sum(ms)
    return replace(case, m=m, n=n, k=k, ms=ms)


#: why a CPU run scales cases down, said with every scaled case
INTERPRETER_REASON = (
    "the Triton interpreter runs every kernel program in Python (seconds for one quantize of "
    "256x1024, against microseconds on a GPU), so full sizes would take minutes per case"
)


def for_interpreter(cases: list[Case], full: bool = False) -> list[Case]:
    """The cases a CPU (Triton interpreter) run executes in place of ``cases``: each one's
    :func:`tiny` stand-in (the case itself where it is already that small), or the case as it is
    with ``full=True``; every returned case names what was asked for in ``requested``, and
    stand-ins of the same shape are merged (:func:`dedupe`).

    Example: ``for_interpreter([Case("custom", "gemm", 256, 512, 1024)])`` ->
    ``[Case("custom", "gemm", 5, 49, 150, requested="M=256 N=512 K=1024")]``.
    """
    return dedupe([replace(c if full else tiny(c), requested=c.name) for c in cases])
