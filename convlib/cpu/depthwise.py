"""Depthwise (per-channel) convolution on the CPU: ``groups == C``, any channel multiplier.

Each output channel ``k`` reads one input channel, ``c = k // (K / C)``: the convolution is
``N * K`` independent 2-D correlations of one plane with one small filter, about 2 R*S FLOPs per
output against one read of ``x`` and one write of ``y``: bound by memory, not by FMAs. So the
kernel's job is to touch each byte once, which the general algorithms do not do here: direct's
register block holds one channel (its blocks are built for many) and copies the whole input with
its padding first; blis and im2col pack or gather R*S copies of the image.

Four ways through: by the number of filters and the plane's size (:func:`uses_channel_blocks`),
then by the plane's geometry (:func:`uses_whole_planes`, :func:`uses_gathered_planes`, else bands):

*Channel blocks* (``K >= depthwise_channel_block_min_filters``: the depthwise layers of networks,
any geometry; the small stride-1 planes too unless ``depthwise_whole_plane_max_positions`` sends
them to the whole planes below): a vector holds
a register's width of channels of one position (64 bytes with AVX-512, 32 with AVX2), not
positions of one channel. A band's input rows are
transposed into a zero-padded buffer of channel vectors, every output position is ``R*S`` vector
FMAs (at column strides 1 and 2, a few positions at a time from a window of each filter row's
input vectors loaded once: :func:`window_step`), and the outputs are transposed back
(:func:`channel_block_kernel`). MobileNet's strided and 7x7 planes leave the planar ways below
rows too short to vectorise along, and their strided planes a de-interleave per plane; here
neither matters.

The planar ways vectorise along the width of one plane, for few channels (image filters):

*Whole planes* (stride 1, output the size of the image, the taps' masks small): the output plane
and the image plane have the same pitch, so output position ``pos`` (flat, ``p * W + q``) reads
tap ``(r, s)`` at flat ``pos + delta[t]`` of the image plane, straight from ``x``: one long run per
tap over the whole plane (a 7x7 plane is one block of 49 positions, not seven rows of 7, each with
its padding to copy). The positions whose tap falls outside the image (the padding, or a column
that would wrap into the neighbouring row) are selected away by a precomputed mask per tap, so the
padding still enters as ``0 * w``. Planes are the work items, and each result block goes straight
into ``y``. Only the first and last planes of ``x``, whose shifted runs would read past the array,
are copied into a buffer with zero margins. The masks and offsets depend on the plane's geometry
only, so they are computed once per geometry (:func:`_plane_tables`), like the gathered way's
index tables.

*Gathered planes* (other strides, padding and dilations, when a plane's phase buffer is small):
one pass over an index table builds the whole plane's phase planes (de-interleaved as below,
zeros for the padding), once per input plane; the taps then run over its wide rows and a second
table picks the outputs. On small strided planes this beats the bands' many short row copies.

*Bands* (everything else: large planes). Work items are bands of output rows of one plane (a few
contiguous ranges of them per thread, handed out from a shared counter, as in every way here:
:data:`PARTS_PER_THREAD`). A band's input rows are gathered into a per-thread buffer (half an L2:
it stays there), with the zero padding its taps read and, at a stride, split into
the stride's phases (de-interleaved: phase ``(a, b)`` holds rows ``a, a + sh, ...`` and columns
``b, b + sw, ...``), as in :mod:`convlib.cpu.direct`'s source planes but one band at a time: no
padded copy of the tensor exists. At column stride 2 (MobileNet's stride-2 layers) one pass of
vector loads and shuffles splits each input row into both column phases
(:func:`_deinterleave_pairs`). In that buffer every tap ``(r, s)`` is a plain shift, so the
band's outputs are computed along *wide rows* (pitch ``Ws``, the columns past ``Q`` computed and
dropped): one long contiguous run per tap however narrow the image (a 7x7 plane is one run of 61
positions, not seven of 7). A block of the run is :data:`BAND_VECTORS` vector accumulators, and
each tap one broadcast FMA per vector reading the buffer at the tap's shift (:func:`band_block`);
output rows at least a block long are stored straight into ``y`` (a run per row; where the row
stride is a whole number of dilated filter rows, two rows at once, each loaded vector they share
feeding both), shorter ones along the
wide rows and then copied. A band holds ``depthwise_band_bytes`` (half an L2) of input
rows, so few rows are gathered twice. Outputs past half the last-level cache (the knob
``direct_stream_min_bytes``) are written with non-temporal stores where a vector starts on its
boundary: no read for ownership of each line. Padding enters as zeros, so a non-finite weight
meeting it gives NaN, as the definition's sum does.

What a new shape costs: one compilation per ``(R, S, dtype)`` (``cache=True``); sizes,
strides, padding, dilation and the multiplier are run-time values.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from ..core import output_cache
from ..core.problem import ConvProblem
from .compiled_once import CompiledOnce, array_type, call_body, declare, release, share
from .intrinsics import (deinterleave_vector, store_fence, transpose_block, vector_copy, vector_fma,
                         vector_fma_lanes, vector_lanes, vector_stream_plus)
from .isa import simd_bytes
from .stack_buffer import stack_array_1d
from .tables import KNOBS
from .threads import thread_count
from .work_queue import next_range

uintp = np.uintp

#: Wide positions computed per block (on the stack) by the whole and gathered planes: four zmm
#: vectors of float32.
BLOCK = 64

#: Parts of a call's work items per thread, handed out one at a time from a shared counter
#: (:mod:`convlib.cpu.work_queue`): a thread that starts late or is preempted takes fewer. With
#: the static split every call waited for the slower thread's share: after a 10 ms pause (the
#: bench's), MobileNetV2's depthwise layers took 0.480x PyTorch's time with it and 0.442x with the
#: counter, back to back 0.467x and 0.465x (Zen 5, AVX-512, 2 threads). 16 parts a thread made the
#: 112x112 and 56x56 layers 1.2x slower back to back.
PARTS_PER_THREAD = 4

#: Independent accumulators of the bands' blocks: two FMA pipes of four cycles' latency need eight
#: chains in flight.
BAND_VECTORS = 8


def band_block(itemsize: int, vector_bytes: int | None = None) -> tuple[int, int]:
    """``(lanes, positions)`` of the bands' blocks: one vector of ``vector_bytes`` (by default the
    widest registers, :func:`~convlib.cpu.isa.simd_bytes`: zmm on every AVX-512 machine, whatever
    width LLVM's loop vectoriser prefers), :data:`BAND_VECTORS` of them per block."""
    lanes = max(1, (vector_bytes or simd_bytes()) // itemsize)
    return lanes, lanes * BAND_VECTORS


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _phase_extent(P: int, Q: int, R: int, S: int, stride, dilation) -> tuple[int, int]:
    """``(extra, Wp)``: the rows a phase plane holds beyond the ``P`` output rows it serves (the
    taps' reach at the stride), and the pitch of its wide rows (``Q`` plus the taps' reach)."""
    return ((R - 1) * dilation[0]) // stride[0], Q + ((S - 1) * dilation[1]) // stride[1]


def uses_whole_planes(problem: ConvProblem) -> bool:
    """True when the whole-plane way serves ``problem``: stride 1, an output the size of the image
    (so both share one pitch) and masks of at most ``depthwise_plane_mask_bytes``."""
    return (problem.stride == (1, 1) and (problem.P, problem.Q) == (problem.H, problem.W)
            and problem.R * problem.S * _round_up(problem.P * problem.Q, BLOCK) <= KNOBS.depthwise_plane_mask_bytes)


def gathered_geometry(problem: ConvProblem):
    """The gathered way's layout of one plane, computed once per geometry (:func:`_gather_tables`):
    ``(source, tap_offset, output_index, wide_positions)``."""
    return _gather_tables(problem.H, problem.W, problem.P, problem.Q, problem.R, problem.S, problem.stride,
                          problem.pad_top, problem.pad_left, problem.dilation)


@functools.lru_cache(maxsize=64)
def _gather_tables(H, W, P, Q, R, S, stride, top, left, dilation):
    """Index tables of the gathered way.

    The buffer holds the phase planes that some tap reads (phase ``(a, b)``: padded rows
    ``a, a + sh, ...`` and columns ``b, b + sw, ...``), each ``Hp x Wp`` with ``Wp`` the wide-row
    pitch, so every tap is one shifted run over the wide positions ``p * Wp + q``.

    Returns
    -------
    source : int32 array
        For each buffer element, its flat index in the image plane, or -1 for padding (a zero).
    tap_offset : int64 array
        Where tap ``t``'s run starts in the buffer.
    output_index : int64 array
        For each output ``p * Q + q``, its wide position ``p * Wp + q``.
    wide_positions : int
        How many wide positions are computed (``(P - 1) * Wp + Q``).
    """
    sh, sw = stride
    dh, dw = dilation
    extra, Wp = _phase_extent(P, Q, R, S, stride, dilation)
    Hp = P + extra
    phases = sorted({((r * dh) % sh, (s * dw) % sw) for r in range(R) for s in range(S)})
    base = {phase: i * Hp * Wp for i, phase in enumerate(phases)}
    source = np.full(len(phases) * Hp * Wp, -1, np.int32)
    for (a, b), start in base.items():
        rows = np.arange(Hp)[:, None] * sh + a - top
        cols = np.arange(Wp)[None, :] * sw + b - left
        inside = (rows >= 0) & (rows < H) & (cols >= 0) & (cols < W)
        source[start:start + Hp * Wp] = np.where(inside, rows * W + cols, -1).reshape(-1)
    tap_offset = np.array([base[((r * dh) % sh, (s * dw) % sw)] + ((r * dh) // sh) * Wp + (s * dw) // sw
                           for r in range(R) for s in range(S)], np.int64)
    output_index = (np.arange(P)[:, None] * Wp + np.arange(Q)[None, :]).reshape(-1).astype(np.int64)
    return source, tap_offset, output_index, (P - 1) * Wp + Q


def uses_gathered_planes(problem: ConvProblem) -> bool:
    """True when the gathered way serves ``problem`` (not the whole-plane one): a plane's phase
    buffer of at most ``depthwise_gather_bytes``."""
    if uses_whole_planes(problem):
        return False
    extra, Wp = _phase_extent(problem.P, problem.Q, problem.R, problem.S, problem.stride, problem.dilation)
    phases = min(problem.stride[0] * problem.stride[1], problem.R * problem.S)
    return phases * (problem.P + extra) * Wp * problem.itemsize <= KNOBS.depthwise_gather_bytes


@functools.lru_cache(maxsize=64)
def _plane_tables(H, W, R, S, top, left, dilation):
    """The whole-plane way's tables for an ``H x W`` plane (output the same size).

    Returns
    -------
    mask : bool array (R*S * positions,)
        ``mask[t * positions + pos]``: tap ``t`` of output ``pos`` (flat, ``p * W + q``) reads inside
        the image; ``positions`` is ``H * W`` rounded up to whole blocks (the rest False).
    delta : int64 array (R*S,)
        Where tap ``t`` reads relative to its output, in flat positions of the plane.
    """
    dh, dw = dilation
    positions = _round_up(H * W, BLOCK)
    r, s = np.divmod(np.arange(R * S), S)
    rows = np.arange(H)[None, :] + (r * dh - top)[:, None]        # (taps, H): the row each tap reads
    cols = np.arange(W)[None, :] + (s * dw - left)[:, None]       # (taps, W)
    inside = ((rows >= 0) & (rows < H))[:, :, None] & ((cols >= 0) & (cols < W))[:, None, :]
    mask = np.zeros((R * S, positions), np.bool_)
    mask[:, :H * W] = inside.reshape(R * S, H * W)
    delta = ((r * dh - top) * W + s * dw - left).astype(np.int64)
    return mask.reshape(-1), delta


def _plane_margins(problem: ConvProblem) -> tuple[int, int]:
    """Zeros a copied plane needs before and after it so every tap's run stays inside the buffer."""
    before = problem.pad_top * problem.W + problem.pad_left
    after = (_round_up(problem.P * problem.Q, BLOCK) - problem.P * problem.Q
             + (problem.R - 1) * problem.dilation[0] * problem.W + (problem.S - 1) * problem.dilation[1] + 1)
    return before, after


def supports(problem: ConvProblem) -> str | None:
    """None for a depthwise problem (one input channel per group), else why not."""
    if problem.groups == problem.C:
        return None
    return (f"depthwise needs groups == C (one input channel per group); got groups={problem.groups} "
            f"with C={problem.C}")


def geometry(problem: ConvProblem) -> tuple[int, int, int, int, int]:
    """``(rows_per_band, Hs_extra, Ws, phases_h, phases_w)``: output rows per band, the extra rows a
    band's phase planes hold, the pitch of a phase row and the number of phases."""
    phases_h, phases_w = problem.stride  # room for every phase; only those the taps read are gathered
    extra, Ws = _phase_extent(problem.P, problem.Q, problem.R, problem.S, problem.stride, problem.dilation)
    per_row = phases_h * phases_w * Ws * problem.itemsize
    rows = max(1, min(problem.P, KNOBS.depthwise_band_bytes // max(per_row, 1) - extra))
    return rows, extra, Ws, phases_h, phases_w


def workspace_bytes(problem: ConvProblem, device=None) -> int:
    """Whole planes: the taps' masks, and per thread one plane with its margins. Bands: per thread,
    one band's phase planes and its wide-row results (half an L2). Channel blocks: per thread, one
    band's input and output blocks (``depthwise_channel_block_bytes``)."""
    if uses_channel_blocks(problem):
        rows, in_rows, Wb = channel_block_geometry(problem)
        return thread_count() * (in_rows * Wb + rows * problem.Q) * channel_lanes(problem.itemsize) * problem.itemsize
    if uses_whole_planes(problem):
        positions = _round_up(problem.P * problem.Q, BLOCK)
        before, after = _plane_margins(problem)
        return (problem.R * problem.S * positions
                + thread_count() * (before + problem.H * problem.W + after) * problem.itemsize)
    if uses_gathered_planes(problem):
        source, _, output_index, wide = gathered_geometry(problem)
        block = band_block(problem.itemsize)[1]
        per_thread = (source.size + block + _round_up(wide, block)) * problem.itemsize
        return source.nbytes + output_index.nbytes + thread_count() * per_thread
    rows, extra, Ws, phases_h, phases_w = geometry(problem)
    block = band_block(problem.itemsize)[1]
    per_thread = (phases_h * phases_w * (rows + extra) + rows) * Ws + Ws + 2 * block
    return thread_count() * per_thread * problem.itemsize


def pair_taps(acc, wt, buf, off, at, Ws, shift, taps, V2, L):
    """The taps of a pair of output rows ``p``, ``p + 1`` in the bands' kernel, ``V2`` vectors of
    ``L`` lanes each, accumulated into ``acc`` (row ``p`` first): tap ``t`` of row ``p + 1`` reads
    the vector of tap ``t + shift`` of row ``p`` (``shift`` taps = the row stride in filter rows),
    loaded once for both; the first ``shift`` taps serve row ``p`` only, the last ``shift`` row
    ``p + 1`` only, one buffer row (``Ws``) further down. ``off[t]``: tap ``t``'s offset from
    ``at``.

    ``taps``, ``V2`` and ``L`` must be compile-time constants; ``shift`` may be one too (the
    overload is inlined, so a constant at the call site stays one), and then the three loops have
    constant counts, which LLVM unrolls. With run-time counts (a 3x3 filter's: 3,
    6 and 3) stride-1 filters took 1.03-1.28x the time on a Zen 3 (AVX2), and 5x5 and 7x7 filters
    1.0-1.12x on a Xeon (AVX-512), where 3x3 filters went the other way (constant counts 1.11-1.25x
    on one thread, 0.83-1.08x on two): the kernel unrolls them there only for larger filters.
    Stride 2: within 0.94-1.07x either way on both. Jitted code only (an overload, as
    :func:`window_step`).
    """
    raise NotImplementedError("pair_taps is called from numba-compiled code only")


@overload(pair_taps, prefer_literal=True, inline="always", jit_options={"fastmath": {"contract"}})
def _pair_taps_overload(acc, wt, buf, off, at, Ws, shift, taps, V2, L):
    constants = (taps, V2, L)
    if not all(isinstance(c, types.IntegerLiteral) for c in constants):
        return None  # numba retries with the literal types
    n_taps, n_vectors, lanes = (c.literal_value for c in constants)

    def impl(acc, wt, buf, off, at, Ws, shift, taps, V2, L):
        for t in range(shift):  # filter rows 0 .. dr-1: row p only
            first = uintp(off[t]) + at
            for v in range(n_vectors):
                vector_fma(acc, v * lanes, wt, t, buf, first + uintp(v * lanes), lanes)
        for t in range(shift, n_taps):
            first = uintp(off[t]) + at
            for v in range(n_vectors):
                vector_fma(acc, v * lanes, wt, t, buf, first + uintp(v * lanes), lanes)
                vector_fma(acc, (n_vectors + v) * lanes, wt, t - shift, buf, first + uintp(v * lanes), lanes)
        for t in range(n_taps - shift, n_taps):  # filter rows R-dr .. R-1 of row p + 1, one row below
            first = uintp(off[t]) + uintp(Ws) + at
            for v in range(n_vectors):
                vector_fma(acc, (n_vectors + v) * lanes, wt, t, buf, first + uintp(v * lanes), lanes)

    return impl


@functools.lru_cache(maxsize=None)
def depthwise_kernel(R: int, S: int, dtype: str, vector_bytes: int | None = None):
    """The kernel for ``R x S`` filters of ``dtype`` (compile-time constants: the taps are unrolled)::

        kernel(x, w, bias, stride_h, stride_w, top, left, dil_h, dil_w, rows, stream, y_misalign, threads, y)

    x : (N, C, H, W)     IN
    w : (K, 1, R, S)     IN
    bias : (K,)          IN  zeros when the call has no bias
    rows : int           IN  output rows per band (:func:`geometry`)
    stream : bool        IN  non-temporal stores for the vectors of y that start on a vector boundary
    y_misalign : int     IN  y's address in elements, modulo a vector
    y : (N, K, P, Q)     OUT every element written: ``y[n, k] = bias[k] + correlate(x[n, k // m], w[k, 0])``
    """
    taps = R * S
    scalar = np.dtype(dtype).type
    L, block = band_block(np.dtype(dtype).itemsize, vector_bytes)
    V = BAND_VECTORS
    V2 = V // 2  # vectors per row of a pair of rows
    half = V2 * L
    two_rows = 2 * S  # taps between filter rows r and r + 2
    # The pair loops with constant tap counts pay with ymm vectors, and with zmm only for filters
    # above 3x3 (measurements in pair_taps).
    constant_counts = L * np.dtype(dtype).itemsize < 64 or taps > 9
    zero = scalar(0)

    # What the launcher hands each thread's body (compiled once: see compiled_once), and its types.
    values, ints = array_type(dtype, 1), array_type(np.int64, 1)
    i64, flag = types.int64, types.boolean
    ARGUMENTS = declare(types.Tuple((
        values, array_type(dtype, 4), values, values,               # xf, w, bias, yf
        ints, array_type(np.bool_, 1), ints,                        # start, used, taken
        i64, i64, i64, i64, i64, flag, i64,                         # stride_h, stride_w, top, left, rows, stream, y_misalign
        i64, i64, i64, i64, i64, i64, i64,                          # H, W, C, K, P, Q, multiplier
        i64, i64, i64, i64, i64, i64, i64,                          # nph, npw, extra, Ws, plane_size, bands, items
        flag, flag, flag, i64, i64)))                               # pair_columns, rows_direct, pair_rows, shift, parts

    def thread_body(xf, w, bias, yf, start, used, taken, stride_h, stride_w, top, left, rows, stream, y_misalign,
                    H, W, C, K, P, Q, multiplier, nph, npw, extra, Ws, plane_size, bands, items,
                    pair_columns, rows_direct, pair_rows, shift, parts, thread):
        buf = np.zeros(nph * npw * plane_size + block, scalar)  # + block: the last block's overhang
        wide = np.empty(rows * Ws + block, scalar)
        # The taps' weights and offsets on the stack, where LLVM knows they alias nothing.
        wt = stack_array_1d(taps, scalar)
        off = stack_array_1d(taps, np.int64)
        acc = stack_array_1d(block, scalar)
        start_acc = stack_array_1d(L, scalar)
        for t in range(taps):
            off[t] = start[t]
        lo, hi = next_range(taken, items, parts)
        while lo < hi:
            for item in range(lo, hi):
                band = item % bands
                plane = item // bands
                n = plane // K
                k = plane - n * K
                c = k // multiplier
                p0 = band * rows
                pb = min(rows, P - p0)
                for t in range(taps):
                    wt[t] = w[k, 0, t // S, t % S]
                # Gather the band's phase planes: row i of phase (a, b) is padded input row
                # (p0 + i)*sh + a, its column j padded input column j*sw + b (zero outside x).
                src_plane = uintp((n * C + c) * H * W)
                if pair_columns:
                    _deinterleave_pairs(xf, src_plane, H, W, top, left, p0, pb + extra, stride_h, nph, Ws,
                                        plane_size, buf)
                for a in range(nph):
                    for b in range(npw):
                        if pair_columns or not used[a * npw + b]:
                            continue
                        base = (a * npw + b) * plane_size
                        j_lo = min(Ws, max(0, (left - b + stride_w - 1) // stride_w))
                        j_hi = max(j_lo, min(Ws, (W + left - b + stride_w - 1) // stride_w))
                        for i in range(pb + extra):
                            dst = uintp(base + i * Ws)
                            h = (p0 + i) * stride_h + a - top
                            if h < 0 or h >= H:
                                for j in range(uintp(Ws)):
                                    buf[dst + j] = 0
                                continue
                            for j in range(uintp(j_lo)):
                                buf[dst + j] = 0
                            src = src_plane + uintp(h * W + j_lo * stride_w + b - left)
                            out = dst + uintp(j_lo)
                            if stride_w == 1:
                                for j in range(uintp(j_hi - j_lo)):
                                    buf[out + j] = xf[src + j]
                            else:
                                step = uintp(stride_w)
                                for j in range(uintp(j_hi - j_lo)):
                                    buf[out + j] = xf[src + j * step]
                            for j in range(uintp(j_hi), uintp(Ws)):
                                buf[dst + j] = 0
                # Every tap a shifted run of the buffer: the band's wide rows in one pass.
                length = (pb - 1) * Ws + Q
                for jj in range(L):
                    start_acc[jj] = bias[k]
                # Rows of at least a block go straight into y, a run per output row (the last block
                # of a row moved back to end at Q: its overlap is computed twice, identically);
                # shorter ones as one run along the band's wide rows, then copied.
                # Where the row stride is dr whole dilated filter rows, rows go in pairs: tap (r, s)
                # of row p + 1 reads the vector of tap (r + dr, s) of row p, loaded once for both (an
                # unaligned vector load per FMA bound the single rows' 5x5 and 7x7 filters; at stride 2
                # a 7x7 filter shares 5 of its 7 rows: 8192^2/2 0.90x the time on Zen 5).
                pairs = pb // 2 if pair_rows else 0
                for pair in range(pairs):
                    begin = 2 * pair * Ws
                    dst = uintp(((n * K + k) * P + p0 + 2 * pair) * Q)
                    for j in range(0, Q, half):
                        j0 = min(j, Q - half)
                        for v in range(V2):
                            vector_copy(acc, v * L, start_acc, 0, L)
                            vector_copy(acc, (V2 + v) * L, start_acc, 0, L)
                        at = uintp(begin + j0)
                        if constant_counts and shift == S:  # row stride one filter row (stride 1)
                            pair_taps(acc, wt, buf, off, at, Ws, S, taps, V2, L)
                        elif constant_counts and shift == two_rows:  # two (stride 2)
                            pair_taps(acc, wt, buf, off, at, Ws, two_rows, taps, V2, L)
                        else:
                            pair_taps(acc, wt, buf, off, at, Ws, shift, taps, V2, L)
                        if stream and (y_misalign + dst + j0) % L == 0 and Q % L == 0:
                            for v in range(V2):
                                vector_stream_plus(yf, dst + uintp(j0 + v * L), acc, v * L, zero, L)
                                vector_stream_plus(yf, dst + uintp(Q + j0 + v * L), acc, (V2 + v) * L, zero, L)
                        else:
                            for v in range(V2):
                                vector_copy(yf, dst + uintp(j0 + v * L), acc, v * L, L)
                                vector_copy(yf, dst + uintp(Q + j0 + v * L), acc, (V2 + v) * L, L)
                for run in range(2 * pairs, pb if rows_direct else 1):
                    begin = run * Ws if rows_direct else 0
                    count = Q if rows_direct else length
                    dst = uintp(((n * K + k) * P + p0 + run) * Q)
                    for j in range(0, count, block):
                        j0 = min(j, count - block) if rows_direct else j
                        # V independent vector accumulators, each tap one broadcast FMA per
                        # vector: left to LLVM, the sum over taps inside the loop over positions
                        # stayed scalar or half-vectorised (7x7 filters ran at 5% of the FMA peak).
                        for v in range(V):
                            vector_copy(acc, v * L, start_acc, 0, L)
                        for t in range(taps):
                            at = uintp(off[t] + begin + j0)
                            for v in range(V):
                                vector_fma(acc, v * L, wt, t, buf, at + uintp(v * L), L)
                        if rows_direct and stream and (y_misalign + dst + j0) % L == 0:
                            for v in range(V):
                                vector_stream_plus(yf, dst + uintp(j0 + v * L), acc, v * L, zero, L)
                        elif rows_direct:
                            for v in range(V):
                                vector_copy(yf, dst + uintp(j0 + v * L), acc, v * L, L)
                        else:
                            for v in range(V):
                                vector_copy(wide, uintp(j0 + v * L), acc, v * L, L)
                if not rows_direct:
                    for p in range(pb):
                        dst = uintp(((n * K + k) * P + p0 + p) * Q)
                        src_row = uintp(p * Ws)
                        for q in range(uintp(Q)):
                            yf[dst + q] = wide[src_row + q]
            lo, hi = next_range(taken, items, parts)
        if stream:
            store_fence()

    @njit(parallel=True, cache=True, fastmath={"contract"})
    def depthwise_conv(x, w, bias, stride_h, stride_w, top, left, dil_h, dil_w, rows, stream, y_misalign,
                       threads, y, body):
        N, C, H, W = x.shape
        K = w.shape[0]
        P, Q = y.shape[2], y.shape[3]
        multiplier = K // C
        nph, npw = stride_h, stride_w
        extra = ((R - 1) * dil_h) // stride_h
        Ws = Q + ((S - 1) * dil_w) // stride_w
        Hs = rows + extra  # rows of a band's phase plane
        plane_size = Hs * Ws
        # Where tap (r, s) reads in a band's buffer, relative to wide position 0 of the band.
        start = np.empty(taps, np.int64)
        used = np.zeros(nph * npw, np.bool_)  # the phases some tap reads
        for r in range(R):
            for s in range(S):
                a, b = (r * dil_h) % stride_h, (s * dil_w) % stride_w
                used[a * npw + b] = True
                start[r * S + s] = (a * npw + b) * plane_size + ((r * dil_h) // stride_h) * Ws + (s * dil_w) // stride_w
        bands = (P + rows - 1) // rows
        items = N * K * bands
        # Column stride 2 without column dilation: both column phases come from one pass over each
        # input row (even and odd columns, a vector de-interleave), not two scalar strided copies.
        pair_columns = stride_w == 2 and dil_w == 1
        rows_direct = Q >= block
        # Output row p + 1 reads with filter row r what row p reads with filter row r + dr, one plane
        # row further down, when dr = stride / dilation is whole: rows go in pairs, one load for
        # two FMAs on the R - dr filter rows they share.
        dr = stride_h // dil_h if stride_h % dil_h == 0 else R
        pair_rows = rows_direct and dr < R
        shift = dr * S  # taps between filter rows r and r + dr
        parts = max(1, min(items, PARTS_PER_THREAD * threads))
        taken = np.zeros(1, np.int64)  # parts handed out so far (see work_queue)
        # Flat views made once: a view of x or y made inside the loops would touch their shared
        # reference counts, atomically, from every thread.
        xf, yf = x.reshape(-1), y.reshape(-1)
        arguments = (xf, w, bias, yf, start, used, taken, stride_h, stride_w, top, left, rows, stream, y_misalign,
                     H, W, C, K, P, Q, multiplier, nph, npw, extra, Ws, plane_size, bands, items,
                     pair_columns, rows_direct, pair_rows, shift, parts)
        shared = share(arguments, ARGUMENTS)
        for t in prange(threads):
            call_body(body, shared, t, ARGUMENTS)
        release(shared, ARGUMENTS)

    return CompiledOnce(depthwise_conv, thread_body, ARGUMENTS, fastmath={"contract"})


@njit(inline="always")
def _deinterleave_pairs(xf, src_plane, H, W, top, left, p0, band_rows, stride_h, nph, Ws, plane_size, buf):
    """A band's phase planes at column stride 2: input column ``col`` goes to column phase
    ``(col + left) % 2`` at ``(col + left) // 2``; each input row is read once, two columns at a
    time (:func:`~convlib.cpu.intrinsics.deinterleave_vector`: two loads, two shuffles, two
    stores per 32 bytes of each phase), padding columns and rows written as zeros."""
    half = W // 2
    even_phase, odd_phase = left % 2, (left + 1) % 2  # where input columns 2m and 2m + 1 go
    even_at, odd_at = left // 2, (left + 1) // 2  # ... at phase columns m + even_at, m + odd_at
    for a in range(nph):
        for i in range(band_rows):
            h = (p0 + i) * stride_h + a - top
            even_row = uintp((a * 2 + even_phase) * plane_size + i * Ws)
            odd_row = uintp((a * 2 + odd_phase) * plane_size + i * Ws)
            if h < 0 or h >= H:
                for j in range(uintp(Ws)):
                    buf[even_row + j] = 0
                    buf[odd_row + j] = 0
                continue
            # Phase columns before the image, and after the last input column a phase row holds,
            # are padding. (Input columns past Ws * 2 serve no output and are not read.)
            n_even = min(half + W % 2, Ws - even_at)
            n_odd = min(half, Ws - odd_at)
            for j in range(uintp(even_at)):
                buf[even_row + j] = 0
            for j in range(uintp(odd_at)):
                buf[odd_row + j] = 0
            src = src_plane + uintp(h * W)
            e0, o0 = even_row + uintp(even_at), odd_row + uintp(odd_at)
            pairs = min(n_even, n_odd)
            lanes = vector_lanes(buf)
            whole = pairs // lanes * lanes
            for m in range(0, whole, lanes):
                deinterleave_vector(buf, e0 + uintp(m), o0 + uintp(m), xf, src + uintp(2 * m))
            for m in range(uintp(whole), uintp(pairs)):
                buf[e0 + m] = xf[src + 2 * m]
                buf[o0 + m] = xf[src + 2 * m + 1]
            for m in range(uintp(pairs), uintp(n_even)):
                buf[e0 + m] = xf[src + 2 * m]
            for m in range(uintp(pairs), uintp(n_odd)):
                buf[o0 + m] = xf[src + 2 * m + 1]
            for j in range(uintp(even_at + n_even), uintp(Ws)):
                buf[even_row + j] = 0
            for j in range(uintp(odd_at + n_odd), uintp(Ws)):
                buf[odd_row + j] = 0


@functools.lru_cache(maxsize=None)
def whole_plane_kernel(R: int, S: int, dtype: str):
    """The whole-plane kernel for ``R x S`` filters of ``dtype`` (stride 1, output size = image size)::

        kernel(x, w, bias, mask, delta, before, after, threads, y)

    x : (N, C, H, W)     IN
    w : (K, 1, R, S)     IN
    bias : (K,)          IN  zeros when the call has no bias
    mask, delta          IN  the taps' masks and offsets (:func:`_plane_tables`)
    before, after : int  IN  zero margins of a copied plane (:func:`_plane_margins`)
    y : (N, K, H, W)     OUT every element written
    """
    taps = R * S
    scalar = np.dtype(dtype).type

    @njit(parallel=True, cache=True, fastmath={"contract"})
    def depthwise_planes(x, w, bias, mask, delta, before, after, threads, y):
        N, C, H, W = x.shape
        K = w.shape[0]
        multiplier = K // C
        HW = H * W
        positions = mask.size // taps
        total = N * C * HW
        items = N * K
        parts = max(1, min(items, PARTS_PER_THREAD * threads))
        taken = np.zeros(1, np.int64)  # parts handed out so far (see work_queue)
        xf, yf = x.reshape(-1), y.reshape(-1)
        for _ in prange(threads):
            buf = np.zeros(before + HW + after, x.dtype)
            wt = stack_array_1d(taps, scalar)
            run_start = stack_array_1d(taps, np.uintp)
            acc = stack_array_1d(BLOCK, scalar)
            lo, hi = next_range(taken, items, parts)
            while lo < hi:
                for item in range(lo, hi):
                    n = item // K
                    k = item - n * K
                    c = k // multiplier
                    for t in range(taps):
                        wt[t] = w[k, 0, t // S, t % S]
                    start = (n * C + c) * HW
                    # Interior planes are read in place: their runs stray into the neighbouring planes
                    # only where the masks select zeros. The first and last would read past x.
                    if start >= before and start + HW + after <= total:
                        src = xf
                        origin = start
                    else:
                        for j in range(HW):
                            buf[before + j] = xf[start + j]
                        src = buf
                        origin = before
                    for t in range(taps):
                        run_start[t] = uintp(origin + delta[t])
                    bk = bias[k]
                    dst = uintp(item * HW)
                    for j0 in range(0, HW, BLOCK):
                        # Results on the stack first: stores into y could alias the loads (x may be y's
                        # neighbour for all LLVM knows), which kept the loop scalar.
                        for jj in range(BLOCK):
                            pos = uintp(j0) + uintp(jj)
                            v = bk
                            for t in range(taps):
                                value = src[run_start[t] + pos]
                                v += wt[t] * (value if mask[uintp(t * positions) + pos] else scalar(0))
                            acc[jj] = v
                        for jj in range(uintp(min(BLOCK, HW - j0))):
                            yf[dst + uintp(j0) + jj] = acc[jj]
                lo, hi = next_range(taken, items, parts)

    return depthwise_planes


@functools.lru_cache(maxsize=None)
def gathered_plane_kernel(R: int, S: int, dtype: str):
    """The gathered kernel for ``R x S`` filters of ``dtype`` (any stride, padding, dilation)::

        kernel(x, w, bias, source, tap_offset, output_index, wide, threads, y)

    x : (N, C, H, W)        IN
    w : (K, 1, R, S)        IN
    bias : (K,)             IN  zeros when the call has no bias
    source, tap_offset, output_index, wide : IN  the plane's layout (:func:`_gather_tables`)
    y : (N, K, P, Q)        OUT every element written
    """
    taps = R * S
    scalar = np.dtype(dtype).type
    L, block = band_block(np.dtype(dtype).itemsize)
    V = BAND_VECTORS

    @njit(parallel=True, cache=True, fastmath={"contract"})
    def depthwise_gathered(x, w, bias, source, tap_offset, output_index, wide, threads, y):
        N, C, H, W = x.shape
        K = w.shape[0]
        PQ = y.shape[2] * y.shape[3]
        multiplier = K // C
        HW = H * W
        items = N * K
        parts = max(1, min(items, PARTS_PER_THREAD * threads))
        taken = np.zeros(1, np.int64)  # parts handed out so far (see work_queue)
        xf, yf = x.reshape(-1), y.reshape(-1)
        for _ in prange(threads):
            buf = np.empty(source.size + block, x.dtype)
            buf[source.size:] = 0  # the last block's overhang
            row = np.empty((wide + block - 1) // block * block, y.dtype)
            wt = stack_array_1d(taps, scalar)
            off = stack_array_1d(taps, np.uintp)
            acc = stack_array_1d(block, scalar)
            start_acc = stack_array_1d(L, scalar)
            for t in range(taps):
                off[t] = uintp(tap_offset[t])
            last_plane = -1
            lo, hi = next_range(taken, items, parts)
            while lo < hi:
                for item in range(lo, hi):
                    n = item // K
                    k = item - n * K
                    plane = n * C + k // multiplier
                    for t in range(taps):
                        wt[t] = w[k, 0, t // S, t % S]
                    # The phase planes in one pass over a table (masked gathers, padding as zeros),
                    # once per input plane however many output channels read it.
                    if plane != last_plane:
                        start = plane * HW
                        for i in range(uintp(source.size)):
                            j = source[i]
                            buf[i] = xf[start + j] if j >= 0 else 0
                        last_plane = plane
                    for jj in range(L):
                        start_acc[jj] = bias[k]
                    # As the bands' blocks: V vector accumulators, one broadcast FMA per tap and vector.
                    for j0 in range(0, wide, block):
                        for v in range(V):
                            vector_copy(acc, v * L, start_acc, 0, L)
                        for t in range(taps):
                            at = off[t] + uintp(j0)
                            for v in range(V):
                                vector_fma(acc, v * L, wt, t, buf, at + uintp(v * L), L)
                        for v in range(V):
                            vector_copy(row, uintp(j0 + v * L), acc, v * L, L)
                    dst = uintp(item * PQ)
                    for i in range(uintp(PQ)):
                        yf[dst + i] = row[output_index[i]]
                lo, hi = next_range(taken, items, parts)

    return depthwise_gathered


def channel_lanes(itemsize: int) -> int:
    """Channels per block of the channel-blocked way: one vector register's width
    (:func:`~convlib.cpu.isa.simd_bytes`: 16 float32 with AVX-512, 8 with AVX2). With AVX2 the
    blocks were 64 bytes until session 37: a 16x16 transpose then needed 32 ymm registers of the
    16 there are, and the transposes took most of the time; blocks of 8 channels took 0.62-0.87x
    the time on MobileNetV2's depthwise layers (Zen 3, ``.device/s37/ab_lanes.py``)."""
    return simd_bytes() // itemsize


def uses_channel_blocks(problem: ConvProblem) -> bool:
    """True when the channel-blocked way serves ``problem``: at least
    ``depthwise_channel_block_min_filters`` filters, so blocks of whole vectors of channels are
    mostly full (one-channel image filters keep the ways that vectorise along the width), unless
    the whole-plane way serves it with planes of more than one block (:data:`BLOCK` positions) and
    at most ``depthwise_whole_plane_max_positions``: there a plane is a few blocks of one run per
    tap, read in place, where the channel blocks transpose every element in and out. By default
    none (the knob is 0: since the channel blocks' windowed steps, they take 0.58-1.0x the whole
    planes' time back to back on MobileNetV2's 14x14 layers; see :mod:`convlib.cpu.tables`); the
    tuner measures it. A plane of one block leaves its last vectors part empty: 7x7 took 0.95-1.2x
    the time by whole planes."""
    if problem.K < KNOBS.depthwise_channel_block_min_filters:
        return False
    positions = problem.H * problem.W
    return not (BLOCK < positions <= KNOBS.depthwise_whole_plane_max_positions and uses_whole_planes(problem))


def channel_block_geometry(problem: ConvProblem) -> tuple[int, int, int]:
    """``(rows, in_rows, Wb)`` of the channel-blocked way: output rows per band, the padded input
    rows a full band reads, and the width of the padded, channel-interleaved buffer (every image
    column and every column a tap reads). Bands are sized so that a band's input and output blocks
    fit ``depthwise_channel_block_bytes``."""
    (sh, sw), (dh, dw) = problem.stride, problem.dilation
    lanes = channel_lanes(problem.itemsize)
    Wb = max(problem.pad_left + problem.W, (problem.Q - 1) * sw + (problem.S - 1) * dw + 1)
    vector = lanes * problem.itemsize
    per_row = (sh * Wb + problem.Q) * vector
    fixed = ((problem.R - 1) * dh + 1 - sh) * Wb * vector
    rows = max(1, min(problem.P, (KNOBS.depthwise_channel_block_bytes - fixed) // per_row))
    return rows, (rows - 1) * sh + (problem.R - 1) * dh + 1, Wb


def window_step(acc, wt, buf, at, filter_row, win, R, S, ways, L, column_stride):
    """One step of the channel-blocked kernel at column stride ``column_stride`` (1 or 2) and no
    column dilation: ``acc[v] += sum_{r,s} wt[r*S + s] * buf[at + r*filter_row + (v*column_stride
    + s)*L]`` for the ``ways`` positions ``v``. Each filter row's ``(ways - 1) * column_stride +
    S`` input vectors are loaded once into ``win`` (which the compiler keeps in registers) and feed
    every position and tap that reads them: 18 loads for 36 FMAs at stride 1 (3x3, 4 ways), 27
    at stride 2, where the general step loaded each FMA's input and reloaded the taps' offsets
    from the stack (63 loads). MobileNetV2's depthwise layers at batch 8 took 0.61-0.84x the time
    at stride 1 and 0.88-0.98x at stride 2 (Zen 5, AVX-512; 0.85-0.90x and 0.94-0.96x in AVX2).

    ``R``, ``S``, ``ways``, ``L`` and ``column_stride`` must be compile-time constants. Jitted code
    only: an overload, so that the kernel calling it refers to no jitted function of its own. A
    closure over one (as this step was until 2026-11-29) made numba's cache key of the kernel
    differ in every process (it pickles a closure's variables, and a dispatcher pickles with a
    fresh id), so the kernel was compiled again in every process: 7 s of the digits example's
    first training, 5-10 s of every tuning run.
    """
    raise NotImplementedError("window_step is called from numba-compiled code only")


@overload(window_step, prefer_literal=True, inline="always", jit_options={"fastmath": {"contract"}})
def _window_step_overload(acc, wt, buf, at, filter_row, win, R, S, ways, L, column_stride):
    constants = (R, S, ways, L, column_stride)
    if not all(isinstance(c, types.IntegerLiteral) for c in constants):
        return None  # numba retries with the literal types
    r_taps, s_taps, n_ways, lanes, stride = (c.literal_value for c in constants)
    span = (n_ways - 1) * stride + s_taps

    def impl(acc, wt, buf, at, filter_row, win, R, S, ways, L, column_stride):
        for r in range(r_taps):
            first = at + uintp(r) * filter_row
            for j in range(span):
                vector_copy(win, j * lanes, buf, first + uintp(j * lanes), lanes)
            for s in range(s_taps):
                for v in range(n_ways):
                    vector_fma_lanes(acc, v * lanes, wt, (r * s_taps + s) * lanes, win,
                                     (v * stride + s) * lanes, lanes)

    return impl


@functools.lru_cache(maxsize=None)
def channel_block_kernel(R: int, S: int, dtype: str, ways: int):
    """The channel-blocked kernel for ``R x S`` filters of ``dtype`` (any stride, padding, dilation,
    multiplier), computing ``ways`` output positions per step::

        kernel(x, w, bias, stride_h, stride_w, top, left, dil_h, dil_w, rows, in_rows, Wb, windowed, threads, y)

    x : (N, C, H, W)     IN
    w : (K, 1, R, S)     IN
    bias : (K,)          IN  zeros when the call has no bias
    rows, in_rows, Wb    IN  the band geometry (:func:`channel_block_geometry`)
    windowed             IN  steps at column strides 1 and 2 load each filter row's inputs once
                             (:func:`window_step`)
    y : (N, K, P, Q)     OUT every element written

    Work items are (image, block of ``L`` output channels, band of output rows). A band's input
    rows are transposed, ``L x L`` elements at a time (:func:`~convlib.cpu.intrinsics.transpose_block`),
    into a buffer of channel vectors, position by position, with zero padding around the image;
    each output position is then ``R*S`` vector FMAs on the buffer with the ``L`` channels'
    weights, at any stride or dilation alike (a tap of a strided output is one vector, no
    de-interleaving), ``ways`` positions at a time (independent chains of FMAs); the band's outputs
    are transposed back into ``y``.
    Small planes (MobileNet's 7x7 to 28x28) give the other ways rows too short to vectorise along;
    here a vector always holds ``L`` channels.
    """
    taps = R * S
    scalar = np.dtype(dtype).type
    L = channel_lanes(np.dtype(dtype).itemsize)
    block = L * L
    weights = taps * L
    accumulators = ways * L
    window = (2 * (ways - 1) + S) * L  # the step's input vectors of one filter row

    @njit(parallel=True, cache=True, fastmath={"contract"})
    def depthwise_channel_blocks(x, w, bias, stride_h, stride_w, top, left, dil_h, dil_w, rows, in_rows, Wb,
                                 windowed, threads, y):
        N, C, H, W = x.shape
        K = w.shape[0]
        P, Q = y.shape[2], y.shape[3]
        multiplier = K // C
        HW, PQ = H * W, P * Q
        kblocks = (K + L - 1) // L
        bands = (P + rows - 1) // rows
        items = N * kblocks * bands
        parts = max(1, min(items, PARTS_PER_THREAD * threads))
        taken = np.zeros(1, np.int64)  # parts handed out so far (see work_queue)
        xf, yf = x.reshape(-1), y.reshape(-1)
        step = uintp(stride_w * L)
        filter_row = uintp(dil_h * Wb * L)  # from one filter row's inputs to the next in the buffer
        windowed_1 = windowed and stride_w == 1 and dil_w == 1  # steps by window_step at stride 1
        windowed_2 = windowed and stride_w == 2 and dil_w == 1  # ... at stride 2
        # Each block's weights, tap-major (a vector of L channels per tap), then its biases: read as
        # whole vectors per item. Lanes past the last filter repeat it (computed, then dropped).
        blocks = np.empty(kblocks * (taps + 1) * L, w.dtype)
        for kb in range(kblocks):
            for l in range(L):
                k = min(kb * L + l, K - 1)
                for t in range(taps):
                    blocks[(kb * (taps + 1) + t) * L + l] = w[k, 0, t // S, t % S]
                blocks[(kb * (taps + 1) + taps) * L + l] = bias[k]
        for _ in prange(threads):
            # Zeros once: the columns left and right of the image are never written.
            buf = np.zeros(in_rows * Wb * L, x.dtype)
            out = np.empty(rows * Q * L, y.dtype)
            wt = stack_array_1d(weights, scalar)
            bl = stack_array_1d(L, scalar)
            acc = stack_array_1d(accumulators, scalar)
            win = stack_array_1d(window, scalar)
            tmp = stack_array_1d(block, scalar)
            toff = stack_array_1d(taps, np.uintp)
            for t in range(taps):
                toff[t] = uintp(((t // S) * dil_h * Wb + (t % S) * dil_w) * L)
            lo, hi = next_range(taken, items, parts)
            while lo < hi:
                for item in range(lo, hi):
                    band = item % bands
                    kb = (item // bands) % kblocks
                    n = item // (bands * kblocks)
                    k0 = kb * L
                    lanes = min(L, K - k0)
                    p0 = band * rows
                    pb = min(rows, P - p0)
                    for t in range(taps):
                        vector_copy(wt, t * L, blocks, uintp((kb * (taps + 1) + t) * L), L)
                    vector_copy(bl, 0, blocks, uintp((kb * (taps + 1) + taps) * L), L)
                    # Buffer row i is padded input row p0*sh + i: image rows h_lo..h_hi, zeros around.
                    h_first = p0 * stride_h - top
                    band_rows = (pb - 1) * stride_h + (R - 1) * dil_h + 1
                    h_lo, h_hi = max(0, h_first), min(H, h_first + band_rows)
                    for i in range(band_rows):
                        if i + h_first < h_lo or i + h_first >= h_hi:
                            for j in range(uintp(Wb * L)):
                                buf[uintp(i * Wb * L) + j] = 0
                    if h_hi > h_lo:
                        if lanes == L and multiplier == 1:
                            plane0 = uintp((n * C + k0) * HW)
                            first, last = h_lo * W, h_hi * W
                            whole = first + (last - first) // L * L
                            i, jc = h_lo - h_first, 0
                            for pos0 in range(first, whole, L):
                                if jc + L <= W:  # the block's positions lie in one row: straight in
                                    transpose_block(buf, uintp((i * Wb + jc + left) * L), L, xf, plane0 + uintp(pos0),
                                                    HW, L)
                                    jc += L
                                    if jc == W:
                                        jc = 0
                                        i += 1
                                    continue
                                transpose_block(tmp, 0, L, xf, plane0 + uintp(pos0), HW, L)
                                for j in range(L):
                                    vector_copy(buf, uintp((i * Wb + jc + left) * L), tmp, j * L, L)
                                    jc += 1
                                    if jc == W:
                                        jc = 0
                                        i += 1
                            for pos in range(whole, last):
                                h, jc = divmod(pos, W)
                                d = uintp(((h - h_first) * Wb + jc + left) * L)
                                for l in range(L):
                                    buf[d + uintp(l)] = xf[plane0 + uintp(l * HW + pos)]
                        else:
                            for l in range(lanes):
                                src = uintp((n * C + (k0 + l) // multiplier) * HW)
                                for h in range(h_lo, h_hi):
                                    d = uintp(((h - h_first) * Wb + left) * L + l)
                                    s0 = src + uintp(h * W)
                                    for j in range(uintp(W)):
                                        buf[d + j * uintp(L)] = xf[s0 + j]
                    # Each output: R*S vector FMAs over the channels; `ways` outputs per step.
                    for p in range(pb):
                        row = uintp(p * stride_h * Wb * L)
                        o_row = uintp(p * Q * L)
                        q = 0
                        # A loop per kind of step: the stride test stays out of the loops of FMAs.
                        while windowed_1 and q + ways <= Q:
                            for v in range(ways):
                                vector_copy(acc, v * L, bl, 0, L)
                            window_step(acc, wt, buf, row + uintp(q * L), filter_row, win, R, S, ways, L, 1)
                            for v in range(ways):
                                vector_copy(out, o_row + uintp((q + v) * L), acc, v * L, L)
                            q += ways
                        while windowed_2 and q + ways <= Q:
                            for v in range(ways):
                                vector_copy(acc, v * L, bl, 0, L)
                            window_step(acc, wt, buf, row + uintp(q) * step, filter_row, win, R, S, ways, L, 2)
                            for v in range(ways):
                                vector_copy(out, o_row + uintp((q + v) * L), acc, v * L, L)
                            q += ways
                        while q + ways <= Q:
                            at = row + uintp(q) * step
                            for v in range(ways):
                                vector_copy(acc, v * L, bl, 0, L)
                            for t in range(taps):
                                o = at + toff[t]
                                for v in range(ways):
                                    vector_fma_lanes(acc, v * L, wt, t * L, buf, o + uintp(v) * step, L)
                            for v in range(ways):
                                vector_copy(out, o_row + uintp((q + v) * L), acc, v * L, L)
                            q += ways
                        while q < Q:
                            at = row + uintp(q) * step
                            vector_copy(acc, 0, bl, 0, L)
                            for t in range(taps):
                                vector_fma_lanes(acc, 0, wt, t * L, buf, at + toff[t], L)
                            vector_copy(out, o_row + uintp(q * L), acc, 0, L)
                            q += 1
                    # The band's outputs back into y: its rows are one flat run of each plane.
                    dst0 = uintp((n * K + k0) * PQ + p0 * Q)
                    count = pb * Q
                    if lanes == L:
                        whole = count // L * L
                        for pos0 in range(0, whole, L):
                            transpose_block(yf, dst0 + uintp(pos0), PQ, out, uintp(pos0 * L), L, L)
                        for pos in range(whole, count):
                            for l in range(L):
                                yf[dst0 + uintp(l * PQ + pos)] = out[uintp(pos * L + l)]
                    else:
                        for l in range(lanes):
                            for pos in range(uintp(count)):
                                yf[dst0 + uintp(l * PQ) + pos] = out[pos * uintp(L) + uintp(l)]
                lo, hi = next_range(taken, items, parts)

    return depthwise_channel_blocks


@dataclass(frozen=True)
class _Launch:
    """Everything of a call but its arrays, computed once per problem, thread count and knob state
    (:func:`_launch`), as direct, blis and Winograd keep theirs: deciding the way, its geometry
    and tables, and looking up the kernel took 26 us of Python a call (Zen 3), more than the
    kernel of a small layer (7 us for one 4x4 image of 16 channels)."""

    kernel: object
    leading: tuple  # the kernel's arguments after (x, w, bias)
    trailing: tuple  # the bands' arguments after (stream, y_misalign); all of them for other ways
    zero_bias: np.ndarray  # the bias of a call without one (read only)
    bands: bool  # the bands way: two arguments between leading and trailing follow y's address
    may_stream: bool  # the bands' output is large enough for non-temporal stores
    lanes: int  # the bands' vector lanes (for y's misalignment)


@KNOBS.cached
def _launch(problem: ConvProblem, threads: int, vector_bytes: int) -> _Launch:
    """The :class:`_Launch` of ``problem`` on ``threads`` threads with vectors of ``vector_bytes``."""
    zero_bias = np.zeros(problem.K, problem.dtype)
    R, S, dtype = problem.R, problem.S, problem.dtype
    (sh, sw), (dh, dw) = problem.stride, problem.dilation
    if uses_channel_blocks(problem):
        rows, in_rows, Wb = channel_block_geometry(problem)
        kernel = channel_block_kernel(R, S, dtype, KNOBS.depthwise_channel_block_ways)
        leading = (sh, sw, problem.pad_top, problem.pad_left, dh, dw, rows, in_rows, Wb,
                   KNOBS.depthwise_channel_block_window, threads)
        return _Launch(kernel, leading, (), zero_bias, False, False, 0)
    if uses_whole_planes(problem):
        before, after = _plane_margins(problem)
        mask, delta = _plane_tables(problem.H, problem.W, R, S, problem.pad_top, problem.pad_left, problem.dilation)
        leading = (mask, delta, before, after, threads)
        return _Launch(whole_plane_kernel(R, S, dtype), leading, (), zero_bias, False, False, 0)
    if uses_gathered_planes(problem):
        source, tap_offset, output_index, wide = gathered_geometry(problem)
        leading = (source, tap_offset, output_index, wide, threads)
        return _Launch(gathered_plane_kernel(R, S, dtype), leading, (), zero_bias, False, False, 0)
    rows = geometry(problem)[0]
    kernel = depthwise_kernel(R, S, dtype, vector_bytes)
    leading = (sh, sw, problem.pad_top, problem.pad_left, dh, dw, rows)
    # Outputs past half the last-level cache skip the read for ownership of each line (as direct's).
    may_stream = problem.output_bytes >= KNOBS.direct_stream_min_bytes
    return _Launch(kernel, leading, (threads,), zero_bias, True, may_stream, band_block(problem.itemsize)[0])


def run(problem: ConvProblem, x, w, bias, device=None):
    """Depthwise convolution of ``x`` with ``w`` (the implementation contract of
    :mod:`convlib.core.contracts`)."""
    y = output_cache.empty(problem.y_shape, problem.dtype)
    launch = _launch(problem, thread_count(), simd_bytes())
    if bias is None:
        bias = launch.zero_bias
    if not launch.bands:
        launch.kernel(x, w, bias, *launch.leading, y)
        return y
    address, itemsize = y.__array_interface__["data"][0], problem.itemsize
    stream = launch.may_stream and address % itemsize == 0
    launch.kernel(x, w, bias, *launch.leading, stream, (address // itemsize) % launch.lanes, *launch.trailing, y)
    return y
