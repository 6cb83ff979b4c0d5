"""NVIDIA ModelOpt (TensorRT Model Optimizer) NVFP4 checkpoints (``quant_algo: NVFP4``).

Layout of one quantized linear (ModelOpt's unified Hugging Face export, read by vLLM's and
SGLang's ``modelopt`` loaders and by TensorRT-LLM)::

    <prefix>.weight          uint8          [..., N, K/2]   two e2m1 codes per byte, element 2i low nibble
    <prefix>.weight_scale    float8_e4m3fn  [..., N, K/16]  per-16-element block scales
    <prefix>.weight_scale_2  float32        []  (or [1])    per-tensor scale
    <prefix>.input_scale     float32        []  (or [1])    static activation scale (optional)

Conventions. ModelOpt's scales are *dequantization* multipliers
(``NVFP4QTensor.dequantize``: ``w = e2m1 * (weight_scale * weight_scale_2)``, with
``weight_scale_2 = amax(W) / (6 * 448)`` and ``input_scale = amax(x) / (6 * 448)``). blockscaled's
nvfp4 ``global_scale`` is the *encode* scale ``gs = 448 * 6 / amax`` with
``w = e2m1 * weight_scale / gs`` (docs/formats.md), the convention of compressed-tensors'
``weight_global_scale`` and of TensorRT-LLM's kernels, which are handed ``1 / weight_scale_2`` and
``1 / input_scale``. So::

    global_scale       = 1 / weight_scale_2      (fp32 IEEE division)
    input_global_scale = 1 / input_scale

The e2m1 codes, their packing and the e4m3 block scales are the same bits in both. The per-tensor
scale crosses a reciprocal: fp32 ``1 / (1 / x)`` gives back ``x`` for about 86% of fp32 values
(and every power of two); for the others it is off by one ulp, because no fp32 ``c`` has
``1 / c == x``. So ``global_scale`` round-trips bitwise (ours -> ModelOpt -> ours) exactly when
``1 / (1 / gs) == gs``, and dequantized values agree with ModelOpt's to within two fp32
roundings (theirs multiplies by ``weight_scale_2``, ours divides by ``gs``).
"""

from __future__ import annotations

import torch

from ..formats import NVFP4, ScaleRounding
from ..tensor import ScaledTensor
from ._common import (LoadedWeight, as_mapping, check_dtype, check_min_ndim, check_prefix, check_scaled, check_shape,
                      fp4_logical_k, get, key, make, reciprocal, scalar_fp32, trim_fp4)

__all__ = ["load_modelopt_nvfp4", "to_modelopt_nvfp4"]


