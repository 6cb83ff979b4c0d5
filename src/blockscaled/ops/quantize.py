"""Public quantize / dequantize ops (launchers: validate, allocate, launch).

Every op here is bit-for-bit equal to its pure-torch twin in
:mod:`blockscaled.reference.quantize` run on the CPU (data, scales and global scale); the
kernels are in :mod:`blockscaled.kernels.triton.quantize`.

NaN / Inf policy (as the reference): never raise, propagate. A block containing NaN gets a
NaN scale (fp32 NaN, E8M0 0xFF, e4m3 NaN) and dequantizes to NaN. A block containing +-Inf and
no NaN gets an infinite fp32 scale (fp8_block: finite elements -> +-0, infinite ones -> NaN) or
a NaN scale (MX; nvfp4, with the computed or a user-given global scale): every element of it
dequantizes to NaN. e2m1 has no NaN code: NaN elements encode as +6 (code 7, whatever the NaN's
sign). NaN payloads and the sign of NaN in fp32 / e4m3 outputs are outside the bitwise contract
(``blockscaled.testing`` compares every NaN of a float dtype as one value).
Denormal inputs are honoured, not flushed.
"""

from __future__ import annotations

import importlib
import math

import torch
import triton.language as tl

from .. import _checks
from .._checks import (
    FLOAT_INPUT_DTYPES,
    as_global_scale,
    check_flag,
    check_row_contiguous,
    check_tensor,
    resolve_quantize_args,
    use_reference,
    warn_quantize_range,
)
from ..formats import Format, ScaleRounding, get_format
from ..kernels.triton import quantize as _k
from ..plan import Problem, device_info, num_sms
from ..plan.quantize import MAX_TILE_K, TILE_ELEMS, TILE_ELEMS_FP4, plan_quantize, tile_1xk
from ..tensor import ScaledTensor, scale_shape
from ._autograd import attach_source, link_source
from ._explain import emit, explaining
from ._launch import fast

# The reference module (its package re-exports the function under the same name).
_ref = importlib.import_module("blockscaled.reference.quantize")

__all__ = ["quantize", "dequantize", "silu_mul_quantize", "tensor_amax"]

_FMT_CODE = {"fp8_block": 0, "mxfp8": 1, "mxfp4": 2, "nvfp4": 3}
_ROUND_CODE = {ScaleRounding.EXACT: 0, ScaleRounding.RCEIL: 1, ScaleRounding.FLOOR: 2, ScaleRounding.NVFP4: 3}

_NUM_WARPS = 4
#: On CUDA, round fp32 -> e4m3 with the hardware cast (cvt.rn.satfinite, 2 elements per
#: instruction) instead of the integer-rounding path the interpreter needs (~12 integer ops per
#: element, which would make the kernels compute-bound). Both are RNE with saturation; set this
#: to False if a GPU run ever shows a data mismatch confined to e4m3 rounding.
GPU_HW_CVT = True


# Host arithmetic in plain Python, not triton.cdiv / triton.next_power_of_2: those are
# constexpr functions, ~2-5 us per call from the host (each launch used several).
def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _rows_view(t: torch.Tensor) -> torch.Tensor:
    """``[..., K]`` -> ``[M, K]`` view (no copy; check_row_contiguous guaranteed it is possible)."""
    if t.ndim == 2:
        return t
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """0-d fp32 ``max(|x|)`` of a ``[..., K]`` bf16/fp16/fp32 tensor (rows may be strided,
    last dim unit stride). NaN if any element is NaN (payload unspecified, outside the
    contract), 0 for an empty tensor. No host sync: one kernel writing int32 partial maxima of
    the bit patterns of |x| (deterministic) and a torch max over the <= 512 partials.
    A statistic: no gradient flows through it (docs/errors.md, "Autograd")."""
    check_tensor("x", x, dtypes=FLOAT_INPUT_DTYPES, min_ndim=1)
    check_row_contiguous("x", x)
    if x.requires_grad:
        x = x.detach()
    if use_reference(x):
        return _ref.tensor_amax(x)
    return torch.ops.blockscaled.tensor_amax(x)


