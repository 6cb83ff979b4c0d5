"""Triton-version differences of the Gluon API used by the sm_90a kernels, in one place.

The Hopper kernels (``wide.py``, ``skinny.py``, ``_common.py``) call the names exported here
instead of the Gluon spellings that changed between triton releases. Each name is found by
attribute presence (the newest spelling first), so a release that keeps the old spelling as an
alias works too. Every alias is the very builtin Gluon provides (``x is gl.barrier`` or
``x is gl.thread_barrier``): the kernels emit the same IR, hence the same PTX, on each release.

Verified releases (tests/test_aot_hopper.py compiled for sm_90a on each): 3.6.0, 3.7.1, 3.8.0,
3.9.0. The renames (read from each release's ``triton/experimental/gluon`` sources):

============================  ===============================  ==============================
exported name                 triton 3.6 (and 3.7 where noted)  newer spelling
============================  ===============================  ==============================
``cta_barrier()``             ``gl.thread_barrier()`` (3.6)     ``gl.barrier()`` (3.7+; with the
                                                                default ``cluster=False`` and one
                                                                CTA it emits the same barrier op,
                                                                ``_semantic.debug_barrier()``)
``tma_load(...)``             ``tma.async_copy_global_to_``     ``tma.async_load`` (3.8+; the old
                              ``shared`` (3.6, 3.7)             name is an alias in 3.8 and
                                                                raises in 3.9)
``tma_store(...)``            ``tma.async_copy_shared_to_``     ``tma.async_store`` (3.8+; same)
                              ``global`` (3.6, 3.7)
``cp_async_load(...)``        ``async_copy.async_copy_global``  ``async_copy.async_load`` (3.8+;
                              ``_to_shared`` (3.6, 3.7)         same)
============================  ===============================  ==============================

Unchanged in meaning although their signatures grew (nothing to alias; the kernels pass the
arguments all releases take, positionally where a keyword was renamed):
``mbarrier.expect(bar, nbytes)`` (keyword ``bytes`` became ``bytes_per_cta`` in 3.7),
``tma.store_wait(n)`` (3.8 added ``read_only=True``, the 3.6 behaviour:
``cp.async.bulk.wait_group.read``), ``gl.warp_specialize(..., worker_num_regs)`` (optional
from 3.7), ``mbarrier.arrive`` / ``expect`` (3.9 added ``from_cta``), TMA loads (3.7 added
``multicast=False``, 3.9 ``cache_policy=None``).

If a spelling cannot be found (a future release renames again), importing this module raises
:class:`GluonCompatError` naming the missing API and the triton version; ``ops._hopper`` turns
that into one warning and the portable Triton kernels (``ops._hopper.gluon_unavailable_reason``).
"""

from __future__ import annotations

import re

import triton

__all__ = [
    "GluonCompatError",
    "TRITON_VERSION",
    "API",
    "cp_async_load",
    "cta_barrier",
    "parse_version",
    "resolve",
    "tma_load",
    "tma_store",
]


class GluonCompatError(ImportError):
    """A Gluon API the sm_90a kernels need has no known spelling in the installed triton."""


def parse_version(text: str) -> tuple[int, int, int]:
    """``"3.8.0"`` -> ``(3, 8, 0)``; local / pre-release / dev suffixes are dropped
    (``"3.9.0+git1a2b3c"`` -> ``(3, 9, 0)``, ``"3.10.0rc1"`` -> ``(3, 10, 0)``, ``"3.7"`` ->
    ``(3, 7, 0)``). Raises ValueError naming the text when it does not start with a number."""
    m = re.match(r"\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(text))
    if m is None:
        raise ValueError(f"triton version: expected 'MAJOR.MINOR[.PATCH]...', got {text!r}")
    return tuple(int(g) if g is not None else 0 for g in m.groups())


#: The installed triton's version as (major, minor, patch) (for messages; the aliases below are
#: chosen by attribute presence, not by this number).
TRITON_VERSION = parse_version(triton.__version__)


def resolve(module, names: tuple[str, ...], what: str):
    """The first of ``names`` that ``module`` has (newest spelling first). Raises
    :class:`GluonCompatError` naming ``what``, the spellings tried and the triton version."""
    for name in names:
        fn = getattr(module, name, None)
        if fn is not None:
            return fn
    raise GluonCompatError(
        f"triton {triton.__version__}: no Gluon spelling of {what} (tried {module.__name__}."
        f"{' / '.join(names)}); the sm_90a Gluon kernels support triton 3.6-3.9")


def _load():
    try:
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.ampere import async_copy
        from triton.experimental.gluon.language.nvidia.hopper import tma
    except ImportError as e:  # triton without Gluon (or without its NVIDIA modules)
        raise GluonCompatError(f"triton {triton.__version__}: Gluon is not importable ({e})") from e
    return {
        # CTA-wide barrier (bar.sync; inside a warp_specialize partition the partition's named
        # barrier: the compiler lowers the same op there on every release).
        "cta_barrier": resolve(gl, ("barrier", "thread_barrier"), "the CTA barrier"),
        "tma_load": resolve(tma, ("async_load", "async_copy_global_to_shared"), "the TMA load"),
        "tma_store": resolve(tma, ("async_store", "async_copy_shared_to_global"), "the TMA store"),
        "cp_async_load": resolve(async_copy, ("async_load", "async_copy_global_to_shared"), "the cp.async load"),
    }


#: exported name -> the Gluon builtin it is on this triton (tests/test_compat.py checks them)
API = _load()
cta_barrier = API["cta_barrier"]
tma_load = API["tma_load"]
tma_store = API["tma_store"]
cp_async_load = API["cp_async_load"]
