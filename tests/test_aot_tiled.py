"""The sm_90a tiled MX / NV kernels (kernels/hopper/tiled.py, and tiled_rs.py: the register-operand
kernel, its own test below) built ahead of time, no GPU.

Compiled for sm_90a in a subprocess (no interpreter) for mxfp4 / nvfp4 / mxfp8 (128 x 128 tiles),
with a bias and nvfp4's activation global scale, the grouped modes (contiguous; masked with
per-expert nvfp4 global scales: the same MMA and decode, the M tiles numbered over the experts on
the device), 3- to 6-slot rings (4 and more: a TMA producer warp and 8 math warps that synchronise among themselves with named barriers of 256 threads; 3: the
math warps issue the TMA loads, a full ring before the loop and one refill per step). Per build the
MMA is a bf16 wgmma m64 n128 k16 with both operands in shared memory (the decoded weights are
stored there: no register A operand), 4 per 64-element K step, one left in flight
(``wait_group 1``) and drained once after the loop; the decode is the streaming kernel's packed
bf16 multiplies (2 per e2m1 pair for MX, 1 for nvfp4; 32 elements per thread and step); ptxas
reports no spills and no wgmma serialisation.
The numerics are checked on the GPU (tests/test_tiled_gpu.py).
"""

from __future__ import annotations

import pytest

from _aot import PTXAS_STATS, run_compile_script

pytestmark = pytest.mark.timeout(900)

