"""Which backend and device a call runs on: ``device=``, or where the data lives.

Backends live in their sub-packages (``cpu/backend.py``, ``sycl/backend.py``,
``cuda/backend.py``) and are imported only when a device string, a device object or an array of
theirs asks for them, so ``import convlib`` never needs numba-dpex or numba-cuda.

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

from ..core.contracts import Backend, BackendUnavailable
from ..core.precision import host_bfloat16
from ..sycl.environment import configure_environment_if_installed

# The OpenCL runtime's variables must be set before user code imports dpnp or dpctl, so they are
# set when convlib is imported (a file read and two os.environ writes; nothing without the extra).
configure_environment_if_installed()

#: Backend name -> "module:attribute" of its Backend instance (imported on demand).
BACKEND_LOCATIONS = {
    "cpu": "convlib.cpu.backend:BACKEND",
    "sycl": "convlib.sycl.backend:BACKEND",
    "cuda": "convlib.cuda.backend:BACKEND",
}


_MODULES: dict[str, tuple[Any, str]] = {}


def get_backend(name: str) -> Backend:
    """The :class:`~convlib.core.contracts.Backend` called ``name`` (``"cpu"``, ``"sycl"``, ``"cuda"``)."""
    # Every call of the API asks for the CPU backend at least once (its identity keys the plans):
    # the module is kept (import_module took ~1 us), the attribute read each time (tests replace it).
    found = _MODULES.get(name)
    if found is None:
        module, attr = BACKEND_LOCATIONS[name].split(":")
        found = _MODULES[name] = (importlib.import_module(module), attr)
    return getattr(*found)


#: What the messages call each operation's first array.
FIRST_ARRAY = {"conv2d": "x", "conv2d_backward_data": "dy", "conv2d_backward_weight": "x", "conv2d_backward_bias": "dy"}


def dtype_refusal(dtype: str, backend: str, operation: str = "conv2d") -> str:
    """Why ``backend`` refuses problems of ``dtype``, and which backends compute it."""
    accepting = []
    for name in BACKEND_LOCATIONS:
        try:
            if dtype in get_backend(name).dtypes:
                accepting.append(name)
        except ImportError:
            continue
    own = ", ".join(get_backend(backend).dtypes)
    where = ("cuda (pass device='cuda', or CuPy / PyTorch CUDA arrays)" if accepting == ["cuda"]
             else ", ".join(accepting) or "no backend")
    return (f"{FIRST_ARRAY[operation]} has dtype {dtype}, which the {backend} backend does not compute (it "
            f"computes {own}); {dtype} is computed on: {where}; or convert the arrays to float32")


def array_backend(arr) -> str | None:
    """Which backend an array lives on, judged from its type alone (no optional imports)."""
    if arr is None:
        return None
    if isinstance(arr, np.ndarray):
        return "cpu"
    mod = type(arr).__module__.split(".")[0]
    if mod in ("dpnp", "dpctl"):
        return "sycl"
    if hasattr(arr, "__cuda_array_interface__"):
        return "cuda"
    return "cpu"  # lists and other array-likes are converted by numpy


def is_torch_cpu_tensor(arr) -> bool:
    """Whether ``arr`` is a PyTorch tensor in host memory (judged without importing torch)."""
    return (type(arr).__module__.split(".")[0] == "torch" and hasattr(arr, "detach")
            and getattr(getattr(arr, "device", None), "type", None) == "cpu")


def host_array(name: str, arr):
    """``arr`` as a numpy array when it lives in host memory (lists, objects with ``__array__``,
    PyTorch CPU tensors, which become views without a copy); device arrays are left as they are.

    Raises ``TypeError`` naming ``name`` when ``arr`` cannot be read as an array.
    """
    if arr is None or isinstance(arr, np.ndarray):
        return arr
    # Before array_backend: asking a PyTorch CPU tensor for __cuda_array_interface__ raises
    # inside the property, which took longer than the rest of a small call's dispatch.
    if is_torch_cpu_tensor(arr):
        if str(arr.dtype) == "torch.bfloat16":  # numpy has none: ml_dtypes' over the same bits
            return _bfloat16_host(name, arr)
        return arr.detach().numpy()  # shares the tensor's memory; nothing is written to it
    if array_backend(arr) != "cpu":
        return arr
    try:
        return np.asarray(arr)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"{name} of type {type(arr).__name__} cannot be read as an array: {exc}") from None


def _bfloat16_host(name: str, tensor):
    import torch

    host_dtype = host_bfloat16()
    if host_dtype is None:
        raise TypeError(f"{name} is a bfloat16 PyTorch CPU tensor: bfloat16 is computed on CUDA only (pass CUDA "
                        f"tensors, {name}.cuda()), and reading it from host memory needs ml_dtypes (pip install "
                        "ml-dtypes)")
    return tensor.detach().view(torch.int16).numpy().view(host_dtype)


def result_kind(y, like):
    """The result in the kind of the user's ``like``, for host kinds the backend does not know:
    a numpy result for a PyTorch CPU tensor becomes a PyTorch tensor over the same memory."""
    if type(like) is np.ndarray:  # the common case, first: numpy in, numpy out
        return y
    if isinstance(y, np.ndarray) and is_torch_cpu_tensor(like):
        import torch

        if y.dtype.name == "bfloat16":
            return torch.from_numpy(y.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(y)
    return y


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
        """The backend's name."""
        return self.backend.name

    @property
    def identity(self) -> str:
        """The device's stable identity (:meth:`~convlib.core.contracts.Backend.identity`)."""
        return self.backend.identity(self.handle)


def resolve_device(device, *arrays) -> ResolvedDevice:
    """Pick the backend and device for one call on ``arrays`` (None entries ignored; see the
    module docstring)."""
    present = [a for a in arrays if a is not None]
    data_backends = {array_backend(a) for a in present}
    if len(data_backends) > 1:
        names = ("x", "w", "bias") if len(arrays) == 3 else tuple(f"array {i}" for i in range(len(arrays)))
        described = ", ".join(f"{n} is {type(a).__module__}.{type(a).__name__}"
                              for n, a in zip(names, arrays) if a is not None)
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
    return ResolvedDevice(backend, backend.resolve(None if device is None else device, present))


def devices() -> list[str]:
    """Every device this machine offers, as ``device=`` strings (``"cpu"`` first)."""
    out = []
    for name in BACKEND_LOCATIONS:
        try:
            backend = get_backend(name)
        except ImportError:
            continue
        if backend.unavailable_reason() is None:
            out.extend(backend.device_names())
    return out
