"""The grouped / SwiGLU / list kernels compile for Hopper (sm_90) without a GPU.

The compile runs in a subprocess without TRITON_INTERPRET (conftest sets it for this process).
A representative subset (each format, each grouping mode, DUAL, PROMOTE both ways, the list
kernel) keeps this test near a minute: each compile takes 3-10 s on 2 cores. The PTX must
contain FP8 ``wgmma`` with e4m3 operands for the promoted (FP8-dot) variants, bf16 ``wgmma`` for
the dequantizing ones (fp16 for promoted fp16 weight-only), and no atomics (the kernels are deterministic).
"""


from _aot import run_compile_script

SCRIPT = r'''
import json, re
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from blockscaled.kernels.triton.grouped import grouped_gemm_kernel, grouped_list_kernel

TGT = GPUTarget("cuda", 90, 32)
DATA = {0: "*fp8e4nv", 1: "*fp8e4nv", 2: "*u8", 3: "*u8"}
SCALE = {0: "*fp32", 1: "*u8", 2: "*u8", 3: "*fp8e4nv"}
DIV16 = ("K", "stride_am", "stride_ae", "stride_bn", "stride_be", "stride_cm", "stride_ce")

def summary(k):
    ptx = k.asm["ptx"]
    return {"name": k.name,
            "wgmma": sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m\d+n\d+k\d+\.f32\.(\w+)\.(\w+)", ptx))),
            "atom": len(re.findall(r"atom\.", ptx))}

def grouped(fmt, mode, dual, promote, bm, bn, bk, out="*bf16", a_dense=None):
    sig = {n: "i32" for n in grouped_gemm_kernel.arg_names}
    for n in ("a_ptr", "b_ptr", "b2_ptr"):
        sig[n] = DATA[fmt]
    for n in ("as_ptr", "bs_ptr", "b2s_ptr"):
        sig[n] = SCALE[fmt]
    if a_dense:
        sig["a_ptr"] = sig["as_ptr"] = a_dense
    sig.update(c_ptr=out, gsa_ptr="*fp32", gsb_ptr="*fp32", gsb2_ptr="*fp32", seg_ptr="*i32")
    if promote:
        dot = tl.float16 if a_dense == "*fp16" else (tl.bfloat16 if a_dense else tl.float8e4nv)
    else:
        dot = tl.bfloat16
    const = dict(FMT=fmt, A_DENSE=bool(a_dense), B_BR=128 if fmt == 0 else 1, MODE=mode, DUAL=dual, GSB_PER_EXPERT=(fmt == 3),
                 E_POW2=256, PROMOTE=promote, DOT_DTYPE=dot,
                 EVEN_K=True, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk)
    for c in const:
        sig[c] = "constexpr"
    attrs = {(i,): [["tt.divisibility", 16]] for i, (n, t) in enumerate(sig.items())
             if t != "constexpr" and (t.startswith("*") or n in DIV16)}
    src = triton.compiler.ASTSource(fn=grouped_gemm_kernel, signature=sig, constexprs=const, attrs=attrs)
    return summary(triton.compile(src, target=TGT, options={"num_warps": 4 if bm == 64 else 8, "num_stages": 3}))

out = {}
out["fp8_block_contig"] = grouped(0, 1, False, True, 64, 128, 128)
out["fp8_block_swiglu_contig"] = grouped(0, 1, True, True, 64, 64, 128)
out["fp8_block_masked"] = grouped(0, 2, False, True, 128, 128, 128)
out["mxfp8_masked_promote"] = grouped(1, 2, False, True, 64, 128, 32)
out["mxfp8_swiglu_dense_dequant"] = grouped(1, 0, True, False, 128, 64, 128)
out["mxfp4_contig_promote"] = grouped(2, 1, False, True, 64, 128, 32)
out["nvfp4_swiglu_contig"] = grouped(3, 1, True, False, 64, 64, 128)
out["nvfp4_masked_fp32out"] = grouped(3, 2, False, False, 128, 128, 128, out="*fp32")
out["bf16_x_mxfp4_contig"] = grouped(2, 1, False, False, 64, 128, 128, a_dense="*bf16")
out["fp16_x_fp8_block_masked"] = grouped(0, 2, False, True, 64, 128, 128, a_dense="*fp16")
sig = {"table_ptr": "*i64", "alpha_ptr": "*fp32", "G": "i32", "FLOPS": "i64", "BYTES": "i64"}
const = dict(FMT=3, B_BR=1, OUT_DTYPE=tl.float16, G_POW2=16, PROMOTE=False, DOT_DTYPE=tl.bfloat16,
             BLOCK_M=128, BLOCK_N=128, BLOCK_K=128)
for c in const:
    sig[c] = "constexpr"
src = triton.compiler.ASTSource(fn=grouped_list_kernel, signature=sig, constexprs=const)
out["nvfp4_list"] = summary(triton.compile(src, target=TGT, options={"num_warps": 8}))
print("JSON" + json.dumps(out))
'''


def test_grouped_kernels_compile_for_sm90():
    res = run_compile_script(SCRIPT)
    fp8 = ("fp8_block_contig", "fp8_block_swiglu_contig", "fp8_block_masked", "mxfp8_masked_promote",
           "mxfp4_contig_promote")
    for key, r in res.items():
        assert r["wgmma"], f"{key}: no wgmma in the PTX"
        assert r["atom"] == 0, f"{key}: atomics in a kernel documented as deterministic"
        want = ("e4m3", "e4m3") if key in fp8 else ("f16", "f16") if key.startswith("fp16_x") else ("bf16", "bf16")
        assert all(tuple(w) == want for w in r["wgmma"]), f"{key}: wgmma operand types {r['wgmma']}, want {want}"
    assert res["fp8_block_swiglu_contig"]["name"].startswith("bs_swiglu_contig_fp8_block")
    assert res["nvfp4_list"]["name"].startswith("bs_grouped_list_nvfp4")
