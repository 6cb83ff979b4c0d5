"""The fp4 decode GEMV with explicit layouts (Gluon), for the triton releases whose layout assignment
breaks the Triton one (kernels/triton/mx_gemv.py; benchmarks/NOTES.md, forty-first session).

On triton 3.7 / 3.8 the Triton GEMV's fp4 builds spread a warp over 8 weight rows x 4 K slices and the
dense activations over 4 threads per slice, and convert between the two through shared memory every K
step (and spill): there the planner runs mxfp4 / nvfp4 at M = 1 on the register-streaming kernel, 0.61-0.95x
what triton 3.6's GEMV build reaches (the mx suite on 3.8). This probe writes the 3.6 build's structure
down as layouts, so no release can choose another:

- a program owns BLOCK_N (<= 8) weight rows and walks K in chunks of G = 32 x warps slices of 32
  elements; **thread t owns slice t of every row** (``W3``: [G, BLOCK_N, 16] packed bytes, 16
  contiguous bytes per row and thread = one 128-bit load, rows in registers);
- the bf16 activations of a slice are that thread's 32 contiguous values (``X3`` [G, 16, 2]: four
  128-bit loads), split into even / odd elements in registers;
- e2m1 decoded by the library's PRMT inline assembly (kernels/triton/mx_gemv.py ``_FP4_ASM``), the block
  scale (E8M0 per 32, or two e4m3 per 16 for nvfp4) applied once per slice and row, partials in
  [G, BLOCK_N] registers, summed over the threads once at the end; nvfp4 ``* 1 / gs`` (IEEE division).

Weight-only (bf16 activations), one or two activation rows (two: 4 weight rows per program,
``TWO_ROW_BLOCK_N``), K % 32 == 0, bf16 output: the rows the Triton GEMV takes on 3.6 (plan/mx_gemv.py
``MX_GEMV_ROWS_BY_RELEASE``). Modes:
    python scripts/probes/gemv_gluon_probe.py --aot            # build for sm_90a, print SASS facts of the K loop
    python scripts/probes/gemv_gluon_probe.py --json g.json    # GPU: against float64, then timed against the
                                                                # library's plan, its Triton GEMV and the
                                                                # register-streaming kernel, in one process
"""

from __future__ import annotations

import argparse
import json
import re

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# private: the Triton GEMV's e2m1 decode (PRMT table), the same instructions in both kernels
from blockscaled.kernels.triton.mx_gemv import _FP4_ASM
from blockscaled.testing.sass import loop_ops

FMT_CODES = {"mxfp4": 2, "nvfp4": 3}
WARPS = 4
#: weight rows per program at two activation rows: 8 took all 255 registers and spilled 372-724 bytes (AOT,
#: triton 3.8); 4 build with 128, no spills
TWO_ROW_BLOCK_N = 4
SLICE = gl.constexpr(32)  # K elements per thread and row per chunk: 16 packed bytes


def layouts(block_n: int):
    """(W3: weight bytes [G, BN, 16]; X2: activations [G, 32] (32 contiguous bf16 per thread: four 128-bit
    loads; reshaped to [G, 16, 2] in registers); S3: nvfp4 scales [G, BN, 2])."""
    w3 = gl.BlockedLayout(size_per_thread=[1, block_n, 16], threads_per_warp=[32, 1, 1], warps_per_cta=[WARPS, 1, 1],
                          order=[2, 1, 0])
    x2 = gl.BlockedLayout(size_per_thread=[1, 32], threads_per_warp=[32, 1], warps_per_cta=[WARPS, 1], order=[1, 0])
    s3 = gl.BlockedLayout(size_per_thread=[1, block_n, 2], threads_per_warp=[32, 1, 1], warps_per_cta=[WARPS, 1, 1],
                          order=[2, 1, 0])
    return w3, x2, s3


@gluon.jit
def _e8m0(s):
    """E8M0 bytes -> fp32 2**(s - 127) (0 -> 2**-127, 255 -> NaN), as kernels/triton/_mma.py decode_scale."""
    si = s.to(gl.int32)
    r = (si << 23).to(gl.float32, bitcast=True)
    r = gl.where(si == 0, (si * 0 + 0x00400000).to(gl.float32, bitcast=True), r)
    return gl.where(si == 255, float("nan"), r)


