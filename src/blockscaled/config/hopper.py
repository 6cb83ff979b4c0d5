"""Tile configuration of the sm_90a (Hopper) fp8_block kernels: the frozen :class:`HopperConfig`.

The kernels live in ``kernels/hopper/``, their host launchers and the rules that choose a
HopperConfig in ``ops/_hopper.py``. The dataclass lives here, next to :class:`GemmConfig`
(``config/gemm.py``), so that the config package can describe and encode every kernel choice
(``plan/encoding.py``) without importing the launchers.
"""

from __future__ import annotations

import dataclasses

__all__ = ["HopperConfig", "VARIANTS", "VARIANT_FLAGS", "EPILOGUES", "SPLIT_REDUCE"]

#: HopperConfig.variant values, one kernel each (ops/_hopper.py's module docstring describes them)
VARIANTS = ("wide", "skinny")
#: The HopperConfig flag fields each variant reads (scripts/checks/sanitize.py runs flag combinations of
#: these only; the others would repeat the same kernel).
VARIANT_FLAGS = {"wide": ("epilogue", "split_wg"), "skinny": ()}
#: HopperConfig.epilogue values (the wide kernel's EPI constexpr: masked 1, or 0 where the compiler
#: cannot vectorise the output's stores (ops/_hopper.py, ``_masked_epi``), tma 2, tma1 3)
EPILOGUES = ("tma", "tma1", "masked")
_EPI_CODE = {"tma": 2, "tma1": 3}
#: HopperConfig.split_reduce values (the wide kernel's SPREAD constexpr)
SPLIT_REDUCE = ("last", "spread")


