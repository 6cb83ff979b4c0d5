"""Fused, deterministic split-K of the portable GEMM kernel (kernels/triton/gemm.py).

One launch: every (tile, split) program writes an fp32 partial, bumps the tile's counter
(acq_rel atomic), and the last one sums the partials in split order, runs the epilogue and
resets the counter. CPU: the Triton interpreter runs the programs one after another, so the
"last program reduces" path runs for every tile; GPU tests (CUDA graphs, concurrency, huge
splits) are marked ``gpu``."""

from __future__ import annotations

import math

import pytest
import torch

import blockscaled.ops._splitk as splitk_mod
from blockscaled.config import GemmConfig, HopperConfig
from blockscaled.formats import get_format
from blockscaled.plan import H100_SXM, Problem, plan_gemm
from blockscaled.ops.gemm import _launch_gemm_kernel, _split_plan, gemm
from blockscaled.reference import gemm as ref_gemm_mod
from blockscaled.reference.quantize import quantize
from blockscaled.testing.inputs import randn_like_activations
from blockscaled.testing.tolerances import assert_gemm_close, assert_no_nan_survivors


def _weights(n, k, fmt, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.05).to(device)
    return quantize(w, fmt, block=(128, 128) if fmt == "fp8_block" else None)


def _acts(m, k, fmt, device, seed=0):
    x = randn_like_activations(m, k, dtype=torch.bfloat16, device=device, seed=seed)
    return x, quantize(x, fmt)


def _cfg(fmt, split, a_dense=False, block_m=16, block_n=32):
    """Small tiles for the interpreter. fp8_block: block_k 128 (promote); nvfp4 x nvfp4:
    dequantize path; weight-only bf16: dequantize path; mxfp8: promote with 32-wide chunks."""
    if fmt == "fp8_block":
        bk, promote = 128, True
    elif fmt == "nvfp4" or a_dense:
        bk, promote = 32, False
    else:
        bk, promote = 32, True
    return GemmConfig(block_m=block_m, block_n=block_n, block_k=bk, num_warps=4, num_stages=2, split_k=split,
                      promote=promote)


def _all_counters():
    return [*splitk_mod._COUNTERS.values(), *splitk_mod._GRAPH_COUNTERS.values()]


def _assert_counters_zero():
    for buf in _all_counters():
        assert int((buf != 0).sum()) == 0, "split-K counters not reset to zero"


# (fmt, weight-only) cases: fp8_block, mxfp8, nvfp4, weight-only bf16
CASES = [("fp8_block", False), ("mxfp8", False), ("nvfp4", False), ("fp8_block", True), ("nvfp4", True)]


@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8", "mxfp4", "nvfp4"])
def test_swap_ab_matches_reference(fmt, device):
    """swap_ab tiles (weight rows on the MMA's M side), unsplit and fused split-K; fp8_block's
    128x128 weight scales with 64-row tiles crossing a 128-row block boundary (N = 150)."""
    m, n, k = 5, 150, 300
    _, a = _acts(m, k, fmt, device)
    b = _weights(n, k, fmt, device)
    bias = torch.randn(n, device=device)
    ref = ref_gemm_mod.gemm(a, b, bias=bias)
    base = _cfg(fmt, 1, block_n=64)
    if fmt == "mxfp4":
        base = base.replace(block_k=64, promote=False)
    for split in (1, 3):
        cfg = base.replace(split_k=split, swap_ab=True)
        out = torch.full((m, n), float("nan"), dtype=torch.float32, device=device)
        gemm(a, b, torch.float32, out=out, config=cfg, bias=bias)
        assert_no_nan_survivors(out)
        assert_gemm_close(out, ref, fmt, torch.float32, what=str(cfg))
    _assert_counters_zero()


