"""The two contracts that let dispatch treat every backend and every algorithm alike.

**A backend** (one :class:`Backend` object per sub-package: ``cpu/backend.py``,
``sycl/backend.py``, ``cuda/backend.py``) knows where data lives and how to move it. Dispatch
resolves ``device=`` to a backend and a *handle* (None on the CPU, a ``dpctl.SyclQueue``, a CUDA
target), and from then on passes the handle back to the backend and to the kernels.

**An implementation** (one per operation, backend and algorithm; a module, or an object when one
module serves several names, as Winograd's two tile sizes do) exposes::

    supports(problem) -> str | None      # None, or why it cannot serve this problem (one sentence)
    run(problem, *arrays, device) -> out  # the operation's arrays, on the device; a new result
    workspace_bytes(problem) -> int       # temporary memory run() allocates beyond its inputs and result

For ``"conv2d"`` the arrays are ``x, w, bias`` (``bias`` may be None): C-contiguous arrays of
``problem.dtype`` already on the backend's device (numpy arrays on the CPU), and ``device`` is the
backend's handle. ``run`` returns a new ``(N, K, P, Q)`` array there, never writes to its inputs,
and may return before a device has finished (dispatch synchronises when it must). A problem whose
batch is empty never reaches an implementation.

:mod:`convlib.dispatch.registry` maps ``(operation, backend, algorithm)`` to implementations;
:mod:`convlib.dispatch.plan` is the one place that calls them.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

#: The context of an execution that changes nothing (:meth:`Backend.execution`); one object, so
#: a plan can tell that it may skip the ``with`` altogether.
RUN_AS_IS = contextlib.nullcontext()


class BackendUnavailable(ValueError):
    """A backend was asked for but its optional dependencies are not installed or found."""


class Implementation(Protocol):
    """What every registered implementation provides (see the module docstring)."""

    def supports(self, problem) -> str | None: ...

    def run(self, problem, *arrays_and_device) -> Any: ...

    def workspace_bytes(self, problem) -> int: ...


class Backend:
    """The interface every backend implements (see the module docstring)."""

    name = "?"

    #: The problem dtypes this backend computes (:mod:`convlib.core.precision`). Dispatch refuses
    #: the others with a ``TypeError`` naming the backends that compute them.
    dtypes: tuple[str, ...] = ("float32", "float64")

    def widened(self, implementation):
        """``implementation`` (written for float32 problems) made to serve problems of a
        widened dtype (float16, bfloat16): inputs widened to float32, the result rounded back.
        Only backends that list those dtypes in :attr:`dtypes` implement it."""
        raise NotImplementedError(f"the {self.name} backend computes {', '.join(self.dtypes)} only")

    def unavailable_reason(self) -> str | None:
        """None when usable here, else why not and how to install it."""
        raise NotImplementedError

    def device_names(self) -> list[str]:
        """Names of the devices this backend can run on here (empty when unavailable)."""
        raise NotImplementedError

    def owns(self, arr) -> bool:
        """Whether ``arr`` is an array living on this backend (cheap; imports nothing)."""
        raise NotImplementedError

    def resolve(self, spec, arrays) -> Any:
        """The device handle for ``spec`` (None = the one the ``arrays`` live on or the default).

        Raises ``ValueError`` when ``spec`` names no device or contradicts where ``arrays`` live.
        """
        raise NotImplementedError

    def identity(self, handle) -> str:
        """A stable description of the device behind ``handle``, the same in every process on
        the same machine and different for a different device (the tuning cache's key): no
        memory addresses, no queue numbers."""
        raise NotImplementedError

    def prepare(self, arr, dtype: str, handle):
        """``arr`` as a C-contiguous array of ``dtype`` on the device (a copy where needed)."""
        raise NotImplementedError

    def empty(self, shape, dtype: str, handle):
        """An uninitialised array on the device."""
        raise NotImplementedError

    def write(self, y, key, value, handle) -> None:
        """``y[key] = value`` for device arrays, ordered after the work already submitted to
        ``handle`` (a piece of a result computed in pieces); by default plain assignment."""
        y[key] = value

    def memory_available(self, handle, nbytes: int) -> int | None:
        """Bytes the device behind ``handle`` can still allocate, or None when unknown; asked
        before a result of ``nbytes`` is allocated (a backend may answer cheaply for small ones)."""
        raise NotImplementedError

    def synchronize(self, handle) -> None:
        """Return once all work submitted to ``handle`` has finished (timing needs it)."""
        raise NotImplementedError

    def execution(self, problem):
        """A context manager around each execution of ``problem`` by an implementation (the
        CPU backend runs small problems on one thread in it); by default :data:`RUN_AS_IS`."""
        return RUN_AS_IS

    def finish(self, y, like, handle):
        """The result in the kind of ``like`` (the user's first array): numpy in -> numpy out, ..."""
        raise NotImplementedError
