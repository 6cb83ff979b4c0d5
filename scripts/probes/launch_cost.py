"""Where the eager host time of a decode-size call goes: the library's Python, Triton's launcher,
the driver. GPU only (the launch is what it measures).

    python scripts/probes/launch_cost.py [--json OUT.json]        # ~1 min on an H100

For each case (format, call, N = K) it captures the kernel launches one call makes (by wrapping
the ops' kernel objects), then times, as host time per call (back-to-back calls, one sync at the
end; these sizes are host-bound, so the wall clock is the host path):

  call        the public call (``bs.gemm`` / ``bs.linear``), as a user makes it eagerly
  triton      the same launches through ``kernel[grid](*args, **kwargs)`` alone (Triton's
              JITFunction.run: binding, specialisation key, cache lookup, launcher)
  compiled    the same launches through the cached ``CompiledKernel``'s launcher directly
              (what is left when Triton's Python run path is skipped)
  empty       ``torch.empty`` of the output (one allocation)
  F.linear    ``torch.nn.functional.linear`` in bf16 at the same shape: the eager cost a bf16
              model pays per layer, the reference for "a few microseconds"

The difference call - triton is the library's own host path; triton - compiled is Triton's
Python launch path.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

CASES = (("fp8_block", "gemm", 2880), ("mxfp4", "gemm", 2880), ("mxfp4", "linear", 2880),
         ("nvfp4", "linear", 2880), ("mxfp8", "linear-wo", 2880), ("fp8_block", "linear", 7168))


class _Recorder:
    """Stands in for a kernel object of ops/: records each launch, then launches it."""

    def __init__(self, real, log):
        self.real, self.log = real, log

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            ck = self.real[grid](*args, **kwargs)
            self.log.append((self.real, grid, args, kwargs, ck))
            return ck
        return launch

    def __getattr__(self, name):
        return getattr(self.real, name)


def _full_args(jit, args, kwargs):
    """Every parameter of ``jit`` in order (positional, keyword, default): the launcher's args."""
    out = list(args)
    for p in jit.params[len(args):]:
        out.append(kwargs[p.name] if p.name in kwargs else p.default)
    return out


def _host_us(fn, n=2000):
    import torch
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        host = (time.perf_counter() - t) / n * 1e6
        torch.cuda.synchronize()
        best = min(best, host)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    import torch
    import triton

    import blockscaled as bs
    import blockscaled.ops.gemm as gemm_mod
    import blockscaled.ops.quantize as quant_mod

    if not torch.cuda.is_available():
        sys.exit("launch_cost.py: needs a CUDA GPU")
    dev = "cuda"
    rows = []
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    print(f"{'format':9s} {'call':9s} {'N=K':>5s} {'launches':>8s} {'call us':>8s} {'triton':>7s} {'compiled':>8s} "
          f"{'empty':>6s} {'F.linear':>8s}")
    names = ("gemm_kernel", "gemv_kernel", "mx_gemv_kernel")
    for fmt, call, n in CASES:
        g = torch.Generator(device=dev).manual_seed(n)
        w = bs.quantize((torch.randn(n, n, generator=g, device=dev) * 0.05).to(torch.bfloat16), fmt,
                        block=(128, 128) if fmt == "fp8_block" else None)
        x = torch.randn(1, n, generator=g, device=dev).to(torch.bfloat16)
        qa = bs.quantize(x, fmt)
        fn = {"gemm": lambda: bs.gemm(qa, w), "linear": lambda: bs.linear(x, w),
              "linear-wo": lambda: bs.linear(x, w, weight_only=True)}[call]
        log: list = []
        saved = {nm: getattr(gemm_mod, nm) for nm in names}
        # private: the quantize kernels' module (the launch points of ops/ are module globals, no hook)
        saved_q = quant_mod._k
        try:
            for nm in names:
                setattr(gemm_mod, nm, _Recorder(saved[nm], log))

            class _K:  # the quantize kernels' module: each kernel wrapped
                def __getattr__(self, name):
                    return _Recorder(getattr(saved_q, name), log)
            quant_mod._k = _K()  # private: as above
            fn()
        finally:
            for nm in names:
                setattr(gemm_mod, nm, saved[nm])
            quant_mod._k = saved_q  # private: as above
        launches = [(jit, grid, args, kwargs, ck) for jit, grid, args, kwargs, ck in log]
        t_call = _host_us(fn)

        def via_triton():
            for jit, grid, args, kwargs, _ in launches:
                jit[grid](*args, **kwargs)
        t_triton = _host_us(via_triton)
        direct = []
        for jit, grid, args, kwargs, ck in launches:
            g3 = tuple(grid) + (1,) * (3 - len(grid))
            direct.append((ck, g3, _full_args(jit, args, kwargs)))
        get_stream = triton.runtime.driver.active.get_current_stream
        index = torch.cuda.current_device()

        def via_compiled():
            stream = get_stream(index)
            for ck, (g0, g1, g2), full in direct:
                ck.run(g0, g1, g2, stream, ck.function, ck.packed_metadata, None, None, None, *full)
        t_comp = _host_us(via_compiled)
        t_empty = _host_us(lambda: torch.empty((1, n), dtype=torch.bfloat16, device=dev))
        wb = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        t_lin = _host_us(lambda: torch.nn.functional.linear(x, wb))
        row = {"format": fmt, "call": call, "n": n, "launches": len(launches), "call_us": t_call,
               "triton_us": t_triton, "compiled_us": t_comp, "empty_us": t_empty, "f_linear_us": t_lin,
               "kernels": [getattr(j, "__name__", str(j)) for j, *_ in launches]}
        rows.append(row)
        print(f"{fmt:9s} {call:9s} {n:5d} {len(launches):8d} {t_call:8.1f} {t_triton:7.1f} {t_comp:8.1f} "
              f"{t_empty:6.1f} {t_lin:8.1f}  {' '.join(row['kernels'])}", flush=True)
        del w, x, qa, wb
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "triton": triton.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
