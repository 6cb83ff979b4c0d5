"""The fp4 decode GEMV with explicit layouts (``GemmConfig(strategy="gemv", gluon=True)``,
kernels/hopper/mx_gemv_gluon.py). CPU: its config checks and the loud errors of a forced config it cannot
run. sm_90 GPU: forced tiles (8 / 4 / 2 / 1 weight rows, 4 / 2 / 1 warps, one or two activation rows,
an odd M with two rows) against the float64 reference on bf16 / fp16 activations, N tails, K tails
(partial chunks), one slice of K, bias and output dtypes, nvfp4 global scales, NaN-poisoned outputs, E8M0
255 -> NaN, bitwise repeats, CUDA-graph replay; on triton 3.7 / 3.8 the planner's plan through ``gemm``
and ``linear`` (explain names it). Planner rule: tests/test_planner.py ``test_gluon_gemv_rule``; AOT:
tests/test_aot_mx_gemv_gluon.py."""

from __future__ import annotations

import pytest
import torch

import blockscaled as bs
from blockscaled.config.gemm import GemmConfig
from blockscaled.plan import mx_gemv as plan_mx_gemv
from blockscaled.reference import gemm as ref_gemm
from blockscaled.testing.tolerances import assert_gemm_close

from conftest import DEVICE

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
sm90 = pytest.mark.skipif(not SM90, reason="the Gluon GEMV is an sm_90 kernel")
FMTS = ("mxfp4", "nvfp4")


def _cfg(rows=1, bn=8, warps=4):
    return GemmConfig(block_m=rows, block_n=bn, block_k=1024 * warps, num_warps=warps, num_stages=1, strategy="gemv",
                      gluon=True)


