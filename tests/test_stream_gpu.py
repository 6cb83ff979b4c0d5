"""The sm_90a weight-streaming kernel (kernels/hopper/stream.py) on the GPU: mxfp4 / nvfp4 /
mxfp8 weights x bf16 or quantized activations against the float64 reference, through forced configs (every padded
row count, K splits that divide and do not divide the steps, ring depths, output dtypes), the
planner's own plan (``bs.linear`` / ``bs.gemm`` weight-only), odd N, K tails (K % 128 != 0),
extreme E8M0 scales, NaN scales, determinism, CUDA graphs. Needs an sm_90 GPU (skipped elsewhere).
"""

from __future__ import annotations

import dataclasses

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
                                reason="the streaming kernel is an sm_90 kernel")

FMTS = ("mxfp4", "nvfp4", "mxfp8")


@pytest.fixture
def planned_for_every_format(monkeypatch):
    """The planner's mxfp8 limits (plan/stream.py: small weights and weight-only above 16 rows
    keep the portable tiles; its activations always dequantized first) lifted,
    plan memos cleared: the planned path runs the kernel, both ways, for every format here. Where
    the planner uses it: tests/test_planner.py."""
    from blockscaled.ops import gemm as ops_gemm
    from blockscaled.ops import grouped as ops_grouped
    from blockscaled.plan import direct as plan_direct
    from blockscaled.plan import stream as plan_stream
    from blockscaled.plan import tiled as plan_tiled
    from blockscaled.plan.gemm import plan_gemm

    monkeypatch.setattr(plan_direct, "DIRECT_ENABLED", False)  # fp4 weight-only 2..8 rows: tests/test_direct_gpu.py
    monkeypatch.setattr(plan_tiled, "RS_SMALL_MIN_M", 65)  # fp4 33..64 rows: tests/test_tiled_gpu.py
    monkeypatch.setattr(plan_stream, "STREAM_FP8_MIN_BYTES", 0)
    monkeypatch.setattr(plan_stream, "STREAM_FP8_WO_MAX_M", 64)
    monkeypatch.setattr(plan_stream, "STREAM_GROUPED_FORMATS", FMTS)
    monkeypatch.setattr(plan_stream, "STREAM_GATHER_MAX_MP", {f: 16 for f in FMTS})

    def clear():
        plan_gemm.cache_clear()
        ops_gemm._PLANS.clear()
        ops_grouped._PLANS.clear()

    clear()
    yield
    clear()


def _cfg(m, split=1, stages=6):
    mp = next(s for s in (8, 16, 32, 64) if s >= m)
    return GemmConfig(block_m=mp, block_n=64, block_k=128, num_warps=4, num_stages=stages, split_k=split,
                      strategy="stream")


