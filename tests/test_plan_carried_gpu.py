"""GPU (sm_90): what the ops launch is exactly the plan ``bs.explain`` returns for the same call.

Grouped / SwiGLU: for a few shapes (a contiguous and a masked one whose tile rule asks for a tail
split, 64- and 128-row tiles, an ``expected_m`` hint, SwiGLU grouped and dense) the Gluon
launcher is spied on (``_hopper._grouped_gluon`` records its HopperConfig, then runs the real
one; ``_hopper._launch_wide`` records the kernel's constexprs): the config equals the plan of
``bs.explain("grouped_gemm" / "swiglu", ...)``, which equals the tile rule of plan/grouped.py
for those shapes; the kernel got its stages / raster / halves and, where the plan splits the
tail, the split; on the eager fast path, through the custom op (``gemm.EAGER_FAST_PATH =
False``: the plan encoded and decoded) and under torch.compile.

Dense GEMM: shapes whose plan is a wide tile with a tail split, a wide split-K, skinny, the GEMV,
the portable kernel (...) are found by asking the planner over a grid of shapes on this device (the
test does not hard-code the cost model's choices; a kind the model picks for none of them is
skipped, saying so). ``gemm.run_plan`` and the launchers (``_hopper.gemm_fp8_block_hopper_impl``,
``gemm._launch_triton``, ``gemm._launch_gemv``, ``gemm._dequant_matmul``) are spied on: the plan
run and the config launched equal ``bs.explain("gemm", ...)``, eagerly and under torch.compile.

Outputs (NaN-poisoned first) match the float64 reference within the tolerance table."""

from __future__ import annotations

import dataclasses
import functools
import itertools

import pytest
import torch

import blockscaled as bs
from blockscaled.config.gemm import GemmConfig
from blockscaled.config.hopper import HopperConfig
from blockscaled.ops import _hopper as H
from blockscaled.ops import gemm as gemm_mod
from blockscaled.plan import Problem, device_info, num_sms, plan_gemm
from blockscaled.plan.dense import skinny_stages
from blockscaled.plan.grouped import grouped_hopper_config, swiglu_hopper_config
from blockscaled.plan.splits import split_plan_kb
from blockscaled.reference import grouped as ref
from blockscaled.reference.gemm import gemm as ref_gemm
from blockscaled.testing.tolerances import assert_gemm_close

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs an sm_90 (Hopper) GPU"),
]

#: SM count of the parts where the tail-split row measured its split (H100 SXM, H200)
_SPLIT_SMS = 132


def _cuda():
    return torch.device("cuda")


def _q(shape, seed, scale=1.0, weight=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(*shape, device="cuda", generator=g) * scale).to(torch.bfloat16)
    return bs.quantize(x, "fp8_block", block=(128, 128)) if weight else bs.quantize(x, "fp8_block")


def _offsets(e, m):
    return torch.arange(0, (e + 1) * m, m, dtype=torch.int32, device="cuda")


# --------------------------------------------------------------------------- grouped / SwiGLU
class _Spy:
    def __init__(self, monkeypatch):
        self.cfgs, self.launches = [], []
        gluon, wide = H._grouped_gluon, H._launch_wide

        def grouped_gluon(*args, **kw):
            self.cfgs.append(args[7] if len(args) > 7 else kw["cfg"])
            return gluon(*args, **kw)

        def launch_wide(grid, spread, *args, **kw):
            self.launches.append(dict(kw, grid=grid))
            return wide(grid, spread, *args, **kw)

        monkeypatch.setattr(H, "_grouped_gluon", grouped_gluon)
        monkeypatch.setattr(H, "_launch_wide", launch_wide)


