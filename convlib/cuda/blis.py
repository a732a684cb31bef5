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
from .tensor_gemm import layout_kernels, mma_kernel, mma_launch_shape, operand_layout, precision_of
from .ptx import ELEMENTS_PER_WORD

#: float16 and bfloat16 problems are computed by this module's own kernels (tensor cores), not
#: through float32 copies (:meth:`convlib.cuda.backend.CudaBackend.widened`).
SERVES_HALF_PRECISIONS = True


def supports(problem) -> str | None:
    """None unless the groups outnumber CUDA's grid limit (direct serves those)."""
    if problem.groups > MAX_GRID_Y:
        return f"groups={problem.groups} exceeds the {MAX_GRID_Y} groups one launch can address"
    return None


def workspace_bytes(problem, device=None) -> int:
    """None on FMAs: tiles of B are gathered from the image into shared memory. On tensor cores,
    the channels-last copies of the image and the filters where that kernel serves the problem
    (:func:`convlib.cuda.tensor_gemm.channels_last_eligible`)."""
    precision = precision_of(problem.dtype, options.allow_tf32)
    if precision is None or operand_layout(problem, precision) != "channels_last":
        return 0
    itemsize = 4 if precision == "tf32" else 2
    return itemsize * (problem.N * problem.C * problem.H * problem.W + problem.K * problem.gemm_k)


def run(problem, x, w, bias, device):
    """Implicit-GEMM convolution of device arrays (the contract of :mod:`convlib.core.contracts`)."""
    target = device
    with target.activate():
        y = target.empty(problem.y_shape, problem.dtype)
        if problem.N == 0:
            return y
        precision = precision_of(problem.dtype, options.allow_tf32)
        kernel, grid, block, layout = _plan(problem, precision, target.multiprocessors, target.simulator, KNOBS.state())
        half = precision in ("float16", "bfloat16")
        # The tensor-core kernels read and write half values as their bits.
        bits = _bits if half else (lambda arr: arr)
        b = bits(bias) if bias is not None else placeholder_bias("uint16" if half else problem.dtype, target)
        if layout == "pixels":
            operands = flat(x).view(np.uint32), flat(w).view(np.uint32)
        elif layout is not None:
            operands = _channels_last_operands(problem, precision, layout, bits(flat(x)), bits(flat(w)), target)
        else:
            operands = bits(flat(x)), bits(flat(w))
        kernel[grid, block, target.stream](*operands, b, bits(flat(y)), problem.N)
    return y


def _channels_last_operands(problem, precision: str, layout, x, w, target):
    """The image as NHWC words and the filters as ``(K, R, S, C/groups)`` words, for the
    channels-last tensor-core kernel (TF32 rounded on the way)."""
    to_channels_last, filters_channels_last = layout
    words = (lambda n: target.empty((n,), np.float32).view(np.uint32)) if precision == "tf32" else (
        lambda n: _bits(target.empty((n,), problem.dtype)))
    epw = ELEMENTS_PER_WORD[precision]
    xt, wt = words(x.size), words(w.size)
    hw = problem.H * problem.W
    grid = (-(-hw // 32), -(-problem.C // 32), min(problem.N, MAX_GRID_Y))
    to_channels_last[grid, (32, 8), target.stream](x, xt, problem.N)
    threads = 256
    filters_channels_last[-(-w.size // threads), threads, target.stream](w, wt)
    as_words = (lambda a: a) if epw == 1 else (lambda a: a.view(np.uint32))
    return as_words(xt), as_words(wt)


def _bits(arr):
    """A float16 device array as its uint16 bits (bfloat16 arrays already are)."""
    return arr if arr.dtype == np.uint16 else arr.view(np.uint16)


@functools.lru_cache(maxsize=256)
def _plan(problem, precision, multiprocessors: int, simulator: bool, knobs: tuple):
    """Kernel, launch shape and how its operands come (None: as they are, element by element;
    ``"pixels"``: as they are, as words; else the channels-last layout kernels) for ``problem`` on tensor cores in ``precision`` (None: the FP32 FMA kernel); cached on the knob overrides in force, ``knobs``: the host cost of a repeated
    call is the launch."""
    key = shape_key(problem)
    if precision is not None:
        tile = choose_mma_tile(problem, precision, multiprocessors, simulator)
        operands = operand_layout(problem, precision)
        kernel = mma_kernel(key, tile, precision, operands, simulator, KNOBS.tap_table_bytes)
        layout = {"channels_last": layout_kernels(key, precision, simulator), "pixels": "pixels"}.get(operands)
        return (kernel, *mma_launch_shape(problem, tile, problem.N), layout)
    tile = choose_gemm_tile(problem, multiprocessors, simulator)
    kernel = gemm_kernel(key, tile, IMAGE, simulator, KNOBS.tap_table_bytes)
    grid, block = gemm_launch_shape(problem, tile, problem.N)
    return kernel, grid, block, None
