"""The sm_90a Gluon fp8_block GEMM kernels compile for Hopper without a GPU; launcher checks.

Compiled in a subprocess without TRITON_INTERPRET (conftest sets it for this process; Gluon has
no interpreter). For both kernels ("wide": dense, grouped, SwiGLU, split-K; "skinny": swap-AB
decode) over tile configs and output dtypes, the PTX must contain FP8 wgmma
(``wgmma.mma_async ... e4m3.e4m3``) and TMA loads (``cp.async.bulk.tensor``); the wide kernel
must be warp-specialised (``setmaxnreg``); shared memory must fit the H100 (227 KB); and, where
triton's bundled ptxas is present, no register spills beyond the known budgets. The wide
kernel's fused split-K (SPLIT > 1): arrival atomics behind a named per-partition barrier,
counter resets, no spills, the same main loop as SPLIT 1.
"""


import re

import pytest
import torch
import triton

from _aot import PTXAS_STATS, WITH_DEFAULTS, run_compile_script

# The module fixture compiles ~41 Gluon kernels in one subprocess: about 60 s on 2 CPU cores, and
# more than gpu_check.sh's 120 s per-test limit (pytest-timeout) when 8 xdist workers share the
# H100 machine (once 9 errors, all this fixture timing out). The fixture's time is charged
# to the first test that uses it, so every test here gets the longer limit.
pytestmark = pytest.mark.timeout(900)

