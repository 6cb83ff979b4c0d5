"""Grouped GEMM / SwiGLU on a CUDA GPU: DeepSeek-V3 MoE shapes, CUDA-graph capture and replay
with changed device counts, torch.compile(fullgraph=True) with inductor, the four GPU MODE
NVFP4 group-GEMM benchmark cases, an operand of more than 2**31 elements, determinism.
All comparisons use the float64 reference of the same quantized inputs (computed on the GPU)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from blockscaled.ops.grouped import grouped_gemm, grouped_gemm_list
from blockscaled.ops.swiglu import swiglu
from blockscaled.reference import grouped as ref
from blockscaled.reference.quantize import quantize
from blockscaled.testing.compare import bitwise_equal
from blockscaled.testing.inputs import randn_like_activations
from blockscaled.testing.tolerances import assert_gemm_close

pytestmark = pytest.mark.gpu

DEV = "cuda"
FORMATS = ("fp8_block", "mxfp8", "mxfp4", "nvfp4")
#: DeepSeek-V3 MoE GEMMs (E=8 local experts): up-projection N=4096, K=7168; down N=7168, K=2048
DEEPSEEK_NK = [(4096, 7168), (7168, 2048)]
#: GPU MODE nvfp4_group_gemm benchmark cases (reference-kernels/problems/nvidia/nvfp4_group_gemm/task.yml)
GPUMODE = [
    ([80, 176, 128, 72, 64, 248, 96, 160], 4096, 7168),
    ([40, 76, 168, 72, 164, 148, 196, 160], 7168, 2048),
    ([192, 320], 3072, 4096),
    ([128, 384], 4096, 1536),
]


def _offsets(sizes):
    offs = [0]
    for s in sizes:
        offs.append(offs[-1] + s)
    return torch.tensor(offs, dtype=torch.int32, device=DEV)


def _acts(shape, fmt, seed=0):
    return quantize(randn_like_activations(*shape, dtype=torch.bfloat16, device=DEV, seed=seed), fmt)


def _w(shape, fmt, seed=1):
    g = torch.Generator(device=DEV).manual_seed(seed)
    w = torch.randn(*shape, generator=g, device=DEV) * 0.02
    return quantize(w, fmt, block=(128, 128) if fmt == "fp8_block" else None)


def _masked_close(out, want, fmt, out_dtype, what=""):
    computed = ~torch.isnan(want)
    assert_gemm_close(torch.where(computed, out, torch.zeros((), dtype=out.dtype, device=out.device)),
                      torch.where(computed, want, 0.0), fmt, out_dtype, what=what)
    assert torch.isnan(out[~computed]).all(), f"{what}: rows past masked_m were written"


@pytest.mark.parametrize("nk", DEEPSEEK_NK, ids=lambda s: f"N{s[0]}K{s[1]}")
@pytest.mark.parametrize("fmt", FORMATS)
def test_deepseek_contiguous(fmt, nk):
    n, k = nk
    e, m = 8, 128
    sizes = [m] * e
    a = _acts((e * m, k), fmt)
    b = _w((e, n, k), fmt)
    offs = _offsets(sizes)
    out = torch.full((e * m, n), float("nan"), dtype=torch.bfloat16, device=DEV)
    grouped_gemm(a, b, offsets=offs, out=out)
    want = ref.grouped_gemm(a, b, offsets=offs)
    assert_gemm_close(out, want, fmt, torch.bfloat16, what=f"E=8 m=128 N={n} K={k}")
    assert bitwise_equal(grouped_gemm(a, b, offsets=offs), out)  # deterministic
    # skewed segments with the same total, including empty experts, no padding
    skew = [0, 1, 300, 0, 77, 129, 500, 17]
    offs2 = _offsets(skew)
    y = grouped_gemm(a, b, offsets=offs2, out_dtype=torch.float32)
    assert_gemm_close(y, ref.grouped_gemm(a, b, offsets=offs2), fmt, torch.float32, what="skewed")


@pytest.mark.parametrize("fmt", ("fp8_block", "nvfp4"))
def test_deepseek_masked(fmt):
    e, max_m, n, k = 8, 256, 4096, 7168
    a = _acts((e, max_m, k), fmt)
    b = _w((e, n, k), fmt)
    counts = torch.tensor([128, 0, 1, 256, 64, 200, 37, 128], dtype=torch.int32, device=DEV)
    out = torch.full((e, max_m, n), float("nan"), dtype=torch.bfloat16, device=DEV)
    grouped_gemm(a, b, masked_m=counts, out=out)
    _masked_close(out, ref.grouped_gemm(a, b, masked_m=counts), fmt, torch.bfloat16, "masked")


@pytest.mark.parametrize("fmt", ("fp8_block", "mxfp8", "nvfp4"))
def test_swiglu_deepseek(fmt):
    e, m, n, k = 8, 64, 2048, 7168  # gate and up halves of the 4096-wide up-projection
    sizes = [m, 0, 2 * m, m, 1, m, m, m - 1]
    offs = _offsets(sizes)
    a = _acts((sum(sizes), k), fmt)
    bg, bu = _w((e, n, k), fmt, 2), _w((e, n, k), fmt, 3)
    out = torch.full((sum(sizes), n), float("nan"), dtype=torch.bfloat16, device=DEV)
    swiglu(a, bg, bu, offsets=offs, out=out)
    assert_gemm_close(out, ref.swiglu(a, bg, bu, offsets=offs), fmt, torch.bfloat16, what="swiglu grouped")
    ad = _acts((300, k), fmt, seed=5)
    y = swiglu(ad, replace(bg, data=bg.data[0], scale=bg.scale[0], shape=bg.shape[1:]),
               replace(bu, data=bu.data[0], scale=bu.scale[0], shape=bu.shape[1:]), out_dtype=torch.float32)
    want = ref.swiglu(ad, replace(bg, data=bg.data[0], scale=bg.scale[0], shape=bg.shape[1:]),
                      replace(bu, data=bu.data[0], scale=bu.scale[0], shape=bu.shape[1:]))
    assert_gemm_close(y, want, fmt, torch.float32, what="swiglu dense")


@pytest.mark.parametrize("fmt", ("fp8_block", "nvfp4"))
def test_masked_cuda_graph_replay_with_new_counts(fmt):
    e, max_m, n, k = 8, 256, 7168, 2048
    a = _acts((e, max_m, k), fmt)
    b = _w((e, n, k), fmt)
    counts = torch.tensor([64] * e, dtype=torch.int32, device=DEV)
    out = torch.full((e, max_m, n), float("nan"), dtype=torch.bfloat16, device=DEV)
    grouped_gemm(a, b, masked_m=counts, out=out)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grouped_gemm(a, b, masked_m=counts, out=out)
    for new in ([256, 0, 1, 128, 255, 3, 0, 77], [0] * e, [256] * e):
        counts.copy_(torch.tensor(new, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _masked_close(out, ref.grouped_gemm(a, b, masked_m=counts), fmt, torch.bfloat16, f"replay {new}")


def test_contiguous_cuda_graph_replay_with_new_offsets():
    fmt = "fp8_block"
    e, n, k, total = 8, 4096, 7168, 1024
    a = _acts((total, k), fmt)
    b = _w((e, n, k), fmt)
    offs = _offsets([128] * e)
    out = torch.empty((total, n), dtype=torch.bfloat16, device=DEV)
    grouped_gemm(a, b, offsets=offs, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grouped_gemm(a, b, offsets=offs, out=out)
    for sizes in ([1024, 0, 0, 0, 0, 0, 0, 0], [0, 3, 500, 1, 0, 260, 0, 260]):
        offs.copy_(_offsets(sizes))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_gemm_close(out, ref.grouped_gemm(a, b, offsets=offs), fmt, torch.bfloat16, what=f"{sizes}")


def test_torch_compile_fullgraph_inductor():
    fmt = "nvfp4"
    e, n, k = 4, 512, 1024
    a = _acts((300, k), fmt)
    a3 = _acts((e, 64, k), fmt, seed=3)
    b = _w((e, n, k), fmt)
    bu = _w((e, n, k), fmt, 7)
    offs = _offsets([100, 0, 150, 50])
    counts = torch.tensor([64, 0, 10, 33], dtype=torch.int32, device=DEV)

    def f(a_data, a3_data, offs, counts):
        aa = replace(a, data=a_data)
        y = grouped_gemm(aa, b, offsets=offs).float() + 1.0
        z = grouped_gemm(replace(a3, data=a3_data), b, masked_m=counts, out_dtype=torch.float32)
        s = swiglu(aa, b, bu, offsets=offs, out_dtype=torch.float32)
        return y, z, s

    cf = torch.compile(f, fullgraph=True)
    yc, zc, sc = cf(a.data, a3.data, offs, counts)
    ye, ze, se = f(a.data, a3.data, offs, counts)
    assert bitwise_equal(yc, ye) and bitwise_equal(sc, se)
    assert torch.equal(zc[0], ze[0]) and torch.equal(zc[2, :10], ze[2, :10]) and torch.equal(zc[3, :33], ze[3, :33])


@pytest.mark.parametrize("case", GPUMODE, ids=lambda c: f"G{len(c[0])}_N{c[1]}_K{c[2]}")
def test_gpumode_nvfp4_group_gemm(case):
    ms, n, k = case
    a_list = [_acts((m, k), "nvfp4", seed=i) for i, m in enumerate(ms)]
    b_list = [_w((n, k), "nvfp4", seed=100 + i) for i in range(len(ms))]
    outs = grouped_gemm_list(a_list, b_list)  # fp16, one launch
    wants = ref.grouped_gemm_list(a_list, b_list)
    for i, (o, w) in enumerate(zip(outs, wants)):
        assert o.dtype == torch.float16 and o.shape == (ms[i], n)
        assert_gemm_close(o, w, "nvfp4", torch.float16, what=f"group {i}")
    again = grouped_gemm_list(a_list, b_list)
    assert all(bitwise_equal(x, y) for x, y in zip(again, outs))


def test_operand_over_2pow31_elements():
    """B has 3 * 24576 * 30720 = 2.26e9 > 2**31 elements: expert and row offsets must be int64."""
    e, n, k, m = 3, 24576, 30720, 16
    assert e * n * k > 2**31
    g = torch.Generator(device=DEV).manual_seed(0)
    # random e4m3 bytes without the NaN codes (0x7F / 0xFF): magnitude codes 0..0x77, random sign
    bits = torch.randint(0, 0x78, (e, n, k), dtype=torch.uint8, device=DEV, generator=g)
    bits |= torch.randint(0, 2, (e, n, k), dtype=torch.uint8, device=DEV, generator=g) << 7
    data = bits.view(torch.float8_e4m3fn)
    del bits
    scale = torch.rand(e, n // 128, k // 128, device=DEV, generator=g) * 1e-3 + 1e-4
    proto = _w((1, 128, 128), "fp8_block")
    b = replace(proto, data=data, scale=scale, shape=torch.Size((e, n, k)))
    a = _acts((e, m, k), "fp8_block")
    counts = torch.full((e,), m, dtype=torch.int32, device=DEV)
    out = torch.full((e, m, n), float("nan"), dtype=torch.float32, device=DEV)
    grouped_gemm(a, b, masked_m=counts, out=out, out_dtype=torch.float32)
    # reference on the last expert's last 256 rows of B (the addresses past 2**31)
    from blockscaled.reference.quantize import dequantize

    sb = scale[e - 1, -2:].repeat_interleave(128, 0).repeat_interleave(128, 1).double()
    bs = b.data[e - 1, -256:].float().double() * sb
    a_last = replace(a, data=a.data[e - 1], scale=a.scale[e - 1], shape=a.shape[1:])
    want = dequantize(a_last).double() @ bs.T
    assert_gemm_close(out[e - 1, :, -256:], want, "fp8_block", torch.float32, what=">2**31 elements")
    assert not torch.isnan(out).any()


def test_report_timings():
    """Not an assertion of speed: prints TFLOP/s of the DeepSeek grouped shapes for the record
    (benchmarks/results holds the curated numbers)."""
    import triton

    rows = []
    for fmt in ("fp8_block", "nvfp4"):
        for n, k in DEEPSEEK_NK:
            e, m = 8, 128
            a = _acts((e * m, k), fmt)
            b = _w((e, n, k), fmt)
            offs = _offsets([m] * e)
            out = torch.empty((e * m, n), dtype=torch.bfloat16, device=DEV)
            ms = triton.testing.do_bench(lambda: grouped_gemm(a, b, offsets=offs, out=out), return_mode="median")
            rows.append(f"{fmt} contiguous E=8 m=128 N={n} K={k}: {ms * 1e3:.1f} us, "
                        f"{2 * e * m * n * k / ms / 1e9:.0f} TFLOP/s")
    print("\n" + "\n".join(rows))


@pytest.mark.parametrize("fmt", ("mxfp4", "fp8_block"))
def test_weight_only_gptoss_like(fmt):
    """bf16 activations x quantized experts (gpt-oss MXFP4 MoE on Hopper): E=8, m=128/expert,
    N=5760 (fused gate/up of a 2880-wide expert), K=2880."""
    e, m, n, k = 8, 128, 5760, 2880
    x = randn_like_activations(e * m, k, dtype=torch.bfloat16, device=DEV, outliers=False)
    b = _w((e, n, k), fmt)
    offs = _offsets([m] * e)
    out = torch.full((e * m, n), float("nan"), dtype=torch.bfloat16, device=DEV)
    grouped_gemm(x, b, offsets=offs, out=out)
    assert_gemm_close(out, ref.grouped_gemm(x, b, offsets=offs), fmt, torch.bfloat16, what="weight-only")
