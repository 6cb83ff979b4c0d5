"""The sm_90a tiled MX / NV kernels (kernels/hopper/tiled.py; tiled_rs.py, the register-operand
kernel, for 4-warp configs: 256-token tiles, and 16 / 32 / 64 with a K split) on the GPU: mxfp4 / nvfp4 / mxfp8
weights x bf16 or quantized activations against the float64 reference, through forced configs (odd
M and N, K tails that are not a multiple of the 64-element step, K splits that do and do not divide
the steps, ring depths, output dtypes, a bias, NaN-poisoned outputs), nvfp4 global scales of both
operands, determinism of the split-K sum, a CUDA graph, and the planner's own plan where it picks
the kernel. Needs an sm_90 GPU (skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch

import blockscaled as bs
from blockscaled.config import GemmConfig
from blockscaled.plan import observe_plans
from blockscaled.reference import gemm as ref_gemm
from blockscaled.testing.inputs import randn_like_activations
from blockscaled.testing.tolerances import assert_gemm_close

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                reason="the tiled kernel is an sm_90 kernel")

FMTS = ("mxfp4", "nvfp4", "mxfp8")


def _cfg(split=1, stages=4):
    return GemmConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=stages, split_k=split,
                      strategy="tiled")


def _weights(n, k, fmt, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
    return bs.quantize(w, fmt)


def _nan(m, n, dtype):
    return torch.full((m, n), float("nan"), dtype=dtype, device="cuda")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("m,n,k,split,stages", [(65, 129, 64, 1, 3), (130, 257, 96, 1, 4), (300, 200, 1056, 3, 4),
                                                (129, 384, 2048, 4, 6), (257, 130, 320, 2, 3)])
def test_forced_weight_only(fmt, m, n, k, split, stages):
    x = randn_like_activations(m, k, device="cuda", seed=m + k)
    w = _weights(n, k, fmt, seed=n)
    ref = ref_gemm.gemm(x, w)
    for out_dtype in (torch.bfloat16, torch.float32, torch.float16):
        out = _nan(m, n, out_dtype)
        bs.gemm(x, w, out_dtype, out=out, config=_cfg(split, stages))
        assert_gemm_close(out, ref, fmt, out_dtype, what=f"{fmt} {m}x{n}x{k} split {split} {out_dtype}")


RS = GemmConfig(block_m=256, block_n=128, block_k=64, num_warps=4, num_stages=4, split_k=1, strategy="tiled")


@pytest.mark.parametrize("fmt", FMTS)
def test_register_operand_kernel(fmt):
    """block_m 256 with 4 warps: kernels/hopper/tiled_rs.py (the decoded weights as the wgmma's
    register operand, 256 tokens x 128 weight rows): odd M / N (tails of both tiles), K tails that
    are not a multiple of the 64-element step, both rings, output dtypes, a bias, W x A with nvfp4
    global scales of both operands, and a CUDA graph replay."""
    for m, n, k, stages in ((300, 257, 1056, 4), (257, 384, 2048, 3), (513, 130, 320, 4), (77, 136, 4128, 4),
                            (1000, 640, 96, 3)):
        x = randn_like_activations(m, k, device="cuda", seed=m + k)
        w = _weights(n, k, fmt, seed=n)
        bias = torch.randn(n, device="cuda")
        ref = ref_gemm.gemm(x, w)
        refb = ref_gemm.gemm(x, w, bias=bias)
        for out_dtype in (torch.bfloat16, torch.float32, torch.float16):
            out = _nan(m, n, out_dtype)
            bs.gemm(x, w, out_dtype, out=out, config=RS.replace(num_stages=stages))
            assert_gemm_close(out, ref, fmt, out_dtype, what=f"{fmt} register operand {m}x{n}x{k} {out_dtype}")
        out = bs.gemm(x, w, config=RS, bias=bias)
        assert_gemm_close(out, refb, fmt, torch.bfloat16, what=f"{fmt} register operand bias {m}x{n}x{k}")
    a = bs.quantize(randn_like_activations(200, 544, device="cuda", seed=3), fmt)
    w = _weights(300, 544, fmt, seed=4)
    out = bs.gemm(a, w, config=RS.replace(dequant_a=True))
    assert_gemm_close(out, ref_gemm.gemm(a, w), fmt, torch.bfloat16, what=f"{fmt} register operand W x A")
    x = randn_like_activations(600, 1024, device="cuda", seed=12)
    w = _weights(384, 1024, fmt, seed=13)
    static_x = x.clone()
    out = torch.empty(600, 384, dtype=torch.bfloat16, device="cuda")
    bs.gemm(static_x, w, out=out, config=RS)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        bs.gemm(static_x, w, out=out, config=RS)
    x2 = randn_like_activations(600, 1024, device="cuda", seed=14)
    static_x.copy_(x2)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, bs.gemm(x2, w, config=RS))
    assert_gemm_close(out, ref_gemm.gemm(x2, w), fmt, torch.bfloat16, what="graph replay")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("bt", (16, 32, 64))
def test_register_operand_small_tiles_split(fmt, bt):
    """The register-operand kernel with 16 / 32 / 64-token tiles and a K split (R4 of plan/tiled.py
    runs 64): odd M (one token tile and several, rows past M), odd N (the second consumer's half
    partly and wholly past N), K tails, splits that do and do not divide the steps (the launcher
    lowers a split that would leave one empty), output dtypes, a bias, W x A with nvfp4 global
    scales, the split sum deterministic, and a CUDA graph replaying new activations."""
    cfg = GemmConfig(block_m=bt, block_n=128, block_k=64, num_warps=4, num_stages=6, split_k=1, strategy="tiled")
    for m, n, k, split in ((1, 130, 320, 2), (bt - 3, 257, 1056, 3), (2 * bt + 5, 64, 2048, 4), (40, 136, 4128, 8),
                           (bt, 640, 96, 2)):
        x = randn_like_activations(m, k, device="cuda", seed=m + k)
        w = _weights(n, k, fmt, seed=n)
        bias = torch.randn(n, device="cuda")
        ref = ref_gemm.gemm(x, w)
        for out_dtype in (torch.bfloat16, torch.float32, torch.float16):
            out = _nan(m, n, out_dtype)
            bs.gemm(x, w, out_dtype, out=out, config=cfg.replace(split_k=split))
            assert_gemm_close(out, ref, fmt, out_dtype, what=f"{fmt} {bt}-token tiles {m}x{n}x{k} split {split}")
        out = bs.gemm(x, w, config=cfg.replace(split_k=split), bias=bias)
        assert_gemm_close(out, ref_gemm.gemm(x, w, bias=bias), fmt, torch.bfloat16, what=f"{fmt} {bt} bias")
    a = bs.quantize(randn_like_activations(50, 544, device="cuda", seed=3), fmt)
    w = _weights(300, 544, fmt, seed=4)
    out = bs.gemm(a, w, config=cfg.replace(split_k=2, dequant_a=True))
    assert_gemm_close(out, ref_gemm.gemm(a, w), fmt, torch.bfloat16, what=f"{fmt} {bt}-token tiles W x A")
    x = randn_like_activations(48, 4096, device="cuda", seed=12)
    w = _weights(384, 4096, fmt, seed=13)
    c4 = cfg.replace(split_k=4)
    assert torch.equal(bs.gemm(x, w, config=c4), bs.gemm(x, w, config=c4))
    static_x = x.clone()
    out = torch.empty(48, 384, dtype=torch.bfloat16, device="cuda")
    bs.gemm(static_x, w, out=out, config=c4)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        bs.gemm(static_x, w, out=out, config=c4)
    x2 = randn_like_activations(48, 4096, device="cuda", seed=14)
    static_x.copy_(x2)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, bs.gemm(x2, w, config=c4))
    assert_gemm_close(out, ref_gemm.gemm(x2, w), fmt, torch.bfloat16, what="graph replay")


@pytest.mark.parametrize("fmt", FMTS)
def test_register_operand_four_consumers(fmt):
    """block_n 256: four consumer warpgroups of 64 weight rows (plan/tiled.py R5, 64-token tiles,
    unsplit): N below, at and past one 256-row tile (consumers wholly past N), odd M, K tails,
    output dtypes, a bias, W x A with nvfp4 global scales, and the planned call on a wide N."""
    cfg = GemmConfig(block_m=64, block_n=256, block_k=64, num_warps=4, num_stages=6, split_k=1, strategy="tiled")
    for m, n, k in ((1, 100, 320), (37, 257, 1056), (64, 512, 2048), (130, 770, 96), (48, 192, 4128)):
        x = randn_like_activations(m, k, device="cuda", seed=m + k)
        w = _weights(n, k, fmt, seed=n)
        bias = torch.randn(n, device="cuda")
        ref = ref_gemm.gemm(x, w)
        for out_dtype in (torch.bfloat16, torch.float32, torch.float16):
            out = _nan(m, n, out_dtype)
            bs.gemm(x, w, out_dtype, out=out, config=cfg)
            assert_gemm_close(out, ref, fmt, out_dtype, what=f"{fmt} four consumers {m}x{n}x{k}")
        out = bs.gemm(x, w, config=cfg, bias=bias)
        assert_gemm_close(out, ref_gemm.gemm(x, w, bias=bias), fmt, torch.bfloat16, what=f"{fmt} four consumers bias")
    a = bs.quantize(randn_like_activations(50, 544, device="cuda", seed=3), fmt)
    w = _weights(600, 544, fmt, seed=4)
    out = bs.gemm(a, w, config=cfg.replace(dequant_a=True))
    assert_gemm_close(out, ref_gemm.gemm(a, w), fmt, torch.bfloat16, what=f"{fmt} four consumers W x A")
    from blockscaled.plan import tiled as plan_tiled

    if plan_tiled._TRITON_OK and plan_tiled.TILED_ENABLED and fmt in plan_tiled.TILED_STEP5_US:
        x = randn_like_activations(48, 4096, device="cuda", seed=7)
        w = _weights(28672, 4096, fmt, seed=8)
        with observe_plans() as plans:
            y = bs.gemm(x, w)
        assert (plans[-1].config.block_n, plans[-1].config.split_k) == (256, 1), plans[-1]
        assert_gemm_close(y, ref_gemm.gemm(x, w), fmt, torch.bfloat16, what=f"{fmt} planned four consumers")


@pytest.mark.parametrize("fmt", ("mxfp4", "nvfp4"))
def test_small_tiles_planned_between_stream_and_prefill(fmt):
    """M = 48 on 8192 x 8192 (Llama 3 70B o at a batch of 48): the planner runs the register-operand
    kernel's 64-token tiles with a K split (plan/tiled.py R4), weight-only and W x A, and the plan
    that ran checks; M = 32 stays on the streaming kernel."""
    from blockscaled.plan import tiled as plan_tiled

    if not plan_tiled._TRITON_OK or not plan_tiled.TILED_ENABLED:
        pytest.skip("the planner does not run the tiled kernel with this triton / BLOCKSCALED_MX_KERNELS")
    n, k = 8192, 8192
    w = _weights(n, k, fmt, seed=12)
    x = randn_like_activations(48, k, device="cuda", seed=13)
    with observe_plans() as plans:
        y = bs.gemm(x, w)
    cfg = plans[-1].config
    assert plans[-1].kernel == "hopper_tiled" and cfg.is_register_operand and cfg.block_m == 64, plans[-1]
    assert_gemm_close(y, ref_gemm.gemm(x, w), fmt, torch.bfloat16, what="planned weight-only")
    with observe_plans() as plans:
        y = bs.linear(x, w)
    assert plans[-1].config.is_register_operand and plans[-1].config.dequant_a, plans[-1]
    assert_gemm_close(y, ref_gemm.gemm(bs.quantize(x, fmt), w), fmt, torch.bfloat16, what="planned W x A")
    with observe_plans() as plans:
        bs.gemm(x[:32], w)
    assert plans[-1].kernel == "hopper_stream", plans[-1]


@pytest.mark.parametrize("bt,bn", ((64, 128), (64, 256), (256, 128)))
def test_register_operand_mxfp8_every_code(bt, bn):
    """mxfp8 weights on the register-operand kernel (kernels/hopper/tiled_rs.py ``_RS_PAIR_E4M3``):
    every e4m3 code (subnormals, zeros of both signs, the largest) in every byte position of the
    words a lane pair reads, under E8M0 scales from 2**-20 to 2**20, against the float64 reference;
    a NaN code makes its output column NaN (as the reference's), and only that one."""
    n, k = 130, 512
    codes = torch.arange(256, dtype=torch.int32, device="cuda")
    codes = codes[(codes & 0x7F) != 0x7F].to(torch.uint8)  # the 254 non-NaN codes
    g = torch.Generator(device="cuda").manual_seed(5)
    w = _weights(n, k, "mxfp8", seed=6)
    rows = torch.stack([codes[torch.randperm(codes.numel(), generator=g, device="cuda")] for _ in range(n)])
    w.data.view(torch.uint8).copy_(rows.repeat(1, 3)[:, :k])
    w.scale.view(torch.uint8).copy_(torch.randint(107, 148, w.scale.shape, generator=g, device="cuda",
                                                  dtype=torch.int32).to(torch.uint8))
    x = randn_like_activations(70, k, device="cuda", seed=7)
    cfg = GemmConfig(block_m=bt, block_n=bn, block_k=64, num_warps=4, num_stages=4 if bt == 256 else 6, split_k=1,
                     strategy="tiled")
    out = bs.gemm(x, w, torch.float32, out=_nan(70, n, torch.float32), config=cfg)
    assert_gemm_close(out, ref_gemm.gemm(x, w), "mxfp8", torch.float32, what=f"mxfp8 every code {bt}x{bn}")
    w.data.view(torch.uint8)[7, 300] = 0xFF  # a NaN code in row 7
    out = bs.gemm(x, w, torch.float32, config=cfg)
    assert out[:, 7].isnan().all() and not out[:, torch.arange(n, device="cuda") != 7].isnan().any()


@pytest.mark.parametrize("fmt", FMTS)
def test_w_x_a_bias_and_global_scales(fmt):
    m, n, k = 200, 300, 544
    xf = randn_like_activations(m, k, device="cuda", seed=3)
    a = bs.quantize(xf, fmt)  # nvfp4: a global scale from the amax (not 1), as the weights'
    w = _weights(n, k, fmt, seed=4)
    bias = torch.randn(n, device="cuda")
    for split in (1, 3):
        out = _nan(m, n, torch.bfloat16)
        bs.gemm(a, w, out=out, config=_cfg(split).replace(dequant_a=True), bias=bias)
        assert_gemm_close(out, ref_gemm.gemm(a, w, bias=bias), fmt, torch.bfloat16, what=f"{fmt} W x A split {split}")
    # bf16 activations with a bias, and activations TMA cannot read as they are (copied first): a
    # row stride that is not a multiple of 16 bytes, and a base 8 bytes off
    wide = randn_like_activations(m, k + 4, device="cuda", seed=5)
    flat = randn_like_activations(m * k + 4, device="cuda", seed=6)
    for xs in (wide[:, 4:], flat[4:].view(m, k)):
        assert xs.data_ptr() % 16 or (xs.stride(0) * 2) % 16
        out = bs.gemm(xs, w, config=_cfg(2), bias=bias)
        assert_gemm_close(out, ref_gemm.gemm(xs.contiguous(), w, bias=bias), fmt, torch.bfloat16, what="unaligned x")
    with pytest.raises(ValueError, match="dequant_a"):
        bs.gemm(a, w, config=_cfg(1))  # quantized activations need the pass the config must name


@pytest.mark.parametrize("fmt", FMTS)
def test_split_sum_is_deterministic_and_graph_replays(fmt):
    m, n, k = 160, 512, 4096
    w = _weights(n, k, fmt, seed=9)
    x = randn_like_activations(m, k, device="cuda", seed=10)
    y1 = bs.gemm(x, w, config=_cfg(5))
    y2 = bs.gemm(x, w, config=_cfg(5))
    assert torch.equal(y1, y2)
    x2 = randn_like_activations(m, k, device="cuda", seed=11)
    static_x = x.clone()
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    bs.gemm(static_x, w, out=out, config=_cfg(5))
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        bs.gemm(static_x, w, out=out, config=_cfg(5))
    static_x.copy_(x2)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, bs.gemm(x2, w, config=_cfg(5)))


