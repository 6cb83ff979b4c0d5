"""The MX/NV bf16 tile paths of the portable kernel: the in-register dequantization straight to bf16
(kernels/triton/_mma.py: ``fp4_bf16``, ``scale_bf16``) and the tiles that use it (swap-AB with the
weight as the wgmma's register operand, weight-only A included; non-swapped tiles; fused split-K).

* decode helpers: the fp4 bit patterns and the scale factors for every byte / every scale code
  (integer ops: also in the interpreter); the bf16 products of every (element, scale) pair equal the
  reference dequantization rounded once to bf16 (GPU only: the interpreter's bf16 arithmetic is wrong);
* GEMMs against the float64 reference, NaN-poisoned outputs, every format x (W x A, weight-only)
  x (swap-AB, plain) x (unsplit, split-K), odd N and odd K, zero sizes, extreme scales (E8M0 codes
  0..3 and 251..254, e4m3 subnormal nvfp4 scales), NaN codes. On the CPU these run the interpreter,
  which keeps the fp32 decode (``INTERPRETING``): they check the tile plumbing there and the bf16
  decode on a GPU.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from blockscaled.config import GemmConfig
from blockscaled.kernels.triton._mma import BF16_2POW126, FMT_MXFP4, FMT_MXFP8, FMT_NVFP4, fp4_bf16, scale_bf16
from blockscaled.ops.gemm import gemm
from blockscaled.reference import gemm as ref_gemm_mod
from blockscaled.reference.quantize import dequantize, quantize
from blockscaled.tensor import ScaledTensor
from blockscaled.testing.inputs import randn_like_activations
from blockscaled.testing.tolerances import assert_gemm_close

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
MX_NV = ("mxfp8", "mxfp4", "nvfp4")


def _bits(x: torch.Tensor) -> torch.Tensor:
    """bf16 bit patterns as int32 (NaNs canonicalised to one value so that they compare equal)."""
    b = x.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
    return torch.where(torch.isnan(x.float()), torch.full_like(b, 0x7FC0), b)


def _canon_nan(bits: torch.Tensor) -> torch.Tensor:
    """bf16 bit patterns (int32) with every NaN replaced by 0x7FC0 (payloads and signs of NaN are
    outside the contract)."""
    nan = ((bits & 0x7F80) == 0x7F80) & ((bits & 0x7F) != 0)
    return torch.where(nan, torch.full_like(bits, 0x7FC0), bits)


# ----------------------------------------------------------------------------- decode helpers
@triton.jit
def _fp4_bits_kernel(in_ptr, out_ptr, H: tl.constexpr):
    r = tl.arange(0, 2)[:, None]
    byte = tl.load(in_ptr + r * H + tl.arange(0, H)[None, :])
    v = fp4_bf16(byte)
    tl.store(out_ptr + r * (2 * H) + tl.arange(0, 2 * H)[None, :], v.to(tl.int16, bitcast=True))


def test_fp4_bf16_patterns_every_byte(device):
    """fp4_bf16 (integer ops and a bitcast: the interpreter runs it too): byte b -> the bf16 of
    ``e2m1(b & 15) * 2**-126`` then ``e2m1(b >> 4) * 2**-126``, for all 256 bytes."""
    byte = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(2, 128).to(device)
    out = torch.zeros(2, 256, dtype=torch.int16, device=device)
    _fp4_bits_kernel[(1,)](byte, out, H=128)
    codes = torch.stack([torch.arange(256) & 15, torch.arange(256) >> 4], -1).view(-1)
    want = _bits(torch.tensor(E2M1, dtype=torch.float64)[codes] * 2.0 ** -126)  # exact in bf16
    got = out.cpu().view(-1).to(torch.int32) & 0xFFFF
    assert torch.equal(got, want), [(i, hex(g), hex(w)) for i, (g, w) in enumerate(zip(got.tolist(), want.tolist()))
                                    if g != w][:8]


@triton.jit
def _scale_bits_kernel(in_ptr, out_ptr, FMT: tl.constexpr):
    i = tl.arange(0, 256)
    s = tl.load(in_ptr + i)
    tl.store(out_ptr + i, scale_bf16(s, FMT).to(tl.int16, bitcast=True))


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_scale_bf16_every_code(fmt, device):
    """E8M0: 2**(e-127) for all 256 codes (2**-127 is bf16's subnormal 0x0040, 255 NaN); e4m3 (nvfp4):
    ``s * 2**118`` for all 256 codes (exact; NaN codes stay NaN)."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    if fmt == "nvfp4":
        inp = codes.view(torch.float8_e4m3fn)
        want = _bits(inp.double() * 2.0 ** 118)
    else:
        inp = codes
        want = _bits(torch.where(codes == 255, float("nan"), torch.exp2(codes.double() - 127)))
    out = torch.zeros(256, dtype=torch.int16, device=device)
    _scale_bits_kernel[(1,)](inp.to(device), out, FMT={"mxfp4": FMT_MXFP4, "nvfp4": FMT_NVFP4}[fmt])
    got = _canon_nan(out.cpu().to(torch.int32) & 0xFFFF)
    assert torch.equal(got, want), [(i, hex(g), hex(w)) for i, (g, w) in enumerate(zip(got.tolist(), want.tolist()))
                                    if g != w][:8]


@triton.jit
def _product_kernel(data_ptr, scale_ptr, out_ptr, FMT: tl.constexpr, NB: tl.constexpr):
    """out[e, j] = bf16 dequantization of data byte / element j with scale code e (all pairs)."""
    e = tl.arange(0, 256)[:, None]
    s = scale_bf16(tl.load(scale_ptr + e), FMT)
    if FMT == FMT_MXFP8:
        v = tl.load(data_ptr + tl.arange(0, NB)[None, :]).to(tl.float32).to(tl.bfloat16)
        w = v * s
        tl.store(out_ptr + e * NB + tl.arange(0, NB)[None, :], w.to(tl.int16, bitcast=True))
    else:
        byte = tl.load(data_ptr + tl.arange(0, NB)[None, :] + e * 0)
        v = fp4_bf16(byte)
        if FMT == FMT_MXFP4:
            v = v * tl.full([1, 1], BF16_2POW126, tl.int16).to(tl.bfloat16, bitcast=True)
        w = v * s
        tl.store(out_ptr + e * (2 * NB) + tl.arange(0, 2 * NB)[None, :], w.to(tl.int16, bitcast=True))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", MX_NV)
def test_bf16_products_every_pair(fmt):
    """Every (element code, scale code) product of the bf16 decode equals the exact product rounded
    once to bf16: exact for mxfp4 (multiples of 2**-128) and nvfp4 (scaled by 2**-8, >= 2**-18);
    mxfp8 rounds only e4m3 subnormals times E8M0 codes < 8 (below 2**-126, not multiples of 2**-133)."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    scales = codes.view(torch.float8_e4m3fn) if fmt == "nvfp4" else codes
    code = {"mxfp8": FMT_MXFP8, "mxfp4": FMT_MXFP4, "nvfp4": FMT_NVFP4}[fmt]
    if fmt == "mxfp8":
        data = codes.view(torch.float8_e4m3fn)
        vals = data.double()
        out = torch.zeros(256, 256, dtype=torch.int16, device="cuda")
    else:
        data = codes
        lohi = torch.stack([torch.arange(256) & 15, torch.arange(256) >> 4], -1).view(-1)
        vals = torch.tensor(E2M1, dtype=torch.float64)[lohi]
        out = torch.zeros(256, 512, dtype=torch.int16, device="cuda")
    _product_kernel[(1,)](data.cuda(), scales.cuda(), out, FMT=code, NB=256)
    if fmt == "nvfp4":
        sv = scales.double() * 2.0 ** -8
    else:
        sv = torch.where(codes == 255, float("nan"), torch.exp2(codes.double() - 127))
    # exact products are fp32 values (>= 2**-136); fp32 -> bf16 is the one rounding
    want = _bits((sv[:, None] * vals[None, :]).float())
    got = _canon_nan(out.cpu().to(torch.int32) & 0xFFFF)
    bad = (got != want).nonzero()
    assert bad.numel() == 0, [(int(i), int(j), hex(int(got[i, j])), hex(int(want[i, j]))) for i, j in bad[:8]]


# ----------------------------------------------------------------------------- GEMMs
def _operands(fmt, m, n, k, device, weight_only, seed=0):
    x = randn_like_activations(m, k, dtype=torch.bfloat16, device=device, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    b = quantize((torch.randn(n, k, generator=g) * 0.05).to(device), fmt)
    return (x if weight_only else quantize(x, fmt)), b


def _configs(weight_only):
    """The bf16-dequantizing tile classes: swap-AB 16-row (one and two warpgroups of weight rows,
    K chunks 64 / 128 / 256), a 32-row swap tile, a plain 16x64 and 64x64 tile, each also split."""
    c = GemmConfig(block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=3, promote=False, swap_ab=True)
    out = [c, c.replace(block_k=64, split_k=3), c.replace(block_k=256, num_stages=2),
           c.replace(block_m=32, block_n=128, num_warps=8, split_k=2),
           c.replace(swap_ab=False), c.replace(block_m=64, swap_ab=False, split_k=3)]
    return out


@pytest.mark.parametrize("weight_only", [False, True], ids=["WxA", "weight_only"])
@pytest.mark.parametrize("fmt", MX_NV)
def test_tiles_match_reference(fmt, weight_only, device):
    """Odd N (a partial weight tile), K not a multiple of any chunk (odd for fp4: the padding
    nibble is poisoned), M not a multiple of the tile; fp32 and bf16 outputs, bias."""
    m, n, k = 19, 75, 299 if fmt != "mxfp8" else 300
    a, b = _operands(fmt, m, n, k, device, weight_only)
    if fmt != "mxfp8":  # poison the padding nibble of the last byte (element K)
        d = b.data.clone()
        d[:, -1] |= 0xF0
        b = ScaledTensor(d, b.scale, b.format, b.shape, b.block, b.rounding, global_scale=b.global_scale)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(7)).to(device)
    ref = ref_gemm_mod.gemm(a, b, bias=bias)
    cfgs = _configs(weight_only)
    if device == "cpu":  # the interpreter runs the fp32 decode: the tile plumbing (swap, split, plain) only
        cfgs = [cfgs[0], cfgs[1], cfgs[5]]
    for i, cfg in enumerate(cfgs):
        for out_dtype in (torch.float32, torch.bfloat16)[:2 if device != "cpu" or i == 0 else 1]:
            out = torch.full((m, n), float("nan"), dtype=out_dtype, device=device)
            gemm(a, b, out_dtype, out=out, config=cfg, bias=bias)
            assert_gemm_close(out, ref, fmt, out_dtype, what=f"{'wo' if weight_only else 'wxa'} {cfg}")


@pytest.mark.parametrize("fmt", MX_NV)
def test_zero_sizes(fmt, device):
    """M = 0 and N = 0 launch nothing; K = 0 writes zeros (+ bias) through every split."""
    cfg = _configs(True)[0]
    for weight_only in (False, True):
        for m, n, k in ((0, 64, 128), (8, 0, 128)):
            a, b = _operands(fmt, m, n, k, device, weight_only)
            assert gemm(a, b, config=cfg).shape == (m, n)
        a, b = _operands(fmt, 8, 40, 0, device, weight_only)
        bias = torch.randn(40).to(device)
        for c in (cfg, cfg.replace(split_k=2), cfg.replace(swap_ab=False)):
            out = torch.full((8, 40), float("nan"), dtype=torch.float32, device=device)
            gemm(a, b, torch.float32, out=out, config=c, bias=bias)
            assert torch.equal(out.cpu(), bias.cpu().expand(8, 40)), c


def _with_scales(t: ScaledTensor, scale: torch.Tensor, data: torch.Tensor | None = None) -> ScaledTensor:
    return ScaledTensor(t.data if data is None else data, scale, t.format, t.shape, t.block, t.rounding,
                        global_scale=t.global_scale)


def _random_codes(shape, gen, fmt, max_mag, fill=0x38):
    """Random element codes with |value| <= max_mag (e2m1 bytes or e4m3 codes), no NaN; e4m3 codes
    out of range become ``fill`` (0x38 = 1.0)."""
    if fmt == "mxfp8":
        c = torch.randint(0, 256, shape, generator=gen, dtype=torch.int32)
        v = c.to(torch.uint8).view(torch.float8_e4m3fn).float()
        c = torch.where(v.isnan() | (v.abs() > max_mag), fill, c)
        return c.to(torch.uint8).view(torch.float8_e4m3fn)
    mags = [i for i, v in enumerate(E2M1[:8]) if v <= max_mag]
    lo = torch.tensor(mags)[torch.randint(0, len(mags), shape, generator=gen)] | (
        torch.randint(0, 2, shape, generator=gen) << 3)
    hi = torch.tensor(mags)[torch.randint(0, len(mags), shape, generator=gen)] | (
        torch.randint(0, 2, shape, generator=gen) << 3)
    return (lo | (hi << 4)).to(torch.uint8)


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4"])
def test_extreme_e8m0_scales(fmt, device):
    """A's blocks at E8M0 codes 251..254 (elements <= 1.5: 1.5 * 2**127 is finite), B's at the
    bottom (mxfp4 codes 0..3: down to 2**-128, bf16 / fp32 subnormal weights, all exact in bf16;
    mxfp8 codes 3..6: the lowest where every e4m3 product is a multiple of 2**-133, see
    _mma.scale_bf16): products near 1. Weight-only: bf16 activations near 2**107 times the same
    tiny weights."""
    m, n, k = 11, 70, 256
    gen = torch.Generator().manual_seed(3)
    a0, b0 = _operands(fmt, m, n, k, device, weight_only=False)
    kd = k if fmt == "mxfp8" else k // 2
    a_data = _random_codes((m, kd), gen, fmt, 1.5)
    b_data = _random_codes((n, kd), gen, fmt, 6.0)
    lo = 3 if fmt == "mxfp8" else 0
    a_sc = torch.randint(251, 255, a0.scale.shape, generator=gen).to(torch.uint8)
    b_sc = torch.randint(lo, lo + 4, b0.scale.shape, generator=gen).to(torch.uint8)
    a = _with_scales(a0, a_sc.to(device), a_data.to(device))
    b = _with_scales(b0, b_sc.to(device), b_data.to(device))
    x = (dequantize(a).float() * 2.0 ** -20).to(torch.bfloat16)  # weight-only: bf16 activations near 2**107
    assert torch.isfinite(dequantize(a)).all() and torch.isfinite(x.float()).all()
    for lhs in (a, x):
        ref = ref_gemm_mod.gemm(lhs, b)
        assert torch.isfinite(ref).all() and ref.abs().max() > 1e-9
        for cfg in _configs(lhs is x)[:2] + _configs(lhs is x)[4:5]:
            out = torch.full((m, n), float("nan"), dtype=torch.float32, device=device)
            gemm(lhs, b, torch.float32, out=out, config=cfg)
            assert_gemm_close(out, ref, fmt, torch.float32, what=f"{'wo' if lhs is x else 'wxa'} {cfg}")


def test_mxfp8_lowest_scales_round_like_bf16_operands(device):
    """mxfp8 weights at E8M0 codes 0..2 with small e4m3 elements: the products fall below 2**-126 off
    bf16's subnormal grid (2**-133), so the bf16 decode rounds them to nearest even (_mma.scale_bf16,
    the same single rounding as the earlier fp32 decode + cvt): on a GPU the GEMM equals the product
    of the bf16-rounded dequantized operands; the interpreter's fp32 decode equals the exact one."""
    m, n, k = 7, 64, 128
    gen = torch.Generator().manual_seed(9)
    a0, b0 = _operands("mxfp8", m, n, k, device, weight_only=False)
    a = _with_scales(a0, torch.randint(250, 253, a0.scale.shape, generator=gen).to(torch.uint8).to(device),
                     _random_codes((m, k), gen, "mxfp8", 1.5).to(device))
    b = _with_scales(b0, torch.randint(0, 3, b0.scale.shape, generator=gen).to(torch.uint8).to(device),
                     _random_codes((n, k), gen, "mxfp8", 0.1, fill=0x09).to(device))  # 0x09: 1.125 * 2**-6
    exact = ref_gemm_mod.gemm(a, b)
    rounded = dequantize(a).to(torch.bfloat16).double() @ dequantize(b).to(torch.bfloat16).double().T
    assert (rounded - exact).abs().max() > 1e-3 * exact.abs().max()  # the case discriminates
    want = exact if device == "cpu" else rounded
    for cfg in _configs(False)[:2] + _configs(False)[4:5]:
        out = torch.full((m, n), float("nan"), dtype=torch.float32, device=device)
        gemm(a, b, torch.float32, out=out, config=cfg)
        assert_gemm_close(out, want, "mxfp8", torch.float32, what=str(cfg))


