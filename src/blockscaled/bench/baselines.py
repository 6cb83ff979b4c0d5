"""Baselines run in the same process on the same (quantized) inputs as our ops.

Each baseline says which of our ops it is compared with (``op``), whether it applies to a
case/format (``unavailable`` returns a one-line reason, or None), prepares its operands from
an input bundle outside the timed region, and runs. Availability problems never stop a run:
the runner prints ``baseline <name> skipped: <reason>`` once and goes on.
"""

from __future__ import annotations

import importlib
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from ..formats import E4M3_MAX, get_format
from ..layouts import to_deepgemm_fp32
from ..ops.quantize import dequantize, quantize
from ..reference.quantize import quantize as reference_quantize
from .workers import run_in_processes

__all__ = ["Baseline", "BASELINE_NAMES", "baselines_for", "Unavailable", "GemmInputs", "GroupedInputs", "SwigluInputs"]


class Unavailable(RuntimeError):
    """A baseline cannot run here (missing library, unsupported shape/format/GPU)."""


@dataclass
class GemmInputs:
    x: torch.Tensor  # [M, K] activations (unquantized)
    qa: Any  # ScaledTensor [M, K]
    qb: Any  # ScaledTensor [N, K]
    out_dtype: torch.dtype


@dataclass
class GroupedInputs:
    x: torch.Tensor  # [sum_m, K] (contiguous) or [E, max_m, K] (masked)
    qa: Any
    qb: Any  # ScaledTensor [E, N, K]
    offsets: torch.Tensor  # int32 [E+1] (contiguous layout; for masked: e*max_m based)
    counts: torch.Tensor  # int32 [E]
    ms: tuple[int, ...]  # host copy of the counts (baselines may use it; our ops may not)
    masked: bool
    out_dtype: torch.dtype


@dataclass
class SwigluInputs:
    x: torch.Tensor
    qa: Any
    qg: Any
    qu: Any
    out_dtype: torch.dtype


def _deq(q) -> torch.Tensor:
    return dequantize(q, dtype=torch.float32)


def _tensorwise_fp8(t: torch.Tensor):
    """fp32 tensor -> (e4m3 tensor, fp32 0-d scale): one scale for the whole tensor."""
    amax = t.abs().amax().clamp(min=1e-12)
    s = (amax / E4M3_MAX).to(torch.float32)
    return (t / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), s


