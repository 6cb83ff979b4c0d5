"""Scale-layout converters (blockscaled.layouts): exact round trips, byte formulas, padding,
DeepGEMM stride/alignment rules, ScaledTensor wrappers, errors."""

from __future__ import annotations

import itertools

import pytest
import torch

from blockscaled.layouts import (
    blocked_numel,
    from_blocked,
    from_cublas,
    from_deepgemm,
    from_deepgemm_fp32,
    from_deepgemm_ue8m0,
    from_gpumode,
    gpumode_view,
    tma_aligned_size,
    to_blocked,
    to_cublas,
    to_deepgemm,
    to_deepgemm_fp32,
    to_deepgemm_ue8m0,
)
from blockscaled.reference.quantize import dequantize, quantize
from blockscaled.testing.inputs import randn_like_activations

ROWS = (1, 127, 128, 129, 300)
COLS = (1, 3, 4, 5, 57)
LEADS = ((), (3,))


def _gen(seed):
    g = torch.Generator().manual_seed(seed)
    return g


def _rand_u8(shape, seed=0):
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=_gen(seed))


def _rand_pow2(shape, seed=0):
    e = torch.randint(-126, 128, shape, generator=_gen(seed))
    return torch.exp2(e.double()).float()


def _storage(t: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` elements of ``t``'s storage from its data pointer, as a flat tensor."""
    return torch.as_strided(t, (n,), (1,), t.storage_offset())


# --------------------------------------------------------------------------- DeepGEMM fp32
@pytest.mark.parametrize("lead", LEADS)
def test_deepgemm_fp32_round_trip_strides_padding(lead):
    for m, k in itertools.product(ROWS, COLS):
        sf = torch.rand((*lead, m, k), generator=_gen(m * 100 + k)) + 0.01
        out = to_deepgemm_fp32(sf)
        ma = tma_aligned_size(m, 4)
        assert ma % 4 == 0 and ma >= m and ma - m < 4
        assert out.shape == sf.shape and out.dtype == torch.float32
        # DeepGEMM's layout checks (csrc/utils/layout.hpp check_sf_layout, tma_stride_check):
        assert out.stride()[-2:] == (1, ma)
        if lead:
            assert out.stride(0) == ma * k == out.stride(-1) * out.size(-1)
        assert out.storage_offset() == 0
        assert (ma * out.element_size()) % 16 == 0  # every column starts 16-byte aligned
        assert torch.equal(out, sf)
        # raw storage: column-major [.., k, ma], padding rows m..ma zero
        e = sf.shape[0] if lead else 1
        raw = _storage(out, e * k * ma).view(e, k, ma)
        assert torch.equal(raw[..., :m], sf.reshape(e, m, k).transpose(1, 2))
        assert torch.all(raw[..., m:] == 0)
        back = from_deepgemm_fp32(out)
        assert back.is_contiguous() and torch.equal(back, sf)


def test_deepgemm_fp32_hand_checked():
    sf = torch.arange(1, 16, dtype=torch.float32).view(5, 3)  # M=5 -> Ma=8
    out = to_deepgemm_fp32(sf)
    raw = _storage(out, 24).tolist()
    # column 0 = rows 0..4, then 3 zero pads; column 1 starts at element 8 (32 bytes)
    assert raw[:8] == [1, 4, 7, 10, 13, 0, 0, 0]
    assert raw[8:16] == [2, 5, 8, 11, 14, 0, 0, 0]
    assert raw[16:24] == [3, 6, 9, 12, 15, 0, 0, 0]


def test_deepgemm_fp32_non_contiguous_input_and_empty():
    sf = torch.rand(7, 9)[:, ::2]  # strided input
    assert torch.equal(to_deepgemm_fp32(sf), sf)
    for shape in ((0, 3), (4, 0), (2, 0, 3)):
        z = torch.rand(shape)
        out = to_deepgemm_fp32(z)
        assert out.shape == z.shape
        assert from_deepgemm_fp32(out).shape == z.shape


# --------------------------------------------------------------------------- DeepGEMM UE8M0
@pytest.mark.parametrize("lead", LEADS)
def test_deepgemm_ue8m0_round_trip_strides_padding(lead):
    for m, k in itertools.product(ROWS, COLS):
        sf = _rand_pow2((*lead, m, k), seed=m + 7 * k)
        packed = to_deepgemm_ue8m0(sf)
        p = (k + 3) // 4
        ma = tma_aligned_size(m, 4)
        assert packed.dtype == torch.int32 and packed.shape == (*lead, m, p)
        assert packed.stride()[-2:] == (1, ma)
        if lead:
            assert packed.stride(0) == p * ma
        assert packed.storage_offset() == 0
        assert torch.equal(from_deepgemm_ue8m0(packed, k), sf)
        codes = from_deepgemm_ue8m0(packed, k, dtype=torch.uint8)
        assert codes.dtype == torch.uint8
        assert torch.equal(codes.int(), torch.log2(sf.double()).int() + 127)
        # uint8 (MX) input packs to the same bits
        assert torch.equal(to_deepgemm_ue8m0(codes), packed)
        # padding: K bytes past k and rows m..ma are 0
        e = sf.shape[0] if lead else 1
        raw = _storage(packed, e * p * ma).view(e, p, ma).contiguous().view(torch.uint8)
        raw = raw.view(e, p, ma, 4)
        assert torch.all(raw[:, :, m:, :] == 0)
        last = raw[:, p - 1, :m, :]
        assert torch.all(last[..., k - 4 * (p - 1):] == 0)


def test_deepgemm_ue8m0_hand_checked():
    sf = torch.tensor([[1.0, 2.0, 0.5, 4.0, 8.0], [2.0**-126, 2.0**127, 2.0**-127, 1.0, 1.0]])
    packed = to_deepgemm_ue8m0(sf)
    assert packed.shape == (2, 2) and packed.stride() == (1, 4)

    def word(*b):
        b = list(b) + [0] * (4 - len(b))
        v = b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24
        return v - (1 << 32) if v >= 1 << 31 else v

    assert packed[0, 0].item() == word(127, 128, 126, 129)
    assert packed[0, 1].item() == word(130)
    assert packed[1, 0].item() == word(1, 254, 0, 127)
    assert packed[1, 1].item() == word(127)
    # storage: MN-major: [p=0: rows 0,1,pad,pad][p=1: rows 0,1,pad,pad]
    assert _storage(packed, 8).tolist() == [
        word(127, 128, 126, 129), word(1, 254, 0, 127), 0, 0, word(130), word(127), 0, 0
    ]
    assert torch.equal(from_deepgemm_ue8m0(packed, 5), sf)


def test_deepgemm_ue8m0_nan_inf_and_errors():
    sf = torch.tensor([[1.0, float("nan"), float("inf"), -float("nan")]])
    back = from_deepgemm_ue8m0(to_deepgemm_ue8m0(sf), 4)
    assert back[0, 0] == 1.0 and torch.isnan(back[0, 1:]).all()  # +Inf -> E8M0 NaN (documented)
    for bad in (3.0, 0.0, -1.0, 2.0**-130, -float("inf"), 1.5):
        with pytest.raises(ValueError, match="power of two"):
            to_deepgemm_ue8m0(torch.tensor([[1.0, bad]]))
    # check=False: no validation (no host sync); exponent field packed as is
    p = to_deepgemm_ue8m0(torch.tensor([[3.0]]), check=False)
    assert from_deepgemm_ue8m0(p, 1).item() == 2.0
    with pytest.raises(TypeError, match="dtype"):
        to_deepgemm_ue8m0(torch.ones(2, 2, dtype=torch.float16))
    with pytest.raises(ValueError, match="2-D"):
        to_deepgemm_ue8m0(torch.ones(2, 2, 2, 2))
    with pytest.raises(ValueError, match="sf_k"):
        from_deepgemm_ue8m0(to_deepgemm_ue8m0(torch.ones(3, 5)), 9)
    with pytest.raises(TypeError, match="dtype"):
        from_deepgemm_ue8m0(torch.ones(3, 2), 5)
    with pytest.raises(ValueError, match="dtype"):
        from_deepgemm_ue8m0(to_deepgemm_ue8m0(torch.ones(3, 5)), 5, dtype=torch.float16)
    with pytest.raises(TypeError, match="dtype"):
        to_deepgemm_fp32(torch.ones(2, 2, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="2-D"):
        to_deepgemm_fp32(torch.ones(4))
    with pytest.raises(TypeError, match="torch.Tensor"):
        to_deepgemm_fp32([[1.0]])


# --------------------------------------------------------------------------- 32_4_4 blocked
def _blocked_offset(r, c, cols):
    """cuBLAS "1D block scaling factors layout", written independently of the code."""
    n_col_tiles = (cols + 3) // 4
    tile = (r // 128) * n_col_tiles + c // 4
    return tile * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)


@pytest.mark.parametrize("lead", LEADS)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float8_e4m3fn, torch.float8_e8m0fnu])
def test_blocked_round_trip_formula_padding(lead, dtype):
    for rows, cols in itertools.product(ROWS, COLS):
        u = _rand_u8((*lead, rows, cols), seed=rows * 1000 + cols)
        s = u.view(dtype)
        b = to_blocked(s)
        n = blocked_numel(rows, cols)
        assert b.dtype == dtype and b.shape == (*lead, n) and b.is_contiguous()
        assert n == ((rows + 127) // 128) * ((cols + 3) // 4) * 512
        assert torch.equal(from_blocked(b, rows, cols).view(torch.uint8), u)
        # every element at the documented byte offset
        r = torch.arange(rows)[:, None]
        c = torch.arange(cols)[None, :]
        off = _blocked_offset(r, c, cols)
        bu = b.view(torch.uint8)
        assert torch.equal(bu[..., off], u)
        # everything else is padding and zero
        mask = torch.ones(n, dtype=torch.bool)
        mask[off.flatten()] = False
        assert torch.all(bu[..., mask] == 0)


def test_blocked_hand_checked_positions():
    rows, cols = 300, 5  # 3 row tiles x 2 col tiles
    s = torch.zeros(rows, cols, dtype=torch.uint8)
    cases = {
        (0, 0): 0, (0, 3): 3, (1, 0): 16, (32, 0): 4, (33, 2): 16 + 4 + 2, (127, 3): 511,
        (0, 4): 512, (128, 0): 1024, (129, 4): 1536 + 16, (299, 4): 5 * 512 + 11 * 16 + 1 * 4 + 0,
    }
    for i, (rc, _) in enumerate(cases.items()):
        s[rc] = i + 1
    b = to_blocked(s)
    assert b.numel() == 3 * 2 * 512
    for i, (rc, off) in enumerate(cases.items()):
        assert b[off].item() == i + 1, (rc, off)
    assert int((b != 0).sum()) == len(cases)


def test_blocked_non_contiguous_and_empty():
    u = _rand_u8((130, 20))[:, 1::3]  # strided input
    assert torch.equal(from_blocked(to_blocked(u), 130, 7), u)
    for shape in ((0, 5), (5, 0), (2, 0, 3)):
        z = torch.zeros(shape, dtype=torch.uint8)
        b = to_blocked(z)
        assert b.shape == (*shape[:-2], 0)
        assert from_blocked(b, shape[-2], shape[-1]).shape == z.shape


def test_gpumode_view_is_a_view():
    rows, cols, L = 300, 57, 2
    u = _rand_u8((L, rows, cols))
    b = to_blocked(u.view(torch.float8_e4m3fn))
    v = gpumode_view(b, rows, cols)
    assert v.shape == (32, 4, 3, 4, 15, L)
    assert v.data_ptr() == b.data_ptr()  # a view of the same bytes
    vu = v.view(torch.uint8)
    for l, r, c in [(0, 0, 0), (1, 33, 2), (0, 299, 56), (1, 128, 4), (0, 127, 3)]:
        assert vu[r % 32, (r % 128) // 32, r // 128, c % 4, c // 4, l] == u[l, r, c]
    # GPU MODE builds it as a permute (3, 4, 1, 5, 2, 0) of contiguous [L, rm, rk, 32, 4, 4]
    assert v.stride() == (16, 4, 15 * 512, 1, 512, 3 * 15 * 512)
    assert torch.equal(from_gpumode(v, rows, cols).view(torch.uint8), u)
    b2 = to_blocked(u[0])
    assert gpumode_view(b2, rows, cols).shape == (32, 4, 3, 4, 15, 1)


def test_blocked_errors():
    with pytest.raises(TypeError, match="dtype"):
        to_blocked(torch.ones(4, 4))
    with pytest.raises(ValueError, match="dimension"):
        to_blocked(torch.ones(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="512"):
        from_blocked(torch.zeros(100, dtype=torch.uint8), 1, 1)
    with pytest.raises(ValueError, match="stride"):
        from_blocked(torch.zeros(1024, dtype=torch.uint8)[::2], 1, 1)
    with pytest.raises(ValueError, match="non-negative"):
        from_blocked(torch.zeros(0, dtype=torch.uint8), -1, 1)
    with pytest.raises(ValueError, match="L"):
        from_gpumode(torch.zeros(32, 4, 1, 4, 2, 1, dtype=torch.uint8), 1, 1)
    with pytest.raises(ValueError, match=r"\[N\]"):
        gpumode_view(torch.zeros(1, 1, 512, dtype=torch.uint8), 1, 1)


# --------------------------------------------------------------------------- ScaledTensor level
@pytest.mark.parametrize("shape", [(1, 130), (129, 300), (3, 5, 257)])
def test_to_from_deepgemm_fp8_block_activations(shape):
    x = randn_like_activations(*shape, seed=1)
    q = quantize(x, "fp8_block")
    data, s = to_deepgemm(q)
    assert data is q.data
    assert s.stride()[-2:] == (1, tma_aligned_size(shape[-2], 4)) and torch.equal(s, q.scale)
    q2 = from_deepgemm(data, s)
    assert torch.equal(dequantize(q2), dequantize(q)) and q2.rounding == q.rounding
    with pytest.raises(ValueError, match="rceil"):
        to_deepgemm(q, packed_ue8m0=True)  # EXACT scales are not powers of two; no sync needed

    qr = quantize(x, "fp8_block", rounding="rceil")
    data, p = to_deepgemm(qr, packed_ue8m0=True)
    assert p.dtype == torch.int32 and p.shape == (*shape[:-1], (qr.scale.shape[-1] + 3) // 4)
    q3 = from_deepgemm(data, p)
    assert torch.equal(q3.scale, qr.scale) and torch.equal(dequantize(q3), dequantize(qr))


def test_to_from_deepgemm_fp8_block_weights():
    w = randn_like_activations(300, 257, seed=2)
    q = quantize(w, "fp8_block", block=(128, 128), rounding="rceil")
    data, s = to_deepgemm(q)
    assert s is q.scale  # sm90 takes canonical contiguous [ceil(N/128), ceil(K/128)] scales
    data, p = to_deepgemm(q, packed_ue8m0=True)  # sm100: broadcast to one row per data row
    assert p.shape == (300, 1)
    per_row = from_deepgemm_ue8m0(p, 3)
    assert torch.equal(per_row, q.scale.repeat_interleave(128, 0)[:300])
    q2 = from_deepgemm(data, p, block=(128, 128))
    assert torch.equal(q2.scale, q.scale) and torch.equal(dequantize(q2), dequantize(q))


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4"])
def test_to_from_deepgemm_mx(fmt):
    x = randn_like_activations(130, 96, seed=3)
    q = quantize(x, fmt)
    with pytest.raises(ValueError, match="packed_ue8m0"):
        to_deepgemm(q)
    data, p = to_deepgemm(q, packed_ue8m0=True)
    assert data.dtype == (torch.int8 if fmt == "mxfp4" else torch.float8_e4m3fn)
    assert torch.equal(from_deepgemm_ue8m0(p, 3, dtype=torch.uint8), q.scale)
    q2 = from_deepgemm(data, p, fmt)
    assert torch.equal(dequantize(q2), dequantize(q))


def test_to_deepgemm_errors():
    with pytest.raises(ValueError, match="nvfp4"):
        to_deepgemm(quantize(torch.randn(4, 32), "nvfp4"))
    with pytest.raises(ValueError, match="2-D"):
        to_deepgemm(quantize(torch.randn(2, 2, 2, 128), "fp8_block"))
    with pytest.raises(TypeError, match="ScaledTensor"):
        to_deepgemm(torch.randn(4, 128))
    with pytest.raises(ValueError, match="nvfp4"):
        from_deepgemm(torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, 1), "nvfp4")


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("shape", [(1, 33), (129, 200), (2, 130, 64)])
def test_to_from_cublas(fmt, shape):
    x = randn_like_activations(*shape, seed=4)
    q = quantize(x, fmt)
    data, s = to_cublas(q)
    want_data = {"mxfp8": torch.float8_e4m3fn}.get(fmt, torch.float4_e2m1fn_x2)
    want_s = torch.float8_e4m3fn if fmt == "nvfp4" else torch.float8_e8m0fnu
    assert data.dtype == want_data and s.dtype == want_s
    assert s.shape == (*shape[:-2], blocked_numel(shape[-2], q.scale.shape[-1]))
    q2 = from_cublas(data, s, fmt, q.shape, global_scale=q.global_scale)
    assert torch.equal(q2.scale.view(torch.uint8), q.scale.view(torch.uint8))
    assert torch.equal(q2.data.view(torch.uint8), q.data.view(torch.uint8))
    assert torch.equal(dequantize(q2), dequantize(q))


def test_cublas_errors():
    with pytest.raises(ValueError, match="32_4_4"):
        to_cublas(quantize(torch.randn(4, 128), "fp8_block"))
    with pytest.raises(ValueError, match="2 dimensions"):
        to_cublas(quantize(torch.randn(64), "mxfp8"))
    with pytest.raises(ValueError, match="global_scale"):
        from_cublas(torch.zeros(1, 8, dtype=torch.uint8), torch.zeros(512, dtype=torch.uint8), "nvfp4", (1, 16))
    with pytest.raises(ValueError, match="global_scale"):
        from_cublas(torch.zeros(1, 16, dtype=torch.uint8), torch.zeros(512, dtype=torch.uint8), "mxfp4", (1, 32),
                    global_scale=1.0)
    with pytest.raises(ValueError, match="fmt"):
        from_cublas(torch.zeros(1, 16), torch.zeros(512), "nope", (1, 32))


@pytest.mark.gpu
def test_layouts_on_gpu_match_cpu():
    """Device-agnostic: the converters give the same bits on CUDA as on CPU."""
    sf = _rand_pow2((3, 257, 57))
    assert torch.equal(to_deepgemm_ue8m0(sf.cuda()).cpu(), to_deepgemm_ue8m0(sf))
    assert to_deepgemm_fp32(sf.cuda()).stride() == to_deepgemm_fp32(sf).stride()
    u = _rand_u8((2, 300, 57))
    assert torch.equal(to_blocked(u.cuda()).cpu(), to_blocked(u))
    assert torch.equal(from_blocked(to_blocked(u.cuda()), 300, 57).cpu(), u)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
def test_to_cublas_feeds_scaled_mm_on_blackwell(fmt):
    """The real check of the 32_4_4 layout: torch._scaled_mm (cuBLAS) with our blocked scales
    equals the float64 GEMM of the dequantized operands. Needs sm100+ (no MX/NV cuBLAS on
    Hopper)."""
    if torch.cuda.get_device_capability()[0] < 10:
        pytest.skip("torch._scaled_mm with MX / NVFP4 block scales needs an sm100+ GPU")
    a = quantize(randn_like_activations(256, 512, seed=5), fmt).to("cuda")
    b = quantize(randn_like_activations(384, 512, seed=6), fmt).to("cuda")
    da, sa = to_cublas(a)
    db, sb = to_cublas(b)
    y = torch._scaled_mm(da, db.t(), sa, sb, out_dtype=torch.bfloat16).double()
    ref = dequantize(a).double() @ dequantize(b).double().T
    if fmt == "nvfp4":  # cuBLAS applies sf only; dequantize also divides by gs
        ref = ref * (a.global_scale.double() * b.global_scale.double())
    rel = (y - ref).norm() / ref.norm()
    assert rel < 1e-2, rel  # bf16 output rounding (2**-9) dominates; a layout bug gives ~1


@pytest.mark.gpu
def test_matches_deepgemm_if_installed():
    """Same shapes, strides and bits as DeepGEMM's own layout functions (when installed)."""
    dg = pytest.importorskip("deep_gemm")
    for shape in ((300, 57), (3, 129, 5), (1, 1)):
        sf = (torch.rand(shape) + 0.01).cuda()
        ours, theirs = to_deepgemm_fp32(sf), dg.get_mn_major_tma_aligned_tensor(sf)
        assert ours.shape == theirs.shape and ours.stride() == theirs.stride()
        assert torch.equal(ours, theirs)
        p2 = _rand_pow2(shape).cuda()
        try:
            theirs = dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(p2)
        except Exception as e:  # not built for this GPU / version
            pytest.skip(f"deep_gemm packed UE8M0 unavailable here: {e}")
        ours = to_deepgemm_ue8m0(p2)
        assert ours.shape == theirs.shape and ours.stride() == theirs.stride()
        assert torch.equal(ours, theirs)
