"""MX operands re-encoded as e4m3 for Hopper's FP8 tensor cores (reference/mx_pack.py,
kernels/triton/mx_pack.py, ops/mx_pack.py), on the CPU: the weight packer's exactness and its
refusal of tiles it cannot hold, the activation encoder's reconstruction, flags and NaN handling,
the Triton encoder (interpreter) against its twin, argument errors, the mixed pair in ``bs.gemm``,
``nn.Linear.prepack`` and the warm-up (the sm_90a builds: tests/test_aot_mx_pack.py)."""

from __future__ import annotations

import pytest
import torch

import blockscaled as bs
from blockscaled.ops import mx_pack as ops_mx
from blockscaled.reference import mx_pack as R



def _deq_encoded(data, scale, k):
    m = data.shape[0]
    kb = -(-k // 128)
    d = torch.nn.functional.pad(data.float(), (0, 128 * kb - k)).view(m, 4 * kb, 32)
    return (d * scale.unsqueeze(-1)).view(m, -1)[:, :k]


def _same_values(a, b):
    """Equal as values, NaN where the other has NaN, and bitwise for e4m3 data (-0 included)."""
    if a.dtype == b.dtype == torch.float8_e4m3fn and not torch.equal(a.view(torch.uint8), b.view(torch.uint8)):
        return False
    a, b = a.float(), b.float()
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))


