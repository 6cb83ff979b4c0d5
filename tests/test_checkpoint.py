"""blockscaled.checkpoint: checkpoint layouts <-> ScaledTensor.

Round trips (ours -> layout -> ours) are bitwise on data, scale and global scale. Dequantization is
checked against independent code: transformers' own dequantizers (FineGrainedFP8, gpt-oss MXFP4,
its MX/FP4 path) where they run on CPU; the ModelOpt and compressed-tensors formulas written out
here; and those libraries themselves when they are importable (optional: not dependencies)."""

from __future__ import annotations

import pytest
import torch

import blockscaled as bs
from blockscaled import checkpoint as ck
from blockscaled.formats import ScaleRounding
from blockscaled.reference.quantize import e2m1_decode, e8m0_to_fp32, unpack_fp4
from blockscaled.reference.quantize import quantize as ref_quantize

E8M0 = getattr(torch, "float8_e8m0fnu", None)


def _w(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * torch.rand(shape[:-1] + (1,), generator=g).add(0.1)


def _q(shape, fmt, seed=0, **kw):
    """Quantized weights from the reference quantizer (the same bits as bs.quantize, without
    the Triton interpreter's cost on CPU)."""
    if fmt == "fp8_block":
        kw.setdefault("block", (128, 128))
    return ref_quantize(_w(shape, seed), fmt, **kw)


def _bytes(t):
    return t.view(torch.uint8) if t.dtype.itemsize == 1 else t.view(torch.int32)


def _same(a: bs.ScaledTensor, b: bs.ScaledTensor, rounding=True):
    assert a.format is b.format and a.shape == b.shape and a.block == b.block
    assert torch.equal(_bytes(a.data), _bytes(b.data))
    assert torch.equal(_bytes(a.scale), _bytes(b.scale))
    if a.global_scale is None:
        assert b.global_scale is None
    else:
        assert a.global_scale.shape == b.global_scale.shape == ()
        assert torch.equal(_bytes(a.global_scale.reshape(1)), _bytes(b.global_scale.reshape(1)))
    if rounding:
        assert a.rounding == b.rounding


def _recip(x):
    return torch.div(torch.ones_like(x), x)


# --------------------------------------------------------------------------- fp8 block (DeepSeek-V3)
@pytest.mark.parametrize("shape", [(128, 256), (200, 300), (1, 5), (3, 130, 260)])
@pytest.mark.parametrize("suffix", ["_scale_inv", "_scale"])
def test_fp8_block_round_trip(shape, suffix):
    w = _q(shape, "fp8_block")
    sd = ck.to_fp8_block(w, "model.layers.0.mlp.down_proj", scale_suffix=suffix)
    assert set(sd) == {"model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.down_proj.weight" + suffix}
    assert sd["model.layers.0.mlp.down_proj.weight" + suffix].shape == (*shape[:-2], -(-shape[-2] // 128),
                                                                         -(-shape[-1] // 128))
    _same(ck.load_fp8_block(sd, "model.layers.0.mlp.down_proj"), w)


def test_fp8_block_experts_weight_name():
    w = _q((4, 256, 128), "fp8_block")
    sd = ck.to_fp8_block(w, "mlp.experts", weight_name="gate_up_proj")
    assert set(sd) == {"mlp.experts.gate_up_proj", "mlp.experts.gate_up_proj_scale_inv"}
    _same(ck.load_fp8_block(sd, "mlp.experts", weight_name="gate_up_proj"), w)


def test_fp8_block_rounding_and_ue8m0():
    exact = _q((200, 300), "fp8_block")
    rceil = _q((200, 300), "fp8_block", rounding="rceil")
    assert ck.load_fp8_block(ck.to_fp8_block(exact)).rounding is ScaleRounding.EXACT
    assert ck.load_fp8_block(ck.to_fp8_block(rceil)).rounding is ScaleRounding.RCEIL  # all powers of two
    assert ck.load_fp8_block(ck.to_fp8_block(rceil), rounding="exact").rounding is ScaleRounding.EXACT
    if E8M0 is None:
        pytest.skip("torch without float8_e8m0fnu")
    sd = ck.to_fp8_block(rceil, scale_dtype=E8M0)
    assert sd["weight_scale_inv"].dtype == E8M0
    _same(ck.load_fp8_block(sd), rceil)
    # transformers' ue8m0 dequant reads the same values
    assert torch.equal(sd["weight_scale_inv"].float(), rceil.scale)
    with pytest.raises(ValueError, match="powers of two"):
        ck.to_fp8_block(exact, scale_dtype=E8M0)


@pytest.mark.parametrize("shape", [(256, 384), (200, 300), (2, 130, 260)])
def test_fp8_block_dequant_matches_transformers(shape):
    fg = pytest.importorskip("transformers.integrations.finegrained_fp8")
    w = _q(shape, "fp8_block", seed=1)
    sd = ck.to_fp8_block(w)
    ours = bs.dequantize(ck.load_fp8_block(sd))
    checked = 0
    # transformers' two dequantizers, as far as the installed release has them (5.17, the GPU
    # image's, has only the load-time converter)
    if hasattr(fg, "_dequantize_fp8_weight"):
        theirs = fg._dequantize_fp8_weight(sd["weight"], sd["weight_scale_inv"], [128, 128], torch.float32)
        assert torch.equal(ours, theirs)
        checked += 1
    if shape[-2] % 128 == 0 and shape[-1] % 128 == 0:  # the load-time converter needs whole blocks
        other = fg.Fp8Dequantize(None)._dequantize_one(sd["weight"], sd["weight_scale_inv"], torch.float32)
        assert torch.equal(ours, other)
        checked += 1
    if not checked:
        pytest.skip("this transformers release has no fp8 block dequantizer for partial blocks")


# --------------------------------------------------------------------------- gpt-oss MXFP4
@pytest.mark.parametrize("shape", [(4, 64, 96), (3, 90, 320), (33, 64)])
def test_gpt_oss_round_trip(shape):
    w = _q(shape, "mxfp4", seed=2)
    sd = ck.to_gpt_oss_mxfp4(w, "model.layers.0.mlp.experts.down_proj")
    b, s = sd["model.layers.0.mlp.experts.down_proj_blocks"], sd["model.layers.0.mlp.experts.down_proj_scales"]
    assert b.dtype == s.dtype == torch.uint8
    assert b.shape == (*shape[:-1], shape[-1] // 32, 16) and s.shape == (*shape[:-1], shape[-1] // 32)
    _same(ck.load_gpt_oss_mxfp4(sd, "model.layers.0.mlp.experts.down_proj"), w)
    assert ck.load_gpt_oss_mxfp4(sd, "model.layers.0.mlp.experts.down_proj", rounding="floor").rounding \
        is ScaleRounding.FLOOR


def test_gpt_oss_dequant_matches_transformers():
    mx = pytest.importorskip("transformers.integrations.mxfp4")
    w = _q((4, 2 * 48, 160), "mxfp4", seed=3)
    sd = ck.to_gpt_oss_mxfp4(w, "e.gate_up_proj")
    # transformers: [E, N, G, 16] -> dequantized and transposed to [E, K, N]
    theirs = mx.convert_moe_packed_tensors(sd["e.gate_up_proj_blocks"], sd["e.gate_up_proj_scales"],
                                           dtype=torch.float32)
    loaded = ck.load_gpt_oss_mxfp4(sd, "e.gate_up_proj")
    assert torch.equal(bs.dequantize(loaded), theirs.transpose(1, 2))
    # gpt-oss: gate, up = gate_up[..., ::2], gate_up[..., 1::2] on the [E, K, 2I] eager weight
    gate, up = ck.split_gate_up(loaded)
    assert gate.shape == up.shape == (4, 48, 160)
    assert torch.equal(bs.dequantize(gate), theirs[..., ::2].transpose(1, 2))
    assert torch.equal(bs.dequantize(up), theirs[..., 1::2].transpose(1, 2))
    _same(ck.interleave_gate_up(gate, up), loaded)


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8", "nvfp4"])
def test_split_interleave_gate_up(fmt):
    gate, up = _q((2, 24, 70), fmt, seed=4), _q((2, 24, 70), fmt, seed=5)
    if fmt == "nvfp4":
        with pytest.raises(ValueError, match="global_scale"):
            ck.interleave_gate_up(gate, up)
        up = ref_quantize(_w((2, 24, 70), 5), fmt, global_scale=gate.global_scale)
    fused = ck.interleave_gate_up(gate, up)
    assert fused.shape == (2, 48, 70)
    assert torch.equal(bs.dequantize(fused)[:, 0::2], bs.dequantize(gate))
    g2, u2 = ck.split_gate_up(fused)
    _same(g2, gate)
    _same(u2, up)


@pytest.mark.parametrize("k", [40, 70, 1])
def test_gpt_oss_padded_k(k):
    w = _q((3, 8, k), "mxfp4", seed=6)
    sd = ck.to_gpt_oss_mxfp4(w, "p")
    g = -(-k // 32)
    assert sd["p_blocks"].shape == (3, 8, g, 16)
    _same(ck.load_gpt_oss_mxfp4(sd, "p", k=k), w)
    whole = ck.load_gpt_oss_mxfp4(sd, "p")  # without k: the zero-padded 32 * G columns
    assert whole.shape[-1] == 32 * g
    assert torch.equal(bs.dequantize(whole)[..., :k], bs.dequantize(w))
    assert not bs.dequantize(whole)[..., k:].any()
    if k > 2:
        with pytest.raises(ValueError, match="nonzero fp4 codes beyond column"):
            ck.load_gpt_oss_mxfp4(sd, "p", k=k - 2)
    with pytest.raises(ValueError, match=r"k: expected 1\.\.\d+"):
        ck.load_gpt_oss_mxfp4(sd, "p", k=32 * g + 1)


# --------------------------------------------------------------------------- ModelOpt NVFP4
def _modelopt_dequant(sd, prefix, k):
    """ModelOpt's NVFP4QTensor.dequantize: e2m1 * (weight_scale * weight_scale_2)."""
    codes = unpack_fp4(sd[prefix + ".weight"], k)
    per_block = sd[prefix + ".weight_scale"].float() * sd[prefix + ".weight_scale_2"]
    return e2m1_decode(codes) * per_block.repeat_interleave(16, dim=-1)[..., :k]


def _modelopt_quantize(w):
    """ModelOpt's NVFP4QTensor.quantize, written out: weight_scale_2 = amax / (6 * 448), block
    scales e4m3(block_amax / (6 * weight_scale_2)), codes e2m1(w / (weight_scale * weight_scale_2))."""
    from blockscaled.reference.quantize import e2m1_encode, pack_fp4

    ws2 = w.abs().amax() / (6.0 * 448.0)
    blocks = w.view(*w.shape[:-1], -1, 16)
    sf = (blocks.abs().amax(-1) / (6.0 * ws2)).clamp(min=2**-9).to(torch.float8_e4m3fn)
    codes = e2m1_encode((blocks / (sf.float() * ws2).unsqueeze(-1)).view(w.shape))
    return {"m.weight": pack_fp4(codes), "m.weight_scale": sf, "m.weight_scale_2": ws2}


@pytest.mark.parametrize("shape", [(64, 96), (2, 33, 48), (16, 41)])
def test_modelopt_round_trip(shape):
    w = _q(shape, "nvfp4", seed=7)
    sd = ck.to_modelopt_nvfp4(w, "m", input_global_scale=torch.tensor(0.5))
    assert sd["m.weight"].dtype == torch.uint8 and sd["m.weight_scale"].dtype == torch.float8_e4m3fn
    assert sd["m.weight_scale_2"].shape == () and sd["m.input_scale"].shape == ()
    assert torch.equal(sd["m.weight_scale_2"], _recip(w.global_scale))  # a dequant multiplier
    assert sd["m.input_scale"].item() == 2.0
    loaded, x_gs = ck.load_modelopt_nvfp4(sd, "m", k=shape[-1])
    assert x_gs.item() == 0.5
    if _recip(_recip(w.global_scale)) == w.global_scale:
        _same(loaded, w)
    # data and scales always bitwise; the global scale to within the reciprocal's rounding
    assert torch.equal(loaded.data, w.data) and torch.equal(_bytes(loaded.scale), _bytes(w.scale))
    gs, gs2 = w.global_scale.view(torch.int32), loaded.global_scale.view(torch.int32)
    assert abs(int(gs) - int(gs2)) <= 1
    # dequantization agrees with ModelOpt's formula to two fp32 roundings
    theirs = _modelopt_dequant(sd, "m", shape[-1])
    ours = bs.dequantize(loaded)
    assert torch.allclose(ours, theirs, rtol=2.5e-7, atol=0)


def test_modelopt_global_scale_bitwise():
    # a power-of-two gs, and the 86% of fp32 values with 1 / (1 / gs) == gs, round-trip exactly
    for gs in (torch.tensor(256.0), torch.tensor(3.0), torch.tensor(757.4661)):
        if _recip(_recip(gs)) != gs:
            continue
        w = ref_quantize(_w((32, 64), 8), "nvfp4", global_scale=gs)
        _same(ck.load_modelopt_nvfp4(ck.to_modelopt_nvfp4(w, "m"), "m").weight, w)
    # and ModelOpt -> ours -> ModelOpt keeps weight_scale_2 when 1 / (1 / ws2) == ws2
    sd = _modelopt_quantize(_w((32, 64), 9))
    back = ck.to_modelopt_nvfp4(ck.load_modelopt_nvfp4(sd, "m").weight, "m")
    ws2 = sd["m.weight_scale_2"]
    assert torch.equal(back["m.weight"], sd["m.weight"]) and torch.equal(_bytes(back["m.weight_scale"]),
                                                                         _bytes(sd["m.weight_scale"]))
    assert torch.equal(back["m.weight_scale_2"], _recip(_recip(ws2)))


def test_modelopt_convention_against_its_quantizer():
    """A checkpoint made the ModelOpt way loads to values near the original weight (an inverted
    convention would be off by amax**2), and our quantizer with gs = 1 / weight_scale_2 makes the
    same bits."""
    x = _w((48, 64), 10)
    sd = _modelopt_quantize(x)
    loaded = ck.load_modelopt_nvfp4(sd, "m").weight
    ours = bs.dequantize(loaded)
    assert torch.allclose(ours, _modelopt_dequant(sd, "m", 64), rtol=2.5e-7, atol=0)
    assert (ours - x).abs().max() <= x.abs().amax() / 6  # within an e2m1 step of the block maximum
    requant = ref_quantize(x, "nvfp4", global_scale=loaded.global_scale)
    assert torch.equal(requant.data, sd["m.weight"])
    assert torch.equal(_bytes(requant.scale), _bytes(sd["m.weight_scale"]))


def test_modelopt_library_if_installed():
    qt_mod = pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor")
    x = _w((64, 96), 11)
    qt, sf, ws2 = qt_mod.NVFP4QTensor.quantize(x.clone(), 16)
    sd = {"m.weight": qt._quantized_data, "m.weight_scale": sf, "m.weight_scale_2": ws2}
    loaded = ck.load_modelopt_nvfp4(sd, "m").weight
    theirs = qt.dequantize(dtype=torch.float32, scale=sf, double_scale=ws2, block_sizes={-1: 16})
    assert torch.allclose(bs.dequantize(loaded), theirs, rtol=2.5e-7, atol=0)
    requant = ref_quantize(x, "nvfp4", global_scale=loaded.global_scale)
    assert torch.equal(requant.data, qt._quantized_data) and torch.equal(_bytes(requant.scale), _bytes(sf))


# --------------------------------------------------------------------------- compressed-tensors
CT_CASES = [("nvfp4", (64, 96)), ("nvfp4", (33, 40)), ("nvfp4", (2, 16, 41)), ("mxfp4", (64, 96)),
            ("mxfp4", (7, 50)), ("mxfp8", (64, 96)), ("mxfp8", (5, 33)), ("fp8_block", (200, 300))]


def _ct_dequant(sd, fmt, k):
    """compressed-tensors' _dequantize: x_q * (weight_scale / weight_global_scale) per group."""
    if fmt in ("nvfp4", "mxfp4"):
        xq = e2m1_decode(unpack_fp4(sd["weight_packed"], k))
    else:
        xq = sd["weight"].float()
    if fmt == "fp8_block":
        s = sd["weight_scale"].repeat_interleave(128, -2).repeat_interleave(128, -1)
        return xq * s[..., : xq.shape[-2], :k]
    s = sd["weight_scale"].float() / sd["weight_global_scale"] if fmt == "nvfp4" else e8m0_to_fp32(sd["weight_scale"])
    return xq * s.repeat_interleave(16 if fmt == "nvfp4" else 32, -1)[..., :k]


@pytest.mark.parametrize("fmt,shape", CT_CASES)
def test_compressed_tensors_round_trip(fmt, shape):
    w = _q(shape, fmt, seed=12)
    sd = ck.to_compressed_tensors(w, "model.layers.0.mlp.up_proj", input_global_scale=7.0)
    names = {n.rsplit(".", 1)[-1] for n in sd}
    want = {"nvfp4": {"weight_packed", "weight_scale", "weight_global_scale"}, "mxfp4": {"weight_packed",
            "weight_scale"}, "mxfp8": {"weight", "weight_scale"}, "fp8_block": {"weight", "weight_scale"}}[fmt]
    want = want | {"input_global_scale"} | ({"weight_shape"} if fmt in ("nvfp4", "mxfp4") and shape[-1] % 2 else set())
    assert names == want
    assert ck.detect_layout(sd, "model.layers.0.mlp.up_proj") == ("fp8_block" if fmt == "fp8_block"
                                                                   else "compressed_tensors")
    loaded, x_gs = ck.load_compressed_tensors(sd, "model.layers.0.mlp.up_proj", format=fmt)
    _same(loaded, w)
    assert x_gs.shape == () and x_gs.item() == 7.0
    local = {n.rsplit(".", 1)[-1]: t for n, t in sd.items()}
    theirs = _ct_dequant(local, fmt, shape[-1])
    assert torch.allclose(bs.dequantize(loaded), theirs, rtol=1.2e-7, atol=0)


def test_compressed_tensors_dequant_matches_transformers_mx_path():
    """transformers' Fp8Dequantize reads uint8 scales as E8M0 and int8 weights as packed e2m1:
    an independent dequantizer of the mxfp8 / mxfp4 compressed-tensors tensors."""
    fg = pytest.importorskip("transformers.integrations.finegrained_fp8")
    deq = fg.Fp8Dequantize(None)
    w8 = _q((64, 96), "mxfp8", seed=13)
    sd = ck.to_compressed_tensors(w8)
    assert torch.equal(deq._dequantize_one(sd["weight"], sd["weight_scale"], torch.float32), bs.dequantize(w8))
    w4 = _q((64, 96), "mxfp4", seed=14)
    sd = ck.to_compressed_tensors(w4)
    theirs = deq._dequantize_one(sd["weight_packed"].view(torch.int8), sd["weight_scale"], torch.float32)
    assert torch.equal(theirs, bs.dequantize(ck.load_compressed_tensors(sd).weight))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8", "fp8_block"])
def test_compressed_tensors_library_if_installed(fmt):
    fwd = pytest.importorskip("compressed_tensors.quantization.lifecycle.forward")
    from compressed_tensors.compressors.mx_utils import decompress_mx_scale
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization import preset_name_to_scheme

    args = preset_name_to_scheme(fmt.upper(), ["Linear"]).weights
    w = _q((256, 384), fmt, seed=15)
    sd = ck.to_compressed_tensors(w)
    if fmt in ("nvfp4", "mxfp4"):
        xq = unpack_fp4_from_uint8(sd["weight_packed"], 256, 384, dtype=torch.float32)
    else:
        xq = sd["weight"] if fmt == "fp8_block" else sd["weight"].float()
    s = decompress_mx_scale(sd["weight_scale"]).float() if fmt.startswith("mx") else sd["weight_scale"].float()
    theirs = fwd.dequantize(xq, scale=s, global_scale=sd.get("weight_global_scale"), args=args, dtype=torch.float32)
    ours = bs.dequantize(ck.load_compressed_tensors(sd).weight)
    if fmt == "nvfp4":  # theirs rounds scale / global_scale first, ours the exact product once
        assert torch.allclose(ours, theirs, rtol=1.2e-7, atol=0)
    else:
        assert torch.equal(ours, theirs)


# --------------------------------------------------------------------------- files, detection
def _all_layouts():
    nv = _q((32, 64), "nvfp4", seed=16)
    return {
        **ck.to_fp8_block(_q((200, 300), "fp8_block", seed=17), "layers.0.mlp.down_proj"),
        **ck.to_modelopt_nvfp4(nv, "layers.0.self_attn.q_proj", input_global_scale=2.0),
        **ck.to_gpt_oss_mxfp4(_q((4, 32, 64), "mxfp4", seed=18), "layers.0.mlp.experts.gate_up_proj"),
        **ck.to_compressed_tensors(nv, "layers.0.self_attn.o_proj"),
        **ck.to_compressed_tensors(_q((32, 64), "mxfp8", seed=19), "layers.0.self_attn.k_proj"),
        "layers.0.input_layernorm.weight": torch.ones(64, dtype=torch.bfloat16),
        "lm_head.weight": torch.zeros(8, 64, dtype=torch.bfloat16),
    }


def test_detect_layouts():
    sd = _all_layouts()
    assert ck.detect_layouts(sd) == {
        "layers.0.mlp.down_proj": "fp8_block",
        "layers.0.self_attn.q_proj": "modelopt_nvfp4",
        "layers.0.mlp.experts.gate_up_proj": "gpt_oss_mxfp4",
        "layers.0.self_attn.o_proj": "compressed_tensors",
        "layers.0.self_attn.k_proj": "compressed_tensors",
    }
    assert ck.detect_layout(sd, "lm_head") is None and ck.detect_layout(sd, "nothing.here") is None
    per_channel = {"weight": torch.zeros(200, 64, dtype=torch.float8_e4m3fn), "weight_scale": torch.ones(200, 1)}
    assert ck.detect_layout(per_channel) is None
    assert set(ck.LAYOUTS) == set(ck.detect_layouts(sd).values())


def test_safetensors_file_round_trip(tmp_path):
    pytest.importorskip("safetensors")
    sd = _all_layouts()
    # views of one tensor (what split_gate_up leaves) are copied rather than refused
    gate, up = ck.split_gate_up(ck.load_gpt_oss_mxfp4(sd, "layers.0.mlp.experts.gate_up_proj"))
    sd["layers.1.gate.weight_packed"] = sd["layers.0.self_attn.o_proj.weight_packed"]
    path = tmp_path / "model.safetensors"
    ck.save_file(sd, path, metadata={"format": "pt"})
    back = ck.load_file(path)
    assert set(back) == set(sd)
    for n, t in sd.items():
        assert back[n].dtype == t.dtype and back[n].shape == t.shape and torch.equal(_bytes(back[n]), _bytes(t)), n
    for src in (back,):
        _same(ck.load_fp8_block(src, "layers.0.mlp.down_proj"), ck.load_fp8_block(sd, "layers.0.mlp.down_proj"))
        _same(ck.load_modelopt_nvfp4(src, "layers.0.self_attn.q_proj").weight,
              ck.load_modelopt_nvfp4(sd, "layers.0.self_attn.q_proj").weight)
        g2, u2 = ck.split_gate_up(ck.load_gpt_oss_mxfp4(src, "layers.0.mlp.experts.gate_up_proj"))
        _same(g2, gate)
        _same(u2, up)
    from safetensors import safe_open

    with safe_open(str(path), "pt") as h:  # the loaders read single tensors from a handle
        _same(ck.load_compressed_tensors(h, "layers.0.self_attn.o_proj").weight,
              ck.load_compressed_tensors(sd, "layers.0.self_attn.o_proj").weight)
        assert ck.detect_layout(h, "layers.0.self_attn.k_proj") == "compressed_tensors"


# --------------------------------------------------------------------------- errors
def _fp8_sd():
    return ck.to_fp8_block(_q((200, 300), "fp8_block"), "mlp.down_proj")


def test_errors_missing_keys():
    sd = _fp8_sd()
    with pytest.raises(KeyError, match=r"mlp\.up_proj\.weight: missing"):
        ck.load_fp8_block(sd, "mlp.up_proj")
    del sd["mlp.down_proj.weight_scale_inv"]
    with pytest.raises(KeyError, match=r"mlp\.down_proj\.weight_scale_inv: missing.*mlp\.down_proj\.weight"):
        ck.load_fp8_block(sd, "mlp.down_proj")
    sd = ck.to_modelopt_nvfp4(_q((16, 32), "nvfp4"), "q")
    del sd["q.weight_scale_2"]
    with pytest.raises(KeyError, match=r"q\.weight_scale_2: missing"):
        ck.load_modelopt_nvfp4(sd, "q")
    with pytest.raises(KeyError, match=r"e\.down_proj_blocks: missing"):
        ck.load_gpt_oss_mxfp4({}, "e.down_proj")
    sd = ck.to_compressed_tensors(_q((16, 32), "nvfp4"), "o")
    del sd["o.weight_global_scale"]
    with pytest.raises(KeyError, match=r"o\.weight_global_scale: missing"):
        ck.load_compressed_tensors(sd, "o")


def test_errors_dtypes():
    sd = _fp8_sd()
    sd["mlp.down_proj.weight"] = sd["mlp.down_proj.weight"].float()
    with pytest.raises(TypeError, match=r"down_proj\.weight: expected dtype torch\.float8_e4m3fn .* got .*float32"):
        ck.load_fp8_block(sd, "mlp.down_proj")
    sd = _fp8_sd()
    sd["mlp.down_proj.weight_scale_inv"] = sd["mlp.down_proj.weight_scale_inv"].double()
    with pytest.raises(TypeError, match=r"weight_scale_inv: expected dtype .*float32.* got torch\.float64"):
        ck.load_fp8_block(sd, "mlp.down_proj")
    sd = ck.to_modelopt_nvfp4(_q((16, 32), "nvfp4"), "q")
    sd["q.weight_scale"] = sd["q.weight_scale"].float()
    with pytest.raises(TypeError, match=r"q\.weight_scale: expected dtype torch\.float8_e4m3fn"):
        ck.load_modelopt_nvfp4(sd, "q")
    sd = ck.to_gpt_oss_mxfp4(_q((2, 8, 64), "mxfp4"), "e")
    sd["e_scales"] = sd["e_scales"].float()
    with pytest.raises(TypeError, match=r"e_scales: expected dtype .*uint8.* got torch\.float32"):
        ck.load_gpt_oss_mxfp4(sd, "e")
    with pytest.raises(TypeError, match=r"weight_packed: expected dtype torch\.uint8 .*INTn"):
        ck.load_compressed_tensors({"weight_packed": torch.zeros(4, 2, dtype=torch.int32),
                                    "weight_scale": torch.ones(4, 1, dtype=torch.uint8)})
    with pytest.raises(TypeError, match=r"tensors: expected a mapping"):
        ck.load_fp8_block([1, 2])


def test_errors_shapes_and_values():
    sd = _fp8_sd()
    sd["mlp.down_proj.weight_scale_inv"] = torch.ones(4, 3)
    with pytest.raises(ValueError, match=r"weight_scale_inv: expected shape \(2, 3\) .* got \(4, 3\)"):
        ck.load_fp8_block(sd, "mlp.down_proj")
    sd = _fp8_sd()
    sd["mlp.down_proj.weight_scale"] = sd["mlp.down_proj.weight_scale_inv"]
    with pytest.raises(ValueError, match="both"):
        ck.load_fp8_block(sd, "mlp.down_proj")
    sd = ck.to_modelopt_nvfp4(_q((16, 32), "nvfp4"), "q")
    sd["q.weight_scale_2"] = torch.ones(2)
    with pytest.raises(ValueError, match=r"q\.weight_scale_2: expected a single value"):
        ck.load_modelopt_nvfp4(sd, "q")
    sd = ck.to_gpt_oss_mxfp4(_q((2, 8, 64), "mxfp4"), "e")
    sd["e_blocks"] = sd["e_blocks"].reshape(2, 8, 4, 8)
    with pytest.raises(ValueError, match=r"e_blocks: expected shape \[\.\.\., N, K/32, 16\]"):
        ck.load_gpt_oss_mxfp4(sd, "e")
    sd = ck.to_compressed_tensors(_q((16, 64), "mxfp4"), "")
    with pytest.raises(ValueError, match=r"format='nvfp4' was asked for, but the tensors hold mxfp4"):
        ck.load_compressed_tensors(sd, format="nvfp4")
    with pytest.raises(ValueError, match="k: only packed fp4"):
        ck.load_compressed_tensors(ck.to_compressed_tensors(_q((16, 64), "mxfp8")), k=63)
    with pytest.raises(TypeError, match="k: expected an int"):
        ck.load_modelopt_nvfp4(ck.to_modelopt_nvfp4(_q((16, 32), "nvfp4"), "q"), "q", k=31.0)


def test_errors_writers():
    with pytest.raises(ValueError, match=r"w: expected block \(128, 128\)"):
        ck.to_fp8_block(ref_quantize(_w((4, 256)), "fp8_block"))
    with pytest.raises(ValueError, match="w: expected a ScaledTensor in nvfp4, got mxfp4"):
        ck.to_modelopt_nvfp4(_q((16, 64), "mxfp4"))
    with pytest.raises(TypeError, match="w: expected a blockscaled.ScaledTensor, got Tensor"):
        ck.to_gpt_oss_mxfp4(torch.zeros(2, 2), "e")
    with pytest.raises(ValueError, match="prefix: expected the projection's name"):
        ck.to_gpt_oss_mxfp4(_q((16, 64), "mxfp4"), "")
    with pytest.raises(ValueError, match="cannot be split"):
        ck.split_gate_up(_q((256, 128), "fp8_block"))
    with pytest.raises(ValueError, match="even number of rows"):
        ck.split_gate_up(_q((5, 64), "mxfp4"))
    with pytest.raises(ValueError, match="scale_suffix"):
        ck.to_fp8_block(_q((128, 128), "fp8_block"), scale_suffix="_s")
