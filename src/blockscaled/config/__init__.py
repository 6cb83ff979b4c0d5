"""Kernel configuration: frozen config dataclasses and analytic heuristics."""

from .gemm import STRATEGIES, GemmConfig, choose_gemm_config

__all__ = ["GemmConfig", "choose_gemm_config", "STRATEGIES"]
