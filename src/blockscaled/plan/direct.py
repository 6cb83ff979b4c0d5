"""Where the sm_90 register-streaming decode kernel (kernels/hopper/direct.py) runs, and its K split.

The kernel: mxfp4 / nvfp4 weights x bf16 activations (weight-only), 2..8 rows padded to the
``mma.sync`` N of 8, dense, on Hopper, with a bias. No shared memory and no barrier in its K loop
(each warp streams its 16 weight rows straight into registers): 280 SASS per thread and 128-K step
against the wgmma streaming kernel's 342 (sm_90 AOT builds, tests/test_aot_direct.py), 64 registers
(mxfp4) / 80 (nvfp4) per thread, so 8 / 6 programs fit an SM.

Measured (H200, one run, CUDA-graph replays, weights and activations rotated past L2, every output
checked against float64: benchmarks/results/h200/archive/direct-ab-20261127.json; 7 shapes of
gpt-oss, Llama 3 8B / 70B x M 1 / 2 / 4 / 8 / 16 x both formats, every split 1..8): at its best
split against the plan that ran before (the decode GEMV or the wgmma streaming kernel) 1.13-1.52x
at M = 2..8 on the shapes of 8 MB and more (mxfp4 M = 2 on 2880 x 2880: 0.84x, so the GEMV keeps
the mxfp4 rows under ``DIRECT_GEMV_MIN_BYTES``); at M = 1 the GEMV stays faster or equal
(0.57-1.02x), and at M = 16 (its 16-row build: 104 registers, 4 programs per SM) the wgmma kernel
(0.74-1.17x). Hence 2 <= M <= 8 (``DIRECT_MIN_M`` / ``DIRECT_MAX_M``), and
1 <= M where the GEMV does not run (triton 3.7 / 3.8, whose GEMV build spills: ``DIRECT_MIN_M_WITHOUT_GEMV``).

The K split (``direct_split``): programs are (64-row tiles) x (splits). A program alone runs at
its latency-bound pace (a chain of dependent 128-K steps), so up to ~4 programs per SM add
throughput, past that the SM's issue rate is the limit, and past the resident count a partial
round costs a whole program. Model: ``(steps per split + DIRECT_FIXED_STEPS) x max(rounds of
resident programs, programs per SM x DIRECT_SATURATION)``, the smallest split at its minimum, with
at least ``DIRECT_MIN_STEPS`` steps per split. Chosen on the rows above with a floor of 4 steps
(within 5 % of the best timed split on 55 of 56 rows at M <= 8). Held out (H200, same method,
benchmarks/results/h200/archive/direct-validate-20261127.json: 14 shapes of Qwen2.5-7B, Llama 3 8B /
405B, Qwen3-32B, Phi-3-mini, Gemma-2 9B, DeepSeek-V3, gpt-oss-20b, Mixtral x M 3 / 8 x both formats,
every split 1..8): within 5 % of the best split on 38 of 56, geomean 1.032x, worst 1.148x (Llama 3
405B o, 16384 x 16384: split 2 planned, 4 best); against the plan it replaced (GEMV / wgmma
streaming kernel) 0.98-1.38x, geomean 1.19x. The floor then went to 6 steps (both sets: fit 55 of
56, held-out rows 44 of 56, geomean 1.022x, worst 1.148x; in sample now).
"""

from __future__ import annotations

from .._experimental import mx_kernel_enabled
from ..config.gemm import GemmConfig
from .device import DeviceInfo
from .mx_gemv import _triton_release, use_mx_gemv
from .splits import cdiv, saturation_split, split_plan_kb
from .types import Problem

__all__ = ["DIRECT_HOIST_REGS", "DIRECT_GROUPED_REGS", "DIRECT_FORMATS", "DIRECT_MIN_M", "DIRECT_MIN_M_WITHOUT_GEMV",
           "direct_min_m", "DIRECT_MAX_M", "DIRECT_MP", "DIRECT_REGS", "DIRECT_GEMV_MIN_BYTES",
           "DIRECT_SATURATION", "DIRECT_FIXED_STEPS", "DIRECT_MIN_STEPS", "DIRECT_MAX_SPLIT", "DIRECT_TRITON",
           "direct_reason", "use_direct", "direct_resident", "direct_split", "direct_split_why", "direct_config",
           "DIRECT_GROUPED_MAX_ROWS", "grouped_direct_reason", "grouped_direct_config"]

