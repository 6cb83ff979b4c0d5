"""Checkpoint layouts <-> :class:`~blockscaled.ScaledTensor`: read the block-scaled weights that
quantized models ship, and write ours back in those layouts.

=====================  ====================================  =====================================
layout                 read                                  write
=====================  ====================================  =====================================
DeepSeek-V3 /          :func:`load_fp8_block`                :func:`to_fp8_block`
FineGrainedFP8 fp8
ModelOpt NVFP4         :func:`load_modelopt_nvfp4`           :func:`to_modelopt_nvfp4`
gpt-oss MXFP4 experts  :func:`load_gpt_oss_mxfp4`            :func:`to_gpt_oss_mxfp4`
compressed-tensors     :func:`load_compressed_tensors`       :func:`to_compressed_tensors`
(nvfp4, mxfp4, mxfp8,
fp8_block)
=====================  ====================================  =====================================

plus :func:`load_file` / :func:`save_file` (safetensors), :func:`detect_layout` /
:func:`detect_layouts` (which layout a module is in) and :func:`split_gate_up` /
:func:`interleave_gate_up` (gpt-oss's row-interleaved fused gate/up projection).

Loaders take a mapping of checkpoint names to tensors (a state dict, :func:`load_file`'s result)
or a ``safetensors.safe_open`` handle, and a module ``prefix``; writers return a dict of tensors to
merge and save. Data and block scales are never re-encoded: every layout stores the same e4m3 /
e2m1 bits (fp4 packed two per byte, element ``2i`` in the low nibble) and the same scale values
as blockscaled, only under other names and shapes, so ours -> layout -> ours is bitwise. The one
numeric difference is ModelOpt's per-tensor nvfp4 scale, a dequantization multiplier, where
blockscaled stores its reciprocal (see :mod:`blockscaled.checkpoint.modelopt`).

Errors name the checkpoint key, what was expected and what came: ``KeyError`` for a missing
tensor, ``TypeError`` for a wrong dtype, ``ValueError`` for a wrong shape or value.

Example::

    import blockscaled as bs
    from blockscaled import checkpoint as ckpt

    sd = ckpt.load_file("model.safetensors")
    for prefix, layout in ckpt.detect_layouts(sd).items():
        ...
    w = ckpt.load_fp8_block(sd, "model.layers.0.mlp.down_proj")
    y = bs.linear(x, w)
    ckpt.save_file(ckpt.to_fp8_block(w, "model.layers.0.mlp.down_proj"), "out.safetensors")
"""

from ._common import LoadedWeight
from .compressed import load_compressed_tensors, to_compressed_tensors
from .fp8 import load_fp8_block, to_fp8_block
from .gpt_oss import interleave_gate_up, load_gpt_oss_mxfp4, split_gate_up, to_gpt_oss_mxfp4
from .io import LAYOUTS, detect_layout, detect_layouts, load_file, save_file
from .modelopt import load_modelopt_nvfp4, to_modelopt_nvfp4

__all__ = [
    "LoadedWeight",
    "LAYOUTS",
    "load_fp8_block",
    "to_fp8_block",
    "load_modelopt_nvfp4",
    "to_modelopt_nvfp4",
    "load_gpt_oss_mxfp4",
    "to_gpt_oss_mxfp4",
    "split_gate_up",
    "interleave_gate_up",
    "load_compressed_tensors",
    "to_compressed_tensors",
    "load_file",
    "save_file",
    "detect_layout",
    "detect_layouts",
]
