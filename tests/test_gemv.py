"""The CUDA-core decode GEMV (strategy "gemv", kernels/triton/gemv.py): forced configs against
the float64 reference on the interpreter (CPU) or the GPU, with N / K / M tails, K walked in
several chunks, both fp8_block weight-scale layouts, bias and out dtypes, NaN-poisoned outputs;
config validation and bad-input errors; the planner's GEMV tiles and where it plans the GEMV (pure
functions on an H100 DeviceInfo); AOT build for sm_90 (vector loads, no MMA, no spills).
GPU-only: the planner's GEMV tiles on the DeepSeek-V3 rows through ``gemm()``, bitwise repeats,
CUDA-graph replay."""

from __future__ import annotations

import pytest
import torch

from _aot import PTXAS_STATS, run_compile_script
from blockscaled.config.gemm import GEMV_MAX_M, GemmConfig, gemv_config
from blockscaled.ops.gemm import gemm
from blockscaled.ops.quantize import quantize
from blockscaled.plan import H100_SXM, Problem, plan_gemm
from blockscaled.plan.dense import gemv_for
from blockscaled.reference import gemm as ref_gemm
from blockscaled.testing import fp8_block_operands
from blockscaled.testing.tolerances import assert_gemm_close

from conftest import DEVICE, HAS_CUDA


def _operands(m, n, k, wblock=(128, 128), seed=0, device=DEVICE):
    return fp8_block_operands(m, n, k, seed, device=device, weight_block=wblock)


def _gemv(bm, bn, bk, warps=4):
    return GemmConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=1, strategy="gemv")


def _run(a, b, cfg, out_dtype=torch.bfloat16, bias=None):
    out = torch.full((a.shape[0], b.shape[0]), float("nan"), device=b.data.device, dtype=out_dtype)
    gemm(a, b, out_dtype, out, config=cfg, bias=bias)
    return out


# (M, N, K, config): N tails (N % block_n), K tails (K % 128, K below one block), K in several
# chunks (block_k < K), M below / equal to block_m, and block_m < M (a second row of programs)
CASES = [
    (1, 40, 300, _gemv(1, 16, 512)),
    (1, 33, 1000, _gemv(1, 4, 256)),      # 4 chunks, last one partial
    (3, 70, 1000, _gemv(4, 32, 1024)),
    (4, 64, 256, _gemv(4, 128, 256)),
    (2, 37, 129, _gemv(2, 2, 128)),        # block_n 2, K = one block + 1 element
    (5, 20, 200, _gemv(2, 8, 256)),        # M > block_m: 3 rows of programs, last one partial
    (1, 7, 64, _gemv(1, 1, 128)),          # K shorter than one scale block
]


