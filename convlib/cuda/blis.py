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
from typing import NamedTuple

import numpy as np

from ..core.options import options
from .tables import KNOBS
from .tiles import choose_gemm_tile, choose_mma_split, choose_mma_tile, most_mma_parts
from .gemm import IMAGE, gemm_kernel, gemm_launch_shape, shape_key
from .launch import MAX_GRID_Y, flat, placeholder_bias
from .tensor_gemm import (copies_chunks, layout_kernels, mma_kernel, mma_launch_shape, operand_layout, precision_of,
                          split_sum_kernel, split_sum_launch_shape, split_workspace_elements)

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
    (:func:`convlib.cuda.tensor_gemm.operand_layout`), plus split-K's float32 partial outputs
    where the launch splits its reduction (``splits`` outputs of the problem's size; without a
    ``device`` to plan on, the most parts any number of SMs could take:
    :func:`~convlib.cuda.tiles.most_mma_parts`)."""
    precision = precision_of(problem.dtype, options.allow_tf32)
    if precision is None or operand_layout(problem, precision) != "channels_last":
        return 0
    copies = problem.itemsize * (problem.N * problem.C * problem.H * problem.W + problem.K * problem.gemm_k)
    if problem.N == 0:
        return copies
    if device is not None:
        splits = _mma_choice(problem, precision, device.multiprocessors, device.simulator, KNOBS.state())[2]
    else:  # every SM count: the largest split of any tile the chooser may take
        tiles = (*KNOBS.lookup("mma_tiles", precision), *KNOBS.simulator_mma_tiles,
                 *((KNOBS.mma_tile,) if KNOBS.mma_tile is not None else ()))
        splits = max(most_mma_parts(problem, tile, precision) for tile in tiles)
    return copies + 4 * split_workspace_elements(problem, splits)


class _Launch(NamedTuple):
    """What a call launches: the GEMM kernel and its shape, how its operands come (None: the
    FP32 FMA kernel; else :func:`~convlib.cuda.tensor_gemm.operand_layout`'s answer) and, for
    ``"channels_last"``, the kernels that copy them so; split-K's parts (1: none) and, split,
    the kernel that sums them with its grid and block."""

    kernel: object
    grid: tuple
    block: int
    operands: str | None
    layout_kernels: tuple | None
    splits: int = 1
    split_sum: object = None
    sum_grid: int = 0
    sum_block: int = 0


def run(problem, x, w, bias, device):
    """Implicit-GEMM convolution of device arrays (the contract of :mod:`convlib.core.contracts`)."""
    target = device
    with target.activate():
        y = target.empty(problem.y_shape, problem.dtype)
        if problem.N == 0:
            return y
        precision = precision_of(problem.dtype, options.allow_tf32)
        launch = _plan(problem, precision, target.multiprocessors, target.simulator, KNOBS.state())
        x, w, y_flat = flat(x), flat(w), flat(y)
        if precision is None:
            b = bias if bias is not None else placeholder_bias(problem.dtype, target)
            operands = x, w
        else:
            b = _bits(bias) if bias is not None else placeholder_bias("float32" if precision == "tf32" else "uint16", target)
            y_flat = _bits(y_flat)
            if launch.operands == "pixels":
                operands = x.view(np.uint32), w.view(np.uint32)
            elif launch.operands == "channels_last":
                operands = _channels_last_operands(problem, precision, launch.layout_kernels, _bits(x), _bits(w), target)
            else:
                operands = _bits(x), _bits(w)
        if launch.splits > 1:  # float32 partial outputs, summed in order, bias added, rounded once
            parts = target.empty((split_workspace_elements(problem, launch.splits),), "float32")
            launch.kernel[launch.grid, launch.block, target.stream](*operands, b, parts, problem.N)
            launch.split_sum[launch.sum_grid, launch.sum_block, target.stream](parts, b, y_flat, problem.N)
        else:
            launch.kernel[launch.grid, launch.block, target.stream](*operands, b, y_flat, problem.N)
    return y


def _channels_last_operands(problem, precision: str, layout_kernels, x, w, target):
    """The image as NHWC words and the filters as ``(K, R, S, C/groups)`` words, for the
    channels-last tensor-core kernel (TF32 rounded on the way): new arrays of the problem's
    dtype, written by the layout kernels as the kernel's element type and read as words."""
    to_channels_last, filters_channels_last = layout_kernels
    xt, wt = (_bits(target.empty((a.size,), problem.dtype)) for a in (x, w))
    if precision == "tf32":  # written as rounded words
        xt, wt = xt.view(np.uint32), wt.view(np.uint32)
    grid = (-(-problem.H * problem.W // 32), -(-problem.C // 32), min(problem.N, MAX_GRID_Y))
    to_channels_last[grid, (32, 8), target.stream](x, xt, problem.N)
    threads = 256
    filters_channels_last[-(-w.size // threads), threads, target.stream](w, wt)
    return xt.view(np.uint32), wt.view(np.uint32)


def _bits(arr):
    """A float16 device array as its uint16 bits (bfloat16 arrays already are; float32 ones stay
    as they are: the TF32 kernels read float32)."""
    return arr.view(np.uint16) if arr.dtype == np.float16 else arr


@functools.lru_cache(maxsize=256)
def _plan(problem, precision, multiprocessors: int, simulator: bool, knobs: tuple) -> _Launch:
    """What ``problem`` launches on tensor cores in ``precision`` (None: the FP32 FMA kernel);
    cached on the knob overrides in force, ``knobs``: the host cost of a repeated call is the
    launch."""
    key = shape_key(problem)
    if precision is None:
        tile = choose_gemm_tile(problem, multiprocessors, simulator)
        kernel = gemm_kernel(key, tile, IMAGE, simulator, KNOBS.tap_table_bytes)
        return _Launch(kernel, *gemm_launch_shape(problem, tile, problem.N), None, None)
    operands, tile, splits = _mma_choice(problem, precision, multiprocessors, simulator, knobs)
    channels_last = operands == "channels_last"
    kernel = mma_kernel(key, tile, precision, operands, simulator, KNOBS.tap_table_bytes, splits)
    layout = layout_kernels(key, precision, simulator) if channels_last else None
    launch = _Launch(kernel, *mma_launch_shape(problem, tile, problem.N, splits), operands, layout)
    if splits == 1:
        return launch
    sum_grid, sum_block = split_sum_launch_shape(problem, problem.N, simulator)
    return launch._replace(splits=splits, split_sum=split_sum_kernel(key, precision, splits, simulator),
                           sum_grid=sum_grid, sum_block=sum_block)


@functools.lru_cache(maxsize=256)
def _mma_choice(problem, precision, multiprocessors: int, simulator: bool, knobs: tuple) -> tuple:
    """How ``problem`` runs on tensor cores: its operand layout, tile and split-K parts (split
    only in the channels-last kernel); cached on the knob overrides in force, ``knobs``."""
    operands = operand_layout(problem, precision)
    channels_last = operands == "channels_last"
    tile = choose_mma_tile(problem, precision, multiprocessors, simulator, copies_chunks(operands),
                           splits=channels_last and KNOBS.mma_split_max > 1)
    splits = choose_mma_split(problem, tile, precision, multiprocessors) if channels_last else 1
    return operands, tile, splits
