"""Tuned plans (plan/tuned.py, blockscaled.tune) on the CPU: the planner runs a stored tuned config
for exactly its problem and device and says so; a stored config that is not a candidate, another M,
another device or a forced config leave the cost model's pick; the memoised plans follow the store;
files round-trip and a foreign file is refused; ``tune`` refuses what it cannot time or tune."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

import blockscaled as bs
from blockscaled.config.gemm import GemmConfig
from blockscaled.ops import gemm as gemm_mod
from blockscaled.plan import H100_SXM, H200_SXM, Plan, Problem, plan_gemm
from blockscaled.plan import tuned
from blockscaled.plan.dense import ranked_candidates
from blockscaled.plan.encoding import config_from_key, config_key
from blockscaled.tune import TUNE_MARGIN, _shapes, choose

P = Problem("gemm", "fp8_block", 128, 4096, 7168)


@pytest.fixture(autouse=True)
def _empty_store():
    tuned.clear()
    yield
    tuned.clear()


def _entry(cfg, model_cfg, us=10.0, model_us=12.0):
    return dict(config=config_key(cfg), us=us, model_config=config_key(model_cfg), model_us=model_us, timed=6,
                date="2026-11-28")


def test_tuned_entry_is_what_the_planner_runs_and_says():
    ranked = ranked_candidates(P, H100_SXM)
    model_pick = plan_gemm(P, H100_SXM).config
    assert model_pick == ranked[0][1]
    second = ranked[1][1]
    tuned.record(P, H100_SXM, _entry(second, model_pick))
    plan = plan_gemm(P, H100_SXM)
    assert plan.config == second
    text = str(plan)
    assert "tuned on this GPU (2026-11-28)" in text and "10.0 us" in text and "12.0 us" in text
    # the model's pick is listed among the alternatives, the chosen config is not
    alts = [d for d, _ in plan.alternatives]
    assert plan.describe() not in alts
    # exactly this problem and device: another M, the H200, another output dtype keep the model
    assert plan_gemm(dataclasses.replace(P, m=129), H100_SXM).config == ranked_candidates(
        dataclasses.replace(P, m=129), H100_SXM)[0][1]
    assert plan_gemm(P, H200_SXM).config == ranked_candidates(P, H200_SXM)[0][1]
    assert plan_gemm(dataclasses.replace(P, out_dtype="float16"), H100_SXM).config != second or \
        ranked_candidates(dataclasses.replace(P, out_dtype="float16"), H100_SXM)[0][1] == second
    # a forced config is run as given; a forced strategy ranks without the tuned entry
    forced = GemmConfig(64, 64, 128, 4, 4, 1, "triton", True, 8, False)
    assert plan_gemm(P, H100_SXM, forced).config == forced
    tuned.clear()
    assert plan_gemm(P, H100_SXM).config == model_pick


def test_tuned_config_not_among_candidates_is_not_run():
    model_pick = plan_gemm(P, H100_SXM).config
    alien = GemmConfig(32, 32, 128, 4, 2, 7, "triton", True, 8, False)  # split 7 is never a candidate
    assert alien not in [c for _, c in ranked_candidates(P, H100_SXM)]
    tuned.record(P, H100_SXM, _entry(alien, model_pick))
    plan = plan_gemm(P, H100_SXM)
    assert plan.config == model_pick
    assert "not among today's candidates" in str(plan)


def test_memoised_plans_follow_the_store():
    gemm_mod._PLANS[("sentinel",)] = None
    tuned.record(P, H100_SXM, _entry(ranked_candidates(P, H100_SXM)[1][1], plan_gemm(P, H100_SXM).config))
    assert ("sentinel",) not in gemm_mod._PLANS
    gemm_mod._PLANS[("sentinel",)] = None
    tuned.clear()
    assert ("sentinel",) not in gemm_mod._PLANS


def test_record_needs_every_field():
    with pytest.raises(ValueError, match="missing"):
        tuned.record(P, H100_SXM, {"config": "{}"})


def test_only_dense_fp8_block_quantized_on_hopper_is_tunable():
    assert tuned.tunable(P, H100_SXM)
    assert not tuned.tunable(dataclasses.replace(P, fmt="mxfp4"), H100_SXM)
    assert not tuned.tunable(dataclasses.replace(P, a="bfloat16"), H100_SXM)
    assert not tuned.tunable(dataclasses.replace(P, op="grouped"), H100_SXM)
    assert not tuned.tunable(P, dataclasses.replace(H100_SXM, capability=(10, 0)))


def test_file_round_trip_merge_and_foreign_file(tmp_path):
    path = tmp_path / "t.json"
    a, b = ranked_candidates(P, H100_SXM)[:2]
    tuned.record(P, H100_SXM, _entry(b[1], a[1]))
    tuned.save(path)
    first = tuned.entries()
    tuned.clear()
    p2 = dataclasses.replace(P, m=64)
    tuned.record(p2, H100_SXM, _entry(ranked_candidates(p2, H100_SXM)[1][1], ranked_candidates(p2, H100_SXM)[0][1]))
    tuned.save(path)  # merged over the file's entry
    tuned.clear()
    assert tuned.load(path) == 2
    got = tuned.entries()
    assert got[tuned.problem_key(P, H100_SXM)] == first[tuned.problem_key(P, H100_SXM)]
    assert config_from_key(got[tuned.problem_key(P, H100_SXM)]["config"]) == b[1]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"entries": []}))
    with pytest.raises(ValueError, match="bad.json"):
        tuned.load(bad)


def test_env_file_is_loaded_at_import(tmp_path):
    path = tmp_path / "t.json"
    a, b = ranked_candidates(P, H100_SXM)[:2]
    tuned.record(P, H100_SXM, _entry(b[1], a[1]))
    tuned.save(path)
    code = ("from blockscaled.plan import H100_SXM, Problem, plan_gemm;"
            f"print(plan_gemm(Problem('gemm', 'fp8_block', {P.m}, {P.n}, {P.k}), H100_SXM).describe())")
    env = dict(os.environ, **{tuned.ENV: str(path)})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)

    assert out.stdout.strip() == Plan("gemm", "cuda", b[1]).describe()


def test_config_key_round_trips_every_candidate():
    for _, c in ranked_candidates(P, H100_SXM):
        assert config_from_key(config_key(c)) == c
    with pytest.raises(TypeError, match="cfg"):
        config_key(object())


def test_tune_shapes_and_refusals():
    assert _shapes([(1, 256, 512), (8, 256, 512)], None) == [(1, 256, 512), (8, 256, 512)]
    with pytest.raises(ValueError, match=r"shapes\[1\]"):
        _shapes([(1, 256, 512), (0, 256, 512)], None)
    w = bs.quantize(torch.randn(256, 512), "fp8_block", block=(128, 128))
    w1 = bs.quantize(torch.randn(256, 512), "fp8_block", block=(1, 128))
    with pytest.raises(ValueError, match="ms"):
        _shapes(w, None)
    assert _shapes([w, w1], (1, 4)) == [(1, 256, 512), (4, 256, 512)]  # 1x128 weights: not the cost model's
    lin = bs.nn.Linear.from_linear(torch.nn.Linear(512, 384, bias=False), "fp8_block")
    assert _shapes(torch.nn.Sequential(lin), (2,)) == [(2, 384, 512)]
    biased = bs.nn.Linear.from_linear(torch.nn.Linear(512, 384, bias=True), "fp8_block")
    assert _shapes(torch.nn.Sequential(biased), (2,)) == []  # biased layers never run the timed Hopper tiles
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            bs.tune([(1, 256, 512)])


def test_choose_keeps_the_model_pick_within_the_margin():
    model = {"key": "m", "us": 10.0}
    near = {"key": "a", "us": 10.0 / (1 + TUNE_MARGIN / 2)}
    far = {"key": "b", "us": 10.0 / (1 + 2 * TUNE_MARGIN)}
    assert choose([model, near], "m") is model
    assert choose([model, near, far], "m") is far
    assert choose([near, far], "m") is far  # the model's pick did not run within the tolerance
    assert choose([model, near], "m", margin=0.0) is near


def test_forced_hopper_strategy_ranks_without_the_tuned_entry():
    ranked = ranked_candidates(P, H100_SXM)
    portable = next(c for _, c in ranked if isinstance(c, GemmConfig))
    tuned.record(P, H100_SXM, _entry(portable, ranked[0][1]))
    assert plan_gemm(P, H100_SXM).config == portable
    forced = plan_gemm(P, H100_SXM, GemmConfig(strategy="hopper"))
    assert forced.config != portable and "tuned" not in str(forced)


def test_unreadable_entries_and_files(tmp_path):
    model_pick = plan_gemm(P, H100_SXM).config
    # a config written by another version (a field this one lacks): the model's pick, said so
    alien = json.loads(config_key(ranked_candidates(P, H100_SXM)[1][1]))
    alien["future_field"] = 3
    tuned.record(P, H100_SXM, dict(_entry(model_pick, model_pick), config=json.dumps(alien)))
    plan = plan_gemm(P, H100_SXM)
    assert plan.config == model_pick and "not among today's candidates" in str(plan)
    # the model's pick failed its check when tuned: said so
    tuned.record(P, H100_SXM, dict(_entry(ranked_candidates(P, H100_SXM)[1][1], model_pick), model_us=None))
    assert "failed its correctness check" in str(plan_gemm(P, H100_SXM))
    # malformed entries of a file are left out with a warning; a foreign file is refused, and save
    # leaves it alone
    path = tmp_path / "t.json"
    good = _entry(ranked_candidates(P, H100_SXM)[1][1], model_pick)
    path.write_text(json.dumps({"schema": 1, "entries": {"k1": good, "k2": {"config": "x"}}}))
    tuned.clear()
    with pytest.warns(UserWarning, match="k2"):
        assert tuned.load(path) == 1
    foreign = tmp_path / "other.json"
    foreign.write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="other.json"):
        tuned.save(foreign)
    assert json.loads(foreign.read_text()) == [1, 2]
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        tuned.load(bad)
    # a bad file named by the environment warns at import instead of breaking it
    env = dict(os.environ, **{tuned.ENV: str(bad)})
    out = subprocess.run([sys.executable, "-W", "always", "-c", "import blockscaled; print('imported')"], env=env,
                         capture_output=True, text=True, check=True)
    assert "imported" in out.stdout and "not loaded" in out.stderr
