"""Backends: where a convolution runs, how data gets there and how the result comes back.

A backend is an object with the methods of :class:`Backend`. The CPU backend lives here; the
SYCL and CUDA ones live in their sub-packages and are imported only when a device string, a
device object or an array of theirs asks for them, so ``import convlib`` never needs numba-dpex
or numba-cuda.

How ``device=`` resolves (:func:`resolve_device`):

* ``None``: follow the data. numpy arrays (and array-likes) -> ``cpu``; dpnp / dpctl.tensor
  arrays -> their SYCL queue; anything with ``__cuda_array_interface__`` -> its CUDA device.
  Arrays of different backends, or on different SYCL queues / CUDA devices -> ``ValueError``.
* ``"cpu"``; ``"sycl"`` or a dpctl filter string (``"opencl:cpu"``, ``"level_zero:gpu:0"``) or a
  ``dpctl.SyclDevice`` / ``SyclQueue``; ``"cuda"`` / ``"cuda:N"``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import numpy as np


class BackendUnavailable(ValueError):
    """A backend was asked for but its optional dependencies are not installed or found."""


class Backend:
    """The interface every backend implements (see module docstring)."""

    name = "?"

    def unavailable_reason(self) -> str | None:
        """None when usable here, else why not and how to install it."""
        raise NotImplementedError

    def device_names(self) -> list[str]:
        """Names of the devices this backend can run on here (empty when unavailable)."""
        raise NotImplementedError

    def claims_spec(self, spec) -> bool:
        """Whether the ``device=`` value ``spec`` (not None) is meant for this backend."""
        raise NotImplementedError

    def owns(self, arr) -> bool:
        """Whether ``arr`` is an array living on this backend (cheap; imports nothing)."""
        raise NotImplementedError

    def resolve(self, spec, arrays) -> Any:
        """The device handle for ``spec`` (None = the one the ``arrays`` live on or the default).

        Raises ``ValueError`` when ``spec`` names no device or contradicts where ``arrays`` live.
        """
        raise NotImplementedError

    def prepare(self, arr, dtype: str, handle):
        """``arr`` as a C-contiguous array of ``dtype`` on the device (a copy where needed)."""
        raise NotImplementedError

    def empty(self, shape, dtype: str, handle):
        """An uninitialised array on the device."""
        raise NotImplementedError

    def finish(self, y, like, handle):
        """The result in the kind of ``like`` (the user's ``x``): numpy in -> numpy out, ..."""
        raise NotImplementedError


class CpuBackend(Backend):
    """numba kernels on the host; numpy arrays in and out."""

    name = "cpu"

    def unavailable_reason(self):
        return None

    def device_names(self):
        return ["cpu"]

    def claims_spec(self, spec):
        return isinstance(spec, str) and spec.strip().lower() == "cpu"

    def owns(self, arr):
        return isinstance(arr, np.ndarray)

    def resolve(self, spec, arrays):
        return None

    def prepare(self, arr, dtype, handle):
        # ascontiguousarray copies only when the layout or dtype differs; kernels never write
        # to their inputs, so read-only and shared views are safe to pass through.
        return np.ascontiguousarray(arr, dtype=dtype)

    def empty(self, shape, dtype, handle):
        return np.empty(shape, dtype=dtype)

    def finish(self, y, like, handle):
        return y


#: Backend name -> "module:attribute" of its Backend instance (imported on demand).
_BACKEND_LOCATIONS = {
    "cpu": "convlib.backends:CPU",
    "sycl": "convlib.sycl.backend:BACKEND",
    "cuda": "convlib.cuda.backend:BACKEND",
}

CPU = CpuBackend()


def _prepare_sycl_environment() -> None:
    """Set the OpenCL runtime's variables before user code imports dpnp/dpctl (see convlib.sycl.runtime).

    Costs a file read and two ``os.environ`` writes; does nothing without the ``sycl`` extra.
    """
    from .sycl.environment import configure_environment_if_installed

    configure_environment_if_installed()


_prepare_sycl_environment()


def get_backend(name: str) -> Backend:
    """The :class:`Backend` called ``name`` (``"cpu"``, ``"sycl"``, ``"cuda"``)."""
    module, attr = _BACKEND_LOCATIONS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def _array_backend(arr) -> str | None:
    """Which backend an array lives on, judged from its type alone (no optional imports)."""
    if arr is None or isinstance(arr, np.ndarray):
        return "cpu" if arr is not None else None
    mod = type(arr).__module__.split(".")[0]
    if mod in ("dpnp", "dpctl"):
        return "sycl"
    if hasattr(arr, "__cuda_array_interface__"):
        return "cuda"
    return "cpu"  # lists and other array-likes are converted by numpy


def _spec_backend(spec) -> str:
    if isinstance(spec, str):
        s = spec.strip().lower()
        if s == "cpu":
            return "cpu"
        if s == "cuda" or s.startswith("cuda:"):
            return "cuda"
        return "sycl"  # "sycl" and dpctl filter strings; the SYCL backend validates them
    mod = type(spec).__module__.split(".")[0]
    if mod == "dpctl":
        return "sycl"
    if mod.startswith("numba") and hasattr(spec, "compute_capability"):
        return "cuda"
    raise TypeError(
        f"device={spec!r} of type {type(spec).__name__}: allowed are None, 'cpu', 'sycl', a dpctl "
        "filter string such as 'opencl:cpu:0', a dpctl.SyclDevice or SyclQueue, 'cuda' or 'cuda:N'"
    )


@dataclass(frozen=True)
class ResolvedDevice:
    """A backend and its device handle, as chosen for one call."""

    backend: Backend
    handle: Any

    @property
    def name(self) -> str:
        return self.backend.name


def resolve_device(device, x, w, bias) -> ResolvedDevice:
    """Pick the backend and device for one call (see the module docstring)."""
    arrays = [a for a in (x, w, bias) if a is not None]
    data_backends = {_array_backend(a) for a in arrays}
    if len(data_backends) > 1:
        described = ", ".join(f"{n} is {type(a).__module__}.{type(a).__name__}" for n, a in zip(("x", "w", "bias"), (x, w, bias)) if a is not None)
        raise ValueError(f"x, w and bias live on different backends ({described}); put them on one device")
    data_backend = data_backends.pop() if data_backends else "cpu"
    name = data_backend if device is None else _spec_backend(device)
    try:
        backend = get_backend(name)
    except ImportError as exc:
        raise BackendUnavailable(f"device={device!r} needs the {name} backend, which cannot be imported: {exc}") from None
    reason = backend.unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(f"device={device!r} needs the {name} backend, which is unavailable: {reason}")
    if data_backend not in (name, "cpu"):
        raise ValueError(
            f"device={device!r} contradicts where the data lives ({data_backend} arrays); "
            f"pass device=None to compute where the data is, or move the data"
        )
    return ResolvedDevice(backend, backend.resolve(None if device is None else device, arrays))


def devices() -> list[str]:
    """Every device this machine offers, as ``device=`` strings (``"cpu"`` first)."""
    out = []
    for name in _BACKEND_LOCATIONS:
        try:
            backend = get_backend(name)
        except ImportError:
            continue
        if backend.unavailable_reason() is None:
            out.extend(backend.device_names())
    return out