DIRECT_FORMATS = ("mxfp4", "nvfp4")
#: rows the planner sends to the kernel (the A/B above: the GEMV wins at 1 row, the wgmma streaming
#: kernel at 16)
DIRECT_MIN_M = 2
DIRECT_MAX_M = 8
#: one row where the decode GEMV does not take it (plan/mx_gemv.py ``use_mx_gemv``: fp4 on triton 3.7 / 3.8,
#: whose fp4 builds spill; or the GEMV switched off). Measured (H200, same process, CUDA graphs, inputs
#: rotated past L2, each output checked against float64: benchmarks/results/h200/archive/m1-triton38-20261130.json;
#: weight-only): against the wgmma streaming kernel that ran there, on 3.8.0 1.10-1.19x on 12 rows (gpt-oss,
#: Llama 3 8B / 70B shapes x mxfp4 / nvfp4), 1.09-1.39x on 16 held-out rows (8 more shapes), on 3.7.1
#: 1.08-1.39x on 14 rows: the same gain as at 2..8 rows (both pad to 8; this kernel's K loop is shorter)
DIRECT_MIN_M_WITHOUT_GEMV = 1
#: the activation rows padded to the mma.sync N
DIRECT_MP = 8
#: registers per thread of the sm_90 builds (AOT, tests/test_aot_direct.py pins them; with or
#: without a bias, any output dtype): 8 programs of 128 threads per SM for mxfp4, 6 for nvfp4
DIRECT_REGS = {"mxfp4": 64, "nvfp4": 80}
#: registers per thread of the grouped builds (AOT, tests/test_aot_direct.py: 92 contiguous mxfp4,
#: 128 masked nvfp4 with per-expert global scales; the row-block loop nest and the expert lookup)
DIRECT_GROUPED_REGS = 128
#: the register budget (GemmConfig.maxnreg) of grids that need no more than 4 programs per SM (one
#: round at DIRECT_SATURATION's 4 per SM, which 128 registers x 128 threads still allow). ptxas left
#: to itself keeps the builds at 64 / 80 registers by placing each step's loads after most of the
#: step's MMAs, so a load is waited on right after it is issued (ncu: long-scoreboard stalls 5.3 of
#: 9.6 cycles per instruction); with 128 it issues them at the top of the step. Measured (H200, same
#: process, bitwise equal, benchmarks/results/h200/archive/direct-maxnreg-ab-20261127.json, 8 shapes x
#: M 2 / 8 x both formats): 1.01-1.11x on the grids of <= 4 programs per SM, 0.84x on Llama 3 70B
#: gate_up / 28672 x 8192 mxfp4 (896+ programs: 8 per SM at 64 registers, 4 at 128). Held out
#: (direct-maxnreg-validate-20261127.json, the 14 shapes of direct-validate x M 3 / 8 x both
#: formats): where the rule asks for 128, 1.02-1.21x (geomean 1.076x, 32 rows); where it does not, 128
#: would have cost 1.106x geomean (24 rows; on 6 of them, 640-1184 programs, it would have gained
#: 4-9 %: the threshold is conservative).
DIRECT_HOIST_REGS = 128
#: mxfp4 at M = 2 (where the mxfp4 GEMV also runs, plan/mx_gemv.py ``MX_GEMV_ROWS``): the kernel
#: from this many weight bytes (the A/B above: 0.84x on 4 MB of weights, 0.985-1.52x from 8 MB:
#: both kernels are fixed-cost bound on small weights, and the GEMV's fixed cost is lower: no K
#: split, no partial reduction). Only where the GEMV runs: on triton 3.8 (GEMV off) the kernel ran
#: 2 x 2880 x 2880 mxfp4 1.14x the streaming kernel (m1-triton38-20261130.json)
DIRECT_GEMV_MIN_BYTES = 8 << 20
#: programs per SM at which an SM's issue rate, not a program's latency, limits (1 / 4: the stream
#: kernel's STREAM_PROGRAMS_PER_SM measured the same 4); chosen with the split model on the A/B above
DIRECT_SATURATION = 0.25
#: a program's fixed cost in 128-K steps (first loads, epilogue), as the stream kernel's
DIRECT_FIXED_STEPS = 2
#: fewest 128-K steps per split (the A/B above: 5760 x 2880 lost 1.2x at 4 steps against 6; the
#: held-out check (module docstring) moved it from 4 to 6: gpt-oss-20b qkv lost 1.07-1.13x at 4 steps)
DIRECT_MIN_STEPS = 6
DIRECT_MAX_SPLIT = 8
#: Triton releases the kernel was checked on (AOT and the H200 A/B: triton 3.6; others keep the
#: portable kernels until checked)
#: 3.7 / 3.8: GPU-checked with the streaming kernel (plan/stream.py, STREAM_TRITON, says how; this kernel's
#: GPU tests pass there, its time was not compared)
DIRECT_TRITON = ((3, 6), (3, 7), (3, 8))
_TRITON_OK = _triton_release() in DIRECT_TRITON
#: ``BLOCKSCALED_MX_KERNELS`` without ``direct`` turns the kernel off
DIRECT_ENABLED = mx_kernel_enabled("direct")


