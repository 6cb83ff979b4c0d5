"""The model suite (``blockscaled bench --suite model``, issue 20): prefill and decode tokens/s of
a few layers of a mid-size MoE model (transformers, built from a config with random weights),
quantized with :func:`blockscaled.nn.quantize_model` (W x A and weight-only) against the same
model in bf16, same run.

Models: :data:`MODELS` (Qwen3-30B-A3B, gpt-oss-20b) with :data:`MODEL_LAYERS` of their decoder
layers and the vocabulary cut in the same proportion (``vocab * MODEL_LAYERS / layers``): the LM
head (kept bf16, as ``quantize_model`` does by default) then weighs what it weighs against the
layers in the whole model; with the full vocabulary it would dominate a 4-layer decode step
(Qwen3-30B-A3B: a 622 MB bf16 head against the 228 MB of fp8 weights 4 layers read per decode
step: attention 18.9 M + 8 routed experts 37.7 M parameters per layer).

Rows per case (phase, tokens, format), impl ``blockscaled`` (ops ``model`` = W x A and
``model-weight-only``) and ``bf16-model`` (op ``model-bf16``):

  ``prefill``      ``model(ids [1, P], use_cache=False, logits_to_keep=1)``: tokens/s = P / time
  ``decode``       one decode step, ``model(ids [B, 1], use_cache=False, logits_to_keep=1)``:
                   every layer's weights for B new tokens, without the KV history (attention
                   over the context runs in bf16 in both models and is not what quantization
                   changes); tokens/s = B / time, CUDA graph replays (what a serving engine runs)
                   and eager
  ``generate``     ``model.generate`` of :data:`GENERATE_TOKENS` greedy tokens after a prompt of
                   ``ctx`` tokens, minus a 1-token generate (the prefill): the eager decode
                   tokens/s a transformers user gets, KV cache and host overheads included

Check (every row of ours): cosine of the logits against the bf16 model's on the same ids, at
least :data:`MODEL_MIN_COS` for the format; the bf16 rows are the reference. :func:`table` gives
tokens/s, the ratio to bf16 and issue 20's decode targets (>= 1.5x bf16 for fp8_block weights,
>= 2x for fp4 weights) on the ``decode`` rows.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace

import torch

from ..nn.model import quantization_report, quantize_model
from .counting import Count
from .layers import MoeArch, arch_of, cpu_reference_quantizer
from .tables import count_verdicts
from .tables import timed as _ok
from .timing import Timing

__all__ = ["ModelSpec", "MODELS", "model_vocab", "MODEL_LAYERS", "MODEL_MIN_COS", "GENERATE_TOKENS", "build_model", "run_model",
           "table", "verdict_counts", "KINDS", "PHASES"]

KINDS = ("model",)
OURS = "blockscaled"
PHASES = ("prefill", "decode", "generate")
MODES = {"model": "WxA", "model-weight-only": "W-only"}
#: decoder layers built (the models' first layers: all MoE in both)
MODEL_LAYERS = 4
#: greedy tokens per timed generate call
GENERATE_TOKENS = 16
#: minimum logits cosine against the bf16 model. tests/test_nn.py measured, on tiny random
#: models: dense models W x A fp8_block / mxfp8 >= 0.997, mxfp4 >= 0.947, nvfp4 >= 0.965; MoE
#: models whole-model mxfp4 0.74-0.80 (routing flips on near-tied router scores add to the
#: kernel error); a layer's scales doubled gave fp8_block 0.944. These limits sit between.
MODEL_MIN_COS = {"fp8_block": 0.98, "mxfp8": 0.98, "nvfp4": 0.70, "mxfp4": 0.70}
#: issue 20's decode targets: tokens/s against the bf16 model
DECODE_TARGET = {"fp8_block": 1.5, "mxfp8": 1.5, "nvfp4": 2.0, "mxfp4": 2.0}


@dataclass(frozen=True)
class ModelSpec:
    """The attention / vocabulary side of a model (its MoE dimensions: :data:`layers.ARCHS`)."""

    arch: str
    family: str  # "qwen3_moe" | "gpt_oss"
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    sliding_window: int | None = None


MODELS: dict[str, ModelSpec] = {m.arch: m for m in (
    ModelSpec("qwen3-30b-a3b", "qwen3_moe", 48, 32, 4, 128, 151936),
    ModelSpec("gpt-oss-20b", "gpt_oss", 24, 64, 8, 64, 201088, sliding_window=128),
)}
DECODE_BATCH = (1, 8, 64)
PREFILL_TOKENS = (512, 4096)
CONTEXT = 512


def _spec(a: MoeArch) -> ModelSpec:
    if a.name.startswith("tiny:"):
        s = MODELS[a.name[5:]]
        return replace(s, layers=MODEL_LAYERS, heads=4, kv_heads=2, head_dim=32, vocab=256,
                       sliding_window=s.sliding_window and 8)
    return MODELS[a.name]


def model_vocab(s: ModelSpec) -> int:
    """The vocabulary built for ``s``: ``vocab * MODEL_LAYERS / layers`` rounded up to 64."""
    return -(-s.vocab * MODEL_LAYERS // s.layers // 64) * 64


def build_model(a: MoeArch, device, seed: int = 0):
    """A transformers ``*ForCausalLM`` with ``a``'s MoE layers, :data:`MODEL_LAYERS` decoder
    layers, the vocabulary cut in proportion, random weights (experts and biases redrawn: the
    transformers initialisation leaves some of them zero), bf16, eval mode, on ``device``."""
    import transformers

    s = _spec(a)
    tiny = a.name.startswith("tiny:")
    vocab = s.vocab if tiny else model_vocab(s)
    # the stand-in's hidden size: a whole 128-element block, as quantize_model's fp8_block needs
    n_layers = 2 if tiny else MODEL_LAYERS  # the stand-in: interpreter time per layer
    common = dict(vocab_size=vocab, hidden_size=128 if tiny else a.hidden, num_hidden_layers=n_layers, num_attention_heads=s.heads,
                  num_key_value_heads=s.kv_heads, head_dim=s.head_dim, num_experts_per_tok=a.top_k,
                  max_position_embeddings=8192)
    if s.family == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(**common, intermediate_size=4 * a.intermediate,
                                          moe_intermediate_size=a.intermediate, num_experts=a.experts,
                                          decoder_sparse_step=1, norm_topk_prob=True)
        cls = transformers.Qwen3MoeForCausalLM
    elif s.family == "gpt_oss":
        types = ["sliding_attention", "full_attention"] * (n_layers // 2)
        cfg = transformers.GptOssConfig(**common, intermediate_size=a.intermediate, num_local_experts=a.experts,
                                        layer_types=types, sliding_window=s.sliding_window)
        cls = transformers.GptOssForCausalLM
    else:
        raise ValueError(f"family: {s.family!r} not known")
    torch.manual_seed(seed)
    with torch.device(device):
        model = cls(cfg).to(torch.bfloat16).eval()
    with torch.no_grad():
        for mod in model.modules():
            for n, p in mod.named_parameters(recurse=False):
                if p.ndim == 3 or n.endswith("_proj_bias"):
                    p.normal_(0.0, cfg.initializer_range)
    return model


class _Models:
    """The bf16 model of one architecture and its quantized copies per (format, weight-only)."""

    def __init__(self, a: MoeArch, device):
        self.arch, self.device = a, device
        self.bf16 = build_model(a, device)
        self._q: dict[tuple[str, bool], torch.nn.Module] = {}

    def ours(self, fmt: str, weight_only: bool):
        """The model quantized by ``quantize_model`` (defaults: LM head and routers kept bf16).
        Raises where a decoder layer's linear or experts module stayed unquantized: the row would
        time a partly bf16 model under our name."""
        key = (fmt, weight_only)
        if key not in self._q:
            with cpu_reference_quantizer(self.device):
                q = quantize_model(self.bf16, fmt, weight_only=weight_only, inplace=False)
            rep = quantization_report(q)
            kept = {n: why for n, why in {**rep.skipped, **rep.experts}.items() if ".layers." in n}
            if kept:
                name, why = next(iter(kept.items()))
                raise ValueError(f"quantize_model kept {len(kept)} decoder modules of {self.arch.name} in bf16 for "
                                 f"{fmt}, e.g. {name}: {why}")
            self._q[key] = q
        return self._q[key]


def _models_for(r, a: MoeArch) -> _Models:
    held = getattr(r, "_models", None)
    if held is None or held.arch != a:
        r._models = None
        if r.device == "cuda":
            torch.cuda.empty_cache()
        r._models = _Models(a, r.device)
    return r._models


def _cosine_check(fmt: str, ref_logits):
    lim = MODEL_MIN_COS.get(fmt, 0.98)

    def check(row, out):
        logits = out.logits if hasattr(out, "logits") else out
        a, b = logits.double().flatten(), ref_logits().double().flatten()
        cos = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
        row["cosine"] = cos
        row["nonfinite"] = int((~torch.isfinite(a)).sum())
        row["tol"] = f"logits cosine vs bf16 >= {lim}"
        row["check"] = "ok" if cos >= lim and row["nonfinite"] == 0 else "FAIL"

    return check


def _ids(r, shape, vocab, seed):
    g = torch.Generator(device=r.device)
    g.manual_seed(seed)
    return torch.randint(0, vocab, shape, generator=g, device=r.device)


def _forward(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False, logits_to_keep=1).logits


def _generate(model, ids, new_tokens: int):
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)


def _time_generate(r, model, ids, repeats: int) -> Timing:
    """Per decoded token: medians of (generate GENERATE_TOKENS + 1 tokens) - (generate 1 token),
    the two alternated, after one untimed call of each."""
    def wall(n):
        if r.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        _generate(model, ids, n)
        if r.device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    first = wall(GENERATE_TOKENS + 1)
    wall(1)
    long, short = [], []
    for _ in range(repeats):
        long.append(wall(GENERATE_TOKENS + 1))
        short.append(wall(1))
    per = sorted((lg - statistics.median(short)) / GENERATE_TOKENS for lg in long)
    med = statistics.median(per)
    return Timing(med, per[len(per) // 5], per[(4 * len(per)) // 5], per[0], first, repeats, "eager-generate", 1)


def run_model(r, case, fmt: str, ops, seed: int) -> None:
    """One ``model`` case (phase ``case.label``, ``case.m`` tokens: the prompt length of a
    prefill, the batch of a decode step or a generate) in one format."""
    phase = case.label
    if phase not in ops:
        return
    a = arch_of(case)
    if not _has_transformers():
        r.note("model suite skipped: it builds transformers models (pip install transformers)")
        return
    ms = _models_for(r, a)
    vocab = ms.bf16.config.vocab_size
    if phase == "prefill":
        shape = (1, case.m)
    elif phase == "decode":
        shape = (case.m, 1)
    else:
        shape = (case.m, case.context)
    n_sets = 1 if phase == "generate" else 4  # decode: other tokens, other experts each call
    sets = [(_ids(r, shape, vocab, seed + j),) for j in range(n_sets)]
    count = Count(0, 0)  # rows report tokens/s (the table: M tokens per timed call), not a roofline
    refs: dict = {}

    def ref_logits():
        if "x" not in refs:
            with torch.no_grad():
                refs["x"] = ms.bf16(input_ids=sets[0][0], use_cache=False).logits
        return refs["x"]

    impls = [("model-bf16", "bf16-model", ms.bf16)] if r.cfg.timing else []
    for op in ("model", "model-weight-only"):
        try:
            impls.append((op, OURS, ms.ours(fmt, weight_only=op == "model-weight-only")))
        except Exception as e:  # a format the model's shapes cannot take: say so, in its row
            row = r._base_row(case, fmt, op, OURS)
            r._error_row(row, fmt, e)
            r.rows.append(r._finish_row(row, count, None, fmt))
    for op, impl, model in impls:
        check = None if impl != OURS else _cosine_check(fmt, ref_logits)
        if phase in ("prefill", "decode"):
            def fn(ids, model=model):
                return _forward(model, ids)

            def full(row, out, model=model, check=check):  # the check reads every position's logits
                with torch.no_grad():
                    check(row, model(input_ids=sets[0][0], use_cache=False).logits)

            r._measure(case, fmt, op, impl, fn, sets, count, full if check else None)
        else:
            row = r._base_row(case, fmt, op, impl)
            try:
                if check is not None:
                    with torch.no_grad():
                        check(row, model(input_ids=sets[0][0], use_cache=False).logits)
                timing = _time_generate(r, model, sets[0][0], repeats=max(3, r.cfg.iterations // 10)) \
                    if r.cfg.timing else None
                if timing is None:  # CPU: run it once (correctness of the path, no timing)
                    _generate(model, sets[0][0], 2)
            except Exception as e:
                r._error_row(row, fmt, e)
                timing = None
            r.rows.append(r._finish_row(row, count, timing, fmt))


def _has_transformers() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformers") is not None


# --------------------------------------------------------------------------- table
def _tps(v) -> str:
    return "-" if v is None else f"{v:,.0f}"


def tokens_per_s(row: dict, key: str = "median_ms") -> float | None:
    """Tokens per second of a model row: its M tokens (prompt length of a prefill, batch of a
    decode step or of a generate's per-token time) per timed call."""
    ms = row.get(key)
    return row["M"] / (ms * 1e-3) if ms else None


def table(rows: list[dict], kind: str = "model") -> tuple[list[str], list[list[str]]]:
    """(head, body): one line per row of ours with tokens/s (graph / eager where both were timed),
    the ratio to the bf16 model (its time / ours, graph times), the decode target, the verdict,
    the logits cosine."""
    key = lambda r: (r.get("suite"), r["case"], r["format"])  # noqa: E731
    base = {key(r): r for r in rows if r.get("kind") == kind and r["impl"] != OURS and _ok(r)}
    head = ["case", "format", "mode", "tokens/s", "eager tokens/s", "bf16 tokens/s", "vs bf16", "target", "verdict",
            "check"]
    body = []
    for r in rows:
        if r.get("kind") != kind or r["impl"] != OURS:
            continue
        ok = _ok(r)
        br = base.get(key(r))
        ratio = br["median_ms"] / r["median_ms"] if br and ok and r["median_ms"] > 0 else None
        phase = r.get("case", "").split()[1] if len(r.get("case", "").split()) > 1 else ""
        need = DECODE_TARGET.get(r["format"]) if phase == "decode" else None
        if need is None:
            tt, v = "-", "-"
        else:
            tt = f">= {need:.1f}x bf16"
            v = "-" if ratio is None else ("PASS" if ratio >= need else "MISS")
        if r.get("check") == "FAIL" or r.get("status") != "ok":
            v = "FAIL"
        check = r.get("check") or r.get("status", "-")
        if r.get("cosine") is not None:
            check = f"{check} cos {r['cosine']:.4f}"
        body.append([r.get("requested") or r["case"], r["format"], MODES.get(r["op"], r["op"]),
                     _tps(tokens_per_s(r)), _tps(tokens_per_s(r, "eager_ms")),
                     _tps(tokens_per_s(br) if br else None), "-" if ratio is None else f"{ratio:.2f}x", tt, v,
                     check])
    return head, body


def verdict_counts(rows: list[dict]) -> dict:
    """{"PASS": n, "MISS": n, "FAIL": n, "-": n} over the table's verdicts."""
    return count_verdicts(table(rows))

