"""Shared helper for the ahead-of-time compile tests (tests/test_aot_*.py).

Kernels must be compiled for sm_90 by a process WITHOUT TRITON_INTERPRET (the interpreter is
chosen when kernels are defined, and conftest.py sets it on machines without a GPU), so each
AOT test runs a script in a subprocess and reads the JSON it prints last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def run_compile_script(script: str, timeout: int = 900, extra_env: dict | None = None) -> dict:
    """Run ``script`` with ``src/`` on the path and no interpreter (plus ``extra_env``); return the
    JSON object of its last stdout line (a leading ``JSON`` marker is allowed)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(extra_env or {})
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    lines = [ln for ln in r.stdout.strip().splitlines() if ln.strip()]
    marked = [ln for ln in lines if ln.startswith("JSON")]
    last = marked[-1][4:] if marked else lines[-1]
    return json.loads(last)


#: Python source (prepend it to a compile script) of ``gemm_sig``: the AOT signature of
#: kernels/triton/gemm.py::gemm_kernel, shared by the AOT tests of that kernel.
GEMM_SIG = r'''
def gemm_sig(a_dt, s_dt, b_dt, out="*bf16", split=1, tail=()):
    """gemm_kernel's signature in parameter order (``attrs`` index it). ``a_dt`` / ``b_dt`` / ``s_dt``:
    A, B data and scale pointer types; ``tail``: trailing constexpr parameters to spell out
    ("SWAP_AB", "PDL"); ws_ptr / cnt_ptr are listed with a split (> 1: the fp32 workspace and
    int32 counters) or a tail (constexpr None when unsplit)."""
    sig = {"a_ptr": a_dt, "a_s_ptr": s_dt, "b_ptr": b_dt, "b_s_ptr": s_dt,
           "gs_a_ptr": "*fp32", "gs_b_ptr": "*fp32", "bias_ptr": "*fp32", "c_ptr": out,
           "M": "i32", "N": "i32", "K": "i32", "k_per_split": "i32",
           "stride_am": "i32", "stride_ak": "constexpr", "stride_asm": "i32", "stride_ask": "constexpr",
           "stride_bn": "i32", "stride_bk": "constexpr", "stride_bsn": "i32", "stride_bsk": "constexpr",
           "stride_cs": "i32", "stride_cm": "i32", "stride_cn": "constexpr",
           "A_FMT": "constexpr", "B_FMT": "constexpr", "B_SCALE_ROWS": "constexpr", "PROMOTE": "constexpr",
           "DOT_DTYPE": "constexpr", "EVEN_K": "constexpr", "HAS_BIAS": "constexpr", "SPLIT_K": "constexpr",
           "GROUP_M": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
    if split > 1 or tail:
        sig["ws_ptr"] = "*fp32" if split > 1 else "constexpr"
        sig["cnt_ptr"] = "*i32" if split > 1 else "constexpr"
    for name in tail:
        sig[name] = "constexpr"
    return sig
'''


#: Python source of ``SM90_PTXAS`` / ``ptxas_stats(ptx)`` for compile scripts (prepend it): spills,
#: registers and wgmma serialisation from ``ptxas -v`` where triton's ptxas exists ({} otherwise).
#: The ptxas is the one triton itself runs for sm_90 (``get_ptxas(90)``): triton 3.9 emits PTX 9.x
#: for sm_90 and assembles it with its CUDA 13 ``ptxas-blackwell``; the CUDA 12 ``bin/ptxas`` next
#: to it rejects that PTX. ``PTXAS_FLAGS``: triton's own register-allocation flags. A ptxas that
#: runs and fails is an error (not silently no statistics).
PTXAS_STATS = r'''
import os as _os, re as _re, subprocess as _sp, tempfile as _tf
import triton as _triton

def _sm90_ptxas():
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        return get_ptxas(90).path
    except Exception:  # no such helper, or its ptxas is missing: the bundled one, if any
        return _os.path.join(_os.path.dirname(_triton.__file__), "backends", "nvidia", "bin", "ptxas")

PTXAS = SM90_PTXAS = _sm90_ptxas()

def _triton_ptxas_flags():
    # Register-allocation flags triton adds to its own ptxas command (statistics must describe the
    # cubin triton builds): triton >= 3.7 passes --regAllocOptLevel=2 ("to work around ptxas 13.x
    # bug"), which moves spills. Read from triton's source: the flag list is local to make_cubin.
    try:
        import inspect
        from triton.backends.nvidia.compiler import CUDABackend
        src = inspect.getsource(CUDABackend.make_cubin)
    except Exception:
        return []
    return [f for f in ("--regAllocOptLevel=2",) if f in src]

PTXAS_FLAGS = _triton_ptxas_flags()

def ptxas_stats(ptx):
    """Spills, registers and wgmma serialisation (ptxas -v) where triton's ptxas exists."""
    if not _os.path.exists(PTXAS):
        return {}
    with _tf.TemporaryDirectory() as d:
        p = _os.path.join(d, "k.ptx")
        open(p, "w").write(ptx)
        r = _sp.run([PTXAS, "-arch=sm_90a", "-v", *PTXAS_FLAGS, p, "-o", _os.path.join(d, "k.cubin")],
                    capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{PTXAS} failed ({r.returncode}): {r.stderr[-2000:]}")
    spills = _re.findall(r"(\d+) bytes spill stores", r.stderr)
    regs = _re.findall(r"Used (\d+) registers", r.stderr)
    # C7514: "wgmma.mma_async instructions are serialized" (e.g. a copy of an in-flight accumulator)
    return {"spill_stores": max(int(x) for x in spills) if spills else None,
            "regs": max(int(x) for x in regs) if regs else None, "wgmma_serialized": "C7514" in r.stderr or "C7513" in r.stderr}
'''


#: Python source of ``with_defaults(fn, sig, const)`` for compile scripts (prepend it): an AOT
#: signature completed with the kernel's defaulted parameters. triton >= 3.7 needs every
#: parameter in an ``ASTSource`` signature (a left-out one fails with "'NoneType' object has no
#: attribute '_unflatten_ir'"); 3.6 accepted trailing ones left out and used their defaults.
WITH_DEFAULTS = r'''
import inspect as _inspect

def with_defaults(fn, sig, const):
    """(sig, const) with each parameter of the @jit function ``fn`` that has a default and is
    missing from ``sig`` added as a constexpr of that default, in parameter order: what the JIT
    launcher binds for a call that leaves it out (the kernels' defaulted parameters are all
    constexpr-annotated or None, which the JIT specialises as constexpr too)."""
    params = _inspect.signature(fn.fn).parameters
    out_sig, out_const = {}, dict(const)
    for name, p in params.items():
        if name in sig:
            out_sig[name] = sig[name]
        elif p.default is not _inspect.Parameter.empty:
            out_sig[name] = "constexpr"
            out_const.setdefault(name, p.default)
    return out_sig, out_const
'''
