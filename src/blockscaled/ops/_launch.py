"""Repeated launches of a Triton kernel without ``JITFunction.run``'s Python path.

Why: at decode sizes an eager call is host-bound. On the H200 host (benchmarks/NOTES.md,
sixteenth session, scripts/probes/host_cost.py cProfile), Triton's ``kernel[grid](...)`` took
~40 % of an eager ``bs.gemm`` (binding 25-30 arguments, a specialisation key with ``str(options)``,
the global-value check, ``launch_metadata``), around the ~5 us of the C launcher itself.

How: :func:`fast` wraps a ``JITFunction``. A launch computes a key of everything Triton
specialises a compiled kernel on, from the arguments themselves: each tensor's dtype and whether
its address is 16-byte aligned (the only tensor facts in Triton's specialisation), every other
positional value with its type (ints exactly: Triton specialises on ``== 1``, ``% 16`` and the
32/64-bit range, all functions of the value), the keyword arguments (constexprs and compile
options) exactly, and the current CUDA device. The first launch of a key goes through
``kernel[grid](...)`` as before (compiling if needed) and keeps the ``CompiledKernel`` it returns;
later launches of the key call that kernel's launcher directly, with every parameter in the
kernel's order (positional, then keywords and defaults: the list ``JITFunction.run`` passes), on
the current stream. So the direct launch runs the very kernel and arguments Triton's own path
would, and nothing is compiled or specialised differently.

Tensors and Gluon TMA descriptors (keyed by what Triton specialises them on: ``_desc_key``) are
never kept: positional ones pass through, and those passed by keyword (split-K scratch) are put
in their parameter's place at each launch. Falls back to Triton's path (always correct) when:
launch hooks are set (a non-empty hook chain: profilers such as proton read ``launch_metadata``),
the grid is a callable, an argument is unhashable, a parameter has neither a value nor a default,
or ``BLOCKSCALED_FAST_LAUNCH=0``. Not used in the interpreter (its kernels
are not ``JITFunction`` objects) nor for triton releases whose launch path was not read
(:data:`TESTED_TRITON`); the wrapper then returns the kernel unchanged. Runtime changes of
Triton's debug / instrumentation knobs are not seen by keys already launched.
"""

from __future__ import annotations

import inspect
import os

import torch
import triton
from triton.runtime.jit import JITFunction

__all__ = ["fast", "FAST_LAUNCH", "TESTED_TRITON"]

#: triton releases whose ``JITFunction.run`` / ``CompiledKernel.run`` were read for this module
#: (the launcher's argument list: grid x / y / z, stream, function, packed metadata, launch
#: metadata, enter / exit hooks, then every kernel parameter in order): 3.6 (the GPU image's) and
#: 3.8 (pip's newest in the declared range when this was written).
TESTED_TRITON = ("3.6.", "3.8.")

#: ``BLOCKSCALED_FAST_LAUNCH=0`` switches the direct launch off (read at import; A/B it with the
#: probe scripts/probes/launch_cost.py).
FAST_LAUNCH = (os.environ.get("BLOCKSCALED_FAST_LAUNCH", "1").strip().lower() not in ("0", "off", "false", "no")
               and triton.__version__.startswith(TESTED_TRITON))

try:  # triton >= 3.4 keeps launch hooks in knobs
    _RUNTIME = triton.knobs.runtime
    _HookChain = triton.knobs.HookChain
except AttributeError:  # pragma: no cover - older triton: no fast path
    _RUNTIME = _HookChain = None

# Gluon kernels (the sm_90a kernels) take the same path: ``GluonJITFunction`` is a ``JITFunction``
# whose ``run`` is Triton's, with host-side TMA descriptors among the arguments. Optional: some
# triton releases have no Gluon (then only plain JIT functions are wrapped).
try:
    from triton.experimental.gluon._runtime import GluonJITFunction as _GluonJIT
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as _GluonDesc
except Exception:  # noqa: BLE001 - optional: any import failure means no Gluon here
    _GluonJIT = _GluonDesc = None
_JIT_TYPES = tuple(t for t in (JITFunction, _GluonJIT) if t is not None)


def _desc_key(d) -> tuple:
    """What Triton specialises a host TMA descriptor argument on (``native_specialize_impl``:
    ``tensordesc<dtype[block_shape],layout>``), plus its padding mode. Its base address, shape and
    strides are launch-time values: the launcher encodes the tensor map from them at every launch
    (``make_tensordesc_arg``), so the direct launch passes the descriptor object as Triton's does."""
    return (_GluonDesc, d.base.dtype, tuple(d.block_shape), d.layout, d.padding,
            getattr(d, "round_f32_to_tf32", False))  # (a field from triton 3.8 on)


