"""The backward passes by the BLIS five-loop GEMM (numba, CPU): ``blis``.

:data:`DATA` (``conv2d_backward_data``, ``conv_transpose2d``)
-------------------------------------------------------------

Per group ``g`` the column matrix of ``dx`` is a GEMM, ``Cols_g (Cg*R*S x N*P*Q) = W_g^T
(Cg*R*S x Kg) @ dY_g (Kg x N*P*Q)``: row ``(c, r, s)`` and column ``(n, p, q)`` of it is what tap
``(r, s)`` of output pixel ``(n, p, q)`` sends back to input channel ``c``, at the position the
forward convolution read, ``(p*sh - top + r*dh, q*sw - left + s*dw)``. The column matrix is never
built. The loops are those of :mod:`convlib.cpu.blis` with its micro-kernel
(:mod:`convlib.cpu.micro_kernels`):

* ``B = dY_g`` is packed by the plain-GEMM packer (:func:`~convlib.cpu.packing.pack_b_pointwise`:
  ``dy``'s channels are the rows, its pixels the columns, as a 1x1 layer's image);
* ``A = W_g^T`` by :func:`pack_a_transposed`: the ``MR`` values of one reduction step (``MR``
  consecutive taps ``(c, r, s)`` of one filter) are contiguous in ``w``;
* the micro-kernel's ``MR x NR`` tile goes to a per-thread buffer, and :func:`add_tile_to_image`
  adds it into ``dx``: col2im folded into the store, row by row of the tile and in runs of one
  output row of pixels, each run a strided (stride 1: contiguous) add into one input row. At
  stride 1 with ``Q == W`` (a "same" layer) a tile row is one contiguous add per image, its
  values that wrap into a neighbouring row zeroed first (:func:`_add_tile_rows_whole`): on
  8x8 images the runs of 8 had cost more than the GEMM.

``dx`` starts as the bias (``conv_transpose2d``) or zero. Two threads add into the same ``dx``
element only if they hold taps of the same input channel and pixels of the same image, so each
thread owns a rectangle of whole channels by whole images (:func:`thread_grid`): no atomics, no
per-thread copy of ``dx``. Workspace: per thread ``Ac`` (mc x kc), ``Bc`` (kc x nc), one
``MR x NR`` tile and the table of an ``ic`` block's taps (mc rows of
:func:`~convlib.cpu.packing.tabulate_taps`, so the store decodes no tap), whatever N, H and W are.


:data:`WEIGHT` (``conv2d_backward_weight``)
-------------------------------------------
Per group, ``dW_g (Kg x Cg*R*S) = dY_g (Kg x N*P*Q) @ Cols_g^T (N*P*Q x Cg*R*S)``: the reduction
runs over every output pixel of the batch, so the batch is summed inside the GEMM (no per-image
product, no per-image workspace). Both operands are packed straight from the tensors:

* ``A = dY_g`` by :func:`pack_a_from_gradient`: a filter's pixels are contiguous in ``dy``, so
  each of the ``MR`` rows of a panel is a contiguous read (across image boundaries in runs);
* ``B = Cols_g^T`` by :func:`pack_b_transposed_from_image`: column ``j`` of a panel is tap
  ``(c, r, s)``, row ``p`` a pixel; each tap is a strided read of ``x`` along an output row (the
  forward's implicit im2col, transposed), zero where it reads padding;
* the micro-kernel accumulates its ``MR x NR`` tile straight into ``dw`` (rows of ``Cg*R*S``),
  through the edge tile only at the borders of ``dW``.

The threads split ``dW_g`` into rectangles (filters x taps) when it has enough register tiles, and
the reduction (the batch's pixels) when it has few (a depthwise or single-filter layer): each
reduction part then sums into its own copy of ``dw``, and the copies are added in a fixed order
afterwards (deterministic; :func:`weight_thread_grid` weighs the extra copies against the
imbalance). Workspace: the panels per thread plus those copies, ``(parts - 1) * K*Cg*R*S``
elements at most, whatever N, H, W are. The long reduction is blocked: each ``kc`` block sums in
registers before it is added into ``dw``, so a float32 sum over ``N*P*Q`` products carries the
error of about ``kc + N*P*Q/kc`` additions, not of ``N*P*Q``.

With at least ``blis_weight_taps_min_filters`` filters per group (:data:`KNOBS`; every layer but a
depthwise one) the pass runs in **taps form** (:func:`backward_weight_taps_kernel`), the transposed
GEMM ``dW_g^T (Cg*R*S x Kg) = Cols_g (Cg*R*S x N*P*Q) @ dY_g^T``, with nothing packed from ``x``:

* a tile is ``MR`` taps by ``NR`` filters, the ``MR`` taps being ``MR`` channels at one filter
  position ``(r, s)``: they share which output pixels reach inside the image, so the tile's
  reduction runs over clipped row runs of pixels, and its ``A`` values are broadcasts read in place
  from ``MR`` channel planes of ``x`` (:func:`~convlib.cpu.micro_kernels.taps_micro_kernel`). No
  im2col value is ever written: packing ``Cols^T`` tap by tap, one scalar per element, was the
  outer-product form's cost, and the inner-product form's lane sums and L2 traffic its own;
* ``B = dY_g^T``: a block of ``blis_weight_taps_pixels`` output pixels (whole rows) of ``dy`` is
  transposed into pixel-major panels of ``NR`` filters (:func:`transpose_gradient_block`, ``L x L``
  vector transposes), and each panel is reread from L1/L2 by every tap block;
* each tile sums one pixel block in registers and stores (first block) or adds its ``MR x NR``
  sums into ``dW^T``, which :func:`transpose_taps_kernel` turns into ``dw`` at the end. The threads
  split the filter panels (each transposing only its own filters) when there are at least two per
  thread, else the tap blocks.

Workspace: per thread one block's panels (``blis_weight_taps_pixels`` x ``Kg``, rounded up to
``NR``), plus ``dW^T`` (the size of ``dw``). The float32 sums carry the error of about
``blis_weight_taps_pixels + N*P*Q/blis_weight_taps_pixels`` additions.

Below that many filters, for images of at least ``blis_weight_dot_min_pixels`` output pixels the same
GEMM runs in inner-product form (:func:`backward_weight_dot_kernel`): the reduction over pixels is the
vectorised one. Both operands are packed pixel-major by the forward's vector packers, ``x``'s
taps by :func:`~convlib.cpu.packing.pack_b_from_image` and ``dy``'s filters by
:func:`~convlib.cpu.packing.pack_b_pointwise` (no transposition), and
:func:`~convlib.cpu.micro_kernels.dot_micro_kernel` keeps one vector accumulator per ``dW`` entry
of its ``MR x NT`` tile, summed across its lanes once per block of pixels. Packing ``Cols^T`` tap
by tap (one scalar per element) is what the outer-product form spends most on where ``Kg`` is
small and the images large; the lane sums are what the inner-product form spends most on where
the images are small (14x14, 7x7), hence the threshold.

Compile cost: one driver per pass (and form), register tile and dtype, cached on disk; block
sizes and shapes are run-time values. The taps form compiles its micro-kernel for 1 to ``NR/L``
vectors (a group's last filter panel may be narrower), and for ``MR`` and ``ceil(MR/2)`` rows (the
second for groups of at most that many channels, such as an RGB stem).
"""

