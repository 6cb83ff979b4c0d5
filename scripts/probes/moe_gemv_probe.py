"""The grouped (MoE decode) form of the fp4 Gluon GEMV (kernels/hopper/mx_gemv_gluon.py), before the library
takes it: does it beat the register-streaming kernel's grouped form at a few rows per expert?

Why (benchmarks/NOTES.md, twenty-ninth and forty-second sessions): at one token the grouped register-streaming
kernel is latency-bound (Qwen3-30B-A3B gate at T = 1: 0.48 TB/s, 1.5 warps per scheduler, 69 % of cycles
with no eligible warp), and the MoE layer's GEMMs at T = 1 sit at 11-13 % of the memory floor
(moe-layer-20261129-1546). The dense Gluon GEMV beat the register-streaming kernel 1.04-1.62x on weights up
to 12 MB at one row, and the experts a decode step touches are exactly such weights (Qwen3-30B-A3B: 8 x 1.5
MB gate_up; gpt-oss-20b: 4 x 8.3 MB). With SWIGLU the program holds a stacked gate_up weight's gate rows and the matching
up rows and stores ``silu(g) * u`` (the library's stacked SwiGLU runs a grouped GEMM into fp32 products and a
second pass); timed on the stacked gate_up cases (gpt-oss interleaves its gate / up rows: not this layout).

The kernel: contiguous grouped layout (rows sorted by expert, ``offsets [E + 1]``), weight-only mxfp4 /
nvfp4, bf16 activations. Program (slot, n-block): ``slot`` is the slot-th expert with rows (a grid of min(E,
sum_m) slots, as the library's grouped kernels compact it), ``n-block`` its BLOCK_N weight rows; the program
walks its expert's rows one at a time with the dense kernel's K loop (the weights of a second row come from
L2). Layouts, decode, scales and numerics are the dense kernel's (its ``_row_part`` / ``_store_row``);
nvfp4 global scales per tensor or per expert. Tiles: ``gluon_gemv_config`` of the dense problem with the
slots' rows (slots x N), so the rule keeps >= 8 warps per SM in flight.

    python scripts/probes/moe_gemv_probe.py --aot             # sm_90a builds, SASS facts of the K loop
    python scripts/probes/moe_gemv_probe.py --json m.json     # GPU: float64 check, then timed against the
                                                              # planner's grouped plan, same process
"""

from __future__ import annotations

import argparse
import json

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# private: the dense Gluon GEMV's layouts, per-slice products and store (the library kernel's instructions)
from blockscaled.kernels.hopper.mx_gemv_gluon import FMT_CODES, SLICE, _row_part, _store_row, constexprs
# private: the Triton GEMV's e2m1 decode (PRMT table), which the dense Gluon GEMV uses too
from blockscaled.kernels.triton.mx_gemv import _FP4_ASM
from blockscaled.testing.sass import loop_ops

#: (name, experts, top-k, N, K) of the expert GEMMs timed: weight-only, gate_up stacked (2 x intermediate)
CASES = (("qwen3-30b-a3b gate_up", 128, 8, 1536, 2048), ("qwen3-30b-a3b down", 128, 8, 2048, 768),
         ("gpt-oss-20b gate_up", 32, 4, 5760, 2880), ("gpt-oss-20b down", 32, 4, 2880, 2880),
         ("gpt-oss-120b gate_up", 128, 4, 5760, 2880), ("olmoe gate_up", 64, 8, 2048, 2048),
         ("qwen2-57b-a14b gate_up", 64, 8, 5120, 3584))


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _slot_expert(seg_ptr, slot, M, NUM_E: gl.constexpr, P: gl.constexpr, WARPS: gl.constexpr):
    """(the slot-th expert, from 0, whose clamped offsets hold rows; whether there is one) from ``seg [NUM_E + 1]``
    (the library's stream.py ``_active_expert`` with a layout for this kernel's warps; P: NUM_E's power of two)."""
    L: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    idx = gl.arange(0, P, layout=L)
    ok = idx < NUM_E
    lo = gl.minimum(gl.maximum(gl.load(seg_ptr + idx, mask=ok, other=0), 0), M)
    hi = gl.minimum(gl.maximum(gl.load(seg_ptr + idx + 1, mask=ok, other=0), 0), M)
    act = ok & (hi > lo)
    hit = act & (gl.associative_scan(act.to(gl.int32), 0, _add) == slot + 1)
    return gl.sum(gl.where(hit, idx, 0), axis=0), gl.sum(hit.to(gl.int32), axis=0) > 0


