"""compressed-tensors checkpoints (llm-compressor's output, ``quant_method: compressed-tensors``).

The four block-scaled schemes, one quantized linear each (names and shapes from
compressed-tensors' compressors, ``compressors/{nvfp4,mxfp4,mxfp8,naive_quantized}``, and its
presets ``NVFP4`` / ``MXFP4`` / ``MXFP8`` / ``FP8_BLOCK``)::

    nvfp4  (format "nvfp4-pack-quantized", strategy tensor_group, group 16)
        <prefix>.weight_packed        uint8          [N, K/2]   e2m1, element 2i in the low nibble
        <prefix>.weight_scale         float8_e4m3fn  [N, K/16]
        <prefix>.weight_global_scale  float32        [1]        encode scale, 448 * 6 / amax(W)
        <prefix>.input_global_scale   float32        [1]        activations' encode scale (static; optional)
    mxfp4  (format "mxfp4-pack-quantized", group 32)
        <prefix>.weight_packed        uint8          [N, K/2]
        <prefix>.weight_scale         uint8          [N, K/32]  E8M0, 2**(s - 127)
    mxfp8  (format "mxfp8-quantized", group 32)
        <prefix>.weight               float8_e4m3fn  [N, K]
        <prefix>.weight_scale         uint8          [N, K/32]  E8M0
    fp8_block  (format "float-quantized", strategy block, block_structure [128, 128])
        <prefix>.weight               float8_e4m3fn  [N, K]
        <prefix>.weight_scale         fp32 / bf16    [ceil(N/128), ceil(K/128)]  dequantization multipliers

Conventions. compressed-tensors dequantizes ``x_q * (weight_scale / weight_global_scale)``
(``quantization/lifecycle/forward.py::_dequantize``), and its ``weight_global_scale`` is the encode
scale ``448 * 6 / amax`` (``quantization/utils/helpers.py::generate_gparam``): the same number as
blockscaled's nvfp4 ``global_scale``, so nothing is inverted and every bit round-trips. Dequantized
values agree with compressed-tensors' in fp32 to one rounding (it divides the scale by the global
scale first; blockscaled divides the exact product). ``input_global_scale`` is likewise the
activations' encode scale (``bs.quantize(x, "nvfp4", global_scale=...)``). The E8M0 scales are
the same biased exponents blockscaled stores (``compressors/mx_utils.py``).

Not verified here: compressed-tensors may store an fp8_block ``weight_scale`` in the model's
dtype (bf16) rather than fp32; both are read exactly, fp32 is written. Pack-quantized INTn
(``weight_packed`` int32) and per-channel / per-tensor fp8 are not block-scaled formats and raise.
"""

from __future__ import annotations

import torch

from ..formats import MXFP4, MXFP8, NVFP4, ScaleRounding
from ..tensor import ScaledTensor
from ._common import (LoadedWeight, as_mapping, check_dtype, check_min_ndim, check_prefix, check_scaled, check_shape,
                      e8m0_codes, fp4_logical_k, get, key, make, resolve_mx_rounding, scalar_fp32, trim_fp4)
from .fp8 import load_fp8_block, to_fp8_block

__all__ = ["load_compressed_tensors", "to_compressed_tensors"]

_FORMATS = ("nvfp4", "mxfp4", "mxfp8", "fp8_block")


def _weight_shape(tensors, prefix: str, n: int):
    """The optional ``weight_shape`` (int tensor ``(N, K)``) some pack-quantized checkpoints carry:
    the logical K of packed data whose K is odd."""
    wsk = key(prefix, "weight_shape")
    if wsk not in tensors:
        return None
    t = get(tensors, wsk, "the logical weight shape")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.ndim != 1 or t.numel() < 2:
        raise ValueError(f"{wsk}: expected a 1-D integer tensor (N, K), got {t.dtype} of shape {tuple(t.shape)}")
    shape = [int(v) for v in t.tolist()]
    if shape[-2] != n:
        raise ValueError(f"{wsk}: expected N = {n} (rows of the packed weight), got shape {shape}")
    return shape[-1]


