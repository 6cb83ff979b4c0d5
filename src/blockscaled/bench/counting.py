"""The one FLOP / byte counter of the bench.

Every throughput number (GB/s, TFLOP/s, % of the memory floor) divides a count from here by
a time from :mod:`blockscaled.bench.timing`. Bytes are what a kernel must move at minimum:
each operand read once and each output written once, **including** block scales and the fp32
global scale (nvfp4); never padding, never re-reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..formats import Format, get_format
from ..tensor import scale_shape

__all__ = [
    "Count",
    "dtype_bytes",
    "weight_block",
    "activation_block",
    "quantized_nbytes",
    "quantize_count",
    "gemm_count",
    "linear_count",
    "grouped_count",
    "swiglu_count",
]

_DTYPE_BYTES = {torch.bfloat16: 2, torch.float16: 2, torch.float32: 4, torch.float8_e4m3fn: 1}


def dtype_bytes(dtype: torch.dtype) -> int:
    try:
        return _DTYPE_BYTES[dtype]
    except KeyError:
        return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class Count:
    """FLOPs and minimum bytes of one op call."""

    flops: int
    bytes: int

    def tflops(self, ms: float) -> float:
        return self.flops / (ms * 1e-3) / 1e12 if ms > 0 else float("nan")

    def gbps(self, ms: float) -> float:
        return self.bytes / (ms * 1e-3) / 1e9 if ms > 0 else float("nan")


def weight_block(fmt: str | Format) -> tuple[int, int]:
    """Block shape used for weights: 128x128 for fp8_block (DeepSeek), 1 x block_k otherwise."""
    f = get_format(fmt)
    return (128, 128) if (128, 128) in f.blocks else f.blocks[0]


def activation_block(fmt: str | Format) -> tuple[int, int]:
    return get_format(fmt).blocks[0]


def quantized_nbytes(fmt: str | Format, shape: tuple[int, ...], block: tuple[int, int] | None = None) -> int:
    """Bytes of a ScaledTensor of logical ``shape``: packed data + scales (+4 for a global scale).

    Equal to ``ScaledTensor.nbytes()`` of the real tensor (tested)."""
    f = get_format(fmt)
    block = f.blocks[0] if block is None else tuple(block)
    lead = math.prod(shape[:-1])
    data = lead * f.packed_k(shape[-1]) * dtype_bytes(f.data_dtype)
    scales = math.prod(scale_shape(tuple(shape), f, block)) * dtype_bytes(f.scale_dtype)
    return data + scales + (4 if f.has_global_scale else 0)


def _operand_bytes(fmt: str | Format | None, shape: tuple[int, ...], block, dtype=torch.bfloat16) -> int:
    if fmt is None:  # unquantized (bf16 activations of weight-only GEMMs)
        return math.prod(shape) * dtype_bytes(dtype)
    return quantized_nbytes(fmt, shape, block)


def quantize_count(fmt: str | Format, shape: tuple[int, ...], in_dtype=torch.bfloat16, block=None) -> Count:
    """Quantizer: read the input once, write data + scales once (FLOPs not counted: 0)."""
    return Count(0, math.prod(shape) * dtype_bytes(in_dtype) + quantized_nbytes(fmt, shape, block))


def gemm_count(m: int, n: int, k: int, a_fmt, b_fmt, out_dtype=torch.bfloat16, *, b_block=None) -> Count:
    """``[M,K] x [N,K]^T``: 2MNK FLOPs; bytes = A (+scales) + B (+scales) + output.

    ``a_fmt=None`` means bf16 activations (weight-only GEMM). ``b_block`` defaults to
    :func:`weight_block`."""
    b_block = weight_block(b_fmt) if b_block is None else b_block
    a_block = None if a_fmt is None else activation_block(a_fmt)
    by = (
        _operand_bytes(a_fmt, (m, k), a_block)
        + _operand_bytes(b_fmt, (n, k), b_block)
        + m * n * dtype_bytes(out_dtype)
    )
    return Count(2 * m * n * k, by)


def linear_count(m: int, n: int, k: int, w_fmt, x_dtype=torch.bfloat16, out_dtype=torch.bfloat16) -> Count:
    """End-to-end linear (quantize x, then GEMM): the floor of a fused op reads x in its
    original dtype once, the quantized weight once and writes the output once."""
    by = m * k * dtype_bytes(x_dtype) + quantized_nbytes(w_fmt, (n, k), weight_block(w_fmt)) + m * n * dtype_bytes(out_dtype)
    return Count(2 * m * n * k, by)


def grouped_count(ms: tuple[int, ...], n: int, k: int, fmt, out_dtype=torch.bfloat16) -> Count:
    """Grouped GEMM over experts with ``ms[e]`` valid rows each and weights ``[E, N, K]``.

    Only valid rows count (masked layouts do not read or write rows past a count); every
    expert's weights are read once (an expert with 0 rows still counts: a kernel cannot know
    without reading the counts, and engines keep all experts resident)."""
    e = len(ms)
    rows = sum(ms)
    # 1 x block_k activation blocks: the grouped A is one [sum(ms), K] tensor (one global scale).
    a = quantized_nbytes(fmt, (rows, k), activation_block(fmt)) if rows else 0
    b = e * quantized_nbytes(fmt, (n, k), weight_block(fmt))
    return Count(2 * rows * n * k, a + b + rows * n * dtype_bytes(out_dtype))


def swiglu_count(m: int, n: int, k: int, fmt, out_dtype=torch.bfloat16) -> Count:
    """``silu(A Wg^T) * (A Wu^T)``: 4MNK FLOPs; A once, both weights once, one output."""
    by = (
        quantized_nbytes(fmt, (m, k), activation_block(fmt))
        + 2 * quantized_nbytes(fmt, (n, k), weight_block(fmt))
        + m * n * dtype_bytes(out_dtype)
    )
    return Count(4 * m * n * k, by)
