"""Triton-version compatibility: the Gluon spelling aliases (kernels/hopper/_compat.py) and the
fallback of the Hopper launchers (ops/_hopper.py) to the portable kernels, with one warning per
process, where the Gluon kernels cannot be built on the installed triton.

CPU: failures are simulated (an import made to fail, a real front-end compile error of a small
Gluon kernel); the portable fallback runs through the interpreter. The ``gpu`` test checks the
same decision through the public ops on an H100.
"""

import importlib
import sys
import types
import warnings

import pytest
import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from blockscaled.kernels.hopper import _compat
from blockscaled.ops import _hopper


# ----------------------------------------------------------------------------- _compat
@pytest.mark.parametrize("text, want", [
    ("3.6.0", (3, 6, 0)), ("3.9.0+git1a2b3c4", (3, 9, 0)), ("3.10.0rc1", (3, 10, 0)), ("3.7", (3, 7, 0)),
    ("4", (4, 0, 0)), (" 3.8.1.post2", (3, 8, 1)),
])
def test_parse_version(text, want):
    assert _compat.parse_version(text) == want


def test_parse_version_orders_numerically_and_rejects_garbage():
    # the point of parsing: "3.10" > "3.9" (a string comparison says otherwise)
    assert _compat.parse_version("3.10.0") > _compat.parse_version("3.9.0")
    with pytest.raises(ValueError, match="'nightly'"):
        _compat.parse_version("nightly")
    assert _compat.TRITON_VERSION == _compat.parse_version(triton.__version__)


def test_resolve_prefers_the_newest_spelling():
    def new():
        pass

    def old():
        pass

    both = types.SimpleNamespace(__name__="m", async_load=new, async_copy_global_to_shared=old)
    only_old = types.SimpleNamespace(__name__="m", async_copy_global_to_shared=old)
    names = ("async_load", "async_copy_global_to_shared")
    assert _compat.resolve(both, names, "the TMA load") is new
    assert _compat.resolve(only_old, names, "the TMA load") is old
    with pytest.raises(_compat.GluonCompatError, match=r"the TMA load.*m\.async_load / async_copy_global_to_shared"):
        _compat.resolve(types.SimpleNamespace(__name__="m"), names, "the TMA load")
    assert issubclass(_compat.GluonCompatError, ImportError)  # callers treat it as "Gluon unusable"


def test_aliases_are_this_tritons_own_builtins():
    """Each alias is the installed triton's Gluon builtin (so the kernels emit that release's own
    op), the newest spelling where a release has two."""
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import tma

    want = {
        "cta_barrier": getattr(gl, "barrier", None) or gl.thread_barrier,
        "tma_load": getattr(tma, "async_load", None) or tma.async_copy_global_to_shared,
        "tma_store": getattr(tma, "async_store", None) or tma.async_copy_shared_to_global,
        "cp_async_load": getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared,
    }
    assert set(_compat.API) == set(want)
    for name, fn in want.items():
        assert _compat.API[name] is fn and getattr(_compat, name) is fn, name
        # a Gluon builtin: the code generator calls it with the semantic object (not a Python call)
        assert getattr(fn, "__triton_builtin__", False), name
    # the renames seen so far, by release (what _compat's table documents)
    v = _compat.TRITON_VERSION
    assert hasattr(gl, "barrier") == (v >= (3, 7, 0)) and hasattr(gl, "thread_barrier") == (v < (3, 7, 0))
    for mod in (tma, async_copy):
        assert hasattr(mod, "async_load") == (v >= (3, 8, 0)), mod.__name__


