"""MX activations for Hopper's FP8 tensor cores (issue 18, W x A at large M): the encoder that
``bs.gemm`` runs before the wide kernel for a mixed pair (MX activations x an fp8_block 128 x 128
weight, plan/mx_packed.py). Numerics and why: ``reference/mx_pack.py``."""

from __future__ import annotations

import torch
import triton

from .. import _checks
from ..kernels.triton.mx_pack import mx_encode_kernel
from ..reference import mx_pack as _ref
from ..tensor import ScaledTensor

__all__ = ["encode_mx_activations", "encode_raw"]

#: rows per program of the encoder (16 rows x one 128-K group = 2048 elements per step, 4 warps)
_ENCODE_ROWS = 16
#: 128-K groups per encoder program (the grid's second axis covers K in chunks of this many): one
#: program walking all of K was latency-bound at 6-8x the copy time (H200, 8192 x 14336 mxfp4:
#: 372 us against ~48 us of bytes); chunks of 4 groups with each byte loaded once: 179 us
#: (mx-fp8-path-ab-20261128.json).
_ENCODE_GROUPS = 4


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
    dev = data.device
    kb = triton.cdiv(k, 128)
    out = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=dev)
    osc = torch.empty((m, 4 * kb), dtype=torch.float32, device=dev)
    flag = torch.zeros((m,), dtype=torch.int32, device=dev)
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
