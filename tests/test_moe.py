"""blockscaled.nn.moe: routing, permutation and the MoE layer against a float64 reference."""

from __future__ import annotations

import pytest
import torch

import blockscaled as bs
from blockscaled.nn.moe import MoE, permute, route

E, H, I, T, K = 4, 256, 128, 7, 2


def _deq(t):
    # .contiguous(): an Experts module with w_gate_up holds w_gate / w_up as views of its rows
    return (t.contiguous().dequantize() if isinstance(t, bs.ScaledTensor) else t).double()


def _ref_moe(moe: MoE, x: torch.Tensor, act=None) -> torch.Tensor:
    """float64: the same routing and permutation, activations quantized as the layer quantizes
    them (all sorted rows at once: nvfp4's global scale is per tensor), dequantized weights."""
    logits = torch.nn.functional.linear(x, moe.router_weight.to(x.dtype))
    w, ex = route(logits, moe.top_k, score=moe.score, n_group=moe.n_group, topk_group=moe.topk_group,
                  correction_bias=moe.correction_bias, norm_topk_prob=moe.norm_topk_prob,
                  routed_scaling_factor=moe.routed_scaling_factor)
    order, token, _ = permute(ex, moe.num_experts)
    e_row = ex.reshape(-1)[order]
    a = _deq(moe._act(x[token]))
    wg, wu, wd = (_deq(t) for t in (moe.w_gate, moe.w_up, moe.w_down))
    g = torch.stack([a[r] @ wg[e_row[r]].T for r in range(len(order))])
    u = torch.stack([a[r] @ wu[e_row[r]].T for r in range(len(order))])
    h = (act(g, u, e_row) if act else torch.nn.functional.silu(g) * u).to(x.dtype)
    ha = _deq(moe._act(h))
    y = torch.stack([ha[r] @ wd[e_row[r]].T for r in range(len(order))])
    if moe.down_bias is not None:
        y = y + moe.down_bias.double()[e_row]
    out = torch.zeros(x.shape[0], H, dtype=torch.float64, device=x.device)
    out.index_add_(0, token, y * w.reshape(-1)[order, None].double())
    return out


def test_route_plain_and_grouped(device):
    torch.manual_seed(0)
    logits = torch.randn(5, 8, device=device)
    w, e = route(logits, 2)
    ref = torch.softmax(logits, -1).topk(2, -1)
    assert torch.equal(e, ref.indices) and torch.allclose(w, ref.values / ref.values.sum(-1, keepdim=True))
    # DeepSeek-V3 grouped top-k: experts outside the best group are never chosen
    bias = torch.zeros(8, device=device)
    bias[:4] = 10.0  # group 0 wins every token's choice
    w, e = route(logits, 2, score="sigmoid", n_group=2, topk_group=1, correction_bias=bias,
                 routed_scaling_factor=2.5)
    assert bool((e < 4).all()) and torch.allclose(w.sum(-1), torch.full((5,), 2.5, device=device))
    with pytest.raises(ValueError, match="top_k"):
        route(logits, 9)
    with pytest.raises(ValueError, match="n_group"):
        route(logits, 2, n_group=3, topk_group=1)


ROUTE_CASES = [  # (E, k, score, n_group, topk_group, bias, norm, scale)
    (8, 2, "softmax", None, None, False, True, 1.0),       # Mixtral
    (128, 8, "softmax", None, None, False, True, 1.0),     # Qwen3-MoE
    (32, 4, "softmax", None, None, False, False, 1.0),     # gpt-oss-20b (weights not renormalised)
    (60, 4, "softmax", None, None, False, False, 1.0),     # Qwen1.5-MoE: E not a power of two
    (256, 8, "sigmoid", 8, 4, True, True, 2.5),            # DeepSeek-V3
    (64, 6, "sigmoid", 8, 3, True, True, 1.0),             # DeepSeek-V2-Lite-like grouped
    (16, 1, "sigmoid", 16, 2, False, False, 1.0),          # groups of one expert
    (300, 2, "sigmoid", 4, 2, True, True, 1.0),            # grouped, E not a power of two: the torch twin
]


