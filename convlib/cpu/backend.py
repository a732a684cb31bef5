"""The CPU backend: numba kernels on the host, numpy arrays in and out."""

from __future__ import annotations

import contextlib

import numpy as np
from numba import set_num_threads

from ..core.contracts import RUN_AS_IS, Backend
from ..core.host_memory import host_memory_available
from .isa import cpu_model, host_isa
from .tables import KNOBS
from .threads import thread_count


#: :meth:`CpuBackend.identity` per thread count (the model and instruction set are read once per
#: process anyway): every call's plan is keyed on it.
_IDENTITIES: dict[int, str] = {}


class CpuBackend(Backend):
    """numba kernels on the host; numpy arrays in and out (see :class:`convlib.core.contracts.Backend`)."""

    name = "cpu"

    def unavailable_reason(self):
        return None

    def device_names(self):
        return ["cpu"]

    def owns(self, arr):
        return isinstance(arr, np.ndarray)

    def resolve(self, spec, arrays):
        return None

    def identity(self, handle):
        # The thread count is part of the device: a choice measured on 2 threads need not win on 16.
        threads = thread_count()
        identity = _IDENTITIES.get(threads)
        if identity is None:
            identity = _IDENTITIES[threads] = f"cpu|{cpu_model()}|{host_isa()}|{threads} threads"
        return identity

    def prepare(self, arr, dtype, handle):
        # ascontiguousarray copies only when the layout or dtype differs; kernels never write
        # to their inputs, so read-only and shared views are safe to pass through.
        return np.ascontiguousarray(arr, dtype=dtype)

    def empty(self, shape, dtype, handle):
        return np.empty(shape, dtype=dtype)

    def memory_available(self, handle, nbytes):
        return host_memory_available(nbytes)

    def synchronize(self, handle):
        return None

    def execution(self, problem):
        """Problems under the ``serial_below_flops`` knob run on the calling thread alone."""
        if problem.flops >= KNOBS.serial_below_flops:
            return RUN_AS_IS
        return _one_thread()

    def finish(self, y, like, handle):
        return y


@contextlib.contextmanager
def _one_thread():
    # numba's thread count is per calling thread: other threads of the program keep theirs.
    threads = thread_count()
    set_num_threads(1)
    try:
        yield
    finally:
        set_num_threads(threads)


BACKEND = CpuBackend()
