"""GPU (sm_90): ``blockscaled.tune`` times the cost model's top candidates, stores the fastest, and
that config is what ``bs.gemm`` / ``bs.linear`` then run (``explain`` says so); the output equals
the forced config's bit for bit and the float64 reference within the tolerance table; clearing
the store brings the model's pick back; the saved file loads."""

from __future__ import annotations

import pytest
import torch

import blockscaled as bs
from blockscaled.plan import tuned
from blockscaled.plan.encoding import config_from_key, config_key
from blockscaled.reference.gemm import gemm as ref_gemm
from blockscaled.testing.tolerances import assert_gemm_close

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs an sm_90 (Hopper) GPU"),
]

SHAPES = [(1, 2048, 4096), (48, 3072, 2048), (640, 4096, 1536)]


@pytest.fixture(autouse=True)
def _empty_store():
    tuned.clear()
    yield
    tuned.clear()


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_tuned_plan_runs(m, n, k, tmp_path):
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16)
    a, b = bs.quantize(x, "fp8_block"), bs.quantize(w, "fp8_block", block=(128, 128))
    model = bs.explain("gemm", a, b)
    path = tmp_path / "tuned.json"
    rep = bs.tune(b, ms=(m,), top=3, save=str(path), iterations=5)
    assert len(rep.rows) == 1 and rep.rows[0][:3] == (m, n, k) and rep.rows[0][7] >= 1
    (entry,) = tuned.entries().values()
    chosen = config_from_key(entry["config"])
    plan = bs.explain("gemm", a, b)
    assert plan.config == chosen and "tuned on this GPU" in str(plan)
    assert entry["model_config"] == config_key(model.config)  # the model's pick was among the timed
    assert "timed" in str(rep) and (entry["config"] == entry["model_config"]) == (rep.rows[0][3] == rep.rows[0][5])
    ref = ref_gemm(a, b, out_dtype=torch.float64)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    bs.gemm(a, b, out=out)
    assert_gemm_close(out, ref, "fp8_block", torch.bfloat16)
    forced = bs.gemm(a, b, config=chosen)
    assert torch.equal(out, forced)
    lin = bs.linear(x, b)  # the same problem through linear: the same plan
    assert bs.explain("linear", x, b).config == chosen
    assert_gemm_close(lin, ref_gemm(bs.quantize(x, "fp8_block"), b, out_dtype=torch.float64), "fp8_block",
                      torch.bfloat16)
    tuned.clear()
    assert bs.explain("gemm", a, b).config == model.config
    assert tuned.load(path) == 1
    assert bs.explain("gemm", a, b).config == chosen


def test_tune_refuses_what_the_cost_model_does_not_plan():
    with pytest.raises(ValueError, match=r"shapes\[0\]"):
        bs.tune([(0, 128, 128)])
    w = bs.quantize(torch.randn(256, 512, device="cuda"), "mxfp4")
    assert str(bs.tune(w, ms=(1,))).startswith("tuned 0 problems")
