"""Tests of the bench's layer and model suites (``--suite moe-layer`` / ``--suite model``, issue 20;
bench/layers.py, bench/model_suite.py): the cases and their CPU stand-ins, the bf16 layers the
suite compares with (against float64), the runner's rows (ours checked against float64, a broken
layer caught, timings faked), the tables' ratios, glue shares and verdicts, and a CPU run of each
suite end to end.

Most tests run the float64 reference twins of our ops (``reference`` fixture: fast); the CLI runs
go through the Triton interpreter as a user's CPU run does.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from blockscaled.bench import layers, model_suite, suites
from blockscaled.bench.timing import Timing
from blockscaled.reference.experts import experts as ref_experts


@pytest.fixture
def reference(monkeypatch):
    """CPU tensors run the float64 reference twins (fast), whatever conftest set."""
    import blockscaled._checks as checks

    monkeypatch.setattr(checks, "INTERPRET", False)


def _runner(monkeypatch, timing=False, baselines=()):
    from blockscaled.bench.runner import RunConfig, Runner

    runner = Runner(RunConfig(iterations=6, warmup=0, rounds=1, timing=timing, baselines=baselines,
                              log=lambda m: None), roofline={"copy_gbps": 3000.0})
    if timing:  # fake timers: graph 10 us, eager 30 us for every row
        monkeypatch.setattr(runner, "_time", lambda fn, sets, *a, **k: (fn(*sets[0]), Timing(
            0.010, 0.010, 0.010, 0.010, 0.0, 6, "graph", 1))[1])
        monkeypatch.setattr(runner, "_time_eager", lambda fn, sets, *a, **k: Timing(
            0.030, 0.03, 0.03, 0.03, 0.0, 6, "eager", 1))
    return runner


# --------------------------------------------------------------------------- cases
def test_layer_suite_cases():
    """4 architectures x 5 token counts; each case runs the formats its checkpoints ship in."""
    cs = suites.get_suite("moe-layer")
    assert len(cs) == 20 and len(set(cs)) == 20
    assert {c.arch for c in cs} == set(layers.ARCHS) and {c.m for c in cs} == set(layers.LAYER_TOKENS)
    ds = [c for c in cs if c.arch == "deepseek-v3"][0]
    assert (ds.n, ds.k, ds.formats, ds.name) == (7168, 2048, ("fp8_block", "nvfp4"), "deepseek-v3 T=1")
    assert suites.DEFAULT_OPS["moe-layer"] == ("moe", "moe-weight-only")


def test_model_suite_cases():
    """Per model: decode steps at B 1 / 8 / 64, prefill of 512 / 4096 tokens, generate at B 1 / 8."""
    cs = suites.get_suite("model")
    assert len(cs) == 2 * 7
    names = [c.name for c in cs if c.arch == "gpt-oss-20b"]
    assert names == ["gpt-oss-20b decode B=1", "gpt-oss-20b decode B=8", "gpt-oss-20b decode B=64",
                     "gpt-oss-20b prefill P=512", "gpt-oss-20b prefill P=4096",
                     "gpt-oss-20b generate B=1 ctx=512", "gpt-oss-20b generate B=8 ctx=512"]


def test_cli_selects_the_suites():
    """The README's commands parse: both suites by name, their ops by --ops."""
    from blockscaled.bench.cli import parse_args, select_cases

    a = parse_args(["--suite", "moe-layer,model", "--ops", "moe,decode"])
    assert [name for name, _ in select_cases(a)] == ["moe-layer", "model"] and a.ops == ("moe", "decode")


def test_interpreter_stand_ins():
    """CPU stand-ins: the tiny architecture, few tokens, every requested case answered once."""
    for name in ("moe-layer", "model"):
        cs = suites.get_suite(name)
        ran = suites.for_interpreter(cs)
        assert all(c.arch.startswith("tiny:") and c.m <= 12 for c in ran)
        assert sorted(n for c in ran for n in c.requested.split("; ")) == sorted(c.name for c in cs)
    a = layers.arch_of(suites.for_interpreter(suites.get_suite("moe-layer"))[0])
    assert (a.experts, a.top_k, a.intermediate, a.hidden % 8) == (8, 2, 128, 0)
    ds = layers.tiny_arch(layers.ARCHS["deepseek-v3"])
    assert (ds.score, ds.n_group, ds.topk_group) == ("sigmoid", 4, 2)


def test_model_vocab_in_proportion():
    """The vocabulary is cut by the share of layers built (the LM head weighs what it does in
    the whole model), rounded up to 64."""
    assert model_suite.model_vocab(model_suite.MODELS["qwen3-30b-a3b"]) == 12672  # 151936 * 4 / 48
    assert model_suite.model_vocab(model_suite.MODELS["gpt-oss-20b"]) == 33536  # 201088 * 4 / 24


