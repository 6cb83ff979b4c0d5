"""GPU (sm_90) tests of the Hopper fp8_block GEMM kernels: both variants forced, DeepSeek-V3 and
odd shapes against the float64 reference (outputs NaN-poisoned), out dtypes, 3-D activations,
fallback reasons (K % 16, unaligned base), wide tile configs bitwise equal to each other; the wide
kernel's fused split-K (small M): forced splits vs the reference, bitwise repeatability,
CUDA-graph replays equal to eager (self-resetting counters), back-to-back shapes on one stream."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import triton

from blockscaled.config import GemmConfig
from blockscaled.ops import _hopper as H
from blockscaled.ops._hopper import HopperConfig, HopperUnsupported, gemm_fp8_block_hopper, unsupported_reason
from blockscaled.ops.quantize import quantize
from blockscaled.plan import Problem, device_info, num_sms, plan_gemm
from blockscaled.plan.dense import _rank, fp8_candidates
from blockscaled.reference import gemm as ref_gemm
from blockscaled.tensor import ScaledTensor
from blockscaled.testing import fp8_block_operands
from blockscaled.testing.tolerances import assert_gemm_close

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs an sm_90 (Hopper) GPU"),
]

DSV3_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
ODD = [(1, 2112, 7168), (77, 7168, 2048), (128, 200, 7168), (77, 200, 320), (300, 384, 2048), (1, 16, 16),
       (129, 129, 144), (513, 1000, 4096), (40, 520, 1040)]
# (variant, shape): "wide" on every odd shape, "skinny" where it applies (M <= 64)
ODD_SPECS = [(v, s) for v in ("wide", "skinny") for s in ODD if v == "wide" or s[0] <= 64]


_operands = functools.partial(fp8_block_operands, device="cuda")
_OUT_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def _planned(m, n, k, variant, out_dtype=torch.bfloat16, where=lambda c: True, required=True):
    """The cost model's best Hopper candidate of ``variant`` (that satisfies ``where``) for this
    shape on this GPU: the tiles gemm() runs where that variant wins. None where there is no
    such candidate and ``required`` is False."""
    dev = device_info(torch.device("cuda"))
    p = Problem("gemm", "fp8_block", m, n, k, out_dtype=_OUT_NAMES[out_dtype])
    cands = [c for c in fp8_candidates(p, dev, gemv=False, portable=False, dequant=False)
             if c.variant == variant and where(c)]
    if not cands and not required:
        return None
    assert cands, f"no {variant} candidate for {m}x{n}x{k}"
    return _rank(p, dev, cands)[0][0][1]


def _check(a, b, cfg, out_dtype=torch.bfloat16):
    lead = tuple(a.shape[:-1])
    out = torch.full((*lead, b.shape[0]), float("nan"), device="cuda", dtype=out_dtype)
    gemm_fp8_block_hopper(a, b, out_dtype, out, config=cfg)
    ref = ref_gemm.gemm(a, b)
    assert_gemm_close(out, ref, "fp8_block", out_dtype, what=f"{cfg}")
    return out


@pytest.mark.parametrize("nk", DSV3_NK, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("m", [128, 4096])
def test_dsv3_shapes(nk, m):
    n, k = nk
    a, b = _operands(m, n, k)
    _check(a, b, _planned(m, n, k, "wide"))


@pytest.mark.parametrize("spec", ODD_SPECS, ids=lambda s: f"{s[0]}-{'x'.join(map(str, s[1]))}")
def test_odd_shapes(spec):
    variant, (m, n, k) = spec
    a, b = _operands(m, n, k, seed=3)
    _check(a, b, _planned(m, n, k, variant))


# wide kernel tiles: (block_m, block_n, num_warps, stages, epilogue)
WIDE_CFGS = [(128, 256, 8, 3, "tma"), (128, 256, 8, 4, "masked"), (128, 128, 8, 5, "tma"), (64, 256, 4, 4, "masked"),
             (64, 128, 4, 6, "tma"), (128, 256, 8, 2, "tma"), (128, 256, 8, 4, "tma1"), (64, 256, 4, 4, "tma1")]


@pytest.mark.parametrize("cfg", WIDE_CFGS, ids=lambda c: "m{}n{}w{}s{}{}".format(*c))
@pytest.mark.parametrize("mnk", [(333, 520, 128), (333, 520, 384), (333, 520, 1040), (256, 512, 2048), (1, 2112, 7168),
                                 (4096, 200, 1536)], ids=lambda s: "x".join(map(str, s)))
def test_wide_tile_configs(cfg, mnk):
    bm, bn, w, s, epi = cfg
    m, n, k = mnk
    a, b = _operands(m, n, k, seed=5)  # tails in M and N (the TMA store clips them)
    _check(a, b, HopperConfig("wide", bm, bn, w, s, group_m=4, epilogue=epi))


# (block_m, block_n, num_warps, stages, epilogue): the planner's tile widths, a forced masked store
ODD_N_CFGS = [(128, 256, 8, 3, "tma"), (128, 128, 8, 5, "tma"), (64, 128, 4, 6, "tma"), (128, 256, 8, 4, "masked")]


@pytest.mark.parametrize("cfg", ODD_N_CFGS, ids=lambda c: "m{}n{}w{}s{}{}".format(*c))
@pytest.mark.parametrize("mnk", [(333, 519, 1040), (700, 1002, 512), (129, 3071, 384)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_wide_output_rows_not_16_byte_aligned(cfg, mnk, out_dtype):
    """N % 8 != 0 (bf16) / N % 4 != 0 (fp32): the masked store with one output per thread (EPI 0),
    tails in M and N, every element written (NaN-poisoned output)."""
    bm, bn, w, s, epi = cfg
    m, n, k = mnk
    a, b = _operands(m, n, k, seed=7)
    assert H._masked_epi(torch.empty(m, n, device="cuda", dtype=out_dtype)) == 0
    hc = HopperConfig("wide", bm, bn, w, s, group_m=4, epilogue=epi)
    while hc.smem_bytes(out_dtype.itemsize) > 232448:  # fp32 output tiles: fewer ring stages fit
        hc = dataclasses.replace(hc, stages=hc.stages - 1)
    out = _check(a, b, hc, out_dtype)
    assert not torch.isnan(out.float()).any()


def test_wide_unaligned_output_uses_masked_store():
    # N=200 bf16: 400-byte rows are 16-byte multiples, but a column-offset view is not aligned
    a, b = _operands(300, 200, 1024)
    big = torch.full((300, 208), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = big[:, 1:201]  # base address 2 bytes past an aligned one: TMA store impossible
    gemm_fp8_block_hopper(a, b, torch.bfloat16, out, config=_planned(300, 200, 1024, "wide"))
    assert_gemm_close(out, ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16)
    assert torch.isnan(big[:, 0].float()).all() and torch.isnan(big[:, 201:].float()).all()


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.float32])
def test_out_dtypes(out_dtype):
    a, b = _operands(200, 384, 1024)
    _check(a, b, _planned(200, 384, 1024, "wide", out_dtype), out_dtype)
    a, b = _operands(40, 384, 1024)
    _check(a, b, _planned(40, 384, 1024, "skinny", out_dtype), out_dtype)


def test_3d_activations_and_empty():
    a, b = _operands(6 * 50, 256, 512)
    a3 = ScaledTensor(a.data.view(6, 50, 512), a.scale.view(6, 50, -1), a.format, torch.Size((6, 50, 512)),
                      a.block, a.rounding)
    out = gemm_fp8_block_hopper(a3, b)
    assert out.shape == (6, 50, 256)
    assert_gemm_close(out, ref_gemm.gemm(a3, b), "fp8_block", torch.bfloat16)
    a0, _ = _operands(0, 256, 512)
    assert gemm_fp8_block_hopper(a0, b).shape == (0, 256)


def test_variants_bitwise_equal_and_deterministic():
    """Same summation order in every wide tile config (per K block and 128-column half: one
    wgmma chain, then promotion) -> the same bits, whatever the tile height / width, math
    partitions or epilogue. Tail splits (the planner's candidates for this shape: on 132 SMs 136
    tiles of 128x128, the last 4 in 14 K ranges) sum those tiles in another order, so they are
    compared with tail_split=1 here and against the reference (and themselves, repeated) below."""
    m, n, k = 1000, 2112, 7168
    a, b = _operands(m, n, k)
    dev = device_info(torch.device("cuda"))
    planned = [c for c in fp8_candidates(Problem("gemm", "fp8_block", m, n, k), dev, gemv=False, portable=False,
                                         dequant=False) if c.variant == "wide"]
    cfgs = [HopperConfig("wide", 128, 256, 8, 3, epilogue="tma"),
            HopperConfig("wide", 128, 128, 8, 4, epilogue="masked", split_wg=False),
            HopperConfig("wide", 64, 128, 4, 6, epilogue="tma"),
            HopperConfig("wide", 128, 256, 8, 4, epilogue="tma1"), *planned]
    outs = [gemm_fp8_block_hopper(a, b, config=dataclasses.replace(c, tail_split=1)) for c in cfgs]
    again = gemm_fp8_block_hopper(a, b, config=cfgs[0])
    for o in outs[1:]:
        assert torch.equal(o, outs[0])
    assert torch.equal(again, outs[0])
    for c in planned:
        if c.tail_split > 1:  # (on 132 SMs there are)
            tail = [gemm_fp8_block_hopper(a, b, config=c) for _ in range(2)]
            assert torch.equal(tail[0], tail[1]), c
            assert_gemm_close(tail[0], ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16, what=str(c))


def test_fallback_reasons():
    a, b = _operands(64, 256, 200)  # K % 16 != 0: fp8 row stride not a 16-byte multiple
    r = unsupported_reason(a, b)
    assert r is not None and "16" in r
    with pytest.raises(HopperUnsupported, match="16-byte"):
        gemm_fp8_block_hopper(a, b)
    a, b = _operands(64, 256, 256)
    buf = torch.empty(64 * 256 + 1, dtype=torch.float8_e4m3fn, device="cuda")
    data = buf[1:].view(64, 256)  # base address off by one byte
    data.copy_(a.data)
    a_mis = ScaledTensor(data, a.scale, a.format, a.shape, a.block, a.rounding)
    with pytest.raises(NotImplementedError, match="aligned"):
        gemm_fp8_block_hopper(a_mis, b)
    a1 = quantize(torch.randn(64, 256, device="cuda"), "fp8_block")
    w1 = quantize(torch.randn(256, 256, device="cuda"), "fp8_block")  # 1x128 weight blocks
    with pytest.raises(HopperUnsupported, match="b.block"):
        gemm_fp8_block_hopper(a1, w1)


# ------------------------------------------------------------------ wide kernel, fused split-K
# forced configs (block_n, stages, epilogue, split_k, split_wg, block_m): both tile widths,
# both epilogues, odd split counts, the single 8-warp math partition, 64-row tiles
SPLITK_CFGS = [(256, 3, "tma", 3, True, 128), (128, 5, "tma", 2, True, 128), (256, 4, "masked", 4, True, 128),
               (128, 5, "masked", 7, True, 128), (256, 3, "tma", 3, False, 128), (256, 4, "tma", 3, False, 64),
               (128, 6, "tma", 6, False, 64),  # the 64-row wide tile the planner considers at M <= 1024
               (256, 4, "tma1", 3, True, 128)]  # one shared output tile per partition (the spread tests'
# "last" runs store through it; test_wide_split_k runs the default "spread", plain stores)
# K: 56 / 128 K blocks; 1040 = 9 blocks (K tail; split 3 -> 3, 3, 3); 640 = 5 blocks (split 2 -> 3, 2)
SPLITK_NK = [(2112, 7168), (7168, 16384), (520, 1040), (2112, 640), (520, 7168), (7168, 1040)]


def _splitk_cfg(c):
    bn, st, epi, sk, wg, bm = c
    return HopperConfig("wide", bm, bn, bm // 16, st, group_m=8, epilogue=epi, split_k=sk, split_wg=wg)


def _counters_zero(device):
    from blockscaled.ops._splitk import _splitk_counters

    torch.cuda.synchronize()
    assert int(_splitk_counters(device, 1).count_nonzero()) == 0  # the kernel left them all zero


@pytest.mark.parametrize("cfg", SPLITK_CFGS,
                         ids=lambda c: "m{5}n{0}s{1}{2}k{3}{4}".format(*c[:4], "" if c[4] else "-1part", c[5]))
@pytest.mark.parametrize("nk", SPLITK_NK, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("m", [1, 64, 128, 200, 256])
def test_wide_split_k(cfg, nk, m):
    n, k = nk
    a, b = _operands(m, n, k, seed=7)
    _check(a, b, _splitk_cfg(cfg))
    _counters_zero(b.data.device)


@pytest.mark.parametrize("mnk", [(128, 2112, 7168), (128, 7168, 16384), (1, 7168, 2048), (200, 520, 1040),
                                 (64, 2112, 640), (256, 4096, 7168)], ids=lambda s: "x".join(map(str, s)))
def test_wide_split_k_planned(mnk):
    """The planner's wide tiles at small M, bf16 and fp32 output: the best wide candidate and the
    best split-K one (none where K has too few blocks to split, e.g. K = 640)."""
    m, n, k = mnk
    a, b = _operands(m, n, k, seed=8)
    for out_dtype in (torch.bfloat16, torch.float32):
        split = _planned(m, n, k, "wide", out_dtype, where=lambda c: c.split_k > 1, required=k > 640)
        for cfg in {_planned(m, n, k, "wide", out_dtype), split} - {None}:
            _check(a, b, cfg, out_dtype)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_wide_split_k_out_dtypes(out_dtype):
    a, b = _operands(200, 2112, 1040, seed=9)
    for c in SPLITK_CFGS:
        # 3 stages: every config fits with the fp32 output tile (the launcher itself falls back
        # to the masked store where the TMA-store tile does not fit)
        _check(a, b, dataclasses.replace(_splitk_cfg(c), stages=3), out_dtype)


@pytest.mark.parametrize("mnk", [(128, 7168, 16384), (200, 520, 1040), (1, 2112, 7168)],
                         ids=lambda s: "x".join(map(str, s)))
def test_wide_split_k_bitwise_repeatable(mnk):
    """Fixed-order reduction: the same bits whichever split finishes last."""
    m, n, k = mnk
    a, b = _operands(m, n, k, seed=10)
    for c in SPLITK_CFGS[:3]:
        cfg = _splitk_cfg(c)
        outs = [gemm_fp8_block_hopper(a, b, config=cfg) for _ in range(3)]
        for o in outs[1:]:
            assert torch.equal(o, outs[0]), cfg
        assert_gemm_close(outs[0], ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16)
    _counters_zero(b.data.device)


def _graph_replays_match_eager(cases):
    """Capture ``gemm_fp8_block_hopper(a, b, out=o, config=cfg)`` for every (a, b, cfg, eager) of
    ``cases`` into one CUDA graph (after a warm-up on the capture stream), then replay it three
    times into NaN-poisoned outputs: each replay must be bitwise equal to the eager results."""
    outs = [torch.empty_like(e) for *_, e in cases]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for (a, b, cfg, _), o in zip(cases, outs):  # warm-up on the capture stream
            gemm_fp8_block_hopper(a, b, out=o, config=cfg)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for (a, b, cfg, _), o in zip(cases, outs):
            gemm_fp8_block_hopper(a, b, out=o, config=cfg)
    for _ in range(3):
        for o in outs:
            o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for (*_, eager), o in zip(cases, outs):
            assert torch.equal(o, eager)


def test_wide_split_k_cuda_graph():
    """Captured split-K GEMMs replay bitwise equal to eager: the counters reset themselves (a
    stale count would make no split, or two, the last) and the graph's workspace is reused."""
    shapes = [(128, 2112, 7168, SPLITK_CFGS[1]), (200, 7168, 1040, SPLITK_CFGS[0])]
    ops = []
    for m, n, k, c in shapes:
        a, b = _operands(m, n, k, seed=11)
        cfg = _splitk_cfg(c)
        ops.append((a, b, cfg, gemm_fp8_block_hopper(a, b, config=cfg)))  # eager (also compiles)
    _graph_replays_match_eager(ops)
    _counters_zero(ops[0][1].data.device)
    from blockscaled.ops._splitk import _GRAPH_COUNTERS

    assert int(_GRAPH_COUNTERS[ops[0][1].data.device].count_nonzero()) == 0  # the graph's buffer too


