"""GPU-only GEMM tests: DeepSeek-V3 shapes, the old failing MXFP8 shape, > 2**31-element
operands, torch.compile (inductor), CUDA-graph capture, determinism, and the issue's speed bar
("no op slower than dequantize + torch.matmul at M = 4096")."""

from __future__ import annotations

import pytest
import torch

from blockscaled.config import GemmConfig
from blockscaled.ops.gemm import gemm
from blockscaled.ops.linear import linear
from blockscaled.ops.quantize import dequantize, quantize
from blockscaled.reference import gemm as ref_gemm_mod
from blockscaled.testing.inputs import randn_like_activations
from blockscaled.testing.tolerances import assert_gemm_close

pytestmark = pytest.mark.gpu

FORMATS = ("fp8_block", "mxfp8", "mxfp4", "nvfp4")
DSV3_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]


def _w(n, k, fmt, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, k, device="cuda", generator=g).mul_(0.05).to(torch.bfloat16)
    return quantize(w, fmt, block=(128, 128) if fmt == "fp8_block" else None)


def _a(m, k, fmt, seed=0):
    x = randn_like_activations(m, k, device="cuda", seed=seed)
    return x, quantize(x, fmt)


def _ref(a, b):
    return ref_gemm_mod.gemm(a, b)  # float64 on the GPU


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("nk", DSV3_NK, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("m", (1, 64, 128, 4096))
def test_deepseek_v3_shapes(m, nk, fmt):
    n, k = nk
    _, a = _a(m, k, fmt)
    b = _w(n, k, fmt)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm(a, b, torch.bfloat16, out=out)
    assert_gemm_close(out, _ref(a, b), fmt, torch.bfloat16, what=f"M={m} N={n} K={k}")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", (1, 128, 4096))
def test_deepseek_v3_weight_only(m, fmt):
    n, k = 4096, 7168
    x, _ = _a(m, k, fmt)
    b = _w(n, k, fmt)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm(x, b, out=out)
    assert_gemm_close(out, _ref(x, b), fmt, torch.bfloat16)


@pytest.mark.parametrize("out_dtype", (torch.bfloat16, torch.float16, torch.float32), ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
def test_old_failing_shape(fmt, out_dtype):
    """M=256, N=512, K=1024: the shape the old MXFP8 Triton kernel failed on; plus N not a
    multiple of 256 and odd K."""
    for m, n, k in ((256, 512, 1024), (256, 300, 1024), (333, 777, 1001)):
        _, a = _a(m, k, fmt)
        b = _w(n, k, fmt)
        out = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
        gemm(a, b, out_dtype, out=out)
        assert_gemm_close(out, _ref(a, b), fmt, out_dtype, what=f"{m}x{n}x{k}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_forced_variants_large(fmt):
    m, n, k = 300, 1000, 4096
    _, a = _a(m, k, fmt)
    b = _w(n, k, fmt)
    ref = _ref(a, b)
    sk = {"fp8_block": 128, "mxfp8": 32, "mxfp4": 32, "nvfp4": 16}[fmt]
    cfgs = [GemmConfig(strategy="dequant_matmul"),
            GemmConfig(block_m=128, block_n=128, block_k=128 if fmt != "nvfp4" else 128, num_warps=8, num_stages=3,
                       promote=fmt == "fp8_block"),
            GemmConfig(block_m=64, block_n=64, block_k=128 if fmt == "fp8_block" else 64, num_warps=4, num_stages=3,
                       split_k=4, promote=fmt == "fp8_block"),
            GemmConfig(block_m=16, block_n=128, block_k=min(sk, 128) if fmt != "nvfp4" else 128, num_warps=4,
                       num_stages=4, split_k=3, promote=fmt != "nvfp4")]
    for cfg in cfgs:
        for out_dtype in (torch.bfloat16, torch.float32):
            out = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
            gemm(a, b, out_dtype, out=out, config=cfg)
            assert_gemm_close(out, ref, fmt, out_dtype, what=str(cfg))


def test_more_than_2pow31_elements():
    """B [N, K] with N*K > 2**31 (fp8: 2.3 GB): rows past 2**31 bytes must be read correctly."""
    n, k, m = 140_000, 16_384, 16
    assert n * k > 2**31
    w = torch.empty(n, k, dtype=torch.bfloat16, device="cuda")
    for i in range(0, n, 20_000):
        g = torch.Generator(device="cuda").manual_seed(i)
        w[i:i + 20_000] = torch.randn(min(20_000, n - i), k, device="cuda", generator=g).to(torch.bfloat16)
    b = quantize(w, "mxfp8")
    del w
    _, a = _a(m, k, "mxfp8")
    out = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")
    gemm(a, b, torch.float32, out=out, config=GemmConfig(block_m=16, block_n=128, block_k=128, num_warps=4,
                                                        num_stages=3, promote=False))
    from blockscaled.tensor import ScaledTensor

    for lo in (0, n - 4096):  # first rows and rows beyond 2**31 bytes
        bs = ScaledTensor(b.data[lo:lo + 4096], b.scale[lo:lo + 4096], b.format, torch.Size((4096, k)), b.block,
                          b.rounding)
        assert_gemm_close(out[:, lo:lo + 4096], _ref(a, bs), "mxfp8", torch.float32, what=f"rows {lo}+")


def test_large_m_output_offsets():
    """A with M*K > 2**31 elements and M*N > 2**31 output elements (int64 row offsets)."""
    m, n, k = 2**31 // 4096 + 1024, 4096, 4096
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    a = quantize(x, "fp8_block")
    del x
    b = _w(n, k, "fp8_block")
    y = gemm(a, b, torch.bfloat16, config=GemmConfig())
    from blockscaled.tensor import ScaledTensor

    lo = m - 256
    at = ScaledTensor(a.data[lo:], a.scale[lo:], a.format, torch.Size((256, k)), a.block, a.rounding)
    assert_gemm_close(y[lo:], _ref(at, b), "fp8_block", torch.bfloat16)


@pytest.mark.parametrize("fmt", FORMATS)
def test_deterministic_gpu(fmt):
    _, a = _a(64, 7168, fmt)
    b = _w(2112, 7168, fmt)
    ys = [gemm(a, b, torch.float32) for _ in range(3)]
    for y in ys[1:]:
        assert torch.equal(y.view(torch.int32), ys[0].view(torch.int32))


def test_torch_compile_fullgraph_inductor():
    _, a = _a(64, 1024, "fp8_block")
    b = _w(512, 1024, "fp8_block")
    x = randn_like_activations(64, 1024, device="cuda")
    bias = torch.randn(512, device="cuda", dtype=torch.bfloat16)

    def f(a, b, x, bias):
        return gemm(a, b) * 2, linear(x, b, bias)

    torch._dynamo.reset()
    y, z = torch.compile(f, fullgraph=True)(a, b, x, bias)
    assert_gemm_close(y / 2, _ref(a, b), "fp8_block", torch.bfloat16)
    assert_gemm_close(z, ref_gemm_mod.linear(x, b, bias), "fp8_block", torch.bfloat16)


@pytest.mark.parametrize("fmt", FORMATS)
def test_cuda_graph_capture(fmt):
    x = randn_like_activations(128, 2048, device="cuda")
    b = _w(1024, 2048, fmt)
    _, a = _a(128, 2048, fmt)
    out = torch.empty(128, 1024, dtype=torch.bfloat16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up (compiles kernels) outside the capture
        gemm(a, b, out=out)
        y0 = linear(x, b)
        yw0 = linear(x, b, weight_only=True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gemm(a, b, out=out)
        y = linear(x, b)
        yw = linear(x, b, weight_only=True)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert_gemm_close(out, _ref(a, b), fmt, torch.bfloat16)
    assert torch.equal(y, y0) and torch.equal(yw, yw0)


def _time(fn):
    """Median ms of CUDA-graph replays (the bench's method; tests/test_grouped_gpu.py does the
    same). Eager do_bench timings included Python launch overhead: it records the start event
    right after its L2-flush kernel, so host time spent before our launch counts as GPU time
    (mxfp4 2112x7168 M=4096 read 0.410 ms eager in one run, 0.203 ms graph-replayed)."""
    from blockscaled.bench.timing import time_op

    return time_op(lambda: fn(), [()], warmup=3, iterations=20).median_ms


def _host_us(fn, calls: int = 40, reps: int = 5) -> float:
    """Host (CPU) microseconds per call of ``fn`` while the GPU is busy: a long device sleep is
    queued first, so the calls only enqueue and never wait for the GPU; median of ``reps``."""
    import statistics
    import time

    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        torch.cuda._sleep(100_000_000)  # ~60 ms of GPU time: longer than the calls take to enqueue
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        ts.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(ts)


@pytest.mark.timing
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("nk", DSV3_NK, ids=lambda s: f"{s[0]}x{s[1]}")
def test_not_slower_than_dequant_matmul_m4096(fmt, nk):
    """The bar on the H100 (docs/design.md, 'The bar'): our op at M=4096 is not slower than dequantize + torch.matmul
    (5% timing noise allowed), both timed as CUDA-graph replays."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the bar is set for Hopper")
    n, k = nk
    _, a = _a(4096, k, fmt)
    b = _w(n, k, fmt)
    ours = _time(lambda: gemm(a, b))
    base = _time(lambda: torch.matmul(dequantize(a, torch.bfloat16), dequantize(b, torch.bfloat16).t()))
    from blockscaled import explain

    plan = explain("gemm", a, b)
    assert ours <= 1.05 * base, (f"{fmt} N={n} K={k}: ours {ours:.3f} ms vs dequant+matmul {base:.3f} ms "
                                 f"(CUDA-graph replays; plan: {plan.describe()})")


@pytest.mark.timing
@pytest.mark.parametrize("fmt", ("fp8_block", "mxfp8", "nvfp4"))
def test_eager_call_overhead(fmt):
    """The public call adds little host time over running the chosen config directly: host
    microseconds per eager call (GPU kept busy, so only the enqueue is timed) of ``gemm(a, b)``
    vs ``gemm(a, b, config=plan)`` with the Plan it runs, which skips planning. (H100 before the lean
    path: mxfp8 2112x7168 M=4096 gemm() 0.412 ms vs forced config 0.339 ms per call.)"""
    from blockscaled import explain

    n, k = 2112, 7168
    _, a = _a(4096, k, fmt)
    b = _w(n, k, fmt)
    cfg = explain("gemm", a, b)
    # alternating rounds, best of each: host timings drift between rounds (this test failed once
    # on the H100 right after the 8-worker GPU suite with gemm() 178 vs forced 142 us, and passed
    # twice when rerun alone: 167 vs 159, 235 vs 210), so neither side may profit from going first
    # It has failed before (NOTES 2026-11-22) (gemm() 259 vs forced 185 us). A rerun on the same H100 gave
    # 265/175, 292/214, 201/175 with gemm() measured first in each round, and cProfile timed the
    # same launcher code at 2x in whichever variant ran first after the sleep. So the order
    # alternates between rounds too, and there are four rounds.
    # One discarded round of each first: on the H200 (thirty-third session) the first round of
    # whichever variant ran first in a fresh process took ~1.7x its later rounds (gemm() 207 us,
    # then 120-131, forced 120-126; cProfile: the same per-call path for both).
    _host_us(lambda: gemm(a, b))
    _host_us(lambda: gemm(a, b, config=cfg))
    ours_ts, forced_ts = [], []
    for i in range(4):
        first, second = ((ours_ts, lambda: gemm(a, b)), (forced_ts, lambda: gemm(a, b, config=cfg)))[::1 - 2 * (i % 2)]
        first[0].append(_host_us(first[1]))
        second[0].append(_host_us(second[1]))
    ours, forced = min(ours_ts), min(forced_ts)
    print(f"{fmt}: host per call gemm() {ours:.1f} us, forced config {forced:.1f} us")
    assert ours <= 1.10 * forced + 5.0, (f"{fmt}: gemm() {ours:.1f} us vs forced {cfg.describe()} {forced:.1f} us "
                                         f"of host time")