from __future__ import annotations

import functools
from collections import namedtuple

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from ..core.problem import ConvProblem
from .blis import geometry_of, image_pack_cost, part_of_tiles, partitions
from .clipping import positions_inside
from .im2col_backward import fill_channels
from .isa import host_isa
from .intrinsics import transpose_block, vector_add_into
from .micro_kernels import (
    ACCUMULATE, STORE, dot_micro_kernel, micro_kernel, micro_kernel_columns, micro_kernel_lanes, taps_micro_kernel,
)
from .packing import (
    RUN_COLUMNS, TAP_COL_OFFSET, TAP_COLUMNS, TAP_P_HI, TAP_P_LO, TAP_PLANE, TAP_Q_HI, TAP_Q_LO, TAP_ROW_OFFSET,
    pack_b_from_image, pack_b_pointwise, tabulate_taps,
)
from .tables import KNOBS, VECTOR_SLACK_BYTES, blis_blocking

#: The GEMM the blocking is sized for (``BlisBlocking.panel_sizes`` reads these fields).
GemmShape = namedtuple("GemmShape", "gemm_m gemm_k gemm_n itemsize")


def gemm_shape(problem: ConvProblem) -> GemmShape:
    """The per-group GEMM of the backward data pass: ``Cg*R*S`` rows, reduction ``Kg``,
    ``N*P*Q`` columns."""
    return GemmShape(problem.C_per_group * problem.R * problem.S, problem.K_per_group,
                     problem.N * problem.P * problem.Q, problem.itemsize)