@gluon.jit
def _row_part(x, wa, wb, s_ptr, s_mask, FMT: gl.constexpr, G: gl.constexpr, BLOCK_N: gl.constexpr,
              W3: gl.constexpr, S3: gl.constexpr):
    """[G, BLOCK_N] partials of one activation row ``x`` ([G, 32] fp32) with the chunk's decoded weights
    ``wa`` / ``wb`` (even / odd elements), times the block scales, loaded and decoded after the products
    (decoded ahead, they stayed live across them: 191-206 registers at 8 rows instead of 96-151)."""
    xa, xb = gl.split(gl.reshape(x, [G, SLICE // 2, 2]))  # even / odd elements, in the thread's registers
    xa = gl.convert_layout(xa, gl.SliceLayout(1, W3), assert_trivial=True)
    xb = gl.convert_layout(xb, gl.SliceLayout(1, W3), assert_trivial=True)
    pa = wa * xa[:, None, :]
    pb = wb * xb[:, None, :]
    if FMT == 3:
        # two e4m3 blocks of 16 per slice: halves of the 16 packed bytes (8 bytes = 16 elements each)
        part = gl.convert_layout(gl.sum(gl.reshape(pa + pb, [G, BLOCK_N, 2, 8]), axis=3), S3, assert_trivial=True)
        sc = gl.load(s_ptr, mask=s_mask, other=0.0)
        r = gl.convert_layout(gl.sum(part * sc.to(gl.float32), axis=2), gl.SliceLayout(2, W3), assert_trivial=True)
    else:
        sc = gl.load(s_ptr, mask=s_mask, other=0)
        r = (gl.sum(pa, axis=2) + gl.sum(pb, axis=2)) * _e8m0(sc)  # two FMA chains, as the Triton GEMV
    return r


@gluon.jit
def gemv_fp4_kernel(x_ptr, b_ptr, bs_ptr, gs_ptr, c_ptr, N, K, stride_xm, stride_bn, stride_bsn, stride_cm,
                    FMT: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, G: gl.constexpr,
                    W3: gl.constexpr, X2: gl.constexpr, S3: gl.constexpr):
    """``c[ROWS, N] = x[ROWS, K] @ B[N, K].T`` for ROWS = 1 or 2 activation rows (the probe launches
    M = ROWS exactly): B packed e2m1 ``[N, K / 2]`` with E8M0 scales ``[N, K / 32]`` (FMT 2) or e4m3
    scales ``[N, K / 16]`` and an fp32 global scale (FMT 3); x bf16; c bf16."""
    WS: gl.constexpr = gl.SliceLayout(2, W3)  # [G, BN]: a slice's partial per row
    pid = gl.program_id(0)
    offs_n = pid * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, WS))
    mask_n = offs_n < N
    offs_n = gl.where(mask_n, offs_n, 0)  # rows past N read row 0 (never stored): the loads stay unmasked
    g_w = gl.arange(0, G, layout=gl.SliceLayout(1, WS))
    j_w = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, W3)))
    w_off = (offs_n.to(gl.int64) * stride_bn)[None, :, None] + (g_w * 16)[:, None, None] + j_w[None, None, :]
    g_x = gl.arange(0, G, layout=gl.SliceLayout(1, X2))
    x_off = (g_x * SLICE)[:, None] + gl.arange(0, SLICE, layout=gl.SliceLayout(0, X2))[None, :]
    if FMT == 3:
        g_s = gl.arange(0, G, layout=gl.SliceLayout(1, gl.SliceLayout(2, S3)))
        n_s = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, gl.SliceLayout(2, S3)))
        t_s = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, S3)))
        rows_s = gl.where(pid * BLOCK_N + n_s < N, pid * BLOCK_N + n_s, 0)
        s_off = (rows_s.to(gl.int64) * stride_bsn)[None, :, None] + (g_s * 2)[:, None, None] + t_s[None, None, :]
    else:
        s_off = (offs_n.to(gl.int64) * stride_bsn)[None, :] + g_w[:, None]
    acc0 = gl.zeros([G, BLOCK_N], gl.float32, WS)
    acc1 = gl.zeros([G, BLOCK_N], gl.float32, WS)
    for k0 in range(0, K, G * SLICE):
        kmask_w = (k0 + g_w * SLICE) < K  # whole slices (K % 32 == 0)
        w = gl.load(b_ptr + k0 // 2 + w_off, mask=kmask_w[:, None, None], other=0)
        # the activations' loads issued before the weights' decode waits for its load
        xmask = ((k0 + g_x * SLICE) < K)[:, None]
        x0 = gl.load(x_ptr + k0 + x_off, mask=xmask, other=0.0).to(gl.float32)
        if ROWS == 2:
            x1 = gl.load(x_ptr + stride_xm + k0 + x_off, mask=xmask, other=0.0).to(gl.float32)
        wa, wb = gl.inline_asm_elementwise(_FP4_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r", [w],
                                           dtype=(gl.float32, gl.float32), is_pure=True, pack=4)
        if FMT == 3:
            s_ptr = bs_ptr + k0 // 16 + s_off
            s_mask = ((k0 + g_s * SLICE) < K)[:, None, None]
        else:
            s_ptr = bs_ptr + k0 // 32 + s_off
            s_mask = kmask_w[:, None]
        acc0 += _row_part(x0, wa, wb, s_ptr, s_mask, FMT, G, BLOCK_N, W3, S3)
        if ROWS == 2:
            acc1 += _row_part(x1, wa, wb, s_ptr, s_mask, FMT, G, BLOCK_N, W3, S3)
    inv = 1.0
    if FMT == 3:
        inv = gl.div_rn(gl.full([], 1.0, gl.float32), gl.load(gs_ptr))  # IEEE, as the library
    gl.store(c_ptr + offs_n, (gl.sum(acc0, axis=0) * inv).to(gl.bfloat16), mask=mask_n)
    if ROWS == 2:
        gl.store(c_ptr + stride_cm + offs_n, (gl.sum(acc1, axis=0) * inv).to(gl.bfloat16), mask=mask_n)


def constexprs(fmt: str, block_n: int, block_k: int, rows: int = 1) -> dict:
    w3, x2, s3 = layouts(block_n)
    return {"FMT": FMT_CODES[fmt], "ROWS": rows, "BLOCK_N": block_n, "G": block_k // SLICE, "W3": w3, "X2": x2,
            "S3": s3}


def aot(fmt: str = "mxfp4", block_n: int = 8, block_k: int = 4096, rows: int = 1) -> dict:
    """Build for sm_90a (no GPU) and count the K loop's SASS (blockscaled.testing.sass)."""
    import os
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    ce = constexprs(fmt, block_n, block_k, rows)
    sig = {"x_ptr": "*bf16", "b_ptr": "*u8", "bs_ptr": "*u8" if fmt == "mxfp4" else "*fp8e4nv", "gs_ptr": "*fp32",
           "c_ptr": "*bf16", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_bn": "i32", "stride_bsn": "i32",
           "stride_cm": "i32"}
    sig.update({k: "constexpr" for k in ce})
    # what a launch specializes on for these shapes: 16-byte aligned pointers, K and the row strides / 16
    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, t) in enumerate(sig.items())
             if t.startswith("*") or name in ("N", "K", "stride_xm", "stride_bn", "stride_bsn", "stride_cm")}
    k = triton.compile(GluonASTSource(gemv_fp4_kernel, sig, constexprs=ce, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": WARPS})
    binp = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "k.cubin"), "wb").write(k.asm["cubin"])
        sass = subprocess.run([os.path.join(binp, "nvdisasm"), "-c", os.path.join(d, "k.cubin")],
                              capture_output=True, text=True).stdout
        open(os.path.join(d, "k.ptx"), "w").write(k.asm["ptx"])
        v = subprocess.run([os.path.join(binp, "ptxas"), "-arch=sm_90a", "-v", os.path.join(d, "k.ptx"), "-o",
                            os.path.join(d, "k2.cubin")], capture_output=True, text=True).stderr
    ops = loop_ops(sass)
    regs = re.findall(r"Used (\d+) registers", v)
    spills = re.findall(r"(\d+) bytes spill stores", v)
    return {"fmt": fmt, "rows": rows, "block_n": block_n, "block_k": block_k, "triton": triton.__version__,
            "regs": int(regs[0]) if regs else None, "spill_stores": int(spills[0]) if spills else None,
            "shared": k.metadata.shared, "loop_instructions": sum(ops.values()),
            "loop_per_weight_byte": round(sum(ops.values()) / (block_n * 16), 2),
            "loop_ldg128": ops.get("LDG.E.128", 0) + ops.get("LDG.E.128.CONSTANT", 0),
            "loop_shared_ops": sorted(o for o in ops if o.split(".")[0] in ("STS", "LDS", "BAR", "SHFL")),
            "local_memory_ops": sorted({o for o in re.findall(r"\b(STL|LDL)\S*", sass)})}


