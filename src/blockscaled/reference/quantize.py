"""Pure-torch reference quantizers: the definition the Triton kernels match bit for bit.

All arithmetic is fp32 with IEEE round-to-nearest-even, in the order written here; kernels perform
the same operations in the same order. Divisions go through :func:`_div` (tensor / tensor):
PyTorch's CUDA backend turns ``tensor / python_scalar`` into a multiplication by the rounded
reciprocal, which is not bitwise IEEE division (seen on the H100: 1983 of 3584 fp8_block scales
differed from the CPU result), so the reference never divides by a Python scalar.

NaN payloads are not part of the contract (CPU and GPU produce different quiet-NaN bits); the
bitwise comparisons in ``blockscaled.testing`` treat every NaN of a dtype as one value.

NaN/Inf policy (all formats): never raise, propagate. A block containing NaN gets a NaN
scale (fp32 NaN, E8M0 0xFF or e4m3 NaN) and dequantizes to NaN. A block containing +-Inf
(and no NaN) gets an infinite fp32 scale (fp8_block: data of finite elements 0, of infinite
elements NaN) or a NaN scale (MX, nvfp4, also with a user-given nvfp4 global scale); either
way it dequantizes to NaN, not to a wrong finite number. e2m1 has no NaN code: NaN elements
encode as +6 (code 7) and the block's NaN scale carries the NaN. With the computed nvfp4
global scale a single NaN/Inf anywhere makes the global scale non-finite and the whole tensor
dequantizes to NaN. Denormal inputs are honoured (scaled up, not flushed).
"""

from __future__ import annotations


import torch

from .._checks import (FLOAT_INPUT_DTYPES, as_global_scale, check_flag, check_tensor, resolve_quantize_args,
                       warn_quantize_range)
from ..formats import E2M1_MAX, E4M3_MAX, Format, ScaleRounding
from ..tensor import ScaledTensor

__all__ = [
    "quantize",
    "dequantize",
    "silu_mul_quantize",
    "tensor_amax",
    "nvfp4_global_scale",
    "nvfp4_checked_global_scale",
    "nvfp4_range_stats",
    "e2m1_encode",
    "e2m1_decode",
    "e8m0_to_fp32",
    "pow2_ceil",
]

#: Smallest normal fp32; floor of EXACT fp8_block scales.
FP32_MIN_NORMAL = 2.0**-126
#: fp32 bit pattern of 2**-127 (a denormal): values at or below it round up to E8M0 0.
_BITS_2POW_M127 = 0x00400000
#: Largest finite fp32.
FP32_MAX = torch.finfo(torch.float32).max


def _div(num, den) -> torch.Tensor:
    """IEEE fp32 division ``num / den`` on any device (see the module docstring)."""
    if not isinstance(num, torch.Tensor):
        num = torch.full_like(den, float(num), dtype=torch.float32)
    if not isinstance(den, torch.Tensor):
        den = torch.full_like(num, float(den), dtype=torch.float32)
    return torch.div(num, den)


