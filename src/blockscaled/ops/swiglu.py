"""SwiGLU dual GEMM: ``silu(a @ b_gate.T) * (a @ b_up.T)``, fused in one kernel (grouped MX / NV
weights on sm_90: gate and up as two grouped GEMMs into fp32 products and one activation pass, the
planner's split: plan/grouped.py ``_split_swiglu_plan``).

Both products accumulate in fp32 in the same program (every A tile is loaded once and fed to
two dots), the activation ``g / (1 + exp(-g)) * u`` is applied in fp32, and the result is
cast once to ``out_dtype``: no ``[M, 2N]`` intermediate ever reaches memory. Dense, grouped
contiguous (MoE, ``offsets``) and grouped masked (``masked_m``) layouts share the kernel of
:mod:`blockscaled.ops.grouped` (custom ops ``blockscaled::grouped_gemm`` / ``grouped_gemm_out``, so
``torch.compile(fullgraph=True)`` and CUDA graphs work). Float64 twin:
:func:`blockscaled.reference.grouped.swiglu`.
"""

from __future__ import annotations

import torch

from .._checks import check_config_arg, use_reference
from ..config.gemm import GemmConfig
from ..reference import grouped as _ref
from ..tensor import ScaledTensor
from .grouped import (
    MODE_CONTIGUOUS,
    MODE_DENSE,
    MODE_MASKED,
    _check_out,
    _check_b_global_scale,
    _check_out_dtype,
    _check_scaled,
    _no_grad_support,
    check_a,
    _resolve_validate,
    check_masked_m,
    check_offsets,
    check_pair,
    grouped_plan,
    launch,
    reference_check,
    reference_result,
)
from ._explain import emit, explaining
from .errors import CALLER_CHECKS, OP_SWIGLU

__all__ = ["swiglu"]


def _check_twins(b_gate: ScaledTensor, b_up: ScaledTensor) -> None:
    """b_gate and b_up must be interchangeable for the kernel: one set of strides and blocks."""
    if b_up.format != b_gate.format:
        raise ValueError(f"b_up: format {b_up.format.name} differs from b_gate's {b_gate.format.name}")
    if b_up.shape != b_gate.shape:
        raise ValueError(f"b_up: shape {tuple(b_up.shape)} differs from b_gate's {tuple(b_gate.shape)}")
    if b_up.block != b_gate.block:
        raise ValueError(f"b_up: block {b_up.block} differs from b_gate's {b_gate.block}")
    if b_up.device != b_gate.device:
        raise ValueError(f"b_up: on {b_up.device}, b_gate on {b_gate.device}")
    for part in ("data", "scale"):
        sg, su = getattr(b_gate, part).stride(), getattr(b_up, part).stride()
        if sg != su:
            raise ValueError(
                f"b_up.{part}: strides {su} differ from b_gate.{part}'s {sg} (the fused kernel "
                f"indexes both with one set of strides; make both contiguous)"
            )