# --------------------------------------------------------------------------- the bf16 layers
@pytest.mark.parametrize("arch", ["qwen3-30b-a3b", "gpt-oss-20b", "deepseek-v3"])
def test_bf16_layers_match_float64(monkeypatch, arch):
    """Both bf16 baselines (torch._grouped_mm and the per-expert loop, which torch runs on the CPU
    too) give the float64 layer on the same bf16 weights and routing, within the layer tolerance."""
    runner = _runner(monkeypatch)
    a = layers.tiny_arch(layers.ARCHS[arch])
    w = layers._Weights(runner, a, seed=3)
    x = runner._randn(9, a.hidden, seed=4)
    weights, idx = layers._route(w, x)
    ref = ref_experts(w.bf16_experts(), x, idx, weights)
    for impl in ("grouped-mm", "loop"):
        y = layers.bf16_layer(w, x, impl)
        assert y.dtype == torch.bfloat16 and y.shape == x.shape
        rel = float((y.double() - ref).norm() / ref.norm())
        assert rel < layers.LAYER_TOLERANCE[0] / 4, (impl, rel)
    with pytest.raises(ValueError, match="impl"):
        layers.bf16_layer(w, x, "cublas")


def test_router_bias_skews_routing(monkeypatch):
    """The Zipf router bias: at 1024 tokens the busiest expert gets several times its share (1024
    rather than 4096: the same skew, a quarter of the 60 s the interpreter took)."""
    runner = _runner(monkeypatch)
    a = layers.ARCHS["qwen3-30b-a3b"]
    w = layers._Weights(runner, layers.tiny_arch(a), seed=1)
    _, idx = layers._route(w, runner._randn(1024, w.arch.hidden, seed=2))
    counts = torch.bincount(idx.reshape(-1), minlength=8)
    assert counts.max() > 2 * counts.float().mean()


# --------------------------------------------------------------------------- runner
@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp4", "nvfp4"])
def test_layer_rows(reference, monkeypatch, fmt):
    """One case: both modes and their kernels-only rows checked against float64, with the bf16
    layers beside them (their CUDA need does not apply: they are plain torch); bytes of the routed
    experts; all paired in the table."""
    runner = _runner(monkeypatch, timing=True, baselines=layers.BASELINES)
    case = suites.for_interpreter([c for c in suites.get_suite("moe-layer") if c.arch == "gpt-oss-20b"])[1]
    runner.run_case(case, fmt)
    got = [(r["op"], r["impl"], r["check"]) for r in runner.rows]
    assert got == [("moe", "blockscaled", "ok"), ("moe-kernels", "blockscaled", "ok"),
                   ("moe-weight-only", "blockscaled", "ok"), ("moe-weight-only-kernels", "blockscaled", "ok"),
                   ("moe-bf16", "grouped-mm-bf16", "ok"), ("moe-bf16", "bf16-loop", "ok")], got
    assert all(r["eager_ms"] == 0.030 and r["median_ms"] == 0.010 for r in runner.rows)
    head, body = layers.table(runner.rows)
    assert [b[head.index("mode")] for b in body] == ["WxA", "W-only"]
    assert {b[head.index("vs bf16-loop")] for b in body} == {"1.00x"}
    assert {b[head.index("glue")] for b in body} == {"0%"}  # the fake timer: same time for layer and kernels
    assert {b[head.index("verdict")] for b in body} == {"PASS"}  # T <= 64: glue < 15 %


def test_broken_layer_fails_its_check(reference, monkeypatch):
    """Expert rows 2 % off: every row of ours fails its float64 check (the layer tolerance is
    tighter than a broken kernel)."""
    from blockscaled.nn.experts import Experts

    orig = Experts.expert_rows
    monkeypatch.setattr(Experts, "expert_rows", lambda self, *a, **kw: orig(self, *a, **kw) * 1.05)
    runner = _runner(monkeypatch)
    case = suites.for_interpreter(suites.get_suite("moe-layer"))[0]
    runner.run_case(case, "mxfp8")
    assert [r["check"] for r in runner.rows] == ["FAIL"] * 4


