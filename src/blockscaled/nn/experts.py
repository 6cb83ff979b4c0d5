"""``Experts``: fused MoE experts on quantized weights, with transformers' experts interface.

``forward(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k]) -> [T, H]`` is the
call every transformers 5 experts module takes after its router (``MixtralExperts``,
``Qwen2MoeExperts``, ``Qwen3MoeExperts``, ``DeepseekV3Experts``, ``OlmoeExperts``,
``GptOssExperts``, ...), so :func:`blockscaled.nn.quantize_model` swaps the experts module and
leaves the model's own router (softmax / sigmoid, grouped top-k, correction bias, scaling) as it
is. :class:`blockscaled.nn.MoE` uses the same module behind its own router.

The forward, all on the device (no host synchronisation, CUDA-graph capturable):
1. permutation (:func:`permute`): the ``T x k`` assignments sorted by expert, int32 offsets;
2. the sorted rows quantized to the activation format (or kept bf16/fp16: weight-only);
3. SwiGLU experts: ``bs.swiglu`` (gate and up in one grouped kernel); gpt-oss experts: one
   grouped GEMM of the gate|up weight (two where the gate / up split is not on a scale-block
   boundary), per-expert biases, ``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)``
   with ``g = clamp(gate, max=limit)``;
4. the intermediate quantized, the grouped down GEMM (plus the per-expert down bias);
5. combine: ``out[t] = sum_j weight[t, j] * y[row of (t, j)]`` in fp32, cast once to the input dtype; it
   also checks the permutation (expert ids outside [0, E): NaN output and ``blockscaled.check_errors``),
   so the grouped GEMMs of steps 3-4 skip their own metadata checks.
"""

from __future__ import annotations

import torch

from ..formats import get_format
from ..ops.explain import explain
from ..ops import moe as _moe
from ..ops.errors import CALLER_CHECKS
from ..ops.grouped import grouped_gemm
from ..ops.quantize import quantize
from ..ops.swiglu import swiglu
from ..plan.grouped import SPLIT_SWIGLU_FORMATS
from ..tensor import ScaledTensor

__all__ = ["Experts", "permute", "hf_experts_layout"]

_ACTIVATIONS = ("silu", "gpt_oss")


