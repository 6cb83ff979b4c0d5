"""Minimal Gluon warp_specialize kernel (no shared memory of its own) for compute-sanitizer.

    compute-sanitizer --tool racecheck python scripts/ws_racecheck_probe.py

If racecheck reports hazards here, they come from Triton's warp-specialization machinery (the
partition-switch loop and its state in shared memory), not from a kernel's own code: our
fp8 kernels' racecheck reports sit at the same places (kernel prologue reads vs writes
attributed to the ``gl.warp_specialize`` line)."""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier


@gluon.jit
def _default(out_ptr):
    gl.store(out_ptr + gl.program_id(0) * 2, 1.0)


@gluon.jit
def _worker(out_ptr):
    gl.store(out_ptr + gl.program_id(0) * 2 + 1, 2.0)


@gluon.jit
def probe_kernel(out_ptr, num_warps: gl.constexpr):
    gl.warp_specialize([(_default, (out_ptr,)), (_worker, (out_ptr,))], [1], [40])


@gluon.jit
def _default2(out_ptr, bar, a, b, c, d, e, f):
    mbarrier.wait(bar.index(0), 0)
    gl.store(out_ptr + gl.program_id(0) * 2, (a + b + c + d + e + f).to(gl.float32))


@gluon.jit
def _worker2(out_ptr, bar, a, b, c, d, e, f):
    gl.store(out_ptr + gl.program_id(0) * 2 + 1, (a * b + c * d + e * f).to(gl.float32))
    mbarrier.arrive(bar.index(0), count=1)


@gluon.jit
def probe2_kernel(out_ptr, a, b, c, d, e, f, num_warps: gl.constexpr):
    """With captured scalars and an mbarrier handshake between the partitions, like the fp8
    kernels (whose partitions capture descriptors, shared buffers and ints)."""
    bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bar.index(0), count=1)
    gl.warp_specialize([(_default2, (out_ptr, bar, a, b, c, d, e, f)),
                        (_worker2, (out_ptr, bar, a, b, c, d, e, f))], [1], [40])


if __name__ == "__main__":
    out = torch.zeros(2 * 132, device="cuda")
    probe_kernel[(132,)](out, num_warps=4)
    torch.cuda.synchronize()
    assert out[0::2].eq(1).all() and out[1::2].eq(2).all(), out
    probe2_kernel[(132,)](out, 1, 2, 3, 4, 5, 6, num_warps=4)
    torch.cuda.synchronize()
    assert out[0::2].eq(21).all() and out[1::2].eq(44).all(), out
    print("probe ok")
