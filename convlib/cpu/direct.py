"""Direct convolution on the CPU: the 7-loop definition, register-blocked and vectorised.

How the loops are organised
---------------------------
The input is read through *source planes* of ``Ws`` columns in which every filter tap is a
plain shift: zero padding added, split into stride phases (plane ``(c, a, b)`` holds padded rows
``a, a + sh, ...`` and columns ``b, b + sw, ...``), keeping only the phases the filter touches.
In those planes output ``(p, q)`` and tap ``(c, r, s)`` read element
``(p + r*dh // sh, q + s*dw // sw)`` of plane ``(c, r*dh % sh, s*dw % sw)``: every stride,
dilation and padding becomes stride 1. Where the planes come from depends on the input's size
(knobs ``direct_in_place_max_bytes``, by default no limit, and ``direct_whole_input_max_bytes``,
half the last-level cache, at most 16 MiB: a virtual machine reports its host's whole L3):

* ``"in place"``: stride 1, no padding and an input of at most ``direct_in_place_max_bytes``: the
  planes are ``x`` itself;
* ``"whole"``: a small input otherwise: :func:`gather_source_planes` builds the planes of every
  image once per call, in parallel, and every work item reads them from cache;
* ``"per item"``: a large input: each work item gathers the rows it needs into a buffer of its
  thread (about ``direct_l2_input_budget``, see below) and reads them from L2 for every tap and
  output channel. No copy of the tensor is made, and the input is read once from memory. For an
  unpadded input that pays on some machines only: the tight copy loop streamed it faster than the
  taps' loads on Zen 5 (N=8, C=K=4, 1024^2: 10.3 against 12.5 ms in place, an earlier kernel),
  slower on a Zen 4 and the Xeon host (in place 0.69-0.91x the time); ``python -m convlib.tune``
  measures both.

Output positions are numbered along *wide rows* of pitch ``Ws``: position ``j = p*Ws + q``
(columns ``q >= Q`` are computed and thrown away). Tap ``t = (c, r, s)`` reads
``xs[base + offset[t] + j]`` for every ``j``: one contiguous run per tap however the output rows
wrap, so a block of ``QB`` consecutive positions is ``QB / lanes`` vector loads per tap even when
``Q`` is 7 or 56. ``(c, r, s)`` is flattened into one loop over the precomputed ``offset`` table.
Images at least a few blocks wide are instead cut *row by row* (blocks never wrap; the last block
of a row is shifted back to end at the row's end), which keeps every block's stores inside one
row and, when the row allows, on whole cache lines.

The register block is ``KB`` output channels x ``QB`` positions, held in a stack accumulator
(:func:`convlib.cpu.stack_buffer.stack_array_1d`) that LLVM keeps in vector registers (checked
in the assembly: one ``vfmadd231ps`` per accumulator per tap, no stack traffic in the tap loop).
The tap loop is written with explicit vectors of the widest registers
(:func:`convlib.cpu.intrinsics.vector_fma`; zmm on every AVX-512 machine): left to the loop
vectoriser, numba 0.68's LLVM built the 3x64 block with half its accumulators on the Xeon host
(1.7x the time on ResNet-50's 7x7 layer), and on Zen 5 the explicit form took 0.59-1.0x the time of
the vectorised loop (stem 0.69x, 14x14 and 7x7 3x3 layers 0.76-0.79x, the seed shape 0.91x). On the
Xeon, whose loop vectoriser prefers ymm, the zmm blocks took 0.65-0.74x the time of the ymm ones
it had used (0.90x on an RGB 1080p layer).
Per tap it costs ``QB / lanes`` vector loads of ``x``, ``KB`` weight broadcasts and
``KB * QB / lanes`` FMAs; the weights are packed as ``(group, K-block, tap, KB)`` so one tap's
``KB`` weights are adjacent. Only the tap loop is a loop: unrolling taps or rows in the body
would pass the ~250 memory accesses beyond which LLVM stops keeping the block in registers.
A block that lies inside one output row is stored straight from the registers (with the bias);
one that wraps rows is copied to a second stack tile and scattered row piece by row piece. The
last block of a band is shifted back to end at the band's last position (it recomputes a few
outputs) so that no read leaves the band; images shorter than one block are always gathered,
into planes with a zero tail.

Outputs larger than half the last-level cache (knob ``direct_stream_min_bytes``) are written with
non-temporal stores wherever a block's row starts on a cache line (the first block of a row is
placed so the rest do): a plain store first reads the line it writes (a third more memory
traffic), and the output could not stay in cache for its reader anyway. On the seed shape
(N=8, C=K=4, 1024^2, 3x3, padding 1) the whole-tensor padded copy and plain stores took 21 ms;
per-item gathering and streaming stores 9 ms (Zen 5, 2 threads).

Work items and threads: an item is ``(group, range of K-blocks, images, band of output rows)``.
Small images go several to an item, whole; large ones are cut into bands of rows; either way the
item's input fits the ``direct_l2_input_budget`` knob, and every
K-block of the range sweeps the whole item before the next K-block starts, so the input is reused
from L2 while one K-block's weights stay in L1. :func:`schedule` splits K into ranges only when
there would otherwise be too few items for the threads (N=1, K=4 still gives both threads
work), then cuts more bands. Items are taken from an atomic counter, one at a time, by one worker
per thread (``prange`` over the workers): numba's OpenMP layer splits a ``prange`` statically,
and on a shared machine a preempted thread would otherwise hold the other one up at the end of
the region. Problems under the ``direct_serial_below_flops`` knob run on one thread: waking the
others would cost more than it saves.

Block sizes are data (the ``direct_blockings`` knob of :mod:`convlib.cpu.tables`, one row per
instruction set and dtype); :func:`choose_blocking` weighs each candidate's padded work (K
rounded up to ``KB``, positions to whole blocks) by its measured speed.

What a new shape costs
----------------------
Kernels are specialised on ``(dtype, KB, QB)`` only, compiled once per machine
(``cache=True``, a few seconds each; one table of four or five blocks per dtype applies here);
N, C, H, W, K, R, S, stride, dilation, padding and groups are runtime values. A new shape costs
no compilation, only the offset table, the weight packing and the schedule.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import njit, prange, set_num_threads

from ..core import output_cache
from .intrinsics import copy_row, store_fence, vector_fma, vector_stream_plus, zero_row
from .stack_buffer import stack_array_1d, stack_array_2d
from .tables import KNOBS, DirectBlocking, direct_blockings, direct_vector_bytes
from .threads import thread_count
from .work_queue import fetch_and_increment


# ------------------------------------------------------------------------------------------
# Geometry of the source planes
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Planes:
    """Where each tap of a problem reads, in the source planes (see the module docstring)."""

    phases_h: tuple  # padded-row phases a (r*dh % sh) the filter touches, sorted
    phases_w: tuple  # padded-column phases b
    halo: int  # plane rows a band reads below its last output row: (R-1)*dh // sh
    Ws: int  # columns per plane: the pitch of a wide output row
    source: str  # "in place" (x itself), "whole" (gathered once per call), "per item"

    @property
    def planes_per_channel(self) -> int:
        return len(self.phases_h) * len(self.phases_w)

    def whole_elements(self, problem) -> int:
        """Elements of the planes of every image, gathered whole ("whole")."""
        return problem.N * problem.C * self.planes_per_channel * (problem.P + self.halo) * self.Ws


def _planes(problem, block: DirectBlocking) -> _Planes:
    """The source planes of ``problem`` run by ``block``. A block along the channels reads them
    in place or gathered by each work item (its items hold whole images where they fit), never
    gathered whole beforehand: the gathering then shares the item's parallel region."""
    QB = block.QB
    sh, sw = problem.stride
    dh, dw = problem.dilation
    P, Q = problem.P, problem.Q
    phases_h = tuple(sorted({(r * dh) % sh for r in range(problem.R)}))
    phases_w = tuple(sorted({(s * dw) % sw for s in range(problem.S)}))
    halo = ((problem.R - 1) * dh) // sh
    Ws = Q + ((problem.S - 1) * dw) // sw
    wide_length = (P - 1) * Ws + Q
    if (problem.stride == (1, 1) and not any(problem.padding) and wide_length >= QB
            and problem.x_bytes <= KNOBS.direct_in_place_max_bytes):
        return _Planes(phases_h, phases_w, halo, problem.W, "in place")  # Ws == W already
    planes = _Planes(phases_h, phases_w, halo, Ws, "whole")
    if (block.along == "positions"
            and planes.whole_elements(problem) * problem.itemsize <= KNOBS.direct_whole_input_max_bytes):
        return planes
    return _Planes(phases_h, phases_w, halo, Ws, "per item")


