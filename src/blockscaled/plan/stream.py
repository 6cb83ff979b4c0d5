"""Where the sm_90a weight-streaming kernel (kernels/hopper/stream.py) runs, and its K split.

The kernel: mxfp4 / nvfp4 / mxfp8 weights x bf16 activations (weight-only; quantized activations
of the same format are decoded exactly in the kernel's gather or by one pass first:
``STREAM_GATHER_MAX_MP``), M <= 64, on Hopper, with a bias in
the dense form; the quantized weights arrive by TMA and are decoded in registers straight into
the wgmma's register operand (64 weight rows per program, 128 K per step). It takes the calls the
decode GEMV leaves (plan/mx_gemv.py: mx M <= 2, nvfp4 M = 1 stay there); mxfp8 only where it
measured faster than the portable tiles (``STREAM_FP8_*``).

Measured (H200, one run per row, CUDA-graph replays, inputs rotated past L2, every output checked
against float64: benchmarks/results/h200/archive/fp4-stream-ab-20261127.json, from an A/B script
the session kept out of the tree; ``scripts/sweeps/ab.py --weight-only --variants
plan,stream@split_k=N,...`` times the same variants; 6 shapes from
gpt-oss, Llama 3 8B / 70B and DeepSeek x M 2..64 x both formats, 72 rows): against the plan that
ran before (portable kernel) 1.3-3.5x at M >= 4 on every row, nvfp4 M = 2 1.35-2.85x; against
cuBLAS bf16 on the dequantized weights 1.1-1.65x on the 8-117 MB weights at M <= 16, 0.8-0.9x
on 2-8 MB weights (a ~10 us per-call floor: prologue, a few dependent 128-K steps per program,
the split-K reduction) and 0.4-0.7x at M = 64.

The K split (``stream_split``): programs are (64-row tiles) x (splits); a split adds programs (bytes
in flight) and costs a fp32 partial [64, MP] written and summed per split. From a model of what the
rows showed: the split is the largest (any integer <= ``STREAM_MAX_SPLIT``) whose programs stay
within ``STREAM_PROGRAMS_PER_SM`` per SM and within what the SMs hold at once
(``stream_resident``: registers and shared memory per program, e.g. 5 per SM at 16 rows, 3 at
64), and whose splits average at least ``STREAM_MIN_CHUNKS`` 128-K steps. Past the resident count a
second partial round of programs costs as much as the first (H200, 8192 x 8192 at M = 64: 384
programs 50.0 us, 512 programs 75.6 us, 256 programs 55.2 us). History: the first rule (powers
of two, the smallest reaching 3.5 / 1.5 programs per SM at <= 32 / 64 rows) was fitted to the
72 rows above (in sample: within 10 % of the best split on 66). Measured again on 17 shapes of
8 model families none of those rows held (gpt-oss, Llama 3 8B / 70B, Qwen2.5-7B, Mistral-Small,
Phi-3-mini, DeepSeek-V3) x M 4 / 16 / 32 / 64, every split 1..8, mxfp4 and mxfp8 weight-only, 52
rows (benchmarks/results/h200/archive/stream-split-ab-20261127.json): the first rule was within
5 % of the row's best split on 35 rows, geomean 1.049x the best, worst 1.53x; this rule (its
programs-per-SM targets chosen on those rows: in sample) 41 rows, 1.031x, worst 1.31x (3072 x
8192 at M = 64: split 8, split 5 best). Held out (H200, same method, 11 more shapes: Llama 3.2 3B,
Qwen3-8B, Gemma-2 2B, Mixtral, Qwen2.5-32B, DeepSeek-V3, Llama 3 405B x M 8 / 24 / 48 / 64
mxfp4 weight-only, 44 rows, and 5 x M 16 / 64 nvfp4 W x A, 10 rows:
archive/stream-split-validate-20261127.json): mxfp4 31 of 44 within 5 %, geomean 1.045x the best,
worst 1.26x (the first rule 26, 1.077x, 1.31x; 1.030x faster than it, rows 0.86-1.31x); nvfp4 7 of
10, 1.051x (the first rule 8, 1.051x). The 32-row target was set to 4 after that run (it ran
3, which lost 1.55x at 24 x 16384 x 16384; 3 and 4 were tied on the fit rows).

Where the tiles alone exceed that cap (large N), the rule above can only run unsplit, and the grid
runs in partial waves: ``stream_rounds_split`` models the rounds instead (its docstring; H200 sweep
and held-out check: archive/stream-rounds-20261127.json, stream-rounds-validate-20261127.json).
"""

