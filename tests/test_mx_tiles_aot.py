"""Instruction counts of the MX/NV bf16 tiles, checked on sm_90 PTX without a GPU.

The dense GEMM kernel is compiled ahead of time (``triton.compile(..., target=GPUTarget("cuda", 90,
32))``, ``tt.divisibility=16`` on pointers / strides / K as at launch) for mxfp8 / mxfp4 / nvfp4,
W x A and weight-only (bf16 A), on the tile classes the planner uses at 16 <= M <= 512: swap-AB
16x128x128 (weight rows on the wgmma's M side, the dequantized weight its register operand),
64x128x128 and 128x128x128 with 8 warps. Per compiled kernel:

* PTX instructions of the K loop per weight element (the loop body: the largest block between a
  label and its backward branch that holds the MMA; divided by BLOCK_N * BLOCK_K / threads) stay
  under a limit: the in-register bf16 dequantization (kernels/triton/_mma.py: fp4 bit patterns,
  packed bf16 scale multiplies, vector scale loads) took them from 15.8-32.3 to 4.6-10.7 (table
  below, triton 3.6); a regression past the limit fails;
* the dots are bf16 wgmma (not mma.sync), swap-AB with the weight in registers (``wgmma ... {regs},
  desc``), no register spills (ptxas -v), and the scale loads go through cp.async (pipelined) like
  the data: few ``ld.global`` in the kernel.

PTX / weight element, triton 3.6 (before = the fp32 decode + fp32 multiply + cvt of b17c0e5):

    tile                 fmt    W x A before -> now   weight-only before -> now
    swap 16x128x128 w4   mxfp8        6.50 -> 5.60          (no swap) -> 5.77
                         mxfp4       18.28 -> 5.12          (no swap) -> 5.35
                         nvfp4       18.59 -> 6.55          (no swap) -> 6.73
    64x128x128 w4        mxfp8        8.07 -> 6.52               5.67 -> 4.61
                         mxfp4       23.58 -> 6.55              15.96 -> 4.88
                         nvfp4       23.60 -> 7.34              15.78 -> 4.87
    128x128x128 w8 s3    mxfp8       11.27 -> 9.28               6.45 -> 5.53
                         mxfp4       32.03 -> 9.09              16.94 -> 6.05
                         nvfp4       32.30 -> 10.67             16.80 -> 5.97
    (W x A counts include the activation tile's decode: equal to the weight's at 128 rows)
    (the old plans' 64x64x128 w4 at M = 64: nvfp4 W x A 32.17 -> 10.52, weight-only 16.56 -> 5.73)

Compiled in a subprocess without TRITON_INTERPRET (conftest sets it for this process) and with
``BLOCKSCALED_MX_KERNELS=bf16`` (the bf16 path is off by default: blockscaled._experimental).
"""

from __future__ import annotations

import re

import pytest
import torch
import triton

from _aot import GEMM_SIG, PTXAS_STATS, WITH_DEFAULTS, run_compile_script

SCRIPT = GEMM_SIG + PTXAS_STATS + WITH_DEFAULTS + r'''
import json, re
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from blockscaled.kernels.triton.gemm import gemm_kernel

TGT = GPUTarget("cuda", 90, 32)
DIV16 = ("K", "N", "stride_am", "stride_bn", "stride_cm", "stride_cs", "k_per_split", "stride_asm", "stride_bsn")
SDT = {1: "*u8", 2: "*u8", 3: "*fp8e4nv"}
DDT = {1: "*fp8e4nv", 2: "*u8", 3: "*u8"}

def loop_ptx(ptx):
    """Instruction lines of the K loop: the largest block between a label and a backward branch to
    it that holds the MMA."""
    lines = ptx.splitlines()
    labels = {m.group(1): i for i, l in enumerate(lines) for m in [re.match(r"^(\$L__BB\d+_\d+):", l.strip())] if m}
    best = []
    for i, l in enumerate(lines):
        m = re.search(r"bra(?:\.uni)?\s+(\$L__BB\d+_\d+);", l)
        if m and m.group(1) in labels and labels[m.group(1)] < i:
            body = lines[labels[m.group(1)]:i + 1]
            if any("mma" in x for x in body) and len(body) > len(best):
                best = body
    return [x.strip() for x in best if x.strip() and not x.strip().startswith(("$", "//", "{", "}", "."))
            and not x.strip().endswith(":")]

def comp(code, dense, bm, bn, bk, warps, stages, swap):
    sig = gemm_sig("*bf16" if dense else DDT[code], SDT[code], DDT[code], tail=("SWAP_AB",))
    const = {"stride_ak": 1, "stride_ask": 1, "stride_bk": 1, "stride_bsk": 1, "stride_cn": 1,
             "A_FMT": 4 if dense else code, "B_FMT": code, "B_SCALE_ROWS": 1, "PROMOTE": False,
             "DOT_DTYPE": tl.bfloat16, "EVEN_K": True, "HAS_BIAS": False, "SPLIT_K": 1, "GROUP_M": 8,
             "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "ws_ptr": None, "cnt_ptr": None, "SWAP_AB": swap}
    sig, const = with_defaults(gemm_kernel, sig, const)
    attrs = {(i,): [["tt.divisibility", 16]] for i, (n, t) in enumerate(sig.items())
             if t != "constexpr" and (t.startswith("*") or n in DIV16)}
    k = triton.compile(triton.compiler.ASTSource(fn=gemm_kernel, signature=sig, constexprs=const, attrs=attrs),
                       target=TGT, options={"num_warps": warps, "num_stages": stages})
    ptx = k.asm["ptx"]
    body = loop_ptx(ptx)
    return {"per_elem": len(body) / (bn * bk / (32 * warps)),
            "wgmma": sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.[\w\.]+", ptx))),
            "mma_sync": len(re.findall(r"\bmma\.sync\.aligned", ptx)),
            "wgmma_reg_a": len(re.findall(r"wgmma\.mma_async\S+\s+\{[^}]*\},\s*\{[^}]*\},\s*%rd", ptx)),
            "ld_global": len(re.findall(r"\bld\.global", ptx)),
            "cp_async": len(re.findall(r"\bcp\.async\.c[ag]\b", ptx)),
            **ptxas_stats(ptx)}

out = {}
for name, code in (("mxfp8", 1), ("mxfp4", 2), ("nvfp4", 3)):
    for dense in (False, True):
        for tile, cfg in TILES.items():
            out[f"{name}/{'wo' if dense else 'wxa'}/{tile}"] = comp(code, dense, *cfg)
print("JSON" + json.dumps(out))
'''

