"""Grouped (MoE) block-scaled GEMMs: contiguous, masked, and a list of independent groups.

``grouped_gemm(a, b, offsets=...)``   contiguous: ``A [sum_m, K]`` rows sorted by expert
``grouped_gemm(a, b, masked_m=...)``  masked: ``A [E, max_m, K]`` with per-expert row counts
``grouped_gemm_list(a_list, b_list)`` the GPU MODE NVFP4 group GEMM (own M, N, K per group)

All compute ``dequantize(a) @ dequantize(b).T`` per expert (float64 twins in
:mod:`blockscaled.reference.grouped`). Device-resident ``offsets`` / ``masked_m`` are never
read on the host on the hot path: the kernel maps tiles to experts itself, so the ops can be
captured in CUDA graphs and traced by ``torch.compile(fullgraph=True)`` (they are registered
as torch custom ops ``blockscaled::grouped_gemm``, ``blockscaled::grouped_gemm_out`` and
``blockscaled::grouped_gemm_list``).

The kernel choice is made once per call and run as is: eager calls hand the config object to
the implementation (``grouped_impl``) directly, skipping the torch.library round trip
(``gemm._eager_ok``: not compiling or tracing, no dispatch mode, plain tensors); under
torch.compile / tracing the custom ops carry it whole as one ``cfg: list[int]``
(``plan/encoding.py``) and decode it before the same implementation.
"""

from __future__ import annotations

import torch
import triton.language as tl

from .. import _checks
from .._checks import check_config_arg, check_flag, check_out_no_grad, check_row_contiguous, check_tensor, use_reference
from ..config.gemm import GemmConfig
from ..config.hopper import HopperConfig
from ..plan import Plan, Problem, device_info, log_plan
from ..plan.encoding import decode_plan, encode_plan
from ..plan.grouped import plan_grouped, stacked_swiglu_plan
from ..plan.grouped_portable import choose_grouped_config
from ..formats import get_format
from ..kernels.triton._mma import FORMAT_CODES
from ..kernels.triton.grouped import grouped_gemm_kernel
from ..reference import grouped as _ref
from ..tensor import ScaledTensor
from ._autograd import requires_grad_name
from ._explain import emit, explaining
from .errors import CALLER_CHECKS, OP_GROUPED_GEMM, check_metadata, check_metadata_host
from . import _hopper
from ._stream import words_aligned
from .gemm import _DTYPE_NAMES, _cdiv, _dequant, _eager_ok, _one
from .quantize import _pow2  # (host arithmetic, not triton's constexpr functions: ~2-5 us a call)
from .gemm import gemm as _dense_gemm
from ._launch import fast
from ._grouped_mx import _FMT_BY_CODE, MX_STRATEGIES, epilogue, mx_grouped, split_swiglu, stacked_swiglu

__all__ = ["grouped_gemm"]

_OUT_DTYPES = _checks.OUT_DTYPES
_TL_OUT = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}

MODE_DENSE, MODE_CONTIGUOUS, MODE_MASKED = 0, 1, 2
_GROUPING_NAMES = ("dense", "contiguous", "masked")


def _dot_dtype(promote: bool, device: torch.device, a_dense_dtype: torch.dtype | None = None):
    """FP8 dot for promoted chunks of quantized A; A's dtype for promoted weight-only chunks (raw
    e4m3/e2m1 values are exact in fp16/bf16); bf16 for dequantized tiles on GPUs. In the
    interpreter bf16 becomes fp32 (triton 3.6's interpreter returns garbage for bf16 dots; the
    products are exact either way). Same rule as ``blockscaled.ops.gemm``."""
    if promote and a_dense_dtype is None:
        return tl.float8e4nv
    want = a_dense_dtype if promote else torch.bfloat16
    if want == torch.float16:
        return tl.float16
    return tl.float32 if device.type == "cpu" else tl.bfloat16


