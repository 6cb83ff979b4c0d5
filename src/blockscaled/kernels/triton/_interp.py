"""Interpreter-only numerics fixes for the portable Triton kernels (no effect on the GPU).

Triton's interpreter (triton 3.6 - 3.9, ``_convert_float`` in triton/runtime/interpreter.py)
differs from the GPU in two casts the kernels rely on:

* fp32 -> bf16 truncates (the GPU's ``cvt.rn.bf16.f32`` rounds to nearest even): twice the
  output-rounding error in every bf16 GEMM epilogue;
* e4m3 -> fp32 (and its FP8 ``tl.dot``, through fp16) decodes the NaN code ``S.1111.111`` as
  +-480, so NaN data or scales came out as finite numbers.

The helpers below do the right thing in the interpreter and are exactly the plain casts when
compiled: ``INTERPRETING`` is a constexpr global, so ``if INTERPRETING:`` is resolved at
compile time and the GPU code is unchanged (tests/test_interpreter_numerics.py compiles kernels
for sm_90a with these helpers and with plain casts and compares the PTX byte for byte).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _probe():
    pass


#: True when Triton defines this module's kernels for its interpreter (TRITON_INTERPRET=1
#: when they were defined: ``triton.jit`` returns an InterpretedFunction then, a JITFunction
#: otherwise), i.e. exactly the mode every kernel of this package runs in. A constexpr global:
#: ``if INTERPRETING:`` is resolved when a kernel is compiled, so the workarounds below cost
#: the GPU nothing (and change no instruction of its code).
INTERPRETING = tl.constexpr(not isinstance(_probe, triton.runtime.JITFunction))


@triton.jit
def _bf16_rne_bits(v):
    """int32 whose low 16 bits are the bf16 bits of fp32 ``v`` rounded to nearest, ties to
    even (what ``cvt.rn.bf16.f32`` gives): add 0x7FFF plus the kept LSB and drop the low half
    (a carry into the exponent is the right result; overflow gives +-Inf). NaN: the high half
    with the quiet bit set (the payload is outside the contract)."""
    b = v.to(tl.int32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return tl.where(v != v, (b >> 16) | 0x40, r)


@triton.jit
def cast_out(acc, DTYPE: tl.constexpr):
    """fp32 ``acc`` -> ``DTYPE`` rounded to nearest even on every path. On the GPU this is
    ``acc.to(DTYPE)``; in the interpreter, whose fp32 -> bf16 cast truncates, bf16 is built
    from the bits (exact for every input, denormals, +-Inf and NaN included)."""
    if INTERPRETING:
        if DTYPE == tl.bfloat16:
            out = _bf16_rne_bits(acc).to(tl.int16).to(tl.bfloat16, bitcast=True)
        else:
            out = acc.to(DTYPE)  # fp16 / fp32: numpy's casts round to nearest even
    else:
        out = acc.to(DTYPE)
    return out


@triton.jit
def e4m3_to_f32(v):
    """float8_e4m3fn tensor -> fp32 values; the NaN codes (0x7F / 0xFF) decode to NaN on every
    path (the interpreter's cast gives +-480 for them: its decoder has no NaN case)."""
    r = v.to(tl.float32)
    if INTERPRETING:
        b = v.to(tl.uint8, bitcast=True)
        r = tl.where((b & 0x7F) == 0x7F, float("nan"), r)
    return r


@triton.jit
def upcast(v, DTYPE: tl.constexpr):
    """``v.to(DTYPE)`` for a ``tl.dot`` operand or an fp32 tile; on the GPU exactly that.

    In the interpreter an e4m3 ``v`` becomes fp32 through :func:`e4m3_to_f32` (NaN stays NaN),
    also when DTYPE is e4m3 itself (a promoted FP8 dot): the interpreter's dot converts fp8
    operands with the same NaN-less decoder. The fp32 operands hold the same exact values and
    the interpreter's dot accumulates in fp32 either way, so only NaN changes."""
    if INTERPRETING:
        if v.dtype == tl.float8e4nv:
            f = e4m3_to_f32(v)
            if DTYPE == tl.float8e4nv:
                out = f
            else:
                out = f.to(DTYPE)
        else:
            out = v.to(DTYPE)
    else:
        out = v.to(DTYPE)
    return out
