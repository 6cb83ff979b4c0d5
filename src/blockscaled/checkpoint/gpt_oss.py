"""gpt-oss MXFP4 MoE expert weights (the ``quant_method: mxfp4`` checkpoints of gpt-oss-20b/120b).

Layout of one expert projection, all experts stacked on the leading dimension::

    <prefix>_blocks  uint8  [E, N, K/32, 16]   32 e2m1 codes per block, element 2i in the low nibble
    <prefix>_scales  uint8  [E, N, K/32]       E8M0 exponents, value 2**(s - 127)

with ``prefix`` e.g. ``model.layers.0.mlp.experts.gate_up_proj`` (N = 2 * intermediate, K = hidden)
or ``...experts.down_proj`` (N = hidden, K = intermediate). Rows are output features, as in
``nn.Linear``: transformers' ``convert_moe_packed_tensors`` dequantizes ``[E, N, K]`` and transposes
it to the ``[E, K, N]`` its eager ``GptOssExperts`` multiplies with. Flattening the last two
dimensions of ``_blocks`` gives exactly mxfp4's packed ``data [E, N, K/2]`` and ``_scales`` is its
canonical ``scale [E, N, K/32]``, so the conversion copies no bits.

``gate_up_proj`` interleaves its two halves by row: row ``2j`` is gate feature ``j`` and row
``2j + 1`` up feature ``j`` (``gate, up = gate_up[..., ::2], gate_up[..., 1::2]`` in transformers'
gpt-oss and in the original implementation). :func:`split_gate_up` de-interleaves them,
:func:`interleave_gate_up` puts them back.

Scale 255 is NaN in E8M0 (OCP MX, blockscaled); transformers' ``ldexp`` turns it into 2**128
(inf). gpt-oss checkpoints hold no such scale.
"""

from __future__ import annotations

import torch

from ..formats import MXFP4
from ..tensor import ScaledTensor
from ._common import (as_mapping, check_dtype, check_min_ndim, check_prefix, check_scaled, check_shape, e8m0_codes,
                      fp4_logical_k, get, make, pad_last, resolve_mx_rounding, trim_fp4)

__all__ = ["load_gpt_oss_mxfp4", "to_gpt_oss_mxfp4", "split_gate_up", "interleave_gate_up"]


def _names(prefix: str) -> tuple[str, str]:
    prefix = check_prefix(prefix)
    if not prefix:
        raise ValueError("prefix: expected the projection's name, e.g. "
                         "'model.layers.0.mlp.experts.gate_up_proj', got ''")
    return prefix + "_blocks", prefix + "_scales"


