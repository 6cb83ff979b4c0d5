"""Issue 19's lever on Gluon 3.8: a 2-CTA cluster fp8 GEMM whose weight tile reaches both CTAs by one
TMA multicast, against the same kernel with one load per CTA, in one process.

The wide kernel (kernels/hopper/wide.py) moves 48 KB of A and B from L2 per 128 x 256 tile; DeepGEMM's
pair of CTAs shares one operand by multicast (NOTES, twenty-third session). This probe checks, before
any library kernel is built on it, that the cluster protocol below runs correctly and what the multicast
saves on an L2-bound tile:

- Gluon's cluster model (triton 3.8; 3.7 and 3.9 spell it otherwise, see HAVE_CLUSTER): with ``num_ctas=2`` a
  program is a cluster; a tensor's ``cga_layout`` bases map the CTA index to tile coordinates in units of CTA tiles (``[[1, 0]]``: the
  two CTAs hold the two halves along dim 0; ``[[0, 0]]``: both hold the whole tile). A replicated
  destination with ``tma.async_load(..., multicast=True)`` becomes one
  ``cp.async.bulk.tensor...multicast::cluster`` issued by CTA 0 with mask 0b11.
- Barriers: one allocated with a distributed layout (``mbarrier.allocate_mbarrier``) is one barrier per
  CTA, arrivals local; one with the replicated layout (``MBarrierLayout(cga_layout=[[0]])``) lives in
  CTA 0 only: its count is multiplied by the CTAs, every CTA's arrive goes to CTA 0
  (``mbarrier.arrive.shared::cluster``) and only CTA 0 waits (read off the 3.8 PTX).
- Ring protocol: ``full[s]`` per CTA (its A half + the whole B tile: the expected bytes); ``empty[s]``
  replicated: each CTA's warpgroup arrives after its wgmma on stage s has completed, and CTA 0 waits
  on it before its multicast overwrites stage s in both CTAs. The other CTA reuses its own A slot
  only after its own wgmma on it completed (program order: its warps wait for their wgmma before the next load is issued).

Modes: ``--aot`` (any machine with triton 3.8: builds for sm_90a, prints what the PTX holds);
default (sm_90 GPU): every variant checked against a float64 product of the fp8 operands, then timed
in interleaved rounds (``bench.timing.time_op``: CUDA-graph replays, inputs rotated past L2).
    python scripts/probes/multicast_probe.py --aot
    python scripts/probes/multicast_probe.py --shapes 4096x7168x2048,8192x4096x4096 --json mc.json
"""

from __future__ import annotations

import argparse
import json
import re

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

try:  # Gluon's cluster API
    from triton.experimental.gluon.language.nvidia.hopper import cluster, mbarrier, tma, warpgroup_mma, \
        warpgroup_mma_wait
    # The cluster API moves between releases: 3.7 has it but lowers a replicated barrier as a local
    # one (init count 1, arrive shared::cta: read off its PTX), so CTA 0 would not wait for the other
    # CTA; 3.9 has no fence_init_release_cluster / cluster.arrive and routes arrivals by a `from_cta`
    # mask. This protocol is written for 3.8 (torch 2.14's pin).
    HAVE_CLUSTER = tuple(int(x) for x in triton.__version__.split(".")[:2]) == (3, 8)
    # the TMA load's name: async_load from 3.8, async_copy_global_to_shared before (the library's
    # kernels/hopper/_compat.py resolves it the same way)
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
except ImportError:  # pragma: no cover - older triton
    HAVE_CLUSTER = False

# per cluster; each CTA: 128 x 256, the wide kernel's tile, as two 64-row warpgroups (8 warps); 4 stages
# of 16 KB (A) + 32 KB (B): 192 KB of ring
BM, BN, BK = 256, 256, 128
STAGES = 4
WARPS = 8


def layouts(ctas: int):
    """(A smem, B smem, accumulator) layouts for a cluster of ``ctas`` CTAs (1 or 2)."""
    split = [[1, 0]] if ctas == 2 else []
    rep = [[0, 0]] if ctas == 2 else []
    a = gl.NVMMASharedLayout(128, 8, rank=2, cga_layout=split)
    b = gl.NVMMASharedLayout(128, 8, rank=2, cga_layout=rep)
    acc = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BN, 32],
                                    cga_layout=split)
    return a, b, acc


