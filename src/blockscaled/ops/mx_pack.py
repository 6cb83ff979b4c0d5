"""MX operands on Hopper's FP8 tensor cores (issue 18, W x A at large M): the activation encoder
and the wide kernel's MX launch. Numerics and why: ``reference/mx_pack.py``.

Not planned yet: ``bs.gemm`` / ``bs.linear`` do not route to this path (the planner and the
load-time weight packing of ``nn.Linear`` are the next step, docs/design.md "MX W x A on the FP8
tensor cores"); ``mx_fp8_block_gemm`` is what the GPU tests and the A/B probe run.
"""

from __future__ import annotations

import torch
import triton

from .. import _checks
from ..config.hopper import HopperConfig
from ..kernels.triton.mx_pack import mx_encode_kernel
from ..reference import mx_pack as _ref
from ..tensor import ScaledTensor
from . import _hopper

__all__ = ["encode_mx_activations", "mx_fp8_block_gemm"]

#: rows per program of the encoder (16 rows x one 128-K group = 2048 elements per step, 4 warps)
_ENCODE_ROWS = 16
#: 128-K groups per encoder program (the grid's second axis covers K in chunks of this many)
_ENCODE_GROUPS = 4


def encode_mx_activations(a: ScaledTensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(data e4m3 [M, K], scale fp32 [M, 4 * ceil(K/128)], flag int32 [M])`` of mxfp4 / mxfp8
    activations ``a [M, K]`` (1 x 32 blocks): bitwise ``reference.mx_pack.encode_mx_activations``
    (the Triton kernel on CUDA and in the interpreter, the reference on the CPU otherwise). One pass
    over A, no host synchronisation.

    Example::

        data, scale, flag = encode_mx_activations(bs.quantize(x, "mxfp4"))
    """
    _ref._check_mx("a", a, ("mxfp4", "mxfp8"))
    dev = a.data.device
    if not (dev.type == "cuda" or _checks.INTERPRET):
        return _ref.encode_mx_activations(a)
    m, k = a.shape
    kb = triton.cdiv(k, 128)
    data = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=dev)
    scale = torch.empty((m, 4 * kb), dtype=torch.float32, device=dev)
    flag = torch.zeros((m,), dtype=torch.int32, device=dev)
    if m == 0:
        return data, scale, flag
    if k == 0:
        return data, scale, flag
    fp4 = a.format.name == "mxfp4"
    ad, sd = a.data, a.scale
    if ad.stride(-1) != 1 or sd.stride(-1) != 1:
        ad, sd = ad.contiguous(), sd.contiguous()
    mx_encode_kernel[(triton.cdiv(m, _ENCODE_ROWS), triton.cdiv(kb, _ENCODE_GROUPS))](
        ad, sd, data, scale, flag, m, k, sd.shape[1], ad.stride(0), sd.stride(0), data.stride(0), scale.stride(0),
        FP4=fp4, LIMIT=_ref.SPAN if fp4 else 0, HEAD=_ref.HEADROOM if fp4 else 0, BLOCK_R=_ENCODE_ROWS,
        GROUPS=_ENCODE_GROUPS, num_warps=4)
    return data, scale, flag


#: The wide kernel's config for this path: 128 x 256 tiles, 3-stage ring, TMA-store epilogue
#: (H200 probe, ab-mxwide-20261128.json: 128 x 256 at 3 or 4 stages 1.08-1.12x the 128 x 128 5-stage
#: tile on every row; the 3- and 4-stage rings within 4 % of each other).
DEFAULT_CONFIG = HopperConfig("wide", 128, 256, 8, 3, epilogue="tma")


def mx_fp8_block_gemm(a: ScaledTensor, w: ScaledTensor, out_dtype: torch.dtype = torch.bfloat16,
                      config: HopperConfig | None = None) -> torch.Tensor:
    """``dequantize(a) @ dequantize(w).T`` for MX activations ``a [M, K]`` (mxfp4 / mxfp8, 1 x 32)
    and an fp8_block weight ``w [N, K]`` with 128 x 128 blocks (e.g. ``mxfp4_to_fp8_block`` of an
    mxfp4 weight) on the sm_90 wide kernel with per-32 A scales; ``out_dtype`` bf16 / fp16 / fp32,
    ``[M, N]``. Exact products, fp32 accumulation. CUDA (Hopper, Gluon) only; raises otherwise.

    Example::

        y = mx_fp8_block_gemm(bs.quantize(x, "mxfp4"), mxfp4_to_fp8_block(w4))   # [M, N] bf16
    """
    _ref._check_mx("a", a, ("mxfp4", "mxfp8"))
    if not isinstance(w, ScaledTensor) or w.format.name != "fp8_block" or w.block != (128, 128) or w.ndim != 2:
        raise ValueError(f"w: expected a 2-D fp8_block ScaledTensor with (128, 128) blocks, got "
                         f"{getattr(getattr(w, 'format', None), 'name', type(w).__name__)} "
                         f"{tuple(getattr(w, 'shape', ()))} block {getattr(w, 'block', None)}")
    if a.shape[1] != w.shape[1]:
        raise ValueError(f"a: K mismatch: a has K={a.shape[1]}, w has K={w.shape[1]}")
    if out_dtype not in _checks.OUT_DTYPES:
        raise TypeError(f"out_dtype: expected one of {[str(d) for d in _checks.OUT_DTYPES]}, got {out_dtype}")
    reason = _hopper.gluon_unavailable_reason()
    if a.data.device.type != "cuda" or reason is not None:
        raise RuntimeError(f"mx_fp8_block_gemm: needs a Hopper GPU with the Gluon kernels ({reason or 'not CUDA'})")
    data, scale, flag = encode_mx_activations(a)
    m, n = a.shape[0], w.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=a.data.device)
    _hopper._gemm_gluon(data, scale, w.data, w.scale, out, config or DEFAULT_CONFIG, asub=4, aflag=flag)
    return out
