"""The split grouped SwiGLU of MX / NV weights on sm_90 (plan/grouped.py ``_split_swiglu_plan``,
ops/_grouped_mx.py ``split_swiglu``): gate and up each a grouped GEMM with fp32 output on
the register-streaming, streaming or tiled kernel, then ``silu(gate) * up`` in one pass.

Through the public ``bs.swiglu``: contiguous offsets with empty, one-row and multi-tile experts at
decode, small-batch and prefill rows per expert (so each of the three kernels runs), masked counts
with NaN-poisoned outputs whose rows past the counts must stay untouched, N and K that are not
multiples of the tiles, bf16 and quantized activations, nvfp4 with one and with per-expert global
scales, bf16 / fp32 outputs, a CUDA-graph replay; every output against the float64 reference, and
the fused SwiGLU (``SPLIT_SWIGLU`` off) within the same tolerance. Needs an sm_90 GPU."""

from __future__ import annotations

import pytest
import torch

import blockscaled as bs
from blockscaled.ops import grouped as ops_grouped
from blockscaled.plan import grouped as plan_grouped_mod
from blockscaled.plan import observe_plans
from blockscaled.testing.inputs import randn_like_activations
from blockscaled.testing.tolerances import assert_gemm_close

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                reason="the split SwiGLU runs the sm_90 MX kernels")

FMTS = ("mxfp4", "nvfp4", "mxfp8")
#: rows per expert that the grouped planner gives to the register-streaming (decode), streaming
#: (small batch) and tiled (prefill) kernels (plan/direct.py, plan/stream.py, plan/tiled.py)
COUNTS = {"decode": [0, 1, 2, 1, 0, 3], "batch": [0, 20, 5, 40, 0, 25], "prefill": [0, 300, 130, 520, 0, 257]}


def _kernel(size, fmt, weight_only):
    """The kernel the planner gives one projection (H200 / H100 alike; tests/test_planner.py)."""
    if size == "prefill":
        return "hopper_tiled"
    return "hopper_direct" if size == "decode" and weight_only and fmt != "mxfp8" else "hopper_stream"


def _weights(e, n, k, fmt, seed, per_expert):
    g = torch.Generator().manual_seed(seed)
    out = []
    for j in range(2):
        w = bs.quantize((torch.randn(e, n, k, generator=g) * 0.05).cuda(), fmt)
        wd = w.dequantize(torch.float32).double()
        gs = None
        if per_expert:  # a checkpoint's per-expert weight_scale_2: the dequantized weights scale by gs / gs_e
            gs = w.global_scale.float() * torch.tensor([1.0, 2.0, 0.5, 4.0, 0.25, 1.5], device="cuda")[:e] * (j + 1)
            wd = wd * (w.global_scale.double() / gs.double())[:, None, None]
        out.append((w, wd, gs))
    return out


def _offsets(counts):
    o = torch.zeros(len(counts) + 1, dtype=torch.int32)
    o[1:] = torch.tensor(counts, dtype=torch.int32).cumsum(0)
    return o.cuda()


def _ref(xd, wgd, wud, rows_of):
    """float64 silu(x @ wg[e].T) * (x @ wu[e].T) over each expert's rows."""
    out = []
    for e, (lo, hi) in enumerate(rows_of):
        g, u = xd[lo:hi] @ wgd[e].T, xd[lo:hi] @ wud[e].T
        out.append(torch.nn.functional.silu(g) * u)
    return torch.cat(out)


def _fused(fn):
    """``fn()`` with the split off (the fused SwiGLU), plans re-made before and after."""
    old = plan_grouped_mod.SPLIT_SWIGLU
    ops_grouped._PLANS.clear()
    plan_grouped_mod.SPLIT_SWIGLU = False
    try:
        return fn()
    finally:
        plan_grouped_mod.SPLIT_SWIGLU = old
        ops_grouped._PLANS.clear()


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("size", tuple(COUNTS))
def test_split_contiguous(fmt, size):
    e, n, k = 6, 200, 2880
    counts = COUNTS[size]
    off = _offsets(counts)
    rows_of = [(int(off[i]), int(off[i + 1])) for i in range(e)]
    x = randn_like_activations(int(off[-1]), k, dtype=torch.bfloat16, device="cuda", seed=2)
    for per_expert in ((False, True) if fmt == "nvfp4" else (False,)):
        (wg, wgd, gsg), (wu, wud, gsu) = _weights(e, n, k, fmt, 1, per_expert)
        gkw = dict(b_gate_global_scale=gsg, b_up_global_scale=gsu) if per_expert else {}
        for a in (x, bs.quantize(x, fmt)):
            xd = (a if isinstance(a, torch.Tensor) else a.dequantize(torch.float32)).double()
            ref = _ref(xd, wgd, wud, rows_of)
            for out_dtype in (torch.bfloat16, torch.float32):
                kw = dict(offsets=off, out_dtype=out_dtype, **gkw)
                plan = bs.explain("swiglu", a, wg, wu, **kw)
                assert plan.kernel == _kernel(size, fmt, a is x), plan
                assert plan.describe().startswith("gate, up:"), plan
                y = bs.swiglu(a, wg, wu, **kw)
                what = f"{fmt} {size} {'W x A' if a is not x else 'weight-only'} {out_dtype} per-expert {per_expert}"
                assert_gemm_close(y, ref, fmt, out_dtype, what=what)
                assert torch.equal(y, bs.swiglu(a, wg, wu, **kw))  # deterministic
                yf = _fused(lambda: bs.swiglu(a, wg, wu, **kw))
                assert_gemm_close(yf, ref, fmt, out_dtype, what="fused " + what)