def test_layer_table_glue_and_verdicts():
    """Glue = 1 - kernels / layer; the target applies at T <= 64 only; a failed check is FAIL."""
    def row(op, impl, ms, t=8, check="ok"):
        return {"suite": "moe-layer", "kind": "moe-layer", "case": f"x T={t}", "format": "nvfp4", "op": op,
                "impl": impl, "M": t, "median_ms": ms, "status": "ok", "check": check}

    rows = [row("moe", "blockscaled", 0.100), row("moe-kernels", "blockscaled", 0.080),
            row("moe-weight-only", "blockscaled", 0.100), row("moe-weight-only-kernels", "blockscaled", 0.090),
            row("moe-bf16", "grouped-mm-bf16", 0.150), row("moe-bf16", "bf16-loop", 0.400),
            row("moe", "blockscaled", 1.0, t=512), row("moe-kernels", "blockscaled", 0.5, t=512),
            row("moe", "blockscaled", 1.0, t=64, check="FAIL")]
    head, body = layers.table(rows)
    col = lambda name: [b[head.index(name)] for b in body]  # noqa: E731
    assert col("glue") == ["20%", "10%", "50%", "-"]
    assert col("verdict") == ["MISS", "PASS", "-", "FAIL"]
    assert col("vs grouped-mm-bf16")[:2] == ["1.50x", "1.50x"] and col("vs bf16-loop")[0] == "4.00x"
    assert layers.verdict_counts(rows) == {"PASS": 1, "MISS": 1, "FAIL": 1, "-": 1}


# --------------------------------------------------------------------------- model suite
def test_model_rows(reference, monkeypatch):
    """Decode, prefill and generate rows of a tiny Qwen3-MoE: both modes of ours checked against
    the simulated model's logits (the bf16 model's cosine reported beside); the bf16 rows beside
    them; the generate with CUDA graphs on (its tokens checked against the eager generate's);
    tokens/s in the table."""
    pytest.importorskip("transformers")
    runner = _runner(monkeypatch, timing=True)
    cases = suites.for_interpreter([c for c in suites.get_suite("model") if c.arch == "qwen3-30b-a3b"])
    decode = [c for c in cases if c.label == "decode"][0]
    gen = [c for c in cases if c.label == "generate"][0]
    runner.run_case(decode, "fp8_block")
    runner.run_case(gen, "fp8_block")
    got = [(r["case"].split()[1], r["op"], r["impl"], r.get("check")) for r in runner.rows]
    assert sorted(got) == sorted([
        ("decode", "model-bf16", "bf16-model", None), ("decode", "model", "blockscaled", "ok"),
        ("decode", "model-weight-only", "blockscaled", "ok"), ("generate", "model-bf16", "bf16-model", None),
        ("generate", "model", "blockscaled", "ok"), ("generate", "model-weight-only", "blockscaled", "ok"),
        # the generate again with enable_cuda_graphs: its greedy tokens equal the eager generate's
        ("generate", "model-graphs", "blockscaled", "ok"),
        ("generate", "model-weight-only-graphs", "blockscaled", "ok")]), got
    ours = [r for r in runner.rows if r["impl"] == "blockscaled" and not r["op"].endswith("-graphs")]
    # the reference path (CPU) computes each module in float64: near-identical logits; on the GPU
    # the kernels' fp32 sums and bf16 outputs move them by up to the suite's own bound
    def cos_min(r):
        if not torch.cuda.is_available():
            return 0.9999
        return model_suite.MODEL_SIM_MIN_COS[("fp8_block", r["op"].endswith("weight-only"))]

    vals = [(r["case"], r["op"], r["module_err"], r["cosine"], r["cosine_bf16"]) for r in ours]
    assert all(r["module_err"] <= model_suite.MODEL_MODULE_TOL and r["cosine"] >= cos_min(r)
               and 0 < r["cosine_bf16"] < 1 for r in ours), vals
    gen_rows = [r for r in runner.rows if r["case"] == gen.name]
    assert all(r["method"] == "eager-generate" and r["median_ms"] is not None for r in gen_rows)
    head, body = model_suite.table(runner.rows)
    dec = [b for b in body if " decode " in b[0]]
    assert [b[head.index("vs bf16")] for b in dec] == ["1.00x", "1.00x"]  # fake timer
    assert [b[head.index("verdict")] for b in dec] == ["MISS", "MISS"]  # 1.00x < 1.5x
    assert dec[0][head.index("tokens/s")] == f"{decode.m / 10e-6:,.0f}"


def _doubled_scale(w):
    """``w`` (a ScaledTensor) with every block's scale x 2 (E8M0: exponent + 1), new tensors."""
    s = w.scale
    return replace(w, scale=s + 1 if s.dtype == torch.uint8 else (s.float() * 2).to(s.dtype))


