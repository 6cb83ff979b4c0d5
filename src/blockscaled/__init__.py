"""blockscaled: block-scaled low-precision GEMM kernels (FP8 block, MXFP8, MXFP4, NVFP4).

Quick start::

    import blockscaled as bs
    q = bs.quantize(x, "fp8_block")                     # activations, 1x128 blocks
    w = bs.quantize(W, "fp8_block", block=(128, 128))   # weights, 128x128 blocks
    x2 = bs.dequantize(q)
"""

from .formats import FORMATS, FP8_BLOCK, MXFP4, MXFP8, NVFP4, Format, ScaleRounding, get_format
from .ops.quantize import dequantize, quantize
from .tensor import ScaledTensor

__version__ = "0.1.0"

__all__ = [
    "Format",
    "ScaleRounding",
    "FORMATS",
    "FP8_BLOCK",
    "MXFP8",
    "MXFP4",
    "NVFP4",
    "get_format",
    "ScaledTensor",
    "quantize",
    "dequantize",
]
