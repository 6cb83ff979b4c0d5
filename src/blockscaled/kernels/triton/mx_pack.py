"""MX activations re-encoded for the wide kernel's FP8 path (the twin: ``reference/mx_pack.py``,
whose docstring has the numerics): e4m3 data, fp32 scales per 32 K with one scale per uniform
(row, 128-K) group, and a per-row flag for rows that keep per-32 scales somewhere."""

import triton
import triton.language as tl

# the quantizer's e2m1 decode: from the bits, so -0 keeps its sign (Triton's unary minus does not);
# its block amax and tile quantization, so the fused kernel's codes and scales are the quantizer's
from .quantize import FMT_MXFP4, _block_amax, _e2m1_decode, _quantize_tile

__all__ = ["mx_encode_kernel", "mx_quantize_encode_kernel"]


@triton.jit
def _pow2_f32(e):
    """2.0 ** e for int32 ``e`` (exact, from the bits: fp32 subnormals for e in [-149, -127], 0
    below). Not exp2: ex2.approx flushes subnormals (E8M0 0 is 2^-127)."""
    normal = (tl.maximum(e + 127, 0) << 23).to(tl.int32)
    sub = tl.where(e >= -149, (1 << tl.maximum(e + 149, 0)).to(tl.int32), 0)
    return tl.where(e >= -126, normal, sub).to(tl.float32, bitcast=True)


@triton.jit
def _encode_group(sc, nz, d_ptr, o_ptr, r64, rm, blk, K, NBLK, stride_dm, stride_om, v_lo, v_hi, v,
                  FP4: tl.constexpr, LIMIT: tl.constexpr, HEAD: tl.constexpr, BLOCK_R: tl.constexpr):
    """One 128-K group of BLOCK_R rows: the blocks' E8M0 exponents ``sc [R, 4]`` (int32), which
    blocks hold a nonzero value ``nz [R, 4]``, their values (FP4: ``v_lo`` / ``v_hi [R, 4, 16]``, the
    even / odd elements; else ``v [R, 4, 32]``) -> the e4m3 data and fp32 scales stored; returns
    whether the group is uniform per row ``[R]``."""
    e = tl.arange(0, 32)
    nan = sc == 255
    hi = tl.max(tl.where(nz | nan, tl.where(nan, 10000, sc), -1), axis=1)
    lo = tl.min(tl.where(nz, sc, 10000), axis=1)
    empty = hi < 0
    uni = empty | ((hi - lo) <= LIMIT)
    ref = tl.where(empty, 127, hi - HEAD)
    mul = _pow2_f32(tl.where(uni[:, None] & nz, sc - ref[:, None], 0))[:, :, None]
    col = blk[None, :, None] * 32 + e[None, None, :]
    if FP4:
        d = tl.reshape(tl.join((v_lo * mul).to(tl.float8e4nv), (v_hi * mul).to(tl.float8e4nv)),
                       [BLOCK_R, 4, 32])
    else:
        d = (v * mul).to(tl.float8e4nv)
    tl.store(d_ptr + r64[:, None, None] * stride_dm + col, d, mask=rm[:, None, None] & (col < K))
    own = tl.where(nan, tl.full([BLOCK_R, 4], 0x7FC00000, tl.int32).to(tl.float32, bitcast=True),
                   _pow2_f32(sc - 127))
    so = tl.where(uni[:, None], _pow2_f32(ref - 127)[:, None], own)
    so = tl.where(blk[None, :] < NBLK, so, 0.0)
    tl.store(o_ptr + r64[:, None] * stride_om + blk[None, :], so, mask=rm[:, None])
    return uni


