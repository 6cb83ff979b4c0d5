"""GPU (sm_90) tests of the Hopper "skinny" decode kernel (swap-AB wgmma, TMA ring, fused
split-K; kernels/hopper/skinny.py): every activation-row padding (8..64), both weight
tile heights, ring depths and K splits forced against the float64 reference with M, N and K
tails (outputs NaN-poisoned); out dtypes; bitwise repeatability and CUDA-graph replays of the
split-K; the planner's skinny tiles through ``gemm()``; M above the tile rejected."""

from __future__ import annotations

import functools

import pytest
import torch

import blockscaled as bs
from blockscaled.ops._hopper import HopperConfig, HopperUnsupported, gemm_fp8_block_hopper
from blockscaled.ops.gemm import gemm
from blockscaled.ops.quantize import quantize
from blockscaled.plan import Problem, device_info
from blockscaled.plan.dense import _rank, fp8_candidates
from blockscaled.reference import gemm as ref_gemm
from blockscaled.testing import fp8_block_operands
from blockscaled.testing.tolerances import assert_gemm_close

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs an sm_90 (Hopper) GPU"),
]


_operands = functools.partial(fp8_block_operands, device="cuda")


def _cfg(bm, bn, stages, split):
    return HopperConfig("skinny", block_m=bm, block_n=bn, num_warps=4, stages=stages, split_k=split)


def _run(a, b, cfg, out_dtype=torch.bfloat16):
    out = torch.full((*a.shape[:-1], b.shape[0]), float("nan"), device="cuda", dtype=out_dtype)
    gemm_fp8_block_hopper(a, b, out_dtype, out, config=cfg)
    return out


@pytest.mark.parametrize("bm", [8, 16, 32, 64])
@pytest.mark.parametrize("bn", [64, 128])
@pytest.mark.parametrize("split", [1, 2, 3, 5])
@pytest.mark.parametrize("mnk", [(None, 520, 1040), (1, 200, 4096), (None, 7168, 2048)],
                         ids=lambda s: "x".join("M" if v is None else str(v) for v in s))
def test_forced_configs(bm, bn, split, mnk):
    m, n, k = mnk
    for mm in ([bm, max(1, bm // 2 - 3)] if m is None else [m]):  # full tile and a row tail
        a, b = _operands(mm, n, k, seed=mm + split)
        cfg = _cfg(bm, bn, 3 if split % 2 else 5, split)
        assert_gemm_close(_run(a, b, cfg), ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16, what=f"M={mm} {cfg}")


@pytest.mark.parametrize("stages", [2, 4, 9])
@pytest.mark.parametrize("k", [128, 144, 1040, 16384])  # 1 block, a 16-wide tail, 8 + tail, 128 blocks
def test_ring_depths_and_k_tails(stages, k):
    a, b = _operands(3, 333, k, seed=k)
    for split in (1, 4):
        cfg = _cfg(8, 64, stages, split)
        assert_gemm_close(_run(a, b, cfg), ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16, what=f"k={k} {cfg}")


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32])
def test_out_dtypes(out_dtype):
    a, b = _operands(13, 1000, 2048, seed=7)
    for split in (1, 3):
        y = _run(a, b, _cfg(16, 128, 4, split), out_dtype)
        assert y.dtype == out_dtype
        assert_gemm_close(y, ref_gemm.gemm(a, b), "fp8_block", out_dtype, what=f"split {split}")


def test_split_k_bitwise_repeatable_and_equal_across_ring_depths():
    a, b = _operands(16, 2112, 7168, seed=11)
    ys = [_run(a, b, _cfg(16, 64, st, 4)) for st in (3, 3, 5, 8)]
    for y in ys[1:]:
        assert torch.equal(y, ys[0])
    assert_gemm_close(ys[0], ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16)


def test_split_k_cuda_graph_replays_equal_eager():
    """The per-tile arrival counters reset themselves: replays (new inputs copied into the
    captured buffers) match eager launches bitwise."""
    x1, b = _operands(8, 2112, 7168, seed=1)
    x2, _ = _operands(8, 2112, 7168, seed=2)
    a, _ = _operands(8, 2112, 7168, seed=1)  # the captured input buffers
    cfg = _cfg(8, 64, 5, 6)
    out = torch.empty(8, 2112, device="cuda", dtype=torch.bfloat16)
    gemm_fp8_block_hopper(a, b, torch.bfloat16, out, config=cfg)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gemm_fp8_block_hopper(a, b, torch.bfloat16, out, config=cfg)
    for src in (x2, x1, x2, x2):
        a.data.copy_(src.data)
        a.scale.copy_(src.scale)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, _run(src, b, cfg))
    assert_gemm_close(out, ref_gemm.gemm(x2, b), "fp8_block", torch.bfloat16)


@pytest.mark.parametrize("mnk", [(2, 7168, 2048), (16, 7168, 2048), (32, 7168, 2048), (1, 32768, 512),
                                 (64, 32768, 512), (16, 24576, 1536), (5, 5000, 1040)],
                         ids=lambda s: "x".join(map(str, s)))
def test_planned_skinny_tiles_through_gemm(mnk):
    """The planner's best skinny candidate on decode shapes, forced through gemm(): correct and
    bitwise equal to the direct launch; gemm()'s own plan correct, and bitwise equal where it is
    that config."""
    m, n, k = mnk
    dev = device_info(torch.device("cuda"))
    p = Problem("gemm", "fp8_block", m, n, k)
    cands = [c for c in fp8_candidates(p, dev, gemv=False, portable=False, dequant=False) if c.variant == "skinny"]
    cfg = _rank(p, dev, cands)[0][0][1]
    a, b = _operands(m, n, k, seed=m)
    want = _run(a, b, cfg)
    assert_gemm_close(want, ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16, what=str(cfg))
    assert torch.equal(gemm(a, b, config=cfg), want)
    y = gemm(a, b)
    assert_gemm_close(y, ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16)
    if bs.explain("gemm", a, b).config == cfg:
        assert torch.equal(y, want)


def test_m_above_tile_rejected():
    a, b = _operands(17, 256, 512)
    with pytest.raises(HopperUnsupported, match="skinny.*M <= block_m = 16"):
        gemm_fp8_block_hopper(a, b, config=_cfg(16, 64, 4, 1))


def test_empty_dims():
    a, b = _operands(4, 256, 512)
    empty = quantize(torch.zeros(0, 512, device="cuda", dtype=torch.bfloat16), "fp8_block")
    assert gemm_fp8_block_hopper(empty, b, config=_cfg(8, 64, 4, 2)).shape == (0, 256)
