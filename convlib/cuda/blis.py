"""Implicit GEMM on the GPU (the BLIS idea: pack B straight from the image, never build it).

The convolution is the GEMM ``C = A @ B`` per group (``M = K/groups`` filters, ``Ngemm = N*P*Q``
output pixels, ``Kgemm = Cg*R*S`` taps). Thread blocks compute ``BM x BN`` tiles of C with
register-blocked ``TM x TN`` accumulators per thread; the ``BK x BN`` shared-memory tiles of B are
gathered straight from the NCHW image (zero outside the padded image), so there is no column
matrix and no workspace at all: the GPU's counterpart of packing ``Bc`` from the image in the CPU
BLIS algorithm. The kernel is :func:`convlib.cuda.gemm.gemm_kernel` with ``b_source="image"``;
tiles come from the ``gemm_tiles`` knob of :data:`convlib.cuda.tables.KNOBS`.

Cost of a new shape: every size except the batch is a compile-time constant, so a new shape
compiles a new kernel (about a second); the batch size is a run-time argument.
"""

from __future__ import annotations

import functools

from .tables import KNOBS
from .tiles import choose_gemm_tile
from .gemm import IMAGE, gemm_kernel, gemm_launch_shape, shape_key
from .launch import MAX_GRID_Y, flat, placeholder_bias


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
        kernel, grid, block = _plan(problem, target.multiprocessors, target.simulator, KNOBS.state())
        b = bias if bias is not None else placeholder_bias(problem.dtype, target)
        kernel[grid, block, target.stream](flat(x), flat(w), b, flat(y), problem.N)
    return y


@functools.lru_cache(maxsize=256)
def _plan(problem, multiprocessors: int, simulator: bool, knobs: tuple):
    """Kernel and launch shape for ``problem`` (cached on the knob overrides in force, ``knobs``:
    the host cost of a repeated call is the launch)."""
    tile = choose_gemm_tile(problem, multiprocessors, simulator)
    kernel = gemm_kernel(shape_key(problem), tile, IMAGE, simulator, KNOBS.tap_table_bytes)
    grid, block = gemm_launch_shape(problem, tile, problem.N)
    return kernel, grid, block
