"""Kernel configurations: the frozen dataclasses a plan carries (``blockscaled.plan`` decides)."""

from .gemm import STRATEGIES, GemmConfig
from .hopper import HopperConfig

__all__ = ["GemmConfig", "HopperConfig", "STRATEGIES"]
