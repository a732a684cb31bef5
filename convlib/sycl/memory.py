"""Device memory of the SYCL backend: allocations (pooled and huge-page advised on CPU devices),
host views of shared USM, and the zero-padded input copy kernels read without bounds tests.

The data movement here uses dpctl.tensor operations, precompiled in dpctl, so it costs no kernel
compile.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ..core import output_cache
from . import runtime
from .tables import KNOBS


def padded_input_bytes(problem) -> int:
    """Bytes of the zero-padded copy :func:`zero_padded_input` makes (0 without padding)."""
    if not any(problem.padding):
        return 0
    top, bottom, left, right = problem.padding
    return problem.N * problem.C * (problem.H + top + bottom) * (problem.W + left + right) * problem.itemsize


def zero_padded_input(problem, x):
    """``x`` with the problem's zero padding made explicit, or ``x`` itself without padding.

    Shape ``(N, C, H + top + bottom, W + left + right)``: a kernel reading it needs no bounds test
    for any valid output pixel. Costs one copy of the input: on a CPU device, when ``x`` is
    host-accessible (numpy inputs always are, see ``SyclBackend.prepare``), by the host's threads
    into shared USM (:func:`convlib.sycl.host_copy.pad_into`; dpctl.tensor's strided assignment
    took 210 ms for the seed shape's 128 MiB); otherwise with dpctl.tensor's precompiled kernels.
    """
    if not any(problem.padding):
        return x
    dpt = runtime.load().dpt
    top, bottom, left, right = problem.padding
    shape = (problem.N, problem.C, problem.H + top + bottom, problem.W + left + right)
    queue = x.sycl_queue
    if queue.sycl_device.is_cpu:
        queue.wait()
        source = host_view(x)
        if source is not None:
            from .host_copy import pad_into

            xp = device_empty(shape, problem.dtype, queue, result=True)
            pad_into(source, top, left, host_view(xp))
            return xp
    xp = dpt.zeros(shape, dtype=problem.dtype, sycl_queue=queue)
    xp[:, :, top:top + problem.H, left:left + problem.W] = x
    return xp


def bias_or_zeros(problem, bias, queue):
    """The bias, or a zero bias, so one kernel serves both cases (no extra variant to compile).

    Its shape is the problem's ``bias_shape``: ``(K,)``, or ``(C,)`` for ``conv2d_backward_data``."""
    if bias is not None:
        return bias
    return runtime.load().dpt.zeros(problem.bias_shape, dtype=problem.dtype, sycl_queue=queue)


_MADV_HUGEPAGE = 14  # Linux <sys/mman.h>


@functools.lru_cache(maxsize=1)
def _madvise():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def advise_huge_pages(arr) -> None:
    """Ask Linux to back a large host-memory USM array with 2 MiB pages (a hint; never fails).

    On the OpenCL CPU device a fresh 128 MiB output spent ~70 ms in 4 KiB page faults inside the
    kernel, ~15 ms with huge pages (where the system's THP mode is ``madvise``). Only for CPU
    devices, whose USM allocations are ordinary host memory.
    """
    if arr.nbytes < KNOBS.huge_page_min_bytes or not arr.sycl_device.is_cpu:
        return
    madvise = _madvise()
    if madvise is None:
        return
    ptr = arr.__sycl_usm_array_interface__["data"][0]
    page = 4096
    start = -(-ptr // page) * page
    end = (ptr + arr.nbytes) // page * page
    if end > start:
        madvise(start, end - start, _MADV_HUGEPAGE)


def device_empty(shape, dtype: str, queue, *, result: bool = False):
    """An uninitialised ``usm_ndarray`` on ``queue`` (large ones advised to use huge pages).

    ``result=True`` marks memory numpy must see (an algorithm's output, an input copied from
    numpy): on a CPU device it is allocated as USM *shared* memory (the same host RAM as device
    memory there, so kernels run as fast), which numpy can read and write in place (see
    ``SyclBackend.prepare`` and ``finish``).
    """
    dpt = runtime.load().dpt
    usm_type = "shared" if result and queue.sycl_device.is_cpu else "device"
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if usm_type == "shared" and nbytes >= output_cache.MIN_BYTES and output_cache.enabled():
        return _cached_shared_empty(shape, dtype, queue, nbytes)
    arr = dpt.empty(shape, dtype=dtype, sycl_queue=queue, usm_type=usm_type)
    advise_huge_pages(arr)
    return arr


def _cached_shared_empty(shape, dtype: str, queue, nbytes: int):
    """A shared-USM array over a block of :mod:`convlib.core.output_cache`'s pool (reused once every
    array over it is gone: its page faults are paid once, ~7 ms per 128 MiB here)."""
    dpt = runtime.load().dpt
    key = ((queue, "shared"), nbytes)
    block = output_cache.take(key)
    fresh = block is None
    if fresh:
        block = dpt.empty((nbytes,), dtype="u1", sycl_queue=queue, usm_type="shared").usm_data
    owner = _pooled_memory_type()(block)  # every array over it keeps this alive (usm_data)
    output_cache.release_when_unreachable(owner, key, block)
    arr = dpt.usm_ndarray(shape, dtype=dtype, buffer=owner)
    if fresh:
        advise_huge_pages(arr)
    return arr


@functools.lru_cache(maxsize=1)
def _pooled_memory_type():
    """A weak-referenceable view of a ``MemoryUSMShared`` block (dpctl's own type is not)."""
    runtime.load()
    import dpctl.memory as dpm

    class PooledUSMShared(dpm.MemoryUSMShared):
        pass

    return PooledUSMShared


def host_view(arr):
    """A numpy array sharing ``arr``'s memory (which it keeps alive), or None when not possible.

    Possible for a C-contiguous ``usm_ndarray`` filling a host-accessible (shared or host) USM
    allocation from its start; the caller must have waited for the queue.
    """
    if arr.usm_type not in ("shared", "host") or not arr.flags.c_contiguous:
        return None
    if arr.__sycl_usm_array_interface__.get("offset", 0) or arr.nbytes != arr.usm_data.nbytes:
        return None
    return np.frombuffer(arr.usm_data, dtype=arr.dtype, count=arr.size).reshape(arr.shape)