SCRIPT = PTXAS_STATS + r'''
import json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from blockscaled.kernels.hopper import tiled as T
from blockscaled.ops._tiled import TILED_FMT, _layouts

TGT = GPUTarget("cuda", 90, 32)
NAMES = {1: "mxfp8", 2: "mxfp4", 3: "nvfp4"}
out = {}
# the parameters both kernels share (the rest per kernel below)
COMMON = {"ws_ptr": None, "gs_ptr": "*fp32", "ags_ptr": "*fp32", "bias_ptr": "*fp32", "c_ptr": None, "M": "i32",
          "N": "i32", "K": "i32", "stride_wsn": "i32", "stride_cm": "i32", "seg_ptr": "*i32", "E": "i32",
          "stride_wse": "i32", "FMT": "constexpr", "STAGES": "constexpr", "HAS_AGS": "constexpr",
          "HAS_BIAS": "constexpr", "MODE": "constexpr", "E_POW2": "constexpr", "GS_PER_E": "constexpr",
          "num_warps": "constexpr"}


def build(key, fn, sig, const, warps):
    """PTX of one build and its common record (wgmma shapes, A operand, counts), or None (the error
    recorded under ``key``)."""
    try:
        k = triton.compile(GluonASTSource(fn, sig, constexprs=const), target=TGT, options={"num_warps": warps})
    except Exception as e:
        out[key] = {"error": f"{type(e).__name__}: {str(e)[-800:]}"}
        return None, None
    ptx = k.asm["ptx"]
    wg = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+\.f32\.bf16\.bf16)\s+\{[^}]*\},\s*(\S)", ptx)
    rec = {"wgmma": sorted({w for w, _ in wg}), "a_operand": sorted({"regs" if a == "{" else "desc" for _, a in wg}),
           "wgmma_count": len(wg), "tma_load": ptx.count("cp.async.bulk.tensor.2d.shared"),
           "wait0": ptx.count("wgmma.wait_group.sync.aligned 0;"), "bf16x2_fma": ptx.count("fma.rn.bf16x2"),
           "shared": k.metadata.shared, "stages": const["STAGES"]}
    rec.update(ptxas_stats(ptx))
    return ptx, rec

for fmt, bm, st, bias, ags, cdt, mode in [(2, 128, 4, 0, 0, "*bf16", 0), (3, 128, 4, 1, 1, "*bf16", 0),
                                          (1, 128, 4, 0, 0, "*fp32", 0), (2, 128, 4, 1, 0, "*fp16", 0),
                                          (3, 128, 3, 0, 0, "*bf16", 0), (2, 128, 6, 0, 0, "*bf16", 0),
                                          (3, 128, 6, 0, 1, "*fp32", 0), (2, 128, 5, 0, 0, "*bf16", 1),
                                          (3, 128, 5, 0, 1, "*bf16", 2), (1, 128, 5, 0, 0, "*fp32", 1)]:
    xl, wl = _layouts(bm)
    wpr = TILED_FMT[NAMES[fmt]][1]
    sig = {**COMMON, "x_desc": f"tensordesc<bf16[{bm}, 64],{xl!r}>", "w_desc": f"tensordesc<i32[128, {wpr}],{wl!r}>",
           "ws_ptr": "*fp8e4nv" if fmt == 3 else "*u8", "c_ptr": cdt, "part_ptr": "*fp32", "cnt_ptr": "*i32",
           "ks_per_split": "i32", "SPLIT": "i32", "BN": "constexpr", "WS": "constexpr"}
    sig = {name: sig[name] for name in T.tiled_kernel.arg_names}  # parameter order
    key = f"{NAMES[fmt]}_bm{bm}_st{st}" + ("_bias" if bias else "") + ("_ags" if ags else "") + (f"_mode{mode}" if mode else "")
    ptx, rec = build(key, T.tiled_kernel, sig, {
        "FMT": fmt, "BN": 128, "STAGES": st, "HAS_AGS": bool(ags), "HAS_BIAS": bool(bias), "WS": st >= 4,
        "MODE": mode, "E_POW2": 128 if mode else 1, "GS_PER_E": mode == 2, "num_warps": bm // 16}, bm // 16)
    if ptx is None:
        continue
    rec.update({"wait1": ptx.count("wgmma.wait_group.sync.aligned 1;"),
                "named_barriers": len(re.findall(r"bar\.sync\s+\d+, (?:256|512);", ptx)),
                "cta_barriers": len(re.findall(r"bar\.sync\s+0;", ptx))})
    out[key] = rec

# the register-operand kernel (tiled_rs.py): two consumer warpgroups of 4 warps + the producer warp
from blockscaled.kernels.hopper import tiled_rs as R
for fmt, bt, st, bias, ags, cdt, mode in [(2, 256, 4, 1, 0, "*bf16", 0), (3, 256, 4, 0, 1, "*fp32", 0),
                                          (2, 256, 3, 0, 0, "*fp16", 0), (3, 256, 4, 0, 0, "*bf16", 1),
                                          (2, 256, 4, 0, 0, "*bf16", 2), (2, 64, 6, 1, 0, "*bf16", 0),
                                          (3, 32, 6, 0, 1, "*bf16", 0), (2, 16, 6, 0, 0, "*fp32", 0),
                                          (2, 128, 4, 0, 0, "*bf16", 0), (3, 64, 4, 0, 0, "*bf16", 0),
                                          (3, 64, 5, 1, 1, "*bf16", 0), (2, 64, 5, 0, 0, "*fp32", 0),
                                          (1, 64, 6, 1, 0, "*bf16", 0), (1, 64, 5, 0, 0, "*bf16", 1),
                                          (1, 256, 4, 0, 0, "*bf16", 0)]:
    xl, wl = _layouts(bt)
    bn = 256 if (bt, st) == (64, 5) else 128  # four consumer warpgroups (plan/tiled.py R5), unsplit
    split = bt <= 64 and bn == 128
    sig = {**COMMON, "x_desc": f"tensordesc<bf16[{bt}, 64],{xl!r}>", "w_desc": f"tensordesc<i32[{bn}, {TILED_FMT[NAMES[fmt]][1]}],{wl!r}>",
           "ws_ptr": "*fp8e4nv" if fmt == 3 else "*u8", "c_ptr": cdt, "part_ptr": "*fp32", "cnt_ptr": "*i32",
           "ks_per_split": "i32", "SPLIT": "i32" if split else "constexpr"}
    sig = {name: sig[name] for name in R.tiled_rs_kernel.arg_names}
    key = (f"rs_{NAMES[fmt]}_bt{bt}_bn{bn}_st{st}" + ("_bias" if bias else "") + ("_ags" if ags else "")
           + (f"_mode{mode}" if mode else ""))
    ptx, rec = build(key, R.tiled_rs_kernel, sig, {
        "FMT": fmt, "STAGES": st, "HAS_AGS": bool(ags), "HAS_BIAS": bool(bias), "MODE": mode,
        "E_POW2": 128 if mode else 1, "GS_PER_E": mode == 2, "num_warps": 4,
        # above 64 tokens the kernel runs unsplit (the launcher's SPLIT = 1 is specialised), below it splits K
        **({} if split else {"SPLIT": 1})}, 4)
    if ptx is None:
        continue
    rec.update({"prmt": ptx.count("prmt.b32"), "ld_shared_v4": ptx.count("ld.shared.v4.b32"),
                "ld_nc_u8": ptx.count("ld.global.nc.u8"), "fmt": NAMES[fmt],
                "st_shared": ptx.count("st.shared"), "rs": True, "bt": bt, "bn": bn,
                "st_b32": ptx.count("st.global.b32 "), "st_v2_b32": ptx.count("st.global.v2.b32 "),
                "atomics": len(re.findall(r"atom\.(?:global\.)?(?:acq_rel|relaxed)?", ptx))})
    out[key] = rec
print("JSON" + json.dumps(out))
'''


