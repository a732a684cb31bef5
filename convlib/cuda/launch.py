"""The one module that imports numba-cuda, and small helpers every CUDA algorithm launches with.

Every other module of the backend takes ``cuda`` (and the numba scalar types and the simulator's
switch) from here, so moving to another CUDA kernel package with numba's kernel language (e.g.
numba-cuda's successor, numba-cuda-mlir; ``docs/gpu.md`` says what would change) is a change
to this module alone.
"""

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


def kernel_extension_api():
    """numba-cuda's ``intrinsic`` decorator and its type module, for :mod:`convlib.cuda.ptx`'s
    PTX instructions (the one use of numba's extension API in the backend)."""
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    return intrinsic, types


def scalar_type(name: str):
    """The numba scalar type ``name`` (``"uint64"``, ``"float32"``, ``"float16"``, ...), for casts
    in kernels."""
    import numba

    return getattr(numba, name, None) or getattr(numba.types, name)


def simulator_enabled() -> bool:
    """Whether numba-cuda runs its CPU simulator (``NUMBA_ENABLE_CUDASIM=1``)."""
    from numba.cuda.core import config

    return bool(config.ENABLE_CUDASIM)


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
