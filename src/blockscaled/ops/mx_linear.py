"""The forward of a prepacked mxfp4 W x A layer (``nn.Linear.prepack``): bf16 activations quantized
to mxfp4 and encoded for the FP8 tensor cores in one pass (``ops/mx_pack.quantize_encode``), then
the mixed pair's plan (plan/mx_packed.py) on the exact fp8_block copy of the weight.

Same numbers as ``gemm(quantize(x, "mxfp4"), w8)``: the fused pass is bitwise the quantizer then
the encoder. Where the plan is not the wide kernel (other GPUs, the interpreter, misaligned
operands), while tracing or under a dispatch mode, or where an operand wants a gradient (a bias
``Parameter`` outside ``torch.no_grad`` / ``torch.inference_mode``: the two-pass call's autograd
gives it an fp32 gradient), it runs exactly that two-pass call.
"""

from __future__ import annotations

import torch

from ..formats import ScaleRounding, get_format
from ..plan.mx_packed import mixed_config_ok
from ..config.hopper import HopperConfig
from ..tensor import ScaledTensor
from .._checks import resolve_rounding
from ._autograd import wants_grad
from .gemm import _eager_ok, _memo_plan, gemm, launch_mixed_wide
from .mx_pack import quantize_encode
from .quantize import quantize

__all__ = ["packed_linear"]

_MXFP4 = get_format("mxfp4")


def packed_linear(x: torch.Tensor, w8: ScaledTensor, bias: torch.Tensor | None = None, *,
                  out_dtype: torch.dtype = torch.bfloat16, rounding: ScaleRounding | None = None) -> torch.Tensor:
    """``quantize(x, "mxfp4") @ w8.T (+ bias)`` for ``x`` bf16 / fp16 ``[..., K]`` and ``w8`` the
    fp8_block (128 x 128) copy of an mxfp4 weight ``[N, K]`` (``layouts.mxfp4_to_fp8_block``);
    returns ``[..., N]`` in ``out_dtype``. ``rounding``: the activations' E8M0 rounding (None:
    mxfp4's default). On sm_90 with the wide kernel planned: one fused quantize-and-encode pass
    and the GEMM; else the two-pass call.

    Example::

        w8 = bs.layouts.mxfp4_to_fp8_block(bs.quantize(w, "mxfp4"))
        y = packed_linear(x, w8)       # == bs.gemm(bs.quantize(x, "mxfp4"), w8)
    """
    rounding = resolve_rounding("rounding", rounding, _MXFP4)
    if not isinstance(w8, ScaledTensor) or w8.format.name != "fp8_block" or w8.block != (128, 128) or len(w8.shape) != 2:
        raise ValueError(f"w8: expected a 2-D fp8_block ScaledTensor with (128, 128) blocks (the packed copy of an "
                         f"mxfp4 weight), got {w8!r}")
    k = x.shape[-1]
    if k != w8.shape[1]:
        raise ValueError(f"x: expected [..., {w8.shape[1]}] (the weight's K), got shape {tuple(x.shape)}")
    x2 = x.reshape(-1, k)
    m, n = x2.shape[0], w8.shape[0]
    # the fused path only where the ops would run eagerly too (not tracing, no dispatch / function
    # mode, plain tensors) and no gradient is wanted (the two-pass call carries the autograd rules)
    if x2.device.type == "cuda" and m and n and _eager_ok(x2, w8.data) and not wants_grad(x, bias):
        out = torch.empty((m, n), dtype=out_dtype, device=x2.device)
        # (a mixed pair's Problem reads only that A is quantized: x2 stands in for A's fields)
        plan = _memo_plan(x2, x2, w8.data, w8.block[0], w8.format, k, m, n, out_dtype, bias, out, _MXFP4.name)
        cfg = plan.config
        if isinstance(cfg, HopperConfig) and mixed_config_ok(cfg):
            if launch_mixed_wide(*quantize_encode(x2, rounding), w8.data, w8.scale, out, cfg, bias):
                return out.reshape(*x.shape[:-1], n)
    a = quantize(x2, _MXFP4, block=(1, _MXFP4.block_k), rounding=rounding, check_range=False)
    return gemm(a, w8, out_dtype, bias=bias).reshape(*x.shape[:-1], n)
