"""Quantize / dequantize plans: the 1 x block_k kernels' tiles (and the 128x128 path)."""

from __future__ import annotations

from .device import DeviceInfo
from .splits import cdiv as _cdiv
from .types import Plan, Problem

__all__ = ["tile_1xk", "plan_quantize", "TILE_ELEMS", "TILE_ELEMS_FP4", "MAX_TILE_K"]

#: Elements per program of the 1 x BK kernels: 4096 = 8 KB of bf16 read per program, i.e.
#: 128 threads (4 warps) x 2 x 16-byte loads in flight each, and for 16384 x 7168 about
#: 28.7k programs (>200 per SM on 132 SMs), so tail effects are negligible. Tiles span at
#: most 1024 columns so that K = 7168 splits into whole tiles (7 x 1024) with no waste.
#: fp4 formats use 8192 (64 elements per thread): their per-program and per-block work (tile
#: addressing, scale math, the packed-store shuffle, nvfp4's read of the amax partials) is
#: a larger share, and halving the programs cuts it from ~6 to ~4 SASS instructions per element
#: (sm_90, ROWS 4 -> 8 at 1024 columns). Small inputs shrink the tile (down to one row) until
#: there are 2 programs per SM.
TILE_ELEMS = 4096
TILE_ELEMS_FP4 = 8192
MAX_TILE_K = 1024


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def tile_1xk(m: int, k: int, bk: int, elems: int = TILE_ELEMS, min_programs: int = 1) -> tuple[int, int]:
    """(ROWS, GROUPS) for a 1 x bk kernel on ``[m, k]``: ``elems`` per tile, fewer rows while
    there are fewer than ``min_programs`` tiles."""
    groups = min(MAX_TILE_K // bk, _pow2(_cdiv(k, bk)))
    rows = max(1, min(_pow2(m), elems // (groups * bk)))
    while rows > 1 and _cdiv(m, rows) * _cdiv(k, groups * bk) < min_programs:
        rows //= 2
    return rows, groups


def plan_quantize(p: Problem, dev: DeviceInfo, block: tuple[int, int], bk: int, fp4: bool) -> Plan:
    """The plan of ``quantize`` / ``dequantize`` of ``[p.m, p.k]`` with ``block`` scale blocks."""
    if dev.kind == "cpu" and not p.interpret:
        return Plan(p.op, "reference", None, p, reasons=("CPU tensors without TRITON_INTERPRET=1: the torch "
                                                         "reference twin (bitwise the kernel's result)",))
    backend = "cuda" if dev.kind == "cuda" else "interpreter"
    if block[0] != 1:
        return Plan(p.op, backend, None, p, reasons=(
            f"{block[0]}x{block[1]} blocks: one program per scale block (amax, then scale and cast)",))
    sms = dev.sm_count if dev.kind == "cuda" else 4
    rows, groups = tile_1xk(p.m, p.k, bk, TILE_ELEMS_FP4 if fp4 else TILE_ELEMS, 2 * sms)
    programs = _cdiv(p.m, rows) * _cdiv(p.k, groups * bk)
    return Plan(p.op, backend, None, p, reasons=(
        f"1x{bk} kernel: {rows} rows x {groups} scale blocks per program, {programs} programs "
        f"(>= 2 per SM where the input allows); memory-bound: reads the input once",))