def test_swap_ab_errors(device):
    x, a = _acts(4, 256, "fp8_block", device)
    b = _weights(256, 256, "fp8_block", device)
    cfg = GemmConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=2, promote=True, swap_ab=True)
    with pytest.raises(ValueError, match=r"config.swap_ab: a dense \(weight-only\) A swaps only with promote=False"):
        gemm(x, b, config=cfg)
    with pytest.raises(ValueError, match=r"config.block_n: swap_ab with 128-row weight scale blocks"):
        gemm(a, b, config=cfg.replace(block_n=256))


@pytest.mark.parametrize("fmt,wo", CASES, ids=lambda v: str(v))
def test_fused_splitk_matches_reference(fmt, wo, device):
    m, n, k = 19, 45, 300  # 3 M tiles x 2 N tiles; fp8: 3 chunks of 128 (tail 44); MX: 10 chunks of 32
    x, a = _acts(m, k, fmt, device)
    b = _weights(n, k, fmt, device)
    lhs = x if wo else a
    bias = torch.randn(n, device=device).to(torch.bfloat16)
    ref = ref_gemm_mod.gemm(lhs, b, bias=bias)
    kiters = math.ceil(k / _cfg(fmt, 1, wo).block_k)
    for split in sorted({2, 3, kiters}):
        cfg = _cfg(fmt, split, wo)
        assert _split_plan(k, cfg.block_k, split)[0] > 1
        for out_dtype in (torch.float32, torch.bfloat16) if split == 3 else (torch.float32,):
            out = torch.full((m, n), float("nan"), dtype=out_dtype, device=device)
            gemm(lhs, b, out_dtype, out=out, config=cfg, bias=bias)
            assert_no_nan_survivors(out)
            assert_gemm_close(out, ref, fmt, out_dtype, what=f"split {split} {cfg}")
            _assert_counters_zero()


def test_split_plan_never_empty():
    for k in (0, 1, 127, 128, 129, 300, 640, 7168):
        for bk in (32, 128):
            for want in (1, 2, 3, 4, 7, 16, 1000):
                split, per = _split_plan(k, bk, want)
                assert per % bk == 0 and split >= 1
                assert (split - 1) * per < max(k, 1), (k, bk, want, split, per)  # last split not empty
                assert split * per >= k
                assert split <= max(1, want)


@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8", "nvfp4"])
def test_empty_splits_write_zeros_and_count(fmt, device):
    """A plan that _split_plan never makes (splits past K): the empty splits still store a zero
    partial and count, so the tile is reduced exactly once and the counters end at zero."""
    m, n, k = 5, 40, 64 if fmt != "fp8_block" else 128
    _, a = _acts(m, k, fmt, device)
    b = _weights(n, k, fmt, device)
    f = get_format(fmt)
    cfg = _cfg(fmt, 1)
    bias = torch.randn(n, device=device)
    ref = ref_gemm_mod.gemm(a, b, bias=bias)
    for split, per in ((4, cfg.block_k), (3, k), (5, 2 * cfg.block_k)):
        out = torch.full((m, n), float("nan"), dtype=torch.float32, device=device)
        _launch_gemm_kernel(a.data, a.scale, a.global_scale, b.data, b.scale, b.global_scale, b.block[0], out, bias,
                            f, m, n, k, cfg, cfg.promote, device == "cpu", split, per)
        assert_no_nan_survivors(out)
        assert_gemm_close(out, ref, fmt, torch.float32, what=f"split {split} x {per}")
        _assert_counters_zero()


def test_k_zero_with_split(device):
    """K = 0: every split is empty; the output is the bias (zeros without), counters reset."""
    f = get_format("mxfp8")
    m, n = 3, 20
    a_data = torch.empty(m, 0, dtype=f.data_dtype, device=device)
    a_s = torch.empty(m, 0, dtype=f.scale_dtype, device=device)
    b_data = torch.empty(n, 0, dtype=f.data_dtype, device=device)
    b_s = torch.empty(n, 0, dtype=f.scale_dtype, device=device)
    bias = torch.randn(n, device=device)
    cfg = _cfg("mxfp8", 1)
    out = torch.full((m, n), float("nan"), device=device)
    _launch_gemm_kernel(a_data, a_s, None, b_data, b_s, None, 1, out, bias, f, m, n, 0, cfg, True,
                        device == "cpu", 3, cfg.block_k)
    assert torch.equal(out, bias.expand(m, n))
    _assert_counters_zero()
    # the public path: K = 0 runs one split (nothing to split)
    assert _split_plan(0, 32, 8) == (1, 32)


