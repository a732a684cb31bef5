"""The calling thread's numba thread count, read cheaply.

``numba.get_num_threads()`` takes two locks on every call to check that the thread pool has
been launched; a small convolution asks for the count several times (the plan's key, the
kernels' partitions), and in a training step, where torch's work between two calls leaves
the interpreter's caches cold, each read took ~5 us. Once the pool is launched, numba reads
the count through a C function of its threading layer; :func:`thread_count` calls that
function directly, and falls back to ``get_num_threads`` on a numba without it.
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
        return count
    count = _read()
    return count if count > 0 else get_num_threads()  # get_num_threads raises on a bad count
