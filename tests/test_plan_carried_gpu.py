"""GPU (sm_90): what bs.grouped_gemm / bs.swiglu launch is exactly what the chooser returned.

For a few grouped shapes (a contiguous and a masked one where ops._hopper.choose_grouped_config
returns a tail split, 64- and 128-row tiles, an ``expected_m`` hint, SwiGLU grouped and dense)
the Gluon launcher is spied on (``_hopper._grouped_gluon`` records its HopperConfig, then runs the
real one; ``_hopper._launch_wide`` records the kernel's constexprs): the config equals the
chooser's, the kernel got its stages / raster / halves and, where the chooser split the tail, the
split; on the eager fast path, through the custom op (``gemm.EAGER_FAST_PATH = False``: the config
encoded and decoded) and under torch.compile. Outputs (NaN-poisoned first) match the float64
reference within the tolerance table."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import blockscaled as bs
from blockscaled.ops import _hopper as H
from blockscaled.ops import gemm as gemm_mod
from blockscaled.reference import grouped as ref
from blockscaled.testing.tolerances import assert_gemm_close

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs an sm_90 (Hopper) GPU"),
]

#: SM count of the parts where the issue's row measured its tail split (H100 SXM, H200)
_SPLIT_SMS = 132


def _q(shape, seed, scale=1.0, weight=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(*shape, device="cuda", generator=g) * scale).to(torch.bfloat16)
    return bs.quantize(x, "fp8_block", block=(128, 128)) if weight else bs.quantize(x, "fp8_block")


def _offsets(e, m):
    return torch.arange(0, (e + 1) * m, m, dtype=torch.int32, device="cuda")


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


def _chosen(layout, e, m, n, k, expected_m, dual, out_dtype):
    """The chooser's HopperConfig for the call _run makes, from the shapes alone (rows per
    expert: contiguous sum_m / E, masked max_m or the expected_m hint)."""
    nsm = H.num_sms_of(torch.device("cuda"))
    if dual:
        mode = {"dense": 0, "contiguous": 1, "masked": 2}[layout]
        all_rows = m if layout == "dense" else e * m
        return H.choose_swiglu_config(mode, all_rows, m, n, nsm, out_dtype.itemsize)
    rpe = min(expected_m, m) if expected_m else m
    return H.choose_grouped_config(rpe, n, k, nsm, out_dtype.itemsize, e)


def _run(layout, e, m, n, k, expected_m, dual, out_dtype, compiled=False, full=True):
    """(output, reference, rows mask or None) for one call through the public op. Masked:
    ``full`` counts max_m for every expert, else every third expert holds a third of it."""
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

    def call(a_data, out):
        aa = dataclasses.replace(a, data=a_data)
        if dual:
            return bs.swiglu(aa, wg, wu, out=out, out_dtype=out_dtype, **kw)
        return bs.grouped_gemm(aa, wg, out=out, out_dtype=out_dtype, expected_m=expected_m, **kw)

    fn = torch.compile(call, fullgraph=True, backend="aot_eager") if compiled else call
    fn(a.data, out)
    torch.cuda.synchronize()
    want = ref.swiglu(a, wg, wu, **kw) if dual else ref.grouped_gemm(a, wg, **kw)
    rows = None
    if layout == "masked":
        rows = torch.arange(m, device="cuda")[None, :] < kw["masked_m"][:, None]
    return out, want, rows


@pytest.mark.parametrize("path", ["eager", "custom_op"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_launched_config_is_the_chosen_one(case, path, monkeypatch):
    name, layout, e, m, n, k, expected_m, dual = case
    out_dtype = torch.bfloat16
    spy = _Spy(monkeypatch)
    if path == "custom_op":
        monkeypatch.setattr(gemm_mod, "EAGER_FAST_PATH", False)
    want_cfg = _chosen(layout, e, m, n, k, expected_m, dual, out_dtype)
    # the tail rows: every expert full, so that the real tile count's last wave is the chooser's
    # estimate and the kernel splits it (it decides on the device from the counts)
    out, want, rows = _run(layout, e, m, n, k, expected_m, dual, out_dtype, full=name.endswith("_tail"))
    assert spy.cfgs == [want_cfg], (name, spy.cfgs, want_cfg)
    assert len(spy.launches) == 1
    kw = spy.launches[0]
    assert (kw["STAGES"], kw["GROUP_M"], kw["NH"], kw["DUAL"]) == (
        want_cfg.stages, want_cfg.group_m, want_cfg.block_n // 128, dual), kw
    if name.endswith("_tail") and H.num_sms_of(torch.device("cuda")) == _SPLIT_SMS:
        assert want_cfg.tail_split > 1, want_cfg  # the row: the chooser splits the last wave
    if want_cfg.tail_split > 1:  # the launcher's K ranges for that split (no empty range)
        nsplit = H._split_plan_kb(-(-k // 128), want_cfg.tail_split)[0]
        assert nsplit > 1 and kw["SPLIT"] == nsplit and kw["TAIL"], kw
    else:
        assert kw["SPLIT"] == 1, kw
    if rows is not None:
        assert torch.isnan(out[~rows].float()).all()  # rows past a count are not written
        out, want = out[rows], want[rows]
    assert_gemm_close(out, want, "fp8_block", out_dtype, what=f"{name} {path}")


def test_compiled_call_launches_the_chosen_tail_split(monkeypatch):
    """torch.compile(fullgraph=True): the plan made at trace time crosses the op whole."""
    spy = _Spy(monkeypatch)
    case = ("contiguous", 4, 512, 7168, 7168, None, False)
    want_cfg = _chosen(*case, torch.bfloat16)
    out, want, _ = _run(*case, torch.bfloat16, compiled=True)
    assert spy.cfgs == [want_cfg] and spy.launches[0]["SPLIT"] == H._split_plan_kb(56, want_cfg.tail_split)[0]
    assert_gemm_close(out, want, "fp8_block", torch.bfloat16, what="compiled")


def test_bitwise_same_on_both_paths(monkeypatch):
    """Fast path and custom op: the same kernel with the same config, so the same bits (the tail
    split included: its reduction order is fixed)."""
    case = ("contiguous", 4, 512, 7168, 7168, None, False)
    eager, _, _ = _run(*case, torch.bfloat16)
    monkeypatch.setattr(gemm_mod, "EAGER_FAST_PATH", False)
    via_op, _, _ = _run(*case, torch.bfloat16)
    assert torch.equal(eager.view(torch.int16), via_op.view(torch.int16))
