"""Eager grouped_gemm / swiglu / grouped_gemm_list run their implementation directly (no
torch.library round trip); the custom ops (torch.compile, tracing, dispatch modes, or the
``gemm.EAGER_FAST_PATH = False`` switch) decode the plan they carry and run the same
implementation: the same config and bitwise the same output on both paths, the device-side
metadata check on both. CPU: the portable kernels in the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import blockscaled as bs
import blockscaled._checks as checks
from blockscaled.config import GemmConfig
from blockscaled.ops import errors
from blockscaled.ops import gemm as gemm_mod
from blockscaled.ops import grouped as grouped_mod
from blockscaled.ops import grouped_list as grouped_list_mod
from blockscaled.plan import H100_SXM, Plan
from blockscaled.plan import grouped as plan_grouped_mod
from blockscaled.reference.quantize import quantize
from blockscaled.testing.compare import bitwise_equal

pytestmark = pytest.mark.skipif(torch.cuda.is_available() is False and not checks.INTERPRET,
                                reason="needs the Triton interpreter (TRITON_INTERPRET=1) or a GPU")


def _q(shape, fmt, device, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return quantize((torch.randn(*shape, generator=g) * scale).to(device), fmt)


def _i32(v, device):
    return torch.tensor(v, dtype=torch.int32, device=device)


def _cases(device):
    """name -> (fn() -> output tensor). Small shapes, several formats and all groupings."""
    e, n, k = 3, 16, 64
    a = _q((10, k), "mxfp8", device, 1)
    b8 = _q((e, n, k), "mxfp8", device, 3, 0.1)
    bfp8 = quantize((torch.randn(e, 128, 128, generator=torch.Generator().manual_seed(4)) * 0.1).to(device),
                    "fp8_block", block=(128, 128))
    a3k = _q((e, 5, 128), "fp8_block", device, 5)
    b4 = _q((e, n, k), "mxfp4", device, 6, 0.1)
    a4 = _q((10, k), "mxfp4", device, 7)
    up = _q((e, n, k), "mxfp8", device, 8, 0.1)
    offs, cnt = _i32([0, 4, 4, 10], device), _i32([2, 0, 5], device)
    wd, ud = _q((n, k), "nvfp4", device, 9, 0.1), _q((n, k), "nvfp4", device, 10, 0.1)
    ad = _q((7, k), "nvfp4", device, 11)

    def out_into():
        out = torch.full((10, n), float("nan"), device=device)
        bs.grouped_gemm(a, b8, offsets=offs, out=out, out_dtype=torch.float32, validate=False)
        return out

    def masked():  # rows past a count are unspecified: compare the counted rows only
        y = bs.grouped_gemm(a3k, bfp8, masked_m=_i32([5, 1, 0], device), out_dtype=torch.float32)
        return torch.cat([y[0, :5], y[1, :1]])

    def swiglu_masked():
        y = bs.swiglu(a3k, bfp8, bfp8, masked_m=_i32([3, 5, 2], device))
        return torch.cat([y[0, :3], y[1, :5], y[2, :2]])

    return {
        "contiguous": lambda: bs.grouped_gemm(a, b8, offsets=offs),
        "contiguous_out": out_into,
        "masked_fp8_128x128": masked,
        "masked_expected_m": lambda: bs.grouped_gemm(_q((e, 5, k), "mxfp8", device, 12), b8, masked_m=cnt,
                                                     expected_m=2)[0, :2],
        "dequant_matmul": lambda: bs.grouped_gemm(a4, b4, offsets=offs,
                                                  config=GemmConfig(strategy="dequant_matmul")),
        "weight_only": lambda: bs.grouped_gemm(torch.randn(10, k, generator=torch.Generator().manual_seed(13))
                                               .to(torch.bfloat16).to(device), b4, offsets=offs),
        "swiglu_dense": lambda: bs.swiglu(ad, wd, ud, out_dtype=torch.float32),
        "swiglu_contiguous": lambda: bs.swiglu(a, b8, up, offsets=offs),
        "swiglu_masked": swiglu_masked,
        "list": lambda: torch.cat([y.flatten() for y in bs.grouped_gemm_list(
            [_q((3, k), "nvfp4", device, 14), _q((5, 32), "nvfp4", device, 15)],
            [_q((16, k), "nvfp4", device, 16), _q((8, 32), "nvfp4", device, 17)])]),
    }


CASES = list(_cases("cpu"))


class _Spy:
    """Records the config each implementation call runs and how many times the ops decoded a plan."""

    def __init__(self, monkeypatch):
        self.cfgs, self.decoded = [], 0
        impl, list_impl, decode = grouped_mod.grouped_impl, grouped_list_mod._grouped_list_impl, grouped_mod.decode_plan

        def grouped_impl(*args, **kw):
            cfg = args[16]  # positional: ..., fmt_id, grouping, k, b_br, cfg, check_op
            self.cfgs.append(cfg.config if isinstance(cfg, Plan) else cfg)  # the op passes the decoded Plan
            return impl(*args, **kw)

        def grouped_list_impl(*args, **kw):
            self.cfgs.append(args[-1])
            return list_impl(*args, **kw)

        def decode_plan(code):
            self.decoded += 1
            return decode(code)

        monkeypatch.setattr(grouped_mod, "grouped_impl", grouped_impl)
        monkeypatch.setattr(grouped_list_mod, "_grouped_list_impl", grouped_list_impl)
        monkeypatch.setattr(grouped_mod, "decode_plan", decode_plan)
        monkeypatch.setattr(grouped_list_mod, "decode_plan", decode_plan)


@pytest.mark.parametrize("name", CASES)
def test_fast_path_and_custom_op_agree(name, device, monkeypatch):
    """Eager: the implementation runs without the custom op (nothing decoded); with the fast path
    off: through the op (one decode per launch); the same configs, bitwise the same output."""
    if device == "cpu" and not checks.INTERPRET:
        pytest.skip("needs TRITON_INTERPRET=1")
    spy = _Spy(monkeypatch)
    fast = _cases(device)[name]()
    fast_cfgs, spy.cfgs = spy.cfgs, []
    assert spy.decoded == 0 and fast_cfgs, "the eager call went through the custom op"
    monkeypatch.setattr(gemm_mod, "EAGER_FAST_PATH", False)
    slow = _cases(device)[name]()
    assert spy.decoded == len(spy.cfgs) == len(fast_cfgs), (spy.decoded, spy.cfgs)
    assert spy.cfgs == fast_cfgs
    assert fast.dtype == slow.dtype and bitwise_equal(fast, slow), name


def test_eager_call_never_touches_the_ops(device, monkeypatch):
    """The torch.ops entries made to fail: eager calls still work (they never reach them)."""
    if device == "cpu" and not checks.INTERPRET:
        pytest.skip("needs TRITON_INTERPRET=1")

    class Boom:
        def __getattr__(self, name):
            raise AssertionError(f"torch.ops.blockscaled.{name} called on the eager path")

    want = {k: f() for k, f in _cases(device).items()}
    monkeypatch.setattr(torch.ops, "blockscaled", Boom())
    for name, f in _cases(device).items():
        assert bitwise_equal(f(), want[name]), name


def test_dispatch_mode_takes_the_custom_op(device, monkeypatch):
    """Under a TorchDispatchMode the call goes through the registered op (the mode sees it)."""
    if device == "cpu" and not checks.INTERPRET:
        pytest.skip("needs TRITON_INTERPRET=1")
    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    f = _cases(device)["contiguous"]
    want = f()
    with Record():
        got = f()
    assert any("blockscaled.grouped_gemm" in s for s in seen), seen[:10]
    assert bitwise_equal(got, want)


@pytest.mark.parametrize("fast", [True, False], ids=["fast_path", "custom_op"])
def test_device_metadata_check_on_both_paths(fast, device, monkeypatch):
    """validate=False with bad offsets: NaN over the output and the sticky flag, on either path."""
    if device == "cpu" and not checks.INTERPRET:
        pytest.skip("needs TRITON_INTERPRET=1")
    monkeypatch.setattr(gemm_mod, "EAGER_FAST_PATH", fast)
    for buf in errors._FLAGS.values():
        buf.zero_()
    a, b, up = _q((10, 64), "mxfp8", device, 1), _q((3, 16, 64), "mxfp8", device, 2), _q((3, 16, 64), "mxfp8", device, 3)
    bad = _i32([0, 5, 4, 10], device)
    assert bs.grouped_gemm(a, b, offsets=bad, validate=False).isnan().all()
    with pytest.raises(RuntimeError, match="blockscaled.grouped_gemm"):
        bs.check_errors(device)
    assert bs.swiglu(a, b, up, offsets=bad, validate=False).isnan().all()
    with pytest.raises(RuntimeError, match="blockscaled.swiglu"):
        bs.check_errors(device)
    # one expert: the dense-GEMM shortcut with the same device check
    a1, b1 = _q((6, 128), "fp8_block", device, 4), _q((1, 16, 128), "fp8_block", device, 5)
    assert bs.grouped_gemm(a1, b1, offsets=_i32([0, 5], device), validate=False).isnan().all()
    with pytest.raises(RuntimeError, match="blockscaled.grouped_gemm"):
        bs.check_errors(device)


# dynamo's note on tracing through the lru_cache of the Hopper tile rules (pure functions)
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
@pytest.mark.parametrize("dual", [False, True], ids=["grouped", "swiglu"])
def test_hopper_plan_crosses_the_op_under_compile(dual, device, monkeypatch):
    """CPU stand-in for the sm_90 path: the planner asked as for an H100 with the Hopper kernel
    available, and the Hopper launcher replaced by a recorder that declines (returns False), so
    that grouped_impl runs the portable kernel. Eager, custom op and
    torch.compile(fullgraph=True, backend="aot_eager") all hand the launcher the plan's
    HopperConfig, the tail split included (the grouped tile rule is asked for E=4 m=512 N=7168
    K=7168 on 132 SMs, which has a tail split, whatever the tiny shapes here), and that plan is
    the one ``bs.explain`` returns."""
    if device != "cpu" or not checks.INTERPRET:
        pytest.skip("CPU stand-in (the GPU test is tests/test_plan_carried_gpu.py)")
    from dataclasses import replace

    from blockscaled.ops import _hopper as H

    seen = []

    def fake_launcher(a_data, a_scale, b_data, b_scale, seg, mode, out, cfg=None, b2_data=None, b2_scale=None):
        seen.append(cfg)
        return False  # "the Gluon kernels cannot be built": the caller runs the portable kernel

    real_tiles = plan_grouped_mod.grouped_hopper_config
    want_split = real_tiles(512, 7168, 7168, 132, 4, 4)
    assert want_split.tail_split > 1
    monkeypatch.setattr(plan_grouped_mod, "grouped_hopper_config", lambda *args: real_tiles(512, 7168, 7168, 132, 4, 4))
    real_plan = grouped_mod.plan_grouped

    def plan_as_h100(p, dev, forced=None, *, hopper_why=None, a_row_stride=0):
        return real_plan(replace(p, tma=True), H100_SXM, forced, hopper_why=None, a_row_stride=a_row_stride)

    monkeypatch.setattr(grouped_mod, "plan_grouped", plan_as_h100)
    monkeypatch.setattr(H, "grouped_fp8_block_hopper_impl", fake_launcher)
    want = want_split if not dual else plan_grouped_mod.swiglu_hopper_config(1, 8, 4.0, 128, 132, 4)
    a = _q((8, 128), "fp8_block", device, 1)
    b = quantize((torch.randn(2, 128, 128, generator=torch.Generator().manual_seed(2)) * 0.1).to(device),
                 "fp8_block", block=(128, 128))
    offs = _i32([0, 3, 8], device)

    def f(a_data):
        aa = replace(a, data=a_data)
        if dual:
            return bs.swiglu(aa, b, b, offsets=offs, out_dtype=torch.float32)
        return bs.grouped_gemm(aa, b, offsets=offs, out_dtype=torch.float32)

    if dual:
        plan = bs.explain("swiglu", a, b, b, offsets=offs, out_dtype=torch.float32)
    else:
        plan = bs.explain("grouped_gemm", a, b, offsets=offs, out_dtype=torch.float32)
    assert plan.config == want and plan.kernel == "hopper_wide", plan
    eager = f(a.data)
    monkeypatch.setattr(gemm_mod, "EAGER_FAST_PATH", False)
    via_op = f(a.data)
    monkeypatch.setattr(gemm_mod, "EAGER_FAST_PATH", True)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(a.data)
    assert seen == [want] * 3, seen
    assert bitwise_equal(eager, via_op) and bitwise_equal(eager, compiled)
