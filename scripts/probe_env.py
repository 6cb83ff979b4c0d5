"""Dev probe: environment facts and whether the torch reference quantizers give the same bits on
CUDA as on the CPU (the Triton kernels are tested against the CPU reference)."""
import importlib, json, subprocess, sys
import torch, triton

sys.path.insert(0, "src")
R = importlib.import_module("blockscaled.reference.quantize")
from blockscaled.testing import assert_scaled_equal, randn_like_activations

info = {
    "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
    "gpu": torch.cuda.get_device_name(), "sms": torch.cuda.get_device_properties(0).multi_processor_count,
    "l2": torch.cuda.get_device_properties(0).L2_cache_size,
}
print(json.dumps(info))
print(subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm", "--format=csv"], capture_output=True, text=True).stdout)
for shape in [(64, 7168), (33, 300), (4, 130)]:
    x = randn_like_activations(*shape, seed=1)
    for f in ["fp8_block", "mxfp8", "mxfp4", "nvfp4"]:
        for r in R.get_format(f).roundings if hasattr(R, "get_format") else []:
            pass
from blockscaled.formats import FORMATS
bad = 0
for shape in [(64, 7168), (33, 300), (4, 130), (257, 1000)]:
    x = randn_like_activations(*shape, seed=1)
    x[0, :5] = torch.tensor([float("nan"), float("inf"), 0.0, 1e-40, -3.0])
    for f in FORMATS.values():
        for r in f.roundings:
            blocks = f.blocks
            for b in blocks:
                a = R.quantize(x, f, block=b, rounding=r)
                g = R.quantize(x.cuda(), f, block=b, rounding=r).cpu()
                try:
                    assert_scaled_equal(g, a)
                except AssertionError as e:
                    bad += 1
                    print("MISMATCH", f.name, r.name, b, shape, str(e)[:300])
print("cuda-vs-cpu reference mismatches:", bad)
# copy bandwidth
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
y = torch.empty_like(x)
ms = triton.testing.do_bench(lambda: y.copy_(x), return_mode="median")
print(f"copy 1 GiB: {ms:.3f} ms -> {2 * x.numel() / ms / 1e9:.2f} TB/s (read+write)")
