"""The ``blockscaled bench`` CLI: shape suites, timing, baselines, reports and plots.

The library imports only ``bench.timing`` (``blockscaled.tune`` times with it); ``blockscaled.bench.cli:main`` is the entry
point (also ``python -m blockscaled.bench``). Library ops are imported lazily so the bench
keeps working (and says why) while an op is missing.
"""

__all__: list[str] = []