from __future__ import annotations

from .._experimental import mx_kernel_enabled
from ..config.gemm import GemmConfig
from .device import DeviceInfo
from .mx_gemv import _triton_release
from .splits import cdiv, saturation_split
from .types import Problem

__all__ = ["STREAM_FORMATS", "STREAM_ACTIVATIONS", "STREAM_MAX_M", "STREAM_MP", "STREAM_PROGRAMS_PER_SM",
           "STREAM_MIN_CHUNKS", "STREAM_MAX_SPLIT", "STREAM_REGS", "STREAM_REGS_BIAS", "STREAM_SMEM_EXTRA",
           "stream_resident", "programs_by_registers", "releases_str", "STREAM_STAGES", "STREAM_STAGES_FP8",
           "STREAM_FP8_MIN_BYTES",
           "STREAM_FP8_WO_MAX_M", "STREAM_GATHER_MAX_MP", "STREAM_GROUPED_FORMATS", "STREAM_TRITON",
           "STREAM_GROUPED_MAX_ROWS", "STREAM_PROGRAM_FIXED_STEPS", "use_stream", "stream_split",
           "stream_split_why", "stream_rounds_split", "stream_config", "stream_reason",
           "grouped_stream_reason", "grouped_stream_config", "grouped_stream_split_why",
           "STREAM_GROUPED_FIXED_STEPS", "STREAM_GROUPED_PROGRAMS_PER_SM", "STREAM_GROUPED_MIN_STEPS"]

STREAM_FORMATS = ("mxfp4", "nvfp4", "mxfp8")
#: Problem.a values it takes: bf16 (weight-only) and quantized (W x A: the activations, <= 64 rows,
#: decoded exactly in the kernel's gather or dequantized to bf16 first, STREAM_GATHER_MAX_MP). fp16 activations
#: would need an fp16 wgmma and fp16 weights, where e2m1 x E8M0 is not exact.
STREAM_ACTIVATIONS = ("bfloat16", "quantized")
#: activation rows padded to the wgmma N (its minimum is 8)
STREAM_MP = (8, 16, 32, 64)
STREAM_MAX_M = STREAM_MP[-1]
#: most programs per SM the split makes, per padded row count (the split A/B above: at <= 16 rows
#: the rows' best splits put 3.5-5 programs per SM, more lost; at 32 and 64 rows the SMs' resident
#: count, 4 and 3. 32 rows: 3 and 4 fitted alike; 4 held on the held-out rows (module docstring))
STREAM_PROGRAMS_PER_SM = {8: 4.0, 16: 4.0, 32: 4.0, 64: 3.0}
#: fewest 128-K steps per split (the first A/B: M = 32 lost 28 % at 4 steps per split of 7168 x 2048,
#: M = 64 lost 26-28 % at 14-16 steps of 4096 x 14336 / 8192 x 8192 against half the splits)
STREAM_MIN_CHUNKS = {8: 3, 16: 3, 32: 6, 64: 8}
STREAM_MAX_SPLIT = 8
#: registers per thread of the kernel's builds, by padded rows: the most of the builds a plan runs
#: (AOT, tests/test_aot_stream.py checks them: 71-80 at <= 16 rows weight-only, 86 / 96 with mxfp4 /
#: nvfp4 activations decoded in the gather (their words loaded two steps ahead: 79 / 82 when the
#: load was one step ahead), 121-128 at 32, 164 at 64 without a bias); the runtime builds measured
#: lower (ncu on the H200: 79-87 at 16, 143-159 at 64). Allocated in steps of 8 per thread
#: (``stream_resident``): 96 still leaves 5 programs per SM, as 82 did.
STREAM_REGS = {8: 96, 16: 96, 32: 128, 64: 164}
#: the same with a bias in the dense epilogue (AOT: 177 at 64 rows, mxfp8: 2 programs per SM there,
#: not 3)
STREAM_REGS_BIAS = {8: 96, 16: 96, 32: 128, 64: 177}
#: The two tables above are triton 3.6's (and hold for 3.7.1: its AOT builds use 79-96 registers at
#: <= 16 rows, 126 at 32, 167-170 at 64). triton 3.8 builds the 64-row kernel bigger, 189-199
#: registers: 2 programs per SM, not 3, so on 3.8 the planner's residency (the split's programs per
#: SM, the rounds model's slots) reads its own table (AOT builds of tests/test_aot_stream.py on each
#: release, fortieth session). At <= 32 rows 3.8's builds fit 3.6's table but one: mxfp4 activations
#: decoded in the gather at 16 rows, 99 (4 programs per SM, not 5; the split's cap is 4 either way, so
#: only the rounds model's slots at more tiles than that see it).
_STREAM_REGS_36 = (STREAM_REGS, STREAM_REGS_BIAS)
_STREAM_REGS_38 = ({8: 96, 16: 96, 32: 128, 64: 192}, {8: 96, 16: 96, 32: 128, 64: 200})
if _triton_release() == (3, 8):
    STREAM_REGS, STREAM_REGS_BIAS = _STREAM_REGS_38
