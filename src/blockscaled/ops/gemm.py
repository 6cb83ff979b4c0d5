"""Public dense block-scaled GEMM: ``gemm(a, b)`` = ``dequantize(a) @ dequantize(b).T``.

Launcher only: validate, allocate, choose a config (``blockscaled.config``), launch the Triton
kernel (``kernels/triton/gemm.py``) or the dequantize + cuBLAS path. Registered as torch
custom ops in ``_custom_ops.py`` so torch.compile sees one opaque op; plain eager calls run
the same implementation without the dispatcher round trip (``_eager_ok``). Nothing here
synchronises the host, so CUDA graphs capture either path.

Host cost per call (the GPU idles on it when kernels are short): validation, one lru_cached
config lookup, then either one Triton launch (split-K is fused into it) or two internal
dequantize launches + one cuBLAS call (+ one 0-d multiply for nvfp4 bf16 output). No
ScaledTensor is rebuilt and the only allocations are the dequantized operands, the output and
the split-K fp32 workspace (the split-K tile counters are cached, see ``_COUNTERS``).
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

from .. import _checks
from ..config.gemm import GemmConfig, gemv_slice_elems
from ..config.hopper import HopperConfig
from ..plan import Plan, Problem, device_info, log_plan, plan_gemm
from ..plan import tuned as _tuned
from ..plan.types import DTYPE_NAMES
from ..plan.portable import default_promote
from ..plan.splits import split_plan as _split_plan
from . import _hopper
from ._direct import launch_direct
from ._mx_gemv_gluon import launch_mx_gemv_gluon
from .mx_pack import encode_raw
from ._stream import launch_stream, words_aligned
from ._tiled import launch_tiled
from ._splitk import splitk_scratch
from ..formats import Format, get_format
from ..plan.mx_packed import MIXED_PAIRS, mixed_config_ok
from ..kernels.triton._mma import FORMAT_CODES
from ..kernels.triton.gemm import gemm_kernel
from ..kernels.triton.gemv import gemv_kernel
from ..kernels.triton.mx_gemv import mx_gemv_kernel
from ..reference.gemm import gemm as _ref_gemm
from ..tensor import ScaledTensor
from . import _autograd
from . import quantize as _quant
from ._explain import emit, explaining
from ._launch import fast

__all__ = ["gemm", "OUT_DTYPES"]

OUT_DTYPES = _checks.OUT_DTYPES
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
        mixed = (a.format.name, fmt.name) in MIXED_PAIRS
        if a.format is not fmt and a.format != fmt and not mixed:  # (``is``: the dataclass == compares every field)
            raise ValueError(
                f"a.format: expected the format of b ({fmt.name}), got {a.format.name} "
                f"(both operands use one format, or MX activations with a 128x128 fp8_block weight: "
                f"{', '.join(' x '.join(pr) for pr in MIXED_PAIRS)})"
            )
        if mixed and b.block != (128, 128):
            raise ValueError(f"b.block: {a.format.name} activations take an fp8_block weight with (128, 128) blocks "
                             f"(layouts.mxfp4_to_fp8_block), got {b.block}")
        a_bk = a.format.block_k if mixed else fmt.block_k
        if a.block != (1, a_bk):
            raise ValueError(
                f"a.block: the activation operand must use 1x{a_bk} blocks for {a.format.name}, got {a.block}"
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
        _checks.check_out_no_grad(out)
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


def _check_config(cfg: GemmConfig, fmt: Format, a_dense: bool, a_dtype, promote: bool, interpret: bool) -> None:
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
    if promote and not a_dense and cfg.block_k < 32 and not interpret:
        # Triton on sm_90 refuses to compile an FP8 tl.dot with K < 32 ("Input shapes should have
        # M >= 1, N >= 1 and K >= 32"): the FP8 wgmma / mma instructions consume K = 32 per step.
        # The interpreter has no such limit (CPU tests may use block_k = 16 there).
        raise ValueError(
            f"config.block_k: promote=True with a quantized {fmt.name} A runs FP8 tensor-core dots, which "
            f"need block_k >= 32 on CUDA (FP8 MMA consumes K = 32 per instruction), got {cfg.block_k}"
        )
    if cfg.swap_ab and a_dense and promote:
        raise ValueError("config.swap_ab: a dense (weight-only) A swaps only with promote=False (the weight is "
                         "dequantized to bf16 and becomes the MMA's first operand; the promote path keeps dense A "
                         "first)")
    if not promote and a_dense and a_dtype == torch.float16:
        raise ValueError("config.promote: fp16 activations need promote=True (dequantized weights may "
                         "leave fp16's range)")


# --------------------------------------------------------------------------- launch
def _cdiv(a: int, b: int) -> int:
    # not triton.cdiv: that is a @jit function, ~10x slower to call from the host
    return -(-a // b)


def _dot_dtype(promote: bool, a_dense: bool, a_dtype, interpret: bool):
    if promote and not a_dense:
        return tl.float8e4nv
    want = a_dtype if (promote and a_dense) else torch.bfloat16
    if want == torch.float16:
        return tl.float16
    # triton 3.6 interpreter: bf16 tl.dot is wrong; fp32 dot of the same exact values
    return tl.float32 if interpret else tl.bfloat16


#: Programmatic Dependent Launch of ``gemm_kernel`` (sm_90+; kernels/triton/gemm.py module
#: docstring): the kernel's CTAs become resident while the preceding kernel on the stream
#: finishes, and its ``griddepcontrol.wait`` (before any global memory access) orders it after
#: that kernel. OFF by default: on the H100 (a PDL on/off A/B, CUDA graphs of back-to-back
#: fp8_block decode GEMMs, two runs agreeing within 0.2 us) it saved 0.2-0.7 us on some shapes
#: (M=1 2112x7168 9.8 -> 9.2 us) and cost as much or more on others (M=1 24576x1536 15.7 ->
#: 16.8, M=128 7168x16384 71 -> 91 us); an L2 prefetch of the weights before the wait did not
#: change that (benchmarks/NOTES.md). ``BLOCKSCALED_PDL=1`` in the environment (read at import)
#: or ``blockscaled.ops.gemm.PDL = True`` turns it on (e.g. behind a kernel that triggers
#: its dependents early).
PDL = os.environ.get("BLOCKSCALED_PDL", "0").strip() == "1"
#: False when gemm_kernel is the Triton interpreter's stand-in (TRITON_INTERPRET=1 at import):
#: the 3.6 interpreter cannot run griddepcontrol (``gdc_wait`` raises "_semantic argument must
#: be provided outside of JIT functions"), so PDL stays off there.
_GEMM_COMPILED = isinstance(gemm_kernel, JITFunction)
#: extra launch keywords, built once (the launch sits on the host hot path)
_PDL_ON = {"PDL": True, "launch_pdl": True}


def _nvidia() -> bool:
    """An NVIDIA build of torch (ROCm reports device type "cuda" too): the kernels may use PTX."""
    return torch.version.hip is None


@functools.lru_cache(maxsize=None)
def _pdl_capable(index: int) -> bool:
    """griddepcontrol / programmatic stream serialization exist on NVIDIA sm_90+ (not ROCm,
    whose torch also reports device type "cuda"). Cached: torch's query is not free on the host."""
    return torch.version.hip is None and torch.cuda.get_device_capability(index) >= (9, 0)