def load_modelopt_nvfp4(tensors, prefix: str = "", *, k: int | None = None) -> LoadedWeight:
    """Read a ModelOpt NVFP4 linear as an nvfp4 :class:`~blockscaled.ScaledTensor` (plus its
    static activation scale, converted to our convention).

    Keys: ``prefix.weight`` uint8 ``[..., N, K/2]`` (packed e2m1, element ``2i`` in the low
    nibble), ``prefix.weight_scale`` float8_e4m3fn ``[..., N, ceil(K/16)]``,
    ``prefix.weight_scale_2`` fp32 scalar (shape ``[]`` or ``[1]``), and optionally
    ``prefix.input_scale`` fp32 scalar. See the module docstring for the conventions:
    ``global_scale = 1 / weight_scale_2``, ``input_global_scale = 1 / input_scale``.

    Args:
        tensors: mapping of checkpoint names to tensors, or a ``safetensors.safe_open`` handle.
        prefix: module path, e.g. ``"model.layers.0.self_attn.q_proj"``.
        k: the logical K when it is not ``2 * weight.shape[-1]``: ModelOpt zero-pads K up to a
            multiple of 16 before packing, and an odd K leaves a zero high nibble. The codes
            beyond column ``k`` must be zero (else ValueError); the scales of blocks wholly
            beyond it are dropped.

    Returns:
        :class:`LoadedWeight` ``(weight, input_global_scale)``: ``weight`` nvfp4, shape
        ``[..., N, K]``, block ``(1, 16)``, 0-d fp32 ``global_scale``; ``input_global_scale``
        0-d fp32 or ``None`` without ``input_scale``.

    Example::

        from blockscaled.checkpoint import load_file, load_modelopt_nvfp4
        sd = load_file("model.safetensors")
        w, x_gs = load_modelopt_nvfp4(sd, "model.layers.0.mlp.down_proj")
        xq = bs.quantize(x, "nvfp4", global_scale=x_gs)   # the calibrated activation scale
        y = bs.gemm(xq, w)
    """
    tensors = as_mapping(tensors)
    prefix = check_prefix(prefix)
    wk, sk, s2k, ik = (key(prefix, n) for n in ("weight", "weight_scale", "weight_scale_2", "input_scale"))
    w = get(tensors, wk, "the packed e2m1 weight, uint8 [..., N, K/2]")
    check_dtype(wk, w, (torch.uint8,), "packed e2m1 codes, two per byte")
    check_min_ndim(wk, w, 2, "weight [..., N, K/2]")
    s = get(tensors, sk, "the e4m3 block scales [..., N, K/16]")
    check_dtype(sk, s, (torch.float8_e4m3fn,), "nvfp4 block scales")
    layout_k = 2 * w.shape[-1]
    check_shape(sk, s, (*w.shape[:-1], -(-layout_k // 16)), f"[..., N, K/16] for {wk} of shape {tuple(w.shape)}")
    if s.device != w.device:
        raise ValueError(f"{sk}: on {s.device}, expected the weight's device {w.device}")
    k = fp4_logical_k(wk, layout_k, k, w)
    ws2 = scalar_fp32(s2k, get(tensors, s2k, "the fp32 per-tensor dequantization scale"),
                      "per-tensor dequantization scale", w.device)
    gs = reciprocal(ws2)
    igs = None
    if ik in tensors:
        igs = reciprocal(scalar_fp32(ik, get(tensors, ik, "the activation scale"),
                                     "per-tensor activation dequantization scale", w.device))
    st = make(trim_fp4(w, k), s[..., : -(-k // 16)], NVFP4, (*w.shape[:-1], k), (1, 16), ScaleRounding.NVFP4,
              gs=gs.reshape(()))
    return LoadedWeight(st, igs)


def to_modelopt_nvfp4(w: ScaledTensor, prefix: str = "", *, input_global_scale=None) -> dict:
    """Write an nvfp4 weight in ModelOpt's NVFP4 layout.

    Args:
        w: nvfp4 ScaledTensor ``[..., N, K]``.
        prefix: module path.
        input_global_scale: optional activation encode scale (our convention: what
            ``bs.quantize(x, "nvfp4", global_scale=...)`` takes), a float or 1-element tensor;
            written as ``input_scale = 1 / input_global_scale``.

    Returns:
        ``{prefix.weight: uint8 [..., N, ceil(K/2)], prefix.weight_scale: float8_e4m3fn
        [..., N, ceil(K/16)], prefix.weight_scale_2: fp32 [] (= 1 / global_scale),
        prefix.input_scale: fp32 []}`` (the last only with ``input_global_scale``). ``weight`` and
        ``weight_scale`` are ``w``'s own tensors. K is written unpadded: a K that is not a multiple
        of 16 (which ModelOpt itself pads) needs ``k=`` when loaded back, an odd K too.

    Example::

        w = bs.quantize(W, "nvfp4")
        sd = to_modelopt_nvfp4(w, "model.layers.0.mlp.down_proj", input_global_scale=x_gs)
        save_file(sd, "model.safetensors")
    """
    check_scaled("w", w, ("nvfp4",))
    prefix = check_prefix(prefix)
    out = {
        key(prefix, "weight"): w.data,
        key(prefix, "weight_scale"): w.scale,
        key(prefix, "weight_scale_2"): reciprocal(w.global_scale.reshape(())),
    }
    if input_global_scale is not None:
        igs = torch.as_tensor(input_global_scale, dtype=torch.float32, device=w.device)
        if igs.numel() != 1:
            raise ValueError(f"input_global_scale: expected a single value, got shape {tuple(igs.shape)}")
        out[key(prefix, "input_scale")] = reciprocal(igs.reshape(()))
    return out
