"""The MX / NV decode GEMV (strategy "gemv" with mxfp8 / mxfp4 / nvfp4 weights,
kernels/triton/mx_gemv.py): forced configs against the float64 reference on the interpreter (CPU)
or the GPU for every format x mode (weight-only bf16 / fp16 activations, W x A), with N / K / M
tails, K in several chunks, K not a multiple of 32 (odd K), bias and out dtypes, nvfp4 global
scales, NaN-poisoned outputs, NaN propagation and zero sizes; the fp4 decode's PTX checked by
emulating it on every byte; where the planner runs it (pure functions on an H100 DeviceInfo).
GPU-only: the planner's tiles through ``gemm`` / ``linear`` on model shapes, ``explain`` naming
the kernel, bitwise repeats, CUDA-graph replay. AOT sm_90 build: tests/test_aot_mx_gemv.py."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest
import torch

import blockscaled as bs
from blockscaled.config.gemm import GEMV_MAX_M, GemmConfig, gemv_slice_elems
from blockscaled.kernels.triton import mx_gemv as mx_mod
from blockscaled.ops.gemm import gemm
from blockscaled.plan import CPU_INTERPRETER, H100_SXM, DeviceInfo, Problem, plan_gemm
from blockscaled.plan.encoding import decode_plan, encode_plan
from blockscaled.plan import mx_gemv as plan_mx_gemv
from blockscaled.plan.mx_gemv import MX_GEMV_MAX_M, MX_GEMV_MAX_ROWS, mx_gemv_config
from blockscaled.reference import gemm as ref_gemm
from blockscaled.testing.tolerances import assert_gemm_close

from conftest import DEVICE, HAS_CUDA

FORMATS = ("mxfp8", "mxfp4", "nvfp4")
MODES = ("bf16", "fp16", "quantized")  # activations: weight-only bf16 / fp16, or quantized as B


def _gemv(bm, bn, bk, warps=4):
    return GemmConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=1, strategy="gemv")


def _operands(fmt, mode, m, n, k, seed=0, device=DEVICE, lead=()):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(*lead, m, k, generator=g)
    x[..., ::7] *= 8.0  # a few larger channels: the block scales differ
    w = torch.randn(n, k, generator=g) * 0.05
    b = bs.quantize(w.to(torch.bfloat16).to(device), fmt)
    if mode == "quantized":
        a = bs.quantize(x.to(torch.bfloat16).to(device), fmt)
    else:
        a = x.to(torch.float16 if mode == "fp16" else torch.bfloat16).to(device)
    return a, b


def _run(a, b, cfg, out_dtype=torch.bfloat16, bias=None):
    lead = tuple(a.shape[:-1])
    out = torch.full((*lead, b.shape[0]), float("nan"), device=b.data.device, dtype=out_dtype)
    gemm(a, b, out_dtype, out, config=cfg, bias=bias)
    return out


# (M, N, K, config): N tails (N % block_n), odd N, K tails (K % 32 != 0: element masks, odd K: the
# fp4 padding nibble), K in several chunks, M below / equal to / above block_m (row programs)
CASES = [
    (1, 5, 256, _gemv(1, 2, 128)),         # two chunks, N tail (3 programs of 2 rows)
    (2, 9, 160, _gemv(2, 8, 256)),         # one partial chunk (K % chunk != 0, K % 32 == 0), N tail
    (3, 7, 99, _gemv(4, 8, 128)),          # odd K, M < block_m
    (5, 6, 64, _gemv(8, 8, 128)),          # M < block_m = 8, 8-element slices
    (5, 3, 45, _gemv(2, 4, 128)),          # M > block_m (3 row programs), odd K
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_forced_configs(fmt, mode):
    for i, (m, n, k, cfg) in enumerate(CASES):
        if mode == "fp16" and i % 2:
            continue  # fp16 is bf16's path with another load dtype: half the cases
        a, b = _operands(fmt, mode, m, n, k, seed=m + n + k)
        out = _run(a, b, cfg)
        assert_gemm_close(out, ref_gemm.gemm(a, b), fmt, torch.bfloat16, what=f"{fmt} {mode} {m}x{n}x{k} {cfg}")


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_bias_out_dtypes_and_leading_dims(out_dtype):
    for fmt, mode in zip(FORMATS, ("quantized", "bf16", "fp16")):
        a, b = _operands(fmt, mode, 3, 11, 96, seed=4, lead=(1,))
        bias = torch.randn(11, device=DEVICE).to(out_dtype)
        out = _run(a, b, _gemv(2, 4, 128), out_dtype, bias)
        assert out.shape == (1, 3, 11)
        assert_gemm_close(out.view(3, 11), ref_gemm.gemm(a, b, bias=bias).view(3, 11), fmt, out_dtype,
                          what=f"{fmt} {mode}")


def test_nvfp4_global_scales():
    """Both global scales far from 1: the product is divided by gs_a * gs_b (gs_b weight-only)."""
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(2, 200, generator=g) * 30).to(torch.bfloat16).to(DEVICE)
    w = (torch.randn(9, 200, generator=g) * 1e-3).to(torch.bfloat16).to(DEVICE)
    b = bs.quantize(w, "nvfp4")  # computed gs ~ 448 * 6 / amax: large
    assert b.global_scale.item() > 1e4
    for a in (x, bs.quantize(x, "nvfp4"), bs.quantize(x, "nvfp4", global_scale=0.37)):
        for out_dtype in (torch.bfloat16, torch.float32):
            out = _run(a, b, _gemv(2, 2, 256), out_dtype)
            assert_gemm_close(out, ref_gemm.gemm(a, b), "nvfp4", out_dtype)


def test_nan_propagates_and_zero_sizes():
    for fmt in FORMATS:
        a, b = _operands(fmt, "bf16", 2, 6, 64, seed=1)
        if fmt == "nvfp4":
            b.scale.view(torch.uint8)[3, 1] = 0x7F  # e4m3 NaN scale: row 3
        else:
            b.scale[3, 1] = 255  # E8M0 NaN: row 3
        a[1, 5] = float("nan")  # activation row 1
        if fmt == "mxfp8":
            b.data.view(torch.uint8)[4, 40] = 0x7F  # e4m3 NaN data: row 4
        out = _run(a, b, _gemv(2, 2, 128), torch.float32).cpu()
        nan = torch.isnan(out)
        cols = [3, 4] if fmt == "mxfp8" else [3]
        want = torch.zeros_like(nan)
        want[:, cols] = True
        want[1] = True
        assert torch.equal(nan, want), (fmt, nan)
        # zero sizes: M = 0 and N = 0 launch nothing; K = 0 gives the bias
        for m, n, k in ((0, 6, 64), (2, 0, 64), (2, 6, 0)):
            a0, b0 = _operands(fmt, "quantized", m, n, k)
            bias = torch.arange(n, dtype=torch.float32, device=DEVICE)
            out = _run(a0, b0, _gemv(2, 2, 128), torch.float32, bias)
            assert out.shape == (m, n) and torch.equal(out.cpu(), bias.cpu().expand(m, n))


def test_config_validation():
    a, b = _operands("mxfp4", "bf16", 1, 32, 64)
    with pytest.raises(ValueError, match="block_n"):
        gemm(a, b, config=_gemv(1, 16, 128))
    with pytest.raises(ValueError, match="block_m"):
        _gemv(2 * GEMV_MAX_M, 4, 128)
    assert [gemv_slice_elems(m) for m in (1, 2, 4, 8)] == [32, 32, 16, 8]


# ------------------------------------------------------------------------ the fp4 decode's PTX
def _prmt(a, b, sel):
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        s = (sel >> (4 * i)) & 0xF
        byte = src[s & 7]
        if s & 8:  # sign-replicate mode
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _lop3(a, b, c, lut):
    out = 0
    for bit in range(32):
        idx = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
        out |= ((lut >> idx) & 1) << bit
    return out


def _emulate(asm: str, word: int) -> list[float]:
    """Run _FP4_ASM's instructions on one 32-bit input ($8); returns $0-$7 as floats."""
    regs = {"$8": word}

    def val(tok):
        tok = tok.strip()
        return regs[tok] if tok in regs else int(tok, 0)

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line[0] in "{}." or line.startswith("//"):
            continue
        op, args = line.split(None, 1)
        if op == "mov.b32":  # mov.b32 {h0, h1}, f
            dst, src = args.split("},")
            h0, h1 = (t.strip() for t in dst.strip("{ ").split(","))
            v = val(src)
            regs[h0], regs[h1] = v & 0xFFFF, v >> 16
            continue
        ops = [t.strip() for t in args.split(",")]
        d, s = ops[0], ops[1:]
        if op == "and.b32":
            r = val(s[0]) & val(s[1])
        elif op == "shr.u32":
            r = val(s[0]) >> val(s[1])
        elif op == "shl.b32":
            r = (val(s[0]) << val(s[1])) & 0xFFFFFFFF
        elif op == "prmt.b32":
            r = _prmt(val(s[0]), val(s[1]), val(s[2]))
        elif op == "lop3.b32":
            r = _lop3(val(s[0]), val(s[1]), val(s[2]), val(s[3]))
        elif op == "cvt.f32.f16":
            r = float(np.frombuffer(struct.pack("<H", val(s[0])), dtype=np.float16)[0])
        else:
            raise AssertionError(f"unknown instruction {op}")
        regs[d] = r
    return [regs[f"${i}"] for i in range(8)]


