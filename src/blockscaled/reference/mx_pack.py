"""MX operands re-encoded as e4m3 for the FP8 tensor cores, exactly (pure torch; the twins of
``kernels/triton/mx_pack.py`` and the load-time weight packer itself).

Why: Hopper has no block-scaled MMA. Its FP8 wgmma takes e4m3 x e4m3 with one fp32 scale per
promotion, and the per-32 promotion of the MX formats costs one FP32 multiply-add per 32 MACs per
output, as much issue time as the MMA itself: measured (H200, benchmarks/NOTES.md twenty-sixth
session) 0.81-0.97x cuBLAS bf16 at M >= 2048 against 1.42-1.54x for the same kernel promoting once
per 128. So both operands are re-encoded where that is exact:

* **Weights** (``mxfp4_to_fp8_block``, once at load time): every e2m1 code times its E8M0 scale
  ``2^(s-127)`` becomes an e4m3 value times one fp32 scale per 128 x 128 tile, ``2^(r-127)`` with
  ``r = max(s) - 6`` over the tile's nonzero 32-element blocks: ``e2m1 * 2^(s-r)`` with
  ``s - r`` in ``[-8, 6]`` is exact in e4m3 (6 * 2^6 = 384 <= 448; 0.5 * 2^-8 = 2^-9, e4m3's
  smallest subnormal, and every e2m1 value is a multiple of 0.5). So a tile whose nonzero blocks'
  exponents span at most ``SPAN = 14`` is exact (sufficient, not necessary; wider tiles are
  refused), and the result is an ordinary fp8_block
  ScaledTensor (128 x 128 blocks) whose dequantization equals the mxfp4 one bit for bit.
* **Activations** (``encode_mx_activations``, per call): e4m3 data ``[M, K]`` with fp32 scales
  per 32 K ``[M, 4 * ceil(K/128)]`` and a per-row flag. Each (row, 128-K) group whose nonzero
  blocks span <= 14 (mxfp4) or share one exponent (mxfp8) is written with one scale repeated four
  times ("uniform"); any other group keeps its own four scales (e2m1 and e4m3 values as they are)
  and sets the row's flag. The wide kernel runs a 128-row tile's K blocks with one promotion each
  where no row of the tile is flagged, else with four (``kernels/hopper/wide.py`` ASUB); both are
  exact products of the dequantized operands.

Scales are built from their bits (``pow2``), never with ``torch.pow`` / ``exp2``: those are not
exact on every device, and E8M0 0 (2^-127) is an fp32 subnormal.
"""

from __future__ import annotations

import torch

from ..formats import get_format
from ..tensor import ScaledTensor
from .quantize import e2m1_decode, e8m0_to_fp32, unpack_fp4

__all__ = ["SPAN", "pow2", "mxfp4_to_fp8_block", "encode_mx_activations", "fp8_block_tile_spans"]

#: The widest exponent span of e2m1 blocks that one e4m3 scale holds exactly: s - r in [-8, 6].
SPAN = 14
#: r = max(s) - HEADROOM puts the largest block's e2m1 values at up to 6 * 2^6 = 384 in e4m3 (<= 448).
HEADROOM = 6
#: E8M0 255 is NaN: such a block never joins a uniform group (its NaN must reach the output).
E8M0_NAN = 255


