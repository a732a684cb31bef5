"""The BLIS micro-kernels of :mod:`convlib.cpu.blis`, generated per register tile.

:func:`micro_kernel` computes an ``MR x NR`` tile of the output from a ``kc x MR`` sliver of the
packed filters and a ``kc x NR`` sliver of the packed image, and stores it straight into ``y``
(adding the bias on the first ``pc`` block, accumulating on the others). It is generated per
``(MR, NR, lanes)`` from :data:`_MICRO_KERNEL_TEMPLATE`, rows and vectors unrolled in the
source (:mod:`convlib.cpu.codegen`), with explicit vector intrinsics
(:mod:`convlib.cpu.intrinsics`) on a stack buffer that LLVM keeps in registers: per reduction
step NR/lanes vector loads of B, MR broadcasts of A, MR*NR/lanes FMAs (6x64 float32 on AVX-512:
24 zmm accumulators; 3x32 on AVX2: 12 ymm). Before its reduction loop the kernel prefetches the
tile's rows of ``y`` (on 14x14 and 7x7 images, where rows are short and the hardware prefetchers
lose them, waiting for them at the store cost 5-10%).

:func:`micro_kernel_split` stores a tile whose columns run into the next image (each vector to
its image, masked stores only for the vector that straddles the boundary); :func:`store_edge_tile`
copies out a tile that is not whole, from a per-thread ``MR x NR`` buffer, in runs of one image.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit, types
from numba.extending import overload

from .codegen import PER_ROW, PER_ROW_VECTOR, PER_VECTOR_ROW, exec_function, render, with_fma_rows_outer
from .intrinsics import (
    prefetch_for_write,
    vector_add_into,
    vector_copy,
    vector_fma,
    vector_fma_lanes,
    vector_sum,
    vector_store_plus,
    vector_store_split,
    vector_zero,
)
from .isa import simd_bytes
from .stack_buffer import stack_array_1d

_MICRO_KERNEL_TEMPLATE = f'''
def micro_kernel_{{MR}}x{{NR}}_of_{{NB}}(kc, a, a_off, b, b_off, c, c_off, ldc, mode, bias, bias_off, MR, NR):
    # Explicit {{L}}-lane vectors (NR/{{L}} per row): the register tile does not depend on the
    # width LLVM's loop vectoriser prefers (256 bits on Intel AVX-512 parts, which would double
    # the accumulators and spill them), and no index goes through numba's wraparound test.
    acc = stack_array_1d({{MR}} * {{NR}}, c.dtype)
    vector_zero(acc, {{o}}, {{L}})  {PER_ROW_VECTOR}
    prefetch_for_write(c, c_off + {{i}} * ldc + {{j}})  {PER_ROW_VECTOR}
    for p in range(kc):
        ap = a_off + p * {{MR}}
        bp = b_off + p * {{NB}}
        vector_fma(acc, {{o}}, a, ap + {{i}}, b, bp + {{j}}, {{L}})  {PER_VECTOR_ROW}
    if mode == ACCUMULATE:
        vector_add_into(c, c_off + {{i}} * ldc + {{j}}, acc, {{o}}, {{L}})  {PER_ROW_VECTOR}
    else:
        bias{{i}} = bias[bias_off + {{i}}] if mode == STORE_WITH_BIAS else 0.0  {PER_ROW}
        vector_store_plus(c, c_off + {{i}} * ldc + {{j}}, acc, {{o}}, bias{{i}}, {{L}})  {PER_ROW_VECTOR}
'''

#: The same tile for columns that continue in the next image: those from ``head`` on go to
#: ``c_off2`` (the next image's first pixel of row 0) instead of following ``c_off``'s row.
_SPLIT_MICRO_KERNEL_TEMPLATE = _MICRO_KERNEL_TEMPLATE.split("    if mode == ACCUMULATE:")[0].replace(
    "def micro_kernel_{MR}x{NR}_of_{NB}(kc, a, a_off, b, b_off, c, c_off, ldc,",
    "def micro_kernel_split_{MR}x{NR}(kc, a, a_off, b, b_off, c, c_off, c_off2, head, ldc,",
).replace(
    "    for p in range(kc):",
    "    prefetch_for_write(c, c_off2 + {i} * ldc)  " + PER_ROW + "\n    for p in range(kc):",
) + f'''    accumulate = mode == ACCUMULATE
    bias{{i}} = bias[bias_off + {{i}}] if mode == STORE_WITH_BIAS else 0.0  {PER_ROW}
    vector_store_split(c, c_off + {{i}} * ldc + {{j}}, c_off2 + {{i}} * ldc + {{j}} - head, head - {{j}}, acc, {{o}}, bias{{i}}, accumulate, {{L}})  {PER_ROW_VECTOR}
'''

#: How the micro-kernel writes its tile: the first ``pc`` block stores (adding the bias when there
#: is one), the later ones accumulate.
STORE, STORE_WITH_BIAS, ACCUMULATE = 0, 1, 2

_NAMESPACE = {
    "vector_store_split": vector_store_split,
    "prefetch_for_write": prefetch_for_write,
    "stack_array_1d": stack_array_1d,
    "vector_zero": vector_zero,
    "vector_fma": vector_fma,
    "vector_fma_lanes": vector_fma_lanes,
    "vector_sum": vector_sum,
    "vector_add_into": vector_add_into,
    "vector_store_plus": vector_store_plus,
    "vector_copy": vector_copy,
    "uintp": np.uintp,
    "ACCUMULATE": ACCUMULATE,
    "STORE_WITH_BIAS": STORE_WITH_BIAS,
}


def micro_kernel_lanes(MR: int, NR: int, itemsize: int) -> int:
    """Lanes of the micro-kernel's vectors: the SIMD width of :func:`~convlib.cpu.isa.host_isa`
    for this itemsize, halved until it divides NR."""
    lanes = simd_bytes() // itemsize
    while NR % lanes:
        lanes //= 2
    return lanes


def vector_registers() -> int:
    """Vector registers of :func:`~convlib.cpu.isa.host_isa`: 32 with AVX-512, 16 below."""
    return 32 if simd_bytes() >= 64 else 16


def fma_rows_outer(MR: int, NR: int, L: int, registers: int | None = None) -> bool:
    """Whether the reduction step's FMAs go row by row (each broadcast of A serves its row's
    ``NR/L`` FMAs and is dropped: ``MR*NR/L`` accumulators, the ``NR/L`` vectors of B and one
    broadcast live) rather than vector by vector (each vector of B serves the ``MR`` rows: the
    ``MR`` broadcasts stay live). LLVM keeps the order it is given: the one whose live registers
    fit ``registers`` without spilling, rows outer where both do. On an Intel Xeon (AVX-512, one
    core, panels in L1) rows outer ran 6x64 at 218 GFLOP/s against 176, and 12x32, 14x32 and 8x48
    at 199-228 against 97-162 (they spilled vector by vector); AVX2's 3x32 needs vectors outer
    (12 + 3 + 1 of 16 ymm registers; rows outer would need 17)."""
    vectors = NR // L
    registers = vector_registers() if registers is None else registers
    return MR * vectors + vectors + 1 <= registers


def in_fma_order(template: str, MR: int, NR: int, L: int) -> str:
    """``template`` (a register tile's, its FMA lines vector by vector) in the order of
    :func:`fma_rows_outer` for an ``MR x NR`` tile of ``L``-lane vectors."""
    return with_fma_rows_outer(template) if fma_rows_outer(MR, NR, L) else template


def render_micro_kernel(MR: int, NR: int, L: int, NB: int | None = None) -> str:
    """Source of the ``MR x NR`` micro-kernel with ``L``-lane vectors, reading the first ``NR``
    columns of B panels ``NB`` (default ``NR``) wide; its FMAs in the order of
    :func:`fma_rows_outer`."""
    return render(in_fma_order(_MICRO_KERNEL_TEMPLATE, MR, NR, L), MR, NR, L, NB=NR if NB is None else NB)


def render_split_micro_kernel(MR: int, NR: int, L: int) -> str:
    """Source of the ``MR x NR`` micro-kernel whose tile continues in the next image."""
    return render(in_fma_order(_SPLIT_MICRO_KERNEL_TEMPLATE, MR, NR, L), MR, NR, L, NB=NR)


def render_columns_micro_kernel(MR: int, NR: int, L: int) -> str:
    """Source of the ``MR x NR`` micro-kernel for a tile of ``nr`` columns: the tile of
    ``ceil(nr / L)`` vectors of columns, from panels ``NR`` wide, computed by its own unrolled
    body (one per vector count)."""
    vectors = NR // L
    parts = [render_micro_kernel(MR, v * L, L, NR) for v in range(1, vectors + 1)]
    narrowest = f"micro_kernel_{MR}x{{}}_of_{NR}(kc, a, a_off, b, b_off, c, c_off, ldc, mode, bias, bias_off, MR, NR)"
    branches = [f"if vectors == {v}:" if v == 1 else f"elif vectors == {v}:" for v in range(1, vectors)]
    parts.append(
        f"def micro_kernel_columns_{MR}x{NR}(kc, a, a_off, b, b_off, c, c_off, ldc, mode, bias, bias_off, nr, MR, NR):\n"
        f"    vectors = (nr + {L - 1}) // {L}\n"
        + "".join(f"    {branch}\n        {narrowest.format(v * L)}\n" for v, branch in enumerate(branches, 1))
        + (f"    else:\n        {narrowest.format(NR)}\n" if branches else f"    {narrowest.format(NR)}\n")
    )
    return "\n".join(parts)


@functools.lru_cache(maxsize=None)
def _micro_kernel_function(MR: int, NR: int, L: int):
    return exec_function(render_micro_kernel(MR, NR, L), f"micro_kernel_{MR}x{NR}_of_{NR}", _NAMESPACE, "blis")


@functools.lru_cache(maxsize=None)
def _columns_micro_kernel_function(MR: int, NR: int, L: int):
    dispatcher = exec_function(render_columns_micro_kernel(MR, NR, L), f"micro_kernel_columns_{MR}x{NR}",
                               _NAMESPACE, "blis")
    # The bodies share the dispatcher's namespace as plain Python functions: its calls to them
    # are compiled as calls to jitted, always-inlined functions.
    namespace = dispatcher.__globals__
    for v in range(1, NR // L + 1):
        name = f"micro_kernel_{MR}x{v * L}_of_{NR}"
        namespace[name] = njit(inline="always", fastmath={"contract"})(namespace[name])
    return dispatcher


@functools.lru_cache(maxsize=None)
def _split_micro_kernel_function(MR: int, NR: int, L: int):
    return exec_function(render_split_micro_kernel(MR, NR, L), f"micro_kernel_split_{MR}x{NR}", _NAMESPACE, "blis")


def micro_kernel(kc, a, a_off, b, b_off, c, c_off, ldc, mode, bias, bias_off, MR, NR):
    """``c[c_off + i*ldc + j] (+)= sum_p a[a_off + p*MR + i] * b[b_off + p*NR + j]`` (+ bias).

    For ``i < MR``, ``j < NR``, ``p < kc``; ``mode`` is :data:`STORE`, :data:`STORE_WITH_BIAS`
    (adds ``bias[bias_off + i]``) or :data:`ACCUMULATE`. ``MR`` and ``NR`` must be compile-time
    constants (literals or closure constants of a jitted caller). Callable from jitted code only.
    """
    raise NotImplementedError("micro_kernel is called from numba-compiled code only")


@overload(micro_kernel, prefer_literal=True, jit_options={"fastmath": {"contract"}})
def _micro_kernel_overload(kc, a, a_off, b, b_off, c, c_off, ldc, mode, bias, bias_off, MR, NR):
    if not (isinstance(MR, types.IntegerLiteral) and isinstance(NR, types.IntegerLiteral)):
        return None  # numba retries with the literal types
    mr, nr = MR.literal_value, NR.literal_value
    return _micro_kernel_function(mr, nr, micro_kernel_lanes(mr, nr, c.dtype.bitwidth // 8))


def micro_kernel_columns(kc, a, a_off, b, b_off, c, c_off, ldc, mode, bias, bias_off, nr, MR, NR):
    """:func:`micro_kernel` for a tile of ``nr <= NR`` columns: only ``ceil(nr / lanes)`` vectors
    of columns are computed and written (an image's last tile, whose other columns would be
    padding: 7x7 images at batch 8 fill 392 of 448 columns with whole tiles). ``b`` is still
    packed in panels ``NR`` wide. Callable from jitted code only."""
    raise NotImplementedError("micro_kernel_columns is called from numba-compiled code only")


@overload(micro_kernel_columns, prefer_literal=True, jit_options={"fastmath": {"contract"}})
def _micro_kernel_columns_overload(kc, a, a_off, b, b_off, c, c_off, ldc, mode, bias, bias_off, nr, MR, NR):
    if not (isinstance(MR, types.IntegerLiteral) and isinstance(NR, types.IntegerLiteral)):
        return None
    mr, nr_ = MR.literal_value, NR.literal_value
    return _columns_micro_kernel_function(mr, nr_, micro_kernel_lanes(mr, nr_, c.dtype.bitwidth // 8))


def micro_kernel_split(kc, a, a_off, b, b_off, c, c_off, c_off2, head, ldc, mode, bias, bias_off,
                       MR, NR):
    """:func:`micro_kernel` for a tile whose columns ``j >= head`` continue in the next image:
    they go to ``c[c_off2 + i*ldc + j - head]``, the others to ``c[c_off + i*ldc + j]``.
    Callable from jitted code only."""
    raise NotImplementedError("micro_kernel_split is called from numba-compiled code only")


@overload(micro_kernel_split, prefer_literal=True, jit_options={"fastmath": {"contract"}})
def _micro_kernel_split_overload(kc, a, a_off, b, b_off, c, c_off, c_off2, head, ldc, mode, bias,
                                 bias_off, MR, NR):
    if not (isinstance(MR, types.IntegerLiteral) and isinstance(NR, types.IntegerLiteral)):
        return None
    mr, nr = MR.literal_value, NR.literal_value
    return _split_micro_kernel_function(mr, nr, micro_kernel_lanes(mr, nr, c.dtype.bitwidth // 8))


def store_edge_tile(tile, NR, geo, row0, mr, col0, nr, mode, bias, y):
    """Write rows ``< mr`` and columns ``< nr`` of ``tile`` (the micro-kernel's ``MR x NR`` result,
    rows of ``NR``) to output channels ``row0 + i`` and pixels ``col0 + j`` of ``y`` (flat NCHW),
    in runs that stay in one image; ``mode`` as for :func:`micro_kernel`. Whole vectors, then a
    scalar tail (never past a run: the neighbouring pixels may belong to another thread).
    ``NR`` a compile-time constant. Callable from jitted code only."""
    raise NotImplementedError("store_edge_tile is called from numba-compiled code only")


@overload(store_edge_tile, prefer_literal=True)
def _store_edge_tile_overload(tile, NR, geo, row0, mr, col0, nr, mode, bias, y):
    if not isinstance(NR, types.IntegerLiteral):
        return None
    L = micro_kernel_lanes(1, NR.literal_value, y.dtype.bitwidth // 8)

    def store_edge_tile_impl(tile, NR, geo, row0, mr, col0, nr, mode, bias, y):
        PQ = geo.out_h * geo.out_w
        K = geo.out_channels
        n = col0 // PQ
        pq = col0 - n * PQ
        done = 0
        while done < nr:
            run = min(nr - done, PQ - pq)
            whole = run - run % L
            for i in range(mr):
                dst = (n * K + row0 + i) * PQ + pq
                src = i * NR + done
                if mode == ACCUMULATE:
                    for v in range(0, whole, L):
                        vector_add_into(y, dst + v, tile, src + v, L)
                    for t in range(whole, run):
                        y[np.uintp(dst + t)] += tile[np.uintp(src + t)]
                else:
                    b = bias[row0 + i] if mode == STORE_WITH_BIAS else 0.0
                    for v in range(0, whole, L):
                        vector_store_plus(y, dst + v, tile, src + v, b, L)
                    for t in range(whole, run):
                        y[np.uintp(dst + t)] = tile[np.uintp(src + t)] + b
            done += run
            pq = 0
            n += 1

    return store_edge_tile_impl


# ------------------------------------------------------------------------------------------
# The inner-product micro-kernel (the backward weight pass's, for large images)
# ------------------------------------------------------------------------------------------
def render_dot_micro_kernel(MR: int, NT: int, PANEL: int, L: int) -> str:
    """Source of the ``MR x NT`` inner-product micro-kernel over panels of ``PANEL`` pixels with
    ``L``-lane vectors: one vector accumulator per output, every (row, column) pair its own line
    (see :mod:`convlib.cpu.codegen` for why the lines are unrolled)."""
    lines = [
        f"def dot_micro_kernel_{MR}x{NT}(panels, a, a_off, a_stride, b, b_off, b_stride, c, c_off, ldc, mr, nt, MR, NT,"
        " PANEL):",
        f"    acc = stack_array_1d({MR * NT * L}, c.dtype)",
    ]
    lines += [f"    vector_zero(acc, {k * L}, {L})" for k in range(MR * NT)]
    lines += [
        "    for q in range(panels):",
        "        ap = a_off + q * a_stride",
        "        bp = b_off + q * b_stride",
        f"        for v in range(0, {PANEL}, {L}):",
    ]
    # Columns outer: each b vector is loaded once and meets the MR a vectors, which stay in registers.
    lines += [f"            vector_fma_lanes(acc, {(i * NT + j) * L}, a, ap + {i * PANEL} + v, b, bp + {j * PANEL} + v, {L})"
              for j in range(NT) for i in range(MR)]
    lines += [f"    if {i} < mr and {j} < nt:\n        c[c_off + {i} * ldc + {j}] += vector_sum(acc, {(i * NT + j) * L}, {L})"
              for i in range(MR) for j in range(NT)]
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=None)
def _dot_micro_kernel_function(MR: int, NT: int, PANEL: int, L: int):
    return exec_function(render_dot_micro_kernel(MR, NT, PANEL, L), f"dot_micro_kernel_{MR}x{NT}", _NAMESPACE,
                         "blis")


def dot_micro_kernel(panels, a, a_off, a_stride, b, b_off, b_stride, c, c_off, ldc, mr, nt, MR, NT, PANEL):
    """``c[c_off + i*ldc + j] += sum_{q, l} a[a_off + q*a_stride + i*PANEL + l] *
    b[b_off + q*b_stride + j*PANEL + l]`` for ``i < mr <= MR``, ``j < nt <= NT``, ``q < panels``,
    ``l < PANEL``: inner products of rows of pixel-major panels (as :func:`pack_b_from_image`
    writes them), each kept in a vector accumulator and summed across its lanes at the end.

    Rows ``mr .. MR`` and ``nt .. NT`` are read (they must be inside the arrays) but their sums
    are dropped. ``MR``, ``NT`` and ``PANEL`` must be compile-time constants. Callable from jitted
    code only."""
    raise NotImplementedError("dot_micro_kernel is called from numba-compiled code only")


@overload(dot_micro_kernel, prefer_literal=True, jit_options={"fastmath": {"contract"}})
def _dot_micro_kernel_overload(panels, a, a_off, a_stride, b, b_off, b_stride, c, c_off, ldc, mr, nt, MR, NT,
                               PANEL):
    if not all(isinstance(v, types.IntegerLiteral) for v in (MR, NT, PANEL)):
        return None
    panel = PANEL.literal_value
    lanes = micro_kernel_lanes(1, panel, c.dtype.bitwidth // 8)
    return _dot_micro_kernel_function(MR.literal_value, NT.literal_value, panel, lanes)


# ------------------------------------------------------------------------------------------
# The taps micro-kernel (the backward weight pass's taps form)
# ------------------------------------------------------------------------------------------
_TAPS_MICRO_KERNEL_TEMPLATE = f'''
def taps_micro_kernel_{{MR}}x{{NR}}(x, x_rows, dyt, dyt_off, ldd, dwt, dwt_off, ldw, mr, row0, rows, P, Q, H, W,
                                  x_image, sh, sw, h_off, w_off, q0, q1, mode, MR, NR):
    acc = stack_array_1d({{MR}} * {{NR}}, dwt.dtype)
    vector_zero(acc, {{o}}, {{L}})  {PER_ROW_VECTOR}
    x_row{{i}} = x_rows[{{i}}]  {PER_ROW}
    n = row0 // P
    p = row0 - n * P
    # Whole output rows whose input runs continue one another (a 1x1 stride-1 layer, a 3x3
    # layer's middle column) are one run: 7x7 images would otherwise pay a loop's setup per 7 pixels.
    merge = q0 == 0 and q1 == Q and sh * W == Q * sw
    p_end = min(P, (H - 1 - h_off) // sh + 1)
    r = 0
    while r < rows:
        h = p * sh + h_off
        run_rows = 1
        if h >= 0 and h < H:
            count = q1 - q0
            if merge:
                run_rows = min(rows - r, p_end - p)
                count = run_rows * Q
            xb = n * x_image + h * W + q0 * sw + w_off
            db = dyt_off + (r * Q + q0) * ldd
            for q in range(count):
                xq = xb + q * sw
                dq = db + q * ldd
                vector_fma(acc, {{o}}, x, xq + x_row{{i}}, dyt, dq + {{j}}, {{L}})  {PER_VECTOR_ROW}
        r += run_rows
        p += run_rows
        if p == P:
            p = 0
            n += 1
    if mode == ACCUMULATE:
        if {{i}} < mr: vector_add_into(dwt, dwt_off + {{i}} * ldw + {{j}}, acc, {{o}}, {{L}})  {PER_ROW_VECTOR}
    else:
        if {{i}} < mr: vector_copy(dwt, dwt_off + {{i}} * ldw + {{j}}, acc, {{o}}, {{L}})  {PER_ROW_VECTOR}
'''


def render_taps_micro_kernel(MR: int, NR: int, L: int) -> str:
    """Source of the ``MR x NR`` taps micro-kernel with ``L``-lane vectors."""
    return render(_TAPS_MICRO_KERNEL_TEMPLATE, MR, NR, L)


@functools.lru_cache(maxsize=None)
def _taps_micro_kernel_function(MR: int, NR: int, L: int):
    return exec_function(render_taps_micro_kernel(MR, NR, L), f"taps_micro_kernel_{MR}x{NR}", _NAMESPACE, "blis")


def taps_micro_kernel(x, x_rows, dyt, dyt_off, ldd, dwt, dwt_off, ldw, mr, row0, rows, P, Q, H, W, x_image, sh, sw,
                      h_off, w_off, q0, q1, mode, MR, NR):
    """One ``MR x NR`` tile of ``dW^T`` (``MR`` taps by ``NR`` filters) summed over the output rows
    ``row0 .. row0 + rows`` of the batch (flat ``n*P + p``): ``dwt[dwt_off + i*ldw + j] (+)= sum
    x[x_rows[i] + n*x_image + h*W + w] * dyt[dyt_off + ((n*P + p - row0)*Q + q)*ldd + j]`` with
    ``h = p*sh + h_off`` and ``w = q*sw + w_off``, over the output pixels whose tap lies inside
    the image (rows with ``0 <= h < H``, columns ``q0 <= q < q1``, which the caller clips).

    ``x`` is read in place: ``x_rows[i]`` is the offset of tap ``i``'s channel plane (the same
    filter tap for every row, so one clipping serves the tile), each value a broadcast; ``dyt``
    is the pixel-major panel of ``dy`` (``ldd >= NR`` filters per pixel). Rows ``mr .. MR`` are computed
    but not written (their ``x_rows`` must still be valid). ``mode`` is :data:`STORE` or
    :data:`ACCUMULATE`; ``MR`` and ``NR`` compile-time constants. Callable from jitted code only.
    """
    raise NotImplementedError("taps_micro_kernel is called from numba-compiled code only")


@overload(taps_micro_kernel, prefer_literal=True, jit_options={"fastmath": {"contract"}})
def _taps_micro_kernel_overload(x, x_rows, dyt, dyt_off, ldd, dwt, dwt_off, ldw, mr, row0, rows, P, Q, H, W, x_image, sh,
                                sw, h_off, w_off, q0, q1, mode, MR, NR):
    if not (isinstance(MR, types.IntegerLiteral) and isinstance(NR, types.IntegerLiteral)):
        return None
    mr_, nr = MR.literal_value, NR.literal_value
    return _taps_micro_kernel_function(mr_, nr, micro_kernel_lanes(mr_, nr, dwt.dtype.bitwidth // 8))
