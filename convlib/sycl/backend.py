"""The SYCL backend: which device a call runs on, how data gets there and back.

Importing this module imports nothing of the SYCL stack; :mod:`convlib.sycl.runtime` loads it on
the first call that needs it (so ``import convlib`` works without the ``sycl`` extra).

How ``device=`` resolves to a queue (the handle the kernels get):

* ``None`` with dpnp / ``dpctl.tensor`` inputs: their queue (compute follows data). Inputs on
  different queues -> ``ValueError`` (move them with ``.to_device(queue)``).
* ``"sycl"``: dpctl's default device; any other string is a dpctl filter string
  (``"opencl:cpu"``, ``"opencl:cpu:0"``, ``"level_zero:gpu:0"``, ``"gpu"``); a ``dpctl.SyclDevice``.
  These use dpctl's cached queue of the device, the one dpnp allocates on by default, so numpy
  calls and dpnp calls share compiled kernels (numba-dpex compiles per queue).
* A ``dpctl.SyclQueue``: that queue.
* With SYCL inputs, a ``device=`` naming another device or another queue -> ``ValueError``.
* float64 data on a device without the fp64 aspect -> ``TypeError``.

Results follow the input ``x``: numpy in -> numpy out (copied to the device and back),
``dpnp.ndarray`` in -> ``dpnp.ndarray`` out on the same queue, ``usm_ndarray`` in -> ``usm_ndarray``.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from ..core.contracts import Backend
from ..core.host_memory import host_memory_available
from . import memory, runtime


def _is_sycl_array(arr) -> bool:
    return type(arr).__module__.split(".")[0] in ("dpnp", "dpctl") and hasattr(arr, "sycl_queue")


def supports_fp64(device) -> bool:
    """Whether ``device`` (a ``dpctl.SyclDevice``) computes in float64 (its fp64 aspect)."""
    return bool(device.has_aspect_fp64)


def _describe_device(dev) -> str:
    return f"{dev.filter_string} ({dev.name})"


@functools.lru_cache(maxsize=None)
def device_identity(device) -> str:
    """``sycl|<backend>|<device name>|<driver version>`` of a ``dpctl.SyclDevice``: the same for
    every queue on the device and in every process, different for another device or driver."""
    backend = getattr(device.backend, "name", str(device.backend))
    return f"sycl|{backend}|{device.name}|{device.driver_version}"


class SyclBackend(Backend):
    """numba-dpex kernels on a dpctl device; see the module docstring."""

    name = "sycl"

    def __init__(self):
        self._reason: str | None = None
        self._checked = False

    # -- availability ----------------------------------------------------------------------
    def _mods(self) -> runtime.SyclModules:
        return runtime.load()

    def unavailable_reason(self):
        if not self._checked:
            try:
                mods = self._mods()
                if not mods.dpctl.get_devices():
                    self._reason = (
                        "no SYCL device found (OCL_ICD_FILENAMES="
                        f"{os.environ.get('OCL_ICD_FILENAMES', '')!r}); `python -m convlib.sycl.runtime` "
                        "reports what the runtime sees"
                    )
            except runtime.SyclRuntimeError as exc:
                self._reason = str(exc)
            self._checked = True
        return self._reason

    def device_names(self):
        if self.unavailable_reason() is not None:
            return []
        return [dev.filter_string for dev in self._mods().dpctl.get_devices()]

    # -- resolving device= -----------------------------------------------------------------
    def owns(self, arr):
        return _is_sycl_array(arr)

    def _device_for(self, spec):
        """(device, queue or None) for a ``device=`` value that is not None."""
        dpctl = self._mods().dpctl
        if isinstance(spec, dpctl.SyclQueue):
            return spec.sycl_device, spec
        if isinstance(spec, dpctl.SyclDevice):
            return spec, None
        if isinstance(spec, str):
            text = spec.strip()
            try:
                dev = dpctl.select_default_device() if text.lower() == "sycl" else dpctl.SyclDevice(text)
            except (dpctl.SyclDeviceCreationError, ValueError, TypeError) as exc:
                present = ", ".join(_describe_device(d) for d in dpctl.get_devices()) or "none"
                raise ValueError(
                    f"device={spec!r} matches no SYCL device ({exc}); devices present: {present}"
                ) from None
            return dev, None
        raise TypeError(
            f"device={spec!r} of type {type(spec).__name__}: the SYCL backend takes 'sycl', a dpctl "
            "filter string, a dpctl.SyclDevice or a dpctl.SyclQueue"
        )

    def cached_queue(self, device):
        """dpctl's default queue of ``device`` (the one dpnp and dpctl.tensor allocate on)."""
        from dpctl._sycl_queue_manager import get_device_cached_queue

        return get_device_cached_queue(device)

    def resolve(self, spec, arrays):
        self._mods()
        data_queues = [a.sycl_queue for a in arrays if _is_sycl_array(a)]
        data_queue = data_queues[0] if data_queues else None
        if any(q != data_queue for q in data_queues[1:]):
            raise ValueError(
                "x, w and bias are on different SYCL queues; put them on one queue, e.g. "
                "w = w.to_device(x.sycl_queue)"
            )
        if spec is None:
            queue = data_queue if data_queue is not None else self.cached_queue(self._device_for("sycl")[0])
        else:
            device, queue = self._device_for(spec)
            if data_queue is not None:
                if (queue is not None and queue != data_queue) or device != data_queue.sycl_device:
                    raise ValueError(
                        f"device={spec!r} contradicts where the data lives (a queue on "
                        f"{_describe_device(data_queue.sycl_device)}); pass device=None to compute where "
                        "the data is, or move the data with .to_device()"
                    )
                queue = data_queue
            elif queue is None:
                queue = self.cached_queue(device)
        dev = queue.sycl_device
        if not supports_fp64(dev):
            for a in arrays:
                if np.dtype(a.dtype) == np.float64:
                    raise TypeError(
                        f"float64 data on {_describe_device(dev)}, which has no fp64 support; "
                        "convert to float32 or choose another device"
                    )
        return queue

    def identity(self, handle):
        return device_identity(handle.sycl_device)

    # -- data in and out -------------------------------------------------------------------
    def prepare(self, arr, dtype, handle):
        dpt = self._mods().dpt
        if isinstance(arr, np.ndarray) or not _is_sycl_array(arr):
            host = np.asarray(arr)
            # On a CPU device shared USM is host RAM: numpy copies (and converts) straight into
            # it, which was steadier than dpctl's host-to-device copy under load.
            out = memory.device_empty(host.shape, dtype, handle, result=True)
            view = memory.host_view(out)
            if view is not None:
                np.copyto(view, host, casting="unsafe")
            else:
                out[...] = np.ascontiguousarray(host, dtype=dtype)
            return out
        usm = arr.get_array() if hasattr(arr, "get_array") else arr
        if usm.flags.c_contiguous and usm.dtype == np.dtype(dtype):
            return usm
        return dpt.asarray(usm, dtype=dtype, order="C", copy=True)

    def empty(self, shape, dtype, handle):
        return self._mods().dpt.empty(shape, dtype=dtype, sycl_queue=handle)

    def memory_available(self, handle, nbytes):
        device = handle.sycl_device
        if device.is_cpu:  # USM on a CPU device is host memory
            return host_memory_available(nbytes)
        return int(device.global_mem_size)  # dpctl tells the total only

    def synchronize(self, handle):
        handle.wait()

    def finish(self, y, like, handle):
        mods = self._mods()
        if isinstance(like, mods.dpnp.ndarray):
            return mods.dpnp.asarray(y)
        if isinstance(like, mods.dpt.usm_ndarray):
            return y
        # numpy (or array-like) in, numpy out: on a CPU device the result lives in shared USM
        # memory, which numpy can use in place (a 128 MiB copy saved); elsewhere copy it back.
        handle.wait()
        view = memory.host_view(y)
        return view if view is not None else mods.dpt.asnumpy(y)


BACKEND = SyclBackend()

