"""Triton quantizers / dequantizers vs the pure-torch reference (bit for bit), golden cases,
round-trip bounds, bad input. CPU runs go through the Triton interpreter (conftest)."""

import importlib
import math

import pytest
import torch
import triton
import triton.language as tl

from blockscaled.formats import ScaleRounding
from blockscaled.kernels.triton.quantize import _div_by_block_scale, _e2m1_codes
from blockscaled.ops.quantize import dequantize, quantize, silu_mul_quantize, tensor_amax
from blockscaled.tensor import ScaledTensor
from blockscaled.testing import assert_scaled_equal, bitwise_equal, randn_like_activations, special_values

# numpy warnings from the interpreter (exp overflow in SiLU, masked lanes) are expected.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

R = importlib.import_module("blockscaled.reference.quantize")

FMT_ROUNDINGS = [
    ("fp8_block", "exact"), ("fp8_block", "rceil"),
    ("mxfp8", "rceil"), ("mxfp8", "floor"),
    ("mxfp4", "rceil"), ("mxfp4", "floor"),
    ("nvfp4", None),
]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SHAPES = [(1, 1), (1, 7), (3, 16), (2, 33), (5, 129), (4, 300), (2, 3, 257), (1, 1024)]


def _x(shape, dtype, device, seed=0):
    x = randn_like_activations(*shape, dtype=torch.float32, seed=seed)
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4)
    return x.to(dtype).to(device)


def _check(x, fmt, rounding=None, **kw):
    got = quantize(x, fmt, rounding=rounding, **kw)
    want = R.quantize(x.cpu(), fmt, rounding=rounding, **{k: (v.cpu() if isinstance(v, torch.Tensor) else v)
                                                          for k, v in kw.items()})
    assert_scaled_equal(got.cpu(), want)
    assert got.device == x.device
    return got, want


def _deq_equal(a, b):
    """Bitwise equal, except that NaN only has to meet NaN (sign/payload after the final cast
    is not part of dequantize's contract)."""
    a, b = a.cpu(), b.cpu()
    assert a.shape == b.shape and a.dtype == b.dtype
    na, nb = torch.isnan(a), torch.isnan(b)
    assert torch.equal(na, nb)
    assert bitwise_equal(torch.where(na, 0, a), torch.where(nb, 0, b))