@pytest.mark.parametrize("n,k", [(300, 320), (128, 128), (5, 2880), (257, 100), (129, 32)])
def test_weight_pack_exact(n, k):
    torch.manual_seed(n + k)
    # rows of different magnitudes (a 2^10 spread of block exponents inside a tile)
    w = torch.randn(n, k) * torch.logspace(-3, 0, n)[:, None]
    w[: min(n, 3), :40] = 0  # zero blocks do not count in a tile's span
    q = bs.quantize(w, "mxfp4")
    p = R.mxfp4_to_fp8_block(q)
    assert p.format.name == "fp8_block" and p.block == (128, 128)
    assert p.scale.shape == (-(-n // 128), -(-k // 128))
    # bitwise, the sign of zero included
    assert torch.equal(bs.dequantize(p, torch.float32).view(torch.int32), bs.dequantize(q, torch.float32).view(torch.int32))
    # power-of-two scales
    m, e = torch.frexp(p.scale)
    assert torch.all(m == 0.5)


def test_weight_pack_zero_tile_and_refusals():
    q = bs.quantize(torch.zeros(130, 256), "mxfp4")
    p = R.mxfp4_to_fp8_block(q)
    assert torch.all(p.scale == 1.0) and torch.all(p.data.float() == 0)
    w = torch.randn(256, 256)
    w[200, 128:160] *= 2.0 ** -16  # a block 2^16 below its tile's largest: span > 14
    q = bs.quantize(w, "mxfp4")
    assert int(R.fp8_block_tile_spans(q)[1, 1]) > R.SPAN
    with pytest.raises(ValueError, match=r"w: tile \(1, 1\) \(rows 128\.\.255, K 128\.\.255\).*1 of 4 tiles"):
        R.mxfp4_to_fp8_block(q)
    bad = bs.ScaledTensor(q.data, q.scale.clone(), "mxfp4", q.shape, (1, 32), q.rounding)
    bad.scale[0, 0] = 255  # NaN scale
    with pytest.raises(ValueError, match=r"tile \(0, 0\)"):
        R.mxfp4_to_fp8_block(bad)
    zd = q.data.clone()
    zd[3, :16] = 0  # an all-zero block whose NaN scale still dequantizes it to NaN
    zs = q.scale.clone()
    zs[3, 0] = 255
    with pytest.raises(ValueError, match=r"tile \(0, 0\)"):
        R.mxfp4_to_fp8_block(bs.ScaledTensor(zd, zs, "mxfp4", q.shape, (1, 32), q.rounding))
    with pytest.raises(ValueError, match=r"w: expected a 2-D mxfp4 ScaledTensor"):
        R.mxfp4_to_fp8_block(bs.quantize(torch.randn(4, 64), "mxfp8"))
    with pytest.raises(TypeError, match=r"w: expected a ScaledTensor"):
        R.mxfp4_to_fp8_block(torch.randn(4, 64))


def test_pow2_exact():
    e = torch.arange(-160, 128)
    got = R.pow2(e)
    want = torch.tensor([2.0 ** int(x) if x >= -149 else 0.0 for x in e], dtype=torch.float64)
    assert torch.equal(got.double(), want)
    assert torch.equal(R.pow2(torch.arange(-1074, 1024), torch.float64),
                       torch.tensor([2.0 ** int(x) for x in range(-1074, 1024)], dtype=torch.float64))


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
@pytest.mark.parametrize("m,k", [(3, 320), (17, 128), (5, 100), (1, 2880), (20, 64)])
def test_encode_reference_reconstructs(fmt, m, k):
    torch.manual_seed(m * k)
    for x in (torch.randn(m, k), torch.randn(m, k) * torch.logspace(-5, 5, k)):
        x[0, :40] = 0
        q = bs.quantize(x, fmt)
        data, scale, flag = R.encode_mx_activations(q)
        assert data.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and flag.dtype == torch.int32
        assert scale.shape == (m, 4 * (-(-k // 128))) and flag.shape == (m,)
        assert torch.equal(_deq_encoded(data, scale, k), bs.dequantize(q, torch.float32))
        # a row without a flag has one scale per 128-K group (what the kernel's fast path reads)
        kb = -(-k // 128)
        nblk = -(-k // 32)
        s = scale[:, :nblk]
        first = scale.view(m, kb, 4)[:, :, :1].expand(m, kb, 4).reshape(m, -1)[:, :nblk]
        uniform_rows = (s == first).all(1)
        assert torch.all(uniform_rows[flag == 0])


def test_encode_flags_and_nan():
    x = torch.randn(4, 256)
    x[1, 32:64] *= 2.0 ** -20  # mxfp4: a block 2^20 below its group's largest: not uniform
    q = bs.quantize(x, "mxfp4")
    _, scale, flag = R.encode_mx_activations(q)
    assert flag.tolist() == [0, 1, 0, 0]
    s = q.scale.clone()
    s[2, 5] = 255
    qn = bs.ScaledTensor(q.data, s, "mxfp4", q.shape, (1, 32), q.rounding)
    data, scale, flag = R.encode_mx_activations(qn)
    assert flag[2] == 1 and torch.isnan(scale[2, 5]) and not torch.isnan(scale[2, 4])
    assert torch.isnan(_deq_encoded(data, scale, 256)[2, 160:192]).all()
    # mxfp8: uniform only where a group's nonzero blocks share one exponent
    y = torch.ones(2, 128)
    y[1, :32] = 3.0
    _, scale, flag = R.encode_mx_activations(bs.quantize(y, "mxfp8"))
    assert flag.tolist() == [0, 1]


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8"])
@pytest.mark.parametrize("m,k", [(3, 320), (17, 128), (5, 100), (33, 2880), (20, 64), (0, 64), (4, 0)])
def test_encode_kernel_matches_twin(fmt, m, k, monkeypatch):
    if not bs._checks.INTERPRET:
        pytest.skip("needs the Triton interpreter (TRITON_INTERPRET=1)")
    torch.manual_seed(m + k)
    x = torch.randn(m, k) * torch.logspace(-4, 4, k) if k else torch.randn(m, k)
    if m and k:
        x[0, : min(k, 40)] = 0
    q = bs.quantize(x, fmt)
    if m > 2 and k >= 64:  # a NaN scale
        s = q.scale.clone()
        s[2, 1] = 255
        q = bs.ScaledTensor(q.data, s, fmt, q.shape, (1, 32), q.rounding)
    got = ops_mx.encode_mx_activations(q)
    if k == 0:
        assert got[0].shape == (m, 0) and torch.equal(got[2], torch.zeros(m, dtype=torch.int32))
        return
    ref = R.encode_mx_activations(q)
    assert _same_values(got[0], ref[0])
    assert torch.equal(got[1].view(torch.int32), ref[1].view(torch.int32))
    assert torch.equal(got[2], ref[2])


def test_encode_argument_errors():
    q = bs.quantize(torch.randn(4, 64), "nvfp4")
    with pytest.raises(ValueError, match=r"a: expected a 2-D mxfp4 or mxfp8 ScaledTensor with \(1, 32\) blocks"):
        ops_mx.encode_mx_activations(q)
    with pytest.raises(TypeError, match=r"a: expected a ScaledTensor"):
        ops_mx.encode_mx_activations(torch.randn(4, 64))


@pytest.mark.parametrize("afmt", ["mxfp4", "mxfp8"])
@pytest.mark.parametrize("m,n,k", [(3, 130, 320), (1, 64, 100), (20, 257, 2880)])
def test_mixed_gemm_matches_reference(afmt, m, n, k, path):
    """``bs.gemm`` of MX activations with a packed (fp8_block 128 x 128) weight: the dequantized
    product on every CPU path (interpreter: the fp32 fallback plan; reference), any out dtype,
    a bias, ``out=``, a 3-D ``a``; ``explain`` names the mixed pair."""
    from blockscaled.testing.tolerances import assert_gemm_close

    torch.manual_seed(m + n + k)
    w4 = bs.quantize(torch.randn(n, k) * 0.1, "mxfp4")
    w8 = bs.layouts.mxfp4_to_fp8_block(w4)
    a = bs.quantize(torch.randn(m, k) * 2, afmt)
    ref = bs.dequantize(a, torch.float32).double() @ bs.dequantize(w4, torch.float32).double().T
    for out_dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert_gemm_close(bs.gemm(a, w8, out_dtype), ref, "mxfp4", out_dtype, what=f"{afmt} {out_dtype}")
    bias = torch.randn(n)
    out = torch.full((m, n), float("nan"))
    bs.gemm(a, w8, torch.float32, out=out, bias=bias)
    assert_gemm_close(out, ref + bias.double(), "mxfp4", torch.float32)
    a3 = bs.quantize(torch.randn(2, m, k), afmt)
    y3 = bs.gemm(a3, w8)
    assert y3.shape == (2, m, n)
    plan = bs.explain("gemm", a, w8)
    assert plan.problem.a_fmt == afmt
    assert plan.backend == ("reference" if path == "reference" else "interpreter"), plan
    if path != "reference":
        assert f"{afmt} activations x fp8_block" in str(plan)


def test_mixed_gemm_custom_op_and_errors():
    """The custom op carries the pair as "<a format>/<b format>" (what torch.compile traces);
    pairs other than MX x fp8_block 128 x 128 are refused with the argument named."""
    from blockscaled.ops._custom_ops import split_pair

    assert split_pair("mxfp4/fp8_block") == ("mxfp4", "fp8_block") and split_pair("nvfp4") == ("", "nvfp4")
    for bad in ("mxfp4/mxfp4", "nvfp4/fp8_block"):
        with pytest.raises(ValueError, match=r"fmt: expected one format name or a mixed pair"):
            split_pair(bad)
    w4 = bs.quantize(torch.randn(64, 128), "mxfp4")
    w8 = bs.layouts.mxfp4_to_fp8_block(w4)
    a = bs.quantize(torch.randn(5, 128), "mxfp4")
    y = torch.ops.blockscaled.gemm(a.data, a.scale, None, w8.data, w8.scale, None, "mxfp4/fp8_block", 128, 128,
                                   w8.rounding.value, None, torch.float32)
    torch.testing.assert_close(y, bs.gemm(a, w8, torch.float32), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"a.format: expected the format of b \(fp8_block\), got nvfp4"):
        bs.gemm(bs.quantize(torch.randn(5, 128), "nvfp4"), w8)
    w8_1x128 = bs.quantize(torch.randn(64, 128), "fp8_block", block=(1, 128))
    with pytest.raises(ValueError, match=r"b.block: mxfp4 activations take an fp8_block weight with \(128, 128\)"):
        bs.gemm(a, w8_1x128)
    with pytest.raises(ValueError, match=r"a.format: expected the format of b \(mxfp4\), got mxfp8"):
        bs.gemm(bs.quantize(torch.randn(5, 128), "mxfp8"), w4)


def test_mixed_plan_on_the_gpus():
    """Planned for an H100 on the CPU: the wide kernel (unsplit, 128-row tiles) with the encoder's
    predicted time in the total (a bias added after it); TMA-unfit operands fall back to the fp32
    product, with the reason."""
    from blockscaled.config.hopper import HopperConfig
    from blockscaled.plan import Problem, plan_gemm
    from blockscaled.plan.device import H100_SXM

    for m, n, k in [(1, 2880, 2880), (2048, 5760, 2880), (8192, 8192, 8192)]:
        p = plan_gemm(Problem("gemm", "fp8_block", m, n, k, a_fmt="mxfp4"), H100_SXM)
        c = p.config
        assert isinstance(c, HopperConfig) and c.variant == "wide" and c.block_m == 128, p
        assert c.split_k == 1 and c.tail_split == 1 and p.predicted_us > 0
        assert "ASUB" in str(p)
    p = plan_gemm(Problem("gemm", "fp8_block", 64, 256, 256, a_fmt="mxfp8", bias=True), H100_SXM)
    assert isinstance(p.config, HopperConfig) and "bias added in place" in str(p)
    p = plan_gemm(Problem("gemm", "fp8_block", 64, 256, 256, a_fmt="mxfp8", tma=False), H100_SXM)
    assert p.config.strategy == "dequant_matmul" and "TMA" in str(p)


# ------------------------------------------------------------------ nn.Linear.prepack
def _mx_linear(n=192, k=256, bias=True, fmt="mxfp4", weight_only=False):
    torch.manual_seed(n + k)
    lin = torch.nn.Linear(k, n, bias=bias, dtype=torch.bfloat16)
    import blockscaled.nn as bsnn

    return bsnn.Linear.from_linear(lin, fmt, weight_only=weight_only)


def test_linear_prepack_forward(path, monkeypatch):
    """A prepacked mxfp4 layer keeps an exact fp8_block copy (not in the state dict); where the
    planner prefers it, forward quantizes x to mxfp4 and runs the mixed pair (the same product as
    the canonical path, within the table); elsewhere the canonical weight."""
    import blockscaled.nn.linear as L
    from blockscaled.plan import observe_plans
    from blockscaled.testing.tolerances import assert_gemm_close

    q = _mx_linear()
    keys = set(q.state_dict())
    assert q.prepack() is None and q.packed_weight is not None
    assert set(q.state_dict()) == keys
    assert torch.equal(bs.dequantize(q.packed_weight, torch.float32), bs.dequantize(q.weight, torch.float32))
    x = torch.randn(2, 5, 256, dtype=torch.bfloat16)
    ref = (bs.dequantize(bs.quantize(x, "mxfp4"), torch.float32).double() @
           bs.dequantize(q.weight, torch.float32).double().T + q.bias.double())
    monkeypatch.setattr(L, "prefer_packed", lambda *a: True)
    with observe_plans() as plans:
        y = q(x)
    assert y.shape == (2, 5, 192) and y.dtype == torch.bfloat16
    assert_gemm_close(y.reshape(10, 192), ref.reshape(10, 192), "mxfp4", torch.bfloat16)
    if path != "reference":
        assert plans and plans[-1].problem.a_fmt == "mxfp4", plans
    monkeypatch.setattr(L, "prefer_packed", lambda *a: False)
    with observe_plans() as plans:
        y2 = q(x)
    assert_gemm_close(y2.reshape(10, 192), ref.reshape(10, 192), "mxfp4", torch.bfloat16)
    if path != "reference":
        assert plans and plans[-1].problem.a_fmt == "", plans


def test_linear_prepack_refusals_staleness_and_moves():
    assert "nvfp4" in _mx_linear(fmt="nvfp4").prepack()
    assert "weight-only" in _mx_linear(weight_only=True).prepack()
    q = _mx_linear(bias=False)
    w = bs.quantize(torch.randn(192, 256), "mxfp4")
    d = w.data.clone()
    s = w.scale.clone()
    s[130, 0] = s[130, 1] - 20  # a block 2^20 below its tile's largest
    q.weight_data.copy_(d)
    q.weight_scale.copy_(s)
    why = q.prepack()
    assert why is not None and "tile (1, 0)" in why and q.packed_weight is None
    import copy

    q = _mx_linear(bias=False)
    assert q.prepack() is None
    q = q.to("cpu")  # a move keeps the copy (moved with the weight)
    assert q.packed_weight is not None
    other = _mx_linear(bias=False)
    other.weight_data.add_(1)  # different codes
    q.load_state_dict(other.state_dict())
    with pytest.warns(UserWarning, match=r"the weight changed \(or the module was copied\) after prepack\(\)"):
        assert q.packed_weight is None
    assert q.packed_data is None
    # loaded, then moved: the move must not make the stale copy look fresh
    q = _mx_linear(bias=False)
    assert q.prepack() is None
    q.load_state_dict(other.state_dict())
    with pytest.warns(UserWarning, match=r"after prepack"):
        q = q.to("cpu")
    assert q.packed_weight is None
    # a replaced buffer (.data assignment) and a deep copy: stale, dropped
    q = _mx_linear(bias=False)
    assert q.prepack() is None
    q.weight_data.data = other.weight_data.clone()
    with pytest.warns(UserWarning, match=r"after prepack"):
        assert q.packed_weight is None
    q = _mx_linear(bias=False)
    assert q.prepack() is None
    q2 = copy.deepcopy(q)
    with pytest.warns(UserWarning, match=r"after prepack"):
        assert q2.packed_weight is None
    assert q.packed_weight is not None  # the original keeps its copy
    # no rows: the canonical path's empty output (no plan asked for M = 0)
    assert q(torch.zeros(0, 256, dtype=torch.bfloat16)).shape == (0, 192)
    _mx_linear(bias=False).to(torch.float16)  # mxfp4's buffers are uint8: a dtype change casts nothing quantized
    q2 = _mx_linear(bias=False)
    assert q2.prepack() is None
    with pytest.raises(TypeError, match=r"packed_data: a dtype conversion"):
        q2.to(torch.float16)  # ... but the copy's fp32 scales / e4m3 data are protected
    assert q2.packed_weight is not None


def test_quantize_model_prepack():
    import blockscaled.nn as bsnn

    model = torch.nn.Sequential(torch.nn.Linear(256, 384, dtype=torch.bfloat16),
                                torch.nn.Linear(384, 256, dtype=torch.bfloat16))
    plain = bsnn.quantize_model(model, "mxfp4", inplace=False)
    q = bsnn.quantize_model(model, "mxfp4", inplace=False, prepack=True)
    rep = bsnn.quantization_report(q)
    assert rep.prepacked == ["0", "1"] and not rep.not_prepacked and "with an fp8_block copy" in str(rep)
    assert rep.bytes_after > bsnn.quantization_report(plain).bytes_after
    assert all(m.packed_weight is not None for m in q if isinstance(m, bsnn.Linear))
    with pytest.raises(ValueError, match=r"prepack: the fp8_block copy is for mxfp4 W x A layers, got fp8_block"):
        bsnn.quantize_model(model, "fp8_block", inplace=False, prepack=True)
    with pytest.raises(ValueError, match=r"got mxfp4 weight-only"):
        bsnn.quantize_model(model, "mxfp4", inplace=False, prepack=True, weight_only=True)


def test_prefer_packed_follows_the_predictions():
    """On an H100 (planned on the CPU): decode rows stay on the canonical weight (its decode
    kernels have no time model and stream fp4 bytes), large token counts take the copy; never on
    a CPU device or for other formats."""
    from blockscaled.plan.device import H100_SXM, device_info
    from blockscaled.plan.mx_packed import prefer_packed

    assert not prefer_packed("mxfp4", 1, 5760, 2880, "bfloat16", False, H100_SXM)
    assert prefer_packed("mxfp4", 8192, 8192, 8192, "bfloat16", False, H100_SXM)
    assert prefer_packed("mxfp4", 8192, 8192, 8192, "bfloat16", True, H100_SXM)  # a bias: one more pass
    assert not prefer_packed("nvfp4", 8192, 8192, 8192, "bfloat16", False, H100_SXM)
    assert not prefer_packed("mxfp4", 8192, 8192, 8192, "bfloat16", False, device_info("cpu"))


def test_warmup_runs_the_packed_copy(monkeypatch):
    """``bs.warmup`` plans a prepacked layer's token counts the way its forward runs them: the
    mixed pair where ``prefer_packed`` says so (here: M >= 40), the canonical weight below."""
    if not bs._checks.INTERPRET:
        pytest.skip("the warm-up plans nothing on the reference path")
    import sys

    import blockscaled.nn.linear as L

    W = sys.modules["blockscaled.warmup"]  # (the package's ``warmup`` attribute is the function)
    monkeypatch.setattr(L, "prefer_packed", lambda fmt, m, *a: m >= 40)
    monkeypatch.setattr(W, "prefer_packed", lambda fmt, m, *a: m >= 40)
    model = torch.nn.Sequential(_mx_linear(n=128, k=256))
    assert model[0].prepack() is None
    rep = bs.warmup(model, max_tokens=48, progress=False)
    copies = [e for e in rep.entries if e[0].endswith("(fp8_block copy)")]
    canon = [e for e in rep.entries if not e[0].endswith("(fp8_block copy)")]
    assert copies and min(e[1][0] for e in copies) == 40 and max(e[1][1] for e in copies) == 48
    assert canon and max(e[1][1] for e in canon) == 39
    assert all("activations x fp8_block" not in e[2] for e in canon)


@pytest.mark.timeout(600)
def test_linear_prepack_compiles_fullgraph(monkeypatch):
    """torch.compile(fullgraph=True) traces a prepacked layer's forward: compiled forwards run the
    canonical weight (the packed decision would trace the planner), i.e. the eager canonical result."""
    if not bs._checks.INTERPRET:
        pytest.skip("the custom ops run the kernels path here")
    import blockscaled.nn.linear as L

    monkeypatch.setattr(L, "prefer_packed", lambda *a: True)
    q = _mx_linear(n=128, k=256)
    assert q.prepack() is None
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    torch._dynamo.reset()
    y = torch.compile(q, backend="aot_eager", fullgraph=True)(x)
    assert torch.equal(y, bs.linear(x, q.weight, q.bias))


def test_encoder_adversarial_codes_and_scales():
    """The kernel and its twin on crafted fields: every E8M0 code 0..254 and 255 (NaN), negative
    zeros, blocks of one nonzero element, rows mixing them; the reconstruction is bitwise
    ``dequantize`` (NaN where it is NaN)."""
    g = torch.Generator().manual_seed(5)
    for fmt in ("mxfp4", "mxfp8"):
        m, k = 16, 384
        if fmt == "mxfp4":
            data = torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, generator=g)
            data[0] = 0x88  # -0 codes
            data[1, 16:] = 0
        else:
            data = (torch.randn(m, k, generator=g) * 8).to(torch.float8_e4m3fn)
            data[0] = -0.0
        scale = torch.randint(0, 256, (m, k // 32), dtype=torch.uint8, generator=g)
        scale[2] = torch.arange(0, 12, dtype=torch.uint8)  # E8M0 0 (2^-127) and the smallest
        scale[3] = torch.arange(243, 255, dtype=torch.uint8)  # the largest finite
        scale[4, 5] = 255
        q = bs.ScaledTensor(data, scale, fmt, (m, k), (1, 32), "rceil")
        ref = R.encode_mx_activations(q)
        deq = bs.dequantize(q, torch.float32)
        rec = _deq_encoded(ref[0], ref[1], k)
        assert torch.equal(rec.isnan(), deq.isnan())
        ok = ~deq.isnan()
        assert torch.equal(rec[ok].view(torch.int32), deq[ok].view(torch.int32)), fmt
        if bs._checks.INTERPRET:
            got = ops_mx.encode_mx_activations(q)
            assert _same_values(got[0], ref[0])
            assert torch.equal(got[1].view(torch.int32), ref[1].view(torch.int32)) and torch.equal(got[2], ref[2])


def test_mixed_gemm_hopper_branch_wiring(monkeypatch):
    """The sm_90 branch of the mixed pair on the CPU (Gluon has no interpreter): a Plan with the
    wide config forced, the launch replaced by a torch emulation of the ASUB kernel that reads
    exactly what ``_run_mixed`` hands it (the encoder's e4m3 data, its per-32 scales and row flags,
    the packed weight's tiles): the product, a bias added after it, and the checks on the config."""
    if not bs._checks.INTERPRET:
        pytest.skip("the encoder runs in the interpreter here")
    import blockscaled.ops._hopper as H
    from blockscaled.config.hopper import HopperConfig
    from blockscaled.plan import Plan
    from blockscaled.testing.tolerances import assert_gemm_close

    seen = {}

    def emulate(a2, a_s2, b_data, b_scale, out2, cfg, asub=1, aflag=None):
        m, k = a2.shape
        n = b_data.shape[0]
        kb = -(-k // 128)
        assert asub == 4 and a_s2.shape == (m, 4 * kb) and aflag.shape == (m,) and aflag.dtype == torch.int32
        uni = aflag == 0  # the kernel's fast path reads the group's first scale only
        first = a_s2.view(m, kb, 4)[:, :, :1].expand(m, kb, 4).reshape(m, -1)
        nblk = -(-k // 32)  # (blocks past K: scale 0, their data is TMA's zero fill)
        assert torch.equal(a_s2[uni, :nblk].view(torch.int32), first[uni, :nblk].view(torch.int32))
        A = torch.nn.functional.pad(a2.float(), (0, 128 * kb - k)).view(m, 4 * kb, 32) * a_s2[:, :, None]
        sb = b_scale.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
        B = torch.nn.functional.pad(b_data.float(), (0, 128 * kb - k)) * sb
        out2.copy_(A.view(m, -1).double() @ B.double().T)
        seen["cfg"], seen["flags"] = cfg, int(aflag.sum())
        return True

    monkeypatch.setattr(H, "gemm_fp8_block_hopper_impl", emulate)
    torch.manual_seed(3)
    m, n, k = 40, 200, 320
    w8 = bs.layouts.mxfp4_to_fp8_block(bs.quantize(torch.randn(n, k) * 0.1, "mxfp4"))
    x = torch.randn(m, k)
    x[5, 32:64] *= 2.0 ** -20  # one row keeps per-32 scales
    a = bs.quantize(x, "mxfp4")
    cfg = HopperConfig("wide", 128, 256, 8, 3, epilogue="tma")
    ref = bs.dequantize(a, torch.float32).double() @ bs.dequantize(w8, torch.float32).double().T
    bias = torch.randn(n)
    y = bs.gemm(a, w8, torch.float32, bias=bias, config=Plan("gemm", "cuda", cfg))
    assert seen["cfg"] == cfg and seen["flags"] == 1
    assert_gemm_close(y, ref + bias.double(), "mxfp4", torch.float32)
    for bad in (HopperConfig("wide", 128, 256, 8, 3, epilogue="tma", tail_split=2),
                HopperConfig("skinny", 64, 128, 4, 4)):
        with pytest.raises(ValueError, match=r"config: a mxfp4 x fp8_block GEMM runs the wide kernel unsplit"):
            bs.gemm(a, w8, config=Plan("gemm", "cuda", bad))


def test_encoder_ignores_the_pad_nibble():
    """Odd K: the packed row's last high nibble is padding; a nonzero one (a loaded checkpoint may
    leave anything there) changes neither the kernel's flags and scales nor the twin's."""
    q = bs.quantize(torch.randn(6, 33), "mxfp4")
    d = q.data.clone()
    d[:, -1] = 0x70  # element 32 (block 1's only one) = 0, element 33 (padding) = code 7
    s = q.scale.clone()
    s[:, 1] = s[:, 0] + 20  # counted, block 1 would make the group span 20: not uniform
    qp = bs.ScaledTensor(d, s, "mxfp4", q.shape, (1, 32), q.rounding)
    ref = R.encode_mx_activations(qp)
    assert torch.equal(ref[2], torch.zeros(6, dtype=torch.int32))  # block 1 holds no nonzero element
    if bs._checks.INTERPRET:
        got = ops_mx.encode_mx_activations(qp)
        assert torch.equal(got[1].view(torch.int32), ref[1].view(torch.int32)) and torch.equal(got[2], ref[2])
        assert _same_values(got[0], ref[0])


@pytest.mark.parametrize("m,k", [(5, 128), (17, 320), (3, 2880), (33, 4160), (2, 100), (4, 33), (0, 64), (3, 0)])
def test_quantize_encode_is_the_two_passes(m, k, path):
    """The fused quantize-and-encode pass (ops/mx_pack.quantize_encode) gives bitwise what the
    quantizer then the encoder give: bf16 and fp32 inputs, both roundings, a row with a wide
    exponent span (flagged), an empty row, a NaN (flagged, NaN scales), K tails (odd K too)."""
    from blockscaled.formats import ScaleRounding
    from blockscaled.testing.inputs import randn_like_activations

    for dt in (torch.bfloat16, torch.float32):
        x = randn_like_activations(m, k, device="cpu", seed=m + k).to(dt) if m and k else torch.zeros(m, k, dtype=dt)
        if m > 3 and k >= 64:
            x[1, :64] *= 2.0 ** 20
            x[2] = 0
            x[3, 5] = float("nan")
        for rnd in (ScaleRounding.RCEIL, ScaleRounding.FLOOR):
            got = ops_mx.quantize_encode(x, rnd)
            two = ops_mx.encode_mx_activations(bs.quantize(x, "mxfp4", rounding=rnd))
            assert torch.equal(got[0].view(torch.uint8), two[0].view(torch.uint8)), (dt, rnd)
            assert torch.equal(got[1].view(torch.int32), two[1].view(torch.int32)), (dt, rnd)
            assert torch.equal(got[2], two[2]), (dt, rnd)
            if m > 3 and k >= 64:
                assert got[2].tolist()[:4] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match=r"x: expected a 2-D \[M, K\] bf16"):
        ops_mx.quantize_encode(torch.zeros(2, 3, 64))  # (3-D)


def test_packed_linear_is_the_two_pass_call(path):
    """ops/mx_linear.packed_linear (a prepacked layer's forward) off sm_90 runs exactly
    ``gemm(quantize(x, "mxfp4"), w8)``: the same tensor, [..., K] inputs, a bias, fp32 output."""
    from blockscaled.ops.mx_linear import packed_linear

    torch.manual_seed(1)
    w8 = bs.layouts.mxfp4_to_fp8_block(bs.quantize(torch.randn(192, 256) * 0.05, "mxfp4"))
    x = torch.randn(2, 3, 256, dtype=torch.bfloat16)
    bias = torch.randn(192)
    for b, dt in ((None, torch.bfloat16), (bias, torch.float32)):
        y = packed_linear(x, w8, b, out_dtype=dt)
        ref = bs.gemm(bs.quantize(x.reshape(6, 256), "mxfp4"), w8, dt, bias=b).reshape(2, 3, 192)
        assert y.shape == (2, 3, 192) and y.dtype == dt and torch.equal(y, ref)


def test_quantize_encode_and_packed_linear_check_their_arguments():
    from blockscaled.ops.mx_linear import packed_linear

    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="rounding"):
        ops_mx.quantize_encode(x, "exact")  # not an mxfp4 rounding
    ops_mx.quantize_encode(x, "FLOOR")  # the names in any case, as quantize takes them
    with pytest.raises(ValueError, match=r"x: expected a 2-D \[M, K\] bf16 / fp16 / fp32 tensor"):
        ops_mx.quantize_encode(torch.ones(4, 64, dtype=torch.int32))
    w8 = bs.layouts.mxfp4_to_fp8_block(bs.quantize(torch.randn(128, 256) * 0.05, "mxfp4"))
    with pytest.raises(ValueError, match=r"x: expected \[\.\.\., 256\]"):
        packed_linear(torch.randn(2, 128, dtype=torch.bfloat16), w8)
    with pytest.raises(ValueError, match="w8: expected a 2-D fp8_block ScaledTensor"):
        packed_linear(torch.randn(2, 256, dtype=torch.bfloat16), bs.quantize(torch.randn(128, 256), "mxfp4"))