def test_missing_spelling_fails_the_import_by_name(monkeypatch):
    """A release without any known spelling of an API: importing _compat raises GluonCompatError
    naming it and the triton version (ops/_hopper.py turns that into the fallback)."""
    monkeypatch.delattr(gl, "barrier", raising=False)
    monkeypatch.delattr(gl, "thread_barrier", raising=False)
    try:
        # (ImportError: the reload defines a new GluonCompatError class, an ImportError subclass)
        with pytest.raises(ImportError, match=rf"triton {triton.__version__}: .*CTA barrier") as err:
            importlib.reload(_compat)
        assert type(err.value).__name__ == "GluonCompatError"
    finally:
        monkeypatch.undo()
        importlib.reload(_compat)
    assert _compat.cta_barrier is (getattr(gl, "barrier", None) or gl.thread_barrier)


# ----------------------------------------------------------------------------- fallback
@pytest.fixture
def fresh_state(monkeypatch):
    """A process where the Gluon kernels' availability is not known yet."""
    monkeypatch.setattr(_hopper, "_GLUON", {"reason": None, "imported": False})
    return _hopper._GLUON


def _break_kernel_import(monkeypatch):
    """Make ``from ..kernels.hopper import skinny, wide`` fail (ModuleNotFoundError), as when Gluon
    or one of its spellings is missing, even after an earlier successful import in this process."""
    import blockscaled.kernels.hopper as pkg

    monkeypatch.delattr(pkg, "wide", raising=False)
    monkeypatch.setitem(sys.modules, "blockscaled.kernels.hopper.wide", None)


def _calls_with_warnings(fn, times):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")  # count every warning issued, not what the filters let through
        results = [fn() for _ in range(times)]
    ours = [w for w in rec if "Gluon" in str(w.message)]
    return results, ours


def test_gluon_available_on_supported_triton(fresh_state):
    results, ours = _calls_with_warnings(_hopper.gluon_unavailable_reason, 2)
    assert results == [None, None] and not ours
    assert fresh_state["imported"]


def test_import_failure_one_warning_and_recorded(fresh_state, monkeypatch):
    real = importlib.import_module("blockscaled.kernels.hopper.wide")
    _break_kernel_import(monkeypatch)
    results, ours = _calls_with_warnings(_hopper.gluon_unavailable_reason, 3)
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert ours[0].category is RuntimeWarning
    msg = str(ours[0].message)
    assert f"triton {triton.__version__}" in msg and "importing the Gluon kernels failed" in msg
    assert "portable Triton kernels" in msg
    assert results[0] is not None and results == [results[0]] * 3
    assert results[0].startswith(f"triton {triton.__version__}: importing the Gluon kernels failed: ")
    assert "kernels.hopper.wide" in results[0]
    # recorded: the import working again is not retried in this process
    import blockscaled.kernels.hopper as pkg

    monkeypatch.setitem(sys.modules, "blockscaled.kernels.hopper.wide", real)
    monkeypatch.setattr(pkg, "wide", real, raising=False)
    assert _hopper.gluon_unavailable_reason() == results[0]


@gluon.jit
def _broken_kernel(x_ptr):
    # an API this triton does not have: the front end fails like 3.7 did on gl.thread_barrier
    gl.no_such_builtin_for_the_test()


def _compile_broken(*args, **kwargs):
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    triton.compile(GluonASTSource(_broken_kernel, {"x_ptr": "*fp32"}), target=GPUTarget("cuda", 90, 32))
    raise AssertionError("the broken kernel compiled")


#: where the simulated-failure tests run the portable fallback: the interpreter on CPU, the
#: compiled kernels on a GPU machine (conftest sets TRITON_INTERPRET only without one)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _fp8_operands(m, n, k, seed=0):
    from blockscaled.reference.quantize import quantize

    g = torch.Generator().manual_seed(seed)
    a = quantize(torch.randn(m, k, generator=g).to(DEV), "fp8_block")
    b = quantize(torch.randn(n, k, generator=g).to(DEV), "fp8_block", block=(128, 128))
    return a, b


def _dequant_mm(a, b):
    from blockscaled.reference.gemm import gemm as ref_gemm

    return ref_gemm(a, b, out_dtype=torch.float64)


