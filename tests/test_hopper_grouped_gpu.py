"""GPU (sm_90) tests of the Hopper grouped fp8_block path (the wide Gluon kernel in MODE 1/2):
forced and heuristic dispatch through ``grouped_gemm`` against the float64 reference, outputs
NaN-poisoned; empty / single-row / skewed experts, N and K tails, masked counts 0 / max_m,
rows past a count untouched, CUDA-graph capture with changed counts, fallback reasons."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import blockscaled as bs
from blockscaled.config.gemm import GemmConfig
from blockscaled.config.hopper import HopperConfig
from blockscaled.ops import _hopper as H
from blockscaled.ops.grouped import grouped_gemm, hopper_reason
from blockscaled.plan.grouped import grouped_hopper_config, tail_split_for
from blockscaled.ops.quantize import quantize
from blockscaled.reference import grouped as ref
from blockscaled.testing.tolerances import assert_gemm_close

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs an sm_90 (Hopper) GPU"),
]
HOPPER = GemmConfig(strategy="hopper")


def _inputs(rows_shape, e, n, k, seed=0, w_block=(128, 128)):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(*rows_shape, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(e, n, k, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
    return quantize(x, "fp8_block"), quantize(w, "fp8_block", block=w_block)


def _offsets(sizes):
    return torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32, device="cuda")


CONTIG = [([0, 1, 130, 127, 300, 0, 64, 1000], 384, 1040), ([128] * 8, 4096, 7168), ([77], 256, 256),
          ([(i * 37) % 150 for i in range(64)], 256, 512), ([0, 0, 5], 128, 128), ([3, 64, 65, 0], 200, 512)]


@pytest.mark.parametrize("case", CONTIG, ids=lambda c: f"E{len(c[0])}_N{c[1]}_K{c[2]}")
@pytest.mark.parametrize("forced", [True, False], ids=["forced", "heuristic"])
def test_contiguous(case, forced):
    sizes, n, k = case
    e = len(sizes)
    a, b = _inputs((sum(sizes),), e, n, k)
    offs = _offsets(sizes)
    assert hopper_reason(a, b, torch.bfloat16, 1) is None
    out = torch.full((sum(sizes), n), float("nan"), device="cuda", dtype=torch.bfloat16)
    grouped_gemm(a, b, offsets=offs, out=out, config=HOPPER if forced else None)
    assert_gemm_close(out, ref.grouped_gemm(a, b, offsets=offs), "fp8_block", torch.bfloat16, what=str(sizes))


@pytest.mark.parametrize("mode", [1, 2])
def test_output_rows_not_16_byte_aligned(mode):
    """N = 519 (bf16 rows of 1038 bytes): the masked store with one output per thread (EPI 0) in
    both grouped modes; rows past a masked count stay untouched."""
    cfg = HopperConfig("wide", 128, 256, 8, 4, epilogue="masked")
    n = 519
    if mode == 1:
        sizes = [0, 1, 130, 63, 300]
        a, b = _inputs((sum(sizes),), 5, n, 640, seed=4)
        seg = _offsets(sizes)
        out = torch.full((sum(sizes), n), float("nan"), device="cuda", dtype=torch.bfloat16)
        assert H._masked_epi(out) == 0
        assert H.grouped_fp8_block_hopper_impl(a.data, a.scale, b.data, b.scale, seg, 1, out, cfg)
        assert_gemm_close(out, ref.grouped_gemm(a, b, offsets=seg), "fp8_block", torch.bfloat16)
    else:
        counts = [0, 150, 1, 64, 65]
        a, b = _inputs((5, 150), 5, n, 640, seed=4)
        seg = torch.tensor(counts, dtype=torch.int32, device="cuda")
        out = torch.full((5, 150, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        assert H.grouped_fp8_block_hopper_impl(a.data, a.scale, b.data, b.scale, seg, 2, out, cfg)
        rows = torch.arange(150, device="cuda")[None, :] < seg[:, None]
        assert torch.isnan(out[~rows].float()).all()
        assert_gemm_close(out[rows], ref.grouped_gemm(a, b, masked_m=seg)[rows], "fp8_block", torch.bfloat16)


@pytest.mark.parametrize("cfg", [HopperConfig("wide", 64, 128, 4, 4, epilogue="masked"),
                                 HopperConfig("wide", 64, 256, 4, 5, epilogue="masked"),
                                 HopperConfig("wide", 128, 128, 8, 5, epilogue="masked"),
                                 HopperConfig("wide", 128, 256, 8, 4, epilogue="masked")],
                         ids=lambda c: f"{c.block_m}x{c.block_n}")
@pytest.mark.parametrize("mode", [1, 2])
def test_tile_configs(cfg, mode):
    if mode == 1:
        sizes = [0, 1, 130, 63, 300]
        a, b = _inputs((sum(sizes),), 5, 520, 1040, seed=2)
        seg = _offsets(sizes)
        out = torch.full((sum(sizes), 520), float("nan"), device="cuda", dtype=torch.bfloat16)
        assert H.grouped_fp8_block_hopper_impl(a.data, a.scale, b.data, b.scale, seg, 1, out, cfg)
        assert_gemm_close(out, ref.grouped_gemm(a, b, offsets=seg), "fp8_block", torch.bfloat16)
    else:
        counts = [0, 150, 1, 64, 65]
        a, b = _inputs((5, 150), 5, 520, 1040, seed=2)
        seg = torch.tensor(counts, dtype=torch.int32, device="cuda")
        out = torch.full((5, 150, 520), float("nan"), device="cuda", dtype=torch.bfloat16)
        assert H.grouped_fp8_block_hopper_impl(a.data, a.scale, b.data, b.scale, seg, 2, out, cfg)
        rows = torch.arange(150, device="cuda")[None, :] < seg[:, None]
        assert torch.isnan(out[~rows].float()).all()
        assert_gemm_close(out[rows], ref.grouped_gemm(a, b, masked_m=seg)[rows], "fp8_block", torch.bfloat16)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("forced", [True, False], ids=["forced", "heuristic"])
def test_masked(out_dtype, forced):
    counts = [0, 200, 1, 77, 128, 129]
    a, b = _inputs((6, 200), 6, 320, 1024, seed=1)
    cnt = torch.tensor(counts, dtype=torch.int32, device="cuda")
    out = torch.full((6, 200, 320), float("nan"), device="cuda", dtype=out_dtype)
    grouped_gemm(a, b, masked_m=cnt, out=out, out_dtype=out_dtype, config=HOPPER if forced else None)
    rows = torch.arange(200, device="cuda")[None, :] < cnt[:, None]
    assert torch.isnan(out[~rows].float()).all(), "rows past a count were written"
    y = ref.grouped_gemm(a, b, masked_m=cnt)
    assert_gemm_close(out[rows], y[rows], "fp8_block", out_dtype)


def test_masked_cuda_graph_changed_counts():
    e, max_m, n, k = 4, 192, 512, 1024
    a, b = _inputs((e, max_m), e, n, k, seed=7)
    cnt = torch.tensor([5, 0, 192, 70], dtype=torch.int32, device="cuda")
    out = torch.full((e, max_m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    grouped_gemm(a, b, masked_m=cnt, out=out)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grouped_gemm(a, b, masked_m=cnt, out=out)
    for counts in ([1, 2, 3, 4], [192, 191, 0, 128], [0, 0, 0, 0]):
        cnt.copy_(torch.tensor(counts, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        rows = torch.arange(max_m, device="cuda")[None, :] < cnt[:, None]
        assert torch.isnan(out[~rows].float()).all()
        if rows.any():
            y = ref.grouped_gemm(a, b, masked_m=cnt)
            assert_gemm_close(out[rows], y[rows], "fp8_block", torch.bfloat16, what=str(counts))


def test_deterministic_and_equal_to_forced():
    sizes = [100, 0, 257, 31]
    a, b = _inputs((sum(sizes),), 4, 1024, 2048, seed=9)
    offs = _offsets(sizes)
    o1 = grouped_gemm(a, b, offsets=offs)
    o2 = grouped_gemm(a, b, offsets=offs, config=HOPPER)
    assert torch.equal(o1, o2)
    assert torch.equal(o1, grouped_gemm(a, b, offsets=offs))


def test_fallbacks():
    # 1x128 weight blocks, K % 16 != 0, weight-only: portable kernel, with the reason
    a, b = _inputs((64,), 2, 256, 256, w_block=(1, 128))
    offs = _offsets([30, 34])
    assert "128x128" in hopper_reason(a, b, torch.bfloat16, 1)
    with pytest.raises(ValueError, match="hopper"):
        grouped_gemm(a, b, offsets=offs, config=HOPPER)
    out = grouped_gemm(a, b, offsets=offs)  # heuristic: portable kernel
    assert_gemm_close(out, ref.grouped_gemm(a, b, offsets=offs), "fp8_block", torch.bfloat16)
    a, b = _inputs((64,), 2, 256, 200)
    assert "16" in hopper_reason(a, b, torch.bfloat16, 1)
    out = grouped_gemm(a, b, offsets=offs)
    assert_gemm_close(out, ref.grouped_gemm(a, b, offsets=offs), "fp8_block", torch.bfloat16)


def test_masked_expected_m_hint_picks_64_row_tiles():
    counts = [64, 0, 33, 64]
    a, b = _inputs((4, 256), 4, 512, 1024, seed=4)
    cnt = torch.tensor(counts, dtype=torch.int32, device="cuda")
    out = torch.full((4, 256, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert grouped_hopper_config(64, 512, 1024).block_m == 64
    plan = bs.explain("grouped_gemm", a, b, masked_m=cnt, out=out, expected_m=64)
    assert plan.kernel == "hopper_wide" and plan.config.block_m == 64, plan
    grouped_gemm(a, b, masked_m=cnt, out=out, expected_m=64)
    rows = torch.arange(256, device="cuda")[None, :] < cnt[:, None]
    assert torch.isnan(out[~rows].float()).all()
    assert_gemm_close(out[rows], ref.grouped_gemm(a, b, masked_m=cnt)[rows], "fp8_block", torch.bfloat16)
    again = grouped_gemm(a, b, masked_m=cnt)  # max_m-based tiles: same values
    assert torch.equal(again[rows], out[rows])


def test_one_expert_contiguous_is_dense():
    a, b = _inputs((300,), 1, 2048, 7168, seed=6)
    offs = _offsets([300])
    out = grouped_gemm(a, b, offsets=offs)
    assert_gemm_close(out, ref.grouped_gemm(a, b, offsets=offs), "fp8_block", torch.bfloat16)


def _tail_run(mode, cfg, seed=11):
    """One grouped launch with ``cfg`` on a tile count that leaves a partial last wave after a
    full one on 132 SMs (contiguous: 3 + 0 + 5 + 2 row tiles x 16 column tiles = 160 -> 28 in the
    tail; masked: (3 + 0 + 3 + 3) x 18 = 162 -> 30), outputs NaN-poisoned. Returns (out, ref, rows
    written mask or None)."""
    if mode == 1:
        sizes, n = [300, 0, 517, 250], 2048
        a, b = _inputs((sum(sizes),), 4, n, 1024, seed=seed)
        seg = _offsets(sizes)
        out = torch.full((sum(sizes), n), float("nan"), device="cuda", dtype=torch.bfloat16)
        assert H.grouped_fp8_block_hopper_impl(a.data, a.scale, b.data, b.scale, seg, 1, out, cfg)
        return out, ref.grouped_gemm(a, b, offsets=seg), None
    counts, n = [300, 0, 260, 300], 2304
    a, b = _inputs((4, 300), 4, n, 1024, seed=seed)
    seg = torch.tensor(counts, dtype=torch.int32, device="cuda")
    out = torch.full((4, 300, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert H.grouped_fp8_block_hopper_impl(a.data, a.scale, b.data, b.scale, seg, 2, out, cfg)
    rows = torch.arange(300, device="cuda")[None, :] < seg[:, None]
    return out, ref.grouped_gemm(a, b, masked_m=seg), rows


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_properties(0).multi_processor_count != 132,
                    reason="tile counts chosen for a 132-SM H100")
@pytest.mark.parametrize("mode", [1, 2])
def test_grouped_tail_split(mode, monkeypatch):
    """The grouped tail split (HopperConfig.tail_split, decided on the device from the real tile
    count): both reductions against the float64 reference, bitwise equal to each other (same
    fixed order) and deterministic, and different from the unsplit kernel somewhere (the split
    ran: another fp32 summation order); a split that does not fit one wave (28 / 30 tail tiles x
    8 > 132 programs) runs unsplit: bitwise the unsplit result."""
    monkeypatch.delenv("BLOCKSCALED_SPLIT_REDUCE", raising=False)
    base = HopperConfig("wide", 128, 128, 8, 5, epilogue="masked")
    outs = {}
    for name, cfg in (("off", base), ("spread", dataclasses.replace(base, tail_split=4)),
                      ("spread again", dataclasses.replace(base, tail_split=4)),
                      ("last", dataclasses.replace(base, tail_split=4, split_reduce="last")),
                      ("too_many", dataclasses.replace(base, tail_split=8))):
        out, y, rows = _tail_run(mode, cfg)
        if rows is not None:
            assert torch.isnan(out[~rows].float()).all(), name
            out, y = out[rows], y[rows]
        assert_gemm_close(out, y, "fp8_block", torch.bfloat16, what=name)
        outs[name] = out
    assert torch.equal(outs["spread"], outs["last"]) and torch.equal(outs["spread"], outs["spread again"])
    assert not torch.equal(outs["spread"], outs["off"]), "the tail split did not run"
    assert torch.equal(outs["too_many"], outs["off"]), "a tail split that cannot fit one wave must not run"


def test_grouped_tail_split_cuda_graph():
    """A masked launch with a tail split captured once and replayed with counts that give a
    partial last wave (split) and with counts that do not: correct each time (the counters reset
    themselves, the plan follows the counts)."""
    e, max_m, n, k = 4, 300, 2304, 1024
    a, b = _inputs((e, max_m), e, n, k, seed=12)
    cnt = torch.tensor([300, 0, 260, 250], dtype=torch.int32, device="cuda")
    out = torch.full((e, max_m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    cfg = HopperConfig("wide", 128, 128, 8, 5, epilogue="masked", tail_split=4)
    assert H.grouped_fp8_block_hopper_impl(a.data, a.scale, b.data, b.scale, cnt, 2, out, cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        H.grouped_fp8_block_hopper_impl(a.data, a.scale, b.data, b.scale, cnt, 2, out, cfg)
    for counts in ([300, 0, 260, 250], [10, 300, 300, 300], [1, 2, 3, 4], [300, 0, 260, 250]):
        cnt.copy_(torch.tensor(counts, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        rows = torch.arange(max_m, device="cuda")[None, :] < cnt[:, None]
        assert torch.isnan(out[~rows].float()).all(), counts
        y = ref.grouped_gemm(a, b, masked_m=cnt)
        assert_gemm_close(out[rows], y[rows], "fp8_block", torch.bfloat16, what=str(counts))


def test_grouped_tail_split_rule():
    """plan.grouped.grouped_hopper_config asks for a tail split of 128x256 tiles from the tile count
    of equal segments (tail_split_for): moe E=4 m=512 N=7168 K=7168 -> 448 tiles = 3 waves + 52."""
    cfg = grouped_hopper_config(512, 7168, 7168, 132, 2, 4)
    assert (cfg.block_m, cfg.block_n, cfg.tail_split) == (128, 256, tail_split_for(448, 7168, 132)) and cfg.tail_split == 2
    assert grouped_hopper_config(128, 7168, 4096, 132, 2, 8).tail_split == 1  # 128x128: weight-streaming
    assert grouped_hopper_config(512, 4096, 7168, 132, 2, 8).tail_split == 1  # 3 waves + 116: no room
    assert grouped_hopper_config(512, 7168, 2048, 132, 2, 4).tail_split == 1  # K below TAIL_SPLIT_MIN_KB
