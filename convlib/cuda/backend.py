"""The CUDA backend: which GPU, which stream, where the arrays live and how the result comes back.

Device resolution (``device=``):

* ``None`` with CUDA arrays (anything exporting ``__cuda_array_interface__``: CuPy, numba device
  arrays, PyTorch CUDA tensors): the GPU they live on (PyTorch's ``.device.index``, CuPy's
  ``.device.id``, else the current numba device).
* ``"cuda"``: the GPU of the CUDA arrays if any, else device 0. ``"cuda:N"``: device N. A numba
  device object (``numba.cuda.gpus[N]``) works too.

Streams: the kernels run on the stream the input ``x`` was exported on (the CUDA array
interface's ``stream`` entry, i.e. PyTorch's or CuPy's current stream), so results are ordered
with the caller's own work without a host synchronisation. numpy inputs use numba's default stream.

Results follow the input: numpy in -> numpy out (copied back). A CUDA array in -> a CUDA array of
the same library out, with no host copy: the output (and every workspace) is allocated by that
library's allocator (PyTorch's caching allocator, CuPy's memory pool), viewed by numba for the
kernels, and the library's own array is returned. numba device arrays (and other exporters) get a
numba device array back.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import threading
from dataclasses import dataclass, field

import numpy as np

from ..core.contracts import Backend
from ..core.precision import DTYPES, bfloat16_bits, dtype_name
from .launch import cuda, simulator_enabled


INSTALL_HINT = "install it with: pip install 'convlib[cuda]' (numba-cuda; it needs numba >= 0.60)"


def _numba_cuda_installed() -> bool:
    return importlib.util.find_spec("numba_cuda") is not None


def _unavailable_reason() -> str | None:
    if not _numba_cuda_installed():
        return f"numba-cuda is not installed; {INSTALL_HINT}"
    return _driver_reason()


def _driver_reason() -> str | None:
    """Why numba-cuda finds no usable GPU (asked once per process: it initialises the driver)."""
    with _DRIVER_LOCK:
        return _first_driver_reason()


@functools.cache
def _first_driver_reason() -> str | None:
    if cuda is None:
        return f"numba.cuda failed to import; {INSTALL_HINT}"
    if simulator_active():
        return None
    try:
        if not cuda.is_available():
            return "numba-cuda finds no CUDA GPU or driver here (numba.cuda.detect() says why)"
    except Exception as exc:  # noqa: BLE001
        return f"the CUDA driver could not be initialised ({type(exc).__name__}: {exc})"
    return None


#: numba-cuda's driver and device-list initialisation is not thread-safe: two threads entering it
#: at once (a Dask worker with two threads, each running its first CUDA block) fail with
#: ``AssertionError: key already in dictionary: 0`` (seen on the H100 machine). Both go through
#: this lock the first time.
_DRIVER_LOCK = threading.RLock()
_gpu_list_ready = False


def gpus():
    """numba-cuda's list of GPUs, enumerated the first time under :data:`_DRIVER_LOCK`."""
    global _gpu_list_ready
    if not _gpu_list_ready:
        with _DRIVER_LOCK:
            len(cuda.gpus)
            _gpu_list_ready = True
    return cuda.gpus


@functools.cache
def simulator_active() -> bool:
    """Whether numba-cuda runs its CPU simulator (``NUMBA_ENABLE_CUDASIM=1``)."""
    return simulator_enabled()


def is_cuda_array(arr) -> bool:
    """Whether ``arr`` is a CUDA array (or, under the simulator, one of its fake device arrays)."""
    if isinstance(arr, np.ndarray):
        return False
    # PyTorch builds its interface dict anew on every access: ask the tensor instead.
    if type(arr).__module__.split(".")[0] == "torch" and hasattr(arr, "is_cuda"):
        return bool(arr.is_cuda)
    if hasattr(arr, "__cuda_array_interface__"):
        return True
    return type(arr).__name__ == "FakeCUDAArray" and type(arr).__module__.startswith("numba")