@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8", "nvfp4"])
def test_bitwise_repeat_and_close_to_unsplit(fmt, device):
    m, n, k = 17, 40, 384
    _, a = _acts(m, k, fmt, device)
    b = _weights(n, k, fmt, device)
    ref = ref_gemm_mod.gemm(a, b)
    y1 = gemm(a, b, torch.float32, config=_cfg(fmt, 1))
    for split in (2, 3):
        ys = [gemm(a, b, torch.float32, config=_cfg(fmt, split)) for _ in range(2)]
        assert torch.equal(ys[0].view(torch.int32), ys[1].view(torch.int32))
        # same products, fp32 sums in another order: a few fp32 ulps of the partial sums
        assert (ys[0] - y1).abs().max().item() <= 1e-5 * ref.abs().max().item(), split
    _assert_counters_zero()


def test_counter_buffer_grows_and_stays_zero(device, monkeypatch):
    """More tiles than the cached buffer holds: a larger zeroed buffer replaces it (the graph
    buffer too, the old one kept alive for graphs captured earlier)."""
    monkeypatch.setattr(splitk_mod, "_MIN_COUNTERS", 2)
    monkeypatch.setattr(splitk_mod, "_COUNTERS", {})
    monkeypatch.setattr(splitk_mod, "_GRAPH_COUNTERS", {})
    monkeypatch.setattr(splitk_mod, "_RETIRED_GRAPH_COUNTERS", [])
    _, a = _acts(33, 128, "mxfp8", device)
    b = _weights(70, 128, "mxfp8", device)
    ref = ref_gemm_mod.gemm(a, b)
    sizes = []
    for bm, bn in ((32, 64), (16, 32)):  # 2x2 = 4 tiles, then 3x3 = 9 tiles
        cfg = _cfg("mxfp8", 2, block_m=bm, block_n=bn)
        y = gemm(a, b, torch.float32, config=cfg)
        assert_gemm_close(y, ref, "mxfp8", torch.float32)
        (buf,) = splitk_mod._COUNTERS.values()
        sizes.append(buf.numel())
        _assert_counters_zero()
    assert sizes == [4, 16]
    if device == "cuda":
        assert len(splitk_mod._RETIRED_GRAPH_COUNTERS) == 1


