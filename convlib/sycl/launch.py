"""Launching numba-dpex kernels: work-group shapes clamped to the device, padded global ranges,
register blocks, and the FMA intrinsic the kernels use.

Only :func:`launch` and :func:`fused_multiply_add` touch numba-dpex (through
:mod:`convlib.sycl.runtime`, on first use).
"""

from __future__ import annotations

import functools

import numpy as np

from . import runtime


def element_type(dtype: str):
    """The numpy scalar type kernels use for private accumulators of ``dtype``."""
    return np.float32 if dtype == "float32" else np.float64


def launch(kernel, global_size: tuple[int, ...], local_wanted: tuple[int, ...], queue, *args) -> None:
    """Run ``kernel`` over ``global_size`` work-items in work-groups of (clamped) ``local_wanted``.

    The global range is padded up to whole work-groups; kernels guard the padding themselves. All
    array arguments must live on ``queue`` (numba-dpex infers the queue from them).
    """
    mods = runtime.load()
    kapi = mods.kapi
    if min(global_size) <= 0:
        return
    local = work_group(queue.sycl_device, local_wanted)
    glob = tuple(padded(int(g), int(l)) for g, l in zip(global_size, local))
    mods.dpex.call_kernel(kernel, kapi.NdRange(kapi.Range(*glob), kapi.Range(*local)), *args)


@functools.lru_cache(maxsize=1)
def fused_multiply_add():
    """``fma(a, b, c) = a * b + c`` with one rounding, for use inside numba-dpex kernels.

    WORKAROUND(numba-dpex-0.23-no-fma): numba-dpex never contracts ``a * b + c`` into an FMA
    (not with ``fastmath=True`` nor ``-cl-mad-enable``), and Python 3.11 has no ``math.fma``.
    Separate multiplies and adds also need a temporary register each, so 8-row register blocks
    spilled on AVX2; with this intrinsic (``llvm.fma``, which the SPIR-V translator maps to
    OpenCL's ``fma``) the 8-row GEMM kernel ran 1.5x faster than the best unfused one.
    ``tests/test_sycl_runtime.py`` tells when plain ``a * b + c`` gets fused and this can go.
    """
    import llvmlite.ir as llvm_ir
    from numba.core import types
    from numba.extending import intrinsic

    runtime.load()
    from numba_dpex.kernel_api_impl.spirv.target import SPIRV_TARGET_NAME

    @intrinsic(target=SPIRV_TARGET_NAME)
    def fma(typingctx, a, b, c):
        if not (isinstance(a, types.Float) and a == b == c):
            return None

        def codegen(context, builder, signature, args):
            t = args[0].type
            fn = builder.module.declare_intrinsic("llvm.fma", [t], llvm_ir.FunctionType(t, [t, t, t]))
            return builder.call(fn, args)

        return a(a, b, c), codegen

    return fma


def work_group(device, wanted: tuple[int, ...], local_bytes_per_item: int = 0) -> tuple[int, ...]:
    """``wanted`` clamped to what ``device`` allows.

    Each dimension is clamped to ``max_work_item_sizes``, then the largest dimension is halved
    until the product fits ``max_work_group_size`` and, when the kernel uses local memory,
    ``local_bytes_per_item * product <= local_mem_size``.
    """
    if device is not None:
        limits = getattr(device, f"max_work_item_sizes{len(wanted)}d")
    else:
        limits = (1 << 30,) * len(wanted)
    sizes = [max(1, min(int(w), int(lim))) for w, lim in zip(wanted, limits)]
    max_items = device.max_work_group_size if device is not None else 1 << 30
    if local_bytes_per_item and device is not None:
        max_items = min(max_items, max(1, device.local_mem_size // local_bytes_per_item))

    def product():
        out = 1
        for v in sizes:
            out *= v
        return out

    while product() > max_items:
        i = max(range(len(sizes)), key=lambda d: sizes[d])
        sizes[i] = max(1, sizes[i] // 2)
    return tuple(sizes)


def padded(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (global ranges must divide evenly)."""
    return -(-n // multiple) * multiple


def register_block(extent: int, table_value: int) -> int:
    """Outputs per work-item along an axis of length ``extent``: the largest power of two that
    divides ``extent`` and is at most ``table_value``.

    Dividing exactly keeps bounds tests out of the inner loop (a clamped index there cost 2x);
    powers of two keep the number of compiled variants at four per kernel (depthwise gets 1).
    """
    block = 1
    while block * 2 <= table_value and extent % (block * 2) == 0:
        block *= 2
    return block


def row_work_group(device, items: int, row_length: int) -> tuple[int, int]:
    """A work-group ``(rows, columns)`` of about ``items`` work-items over rows of ``row_length``.

    Columns (the vectorised dimension) get the smallest power of two covering the row, up to
    ``items``; the remaining factor goes to rows. So a 7-wide output (ResNet's last stage) runs
    8 x 8 groups with 7 of 8 lanes busy instead of 1 x 64 groups with 7 of 64 busy.
    """
    columns = 1
    while columns < min(row_length, items):
        columns *= 2
    rows = max(1, items // columns)
    return work_group(device, (rows, columns))