@pytest.fixture(scope="module")
def compiled():
    return run_compile_script(SCRIPT)


def test_tiled_builds_for_sm90(compiled):
    assert len(compiled) == 25, compiled
    for key, c in compiled.items():
        if key.startswith("rs_"):
            continue
        assert "error" not in c, (key, c)
        assert c["wgmma"] == ["m64n128k16.f32.bf16.bf16"], (key, c)
        assert c["a_operand"] == ["desc"], (key, c)  # activations from shared memory, not registers
        assert c["wgmma_count"] == 64 // 16, (key, c)  # one 64-element K step per loop iteration
        assert c["wait1"] == 1 and c["wait0"] >= 1, (key, c)  # one wgmma in flight, drained after the loop
        if c["stages"] >= 4:  # warp-specialised: the producer warp's loop, one activation and one weight box per step
            assert c["tma_load"] == 2, (key, c)
            assert c["named_barriers"] >= 1 and c["cta_barriers"] == 0, (key, c)  # the math warps sync alone
        else:  # the math warps load: the ring filled before the loop, one refill per step
            assert c["tma_load"] == 2 * (c["stages"] + 1) and c["named_barriers"] == 0, (key, c)
        # 128 x 64 weight elements per step over the math warps' threads (32 each with 8), as bf16
        # pairs: 2 packed multiplies per pair (x 2**126 or 2**120, then x scale), 1 for nvfp4
        per_thread = 128 * 64 // (32 * 8)
        assert c["bf16x2_fma"] == per_thread // 2 * (1 if key.startswith("nvfp4") else 2), (key, c)
        if c.get("spill_stores") is not None:
            assert c["spill_stores"] == 0 and not c["wgmma_serialized"], (key, {k: c[k] for k in ("regs", "spill_stores")})
        assert c["shared"] <= 227 * 1024, (key, c)


