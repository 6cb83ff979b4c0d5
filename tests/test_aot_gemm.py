"""The dense GEMM kernels compile for Hopper (sm_90) without a GPU.

Compiled in a subprocess without TRITON_INTERPRET (conftest sets it for this process).
Checks: the fp8_block kernel uses FP8 wgmma (``wgmma.mma_async ... e4m3``); MX/NV kernels
compile with bf16 wgmma (dequantize path) or FP8 wgmma (promote path); weight-only variants
compile; the shared memory of the planner's portable configs (large M, decode) fits the H100's
227 KB; the fused split-K kernel (decode) has its gpu-scope acq_rel tile counter, barrier and plain
partial loads (no .cg: the acquire invalidates the SM's L1); swap-AB tiles compile to narrow wgmma.
"""

from pathlib import Path

import pytest

from _aot import GEMM_SIG, WITH_DEFAULTS, run_compile_script

SCRIPT = GEMM_SIG + WITH_DEFAULTS + r'''
import json, re, sys
import torch
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from blockscaled.kernels.triton.gemm import gemm_kernel
from blockscaled.plan import H100_SXM, Problem
from blockscaled.plan.dense import plan_fp8
from blockscaled.plan.portable import default_promote

TGT = GPUTarget("cuda", 90, 32)
DIV16 = ("K", "N", "stride_am", "stride_bn", "stride_cm", "stride_cs", "k_per_split")
SDT = {0: "*fp32", 1: "*u8", 2: "*u8", 3: "*fp8e4nv"}
DDT = {0: "*fp8e4nv", 1: "*fp8e4nv", 2: "*u8", 3: "*u8"}

def comp(afmt, bfmt, promote, dot, bm, bn, bk, warps, stages, adt=None, split=1, even=True, out="*bf16", swap=False):
    sig = gemm_sig(adt or DDT[bfmt], SDT[bfmt], DDT[bfmt], out, split, ("SWAP_AB",) if swap else ())
    const = {"stride_ak": 1, "stride_ask": 1, "stride_bk": 1, "stride_bsk": 1, "stride_cn": 1,
             "A_FMT": afmt, "B_FMT": bfmt, "B_SCALE_ROWS": 128 if bfmt == 0 else 1, "PROMOTE": promote,
             "DOT_DTYPE": dot, "EVEN_K": even, "HAS_BIAS": True, "SPLIT_K": split, "GROUP_M": 8,
             "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
    if swap:
        const["SWAP_AB"] = True
        if split == 1:
            const.update(ws_ptr=None, cnt_ptr=None)
    sig, const = with_defaults(gemm_kernel, sig, const)  # ws_ptr / cnt_ptr / SWAP_AB / PDL left out
    attrs = {(i,): [["tt.divisibility", 16]] for i, (n, t) in enumerate(sig.items())
             if t != "constexpr" and (t.startswith("*") or n in DIV16)}
    src = triton.compiler.ASTSource(fn=gemm_kernel, signature=sig, constexprs=const, attrs=attrs)
    k = triton.compile(src, target=TGT, options={"num_warps": warps, "num_stages": stages})
    ptx = k.asm["ptx"]
    lines = [ln.strip() for ln in ptx.splitlines() if ln.strip()]
    atoms = [i for i, ln in enumerate(lines) if re.search(r"\batom\.", ln)]
    return {"wgmma": sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.[\w\.]+", ptx))),
            "mma": sorted(set(re.findall(r"\bmma\.sync\.aligned\.[\w\.]+", ptx))), "atom": len(atoms),
            "atom_ops": sorted(set(re.findall(r"\batom\.[\w\.]+", ptx))),
            "ld_cg": len(re.findall(r"\bld\.global\.cg\b", ptx)),
            # fp32 loads after the arrival atomic: the partials' read-back
            "ld_after_atom": len(re.findall(r"\bld\.global(?:\.v\d)?\.(?:f32|b32)\b",
                                            "\n".join(lines[atoms[0]:]))) if atoms else 0,
            # the instructions just before the first atomic: the CTA barrier must come after the
            # partial stores and before the release
            "before_atom": lines[max(0, atoms[0] - 12):atoms[0]] if atoms else [],
            "shared": k.metadata.shared}

def portable(m, n, k):
    """The planner's portable fp8_block tiles on an H100 (what runs where the Hopper kernels and
    the GEMV cannot: a bias, 1x128 weight blocks, operands TMA cannot describe)."""
    return plan_fp8(Problem("gemm", "fp8_block", m, n, k), H100_SXM, hopper=False, forced_strategy="triton").config

out = {}
f8, bf = tl.float8e4nv, tl.bfloat16
for name, (m, n, k) in (("fp8_block_large", (4096, 7168, 16384)), ("fp8_block_decode", (1, 2112, 7168))):
    cfg = portable(m, n, k)
    out[name] = comp(0, 0, True, f8, cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages,
                     split=cfg.split_k, swap=cfg.swap_ab)
    out[name]["cfg"] = str(cfg)
out["swap_fp8_split"] = comp(0, 0, True, f8, 16, 64, 128, 4, 4, split=8, swap=True)
out["swap_fp8_nosplit"] = comp(0, 0, True, f8, 16, 128, 128, 4, 4, swap=True)
out["swap_mxfp8_split"] = comp(1, 1, True, f8, 16, 64, 32, 4, 6, split=4, swap=True, even=False)
out["swap_nvfp4_split"] = comp(3, 3, False, bf, 16, 64, 128, 4, 4, split=4, swap=True)
for name, code in (("mxfp8", 1), ("mxfp4", 2), ("nvfp4", 3)):
    for m in (64, 1024):
        promote = default_promote(name, m, None)
        bk = 32 if promote else 128
        c = comp(code, code, promote, f8 if promote else bf, 128 if m > 64 else 64, 128, bk, 8 if m > 64 else 4,
                 3, even=False)
        out[f"{name}_{m}"] = c
    for adt, dot, promote in (("*bf16", bf, False), ("*fp16", tl.float16, True)):
        bk = 128 if not promote else (16 if code == 3 else 32)
        out[f"wo_{name}_{adt}"] = comp(4, code, promote, dot, 64, 128, bk, 4, 3, adt=adt)
out["wo_fp8_block_bf16"] = comp(4, 0, True, bf, 64, 128, 128, 4, 3, adt="*bf16")
out["fp8_block_fp32out_tail"] = comp(0, 0, True, f8, 128, 128, 128, 8, 3, even=False, out="*fp32")
# the reason ops.gemm._check_config rejects block_k < 32 FP8 dots on CUDA
try:
    comp(1, 1, True, f8, 64, 32, 16, 4, 2, even=False)
    out["fp8_dot_k16"] = "compiled"
except Exception as e:
    msg = str(e) + " | " + str(e.__cause__) + " | " + str(e.__context__)
    out["fp8_dot_k16"] = "K >= 32" if "K >= 32" in msg else msg[-800:]
# fused split-K variants: swap_fp8_split above (fp8_block), mxfp8 promote, nvfp4 dequantize, weight-only
out["splitk_mxfp8"] = comp(1, 1, True, f8, 64, 64, 32, 4, 6, split=8)
out["splitk_nvfp4"] = comp(3, 3, False, bf, 16, 64, 128, 4, 6, split=4, even=False, out="*fp32")
out["splitk_wo_bf16"] = comp(4, 1, False, bf, 64, 64, 128, 4, 4, adt="*bf16", split=3)
# DUAL mode of the core (the test kernel in tests/test_gemm.py): shares A, two accumulators
sys.path.insert(0, TESTS_DIR)
from test_gemm import _dual_test_kernel
for name, code, promote, dot, bk in (("fp8_block", 0, True, f8, 128), ("mxfp8", 1, False, bf, 128),
                                     ("nvfp4", 3, False, bf, 128)):
    sig = {"a_ptr": DDT[code], "a_s_ptr": SDT[code], "b_ptr": DDT[code], "b_s_ptr": SDT[code], "b2_ptr": DDT[code],
           "b2_s_ptr": SDT[code], "c_ptr": "*fp32", "c2_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
           "stride_am": "i32", "stride_asm": "i32", "stride_bn": "i32", "stride_bsn": "i32",
           "A_FMT": "constexpr", "B_FMT": "constexpr", "B_SCALE_ROWS": "constexpr", "PROMOTE": "constexpr",
           "DOT_DTYPE": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
    const = {"A_FMT": code, "B_FMT": code, "B_SCALE_ROWS": 128 if code == 0 else 1, "PROMOTE": promote,
             "DOT_DTYPE": dot, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": bk}
    attrs = {(i,): [["tt.divisibility", 16]] for i, (n, t) in enumerate(sig.items())
             if t.startswith("*") or n in ("K", "N", "stride_am", "stride_bn")}
    k = triton.compile(triton.compiler.ASTSource(fn=_dual_test_kernel, signature=sig, constexprs=const, attrs=attrs),
                       target=TGT, options={"num_warps": 8, "num_stages": 3})
    out[f"dual_{name}"] = {"wgmma": sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.[\w\.]+", k.asm["ptx"]))),
                           "shared": k.metadata.shared}
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def compiled():
    return run_compile_script(SCRIPT.replace("TESTS_DIR", repr(str(Path(__file__).resolve().parent))))


def test_fp8_block_uses_fp8_wgmma(compiled):
    for key in ("fp8_block_large", "fp8_block_decode", "fp8_block_fp32out_tail"):
        w = compiled[key]["wgmma"]
        assert w and all("e4m3.e4m3" in x for x in w), (key, w)
    # the planner's portable configs fit in shared memory
    for key in ("fp8_block_large", "fp8_block_decode"):
        assert compiled[key]["shared"] <= 232448, (key, compiled[key]["cfg"])


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4"])
def test_mx_nv_kernels_compile(compiled, fmt):
    for m in (64, 1024):
        c = compiled[f"{fmt}_{m}"]
        assert c["wgmma"], (fmt, m, c)
        assert c["shared"] <= 232448
    assert compiled[f"wo_{fmt}_*bf16"]["wgmma"]
    fp16 = compiled[f"wo_{fmt}_*fp16"]
    assert fp16["wgmma"] or fp16["mma"], fp16


def test_weight_only_fp8_block_and_no_atomics(compiled):
    assert any("bf16" in x for x in compiled["wo_fp8_block_bf16"]["wgmma"])
    # SPLIT_K == 1 kernels have no atomics (and no split-K code at all)
    assert all(v.get("atom", 0) == 0 for key, v in compiled.items()
               if isinstance(v, dict) and not key.startswith(("splitk", "swap_", "fp8_block_")))
    assert compiled["swap_fp8_nosplit"]["atom"] == 0


def test_swap_ab_compiles_to_narrow_wgmma(compiled):
    """swap_ab: the weight tile is the wgmma's M side (64 rows per warpgroup) and 16 activation
    rows its N side: m64n16 instructions (FP8 for fp8_block / mxfp8 promote, bf16 for nvfp4)."""
    for key, want in (("swap_fp8_split", "m64n16k32.f32.e4m3.e4m3"), ("swap_fp8_nosplit", "m64n16k32.f32.e4m3.e4m3"),
                      ("swap_mxfp8_split", "m64n16k32.f32.e4m3.e4m3"), ("swap_nvfp4_split", "m64n16k16.f32.bf16.bf16")):
        w = compiled[key]["wgmma"]
        assert w and all(want in x for x in w), (key, w)
        assert compiled[key]["shared"] <= 232448


@pytest.mark.parametrize("key", ["swap_fp8_split", "splitk_mxfp8", "splitk_nvfp4", "splitk_wo_bf16",
                                 "swap_mxfp8_split", "swap_nvfp4_split"])
def test_fused_splitk_compiles_with_acq_rel_counter(compiled, key):
    """The fused split-K kernel compiles for sm_90: one gpu-scope acq_rel atomic add (the tile
    counter) after a CTA barrier, plain loads of the partials after it (no .cg: the acquire
    invalidates the SM's L1), the counter reset, and the same tensor-core path as the unsplit kernel."""
    c = compiled[key]
    assert "atom.global.gpu.acq_rel.add.u32" in c["atom_ops"], c["atom_ops"]
    assert any(op.startswith("atom.global") and ".exch" in op for op in c["atom_ops"]), c["atom_ops"]
    assert c["ld_cg"] == 0 and c["ld_after_atom"] > 0, c
    assert any(ln.startswith("bar.sync") for ln in c["before_atom"]), c["before_atom"]
    assert c["wgmma"] or c["mma"], c
    assert c["shared"] <= 232448
    if key == "swap_fp8_split":
        assert c["wgmma"] and all("e4m3.e4m3" in x for x in c["wgmma"]), c["wgmma"]


@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8", "nvfp4"])
def test_dual_mode_compiles(compiled, fmt):
    c = compiled[f"dual_{fmt}"]
    want = "e4m3.e4m3" if fmt == "fp8_block" else "bf16.bf16"
    assert c["wgmma"] and all(want in x for x in c["wgmma"]), c
    assert c["shared"] <= 232448


def test_fp8_dot_k16_does_not_compile(compiled):
    """Why gemm rejects promote=True, block_k < 32 with a quantized A on CUDA (H100 saw the same)."""
    assert compiled["fp8_dot_k16"] == "K >= 32", compiled["fp8_dot_k16"]