# (name, layout, E, rows per expert (masked: max_m), N, K, expected_m, dual)
CASES = [
    ("contig_E4_m512_tail", "contiguous", 4, 512, 7168, 7168, None, False),
    ("masked_E4_m512_tail", "masked", 4, 512, 7168, 7168, None, False),
    ("contig_E8_m64", "contiguous", 8, 64, 4096, 7168, None, False),
    ("masked_E8_m128", "masked", 8, 128, 4096, 7168, None, False),
    ("masked_E8_m256_hint64", "masked", 8, 256, 2048, 4096, 64, False),
    ("contig_E4_m128_n2048", "contiguous", 4, 128, 2048, 7168, None, False),
    ("swiglu_contig_E8_m128", "contiguous", 8, 128, 2048, 7168, None, True),
    ("swiglu_masked_E8_m64", "masked", 8, 64, 2048, 7168, None, True),
    ("swiglu_dense_M512", "dense", 1, 512, 2048, 7168, None, True),
]


def _tile_rule(layout, e, m, n, k, expected_m, dual, out_dtype):
    """The tile rule's HopperConfig for the call _run makes, from the shapes alone (rows per
    expert: contiguous sum_m / E, masked max_m or the expected_m hint)."""
    nsm = num_sms(_cuda())
    if dual:
        mode = {"dense": 0, "contiguous": 1, "masked": 2}[layout]
        all_rows = m if layout == "dense" else e * m
        return swiglu_hopper_config(mode, all_rows, m, n, nsm, out_dtype.itemsize)
    rpe = min(expected_m, m) if expected_m else m
    return grouped_hopper_config(rpe, n, k, nsm, out_dtype.itemsize, e)