@gluon.jit
def moe_gemv_kernel(x_ptr, b_ptr, bs_ptr, gs_ptr, c_ptr, seg_ptr, M, N, K, stride_xm, stride_be, stride_bn,
                    stride_bse, stride_bsn, stride_cm, FMT: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
                    G: gl.constexpr, W3: gl.constexpr, X2: gl.constexpr, S3: gl.constexpr, NUM_E: gl.constexpr,
                    P: gl.constexpr, GS_PER_E: gl.constexpr, SWIGLU: gl.constexpr):
    """``c[rows of e] = x[rows of e] @ B[e].T`` for the slot-th expert with rows. B packed e2m1 ``[E, N, K / 2]``,
    scales ``[E, N, K / 32]`` E8M0 (FMT 2) or ``[E, N, K / 16]`` e4m3 (FMT 3) with an fp32 global scale (one, or
    one per expert: GS_PER_E); x bf16 ``[M, K]``; c bf16 ``[M, N]``. ROWS is 1 (the dense kernel's constexpr).
    SWIGLU: B is a stacked gate_up ``[E, 2N, K / 2]`` (gate rows, then up rows) and ``c = silu(g) * u`` in fp32
    with one cast (the library's stacked SwiGLU numerics): a program loads its gate rows and the matching up
    rows, so no ``[M, 2N]`` product is written and no second pass runs."""
    WS: gl.constexpr = gl.SliceLayout(2, W3)
    e, ok = _slot_expert(seg_ptr, gl.program_id(0), M, NUM_E, P, G // 32)
    if ok:
        lo = gl.minimum(gl.maximum(gl.load(seg_ptr + e), 0), M)
        hi = gl.minimum(gl.maximum(gl.load(seg_ptr + e + 1), 0), M)
        pid = gl.program_id(1)
        b_e = b_ptr + e.to(gl.int64) * stride_be
        bs_e = bs_ptr + e.to(gl.int64) * stride_bse
        if GS_PER_E:
            gs_e = gs_ptr + e
        else:
            gs_e = gs_ptr
        offs_n = pid * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, WS))
        mask_n = offs_n < N
        offs_n = gl.where(mask_n, offs_n, 0)
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
        up_w = N.to(gl.int64) * stride_bn  # the up rows' offset (SWIGLU)
        up_s = N.to(gl.int64) * stride_bsn
        for row in range(lo, hi):
            x_row = x_ptr + row.to(gl.int64) * stride_xm
            acc = gl.zeros([G, BLOCK_N], gl.float32, WS)
            acc_u = gl.zeros([G, BLOCK_N], gl.float32, WS)
            for k0 in range(0, K, G * SLICE):
                kmask_w = (k0 + g_w * SLICE) < K
                w = gl.load(b_e + k0 // 2 + w_off, mask=kmask_w[:, None, None], other=0)
                if SWIGLU:
                    w_u = gl.load(b_e + up_w + k0 // 2 + w_off, mask=kmask_w[:, None, None], other=0)
                xmask = ((k0 + g_x * SLICE) < K)[:, None]
                x0 = gl.load(x_row + k0 + x_off, mask=xmask, other=0.0).to(gl.float32)
                wa, wb = gl.inline_asm_elementwise(_FP4_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r", [w],
                                                   dtype=(gl.float32, gl.float32), is_pure=True, pack=4)
                if FMT == 3:
                    s_ptr = bs_e + k0 // 16 + s_off
                    s_mask = ((k0 + g_s * SLICE) < K)[:, None, None]
                else:
                    s_ptr = bs_e + k0 // 32 + s_off
                    s_mask = kmask_w[:, None]
                acc += _row_part(x0, wa, wb, s_ptr, s_mask, FMT, G, BLOCK_N, W3, S3)
                if SWIGLU:
                    ua, ub = gl.inline_asm_elementwise(_FP4_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r", [w_u],
                                                       dtype=(gl.float32, gl.float32), is_pure=True, pack=4)
                    acc_u += _row_part(x0, ua, ub, s_ptr + up_s, s_mask, FMT, G, BLOCK_N, W3, S3)
            c_row = c_ptr + row.to(gl.int64) * stride_cm
            if SWIGLU:
                g = gl.sum(acc, axis=0)
                u = gl.sum(acc_u, axis=0)
                if FMT == 3:
                    inv = gl.div_rn(gl.full([], 1.0, gl.float32), gl.load(gs_e))
                    g = g * inv
                    u = u * inv
                y = g / (1.0 + gl.exp(-g)) * u
                gl.store(c_row + offs_n, y.to(c_ptr.dtype.element_ty), mask=mask_n)
            else:
                _store_row(c_row, acc, gs_e, gs_e, offs_n, mask_n, FMT, False)


def kernel_constexprs(fmt: str, num_e: int, block_n: int, warps: int, gs_per_e: bool = False,
                      swiglu: bool = False) -> dict:
    ce = constexprs(fmt, 1, block_n, warps)
    ce.update(NUM_E=num_e, P=max(32 * warps, 1 << (num_e - 1).bit_length()), GS_PER_E=gs_per_e, SWIGLU=swiglu)
    return ce


def aot(fmt: str, num_e: int, block_n: int, warps: int, swiglu: bool = False) -> dict:
    """Build for sm_90a (no GPU) and read the K loop's SASS (blockscaled.testing.sass)."""
    import os
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    ce = kernel_constexprs(fmt, num_e, block_n, warps, swiglu=swiglu)
    sig = {"x_ptr": "*bf16", "b_ptr": "*u8", "bs_ptr": "*u8" if fmt == "mxfp4" else "*fp8e4nv", "gs_ptr": "*fp32",
           "c_ptr": "*bf16", "seg_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
           "stride_be": "i32", "stride_bn": "i32", "stride_bse": "i32", "stride_bsn": "i32", "stride_cm": "i32"}
    sig.update({k: "constexpr" for k in ce})
    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, t) in enumerate(sig.items())
             if t.startswith("*") or name in ("N", "K", "stride_xm", "stride_be", "stride_bn", "stride_bse",
                                              "stride_bsn", "stride_cm")}
    k = triton.compile(GluonASTSource(moe_gemv_kernel, sig, constexprs=ce, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    binp = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "k.cubin"), "wb").write(k.asm["cubin"])
        nvdisasm = os.path.join(binp, "nvdisasm")
        sass = subprocess.run([nvdisasm if os.path.exists(nvdisasm) else "nvdisasm", "-c", os.path.join(d, "k.cubin")],
                              capture_output=True, text=True).stdout
        open(os.path.join(d, "k.ptx"), "w").write(k.asm["ptx"])
        v = subprocess.run([os.path.join(binp, "ptxas"), "-arch=sm_90a", "-v", os.path.join(d, "k.ptx"), "-o",
                            os.path.join(d, "k2.cubin")], capture_output=True, text=True).stderr
    ops = loop_ops(sass, innermost_with="LDG")  # the K loop inside the loop over the expert's rows
    spills = re.findall(r"(\d+) bytes spill stores", v)
    regs = re.findall(r"Used (\d+) registers", v)
    return {"fmt": fmt, "experts": num_e, "block_n": block_n, "warps": warps, "swiglu": swiglu,
            "triton": triton.__version__,
            "regs": int(regs[0]) if regs else None, "spill_stores": int(spills[0]) if spills else None,
            "weight_rows": block_n * (2 if swiglu else 1),  # per program: gate and up rows with SWIGLU
            "loop_per_weight_byte": round(sum(ops.values()) / (block_n * (2 if swiglu else 1) * 16), 2),
            "loop_ldg128": ops.get("LDG.E.128", 0) + ops.get("LDG.E.128.CONSTANT", 0),
            "loop_shared_ops": sorted(o for o in ops if o.split(".")[0] in ("STS", "LDS", "BAR", "SHFL")),
            "local_memory_ops": sorted({o for o in re.findall(r"\b(STL|LDL)\S*", sass)})}