def test_nvfp4_subnormal_and_large_scales(device):
    """nvfp4 block scales that are e4m3 subnormals (2**-9 .. 7 * 2**-9) and near the top (448):
    the decode's 2**-8 shift keeps every product a normal bf16 and is undone exactly."""
    m, n, k = 9, 66, 320
    gen = torch.Generator().manual_seed(5)
    a0, b0 = _operands("nvfp4", m, n, k, device, weight_only=False)
    sub = torch.randint(1, 8, b0.scale.shape, generator=gen).to(torch.uint8)           # e4m3 subnormals
    big = torch.randint(0x7A, 0x7F, b0.scale.shape, generator=gen).to(torch.uint8)     # 320 .. 448
    pick = torch.randint(0, 2, b0.scale.shape, generator=gen).bool()
    b = _with_scales(b0, torch.where(pick, sub, big).view(torch.float8_e4m3fn).to(device))
    a_sub = torch.randint(1, 8, a0.scale.shape, generator=gen).to(torch.uint8).view(torch.float8_e4m3fn)
    a = _with_scales(a0, a_sub.to(device))
    x = randn_like_activations(m, k, dtype=torch.bfloat16, device=device, seed=1)
    for lhs in (a, x):
        ref = ref_gemm_mod.gemm(lhs, b)
        for cfg in _configs(lhs is x)[:2] + _configs(lhs is x)[4:5]:
            for out_dtype in (torch.float32, torch.bfloat16):
                out = torch.full((m, n), float("nan"), dtype=out_dtype, device=device)
                gemm(lhs, b, out_dtype, out=out, config=cfg)
                assert_gemm_close(out, ref, "nvfp4", out_dtype, what=f"{'wo' if lhs is x else 'wxa'} {cfg}")