def test_small_m_plans_run_as_planned():
    """H100 plans (DeviceInfo, on any machine) of the decode / small-prefill shapes: the planned K
    split is what the launchers run (no split is lowered), splits keep several K chunks each,
    portable tiles of 64/128 columns with 4-8 warps whose shared memory fits, swap-AB at M <= 32 only
    for FP8 dots with a quantized A (never nvfp4: it cannot promote) and for the MX/NV bf16 tiles
    (promote=False, weight-only included: the bf16-dequantized weight is the wgmma's register operand)."""
    from blockscaled.plan import mx_gemv
    from blockscaled.plan import portable as pp
    from blockscaled.plan.dense import MIN_KB_PER_SPLIT
    from blockscaled.plan.splits import split_plan_kb

    for n, k in [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]:
        kb = math.ceil(k / 128)
        for m in (1, 16, 64, 128):
            for fmt in ("fp8_block", "mxfp8", "nvfp4"):
                for a in ("quantized", "bfloat16"):
                    c = plan_gemm(Problem("gemm", fmt, m, n, k, a=a), H100_SXM).config
                    if isinstance(c, HopperConfig):
                        assert fmt == "fp8_block" and a == "quantized", c
                        split, per = split_plan_kb(kb, c.split_k)
                        assert split == c.split_k and (split == 1 or per >= MIN_KB_PER_SPLIT), (m, n, k, c)
                        continue
                    if c.strategy == "stream":  # plan/stream.py: MX / NV weights, M <= 64, sm_90
                        # M = 1 goes to the GEMV where its triton release runs it (MX_GEMV_ROWS_BY_RELEASE)
                        gemv_one = mx_gemv.use_mx_gemv(fmt, 1, k)
                        assert fmt in ("nvfp4", "mxfp8") and (1 < m or not gemv_one) and m <= 64, \
                            (fmt, a, m, c)
                        assert math.ceil(kb / c.split_k) >= 3 or c.split_k == 1, c
                        continue
                    if c.strategy == "direct":  # plan/direct.py: nvfp4 weight-only decode rows, sm_90
                        # M = 1 only where the GEMV does not take it (DIRECT_MIN_M_WITHOUT_GEMV)
                        gemv_one = mx_gemv.use_mx_gemv(fmt, 1, k)
                        assert fmt == "nvfp4" and a == "bfloat16" and (1 < m or not gemv_one) and m <= 8, \
                            (fmt, a, m, c)
                        continue
                    if c.strategy == "tiled":  # plan/tiled.py: MX / NV weights from 33 rows, sm_90
                        assert fmt in ("nvfp4", "mxfp8") and m >= 33, (fmt, a, m, c)
                        assert math.ceil(math.ceil(k / 64) / c.split_k) >= 4 or c.split_k == 1, c
                        continue
                    if c.strategy in ("gemv", "dequant_matmul"):
                        # the decode GEMVs: fp8_block x fp8_block at M = 1, MX / NV weights at M <= 8
                        assert (c.strategy == "dequant_matmul" or (fmt, a, m) == ("fp8_block", "quantized", 1)
                                or (fmt != "fp8_block" and m <= 8)), c
                        continue
                    assert c.strategy == "triton" and c.block_n in (64, 128) and c.num_warps in (4, 8), c
                    split, per = _split_plan(k, c.block_k, c.split_k)
                    assert split == c.split_k, c
                    if split > 1:
                        assert per // c.block_k >= min(pp._SMALL_M_MIN_CHUNKS, math.ceil(k / c.block_k)), c
                    promote = c.promote if c.promote is not None else pp.default_promote(
                        fmt, m, None if a == "quantized" else torch.bfloat16)
                    assert pp._ctas_per_sm(c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages, fmt,
                                           0 if a == "quantized" else 2, promote, H100_SXM) >= 1, c
                    if c.swap_ab and fmt == "fp8_block":
                        assert a == "quantized" and m <= 32, (fmt, a, m, c)
                    elif c.swap_ab:  # MX FP8 dots (quantized A), or the MX/NV bf16 tiles (MX_BF16_TILES)
                        assert m <= 32 and (c.promote is False or (a == "quantized" and fmt != "nvfp4")), (
                            fmt, a, m, c)


# --------------------------------------------------------------------------- GPU
def _close(out, a, b, fmt, what=""):
    assert_no_nan_survivors(out)
    assert_gemm_close(out, ref_gemm_mod.gemm(a, b), fmt, out.dtype, what=what)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8", "nvfp4"])
def test_cuda_graph_replay_with_new_inputs(fmt):
    """Capture the split-K GEMM once, replay 3 times with other inputs copied into the static
    tensors: every replay correct (the counters are reset inside the graph), counters zero."""
    m, n, k = 16, 2112, 7168
    b = _weights(n, k, fmt, "cuda")
    _, a = _acts(m, k, fmt, "cuda")
    cfg = GemmConfig(block_m=64, block_n=64, block_k=128 if fmt == "fp8_block" else 32, num_warps=4, num_stages=4,
                     split_k=8, promote=fmt != "nvfp4")
    if fmt == "nvfp4":
        cfg = cfg.replace(block_k=128)
    cfg_swap = cfg.replace(block_m=16, swap_ab=True)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    out_swap = torch.empty_like(out)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gemm(a, b, out=out, config=cfg)  # warm-up: compiles, creates the counter buffers
        gemm(a, b, out=out_swap, config=cfg_swap)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gemm(a, b, out=out, config=cfg)
        gemm(a, b, out=out_swap, config=cfg_swap)
    for seed in (5, 6, 7):
        _, a2 = _acts(m, k, fmt, "cuda", seed=seed)
        b2 = _weights(n, k, fmt, "cuda", seed=seed)
        for dst, src in ((a, a2), (b, b2)):
            dst.data.copy_(src.data)
            dst.scale.copy_(src.scale)
            if dst.global_scale is not None:
                dst.global_scale.copy_(src.global_scale)
        out.fill_(float("nan"))
        out_swap.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        _close(out, a, b, fmt, what=f"replay seed {seed}")
        _close(out_swap, a, b, fmt, what=f"swap-AB replay seed {seed}")
        _assert_counters_zero()


