"""Runnable examples (``python -m blockscaled.examples.generate``)."""