def _use_pdl(device: torch.device) -> bool:
    """Launch gemm_kernel with PDL on ``device``? (the module switch, a compiled kernel, sm_90+)"""
    if not (PDL and _GEMM_COMPILED and device.type == "cuda"):
        return False
    return _pdl_capable(device.index if device.index is not None else torch.cuda.current_device())


def _launch_triton(a2, a_s2, a_gs, b_data, b_scale, b_gs, b_rows, out2, bias, fmt: Format, m, n, k,
                   cfg: GemmConfig, promote: bool, interpret: bool) -> None:
    split, k_per_split = _split_plan(k, cfg.block_k, cfg.split_k)
    _launch_gemm_kernel(a2, a_s2, a_gs, b_data, b_scale, b_gs, b_rows, out2, bias, fmt, m, n, k, cfg, promote,
                        interpret, split, k_per_split)


def _launch_gemm_kernel(a2, a_s2, a_gs, b_data, b_scale, b_gs, b_rows, out2, bias, fmt: Format, m, n, k,
                        cfg: GemmConfig, promote: bool, interpret: bool, split: int, k_per_split: int) -> None:
    """One ``gemm_kernel`` launch with an explicit split plan (tests use it for plans that
    leave empty splits, which _split_plan never makes). With programmatic dependent launch
    where ``_use_pdl`` allows it (see ``PDL``)."""
    a_dense = a_s2 is None
    # keyed by the config object's id (hashing the dataclass costs more than the rest of the
    # key; the planner's memoised plans hand the same object back), checked by identity
    key = (id(cfg), fmt.name, m, n, k, promote, interpret, split, k_per_split, a2.dtype if a_dense else None,
           b_rows, bias is not None)
    hit = _GEMM_LAUNCH.get(key)
    if hit is not None and hit[0] is cfg:
        grid, tiles, kw = hit[1]
    else:
        grid, tiles, kw = _gemm_launch_consts(key, cfg)
    gs_b = b_gs if b_gs is not None else b_scale  # not read unless nvfp4
    gs_a = a_gs if a_gs is not None else gs_b
    a_s = a_s2 if a_s2 is not None else b_scale  # dense A: never read
    ws = cnt = None
    scs = 0
    if split > 1:
        # fp32 partials [split, M, N] (split stride M * N); written and read back by the same launch
        scs = m * n
        ws, cnt = splitk_scratch(out2.device, tiles, split * scs)
    if PDL and _use_pdl(out2.device):
        kw = {**kw, **_PDL_ON}
    # (every operand is 2-D here: stride() gives the (row, column) pair the kernel takes)
    fast(gemm_kernel)[grid](
        a2, a_s, b_data, b_scale, gs_a, gs_b, bias if bias is not None else out2, out2,
        m, n, k, k_per_split, *a2.stride(), *a_s.stride(), *b_data.stride(), *b_scale.stride(), scs, *out2.stride(),
        ws_ptr=ws, cnt_ptr=cnt, **kw,
    )


#: gemm_kernel's launch constants (grid, tile count, constexpr and option keywords) per call
#: shape and config: computed once, then one dict lookup per launch (host time per eager decode
#: call, benchmarks/NOTES.md "Eager host cost of MX/NV calls"). Bounded by _MEMO_MAX entries.
_GEMM_LAUNCH: dict[tuple, tuple] = {}
#: entries kept per host-path memo before it is cleared (shapes of a model: a few hundred)
_MEMO_MAX = 4096


def _gemm_launch_consts(key: tuple, cfg: GemmConfig) -> tuple:
    """(grid, tiles, keywords) of a gemm_kernel launch, memoised in ``_GEMM_LAUNCH`` under ``key``
    (``_launch_gemm_kernel``'s, which holds ``id(cfg)``)."""
    _, fmt_name, m, n, k, promote, interpret, split, k_per_split, a_dense_dtype, b_rows, has_bias = key
    a_dense = a_dense_dtype is not None
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    if cfg.swap_ab and b_rows % bn and b_rows > 1:
        raise ValueError(f"config.block_n: swap_ab with {b_rows}-row weight scale blocks needs block_n dividing "
                         f"{b_rows} (one scale row per tile), got {bn}")
    b_fmt = FORMAT_CODES[fmt_name]
    a_fmt = FORMAT_CODES["dense"] if a_dense else b_fmt
    tiles = _cdiv(m, bm) * _cdiv(n, bn)
    kw = dict(
        A_FMT=a_fmt, B_FMT=b_fmt, B_SCALE_ROWS=b_rows, PROMOTE=promote,
        DOT_DTYPE=_dot_dtype(promote, a_dense, a_dense_dtype, interpret),
        EVEN_K=k % bk == 0 and k_per_split % bk == 0, HAS_BIAS=has_bias, SPLIT_K=split, GROUP_M=cfg.group_m,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=cfg.num_warps, num_stages=cfg.num_stages, SWAP_AB=cfg.swap_ab,
    )
    consts = ((tiles, split), tiles, kw)
    if len(_GEMM_LAUNCH) >= _MEMO_MAX:
        _GEMM_LAUNCH.clear()
    _GEMM_LAUNCH[key] = (cfg, consts)  # cfg kept alive: its id stays its own while the entry exists
    return consts