@gluon.jit
def mc_gemm_kernel(a_desc, b_desc, c_ptr, M, N, K, stride_cm,
                   BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, CTAS: gl.constexpr,
                   A_L: gl.constexpr, B_L: gl.constexpr, ACC_L: gl.constexpr,
                   MULTICAST: gl.constexpr, ASYNC: gl.constexpr):
    """C[BM x BN tile] = A @ B^T, fp8 e4m3 in, fp32 out; CTAS = 1 or 2 (a cluster of two: A split
    along M, B whole in both, by multicast or by one load per CTA)."""
    pid_m = gl.program_id(0)
    pid_n = gl.program_id(1)
    a_s = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BM, BK], A_L)
    b_s = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, BK], B_L)
    full = mbarrier.allocate_mbarrier(batch=STAGES)
    if CTAS == 2:
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout(cga_layout=[[0]]))
    else:
        empty = mbarrier.allocate_mbarrier(batch=STAGES)
    for st in gl.static_range(STAGES):
        mbarrier.init(full.index(st), count=1)
        mbarrier.init(empty.index(st), count=1)
    if CTAS == 2:
        mbarrier.fence_init_release_cluster()
        cluster.arrive(relaxed=True)
        cluster.wait()
    nk = gl.cdiv(K, BK)
    # bytes landing in each CTA per stage: its A rows and the whole B tile
    STAGE_BYTES: gl.constexpr = (BM // CTAS) * BK + BN * BK
    for p in gl.static_range(STAGES - 1):
        if p < nk:
            mbarrier.expect(full.index(p), STAGE_BYTES)
            tma_load(a_desc, [pid_m * BM, p * BK], full.index(p), a_s.index(p))
            tma_load(b_desc, [pid_n * BN, p * BK], full.index(p), b_s.index(p), multicast=MULTICAST)
    acc = gl.zeros([BM, BN], gl.float32, ACC_L)
    for i in range(nk):
        s = i % STAGES
        mbarrier.wait(full.index(s), (i // STAGES) & 1)
        acc = warpgroup_mma(a_s.index(s), b_s.index(s).permute((1, 0)), acc, is_async=True)
        if ASYNC:  # keep wgmma i in flight: wait for i - 1, whose stage is the one refilled below
            acc, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_s.index(s), b_s.index(s)))
            if i > 0:
                mbarrier.arrive(empty.index((i - 1) % STAGES))
        else:
            acc, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a_s.index(s), b_s.index(s)))
            mbarrier.arrive(empty.index(s))
        j = i + STAGES - 1
        if j < nk:
            sj = j % STAGES  # == (i - 1) % STAGES
            if j >= STAGES:  # stage sj was read by iteration j - STAGES = i - 1 in both CTAs
                mbarrier.wait(empty.index(sj), ((j // STAGES) - 1) & 1)
            mbarrier.expect(full.index(sj), STAGE_BYTES)
            tma_load(a_desc, [pid_m * BM, j * BK], full.index(sj), a_s.index(sj))
            tma_load(b_desc, [pid_n * BN, j * BK], full.index(sj), b_s.index(sj), multicast=MULTICAST)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    if CTAS == 2:  # no CTA leaves while the other may still multicast into it or arrive on its barriers
        cluster.arrive()
        cluster.wait()
    # stored from the accumulator's registers (a layout conversion would need 128 KB of shared memory), in
    # bf16 as the library's kernels (the first two GPU runs, sync and async pipelines, stored fp32)
    rm = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, ACC_L))
    rn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, ACC_L))
    gl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@gluon.jit
