"""Eager calls of the blockscaled modules replayed from CUDA graphs: :func:`enable_cuda_graphs`.

Why: a decode-size MoE layer is a dozen launches whose host path costs far more than their GPU
time. The layer suite (benchmarks/results/h200, moe-layer-20261128-1509, Qwen3-30B-A3B experts at
T = 1): 515-868 us per eager forward against a 53-55 us CUDA-graph replay of the same forward.
Serving engines capture their decode step in a graph; a user calling the model eagerly (e.g.
transformers' ``generate``) gets the host path. A quantized ``Linear`` at decode sizes is one to
three launches behind tens of microseconds of host path each (NOTES, sixteenth session: 32-85 us per
eager call on the H200 host against 17-22 us for ``F.linear``). With this switch each module
(``MoE``, ``Experts``, ``Linear``) keeps one graph per call signature (the shapes, dtypes and
strides of its tensor arguments) for calls of at most ``max_tokens`` tokens:

* the first call of a signature runs eagerly (it compiles the kernels and fills the plan caches);
* the second captures: one call on a side stream (the PyTorch recipe for a warm capture), then the
  capture into a graph with its own memory pool, its inputs copied into static buffers;
* later calls copy their inputs into those buffers, replay the graph on the current stream and
  return a copy of the static output (a new tensor per call, as eagerly).

A call runs eagerly instead when: the module's graphs are off, its tokens exceed ``max_tokens``,
an argument is not a CUDA tensor, grad mode is on and an input or a parameter of the module requires
grad (a replay records no autograd graph; ``torch.no_grad`` / ``inference_mode`` calls, as
``generate`` makes, take the graphs, one set per mode), torch.compile is tracing, or a graph is being captured on the
current stream (a graph of the whole model, or a
module inside a graphed module: the outer graph holds the launches).

The graphs hold the addresses of the module's weights. Updates in place (``load_state_dict``,
``copy_``) are seen; a weight replaced by another tensor (or a child module by another) changes
what the call checks before it replays (the addresses of the tensors in every slot that held one:
parameters, buffers, tensor and ScaledTensor attributes, and the identity of child modules; ~5 us):
the module's graphs are then dropped and captured again. Each graph keeps the transient memory of one
forward at its size; at most ``max_graphs`` per module (later signatures run eagerly: evicting
would capture again and again when more sizes cycle). Outputs are those of eager calls (the same
kernels, plans and arguments; a plan that depends on an input's address alignment is made for the
aligned static buffer). A signature whose capture raises runs eagerly from then on, with a warning.
Use from one stream per device: calls on another stream than the graphs were captured from run
eagerly, and calls from several threads are serialised. Not seen by the staleness check: settings
that are not tensors (``top_k``, ``act_format``, the planner's switches), a prepacked ``Linear``'s
copy after an in-place weight load (its freshness is checked by eager calls only; the packed path
is planned above 64 rows, past the default ``max_tokens``).
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict

import torch

from ..tensor import ScaledTensor
from .experts import Experts
from .linear import Linear
from .moe import MoE

__all__ = ["enable_cuda_graphs", "disable_cuda_graphs", "CudaGraphs"]


def _weight_slots(module: torch.nn.Module) -> list[tuple[object, str]]:
    """Where the module and its children hold tensors: (dict, key) of parameters and buffers, and
    (module, attribute) of plain tensor and ScaledTensor attributes (the MoE modules' weights are
    ScaledTensor attributes). Found once; read at every call (``_addresses``)."""
    slots: list[tuple[object, str]] = []
    for m in module.modules():
        slots += [(m._parameters, k) for k in m._parameters] + [(m._buffers, k) for k in m._buffers]
        slots += [(m._modules, k) for k in m._modules]  # a child replaced: its own tensors are new slots
        slots += [(m, k) for k, v in vars(m).items() if isinstance(v, (torch.Tensor, ScaledTensor))]
    return slots


def _addresses(slots) -> tuple:
    """The addresses of the tensors now in ``slots`` (a replaced tensor changes them)."""
    out = []
    for owner, k in slots:
        v = owner.get(k) if isinstance(owner, dict) else getattr(owner, k, None)
        if isinstance(v, torch.Tensor):
            out.append(v.data_ptr())
        elif isinstance(v, torch.nn.Module):
            out.append(id(v))
        elif isinstance(v, ScaledTensor):
            out += [v.data.data_ptr(), v.scale.data_ptr(),
                    v.global_scale.data_ptr() if isinstance(v.global_scale, torch.Tensor) else 0]
        else:
            out.append(None)
    return tuple(out)


class CudaGraphs:
    """The graphs of one module's forward (module docstring). ``max_tokens``: the most rows of the
    first argument a graphed call may have; ``max_graphs``: signatures kept."""

    def __init__(self, module: torch.nn.Module, max_tokens: int, max_graphs: int):
        if max_tokens < 1 or max_graphs < 1:
            raise ValueError(f"max_tokens/max_graphs: expected >= 1, got {max_tokens}/{max_graphs}")
        self.module, self.max_tokens, self.max_graphs = module, int(max_tokens), int(max_graphs)
        self.graphs: OrderedDict = OrderedDict()  # signature -> (graph, static inputs, static output)
        self.seen: set = set()  # signatures called once (eagerly)
        self.failed: set = set()  # signatures whose capture raised: eager from then on
        self._lock = threading.Lock()  # the static buffers are shared: one copy / replay / clone at a time
        self._streams: dict = {}  # device index -> the stream the graphs were captured from and replay on
        self._capture_streams: dict = {}  # device index -> the stream captures run on
        self._weights: tuple | None = None  # the weights' addresses the graphs were captured with
        self._slots = _weight_slots(module)

    def clear(self) -> None:
        """Drop every graph (and its memory pool); the next calls of each signature run eagerly
        once, then capture again."""
        self.graphs.clear()
        self.seen.clear()
        self.failed.clear()
        self._streams.clear()
        self._weights = None

    def _eligible(self, args) -> bool:
        if torch.compiler.is_compiling():  # first: no guard on the token count while tracing
            return False
        if not args or not all(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
            return False
        x = args[0]
        if x.ndim == 0 or x.shape[-1] == 0 or x.numel() // x.shape[-1] > self.max_tokens:  # tokens: rows of [..., K]
            return False
        if any(a.device != x.device for a in args[1:]):
            return False
        if torch.is_grad_enabled() and (any(a.requires_grad for a in args)
                                        or any(t.requires_grad for t in self.module.parameters())
                                        or any(t.requires_grad for t in self.module.buffers())):
            return False  # a replay records no autograd graph: calls that need one run eagerly
        if torch.cuda.is_current_stream_capturing():
            return False
        # the graphs replay on the stream they were captured from: another stream could overlap the
        # static buffers' copies with a replay in flight (and the split-K counters graphs share)
        stream = self._streams.get(x.device.index)
        return stream is None or stream == torch.cuda.current_stream(x.device)

    def __call__(self, fn, *args):
        """``fn(*args)``, from a graph where eligible."""
        if not self._eligible(args):
            return fn(*args)
        with self._lock:
            return self._call(fn, args)

    def _call(self, fn, args):
        if _addresses(self._slots) != self._weights:  # first use, or a weight / child replaced: stale
            self.clear()
            self._slots = _weight_slots(self.module)
            self._weights = _addresses(self._slots)
        dev = args[0].device
        # (inference mode in the key: static buffers made under it are inference tensors, which a
        # later call outside it could not copy into)
        key = (dev.index, torch.is_inference_mode_enabled(), tuple((a.shape, a.dtype, a.stride()) for a in args))
        entry = self.graphs.get(key)
        if entry is None:
            if key not in self.seen:
                out = fn(*args)
                self.seen.add(key)  # (after the call: an error of the call itself is not a capture failure)
                return out
            if key in self.failed or len(self.graphs) >= self.max_graphs:
                # full: no eviction (signatures cycling past max_graphs would capture on every call)
                return fn(*args)
            try:
                entry = self._capture(fn, args, key)
            except Exception as e:  # noqa: BLE001 - any capture failure: this signature stays eager, said once
                self.failed.add(key)
                warnings.warn(f"blockscaled.nn.enable_cuda_graphs: {type(self.module).__name__} could not be captured "
                              f"for inputs {[tuple(a.shape) for a in args]} ({type(e).__name__}: {e}); those calls "
                              f"run eagerly", RuntimeWarning, stacklevel=4)
                return fn(*args)
        graph, static_in, static_out = entry
        with torch.cuda.device(dev):
            for s, a in zip(static_in, args):
                s.copy_(a)
            graph.replay()
            return static_out.clone()

    def _capture(self, fn, args, key):
        dev = args[0].device
        with torch.cuda.device(dev):  # the library launches on the current device: the module's
            caller = torch.cuda.current_stream(dev)
            static_in = tuple(torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=dev).copy_(a)
                              for a in args)
            cap = self._capture_streams.get(dev.index)
            if cap is None:
                cap = self._capture_streams[dev.index] = torch.cuda.Stream(device=dev)
            cap.wait_stream(caller)
            with torch.cuda.stream(cap):  # a warm call on the capture stream (PyTorch's recipe)
                fn(*static_in)
            graph = torch.cuda.CUDAGraph()
            # (our own stream context outside the capture's: torch.cuda.graph's exit ends the capture
            # before it restores the stream, so a failed capture would leave the caller on its stream)
            with torch.cuda.stream(cap):
                with torch.cuda.graph(graph, stream=cap):
                    static_out = fn(*static_in)
            caller.wait_stream(cap)
        self._streams[dev.index] = caller
        self.graphs[key] = (graph, static_in, static_out)
        return self.graphs[key]


def enable_cuda_graphs(model: torch.nn.Module, max_tokens: int = 64, max_graphs: int = 8) -> int:
    """Replay the eager calls of every :class:`MoE` / :class:`Experts` / :class:`Linear` module in
    ``model`` (itself included; not those inside one already switched on, e.g. an MoE's Experts)
    of at most ``max_tokens`` tokens (rows of the first argument's ``[..., K]``) from CUDA graphs,
    one per call signature (module
    docstring: when a call runs eagerly instead, what the graphs hold). Returns the number of
    modules switched on. :func:`disable_cuda_graphs` switches them off and frees the graphs.

    Example::

        bs.nn.quantize_model(model, "mxfp4")
        bs.nn.enable_cuda_graphs(model, max_tokens=64)   # eager decode steps replay graphs
        model.generate(ids, max_new_tokens=32)
    """
    n, outer = 0, []
    for name, m in model.named_modules():
        if isinstance(m, (MoE, Experts, Linear)):
            if any(name.startswith(o + ".") or not o for o in outer):
                continue  # inside a graphed module (an MoE's Experts): its graph holds these launches
            m._graphs = CudaGraphs(m, max_tokens, max_graphs)
            outer.append(name)
            n += 1
    return n


def disable_cuda_graphs(model: torch.nn.Module) -> int:
    """Switch :func:`enable_cuda_graphs` off for every module of ``model``; returns how many were on."""
    n = 0
    for m in model.modules():
        if getattr(m, "_graphs", None) is not None:
            m._graphs.clear()
            m._graphs = None
            n += 1
    return n
