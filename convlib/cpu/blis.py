"""BLIS/GotoBLAS five-loop GEMM convolution with implicit im2col (numba, CPU): the driver.

The GEMM view, per group ``g``: ``Y_g (M x Ngemm) = A_g (M x Kgemm) @ B_g (Kgemm x Ngemm)`` with

* ``M = K/groups`` rows: output channels of the group; ``A_g`` is the filters, row ``k`` being
  ``w[g*M + k]`` flattened in ``(c, r, s)`` order (``w`` is already laid out that way);
* ``Ngemm = N*P*Q`` columns: output pixels ``(n, p, q)`` of the whole batch, in that order;
* ``Kgemm = C/groups*R*S`` taps ``(c, r, s)``; ``B_g[(c, r, s), (n, p, q)]`` is the input value
  ``x[n, g*C/groups + c, p*sh - top + r*dh, q*sw - left + s*dw]``, zero in the padding.

``B_g`` is the im2col matrix, but it is never built: the packing routine reads its blocks
straight from the NCHW image. The five loops (names and sizes from :mod:`convlib.cpu.tables`)::

    for jc in 0..Ngemm step NC:            # columns (pixels) of this thread
      for pc in 0..Kgemm step KC:
        pack_b_from_image  -> Bc (KC x NC)   # implicit im2col
        for ic in 0..M step MC:            # rows (output channels) of this thread
          pack_a_from_filters -> Ac (MC x KC)
          for jr in 0..NC step NR:
            for ir in 0..MC step MR:
              micro_kernel: Y[ir:ir+MR, jr:jr+NR] (+)= Ac sliver @ Bc sliver

The seams are BLIS's: :mod:`convlib.cpu.packing` fills ``Ac`` and ``Bc`` (its docstring has the
layouts and the implicit im2col), :mod:`convlib.cpu.micro_kernels` multiplies one sliver of each
into a register tile and stores it straight into ``y``, and this module holds the loops and the
host side: the thread split, the workspace, the call.

Threads: one ``prange`` iteration per thread, each owning a rectangle of the ``M x Ngemm`` output
(of every group) and its own ``Ac``, ``Bc``, edge tile and packing tables, so the threads never
wait for each other: one parallel region per call, no barrier inside the loops (a ``prange`` per
``pc`` block would cost a fork/join hundreds of times per layer; with a shared ``Bc`` every
block would also need a barrier). :func:`thread_split` picks the rectangle grid (``m_parts x
n_parts``) that minimises the busiest thread's micro-tile FLOPs plus packing: columns for large
images (each thread packs only its own pixels; A is small and re-packed), rows when the image is
small (e.g. 7x7x512, where splitting 392 pixels would leave half-empty tiles; each thread then
packs all of B, which is small). Workspace: ``threads * (MC*KC + KC*NC + MR*NR)`` elements
(clipped to the problem) plus small int64 tables, whatever N, H, W are;
:meth:`~convlib.cpu.tables.BlisBlocking.workspace_bytes` reports exactly what
:func:`allocate_workspace` allocates.

Compile cost: the driver is specialised (``lru_cache``) on the register tile ``MR x NR`` of
:mod:`convlib.cpu.tables` and, through the array types, on the dtype; the cache block sizes,
shapes, strides, padding, dilation and groups are run-time values, so neither a new problem
shape nor new block sizes (``python -m convlib.tune`` tries several) cost a compile. Everything is
compiled with ``cache=True``. The micro-kernel and the A packer are generated
(:mod:`convlib.cpu.codegen`) and compiled into, and cached with, the driver that calls them; a new
process loads the driver from the disk cache (~1 s) instead of compiling it (~20-40 s per dtype
on the 2-core machine).
"""

from __future__ import annotations

import functools
from collections import namedtuple

import numpy as np
from numba import njit, prange, types
from numba.core.typing.typeof import typeof_impl

from ..core import output_cache
from ..core.problem import ConvProblem
from .micro_kernels import (
    ACCUMULATE, STORE, STORE_WITH_BIAS, micro_kernel, micro_kernel_columns, micro_kernel_split, store_edge_tile,
)
from .packing import (
    GATHERS, LINEAR, RUN_COLUMNS, TAP_COLUMNS, host_gather_lanes, pack_a_from_filters, pack_b_from_image,
    packing_route,
)
from .tables import KNOBS, VECTOR_SLACK_BYTES, BlisBlocking, blis_blocking
from .threads import thread_count