def _operands(fmt, m, n, k, seed=0, dtype=torch.bfloat16, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    x[:, ::7] *= 8.0  # a few larger channels: the block scales differ
    w = bs.quantize((torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16).to(device), fmt)
    return x.to(dtype).to(device), w


def _run(x, w, cfg, out_dtype=torch.bfloat16, bias=None):
    out = torch.full((x.shape[0], w.shape[0]), float("nan"), device=x.device, dtype=out_dtype)
    bs.gemm(x, w, out_dtype, out, config=cfg, bias=bias)
    return out


def test_config_checks():
    _cfg()
    _cfg(2, 4, 1)
    with pytest.raises(ValueError, match="GemmConfig.gluon: only strategy 'gemv'"):
        GemmConfig(block_m=8, block_n=64, block_k=128, num_warps=4, num_stages=1, strategy="direct", gluon=True)
    for bad in (dict(block_m=4), dict(block_n=16), dict(block_k=2048), dict(num_warps=8, block_k=8192)):
        with pytest.raises(ValueError, match="the Gluon GEMV"):
            GemmConfig(**{**dict(block_m=1, block_n=8, block_k=4096, num_warps=4, num_stages=1, strategy="gemv",
                                 gluon=True), **bad})
    with pytest.raises(TypeError, match="GemmConfig.gluon: expected a bool"):
        GemmConfig(strategy="gemv", block_m=1, block_n=8, block_k=4096, num_warps=4, gluon=1)


def test_forced_errors_name_the_argument():
    """Operands the kernel cannot take fail loudly, naming config.gluon (on any device: the operand
    checks come first; on a CPU tensor the device check then says it is an sm_90 kernel)."""
    x, w8 = _operands("mxfp8", 1, 64, 256)
    with pytest.raises(ValueError, match="config.gluon: .*mxfp4 / nvfp4 weights, got mxfp8"):
        _run(x, w8, _cfg())
    _, w = _operands("mxfp4", 1, 64, 256)
    with pytest.raises(ValueError, match="config.gluon: .*bf16 / fp16 activations .*quantized"):
        _run(bs.quantize(x, "mxfp4"), w, _cfg())
    x2, w2 = _operands("nvfp4", 1, 64, 80)
    with pytest.raises(ValueError, match="config.gluon: .*multiple of 32, got K=80"):
        _run(x2, w2, _cfg())
    if not SM90:
        with pytest.raises(ValueError, match="config.gluon: the Gluon GEMV is an sm_90"):
            _run(x, w, _cfg())


@sm90
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_forced_tiles_match_reference(fmt):
    """N tails, K in one slice / a partial chunk / several chunks, every tile shape and row count."""
    for m, n, k in ((1, 257, 1024), (1, 2880, 2880), (2, 300, 2880), (3, 33, 4128), (1, 7, 32), (5, 130, 8192)):
        for dtype in (torch.bfloat16, torch.float16):
            x, w = _operands(fmt, m, n, k, seed=m + n + k, dtype=dtype)
            ref = ref_gemm.gemm(x, w)
            for rows, bn, warps in ((1, 8, 4), (1, 4, 2), (1, 2, 1), (2, 4, 4), (2, 8, 2)):
                out = _run(x, w, _cfg(rows, bn, warps))
                assert_gemm_close(out, ref, fmt, torch.bfloat16, what=f"{m}x{n}x{k} {dtype} {rows}/{bn}/{warps}")


@sm90
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("out_dtype", (torch.float32, torch.float16, torch.bfloat16))
def test_bias_and_output_dtypes(fmt, out_dtype):
    x, w = _operands(fmt, 2, 1000, 2048, seed=3)
    bias = torch.randn(1000, device="cuda", dtype=torch.bfloat16)
    out = _run(x, w, _cfg(2, 4, 2), out_dtype, bias=bias)
    assert_gemm_close(out, ref_gemm.gemm(x, w, bias=bias), fmt, out_dtype)


@sm90
@pytest.mark.gpu
def test_nan_scale_propagates_and_repeats():
    x, w = _operands("mxfp4", 1, 64, 2048, seed=5)
    w.scale[3, 10] = 255  # E8M0 NaN: row 3 only
    out = _run(x, w, _cfg(1, 8, 2))
    assert torch.isnan(out[0, 3]) and not torch.isnan(out[0, torch.arange(64) != 3]).any()
    x, w = _operands("nvfp4", 1, 4096, 4096, seed=6)
    a, b = _run(x, w, _cfg()), _run(x, w, _cfg())
    assert torch.equal(a, b), "not bitwise repeatable"


@sm90
@pytest.mark.gpu
def test_cuda_graph_replay():
    x, w = _operands("nvfp4", 1, 2880, 2880, seed=7)
    x2, _ = _operands("nvfp4", 1, 2880, 2880, seed=8)
    out = torch.empty(1, 2880, device="cuda", dtype=torch.bfloat16)
    cfg = _cfg(1, 8, 4)
    bs.gemm(x, w, out=out, config=cfg)  # compile outside the capture
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            bs.gemm(x, w, out=out, config=cfg)
    x.copy_(x2)
    g.replay()
    torch.cuda.synchronize()
    assert_gemm_close(out, ref_gemm.gemm(x2, w), "nvfp4", torch.bfloat16)


@sm90
@pytest.mark.gpu
@pytest.mark.skipif(not plan_mx_gemv._GLUON_TRITON_OK, reason="the planner runs it on triton 3.7 / 3.8 only")
@pytest.mark.parametrize("fmt", FMTS)
def test_planner_runs_it_at_one_row(fmt):
    """gemm and linear (weight-only) at one row on small weights: explain names the kernel, that kernel runs
    (plan.observe_plans) and matches the reference; above MX_GEMV_GLUON_MAX_BYTES the register-streaming
    kernel."""
    from blockscaled.plan import observe_plans

    for n, k in ((2880, 2880), (7168, 2048), (1536, 1536)):
        x, w = _operands(fmt, 1, n, k, seed=n)
        plan = bs.explain("gemm", x, w)
        assert plan.kernel == "gemv_gluon" and "MX_GEMV_GLUON_MAX_BYTES" in str(plan), plan
        with observe_plans() as seen:
            out = bs.gemm(x, w)
        assert [p.config for p in seen] == [plan.config], seen
        assert_gemm_close(out, ref_gemm.gemm(x, w), fmt, torch.bfloat16, what=f"{n}x{k}")
        assert bs.explain("linear", x, w, weight_only=True).kernel == "gemv_gluon"
        y = bs.linear(x, w, weight_only=True)
        assert_gemm_close(y, ref_gemm.linear(x, w, weight_only=True), fmt, torch.bfloat16)
    x, w = _operands(fmt, 1, 8192, 8192, seed=1)
    assert bs.explain("gemm", x, w).kernel == "hopper_direct"
