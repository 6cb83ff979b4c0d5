"""Where the MX / NV decode GEMV runs (kernels/triton/mx_gemv.py) and with which tiles.

At decode sizes (M <= 8 activation rows) a dense GEMM with mxfp8 / mxfp4 / nvfp4 weights is a
stream of the packed weights: the floor is their bytes (and scales) at the copy bandwidth, 1.5 us
for mxfp4 2880x2880. The portable tensor-core kernel reached 2-20 % of it on the H100 (tiny K
chunks, K split), so the planner sends these calls to the CUDA-core GEMV instead, for both modes
(weight-only bf16 / fp16 activations and W x A with quantized activations).

The tiles follow the fp8_block GEMV's measurements (kernels/triton/gemv.py docstring;
benchmarks/NOTES.md 2026-11-22, "Decode GEMV"): decode speed is set by how many bytes each SM
keeps in flight, best with many short programs that each load their whole chunk (8-16 KB) at
once. Here one thread owns one slice (``config.gemm.gemv_slice_elems``: 32 / 16 / 8 K
elements) of each of the program's rows, so a chunk is ``32 * warps`` slices x ``block_n`` rows.

NOT MEASURED YET: the M threshold and every constant below are first guesses from that reasoning;
``scripts/sweeps/mx_decode.py`` times the GEMV under a grid of its tiles against the portable
kernel and cuBLAS bf16 on the H100 to set them.
"""

from __future__ import annotations

from .._experimental import mx_kernel_enabled
from ..config.gemm import GEMV_MAX_M, GemmConfig, gemv_slice_elems
from .device import DeviceInfo
from .splits import cdiv
from .types import Problem

__all__ = ["MX_GEMV_FORMATS", "MX_GEMV_MAX_M", "MX_GEMV_ROWS", "MX_GEMV_ROWS_BY_RELEASE", "MX_GEMV_CHUNK_BYTES",
           "MX_GEMV_MAX_WARPS", "MX_GEMV_MAX_ROWS",
           "MX_GEMV_MAX_ROWS_AT_8", "MX_GEMV_MIN_PROGRAMS_PER_SM", "MX_GEMV_ODD_K_ROWS", "MX_GEMV_TRITON", "use_mx_gemv",
           "mx_gemv_config", "MX_GEMV_GLUON_TRITON", "MX_GEMV_GLUON_MAX_BYTES", "MX_GEMV_GLUON_WARPS_PER_SM",
           "MX_GEMV_GLUON_WARPS", "MX_GEMV_GLUON_ROWS", "gluon_gemv_reason", "gluon_gemv_config",
           "gluon_gemv_forced_error"]