def _library(arr) -> str:
    """``"torch"``, ``"cupy"`` or ``"numba"``: which library allocates arrays like ``arr``."""
    mod = type(arr).__module__.split(".")[0]
    return mod if mod in ("torch", "cupy") else "numba"


def _array_device(arr) -> int | None:
    """The GPU ordinal ``arr`` lives on, read from its own library where it says so."""
    lib = _library(arr)
    if lib == "torch":
        return arr.device.index
    if lib == "cupy":
        return arr.device.id
    gpu_data = getattr(arr, "gpu_data", None)
    context = getattr(gpu_data, "context", None)
    if context is not None:
        return context.device.id
    return None


def _exported_stream(arr):
    """The ``stream`` entry of ``arr``'s CUDA array interface (None when absent)."""
    cai = getattr(arr, "__cuda_array_interface__", None)
    return None if cai is None else cai.get("stream")


@dataclass
class CudaTarget:
    """The resolved device handle passed to every CUDA algorithm.

    Attributes
    ----------
    ordinal : int
        The GPU's numba device id.
    stream_ptr : int or None
        The exported stream of ``x`` (1: legacy default, 2: per-thread default, else a handle);
        None: numba's default stream.
    library : str
        Who allocates outputs and workspaces: ``"torch"``, ``"cupy"`` or ``"numba"``.
    simulator : bool
        numba-cuda's CPU simulator is running the kernels.
    """

    ordinal: int
    stream_ptr: int | None
    library: str
    simulator: bool
    _stream: object = field(default=None, repr=False)

    # -- device and stream -------------------------------------------------------------------
    def activate(self):
        """A context manager that makes this GPU numba's current device."""
        if self.simulator or (self.ordinal == 0 and len(gpus()) == 1):
            return contextlib.nullcontext()
        return gpus()[self.ordinal]

    @property
    def stream(self):
        """The numba stream every launch of this call goes to."""
        if self._stream is None:
            self._stream = _numba_stream(self.stream_ptr, self.simulator)
        return self._stream

    @property
    def stream_handle(self) -> int:
        """The raw stream handle (0 for the legacy default stream), for CuPy."""
        if self.stream_ptr in (None, 1):
            return 0
        handle = self.stream.handle
        return int(getattr(handle, "value", handle) or 0)

    @property
    def multiprocessors(self) -> int:
        return _multiprocessors(self.ordinal, self.simulator)

    # -- memory ------------------------------------------------------------------------------
    def empty(self, shape, dtype):
        """An uninitialised C-contiguous device array, from the input's own allocator.

        Returns a numba device array; when PyTorch or CuPy allocated it, their array is kept as
        ``convlib_owner`` so that :meth:`CudaBackend.finish` can hand it back unchanged. A
        ``"bfloat16"`` array is seen by numba as its ``uint16`` bits.
        """
        shape = tuple(int(s) for s in shape)
        dtype = dtype_name(dtype)
        if self.library == "torch":
            import torch

            owner = torch.empty(shape, dtype=getattr(torch, dtype), device=f"cuda:{self.ordinal}")
            view = cuda.as_cuda_array(owner.view(torch.uint16) if dtype == "bfloat16" else owner, sync=False)
            view.convlib_owner = owner
            return view
        if dtype == "bfloat16":  # CuPy has no bfloat16: numba holds the bits
            return cuda.device_array(shape, dtype=np.uint16, stream=self.stream)
        if self.library == "cupy":
            import cupy

            with cupy.cuda.Device(self.ordinal):
                owner = cupy.empty(shape, dtype=dtype)
        else:
            return cuda.device_array(shape, dtype=dtype, stream=self.stream)
        view = cuda.as_cuda_array(owner, sync=False)
        view.convlib_owner = owner
        return view


@functools.cache
def device_identity(ordinal: int, simulator: bool) -> str:
    """``cuda|<index>|<name>|cc<major>.<minor>`` of a GPU (the tuning cache's key)."""
    if simulator:
        return "cuda|simulator"
    with gpus()[ordinal]:
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        major, minor = dev.compute_capability
    return f"cuda|{ordinal}|{name}|cc{major}.{minor}"


