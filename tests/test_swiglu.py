"""Fused SwiGLU dual GEMM ``silu(a @ b_gate.T) * (a @ b_up.T)``: dense, grouped contiguous and
grouped masked, against the float64 reference of the same quantized inputs (CPU: the Triton
interpreter; also runs on a GPU)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from blockscaled.config import GemmConfig
from blockscaled.ops.swiglu import swiglu
from blockscaled.reference import grouped as ref
from blockscaled.reference.quantize import quantize
from blockscaled.testing.compare import bitwise_equal
from blockscaled.testing.inputs import randn_like_activations
from blockscaled.testing.tolerances import assert_gemm_close

FORMATS = ("fp8_block", "mxfp8", "nvfp4", "mxfp4")


def _acts(shape, fmt, device, seed=0):
    return quantize(randn_like_activations(*shape, dtype=torch.bfloat16, device=device, seed=seed), fmt)


def _w(shape, fmt, device, seed):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(*shape, generator=g) * 0.05).to(device)
    return quantize(w, fmt, block=(128, 128) if fmt == "fp8_block" else None)


def _nvfp4_experts(e, n, k, scale, g, device):
    """[E, N, K] nvfp4 weights quantized per expert (own global scale each, magnitudes spread
    over three decades) and their [E] global scales."""
    w = torch.randn(e, n, k, generator=g) * torch.logspace(-2, 1, e).reshape(e, 1, 1) * scale
    qs = [quantize(w[i].to(device), "nvfp4") for i in range(e)]
    st = replace(qs[0], data=torch.stack([q.data for q in qs]), scale=torch.stack([q.scale for q in qs]),
                 shape=torch.Size((e, n, k)))
    return st, torch.stack([q.global_scale.reshape(()) for q in qs])


def _offsets(sizes, device):
    offs = [0]
    for s in sizes:
        offs.append(offs[-1] + s)
    return torch.tensor(offs, dtype=torch.int32, device=device)


def _nan(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


@pytest.mark.parametrize("fmt", FORMATS)
def test_dense(fmt, device):
    m, n, k = 19, 40, 161
    a = _acts((m, k), fmt, device)
    bg, bu = _w((n, k), fmt, device, 1), _w((n, k), fmt, device, 2)
    out = _nan((m, n), torch.float32, device)
    assert swiglu(a, bg, bu, out=out, out_dtype=torch.float32) is out
    assert_gemm_close(out, ref.swiglu(a, bg, bu), fmt, torch.float32, what="dense")
    assert bitwise_equal(swiglu(a, bg, bu, out_dtype=torch.float32), out)


@pytest.mark.parametrize("fmt", FORMATS[:3])
def test_grouped_contiguous(fmt, device):
    sizes = [0, 1, 37, 0, 30]
    n, k = 40, 96
    offs = _offsets(sizes, device)
    a = _acts((sum(sizes), k), fmt, device)
    bg, bu = _w((5, n, k), fmt, device, 3), _w((5, n, k), fmt, device, 4)
    out = _nan((sum(sizes), n), torch.float32, device)
    swiglu(a, bg, bu, offsets=offs, out=out, out_dtype=torch.float32)
    assert_gemm_close(out, ref.swiglu(a, bg, bu, offsets=offs), fmt, torch.float32, what="contiguous")


def test_grouped_masked(device):
    fmt = "mxfp8"
    e, max_m, n, k = 3, 12, 24, 64
    counts = torch.tensor([12, 0, 5], dtype=torch.int32, device=device)
    a = _acts((e, max_m, k), fmt, device)
    bg, bu = _w((e, n, k), fmt, device, 5), _w((e, n, k), fmt, device, 6)
    out = _nan((e, max_m, n), torch.float32, device)
    swiglu(a, bg, bu, masked_m=counts, out=out, out_dtype=torch.float32)
    want = ref.swiglu(a, bg, bu, masked_m=counts).cpu()
    computed = ~torch.isnan(want)
    o = out.cpu()
    assert_gemm_close(torch.where(computed, o, 0.0), torch.where(computed, want, 0.0), fmt, torch.float32)
    assert torch.isnan(o[~computed]).all()


@pytest.mark.parametrize("out_dtype", (torch.bfloat16, torch.float16), ids=str)
def test_out_dtypes_and_config(out_dtype, device):
    fmt = "nvfp4"
    a = _acts((33, 64), fmt, device)
    bg, bu = _w((48, 64), fmt, device, 7), _w((48, 64), fmt, device, 8)
    want = ref.swiglu(a, bg, bu)
    # bf16: the 3.6 interpreter casts fp32->bf16 by truncation (1 ulp, within the table)
    assert_gemm_close(swiglu(a, bg, bu, out_dtype=out_dtype), want, fmt, out_dtype)
    cfg = GemmConfig(16, 16, 32, 4, 1, promote=False)
    assert_gemm_close(swiglu(a, bg, bu, out_dtype=out_dtype, config=cfg), want, fmt, out_dtype, what=str(cfg))


def test_activation_is_fused_in_fp32(device):
    """Large gate values: silu(g) * u must come from fp32 products, not a rounded intermediate
    (fp16 would overflow |g*u| > 65504 before the cast for these inputs if it were staged)."""
    fmt = "fp8_block"
    a = quantize(torch.full((4, 128), 30.0, device=device), fmt)
    bg = quantize(torch.full((16, 128), 0.05, device=device), fmt, block=(128, 128))
    bu = quantize(torch.full((16, 128), 0.002, device=device), fmt, block=(128, 128))
    y = swiglu(a, bg, bu, out_dtype=torch.float16)
    want = ref.swiglu(a, bg, bu)
    assert torch.isfinite(y).all()
    assert_gemm_close(y, want, fmt, torch.float16)


def test_errors(device):
    fmt = "mxfp8"
    a = _acts((6, 64), fmt, device)
    bg, bu = _w((16, 64), fmt, device, 1), _w((16, 64), fmt, device, 2)
    with pytest.raises(ValueError, match="b_up: format"):
        swiglu(a, bg, _w((16, 64), "mxfp4", device, 2))
    with pytest.raises(ValueError, match="b_up: shape"):
        swiglu(a, bg, _w((24, 64), fmt, device, 2))
    with pytest.raises(ValueError, match="b_gate: format mismatch"):
        swiglu(_acts((6, 64), "nvfp4", device), bg, bu)
    with pytest.raises(ValueError, match="b_gate: K mismatch"):
        swiglu(_acts((6, 96), fmt, device), bg, bu)
    with pytest.raises(ValueError, match="b_up.data: strides"):
        wide = _w((16, 128), fmt, device, 2)
        sliced = replace(wide, data=wide.data[:, :64], scale=wide.scale[:, :2], shape=torch.Size((16, 64)))
        swiglu(a, bg, sliced)
    with pytest.raises(ValueError, match="at most one"):
        swiglu(a, bg, bu, offsets=_offsets([6], device), masked_m=torch.zeros(1, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="3-D"):
        swiglu(a, bg, bu, offsets=_offsets([6], device))
    bg3, bu3 = _w((2, 16, 64), fmt, device, 1), _w((2, 16, 64), fmt, device, 2)
    with pytest.raises(ValueError, match="non-decreasing"):
        swiglu(a, bg3, bu3, offsets=torch.tensor([0, 7, 6], dtype=torch.int32, device=device), validate=True)
    with pytest.raises(ValueError, match="out: expected shape"):
        swiglu(a, bg, bu, out=torch.empty(6, 15, dtype=torch.bfloat16, device=device))


def test_nvfp4_per_expert_global_scales(device):
    e, n, k = 3, 16, 64
    g = torch.Generator().manual_seed(11)
    (bg, gs_g), (bu, gs_u) = _nvfp4_experts(e, n, k, 1.0, g, device), _nvfp4_experts(e, n, k, 0.5, g, device)
    offs = _offsets([5, 0, 7], device)
    a = _acts((12, k), "nvfp4", device)
    y = swiglu(a, bg, bu, offsets=offs, out_dtype=torch.float32, b_gate_global_scale=gs_g, b_up_global_scale=gs_u)
    want = ref.swiglu(a, bg, bu, offsets=offs, b_gate_global_scale=gs_g, b_up_global_scale=gs_u)
    assert_gemm_close(y, want, "nvfp4", torch.float32, what="per-expert gs")
    with pytest.raises(ValueError, match="both"):
        swiglu(a, bg, bu, offsets=offs, b_gate_global_scale=gs_g)
    with pytest.raises(ValueError, match="grouped"):
        swiglu(a, quantize(torch.randn(n, k, device=device), "nvfp4"), quantize(torch.randn(n, k, device=device), "nvfp4"),
               b_gate_global_scale=gs_g[:1], b_up_global_scale=gs_u[:1])


@pytest.mark.parametrize("fmt", ("mxfp4", "nvfp4"))
def test_weight_only(fmt, device):
    x = randn_like_activations(21, 64, dtype=torch.bfloat16, device=device, outliers=False)
    bg, bu = _w((2, 24, 64), fmt, device, 1), _w((2, 24, 64), fmt, device, 2)
    offs = _offsets([9, 12], device)
    y = swiglu(x, bg, bu, offsets=offs, out_dtype=torch.float32)
    assert_gemm_close(y, ref.swiglu(x, bg, bu, offsets=offs), fmt, torch.float32, what="weight-only")


# --------------------------------------------------------------------------- dequant_matmul strategy
DQ = GemmConfig(strategy="dequant_matmul")


@pytest.mark.parametrize("fmt", ("mxfp8", "mxfp4", "nvfp4"))
def test_dequant_matmul_all_groupings(fmt, device):
    """Forced dequantize + cuBLAS SwiGLU: dense (fp32 products, fp32 activation, one cast),
    contiguous (bf16 products from torch._grouped_mm, bf16 out only) and masked (fp32 products;
    rows past the counts keep the poison)."""
    n, k = 40, 96
    a = _acts((19, k), fmt, device)
    bg, bu = _w((n, k), fmt, device, 1), _w((n, k), fmt, device, 2)
    for od in (torch.float32, torch.bfloat16, torch.float16):
        out = _nan((19, n), od, device)
        assert swiglu(a, bg, bu, out=out, out_dtype=od, config=DQ) is out
        assert_gemm_close(out, ref.swiglu(a, bg, bu), fmt, od, what=f"dense {od}")
    sizes = [0, 1, 37, 0, 30]
    offs = _offsets(sizes, device)
    ac = _acts((sum(sizes), k), fmt, device)
    bg3, bu3 = _w((5, n, k), fmt, device, 3), _w((5, n, k), fmt, device, 4)
    out = _nan((sum(sizes), n), torch.bfloat16, device)
    swiglu(ac, bg3, bu3, offsets=offs, out=out, config=DQ)
    assert_gemm_close(out, ref.swiglu(ac, bg3, bu3, offsets=offs), fmt, torch.bfloat16, what="contiguous")
    assert bitwise_equal(swiglu(ac, bg3, bu3, offsets=offs, config=DQ), out)
    counts = torch.tensor([12, 0, 5, 1, 3], dtype=torch.int32, device=device)
    am = _acts((5, 12, k), fmt, device)
    want = ref.swiglu(am, bg3, bu3, masked_m=counts).cpu()
    computed = ~torch.isnan(want)
    for od in (torch.bfloat16, torch.float32):
        out = _nan((5, 12, n), od, device)
        swiglu(am, bg3, bu3, masked_m=counts, out=out, out_dtype=od, config=DQ)
        o = out.cpu()
        assert_gemm_close(torch.where(computed, o, torch.zeros((), dtype=od)), torch.where(computed, want, 0.0), fmt,
                          od, what=f"masked {od}")
        assert torch.isnan(o[~computed]).all()


def test_dequant_matmul_weight_only_and_per_expert_gs(device):
    x = randn_like_activations(21, 64, dtype=torch.bfloat16, device=device, outliers=False)
    bg, bu = _w((2, 24, 64), "mxfp4", device, 1), _w((2, 24, 64), "mxfp4", device, 2)
    offs = _offsets([9, 12], device)
    y = swiglu(x, bg, bu, offsets=offs, config=DQ)
    assert_gemm_close(y, ref.swiglu(x, bg, bu, offsets=offs), "mxfp4", torch.bfloat16, what="weight-only")
    e, n, k = 3, 16, 64
    g = torch.Generator().manual_seed(11)
    (bg, gs_g), (bu, gs_u) = _nvfp4_experts(e, n, k, 1.0, g, device), _nvfp4_experts(e, n, k, 0.5, g, device)
    offs = _offsets([5, 0, 7], device)
    a = _acts((12, k), "nvfp4", device)
    kw = dict(b_gate_global_scale=gs_g, b_up_global_scale=gs_u)
    y = swiglu(a, bg, bu, offsets=offs, config=DQ, **kw)
    assert_gemm_close(y, ref.swiglu(a, bg, bu, offsets=offs, **kw), "nvfp4", torch.bfloat16, what="contig gs[e]")
    a3 = _acts((e, 6, k), "nvfp4", device)
    cnt = torch.tensor([6, 0, 2], dtype=torch.int32, device=device)
    y3 = swiglu(a3, bg, bu, masked_m=cnt, out_dtype=torch.float32, config=DQ, **kw)
    want = ref.swiglu(a3, bg, bu, masked_m=cnt, **kw)
    assert_gemm_close(y3[0], want[0], "nvfp4", torch.float32, what="masked gs[e]")
    assert_gemm_close(y3[2, :2], want[2, :2], "nvfp4", torch.float32, what="masked gs[e]")


def test_dequant_matmul_activation_is_fused_in_fp32(device):
    """Dense / masked: fp32 products, activation in fp32, one cast (no fp16 overflow of g*u)."""
    fmt = "mxfp8"
    a = quantize(torch.full((4, 64), 30.0, device=device), fmt)
    bg = quantize(torch.full((16, 64), 0.05, device=device), fmt)
    bu = quantize(torch.full((16, 64), 0.002, device=device), fmt)
    y = swiglu(a, bg, bu, out_dtype=torch.float16, config=DQ)
    assert torch.isfinite(y).all()
    assert_gemm_close(y, ref.swiglu(a, bg, bu), fmt, torch.float16)


def test_dequant_matmul_errors(device):
    fmt = "mxfp8"
    a = _acts((6, 64), fmt, device)
    bg3, bu3 = _w((2, 16, 64), fmt, device, 1), _w((2, 16, 64), fmt, device, 2)
    offs = _offsets([2, 4], device)
    with pytest.raises(ValueError, match="config.strategy.*bf16 in / bf16 out"):
        swiglu(a, bg3, bu3, offsets=offs, out_dtype=torch.float32, config=DQ)
    af = _acts((6, 128), "fp8_block", device)
    with pytest.raises(ValueError, match="config.strategy.*fp8_block x fp8_block"):
        swiglu(af, _w((16, 128), "fp8_block", device, 1), _w((16, 128), "fp8_block", device, 2), config=DQ)
    with pytest.raises(ValueError, match="b_up: shape"):
        swiglu(a, bg3, _w((2, 24, 64), fmt, device, 2), offsets=offs, config=DQ)


# --------------------------------------------------------------------------- stacked gate_up
def _stack(bg, bu):
    """One [E, 2N, K] weight: the gate rows of every expert, then its up rows (block-aligned)."""
    return replace(bg, data=torch.cat([bg.data, bu.data], dim=-2).contiguous(),
                   scale=torch.cat([bg.scale, bu.scale], dim=-2).contiguous(),
                   shape=torch.Size((*bg.shape[:-2], 2 * bg.shape[-2], bg.shape[-1])))


@pytest.mark.parametrize("fmt", FORMATS)
def test_stacked_gate_up(fmt, device):
    """``swiglu(a, w_gate_up)`` (b_up None, one [E, 2N, K] weight) equals the two-weight SwiGLU's
    float64 twin on the same rows, contiguous (empty experts included) and masked, quantized and
    bf16 activations; the plan names the stacked form and the result is what ``explain`` says."""
    import blockscaled as bs
    from blockscaled.plan import observe_plans

    e, n, k = 4, 128, 96
    bg, bu = _w((e, n, k), fmt, device, 11), _w((e, n, k), fmt, device, 12)
    if fmt == "nvfp4":  # one global scale for the stack (quantize makes one per tensor)
        bu = replace(bu, global_scale=bg.global_scale)
    w = _stack(bg, bu)
    sizes = [3, 0, 9, 1]
    offs = _offsets(sizes, device)
    x = randn_like_activations(sum(sizes), k, dtype=torch.bfloat16, device=device, seed=4)
    acts = [quantize(x, fmt)] + ([] if fmt == "fp8_block" else [x])
    for a in acts:
        out = _nan((sum(sizes), n), torch.float32, device)
        with observe_plans() as plans:
            assert swiglu(a, w, offsets=offs, out=out, out_dtype=torch.float32) is out
        want = ref.swiglu(a, bg, bu, offsets=offs)
        assert_gemm_close(out, want, fmt, torch.float32, what=f"stacked {fmt}")
        assert_gemm_close(out, ref.swiglu(a, w, offsets=offs), fmt, torch.float32, what="stacked twin")
        plan = bs.explain("swiglu", a, w, offsets=offs, out_dtype=torch.float32)
        assert plan.op == "swiglu" and not plan.problem.dual and plan.problem.n == n, plan
        if plan.backend != "reference":
            assert plans and plans[-1] == plan, (plans, plan)
            assert plan.describe().startswith("gate_up: ") and plan.describe().find(" + silu * mul pass") > 0
    # masked: rows past the counts are not written
    counts = torch.tensor([2, 0, 5, 1], dtype=torch.int32, device=device)
    am = quantize(randn_like_activations(e, 5, k, dtype=torch.bfloat16, device=device, seed=5), fmt)
    out = _nan((e, 5, n), torch.bfloat16, device)
    swiglu(am, w, masked_m=counts, out=out)
    want = ref.swiglu(am, bg, bu, masked_m=counts, out_dtype=torch.float32).cpu()
    computed = ~torch.isnan(want)
    o = out.cpu()
    assert_gemm_close(torch.where(computed, o, 0.0), torch.where(computed, want, 0.0).bfloat16(), fmt, torch.bfloat16)
    assert torch.isnan(o[~computed]).all()


def test_stacked_gate_up_errors(device):
    fmt = "mxfp8"
    a = _acts((6, 64), fmt, device)
    w = _w((2, 48, 64), fmt, device, 1)
    offs = _offsets([2, 4], device)
    with pytest.raises(ValueError, match="b_up: required for a dense SwiGLU"):
        swiglu(a, _w((48, 64), fmt, device, 1))
    with pytest.raises(ValueError, match="b_gate: a stacked gate_up weight .* even"):
        swiglu(a, _w((2, 47, 64), fmt, device, 1), offsets=offs)
    with pytest.raises(ValueError, match="b_up_global_scale: a stacked gate_up weight"):
        swiglu(a, w, offsets=offs, b_up_global_scale=torch.ones(2, device=device))
    with pytest.raises(ValueError, match="config.strategy: 'dequant_matmul' cannot run a stacked"):
        swiglu(a, w, offsets=offs, config=GemmConfig(strategy="dequant_matmul"))
    assert swiglu(a, w, offsets=offs).shape == (6, 24)


def test_stacked_gate_up_opcheck(device):
    """The stacked plan through the custom ops: the fake tensor has N = rows / 2."""
    from torch.library import opcheck

    from blockscaled.plan import Plan
    from blockscaled.plan.encoding import encode_plan

    fmt = "mxfp4"
    a = _acts((5, 64), fmt, device)
    w = _w((2, 32, 64), fmt, device, 3)
    offs = _offsets([2, 3], device)
    backend = "cuda" if device == "cuda" else "interpreter"
    tail = (2, 1, 64, 1, encode_plan(Plan("swiglu", backend, GemmConfig(16, 16, 32, 4, 1, promote=True))))
    args = (a.data, a.scale, None, w.data, w.scale, None, None, None, None, offs)
    opcheck(torch.ops.blockscaled.grouped_gemm.default, (*args, torch.float32, *tail),
            test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    y = torch.ops.blockscaled.grouped_gemm.default(*args, torch.float32, *tail)
    assert y.shape == (5, 16)
    assert_gemm_close(y, ref.swiglu(a, w, offsets=offs), fmt, torch.float32, what="stacked op")
