"""Work split over fresh Python processes (the bench's compile warm-ups).

Why processes, not threads: what they do is compile kernels (Triton, DeepGEMM's nvcc JIT), which holds
the interpreter for seconds at a time; separate processes compile in parallel and leave their results
in the on-disk caches that the timing process then reads (bench/plan_sweep.py, bench/baselines.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

__all__ = ["run_in_processes"]


def run_in_processes(module: str, function: str, items: list, processes: int) -> int:
    """Call ``module.function(part)`` in up to ``processes`` new Python processes, ``items`` dealt out
    round-robin (``items[j::processes]``, passed as JSON on stdin: JSON-able items only); wait for
    all of them and return how many were started. The processes inherit the environment (cache
    directories); what fails in them is theirs to report (stderr).

    Example::

        run_in_processes("blockscaled.bench.plan_sweep", "_warm_worker", shapes, 14)
    """
    code = f"import json, sys; from {module} import {function}; {function}(json.loads(sys.stdin.read()))"
    procs = []
    for j in range(max(1, processes)):
        part = items[j::max(1, processes)]
        if not part:
            continue
        p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, text=True)
        p.stdin.write(json.dumps(part))
        p.stdin.close()
        procs.append(p)
    for p in procs:
        p.wait()
    return len(procs)
