"""Environment facts recorded with every result row: GPU, driver, versions, git revision."""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
from pathlib import Path

import torch

#: L2 size used when the device cannot tell us (H100 SXM: 50 MB).
DEFAULT_L2_BYTES = 50 * 1024 * 1024


def has_cuda() -> bool:
    return torch.cuda.is_available()


def l2_bytes() -> int:
    """L2 cache size of the current CUDA device (``DEFAULT_L2_BYTES`` if unknown / no GPU)."""
    if not has_cuda():
        return DEFAULT_L2_BYTES
    try:
        v = int(torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size)
        return v if v > 0 else DEFAULT_L2_BYTES
    except Exception:  # older torch without the attribute
        return DEFAULT_L2_BYTES


def _git_rev() -> str:
    # A checkout copied without .git (e.g. to a GPU machine) can name its revision.
    if os.environ.get("BLOCKSCALED_GIT_REV"):
        return os.environ["BLOCKSCALED_GIT_REV"]
    root = Path(__file__).resolve().parents[3]
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=5,
        )
        rev = out.stdout.strip()
        if not rev:
            return "unknown"
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5,
        ).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except Exception:
        return "unknown"


def _driver() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "n/a"
    except Exception:
        return "n/a"


@functools.lru_cache(maxsize=1)
def environment() -> dict:
    """One flat dict of facts (strings / numbers), stored in every result row.

    Always: ``device`` ("cuda" or "cpu"), ``torch``, ``triton``, ``python``, ``git_rev``,
    ``triton_interpret``. With a CUDA GPU also ``gpu``, ``sm``, ``num_sms``, ``l2_mb``,
    ``driver`` and ``cuda``. Without one no GPU fact is recorded at all (not even the CUDA
    version a CUDA build of torch was compiled with, nor the L2 size the timing helper assumes
    by default): a CPU result must not read like a GPU one. ``cpu`` names the processor there.

    Example: ``environment()["device"]`` -> ``"cpu"`` on a machine without a GPU.
    """
    try:
        import triton

        triton_v = triton.__version__
    except Exception:
        triton_v = "n/a"
    env: dict = {"device": "cuda" if has_cuda() else "cpu"}
    if has_cuda():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        env.update(
            gpu=p.name,
            sm=f"{p.major}{p.minor}",
            num_sms=p.multi_processor_count,
            l2_mb=round(l2_bytes() / 2**20, 1),
            driver=_driver(),
            cuda=torch.version.cuda or "n/a",
        )
    else:
        env["cpu"] = f"{platform.machine() or 'unknown'}, {os.cpu_count() or '?'} cores"
    env.update(
        torch=torch.__version__,
        triton=triton_v,
        python=platform.python_version(),
        git_rev=_git_rev(),
        triton_interpret=os.environ.get("TRITON_INTERPRET", "0"),
    )
    return env


def gpu_slug(name: str | None = None) -> str:
    """Filesystem-friendly GPU name: 'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3'; 'cpu' when
    there is no GPU (a CPU result has no ``gpu`` entry)."""
    name = environment().get("gpu") if name is None else name
    if not name:
        return "cpu"
    s = re.sub(r"^nvidia\s+", "", name.strip(), flags=re.I).lower()
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return s or "unknown"