def test_wide_split_k_back_to_back_shapes():
    """Different shapes (tile counts, splits) launched back to back on one stream share the
    counter buffer: each launch must leave it zero for the next."""
    cases = []
    for m, n, k, c in [(128, 7168, 16384, SPLITK_CFGS[0]), (64, 2112, 640, SPLITK_CFGS[1]),
                       (256, 520, 1040, SPLITK_CFGS[3]), (1, 7168, 7168, SPLITK_CFGS[2])]:
        a, b = _operands(m, n, k, seed=12)
        cases.append((a, b, _splitk_cfg(c)))
    first = [gemm_fp8_block_hopper(a, b, config=cfg) for a, b, cfg in cases]  # no sync in between
    second = [gemm_fp8_block_hopper(a, b, config=cfg) for a, b, cfg in cases]
    for (a, b, _), o1, o2 in zip(cases, first, second):
        assert torch.equal(o1, o2)
        assert_gemm_close(o1, ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16)
    _counters_zero(cases[0][1].data.device)


def test_split_k_interleaved_with_portable_split_k():
    """The wide kernel's split-K (counters indexed tile * partitions + partition) and the portable
    kernel's split-K (counters indexed by tile) share the per-stream counter buffer: launched
    alternately on one stream, eagerly and in one captured graph, each leaves it zero for the
    other and every result stays exact and bitwise repeatable."""
    from blockscaled.config import GemmConfig
    from blockscaled.ops.gemm import gemm

    a, b = _operands(128, 7168, 16384, seed=13)
    a2, b2 = _operands(64, 2112, 7168, seed=14)
    wide = _splitk_cfg(SPLITK_CFGS[0])
    portable = GemmConfig(block_m=64, block_n=64, block_k=128, num_warps=4, num_stages=4, split_k=4, promote=True)

    def run():
        return [gemm_fp8_block_hopper(a, b, config=wide), gemm(a2, b2, config=portable),
                gemm_fp8_block_hopper(a, b, config=wide), gemm(a2, b2, config=portable)]

    eager = run()
    assert torch.equal(eager[0], eager[2]) and torch.equal(eager[1], eager[3])
    assert_gemm_close(eager[0], ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16)
    assert_gemm_close(eager[1], ref_gemm.gemm(a2, b2), "fp8_block", torch.bfloat16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(g):
        outs = run()
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(2):
        for o in outs:
            o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for o, e in zip(outs, eager):
            assert torch.equal(o, e)
    _counters_zero(b.data.device)


def test_planned_split_k_with_unaligned_output():
    """The planner's best split-K wide config at M=128 2112x7168 into an output view whose row
    stride is not 16-byte aligned: no TMA-store target, so the epilogues fall back to masked
    stores (the spread reduction's always are; the last-arriver reduction's, run second, switches
    from the TMA store) and write nothing past the view."""
    from blockscaled.ops import _hopper as H
    from blockscaled.ops.gemm import gemm

    m, n, k = 128, 2112, 7168
    cfg = _planned(m, n, k, "wide", where=lambda c: c.split_k > 1)
    assert cfg.epilogue == "tma"
    a, b = _operands(m, n, k, seed=15)
    assert_gemm_close(gemm(a, b, config=cfg), ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16)  # contiguous
    big = torch.full((m, n + 3), float("nan"), device="cuda", dtype=torch.bfloat16)
    out = big[:, :n]
    assert (out.stride(0) * 2) % 16
    H.gemm_fp8_block_hopper_impl(a.data, a.scale, b.data, b.scale, out, cfg)
    assert_gemm_close(out, ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16)
    assert torch.isnan(big[:, n:].float()).all(), "wrote past the output view"
    # the last-arriver reduction's epilogue (the spread one stores with plain masked stores)
    big.fill_(float("nan"))
    H.gemm_fp8_block_hopper_impl(a.data, a.scale, b.data, b.scale, out, dataclasses.replace(cfg, split_reduce="last"))
    assert_gemm_close(out, ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16)
    assert torch.isnan(big[:, n:].float()).all(), "wrote past the output view"
    _counters_zero(b.data.device)


def test_split_k_workspace_beyond_2_31_elements():
    """int64 workspace indexing: split 2 of 4 x 16385 tiles of 128 x 128 fp32 partials = 2.1e9
    elements (8.6 GB) > 2^31 (workspace [tiles, split, 128, 128]); the last 256 output columns
    (whose partials are the last tiles' slots, past element 2^31) are checked against the
    reference of those weight rows."""
    m, n, k = 512, 16385 * 128, 256
    free, _ = torch.cuda.mem_get_info()
    if free < 14 * 2**30:
        pytest.skip("needs ~14 GB of free GPU memory")
    g = torch.Generator(device="cuda").manual_seed(16)
    a = quantize(torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16), "fp8_block")
    w = torch.empty(n, k, device="cuda", dtype=torch.bfloat16).normal_(0, 0.05, generator=g)
    b = quantize(w, "fp8_block", block=(128, 128))
    del w
    assert 2 * m * n > 2**31
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm_fp8_block_hopper(a, b, torch.bfloat16, out, config=HopperConfig("wide", 128, 128, 8, 3, split_k=2))
    tail = ScaledTensor(b.data[-256:], b.scale[-2:], b.format, torch.Size((256, k)), b.block, b.rounding)
    assert_gemm_close(out[:, -256:], ref_gemm.gemm(a, tail), "fp8_block", torch.bfloat16)
    assert not torch.isnan(out[:, :: 4099].float()).any()
    _counters_zero(b.data.device)