def _rowwise_fp8(t: torch.Tensor):
    """fp32 ``[..., R, K]`` -> (e4m3, fp32 ``[..., R]`` scales) one scale per row."""
    amax = t.abs().amax(-1).clamp(min=1e-12)
    s = (amax / E4M3_MAX).to(torch.float32)
    return (t / s[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), s


def _cublas_block_unavailable(m: int | None, k: int) -> str | None:
    """Why cuBLAS' block-scaled fp8 GEMM (torch._scaled_mm with 1x128 / 128x128 scales) cannot take an
    M x K problem, else None. Measured (H200, torch 2.11 + CUDA 13.0, benchmarks/NOTES.md twenty-third
    session): with K / 128 not a multiple of 4 (e.g. K = 1408, 8960, 9088) it returns wrong outputs
    (relative error 0.09 to 1e3, inf / nan) without an error; the scales' leading dimension is then
    not 16-byte aligned, and torch accepts no padded layout ("Invalid scaling configuration"). M % 4 !=
    0 raises CUBLAS_STATUS_NOT_SUPPORTED."""
    if k % 128:
        return f"cuBLAS fp8_block needs K % 128 == 0 (K={k})"
    if (k // 128) % 4:
        return f"cuBLAS fp8_block computes wrong outputs unless K / 128 % 4 == 0 (K={k})"
    if m is not None and m % 4:
        return f"cuBLAS fp8_block needs M % 4 == 0 (M={m})"
    return None


def _need_scaled_mm():
    if not hasattr(torch, "_scaled_mm"):
        raise Unavailable("torch._scaled_mm missing in this torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        raise Unavailable("FP8 cuBLAS needs an sm_89+ GPU")


def _import(name: str):
    try:
        return importlib.import_module(name)
    except Exception as e:  # ImportError, or a broken install raising anything
        raise Unavailable(f"{name} not importable ({type(e).__name__}: {str(e)[:80]})") from None


class Baseline:
    name: str = "?"
    op: str = "gemm"  # which of our ops it is compared with
    kinds: tuple[str, ...] = ("gemm",)
    formats: tuple[str, ...] | None = None  # None: any
    #: time eagerly as well as with a CUDA graph and keep the faster (per-expert loops).
    best_of_eager_and_graph: bool = False

    def unavailable(self, case, fmt: str) -> str | None:
        if case.kind not in self.kinds:
            return f"not a {case.kind} baseline"
        if self.formats is not None and fmt not in self.formats:
            return f"{fmt} not supported (only {', '.join(self.formats)})"
        try:
            self.check(case, fmt)
        except Unavailable as e:
            return str(e)
        return None

    def check(self, case, fmt: str) -> None:  # raise Unavailable
        pass

    def prepare(self, inp) -> tuple:
        raise NotImplementedError

    def run(self, *args):
        raise NotImplementedError


# --------------------------------------------------------------------------- dense GEMM
class CublasBf16(Baseline):
    """torch.matmul on the *dequantized* operands (bf16): the speed a W16A16 model gets."""

    name = "cublas-bf16"
    kinds = ("gemm", "swiglu")

    def check(self, case, fmt):
        if not torch.cuda.is_available():
            raise Unavailable("needs CUDA")

    def prepare(self, inp):
        a = _deq(inp.qa).to(torch.bfloat16)
        if isinstance(inp, SwigluInputs):
            return a, _deq(inp.qg).to(torch.bfloat16), _deq(inp.qu).to(torch.bfloat16)
        return a, _deq(inp.qb).to(torch.bfloat16)

    def run(self, a, b, b2=None):
        if b2 is None:
            return torch.matmul(a, b.t())
        return torch.nn.functional.silu(torch.matmul(a, b.t())) * torch.matmul(a, b2.t())


class CublasFp8Tensorwise(Baseline):
    """torch._scaled_mm with one fp32 scale per tensor (the FP8 speed of light of cuBLAS)."""

    name = "cublas-fp8"
    kinds = ("gemm", "swiglu")

    def check(self, case, fmt):
        _need_scaled_mm()
        if case.k % 16 or case.n % 16:
            raise Unavailable(f"cuBLAS FP8 needs K and N multiples of 16 (K={case.k}, N={case.n})")

    def prepare(self, inp):
        a8, sa = _tensorwise_fp8(_deq(inp.qa))
        bs = [inp.qg, inp.qu] if isinstance(inp, SwigluInputs) else [inp.qb]
        out = [a8, sa, inp.out_dtype]
        for q in bs:
            out += list(_tensorwise_fp8(_deq(q)))
        return tuple(out)

    def run(self, a8, sa, out_dtype, b8, sb, b28=None, sb2=None):
        y = torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype)
        if b28 is None:
            return y
        y2 = torch._scaled_mm(a8, b28.t(), scale_a=sa, scale_b=sb2, out_dtype=out_dtype)
        return torch.nn.functional.silu(y) * y2


class CublasFp8Block(Baseline):
    """cuBLAS DeepSeek fp8_block via torch._scaled_mm (the exact call listed in docs/design.md,
    "Measurements older than NOTES.md")."""

    name = "cublas-fp8-block"
    formats = ("fp8_block",)

    def check(self, case, fmt):
        _need_scaled_mm()
        why = _cublas_block_unavailable(case.m, case.k)
        if why:
            raise Unavailable(why)

    def prepare(self, inp):
        sa = inp.qa.scale.t().contiguous().t()  # [M, K/128] column-major
        return inp.qa.data, inp.qb.data, sa, inp.qb.scale, inp.out_dtype

    def run(self, a8, b8, sa, sb, out_dtype):
        return torch._scaled_mm(a8, b8.T, sa, sb.T, out_dtype=out_dtype)


class TritonDotScaled(Baseline):
    """Triton's own tl.dot_scaled (emulated via bf16 on Hopper), simplest tiled kernel."""

    name = "triton-dot-scaled"
    formats = ("mxfp8", "mxfp4")

    def check(self, case, fmt):
        if not torch.cuda.is_available():
            raise Unavailable("needs CUDA")
        if case.k % 128:
            raise Unavailable(f"baseline kernel needs K % 128 == 0 (K={case.k})")

    def prepare(self, inp):
        elem = "e2m1" if inp.qa.format.is_fp4 else "e4m3"
        return inp.qa.data, inp.qa.scale, inp.qb.data, inp.qb.scale, elem, inp.qa.shape[-1], inp.out_dtype

    def run(self, a, sa, b, sb, elem, k, out_dtype):
        # Local: this module loads with the CLI's argument parser, before the CLI chooses the
        # interpreter mode; this optional baseline's @triton.jit kernel must be defined after that.
        from .triton_baseline import mx_dot_scaled_gemm

        return mx_dot_scaled_gemm(a, sa, b, sb, elem, k, out_dtype)


class DeepGemmDense(Baseline):
    """DeepGEMM fp8 NT GEMM (deep_gemm.fp8_gemm_nt, or gemm_fp8_fp8_bf16_nt in v1)."""

    name = "deepgemm"
    formats = ("fp8_block",)

    def check(self, case, fmt):
        dg = _import("deep_gemm")
        if not (hasattr(dg, "fp8_gemm_nt") or hasattr(dg, "gemm_fp8_fp8_bf16_nt")):
            raise Unavailable("deep_gemm has neither fp8_gemm_nt nor gemm_fp8_fp8_bf16_nt")
        if case.k % 128:
            raise Unavailable(f"DeepGEMM needs K % 128 == 0 (K={case.k})")

    def prepare(self, inp):
        dg = _import("deep_gemm")
        m, n = inp.qa.shape[0], inp.qb.shape[0]
        out = torch.empty((m, n), dtype=torch.bfloat16, device=inp.qa.device)
        sa = inp.qa.scale
        if hasattr(dg, "get_col_major_tma_aligned_tensor") and not hasattr(dg, "fp8_gemm_nt"):
            sa = dg.get_col_major_tma_aligned_tensor(sa)
        return (inp.qa.data, sa), (inp.qb.data, inp.qb.scale), out

    def run(self, a, b, out):
        dg = importlib.import_module("deep_gemm")
        f = getattr(dg, "fp8_gemm_nt", None) or dg.gemm_fp8_fp8_bf16_nt
        f(a, b, out)
        return out


def deepgemm_shapes(jobs) -> list[tuple[int, int, int]]:
    """The distinct (M, N, K) that :class:`DeepGemmDense` will run among ``jobs`` ((case, format)
    pairs): dense fp8_block cases whose K DeepGEMM takes (K % 128 == 0), in first-seen order."""
    out: dict[tuple[int, int, int], None] = {}
    for case, fmt in jobs:
        if fmt == "fp8_block" and case.kind == "gemm" and case.m > 0 and case.n > 0 and case.k > 0 and case.k % 128 == 0:
            out.setdefault((case.m, case.n, case.k), None)
    return list(out)


def _deepgemm_warm_worker(shapes: list[list[int]]) -> None:
    """One process of :func:`prewarm_deepgemm`: one call per shape (compiles and caches its kernel)."""
    dg = importlib.import_module("deep_gemm")
    for m, n, k in shapes:
        try:
            a = quantize(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), "fp8_block")
            b = quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), "fp8_block", block=(128, 128))
            out = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
            f = getattr(dg, "fp8_gemm_nt", None) or dg.gemm_fp8_fp8_bf16_nt
            f((a.data, to_deepgemm_fp32(a.scale)), (b.data, b.scale), out)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - the bench's own first call reports it
            print(f"deepgemm warm-up M={m} N={n} K={k}: {type(e).__name__}: {e}", file=sys.stderr)


