"""``bs.nn.enable_cuda_graphs`` on the GPU (nn/graphs.py): eager calls of Experts / MoE modules
replayed from per-signature CUDA graphs give bitwise the eager outputs with new inputs and
routing each call; calls past ``max_tokens`` stay eager; a replaced weight is seen (the graphs
are captured again); a module called inside the user's own capture is captured there, not
graphed twice; ``disable_cuda_graphs`` restores eager calls. Needs CUDA (skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch

import blockscaled as bs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")

E, H, I, K = 16, 512, 256, 2


def _experts(fmt, weight_only, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    gu = torch.randn(E, 2 * I, H, generator=g, device="cuda", dtype=torch.bfloat16) * H ** -0.5
    dn = torch.randn(E, H, I, generator=g, device="cuda", dtype=torch.bfloat16) * I ** -0.5
    return bs.nn.Experts.from_dense(gu, dn, fmt, act_format=None if weight_only else "weights")


def _call(t, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(t, H, generator=g, device="cuda", dtype=torch.bfloat16)
    idx = torch.stack([torch.randperm(E, generator=g, device="cuda")[:K] for _ in range(t)])
    w = torch.softmax(torch.randn(t, K, generator=g, device="cuda"), -1)
    return x, idx, w


@pytest.mark.parametrize("fmt,weight_only", [("mxfp4", True), ("nvfp4", False), ("fp8_block", False)])
def test_experts_graphs_equal_eager(fmt, weight_only):
    ex = _experts(fmt, weight_only)
    assert bs.nn.enable_cuda_graphs(ex, max_tokens=8) == 1
    prev = None
    for t in (1, 5, 1, 5, 1, 5, 100, 100, 100):
        for seed in range(3):
            args = _call(t, seed + 10 * t)
            y = ex(*args)
            assert torch.equal(y, ex._forward(*args)), (t, seed)
            if prev is not None:  # an earlier output is not overwritten by a later replay
                assert torch.equal(prev[0], prev[1]), (t, seed)
            prev = (y, y.clone())
    assert sorted(k[2][0][0][0] for k in ex._graphs.graphs) == [1, 5]  # T = 100 > max_tokens: eager
    assert bs.nn.disable_cuda_graphs(ex) == 1 and ex._graphs is None


def test_replaced_weight_is_seen():
    ex = _experts("mxfp4", True)
    bs.nn.enable_cuda_graphs(ex)
    args = _call(2, 1)
    for _ in range(3):
        ex(*args)
    assert len(ex._graphs.graphs) == 1
    ex.w_down = _experts("mxfp4", True, seed=5).w_down  # a new tensor: other addresses
    y = ex(*args)
    assert torch.equal(y, ex._forward(*args)) and len(ex._graphs.graphs) == 0  # dropped, eager once
    for _ in range(2):
        assert torch.equal(ex(*args), ex._forward(*args))
    assert len(ex._graphs.graphs) == 1


def test_moe_inside_a_user_capture():
    ex = _experts("fp8_block", False)
    router = torch.randn(E, H, device="cuda", dtype=torch.bfloat16) * H ** -0.5
    moe = bs.nn.MoE.from_experts(ex, router, top_k=K)
    assert bs.nn.enable_cuda_graphs(moe) == 1  # the layer (its experts run inside its graph)
    x = _call(4, 3)[0]
    for seed in range(4):  # new tokens (and so new routing) each call
        xs = _call(4, 20 + seed)[0]
        assert torch.equal(moe(xs), moe._forward(xs)), seed
    assert len(moe._graphs.graphs) == 1  # the layer replays its own graph
    ref = moe._forward(x)
    outer = torch.cuda.CUDAGraph()
    with torch.cuda.graph(outer):
        y = moe(x)  # capturing: the module's own graphs step aside
    outer.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, ref)


@pytest.mark.parametrize("fmt,weight_only", [("mxfp4", True), ("nvfp4", False), ("fp8_block", False)])
def test_linear_graphs_equal_eager(fmt, weight_only):
    """A quantized Linear (bias included) under no_grad: decode-size calls of [B, 1, K] replay
    graphs, bitwise the eager calls; a prefill-sized [1, P, K] call (P > max_tokens) and a call
    needing grad stay eager."""
    lin = torch.nn.Linear(H, 3 * H // 2, bias=True).cuda().to(torch.bfloat16)
    q = bs.nn.Linear.from_linear(lin, fmt, weight_only=weight_only)
    assert bs.nn.enable_cuda_graphs(q, max_tokens=8) == 1
    with torch.no_grad():
        for b in (1, 4, 1, 4, 1, 4):
            x = torch.randn(b, 1, H, device="cuda", dtype=torch.bfloat16)
            assert torch.equal(q(x), q._forward(x)), b
        for _ in range(3):  # 100 tokens > max_tokens: eager every time
            x = torch.randn(1, 100, H, device="cuda", dtype=torch.bfloat16)
            assert torch.equal(q(x), q._forward(x))
    assert sorted(k[2][0][0][0] for k in q._graphs.graphs) == [1, 4]  # [B, 1, K] signatures only
    for _ in range(3):  # grad mode on and the bias requires grad: eager, with an autograd graph
        y = q(torch.randn(2, 1, H, device="cuda", dtype=torch.bfloat16))
        assert y.requires_grad and y.grad_fn is not None
    assert sorted(k[2][0][0][0] for k in q._graphs.graphs) == [1, 4]
