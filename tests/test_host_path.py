"""The eager host path's memos (issue 18: a decode call should cost a few microseconds of Python):
plans memoised for shape-only Problems (dense and grouped), gemm_kernel's launch constants, the
split-K workspace reused per (device, stream), no view ops for 2-D operands. Each must give the
results and the plans of the unmemoised path, see replaced planners, and keep observe_plans /
explain working."""

from __future__ import annotations

import pytest
import torch

import blockscaled as bs
import blockscaled.ops.gemm as gemm_mod
import blockscaled.ops.grouped as grouped_mod
from blockscaled.config import GemmConfig
from blockscaled.ops import _splitk
from blockscaled.plan import observe_plans
from blockscaled.reference.gemm import gemm as ref_gemm
from blockscaled.testing.tolerances import assert_gemm_close


def _w(n, k, fmt, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return bs.quantize((torch.randn(n, k, generator=g) * 0.1).to(device), fmt)


def _x(m, k, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).to(torch.bfloat16).to(device)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_plan_memo_same_plan_and_observed(fmt, device, path):
    """A second call returns the memoised plan (the same object), observe_plans sees it every
    time, and it is the plan explain names."""
    if path == "reference":
        pytest.skip("the reference path plans nothing")
    w = _w(40, 96, fmt, device)
    x = _x(3, 96, device)
    seen = []
    for _ in range(2):
        with observe_plans() as plans:
            bs.linear(x, w, weight_only=True)
        seen.append(plans[0])
    assert seen[0] is seen[1]
    assert bs.explain("linear", x, w, weight_only=True) == seen[0]


def test_plan_memo_sees_a_replaced_planner(device, monkeypatch):
    """The planner function is part of the memo's key: a replaced one is asked."""
    if device == "cpu" and not bs._checks.INTERPRET:
        pytest.skip("needs the interpreter on CPU")
    w = _w(40, 96, "mxfp4", device)
    x = _x(3, 96, device)
    bs.linear(x, w)
    asked = []
    real = gemm_mod.plan_gemm

    def spy(p, dev, forced=None, **kw):
        asked.append(p)
        return real(p, dev, forced, **kw)

    monkeypatch.setattr(gemm_mod, "plan_gemm", spy)
    bs.linear(x, w)
    bs.linear(x, w)
    assert len(asked) == 1  # asked once, then memoised under the new planner


def test_launch_constants_follow_the_config(device):
    """Forced configs with different tiles / splits, alternating (the memo is keyed by the
    config object): each call is right."""
    if device == "cpu" and not bs._checks.INTERPRET:
        pytest.skip("needs the interpreter on CPU")
    m, n, k = 5, 70, 160
    a = bs.quantize(_x(m, k, device).float(), "mxfp8")
    b = _w(n, k, "mxfp8", device)
    ref = ref_gemm(a, b)
    cfgs = [GemmConfig(16, 32, 32, 4, 2, 1, "triton", True), GemmConfig(16, 64, 32, 4, 2, 3, "triton", True),
            GemmConfig(16, 32, 32, 4, 2, 2, "triton", True, 8, True)]
    for _ in range(2):
        for cfg in cfgs:
            assert_gemm_close(bs.gemm(a, b, torch.float32, config=cfg), ref, "mxfp8", torch.float32)
    assert_gemm_close(bs.gemm(a, b, torch.float32, config=GemmConfig(16, 32, 32, 4, 2, 3, "triton", True)), ref,
                      "mxfp8", torch.float32)  # an equal config, a new object


def test_splitk_workspace_reused(device):
    """Eager split-K launches share one workspace per (device, stream), grown when a larger one
    is needed; shapes alternating over it stay right."""
    if device == "cpu" and not bs._checks.INTERPRET:
        pytest.skip("needs the interpreter on CPU")
    cfg = GemmConfig(16, 32, 32, 4, 2, 3, "triton", True)
    shapes = [(3, 40, 96), (7, 90, 128), (3, 40, 96)]
    bufs = []
    for m, n, k in shapes:
        a = bs.quantize(_x(m, k, device, seed=m).float(), "mxfp4")
        b = _w(n, k, "mxfp4", device, seed=n)
        assert_gemm_close(bs.gemm(a, b, torch.float32, config=cfg), ref_gemm(a, b), "mxfp4", torch.float32)
        bufs.append({k_: v.data_ptr() for k_, v in _splitk._WORKSPACES.items()})
    assert bufs[0] and bufs[1] == bufs[2]  # the larger buffer serves the smaller shape again


def test_splitk_scratch_sizes():
    """Above the cache limit a workspace is allocated per launch (no memory kept)."""
    dev = torch.device("cpu")
    ws, cnt = _splitk.splitk_scratch(dev, 4, 100)
    assert ws.dtype == torch.float32 and ws.numel() >= 100 and cnt.numel() >= 4 and int(cnt.abs().sum()) == 0
    again, _ = _splitk.splitk_scratch(dev, 4, 50)
    assert again.data_ptr() == ws.data_ptr()
    big, _ = _splitk.splitk_scratch(dev, 4, _splitk._WS_CACHE_MAX // 4 + 1)
    assert big.data_ptr() != ws.data_ptr() and _splitk._WORKSPACES[(dev, 0)].data_ptr() == ws.data_ptr()


@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_output_shapes_and_out(lead, device, path):
    """1-D, 2-D and 3-D activations, with and without out=: the output's shape and values."""
    k, n = 64, 48
    w = _w(n, k, "mxfp4", device)
    x = _x(6, k, device)[: (int(torch.tensor(lead).prod()) if lead else 1)].reshape(*lead, k)
    q = bs.quantize(x, "mxfp4")
    for y, want in ((bs.linear(x, w, weight_only=True), ref_gemm(x, w)), (bs.gemm(q, w), ref_gemm(q, w))):
        assert y.shape == (*lead, n)
        assert_gemm_close(y.reshape(-1, n), want.reshape(-1, n), "mxfp4", torch.bfloat16)
    out = torch.full((*lead, n), float("nan"), dtype=torch.bfloat16, device=device)
    assert bs.linear(x, w, weight_only=True, out=out) is out
    assert_gemm_close(out.reshape(-1, n), ref_gemm(x, w).reshape(-1, n), "mxfp4", torch.bfloat16)


def test_grouped_plan_memo(device, monkeypatch):
    """Grouped plans are memoised (same object, explain agrees) and a replaced planner is asked;
    fp8_block x fp8_block too, keyed also by why the Hopper kernel cannot take the operands (its
    plan depends on their addresses)."""
    if device == "cpu" and not bs._checks.INTERPRET:
        pytest.skip("needs the interpreter on CPU")
    w = bs.quantize((torch.randn(3, 40, 64) * 0.1).to(device), "mxfp4")
    x = _x(5, 64, device)
    offs = torch.tensor([0, 2, 2, 5], dtype=torch.int32, device=device)
    plans = []
    for _ in range(2):
        with observe_plans() as seen:
            y = bs.grouped_gemm(x, w, offsets=offs)
        plans.append(seen[0])
    assert plans[0] is plans[1]
    assert bs.explain("grouped_gemm", x, w, offsets=offs) == plans[0]
    asked = []
    real = grouped_mod.plan_grouped
    monkeypatch.setattr(grouped_mod, "plan_grouped", lambda *a, **kw: asked.append(1) or real(*a, **kw))
    bs.grouped_gemm(x, w, offsets=offs)
    bs.grouped_gemm(x, w, offsets=offs)
    assert len(asked) == 1
    w8 = bs.quantize((torch.randn(3, 40, 128) * 0.1).to(device), "fp8_block", block=(128, 128))
    a8 = bs.quantize(_x(5, 128, device).float(), "fp8_block")
    bs.grouped_gemm(a8, w8, offsets=offs)
    bs.grouped_gemm(a8, w8, offsets=offs)
    assert len(asked) == 2
    assert y.shape == (5, 40)


@pytest.mark.parametrize("fmt,block", [("mxfp4", None), ("nvfp4", None), ("fp8_block", (128, 128))])
def test_quantize_eager_path_matches_the_op(fmt, block, device, monkeypatch):
    """bs.quantize's eager path (the implementation called directly, the ScaledTensor built
    without re-validation) gives bit-identical fields to the custom op's path, and a valid
    ScaledTensor (the constructor's checks pass on its fields)."""
    if device == "cpu" and not bs._checks.INTERPRET:
        pytest.skip("needs the interpreter on CPU")
    x = (torch.randn(3, 2, 160, generator=torch.Generator().manual_seed(3)) * 2).to(torch.bfloat16).to(device)
    if block is not None:
        x = x.reshape(6, 160)
    fast = bs.quantize(x, fmt, block=block)
    monkeypatch.setattr(gemm_mod, "EAGER_FAST_PATH", False)
    slow = bs.quantize(x, fmt, block=block)
    for name in ("data", "scale"):
        assert torch.equal(getattr(fast, name).view(torch.uint8), getattr(slow, name).view(torch.uint8)), name
    assert (fast.shape, fast.block, fast.rounding, fast.format) == (slow.shape, slow.block, slow.rounding, slow.format)
    assert type(fast.shape) is torch.Size and type(fast.block) is tuple
    if fmt == "nvfp4":
        assert torch.equal(fast.global_scale, slow.global_scale)
    from blockscaled.tensor import ScaledTensor

    ScaledTensor(fast.data, fast.scale, fast.format, fast.shape, fast.block, fast.rounding, fast.global_scale)