def prewarm_deepgemm(shapes: list[tuple[int, int, int]], processes: int) -> str | None:
    """Fill DeepGEMM's on-disk JIT cache for ``shapes`` in ``processes`` parallel processes before the
    bench times anything, and say so (None: nothing done: DeepGEMM not importable, or fewer than two
    shapes). Why: DeepGEMM compiles each shape's kernel with nvcc at its first call, seconds each
    (minutes for the 115 cases of ``--suite families`` one after the other); 14 processes filled
    the cache for all of them in ~55 s (H200 host, benchmarks/NOTES.md twenty-third session). The processes share the cache
    through the environment (``DG_JIT_CACHE_DIR``); a shape that fails here compiles at the bench's
    own first call, which reports any error."""
    if len(shapes) < 2 or processes < 2:
        return None
    try:
        importlib.import_module("deep_gemm")
    except Exception:  # noqa: BLE001 - not importable: the baseline reports itself unavailable
        return None
    t0 = time.time()
    started = run_in_processes(__name__, "_deepgemm_warm_worker", [list(s) for s in shapes], processes)
    return f"DeepGEMM's JIT cache filled for {len(shapes)} shapes in {started} processes: {time.time() - t0:.0f} s"


# --------------------------------------------------------------------------- grouped GEMM
class TorchExpertLoop(Baseline):
    """Per-expert cuBLAS fp8_block ``_scaled_mm`` loop (what engines fall back to on Hopper);
    timed eager and as a CUDA graph, best of both."""

    name = "torch-loop"
    op = "grouped"
    kinds = ("grouped", "masked")
    formats = ("fp8_block",)
    best_of_eager_and_graph = True

    def check(self, case, fmt):
        _need_scaled_mm()
        why = _cublas_block_unavailable(None, case.k)
        if why:
            raise Unavailable(why)

    def prepare(self, inp):
        segs = []
        a8, sa = inp.qa.data, inp.qa.scale
        start = 0
        for e, m in enumerate(inp.ms):
            if inp.masked:
                rows_a, rows_s = a8[e, :m], sa[e, :m]
            else:
                rows_a, rows_s = a8[start:start + m], sa[start:start + m]
                start += m
            if m == 0:
                continue
            segs.append((rows_a, rows_s.t().contiguous().t(), inp.qb.data[e], inp.qb.scale[e]))
        return segs, inp.out_dtype

    def run(self, segs, out_dtype):
        return [torch._scaled_mm(a, b.T, sa, sb.T, out_dtype=out_dtype) for (a, sa, b, sb) in segs]


