"""The sm_90 register-streaming decode kernel (kernels/hopper/direct.py) on the GPU: mxfp4 / nvfp4
weights x bf16 activations against the float64 reference, through forced configs (every row count
1..8, K splits that divide and do not divide the steps, output dtypes, a bias), the planner's own
plan (``bs.linear`` / ``bs.gemm`` weight-only), odd N, K tails (K % 128 != 0), one step only,
quantized activations dequantized first (forced ``dequant_a``), extreme and NaN E8M0 scales,
determinism, CUDA graphs, and the errors of forced configs it cannot run. Needs an sm_90 GPU.
"""

from __future__ import annotations

import pytest
import torch

import blockscaled as bs
from blockscaled.config import GemmConfig
from blockscaled.reference import gemm as ref_gemm_mod
from blockscaled.reference.quantize import quantize
from blockscaled.tensor import ScaledTensor
from blockscaled.testing.inputs import randn_like_activations
from blockscaled.testing.tolerances import assert_gemm_close

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                reason="the register-streaming kernel is an sm_90 kernel")

FMTS = ("mxfp4", "nvfp4")


def _cfg(split=1, dequant_a=False):
    return GemmConfig(block_m=8, block_n=64, block_k=128, num_warps=4, num_stages=1, split_k=split, strategy="direct",
                      dequant_a=dequant_a)


