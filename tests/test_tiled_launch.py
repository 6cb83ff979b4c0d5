"""ops/_tiled.py on the CPU: the tiled launchers return before building a TMA descriptor when there
is nothing to compute (no rows, or N = 0: a descriptor takes no empty dimension, and a view of an
empty output cannot be reshaped), for both kernels (block_m 128: tiled.py; 256: tiled_rs.py), dense
and grouped. The launches themselves are GPU-tested (tests/test_tiled_gpu.py, test_tiled_grouped_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from blockscaled.config import GemmConfig
from blockscaled.ops._tiled import launch_tiled

CFGS = (GemmConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=5, strategy="tiled"),
        GemmConfig(block_m=256, block_n=128, block_k=64, num_warps=4, num_stages=4, strategy="tiled"))


@pytest.mark.parametrize("cfg", CFGS, ids=("r1", "rs"))
@pytest.mark.parametrize("rows,n,grouping", [(0, 256, 0), (64, 0, 0), (0, 256, 1), (64, 0, 1), (0, 256, 2),
                                             (64, 0, 2)])
def test_empty_calls_return_without_a_launch(cfg, rows, n, grouping):
    k, e = 512, 3
    lead = (e,) if grouping else ()
    w = torch.zeros(*lead, n, k // 2, dtype=torch.uint8)
    ws = torch.full((*lead, n, k // 32), 127, dtype=torch.uint8)
    if grouping == 2:
        x = torch.zeros(e, rows, k, dtype=torch.bfloat16)
        out = torch.full((e, rows, n), 7.0, dtype=torch.bfloat16)
        seg = torch.full((e,), rows, dtype=torch.int32)
    else:
        x = torch.zeros(rows, k, dtype=torch.bfloat16)
        out = torch.full((rows, n), 7.0, dtype=torch.bfloat16)
        seg = torch.tensor([0, rows, rows, rows], dtype=torch.int32) if grouping else None
    launch_tiled(x, w, ws, None, "mxfp4", k, out, cfg, seg=seg, grouping=grouping)
    assert (out == 7.0).all()  # nothing written (and nothing launched: a launch on CPU tensors would fail)
