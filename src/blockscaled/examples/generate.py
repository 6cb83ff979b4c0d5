"""Quantize a small transformers model with each format, compare its logits with bf16, generate.

    python -m blockscaled.examples.generate [--arch llama|qwen2|mistral] [--formats fp8_block,nvfp4]
        [--device cuda] [--hidden 256] [--layers 2] [--tokens 8]

The model is random-initialised from its config (no download). For each format it prints the
cosine similarity and the mean KL(bf16 || quantized) of the next-token logits, the layers
``blockscaled.nn.quantize_model`` replaced, and the tokens ``generate()`` produced. CPU tensors run
the float64 reference path (no Triton interpreter needed); on a GPU the kernels run. Needs
``transformers`` (``pip install -e .[test]``).
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch

from ..nn import quantization_report, quantize_model

_ARCHS = ("llama", "qwen2", "mistral")


def build(arch: str, hidden: int, layers: int, vocab: int = 1024, device: str = "cpu", seed: int = 0):
    """A random-initialised bf16 ``*ForCausalLM`` of ``arch`` (tiny dims, no download)."""
    try:
        import transformers
    except ImportError as e:  # a test-only dependency
        raise SystemExit("this example needs transformers: pip install -e .[test]") from e
    cfg_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[arch]
    cfg = cfg_cls(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 128),
                  vocab_size=vocab, max_position_embeddings=256, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return model_cls(cfg).to(device=device, dtype=torch.bfloat16).eval()


def logit_metrics(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(cosine similarity of the flattened logits, mean KL(ref || out) per position)."""
    out, ref = out.float(), ref.float()
    cos = torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0).item()
    kl = torch.nn.functional.kl_div(out.log_softmax(-1), ref.log_softmax(-1), log_target=True,
                                    reduction="none").sum(-1).mean().item()
    return cos, kl


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="llama", choices=_ARCHS)
    ap.add_argument("--formats", default="fp8_block,mxfp8,mxfp4,nvfp4")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=8, help="tokens to generate")
    a = ap.parse_args(argv)
    base = build(a.arch, a.hidden, a.layers, device=a.device)
    ids = torch.randint(0, base.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1)).to(a.device)
    with torch.no_grad():
        ref = base(ids).logits
    print(f"{a.arch}: hidden {a.hidden}, {a.layers} layers, on {a.device}")
    for fmt in a.formats.split(","):
        model = quantize_model(copy.deepcopy(base), fmt)
        with torch.no_grad():
            cos, kl = logit_metrics(model(ids).logits, ref)
            out = model.generate(ids, max_new_tokens=a.tokens, do_sample=False)
        rep = quantization_report(model)
        print(f"  {fmt:10s} logits cos {cos:.4f}  KL {kl:.2e}  {len(rep.quantized)} layers quantized  "
              f"generated {out[0, ids.shape[1]:].tolist()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