def _tap_offsets(problem, planes: _Planes, plane_rows: int) -> np.ndarray:
    """Offset of tap ``(c, r, s)`` (c within the group) from its image-and-group base, in planes
    of ``plane_rows`` rows of ``planes.Ws``."""
    sh, sw = problem.stride
    dh, dw = problem.dilation
    npw = len(planes.phases_w)
    plane_size = plane_rows * planes.Ws
    c = np.arange(problem.C_per_group)[:, None, None]
    r = np.arange(problem.R)[None, :, None]
    s = np.arange(problem.S)[None, None, :]
    ia = np.searchsorted(planes.phases_h, (r * dh) % sh)
    ib = np.searchsorted(planes.phases_w, (s * dw) % sw)
    plane = (c * len(planes.phases_h) + ia) * npw + ib
    offsets = plane * plane_size + ((r * dh) // sh) * planes.Ws + (s * dw) // sw
    return np.ascontiguousarray(offsets.reshape(-1), dtype=np.int64)


def _rowwise(problem, planes: _Planes, block: DirectBlocking) -> bool:
    """Whether blocks run row by row (never wrapping) rather than along wide rows: for rows of
    at least one block whose last, shifted-back block recomputes little (at most a tenth more
    work than the wide rows' thrown-away columns). Never for blocks along the channels."""
    Q, QB = problem.Q, block.QB
    if block.along == "channels" or Q < QB:
        return False
    per_row = -(-Q // QB) * QB
    return per_row * problem.P <= 1.1 * ((problem.P - 1) * planes.Ws + Q)


def choose_blocking(problem) -> DirectBlocking:
    """The candidate block of the ``direct_blockings`` knob expected to finish first.

    Expected time = ``K/groups`` rounded up to ``KB``, times the positions computed (the wide
    positions rounded up to whole ``QB`` blocks; for a block along the channels, the output
    positions), divided by the block's measured ``speed``; ties go to the earlier candidate.
    Blocks along the channels compete only for rows narrower than every block along the rows,
    where each of those blocks wraps rows and is stored piece by piece, a cost the padded work
    does not count: on wider rows they lost (MobileNetV2's 1x1 32>16 on 112x112, Zen 3: 1.19x the
    time of 3x32), on narrower ones they won by more than the padding (ResNet-50's 1x1 1024>256 on
    14x14: 0.55x; its 3x3 256>256 on 14x14: 0.84x; the digits CNN's 16->32 on 8x8: 0.40x).
    """
    candidates = direct_blockings(problem.dtype)
    narrowest = min((b.QB for b in candidates if b.along == "positions"), default=0)
    best, best_cost = None, None
    for b in candidates:
        if b.along == "channels":
            if problem.Q >= narrowest and best is not None:  # (a table of them alone still chooses)
                continue
            positions = problem.P * problem.Q
        else:
            planes = _planes(problem, b)
            wide_length = (problem.P - 1) * planes.Ws + problem.Q
            positions = -(-wide_length // b.QB) * b.QB
        work = -(-problem.K_per_group // b.KB) * b.KB * positions
        cost = work / b.speed
        if best_cost is None or cost < best_cost:
            best, best_cost = b, cost
    return best


@dataclass(frozen=True)
class Schedule:
    """How the work of one problem is cut into work items for the threads (see :func:`schedule`).

    Attributes
    ----------
    images : int
        Whole images per work item (1 when images are cut into bands).
    bands : int
        Bands of output rows per image (1 when images go whole); band ``b`` holds rows
        ``b*P // bands`` to ``(b+1)*P // bands``.
    k_ranges : int
        Into how many ranges the K-blocks of a group are split across work items.
    rowwise : bool
        Blocks run row by row, never wrapping (see :func:`_rowwise`).
    stream : bool
        Blocks whose rows start on a cache line are written with non-temporal stores.
    """

    images: int
    bands: int
    k_ranges: int
    rowwise: bool = False
    stream: bool = False

    def band_rows(self, problem) -> int:
        """Rows of the tallest band."""
        return -(-problem.P // self.bands)


def schedule(problem, block: DirectBlocking, threads: int | None = None) -> Schedule:
    """Cut the output into work items whose input fits in L2 and that keep every thread busy.

    A work item reuses its input once per K-block, so the input should stay in L2: an item reads
    ``C/groups * planes per channel`` plane rows of ``Ws`` elements per output row, plus a halo of
    ``(R-1)*dh // sh`` rows, and items are sized to keep that under the
    ``direct_l2_input_budget`` knob: several whole images, or a band of one image's rows. One
    K-block's weights stay in L1 while it sweeps the item and are read once per item. When that
    leaves fewer than ~8 items per thread (items are handed out dynamically, but with few of them
    the last one still leaves the other threads idle), an input read in place splits the K-blocks
    into ranges first (each range re-reads the input from cache), then puts fewer images in an
    item, then cuts images into more bands (each band re-reads its halo); a gathered input,
    which every K range would gather again, goes the other way round (the digits CNN's 16->32
    layer, 32 images of 8x8: 0.21 ms with K ranges first, 0.09 with images first).
    """
    threads = threads or thread_count()
    wanted_items = 8 * threads
    planes = _planes(problem, block)
    N, P = problem.N, problem.P
    rowwise = _rowwise(problem, planes, block)
    # The fewest rows a band may have: in place, a wide band must hold a whole block (the last
    # block is shifted back inside the band, never before it).
    wraps_inside_band = not rowwise and planes.source != "per item" and block.along == "positions"
    min_rows = max(1, -(-(block.QB - problem.Q) // planes.Ws) + 1) if wraps_inside_band else 1
    max_bands = max(1, P // min_rows)
    row_bytes = problem.C_per_group * planes.planes_per_channel * planes.Ws * problem.itemsize
    budget = KNOBS.direct_l2_input_budget
    if (P + planes.halo) * row_bytes <= budget:
        images, bands = max(1, min(N, budget // ((P + planes.halo) * row_bytes))), 1
    else:
        images = 1
        bands = min(max_bands, -(-P // max(min_rows, budget // row_bytes - planes.halo)))
    nkb = -(-problem.K_per_group // block.KB)

    def items(images, bands):
        return problem.groups * -(-N // images) * bands

    if planes.source == "per item":
        # Every K range gathers its input again: fewer images per item and more bands first.
        images = max(1, min(images, problem.groups * N * bands // wanted_items))
        if items(images, bands) < wanted_items and images == 1:
            bands = max(bands, min(max_bands, -(-wanted_items // (problem.groups * max(N, 1)))))
        k_ranges = min(nkb, -(-wanted_items // items(images, bands)))
    else:
        k_ranges = min(nkb, -(-wanted_items // items(images, bands)))
        if items(images, bands) * k_ranges < wanted_items:
            images = max(1, min(images, problem.groups * N * bands * k_ranges // wanted_items))
        if items(images, bands) * k_ranges < wanted_items and images == 1:
            bands = max(bands, min(max_bands, -(-wanted_items // (problem.groups * max(N, 1) * k_ranges))))
    y_bytes = problem.N * problem.K * P * problem.Q * problem.itemsize
    stream = rowwise and y_bytes >= KNOBS.direct_stream_min_bytes and block.QB % _line(problem) == 0
    return Schedule(images, bands, k_ranges, rowwise, stream)


def _line(problem) -> int:
    """Elements per 64-byte cache line: the width of a streaming store."""
    return 64 // problem.itemsize


def _buffer_elements(problem, planes: _Planes, plan: Schedule, QB: int) -> int:
    """Elements of one thread's gather buffer: the item's planes and a zero tail of a block."""
    rows = plan.band_rows(problem) + planes.halo
    return plan.images * problem.C_per_group * planes.planes_per_channel * rows * planes.Ws + QB + _line(problem)


def workspace_bytes(problem, device=None) -> int:
    """Bytes this module allocates beyond x, w, bias and y: none when ``x`` is read in place; the
    gathered planes when they are gathered whole (at most ``direct_whole_input_max_bytes``);
    otherwise one gather buffer per thread (an item's input, about ``direct_l2_input_budget``),
    whatever N, H and W are.

    The packed weights (``K`` rounded up to the block, times ``C/groups * R * S``) are not
    counted; they are the size of ``w``.
    """
    threads = thread_count() if problem.flops >= KNOBS.direct_serial_below_flops else 1
    launch = _launch(problem, threads)
    source = launch.planes.source
    if source == "in place":
        return 0
    if source == "whole":
        return (launch.source_elements + launch.blocking.QB) * problem.itemsize
    return threads * launch.buffer_elements * problem.itemsize


# ------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------
@njit(inline="always")
def gather_rows(x_flat, C, H, W, n, c_first, Cg, p_lo, rows_in, phases_h, phases_w, stride_h, stride_w, top,
                left, Hb, Ws, buf, dst0):
    """Plane rows ``p_lo .. p_lo + rows_in`` of channels ``c_first .. c_first + Cg`` of image
    ``n``, zero-padded and split into stride phases (see the module docstring), into ``buf`` from
    ``dst0`` on, laid out ``(c, phase a, phase b, Hb rows, Ws)``.

    Parameters
    ----------
    x_flat : 1-D array                     # IN  an (N, C, H, W) array, flat: flattened by the
                                           #     caller, once (a reshape in each parallel work
                                           #     item cost ~0.2 us, the whole gather of a small
                                           #     image's plane)
    phases_h, phases_w : int64 arrays      # IN  phases a, b kept
    buf : 1-D array                        # OUT rows_in rows of every plane written
    """
    nph, npw = phases_h.size, phases_w.size
    for c in range(Cg):
        for ia in range(nph):
            a = phases_h[ia]
            for ib in range(npw):
                b = phases_w[ib]
                # Columns j with 0 <= j*sw + b - left < W, as a half-open range [j_lo, j_hi).
                j_lo = min(Ws, max(0, -(-(left - b) // stride_w)))
                j_hi = min(Ws, max(j_lo, -(-(W + left - b) // stride_w)))
                plane = dst0 + ((c * nph + ia) * npw + ib) * Hb * Ws
                for i in range(rows_in):
                    dst = plane + i * Ws
                    row = (p_lo + i) * stride_h + a - top
                    # The whole row zeroed, then the image's columns copied over it: two runs of
                    # whole vectors. (Zeroing only the padding took three loops of their own,
                    # each vectorised, unrolled and versioned by LLVM: the gather of the digits
                    # CNN's small planes came out 2-3x slower.)
                    outside = row < 0 or row >= H or j_hi == j_lo
                    if outside or j_lo > 0 or j_hi < Ws:
                        zero_row(buf, dst, Ws)
                    if outside:
                        continue
                    # Unsigned flat indices from the first copied element on: no negative-index checks.
                    out = np.uint64(dst + j_lo)
                    src = np.uint64(((n * C + c_first + c) * H + row) * W + j_lo * stride_w + b - left)
                    count = np.uint64(j_hi - j_lo)
                    if stride_w == 1:
                        copy_row(x_flat, src, buf, out, count)
                    elif stride_w == 2:  # the common strided case, with a literal stride
                        for j in range(count):
                            buf[out + j] = x_flat[src + np.uint64(2) * j]
                    else:
                        step = np.uint64(stride_w)
                        for j in range(count):
                            buf[out + j] = x_flat[src + step * j]


@njit(inline="always")
def work_item(item, images, bands, k_ranges, N, P):
    """``(g, kr, n0, n1, p_lo, rows)`` of work item ``item`` (the kernels' :class:`Schedule`):
    its group, K range, images ``n0 .. n1`` and band of ``rows`` output rows from ``p_lo``."""
    item_images = (N + images - 1) // images
    band = item % bands
    rest = item // bands
    chunk = rest % item_images
    rest //= item_images
    n0 = chunk * images
    p_lo = band * P // bands
    return rest // k_ranges, rest % k_ranges, n0, min(N, n0 + images), p_lo, (band + 1) * P // bands - p_lo


@njit(inline="always")
def item_source(source, x_flat, C, H, W, g, Cg, n0, n1, p_lo, rows_in, phases_h, phases_w, stride_h, stride_w,
                top, left, Hb, Ws, buf, buffer_image):
    """Where a work item's taps read: ``source`` (``x`` or its whole planes) when ``buf`` is
    empty, else ``buf`` after :func:`gather_rows` of the item's images and rows into it."""
    if buf.size == 0:
        return source
    for n in range(n0, n1):
        gather_rows(x_flat, C, H, W, n, g * Cg, Cg, p_lo, rows_in, phases_h, phases_w, stride_h, stride_w, top,
                    left, Hb, Ws, buf, (n - n0) * buffer_image)
    return buf


@njit(parallel=True, cache=True)
def gather_source_planes(x, phases_h, phases_w, stride_h, stride_w, top, left, xs):
    """Zero-padded, stride-phase-split copy of the whole of ``x`` (the "whole" source: see the
    module docstring): :func:`gather_rows` of every plane row, in parallel over images and channels.

    Parameters
    ----------
    x : (N, C, H, W) array                              # IN
    phases_h, phases_w : int64 arrays                   # IN  phases a, b kept
    stride_h, stride_w, top, left : int                 # IN
    xs : (N, C, len(phases_h), len(phases_w), Hs, Ws)   # OUT every element written
    """
    N, C, H, W = x.shape
    nph, npw, Hs, Ws = xs.shape[2], xs.shape[3], xs.shape[4], xs.shape[5]
    xs_flat = xs.reshape(-1)
    x_flat = x.reshape(-1)
    for item in prange(N * C):
        n = item // C
        c = item - n * C
        gather_rows(x_flat, C, H, W, n, c, 1, 0, Hs, phases_h, phases_w, stride_h, stride_w, top, left, Hs, Ws, xs_flat,
                    item * nph * npw * Hs * Ws)


@njit(parallel=True, cache=True)
def pack_weights(w, KB, wpack):
    """Filters as ``(group, K-block, tap, KB)``, zero rows past the group's last channel.

    Parameters
    ----------
    w : (K, C/groups, R, S) array           # IN
    KB : int                                # IN output channels per block
    wpack : (groups, nkb, C/groups*R*S, KB) # OUT
    """
    K = w.shape[0]
    taps = w.shape[1] * w.shape[2] * w.shape[3]
    groups, nkb = wpack.shape[0], wpack.shape[1]
    Kg = K // groups
    wflat = w.reshape(K, taps)
    for gb in prange(groups * nkb):
        g = gb // nkb
        kb = gb % nkb
        for kk in range(KB):
            k = kb * KB + kk
            if k < Kg:
                for t in range(taps):
                    wpack[g, kb, t, kk] = wflat[g * Kg + k, t]
            else:
                for t in range(taps):
                    wpack[g, kb, t, kk] = 0


@njit(inline="always")
def scatter_wrapped_block(tile, rows, j0, p0, q0, wide_length, Ws, y, y_block, P, Q):
    """Store a block whose wide positions wrap rows: row piece by row piece, dropping q >= Q.

    ``tile[kk, i]`` is wide position ``j0 + i`` = output ``(p0, q0 + i)`` wrapped at ``Ws``, of
    channel plane ``y_block + kk * P * Q`` of the flat output ``y``.
    """
    QB = tile.shape[1]
    pos = 0
    p = p0
    q = q0
    while pos < QB and j0 + pos < wide_length:
        run = min(Ws - q, QB - pos)
        if q < Q:
            for kk in range(rows):
                copy_run(tile, kk, pos, y, y_block + kk * P * Q + p * Q + q, min(run, Q - q))
        pos += run
        p += 1
        q = 0


@njit(inline="always")
def copy_run(tile, row, start, out, dst, length):
    """``out[dst:dst+length] = tile[row, start:start+length]`` in whole vectors, then a tail.

    Written out so LLVM emits vector moves instead of a ``memcpy`` call per row piece.
    """
    i = 0
    while i + 8 <= length:
        for lane in range(8):
            out[np.uint64(dst + i + lane)] = tile[row, np.uint64(start + i + lane)]
        i += 8
    while i < length:
        out[np.uint64(dst + i)] = tile[row, np.uint64(start + i)]
        i += 1


@functools.lru_cache(maxsize=None)
def direct_kernel(dtype: str, KB: int, QB: int, vector_bytes: int | None = None):
    """The register-blocked kernel for one ``(dtype, KB, QB)`` in vectors of ``vector_bytes`` (this
    machine's, :func:`~convlib.cpu.tables.direct_vector_bytes`, by default); compiled on first call.

    The returned function computes ``y`` (see the module docstring)::

        kernel(x, source, image_stride, group_stride, bufs, phases_h, phases_w, stride_h,
               stride_w, top, left, Hb, Ws, tap_offsets, wpack, bias_packed, images, bands,
               k_ranges, rowwise, stream, y_misalign, workers, next_item, y)

    x : (N, C, H, W) array                        # IN
    source : 1-D array                            # IN x or its whole planes (unless bufs)
    image_stride, group_stride : int              # IN elements between images / groups there
    bufs : (workers, elements) array              # SCRATCH one gather buffer per worker, its
                                                  # tail zero; (workers, 0): read source
    phases_h, phases_w : int64 arrays             # IN the stride phases the filter touches
    stride_h, stride_w, top, left : int           # IN
    Hb, Ws : int                                  # IN rows and pitch of a gathered plane
    tap_offsets : (C/groups*R*S,) int64           # IN in the buffer's planes, or in x's
    wpack : (groups, nkb, taps, KB)               # IN from :func:`pack_weights`
    bias_packed : (groups, nkb, KB)               # IN zero where there is no bias
    images, bands, k_ranges, rowwise, stream      # IN the work items (:class:`Schedule`)
    y_misalign : int                              # IN y's address in elements, modulo a line
    workers : int                                 # IN threads taking items
    next_item : (1,) int64                        # INOUT the work counter, zero on entry
    y : (N, K, P, Q)                              # OUT every element written
    """
    scalar = np.dtype(dtype).type
    LINE = 64 // np.dtype(dtype).itemsize  # elements per cache line: one streaming store
    L = max(1, (vector_bytes or direct_vector_bytes()) // np.dtype(dtype).itemsize)  # lanes of a vector
    NV = QB // L  # vectors per accumulator row
    ACC = KB * QB
    # Besides the accumulators, weights outer keeps the tap's NV input vectors live (each loaded
    # once), vectors outer its KB broadcast weights: the order with fewer of them leaves room in
    # the registers (12x32 on zmm spilled with vectors outer, 3x64 on ymm with weights outer).
    WEIGHTS_OUTER = NV <= KB
    if NV * L != QB:
        raise ValueError(f"direct block QB={QB} is not a whole number of {L}-lane vectors")

    @njit(parallel=True, cache=True, fastmath={"contract"})
    def direct_conv_blocked(x, source, image_stride, group_stride, bufs, phases_h, phases_w, stride_h,
                            stride_w, top, left, Hb, Ws, tap_offsets, wpack, bias_packed, images, bands,
                            k_ranges, rowwise, stream, y_misalign, workers, next_item, y):
        N, C, H, W = x.shape
        K, P, Q = y.shape[1], y.shape[2], y.shape[3]
        groups, nkb, taps = wpack.shape[0], wpack.shape[1], wpack.shape[2]
        Kg = K // groups
        Cg = C // groups
        gather = bufs.shape[1] > 0
        halo = Hb - (P + bands - 1) // bands
        buffer_image = Cg * phases_h.size * phases_w.size * Hb * Ws  # in a gather buffer
        item_images = (N + images - 1) // images
        kb_per_range = (nkb + k_ranges - 1) // k_ranges
        items = groups * k_ranges * item_images * bands
        yflat = y.reshape(-1)
        w_flat = wpack.reshape(-1)
        x_flat = x.reshape(-1)
        PQ = P * Q
        for worker in prange(workers):  # noqa: B007 (each worker takes items until none are left)
            acc = stack_array_1d(ACC, scalar)  # row kk: acc[kk*QB : (kk+1)*QB]
            tile = stack_array_2d(KB, QB, scalar)
            buf = bufs[worker]
            while True:
                item = fetch_and_increment(next_item)
                if item >= items:
                    break
                g, kr, n0, n1, p_lo, rows = work_item(item, images, bands, k_ranges, N, P)
                if rows == 0:
                    continue  # more bands than rows
                src = item_source(source, x_flat, C, H, W, g, Cg, n0, n1, p_lo, rows + halo, phases_h, phases_w,
                                  stride_h, stride_w, top, left, Hb, Ws, buf, buffer_image)
                wide_length = (rows - 1) * Ws + Q
                nqb = (wide_length + QB - 1) // QB
                for kb in range(kr * kb_per_range, min(nkb, (kr + 1) * kb_per_range)):
                    kvalid = min(KB, Kg - kb * KB)
                    for n in range(n0, n1):
                        if gather:
                            base = (n - n0) * buffer_image
                        else:
                            base = n * image_stride + g * group_stride + p_lo * Ws
                        y_band = (n * K + g * Kg + kb * KB) * PQ + p_lo * Q
                        # Blocks: row by row (p0 = row, blk = block of the row, head = columns
                        # before the first line-aligned one) or along the wide rows (blk = block).
                        p0 = 0
                        q0 = 0
                        blk = 0
                        head = 0
                        row_blocks = nqb
                        if rowwise:
                            if stream:
                                head = (LINE - (y_misalign + y_band) % LINE) % LINE
                            row_blocks = (Q - head + QB - 1) // QB + (1 if head > 0 else 0)
                        while True:
                            if rowwise:
                                if blk == row_blocks:
                                    p0 += 1
                                    if p0 == rows:
                                        break
                                    blk = 0
                                    if stream:
                                        head = (LINE - (y_misalign + y_band + p0 * Q) % LINE) % LINE
                                        row_blocks = (Q - head + QB - 1) // QB + (1 if head > 0 else 0)
                                q0 = blk * QB if head == 0 else (0 if blk == 0 else head + (blk - 1) * QB)
                                q0 = min(q0, Q - QB)
                                j0 = p0 * Ws + q0
                            else:
                                if blk == nqb:
                                    break
                                j0 = blk * QB
                                if wide_length >= QB and j0 > wide_length - QB:
                                    j0 = wide_length - QB  # stay inside the band; recomputes a few outputs
                                p0 = j0 // Ws
                                q0 = j0 - p0 * Ws

                            for i in range(ACC):
                                acc[i] = 0
                            # Per tap: QB/L vector loads of the source, KB broadcast weights, KB*QB/L
                            # FMAs, written as vectors (left to LLVM's loop vectoriser, the same loop
                            # came out at half the accumulators under numba 0.68 on the Xeon host).
                            w_block = ((g * nkb + kb) * taps) * KB
                            for t in range(taps):
                                s0 = np.uint64(base + j0 + tap_offsets[t])
                                if WEIGHTS_OUTER:
                                    for kk in range(KB):
                                        for v in range(NV):
                                            vector_fma(acc, kk * QB + v * L, w_flat, w_block + t * KB + kk, src,
                                                       s0 + np.uint64(v * L), L)
                                else:
                                    for v in range(NV):
                                        for kk in range(KB):
                                            vector_fma(acc, kk * QB + v * L, w_flat, w_block + t * KB + kk, src,
                                                       s0 + np.uint64(v * L), L)

                            if q0 + QB <= Q:
                                # The whole block lies in one output row: constant-length stores.
                                for kk in range(KB):  # constant trip count: acc stays in registers
                                    if kk < kvalid:
                                        bk = bias_packed[g, kb, kk]
                                        dst = y_band + kk * PQ + p0 * Q + q0
                                        if stream and (y_misalign + dst) % LINE == 0:
                                            for v in range(QB // LINE):
                                                vector_stream_plus(yflat, np.uint64(dst + v * LINE), acc,
                                                                   kk * QB + v * LINE, bk, LINE)
                                        else:
                                            for jj in range(QB):
                                                yflat[np.uint64(dst + jj)] = acc[kk * QB + jj] + bk
                            else:
                                for kk in range(KB):
                                    bk = bias_packed[g, kb, kk]
                                    for jj in range(QB):
                                        tile[kk, jj] = acc[kk * QB + jj] + bk
                                scatter_wrapped_block(
                                    tile, kvalid, j0, p0, q0, wide_length, Ws, yflat, y_band, P, Q
                                )
                            blk += 1
            if stream:
                store_fence()

    return direct_conv_blocked


@functools.lru_cache(maxsize=None)
def direct_channels_kernel(dtype: str, KB: int, PB: int, vector_bytes: int | None = None):
    """The kernel of a block along the channels (``DirectBlocking(along="channels")``): ``KB``
    output channels in the vector lanes x ``PB`` output positions; compiled on first call.

    Same arguments as :func:`direct_kernel`'s (``rowwise``, ``stream`` and ``y_misalign`` unused:
    its stores are one element each), and the same work items, sources and tap offsets. A block's
    positions are any ``PB`` consecutive ones of its item, in the order (image, row, column), so
    they may span rows and images and none is computed for nothing (but where the item has fewer
    than ``PB``). Per tap it costs ``PB`` input broadcasts (one element each, from the position's
    place in the planes plus the tap's offset), ``KB / lanes`` weight vectors (packed
    ``(group, K-block, tap, KB)`` as for the other blocks) and ``PB * KB / lanes`` FMAs. An
    accumulator holds ``lanes`` channels of one position, stored element by element: ``KB * PB``
    scalar stores per block, against ``taps * PB * KB / lanes`` FMAs.
    """
    scalar = np.dtype(dtype).type
    L = max(1, (vector_bytes or direct_vector_bytes()) // np.dtype(dtype).itemsize)  # lanes of a vector
    MV = KB // L  # weight vectors per tap
    ACC = KB * PB
    if MV * L != KB:
        raise ValueError(f"direct block along the channels KB={KB} is not a whole number of {L}-lane vectors")

    @njit(parallel=True, cache=True, fastmath={"contract"})
    def direct_conv_channels(x, source, image_stride, group_stride, bufs, phases_h, phases_w, stride_h,
                             stride_w, top, left, Hb, Ws, tap_offsets, wpack, bias_packed, images, bands,
                             k_ranges, rowwise, stream, y_misalign, workers, next_item, y):
        N, C, H, W = x.shape
        K, P, Q = y.shape[1], y.shape[2], y.shape[3]
        groups, nkb, taps = wpack.shape[0], wpack.shape[1], wpack.shape[2]
        Kg = K // groups
        Cg = C // groups
        gather = bufs.shape[1] > 0
        halo = Hb - (P + bands - 1) // bands
        buffer_image = Cg * phases_h.size * phases_w.size * Hb * Ws  # in a gather buffer
        item_images = (N + images - 1) // images
        kb_per_range = (nkb + k_ranges - 1) // k_ranges
        items = groups * k_ranges * item_images * bands
        yflat = y.reshape(-1)
        w_flat = wpack.reshape(-1)
        x_flat = x.reshape(-1)
        PQ = P * Q
        for worker in prange(workers):  # noqa: B007 (each worker takes items until none are left)
            acc = stack_array_1d(ACC, scalar)  # position i: acc[i*KB : (i+1)*KB], its KB channels
            base = stack_array_1d(PB, np.int64)  # where position i reads in the source
            out = stack_array_1d(PB, np.int64)  # where it goes in y, channel kb*KB
            buf = bufs[worker]
            while True:
                item = fetch_and_increment(next_item)
                if item >= items:
                    break
                g, kr, n0, n1, p_lo, rows = work_item(item, images, bands, k_ranges, N, P)
                if rows == 0:
                    continue  # more bands than rows
                src = item_source(source, x_flat, C, H, W, g, Cg, n0, n1, p_lo, rows + halo, phases_h, phases_w,
                                  stride_h, stride_w, top, left, Hb, Ws, buf, buffer_image)
                image_positions = rows * Q
                count = (n1 - n0) * image_positions
                for kb in range(kr * kb_per_range, min(nkb, (kr + 1) * kb_per_range)):
                    kvalid = min(KB, Kg - kb * KB)
                    w_block = ((g * nkb + kb) * taps) * KB
                    for j0 in range(0, count, PB):
                        j0 = max(0, min(j0, count - PB))  # the last block shifted back onto the item
                        for i in range(PB):
                            j = min(j0 + i, count - 1)  # an item of fewer than PB: repeats its last
                            m = j // image_positions
                            pq = j - m * image_positions
                            p = pq // Q
                            q = pq - p * Q
                            if gather:
                                base[i] = m * buffer_image + p * Ws + q
                            else:
                                base[i] = (n0 + m) * image_stride + g * group_stride + (p_lo + p) * Ws + q
                            out[i] = ((n0 + m) * K + g * Kg + kb * KB) * PQ + (p_lo + p) * Q + q
                        for i in range(ACC):
                            acc[i] = 0
                        for t in range(taps):
                            off = tap_offsets[t]
                            for i in range(PB):
                                s0 = np.uint64(base[i] + off)
                                for v in range(MV):
                                    vector_fma(acc, i * KB + v * L, src, s0, w_flat,
                                               np.uint64(w_block + t * KB + v * L), L)
                        for kk in range(KB):
                            if kk < kvalid:
                                bk = bias_packed[g, kb, kk]
                                for i in range(PB):
                                    yflat[np.uint64(out[i] + kk * PQ)] = acc[i * KB + kk] + bk

    return direct_conv_channels


def kernel_for(dtype: str, block: DirectBlocking, vector_bytes: int | None = None):
    """The kernel of ``block``: :func:`direct_kernel` or :func:`direct_channels_kernel`."""
    if block.along == "channels":
        return direct_channels_kernel(dtype, block.KB, block.QB, vector_bytes)
    return direct_kernel(dtype, block.KB, block.QB, vector_bytes)


# ------------------------------------------------------------------------------------------
# Module contract
# ------------------------------------------------------------------------------------------
def supports(problem):
    """None: direct convolution serves every valid problem."""
    return None


def run(problem, x, w, bias, device):
    """Direct convolution of ``x`` with ``w`` (the implementation contract of
    :mod:`convlib.core.contracts`).

    Parameters
    ----------
    problem : ConvProblem
    x : (N, C, H, W) numpy array of ``problem.dtype``, C-contiguous
    w : (K, C/groups, R, S) numpy array
    bias : (K,) numpy array or None
    device : None

    Returns
    -------
    (N, K, P, Q) numpy array, newly allocated
    """
    y = output_cache.empty(problem.y_shape, problem.dtype)
    if problem.N == 0:
        return y
    if problem.flops >= KNOBS.direct_serial_below_flops:
        _run(problem, x, w, bias, y)
        return y
    # Too little work to be worth waking the other threads: on a busy machine a thread that is
    # not running can hold a whole parallel region up for a scheduler time slice.
    threads = thread_count()
    set_num_threads(1)
    try:
        _run(problem, x, w, bias, y)
    finally:
        set_num_threads(threads)
    return y


@dataclass(frozen=True)
class _Launch:
    """Everything of a call of :func:`_run` but its arrays, computed once per problem, thread
    count and knob state (:func:`_launch`): in a training step, where the interpreter's caches are
    cold between calls, recomputing it took a third of a small layer's call. The arrays here are
    read, never written, by the kernels."""

    blocking: DirectBlocking
    planes: _Planes
    schedule: Schedule
    kernel: object
    tap_offsets: np.ndarray
    phases_h: np.ndarray  # int64
    phases_w: np.ndarray
    band_rows: int  # rows a work item's gathered planes hold
    group_stride: int  # elements between groups in the source
    source_elements: int  # of the whole planes ("whole"), without their zero tail
    source_shape: tuple  # the whole planes' 6-d shape ("whole")
    buffer_elements: int  # of one thread's gather buffer ("per item")
    no_buffers: np.ndarray  # (threads, 0): the kernel's bufs when nothing is gathered per item
    wpack_shape: tuple
    zero_bias: np.ndarray  # the packed bias of a call without one


@KNOBS.cached
def _launch(problem, threads: int) -> _Launch:
    """The :class:`_Launch` of ``problem`` on ``threads`` threads: the block, the source planes
    and the schedule, then what follows from them."""
    blk = choose_blocking(problem)
    planes = _planes(problem, blk)
    plan = schedule(problem, blk, threads)
    dtype = np.dtype(problem.dtype)
    nkb = -(-problem.K_per_group // blk.KB)
    # Rows of one source plane: x's own, the whole planes', or a work item's gathered ones.
    plane_rows = {"in place": problem.H, "whole": problem.P + planes.halo,
                  "per item": plan.band_rows(problem) + planes.halo}[planes.source]
    return _Launch(
        blocking=blk, planes=planes, schedule=plan,
        kernel=kernel_for(problem.dtype, blk, direct_vector_bytes()),
        tap_offsets=_tap_offsets(problem, planes, plane_rows),
        phases_h=np.asarray(planes.phases_h, dtype=np.int64), phases_w=np.asarray(planes.phases_w, dtype=np.int64),
        band_rows=plan.band_rows(problem) + planes.halo,
        group_stride=problem.C_per_group * planes.planes_per_channel * plane_rows * planes.Ws,
        source_elements=planes.whole_elements(problem),
        source_shape=(problem.N, problem.C, len(planes.phases_h), len(planes.phases_w), plane_rows, planes.Ws),
        buffer_elements=_buffer_elements(problem, planes, plan, blk.QB),
        no_buffers=np.empty((threads, 0), dtype=dtype),
        wpack_shape=(problem.groups, nkb, problem.C_per_group * problem.R * problem.S, blk.KB),
        zero_bias=np.zeros((problem.groups, nkb, blk.KB), dtype=dtype),
    )


def _run(problem, x, w, bias, y):
    """Pack the weights and run the kernel with numba's current thread count; fills ``y``."""
    dtype = problem.dtype
    threads = thread_count()
    launch = _launch(problem, threads)
    blk, planes, plan = launch.blocking, launch.planes, launch.schedule
    bufs = launch.no_buffers
    if planes.source == "in place":
        source = x.reshape(-1)
    elif planes.source == "whole":
        elements = launch.source_elements
        # A zero tail of QB elements: a block longer than a whole image reads into it.
        source = np.empty(elements + blk.QB, dtype=dtype)
        source[elements:] = 0
        gather_source_planes(x, launch.phases_h, launch.phases_w, problem.stride[0], problem.stride[1],
                             problem.pad_top, problem.pad_left, source[:elements].reshape(launch.source_shape))
    else:
        source = x.reshape(-1)
        # Zeros: the tail past the planes must be finite for the blocks that read into it.
        bufs = np.zeros((threads, launch.buffer_elements), dtype=dtype)
    wpack = np.empty(launch.wpack_shape, dtype=dtype)
    pack_weights(w, blk.KB, wpack)
    if bias is None:
        bias_packed = launch.zero_bias
    else:
        groups, nkb, KB = launch.zero_bias.shape
        bias_packed = np.zeros((groups, nkb * KB), dtype=dtype)
        bias_packed[:, :problem.K_per_group] = bias.reshape(groups, problem.K_per_group)
        bias_packed = bias_packed.reshape(groups, nkb, KB)
    address = y.__array_interface__["data"][0]
    stream = plan.stream and address % problem.itemsize == 0
    y_misalign = (address % 64) // problem.itemsize
    launch.kernel(
        x, source, problem.groups * launch.group_stride, launch.group_stride, bufs, launch.phases_h,
        launch.phases_w, problem.stride[0], problem.stride[1], problem.pad_top, problem.pad_left,
        launch.band_rows, planes.Ws, launch.tap_offsets, wpack, bias_packed,
        plan.images, plan.bands, plan.k_ranges, plan.rowwise, stream, y_misalign,
        threads, np.zeros(1, dtype=np.int64), y,
    )
