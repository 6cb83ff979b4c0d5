"""Pure-torch twins of every op, same signatures: the definition the kernels are tested against."""

from .quantize import dequantize, quantize, silu_mul_quantize

__all__ = ["quantize", "dequantize", "silu_mul_quantize"]