#: tile name -> (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, swap_ab)
TILES = {"swap16x128": (16, 128, 128, 4, 4, True), "64x128": (64, 128, 128, 4, 4, False),
         "128x128w8": (128, 128, 128, 8, 3, False)}

#: PTX instructions per weight element in the K loop, triton 3.6 (module docstring): measured
#: values plus ~15 %. Other triton releases emit other (not measured here) code: they get the
#: 2x allowance below, still far under the 15.8-32.3 of the fp32 decode.
LIMITS_36 = {
    ("mxfp8", "wxa", "swap16x128"): 6.5, ("mxfp8", "wo", "swap16x128"): 6.7,
    ("mxfp4", "wxa", "swap16x128"): 6.0, ("mxfp4", "wo", "swap16x128"): 6.2,
    ("nvfp4", "wxa", "swap16x128"): 7.6, ("nvfp4", "wo", "swap16x128"): 7.8,
    ("mxfp8", "wxa", "64x128"): 7.5, ("mxfp8", "wo", "64x128"): 5.3,
    ("mxfp4", "wxa", "64x128"): 7.6, ("mxfp4", "wo", "64x128"): 5.6,
    ("nvfp4", "wxa", "64x128"): 8.5, ("nvfp4", "wo", "64x128"): 5.6,
    ("mxfp8", "wxa", "128x128w8"): 10.7, ("mxfp8", "wo", "128x128w8"): 6.4,
    ("mxfp4", "wxa", "128x128w8"): 10.5, ("mxfp4", "wo", "128x128w8"): 7.0,
    ("nvfp4", "wxa", "128x128w8"): 12.3, ("nvfp4", "wo", "128x128w8"): 6.9,
}
_TRITON_MINOR = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", triton.__version__).groups())
_ALLOWANCE = 1.0 if _TRITON_MINOR == (3, 6) else 2.0


@pytest.fixture(scope="module")
def compiled():
    if torch.cuda.is_available():
        pytest.skip("static PTX checks run in CPU CI (tests/test_mma_perf_aot.py says why)")
    # the bf16 dequantization is an experimental kernel until it has run on a GPU (off by default)
    return run_compile_script(SCRIPT.replace("TILES", repr(TILES)), extra_env={"BLOCKSCALED_MX_KERNELS": "bf16"})


CASES = [(f, m, t) for f in ("mxfp8", "mxfp4", "nvfp4") for m in ("wxa", "wo") for t in TILES]


@pytest.mark.parametrize("fmt,mode,tile", CASES, ids=["/".join(c) for c in CASES])
def test_k_loop_instructions_per_weight_element(compiled, fmt, mode, tile):
    c = compiled[f"{fmt}/{mode}/{tile}"]
    limit = LIMITS_36[(fmt, mode, tile)] * _ALLOWANCE
    assert c["per_elem"] <= limit, (triton.__version__, fmt, mode, tile, round(c["per_elem"], 2), limit)


@pytest.mark.parametrize("fmt,mode,tile", CASES, ids=["/".join(c) for c in CASES])
def test_tiles_are_bf16_wgmma_pipelined_spill_free(compiled, fmt, mode, tile):
    c = compiled[f"{fmt}/{mode}/{tile}"]
    assert c["wgmma"] and all(w.endswith("bf16.bf16") for w in c["wgmma"]) and c["mma_sync"] == 0, c
    if TILES[tile][5]:
        # swap-AB: m64nBLOCK_M (weight rows = M), every wgmma takes the dequantized weight from registers
        assert all(".m64n16k16." in w for w in c["wgmma"]) and c["wgmma_reg_a"] > 0, c
    # data and scales stream through cp.async; what stays ld.global is the epilogue's (nvfp4 gs)
    assert c["cp_async"] > 0 and c["ld_global"] <= 4, c
    if c.get("spill_stores") is not None:
        assert c["spill_stores"] == 0, c
