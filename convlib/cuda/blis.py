"""Implicit GEMM on the GPU (the BLIS idea: pack B straight from the image, never build it).

The convolution is the GEMM ``C = A @ B`` per group (``M = K/groups`` filters, ``Ngemm = N*P*Q``
output pixels, ``Kgemm = Cg*R*S`` taps). Thread blocks compute ``BM x BN`` tiles of C with
register-blocked ``TM x TN`` accumulators per thread; the ``BK x BN`` shared-memory tiles of B are
gathered straight from the NCHW image (zero outside the padded image), so there is no column
matrix and no workspace at all: the GPU's counterpart of packing ``Bc`` from the image in the CPU
BLIS algorithm. The kernel is :func:`convlib.cuda.gemm.gemm_kernel` with ``b_source="image"``;
tiles come from the ``gemm_tiles`` knob of :data:`convlib.cuda.tables.KNOBS`.

On tensor cores: float16 and bfloat16 problems, and float32 problems when ``allow_tf32`` permits
TF32, run the same implicit GEMM with the warps' matrix instructions
(:mod:`convlib.cuda.tensor_gemm`, tiles from the ``mma_tiles`` knob); the half precisions are
served natively (``SERVES_HALF_PRECISIONS``: no float32 copies).

Cost of a new shape: every size except the batch is a compile-time constant, so a new shape
compiles a new kernel (about a second); the batch size is a run-time argument.
"""

from __future__ import annotations

import functools

import numpy as np

from ..core.options import options
from .tables import KNOBS
from .tiles import choose_gemm_tile, choose_mma_tile
from .gemm import IMAGE, gemm_kernel, gemm_launch_shape, shape_key
from .launch import MAX_GRID_Y, flat, placeholder_bias
from .tensor_gemm import mma_kernel, mma_launch_shape, precision_of

#: float16 and bfloat16 problems are computed by this module's own kernels (tensor cores), not
#: through float32 copies (:meth:`convlib.cuda.backend.CudaBackend.widened`).
SERVES_HALF_PRECISIONS = True


def supports(problem) -> str | None:
    """None unless the groups outnumber CUDA's grid limit (direct serves those)."""
    if problem.groups > MAX_GRID_Y:
        return f"groups={problem.groups} exceeds the {MAX_GRID_Y} groups one launch can address"
    return None


def workspace_bytes(problem, device=None) -> int:
    """None at all: tiles of B are gathered from the image into shared memory."""
    return 0


def run(problem, x, w, bias, device):
    """Implicit-GEMM convolution of device arrays (the contract of :mod:`convlib.core.contracts`)."""
    target = device
    with target.activate():
        y = target.empty(problem.y_shape, problem.dtype)
        if problem.N == 0:
            return y
        precision = precision_of(problem.dtype, options.allow_tf32)
        kernel, grid, block = _plan(problem, precision, target.multiprocessors, target.simulator, KNOBS.state())
        if precision in ("float16", "bfloat16"):
            # The kernels read and write half values as their bits.
            b = _bits(bias) if bias is not None else placeholder_bias("uint16", target)
            kernel[grid, block, target.stream](_bits(flat(x)), _bits(flat(w)), b, _bits(flat(y)), problem.N)
        else:
            b = bias if bias is not None else placeholder_bias(problem.dtype, target)
            kernel[grid, block, target.stream](flat(x), flat(w), b, flat(y), problem.N)
    return y


def _bits(arr):
    """A float16 device array as its uint16 bits (bfloat16 arrays already are)."""
    return arr if arr.dtype == np.uint16 else arr.view(np.uint16)


@functools.lru_cache(maxsize=256)
def _plan(problem, precision, multiprocessors: int, simulator: bool, knobs: tuple):
    """Kernel and launch shape for ``problem`` on tensor cores in ``precision`` (None: the FP32
    FMA kernel); cached on the knob overrides in force, ``knobs``: the host cost of a repeated
    call is the launch."""
    if precision is not None:
        tile = choose_mma_tile(problem, precision, multiprocessors, simulator)
        kernel = mma_kernel(shape_key(problem), tile, precision, simulator, KNOBS.tap_table_bytes)
        return (kernel, *mma_launch_shape(problem, tile, problem.N))
    tile = choose_gemm_tile(problem, multiprocessors, simulator)
    kernel = gemm_kernel(shape_key(problem), tile, IMAGE, simulator, KNOBS.tap_table_bytes)
    grid, block = gemm_launch_shape(problem, tile, problem.N)
    return kernel, grid, block
