"""One-off probe (thirty-seventh session): route_topk, route_topk + permute and route_permute at 1-8 warps,
CUDA graphs of back-to-back calls, on three expert counts. Run: python scripts/probes/route_permute_probe.py OUT.json
(set ops.moe.route_permute_warps by editing; the run patched a ROUTE_PERMUTE_WARPS constant)."""
import torch, statistics, json, sys
import blockscaled as bs
from blockscaled.ops import moe as glue
from blockscaled.bench.timing import time_op
res = []
for (e, k, sig, ng, tg) in [(128, 8, False, None, None), (256, 8, True, 8, 4), (32, 4, False, None, None)]:
    bias = torch.rand(e, device="cuda") * 0.01 if sig else None
    for t in (1, 2, 4, 8, 16):
        if t * k > glue.PERMUTE_MAX: continue
        xs = [(torch.randn(t, e, device="cuda").bfloat16(),) for _ in range(4)]
        row = {"E": e, "k": k, "T": t}
        f_route = lambda x: glue.route_topk(x, k, sig, ng, tg, bias, True, 1.0)
        def f_two(x):
            w, ids = glue.route_topk(x, k, sig, ng, tg, bias, True, 1.0)
            return glue.permute(ids, e)
        row["route"] = time_op(f_route, xs, warmup=3, iterations=20).median_ms * 1e3
        row["route+permute"] = time_op(f_two, xs, warmup=3, iterations=20).median_ms * 1e3
        for nw in (1, 2, 4, 8):
            glue.ROUTE_PERMUTE_WARPS = nw
            f = lambda x: glue.route_permute(x, k, sig, ng, tg, bias, True, 1.0)
            if f(xs[0][0]) is None: continue
            row[f"fused_w{nw}"] = time_op(f, xs, warmup=3, iterations=20).median_ms * 1e3
        print(json.dumps({a: (round(b, 2) if isinstance(b, float) else b) for a, b in row.items()}), flush=True)
        res.append(row)
json.dump(res, open(sys.argv[1], "w"))
