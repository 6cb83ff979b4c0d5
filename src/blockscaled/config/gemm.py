"""The portable kernels' launch configuration: a frozen :class:`GemmConfig`.

Which configuration runs is the planner's decision (``blockscaled.plan``); this module only
describes and checks one. Tests and tuning force any configuration with ``gemm(...,
config=GemmConfig(...))``.

Strategies: ``"triton"`` (the portable block-scaled kernel, kernels/triton/gemm.py), ``"gemv"``
(the CUDA-core decode GEMVs: fp8_block with quantized A, kernels/triton/gemv.py; mxfp8 / mxfp4 /
nvfp4 weights with dense or quantized A, kernels/triton/mx_gemv.py), ``"hopper"``
(forced only: "the best Hopper tiles", which the planner turns into a :class:`HopperConfig`),
``"dequant_matmul"`` (dequantize both operands to bf16 with our Triton kernel, then cuBLAS), and the
sm_90 Gluon kernels for MX / NV weights: ``"stream"`` (kernels/hopper/stream.py), ``"tiled"``
(kernels/hopper/tiled.py) and ``"direct"`` (kernels/hopper/direct.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

__all__ = ["GemmConfig", "STRATEGIES", "GEMV_MAX_M", "gemv_config", "gemv_slice_elems", "RS_TOKENS"]

#: (appended, never reordered: plan/encoding.py carries a strategy as its index here)
STRATEGIES = ("triton", "dequant_matmul", "hopper", "gemv", "stream", "tiled", "direct")


#: Most activation rows one program of the CUDA-core decode GEMVs (strategy "gemv",
#: kernels/triton/gemv.py and mx_gemv.py) takes (block_m): every row costs one fp32 FMA per
#: weight element on the CUDA cores, and mx_gemv.py unrolls its rows into 8 accumulators.
GEMV_MAX_M = 8
#: token tiles (the wgmma's N) of the register-operand tiled kernel, kernels/hopper/tiled_rs.py
RS_TOKENS = (16, 32, 64, 128, 256)
#: Weight bytes one GEMV program loads at once (its chunk): the H100 streaming-read probe
#: (scripts/probes/stream_ceiling.py) was fastest with 32 KB per program on 4 of the 6 DeepSeek-V3 shapes.
GEMV_CHUNK_BYTES = 32 * 1024


def gemv_slice_elems(block_m: int) -> int:
    """K elements of one weight row that one thread of the MX / NV GEMV (kernels/triton/mx_gemv.py)
    owns per chunk (its "slice"; the launcher passes it as the kernel's SLICE): 32 for 1-2
    activation rows (16 packed fp4 bytes = one 128-bit load), 16 for 4, 8 for 8. Each thread keeps
    its slice's activation values of every row and its decoded weight values in registers while
    it multiplies them, ~``block_m x slice`` fp32 registers; sm_90 ptxas (AOT, mxfp4, 8 weight
    rows, 4 warps): 1 row x 32 161 registers, 2 x 32 240, 4 x 16 124 (4 rows), 8 x 8 114-255 (4-8
    rows), no spills; 8 x 32 would hold 256 activation values alone."""
    return 32 if block_m <= 2 else (16 if block_m <= 4 else 8)


def gemv_config(m: int, n: int, k: int, chunk_bytes: int = GEMV_CHUNK_BYTES, num_warps: int | None = None) -> "GemmConfig":
    """The decode GEMV's tiles: block_n = the most weight rows (power of two, <= 128) whose whole K
    fits one ``chunk_bytes`` chunk (at least 1; then K is walked in chunks of that size),
    block_m = M rounded up to a power of two; 4 warps for one row, 8 for more (sm_90 ptxas, 32 KB
    chunk: 1 row 208 registers at 4 warps; 2-4 rows spill 452-632 B at 4 warps, none at 8)."""
    kp = 128 * (1 << max(0, math.ceil(math.log2(max(1, math.ceil(k / 128))))))  # K rounded up to pow2 blocks
    bn = 1
    while bn < 128 and 2 * bn * kp <= chunk_bytes:
        bn *= 2
    bk = min(kp, max(128, chunk_bytes // bn))
    bm = 1 << max(0, math.ceil(math.log2(max(1, m))))
    if num_warps is None:
        num_warps = 4 if bm == 1 else 8
    return GemmConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=num_warps, num_stages=1, strategy="gemv")



@dataclass(frozen=True)
class GemmConfig:
    """One GEMM launch configuration (hashable; use as a cache key).

    block_m/block_n/block_k: output tile and K chunk. fp8_block needs block_k dividing 128;
        ``promote`` needs block_k dividing the scale block (128 / 32 / 16).
    num_warps, num_stages: Triton launch options (stages of the software pipeline).
    split_k: K splits; > 1: each (tile, split) program writes an fp32 partial, the last one
        to finish a tile (per-tile atomic counter) sums the partials in split order and runs
        the epilogue, all in one launch; deterministic (bitwise, whatever the arrival order).
        Each split covers a multiple of block_k; the launcher lowers the count so that no
        split is empty (ops/gemm.py::_split_plan).
    strategy: "triton", "gemv", "hopper", "dequant_matmul", "stream", "tiled" or "direct" (see module
        docstring; "stream": kernels/hopper/stream.py, block_m = the padded activation rows 8..64,
        block_n 64, block_k 128, 4 warps, num_stages = TMA ring slots, split_k; "tiled":
        kernels/hopper/tiled.py, block_m 128 with 8 warps, block_n 128, block_k 64, num_stages
        3..6 TMA ring slots (4 and more add a TMA producer warp; 3 fits two programs per SM
        without one: ops/_tiled.py TILED_WS_MIN_STAGES), split_k; or 4 warps (``is_register_operand``):
        kernels/hopper/tiled_rs.py, mxfp4 / nvfp4 / mxfp8 weights as the wgmma's register operand, block_m
        tokens (16, 32, 64, 128 or 256) x block_n 128 weight rows (256 up to 64 tokens: four consumer
        warpgroups, unsplit), 3..4 slots (3..6 below 256 tokens), split_k up to 64 tokens; "direct":
        kernels/hopper/direct.py, mxfp4 / nvfp4 weights, block_m 8 padded activation rows, block_n
        64, block_k 128, 4 warps, num_stages 1 (no ring: loads a step ahead in registers),
        split_k). "gemv"
        reads only block_m (activation rows per program, a power of two <= GEMV_MAX_M), block_n
        (weight rows per program, a power of two <= 128; <= 8 for the MX / NV GEMV, which holds a
        slice of every row in each thread's registers), block_k (K elements per weight-chunk
        load, a power of two >= 128) and num_warps; split_k must be 1.
    promote: apply scales per K chunk after an FP8 / raw-value dot (True) or dequantize
        tiles to bf16 in registers (False); None = the format's default.
    group_m: rows of tiles walked together (L2 reuse of B).
    swap_ab: dense GEMM only: compute each tile as ``(B_tile @ A_tile.T).T`` so the weight
        rows (block_n >= 64) fill the MMA's M dimension and block_m may be 16 (decode without
        padding A to the 64-row wgmma); a quantized A, or a dense (weight-only) A with
        promote=False (the bf16-dequantized weight is then the wgmma's register operand); with
        128x128 weight blocks block_n must divide 128. The grouped kernels ignore it.
    dequant_a: strategy "stream", "tiled" or "direct" with quantized activations only ("tiled" always does, so
        its plans say so): dequantize them exactly to
        bf16 in one pass before the kernel (True) instead of decoding them in the kernel's
        gather, where every 64-weight-row program decodes all of them again (False; see
        plan/stream.py ``STREAM_GATHER_MAX_MP`` for where each wins). Ignored for bf16 activations.
    maxnreg: strategy "direct" only: the registers per thread ptxas may use (0: its own choice). With
        128 (4 programs of 128 threads per SM) ptxas issues a step's loads before its MMAs instead of
        after them; the planner asks for it where the grid needs no more than 4 programs per SM
        (plan/direct.py ``DIRECT_HOIST_REGS``).
    gluon: strategy "gemv" with mxfp4 / nvfp4 weights and bf16 / fp16 activations only: the GEMV with
        explicit layouts (kernels/hopper/mx_gemv_gluon.py, sm_90) instead of the Triton one, whose fp4
        builds lose their register layout on triton 3.7 / 3.8 (plan/mx_gemv.py ``MX_GEMV_GLUON_TRITON``);
        block_m 1 or 2, block_n <= 8, num_warps 1 / 2 / 4 and block_k = 1024 x num_warps.
    """

    block_m: int = 128
    block_n: int = 128
    block_k: int = 128
    num_warps: int = 8
    num_stages: int = 3
    split_k: int = 1
    strategy: str = "triton"
    promote: bool | None = None
    group_m: int = 8
    swap_ab: bool = False
    dequant_a: bool = False
    maxnreg: int = 0
    gluon: bool = False

    def __post_init__(self) -> None:
        # field types first: the eager path hands the object to the kernels as it is, and the
        # custom-op encoding (plan/encoding.py) rejects non-ints, so both must agree
        for name in ("block_m", "block_n", "block_k", "num_warps", "num_stages", "split_k", "group_m", "maxnreg"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"GemmConfig.{name}: expected an int, got {type(v).__name__} {v!r}")
        for name in ("swap_ab", "dequant_a", "gluon"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"GemmConfig.{name}: expected a bool, got {getattr(self, name)!r}")
        if self.promote is not None and not isinstance(self.promote, bool):
            raise TypeError(f"GemmConfig.promote: expected None or a bool, got {self.promote!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"GemmConfig.strategy: expected one of {STRATEGIES}, got {self.strategy!r}")
        if self.maxnreg and (self.strategy != "direct" or not 32 <= self.maxnreg <= 255 or self.maxnreg % 8):
            raise ValueError(f"GemmConfig.maxnreg: only strategy 'direct' takes a register budget (a multiple of 8 in "
                             f"32..255; 0: the compiler's choice), got {self.maxnreg} with strategy {self.strategy!r}")
        if self.dequant_a and self.strategy not in ("stream", "tiled", "direct"):
            raise ValueError(f"GemmConfig.dequant_a: only strategies 'stream', 'tiled' and 'direct' dequantize the "
                             f"activations first, "
                             f"got strategy {self.strategy!r}")
        if self.gluon and self.strategy != "gemv":
            raise ValueError(f"GemmConfig.gluon: only strategy 'gemv' has a Gluon build (the mxfp4 / nvfp4 decode "
                             f"GEMV, kernels/hopper/mx_gemv_gluon.py), got strategy {self.strategy!r}")
        if self.strategy == "gemv":
            self._check_gemv()
            return
        if self.strategy == "stream":
            self._check_stream()
            return
        if self.strategy == "tiled":
            self._check_tiled()
            return
        if self.strategy == "direct":
            self._check_direct()
            return
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"GemmConfig.{name}: expected a power of two >= 16, got {v}")
        if self.split_k < 1:
            raise ValueError(f"GemmConfig.split_k: expected >= 1, got {self.split_k}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"GemmConfig.num_warps: expected a power of two <= 16, got {self.num_warps}")
        if self.num_stages < 1:
            raise ValueError(f"GemmConfig.num_stages: expected >= 1, got {self.num_stages}")

    def _check_gemv(self) -> None:
        # kernels/triton/gemv.py: block_m activation rows and block_n weight rows per program
        # (powers of two for Triton block shapes; block_n divides the 128-row weight-scale
        # block), block_k = K elements per weight-chunk load (whole 128-wide scale blocks)
        for name, lo, hi in (("block_m", 1, GEMV_MAX_M), ("block_n", 1, 128)):
            v = getattr(self, name)
            if not lo <= v <= hi or v & (v - 1):
                raise ValueError(f"GemmConfig.{name}: strategy 'gemv' needs a power of two in [{lo}, {hi}], got {v}")
        if self.block_k < 128 or self.block_k & (self.block_k - 1):
            raise ValueError(f"GemmConfig.block_k: strategy 'gemv' needs a power of two >= 128 (whole K blocks per "
                             f"chunk), got {self.block_k}")
        if self.split_k != 1:
            raise ValueError(f"GemmConfig.split_k: strategy 'gemv' never splits K (one program owns whole rows), "
                             f"got {self.split_k}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"GemmConfig.num_warps: expected a power of two <= 16, got {self.num_warps}")
        if self.gluon and (self.block_m > 2 or self.block_n > 8 or self.num_warps > 4
                           or self.block_k != 1024 * self.num_warps):
            raise ValueError(f"GemmConfig: the Gluon GEMV (gluon=True) runs block_m 1 or 2 activation rows, block_n <= 8 "
                             f"weight rows, 1, 2 or 4 warps and block_k = 1024 x num_warps (one 32-element slice per "
                             f"thread), got block_m={self.block_m}, block_n={self.block_n}, "
                             f"block_k={self.block_k}, num_warps={self.num_warps}")

    def _check_stream(self) -> None:
        # kernels/hopper/stream.py: one warpgroup, 64 weight rows x 128 K per step, the
        # activation rows padded to a wgmma N of 8..64, a TMA ring of num_stages slots
        if self.block_m not in (8, 16, 32, 64):
            raise ValueError(f"GemmConfig.block_m: strategy 'stream' pads the activation rows to 8, 16, 32 or 64, "
                             f"got {self.block_m}")
        if (self.block_n, self.block_k, self.num_warps) != (64, 128, 4):
            raise ValueError(f"GemmConfig: strategy 'stream' runs block_n=64, block_k=128, num_warps=4, got "
                             f"{self.block_n}, {self.block_k}, {self.num_warps}")
        if not 2 <= self.num_stages <= 8:
            raise ValueError(f"GemmConfig.num_stages: strategy 'stream' needs 2..8 ring slots, got {self.num_stages}")
        if self.split_k < 1:
            raise ValueError(f"GemmConfig.split_k: expected >= 1, got {self.split_k}")

    def _check_direct(self) -> None:
        # kernels/hopper/direct.py: four warps of 16 weight rows x 128 K per step on mma.sync
        # m16n8k16, the activation rows padded to its N of 8, no ring
        if (self.block_m, self.block_n, self.block_k, self.num_warps, self.num_stages) != (8, 64, 128, 4, 1):
            raise ValueError(f"GemmConfig: strategy 'direct' runs block_m=8, block_n=64, block_k=128, num_warps=4, "
                             f"num_stages=1, got {self.block_m}, {self.block_n}, {self.block_k}, {self.num_warps}, "
                             f"{self.num_stages}")
        if self.split_k < 1:
            raise ValueError(f"GemmConfig.split_k: expected >= 1, got {self.split_k}")

    def _check_tiled(self) -> None:
        # kernels/hopper/tiled.py: one warpgroup per 64 activation rows, 128 weight rows, 64-element
        # K steps, a TMA ring of num_stages slots (the slot of step i - 2 is refilled at step i)
        # (64-row tiles: slower on every A/B row, and 255 registers with a bias: spills);
        # kernels/hopper/tiled_rs.py (4 warps: the launch's default partition, one of two or four
        # consumer warpgroups): block_m tokens (the wgmma's N) x 128 or 256 weight rows, fp4 weights
        if (self.block_m, self.num_warps) != (128, 8) and not (self.num_warps == 4 and self.block_m in RS_TOKENS):
            raise ValueError(f"GemmConfig: strategy 'tiled' runs block_m=128 with num_warps=8 (kernels/hopper/tiled.py) "
                             f"or block_m in {RS_TOKENS} with num_warps=4 (the register-operand kernel, "
                             f"kernels/hopper/tiled_rs.py), got block_m={self.block_m}, num_warps={self.num_warps}")
        # four consumers get ~112 registers each: built without spills up to 64 tokens (tests/test_aot_tiled.py)
        if self.block_k != 64 or self.block_n not in ((128, 256) if self.num_warps == 4 and self.block_m <= 64
                                                      else (128,)):
            raise ValueError(f"GemmConfig: strategy 'tiled' runs block_n=128 (256 with num_warps=4 and block_m <= 64: "
                             f"four consumer warpgroups), block_k=64, got block_n={self.block_n}, "
                             f"block_k={self.block_k} with block_m={self.block_m}")
        if not 3 <= self.num_stages <= (4 if self.block_m == 256 else 6):
            # 256-token tiles: 32 KB of activations per slot; 5 slots need 180 KB with the weights
            # and fit, but measured no faster than 4 (twenty-eighth session); 3..4 kept
            raise ValueError(f"GemmConfig.num_stages: strategy 'tiled' needs 3..6 ring slots (3..4 with block_m=256), "
                             f"got {self.num_stages} with block_m={self.block_m}")
        if self.split_k < 1 or (self.split_k > 1 and self.num_warps == 4 and (self.block_m > 64 or self.block_n > 128)):
            # the register-operand kernel's split epilogue holds the partial, the sum and the output
            # pointers at once: above 64 tokens ptxas spills (tests/test_aot_tiled.py)
            raise ValueError(f"GemmConfig.split_k: strategy 'tiled' takes split_k >= 1 (1 with num_warps=4 above 64 "
                             f"tokens or with block_n=256: the register-operand kernel splits K for block_m <= 64 on "
                             f"128 weight rows), got {self.split_k} with block_m={self.block_m}, "
                             f"block_n={self.block_n}")

    @property
    def is_register_operand(self) -> bool:
        """Strategy "tiled" on kernels/hopper/tiled_rs.py (4 warps), not tiled.py (8 warps)."""
        return self.strategy == "tiled" and self.num_warps == 4

    def replace(self, **kw) -> "GemmConfig":
        return replace(self, **kw)


