"""safetensors files, and telling which layout a checkpoint module is stored in."""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from ._common import as_mapping, check_prefix, key

__all__ = ["load_file", "save_file", "detect_layout", "detect_layouts", "LAYOUTS"]

#: What :func:`detect_layout` returns, and the loader each names.
LAYOUTS = {
    "fp8_block": "load_fp8_block",
    "modelopt_nvfp4": "load_modelopt_nvfp4",
    "gpt_oss_mxfp4": "load_gpt_oss_mxfp4",
    "compressed_tensors": "load_compressed_tensors",
}


def load_file(path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Read a ``.safetensors`` file into a dict of tensors (``safetensors.torch.load_file``).

    Args:
        path: file path (str or ``os.PathLike``).
        device: where the tensors go (``"cpu"`` default, ``"cuda"``, ``"cuda:1"``).

    Returns:
        ``{name: tensor}`` with the file's dtypes (float8_e4m3fn, float8_e8m0fnu, uint8, fp32 ...),
        ready for the ``load_*`` functions. For a file too large to hold at once, pass a
        ``safetensors.safe_open(path, "pt")`` handle to the loaders instead: they read only the
        tensors they need.

    Example::

        sd = load_file("model.safetensors")
        w = load_fp8_block(sd, "model.layers.0.mlp.down_proj")
    """
    from safetensors.torch import load_file as _load

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a str or os.PathLike, got {type(path).__name__}")
    return _load(os.fspath(path), device=str(device))


def save_file(tensors: Mapping[str, torch.Tensor], path, metadata: Mapping[str, str] | None = None) -> None:
    """Write a dict of tensors (e.g. the merged results of the ``to_*`` functions) to a
    ``.safetensors`` file (``safetensors.torch.save_file``).

    Non-contiguous tensors are made contiguous and tensors sharing storage with another entry
    are copied, which safetensors refuses otherwise (``split_gate_up`` results, views).

    Args:
        tensors: ``{name: tensor}``; names are str, values torch.Tensor (any device).
        path: file path (str or ``os.PathLike``).
        metadata: optional ``{str: str}`` header metadata (e.g. ``{"format": "pt"}``).

    Example::

        sd = {**to_fp8_block(w1, "layers.0.mlp.up_proj"), **to_fp8_block(w2, "layers.0.mlp.down_proj")}
        save_file(sd, "model.safetensors", metadata={"format": "pt"})
    """
    from safetensors.torch import save_file as _save

    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors: expected a mapping of names to torch.Tensor, got {type(tensors).__name__}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a str or os.PathLike, got {type(path).__name__}")
    if metadata is not None and not (isinstance(metadata, Mapping)
                                     and all(isinstance(a, str) and isinstance(b, str) for a, b in metadata.items())):
        raise TypeError(f"metadata: expected None or a mapping of str to str, got {metadata!r}")
    seen: set[tuple[torch.device, int]] = set()
    out = {}
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensors: expected str names, got {name!r} ({type(name).__name__})")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        t = t.detach().contiguous()
        sid = (t.device, t.untyped_storage().data_ptr())
        if sid in seen and t.numel():
            t = t.clone()
        seen.add((t.device, t.untyped_storage().data_ptr()))
        out[name] = t
    _save(out, os.fspath(path), metadata=dict(metadata) if metadata is not None else None)


def _is_block_scale(w: torch.Tensor, s: torch.Tensor) -> bool:
    n, k = w.shape[-2], w.shape[-1]
    return s.dtype.is_floating_point and tuple(s.shape) == (*w.shape[:-2], -(-n // 128), -(-k // 128))


def detect_layout(tensors, prefix: str = "") -> str | None:
    """Which block-scaled layout ``prefix`` is stored in, from its keys and dtypes.

    Returns one of :data:`LAYOUTS`' keys, or ``None`` (an unquantized or unsupported module):

    * ``"gpt_oss_mxfp4"``: ``prefix_blocks`` and ``prefix_scales`` (``prefix`` names the projection,
      e.g. ``"model.layers.0.mlp.experts.gate_up_proj"``) -> :func:`load_gpt_oss_mxfp4`.
    * ``"compressed_tensors"``: ``prefix.weight_packed``, or an fp8 ``prefix.weight`` with uint8
      (E8M0, mxfp8) ``prefix.weight_scale`` -> :func:`load_compressed_tensors`.
    * ``"fp8_block"``: an fp8 ``prefix.weight`` with ``prefix.weight_scale_inv``, or with a float
      ``prefix.weight_scale`` of the 128x128 block shape (DeepSeek-V3, FineGrainedFP8, and
      compressed-tensors ``FP8_BLOCK``, which are one layout) -> :func:`load_fp8_block`.
    * ``"modelopt_nvfp4"``: uint8 ``prefix.weight`` with e4m3 ``prefix.weight_scale`` and
      ``prefix.weight_scale_2`` -> :func:`load_modelopt_nvfp4`.

    Per-tensor and per-channel fp8 (a scalar or ``[N, 1]`` ``weight_scale``) give ``None``.

    Example::

        for prefix, layout in detect_layouts(sd).items():
            print(prefix, layout)   # model.layers.0.mlp.down_proj fp8_block ...
    """
    tensors = as_mapping(tensors)
    prefix = check_prefix(prefix)
    if prefix and prefix + "_blocks" in tensors and prefix + "_scales" in tensors:
        return "gpt_oss_mxfp4"
    if key(prefix, "weight_packed") in tensors:
        return "compressed_tensors"
    wk = key(prefix, "weight")
    if wk not in tensors:
        return None
    w = tensors[wk]
    if not isinstance(w, torch.Tensor) or w.ndim < 2:
        return None
    s = tensors.get(wk + "_scale")
    if w.dtype == torch.float8_e4m3fn:
        if wk + "_scale_inv" in tensors:
            return "fp8_block"
        if isinstance(s, torch.Tensor):
            if s.dtype == torch.uint8:
                return "compressed_tensors"
            if _is_block_scale(w, s):
                return "fp8_block"
        return None
    if (w.dtype == torch.uint8 and isinstance(s, torch.Tensor) and s.dtype == torch.float8_e4m3fn
            and wk + "_scale_2" in tensors):
        return "modelopt_nvfp4"
    return None


def detect_layouts(tensors) -> dict[str, str]:
    """Every block-scaled module of a checkpoint: ``{prefix: layout}`` (see :func:`detect_layout`),
    in key order. Candidates are the prefixes of keys ending in ``.weight``, ``.weight_packed``
    and ``_blocks``.

    Example::

        layouts = detect_layouts(load_file("model.safetensors"))
        # {'model.layers.0.mlp.experts.down_proj': 'gpt_oss_mxfp4', ...}
    """
    tensors = as_mapping(tensors)
    found: dict[str, str] = {}
    for name in tensors:
        if not isinstance(name, str):
            continue
        cands = []
        if name.endswith("_blocks"):
            cands.append(name[: -len("_blocks")])
        for leaf in ("weight", "weight_packed"):
            if name == leaf:
                cands.append("")
            elif name.endswith("." + leaf):
                cands.append(name[: -len(leaf) - 1])
        for p in cands:
            if p not in found:
                layout = detect_layout(tensors, p)
                if layout is not None:
                    found[p] = layout
    return found
