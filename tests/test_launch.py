"""ops/_launch.py: direct launches of compiled Triton kernels (fakes: runs on the CPU; the GPU
tests run every kernel through it)."""

from __future__ import annotations

import inspect

import pytest
import torch

from blockscaled.ops import _launch


class _Param:
    def __init__(self, name, default=inspect.Parameter.empty):
        self.name, self.default = name, default


class _Compiled:
    """Stands in for a CompiledKernel: its launcher records the direct launches."""

    def __init__(self, log):
        self.function, self.packed_metadata = "fn", "meta"
        self.run = lambda *a: log.append(("direct", a))


class _Jit:
    """Stands in for a JITFunction: ``fn[grid](...)`` records Triton-path launches."""

    def __init__(self):
        self.params = [_Param("x"), _Param("y"), _Param("n"), _Param("FLAG", False), _Param("BLOCK")]
        self.log = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append(("triton", grid, args, kwargs))
            return _Compiled(self.log)
        return launch


@pytest.fixture
def fk(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(_launch, "_stream_getter", lambda: (lambda dev: 1000 + dev))
    # triton's default: empty hook chains (nothing to call)
    runtime = type("R", (), {"launch_enter_hook": _launch._HookChain(), "launch_exit_hook": None})()
    monkeypatch.setattr(_launch, "_RUNTIME", runtime)
    return _launch.FastKernel(_Jit())


def _kinds(fk):
    return [e[0] for e in fk.fn.log]


def test_second_launch_of_a_key_is_direct_with_every_parameter_in_order(fk):
    x, y = torch.zeros(8), torch.zeros(8, dtype=torch.float16)
    fk[(3,)](x, y, 7, BLOCK=64)
    fk[(3,)](x, y, 7, BLOCK=64)
    assert _kinds(fk) == ["triton", "direct"]
    # grid padded to 3, stream of the current device, no launch metadata / hooks, then x, y, n,
    # FLAG (its default), BLOCK (the keyword): the list Triton's run passes its launcher
    assert fk.fn.log[1][1] == (3, 1, 1, 1000, "fn", "meta", None, None, None, x, y, 7, False, 64)


def test_every_specialised_fact_is_in_the_key(fk):
    x, y = torch.zeros(8), torch.zeros(8, dtype=torch.float16)
    fk[(1,)](x, y, 16, BLOCK=64)
    fk[(1,)](x[1:], y, 16, BLOCK=64)  # 4-byte offset: not 16-byte aligned
    fk[(1,)](x.half(), y, 16, BLOCK=64)  # another dtype
    fk[(1,)](x, y, 1, BLOCK=64)  # n == 1 is specialised by Triton
    fk[(1,)](x, y, True, BLOCK=64)  # a bool is not the int 1
    fk[(1,)](x, y, 16, BLOCK=128)  # another constexpr
    fk[(1,)](x, y, 16, BLOCK=64, num_warps=8)  # another compile option
    assert _kinds(fk) == ["triton"] * 7
    fk[(2, 5)](torch.zeros(8), y, 16, BLOCK=64)  # a new aligned tensor of the first key: direct
    assert _kinds(fk)[-1] == "direct" and fk.fn.log[-1][1][:3] == (2, 5, 1)


def test_tensor_keywords_are_this_launchs_own(fk):
    x, w1, w2 = torch.zeros(8), torch.zeros(4), torch.zeros(4)
    fk[(1,)](x, x, 3, BLOCK=w1)  # a tensor by keyword (split-K scratch is passed so)
    fk[(1,)](x, x, 3, BLOCK=w2)
    assert _kinds(fk) == ["triton", "direct"]
    assert fk.fn.log[1][1][-1] is w2  # not the first launch's tensor
    fk[(1,)](x, x, 3, BLOCK=w2.half())  # its dtype is keyed too
    fk[(1,)](x, x, 3, BLOCK=w2[1:])  # and its alignment
    assert _kinds(fk)[2:] == ["triton", "triton"]


def test_falls_back_to_triton_where_the_key_cannot_hold(fk, monkeypatch):
    x = torch.zeros(8)
    for _ in range(2):
        fk[(1,)](x, [1, 2], 2, BLOCK=64)  # unhashable
        fk[lambda meta: (1,)](x, x, 2, BLOCK=64)  # a grid function
        fk[(1,)](x, x)  # n and BLOCK missing: Triton's own error path
    assert _kinds(fk) == ["triton"] * 6
    fk[(1,)](x, x, 2, BLOCK=64)
    fk[(1,)](x, x, 2, BLOCK=64)
    assert _kinds(fk)[-1] == "direct"
    _launch._RUNTIME.launch_enter_hook.add(print)
    fk[(1,)](x, x, 2, BLOCK=64)  # a profiler's hook in the chain: Triton's path, which calls it
    assert _kinds(fk)[-1] == "triton"
    _launch._RUNTIME.launch_enter_hook = lambda *a: None
    fk[(1,)](x, x, 2, BLOCK=64)  # a plain function as the hook
    assert _kinds(fk)[-2:] == ["triton", "triton"]


def test_fast_wraps_only_jit_functions():
    import triton

    # triton's default hooks are empty chains: the direct launch applies (an `is None` test did not)
    assert not _launch._hooked(triton.knobs.runtime.launch_enter_hook)
    assert not _launch._hooked(triton.knobs.runtime.launch_exit_hook)
    stub = object()
    assert _launch.fast(stub) is stub  # spies, stubs, the interpreter's kernels: unchanged
    from triton.runtime.jit import JITFunction

    from blockscaled.kernels.triton.gemv import gemv_kernel

    if type(gemv_kernel) is JITFunction and _launch.FAST_LAUNCH:
        w = _launch.fast(gemv_kernel)
        assert isinstance(w, _launch.FastKernel) and w.fn is gemv_kernel and _launch.fast(gemv_kernel) is w
    else:
        assert _launch.fast(gemv_kernel) is gemv_kernel


@pytest.mark.skipif(_launch._GluonDesc is None, reason="this triton has no Gluon")
def test_gluon_descriptors_keyed_by_their_specialisation_and_passed_through(fk):
    """A Gluon TMA descriptor argument is keyed by dtype, block shape, layout and padding (what
    Triton specialises it on); another base, shape or strides with the same type is a direct launch
    that passes this launch's descriptor (the launcher encodes the tensor map from it)."""
    from triton.experimental.gluon import language as gl

    lay = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    lay64 = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=32, rank=2)  # (triton 3.8 checks the
    # swizzle against the box: 64 bytes is what a 16-word row allows)
    w1, w2 = torch.zeros(64, 32, dtype=torch.int32), torch.zeros(128, 16, dtype=torch.int32)
    D = _launch._GluonDesc
    d1 = D(w1, [64, 32], [32, 1], [64, 16], lay)
    d2 = D(w2, [128, 16], [16, 1], [64, 16], lay)  # other base / shape / strides, same type
    x = torch.zeros(8)
    fk[(1,)](d1, x, 3, BLOCK=64)
    fk[(1,)](d2, x, 3, BLOCK=64)
    assert _kinds(fk) == ["triton", "direct"] and fk.fn.log[1][1][9] is d2
    fk[(1,)](D(w1, [64, 32], [32, 1], [64, 32], lay), x, 3, BLOCK=64)  # another block shape
    fk[(1,)](D(w1, [64, 32], [32, 1], [64, 16], lay64), x, 3, BLOCK=64)  # another layout
    fk[(1,)](D(w1.float(), [64, 32], [32, 1], [64, 16], lay), x, 3, BLOCK=64)  # another dtype
    assert _kinds(fk)[2:] == ["triton"] * 3
    fk[(1,)](x, x, 3, BLOCK=d1)  # by keyword: this launch's own, never kept
    fk[(1,)](x, x, 3, BLOCK=d2)
    assert _kinds(fk)[-1] == "direct" and fk.fn.log[-1][1][-1] is d2
    from blockscaled.kernels.hopper.stream import stream_kernel

    if _launch.FAST_LAUNCH:
        assert isinstance(_launch.fast(stream_kernel), _launch.FastKernel)
    from blockscaled.ops import _stream

    cls, _ = _stream._gluon()
    fast_d = _stream._descriptor(cls, w1, [64, 32], [32, 1], [64, 16], lay)  # no __post_init__
    assert fast_d == D(w1, [64, 32], [32, 1], [64, 16], lay) and _launch._desc_key(fast_d) == _launch._desc_key(d1)
