"""The sm_90a builds of the MX path on the FP8 tensor cores (no GPU needed): the wide kernel with
per-32 A scales (ASUB 4, kernels/hopper/wide.py) and the activation encoder
(kernels/triton/mx_pack.py). Compiled in a subprocess without TRITON_INTERPRET."""

from __future__ import annotations

import pytest

from _aot import PTXAS_STATS, WITH_DEFAULTS, run_compile_script


_AOT = PTXAS_STATS + WITH_DEFAULTS + r'''
import json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from blockscaled.kernels.hopper import wide as W
TGT = GPUTarget("cuda", 90, 32)
out = {}
for bm, bn, st, epi, asub in [(128, 256, 3, 2, 4), (128, 128, 5, 2, 4), (128, 256, 3, 2, 1)]:
    la = gl.NVMMASharedLayout.get_default_for([bm, 128], gl.float8e4nv)
    lb = gl.NVMMASharedLayout.get_default_for([bn, 128], gl.float8e4nv)
    lc = gl.NVMMASharedLayout.get_default_for([64, 128], gl.bfloat16)
    bdesc = f"tensordesc<fp8e4nv[{bn}, 128],{lb!r}>"
    sig = {"a_desc": f"tensordesc<fp8e4nv[{bm}, 128],{la!r}>", "b_desc": bdesc, "b2_desc": bdesc,
           "c_desc": f"tensordesc<bf16[64, 128],{lc!r}>", "sa_ptr": "*fp32", "sb_ptr": "*fp32", "sb2_ptr": "*fp32",
           "c_ptr": "*bf16", "seg_ptr": "*i32", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32",
           "K": "i32", "E": "i32", "num_pid_m": "i32", "kb_per_split": "i32", "split_from": "i32",
           "stride_sam": "i32", "stride_sak": "i32", "stride_sbe": "i32", "stride_sbn": "i32", "stride_sbk": "i32",
           "stride_cm": "i32", "GROUP_M": "constexpr", "STAGES": "constexpr", "NH": "constexpr", "EPI": "constexpr",
           "MODE": "constexpr", "E_POW2": "constexpr", "SPLIT_WG": "constexpr", "DUAL": "constexpr",
           "SPLIT": "constexpr", "num_warps": "constexpr", "ASUB": "constexpr"}
    const = {"GROUP_M": 8, "STAGES": st, "NH": bn // 128, "EPI": epi, "MODE": 0, "E_POW2": 1, "SPLIT_WG": True,
             "DUAL": False, "SPLIT": 1, "num_warps": 4, "ASUB": asub}
    if asub > 1:
        sig["aflag_ptr"] = "*i32"
    sig, const = with_defaults(W.fp8_block_gemm_wide_kernel, sig, const)
    k = triton.compile(GluonASTSource(W.fp8_block_gemm_wide_kernel, sig, constexprs=const), target=TGT,
                       options={"num_warps": 4})
    ptx = k.asm["ptx"]
    rec = {"wgmma": sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.[\w\.]+", ptx))),
           "wgmma_n": ptx.count("wgmma.mma_async"), "waits": ptx.count("wgmma.wait_group"),
           "tma_store": ptx.count("cp.async.bulk.tensor.2d.global"), "shared": k.metadata.shared}
    rec.update(ptxas_stats(ptx))
    out[f"{bm}x{bn}_asub{asub}"] = rec
print(json.dumps(out))
'''