def test_fp4_ptx_decode_every_byte():
    """_FP4_ASM (PRMT table, sign bits, f16 -> f32) gives every e2m1 code's value, for every byte
    value in every byte position of the packed word ($0-$3: low nibbles, $4-$7: high nibbles)."""
    e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    value = [e2m1[c & 7] * (-1.0 if c & 8 else 1.0) for c in range(16)]
    asm = str(mx_mod._FP4_ASM.value if hasattr(mx_mod._FP4_ASM, "value") else mx_mod._FP4_ASM)
    assert re.search(r"\$8", asm)
    rng = np.random.default_rng(0)
    for byte in range(256):
        for pos in range(4):
            word = int(rng.integers(0, 2**32)) & ~(0xFF << (8 * pos)) | (byte << (8 * pos))
            got = _emulate(asm, word)
            for p in range(4):
                bp = (word >> (8 * p)) & 0xFF
                want_lo, want_hi = value[bp & 15], value[bp >> 4]
                assert got[p] == want_lo and np.signbit(got[p]) == np.signbit(want_lo), (hex(word), p)
                assert got[4 + p] == want_hi and np.signbit(got[4 + p]) == np.signbit(want_hi), (hex(word), p)


# ------------------------------------------------------------------------------ the planner
def test_gemv_on_by_default():
    """Unless BLOCKSCALED_MX_KERNELS leaves it out, the planner runs the GEMV (on the Triton releases
    of MX_GEMV_TRITON); ``none`` switches it off, ``bf16`` alone leaves it out."""
    import os

    from blockscaled._experimental import _parse
    from blockscaled.plan import mx_gemv

    assert "gemv" in _parse("gemv") and not _parse("none") and _parse("bf16") == {"bf16"}
    assert _parse("all") == {"gemv", "bf16", "stream", "tiled", "direct"} and _parse("gemv,stream") == {"gemv", "stream"}
    if "BLOCKSCALED_MX_KERNELS" not in os.environ:
        assert mx_gemv.MX_GEMV_ENABLED
    assert mx_gemv.MX_GEMV_ROWS_BY_RELEASE[(3, 6)] == {"mxfp8": 2, "mxfp4": 2, "nvfp4": 1}
    assert mx_gemv.MX_GEMV_ROWS_BY_RELEASE[(3, 8)] == {"mxfp8": 1, "mxfp4": 0, "nvfp4": 0}