def _operands(fmt, m, n, k, seed=0):
    x = randn_like_activations(m, k, dtype=torch.bfloat16, device="cuda", seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    w = quantize((torch.randn(n, k, generator=g) * 0.05).cuda(), fmt)
    return x, w


@pytest.mark.parametrize("fmt", FMTS)
def test_forced_configs_match_reference(fmt):
    """A partial 64-row tile, K tails of 32 / 64 / 96 elements past a 128-K step, one step only,
    one block only; splits 1, 2, 3 (not a divisor) and more than the steps; every row count."""
    for (n, k) in ((64, 128), (77, 4096), (200, 2080), (130, 2880), (96, 352), (65, 32)):
        for m in (1, 2, 3, 5, 8):
            x, w = _operands(fmt, m, n, k, seed=m + n)
            ref = ref_gemm_mod.gemm(x, w)
            for split in (1, 2, 3, 64):
                for out_dtype in ((torch.bfloat16, torch.float32, torch.float16) if split == 3 else (torch.bfloat16,)):
                    out = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
                    bs.gemm(x, w, out_dtype, out=out, config=_cfg(split))
                    assert_gemm_close(out, ref, fmt, out_dtype, what=f"n={n} k={k} m={m} split={split}")


@pytest.mark.parametrize("fmt", FMTS)
def test_planned_calls_run_it(fmt):
    """``bs.linear(weight_only=True)`` at 2..8 rows on a real projection plans the kernel (explain
    says so), with and without a bias, and matches the reference; repeated calls are bitwise equal
    (the split-K sum runs in a fixed order), also replayed from a CUDA graph."""
    n, k = 8192, 4096
    for m in (2, 5, 8):
        x, w = _operands(fmt, m, n, k, seed=m)
        for bias in (None, torch.randn(n, device="cuda", dtype=torch.bfloat16)):
            plan = bs.explain("linear", x, w, bias, weight_only=True)
            assert plan.kernel == "hopper_direct", plan
            ref = ref_gemm_mod.gemm(x, w) + (0 if bias is None else bias.double())
            y = bs.linear(x, w, bias, weight_only=True)
            assert_gemm_close(y, ref, fmt, torch.bfloat16, what=f"m={m} bias={bias is not None} {plan.describe()}")
            assert torch.equal(y, bs.linear(x, w, bias, weight_only=True))
        static = torch.empty_like(y)
        bs.linear(x, w, bias, weight_only=True, out=static)  # warm
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            bs.linear(x, w, bias, weight_only=True, out=static)
        static.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(static, y)


@pytest.mark.parametrize("fmt", FMTS)
def test_quantized_activations_dequantized_first(fmt):
    """Forced with ``dequant_a``: quantized activations of the weight's format become bf16 in one
    exact pass (nvfp4: their global scale in the epilogue); without it the call is refused."""
    n, k, m = 300, 2880, 6
    x, w = _operands(fmt, m, n, k, seed=7)
    a = bs.quantize(x, fmt)
    ref = ref_gemm_mod.gemm(a, w)
    out = bs.gemm(a, w, torch.float32, config=_cfg(2, dequant_a=True))
    assert_gemm_close(out, ref, fmt, torch.float32, what="W x A dequantized first")
    with pytest.raises(ValueError, match="dequant_a"):
        bs.gemm(a, w, config=_cfg(2))


def test_extreme_and_nan_scales():
    """mxfp4 E8M0 block scales at the bottom (codes 0..3) and the top (251..254 with elements <=
    1.5) times activations scaled to keep products near 1; an E8M0 255 (NaN) block makes its output
    column NaN, the others stay right."""
    m, n, k = 8, 70, 512
    x, w = _operands("mxfp4", m, n, k)
    gen = torch.Generator().manual_seed(5)
    for lo, xs in ((0, 2.0 ** 100), (251, 2.0 ** -110)):
        sc = torch.randint(lo, lo + 4, w.scale.shape, generator=gen).to(torch.uint8).cuda()
        data = w.data & 0xBB if lo == 251 else w.data
        w2 = ScaledTensor(data, sc, w.format, w.shape, w.block, w.rounding)
        x2 = (x.float() * xs).to(torch.bfloat16)
        ref = ref_gemm_mod.gemm(x2, w2)
        assert torch.isfinite(ref).all() and ref.abs().max() > 0
        out = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")
        bs.gemm(x2, w2, torch.float32, out=out, config=_cfg(2))
        assert_gemm_close(out, ref, "mxfp4", torch.float32, what=f"E8M0 {lo}..{lo + 3}")
    sc = w.scale.clone()
    sc[5, 3] = 255
    w3 = ScaledTensor(w.data, sc, w.format, w.shape, w.block, w.rounding)
    out = bs.gemm(x, w3, torch.float32, config=_cfg())
    assert out[:, 5].isnan().all() and not out[:, :5].isnan().any() and not out[:, 6:].isnan().any()


def test_forced_config_errors():
    """What the kernel cannot run is refused with the reason: more than 8 rows, mxfp8 weights,
    K % 32 != 0, fp16 activations."""
    x, w = _operands("mxfp4", 9, 128, 256)
    with pytest.raises(ValueError, match="M <= 8"):
        bs.gemm(x, w, config=_cfg())
    x8, w8 = _operands("mxfp8", 4, 128, 256)
    with pytest.raises(ValueError, match="mxfp4 / nvfp4"):
        bs.gemm(x8, w8, config=_cfg())
    x2, w2 = _operands("mxfp4", 4, 128, 272)
    with pytest.raises(ValueError, match="K % 32"):
        bs.gemm(x2, w2, config=_cfg())
    with pytest.raises(ValueError, match="bf16"):
        bs.gemm(x[:4].half(), w, config=_cfg())


def _grouped_ref(x_rows, wd, e):
    return x_rows.double() @ wd[e].double().T


@pytest.mark.parametrize("fmt", FMTS)
def test_grouped_decode_contiguous_and_masked(fmt, monkeypatch):
    """MoE decode, weight-only: 32 experts, most empty, a few with 1-3 rows, one with 20 (past the 8
    padded rows: its rows run in blocks) and the last holding rows; per-expert nvfp4 global scales;
    contiguous (offsets) planned to the kernel with the grouped split forced to 1..3, the grid
    compacted or full (bitwise equal), replayed from a CUDA graph; masked (counts) planned to it
    too, rows past a count not written."""
    from blockscaled.ops import _stream
    from blockscaled.ops import grouped as ops_grouped
    from blockscaled.plan import grouped as plan_grouped_mod

    e, n, k = 32, 130, 2080
    g = torch.Generator().manual_seed(3)
    w = quantize((torch.randn(e, n, k, generator=g) * 0.05).cuda(), fmt)
    wd = w.dequantize(torch.float32).double()
    gs = None
    if fmt == "nvfp4":
        gs = w.global_scale.float() * torch.tensor([1.0, 2.0, 0.5, 4.0] * 8, device="cuda")
        wd = wd * (w.global_scale.double() / gs.double())[:, None, None]
    counts = torch.zeros(e, dtype=torch.int32)
    counts[[1, 3, 8, 12, 31]] = torch.tensor([1, 3, 20, 2, 1], dtype=torch.int32)
    offsets = torch.zeros(e + 1, dtype=torch.int32)
    offsets[1:] = counts.cumsum(0)
    offs = offsets.cuda()
    x = randn_like_activations(int(counts.sum()), k, dtype=torch.bfloat16, device="cuda", seed=4)
    ref = torch.cat([_grouped_ref(x[offsets[i]:offsets[i + 1]], wd, i) for i in range(e)])
    kw = dict(out_dtype=torch.float32, b_global_scale=gs)
    real_rule = plan_grouped_mod.grouped_stream_split_why
    for split in (1, 2, 3):
        monkeypatch.setattr(plan_grouped_mod, "grouped_stream_split_why", lambda p, mp, dev, s=split: (s, f"split {s}"))
        ops_grouped._PLANS.clear()
        plan = bs.explain("grouped_gemm", x, w, offsets=offs, **kw)
        assert plan.kernel == "hopper_direct" and plan.config.split_k == split, plan
        y = bs.grouped_gemm(x, w, offsets=offs, **kw)
        assert_gemm_close(y, ref, fmt, torch.float32, what=f"contiguous split {split}")
        _stream.GROUPED_COMPACT = False
        try:
            assert torch.equal(y, bs.grouped_gemm(x, w, offsets=offs, **kw)), "compacted and full grids differ"
        finally:
            _stream.GROUPED_COMPACT = True
    static = torch.empty_like(y)
    bs.grouped_gemm(x, w, offsets=offs, out=static, **kw)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bs.grouped_gemm(x, w, offsets=offs, out=static, **kw)
    static.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static, y)
    monkeypatch.setattr(plan_grouped_mod, "grouped_stream_split_why", real_rule)
    ops_grouped._PLANS.clear()
    max_m = 24
    xm = torch.zeros(e, max_m, k, dtype=torch.bfloat16, device="cuda")
    for i in range(e):
        xm[i, :counts[i]] = x[offsets[i]:offsets[i + 1]]
    out = torch.full((e, max_m, n), float("nan"), dtype=torch.float32, device="cuda")
    plan = bs.explain("grouped_gemm", xm, w, masked_m=counts.cuda(), out=out, expected_m=2, **kw)
    assert plan.kernel == "hopper_direct", plan
    bs.grouped_gemm(xm, w, masked_m=counts.cuda(), out=out, expected_m=2, **kw)
    for i in range(e):
        c = int(counts[i])
        if c:
            assert_gemm_close(out[i, :c], _grouped_ref(xm[i, :c], wd, i), fmt, torch.float32, what=f"masked e={i}")
        assert out[i, c:].isnan().all()  # rows past the count are not written