def _detect(tensors, prefix: str) -> str:
    pk, wk, sk = key(prefix, "weight_packed"), key(prefix, "weight"), key(prefix, "weight_scale")
    if pk in tensors:
        s = get(tensors, sk, "the block scales of the packed weight")
        if s.dtype == torch.float8_e4m3fn:
            return "nvfp4"
        return "mxfp4"  # e8m0_codes checks the dtype with the key's name
    w = get(tensors, wk, f"a compressed-tensors weight ({pk} for nvfp4 / mxfp4, {wk} for mxfp8 / fp8_block)")
    s = get(tensors, sk, "the block scales")
    if w.dtype == torch.float8_e4m3fn and s.dtype == torch.uint8:
        return "mxfp8"
    return "fp8_block"  # load_fp8_block checks dtypes and shapes with the keys' names


def load_compressed_tensors(tensors, prefix: str = "", *, format: str | None = None, k: int | None = None,
                            rounding=None) -> LoadedWeight:
    """Read one compressed-tensors block-scaled linear (nvfp4, mxfp4, mxfp8 or fp8_block) as a
    :class:`~blockscaled.ScaledTensor`; see the module docstring for the keys and conventions.

    The scheme is told by the keys and dtypes: ``weight_packed`` with e4m3 ``weight_scale`` ->
    nvfp4, with uint8 (E8M0) ``weight_scale`` -> mxfp4; fp8 ``weight`` with uint8 ``weight_scale``
    -> mxfp8, with a float ``weight_scale`` ``[ceil(N/128), ceil(K/128)]`` -> fp8_block.

    Args:
        tensors: mapping of checkpoint names to tensors, or a ``safetensors.safe_open`` handle.
        prefix: module path, e.g. ``"model.layers.0.mlp.down_proj"``.
        format: optionally the expected scheme (``"nvfp4"``, ``"mxfp4"``, ``"mxfp8"``,
            ``"fp8_block"``); ValueError when the tensors hold another.
        k: packed fp4 only: the logical K when it is less than ``2 * weight_packed.shape[-1]``
            (an odd K; a ``weight_shape`` tensor, when present, gives it too). Codes beyond must be zero.
        rounding: the result's ``rounding`` for mxfp4 / mxfp8 (``"rceil"`` default, ``"floor"``)
            and fp8_block (as :func:`load_fp8_block`).

    Returns:
        :class:`LoadedWeight` ``(weight, input_global_scale)``: ``weight`` ``[..., N, K]``;
        ``input_global_scale`` 0-d fp32 from ``input_global_scale`` (same convention, no
        inversion) or ``None``.

    Example::

        from blockscaled.checkpoint import load_compressed_tensors, load_file
        sd = load_file("model.safetensors")
        w, x_gs = load_compressed_tensors(sd, "model.layers.0.self_attn.o_proj")
        y = bs.linear(x, w)
    """
    tensors = as_mapping(tensors)
    prefix = check_prefix(prefix)
    if format is not None and format not in _FORMATS:
        raise ValueError(f"format: expected None or one of {list(_FORMATS)}, got {format!r}")
    fmt = _detect(tensors, prefix)
    if format is not None and format != fmt:
        raise ValueError(f"{key(prefix, 'weight_scale')}: format={format!r} was asked for, but the tensors hold {fmt}")
    sk = key(prefix, "weight_scale")
    igs = None
    ik = key(prefix, "input_global_scale")

    if fmt == "fp8_block":
        if k is not None:
            raise ValueError("k: only packed fp4 weights take k; fp8_block stores K unpacked")
        w = load_fp8_block(tensors, prefix, rounding=rounding)
    elif fmt == "mxfp8":
        if k is not None:
            raise ValueError("k: only packed fp4 weights take k; mxfp8 stores K unpacked")
        wk = key(prefix, "weight")
        d = get(tensors, wk, "the fp8 e4m3 weight [..., N, K]")
        check_dtype(wk, d, (torch.float8_e4m3fn,), "mxfp8 weight")
        check_min_ndim(wk, d, 2, "weight [..., N, K]")
        s = e8m0_codes(sk, get(tensors, sk, "E8M0 block scales"), "E8M0 block scales")
        check_shape(sk, s, (*d.shape[:-1], -(-d.shape[-1] // 32)), f"[..., N, ceil(K/32)] for {wk} {tuple(d.shape)}")
        w = make(d, s, MXFP8, d.shape, (1, 32), resolve_mx_rounding(rounding))
    else:
        pk = key(prefix, "weight_packed")
        d = get(tensors, pk, "the packed e2m1 weight, uint8 [..., N, K/2]")
        if d.dtype == torch.int32:
            raise TypeError(f"{pk}: expected dtype torch.uint8 (packed e2m1), got torch.int32: pack-quantized INTn "
                            f"weights are integer, not a block-scaled float format")
        check_dtype(pk, d, (torch.uint8,), "packed e2m1 codes, two per byte")
        check_min_ndim(pk, d, 2, "weight_packed [..., N, K/2]")
        f = NVFP4 if fmt == "nvfp4" else MXFP4
        bk = f.block_k
        raw = get(tensors, sk, "block scales")
        s = raw if fmt == "nvfp4" else e8m0_codes(sk, raw, "E8M0 block scales")
        layout_k = 2 * d.shape[-1]
        check_shape(sk, s, (*d.shape[:-1], -(-layout_k // bk)), f"[..., N, K/{bk}] for {pk} {tuple(d.shape)}")
        if k is None:
            k = _weight_shape(tensors, prefix, d.shape[-2])
        k = fp4_logical_k(pk, layout_k, k, d)
        gs = None
        if fmt == "nvfp4":
            gk = key(prefix, "weight_global_scale")
            gs = scalar_fp32(gk, get(tensors, gk, "the fp32 per-tensor encode scale"), "per-tensor encode scale",
                             d.device)
        rnd = ScaleRounding.NVFP4 if fmt == "nvfp4" else resolve_mx_rounding(rounding)
        w = make(trim_fp4(d, k), s[..., : -(-k // bk)], f, (*d.shape[:-1], k), (1, bk), rnd, gs=gs)
    if ik in tensors:
        igs = scalar_fp32(ik, get(tensors, ik, "the activations' encode scale"), "activations' per-tensor encode scale",
                          w.device)
    return LoadedWeight(w, igs)


def to_compressed_tensors(w: ScaledTensor, prefix: str = "", *, input_global_scale=None) -> dict:
    """Write a ScaledTensor in compressed-tensors' layout for its format (module docstring).

    Args:
        w: nvfp4, mxfp4 or mxfp8 ``[..., N, K]``, or fp8_block with ``block=(128, 128)``.
        prefix: module path.
        input_global_scale: optional activations' encode scale (float or 1-element tensor),
            written as ``input_global_scale`` fp32 ``[1]``.

    Returns:
        A dict of the keys listed in the module docstring (``weight_global_scale`` fp32 ``[1]``
        for nvfp4; fp32 ``weight_scale`` for fp8_block). An odd K also writes ``weight_shape``
        (int64 ``[..., N, K]``) so that :func:`load_compressed_tensors` finds K again
        (compressed-tensors' own packer requires an even K).

    Example::

        w = bs.quantize(W, "nvfp4")
        sd = to_compressed_tensors(w, "model.layers.0.mlp.down_proj", input_global_scale=x_gs)
    """
    check_scaled("w", w, _FORMATS)
    prefix = check_prefix(prefix)
    f = w.format.name
    if f == "fp8_block":
        if w.block != (128, 128):
            raise ValueError(f"w: expected block (128, 128) for a compressed-tensors FP8_BLOCK weight, got {w.block}")
        out = to_fp8_block(w, prefix, scale_suffix="_scale")
    elif f == "mxfp8":
        out = {key(prefix, "weight"): w.data, key(prefix, "weight_scale"): w.scale}
    else:
        out = {key(prefix, "weight_packed"): w.data, key(prefix, "weight_scale"): w.scale}
        if f == "nvfp4":
            out[key(prefix, "weight_global_scale")] = w.global_scale.reshape(1)
        if w.shape[-1] % 2:
            out[key(prefix, "weight_shape")] = torch.tensor(list(w.shape), dtype=torch.int64, device=w.device)
    if input_global_scale is not None:
        igs = torch.as_tensor(input_global_scale, dtype=torch.float32, device=w.device)
        if igs.numel() != 1:
            raise ValueError(f"input_global_scale: expected a single value, got shape {tuple(igs.shape)}")
        out[key(prefix, "input_global_scale")] = igs.reshape(1)
    return out