def direct_reason(p: Problem, dev: DeviceInfo, gluon_ok: bool) -> str | None:
    """None when the planner sends the call to the kernel, else why not (plain words)."""
    if p.fmt not in DIRECT_FORMATS:
        return f"{p.fmt} weights (it takes {', '.join(DIRECT_FORMATS)})"
    if not dev.is_hopper or not gluon_ok or not _TRITON_OK:
        return "not an sm_90 device with a checked triton whose Gluon kernels build"
    if not DIRECT_ENABLED:
        return "switched off (BLOCKSCALED_MX_KERNELS without 'direct')"
    if p.a != "bfloat16":
        return f"{p.a} activations (it takes bf16, weight-only)"
    if p.op != "gemm" or p.grouping != "dense":
        return "not a dense GEMM"
    lo = direct_min_m(p.fmt, p.k)
    if not lo <= p.m <= DIRECT_MAX_M:
        return f"M = {p.m} outside {lo}..{DIRECT_MAX_M}"
    if p.k % 32 or p.k <= 0:
        return f"K = {p.k} not a positive multiple of 32 (whole 16-byte blocks of packed e2m1)"
    if not p.tma:
        return "weights not 16-byte aligned"
    nbytes = p.n * p.k // 2
    if p.fmt == "mxfp4" and p.m == 2 and nbytes < DIRECT_GEMV_MIN_BYTES and use_mx_gemv(p.fmt, p.m, p.k):
        return (f"mxfp4 at M = 2 on {nbytes / 2**20:.1f} MB of weights < {DIRECT_GEMV_MIN_BYTES >> 20} MB: the "
                f"decode GEMV measured faster (DIRECT_GEMV_MIN_BYTES)")
    return None


def direct_min_m(fmt: str, k: int) -> int:
    """Fewest rows the planner sends to the kernel: DIRECT_MIN_M where the decode GEMV takes one row,
    else DIRECT_MIN_M_WITHOUT_GEMV."""
    return DIRECT_MIN_M if use_mx_gemv(fmt, 1, k) else DIRECT_MIN_M_WITHOUT_GEMV


def use_direct(p: Problem, dev: DeviceInfo, gluon_ok: bool = True) -> bool:
    return direct_reason(p, dev, gluon_ok) is None