# --------------------------------------------------------------------------- element codecs
def e4m3_satfinite(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> float8_e4m3fn, round to nearest even, saturating to +-448; NaN stays NaN."""
    return v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> e2m1 codes (uint8 in 0..15), round to nearest even, saturating to +-6.

    Code = sign << 3 | magnitude index into (0, 0.5, 1, 1.5, 2, 3, 4, 6). The sign is the fp32
    sign bit (so -0.1 encodes as -0). Ties go to the even code: 0.25->0, 0.75->1, 1.25->1,
    1.75->2, 2.5->2, 3.5->4, 5->4. NaN encodes as the positive code 7 whatever its sign bit
    (NaN signs are platform-dependent; the block's scale carries the NaN).
    """
    a = v.abs()
    mag = torch.full(v.shape, 7, dtype=torch.int32, device=v.device)
    # Walk down from the top so that each threshold overrides the one above it.
    for thr, code, inclusive in (
        (5.0, 6, True),
        (3.5, 5, False),
        (2.5, 4, True),
        (1.75, 3, False),
        (1.25, 2, True),
        (0.75, 1, False),
        (0.25, 0, True),
    ):
        hit = a <= thr if inclusive else a < thr
        mag = torch.where(hit, code, mag)
    sign = (v.view(torch.int32) >> 31) & 1
    code = mag | (sign << 3)
    return torch.where(torch.isnan(v), 7, code).to(torch.uint8)


_E2M1_VALUES = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8 0..15) -> fp32 values."""
    return _E2M1_VALUES.to(codes.device)[codes.long()]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """``[..., K]`` codes -> ``[..., ceil(K/2)]`` bytes, element 2i in the low nibble."""
    k = codes.shape[-1]
    if k % 2:
        codes = torch.nn.functional.pad(codes, (0, 1))
    c = codes.view(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (c[..., 0] | (c[..., 1] << 4)).to(torch.uint8)


def unpack_fp4(data: torch.Tensor, k: int) -> torch.Tensor:
    """``[..., ceil(K/2)]`` bytes -> ``[..., K]`` codes."""
    lo = data & 0xF
    hi = data >> 4
    return torch.stack((lo, hi), dim=-1).view(*data.shape[:-1], 2 * data.shape[-1])[..., :k]


def _e8m0_table() -> torch.Tensor:
    bits = torch.arange(256, dtype=torch.int64)
    vals = (bits << 23).to(torch.int32).view(torch.float32).clone()
    vals[0] = 2.0**-127  # biased 0 is the denormal 2**-127
    vals[255] = float("nan")
    return vals


_E8M0_TO_FP32 = _e8m0_table()


def e8m0_to_fp32(s: torch.Tensor) -> torch.Tensor:
    """Biased E8M0 exponents (uint8) -> fp32 ``2**(s - 127)``; 255 -> NaN. Exact."""
    return _E8M0_TO_FP32.to(s.device)[s.long()]


def pow2_ceil(v: torch.Tensor) -> torch.Tensor:
    """Round positive normal fp32 up to a power of two (exact, via the bit pattern).
    Non-finite values pass through."""
    bits = v.view(torch.int32)
    exp = (bits >> 23) & 0xFF
    up = exp + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    out = (up << 23).view(torch.float32)
    return torch.where(torch.isfinite(v), out, v)


# --------------------------------------------------------------------------- scale rules
def fp8_block_scale(amax: torch.Tensor, rounding: ScaleRounding) -> torch.Tensor:
    """fp32 scale of an fp8_block block from its fp32 ``amax`` (see ScaleRounding)."""
    s = _div(amax, E4M3_MAX)
    s = torch.where(s < FP32_MIN_NORMAL, FP32_MIN_NORMAL, s)  # NaN compares false: stays NaN
    if rounding is ScaleRounding.RCEIL:
        s = pow2_ceil(s)
    return s


def e8m0_scale(amax: torch.Tensor, fmt: Format, rounding: ScaleRounding) -> torch.Tensor:
    """Biased E8M0 exponent (int32 0..255) of an MX block from its fp32 ``amax``."""
    if rounding is ScaleRounding.FLOOR:
        exp = (amax.view(torch.int32) >> 23) & 0xFF  # floor(log2(amax)) + 127; denormals -> 0
        b = (exp - fmt.elem_emax).clamp(0, 254)
        return torch.where(exp == 255, 255, b)
    # RCEIL: amax / elem_max rounded up to a power of two (cvt.rp.satfinite.ue8m0x2.f32).
    v = _div(amax, fmt.elem_max)
    bits = v.view(torch.int32)
    exp = (bits >> 23) & 0xFF
    b = exp + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    b = torch.where(bits <= _BITS_2POW_M127, 0, b).clamp(0, 254)
    return torch.where(exp == 255, 255, b)


def e8m0_reciprocal(b: torch.Tensor) -> torch.Tensor:
    """fp32 ``2**(127 - b)`` for biased exponents b in 0..253 (exact, built from bits);
    NaN for b = 255. (b = 254 cannot come from finite input: amax < 2**128.)"""
    r = ((254 - b).clamp(min=0) << 23).view(torch.float32)
    return torch.where(b == 255, float("nan"), r)


# --------------------------------------------------------------------------- helpers
def _blocks_1d(xf: torch.Tensor, bk: int) -> torch.Tensor:
    """``[..., K]`` -> ``[..., ceil(K/bk), bk]`` zero-padded (zeros do not change amax)."""
    k = xf.shape[-1]
    pad = (-k) % bk
    if pad:
        xf = torch.nn.functional.pad(xf, (0, pad))
    return xf.view(*xf.shape[:-1], xf.shape[-1] // bk, bk)  # explicit: -1 is ambiguous with 0 rows


def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """0-d fp32 ``max(|x|)`` (NaN if any element is NaN; 0 for an empty tensor)."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    return x.float().abs().amax()


