"""Grouped (MoE) GEMMs: contiguous, masked and list-of-groups, every format against the float64
reference of the same quantized inputs (CPU: the Triton interpreter; also runs on a GPU).
Small shapes only; DeepSeek / GPU MODE shapes, CUDA graphs and torch.compile with inductor live
in test_grouped_gpu.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from blockscaled.config import GemmConfig
from blockscaled.plan.grouped_portable import check_grouped_config, choose_grouped_config
from blockscaled.ops.grouped import grouped_gemm
from blockscaled.ops.grouped_list import grouped_gemm_list
from blockscaled.reference import grouped as ref
from blockscaled.reference.quantize import quantize
from blockscaled.testing.compare import bitwise_equal
from blockscaled.testing.inputs import randn_like_activations
from blockscaled.testing.tolerances import assert_gemm_close

FORMATS = ("fp8_block", "mxfp8", "mxfp4", "nvfp4")
SKEWED = [0, 1, 37, 0, 130]  # empty, single-row, partial-tile, empty, multi-tile segments


def _offsets(sizes, device):
    offs = [0]
    for s in sizes:
        offs.append(offs[-1] + s)
    return torch.tensor(offs, dtype=torch.int32, device=device)


def _acts(shape, fmt, device, seed=0):
    return quantize(randn_like_activations(*shape, dtype=torch.bfloat16, device=device, seed=seed), fmt)


def _experts(e, n, k, fmt, device, seed=1, block=None):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(e, n, k, generator=g) * 0.05).to(device)
    if block is None and fmt == "fp8_block":
        block = (128, 128)
    return quantize(w, fmt, block=block)


def _experts_per_expert_gs(e, n, k, device, seed=1):
    """nvfp4 experts each quantized with its own global scale (as MoE checkpoints store them):
    a stacked ScaledTensor (carrying expert 0's scale) plus the fp32 [E] scales."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(e, n, k, generator=g) * torch.logspace(-2, 1, e).reshape(e, 1, 1)
    qs = [quantize(w[i].to(device), "nvfp4") for i in range(e)]
    data = torch.stack([q.data for q in qs])
    scale = torch.stack([q.scale for q in qs])
    gs = torch.stack([q.global_scale.reshape(()) for q in qs])
    b = replace(qs[0], data=data, scale=scale, shape=torch.Size((e, n, k)))
    return b, gs


def _nan(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def assert_masked_close(out, want, fmt, out_dtype, what=""):
    """Compare the computed rows (the reference has NaN past each count) and check that the
    rows past the counts were not written (``out`` was poisoned with NaN)."""
    want = want.cpu()
    computed = ~torch.isnan(want)
    o = out.detach().cpu()
    assert_gemm_close(torch.where(computed, o, torch.zeros((), dtype=o.dtype)), torch.where(computed, want, 0.0),
                      fmt, out_dtype, what=what)
    assert torch.isnan(o[~computed]).all(), f"{what}: rows past masked_m were written"


# --------------------------------------------------------------------------- contiguous
@pytest.mark.parametrize("fmt", FORMATS)
def test_contiguous_skewed(fmt, device):
    k, n = 161, 40  # K: partial last scale block (and odd for fp4)
    offs = _offsets(SKEWED, device)
    a = _acts((sum(SKEWED), k), fmt, device)
    b = _experts(len(SKEWED), n, k, fmt, device)
    out = _nan((sum(SKEWED), n), torch.float32, device)
    got = grouped_gemm(a, b, offsets=offs, out=out, out_dtype=torch.float32)
    assert got is out
    want = ref.grouped_gemm(a, b, offsets=offs)
    assert_gemm_close(out, want, fmt, torch.float32, what="contiguous")
    # determinism: a second run (functional op, fresh output) is bitwise identical
    again = grouped_gemm(a, b, offsets=offs, out_dtype=torch.float32)
    assert bitwise_equal(again, out)


@pytest.mark.parametrize("out_dtype", (torch.bfloat16, torch.float16), ids=str)
def test_contiguous_out_dtypes(out_dtype, device):
    fmt = "fp8_block"
    sizes = [5, 0, 20]
    offs = _offsets(sizes, device)
    a = _acts((25, 128), fmt, device)
    b = _experts(3, 48, 128, fmt, device)
    y = grouped_gemm(a, b, offsets=offs, out_dtype=out_dtype)
    assert y.dtype == out_dtype and y.shape == (25, 48)
    # bf16: the 3.6 interpreter casts fp32->bf16 by truncation (1 ulp, within the table)
    assert_gemm_close(y, ref.grouped_gemm(a, b, offsets=offs), fmt, out_dtype)


def test_contiguous_e1_and_empty(device):
    fmt = "mxfp8"
    a = _acts((19, 64), fmt, device)
    b = _experts(1, 24, 64, fmt, device)
    offs = _offsets([19], device)
    y = grouped_gemm(a, b, offsets=offs, out_dtype=torch.float32)
    assert_gemm_close(y, ref.grouped_gemm(a, b, offsets=offs), fmt, torch.float32, what="E=1")
    # all experts empty: no rows, no launch, empty result
    a0 = _acts((0, 64), fmt, device)
    b3 = _experts(3, 24, 64, fmt, device)
    y0 = grouped_gemm(a0, b3, offsets=_offsets([0, 0, 0], device))
    assert y0.shape == (0, 24)


def test_contiguous_fp8_block_1x128_weights(device):
    sizes = [3, 17]
    offs = _offsets(sizes, device)
    a = _acts((20, 200), "fp8_block", device)
    b = _experts(2, 40, 200, "fp8_block", device, block=(1, 128))
    y = grouped_gemm(a, b, offsets=offs, out_dtype=torch.float32)
    assert_gemm_close(y, ref.grouped_gemm(a, b, offsets=offs), "fp8_block", torch.float32)


def test_nvfp4_per_expert_global_scale(device):
    e, n, k = 3, 32, 64
    b, gs = _experts_per_expert_gs(e, n, k, device)
    offs = _offsets([4, 0, 9], device)
    a = _acts((13, k), "nvfp4", device)
    y = grouped_gemm(a, b, offsets=offs, b_global_scale=gs, out_dtype=torch.float32)
    want = ref.grouped_gemm(a, b, offsets=offs, b_global_scale=gs)
    assert_gemm_close(y, want, "nvfp4", torch.float32, what="per-expert gs")
    # and it matters: with b.global_scale (expert 0's) experts 1, 2 differ
    y_single = grouped_gemm(a, b, offsets=offs, out_dtype=torch.float32)
    assert not torch.allclose(y_single[4:], y[4:])
    # masked with per-expert scales
    a3 = _acts((e, 8, k), "nvfp4", device)
    cnt = torch.tensor([8, 0, 5], dtype=torch.int32, device=device)
    out = _nan((e, 8, n), torch.float32, device)
    grouped_gemm(a3, b, masked_m=cnt, b_global_scale=gs, out=out, out_dtype=torch.float32)
    want = ref.grouped_gemm(a3, b, masked_m=cnt, b_global_scale=gs)
    assert_masked_close(out, want, "nvfp4", torch.float32, what="masked per-expert gs")


# --------------------------------------------------------------------------- masked
@pytest.mark.parametrize("fmt", FORMATS)
def test_masked(fmt, device):
    e, max_m, n, k = 3, 20, 40, 96
    counts = torch.tensor([0, max_m, 7], dtype=torch.int32, device=device)
    a = _acts((e, max_m, k), fmt, device)
    b = _experts(e, n, k, fmt, device)
    out = _nan((e, max_m, n), torch.float32, device)
    grouped_gemm(a, b, masked_m=counts, out=out, out_dtype=torch.float32)
    want = ref.grouped_gemm(a, b, masked_m=counts)  # NaN past the counts
    # rows past a count are not written: the poison survives exactly there
    assert_masked_close(out, want, fmt, torch.float32)
    again = _nan((e, max_m, n), torch.float32, device)
    grouped_gemm(a, b, masked_m=counts, out=again, out_dtype=torch.float32)
    assert bitwise_equal(again, out)


def test_masked_functional_and_zero_experts(device):
    fmt = "nvfp4"
    a = _acts((2, 16, 32), fmt, device)
    b = _experts(2, 16, 32, fmt, device)
    counts = torch.tensor([16, 3], dtype=torch.int32, device=device)
    y = grouped_gemm(a, b, masked_m=counts, out_dtype=torch.float16)
    assert y.shape == (2, 16, 16) and y.dtype == torch.float16
    want = ref.grouped_gemm(a, b, masked_m=counts)
    assert_gemm_close(y[0], want[0], fmt, torch.float16)
    assert_gemm_close(y[1, :3], want[1, :3], fmt, torch.float16)
    # max_m = 0: nothing to compute
    a0 = _acts((2, 0, 32), fmt, device)
    assert grouped_gemm(a0, b, masked_m=torch.zeros(2, dtype=torch.int32, device=device)).shape == (2, 0, 16)


# --------------------------------------------------------------------------- forced configs
VARIANTS = {
    "fp8_block": [GemmConfig(16, 32, 64, 4, 1, promote=True), GemmConfig(32, 64, 32, 4, 2, promote=True)],
    "mxfp8": [GemmConfig(16, 32, 32, 4, 1, promote=True), GemmConfig(32, 32, 64, 4, 1, promote=False)],
    "mxfp4": [GemmConfig(16, 32, 32, 4, 1, promote=True), GemmConfig(16, 64, 128, 4, 1, promote=False)],
    "nvfp4": [GemmConfig(16, 32, 32, 4, 1, promote=False), GemmConfig(32, 32, 128, 4, 1, promote=False)],
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_forced_configs(fmt, device):
    sizes = [1, 0, 33]
    k, n = 130, 40
    offs = _offsets(sizes, device)
    a = _acts((34, k), fmt, device)
    b = _experts(3, n, k, fmt, device)
    want = ref.grouped_gemm(a, b, offsets=offs)
    for cfg in VARIANTS[fmt]:
        out = _nan((34, n), torch.float32, device)
        grouped_gemm(a, b, offsets=offs, out=out, out_dtype=torch.float32, config=cfg)
        assert_gemm_close(out, want, fmt, torch.float32, what=str(cfg))


def test_config_rules(device):
    cfg = choose_grouped_config("fp8_block", 40, 4096, 7168, torch.device("cpu"))
    assert cfg.promote and cfg.block_k == 128 and cfg.split_k == 1
    assert not choose_grouped_config("nvfp4", 128, 4096, 7168, torch.device("cpu")).promote
    with pytest.raises(ValueError, match="split_k"):
        check_grouped_config(GemmConfig(split_k=2), "fp8_block")
    with pytest.raises(ValueError, match="strategy"):
        check_grouped_config(GemmConfig(strategy="hopper"), "mxfp8")
    assert check_grouped_config(GemmConfig(strategy="dequant_matmul"), "mxfp8").strategy == "dequant_matmul"
    with pytest.raises(ValueError, match="strategy.*fp8_block x fp8_block"):
        check_grouped_config(GemmConfig(strategy="dequant_matmul"), "fp8_block")
    with pytest.raises(ValueError, match="strategy.*bf16 in / bf16 out"):
        check_grouped_config(GemmConfig(strategy="dequant_matmul"), "mxfp8", out_dtype=torch.float32)
    with pytest.raises(ValueError, match="promote"):
        check_grouped_config(GemmConfig(promote=False), "fp8_block")
    with pytest.raises(ValueError, match="block_k"):
        check_grouped_config(GemmConfig(block_k=64, promote=True), "mxfp8")
    with pytest.raises(ValueError, match="nvfp4"):
        check_grouped_config(GemmConfig(block_k=16, promote=True), "nvfp4")


# --------------------------------------------------------------------------- list of groups
@pytest.mark.parametrize("fmt", ("nvfp4", "fp8_block"))
def test_list_groups(fmt, device):
    # a scaled-down GPU MODE test case: own M, N, K per group, one launch
    mnk = [(40, 64, 256), (3, 48, 128), (0, 16, 64), (70, 16, 96)]
    a_list = [_acts((m, k), fmt, device, seed=i) for i, (m, n, k) in enumerate(mnk)]
    b_list = [_experts(1, n, k, fmt, device, seed=i + 10) for i, (m, n, k) in enumerate(mnk)]
    b_list = [replace(b, data=b.data[0], scale=b.scale[0], shape=b.shape[1:]) for b in b_list]
    outs = [_nan((m, n), torch.float16, device) for m, n, _ in mnk]
    got = grouped_gemm_list(a_list, b_list, torch.float16, out_list=outs)
    wants = ref.grouped_gemm_list(a_list, b_list)
    for i, (g, w) in enumerate(zip(got, wants)):
        assert g is outs[i]
        assert_gemm_close(g, w, fmt, torch.float16, what=f"group {i}")
    again = grouped_gemm_list(a_list, b_list, torch.float16)
    assert all(bitwise_equal(x, y) for x, y in zip(again, got))
    assert grouped_gemm_list([], []) == []


# --------------------------------------------------------------------------- torch.compile / custom op
def test_torch_compile_fullgraph_aot_eager(device):
    """The ops trace into one graph (custom ops, no graph breaks, no data-dependent Python):
    contiguous (functional and out=), masked, and the fused SwiGLU."""
    from blockscaled.ops.swiglu import swiglu

    fmt = "mxfp4"
    a = _acts((9, 64), fmt, device)
    a3 = _acts((2, 8, 64), fmt, device, seed=3)
    b = _experts(2, 16, 64, fmt, device)
    bu = _experts(2, 16, 64, fmt, device, seed=4)
    offs = _offsets([4, 5], device)
    counts = torch.tensor([8, 3], dtype=torch.int32, device=device)

    def f(a_data, a3_data, offs, counts, out):
        aa = replace(a, data=a_data)
        y = grouped_gemm(aa, b, offsets=offs, out_dtype=torch.float32)
        grouped_gemm(aa, b, offsets=offs, out=out, out_dtype=torch.float32)
        z = grouped_gemm(replace(a3, data=a3_data), b, masked_m=counts, out_dtype=torch.float32)
        s = swiglu(aa, b, bu, offsets=offs, out_dtype=torch.float32)
        return y * 2, z, s

    out_c = _nan((9, 16), torch.float32, device)
    out_e = out_c.clone()
    y_c, z_c, s_c = torch.compile(f, fullgraph=True, backend="aot_eager")(a.data, a3.data, offs, counts, out_c)
    y_e, z_e, s_e = f(a.data, a3.data, offs, counts, out_e)
    assert bitwise_equal(y_c, y_e) and bitwise_equal(out_c, out_e) and bitwise_equal(s_c, s_e)
    assert bitwise_equal(z_c[0], z_e[0]) and bitwise_equal(z_c[1, :3], z_e[1, :3])


def test_opcheck(device):
    from torch.library import opcheck

    fmt = "mxfp4"  # uint8 data and scales (opcheck cannot multiply fp8 tensors on CPU)
    a = _acts((5, 64), fmt, device)
    b = _experts(2, 16, 64, fmt, device)
    offs = _offsets([2, 3], device)
    from blockscaled.plan import Plan
    from blockscaled.plan.encoding import encode_plan

    backend = "cuda" if device == "cuda" else "interpreter"
    # fmt_id, grouping (contiguous), K, weight block rows, the plan (op, backend, every config field)
    tail = (2, 1, 64, 1, encode_plan(Plan("grouped", backend, GemmConfig(16, 16, 32, 4, 1, promote=True))))
    args = (a.data, a.scale, None, b.data, b.scale, None, None, None, None, offs)
    opcheck(torch.ops.blockscaled.grouped_gemm.default, (*args, torch.float32, *tail),
            test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    out = torch.zeros(5, 16, device=device)
    opcheck(torch.ops.blockscaled.grouped_gemm_out.default, (*args, out, *tail),
            test_utils=("test_schema", "test_faketensor"))
    # the dequant_matmul strategy behind the same ops (bf16: its contiguous dtype)
    dq = (*tail[:-1], encode_plan(Plan("grouped", backend, GemmConfig(strategy="dequant_matmul"))))
    opcheck(torch.ops.blockscaled.grouped_gemm.default, (*args, torch.bfloat16, *dq),
            test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    opcheck(torch.ops.blockscaled.grouped_gemm_out.default,
            (*args, torch.zeros(5, 16, dtype=torch.bfloat16, device=device), *dq),
            test_utils=("test_schema", "test_faketensor"))


# --------------------------------------------------------------------------- errors
def test_errors(device):
    """Bad input raises naming the argument. Value checks of offsets / counts need validate=True
    on CUDA (a host sync); it is the default on CPU."""
    fmt = "mxfp8"
    a = _acts((6, 64), fmt, device)
    b = _experts(2, 16, 64, fmt, device)
    offs = _offsets([2, 4], device)
    with pytest.raises(ValueError, match="exactly one"):
        grouped_gemm(a, b)
    with pytest.raises(ValueError, match="exactly one"):
        grouped_gemm(a, b, offsets=offs, masked_m=offs)
    with pytest.raises(ValueError, match="format mismatch"):
        grouped_gemm(a, _experts(2, 16, 64, "mxfp4", device), offsets=offs)
    with pytest.raises(ValueError, match="K mismatch"):
        grouped_gemm(a, _experts(2, 16, 96, fmt, device), offsets=offs)
    with pytest.raises(TypeError, match="offsets.*int32.*int64"):
        grouped_gemm(a, b, offsets=offs.long())
    with pytest.raises(ValueError, match=r"offsets.*\(3,\).*\(4,\)"):
        grouped_gemm(a, b, offsets=_offsets([2, 4, 0], device))
    with pytest.raises(ValueError, match="offsets.*dimensions"):
        grouped_gemm(a, b, offsets=offs.reshape(1, 3))
    with pytest.raises(ValueError, match="non-decreasing"):
        grouped_gemm(a, b, offsets=torch.tensor([0, 5, 2], dtype=torch.int32, device=device), validate=True)
    with pytest.raises(ValueError, match="must equal the number of rows"):
        grouped_gemm(a, b, offsets=torch.tensor([0, 2, 5], dtype=torch.int32, device=device), validate=True)
    with pytest.raises(ValueError, match=r"offsets\[0\]"):
        grouped_gemm(a, b, offsets=torch.tensor([1, 2, 6], dtype=torch.int32, device=device), validate=True)
    with pytest.raises(TypeError, match="ScaledTensor"):
        grouped_gemm(a.data, b, offsets=offs)
    with pytest.raises(ValueError, match="3-D"):
        grouped_gemm(a, quantize(torch.randn(16, 64), fmt), offsets=offs)
    with pytest.raises(TypeError, match="out_dtype"):
        grouped_gemm(a, b, offsets=offs, out_dtype=torch.int32)
    with pytest.raises(ValueError, match="out: expected shape"):
        grouped_gemm(a, b, offsets=offs, out=torch.empty(6, 17, dtype=torch.bfloat16, device=device))
    with pytest.raises(TypeError, match="out"):
        grouped_gemm(a, b, offsets=offs, out=torch.empty(6, 16, dtype=torch.float16, device=device))
    with pytest.raises(ValueError, match="b_global_scale.*no global scale"):
        grouped_gemm(a, b, offsets=offs, b_global_scale=torch.ones(2, device=device))
    # masked
    a3 = _acts((2, 8, 64), fmt, device)
    cnt = torch.tensor([3, 8], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="E mismatch"):
        grouped_gemm(_acts((3, 8, 64), fmt, device), b, masked_m=torch.zeros(3, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match=r"masked_m.*\(2,\)"):
        grouped_gemm(a3, b, masked_m=torch.zeros(3, dtype=torch.int32, device=device))
    with pytest.raises(TypeError, match="masked_m.*int32"):
        grouped_gemm(a3, b, masked_m=cnt.float())
    with pytest.raises(ValueError, match=r"masked_m\[1\]=9"):
        grouped_gemm(a3, b, masked_m=torch.tensor([3, 9], dtype=torch.int32, device=device), validate=True)
    with pytest.raises(ValueError, match=r"masked_m\[0\]=-1"):
        grouped_gemm(a3, b, masked_m=torch.tensor([-1, 2], dtype=torch.int32, device=device), validate=True)
    with pytest.raises(ValueError, match="3-D"):
        grouped_gemm(a, b, masked_m=cnt)
    # nvfp4 per-expert scale shape
    an = _acts((6, 64), "nvfp4", device)
    bn = _experts(2, 16, 64, "nvfp4", device)
    with pytest.raises(ValueError, match="b_global_scale.*one per expert"):
        grouped_gemm(an, bn, offsets=offs, b_global_scale=torch.ones(3, device=device))
    with pytest.raises(TypeError, match="b_global_scale.*float32"):
        grouped_gemm(an, bn, offsets=offs, b_global_scale=torch.ones(2, dtype=torch.float64, device=device))
    # list
    with pytest.raises(ValueError, match=r"b_list: expected 2 groups"):
        grouped_gemm_list([a, a], [b])
    with pytest.raises(ValueError, match=r"a_list\[1\].*format"):
        grouped_gemm_list([an, a], [quantize(torch.randn(8, 64, device=device), "nvfp4"),
                                    quantize(torch.randn(8, 64, device=device), fmt)])
    with pytest.raises(ValueError, match=r"b_list\[0\].*K mismatch"):
        grouped_gemm_list([a], [quantize(torch.randn(8, 32, device=device), fmt)])


def test_validate_off_does_not_read_values(device, monkeypatch):
    """validate=False never inspects the values on the host (no sync); the kernel clamps counts
    above max_m (memory-safe). The device-side check, which would then write NaN over the
    output and set the error flag, is switched off here to see the clamped result;
    tests/test_metadata_checks.py tests the check."""
    monkeypatch.setattr("blockscaled.ops.grouped._device_check", lambda *args, **kwargs: None)
    fmt = "mxfp8"
    a3 = _acts((2, 8, 64), fmt, device)
    b = _experts(2, 16, 64, fmt, device)
    out = _nan((2, 8, 16), torch.float32, device)
    grouped_gemm(a3, b, masked_m=torch.tensor([100, 2], dtype=torch.int32, device=device), out=out,
                 out_dtype=torch.float32, validate=False)
    want = ref.grouped_gemm(a3, b, masked_m=torch.tensor([8, 2], dtype=torch.int32))
    assert_gemm_close(out[0], want[0], fmt, torch.float32)
    assert torch.isnan(out[1, 2:]).all()


def test_device_mismatch():
    if not torch.cuda.is_available():
        # the check is on devices alone; emulate with the meta device for offsets
        a = _acts((6, 64), "mxfp8", "cpu")
        b = _experts(2, 16, 64, "mxfp8", "cpu")
        with pytest.raises(ValueError, match="offsets: expected a tensor on cpu"):
            grouped_gemm(a, b, offsets=torch.zeros(3, dtype=torch.int32, device="meta"))
        return
    a = _acts((6, 64), "mxfp8", "cuda")
    b = _experts(2, 16, 64, "mxfp8", "cpu")
    with pytest.raises(ValueError, match="b: on cpu"):
        grouped_gemm(a, b, offsets=torch.tensor([0, 2, 6], dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="offsets: expected a tensor on cuda"):
        grouped_gemm(a, b.cuda(), offsets=torch.tensor([0, 2, 6], dtype=torch.int32))


def test_launch_metadata_and_repr():
    """The profiler hooks name the kernel with mode, format and tile and count flops / bytes."""
    from blockscaled.kernels.triton.grouped import _grouped_launch_metadata, _grouped_repr, _list_launch_metadata

    c = torch.empty(2, 2, dtype=torch.bfloat16)
    args = dict(FMT=0, MODE=1, DUAL=True, M=1024, N=4096, K=7168, E=8, c_ptr=c, B_BR=128,
                BLOCK_M=128, BLOCK_N=64, BLOCK_K=128)
    md = _grouped_launch_metadata(None, None, args)
    assert md["name"].startswith("bs_swiglu_contig_fp8_block_128x64x128 [M=1024,N=4096,K=7168,E=8]")
    assert md["flops"] == 2 * 2 * 1024 * 4096 * 7168
    # A (e4m3 + fp32 per 1x128) + 2 B (e4m3 + fp32 per 128x128) + bf16 output
    want = 1024 * 7168 * (1 + 4 / 128) + 2 * 8 * 4096 * 7168 * (1 + 4 / 128 / 128) + 2 * 1024 * 4096
    assert abs(md["bytes"] - want) <= 1
    spec = type("S", (), {"constants": dict(FMT=3, MODE=2, DUAL=False, BLOCK_M=64, BLOCK_N=128, BLOCK_K=128)})()
    assert _grouped_repr(spec) == "bs_grouped_masked_nvfp4_64x128x128"
    lm = _list_launch_metadata(None, None, dict(FMT=3, G=4, FLOPS=10, BYTES=20, BLOCK_M=128, BLOCK_N=128, BLOCK_K=128))
    assert lm == {"name": "bs_grouped_list_nvfp4_128x128x128 [G=4]", "flops": 10, "bytes": 20}


def test_unvalidated_bad_offsets_are_memory_safe(device, monkeypatch):
    """validate=False with offsets past the rows: clamped to [0, sum_m] in the kernel (no
    out-of-bounds access); here that equals the valid offsets [0, 4, 6]. The device-side
    check (NaN output + error flag, tests/test_metadata_checks.py) is off to see the clamp."""
    monkeypatch.setattr("blockscaled.ops.grouped._device_check", lambda *args, **kwargs: None)
    fmt = "mxfp8"
    a = _acts((6, 64), fmt, device)
    b = _experts(2, 16, 64, fmt, device)
    bad = torch.tensor([0, 4, 99], dtype=torch.int32, device=device)
    y = grouped_gemm(a, b, offsets=bad, out_dtype=torch.float32, validate=False)
    want = ref.grouped_gemm(a, b, offsets=_offsets([4, 2], device))
    assert_gemm_close(y, want, fmt, torch.float32)


@pytest.mark.parametrize("a_dtype", (torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("fmt", ("fp8_block", "mxfp4", "nvfp4"))
def test_weight_only(fmt, a_dtype, device):
    """bf16 / fp16 activations x quantized experts (W8A16 / W4A16 MoE, e.g. gpt-oss MXFP4)."""
    sizes = [3, 0, 20]
    k, n = 96, 40
    offs = _offsets(sizes, device)
    x = randn_like_activations(23, k, dtype=a_dtype, device=device, outliers=False)
    b = _experts(3, n, k, fmt, device)
    out = _nan((23, n), torch.float32, device)
    grouped_gemm(x, b, offsets=offs, out=out, out_dtype=torch.float32)
    assert_gemm_close(out, ref.grouped_gemm(x, b, offsets=offs), fmt, torch.float32, what="weight-only")
    x3 = randn_like_activations(3, 8, k, dtype=a_dtype, device=device, outliers=False)
    cnt = torch.tensor([8, 0, 2], dtype=torch.int32, device=device)
    out3 = _nan((3, 8, n), torch.float32, device)
    grouped_gemm(x3, b, masked_m=cnt, out=out3, out_dtype=torch.float32)
    assert_masked_close(out3, ref.grouped_gemm(x3, b, masked_m=cnt), fmt, torch.float32, what="weight-only masked")


# --------------------------------------------------------------------------- dequant_matmul strategy
DQ = GemmConfig(strategy="dequant_matmul")
DQ_FORMATS = ("mxfp8", "mxfp4", "nvfp4")


@pytest.mark.parametrize("fmt", DQ_FORMATS)
def test_dequant_matmul_contiguous(fmt, device):
    """Forced dequantize + cuBLAS grouped GEMM (CPU: per-expert fp32 matmuls): skewed segments
    with empty experts, poisoned out=, functional call; bf16 (its only output dtype)."""
    k, n = 96, 40  # K, N multiples of 8: torch._grouped_mm's 16-byte stride rule on CUDA
    offs = _offsets(SKEWED, device)
    a = _acts((sum(SKEWED), k), fmt, device)
    b = _experts(len(SKEWED), n, k, fmt, device)
    want = ref.grouped_gemm(a, b, offsets=offs)
    out = _nan((sum(SKEWED), n), torch.bfloat16, device)
    assert grouped_gemm(a, b, offsets=offs, out=out, config=DQ) is out
    assert_gemm_close(out, want, fmt, torch.bfloat16, what="dequant_matmul contiguous out=")
    y = grouped_gemm(a, b, offsets=offs, config=DQ)
    assert bitwise_equal(y, out)


@pytest.mark.parametrize("out_dtype", (torch.bfloat16, torch.float16, torch.float32), ids=str)
@pytest.mark.parametrize("fmt", DQ_FORMATS)
def test_dequant_matmul_masked(fmt, out_dtype, device):
    """Forced dequantize + bmm: counts 0 and max_m, rows past the counts keep the poison with
    out=, every output dtype (bf16: bmm in bf16; others: fp32 products + the epilogue)."""
    e, max_m, n, k = 3, 20, 40, 96
    counts = torch.tensor([0, max_m, 7], dtype=torch.int32, device=device)
    a = _acts((e, max_m, k), fmt, device)
    b = _experts(e, n, k, fmt, device)
    want = ref.grouped_gemm(a, b, masked_m=counts)
    out = _nan((e, max_m, n), out_dtype, device)
    grouped_gemm(a, b, masked_m=counts, out=out, out_dtype=out_dtype, config=DQ)
    assert_masked_close(out, want, fmt, out_dtype, what="dequant_matmul masked out=")
    y = grouped_gemm(a, b, masked_m=counts, out_dtype=out_dtype, config=DQ)  # rows past counts: unspecified
    assert y.shape == (e, max_m, n) and y.dtype == out_dtype
    assert bitwise_equal(y[1], out[1]) and bitwise_equal(y[2, :7], out[2, :7])


@pytest.mark.parametrize("fmt", ("fp8_block", "mxfp4", "nvfp4"))
def test_dequant_matmul_weight_only(fmt, device):
    """bf16 activations x quantized experts through dequantize + cuBLAS (fp8_block weights:
    bf16 outputs only, B rounded once to bf16: the fp8_block bf16 tolerance row)."""
    sizes = [3, 0, 20]
    k, n = 96, 40
    offs = _offsets(sizes, device)
    x = randn_like_activations(23, k, dtype=torch.bfloat16, device=device, outliers=False)
    b = _experts(3, n, k, fmt, device)
    out = _nan((23, n), torch.bfloat16, device)
    grouped_gemm(x, b, offsets=offs, out=out, config=DQ)
    assert_gemm_close(out, ref.grouped_gemm(x, b, offsets=offs), fmt, torch.bfloat16, what="weight-only contiguous")
    x3 = randn_like_activations(3, 8, k, dtype=torch.bfloat16, device=device, outliers=False)
    cnt = torch.tensor([8, 0, 2], dtype=torch.int32, device=device)
    for od in ((torch.bfloat16,) if fmt == "fp8_block" else (torch.bfloat16, torch.float32)):
        out3 = _nan((3, 8, n), od, device)
        grouped_gemm(x3, b, masked_m=cnt, out=out3, out_dtype=od, config=DQ)
        assert_masked_close(out3, ref.grouped_gemm(x3, b, masked_m=cnt), fmt, od, what=f"weight-only masked {od}")


def test_dequant_matmul_nvfp4_per_expert_global_scale(device):
    """Per-expert B global scales: exact operands, 1 / (gs_a gs_b[e]) applied by the epilogue
    (contiguous: the row's expert found from the segment ends on the device)."""
    e, n, k = 3, 32, 64
    b, gs = _experts_per_expert_gs(e, n, k, device)
    offs = _offsets([4, 0, 9], device)
    a = _acts((13, k), "nvfp4", device)
    out = _nan((13, n), torch.bfloat16, device)
    grouped_gemm(a, b, offsets=offs, b_global_scale=gs, out=out, config=DQ)
    assert_gemm_close(out, ref.grouped_gemm(a, b, offsets=offs, b_global_scale=gs), "nvfp4", torch.bfloat16,
                      what="contiguous per-expert gs")
    a3 = _acts((e, 8, k), "nvfp4", device)
    cnt = torch.tensor([8, 0, 5], dtype=torch.int32, device=device)
    want = ref.grouped_gemm(a3, b, masked_m=cnt, b_global_scale=gs)
    for od in (torch.bfloat16, torch.float32):
        out3 = _nan((e, 8, n), od, device)
        grouped_gemm(a3, b, masked_m=cnt, b_global_scale=gs, out=out3, out_dtype=od, config=DQ)
        assert_masked_close(out3, want, "nvfp4", od, what=f"masked per-expert gs {od}")


def test_dequant_matmul_empty_and_bad_offsets(device):
    fmt = "mxfp8"
    b = _experts(3, 24, 64, fmt, device)
    a0 = _acts((0, 64), fmt, device)
    assert grouped_gemm(a0, b, offsets=_offsets([0, 0, 0], device), config=DQ).shape == (0, 24)
    a3 = _acts((3, 0, 64), fmt, device)
    assert grouped_gemm(a3, b, masked_m=torch.zeros(3, dtype=torch.int32, device=device), config=DQ).shape == (3, 0, 24)
    # all counts 0: nothing written
    a3 = _acts((3, 4, 64), fmt, device)
    out = _nan((3, 4, 24), torch.bfloat16, device)
    grouped_gemm(a3, b, masked_m=torch.zeros(3, dtype=torch.int32, device=device), out=out, config=DQ)
    assert torch.isnan(out).all()
    # unvalidated offsets past the rows: clamped to [0, sum_m] (memory-safe), like the kernel
    # (device-side check off to see the clamped result; with it the output is NaN + flag)
    b2 = _experts(2, 16, 64, fmt, device)
    a = _acts((6, 64), fmt, device)
    bad = torch.tensor([0, 4, 99], dtype=torch.int32, device=device)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("blockscaled.ops.grouped._device_check", lambda *args, **kwargs: None)
        y = grouped_gemm(a, b2, offsets=bad, validate=False, config=DQ)
    assert_gemm_close(y, ref.grouped_gemm(a, b2, offsets=_offsets([4, 2], device)), fmt, torch.bfloat16)


def test_dequant_matmul_errors(device):
    """Forcing the strategy where it cannot run raises, naming config.strategy and why."""
    a = _acts((6, 64), "mxfp8", device)
    b = _experts(2, 16, 64, "mxfp8", device)
    offs = _offsets([2, 4], device)
    with pytest.raises(ValueError, match="config.strategy.*bf16 in / bf16 out"):
        grouped_gemm(a, b, offsets=offs, out_dtype=torch.float32, config=DQ)
    af = _acts((6, 128), "fp8_block", device)
    with pytest.raises(ValueError, match="config.strategy.*fp8_block x fp8_block"):
        grouped_gemm(af, _experts(2, 16, 128, "fp8_block", device), offsets=offs, config=DQ)
    x16 = randn_like_activations(6, 64, dtype=torch.float16, device=device)
    with pytest.raises(ValueError, match="config.strategy.*bf16 activations"):
        grouped_gemm(x16, b, offsets=offs, config=DQ)
    xb = randn_like_activations(2, 8, 128, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="config.strategy.*only bf16 outputs"):
        grouped_gemm(xb, _experts(2, 16, 128, "fp8_block", device), masked_m=torch.tensor([1, 2], dtype=torch.int32,
                     device=device), out_dtype=torch.float32, config=DQ)
    with pytest.raises(ValueError, match="config.strategy.*'triton' only"):
        grouped_gemm_list([a], [quantize(torch.randn(8, 64, device=device), "mxfp8")], config=DQ)
    # bad inputs are still rejected first, whatever the strategy
    with pytest.raises(TypeError, match="offsets.*int32"):
        grouped_gemm(a, b, offsets=offs.long(), config=DQ)
    with pytest.raises(ValueError, match="non-decreasing"):
        grouped_gemm(a, b, offsets=torch.tensor([0, 5, 2], dtype=torch.int32, device=device), validate=True,
                     config=DQ)


def _h100(monkeypatch):
    from blockscaled.plan import grouped_portable as cgrp
    from blockscaled.plan import DeviceInfo

    info = DeviceInfo("cuda", 132, (9, 0), 232448)
    monkeypatch.setattr(cgrp, "device_info", lambda d: info)
    return cgrp


def test_heuristic_dequant_matmul_rule(monkeypatch):
    """The roofline rule on a (faked) H100: dequantize + cuBLAS at 4096 rows in total for the
    MX/NV formats and bf16 weight-only, the Triton kernels at 1024 rows (E=8 x 128) and for
    fp8_block, outputs the cuBLAS path cannot produce without a sync, or unaligned strides."""
    cgrp = _h100(monkeypatch)
    dev = torch.device("cuda")
    for fmt in DQ_FORMATS:
        for grouping in ("contiguous", "masked"):
            for dual in (False, True):
                big = cgrp.choose_grouped_config(fmt, 512, 4096, 7168, dev, experts=8, grouping=grouping, dual=dual)
                assert big.strategy == "dequant_matmul", (fmt, grouping, dual)
                small = cgrp.choose_grouped_config(fmt, 128, 4096, 7168, dev, experts=8, grouping=grouping, dual=dual)
                assert small.strategy == "triton", (fmt, grouping, dual)
        assert cgrp.choose_grouped_config(fmt, 4096, 2048, 7168, dev, grouping="dense", dual=True).strategy == \
            "dequant_matmul"
    assert cgrp.choose_grouped_config("mxfp4", 512, 4096, 7168, dev, experts=8,
                                      a_dtype=torch.bfloat16).strategy == "dequant_matmul"
    assert cgrp.choose_grouped_config("fp8_block", 512, 4096, 7168, dev, experts=8).strategy == "triton"
    assert cgrp.choose_grouped_config("mxfp8", 512, 4096, 7168, dev, experts=8,
                                      out_dtype=torch.float32).strategy == "triton"
    assert cgrp.choose_grouped_config("mxfp8", 512, 4096, 7168, dev, experts=8, grouping="masked",
                                      out_dtype=torch.float32).strategy == "dequant_matmul"
    assert cgrp.choose_grouped_config("mxfp8", 512, 4100, 7168, dev, experts=8).strategy == "triton"  # N % 8
    assert cgrp.choose_grouped_config("mxfp4", 512, 4096, 7168, dev, experts=8, a_dtype=torch.bfloat16,
                                      a_row_stride=7172).strategy == "triton"
    assert cgrp.choose_grouped_config("mxfp4", 512, 4096, 7168, dev, experts=8,
                                      a_dtype=torch.float16).strategy == "triton"
    assert cgrp.choose_grouped_config("mxfp8", 512, 4096, 7168, dev, experts=8,
                                      allow_dequant=False).strategy == "triton"


def test_heuristic_warps_avoid_spills(monkeypatch):
    """Dequantizing tiles with >= 128x64 accumulator elements (DUAL counts both) use 8 warps:
    ptxas spilled registers for the 4-warp variants (plan/grouped_portable.py _DEQUANT_8WARP_ACC)."""
    cgrp = _h100(monkeypatch)
    dev = torch.device("cuda")
    for fmt in DQ_FORMATS:
        for rows, dual in ((512, True), (40, True), (40, False), (512, False)):
            cfg = cgrp.choose_grouped_config(fmt, rows, 4096, 7168, dev, experts=8, dual=dual, allow_dequant=False)
            acc = cfg.block_m * cfg.block_n * (2 if dual else 1)
            if not cfg.promote and acc >= 128 * 64:
                assert cfg.num_warps == 8, (fmt, rows, dual, cfg)
    # promoted FP8-dot tiles keep 4 warps at 64x128 (block_k 32: no spills measured)
    cfg = cgrp.choose_grouped_config("mxfp8", 40, 4096, 7168, dev, experts=8, allow_dequant=False)
    assert cfg.promote and cfg.num_warps == 4


EPILOGUE_AOT = r'''
import json, re
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from blockscaled.kernels.triton.grouped import dq_epilogue_kernel

out = {}
for name, mode, swiglu, post, xdt, odt in (("contig_swiglu_post", 1, True, True, "*bf16", "*bf16"),
                                          ("masked_copy", 2, False, False, "*bf16", "*bf16"),
                                          ("masked_swiglu_post", 2, True, True, "*fp32", "*fp16"),
                                          ("dense_swiglu", 0, True, False, "*fp32", "*bf16")):
    sig = {n: "i32" for n in dq_epilogue_kernel.arg_names}
    sig.update(x_ptr=xdt, x2_ptr=xdt, out_ptr=odt, seg_ptr="*i32", post_ptr="*fp32", post2_ptr="*fp32")
    const = dict(MODE=mode, SWIGLU=swiglu, HAS_POST=post, E_POW2=16, BLOCK_M=32, BLOCK_N=128)
    for c in const:
        sig[c] = "constexpr"
    k = triton.compile(triton.compiler.ASTSource(fn=dq_epilogue_kernel, signature=sig, constexprs=const),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ptx = k.asm["ptx"]
    out[name] = {"atom": len(re.findall(r"\batom\.", ptx)), "ex2": "ex2.approx" in ptx, "n": len(ptx)}
print("JSON" + json.dumps(out))
'''


def test_dq_epilogue_compiles_for_sm90():
    """The dequant_matmul epilogue (nvfp4 scales, SwiGLU, masked rows) compiles for sm_90;
    no atomics (deterministic); the SwiGLU variants evaluate exp."""
    from _aot import run_compile_script

    res = run_compile_script(EPILOGUE_AOT)
    assert set(res) == {"contig_swiglu_post", "masked_copy", "masked_swiglu_post", "dense_swiglu"}
    for key, r in res.items():
        assert r["atom"] == 0, key
        assert r["ex2"] == key.endswith(("swiglu_post", "swiglu")), key


def test_expected_m_hint_validation_and_result():
    """expected_m (masked only) steers tiles, never results; bad values and contiguous use raise."""
    from blockscaled.ops.grouped import grouped_gemm
    from blockscaled.reference.quantize import quantize as rq
    from blockscaled.reference import grouped as ref

    torch.manual_seed(0)
    a = rq(torch.randn(2, 40, 256), "fp8_block")
    b = rq(torch.randn(2, 64, 256) * 0.05, "fp8_block", block=(128, 128))
    cnt = torch.tensor([3, 40], dtype=torch.int32)
    y0 = grouped_gemm(a, b, masked_m=cnt)
    y1 = grouped_gemm(a, b, masked_m=cnt, expected_m=8)
    rows = torch.arange(40)[None, :] < cnt[:, None]
    assert torch.equal(y0[rows], y1[rows])
    with pytest.raises(ValueError, match="expected_m"):
        grouped_gemm(a, b, masked_m=cnt, expected_m=0)
    a2 = rq(torch.randn(43, 256), "fp8_block")
    offs = torch.tensor([0, 3, 43], dtype=torch.int32)
    with pytest.raises(ValueError, match="expected_m"):
        grouped_gemm(a2, b, offsets=offs, expected_m=8)
    # one expert: the dense GEMM path, same contract
    b1 = rq(torch.randn(1, 64, 256) * 0.05, "fp8_block", block=(128, 128))
    offs1 = torch.tensor([0, 43], dtype=torch.int32)
    out = grouped_gemm(a2, b1, offsets=offs1, out_dtype=torch.float32)
    torch.testing.assert_close(out.double(), ref.grouped_gemm(a2, b1, offsets=offs1), rtol=2e-2, atol=2e-2)
