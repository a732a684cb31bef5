"""The compiled-once mechanism of the parallel CPU kernels (convlib.cpu.compiled_once): a body
called by address computes what its prange body would, a tuple of the wrong type is refused when
the launcher compiles, and the declared type's pickle (numba's cache key) is the same in every
process."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from numba import njit, prange, types
from numba.core.errors import TypingError
from numba.core.runtime import _nrt_python, rtsys

from convlib.cpu.compiled_once import CompiledOnce, call_body, declare, release, share


def _scaled_rows_kernel(declared_type):
    """y[i, :] = a * x[i, :] + i, one prange iteration per row, the body compiled once; the
    launcher makes the row offsets itself (numba frees such an array after its last use in the
    launcher unless share() keeps it)."""
    ARGUMENTS = declare(declared_type)

    def row_body(x, y, a, offsets, i):
        for j in range(x.shape[1]):
            y[i, j] = a * x[i, j] + offsets[i]

    @njit(parallel=True)
    def launcher(x, y, a, body):
        shared = share((x, y, a, np.arange(x.shape[0]) * 1.0), ARGUMENTS)
        for i in prange(x.shape[0]):
            call_body(body, shared, i, ARGUMENTS)
        release(shared, ARGUMENTS)

    return CompiledOnce(launcher, row_body, ARGUMENTS)


MATRIX = types.Array(types.float64, 2, "C")
VECTOR = types.Array(types.float64, 1, "C")


def test_body_computes_what_the_loop_does():
    kernel = _scaled_rows_kernel(types.Tuple((MATRIX, MATRIX, types.float64, VECTOR)))
    assert kernel.signatures == []  # nothing compiled until the first call
    x = np.arange(35.0).reshape(7, 5)
    y = np.full_like(x, np.nan)
    kernel(x, y, 2.5)
    _nrt_python.memsys_enable_stats()
    try:
        before = rtsys.get_allocation_stats()
        kernel(x, y, 2.5)
        after = rtsys.get_allocation_stats()
    finally:
        _nrt_python.memsys_disable_stats()
    # What the launcher allocated is freed once, after the bodies: share() and release() balance.
    assert after.alloc - before.alloc == after.free - before.free > 0
    np.testing.assert_array_equal(y, 2.5 * x + np.arange(7.0)[:, None])
    assert kernel.signatures == [(MATRIX, MATRIX, types.float64, VECTOR, types.int64)]


def test_a_read_only_input_is_read_as_declared():
    # A caller's read-only array types as another array type than the declared, writable one.
    kernel = _scaled_rows_kernel(types.Tuple((MATRIX, MATRIX, types.float64, VECTOR)))
    x = np.arange(12.0).reshape(4, 3)
    x.flags.writeable = False
    y = np.zeros_like(x)
    kernel(x, y, -1.0)
    np.testing.assert_array_equal(y, -x + np.arange(4.0)[:, None])


def test_a_tuple_of_another_type_is_refused():
    kernel = _scaled_rows_kernel(types.Tuple((MATRIX, MATRIX, types.float32, VECTOR)))
    x = np.ones((3, 2))
    with pytest.raises(TypingError, match="not the declared"):
        kernel(x, np.empty_like(x), 1.0)


def test_declared_type_pickles_the_same_whatever_types_came_before():
    # numba's disk-cache key hashes the pickled closure: a numba type's own pickle holds a
    # per-process counter, which made the tuner's process miss what its workers had cached.
    script = (
        "import sys, hashlib\n"
        "from numba import types\n"
        "from numba.core.serialize import dumps\n"
        "from convlib.cpu.compiled_once import declare\n"
        "[types.Array(types.int8, d, 'F') for d in range(1, int(sys.argv[1]))]\n"
        "t = types.Tuple((types.Array(types.float32, 1, 'C'), types.int64))\n"
        "print(hashlib.sha256(dumps((declare(t),))).hexdigest())\n"
    )
    digests = {subprocess.run([sys.executable, "-c", script, str(n)], capture_output=True, text=True,
                              check=True).stdout for n in (1, 4)}
    assert len(digests) == 1