@pytest.mark.gpu
def test_cuda_graph_without_warm_counter_buffer():
    """A capture that finds no graph counter buffer zeroes a private one inside the graph."""
    m, n, k = 4, 1024, 4096
    b = _weights(n, k, "fp8_block", "cuda")
    _, a = _acts(m, k, "fp8_block", "cuda")
    cfg = GemmConfig(block_m=64, block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=4, promote=True)
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    gemm(a, b, out=out, config=cfg)  # compile
    torch.cuda.synchronize()
    saved = dict(splitk_mod._GRAPH_COUNTERS)
    splitk_mod._GRAPH_COUNTERS.clear()
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            gemm(a, b, out=out, config=cfg)
        assert not splitk_mod._GRAPH_COUNTERS
        for _ in range(3):
            out.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            _close(out, a, b, "fp8_block")
    finally:
        splitk_mod._GRAPH_COUNTERS.update(saved)


@pytest.mark.gpu
def test_huge_split_and_many_runs_bitwise():
    """64 splits of one chunk each (and a request of 1000, clamped to the chunk count): correct,
    bitwise identical over 20 runs (arrival order varies on the GPU), counters zero."""
    m, n, k = 64, 512, 8192
    b = _weights(n, k, "fp8_block", "cuda")
    _, a = _acts(m, k, "fp8_block", "cuda")
    for want in (64, 1000):
        cfg = GemmConfig(block_m=64, block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=want, promote=True)
        assert _split_plan(k, 128, want)[0] == 64
        ys = [gemm(a, b, torch.float32, config=cfg) for _ in range(20)]
        _close(ys[0], a, b, "fp8_block", what=f"split {want}")
        for y in ys[1:]:
            assert torch.equal(y.view(torch.int32), ys[0].view(torch.int32))
    _assert_counters_zero()


@pytest.mark.gpu
def test_two_streams_concurrently():
    """Eager split-K GEMMs on two streams at once use different counter buffers."""
    m, n, k = 16, 2112, 7168
    b = _weights(n, k, "fp8_block", "cuda")
    _, a = _acts(m, k, "fp8_block", "cuda")
    cfg = GemmConfig(block_m=64, block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=8, promote=True)
    want = gemm(a, b, config=cfg)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs = [[torch.empty_like(want) for _ in range(10)] for _ in streams]
    torch.cuda.synchronize()
    for i in range(10):
        for s, o in zip(streams, outs):
            with torch.cuda.stream(s):
                gemm(a, b, out=o[i], config=cfg)
    torch.cuda.synchronize()
    for o in outs:
        for y in o:
            assert torch.equal(y, want)
    _assert_counters_zero()


@pytest.mark.gpu
@pytest.mark.parametrize("m", (1, 16, 64, 128))
@pytest.mark.parametrize("nk", [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168),
                                (7168, 2048)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_small_m_plan_gpu(nk, m):
    """The planner's small-M plan on the DeepSeek-V3 shapes: correct, bitwise repeatable."""
    n, k = nk
    b = _weights(n, k, "fp8_block", "cuda")
    _, a = _acts(m, k, "fp8_block", "cuda")
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm(a, b, out=out)
    _close(out, a, b, "fp8_block")
    assert torch.equal(gemm(a, b), out)
    _assert_counters_zero()