#: shared memory per program beyond the ring and the two activation buffers: the 1 KB the driver
#: keeps per block, barriers and alignment (ncu, H200: 32.8 KB dynamic at 16 rows against 32 KB
#: of ring and buffers, 57.4 at 64 against 56)
STREAM_SMEM_EXTRA = 2048
#: TMA ring depth (4 KB per slot; 6 slots + the activation buffers keep 6 programs per SM within
#: shared memory at MP <= 32)
STREAM_STAGES = 6
#: mxfp8 weights: 8 KB per slot (128 e4m3 per row); 4 slots keep the fp4 ring's shared memory
#: within ~1.3x (AOT: 41 KB per program at 16 rows), so the same programs per SM fit. NOT MEASURED
#: YET, nor is the split rule for mxfp8 (fitted on fp4 rows: a step there moves 4 KB, here 8 KB).
STREAM_STAGES_FP8 = 4
#: Where mxfp8 weights take the kernel (dense). For 1-byte e4m3 weights the portable bf16 tiles
#: (plan/portable.py) already stream well, and this kernel's fixed cost per call (prologue, a
#: chain of dependent 128-K steps per program, the split-K reduction: ~10 us) decides small
#: problems. Measured (H200, bench --suite mx, mx-20261127-1133 with the kernel against
#: mx-20261127-1122 without it, same machine and day, 6 shapes of gpt-oss / Llama 3 8B / 70B):
#: M = 16, both modes: 1.17-2.0x the portable plan on 58-470 MB of weights, 0.77-0.91x on 8-25 MB;
#: M = 64: W x A (whose portable plan is slower) 1.02-1.29x on all six, weight-only 0.73-0.84x on
#: all six. Hence: up to STREAM_FP8_WO_MAX_M rows only from STREAM_FP8_MIN_BYTES of
#: weights (between the 25 MB that lost and the 58 MB that won), above that W x A only. In-sample
#: (the rows that chose it); M between 2 and 16 other than 16 not measured. The weight-only band then
#: widened to 32 rows (thirty-fourth session, H200, rs-mxfp8-ab-20261129.json `m17_32`: the kernel
#: against the portable plan at 24 / 32 rows on 6 shapes, one process): 1.04-1.52x on 56-112 MB of
#: weights (4096 x 14336, 8192 x 8192, 28672 x 4096), 0.82-0.95x on 16-24 MB, i.e. the same byte
#: rule. From 33 rows mxfp8 goes to plan/tiled.py's 64-token tiles (RS_SMALL_MIN_M).
STREAM_FP8_MIN_BYTES = 32 << 20
STREAM_FP8_WO_MAX_M = 32
#: Quantized activations (W x A): most padded rows (block_m) whose activations the kernel decodes
#: in its gather, per format; above it they are dequantized exactly to bf16 by one pass first
#: (``GemmConfig.dequant_a``, ops/gemm.py ``stream_activations``). The gather decodes all MP x K of
#: them again in every 64-weight-row program (N / 64 x split programs), the pass once, at the cost
#: of a launch and a bf16 round trip (~2 us mxfp4, ~6.5 us nvfp4 in a graph at 16 x 2880).
#: Measured (H200, bench --suite mx --ops gemm,linear on the six dense shapes at M = 16 and 64, the
#: two ways in one run, CUDA graphs: benchmarks/results/h200/archive/wxa-gather-ab-20261127.json),
#: gather time over pass time inverted (> 1: the gather faster): M = 16 mxfp4 1.00-1.16x, nvfp4
#: 1.02-1.61x, mxfp8 0.88-1.01x; M = 64 mxfp4 0.85-1.02x, nvfp4 0.68-1.18x, mxfp8 0.82-0.97x.
#: So the gather for fp4 up to 16 rows; mxfp8 (whose pass is the cheapest) always the pass. 8 and 32
#: rows were not measured: 8 takes 16's side, 32 takes 64's (the gather's cost grows with the rows).
STREAM_GATHER_MAX_MP = {"mxfp4": 16, "nvfp4": 16, "mxfp8": 0}
#: Triton releases the kernel was checked on (AOT: tests/test_aot_stream.py; GPU: the H200 A/B
#: above, triton 3.6). Others keep the portable kernels until checked.
#: GPU-checked on 3.7.1 and 3.8.0 too (3.8 is what torch 2.14's CUDA builds pin, i.e. what a fresh
#: `pip install` on a GPU machine gets; carried to the H200 by scripts/checks/carry_triton.sh): the
#: MX / NV GPU test files pass, and each planned MX / NV call's time over cuBLAS bf16 in the same
#: process is 3.6's x 0.94-1.03 (7 rows of the streaming and tiled kernels;
#: results/h200/archive/triton-releases-20261130.json). 3.9 (no torch of our range pins it) is
#: AOT-built only: the portable kernels run there until it is checked on the GPU.
STREAM_TRITON = ((3, 6), (3, 7), (3, 8))
_TRITON_OK = _triton_release() in STREAM_TRITON
#: ``BLOCKSCALED_MX_KERNELS`` without ``stream`` (e.g. ``none``) turns the kernel off
STREAM_ENABLED = mx_kernel_enabled("stream")


