"""blockscaled.warmup: every distinct plan of token counts 1..max_tokens runs once."""

from __future__ import annotations

import pytest
import torch

import blockscaled as bs
import blockscaled.ops.quantize as quant_mod
from blockscaled.plan import observe_plans


def test_warmup_runs_every_distinct_plan(path, device, monkeypatch):
    # The quantizer's tiles change with M only once M rows fill 2 programs per SM: on a 132-SM GPU
    # not below M = 528. Four SMs (the interpreter's count) make them change within 1..40 on
    # every device, so the test sees the case it checks without compiling hundreds of M.
    monkeypatch.setattr(quant_mod, "_num_sms", lambda dev: 4)
    w = bs.quantize(torch.randn(64, 256, dtype=torch.bfloat16, device=device), "fp8_block", block=(128, 128))
    report = bs.warmup(w, max_tokens=40, progress=False)
    if path == "reference":
        assert report.entries == []  # nothing to compile on the reference path
        return
    plans = {bs.explain("linear", torch.zeros(m, 256, dtype=torch.bfloat16, device=device), w).describe()
             for m in range(1, 41)}
    assert {desc for _, _, desc, _ in report.entries} == plans
    covered = set()
    for _, (lo, hi), _, _ in report.entries:
        covered |= set(range(lo, hi + 1))
    assert covered >= set(range(1, 41))
    # the activation quantizer's tiles follow M too (each is its own compile): every (plan,
    # quantizer tiles) pair of M = 1..40 was run by some entry, at that entry's first M
    from blockscaled.ops.quantize import activation_tiles

    dev = torch.device(device)
    ran = {(desc, activation_tiles("fp8_block", lo, 256, dev)) for _, (lo, _), desc, _ in report.entries}
    need = {(bs.explain("linear", torch.zeros(m, 256, dtype=torch.bfloat16, device=device), w).describe(),
             activation_tiles("fp8_block", m, 256, dev)) for m in range(1, 41)}
    assert ran >= need, need - ran
    assert len({t for _, t in need}) > 1  # the case this checks: the tiles change within 1..40
    assert "distinct plans" in str(report)
    # after warm-up a call runs a plan warm-up ran
    with observe_plans() as seen:
        bs.linear(torch.randn(7, 256, dtype=torch.bfloat16, device=device), w)
    assert seen[0].describe() in plans


def test_warmup_arguments(device):
    w = bs.quantize(torch.randn(64, 256, dtype=torch.bfloat16, device=device), "fp8_block", block=(128, 128))
    with pytest.raises(ValueError, match="max_tokens"):
        bs.warmup(w, max_tokens=0)
    with pytest.raises(TypeError, match="model_or_weights"):
        bs.warmup("w")
    with pytest.raises(TypeError, match=r"model_or_weights\[1\]"):
        bs.warmup([w, torch.zeros(2)])


def test_warmup_a_quantized_model(path, device):
    model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 256))
    model = model.to(device=device, dtype=torch.bfloat16)
    bs.quantize_model(model, "mxfp8")
    report = bs.warmup(model, max_tokens=4, progress=False)
    if path == "reference":
        assert report.entries == []
        return
    assert {label for label, *_ in report.entries} == {"0", "2"}


def test_warmup_experts(path, device):
    """Experts modules: every distinct pair of grouped plans of row counts 1..max_tokens x top_k runs."""
    ex = bs.nn.Experts.from_dense(torch.randn(4, 64, 64, device=device).bfloat16() * 0.05,
                                  torch.randn(4, 64, 32, device=device).bfloat16() * 0.05, "mxfp8")
    model = torch.nn.ModuleDict({"experts": ex})
    model.top_k = 2
    report = bs.warmup(model, max_tokens=3, progress=False)  # rows 1..6 (the interpreter is slow)
    if path == "reference":
        assert report.entries == []
        return
    covered = set()
    for label, (lo, hi), desc, _ in report.entries:
        assert label == "experts" and "|" in desc  # gate/up and down plans
        covered |= set(range(lo, hi + 1))
    assert covered >= set(range(1, 7))  # rows = tokens x top_k
    descs = {" | ".join(p.describe() for p in ex.plans(r)) for r in range(1, 7)}
    assert {d for _, _, d, _ in report.entries} == descs
    with pytest.raises(ValueError, match="top_k"):
        bs.warmup(model, max_tokens=2, top_k=0)