@dataclasses.dataclass(frozen=True)
class HopperConfig:
    """Tile configuration of the Hopper fp8_block kernels.

    variant: "wide" (kernels/hopper/wide.py: dense, grouped and SwiGLU GEMMs) or "skinny"
        (kernels/hopper/skinny.py: swap-AB decode kernel, M <= 64).
    block_m: "wide": 64 (one warpgroup, num_warps=4) or 128 (two warpgroups, num_warps=8): wgmma
        needs 64 rows per warpgroup. block_n: "wide": 128 or 256 (one or two 128-column halves,
        each one 128-row weight-scale block). "skinny": block_m = the activation rows padded to
        8..64 (the wgmma's N), block_n 64 or 128 weight rows, num_warps 4. block_k is fixed at
        128 (= the fp8_block scale block).
    stages: depth of the TMA ring; each stage holds ``stage_bytes()``: (block_m + block_n) * 128 bytes
        (+ block_m * 4 of A scales for "wide" 128-column tiles).
    group_m: grouped raster height (tiles of A sharing a B tile while it sits in L2).
    split_wg: "wide" with block_m 128 only: one 4-warp math partition per 64-row warpgroup (no
        barrier between the two, so one promotes while the other's wgmma runs) instead of one
        8-warp partition.
    epilogue: "wide" only: "tma" (registers -> shared tile -> TMA store, asynchronous; needs a
        16-byte aligned output base and row stride, else the launcher uses "masked"; one shared
        tile per 128-column half), "tma1" (the same through one shared half tile per math
        partition, halves stored one after the other: half the buffer of "tma" at block_n 256,
        which leaves room for a 4th ring stage at 128x256 bf16) or "masked" (layout conversion +
        masked global stores). At block_n 128 (and SwiGLU) "tma1" is "tma".
    split_k: "wide" dense GEMM only: fused deterministic split-K into this many K ranges (whole
        128-wide K blocks; lowered by the launcher so that no range is empty, e.g. 5 K blocks in
        4 -> 3 ranges of 2, 2, 1). Partials go to an fp32 workspace and the last range of each
        tile to finish sums them in fixed order and stores (kernels/hopper/wide.py). 1 = no split.
    tail_split: "wide" only, exclusive with split_k: split only the tiles of the last,
        partial wave of the persistent grid into this many K ranges (same fused reduction); the
        full waves' tiles run whole. With T tiles on S SMs (T > S), T - (T // S) * S tiles are
        left for a last wave that would otherwise take a whole tile-time for a few busy SMs
        (M=4096 N=2112: 288 tiles of 128x256 -> 24 in the third wave). 1 = off; where the grid
        has no partial wave (T % S == 0) or fewer tiles than SMs, the launcher runs no split.
        Grouped (not SwiGLU) too: there the kernel counts T on the device from the expert
        offsets / counts and splits only where the last wave's tiles x splits fit the grid.
    split_reduce: how split_k / tail_split partials are summed (same fixed order, bitwise the
        same result): "last" = the last unit of a tile to arrive reads all partials back and
        stores the tile (no unit ever waits; that serial read-back runs at one SM's L2 bandwidth);
        "spread" (default) = every unit of the tile waits for the others' partials, then sums and
        stores 1/split of the tile. H100 (last vs spread A/B, NOTES 2026-11-22 seventh session): 1.24-1.85x faster where every
        tile is split 4-8 ways (M=128 2112x7168 split 7: 25.4 -> 14.7 us), 1.0-1.08x on tail splits.
        The wait needs every program of the persistent grid (<= one CTA per SM) resident at once,
        so such launches are cooperative (triton's launch_cooperative_grid: the driver
        co-schedules the whole grid, also next to other streams' kernels, or fails the launch
        with an error instead of a hang where the grid cannot fit, e.g. a server-side MPS limit or
        a green context with fewer SMs; H100, cooperative vs plain launches: the same times
        as a plain launch within 0.2 us on 14 rows, CUDA graphs included). Where SMs are withheld
        for good (MPS with an active-thread percentage below 100 in the environment) or
        BLOCKSCALED_SPLIT_REDUCE=last is set, the launcher runs "last".
    """

    variant: str = "wide"
    block_m: int = 128
    block_n: int = 128
    num_warps: int = 8
    stages: int = 4
    group_m: int = 8
    epilogue: str = "tma"
    split_wg: bool = True
    split_k: int = 1
    tail_split: int = 1
    split_reduce: str = "spread"

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"HopperConfig.variant: expected one of {VARIANTS}, got {self.variant!r}")
        if self.variant == "skinny":
            self._check_skinny()
            return
        if self.block_m not in (64, 128):
            raise ValueError(f"HopperConfig.block_m: expected 64 or 128 (64 rows per warpgroup), got {self.block_m}")
        if self.num_warps != 4 * (self.block_m // 64):
            raise ValueError(
                f"HopperConfig.num_warps: expected {4 * (self.block_m // 64)} for block_m={self.block_m} "
                f"(one warpgroup of 4 warps per 64 rows), got {self.num_warps}"
            )
        if self.block_n not in (128, 256):
            # block_n = one or two 128-column halves, each half one 128-row weight-scale block
            # with its own accumulator
            raise ValueError(f"HopperConfig.block_n: variant 'wide' needs 128 or 256, got {self.block_n}")
        if self.epilogue not in EPILOGUES:
            raise ValueError(f"HopperConfig.epilogue: expected one of {EPILOGUES}, got {self.epilogue!r}")
        if self.stages < 2:
            raise ValueError(f"HopperConfig.stages: expected >= 2, got {self.stages}")
        if self.group_m < 1:
            raise ValueError(f"HopperConfig.group_m: expected >= 1, got {self.group_m}")
        if not isinstance(self.split_k, int) or self.split_k < 1:
            raise ValueError(f"HopperConfig.split_k: expected an int >= 1, got {self.split_k!r}")
        if self.split_reduce not in SPLIT_REDUCE:
            raise ValueError(f"HopperConfig.split_reduce: expected one of {SPLIT_REDUCE}, got {self.split_reduce!r}")
        if not isinstance(self.tail_split, int) or self.tail_split < 1:
            raise ValueError(f"HopperConfig.tail_split: expected an int >= 1, got {self.tail_split!r}")
        if self.tail_split > 1 and self.split_k > 1:
            raise ValueError(f"HopperConfig.tail_split: exclusive with split_k, got tail_split={self.tail_split}, "
                             f"split_k={self.split_k}")

    def _check_skinny(self):
        # block_m = the activation rows padded to the wgmma's N (multiple of 8, power of two for
        # Gluon block shapes); block_n = weight rows per program: 64 or 128 (one warpgroup's
        # wgmma M side, dividing the 128-row weight-scale block).
        if self.block_m not in (8, 16, 32, 64):
            raise ValueError(f"HopperConfig.block_m: variant 'skinny' needs 8, 16, 32 or 64 (activation rows "
                             f"padded to the wgmma N), got {self.block_m}")
        if self.block_n not in (64, 128):
            raise ValueError(f"HopperConfig.block_n: variant 'skinny' needs 64 or 128, got {self.block_n}")
        if self.num_warps != 4:
            raise ValueError(f"HopperConfig.num_warps: variant 'skinny' runs one warpgroup (4), got {self.num_warps}")
        if self.stages < 2:
            raise ValueError(f"HopperConfig.stages: expected >= 2, got {self.stages}")
        if not isinstance(self.split_k, int) or self.split_k < 1:
            raise ValueError(f"HopperConfig.split_k: expected an int >= 1, got {self.split_k!r}")

    def stage_bytes(self) -> int:
        """Shared memory of one ring stage: the A and B boxes (128 fp8 K columns each), plus for
        "wide" 128-column tiles the tile's fp32 A scales of the stage's K block (staged by the
        producer: kernels/hopper/wide.py, ``SA_SMEM``)."""
        sa = self.block_m * 4 if self.variant == "wide" and self.block_n == 128 else 0
        return (self.block_m + self.block_n) * 128 + sa

    def smem_bytes(self, out_elem_bytes: int = 4, dual: bool = False) -> int:
        """Ring + epilogue buffer + barriers. Masked store: layout-conversion scratch of the
        accumulator tile (up to block_m * block_n(half) * 4 bytes); "wide" + TMA store: one output
        tile per half in the output dtype (``dual``, SwiGLU: block_n = gate + up rows, one
        128-column output tile)."""
        ring = self.stages * self.stage_bytes()
        if self.variant == "skinny":
            # + the epilogue's layout-conversion scratch of the fp32 C^T tile
            return ring + self.block_n * self.block_m * 4 + 1024
        half = 128
        if self.epilogue in _EPI_CODE:
            out_cols = half if dual or self.epilogue == "tma1" else self.block_n
            return ring + self.block_m * out_cols * out_elem_bytes + 1024
        # masked store: the compiler's layout-conversion scratch holds one half tile in the
        # output dtype (AOT, 128x256 bf16 4 stages: 229444 B = ring + 32836)
        return ring + self.block_m * half * out_elem_bytes + 1024
