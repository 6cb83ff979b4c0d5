"""The inline PTX of the sm_90 mxfp4 -> bf16 pass (kernels/triton/quantize.py ``_mxfp4_word_asm``),
run on the CPU by a small emulator of the instructions it uses, against the reference decode.

The GPU runs the asm itself (tests/test_quantize.py's dequantize checks on CUDA); the interpreter
cannot, so this test is what checks the tables, selectors and sign placement on a machine without
a GPU: every byte value in every position of a word, every E8M0 scale.
"""

from __future__ import annotations

import math
import re

import torch

from blockscaled.kernels.triton.quantize import _mxfp4_word_asm

_M32 = 0xFFFFFFFF
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _bf16_bits(x: float) -> int:
    return int(torch.tensor([x], dtype=torch.float64).to(torch.bfloat16).view(torch.int16).item()) & 0xFFFF


def _bf16_value(bits: int) -> float:
    return float(torch.tensor([bits & 0xFFFF], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).item())


def _prmt(a: int, b: int, c: int) -> int:
    src = a | (b << 32)
    out = 0
    for i in range(4):
        sel = (c >> (4 * i)) & 0xF
        byte = (src >> (8 * (sel & 7))) & 0xFF
        if sel & 8:  # sign-replicate mode (never used by the asm: its selectors' bit 3 is clear)
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for bit in range(32):
        idx = ((a >> bit) & 1) << 2 | ((b >> bit) & 1) << 1 | ((c >> bit) & 1)
        out |= ((lut >> idx) & 1) << bit
    return out


def _mul_bf16x2(a: int, b: int) -> int:
    lo = _bf16_bits(_bf16_value(a) * _bf16_value(b))
    hi = _bf16_bits(_bf16_value(a >> 16) * _bf16_value(b >> 16))
    return lo | (hi << 16)


def _run(asm: str, inputs: dict[int, int]) -> dict[int, int]:
    """Execute the asm with ``$i`` operands from ``inputs``; returns the written ``$i``."""
    regs: dict[str, int] = {f"${i}": v for i, v in inputs.items()}

    def val(tok: str) -> int:
        return int(tok, 16) if tok.startswith("0x") else (int(tok) if tok.isdigit() else regs[tok])

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        args = [t.strip() for t in rest.split(",")]
        d, src = args[0], [val(t) for t in args[1:]]
        if op == "and.b32":
            r = src[0] & src[1]
        elif op == "shr.u32":
            r = src[0] >> src[1]
        elif op == "shl.b32":
            r = (src[0] << src[1]) & _M32
        elif op == "prmt.b32":
            r = _prmt(*src)
        elif op == "lop3.b32":
            r = _lop3(*src)
        elif op == "mul.rn.bf16x2":
            r = _mul_bf16x2(*src)
        else:
            raise AssertionError(f"instruction not emulated: {op}")
        regs[d] = r & _M32
    return {int(k[1:]): v for k, v in regs.items() if re.fullmatch(r"\$\d", k)}


def _scale_word(s: int) -> int:
    sb = 0x0040 if s == 0 else (0x7FC0 if s == 255 else s << 7)  # as dequantize_mxfp4_words_kernel
    return sb | (sb << 16)


def _expected(code: int, s: int) -> float:
    if s == 255:
        return math.nan
    v = _E2M1[code & 7] * 2.0 ** (s - 127)
    return -v if code & 8 else v


def _check(word: int, s: int, got: dict[int, int]) -> None:
    for j in range(4):
        byte = (word >> (8 * j)) & 0xFF
        for h, code in enumerate((byte & 15, byte >> 4)):
            bits = (got[j] >> (16 * h)) & 0xFFFF
            want = _expected(code, s)
            if math.isnan(want):
                assert (bits & 0x7F80) == 0x7F80 and bits & 0x7F, (hex(word), s, j, h, hex(bits))
            else:
                assert bits == _bf16_bits(want), (hex(word), s, j, h, hex(bits), want)


def test_every_byte_in_every_position():
    asm = _mxfp4_word_asm()
    for b in range(256):
        for pos in range(4):
            word = (b << (8 * pos)) | (((b * 37 + 11) & 0xFF) << (8 * ((pos + 1) % 4)))
            for s in (127, 1, 200):
                sw = _scale_word(s)
                _check(word, s, _run(asm, {4: word, 5: sw, 6: sw, 7: sw, 8: sw}))


def test_every_scale():
    """E8M0 0 (2**-127: bf16 subnormal results), 255 (NaN), overflow to Inf at 6 * 2**127, -0."""
    asm = _mxfp4_word_asm()
    words = (0x76543210, 0xFEDCBA98, 0x8F80F008, 0x77777777)
    for s in range(256):
        sw = _scale_word(s)
        for w in words:
            _check(w, s, _run(asm, {4: w, 5: sw, 6: sw, 7: sw, 8: sw}))
