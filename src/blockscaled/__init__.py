"""blockscaled: block-scaled low-precision GEMM kernels (FP8 block, MXFP8, MXFP4, NVFP4).

Quick start::

    import blockscaled as bs
    q = bs.quantize(x, "fp8_block")                     # activations, 1x128 blocks
    w = bs.quantize(W, "fp8_block", block=(128, 128))   # weights, 128x128 blocks
    y = bs.gemm(q, w)                                   # = dequantize(q) @ dequantize(w).T, bf16
    y = bs.linear(x, w)                                 # quantize x as w's format wants, then gemm
    y = bs.grouped_gemm(q, w_experts, offsets=offs)     # MoE, contiguous rows per expert
    y = bs.swiglu(q, w_gate, w_up)                      # silu(q @ Wg.T) * (q @ Wu.T), one kernel
    x2 = bs.dequantize(q)
    bs.check_errors()                                   # raises if a grouped op saw bad offsets/masked_m
    print(bs.explain("gemm", q, w))                     # the plan bs.gemm(q, w) runs, and why
    bs.tune(w, ms=(1, 64, 4096))                        # time the planner's top candidates, keep the fastest

Importing the package defines the Triton kernels but launches and prints nothing.
"""

from . import checkpoint, layouts, nn
from .config import GemmConfig
from .formats import (FORMATS, FP8_BLOCK, MXFP4, MXFP8, NVFP4, Format, QuantizationRangeWarning, ScaleRounding,
                      get_format)
from .ops.errors import check_errors
from .ops.explain import explain
from .ops.gemm import gemm
from .ops.grouped import grouped_gemm
from .ops.grouped_list import grouped_gemm_list
from .ops.linear import linear
from .ops.quantize import dequantize, quantize, silu_mul_quantize, tensor_amax
from .ops.swiglu import swiglu
from .tensor import ScaledTensor
from .nn import quantize_model
from .tune import tune
from .warmup import warmup

__version__ = "0.1.0"

__all__ = [
    "Format",
    "ScaleRounding",
    "QuantizationRangeWarning",
    "FORMATS",
    "FP8_BLOCK",
    "MXFP8",
    "MXFP4",
    "NVFP4",
    "get_format",
    "ScaledTensor",
    "GemmConfig",
    "quantize",
    "dequantize",
    "silu_mul_quantize",
    "tensor_amax",
    "gemm",
    "linear",
    "grouped_gemm",
    "grouped_gemm_list",
    "swiglu",
    "check_errors",
    "explain",
    "warmup",
    "tune",
    "quantize_model",
    "nn",
    "checkpoint",
    "layouts",
]