# ------------------------------------------------------------------ wide kernel, tail split
# forced configs (block_n, stages, epilogue, tail_split, split_wg): the M=4096 N=2112 plan,
# the masked epilogue, 128x128 tiles with many splits, the single 8-warp math partition
TAIL_CFGS = [(256, 3, "tma", 5, True), (256, 4, "masked", 3, True), (128, 5, "tma", 14, True),
             (256, 3, "tma", 4, False), (256, 4, "tma1", 5, True)]
# tiles (128 x 256 / 128 x 128) on 132 SMs: 288 / 544 (2112: the last column 64 wide), 144 / 272,
# 297 / 561 (M tail), 252 / 504 (K tail: 9 K blocks), 136 / 272
TAIL_MNK = [(4096, 2112, 7168), (2048, 2112, 7168), (4100, 2112, 7168), (1100, 7168, 1040), (1024, 4352, 2048)]


def _spy_wide_launches(monkeypatch):
    """Record (grid, args, kwargs) of every wide-kernel launch: proves what the launcher ran
    (correct results alone would also come from a launcher that quietly ran no split)."""
    import blockscaled.ops._hopper as hop

    real = hop._kernel_for
    seen = []

    class _Spy:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            launch = self.kernel[grid]

            def run(*args, **kw):
                seen.append((grid, args, kw))
                return launch(*args, **kw)
            return run

    monkeypatch.setattr(hop, "_kernel_for", lambda v: _Spy(real(v)) if v == "wide" else real(v))
    return seen


