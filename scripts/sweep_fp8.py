"""Dev sweep (H100): portable fp8_block Triton kernel tiles at M=4096 and M=128 on the
DeepSeek-V3 shapes. TFLOP/s, do_bench median (L2 flushed). One table on stdout."""
import sys
import torch, triton
sys.path.insert(0, "src")
import blockscaled as bs
from blockscaled.config import GemmConfig

shapes = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
cands = {4096: [(128, 128, 8, 3, 8), (128, 128, 8, 4, 32), (128, 128, 8, 5, 8), (128, 128, 8, 3, 1),
                (64, 128, 4, 4, 8), (64, 128, 4, 5, 8), (128, 64, 4, 4, 8), (64, 256, 8, 3, 8), (128, 256, 8, 2, 8)],
         128: [(64, 128, 4, 4, 8), (64, 64, 4, 4, 8), (64, 32, 4, 5, 8), (128, 64, 4, 4, 8), (64, 128, 4, 6, 8), (64, 64, 4, 6, 8)]}
for M, cs in cands.items():
    print(f"M={M}: cands (BM,BN,warps,stages,group_m) = {cs}", flush=True)
    for n, k in shapes:
        x = torch.randn(M, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        a = bs.quantize(x, "fp8_block"); b = bs.quantize(w, "fp8_block", block=(128, 128))
        row = []
        for bm, bn, nw, ns, gm in cs:
            try:
                c = GemmConfig(block_m=bm, block_n=bn, block_k=128, num_warps=nw, num_stages=ns, split_k=1, promote=True, group_m=gm)
                ms = triton.testing.do_bench(lambda: bs.gemm(a, b, config=c), warmup=10, rep=50, return_mode="median")
                row.append(f"{2*M*n*k/ms/1e9:5.0f}")
            except Exception as e:
                row.append(f"ERR:{type(e).__name__}"[:9])
        d = bs.gemm(a, b)
        ms = triton.testing.do_bench(lambda: bs.gemm(a, b), warmup=10, rep=50, return_mode="median")
        print(f"{n:6d}x{k:<6d}", " ".join(row), f"| default {2*M*n*k/ms/1e9:5.0f}", flush=True)
