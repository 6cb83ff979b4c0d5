"""The MoE glue kernels (kernels/triton/moe.py) compile for Hopper (sm_90) without a GPU, in
every size ops/moe.py launches (the routing kernel at the suites' expert counts and the largest; the
one-launch routing + permutation in its band), with no atomics in the results (the
combine is deterministic; its offsets check writes the error flag with two, the one-launch routing
counts its programs with two) and no spills
of the counting sort's comparison tiles."""

from __future__ import annotations

import pytest

from _aot import run_compile_script

SCRIPT = r'''
import json, re
import triton
from triton.backends.compiler import GPUTarget
from blockscaled.kernels.triton import moe as K
from blockscaled.ops import moe as ops_moe

TGT = GPUTarget("cuda", 90, 32)

def comp(fn, sig, const, **opts):
    attrs = {(i,): [["tt.divisibility", 16]] for i, (n, t) in enumerate(sig.items()) if t.startswith("*")}
    k = triton.compile(triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                       target=TGT, options=opts)
    ptx = k.asm["ptx"]
    return {"atom": len(re.findall(r"\batom\.", ptx)), "local": len(re.findall(r"\b(?:st|ld)\.local", ptx)),
            "cubin": len(k.asm.get("cubin", b""))}

out = {}
for block in (64, ops_moe.PERMUTE_MAX):
    sig = {"ids_ptr": "*i64", "order_ptr": "*i64", "token_ptr": "*i64", "inv_ptr": "*i32", "offsets_ptr": "*i32",
           "n": "i32", "num_experts": "i32", "topk": "i32", "BLOCK": "constexpr", "CHUNK": "constexpr",
           "E_CHUNK": "constexpr"}
    out[f"permute_{block}"] = comp(K.permute_kernel, sig, {"BLOCK": block, "CHUNK": ops_moe._CHUNK,
                                                          "E_CHUNK": ops_moe._E_CHUNK}, num_warps=4)
for odt in ("bf16", "fp16", "fp32"):
    for check in (False, True):
        sig = {"y_ptr": "*fp32", "w_ptr": "*fp32", "inv_ptr": "*i32", "out_ptr": "*" + odt, "H": "i32",
               "stride_y": "i32", "stride_w": "i32", "stride_o": "i32", "offsets_ptr": "*i32",
               "flag_ptr": "*i32", "num_experts": "i32", "n_rows": "i32", "TOPK": "constexpr", "BLOCK_H": "constexpr",
               "CHECK": "constexpr", "OP": "constexpr"}
        out[f"combine_{odt}{'_check' if check else ''}"] = comp(
            K.combine_kernel, sig, {"TOPK": 8, "BLOCK_H": ops_moe._COMBINE_BLOCK_H, "CHECK": check, "OP": 3},
            num_warps=4)
# routing: Mixtral (8 experts, top-2 softmax), Qwen3-30B-A3B (128, top-8), DeepSeek-V3 (256, sigmoid, 8 groups
# keep 4, correction bias, top-8), the largest block the launcher takes
for name, (e, k, sig_, bias, ng, tg) in {"route_8": (8, 2, False, False, 1, 1), "route_128": (128, 8, False, False, 1, 1),
                                          "route_dsv3": (256, 8, True, True, 8, 4),
                                          "route_max": (ops_moe.ROUTE_MAX_EXPERTS, 8, False, False, 1, 1)}.items():
    sig = {"logits_ptr": "*bf16", "bias_ptr": "*fp32", "w_ptr": "*fp32", "ids_ptr": "*i64", "T": "i32",
           "num_experts": "i32", "stride_l": "i32", "scale": "fp32", "TOPK": "constexpr", "K_PAD": "constexpr",
           "BLOCK_E": "constexpr", "SIGMOID": "constexpr", "HAS_BIAS": "constexpr", "N_GROUP": "constexpr",
           "TOPK_GROUP": "constexpr", "NORM": "constexpr"}
    const = {"TOPK": k, "K_PAD": k, "BLOCK_E": e, "SIGMOID": sig_, "HAS_BIAS": bias, "N_GROUP": ng, "TOPK_GROUP": tg,
             "NORM": True}
    out[name] = comp(K.route_kernel, sig, const, num_warps=4)
    if name in ("route_128", "route_dsv3"):  # the one-launch routing + permutation (its band: 64 assignments)
        psig = {**{a: t for a, t in sig.items() if a not in ("T", "num_experts", "stride_l", "scale") and a[0].islower()},
                "order_ptr": "*i64", "token_ptr": "*i64", "inv_ptr": "*i32", "offsets_ptr": "*i32", "cnt_ptr": "*i32",
                "T": "i32", "num_experts": "i32", "stride_l": "i32", "scale": "fp32",
                **{a: t for a, t in sig.items() if t == "constexpr"},
                "BLOCK": "constexpr", "CHUNK": "constexpr", "E_CHUNK": "constexpr"}
        out[name.replace("route", "route_permute")] = comp(
            K.route_permute_kernel, psig, {**const, "BLOCK": 64, "CHUNK": ops_moe._CHUNK,
                                           "E_CHUNK": ops_moe._E_CHUNK}, num_warps=ops_moe.ROUTE_PERMUTE_WARPS)
print("JSON" + json.dumps(out))
'''


@pytest.fixture(scope="module")
def info():
    return run_compile_script(SCRIPT)


def test_glue_kernels_compile_for_sm90(info):
    assert len(info) == 14 and {"permute_64", "combine_bf16", "combine_fp16_check", "combine_fp32", "route_dsv3",
                                "route_permute_128", "route_permute_dsv3"} < set(info)
    for name, r in info.items():
        assert r["cubin"] > 0, name
        # the offsets check records a bad call in the error flag words (one add, one compare-and-swap); the
        # one-launch routing counts its programs (one add, one exchange that resets the counter)
        atoms = 2 if name.endswith("_check") or name.startswith("route_permute") else 0
        assert r["atom"] == atoms, (name, "the glue is deterministic: no atomics in the results")
        assert r["local"] == 0, (name, "register spills to local memory")
