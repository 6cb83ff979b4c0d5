"""Scale-layout converters: canonical row-major scales <-> the layouts other libraries take.

Our canonical scale layout (see :mod:`blockscaled.tensor`) is row-major ``[..., rows, sk]``
with ``sk = ceil(K / block_k)``: one row of scales per data row (or per 128 data rows for
128x128 fp8_block weights). Libraries want other layouts:

DeepGEMM (https://github.com/deepseek-ai/DeepGEMM)
    * sm90, fp32 activation scales ("MN-major, TMA-aligned"): the logical shape stays
      ``[M, sk]`` (or ``[E, M, sk]``) but the storage is column-major with the column stride
      padded to ``Ma = align(M, 16 / 4)`` so that every column starts 16-byte aligned, as TMA
      requires: strides ``(1, Ma)`` and ``(sk * Ma, 1, Ma)``. This is what DeepGEMM's
      ``get_mn_major_tma_aligned_tensor`` produces and its GEMMs check.
      -> :func:`to_deepgemm_fp32` / :func:`from_deepgemm_fp32`.
    * sm100, packed UE8M0 scales: every scale must be a power of two; its biased exponent
      byte (the fp32 exponent field, ``log2(s) + 127``) is kept, four consecutive K-scales are
      packed into one int32 (scale ``4p + j`` in byte ``j``, least significant first), and
      the int32 tensor ``[M, ceil(sk/4)]`` is MN-major and TMA-aligned the same way:
      strides ``(1, Ma)`` / ``(ceil(sk/4) * Ma, 1, Ma)`` with ``Ma = align(M, 4)``. This is
      what ``get_mn_major_tma_aligned_packed_ue8m0_tensor`` produces.
      -> :func:`to_deepgemm_ue8m0` / :func:`from_deepgemm_ue8m0`.

cuBLAS / CUTLASS "32_4_4" blocked layout (MXFP8, MXFP4, NVFP4 on Blackwell)
    cuBLAS documentation, "1D block scaling factors layout": the ``[rows, cols]`` scale matrix
    is padded to ``rows % 128 == 0`` and ``cols % 4 == 0`` and cut into 128x4 tiles of 512
    bytes each, stored tile after tile in row-tile-major order (all column tiles of row tile
    0, then row tile 1, ...). Inside a tile, the scale of row ``r`` and column ``c`` sits at
    byte ``(r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4)``, i.e. the tile is stored as
    ``[32, 4, 4]`` = (row mod 32, row-quarter, column). Full formula for one matrix::

        offset(r, c) = ((r // 128) * ceil(cols / 4) + c // 4) * 512
                       + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4

    This is the layout ``torch._scaled_mm`` takes for MXFP8 / NVFP4 scales and the
    "permuted"/"reordered" scale factors of the GPU MODE NVFP4 problems (whose 6-D tensor
    ``[32, 4, rest_m, 4, rest_k, L]`` is only a permuted view of the same bytes, see
    :func:`gpumode_view`). -> :func:`to_blocked` / :func:`from_blocked`.

Hopper's FP8 tensor cores (mxfp4 weights)
    An mxfp4 weight re-encoded exactly as an fp8_block weight with 128x128 blocks: e4m3 data
    ``[N, K]`` and one power-of-two fp32 scale per 128x128 tile, exact wherever a tile's
    nonzero 32-element blocks' exponents span <= 14 (checked; raises otherwise). ``bs.gemm``
    of MX activations with it runs the wide FP8 kernel (plan/mx_packed.py).
    -> :func:`mxfp4_to_fp8_block` (numerics: ``reference/mx_pack.py``).

Padding: every converter writes **zero bytes** into padding (DeepGEMM padding rows, the K
padding of the last packed int32, the 128x4 tile padding). Zero is finite in every scale
encoding we emit (fp32 +0.0, E8M0 code 0 = 2**-127, e4m3 +0.0) whereas 0xFF is NaN in E8M0,
so a padded scale that a kernel multiplies into (zero-padded or out-of-bounds) data
contributes exactly 0, never NaN. It is also what DeepGEMM's torch fallback, torchao and the
GPU MODE reference write, so outputs are bit-identical to theirs.

All functions are pure torch, run on any device, never synchronise with the host (except
:func:`to_deepgemm_ue8m0` with ``check=True``, documented there), and always return new
tensors (never views of the input), so the caller owns the result.
"""

