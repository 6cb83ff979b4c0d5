"""Public dense block-scaled GEMM: ``gemm(a, b)`` = ``dequantize(a) @ dequantize(b).T``.

Launcher only: validate, allocate, choose a config (``blockscaled.config``), launch the Triton
kernel (``kernels/triton/gemm.py``) or the dequantize + cuBLAS path. Registered as torch
custom ops in ``_custom_ops.py`` so torch.compile and CUDA graphs see one opaque op.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import triton
import triton.language as tl

from ..config.gemm import GemmConfig, choose_gemm_config
from ..formats import Format, get_format
from ..kernels.triton._mma import FORMAT_CODES
from ..kernels.triton.gemm import gemm_kernel, splitk_reduce_kernel
from ..tensor import ScaledTensor

__all__ = ["gemm", "OUT_DTYPES"]

OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_DENSE_DTYPES = (torch.bfloat16, torch.float16)


# --------------------------------------------------------------------------- validation
def _check_out_dtype(out_dtype) -> None:
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype: expected one of {[str(d) for d in OUT_DTYPES]}, got {out_dtype}")


def _flatten_rows(name: str, t: torch.Tensor) -> torch.Tensor:
    """``[..., X]`` -> ``[rows, X]`` as a view (never a copy)."""
    if t.ndim == 2:
        return t
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        raise ValueError(
            f"{name}: leading dimensions of shape {tuple(t.shape)} with strides {t.stride()} cannot be "
            f"flattened without a copy; call .contiguous() explicitly"
        ) from None


def _check_unit_k_stride(name: str, t: torch.Tensor) -> None:
    if t.numel() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{name}: the last (K) dimension must have stride 1, got strides {t.stride()} for shape "
            f"{tuple(t.shape)}; call .contiguous() explicitly"
        )


def validate_gemm_args(a, b, out_dtype, out):
    """Check ``gemm`` arguments; return (fmt, a_dense, lead_shape, M, N, K)."""
    _check_out_dtype(out_dtype)
    if not isinstance(b, ScaledTensor):
        raise TypeError(f"b: expected a ScaledTensor [N, K] (the quantized weight), got {type(b).__name__}")
    fmt = b.format
    if b.ndim != 2:
        raise ValueError(f"b: expected a 2-D ScaledTensor [N, K], got shape {tuple(b.shape)}")
    if b.block[1] != fmt.block_k:
        raise ValueError(f"b.block: expected (1 or 128, {fmt.block_k}) for {fmt.name}, got {b.block}")
    if isinstance(a, ScaledTensor):
        a_dense = False
        if a.format != fmt:
            raise ValueError(
                f"a.format: expected the format of b ({fmt.name}), got {a.format.name} "
                f"(both operands must use one format)"
            )
        if a.block != (1, fmt.block_k):
            raise ValueError(
                f"a.block: the activation operand must use 1x{fmt.block_k} blocks for {fmt.name}, got {a.block}"
            )
        if a.ndim < 1:
            raise ValueError(f"a: expected shape [..., K], got {tuple(a.shape)}")
        a_device = a.device
    elif isinstance(a, torch.Tensor):
        a_dense = True
        if a.dtype not in _DENSE_DTYPES:
            raise TypeError(
                f"a: a dense (weight-only) activation must be bf16 or fp16, got {a.dtype}; "
                f"quantize it to a ScaledTensor for a {fmt.name} x {fmt.name} GEMM"
            )
        if a.ndim < 1:
            raise ValueError(f"a: expected shape [..., K], got {tuple(a.shape)}")
        a_device = a.device
    else:
        raise TypeError(f"a: expected a ScaledTensor or a bf16/fp16 torch.Tensor, got {type(a).__name__}")
    if a_device != b.device:
        raise ValueError(f"a: on {a_device}, b on {b.device}; both operands must be on one device")
    k = a.shape[-1]
    if k != b.shape[-1]:
        raise ValueError(f"a: K mismatch: a has K={k} (shape {tuple(a.shape)}), b has K={b.shape[-1]} "
                         f"(shape {tuple(b.shape)})")
    lead = tuple(a.shape[:-1])
    m = math.prod(lead)
    n = b.shape[0]
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out: expected a torch.Tensor, got {type(out).__name__}")
        want = (*lead, n)
        if tuple(out.shape) != want:
            raise ValueError(f"out: expected shape {want}, got {tuple(out.shape)}")
        if out.dtype != out_dtype:
            raise TypeError(f"out: expected dtype {out_dtype} (out_dtype), got {out.dtype}")
        if out.device != b.device:
            raise ValueError(f"out: expected a tensor on {b.device}, got one on {out.device}")
        if not out.is_contiguous():
            raise ValueError(f"out: expected a contiguous tensor, got strides {out.stride()} for shape {tuple(out.shape)}")
    return fmt, a_dense, lead, m, n, k


def _check_config(cfg: GemmConfig, fmt: Format, a_dense: bool, a_dtype, promote: bool) -> None:
    sk = fmt.block_k
    if fmt.name == "fp8_block" and not promote:
        raise ValueError("config.promote: fp8_block needs promote=True (fp32 scales are not exact in bf16)")
    if promote and sk % cfg.block_k:
        raise ValueError(
            f"config.block_k: promote=True needs block_k dividing the {fmt.name} scale block {sk}, got {cfg.block_k}"
        )
    if promote and not a_dense and fmt.name == "nvfp4":
        raise ValueError("config.promote: nvfp4 x nvfp4 cannot promote (FP8 MMA needs K >= 32 per dot, "
                         "nvfp4 blocks are 16)")
    if not promote and a_dense and a_dtype == torch.float16:
        raise ValueError("config.promote: fp16 activations need promote=True (dequantized weights may "
                         "leave fp16's range)")


# --------------------------------------------------------------------------- launch
def _dot_dtype(promote: bool, a_dense: bool, a_dtype, interpret: bool):
    if promote and not a_dense:
        return tl.float8e4nv
    want = a_dtype if (promote and a_dense) else torch.bfloat16
    if want == torch.float16:
        return tl.float16
    # triton 3.6 interpreter: bf16 tl.dot is wrong; fp32 dot of the same exact values
    return tl.float32 if interpret else tl.bfloat16


def _launch_triton(a2, a_s2, a_gs, b, out2, bias, fmt: Format, a_dense: bool, m, n, k,
                   cfg: GemmConfig, promote: bool) -> None:
    interpret = out2.device.type == "cpu"
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    kiters = triton.cdiv(k, bk)
    split = max(1, min(cfg.split_k, kiters))
    k_per_split = triton.cdiv(kiters, split) * bk
    split = max(1, triton.cdiv(k, k_per_split)) if k else 1
    even_k = k % bk == 0
    b_fmt = FORMAT_CODES[fmt.name]
    a_fmt = FORMAT_CODES["dense"] if a_dense else b_fmt
    gs_b = b.global_scale if b.global_scale is not None else b.scale
    gs_a = a_gs if a_gs is not None else gs_b
    a_s = a_s2 if a_s2 is not None else b.scale  # dense A: never read
    bias_t = bias if bias is not None else out2
    if split == 1:
        c, scs, scm, scn = out2, 0, out2.stride(0), out2.stride(1)
    else:
        c = torch.empty((split, m, n), dtype=torch.float32, device=out2.device)
        scs, scm, scn = c.stride(0), c.stride(1), c.stride(2)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn), split)
    gemm_kernel[grid](
        a2, a_s, b.data, b.scale, gs_a, gs_b, bias_t, c,
        m, n, k, k_per_split,
        a2.stride(0), a2.stride(1), a_s.stride(0), a_s.stride(-1),
        b.data.stride(0), b.data.stride(1), b.scale.stride(0), b.scale.stride(1),
        scs, scm, scn,
        A_FMT=a_fmt, B_FMT=b_fmt, B_SCALE_ROWS=b.block[0], PROMOTE=promote,
        DOT_DTYPE=_dot_dtype(promote, a_dense, a2.dtype, interpret), EVEN_K=even_k,
        HAS_BIAS=(bias is not None and split == 1), SPLIT_K=split, GROUP_M=cfg.group_m,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if split > 1:
        rbm, rbn = 32, 128
        splitk_reduce_kernel[(triton.cdiv(m, rbm), triton.cdiv(n, rbn))](
            c, gs_a, gs_b, bias_t, out2, m, n,
            c.stride(0), c.stride(1), out2.stride(0), out2.stride(1),
            A_DENSE=a_dense, IS_NVFP4=fmt.has_global_scale, HAS_BIAS=bias is not None,
            SPLIT_K=split, BLOCK_M=rbm, BLOCK_N=rbn, num_warps=4,
        )


def _strip_global_scale(q: ScaledTensor) -> ScaledTensor:
    """nvfp4 operand with global scale 1 so its dequantization is exact in bf16
    (e2m1 * e4m3 has <= 6 significant bits); the global scales go to the output."""
    return dataclasses.replace(q, global_scale=torch.ones((), dtype=torch.float32, device=q.device))


def _dequant_matmul(a2, a_q, a_gs, b, out2, bias, fmt: Format, a_dense: bool, out_dtype) -> None:
    """dequantize operands (our Triton dequantize kernel) + torch.matmul (cuBLAS)."""
    from .quantize import dequantize  # runtime import: quantize owns the kernel

    if fmt.name == "fp8_block":
        # fp32 block scales: e4m3 * scale is not exact in 16 bits, so round the operands only
        # as far as the output will be rounded anyway (fp32 output -> fp32 operands).
        op_dtype = out_dtype
    elif a_dense:
        op_dtype = a2.dtype  # fp16: weights outside fp16's range would round (engines do the same)
    else:
        op_dtype = torch.bfloat16  # exact for MX/NV (see _mma docstring)
    bq = _strip_global_scale(b) if fmt.has_global_scale else b
    B = dequantize(bq, dtype=op_dtype)
    if a_dense:
        A = a2.to(op_dtype)
    else:
        aq = _strip_global_scale(a_q) if fmt.has_global_scale else a_q
        A = dequantize(aq, dtype=op_dtype).view(-1, a_q.shape[-1])
    if op_dtype == out_dtype:
        torch.mm(A, B.t(), out=out2)
    elif out2.device.type == "cuda" and op_dtype != torch.float32:
        try:  # cuBLAS 16-bit inputs, fp32 output (aten::mm.dtype, torch >= 2.8)
            res = torch.mm(A, B.t(), out_dtype=torch.float32)
        except (TypeError, RuntimeError, NotImplementedError):
            res = A.float() @ B.float().t()
        out2.copy_(res)
    else:
        out2.copy_(A.float() @ B.float().t())
    if fmt.has_global_scale:
        gs = b.global_scale if a_dense else a_gs * b.global_scale
        out2.mul_(1.0 / gs)  # device 0-d tensor: no host sync; one extra rounding for 16-bit out
    if bias is not None:
        out2.add_(bias)


def gemm_impl(a2, a_s2, a_gs, b: ScaledTensor, out2, bias, fmt: Format, a_dense: bool,
              cfg: GemmConfig | None, out_dtype, a_q: ScaledTensor | None = None) -> None:
    """Compute into ``out2 [M, N]`` (already allocated); ``a2 [M, K']``: A data (packed) or
    dense activations; ``a_s2 [M, nk]`` A scales (None when dense). No validation."""
    m, n = out2.shape
    k = b.shape[-1]
    if m == 0 or n == 0:
        return
    a_dtype = a2.dtype if a_dense else None
    if cfg is None:
        cfg = choose_gemm_config(fmt.name, m, n, k, out2.device, a_dtype=a_dtype, out_dtype=out_dtype)
    if cfg.strategy == "dequant_matmul":
        if a_q is None and not a_dense:
            a_q = ScaledTensor(a2, a_s2, fmt, torch.Size((m, k)), (1, fmt.block_k), b.rounding, a_gs)
        _dequant_matmul(a2, a_q, a_gs, b, out2, bias, fmt, a_dense, out_dtype)
        return
    from ..config.gemm import default_promote

    promote = cfg.promote if cfg.promote is not None else default_promote(fmt.name, m, a_dtype)
    _check_config(cfg, fmt, a_dense, a_dtype, promote)
    _launch_triton(a2, a_s2, a_gs, b, out2, bias, fmt, a_dense, m, n, k, cfg, promote)


def gemm(a, b: ScaledTensor, out_dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None,
         *, config: GemmConfig | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Block-scaled GEMM ``dequantize(a) @ dequantize(b).T`` with fp32 accumulation.

    Args:
        a: ``ScaledTensor [..., K]`` with 1 x block_k blocks (fp8_block 1x128, mxfp8/mxfp4 1x32,
            nvfp4 1x16), or a dense bf16/fp16 ``Tensor [..., K]`` (weight-only GEMM: W8A16 /
            W4A16). Leading dims must flatten to rows without a copy; K has stride 1.
        b: ``ScaledTensor [N, K]`` in the same format (fp8_block: 128x128 or 1x128 blocks).
        out_dtype: bf16 (default), fp16 or fp32.
        out: optional contiguous ``[..., N]`` tensor of ``out_dtype`` to write into.
        config: force a :class:`~blockscaled.config.GemmConfig` (tests, tuning); default:
            the analytic heuristic. A forced config runs eagerly (outside the custom op).
        bias: optional ``[N]`` tensor added in fp32 before the cast (used by ``linear``).

    Returns:
        ``[..., N]`` tensor of ``out_dtype`` (``out`` when given). nvfp4 applies
        ``1 / (gs_a * gs_b)`` (weight-only: ``1 / gs_b``) read from device memory.
        M = 0 returns an empty tensor without launching. No host synchronisation.
    """
    fmt, a_dense, lead, m, n, k = validate_gemm_args(a, b, out_dtype, out)
    _check_bias(bias, n, b.device)
    if a_dense:
        _check_unit_k_stride("a", a)
        a2, a_s2, a_gs = _flatten_rows("a", a), None, None
    else:
        _check_unit_k_stride("a.data", a.data)
        a2 = _flatten_rows("a.data", a.data)
        a_s2 = _flatten_rows("a.scale", a.scale)
        a_gs = a.global_scale
    _check_unit_k_stride("b.data", b.data)
    if m == 0 or n == 0:
        return out if out is not None else torch.empty((*lead, n), dtype=out_dtype, device=b.device)
    if config is not None:
        if not isinstance(config, GemmConfig):
            raise TypeError(f"config: expected a GemmConfig, got {type(config).__name__}")
        if out is None:
            out = torch.empty((*lead, n), dtype=out_dtype, device=b.device)
        gemm_impl(a2, a_s2, a_gs, b, out.view(m, n), bias, fmt, a_dense, config, out_dtype,
                  None if a_dense else a)
        return out
    from . import _custom_ops

    if out is None:
        return _custom_ops.gemm_op(a2, a_s2, a_gs, b, bias, out_dtype).view(*lead, n)
    _custom_ops.gemm_out_op(a2, a_s2, a_gs, b, out.view(m, n), bias)
    return out


def _check_bias(bias, n, device) -> None:
    if bias is None:
        return
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias: expected a torch.Tensor [N], got {type(bias).__name__}")
    if tuple(bias.shape) != (n,):
        raise ValueError(f"bias: expected shape ({n},), got {tuple(bias.shape)}")
    if bias.device != device:
        raise ValueError(f"bias: expected a tensor on {device}, got one on {bias.device}")
    if bias.dtype not in OUT_DTYPES:
        raise TypeError(f"bias: expected dtype bf16/fp16/fp32, got {bias.dtype}")
    if n > 1 and bias.stride(0) != 1:
        raise ValueError(f"bias: expected unit stride, got {bias.stride()}")
