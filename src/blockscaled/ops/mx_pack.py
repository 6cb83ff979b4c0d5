"""MX activations for Hopper's FP8 tensor cores (issue 18, W x A at large M): the encoder that
``bs.gemm`` runs before the wide kernel for a mixed pair (MX activations x an fp8_block 128 x 128
weight, plan/mx_packed.py). Numerics and why: ``reference/mx_pack.py``."""

from __future__ import annotations

import torch
import triton

from .. import _checks
from .._checks import resolve_rounding
from ..formats import ScaleRounding, get_format
from ..kernels.triton.mx_pack import mx_encode_kernel, mx_quantize_encode_kernel
from ..reference import mx_pack as _ref
from ..tensor import ScaledTensor
from .quantize import _ROUND_CODE, GPU_HW_CVT, quantize

__all__ = ["encode_mx_activations", "encode_raw", "quantize_encode"]

#: rows per program of the encoder (16 rows x one 128-K group = 2048 elements per step, 4 warps)
_ENCODE_ROWS = 16
#: 128-K groups per encoder program (the grid's second axis covers K in chunks of this many): one
#: program walking all of K was latency-bound at 6-8x the copy time (H200, 8192 x 14336 mxfp4:
#: 372 us against ~48 us of bytes); chunks of 4 groups with each byte loaded once: 179 us
#: (mx-fp8-path-ab-20261128.json).
_ENCODE_GROUPS = 4


def _outputs(m: int, k: int, dev):
    """The encoded form's fresh tensors: e4m3 data, fp32 scales per 32 K, zeroed int32 row flags."""
    kb = triton.cdiv(k, 128)
    return (torch.empty((m, k), dtype=torch.float8_e4m3fn, device=dev),
            torch.empty((m, 4 * kb), dtype=torch.float32, device=dev), torch.zeros((m,), dtype=torch.int32, device=dev))


def encode_mx_activations(a: ScaledTensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(data e4m3 [M, K], scale fp32 [M, 4 * ceil(K/128)], flag int32 [M])`` of mxfp4 / mxfp8
    activations ``a [M, K]`` (1 x 32 blocks): bitwise ``reference.mx_pack.encode_mx_activations``
    (the Triton kernel on CUDA and in the interpreter, the reference on the CPU otherwise). One
    pass over A, no host synchronisation.

    Example::

        data, scale, flag = encode_mx_activations(bs.quantize(x, "mxfp4"))
    """
    _ref._check_mx("a", a, ("mxfp4", "mxfp8"))
    if not (a.data.device.type == "cuda" or _checks.INTERPRET):
        return _ref.encode_mx_activations(a)
    return encode_raw(a.data, a.scale, a.format.name, a.shape[1])


def encode_raw(data: torch.Tensor, scale: torch.Tensor, fmt: str, k: int):
    """:func:`encode_mx_activations` on the fields (``data`` packed e2m1 ``[M, K/2]`` uint8 or e4m3
    ``[M, K]``, ``scale`` uint8 E8M0 ``[M, ceil(K/32)]``, unit K stride), CUDA or the interpreter."""
    m = data.shape[0]
    kb = triton.cdiv(k, 128)
    out, osc, flag = _outputs(m, k, data.device)
    if m == 0 or k == 0:
        return out, osc, flag
    fp4 = fmt == "mxfp4"
    if data.stride(-1) != 1 or scale.stride(-1) != 1:
        data, scale = data.contiguous(), scale.contiguous()
    mx_encode_kernel[(triton.cdiv(m, _ENCODE_ROWS), triton.cdiv(kb, _ENCODE_GROUPS))](
        data, scale, out, osc, flag, m, k, scale.shape[1], data.stride(0), scale.stride(0), out.stride(0),
        osc.stride(0), FP4=fp4, LIMIT=_ref.SPAN if fp4 else 0, HEAD=_ref.HEADROOM if fp4 else 0,
        BLOCK_R=_ENCODE_ROWS, GROUPS=_ENCODE_GROUPS, num_warps=4)
    return out, osc, flag


def quantize_encode(x: torch.Tensor, rounding: ScaleRounding | str | None = None):
    """``encode_mx_activations(quantize(x, "mxfp4", rounding=rounding))`` in one pass (bitwise the
    same three tensors): ``x`` bf16 / fp16 / fp32 ``[M, K]`` (unit K stride) -> e4m3 ``[M, K]``, fp32
    ``[M, 4 * ceil(K/128)]``, int32 flags ``[M]``. The mxfp4 numbers and the packed weight's FP8
    tensor cores without the packed activations' round trip through memory (one read of ``x``,
    one write of the encoded form; two passes read and wrote ~1.9x those bytes). ``rounding``: the
    E8M0 scale rounding (None: mxfp4's default). CUDA or the interpreter; elsewhere the two
    reference passes.

    Example::

        data, scale, flag = quantize_encode(torch.randn(64, 2880, dtype=torch.bfloat16, device="cuda"))
    """
    if not isinstance(x, torch.Tensor) or x.ndim != 2 or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"x: expected a 2-D [M, K] bf16 / fp16 / fp32 tensor, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}"
                         f"{' ' + str(x.dtype) if isinstance(x, torch.Tensor) else ''}")
    rounding = resolve_rounding("rounding", rounding, get_format("mxfp4"))
    m, k = x.shape
    if not (x.device.type == "cuda" or _checks.INTERPRET):
        return _ref.encode_mx_activations(quantize(x, "mxfp4", rounding=rounding))
    out, osc, flag = _outputs(m, k, x.device)
    if m == 0 or k == 0:
        return out, osc, flag
    if x.stride(-1) != 1:
        x = x.contiguous()
    gpu = x.device.type == "cuda"
    mx_quantize_encode_kernel[(triton.cdiv(m, _ENCODE_ROWS), triton.cdiv(triton.cdiv(k, 128), _ENCODE_GROUPS))](
        x, out, osc, flag, m, k, triton.cdiv(k, 32), x.stride(0), out.stride(0), osc.stride(0),
        ROUND=_ROUND_CODE[rounding], LIMIT=_ref.SPAN, HEAD=_ref.HEADROOM, BLOCK_R=_ENCODE_ROWS,
        GROUPS=_ENCODE_GROUPS, GPU=gpu, HW_CVT=GPU_HW_CVT and gpu, num_warps=4,
        enable_fp_fusion=False)  # (as the quantizer's launch: no contraction may change its bits)
    return out, osc, flag