MX_GEMV_FORMATS = ("mxfp8", "mxfp4", "nvfp4")
#: Most activation rows the GEMV kernel takes (block_m; a forced config may use all of them). Each row costs one fp32
#: FMA per weight element on the CUDA cores; AOT sm_90 SASS of the K loop with the planner's
#: tiles (tests/test_aot_mx_gemv.py), instructions per weight byte: mxfp4 / nvfp4 10-11 at M = 1
#: (decode ~5.8, FMAs 2), 13-14 at 2, 19-23 at 4, 39-54 at 8; mxfp8 3.8 / 5.3 / 8.4 / 18-21;
#: the H100 issues ~10 per byte of a 3 TB/s stream (132 SMs x 128 lanes x ~1.75 GHz), so fp4 is
#: at best ~100 / 75 / 50 / 20-25 % of the floor at M = 1 / 2 / 4 / 8 (mxfp8 near it up to 4),
#: vs the 2-20 % the portable kernel reached.
MX_GEMV_MAX_M = GEMV_MAX_M
#: Most activation rows the *planner* sends to the GEMV, per format. Measured (H200, one run of
#: scripts/sweeps/mx_decode.py, 7 shapes, weight-only and W x A, GEMV vs the portable plan,
#: geomean (worst)): mxfp8 M=1 1.40-1.93x, M=2 1.21-1.68x (1.12), M=4 0.97-1.11x (0.84);
#: mxfp4 M=2 1.50-2.77x (1.34), M=4 1.08-1.84x (0.91); nvfp4 M=1 1.69-1.72x, M=2 0.96-1.06x
#: (0.67), M=8 0.42-0.60x everywhere. The instruction count above says why: the CUDA cores'
#: FMAs per weight byte grow with M while the portable kernel's tensor cores do not care, and
#: nvfp4's e4m3 scale decode adds to every row. So: the largest M whose worst row still wins.
_MX_GEMV_ROWS_36 = {"mxfp8": 2, "mxfp4": 2, "nvfp4": 1}
#: The same on triton 3.7 and 3.8, whose builds of the kernel differ (MX_GEMV_TRITON's comment below:
#: shared memory in the K loop, spills at fp4). Measured there (H200, one process per format and mode,
#: CUDA graphs, inputs rotated past L2, every output checked against float64:
#: benchmarks/results/h200/archive/m1-triton38-20261130.json; 3.8.0: 2880^2 .. 8192^2, 4096 x 14336, then 8
#: held-out shapes 1024 x 8192 .. 28672 x 8192; 3.7.1: 7 shapes): mxfp8 at M = 1 against the plan that ran
#: without it (portable / streaming kernel) 1.03-1.45x weight-only on 3.8 (11 of 11 rows), 1.33-1.76x on 3.7,
#: W x A 1.26-2.2x on 3.8 (10 of 10), 1.40-2.26x on 3.7; at M = 2 0.77x (3.8). mxfp4 / nvfp4 weight-only
#: 0.60-0.93x the register-streaming kernel (plan/direct.py takes M = 1 there) except on the smallest weights
#: (1024 x 8192: 1.36-1.41x, 2880^2 mxfp4 1.10-1.13x, nvfp4 0.89x); W x A 1.09-1.25x up to 4096^2 and
#: 0.74-0.80x from 8192^2: no row count wins on every shape, so none (the weights' size alone does not
#: separate them: 2880^2 and 1024 x 8192 are both ~4 MB of nvfp4).
_MX_GEMV_ROWS_38 = {"mxfp8": 1, "mxfp4": 0, "nvfp4": 0}
#: Weight bytes one program loads per chunk (block_n rows x block_k elements). NOT MEASURED YET:
#: the fp8_block GEMV's sweep chose 8-16 KB (32 KB lost: registers, activation re-reads).
MX_GEMV_CHUNK_BYTES = 16 * 1024
#: Most warps per program (one slice per thread per chunk). NOT MEASURED YET: at 8 warps a
#: program of 8 mxfp4 rows (161 registers per thread) leaves one program per SM, whose math
#: then waits for its loads; 4 warps fit 3.
MX_GEMV_MAX_WARPS = 4
#: Most weight rows per program: the kernel keeps a slice of each in every thread's registers
#: (16 rows of 32-element fp4 slices spilled in the sm_90 AOT build); 4 with 8 activation rows
#: (8 x 8 took all 255 registers and spilled 52-232 bytes).
MX_GEMV_MAX_ROWS = 8
MX_GEMV_MAX_ROWS_AT_8 = 4
#: Fewest programs per SM before a program takes more rows ("many short programs"). NOT MEASURED YET.
MX_GEMV_MIN_PROGRAMS_PER_SM = 2
#: Most weight rows per program where K % 32 != 0: the kernel then masks every element (byte loads,
#: a predicate per byte), and 4-8 rows spilled 12-3040 bytes in the sm_90 AOT build (2 rows: none,
#: 8 bytes for mxfp4 W x A at 2 activation rows).
MX_GEMV_ODD_K_ROWS = 2


#: whether the planner uses the GEMV at all (blockscaled._experimental: on unless
#: ``BLOCKSCALED_MX_KERNELS`` leaves ``gemv`` out); tests patch it
MX_GEMV_ENABLED = mx_kernel_enabled("gemv")


