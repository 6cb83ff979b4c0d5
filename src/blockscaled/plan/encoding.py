"""One canonical, lossless encoding of a plan (and of its kernel config) as a list of ints.

The custom ops (``ops/_custom_ops.py``, ``ops/grouped.py``) take the plan as one ``list[int]``
argument (:func:`encode_plan`: op, backend, then the config): torch.library schemas carry ints, not dataclasses, and a config that crosses the
boundary field by field loses the fields nobody remembered to pass (the grouped tail split was
lost that way). Here every field of the dataclass travels, in declaration order, so adding a
field to :class:`GemmConfig` or :class:`HopperConfig` extends the encoding by itself (a field of
a type this module cannot encode raises when this module is imported, and tests/test_plan_encoding.py
round-trips every plan the planner returns).

Layout: ``[tag, field_0, field_1, ...]``; tag 1 = GemmConfig, 2 = HopperConfig. Fields: ``int``
as is; ``bool`` as 0 / 1; ``bool | None`` as 0 / 1 / -1 (None); ``str`` as the index of the
value in the field's table of allowed values (``_CHOICES``). Decoding rebuilds the dataclass,
whose ``__post_init__`` validates it again.

Example::

    >>> from blockscaled.plan.encoding import decode_config, encode_config
    >>> from blockscaled.config.hopper import HopperConfig
    >>> c = HopperConfig("wide", 128, 256, 8, 4, epilogue="masked", tail_split=2)
    >>> decode_config(encode_config(c)) == c
    True
"""

from __future__ import annotations

import dataclasses
import json

from ..config.gemm import STRATEGIES, GemmConfig
from ..config.hopper import EPILOGUES, SPLIT_REDUCE, VARIANTS, HopperConfig
from .types import BACKENDS, OPS, Plan

__all__ = ["encode_config", "decode_config", "encode_plan", "decode_plan", "CONFIG_TAGS", "config_key",
           "config_from_key"]

#: tag (the first int of an encoding) of each config type; never renumber: a tag names a type
CONFIG_TAGS = {GemmConfig: 1, HopperConfig: 2}
_TYPE_OF_TAG = {tag: cls for cls, tag in CONFIG_TAGS.items()}
#: the allowed values of each str field, indexed by the encoding (an encoding lives within one
#: process: it is never stored)
_CHOICES = {
    (GemmConfig, "strategy"): STRATEGIES,
    (HopperConfig, "variant"): VARIANTS,
    (HopperConfig, "epilogue"): EPILOGUES,
    (HopperConfig, "split_reduce"): SPLIT_REDUCE,
}
_NONE = -1  # a None of a ``bool | None`` field


def _fields(cls) -> tuple[tuple[str, str], ...]:
    """(name, kind) per dataclass field, in declaration order; kind one of int / bool /
    optbool / str. Annotations are strings here (``from __future__ import annotations``)."""
    kinds = {"int": "int", "bool": "bool", "bool | None": "optbool", "str": "str"}
    out = []
    for f in dataclasses.fields(cls):
        kind = kinds.get(f.type if isinstance(f.type, str) else getattr(f.type, "__name__", repr(f.type)))
        if kind is None:
            raise TypeError(f"{cls.__name__}.{f.name}: no encoding for a field annotated {f.type!r} "
                            f"(plan/encoding.py encodes int, bool, bool | None and str fields)")
        if kind == "str" and (cls, f.name) not in _CHOICES:
            raise TypeError(f"{cls.__name__}.{f.name}: a str field needs its table of values in "
                            f"plan/encoding.py's _CHOICES")
        out.append((f.name, kind))
    return tuple(out)


#: (name, kind) per field of each config type, computed at import: torch.compile traces
#: encode_config, and dynamo cannot trace ``dataclasses.fields`` of a class
_FIELDS = {cls: _fields(cls) for cls in CONFIG_TAGS}