def nvfp4_global_scale(amax: torch.Tensor) -> torch.Tensor:
    """NVFP4 encode scale ``gs = 448 * 6 / amax`` (fp32, 0-d): 1.0 for amax == 0, capped at
    the largest fp32 for tiny amax; NaN for NaN amax, 0 for infinite amax."""
    gs = _div(E4M3_MAX * E2M1_MAX, amax.float())
    gs = torch.where(amax == 0, 1.0, gs)
    return torch.where(gs > FP32_MAX, FP32_MAX, gs)


def nvfp4_checked_global_scale(gs: torch.Tensor) -> torch.Tensor:
    """A user-given encode scale as the quantizer uses it: itself if finite and > 0, else NaN
    (every scale NaN: the tensor dequantizes to all NaN). ``quantize`` raises for bad Python
    numbers and CPU tensors before getting here; CUDA tensors are not read back (no sync)."""
    return torch.where((gs > 0) & (gs < float("inf")), gs, float("nan"))


def nvfp4_range_stats(x: torch.Tensor, q: ScaledTensor) -> torch.Tensor:
    """Blocks of an nvfp4 quantization that lost their content to the scale range: float64
    ``[4]`` on ``x``'s device = (blocks whose amax is finite and > 0, those whose scale
    underflowed to 0, those whose scale saturated, the largest finite |x|). No host sync.

    ``x`` is the quantized input, ``q`` its result. A block *underflows* when ``gs * amax / 6``
    rounds to e4m3 0 (below 2**-10): its scale is 0 and all its elements dequantize to 0. That
    happens to every block far below the tensor's amax when one outlier sets the global scale
    (``gs = 2688 / amax``; blocks under ``amax / (448 * 2**10)`` are lost). A block *saturates* when
    ``gs * amax / 6 > 464``: beyond the rounding to e4m3's largest value 448, so its scale is
    clamped and its largest elements clip (only a user-given gs larger than ``2688 / amax``
    does that). NaN / Inf blocks are counted in neither (they dequantize to NaN), nor is any
    block when gs itself is not finite and > 0 (the whole tensor dequantizes to NaN)."""
    xb = _blocks_1d(x.float(), q.format.block_k)
    amax = xb.abs().amax(-1)
    gs = q.global_scale.reshape(()).to(amax.device)
    # (a gs that is not finite and > 0, e.g. 0 computed from an infinite amax, makes the whole
    # tensor dequantize to NaN: nothing there is "lost to zero", so no block is counted)
    ok = torch.isfinite(amax) & (amax > 0) & torch.isfinite(gs) & (gs > 0)
    under = ok & (q.scale.float() == 0)
    t = _div(gs * amax, E2M1_MAX)
    sat = ok & (t > 464.0)
    top = torch.where(ok, amax, 0.0).amax() if amax.numel() else amax.new_zeros(())
    return torch.stack([ok.sum().double(), under.sum().double(), sat.sum().double(), top.double()])


# --------------------------------------------------------------------------- quantize
def quantize(
    x: torch.Tensor,
    fmt,
    *,
    block: tuple[int, int] | None = None,
    rounding: ScaleRounding | str | None = None,
    global_scale=None,
    check_range: bool | None = None,
) -> ScaledTensor:
    """Reference twin of :func:`blockscaled.quantize` (same signature, same bits, the same
    ``check_range`` warnings)."""
    f, block, rounding = resolve_quantize_args(x, fmt, block, rounding, global_scale)
    check_flag("check_range", check_range, allow_none=True)
    q = _quantize(x, f, block, rounding, global_scale)
    warn_quantize_range(x, q, check_range)
    return q