@pytest.mark.parametrize("fmt", FMTS)
def test_planned_where_the_model_picks_it(fmt):
    """M = 128 on 8192 x 8192: the cost model predicts the kernel faster than dequantize + cuBLAS on
    an H100 / H200 (plan/tiled.py), weight-only (``gemm`` with bf16 activations) and W x A (``linear``
    quantizes them); the plan that ran is the tiled one and its output checks."""
    from blockscaled.plan import tiled as plan_tiled

    if not plan_tiled._TRITON_OK or not plan_tiled.TILED_ENABLED:
        pytest.skip("the planner does not run the tiled kernel with this triton / BLOCKSCALED_MX_KERNELS")
    m, n, k = 128, 8192, 8192
    w = _weights(n, k, fmt, seed=12)
    x = randn_like_activations(m, k, device="cuda", seed=13)
    with observe_plans() as plans:
        y = bs.gemm(x, w)
    assert plans and plans[-1].kernel == "hopper_tiled", plans[-1] if plans else None
    assert_gemm_close(y, ref_gemm.gemm(x, w), fmt, torch.bfloat16, what="planned weight-only")
    with observe_plans() as plans:
        y = bs.linear(x, w)
    assert plans and plans[-1].kernel == "hopper_tiled" and plans[-1].config.dequant_a, plans[-1] if plans else None
    assert_gemm_close(y, ref_gemm.gemm(bs.quantize(x, fmt), w), fmt, torch.bfloat16, what="planned W x A")