def swiglu(
    a: ScaledTensor | torch.Tensor,
    b_gate: ScaledTensor,
    b_up: ScaledTensor | None = None,
    *,
    offsets: torch.Tensor | None = None,
    masked_m: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
    config: GemmConfig | dict | None = None,
    validate: bool | None = None,
    b_gate_global_scale: torch.Tensor | None = None,
    b_up_global_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``silu(dequantize(a) @ dequantize(b_gate).T) * (dequantize(a) @ dequantize(b_up).T)``.

    Dense
        ``a`` ScaledTensor ``[M, K]`` (1xbk blocks); ``b_gate``, ``b_up`` ``[N, K]``
        (fp8_block: 128x128 or 1x128 blocks). Returns ``[M, N]``.
    Grouped contiguous (``offsets`` int32 ``[E+1]`` on the device)
        ``a`` ``[sum_m, K]`` sorted by expert, ``b_gate``, ``b_up`` ``[E, N, K]``. Returns
        ``[sum_m, N]``; any segment size including 0, no padding.
    Grouped masked (``masked_m`` int32 ``[E]`` on the device)
        ``a`` ``[E, max_m, K]``; returns ``[E, max_m, N]``; rows past a count are not written
        (see :func:`blockscaled.ops.grouped.grouped_gemm`).

    Stacked gate_up (grouped only, ``b_up`` None)
        ``b_gate`` ``[E, 2N, K]`` holds gate rows then up rows (the checkpoint layout of Mixtral,
        Qwen and DeepSeek ``gate_up_proj``): one grouped GEMM over all 2N rows into fp32 products
        ``[.., 2N]`` on the kernel the grouped planner picks for it, then ``silu(g) * u`` over the
        two halves in fp32 and one cast (plan/grouped.py ``stacked_swiglu_plan``; ``explain``
        shows ``gate_up: ... + silu * mul pass``); nvfp4: ``b_gate_global_scale`` for both halves.
        Example: ``bs.swiglu(a, w_gate_up, offsets=offsets)``.

    Formats: fp8_block, mxfp8, nvfp4 (and mxfp4); all three operands share one format, or
    ``a`` is a bf16 / fp16 Tensor (weight-only);
    ``b_gate`` and ``b_up`` share shape, block and strides. nvfp4: ``a.global_scale``,
    ``b_gate.global_scale`` and ``b_up.global_scale`` (one each) are applied in fp32 before
    the activation; grouped nvfp4 may instead pass per-expert fp32 ``[E]`` scales
    ``b_gate_global_scale`` and ``b_up_global_scale`` (both or neither, same shape).

    ``out_dtype`` bf16 / fp16 / fp32; ``out`` destination; ``config`` forces a
    :class:`blockscaled.config.GemmConfig` (``strategy="dequant_matmul"``: dequantize to bf16
    + cuBLAS, chosen by the heuristic on sm_90 for MX/NV and bf16 weight-only at large M;
    its products are bf16 for bf16 outputs (contiguous: ``torch._grouped_mm``, bf16 outputs
    only; dense / masked nvfp4: fp32) and fp32 for fp16 / fp32 outputs, the activation is fp32 and the cast one: bf16
    products add up to two bf16 roundings, within the bf16 tolerance row;
    grouped MX / NV on sm_90 (planned, not forced): the split, gate and up each the grouped GEMM's
    register-streaming / streaming / tiled kernel into fp32 products, then ``silu(g) * u`` in fp32
    and one cast (the portable kernel's numerics);
    ``strategy="hopper"``: the sm_90 Gluon kernel, fp8_block with 128x128 weights only, chosen by
    the planner for those on sm_90 (grouped always, dense from ``SWIGLU_HOPPER_MIN_M`` rows),
    the portable kernel's numerics; a forced hopper config contributes only its strategy: the
    tiles are chosen by the planner, ``plan/grouped.py``). No host sync (unless
    ``validate=True``); deterministic.

    ``validate`` (grouped layouts): as :func:`blockscaled.ops.grouped.grouped_gemm`. True: the
    values of ``offsets`` / ``masked_m`` are checked on the host before the launch (a sync,
    ``ValueError``); False: on the device after the GEMM, without a sync: bad values write
    **NaN over the whole output** and set the sticky flag that
    :func:`blockscaled.check_errors` raises on (``RuntimeError`` naming ``swiglu``;
    docs/errors.md). Default: True on CPU, False on CUDA and under torch.compile.

    Autograd: not supported (``RuntimeError`` when a float input, or the float source of a
    quantized operand, requires grad while grad mode is on; docs/errors.md). Default output
    dtype: bf16, as every op.

    Example::

        a = bs.quantize(x, "fp8_block")                                   # [M, K]
        wg = bs.quantize(w_gate, "fp8_block", block=(128, 128))           # [N, K]
        wu = bs.quantize(w_up, "fp8_block", block=(128, 128))
        h = bs.swiglu(a, wg, wu)                                          # [M, N] bf16
    """
    if offsets is not None and masked_m is not None:
        raise ValueError("offsets/masked_m: give at most one (contiguous or masked grouping)")
    _check_out_dtype(out_dtype)
    masked = masked_m is not None
    grouped = masked or offsets is not None
    check_a(a, 3 if masked else 2)
    _check_scaled("b_gate", b_gate, 3 if grouped else 2)
    stacked = b_up is None
    if stacked:
        if not grouped:
            raise ValueError("b_up: required for a dense SwiGLU (a stacked [E, 2N, K] gate_up weight in b_gate needs "
                             "offsets= or masked_m=)")
        if b_gate.shape[-2] % 2:
            raise ValueError(f"b_gate: a stacked gate_up weight (b_up None) holds gate rows then up rows, an even "
                             f"number, got shape {tuple(b_gate.shape)}")
        if b_up_global_scale is not None:
            raise ValueError("b_up_global_scale: a stacked gate_up weight (b_up None) takes b_gate_global_scale "
                             "for both halves")
        if config is not None and (config.get("strategy") if isinstance(config, dict)
                                   else getattr(config, "strategy", None)) == "dequant_matmul":
            # its products are fp32 (one rounding), and dequantize + torch._grouped_mm gives bf16 only
            raise ValueError("config.strategy: 'dequant_matmul' cannot run a stacked gate_up weight (b_up None: "
                             "fp32 products); pass w_gate and w_up as two weights for it")
    else:
        _check_scaled("b_up", b_up, 3 if grouped else 2)
        _check_twins(b_gate, b_up)
    check_pair(a, b_gate, "a", "b_gate")
    fmt = b_gate.format.name
    dev = a.device
    n, k = b_gate.shape[-2] // (2 if stacked else 1), b_gate.shape[-1]
    check_config_arg(config)
    val = _resolve_validate(validate, dev)
    _no_grad_support("swiglu", a=a, b_gate=b_gate, b_up=b_up)
    check_op = OP_SWIGLU if grouped and not val and validate is not CALLER_CHECKS else 0
    if masked:
        e = b_gate.shape[0]
        if a.shape[0] != e:
            raise ValueError(f"a: E mismatch: a has {a.shape[0]} experts (shape {tuple(a.shape)}), b_gate has {e}")
        check_masked_m(masked_m, e, a.shape[1], dev, val)
        shape, rows, seg, mode = (e, a.shape[1], n), a.shape[1], masked_m, MODE_MASKED
    elif grouped:
        e = b_gate.shape[0]
        check_offsets(offsets, e, a.shape[0], dev, val)
        shape, rows, seg, mode = (a.shape[0], n), a.shape[0] / max(e, 1), offsets, MODE_CONTIGUOUS
    else:
        shape, rows, seg, mode = (a.shape[0], n), a.shape[0], None, MODE_DENSE
    if out is not None:
        _check_out(out, shape, out_dtype, dev)
    if not stacked and (b_gate_global_scale is None) != (b_up_global_scale is None):
        raise ValueError("b_gate_global_scale/b_up_global_scale: give both per-expert scales or neither")
    if b_gate_global_scale is not None and not grouped:
        raise ValueError("b_gate_global_scale: per-expert global scales need grouped weights (offsets= or masked_m=)")
    e = b_gate.shape[0] if grouped else 1
    gs_g = _check_b_global_scale(b_gate_global_scale, b_gate, e, "b_gate_global_scale")
    gs_u = None if stacked else _check_b_global_scale(b_up_global_scale, b_up, e, "b_up_global_scale")
    if gs_g is not None and gs_u is not None and gs_g.shape != gs_u.shape:
        raise ValueError(
            f"b_up_global_scale: shape {tuple(gs_u.shape)} differs from b_gate_global_scale's {tuple(gs_g.shape)}"
        )
    if use_reference(b_gate.data):
        if explaining():
            m_rows = a.shape[0] * (a.shape[1] if masked else 1)
            emit(grouped_plan("swiglu", a, b_gate, fmt, rows, n, k, mode, e, out_dtype, config, b2=b_up,
                              rows=m_rows, stacked=stacked))
        with torch.no_grad():  # ScaledTensor fields are constants on every path
            y = _ref.swiglu(a, b_gate, b_up, offsets=offsets, masked_m=masked_m,
                            b_gate_global_scale=b_gate_global_scale, b_up_global_scale=b_up_global_scale)
        return reference_check(reference_result(y, out, out_dtype, masked_m), check_op, seg, mode, a)
    m_rows = a.shape[0] * (a.shape[1] if masked else 1)
    plan = grouped_plan("swiglu", a, b_gate, fmt, rows, n, k, mode, e, out_dtype, config, b2=b_up, rows=m_rows,
                        stacked=stacked)
    return launch(a, b_gate, gs_g, b_up, seg, out, out_dtype, mode, plan, b2_gs=gs_u, check_op=check_op)