def _launch_gemv(a2, a_s2, b_data, b_scale, b_rows, out2, bias, fmt: Format, m, n, k, cfg: GemmConfig,
                 a_gs=None, b_gs=None) -> None:
    """The CUDA-core decode GEMVs: kernels/triton/gemv.py (fp8_block x fp8_block, quantized A
    only) or kernels/triton/mx_gemv.py (mxfp8 / mxfp4 / nvfp4 weights, dense or quantized A;
    ``a_gs`` / ``b_gs``: the nvfp4 global scales, 0-d fp32)."""
    if fmt.name != "fp8_block":
        _launch_mx_gemv(a2, a_s2, a_gs, b_data, b_scale, b_gs, out2, bias, fmt, m, n, k, cfg)
        return
    if a_s2 is None:
        raise ValueError("config.strategy: 'gemv' takes fp8_block x fp8_block (quantized A) or mxfp8 / mxfp4 / "
                         "nvfp4 weights, got dense x fp8_block")
    if b_rows != 1 and b_rows % cfg.block_n:
        raise ValueError(f"config.block_n: 'gemv' needs block_n dividing the {b_rows}-row weight-scale block "
                         f"(one scale row per program), got {cfg.block_n}")
    fast(gemv_kernel)[(_cdiv(n, cfg.block_n), _cdiv(m, cfg.block_m))](
        a2, a_s2, b_data, b_scale, bias if bias is not None else out2, out2,
        m, n, k,
        a2.stride(0), a_s2.stride(0), a_s2.stride(-1), b_data.stride(0), b_scale.stride(0), b_scale.stride(1),
        out2.stride(0),
        B_SCALE_ROWS=b_rows, HAS_BIAS=bias is not None,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CHUNK_KB=cfg.block_k // 128, num_warps=cfg.num_warps,
        num_stages=1,
    )


def _launch_mx_gemv(a2, a_s2, a_gs, b_data, b_scale, b_gs, out2, bias, fmt: Format, m, n, k,
                    cfg: GemmConfig) -> None:
    """kernels/triton/mx_gemv.py::mx_gemv_kernel with ``cfg``'s tiles (one program per weight-row
    block x activation-row block). nvfp4 global scales as gemm_kernel takes them (0-d tensors)."""
    if cfg.gluon:  # kernels/hopper/mx_gemv_gluon.py (a forced config was checked by the planner)
        launch_mx_gemv_gluon(a2, b_data, b_scale, b_gs, fmt.name, k, out2, cfg, bias)
        return
    if cfg.block_n > 8:
        raise ValueError(f"config.block_n: the {fmt.name} GEMV holds a slice of every weight row of a program in "
                         f"each thread's registers and takes at most 8 rows, got {cfg.block_n}")
    gs_b = b_gs if b_gs is not None else b_scale  # not read unless nvfp4
    gs_a = a_gs if a_gs is not None else gs_b  # not read unless nvfp4 with quantized A
    a_s = a_s2 if a_s2 is not None else b_scale  # dense A: never read
    fast(mx_gemv_kernel)[(_cdiv(n, cfg.block_n) * _cdiv(m, cfg.block_m),)](
        a2, a_s, b_data, b_scale, gs_a, gs_b, bias if bias is not None else out2, out2,
        m, n, k,
        a2.stride(0), a_s.stride(0), a_s.stride(-1), b_data.stride(0), b_scale.stride(0), b_scale.stride(1),
        out2.stride(0),
        FMT=FORMAT_CODES[fmt.name], A_DENSE=a_s2 is None, HAS_BIAS=bias is not None, EVEN_K=k % 32 == 0,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SLICE=gemv_slice_elems(cfg.block_m),
        PTX=_nvidia(), num_warps=cfg.num_warps, num_stages=1,
    )


def _check_sm90_mx(strategy: str, a2, a_s2, fmt: Format, m: int, k: int, cfg: GemmConfig) -> None:
    """A forced ``strategy="stream"`` / ``"tiled"`` / ``"direct"`` config on operands the kernel cannot
    take: a clear error (the planner never plans them there: plan/stream.py, plan/tiled.py,
    plan/direct.py)."""
    if strategy == "direct" and fmt.name not in ("mxfp4", "nvfp4"):
        raise ValueError(f"config.strategy: 'direct' takes mxfp4 / nvfp4 weights, got {fmt.name}")
    if strategy == "direct" and m > cfg.block_m:
        raise ValueError(f"config.strategy: 'direct' takes M <= {cfg.block_m} rows, got M={m}")
    if strategy == "direct" and a_s2 is not None and not cfg.dequant_a:
        raise ValueError("config.dequant_a: strategy 'direct' takes bf16 activations; pass dequant_a=True to "
                         "dequantize quantized ones to bf16 first")
    if fmt.name not in _STREAM_FORMATS or (a_s2 is None and a2.dtype != torch.bfloat16):
        raise ValueError(f"config.strategy: {strategy!r} takes mxfp4 / nvfp4 / mxfp8 weights with bf16 or quantized "
                         f"activations, got {fmt.name} weights and {a2.dtype} activations")
    if not device_info(a2.device).is_hopper:
        raise ValueError(f"config.strategy: {strategy!r} is an sm_90 (Hopper) kernel, got a {a2.device} tensor")
    if (strategy == "stream" and m > 64) or k % 32:
        raise ValueError(f"config.strategy: {strategy!r} takes " + ("M <= 64 and " if strategy == "stream" else "")
                         + f"K % 32 == 0, got M={m}, K={k}")
    if strategy == "tiled" and a_s2 is not None and not cfg.dequant_a:
        raise ValueError("config.dequant_a: strategy 'tiled' dequantizes quantized activations to bf16 first; pass "
                         "dequant_a=True (the planner's configs do)")