def load_gpt_oss_mxfp4(tensors, prefix: str, *, k: int | None = None, rounding=None) -> ScaledTensor:
    """Read a gpt-oss MXFP4 expert projection as an mxfp4 :class:`~blockscaled.ScaledTensor`.

    Keys: ``prefix + "_blocks"`` uint8 ``[..., N, G, 16]`` and ``prefix + "_scales"`` uint8 (or
    ``torch.float8_e8m0fnu``) E8M0 ``[..., N, G]``, ``G = K / 32``; ``...`` is the experts
    dimension ``E`` (or nothing for a single matrix).

    Args:
        tensors: mapping of checkpoint names to tensors, or a ``safetensors.safe_open`` handle.
        prefix: the projection's name without the suffix, e.g.
            ``"model.layers.0.mlp.experts.gate_up_proj"``.
        k: the logical K when it is less than ``32 * G`` (the layout holds whole 32-element
            blocks; :func:`to_gpt_oss_mxfp4` zero-pads a K that is not a multiple of 32). Codes
            beyond column ``k`` must be zero.
        rounding: the result's ``rounding`` (how ``bs.linear`` scales activations): ``"rceil"``
            (default; the checkpoint does not record how its exponents were chosen) or ``"floor"``.

    Returns:
        mxfp4 ScaledTensor ``[..., N, K]``, block ``(1, 32)``; ``data`` is a view of ``_blocks``
        (no copy when contiguous and K = 32 * G).

    Example::

        from blockscaled.checkpoint import load_file, load_gpt_oss_mxfp4, split_gate_up
        sd = load_file("model-00000-of-00002.safetensors")
        w13 = load_gpt_oss_mxfp4(sd, "model.layers.0.mlp.experts.gate_up_proj")   # [32, 5760, 2880]
        gate, up = split_gate_up(w13)                                              # [32, 2880, 2880] each
        w2 = load_gpt_oss_mxfp4(sd, "model.layers.0.mlp.experts.down_proj")        # [32, 2880, 2880]
    """
    tensors = as_mapping(tensors)
    bk, sk = _names(prefix)
    b = get(tensors, bk, "the packed e2m1 blocks, uint8 [..., N, K/32, 16]")
    check_dtype(bk, b, (torch.uint8,), "packed e2m1 codes, two per byte")
    check_min_ndim(bk, b, 3, "[..., N, K/32, 16]")
    if b.shape[-1] != 16:
        raise ValueError(f"{bk}: expected shape [..., N, K/32, 16] (16 bytes per 32-element block), "
                         f"got {tuple(b.shape)}")
    s = e8m0_codes(sk, get(tensors, sk, "the E8M0 block scales, uint8 [..., N, K/32]"), "E8M0 block scales")
    check_shape(sk, s, tuple(b.shape[:-1]), f"[..., N, K/32] matching {bk} {tuple(b.shape)}")
    if s.device != b.device:
        raise ValueError(f"{sk}: on {s.device}, expected the blocks' device {b.device}")
    data = b.reshape(*b.shape[:-2], b.shape[-2] * 16)
    k = fp4_logical_k(bk, 32 * b.shape[-2], k, data)
    return make(trim_fp4(data, k), s[..., : -(-k // 32)], MXFP4, (*b.shape[:-2], k), (1, 32),
                resolve_mx_rounding(rounding))


def to_gpt_oss_mxfp4(w: ScaledTensor, prefix: str) -> dict:
    """Write an mxfp4 weight ``[..., N, K]`` in gpt-oss's ``_blocks`` / ``_scales`` layout.

    Returns:
        ``{prefix + "_blocks": uint8 [..., N, ceil(K/32), 16], prefix + "_scales": uint8
        [..., N, ceil(K/32)]}``. A K that is not a multiple of 32 is zero-padded to whole blocks
        (load it back with ``k=K``); otherwise the tensors are views of ``w``'s own.

    Example::

        gate_up = interleave_gate_up(bs.quantize(Wg, "mxfp4"), bs.quantize(Wu, "mxfp4"))
        sd = to_gpt_oss_mxfp4(gate_up, "model.layers.0.mlp.experts.gate_up_proj")
    """
    check_scaled("w", w, ("mxfp4",))
    bk, sk = _names(prefix)
    g = w.scale.shape[-1]
    data = pad_last(w.data, 16 * g)
    return {bk: data.reshape(*data.shape[:-1], g, 16), sk: w.scale}


def _check_rowwise(name: str, w) -> ScaledTensor:
    if not isinstance(w, ScaledTensor):
        raise TypeError(f"{name}: expected a blockscaled.ScaledTensor, got {type(w).__name__}")
    if w.block[0] != 1:
        raise ValueError(
            f"{name}: expected 1 x {w.format.block_k} blocks (each row scaled on its own), got block {w.block}: "
            f"rows of a {w.block[0]}-row block share scales and cannot be split"
        )
    if w.ndim < 2:
        raise ValueError(f"{name}: expected a weight of rank >= 2 ([..., N, K]), got shape {tuple(w.shape)}")
    return w


def split_gate_up(w: ScaledTensor) -> tuple[ScaledTensor, ScaledTensor]:
    """De-interleave a fused gate/up projection whose rows alternate gate, up (gpt-oss).

    Args:
        w: ScaledTensor ``[..., 2I, K]`` with ``1 x B`` blocks (mxfp4, mxfp8, nvfp4 or fp8_block
            ``(1, 128)``), row ``2j`` gate feature ``j``, row ``2j + 1`` up feature ``j``.

    Returns:
        ``(gate, up)``, each ``[..., I, K]`` of ``w``'s format (contiguous copies; nvfp4 keeps
        ``w``'s global scale). ``bs.swiglu(x, gate, up)`` then computes gpt-oss's un-clamped
        ``silu(x @ gate.T) * (x @ up.T)`` form; gpt-oss's own activation (clamp, ``alpha``,
        ``up + 1``) is not blockscaled's swiglu.

    Example::

        gate, up = split_gate_up(load_gpt_oss_mxfp4(sd, "model.layers.0.mlp.experts.gate_up_proj"))
    """
    _check_rowwise("w", w)
    n = w.shape[-2]
    if n % 2:
        raise ValueError(f"w: expected an even number of rows (gate and up interleaved), got shape {tuple(w.shape)}")
    shape = (*w.shape[:-2], n // 2, w.shape[-1])
    parts = tuple(
        make(w.data[..., i::2, :], w.scale[..., i::2, :], w.format, shape, w.block, w.rounding, gs=w.global_scale)
        for i in (0, 1)
    )
    return parts[0], parts[1]


def interleave_gate_up(gate: ScaledTensor, up: ScaledTensor) -> ScaledTensor:
    """Fuse ``gate`` and ``up`` ``[..., I, K]`` into gpt-oss's interleaved ``[..., 2I, K]``
    (row ``2j`` = ``gate[j]``, row ``2j + 1`` = ``up[j]``); the inverse of :func:`split_gate_up`.

    Both must have the same format, shape, block and rounding (and, for nvfp4, the same global
    scale: one tensor has one). Returns a new contiguous ScaledTensor.

    Example::

        w13 = interleave_gate_up(bs.quantize(Wg, "mxfp4"), bs.quantize(Wu, "mxfp4"))
        gate, up = split_gate_up(w13)
    """
    _check_rowwise("gate", gate)
    _check_rowwise("up", up)
    for field in ("format", "shape", "block", "rounding"):
        if getattr(gate, field) != getattr(up, field):
            raise ValueError(f"up: expected the same {field} as gate ({getattr(gate, field)}), "
                             f"got {getattr(up, field)}")
    if gate.device != up.device:
        raise ValueError(f"up: on {up.device}, gate on {gate.device}")
    if gate.global_scale is not None and not torch.equal(gate.global_scale.reshape(()), up.global_scale.reshape(())):
        raise ValueError(
            f"up: expected the same nvfp4 global_scale as gate ({float(gate.global_scale)}), got "
            f"{float(up.global_scale)}; quantize both with one global_scale to fuse them"
        )

    def weave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        # through uint8: CPU torch.stack has no float8 kernels; the bytes are what moves
        dt = a.dtype
        if dt.itemsize == 1:
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        out = torch.stack((a, b), dim=-2).reshape(*a.shape[:-2], 2 * a.shape[-2], a.shape[-1])
        return out.view(dt)

    shape = (*gate.shape[:-2], 2 * gate.shape[-2], gate.shape[-1])
    return make(weave(gate.data, up.data), weave(gate.scale, up.scale), gate.format, shape, gate.block,
                gate.rounding, gs=gate.global_scale)
