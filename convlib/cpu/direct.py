"""Direct convolution on the CPU: the 7-loop definition, register-blocked and vectorised.

How the loops are organised
---------------------------
The input is read through *source planes* ``xs`` of ``Hs x Ws`` elements in which every filter
tap is a plain shift. With stride 1 and no padding the planes are ``x`` itself (no copy).
Otherwise :func:`gather_source_planes` builds them once per call, in parallel: a zero-padded
copy of ``x``, split into stride phases (plane ``(c, a, b)`` holds padded rows ``a, a + sh, ...``
and columns ``b, b + sw, ...``), keeping only the phases and rows the filter touches. In those
planes output ``(p, q)`` and tap ``(c, r, s)`` read element ``(p + r*dh // sh, q + s*dw // sw)``
of plane ``(c, r*dh % sh, s*dw % sw)``: every stride, dilation and padding becomes stride 1.

Output positions are then numbered along *wide rows* of pitch ``Ws``: position ``j = p*Ws + q``
(columns ``q >= Q`` are computed and thrown away). Tap ``t = (c, r, s)`` reads
``xs[image + offset[t] + j]`` for every ``j``: one contiguous run per tap however the output rows
wrap, so a block of ``QB`` consecutive positions is ``QB / lanes`` vector loads per tap even when
``Q`` is 7 or 56. ``(c, r, s)`` is flattened into one loop over the precomputed ``offset`` table.

The register block is ``KB`` output channels x ``QB`` wide positions, held in a stack
accumulator (:func:`convlib.cpu.stack_buffer.stack_array_2d`) that LLVM keeps in vector registers
(checked in the assembly: one ``vfmadd231ps`` per accumulator per tap, no stack traffic in the
tap loop). Per tap it costs ``QB / lanes`` vector loads of ``x``, ``KB`` weight broadcasts and
``KB * QB / lanes`` FMAs; the weights are packed as ``(group, K-block, tap, KB)`` so one tap's
``KB`` weights are adjacent. Only the tap loop is a loop: unrolling taps or rows in the body
would pass the ~250 memory accesses beyond which LLVM stops keeping the block in registers.
A block that lies inside one output row is stored straight from the registers (with the bias);
one that wraps rows is copied to a second stack tile and scattered row piece by row piece. The
last block of an image is shifted back to end at the image's last position (it recomputes a
few outputs) so that no read leaves the image; images shorter than one block always go through
the gathered planes, which carry a zero tail.

Parallel loop order: a work item is ``(group, range of K-blocks, chunk of position blocks)``;
a chunk runs through consecutive blocks of one group, image after image, and every K-block of
the range sweeps the whole chunk before the next K-block starts, so the chunk's input is reused
from L2 (and, with few K-blocks, from L1) while one K-block's weights stay in L1.
:func:`schedule` sizes chunks to an L2 budget and splits K into ranges only when there would
otherwise be too few items for the threads (N=1, K=4 still gives both threads work). Items are
taken from an atomic counter, one at a time, by one worker per thread (``prange`` over the
workers): numba's OpenMP layer splits a ``prange`` statically, and on a shared machine a
preempted thread would otherwise hold the other one up at the end of the region. Problems under
the ``direct_serial_below_flops`` knob run on one thread: waking the others would cost more than
it saves.

Block sizes are data (the ``direct_blockings`` knob of :mod:`convlib.cpu.tables`, one row per
loop-vectoriser width and dtype); :func:`choose_blocking` weighs each candidate's padded work (K
rounded up to ``KB``, positions to whole blocks) by its measured speed.

What a new shape costs
----------------------
Kernels are specialised on ``(dtype, KB, QB)`` only, compiled once per machine
(``cache=True``, a few seconds each; one table of three or four blocks per dtype applies here);
N, C, H, W, K, R, S, stride, dilation, padding and groups are runtime values. A new shape costs
no compilation, only the offset table, the weight packing and (with padding or stride) the
gather. On AVX-512 hosts the first call of a process also compiles a tiny uncached probe loop
(~0.1 s) to learn which vector width LLVM uses (:func:`convlib.cpu.isa.loop_vector_bytes`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import get_num_threads, njit, prange, set_num_threads

from ..core import output_cache
from .stack_buffer import stack_array_2d
from .tables import KNOBS, DirectBlocking, direct_blockings
from .work_queue import fetch_and_increment


# ------------------------------------------------------------------------------------------
# Geometry of the source planes
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Planes:
    """Where each tap of a problem reads, in the source planes (see the module docstring)."""

    phases_h: tuple  # padded-row phases a (r*dh % sh) the filter touches, sorted
    phases_w: tuple  # padded-column phases b
    Hs: int  # rows per plane
    Ws: int  # columns per plane: the pitch of a wide output row
    copy: bool  # False: the planes are x itself

    @property
    def planes_per_channel(self) -> int:
        return len(self.phases_h) * len(self.phases_w)

    def elements(self, problem) -> int:
        return problem.N * problem.C * self.planes_per_channel * self.Hs * self.Ws


def _planes(problem, QB: int) -> _Planes:
    sh, sw = problem.stride
    dh, dw = problem.dilation
    P, Q = problem.P, problem.Q
    phases_h = tuple(sorted({(r * dh) % sh for r in range(problem.R)}))
    phases_w = tuple(sorted({(s * dw) % sw for s in range(problem.S)}))
    Hs = P + ((problem.R - 1) * dh) // sh
    Ws = Q + ((problem.S - 1) * dw) // sw
    wide_length = (P - 1) * Ws + Q
    copy = problem.stride != (1, 1) or any(problem.padding) or wide_length < QB
    if not copy:
        Hs, Ws = problem.H, problem.W  # equal already; stated for the reader
    return _Planes(phases_h, phases_w, Hs, Ws, copy)


def _tap_offsets(problem, planes: _Planes) -> np.ndarray:
    """Offset of tap ``(c, r, s)`` (c within the group) from its image-and-group base."""
    sh, sw = problem.stride
    dh, dw = problem.dilation
    npw = len(planes.phases_w)
    plane_size = planes.Hs * planes.Ws
    c = np.arange(problem.C_per_group)[:, None, None]
    r = np.arange(problem.R)[None, :, None]
    s = np.arange(problem.S)[None, None, :]
    ia = np.searchsorted(planes.phases_h, (r * dh) % sh)
    ib = np.searchsorted(planes.phases_w, (s * dw) % sw)
    plane = (c * len(planes.phases_h) + ia) * npw + ib
    offsets = plane * plane_size + ((r * dh) // sh) * planes.Ws + (s * dw) // sw
    return np.ascontiguousarray(offsets.reshape(-1), dtype=np.int64)


def choose_blocking(problem) -> DirectBlocking:
    """The candidate block of the ``direct_blockings`` knob expected to finish first.

    Expected time = ``K/groups`` rounded up to ``KB``, times the wide positions rounded up to
    whole ``QB`` blocks, divided by the block's measured ``speed``; ties go to the earlier
    candidate.
    """
    best, best_cost = None, None
    for b in direct_blockings(problem.dtype):
        planes = _planes(problem, b.QB)
        wide_length = (problem.P - 1) * planes.Ws + problem.Q
        work = -(-problem.K_per_group // b.KB) * b.KB * -(-wide_length // b.QB) * b.QB
        cost = work / b.speed
        if best_cost is None or cost < best_cost:
            best, best_cost = b, cost
    return best


@dataclass(frozen=True)
class Schedule:
    """How the work of one problem is cut into work items for the threads (see :func:`schedule`).

    Attributes
    ----------
    chunk_blocks : int
        Consecutive position blocks of a group, counted across the images of the batch (image
        after image), that a work item covers. Every K-block of the item's range sweeps the
        whole chunk before the next K-block starts.
    k_ranges : int
        Into how many ranges the K-blocks of a group are split across work items.
    """

    chunk_blocks: int
    k_ranges: int


def schedule(problem, block: DirectBlocking, threads: int | None = None) -> Schedule:
    """Cut the output into work items whose input fits in L2 and that keep every thread busy.

    A work item reuses its chunk of input once per K-block, so the chunk should stay in L2: it
    reads about ``C/groups * planes per channel`` input elements per position (plus a halo of
    ``R - 1`` wide rows), and chunks are sized to keep that under the ``direct_l2_input_budget``
    knob. One
    K-block's weights stay in L1 while it sweeps the chunk and are read once per chunk. When
    that leaves fewer than ~8 items per thread (items are handed out dynamically, but with few
    of them the last one still leaves the other threads idle), the K-blocks are split into
    ranges first (each range re-reads the chunk), and only then are chunks shrunk (each chunk
    re-reads the weights).
    """
    threads = threads or get_num_threads()
    wanted_items = 8 * threads
    planes = _planes(problem, block.QB)
    wide_length = (problem.P - 1) * planes.Ws + problem.Q
    blocks = problem.N * -(-wide_length // block.QB)
    per_position = problem.C_per_group * planes.planes_per_channel * problem.itemsize
    halo = ((problem.R - 1) * problem.dilation[0] // problem.stride[0] + 1) * planes.Ws
    budget = KNOBS.direct_l2_input_budget
    chunk_blocks = min(blocks, max(1, (budget // per_position - halo) // block.QB))
    chunks = problem.groups * -(-blocks // chunk_blocks)
    nkb = -(-problem.K_per_group // block.KB)
    k_ranges = min(nkb, -(-wanted_items // chunks))
    if chunks * k_ranges < wanted_items:
        chunk_blocks = max(1, min(chunk_blocks, problem.groups * blocks * k_ranges // wanted_items))
    return Schedule(chunk_blocks, k_ranges)


def workspace_bytes(problem, device=None) -> int:
    """Bytes this module allocates beyond x, w, bias and y: the gathered source planes, if any.

    The packed weights (``K`` rounded up to the block, times ``C/groups * R * S``) are not
    counted; they are the size of ``w``.
    """
    b = choose_blocking(problem)
    planes = _planes(problem, b.QB)
    if not planes.copy:
        return 0
    return (planes.elements(problem) + b.QB) * problem.itemsize


# ------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------
@njit(parallel=True, cache=True)
def gather_source_planes(x, phases_h, phases_w, stride_h, stride_w, top, left, xs):
    """Zero-padded, stride-phase-split copy of ``x`` (see the module docstring).

    Parameters
    ----------
    x : (N, C, H, W) array                              # IN
    phases_h, phases_w : int64 arrays                   # IN  phases a, b kept
    stride_h, stride_w, top, left : int                 # IN
    xs : (N, C, len(phases_h), len(phases_w), Hs, Ws)   # OUT every element written
    """
    N, C, H, W = x.shape
    nph, npw, Hs, Ws = xs.shape[2], xs.shape[3], xs.shape[4], xs.shape[5]
    x_flat = x.reshape(-1)
    xs_flat = xs.reshape(-1)
    for item in prange(N * C * nph * npw):
        ib = item % npw
        rest = item // npw
        ia = rest % nph
        rest //= nph
        c = rest % C
        n = rest // C
        a = phases_h[ia]
        b = phases_w[ib]
        # Columns j with 0 <= j*sw + b - left < W, as a half-open range [j_lo, j_hi).
        j_lo = min(Ws, max(0, -(-(left - b) // stride_w)))
        j_hi = min(Ws, max(j_lo, -(-(W + left - b) // stride_w)))
        for i in range(Hs):
            dst = (item * Hs + i) * Ws
            row = i * stride_h + a - top
            if row < 0 or row >= H:
                xs_flat[dst:dst + Ws] = 0
                continue
            xs_flat[dst:dst + j_lo] = 0
            xs_flat[dst + j_hi:dst + Ws] = 0
            # Unsigned flat indices from the first copied element on: no negative-index checks.
            out = np.uint64(dst + j_lo)
            src = np.uint64(((n * C + c) * H + row) * W + j_lo * stride_w + b - left)
            count = np.uint64(j_hi - j_lo)
            if stride_w == 1:
                for j in range(count):
                    xs_flat[out + j] = x_flat[src + j]
            elif stride_w == 2:  # the common strided case, with a literal stride
                for j in range(count):
                    xs_flat[out + j] = x_flat[src + np.uint64(2) * j]
            else:
                step = np.uint64(stride_w)
                for j in range(count):
                    xs_flat[out + j] = x_flat[src + step * j]


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
def direct_kernel(dtype: str, KB: int, QB: int):
    """The register-blocked kernel for one ``(dtype, KB, QB)``; compiled on first call.

    The returned function computes ``y`` from the source planes (see the module docstring)::

        kernel(xs, image_stride, group_stride, tap_offsets, wpack, bias_packed, Ws,
               chunk, k_ranges, workers, next_item, y)

    xs : 1-D array (the planes, flattened)        # IN
    image_stride, group_stride : int              # IN elements between images / groups in xs
    tap_offsets : (C/groups*R*S,) int64           # IN
    wpack : (groups, nkb, taps, KB)               # IN from :func:`pack_weights`
    bias_packed : (groups, nkb, KB)               # IN zero where there is no bias
    Ws : int                                      # IN pitch of a wide output row
    chunk, k_ranges : int                         # IN the work items (:func:`schedule`)
    workers : int                                 # IN threads taking items
    next_item : (1,) int64                        # INOUT the work counter, zero on entry
    y : (N, K, P, Q)                              # OUT every element written
    """
    scalar = np.dtype(dtype).type

    @njit(parallel=True, cache=True, fastmath={"contract"})
    def direct_conv_blocked(xs, image_stride, group_stride, tap_offsets, wpack, bias_packed, Ws,
                            chunk, k_ranges, workers, next_item, y):
        N, K, P, Q = y.shape
        groups, nkb, taps = wpack.shape[0], wpack.shape[1], wpack.shape[2]
        Kg = K // groups
        wide_length = (P - 1) * Ws + Q
        nqb = (wide_length + QB - 1) // QB
        blocks = N * nqb  # position blocks of one group, image after image
        nchunks = (blocks + chunk - 1) // chunk
        kb_per_range = (nkb + k_ranges - 1) // k_ranges
        yflat = y.reshape(-1)
        items = groups * k_ranges * nchunks
        for worker in prange(workers):  # noqa: B007 (each worker takes items until none are left)
            acc = stack_array_2d(KB, QB, scalar)
            tile = stack_array_2d(KB, QB, scalar)
            while True:
                item = fetch_and_increment(next_item)
                if item >= items:
                    break
                qc = item % nchunks
                rest = item // nchunks
                kr = rest % k_ranges
                g = rest // k_ranges
                for kb in range(kr * kb_per_range, min(nkb, (kr + 1) * kb_per_range)):
                    kvalid = min(KB, Kg - kb * KB)
                    first = qc * chunk
                    n = first // nqb
                    qb = first - n * nqb
                    # (p0, q0) = divmod(j0, Ws), advanced from block to block without a division.
                    p0 = (qb * QB) // Ws
                    q0 = qb * QB - p0 * Ws
                    for _ in range(first, min(blocks, first + chunk)):
                        if qb == nqb:  # the chunk goes on in the next image
                            n += 1
                            qb = p0 = q0 = 0
                        j0 = qb * QB
                        if wide_length >= QB and j0 > wide_length - QB:
                            j0 = wide_length - QB  # stay inside the image; recomputes a few outputs
                            p0 = j0 // Ws
                            q0 = j0 - p0 * Ws
                        base = n * image_stride + g * group_stride + j0

                        for kk in range(KB):
                            for jj in range(QB):
                                acc[kk, jj] = 0
                        for t in range(taps):
                            src = base + tap_offsets[t]
                            for jj in range(QB):
                                xv = xs[np.uint64(src + jj)]
                                for kk in range(KB):
                                    acc[kk, jj] += wpack[g, kb, t, kk] * xv

                        y_block = (n * K + g * Kg + kb * KB) * P * Q
                        if q0 + QB <= Q:
                            # The whole block lies in one output row: constant-length stores.
                            for kk in range(KB):  # constant trip count: acc stays in registers
                                if kk < kvalid:
                                    bk = bias_packed[g, kb, kk]
                                    dst = y_block + kk * P * Q + p0 * Q + q0
                                    for jj in range(QB):
                                        yflat[np.uint64(dst + jj)] = acc[kk, jj] + bk
                        else:
                            for kk in range(KB):
                                bk = bias_packed[g, kb, kk]
                                for jj in range(QB):
                                    tile[kk, jj] = acc[kk, jj] + bk
                            scatter_wrapped_block(
                                tile, kvalid, j0, p0, q0, wide_length, Ws, yflat, y_block, P, Q
                            )
                        qb += 1
                        q0 += QB
                        while q0 >= Ws:
                            q0 -= Ws
                            p0 += 1

    return direct_conv_blocked


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
    threads = get_num_threads()
    set_num_threads(1)
    try:
        _run(problem, x, w, bias, y)
    finally:
        set_num_threads(threads)
    return y


@KNOBS.cached
def _layout(problem, threads: int):
    """``(blocking, planes, tap offsets, schedule)`` of a call: what :func:`_run` computes
    before its kernels, in Python (longer than a small layer's kernel), once per problem, thread
    count and knob state. The offsets are read, never written, by the kernel."""
    blk = choose_blocking(problem)
    planes = _planes(problem, blk.QB)
    return blk, planes, _tap_offsets(problem, planes), schedule(problem, blk, threads)


def _run(problem, x, w, bias, y):
    """Gather, pack and run the kernel with numba's current thread count; fills ``y``."""
    dtype = np.dtype(problem.dtype)
    N = problem.N
    threads = get_num_threads()
    blk, planes, tap_offsets, plan = _layout(problem, threads)
    KB, QB = blk.KB, blk.QB
    groups = problem.groups
    Kg, Cg = problem.K_per_group, problem.C_per_group
    nkb = -(-Kg // KB)
    taps = Cg * problem.R * problem.S

    plane_block = planes.planes_per_channel * planes.Hs * planes.Ws
    if planes.copy:
        # A zero tail of QB elements: a block longer than a whole image reads into it.
        buffer = np.empty(planes.elements(problem) + QB, dtype=dtype)
        buffer[planes.elements(problem):] = 0
        xs6 = buffer[: planes.elements(problem)].reshape(
            N, problem.C, len(planes.phases_h), len(planes.phases_w), planes.Hs, planes.Ws
        )
        gather_source_planes(
            x, np.asarray(planes.phases_h, dtype=np.int64), np.asarray(planes.phases_w, dtype=np.int64),
            problem.stride[0], problem.stride[1], problem.pad_top, problem.pad_left, xs6,
        )
        xs = buffer
    else:
        xs = x.reshape(-1)

    wpack = np.empty((groups, nkb, taps, KB), dtype=dtype)
    pack_weights(w, KB, wpack)
    bias_packed = np.zeros((groups, nkb * KB), dtype=dtype)
    if bias is not None:
        bias_packed[:, :Kg] = bias.reshape(groups, Kg)
    bias_packed = bias_packed.reshape(groups, nkb, KB)

    kernel = direct_kernel(problem.dtype, KB, QB)
    kernel(
        xs, problem.C * plane_block, Cg * plane_block, tap_offsets,
        wpack, bias_packed, planes.Ws, plan.chunk_blocks, plan.k_ranges,
        threads, np.zeros(1, dtype=np.int64), y,
    )