def test_gemv_only_on_releases_whose_build_holds(mx_kernels, monkeypatch):
    """Switched on, the GEMV still runs only on the Triton releases of MX_GEMV_TRITON (3.6: the
    layout checks of tests/test_aot_mx_gemv.py; 3.7 / 3.8: mxfp8 at one row, measured), with that release's
    rows; elsewhere the other plans stay."""
    from blockscaled.plan import mx_gemv

    assert mx_gemv.use_mx_gemv("mxfp4", 1, 2880)
    monkeypatch.setattr(mx_gemv, "MX_GEMV_ROWS", mx_gemv.MX_GEMV_ROWS_BY_RELEASE[(3, 8)])
    assert mx_gemv.use_mx_gemv("mxfp8", 1, 2880)
    assert not mx_gemv.use_mx_gemv("mxfp8", 2, 2880)
    assert not mx_gemv.use_mx_gemv("mxfp4", 1, 2880) and not mx_gemv.use_mx_gemv("nvfp4", 1, 2880)
    monkeypatch.setattr(mx_gemv, "_TRITON_OK", False)
    assert not mx_gemv.use_mx_gemv("mxfp4", 1, 2880) and not mx_gemv.use_mx_gemv("mxfp8", 1, 2880)
    assert mx_gemv.MX_GEMV_TRITON == ((3, 6), (3, 7), (3, 8)) == tuple(mx_gemv.MX_GEMV_ROWS_BY_RELEASE)
    assert mx_gemv.MX_GEMV_ROWS_BY_RELEASE[(3, 7)] == mx_gemv.MX_GEMV_ROWS_BY_RELEASE[(3, 8)]
    import triton

    assert ".".join(map(str, mx_gemv._triton_release())) == ".".join(triton.__version__.split(".")[:2])