def pow2(e: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``2.0 ** e`` for integer tensors ``e`` (exact, built from the bits; subnormals included,
    below the dtype's range 0): fp32 for e in [-149, 127], fp64 for [-1074, 1023]."""
    e = e.to(torch.int64)
    if dtype == torch.float64:
        bits = torch.where(e >= -1022, (e + 1023).clamp(min=0) << 52,
                           torch.where(e >= -1074, torch.ones_like(e) << (e + 1074).clamp(min=0), 0))
        return bits.view(torch.float64)
    bits = torch.where(e >= -126, (e + 127).clamp(min=0) << 23,
                       torch.where(e >= -149, torch.ones_like(e) << (e + 149).clamp(min=0), 0))
    return bits.to(torch.int32).view(torch.float32)


def _check_mx(name: str, q, formats: tuple[str, ...]) -> None:
    if not isinstance(q, ScaledTensor):
        raise TypeError(f"{name}: expected a ScaledTensor, got {type(q).__name__}")
    if q.format.name not in formats or q.block != (1, 32) or q.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D {' or '.join(formats)} ScaledTensor with (1, 32) blocks, got "
                         f"{q.format.name} {tuple(q.shape)} block {q.block}")


def _blocks(q: ScaledTensor):
    """``(v, s, nz, nan)`` of an MX tensor ``[R, K]``: the elements without their scales (e2m1 or
    e4m3 values, fp32 ``[R, K]``), the E8M0 exponents (int64 ``[R, nblk]``), whether each 32-block
    holds a nonzero element, and whether its scale is NaN (255: the block dequantizes to NaN even
    with all-zero codes)."""
    r, k = q.shape
    v = e2m1_decode(unpack_fp4(q.data, k)) if q.format.name == "mxfp4" else q.data.float()
    s = q.scale.long()
    nz = torch.nn.functional.pad(v, (0, 32 * s.shape[1] - k)).view(r, s.shape[1], 32).ne(0).any(-1)
    return v, s, nz, s == E8M0_NAN


def _group_view(t: torch.Tensor, k_blocks: int, fill) -> torch.Tensor:
    """``[R, ceil(K/32)]`` per-block values -> ``[R, ceil(K/128), 4]`` (the last group padded)."""
    pad = 4 * k_blocks - t.shape[1]
    return torch.nn.functional.pad(t, (0, pad), value=fill).view(t.shape[0], k_blocks, 4)


def _exponent_range(s, nz, nan, tile_rows: int):
    """Per (``tile_rows`` rows, 128-K group): ``(hi, lo)``, the largest and smallest exponent of the
    nonzero blocks (hi < 0: no nonzero block; a NaN block makes hi 10**4, so no span admits it)."""
    rows = s.shape[0]
    kb = -(-s.shape[1] // 4)
    pad = -rows % tile_rows
    hi_in = torch.nn.functional.pad(torch.where(nz | nan, torch.where(nan, 10**4, s), -1), (0, 0, 0, pad), value=-1)
    lo_in = torch.nn.functional.pad(torch.where(nz, s, 10**4), (0, 0, 0, pad), value=10**4)
    hi = _group_view(hi_in, kb, -1).view(-1, tile_rows, kb, 4).amax((1, 3))
    lo = _group_view(lo_in, kb, 10**4).view(-1, tile_rows, kb, 4).amin((1, 3))
    return hi, lo


def fp8_block_tile_spans(w: ScaledTensor) -> torch.Tensor:
    """Per 128 x 128 tile of an mxfp4 weight ``[N, K]``: the span (max - min) of the E8M0 exponents
    of its nonzero 32-element blocks, int64 ``[ceil(N/128), ceil(K/128)]`` (0 for an all-zero
    tile; a NaN scale (255), with any codes, counts as a span of 255). ``mxfp4_to_fp8_block``
    re-encodes a weight whose every entry is <= ``SPAN`` (sufficient for exactness, not necessary:
    a tile spanning 15 whose largest block holds no 6 would fit one exponent lower).

    Example::

        spans = fp8_block_tile_spans(bs.quantize(w, "mxfp4"))   # [ceil(N/128), ceil(K/128)]
    """
    _check_mx("w", w, ("mxfp4",))
    _, s, nz, nan = _blocks(w)
    return _spans(*_exponent_range(s, nz, nan, 128))


def _spans(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    return torch.where(hi < 0, 0, (hi - lo).clamp(max=E8M0_NAN))


def mxfp4_to_fp8_block(w: ScaledTensor) -> ScaledTensor:
    """An mxfp4 weight ``[N, K]`` (E8M0 per 1 x 32) as an fp8_block ScaledTensor (e4m3 ``[N, K]``,
    fp32 power-of-two scales ``[ceil(N/128), ceil(K/128)]`` per 128 x 128 tile, rounding "rceil") whose
    dequantization is bitwise the mxfp4 one. Raises ``ValueError`` naming the first tile whose
    nonzero blocks' exponents span more than ``SPAN`` (= 14) or hold a NaN scale: that weight
    cannot be re-encoded exactly (keep the mxfp4 form). Host-synchronising (a load-time step).

    Example::

        w4 = bs.quantize(torch.randn(4096, 2880, device="cuda", dtype=torch.bfloat16), "mxfp4")
        w8 = mxfp4_to_fp8_block(w4)          # fp8_block, block (128, 128)
        assert torch.equal(bs.dequantize(w8, torch.float32), bs.dequantize(w4, torch.float32))
    """
    _check_mx("w", w, ("mxfp4",))
    v, s, nz, nan = _blocks(w)
    hi, lo = _exponent_range(s, nz, nan, 128)
    spans = _spans(hi, lo)
    bad = (spans > SPAN).nonzero()
    if bad.numel():
        i, j = (int(x) for x in bad[0])
        raise ValueError(
            f"w: tile ({i}, {j}) (rows {128 * i}..{128 * i + 127}, K {128 * j}..{128 * j + 127}) holds E8M0 block "
            f"exponents spanning {int(spans[i, j])} (> {SPAN}) or a NaN scale: not exact as e4m3 with one scale per "
            f"128 x 128 tile; {int((spans > SPAN).sum())} of {spans.numel()} tiles are")
    n, k = w.shape
    ref = torch.where(hi < 0, 127, hi - HEADROOM)  # [nb, kb]; an all-zero tile: scale 1
    ref_blocks = ref.repeat_interleave(128, 0)[:n].repeat_interleave(4, 1)[:, : s.shape[1]]  # [N, ceil(K/32)]
    shift = torch.where(nz, s - ref_blocks, 0).repeat_interleave(32, 1)[:, :k]
    data = (v * pow2(shift)).to(torch.float8_e4m3fn)
    return ScaledTensor(data, pow2(ref - 127), get_format("fp8_block"), w.shape, (128, 128), "rceil")


def encode_mx_activations(a: ScaledTensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mxfp4 / mxfp8 activations ``[M, K]`` (1 x 32 blocks) -> ``(data, scale, flag)`` for the wide
    kernel's MX path: ``data`` e4m3 ``[M, K]``, ``scale`` fp32 ``[M, 4 * ceil(K/128)]`` (one per 32
    K; a missing last block's scale 0), ``flag`` int32 ``[M]`` (1: some 128-K group of the row keeps
    four different scales). ``data * scale`` (each scale over its 32 elements) is bitwise
    ``dequantize(a)`` in fp32. Per (row, 128-K) group: mxfp4 whose nonzero blocks span <= ``SPAN``
    -> one scale ``2^(max(s) - 6 - 127)`` four times and the e2m1 values shifted into e4m3 (an
    all-zero group: scale 1); mxfp8 whose nonzero blocks share one exponent -> that scale four
    times, data as it is; a NaN scale or any other group -> its own four scales and values.

    Example::

        data, scale, flag = encode_mx_activations(bs.quantize(x, "mxfp4"))   # x [M, K]
    """
    _check_mx("a", a, ("mxfp4", "mxfp8"))
    m, k = a.shape
    kb = -(-k // 128)
    if m == 0 or k == 0:  # (the group views below cannot take an empty dimension)
        dev = a.data.device
        return (torch.empty((m, k), dtype=torch.float8_e4m3fn, device=dev), torch.zeros((m, 4 * kb), device=dev),
                torch.zeros((m,), dtype=torch.int32, device=dev))
    nblk = a.scale.shape[1]
    v, s, nz, nan = _blocks(a)
    hi, lo = _exponent_range(s, nz, nan, 1)  # [M, kb]
    empty = hi < 0
    limit = SPAN if a.format.name == "mxfp4" else 0
    uniform = empty | ((hi - lo) <= limit)  # a NaN block makes hi 10**4: never uniform
    ref = torch.where(empty, 127, hi - (HEADROOM if a.format.name == "mxfp4" else 0))  # [M, kb]
    ref_blocks = ref.repeat_interleave(4, 1)[:, :nblk]
    uni_blocks = uniform.repeat_interleave(4, 1)[:, :nblk]
    shift = torch.where(uni_blocks & nz, s - ref_blocks, 0).repeat_interleave(32, 1)[:, :k]
    data = (v * pow2(shift)).to(torch.float8_e4m3fn)
    scale = torch.where(uni_blocks, pow2(ref_blocks - 127), e8m0_to_fp32(a.scale))
    scale = torch.nn.functional.pad(scale, (0, 4 * kb - nblk))  # blocks past K: 0 (their data is TMA's zero fill)
    flag = (~uniform).any(1).to(torch.int32)
    return data.contiguous(), scale.contiguous(), flag
