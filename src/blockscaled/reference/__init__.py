"""Pure-torch twins of every op, same signatures: the definition the kernels are tested against.

Modules: ``quantize`` (quantize / dequantize / silu_mul_quantize), ``gemm`` (gemm / linear),
``grouped`` (grouped_gemm / swiglu). Only the quantizer functions are re-exported here; GEMM
references are used as modules (``from blockscaled.reference import gemm as ref``).
"""

from .quantize import dequantize, quantize, silu_mul_quantize

__all__ = ["quantize", "dequantize", "silu_mul_quantize"]
