"""Device-side check of MoE metadata (``offsets`` / ``masked_m``), launched after a grouped GEMM.

Only the @triton.jit body lives here; the launcher, the per-device error flag and
``blockscaled.check_errors`` are in :mod:`blockscaled.ops.errors`.

Every program loads the whole metadata vector (``E_POW2`` lanes; E+1 offsets or E counts, a
few hundred bytes read from L2) and decides on its own whether it is valid, so no program
waits for another. Valid metadata (the common case): each program exits after that load, one
tiny launch. Invalid metadata: program 0 records what was wrong in the int32 flag buffer
(layout in ``ops/errors.py``: a count of bad calls, then the first bad call's details, kept
until ``check_errors`` clears it), and all programs grid-stride over the output writing NaN,
so that no part of a meaningless result looks valid.

Rules (``MODE`` 1, contiguous, ``seg`` = offsets ``[E+1]``, ``LIMIT`` = rows of A):
``offsets[0] == 0``, ``offsets[i] <= offsets[i+1]``, ``offsets[E] == LIMIT``.
(``MODE`` 2, masked, ``seg`` = counts ``[E]``, ``LIMIT`` = ``max_m``): ``0 <= masked_m[e] <= LIMIT``.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: Bits of the "kinds" word (ops/errors.py turns them into words).
BAD_FIRST = 1  # offsets[0] != 0
BAD_ORDER = 2  # offsets[i+1] < offsets[i]
BAD_LAST = 4  # offsets[E] != rows of A
BAD_NEGATIVE = 8  # masked_m[e] < 0
BAD_ABOVE = 16  # masked_m[e] > max_m


# The sizes vary with every batch; specialising on them (divisible by 16, == 1) would compile
# new variants at run time, possibly inside a CUDA-graph capture whose sizes differ from the
# warm-up. The check is a few loads: nothing to gain from the specialisation.
@triton.jit(do_not_specialize=["E", "LIMIT", "ROWS_PER_E", "N", "total", "s_e", "s_m", "nprog"])
def metadata_check_kernel(
    seg_ptr, out_ptr, flag_ptr,
    E, LIMIT, ROWS_PER_E, N, total, s_e, s_m, nprog,
    OP: tl.constexpr, MODE: tl.constexpr, E_POW2: tl.constexpr, BLOCK: tl.constexpr,
):
    """Check ``seg``; when bad, record it in ``flag_ptr`` (program 0) and write NaN over ``out``.

    ``out`` is addressed as ``total = R * N`` elements, row ``r`` at
    ``(r // ROWS_PER_E) * s_e + (r % ROWS_PER_E) * s_m`` (column stride 1): contiguous
    ``[sum_m, N]`` has ``ROWS_PER_E = R`` and ``s_e = 0``, masked ``[E, max_m, N]`` has
    ``ROWS_PER_E = max_m``. ``nprog`` programs (the grid) share the output rows.
    """
    pid = tl.program_id(0)
    i = tl.arange(0, E_POW2)
    big = 2147483647
    if MODE == 1:
        n_seg = E + 1
        v = tl.load(seg_ptr + i, mask=i < n_seg, other=0)
        prev = tl.load(seg_ptr + i - 1, mask=(i >= 1) & (i < n_seg), other=0)
        bad_first = (i == 0) & (v != 0)
        bad_order = (i >= 1) & (i < n_seg) & (v < prev)
        bad_last = (i == E) & (v != LIMIT)
        kinds = (tl.max(bad_first.to(tl.int32), axis=0) * 1 + tl.max(bad_order.to(tl.int32), axis=0) * 2
                 + tl.max(bad_last.to(tl.int32), axis=0) * 4)
        bad = bad_first | bad_order | bad_last
    else:
        n_seg = E
        v = tl.load(seg_ptr + i, mask=i < n_seg, other=0)
        prev = tl.zeros([E_POW2], dtype=tl.int32)
        bad_neg = (i < n_seg) & (v < 0)
        bad_above = (i < n_seg) & (v > LIMIT)
        kinds = tl.max(bad_neg.to(tl.int32), axis=0) * 8 + tl.max(bad_above.to(tl.int32), axis=0) * 16
        bad = bad_neg | bad_above
    if kinds != 0:
        if pid == 0:
            first = tl.min(tl.where(bad, i, big), axis=0)
            at = i == first
            tl.atomic_add(flag_ptr, 1)
            # The first bad call since the last check_errors keeps its details (compare-and-swap
            # on word 1; launches on one stream are ordered, so "first" is the stream's order).
            if tl.atomic_cas(flag_ptr + 1, 0, 1) == 0:
                tl.store(flag_ptr + 2, OP)
                tl.store(flag_ptr + 3, MODE)
                tl.store(flag_ptr + 4, kinds)
                tl.store(flag_ptr + 5, first)
                tl.store(flag_ptr + 6, tl.sum(tl.where(at, v, 0), axis=0))
                tl.store(flag_ptr + 7, tl.sum(tl.where(at, prev, 0), axis=0))
                tl.store(flag_ptr + 8, LIMIT)
                tl.store(flag_ptr + 9, E)
        nan = tl.full([BLOCK], float("nan"), tl.float32).to(out_ptr.dtype.element_ty)
        lane = tl.arange(0, BLOCK).to(tl.int64)
        # int64 element indices: E * max_m * N passes 2**31 for large MoE outputs
        for start in range(pid * BLOCK, total, nprog * BLOCK):
            idx = start + lane
            r = idx // N
            c = idx - r * N
            e = r // ROWS_PER_E
            m = r - e * ROWS_PER_E
            tl.store(out_ptr + e * s_e + m * s_m + c, nan, mask=idx < total)