def _tiled_activations(a2, a_s2, a_gs, fmt: Format, k: int, cfg: GemmConfig):
    """(bf16 x [..., M, K] the kernel's TMA can read, the activations' nvfp4 global scale or None):
    quantized activations through stream_activations' exact dequantize pass (``cfg.dequant_a``,
    checked); a bf16 x whose base or row stride is not 16-byte aligned (a slice) copied."""
    if a_s2 is not None:
        x, _, x_gs = stream_activations(a2, a_s2, a_gs, fmt, k, cfg)
        return x, x_gs
    if a2.data_ptr() % 16 or (a2.stride(-2) * 2) % 16 or a2.stride(-1) != 1:
        a2 = a2.clone(memory_format=torch.contiguous_format)  # always a fresh, aligned copy
    return a2, None


def stream_activations(a_data: torch.Tensor, a_scale: torch.Tensor | None, a_gs, fmt: Format, k: int,
                       cfg: GemmConfig):
    """The streaming kernel's activation operands ``(x, x_scale, x_gs)`` for launch_stream.

    bf16 activations (``a_scale`` None, weight-only): ``(a_data, None, None)``. Quantized mxfp4 /
    nvfp4 / mxfp8 activations (W x A) with ``cfg.dequant_a`` False: as they are, decoded in the
    kernel's gather. With ``cfg.dequant_a`` (the plan's choice above STREAM_GATHER_MAX_MP rows):
    dequantized to bf16 ``[..., K]`` by one pass of the dequantize kernel with a unit global scale.
    That is exact (e2m1 x E8M0, e2m1 x e4m3 and e4m3 x E8M0 have at most 6 significant bits, bf16
    has 8 and reaches 2**-133; only e4m3 subnormals times E8M0 scales below 2**-117 fall under
    it), so both ways give ``dequantize(a) @ dequantize(w).T`` up to the fp32 summation order.
    nvfp4's ``a_gs`` (0-d) goes to the kernel's epilogue either way."""
    if a_scale is None:
        return a_data, None, None
    x_gs = a_gs if fmt.has_global_scale else None
    if not cfg.dequant_a:
        return a_data, a_scale, x_gs
    gs = _one(a_data.device) if fmt.has_global_scale else None
    return _dequant(a_data, a_scale, gs, fmt, (*a_data.shape[:-1], k), 1, torch.bfloat16), None, x_gs


# --------------------------------------------------------------------------- dequant + cuBLAS
def _dequant(data, scale, gs, fmt: Format, shape, block_rows: int, dtype, pad=(0, 0)) -> torch.Tensor:
    """The one call into ops/quantize.py's internal dequantize (no validation, no custom-op
    dispatch, no ScaledTensor): ``data * scale [/ gs]`` as a new contiguous ``shape`` tensor, or
    with ``pad`` (rows, columns) as the top-left ``shape`` corner of a contiguous
    ``(rows + pad[0], cols + pad[1])`` tensor, which is returned whole: the padding columns are
    zero (they enter the K sums), the padding rows' other values are left unset (they only give
    output columns that are dropped). One launch more than unpadded where ``pad[1]``."""
    block = (block_rows, fmt.block_k) if block_rows == 1 else (block_rows, block_rows)
    if not any(pad):
        return _quant._dequantize_impl(data, scale, gs, fmt, shape, block, dtype)
    r, c = shape
    buf = torch.empty((r + pad[0], c + pad[1]), dtype=dtype, device=data.device)
    if pad[1]:
        buf[:, c:].zero_()
    _quant._dequantize_impl(data, scale, gs, fmt, shape, block, dtype, out=buf[:r, :c])
    return buf


#: cuBLAS's 16-bit GEMM where a matrix's rows are not 16-byte aligned (the output's N, the
#: operands' K; row stride or base) ran without vector access: H200, mxfp4 weight-only
#: 2048 x 5759 x 2880 (dequantize + cuBLAS) 709.5 us against 98.2 at N = 5760, 7.2x
#: (benchmarks/NOTES.md, thirty-sixth session). ``_dequant_matmul`` pads such rows to this many
#: bytes (zero K columns, extra output columns dropped): one more pass over the output (and over
#: weight-only activations at odd K) instead.
_CUBLAS_ROW_ALIGN = 16


def _pad_to_align(cols: int, elem_bytes: int) -> int:
    """Columns to add so that ``cols`` elements of ``elem_bytes`` fill whole 16-byte rows."""
    per = _CUBLAS_ROW_ALIGN // elem_bytes
    return -cols % per


def _rows_aligned(t: torch.Tensor) -> bool:
    """``t`` (2D, unit column stride) has 16-byte aligned rows and base."""
    es = t.element_size()
    return (t.shape[-1] * es) % _CUBLAS_ROW_ALIGN == 0 and (t.stride(0) * es) % _CUBLAS_ROW_ALIGN == 0 \
        and t.data_ptr() % _CUBLAS_ROW_ALIGN == 0


_ONES: dict[torch.device, torch.Tensor] = {}


def _one(device: torch.device) -> torch.Tensor:
    """Cached 0-d fp32 1.0 per device (an nvfp4 'global scale' that dequantizes exactly).
    Not cached while a CUDA graph is being captured (its memory and fill belong to the graph)."""
    t = _ONES.get(device)
    if t is None:
        t = torch.ones((), dtype=torch.float32, device=device)
        if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            _ONES[device] = t
    return t


#: aten::mm.dtype_out (bf16/fp16 x bf16/fp16 -> fp32 in cuBLAS) exists on CUDA in torch >= 2.8;
#: flipped off at the first failure.
_MM_FP32_OUT = [True]