@pytest.mark.timeout(600)
def test_wide_mx_build_compiles_for_sm90():
    """ASUB 4 (per-32 A scales): both main loops in one build, the uniform one (a 128-wide wgmma
    chain: 4 k32 wgmmas, one wait per half) and the per-slice one (a wait after each k32 wgmma), so
    twice the wgmma instructions and 5x the waits of the fp8_block build; FP8 wgmma only, no
    spills, shared memory within the H100's 227 KB."""
    c = run_compile_script(_AOT)
    base = c["128x256_asub1"]
    for key in ("128x256_asub4", "128x128_asub4"):
        r = c[key]
        assert r["wgmma"] == ["wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"], (key, r)
        assert r["shared"] <= 232448 and r["tma_store"] >= 1, (key, r)
        if r.get("spill_stores") is not None:
            assert r["spill_stores"] == 0 and not r["wgmma_serialized"], (key, r)
    r = c["128x256_asub4"]
    assert r["wgmma_n"] == 2 * base["wgmma_n"] and r["waits"] == 5 * base["waits"], (r, base)


_AOT_ENC = r'''
import json, triton
from triton.backends.compiler import GPUTarget
from blockscaled.kernels.triton.mx_pack import mx_encode_kernel
out = {}
for fp4 in (True, False):
    sig = {"a_ptr": "*u8" if fp4 else "*fp8e4nv", "s_ptr": "*u8", "d_ptr": "*fp8e4nv", "o_ptr": "*fp32",
           "f_ptr": "*i32", "M": "i32", "K": "i32", "NBLK": "i32", "stride_am": "i32", "stride_sm": "i32",
           "stride_dm": "i32", "stride_om": "i32", "FP4": "constexpr", "LIMIT": "constexpr", "HEAD": "constexpr",
           "BLOCK_R": "constexpr", "GROUPS": "constexpr"}
    k = triton.compile(triton.compiler.ASTSource(mx_encode_kernel, sig, constexprs={
        "FP4": fp4, "LIMIT": 14 if fp4 else 0, "HEAD": 6 if fp4 else 0, "BLOCK_R": 16, "GROUPS": 4}),
        target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ptx = k.asm["ptx"]
    out["fp4" if fp4 else "fp8"] = {"cvt_e4m3": ptx.count("e4m3x2"), "atom": ptx.count("atom.global"),
                                    "ex2": ptx.count("ex2.approx")}
from blockscaled.kernels.triton.mx_pack import mx_quantize_encode_kernel
for xdt in ("bf16", "fp32"):
    sig = {"x_ptr": f"*{xdt}", "d_ptr": "*fp8e4nv", "o_ptr": "*fp32", "f_ptr": "*i32", "M": "i32", "K": "i32",
           "NBLK": "i32", "stride_xm": "i32", "stride_dm": "i32", "stride_om": "i32", "ROUND": "constexpr",
           "LIMIT": "constexpr", "HEAD": "constexpr", "BLOCK_R": "constexpr", "GROUPS": "constexpr",
           "GPU": "constexpr", "HW_CVT": "constexpr"}
    k = triton.compile(triton.compiler.ASTSource(mx_quantize_encode_kernel, sig, constexprs={
        "ROUND": 1, "LIMIT": 14, "HEAD": 6, "BLOCK_R": 16, "GROUPS": 4, "GPU": True, "HW_CVT": True}),
        target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ptx = k.asm["ptx"]
    out["fused_" + xdt] = {"cvt_e4m3": ptx.count("e4m3x2"), "atom": ptx.count("atom.global"),
                           "ex2": ptx.count("ex2.approx"), "ld_packed": ptx.count("ld.global.u8") + ptx.count("ld.global.b8")}
print(json.dumps(out))
'''


@pytest.mark.timeout(300)
def test_encoder_compiles_for_sm90():
    """The encoder and the fused quantize-encode kernel (bf16 / fp32 activations) build for sm_90a:
    hardware e4m3 conversions, the flags' atomic max, and no ex2 (scales come from their bits:
    ex2.approx flushes the subnormal 2^-127)."""
    c = run_compile_script(_AOT_ENC)
    for key in ("fp4", "fp8", "fused_bf16", "fused_fp32"):
        assert c[key]["cvt_e4m3"] >= 1 and c[key]["atom"] >= 1 and c[key]["ex2"] == 0, (key, c[key])