def _run(layout, e, m, n, k, expected_m, dual, out_dtype, compiled=False, full=True):
    """(plan from bs.explain, output, reference, rows mask or None) for one call through the
    public op. Masked: ``full`` counts max_m for every expert, else every third expert holds a
    third of it."""
    wg = _q((e, n, k) if layout != "dense" else (n, k), 1, 0.05, weight=True)
    wu = _q((e, n, k) if layout != "dense" else (n, k), 2, 0.05, weight=True) if dual else None
    if layout == "masked":
        a = _q((e, m, k), 3)
        counts = [m if full or i % 3 else max(1, m // 3) for i in range(e)]
        kw = {"masked_m": torch.tensor(counts, dtype=torch.int32, device="cuda")}
        shape = (e, m, n)
    elif layout == "contiguous":
        a = _q((e * m, k), 3)
        kw = {"offsets": _offsets(e, m)}
        shape = (e * m, n)
    else:
        a = _q((m, k), 3)
        kw, shape = {}, (m, n)
    out = torch.full(shape, float("nan"), device="cuda", dtype=out_dtype)
    if dual:
        plan = bs.explain("swiglu", a, wg, wu, out=out, out_dtype=out_dtype, **kw)
    else:
        plan = bs.explain("grouped_gemm", a, wg, out=out, out_dtype=out_dtype, expected_m=expected_m, **kw)

    def call(a_data, out):
        aa = dataclasses.replace(a, data=a_data)
        if dual:
            return bs.swiglu(aa, wg, wu, out=out, out_dtype=out_dtype, **kw)
        return bs.grouped_gemm(aa, wg, out=out, out_dtype=out_dtype, expected_m=expected_m, **kw)

    if compiled:
        torch._dynamo.reset()  # each call compiles afresh (no recompile limit reached across the cases)
    fn = torch.compile(call, fullgraph=True, backend="aot_eager") if compiled else call
    fn(a.data, out)
    torch.cuda.synchronize()
    want = ref.swiglu(a, wg, wu, **kw) if dual else ref.grouped_gemm(a, wg, **kw)
    rows = None
    if layout == "masked":
        rows = torch.arange(m, device="cuda")[None, :] < kw["masked_m"][:, None]
    return plan, out, want, rows


@pytest.mark.parametrize("path", ["eager", "custom_op"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_launched_config_is_the_plan(case, path, monkeypatch):
    name, layout, e, m, n, k, expected_m, dual = case
    out_dtype = torch.bfloat16
    spy = _Spy(monkeypatch)
    if path == "custom_op":
        monkeypatch.setattr(gemm_mod, "EAGER_FAST_PATH", False)
    # the tail rows: every expert full, so that the real tile count's last wave is the tile rule's
    # estimate and the kernel splits it (it decides on the device from the counts)
    plan, out, want, rows = _run(layout, e, m, n, k, expected_m, dual, out_dtype, full=name.endswith("_tail"))
    want_cfg = plan.config
    assert plan.kernel == "hopper_wide", plan
    assert want_cfg == _tile_rule(layout, e, m, n, k, expected_m, dual, out_dtype), (name, plan)
    assert spy.cfgs == [want_cfg], (name, spy.cfgs, want_cfg)
    assert len(spy.launches) == 1
    kw = spy.launches[0]
    assert (kw["STAGES"], kw["GROUP_M"], kw["NH"], kw["DUAL"]) == (
        want_cfg.stages, want_cfg.group_m, want_cfg.block_n // 128, dual), kw
    if name.endswith("_tail") and num_sms(_cuda()) == _SPLIT_SMS:
        assert want_cfg.tail_split > 1, want_cfg  # the measured row: the plan splits the last wave
    if want_cfg.tail_split > 1:  # the launcher's K ranges for that split (no empty range)
        nsplit = split_plan_kb(-(-k // 128), want_cfg.tail_split)[0]
        assert nsplit > 1 and kw["SPLIT"] == nsplit and kw["TAIL"], kw
    else:
        assert kw["SPLIT"] == 1, kw
    if rows is not None:
        assert torch.isnan(out[~rows].float()).all()  # rows past a count are not written
        out, want = out[rows], want[rows]
    assert_gemm_close(out, want, "fp8_block", out_dtype, what=f"{name} {path}")


def test_compiled_call_launches_the_planned_tail_split(monkeypatch):
    """torch.compile(fullgraph=True): the plan made at trace time crosses the op whole."""
    spy = _Spy(monkeypatch)
    case = ("contiguous", 4, 512, 7168, 7168, None, False)
    plan, out, want, _ = _run(*case, torch.bfloat16, compiled=True)
    assert plan.config == _tile_rule(*case, torch.bfloat16)
    assert spy.cfgs == [plan.config]
    assert spy.launches[0]["SPLIT"] == split_plan_kb(56, plan.config.tail_split)[0]
    assert_gemm_close(out, want, "fp8_block", torch.bfloat16, what="compiled")


def test_bitwise_same_on_both_paths(monkeypatch):
    """Fast path and custom op: the same kernel with the same config, so the same bits (the tail
    split included: its reduction order is fixed)."""
    case = ("contiguous", 4, 512, 7168, 7168, None, False)
    _, eager, _, _ = _run(*case, torch.bfloat16)
    monkeypatch.setattr(gemm_mod, "EAGER_FAST_PATH", False)
    _, via_op, _, _ = _run(*case, torch.bfloat16)
    assert torch.equal(eager.view(torch.int16), via_op.view(torch.int16))


# --------------------------------------------------------------------------- dense GEMM
def _is_wide(p, split_k=False, tail=False):
    c = p.config
    return p.kernel == "hopper_wide" and (c.split_k > 1) == split_k and (c.tail_split > 1) == tail


#: plan kinds to cover: name -> predicate on the plan
DENSE_KINDS = {
    "wide_tail_split": functools.partial(_is_wide, tail=True),
    "wide_split_k": functools.partial(_is_wide, split_k=True),
    "wide": _is_wide,
    "skinny": lambda p: p.kernel == "hopper_skinny",
    "gemv": lambda p: p.kernel == "gemv",
    "portable": lambda p: p.kernel == "portable" and p.config.split_k == 1,
    "portable_split_k": lambda p: p.kernel == "portable" and p.config.split_k > 1,
    "dequant_matmul": lambda p: p.kernel == "dequant_matmul",
}
#: the searched grid (bias False first: a bias rules the Hopper kernels out)
SEARCH_M = (1, 2, 4, 8, 16, 32, 48, 64, 100, 128, 256, 512, 1024, 2048, 4096)
SEARCH_N = (256, 1024, 2112, 4096, 7168)
SEARCH_K = (512, 2048, 7168)


@functools.lru_cache(maxsize=None)
def _find(kind: str):
    """The smallest (M * N * K) problem of the grid whose plan on this GPU is of ``kind``, or None."""
    dev = device_info(_cuda())
    for bias in (False, True):
        hits = [Problem("gemm", "fp8_block", m, n, k, bias=bias)
                for m, n, k in itertools.product(SEARCH_M, SEARCH_N, SEARCH_K)
                if DENSE_KINDS[kind](plan_gemm(Problem("gemm", "fp8_block", m, n, k, bias=bias), dev))]
        if hits:
            return min(hits, key=lambda p: p.m * p.n * p.k)
    return None


class _DenseSpy:
    """Records the plans ``run_plan`` is asked to run and what each launcher launched."""

    def __init__(self, monkeypatch):
        self.plans, self.launched, self.wide, self.skinny = [], [], [], []
        run_plan, hop = gemm_mod.run_plan, H.gemm_fp8_block_hopper_impl
        triton_l, gemv_l, dq = gemm_mod._launch_triton, gemm_mod._launch_gemv, gemm_mod._dequant_matmul
        wide, skinny = H._launch_wide, H._launch_skinny

        def spy_run_plan(plan, *args, **kw):
            self.plans.append(plan)
            return run_plan(plan, *args, **kw)

        def spy_hopper(a2, a_s2, b_data, b_scale, out2, cfg):
            ok = hop(a2, a_s2, b_data, b_scale, out2, cfg)
            self.launched.append(("hopper" if ok else "hopper (not built)", cfg))
            return ok

        def spy_triton(*args):
            self.launched.append(("triton", args[13]))  # (..., m, n, k, cfg, promote, interpret)
            return triton_l(*args)

        def spy_gemv(*args):
            self.launched.append(("gemv", args[11]))  # (..., m, n, k, cfg)
            return gemv_l(*args)

        def spy_dq(*args):
            self.launched.append(("dequant_matmul", GemmConfig(strategy="dequant_matmul")))
            return dq(*args)

        def spy_wide(grid, spread, *args, **kw):
            self.wide.append(dict(kw, grid=grid))
            return wide(grid, spread, *args, **kw)

        def spy_skinny(*args):
            self.skinny.append(args[5])
            return skinny(*args)

        for mod, name, fn in ((gemm_mod, "run_plan", spy_run_plan), (H, "gemm_fp8_block_hopper_impl", spy_hopper),
                              (gemm_mod, "_launch_triton", spy_triton), (gemm_mod, "_launch_gemv", spy_gemv),
                              (gemm_mod, "_dequant_matmul", spy_dq), (H, "_launch_wide", spy_wide),
                              (H, "_launch_skinny", spy_skinny)):
            monkeypatch.setattr(mod, name, fn)


_LAUNCHER = {"hopper_wide": "hopper", "hopper_skinny": "hopper", "gemv": "gemv", "portable": "triton",
             "dequant_matmul": "dequant_matmul"}


def _dense_run(p: Problem, compiled: bool, config=None):
    """(plan from bs.explain, output, reference) of ``bs.gemm`` on random operands of ``p``'s shape
    (bias when ``p.bias``), into a NaN-poisoned ``out``."""
    a = _q((p.m, p.k), 3)
    b = _q((p.n, p.k), 1, 0.05, weight=True)
    bias = torch.randn(p.n, device="cuda", dtype=torch.bfloat16) if p.bias else None
    out = torch.full((p.m, p.n), float("nan"), device="cuda", dtype=torch.bfloat16)
    plan = bs.explain("gemm", a, b, out=out, bias=bias, config=config)

    def call(a_data, out):
        return bs.gemm(dataclasses.replace(a, data=a_data), b, out=out, bias=bias, config=config)

    if compiled:
        torch._dynamo.reset()  # each call compiles afresh (no recompile limit reached across the cases)
    fn = torch.compile(call, fullgraph=True, backend="aot_eager") if compiled else call
    fn(a.data, out)
    torch.cuda.synchronize()
    return plan, out, ref_gemm(a, b, bias=bias)


def _check_dense_launch(spy: _DenseSpy, plan, p: Problem) -> None:
    """The plan run and the config launched are ``plan``; the wide / skinny kernels got its tiles
    and splits."""
    assert spy.plans == [plan], (spy.plans, plan)
    assert spy.launched == [(_LAUNCHER[plan.kernel], plan.config)], (spy.launched, plan)
    cfg = plan.config
    if plan.kernel == "hopper_wide":
        assert len(spy.wide) == 1 and not spy.skinny
        kw = spy.wide[0]
        assert (kw["STAGES"], kw["GROUP_M"], kw["NH"], kw["DUAL"]) == (cfg.stages, cfg.group_m, cfg.block_n // 128,
                                                                       False), kw
        nk = -(-p.k // 128)
        if cfg.split_k > 1:
            assert kw["SPLIT"] == split_plan_kb(nk, cfg.split_k)[0] > 1 and not kw["TAIL"], kw
        elif cfg.tail_split > 1:  # the planner splits only a partial last wave after full ones
            tiles = -(-p.m // cfg.block_m) * -(-p.n // cfg.block_n)
            assert tiles > num_sms(_cuda()) and tiles % num_sms(_cuda()), (tiles, cfg)
            assert kw["SPLIT"] == split_plan_kb(nk, cfg.tail_split)[0] > 1 and kw["TAIL"], kw
        else:
            assert kw["SPLIT"] == 1, kw
    elif plan.kernel == "hopper_skinny":
        assert spy.skinny == [cfg] and not spy.wide
    else:
        assert not spy.wide and not spy.skinny


@pytest.mark.parametrize("path", ["eager", "compiled"])
@pytest.mark.parametrize("kind", list(DENSE_KINDS))
def test_dense_launch_is_the_plan(kind, path, monkeypatch):
    """bs.explain("gemm", a, b) is what bs.gemm(a, b) runs and launches, for a shape of each plan
    kind (found by asking the planner), eagerly and under torch.compile(fullgraph=True)."""
    p = _find(kind)
    if p is None:
        pytest.skip(f"the planner picks a {kind!r} plan for no fp8_block shape of the searched grid on this GPU "
                    f"(M {SEARCH_M[0]}..{SEARCH_M[-1]}, N {SEARCH_N}, K {SEARCH_K}, with and without bias)")
    spy = _DenseSpy(monkeypatch)
    plan, out, want = _dense_run(p, compiled=path == "compiled")
    assert DENSE_KINDS[kind](plan), (kind, plan)
    assert plan == plan_gemm(p, device_info(_cuda())) and plan.problem == p, (plan, plan.problem, p)
    _check_dense_launch(spy, plan, p)
    assert_gemm_close(out, want, "fp8_block", torch.bfloat16, what=f"{kind} {path} M={p.m} N={p.n} K={p.k}")


FORCED = {
    "skinny_split_k": (Problem("gemm", "fp8_block", 16, 2112, 7168),
                       HopperConfig("skinny", 16, 128, 4, skinny_stages(16, 128), split_k=4)),
    "wide_tail_split": (Problem("gemm", "fp8_block", 1024, 2112, 2048),
                        HopperConfig("wide", 128, 128, 8, 4, tail_split=4)),
    "portable_split_k": (Problem("gemm", "fp8_block", 64, 1024, 2048),
                         GemmConfig(64, 64, 128, 4, 4, 2, "triton", True, 8, False)),
}


@pytest.mark.parametrize("name", list(FORCED))
def test_forced_config_is_the_plan_and_runs(name, monkeypatch):
    """A forced ``config=`` is the plan explain returns and exactly what launches (eager: forced
    configs run outside the custom op); covers the skinny kernel whatever the cost model picks."""
    p, cfg = FORCED[name]
    spy = _DenseSpy(monkeypatch)
    plan, out, want = _dense_run(p, compiled=False, config=cfg)
    assert plan.config == cfg
    _check_dense_launch(spy, plan, p)
    assert_gemm_close(out, want, "fp8_block", torch.bfloat16, what=name)