@functools.cache
def _total_memory(ordinal: int) -> int:
    with gpus()[ordinal]:
        return int(cuda.current_context().get_memory_info()[1])


@functools.cache
def _multiprocessors(ordinal: int, simulator: bool) -> int:
    if simulator:
        return 1
    with gpus()[ordinal]:
        return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)


_STREAMS: dict = {}


def _numba_stream(ptr, simulator: bool):
    if simulator or ptr is None:
        return cuda.default_stream()
    if ptr == 1:
        return cuda.legacy_default_stream()
    if ptr == 2:
        return cuda.per_thread_default_stream()
    stream = _STREAMS.get(ptr)
    if stream is None:
        stream = _STREAMS[ptr] = cuda.external_stream(ptr)
    return stream


_COPY_KERNELS: dict = {}


def _contiguous_copy(arr, target: CudaTarget):
    """A C-contiguous device copy of the strided device array ``arr`` (a small kernel)."""
    from .tables import launch_knob

    ndim = arr.ndim
    kernel = _COPY_KERNELS.get(ndim)
    if kernel is None:
        kernel = _COPY_KERNELS[ndim] = _make_copy_kernel(ndim)
    out = target.empty(arr.shape, arr.dtype)
    flat = out.reshape(out.size)
    threads = launch_knob("elementwise_threads", target.simulator)
    if out.size:
        kernel[-(-out.size // threads), threads, target.stream](arr, flat)
    return out


def _make_copy_kernel(ndim: int):
    if ndim == 1:
        def copy1(src, dst):  # IN (n,) strided, OUT (n,)
            i = cuda.grid(1)
            if i < dst.size:
                dst[i] = src[i]
        return cuda.jit(copy1)

    def copy4(src, dst):  # IN (a, b, c, d) strided, OUT (a*b*c*d,)
        i = cuda.grid(1)
        if i < dst.size:
            d = i % src.shape[3]
            rest = i // src.shape[3]
            c = rest % src.shape[2]
            rest //= src.shape[2]
            b = rest % src.shape[1]
            a = rest // src.shape[1]
            dst[i] = src[a, b, c, d]
    return cuda.jit(copy4)


class CudaBackend(Backend):
    """numba-cuda kernels on an NVIDIA GPU (or numba-cuda's simulator)."""

    name = "cuda"
    dtypes = DTYPES

    def widened(self, implementation):
        """``implementation`` itself where it computes float16 / bfloat16 with kernels of its own
        (``SERVES_HALF_PRECISIONS``), else its :class:`convlib.cuda.half.Widened` wrapper."""
        if getattr(implementation, "SERVES_HALF_PRECISIONS", False):
            return implementation
        from .half import widened

        return widened(implementation)

    def unavailable_reason(self):
        return _unavailable_reason()

    def device_names(self):
        if _unavailable_reason() is not None:
            return []
        return [f"cuda:{i}" for i in range(len(gpus()))]

    def owns(self, arr):
        return is_cuda_array(arr)

    def resolve(self, spec, arrays):
        simulator = simulator_active()
        on_gpu = [a for a in arrays if is_cuda_array(a)]
        data_devices = {d for d in (_array_device(a) for a in on_gpu) if d is not None}
        if len(data_devices) > 1:
            raise ValueError(f"x, w and bias live on different GPUs {sorted(data_devices)}; put them on one device")
        data_device = data_devices.pop() if data_devices else None
        count = len(gpus())
        if spec is None or (isinstance(spec, str) and spec.strip().lower() == "cuda"):
            ordinal = data_device if data_device is not None else (0 if not on_gpu else _current_device(simulator))
        elif isinstance(spec, str):
            text = spec.strip().lower()[len("cuda:"):]
            if not text.isdigit():
                raise ValueError(f"device={spec!r}: write 'cuda' or 'cuda:N' with N a GPU number (0..{count - 1})")
            ordinal = int(text)
        else:
            ordinal = int(spec.id)
        if not 0 <= ordinal < count:
            raise ValueError(f"device={spec!r}: this machine has {count} CUDA device(s): {', '.join(self.device_names())}")
        if data_device is not None and data_device != ordinal:
            raise ValueError(
                f"device={spec!r} contradicts where the data lives (cuda:{data_device}); "
                "pass device=None to compute where the data is, or move the data"
            )
        x = arrays[0] if arrays else None
        cuda_x = x is not None and is_cuda_array(x)
        return CudaTarget(
            ordinal=ordinal,
            stream_ptr=_exported_stream(x) if cuda_x else None,
            library=_library(x) if cuda_x else "numba",
            simulator=simulator,
        )

    def identity(self, handle):
        return device_identity(handle.ordinal, handle.simulator)

    def prepare(self, arr, dtype, handle):
        with handle.activate():
            if not is_cuda_array(arr):
                return cuda.to_device(_host_contiguous(arr, dtype), stream=handle.stream)
            if type(arr).__name__ == "FakeCUDAArray":
                dev = arr
            else:
                if dtype == "bfloat16" and _library(arr) == "torch":
                    import torch

                    arr = arr.view(torch.uint16)  # numba sees bfloat16 as its bits
                # Our launches go to x's stream; an array exported on another stream must be
                # complete before they start. (One read of the interface: PyTorch rebuilds it.)
                cai = arr.__cuda_array_interface__
                sync = cai.get("stream") not in (None, handle.stream_ptr)
                dev = cuda.from_cuda_array_interface(cai, owner=arr, sync=sync)
            if not dev.is_c_contiguous():
                dev = _contiguous_copy(dev, handle)
            return dev

    def empty(self, shape, dtype, handle):
        with handle.activate():
            return handle.empty(shape, dtype)

    def write(self, y, key, value, handle):
        # numba's y[key] = value runs on the context's default stream and synchronises the host
        # unless y has a stream of its own (arrays over PyTorch or CuPy memory have none): on
        # the call's stream it is ordered after the piece that computed value, without waiting.
        # A piece of whole images is a contiguous block of y: one asynchronous memcpy at copy
        # bandwidth, where numba's assignment kernel took several times longer.
        with handle.activate():
            if handle.simulator:  # its arrays have no setitem, and one stream
                y[key] = value
                return
            block = y[key]
            if block.is_c_contiguous() and value.is_c_contiguous():
                block.copy_to_device(value, stream=handle.stream)
            else:
                y.setitem(key, value, stream=handle.stream)

    def memory_available(self, handle, nbytes):
        # The device's total: what is free depends on the caching allocators of PyTorch and CuPy,
        # which hand memory back on demand; a result beyond the total can never be allocated.
        if handle.simulator:
            return None
        return _total_memory(handle.ordinal)

    def synchronize(self, handle):
        with handle.activate():
            handle.stream.synchronize()

    def finish(self, y, like, handle):
        if not is_cuda_array(like):
            with handle.activate():
                host = y.copy_to_host(stream=handle.stream)
            like_dtype = getattr(like, "dtype", None)
            if like_dtype is not None and dtype_name(like_dtype) == "bfloat16":
                host = host.view(like_dtype)  # the bits back under ml_dtypes' bfloat16
            return host
        owner = getattr(y, "convlib_owner", None)
        if owner is not None:
            return owner
        lib = _library(like)
        if lib == "torch":
            import torch

            return torch.as_tensor(y, device=f"cuda:{handle.ordinal}")
        if lib == "cupy":
            import cupy

            return cupy.asarray(y)
        return y


def _host_contiguous(arr, dtype: str) -> np.ndarray:
    """A host array as the C-contiguous array the device receives: of ``dtype``, and for
    ``"bfloat16"`` its ``uint16`` bits (values of another dtype rounded to nearest even)."""
    if dtype != "bfloat16":
        return np.ascontiguousarray(arr, dtype=dtype)
    arr = np.asarray(arr)
    if arr.dtype.name == "bfloat16":
        return np.ascontiguousarray(arr).view(np.uint16)
    return bfloat16_bits(arr)


def _current_device(simulator: bool) -> int:
    if simulator:
        return 0
    return int(cuda.get_current_device().id)


BACKEND = CudaBackend()
