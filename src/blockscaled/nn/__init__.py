"""``blockscaled.nn``: modules over the block-scaled ops.

* :class:`Linear`: a ``torch.nn.Linear`` replacement whose weight is a ScaledTensor
  (fp8_block, mxfp8, mxfp4, nvfp4), W x A or weight-only, with tensor-parallel sharding;
* :func:`quantize_model`: swap a model's ``nn.Linear`` layers for it (LM head and MoE routers
  kept by default) and report what was done;
* :class:`MoE`: a mixture-of-experts layer on the grouped kernels (routing to combine on the
  device), with :func:`route` and :func:`permute`;
* :class:`Experts`: the experts part alone, with transformers' experts interface
  (``forward(hidden_states, top_k_index, top_k_weights)``): ``quantize_model`` puts it in place of
  the fused experts modules of Mixtral, Qwen2/3-MoE, DeepSeek-V3, OLMoE and gpt-oss models;
* :func:`fuse_routers`: transformers' MoE router modules with their top-k in one kernel (the
  same outputs; ``quantize_model`` does it by default);
* :func:`enable_cuda_graphs`: eager decode-size calls of the MoE, Experts and Linear modules replayed from CUDA graphs
  captured per call signature (:func:`disable_cuda_graphs` switches them off);
* :func:`load_quantized`: a pre-quantized checkpoint (DeepSeek-V3 / FineGrainedFP8, ModelOpt
  NVFP4, compressed-tensors, gpt-oss MXFP4) straight into a model built from its config.

Example::

    import blockscaled.nn as bsnn
    bsnn.quantize_model(model, "fp8_block")          # e.g. a transformers *ForCausalLM in bf16
    print(bsnn.quantization_report(model))
"""

from .linear import Linear, default_weight_block
from .load import load_quantized
from .model import DEFAULT_EXCLUDE, QuantizationReport, quantization_report, quantize_model
from .experts import Experts, hf_experts_layout
from .moe import MoE, permute, route
from .router import fuse_routers, unfuse_routers
from .graphs import disable_cuda_graphs, enable_cuda_graphs

__all__ = ["Linear", "default_weight_block", "quantize_model", "quantization_report", "QuantizationReport",
           "DEFAULT_EXCLUDE", "MoE", "route", "permute", "Experts", "hf_experts_layout", "load_quantized",
           "fuse_routers", "unfuse_routers", "enable_cuda_graphs", "disable_cuda_graphs"]
