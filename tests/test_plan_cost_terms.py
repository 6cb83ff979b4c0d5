"""The cost model's terms for rows and splits (plan/cost.py): output rows that are not 16-byte
aligned (the kernels' stores, the spread reduction's, dequantize + cuBLAS's padding), the split-K
partials' rate on a device scaled from another's file, and the grouped planner's dequantize +
cuBLAS at unaligned rows. CPU only: plans and predictions for an H100 / H200 as values."""

from __future__ import annotations

import json

import pytest

from blockscaled.config import GemmConfig, HopperConfig
from blockscaled.plan import H100_SXM, Problem, plan_gemm
from blockscaled.plan import calibration as cal_mod
from blockscaled.plan.cost import predict_us
from blockscaled.plan.dense import fp8_candidates


def test_unaligned_output_rows_cost_more():
    """Output rows that are not 16-byte aligned (N % 8 != 0 in bf16): the portable kernel's units pay
    the calibrated ``odd_n_us``; dequantize + cuBLAS pads such rows (and bf16 operand rows at K % 8
    != 0: ops/gemm.py) and pays one more pass over the output, not cuBLAS's unaligned kernels;
    aligned shapes (every model layer) are predicted exactly as without the terms. On the H200 sweep
    (plan-sweep-h200-20261128) 89 x 308 x 18752 planned the portable 64x64 split-K tile at 3.55x the
    best candidate (predicted 9.1 us, ran 46.5); it must not be chosen there now."""
    cal = cal_mod.load_calibration(H100_SXM.name, H100_SXM.sm_count, H100_SXM.mem_bw)
    assert "odd" not in cal["cublas_bf16"]
    portable = GemmConfig(strategy="triton", block_m=64, block_n=64, block_k=128, num_warps=4, num_stages=4,
                          split_k=4)
    assert cal.tile("portable:64x64")["odd_n_us"] > 0
    aligned = predict_us(portable, "fp8_block", 89, 312, 18752, H100_SXM, cal).us
    odd = predict_us(portable, "fp8_block", 89, 308, 18752, H100_SXM, cal).us
    assert odd > aligned * 1.05
    dq = GemmConfig(strategy="dequant_matmul")
    t_al = predict_us(dq, "fp8_block", 1387, 960, 2800, H100_SXM, cal).us
    launch = cal["launch_us"]["portable"]  # per padding launch
    t_k = predict_us(dq, "fp8_block", 1387, 960, 2801, H100_SXM, cal).us  # K % 8: both operands' zero columns
    assert t_k - t_al == pytest.approx(2 * launch, abs=0.5)
    # N % 8 != 0: the padded product copied into the output (read + write, at its measured rate)
    from blockscaled.plan.cost import PAD_COPY_SLOWDOWN

    t_n = predict_us(dq, "fp8_block", 1387, 961, 2800, H100_SXM, cal).us
    assert t_n - t_al - launch == pytest.approx(2 * 1387 * 961 * 2 * PAD_COPY_SLOWDOWN / H100_SXM.mem_bw * 1e6,
                                                rel=0.05)
    x_al = predict_us(dq, "mxfp4", 1387, 960, 2800, H100_SXM, cal, a_dense_bytes=2).us
    x_k = predict_us(dq, "mxfp4", 1387, 960, 2808 - 2, H100_SXM, cal, a_dense_bytes=2).us  # weight-only: A copied
    assert x_k > x_al + 0.8 * 2 * 1387 * 2806 * 2 / H100_SXM.mem_bw * 1e6
    # aligned: the same predictions with the terms removed from the constants
    plain = cal_mod.Calibration(json.loads(json.dumps(cal)))
    plain.source = "test"
    for t in plain["tiles"].values():
        t.pop("odd_n_us", None)
    for c in (portable, dq, HopperConfig("wide", 128, 256, 8, 3)):
        assert predict_us(c, "fp8_block", 1387, 960, 2800, H100_SXM, cal).us == \
            predict_us(c, "fp8_block", 1387, 960, 2800, H100_SXM, plain).us
    p = plan_gemm(Problem("gemm", "fp8_block", 89, 308, 18752), H100_SXM)
    c = p.config
    assert not (isinstance(c, GemmConfig) and c.strategy == "triton" and c.block_n == 64 and c.split_k > 1), p.describe()


def test_no_tail_split_at_unaligned_output_rows():
    """A tail split's spread reduction stores unaligned output rows 2 bytes at a time from a 4-per-thread
    layout (3125 x 3071 x 1472 planned 128x256 tail split 3: 56.8 us, unsplit 42.0, H200): not a
    candidate there; aligned rows keep it."""
    def tails(n):
        p = Problem("gemm", "fp8_block", 3125, n, 1472)
        return [c for c in fp8_candidates(p, H100_SXM) if isinstance(c, HopperConfig) and c.tail_split > 1]

    assert tails(3072)
    assert not tails(3071) and not tails(3070) and not tails(3080)  # 3080: 16-byte rows, N % 16 != 0
    p = plan_gemm(Problem("gemm", "fp8_block", 3125, 3071, 1472), H100_SXM)
    assert getattr(p.config, "tail_split", 1) == 1, p.describe()