class ScaledGroupedMM(Baseline):
    """torch._scaled_grouped_mm with rowwise fp8 scales (not block scales: a speed reference)."""

    name = "scaled-grouped-mm"
    op = "grouped"
    kinds = ("grouped", "masked")

    def check(self, case, fmt):
        if not hasattr(torch, "_scaled_grouped_mm"):
            raise Unavailable("torch._scaled_grouped_mm missing in this torch")
        if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
            raise Unavailable("torch._scaled_grouped_mm rowwise needs sm_90")
        if case.k % 16 or case.n % 16:
            raise Unavailable(f"needs K, N multiples of 16 (K={case.k}, N={case.n})")

    def prepare(self, inp):
        a8, sa = _rowwise_fp8(_deq(inp.qa))
        b8, sb = _rowwise_fp8(_deq(inp.qb))  # [E, N, K], [E, N]
        offs = None if inp.masked else inp.offsets[1:].to(torch.int32).contiguous()
        return a8, b8.transpose(-2, -1), sa, sb, offs, inp.out_dtype

    def run(self, a8, b8t, sa, sb, offs, out_dtype):
        return torch._scaled_grouped_mm(a8, b8t, sa, sb, offs=offs, out_dtype=out_dtype)


class DeepGemmGrouped(Baseline):
    """DeepGEMM grouped fp8 GEMMs: masked (m_grouped_fp8_gemm_nt_masked) and contiguous
    (m_grouped_fp8_gemm_nt_contiguous, only when every segment is a multiple of 128 rows as
    DeepGEMM requires)."""

    name = "deepgemm"
    op = "grouped"
    kinds = ("grouped", "masked")
    formats = ("fp8_block",)

    def check(self, case, fmt):
        dg = _import("deep_gemm")
        if case.kind == "masked" and not hasattr(dg, "m_grouped_fp8_gemm_nt_masked"):
            raise Unavailable("deep_gemm.m_grouped_fp8_gemm_nt_masked missing")
        if case.kind == "grouped":
            if not hasattr(dg, "m_grouped_fp8_gemm_nt_contiguous"):
                raise Unavailable("deep_gemm.m_grouped_fp8_gemm_nt_contiguous missing")
            if any(m % 128 for m in case.ms):
                raise Unavailable("DeepGEMM contiguous layout needs segments padded to 128 rows")

    def prepare(self, inp):
        e = len(inp.ms)
        if inp.masked:
            out = torch.empty((e, inp.qa.shape[1], inp.qb.shape[1]), dtype=torch.bfloat16, device=inp.qa.device)
            expected = max(1, sum(inp.ms) // max(1, e))
            return ("masked", (inp.qa.data, inp.qa.scale), (inp.qb.data, inp.qb.scale), out, inp.counts, expected)
        out = torch.empty((inp.qa.shape[0], inp.qb.shape[1]), dtype=torch.bfloat16, device=inp.qa.device)
        idx = torch.repeat_interleave(
            torch.arange(e, dtype=torch.int32, device=inp.qa.device),
            torch.tensor(inp.ms, device=inp.qa.device),
        )
        return ("contig", (inp.qa.data, inp.qa.scale), (inp.qb.data, inp.qb.scale), out, idx, None)

    def run(self, mode, a, b, out, aux, expected):
        dg = importlib.import_module("deep_gemm")
        if mode == "masked":
            dg.m_grouped_fp8_gemm_nt_masked(a, b, out, aux, expected)
        else:
            dg.m_grouped_fp8_gemm_nt_contiguous(a, b, out, aux)
        return out


# --------------------------------------------------------------------------- MX suite (bench/mx.py)
def _bf16_weight(inp) -> torch.Tensor:
    """``inp.qb`` dequantized to bf16 once per input bundle (the MX suite's baselines share it:
    gpt-oss-120b's gate_up experts are 4.2 GB in bf16)."""
    w = getattr(inp, "_w_bf16", None)
    if w is None:
        w = dequantize(inp.qb, dtype=torch.bfloat16)
        inp._w_bf16 = w
    return w


class CublasBf16Weight(Baseline):
    """cuBLAS bf16 on the weight dequantized ahead of time (``x_bf16 @ W_bf16.T``): the W16A16 model
    every row of the MX suite is compared with (the same call for weight-only, W x A and E2E)."""

    name = "cublas-bf16"
    op = "bf16"
    kinds = ("mx",)

    def check(self, case, fmt):
        if not torch.cuda.is_available():
            raise Unavailable("needs CUDA")

    def prepare(self, inp):
        return inp.x, _bf16_weight(inp)

    def run(self, x, w):
        return torch.matmul(x, w.t())


class ExpertLoopBf16(Baseline):
    """The MoE fallback of engines without a grouped kernel: one cuBLAS bf16 GEMM per expert that
    has rows (host-known counts), bf16 activations, weights dequantized ahead of time, each
    written into its rows of one output; timed eagerly and as a CUDA graph, best of both."""

    name = "bf16-loop"
    op = "bf16-moe"
    kinds = ("mx-moe",)
    best_of_eager_and_graph = True

    def check(self, case, fmt):
        if not torch.cuda.is_available():
            raise Unavailable("needs CUDA")

    def prepare(self, inp):
        w = _bf16_weight(inp)
        out = torch.empty((inp.x.shape[0], w.shape[1]), dtype=torch.bfloat16, device=inp.x.device)
        segs, start = [], 0
        for e, m in enumerate(inp.ms):
            if m:
                segs.append((inp.x[start:start + m], w[e], out[start:start + m]))
            start += m
        return segs, out

    def run(self, segs, out):
        for a, w, o in segs:
            torch.mm(a, w.t(), out=o)
        return out


class GroupedMmBf16(Baseline):
    """``torch._grouped_mm`` (one CUTLASS launch, segment ends read on the device) of the bf16
    activations and the weights dequantized to bf16 ahead of time."""

    name = "grouped-mm-bf16"
    op = "bf16-moe"
    kinds = ("mx-moe",)

    def check(self, case, fmt):
        if not hasattr(torch, "_grouped_mm"):
            raise Unavailable("torch._grouped_mm missing in this torch")
        if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] not in (9, 10):
            raise Unavailable("torch._grouped_mm's bf16 kernel needs sm_90 / sm_100")
        if case.k % 8 or case.n % 8:
            raise Unavailable(f"needs K, N multiples of 8 (K={case.k}, N={case.n})")

    def prepare(self, inp):
        return inp.x, _bf16_weight(inp).transpose(-2, -1), inp.offsets[1:].to(torch.int32).contiguous()

    def run(self, x, wt, ends):
        return torch._grouped_mm(x, wt, offs=ends)


