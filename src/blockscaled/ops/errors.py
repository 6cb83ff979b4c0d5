"""Loud failure for bad MoE metadata without a host sync, and :func:`check_errors`.

Why: ``grouped_gemm`` / ``swiglu`` read ``offsets`` / ``masked_m`` on the device only (a host
read would be a sync and would break CUDA-graph capture), so unless ``validate=True`` their
*values* are not checked before the launch. Bad values cannot make a kernel read or write
out of bounds (the kernels clamp them) but the result is meaningless. So, after the GEMM, the
op launches :func:`blockscaled.kernels.triton.check.metadata_check_kernel` on the same
stream, which checks the values on the device and, when they are bad:

* writes NaN over the **whole** output of that call (``out=`` included; in the masked layout
  also the rows past the counts): with non-monotone offsets "the rows of the bad group" is
  not well defined, and a NaN output cannot pass for a result;
* records the call in a per-device int32 flag buffer (sticky: a count of bad calls and the
  details of the first one), which :func:`check_errors` reads, raises on and clears.

Valid metadata costs one small launch (a fixed grid of at most ``MAX_PROGRAMS`` programs that
each read the metadata vector and exit). Nothing here synchronises the host or allocates per
call, so the check is captured in CUDA graphs with the GEMM (the flag buffer is allocated
once per device, at the first grouped call outside a capture; see :func:`flag_buffer`).

Paths: CUDA and the Triton interpreter (CPU with ``TRITON_INTERPRET=1``) run the kernel; the
float64 reference path (CPU without the interpreter) runs :func:`check_metadata_host`, the
same rules and the same flag, in torch. ``validate=True`` checks on the host before the
launch instead (an exact ``ValueError``; a sync) and skips the device check.

Flag buffer layout (int32 ``[FLAG_WORDS]``): 0 number of bad calls since the last
``check_errors``; 1 "details recorded"; 2 op (``OP_NAMES``); 3 mode (1 contiguous, 2 masked);
4 kinds (bits of ``kernels/triton/check.py``); 5 index of the first bad entry; 6 its value;
7 the entry before it (offsets); 8 the limit (rows of ``a`` / ``max_m``); 9 E.
"""

from __future__ import annotations

import warnings

import torch

from ..kernels.triton.check import BAD_ABOVE, BAD_FIRST, BAD_LAST, BAD_NEGATIVE, BAD_ORDER, metadata_check_kernel
from ..reference.grouped import metadata_errors
from ._launch import fast

__all__ = ["check_errors", "check_metadata", "check_metadata_host", "flag_buffer", "flags_of", "OP_GROUPED_GEMM",
           "OP_SWIGLU", "OP_EXPERTS"]

FLAG_WORDS = 16
#: op 3: the MoE experts' combine (ops/moe.py ``combine`` with offsets): its expert ids, permuted by
#: ops/moe.py ``permute``, were not all in [0, E) (the grouped GEMMs in between skip their own check)
OP_GROUPED_GEMM, OP_SWIGLU, OP_EXPERTS = 1, 2, 3
OP_NAMES = {OP_GROUPED_GEMM: "grouped_gemm", OP_SWIGLU: "swiglu", OP_EXPERTS: "nn.Experts"}
MODE_CONTIGUOUS, MODE_MASKED = 1, 2  # as ops/grouped.py

class _CallerChecks:
    """The ``validate=`` value of library callers that check the metadata themselves, after the op
    (``nn.Experts``: its combine checks the permutation it made, ops/moe.py ``combine``): no host
    check and no device check of its own. Not for users: metadata from outside must be checked."""

    def __repr__(self) -> str:
        return "CALLER_CHECKS"


CALLER_CHECKS = _CallerChecks()

#: Grid of the check: at most this many programs grid-stride over the output (only when the
#: metadata is bad); the interpreter runs programs one after another, so it gets a few.
MAX_PROGRAMS = 256
_MAX_PROGRAMS_INTERPRETER = 4
_BLOCK = 1024

#: One flag buffer per device (CPU included: interpreter and reference paths).
_FLAGS: dict[torch.device, torch.Tensor] = {}
#: Buffers created inside a CUDA-graph capture (no device buffer existed yet): kept alive with
#: the graphs that use them; check_errors cannot see them (see flag_buffer).
_CAPTURED_FLAGS: list[torch.Tensor] = []


