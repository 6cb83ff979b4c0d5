"""Input generators: random, non-zero, with realistic outliers; special-value tensors."""

from __future__ import annotations

import torch

from ..ops.quantize import quantize


def randn_like_activations(
    *shape: int,
    dtype: torch.dtype = torch.bfloat16,
    device="cpu",
    seed: int | None = None,
    outliers: bool = True,
) -> torch.Tensor:
    """Normal(0, 1) values with a few large outlier channels (as LLM activations have), so
    per-block scales differ across blocks. Never all zeros."""
    g = torch.Generator(device="cpu")
    g.manual_seed(0 if seed is None else seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float32)
    if outliers and x.numel() and x.shape[-1] > 1:
        k = x.shape[-1]
        chans = torch.randint(0, k, (max(1, k // 64),), generator=g)
        x[..., chans] *= 20.0
        # Per-row magnitude spread of several binades.
        rows = torch.exp2(torch.randint(-6, 6, (*x.shape[:-1], 1), generator=g).float())
        x = x * rows
    return x.to(dtype).to(device)


def fp8_block_operands(m: int, n: int, k: int, seed: int = 0, *, device="cpu",
                       weight_block: tuple[int, int] = (128, 128)):
    """Quantized operands of an fp8_block GEMM ``A [m, k] @ B [n, k].T`` (DeepSeek-style):
    A = quantize(N(0, 1) bf16, 1x128 blocks), B = quantize(0.05 * N(0, 1) bf16, ``weight_block``
    blocks: (128, 128) or (1, 128)). The random numbers are drawn on ``device`` (fast for GB-sized
    weights) from one generator seeded with ``seed``, A first. Returns (a, b) ScaledTensors."""
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
    w = torch.randn(n, k, device=dev, generator=g).mul_(0.05).to(torch.bfloat16)
    return quantize(x, "fp8_block"), quantize(w, "fp8_block", block=weight_block)


def special_values(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A 1-D tensor of special values: signed zeros, denormals, ties, huge, Inf, NaN."""
    fi = torch.finfo(dtype)
    vals = [0.0, -0.0, fi.tiny, -fi.tiny, fi.tiny / 4, 1.0, -1.0, 0.25, 0.75, 1.25, 2.5, 5.0,
            448.0, 464.0, -480.0, fi.max, -fi.max, float("inf"), float("-inf"), float("nan")]
    return torch.tensor(vals, dtype=torch.float32).to(dtype)
