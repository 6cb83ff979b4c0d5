"""``grouped_gemm_list``: G independent block-scaled GEMMs, each with its own M, N, K, in one
launch (the GPU MODE NVFP4 group GEMM). An eager op: its pointer table is built on the host.
Validation helpers and dtype tables are shared with :mod:`blockscaled.ops.grouped`."""

from __future__ import annotations

import torch

from .. import _checks
from .._checks import check_config_arg, check_tensor, use_reference
from ..config.gemm import GemmConfig
from ..kernels.triton._mma import FORMAT_CODES
from ..kernels.triton.grouped import grouped_list_kernel
from ..plan import Plan, Problem, device_info, log_plan
from ..plan.encoding import decode_plan, encode_plan
from ..plan.grouped import plan_grouped_list
from ..reference import grouped as _ref
from ._explain import emit, explaining
from .gemm import _DTYPE_NAMES, _cdiv, _eager_ok
from .grouped import _TL_OUT, _check_out_dtype, _check_scaled, _dot_dtype, _no_grad_support, check_pair
from .quantize import _pow2
from ._launch import fast

__all__ = ["grouped_gemm_list"]


def _grouped_list_impl(table: torch.Tensor, alpha: torch.Tensor, outs: list[torch.Tensor], fmt_id: int, b_br: int,
                       total_tiles: int, flops: int, nbytes: int, cfg: GemmConfig) -> None:
    """Launch :func:`grouped_list_kernel` once for all groups with the tiles of ``cfg`` (table
    built by the caller; ``promote`` resolved)."""
    g = table.shape[0]
    if total_tiles == 0:
        return
    fast(grouped_list_kernel)[(total_tiles,)](
        table, alpha, g, flops, nbytes,
        FMT=fmt_id, B_BR=b_br, OUT_DTYPE=_TL_OUT[outs[0].dtype], G_POW2=max(16, _pow2(g)),
        PROMOTE=cfg.promote, DOT_DTYPE=_dot_dtype(cfg.promote, table.device),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


@torch.library.custom_op("blockscaled::grouped_gemm_list", mutates_args=("outs",))
def _grouped_list_launch(
    table: torch.Tensor, alpha: torch.Tensor, outs: list[torch.Tensor],
    fmt_id: int, b_br: int, total_tiles: int, flops: int, nbytes: int, cfg: list[int],
) -> None:
    """:func:`_grouped_list_impl` with ``cfg`` = encode_plan(the plan)."""
    _grouped_list_impl(table, alpha, outs, fmt_id, b_br, total_tiles, flops, nbytes, decode_plan(cfg).config)


@_grouped_list_launch.register_fake
def _(*args, **kwargs) -> None:
    return None


def grouped_gemm_list(
    a_list,
    b_list,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    out_list=None,
    config: GemmConfig | dict | None = None,
) -> list[torch.Tensor]:
    """``[dequantize(a_g) @ dequantize(b_g).T for g]`` for G independent groups in ONE launch.

    The GPU MODE NVFP4 group GEMM: ``a_list[g]`` ScaledTensor ``[M_g, K_g]``, ``b_list[g]``
    ``[N_g, K_g]``, each group with its own M, N, K; all groups share one format (nvfp4 is
    the target; fp8_block, mxfp8 and mxfp4 also work) and row-contiguous data and scales.
    Returns a list of ``[M_g, N_g]`` tensors of ``out_dtype`` (bf16 default, as every op;
    GPU MODE's problem asks for ``out_dtype=torch.float16``), or writes into ``out_list``.

    A device table of pointers, shapes and tile offsets is built on the host from shapes and
    data pointers (host metadata, no device sync) and copied to the device each call; nvfp4
    per-group ``1 / (gs_a * gs_b)`` factors are computed on the device. The H2D table copy
    makes this op unsuitable for CUDA-graph capture (the pointers are baked into the table)
    and for torch.compile tracing (data pointers are read on the host): it is an eager op.
    Use :func:`grouped_gemm` for graph-captured / compiled MoE layers.

    No device metadata: shapes and pointers come from the host, so there is nothing for the
    device-side check of :func:`grouped_gemm` to validate. No autograd: a ScaledTensor
    quantized from a float tensor that requires grad raises ``RuntimeError`` (grad mode on).

    Example::

        ys = bs.grouped_gemm_list([bs.quantize(x, "nvfp4") for x in xs],
                                  [bs.quantize(w, "nvfp4") for w in ws])   # bf16 [M_g, N_g] each
    """
    _check_out_dtype(out_dtype)
    check_config_arg(config)
    if not isinstance(a_list, (list, tuple)) or not isinstance(b_list, (list, tuple)):
        raise TypeError(f"a_list/b_list: expected lists of ScaledTensors, got {type(a_list).__name__}, {type(b_list).__name__}")
    if len(a_list) != len(b_list):
        raise ValueError(f"b_list: expected {len(a_list)} groups (len(a_list)), got {len(b_list)}")
    g = len(a_list)
    if g == 0:
        return []
    for i, (a, b) in enumerate(zip(a_list, b_list)):  # types first: what follows reads .format
        _check_scaled(f"a_list[{i}]", a, 2)
        _check_scaled(f"b_list[{i}]", b, 2)
    if torch.is_grad_enabled():
        _no_grad_support("grouped_gemm_list", **{f"a_list[{i}]": x for i, x in enumerate(a_list)},
                         **{f"b_list[{i}]": x for i, x in enumerate(b_list)})
    fmt = a_list[0].format
    dev = a_list[0].device
    b_br = b_list[0].block[0]
    for i, (a, b) in enumerate(zip(a_list, b_list)):
        check_pair(a, b, f"a_list[{i}]", f"b_list[{i}]")
        if a.format != fmt:
            raise ValueError(f"a_list[{i}]: format {a.format.name} differs from a_list[0]'s {fmt.name} (one launch, one format)")
        if a.device != dev:
            raise ValueError(f"a_list[{i}]: on {a.device}, a_list[0] on {dev}")
        if a.block[0] != 1:
            raise ValueError(f"a_list[{i}]: expected 1x{fmt.block_k} activation blocks, got {a.block}")
        if b.block[0] != b_br:
            raise ValueError(f"b_list[{i}]: block {b.block} differs from b_list[0]'s {b_list[0].block}")
        for nm, t in ((f"a_list[{i}]", a), (f"b_list[{i}]", b)):
            for part in ("data", "scale"):
                x = getattr(t, part)
                if x.numel() and not x.is_contiguous():
                    raise ValueError(f"{nm}.{part}: expected a contiguous tensor, got strides {x.stride()}")
    shapes = [(a.shape[0], b.shape[0], a.shape[1]) for a, b in zip(a_list, b_list)]
    if out_list is None:
        out_list = [torch.empty((m, n), dtype=out_dtype, device=dev) for m, n, _ in shapes]
    else:
        if len(out_list) != g:
            raise ValueError(f"out_list: expected {g} tensors, got {len(out_list)}")
        for i, (o, (m, n, _)) in enumerate(zip(out_list, shapes)):
            check_tensor(f"out_list[{i}]", o, dtypes=(out_dtype,), device=dev)
            if tuple(o.shape) != (m, n) or (o.numel() and not o.is_contiguous()):
                raise ValueError(f"out_list[{i}]: expected a contiguous ({m}, {n}) tensor, got {tuple(o.shape)} strides {o.stride()}")
    if use_reference(a_list[0].data):
        if explaining():
            emit(Plan("grouped_list", "reference", None, reasons=("CPU tensors without TRITON_INTERPRET=1: the "
                                                                "float64 reference",)))
        with torch.no_grad():
            for o, y in zip(out_list, _ref.grouped_gemm_list(a_list, b_list)):
                o.copy_(y.to(out_dtype))
        return list(out_list)
    max_rows = max(m for m, _, _ in shapes)
    p = Problem("grouped_list", fmt.name, max_rows, max(n for _, n, _ in shapes), max(k for *_, k in shapes),
                out_dtype=_DTYPE_NAMES[out_dtype], b_block_rows=b_br, experts=g,
                interpret=dev.type == "cpu" and _checks.INTERPRET)
    plan = plan_grouped_list(p, device_info(dev), config)
    if explaining():
        emit(plan)
    log_plan(plan)
    cfg = plan.config
    rows, tile0, flops, nbytes = [], 0, 0, 0
    for (m, n, k), a, b, o in zip(shapes, a_list, b_list, out_list):
        rows.append([a.data.data_ptr(), a.scale.data_ptr(), b.data.data_ptr(), b.scale.data_ptr(),
                     o.data_ptr(), m, n, k, tile0])
        tile0 += _cdiv(m, cfg.block_m) * _cdiv(n, cfg.block_n)
        flops += 2 * m * n * k
        nbytes += a.nbytes() + b.nbytes() + o.numel() * o.element_size()
    table = torch.tensor(rows, dtype=torch.int64).to(dev)
    if fmt.has_global_scale:
        gsa = torch.stack([a.global_scale.reshape(()) for a in a_list])
        gsb = torch.stack([b.global_scale.reshape(()) for b in b_list])
        alpha = torch.reciprocal(gsa * gsb)
    else:
        alpha = table  # never read outside nvfp4
    args = (table, alpha, list(out_list), FORMAT_CODES[fmt.name], b_br, tile0, flops, nbytes)
    if _eager_ok(table, *out_list):
        _grouped_list_impl(*args, cfg)
    else:
        torch.ops.blockscaled.grouped_gemm_list(*args, encode_plan(plan))
    return list(out_list)