@pytest.mark.parametrize("fmt", MX_NV)
def test_nan_codes_propagate(fmt, device):
    """A NaN scale code (E8M0 255, e4m3 0x7F) or NaN element (mxfp8 e4m3 0x7F) poisons exactly the
    output rows / columns it feeds, on the bf16 decode path as on the reference."""
    m, n, k = 6, 70, 128
    a, b = _operands(fmt, m, n, k, device, weight_only=False)
    nan_scale = 255 if fmt != "nvfp4" else 0x7F
    sc = b.scale.view(torch.uint8).clone()
    sc[3, 1] = nan_scale
    b = _with_scales(b, sc.view(b.scale.dtype))
    if fmt == "mxfp8":
        d = b.data.view(torch.uint8).clone()
        d[40, 5] = 0x7F
        b = _with_scales(b, b.scale, d.view(torch.float8_e4m3fn))
    x = randn_like_activations(m, k, dtype=torch.bfloat16, device=device, seed=2)
    for lhs in (a, x):
        ref = ref_gemm_mod.gemm(lhs, b)
        for cfg in _configs(lhs is x)[:2] + _configs(lhs is x)[4:5]:
            out = gemm(lhs, b, torch.float32, config=cfg).cpu()
            ref = ref.cpu()
            assert torch.equal(out.isnan(), ref.isnan()), cfg
            fin = ~ref.isnan()
            assert_gemm_close(out[:, fin.all(0)], ref[:, fin.all(0)], fmt, torch.float32, what=str(cfg))


