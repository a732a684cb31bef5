"""Small helpers every CUDA algorithm module launches with."""

from __future__ import annotations

import functools
import importlib.util

import numpy as np

# WORKAROUND(numba-cuda 0.30.4, numpy >= 2.5): numba-cuda's array support registers an overload of
# ``np.row_stack`` when its CUDA target first loads, and numpy 2.5 removed that alias of
# ``np.vstack``, so every compilation failed with AttributeError. Restoring the alias is harmless;
# tests/test_cuda.py::test_row_stack_workaround_still_needed says when it can go.
ROW_STACK_SHIM = not hasattr(np, "row_stack")
if ROW_STACK_SHIM:
    np.row_stack = np.vstack

# Kernel modules import ``cuda`` from here as a module global: numba-cuda's simulator swaps module
# globals that are numba.cuda for its fake module while a kernel runs. Without numba-cuda (e.g.
# numba < 0.60, whose old built-in numba.cuda is not used) it is None and the backend says why.
if importlib.util.find_spec("numba_cuda") is not None:
    from numba import cuda
else:
    cuda = None

#: CUDA's limit on gridDim.y and gridDim.z.
MAX_GRID_Y = 65535


def flat(arr):
    """A 1-D view of the C-contiguous device array ``arr`` (kernels index with constant strides)."""
    return arr.reshape(arr.size)


@functools.lru_cache(maxsize=None)
def _placeholder(dtype: str, ordinal: int, simulator: bool):
    return cuda.to_device(np.zeros(1, dtype=dtype))


def placeholder_bias(dtype: str, target):
    """A one-element device array passed where a kernel compiled without bias takes its bias."""
    return _placeholder(dtype, target.ordinal, target.simulator)
