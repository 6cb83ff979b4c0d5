"""Dev diagnostic (H100): which strategy gemm() takes at M=4096 and how each forced variant
times, plus a small fp8_block tile sweep. Prints one table; no files."""
import sys
import torch, triton
sys.path.insert(0, "src")
import blockscaled as bs
from blockscaled.config import GemmConfig, choose_gemm_config

def t(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

torch.manual_seed(0)
M = 4096
for fmt, n, k in [("mxfp8", 2112, 7168), ("nvfp4", 24576, 1536), ("fp8_block", 2112, 7168)]:
    x = torch.randn(M, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    a = bs.quantize(x, fmt)
    b = bs.quantize(w, fmt, block=(128, 128) if fmt == "fp8_block" else None)
    cfg = choose_gemm_config(fmt, M, n, k, x.device)
    base = t(lambda: torch.matmul(bs.dequantize(a, torch.bfloat16), bs.dequantize(b, torch.bfloat16).t()))
    ours = t(lambda: bs.gemm(a, b))
    dq = t(lambda: bs.gemm(a, b, config=GemmConfig(strategy="dequant_matmul")))
    dqa = t(lambda: bs.dequantize(a, torch.bfloat16)); dqb = t(lambda: bs.dequantize(b, torch.bfloat16))
    print(f"{fmt} {n}x{k}: chosen={cfg.strategy} ours={ours:.3f} forced_dq={dq:.3f} base={base:.3f} dq(a)={dqa:.3f} dq(b)={dqb:.3f}", flush=True)

print("fp8_block tile sweep at M=4096 (TFLOP/s)")
shapes = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
cands = [(128, 128, 8, 3, 8), (128, 128, 8, 4, 8), (128, 256, 8, 3, 8), (256, 128, 8, 3, 8), (128, 128, 4, 4, 8), (64, 256, 4, 4, 8), (128, 192, 8, 3, 8)]
for n, k in shapes:
    x = torch.randn(M, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    a = bs.quantize(x, "fp8_block"); b = bs.quantize(w, "fp8_block", block=(128, 128))
    row = []
    for bm, bn, nw, ns, gm in cands:
        try:
            c = GemmConfig(block_m=bm, block_n=bn, block_k=128, num_warps=nw, num_stages=ns, split_k=1, promote=True, group_m=gm)
            ms = t(lambda: bs.gemm(a, b, config=c))
            row.append(f"{2*M*n*k/ms/1e9:6.0f}")
        except Exception as e:
            row.append(f"  ERR({type(e).__name__})")
    base = t(lambda: torch.matmul(bs.dequantize(a, torch.bfloat16), bs.dequantize(b, torch.bfloat16).t()))
    print(f"{n:6d}x{k:<6d}", " ".join(row), f" dq+mm {2*M*n*k/base/1e9:6.0f}", flush=True)
print("cands:", cands)
