"""Packing for the BLIS GEMM of :mod:`convlib.cpu.blis`: the filters into ``Ac`` panels and the
image straight into ``Bc`` panels (implicit im2col: the column matrix is never built).

* ``Ac``: ``MC/MR`` panels, each ``kc x MR``: element ``(ir + i, p)`` at
  ``(ir/MR)*MR*kc + p*MR + i``; the micro-kernel broadcasts ``MR`` consecutive values per step.
  :func:`pack_a_from_filters` is generated with its MR rows unrolled (7x faster than a loop).
* ``Bc``: ``NC/NR`` panels one after another, each ``kc x NR`` row-major: element
  ``(p, jr + j)`` at ``(jr/NR)*kc*NR + p*NR + j``; the micro-kernel reads one NR-row per
  reduction step with NR/lanes vector loads. :func:`pack_b_from_image` first tabulates the kc
  taps (channel plane, row and column offsets, and the output rows and columns that read inside
  the image), then fills the panels one by one: it cuts the panel's pixels into runs (pixels of
  one output row; or, when the input address is linear in the pixel index -- stride 1 and
  ``W == Q``, the 'same' layers -- all the panel's pixels of one image), and for every tap copies
  each run's clipped in-image range with whole 32-byte vector moves and zero-fills the rest: no
  per-element padding test, no division in the inner loops (stride-2 columns: two vector loads,
  even lanes shuffled into one store). The vector moves may write up to one vector past a run;
  the panels are written in an order where that spill is always overwritten later, and ``Bc`` has
  one vector of slack. With AVX-512 and output rows narrower than ``blis_gather_below_width``
  (7x7 to 14x14 outputs: runs of 7-14 pixels, each costing its clipping and a partial vector),
  :func:`pack_b_by_gathers` fills each panel row with masked 64-byte gathers instead, the
  padding masked off. 1x1 layers that read only inside the image have their own routines,
  :func:`pack_b_pointwise` (stride 1: a GEMM's packing) and :func:`pack_b_pointwise_strided`,
  which pack blocks of :data:`POINTWISE_TAP_BLOCK` taps at a time so that few channel streams
  are read at once.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit, types
from numba.extending import overload

from .codegen import PER_ROW, exec_function, render
from .clipping import positions_inside
from .intrinsics import copy_vector, copy_vector_stride2, gather_vector, vector_lanes, zero_vector
from .isa import simd_bytes
from .tables import KNOBS

#: Taps packed together by :func:`pack_b_pointwise`: that many channel streams read at once
#: (a compile-time knob of :data:`convlib.cpu.tables.KNOBS`).
POINTWISE_TAP_BLOCK = KNOBS.blis_pointwise_tap_block

_PACK_A_TEMPLATE = f'''
def pack_a_{{MR}}(w, row0, mc, pc, kc, gemm_k, Ac, MR):
    # Rows unrolled: the MR stores of one tap are contiguous, and MR streams of w are read.
    k = uintp(gemm_k)
    for ip in range((mc + {{MR}} - 1) // {{MR}}):
        panel = uintp(ip * {{MR}} * kc)
        src = uintp((row0 + ip * {{MR}}) * gemm_k + pc)
        if ip * {{MR}} + {{MR}} <= mc:
            for p in range(uintp(kc)):
                dst = panel + p * uintp({{MR}})
                Ac[dst + uintp({{i}})] = w[src + uintp({{i}}) * k + p]  {PER_ROW}
        else:  # the last, partial panel: rows past mc are zero
            for i in range({{MR}}):
                for p in range(kc):
                    row = ip * {{MR}} + i
                    Ac[panel + p * {{MR}} + i] = w[(row0 + row) * gemm_k + pc + p] if row < mc else 0
'''


@functools.lru_cache(maxsize=None)
def _pack_a_function(MR: int):
    return exec_function(render(_PACK_A_TEMPLATE, MR), f"pack_a_{MR}", {"uintp": np.uintp}, "blis")


def pack_a_from_filters(w, row0, mc, pc, kc, gemm_k, Ac, MR):
    """Pack rows ``row0 .. row0+mc`` and taps ``pc .. pc+kc`` of the filter matrix (``w`` flat,
    rows of ``gemm_k``) into ``Ac``: panels of ``kc x MR``, ``Ac[ip*MR*kc + p*MR + i] =
    w[(row0 + ip*MR + i)*gemm_k + pc + p]``, zero for rows past ``mc``. ``MR`` a compile-time
    constant, as for :func:`micro_kernel`. Callable from jitted code only."""
    raise NotImplementedError("pack_a_from_filters is called from numba-compiled code only")


@overload(pack_a_from_filters, prefer_literal=True)
def _pack_a_overload(w, row0, mc, pc, kc, gemm_k, Ac, MR):
    if not isinstance(MR, types.IntegerLiteral):
        return None
    return _pack_a_function(MR.literal_value)


@njit(cache=True, inline="always")
def fill_zeros_over(dst, start, count):
    """Zero ``dst[start : start + count]``, maybe writing up to one vector more."""
    lanes = vector_lanes(dst)
    for v in range((count + lanes - 1) // lanes):
        zero_vector(dst, start + v * lanes)


@njit(cache=True, inline="always")
def copy_run_over(src, src_start, src_step, dst, dst_start, count):
    """``dst[dst_start + t] = src[src_start + t*src_step]`` for ``t < count``, maybe writing up to
    one vector more. Whole vectors when ``src_step`` is 1 or 2 and they stay inside ``src``."""
    lanes = vector_lanes(dst)
    vectors = (count + lanes - 1) // lanes
    if src_step == 1 and src_start + vectors * lanes <= src.size:
        for v in range(vectors):
            copy_vector(dst, dst_start + v * lanes, src, src_start + v * lanes)
    elif src_step == 2 and src_start + 2 * vectors * lanes <= src.size:
        for v in range(vectors):
            copy_vector_stride2(dst, dst_start + v * lanes, src, src_start + 2 * v * lanes)
    else:
        s, d, step = np.uintp(src_start), np.uintp(dst_start), np.uintp(src_step)
        for t in range(np.uintp(count)):
            dst[d + t] = src[s + t * step]


#: Columns of the per-tap table of pack_b_from_image: the tap's channel plane, input row and
#: column offsets, the output columns [q_lo, q_hi) and rows [p_lo, p_hi) that read inside
#: the image, and the tap's filter row and column (r, s).
TAP_PLANE, TAP_ROW_OFFSET, TAP_COL_OFFSET, TAP_Q_LO, TAP_Q_HI, TAP_P_LO, TAP_P_HI, TAP_R, TAP_S = range(9)
TAP_COLUMNS = 9
#: Columns of the per-panel table of pixel runs of pack_b_from_image: the image's offset in x,
#: the output row and column of the run's first pixel, its length.
RUN_IMAGE, RUN_ROW, RUN_COL, RUN_LENGTH = range(4)
RUN_COLUMNS = 4


@njit(cache=True)
def pack_b_from_image(
    x,  # IN  (N * C * H * W,) the image, flat NCHW
    geo,  # IN  ConvGeometry
    group, jc, nc, pc, kc, NR,
    taps,  # SCRATCH (>= kc, TAP_COLUMNS) int64
    runs,  # SCRATCH (NR, RUN_COLUMNS) int64
    Bc,  # OUT (>= ceil(nc/NR)*kc*NR + one vector,) panels of kc x NR
):
    """Pack columns ``jc .. jc+nc`` (output pixels) and rows ``pc .. pc+kc`` (taps) of the
    implicit im2col matrix of ``group`` into ``Bc``, reading the image directly.

    First a table of the kc taps (``taps``), then panel by panel: the panel's pixels are cut into
    runs (``runs``), and every tap copies each run's part that reads inside the image and
    zero-fills the rest: clipped ranges, no per-element test, no division in the inner loops.

    Runs are pixels of one output row in general. When the input address is linear in the pixel
    index (stride 1 and ``W == Q``, e.g. 'same' padding), a run is all the panel's pixels of one
    image: one contiguous copy per image and tap, then the few padding columns of each output
    row are zeroed, instead of one short copy per output row (7 pixels on a 7x7 layer).
    """
    H, W, P, Q = geo.height, geo.width, geo.out_h, geo.out_w
    sh, sw = geo.stride_h, geo.stride_w
    plane = H * W
    image = geo.channels * plane
    PQ = P * Q
    channel0 = group * (geo.channels // geo.groups)
    route = packing_route(geo, NR, packing_gather_lanes(Bc))
    if route == POINTWISE:
        pack_b_pointwise(x, image, plane, channel0 + pc, jc, nc, kc, NR, Bc)
        return
    if route == POINTWISE_STRIDED:
        pack_b_pointwise_strided(x, image, plane, W, P, Q, sh, sw, channel0 + pc, jc, nc, kc, NR,
                                 runs, Bc)
        return
    linear = route == LINEAR
    tabulate_taps(geo, channel0, pc, kc, taps)
    if route == GATHERS:
        pack_b_by_gathers(x, geo, image, jc, nc, kc, NR, taps, Bc)
        return
    n = jc // PQ
    pq = jc - n * PQ
    for panel_start in range(0, nc, NR):
        width = min(NR, nc - panel_start)
        n_runs, n, pq = cut_into_runs(runs, n, pq, width, PQ, Q, image, linear)
        row_start = panel_start * kc  # row 0 of this panel
        for p in range(kc):
            dst = row_start + p * NR
            if linear:
                pack_tap_linear(x, W, Q, taps[p], runs, n_runs, Bc, dst)
            else:
                pack_tap_by_rows(x, H, W, sh, sw, taps[p], runs, n_runs, Bc, dst)
            if width < NR:  # zero the columns past nc in the last panel
                fill_zeros_over(Bc, dst + width, NR - width)


@njit(cache=True, inline="always")
def tabulate_taps(geo, channel0, first, count, taps):
    """Rows ``0 .. count`` of ``taps`` (``(>= count, TAP_COLUMNS)`` int64) describe taps
    ``first .. first + count`` (``(c, r, s)`` flat, within the group whose first input channel is
    ``channel0``): the channel plane's offset in an image, the input row and column offsets of
    output pixel ``(0, 0)``, and the output columns ``[q_lo, q_hi)`` and rows ``[p_lo, p_hi)``
    that read inside the image. The divisions happen here, once per tap, and not per run of
    pixels in the loops that read the table."""
    H, W, P, Q = geo.height, geo.width, geo.out_h, geo.out_w
    plane = H * W
    RS = geo.filter_h * geo.filter_w
    c = first // RS
    r = (first - c * RS) // geo.filter_w
    s = first - c * RS - r * geo.filter_w
    for p in range(count):
        row_off = r * geo.dil_h - geo.pad_top
        col_off = s * geo.dil_w - geo.pad_left
        taps[p, TAP_PLANE] = (channel0 + c) * plane
        taps[p, TAP_ROW_OFFSET] = row_off
        taps[p, TAP_COL_OFFSET] = col_off
        # Output columns q whose input column q*sw + col_off lies inside [0, W), rows likewise.
        taps[p, TAP_Q_LO], taps[p, TAP_Q_HI] = positions_inside(col_off, geo.stride_w, W, Q)
        taps[p, TAP_P_LO], taps[p, TAP_P_HI] = positions_inside(row_off, geo.stride_h, H, P)
        taps[p, TAP_R] = r
        taps[p, TAP_S] = s
        s += 1
        if s == geo.filter_w:
            s = 0
            r += 1
            if r == geo.filter_h:
                r = 0
                c += 1


@njit(cache=True, inline="always")
def packs_linear(sh, sw, W, Q, NR):
    """Whether :func:`pack_b_from_image` copies a panel's pixels of one image as one run (the
    input address is linear in the pixel index: stride 1 along rows and ``W == Q``). Worth it
    when a panel holds several output rows; otherwise the per-row clipping is cheaper."""
    return sw == 1 and sh * W == Q and Q < NR


#: Output rows narrower than this are packed by gathers where the machine has 64-byte ones
#: (a compile-time knob of :data:`convlib.cpu.tables.KNOBS`; see :func:`packs_by_gathers`).
GATHER_BELOW_WIDTH = KNOBS.blis_gather_below_width


def gather_lanes(array):
    """Lanes of one masked 64-byte gather for ``array``'s dtype. Compile-time constant; jitted
    code only. (:func:`pack_b_by_gathers` is compiled on every machine; it runs where
    :func:`packing_gather_lanes` is not 0.)"""
    raise NotImplementedError("gather_lanes is called from numba-compiled code only")


@overload(gather_lanes)
def _gather_lanes_overload(array):
    lanes = 64 // (array.dtype.bitwidth // 8)
    return lambda array: lanes


def packing_gather_lanes(array):
    """:func:`gather_lanes` where packing gathers (AVX-512), else 0: what :func:`packing_route`
    is given. Compile-time constant; jitted code only."""
    raise NotImplementedError("packing_gather_lanes is called from numba-compiled code only")


@overload(packing_gather_lanes)
def _packing_gather_lanes_overload(array):
    lanes = host_gather_lanes(array.dtype.bitwidth // 8)
    return lambda array: lanes


#: How :func:`pack_b_from_image` packs a problem (:func:`packing_route`).
POINTWISE, POINTWISE_STRIDED, LINEAR, GATHERS, BY_ROWS = range(5)


@njit(cache=True)
def packing_route(geo, NR, lanes):
    """Which routine :func:`pack_b_from_image` packs ``geo``'s B with, for panels ``NR`` wide
    and gathers of ``lanes`` (0: none): :data:`POINTWISE` (1x1, stride 1, unpadded: a GEMM's
    packing), :data:`POINTWISE_STRIDED` (1x1 reading only inside the image), :data:`LINEAR`
    (runs of whole images, :func:`packs_linear`), :data:`GATHERS` (:func:`packs_by_gathers`) or
    :data:`BY_ROWS`. Callable from Python too (the thread split weighs the cost of each)."""
    H, W, P, Q = geo.height, geo.width, geo.out_h, geo.out_w
    sh, sw = geo.stride_h, geo.stride_w
    if (geo.filter_h == 1 and geo.filter_w == 1 and sh == 1 and sw == 1
            and geo.pad_top == 0 and geo.pad_left == 0 and P * Q == H * W):
        return POINTWISE
    if (geo.filter_h == 1 and geo.filter_w == 1 and geo.pad_top == 0 and geo.pad_left == 0
            and (P - 1) * sh < H and (Q - 1) * sw < W):
        return POINTWISE_STRIDED
    if packs_linear(sh, sw, W, Q, NR):
        return LINEAR
    if packs_by_gathers(geo, NR, lanes):
        return GATHERS
    return BY_ROWS


def host_gather_lanes(itemsize: int) -> int:
    """:func:`gather_lanes` from Python: elements of ``itemsize`` bytes per 64-byte gather, or 0
    below AVX-512."""
    return 64 // itemsize if simd_bytes() >= 64 else 0


@njit(cache=True, inline="always")
def packs_by_gathers(geo, NR, lanes):
    """Whether :func:`pack_b_from_image` packs by gathers: the machine gathers 64-byte vectors
    (``lanes``), they tile a panel, the runs of one output row are short (each costs the
    by-rows routine its clipping and a partial vector), and a panel's offsets from its first
    image fit 32 bits."""
    span = min(NR, geo.batch) * geo.channels * geo.height * geo.width
    return lanes > 0 and NR % lanes == 0 and geo.out_w < GATHER_BELOW_WIDTH and span < 2**31


@njit(cache=True, inline="always")
def pack_b_by_gathers(x, geo, image, jc, nc, kc, NR, taps, Bc):
    """:func:`pack_b_from_image` by masked gathers, one 64-byte vector of a panel row at a time.

    Per panel, the offset of each pixel's input (tap ``(0, 0)`` of channel 0) from the panel's
    first image, and per filter row ``r`` and column ``s`` a bit mask of the pixels whose input
    row (column) lies inside the image; a tap's row of the panel is then ``x[base + offset]``
    under the mask ``rows[r] & cols[s]``, 0 in the padding. No run is cut, clipped or
    zero-filled: on 7- and 14-pixel rows the by-rows routine spends 0.55-0.89 ns an element,
    this one 0.35-0.39 whatever the width (one Intel Xeon core; docs/benchmarks.md, session 39).
    """
    H, W, P, Q = geo.height, geo.width, geo.out_h, geo.out_w
    sh, sw = geo.stride_h, geo.stride_w
    R, S = geo.filter_h, geo.filter_w
    PQ = P * Q
    lanes = gather_lanes(Bc)
    vectors = NR // lanes
    offsets = np.empty(NR, np.int32)
    rows = np.empty((R, vectors), np.int64)
    cols = np.empty((S, vectors), np.int64)
    n = jc // PQ
    pq = jc - n * PQ
    for panel_start in range(0, nc, NR):
        width = min(NR, nc - panel_start)
        n0 = n
        rows[:, :] = 0
        cols[:, :] = 0
        oh = pq // Q
        ow = pq - oh * Q
        for j in range(NR):
            if j >= width:
                offsets[j] = 0  # masked off: the columns past nc are zero
                continue
            offsets[j] = (n - n0) * image + oh * sh * W + ow * sw
            v, bit = j // lanes, np.int64(1) << (j % lanes)
            for r in range(R):
                ih = oh * sh + r * geo.dil_h - geo.pad_top
                if ih >= 0 and ih < H:
                    rows[r, v] |= bit
            for t in range(S):
                iw = ow * sw + t * geo.dil_w - geo.pad_left
                if iw >= 0 and iw < W:
                    cols[t, v] |= bit
            ow += 1
            if ow == Q:
                ow = 0
                oh += 1
                if oh == P:
                    oh = 0
                    n += 1
        pq = oh * Q + ow
        base0 = n0 * image
        for p in range(kc):
            dst = panel_start * kc + p * NR
            base = base0 + taps[p, TAP_PLANE] + taps[p, TAP_ROW_OFFSET] * W + taps[p, TAP_COL_OFFSET]
            r, t = taps[p, TAP_R], taps[p, TAP_S]
            for v in range(vectors):
                gather_vector(Bc, dst + v * lanes, x, base, offsets, v * lanes, rows[r, v] & cols[t, v], lanes)


@njit(cache=True, inline="always")
def cut_into_runs(runs, n, pq, width, PQ, Q, image, linear):
    """Cut ``width`` consecutive output pixels, from pixel ``pq`` of image ``n`` on, into runs of
    one output row (of one image when ``linear``): ``runs[i]`` = the image's offset in x, the
    first pixel's output row and column, the length. Returns ``(runs used, n, pq)``, ``n`` and
    ``pq`` advanced past the pixels."""
    n_runs = 0
    done = 0
    while done < width:
        oh = pq // Q
        ow = pq - oh * Q
        run = min(PQ - pq if linear else Q - ow, width - done)
        runs[n_runs, RUN_IMAGE] = n * image
        runs[n_runs, RUN_ROW] = oh
        runs[n_runs, RUN_COL] = ow
        runs[n_runs, RUN_LENGTH] = run
        n_runs += 1
        done += run
        pq += run
        if pq == PQ:
            pq = 0
            n += 1
    return n_runs, n, pq


@njit(cache=True, inline="always")
def pack_b_pointwise(x, image, plane, first_channel, jc, nc, kc, NR, Bc):
    """:func:`pack_b_from_image` for a 1x1, stride-1, unpadded convolution, where B's row ``p`` is
    channel ``first_channel + p`` of the images, pixel after pixel: a plain GEMM packing.

    Blocks of :data:`POINTWISE_TAP_BLOCK` taps, panels inside, taps innermost: a few channel
    streams that the prefetcher follows, each panel written in runs of a block's rows, no
    per-tap bookkeeping. (The general routine, one short copy per panel and tap with its
    clipping, packed ResNet-50's 1x1 layers at 0.6-2.1 ns per element, 10-150% of the
    micro-kernel's time on them; all taps outer and panels inner wrote ``Bc`` at a stride of
    ``kc * NR`` elements, 32 KiB for ``kc = 256``, and thrashed L1's sets.)
    """
    lanes = vector_lanes(Bc)
    for p0 in range(0, kc, POINTWISE_TAP_BLOCK):
        p1 = min(kc, p0 + POINTWISE_TAP_BLOCK)
        n = jc // plane
        pq = jc - n * plane
        for panel_start in range(0, nc, NR):
            width = min(NR, nc - panel_start)
            row0 = panel_start * kc
            if width == NR and pq + NR <= plane:  # whole panel inside one image: vector copies
                src = n * image + first_channel * plane + pq
                for p in range(p0, p1):
                    for v in range(NR // lanes):
                        copy_vector(Bc, row0 + p * NR + v * lanes, x, src + p * plane + v * lanes)
                pq += NR
                if pq == plane:
                    pq = 0
                    n += 1
            elif width == NR and NR - (plane - pq) <= plane:  # the panel spans two images
                head = plane - pq
                src = n * image + first_channel * plane + pq
                tail = NR - head
                whole = tail // lanes * lanes
                for p in range(p0, p1):
                    # The head copy may write up to a vector past its end, which the tail copy
                    # then overwrites; the tail is copied in whole vectors and then element by
                    # element, so that nothing is written past the row (the next panel's rows
                    # of earlier tap blocks are already packed).
                    dst = row0 + p * NR
                    copy_run_over(x, src + p * plane, 1, Bc, dst, head)
                    tail_src = src + image - pq + p * plane
                    copy_run_over(x, tail_src, 1, Bc, dst + head, whole)
                    for t in range(whole, tail):
                        Bc[dst + head + t] = x[tail_src + t]
                pq = NR - head
                n += 1
                if pq == plane:
                    pq = 0
                    n += 1
            else:
                for p in range(p0, p1):
                    n_t, pq_t = n, pq
                    dst = row0 + p * NR
                    for t in range(width):
                        Bc[dst + t] = x[n_t * image + (first_channel + p) * plane + pq_t]
                        pq_t += 1
                        if pq_t == plane:
                            pq_t = 0
                            n_t += 1
                    if width < NR:
                        fill_zeros_over(Bc, dst + width, NR - width)
                pq += width
                while pq >= plane:
                    pq -= plane
                    n += 1


@njit(cache=True, inline="always")
def pack_b_pointwise_strided(x, image, plane, W, P, Q, sh, sw, first_channel, jc, nc, kc, NR, runs,
                             Bc):
    """:func:`pack_b_from_image` for a 1x1 convolution whose pixels all read inside the image
    (no padding on the top and left, none used on the bottom and right), any stride: the
    projection shortcuts (1x1, stride 2) of ResNets.

    B's row ``p`` is channel ``first_channel + p`` read at a stride. As in
    :func:`pack_b_pointwise`, blocks of :data:`POINTWISE_TAP_BLOCK` taps with panels inside and
    taps innermost, so that a few channel streams are read at a time (the general routine, every
    tap of a panel in turn, read up to KC channel planes at once and packed these layers at
    1.3 ns per element); each panel's pixels are cut into runs of one output row once per block
    (:func:`cut_into_runs`; ``runs``' first column then holds the run's first input address), and
    copied with :func:`copy_run_over`.
    """
    PQ = P * Q
    for p0 in range(0, kc, POINTWISE_TAP_BLOCK):
        p1 = min(kc, p0 + POINTWISE_TAP_BLOCK)
        n = jc // PQ
        pq = jc - n * PQ
        for panel_start in range(0, nc, NR):
            width = min(NR, nc - panel_start)
            n_runs, n, pq = cut_into_runs(runs, n, pq, width, PQ, Q, image, False)
            for i in range(n_runs):  # the runs' first input addresses, channel first_channel
                runs[i, RUN_IMAGE] += (first_channel * plane + runs[i, RUN_ROW] * sh * W
                                       + runs[i, RUN_COL] * sw)
            row0 = panel_start * kc
            lanes = vector_lanes(Bc)
            for p in range(p0, p1):
                dst = row0 + p * NR
                row_end = dst + NR
                for i in range(n_runs):
                    run = runs[i, RUN_LENGTH]
                    src = runs[i, RUN_IMAGE] + p * plane
                    if p == kc - 1 and dst + (run + lanes - 1) // lanes * lanes > row_end:
                        # The panel's last row: what a vector writes past it would land in the
                        # next panel's first rows, packed by the first block of taps already.
                        whole = run - run % lanes
                        copy_run_over(x, src, sw, Bc, dst, whole)
                        for t in range(whole, run):
                            Bc[dst + t] = x[src + t * sw]
                    else:
                        copy_run_over(x, src, sw, Bc, dst, run)
                    dst += run
                if width < NR:
                    fill_zeros_over(Bc, dst, NR - width)


@njit(cache=True, inline="always")
def pack_tap_by_rows(x, H, W, sh, sw, tap, runs, n_runs, Bc, dst):
    """One tap's row of a Bc panel, from runs of pixels within one output row."""
    tap_plane, row_off, col_off = tap[TAP_PLANE], tap[TAP_ROW_OFFSET], tap[TAP_COL_OFFSET]
    q_lo, q_hi = tap[TAP_Q_LO], tap[TAP_Q_HI]
    for i in range(n_runs):
        run = runs[i, RUN_LENGTH]
        ih = runs[i, RUN_ROW] * sh + row_off
        if ih < 0 or ih >= H:
            fill_zeros_over(Bc, dst, run)
        else:
            q0 = runs[i, RUN_COL]
            lo = min(run, max(0, q_lo - q0))
            hi = max(lo, min(run, q_hi - q0))
            if lo > 0:
                fill_zeros_over(Bc, dst, lo)
            copy_run_over(x, runs[i, RUN_IMAGE] + tap_plane + ih * W + (q0 + lo) * sw + col_off, sw,
                          Bc, dst + lo, hi - lo)
            if hi < run:
                fill_zeros_over(Bc, dst + hi, run - hi)
        dst += run


@njit(cache=True, inline="always")
def pack_tap_linear(x, W, Q, tap, runs, n_runs, Bc, dst):
    """One tap's row of a Bc panel when the input address is ``pixel + const`` (stride 1,
    ``W == Q``), from runs of pixels within one image."""
    tap_plane, row_off, col_off = tap[TAP_PLANE], tap[TAP_ROW_OFFSET], tap[TAP_COL_OFFSET]
    q_lo, q_hi = tap[TAP_Q_LO], tap[TAP_Q_HI]
    pix_lo, pix_hi = tap[TAP_P_LO] * Q, tap[TAP_P_HI] * Q  # pixels of the rows inside the image
    for i in range(n_runs):
        run = runs[i, RUN_LENGTH]
        pq0 = runs[i, RUN_ROW] * Q + runs[i, RUN_COL]
        src = runs[i, RUN_IMAGE] + tap_plane + pq0 + row_off * W + col_off  # address of pixel pq0
        a = min(run, max(0, pix_lo - pq0))
        b = max(a, min(run, pix_hi - pq0))
        # Reads outside x can only be padding columns (zeroed below): clip them off.
        a_in = min(b, max(a, -src))
        b_in = max(a_in, min(b, x.size - src))
        if a_in > 0:
            fill_zeros_over(Bc, dst, a_in)
        copy_run_over(x, src + a_in, 1, Bc, dst + a_in, b_in - a_in)
        if b_in < run:
            fill_zeros_over(Bc, dst + b_in, run - b_in)
        if q_lo > 0 or q_hi < Q:
            # The copy read the neighbouring row's pixels for the padding columns: zero them.
            pos = a
            ow = runs[i, RUN_COL] if a == 0 else 0
            while pos < b:
                in_row = min(Q - ow, b - pos)
                for t in range(pos, pos + min(in_row, q_lo - ow)):
                    Bc[dst + t] = 0
                for t in range(pos + max(0, q_hi - ow), pos + in_row):
                    Bc[dst + t] = 0
                pos += in_row
                ow = 0
        dst += run