#: Triton releases the GEMV runs on. 3.6: its sm_90 build keeps the register layout (one thread's
#: slices in registers, no shared memory in the K loop, no spills: tests/test_aot_mx_gemv.py).
#: 3.8 routes the slices through shared memory (STS/LDS/BAR in the K loop) and spills 8-672 bytes
#: of the fp4 builds at M = 1-2 (benchmarks/NOTES.md, thirteenth and fortieth sessions): its layout
#: assignment spreads a warp over 8 weight rows x 4 slices and the dense activations over 4 threads per
#: slice, where 3.6 puts all 32 threads across slices and the rows in registers. The GPU confirmed it
#: (fp4 slower than the alternatives); its mxfp8 build still wins at one row, so 3.8 keeps that row
#: (``_MX_GEMV_ROWS_38``); 3.7 measured the same (and builds mxfp8 without spills).
MX_GEMV_TRITON = ((3, 6), (3, 7), (3, 8))
#: the rows per format on each release of MX_GEMV_TRITON (0: the GEMV does not take the format)
MX_GEMV_ROWS_BY_RELEASE = {(3, 6): _MX_GEMV_ROWS_36, (3, 7): _MX_GEMV_ROWS_38, (3, 8): _MX_GEMV_ROWS_38}


def _triton_release() -> tuple[int, int]:
    import re

    import triton

    m = re.match(r"(\d+)\.(\d+)", triton.__version__)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


_TRITON_OK = _triton_release() in MX_GEMV_TRITON
#: the rows of this process's release (3.6's table elsewhere: the GEMV is then off by _TRITON_OK unless forced)
MX_GEMV_ROWS = MX_GEMV_ROWS_BY_RELEASE.get(_triton_release(), _MX_GEMV_ROWS_36)