#: The sizes the kernels need, as one numba-friendly (homogeneous int) named tuple.
ConvGeometry = namedtuple(
    "ConvGeometry",
    "batch channels height width out_channels filter_h filter_w out_h out_w "
    "stride_h stride_w pad_top pad_left dil_h dil_w groups gemm_m gemm_k gemm_n",
)

#: Its numba type: 19 int64 fields, what numba's own typeof infers from the values.
GEOMETRY_TYPE = types.NamedUniTuple(types.int64, len(ConvGeometry._fields), ConvGeometry)


@typeof_impl.register(ConvGeometry)
def _typeof_geometry(value, context):
    # Without this, every kernel call types the tuple field by field through numba's Python-level
    # typeof (~15 us a call, 19 dispatches; 0.5 us with it): the digits CNN's training step took
    # 1.59-1.62 ms before, 1.47-1.53 after (Zen 5, examples/train_digits.py).
    return GEOMETRY_TYPE


@functools.lru_cache(maxsize=256)
def geometry_of(problem: ConvProblem) -> ConvGeometry:
    """The :class:`ConvGeometry` of ``problem`` (a value: one per problem, computed once)."""
    p = problem
    return ConvGeometry(
        p.N, p.C, p.H, p.W, p.K, p.R, p.S, p.P, p.Q, p.stride[0], p.stride[1],
        p.pad_top, p.pad_left, p.dilation[0], p.dilation[1], p.groups, p.gemm_m, p.gemm_k, p.gemm_n,
    )


def supports(problem: ConvProblem) -> str | None:
    """blis serves every valid problem."""
    return None


