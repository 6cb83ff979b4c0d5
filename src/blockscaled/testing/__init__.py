"""Helpers for tests and the bench: comparisons, input generators."""

from .compare import assert_scaled_equal, bitwise_equal
from .inputs import fp8_block_operands, randn_like_activations, special_values

__all__ = ["assert_scaled_equal", "bitwise_equal", "fp8_block_operands", "randn_like_activations", "special_values"]
