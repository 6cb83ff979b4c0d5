"""Minimal Gluon warp_specialize kernels for compute-sanitizer (sm_90; imports no blockscaled code).

    compute-sanitizer --tool racecheck python scripts/probes/ws_racecheck_probe.py

Why it is kept: scripts/checks/sanitize.sh's racecheck reports hazards on the Hopper kernels at
two places; this probe reproduces both on minimal kernels whose synchronisation is correct by
construction, which is what tells those reports apart from a real race.

probe / probe2 have no shared memory of their own: if racecheck reports hazards there, they come
from Triton's warp-specialization machinery (the partition-switch loop and its state in shared
memory), not from a kernel's own code: our fp8 kernels' racecheck reports sit at the same places
(kernel prologue reads vs writes attributed to the ``gl.warp_specialize`` line).
probe3 is the wide kernel's A-scale handoff alone (``_stage_a_scales``): a 1-warp
partition cp.async-copies 128 floats into shared memory and each of its threads arrives (.noinc)
on an mbarrier of count 32 once its copies have landed; the 4-warp partition waits on the barrier
and reads them. That is the PTX pattern of cuda::memcpy_async with a barrier, correct by the
memory model; racecheck's reports on it (if any) are its own limitation with cp.async-tracked
barriers, and the same reports on the wide kernel's A-scale ring are that.
probe4 is probe3 as a 2-slot ring reused 8 times (ready / empty barriers per slot, a partition
barrier before each release), the wide kernel's ring without the TMA boxes."""

import argparse

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
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


@gluon.jit
def _reader3(out_ptr, buf, bar):
    mbarrier.wait(bar.index(0), 0)
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    gl.store(out_ptr + gl.arange(0, 128, layout=layout), buf.load(layout))


@gluon.jit
def _copier3(src_ptr, buf, bar):
    layout: gl.constexpr = gl.BlockedLayout([4], [32], [1], [0])
    async_copy.async_copy_global_to_shared(buf, src_ptr + gl.arange(0, 128, layout=layout))
    async_copy.mbarrier_arrive(bar.index(0), increment_count=False)


@gluon.jit
def probe3_kernel(src_ptr, out_ptr, num_warps: gl.constexpr):
    buf = gl.allocate_shared_memory(gl.float32, [128], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bar.index(0), count=32)
    gl.warp_specialize([(_reader3, (out_ptr, buf, bar)), (_copier3, (src_ptr, buf, bar))], [1], [40])


@gluon.jit
def _reader4(out_ptr, bufs, ready, empty, ITERS: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    acc = gl.zeros([128], gl.float32, layout)
    for it in range(ITERS):
        s = it % 2
        mbarrier.wait(ready.index(s), (it // 2) & 1)
        acc += bufs.index(s).load(layout)
        gl.thread_barrier()  # every warp's read before the release, as in the wide kernel
        mbarrier.arrive(empty.index(s), count=1)
    gl.store(out_ptr + gl.arange(0, 128, layout=layout), acc)


@gluon.jit
def _copier4(src_ptr, bufs, ready, empty, ITERS: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([4], [32], [1], [0])
    for it in range(ITERS):
        s = it % 2
        mbarrier.wait(empty.index(s), ((it // 2) & 1) ^ 1, pred=it >= 2)
        async_copy.async_copy_global_to_shared(bufs.index(s), src_ptr + it * 128 + gl.arange(0, 128, layout=layout))
        async_copy.mbarrier_arrive(ready.index(s), increment_count=False)


@gluon.jit
def probe4_kernel(src_ptr, out_ptr, ITERS: gl.constexpr, num_warps: gl.constexpr):
    """probe3 as a 2-slot ring reused ITERS times (the wide kernel's ring: ready counts the 32
    copying threads, empty one release after a partition barrier)."""
    bufs = gl.allocate_shared_memory(gl.float32, [2, 128], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(ready.index(i), count=32)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize([(_reader4, (out_ptr, bufs, ready, empty, ITERS)),
                        (_copier4, (src_ptr, bufs, ready, empty, ITERS))], [1], [40])


def main() -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("ws_racecheck_probe.py: needs an sm_90 GPU (Gluon warp_specialize, cp.async, mbarrier)")
        return 2
    out = torch.zeros(2 * 132, device="cuda")
    probe_kernel[(132,)](out, num_warps=4)
    torch.cuda.synchronize()
    assert out[0::2].eq(1).all() and out[1::2].eq(2).all(), out
    probe2_kernel[(132,)](out, 1, 2, 3, 4, 5, 6, num_warps=4)
    torch.cuda.synchronize()
    assert out[0::2].eq(21).all() and out[1::2].eq(44).all(), out
    src = torch.arange(128, device="cuda", dtype=torch.float32)
    out3 = torch.zeros(128, device="cuda")
    probe3_kernel[(1,)](src, out3, num_warps=4)
    torch.cuda.synchronize()
    assert out3.eq(src).all(), out3
    src4 = torch.arange(8 * 128, device="cuda", dtype=torch.float32)
    probe4_kernel[(1,)](src4, out3, 8, num_warps=4)
    torch.cuda.synchronize()
    assert out3.eq(src4.view(8, 128).sum(0)).all(), out3
    print("probe ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