def test_compile_failure_falls_back_once(fresh_state, monkeypatch):
    """A real compile error at the first launch: recorded, one warning, the launcher reports that
    it launched nothing and the dense GEMM runs the planner's plan without the Gluon kernels
    (ops.gemm.run_plan); the next call does not try the Gluon kernel again."""
    from blockscaled.formats import get_format
    from blockscaled.ops import gemm as gemm_mod
    from blockscaled.plan import Plan

    calls = []

    def gluon_launch(*args, **kwargs):
        calls.append(1)
        _compile_broken()

    monkeypatch.setattr(_hopper, "_gemm_gluon", gluon_launch)
    a, b = _fp8_operands(5, 128, 256)
    cfg = _hopper.HopperConfig("skinny", 8, 64, 4, 4)
    plan = Plan("gemm", "cuda", cfg)

    def run():
        out = torch.full((5, 128), float("nan"), dtype=torch.bfloat16, device=DEV)
        gemm_mod.run_plan(plan, a.data, a.scale, None, b.data, b.scale, None, 128, get_format("fp8_block"), 256,
                          out, None, torch.bfloat16)
        return out

    outs, ours = _calls_with_warnings(run, 2)
    assert calls == [1]  # the second call went straight to the portable kernel
    out = torch.full((5, 128), float("nan"), dtype=torch.bfloat16, device=DEV)
    assert _hopper.gemm_fp8_block_hopper_impl(a.data, a.scale, b.data, b.scale, out, cfg) is False
    assert calls == [1] and torch.isnan(out.float()).all()  # nothing launched
    assert len(ours) == 1 and ours[0].category is RuntimeWarning
    msg = str(ours[0].message)
    assert f"triton {triton.__version__}" in msg and "'skinny' kernel failed: CompilationError" in msg
    assert "no_such_builtin_for_the_test" in msg
    assert "no_such_builtin_for_the_test" in _hopper.gluon_unavailable_reason()
    want = _dequant_mm(a, b)
    for out in outs:
        torch.testing.assert_close(out.double(), want, rtol=1e-2, atol=1e-2)


def test_runtime_errors_are_not_build_failures(fresh_state, monkeypatch):
    """An error that does not come from building the kernel (a launch failure, a bad argument)
    propagates unchanged and disables nothing."""
    def gluon_launch(*args, **kwargs):
        raise RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered")

    monkeypatch.setattr(_hopper, "_gemm_gluon", gluon_launch)
    a, b = _fp8_operands(5, 128, 256)
    out = torch.empty((5, 128), dtype=torch.bfloat16, device=DEV)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="illegal memory access"):
            _hopper.gemm_fp8_block_hopper_impl(a.data, a.scale, b.data, b.scale, out,
                                               _hopper.HopperConfig("skinny", 8, 64, 4, 4))
    assert not [w for w in rec if "Gluon" in str(w.message)]
    assert _hopper.gluon_unavailable_reason() is None


