"""``blockscaled.nn.Linear``: a drop-in ``torch.nn.Linear`` whose weight is a ScaledTensor."""

from __future__ import annotations

import warnings

import torch

from .._checks import check_flag, check_size, resolve_block, resolve_rounding
from ..formats import Format, ScaleRounding, get_format
from ..ops._hopper import gluon_unavailable_reason
from ..ops.mx_linear import packed_linear as _packed_linear
from ..ops.linear import linear as _linear
from ..plan.device import device_info
from ..plan.mx_packed import prefer_packed
from ..plan.types import DTYPE_NAMES as _DTYPE_NAMES
from ..reference.mx_pack import mxfp4_to_fp8_block
from ..ops.quantize import quantize as _quantize
from ..tensor import ScaledTensor, scale_shape

__all__ = ["Linear", "default_weight_block"]

#: Buffers holding the quantized weight; their dtypes are fixed by the format.
_QUANT_BUFFERS = ("weight_data", "weight_scale", "weight_global_scale")
#: The optional exact fp8_block copy of an MX weight (:meth:`Linear.prepack`; not in the state dict).
_PACKED_BUFFERS = ("packed_data", "packed_scale")
_ACT_DTYPES = (torch.bfloat16, torch.float16)
_SHARD_DIMS = ("column", "row")


def default_weight_block(fmt: str | Format) -> tuple[int, int]:
    """The weight block ``Linear.from_linear`` and ``quantize_model`` use when none is given:
    ``(128, 128)`` for fp8_block (DeepSeek-V3 weights), the format's only block otherwise
    (``(1, 32)`` mxfp8/mxfp4, ``(1, 16)`` nvfp4).

    Example::

        default_weight_block("fp8_block")   # (128, 128)
    """
    f = get_format(fmt)
    return (128, 128) if (128, 128) in f.blocks else f.blocks[0]


