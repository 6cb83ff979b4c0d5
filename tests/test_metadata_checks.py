"""Bad MoE metadata is loud without a host sync (docs/errors.md).

``grouped_gemm`` / ``swiglu`` with ``validate=False`` check ``offsets`` / ``masked_m`` on the
device after the GEMM (kernels/triton/check.py): bad values write NaN over the whole output and
set a sticky flag that ``blockscaled.check_errors()`` raises on. On the CPU the same kernel
runs in the Triton interpreter, and the float64 reference path (interpreter off) runs the host
twin. ``validate=False`` is passed explicitly: on CPU tensors the default validates on the host.
"""

from __future__ import annotations

import pytest
import torch

import blockscaled as bs
from blockscaled.config import GemmConfig
from blockscaled.ops import errors
from blockscaled.reference import grouped as ref
from blockscaled.reference.quantize import quantize
from blockscaled.testing.tolerances import assert_gemm_close

FMT = "mxfp8"
E, N, K = 3, 16, 64
SUM_M, MAX_M = 10, 5


@pytest.fixture
def path(path):
    """conftest.py's kernel / reference paths, with the error flags cleared around each test."""
    _clear_flags()  # start clean: other tests may leave a flag set on purpose
    yield path
    _clear_flags()  # never leak a set flag into the next test


def _clear_flags():
    for buf in errors._FLAGS.values():
        buf.zero_()