def _run_shape(fmt: str, m: int, n: int, k: int, rounds: int) -> dict:
    """One weight-only call ``[m, k] @ [n, k].T``: the probe, the planned call, the Triton GEMV with the
    planner's tiles and the register-streaming kernel, each checked against float64, then timed in
    interleaved rounds (CUDA-graph replays, inputs rotated past L2)."""
    import torch

    import blockscaled as bs
    from blockscaled.bench.timing import rotation_count, time_op
    from blockscaled.plan import H200_SXM, Problem
    from blockscaled.plan.direct import direct_config
    from blockscaled.plan.mx_gemv import mx_gemv_config
    from blockscaled.reference import gemm as ref_gemm
    from blockscaled.testing.tolerances import assert_gemm_close

    cfg_tr = mx_gemv_config(fmt, m, n, k, H200_SXM)  # the planner's GEMV tiles: rows per program
    bn = cfg_tr.block_n if m == 1 else min(cfg_tr.block_n, TWO_ROW_BLOCK_N)
    ce = constexprs(fmt, bn, 32 * WARPS * SLICE, m)  # one slice per thread: G = 128
    g = torch.Generator(device="cuda").manual_seed(n + k + m)
    sets = []
    for _ in range(rotation_count(n * k // 2 + n * k // 16 + 2 * m * k)):
        w = bs.quantize(torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16), fmt)
        sets.append((torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16), w))

    def gluon_gemv(x, w):
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        gs = w.global_scale if w.global_scale is not None else c  # read for nvfp4 only
        gemv_fp4_kernel[(triton.cdiv(n, ce["BLOCK_N"]),)](
            x, w.data, w.scale, gs, c, n, k, x.stride(0), w.data.stride(0), w.scale.stride(0), c.stride(0),
            num_warps=WARPS, **ce)
        return c

    direct = direct_config(Problem("gemm", fmt, m, n, k, "bfloat16"), H200_SXM)
    fns = {"gluon_gemv": gluon_gemv,
           "plan": lambda x, w: bs.gemm(x, w, torch.bfloat16),
           "triton_gemv": lambda x, w: bs.gemm(x, w, torch.bfloat16, config=cfg_tr),
           "direct": lambda x, w: bs.gemm(x, w, torch.bfloat16, config=direct)}
    ref = ref_gemm.gemm(*sets[0])
    for v, f in fns.items():
        out = f(*sets[0])
        torch.cuda.synchronize()
        assert_gemm_close(out, ref, fmt, torch.bfloat16, what=f"{v} {fmt} {m}x{n}x{k}")
    times = {v: [] for v in fns}
    for r in range(rounds):
        for v in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            times[v].append(time_op(fns[v], sets, warmup=3, iterations=20).median_ms * 1e3)
    med = {v: sorted(t)[len(t) // 2] for v, t in times.items()}
    return {"fmt": fmt, "m": m, "n": n, "k": k, "block_n": ce["BLOCK_N"], "block_k": ce["G"] * SLICE, "us": med,
            "over_gluon": {v: med[v] / med["gluon_gemv"] for v in med}}


def run(shapes, rounds: int, out_json: str | None) -> None:
    import torch

    rows = []
    for fmt in ("mxfp4", "nvfp4"):
        for m in (1, 2):
            for (n, k) in shapes:
                rows.append(_run_shape(fmt, m, n, k, rounds))
                print(json.dumps(rows[-1]))
    if out_json:
        json.dump({"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": rows},
                  open(out_json, "w"), indent=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aot", action="store_true", help="build for sm_90a only and print SASS facts")
    ap.add_argument("--shapes", default="2880x2880,5760x2880,4096x4096,1024x8192,8192x8192,4096x14336,28672x8192")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.aot:
        for fmt in FMT_CODES:
            for bn in (8, 4, 2):
                print(json.dumps(aot(fmt, bn)))
            print(json.dumps(aot(fmt, TWO_ROW_BLOCK_N, rows=2)))
        return 0
    run([tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")], a.rounds, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
