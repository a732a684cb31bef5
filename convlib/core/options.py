"""Library-wide options a user may change at run time: how much memory convlib may take, and
whether float32 may use TF32 tensor cores.

Options are policy, the same for every backend, documented in the README. The tuning values of
the kernels (block sizes, work-group sizes, engines) are not options: they are knobs, one table
per backend (:mod:`convlib.core.knobs`).

>>> import convlib
>>> convlib.options.workspace_cap = 64 * 2**20       # bytes
>>> with convlib.option_context(workspace_cap=16 * 2**20):
...     pass                                                # temporarily 16 MiB
>>> convlib.options.output_cache_bytes = 0                  # no reuse of dropped outputs

Assigning an attribute changes the option for the whole process. :func:`option_context` changes
it for the ``with`` block *in this thread* (a :mod:`contextvars` context, as ``numpy.errstate``
does): a call that passes ``allow_tf32=True`` cannot make another thread's call, running at the
same moment, TF32. A new thread starts from the process-wide values; Dask graphs take the values
in force where they are built (:mod:`convlib.dask`).
"""

from __future__ import annotations

import contextvars
import os
from contextlib import contextmanager
from dataclasses import dataclass, fields

#: Default of ``Options.workspace_cap``: the temporary memory one call may take, in bytes.
WORKSPACE_CAP = 256 * 2**20
#: Default of ``Options.output_cache_bytes``.
OUTPUT_CACHE_BYTES = 512 * 2**20


def _env_mib(name: str, default_mib: int, *, allow_zero: bool = False) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default_mib * 2**20
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} must be a number of MiB") from None
    if value < 0 or (value == 0 and not allow_zero):
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"environment variable {name}={raw!r} must be a {kind} number of MiB")
    return int(value * 2**20)


@dataclass
class Options:
    """Run-time options.

    Attributes
    ----------
    workspace_cap : int
        Upper bound, in bytes, on the temporary memory one call allocates beyond its inputs and
        its result. im2col cuts the batch into chunks whose column matrices fit; any algorithm
        whose workspace for the whole problem would not fit runs in pieces -- groups of images,
        then bands of output rows of one image -- each computed on its own and copied into the
        result (:mod:`convlib.dispatch.pieces`; a piece's input band and result count against
        the cap). A piece is at least one output row of one image, so what an algorithm needs
        whatever the image (e.g. Winograd's transformed filters) is not cut. Default 256 MiB, or
        the environment variable ``CONVLIB_WORKSPACE_MB`` (MiB) when set at import.
    output_cache_bytes : int
        Bytes of dropped CPU outputs (of at least 32 MiB each) kept for reuse by later calls of
        the same size, which then skip the page faults of fresh memory
        (:mod:`convlib.core.output_cache`); 0 turns the reuse off. Default 512 MiB, or
        ``CONVLIB_OUTPUT_CACHE_MB`` (MiB) when set at import.
    allow_tf32 : bool
        Whether float32 GEMMs on NVIDIA GPUs may run on tensor cores in TF32 (inputs rounded to
        10 mantissa bits, FP32 accumulation): about 3e-4 relative error instead of ~1e-6, like
        cuDNN's and PyTorch's ``allow_tf32``. A permission, not a request: it applies where a TF32
        path exists (on CUDA: ``blis``'s tensor-core kernel, the cuBLAS GEMMs of ``im2col`` and
        ``winograd2``) and everything else
        stays exact. Default False: exact FP32, which ``auto`` also keeps; when it is True,
        ``auto`` on CUDA runs float32 3x3 stride-1 layers on those TF32 paths instead of the exact
        Winograd F(4x4). The ``allow_tf32`` keyword of :func:`convlib.conv2d` sets it for one call.
    """

    workspace_cap: int = WORKSPACE_CAP
    output_cache_bytes: int = OUTPUT_CACHE_BYTES
    allow_tf32: bool = False

    def __setattr__(self, name, value):
        _check(name, value)
        object.__setattr__(self, name, value)

    def __getattribute__(self, name):
        overrides = _OVERRIDES.get()
        if overrides and name in overrides:
            return overrides[name]
        return object.__getattribute__(self, name)


#: The values :func:`option_context` sets, per thread (and per asyncio task): read before the
#: process-wide attributes. Never mutated: each context sets a new dict.
_OVERRIDES: contextvars.ContextVar[dict] = contextvars.ContextVar("convlib_option_overrides", default={})


def _check(name, value):
    if name == "workspace_cap" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"workspace_cap={value!r} must be a positive int (bytes)")
    if name == "output_cache_bytes" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"output_cache_bytes={value!r} must be a non-negative int (bytes)")
    if name == "allow_tf32" and not isinstance(value, bool):
        raise TypeError(f"allow_tf32={value!r} must be True or False")


options = Options(
    workspace_cap=_env_mib("CONVLIB_WORKSPACE_MB", WORKSPACE_CAP // 2**20),
    output_cache_bytes=_env_mib("CONVLIB_OUTPUT_CACHE_MB", OUTPUT_CACHE_BYTES // 2**20, allow_zero=True),
)


@contextmanager
def option_context(**changes):
    """Set options for the duration of a ``with`` block in this thread, then restore them.

    The values are checked as assignments are; other threads keep seeing theirs (see the module
    docstring)."""
    known = {f.name for f in fields(Options)}
    unknown = set(changes) - known
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)}; known options are {sorted(known)}")
    for name, value in changes.items():
        _check(name, value)
    token = _OVERRIDES.set({**_OVERRIDES.get(), **changes})
    try:
        yield options
    finally:
        _OVERRIDES.reset(token)