from __future__ import annotations

import sys

import torch

from ._checks import as_global_scale, check_flag, check_size, check_tensor, resolve_block, resolve_rounding
from .formats import FP8_BLOCK, Format, ScaleRounding, get_format
from .reference.mx_pack import mxfp4_to_fp8_block
from .tensor import ScaledTensor

__all__ = [
    "tma_aligned_size",
    "to_deepgemm_fp32",
    "from_deepgemm_fp32",
    "to_deepgemm_ue8m0",
    "from_deepgemm_ue8m0",
    "to_blocked",
    "from_blocked",
    "blocked_numel",
    "gpumode_view",
    "from_gpumode",
    "to_deepgemm",
    "from_deepgemm",
    "to_cublas",
    "from_cublas",
    "mxfp4_to_fp8_block",
]

#: TMA requires global strides (and so each MN-major column start) to be multiples of 16 bytes.
TMA_ALIGNMENT_BYTES = 16
#: Blocked (32_4_4) tile: 128 rows x 4 scale columns = 512 bytes (cuBLAS documentation).
BLOCK_ROWS = 128
BLOCK_COLS = 4
_TILE_BYTES = BLOCK_ROWS * BLOCK_COLS
#: One-byte scale dtypes the blocked layout moves (it only moves bytes).
_BYTE_SCALE_DTYPES = (torch.uint8, torch.float8_e4m3fn, torch.float8_e8m0fnu)
#: fp32 bit pattern of 2**-127 (a denormal), the value of E8M0 code 0.
_BITS_2POW_M127 = 0x00400000


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def tma_aligned_size(mn: int, element_size: int) -> int:
    """``mn`` rounded up so that ``mn * element_size`` is a multiple of 16 bytes (the TMA
    global-stride alignment); DeepGEMM's ``get_tma_aligned_size``. 4 for fp32/int32."""
    mn = check_size("mn", mn)
    element_size = check_size("element_size", element_size, 1)
    if TMA_ALIGNMENT_BYTES % element_size:
        raise ValueError(f"element_size: must divide {TMA_ALIGNMENT_BYTES}, got {element_size}")
    per = TMA_ALIGNMENT_BYTES // element_size
    return _cdiv(mn, per) * per


def _check_mn_k(name: str, t: torch.Tensor) -> None:
    if t.ndim not in (2, 3):
        raise ValueError(
            f"{name}: expected a 2-D [M, sk] or 3-D [E, M, sk] scale tensor, got shape {tuple(t.shape)}"
        )