def _device_key(device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device: expected a torch.device, a device string or None, got {device!r}") from None
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def flag_buffer(device) -> torch.Tensor:
    """The int32 ``[FLAG_WORDS]`` error flag of ``device`` (created zeroed on first use).

    Created outside a CUDA-graph capture (the first grouped call on a device, which also
    compiles the kernels, is normally an eager warm-up): a zeroed buffer that later captures
    and eager calls share. A capture that finds none gets a private zeroed buffer (a memset
    node in its graph) and a warning: NaN poisoning still works there, but check_errors does
    not see that graph's errors. Call :func:`check_errors` once before capturing to avoid it."""
    dev = _device_key(device)
    buf = _FLAGS.get(dev)
    if buf is not None:
        return buf
    if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
        warnings.warn(
            f"blockscaled: the MoE metadata error flag of {dev} is created inside a CUDA-graph capture; "
            f"bad offsets / masked_m in this graph still give NaN outputs, but check_errors() will not "
            f"report them. Call blockscaled.check_errors() (or one grouped op) before capturing.",
            RuntimeWarning, stacklevel=3,
        )
        buf = torch.zeros(FLAG_WORDS, dtype=torch.int32, device=dev)
        _CAPTURED_FLAGS.append(buf)
        return buf
    buf = torch.zeros(FLAG_WORDS, dtype=torch.int32, device=dev)
    if dev.type == "cuda":
        # once per device: the memset must be done before a kernel on another stream may
        # write the flag (launches on other streams are not ordered after this one)
        torch.cuda.current_stream(dev).synchronize()
    # two threads making their first call at once: both keep the buffer stored first
    return _FLAGS.setdefault(dev, buf)


def _out_geometry(out: torch.Tensor, mode: int) -> tuple[int, int, int, int, int]:
    """(rows per expert, N, total elements, expert stride, row stride) of a grouped output."""
    n = out.shape[-1]
    if mode == MODE_MASKED:
        rows_per_e = out.shape[1]
        rows = out.shape[0] * rows_per_e
        return max(rows_per_e, 1), max(n, 1), rows * n, out.stride(0), out.stride(1)
    rows = out.shape[0]
    return max(rows, 1), max(n, 1), rows * n, 0, out.stride(0)


def flags_of(device: torch.device) -> torch.Tensor:
    """:func:`flag_buffer` of ``device`` (a torch.device with its index), the per-call fast path."""
    flags = _FLAGS.get(device)
    return flags if flags is not None else flag_buffer(device)


def check_metadata(seg: torch.Tensor, out: torch.Tensor, op: int, mode: int, limit: int) -> None:
    """Launch the device check of ``seg`` (offsets ``[E+1]`` or counts ``[E]``) after the GEMM
    that wrote ``out`` (``[sum_m, N]`` or ``[E, max_m, N]``, column stride 1), on the current
    stream. ``limit``: rows of ``a`` (contiguous) or ``max_m`` (masked). No host sync.
    Host work kept small (it runs on every eager call): no triton.cdiv (a @jit function)."""
    e = seg.numel() - 1 if mode == MODE_CONTIGUOUS else seg.numel()
    rows_per_e, n, total, s_e, s_m = _out_geometry(out, mode)
    flags = flags_of(out.device)
    cap = MAX_PROGRAMS if out.device.type == "cuda" else _MAX_PROGRAMS_INTERPRETER
    nprog = max(1, min(-(-total // _BLOCK), cap))
    fast(metadata_check_kernel)[(nprog,)](
        seg, out, flags, e, limit, rows_per_e, n, total, s_e, s_m, nprog,
        OP=op, MODE=mode, E_POW2=max(16, 1 << e.bit_length()), BLOCK=_BLOCK, num_warps=4,
    )


def check_metadata_host(seg: torch.Tensor, out: torch.Tensor, op: int, mode: int, limit: int) -> None:
    """The float64 reference path's twin of :func:`check_metadata` (CPU, host arithmetic):
    the same rules, the same NaN over ``out`` and the same flag words."""
    kinds, first, value, prev = metadata_errors(seg, mode, limit)
    if not kinds:
        return
    flags = flag_buffer(out.device)
    flags[0] += 1
    if int(flags[1]) == 0:
        e = seg.numel() - 1 if mode == MODE_CONTIGUOUS else seg.numel()
        flags[1:10] = torch.tensor([1, op, mode, kinds, first, value, prev, limit, e], dtype=torch.int32)
    out.fill_(float("nan"))


def _why(mode: int, kinds: int, i: int, v: int, prev: int, limit: int, e: int, op: int = 0) -> str:
    """Words for the recorded details of the first bad call."""
    if mode == MODE_CONTIGUOUS and op == OP_EXPERTS:
        return (f"{limit - v} of its {limit} expert assignments (top_k_index) were outside [0, E={e}) "
                f"(the sorted offsets end at {v})")
    if mode == MODE_CONTIGUOUS:
        said = []
        if i == 0 and kinds & BAD_FIRST:
            said.append(f"offsets[0]={v}, expected 0")
        if i > 0 and v < prev:
            said.append(f"offsets[{i}]={v} < offsets[{i - 1}]={prev}, expected non-decreasing offsets")
        if i == e and kinds & BAD_LAST and v != limit:
            said.append(f"offsets[E={e}]={v}, expected the number of rows of a ({limit})")
        rest = [w for bit, w in ((BAD_FIRST, "offsets[0] != 0"), (BAD_ORDER, "decreasing offsets"),
                                 (BAD_LAST, f"offsets[E] != rows of a ({limit})")) if kinds & bit]
        return "; ".join(said) + f" (found: {', '.join(rest)})"
    msg = f"masked_m[{i}]={v}, expected a count in [0, max_m={limit}]"
    rest = [w for bit, w in ((BAD_NEGATIVE, "negative counts"), (BAD_ABOVE, f"counts above max_m={limit}"))
            if kinds & bit]
    return f"{msg} (found: {', '.join(rest)})"


def describe(words: list[int], device) -> str:
    """The message :func:`check_errors` raises for the flag words of ``device``."""
    count, _, op, mode, kinds, i, v, prev, limit, e = words[:10]
    name = OP_NAMES.get(op, f"op {op}")
    layout = f"contiguous offsets, E={e}" if mode == MODE_CONTIGUOUS else f"masked_m, E={e}"
    return (
        f"blockscaled.{name} ({layout}) ran with invalid MoE metadata on {device}: "
        f"{_why(mode, kinds, i, v, prev, limit, e, op)}. Its output was overwritten with NaN. "
        f"{count} call(s) with invalid metadata since the last check_errors() (details of the first). "
        + ("Expert ids must lie in [0, E); -1 style 'no expert' entries are not supported."
           if op == OP_EXPERTS else
           "validate=True checks on the host before the launch (a sync) and raises at the faulty call.")
    )


def check_errors(device: torch.device | str | None = None) -> None:
    """Raise if a grouped op ran with invalid ``offsets`` / ``masked_m`` since the last call.

    ``grouped_gemm`` and ``swiglu`` check their metadata on the device without a host sync
    (unless ``validate=True``): bad values make the op write NaN over its output and set a
    sticky per-device flag. This function synchronises ``device`` (every device that ran a
    grouped op when None), and if its flag is set, clears it and raises a ``RuntimeError``
    naming the op and what was wrong with the first bad call. Call it where a sync is
    acceptable (after a training step, after a graph replay, in tests); not inside a
    CUDA-graph capture (raises RuntimeError). Also creates the flag of ``device`` (None: the
    current CUDA device, once CUDA is initialised) if needed, so that graphs captured
    afterwards share it.

    Example::

        y = bs.grouped_gemm(a, w, offsets=offs)     # offs computed on the GPU, not checked on the host
        ...
        bs.check_errors()                           # raises here if offs was bad (y is then all NaN)
    """
    cuda_up = torch.cuda.is_available() and torch.cuda.is_initialized()
    if cuda_up and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("check_errors: cannot synchronise during CUDA-graph capture; call it after "
                           "graph.replay() (or before capturing, to create the error flag)")
    if device is not None:
        dev = _device_key(device)
        if dev.type == "cuda":
            flag_buffer(dev)
        devices = [dev]
    else:
        if cuda_up:
            flag_buffer(torch.device("cuda", torch.cuda.current_device()))
        devices = list(_FLAGS)
    for dev in devices:
        buf = _FLAGS.get(dev)
        if buf is None:
            continue
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        words = buf.tolist()
        if words[0] == 0:
            continue
        buf.zero_()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        raise RuntimeError(describe(words, dev))


# Custom op for launches outside the grouped custom ops (the one-expert contiguous call runs the
# dense GEMM, then this), so torch.compile(fullgraph=True) traces one opaque op. Its layout
# argument is not called ``mode``: inductor wraps mutating ops in auto_functionalized_v2, whose
# own ``mode`` parameter then gets the value twice (TypeError at compile time, seen on torch 2.11).
@torch.library.custom_op("blockscaled::check_metadata", mutates_args=("out",))
def _check_metadata_op(seg: torch.Tensor, out: torch.Tensor, op: int, grouping: int, limit: int) -> None:
    check_metadata(seg, out, op, grouping, limit)


@_check_metadata_op.register_fake
def _(seg, out, op, grouping, limit) -> None:
    return None
