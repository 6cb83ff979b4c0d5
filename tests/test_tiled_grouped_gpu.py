"""The sm_90a tiled MX / NV kernels' grouped modes (kernels/hopper/tiled.py MODE 1 / 2, and
tiled_rs.py's for fp4 with 256-token tiles) on the GPU,
through the public grouped op, forced (``config=``, small shapes where the planner would pick
dequantize + cuBLAS) and planned (many experts, MoE prefill sizes): contiguous offsets with empty, one-row and multi-tile experts, masked counts (0 and
max_m included) with NaN-poisoned outputs whose rows past the counts must stay untouched, N and K
that are not multiples of the tiles, bf16 and quantized activations, per-expert nvfp4 global
scales, a misaligned activation view, CUDA-graph replays with new routing, all against the float64
reference. Needs an sm_90 GPU (skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch

import blockscaled as bs
from blockscaled.config import GemmConfig
from blockscaled.testing.inputs import randn_like_activations
from blockscaled.testing.tolerances import assert_gemm_close

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                reason="the tiled kernel is an sm_90 kernel")

FMTS = ("mxfp4", "nvfp4", "mxfp8")
CFG = GemmConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=5, strategy="tiled")
#: the register-operand kernel (kernels/hopper/tiled_rs.py): 256-token tiles
RS = GemmConfig(block_m=256, block_n=128, block_k=64, num_warps=4, num_stages=4, strategy="tiled")
#: its 64-token tiles (plan/tiled.py R4) and the same with four consumer warpgroups (R5: 256 weight rows,
#: expert boundaries inside a program's rows)
RS64 = GemmConfig(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=6, strategy="tiled")
RS64W = GemmConfig(block_m=64, block_n=256, block_k=64, num_warps=4, num_stages=6, strategy="tiled")
CFGS = {"r1": CFG, "rs": RS, "rs64": RS64, "rs64w": RS64W}
FMT_CFGS = [(f, c) for f in FMTS for c in CFGS]


def _experts(e, n, k, fmt, seed):
    g = torch.Generator().manual_seed(seed)
    w = bs.quantize((torch.randn(e, n, k, generator=g) * 0.05).cuda(), fmt)
    wd = w.dequantize(torch.float32).double()
    gs = None
    if fmt == "nvfp4":  # per-expert global scales, as a checkpoint's weight_scale_2
        gs = w.global_scale.float() * torch.tensor([1.0, 2.0, 0.5, 4.0, 0.25, 1.5] * 8, device="cuda")[:e]
        wd = wd * (w.global_scale.double() / gs.double())[:, None, None]
    return w, wd, gs


def _offsets(counts):
    o = torch.zeros(len(counts) + 1, dtype=torch.int32)
    o[1:] = torch.tensor(counts, dtype=torch.int32).cumsum(0)
    return o


@pytest.mark.parametrize("fmt,which", FMT_CFGS)
def test_contiguous_weight_only_and_w_x_a(fmt, which):
    CFG = CFGS[which]
    e, n, k = 6, 200, 2880
    counts = [0, 130, 1, 300, 0, 257]
    w, wd, gs = _experts(e, n, k, fmt, seed=1)
    off = _offsets(counts)
    x = randn_like_activations(int(off[-1]), k, dtype=torch.bfloat16, device="cuda", seed=2)
    for out_dtype in (torch.float32, torch.bfloat16):
        kw = dict(out_dtype=out_dtype, b_global_scale=gs, config=CFG)
        plan = bs.explain("grouped_gemm", x, w, offsets=off.cuda(), **kw)
        assert plan.kernel == "hopper_tiled", plan
        y = bs.grouped_gemm(x, w, offsets=off.cuda(), **kw)
        ref = torch.cat([x[off[i]:off[i + 1]].double() @ wd[i].T for i in range(e)])
        assert_gemm_close(y, ref, fmt, out_dtype, what=f"contiguous {out_dtype}")
        assert torch.equal(y, bs.grouped_gemm(x, w, offsets=off.cuda(), **kw))  # deterministic
    # W x A: activations in the weight's format, dequantized exactly to bf16 first
    xq = bs.quantize(x, fmt)
    kw = dict(out_dtype=torch.float32, b_global_scale=gs, config=CFG)
    plan = bs.explain("grouped_gemm", xq, w, offsets=off.cuda(), **kw)
    assert plan.kernel == "hopper_tiled" and plan.config.dequant_a, plan
    y = bs.grouped_gemm(xq, w, offsets=off.cuda(), **kw)
    xd = xq.dequantize(torch.float32).double()
    ref = torch.cat([xd[off[i]:off[i + 1]] @ wd[i].T for i in range(e)])
    assert_gemm_close(y, ref, fmt, torch.float32, what="contiguous W x A")


@pytest.mark.parametrize("fmt,which", FMT_CFGS)
def test_masked_leaves_rows_past_the_counts(fmt, which):
    CFG = CFGS[which]
    e, max_m, n, k = 5, 300, 392, 1056
    counts = torch.tensor([0, 300, 17, 129, 256], dtype=torch.int32)
    w, wd, gs = _experts(e, n, k, fmt, seed=3)
    xm = randn_like_activations(e * max_m, k, dtype=torch.bfloat16, device="cuda", seed=4).view(e, max_m, k)
    out = torch.full((e, max_m, n), float("nan"), dtype=torch.float32, device="cuda")
    kw = dict(out_dtype=torch.float32, b_global_scale=gs, expected_m=200, config=CFG)
    plan = bs.explain("grouped_gemm", xm, w, masked_m=counts.cuda(), out=out, **kw)
    assert plan.kernel == "hopper_tiled", plan
    bs.grouped_gemm(xm, w, masked_m=counts.cuda(), out=out, **kw)
    for i in range(e):
        c = int(counts[i])
        if c:
            assert_gemm_close(out[i, :c], xm[i, :c].double() @ wd[i].T, fmt, torch.float32, what=f"masked e={i}")
        assert out[i, c:].isnan().all()  # rows past the count are not written


def test_misaligned_activations_and_graph_replay():
    """A view whose base is not 16-byte aligned (copied for TMA), and a CUDA graph replayed after
    the routing changed in place (the tile numbering is computed on the device each launch)."""
    fmt, e, n, k = "mxfp4", 4, 256, 512
    w, wd, _ = _experts(e, n, k, fmt, seed=5)
    base = randn_like_activations(601, k + 8, dtype=torch.bfloat16, device="cuda", seed=6)
    x = base[1:, 3:3 + k]  # row stride k + 8 elements, base 6 bytes past an aligned address
    off = _offsets([150, 0, 300, 150]).cuda()
    plan = bs.explain("grouped_gemm", x, w, offsets=off, out_dtype=torch.float32, config=CFG)
    assert plan.kernel == "hopper_tiled", plan
    y = bs.grouped_gemm(x, w, offsets=off, out_dtype=torch.float32, config=CFG)
    o = off.cpu()
    ref = torch.cat([x[o[i]:o[i + 1]].double() @ wd[i].T for i in range(e)])
    assert_gemm_close(y, ref, fmt, torch.float32, what="misaligned view")

    xc = x.contiguous()
    out = torch.empty(600, n, dtype=torch.float32, device="cuda")
    bs.grouped_gemm(xc, w, offsets=off, out=out, out_dtype=torch.float32, config=CFG)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bs.grouped_gemm(xc, w, offsets=off, out=out, out_dtype=torch.float32, config=CFG)
    for counts in ([600, 0, 0, 0], [1, 299, 0, 300], [0, 0, 0, 600]):
        off.copy_(_offsets(counts))
        graph.replay()
        o = off.cpu()
        eager = bs.grouped_gemm(xc, w, offsets=off, out_dtype=torch.float32, config=CFG)
        assert torch.equal(out, eager), counts
        ref = torch.cat([xc[o[i]:o[i + 1]].double() @ wd[i].T for i in range(e)])
        assert_gemm_close(out, ref, fmt, torch.float32, what=f"graph {counts}")


@pytest.mark.parametrize("fmt", ("mxfp4", "nvfp4"))
def test_planned_for_many_experts(fmt):
    """48 experts of 392 x 1056 with ~100 rows each: the planner itself picks the kernel (its
    dequantize + cuBLAS alternative would write every expert's weights in bf16 first)."""
    e, n, k = 48, 392, 1056
    g = torch.Generator().manual_seed(7)
    counts = torch.randint(0, 200, (e,), generator=g).tolist()
    counts[5] = 0
    w, wd, gs = _experts(e, n, k, fmt, seed=8)
    off = _offsets(counts)
    x = randn_like_activations(int(off[-1]), k, dtype=torch.bfloat16, device="cuda", seed=9)
    kw = dict(out_dtype=torch.float32, b_global_scale=gs)
    plan = bs.explain("grouped_gemm", x, w, offsets=off.cuda(), **kw)
    assert plan.kernel == "hopper_tiled" and plan.predicted_us, plan
    y = bs.grouped_gemm(x, w, offsets=off.cuda(), **kw)
    ref = torch.cat([x[off[i]:off[i + 1]].double() @ wd[i].T for i in range(e)])
    assert_gemm_close(y, ref, fmt, torch.float32, what="planned")


def test_forced_config_refused_where_it_cannot_run():
    w, _, _ = _experts(4, 256, 528, "mxfp4", seed=10)  # K = 528: not a multiple of 32
    x = torch.randn(64, 528, dtype=torch.bfloat16, device="cuda")
    off = _offsets([16, 16, 16, 16]).cuda()
    with pytest.raises(ValueError, match="'tiled' cannot run this grouped call"):
        bs.grouped_gemm(x, w, offsets=off, config=CFG)
    w, _, _ = _experts(4, 256, 512, "mxfp4", seed=10)
    x = torch.randn(64, 512, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="split_k"):
        bs.grouped_gemm(x, w, offsets=off, config=GemmConfig(block_m=128, block_n=128, block_k=64, num_warps=8,
                                                              num_stages=5, split_k=2, strategy="tiled"))


@pytest.mark.parametrize("fmt,CFG", [("mxfp4", CFG), ("mxfp4", RS)])
def test_masked_strided_out_and_empty_calls(fmt, CFG):
    """A masked ``out=`` whose experts are not evenly strided (a slice of a larger buffer): rows past
    the counts keep their content; empty calls (no rows, forced config) return without a launch."""
    e, max_m, n, k = 3, 130, 256, 512
    counts = torch.tensor([130, 0, 7], dtype=torch.int32)
    w, wd, _ = _experts(e, n, k, fmt, seed=11)
    xm = randn_like_activations(e * max_m, k, dtype=torch.bfloat16, device="cuda", seed=12).view(e, max_m, k)
    buf = torch.full((e, max_m + 10, n), float("nan"), dtype=torch.float32, device="cuda")
    out = buf[:, :max_m]
    bs.grouped_gemm(xm, w, masked_m=counts.cuda(), out=out, out_dtype=torch.float32, config=CFG)
    for i in range(e):
        c = int(counts[i])
        if c:
            assert_gemm_close(out[i, :c], xm[i, :c].double() @ wd[i].T, fmt, torch.float32, what=f"e={i}")
        assert out[i, c:].isnan().all() and buf[:, max_m:].isnan().all()
    x0 = torch.empty(0, k, dtype=torch.bfloat16, device="cuda")
    y0 = bs.grouped_gemm(x0, w, offsets=torch.zeros(e + 1, dtype=torch.int32, device="cuda"), config=CFG)
    assert y0.shape == (0, n)
