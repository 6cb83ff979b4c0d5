"""DeepSeek-V3 / Hugging Face FineGrainedFP8 128x128 block-scaled fp8 weights.

Layout (DeepSeek-V3's ``inference/convert.py`` and ``kernel.py::weight_dequant``, transformers'
``integrations/finegrained_fp8.py``)::

    <prefix>.weight            float8_e4m3fn  [..., N, K]
    <prefix>.weight_scale_inv  float32        [..., ceil(N/128), ceil(K/128)]

``weight_scale_inv`` is, despite its name, the *dequantization* multiplier
(``w[i, j] = weight[i, j] * weight_scale_inv[i // 128, j // 128]``: it is the inverse of the scale
the weight was divided by), exactly what ``ScaledTensor.scale`` holds for fp8_block, so the
conversion copies no bits. transformers' FP8 models and compressed-tensors' ``FP8_BLOCK`` scheme
spell it ``weight_scale`` (same meaning and shape); MoE experts stacked on a leading dimension
(``experts.gate_up_proj`` + ``experts.gate_up_proj_scale_inv``, ``[E, N, K]``) are read with
``weight_name=``. DeepSeek-V3.1-style ``scale_fmt: ue8m0`` checkpoints hold power-of-two scales,
in fp32 or as ``torch.float8_e8m0fnu`` (transformers' ue8m0 option); both are read exactly.
"""

from __future__ import annotations

import torch

from .._checks import resolve_rounding
from ..formats import FP8_BLOCK, ScaleRounding
from ..tensor import ScaledTensor
from ._common import (E8M0_DTYPE, as_mapping, check_dtype, check_min_ndim, check_prefix, check_scaled, check_shape,
                      get, key, make)

__all__ = ["load_fp8_block", "to_fp8_block"]

_SCALE_SUFFIXES = ("_scale_inv", "_scale")
_SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, E8M0_DTYPE)
_BLOCK = (128, 128)


def _e8m0_to_fp32(s: torch.Tensor) -> torch.Tensor:
    """``float8_e8m0fnu`` -> fp32 ``2**(b - 127)`` exactly (255 -> NaN), from the bits."""
    b = s.view(torch.uint8).to(torch.int32)
    v = (b << 23).view(torch.float32)
    v = torch.where(b == 0, 2.0**-127, v)  # biased 0 is the fp32 denormal 2**-127
    return torch.where(b == 255, float("nan"), v)


def _all_pow2(s: torch.Tensor) -> bool:
    """Every scale a positive normal power of two (what RCEIL / UE8M0 produce)."""
    if s.numel() == 0:
        return False
    bits = s.view(torch.int32)
    exp = (bits >> 23) & 0xFF
    return bool(((bits & 0x807FFFFF) == 0).logical_and(exp > 0).logical_and(exp < 255).all())