def test_split_partials_priced_at_the_calibrating_devices_rate():
    """Split-K partials are written and read back within one launch (L2-resident): a device scaled
    from the H100 file (the H200: 1.4x the DRAM bandwidth) prices them at the H100's rate, so its
    splits do not look cheaper than they run. H200, M = 128 on 6144 x 4096 and 7680 x 5120: the
    unsplit 64x128 wide tile ran 1.16-1.25x faster than the 128x128 split 2 it used to plan
    (benchmarks/NOTES.md, twenty-third session); H100 predictions do not change."""
    from blockscaled.plan import DEVICES

    h200 = DEVICES["h200"]
    cal = cal_mod.load_calibration(h200.name, h200.sm_count, h200.mem_bw)
    h100 = cal_mod.load_calibration(H100_SXM.name, H100_SXM.sm_count, H100_SXM.mem_bw)
    assert cal["partial_bw"] == h100["mem_bw"] < cal["mem_bw"]
    for n, k in ((6144, 4096), (7680, 5120)):
        c = plan_gemm(Problem("gemm", "fp8_block", 128, n, k, tma=True), h200).config
        assert isinstance(c, HopperConfig) and (c.block_m, c.block_n, c.split_k) == (64, 128, 1), c
    split = HopperConfig("wide", 128, 128, 8, 5, split_k=2)
    plain = cal_mod.Calibration(json.loads(json.dumps(h100)))
    plain.source = "test"
    del plain["partial_bw"]
    assert predict_us(split, "fp8_block", 128, 8192, 8192, H100_SXM, h100).us == \
        predict_us(split, "fp8_block", 128, 8192, 8192, H100_SXM, plain).us
    scaled = cal_mod.Calibration(json.loads(json.dumps(cal)))  # the old rule: partials at the H200's DRAM rate
    scaled.source = "test"
    scaled["partial_bw"] = cal["mem_bw"]
    assert predict_us(split, "fp8_block", 128, 8192, 8192, h200, cal).us > \
        predict_us(split, "fp8_block", 128, 8192, 8192, h200, scaled).us


@pytest.mark.parametrize("fmt,a,rows", [("mxfp4", "bfloat16", 2048), ("mxfp8", "quantized", 8192),
                                        ("fp8_block", "bfloat16", 512)])
def test_grouped_masked_dequant_not_planned_at_unaligned_rows(fmt, a, rows):
    """torch.bmm behind the masked dequantize + cuBLAS path gets unaligned bf16 rows as they are
    (4.9x slower on the H200: plan/grouped_portable.py, batched_rows_unaligned): the planner takes
    it at N = 2880 and not at 2881 / K % 8 != 0 (a forced config still runs it: dequant_matmul_reason,
    which checks forced configs, is unchanged)."""
    from blockscaled.plan.grouped import plan_grouped
    from blockscaled.plan.grouped_portable import batched_rows_unaligned

    def plan(n, k=4096):
        p = Problem("grouped", fmt, 8 * rows, n, k, a, grouping="masked", experts=8, rows_per_expert=rows)
        return plan_grouped(p, H100_SXM, hopper_why="test: no wide kernel")

    assert plan(2880).kernel == "grouped_dequant_matmul"
    for n, k in ((2881, 4096), (2884, 4096), (2880, 4100)):
        assert plan(n, k).kernel != "grouped_dequant_matmul", (n, k)
        assert "4.9x" in batched_rows_unaligned("masked", n, k)
    assert batched_rows_unaligned("contiguous", 2881, 4096) is None  # refused there by dequant_matmul_reason


def test_dequant_plans_say_when_rows_are_padded():
    """A dequantize + cuBLAS plan at unaligned rows says that cuBLAS gets padded operands and the
    product is copied (fp8_block through the cost model, MX through the tiled planner); aligned
    plans do not."""
    cases = [(Problem("gemm", "mxfp4", 2048, 5759, 2880, "bfloat16"), "N = 5759"),
             (Problem("gemm", "fp8_block", 6000, 3001, 2050, tma=False), "K = 2050")]
    for p, words in cases:
        plan = plan_gemm(p, H100_SXM)
        assert isinstance(plan.config, GemmConfig) and plan.config.strategy == "dequant_matmul", plan
        text = " ".join(plan.reasons)
        assert "zero-padded operands" in text and words in text, text
    aligned = plan_gemm(Problem("gemm", "mxfp4", 2048, 5760, 2880, "bfloat16"), H100_SXM)
    assert aligned.config.strategy == "dequant_matmul"
    assert "zero-padded" not in " ".join(aligned.reasons)