def _operands(fmt, m, n, k, seed=0):
    x = randn_like_activations(m, k, dtype=torch.bfloat16, device="cuda", seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    w = quantize((torch.randn(n, k, generator=g) * 0.05).cuda(), fmt)
    return x, w


@pytest.mark.parametrize("fmt", FMTS)
def test_forced_configs_match_reference(fmt):
    """Shapes with a partial 64-row tile, K tails of 32 / 64 / 96 elements past a 128-K step, one
    step only; splits 1, 2, 3 (not a divisor) and more than the steps; rings of 2 and 6 slots."""
    for (n, k) in ((64, 128), (77, 4096), (200, 2080), (130, 2880), (96, 352)):
        for m in (1, 3, 8, 16, 33, 64):
            x, w = _operands(fmt, m, n, k, seed=m + n)
            ref = ref_gemm_mod.gemm(x, w)
            for split, stages in ((1, 6), (2, 2), (3, 6), (64, 4)):
                for out_dtype in ((torch.bfloat16, torch.float32) if split == 3 else (torch.bfloat16,)):
                    out = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
                    bs.gemm(x, w, out_dtype, out=out, config=_cfg(m, split, stages))
                    assert_gemm_close(out, ref, fmt, out_dtype, what=f"n={n} k={k} m={m} split={split}")


@pytest.mark.parametrize("fmt", FMTS)
def test_planned_calls_run_it(fmt, planned_for_every_format):
    """``bs.linear(weight_only=True)`` at decode M on a real projection plans the streaming kernel
    (explain says so) and matches the reference; repeated calls are bitwise equal (the split-K sum
    runs in a fixed order), also replayed from a CUDA graph."""
    n, k = 5760, 2880
    for m in (3, 16, 40):
        x, w = _operands(fmt, m, n, k, seed=m)
        plan = bs.explain("linear", x, w, weight_only=True)
        assert plan.kernel == "hopper_stream", plan
        ref = ref_gemm_mod.gemm(x, w)
        y = bs.linear(x, w, weight_only=True)
        assert_gemm_close(y, ref, fmt, torch.bfloat16, what=f"m={m} {plan.describe()}")
        assert torch.equal(y, bs.linear(x, w, weight_only=True))
        static = torch.empty_like(y)
        bs.linear(x, w, weight_only=True, out=static)  # warm
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            bs.linear(x, w, weight_only=True, out=static)
        static.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(static, y)


def test_extreme_and_nan_scales():
    """mxfp4 E8M0 block scales at the bottom (codes 0..3: weights down to 2**-128) and the top
    (251..254 with elements <= 1.5) times bf16 activations scaled to keep products near 1; an E8M0
    255 (NaN) block makes its output row NaN, the others stay right."""
    m, n, k = 8, 70, 512
    x, w = _operands("mxfp4", m, n, k)
    gen = torch.Generator().manual_seed(5)
    for lo, xs in ((0, 2.0 ** 100), (251, 2.0 ** -110)):
        sc = torch.randint(lo, lo + 4, w.scale.shape, generator=gen).to(torch.uint8).cuda()
        data = w.data
        if lo == 251:  # elements <= 1.5 so that 1.5 * 2**127 stays finite: magnitudes 0..3
            data = w.data & 0xBB
        w2 = ScaledTensor(data, sc, w.format, w.shape, w.block, w.rounding)
        x2 = (x.float() * xs).to(torch.bfloat16)
        assert torch.isfinite(x2.float()).all()
        ref = ref_gemm_mod.gemm(x2, w2)
        assert torch.isfinite(ref).all() and ref.abs().max() > 0
        out = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")
        bs.gemm(x2, w2, torch.float32, out=out, config=_cfg(m, 2))
        assert_gemm_close(out, ref, "mxfp4", torch.float32, what=f"E8M0 {lo}..{lo + 3}")
    sc = w.scale.clone()
    sc[5, 3] = 255
    w3 = ScaledTensor(w.data, sc, w.format, w.shape, w.block, w.rounding)
    out = bs.gemm(x, w3, torch.float32, config=_cfg(m))
    assert out[:, 5].isnan().all() and not out[:, :5].isnan().any() and not out[:, 6:].isnan().any()


@pytest.mark.parametrize("fmt", FMTS)
def test_w_x_a_and_bias(fmt, planned_for_every_format):
    """Quantized activations of the weight's format (W x A: decoded in the kernel's gather or
    dequantized to bf16 first, ``dequant_a``, as planned and forced; nvfp4's activation global
    scale applied in the epilogue beside the weight's) and a bias (bf16 / fp32,
    added in fp32 in the epilogue, also by the split-K last arriver), through the planner
    (``bs.linear``: explain names the kernel) and forced splits; against the float64 reference."""
    n, k = 5760, 2880
    for m in (3, 16, 64):
        x, w = _operands(fmt, m, n, k, seed=10 + m)
        xq = quantize(x, fmt)  # nvfp4: its own global scale, not 1
        bias = (torch.randn(n, generator=torch.Generator().manual_seed(m)) * 0.3).cuda()
        for a, wo in ((xq, False), (x, True)):
            for b in (None, bias.to(torch.bfloat16), bias):
                plan = bs.explain("gemm", a, w, bias=b)
                if not (m <= 2 and fmt == "mxfp4"):
                    assert plan.kernel == "hopper_stream", plan
                ref = ref_gemm_mod.gemm(a, w, bias=b)
                y = bs.gemm(a, w, bias=b)
                assert_gemm_close(y, ref, fmt, torch.bfloat16, what=f"m={m} wo={wo} bias={b is not None}")
                for split, dq in ((1, False), (3, True)):  # quantized activations: decoded in the gather / first
                    out = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")
                    cfg = dataclasses.replace(_cfg(m, split), dequant_a=dq)
                    bs.gemm(a, w, torch.float32, out=out, config=cfg, bias=b)
                    assert_gemm_close(out, ref, fmt, torch.float32, what=f"m={m} wo={wo} split={split} dq={dq}")
        if m == 16:  # the linear layer path (quantizes x itself) plans it too, and replays in a graph
            plan = bs.explain("linear", x, w, bias)
            assert plan.kernel == "hopper_stream", plan
            y = bs.linear(x, w, bias)
            static = torch.empty_like(y)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                bs.linear(x, w, bias, out=static)
            static.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(static, y)


@pytest.mark.parametrize("fmt", FMTS)
def test_w_x_a_decoded_in_the_gather(fmt, planned_for_every_format):
    """Quantized activations decoded in the kernel's gather (no pre-pass): K tails of 32 / 64 / 96
    past a step, rows that fill and do not fill the padded count, splits that do not divide the
    steps; an activation block scale of NaN (E8M0 255 / e4m3 NaN) makes that output row NaN and
    leaves the others right; grouped contiguous and masked with quantized rows."""
    for n, k in ((77, 4096), (200, 2080), (130, 352)):
        for m in (3, 33, 64):
            x, w = _operands(fmt, m, n, k, seed=m + n + 7)
            xq = quantize(x, fmt)
            ref = ref_gemm_mod.gemm(xq, w)
            for split in (1, 3):
                out = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")
                bs.gemm(xq, w, torch.float32, out=out, config=_cfg(m, split))
                assert_gemm_close(out, ref, fmt, torch.float32, what=f"n={n} k={k} m={m} split={split}")
    m, n, k = 8, 70, 512
    x, w = _operands(fmt, m, n, k, seed=21)
    xq = quantize(x, fmt)
    sc = xq.scale.clone()
    if fmt == "nvfp4":
        sc.view(torch.uint8)[1, 3] = 0x7F  # e4m3 NaN
    else:
        sc[1, 3] = 255  # E8M0 NaN
    xbad = ScaledTensor(xq.data, sc, xq.format, xq.shape, xq.block, xq.rounding, global_scale=xq.global_scale)
    out = bs.gemm(xbad, w, torch.float32, config=_cfg(m))
    assert out[1].isnan().all() and not out[torch.arange(m) != 1].isnan().any()
    ref = ref_gemm_mod.gemm(xq, w)
    keep = torch.arange(m, device="cuda") != 1
    assert_gemm_close(out[keep], ref[keep], fmt, torch.float32, what="rows without the NaN scale")
    # grouped: 6 experts, rows 0 / 1 / 3 / 0 / 5 / 2, contiguous and masked
    e = 6
    g = torch.Generator().manual_seed(22)
    wg = quantize((torch.randn(e, n, k, generator=g) * 0.05).cuda(), fmt)
    wd = wg.dequantize(torch.float32).double()
    counts = torch.tensor([0, 1, 3, 0, 5, 2], dtype=torch.int32)
    offsets = torch.zeros(e + 1, dtype=torch.int32)
    offsets[1:] = counts.cumsum(0)
    xr = randn_like_activations(int(counts.sum()), k, dtype=torch.bfloat16, device="cuda", seed=23)
    xrq = quantize(xr, fmt)
    xrd = xrq.dequantize(torch.float32).double()
    plan = bs.explain("grouped_gemm", xrq, wg, offsets=offsets.cuda(), out_dtype=torch.float32)
    assert plan.kernel == "hopper_stream", plan
    y = bs.grouped_gemm(xrq, wg, offsets=offsets.cuda(), out_dtype=torch.float32)
    refg = torch.cat([xrd[offsets[i]:offsets[i + 1]] @ wd[i].T for i in range(e)])
    assert_gemm_close(y, refg, fmt, torch.float32, what="grouped contiguous W x A")
    assert not plan.config.dequant_a  # ~2 rows per expert: the gather
    # ~9 rows per expert (padded to 32 > STREAM_GATHER_MAX_MP): the activations dequantized first
    c2 = torch.tensor([0, 9, 20, 0, 13, 12], dtype=torch.int32)
    o2 = torch.zeros(e + 1, dtype=torch.int32)
    o2[1:] = c2.cumsum(0)
    x2q = quantize(randn_like_activations(int(c2.sum()), k, dtype=torch.bfloat16, device="cuda", seed=24), fmt)
    x2d = x2q.dequantize(torch.float32).double()
    plan = bs.explain("grouped_gemm", x2q, wg, offsets=o2.cuda(), out_dtype=torch.float32)
    assert plan.kernel == "hopper_stream" and plan.config.dequant_a, plan
    y = bs.grouped_gemm(x2q, wg, offsets=o2.cuda(), out_dtype=torch.float32)
    ref2 = torch.cat([x2d[o2[i]:o2[i + 1]] @ wd[i].T for i in range(e)])
    assert_gemm_close(y, ref2, fmt, torch.float32, what="grouped contiguous W x A, dequantized first")
    max_m = 16
    xm = torch.zeros(e, max_m, k, dtype=torch.bfloat16, device="cuda")
    for i in range(e):
        xm[i, :counts[i]] = xr[offsets[i]:offsets[i + 1]]
    xmq = quantize(xm, fmt, global_scale=xrq.global_scale) if fmt == "nvfp4" else quantize(xm, fmt)
    xmd = xmq.dequantize(torch.float32).double()
    # masked, the gather (~2 expected rows) and the pass first (~12 expected rows: 32 padded)
    for expected_m, dq in ((2, False), (12, True)):
        plan = bs.explain("grouped_gemm", xmq, wg, masked_m=counts.cuda(), out_dtype=torch.float32,
                          expected_m=expected_m)
        assert plan.kernel == "hopper_stream" and plan.config.dequant_a == dq, plan
        out = torch.full((e, max_m, n), float("nan"), dtype=torch.float32, device="cuda")
        bs.grouped_gemm(xmq, wg, masked_m=counts.cuda(), out=out, out_dtype=torch.float32, expected_m=expected_m)
        for i in range(e):
            c = int(counts[i])
            if c:
                assert_gemm_close(out[i, :c], xmd[i, :c] @ wd[i].T, fmt, torch.float32,
                                  what=f"masked W x A e={i} dequant_a={dq}")


def test_mxfp8_extreme_scales_nan_codes_and_subnormals():
    """mxfp8 weights: every e4m3 code (subnormals included) at E8M0 scales near the bottom (codes
    10..13: products down to 2**-126, normal in bf16) and the top (251..254 with |elements| < 2)
    against float64; an e4m3 NaN code makes its output column NaN and leaves the others right."""
    m, n, k = 8, 70, 512
    x, w = _operands("mxfp8", m, n, k)
    gen = torch.Generator().manual_seed(6)
    codes = torch.randint(0, 256, w.data.shape, generator=gen, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x01  # no NaN codes here
    for lo, xs, mask in ((10, 2.0 ** 100, 0xFF), (251, 2.0 ** -110, 0xBF)):
        sc = torch.randint(lo, lo + 4, w.scale.shape, generator=gen).to(torch.uint8).cuda()
        data = (codes & mask).cuda().view(w.data.dtype)
        w2 = ScaledTensor(data, sc, w.format, w.shape, w.block, w.rounding)
        x2 = (x.float() * xs).to(torch.bfloat16)
        ref = ref_gemm_mod.gemm(x2, w2)
        assert torch.isfinite(ref).all() and ref.abs().max() > 0
        out = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")
        bs.gemm(x2, w2, torch.float32, out=out, config=_cfg(m, 2))
        assert_gemm_close(out, ref, "mxfp8", torch.float32, what=f"E8M0 {lo}..{lo + 3}")
    raw = w.data.view(torch.uint8).clone()
    raw[5, 100] = 0xFF  # -NaN
    raw[9, 3] = 0x7F  # +NaN
    w3 = ScaledTensor(raw.view(w.data.dtype), w.scale, w.format, w.shape, w.block, w.rounding)
    out = bs.gemm(x, w3, torch.float32, config=_cfg(m))
    bad = torch.zeros(n, dtype=torch.bool)
    bad[[5, 9]] = True
    assert out[:, bad.cuda()].isnan().all() and not out[:, ~bad.cuda()].isnan().any()
    good = ref_gemm_mod.gemm(x, w)[:, ~bad.cuda()]
    assert_gemm_close(out[:, ~bad.cuda()], good, "mxfp8", torch.float32, what="columns without NaN codes")


def test_forced_config_refused_where_it_cannot_run():
    x, w = _operands("mxfp4", 8, 64, 256)
    with pytest.raises(ValueError, match="stream"):
        bs.gemm(x.half(), w, config=_cfg(8))  # fp16 activations
    x65, _ = _operands("mxfp4", 65, 64, 256)
    with pytest.raises(ValueError, match="stream"):
        bs.gemm(x65, w, config=_cfg(64))  # M > 64
    x8, w8 = _operands("fp8_block", 8, 64, 256)
    with pytest.raises(ValueError, match="stream"):
        bs.gemm(x8, w8, config=_cfg(8))


def _grouped_ref(x_rows, wd, e):
    return x_rows.double() @ wd[e].double().T


@pytest.mark.parametrize("fmt", FMTS)
def test_grouped_decode_contiguous_and_masked(fmt, planned_for_every_format):
    """MoE decode sizes: 16 experts, most empty, a few with 1-3 rows and one with 40 (past the
    padded rows: its rows run in blocks), contiguous (offsets) and masked (counts); planned with the
    expected rows per expert, explain says the streaming kernel runs; fp32 outputs as the experts
    layer asks for them; per-expert nvfp4 global scales."""
    e, n, k = 16, 200, 2880
    g = torch.Generator().manual_seed(3)
    w = quantize((torch.randn(e, n, k, generator=g) * 0.05).cuda(), fmt)
    wd = w.dequantize(torch.float32).double()
    gs = None
    if fmt == "nvfp4":
        gs = w.global_scale.float() * torch.tensor([1.0, 2.0, 0.5, 4.0] * 4, device="cuda")
        wd = wd * (w.global_scale.double() / gs.double())[:, None, None]
    counts = torch.tensor([0, 1, 0, 3, 0, 0, 40, 0, 2, 0, 0, 0, 1, 0, 0, 5], dtype=torch.int32)
    offsets = torch.zeros(e + 1, dtype=torch.int32)
    offsets[1:] = counts.cumsum(0)
    x = randn_like_activations(int(counts.sum()), k, dtype=torch.bfloat16, device="cuda", seed=4)
    kw = dict(out_dtype=torch.float32, b_global_scale=gs)  # contiguous: ~3 rows per expert from the offsets
    plan = bs.explain("grouped_gemm", x, w, offsets=offsets.cuda(), **kw)
    assert plan.kernel == "hopper_stream", plan
    y = bs.grouped_gemm(x, w, offsets=offsets.cuda(), **kw)
    ref = torch.cat([_grouped_ref(x[offsets[i]:offsets[i + 1]], wd, i) for i in range(e)])
    assert_gemm_close(y, ref, fmt, torch.float32, what="contiguous")
    assert torch.equal(y, bs.grouped_gemm(x, w, offsets=offsets.cuda(), **kw))  # deterministic
    max_m = 48
    xm = torch.zeros(e, max_m, k, dtype=torch.bfloat16, device="cuda")
    for i in range(e):
        xm[i, :counts[i]] = x[offsets[i]:offsets[i + 1]]
    out = torch.full((e, max_m, n), float("nan"), dtype=torch.float32, device="cuda")
    plan = bs.explain("grouped_gemm", xm, w, masked_m=counts.cuda(), out=out, expected_m=4, **kw)
    assert plan.kernel == "hopper_stream", plan
    bs.grouped_gemm(xm, w, masked_m=counts.cuda(), out=out, expected_m=4, **kw)
    for i in range(e):
        c = int(counts[i])
        if c:
            assert_gemm_close(out[i, :c], _grouped_ref(xm[i, :c], wd, i), fmt, torch.float32, what=f"masked e={i}")
        assert out[i, c:].isnan().all()  # rows past the count are not written


@pytest.mark.parametrize("fmt", ("mxfp4", "nvfp4"))
def test_grouped_compacted_grid_and_k_split(fmt, planned_for_every_format, monkeypatch):
    """Contiguous decode calls launch min(E, sum_m) expert slots (the grid compacted to the
    experts with rows, found on the device), times a K split (partials of every row block at their
    rows, the last split to arrive sums them in split order): splits 1..4 (the planner's split rule
    patched) on 32 experts with most empty, one past the padded rows and the last expert holding
    rows, bf16 and quantized activations, against float64 and bitwise repeatable; the full grid
    (GROUPED_COMPACT off) gives the same bits; T = 1 on 128 experts plans a split by itself and
    explain says so; masked calls never split."""
    from blockscaled.ops import _stream
    from blockscaled.ops import grouped as ops_grouped
    from blockscaled.plan import stream as plan_stream

    e, n, k = 32, 130, 2080
    g = torch.Generator().manual_seed(9)
    w = quantize((torch.randn(e, n, k, generator=g) * 0.05).cuda(), fmt)
    wd = w.dequantize(torch.float32).double()
    counts = torch.zeros(e, dtype=torch.int32)
    counts[[2, 7, 19, 31]] = torch.tensor([1, 20, 3, 2], dtype=torch.int32)
    offsets = torch.zeros(e + 1, dtype=torch.int32)
    offsets[1:] = counts.cumsum(0)
    offs = offsets.cuda()
    x = randn_like_activations(int(counts.sum()), k, dtype=torch.bfloat16, device="cuda", seed=5)
    real_rule = plan_stream.grouped_stream_split_why
    for a in (x, bs.quantize(x, fmt)):
        xa = x if a is x else bs.dequantize(a)
        ref = torch.cat([_grouped_ref(xa[offsets[i]:offsets[i + 1]], wd, i) for i in range(e)])
        for split in (1, 2, 3, 4):
            monkeypatch.setattr(plan_stream, "grouped_stream_split_why", lambda p, mp, dev, s=split: (s, f"split {s}"))
            ops_grouped._PLANS.clear()
            plan = bs.explain("grouped_gemm", a, w, offsets=offs, out_dtype=torch.float32)
            assert plan.kernel == "hopper_stream" and plan.config.split_k == split, plan
            y = bs.grouped_gemm(a, w, offsets=offs, out_dtype=torch.float32)
            assert_gemm_close(y, ref, fmt, torch.float32, what=f"split {split}")
            assert torch.equal(y, bs.grouped_gemm(a, w, offsets=offs, out_dtype=torch.float32))
            _stream.GROUPED_COMPACT = False
            try:
                full = bs.grouped_gemm(a, w, offsets=offs, out_dtype=torch.float32)
            finally:
                _stream.GROUPED_COMPACT = True
            assert torch.equal(y, full), f"split {split}: compacted and full grids differ"
    monkeypatch.setattr(plan_stream, "grouped_stream_split_why", real_rule)
    ops_grouped._PLANS.clear()
    # T = 1 of gpt-oss-120b-like experts: 4 of 128 experts hold one row each; the plan splits K
    e2, n2, k2 = 128, 256, 2880
    w2 = quantize((torch.randn(e2, n2, k2, generator=g) * 0.05).cuda(), fmt)
    c2 = torch.zeros(e2, dtype=torch.int32)
    c2[[3, 40, 77, 127]] = 1
    o2 = torch.zeros(e2 + 1, dtype=torch.int32)
    o2[1:] = c2.cumsum(0)
    x2 = randn_like_activations(4, k2, dtype=torch.bfloat16, device="cuda", seed=6)
    plan = bs.explain("grouped_gemm", x2, w2, offsets=o2.cuda(), out_dtype=torch.float32)
    assert plan.kernel == "hopper_stream" and plan.config.split_k > 1 and "K split" in str(plan), str(plan)
    y2 = bs.grouped_gemm(x2, w2, offsets=o2.cuda(), out_dtype=torch.float32)
    wd2 = w2.dequantize(torch.float32).double()
    ref2 = torch.cat([_grouped_ref(x2[o2[i]:o2[i + 1]], wd2, i) for i in range(e2)])
    assert_gemm_close(y2, ref2, fmt, torch.float32, what="T = 1, planned split")
    xm = torch.zeros(e2, 8, k2, dtype=torch.bfloat16, device="cuda")
    plan = bs.explain("grouped_gemm", xm, w2, masked_m=c2.cuda(), expected_m=1, out_dtype=torch.float32)
    assert plan.kernel == "hopper_stream" and plan.config.split_k == 1, plan
