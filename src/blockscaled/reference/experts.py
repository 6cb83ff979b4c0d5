"""Float64 twin of :class:`blockscaled.nn.Experts` (and so of the experts half of ``nn.MoE``).

:func:`experts` computes what an Experts module should return for given routing, from the
public quantizers and float64 GEMMs: the sorted rows quantized the way the module quantizes
them (one quantization over all sorted rows: nvfp4's global scale is one number for the whole
batch, as in the kernels' path), gate / up in float64, the activation, the intermediate cast to
the input dtype and quantized again, the down projection, the weighted combine in float64.

It loops over the experts that have rows and dequantizes one expert at a time (DeepSeek-V3's
256 experts would be 90 GB in float64 at once); the expert loop reads the routing back to the
host: for tests and the bench's checks, never the hot path.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..formats import get_format
from .quantize import dequantize, quantize

__all__ = ["experts"]


def _expert(w, e: int) -> torch.Tensor:
    """Expert ``e`` of a stacked ``[E, N, K]`` ScaledTensor, dequantized to float64 ``[N, K]``
    (a plain tensor: the bf16 layer the bench compares with)."""
    if isinstance(w, torch.Tensor):
        return w[e].double()
    one = replace(w, data=w.data[e], scale=w.scale[e], shape=torch.Size(w.shape[1:]))
    return dequantize(one).double()


def experts(ex, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """float64 ``[T, H]``: the output an :class:`~blockscaled.nn.Experts` module ``ex`` should
    give for ``hidden_states [T, H]`` (bf16 / fp16), ``top_k_index`` int ``[T, k]`` and
    ``top_k_weights [T, k]`` (before its final cast to the input dtype).

    ``ex`` may also be any object with the same attributes and plain float weights (the bf16
    layer of ``blockscaled.bench.layers``). Example::

        ref = experts(ex, x, idx, w)          # compare with ex(x, idx, w).double()
    """
    x = hidden_states
    dt = x.dtype
    fmt = None if ex.act_format is None else get_format(ex.act_format)

    def act(t: torch.Tensor) -> torch.Tensor:
        return t.double() if fmt is None else dequantize(quantize(t, fmt, block=(1, fmt.block_k))).double()

    k = top_k_index.shape[1]
    flat = top_k_index.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    token = order // max(1, k)
    e_row = flat[order]
    a = act(x[token])  # one quantization over every sorted row
    n_rows = a.shape[0]
    g = torch.zeros(n_rows, ex.intermediate, dtype=torch.float64, device=x.device)
    u = torch.zeros_like(g)
    active = torch.unique(e_row).tolist()
    for e in active:
        rows = e_row == e
        g[rows] = a[rows] @ _expert(ex.w_gate, e).T
        u[rows] = a[rows] @ _expert(ex.w_up, e).T
    if ex.gate_bias is not None:
        g = g + ex.gate_bias.double()[e_row]
    if ex.up_bias is not None:
        u = u + ex.up_bias.double()[e_row]
    if ex.activation == "gpt_oss":
        g, u = g.clamp(max=ex.limit), u.clamp(-ex.limit, ex.limit)
        h = (u + 1) * g * torch.sigmoid(ex.alpha * g)
    else:
        h = torch.nn.functional.silu(g) * u
    ha = act(h.to(dt))
    y = torch.zeros(n_rows, ex.hidden, dtype=torch.float64, device=x.device)
    for e in active:
        rows = e_row == e
        y[rows] = ha[rows] @ _expert(ex.w_down, e).T
    if ex.down_bias is not None:
        y = y + ex.down_bias.double()[e_row]
    out = torch.zeros(x.shape[0], ex.hidden, dtype=torch.float64, device=x.device)
    out.index_add_(0, token, y * top_k_weights.double().reshape(-1)[order, None])
    return out
