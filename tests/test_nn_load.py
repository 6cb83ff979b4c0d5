"""blockscaled.nn.load_quantized: a quantized model written in each checkpoint layout and loaded
into a freshly built model (different random init) gives the same logits; strictness errors.

The float64 reference path runs the layers (``reference`` fixture): the loading is under test.
"""

import pytest
import torch

import blockscaled.nn as bsnn
from blockscaled import ScaledTensor
from blockscaled import checkpoint as ckpt
from test_nn import _CFG, _hf_model, _moe_model, reference  # noqa: F401 (fixture)

WRITERS = {
    "fp8_block": ckpt.to_fp8_block,                         # DeepSeek-V3 / FineGrainedFP8
    "nvfp4": ckpt.to_modelopt_nvfp4,                         # ModelOpt
    "mxfp4": ckpt.to_compressed_tensors,                     # compressed-tensors
    "mxfp8": ckpt.to_compressed_tensors,
}


def _expert(w: ScaledTensor, e: int) -> ScaledTensor:
    return ScaledTensor(w.data[e], w.scale[e], w.format, w.shape[1:], w.block, w.rounding, global_scale=w.global_scale)


def _checkpoint(q: torch.nn.Module, fmt: str) -> dict:
    """The quantized model ``q`` as a shipped checkpoint: quantized modules in ``fmt``'s layout,
    every other tensor as it is."""
    rep = bsnn.quantization_report(q)
    sd = {}
    for name in rep.quantized:
        lin = q.get_submodule(name)
        sd.update(WRITERS[fmt](lin.weight, name))
        if lin.bias is not None:
            sd[f"{name}.bias"] = lin.bias
    for name in rep.quantized_experts:
        ex = q.get_submodule(name)
        if ex.activation == "gpt_oss":
            sd.update(ckpt.to_gpt_oss_mxfp4(ckpt.interleave_gate_up(ex.w_gate, ex.w_up), f"{name}.gate_up_proj"))
            sd.update(ckpt.to_gpt_oss_mxfp4(ex.w_down, f"{name}.down_proj"))
            b = torch.stack([ex.gate_bias, ex.up_bias], dim=-1).reshape(ex.num_experts, -1)  # interleaved
            sd[f"{name}.gate_up_proj_bias"] = b.bfloat16()
            sd[f"{name}.down_proj_bias"] = ex.down_bias.bfloat16()
            continue
        for e in range(ex.num_experts):
            for proj, w in (("gate_proj", ex.w_gate), ("up_proj", ex.w_up), ("down_proj", ex.w_down)):
                sd.update(WRITERS[fmt](_expert(w, e), f"{name}.{e}.{proj}"))
    quantized = tuple(n + "." for n in rep.quantized + rep.quantized_experts)
    sd.update({k: v for k, v in q.state_dict().items() if not k.startswith(quantized)})
    return sd


@pytest.mark.parametrize("arch,fmt", [("llama", "fp8_block"), ("llama", "nvfp4"), ("qwen2", "mxfp4"),
                                      ("qwen3_moe", "fp8_block"), ("mixtral", "mxfp8"), ("gpt_oss", "mxfp4")])
def test_load_quantized_round_trip(reference, tmp_path, arch, fmt):
    make = _hf_model if arch in ("llama", "qwen2") else _moe_model
    q = bsnn.quantize_model(make(arch), fmt)
    sd = _checkpoint(q, fmt)
    path = tmp_path / "model.safetensors"
    ckpt.save_file(sd, path)
    fresh = make(arch, seed=7)
    ids = torch.randint(0, _CFG["vocab_size"], (2, 6), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        before = fresh(ids).logits
    bsnn.load_quantized(fresh, str(path))
    rep, want = bsnn.quantization_report(fresh), bsnn.quantization_report(q)
    assert sorted(rep.quantized) == sorted(want.quantized)
    assert sorted(rep.quantized_experts) == sorted(want.quantized_experts)
    assert rep.format == fmt and rep.bytes_after < rep.bytes_before
    with torch.no_grad():
        out, ref = fresh(ids).logits, q(ids).logits
    assert not torch.equal(out, before)
    if fmt == "nvfp4":  # ModelOpt stores the reciprocal of our global scale (not always bit-exact)
        torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2)
    else:
        assert torch.equal(out, ref)


def test_load_quantized_strict_and_errors(reference):
    q = bsnn.quantize_model(_hf_model("llama"), "fp8_block")
    sd = _checkpoint(q, "fp8_block")
    with pytest.raises(KeyError, match="unused"):
        bsnn.load_quantized(_hf_model("llama"), {**sd, "stray.weight": torch.zeros(2)})
    part = {k: v for k, v in sd.items() if not k.startswith("model.norm")}
    with pytest.raises(KeyError, match="missing"):
        bsnn.load_quantized(_hf_model("llama"), part)
    m = bsnn.load_quantized(_hf_model("llama"), part, strict=False)  # loads what matches
    assert isinstance(m.model.layers[0].mlp.down_proj, bsnn.Linear)
    with pytest.raises(TypeError, match="checkpoint"):
        bsnn.load_quantized(_hf_model("llama"), 3)
    bad = dict(sd)
    bad["model.layers.0.mlp.down_proj.weight"] = bad["model.layers.0.mlp.down_proj.weight"][:, :128].contiguous()
    bad["model.layers.0.mlp.down_proj.weight_scale_inv"] = bad["model.layers.0.mlp.down_proj.weight_scale_inv"][:, :1]
    with pytest.raises(ValueError, match="model.layers.0.mlp.down_proj"):
        bsnn.load_quantized(_hf_model("llama"), bad)