# ----------------------------------------------------------------------------- planner
def test_mx_bf16_rules_off_by_default():
    """Until the bf16 kernels have run on a GPU the planner keeps the earlier MX/NV plans
    (blockscaled._experimental)."""
    from blockscaled.plan import H100_SXM
    from blockscaled.plan import portable as pp

    if pp.MX_BF16_ENABLED:
        pytest.skip("BLOCKSCALED_MX_KERNELS switches the bf16 rules on in this process")
    assert not pp.mx_bf16_applies("mxfp4", 16, H100_SXM, None)
    cfg = pp.choose_portable("nvfp4", 64, 7168, 16384, H100_SXM, None, torch.bfloat16)
    assert cfg == pp.choose_portable("nvfp4", 64, 7168, 16384, H100_SXM, None, torch.bfloat16, mx_bf16=False)


def test_mx_bf16_rules_on_h100(mx_kernels):
    """plan.portable's MX/NV bf16 rules (MX_BF16_*): promote=False bf16 tiles for 8 < M <= 512 in both
    modes (weight-only gets the same tiles, swap-AB included), block_m fitted to M, the K split within
    MX_BF16_PROGRAMS_PER_SM x SMs programs with >= MX_BF16_MIN_CHUNKS chunks per split; not for fp16
    activations (promote), M <= 8, fp8_block or GPUs before sm_90; explain() says which rule ran."""
    import dataclasses
    import math

    from blockscaled.plan import H100_SXM, Problem, plan_gemm
    from blockscaled.plan import portable as pp
    from blockscaled.plan.splits import split_plan

    for fmt in MX_NV:
        for a in ("quantized", "bfloat16"):
            for m in (9, 16, 32, 64, 128):
                for n, k in ((2880, 2880), (7168, 16384), (28672, 8192)):
                    plan = plan_gemm(Problem("gemm", fmt, m, n, k, a=a), H100_SXM)
                    c = plan.config
                    if c.strategy == "dequant_matmul":
                        continue
                    if c.strategy == "stream":  # plan/stream.py takes these first
                        assert m <= 64, (fmt, a, m, c)
                        continue
                    if c.strategy == "tiled":  # and plan/tiled.py from 33 rows
                        assert m >= 33, (fmt, a, m, c)
                        continue
                    swap, cap, bn, bk, warps, stages = pp.mx_bf16_tile(fmt, m, a == "bfloat16")
                    assert (c.promote, c.swap_ab, c.block_n, c.block_k, c.num_warps, c.num_stages) == (
                        False, swap, bn, bk, warps, stages), (fmt, a, m, c)
                    assert c.block_m == (min(cap, max(16, 1 << (m - 1).bit_length())) if swap else cap), c
                    tiles = math.ceil(m / c.block_m) * math.ceil(n / c.block_n)
                    assert tiles * c.split_k <= pp.MX_BF16_PROGRAMS_PER_SM * H100_SXM.sm_count or c.split_k == 1, c
                    launched, per = split_plan(k, c.block_k, c.split_k)
                    assert launched == c.split_k and (launched == 1 or per // c.block_k >= pp.MX_BF16_MIN_CHUNKS), c
                    assert "bf16 in registers" in str(plan) and "bf16-dequant" in plan.describe(), str(plan)
    assert plan_gemm(Problem("gemm", "mxfp4", 16, 7168, 2048, a="float16"), H100_SXM).config.promote is not False
    assert not pp.mx_bf16_applies("mxfp4", 8, H100_SXM, None)
    assert not pp.mx_bf16_applies("fp8_block", 16, H100_SXM, None)
    assert not pp.mx_bf16_applies("mxfp4", 16, dataclasses.replace(H100_SXM, capability=(8, 0)), None)
    # the plans before the rules stay reachable (scripts/sweeps/mx_tiles.py times them)
    old = pp.choose_portable("nvfp4", 64, 7168, 16384, H100_SXM, None, torch.bfloat16, mx_bf16=False)
    assert not old.swap_ab and old.block_m == 64