def _break(q, how: str) -> None:
    """Break one quantized module of ``q`` in what *our* forward computes, as a kernel reading
    the wrong scales would: the module's stored weight (which the simulated twin reads) is left
    as it was."""
    import blockscaled as bs
    import blockscaled.nn as bsnn

    if how == "linear-scale":  # layer 0's attention output projection
        lin = q.get_submodule("model.layers.0.self_attn.o_proj")
        assert isinstance(lin, bsnn.Linear)
        w = _doubled_scale(lin.weight)
        lin.forward = lambda x: bs.linear(x, w, lin.bias, weight_only=lin.weight_only, out_dtype=x.dtype)
    elif how == "experts-scale":  # layer 0's experts, down projection
        ex = q.get_submodule("model.layers.0.mlp.experts")
        assert isinstance(ex, bsnn.Experts)
        good, bad, rows = ex.w_down, _doubled_scale(ex.w_down), ex.expert_rows

        def broken_rows(*args, **kw):
            ex.w_down = bad
            try:
                return rows(*args, **kw)
            finally:
                ex.w_down = good

        ex.expert_rows = broken_rows
    else:
        raise AssertionError(how)


_BROKEN_MODULE = {"linear-scale": "model.layers.0.self_attn.o_proj", "experts-scale": "model.layers.0.mlp.experts"}


@pytest.mark.parametrize("broken", ["none", "linear-scale", "experts-scale", "layout"])
def test_model_check_against_simulated(reference, monkeypatch, broken):
    """The row check, mxfp4 on the gpt-oss stand-in (the case whose bf16 comparison failed on the
    GPU with correct kernels): the correct model passes (every module within the limit of its
    twin, logits as the simulated model's); one module broken in our forward only (its scales
    doubled) fails both modes' rows and is named, and so does a layout bug (every linear's
    output columns shifted by one). The old check, the bf16 cosine >= 0.70, passed the broken
    modules."""
    pytest.importorskip("transformers")
    import blockscaled.nn as bsnn

    if broken == "layout":
        orig_fwd = bsnn.Linear.forward
        monkeypatch.setattr(bsnn.Linear, "forward", lambda self, x: torch.roll(orig_fwd(self, x), 1, -1))
    elif broken != "none":
        orig = model_suite._Models.ours

        def ours(self, fmt, weight_only):
            q = orig(self, fmt, weight_only)
            if not getattr(q, "_test_broken", False):
                _break(q, broken)
                q._test_broken = True
            return q

        monkeypatch.setattr(model_suite._Models, "ours", ours)
    runner = _runner(monkeypatch)
    case = [c for c in suites.for_interpreter(suites.get_suite("model"))
            if c.label == "decode" and c.arch == "tiny:gpt-oss-20b"][0]
    runner.run_case(case, "mxfp4")
    rows = {r["op"]: r for r in runner.rows}
    print(broken, {op: (r["check"], r["module"], f"{r['module_err']:.2e}", round(r["cosine"], 6),
                        round(r["cosine_bf16"], 4)) for op, r in rows.items()})
    assert set(rows) == {"model", "model-weight-only"}, runner.rows
    for r in rows.values():
        if broken == "none":
            # the reference path: ours is the float64 twin up to its bf16 output
            assert r["check"] == "ok" and r["module_err"] < 4e-3 and r["cosine"] > 0.9999, r
        else:
            assert r["check"] == "FAIL" and r["module_err"] > 0.5, r
        if broken in _BROKEN_MODULE:
            assert r["module"] == _BROKEN_MODULE[broken] and r["cosine_bf16"] > 0.70, r


# --------------------------------------------------------------------------- CLI, CPU
def test_cpu_layer_and_model_run(tmp_path, capsys):
    """`blockscaled bench --suite moe-layer,model` without a GPU, one stand-in each: every row of
    ours checked (interpreter kernels), exit 0."""
    pytest.importorskip("transformers")
    if torch.cuda.is_available():
        pytest.skip("the CPU run: on a GPU the suites add their bf16 baseline rows")
    from blockscaled.bench.cli import main

    out = tmp_path / "r.json"
    assert main(["--suite", "moe-layer,model", "--limit", "1", "--formats", "mxfp4", "--output", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["kind"], r["op"]) for r in rows] == [
        ("moe-layer", "moe"), ("moe-layer", "moe-kernels"), ("moe-layer", "moe-weight-only"),
        ("moe-layer", "moe-weight-only-kernels"), ("model", "model"), ("model", "model-weight-only")]
    assert all(r["check"] == "ok" for r in rows)
    assert "PASS: 6 checks passed" in " ".join(capsys.readouterr().out.split())


def test_layer_baselines_are_selectable():
    """The layer suite times a bf16 baseline only when ``--baselines`` names it: every name must be
    a registered one, so that the default (``all``) runs both (the first GPU run lacked the
    grouped-mm layer: its name was registered nowhere)."""
    from blockscaled.bench.baselines import BASELINE_NAMES

    assert set(layers.BASELINES) <= set(BASELINE_NAMES), set(layers.BASELINES) - set(BASELINE_NAMES)
