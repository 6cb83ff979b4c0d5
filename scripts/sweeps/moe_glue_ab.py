"""A/B of the MoE layer's decode glue, same process: ``blockscaled.nn.MoE`` as it runs against the
layer as it ran before the one-launch routing + permutation.

    python scripts/sweeps/moe_glue_ab.py [--archs qwen3-30b-a3b,deepseek-v3] [--tokens 1,4,8,16]
        [--formats fp8_block,mxfp4,nvfp4] [--rounds 5] [--json OUT.json] [--profile]

Variants (one layer object, the paths switched by patching the module functions, so the weights,
inputs and plans are the same):

  new   ``MoE.forward``: ``ops.moe.route_permute`` (top-k and the counting sort in one program), the
        grouped GEMMs without metadata checks, the combine checking the sort's offsets
  old   ``route_topk`` and ``permute`` as two launches, each grouped GEMM followed by its device
        metadata check, the combine without the check (the forward before this change)

Each row: both variants' outputs are compared bitwise first (they must be equal: the same
routing, the same rows, the same kernels), then timed in ``--rounds`` interleaved rounds with
``blockscaled.bench.timing.time_op`` (CUDA-graph replays, inputs rotated past L2) and eagerly
(``time_eager_wall``: wall clock of back-to-back calls, what an eager decode step pays). Printed:
median us per variant and old / new (> 1: the new path is faster). ``--profile``: the kernels of
one eager forward per variant (torch.profiler, device time each) for the first row.

Layer dimensions are the bench's (``blockscaled.bench.layers.ARCHS``), random weights and router;
W x A (activations quantized to the weights' format) and weight-only per format.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys

import torch

import blockscaled as bs
from blockscaled.bench.layers import ARCHS
from blockscaled.bench.timing import rotation_count, time_eager_wall, time_op
from blockscaled.nn import experts as nn_experts
from blockscaled.nn import moe as nn_moe
from blockscaled.ops import moe as glue


@contextlib.contextmanager
def old_path():
    """The forward before the one-launch glue: routing and permutation apart, per-GEMM checks."""
    real_rp, real_sorted = nn_moe.route_permute, nn_experts.Experts._sorted_forward

    def sorted_forward(self, x, top_k_index, top_k_weights, perm):
        order, token, offsets, inv = perm
        biased = self.gate_bias is not None or self.up_bias is not None or self.down_bias is not None
        y = self.expert_rows(x[token], offsets, top_k_index.reshape(-1)[order] if biased else None)
        return glue.combine(y, top_k_weights, inv, x.dtype)

    nn_moe.route_permute = lambda *a, **k: None
    nn_experts.Experts._sorted_forward = sorted_forward
    try:
        yield
    finally:
        nn_moe.route_permute, nn_experts.Experts._sorted_forward = real_rp, real_sorted


def build(arch, fmt: str, weight_only: bool, device: str = "cuda"):
    a = ARCHS[arch]
    g = torch.Generator(device=device).manual_seed(7)
    e, h, i = a.experts, a.hidden, a.intermediate

    def rnd(*shape):
        return (torch.randn(*shape, generator=g, device=device) * 0.02).to(torch.bfloat16)

    moe = nn_moe.MoE.from_dense(rnd(e, i, h), rnd(e, i, h), rnd(e, h, i), rnd(e, h) * 50, fmt, top_k=a.top_k,
                                score=a.score, n_group=a.n_group, topk_group=a.topk_group,
                                routed_scaling_factor=a.routed_scaling_factor,
                                act_format=None if weight_only else "weights")
    return moe


def run_row(moe, t: int, rounds: int) -> dict:
    h = moe.hidden
    sets = rotation_count(t * h * 2 + moe.num_experts * h * 2, max_sets=8)
    xs = [((torch.randn(t, h, device="cuda") * 0.5).to(torch.bfloat16),) for _ in range(sets)]
    with torch.no_grad():
        y_new = moe(xs[0][0])
        with old_path():
            y_old = moe(xs[0][0])
    equal = bool(torch.equal(y_new, y_old))
    fused = moe.route_permute(torch.zeros(t, moe.num_experts, device="cuda", dtype=torch.bfloat16)) is not None
    graph = {"new": [], "old": []}
    eager = {"new": [], "old": []}
    for r in range(rounds):
        for name in (("new", "old") if r % 2 == 0 else ("old", "new")):
            ctx = old_path() if name == "old" else contextlib.nullcontext()
            with ctx, torch.no_grad():
                graph[name].append(time_op(moe, xs, warmup=3, iterations=15).median_ms * 1e3)
                eager[name].append(time_eager_wall(moe, xs, warmup=3, iterations=15).median_ms * 1e3)
    med = {k: statistics.median(v) for k, v in graph.items()}
    emed = {k: statistics.median(v) for k, v in eager.items()}
    return {"tokens": t, "fused": fused, "equal": equal, "graph_us": med, "eager_us": emed,
            "graph_ratio": statistics.median(o / n for o, n in zip(graph["old"], graph["new"])),
            "eager_ratio": statistics.median(o / n for o, n in zip(eager["old"], eager["new"]))}


def profile(moe, t: int) -> dict:
    x = (torch.randn(t, moe.hidden, device="cuda") * 0.5).to(torch.bfloat16)
    out = {}
    for name in ("new", "old"):
        ctx = old_path() if name == "old" else contextlib.nullcontext()
        with ctx, torch.no_grad():
            for _ in range(3):
                moe(x)
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                moe(x)
                torch.cuda.synchronize()
        ks = [(e.name, e.device_time) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        out[name] = {"kernels": len(ks), "device_us": sum(d for _, d in ks), "list": [(n[:80], round(d, 2)) for n, d in ks]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", default="qwen3-30b-a3b,deepseek-v3")
    ap.add_argument("--tokens", default="1,4,8,16")
    ap.add_argument("--formats", default="fp8_block,mxfp4,nvfp4")
    ap.add_argument("--modes", default="wxa,wo")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args(argv)
    rows, prof = [], None
    for arch in a.archs.split(","):
        for fmt in a.formats.split(","):
            for mode in a.modes.split(","):
                moe = build(arch, fmt, mode == "wo")
                for t in (int(x) for x in a.tokens.split(",")):
                    r = {"arch": arch, "format": fmt, "mode": mode, **run_row(moe, t, a.rounds)}
                    rows.append(r)
                    print(f"{arch:14s} {fmt:9s} {mode:3s} T={t:3d} fused={r['fused']!s:5s} equal={r['equal']!s:5s} "
                          f"graph new {r['graph_us']['new']:7.1f} old {r['graph_us']['old']:7.1f} "
                          f"x{r['graph_ratio']:.3f} | eager new {r['eager_us']['new']:7.1f} "
                          f"old {r['eager_us']['old']:7.1f} x{r['eager_ratio']:.3f}", flush=True)
                    if a.profile and prof is None and t == 1:
                        prof = {"row": f"{arch} {fmt} {mode} T=1", **profile(moe, 1)}
                        for name in ("new", "old"):
                            p = prof[name]
                            print(f"  profile {name}: {p['kernels']} kernels, {p['device_us']:.1f} us device")
                            for n, d in p["list"]:
                                print(f"    {d:7.2f}  {n}")
                del moe
                torch.cuda.empty_cache()
    bs.check_errors()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "profile": prof, "gpu": torch.cuda.get_device_name()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