def _routing(t: int, e: int, k: int, g):
    """Offsets [E + 1] (int32, cuda) of T tokens routed to k distinct experts each (uniform)."""
    import torch

    ids = torch.rand(t, e, generator=g, device="cuda").topk(k, dim=1).indices.flatten()
    counts = torch.bincount(ids, minlength=e)
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)


def _run_case(name, e, topk, n, k, fmt, t, rounds, swiglu=False) -> dict:
    import torch

    import blockscaled as bs
    from blockscaled.bench.timing import rotation_count, time_op
    from blockscaled.plan import H200_SXM, Problem, observe_plans
    from blockscaled.plan.mx_gemv import gluon_gemv_config
    from blockscaled.reference.grouped import grouped_gemm_contiguous
    from blockscaled.reference.grouped import swiglu as swiglu_ref
    from blockscaled.testing.tolerances import assert_gemm_close

    m = t * topk
    g = torch.Generator(device="cuda").manual_seed(e + n + k + t)
    w = bs.quantize((torch.randn(e, n, k, device="cuda", generator=g) * 0.05).to(torch.bfloat16), fmt)
    touched = topk * t * (n * k // 2 + n * k // 16) + m * k * 2
    sets = [(torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16), w, _routing(t, e, topk, g))
            for _ in range(rotation_count(touched))]
    slots = min(e, m)
    cfg = gluon_gemv_config(Problem("gemm", fmt, 1, slots * n, k, a="bfloat16", b_block_rows=1), H200_SXM)
    n_out = n // 2 if swiglu else n
    bn = max(2, cfg.block_n // 2) if swiglu else cfg.block_n  # SWIGLU: gate and up rows per program
    ce = kernel_constexprs(fmt, e, bn, cfg.num_warps, swiglu=swiglu)

    def probe(x, w, seg):
        c = torch.empty(m, n_out, device="cuda", dtype=torch.bfloat16)
        gs = w.global_scale if w.global_scale is not None else seg
        moe_gemv_kernel[(slots, triton.cdiv(n_out, bn))](
            x, w.data, w.scale, gs, c, seg, m, n_out, k, x.stride(0), w.data.stride(0), w.data.stride(1),
            w.scale.stride(0), w.scale.stride(1), c.stride(0), num_warps=cfg.num_warps, **ce)
        return c

    if swiglu:  # the library's stacked gate_up SwiGLU: a grouped GEMM into fp32 products, then silu * mul
        fns = {"probe": probe, "plan": lambda x, w, seg: bs.swiglu(x, w, offsets=seg)}
    else:
        fns = {"probe": probe, "plan": lambda x, w, seg: bs.grouped_gemm(x, w, offsets=seg)}
    x0, _, seg0 = sets[0]
    ref = swiglu_ref(x0, w, offsets=seg0) if swiglu else grouped_gemm_contiguous(x0, w, seg0)
    ran = {}
    for v, f in fns.items():
        with observe_plans() as seen:
            out = f(*sets[0])
        torch.cuda.synchronize()
        ran[v] = "; ".join(p.describe() for p in seen) or (
            f"gluon moe GEMV{' + SwiGLU' if swiglu else ''} {bn} rows x {cfg.block_k} K, {cfg.num_warps} warps")
        assert_gemm_close(out, ref, fmt, torch.bfloat16, what=f"{v} {name} {fmt} T={t}")
    times = {v: [] for v in fns}
    for r in range(rounds):
        for v in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            times[v].append(time_op(fns[v], sets, warmup=3, iterations=20).median_ms * 1e3)
    med = {v: sorted(x)[len(x) // 2] for v, x in times.items()}
    return {"case": name + (" swiglu" if swiglu else ""), "fmt": fmt, "tokens": t, "experts": e, "topk": topk,
            "n": n, "k": k, "us": med,
            "plan_over_probe": med["plan"] / med["probe"], "ran": ran}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aot", action="store_true", help="build for sm_90a only and print SASS facts")
    ap.add_argument("--tokens", default="1,4", help="decode tokens per call (rows = tokens x top-k)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.aot:
        for fmt in FMT_CODES:
            for num_e, bn, warps in ((128, 4, 2), (32, 2, 1), (8, 4, 4)):
                print(json.dumps(aot(fmt, num_e, bn, warps)))
            for num_e, bn, warps in ((128, 2, 2), (32, 2, 4)):
                print(json.dumps(aot(fmt, num_e, bn, warps, swiglu=True)))
        return 0
    import torch

    rows = []
    for name, e, topk, n, k in CASES:
        for fmt in FMT_CODES:
            for t in (int(x) for x in a.tokens.split(",")):
                for swiglu in ((False, True) if "gate_up" in name and "gpt-oss" not in name else (False,)):
                    rows.append(_run_case(name, e, topk, n, k, fmt, t, a.rounds, swiglu))
                    print(json.dumps(rows[-1]), flush=True)
    if a.json:
        json.dump({"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": rows},
                  open(a.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