# --------------------------------------------------------------------------- quantize
class TorchReferenceQuantize(Baseline):
    """The pure-torch reference quantizer run eagerly on the GPU (what users had before)."""

    name = "torch-ref"
    op = "quantize"
    kinds = ("quantize", "gemm")

    def prepare(self, inp):
        return inp.x, inp.qa.format if hasattr(inp, "qa") else get_format("fp8_block")

    def run(self, x, fmt):
        return reference_quantize(x, fmt)


#: names accepted by --baselines (deepgemm covers both dense and grouped)
BASELINE_NAMES = ("cublas-bf16", "cublas-fp8", "cublas-fp8-block", "triton-dot-scaled", "deepgemm",
                  "torch-loop", "scaled-grouped-mm", "torch-ref", "bf16-loop", "grouped-mm-bf16")
_ALL: list[Baseline] = [CublasBf16(), CublasFp8Tensorwise(), CublasFp8Block(), TritonDotScaled(), DeepGemmDense(),
                        TorchExpertLoop(), ScaledGroupedMM(), DeepGemmGrouped(), TorchReferenceQuantize(),
                        CublasBf16Weight(), ExpertLoopBf16(), GroupedMmBf16()]


def baselines_for(op: str, names: tuple[str, ...]) -> list[Baseline]:
    """Baseline objects compared with our ``op``, restricted to ``names``."""
    return [b for b in _ALL if b.name in names and b.op == op]