@njit(cache=True, inline="always")
def pack_a_transposed(w, first_filter, row0, mc, kc, taps, Ac, MR):
    """Pack rows ``row0 .. row0+mc`` (taps ``(c, r, s)``) and reduction steps ``first_filter ..
    + kc`` (filters) of ``W^T`` into ``Ac`` (panels of ``kc x MR``, as the micro-kernel reads
    them): ``Ac[ip*MR*kc + p*MR + i] = w[(first_filter + p)*taps + row0 + ip*MR + i]``, zero for
    rows past ``mc``."""
    for ip in range((mc + MR - 1) // MR):
        panel = ip * MR * kc
        rows = min(MR, mc - ip * MR)
        for p in range(kc):
            # Unsigned indices: no negative-index test per element.
            src = np.uintp((first_filter + p) * taps + row0 + ip * MR)
            dst = np.uintp(panel + p * MR)
            for i in range(np.uintp(rows)):
                Ac[dst + i] = w[src + i]
            for i in range(np.uintp(rows), np.uintp(MR)):
                Ac[dst + i] = 0


def add_run(dst, dst_start, src, src_start, count):
    """``dst[dst_start : dst_start + count] += src[src_start : src_start + count]`` in whole
    32-byte vectors, then element by element. (LLVM's own vector loop steps four vectors at a
    time: a tile row's run of 24 or 32 values on 8x8 images went mostly through its scalar
    remainder.) Callable from jitted code only."""
    raise NotImplementedError("add_run is called from numba-compiled code only")


@overload(add_run)
def _add_run_overload(dst, dst_start, src, src_start, count):
    L = VECTOR_SLACK_BYTES // (dst.dtype.bitwidth // 8)

    def add_run_impl(dst, dst_start, src, src_start, count):
        whole = count - count % L
        for v in range(0, whole, L):
            vector_add_into(dst, dst_start + v, src, src_start + v, L)
        for t in range(whole, count):
            dst[np.uintp(dst_start + t)] += src[np.uintp(src_start + t)]

    return add_run_impl


@njit(cache=True, inline="always")
def _add_tile_rows_whole(tile, NR, geo, taps, tap0, mr, col0, nr, n_first, q_first, dx):
    """:func:`add_tile_to_image` at stride 1 with ``Q == W``: pixel ``pq`` of an image (flat,
    ``p*Q + q``) reads tap ``(r, s)`` at flat ``pq + row_off*W + off`` of its input plane, so a
    tile row is one contiguous add per image, not one per output row. The tile's values whose
    column falls outside the image are zeroed first: their place in the run is in a neighbouring
    row of the same plane (this thread's), to which they add nothing. The run is clipped to the
    rows inside the image and to the plane itself."""
    H, W, P, Q = geo.height, geo.width, geo.out_h, geo.out_w
    PQ = P * Q
    image = geo.channels * H * W
    for i in range(mr):
        tap = taps[tap0 + i]
        row_off, off = tap[TAP_ROW_OFFSET], tap[TAP_COL_OFFSET]
        q_in_lo, q_in_hi = tap[TAP_Q_LO], tap[TAP_Q_HI]
        if q_in_lo > 0 or q_in_hi < Q:
            first_row = -q_first  # tile column of the current output row's q = 0
            while first_row < nr:
                for q in range(q_in_lo):
                    j = first_row + q
                    if j >= 0 and j < nr:
                        tile[i * NR + j] = 0
                for q in range(q_in_hi, Q):
                    j = first_row + q
                    if j >= 0 and j < nr:
                        tile[i * NR + j] = 0
                first_row += Q
        shift = row_off * W + off
        lo_limit = max(tap[TAP_P_LO] * Q, -shift)
        hi_limit = min(tap[TAP_P_HI] * Q, H * W - shift)
        n = n_first
        pq = col0 - n_first * PQ
        done = 0
        while done < nr:
            seg = min(nr - done, PQ - pq)
            lo = max(pq, lo_limit)
            hi = min(pq + seg, hi_limit)
            if hi > lo:  # lo + shift >= 0 by the clipping
                add_run(dx, n * image + tap[TAP_PLANE] + lo + shift, tile, i * NR + done + lo - pq, hi - lo)
            done += seg
            pq = 0
            n += 1


@njit(cache=True, inline="always")
def add_tile_to_image(tile, NR, geo, taps, tap0, mr, col0, nr, dx):
    """col2im of one tile: ``tile[i*NR + j]`` (the tap in row ``tap0 + i`` of ``taps``, a table of
    :func:`~convlib.cpu.packing.tabulate_taps`; pixel ``col0 + j``) is added to ``dx`` (flat
    NCHW) at the input position that tap read for that pixel; taps that read padding send
    nothing.

    Row by row of the tile, each tap read from the table (decoding it per tile, three integer
    divisions and two clippings a row, took most of the store's time: 0.3 ms of the digits CNN's
    0.45 ms 16->32 data pass, Zen 3), then its runs of pixels in one output row are added,
    each a strided (stride 1: vectorised) add into one input row."""
    H, W, P, Q = geo.height, geo.width, geo.out_h, geo.out_w
    sh, sw = geo.stride_h, geo.stride_w
    PQ = P * Q
    image = geo.channels * H * W
    n_first = col0 // PQ
    p_first = (col0 - n_first * PQ) // Q
    q_first = col0 - n_first * PQ - p_first * Q
    if sh == 1 and sw == 1 and Q == W:
        _add_tile_rows_whole(tile, NR, geo, taps, tap0, mr, col0, nr, n_first, q_first, dx)
        return
    for i in range(mr):
        tap = taps[tap0 + i]
        row_off, off = tap[TAP_ROW_OFFSET], tap[TAP_COL_OFFSET]
        q_in_lo, q_in_hi = tap[TAP_Q_LO], tap[TAP_Q_HI]
        n, p, q0 = n_first, p_first, q_first
        done = 0
        while done < nr:  # runs of pixels in one output row
            run = min(nr - done, Q - q0)
            h = p * sh + row_off
            if h >= 0 and h < H:
                q_lo = max(q0, q_in_lo)
                q_hi = min(q0 + run, q_in_hi)
                base = n * image + tap[TAP_PLANE] + h * W + off
                src = i * NR + done - q0
                if sw == 1:  # vectors (a scalar col2im cost as much as the micro-kernel when Kg is 64)
                    add_run(dx, base + q_lo, tile, src + q_lo, max(0, q_hi - q_lo))
                else:
                    for q in range(q_lo, q_hi):
                        dx[np.uintp(base + q * sw)] += tile[np.uintp(src + q)]
            done += run
            q0 = 0
            p += 1
            if p == P:
                p = 0
                n += 1


@functools.lru_cache(maxsize=None)
def backward_data_kernel(MR: int, NR: int):
    """The jitted driver for one register tile (any block sizes, dtype and shape)."""

    @njit(parallel=True, cache=True)
    def blis_backward_data(
        dy,  # IN  (N*K*P*Q,) flat NCHW
        w,  # IN  (K*Cg*R*S,) flat
        geo,  # IN  the forward ConvGeometry
        MC, NC, kc_step,  # block sizes (BlisBlocking.panel_sizes of gemm_shape)
        m_parts, n_parts,  # the threads' grid: whole channels x whole images
        Ac_ws, Bc_ws, tile_ws,  # SCRATCH per thread
        taps_ws,  # SCRATCH (threads, >= mc, TAP_COLUMNS) int64: the taps of an ic block
        dx,  # INOUT (N*C*H*W,) flat NCHW, holding the bias or zero
    ):
        RS = geo.filter_h * geo.filter_w
        Cg = geo.channels // geo.groups
        Kg = geo.gemm_m
        taps = geo.gemm_k  # Cg*R*S: the rows of W^T
        PQ = geo.out_h * geo.out_w
        image = geo.out_channels * PQ
        C = geo.channels
        pointwise = (RS == 1 and geo.stride_h == 1 and geo.stride_w == 1 and geo.pad_top == 0
                     and geo.pad_left == 0 and PQ == geo.height * geo.width)
        for t in prange(Ac_ws.shape[0]):
            Ac, Bc, tile, taps_table = Ac_ws[t], Bc_ws[t], tile_ws[t], taps_ws[t]
            mp, np_ = t // n_parts, t % n_parts
            m_lo = Cg * mp // m_parts * RS
            m_hi = Cg * (mp + 1) // m_parts * RS
            n_lo = geo.batch * np_ // n_parts * PQ
            n_hi = geo.batch * (np_ + 1) // n_parts * PQ
            for g in range(geo.groups):
                for jc in range(n_lo, n_hi, NC):
                    nc = min(NC, n_hi - jc)
                    for pc in range(0, Kg, kc_step):
                        kc = min(kc_step, Kg - pc)
                        pack_b_pointwise(dy, image, PQ, g * Kg + pc, jc, nc, kc, NR, Bc)
                        for ic in range(m_lo, m_hi, MC):
                            mc = min(MC, m_hi - ic)
                            pack_a_transposed(w, g * Kg + pc, ic, mc, kc, taps, Ac, MR)
                            tabulate_taps(geo, g * Cg, ic, mc, taps_table)
                            for jr in range(0, nc, NR):
                                nr = min(NR, nc - jr)
                                col = jc + jr
                                n = col // PQ
                                pq = col - n * PQ
                                # A 1x1 stride-1 unpadded layer's tile is a block of dx itself
                                # (taps are channels, pixels are positions): added in place.
                                in_place = pointwise and nr == NR and pq + NR <= PQ
                                for ir in range(0, mc, MR):
                                    mr = min(MR, mc - ir)
                                    if in_place and mr == MR:
                                        micro_kernel(kc, Ac, ir * kc, Bc, jr * kc, dx,
                                                     (n * C + g * Cg + ic + ir) * PQ + pq, PQ, ACCUMULATE, tile, 0,
                                                     MR, NR)
                                    else:
                                        micro_kernel_columns(kc, Ac, ir * kc, Bc, jr * kc, tile, 0, NR, STORE, tile,
                                                             0, nr, MR, NR)
                                        add_tile_to_image(tile, NR, geo, taps_table, ir, mr, col, nr, dx)

    return blis_backward_data


def thread_grid(problem: ConvProblem, threads: int) -> tuple[int, int]:
    """``(m_parts, n_parts)``: images split among as many threads as divide evenly (each thread
    then packs only its own pixels), the rest split the channels of every group."""
    n_parts = max(d for d in range(1, threads + 1) if threads % d == 0 and d <= max(problem.N, 1))
    return threads // n_parts, n_parts


class _BlisData:
    """The implementation contract of the blis backward data pass (see the module docstring)."""

    def supports(self, problem: ConvProblem) -> str | None:
        """blis serves every valid problem."""
        return None

    def workspace_bytes(self, problem: ConvProblem, device=None) -> int:
        """Bytes of the packed panels and an ic block's tap table: O(MC*KC + KC*NC) per thread,
        independent of N, H, W."""
        b = blis_blocking(problem.dtype)
        mc, kc, nc = b.panel_sizes(gemm_shape(problem))
        per_thread = ((mc * kc + kc * nc + b.MR * b.NR) * problem.itemsize + VECTOR_SLACK_BYTES
                      + mc * TAP_COLUMNS * 8)
        return partitions() * per_thread

    def run(self, problem: ConvProblem, dy, w, bias, device=None):
        p = problem
        dtype = np.dtype(p.dtype)
        b = blis_blocking(p.dtype)
        threads = partitions()
        mc, kc, nc = b.panel_sizes(gemm_shape(p))
        Ac_ws = np.empty((threads, mc * kc), dtype)
        Bc_ws = np.empty((threads, kc * nc + VECTOR_SLACK_BYTES // dtype.itemsize), dtype)
        tile_ws = np.empty((threads, b.MR * b.NR), dtype)
        taps_ws = np.empty((threads, mc, TAP_COLUMNS), np.int64)
        m_parts, n_parts = thread_grid(p, threads)
        dx = np.empty(p.x_shape, dtype)
        has_bias = bias is not None
        fill_channels(dx, bias if has_bias else np.zeros(1, dtype), has_bias)
        backward_data_kernel(b.MR, b.NR)(
            dy.reshape(-1), w.reshape(-1), geometry_of(p), b.MC, b.NC, kc, m_parts, n_parts,
            Ac_ws, Bc_ws, tile_ws, taps_ws, dx.reshape(-1))
        return dx


#: ``conv2d_backward_data`` (and ``conv_transpose2d``) by the BLIS GEMM with col2im in its store.
DATA = _BlisData()


# ------------------------------------------------------------------------------------------
# WEIGHT: dW_g = dY_g @ Cols_g^T
# ------------------------------------------------------------------------------------------
def weight_gemm_shape(problem: ConvProblem, reduction_parts: int = 1) -> GemmShape:
    """The per-group GEMM of the backward weight pass: ``Kg`` rows, a reduction over the
    batch's pixels (``N*P*Q``, cut into ``reduction_parts``), ``Cg*R*S`` columns."""
    pixels = problem.N * problem.P * problem.Q
    return GemmShape(problem.K_per_group, max(1, -(-pixels // reduction_parts)),
                     problem.C_per_group * problem.R * problem.S, problem.itemsize)


@njit(cache=True, inline="always")
def pack_a_from_gradient(dy, K, PQ, first_filter, mc, pixel0, kc, Ac, MR):
    """Pack rows ``first_filter .. + mc`` (filters) and reduction steps ``pixel0 .. + kc``
    (pixels ``(n, p, q)`` of the batch) of ``dY`` into ``Ac`` (panels of ``kc x MR``):
    ``Ac[ip*MR*kc + t*MR + i] = dy[n, first_filter + ip*MR + i, pq]`` for pixel ``pixel0 + t``,
    zero for rows past ``mc``. A filter's pixels are contiguous within an image, so every row
    is read in runs that end only at image boundaries."""
    n = pixel0 // PQ
    pq = pixel0 - n * PQ
    done = 0
    while done < kc:
        run = min(kc - done, PQ - pq)
        for ip in range((mc + MR - 1) // MR):
            dst0 = ip * MR * kc + done * MR
            rows = min(MR, mc - ip * MR)
            # Unsigned indices: no negative-index test in the copies.
            for i in range(rows):
                src = np.uintp((n * K + first_filter + ip * MR + i) * PQ + pq)
                dst = np.uintp(dst0 + i)
                for t in range(np.uintp(run)):
                    Ac[dst + t * np.uintp(MR)] = dy[src + t]
            for i in range(rows, MR):
                for t in range(np.uintp(run)):
                    Ac[np.uintp(dst0 + i) + t * np.uintp(MR)] = 0
        done += run
        pq = 0
        n += 1


@njit(cache=True, inline="always")
def fill_strided(Bc, start, count, stride, value):
    """``Bc[start + t*stride] = value`` for ``t < count`` (unsigned indices: no negative-index
    test)."""
    first, step = np.uintp(start), np.uintp(stride)
    for t in range(np.uintp(count)):
        Bc[first + t * step] = value


@njit(cache=True, inline="always")
def copy_strided(x, src_start, src_step, Bc, dst_start, dst_step, count):
    """``Bc[dst_start + t*dst_step] = x[src_start + t*src_step]`` for ``t < count``, unsigned
    indices (both starts are inside their arrays)."""
    src, dst = np.uintp(src_start), np.uintp(dst_start)
    s_step, d_step = np.uintp(src_step), np.uintp(dst_step)
    for t in range(np.uintp(count)):
        Bc[dst + t * d_step] = x[src + t * s_step]


@njit(cache=True, inline="always")
def pack_b_transposed_from_image(x, geo, group, tap0, nc, pixel0, kc, NR, Bc):
    """Pack columns ``tap0 .. + nc`` (taps ``(c, r, s)`` of ``group``) and reduction steps
    ``pixel0 .. + kc`` (output pixels of the batch) of ``Cols_g^T`` into ``Bc`` (panels of
    ``kc x NR``): ``Bc[jp*NR*kc + t*NR + j]`` is the input value that tap ``tap0 + jp*NR + j``
    reads for pixel ``pixel0 + t``, zero in the padding and for columns past ``nc``.

    Tap by tap, in runs of one output row: each run's in-image part is a strided read of one
    input row (stride ``sw``), its padding parts are zero-filled; no per-element test."""
    H, W, P, Q = geo.height, geo.width, geo.out_h, geo.out_w
    sh, sw = geo.stride_h, geo.stride_w
    S = geo.filter_w
    RS = geo.filter_h * S
    plane = H * W
    image = geo.channels * plane
    PQ = P * Q
    channel0 = group * (geo.channels // geo.groups)
    n_first = pixel0 // PQ
    oh_first = (pixel0 - n_first * PQ) // Q
    ow_first = pixel0 - n_first * PQ - oh_first * Q
    for jp in range((nc + NR - 1) // NR):
        width = min(NR, nc - jp * NR)
        panel = jp * NR * kc
        for j in range(NR):
            column = panel + j
            if j >= width:
                fill_strided(Bc, column, kc, NR, 0)
                continue
            tap = tap0 + jp * NR + j
            c = tap // RS
            r = (tap - c * RS) // S
            s = tap - c * RS - r * S
            row_off = r * geo.dil_h - geo.pad_top
            col_off = s * geo.dil_w - geo.pad_left
            tap_plane = (channel0 + c) * plane
            # Output columns q whose input column q*sw + col_off lies inside [0, W).
            q_lo, q_hi = positions_inside(col_off, sw, W, Q)
            n, oh, ow = n_first, oh_first, ow_first
            done = 0
            while done < kc:
                run = min(kc - done, Q - ow)
                ih = oh * sh + row_off
                out = column + done * NR
                if ih < 0 or ih >= H:
                    fill_strided(Bc, out, run, NR, 0)
                else:
                    lo = min(run, max(0, q_lo - ow))
                    hi = max(lo, min(run, q_hi - ow))
                    fill_strided(Bc, out, lo, NR, 0)
                    if hi > lo:
                        copy_strided(x, n * image + tap_plane + ih * W + (ow + lo) * sw + col_off, sw,
                                     Bc, out + lo * NR, NR, hi - lo)
                    fill_strided(Bc, out + hi * NR, run - hi, NR, 0)
                done += run
                ow = 0
                oh += 1
                if oh == P:
                    oh = 0
                    n += 1


@njit(cache=True, inline="always")
def add_tile(tile, NR, mr, nr, out, off, ldc):
    """``out[off + i*ldc + j] += tile[i*NR + j]`` for ``i < mr``, ``j < nr``: an edge tile of dW."""
    for i in range(mr):
        for j in range(nr):
            out[off + i * ldc + j] += tile[i * NR + j]


@functools.lru_cache(maxsize=None)
def backward_weight_kernel(MR: int, NR: int):
    """The jitted driver of the weight pass for one register tile (any block sizes, dtype and
    shape)."""

    @njit(parallel=True, cache=True)
    def blis_backward_weight(
        x,  # IN  (N*C*H*W,) flat NCHW
        dy,  # IN  (N*K*P*Q,) flat NCHW
        geo,  # IN  the forward ConvGeometry
        MC, NC, kc_step,  # block sizes (BlisBlocking.panel_sizes of weight_gemm_shape)
        m_parts, n_parts, r_parts,  # the threads' grid: filters x taps x the batch's pixels
        Ac_ws, Bc_ws, tile_ws,  # SCRATCH per thread
        partial,  # OUT (r_parts, K*Cg*R*S), zero: dw summed over each reduction part's pixels
    ):
        Kg = geo.gemm_m
        taps = geo.gemm_k  # Cg*R*S: the columns of dW_g
        K = geo.out_channels
        PQ = geo.out_h * geo.out_w
        pixels = geo.batch * PQ
        for t in prange(Ac_ws.shape[0]):
            Ac, Bc, tile = Ac_ws[t], Bc_ws[t], tile_ws[t]
            rp = t % r_parts
            np_ = t // r_parts % n_parts
            mp = t // (r_parts * n_parts)
            out = partial[rp]
            m_lo, m_hi = part_of_tiles(Kg, MR, mp, m_parts)
            n_lo, n_hi = part_of_tiles(taps, NR, np_, n_parts)
            r_lo, r_hi = part_of_tiles(pixels, 1, rp, r_parts)
            for g in range(geo.groups):
                for jc in range(n_lo, n_hi, NC):
                    nc = min(NC, n_hi - jc)
                    for pc in range(r_lo, r_hi, kc_step):
                        kc = min(kc_step, r_hi - pc)
                        pack_b_transposed_from_image(x, geo, g, jc, nc, pc, kc, NR, Bc)
                        for ic in range(m_lo, m_hi, MC):
                            mc = min(MC, m_hi - ic)
                            pack_a_from_gradient(dy, K, PQ, g * Kg + ic, mc, pc, kc, Ac, MR)
                            for jr in range(0, nc, NR):
                                nr = min(NR, nc - jr)
                                for ir in range(0, mc, MR):
                                    mr = min(MR, mc - ir)
                                    off = (g * Kg + ic + ir) * taps + jc + jr
                                    if mr == MR and nr == NR:
                                        micro_kernel(kc, Ac, ir * kc, Bc, jr * kc, out, off, taps, ACCUMULATE,
                                                     tile, 0, MR, NR)
                                    else:
                                        micro_kernel_columns(kc, Ac, ir * kc, Bc, jr * kc, tile, 0, NR, STORE, tile,
                                                             0, nr, MR, NR)
                                        add_tile(tile, NR, mr, nr, out, off, taps)

    return blis_backward_weight


@functools.lru_cache(maxsize=None)
def backward_weight_dot_kernel(MR: int, NT: int, NR: int):
    """The jitted driver of the weight pass in inner-product form for one tile ``MR x NT`` and
    pixel panel ``NR`` (any block sizes, dtype and shape)."""

    @njit(parallel=True, cache=True)
    def blis_backward_weight_dot(
        x,  # IN  (N*C*H*W,) flat NCHW
        dy,  # IN  (N*K*P*Q,) flat NCHW
        geo,  # IN  the forward ConvGeometry
        TC, NCP, FC,  # block sizes: taps, pixels (a multiple of NR), filters
        n_parts, r_parts,  # the threads' grid: taps x the batch's pixels
        Bx_ws, By_ws,  # SCRATCH per thread: pixel-major panels of x (TC x NCP) and dy (FC x NCP), + slack
        taps_ws, runs_ws,  # SCRATCH per thread: pack_b_from_image's tables
        partial,  # OUT (r_parts, K*Cg*R*S), zero: dw summed over each reduction part's pixels
    ):
        Kg = geo.gemm_m
        taps = geo.gemm_k
        K = geo.out_channels
        PQ = geo.out_h * geo.out_w
        pixels = geo.batch * PQ
        for t in prange(Bx_ws.shape[0]):
            Bx, By, tap_table, runs = Bx_ws[t], By_ws[t], taps_ws[t], runs_ws[t]
            rp = t % r_parts
            np_ = t // r_parts
            out = partial[rp]
            n_lo, n_hi = part_of_tiles(taps, NT, np_, n_parts)
            r_lo, r_hi = part_of_tiles(pixels, 1, rp, r_parts)
            for g in range(geo.groups):
                for jc in range(r_lo, r_hi, NCP):
                    ncp = min(NCP, r_hi - jc)
                    panels = (ncp + NR - 1) // NR
                    for tc in range(n_lo, n_hi, TC):
                        tcn = min(TC, n_hi - tc)
                        pack_b_from_image(x, geo, g, jc, ncp, tc, tcn, NR, tap_table, runs, Bx)
                        for fc in range(0, Kg, FC):
                            fcn = min(FC, Kg - fc)
                            pack_b_pointwise(dy, K * PQ, PQ, g * Kg + fc, jc, ncp, fcn, NR, By)
                            for i0 in range(0, fcn, MR):
                                for j0 in range(0, tcn, NT):
                                    dot_micro_kernel(panels, By, i0 * NR, fcn * NR, Bx, j0 * NR, tcn * NR, out,
                                                     (g * Kg + fc + i0) * taps + tc + j0, taps,
                                                     min(MR, fcn - i0), min(NT, tcn - j0), MR, NT, NR)

    return blis_backward_weight_dot


@functools.lru_cache(maxsize=None)
def backward_weight_taps_kernel(MR: int, NR: int, L: int):
    """The jitted driver of the weight pass in taps form for one tile ``MR x NR`` of ``dW^T`` with
    ``L``-lane vectors (any dtype of that width, block sizes and shape)."""
    # The last panel of filters may hold fewer vectors: one micro-kernel per width.
    NR3, NR2, NR1 = max(L, NR - L), max(L, NR - 2 * L), L

    @njit(parallel=True, cache=True)
    def blis_backward_weight_taps(
        x,  # IN  (N*C*H*W,) flat NCHW
        dy,  # IN  (N*K*P*Q,) flat NCHW
        geo,  # IN  the forward ConvGeometry
        block_rows,  # output rows (n, p) of the batch per pixel block
        split_filters,  # whether the threads split the filters' panels (else the tap blocks)
        dyt_ws,  # SCRATCH per thread, zero: the block's dy, pixel-major, in panels of NR filters
        rows_ws,  # SCRATCH per thread: the tile's channel-plane offsets (MR,)
        dwt,  # OUT (groups * Cg*R*S * Kp,): dW^T per group, rows of Kp filters
    ):
        Kg = geo.gemm_m
        taps = geo.gemm_k
        K, C, H, W = geo.out_channels, geo.channels, geo.height, geo.width
        P, Q, R, S = geo.out_h, geo.out_w, geo.filter_h, geo.filter_w
        sh, sw = geo.stride_h, geo.stride_w
        Cg = C // geo.groups
        Kp = (Kg + L - 1) // L * L
        PQ = P * Q
        HW = H * W
        c_blocks = (Cg + MR - 1) // MR
        tap_blocks = R * S * c_blocks
        all_rows = geo.batch * P
        panel = block_rows * Q * NR
        threads = dyt_ws.shape[0]
        for t in prange(threads):
            dyt, x_rows = dyt_ws[t], rows_ws[t]
            if split_filters:
                b_lo, b_hi = 0, tap_blocks
                k_lo, k_hi = part_of_tiles(Kg, NR, t, threads)
            else:
                b_lo, b_hi = part_of_tiles(tap_blocks, 1, t, threads)
                k_lo, k_hi = 0, Kg
            for g in range(geo.groups):
                for row0 in range(0, all_rows, block_rows):
                    rows = min(block_rows, all_rows - row0)
                    mode = STORE if row0 == 0 else ACCUMULATE
                    transpose_gradient_block(dy, K, PQ, P, Q, g * Kg, k_lo, k_hi, row0, rows, NR, panel, L, dyt)
                    for k0 in range(k_lo, k_hi, NR):
                        dyt_off = k0 // NR * panel
                        width = min(NR, (k_hi - k0 + L - 1) // L * L)
                        for b in range(b_lo, b_hi):
                            rs = b // c_blocks
                            c0 = (b - rs * c_blocks) * MR
                            r = rs // S
                            s = rs - r * S
                            for i in range(MR):  # rows past the group's channels reread its last one
                                x_rows[i] = (g * Cg + min(c0 + i, Cg - 1)) * HW
                            h_off = r * geo.dil_h - geo.pad_top
                            w_off = s * geo.dil_w - geo.pad_left
                            q0 = max(0, (sw - 1 - w_off) // sw)
                            q1 = max(q0, min(Q, (W - 1 - w_off) // sw + 1))
                            mr = min(MR, Cg - c0)
                            off = (g * taps + c0 * R * S + rs) * Kp + k0
                            ldw = R * S * Kp
                            if width == NR:
                                taps_micro_kernel(x, x_rows, dyt, dyt_off, NR, dwt, off, ldw, mr, row0, rows, P, Q, H, W,
                                                  C * HW, sh, sw, h_off, w_off, q0, q1, mode, MR, NR)
                            elif width == NR3:
                                taps_micro_kernel(x, x_rows, dyt, dyt_off, NR, dwt, off, ldw, mr, row0, rows, P, Q, H, W,
                                                  C * HW, sh, sw, h_off, w_off, q0, q1, mode, MR, NR3)
                            elif width == NR2:
                                taps_micro_kernel(x, x_rows, dyt, dyt_off, NR, dwt, off, ldw, mr, row0, rows, P, Q, H, W,
                                                  C * HW, sh, sw, h_off, w_off, q0, q1, mode, MR, NR2)
                            else:
                                taps_micro_kernel(x, x_rows, dyt, dyt_off, NR, dwt, off, ldw, mr, row0, rows, P, Q, H, W,
                                                  C * HW, sh, sw, h_off, w_off, q0, q1, mode, MR, NR1)

    return blis_backward_weight_taps


def transpose_gradient_block(dy, K, PQ, P, Q, k_base, k_lo, k_hi, row0, rows, NR, panel, L, dyt):
    """``dyt[k // NR * panel + pixel * NR + k % NR] = dy[n, k_base + k, p, q]`` for the filters
    ``k_lo <= k < k_hi`` (``k_lo`` a multiple of ``NR``) and the pixels of output rows ``row0 ..
    row0 + rows`` of the batch (``pixel = (n*P + p - row0)*Q + q``): ``L x L`` blocks by vector
    transposes, the edges one by one. ``L`` a compile-time constant dividing ``NR``. Callable from
    jitted code only."""
    raise NotImplementedError("transpose_gradient_block is called from numba-compiled code only")


@overload(transpose_gradient_block, prefer_literal=True)
def _transpose_gradient_block_overload(dy, K, PQ, P, Q, k_base, k_lo, k_hi, row0, rows, NR, panel, L, dyt):
    if not isinstance(L, types.IntegerLiteral):
        return None
    lanes = L.literal_value

    def transpose_gradient_block_impl(dy, K, PQ, P, Q, k_base, k_lo, k_hi, row0, rows, NR, panel, L, dyt):
        row = row0
        while row < row0 + rows:
            n = row // P
            p = row - n * P
            image_rows = min(P - p, row0 + rows - row)  # the block's rows in this image: one run of dy
            count = image_rows * Q
            src0 = (n * K + k_base) * PQ + p * Q
            dst0 = (row - row0) * Q * NR
            whole = count - count % lanes
            k_whole = k_hi - (k_hi - k_lo) % lanes
            for k in range(k_lo, k_whole, lanes):
                dst = k // NR * panel + dst0 + k % NR
                for j in range(0, whole, lanes):
                    transpose_block(dyt, dst + j * NR, NR, dy, src0 + k * PQ + j, PQ, lanes)
                for j in range(whole, count):
                    for kk in range(lanes):
                        dyt[dst + j * NR + kk] = dy[src0 + (k + kk) * PQ + j]
            for k in range(k_whole, k_hi):
                dst = k // NR * panel + dst0 + k % NR
                for j in range(count):
                    dyt[dst + j * NR] = dy[src0 + k * PQ + j]
            row += image_rows

    return transpose_gradient_block_impl


@functools.lru_cache(maxsize=None)
def transpose_taps_kernel(L: int):
    """The jitted transposition of the taps form's ``dW^T`` back to the filters' layout, ``L x L``
    blocks by vector transposes."""

    @njit(parallel=True, cache=True)
    def transpose_taps(dwt, Kg, taps, groups, dw):
        """``dw[g*Kg + k, t] = dwt[(g*taps + t)*Kp + k]``, ``Kp`` being ``Kg`` rounded up to ``L``."""
        Kp = (Kg + L - 1) // L * L
        k_whole = Kg - Kg % L
        chunks = (taps + L - 1) // L
        for item in prange(groups * chunks):
            g = item // chunks
            t0 = (item - g * chunks) * L
            t_end = min(taps, t0 + L)
            src = g * taps * Kp
            dst = g * Kg * taps
            k_from = 0
            if t_end - t0 == L:
                for k in range(0, k_whole, L):
                    transpose_block(dw, dst + k * taps + t0, taps, dwt, src + t0 * Kp + k, Kp, L)
                k_from = k_whole
            for t in range(t0, t_end):
                for k in range(k_from, Kg):
                    dw[dst + k * taps + t] = dwt[src + t * Kp + k]

    return transpose_taps


@njit(parallel=True, cache=True)
def sum_parts(partial, dw):  # OUT dw (size,): partial[0] + partial[1] + ..., in that order
    parts = partial.shape[0]
    for e in prange(dw.size):
        total = partial[0, e]
        for rp in range(1, parts):
            total += partial[rp, e]
        dw[e] = total


def weight_thread_grid(problem: ConvProblem, blocking, threads: int) -> tuple[int, int, int]:
    """``(m_parts, n_parts, r_parts)``, their product ``threads``: the grid over filters x taps x
    the batch's pixels that minimises the busiest thread's micro-kernel FLOPs, its packing, and
    (for ``r_parts > 1``) the sum of the per-part copies of ``dw``."""
    b = blocking
    p = problem
    m_tiles = -(-p.K_per_group // b.MR)
    n_tiles = -(-(p.C_per_group * p.R * p.S) // b.NR)
    pixels = max(1, p.N * p.P * p.Q)
    copy_cost = KNOBS.blis_pack_cost_flops
    image_cost = image_pack_cost(p, b.NR)
    dw_size = p.K * p.C_per_group * p.R * p.S
    best = None
    for r_parts in range(1, threads + 1):
        if threads % r_parts:
            continue
        for m_parts in range(1, threads // r_parts + 1):
            if (threads // r_parts) % m_parts:
                continue
            n_parts = threads // r_parts // m_parts
            rows = -(-m_tiles // m_parts) * b.MR
            cols = -(-n_tiles // n_parts) * b.NR
            k = -(-pixels // r_parts)
            per_group = 2 * rows * cols * k + image_cost * k * cols + copy_cost * rows * k * -(-cols // b.NC)
            cost = p.groups * per_group + (copy_cost * r_parts * dw_size if r_parts > 1 else 0)
            if best is None or cost < best[0]:
                best = (cost, m_parts, n_parts, r_parts)
    return best[1], best[2], best[3]


def weight_form(problem: ConvProblem) -> str:
    """The form the weight pass runs in: ``"taps"``, ``"inner"`` (inner products) or ``"outer"``
    (outer products); see the module docstring."""
    if problem.K_per_group >= KNOBS.blis_weight_taps_min_filters:
        return "taps"
    return "inner" if problem.P * problem.Q >= KNOBS.blis_weight_dot_min_pixels else "outer"


TapsLayout = namedtuple("TapsLayout", "MR NR L block_rows split_filters dyt_size dwt_size")


@KNOBS.cached
def taps_layout(problem: ConvProblem, threads: int) -> TapsLayout:
    """The taps form's tile, pixel blocks, thread split and workspace sizes (elements), once
    per problem, thread count and knob state."""
    p = problem
    b = blis_blocking(p.dtype)
    L = micro_kernel_lanes(b.MR, b.NR, p.itemsize)
    rows = max(1, p.N * p.P)
    block_rows = max(1, KNOBS.blis_weight_taps_pixels // max(1, p.Q))
    block_rows = -(-rows // -(-rows // block_rows))  # the same number of blocks, evenly filled
    panels = -(-p.K_per_group // b.NR)
    Kp = -(-p.K_per_group // L) * L
    # Few channels (an RGB stem) take the half-height tile: rows past the channels are wasted FMAs.
    MR = b.MR if p.C_per_group > (b.MR + 1) // 2 else (b.MR + 1) // 2
    return TapsLayout(
        MR=MR, NR=b.NR, L=L, block_rows=block_rows,
        # each thread transposes the filters it computes: all of them when the threads split the taps
        split_filters=panels >= 2 * threads,
        dyt_size=panels * block_rows * p.Q * b.NR, dwt_size=p.groups * p.gemm_k * Kp)


def dot_layout(problem: ConvProblem, blocking, threads: int):
    """``(MR, NT), (TC, NCP, FC), (n_parts, r_parts)`` of the inner-product form: the threads
    split the taps when there are enough tiles of them, else the batch's pixels."""
    MR, NT = KNOBS.lookup("blis_weight_dot_tile", host_isa())
    TC, NCP, FC = KNOBS.blis_weight_dot_blocks
    NCP = -(-NCP // blocking.NR) * blocking.NR
    taps = problem.C_per_group * problem.R * problem.S
    n_parts = threads if taps >= 2 * NT * threads else 1
    return (MR, NT), (TC, NCP, FC), (n_parts, threads // n_parts)


def _dot_workspace(problem: ConvProblem, blocking, threads: int):
    """Element counts ``(Bx, By)`` per thread: the panels plus a tile's rows of slack (the
    micro-kernel reads whole MR and NT rows at the block's edge) and one vector (packing)."""
    (MR, NT), (TC, NCP, FC), _ = dot_layout(problem, blocking, threads)
    slack = (MR + NT) * blocking.NR + VECTOR_SLACK_BYTES // problem.itemsize
    return TC * NCP + slack, FC * NCP + slack


class _BlisWeight:
    """The implementation contract of the blis backward weight pass (see the module docstring).

    Either form is a kernel that sums into ``r_parts`` zeroed copies of ``dw`` (``dw`` itself
    when the reduction is not split); :meth:`run` adds the copies in order.
    """

    def supports(self, problem: ConvProblem) -> str | None:
        """blis serves every valid problem."""
        return None

    def _outer_products(self, problem: ConvProblem):
        """``(panel bytes, r_parts, launch)`` of the outer-product form; ``launch(x, dy,
        partial)`` runs it."""
        p = problem
        dtype = np.dtype(p.dtype)
        b = blis_blocking(p.dtype)
        threads = partitions()
        m_parts, n_parts, r_parts = weight_thread_grid(p, b, threads)
        mc, kc, nc = b.panel_sizes(weight_gemm_shape(p, r_parts))
        panel_bytes = threads * ((mc * kc + kc * nc + b.MR * b.NR) * p.itemsize + VECTOR_SLACK_BYTES)

        def launch(x, dy, partial):
            backward_weight_kernel(b.MR, b.NR)(
                x.reshape(-1), dy.reshape(-1), geometry_of(p), b.MC, b.NC, kc, m_parts, n_parts, r_parts,
                np.empty((threads, mc * kc), dtype), np.empty((threads, kc * nc), dtype),
                np.empty((threads, b.MR * b.NR), dtype), partial)

        return panel_bytes, r_parts, launch

    def _inner_products(self, problem: ConvProblem):
        """``(panel bytes, r_parts, launch)`` of the inner-product form."""
        p = problem
        dtype = np.dtype(p.dtype)
        b = blis_blocking(p.dtype)
        threads = partitions()
        (MR, NT), (TC, NCP, FC), (n_parts, r_parts) = dot_layout(p, b, threads)
        bx, by = _dot_workspace(p, b, threads)
        panel_bytes = threads * ((bx + by) * p.itemsize + (TC * TAP_COLUMNS + b.NR * RUN_COLUMNS) * 8)

        def launch(x, dy, partial):
            backward_weight_dot_kernel(MR, NT, b.NR)(
                x.reshape(-1), dy.reshape(-1), geometry_of(p), TC, NCP, FC, n_parts, r_parts,
                np.zeros((threads, bx), dtype), np.zeros((threads, by), dtype),
                np.empty((threads, TC, TAP_COLUMNS), np.int64), np.empty((threads, b.NR, RUN_COLUMNS), np.int64),
                partial)

        return panel_bytes, r_parts, launch

    def _form(self, problem: ConvProblem):
        return (self._inner_products if weight_form(problem) == "inner" else self._outer_products)(problem)

    def workspace_bytes(self, problem: ConvProblem, device=None) -> int:
        """Bytes of the packed panels per thread, and of the per-part copies of ``dw`` when the
        reduction is split (or of ``dW^T`` in taps form): independent of N and H."""
        p = problem
        if weight_form(p) == "taps":
            threads = partitions()
            layout = taps_layout(p, threads)
            return (threads * layout.dyt_size + layout.dwt_size) * p.itemsize + threads * layout.MR * 8
        panel_bytes, r_parts, _ = self._form(p)
        copies = r_parts * p.K * p.gemm_k if r_parts > 1 else 0
        return panel_bytes + copies * p.itemsize

    def _run_taps(self, problem: ConvProblem, x, dy):
        p = problem
        dtype = np.dtype(p.dtype)
        threads = partitions()
        layout = taps_layout(p, threads)
        dwt = np.empty(layout.dwt_size, dtype)
        backward_weight_taps_kernel(layout.MR, layout.NR, layout.L)(
            x.reshape(-1), dy.reshape(-1), geometry_of(p), layout.block_rows, layout.split_filters,
            np.zeros((threads, layout.dyt_size), dtype), np.empty((threads, layout.MR), np.int64), dwt)
        dw = np.empty(p.w_shape, dtype)
        transpose_taps_kernel(layout.L)(dwt, p.K_per_group, p.gemm_k, p.groups, dw.reshape(-1))
        return dw

    def run(self, problem: ConvProblem, x, dy, device=None):
        p = problem
        if p.N * p.P * p.Q == 0:
            return np.zeros(p.w_shape, p.dtype)
        if weight_form(p) == "taps":
            return self._run_taps(p, x, dy)
        dw = np.zeros(p.w_shape, p.dtype)
        _, r_parts, launch = self._form(p)
        partial = dw.reshape(1, -1) if r_parts == 1 else np.zeros((r_parts, dw.size), p.dtype)
        launch(x, dy, partial)
        if r_parts > 1:
            sum_parts(partial, dw.reshape(-1))
        return dw


#: ``conv2d_backward_weight`` by the BLIS GEMM, both operands packed from the tensors.
WEIGHT = _BlisWeight()