def test_planner_runs_the_gemv_at_small_m(mx_kernels):
    """On an H100 (and any CUDA GPU) the MX / NV dense GEMM takes the GEMV for 1 <= M <=
    MX_GEMV_ROWS[fmt] in both modes, with mx_gemv_config's tiles; above it the previous rules; the CPU
    interpreter keeps the portable kernel. Every plan round-trips through the custom-op encoding."""
    a100 = DeviceInfo("cuda", 108, (8, 0), 166912, name="NVIDIA A100")
    for fmt in FORMATS:
        for n, k in ((2880, 2880), (28672, 8192), (5120, 17920), (7, 45), (100, 1000)):
            for a in ("quantized", "bfloat16", "float16"):
                for m in (1, 2, 3, 8, 9, 16, 64):
                    for dev in (H100_SXM, a100):
                        p = Problem("gemm", fmt, m, n, k, a=a)
                        plan = plan_gemm(p, dev)
                        assert decode_plan(encode_plan(plan)) == plan
                        if m <= plan_mx_gemv.MX_GEMV_ROWS[fmt]:  # the fixture's (3.6's) rows
                            assert plan.kernel == "gemv" and plan.config == mx_gemv_config(fmt, m, n, k, dev), plan
                            assert "mx_gemv.py" in str(plan) and "mx_decode" in str(plan)
                        else:
                            assert plan.kernel != "gemv", plan
                    interp = Problem("gemm", fmt, m, n, k, a=a, interpret=True)
                    assert plan_gemm(interp, CPU_INTERPRETER).kernel == "portable"
        for extra in ({"bias": True}, {"out_dtype": "float32"}, {"out_dtype": "float16"}):
            assert plan_gemm(Problem("gemm", fmt, 1, 4096, 4096, **extra), H100_SXM).kernel == "gemv"
    # K = 0: nothing to stream, the previous rule
    assert plan_gemm(Problem("gemm", "mxfp4", 1, 64, 0), H100_SXM).kernel != "gemv"
    # fp8_block keeps its own GEMV rule (M = 1, quantized A only)
    assert plan_gemm(Problem("gemm", "fp8_block", 2, 4096, 4096), H100_SXM).kernel != "gemv"