# ------------------------------------------------------------------------------------------
# The five loops
# ------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def part_of_tiles(size, tile, part, parts):
    """``(lo, hi)``: part ``part`` of ``parts`` of ``range(size)``, cut at whole tiles of ``tile``
    elements (one thread's share of a GEMM dimension; a part beyond the tiles is empty)."""
    tiles = (size + tile - 1) // tile
    return min(size, tiles * part // parts * tile), min(size, tiles * (part + 1) // parts * tile)


@functools.lru_cache(maxsize=None)
def blis_kernel(MR: int, NR: int):
    """The jitted driver for one register tile (any block sizes, dtype and problem shape).

    Only the register tile is compiled in: the micro-kernel's loops are unrolled over it. The
    cache block sizes ``MC`` and ``NC`` (and ``kc_step``) are run-time arguments, so that
    ``python -m convlib.tune`` can try block sizes without a compile each (~20-40 s).
    """

    @njit(parallel=True, cache=True)
    def blis_conv2d(
        x,  # IN  (N*C*H*W,) flat NCHW
        w,  # IN  (K*C/groups*R*S,) flat
        bias, has_bias,  # IN  (K,) or a dummy when has_bias is False
        geo,  # IN  ConvGeometry
        MC, NC,  # the ic and jc loops' steps (BlisBlocking)
        kc_step,  # the pc loop's step (<= KC), from BlisBlocking.panel_sizes
        m_parts, n_parts,  # the threads' grid over the (M x Ngemm) output of each group
        Ac_ws,  # SCRATCH (threads, >= mc*kc)
        Bc_ws,  # SCRATCH (threads, >= kc*nc)
        tile_ws,  # SCRATCH (threads, MR*NR)
        taps_ws,  # SCRATCH (threads, kc, TAP_COLUMNS) int64
        runs_ws,  # SCRATCH (threads, NR, RUN_COLUMNS) int64
        y,  # OUT (N*K*P*Q,) flat NCHW
    ):
        M, Kg, Ng = geo.gemm_m, geo.gemm_k, geo.gemm_n
        PQ = geo.out_h * geo.out_w
        K = geo.out_channels
        first_mode = STORE_WITH_BIAS if has_bias else STORE
        for t in prange(Ac_ws.shape[0]):
            Ac, Bc, tile, taps, runs = Ac_ws[t], Bc_ws[t], tile_ws[t], taps_ws[t], runs_ws[t]
            mp, np_ = t // n_parts, t % n_parts
            m_lo, m_hi = part_of_tiles(M, MR, mp, m_parts)
            n_lo, n_hi = part_of_tiles(Ng, NR, np_, n_parts)
            for g in range(geo.groups):
                for jc in range(n_lo, n_hi, NC):
                    nc = min(NC, n_hi - jc)
                    for pc in range(0, Kg, kc_step):
                        kc = min(kc_step, Kg - pc)
                        pack_b_from_image(x, geo, g, jc, nc, pc, kc, NR, taps, runs, Bc)
                        mode = first_mode if pc == 0 else ACCUMULATE
                        for ic in range(m_lo, m_hi, MC):
                            mc = min(MC, m_hi - ic)
                            pack_a_from_filters(w, g * M + ic, mc, pc, kc, Kg, Ac, MR)
                            for jr in range(0, nc, NR):
                                nr = min(NR, nc - jr)
                                col = jc + jr
                                n = col // PQ
                                pq = col - n * PQ
                                whole_columns = nr == NR and pq + NR <= PQ
                                # Whole columns running into the next image (and no further).
                                two_images = nr == NR and not whole_columns and pq + NR <= 2 * PQ
                                for ir in range(0, mc, MR):
                                    mr = min(MR, mc - ir)
                                    row = g * M + ic + ir
                                    if whole_columns and mr == MR:
                                        y_off = (n * K + row) * PQ + pq
                                        micro_kernel(kc, Ac, ir * kc, Bc, jr * kc, y, y_off, PQ, mode,
                                                     bias, row, MR, NR)
                                    elif two_images and mr == MR:
                                        micro_kernel_split(kc, Ac, ir * kc, Bc, jr * kc, y,
                                                           (n * K + row) * PQ + pq,
                                                           ((n + 1) * K + row) * PQ, PQ - pq, PQ,
                                                           mode, bias, row, MR, NR)
                                    else:
                                        micro_kernel_columns(kc, Ac, ir * kc, Bc, jr * kc, tile, 0, NR, STORE,
                                                             bias, 0, nr, MR, NR)
                                        store_edge_tile(tile, NR, geo, row, mr, col, nr, mode, bias, y)

    return blis_conv2d


# ------------------------------------------------------------------------------------------
# Host side
# ------------------------------------------------------------------------------------------
def image_pack_cost(problem: ConvProblem, NR: int) -> float:
    """FLOP-equivalents of packing one element of B from the image: a cost per element and one per
    run of pixels that a tap copies at once (an output row; a panel's pixels of one image when the
    packing is linear), spread over the run's elements; a flat cost per element where the panels
    are gathered (:func:`~convlib.cpu.packing.packs_by_gathers`), which cuts no runs."""
    p = problem
    route = packing_route(geometry_of(p), NR, host_gather_lanes(np.dtype(p.dtype).itemsize))
    if route == GATHERS:
        return KNOBS.blis_gather_pack_cost_flops
    run = min(NR, p.P * p.Q) if route == LINEAR else min(NR, p.Q)
    return KNOBS.blis_image_pack_cost_flops + KNOBS.blis_image_pack_run_cost_flops / run


def thread_split(problem: ConvProblem, blocking: BlisBlocking, threads: int) -> tuple[int, int]:
    """``(m_parts, n_parts)``, ``m_parts * n_parts == threads``: the grid of per-thread output
    rectangles that minimises the busiest thread's micro-kernel FLOPs plus packing."""
    b = blocking
    m_tiles = -(-problem.gemm_m // b.MR)
    n_tiles = -(-problem.gemm_n // b.NR)
    # Packing costs in FLOP-equivalents of micro-kernel work (knobs): a plain copy for A and for
    # B of a 1x1 stride-1 layer, more for B packed from the image.
    copy_cost = KNOBS.blis_pack_cost_flops
    # pack_b_from_image's plain-GEMM path (pack_b_pointwise) where the columns are the image.
    b_cost = copy_cost if problem.columns_are_the_image else image_pack_cost(problem, b.NR)
    best = None
    for m_parts in range(1, threads + 1):
        if threads % m_parts:
            continue
        n_parts = threads // m_parts
        rows = -(-m_tiles // m_parts) * b.MR
        cols = -(-n_tiles // n_parts) * b.NR
        k = problem.gemm_k
        compute = 2 * rows * cols * k
        cost = compute + b_cost * k * cols + copy_cost * rows * k * -(-cols // b.NC)
        if best is None or cost < best[0]:
            best = (cost, m_parts, n_parts)
    return best[1], best[2]


def allocate_workspace(problem: ConvProblem, blocking: BlisBlocking, threads: int, m_parts: int = 1,
                       n_parts: int = 1) -> dict:
    """The per-thread scratch arrays of the driver, in its argument order (``Ac_ws``, ``Bc_ws``,
    ``tile_ws``, ``taps_ws``, ``runs_ws``), each thread's panels sized for its share of the
    ``m_parts x n_parts`` grid; their bytes are ``blocking.workspace_bytes(problem, threads,
    m_parts, n_parts)``."""
    dtype = np.dtype(problem.dtype)
    mc, kc, nc = blocking.panel_sizes(problem, m_parts, n_parts)
    return {
        "Ac_ws": np.empty((threads, mc * kc), dtype),
        "Bc_ws": np.empty((threads, kc * nc + VECTOR_SLACK_BYTES // dtype.itemsize), dtype),
        "tile_ws": np.empty((threads, blocking.MR * blocking.NR), dtype),
        "taps_ws": np.empty((threads, kc, TAP_COLUMNS), np.int64),
        "runs_ws": np.empty((threads, blocking.NR, RUN_COLUMNS), np.int64),
    }


#: What a call computes in Python before its kernel: the partitions (each with its panels), the
#: blocking, the thread grid, the pc loop's step.
LaunchPlan = namedtuple("LaunchPlan", "partitions blocking m_parts n_parts kc_step geometry")


@KNOBS.cached
def launch_plan(problem: ConvProblem, threads: int) -> LaunchPlan:
    """The :class:`LaunchPlan` of ``problem`` on at most ``threads`` partitions (memoised on the
    knobs' state: a small layer's call would otherwise spend 5-10 us on it each time).

    There are no more partitions than register tiles of the output: every partition allocates its
    panels, busy or not, and a one-row piece of a call cut under a small workspace cap (5 tiles)
    took 16 workspaces with 16 threads, three times the cap.
    """
    b = blis_blocking(problem.dtype)
    tiles = -(-problem.gemm_m // b.MR) * -(-max(problem.gemm_n, 1) // b.NR)
    parts = max(1, min(threads, tiles))
    m_parts, n_parts = thread_split(problem, b, parts)
    return LaunchPlan(parts, b, m_parts, n_parts, b.panel_sizes(problem)[1], geometry_of(problem))


def partitions() -> int:
    """Work partitions a call may use: the ``blis_partitions`` knob, else numba's thread count
    (:func:`launch_plan` uses fewer on problems of fewer register tiles)."""
    return KNOBS.blis_partitions or thread_count()


def workspace_bytes(problem: ConvProblem, device=None) -> int:
    """Bytes of the packed panels a call allocates (independent of N, H and W)."""
    plan = launch_plan(problem, partitions())
    return plan.blocking.workspace_bytes(problem, plan.partitions, plan.m_parts, plan.n_parts)


def run(problem: ConvProblem, x, w, bias, device=None):
    """Convolution by the BLIS five-loop GEMM with implicit im2col (see the module docstring).

    Parameters
    ----------
    problem : ConvProblem
    x : numpy.ndarray, shape (N, C, H, W)
    w : numpy.ndarray, shape (K, C // groups, R, S)
    bias : numpy.ndarray, shape (K,), or None
    device : None
        Unused on the CPU.

    Returns
    -------
    numpy.ndarray, shape (N, K, P, Q)

    Notes
    -----
    Block sizes come from the ``blis_blocking`` knob and the number of work partitions from
    ``blis_partitions`` (:data:`convlib.cpu.tables.KNOBS`).
    """
    dtype = np.dtype(problem.dtype)
    if problem.N == 0:
        return np.empty(problem.y_shape, dtype)
    plan = launch_plan(problem, partitions())
    b = plan.blocking
    workspace = allocate_workspace(problem, b, plan.partitions, plan.m_parts, plan.n_parts)
    y = output_cache.empty(problem.y_shape, dtype)
    has_bias = bias is not None
    bias_arr = np.ascontiguousarray(bias, dtype) if has_bias else np.zeros(1, dtype)
    kernel = blis_kernel(b.MR, b.NR)
    kernel(
        np.ascontiguousarray(x, dtype).reshape(-1), np.ascontiguousarray(w, dtype).reshape(-1),
        bias_arr, has_bias, plan.geometry, b.MC, b.NC, plan.kc_step, plan.m_parts, plan.n_parts,
        *workspace.values(), y.reshape(-1),
    )
    return y
