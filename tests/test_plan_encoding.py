"""The kernel choice crosses the grouped custom-op boundary whole (config/encoding.py): for every
config the choosers can return, decode(encode(c)) == c, and the encoding is injective. The
choosers run on the CPU with device properties as plain values (GPU SM counts, smem), so the
grid includes the H100 / H200 choices (tail splits included) without a GPU."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from blockscaled.config.encoding import CONFIG_TAGS, decode_config, encode_config
from blockscaled.config.gemm import DeviceInfo, GemmConfig, choose_gemm_config
from blockscaled.config.grouped import check_grouped_config
from blockscaled.config.grouped import choose_grouped_config as choose_portable
from blockscaled.config.hopper import EPILOGUES, SPLIT_REDUCE, VARIANTS, HopperConfig
from blockscaled.ops import _hopper as H

#: H100 SXM / H200 (132 SMs), H100 PCIe (114), a small part (78), the interpreter
DEVICES = (DeviceInfo("cuda", 132, (9, 0), 232448), DeviceInfo("cuda", 114, (9, 0), 232448),
           DeviceInfo("cuda", 78, (9, 0), 232448), DeviceInfo("cuda", 108, (8, 0), 166912),
           DeviceInfo("cpu", 4, (0, 0), 1 << 30))
ROWS = (1, 7, 16, 17, 32, 48, 64, 65, 100, 128, 129, 200, 256, 512, 1000, 2048, 4096, 16384)
NS = (16, 128, 512, 1536, 2048, 2112, 4096, 7168, 18432)
KS = (32, 128, 512, 1536, 2048, 4096, 7168, 16384)
SMS = (132, 114, 78, 16)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
EXPERTS = (1, 2, 4, 8, 32, 256)
FORMATS = ("fp8_block", "mxfp8", "mxfp4", "nvfp4")


def _roundtrip_all(configs) -> dict:
    """Round-trip every config; return {code: config} (asserting no two configs share a code)."""
    seen: dict[tuple, object] = {}
    for c in configs:
        code = encode_config(c)
        assert all(type(v) is int for v in code), code
        assert len(code) == 1 + len(dataclasses.fields(c)), (c, code)
        back = decode_config(code)
        assert type(back) is type(c) and back == c, (c, code, back)
        assert seen.setdefault(tuple(code), c) == c, f"two configs share the code {code}: {seen[tuple(code)]}, {c}"
    return seen


def test_hopper_grouped_chooser_roundtrip():
    """Every (rows per expert, N, K, SMs, out dtype, experts) choice of ops._hopper.choose_grouped_config,
    including its tail splits."""
    got = {c for m, n, k, sms, dt, e in itertools.product(ROWS, NS, KS, SMS, OUT_DTYPES, EXPERTS)
           for c in [H.choose_grouped_config(m, n, k, sms, dt.itemsize, e)]}
    seen = _roundtrip_all(got)
    splits = {c.tail_split for c in got}
    assert max(splits) > 1 and 1 in splits, splits
    assert {(c.block_m, c.block_n) for c in got} == {(64, 128), (128, 128), (128, 256)}
    assert len(seen) == len(got)
    # the row: E=4 m=512 N=7168 K=7168 on 132 SMs carries its split across
    c = H.choose_grouped_config(512, 7168, 7168, 132, 2, 4)
    assert c.tail_split == 2 and decode_config(encode_config(c)).tail_split == 2


def test_hopper_swiglu_chooser_roundtrip():
    got = {c for mode, m, n, sms, dt in itertools.product((0, 1, 2), ROWS, NS, SMS, OUT_DTYPES)
           for rpe in (m, max(1.0, m / 8))
           for c in [H.choose_swiglu_config(mode, m, rpe, n, sms, dt.itemsize)]}
    _roundtrip_all(got)
    assert {c.epilogue for c in got} == {"tma", "masked"} and {c.block_m for c in got} == {64, 128}


def test_hopper_dense_choosers_roundtrip():
    """The dense Hopper choosers (skinny, small-M split-K, wide with tail split): same encoding."""
    got = set()
    for m, n, k, sms, dt in itertools.product(ROWS, NS, KS, SMS, OUT_DTYPES):
        got.add(H.choose_dispatch_config(m, n, k, dt.itemsize, sms))
        for c in (H.skinny_dispatch_config(m, n, k, sms), H.small_m_dispatch_config(m, n, k, sms)):
            if c is not None:
                got.add(c)
    _roundtrip_all(got)
    assert {c.variant for c in got} >= {"wide", "skinny"}
    assert any(c.split_k > 1 for c in got) and any(c.tail_split > 1 for c in got)


def test_portable_grouped_chooser_roundtrip():
    """config.grouped.choose_grouped_config over formats, weight-only dtypes, groupings, dual,
    experts, output dtypes and devices (dequant_matmul included where the model picks it)."""
    got = set()
    grid = itertools.product(DEVICES, FORMATS, (None, torch.bfloat16, torch.float16),
                             ("dense", "contiguous", "masked"), (False, True), OUT_DTYPES)
    for info, fmt, a_dtype, grouping, dual, dt in grid:
        for m, n, k, e in itertools.product((1, 16, 64, 65, 128, 512, 4096), (128, 2048, 7168), (512, 7168),
                                            (1, 8, 64)):
            for allow in (True, False):
                got.add(choose_portable(fmt, m, n, k, info, dual=dual, a_dtype=a_dtype, grouping=grouping,
                                        experts=e, out_dtype=dt, allow_dequant=allow))
    _roundtrip_all(got)
    strategies = {c.strategy for c in got}
    assert strategies == {"triton", "dequant_matmul"}, strategies
    assert {c.promote for c in got if c.strategy == "triton"} == {True, False}  # resolved by the chooser


def test_forced_and_dense_configs_roundtrip():
    """Forced grouped configs after check_grouped_config (promote resolved), the dense chooser's
    configs (gemv, swap-AB, split-K), and GemmConfig's promote=None."""
    got = {GemmConfig(), GemmConfig(promote=None), GemmConfig(promote=False, swap_ab=True, group_m=1)}
    for fmt, bk in (("fp8_block", 128), ("mxfp8", 32), ("nvfp4", 128), ("mxfp4", 64)):
        for c in (GemmConfig(64, 32, bk, 4, 2), GemmConfig(16, 16, bk, 2, 1, promote=fmt != "nvfp4")):
            if fmt == "nvfp4" and c.promote is None:
                c = c.replace(promote=False)
            try:
                got.add(check_grouped_config(c, fmt))
            except ValueError:
                pass  # a combination the format cannot run: not a config any call launches
    for info in DEVICES:
        for m, n, k, fmt in itertools.product((1, 2, 4, 16, 33, 64, 128, 256, 4096), (128, 2112, 7168),
                                              (512, 2048, 7168), FORMATS):
            got.add(choose_gemm_config(fmt, m, n, k, info))
            got.add(choose_gemm_config(fmt, m, n, k, info, allow_hopper=False, allow_gemv=False))
            got.add(choose_gemm_config(fmt, m, n, k, info, a_dtype=torch.bfloat16))
    _roundtrip_all(got)
    assert {c.strategy for c in got} == {"triton", "gemv", "hopper", "dequant_matmul"}
    assert any(c.swap_ab for c in got) and any(c.split_k > 1 for c in got)


