"""Linear-layer shapes of public model families (from their published configs), for sweeps and
the planner's validation. N x K per layer as a serving engine runs it (QKV and gate|up fused).

Each entry: (family, layer, N, K). Attention: QKV = (heads + 2 * kv_heads) * head_dim x hidden,
O = hidden x heads * head_dim; MLP: gate|up = 2 * intermediate x hidden, down = hidden x
intermediate; MoE experts: the per-expert gate|up and down.
"""

from __future__ import annotations

__all__ = ["MODEL_LINEARS", "families", "M_VALUES", "FAMILY_PAIRS", "linear_nk"]

#: token counts of the planner's validation (decode to long prefill)
M_VALUES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

MODEL_LINEARS: tuple[tuple[str, str, int, int], ...] = (
    # Llama 3 8B: hidden 4096, 32 heads, 8 kv heads, head 128, intermediate 14336
    ("llama3-8b", "qkv", 6144, 4096), ("llama3-8b", "o", 4096, 4096),
    ("llama3-8b", "gate_up", 28672, 4096), ("llama3-8b", "down", 4096, 14336),
    # Llama 3 70B: hidden 8192, 64 heads, 8 kv, intermediate 28672
    ("llama3-70b", "qkv", 10240, 8192), ("llama3-70b", "o", 8192, 8192),
    ("llama3-70b", "gate_up", 57344, 8192), ("llama3-70b", "down", 8192, 28672),
    # Qwen2.5 7B: hidden 3584, 28 heads, 4 kv, intermediate 18944
    ("qwen2.5-7b", "qkv", 4608, 3584), ("qwen2.5-7b", "o", 3584, 3584),
    ("qwen2.5-7b", "gate_up", 37888, 3584), ("qwen2.5-7b", "down", 3584, 18944),
    # Qwen3 32B: hidden 5120, 64 heads, 8 kv, head 128, intermediate 25600
    ("qwen3-32b", "qkv", 10240, 5120), ("qwen3-32b", "o", 5120, 8192),
    ("qwen3-32b", "gate_up", 51200, 5120), ("qwen3-32b", "down", 5120, 25600),
    # Qwen3-30B-A3B (MoE): hidden 2048, 32 heads, 4 kv, expert intermediate 768
    ("qwen3-30b-a3b", "qkv", 5120, 2048), ("qwen3-30b-a3b", "o", 2048, 4096),
    ("qwen3-30b-a3b", "expert_gate_up", 1536, 2048), ("qwen3-30b-a3b", "expert_down", 2048, 768),
    # Mixtral 8x7B: hidden 4096, 32 heads, 8 kv, expert intermediate 14336 (Mistral 7B: same dense)
    ("mixtral-8x7b", "qkv", 6144, 4096), ("mixtral-8x7b", "expert_down", 4096, 14336),
    # Mistral Large 2: hidden 12288, 96 heads, 8 kv, intermediate 28672
    ("mistral-large-2", "qkv", 14336, 12288), ("mistral-large-2", "o", 12288, 12288),
    ("mistral-large-2", "gate_up", 57344, 12288), ("mistral-large-2", "down", 12288, 28672),
    # DeepSeek-V3: MLA projections, dense MLP (intermediate 18432), experts (2048)
    ("deepseek-v3", "q_a+kv_a", 2112, 7168), ("deepseek-v3", "q_b", 24576, 1536),
    ("deepseek-v3", "kv_b", 32768, 512), ("deepseek-v3", "o", 7168, 16384),
    ("deepseek-v3", "gate_up", 36864, 7168), ("deepseek-v3", "down", 7168, 18432),
    ("deepseek-v3", "expert_gate_up", 4096, 7168), ("deepseek-v3", "expert_down", 7168, 2048),
    # DeepSeek-V2-Lite: hidden 2048, intermediate 10944, experts 1408
    ("deepseek-v2-lite", "q", 3072, 2048), ("deepseek-v2-lite", "kv_b", 4096, 512),
    ("deepseek-v2-lite", "gate_up", 21888, 2048), ("deepseek-v2-lite", "expert_down", 2048, 1408),
    # gpt-oss-120b: hidden 2880, 64 heads, 8 kv, head 64, experts 2880 (gate|up 5760)
    ("gpt-oss-120b", "qkv", 5120, 2880), ("gpt-oss-120b", "o", 2880, 4096),
    ("gpt-oss-120b", "expert_gate_up", 5760, 2880), ("gpt-oss-120b", "expert_down", 2880, 2880),
    # Gemma 2 27B: hidden 4608, 32 heads, 16 kv, head 128, intermediate 36864
    ("gemma2-27b", "qkv", 8192, 4608), ("gemma2-27b", "o", 4608, 4096),
    ("gemma2-27b", "gate_up", 73728, 4608), ("gemma2-27b", "down", 4608, 36864),
    # Phi-3 medium / Phi-4 (14B): hidden 5120, 40 heads, 10 kv, intermediate 17920
    ("phi3-medium", "qkv", 7680, 5120), ("phi3-medium", "o", 5120, 5120),
    ("phi3-medium", "gate_up", 35840, 5120), ("phi3-medium", "down", 5120, 17920),
)

#: (family, layer) pairs of the broad dense shape set (the planner's validation, scripts/checks/
#: validate_plans.py, and the bench's ``families`` suite): every family, its attention and MLP shapes
FAMILY_PAIRS = (
    ("llama3-8b", "qkv"), ("llama3-8b", "down"), ("llama3-70b", "o"), ("llama3-70b", "gate_up"),
    ("qwen2.5-7b", "qkv"), ("qwen2.5-7b", "down"), ("qwen3-32b", "o"), ("qwen3-32b", "gate_up"),
    ("qwen3-30b-a3b", "qkv"), ("qwen3-30b-a3b", "expert_gate_up"), ("mixtral-8x7b", "expert_down"),
    ("mistral-large-2", "qkv"), ("mistral-large-2", "down"), ("deepseek-v3", "q_a+kv_a"),
    ("deepseek-v3", "kv_b"), ("deepseek-v3", "o"), ("deepseek-v2-lite", "gate_up"),
    ("deepseek-v2-lite", "expert_down"), ("gpt-oss-120b", "qkv"), ("gpt-oss-120b", "expert_down"),
    ("gemma2-27b", "o"), ("gemma2-27b", "gate_up"), ("phi3-medium", "qkv"), ("phi3-medium", "down"),
)

_NK = {(f, layer): (n, k) for f, layer, n, k in MODEL_LINEARS}


def linear_nk(family: str, layer: str) -> tuple[int, int]:
    """(N, K) of a family's layer in :data:`MODEL_LINEARS`, e.g. ``linear_nk("llama3-8b", "qkv")``."""
    return _NK[(family, layer)]


def families() -> list[str]:
    """The family names, in table order."""
    out = []
    for f, *_ in MODEL_LINEARS:
        if f not in out:
            out.append(f)
    return out