SCRIPT = PTXAS_STATS + WITH_DEFAULTS + r'''
import json, re, os, subprocess, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from blockscaled.kernels.hopper import skinny as S
from blockscaled.kernels.hopper import wide as W
from blockscaled.ops._hopper import HopperConfig

TGT = GPUTarget("cuda", 90, 32)
out = {}

# the wide kernel (dense MODE 0 with TMA-store / masked epilogue, grouped MODE 1 / 2)
def wsig(bm, bn, cdt, rows):
    la = gl.NVMMASharedLayout.get_default_for([bm, 128], gl.float8e4nv)
    lb = gl.NVMMASharedLayout.get_default_for([bn, 128], gl.float8e4nv)
    bdesc = f"tensordesc<fp8e4nv[{bn}, 128],{lb!r}>"
    gdt = {"bf16": gl.bfloat16, "fp32": gl.float32, "fp16": gl.float16}[cdt]
    lc = gl.NVMMASharedLayout.get_default_for([rows, 128], gdt)
    return {"a_desc": f"tensordesc<fp8e4nv[{bm}, 128],{la!r}>", "b_desc": bdesc, "b2_desc": bdesc,
            "c_desc": f"tensordesc<{cdt}[{rows}, 128],{lc!r}>", "sa_ptr": "*fp32", "sb_ptr": "*fp32",
            "sb2_ptr": "*fp32", "c_ptr": "*" + cdt, "seg_ptr": "*i32", "ws_ptr": "*fp32", "cnt_ptr": "*i32",
            "M": "i32", "N": "i32", "K": "i32", "E": "i32", "num_pid_m": "i32", "kb_per_split": "i32",
            "split_from": "i32",
            "stride_sam": "i32", "stride_sak": "i32", "stride_sbe": "i32", "stride_sbn": "i32",
            "stride_sbk": "i32", "stride_cm": "i32", "GROUP_M": "constexpr", "STAGES": "constexpr",
            "NH": "constexpr", "EPI": "constexpr", "MODE": "constexpr", "E_POW2": "constexpr",
            "SPLIT_WG": "constexpr", "DUAL": "constexpr", "SPLIT": "constexpr", "num_warps": "constexpr"}

#: a read of split-K partials (fp32, plain or .cg, scalar or vector), not the acquire poll
PARTIAL_LOAD = re.compile(r"\bld\.global(\.cg)?(\.v\d)?\.(f32|b32)\b")


def barrier_after_polls(ptx):
    """For each acquire poll of a split counter (spread reduction): whether a barrier sits between
    it and the next read of the partials (the other threads' reads are ordered after the poll, and
    after the L1 invalidation its acquire makes, only through it)."""
    lines = ptx.splitlines()
    out = []
    for i, ln in enumerate(lines):
        if "ld.global.gpu.acquire" in ln:
            bar = False
            for ln2 in lines[i + 1:]:
                if re.search(r"\b(bar|barrier)\.sync\b", ln2):
                    bar = True
                if PARTIAL_LOAD.search(ln2) and "acquire" not in ln2:
                    break
            out.append(bar)
    return out

def waits_between_tma_stores(ptx):
    """For each pair of consecutive TMA stores in the PTX text (cp.async.bulk.tensor ... global):
    whether a bulk-group read wait (cp.async.bulk.wait_group.read) sits between them."""
    out, seen, waited = [], False, False
    for ln in ptx.splitlines():
        if "cp.async.bulk.tensor.2d.global" in ln:
            if seen:
                out.append(waited)
            seen, waited = True, False
        elif "cp.async.bulk.wait_group.read" in ln:
            waited = True
    return out

def barrier_before_atomics(ptx):
    """The barrier instruction nearest before each acq_rel atomic (split-K arrival)."""
    lines = ptx.splitlines()
    out = []
    for i, ln in enumerate(lines):
        if "atom.global.gpu.acq_rel.add" in ln:
            for j in range(i - 1, -1, -1):
                if re.search(r"\b(bar|barrier)\.sync\b", lines[j]):
                    out.append(" ".join(lines[j].split()))
                    break
    return out

# (block_m, block_n, stages, epilogue, mode, out dtype, split_wg, dual[, split-K]); dual: block_n 256 = gate | up
for bm, bn, st, epi, mode, cdt, split, dual, *sk in [
        (128, 256, 3, 2, 0, "bf16", True, False), (128, 256, 4, 1, 0, "bf16", True, False),
        (128, 128, 5, 2, 0, "fp16", True, False), (128, 256, 3, 1, 0, "fp32", True, False),
        (64, 256, 4, 1, 2, "bf16", False, False), (128, 256, 4, 1, 1, "bf16", True, False),
        (64, 128, 6, 2, 0, "bf16", False, False), (128, 256, 3, 2, 0, "bf16", False, False),
        (128, 256, 4, 1, 2, "bf16", True, False),
        (128, 256, 4, 2, 0, "bf16", True, True), (128, 256, 4, 1, 1, "bf16", True, True),
        (64, 256, 5, 1, 2, "bf16", False, True), (128, 256, 3, 1, 0, "fp32", True, True),
        (128, 256, 4, 2, 0, "fp16", True, True),
        # fused split-K (dense): SPLIT 3 next to the same configs above (SPLIT 1), and a
        # 128x128 5-stage config with 7 splits
        (128, 256, 3, 2, 0, "bf16", True, False, 3), (128, 256, 4, 1, 0, "bf16", True, False, 3),
        (128, 256, 3, 1, 0, "fp32", True, False, 3), (128, 128, 5, 2, 0, "fp16", True, False, 3),
        (128, 128, 5, 2, 0, "fp32", True, False, 3), (128, 128, 5, 2, 0, "bf16", True, False, 7),
        (128, 256, 3, 2, 0, "bf16", False, False, 3),
        # tail split (TAIL: whole tiles, then split units of the last wave): the planner's M=4096
        # N=2112 config (128x256, 3 stages, TMA store) and the masked fp32 / 128x128 variants
        (128, 256, 3, 2, 0, "bf16", True, False, 5, True), (128, 256, 3, 1, 0, "fp32", True, False, 3, True),
        (128, 128, 5, 2, 0, "bf16", True, False, 14, True),
        # the unsplit build of that last config (the split builds' main loop is compared with it)
        (128, 128, 5, 2, 0, "bf16", True, False),
        # split_reduce "spread" (SPREAD): the 128x128 split 7 and the 128x256 tail-split config
        (128, 128, 5, 2, 0, "bf16", True, False, 7, False, True), (128, 256, 3, 2, 0, "bf16", True, False, 5, True, True),
        # the 64-row tile of small M (one 4-warp partition, one half), split 6, both reductions
        (64, 128, 6, 2, 0, "bf16", False, False, 6), (64, 128, 6, 2, 0, "bf16", False, False, 6, False, True),
        # EPI 3 ("tma1": one shared output half tile per math partition): the 4-stage 128x256
        # ring it makes room for, unsplit and with the tail split (twins of the EPI 2 builds above)
        (128, 256, 4, 3, 0, "bf16", True, False), (128, 256, 4, 3, 0, "bf16", True, False, 5, True),
        # grouped tail split: contiguous 128x256 (the moe m=512 tile) and masked 64x128
        # (the m <= 64 tile, with its unsplit twin), both reductions
        (128, 256, 4, 1, 1, "bf16", True, False, 3, True), (128, 256, 4, 1, 1, "bf16", True, False, 3, True, True),
        (64, 128, 6, 1, 2, "bf16", False, False), (64, 128, 6, 1, 2, "bf16", False, False, 4, True),
        (64, 128, 6, 1, 2, "bf16", False, False, 4, True, True)]:
    nsk = sk[0] if sk else 1
    tail = bool(sk[1]) if len(sk) > 1 else False
    spread = bool(sk[2]) if len(sk) > 2 else False
    key = (f"wide_{bm}x{bn}_s{st}_epi{epi}_mode{mode}_{cdt}_split{int(split)}{'_dual' if dual else ''}"
           f"{f'_sk{nsk}' if nsk > 1 else ''}{'_tail' if tail else ''}{'_spread' if spread else ''}")
    cfg = HopperConfig("wide", bm, bn, bm // 16, st, epilogue={1: "masked", 2: "tma", 3: "tma1"}[epi], split_wg=split,
                       split_k=1 if tail else nsk, tail_split=nsk if tail else 1)
    warps = 4 if split else bm // 16
    rows = bm // 2 if split else bm
    try:
        sig = wsig(bm, 128 if dual else bn, cdt, rows)
        const = {"GROUP_M": 8, "STAGES": st, "NH": bn // 128, "EPI": epi, "MODE": mode, "E_POW2": 16,
                 "SPLIT_WG": split, "DUAL": dual, "SPLIT": nsk, "num_warps": warps}
        if tail or spread:
            sig["TAIL"] = "constexpr"
            const["TAIL"] = tail
        attrs = None
        if spread:
            sig["SPREAD"] = "constexpr"
            const["SPREAD"] = True
            # the launcher's usual specialisation: 16-byte aligned pointers, N and strides % 16 == 0
            names = W.fp8_block_gemm_wide_kernel.arg_names
            attrs = {(names.index(a),): [["tt.divisibility", 16]]
                     for a in ("c_ptr", "ws_ptr", "cnt_ptr", "sa_ptr", "sb_ptr", "M", "N", "K", "stride_cm")}
        # (TAIL / SPREAD left out above: their defaults, spelled out for triton >= 3.7)
        sig, const = with_defaults(W.fp8_block_gemm_wide_kernel, sig, const)
        k = triton.compile(GluonASTSource(W.fp8_block_gemm_wide_kernel, sig, constexprs=const, attrs=attrs),
                           target=TGT, options={"num_warps": warps})
    except Exception as e:
        out[key] = {"error": f"{type(e).__name__}: {str(e)[-800:]}"}
        continue
    ptx = k.asm["ptx"]
    rec = {"wgmma": sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.[\w\.]+", ptx))),
           "tma_load": ptx.count("cp.async.bulk.tensor.2d.shared"), "tma_store": ptx.count("cp.async.bulk.tensor.2d.global"),
           "setmaxnreg": ptx.count("setmaxnreg"), "shared": k.metadata.shared,
           "smem_estimate": cfg.smem_bytes({"bf16": 2, "fp16": 2, "fp32": 4}[cdt], dual=dual),
           "ex2": ptx.count("ex2.approx"), "atom": len(re.findall(r"\batom\.", ptx)),
           "atom_acq_rel": ptx.count("atom.global.gpu.acq_rel.add"),
           "atom_exch": ptx.count("atom.global.gpu.relaxed.exch"),
           "ld_cg": ptx.count("ld.global.cg"), "arrive_barriers": barrier_before_atomics(ptx),
           "poll_acquire": ptx.count("ld.global.gpu.acquire.b32"),
           "ld_v4": len(re.findall(r"\bld\.global\.v4\.(?:b32|f32)\b", ptx)),
           "poll_then_barrier": barrier_after_polls(ptx),
           "atom_relaxed_add": ptx.count("atom.global.gpu.relaxed.add"),
           "wgmma_n": ptx.count("wgmma.mma_async"), "tma_copies": ptx.count("cp.async.bulk.tensor"),
           "store_waits": ptx.count("cp.async.bulk.wait_group.read"),
           "waits_between_stores": waits_between_tma_stores(ptx),
           "sa_copies": len(re.findall(r"cp\.async\.c[ag]\.shared\.global", ptx)),
           "sa_arrive_noinc": ptx.count("cp.async.mbarrier.arrive.noinc")}
    rec.update(ptxas_stats(ptx))
    out[key] = rec
# the two masked stores as the launcher specialises them: EPI 0 where N and stride_cm are not
# multiples of 16 (the output's rows cannot be stored in vectors), EPI 1 (grouped mode 1) where they are
# (64x128 tiles: the store is the same function at every tile size, and the 128x256 builds took
# ~2 minutes of CI's AOT step on triton 3.9)
# and the spread split-K reduction at EPI 0 (its partial loads and stores one output per thread too)
for key, epi, mode, div, nsk in (("oddrows_wide_64x128_s6_epi0_mode0_bf16_split0", 0, 0, (), 1),
                                 ("vecrows_wide_64x128_s6_epi1_mode0_bf16_split0", 1, 0, ("N", "stride_cm"), 1),
                                 ("oddrows_wide_64x128_s6_epi0_mode0_bf16_split0_sk6_spread", 0, 0, (), 6)):
    try:
        names = W.fp8_block_gemm_wide_kernel.arg_names
        sig = wsig(64, 128, "bf16", 64)
        const = {"GROUP_M": 8, "STAGES": 6, "NH": 1, "EPI": epi, "MODE": mode, "E_POW2": 16,
                 "SPLIT_WG": False, "DUAL": False, "SPLIT": nsk, "num_warps": 4}
        if nsk > 1:
            sig.update(TAIL="constexpr", SPREAD="constexpr")
            const.update(TAIL=False, SPREAD=True)
        sig, const = with_defaults(W.fp8_block_gemm_wide_kernel, sig, const)
        attrs = {(names.index(a),): [["tt.divisibility", 16]]
                 for a in ("c_ptr", "sa_ptr", "sb_ptr", "M", "K", *div, *(("ws_ptr", "cnt_ptr") if nsk > 1 else ()))}
        k = triton.compile(GluonASTSource(W.fp8_block_gemm_wide_kernel, sig, constexprs=const, attrs=attrs),
                           target=TGT, options={"num_warps": 4})
        ptx = k.asm["ptx"]
        rec = {"st_b16": ptx.count("st.global.b16"), "st_vector": len(re.findall(r"st\.global\.v\d", ptx)),
               "one_per_thread": bool(re.search(r"sizePerThread = \[1, 1\], threadsPerWarp = \[1, 32\]",
                                                k.asm["ttgir"])),
               "tma_store": ptx.count("cp.async.bulk.tensor.2d.global"),
               "ld_cg": ptx.count("ld.global.cg"),
               "ld_v4": len(re.findall(r"\bld\.global\.v4\.(?:b32|f32)\b", ptx)),
               "ld_scalar": len(re.findall(r"\bld\.global\.(?:b32|f32)\b", ptx)),
               "poll_acquire": ptx.count("ld.global.gpu.acquire.b32")}
        rec.update(ptxas_stats(ptx))
    except Exception as e:
        rec = {"error": f"{type(e).__name__}: {str(e)[-800:]}"}
    out[key] = rec
# the skinny decode kernel (swap-AB): activation rows padded to 8..64, weight tiles 64 / 128
def ssig(mp, bn, out):
    la = gl.NVMMASharedLayout.get_default_for([mp, 128], gl.float8e4nv)
    lb = gl.NVMMASharedLayout.get_default_for([bn, 128], gl.float8e4nv)
    return {"a_desc": f"tensordesc<fp8e4nv[{mp}, 128],{la!r}>", "b_desc": f"tensordesc<fp8e4nv[{bn}, 128],{lb!r}>",
            "sa_ptr": "*fp32", "sb_ptr": "*fp32", "c_ptr": out, "ws_ptr": "*fp32", "cnt_ptr": "*i32",
            "M": "i32", "N": "i32", "K": "i32", "kb_per_split": "i32", "SPLIT": "i32",
            "stride_sam": "i32", "stride_sak": "i32", "stride_sbn": "i32", "stride_sbk": "i32", "stride_cm": "i32",
            "STAGES": "constexpr", "num_warps": "constexpr"}

for mp, bn, st, cdt in [(8, 64, 5, "bf16"), (16, 128, 2, "bf16"), (32, 64, 3, "fp16"), (64, 128, 2, "fp32"),
                        (64, 64, 9, "bf16")]:
    key = f"skinny_{mp}x{bn}_s{st}_{cdt}"
    cfg = HopperConfig("skinny", mp, bn, 4, st)
    try:
        # the workspace 16-byte aligned, as Triton specialises it at a launch (torch allocations)
        k = triton.compile(GluonASTSource(S.fp8_block_gemm_skinny_kernel, ssig(mp, bn, "*" + cdt),
                                          constexprs={"STAGES": st, "num_warps": 4},
                                          attrs={(S.fp8_block_gemm_skinny_kernel.arg_names.index("ws_ptr"),): [["tt.divisibility", 16]]}), target=TGT,
                           options={"num_warps": 4})
    except Exception as e:
        out[key] = {"error": f"{type(e).__name__}: {str(e)[-800:]}"}
        continue
    ptx = k.asm["ptx"]
    rec = {"wgmma": sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.[\w\.]+", ptx))),
           "tma_load": ptx.count("cp.async.bulk.tensor.2d.shared"), "shared": k.metadata.shared,
           "smem_estimate": cfg.smem_bytes(), "atom_acq_rel": ptx.count("atom.global.gpu.acq_rel.add"),
           "atom_exch": ptx.count("atom.global.gpu.relaxed.exch"), "ld_cg": ptx.count("ld.global.cg"),
           "arrive_barriers": barrier_before_atomics(ptx), "st_v4": sorted(set(re.findall(r"st\.global\.v4\.\w+", ptx))),
           "ld_v4": sorted(set(re.findall(r"ld\.global\.v4\.\w+", ptx)))}
    rec.update(ptxas_stats(ptx))
    out[key] = rec
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def compiled():
    return run_compile_script(SCRIPT)


# ------------------------------------------------------------------ launcher (CPU-side checks)
def _operands(m=4, n=256, k=256, dev="cpu"):
    from blockscaled.reference.quantize import quantize

    torch.manual_seed(0)
    a = quantize(torch.randn(m, k), "fp8_block")
    b = quantize(torch.randn(n, k), "fp8_block", block=(128, 128))
    return a, b


def test_masked_epilogue_choice_cpu():
    """The wide kernel's masked store: 16-byte vectors (EPI 1) only where the compiler can vectorise
    them (N and the row stride multiples of 16 elements, a 16-byte aligned base), else one output
    per thread (EPI 0)."""
    from blockscaled.ops._hopper import _masked_epi

    assert _masked_epi(torch.empty(4, 32, dtype=torch.bfloat16)) == 1
    assert _masked_epi(torch.empty(4, 7, dtype=torch.bfloat16)) == 0
    assert _masked_epi(torch.empty(4, 24, dtype=torch.bfloat16)) == 0  # 16-byte rows, N % 16 != 0
    assert _masked_epi(torch.empty(4, 16, dtype=torch.float32)) == 1
    assert _masked_epi(torch.empty(4, 4, dtype=torch.float32)) == 0
    assert _masked_epi(torch.empty(2, 4, 16, dtype=torch.bfloat16).view(8, 16)) == 1  # grouped: rows x N
    assert _masked_epi(torch.empty(4, 48, dtype=torch.bfloat16)[:, 16:32]) == 1  # 32-byte offset, stride 48
    assert _masked_epi(torch.empty(4, 40, dtype=torch.bfloat16)[:, 1:17]) == 0  # base 2 bytes off


def test_unsupported_reasons_cpu():
    from blockscaled.ops._hopper import HopperUnsupported, gemm_fp8_block_hopper, unsupported_reason

    a, b = _operands()
    r = unsupported_reason(a, b)
    assert r is not None and "CUDA" in r
    with pytest.raises(NotImplementedError, match="CUDA"):
        gemm_fp8_block_hopper(a, b)
    with pytest.raises(HopperUnsupported):
        gemm_fp8_block_hopper(a, b)
    assert "b.block" in unsupported_reason(a, _operands(m=256)[0])  # 1x128 weight blocks
    assert "ScaledTensor" in unsupported_reason(torch.zeros(4, 256), b)


#: the DeepSeek-V3 weight shapes (N, K) and two odd ones
PLAN_NK = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048), (520, 1040),
           (16, 16))


def _hopper_candidates(m, n, k, out_dtype="bfloat16"):
    """The Hopper configurations the planner considers for a dense fp8_block GEMM on an H100."""
    from blockscaled.plan import H100_SXM, Problem
    from blockscaled.plan.dense import fp8_candidates

    return fp8_candidates(Problem("gemm", "fp8_block", m, n, k, out_dtype=out_dtype), H100_SXM, gemv=False,
                          portable=False, dequant=False)


def test_hopper_config_validation():
    from blockscaled.ops._hopper import HopperConfig

    with pytest.raises(ValueError, match="variant"):
        HopperConfig(variant="nope")
    with pytest.raises(ValueError, match="num_warps"):
        HopperConfig(block_m=128, num_warps=4)
    with pytest.raises(ValueError, match="block_m"):
        HopperConfig(block_m=32, num_warps=4)
    with pytest.raises(ValueError, match="block_n"):
        HopperConfig(block_n=64)
    assert HopperConfig().variant == "wide"
    # every Hopper candidate of the planner is valid and fits the H100's shared memory (the wide
    # kernel's ring next to the output tile of the call's dtype); skinny only for M <= 64
    for m in (1, 64, 128, 4096):
        for n, k in PLAN_NK:
            for out_dtype, es in (("bfloat16", 2), ("float32", 4)):
                cands = _hopper_candidates(m, n, k, out_dtype)
                assert {c.variant for c in cands} == ({"wide", "skinny"} if m <= 64 else {"wide"}), (m, n, k)
                for cfg in cands:
                    assert cfg.stages >= 2, (m, n, k, cfg)
                    assert cfg.smem_bytes(es if cfg.variant == "wide" else 4) <= 232448, (m, n, k, cfg)


def _spill_budget(key: str) -> int:
    """Spill bytes allowed per wide-kernel build: dense and grouped 0 (grouped builds spilled
    64-76 B and ran their K loop as divergent code until the tile's expert and rows were made
    provably warp-uniform: _common._warp_uniform); the tail split with the
    masked epilogue 8 B dense, 16 B grouped (ptxas sm_90: it compiles the masked whole-tile
    store next to the split finish; one 64-bit value stored once per partition at the kernel
    start and loaded in the epilogue, the K loops have no LDL/STL (SASS); the same
    configs without TAIL have 0); the single 8-warp math partition's
    split-K 24 B, in the split finish after the K loop (checked in the SASS; not a
    planned config: the planner runs one partition per warpgroup)."""
    known = KNOWN_SPILL_STORES.get(_TRITON_MINOR, {}).get(key, 0)
    if "_split0_" in key and "_sk" in key:
        return max(32, known)
    if "_tail" in key and "_epi1_" in key:
        return max(16 if "_mode0_" not in key else 8, known)
    return known


# Spill-store bytes of builds that triton 3.9 spills beyond the budgets above, from the same PTX
# source: 3.9 assembles sm_90 with its CUDA 13.4 ptxas (PTX 9.4) and passes --regAllocOptLevel=2
# (triton's workaround "for a ptxas 13.x bug"); that ptxas without the flag, and triton 3.6-3.8
# (CUDA 12.8 / 12.9 ptxas, 3.7+ with the same flag), build them within the budgets. All are
# fused split-K builds (the split finish holds both halves' accumulators plus the reduction).
# Measured values are ceilings (growth still fails); no other release or build gets any.
_TRITON_MINOR = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", triton.__version__).groups())
KNOWN_SPILL_STORES = {
    (3, 9): {
        "wide_128x256_s3_epi2_mode0_bf16_split1_sk3": 192,
        "wide_128x256_s4_epi1_mode0_bf16_split1_sk3": 232,
        "wide_128x256_s3_epi1_mode0_fp32_split1_sk3": 236,
        "wide_128x128_s5_epi2_mode0_fp16_split1_sk3": 92,
        "wide_128x128_s5_epi2_mode0_fp32_split1_sk3": 104,
        "wide_128x128_s5_epi2_mode0_bf16_split1_sk7": 92,
        "wide_128x256_s3_epi2_mode0_bf16_split0_sk3": 112,
        "wide_128x256_s3_epi2_mode0_bf16_split1_sk5_tail": 208,
        "wide_128x256_s3_epi1_mode0_fp32_split1_sk3_tail": 260,
        "wide_128x128_s5_epi2_mode0_bf16_split1_sk14_tail": 108,
        "wide_64x128_s6_epi2_mode0_bf16_split0_sk6": 48,
        "wide_128x256_s4_epi3_mode0_bf16_split1_sk5_tail": 208,
        "wide_128x256_s4_epi1_mode1_bf16_split1_sk3_tail": 368,
        "wide_128x256_s4_epi1_mode1_bf16_split1_sk3_tail_spread": 32,
    },
}


def _tma_epi(key: str) -> bool:
    """A wide build with a TMA-store epilogue (EPI 2 or 3)."""
    return "_epi2_" in key or "_epi3_" in key


def test_wide_kernel(compiled):
    keys = [k for k in compiled if k.startswith("wide_")]
    assert len(keys) == 36, keys
    for key in keys:
        c = compiled[key]
        assert "error" not in c, (key, c)
        # 128-column halves: one m64n128k32 FP8 wgmma per warpgroup per 32 K
        assert c["wgmma"] == ["wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"], (key, c["wgmma"])
        assert c["tma_load"] >= 2, (key, c)
        assert c["setmaxnreg"] > 0, (key, c)  # warp-specialised: 1-warp TMA producer
        assert c["shared"] <= 232448, (key, c)
        if _tma_epi(key) and not (key.endswith("_spread") and "_tail" not in key):
            # (a spread split unit stores its share of the tile with plain stores: no TMA store
            # when every unit is a split unit)
            assert c["tma_store"] >= 1, (key, c)
        if c.get("spill_stores") is not None:
            assert not c["wgmma_serialized"], (key, c)
            assert c["spill_stores"] <= _spill_budget(key), (key, c)
        if "_epi1_" in key and c["smem_estimate"] is not None:
            assert c["shared"] <= c["smem_estimate"], (key, c)
        # A scales: 128-column tiles stage them through the ring (the producer's
        # cp.async, counted by the ready barrier with .noinc arrivals); 128x256 tiles and SwiGLU load
        # them in the math warps
        one_half = "x128_" in key and not key.endswith("_dual")
        assert (c["sa_copies"] >= 1 and c["sa_arrive_noinc"] >= 1) == one_half, (key, c)
        if key.endswith("_dual"):
            # SwiGLU: three TMA boxes per K block (A, gate, up) and the exp of silu in the epilogue
            assert c["tma_load"] >= 3, (key, c)
            assert c["ex2"] >= 1, (key, c)
            if "_epi2_" in key:
                assert c["shared"] <= c["smem_estimate"], (key, c)
        else:
            assert c["ex2"] == 0, (key, c)


def test_wide_masked_store_unaligned_rows(compiled):
    """EPI 0 (N or the output's row stride not a multiple of 16): scalar 16-bit stores from a layout
    with one output per thread and 32 threads along N (a warp's store covers 64 contiguous bytes: whole sectors;
    the 8-per-thread layout wrote 2 of every 16 bytes per instruction and ran the kernel 2-2.4x
    slower at N % 8 != 0), no TMA store, no spills."""
    c = compiled["oddrows_wide_64x128_s6_epi0_mode0_bf16_split0"]
    assert "error" not in c, c
    assert c["one_per_thread"], c
    assert c["st_b16"] > 0 and c["st_vector"] == 0 and c["tma_store"] == 0, c
    if c.get("spill_stores") is not None:
        assert c["spill_stores"] == 0 and not c["wgmma_serialized"], c
    # EPI 1 where N and the row stride are specialised as multiples of 16 (ops/_hopper.py,
    # _masked_epi): 16-byte vector stores, no scalar ones
    v = compiled["vecrows_wide_64x128_s6_epi1_mode0_bf16_split0"]
    assert "error" not in v, v
    assert v["st_vector"] > 0 and v["st_b16"] == 0 and not v["one_per_thread"], v
    # the spread split-K reduction there (wide.py, spread_vec): one partial per thread read back
    # from L2, scalar stores, no vectors, still no spills (4 per thread: 56.8 us against 42.0 unsplit,
    # H200 3125 x 3071 x 1472)
    r = compiled["oddrows_wide_64x128_s6_epi0_mode0_bf16_split0_sk6_spread"]
    assert "error" not in r, r
    assert r["poll_acquire"] > 0 and r["ld_cg"] == 0 and r["ld_v4"] == 0 and r["ld_scalar"] > 0, r
    assert r["st_b16"] > 0 and r["st_vector"] == 0 and r["tma_store"] == 0, r
    if r.get("spill_stores") is not None:
        assert r["spill_stores"] == 0 and not r["wgmma_serialized"], r


def test_wide_split_k(compiled):
    """Fused split-K (SPLIT > 1, dense): one acq_rel arrival atomic and one counter reset per
    math partition, plain read-back of the partials (no .cg: the acq_rel arrival invalidates the
    SM's L1), the arrival barrier a named barrier of
    the partition's own threads (``bar.sync id, 128`` per 4-warp partition, ``bar.sync 0, 256``
    for the single 8-warp one; a CTA-wide ``barrier.sync`` there would also wait for the
    producer warp and the other math partition: deadlock / serialisation), no spills, the same
    wgmma and TMA instructions as the SPLIT 1 kernel of the same config; SPLIT 1 has no atomics."""
    split_keys = [k for k in compiled if k.startswith("wide_") and "_sk" in k and not k.endswith("_spread")]
    assert len(split_keys) == 14, split_keys
    for key in split_keys:
        c = compiled[key]
        assert "error" not in c, (key, c)
        ncons = 2 if "_split1" in key else 1  # math partitions
        assert c["atom_acq_rel"] == ncons and c["atom_exch"] == ncons, (key, c)
        assert c["atom"] == 2 * ncons, (key, c)  # nothing else uses atomics
        assert c["ld_cg"] == 0, (key, c)  # plain loads: the acquire invalidated the SM's L1
        assert len(c["arrive_barriers"]) == ncons, (key, c)
        ids = set()
        for bar in c["arrive_barriers"]:
            m = re.fullmatch(r"bar\.sync (\d+), (\d+);", bar)
            threads = 128 if key.startswith("wide_64x") else 512 // (2 * ncons)  # the partition's threads only
            assert m and int(m.group(2)) == threads, (key, bar)
            ids.add(m.group(1))
        assert len(ids) == ncons, (key, c["arrive_barriers"])  # each partition its own barrier id
        assert c["shared"] <= 232448, (key, c)
        if c.get("spill_stores") is not None:
            assert c["spill_stores"] <= _spill_budget(key), (key, c)
            assert not c["wgmma_serialized"], (key, c)
        base = compiled.get(key.rsplit("_sk", 1)[0])
        if key.endswith("_tail"):
            # tail split: the split finish AND the whole-tile epilogue: more TMA stores than the
            # split-only build of the same config (where one is compiled), at least the base's
            prefix = key.rsplit("_sk", 1)[0]
            only = [compiled[k] for k in split_keys if k.startswith(prefix + "_sk") and not k.endswith("_tail")]
            assert base is not None or only, key
            if _tma_epi(key):
                for o in only:
                    assert c["tma_store"] > o["tma_store"], (key, c, o)
                if base is not None:
                    assert c["tma_store"] >= base["tma_store"] > 0, (key, c, base)
        if base is not None:  # same config without split-K: same main loop (the tail split adds stores)
            what = "tma_load" if key.endswith("_tail") else "tma_copies"
            assert (c["wgmma_n"], c[what]) == (base["wgmma_n"], base[what]), (key, c, base)
    for key in compiled:
        if key.startswith("wide_") and "_sk" not in key:
            assert compiled[key]["atom"] == 0, (key, compiled[key]["atom"])  # SPLIT 1: no atomics


def test_wide_tma1_epilogue(compiled):
    """EPI 3 ("tma1"): the same TMA store sites as the EPI 2 twin (3 stages, a shared tile per
    half), a wait for the first half's store to have read the one buffer before the second half
    is written (more bulk-group waits than the twin), 4 stages within the H100's shared memory
    and its estimate (HopperConfig.smem_bytes), no spills."""
    keys = [k for k in compiled if "_epi3_" in k]
    assert len(keys) == 2, keys
    for key in keys:
        c = compiled[key]
        twin = compiled[key.replace("_s4_epi3_", "_s3_epi2_")]
        assert "error" not in c and "error" not in twin, (key, c, twin)
        assert c["tma_store"] == twin["tma_store"] > 0, (key, c, twin)
        assert c["store_waits"] > twin["store_waits"], (key, c, twin)
        # every TMA store reuses the partition's one buffer only after the previous store read it;
        # the EPI 2 twin stores its two halves back to back (the check can tell them apart)
        assert c["waits_between_stores"] and all(c["waits_between_stores"]), (key, c["waits_between_stores"])
        assert not all(twin["waits_between_stores"]), (key, twin["waits_between_stores"])
        assert c["shared"] <= min(c["smem_estimate"], 232448), (key, c)
        assert (c["wgmma_n"], c["tma_load"]) == (twin["wgmma_n"], twin["tma_load"]), (key, c, twin)
        if c.get("spill_stores") is not None:
            # (0 for both builds except on triton 3.9: KNOWN_SPILL_STORES)
            assert c["spill_stores"] <= _spill_budget(key) and not c["wgmma_serialized"], (key, c)


def test_wide_split_spread(compiled):
    """split_reduce "spread" (SPREAD; the 128-row two-partition and the 64-row tiles): per math
    partition the arrival (acq_rel add) behind the partition's named barrier, an acquire
    poll of the counter (the wait for the tile's other units), the departure (relaxed add) and
    the reset (exch), nothing else atomic; the partials read back with 16-byte plain loads (the
    acquire poll invalidates the SM's L1); no
    spills; the same wgmma instructions and TMA loads as the last-arriver build, and its TMA
    stores less the split finish's (a spread unit stores its share with plain stores)."""
    keys = [k for k in compiled if k.startswith("wide_") and k.endswith("_spread")]  # (oddrows_: its own test)
    assert len(keys) == 5, keys
    for key in keys:
        c = compiled[key]
        assert "error" not in c, (key, c)
        ncons = 2 if "_split1" in key else 1
        assert (c["atom_acq_rel"], c["atom_relaxed_add"], c["atom_exch"]) == (ncons,) * 3, (key, c)
        assert c["atom"] == 3 * ncons and c["poll_acquire"] >= ncons, (key, c)
        # ordering: the partition's own named barrier before each arrival (its threads' partial
        # stores happen before the release), and a barrier between each poll and the reads
        threads = 128
        assert len(c["arrive_barriers"]) == ncons, (key, c)
        for bar in c["arrive_barriers"]:
            m = re.fullmatch(r"bar\.sync (\d+), (\d+);", bar)
            assert m and int(m.group(2)) == threads, (key, bar)
        assert c["poll_then_barrier"] and all(c["poll_then_barrier"]), (key, c["poll_then_barrier"])
        assert c["ld_v4"] > 0 and c["ld_cg"] == 0, (key, c)  # 16-byte plain loads after the poll
        if c.get("spill_stores") is not None:
            assert c["spill_stores"] <= _spill_budget(key) and not c["wgmma_serialized"], (key, c)
        last = compiled[key[: -len("_spread")]]
        assert (c["wgmma"], c["wgmma_n"], c["tma_load"]) == (last["wgmma"], last["wgmma_n"], last["tma_load"]), (
            key, c, last)
        # TMA stores: only the whole tiles' epilogue (tail split) is left
        # (grouped builds store with the masked epilogue: no TMA store in either)
        assert c["tma_store"] == (last["tma_store"] - 2 * ncons if "_tail" in key and _tma_epi(key) else 0), (
            key, c, last)


def test_spread_allowed_env(monkeypatch):
    """The spread reduction waits for other programs: off where the environment asks for "last" or
    MPS may withhold SMs (an active-thread percentage below 100)."""
    from blockscaled.ops._hopper import _spread_allowed

    monkeypatch.delenv("BLOCKSCALED_SPLIT_REDUCE", raising=False)
    monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", raising=False)
    assert _spread_allowed()
    for pct, ok in (("100", True), ("100.0", True), ("50", False), ("junk", False), ("", True)):
        monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", pct)
        assert _spread_allowed() is ok, pct
    monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    monkeypatch.setenv("BLOCKSCALED_SPLIT_REDUCE", "last")
    assert not _spread_allowed()
    monkeypatch.setenv("BLOCKSCALED_SPLIT_REDUCE", "spread")
    assert _spread_allowed()


def test_split_reduce_config():
    from blockscaled.ops._hopper import HopperConfig

    assert HopperConfig("wide", 128, 128, 8, 4, split_k=2).split_reduce == "spread"
    with pytest.raises(ValueError, match="split_reduce"):
        HopperConfig("wide", 128, 128, 8, 4, split_k=2, split_reduce="tree")


def test_split_k_config_and_plan():
    from blockscaled.ops._hopper import HopperConfig
    from blockscaled.plan.dense import MIN_KB_PER_SPLIT, SKINNY_PROGRAMS_PER_SM
    from blockscaled.plan.splits import split_plan_kb as _split_plan_kb

    with pytest.raises(ValueError, match="split_k"):
        HopperConfig(split_k=0)
    assert HopperConfig(variant="wide", block_n=256, split_k=4).split_k == 4
    # (splits launched, K blocks per split): no empty split
    assert _split_plan_kb(9, 3) == (3, 3)
    assert _split_plan_kb(5, 2) == (2, 3)
    assert _split_plan_kb(5, 4) == (3, 2)
    assert _split_plan_kb(1, 8) == (1, 1)
    assert _split_plan_kb(56, 1) == (1, 56)
    for nk in range(1, 70):
        for sk in range(1, 20):
            s, per = _split_plan_kb(nk, sk)
            assert 1 <= s <= max(1, min(sk, nk)) and (s - 1) * per < nk <= s * per, (nk, sk, s, per)
    # the planner's split candidates: the split is what the launcher runs (no empty range), each
    # range keeps >= MIN_KB_PER_SPLIT K blocks, the wide kernel's units fit one wave of the
    # persistent grid (splits only where tiles alone leave SMs idle; 128-column tiles only), the
    # skinny kernel's SKINNY_PROGRAMS_PER_SM programs per SM
    for m in (1, 64, 128, 200, 256):
        for n, k in PLAN_NK:
            nk = -(-k // 128)
            for cfg in _hopper_candidates(m, n, k):
                if cfg.split_k == 1:
                    continue
                launched, per = _split_plan_kb(nk, cfg.split_k)
                assert launched == cfg.split_k and per >= MIN_KB_PER_SPLIT, (m, n, k, cfg)
                if cfg.variant == "wide":
                    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
                    assert cfg.block_n == 128 and tiles * cfg.split_k <= 132, (m, n, k, cfg)
                else:
                    assert -(-n // cfg.block_n) * cfg.split_k <= SKINNY_PROGRAMS_PER_SM * 132, (m, n, k, cfg)


def test_short_k_raster():
    """Dense wide tiles at K <= 512 (4 K blocks) raster 32 row tiles per group (B read once per
    4096 rows; H100 M=4096 N=32768 K=512: 1.09x over 8), 8 from 5 K blocks on."""
    from blockscaled.plan.dense import SHORT_K_GROUP_M

    assert SHORT_K_GROUP_M == 32
    for m, n, k, g in [(4096, 32768, 512, 32), (4096, 32768, 513, 8), (8192, 7168, 384, 32), (4096, 24576, 1536, 8),
                       (4096, 7168, 2048, 8), (4096, 2112, 7168, 8)]:
        wide = [c for c in _hopper_candidates(m, n, k) if c.variant == "wide"]
        assert wide and all(c.group_m == g for c in wide), (m, n, k, wide)


def test_tail_split_config_and_plan():
    """HopperConfig.tail_split: validation, the grouped kernel's rule (tail_split_for: split the
    last partial wave's tiles into as many K ranges as fit one wave, >= 4 K blocks each, <= 16),
    the dense planner's tail-split candidates and the launcher's plan."""
    from blockscaled.ops._hopper import HopperConfig, _wide_split_plan
    from blockscaled.plan.dense import MIN_KB_PER_SPLIT
    from blockscaled.plan.grouped import tail_split_for
    from blockscaled.plan.splits import split_plan_kb

    for bad in (dict(tail_split=0), dict(variant="wide", split_k=2, tail_split=2)):
        with pytest.raises(ValueError, match="tail_split"):
            HopperConfig(**bad)
    # 288 tiles (M=4096 N=2112, 128x256) -> 2 full waves + 24 tiles -> 132 // 24 = 5 splits
    assert tail_split_for(288, 7168, 132) == 5
    assert tail_split_for(144, 7168, 132) == 11  # 12 tiles left: 11 ranges each fit one wave
    assert tail_split_for(136, 7168, 132) == 14  # 4 tiles left: 33 fit, 14 ranges of 4 blocks
    assert tail_split_for(136, 16384, 132) == 16  # capped at TAIL_SPLIT_MAX
    assert tail_split_for(4096, 512, 132) == 1  # short K: the split's fixed cost is not amortised
    assert tail_split_for(448, 2048, 132) == 1  # (H100: 16 K blocks lost 6-7%, TAIL_SPLIT_MIN_KB)
    assert tail_split_for(448, 4096, 132) == 2
    assert tail_split_for(264, 7168, 132) == 1  # no partial wave
    assert tail_split_for(100, 7168, 132) == 1  # no full wave (the small-M split_k handles it)
    assert tail_split_for(252, 7168, 132) == 1  # 120 left: more than half a wave
    # dense candidates: a tail split only where full waves leave a partial one, its units fit one
    # wave, >= MIN_KB_PER_SPLIT K blocks per range, the launcher runs exactly that split
    seen = 0
    for m in (512, 1000, 2048, 4096, 4100):
        for n, k in PLAN_NK:
            nk = -(-k // 128)
            for cfg in _hopper_candidates(m, n, k):
                if cfg.tail_split == 1:
                    continue
                seen += 1
                tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
                full = tiles // 132 * 132
                launched, per = split_plan_kb(nk, cfg.tail_split)
                assert cfg.split_k == 1 and 0 < full < tiles and (tiles - full) * launched <= 132, (m, n, k, cfg)
                assert launched == cfg.tail_split and per >= MIN_KB_PER_SPLIT, (m, n, k, cfg)
                assert _wide_split_plan(tiles, nk, cfg, 132) == (full, launched, per)
    assert seen, "no tail-split candidate on the grid"
    cfg = HopperConfig("wide", 128, 256, 8, 3, tail_split=5)
    assert _wide_split_plan(288, 56, cfg, 132) == (264, 5, 12)  # 56 blocks in 5: 12, 12, 12, 12, 8
    assert _wide_split_plan(264, 56, cfg, 132) == (264, 1, 56)
    assert _wide_split_plan(100, 56, cfg, 132) == (100, 1, 56)
    assert _wide_split_plan(288, 56, HopperConfig("wide", 128, 256, 8, 3), 132) == (288, 1, 56)
    # split_k: every tile split
    assert _wide_split_plan(17, 56, HopperConfig("wide", 128, 128, 8, 3, split_k=7), 132) == (0, 7, 8)

def test_skinny_kernel(compiled):
    """Swap-AB: the weight tile is the wgmma's M side (m64) and the padded activation rows its N
    (n8..n64), FP8 e4m3 inputs; weight and activation boxes through TMA; the split-K arrival
    (acq_rel add + relaxed reset) behind a CTA-wide barrier (``bar.sync 0``: every thread's
    partial store happens before the release; the kernel's ``cta_barrier``, spelled
    ``gl.thread_barrier`` before triton 3.7 and ``gl.barrier`` after); the partial stored and read
    back column-major in 16-byte vectors (a thread's 8 weight rows are contiguous) with plain loads
    (the acquire invalidates the SM's L1; no .cg); fits 4 programs' shared memory estimate; no spills."""
    keys = [k for k in compiled if k.startswith("skinny_")]
    assert len(keys) == 5, keys
    for key in keys:
        c = compiled[key]
        assert "error" not in c, (key, c)
        mp = int(key.split("_")[1].split("x")[0])
        assert c["wgmma"] == [f"wgmma.mma_async.sync.aligned.m64n{mp}k32.f32.e4m3.e4m3"], (key, c)
        assert c["tma_load"] >= 2, (key, c)
        assert c["atom_acq_rel"] == 1 and c["atom_exch"] == 1 and c["ld_cg"] == 0, (key, c)
        assert c["st_v4"] and c["ld_v4"], (key, c)
        assert [" ".join(b.split()) for b in c["arrive_barriers"]] == ["bar.sync 0;"], (key, c)
        assert c["shared"] <= c["smem_estimate"], (key, c)
        if c.get("spill_stores") is not None:
            assert c["spill_stores"] == 0, (key, c)


def test_skinny_config_and_candidates():
    from blockscaled.ops._hopper import HopperConfig
    from blockscaled.plan.dense import skinny_stages

    for bad, match in (({"block_m": 128}, "block_m"), ({"block_n": 256}, "block_n"), ({"num_warps": 8}, "num_warps"),
                       ({"stages": 1}, "stages"), ({"split_k": 0}, "split_k")):
        kw = {"block_m": 16, "block_n": 64, "num_warps": 4, "stages": 4, **bad}
        with pytest.raises(ValueError, match=match):
            HopperConfig("skinny", **kw)
    # the planner's skinny candidates: activation rows padded to a power of two >= 8, both weight
    # tile heights, the ring skinny_stages sizes (4 programs per SM where 2 stages leave room)
    for m in (1, 5, 8, 9, 16, 33, 64, 65, 128):
        for n, k in PLAN_NK:
            skinny = [c for c in _hopper_candidates(m, n, k) if c.variant == "skinny"]
            if m > 64:
                assert not skinny, (m, n, k)
                continue
            assert {c.block_n for c in skinny} == {64, 128}, (m, n, k)
            for c in skinny:
                assert c.block_m == max(8, 1 << (m - 1).bit_length()) and c.num_warps == 4, (m, n, k, c)
                assert c.stages == skinny_stages(c.block_m, c.block_n), (m, n, k, c)
                assert c.stages == 2 or 4 * c.smem_bytes() <= 232448, (m, n, k, c)


def test_grouped_tile_rule():
    """plan/grouped.py::grouped_hopper_config: the H100 moe sweep's winners (its docstring)."""
    from blockscaled.plan.grouped import grouped_hopper_config, grouped_raster

    def tile(*a, **kw):
        c = grouped_hopper_config(*a, **kw)
        return c.block_m, c.block_n, c.group_m, c.stages, c.epilogue

    assert tile(64, 4096, 7168) == (64, 128, 8, 6, "masked")
    assert tile(40, 2048, 2048, experts=4) == (64, 128, 8, 6, "masked")
    assert tile(128, 4096, 7168, experts=8) == (128, 128, 1, 5, "masked")
    assert tile(128, 7168, 2048, experts=4) == (128, 128, 1, 5, "masked")
    assert tile(128, 2048, 7168, experts=4)[:3] == (64, 128, 8)  # 64 tiles of 128x128 < SMs / 2
    assert tile(512, 4096, 7168, experts=8)[:3] == (128, 256, 8)
    assert tile(512, 1024, 7168, experts=8)[:3] == (128, 128, 1)
    assert (grouped_raster(128, 128), grouped_raster(64, 128), grouped_raster(128, 256)) == (1, 8, 8)