def load_fp8_block(tensors, prefix: str = "", *, weight_name: str = "weight", rounding=None) -> ScaledTensor:
    """Read a 128x128 block-scaled fp8 weight (DeepSeek-V3 / FineGrainedFP8 / compressed-tensors
    ``FP8_BLOCK``) as an fp8_block :class:`~blockscaled.ScaledTensor`.

    Keys (``w = prefix + "." + weight_name``):

    * ``w``: ``torch.float8_e4m3fn`` ``[..., N, K]`` (leading dimensions: stacked experts).
    * ``w + "_scale_inv"`` or ``w + "_scale"`` (exactly one of them): ``[..., ceil(N/128),
      ceil(K/128)]`` dequantization multipliers, fp32 (bf16 / fp16 are widened exactly;
      ``torch.float8_e8m0fnu`` UE8M0 scales are decoded exactly to fp32 powers of two).

    N and K need not be multiples of 128 (the last blocks are partial, as in DeepSeek's
    ``weight_dequant``). The layout does not record the block size: it is assumed to be the
    checkpoint's ``weight_block_size`` / ``block_structure`` of ``[128, 128]``, the only one
    blockscaled runs; the scale shape is checked against it.

    Args:
        tensors: mapping of checkpoint names to tensors (a state dict, :func:`load_file`'s
            result) or a ``safetensors.safe_open`` handle.
        prefix: module path, e.g. ``"model.layers.0.mlp.down_proj"`` (``""``: bare names).
        weight_name: the weight's name inside the module: ``"weight"`` for linears,
            ``"gate_up_proj"`` / ``"down_proj"`` for transformers' stacked FP8 experts.
        rounding: the result's ``rounding`` (how ``bs.linear`` scales the activations). ``None``:
            ``RCEIL`` when every scale is a power of two (DeepSeek-V3.1 / UE8M0 checkpoints, what
            DeepGEMM's packed-UE8M0 path needs), else ``EXACT`` (DeepSeek-V3's ``amax / 448``).

    Returns:
        fp8_block ScaledTensor, ``shape [..., N, K]``, ``block (128, 128)``; ``data`` is the
        checkpoint tensor itself (no copy when it is contiguous), ``scale`` fp32.

    Example::

        import blockscaled as bs
        from blockscaled.checkpoint import load_file, load_fp8_block
        sd = load_file("model-00001-of-00163.safetensors")
        w = load_fp8_block(sd, "model.layers.3.mlp.shared_experts.down_proj")
        y = bs.linear(x, w)                       # = x @ dequantize(w).T
    """
    tensors = as_mapping(tensors)
    prefix = check_prefix(prefix)
    if not isinstance(weight_name, str) or not weight_name:
        raise TypeError(f"weight_name: expected a non-empty str such as 'weight', got {weight_name!r}")
    wk = key(prefix, weight_name)
    w = get(tensors, wk, "the fp8 e4m3 weight [..., N, K]")
    check_dtype(wk, w, (torch.float8_e4m3fn,), "fp8_block weight")
    check_min_ndim(wk, w, 2, "weight [..., N, K]")
    present = [wk + s for s in _SCALE_SUFFIXES if wk + s in tensors]
    if len(present) > 1:
        raise ValueError(f"{wk}: both {present[0]} and {present[1]} are present; expected one block scale tensor")
    sk = present[0] if present else wk + _SCALE_SUFFIXES[0]
    s = get(tensors, sk, f"the 128x128 block scales (or {wk}{_SCALE_SUFFIXES[1]})")
    check_dtype(sk, s, _SCALE_DTYPES, "128x128 block dequantization scales")
    n, k = w.shape[-2], w.shape[-1]
    want = (*w.shape[:-2], -(-n // 128), -(-k // 128))
    check_shape(sk, s, want, f"[..., ceil(N/128), ceil(K/128)] for weight {tuple(w.shape)} in 128x128 blocks")
    if s.device != w.device:
        raise ValueError(f"{sk}: on {s.device}, expected the weight's device {w.device}")
    is_e8m0 = E8M0_DTYPE is not None and s.dtype == E8M0_DTYPE
    scale = _e8m0_to_fp32(s) if is_e8m0 else s.float()
    if rounding is None:
        rounding = ScaleRounding.RCEIL if is_e8m0 or _all_pow2(scale) else ScaleRounding.EXACT
    else:
        rounding = resolve_rounding("rounding", rounding, FP8_BLOCK)
    return make(w, scale, FP8_BLOCK, w.shape, _BLOCK, rounding)


def to_fp8_block(w: ScaledTensor, prefix: str = "", *, weight_name: str = "weight",
                 scale_suffix: str = "_scale_inv", scale_dtype: torch.dtype = torch.float32) -> dict:
    """Write an fp8_block weight (128x128 blocks) in the DeepSeek-V3 / FineGrainedFP8 layout.

    Args:
        w: fp8_block ScaledTensor ``[..., N, K]`` with ``block=(128, 128)`` (quantize weights
            with ``bs.quantize(W, "fp8_block", block=(128, 128))``).
        prefix, weight_name: as in :func:`load_fp8_block`.
        scale_suffix: ``"_scale_inv"`` (DeepSeek-V3, transformers FineGrainedFP8) or
            ``"_scale"`` (compressed-tensors ``FP8_BLOCK``, transformers' alternative spelling).
        scale_dtype: ``torch.float32`` (exact) or ``torch.float8_e8m0fnu`` (transformers'
            ``scale_fmt="ue8m0"``; every scale must be a power of two, i.e. ``rounding="rceil"``,
            else ValueError).

    Returns:
        ``{prefix.weight_name: data (float8_e4m3fn [..., N, K]), prefix.weight_name + scale_suffix:
        scale ([..., ceil(N/128), ceil(K/128)])}``; the tensors are ``w``'s own (no copy) for fp32.

    Example::

        w = bs.quantize(W, "fp8_block", block=(128, 128))
        sd = to_fp8_block(w, "model.layers.0.mlp.down_proj")
        # {'model.layers.0.mlp.down_proj.weight': ..., 'model.layers.0.mlp.down_proj.weight_scale_inv': ...}
    """
    check_scaled("w", w, ("fp8_block",), blocks=(_BLOCK,))
    prefix = check_prefix(prefix)
    if scale_suffix not in _SCALE_SUFFIXES:
        raise ValueError(f"scale_suffix: expected one of {list(_SCALE_SUFFIXES)}, got {scale_suffix!r}")
    wk = key(prefix, weight_name)
    scale = w.scale
    if scale_dtype == torch.float32:
        pass
    elif E8M0_DTYPE is not None and scale_dtype == E8M0_DTYPE:
        if scale.numel() and not _all_pow2(scale):
            raise ValueError(
                f"scale_dtype: float8_e8m0fnu holds powers of two only, but w's scales are not all powers "
                f"of two (rounding={w.rounding.name}); quantize with rounding='rceil' or save fp32 scales"
            )
        scale = ((scale.view(torch.int32) >> 23) & 0xFF).to(torch.uint8).view(E8M0_DTYPE)
    else:
        raise TypeError(f"scale_dtype: expected torch.float32 or torch.float8_e8m0fnu, got {scale_dtype}")
    return {wk: w.data, wk + scale_suffix: scale}
