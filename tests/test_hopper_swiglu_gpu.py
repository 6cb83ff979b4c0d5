"""SwiGLU on the Hopper wide kernel (DUAL: each tile's ring slot holds 128 gate rows and the 128
up rows of the same output columns; epilogue ``silu(acc_gate) * acc_up`` in fp32, one cast).

GPU tests (sm_90): dense, grouped contiguous and masked, forced and by the heuristic, against
the float64 reference of the same quantized inputs, outputs NaN-poisoned; M / N / K tails, empty
and skewed experts, counts 0 and max_m, CUDA-graph capture with changed counts, every tile
config the planner can return, the TMA-store and masked epilogues, determinism, fallbacks.
CPU: forcing the Hopper strategy off-GPU is a clear ValueError.
"""

from __future__ import annotations

import pytest
import torch

import blockscaled as bs
from blockscaled.config.gemm import GemmConfig
from blockscaled.config.hopper import HopperConfig
from blockscaled.ops import _hopper as H
from blockscaled.ops.grouped import hopper_reason
from blockscaled.ops.swiglu import swiglu
from blockscaled.plan import CPU_INTERPRETER, H100_SXM, Problem, num_sms
from blockscaled.plan.grouped import SWIGLU_HOPPER_MIN_M, plan_grouped, swiglu_hopper_config
from blockscaled.reference import grouped as ref
from blockscaled.reference.quantize import quantize as ref_quantize
from blockscaled.testing.tolerances import assert_gemm_close

HOPPER = GemmConfig(strategy="hopper")
_needs_hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                   reason="needs an sm_90 (Hopper) GPU")


def gpu(fn):
    return pytest.mark.gpu(_needs_hopper(fn))