def test_register_operand_kernel_builds_for_sm90(compiled):
    """kernels/hopper/tiled_rs.py: per consumer warpgroup and 64-element K step, 4 bf16 wgmma m64
    nBT k16 (BT = the token tile: 256 unsplit, 16 / 32 / 64 / 128 with a runtime K split) whose A
    operand is registers (the decoded weights), waited for before the next decode; the split builds
    carry the partial-sum epilogue (its atomics), the unsplit ones none;
    the weights read as two 128-bit shared loads per row and thread (mxfp8: four), one prmt per e2m1
    or e4m3 pair (16 per thread and step), 2 packed multiplies per pair for MX and 1 for nvfp4; the whole ring (bias,
    W x A global scales, grouped modes) fits in shared memory; no spills, no wgmma serialisation;
    dense builds store no decoded weights to shared memory (a few stores at most: the barriers).
    nvfp4 and 256-token builds load the scales two steps ahead: the K loop runs two steps per trip
    (each body counted twice), the scale loads are ``ld.global.nc.u8`` into registers (2 rows x NS
    scales per thread at four sites: two before the loop, one per step in it); the others load
    them one step ahead through Triton's loads. Split builds store the fp32 partial in the
    registers' order (scalar stores, whole lines per warp)."""
    rs = {k: c for k, c in compiled.items() if k.startswith("rs_")}
    assert len(rs) == 15, rs
    for key, c in rs.items():
        assert "error" not in c, (key, c)
        assert c["wgmma"] == [f"m64n{c['bt']}k16.f32.bf16.bf16"] and c["a_operand"] == ["regs"], (key, c)
        nc = c["bn"] // 64  # consumer warpgroups
        ahead = c["fmt"] == "nvfp4" or c["bt"] == 256
        ns = 4 if c["fmt"] == "nvfp4" else 2
        assert c["ld_nc_u8"] == (nc * 4 * 2 * ns if ahead else 0), (key, c)
        if ahead:  # two K steps per trip of the loop: each step's instructions appear twice
            c = {**c, **{f: c[f] // 2 for f in ("wgmma_count", "wait0", "prmt", "bf16x2_fma")},
                 "ld_shared_v4": c["ld_shared_v4"] - nc * (8 if c["fmt"] == "mxfp8" else 4)}
        assert (c["atomics"] > 0) == (c["bt"] <= 64 and nc == 2), (key, c)  # the split epilogue's counters
        assert c["wgmma_count"] == nc * 4 and c["wait0"] == nc, (key, c)  # 4 x k16 each
        # nc x 4 128-bit shared loads in the K loops (mxfp8 nc x 8); the grouped modes' segment scan
        # adds a few outside them, by release and consumers (triton 3.6: 1 with two consumers, 3 with
        # four; 3.8: 2 with two)
        assert c["prmt"] == nc * 16, (key, c)
        # a split build's epilogue may add one (triton 3.8: a layout change of the partial tile)
        split = c["atomics"] > 0
        v4 = nc * (8 if c["fmt"] == "mxfp8" else 4)  # 2 rows x 32 or 64 bytes per thread
        assert (v4 <= c["ld_shared_v4"] <= v4 + split if "_mode" not in key
                else v4 < c["ld_shared_v4"] <= v4 + nc), (key, c)
        assert c["bf16x2_fma"] == nc * 16 * (1 if "nvfp4" in key else 2), (key, c)
        assert c["tma_load"] == 2, (key, c)  # the producer's loop: one activation and one weight box
        if split:
            # the fp32 partial in register order (stream.mma_slot_offsets): one 32-bit store per
            # register and thread, each a warp's whole 128-byte line (BT / 2 registers per consumer);
            # row-major offsets gave 8-byte stores over 8 lines each
            assert c["st_b32"] >= nc * c["bt"] // 2 and c["st_v2_b32"] == 0, (key, c)
        if "_mode" not in key:  # (the grouped modes' segment scan goes through shared memory, once)
            # the barriers' initial state, and on some releases one epilogue scratch store (triton 3.8:
            # 3 with a bias, 6 with the split epilogue); a decoded tile stored per step would add at
            # least 4 vector stores per consumer
            assert c["st_shared"] < (8 if split else 6), (key, c)
        if c.get("spill_stores") is not None:
            # the split epilogue with a bias holds the partial, its sum, the bias and the output
            # pointers at once: ptxas 12.8 spills one register there (4 bytes, once per program, not in
            # the K loop); anything more is a regression. (Not built here: the 256-token MX builds with
            # fp32 output, whose epilogue ptxas 13 spills 108 bytes on triton 3.9, mxfp4 and mxfp8 alike,
            # after the K loop; the tiled kernels are planned on triton 3.6-3.8, where it does not: 3.8's
            # builds of both, 0 bytes at 168 registers, fortieth session.)
            allowed = 4 if c["bt"] <= 64 and nc == 2 and "_bias" in key else 0
            assert c["spill_stores"] <= allowed and not c["wgmma_serialized"], (key, c)
        assert c["shared"] <= 227 * 1024, (key, c)