#: position of ``split_from`` in fp8_block_gemm_wide_kernel's arguments
_SPLIT_FROM_ARG = 17


def _tail_cfg(c):
    bn, st, epi, ts, wg = c
    return HopperConfig("wide", 128, bn, 8, st, group_m=8, epilogue=epi, split_wg=wg, tail_split=ts)


@pytest.mark.parametrize("cfg", TAIL_CFGS, ids=lambda c: "n{0}s{1}{2}t{3}{4}".format(*c[:4], "" if c[4] else "-1part"))
@pytest.mark.parametrize("mnk", TAIL_MNK, ids=lambda s: "x".join(map(str, s)))
def test_wide_tail_split(cfg, mnk, monkeypatch):
    """Whole tiles for the full waves, split units for the last one: the launch really is a tail
    split (SPLIT, TAIL and split_from as planned), vs the float64 reference (NaN-poisoned output),
    bitwise equal on repeat, counters left zero."""
    from blockscaled.ops._hopper import _wide_split_plan

    m, n, k = mnk
    a, b = _operands(m, n, k, seed=17)
    c = _tail_cfg(cfg)
    nsm = num_sms(torch.device("cuda"))
    tiles = -(-m // 128) * -(-n // c.block_n)
    split_from, nsplit, _ = _wide_split_plan(tiles, -(-k // 128), c, nsm)
    seen = _spy_wide_launches(monkeypatch)
    out = _check(a, b, c)
    again = gemm_fp8_block_hopper(a, b, config=c)
    assert torch.equal(out, again)
    _counters_zero(b.data.device)
    (grid, args, kw), _ = seen
    assert (kw["SPLIT"], kw["TAIL"], args[_SPLIT_FROM_ARG]) == (nsplit, nsplit > 1, split_from), (c, seen[0][1:])
    if tiles % nsm and tiles > nsm:  # a partial wave after full ones: it is split (these shapes on an H100)
        assert nsplit > 1 and split_from == (tiles // nsm) * nsm and grid == (nsm,)


def test_wide_tail_split_planned(monkeypatch):
    """gemm_fp8_block_hopper's default config (the planner's best Hopper plan) at M=4096 N=2112
    K=7168 launches a tail split where this GPU's SM count leaves a short last wave."""
    from blockscaled.ops._hopper import _wide_split_plan

    dev = torch.device("cuda")
    nsm = num_sms(dev)
    cfg = plan_gemm(Problem("gemm", "fp8_block", 4096, 2112, 7168), device_info(dev),
                    GemmConfig(strategy="hopper")).config
    assert cfg.variant == "wide", cfg
    tiles = -(-4096 // cfg.block_m) * -(-2112 // cfg.block_n)
    split_from, nsplit, _ = _wide_split_plan(tiles, 56, cfg, nsm)
    if cfg.tail_split == 1:
        pytest.skip(f"{tiles} tiles on {nsm} SMs: no short last wave to split")
    a, b = _operands(4096, 2112, 7168, seed=20)
    seen = _spy_wide_launches(monkeypatch)
    _check(a, b, None)
    (_, args, kw), = seen
    assert kw["SPLIT"] == nsplit > 1 and kw["TAIL"] and args[_SPLIT_FROM_ARG] == split_from > 0


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_wide_tail_split_out_dtypes(out_dtype):
    a, b = _operands(1100, 7168, 1040, seed=18)
    for c in TAIL_CFGS:
        _check(a, b, dataclasses.replace(_tail_cfg(c), stages=3), out_dtype)
    _counters_zero(b.data.device)


def test_wide_tail_split_cuda_graph_and_unaligned_output():
    """Captured tail-split GEMMs replay bitwise equal to eager; an output view whose row stride
    TMA cannot store (masked epilogue) writes nothing outside the view."""
    m, n, k = 2048, 2112, 7168
    a, b = _operands(m, n, k, seed=19)
    cfg = _tail_cfg(TAIL_CFGS[0])
    eager = gemm_fp8_block_hopper(a, b, config=cfg)
    _graph_replays_match_eager([(a, b, cfg, eager)])
    big = torch.full((m, n + 3), float("nan"), device="cuda", dtype=torch.bfloat16)
    view = big[:, :n]
    gemm_fp8_block_hopper(a, b, torch.bfloat16, view, config=cfg)
    assert torch.equal(view, eager)
    assert torch.isnan(big[:, n:].float()).all(), "wrote past the output view"
    _counters_zero(b.data.device)


# ------------------------------------------------------------------ split_reduce "spread"
@pytest.fixture
def no_reduce_env(monkeypatch):
    """The spread tests must run "spread": no environment fallback to "last"."""
    monkeypatch.delenv("BLOCKSCALED_SPLIT_REDUCE", raising=False)
    monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", raising=False)


# (M, N, K): row / column / K tails, 1 row, many tiles; split-K and tail-split configs as above
SPREAD_MNK = [(1, 2112, 7168), (200, 520, 1040), (128, 7168, 16384), (256, 2112, 640)]


@pytest.mark.parametrize("cfg", SPLITK_CFGS,
                         ids=lambda c: "m{5}n{0}s{1}{2}k{3}{4}".format(*c[:4], "" if c[4] else "-1part", c[5]))
@pytest.mark.parametrize("mnk", SPREAD_MNK, ids=lambda s: "x".join(map(str, s)))
def test_wide_split_k_spread(cfg, mnk, monkeypatch, no_reduce_env):
    """The spread reduction (every unit waits, then sums 1/split of the tile) against the float64
    reference (NaN-poisoned output) and bitwise equal to the last-arriver reduction (same fixed
    order); the launch really is SPREAD; counters left zero."""
    m, n, k = mnk
    a, b = _operands(m, n, k, seed=21)
    spread = _splitk_cfg(cfg)  # the default reduction
    last = dataclasses.replace(spread, split_reduce="last")
    assert spread.split_reduce == "spread"
    seen = _spy_wide_launches(monkeypatch)
    out = _check(a, b, spread)
    assert torch.equal(out, gemm_fp8_block_hopper(a, b, config=last))
    _counters_zero(b.data.device)
    (_, _, kw), (_, _, kw_last) = seen
    assert kw["SPREAD"] == (kw["SPLIT"] > 1) and not kw_last["SPREAD"]
    # the units wait for each other: cooperative launch exactly when the reduction is spread
    assert kw["launch_cooperative_grid"] == kw["SPREAD"] and not kw_last["launch_cooperative_grid"]


def test_wide_split_spread_needs_a_program_per_split(monkeypatch, no_reduce_env):
    """More splits than programs: the spread reduction would wait for a unit of its own program,
    so the launcher refuses it (HopperUnsupported); "last" runs there."""
    import blockscaled.ops._hopper as H

    a, b = _operands(64, 256, 1024, seed=26)
    monkeypatch.setattr(H, "num_sms", lambda device: 2)
    cfg = H.HopperConfig("wide", 128, 128, 8, 4, split_k=4)
    with pytest.raises(H.HopperUnsupported, match="spread"):
        gemm_fp8_block_hopper(a, b, config=cfg)
    _check(a, b, dataclasses.replace(cfg, split_reduce="last"))
    _counters_zero(b.data.device)


def test_wide_split_spread_grid_too_large_raises(monkeypatch, no_reduce_env):
    """A spread grid that cannot be resident at once (here: 200 programs of ~200 KB of shared
    memory on 132 SMs, as where MPS or a green context withholds SMs) fails its cooperative launch
    with an error that names the way out, instead of hanging; the error is not sticky: the next
    GEMM runs and is right; the counters were never touched."""
    import blockscaled.ops._hopper as H

    a, b = _operands(128, 7168, 7168, seed=27)
    cfg = H.HopperConfig("wide", 128, 128, 8, 4, split_k=4)  # 56 tiles x 4 = 224 units
    real = H.num_sms
    monkeypatch.setattr(H, "num_sms", lambda device: 200)
    with pytest.raises(RuntimeError, match="BLOCKSCALED_SPLIT_REDUCE=last"):
        gemm_fp8_block_hopper(a, b, config=cfg)
    torch.cuda.synchronize()
    monkeypatch.setattr(H, "num_sms", real)
    _check(a, b, cfg)
    _counters_zero(b.data.device)


def test_wide_split_spread_env_fallback(monkeypatch, no_reduce_env):
    """BLOCKSCALED_SPLIT_REDUCE=last (or an MPS thread percentage < 100) runs the last-arriver
    reduction for a spread config: same bits."""
    a, b = _operands(128, 2112, 7168, seed=25)
    cfg = _splitk_cfg(SPLITK_CFGS[1])
    seen = _spy_wide_launches(monkeypatch)
    ref_out = _check(a, b, cfg)
    monkeypatch.setenv("BLOCKSCALED_SPLIT_REDUCE", "last")
    assert torch.equal(gemm_fp8_block_hopper(a, b, config=cfg), ref_out)
    monkeypatch.delenv("BLOCKSCALED_SPLIT_REDUCE")
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50")
    assert torch.equal(gemm_fp8_block_hopper(a, b, config=cfg), ref_out)
    assert [kw["SPREAD"] for _, _, kw in seen] == [True, False, False]
    assert [kw["launch_cooperative_grid"] for _, _, kw in seen] == [True, False, False]
    _counters_zero(b.data.device)


@pytest.mark.parametrize("cfg", TAIL_CFGS, ids=lambda c: "n{0}s{1}{2}t{3}{4}".format(*c[:4], "" if c[4] else "-1part"))
@pytest.mark.parametrize("mnk", TAIL_MNK[:4], ids=lambda s: "x".join(map(str, s)))
def test_wide_tail_split_spread(cfg, mnk, monkeypatch, no_reduce_env):
    """Tail split with the spread reduction: really a spread tail-split launch where the grid has
    a partial last wave, vs the float64 reference and bitwise equal to "last"."""
    m, n, k = mnk
    a, b = _operands(m, n, k, seed=22)
    last = dataclasses.replace(_tail_cfg(cfg), split_reduce="last")
    seen = _spy_wide_launches(monkeypatch)
    out = _check(a, b, dataclasses.replace(last, split_reduce="spread"))
    assert torch.equal(out, gemm_fp8_block_hopper(a, b, config=last))
    _counters_zero(b.data.device)
    (_, args, kw), (_, _, kw_last) = seen
    assert kw["SPREAD"] == (kw["SPLIT"] > 1) and not kw_last["SPREAD"]
    assert kw["launch_cooperative_grid"] == kw["SPREAD"] and not kw_last["launch_cooperative_grid"]
    if kw["SPLIT"] > 1:
        assert kw["TAIL"] and args[_SPLIT_FROM_ARG] > 0


# (M, N, K, config): unaligned output rows (N % 8 != 0; N % 8 == 0 with N % 16 != 0, where TMA could
# store but the compiler cannot vectorise the spread reduction's rows) under split-K and tail split
SPREAD_ODD = [(128, 3071, 1472, (256, 3, "tma", 3, True)), (3125, 3071, 1472, (256, 3, "tma", 3, True)),
              (128, 2104, 7168, (128, 5, "tma", 4, True)), (3125, 2104, 1472, (256, 4, "masked", 3, True)),
              (200, 519, 1040, (128, 5, "tma", 2, False))]


@pytest.mark.parametrize("case", SPREAD_ODD, ids=lambda c: "x".join(map(str, c[:3])) + f"t{c[3][3]}")
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_wide_split_spread_unaligned_rows(case, out_dtype, monkeypatch, no_reduce_env):
    """The spread reduction at output rows the compiler cannot vectorise: the launch takes EPI 0
    (one output per thread, also for the reduction: wide.py, spread_vec), vs the float64 reference
    (NaN-poisoned output), bitwise equal to the "last" reduction."""
    m, n, k, c = case
    bn, st, epi, splits, wg = c
    tiles = triton.cdiv(m, 128) * triton.cdiv(n, bn)
    cfg = (HopperConfig("wide", 128, bn, 8, st, group_m=8, epilogue=epi, split_wg=wg, split_k=splits)
           if tiles < 132 else _tail_cfg(c))
    while cfg.smem_bytes(out_dtype.itemsize) > 232448:
        cfg = dataclasses.replace(cfg, stages=cfg.stages - 1)
    a, b = _operands(m, n, k, seed=23)
    seen = _spy_wide_launches(monkeypatch)
    out = _check(a, b, cfg, out_dtype)
    assert not torch.isnan(out.float()).any()
    last = torch.full_like(out, float("nan"))
    gemm_fp8_block_hopper(a, b, out_dtype, last, config=dataclasses.replace(cfg, split_reduce="last"))
    assert torch.equal(out, last)
    _counters_zero(b.data.device)
    kw = seen[0][2]
    assert kw["SPREAD"] and kw["SPLIT"] > 1 and kw["EPI"] == 0, (kw["SPREAD"], kw["SPLIT"], kw["EPI"])


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_wide_split_spread_out_dtypes(out_dtype, no_reduce_env):
    a, b = _operands(200, 2112, 1040, seed=23)
    for c in SPLITK_CFGS[:4]:
        _check(a, b, dataclasses.replace(_splitk_cfg(c), stages=3, split_reduce="spread"), out_dtype)
    _counters_zero(b.data.device)


def test_wide_split_spread_cuda_graph_and_back_to_back(no_reduce_env):
    """Spread launches captured in a graph replay bitwise equal to eager, interleaved with
    last-arriver launches of other shapes on the same counter buffer; counters left zero."""
    cases = []
    for m, n, k, c, red in [(128, 2112, 7168, SPLITK_CFGS[1], "spread"), (200, 7168, 1040, SPLITK_CFGS[0], "last"),
                            (64, 2112, 640, SPLITK_CFGS[3], "spread"), (2048, 2112, 7168, None, "spread")]:
        a, b = _operands(m, n, k, seed=24)
        cfg = _tail_cfg(TAIL_CFGS[0]) if c is None else _splitk_cfg(c)
        cfg = dataclasses.replace(cfg, split_reduce=red)
        cases.append((a, b, cfg, gemm_fp8_block_hopper(a, b, config=cfg)))
    for a, b, cfg, eager in cases:
        assert_gemm_close(eager, ref_gemm.gemm(a, b), "fp8_block", torch.bfloat16)
    _graph_replays_match_eager(cases)
    _counters_zero(cases[0][1].data.device)