def test_is_build_failure_classifies_by_origin():
    try:
        _compile_broken()
    except Exception as e:  # noqa: BLE001 (the classification under test)
        assert _hopper._is_build_failure(e)
    assert not _hopper._is_build_failure(RuntimeError("cooperative launch too large"))
    assert not _hopper._is_build_failure(ValueError("out: expected unit column stride"))
    # too much shared memory for one config is that config's problem, not an unbuildable triton
    from triton.runtime.errors import OutOfResources

    try:
        raise OutOfResources(300000, 232448, "shared memory")
    except OutOfResources as e:
        assert not _hopper._is_build_failure(e)


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_grouped_compile_failure_falls_back(fresh_state, monkeypatch, mode):
    """The grouped / SwiGLU launcher: the same decision; grouped_impl then runs the portable
    grouped kernel's tiles for the call."""
    from blockscaled.kernels.triton._mma import FORMAT_CODES
    from blockscaled.ops.grouped import grouped_impl
    from blockscaled.reference.quantize import quantize

    calls = []

    def gluon_launch(*args, **kwargs):
        calls.append(1)
        _compile_broken()

    monkeypatch.setattr(_hopper, "_grouped_gluon", gluon_launch)
    g = torch.Generator().manual_seed(1)
    e, n, k = 2, 128, 256
    dual = mode == 0  # dense grouping is SwiGLU only on this path
    if mode == 0:
        x = torch.randn(6, k, generator=g)
        wg, wu = (torch.randn(n, k, generator=g) for _ in range(2))
    else:
        x = torch.randn(e, 6, k, generator=g) if mode == 2 else torch.randn(7, k, generator=g)
        wg = torch.randn(e, n, k, generator=g)
        wu = None
    x, wg, wu = (None if t is None else t.to(DEV) for t in (x, wg, wu))
    a = quantize(x, "fp8_block")
    bg = quantize(wg, "fp8_block", block=(128, 128))
    bu = quantize(wu, "fp8_block", block=(128, 128)) if dual else None
    seg = {0: None, 1: torch.tensor([0, 3, 7], dtype=torch.int32, device=DEV),
           2: torch.tensor([6, 2], dtype=torch.int32, device=DEV)}[mode]
    out = torch.zeros((*x.shape[:-1], n), dtype=torch.bfloat16, device=DEV)
    cfg = _hopper.HopperConfig("wide", 128, 128, 8, 4)
    launched, ours = _calls_with_warnings(lambda: _hopper.grouped_fp8_block_hopper_impl(
        a.data, a.scale, bg.data, bg.scale, seg, mode, out, cfg,
        bu.data if dual else None, bu.scale if dual else None), 1)
    assert launched == [False] and calls == [1] and len(ours) == 1
    assert "'wide' kernel failed: CompilationError" in str(ours[0].message)
    assert not out.any()  # nothing launched
    got = grouped_impl(a.data, a.scale, None, bg.data, bg.scale, None, bu.data if dual else None,
                       bu.scale if dual else None, None, seg, out, torch.bfloat16, FORMAT_CODES["fp8_block"], mode,
                       k, 128, cfg)
    assert got is out and calls == [1]  # not retried

    from blockscaled.reference import grouped as ref

    if mode == 0:
        want = ref.swiglu(a, bg, bu)
    elif mode == 1:
        want = ref.grouped_gemm(a, bg, offsets=seg)
    else:
        want = ref.grouped_gemm(a, bg, masked_m=seg)
    got = out.double()
    if mode == 2:  # rows past a count are not written
        rows = torch.arange(x.shape[1], device=DEV)[None, :] < seg[:, None]
        got, want = got[rows], want.double()[rows]
    torch.testing.assert_close(got, want.double(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_ops_fall_back_on_gpu(monkeypatch):
    """H100: with the kernel import made to fail, gemm / grouped_gemm / swiglu run the portable
    kernels (grouped: the dispatcher's reason check), warn once, and match the Gluon results."""
    import blockscaled

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU (the Gluon kernels' only target)")
    torch.manual_seed(0)
    x = torch.randn(256, 1024, device="cuda")
    w = torch.randn(2, 512, 1024, device="cuda")
    a = blockscaled.quantize(x, "fp8_block")
    b = blockscaled.quantize(w, "fp8_block", block=(128, 128))
    b0 = blockscaled.quantize(w[0], "fp8_block", block=(128, 128))
    offsets = torch.tensor([0, 100, 256], dtype=torch.int32, device="cuda")
    ref_dense = blockscaled.gemm(a, b0)
    ref_grouped = blockscaled.grouped_gemm(a, b, offsets=offsets)
    monkeypatch.setattr(_hopper, "_GLUON", {"reason": None, "imported": False})
    _break_kernel_import(monkeypatch)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        dense = blockscaled.gemm(a, b0)
        grouped = blockscaled.grouped_gemm(a, b, offsets=offsets)
        torch.cuda.synchronize()
    ours = [w for w in rec if "Gluon" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    torch.testing.assert_close(dense.float(), ref_dense.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(grouped.float(), ref_grouped.float(), rtol=1e-2, atol=1e-2)