def _mm_into(A, B, out2, post=None) -> None:
    """``out2 = (A @ B.T) / post`` for 16-bit (or fp32) A, B and any out2 dtype, accumulating in
    fp32; ``post`` (a 0-d device tensor) divides in fp32 before any 16-bit cast."""
    if A.dtype == out2.dtype:
        torch.mm(A, B.t(), out=out2)
        if post is not None:
            out2.div_(post)
        return
    if out2.dtype == torch.float32:
        res = out2
        if out2.device.type == "cuda" and _MM_FP32_OUT[0]:
            try:
                torch.mm(A, B.t(), out_dtype=torch.float32, out=out2)
            except (TypeError, RuntimeError, NotImplementedError):
                _MM_FP32_OUT[0] = False
        if not (out2.device.type == "cuda" and _MM_FP32_OUT[0]):
            torch.mm(A.float(), B.float().t(), out=out2)
    else:
        res = None
        if out2.device.type == "cuda":
            try:  # cuBLAS 16-bit inputs, fp32 output (aten::mm.dtype, torch >= 2.8)
                res = torch.mm(A, B.t(), out_dtype=torch.float32)
            except (TypeError, RuntimeError, NotImplementedError):
                res = None
        if res is None:
            res = A.float() @ B.float().t()
    if post is not None:
        res.div_(post)  # device 0-d tensor: no host sync
    if res is not out2:
        out2.copy_(res)