def test_warmup_moe_routing(path, device, monkeypatch):
    """An nn.MoE layer: its experts' plans and its routing kernel are run."""
    e, h, i = 4, 64, 32
    moe = bs.nn.MoE.from_dense(torch.randn(e, i, h, device=device).bfloat16() * 0.05,
                               torch.randn(e, i, h, device=device).bfloat16() * 0.05,
                               torch.randn(e, h, i, device=device).bfloat16() * 0.05,
                               torch.randn(e, h, device=device).bfloat16(), "mxfp8", top_k=2)
    import blockscaled.nn.moe as nn_moe

    launched = []
    real = nn_moe.route_topk
    monkeypatch.setattr(nn_moe, "route_topk", lambda *a, **k: launched.append(real(*a, **k)) or launched[-1])
    report = bs.warmup(torch.nn.ModuleDict({"moe": moe}), max_tokens=1, progress=False)
    labels = [label for label, *_ in report.entries]
    if path == "reference":
        assert labels == [] and launched == []
        return
    assert labels.count("moe.route") == 1 and any(label.startswith("moe.experts") for label in labels)
    assert len(launched) == 1 and launched[0] is not None  # the routing kernel ran, not its torch twin


def test_warmup_moe_route_permute_forms(path, device, monkeypatch):
    """The one-launch decode routing + permutation is run once per compiled form (its sort size),
    from 1 token until it declines."""
    from blockscaled.ops import moe as glue

    e, h, i, k = 4, 64, 32, 2
    moe = bs.nn.MoE.from_dense(torch.randn(e, i, h, device=device).bfloat16() * 0.05,
                               torch.randn(e, i, h, device=device).bfloat16() * 0.05,
                               torch.randn(e, h, i, device=device).bfloat16() * 0.05,
                               torch.randn(e, h, device=device).bfloat16(), "mxfp8", top_k=k)
    import blockscaled.nn.moe as nn_moe

    monkeypatch.setattr(glue, "ROUTE_PERMUTE_MIN_EXPERTS", 1)  # the test layer's 4 experts: in the band
    tokens = []
    real = nn_moe.route_permute
    def spy(logits, *a):
        r = real(logits, *a)
        tokens.append((logits.shape[0], r is not None))
        return r

    monkeypatch.setattr(nn_moe, "route_permute", spy)
    report = bs.warmup(torch.nn.ModuleDict({"moe": moe}), max_tokens=1, progress=False)
    if path == "reference":
        assert tokens == []
        return
    assert "moe.route_permute" in [label for label, *_ in report.entries]
    ran = [t for t, ok in tokens if ok]
    assert ran == [1] and tokens[-1] == (glue.ROUTE_PERMUTE_MAX_ASSIGNMENTS // k + 1, False)


def test_m_derived_ints_are_not_specialised():
    """bs.warmup compiles one launch per (plan, M == 1, M % 16 == 0): every other integer argument
    that follows M must not be specialised by Triton, or calls inside a warmed-up plan's M range
    still compile (the Hopper wide kernel's num_pid_m / split_from did: 9 cubins after warm-up on
    an H200)."""
    import inspect

    from blockscaled.kernels.hopper.wide import fp8_block_gemm_wide_kernel as k

    from blockscaled.kernels.triton import moe as glue

    def skipped(kern):
        params = list(inspect.signature(kern.fn).parameters)
        # (the interpreter's InterpretedFunction keeps the jit arguments in ``kwargs``)
        dns = getattr(kern, "do_not_specialize", None) or getattr(kern, "kwargs", {}).get("do_not_specialize") or ()
        return {params[i] if isinstance(i, int) else i for i in dns}

    assert {"num_pid_m", "split_from"} <= skipped(k), skipped(k)
    # the MoE glue: token counts and their products (warm-up runs one token count per form; a GPU
    # test found the combine's row count specialised: a build during the first capture)
    assert {"T"} <= skipped(glue.route_kernel) and {"T"} <= skipped(glue.route_permute_kernel)
    assert {"n_rows"} <= skipped(glue.combine_kernel) and {"n", "topk"} <= skipped(glue.permute_kernel)


def test_warmup_covers_the_stream_prepass_tiles(device, monkeypatch):
    """Quantized activations that a streaming-kernel plan dequantizes first (W x A, ``dequant_a``): that
    pass's kernel tiles follow M (small K: 4 / 8 / 16 rows per program), so warm-up runs every
    distinct (plan, pre-pass tiles) pair, not only every plan. Planned as on an H100 (stubbed: the
    streaming kernel needs one), launches recorded."""
    import importlib

    from blockscaled.config import GemmConfig
    from blockscaled.ops.quantize import activation_tiles, dequant_tiles
    from blockscaled.plan import Plan

    wu = importlib.import_module("blockscaled.warmup")  # the module (bs.warmup is its function)
    w = bs.quantize(torch.randn(64, 256, dtype=torch.bfloat16, device=device), "mxfp4")
    for dequant_a in (True, False):
        cfg = GemmConfig(block_m=64, block_n=64, block_k=128, num_warps=4, num_stages=2, split_k=1,
                         strategy="stream", dequant_a=dequant_a)
        monkeypatch.setattr(wu, "make_plan", lambda problem, dev, cfg=cfg: Plan("gemm", "cuda", cfg, problem))
        ran = []
        monkeypatch.setattr(wu, "linear", lambda x, w, bias=None, weight_only=False: ran.append(x.shape[0]))
        wu.warmup(w, max_tokens=64, progress=False)
        need = {dequant_tiles("mxfp4", m, 256) for m in range(1, 65)}
        assert len(need) > 2
        # one call (at the group's smallest M) per distinct launch set: the quantizer's tiles always,
        # the pre-pass's only where the plan dequantizes first
        groups = {}
        for m in range(1, 65):
            key = (m == 1, m % 16 == 0, activation_tiles("mxfp4", m, 256, w.device),
                   dequant_tiles("mxfp4", m, 256) if dequant_a else None)
            groups.setdefault(key, m)
        assert sorted(ran) == sorted(groups.values()), (dequant_a, ran, groups)


def test_warmup_fused_routers(path, device, monkeypatch):
    """A transformers MoE model after quantize_model: its fused routers' kernel is run once each
    (not the torch twin), DeepSeek-V3's fp32 router included."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.DeepseekV3Config(hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                        moe_intermediate_size=128, n_routed_experts=8, n_group=2, topk_group=1,
                                        first_k_dense_replace=0, kv_lora_rank=64, q_lora_rank=96,
                                        qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=64,
                                        num_experts_per_tok=2)
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(cfg).to(torch.bfloat16).to(device).eval()
    with torch.no_grad():
        for mod in model.modules():
            if hasattr(mod, "e_score_correction_bias"):
                mod.weight.normal_(0, 0.05)
    bs.nn.quantize_model(model, "mxfp8", include="*.experts")
    rep = bs.nn.quantization_report(model)
    assert rep.fused_routers == ["model.layers.0.mlp.gate"], rep
    import blockscaled.nn.moe as nn_moe

    launched = []
    real = nn_moe.route_topk
    monkeypatch.setattr(nn_moe, "route_topk", lambda *a, **k: launched.append(real(*a, **k)) or launched[-1])
    report = bs.warmup(model, max_tokens=1, progress=False)
    labels = [label for label, *_ in report.entries if "route" in label]
    if path == "reference":
        assert labels == [] and launched == []
        return
    assert labels == ["model.layers.0.mlp.gate.route"]
    assert len(launched) == 1 and launched[0] is not None  # the routing kernel ran, not its torch twin