@pytest.mark.parametrize("fmt", FMTS)
def test_split_masked_leaves_rows_past_the_counts(fmt):
    e, max_m, n, k = 5, 16, 392, 2048  # 16 rows per expert: the streaming kernel
    counts = torch.tensor([0, 16, 7, 1, 13], dtype=torch.int32, device="cuda")
    (wg, wgd, _), (wu, wud, _) = _weights(e, n, k, fmt, 3, False)
    xm = randn_like_activations(e * max_m, k, dtype=torch.bfloat16, device="cuda", seed=4).view(e, max_m, k)
    for a in (xm, bs.quantize(xm, fmt)):
        assert bs.explain("swiglu", a, wg, wu, masked_m=counts).describe().startswith("gate, up:")
        out = torch.full((e, max_m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        bs.swiglu(a, wg, wu, masked_m=counts, out=out)
        xd = (a if isinstance(a, torch.Tensor) else a.dequantize(torch.float32)).double()
        for i in range(e):
            c = int(counts[i])
            if c:
                ref = torch.nn.functional.silu(xd[i, :c] @ wgd[i].T) * (xd[i, :c] @ wud[i].T)
                assert_gemm_close(out[i, :c], ref, fmt, torch.bfloat16, what=f"masked expert {i}")
            assert out[i, c:].isnan().all(), f"expert {i}: rows past the count were written"


def test_split_cuda_graph_replays_new_routing():
    e, n, k, fmt = 6, 256, 2048, "mxfp4"
    (wg, _, _), (wu, _, _) = _weights(e, n, k, fmt, 5, False)
    x = randn_like_activations(40, k, dtype=torch.bfloat16, device="cuda", seed=6)
    off = _offsets([0, 10, 5, 20, 0, 5])
    out = torch.empty(40, n, dtype=torch.bfloat16, device="cuda")
    bs.swiglu(x, wg, wu, offsets=off, out=out)  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        bs.swiglu(x, wg, wu, offsets=off, out=out)
    off.copy_(_offsets([3, 3, 3, 3, 3, 25]))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, bs.swiglu(x, wg, wu, offsets=off))


@pytest.mark.parametrize("fmt", ("mxfp4", "nvfp4"))
def test_split_in_chunks_equals_one_pass(fmt, monkeypatch):
    """Past ``SPLIT_SWIGLU_CHUNK_BYTES`` of fp32 products the split runs in row chunks (contiguous,
    offsets rebased on the device) or expert chunks (masked): bitwise the one-pass result (the
    kernels' K order does not change), and within the tolerance of float64."""
    from blockscaled.ops import _grouped_mx

    e, n, k = 6, 200, 2880
    (wg, wgd, gsg), (wu, wud, gsu) = _weights(e, n, k, fmt, 8, fmt == "nvfp4")
    gkw = dict(b_gate_global_scale=gsg, b_up_global_scale=gsu) if fmt == "nvfp4" else {}
    for size, rows in (("prefill", 97), ("batch", 7), ("decode", 2)):  # tiled, streaming, register-streaming
        off = _offsets(COUNTS[size])
        rows_of = [(int(off[i]), int(off[i + 1])) for i in range(e)]
        x = randn_like_activations(int(off[-1]), k, dtype=torch.bfloat16, device="cuda", seed=7)
        assert bs.explain("swiglu", x, wg, wu, offsets=off, **gkw).kernel == _kernel(size, fmt, True)
        one = bs.swiglu(x, wg, wu, offsets=off, **gkw)
        monkeypatch.setattr(_grouped_mx, "SPLIT_SWIGLU_CHUNK_BYTES", 8 * n * rows)  # chunks of `rows` rows
        y = bs.swiglu(x, wg, wu, offsets=off, **gkw)
        monkeypatch.undo()
        assert torch.equal(y, one), size
        assert_gemm_close(y, _ref(x.double(), wgd, wud, rows_of), fmt, torch.bfloat16, what=f"chunked {size}")
    xm = randn_like_activations(e * 16, k, dtype=torch.bfloat16, device="cuda", seed=9).view(e, 16, k)
    counts = torch.tensor([0, 16, 7, 1, 13, 16], dtype=torch.int32, device="cuda")
    one_m = torch.full((e, 16, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    bs.swiglu(xm, wg, wu, masked_m=counts, out=one_m, **gkw)
    monkeypatch.setattr(_grouped_mx, "SPLIT_SWIGLU_CHUNK_BYTES", 8 * n * 16 * 2)  # 2 experts per chunk
    ym = torch.full((e, 16, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    bs.swiglu(xm, wg, wu, masked_m=counts, out=ym, **gkw)
    assert torch.equal(ym.nan_to_num(7.0), one_m.nan_to_num(7.0))  # rows past the counts untouched: NaN in both
    for i in range(e):  # per-expert nvfp4 global scales sliced with their experts
        c = int(counts[i])
        if c:
            ref = torch.nn.functional.silu(xm[i, :c].double() @ wgd[i].T) * (xm[i, :c].double() @ wud[i].T)
            assert_gemm_close(ym[i, :c], ref, fmt, torch.bfloat16, what=f"chunked masked expert {i}")


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("size", tuple(COUNTS))
def test_stacked_gate_up(fmt, size):
    """``bs.swiglu(a, w_gate_up)`` on one [E, 2N, K] weight (plan/grouped.py ``stacked_swiglu_plan``):
    one grouped GEMM over gate and up rows on an sm_90 MX kernel, then the activation pass; against
    float64, the split on the same values, deterministic, a CUDA-graph replay with new routing, and
    masked counts leaving the rows past them untouched."""
    e, n, k = 6, 200, 2880
    g = torch.Generator().manual_seed(7)
    w = bs.quantize((torch.randn(e, 2 * n, k, generator=g) * 0.05).cuda(), fmt)
    wd = w.dequantize(torch.float32).double()
    off = _offsets(COUNTS[size])
    rows_of = [(int(off[i]), int(off[i + 1])) for i in range(e)]
    x = randn_like_activations(int(off[-1]), k, dtype=torch.bfloat16, device="cuda", seed=3)
    for a in (x, bs.quantize(x, fmt)):
        xd = (a if isinstance(a, torch.Tensor) else a.dequantize(torch.float32)).double()
        ref = _ref(xd, wd[:, :n], wd[:, n:], rows_of)
        plan = bs.explain("swiglu", a, w, offsets=off)
        assert plan.kernel in ("hopper_direct", "hopper_stream", "hopper_tiled"), plan
        assert plan.describe().startswith("gate_up: ") and plan.problem.n == n, plan
        with observe_plans() as ran:
            y = bs.swiglu(a, w, offsets=off)
        assert ran and ran[-1] == plan, (ran, plan)
        what = f"stacked {fmt} {size} {'W x A' if a is not x else 'weight-only'}"
        assert_gemm_close(y, ref, fmt, torch.bfloat16, what=what)
        assert torch.equal(y, bs.swiglu(a, w, offsets=off))
        wg = bs.ScaledTensor(w.data[:, :n].contiguous(), w.scale[:, :n].contiguous(), w.format,
                             torch.Size((e, n, k)), w.block, w.rounding, global_scale=w.global_scale)
        wu = bs.ScaledTensor(w.data[:, n:].contiguous(), w.scale[:, n:].contiguous(), w.format,
                             torch.Size((e, n, k)), w.block, w.rounding, global_scale=w.global_scale)
        assert_gemm_close(bs.swiglu(a, wg, wu, offsets=off), ref, fmt, torch.bfloat16, what="split " + what)
    if size == "decode":  # a graph captured on one routing replays another
        a = bs.quantize(x, fmt)
        off2 = _offsets(list(reversed(COUNTS[size])))
        offs = off.clone()
        yy = bs.swiglu(a, w, offsets=offs)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            yy = bs.swiglu(a, w, offsets=offs)
        offs.copy_(off2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(yy, bs.swiglu(a, w, offsets=off2))
    # masked: rows past the counts keep their NaN poison
    counts = torch.tensor([0, 3, 1, 2, 0, 4], dtype=torch.int32, device="cuda")
    xm = randn_like_activations(e, 4, k, dtype=torch.bfloat16, device="cuda", seed=4)
    out = torch.full((e, 4, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    bs.swiglu(xm, w, masked_m=counts, out=out)
    for j, c in enumerate(counts.tolist()):
        if c:
            want = _ref(xm[j, :c].double(), wd[j:j + 1, :n], wd[j:j + 1, n:], [(0, c)])
            assert_gemm_close(out[j, :c], want, fmt, torch.bfloat16, what=f"stacked masked expert {j}")
        assert torch.isnan(out[j, c:]).all()