#: Tensor-amax pass: 16384-element tiles (32 KB of bf16; 8 warps x 32 threads x 4 x 16-byte
#: loads in flight per program) and 2 programs per SM grid-striding over them: 64 KB of loads
#: in flight per SM, ~3x what 3.35 TB/s x ~700 ns DRAM latency needs per SM on an H100. At
#: most _MAX_PARTS partials (what a quantize program reads back: 2 KB, from L2).
_AMAX_TILE_ELEMS = 16384
_AMAX_WARPS = 8
_MAX_PARTS = 512


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # interpreter: a few programs, to exercise the grid-stride loop
    return num_sms(device)


def _amax_tile(m: int, k: int, want: int) -> tuple[int, int]:
    """(ROWS, BLOCK_K) of ``tensor_amax_kernel`` on ``[m, k]``: fewer rows per tile while there
    are fewer than ``want`` tiles (small x: more, smaller tiles)."""
    block_k = min(MAX_TILE_K, _pow2(k))
    rows = max(1, min(_pow2(m), _AMAX_TILE_ELEMS // block_k))
    while rows > 1 and _cdiv(m, rows) * _cdiv(k, block_k) < want:
        rows //= 2
    return rows, block_k


def activation_tiles(fmt: str | Format, m: int, k: int, device: torch.device) -> tuple[int, ...]:
    """The compile-time tiles with which quantizing activations ``[m, k]`` in ``fmt`` (1 x block_k
    blocks) launches its kernels: the 1 x k kernel's (ROWS, GROUPS), and for a format with a
    global scale the amax kernel's (ROWS, BLOCK_K). They follow ``m``, so :func:`blockscaled.warmup`
    runs one launch per distinct value (each is its own Triton compile)."""
    f = get_format(fmt)
    want = 2 * _num_sms(device)
    tiles = tile_1xk(m, k, f.block_k, TILE_ELEMS_FP4 if f.is_fp4 else TILE_ELEMS, want)
    if f.has_global_scale:
        tiles += _amax_tile(m, k, want)
    return tiles


def dequant_tiles(fmt: str | Format, m: int, k: int) -> tuple[int, int]:
    """The compile-time tiles (ROWS, GROUPS) with which dequantizing ``[m, k]`` of 1 x block_k
    blocks launches its kernel (``_dequantize_impl``). They follow ``m``: quantized activations
    that a plan dequantizes first (the streaming kernel's W x A pre-pass) make
    :func:`blockscaled.warmup` run one launch per distinct value."""
    return tile_1xk(m, k, get_format(fmt).block_k)


def _amax_partials(x: torch.Tensor) -> torch.Tensor:
    """int32 ``[P]`` partial maxima of the bits of |x| (P >= 1; zeros for an empty x), one
    kernel, no memset. The tensor amax is their max."""
    if x.numel() == 0:
        return torch.zeros(1, dtype=torch.int32, device=x.device)
    x2 = _rows_view(x)
    m, k = x2.shape
    want = 2 * _num_sms(x.device)
    rows, block_k = _amax_tile(m, k, want)
    tiles_k = _cdiv(k, block_k)
    tiles = _cdiv(m, rows) * tiles_k
    nprog = min(tiles, want, _MAX_PARTS)
    iters = _cdiv(tiles, nprog)
    part = torch.empty(nprog, dtype=torch.int32, device=x.device)
    fast(_k.tensor_amax_kernel)[(nprog,)](x2, part, m, k, x2.stride(0), tiles_k, iters, ROWS=rows, BLOCK_K=block_k,
                                    num_warps=_AMAX_WARPS)
    return part


def _launch_1xk(x2, f: Format, rounding: ScaleRounding, gs_ptr, gs_out, gs_mode, silu, k, inter):
    """Allocate ``[M, packed K]`` data and ``[M, ceil(K/bk)]`` scales, launch the 1 x bk kernel
    on ``x2 [M, K]`` (``[M, 2K]`` gate_up when ``silu``). gs_mode: 0 none, 1 gs read from
    ``gs_ptr`` (fp32), 2 gs computed from the int32 amax partials ``gs_ptr`` and stored to
    ``gs_out``."""
    m = x2.shape[0]
    dev = x2.device
    n_part = gs_ptr.numel() if gs_mode == 2 else 1
    key = (f.name, m, k, rounding, gs_mode, silu, inter, n_part, dev, GPU_HW_CVT)  # (the switch may be flipped)
    consts = _LAUNCH_1XK.get(key)
    if consts is None:
        consts = _launch_1xk_consts(key)
    pk, sk, grid, kw = consts
    data = torch.empty((m, pk), dtype=f.data_dtype, device=dev)
    scale = torch.empty((m, sk), dtype=f.scale_dtype, device=dev)
    if grid is None:  # m == 0 or k == 0
        return data, scale
    q_arg = data.view(torch.uint8) if f.data_dtype is not torch.uint8 else data
    s_arg = scale.view(torch.uint8) if f.scale_dtype is torch.float8_e4m3fn else scale
    dummy = gs_ptr if gs_ptr is not None else scale
    fast(_k.quantize_1xk_kernel)[grid](
        x2, q_arg, s_arg, dummy, gs_out if gs_out is not None else dummy,
        m, k, pk, x2.stride(0), pk, sk, n_part, **kw,
    )
    return data, scale


#: quantize_1xk_kernel's launch constants (packed K, scale K, grid, keywords) per call shape:
#: computed once (the tile rule, the constexprs), then one dict lookup per launch (host time of
#: eager decode calls, benchmarks/NOTES.md "Eager host cost of MX/NV calls"). Cleared at 4096.
_LAUNCH_1XK: dict[tuple, tuple] = {}


def _launch_1xk_consts(key: tuple) -> tuple:
    fmt_name, m, k, rounding, gs_mode, silu, inter, n_part, dev, hw_cvt = key
    f = get_format(fmt_name)
    bk = f.block_k
    grid = None
    if m and k:
        rows, groups = activation_tiles(f, m, k, dev)[:2]  # (the warm-up keys on the same tiles)
        grid = (_cdiv(m, rows) * _cdiv(k, groups * bk),)
        gpu = dev.type == "cuda"
        kw = dict(FMT=_FMT_CODE[f.name], ROUND=_ROUND_CODE[rounding], BK=bk, ROWS=rows, GROUPS=groups,
                  GS_MODE=gs_mode, SILU=silu, INTER=inter, GPU=gpu, HW_CVT=hw_cvt and gpu,
                  PART_BLOCK=_pow2(n_part), num_warps=_NUM_WARPS, enable_fp_fusion=False)
    else:
        kw = None
    consts = (f.packed_k(k), f.scale_k(k), grid, kw)
    if len(_LAUNCH_1XK) >= 4096:
        _LAUNCH_1XK.clear()
    _LAUNCH_1XK[key] = consts
    return consts


def quantize(
    x: torch.Tensor,
    fmt: str | Format,
    *,
    block: tuple[int, int] | None = None,
    rounding: ScaleRounding | str | None = None,
    global_scale: torch.Tensor | float | None = None,
    check_range: bool | None = None,
) -> ScaledTensor:
    """Quantize ``x`` to a block-scaled format (Triton kernels; bitwise equal to the reference).

    Args:
        x: ``[..., K]`` bf16 / fp16 / fp32 on CPU (interpreter) or CUDA, any K >= 0 (a partial
            last block is zero-padded for the amax). Rows may be strided (e.g. a column slice of a
            wider tensor) but the last dim must have unit stride and leading dims must flatten
            without a copy; no silent ``.contiguous()``.
        fmt: ``"fp8_block"``, ``"mxfp8"``, ``"mxfp4"``, ``"nvfp4"`` (any case) or a :class:`Format`.
        block: a ``(rows, cols)`` tuple (or 2-element list): ``(1, 128)`` (default) or
            ``(128, 128)`` for fp8_block (``x`` of rank >= 2; rank 3 ``[E, N, K]`` gives
            per-expert scales); ``(1, 32)`` MX; ``(1, 16)`` nvfp4. An int or a string such as
            ``"1x128"`` raises TypeError (an int is ambiguous: 1x128 or 128x128).
        rounding: fp8_block ``EXACT`` (default, ``amax / 448``) or ``RCEIL`` (power-of-two /
            UE8M0); MX ``RCEIL`` (default) or ``FLOOR``; nvfp4 ``NVFP4``. Enum or its value
            (any case).
        global_scale: nvfp4 only: the fp32 encode scale ``gs`` as a float or a 1-element fp32
            tensor on ``x``'s device (read by the kernel from device memory, no host sync).
            ``None``: ``gs = 448 * 6 / amax(|x|)`` computed on the device: a tensor-amax kernel
            then the quantize kernel (two passes over ``x``); with a given gs, one pass. A
            Python float is copied to the device on every call: pass a device tensor on hot paths.
            A given gs must be finite and > 0: a Python number or a CPU tensor that is not
            raises ``ValueError``; a CUDA tensor is not read back (no sync), and a bad value
            there makes every scale NaN, so the result dequantizes to all NaN.
        check_range: nvfp4's outlier rule (docs/formats.md, "Range of nvfp4"): count the blocks
            whose scale underflowed to 0 (they dequantize to all zeros, e.g. when one outlier
            set the global scale) or saturated (their largest elements clip) and emit a
            :class:`~blockscaled.formats.QuantizationRangeWarning` if there are any. ``None``
            (default): checked for CPU tensors, not for CUDA tensors (reading the counts would
            synchronise the host); ``True``: also on CUDA (one extra pass over ``x`` and one
            sync); ``False``: never. Other formats: nothing to check (per-block scales only).

    Returns:
        :class:`ScaledTensor`: contiguous ``data`` ``[..., K]`` e4m3 or ``[..., ceil(K/2)]``
        uint8 (packed e2m1, element 2i in the low nibble, odd K: high nibble of the last byte
        0), row-major ``scale`` ``[..., ceil(K/bk)]`` (``[..., ceil(N/128), ceil(K/128)]`` for
        128x128 blocks), and for nvfp4 a 0-d fp32 ``global_scale``.

    Empty tensors return empty results without a launch. NaN/Inf: see the module docstring.

    Autograd: straight-through. When ``x`` requires grad (grad mode on), the returned object
    remembers ``x``, and :func:`dequantize` / ``gemm`` / ``linear`` pass gradients to it as
    if quantization were the identity; the ScaledTensor's fields never get a gradient
    (docs/errors.md, "Autograd").

    Example::

        x = torch.randn(4, 256, dtype=torch.bfloat16)
        q = quantize(x, "nvfp4")                  # data uint8 [4, 128], scale e4m3 [4, 16]
        x[0, 0] = 1e30                            # one outlier sets the global scale ...
        quantize(x, "nvfp4")                      # ... QuantizationRangeWarning: 63 of 64 blocks
                                                  # underflowed (they dequantize to zeros)
    """
    f, block, rounding = resolve_quantize_args(x, fmt, block, rounding, global_scale)
    check_flag("check_range", check_range, allow_none=True)
    # Autograd: the fields are constants on every path; the straight-through link to x is
    # attach_source's (ops/_autograd.py). Inputs that do not require grad skip both.
    xq = x.detach() if x.requires_grad else x
    if explaining():
        emit(_quantize_plan("quantize", x, f, block))
    if use_reference(x):
        q = _ref.quantize(xq, f, block=block, rounding=rounding, global_scale=global_scale, check_range=False)
    else:
        gs = None if global_scale is None else as_global_scale(global_scale, x.device)
        if _eager_ok(xq):
            # eager: the implementation itself, as gemm / linear / grouped do (the torch.library
            # round trip was ~60% of an eager quantize call's host time, ~70 us on this
            # repository's CPU benchmark); fields made here, so no re-validation either
            if block[0] == 1:
                data, scale, gs_out = quantize_1xk(xq, f, rounding, gs)
            else:
                data, scale, gs_out = _quantize_impl(xq, f, block, rounding, gs)
            if f.has_global_scale and gs is None:
                gs = gs_out
            q = ScaledTensor._trusted(data, scale, f, x.shape, block, rounding, gs)
        else:
            data, scale, gs_out = torch.ops.blockscaled.quantize(xq, f.name, block[0], rounding.value, gs)
            if f.has_global_scale and gs is None:
                gs = gs_out
            q = ScaledTensor(data, scale, f, torch.Size(x.shape), block, rounding, global_scale=gs)
    warn_quantize_range(xq, q, check_range)
    return attach_source(q, x)


_EAGER_OK: list = []


def _eager_ok(x: torch.Tensor) -> bool:
    """``ops.gemm._eager_ok`` (its EAGER_FAST_PATH switch included), looked up once."""
    if torch.compiler.is_compiling():  # (first: torch.compile never traces the lookup below)
        return False
    if not _EAGER_OK:
        from .gemm import _eager_ok as ok  # Local: ops.gemm imports this module (cycle)

        _EAGER_OK.append(ok)
    return _EAGER_OK[0](x)


def _quantize_plan(op: str, x: torch.Tensor, f: Format, block, k: int | None = None):
    """The plan of a quantize / dequantize call (tiles of the 1 x block_k kernels)."""
    k = x.shape[-1] if k is None else k
    m = x.numel() // max(x.shape[-1], 1) if x.ndim else 1
    p = Problem(op, f.name, m, 0, k, interpret=x.device.type == "cpu" and _checks.INTERPRET)
    return plan_quantize(p, device_info(x.device), tuple(block), f.block_k, f.is_fp4)


def _quantize_impl(x, f: Format, block, rounding: ScaleRounding, gs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(data, scale, computed gs: 0-d for nvfp4 without a given gs, else an empty (0,) tensor)."""
    if block[0] > 1:
        no_gs = torch.empty(0, dtype=torch.float32, device=x.device)
        return (*_quantize_128x128(x, f, block, rounding), no_gs)
    data, scale, gs_out = quantize_1xk(x, f, rounding, gs)
    if gs_out is None:
        gs_out = torch.empty(0, dtype=torch.float32, device=x.device)
    return data, scale, gs_out


def quantize_1xk(x, f: Format, rounding: ScaleRounding, gs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """1 x block_k quantization of ``x [..., K]`` (validated): (data, scale, the computed nvfp4
    global scale, 0-d, or None when ``gs`` was given or the format has none). The internal
    entry of ``linear``'s activation quantization (no placeholder tensor for the gs)."""
    shape = x.shape
    k = shape[-1]
    x2 = _rows_view(x)
    gs_out = None
    if f.has_global_scale and x.numel() > 0:
        if gs is not None:
            data, scale = _launch_1xk(x2, f, rounding, gs, None, 1, False, k, torch.bfloat16)
        else:
            part = _amax_partials(x)
            gs_out = torch.empty((), dtype=torch.float32, device=x.device)
            data, scale = _launch_1xk(x2, f, rounding, part, gs_out, 2, False, k, torch.bfloat16)
    else:
        if f.has_global_scale and gs is None:
            gs_out = torch.ones((), dtype=torch.float32, device=x.device)  # reference: amax 0 -> gs 1
        data, scale = _launch_1xk(x2, f, rounding, None, None, 0, False, k, torch.bfloat16)
    if x2 is not x:
        data, scale = data.view(*shape[:-1], data.shape[-1]), scale.view(*shape[:-1], scale.shape[-1])
    return data, scale, gs_out


def _quantize_128x128(x: torch.Tensor, f: Format, block, rounding) -> tuple[torch.Tensor, torch.Tensor]:
    shape = tuple(x.shape)
    n, k = shape[-2], shape[-1]
    data = torch.empty(shape, dtype=f.data_dtype, device=x.device)
    scale = torch.empty(scale_shape(shape, f, block), dtype=torch.float32, device=x.device)
    if x.numel() > 0:
        x3 = x.reshape(-1, n, k)  # a view: check_row_contiguous guaranteed it
        e = x3.shape[0]
        d3 = data.view(e, n, k)
        s3 = scale.view(e, scale.shape[-2], scale.shape[-1])
        grid = (_cdiv(k, 128), _cdiv(n, 128), e)
        # One 128x128 block per program: 32 KB of bf16 in registers with 8 warps is
        # 64 fp32 per thread, one read of x, and scales written once per block.
        fast(_k.quantize_128x128_kernel)[grid](
            x3, d3.view(torch.uint8), s3, e, n, k, x3.stride(0), x3.stride(1), d3.stride(0), d3.stride(1),
            s3.stride(0), s3.stride(1), ROUND=_ROUND_CODE[rounding], BR=128, BC=128,
            HW_CVT=GPU_HW_CVT and x.device.type == "cuda", GPU=x.device.type == "cuda",
            num_warps=8, enable_fp_fusion=False,
        )
    return data, scale


def dequantize(q: ScaledTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q.data * q.scale`` (``/ q.global_scale`` for nvfp4) as a contiguous ``q.shape`` tensor
    of ``dtype`` (bf16 / fp16 / fp32), computed in fp32 then cast once.

    Bitwise equal to the reference for all finite values; NaN elements come out NaN (their
    sign / payload after the final cast is not part of the contract).

    Autograd: the output is differentiable only with respect to the float tensor ``q`` was
    quantized from (``quantize(x)`` with ``x`` requiring grad): the gradient passes to ``x``
    unchanged (straight-through). The fields of ``q`` are constants."""
    if not isinstance(q, ScaledTensor):
        raise TypeError(f"q: expected a ScaledTensor, got {type(q).__name__}")
    if dtype not in FLOAT_INPUT_DTYPES:
        raise TypeError(f"dtype: expected one of {[str(d) for d in FLOAT_INPUT_DTYPES]}, got {dtype}")
    check_row_contiguous("q.data", q.data)
    check_row_contiguous("q.scale", q.scale)
    if explaining():
        emit(_quantize_plan("dequantize", q.data, q.format, q.block, k=q.shape[-1]))
    if use_reference(q.data):
        with torch.no_grad():  # fields are constants on every path
            out = _ref.dequantize(q, dtype=dtype)
    else:
        out = torch.ops.blockscaled.dequantize(
            q.data, q.scale, q.global_scale, q.format.name, q.shape[-1], q.block[0], dtype
        )
    return link_source(q, out)


def _dequantize_impl(data, scale, global_scale, f: Format, shape, block, dtype, out=None) -> torch.Tensor:
    """``out``: where to write (default: a new contiguous ``shape`` tensor); a 2D ``shape`` view
    with unit column stride and any row stride (ops/gemm.py writes into padded buffers)."""
    k = shape[-1]
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=data.device)
    if out.numel() == 0:
        return out
    if block[0] > 1:
        n = shape[-2]
        e = out.numel() // (n * k)
        q3 = data.reshape(e, n, k).view(torch.uint8)
        s3 = scale.reshape(e, scale.shape[-2], scale.shape[-1])
        o3 = out.view(e, n, k) if out.dim() != 2 else out.unsqueeze(0)
        grid = (_cdiv(k, 128), _cdiv(n, 128), e)
        fast(_k.dequantize_128x128_kernel)[grid](
            q3, s3, o3, n, k, q3.stride(0), q3.stride(1), s3.stride(0), s3.stride(1), o3.stride(0), o3.stride(1),
            BR=128, BC=128, num_warps=8,
        )
        return out
    q2 = _rows_view(data).view(torch.uint8)
    s2 = _rows_view(scale)
    if s2.dtype == torch.float8_e4m3fn:
        s2 = s2.view(torch.uint8)
    o2 = out.view(-1, k) if out.dim() != 2 else out
    m = o2.shape[0]
    rows, groups = dequant_tiles(f, m, k)
    grid = (_cdiv(m, rows), _cdiv(k, groups * f.block_k))
    gs = global_scale if global_scale is not None else s2
    fast(_k.dequantize_1xk_kernel)[grid](
        q2, s2, gs, o2, m, k, f.packed_k(k), q2.stride(0), s2.stride(0), o2.stride(0),
        FMT=_FMT_CODE[f.name], BK=f.block_k, ROWS=rows, GROUPS=groups, num_warps=_NUM_WARPS,
        enable_fp_fusion=False,
    )
    return out


def silu_mul_quantize(
    gate_up: torch.Tensor,
    fmt: str | Format = "fp8_block",
    *,
    rounding: ScaleRounding | str | None = None,
    intermediate_dtype: torch.dtype = torch.bfloat16,
) -> ScaledTensor:
    """Fused ``quantize((silu(g) * u).to(intermediate_dtype), fmt)`` in one kernel.

    Args:
        gate_up: ``[..., 2I]`` bf16/fp16/fp32, gate half first then up (vLLM / SGLang layout);
            rows may be strided, last dim unit stride.
        fmt: fp8_block (1x128 blocks; the MoE activation path), mxfp8 or mxfp4 (1x32).
            nvfp4 needs a tensor amax of the intermediate and is not fused: raises.
        rounding: as for :func:`quantize`.
        intermediate_dtype: the unfused pipeline's intermediate (bf16 default, fp16, fp32).

    Returns a :class:`ScaledTensor` of logical shape ``[..., I]``.

    Numerics: ``silu(g) * u = g / (1 + exp(-g)) * u`` in fp32 with IEEE division, rounded to
    the intermediate dtype, then the quantizer's exact arithmetic. ``exp`` is libdevice
    ``expf`` on the GPU (numpy's in the interpreter) and the CPU reference uses torch's
    vectorised expf; these may differ by 1 ulp, which can flip the rounding of a bf16
    intermediate. So: scales are bitwise equal wherever the bf16 intermediates of a block
    agree, and data is bitwise equal except where an intermediate differs by one bf16 ulp
    (tested: >= 99.99% of elements bitwise equal, the rest within one e4m3 ulp).

    Autograd: straight-through like :func:`quantize`: when ``gate_up`` requires grad, the
    result's source is ``(silu(g) * u).to(intermediate_dtype)`` computed with torch ops (only
    then), so gradients reach ``gate_up`` through silu and the product.
    """
    check_tensor("gate_up", gate_up, dtypes=FLOAT_INPUT_DTYPES, min_ndim=1)
    if gate_up.shape[-1] % 2:
        raise ValueError(
            f"gate_up: last dimension must be even (gate then up halves), got {tuple(gate_up.shape)}"
        )
    check_row_contiguous("gate_up", gate_up)
    f = get_format(fmt)
    if f.has_global_scale:
        raise ValueError(f"fmt: silu_mul_quantize fuses 1xK formats without a global scale, got {f.name}")
    if intermediate_dtype not in FLOAT_INPUT_DTYPES:
        raise TypeError(
            f"intermediate_dtype: expected one of {[str(d) for d in FLOAT_INPUT_DTYPES]}, got {intermediate_dtype}"
        )
    i = gate_up.shape[-1] // 2
    out_shape = (*gate_up.shape[:-1], i)
    # Validate fmt / rounding exactly as quantize does (on a meta stand-in of the output).
    f, block, rounding = resolve_quantize_args(
        torch.empty(out_shape, dtype=gate_up.dtype, device="meta"), f, None, rounding, None
    )
    src = None
    if gate_up.requires_grad and torch.is_grad_enabled():
        src = _ref.silu_mul(gate_up).to(intermediate_dtype)  # what is quantized, differentiable
        gate_up = gate_up.detach()
    if use_reference(gate_up):
        q = _ref.silu_mul_quantize(gate_up, f, rounding=rounding, intermediate_dtype=intermediate_dtype)
    else:
        data, scale = torch.ops.blockscaled.silu_mul_quantize(gate_up, f.name, rounding.value, intermediate_dtype)
        q = ScaledTensor(data, scale, f, torch.Size(out_shape), block, rounding)
    return q if src is None else attach_source(q, src)


def _silu_mul_quantize_impl(gate_up, f: Format, rounding: ScaleRounding, intermediate_dtype):
    i = gate_up.shape[-1] // 2
    inter = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[
        intermediate_dtype
    ]
    data, scale = _launch_1xk(_rows_view(gate_up), f, rounding, None, None, 0, True, i, inter)
    lead = gate_up.shape[:-1]
    return data.view(*lead, data.shape[-1]), scale.view(*lead, scale.shape[-1])


# --------------------------------------------------------------------------- torch custom ops
# Namespace ``blockscaled`` (shared with ops/_custom_ops.py). ScaledTensor is not a Tensor, so
# the ops take and return its fields; the public functions above validate, pack and unpack.
# Fake (meta) implementations give torch.compile the output shapes without running kernels.
#   blockscaled::quantize(x, fmt, block_rows, rounding, global_scale?) -> (data, scale, gs)
#       gs: the computed 0-d nvfp4 global scale, or an empty (0,) tensor (given gs / no gs)
#   blockscaled::dequantize(data, scale, global_scale?, fmt, k, block_rows, dtype) -> out
#   blockscaled::silu_mul_quantize(gate_up, fmt, rounding, intermediate_dtype) -> (data, scale)
#   blockscaled::tensor_amax(x) -> 0-d fp32
def _block_of(f: Format, block_rows: int) -> tuple[int, int]:
    return (block_rows, f.block_k) if block_rows == 1 else (block_rows, block_rows)


@torch.library.custom_op("blockscaled::quantize", mutates_args=())
def _quantize_op(
    x: torch.Tensor, fmt: str, block_rows: int, rounding: str, global_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    f = get_format(fmt)
    return _quantize_impl(x, f, _block_of(f, block_rows), ScaleRounding(rounding), global_scale)


@_quantize_op.register_fake
def _(x, fmt, block_rows, rounding, global_scale):
    f = get_format(fmt)
    shape = tuple(x.shape)
    data = x.new_empty((*shape[:-1], f.packed_k(shape[-1])), dtype=f.data_dtype)
    scale = x.new_empty(scale_shape(shape, f, _block_of(f, block_rows)), dtype=f.scale_dtype)
    gs = x.new_empty(() if (f.has_global_scale and global_scale is None) else (0,), dtype=torch.float32)
    return data, scale, gs


@torch.library.custom_op("blockscaled::dequantize", mutates_args=())
def _dequantize_op(
    data: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor | None, fmt: str, k: int,
    block_rows: int, dtype: torch.dtype,
) -> torch.Tensor:
    f = get_format(fmt)
    shape = (*data.shape[:-1], k)
    return _dequantize_impl(data, scale, global_scale, f, shape, _block_of(f, block_rows), dtype)


@_dequantize_op.register_fake
def _(data, scale, global_scale, fmt, k, block_rows, dtype):
    return data.new_empty((*data.shape[:-1], k), dtype=dtype)


@torch.library.custom_op("blockscaled::silu_mul_quantize", mutates_args=())
def _silu_mul_quantize_op(
    gate_up: torch.Tensor, fmt: str, rounding: str, intermediate_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    return _silu_mul_quantize_impl(gate_up, get_format(fmt), ScaleRounding(rounding), intermediate_dtype)


@_silu_mul_quantize_op.register_fake
def _(gate_up, fmt, rounding, intermediate_dtype):
    f = get_format(fmt)
    lead, i = tuple(gate_up.shape[:-1]), gate_up.shape[-1] // 2
    return (gate_up.new_empty((*lead, f.packed_k(i)), dtype=f.data_dtype),
            gate_up.new_empty((*lead, f.scale_k(i)), dtype=f.scale_dtype))


@torch.library.custom_op("blockscaled::tensor_amax", mutates_args=())
def _tensor_amax_op(x: torch.Tensor) -> torch.Tensor:
    return _amax_partials(x).amax().view(torch.float32).reshape(())


@_tensor_amax_op.register_fake
def _(x):
    return x.new_empty((), dtype=torch.float32)