def _ops(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = quantize(torch.randn(SUM_M, K, generator=g).to(device), FMT)
    a3 = quantize(torch.randn(E, MAX_M, K, generator=g).to(device), FMT)
    b = quantize((torch.randn(E, N, K, generator=g) * 0.1).to(device), FMT)
    b2 = quantize((torch.randn(E, N, K, generator=g) * 0.1).to(device), FMT)
    return a, a3, b, b2


def _i32(v, device):
    return torch.tensor(v, dtype=torch.int32, device=device)


def _raises(device, *words):
    with pytest.raises(RuntimeError) as ex:
        bs.check_errors(device)
    msg = str(ex.value)
    for w in words:
        assert w in msg, f"{w!r} not in: {msg}"
    bs.check_errors(device)  # cleared: a second call is quiet
    return msg


def test_valid_metadata_is_quiet_and_correct(path, device):
    a, a3, b, b2 = _ops(device)
    offs = _i32([0, 4, 4, 10], device)
    y = bs.grouped_gemm(a, b, offsets=offs, validate=False, out_dtype=torch.float32)
    assert_gemm_close(y, ref.grouped_gemm(a, b, offsets=offs), FMT, torch.float32)
    cnt = _i32([2, 0, 5], device)
    z = bs.swiglu(a3, b, b2, masked_m=cnt, validate=False, out_dtype=torch.float32)
    want = ref.swiglu(a3, b, b2, masked_m=cnt)
    rows = torch.arange(MAX_M, device=device)[None, :] < cnt[:, None]
    assert_gemm_close(z[rows], want[rows], FMT, torch.float32)
    # edge values that are valid: empty experts, all rows in one expert, counts 0 and max_m
    bs.grouped_gemm(a, b, offsets=_i32([0, 0, 0, 10], device), validate=False)
    bs.grouped_gemm(a3, b, masked_m=_i32([0, 5, 5], device), validate=False)
    bs.check_errors(device)
    bs.check_errors()  # every device


BAD_OFFSETS = [
    ([1, 4, 4, 10], ["offsets[0]=1, expected 0"]),
    ([0, 5, 4, 10], ["offsets[2]=4 < offsets[1]=5", "non-decreasing"]),
    ([0, 4, 4, 9], ["offsets[E=3]=9", "rows of a (10)"]),
    ([0, 4, 4, 12], ["offsets[E=3]=12"]),  # past the rows of a (clamped by the kernel)
    ([0, -3, 4, 10], ["offsets[1]=-3 < offsets[0]=0"]),
]


@pytest.mark.parametrize("offs,words", BAD_OFFSETS, ids=[str(o) for o, _ in BAD_OFFSETS])
def test_bad_offsets_poison_output_and_raise_later(path, device, offs, words):
    a, _, b, b2 = _ops(device)
    y = bs.grouped_gemm(a, b, offsets=_i32(offs, device), validate=False)
    assert y.dtype == torch.bfloat16 and y.isnan().all()
    _raises(device, "blockscaled.grouped_gemm", "contiguous offsets, E=3", "overwritten with NaN", *words)
    out = torch.zeros(SUM_M, N, dtype=torch.float32, device=device)
    assert bs.swiglu(a, b, b2, offsets=_i32(offs, device), out=out, out_dtype=torch.float32,
                     validate=False) is out
    assert out.isnan().all()
    _raises(device, "blockscaled.swiglu", *words)


@pytest.mark.parametrize("cnt,words", [([2, 6, 5], ["masked_m[1]=6", "[0, max_m=5]", "above max_m"]),
                                       ([2, 0, -1], ["masked_m[2]=-1", "negative counts"])])
def test_bad_masked_m_poison_output_and_raise_later(path, device, cnt, words):
    _, a3, b, b2 = _ops(device)
    out = torch.zeros(E, MAX_M, N, dtype=torch.bfloat16, device=device)
    bs.grouped_gemm(a3, b, masked_m=_i32(cnt, device), out=out, validate=False)
    assert out.isnan().all()  # also the rows past the counts: nothing of it passes for a result
    _raises(device, "blockscaled.grouped_gemm", "masked_m, E=3", *words)
    z = bs.swiglu(a3, b, b2, masked_m=_i32(cnt, device), validate=False)
    assert z.isnan().all()
    _raises(device, "blockscaled.swiglu", *words)


def test_flag_is_sticky_and_keeps_the_first_error(path, device):
    a, a3, b, _ = _ops(device)
    bs.grouped_gemm(a3, b, masked_m=_i32([9, 0, 0], device), validate=False)
    y = bs.grouped_gemm(a, b, offsets=_i32([0, 4, 4, 10], device), validate=False)  # a good call between
    assert not y.isnan().any()
    bs.grouped_gemm(a, b, offsets=_i32([2, 4, 4, 10], device), validate=False)
    msg = _raises(device, "masked_m[0]=9", "2 call(s) with invalid metadata")
    assert "offsets" not in msg.split("ran with")[1].split(".")[0]


def test_details_match_the_host_rules(path, device):
    """The kernel's recorded details equal reference.grouped.metadata_errors (the rule twin)."""
    a, _, b, _ = _ops(device)
    for offs in ([0, 4, 3, 2], [5, 4, 4, 10], [0, 0, 0, 0]):
        seg = _i32(offs, device)
        bs.grouped_gemm(a, b, offsets=seg, validate=False)
        words = errors.flag_buffer(device).tolist()
        kinds, first, value, prev = ref.metadata_errors(seg, 1, SUM_M)
        assert kinds != 0 and words[0] == 1 and words[2:10] == [errors.OP_GROUPED_GEMM, 1, kinds, first, value,
                                                                 prev, SUM_M, E]
        with pytest.raises(RuntimeError):
            bs.check_errors(device)


def test_validate_true_raises_at_the_call_and_skips_the_device_check(path, device):
    a, a3, b, _ = _ops(device)
    out = torch.zeros(SUM_M, N, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="non-decreasing"):
        bs.grouped_gemm(a, b, offsets=_i32([0, 5, 4, 10], device), out=out, validate=True)
    assert (out == 0).all()
    with pytest.raises(ValueError, match=r"masked_m\[0\]=7"):
        bs.swiglu(a3, b, b, masked_m=_i32([7, 0, 0], device), validate=True)
    bs.check_errors(device)
    if device == "cpu":  # the CPU default validates on the host
        with pytest.raises(ValueError, match="offsets"):
            bs.grouped_gemm(a, b, offsets=_i32([0, 5, 4, 10], device))


def test_every_strategy_and_the_one_expert_shortcut_are_checked(path, device):
    a, a3, b, _ = _ops(device)
    if path == "kernels":
        dq = GemmConfig(strategy="dequant_matmul")
        y = bs.grouped_gemm(a, b, offsets=_i32([0, 4, 4, 11], device), config=dq, validate=False)
        assert y.isnan().all()
        _raises(device, "offsets[E=3]=11")
        z = bs.grouped_gemm(a3, b, masked_m=_i32([0, 0, 6], device), config=dq, validate=False,
                            out_dtype=torch.float32)
        assert z.isnan().all()
        _raises(device, "masked_m[2]=6")
    # one expert: contiguous runs the dense GEMM, offsets must still be [0, sum_m]
    b1 = quantize((torch.randn(1, N, K) * 0.1).to(device), FMT)
    y = bs.grouped_gemm(a, b1, offsets=_i32([0, 7], device), validate=False)
    assert y.isnan().all()
    _raises(device, "offsets[E=1]=7", "rows of a (10)")
    y = bs.grouped_gemm(a, b1, offsets=_i32([0, SUM_M], device), validate=False)
    assert not y.isnan().any()
    bs.check_errors(device)


def test_large_output_is_fully_poisoned(path, device):
    """More elements than the grid's programs x block: the grid-stride loop covers all of them."""
    g = torch.Generator().manual_seed(3)
    a = quantize(torch.randn(300, K, generator=g).to(device), FMT)
    b = quantize((torch.randn(2, 40, K, generator=g) * 0.1).to(device), FMT)
    y = bs.grouped_gemm(a, b, offsets=_i32([0, 200, 100], device), validate=False)
    assert y.shape == (300, 40) and y.isnan().all()
    _raises(device, "offsets[2]=100 < offsets[1]=200")


def test_check_errors_arguments(device):
    bs.check_errors("cpu")
    bs.check_errors(torch.device("cpu"))
    with pytest.raises(ValueError, match="device: expected"):
        bs.check_errors("not-a-device")
    with pytest.raises(ValueError, match="device: expected"):
        bs.check_errors(3.5)


AOT_SCRIPT = r'''
import json, re
import triton
from triton.backends.compiler import GPUTarget
from blockscaled.kernels.triton.check import metadata_check_kernel

out = {}
for mode in (1, 2):
    for odt in ("bf16", "fp16", "fp32"):
        for big in (False, True):  # total / strides past 2**31 come in as i64
            ity = "i64" if big else "i32"
            sig = {"seg_ptr": "*i32", "out_ptr": "*" + odt, "flag_ptr": "*i32", "E": "i32", "LIMIT": "i32",
                   "ROWS_PER_E": "i32", "N": "i32", "total": ity, "s_e": ity, "s_m": "i32", "nprog": "i32",
                   "OP": "constexpr", "MODE": "constexpr", "E_POW2": "constexpr", "BLOCK": "constexpr"}
            src = triton.compiler.ASTSource(fn=metadata_check_kernel, signature=sig,
                                            constexprs={"OP": 1, "MODE": mode, "E_POW2": 512, "BLOCK": 1024})
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
            ptx = k.asm["ptx"]
            out[f"{mode}-{odt}-{ity}"] = {"atom": sorted(set(re.findall(r"atom\.[\.\w]*", ptx))),
                                          "st": sorted(set(re.findall(r"st\.global[\.\w]*", ptx))),
                                          "cubin": len(k.asm.get("cubin", b""))}
print("JSON" + json.dumps(out))
'''


def test_check_kernel_compiles_for_sm90():
    """The check kernel builds for Hopper without a GPU (subprocess without the interpreter):
    the flag's compare-and-swap and add, NaN stores of every output dtype, i64 sizes."""
    from _aot import run_compile_script

    res = run_compile_script(AOT_SCRIPT)
    assert len(res) == 12
    for key, r in res.items():
        assert r["cubin"] > 0, key
        assert any("cas" in a for a in r["atom"]) and any("add" in a for a in r["atom"]), (key, r["atom"])
        assert r["st"], key


# --------------------------------------------------------------------------- GPU only
def _fp8_moe(e, m, n, k, masked):
    """fp8_block activations and 128x128 expert weights: the sm_90 Gluon path on an H100."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(e * m, k, generator=g).cuda().to(torch.bfloat16)
    a = bs.quantize(x.view(e, m, k) if masked else x, "fp8_block")
    b = bs.quantize((torch.randn(e, n, k, generator=g) * 0.05).cuda(), "fp8_block", block=(128, 128))
    return a, b


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["grouped_gemm", "swiglu"])
@pytest.mark.parametrize("masked", [False, True], ids=["contiguous", "masked"])
def test_cuda_graph_replay_checks_the_current_metadata(op, masked):
    """Captured once; the metadata changes between replays (as a router's output does): a bad
    replay gives NaN and a flag, a good one after it a finite result and no error."""
    e, m, n, k = 4, 64, 256, 512
    a, b = _fp8_moe(e, m, n, k, masked)
    if masked:
        seg = torch.full((e,), m, dtype=torch.int32, device="cuda")
        good, bad = seg.clone(), torch.tensor([m, m + 1, 0, m], dtype=torch.int32, device="cuda")
        kw = {"masked_m": seg}
    else:
        seg = torch.arange(0, (e + 1) * m, m, dtype=torch.int32, device="cuda")
        good, bad = seg.clone(), seg.clone()
        bad[2] = 0  # decreasing
        kw = {"offsets": seg}

    def run():
        return bs.grouped_gemm(a, b, **kw) if op == "grouped_gemm" else bs.swiglu(a, b, b, **kw)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()  # warm-up: compiles, creates the flag
    torch.cuda.current_stream().wait_stream(s)
    bs.check_errors()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = run()
    graph.replay()
    assert torch.isfinite(y).all()
    bs.check_errors()
    seg.copy_(bad)
    graph.replay()
    assert y.isnan().all()
    with pytest.raises(RuntimeError, match=f"blockscaled.{op}"):
        bs.check_errors()
    seg.copy_(good)
    graph.replay()
    assert torch.isfinite(y).all()
    bs.check_errors()


@pytest.mark.gpu
def test_torch_compile_fullgraph_keeps_the_check():
    e, m, n, k = 4, 64, 256, 512
    a, b = _fp8_moe(e, m, n, k, False)
    offs = torch.arange(0, (e + 1) * m, m, dtype=torch.int32, device="cuda")

    def f(a_data, offs):
        from dataclasses import replace

        return bs.grouped_gemm(replace(a, data=a_data), b, offsets=offs) * 2

    cf = torch.compile(f, fullgraph=True)
    assert torch.isfinite(cf(a.data, offs)).all()
    bs.check_errors()
    bad = offs.clone()
    bad[-1] = 7
    assert cf(a.data, bad).isnan().all()
    with pytest.raises(RuntimeError, match=r"offsets\[E=4\]=7"):
        bs.check_errors()
    # the one-expert shortcut (dense GEMM + the check_metadata custom op) traces too
    b1 = bs.quantize((torch.randn(1, n, k) * 0.05).cuda(), "fp8_block", block=(128, 128))
    g = torch.compile(lambda o: bs.grouped_gemm(a, b1, offsets=o), fullgraph=True)
    assert g(torch.tensor([0, e * m - 1], dtype=torch.int32, device="cuda")).isnan().all()
    with pytest.raises(RuntimeError, match="rows of a"):
        bs.check_errors()