@pytest.mark.parametrize("fmt", FORMATS)
def test_gemv_tiles(fmt):
    """mx_gemv_config: block_m = M rounded up; one slice per thread with as many threads as the row
    has slices (32..128); rows per program by the chunk size and the program count."""
    for m in range(1, MX_GEMV_MAX_M + 1):
        for n, k in ((2880, 2880), (5760, 2880), (8192, 8192), (28672, 8192), (4096, 14336), (5120, 17920),
                     (6144, 4096), (7, 45), (300, 100)):
            c = mx_gemv_config(fmt, m, n, k, H100_SXM)
            eps = gemv_slice_elems(c.block_m)
            assert c.strategy == "gemv" and c.block_m >= m and c.block_m & (c.block_m - 1) == 0
            assert c.block_k == 32 * c.num_warps * eps and 1 <= c.num_warps <= 4
            assert 1 <= c.block_n <= (MX_GEMV_MAX_ROWS if k % 32 == 0 else 2)
            if k >= 128 * eps:
                assert c.num_warps == 4  # long rows: the most threads, K walked in chunks
    c = mx_gemv_config("mxfp4", 1, 2880, 2880, H100_SXM)
    assert (c.block_n, c.block_k, c.num_warps) == (8, 4096, 4)  # 90 slices: one chunk of 11.5 KB
    assert mx_gemv_config("mxfp4", 1, 28672, 8192, H100_SXM).block_n == 8  # 2 KB per row and chunk
    assert mx_gemv_config("mxfp8", 1, 28672, 8192, H100_SXM).block_n == 4  # 4 KB


# ----------------------------------------------------------------------------------------- GPU
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")

SHAPES = [(2880, 2880), (5120, 17920), (6144, 4096)]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["bf16", "quantized"])
def test_planner_plan_through_gemm_and_linear_gpu(fmt, mode, mx_kernels):
    """The planner's GEMV on model shapes: explain names it, the result matches the reference, the
    GEMV is bitwise repeatable; linear() (weight-only or quantizing x) runs the same kernel."""
    for n, k in SHAPES:
        for m in range(1, plan_mx_gemv.MX_GEMV_ROWS[fmt] + 1):
            a, b = _operands(fmt, mode, m, n, k, seed=n + m, device="cuda")
            plan = bs.explain("gemm", a, b)
            assert plan.kernel == "gemv" and "mx_gemv.py" in str(plan), plan
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            gemm(a, b, out=out)
            assert_gemm_close(out, ref_gemm.gemm(a, b), fmt, torch.bfloat16, what=f"{m}x{n}x{k}")
            again = torch.full_like(out, float("nan"))
            gemm(a, b, out=again)
            assert torch.equal(out, again), "not bitwise repeatable"
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            wo = mode == "bf16"
            lp = bs.explain("linear", x, b, weight_only=wo)
            assert lp.kernel == "gemv", lp
            y = bs.linear(x, b, weight_only=wo)
            ref = ref_gemm.linear(x, b, weight_only=wo)
            assert_gemm_close(y, ref, fmt, torch.bfloat16, what=f"linear {m}x{n}x{k}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_forced_tiles_gpu(fmt):
    """Every block_m / slice, several chunk sizes and warps, odd K (byte loads) on the GPU."""
    for m, n, k in ((1, 257, 1000), (2, 300, 2880), (4, 130, 4097), (8, 64, 8192), (7, 33, 96)):
        for mode in ("bf16", "quantized"):
            a, b = _operands(fmt, mode, m, n, k, seed=m + k, device="cuda")
            bm = min(8, 1 << (m - 1).bit_length())
            for bn, warps in ((1, 1), (4, 2), (8, 4)):
                cfg = _gemv(bm, bn, 32 * warps * gemv_slice_elems(bm), warps)
                out = _run(a, b, cfg)
                assert_gemm_close(out, ref_gemm.gemm(a, b), fmt, torch.bfloat16, what=f"{mode} {m}x{n}x{k} {cfg}")


@pytest.mark.gpu
@gpu
def test_cuda_graph_replay_gpu():
    n, k = 2880, 2880
    a, b = _operands("mxfp4", "quantized", 1, n, k, seed=11, device="cuda")
    a2, _ = _operands("mxfp4", "quantized", 1, n, k, seed=12, device="cuda")
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
    assert_gemm_close(out, ref_gemm.gemm(a2, b), "mxfp4", torch.bfloat16)