def _hooked(hook) -> bool:
    """A launch hook is set: anything but None or an empty ``HookChain`` (triton 3.6-3.8 keep an
    empty chain there by default, and Triton's own path then calls it with ``launch_metadata``)."""
    return hook is not None and (hook.__class__ is not _HookChain or bool(hook.calls))


_T = torch.Tensor
#: entries per kernel before its cache is dropped (keys follow M at most call sites)
_MAX_KEYS = 4096
_NO_FAST = object()  # a key whose launches must take Triton's path


class FastKernel:
    """A ``JITFunction`` whose repeated launches call the compiled kernel's launcher directly
    (module docstring). ``fk[grid](*args, **kwargs)`` as with the JIT function; any other
    attribute is the JIT function's."""

    def __init__(self, fn: JITFunction):
        self.fn = fn
        self._params = tuple(fn.params)
        self._cache: dict = {}
        self._stream = None

    def __getattr__(self, name):
        return getattr(self.fn, name)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launch(grid, args, kwargs)

    def _launch(self, grid, args, kwargs):
        rt = _RUNTIME
        if _hooked(rt.launch_enter_hook) or _hooked(rt.launch_exit_hook) or callable(grid):
            return self.fn[grid](*args, **kwargs)
        dev = torch.cuda.current_device()
        try:
            key = (dev, tuple([(a.dtype, not a.data_ptr() & 15) if isinstance(a, _T)
                               else a if a.__class__ is int else _desc_key(a) if a.__class__ is _GluonDesc
                               else (a.__class__, a) for a in args]),
                   tuple([(n, (v.dtype, not v.data_ptr() & 15)) if isinstance(v, _T)
                          else (n, _desc_key(v)) if v.__class__ is _GluonDesc else (n, v)
                          for n, v in kwargs.items()]))
            entry = self._cache.get(key)
        except TypeError:  # an unhashable argument
            return self.fn[grid](*args, **kwargs)
        if entry is None:
            return self._first(key, grid, args, kwargs)
        if entry is _NO_FAST:
            return self.fn[grid](*args, **kwargs)
        run, function, metadata, tail, slots = entry
        if slots:  # tensors passed by keyword (e.g. split-K scratch): this launch's own
            tail = list(tail)
            for i, name in slots:
                tail[i] = kwargs[name]
        n = len(grid)
        run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, self._stream(dev), function, metadata,
            None, None, None, *args, *tail)
        return None

    def _first(self, key, grid, args, kwargs):
        """Triton's own launch (compiling if needed); keep what later launches of ``key`` need."""
        ck = self.fn[grid](*args, **kwargs)
        tail, slots = [], []
        for p in self._params[len(args):]:
            v = kwargs[p.name] if p.name in kwargs else p.default
            if v is inspect.Parameter.empty:
                tail = None
                break
            if isinstance(v, _T) or v.__class__ is _GluonDesc:  # this launch's own, not kept
                slots.append((len(tail), p.name))
            tail.append(v)
        if len(self._cache) >= _MAX_KEYS:
            self._cache.clear()
        if tail is None or ck is None or not hasattr(ck, "packed_metadata"):
            self._cache[key] = _NO_FAST
            return ck
        if self._stream is None:
            self._stream = _stream_getter()
        # (tensors are not kept: their slots are filled from each launch's keywords)
        tail = tuple(None if i in {j for j, _ in slots} else v for i, v in enumerate(tail))
        self._cache[key] = (ck.run, ck.function, ck.packed_metadata, tail, tuple(slots))
        return ck


def _stream_getter():
    """Triton's own current-stream query (``torch.cuda``'s raw current stream of a device index)."""
    return triton.runtime.driver.active.get_current_stream


#: one wrapper per kernel, by id (the kernels are module globals, alive for the process)
_WRAPPED: dict[int, FastKernel] = {}


def fast(kernel):
    """``kernel`` with direct repeated launches (:class:`FastKernel`) where that applies: a
    ``JITFunction`` (or Gluon's, TMA descriptor arguments included) on a tested triton with
    ``BLOCKSCALED_FAST_LAUNCH`` on. Anything else (the
    interpreter's kernels, a test's spy, a stub) comes back unchanged. One wrapper per kernel.

    Example::

        fast(quantize_1xk_kernel)[grid](x, q, s, ..., ROWS=rows, num_warps=4)
    """
    if not FAST_LAUNCH or _RUNTIME is None or type(kernel) not in _JIT_TYPES:
        return kernel
    w = _WRAPPED.get(id(kernel))
    if w is None or w.fn is not kernel:
        w = _WRAPPED[id(kernel)] = FastKernel(kernel)
    return w