# --------------------------------------------------------------------------- custom op
def _launch_impl(
    a_data, a_scale, a_gs, b_data, b_scale, b_gs, b2_data, b2_scale, b2_gs, seg, out,
    fmt_id, mode, k, b_br, cfg: GemmConfig,
) -> None:
    """Launch :func:`grouped_gemm_kernel` into ``out`` with the tiles of ``cfg`` (strategy
    "triton", ``promote`` resolved; all validation done by the callers).

    dense: a ``[M, Kp]``, b ``[N, Kp]``, out ``[M, N]``; contiguous: a ``[sum_m, Kp]``,
    b ``[E, N, Kp]``, seg = offsets ``[E+1]``, out ``[sum_m, N]``; masked: a ``[E, max_m, Kp]``,
    seg = counts ``[E]``, out ``[E, max_m, N]``. ``b2_*`` given: fused SwiGLU (DUAL)."""
    promote, block_m, block_n, block_k = cfg.promote, cfg.block_m, cfg.block_n, cfg.block_k
    dual = b2_data is not None
    a_dense = a_scale is None  # weight-only: bf16 / fp16 activations
    a_s = a_data if a_dense else a_scale  # strides only; never read when a_dense
    if mode == MODE_MASKED:
        e, m = a_data.shape[0], a_data.shape[1]
        s_ae, s_am = a_data.stride(0), a_data.stride(1)
        s_ase, s_asm = a_s.stride(0), a_s.stride(1)
        s_ce, s_cm = out.stride(0), out.stride(1)
    else:
        m = a_data.shape[0]
        e = 1 if mode == MODE_DENSE else b_data.shape[0]
        s_ae, s_am = 0, a_data.stride(0)
        s_ase, s_asm = 0, a_s.stride(0)
        s_ce, s_cm = 0, out.stride(0)
    if mode == MODE_DENSE:
        n = b_data.shape[0]
        s_be, s_bn, s_bse, s_bsn = 0, b_data.stride(0), 0, b_scale.stride(0)
    else:
        n = b_data.shape[1]
        s_be, s_bn, s_bse, s_bsn = b_data.stride(0), b_data.stride(1), b_scale.stride(0), b_scale.stride(1)
    if m == 0 or n == 0 or e == 0:
        return
    if mode == MODE_CONTIGUOUS:
        m_tiles = (m + e * (block_m - 1)) // block_m  # worst case of sum_e ceil(m_e / BM)
        grid = (m_tiles, _cdiv(n, block_n), 1)
    elif mode == MODE_MASKED:
        grid = (_cdiv(m, block_m), _cdiv(n, block_n), e)
    else:
        grid = (_cdiv(m, block_m), _cdiv(n, block_n), 1)
    # Pointers the kernel never dereferences in this specialisation (global scales outside
    # nvfp4, seg in dense mode) get ``out``: no allocation, nothing extra in a captured graph.
    dummy = out
    gsb_per_expert = b_gs is not None and b_gs.numel() > 1
    fast(grouped_gemm_kernel)[grid](
        a_data, a_s, b_data, b_scale,
        b2_data if dual else b_data, b2_scale if dual else b_scale, out,
        dummy if a_gs is None else a_gs, dummy if b_gs is None else b_gs,
        (b2_gs if b2_gs is not None else (dummy if b_gs is None else b_gs)),
        dummy if seg is None else seg,
        m, n, k, e,
        s_ae, s_am, s_ase, s_asm, s_be, s_bn, s_bse, s_bsn, s_ce, s_cm,
        FMT=fmt_id, A_DENSE=a_dense, B_BR=b_br, MODE=mode, DUAL=dual, GSB_PER_EXPERT=gsb_per_expert,
        E_POW2=max(16, _pow2(e)),
        PROMOTE=promote, DOT_DTYPE=_dot_dtype(promote, out.device, a_data.dtype if a_dense else None),
        EVEN_K=(k % block_k == 0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


# --------------------------------------------------------------------------- dequantize + cuBLAS
# The 0-d fp32 one (``_one``) and the internal dequantize entry (``_dequant``) are the dense
# GEMM's (ops/gemm.py): the same cached tensor and the same single call into ops/quantize.py.


#: aten::bmm.dtype (bf16 x bf16 -> fp32 in cuBLAS, torch >= 2.8); flipped off at the first failure.
_BMM_FP32_OUT = [True]


def _bmm(a3: torch.Tensor, b3: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``a3 [E, M, K] @ b3[E, N, K].T`` (bf16 operands), fp32 accumulation, stored as ``dtype``
    (bf16 or fp32). CPU (the interpreter): fp32 math, one rounding: the same numerics."""
    if a3.device.type == "cuda":
        bt = b3.transpose(1, 2)
        if dtype == a3.dtype:
            return torch.bmm(a3, bt)
        if _BMM_FP32_OUT[0]:
            try:
                return torch.bmm(a3, bt, out_dtype=torch.float32)
            except (TypeError, RuntimeError, NotImplementedError) as ex:
                _BMM_FP32_OUT[0] = False
                import warnings

                warnings.warn(f"torch.bmm(out_dtype=float32) failed ({ex}); the dequant_matmul strategy "
                              f"falls back to fp32 bmm (exact but much slower)", RuntimeWarning, stacklevel=2)
    return torch.bmm(a3.float(), b3.float().transpose(1, 2)).to(dtype)


def _grouped_mm(a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Contiguous grouped ``a [S, K] @ b[e].T`` per segment, bf16 in and out (fp32 accumulation).
    ``ends``: int32 ``[E]`` non-decreasing segment ends on the device, in ``[0, S]``.
    CUDA: ``torch._grouped_mm`` (one CUTLASS launch on sm_90, segment sizes read on the device).
    CPU (the interpreter only; a host loop is harmless there): per-expert fp32 matmuls."""
    if a.device.type == "cuda":
        return torch._grouped_mm(a, b.transpose(-2, -1), offs=ends)
    y = torch.zeros(a.shape[0], b.shape[1], dtype=torch.bfloat16)
    lo = 0
    for ex, hi in enumerate(ends.tolist()):
        if hi > lo:
            y[lo:hi] = (a[lo:hi].float() @ b[ex].float().T).to(torch.bfloat16)
        lo = max(lo, hi)
    return y


def _dequant_matmul(a_data, a_scale, a_gs, b_data, b_scale, b_gs, b2_data, b2_scale, b2_gs, seg, out,
                    out_dtype, fmt_id: int, mode: int, k: int, b_br: int) -> torch.Tensor:
    """The ``dequant_matmul`` strategy (config/grouped.py): dequantize to bf16 with our Triton
    kernel, multiply with cuBLAS, finish in ``dq_epilogue_kernel`` when needed. Returns the
    result (``out`` when given). Arguments as :func:`_launch_impl`; eligibility (formats,
    dtypes, strides) was checked by the config. No host synchronisation on CUDA.

    Operands: quantized A is exact in bf16 (e4m3 / e2m1 times a power of two or an e4m3
    scale: <= 7 significant bits; nvfp4 with a unit global scale), bf16 weight-only A is used
    as is, B is exact for MX / nvfp4 (unit global scale) and rounded once for fp8_block.
    Products (fp32 accumulation in cuBLAS):

    * contiguous: ``torch._grouped_mm`` -> bf16 (its only sync-free output dtype). nvfp4 with
      one B global scale: B carries ``1 / (gs_a gs_b)`` (one bf16 rounding per B element, as
      the dense GEMM does), no epilogue; per-expert scales: exact B, the epilogue multiplies
      by ``1 / (gs_a gs_b[e])`` (a second rounding of the bf16 product). SwiGLU: both products
      are bf16 before the fp32 activation (the portable kernel keeps them in fp32; the extra
      roundings stay within the bf16 tolerance row, and only bf16 outputs are allowed).
    * masked GEMM, bf16 out: ``torch.bmm`` -> bf16 (nvfp4: one B global scale folded into B
      as above; per-expert scales applied by the epilogue as above); returned as is when
      ``out`` is None and nothing is left to apply (rows past ``masked_m`` then hold products
      of the padding rows: unspecified, as documented), else written into ``out`` by the
      epilogue for rows below the counts only (one extra pass over the output).
    * masked / dense SwiGLU, bf16 out: ``torch.bmm`` -> bf16 products, activation in fp32 in
      the epilogue (as contiguous: two extra bf16 roundings, within the bf16 tolerance row).
    * other outputs (fp16 / fp32), masked GEMM and masked / dense SwiGLU: ``torch.bmm`` ->
      fp32, then the epilogue applies ``1 / (gs_a gs_b[e])`` and the activation in fp32 and
      casts once: the portable kernel's numerics (only the summation order differs).
    """
    fmt = get_format(_FMT_BY_CODE[fmt_id])
    dev = a_data.device
    a_dense = a_scale is None
    dual = b2_data is not None
    nv = fmt.has_global_scale
    shape = _out_shape(a_data, b_data, mode)
    n = b_data.shape[-2]
    e = 1 if mode == MODE_DENSE else b_data.shape[0]
    rows = a_data.shape[0] if mode != MODE_MASKED else a_data.shape[1]
    if out is None:
        alloc = lambda: torch.empty(shape, dtype=out_dtype, device=dev)  # noqa: E731
    else:
        alloc = lambda: out  # noqa: E731
    if rows == 0 or n == 0 or e == 0 or a_data.shape[0] == 0:
        return alloc()
    one = _one(dev) if nv else None
    per_expert = nv and b_gs.numel() > 1
    # bf16 products for bf16 outputs (and always for contiguous: _grouped_mm's only output):
    # fp32 products would double the bytes the products and the epilogue move (dense SwiGLU
    # mxfp4 weight-only, H100 M=4096 N=2048 K=7168: 0.392 ms with fp32 products vs 0.372 for
    # dequantize + bf16 matmuls + torch silu * mul in bf16). Not for a non-contiguous nvfp4
    # SwiGLU: with the global scale folded into bf16 B as well, masked 4x256x512 measured
    # rel_fro 4.35e-3 > the bf16 row's 4e-3 (H100), so its products stay fp32 (B exact).
    prods16 = mode == MODE_CONTIGUOUS or (out_dtype == torch.bfloat16 and not (dual and nv))
    fold = nv and prods16 and not per_expert

    def gs_ab(gsb):  # A's and B's nvfp4 global scales together (0-d or [E])
        return gsb if a_dense else a_gs * gsb

    bshape = (*b_data.shape[:-1], k)

    def weights(data, scale, gsb):
        return _dequant(data, scale, (gs_ab(gsb) if fold else one) if nv else None, fmt, bshape, b_br,
                        torch.bfloat16)

    A = a_data if a_dense else _dequant(a_data, a_scale, one, fmt, (*a_data.shape[:-1], k), 1, torch.bfloat16)
    B = weights(b_data, b_scale, b_gs)
    B2 = weights(b2_data, b2_scale, b2_gs) if dual else None
    post = torch.reciprocal(gs_ab(b_gs)) if nv and not fold else None
    post2 = torch.reciprocal(gs_ab(b2_gs)) if dual and post is not None else None
    if mode == MODE_CONTIGUOUS:
        # segment ends in [0, S], non-decreasing: unvalidated bad offsets give wrong rows but
        # never out-of-bounds reads (the Triton kernel clamps the same way)
        ends = torch.cummax(seg[1:].clamp(0, a_data.shape[0]), 0).values.to(torch.int32)
        Y = _grouped_mm(A, B, ends)
        Y2 = _grouped_mm(A, B2, ends) if dual else None
        seg_k = ends
    else:
        a3 = A if mode == MODE_MASKED else A.unsqueeze(0)
        pdt = torch.bfloat16 if prods16 else torch.float32
        Y = _bmm(a3, B if mode == MODE_MASKED else B.unsqueeze(0), pdt)
        Y2 = _bmm(a3, B2 if mode == MODE_MASKED else B2.unsqueeze(0), pdt) if dual else None
        seg_k = seg
    if not dual and post is None and Y.dtype == out_dtype and (out is None or mode != MODE_MASKED):
        if mode == MODE_DENSE:
            Y = Y[0]
        if out is None:
            return Y
        out.copy_(Y)
        return out
    res = alloc()
    epilogue(Y, Y2, res, seg_k, post, post2, mode, e)
    return res


def _out_shape(a_data: torch.Tensor, b_data: torch.Tensor, mode: int) -> tuple[int, ...]:
    n = b_data.shape[-2]
    if mode == MODE_MASKED:
        return (a_data.shape[0], a_data.shape[1], n)
    return (a_data.shape[0], n)


# The kernel choice: a GemmConfig (strategy "triton": the portable kernel; "dequant_matmul":
# dequantize + cuBLAS, ``_dequant_matmul``) or a HopperConfig (the sm_90a Gluon wide kernel,
# ``ops._hopper.grouped_fp8_block_hopper_impl``; fp8_block x 128x128 weights, checked by
# ``hopper_reason`` before it is chosen). It is made once by the public functions and run as is:
# eager calls pass the object to ``grouped_impl``, the custom ops carry it whole as one
# ``cfg: list[int]`` (``plan/encoding.py``) and decode it before the same ``grouped_impl``.
def grouped_impl(a_data, a_scale, a_gs, b_data, b_scale, b_gs, b2_data, b2_scale, b2_gs, seg, out, out_dtype,
                 fmt_id: int, grouping: int, k: int, b_br: int, cfg, check_op: int = 0) -> torch.Tensor:
    """Run the grouped GEMM (SwiGLU with ``b2_*``) with exactly ``cfg`` and return the output
    (``out`` when given, else a new ``out_dtype`` tensor). Arguments validated by the callers;
    the eager fast path of :func:`launch` and both custom ops call this.

    ``a_scale`` None: weight-only (``a_data`` bf16/fp16). ``grouping``: 0 dense (SwiGLU only),
    1 contiguous (``seg`` = offsets ``[E+1]``), 2 masked (``seg`` = counts ``[E]``).
    ``check_op``: 0, or ``ops.errors.OP_*``: after the GEMM, check the values of ``seg`` on the
    device (bad ones: NaN over the output plus the sticky flag read by ``blockscaled.check_errors``)."""
    if isinstance(cfg, Plan):
        if cfg.op == "swiglu" and b2_data is None:  # plan/grouped.py stacked_swiglu_plan
            return _stacked_impl(a_data, a_scale, a_gs, b_data, b_scale, b_gs, seg, out, out_dtype, fmt_id, grouping,
                                 k, b_br, cfg.config, check_op)
        cfg = cfg.config
    if isinstance(cfg, HopperConfig):
        if out is None:
            out = torch.empty(_out_shape(a_data, b_data, grouping), dtype=out_dtype, device=a_data.device)
        if not _hopper.grouped_fp8_block_hopper_impl(a_data, a_scale, b_data, b_scale, seg, grouping, out, cfg,
                                                     b2_data, b2_scale):
            # the Gluon kernels cannot be built here, or a plan made while tracing met a
            # misaligned base: the portable kernel's tiles for the same call
            n = b_data.shape[-2]
            e = 1 if grouping == MODE_DENSE else b_data.shape[0]
            rows = a_data.shape[1] if grouping == MODE_MASKED else a_data.shape[0] / max(e, 1)
            cfg = choose_grouped_config("fp8_block", rows, n, k, out.device, dual=b2_data is not None,
                                        grouping=_GROUPING_NAMES[grouping], experts=e, allow_dequant=False)
            _launch_impl(a_data, a_scale, None, b_data, b_scale, None, b2_data, b2_scale, None, seg, out,
                         fmt_id, grouping, k, b_br, cfg)
    elif cfg.strategy == "dequant_matmul":
        out = _dequant_matmul(a_data, a_scale, a_gs, b_data, b_scale, b_gs, b2_data, b2_scale, b2_gs, seg, out,
                              out_dtype, fmt_id, grouping, k, b_br)
    elif cfg.strategy in MX_STRATEGIES:
        shape = _out_shape(a_data, b_data, grouping)
        if b2_data is None:
            if out is None:
                out = torch.empty(shape, dtype=out_dtype, device=a_data.device)
            mx_grouped(a_data, a_scale, a_gs, ((b_data, b_scale, b_gs, out),), seg, fmt_id, grouping, k, cfg)
        else:  # SwiGLU split (plan/grouped.py ``_split_swiglu_plan``)
            if out is None:
                out = torch.empty(shape, dtype=out_dtype, device=a_data.device)
            split_swiglu(a_data, a_scale, a_gs, (b_data, b_scale, b_gs), (b2_data, b2_scale, b2_gs), seg, out,
                          fmt_id, grouping, k, cfg)
    elif cfg.strategy == "triton":
        if out is None:
            out = torch.empty(_out_shape(a_data, b_data, grouping), dtype=out_dtype, device=a_data.device)
        _launch_impl(a_data, a_scale, a_gs, b_data, b_scale, b_gs, b2_data, b2_scale, b2_gs, seg, out,
                     fmt_id, grouping, k, b_br, cfg)
    else:
        raise ValueError(f"cfg.strategy: the grouped ops run 'triton', 'dequant_matmul', 'stream', 'direct', 'tiled' or a "
                         f"HopperConfig, "
                         f"got {cfg.strategy!r}")
    _device_check(check_op, seg, out, a_data, grouping)
    return out


def _stacked_impl(a_data, a_scale, a_gs, b_data, b_scale, b_gs, seg, out, out_dtype, fmt_id: int, grouping: int,
                  k: int, b_br: int, cfg, check_op: int) -> torch.Tensor:
    """A SwiGLU on one stacked ``[E, 2N, K']`` gate_up weight: ``cfg``'s grouped GEMM into fp32
    products ``[.., 2N]`` and the activation pass over their halves (``_grouped_mx.stacked_swiglu``)."""
    shape = _out_shape(a_data, b_data, grouping)
    shape = (*shape[:-1], shape[-1] // 2)
    if out is None:
        out = torch.empty(shape, dtype=out_dtype, device=a_data.device)

    def gemm(a_c, s_c, d, sc, gs, seg_c, prods):
        grouped_impl(a_c, s_c, a_gs, d, sc, gs, None, None, None, seg_c, prods, torch.float32, fmt_id, grouping, k,
                     b_br, cfg)

    stacked_swiglu(gemm, a_data, a_scale, b_data, b_scale, b_gs, seg, out, grouping)
    _device_check(check_op, seg, out, a_data, grouping)
    return out


# Two custom ops (namespace ``blockscaled``), ``grouped_impl`` behind both:
#   grouped_gemm_out(a_data, a_scale?, a_gs?, b_data, b_scale, b_gs?, b2_data?, b2_scale?, b2_gs?,
#                    seg?, out!, fmt_id, grouping, k, b_block_rows, cfg: int[], check_op=0) -> ()
#   grouped_gemm(..., same without out, plus out_dtype) -> Tensor   allocates the output
# ``cfg``: encode_plan(the plan): op, backend and every field of its config.
@torch.library.custom_op("blockscaled::grouped_gemm_out", mutates_args=("out",))
def _grouped_out_op(
    a_data: torch.Tensor, a_scale: torch.Tensor | None, a_gs: torch.Tensor | None,
    b_data: torch.Tensor, b_scale: torch.Tensor, b_gs: torch.Tensor | None,
    b2_data: torch.Tensor | None, b2_scale: torch.Tensor | None, b2_gs: torch.Tensor | None,
    seg: torch.Tensor | None, out: torch.Tensor,
    fmt_id: int, grouping: int, k: int, b_br: int, cfg: list[int], check_op: int = 0,
) -> None:
    grouped_impl(a_data, a_scale, a_gs, b_data, b_scale, b_gs, b2_data, b2_scale, b2_gs, seg, out, out.dtype,
                 fmt_id, grouping, k, b_br, decode_plan(cfg), check_op)


@_grouped_out_op.register_fake
def _grouped_out_fake(*args, **kwargs) -> None:
    return None


@torch.library.custom_op("blockscaled::grouped_gemm", mutates_args=())
def _grouped_op(
    a_data: torch.Tensor, a_scale: torch.Tensor | None, a_gs: torch.Tensor | None,
    b_data: torch.Tensor, b_scale: torch.Tensor, b_gs: torch.Tensor | None,
    b2_data: torch.Tensor | None, b2_scale: torch.Tensor | None, b2_gs: torch.Tensor | None,
    seg: torch.Tensor | None, out_dtype: torch.dtype,
    fmt_id: int, grouping: int, k: int, b_br: int, cfg: list[int], check_op: int = 0,
) -> torch.Tensor:
    return grouped_impl(a_data, a_scale, a_gs, b_data, b_scale, b_gs, b2_data, b2_scale, b2_gs, seg, None,
                        out_dtype, fmt_id, grouping, k, b_br, decode_plan(cfg), check_op)


def _device_check(check_op: int, seg, out: torch.Tensor, a_data: torch.Tensor, grouping: int) -> None:
    """After the GEMM, on the same stream: the device check of the metadata values
    (``ops/errors.py``: NaN over ``out`` and a sticky flag when they are bad; no host sync).
    ``check_op`` 0: the caller validated them on the host (``validate=True``) or has none."""
    if check_op and seg is not None and grouping != MODE_DENSE:
        limit = a_data.shape[1] if grouping == MODE_MASKED else a_data.shape[0]
        check_metadata(seg, out, check_op, grouping, limit)


@_grouped_op.register_fake
def _grouped_fake(a_data, a_scale, a_gs, b_data, b_scale, b_gs, b2_data, b2_scale, b2_gs, seg, out_dtype,
                  fmt_id, grouping, k, b_br, cfg, *args, **kwargs) -> torch.Tensor:
    shape = _out_shape(a_data, b_data, grouping)
    if b2_data is None and decode_plan(cfg).op == "swiglu":  # a stacked gate_up weight: N = rows / 2
        shape = (*shape[:-1], shape[-1] // 2)
    return a_data.new_empty(shape, dtype=out_dtype)


def launch(a, b: ScaledTensor, b_gs, b2: ScaledTensor | None, seg, out, out_dtype,
           mode: int, plan: Plan, b2_gs=None, check_op: int = 0) -> torch.Tensor:
    """Run ``plan`` (validated args; under ``blockscaled.explain``: hand it back instead): eagerly through :func:`grouped_impl` itself, or, while
    compiling / tracing / under a dispatch mode (``gemm._eager_ok``), through the functional op
    (``out is None``) or the destination-passing one. Reason for the eager path: the
    torch.library round trip dominated the host time of a call (H100 host, fp8_block E=8 m=64
    N=4096 K=7168 through the op: ~450 us of host time per call for ~92 us of GPU time, most of
    it in torch/_library/custom_ops.py under cProfile; benchmarks/NOTES.md 2026-11-25, "Eager host cost of grouped calls").
    ``a``: ScaledTensor or a bf16/fp16 Tensor (weight-only).
    ``b_gs`` / ``b2_gs``: nvfp4 B global scales, 1 element or one per expert (both alike).
    ``check_op``: ``ops.errors.OP_*`` to check ``seg`` on the device after the GEMM, 0: no check."""
    if explaining():
        emit(plan)
    log_plan(plan)
    fmt_id = FORMAT_CODES[b.format.name]
    k = b.shape[-1]
    b2_args = (None, None, None) if b2 is None else (b2.data, b2.scale, b2.global_scale if b2_gs is None else b2_gs)
    if isinstance(a, ScaledTensor):
        a_args = (a.data, a.scale, a.global_scale)
    else:
        a_args = (a, None, None)
    head = (*a_args, b.data, b.scale, b_gs, *b2_args, seg)
    if _eager_ok(*(t for t in (a_args[0], b.data, seg, out) if t is not None)):
        return grouped_impl(*head, out, out_dtype, fmt_id, mode, k, b.block[0], plan, check_op)
    tail = (fmt_id, mode, k, b.block[0], encode_plan(plan), check_op)
    if out is None:
        return torch.ops.blockscaled.grouped_gemm(*head, out_dtype, *tail)
    torch.ops.blockscaled.grouped_gemm_out(*head, out, *tail)
    return out


# --------------------------------------------------------------------------- validation
def _check_scaled(name: str, t, ndim: int) -> None:
    if not isinstance(t, ScaledTensor):
        raise TypeError(f"{name}: expected a blockscaled.ScaledTensor, got {type(t).__name__}")
    if t.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D ScaledTensor, got shape {tuple(t.shape)}")
    check_row_contiguous(f"{name}.data", t.data)
    if t.scale.numel() and t.scale.stride(-1) != 1 and t.scale.shape[-1] != 1:
        raise ValueError(f"{name}.scale: the last dimension must have stride 1, got strides {t.scale.stride()}")


_DENSE_A_DTYPES = (torch.bfloat16, torch.float16)


def check_a(a, ndim: int, name: str = "a") -> None:
    """A: a ScaledTensor with 1 x block_k activation blocks, or a bf16 / fp16 Tensor
    (weight-only), ``ndim`` dimensions, unit stride along K."""
    if isinstance(a, torch.Tensor):
        if a.dtype not in _DENSE_A_DTYPES:
            raise TypeError(
                f"{name}: expected a blockscaled.ScaledTensor, or a bf16/fp16 Tensor for weight-only, "
                f"got a Tensor of dtype {a.dtype} (quantize it first)"
            )
        check_tensor(name, a, ndim=ndim)
        check_row_contiguous(name, a)
        return
    if not isinstance(a, ScaledTensor):
        raise TypeError(f"{name}: expected a blockscaled.ScaledTensor or a bf16/fp16 Tensor, got {type(a).__name__}")
    _check_scaled(name, a, ndim)
    if a.block[0] != 1:
        raise ValueError(f"{name}: expected 1x{a.format.block_k} activation blocks, got block {a.block}")


def check_pair(a, b: ScaledTensor, a_name: str = "a", b_name: str = "b") -> None:
    """Same format (unless ``a`` is a dense weight-only Tensor), same K, same device."""
    if isinstance(a, ScaledTensor) and a.format != b.format:
        raise ValueError(
            f"{b_name}: format mismatch: {a_name} is {a.format.name}, {b_name} is {b.format.name} "
            f"(both operands must use the same block-scaled format)"
        )
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(
            f"{b_name}: K mismatch: {a_name} has K={a.shape[-1]} (shape {tuple(a.shape)}), "
            f"{b_name} has K={b.shape[-1]} (shape {tuple(b.shape)})"
        )
    if a.device != b.device:
        raise ValueError(f"{b_name}: on {b.device}, {a_name} on {a.device}")


def _check_out(out, shape, dtype, device) -> None:
    check_tensor("out", out, dtypes=(dtype,), device=device)
    check_out_no_grad(out)
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out: expected shape {tuple(shape)}, got {tuple(out.shape)}")
    if out.numel() and out.stride(-1) != 1:
        raise ValueError(f"out: the last dimension must have stride 1, got strides {out.stride()}")


def _check_out_dtype(out_dtype) -> None:
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"out_dtype: expected one of {[str(d) for d in _OUT_DTYPES]}, got {out_dtype}")


def _resolve_validate(validate, device: torch.device) -> bool:
    """Default: validate values on the host on CPU (the interpreter; nothing to lose), not on
    CUDA (a sync) and never while torch.compile traces (the values are not known at trace
    time). Not validated on the host means checked on the device after the GEMM (NaN output +
    flag for ``blockscaled.check_errors``; ``ops/errors.py``)."""
    if validate is None:
        return device.type == "cpu" and not torch.compiler.is_compiling()
    if validate is CALLER_CHECKS:
        return False
    check_flag("validate", validate, allow_none=True)  # a truthy string used to pass silently
    return validate


def _check_b_global_scale(b_global_scale, b: ScaledTensor, e: int, name: str = "b_global_scale"):
    """Per-expert nvfp4 B global scales: fp32 ``[E]`` on b's device (None: ``b.global_scale``)."""
    if b_global_scale is None:
        return b.global_scale
    if not b.format.has_global_scale:
        raise ValueError(f"{name}: {b.format.name} has no global scale")
    check_tensor(name, b_global_scale, dtypes=(torch.float32,), device=b.device)
    if tuple(b_global_scale.shape) not in ((e,), ()):
        raise ValueError(f"{name}: expected shape ({e},) (one per expert) or (), got {tuple(b_global_scale.shape)}")
    if b_global_scale.numel() > 1 and b_global_scale.stride(0) != 1:
        raise ValueError(f"{name}: expected stride 1, got {b_global_scale.stride()}")
    # values as quantize checks them (finite, > 0) where reading them costs no sync; on CUDA a
    # bad scale gives NaN / inf outputs, which are loud
    if b_global_scale.device.type == "cpu":
        bad = ~(torch.isfinite(b_global_scale) & (b_global_scale > 0)).reshape(-1)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise ValueError(f"{name}: expected finite values > 0, got {b_global_scale.reshape(-1)[i].item()!r} "
                             f"at index {i}")
    return b_global_scale


def check_offsets(offsets, e: int, sum_m: int, device, validate: bool) -> None:
    """offsets: int32 ``[E+1]`` on the operands' device. With ``validate`` also the values
    (a host sync): ``offsets[0] == 0``, non-decreasing, ``offsets[E] == sum_m``."""
    check_tensor("offsets", offsets, dtypes=(torch.int32,), ndim=1, device=device)
    if offsets.shape[0] != e + 1:
        raise ValueError(f"offsets: expected shape ({e + 1},) for E={e} experts, got {tuple(offsets.shape)}")
    if offsets.numel() > 1 and offsets.stride(0) != 1:
        raise ValueError(f"offsets: expected a contiguous tensor, got strides {offsets.stride()}")
    if validate:
        v = offsets.cpu().tolist()
        if v[0] != 0:
            raise ValueError(f"offsets: offsets[0] must be 0, got {v[0]}")
        bad = [i for i in range(e) if v[i + 1] < v[i]]
        if bad:
            i = bad[0]
            raise ValueError(f"offsets: must be non-decreasing, got offsets[{i}]={v[i]} > offsets[{i + 1}]={v[i + 1]}")
        if v[e] != sum_m:
            raise ValueError(f"offsets: offsets[E]={v[e]} must equal the number of rows of a ({sum_m})")


def check_masked_m(masked_m, e: int, max_m: int, device, validate: bool) -> None:
    """masked_m: int32 ``[E]`` on the operands' device; with ``validate`` ``0 <= masked_m <= max_m``."""
    check_tensor("masked_m", masked_m, dtypes=(torch.int32,), ndim=1, device=device)
    if masked_m.shape[0] != e:
        raise ValueError(f"masked_m: expected shape ({e},) for E={e} experts, got {tuple(masked_m.shape)}")
    if masked_m.numel() > 1 and masked_m.stride(0) != 1:
        raise ValueError(f"masked_m: expected a contiguous tensor, got strides {masked_m.stride()}")
    if validate:
        v = masked_m.cpu().tolist()
        for i, c in enumerate(v):
            if c < 0 or c > max_m:
                raise ValueError(f"masked_m: counts must lie in [0, max_m={max_m}], got masked_m[{i}]={c}")


def grouped_plan(op: str, a, b: ScaledTensor, fmt: str, rows_per_expert: float, n: int, k: int, mode: int,
                 experts: int, out_dtype: torch.dtype, config=None, b2: ScaledTensor | None = None,
                 rows: int | None = None, stacked: bool = False) -> Plan:
    """The plan of a grouped / SwiGLU call (validated arguments): its Problem from the operands,
    then ``plan.grouped.plan_grouped``. ``rows``: all rows of A (default: its first dims).
    ``stacked`` (a SwiGLU on one ``[E, 2N, K]`` gate_up weight ``b``, ``n`` = N): the plan of the
    grouped GEMM over all 2N rows with fp32 output, as the SwiGLU's (plan/grouped.py
    ``stacked_swiglu_plan``)."""
    if stacked:
        single = grouped_plan("grouped", a, b, fmt, rows_per_expert, 2 * n, k, mode, experts, torch.float32, config,
                              rows=rows)
        # the wrapper once per cached projection plan (by identity: a replaced one is wrapped again)
        if config is not None:  # the projection's plan is made anew per call: nothing to keep
            return stacked_swiglu_plan(single, _DTYPE_NAMES[out_dtype])
        hit = _STACKED.get((id(single), out_dtype))
        if hit is None or hit[0] is not single:
            if len(_STACKED) >= 4096:
                _STACKED.clear()
            hit = _STACKED[(id(single), out_dtype)] = (single, stacked_swiglu_plan(single, _DTYPE_NAMES[out_dtype]))
        return hit[1]
    dev = b.data.device
    a_dtype = a.dtype if isinstance(a, torch.Tensor) else None
    a_t = a if isinstance(a, torch.Tensor) else a.data
    a_row_stride = a_t.stride(-2) if a_t.ndim >= 2 and a_t.numel() else 0
    total = rows if rows is not None else (a_t.shape[0] * (a_t.shape[1] if mode == MODE_MASKED else 1))
    why = hopper_reason(a, b, out_dtype, mode, b2=b2) if dev.type == "cuda" else "needs a CUDA device"
    # the streaming kernel reads the packed weights by TMA (and needs the Gluon kernels), quantized
    # activations as int32 words
    a_words = a_dtype is not None or words_aligned(a_t, a_row_stride)
    stream_tma = (why is not None and dev.type == "cuda" and fmt in ("mxfp4", "nvfp4", "mxfp8")
               and a_words and all(_hopper.tma_2d_reason(name, w.data.reshape(-1, w.data.shape[-1])) is None
                                   for name, w in (("b", b), ("b_up", b2)) if w is not None)
               and _hopper.gluon_unavailable_reason() is None)
    key = None
    if config is None:
        key = (plan_grouped, op, fmt, total, n, k, a_dtype, out_dtype, b.block[0], mode, experts, rows_per_expert,
               b2 is not None, dev, a_row_stride, dev.type == "cpu" and _checks.INTERPRET, why, stream_tma)
        plan = _PLANS.get(key)
        if plan is not None:
            return plan
    p = Problem(op, fmt, total, n, k, "quantized" if a_dtype is None else _DTYPE_NAMES[a_dtype],
                _DTYPE_NAMES[out_dtype], False, b.block[0], _GROUPING_NAMES[mode], experts, float(rows_per_expert),
                b2 is not None, why is None or stream_tma, dev.type == "cpu" and _checks.INTERPRET)
    info = device_info(dev)
    if dev.type == "cuda":
        _hopper.warn_unchecked_mx_release(fmt, info)
    plan = plan_grouped(p, info, config, hopper_why=why, a_row_stride=a_row_stride)
    if key is not None:
        if len(_PLANS) >= 4096:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


#: Plans under every value they are made of, the planner function (a replaced one is asked again)
#: and why the Hopper kernel cannot take the operands (None: it can): planning was ~30% of the
#: ~100 us host path of an eager gpt-oss decode call (E=32, 4 rows; CPU stub benchmark, NOTES).
_PLANS: dict[tuple, Plan] = {}
#: stacked SwiGLU plans by (id of the projection's plan, out dtype): (that plan, the SwiGLU's)
_STACKED: dict[tuple, tuple[Plan, Plan]] = {}


# --------------------------------------------------------------------------- public ops
def grouped_gemm(
    a: ScaledTensor | torch.Tensor,
    b: ScaledTensor,
    *,
    offsets: torch.Tensor | None = None,
    masked_m: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
    config: GemmConfig | dict | None = None,
    b_global_scale: torch.Tensor | None = None,
    validate: bool | None = None,
    expected_m: int | None = None,
) -> torch.Tensor:
    """Grouped block-scaled GEMM for MoE: ``y_e = dequantize(a_e) @ dequantize(b[e]).T``.

    Exactly one of ``offsets`` (contiguous) or ``masked_m`` (masked) must be given.

    Contiguous
        ``a``: ScaledTensor ``[sum_m, K]``, rows sorted by expert, 1xbk blocks.
        ``b``: ScaledTensor ``[E, N, K]`` (fp8_block: 128x128 or 1x128 blocks; MX/NV: 1xbk).
        ``offsets``: int32 ``[E+1]`` on the device: rows ``offsets[e]:offsets[e+1]`` belong to
        expert ``e``; any segment size including 0 and 1, no padding. Returns ``[sum_m, N]``.
    Masked
        ``a``: ScaledTensor ``[E, max_m, K]``; ``masked_m``: int32 ``[E]`` on the device.
        Returns ``[E, max_m, N]``. Rows ``>= masked_m[e]`` are **not computed and not
        written**: with ``out=`` they keep their previous content, otherwise they hold
        whatever ``torch.empty`` returned (unspecified). A count outside ``[0, max_m]`` is
        invalid: see ``validate`` below (it never makes the kernel access memory out of bounds).

    Formats: fp8_block, mxfp8, mxfp4, nvfp4 (a and b must match). Weight-only (W8A16 /
    W4A16, e.g. gpt-oss MXFP4 experts on Hopper): ``a`` may be a bf16 / fp16 Tensor of the
    same shape instead of a ScaledTensor. nvfp4 global scales:
    ``a.global_scale`` is per tensor; B uses ``b.global_scale`` (one for all experts) unless
    ``b_global_scale`` (fp32 ``[E]``, one per expert, as MoE checkpoints store them) is given:
    expert ``e`` then dequantizes as ``e2m1 * sf / b_global_scale[e]``.

    ``out_dtype``: bf16, fp16 or fp32 (ignored if ``out`` is given: ``out.dtype`` must equal
    it). ``out``: destination of the output shape, last dim stride 1.
    ``config``: force a :class:`blockscaled.config.GemmConfig` (block sizes, warps, stages,
    ``promote``; ``split_k`` must be 1), or ``GemmConfig(strategy="dequant_matmul")``:
    dequantize to bf16 + cuBLAS (``torch._grouped_mm`` / ``torch.bmm``), which the heuristic
    picks on sm_90 for MX/NV formats and bf16 weight-only at large M (see
    :mod:`blockscaled.config.grouped` for the rule and which calls it can take: contiguous
    needs bf16 outputs; a forced call it cannot take raises ValueError). Same contract
    (masked rows, no host sync, deterministic); its numerics are in ``_dequant_matmul``.
    ``validate``: how the *values* of ``offsets`` / ``masked_m`` are checked (non-decreasing,
    starting at 0, ending at ``sum_m``; counts in ``[0, max_m]``). Shapes, dtypes, devices
    and formats are always checked on the host. ``validate=True`` reads the values on the
    host before the launch (a sync; not inside CUDA-graph capture) and raises ``ValueError``
    at the faulty call. ``False`` checks them on the device after the GEMM, without a sync
    (one tiny extra launch, captured with the GEMM): bad values make the op write **NaN over
    its whole output** (``out=`` included) and set a sticky per-device flag, and the next
    :func:`blockscaled.check_errors` raises ``RuntimeError`` naming the op and the bad entry
    (docs/errors.md). Default (None): True for CPU tensors, False for CUDA and while
    torch.compile traces. Bad values never make the kernel access memory out of bounds
    (offsets are clamped to ``[0, sum_m]``, counts to ``[0, max_m]``).

    ``expected_m``: masked only, a host-side hint of the typical rows per expert (as DeepGEMM's
    ``expected_m``; the counts themselves stay on the device): tiles are chosen for it instead
    of ``max_m`` (e.g. 64-row tiles when experts hold ~64 of 256 rows). Never changes results.

    Dispatch: fp8_block x 128x128 weights on sm_90 run the Gluon kernel
    (``ops._hopper.grouped_fp8_block_hopper_impl``; ``GemmConfig(strategy="hopper")`` forces it
    and raises ValueError with the reason when it cannot; only the strategy of such a config is
    used, the tiles come from the planner, ``plan/grouped.py``; a ``HopperConfig`` runs as given).
    MX / NV weights on sm_90 run the register-streaming or streaming kernel at decode sizes (up to
    16 rows per expert) and above that the tiled kernels' grouped forms where the predicted time
    beats dequantize + cuBLAS (``GemmConfig(strategy="tiled", block_m=128, block_n=128,
    block_k=64, num_warps=8, num_stages=5)`` forces the 128 x 128 one, ``block_m=256, num_warps=4,
    num_stages=4`` the register-operand one for mxfp4 / nvfp4; no split, no bias).
    ``blockscaled.explain("grouped_gemm", ...)`` returns the plan a call runs. Contiguous with one expert is a dense
    GEMM (offsets must then be ``[0, sum_m]``) and runs :func:`blockscaled.ops.gemm.gemm`
    (split-K / swap-AB at small M, which a one-expert grouped launch cannot use).

    No host synchronisation without ``validate``; the output is bitwise deterministic.

    Autograd: not supported; a float input that requires grad (a weight-only ``a``, or the
    source of a ScaledTensor quantized from one) raises ``RuntimeError`` while grad mode is on
    (docs/errors.md, "Autograd"). Default output dtype: bf16, as every op.

    Example::

        a = bs.quantize(x_sorted, "fp8_block")                      # [sum_m, K], rows sorted by expert
        w = bs.quantize(w_experts, "fp8_block", block=(128, 128))   # [E, N, K]
        y = bs.grouped_gemm(a, w, offsets=offs)                     # int32 [E+1] on the device -> [sum_m, N] bf16
    """
    if (offsets is None) == (masked_m is None):
        raise ValueError(
            "offsets/masked_m: exactly one must be given (offsets= for contiguous, masked_m= for masked), "
            f"got offsets={'None' if offsets is None else 'tensor'}, masked_m={'None' if masked_m is None else 'tensor'}"
        )
    _check_out_dtype(out_dtype)
    check_config_arg(config)
    masked = masked_m is not None
    check_a(a, 3 if masked else 2)
    _check_scaled("b", b, 3)
    check_pair(a, b)
    fmt = b.format.name
    e, n, k = b.shape[0], b.shape[1], b.shape[2]
    dev = a.device
    val = _resolve_validate(validate, dev)
    gsb = _check_b_global_scale(b_global_scale, b, e)
    _no_grad_support("grouped_gemm", a=a, b=b)
    check_op = 0 if val or validate is CALLER_CHECKS else OP_GROUPED_GEMM
    if masked:
        if a.shape[0] != e:
            raise ValueError(f"a: E mismatch: a has {a.shape[0]} experts (shape {tuple(a.shape)}), b has {e}")
        max_m = a.shape[1]
        check_masked_m(masked_m, e, max_m, dev, val)
        shape = (e, max_m, n)
        rows_per_expert = max_m
        if expected_m is not None:
            if not isinstance(expected_m, int) or isinstance(expected_m, bool):
                raise TypeError(f"expected_m: expected a positive int (rows per expert hint), got "
                                f"{type(expected_m).__name__} {expected_m!r}")
            if expected_m < 1:
                raise ValueError(f"expected_m: expected a positive int (rows per expert hint), got {expected_m!r}")
            rows_per_expert = min(expected_m, max_m)
        seg, mode = masked_m, MODE_MASKED
    else:
        if expected_m is not None:
            raise ValueError("expected_m: only for the masked layout (masked_m=); contiguous offsets give the sizes")
        sum_m = a.shape[0]
        check_offsets(offsets, e, sum_m, dev, val)
        shape = (sum_m, n)
        rows_per_expert = sum_m / max(e, 1)
        seg, mode = offsets, MODE_CONTIGUOUS
    if out is not None:
        _check_out(out, shape, out_dtype, dev)
    if use_reference(b.data):
        if explaining():
            emit(grouped_plan("grouped", a, b, fmt, rows_per_expert, n, k, mode, e, out_dtype, config))
        with torch.no_grad():  # ScaledTensor fields are constants on every path
            y = _ref.grouped_gemm(a, b, offsets=offsets, masked_m=masked_m, b_global_scale=b_global_scale)
        return reference_check(reference_result(y, out, out_dtype, masked_m), check_op, seg, mode, a)
    if (not masked and e == 1 and config is None and isinstance(a, ScaledTensor) and gsb is None
            and b.global_scale is None and not use_reference(b.data)):
        b0 = ScaledTensor(b.data[0], b.scale[0], b.format, torch.Size((n, k)), b.block, b.rounding)
        y = _dense_gemm(a, b0, out_dtype=out_dtype, out=out)
        if check_op:  # offsets must be [0, sum_m]: the same device check as the grouped kernels
            check = check_metadata if _eager_ok(offsets, y) else torch.ops.blockscaled.check_metadata
            check(offsets, y, check_op, MODE_CONTIGUOUS, a.shape[0])
        return y
    plan = grouped_plan("grouped", a, b, fmt, rows_per_expert, n, k, mode, e, out_dtype, config)
    return launch(a, b, gsb, None, seg, out, out_dtype, mode, plan, check_op=check_op)


def hopper_reason(a, b: ScaledTensor, out_dtype: torch.dtype, mode: int,
                  b2: ScaledTensor | None = None) -> str | None:
    """Why the sm_90a wide kernel cannot take this grouped (or, with ``b2``, SwiGLU) call (None
    when it can): fp8_block activations (1x128) x fp8_block 128x128 weights on an sm_90 GPU,
    TMA-describable operands, no nvfp4-style global scales."""
    if not isinstance(a, ScaledTensor):
        return "weight-only (dense activations) runs the portable kernel"
    if a.format.name != "fp8_block" or b.format.name != "fp8_block":
        return f"only fp8_block x fp8_block, got {a.format.name} x {b.format.name}"
    if b.data.device.type != "cuda":
        return f"needs a CUDA device, got {b.data.device}"
    for name, w in (("b", b), ("b2", b2)):
        if w is None:
            continue
        r = _hopper.grouped_unsupported_reason(a.data, w.data, a.scale, w.scale, a.block, w.block, out_dtype, mode)
        if r is not None:
            return r if name == "b" else f"up weight: {r}"
    return None



def reference_check(y: torch.Tensor, check_op: int, seg, mode: int, a) -> torch.Tensor:
    """Reference path (CPU without the interpreter), ``validate=False``: the host twin of the
    device check (same rules, NaN over ``y``, same flag; ``ops/errors.py``). Returns ``y``."""
    if check_op and seg is not None and mode != MODE_DENSE:
        check_metadata_host(seg, y, check_op, mode, a.shape[1] if mode == MODE_MASKED else a.shape[0])
    return y


def _no_grad_support(op: str, **operands) -> None:
    """The grouped ops have no backward: raise (while grad mode is on) when a float input
    requires grad: a dense Tensor operand, or the float source of a ScaledTensor (quantize's
    straight-through link, ``ops/_autograd.py``). Costs one ``is_grad_enabled`` call otherwise."""
    if not torch.is_grad_enabled():
        return
    name = requires_grad_name(**operands)
    if name is not None:
        raise RuntimeError(
            f"{op}: autograd is not supported for grouped / SwiGLU ops, but {name} requires grad. Run it "
            f"under torch.no_grad() or pass detached inputs (a.detach(); quantize(x.detach(), ...)); for "
            f"training, dequantize the weights and use torch ops (docs/errors.md, 'Autograd')"
        )


def reference_result(y: torch.Tensor, out: torch.Tensor | None, out_dtype: torch.dtype,
                     masked_m: torch.Tensor | None) -> torch.Tensor:
    """CPU fallback (``_checks.use_reference``): deliver a float64 reference result like the
    kernel would: cast to ``out_dtype``; in masked mode only rows below the counts are
    written into ``out`` (rows past a count keep their content, as with the kernel)."""
    y = y.to(out_dtype)
    if out is None:
        return y
    if masked_m is None:
        out.copy_(y)
    else:
        rows = torch.arange(out.shape[1], device=out.device)[None, :] < masked_m.to(out.device)[:, None]
        out[rows] = y[rows]
    return out