class Linear(torch.nn.Module):
    """``y = x @ dequantize(weight).T + bias`` with a block-scaled weight (``bs.linear``).

    The quantized weight ``[N, K]`` (N = ``out_features``, K = ``in_features``) lives in
    buffers, so ``.to(device)``, ``state_dict()`` and ``load_state_dict()`` handle it like any
    module state:

    * ``weight_data``: float8_e4m3fn ``[N, K]`` (fp8_block, mxfp8) or uint8 ``[N, K/2]``
      (mxfp4, nvfp4: two e2m1 codes per byte, element ``2i`` in the low nibble);
    * ``weight_scale``: fp32 ``[ceil(N/128), ceil(K/128)]`` (fp8_block 128x128) or
      ``[N, ceil(K/128)]`` (fp8_block 1x128), uint8 E8M0 ``[N, ceil(K/32)]`` (MX),
      float8_e4m3fn ``[N, ceil(K/16)]`` (nvfp4); row-major;
    * ``weight_global_scale``: nvfp4 only, 0-d fp32 encode scale (absent from the state dict
      of the other formats);
    * ``bias``: optional ``[N]`` Parameter (bf16/fp16/fp32), added in fp32.

    ``weight`` returns the ScaledTensor over those buffers (rebuilt when a buffer is replaced,
    e.g. by ``.to(device)``; in-place loads keep it valid). Format, block and scale rounding are
    module attributes, not state: load a state dict into a Linear built with the same ones
    (``Linear(K, N, fmt, ...)`` allocates the buffers; mismatched dtypes or shapes raise).

    ``forward(x)``: ``x`` bf16/fp16 ``[..., K]`` -> ``[..., N]`` of ``x``'s dtype. W x A
    (default): x is quantized on the fly as the weight's format wants (1 x block_k blocks, the
    weight's rounding; nvfp4 with the activations' own global scale); ``weight_only=True``:
    bf16/fp16 x times the dequantized weight. A non-contiguous ``x`` is copied to a contiguous
    one first (as ``torch.nn.Linear`` accepts any strides). CPU tensors run the float64
    reference unless ``TRITON_INTERPRET=1`` was set before import (the Triton interpreter).

    Dtype conversions (``.to(dtype)``, ``.half()``, ``.float()``, ``.bfloat16()``) that would
    cast a quantized buffer raise ``TypeError`` and leave the module unchanged: float8 data and
    fp32 / e4m3 scales are floating-point dtypes that ``torch.nn.Module.to`` would otherwise
    convert, destroying the quantized weight. (mxfp4 stores only uint8, which those calls never
    touch: there they cast the bias only.)

    Example::

        import torch, blockscaled.nn as bsnn
        lin = torch.nn.Linear(1024, 384, bias=True, dtype=torch.bfloat16)
        q = bsnn.Linear.from_linear(lin, "fp8_block")          # 128x128 weight blocks
        y = q(torch.randn(8, 1024, dtype=torch.bfloat16))       # [8, 384] bf16
        w4 = bsnn.Linear.from_linear(lin, "mxfp4", weight_only=True)   # W4A16
    """

    def __init__(self, in_features: int, out_features: int, fmt: str | Format, *, bias: bool = False,
                 block: tuple[int, int] | None = None, rounding: ScaleRounding | str | None = None,
                 weight_only: bool = False, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        """Allocate zero buffers for an ``[out_features, in_features]`` weight of ``fmt`` (to be
        filled by ``load_state_dict``); use :meth:`from_linear` / :meth:`from_scaled` to wrap an
        existing weight.

        Args:
            in_features: K (int >= 1). out_features: N (int >= 1).
            fmt: ``"fp8_block"``, ``"mxfp8"``, ``"mxfp4"``, ``"nvfp4"`` (any case) or a Format.
            bias: allocate a zero ``[N]`` bias Parameter of ``dtype``.
            block: weight block, default :func:`default_weight_block`.
            rounding: the scales' rounding, default the format's.
            weight_only: run bf16/fp16 activations against the dequantized weight.
            device: where the buffers live. dtype: the bias dtype (bf16, fp16 or fp32).

        Example::

            skel = Linear(1024, 384, "nvfp4", bias=True)
            skel.load_state_dict(saved)     # weight_data, weight_scale, weight_global_scale, bias
        """
        super().__init__()
        k = check_size("in_features", in_features, 1)
        n = check_size("out_features", out_features, 1)
        f = get_format(fmt)
        check_flag("bias", bias)
        check_flag("weight_only", weight_only)
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise TypeError(f"dtype: expected the bias dtype torch.bfloat16, float16 or float32, got {dtype}")
        blk = resolve_block("block", default_weight_block(f) if block is None else block, f)
        self.in_features, self.out_features = k, n
        self.format: Format = f
        self.block: tuple[int, int] = blk
        self.rounding: ScaleRounding = resolve_rounding("rounding", rounding, f)
        self.weight_only = weight_only
        self.register_buffer("weight_data", torch.zeros((n, f.packed_k(k)), dtype=f.data_dtype, device=device))
        self.register_buffer("weight_scale",
                             torch.zeros(scale_shape((n, k), f, blk), dtype=f.scale_dtype, device=device))
        gs = torch.ones((), dtype=torch.float32, device=device) if f.has_global_scale else None
        self.register_buffer("weight_global_scale", gs)
        self.bias = torch.nn.Parameter(torch.zeros(n, dtype=dtype, device=device)) if bias else None
        self._weight_cache: ScaledTensor | None = None
        self.register_buffer("packed_data", None, persistent=False)
        self.register_buffer("packed_scale", None, persistent=False)
        self._packed_stamp = None
        self._packed_cache: ScaledTensor | None = None

    # --- constructors ------------------------------------------------------------------
    @classmethod
    def from_scaled(cls, weight: ScaledTensor, bias: torch.Tensor | None = None,
                    weight_only: bool = False) -> "Linear":
        """Wrap a quantized ``ScaledTensor [N, K]`` (its tensors are used, not copied).

        Args:
            weight: 2-D ScaledTensor ``[N, K]`` of any format, e.g. from ``bs.quantize(W, fmt,
                block=...)`` or a checkpoint loader.
            bias: optional ``[N]`` bf16/fp16/fp32 tensor on the weight's device (becomes a
                Parameter; its ``requires_grad`` is kept).
            weight_only: see the class docstring.

        Example::

            w = bs.quantize(W, "fp8_block", block=(128, 128))     # W [N, K] bf16
            lin = Linear.from_scaled(w, bias=b)
        """
        if not isinstance(weight, ScaledTensor):
            raise TypeError(f"weight: expected a ScaledTensor [N, K], got {type(weight).__name__}")
        if weight.ndim != 2:
            raise ValueError(f"weight: expected a 2-D ScaledTensor [N, K], got shape {tuple(weight.shape)}")
        n, k = weight.shape
        if n < 1 or k < 1:
            raise ValueError(f"weight: expected N >= 1 and K >= 1, got shape {tuple(weight.shape)}")
        check_flag("weight_only", weight_only)
        if bias is not None:
            if not isinstance(bias, torch.Tensor):
                raise TypeError(f"bias: expected None or a torch.Tensor [N], got {type(bias).__name__}")
            if tuple(bias.shape) != (n,) or bias.dtype not in (*_ACT_DTYPES, torch.float32):
                raise ValueError(f"bias: expected a bf16/fp16/fp32 tensor of shape ({n},), got {bias.dtype} "
                                 f"{tuple(bias.shape)}")
            if bias.device != weight.device:
                raise ValueError(f"bias: on {bias.device}, weight on {weight.device}; both must be on one device")
        with torch.device("meta"):  # the skeleton's zero buffers are replaced below
            mod = cls(k, n, weight.format, block=weight.block, rounding=weight.rounding, weight_only=weight_only)
        mod.weight_data = weight.data
        mod.weight_scale = weight.scale
        mod.weight_global_scale = weight.global_scale
        if bias is not None:
            mod.bias = torch.nn.Parameter(bias, requires_grad=bias.requires_grad)
        return mod

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, fmt: str | Format, *, weight_only: bool = False,
                    block: tuple[int, int] | None = None,
                    rounding: ScaleRounding | str | None = None) -> "Linear":
        """Quantize a ``torch.nn.Linear``'s weight (bf16/fp16/fp32 ``[N, K]``) with ``bs.quantize``.

        Args:
            linear: the module (not modified). Its bias is copied (same dtype, requires_grad).
            fmt: target format (any case) or Format.
            weight_only: see the class docstring.
            block: weight block, default :func:`default_weight_block` (128x128 for fp8_block).
            rounding: scale rounding, default the format's (fp8_block EXACT, MX RCEIL).

        Runs where the weight is (CUDA kernels, or on CPU the reference / the interpreter).

        Example::

            q = Linear.from_linear(torch.nn.Linear(256, 512, dtype=torch.bfloat16), "nvfp4")
        """
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"linear: expected a torch.nn.Linear, got {type(linear).__name__}")
        f = get_format(fmt)
        blk = default_weight_block(f) if block is None else block
        w = linear.weight.detach()  # no straight-through link: the float weight is not kept
        if w.dtype not in (*_ACT_DTYPES, torch.float32):
            raise TypeError(f"linear: expected a bf16/fp16/fp32 weight, got {w.dtype}")
        q = _quantize(w.contiguous(), f, block=blk, rounding=rounding, check_range=False)
        bias = None
        if linear.bias is not None:
            bias = linear.bias.detach().clone().requires_grad_(linear.bias.requires_grad)
        return cls.from_scaled(q, bias, weight_only=weight_only)

    # --- the weight --------------------------------------------------------------------
    @property
    def weight(self) -> ScaledTensor:
        """The quantized weight, a ScaledTensor ``[out_features, in_features]`` over the buffers."""
        d, s, g = self.weight_data, self.weight_scale, self.weight_global_scale
        c = self._weight_cache
        if c is None or c.data is not d or c.scale is not s or c.global_scale is not g:
            c = ScaledTensor(d, s, self.format, (self.out_features, self.in_features), self.block, self.rounding,
                             global_scale=g)
            self._weight_cache = c
        return c

    @property
    def scaled_weight(self) -> ScaledTensor:
        """Same as :attr:`weight`: the name ``bs.warmup`` looks for on any module holding a
        quantized weight."""
        return self.weight

    def _apply(self, fn, recurse: bool = True):
        # A packed copy already stale (weights loaded since prepack) must not be re-stamped as
        # fresh by the move below: drop it now.
        fresh = self._packed_fresh()
        # Convert the quantized buffers first, to refuse a dtype change before anything moved.
        new = {}
        for name in _QUANT_BUFFERS + _PACKED_BUFFERS:
            buf = self._buffers.get(name)
            if buf is None:
                continue
            out = fn(buf)
            if out.dtype != buf.dtype:
                raise TypeError(
                    f"{type(self).__name__}.{name}: a dtype conversion (.to(dtype), .half(), .float(), "
                    f".bfloat16(), ...) would cast the {self.format.name} weight's {buf.dtype} buffer to "
                    f"{out.dtype}. Quantized buffers keep their formats' dtypes: move the module with "
                    f".to(device) only, and give the activations (bf16/fp16) and bias the dtype you want.")
            new[name] = out
        saved = {name: self._buffers.pop(name) for name in new}
        try:
            super()._apply(fn, recurse)
        except BaseException:
            self._buffers.update(saved)
            raise
        self._buffers.update(new)
        self._weight_cache = None
        if fresh:  # moved together with the weight: still its copy
            self._packed_stamp = self._stamp()
        return self

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # Module's loader copies with a silent dtype cast; a quantized buffer of another dtype
        # (another format, or bf16 weights) must not be cast.
        for name in _QUANT_BUFFERS:
            buf = self._buffers.get(name)
            src = state_dict.get(prefix + name)
            if buf is not None and isinstance(src, torch.Tensor) and src.dtype != buf.dtype:
                error_msgs.append(
                    f"{prefix}{name}: expected dtype {buf.dtype} ({self.format.name}, block {self.block}), got "
                    f"{src.dtype}; build the Linear with the checkpoint's format")
                state_dict = {k: v for k, v in state_dict.items() if k != prefix + name}
                if strict:
                    return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # --- forward -----------------------------------------------------------------------
    #: CUDA graphs of eager calls (nn/graphs.py ``enable_cuda_graphs``); None: off
    _graphs = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` bf16/fp16 ``[..., in_features]`` -> ``[..., out_features]`` of ``x``'s dtype."""
        if self._graphs is not None:
            return self._graphs(self._forward, x)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in _ACT_DTYPES:
            raise TypeError(f"x: expected bf16 or fp16 activations for {self.format.name} {self._kind()}, got "
                            f"{x.dtype} (cast with x.to(torch.bfloat16))")
        if not x.is_contiguous():
            x = x.contiguous()
        # (torch.compile would trace the planner inside prefer_packed: compiled forwards run the
        # canonical weight, whose planning happens inside the custom ops)
        packed = None if torch.compiler.is_compiling() else self.packed_weight
        if packed is not None and x.shape[-1] == self.in_features and x.numel():
            m = x.numel() // self.in_features
            if prefer_packed(self.format.name, m, self.out_features, self.in_features, _DTYPE_NAMES[x.dtype],
                             self.bias is not None, device_info(x.device), gluon_unavailable_reason() is None):
                return _packed_linear(x, packed, self.bias, out_dtype=x.dtype, rounding=self.rounding)
        return _linear(x, self.weight, self.bias, weight_only=self.weight_only, out_dtype=x.dtype)

    # --- the packed copy (MX weights on Hopper's FP8 tensor cores) -----------------------
    def prepack(self) -> str | None:
        """Keep an exact fp8_block copy of an mxfp4 W x A weight next to it
        (:func:`blockscaled.layouts.mxfp4_to_fp8_block`: e4m3 ``[N, K]`` + one fp32 scale per 128 x
        128 tile, non-persistent buffers ``packed_data`` / ``packed_scale``, not in the state dict);
        ``forward`` then runs the row counts for which the planner predicts the copy faster
        (``plan/mx_packed.py::prefer_packed``: MX activations x the copy on Hopper's FP8 tensor
        cores, measured 1.13-1.62x the canonical plan at M >= 2048) and the canonical weight
        elsewhere (decode). Costs 2x the mxfp4 weight bytes of memory. Host-synchronising (the
        exactness check): call it at load time.

        Returns None when the copy is kept, else why not (the module is unchanged): not mxfp4,
        weight-only, or a 128 x 128 tile whose block exponents span more than 14. Loading other
        weights into the buffers (``load_state_dict``, in-place copies, replaced buffers) or
        copying the module (``copy.deepcopy``) makes the copy stale: the next forward or move
        drops it with a warning; call ``prepack()`` again. In-place writes through a ``.data``
        alias are not detected. A forward compiled by torch.compile runs the canonical weight.

        Example::

            lin = Linear.from_linear(torch.nn.Linear(2880, 5760, dtype=torch.bfloat16, device="cuda"), "mxfp4")
            assert lin.prepack() is None
            y = lin(torch.randn(4096, 2880, dtype=torch.bfloat16, device="cuda"))   # the FP8 path
        """
        if self.format.name != "mxfp4":
            return f"the copy is for mxfp4 weights, this one is {self.format.name}"
        if self.weight_only:
            return "weight-only: the copy needs quantized activations (W x A)"
        try:
            w8 = mxfp4_to_fp8_block(self.weight)
        except ValueError as e:
            return str(e)
        self.packed_data, self.packed_scale = w8.data, w8.scale
        self._packed_stamp = self._stamp()
        return None

    def unpack(self) -> None:
        """Drop the packed copy (:meth:`prepack`)."""
        self.packed_data = self.packed_scale = None
        self._packed_stamp = self._packed_cache = None

    @property
    def packed_weight(self) -> ScaledTensor | None:
        """The fp8_block copy of :meth:`prepack` as a ScaledTensor, or None (none kept, or the
        weight's buffers changed since: then it is dropped, with a warning)."""
        if not self._packed_fresh():
            return None
        d, s, c = self.packed_data, self.packed_scale, self._packed_cache
        if c is None or c.data is not d or c.scale is not s:  # (as ``weight``: rebuilt after a move only)
            c = ScaledTensor(d, s, "fp8_block", (self.out_features, self.in_features), (128, 128), "rceil")
            self._packed_cache = c
        return c

    def _packed_fresh(self) -> bool:
        """Whether a packed copy is kept and still the weight's: else it is dropped (with a
        warning where there was one)."""
        if self._packed_stamp is None or self.packed_data is None:
            return False
        if self._stamp() != self._packed_stamp:
            warnings.warn(f"{type(self).__name__}: the weight changed (or the module was copied) after prepack(); "
                          f"its packed copy is dropped (call prepack() again)", stacklevel=4)
            self.unpack()
            return False
        return True

    def _stamp(self) -> tuple:
        """Identity, storage address and in-place version of the weight buffers (host-side; no
        sync): a replaced buffer, ``.data`` assignment, an in-place write through the buffer or a
        copy of the module (new tensors) changes it. Not seen: in-place writes through a
        ``.data`` alias (PyTorch does not count those)."""
        d, s = self.weight_data, self.weight_scale
        return (id(d), d.data_ptr(), d._version, id(s), s.data_ptr(), s._version)

    def _kind(self) -> str:
        return "weight-only (bf16/fp16 x)" if self.weight_only else "W x A"

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, format={self.format.name}, "
                f"block={self.block[0]}x{self.block[1]}, rounding={self.rounding.value}, "
                f"weight_only={self.weight_only}, bias={self.bias is not None}")

    # --- tensor parallelism ------------------------------------------------------------
    def shard(self, rank: int, world: int, dim: str) -> "Linear":
        """Shard ``rank`` of ``world`` equal tensor-parallel shards, as a new Linear (copies).

        Args:
            rank: 0 <= rank < world.
            world: number of shards (>= 1); must divide the split dimension.
            dim: ``"column"`` splits N (output features, Megatron ColumnParallel: each rank
                computes ``y[..., rank*N/world:(rank+1)*N/world]``; the bias is split too) or
                ``"row"`` splits K (RowParallel: rank r takes ``x[..., r*K/world:(r+1)*K/world]``
                and the ranks' outputs sum to the full output; the bias is kept on rank 0 only
                so that it is added once).

        Shard boundaries must fall on scale-block boundaries, so each shard keeps whole blocks
        and the scales need no requantization: column shards of 128x128 fp8_block weights need
        ``N / world`` a multiple of 128 (1 x k blocks: any N); row shards need ``K / world`` a
        multiple of the format's K block (128 fp8_block, 32 mxfp8/mxfp4, 16 nvfp4). Otherwise
        ``ValueError`` naming the dim, the shard size and the block. nvfp4 shards keep the full
        weight's global scale; in W x A mode a row shard quantizes its activation slice with its
        own activation global scale, so the sum of nvfp4 row shards is close to, not bitwise, the
        full layer's output.

        Example::

            full = Linear.from_linear(torch.nn.Linear(1024, 512, dtype=torch.bfloat16), "fp8_block")
            cols = [full.shard(r, 2, "column") for r in range(2)]   # out_features 256 each
            rows = [full.shard(r, 4, "row") for r in range(4)]      # in_features 256 each
        """
        world = check_size("world", world, 1)
        rank = check_size("rank", rank, 0)
        if rank >= world:
            raise ValueError(f"rank: expected 0 <= rank < world={world}, got {rank}")
        if dim not in _SHARD_DIMS:
            raise ValueError(f"dim: expected 'column' (split N) or 'row' (split K), got {dim!r}")
        w, f = self.weight, self.format
        n, k = self.out_features, self.in_features
        br, bk = self.block
        size, unit = (n, br) if dim == "column" else (k, bk)
        what = "N (out_features)" if dim == "column" else "K (in_features)"
        if size % world:
            raise ValueError(f"world: dim={dim!r} splits {what}={size}, which {world} shards do not divide")
        s = size // world
        if world > 1 and s % unit:
            raise ValueError(
                f"dim={dim!r}: shard size {s} ({what}={size} / world={world}) is not a multiple of the "
                f"{f.name} weight's {unit}-{'row' if dim == 'column' else 'column'} scale block (block "
                f"{br}x{bk}); shard boundaries must fall on block boundaries")
        lo, hi = rank * s, (rank + 1) * s
        if dim == "column":
            data = w.data[lo:hi].clone()
            scale = (w.scale[lo // br:(hi + br - 1) // br] if br > 1 else w.scale[lo:hi]).clone()
            shape = (s, k)
            bias = None if self.bias is None else self.bias.detach()[lo:hi].clone()
        else:
            per_byte = f.elems_per_byte
            data = w.data[:, lo // per_byte:hi // per_byte].contiguous()
            scale = w.scale[:, lo // bk:hi // bk].contiguous()
            shape = (n, s)
            bias = None if self.bias is None or rank else self.bias.detach().clone()
        gs = None if w.global_scale is None else w.global_scale.clone()
        q = ScaledTensor(data, scale, f, shape, self.block, self.rounding, global_scale=gs)
        if bias is not None and self.bias.requires_grad:
            bias.requires_grad_(True)
        return type(self).from_scaled(q, bias, weight_only=self.weight_only)