def mc_gemm_persistent_kernel(a_desc, b_desc, c_ptr, M, N, K, stride_cm,
                              BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
                              CTAS: gl.constexpr, A_L: gl.constexpr, B_L: gl.constexpr, ACC_L: gl.constexpr,
                              MULTICAST: gl.constexpr, ASYNC: gl.constexpr):
    """The same tile and ring as ``mc_gemm_kernel`` (async pipeline), persistent: one program per SM
    (per pair of SMs for a cluster) walks the tiles, M fastest, so a cluster is co-scheduled once, not per
    tile. The ring's stage and phase follow one step counter across tiles. With MULTICAST the ``empty``
    barriers are replicated (CTA 0 waits for both CTAs before its multicast refills a stage); without, each
    CTA keeps its own (``two_loads``: a cluster that shares nothing)."""
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    num_m = gl.cdiv(M, BM)
    tiles = num_m * gl.cdiv(N, BN)
    nk = gl.cdiv(K, BK)
    a_s = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BM, BK], A_L)
    b_s = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, BK], B_L)
    full = mbarrier.allocate_mbarrier(batch=STAGES)
    if MULTICAST:
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout(cga_layout=[[0]]))
    else:
        empty = mbarrier.allocate_mbarrier(batch=STAGES)
    for st in gl.static_range(STAGES):
        mbarrier.init(full.index(st), count=1)
        mbarrier.init(empty.index(st), count=1)
    if CTAS == 2:
        mbarrier.fence_init_release_cluster()
        cluster.arrive(relaxed=True)
        cluster.wait()
    STAGE_BYTES: gl.constexpr = (BM // CTAS) * BK + BN * BK
    g_load = 0  # steps whose loads were issued, over all tiles of this program
    g_use = 0  # steps consumed
    for t in range(pid, tiles, nprog):
        pid_m = t % num_m
        pid_n = t // num_m
        for p in gl.static_range(STAGES - 1):
            if p < nk:
                sl = g_load % STAGES
                if g_load >= STAGES:  # the step that used stage sl before, consumed (and arrived) by both CTAs
                    mbarrier.wait(empty.index(sl), ((g_load // STAGES) - 1) & 1)
                mbarrier.expect(full.index(sl), STAGE_BYTES)
                tma_load(a_desc, [pid_m * BM, p * BK], full.index(sl), a_s.index(sl))
                tma_load(b_desc, [pid_n * BN, p * BK], full.index(sl), b_s.index(sl), multicast=MULTICAST)
                g_load += 1
        acc = gl.zeros([BM, BN], gl.float32, ACC_L)
        for i in range(nk):
            s = g_use % STAGES
            mbarrier.wait(full.index(s), (g_use // STAGES) & 1)
            acc = warpgroup_mma(a_s.index(s), b_s.index(s).permute((1, 0)), acc, is_async=True)
            acc, _, _ = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_s.index(s), b_s.index(s)))
            if i > 0:
                mbarrier.arrive(empty.index((g_use - 1) % STAGES))
            j = i + STAGES - 1
            if j < nk:
                sl = g_load % STAGES  # == (g_use - 1) % STAGES
                if g_load >= STAGES:
                    mbarrier.wait(empty.index(sl), ((g_load // STAGES) - 1) & 1)
                mbarrier.expect(full.index(sl), STAGE_BYTES)
                tma_load(a_desc, [pid_m * BM, j * BK], full.index(sl), a_s.index(sl))
                tma_load(b_desc, [pid_n * BN, j * BK], full.index(sl), b_s.index(sl), multicast=MULTICAST)
                g_load += 1
            g_use += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index((g_use - 1) % STAGES))  # the tile's last step
        rm = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, ACC_L))
        rn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, ACC_L))
        gl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))
    if CTAS == 2:
        cluster.arrive()
        cluster.wait()


VARIANTS = {"multicast": (2, True), "two_loads": (2, False), "one_cta": (1, False)}


#: "async": one wgmma kept in flight (each stage freed when the next step's wgmma is issued: how the
#: library's kernels run); "sync": every wgmma waited on before the next load (the first probe);
#: "persistent": async, one program per SM (per SM pair) walking the tiles (mc_gemm_persistent_kernel)
PIPELINES = ("async", "sync", "persistent")


def _constexprs(variant: str, pipeline: str = "async") -> dict:
    ctas, mc = VARIANTS[variant]
    a, b, acc = layouts(ctas)
    bm = BM if ctas == 2 else BM // 2
    return {"BM": bm, "BN": BN, "BK": BK, "STAGES": STAGES, "CTAS": ctas, "A_L": a, "B_L": b, "ACC_L": acc,
            "MULTICAST": mc, "ASYNC": pipeline == "async"}