def direct_resident(fmt: str) -> int:
    """Programs of the kernel one SM holds at once: its 64 K registers over ``DIRECT_REGS`` x 128
    threads (allocated in steps of 8; shared memory: 2 KB for the epilogue, never the limit)."""
    return max(1, 65536 // (cdiv(DIRECT_REGS[fmt], 8) * 8 * 128))


def direct_split(n: int, k: int, fmt: str, sm_count: int) -> int:
    """The K split of ``direct_split_why``."""
    return direct_split_why(n, k, fmt, sm_count)[0]


def direct_split_why(n: int, k: int, fmt: str, sm_count: int) -> tuple[int, str]:
    """The K split (module docstring) and its account in words (for ``explain``)."""
    tiles, chunks = cdiv(n, 64), cdiv(k, 128)
    slots = direct_resident(fmt) * sm_count
    best, best_t = saturation_split(tiles, chunks, slots, sm_count, DIRECT_FIXED_STEPS, 1 / DIRECT_SATURATION,
                                    DIRECT_MIN_STEPS, DIRECT_MAX_SPLIT)
    per = cdiv(chunks, best)
    return best, (f"{tiles} tiles x {best} split(s) = {tiles * best} programs on {sm_count} SMs ({slots} resident): "
                  f"{per} steps per split, cost {best_t:g} step-units, the least over splits 1..{DIRECT_MAX_SPLIT} "
                  f"with >= {DIRECT_MIN_STEPS} steps (plan/direct.py direct_split)")


def direct_config(p: Problem, dev: DeviceInfo) -> GemmConfig:
    """The kernel's launch: 8 padded rows, 64 x 128 steps, 4 warps, the split, and
    ``DIRECT_HOIST_REGS`` registers where the grid needs no more than 4 programs per SM."""
    split = direct_split(p.n, p.k, p.fmt, dev.sm_count)
    programs = cdiv(p.n, 64) * split_plan_kb(cdiv(p.k, 128), split)[0]  # the splits the launcher runs
    hoist = programs <= int(dev.sm_count / DIRECT_SATURATION)
    return GemmConfig(block_m=DIRECT_MP, block_n=64, block_k=128, num_warps=4, num_stages=1, split_k=split,
                      strategy="direct", maxnreg=DIRECT_HOIST_REGS if hoist else 0)


# ----------------------------------------------------------------------------- grouped (MoE decode)
#: Most rows per expert (the call's hint: the mean T x top-k / E, or expected_m masked) for which the
#: grouped calls take the kernel: its 8 padded rows with the streaming kernel's room for skew (it pads
#: to 2x the hint, plan/stream.py ``grouped_stream_config``); more rows run in further blocks of 8.
#: Measured (H200, same process, CUDA graphs, skewed routing, every output checked against float64:
#: benchmarks/results/h200/archive/grouped-direct-ab-20261127.json; gpt-oss-120b / -20b, Qwen3-30B-A3B,
#: Mixtral, DBRX, OLMoE expert shapes x T 1..16, weight-only, 40 rows): against the wgmma streaming
#: kernel's grouped form with the same split 0.99-1.68x, geomean 1.18x; below 1.0 only Mixtral down
#: at T = 1 / 2 (0.987 / 0.991x).
DIRECT_GROUPED_MAX_ROWS = 4.0


def grouped_direct_reason(p: Problem, dev: DeviceInfo, stream_why: str | None) -> str | None:
    """None when a grouped call takes the kernel's grouped form, else why not. ``stream_why``: the
    streaming kernel's grouped verdict (plan/stream.py ``grouped_stream_reason``: format, device,
    layout, K, alignment, rows), whose conditions this form shares."""
    if stream_why is not None:
        return stream_why
    if p.fmt not in DIRECT_FORMATS:
        return f"{p.fmt} weights (it takes {', '.join(DIRECT_FORMATS)})"
    if not _TRITON_OK or not DIRECT_ENABLED:
        return "the register-streaming kernel off (a triton it was not checked on, or BLOCKSCALED_MX_KERNELS)"
    if p.a != "bfloat16":
        return f"{p.a} activations (it takes bf16, weight-only)"
    if p.rows_per_expert > DIRECT_GROUPED_MAX_ROWS:
        return f"~{p.rows_per_expert:g} rows per expert > {DIRECT_GROUPED_MAX_ROWS:g}"
    return None


def grouped_direct_config(p: Problem, split: int) -> GemmConfig:
    """8 padded rows, 64 x 128 steps, the grouped split (plan/stream.py ``grouped_stream_split_why``, whose
    resident count at 8 rows, 5 programs per SM, is this form's too: 92-128 registers)."""
    return GemmConfig(block_m=DIRECT_MP, block_n=64, block_k=128, num_warps=4, num_stages=1, split_k=split,
                      strategy="direct")