# --------------------------------------------------------------------------- bitwise, random
@pytest.mark.parametrize("fmt,rounding", FMT_ROUNDINGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bitwise_random(fmt, rounding, dtype, device):
    for i, shape in enumerate(SHAPES):
        x = _x(shape, dtype, device, seed=i)
        got, want = _check(x, fmt, rounding)
        _deq_equal(dequantize(got, torch.float32), R.dequantize(want, torch.float32))


@pytest.mark.parametrize("fmt,rounding", FMT_ROUNDINGS)
def test_dequantize_dtypes(fmt, rounding, device):
    x = _x((3, 200), torch.bfloat16, device)
    got = quantize(x, fmt, rounding=rounding)
    for dt in DTYPES:
        out = dequantize(got, dt)
        assert out.dtype == dt and out.shape == x.shape and out.is_contiguous()
        _deq_equal(out, R.dequantize(got.cpu(), dt))


@pytest.mark.parametrize("fmt,rounding", FMT_ROUNDINGS)
def test_strided_rows(fmt, rounding, device):
    wide = _x((6, 400), torch.bfloat16, device, seed=3)
    x = wide[:, 16:316]  # column slice: row stride 400, unit last-dim stride
    assert not x.is_contiguous()
    _check(x, fmt, rounding)
    x3 = _x((2, 3, 80), torch.float32, device)[..., :47]
    _check(x3, fmt, rounding)


@pytest.mark.parametrize("fmt,rounding", FMT_ROUNDINGS)
def test_special_values_bitwise(fmt, rounding, device):
    """NaN, +-Inf, signed zeros, denormals, ties, huge values: each in its own block and all
    mixed in one block; bitwise equal to the CPU reference (NaN signs and payloads of fp32 /
    e4m3 values are outside the contract; e2m1 NaNs are code 7)."""
    for dt in DTYPES:
        sv = special_values(dt)
        n = sv.numel()
        blocks = torch.zeros(n + 1, 48, dtype=dt)
        blocks[:n, 0] = sv
        blocks[:n, 1] = 1.5
        blocks[:n, 2] = -3.0
        blocks[n, :n] = sv
        blocks[:, 40] = -sv[-1]  # a negative NaN in every row's second MX / nvfp4 block
        _check(blocks.to(device), fmt, rounding)


def test_nvfp4_user_global_scale(device):
    x = _x((4, 100), torch.bfloat16, device)
    for gs in (1.0, 0.37, torch.tensor(5.5, device=device), torch.tensor([123.0], device=device)):
        _check(x, "nvfp4", global_scale=gs)
    got, _ = _check(x, "nvfp4")
    assert got.global_scale.shape == () and got.global_scale.dtype == torch.float32


def test_nvfp4_infinite_input(device):
    """An Inf block gets a NaN e4m3 scale and every element the code 7, with the computed gs
    (gs = 0: the finite blocks get scale 0 and +-0 codes) and with a user gs alike."""
    x = torch.tensor([[1.0, float("inf")] + [0.5] * 14 + [-0.75] * 16], device=device)
    q, _ = _check(x, "nvfp4")  # computed gs = 2688 / inf = 0
    assert _f32bits(q.global_scale) == [0]
    sc = _bytes(q.scale)
    assert sc[0] & 0x7F == 0x7F and sc[1] == 0x00  # NaN scale (either sign) | 0 * 0.75 / 6 = 0
    assert _bytes(q.data) == [0x77] * 8 + [0x88] * 8  # NaN block: code 7 | -0.75 * 0 = -0: code 8
    for gs in (2.0, torch.tensor(1e-3, device=device)):
        q, _ = _check(x, "nvfp4", global_scale=gs)
        sc = _bytes(q.scale)
        assert sc[0] & 0x7F == 0x7F and sc[1] & 0x7F != 0x7F  # NaN, not the saturated 448 (0x7E)
        assert _bytes(q.data)[:8] == [0x77] * 8
    y = torch.tensor([[-float("inf")] * 16 + [3.0] * 16], device=device)
    q, _ = _check(y, "nvfp4", global_scale=1.0)
    assert _bytes(q.scale)[0] & 0x7F == 0x7F and _bytes(q.scale)[1] == 0x30  # 3 / 6 = 0.5
    assert _bytes(q.data) == [0x77] * 8 + [0x77] * 8  # -Inf block: +NaN codes; 3 / 0.5 = 6: code 7


def test_e2m1_nan_codes_are_positive(device):
    """Every NaN element encodes as the positive code 7, whatever its sign bit (MX NaN block,
    nvfp4 NaN block with a user gs, and nvfp4 elements x * inv = 0 * Inf with a huge gs)."""
    x = torch.zeros(2, 32)
    x[0, 1:4] = torch.tensor([-1.0, -2.0, 0.5])
    x.view(torch.int32)[0, 0] = -4194304  # 0xFFC00000: a NaN with the sign bit set
    x[1, :2] = torch.tensor([-0.0, float("nan")])
    assert torch.isnan(x[0, 0]) and x.view(torch.int32)[0, 0] < 0
    x = x.to(device)
    for fmt, kw in (("mxfp4", {}), ("nvfp4", {"global_scale": 3.0}), ("nvfp4", {})):
        q, _ = _check(x, fmt, **kw)
        assert _bytes(q.data)[:8] == [0x77] * 8 and _bytes(q.data)[16:24] == [0x77] * 8, (fmt, kw)
    # gs = max fp32 and a block amax of 1e-30: sf = e4m3(3.4e38 * 1e-30 / 6) saturates to 448,
    # inv = 3.4e38 / 448 is finite; with amax 1e-40 sf is tiny and inv = gs / sf overflows to
    # Inf, so the block's zeros become 0 * Inf = NaN elements (code 7), the rest +-6 (7 / 15).
    z = torch.zeros(1, 16)
    z[0, 0], z[0, 1] = 1e-40, -1e-40
    _check(z.to(device), "nvfp4", global_scale=3.4028234663852886e38)


@triton.jit
def _e2m1_probe_kernel(x_ptr, out_ptr, n, GPU: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x_ptr + offs, mask=m, other=0.0)
    tl.store(out_ptr + offs, (_e2m1_codes(v, GPU) & 15).to(tl.uint8), mask=m)


def _e2m1_sweep_values():
    """All bf16 values (as fp32), fp32 values within 64 ulps of every e2m1 tie / grid point,
    random fp32 in [-8, 8], denormals, +-0, +-Inf and NaNs of both signs and odd payloads."""
    bf = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    pts = torch.tensor([0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0])
    near = (pts.view(torch.int32)[:, None] + torch.arange(-64, 65, dtype=torch.int32)[None, :]).view(torch.float32)
    g = torch.Generator().manual_seed(0)
    rnd = (torch.rand(200_000, generator=g) * 16 - 8).float()
    odd = torch.tensor([0x7F800001, 0xFF800001, 0x7FC00000, 0xFFC00000, 0x7FFFFFFF, 0xFFFFFFFF, 0x00000001,
                        0x80000001, 0x007FFFFF, 0x7F800000, 0xFF800000, 0x00000000, 0x80000000],
                       dtype=torch.int64).to(torch.int32).view(torch.float32)
    v = torch.cat([bf, near.flatten(), -near.flatten(), rnd, odd])
    return v


def test_e2m1_encoder_matches_reference(device):
    """The kernels' e2m1 encoder (magic-number add, see kernels/triton/quantize._e2m1_codes)
    equals the reference's threshold chain bit for bit, NaN -> 7 for every NaN. (It was also
    checked exhaustively on all 2**32 fp32 patterns with a numpy twin.)"""
    v = _e2m1_sweep_values()
    out = torch.empty(v.shape, dtype=torch.uint8, device=device)
    blk = 16384
    _e2m1_probe_kernel[(triton.cdiv(v.numel(), blk),)](v.to(device), out, v.numel(), GPU=device != "cpu",
                                                         BLOCK=blk)
    want = R.e2m1_encode(v)
    bad = (out.cpu() != want).nonzero().flatten()
    assert bad.numel() == 0, [(hex(int(v[i].view(torch.int32)) & 0xFFFFFFFF), int(out[i]), int(want[i]))
                              for i in bad[:5].tolist()]


def _e2m1_formula_np(v):
    """numpy twin of kernels/triton/quantize._e2m1_codes with the GPU's min/max semantics
    (PTX min/max.f32 return the non-NaN operand = np.fmin / np.fmax)."""
    import numpy as np

    v2 = np.fmax(np.fmin(v, np.float32(6.0)), np.float32(-6.0))
    a = np.abs(v2)
    eb = np.maximum(a, np.float32(1.0)).view(np.int32) >> 23
    c = (eb * 0x800002 + (((v2.view(np.int32) >> 28) & 8) | (0x4A800000 - 127 * 0x800002))).astype(np.int32)
    return ((a + c.view(np.float32)).view(np.int32) & 15).astype(np.uint8)


def test_e2m1_formula_sweep_numpy():
    """The magic-add e2m1 formula vs the reference on every fp32 bit pattern of |v| in
    [2**-4, 16) and its negatives (2 x 2**25 patterns, all e2m1 decisions are there; smaller
    magnitudes are code 0, larger saturate). BLOCKSCALED_E2M1_FULL=1 sweeps all 2**32 patterns
    (~7 min on 2 cores; done once for this formula: 0 mismatches)."""
    import os

    import numpy as np

    full = os.environ.get("BLOCKSCALED_E2M1_FULL") == "1"
    ranges = [(0, 1 << 32)] if full else [(0x3D800000, 0x41800000), (0xBD800000, 0xC1800000)]
    step = 1 << 24
    for lo0, hi0 in ranges:
        for lo in range(lo0, hi0, step):
            bits = np.arange(lo, min(lo + step, hi0), dtype=np.uint64).astype(np.uint32)
            v = torch.from_numpy(bits.view(np.float32))
            with np.errstate(all="ignore"):
                got = torch.from_numpy(_e2m1_formula_np(bits.view(np.float32)))
            bad = (got != R.e2m1_encode(v)).nonzero().flatten()
            assert bad.numel() == 0, hex(int(bits[int(bad[0])]))


@triton.jit
def _div_probe_kernel(x_ptr, s_ptr, out_ptr, NB, GPU: tl.constexpr, G: tl.constexpr, BK: tl.constexpr):
    grp = tl.program_id(0) * G + tl.arange(0, G)
    offs = grp[:, None] * BK + tl.arange(0, BK)[None, :]
    m = (grp < NB)[:, None]
    x = tl.load(x_ptr + offs, mask=m, other=0.0)[None, :, :]
    sc = tl.load(s_ptr + grp, mask=grp < NB, other=1.0)[None, :]
    tl.store(out_ptr + offs, tl.reshape(_div_by_block_scale(x, sc, GPU), (G, BK)), mask=m)


def _div_cases(n_blocks, bk, seed):
    """fp8_block-like (x, s) pairs: s = max(amax / 448, 2**-126) for block amax over all fp32
    exponents (denormal amax included), x bf16 / fp32 values within the block (the block amax
    itself and neighbours, e4m3 ties scaled by s, tiny x giving denormal quotients, signed zeros)."""
    g = torch.Generator().manual_seed(seed)
    e = torch.randint(-149, 128, (n_blocks,), generator=g).double()
    amax = (torch.rand(n_blocks, generator=g) + 1) * torch.pow(2.0, e)
    amax = amax.float().clamp(min=2.0**-149, max=3.0e38)
    s = torch.clamp_min(amax / torch.tensor(448.0), 2.0**-126)
    u = torch.rand(n_blocks, bk, generator=g) * 2 - 1
    x = amax[:, None] * u
    kind = torch.arange(n_blocks) % 5
    bf = x.to(torch.bfloat16).float()
    near = amax.view(torch.int32)[:, None] - torch.randint(0, 8, (n_blocks, bk), generator=g).int()
    near = near.view(torch.float32)
    ties = (torch.randint(1, 224, (n_blocks, bk), generator=g) * 2 + 1).double() * torch.pow(
        2.0, torch.randint(-10, 1, (n_blocks, bk), generator=g).double())
    tie_x = (s.double()[:, None] * ties).float()
    tie_x = (tie_x.view(torch.int32) + torch.randint(-2, 3, (n_blocks, bk), generator=g).int()).view(torch.float32)
    tiny = x * torch.pow(2.0, torch.randint(-60, 0, (n_blocks, bk), generator=g).float())
    x = torch.where((kind == 0)[:, None], bf, torch.where((kind == 1)[:, None], x, torch.where(
        (kind == 2)[:, None], near * torch.sign(u), torch.where((kind == 3)[:, None], tie_x * torch.sign(u), tiny))))
    x[:, 0], x[:, 1] = 0.0, -0.0
    return x.contiguous(), s.contiguous()


def test_fp8_block_division_is_ieee(device):
    """fp8_block EXACT divides by the block scale with a per-block reciprocal and FMA
    correction (kernels/triton/quantize._div_by_block_scale); the quotient must be the IEEE
    one: compared with numpy float32 division bit for bit (fp32, signed zeros included) for
    quotients in the normal range, and as e4m3 bytes everywhere."""
    import numpy as np

    nb, bk = 4096, 64
    x, s = _div_cases(nb, bk, seed=3)
    with np.errstate(all="ignore"):
        want = torch.from_numpy(x.numpy() / s.numpy()[:, None])
    out = torch.empty_like(x, device=device)
    g = 64
    _div_probe_kernel[(triton.cdiv(nb, g),)](x.to(device), s.to(device), out, nb, GPU=device != "cpu", G=g, BK=bk)
    out = out.cpu()
    normal = want.abs() >= 2.0**-126
    bad = (out.view(torch.int32) != want.view(torch.int32)) & normal
    assert not bad.any(), [(x[i].item(), s[i // bk].item()) for i in bad.flatten().nonzero()[:3].flatten().tolist()]
    e4 = lambda t: t.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(e4(out), e4(want))
    # Inf and NaN scales (Inf / NaN blocks): x / Inf = +-0 (NaN for +-Inf), x / NaN = NaN
    x2 = torch.tensor([[1.0, -2.0, 0.0, -0.0, float("inf"), -float("inf"), 3.0, 4.0]] * 2)
    s2 = torch.tensor([float("inf"), float("nan")])
    out2 = torch.empty_like(x2, device=device)
    _div_probe_kernel[(1,)](x2.to(device), s2.to(device), out2, 2, GPU=device != "cpu", G=2, BK=8)
    want2 = x2 / s2[:, None]
    assert bitwise_equal(torch.where(torch.isnan(want2), 0.0, out2.cpu()), torch.where(torch.isnan(want2), 0.0, want2))
    assert torch.equal(torch.isnan(out2.cpu()), torch.isnan(want2))


def test_fp8_block_division_formula_numpy():
    """The same reciprocal + FMA-correction quotient in numpy with the FMAs emulated exactly
    (products of two fp32 are exact in float64, the remainder sum is exact, the correction sum
    is checked not to need a second rounding), vs numpy float32 division on 2M fp8_block-like
    (x, s) pairs: bit-equal fp32 quotients in the normal range (signed zeros too) and equal
    e4m3 bytes everywhere. (41M pairs were checked the same way while developing it.)"""
    import numpy as np

    x_t, s_t = _div_cases(32768, 64, seed=11)
    x, s = x_t.numpy(), np.repeat(s_t.numpy()[:, None], 64, axis=1)
    e = (s.view(np.int32) >> 23) & 0xFF
    p = ((254 - e) << 23).astype(np.int32).view(np.float32)
    sp = (s * p).astype(np.float32)
    y = (np.float32(1.0) / sp).astype(np.float32)
    xn = (x * -p).astype(np.float32)
    q = (xn * -y).astype(np.float32)
    r = (q.astype(np.float64) * sp.astype(np.float64) + xn.astype(np.float64)).astype(np.float32)
    t = r.astype(np.float64) * (-y).astype(np.float64) + q.astype(np.float64)
    got = t.astype(np.float32)
    # float64 then float32 equals the single fused rounding unless float64 lands exactly on an
    # fp32 midpoint (normal range): there would be a double rounding; require that it never does
    mid = (t.view(np.uint64) & np.uint64((1 << 29) - 1)) == np.uint64(1 << 28)
    assert not (mid & (np.abs(t) >= 2.0**-126)).any()
    with np.errstate(all="ignore"):
        want = (x / s).astype(np.float32)
    normal = np.abs(want) >= 2.0**-126
    bad = (got.view(np.int32) != want.view(np.int32)) & normal
    assert not bad.any(), np.argwhere(bad)[:3]
    e4 = lambda a: torch.from_numpy(a).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(e4(got), e4(want))


# --------------------------------------------------------------------------- hypothesis shapes
try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - hypothesis is a test extra
    given = None

if given is not None:

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        m=st.integers(0, 9),
        k=st.integers(1, 400),
        pad=st.integers(0, 40),
        fr=st.sampled_from(FMT_ROUNDINGS),
        dtype=st.sampled_from(DTYPES),
        seed=st.integers(0, 2**16),
    )
    def test_bitwise_hypothesis(m, k, pad, fr, dtype, seed):
        """Random shapes, row strides (a column slice of a wider tensor) and formats."""
        from conftest import DEVICE

        fmt, rounding = fr
        wide = _x((m, k + pad), dtype, DEVICE, seed=seed)
        x = wide[:, pad:]
        q = quantize(x, fmt, rounding=rounding)
        if m == 0:
            assert q.shape == x.shape and q.data.numel() == 0
            return
        assert_scaled_equal(q.cpu(), R.quantize(x.cpu(), fmt, rounding=rounding))
        _deq_equal(dequantize(q), R.dequantize(q.cpu()))


# --------------------------------------------------------------------------- fp8_block weights
@pytest.mark.parametrize("rounding", ["exact", "rceil"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_weights_128x128(rounding, dtype, device):
    for i, shape in enumerate([(1, 1), (130, 300), (3, 129, 257), (128, 128)]):
        x = _x(shape, dtype, device, seed=i)
        got, want = _check(x, "fp8_block", rounding, block=(128, 128))
        _deq_equal(dequantize(got, torch.bfloat16), R.dequantize(want, torch.bfloat16))


def test_weights_special_and_strided(device):
    x = _x((200, 300), torch.float32, device)
    x[5, 7] = float("nan")
    x[150, 280] = float("inf")
    x[130:, :128] = 0.0
    _check(x, "fp8_block", block=(128, 128))
    _check(x[:, 10:250], "fp8_block", "rceil", block=(128, 128))


# --------------------------------------------------------------------------- zero-size
@pytest.mark.parametrize("fmt,rounding", FMT_ROUNDINGS)
def test_zero_size(fmt, rounding, device):
    for shape in [(0, 300), (3, 0), (0,), (2, 0, 40)]:
        x = torch.empty(shape, device=device)
        q = quantize(x, fmt, rounding=rounding)
        assert q.shape == x.shape and q.data.numel() == 0
        if shape[-1] == 0:  # (the reference cannot reshape zero rows with K > 0, see report)
            assert_scaled_equal(q.cpu(), R.quantize(x.cpu(), fmt, rounding=rounding))
        if fmt == "nvfp4":
            assert q.global_scale.item() == 1.0
        assert dequantize(q).shape == x.shape
    w = quantize(torch.empty(2, 0, 7, device=device), "fp8_block", block=(128, 128))
    assert tuple(w.scale.shape) == (2, 0, 1)
    assert tensor_amax(torch.empty(0, 4, device=device)).item() == 0.0


# --------------------------------------------------------------------------- tensor amax
def test_tensor_amax(device):
    for i, shape in enumerate([(1,), (3, 5), (70, 1500), (2, 3, 129)]):
        x = _x(shape, torch.bfloat16, device, seed=i)
        assert bitwise_equal(tensor_amax(x), R.tensor_amax(x.cpu()))
    x = _x((40, 100), torch.float32, device)
    x[33, 3] = -float("inf")
    assert tensor_amax(x).item() == float("inf")
    x[1, 99] = -float("nan")
    a = tensor_amax(x)
    assert a.shape == () and torch.isnan(a) and bitwise_equal(a, R.tensor_amax(x.cpu()))
    assert tensor_amax(x[:, 10:60]).item() == x[:, 10:60].abs().max().item()  # strided, NaN-free part


# --------------------------------------------------------------------------- golden cases
def _bytes(t):
    return t.cpu().contiguous().view(torch.uint8).flatten().tolist()


def _f32bits(t):
    return [v & 0xFFFFFFFF for v in t.cpu().float().contiguous().view(torch.int32).flatten().tolist()]


def test_golden_fp8_block(device):
    row = torch.zeros(6, 128)
    # block 0: amax 448 -> scale 1.0; e4m3 ties round to even, e4m3 subnormal ties
    row[0, :9] = torch.tensor([448, 1.0625, 1.1875, 17, 19, 2**-10, 3 * 2**-10, -1.0625, -0.0])
    # block 1: zero block -> scale 2**-126, data 0
    # block 2: fp32 denormal input 2**-130 -> scale 2**-126, data 2**-4 (0x18)
    row[2, 0] = 2.0**-130
    # block 3: NaN block; block 4: Inf block
    row[3, :3] = torch.tensor([float("nan"), 1.0, -float("nan")])
    row[4, :4] = torch.tensor([float("inf"), 1.0, -2.0, -float("inf")])
    # block 5: amax 449: EXACT scale 449/448, RCEIL scale 2 (449/2 = 224.5 -> 224 = 0x76)
    row[5, 0] = 449.0
    x = row.to(device)
    q = quantize(x, "fp8_block")
    d = _bytes(q.data)
    assert d[:9] == [0x7E, 0x38, 0x3A, 0x58, 0x5A, 0x00, 0x02, 0xB8, 0x80]
    s = _f32bits(q.scale)
    assert s[0] == 0x3F800000 and s[1] == 0x00800000 and s[2] == 0x00800000
    assert d[128:256] == [0] * 128
    assert d[256] == 0x18
    nan8 = lambda b: b & 0x7F == 0x7F  # e4m3 NaN, either sign (NaN signs are outside the contract)
    assert math.isnan(q.scale.cpu()[3].item()) and all(nan8(b) for b in d[384:512])
    assert s[4] == 0x7F800000 and nan8(d[512]) and d[513:516] == [0x00, 0x80] + [d[515]] and nan8(d[515])
    assert s[5] == _f32bits(torch.tensor(449.0) / 448.0)[0] and d[640] == 0x7E
    r = quantize(x, "fp8_block", rounding="rceil")
    assert _f32bits(r.scale)[5] == 0x40000000 and _bytes(r.data)[640] == 0x76
    assert _f32bits(r.scale)[0] == 0x3F800000
    assert_scaled_equal(q.cpu(), R.quantize(x.cpu(), "fp8_block"))
    assert_scaled_equal(r.cpu(), R.quantize(x.cpu(), "fp8_block", rounding="rceil"))


def test_golden_mx(device):
    x = torch.zeros(5, 32)
    x[0, 0] = 500.0  # mxfp8: FLOOR 2**(8-8) -> 127, 500 saturates to 448; RCEIL 2 -> 128, 250 -> 256
    x[1, 0] = 2.0**-127  # denormal: both roundings -> E8M0 0 (2**-127), data 1.0
    x[2, 0] = 7.0  # mxfp4: FLOOR 2**(2-2) -> 127, 7 -> 6 (code 7); RCEIL 7/6 -> 2 -> 128, 3.5 -> 4 (code 6)
    x[3, :10] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, 0.0])  # e2m1 ties
    x[4, :3] = torch.tensor([1.0, -float("nan"), -2.0])  # NaN block
    x = x.to(device)
    f8 = quantize(x, "mxfp8", rounding="floor")
    c8 = quantize(x, "mxfp8", rounding="rceil")
    assert _bytes(f8.scale)[:2] == [127, 0] and _bytes(f8.data)[0] == 0x7E and _bytes(f8.data)[32] == 0x38
    assert _bytes(c8.scale)[:2] == [128, 0] and _bytes(c8.data)[0] == 0x78 and _bytes(c8.data)[32] == 0x38
    assert _bytes(f8.scale)[4] == 255 and all(b & 0x7F == 0x7F for b in _bytes(f8.data)[128:160])
    f4 = quantize(x, "mxfp4", rounding="floor")
    c4 = quantize(x, "mxfp4", rounding="rceil")
    assert _bytes(f4.scale)[2] == 127 and _bytes(f4.data)[32] == 0x07
    assert _bytes(c4.scale)[2] == 128 and _bytes(c4.data)[32] == 0x06
    for q in (f4, c4):
        assert _bytes(q.scale)[3] == 127
        assert _bytes(q.data)[48:53] == [0x07, 0x22, 0x44, 0x66, 0x08]
        # NaN block: scale 0xFF; every element is NaN and encodes as code 7 (also the -NaN).
        assert _bytes(q.scale)[4] == 255 and _bytes(q.data)[64:80] == [0x77] * 16
    for q in (f8, c8, f4, c4):
        assert_scaled_equal(q.cpu(), R.quantize(x.cpu(), q.format, rounding=q.rounding))


def test_golden_nvfp4(device):
    x = torch.zeros(3, 16)
    x[0, :8] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])  # gs 1: sf = 6/6 = 1.0 (0x38)
    x[1, 0] = 3000.0  # t = 500: sf saturates to 448 (0x7E); 3000/448 = 6.7 -> 6 (code 7)
    x = x.to(device)
    q = quantize(x, "nvfp4", global_scale=1.0)
    assert _bytes(q.scale) == [0x38, 0x7E, 0x00]  # zero block: sf 0, data 0
    assert _bytes(q.data)[:4] == [0x07, 0x22, 0x44, 0x66] and _bytes(q.data)[8] == 0x07
    assert _bytes(q.data)[16:] == [0] * 8
    assert_scaled_equal(q.cpu(), R.quantize(x.cpu(), "nvfp4", global_scale=1.0))
    # Computed gs = 2688 / amax, IEEE division (2688 / 3 = 896 exactly; 2688 / 7.3 rounded).
    y = torch.tensor([[3.0] * 16], device=device)
    assert _f32bits(quantize(y, "nvfp4").global_scale) == [0x44600000]  # 896.0
    y = torch.tensor([[7.3] * 16], device=device)
    g = quantize(y, "nvfp4").global_scale
    want = torch.tensor(2688.0) / torch.tensor(7.3)
    assert _f32bits(g) == _f32bits(want)


# --------------------------------------------------------------------------- odd K for fp4
@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_fp4_odd_k_high_nibble_zero(fmt, device):
    x = _x((3, 33), torch.bfloat16, device) + 0.5
    q, _ = _check(x, fmt)
    assert q.data.shape == (3, 17)
    assert all(b >> 4 == 0 for b in _bytes(q.data[:, -1]))


# --------------------------------------------------------------------------- round-trip bounds
def _half_ulp(y, elem):
    """Half an element ulp at |y| (y in element units): e4m3 3 mantissa bits, subnormal step
    2**-9; e2m1 1 mantissa bit, subnormal step 0.5 (so half ulps: max(|y|/16, 2**-10) and
    max(|y|/4, 1/4))."""
    a = y.abs()
    if elem == "e4m3":
        return torch.maximum(a * 2.0**-4, torch.full_like(a, 2.0**-10))
    return torch.maximum(a * 0.25, torch.full_like(a, 0.25))


@pytest.mark.parametrize("fmt,rounding", FMT_ROUNDINGS)
def test_roundtrip_error_bound(fmt, rounding, device):
    """|x - dequantize(quantize(x))| <= half an element ulp at the block scale (times 1 +
    2**-20 for the fp32 roundings of the division and of the dequantize product), except for
    elements that saturate (FLOOR's top binade, nvfp4's rounded-down scale), which are off by
    |y| - elem_max at most."""
    x = _x((6, 320), torch.float32, device)
    q = quantize(x, fmt, rounding=rounding)
    xd = dequantize(q).cpu().double()
    x = x.cpu().double()
    f = q.format
    if f.scale_kind == "fp32":
        s = q.scale.cpu().double().repeat_interleave(128, -1)[:, :320]
    elif f.scale_kind == "e8m0":
        s = R.e8m0_to_fp32(q.scale.cpu()).double().repeat_interleave(32, -1)[:, :320]
    else:
        s = q.scale.cpu().float().double().repeat_interleave(16, -1)[:, :320] / q.global_scale.cpu().double()
    y = x / s  # element units
    err = (x - xd).abs() / s
    # (EXACT scales are fl(amax / 448), so the block max can sit 1 fp32 ulp above 448 here)
    sat = y.abs() > f.elem_max * (1 + 2.0**-20)
    slack = y.abs() * 2.0**-20  # fp32 roundings of the scaling and of the dequantize product
    bound = _half_ulp(y, f.elem) + slack
    assert torch.all(err[~sat] <= bound[~sat]), (err - bound).max()
    assert torch.all(err[sat] <= (y.abs() - f.elem_max + slack)[sat])
    if rounding in ("exact", "rceil"):
        assert not sat.any()  # these roundings never clip


# --------------------------------------------------------------------------- silu_mul_quantize
def _silu_np(gate_up, inter):
    """The reference's ``silu_mul`` with numpy's float32 expf (what the interpreter runs)."""
    import numpy as np

    i = gate_up.shape[-1] // 2
    g = gate_up[..., :i].float()
    u = gate_up[..., i:].float()
    e = torch.from_numpy(np.exp((-g).numpy()))
    return (g / (1.0 + e) * u).to(inter)


def _assert_silu_close(got, gu, fmt="fp8_block", rounding=None, inter=torch.bfloat16):
    """Fused SiLU-mul-quantize vs the reference.

    ``exp`` is the only transcendental: libdevice expf (GPU), numpy expf (interpreter) and
    torch's CPU expf may differ by 1 ulp, which can flip the rounding of an intermediate.
    (1) In the interpreter the kernel is bitwise equal to the reference fed with numpy-exp
    intermediates. (2) Against the torch reference: scales bitwise equal in every block whose
    intermediates agree, others within 2**-7 relative (one bf16 ulp of the amax); data
    >= 99.99% bitwise equal and the rest within one element ulp, same sign."""
    on_cpu = got.device.type == "cpu"  # the interpreter
    gu = gu.cpu()
    want = R.silu_mul_quantize(gu, fmt, rounding=rounding, intermediate_dtype=inter)
    if on_cpu:
        assert_scaled_equal(got, R.quantize(_silu_np(gu, inter), fmt, rounding=rounding))
    got = got.cpu()
    assert got.shape == want.shape and got.format == want.format
    h_ref = R.silu_mul(gu).to(inter)
    bk = want.format.block_k
    i = h_ref.shape[-1]
    sg = got.scale.float() if want.format.scale_kind != "e8m0" else R.e8m0_to_fp32(got.scale)
    sw = want.scale.float() if want.format.scale_kind != "e8m0" else R.e8m0_to_fp32(want.scale)
    same = torch.eq(sg.view(torch.int32), sw.view(torch.int32))
    assert torch.all((sg - sw).abs() <= sw.abs() * 2.0**-7), "scales differ by more than one bf16 ulp"
    if on_cpu:
        h_np = _silu_np(gu, inter)
        pad = (-i) % bk
        agree = torch.nn.functional.pad((h_np == h_ref).float(), (0, pad), value=1.0)
        agree = agree.view(*agree.shape[:-1], -1, bk).amin(-1).bool()
        assert torch.all(same[agree]), "scales differ in a block whose intermediates agree"
    if want.format.is_fp4:
        gd = R.unpack_fp4(got.data, i).int()
        wd = R.unpack_fp4(want.data, i).int()
        sign = 8
    else:
        gd, wd = got.data.view(torch.uint8).int(), want.data.view(torch.uint8).int()
        sign = 0x80
    # data compared in the blocks whose scale agrees (elsewhere the whole block is re-scaled)
    same_blk = same.repeat_interleave(bk, -1)[..., :i]
    if on_cpu:  # small shapes: every mismatch must sit on an intermediate that differs
        assert torch.all((gd == wd)[same_blk] | (h_np != h_ref)[same_blk])
    gd, wd = gd[same_blk], wd[same_blk]
    if gd.numel() == 0:
        return
    if not on_cpu:
        eq = (gd == wd).float().mean().item()
        assert eq >= 0.9999, eq
    assert torch.all(((gd ^ wd) & sign) == 0) and int((gd - wd).abs().max()) <= 1


@pytest.mark.parametrize("rounding", ["exact", "rceil"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_mul_quantize(rounding, dtype, device):
    for i, shape in enumerate([(1, 2), (3, 258), (2, 2, 600), (5, 512)]):
        gu = _x(shape, dtype, device, seed=i)
        got = silu_mul_quantize(gu, rounding=rounding)
        assert got.format.name == "fp8_block" and got.shape == (*shape[:-1], shape[-1] // 2)
        _assert_silu_close(got, gu, rounding=rounding)
    wide = _x((4, 700), torch.bfloat16, device)
    _assert_silu_close(silu_mul_quantize(wide[:, :600], rounding=rounding), wide[:, :600], rounding=rounding)


def test_silu_mul_quantize_mx_and_intermediates(device):
    gu = _x((3, 130), torch.bfloat16, device)
    for fmt in ("mxfp8", "mxfp4"):
        _assert_silu_close(silu_mul_quantize(gu, fmt), gu, fmt)
    for it in (torch.float16, torch.float32):
        _assert_silu_close(silu_mul_quantize(gu, intermediate_dtype=it), gu, inter=it)
    q = silu_mul_quantize(torch.empty(0, 6, device=device))
    assert q.shape == (0, 3)


# --------------------------------------------------------------------------- bad input
def test_bad_inputs(device):
    x = _x((4, 64), torch.bfloat16, device)
    with pytest.raises(TypeError, match=r"x: expected dtype in .*got torch.float64"):
        quantize(x.double(), "fp8_block")
    with pytest.raises(TypeError, match=r"x: expected dtype in .*got torch.int32"):
        quantize(x.int(), "fp8_block")
    with pytest.raises(TypeError, match=r"x: expected a torch.Tensor"):
        quantize([1.0, 2.0], "fp8_block")
    with pytest.raises(ValueError, match=r"x: expected at least 1 dimension"):
        quantize(torch.tensor(1.0, device=device), "mxfp8")
    with pytest.raises(ValueError, match=r"x: the last dimension must have stride 1"):
        quantize(_x((64, 4), torch.bfloat16, device).t(), "fp8_block")
    with pytest.raises(ValueError, match=r"block: mxfp8 allows \[\(1, 32\)\], got \(1, 128\)"):
        quantize(x, "mxfp8", block=(1, 128))
    with pytest.raises(ValueError, match=r"block: \(128, 128\) needs x with at least 2 dimensions"):
        quantize(x[0], "fp8_block", block=(128, 128))
    with pytest.raises(ValueError, match=r"rounding: fp8_block allows \['EXACT', 'RCEIL'\], got FLOOR"):
        quantize(x, "fp8_block", rounding="floor")
    with pytest.raises(ValueError, match=r"rounding: mxfp4 allows .*got EXACT"):
        quantize(x, "mxfp4", rounding=ScaleRounding.EXACT)
    with pytest.raises(ValueError, match=r"rounding: expected one of .*got 'nearest'"):
        quantize(x, "mxfp8", rounding="nearest")
    with pytest.raises(ValueError, match=r"fmt: expected one of"):
        quantize(x, "int4")
    with pytest.raises(ValueError, match=r"global_scale: mxfp8 has no global scale"):
        quantize(x, "mxfp8", global_scale=1.0)
    with pytest.raises(ValueError, match=r"global_scale: expected a tensor on .*, got one on meta"):
        quantize(x, "nvfp4", global_scale=torch.tensor(1.0, device="meta"))
    with pytest.raises(TypeError, match=r"global_scale: expected dtype in \['torch.float32'\]"):
        quantize(x, "nvfp4", global_scale=torch.tensor(1.0, dtype=torch.float64, device=device))
    with pytest.raises(ValueError, match=r"global_scale: expected 1 element"):
        quantize(x, "nvfp4", global_scale=torch.ones(2, device=device))
    with pytest.raises(TypeError, match=r"q: expected a ScaledTensor"):
        dequantize(x)
    with pytest.raises(TypeError, match=r"dtype: expected one of"):
        dequantize(quantize(x, "mxfp8"), torch.int8)
    with pytest.raises(ValueError, match=r"gate_up: last dimension must be even"):
        silu_mul_quantize(_x((2, 7), torch.bfloat16, device))
    with pytest.raises(ValueError, match=r"fmt: silu_mul_quantize fuses .*got nvfp4"):
        silu_mul_quantize(x, "nvfp4")
    with pytest.raises(TypeError, match=r"x: expected dtype"):
        tensor_amax(x.int())


def test_scaled_tensor_fields(device):
    q = quantize(_x((2, 3, 40), torch.float16, device), "mxfp4")
    assert isinstance(q, ScaledTensor) and q.data.shape == (2, 3, 20) and q.scale.shape == (2, 3, 2)
    assert q.data.is_contiguous() and q.scale.is_contiguous() and q.rounding is ScaleRounding.RCEIL


# --------------------------------------------------------------------------- GPU, large shapes
@pytest.mark.gpu
@pytest.mark.parametrize("fmt,rounding", FMT_ROUNDINGS)
def test_gpu_large_bitwise(fmt, rounding):
    x = _x((16384, 7168), torch.bfloat16, "cuda")
    if fmt == "nvfp4":  # the two-pass computed gs on a clean x, then NaN / Inf with a user gs
        _check(x, fmt, rounding)
        _check(x[:1000, 16:], fmt, rounding)  # small grid (shrunken tiles), strided rows
    x[7, 9] = float("nan")
    x[100, 1000] = -float("inf")
    x.view(torch.int16)[200, 48] = -64  # 0xFFC0: a bf16 NaN with the sign bit set
    gs = {"global_scale": torch.tensor(0.37, device="cuda")} if fmt == "nvfp4" else {}
    _check(x, fmt, rounding, **gs)
    _check(x[:4096, 64:7000], fmt, rounding, **gs)  # strided rows, partial last block
    q = quantize(x[:2048], fmt, rounding=rounding, **gs)
    _deq_equal(dequantize(q, torch.bfloat16), R.dequantize(q.cpu(), torch.bfloat16))


@pytest.mark.gpu
@pytest.mark.parametrize("rounding", ["exact", "rceil"])
def test_gpu_weights_bitwise(rounding):
    _check(_x((4096, 7168), torch.bfloat16, "cuda"), "fp8_block", rounding, block=(128, 128))
    _check(_x((8, 2112, 7000), torch.bfloat16, "cuda"), "fp8_block", rounding, block=(128, 128))


@pytest.mark.gpu
def test_gpu_silu_mul_quantize_and_amax():
    gu = _x((4096, 2 * 2048), torch.bfloat16, "cuda")
    _assert_silu_close(silu_mul_quantize(gu), gu)
    same = silu_mul_quantize(gu).scale.cpu().view(torch.int32) == R.silu_mul_quantize(gu.cpu()).scale.view(torch.int32)
    assert same.float().mean() >= 0.99  # only blocks whose max intermediate flipped may differ
    x = _x((16384, 7168), torch.bfloat16, "cuda")
    assert bitwise_equal(tensor_amax(x), R.tensor_amax(x.cpu()))


@pytest.mark.gpu
def test_gpu_quantize_bandwidth_report():
    """Not an assertion on speed (the bench records it): runs the timing path once."""
    import triton.testing

    x = _x((16384, 7168), torch.bfloat16, "cuda")
    gs = torch.tensor(1.0, device="cuda")
    for fmt, kw in (("fp8_block", {}), ("mxfp8", {}), ("mxfp4", {}), ("nvfp4", {}), ("nvfp4", {"global_scale": gs})):
        ms = triton.testing.do_bench(lambda: quantize(x, fmt, **kw), return_mode="median")
        q = quantize(x, fmt, **kw)
        tbs = (x.numel() * 2 + q.nbytes()) / (ms * 1e-3) / 1e12  # (nvfp4 computed gs: x read twice)
        print(f"{fmt}{' gs given' if kw else ''}: {ms * 1e3:.1f} us, {tbs:.2f} TB/s")
        assert math.isfinite(tbs)


# --------------------------------------------------------------------------- custom ops
def test_custom_ops_opcheck(device):
    """The ops are torch custom ops with fake impls (torch.compile / CUDA graphs see one opaque
    op); opcheck validates schema, fake tensors and aliasing against the real kernels."""
    x = _x((3, 40), torch.bfloat16, device)
    ops = torch.ops.blockscaled
    tests = ("test_schema", "test_faketensor")
    torch.library.opcheck(ops.quantize, (x, "fp8_block", 1, "exact", None), test_utils=tests)
    torch.library.opcheck(ops.quantize, (x, "nvfp4", 1, "nvfp4", None), test_utils=tests)
    torch.library.opcheck(ops.quantize, (_x((130, 200), torch.float32, device), "fp8_block", 128, "rceil", None),
                          test_utils=tests)
    q = quantize(x, "mxfp4")
    torch.library.opcheck(ops.dequantize, (q.data, q.scale, None, "mxfp4", 40, 1, torch.float32), test_utils=tests)
    torch.library.opcheck(ops.silu_mul_quantize, (x, "fp8_block", "exact", torch.bfloat16), test_utils=tests)
    torch.library.opcheck(ops.tensor_amax, (x,), test_utils=tests)


def test_torch_compile_fullgraph(device):
    x = _x((5, 70), torch.bfloat16, device)

    @torch.compile(fullgraph=True, backend="eager")
    def f(t):
        q = quantize(t, "mxfp8")
        return dequantize(q, torch.float32), q.scale

    y, s = f(x)
    q = quantize(x, "mxfp8")
    assert bitwise_equal(s, q.scale) and bitwise_equal(y, dequantize(q))


def test_nvfp4_dequantize_every_code_scale_and_global_scale(device):
    """nvfp4 dequantize divides by the global scale twice per block (``_nvfp4_values``: (m * s) / gs
    scaled by the code's power of two) where every quotient of a program is normal, else per
    element: bitwise the reference's ``(v * s) / gs`` for every e2m1 code pair under 64 e4m3 scale codes
    (zero, subnormal, NaN, the largest and a spread; with and without the zero / NaN ones, so that
    the subnormal and largest codes reach the two-division path too) and global scales that keep all
    quotients normal, push some below 2**-125 or to overflow, or are 0 / inf / NaN / negative; fp32
    and bf16 outputs."""
    from blockscaled.tensor import ScaledTensor

    codes = torch.arange(256, dtype=torch.uint8)  # every pair of e2m1 codes, one byte each
    # 64 e4m3 scale codes, one per row: zeros, subnormals, 1.0, the largest, NaNs, then a spread
    sc_codes = [0x00, 0x01, 0x07, 0x08, 0x38, 0x7E, 0x7F, 0x80, 0x81, 0xB8, 0xFE, 0xFF]
    sc_codes += [c for c in range(3, 256, 4) if c not in sc_codes][:64 - len(sc_codes)]
    data = codes.repeat(64, 1)  # [64 rows, 256 bytes] = K 512: 32 blocks of 16 per row
    scale = torch.tensor(sc_codes, dtype=torch.uint8).view(64, 1).repeat(1, 32)
    clean = torch.full((64, 32), 0x38, dtype=torch.uint8)  # 1.0 everywhere: the two-division path
    # every finite non-zero code, the specials first (no zero / NaN block in any program)
    fin = [c for c in [0x01, 0x07, 0x08, 0x7E, 0x81, 0xFE, 0x38] + list(range(2, 255, 4)) if c & 0x7F not in (0, 0x7F)]
    finite = torch.tensor(list(dict.fromkeys(fin))[:64], dtype=torch.uint8).view(64, 1).repeat(1, 32)
    for gs in (1.0, 2.0**-120, 2.0**126, 3.0e38, 0.0, float("inf"), float("nan"), -7.0):
        for sc in (scale, finite) + ((clean,) if gs in (1.0, -7.0) else ()):
            q = ScaledTensor(data.to(device), sc.view(torch.float8_e4m3fn).to(device), "nvfp4", (64, 512),
                             (1, 16), "nvfp4", global_scale=torch.tensor(gs, device=device))
            _dequantize_equal_fp32_bf16(q, device)


def _dequantize_equal_fp32_bf16(q, device) -> None:
    """``dequantize(q)`` to fp32 and bf16 bitwise the reference's. On the CPU the bf16 subnormals
    are left out: the Triton interpreter's fp32 -> bf16 cast mishandles them (9.2e-41 -> 0, 1e-39 ->
    4.2e-39; checked on a bare cast), so those are compared on the GPU only."""
    for dt in (torch.float32, torch.bfloat16):
        got, want = dequantize(q, dt).cpu(), R.dequantize(q.cpu(), dt)
        if dt == torch.bfloat16 and device == "cpu":
            sub = (want != 0) & (want.abs() < 2.0**-126)
            got, want = torch.where(sub, 0, got), torch.where(sub, 0, want)
        _deq_equal(got, want)


def test_mxfp4_dequantize_every_code_and_scale(device):
    """mxfp4 -> bf16 / fp32 for every byte of packed codes under every E8M0 scale (0: 2**-127,
    subnormal bf16 results; 255: NaN; 254: overflow to Inf), K = 512 and K = 200 (a partial last
    block), bitwise the reference. On CUDA this checks the bf16 output's hardware rounding, which
    replaced the kernel's integer rounding there."""
    from blockscaled.tensor import ScaledTensor

    for k in (512, 200):
        data = torch.arange(256, dtype=torch.uint8).repeat(256, 1)[:, :k // 2].contiguous()
        nsk = -(-k // 32)
        scale = torch.arange(256, dtype=torch.uint8).view(256, 1).repeat(1, nsk)
        scale[::7] = (torch.arange(nsk) * 37 % 256).to(torch.uint8)  # mixed scales within a row too
        q = ScaledTensor(data.to(device), scale.to(device), "mxfp4", (256, k), (1, 32), "floor")
        _dequantize_equal_fp32_bf16(q, device)