def _distinct_logits(t, e, g, dtype, device):
    """Logits without ties, exactly representable in bf16 (multiples of 1/16 below 16 in magnitude):
    the kernel and torch.topk then have one answer (among equal values their orders differ)."""
    rows = [(torch.randperm(e, generator=g) - e // 2).float() / 16 for _ in range(t)]
    return torch.stack(rows).to(device=device, dtype=dtype)


@pytest.mark.parametrize("case", ROUTE_CASES, ids=lambda c: f"E{c[0]}k{c[1]}{c[2]}g{c[3]}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_route_kernel_matches_torch_twin(case, dtype, path, device):
    """The one-launch routing kernel gives the torch twin's experts, in its order, and their weights
    within fp32 rounding (softmax and the renormalising sum run in another order), on every form."""
    from blockscaled.nn.moe import _route_torch
    from blockscaled.ops.moe import route_topk

    e, k, score, ng, tg, has_bias, norm, scale = case
    g = torch.Generator().manual_seed(e + k)
    for t in (1, 5):
        logits = _distinct_logits(t, e, g, dtype, device)
        bias = (torch.randperm(e, generator=g).float() / 4096).to(device) if has_bias else None
        kw = dict(score=score, n_group=ng, topk_group=tg, correction_bias=bias, norm_topk_prob=norm,
                  routed_scaling_factor=scale)
        w, ex = route(logits, k, **kw)
        w0, ex0 = _route_torch(logits, k, score, ng, tg, bias, norm, scale)
        assert ex.dtype == torch.int64 and w.dtype == torch.float32 and w.shape == (t, k)
        assert torch.equal(ex, ex0), (ex, ex0)
        torch.testing.assert_close(w, w0, rtol=2e-6, atol=1e-7)
        ran = route_topk(logits, k, score == "sigmoid", ng, tg, bias, norm, scale)
        takes = path == "kernels" and not (ng and (e & (e - 1)))
        assert (ran is not None) == takes
    # a transposed view (stride(1) != 1) is left to the twin
    lt = _distinct_logits(3, e, g, dtype, device).t().contiguous().t()
    assert lt.shape == (3, e) and lt.stride(1) != 1
    assert route_topk(lt, k, score == "sigmoid", ng, tg, bias, norm, scale) is None


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_route_kernel_bad_values_route_to_valid_distinct_experts(score, path, device):
    """NaN / inf logits and a -inf bias: every expert id is in [0, E) and no expert twice in a row
    (padding lanes and ties among -inf never picked twice); NaN rows keep NaN weights (loud)."""
    e, k = 6, 3  # E not a power of two: two padding lanes
    logits = torch.randn(4, e, device=device)
    logits[0, 2] = float("nan")
    logits[1, :] = float("inf")
    logits[2, :] = float("-inf")
    bias = torch.zeros(e, device=device)
    bias[1:] = float("-inf")
    for b in (None, bias):
        w, ex = route(logits, k, score=score, correction_bias=b)
        assert bool(((ex >= 0) & (ex < e)).all()), ex
        assert all(len(set(row)) == k for row in ex.tolist()), ex
    w, ex = route(logits, k, score=score)
    if score == "softmax":
        assert bool(w[0].isnan().all())  # the NaN logit poisons the row's softmax


def test_route_keeps_gradients_and_checks_the_bias(device):
    logits = torch.randn(3, 8, device=device, requires_grad=True)
    w, _ = route(logits, 2)
    assert w.requires_grad
    w.sum().backward()
    assert logits.grad is not None
    with pytest.raises(ValueError, match="correction_bias"):
        route(logits.detach(), 2, correction_bias=torch.zeros(4, device=device))
    with pytest.raises(ValueError, match="correction_bias"):
        route(logits.detach(), 2, correction_bias=torch.zeros(2, 8, device=device))


def test_route_no_tokens(device):
    w, e = route(torch.empty(0, 8, device=device), 2)
    assert w.shape == (0, 2) and e.shape == (0, 2)


def test_permute(device):
    ex = torch.tensor([[2, 0], [2, 1], [0, 2]], device=device)
    order, token, offsets = permute(ex, 4)
    assert offsets.tolist() == [0, 2, 3, 6, 6] and offsets.dtype == torch.int32
    assert ex.reshape(-1)[order].tolist() == [0, 0, 1, 2, 2, 2]
    assert token.tolist() == (order // 2).tolist()


@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8", "mxfp4", "nvfp4"])
def test_moe_matches_reference(fmt, path, device):
    torch.manual_seed(1)
    w1 = torch.randn(E, I, H, device=device) * 0.05
    w3 = torch.randn(E, I, H, device=device) * 0.05
    w2 = torch.randn(E, H, I, device=device) * 0.05
    router = torch.randn(E, H, device=device, dtype=torch.bfloat16)
    moe = MoE.from_dense(w1.bfloat16(), w3.bfloat16(), w2.bfloat16(), router, fmt, top_k=K)
    x = torch.randn(T, H, device=device, dtype=torch.bfloat16)
    y = moe(x)
    ref = _ref_moe(moe, x)
    assert y.shape == (T, H) and y.dtype == torch.bfloat16
    rel = float((y.double() - ref).norm() / ref.norm())
    assert rel < 1e-2, rel


def test_moe_gpt_oss_activation_and_biases(path, device):
    torch.manual_seed(2)
    wgu = torch.randn(E, 2 * I, H, device=device).bfloat16() * 0.05
    w2 = torch.randn(E, H, I, device=device).bfloat16() * 0.05
    q = bs.quantize(wgu, "mxfp4")
    moe = MoE(q, bs.quantize(w2, "mxfp4"), torch.randn(E, H, device=device, dtype=torch.bfloat16), top_k=K,
              activation="gpt_oss", interleaved=True, gate_up_bias=torch.randn(E, 2 * I, device=device),
              down_bias=torch.randn(E, H, device=device))
    x = torch.randn(T, H, device=device, dtype=torch.bfloat16)
    y = moe(x)
    b = moe.gate_up_bias.double()  # de-interleaved by the layer: gate | up

    def act(g, u, e_row):
        g = (g + b[e_row, :I]).clamp(max=7.0)
        u = (u + b[e_row, I:]).clamp(-7.0, 7.0)
        return (u + 1) * g * torch.sigmoid(1.702 * g)

    out = _ref_moe(moe, x, act)
    # the layer's gate / up rows are the even / odd rows of the checkpoint's fused weight
    assert torch.equal(moe.w_gate.contiguous().dequantize(), q.dequantize()[:, 0::2])
    # held once: w_gate / w_up are views of w_gate_up's rows (nn/experts.py), and a view cannot
    # reach a kernel without .contiguous() (no hidden copies)
    ex = moe.experts
    assert ex.w_gate.data.data_ptr() == ex.w_gate_up.data.data_ptr()
    assert ex.w_up.data.untyped_storage().data_ptr() == ex.w_gate_up.data.untyped_storage().data_ptr()
    with pytest.raises(ValueError, match="cannot be flattened without a copy"):
        moe.w_gate.dequantize()
    rel = float((y.double() - out).norm() / out.norm())
    assert rel < 2e-2, rel


def test_moe_argument_errors(device):
    q = bs.quantize(torch.randn(E, 2 * I, H, device=device).bfloat16(), "fp8_block", block=(128, 128))
    d = bs.quantize(torch.randn(E, H, I, device=device).bfloat16(), "fp8_block", block=(128, 128))
    r = torch.randn(E, H, device=device)
    with pytest.raises(ValueError, match="w_down"):
        MoE(q, q, r, top_k=2)
    with pytest.raises(ValueError, match="router_weight"):
        MoE(q, d, r[:, :8], top_k=2)
    with pytest.raises(ValueError, match="interleaved"):
        MoE(q, d, r, top_k=2, interleaved=True)
    with pytest.raises(ValueError, match="x"):
        MoE(q, d, r, top_k=2)(torch.randn(3, 8, device=device, dtype=torch.bfloat16))


def test_moe_from_experts(device):
    """MoE around an existing Experts module (here fp8_block with an intermediate size that is not
    a multiple of 128: gate and up quantized apart) routes as the constructor's layer does."""
    import blockscaled.nn as bsnn

    g = torch.Generator(device=device).manual_seed(3)
    i = 192
    ex = bsnn.Experts.from_dense((torch.randn(E, 2 * i, H, generator=g, device=device) * 0.05).bfloat16(),
                                 (torch.randn(E, H, i, generator=g, device=device) * 0.05).bfloat16(), "fp8_block")
    assert ex.w_gate_up is None  # the split at row 192 is inside a 128-row scale block
    # gate / up rows held once: fp8_block (its fused SwiGLU reads w_gate / w_up) keeps no stacked
    # gate_up; MX / NV keep only the stack (the stacked SwiGLU), w_gate / w_up views of its rows
    wgu = (torch.randn(E, 2 * 128, H, generator=g, device=device) * 0.05).bfloat16()
    wdn = (torch.randn(E, H, 128, generator=g, device=device) * 0.05).bfloat16()
    ex8 = bsnn.Experts.from_dense(wgu, wdn, "fp8_block")
    assert ex8.w_gate_up is None and ex8.w_gate.data.is_contiguous() and ex8.w_up.data.is_contiguous()
    # the gpt-oss activation on an fp8_block stack split inside a 128-row block keeps the given two
    q = lambda t: bs.quantize(t.contiguous(), "fp8_block", block=(128, 128))  # noqa: E731
    w192 = (torch.randn(E, 2 * 192, H, generator=g, device=device) * 0.05).bfloat16()
    exo = bsnn.Experts(q(w192[:, :192]), q(w192[:, 192:]), q(wdn.new_zeros(E, H, 192)), w_gate_up=q(w192),
                       activation="gpt_oss")
    assert exo.w_gate_up is not None and exo.w_gate.data.is_contiguous()
    ex4 = bsnn.Experts.from_dense(wgu, wdn, "mxfp4")
    assert ex4.w_gate_up is not None and ex4.w_gate.data.data_ptr() == ex4.w_gate_up.data.data_ptr()
    assert ex4.w_up.data.untyped_storage().data_ptr() == ex4.w_gate_up.data.untyped_storage().data_ptr()
    plans = ex4.plans(4)
    assert plans[0].op == "swiglu" and plans[0].problem is not None and not plans[0].problem.dual, plans[0]
    router = torch.randn(E, H, generator=g, device=device).bfloat16()
    moe = MoE.from_experts(ex, router, top_k=K, score="sigmoid")
    x = torch.randn(T, H, generator=g, device=device).bfloat16()
    w, idx = route(torch.nn.functional.linear(x, router), K, score="sigmoid")
    assert torch.equal(moe(x), ex(x, idx, w))
    assert (moe.num_experts, moe.hidden, moe.intermediate, moe.top_k) == (E, H, i, K)
    with pytest.raises(TypeError, match="experts"):
        MoE.from_experts(torch.nn.Linear(2, 2), router, top_k=K)
    with pytest.raises(ValueError, match="router_weight"):
        MoE.from_experts(ex, router[:, :8], top_k=K)
    with pytest.raises(ValueError, match="score"):
        MoE.from_experts(ex, router, top_k=K, score="relu")


# --------------------------------------------------------------------------- ops/moe.py glue
def _permute_ref(flat, e):
    """A stable sort by expert with ids outside [0, E) last (plain Python)."""
    v = flat.tolist()
    key = [x if 0 <= x < e else e for x in v]
    order = sorted(range(len(v)), key=lambda i: (key[i], i))
    offsets = [sum(1 for x in key if x < b) for b in range(e + 1)]
    return order, offsets


@pytest.mark.parametrize("t,k,e", [(1, 1, 4), (1, 8, 256), (5, 2, 3), (8, 8, 64), (64, 1, 33), (9, 8, 128),
                                   (16, 8, 16), (17, 8, 8), (64, 8, 16)])
def test_glue_permute_kernel_and_twin(t, k, e, device):
    """The counting-sort kernel (T x k <= PERMUTE_MAX: sizes 64 and PERMUTE_MAX) and the torch twin
    (above, and the reference path) give the same stable permutation, its inverse and the offsets."""
    from blockscaled.ops import moe as glue

    g = torch.Generator().manual_seed(t * 1000 + k * 10 + e)
    ids = torch.randint(0, e, (t, k), generator=g).to(device)
    order, token, offsets, inv = glue.permute(ids, e)
    want_order, want_off = _permute_ref(ids.reshape(-1).cpu(), e)
    assert order.tolist() == want_order and offsets.tolist() == want_off
    assert token.tolist() == [i // k for i in want_order]
    assert (order.dtype, token.dtype, offsets.dtype, inv.dtype) == (torch.int64, torch.int64, torch.int32,
                                                                    torch.int32)
    assert inv[order].tolist() == list(range(t * k))
    kernel = not (device == "cpu" and not bs._checks.INTERPRET) and t * k <= glue.PERMUTE_MAX
    assert glue.permute_block(t * k, ids.device) == (None if not kernel else 64 if t * k <= 64 else glue.PERMUTE_MAX)


def test_glue_permute_leaves_out_bad_ids(device):
    """Ids outside [0, E) sort last and are not counted: offsets[E] < T x k makes the grouped
    GEMM's metadata check fail the call (both paths)."""
    from blockscaled.ops import moe as glue

    ids = torch.tensor([[3, -1], [0, 4], [1, 1]], device=device)
    order, _, offsets, inv = glue.permute(ids, 4)
    assert offsets.tolist() == [0, 1, 3, 3, 4] and order.tolist() == [2, 4, 5, 0, 1, 3]
    assert inv[order].tolist() == list(range(6))
    o2, _, off2, _ = glue._permute_torch(ids.reshape(-1), 2, 4)
    assert o2.tolist() == order.tolist() and off2.tolist() == offsets.tolist()


@pytest.mark.parametrize("t,k,h,wdt", [(1, 8, 256, torch.float32), (7, 2, 1500, torch.bfloat16), (3, 1, 64, torch.float32)])
def test_glue_combine(t, k, h, wdt, device):
    """combine = sum_j w[t, j] * y[inv[t k + j]] in fp32, one rounding (float64 reference)."""
    from blockscaled.ops import moe as glue

    g = torch.Generator().manual_seed(h)
    ids = torch.randint(0, 5, (t, k), generator=g).to(device)
    _, _, _, inv = glue.permute(ids, 5)
    y = torch.randn(t * k, h, generator=g).to(device)
    w = torch.rand(t, k, generator=g).to(wdt).to(device)
    out = glue.combine(y, w, inv, torch.bfloat16)
    ref = (y.double()[inv.long()].view(t, k, h) * w.double().unsqueeze(-1)).sum(1)
    assert out.dtype == torch.bfloat16 and out.shape == (t, h)
    assert torch.allclose(out.double(), ref, rtol=2 ** -8, atol=1e-6), float((out.double() - ref).abs().max())


def test_glue_combine_checks_its_inputs(device):
    from blockscaled.ops import moe as glue

    inv = torch.arange(4, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="combine: expected y fp32"):
        glue.combine(torch.zeros(4, 8, device=device, dtype=torch.bfloat16), torch.ones(2, 2, device=device), inv,
                     torch.bfloat16)
    with pytest.raises(ValueError, match="inv int32"):
        glue.combine(torch.zeros(4, 8, device=device), torch.ones(2, 2, device=device), inv.long(), torch.bfloat16)
    y = torch.randn(8, 4, device=device).t()  # [4, 8] with column stride 4: taken contiguous
    out = glue.combine(y, torch.ones(2, 2, device=device), inv, torch.float32)
    assert torch.allclose(out, y[0::2] + y[1::2])


@pytest.mark.parametrize("case", ROUTE_CASES[:7], ids=lambda c: f"E{c[0]}k{c[1]}{c[2]}g{c[3]}")
def test_route_permute_is_route_then_permute(case, path, device):
    """The one-launch routing + permutation (decode sizes) returns what route_topk and permute
    return apart: the same experts (weights within fp32 rounding), order, token, offsets and inverse;
    None where the two must run apart (reference path, outside its band)."""
    from blockscaled.ops import moe as glue

    e, k, score, ng, tg, has_bias, norm, scale = case
    g = torch.Generator().manual_seed(7 * e + k)
    bias = (torch.randperm(e, generator=g).float() / 4096).to(device) if has_bias else None
    for t in (1, 3, 8, 16):
        logits = _distinct_logits(t, e, g, torch.bfloat16, device)
        got = glue.route_permute(logits, k, score == "sigmoid", ng, tg, bias, norm, scale)
        fits = t * k <= glue.ROUTE_PERMUTE_MAX_ASSIGNMENTS and glue._pow2(e) >= glue.ROUTE_PERMUTE_MIN_EXPERTS
        if path != "kernels" or not fits:
            assert got is None
            continue
        assert got is not None
        w, ids, perm = got
        w0, ids0 = glue.route_topk(logits, k, score == "sigmoid", ng, tg, bias, norm, scale)
        # the same per-token routing code; its program has other warps than route_topk's, so the softmax
        # and renormalising sums may round in another order (a GPU run found a last-bit difference)
        assert torch.equal(ids, ids0)
        torch.testing.assert_close(w, w0, rtol=2e-6, atol=1e-7)
        for a, b in zip(perm, glue.permute(ids0, e)):
            assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("band", [True, False])
def test_route_permute_band(band, path, device, monkeypatch):
    """Outside its measured band (few experts, many assignments) the one-launch form declines and the
    layer routes and permutes in two launches; inside it (the band widened here to reach the small
    test sizes) it matches them, and its counter is left at zero for the next launch."""
    from blockscaled.ops import moe as glue
    from blockscaled.ops._splitk import splitk_counters

    if band:
        monkeypatch.setattr(glue, "ROUTE_PERMUTE_MIN_EXPERTS", 1)
        monkeypatch.setattr(glue, "ROUTE_PERMUTE_MAX_ASSIGNMENTS", glue.PERMUTE_MAX)
    g = torch.Generator().manual_seed(3)
    for t, e, k in ((1, 16, 2), (5, 8, 8), (16, 32, 8), (3, 4, 1)):
        logits = _distinct_logits(t, e, g, torch.float32, device)
        got = glue.route_permute(logits, k, False, None, None, None, True, 1.0)
        if not band or path != "kernels":
            assert got is None
            continue
        w0, ids0 = glue.route_topk(logits, k, False, None, None, None, True, 1.0)
        assert torch.equal(got[1], ids0)
        torch.testing.assert_close(got[0], w0, rtol=2e-6, atol=1e-7)
        for a, b in zip(got[2], glue.permute(ids0, e)):
            assert torch.equal(a, b)
        assert int(splitk_counters(torch.device(device), 1)[0]) == 0
    assert glue.route_permute(torch.randn(glue.PERMUTE_MAX // 8 + 1, 256, device=device), 8, False, None, None, None,
                              True, 1.0) is None


def _moe_layer(device, fmt="mxfp4", e=8, h=64, i=64, k=2):
    g = torch.Generator().manual_seed(5)
    w_gu = (torch.randn(e, 2 * i, h, generator=g) * 0.1).to(torch.bfloat16)
    w_dn = (torch.randn(e, h, i, generator=g) * 0.1).to(torch.bfloat16)
    router = torch.randn(e, h, generator=g).to(torch.bfloat16)
    return MoE.from_dense(w_gu[:, :i].to(device), w_gu[:, i:].to(device), w_dn.to(device), router.to(device), fmt,
                          top_k=k)


def test_moe_decode_glue_launches(path, device, monkeypatch):
    """At decode sizes the layer routes and permutes in one launch (route_permute), the grouped GEMMs
    skip their metadata checks (the combine checks the sort's offsets) and the output equals the
    two-launch path's bitwise."""
    from blockscaled.ops import errors
    from blockscaled.ops import moe as glue

    moe = _moe_layer(device)
    x = (torch.randn(3, 64, generator=torch.Generator().manual_seed(1)) * 0.5).to(torch.bfloat16).to(device)
    calls = {"route_permute": 0, "check": 0}
    rp, cm = glue.route_permute, errors.check_metadata

    def spy_rp(*a, **kw):
        r = rp(*a, **kw)
        calls["route_permute"] += r is not None
        return r

    def spy_check(*a, **kw):
        calls["check"] += 1
        return cm(*a, **kw)

    monkeypatch.setattr(glue, "ROUTE_PERMUTE_MIN_EXPERTS", 1)  # the test layer's 8 experts: in the band
    monkeypatch.setattr("blockscaled.nn.moe.route_permute", spy_rp)
    for mod in ("blockscaled.ops.grouped", "blockscaled.ops.errors"):
        monkeypatch.setattr(f"{mod}.check_metadata", spy_check)
    y = moe(x)
    kernels = path == "kernels"
    assert calls == {"route_permute": int(kernels), "check": 0}
    monkeypatch.setattr("blockscaled.nn.moe.route_permute", lambda *a, **kw: None)
    y2 = moe(x)
    assert torch.equal(y, y2)


def test_experts_bad_ids_fail_loudly_in_the_combine(path, device):
    """Expert ids outside [0, E): on the GPU the combine writes NaN over the output and check_errors
    names nn.Experts and how many assignments were out of range (the GEMMs no longer check on their
    own); on the CPU the call raises. The combine's own check (which the GPU path relies on) runs on
    every path: checked directly below."""
    moe = _moe_layer(device)
    x = torch.randn(3, 64, device=device).to(torch.bfloat16)
    idx = torch.tensor([[0, 1], [2, 9], [-1, 3]], device=device)
    w = torch.full((3, 2), 0.5, device=device)
    bs.check_errors(device)
    if device == "cpu":  # no sync to save: raised at the call
        with pytest.raises(ValueError, match=r"top_k_index: expected expert ids in \[0, 8\), got 9 \(2 of 6"):
            moe.experts(x, idx, w)
    else:
        y = moe.experts(x, idx, w)
        assert torch.isnan(y.float()).all()
        with pytest.raises(RuntimeError, match=r"nn\.Experts .*2 of its 6 expert assignments"):
            bs.check_errors(device)
        bs.check_errors(device)  # cleared
    y = moe.experts(x, idx.clamp(0, 7), w)
    assert torch.isfinite(y.float()).all()
    bs.check_errors(device)


def test_combine_offsets_check_on_every_path(path, device):
    """combine(..., offsets=) with offsets that end below T x k (an id out of range): NaN output and the
    flag naming nn.Experts, whichever path runs (kernel, interpreter, reference twin)."""
    from blockscaled.ops import moe as glue

    ids = torch.tensor([[3, -1], [0, 4], [1, 1]], device=device)
    _, _, offsets, inv = glue.permute(ids, 4)
    y = torch.randn(6, 16, device=device)
    w = torch.full((3, 2), 0.5, device=device)
    bs.check_errors(device)
    out = glue.combine(y, w, inv, torch.bfloat16, offsets=offsets)
    assert torch.isnan(out.float()).all()
    with pytest.raises(RuntimeError, match=r"nn\.Experts .*2 of its 6 expert assignments \(top_k_index\) were outside \[0, E=4\)"):
        bs.check_errors(device)
    ok_ids = ids.clamp(0, 3)
    _, _, offsets, inv = glue.permute(ok_ids, 4)
    out = glue.combine(y, w, inv, torch.bfloat16, offsets=offsets)
    assert torch.isfinite(out.float()).all()
    bs.check_errors(device)
