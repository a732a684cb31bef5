"""Outputs whose memory is reused once the caller has dropped them (a caching allocator).

Why: a large fresh numpy array is fresh pages from the kernel, and a convolution's first write to
each page is a page fault (a zeroed 4 KiB or 2 MiB page). On the seed shape (N=8, C=K=4,
1024^2, a 128 MiB output) the direct kernel took 22 ms into a reused output and 37 ms into a
fresh one (measured on the 2-core development machine). Callers that convolve in a loop and drop
each result get the faulted pages back on the next call of the same size, as PyTorch's CUDA
caching allocator does for device memory.

How it stays safe: :func:`empty` hands out an array whose ``base`` is a small owner object
(:class:`_Owner`, exposing the pooled block through ``__array_interface__``). numpy keeps that
object as the ``base`` of every array derived from it (slices, reshapes, ``np.asarray``), so the
block returns to the pool only when no array can reach its memory any more
(``weakref.finalize`` on the owner). (A ``memoryview`` would not do: ``np.frombuffer`` keeps a
memoryview of its own, and the block came back while the array was still in use.) The pool keeps at most
``convlib.options.output_cache_bytes`` (default 512 MiB; 0 turns the cache off) and only blocks
of at least :data:`MIN_BYTES`; smaller outputs come from ``np.empty``, whose allocator already
reuses them.

The SYCL backend keeps the results it allocates in host memory on a CPU device (shared USM) in
the same pool (:func:`convlib.sycl.memory.device_empty`, through :func:`take` and
:func:`release_when_unreachable`): there a fresh 128 MiB result cost ~7 ms of page faults.
"""

from __future__ import annotations

import math
import threading
import weakref

import numpy as np

from .options import options

#: Outputs smaller than this are plain ``np.empty`` arrays (malloc's arenas reuse those).
MIN_BYTES = 32 * 2**20

#: Where every output starts: a cache line. malloc gives 16 bytes (large blocks start 16 bytes
#: into their pages), so every 64-byte vector store of a kernel writing whole rows split across
#: two cache lines.
ALIGNMENT = 64

_lock = threading.Lock()
_free: dict[tuple, list] = {}  # (kind, bytes) -> idle blocks; kind "host" or a SYCL queue
_free_bytes = 0


def enabled() -> bool:
    """Whether dropped outputs are kept (``convlib.options.output_cache_bytes`` >= :data:`MIN_BYTES`)."""
    if options.output_cache_bytes >= MIN_BYTES:
        return True
    if _free_bytes:
        clear()  # turned off since the blocks were kept
    return False


def empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array, like ``np.empty(shape, dtype)``, starting on a
    :data:`ALIGNMENT`-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < MIN_BYTES or not enabled():
        raw = np.empty(nbytes + ALIGNMENT, np.uint8)
        start = -raw.__array_interface__["data"][0] % ALIGNMENT
        return raw[start:start + nbytes].view(dtype).reshape(shape)
    key = ("host", nbytes)
    block = take(key)
    if block is None:
        block = np.empty(nbytes + ALIGNMENT, np.uint8)
    owner = _Owner(block, shape, dtype)
    release_when_unreachable(owner, key, block)
    return np.asarray(owner)


class _Owner:
    """The ``base`` of a cached output: describes the block's memory, holds no reference to it."""

    __slots__ = ("__array_interface__", "__weakref__")

    def __init__(self, block: np.ndarray, shape, dtype: np.dtype):
        address = block.__array_interface__["data"][0]
        self.__array_interface__ = {
            "data": (address - address % -ALIGNMENT, False),
            "shape": tuple(int(n) for n in shape),
            "typestr": dtype.str,
            "version": 3,
        }


def take(key: tuple):
    """An idle block for ``key`` = ``(kind, bytes)``, or None."""
    global _free_bytes
    with _lock:
        blocks = _free.get(key)
        if not blocks:
            return None
        _free_bytes -= key[1]
        return blocks.pop()


def release_when_unreachable(owner, key: tuple, block) -> None:
    """Give ``block`` back to the pool (under ``key``) once ``owner`` has been collected.

    ``owner`` must be what every array over the block keeps alive (its ``base`` or ``usm_data``),
    and ``block`` must not reference ``owner`` (the pool keeps ``block``).
    """
    weakref.finalize(owner, _give_back, key, block)


def _give_back(key: tuple, block) -> None:
    global _free_bytes
    with _lock:
        if _free_bytes + key[1] > options.output_cache_bytes:
            return  # over the cap: let it go
        _free.setdefault(key, []).append(block)
        _free_bytes += key[1]


def clear() -> None:
    """Release every idle block to the system."""
    global _free_bytes
    with _lock:
        _free.clear()
        _free_bytes = 0


def cached_bytes() -> int:
    """Bytes held by idle blocks."""
    return _free_bytes
