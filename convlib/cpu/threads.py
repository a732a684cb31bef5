"""The calling thread's numba thread count, read cheaply.

``numba.get_num_threads()`` takes two locks on every call to check that the thread pool has
been launched; a small convolution asks for the count several times (the plan's key, the
kernels' partitions), and in a training step, where torch's work between two calls leaves
the interpreter's caches cold, each read took ~5 us. Once the pool is launched, numba reads
the count through a C function of its threading layer; :func:`thread_count` calls that
function directly, and falls back to ``get_num_threads`` on a numba without it.

The first read also undoes one setting of numba's OpenMP layer. When it starts its threads, numba
turns nested parallelism on (``omp_set_nested(1)``) in the OpenMP runtime its pool is bound to,
and with PyTorch in the process that is PyTorch's own ``libgomp``: numba's module resolves its
OpenMP symbols through the process's global scope, where PyTorch put its copy. From then on every
PyTorch parallel region in that thread ran with a team libgomp no longer kept spinning between
regions (a thread of numba's pool joined it, more threads than cores): on the 2-core Zen 5
(torch 2.13, numba 0.59), a PyTorch training step of the digits CNN took 0.9 ms before convlib's
first call and 6.5 ms after it, as did the same network on convlib's layers. convlib's kernels
never nest parallel regions, so the first read turns nesting off again in the runtimes numba may
use (the one of the global scope, and the one numba's module loaded itself): 6.5 -> 1.07 ms.
"""

from __future__ import annotations

from numba import get_num_threads
from numba.np.ufunc import parallel as _numba_parallel

_read = None


def thread_count() -> int:
    """``numba.get_num_threads()`` (the count the calling thread's parallel regions use)."""
    global _read
    if _read is None:
        count = get_num_threads()  # launches the pool; numba then keeps its C getter
        _read = getattr(_numba_parallel, "_get_num_threads", None) or get_num_threads
        _unnest_openmp()
        return count
    count = _read()
    return count if count > 0 else get_num_threads()  # get_num_threads raises on a bad count


def _unnest_openmp() -> None:
    """Turn off the nested parallelism numba's OpenMP layer turned on (see the module docstring),
    in the OpenMP runtime of the process's global scope and in the one numba's layer loaded."""
    import ctypes

    from numba import threading_layer

    if threading_layer() != "omp":
        return
    from numba.np.ufunc import omppool

    for library in (None, omppool.__file__):
        try:
            ctypes.CDLL(library).omp_set_nested(0)
        except Exception:  # noqa: BLE001 -- no OpenMP runtime there, or no such handle on this OS:
            continue  # a speed fix, never a reason for a call to fail