def permute(experts: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the ``[T, k]`` assignments by expert: ``(order int64 [T*k], token int64 [T*k],
    offsets int32 [E+1])``; row ``i`` of the sorted layout is assignment ``order[i]`` of token
    ``token[i]``, expert ``e`` owns rows ``offsets[e]:offsets[e+1]``. No host synchronisation:
    ``blockscaled.ops.moe.permute`` (one counting-sort kernel up to 128 assignments, a torch
    sort and scatter-add histogram above), which also returns the inverse permutation.

    Example::

        order, token, offsets = permute(torch.tensor([[2, 0], [2, 1]]), 4)   # offsets [0, 1, 2, 4, 4]
    """
    return _moe.permute(experts, num_experts)[:3]


def _rows(w: ScaledTensor, lo: int, hi: int) -> ScaledTensor:
    """Rows ``lo:hi`` of every expert of ``w [E, N, K]`` as a view (no copy; 1-row scale blocks or
    a split on a block boundary)."""
    br = w.block[0]
    bad = lo if lo % br else hi
    if br > 1 and (lo % br or (hi % br and hi != w.shape[1])):
        raise ValueError(f"w_gate_up: the gate / up split at row {bad} is not on a {br}-row scale block boundary")
    return ScaledTensor(w.data[:, lo:hi], w.scale[:, lo // br:-(-hi // br)], w.format,
                        torch.Size((w.shape[0], hi - lo, w.shape[2])), w.block, w.rounding,
                        global_scale=w.global_scale)


def _deinterleave(w: ScaledTensor) -> ScaledTensor:
    """gpt-oss's fused gate_up (gate on even rows, up on odd) -> gate rows then up rows (1-row
    scale blocks only: an interleaved 128-row block mixes gate and up)."""
    if w.block[0] != 1:
        raise ValueError(f"w_gate_up: interleaved gate / up rows need 1-row scale blocks, got {w.block}")
    data = torch.cat([w.data[:, 0::2], w.data[:, 1::2]], dim=1).contiguous()
    scale = torch.cat([w.scale[:, 0::2], w.scale[:, 1::2]], dim=1).contiguous()
    return ScaledTensor(data, scale, w.format, w.shape, w.block, w.rounding, global_scale=w.global_scale)


def _check3(name: str, w) -> None:
    if not isinstance(w, ScaledTensor) or w.ndim != 3:
        raise TypeError(f"{name}: expected a 3-D ScaledTensor [E, N, K], got {type(w).__name__} "
                        f"{tuple(getattr(w, 'shape', ()))}")


class Experts(torch.nn.Module):
    """The experts of an MoE layer on quantized weights (any format of ``bs.quantize``).

    Args:
        w_gate, w_up: ScaledTensors ``[E, I, H]``; w_down: ScaledTensor ``[E, H, I]``.
        w_gate_up: optional ScaledTensor ``[E, 2I, H]`` (gate rows then up rows) holding the same
            values. Kept (``w_gate`` / ``w_up`` then views of its rows, no second copy) where the
            forward reads it: MX / NV formats (the stacked SwiGLU, ``bs.swiglu(a, w_gate_up)``: one
            grouped GEMM over gate and up) and the gpt-oss activation or per-expert gate / up biases
            (one grouped GEMM instead of two); else (fp8_block's fused SwiGLU kernel reads
            ``w_gate`` / ``w_up``) not kept: ``w_gate_up`` None, so no weight is held twice.
        activation: "silu" (``silu(gate) * up``, one fused kernel) or "gpt_oss"
            (``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)``, ``g = clamp(gate, max=limit)``).
        gate_bias / up_bias ``[E, I]``, down_bias ``[E, H]``: per-expert biases (gpt-oss).
        act_format: the format activations are quantized to before each grouped GEMM (default
            "weights": the weights' format; None keeps bf16/fp16 activations, weight-only).

    ``forward(hidden_states [T, H], top_k_index int [T, k], top_k_weights [T, k]) -> [T, H]`` of
    hidden_states' dtype (bf16 / fp16); indices must lie in ``[0, E)``. Example::

        ex = Experts.from_dense(torch.randn(4, 512, 256).bfloat16() * 0.05,   # gate|up [E, 2I, H]
                                torch.randn(4, 256, 256).bfloat16() * 0.05,   # down [E, H, I]
                                "mxfp4")
        idx = torch.tensor([[0, 3], [1, 3]]); w = torch.full((2, 2), 0.5)
        y = ex(torch.randn(2, 256, dtype=torch.bfloat16), idx, w)             # [2, 256]
    """

    def __init__(self, w_gate: ScaledTensor, w_up: ScaledTensor, w_down: ScaledTensor, *,
                 w_gate_up: ScaledTensor | None = None, activation: str = "silu",
                 gate_bias: torch.Tensor | None = None, up_bias: torch.Tensor | None = None,
                 down_bias: torch.Tensor | None = None, alpha: float = 1.702, limit: float = 7.0,
                 act_format: str | None = "weights"):
        super().__init__()
        for name, w in (("w_gate", w_gate), ("w_up", w_up), ("w_down", w_down)):
            _check3(name, w)
        e, i, h = w_gate.shape
        if tuple(w_up.shape) != (e, i, h):
            raise ValueError(f"w_up: expected shape {(e, i, h)} like w_gate, got {tuple(w_up.shape)}")
        if tuple(w_down.shape) != (e, h, i):
            raise ValueError(f"w_down: expected shape {(e, h, i)} for w_gate {(e, i, h)}, got {tuple(w_down.shape)}")
        if w_gate_up is not None:
            _check3("w_gate_up", w_gate_up)
            if tuple(w_gate_up.shape) != (e, 2 * i, h):
                raise ValueError(f"w_gate_up: expected shape {(e, 2 * i, h)}, got {tuple(w_gate_up.shape)}")
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation: expected one of {_ACTIVATIONS}, got {activation!r}")
        for name, b, shape in (("gate_bias", gate_bias, (e, i)), ("up_bias", up_bias, (e, i)),
                               ("down_bias", down_bias, (e, h))):
            if b is not None and tuple(b.shape) != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {tuple(b.shape)}")
        if w_gate_up is not None:
            plain = activation == "silu" and gate_bias is None and up_bias is None
            if plain and w_gate.format.name not in SPLIT_SWIGLU_FORMATS:
                # fp8_block: the fused SwiGLU kernel (sm_90: the wide kernel) reads w_gate / w_up, never
                # w_gate_up; holding it too would keep every gate / up row twice (DeepSeek-V3: ~2/3 of
                # the experts' bytes); the kernels take whole experts, so rows given as views are copied once
                w_gate_up, w_gate, w_up = None, w_gate.contiguous(), w_up.contiguous()
            elif i % w_gate_up.block[0] == 0:
                # the forward reads w_gate_up: the stacked SwiGLU (MX / NV: one grouped GEMM over gate and
                # up, no fused sm_90 SwiGLU kernel to lose) or the gpt-oss / biased activation's one grouped
                # GEMM; w_gate / w_up become views of its rows (shapes, format, the float64 twin), not a
                # second copy (a split inside a 128-row scale block keeps the given two)
                w_gate, w_up = _rows(w_gate_up, 0, i), _rows(w_gate_up, i, 2 * i)
        self.w_gate, self.w_up, self.w_down, self.w_gate_up = w_gate, w_up, w_down, w_gate_up
        self.register_buffer("gate_bias", gate_bias)
        self.register_buffer("up_bias", up_bias)
        self.register_buffer("down_bias", down_bias)
        self.num_experts, self.hidden, self.intermediate = e, h, i
        self.activation, self.alpha, self.limit = activation, float(alpha), float(limit)
        self.act_format = w_gate.format.name if act_format == "weights" else act_format
        if self.act_format is not None:
            get_format(self.act_format, "act_format")

    @classmethod
    def from_dense(cls, w_gate_up: torch.Tensor, w_down: torch.Tensor, fmt, *, interleaved: bool = False,
                   gate_up_bias: torch.Tensor | None = None, **kwargs) -> "Experts":
        """Quantize float expert weights (``w_gate_up [E, 2I, H]``: gate rows then up rows, or
        gate / up interleaved with ``interleaved=True``; ``w_down [E, H, I]``) to ``fmt``
        (fp8_block: 128x128 blocks) and build the module. ``gate_up_bias [E, 2I]`` follows the
        same row order; other keyword arguments go to the constructor."""
        f = get_format(fmt, "fmt")
        block = (128, 128) if f.name == "fp8_block" else None
        if w_gate_up.ndim != 3 or w_gate_up.shape[1] % 2:
            raise ValueError(f"w_gate_up: expected [E, 2I, H], got {tuple(w_gate_up.shape)}")
        if interleaved:
            w_gate_up = torch.cat([w_gate_up[:, 0::2], w_gate_up[:, 1::2]], dim=1)
            if gate_up_bias is not None:
                gate_up_bias = torch.cat([gate_up_bias[:, 0::2], gate_up_bias[:, 1::2]], dim=1)
        i = w_gate_up.shape[1] // 2
        br = 128 if block else 1
        if i % br == 0:
            # one tensor (nvfp4: one global scale for gate and up, as the fused kernels need)
            gu = quantize(w_gate_up.contiguous(), f, block=block)
            w_gate, w_up = _rows(gu, 0, i), _rows(gu, i, 2 * i)
        else:
            # the split falls inside a 128-row scale block: gate and up quantized apart
            gu = None
            w_gate = quantize(w_gate_up[:, :i].contiguous(), f, block=block)
            w_up = quantize(w_gate_up[:, i:].contiguous(), f, block=block)
        w_dn = quantize(w_down.contiguous(), f, block=block)
        if gate_up_bias is not None:
            kwargs.update(gate_bias=gate_up_bias[:, :i], up_bias=gate_up_bias[:, i:])
        return cls(w_gate, w_up, w_dn, w_gate_up=gu, **kwargs)

    @classmethod
    def from_hf(cls, module: torch.nn.Module, fmt, *, weight_only: bool = False) -> "Experts":
        """Quantize a transformers experts module (see :func:`hf_experts_layout` for the ones
        recognised) to ``fmt``; ``weight_only`` keeps the activations bf16/fp16."""
        layout = hf_experts_layout(module)
        if layout is None:
            raise ValueError(f"module: {type(module).__name__} is not a recognised transformers experts module "
                             f"(3-D gate_up_proj / down_proj with a SiLU or gpt-oss activation)")
        gu, dn = module.gate_up_proj.detach(), module.down_proj.detach()
        kw = dict(act_format=None if weight_only else "weights")
        if layout == "gpt_oss":  # [E, H, 2I] interleaved columns, [E, I, H], biases, alpha / limit
            gub = getattr(module, "gate_up_proj_bias", None)
            dnb = getattr(module, "down_proj_bias", None)
            return cls.from_dense(gu.transpose(1, 2), dn.transpose(1, 2), fmt, interleaved=True,
                                  gate_up_bias=None if gub is None else gub.detach().float(),
                                  down_bias=None if dnb is None else dnb.detach().float(),
                                  activation="gpt_oss", alpha=float(module.alpha), limit=float(module.limit), **kw)
        return cls.from_dense(gu, dn, fmt, **kw)

    def _act(self, rows: torch.Tensor):
        if self.act_format is None:
            return rows
        f = get_format(self.act_format)
        return quantize(rows, f, block=(1, f.block_k))

    def _gate_up(self, a, offsets, validate=None):
        if self.w_gate_up is not None:
            gu = grouped_gemm(a, self.w_gate_up, offsets=offsets, out_dtype=torch.float32, validate=validate)
            return gu[:, :self.intermediate], gu[:, self.intermediate:]
        return (grouped_gemm(a, self.w_gate, offsets=offsets, out_dtype=torch.float32, validate=validate),
                grouped_gemm(a, self.w_up, offsets=offsets, out_dtype=torch.float32, validate=validate))

    #: CUDA graphs of eager calls (nn/graphs.py ``enable_cuda_graphs``); None: off
    _graphs = None

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        if self._graphs is not None:
            return self._graphs(self._forward, hidden_states, top_k_index, top_k_weights)
        return self._forward(hidden_states, top_k_index, top_k_weights)

    def _forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                 top_k_weights: torch.Tensor) -> torch.Tensor:
        x = hidden_states
        if x.ndim != 2 or x.shape[1] != self.hidden:
            raise ValueError(f"hidden_states: expected [T, {self.hidden}], got {tuple(x.shape)}")
        if top_k_index.ndim != 2 or top_k_index.shape[0] != x.shape[0]:
            raise ValueError(f"top_k_index: expected [{x.shape[0]}, k], got {tuple(top_k_index.shape)}")
        if tuple(top_k_weights.shape) != tuple(top_k_index.shape):
            raise ValueError(f"top_k_weights: expected shape {tuple(top_k_index.shape)} like top_k_index, "
                             f"got {tuple(top_k_weights.shape)}")
        return self._sorted_forward(x, top_k_index, top_k_weights, _moe.permute(top_k_index, self.num_experts))

    def _sorted_forward(self, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                        perm: tuple) -> torch.Tensor:
        """Steps 2-5 of the forward with the permutation ``perm`` (``ops.moe.permute``'s four
        tensors) already made: by :meth:`_forward`, or by ``nn.MoE`` in its routing launch."""
        order, token, offsets, inv = perm
        if x.device.type == "cpu" and not torch.compiler.is_compiling():
            # no sync to save on the CPU: a bad id raises here, as the grouped ops' host check did
            bad = (top_k_index < 0) | (top_k_index >= self.num_experts)
            if bool(bad.any()):
                raise ValueError(f"top_k_index: expected expert ids in [0, {self.num_experts}), got "
                                 f"{int(top_k_index[bad][0])} ({int(bad.sum())} of {top_k_index.numel()} out of range)")
        biased = self.gate_bias is not None or self.up_bias is not None or self.down_bias is not None
        y = self.expert_rows(x[token], offsets, top_k_index.reshape(-1)[order] if biased else None,
                             checked_after=True)
        # the combine checks the offsets the sort made (ids outside [0, E) -> NaN output and the error
        # flag), so the grouped GEMMs above skip their own metadata checks: two launches fewer
        return _moe.combine(y, top_k_weights, inv, x.dtype, offsets=offsets)

    def expert_rows(self, rows: torch.Tensor, offsets: torch.Tensor, expert_of_row: torch.Tensor, *,
                    checked_after: bool = False) -> torch.Tensor:
        """The experts' work on rows already in expert order (steps 2-4 of the forward, no
        routing, permutation or combine): ``rows [R, H]`` bf16 / fp16 sorted by expert,
        ``offsets`` int32 ``[E+1]`` (:func:`permute`), ``expert_of_row`` int ``[R]`` (for the
        per-expert biases; None when the module has none) -> fp32 ``[R, H]``, not yet weighted. The bench times it apart from
        the forward: the difference is the layer's glue. ``checked_after``: the caller checks
        ``offsets`` after this (``ops.moe.combine(..., offsets=)``), so the grouped GEMMs skip their
        device metadata checks; False: each checks them (NaN output and the error flag when bad)."""
        a = self._act(rows)
        biased = self.gate_bias is not None or self.up_bias is not None
        val = CALLER_CHECKS if checked_after else None
        if self.activation == "silu" and not biased:
            # out_dtype: the intermediate in the input dtype, as the float64 twin casts it; a held
            # w_gate_up (MX / NV, __init__) runs the stacked SwiGLU: one grouped GEMM over gate and up
            h = (swiglu(a, self.w_gate_up, offsets=offsets, out_dtype=rows.dtype, validate=val)
                 if self.w_gate_up is not None
                 else swiglu(a, self.w_gate, self.w_up, offsets=offsets, out_dtype=rows.dtype, validate=val))
        else:
            g, u = self._gate_up(a, offsets, val)
            if self.gate_bias is not None:
                g = g + self.gate_bias.float()[expert_of_row]
            if self.up_bias is not None:
                u = u + self.up_bias.float()[expert_of_row]
            if self.activation == "gpt_oss":
                g = g.clamp(max=self.limit)
                u = u.clamp(-self.limit, self.limit)
                h = ((u + 1) * g * torch.sigmoid(self.alpha * g)).to(rows.dtype)
            else:
                h = (torch.nn.functional.silu(g) * u).to(rows.dtype)
        y = grouped_gemm(self._act(h), self.w_down, offsets=offsets, out_dtype=torch.float32, validate=val)
        if self.down_bias is not None:
            y = y + self.down_bias.float()[expert_of_row]
        return y

    def plans(self, rows: int, dtype: torch.dtype = torch.bfloat16) -> tuple:
        """The plans (``blockscaled.explain``) of this module's grouped calls for ``rows`` sorted
        rows (tokens x top-k) spread over the experts: what a forward of that size launches.
        Used by :func:`blockscaled.warmup`; the activations are quantized zeros."""
        dev = self.w_gate.data.device
        idx = (torch.arange(rows, device=dev) % self.num_experts).reshape(rows, 1)
        _, _, offsets = permute(idx, self.num_experts)
        a = self._act(torch.zeros((rows, self.hidden), dtype=dtype, device=dev))
        if self.activation == "silu" and self.gate_bias is None and self.up_bias is None:
            w = (self.w_gate_up,) if self.w_gate_up is not None else (self.w_gate, self.w_up)
            first = [explain("swiglu", a, *w, offsets=offsets, out_dtype=dtype)]
        elif self.w_gate_up is not None:
            first = [explain("grouped_gemm", a, self.w_gate_up, offsets=offsets, out_dtype=torch.float32)]
        else:
            first = [explain("grouped_gemm", a, w, offsets=offsets, out_dtype=torch.float32)
                     for w in (self.w_gate, self.w_up)]
        h = self._act(torch.zeros((rows, self.intermediate), dtype=dtype, device=dev))
        return (*first, explain("grouped_gemm", h, self.w_down, offsets=offsets, out_dtype=torch.float32))

    def extra_repr(self) -> str:
        mode = "weight-only" if self.act_format is None else f"activations {self.act_format}"
        return (f"experts={self.num_experts}, hidden={self.hidden}, intermediate={self.intermediate}, "
                f"format={self.w_gate.format.name}, {mode}, activation={self.activation}")


def hf_experts_layout(module: torch.nn.Module) -> str | None:
    """How a transformers experts module stores its weights: "gpt_oss" (``GptOssExperts``:
    ``gate_up_proj [E, H, 2I]`` with gate / up interleaved along the last axis, ``down_proj
    [E, I, H]``, biases, ``alpha`` / ``limit``), "silu" (``MixtralExperts``, ``Qwen2MoeExperts``,
    ``Qwen3MoeExperts``, ``DeepseekV3Experts``, ``OlmoeExperts`` and the like: ``gate_up_proj
    [E, 2I, H]`` gate rows then up rows, ``down_proj [E, H, I]``, a SiLU ``act_fn``), or None
    (anything else: left alone by ``quantize_model``)."""
    gu = getattr(module, "gate_up_proj", None)
    dn = getattr(module, "down_proj", None)
    if not (isinstance(gu, torch.Tensor) and isinstance(dn, torch.Tensor) and gu.ndim == 3 and dn.ndim == 3):
        return None
    e = gu.shape[0]
    if hasattr(module, "alpha") and hasattr(module, "limit") and getattr(module, "is_transposed", True):
        h, two_i = gu.shape[1], gu.shape[2]
        if two_i % 2 == 0 and tuple(dn.shape) == (e, two_i // 2, h):
            return "gpt_oss"
        return None
    act = getattr(module, "act_fn", None)
    if not isinstance(act, (torch.nn.SiLU,)) and type(act).__name__ not in ("SiLUActivation", "SiLU"):
        return None
    if getattr(module, "is_transposed", False):
        return None
    two_i, h = gu.shape[1], gu.shape[2]
    if two_i % 2 == 0 and tuple(dn.shape) == (e, h, two_i // 2):
        return "silu"
    return None