def _mn_major_empty(e: int, m: int, k: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Uninitialised-data-free ``[e, m, k]`` tensor with strides ``(k * ma, 1, ma)``: padding
    rows ``m..ma`` of the storage are zero."""
    ma = tma_aligned_size(m, torch.empty((), dtype=dtype).element_size())
    store = torch.empty((e, k, ma), dtype=dtype, device=device)
    store[..., m:].zero_()
    return store.transpose(1, 2)[:, :m, :]


# --------------------------------------------------------------------------- DeepGEMM fp32
def to_deepgemm_fp32(sf: torch.Tensor) -> torch.Tensor:
    """Canonical fp32 scales -> DeepGEMM's MN-major, TMA-aligned fp32 layout (sm90).

    Args:
        sf: fp32 ``[M, sk]`` or ``[E, M, sk]`` (any strides), e.g. ``ScaledTensor.scale`` of a
            1x128 fp8_block activation (``sk = ceil(K/128)``).

    Returns:
        A new fp32 tensor of the same shape and values whose storage is column-major with
        the column stride padded to ``Ma = tma_aligned_size(M, 4)`` (a multiple of 4 floats =
        16 bytes): strides ``(1, Ma)`` for 2-D, ``(sk * Ma, 1, Ma)`` for 3-D; storage offset
        0; the padding rows ``M..Ma`` of the storage are 0.0. Equal to what DeepGEMM's
        ``get_mn_major_tma_aligned_tensor(sf)`` returns, and passes DeepGEMM's layout checks.
    """
    check_tensor("sf", sf, dtypes=(torch.float32,))
    _check_mn_k("sf", sf)
    b = sf if sf.ndim == 3 else sf.unsqueeze(0)
    e, m, k = b.shape
    out = _mn_major_empty(e, m, k, torch.float32, sf.device)
    out.copy_(b)
    return out if sf.ndim == 3 else out[0]


def from_deepgemm_fp32(sf: torch.Tensor) -> torch.Tensor:
    """DeepGEMM MN-major fp32 scales (or any strided fp32 ``[M, sk]`` / ``[E, M, sk]``) ->
    a new contiguous row-major tensor of the same shape and values (our canonical layout)."""
    check_tensor("sf", sf, dtypes=(torch.float32,))
    _check_mn_k("sf", sf)
    return torch.empty(sf.shape, dtype=torch.float32, device=sf.device).copy_(sf)


# --------------------------------------------------------------------------- DeepGEMM UE8M0
def _fp32_to_ue8m0(sf: torch.Tensor, check: bool) -> torch.Tensor:
    """fp32 power-of-two scales -> uint8 biased exponents (exact). NaN and +Inf -> 0xFF (NaN)."""
    bits = sf.view(torch.int32)
    exp = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    is_nan = (exp == 255) & (mant != 0)
    tiny = bits == _BITS_2POW_M127  # 2**-127 is a denormal in fp32, code 0 in E8M0
    if check:
        # positive, zero mantissa, exponent 1..255 (255 = +Inf) | 2**-127 | NaN (any sign)
        ok = ((bits > 0) & (mant == 0)) | tiny | is_nan
        if not bool(ok.all()):  # host sync: only with check=True (documented)
            bad = (~ok).nonzero()
            idx = tuple(bad[0].tolist())
            raise ValueError(
                f"sf: UE8M0 packing needs every scale to be a positive power of two (or NaN/+Inf); "
                f"{bad.shape[0]} of {sf.numel()} are not, e.g. sf{list(idx)} = {sf[idx].item()!r}. "
                f"Quantize fp8_block with rounding='rceil' to get power-of-two scales."
            )
    code = torch.where(tiny, 0, exp)
    code = torch.where(is_nan, 255, code)
    return code.to(torch.uint8)


def _pack_mn_major_u8x4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 ``[E, M, sk]`` -> int32 ``[E, M, ceil(sk/4)]``, MN-major TMA-aligned; code
    ``4p + j`` in byte ``j`` (least significant first) of int32 ``p``; pad bytes 0."""
    if sys.byteorder != "little":  # the int32 is assembled from its bytes in memory
        raise RuntimeError("UE8M0 packing assumes a little-endian host (as CUDA devices are)")
    e, m, k = codes.shape
    p = _cdiv(k, 4)
    ma = tma_aligned_size(m, 4)
    buf = torch.zeros((e, p, ma, 4), dtype=torch.uint8, device=codes.device)
    padded = codes
    if k != 4 * p:
        padded = torch.nn.functional.pad(codes, (0, 4 * p - k))
    buf[:, :, :m, :] = padded.view(e, m, p, 4).permute(0, 2, 1, 3)
    words = buf.view(torch.int32).squeeze(-1)  # [e, p, ma]
    return words.transpose(1, 2)[:, :m, :]


def to_deepgemm_ue8m0(sf: torch.Tensor, *, check: bool = True) -> torch.Tensor:
    """Canonical power-of-two scales -> DeepGEMM's packed UE8M0, MN-major, TMA-aligned layout
    (what its sm100 path takes; ``get_mn_major_tma_aligned_packed_ue8m0_tensor``).

    Args:
        sf: ``[M, sk]`` or ``[E, M, sk]`` (any strides), either fp32 power-of-two scales
            (fp8_block quantized with ``rounding="rceil"``) or uint8 biased E8M0 exponents
            (mxfp8 / mxfp4 scales, ``sk = ceil(K/32)``).
        check: fp32 input only: verify that every scale is a positive power of two, NaN or
            +Inf, and raise ``ValueError`` otherwise. This reads a flag back to the host (one
            synchronisation); pass ``check=False`` on hot paths / under CUDA-graph capture
            when the scales are known to be RCEIL (the ScaledTensor wrapper
            :func:`to_deepgemm` does). With ``check=False`` invalid scales are not detected:
            the fp32 exponent field is packed as is.

    Returns:
        int32 ``[M, ceil(sk/4)]`` with strides ``(1, Ma)``, or ``[E, M, ceil(sk/4)]`` with
        strides ``(ceil(sk/4) * Ma, 1, Ma)``, ``Ma = tma_aligned_size(M, 4)``. Byte ``j``
        (little-endian) of element ``[.., m, p]`` is the E8M0 code of ``sf[.., m, 4p + j]``:
        ``log2(s) + 127`` (``s = 2**-127`` gives 0; NaN and +Inf give 0xFF, E8M0's NaN, so
        +Inf does not round-trip but still dequantizes to NaN). Bytes for ``4p + j >= sk``
        and the padding rows ``M..Ma`` are 0.
    """
    check_tensor("sf", sf, dtypes=(torch.float32, torch.uint8))
    _check_mn_k("sf", sf)
    check_flag("check", check)
    codes = sf if sf.dtype == torch.uint8 else _fp32_to_ue8m0(sf, check)
    b = codes if codes.ndim == 3 else codes.unsqueeze(0)
    out = _pack_mn_major_u8x4(b)
    return out if sf.ndim == 3 else out[0]


def from_deepgemm_ue8m0(
    packed: torch.Tensor, sf_k: int, *, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """DeepGEMM packed UE8M0 scales -> canonical row-major ``[M, sf_k]`` / ``[E, M, sf_k]``.

    Args:
        packed: int32 ``[M, ceil(sf_k/4)]`` or ``[E, M, ceil(sf_k/4)]``, any strides (the
            MN-major TMA-aligned layout of :func:`to_deepgemm_ue8m0` or a contiguous one).
        sf_k: the logical number of scale columns (``ceil(K / gran_k)``); the packed tensor
            only knows it up to a multiple of 4.
        dtype: ``torch.float32`` (values ``2**(code - 127)``, code 0 -> 2**-127, 0xFF -> NaN;
            exact) or ``torch.uint8`` (the E8M0 codes, our MX scale encoding).

    Returns:
        A new contiguous tensor of ``dtype``.
    """
    check_tensor("packed", packed, dtypes=(torch.int32,))
    _check_mn_k("packed", packed)
    if dtype not in (torch.float32, torch.uint8):
        raise ValueError(f"dtype: expected torch.float32 or torch.uint8, got {dtype}")
    sf_k = check_size("sf_k", sf_k)
    if _cdiv(sf_k, 4) != packed.shape[-1]:
        raise ValueError(
            f"sf_k: packed has {packed.shape[-1]} int32 columns, which holds ceil(sf_k/4) of them, "
            f"got sf_k={sf_k}"
        )
    if sys.byteorder != "little":
        raise RuntimeError("UE8M0 unpacking assumes a little-endian host (as CUDA devices are)")
    b = packed if packed.ndim == 3 else packed.unsqueeze(0)
    e, m, p = b.shape
    words = torch.empty((e, p, m), dtype=torch.int32, device=packed.device)
    words.copy_(b.transpose(1, 2))
    codes = words.view(torch.uint8).view(e, p, m, 4).permute(0, 2, 1, 3).reshape(e, m, 4 * p)
    codes = codes[..., :sf_k]
    if dtype == torch.uint8:
        out = torch.empty((e, m, sf_k), dtype=torch.uint8, device=packed.device).copy_(codes)
    else:
        c = codes.to(torch.int32)
        out = (c << 23).view(torch.float32)  # 2**(c - 127) for c in 1..254, exact
        out = torch.where(c == 0, 2.0**-127, out)
        out = torch.where(c == 255, float("nan"), out)
    return out if packed.ndim == 3 else out[0]


# --------------------------------------------------------------------------- cuBLAS 32_4_4
def blocked_numel(rows: int, cols: int) -> int:
    """Bytes of one ``[rows, cols]`` scale matrix in the blocked layout:
    ``ceil(rows/128) * ceil(cols/4) * 512``."""
    rows, cols = check_size("rows", rows), check_size("cols", cols)
    return _cdiv(rows, BLOCK_ROWS) * _cdiv(cols, BLOCK_COLS) * _TILE_BYTES


def to_blocked(scale: torch.Tensor) -> torch.Tensor:
    """Canonical ``[..., rows, cols]`` one-byte scales -> cuBLAS/CUTLASS 32_4_4 blocked layout.

    Args:
        scale: ``[rows, cols]`` or batched ``[..., rows, cols]`` (any strides) of dtype uint8
            (E8M0 codes), float8_e8m0fnu or float8_e4m3fn (nvfp4); ``cols = ceil(K / block)``.

    Returns:
        A new contiguous tensor of the same dtype and shape ``[..., blocked_numel(rows, cols)]``
        (one flat 1-D byte array per matrix, which is what ``torch._scaled_mm`` and cuBLAS
        take): scale ``[.., r, c]`` is at offset
        ``((r//128) * ceil(cols/4) + c//4) * 512 + (r%32) * 16 + ((r%128)//32) * 4 + c%4``.
        Padding bytes (rows ``rows..`` and columns ``cols..`` of the padded matrix) are 0.
    """
    check_tensor("scale", scale, dtypes=_BYTE_SCALE_DTYPES, min_ndim=2)
    *lead, rows, cols = scale.shape
    nrt, nct = _cdiv(rows, BLOCK_ROWS), _cdiv(cols, BLOCK_COLS)
    u = scale.view(torch.uint8)
    pr, pc = nrt * BLOCK_ROWS, nct * BLOCK_COLS
    if (pr, pc) != (rows, cols):
        padded = torch.zeros((*lead, pr, pc), dtype=torch.uint8, device=scale.device)
        padded[..., :rows, :cols] = u
    else:
        padded = u
    out = torch.empty((*lead, nrt, nct, 32, 4, 4), dtype=torch.uint8, device=scale.device)
    nl = len(lead)
    L = list(range(nl))
    # padded[..., rt*128 + q*32 + r32, ct*4 + c4] viewed as [..., rt, q, r32, ct, c4]
    src = padded.reshape(*lead, nrt, 4, 32, nct, 4)
    out.copy_(src.permute(*L, nl + 0, nl + 3, nl + 2, nl + 1, nl + 4))
    return out.view(*lead, nrt * nct * _TILE_BYTES).view(scale.dtype)


def from_blocked(blocked: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """cuBLAS/CUTLASS 32_4_4 blocked scales -> canonical row-major ``[..., rows, cols]``.

    Args:
        blocked: ``[..., blocked_numel(rows, cols)]`` one-byte scales (uint8,
            float8_e8m0fnu or float8_e4m3fn), the output of :func:`to_blocked` or of a
            library that writes this layout; the last dimension must have unit stride.
        rows, cols: the logical scale shape (the padding hides it).

    Returns:
        A new contiguous ``[..., rows, cols]`` tensor of the same dtype.
    """
    check_tensor("blocked", blocked, dtypes=_BYTE_SCALE_DTYPES, min_ndim=1)
    rows, cols = check_size("rows", rows), check_size("cols", cols)
    n = blocked_numel(rows, cols)
    if blocked.shape[-1] != n:
        raise ValueError(
            f"blocked: a [{rows}, {cols}] scale matrix takes {n} bytes in the 32_4_4 layout "
            f"(ceil(rows/128)*ceil(cols/4)*512), got last dimension {blocked.shape[-1]} "
            f"(shape {tuple(blocked.shape)})"
        )
    if n and blocked.stride(-1) != 1:
        raise ValueError(f"blocked: the last dimension must have stride 1, got strides {blocked.stride()}")
    *lead, _ = blocked.shape
    nrt, nct = _cdiv(rows, BLOCK_ROWS), _cdiv(cols, BLOCK_COLS)
    nl = len(lead)
    L = list(range(nl))
    t = blocked.view(torch.uint8).view(*lead, nrt, nct, 32, 4, 4)
    # [..., rt, ct, r32, q, c4] -> [..., rt, q, r32, ct, c4] -> padded [..., rows_p, cols_p]
    padded = t.permute(*L, nl + 0, nl + 3, nl + 2, nl + 1, nl + 4).reshape(
        *lead, nrt * BLOCK_ROWS, nct * BLOCK_COLS
    )
    out = torch.empty((*lead, rows, cols), dtype=torch.uint8, device=blocked.device)
    out.copy_(padded[..., :rows, :cols])
    return out.view(blocked.dtype)


def gpumode_view(blocked: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The GPU MODE NVFP4 "permuted" 6-D view ``[32, 4, rest_m, 4, rest_k, L]`` of blocked
    scales (a view: no copy, same bytes).

    Args:
        blocked: ``[blocked_numel(rows, cols)]`` or ``[L, blocked_numel(rows, cols)]``
            contiguous (the output of :func:`to_blocked` on ``[rows, cols]`` / ``[L, rows, cols]``).
        rows, cols: the logical scale shape.

    Returns:
        ``v`` with ``v[r % 32, (r % 128) // 32, r // 128, c % 4, c // 4, l] == scale[l, r, c]``,
        ``rest_m = ceil(rows/128)``, ``rest_k = ceil(cols/4)``: exactly the tensor the GPU MODE
        reference builds by permuting a contiguous ``[L, rest_m, rest_k, 32, 4, 4]`` tensor with
        order ``(3, 4, 1, 5, 2, 0)``.
    """
    check_tensor("blocked", blocked, dtypes=_BYTE_SCALE_DTYPES)
    if blocked.ndim not in (1, 2):
        raise ValueError(f"blocked: expected [N] or [L, N], got shape {tuple(blocked.shape)}")
    n = blocked_numel(rows, cols)
    if blocked.shape[-1] != n:
        raise ValueError(
            f"blocked: a [{rows}, {cols}] scale matrix takes {n} bytes in the 32_4_4 layout, "
            f"got last dimension {blocked.shape[-1]}"
        )
    b = blocked if blocked.ndim == 2 else blocked.unsqueeze(0)
    t = b.view(b.shape[0], _cdiv(rows, BLOCK_ROWS), _cdiv(cols, BLOCK_COLS), 32, 4, 4)
    return t.permute(3, 4, 1, 5, 2, 0)


def from_gpumode(v: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """GPU MODE ``[32, 4, rest_m, 4, rest_k, L]`` permuted scales -> canonical ``[L, rows, cols]``
    (a new contiguous tensor; ``.permute(1, 2, 0)`` of it is GPU MODE's ``[m, sf_k, l]``
    reference scale tensor)."""
    check_tensor("v", v, dtypes=_BYTE_SCALE_DTYPES, ndim=6)
    rows, cols = check_size("rows", rows), check_size("cols", cols)
    want = (32, 4, _cdiv(rows, BLOCK_ROWS), 4, _cdiv(cols, BLOCK_COLS))
    if tuple(v.shape[:5]) != want:
        raise ValueError(
            f"v: expected shape {want + ('L',)} for [{rows}, {cols}] scales, got {tuple(v.shape)}"
        )
    n_l = v.shape[5]
    tiles = v.view(torch.uint8).permute(5, 2, 4, 0, 1, 3)  # [L, rest_m, rest_k, 32, 4, 4]
    flat = torch.empty((n_l, blocked_numel(rows, cols)), dtype=torch.uint8, device=v.device)
    flat.view(tiles.shape).copy_(tiles)
    return from_blocked(flat, rows, cols).view(v.dtype)


# --------------------------------------------------------------------------- ScaledTensor level
def _check_q(q) -> None:
    if not isinstance(q, ScaledTensor):
        raise TypeError(f"q: expected a ScaledTensor, got {type(q).__name__}")


def to_deepgemm(q: ScaledTensor, *, packed_ue8m0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(data, scales)`` of a ScaledTensor in the layout DeepGEMM's GEMMs take.

    * fp8_block 1x128 (activations, ``[M, K]`` or ``[E, M, K]``): data as is (e4m3,
      K-major); scales :func:`to_deepgemm_fp32` (sm90) or, with ``packed_ue8m0=True``,
      :func:`to_deepgemm_ue8m0` (sm100; needs ``rounding=RCEIL``).
    * fp8_block 128x128 (weights ``[N, K]`` / ``[E, N, K]``): sm90 takes the canonical
      contiguous fp32 ``[ceil(N/128), ceil(K/128)]`` scales as they are (returned as is);
      with ``packed_ue8m0=True`` the scales are first broadcast to one row per data row
      (what DeepGEMM does for sm100, ``gran_mn = 128`` -> 1) and packed.
    * mxfp8 / mxfp4 (only ``packed_ue8m0=True``; DeepGEMM's gran_k = 32 UE8M0 path): scales
      packed; fp4 data viewed as int8 (DeepGEMM's packed-FP4 dtype, same bytes: element
      ``2i`` in the low nibble).
    * nvfp4: not supported by DeepGEMM (e4m3 scales) -> ValueError.

    Never synchronises with the host. The data tensor is returned without a copy.
    """
    _check_q(q)
    check_flag("packed_ue8m0", packed_ue8m0)
    f = q.format
    if q.ndim not in (2, 3):
        raise ValueError(
            f"q: DeepGEMM takes 2-D [M, K] or 3-D grouped [E, M, K] operands, got shape {tuple(q.shape)}"
        )
    if f is FP8_BLOCK or f.name == "fp8_block":
        if packed_ue8m0 and q.rounding is not ScaleRounding.RCEIL:
            raise ValueError(
                f"q: packed UE8M0 scales need power-of-two scales (rounding=RCEIL), got rounding="
                f"{q.rounding.name}; quantize with rounding='rceil'"
            )
        if q.block == (1, 128):
            s = to_deepgemm_ue8m0(q.scale, check=False) if packed_ue8m0 else to_deepgemm_fp32(q.scale)
            return q.data, s
        if not packed_ue8m0:
            return q.data, q.scale
        rows = q.shape[-2]
        per_row = q.scale.repeat_interleave(128, dim=-2)[..., :rows, :]
        return q.data, to_deepgemm_ue8m0(per_row, check=False)
    if f.scale_kind == "e8m0":
        if not packed_ue8m0:
            raise ValueError(
                f"packed_ue8m0: DeepGEMM takes {f.name} (E8M0) scales only in the packed UE8M0 "
                f"layout (sm100); pass packed_ue8m0=True"
            )
        data = q.data.view(torch.int8) if f.is_fp4 else q.data
        return data, to_deepgemm_ue8m0(q.scale)
    raise ValueError(f"q: DeepGEMM has no {f.name} path (only fp8_block, mxfp8, mxfp4)")


def from_deepgemm(
    data: torch.Tensor,
    scale: torch.Tensor,
    fmt: str | Format = "fp8_block",
    *,
    block: tuple[int, int] | None = None,
    rounding: ScaleRounding | str | None = None,
) -> ScaledTensor:
    """Inverse of :func:`to_deepgemm`: a ScaledTensor from DeepGEMM-layout ``(data, scale)``.

    Args:
        data: ``[M, K]`` / ``[E, M, K]`` e4m3 (fp8_block, mxfp8) or packed fp4 bytes
            ``[.., K/2]`` as int8 or uint8 (mxfp4; K is taken as ``2 * bytes``).
        scale: fp32 (MN-major or any strides; fp8_block only) or packed UE8M0 int32.
        fmt: "fp8_block", "mxfp8" or "mxfp4".
        block: fp8_block only, ``(1, 128)`` (default) or ``(128, 128)``; for 128x128 with
            packed scales, one row in 128 of the per-row scales is kept.
        rounding: recorded in the ScaledTensor; default RCEIL for packed UE8M0 scales and
            the format default otherwise (the layout cannot tell EXACT from RCEIL).
    """
    f = get_format(fmt)
    check_tensor("data", data, min_ndim=2)
    check_tensor("scale", scale, dtypes=(torch.float32, torch.int32), device=data.device)
    if f.name == "nvfp4":
        raise ValueError("fmt: DeepGEMM has no nvfp4 path")
    if f.is_fp4:
        if data.dtype not in (torch.int8, torch.uint8):
            raise TypeError(f"data: expected int8/uint8 packed fp4, got {data.dtype}")
        data = data.view(torch.uint8)
        k = 2 * data.shape[-1]
    else:
        k = data.shape[-1]
    block = resolve_block("block", block, f)
    if rounding is not None:
        rounding = resolve_rounding("rounding", rounding, f)
    sk = f.scale_k(k)
    if scale.dtype == torch.int32:
        codes_or_fp = from_deepgemm_ue8m0(
            scale, sk, dtype=torch.float32 if f.scale_kind == "fp32" else torch.uint8
        )
        if block[0] > 1:
            codes_or_fp = codes_or_fp[..., :: block[0], :].contiguous()
        if rounding is None:
            rounding = ScaleRounding.RCEIL
        s = codes_or_fp
    else:
        if f.scale_kind != "fp32":
            raise TypeError(f"scale: {f.name} scales come from DeepGEMM as packed int32, got float32")
        s = from_deepgemm_fp32(scale)
    if rounding is None:
        rounding = f.default_rounding
    shape = (*data.shape[:-1], k)
    return ScaledTensor(data, s, f, torch.Size(shape), block, rounding)


def to_cublas(q: ScaledTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(data, scale)`` of an mxfp8 / mxfp4 / nvfp4 ScaledTensor as ``torch._scaled_mm`` and
    cuBLAS take them on Blackwell.

    data: the same bytes, viewed as float8_e4m3fn (mxfp8) or float4_e2m1fn_x2 (fp4: two codes
    per byte, element ``2i`` in the low nibble, as torch expects). scale: :func:`to_blocked`
    of the canonical scales, viewed as float8_e8m0fnu (MX) or float8_e4m3fn (nvfp4): flat
    ``[blocked_numel(rows, ceil(K/block))]`` (batched: ``[..., blocked_numel]``). nvfp4's
    global scale is not part of the layout: ``dequantize = q * sf / gs``, so pass
    ``1 / (gs_a * gs_b)`` as the GEMM's alpha. fp8_block has no 32_4_4 layout (cuBLAS takes
    its fp32 scales as listed in docs/design.md, "Measurements older than NOTES.md") -> ValueError.
    """
    _check_q(q)
    f = q.format
    if f.scale_kind == "fp32":
        raise ValueError(
            f"q: {f.name} scales are fp32 and have no 32_4_4 blocked layout; use to_deepgemm "
            f"or pass the canonical scales to torch._scaled_mm directly"
        )
    if q.ndim < 2:
        raise ValueError(f"q: expected at least 2 dimensions [rows, K], got shape {tuple(q.shape)}")
    data = q.data.view(torch.float4_e2m1fn_x2) if f.is_fp4 else q.data
    s = to_blocked(q.scale)
    if f.scale_kind == "e8m0":
        s = s.view(torch.float8_e8m0fnu)
    return data, s


def from_cublas(
    data: torch.Tensor,
    scale: torch.Tensor,
    fmt: str | Format,
    shape,
    *,
    global_scale=None,
    rounding: ScaleRounding | str | None = None,
) -> ScaledTensor:
    """Inverse of :func:`to_cublas`: a ScaledTensor from cuBLAS-layout ``(data, scale)``.

    Args:
        data: the data bytes (float8_e4m3fn for mxfp8; uint8 / int8 / float4_e2m1fn_x2 packed
            fp4 ``[..., ceil(K/2)]`` for mxfp4 / nvfp4).
        scale: blocked scales ``[..., blocked_numel(rows, ceil(K/block))]``.
        fmt: "mxfp8", "mxfp4" or "nvfp4".
        shape: the logical shape ``[..., rows, K]``.
        global_scale: nvfp4 only, the encode scale ``gs`` (fp32 tensor or float).
        rounding: recorded in the ScaledTensor (default: the format default).
    """
    f = get_format(fmt)
    if f.scale_kind == "fp32":
        raise ValueError(f"fmt: {f.name} has no 32_4_4 blocked layout")
    if not isinstance(shape, (tuple, list, torch.Size)) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise TypeError(f"shape: expected the logical shape [..., rows, K] as a tuple of ints, got {shape!r}")
    shape = torch.Size(shape)
    if len(shape) < 2:
        raise ValueError(f"shape: expected at least 2 dimensions [rows, K], got {tuple(shape)}")
    rounding = resolve_rounding("rounding", rounding, f)
    check_tensor("data", data)
    if f.is_fp4:
        if data.dtype not in (torch.uint8, torch.int8, torch.float4_e2m1fn_x2):
            raise TypeError(f"data: expected packed fp4 bytes (uint8/int8/float4_e2m1fn_x2), got {data.dtype}")
        data = data.view(torch.uint8)
    s = from_blocked(scale, shape[-2], f.scale_k(shape[-1]))
    s = s.view(torch.uint8) if f.scale_kind == "e8m0" else s.view(torch.float8_e4m3fn)
    gs = None
    if f.has_global_scale:
        if global_scale is None:
            raise ValueError(f"global_scale: {f.name} needs its fp32 global (encode) scale")
        gs = as_global_scale(global_scale, data.device)
    elif global_scale is not None:
        raise ValueError(f"global_scale: {f.name} has no global scale")
    return ScaledTensor(data, s, f, shape, f.blocks[0], rounding, global_scale=gs)