def test_every_field_travels():
    """Each field, changed alone from a base config, changes the code and comes back: no field is
    dropped (the bug this encoding replaced: tail_split was lost between the chooser and the kernel)."""
    base_h = HopperConfig("wide", 128, 256, 8, 4, epilogue="masked")
    variants_h = [dataclasses.replace(base_h, **kw) for kw in (
        {"block_m": 64, "num_warps": 4}, {"block_n": 128}, {"stages": 5}, {"group_m": 1},
        {"epilogue": "tma"}, {"epilogue": "tma1"}, {"split_wg": False}, {"split_k": 3}, {"tail_split": 7},
        {"split_reduce": "last"})]
    variants_h += [HopperConfig("skinny", 16, 128, 4, 6, split_k=4)]
    base_g = GemmConfig(64, 128, 32, 4, 3, 1, "triton", True, 8, False)
    variants_g = [dataclasses.replace(base_g, **kw) for kw in (
        {"block_m": 128}, {"block_n": 64}, {"block_k": 128}, {"num_warps": 8}, {"num_stages": 5}, {"split_k": 2},
        {"strategy": "dequant_matmul"}, {"strategy": "hopper"}, {"promote": False}, {"promote": None},
        {"group_m": 4}, {"swap_ab": True})]
    for base, variants in ((base_h, variants_h), (base_g, variants_g)):
        seen = _roundtrip_all([base, *variants])
        assert len(seen) == 1 + len(variants)
    changed = {f.name for v in variants_h for f in dataclasses.fields(v) if getattr(v, f.name) != getattr(base_h, f.name)}
    assert changed == {f.name for f in dataclasses.fields(HopperConfig)}
    changed = {f.name for v in variants_g for f in dataclasses.fields(v) if getattr(v, f.name) != getattr(base_g, f.name)}
    assert changed == {f.name for f in dataclasses.fields(GemmConfig)}
    assert set(EPILOGUES) <= {v.epilogue for v in variants_h} and set(SPLIT_REDUCE) <= {
        v.split_reduce for v in [base_h, *variants_h]}


def test_tags_and_bad_codes():
    assert set(CONFIG_TAGS) == {GemmConfig, HopperConfig}
    good = encode_config(HopperConfig("wide", 128, 256, 8, 4))
    with pytest.raises(ValueError, match="non-empty list"):
        decode_config([])
    with pytest.raises(ValueError, match=r"code\[0\].*tag"):
        decode_config([9, *good[1:]])
    with pytest.raises(ValueError, match="takes 12 ints"):
        decode_config(good[:-1])
    with pytest.raises(ValueError, match="variant index"):
        decode_config([good[0], len(VARIANTS), *good[2:]])
    bad = list(encode_config(GemmConfig()))
    bad[8] = 2  # promote: 0 / 1 / -1 only
    with pytest.raises(ValueError, match="promote must be 0 / 1 / -1"):
        decode_config(bad)
    with pytest.raises(ValueError, match="block_m"):  # the dataclass validates the decoded fields
        decode_config([1, 48, *encode_config(GemmConfig())[2:]])
    with pytest.raises(TypeError, match="GemmConfig or a HopperConfig"):
        encode_config({"block_m": 64})
    with pytest.raises(TypeError, match=r"GemmConfig.group_m: expected an int"):  # the dataclass checks types
        GemmConfig(group_m=8.0)