@pytest.mark.parametrize("wblock", [(128, 128), (1, 128)], ids=["w128x128", "w1x128"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[3].block_m}x{c[3].block_n}x{c[3].block_k}")
def test_forced_configs(case, wblock):
    m, n, k, cfg = case
    a, b = _operands(m, n, k, wblock, seed=m + n + k)
    out = _run(a, b, cfg)
    assert not torch.isnan(out.float()).any(), "unwritten output elements"
    assert_gemm_close(out, ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16, what=str(cfg))


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_bias_and_out_dtypes(out_dtype):
    a, b = _operands(2, 70, 384, seed=3)
    bias = torch.randn(70, device=DEVICE).to(out_dtype)
    out = _run(a, b, _gemv(2, 16, 256), out_dtype, bias)
    assert_gemm_close(out, ref_gemm.gemm(a, b, bias=bias), "fp8_block", out_dtype)


def test_leading_dims_and_default_gemv_config():
    a, b = _operands(3, 50, 640, seed=5)
    a3 = quantize(a.dequantize().reshape(1, 3, 640).to(torch.bfloat16), "fp8_block")
    cfg = gemv_config(3, 50, 640)
    assert (cfg.block_m, cfg.block_n, cfg.block_k) == (4, 32, 1024)  # 32 rows x 1024 K = 32 KB
    y = gemm(a3, b, config=cfg)
    assert y.shape == (1, 3, 50)
    assert_gemm_close(y.view(3, 50), ref_gemm.gemm(a3, b).view(3, 50), "fp8_block", torch.bfloat16)


def test_config_validation():
    with pytest.raises(ValueError, match="block_m"):
        _gemv(2 * GEMV_MAX_M, 4, 128)
    with pytest.raises(ValueError, match="block_n"):
        _gemv(1, 3, 128)
    with pytest.raises(ValueError, match="block_n"):
        _gemv(1, 256, 128)
    with pytest.raises(ValueError, match="block_k"):
        _gemv(1, 4, 64)
    with pytest.raises(ValueError, match="split_k"):
        GemmConfig(block_m=1, block_n=4, block_k=128, split_k=2, strategy="gemv")


def test_wrong_format_rejected():
    # dense (weight-only) A with fp8_block weights: no GEMV (MX / NV weights take the
    # kernels/triton/mx_gemv.py GEMV in both modes: tests/test_mx_gemv.py)
    x = torch.randn(1, 256, device=DEVICE, dtype=torch.bfloat16)
    wb = quantize(torch.randn(64, 256, device=DEVICE, dtype=torch.bfloat16), "fp8_block", block=(128, 128))
    with pytest.raises(ValueError, match="gemv"):
        gemm(x, wb, config=_gemv(1, 4, 256))


def test_gemv_config_shapes():
    # the whole K in one chunk where it fits; one row and several chunks where it does not
    assert gemv_config(1, 2112, 7168) == _gemv(1, 4, 8192)
    c = gemv_config(1, 100, 100000, chunk_bytes=16384)
    assert (c.block_n, c.block_k) == (1, 16384)
    assert gemv_config(3, 100, 512, chunk_bytes=8192).block_n == 16 and gemv_config(3, 100, 512).num_warps == 8


def test_planner_gemv_tiles():
    # chunk and warps fitted to the H100 sweep (plan/dense.py::gemv_for docstring)
    assert gemv_for(1, 2112, 7168) == _gemv(1, 1, 8192, 8)
    assert gemv_for(1, 4096, 7168) == _gemv(1, 1, 8192, 8)
    assert gemv_for(1, 7168, 16384) == _gemv(1, 1, 16384, 4)
    assert gemv_for(1, 7168, 2048) == _gemv(1, 4, 2048, 4)


def test_planner_gemv_only_for_fp8_decode():
    """On an H100 the planner plans the fp8_block GEMV (with gemv_for's tiles) only for one
    activation row of fp8_block x fp8_block; never for M > 1 or weight-only (MX / NV formats
    have their own GEMV rule: tests/test_mx_gemv.py)."""
    for n, k in ((2112, 7168), (4096, 7168), (7168, 16384), (7168, 2048), (24576, 1536), (32768, 512), (300, 4100)):
        for m in (1, 2, 4, 16):
            for p in (Problem("gemm", "fp8_block", m, n, k), Problem("gemm", "fp8_block", m, n, k, bias=True),
                      Problem("gemm", "fp8_block", m, n, k, tma=False, b_block_rows=1)):
                cfg = plan_gemm(p, H100_SXM).config
                if isinstance(cfg, GemmConfig) and cfg.strategy == "gemv":
                    assert m == 1 and cfg == gemv_for(m, n, k), (p, cfg)
            p = Problem("gemm", "fp8_block", m, n, k, a="bfloat16")
            assert plan_gemm(p, H100_SXM).kernel != "gemv", p


def test_aot_sm90_build():
    """The dispatched configs compile for sm_90 with 16-byte weight loads, no MMA and no spills."""
    res = run_compile_script(PTXAS_STATS + r'''
import json, re
import triton
from triton.backends.compiler import GPUTarget
from blockscaled.kernels.triton.gemv import gemv_kernel
out = {}
for bm, bn, kb, warps in [(1, 1, 64, 8), (1, 1, 128, 4), (1, 4, 16, 4), (4, 32, 8, 8)]:
    sig = {"a_ptr": "*fp8e4nv", "a_s_ptr": "*fp32", "b_ptr": "*fp8e4nv", "b_s_ptr": "*fp32", "bias_ptr": "*bf16",
           "c_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "stride_am": "i32", "stride_asm": "i32",
           "stride_ask": "i32", "stride_bn": "i32", "stride_bsn": "i32", "stride_bsk": "i32", "stride_cm": "i32",
           "B_SCALE_ROWS": "constexpr", "HAS_BIAS": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
           "CHUNK_KB": "constexpr"}
    const = {"B_SCALE_ROWS": 128, "HAS_BIAS": False, "BLOCK_M": bm, "BLOCK_N": bn, "CHUNK_KB": kb}
    div16 = ("K", "stride_am", "stride_bn", "stride_cm")
    attrs = {(i,): [["tt.divisibility", 16]] for i, (n, t) in enumerate(sig.items())
             if t != "constexpr" and (t.startswith("*") or n in div16)}
    k = triton.compile(triton.compiler.ASTSource(gemv_kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "num_stages": 1})
    ptx = k.asm["ptx"]
    st = ptxas_stats(ptx)
    out[f"{bm}x{bn}x{kb}w{warps}"] = {"v4": len(re.findall(r"ld\.global[.a-z0-9]*\.v4\.b32", ptx)),
                                      "mma": ptx.count("mma"), "spills": st.get("spill_stores")}
print("JSON" + json.dumps(out))
''')
    for name, r in res.items():
        assert r["v4"] > 0, f"{name}: no 16-byte weight loads"
        assert r["mma"] == 0, f"{name}: unexpected MMA instructions"
        if r.get("spills") is not None:
            assert r["spills"] == 0, f"{name}: {r['spills']} bytes of register spills"


# ----------------------------------------------------------------------------------------- GPU
gpu = pytest.mark.skipif(not HAS_CUDA or torch.cuda.get_device_capability() != (9, 0),
                         reason="needs an sm_90 (Hopper) GPU (the GEMV's tiles are fitted there)")

NK = [(2112, 7168), (4096, 7168), (7168, 16384), (7168, 2048)]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("nk", NK, ids=lambda s: f"{s[0]}x{s[1]}")
def test_planner_tiles_through_gemm(nk):
    """The planner's GEMV tiles on the DeepSeek-V3 decode rows: correct and bitwise repeatable;
    the default plan (whichever kernel it is) correct, and bitwise the same where it is the GEMV."""
    import blockscaled as bs

    n, k = nk
    a, b = _operands(1, n, k, seed=n, device="cuda")
    cfg = gemv_for(1, n, k)
    out = _run(a, b, cfg)
    assert_gemm_close(out, ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16)
    assert torch.equal(_run(a, b, cfg), out), "not bitwise repeatable"
    default = torch.full((1, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm(a, b, out=default)
    assert_gemm_close(default, ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16)
    if bs.explain("gemm", a, b).config == cfg:
        assert torch.equal(default, out)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("chunk", [8192, 16384, 32768, 65536])
@pytest.mark.parametrize("warps", [4, 8, 16])
def test_forced_chunks_gpu(chunk, warps):
    for m, n, k in ((1, 2112, 7168), (3, 257, 1000), (4, 130, 2200)):
        a, b = _operands(m, n, k, seed=chunk + warps + m, device="cuda")
        cfg = gemv_config(m, n, k, chunk_bytes=chunk, num_warps=warps)
        out = _run(a, b, cfg)
        assert_gemm_close(out, ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16, what=f"{m}x{n}x{k} {cfg}")


@pytest.mark.gpu
@gpu
def test_unaligned_k_and_row_scales_gpu():
    # K % 16 != 0: the Hopper TMA kernels cannot take it; the planner's plan without them runs
    for wblock in ((128, 128), (1, 128)):
        a, b = _operands(1, 300, 4100, wblock, seed=7, device="cuda")
        out = torch.full((1, 300), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(a, b, out=out)
        assert_gemm_close(out, ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16, what=str(wblock))


@pytest.mark.gpu
@gpu
def test_cuda_graph_replay_gpu():
    n, k = 2112, 7168
    a, b = _operands(1, n, k, seed=11, device="cuda")
    a2, _ = _operands(1, n, k, seed=12, device="cuda")
    out = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
    gemm(a, b, out=out)  # compile outside the capture
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            gemm(a, b, out=out)
    a.data.copy_(a2.data)
    a.scale.copy_(a2.scale)
    g.replay()
    torch.cuda.synchronize()
    assert_gemm_close(out, ref_gemm.gemm(a2, b), "fp8_block", torch.bfloat16)