def stream_reason(p: Problem, dev: DeviceInfo, gluon_ok: bool) -> str | None:
    """None when the kernel can take the call, else why not (plain words, for ``explain``)."""
    if p.fmt not in STREAM_FORMATS:
        return f"{p.fmt} weights (it takes {', '.join(STREAM_FORMATS)})"
    if not dev.is_hopper:
        return "not an sm_90 device"
    if not gluon_ok:
        return "the Gluon kernels do not build with this triton"
    if not STREAM_ENABLED:
        return "switched off (BLOCKSCALED_MX_KERNELS without 'stream')"
    if not _TRITON_OK:
        return (f"triton {releases_str([_triton_release()])} (the kernel is checked on triton "
                f"{releases_str(STREAM_TRITON)})")
    if p.a not in STREAM_ACTIVATIONS:
        return f"{p.a} activations (it takes bf16 or quantized {p.fmt})"
    if p.op != "gemm" or p.grouping != "dense":
        return "not a dense GEMM"
    if not 1 <= p.m <= STREAM_MAX_M:
        return f"M = {p.m} outside 1..{STREAM_MAX_M}"
    if p.k % 32 or p.k <= 0:
        return f"K = {p.k} not a positive multiple of 32 (16-byte TMA rows of packed e2m1)"
    if not p.tma:
        return ("weights not 16-byte aligned for TMA, or quantized activations not 4-byte aligned (the "
                "gather reads them as words)")
    if p.fmt == "mxfp8":
        if p.m > STREAM_FP8_WO_MAX_M and p.weight_only:
            return (f"mxfp8 weight-only at M = {p.m} > {STREAM_FP8_WO_MAX_M}: the portable bf16 tiles measured "
                    f"faster (STREAM_FP8_WO_MAX_M)")
        if p.m <= STREAM_FP8_WO_MAX_M and p.n * p.k < STREAM_FP8_MIN_BYTES:
            return (f"mxfp8 weights of {p.n * p.k / 2**20:.1f} MB < {STREAM_FP8_MIN_BYTES >> 20} MB at M <= "
                    f"{STREAM_FP8_WO_MAX_M}: the portable bf16 tiles measured faster (STREAM_FP8_MIN_BYTES)")
    return None


def use_stream(p: Problem, dev: DeviceInfo, gluon_ok: bool = True) -> bool:
    return stream_reason(p, dev, gluon_ok) is None


