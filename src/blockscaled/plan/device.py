"""Device properties the planner reads, as a value.

A :class:`DeviceInfo` is an input of every planning function, so plans for a GPU can be computed
and tested on a machine without one: ``DeviceInfo("cuda", 132, (9, 0), 232448)`` is an H100 SXM
(:data:`H100_SXM` adds its L2 size and measured copy bandwidth). :func:`device_info` queries the
current GPU once per device index and caches the answer (the query costs host time per call).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .calibration import measured_bandwidth

__all__ = ["DeviceInfo", "device_info", "num_sms", "H100_SXM", "H200_SXM", "DEVICES", "CPU_INTERPRETER"]


@dataclass(frozen=True)
class DeviceInfo:
    """What the planner knows about a device.

    kind: "cuda" or "cpu" (the Triton interpreter or the reference path).
    sm_count: streaming multiprocessors. capability: (major, minor), (9, 0) for Hopper.
    smem_bytes: opt-in shared memory per block. l2_bytes: L2 cache size.
    mem_bw: sustained copy bandwidth in bytes/s (the calibration file's measured value where the
        device has one, see plan/devices/; else 90% of the nominal DRAM bandwidth).
    name: the device name (selects the calibration file).
    """

    kind: str
    sm_count: int
    capability: tuple[int, int]
    smem_bytes: int
    l2_bytes: int = 50 * 2**20
    mem_bw: float = 3.0e12
    name: str = ""

    @property
    def is_hopper(self) -> bool:
        return self.kind == "cuda" and tuple(self.capability) == (9, 0)


#: H100 SXM 80 GB: 132 SMs, 227 KB opt-in shared memory, 50 MB L2; copy bandwidth measured by
#: scripts/checks/calibrate.py (plan/devices/h100.json holds the value the planner uses).
H100_SXM = DeviceInfo("cuda", 132, (9, 0), 232448, 50 * 2**20, 3.0e12, "NVIDIA H100 80GB HBM3")
#: H200 SXM 141 GB: the H100's die (132 SMs, the same shared memory and L2) with HBM3e; copy bandwidth
#: 4.22-4.24 TB/s, the bench's same-run roofline in all 20 H200 runs of results/h200/runs.jsonl. There is
#: no plan/devices/h200.json: the planner scales the H100 file to this bandwidth (plan/calibration.py).
H200_SXM = DeviceInfo("cuda", 132, (9, 0), 232448, 50 * 2**20, 4.23e12, "NVIDIA H200")
#: the devices the offline tools (scripts/checks/calibrate.py, validate_plans.py) can plan for, by short name
DEVICES = {"h100": H100_SXM, "h200": H200_SXM}
#: The Triton interpreter on the CPU: numbers only steer tile sizes (small tiles keep it fast).
CPU_INTERPRETER = DeviceInfo("cpu", 4, (0, 0), 1 << 30, 0, 1.0e10, "cpu")


def device_info(device: "torch.device | str | DeviceInfo") -> DeviceInfo:
    """The properties of ``device`` (a DeviceInfo is returned as is)."""
    if isinstance(device, DeviceInfo):
        return device
    device = torch.device(device)
    if device.type == "cuda":
        return _cuda_info(device.index if device.index is not None else torch.cuda.current_device())
    return CPU_INTERPRETER


def num_sms(device: torch.device) -> int:
    """SM count of a CUDA device (cached)."""
    return device_info(device).sm_count


@functools.lru_cache(maxsize=None)
def _cuda_info(index: int) -> DeviceInfo:
    p = torch.cuda.get_device_properties(index)
    smem = int(getattr(p, "shared_memory_per_block_optin", 0) or 232448)
    l2 = int(getattr(p, "L2_cache_size", 0) or 50 * 2**20)
    bw = measured_bandwidth(p.name)
    if bw is None:
        clock_khz = getattr(p, "memory_clock_rate", 0) or 0
        bus_bits = getattr(p, "memory_bus_width", 0) or 0
        bw = 0.9 * 2 * clock_khz * 1e3 * bus_bits / 8 if clock_khz and bus_bits else 3.0e12
    return DeviceInfo("cuda", p.multi_processor_count, (p.major, p.minor), smem, l2, float(bw), p.name)
