"""Split-K tile counters shared by the portable and Hopper split-K kernels (one launch each: the
last unit of a tile to arrive, or every unit with the spread reduction, reads the others' fp32
partials; the counters order that)."""

from __future__ import annotations

import torch

__all__ = ["splitk_counters", "splitk_scratch"]

#: Split-K tile counters (int32, all zero between launches: the kernel's last program per tile
#: resets its counter). Concurrency rule: kernels sharing a counter buffer must not run at the
#: same time. Hence one buffer per (device, stream) for eager launches (launches on one
#: stream are ordered; different streams get different buffers), and one per device for
#: launches captured into CUDA graphs (_GRAPH_COUNTERS): graph replays that contain split-K
#: GEMMs must not overlap each other (do not replay two such graphs concurrently on different
#: streams, and do not capture two concurrent split-K GEMMs in forked capture streams).
#: The graph buffer is allocated (zeroed) outside any capture, on the first eager split-K
#: call on the device (warm-up, which compiling the kernel needs anyway): memory zeroed by a
#: memset *inside* a capture is only zero after that graph's first replay, so it could not
#: be shared with other graphs. A capture that finds no (or too small a) graph buffer
#: allocates a private zeroed one in the graph (torch.zeros: a memset node replayed with the
#: graph, correct but ~1 us more per call) and does not cache it.
_COUNTERS: dict[tuple[torch.device, int], torch.Tensor] = {}
_GRAPH_COUNTERS: dict[torch.device, torch.Tensor] = {}
#: superseded graph buffers stay alive: graphs captured earlier still point at them
_RETIRED_GRAPH_COUNTERS: list[torch.Tensor] = []
#: counters allocated at least this many at a time (16 KB): grows by powers of two beyond
_MIN_COUNTERS = 4096


def _splitk_counters(device: torch.device, n: int) -> torch.Tensor:
    """An int32 buffer of >= ``n`` zeros that the split-K kernel may use (see _COUNTERS)."""
    size = max(_MIN_COUNTERS, 1 << (n - 1).bit_length())
    if device.type != "cuda":
        key = (device, 0)
        buf = _COUNTERS.get(key)
        if buf is None or buf.numel() < n:
            buf = _COUNTERS[key] = torch.zeros(size, dtype=torch.int32, device=device)
        return buf
    if torch.cuda.is_current_stream_capturing():
        buf = _GRAPH_COUNTERS.get(device)
        if buf is None or buf.numel() < n:
            return torch.zeros(size, dtype=torch.int32, device=device)  # owned by the graph's pool
        return buf
    key = (device, torch.cuda.current_stream(device).cuda_stream)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        # the old buffer (if any) is freed in stream order: later work on this stream only
        buf = _COUNTERS[key] = torch.zeros(size, dtype=torch.int32, device=device)
    gbuf = _GRAPH_COUNTERS.get(device)
    if gbuf is None or gbuf.numel() < n:
        if gbuf is not None:
            _RETIRED_GRAPH_COUNTERS.append(gbuf)
        _GRAPH_COUNTERS[device] = torch.zeros(size, dtype=torch.int32, device=device)
    return buf


splitk_counters = _splitk_counters

#: Flat fp32 split-K workspaces of eager portable launches, one per (device, stream), reused by
#: every launch there: a launch writes and reads back its partials itself, and launches on one
#: stream are ordered (the rule of _COUNTERS). Not used while a stream captures a graph (the
#: graph's own allocation then, as before) nor above _WS_CACHE_MAX bytes (memory kept for good).
#: Why: torch.empty was ~5 us of the ~40 us host path of an eager M=1 MX/NV call (this
#: repository's CPU stub benchmark, scripts/probes/host_cost.py --stub).
_WORKSPACES: dict[tuple[torch.device, int], torch.Tensor] = {}
#: 4 MB: every M = 1 workspace of the bench's shapes (N <= 57344, split <= 16: 3.7 MB), larger M
#: allocate per launch (their GPU time hides it); at most 4 MB per stream that ran a split-K call
#: (torch's stream pool hands out 32 per device and priority); a choice, not measured
_WS_CACHE_MAX = 4 << 20


def splitk_scratch(device: torch.device, tiles: int, ws_numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(a flat fp32 workspace of >= ``ws_numel`` elements, the int32 tile counters of
    :func:`_splitk_counters` for ``tiles`` tiles) for one split-K launch of the portable kernel
    (its ``ws_ptr`` takes a base pointer and the split stride: no view of the buffer needed)."""
    if device.type != "cuda":
        key = (device, 0)
    elif torch.cuda.is_current_stream_capturing():
        return torch.empty(ws_numel, dtype=torch.float32, device=device), _splitk_counters(device, tiles)
    else:
        key = (device, torch.cuda.current_stream(device).cuda_stream)
    if ws_numel * 4 > _WS_CACHE_MAX:
        ws = torch.empty(ws_numel, dtype=torch.float32, device=device)
    else:
        ws = _WORKSPACES.get(key)
        if ws is None or ws.numel() < ws_numel:
            # the old buffer (if any) is freed in stream order: later work on this stream only
            ws = _WORKSPACES[key] = torch.empty(max(ws_numel, 1 << 16), dtype=torch.float32, device=device)
    return ws, _splitk_counters(device, tiles)
