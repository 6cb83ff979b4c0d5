"""The sm_90 register-streaming decode kernel (kernels/hopper/direct.py) built ahead of time, no GPU.

Compiled for sm_90a in a subprocess (no interpreter) for mxfp4 / nvfp4, with and without a bias,
bf16 / fp32 outputs, with the divisibility a real call's arguments get (16-byte aligned pointers,
K and row strides multiples of 16). Per build: the MMA is ``mma.sync.m16n8k16`` bf16 with fp32
accumulation, 8 of them per 128-K step (the loop body appears once); the weights come straight from
global memory as 128-bit loads (two per thread and step) and the activations too (four), with no
shared memory, barrier or TMA inside the K loop (the only shared memory is the epilogue's layout
change); the decode is the stream kernel's packed bf16 multiplies (two per element pair for
mxfp4, one for nvfp4: 32 pairs per thread and step); ptxas reports no spills and at most the
registers plan/direct.py counts on (``DIRECT_REGS``: 8 / 6 programs per SM). The numerics are
checked on the GPU (tests/test_direct_gpu.py).
"""

from __future__ import annotations

import re

import pytest

from _aot import PTXAS_STATS, run_compile_script

pytestmark = pytest.mark.timeout(900)

SCRIPT = PTXAS_STATS + r'''
import json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from blockscaled.kernels.hopper import direct as D

TGT = GPUTarget("cuda", 90, 32)
out = {}
for fmt, bias, cdt, gr, mr in [(2, False, "*bf16", 0, 0), (2, True, "*fp32", 0, 0), (3, False, "*bf16", 0, 0),
                              (3, True, "*bf16", 0, 0), (2, False, "*fp32", 1, 0), (3, False, "*fp32", 2, 0),
                              (2, False, "*bf16", 0, 128)]:
    scale = "*fp8e4nv" if fmt == 3 else "*u8"
    sig = {"w_ptr": "*i32", "ws_ptr": scale, "x_ptr": "*bf16", "gs_ptr": "*fp32", "ags_ptr": "*fp32",
           "bias_ptr": "*bf16", "c_ptr": cdt, "part_ptr": "*fp32", "cnt_ptr": "*i32", "seg_ptr": "*i32", "M": "i32",
           "N": "i32", "K": "i32", "kc_per_split": "i32", "SPLIT": "i32", "stride_wn": "i32", "stride_wsn": "i32",
           "stride_wse": "i32", "stride_xm": "i32", "stride_xe": "i32", "stride_cm": "i32", "stride_ce": "i32",
           "FMT": "constexpr", "MP": "constexpr", "HAS_AGS": "constexpr", "HAS_BIAS": "constexpr",
           "num_warps": "constexpr", "GROUPING": "constexpr", "GS_PER_E": "constexpr", "NUM_E": "constexpr"}
    names = list(sig)
    div = ["w_ptr", "ws_ptr", "x_ptr", "gs_ptr", "ags_ptr", "bias_ptr", "c_ptr", "part_ptr", "cnt_ptr", "N", "K",
           "stride_wn", "stride_xm", "stride_cm"]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in div}
    key = (("mxfp4" if fmt == 2 else "nvfp4") + ("_bias" if bias else "") + "_" + cdt[1:] + (f"_g{gr}" if gr else "")
           + (f"_r{mr}" if mr else ""))
    try:
        k = triton.compile(GluonASTSource(D.direct_kernel, sig, attrs=attrs,
                                          constexprs={"FMT": fmt, "MP": 8, "HAS_AGS": fmt == 3, "HAS_BIAS": bias,
                                                      "num_warps": 4, "GROUPING": gr, "GS_PER_E": gr == 2,
                                                      "NUM_E": 128 if gr == 1 else 0}),
                           target=TGT, options={"num_warps": 4, **({"maxnreg": mr} if mr else {})})
    except Exception as e:
        out[key] = {"error": f"{type(e).__name__}: {str(e)[-800:]}"}
        continue
    ptx = k.asm["ptx"]
    # the K loop: the PTX between the loop's head label and its back branch holds the mma.sync
    # (the innermost such loop: a grouped build's row-block loop holds the K loop and its epilogue)
    body = max(re.findall(r"\n(\$L__BB\d+_\d+):(.*?)bra(?:\.uni)?\s+\1;", ptx, re.S),
               key=lambda b: (b[1].count("mma.sync"), -len(b[1])), default=("", ""))[1]
    rec = {"mma": sorted(set(re.findall(r"mma\.sync\.aligned\.(\S+)", ptx))), "loop_mma": body.count("mma.sync"),
           "loop_ldg128": len(re.findall(r"ld\.global(?:\.\w+)*\.v4\.b32", body)),
           "loop_shared": len(re.findall(r"(?:ld|st)\.shared|bar\.sync|barrier|cp\.async", body)),
           "loop_bf16x2_fma": body.count("fma.rn.bf16x2"), "wgmma": ptx.count("wgmma"),
           "tma": ptx.count("cp.async.bulk.tensor"), "shared": k.metadata.shared,
           "maxnreg": int(m.group(1)) if (m := re.search(r"\.maxnreg\s+(\d+)", ptx)) else 0}
    rec.update(ptxas_stats(ptx))
    out[key] = rec
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def compiled():
    return run_compile_script(SCRIPT)


def test_direct_builds_for_sm90(compiled):
    from blockscaled.plan import direct as plan_direct

    assert len(compiled) == 7, compiled
    # the planner's register budget (GemmConfig.maxnreg) reaches ptxas as the PTX's .maxnreg
    assert compiled["mxfp4_bf16_r128"]["maxnreg"] == 128 and compiled["mxfp4_bf16"]["maxnreg"] == 0
    for key, c in compiled.items():
        assert "error" not in c, (key, c)
        assert c["mma"] == ["m16n8k16.row.col.f32.bf16.bf16.f32"], (key, c)
        assert c["wgmma"] == 0 and c["tma"] == 0, (key, c)
        assert c["loop_mma"] == 128 // 16, (key, c)  # one 128-K step per loop iteration, N = 8
        if "_g" in key:
            # the grouped form: its own register budget (plan/direct.py DIRECT_GROUPED_REGS); its PTX lays
            # the row block's epilogue out between the K loop's header and latch, so the loop text
            # checks below hold for the dense builds only
            assert c.get("regs") is None or c["regs"] <= plan_direct.DIRECT_GROUPED_REGS, (key, c)
            assert c.get("spill_stores") in (None, 0), (key, c)
            continue
        assert c["loop_ldg128"] == 2 + 4, (key, c)  # 2 rows x 16 weight bytes, 32 bf16 activations
        assert c["loop_shared"] == 0, (key, c)  # registers only: no shared memory, barrier or async copy
        per_pair = 1 if key.startswith("nvfp4") else 2  # x 2**126 then x scale / one nvfp4 factor
        assert c["loop_bf16x2_fma"] == 32 * per_pair, (key, c)
        assert c["shared"] <= 4096, (key, c)  # the epilogue's layout change only
        if c.get("spill_stores") is not None:
            assert c["spill_stores"] == 0, (key, c)
        if c.get("regs") is not None and plan_direct._TRITON_OK and "_g" not in key and "_r" not in key:
            # the planner's programs per SM (direct_resident) rest on these counts
            assert c["regs"] <= plan_direct.DIRECT_REGS[key.split("_")[0]], (key, c)