@triton.jit
def _program_rows(M, K, BLOCK_R: tl.constexpr, GROUPS: tl.constexpr):
    """The encoders' program: (rows, their mask, as int64, block index in a 128-K group [4],
    element index in a block [32], first and end 128-K group of this K chunk)."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    return (r, r < M, r.to(tl.int64), tl.arange(0, 4), tl.arange(0, 32), pid_k * GROUPS,
            tl.minimum((pid_k + 1) * GROUPS, tl.cdiv(K, 128)))


@triton.jit
def mx_encode_kernel(a_ptr, s_ptr, d_ptr, o_ptr, f_ptr, M, K, NBLK, stride_am, stride_sm, stride_dm, stride_om,
                     FP4: tl.constexpr, LIMIT: tl.constexpr, HEAD: tl.constexpr, BLOCK_R: tl.constexpr,
                     GROUPS: tl.constexpr):
    """Rows [pid * BLOCK_R, ...): for each 128-K group, the four 32-element blocks' values ``v`` and
    E8M0 exponents; uniform (nonzero blocks spanning <= LIMIT, no NaN scale, or no nonzero block):
    data ``v * 2^(s - r)`` with ``r = max(s) - HEAD`` (127 for an empty group) and the scale
    ``2^(r - 127)`` for all four blocks; else ``v`` and the blocks' own ``2^(s - 127)`` (NaN for
    255), and the row's flag set. Blocks past NBLK (= ceil(K/32)) get scale 0.
    ``a_ptr``: packed e2m1 bytes (FP4) or e4m3 [M, K or K/2]; ``s_ptr``: uint8 [M, NBLK];
    ``d_ptr``: e4m3 [M, K]; ``o_ptr``: fp32 [M, 4 * ceil(K/128)]; ``f_ptr``: int32 [M], zeros on
    entry (a flagged row's programs raise it to 1 with an atomic max).
    Grid (row blocks, K chunks of GROUPS groups): one program walking all of K moved ~1 KB per
    step with ~4 programs per SM, latency-bound at 6-8x the copy time (H200: 372 us for 8192 x
    14336 mxfp4, ~48 us of bytes); the K chunks give every SM many independent programs."""
    r, rm, r64, j, e, g_lo, g_hi = _program_rows(M, K, BLOCK_R, GROUPS)
    flag = tl.zeros([BLOCK_R], dtype=tl.int32)
    for g in range(g_lo, g_hi):
        blk = g * 4 + j
        bmask = rm[:, None] & (blk[None, :] < NBLK)
        sc = tl.load(s_ptr + r64[:, None] * stride_sm + blk[None, :], mask=bmask, other=0).to(tl.int32)
        if FP4:
            # each byte once ([R, 4, 16]): low nibble = element 2i, high = 2i + 1
            h = tl.arange(0, 16)
            bcol = blk[None, :, None] * 16 + h[None, None, :]
            byte = tl.load(a_ptr + r64[:, None, None] * stride_am + bcol,
                           mask=rm[:, None, None] & (bcol * 2 < K), other=0).to(tl.int32)
            v_lo = _e2m1_decode(byte & 15)
            # (odd K: the last byte's high nibble is padding, whatever a checkpoint left there)
            v_hi = tl.where(bcol * 2 + 1 < K, _e2m1_decode(byte >> 4), 0.0)
            nz = tl.max(((v_lo != 0) | (v_hi != 0)).to(tl.int32), axis=2) > 0  # [R, 4]
            v = 0.0  # (unused: the FP4 branch of _encode_group)
        else:
            col = blk[None, :, None] * 32 + e[None, None, :]  # [1, 4, 32]
            v = tl.load(a_ptr + r64[:, None, None] * stride_am + col, mask=rm[:, None, None] & (col < K),
                        other=0.0).to(tl.float32)
            nz = tl.max((v != 0).to(tl.int32), axis=2) > 0
            v_lo = 0.0  # (unused)
            v_hi = 0.0
        uni = _encode_group(sc, nz, d_ptr, o_ptr, r64, rm, blk, K, NBLK, stride_dm, stride_om, v_lo, v_hi, v, FP4,
                            LIMIT, HEAD, BLOCK_R)
        flag = tl.maximum(flag, tl.where(uni, 0, 1))
    tl.atomic_max(f_ptr + r, flag, mask=rm & (flag > 0))


@triton.jit
def mx_quantize_encode_kernel(x_ptr, d_ptr, o_ptr, f_ptr, M, K, NBLK, stride_xm, stride_dm, stride_om,
                              ROUND: tl.constexpr, LIMIT: tl.constexpr, HEAD: tl.constexpr, BLOCK_R: tl.constexpr,
                              GROUPS: tl.constexpr, GPU: tl.constexpr, HW_CVT: tl.constexpr):
    """bf16 / fp16 / fp32 activations ``x [M, K]`` -> what ``mx_encode_kernel`` makes of their mxfp4
    quantization, in one pass: per 128-K group the four 1 x 32 blocks are quantized exactly as the
    quantizer's kernel does (``_block_amax``, ``_quantize_tile`` with rounding ROUND: the same
    codes and E8M0 scales), their e2m1 values decoded, then encoded by ``_encode_group``. Outputs
    and grid as ``mx_encode_kernel`` (``f_ptr`` zeros on entry); elements past K are zeros, as the
    quantizer's padding."""
    r, rm, r64, j, e, g_lo, g_hi = _program_rows(M, K, BLOCK_R, GROUPS)
    flag = tl.zeros([BLOCK_R], dtype=tl.int32)
    for g in range(g_lo, g_hi):
        blk = g * 4 + j
        col = blk[None, :, None] * 32 + e[None, None, :]  # [1, 4, 32]
        xf = tl.load(x_ptr + r64[:, None, None] * stride_xm + col, mask=rm[:, None, None] & (col < K),
                     other=0.0).to(tl.float32)
        codes, b = _quantize_tile(xf, _block_amax(xf, 2), 0.0, FMT_MXFP4, ROUND, HW_CVT, GPU)
        # the values in natural K order, the layout they were loaded in (no even / odd split as
        # the packed bytes need: every reshape of this tile would be a layout conversion)
        v = _e2m1_decode(codes & 15)
        nz = tl.max((v != 0).to(tl.int32), axis=2) > 0  # [R, 4]
        uni = _encode_group(b.to(tl.int32), nz, d_ptr, o_ptr, r64, rm, blk, K, NBLK, stride_dm, stride_om, 0.0, 0.0,
                            v, False, LIMIT, HEAD, BLOCK_R)
        flag = tl.maximum(flag, tl.where(uni, 0, 1))
    tl.atomic_max(f_ptr + r, flag, mask=rm & (flag > 0))