def aot(variant: str = "multicast", pipeline: str = "async") -> dict:
    """Build for sm_90a without a GPU; what the PTX holds."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    ce = _constexprs(variant, pipeline)
    sig = {"a_desc": f"tensordesc<fp8e4nv[{ce['BM']}, {BK}],{ce['A_L']!r}>",
           "b_desc": f"tensordesc<fp8e4nv[{BN}, {BK}],{ce['B_L']!r}>",
           "c_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "stride_cm": "i32"}
    sig.update({k: "constexpr" for k in ce})
    kern = mc_gemm_persistent_kernel if pipeline == "persistent" else mc_gemm_kernel
    k = triton.compile(GluonASTSource(kern, sig, constexprs=ce), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": WARPS, "num_ctas": VARIANTS[variant][0]})
    ptx = k.asm["ptx"]
    return {"variant": variant, "pipeline": pipeline, "triton": triton.__version__,
            "wgmma_waits": sorted(set(re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx))),
            "multicast_loads": len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\S*multicast::cluster",
                                              ptx)),
            "tma_loads": len(re.findall(r"cp\.async\.bulk\.tensor\.2d", ptx)),
            "ctas_per_cluster": re.findall(r"\.reqnctapercluster (\d+)", ptx),
            "cluster_arrives": len(re.findall(r"mbarrier\.arrive\S*shared::cluster", ptx)),
            "wgmma": sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\w+)\.f32\.e4m3\.e4m3", ptx))),
            "tma_boxes": [d["block_size"] for d in k.metadata.tensordesc_meta], "shared": k.metadata.shared}


def run(shapes, rounds: int, out_json: str | None, pipeline: str = "async") -> None:
    import torch

    from blockscaled.bench.timing import rotation_count, time_op
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    rows = []
    for (m, n, k) in shapes:
        sets = rotation_count(m * k + n * k + 4 * m * n)
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        ops = []
        for _ in range(sets):
            a = (torch.randn(m, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
            b = (torch.randn(n, k, device="cuda", generator=g) * 2).to(torch.float8_e4m3fn)
            ops.append((a, b, torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)))
        ref = (ops[0][0].double() @ ops[0][1].double().T)

        def call(variant):
            ce = _constexprs(variant, pipeline)
            ctas = ce["CTAS"]

            def f(a, b, c):
                ad = TensorDescriptor.from_tensor(a, [ce["BM"], BK], ce["A_L"])
                bd = TensorDescriptor.from_tensor(b, [BN, BK], ce["B_L"])
                tiles = triton.cdiv(m, ce["BM"]) * triton.cdiv(n, BN)
                if pipeline == "persistent":  # one program per SM (a cluster per SM pair)
                    grid = (min(tiles, torch.cuda.get_device_properties(0).multi_processor_count // ctas),)
                    mc_gemm_persistent_kernel[grid](ad, bd, c, m, n, k, c.stride(0), num_warps=WARPS, num_ctas=ctas,
                                                    **ce)
                else:
                    grid = (triton.cdiv(m, ce["BM"]), triton.cdiv(n, BN))
                    mc_gemm_kernel[grid](ad, bd, c, m, n, k, c.stride(0), num_warps=WARPS, num_ctas=ctas, **ce)
            return f

        fns = {v: call(v) for v in VARIANTS}
        outs, errs = {}, {}
        for v, f in fns.items():
            ops[0][2].fill_(float("nan"))
            f(*ops[0])
            torch.cuda.synchronize()
            outs[v] = ops[0][2].clone()
            errs[v] = ((outs[v].double() - ref).norm() / ref.norm()).item()
            # Hopper's fp8 wgmma does not accumulate at full fp32 precision (its adder keeps ~14 bits over a
            # long K: DeepSeek-V3 report, hence the library's promotion every 128 K); on the first GPU run
            # (fortieth session's probe, H200) every variant sat at ~8.5e-4 relative over K = 2048
            assert errs[v] < 1e-2, (v, m, n, k, errs[v])
        # one cluster's tile runs the same wgmma chain as a lone CTA's, so a race shows as a difference (recorded,
        # and the row marked: its times do not count)
        equal = {v: torch.equal(outs[v], outs["one_cta"]) for v in ("multicast", "two_loads")}
        if not all(equal.values()):
            print(f"!! {m}x{n}x{k}: differs from one_cta: {equal}")
        times = {v: [] for v in fns}
        for r in range(rounds):
            order = list(fns) if r % 2 == 0 else list(reversed(fns))
            for v in order:
                times[v].append(time_op(fns[v], ops, warmup=5, iterations=30).median_ms * 1e3)
        med = {v: sorted(t)[len(t) // 2] for v, t in times.items()}
        row = {"m": m, "n": n, "k": k, "pipeline": pipeline, "rel_err_vs_f64": errs, "bitwise_equal_to_one_cta": equal,
               "us": med, "tflops": {v: 2 * m * n * k / us / 1e6 for v, us in med.items()},
               "multicast_over_two_loads": med["two_loads"] / med["multicast"]}
        rows.append(row)
        print(json.dumps(row))
    if out_json:
        json.dump({"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": rows},
                  open(out_json, "w"), indent=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aot", action="store_true", help="build for sm_90a only (no GPU) and print the PTX facts")
    ap.add_argument("--shapes", default="4096x7168x2048,8192x4096x4096,4096x2112x7168")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--pipeline", default="async", choices=PIPELINES)
    a = ap.parse_args(argv)
    if not HAVE_CLUSTER:
        print(f"triton {triton.__version__}: this probe's cluster protocol is written for triton 3.8")
        return 2
    if a.aot:
        for v in VARIANTS:
            print(json.dumps(aot(v, a.pipeline)))
        return 0
    run([tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")], a.rounds, a.json, a.pipeline)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