def use_mx_gemv(fmt: str, m: int, k: int) -> bool:
    """The planner's rule: the GEMV switched on (MX_GEMV_ENABLED) on a Triton release of
    MX_GEMV_TRITON, MX / NV weights, 1 <= M <= MX_GEMV_ROWS[fmt] (this release's rows), K > 0 (CUDA only; the caller
    checks the device)."""
    return (MX_GEMV_ENABLED and _TRITON_OK and fmt in MX_GEMV_FORMATS and 1 <= m <= MX_GEMV_ROWS.get(fmt, 0)
            and k > 0)


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def mx_gemv_config(fmt: str, m: int, n: int, k: int, dev: DeviceInfo) -> GemmConfig:
    """The GEMV's tiles for ``[m, k] @ [n, k].T`` with ``fmt`` weights on ``dev``:

    * block_m: M rounded up to a power of two (<= MX_GEMV_MAX_M; larger M runs more row programs);
    * block_k: one slice per thread, as many threads as the row has slices (power of two, 1 to
      MX_GEMV_MAX_WARPS warps), so short K loads the whole row at once and long K walks it in
      chunks of ``32 * MX_GEMV_MAX_WARPS`` slices;
    * block_n: the most rows (power of two <= MX_GEMV_MAX_ROWS, MX_GEMV_MAX_ROWS_AT_8 at 8
      activation rows, MX_GEMV_ODD_K_ROWS where K % 32 != 0) whose chunk fits MX_GEMV_CHUNK_BYTES while the launch keeps >=
      MX_GEMV_MIN_PROGRAMS_PER_SM programs per SM.
    """
    bm = min(MX_GEMV_MAX_M, _pow2_at_least(max(1, m)))
    eps = gemv_slice_elems(bm)
    elem_bytes = 1.0 if fmt == "mxfp8" else 0.5
    slices = max(1, cdiv(k, eps))
    g = min(max(_pow2_at_least(slices), 32), 32 * MX_GEMV_MAX_WARPS)
    block_k = g * eps
    row_bytes = min(k, block_k) * elem_bytes  # bytes of one row in one chunk
    bn = 1
    max_rows = MX_GEMV_MAX_ROWS if bm < 8 else MX_GEMV_MAX_ROWS_AT_8
    if k % 32:
        max_rows = min(max_rows, MX_GEMV_ODD_K_ROWS)
    while (2 * bn <= max_rows and 2 * bn * row_bytes <= MX_GEMV_CHUNK_BYTES
           and cdiv(n, 2 * bn) >= MX_GEMV_MIN_PROGRAMS_PER_SM * dev.sm_count):
        bn *= 2
    return GemmConfig(block_m=bm, block_n=bn, block_k=block_k, num_warps=g // 32, num_stages=1, strategy="gemv")


# ----------------------------------------------------------------------------- the Gluon build (fp4, M = 1)
#: Triton releases on which the planner runs fp4 at one row on the GEMV with explicit layouts
#: (kernels/hopper/mx_gemv_gluon.py): those whose Triton GEMV fp4 build is off (MX_GEMV_ROWS_BY_RELEASE).
#: On 3.6 the Triton build stays: it measured 1.02-1.28x the Gluon one on the same tiles (H200, 7 shapes x
#: mxfp4 / nvfp4 at M = 1, benchmarks/results/h200/archive/gemv-gluon-20261130.json).
MX_GEMV_GLUON_TRITON = ((3, 7), (3, 8))
_GLUON_TRITON_OK = _triton_release() in MX_GEMV_GLUON_TRITON
#: Most weight bytes (packed e2m1, N x K / 2) the Gluon GEMV takes at M = 1; above, the register-streaming
#: kernel (plan/direct.py). Both are issue-bound at ~10-11 SASS per weight byte on large weights (the same
#: time within -8 .. +7 %); on small ones the GEMV's fixed cost is lower (one launch, no K split or partial
#: reduction: 3.0 us on 1536^2 where the kernel takes 7.0). Measured (H200, triton 3.8.0, same process, CUDA
#: graphs, inputs rotated past L2, every output checked against float64; gemv-gluon-20261130.json, 12 shapes x
#: mxfp4 / nvfp4, the best Gluon tiles over the register-streaming kernel): 1.2-8.4 MB 1.12-2.29x (14 of 14
#: rows), 16.5 MB 0.93-0.96x, 29-117 MB 0.92-1.07x. The threshold sits between 8.4 and 16.5 MB.
MX_GEMV_GLUON_MAX_BYTES = 12 << 20
#: Fewest warps per SM the tile choice keeps in flight (``gluon_gemv_config``): below it a program's chain of
#: dependent chunk loads sets the time, above it the K padding of the last chunk does. Chosen on two tile
#: grids of gemv-gluon-20261130.json (H200, <= 12 MB shapes x mxfp4 / nvfp4; triton 3.8.0: block_n 8 / 4 / 2 x
#: 4 / 2 / 1 warps on 7 shapes, 3.7.1: 4 / 2 / 1 warps on 7 shapes), with MX_GEMV_GLUON_ROWS and
#: MX_GEMV_GLUON_WARPS below: 8 (or 10) puts the rule's tiles within 5 % of the grid's best on 21 of 24 timed
#: rows, geomean 1.014x, worst 1.06x, and >= 1.12x the register-streaming kernel on every one; 6 the same
#: geomean, 21 of 22. The first rule (8 rows, 4 / 2 warps) measured 1.085x geomean, worst 1.43x, and lost to
#: the register-streaming kernel on gpt-oss's 5760 x 2880 on 3.7 (0.83-0.95x).
MX_GEMV_GLUON_WARPS_PER_SM = 8
#: warps per program the tile choice picks from (one warp: a chunk of 1024 K, the least padding at K = 2880)
MX_GEMV_GLUON_WARPS = (4, 2, 1)
#: weight rows per program it picks from: 8 rows tied or lost to 4 wherever both kept the warps in flight
#: (3.7.1: 3584^2 6.0 vs 5.4 us, 7168 x 2048 6.1 vs 5.4; 3.8.0: 7168 x 2048 7.1 vs 6.5)
MX_GEMV_GLUON_ROWS = (4, 2)


def gluon_gemv_reason(p: Problem, dev: DeviceInfo, gluon_ok: bool) -> str | None:
    """None when the planner runs ``p`` on the Gluon GEMV, else why not (plain words)."""
    if p.fmt not in ("mxfp4", "nvfp4"):
        return f"{p.fmt} weights (the Gluon GEMV takes mxfp4 / nvfp4)"
    if not dev.is_hopper or not gluon_ok or not _GLUON_TRITON_OK:
        return ("not an sm_90 device on a triton release of MX_GEMV_GLUON_TRITON (3.7 / 3.8: where the Triton "
                "GEMV's fp4 build is off) whose Gluon kernels build")
    if not MX_GEMV_ENABLED:
        return "switched off (BLOCKSCALED_MX_KERNELS without 'gemv')"
    if p.op != "gemm" or p.grouping != "dense" or p.m != 1:
        return "not a dense GEMM of one activation row"
    if use_mx_gemv(p.fmt, 1, p.k):
        return "the Triton GEMV takes the row on this release (MX_GEMV_ROWS)"
    if p.a not in ("bfloat16", "float16"):
        return f"{p.a} activations (it takes bf16 / fp16, weight-only)"
    if p.k % 32 or p.k <= 0 or not p.tma:
        return f"K = {p.k} not a positive multiple of 32 with 16-byte aligned weight rows"
    nbytes = p.n * p.k // 2
    if nbytes > MX_GEMV_GLUON_MAX_BYTES:
        return (f"{nbytes / 2**20:.1f} MB of weights > {MX_GEMV_GLUON_MAX_BYTES >> 20} MB: issue-bound, where the "
                f"register-streaming kernel is as fast (MX_GEMV_GLUON_MAX_BYTES)")
    return None


def gluon_gemv_forced_error(p: Problem, dev: DeviceInfo, gluon_ok: bool) -> str | None:
    """Why a forced ``GemmConfig(gluon=True)`` cannot run ``p`` (naming the argument), or None. The planner
    checks it once per call it plans (plan/gemm.py); the launcher checks only the operands' strides."""
    if p.fmt not in ("mxfp4", "nvfp4"):
        return f"config.gluon: the Gluon GEMV takes mxfp4 / nvfp4 weights, got {p.fmt}"
    if p.a not in ("bfloat16", "float16"):
        return f"config.gluon: the Gluon GEMV takes bf16 / fp16 activations (weight-only), got {p.a} activations"
    if p.k % 32 or p.k <= 0:
        return f"config.gluon: the Gluon GEMV needs K a positive multiple of 32, got K={p.k}"
    if not dev.is_hopper:
        return f"config.gluon: the Gluon GEMV is an sm_90 (Hopper) kernel, got a {dev.kind} device ({dev.name})"
    if not gluon_ok:
        return "config.gluon: the Gluon kernels do not build with this triton"
    return None


def gluon_gemv_config(p: Problem, dev: DeviceInfo) -> GemmConfig:
    """The Gluon GEMV's tiles for one activation row: block_n of MX_GEMV_GLUON_ROWS weight rows (at most
    the Triton GEMV's rows, ``mx_gemv_config``) and MX_GEMV_GLUON_WARPS warps (a chunk of 1024 x warps K
    elements). Among the tiles that keep >= MX_GEMV_GLUON_WARPS_PER_SM warps per SM in flight, the least K
    padding (the last chunk's idle slices still issue their instructions: 7168 x 2048 mxfp4 ran 9.8 us on
    4096-K chunks, 6.5-7.1 on 2048), then the most rows, then the most warps; none keeping them: the most
    rows, 4 warps."""
    top = mx_gemv_config(p.fmt, 1, p.n, p.k, dev).block_n
    rows = [b for b in MX_GEMV_GLUON_ROWS if b <= top] or [top]
    best = None
    for bn in rows:
        for warps in MX_GEMV_GLUON_WARPS:
            if cdiv(p.n, bn) * warps < MX_GEMV_GLUON_WARPS_PER_SM * dev.sm_count:
                continue
            chunk = 1024 * warps
            key = (cdiv(p.k, chunk) * chunk, -bn, -warps)
            if best is None or key < best[0]:
                best = (key, bn, warps)
    bn, warps = (best[1], best[2]) if best else (rows[0], 4)
    return GemmConfig(block_m=1, block_n=bn, block_k=1024 * warps, num_warps=warps, num_stages=1, strategy="gemv",
                      gluon=True)