def _inputs(rows_shape, w_lead, n, k, seed=0, w_block=(128, 128)):
    from blockscaled.ops.quantize import quantize

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(*rows_shape, k, device="cuda", generator=g).to(torch.bfloat16)
    wg = (torch.randn(*w_lead, n, k, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
    wu = (torch.randn(*w_lead, n, k, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
    return (quantize(x, "fp8_block"), quantize(wg, "fp8_block", block=w_block),
            quantize(wu, "fp8_block", block=w_block))


def _offsets(sizes):
    return torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32, device="cuda")


def _nan(shape, dtype=torch.bfloat16):
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


DENSE = [(1, 256, 256), (64, 2048, 7168), (300, 520, 1040), (4096, 2048, 7168), (77, 200, 4112), (513, 4096, 512)]


@pytest.mark.parametrize("shape", DENSE, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("forced", [True, False], ids=["forced", "heuristic"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@gpu
def test_dense(shape, forced, out_dtype):
    m, n, k = shape
    a, bg, bu = _inputs((m,), (), n, k, seed=m)
    assert hopper_reason(a, bg, out_dtype, 0, b2=bu) is None
    out = _nan((m, n), out_dtype)
    swiglu(a, bg, bu, out=out, out_dtype=out_dtype, config=HOPPER if forced else None)
    assert_gemm_close(out, ref.swiglu(a, bg, bu), "fp8_block", out_dtype, what=f"dense {shape}")


CONTIG = [([0, 1, 130, 127, 300, 0, 64, 1000], 384, 1040), ([128] * 8, 2048, 7168), ([77], 256, 256),
          ([(i * 37) % 150 for i in range(64)], 256, 512), ([0, 0, 5], 128, 128), ([3, 64, 65, 0], 200, 512)]


@pytest.mark.parametrize("case", CONTIG, ids=lambda c: f"E{len(c[0])}_N{c[1]}_K{c[2]}")
@pytest.mark.parametrize("forced", [True, False], ids=["forced", "heuristic"])
@gpu
def test_contiguous(case, forced):
    sizes, n, k = case
    e = len(sizes)
    a, bg, bu = _inputs((sum(sizes),), (e,), n, k)
    offs = _offsets(sizes)
    assert hopper_reason(a, bg, torch.bfloat16, 1, b2=bu) is None
    out = _nan((sum(sizes), n))
    swiglu(a, bg, bu, offsets=offs, out=out, config=HOPPER if forced else None)
    assert_gemm_close(out, ref.swiglu(a, bg, bu, offsets=offs), "fp8_block", torch.bfloat16, what=str(sizes))


@pytest.mark.parametrize("forced", [True, False], ids=["forced", "heuristic"])
@pytest.mark.parametrize("max_m", [64, 150])
@gpu
def test_masked(forced, max_m):
    counts = [0, max_m, 1, 64, min(65, max_m), 17]
    e, n, k = len(counts), 520, 1040
    a, bg, bu = _inputs((e, max_m), (e,), n, k, seed=3)
    seg = torch.tensor(counts, dtype=torch.int32, device="cuda")
    out = _nan((e, max_m, n))
    swiglu(a, bg, bu, masked_m=seg, out=out, config=HOPPER if forced else None)
    rows = torch.arange(max_m, device="cuda")[None, :] < seg[:, None]
    assert torch.isnan(out[~rows].float()).all(), "rows past a count were written"
    want = ref.swiglu(a, bg, bu, masked_m=seg)
    assert_gemm_close(out[rows], want[rows], "fp8_block", torch.bfloat16)


@gpu
def test_masked_cuda_graph_changed_counts():
    e, max_m, n, k = 8, 128, 2048, 1024
    a, bg, bu = _inputs((e, max_m), (e,), n, k, seed=4)
    seg = torch.full((e,), 64, dtype=torch.int32, device="cuda")
    out = torch.zeros((e, max_m, n), device="cuda", dtype=torch.bfloat16)
    swiglu(a, bg, bu, masked_m=seg, out=out)  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(g):
        swiglu(a, bg, bu, masked_m=seg, out=out)
    torch.cuda.current_stream().wait_stream(s)
    for counts in ([64] * 8, [0, 128, 1, 127, 64, 0, 5, 100]):
        seg.copy_(torch.tensor(counts, dtype=torch.int32))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        rows = torch.arange(max_m, device="cuda")[None, :] < seg[:, None]
        assert torch.isnan(out[~rows].float()).all()
        assert_gemm_close(out[rows], ref.swiglu(a, bg, bu, masked_m=seg)[rows], "fp8_block", torch.bfloat16,
                          what=str(counts))


@pytest.mark.parametrize("cfg", [HopperConfig("wide", 64, 256, 4, 5, epilogue="masked"),
                                 HopperConfig("wide", 128, 256, 8, 4, epilogue="masked"),
                                 HopperConfig("wide", 128, 256, 8, 4, epilogue="tma"),
                                 HopperConfig("wide", 64, 256, 4, 5, epilogue="tma"),
                                 HopperConfig("wide", 128, 256, 8, 3, epilogue="tma", split_wg=False),
                                 # one shared output tile per partition (EPI 3; dense only, grouped masked)
                                 HopperConfig("wide", 128, 256, 8, 4, epilogue="tma1")],
                         ids=lambda c: f"{c.block_m}x{c.block_n}_{c.epilogue}_s{c.stages}_split{int(c.split_wg)}")
@pytest.mark.parametrize("mode", [0, 1, 2])
@gpu
def test_tile_configs(cfg, mode):
    n, k = 520, 1040
    if mode == 0:
        a, bg, bu = _inputs((333,), (), n, k, seed=5)
        out = _nan((333, n))
        assert H.grouped_fp8_block_hopper_impl(a.data, a.scale, bg.data, bg.scale, None, 0, out, cfg, bu.data,
                                               bu.scale)
        assert_gemm_close(out, ref.swiglu(a, bg, bu), "fp8_block", torch.bfloat16)
    elif mode == 1:
        sizes = [0, 1, 130, 63, 300]
        a, bg, bu = _inputs((sum(sizes),), (5,), n, k, seed=5)
        seg = _offsets(sizes)
        out = _nan((sum(sizes), n))
        assert H.grouped_fp8_block_hopper_impl(a.data, a.scale, bg.data, bg.scale, seg, 1, out, cfg, bu.data,
                                               bu.scale)
        assert_gemm_close(out, ref.swiglu(a, bg, bu, offsets=seg), "fp8_block", torch.bfloat16)
    else:
        counts = [0, 150, 1, 64, 65]
        a, bg, bu = _inputs((5, 150), (5,), n, k, seed=5)
        seg = torch.tensor(counts, dtype=torch.int32, device="cuda")
        out = _nan((5, 150, n))
        assert H.grouped_fp8_block_hopper_impl(a.data, a.scale, bg.data, bg.scale, seg, 2, out, cfg, bu.data,
                                               bu.scale)
        rows = torch.arange(150, device="cuda")[None, :] < seg[:, None]
        assert torch.isnan(out[~rows].float()).all()
        assert_gemm_close(out[rows], ref.swiglu(a, bg, bu, masked_m=seg)[rows], "fp8_block", torch.bfloat16)


@gpu
@pytest.mark.parametrize("mode", ["dense", "contiguous", "masked"])
def test_empty_dims(mode):
    """M = 0 / zero-row experts: nothing launched, empty or untouched output; K = 0: the empty
    sum, silu(0) * 0 = 0 everywhere (rows past a masked count may be written too: unspecified)."""
    n = 256
    for m, k in ((0, 256), (130, 0)):
        if mode == "dense":
            a, bg, bu = _inputs((m,), (), n, k, seed=10)
            kw, shape = {}, (m, n)
        elif mode == "contiguous":
            a, bg, bu = _inputs((m,), (3,), n, k, seed=10)
            kw, shape = {"offsets": _offsets([m, 0, 0])}, (m, n)
        else:
            a, bg, bu = _inputs((3, m), (3,), n, k, seed=10)
            kw, shape = {"masked_m": torch.tensor([m, 0, min(m, 7)], dtype=torch.int32, device="cuda")}, (3, m, n)
        out = _nan(shape)
        y = swiglu(a, bg, bu, out=out, config=HOPPER, **kw)
        assert y.shape == shape
        if k == 0 and m:
            rows = out if mode != "masked" else out[0]
            assert torch.equal(rows.float(), torch.zeros_like(rows.float()))


@gpu
def test_forced_config_tiles_come_from_the_planner():
    """A forced hopper config contributes only its strategy: odd tile fields in it are ignored
    (documented), the plan and the result are the planner's, bitwise."""
    a, bg, bu = _inputs((300,), (), 520, 1040, seed=11)
    odd = GemmConfig(block_m=64, block_n=64, num_warps=4, num_stages=2, strategy="hopper")
    plan = bs.explain("swiglu", a, bg, bu, config=HOPPER)
    assert plan.kernel == "hopper_wide" and bs.explain("swiglu", a, bg, bu, config=odd) == plan
    assert plan.config == swiglu_hopper_config(0, 300, 300, 520, num_sms(torch.device("cuda")), 2)
    y1 = swiglu(a, bg, bu, config=HOPPER)
    y2 = swiglu(a, bg, bu, config=GemmConfig(block_m=64, block_n=64, num_warps=4, num_stages=2, strategy="hopper"))
    assert torch.equal(y1.view(torch.int16), y2.view(torch.int16))


@gpu
def test_impl_rejects_unpaired_up_weight():
    a, bg, bu = _inputs((64,), (), 256, 256, seed=12)
    out = _nan((64, 256))
    with pytest.raises(ValueError, match="b2_scale: give b2_data and b2_scale together"):
        H.grouped_fp8_block_hopper_impl(a.data, a.scale, bg.data, bg.scale, None, 0, out, None, bu.data, None)
    bu2 = _inputs((64,), (), 128, 256, seed=12)[2]
    with pytest.raises(ValueError, match="up weight must match the gate's shapes"):
        H.grouped_fp8_block_hopper_impl(a.data, a.scale, bg.data, bg.scale, None, 0, out, None, bu2.data, bu2.scale)


@gpu
def test_unaligned_output_uses_masked_store():
    # an output whose row stride is not 16-byte aligned cannot be a TMA-store target: the launcher
    # falls back to the masked store (and still writes every element)
    m, n, k = 200, 260, 512
    a, bg, bu = _inputs((m,), (), n, k, seed=6)
    big = _nan((m, n + 3))
    out = big[:, :n]
    assert (out.stride(0) * 2) % 16 != 0
    swiglu(a, bg, bu, out=out, config=HOPPER)
    assert_gemm_close(out, ref.swiglu(a, bg, bu), "fp8_block", torch.bfloat16)
    assert torch.isnan(big[:, n:].float()).all(), "wrote past the output view"


@gpu
def test_deterministic_and_heuristic_equals_forced():
    a, bg, bu = _inputs((1024,), (), 2048, 2048, seed=7)
    assert bs.explain("swiglu", a, bg, bu).kernel == "hopper_wide"
    assert bs.explain("swiglu", a, bg, bu) == bs.explain("swiglu", a, bg, bu, config=HOPPER)
    y1 = swiglu(a, bg, bu, config=HOPPER)
    y2 = swiglu(a, bg, bu)
    y3 = swiglu(a, bg, bu, config=HOPPER)
    assert torch.equal(y1.view(torch.int16), y2.view(torch.int16))
    assert torch.equal(y1.view(torch.int16), y3.view(torch.int16))


@gpu
def test_fallbacks():
    # 1x128 weight blocks: not the Hopper layout -> portable kernel by the heuristic, clear error forced
    a, bg, bu = _inputs((256,), (), 256, 256, seed=8, w_block=(1, 128))
    assert "128x128" in hopper_reason(a, bg, torch.bfloat16, 0, b2=bu)
    assert_gemm_close(swiglu(a, bg, bu), ref.swiglu(a, bg, bu), "fp8_block", torch.bfloat16)
    with pytest.raises(ValueError, match="hopper.*128x128"):
        swiglu(a, bg, bu, config=HOPPER)
    # K % 16 != 0: TMA cannot describe the rows -> portable kernel
    a, bg, bu = _inputs((256,), (), 256, 200, seed=8)
    assert "16-byte" in hopper_reason(a, bg, torch.bfloat16, 0, b2=bu)
    assert_gemm_close(swiglu(a, bg, bu), ref.swiglu(a, bg, bu), "fp8_block", torch.bfloat16)
    # weight-only: portable kernel
    x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    a, bg, bu = _inputs((256,), (), 256, 256, seed=9)
    assert "weight-only" in hopper_reason(x, bg, torch.bfloat16, 0, b2=bu)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors run the reference twin on a GPU machine "
                    "(no interpreter there), which ignores the config")
def test_forced_hopper_off_gpu_is_a_clear_error():
    torch.manual_seed(0)
    a = ref_quantize(torch.randn(4, 256), "fp8_block")
    bg = ref_quantize(torch.randn(256, 256), "fp8_block", block=(128, 128))
    bu = ref_quantize(torch.randn(256, 256), "fp8_block", block=(128, 128))
    with pytest.raises(ValueError, match="config.strategy: 'hopper' cannot run this call: needs a CUDA device"):
        swiglu(a, bg, bu, config=HOPPER)


def test_swiglu_config_chooser():
    for mode, rows, rpe, n in [(0, 4096, 4096, 18432), (0, 64, 64, 2048), (1, 1024, 128, 2048),
                               (2, 1024, 64, 7168), (1, 4096, 512, 4096)]:
        for ob in (2, 4):
            c = swiglu_hopper_config(mode, rows, rpe, n, 132, ob)
            assert c.block_n == 256 and c.stages >= 2, c
            assert c.smem_bytes(ob, dual=True) <= 232448, c
            assert c.epilogue == ("tma" if mode == 0 else "masked")
    assert swiglu_hopper_config(0, 4096, 4096, 18432).block_m == 128
    assert swiglu_hopper_config(0, 64, 64, 2048).block_m == 64
    assert swiglu_hopper_config(2, 1024, 64, 7168).block_m == 64


def _swiglu_plan(grouping: str, rows: int, rows_per_expert: float, n: int = 2048, k: int = 2048, why=None,
                 dev=H100_SXM, interpret=False):
    e = 1 if grouping == "dense" else 8
    p = Problem("swiglu", "fp8_block", rows, n, k, grouping=grouping, experts=e,
                rows_per_expert=float(rows_per_expert), dual=True, interpret=interpret)
    return plan_grouped(p, dev, hopper_why=why)


def test_swiglu_hopper_rule():
    """Where the Hopper kernel can take the call, the planner runs it for grouped SwiGLU at any rows
    per expert and for dense SwiGLU from SWIGLU_HOPPER_MIN_M rows (the portable kernel below); with
    a reason it cannot, the portable kernel, and the reason leads the plan's account."""
    dense_hi = _swiglu_plan("dense", SWIGLU_HOPPER_MIN_M, SWIGLU_HOPPER_MIN_M)
    assert dense_hi.kernel == "hopper_wide" and dense_hi.config == swiglu_hopper_config(
        0, SWIGLU_HOPPER_MIN_M, SWIGLU_HOPPER_MIN_M, 2048, H100_SXM.sm_count, 2)
    assert _swiglu_plan("dense", 1024, 1024).kernel == "hopper_wide"
    assert _swiglu_plan("dense", SWIGLU_HOPPER_MIN_M - 1, SWIGLU_HOPPER_MIN_M - 1).kernel == "portable_grouped"
    assert _swiglu_plan("dense", 64, 64).kernel == "portable_grouped"
    assert _swiglu_plan("contiguous", 512, 64).kernel == "hopper_wide"
    assert _swiglu_plan("masked", 8 * 16, 16).kernel == "hopper_wide"
    why = "only fp8_block x fp8_block, got mxfp8 x mxfp8"
    off = _swiglu_plan("contiguous", 4096, 512, why=why)
    assert off.kernel != "hopper_wide" and why in off.reasons[0]
    with pytest.raises(ValueError, match="config.strategy: 'hopper' cannot run this call"):
        plan_grouped(off.problem, H100_SXM, HOPPER, hopper_why=why)
    # the forced strategy asks for the planner's tiles: its own tile fields are ignored
    odd = GemmConfig(block_m=64, block_n=64, num_warps=4, num_stages=2, strategy="hopper")
    p = _swiglu_plan("dense", 64, 64).problem
    assert plan_grouped(p, H100_SXM, odd, hopper_why=None) == plan_grouped(p, H100_SXM, HOPPER, hopper_why=None)
    assert plan_grouped(p, H100_SXM, odd, hopper_why=None).kernel == "hopper_wide"
    # the interpreter never runs the Hopper kernel (the op passes a reason there)
    assert _swiglu_plan("dense", 1024, 1024, why="needs a CUDA device", dev=CPU_INTERPRETER,
                        interpret=True).kernel == "portable_grouped"