def encode_config(cfg: GemmConfig | HopperConfig) -> list[int]:
    """``cfg`` as ``[tag, field_0, ...]`` (module docstring); ``decode_config`` inverts it exactly.

    Raises TypeError for another type or a field value of the wrong type, ValueError for a
    str value outside its table."""
    cls = type(cfg)
    tag = CONFIG_TAGS.get(cls)
    if tag is None:
        raise TypeError(f"cfg: expected a GemmConfig or a HopperConfig, got {cls.__name__}")
    code = [tag]
    for name, kind in _FIELDS[cls]:
        v = getattr(cfg, name)
        if kind == "str":
            table = _CHOICES[(cls, name)]
            if v not in table:
                raise ValueError(f"cfg.{name}: expected one of {table}, got {v!r}")
            code.append(table.index(v))
        elif kind == "optbool" and v is None:
            code.append(_NONE)
        elif kind in ("bool", "optbool"):
            if not isinstance(v, bool):
                raise TypeError(f"cfg.{name}: expected a bool, got {type(v).__name__} {v!r}")
            code.append(int(v))
        else:
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"cfg.{name}: expected an int, got {type(v).__name__} {v!r}")
            code.append(v)
    return code


def decode_config(code) -> GemmConfig | HopperConfig:
    """The config that :func:`encode_config` turned into ``code`` (a list or tuple of ints).
    Raises ValueError naming what is wrong with a malformed code."""
    if not isinstance(code, (list, tuple)) or not code:
        raise ValueError(f"code: expected a non-empty list of ints from encode_config, got {code!r}")
    cls = _TYPE_OF_TAG.get(code[0])
    if cls is None:
        raise ValueError(f"code[0]: expected a config tag in {sorted(_TYPE_OF_TAG)}, got {code[0]!r}")
    fields = _FIELDS[cls]
    if len(code) != 1 + len(fields):
        raise ValueError(f"code: a {cls.__name__} takes {1 + len(fields)} ints (tag + {len(fields)} fields), "
                         f"got {len(code)}")
    kw = {}
    for (name, kind), v in zip(fields, code[1:]):
        if kind == "str":
            table = _CHOICES[(cls, name)]
            if not 0 <= v < len(table):
                raise ValueError(f"code: {cls.__name__}.{name} index must lie in [0, {len(table)}), got {v}")
            kw[name] = table[v]
        elif kind in ("bool", "optbool"):
            if v not in ((0, 1, _NONE) if kind == "optbool" else (0, 1)):
                raise ValueError(f"code: {cls.__name__}.{name} must be 0 / 1{' / -1' if kind == 'optbool' else ''}, "
                                 f"got {v}")
            kw[name] = None if v == _NONE else bool(v)
        else:
            kw[name] = int(v)
    return cls(**kw)


def encode_plan(plan: Plan) -> list[int]:
    """``plan`` as ``[op, backend, *encode_config(plan.config)]`` (``[op, backend, 0]`` without a
    config); :func:`decode_plan` inverts it: ``decode_plan(encode_plan(p)) == p`` (equality covers
    op, backend and config: what runs; the problem and the reasons are not carried)."""
    head = [OPS.index(plan.op), BACKENDS.index(plan.backend)]
    return head + ([0] if plan.config is None else encode_config(plan.config))


def decode_plan(code) -> Plan:
    """The plan :func:`encode_plan` turned into ``code``. Raises ValueError for a malformed code."""
    if not isinstance(code, (list, tuple)) or len(code) < 3:
        raise ValueError(f"code: expected a list of ints from encode_plan, got {code!r}")
    if not (0 <= code[0] < len(OPS) and 0 <= code[1] < len(BACKENDS)):
        raise ValueError(f"code: op / backend index out of range, got {list(code[:2])}")
    cfg = None if list(code[2:]) == [0] else decode_config(list(code[2:]))
    return Plan(OPS[code[0]], BACKENDS[code[1]], cfg)


def config_key(cfg: GemmConfig | HopperConfig) -> str:
    """``cfg`` as a JSON string naming every field (``config_from_key`` inverts it): the encoding
    that is stored (the plan sweeps' records, the tuned plans of plan/tuned.py). Unlike
    :func:`encode_config`'s ints it stays readable when fields are added: a stored key without a
    newer field decodes with that field's default."""
    if type(cfg) not in CONFIG_TAGS:
        raise TypeError(f"cfg: expected a GemmConfig or a HopperConfig, got {type(cfg).__name__}")
    kind = "hopper" if isinstance(cfg, HopperConfig) else "gemm"
    return json.dumps({"type": kind, **dataclasses.asdict(cfg)}, sort_keys=True)


def config_from_key(key: str) -> GemmConfig | HopperConfig:
    """The config :func:`config_key` wrote (fields it lacks take their defaults)."""
    d = json.loads(key)
    kind = d.pop("type")
    return HopperConfig(**d) if kind == "hopper" else GemmConfig(**d)