def _quantize(x: torch.Tensor, f: Format, block, rounding: ScaleRounding, global_scale) -> ScaledTensor:
    shape = tuple(x.shape)
    xf = x.float()
    k = shape[-1]

    if f.name == "fp8_block":
        if block[0] == 1:
            xb = _blocks_1d(xf, 128)  # [..., nb, 128]
            amax = xb.abs().amax(-1)  # [..., nb]
            scale = fp8_block_scale(amax, rounding)
            data = e4m3_satfinite(_div(xb, scale[..., None].expand_as(xb))).flatten(-2)[..., :k]
        else:
            r = shape[-2]
            pr, pk = (-r) % 128, (-k) % 128
            xp = torch.nn.functional.pad(xf, (0, pk, 0, pr))
            lead = xp.shape[:-2]
            xb = xp.view(*lead, xp.shape[-2] // 128, 128, xp.shape[-1] // 128, 128)
            amax = xb.abs().amax(dim=(-3, -1))  # [..., nr, nc]
            scale = fp8_block_scale(amax, rounding)
            q = e4m3_satfinite(_div(xb, scale[..., :, None, :, None].expand_as(xb)))
            data = q.view(xp.shape)[..., :r, :k]
        return ScaledTensor(data.contiguous(), scale.contiguous(), f, torch.Size(shape), block, rounding)

    if f.scale_kind == "e8m0":  # mxfp8, mxfp4
        xb = _blocks_1d(xf, f.block_k)
        amax = xb.abs().amax(-1)
        b = e8m0_scale(amax, f, rounding)
        v = xb * e8m0_reciprocal(b)[..., None]  # exact power-of-two scaling
        v = v.flatten(-2)[..., :k]
        data = e4m3_satfinite(v) if f.elem == "e4m3" else pack_fp4(e2m1_encode(v))
        scale = b.to(torch.uint8)
        return ScaledTensor(data.contiguous(), scale.contiguous(), f, torch.Size(shape), block, rounding)

    # nvfp4
    if global_scale is None:
        gs = nvfp4_global_scale(tensor_amax(x))
    else:
        gs = nvfp4_checked_global_scale(as_global_scale(global_scale, x.device))
    xb = _blocks_1d(xf, 16)
    amax = xb.abs().amax(-1)
    t = _div(gs * amax, E2M1_MAX)
    # An infinite element makes the block scale NaN (never a saturated finite 448), so the
    # block dequantizes to NaN even with a user-given global scale.
    sf = e4m3_satfinite(torch.where(torch.isinf(amax), float("nan"), t))
    sff = sf.float()
    inv = torch.where(sff == 0, 0.0, _div(gs.expand_as(sff), sff))
    v = (xb * inv[..., None]).flatten(-2)[..., :k]
    data = pack_fp4(e2m1_encode(v))
    return ScaledTensor(
        data.contiguous(), sf.contiguous(), f, torch.Size(shape), block, rounding, global_scale=gs.reshape(())
    )


# --------------------------------------------------------------------------- dequantize
def dequantize(q: ScaledTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Reference twin of :func:`blockscaled.dequantize`: ``[..., K]`` tensor of ``dtype``.

    Computed in fp32 (exact for every format: element * power-of-two or fp32 scale is one
    rounding at most), then cast to ``dtype``."""
    if not isinstance(q, ScaledTensor):
        raise TypeError(f"q: expected a ScaledTensor, got {type(q).__name__}")
    f = q.format
    shape = tuple(q.shape)
    k = shape[-1]
    if f.is_fp4:
        vals = e2m1_decode(unpack_fp4(q.data, k))
    else:
        vals = q.data.float()
    if f.scale_kind == "fp32":
        s = q.scale
    elif f.scale_kind == "e8m0":
        s = e8m0_to_fp32(q.scale)
    else:
        s = q.scale.float()
    br, bk = q.block
    if br == 1:
        s_full = s.repeat_interleave(bk, dim=-1)[..., :k]
    else:
        s_full = s.repeat_interleave(br, dim=-2).repeat_interleave(bk, dim=-1)[..., : shape[-2], :k]
    out = vals * s_full
    if f.has_global_scale:
        out = _div(out, q.global_scale.expand_as(out))
    return out.to(dtype)


# --------------------------------------------------------------------------- fused SwiGLU + quant
def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """fp32 ``silu(g) * u`` for ``gate_up = [..., 2I]`` (gate first, then up, as vLLM/SGLang)."""
    i = gate_up.shape[-1] // 2
    g = gate_up[..., :i].float()
    u = gate_up[..., i:].float()
    return g / (1.0 + torch.exp(-g)) * u


def silu_mul_quantize(
    gate_up: torch.Tensor,
    fmt="fp8_block",
    *,
    rounding: ScaleRounding | str | None = None,
    intermediate_dtype: torch.dtype = torch.bfloat16,
) -> ScaledTensor:
    """Reference twin of :func:`blockscaled.silu_mul_quantize`: quantize
    ``(silu(g) * u).to(intermediate_dtype)`` with 1x128 blocks (fp8_block).

    The intermediate is rounded to ``intermediate_dtype`` (bf16 by default) exactly as the
    unfused engine pipeline (silu_and_mul -> bf16 -> quantize) does."""
    check_tensor("gate_up", gate_up, dtypes=FLOAT_INPUT_DTYPES, min_ndim=1)
    if gate_up.shape[-1] % 2:
        raise ValueError(
            f"gate_up: last dimension must be even (gate then up halves), got {tuple(gate_up.shape)}"
        )
    h = silu_mul(gate_up).to(intermediate_dtype)
    return quantize(h, fmt, rounding=rounding)