def _dequant_matmul(a2, a_s2, a_gs, b_data, b_scale, b_gs, b_rows, fmt: Format, k, out2, bias,
                    out_dtype) -> None:
    """Dequantize the operands (our Triton dequantize kernel) + torch.mm (cuBLAS).

    Operand dtype (exactness):
      * MX formats, quantized A: bf16, exact (e4m3/e2m1 x 2**e has <= 4 significant bits).
      * fp8_block (also weight-only): ``out_dtype`` (fp32 scales: e4m3 x scale is not exact in
        16 bits, so the operands are rounded only as far as the output will be).
      * other weight-only: A's dtype (fp16 engines do the same; B rounds once to it).
      * nvfp4 (global scales, never an extra pass over the output):
          - bf16 out: A exact (gs 1: e2m1 x e4m3 <= 6 significant bits), B dequantized with
            ``gs_a * gs_b`` (0-d product on the device) so B alone carries ``1/(gs_a gs_b)``:
            one bf16 rounding per B element, relative error <= 2**-9 (RMS ~1.1e-3 on the
            output, plus ~1.1e-3 from the bf16 output rounding; table limit 4e-3).
          - fp16 out: both operands with their own global scale in fp16 (<= 2**-12 each, RMS
            ~2e-4 together; limit 8e-4). Not the bf16 trick above: its 2**-9 would exceed the
            fp16 row, and B / (gs_a gs_b) can fall into fp16's subnormals.
          - fp32 out: exact operands, fp32 result, then one in-place division by
            ``gs_a gs_b`` (fp32 cannot overflow there; the fp32 limit 6e-4 rules out rounded
            operands). Weight-only: B carries gs_b in A's dtype, except bf16 A with fp16 or
            fp32 out: exact B, fp32 result divided by gs_b before the cast.
        Before this, 16-bit outputs held ``gs_a gs_b`` times the result and overflowed fp16.
    Bias: added by cuBLAS (addmm) when it has the output's dtype, else in place afterwards.
    """
    m, n = out2.shape
    a_dense = a_s2 is None
    post = None
    gs_a_op = gs_b_op = None
    if fmt.name == "fp8_block":
        op_dtype = out_dtype
    elif a_dense:
        op_dtype = a2.dtype
    elif fmt.has_global_scale and out_dtype == torch.float16:
        op_dtype = torch.float16
    else:
        op_dtype = torch.bfloat16
    if fmt.has_global_scale:
        if out_dtype == torch.float32 or (op_dtype == torch.bfloat16 and out_dtype == torch.float16):
            # bf16-rounded operands would miss the fp32 / fp16 rows of the tolerance table
            gs_a_op = gs_b_op = _one(out2.device)
            post = b_gs if a_dense else a_gs * b_gs
        elif a_dense or out_dtype == torch.float16:
            gs_a_op, gs_b_op = a_gs, b_gs
        else:
            gs_a_op, gs_b_op = _one(out2.device), a_gs * b_gs
    # unaligned rows (_CUBLAS_ROW_ALIGN): zero-padded K, extra output columns computed and dropped
    pk = _pad_to_align(k, torch.finfo(op_dtype).bits // 8)
    tmp_out = m > 0 and n > 0 and not _rows_aligned(out2)
    pn = _pad_to_align(n, out2.element_size()) if tmp_out else 0
    B = _dequant(b_data, b_scale, gs_b_op, fmt, (n, k), b_rows, op_dtype, pad=(pn, pk))
    if a_dense:
        A = a2 if a2.dtype == op_dtype else a2.to(op_dtype)  # fp8_block weight-only, other out dtype
        if pk:
            A = torch.nn.functional.pad(A, (0, pk))
    else:
        A = _dequant(a2, a_s2, gs_a_op, fmt, (m, k), 1, op_dtype, pad=(0, pk))
    res = torch.empty((m, n + pn), dtype=out2.dtype, device=out2.device) if tmp_out else out2
    if bias is not None and post is None and bias.dtype == out_dtype == op_dtype and not tmp_out:
        torch.addmm(bias, A, B.t(), out=res)
        return
    _mm_into(A, B, res, post)
    if tmp_out:
        out2.copy_(res[:, :n])
    if bias is not None:
        out2.add_(bias)


_DTYPE_NAMES = DTYPE_NAMES


def gemm_problem(a2, a_s2, b_data, b_rows: int, fmt: Format, k: int, m: int, n: int, out_dtype, bias,
                 out2: torch.Tensor | None = None, a_fmt: str = "") -> Problem:
    """The planner's view of one dense call (plain values). ``tma``: the Hopper kernels' TMA
    descriptors can take A, B (16-byte aligned bases and row strides) and the output. ``a_fmt``:
    the activations' format where it differs from the weight's (plan/mx_packed.py)."""
    tma = _tma_ok_mixed(b_data, k, n, out2) if a_fmt else _tma_ok(a2, a_s2, b_data, fmt, n, out2)
    return Problem("gemm", fmt.name, m, n, k, "quantized" if a_s2 is not None else _DTYPE_NAMES[a2.dtype],
                   _DTYPE_NAMES[out_dtype], bias is not None, b_rows, tma=tma,
                   interpret=b_data.device.type == "cpu" and _checks.INTERPRET, a_fmt=a_fmt)


def _tma_ok_mixed(b_data, k: int, n: int, out2) -> bool:
    """A mixed pair's operands suit the wide kernel's TMA: the e4m3 weight, the encoder's e4m3
    activations (fresh, contiguous: 16-byte rows when K % 16 == 0) and the output."""
    if b_data.device.type != "cuda" or not (out2 is None or out2.stride(1) == 1 or n <= 1):
        return False
    return k % 16 == 0 and _hopper.tma_2d_reason("b", b_data) is None


#: weight formats whose calls (weight-only and W x A) may take the streaming kernel (plan/stream.py)
_STREAM_FORMATS = ("mxfp4", "nvfp4", "mxfp8")


def _tma_ok(a2, a_s2, b_data, fmt: Format, n: int, out2) -> bool:
    """The sm_90 kernels' TMA descriptors can take the operands: A, B (16-byte aligned bases and row
    strides) and the output for the Hopper fp8_block kernels (quantized A); the packed weights for
    the streaming kernel (mxfp4 / nvfp4 weights; A is read without TMA). False for others
    and off CUDA."""
    if b_data.device.type != "cuda" or not (out2 is None or out2.stride(1) == 1 or n <= 1):
        return False
    if a_s2 is not None and fmt.name == "fp8_block":
        return _hopper.tma_2d_reason("a", a2) is None and _hopper.tma_2d_reason("b", b_data) is None
    if fmt.name in _STREAM_FORMATS:
        # quantized A is read as int32 words; dense A elementwise
        return (a_s2 is None or words_aligned(a2, a2.stride(0))) and _hopper.tma_2d_reason("b", b_data) is None
    return False


def make_plan(problem: Problem, device: torch.device, forced=None) -> Plan:
    """The plan of a dense call on ``device`` (``forced``: the caller's ``config=``)."""
    if isinstance(forced, Plan):
        return forced
    info = device_info(device)
    if device.type == "cuda":
        _hopper.warn_unchecked_mx_release(problem.fmt, info)
    plan = plan_gemm(problem, info, forced, gluon_ok=_hopper.gluon_unavailable_reason() is None)
    log_plan(plan)
    return plan


def gemm_impl(a2, a_s2, a_gs, b_data, b_scale, b_gs, b_rows: int, fmt: Format, k: int, out2, bias,
              cfg, out_dtype, a_fmt: str = "") -> None:
    """Compute into ``out2 [M, N]`` (allocated by the caller). No validation, no ScaledTensor.

    ``a2 [M, K']``: A data (packed for fp4) or dense bf16/fp16 activations; ``a_s2 [M, nk]``:
    A scales (None: dense, weight-only); ``a_gs``: A's nvfp4 global scale (0-d) or None.
    ``b_data [N, K']``, ``b_scale``, ``b_gs``, ``b_rows`` (1 or 128 scale rows): the weight.
    ``k``: logical K. ``cfg``: a :class:`Plan` to run as it is, or a forced config (``config=``),
    or None (the planner decides). ``a_fmt``: A's format name where it differs from ``fmt`` (a
    mixed pair, plan/mx_packed.py), else ""."""
    m, n = out2.shape
    if m == 0 or n == 0:
        return
    if cfg is None:
        plan = _memo_plan(a2, a_s2, b_data, b_rows, fmt, k, m, n, out_dtype, bias, out2, a_fmt)
    else:
        plan = make_plan(gemm_problem(a2, a_s2, b_data, b_rows, fmt, k, m, n, out_dtype, bias, out2, a_fmt),
                         out2.device, cfg)
    if a_fmt:
        _run_mixed(plan, a2, a_s2, get_format(a_fmt), b_data, b_scale, b_rows, fmt, k, out2, bias)
        return
    run_plan(plan, a2, a_s2, a_gs, b_data, b_scale, b_gs, b_rows, fmt, k, out2, bias, out_dtype)


def launch_mixed_wide(data, scale, flag, b_data, b_scale, out2, cfg: HopperConfig, bias) -> bool:
    """The wide kernel on encoded MX activations (``ops/mx_pack.py``: e4m3 data, per-32 fp32
    scales, row flags) x the fp8_block weight into ``out2``, then the bias (no bias epilogue in the
    wide kernel: one in-place pass). False (nothing launched) where the Gluon kernels cannot be
    built: the caller runs its fallback."""
    if not _hopper.gemm_fp8_block_hopper_impl(data, scale, b_data, b_scale, out2, cfg, asub=4, aflag=flag):
        return False
    if bias is not None:
        out2.add_(bias)
    return True


def _run_mixed(plan: Plan, a2, a_s2, a_fmt: Format, b_data, b_scale, b_rows: int, fmt: Format, k: int, out2,
               bias) -> None:
    """Run a mixed pair's plan (plan/mx_packed.py): the encoder + the wide kernel with per-32 A
    scales (a HopperConfig), or both operands dequantized to fp32 and multiplied by torch. If the
    Gluon kernels fail to build, the planner's plan without them runs (as ``run_plan``)."""
    m, n = out2.shape
    cfg = plan.config
    if isinstance(cfg, HopperConfig):
        if not mixed_config_ok(cfg):
            # (a Plan passed as config= is run as given: one made for another pair may not fit)
            raise ValueError(f"config: a {a_fmt.name} x {fmt.name} GEMM runs the wide kernel unsplit with 128-row "
                             f"tiles, got {cfg}")
        if launch_mixed_wide(*encode_raw(a2, a_s2, a_fmt.name, k), b_data, b_scale, out2, cfg, bias):
            return
    A = _dequant(a2, a_s2, None, a_fmt, (m, k), 1, torch.float32)
    B = _dequant(b_data, b_scale, None, fmt, (n, k), b_rows, torch.float32)
    res = A @ B.t()
    if bias is not None:
        res += bias.float()
    out2.copy_(res)


#: The planner's answers by the values a dense call's Problem is made of: building the Problem and
#: the device's properties, then hashing both for plan_gemm's lru_cache took ~15 us of the ~80 us
#: host time of an eager M=1 MX call (stubbed launch, this repository's CPU benchmark;
#: benchmarks/NOTES.md "Eager host cost of MX/NV calls"). fp8_block with quantized A also keys on
#: whether TMA can take the operands' addresses and whether the Gluon kernels can run (the two
#: inputs of its plan beyond shapes and dtypes), and so do mxfp4 / nvfp4 calls (the fp4
#: streaming kernel's TMA and Gluon bits). The key holds the planner function itself (a
#: replaced planner, e.g. a test's, is asked again). Bounded by _MEMO_MAX entries.
_PLANS: dict[tuple, Plan] = {}
_tuned.on_change(_PLANS.clear)  # a tuned plan stored or cleared changes the answer (plan/tuned.py)


def _memo_plan(a2, a_s2, b_data, b_rows: int, fmt: Format, k: int, m: int, n: int, out_dtype, bias, out2,
               a_fmt: str = "") -> Plan:
    """``make_plan(gemm_problem(...))`` through ``_PLANS``."""
    dev = out2.device
    sm90 = (fmt.name == "fp8_block" and a_s2 is not None) or fmt.name in _STREAM_FORMATS
    if a_fmt:
        hopper = (_tma_ok_mixed(b_data, k, n, out2), _hopper.gluon_unavailable_reason() is None)
    else:
        hopper = (_tma_ok(a2, a_s2, b_data, fmt, n, out2), _hopper.gluon_unavailable_reason() is None) if sm90 else None
    key = (plan_gemm, fmt.name, m, n, k, None if a_s2 is not None else a2.dtype, out_dtype, bias is not None, b_rows,
           dev, dev.type == "cpu" and _checks.INTERPRET, hopper, a_fmt)
    plan = _PLANS.get(key)
    if plan is None:
        plan = make_plan(gemm_problem(a2, a_s2, b_data, b_rows, fmt, k, m, n, out_dtype, bias, out2, a_fmt), dev)
        if len(_PLANS) >= _MEMO_MAX:
            _PLANS.clear()
        _PLANS[key] = plan
    else:
        log_plan(plan)  # what make_plan does with every plan it returns (observe_plans, LOG_PLANS)
    return plan


def run_plan(plan: Plan, a2, a_s2, a_gs, b_data, b_scale, b_gs, b_rows: int, fmt: Format, k: int, out2, bias,
             out_dtype) -> None:
    """Launch exactly ``plan`` (nothing is re-derived). The one exception: if the Gluon kernels
    fail to build on this triton, the launch records it (one warning per process) and the
    planner's plan without them runs instead."""
    m, n = out2.shape
    cfg = plan.config
    if isinstance(cfg, HopperConfig):
        if _hopper.gemm_fp8_block_hopper_impl(a2, a_s2, b_data, b_scale, out2, cfg):
            return
        plan = make_plan(gemm_problem(a2, a_s2, b_data, b_rows, fmt, k, m, n, out_dtype, bias, out2), out2.device)
        cfg = plan.config
    if cfg.strategy == "gemv":
        _launch_gemv(a2, a_s2, b_data, b_scale, b_rows, out2, bias, fmt, m, n, k, cfg, a_gs, b_gs)
        return
    if cfg.strategy == "dequant_matmul":
        _dequant_matmul(a2, a_s2, a_gs, b_data, b_scale, b_gs, b_rows, fmt, k, out2, bias, out_dtype)
        return
    if cfg.strategy == "stream":
        _check_sm90_mx("stream", a2, a_s2, fmt, m, k, cfg)
        x, x_scale, x_gs = stream_activations(a2, a_s2, a_gs, fmt, k, cfg)
        launch_stream(x, b_data, b_scale, b_gs, fmt.name, k, out2, cfg, x_scale=x_scale, x_gs=x_gs, bias=bias)
        return
    if cfg.strategy == "direct":
        _check_sm90_mx("direct", a2, a_s2, fmt, m, k, cfg)
        x, _, x_gs = stream_activations(a2, a_s2, a_gs, fmt, k, cfg)
        launch_direct(x, b_data, b_scale, b_gs, fmt.name, k, out2, cfg, x_gs=x_gs, bias=bias)
        return
    if cfg.strategy == "tiled":
        _check_sm90_mx("tiled", a2, a_s2, fmt, m, k, cfg)
        x, x_gs = _tiled_activations(a2, a_s2, a_gs, fmt, k, cfg)
        launch_tiled(x, b_data, b_scale, b_gs, fmt.name, k, out2, cfg, bias=bias, x_gs=x_gs)
        return
    a_dense = a_s2 is None
    a_dtype = a2.dtype if a_dense else None
    promote = cfg.promote if cfg.promote is not None else default_promote(fmt.name, m, a_dtype)
    interpret = out2.device.type == "cpu"
    _check_config(cfg, fmt, a_dense, a_dtype, promote, interpret)
    _launch_triton(a2, a_s2, a_gs, b_data, b_scale, b_gs, b_rows, out2, bias, fmt, m, n, k, cfg, promote,
                   interpret)


#: Eager calls skip the custom-op boundary (torch.library dispatch measured ~100 us per call
#: on the CPU stub benchmark; the GPU idles on it at M = 4096); torch.compile / export / fake
#: tensors / dispatch modes still go through the registered ops. Set False to A/B it.
EAGER_FAST_PATH = True
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _eager_ok(*ts) -> bool:
    """True when the ops may run their implementation directly: not tracing or compiling, no
    torch dispatch / function mode active, and plain tensors (not Fake/Functional subclasses)."""
    if not EAGER_FAST_PATH or torch.compiler.is_compiling():
        return False
    if torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled():
        return False
    return all(type(t) in _PLAIN for t in ts)


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
        config: force a configuration (tests, tuning): a :class:`~blockscaled.config.GemmConfig`
            (``strategy="hopper"``: the planner's best Hopper tiles), a
            :class:`~blockscaled.config.HopperConfig` or a :class:`~blockscaled.plan.Plan`;
            default: the planner's plan (``blockscaled.explain("gemm", a, b)`` shows it). A
            forced config runs eagerly (outside the custom op).
            Eager calls run the implementation directly; torch.compile / export / fake tensors
            go through the ``blockscaled::gemm`` custom ops (see ``_eager_ok``).
        bias: optional ``[N]`` tensor added in fp32 before the cast (used by ``linear``).

    Returns:
        ``[..., N]`` tensor of ``out_dtype`` (``out`` when given). nvfp4 applies
        ``1 / (gs_a * gs_b)`` (weight-only: ``1 / gs_b``) read from device memory.
        M = 0 returns an empty tensor without launching. No host synchronisation.
        Deterministic: bitwise identical from run to run for a given config, also with
        split-K (one launch; the last program of each tile sums the fp32 partials in split
        order, see kernels/triton/gemm.py; tile counters cached per device and stream, see
        ``_COUNTERS`` for the rule on concurrent CUDA-graph replays).
        CPU tensors without the Triton interpreter (``blockscaled._checks.use_reference``):
        the float64 reference, rounded once to ``out_dtype``.

    Autograd (same on every path; docs/errors.md): ``dA = dY @ dequantize(b)`` to a dense
    ``a`` or to the float tensor ``a`` was quantized from (straight-through), ``dB = dY.T @
    dequantize(a)`` to b's float source, ``dbias = dY.sum(rows)``; fp32 torch.matmul, cast to
    each input's dtype. ScaledTensor fields get no gradient. ``out=`` with an input that
    requires grad raises RuntimeError. Inputs that need no gradient skip all of it.

    Example::

        a = bs.quantize(x, "fp8_block")                        # [M, K] activations, 1x128 blocks
        b = bs.quantize(w, "fp8_block", block=(128, 128))      # [N, K] weight
        y = bs.gemm(a, b)                                      # [M, N] bf16
    """
    fmt, a_dense, lead, m, n, k = validate_gemm_args(a, b, out_dtype, out)
    a_fmt = "" if a_dense or a.format.name == fmt.name else a.format.name  # a mixed pair (plan/mx_packed.py)
    _check_bias(bias, n, b.device)
    if config is not None and not isinstance(config, (GemmConfig, HopperConfig, Plan)):
        raise TypeError(f"config: expected a GemmConfig, HopperConfig or Plan, got {type(config).__name__}")
    if explaining():
        a2 = a if a_dense else a.data
        a2 = _flatten_rows("a" if a_dense else "a.data", a2)
        a_s2 = None if a_dense else _flatten_rows("a.scale", a.scale)
        emit(make_plan(gemm_problem(a2, a_s2, b.data, b.block[0], fmt, k, m, n, out_dtype, bias,
                                    None if out is None else out.view(m, n), a_fmt), b.device, config))
    if _autograd.wants_grad(a, b, bias):
        return _autograd.gemm(a, b, out_dtype, out, config, bias)
    if _checks.use_reference(b.data):
        # CPU tensors without the Triton interpreter: compiled kernels cannot read host memory,
        # so run the float64 reference twin and round once to out_dtype: correct results on
        # every device, the same single rounding as the kernels' epilogue (docs/design.md,
        # "How `bs.gemm(a, b)` reaches a kernel", step 2).
        # No grad: ScaledTensor fields are constants on every path.
        with torch.no_grad():
            y = _ref_gemm(a, b, out_dtype=None, bias=bias)
        if out is None:
            return y.to(out_dtype)
        out.copy_(y)
        return out
    if a_dense:
        _check_unit_k_stride("a", a)
        a2, a_s2, a_gs = _flatten_rows("a", a), None, None
    else:
        _check_unit_k_stride("a.data", a.data)
        # the streaming kernel's gather, the dequantize pass and dequant + cuBLAS read a.scale's
        # blocks at unit column stride (the portable kernel takes any): one rule for every plan
        _check_unit_k_stride("a.scale", a.scale)
        a2 = _flatten_rows("a.data", a.data)
        a_s2 = _flatten_rows("a.scale", a.scale)
        a_gs = a.global_scale
    _check_unit_k_stride("b.data", b.data)
    if m == 0 or n == 0:
        return out if out is not None else torch.empty((*lead, n), dtype=out_dtype, device=b.device)
    if config is not None or _eager_ok(a2, b.data):
        # (2-D in, 2-D out: no view op, each ~1-3 us of host time)
        if out is None:
            out2 = torch.empty((m, n), dtype=out_dtype, device=b.device)
            out = out2 if len(lead) == 1 else out2.view(*lead, n)
        else:
            out2 = out if out.ndim == 2 else out.view(m, n)
        gemm_impl(a2, a_s2, a_gs, b.data, b.scale, b.global_scale, b.block[0], fmt, k, out2, bias, config, out_dtype,
                  a_fmt)
        return out
    # Local: import cycle ops.gemm -> ops._custom_ops -> ops.gemm.
    from . import _custom_ops

    if out is None:
        return _custom_ops.gemm_op(a2, a_s2, a_gs, b, bias, out_dtype, a_fmt).view(*lead, n)
    _custom_ops.gemm_out_op(a2, a_s2, a_gs, b, out.view(m, n), bias, a_fmt)
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