def programs_by_registers(regs: int) -> int:
    """Programs of 128 threads whose ``regs`` registers per thread (allocated in steps of 8) one SM's
    64 K registers hold."""
    return 65536 // (cdiv(regs, 8) * 8 * 128)


def releases_str(releases) -> str:
    """``((3, 6), (3, 8))`` -> ``"3.6, 3.8"`` (triton releases, for explanations and warnings)."""
    return ", ".join(".".join(map(str, r)) for r in releases)


def stream_resident(fmt: str, mp: int, smem_bytes: int = 227 * 1024, bias: bool = False) -> int:
    """Programs of the kernel one SM holds at once: the fewer of what its 64 K registers
    (``STREAM_REGS`` / ``STREAM_REGS_BIAS``, 128 threads) and its shared memory (``smem_bytes``,
    the opt-in per block, plus the 1 KB the driver keeps: 228 KB on H100 / H200) allow. ncu on
    the H200 (mxfp4, no bias): 6 by both at 16 rows (5 here: the nvfp4 gather build's 82 registers
    round to 88), 3 by both at 64."""
    regs = programs_by_registers((STREAM_REGS_BIAS if bias else STREAM_REGS)[mp])
    need = _stages(fmt) * (8192 if fmt == "mxfp8" else 4096) + 2 * mp * 128 * 2 + STREAM_SMEM_EXTRA
    return max(1, min(regs, (smem_bytes + 1024) // need))


def stream_split(n: int, k: int, m: int, sm_count: int, fmt: str = "mxfp4", smem_bytes: int = 227 * 1024,
                 bias: bool = False) -> int:
    """K splits (an integer <= STREAM_MAX_SPLIT), see the module docstring; more tiles than the
    programs-per-SM cap allows: ``stream_rounds_split``."""
    return stream_split_why(n, k, m, sm_count, fmt, smem_bytes, bias)[0]


def stream_split_why(n: int, k: int, m: int, sm_count: int, fmt: str = "mxfp4", smem_bytes: int = 227 * 1024,
                     bias: bool = False) -> tuple[int, str]:
    """``stream_split`` and the rule that chose it, in words (for ``explain``)."""
    mp = next(s for s in STREAM_MP if s >= m)
    tiles = cdiv(n, 64)
    chunks = cdiv(k, 128)
    resident = stream_resident(fmt, mp, smem_bytes, bias)
    most = int(min(STREAM_PROGRAMS_PER_SM[mp], resident) * sm_count)
    if tiles > most:
        slots = resident * sm_count
        s = stream_rounds_split(tiles, chunks, mp, slots)
        return s, (f"{tiles} tiles > {most} (the programs-per-SM cap): {cdiv(tiles * s, slots)} round(s) of "
                   f"{slots} resident programs x {cdiv(chunks, s)} steps (stream_rounds_split)")
    split = 1
    for s in range(2, STREAM_MAX_SPLIT + 1):
        per = cdiv(chunks, s)
        if chunks < STREAM_MIN_CHUNKS[mp] * s or tiles * s > most:
            break
        if cdiv(chunks, per) == s:  # else the launcher would run fewer splits (none empty)
            split = s
    return split, (f"at most {most} programs ({STREAM_PROGRAMS_PER_SM[mp]:g} programs per SM, {resident} resident) "
                   f"and >= {STREAM_MIN_CHUNKS[mp]} steps per split (the H200 fp4-stream split A/Bs)")


#: a program's fixed cost in 128-K steps (its prologue's ring fill and first loads, the epilogue):
#: the rounds model of ``stream_rounds_split``. Chosen with it on an H200 split sweep (in sample,
#: benchmarks/results/h200/archive/stream-rounds-20261127.json): 1-3 pick the same splits there.
STREAM_PROGRAM_FIXED_STEPS = 2


def stream_rounds_split(tiles: int, chunks: int, mp: int, slots: int) -> int:
    """The K split when the tiles alone exceed the programs-per-SM cap (``stream_split``): the
    grid then runs in rounds of ``slots`` resident programs (SMs x ``stream_resident``), and a
    program runs at its own latency-bound pace whatever shares its SM (ncu, H200, mxfp4 at 16 rows
    on 57344 x 8192: 0.5 issued instructions per cycle and scheduler, long-scoreboard and barrier
    stalls ahead). A partial last round therefore costs a whole program: 896 tiles of 64 steps on
    660 slots ran 180 us unsplit, 143 in three rounds of 32-step programs (split 2). Model:
    ``ceil(tiles x s / slots) x (steps per split + STREAM_PROGRAM_FIXED_STEPS)``, the smallest s at
    the minimum, with the splits' own limits (``STREAM_MIN_CHUNKS``, no empty split)."""
    best, best_t = 1, None
    for s in range(1, STREAM_MAX_SPLIT + 1):
        per = cdiv(chunks, s)
        if s > 1 and (chunks < STREAM_MIN_CHUNKS[mp] * s or cdiv(chunks, per) != s):
            continue
        t = cdiv(tiles * s, slots) * (per + STREAM_PROGRAM_FIXED_STEPS)
        if best_t is None or t < best_t:
            best, best_t = s, t
    return best


def stream_config(p: Problem, dev: DeviceInfo) -> GemmConfig:
    """The kernel's launch: block_m = padded rows, 64 x 128 tile steps, split, ring depth."""
    mp = next(s for s in STREAM_MP if s >= p.m)
    split = stream_split(p.n, p.k, p.m, dev.sm_count, p.fmt, dev.smem_bytes, p.bias)
    per = cdiv(cdiv(p.k, 128), split)
    return GemmConfig(block_m=mp, block_n=64, block_k=128, num_warps=4,
                      num_stages=max(2, min(_stages(p.fmt), per)), split_k=split, strategy="stream",
                      dequant_a=_dequant_a(p, mp))


def _dequant_a(p: Problem, mp: int) -> bool:
    """Quantized activations dequantized by one pass first (True) or in the gather (False):
    ``STREAM_GATHER_MAX_MP``."""
    return p.a == "quantized" and mp > STREAM_GATHER_MAX_MP[p.fmt]


def _stages(fmt: str) -> int:
    return STREAM_STAGES_FP8 if fmt == "mxfp8" else STREAM_STAGES


# ----------------------------------------------------------------------------- grouped (MoE decode)
#: Most rows per expert (the call's hint: the mean, T x top-k / E, or max_m masked) for which the
#: grouped calls take the kernel: an expert's rows run in blocks of the padded row count, each
#: block streaming the expert's weights again, so it pays where experts hold few rows (decode;
#: the portable grouped kernel and dequantize + torch._grouped_mm were 0.3-0.9x cuBLAS bf16 there:
#: benchmarks/results/h200 mx-20261127-0848). NOT MEASURED YET: a first bound from that argument.
STREAM_GROUPED_MAX_ROWS = 16.0
#: weight formats of the grouped form the planner uses. mxfp8 measured (H200, one run, CUDA graphs,
#: each output checked against float64; contiguous, skewed routing, T = 1 / 4 / 16 / 64 tokens on
#: gpt-oss-120b / -20b, Qwen3-30B-A3B and Mixtral expert shapes, weight-only and W x A:
#: benchmarks/results/h200/archive/grouped-mxfp8-stream-ab-20261127.jsonl): 1.08-2.15x the
#: portable grouped plan on all 48 rows.
STREAM_GROUPED_FORMATS = ("mxfp4", "nvfp4", "mxfp8")


def grouped_stream_reason(p: Problem, dev: DeviceInfo) -> str | None:
    """None when a grouped call (``p.op == "grouped"``) can take the kernel, else why not.
    ``p.tma``: the caller's check that TMA can read the packed weights and the Gluon kernels build."""
    if p.op != "grouped" or p.dual or p.grouping not in ("contiguous", "masked"):
        return "not a contiguous / masked grouped GEMM (SwiGLU keeps its kernels)"
    if p.fmt not in STREAM_GROUPED_FORMATS:
        return f"{p.fmt} weights (the grouped form is planned for {', '.join(STREAM_GROUPED_FORMATS)})"
    if not dev.is_hopper or not _TRITON_OK or not STREAM_ENABLED:
        return "not an sm_90 device with a checked triton (or switched off: BLOCKSCALED_MX_KERNELS)"
    if p.a not in STREAM_ACTIVATIONS:
        return f"{p.a} activations"
    if p.k % 32 or p.k <= 0 or not p.tma:
        return (f"K = {p.k} not a multiple of 32, or the weights not 16-byte aligned for TMA, or quantized "
                f"activations not 4-byte aligned")
    if p.rows_per_expert > STREAM_GROUPED_MAX_ROWS:
        return f"~{p.rows_per_expert:g} rows per expert > {STREAM_GROUPED_MAX_ROWS:g}"
    return None


#: the grouped form's K split (``grouped_stream_split_why``): a program's fixed cost in 128-K steps, the
#: programs per SM past which the SM's issue rate limits, and the fewest steps per split. EMPIRICAL
#: (the cost is far above the dense kernel's 2 steps: the expert lookup of the compacted grid, two
#: dependent loads of the offsets before the first TMA load, the ring fill, the partial write and
#: last-arriver sum; not profiled). H200 sweeps of splits 1..4, CUDA graphs, skewed routing, every
#: output checked against float64: benchmarks/results/h200/archive/grouped-split-ab-20261127.json
#: (gpt-oss-120b / -20b, Qwen3-30B-A3B, Mixtral, DeepSeek-V3 expert shapes x T 1 / 2 / 4 / 8, 64 rows)
#: and grouped-split-validate-20261127.json (Qwen2-57B-A14B, OLMoE, DBRX, Phi-3.5-MoE, Mixtral
#: gate_up, DeepSeek-V2-Lite, 50 rows). The first constants (6 steps, 6 steps, chosen on the
#: first sweep: 61 of 64 within 5 % of the best split, 1.047x over no split) held out at 42 of 50
#: and 1.012x, with a row 0.74x (OLMoE gate_up at T = 1); these (chosen on both, in sample) give
#: 61 of 64 and 43 of 50 within 5 %, 1.047x and 1.024x over no split, and no row of either sweep
#: slower than no split. The splits that pay: few experts with long K (Mixtral down at T = 1
#: 98 -> 41 us, Phi-3.5-MoE down 35 -> 21 us).
STREAM_GROUPED_FIXED_STEPS = 24
STREAM_GROUPED_PROGRAMS_PER_SM = 3
STREAM_GROUPED_MIN_STEPS = 8


def grouped_stream_split_why(p: Problem, mp: int, dev: DeviceInfo) -> tuple[int, str]:
    """The K split of a grouped call (contiguous only; masked: 1) and its account in words.

    At decode a contiguous call's grid is compacted to min(E, sum_m) expert slots (ops/_stream.py);
    with few experts x tiles (Mixtral down at T = 1: 2 experts x 64 tiles of 112 steps) the
    programs are too few to keep the SMs busy, and a split multiplies them. Model:
    ``(steps per split + STREAM_GROUPED_FIXED_STEPS) x max(rounds of resident programs, programs
    per SM / STREAM_GROUPED_PROGRAMS_PER_SM)``, the slots as the programs' upper bound (skewed
    routing leaves fewer experts with more rows each), at least ``STREAM_GROUPED_MIN_STEPS`` steps
    per split, splits 1..4 (the measured range)."""
    if p.grouping != "contiguous":
        return 1, "masked: no K split"
    active = max(1, min(p.experts, p.m))
    tiles, chunks = cdiv(p.n, 64), cdiv(p.k, 128)
    slots = stream_resident(p.fmt, mp, dev.smem_bytes) * dev.sm_count
    best = saturation_split(active * tiles, chunks, slots, dev.sm_count, STREAM_GROUPED_FIXED_STEPS,
                            STREAM_GROUPED_PROGRAMS_PER_SM, STREAM_GROUPED_MIN_STEPS, 4)[0]
    return best, (f"<= {active} expert slot(s) x {tiles} tiles x {best} K split(s), {cdiv(chunks, best)} steps each "
                  f"(plan/stream.py grouped_stream_split_why)")


def grouped_stream_config(p: Problem, dev: DeviceInfo) -> GemmConfig:
    """Padded rows for the expected rows per expert with room for skew (2x the mean, at least 8),
    the K split of ``grouped_stream_split_why``, ring min(6, steps per split)."""
    want = max(8.0, 2.0 * p.rows_per_expert)
    mp = next((s for s in STREAM_MP if s >= want), STREAM_MP[-1])
    split = grouped_stream_split_why(p, mp, dev)[0]
    return GemmConfig(block_m=mp, block_n=64, block_k=128, num_warps=4,
                      num_stages=max(2, min(_stages(p.fmt), cdiv(cdiv(p.k, 128), split))), split_k=split,
                      strategy="stream", dequant_a=_dequant_a(p, mp))
