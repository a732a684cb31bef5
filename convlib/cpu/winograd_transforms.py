"""The Winograd transforms of :mod:`convlib.cpu.winograd`, as numba kernels.

Three kernels per tile size ``m`` (``alpha = m + 2``): :func:`filter_transform_kernel`
(``U = G w G^T``, computed in float64 and rounded once), :func:`input_transform_kernel`
(``V = B^T d B`` for every tile of a chunk) and :func:`output_transform_kernel` (``y = A^T m A +
bias``, partial edge tiles storing only their existing outputs). The input rows of all tile rows
of a chunk are laid end to end, so both 1-D passes (down the columns, then along the rows) run
along every tile of the chunk at once, however narrow the image.

Every 1-D pass (:func:`transform_pass`) computes blocks of columns into a stack buffer and then
stores them, which is what lets LLVM vectorise it (see :func:`_transform_pass`). The 1-D
transforms are written out by hand below (numba cannot drop a product with a zero matrix entry
without fast-math); ``tests/test_winograd.py`` checks them against the matrices of
:mod:`convlib.core.winograd_math`.

Compilation: the kernels are specialised (``lru_cache``) per tile size ``m`` and, through the
array types, per dtype; shapes are run-time arguments. They are compiled with ``cache=True``;
numba invalidates those entries when this file changes, but not when
:mod:`convlib.cpu.stack_buffer` does: clear ``__pycache__`` then.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit, prange, types
from numba.extending import overload
from numba.np import numpy_support

from .compiled_once import CompiledOnce, array_type, call_body, declare, release, share
from .intrinsics import copy_row, deinterleave_run, lanes_per_register, register_lanes
from .stack_buffer import stack_array_1d, stack_array_2d
from .tables import KNOBS

uintp = np.uintp

def _as_type_of(like, value):
    """``value`` converted to the numba scalar type of ``like`` (jitted code only)."""
    raise NotImplementedError("jitted code only")


@overload(_as_type_of, inline="always")
def _as_type_of_overload(like, value):
    # A float literal in a float32 kernel would promote the whole transform to float64.
    cast = numpy_support.as_dtype(like).type

    def impl(like, value):
        return cast(value)

    return impl


#: Work parts per thread in the transforms: each part allocates its scratch buffers once, and
#: a few parts per thread even out threads slowed by others on a shared machine (a compile-time
#: knob of :data:`convlib.cpu.tables.KNOBS`).
PARTS_PER_THREAD = KNOBS.winograd_parts_per_thread


@njit(inline="always")
def _parts(total, threads):
    """How many ``prange`` parts to split ``total`` items into (see :data:`PARTS_PER_THREAD`).

    ``threads`` comes from the caller: ``numba.get_num_threads()`` inside a kernel is a dynamic
    global, which would stop the kernel from being cached.
    """
    return max(1, min(total, PARTS_PER_THREAD * threads))


@njit(inline="always")
def part_range(part, parts, total):
    """Items ``lo .. hi - 1`` of part ``part`` of ``parts`` (contiguous, sizes differ by <= 1)."""
    return part * total // parts, (part + 1) * total // parts


# -- 1-D transforms, written out from winograd_math's matrices ----------------------------------
@njit(inline="always")
def _input_1d_f4(column):
    d0, d1, d2, d3, d4, d5 = column
    # B^T of F(4,3); rows 1/2 and 3/4 share their even and odd parts.
    four, five, two = _as_type_of(d0, 4.0), _as_type_of(d0, 5.0), _as_type_of(d0, 2.0)
    even12 = d4 - four * d2
    odd12 = d3 - four * d1
    even34 = d4 - d2
    odd34 = two * (d3 - d1)
    return (
        four * d0 - five * d2 + d4,
        even12 + odd12,
        even12 - odd12,
        even34 + odd34,
        even34 - odd34,
        four * d1 - five * d3 + d5,
    )


@njit(inline="always")
def _output_1d_f4(column):
    m0, m1, m2, m3, m4, m5 = column
    two, four, eight = _as_type_of(m0, 2.0), _as_type_of(m0, 4.0), _as_type_of(m0, 8.0)
    s12 = m1 + m2
    d12 = m1 - m2
    s34 = m3 + m4
    d34 = m3 - m4
    return (m0 + s12 + s34, d12 + two * d34, s12 + four * s34, d12 + eight * d34 + m5)


@njit(inline="always")
def _filter_1d_f4(column):
    g0, g1, g2 = column
    # Products with the reciprocals rather than divisions (vdivpd would dominate the pass); the
    # filter transform runs in float64, so the difference is far below float32 rounding.
    even = g0 + g2
    outer = (g0 + 4.0 * g2) * (1.0 / 24.0)
    return (0.25 * g0, -(even + g1) * (1.0 / 6.0), -(even - g1) * (1.0 / 6.0),
            outer + g1 * (1.0 / 12.0), outer - g1 * (1.0 / 12.0), g2)


@njit(inline="always")
def _input_1d_f2(column):
    d0, d1, d2, d3 = column
    return (d0 - d2, d1 + d2, d2 - d1, d1 - d3)


@njit(inline="always")
def _output_1d_f2(column):
    m0, m1, m2, m3 = column
    return (m0 + m1 + m2, m1 - m2 - m3)


@njit(inline="always")
def _filter_1d_f2(column):
    g0, g1, g2 = column
    return (g0, (g0 + g1 + g2) * 0.5, (g0 - g1 + g2) * 0.5, g2)


# -- tap readers: the column of a 1-D transform, taps ``s_j`` apart from ``s`` ------------------
@njit(inline="always")
def _taps3_float64(src, s, s_j):
    return (np.float64(src[s]), np.float64(src[s + s_j]), np.float64(src[s + uintp(2) * s_j]))


@njit(inline="always")
def _taps4(src, s, s_j):
    return (src[s], src[s + s_j], src[s + uintp(2) * s_j], src[s + uintp(3) * s_j])


@njit(inline="always")
def _taps6(src, s, s_j):
    return (src[s], src[s + s_j], src[s + uintp(2) * s_j], src[s + uintp(3) * s_j],
            src[s + uintp(4) * s_j], src[s + uintp(5) * s_j])


def _store_column(block, t, values):
    """``block[l, t] = values[l]`` for every element of the tuple ``values`` (jitted code only)."""
    raise NotImplementedError("jitted code only")


@overload(_store_column, inline="always")
def _store_column_overload(block, t, values):
    # Spelled out per length: a tuple indexed by a loop variable goes through memory.
    if len(values) == 2:
        def impl(block, t, values):
            block[0, t] = values[0]
            block[1, t] = values[1]
    elif len(values) == 4:
        def impl(block, t, values):
            block[0, t] = values[0]
            block[1, t] = values[1]
            block[2, t] = values[2]
            block[3, t] = values[3]
    elif len(values) == 6:
        def impl(block, t, values):
            block[0, t] = values[0]
            block[1, t] = values[1]
            block[2, t] = values[2]
            block[3, t] = values[3]
            block[4, t] = values[4]
            block[5, t] = values[5]
    else:
        return None
    return impl


#: Columns a transform pass computes into its stack block before storing them (a compile-time
#: knob of :data:`convlib.cpu.tables.KNOBS`).
PASS_BLOCK = KNOBS.winograd_pass_block


@njit(inline="always")
def _transform_pass(one_d, taps, n_out, interleaved, src, s0, s_j, s_t, dst, d0, d_l, d_t, n, bias):
    """``dst[d0 + l*d_l + t*d_t] = one_d(column t)[l] + bias`` for ``l < n_out``, ``t < n``.

    Column ``t`` is ``taps(src, s0 + t*s_t, s_j)``. The outputs of :data:`PASS_BLOCK` columns go
    to a stack block first: LLVM knows the block aliases nothing, so the loop computing all
    ``n_out`` outputs vectorises along ``t`` (a loop storing them straight to ``dst`` needs more
    run-time alias checks than LLVM allows, and stays scalar). The block is then stored one
    output at a time (``interleaved=False``: contiguous runs, ``d_t == 1``) or one column at a
    time (``interleaved=True``: ``d_l == 1``, ``d_t == n_out``, one interleaved store).
    """
    block = stack_array_2d(n_out, PASS_BLOCK, dst.dtype)
    s0, s_j, s_t = uintp(s0), uintp(s_j), uintp(s_t)
    d0, d_l, d_t = uintp(d0), uintp(d_l), uintp(d_t)
    for t0 in range(uintp(0), uintp(n), uintp(PASS_BLOCK)):
        width = min(uintp(PASS_BLOCK), uintp(n) - t0)
        for t in range(width):
            _store_column(block, t, one_d(taps(src, s0 + (t0 + t) * s_t, s_j)))
        if interleaved:
            for t in range(width):
                for l in range(n_out):
                    dst[d0 + uintp(l) * d_l + (t0 + t) * d_t] = block[l, t] + bias
        else:
            for l in range(n_out):
                for t in range(width):
                    dst[d0 + uintp(l) * d_l + (t0 + t) * d_t] = block[l, t] + bias


def transform_pass(kind, m, interleaved, src, s0, s_j, s_t, dst, d0, d_l, d_t, n, bias):
    """One pass of the ``kind`` (``"input"``, ``"output"``, ``"filter"``) transform of F(m,3).

    ``dst[d0 + l*d_l + t*d_t] = (T src_t)[l] + bias`` with ``T`` = ``B^T``, ``A^T`` or ``G``
    and ``src_t[j] = src[s0 + j*s_j + t*s_t]``, for every output ``l`` and ``t < n``. ``kind``,
    ``m`` and ``interleaved`` must be compile-time constants; ``"filter"`` computes in float64.
    Jitted code only.
    """
    raise NotImplementedError("jitted code only")


_ONE_D = {
    ("input", 4): (_input_1d_f4, _taps6, 6),
    ("output", 4): (_output_1d_f4, _taps6, 4),
    ("filter", 4): (_filter_1d_f4, _taps3_float64, 6),
    ("input", 2): (_input_1d_f2, _taps4, 4),
    ("output", 2): (_output_1d_f2, _taps4, 2),
    ("filter", 2): (_filter_1d_f2, _taps3_float64, 4),
}


@overload(transform_pass, prefer_literal=True, jit_options={"fastmath": {"contract"}})
def _transform_pass_overload(kind, m, interleaved, src, s0, s_j, s_t, dst, d0, d_l, d_t, n, bias):
    if not all(isinstance(a, (types.Literal, types.BooleanLiteral)) for a in (kind, m, interleaved)):
        return None  # numba retries with the literal types
    one_d, taps, n_out = _ONE_D[(kind.literal_value, m.literal_value)]
    is_interleaved = interleaved.literal_value

    def impl(kind, m, interleaved, src, s0, s_j, s_t, dst, d0, d_l, d_t, n, bias):
        _transform_pass(one_d, taps, n_out, is_interleaved, src, s0, s_j, s_t, dst, d0, d_l, d_t, n, bias)

    return impl


@njit(inline="always")
def _deinterleaved_taps4(taps, t, pitch):
    # Tile t's taps 0..3 are element t of runs 0..3; taps 4, 5 are tile t+1's taps 0, 1.
    return (taps[t], taps[pitch + t], taps[uintp(2) * pitch + t], taps[uintp(3) * pitch + t],
            taps[t + uintp(1)], taps[pitch + t + uintp(1)])


@njit(inline="always")
def _deinterleaved_taps2(taps, t, pitch):
    return (taps[t], taps[pitch + t], taps[t + uintp(1)], taps[pitch + t + uintp(1)])


@njit(inline="always")
def _row_end_taps4(taps, t, pitch, extra, e):
    # The last tile of a row: its taps 4, 5 are the row's two extra columns.
    return (taps[t], taps[pitch + t], taps[uintp(2) * pitch + t], taps[uintp(3) * pitch + t], extra[e],
            extra[e + uintp(1)])


@njit(inline="always")
def _row_end_taps2(taps, t, pitch, extra, e):
    return (taps[t], taps[pitch + t], extra[e], extra[e + uintp(1)])


def input_row_pass(m, src, s0, extra, e0, row_tiles, dst, d0, d_l, n):
    """The input transform's pass along the rows: ``dst[d0 + l*d_l + t] = (B^T src_t)[l]`` for
    tiles ``t < n``, where tile ``t`` starts ``m`` columns after tile ``t-1``:
    ``src_t[j] = src[s0 + m*t + j]``, except that the last tile of each row of ``row_tiles``
    tiles (``t = r*row_tiles + row_tiles - 1``) takes its taps ``m`` and ``m+1`` from
    ``extra[e0 + 2*r]`` and ``extra[e0 + 2*r + 1]`` (they are not the next tile's first taps).
    Reads up to ``m * V`` elements (V: :func:`register_lanes`) past ``s0 + m*n``.

    The taps of :data:`PASS_BLOCK` + 1 tiles are first split into ``m`` runs by whole-register
    shuffles (:func:`deinterleave_run`): tap ``j < m`` of tile ``t`` is element ``t`` of run
    ``j``, taps ``m`` and ``m+1`` are elements ``t+1`` of runs 0 and 1; the rows' last tiles are
    then computed again from their extra columns, one column each. Loaded ``m`` apart, each tap
    had been a gather, and the last tiles a pass of their own. ``m`` must be a literal. Jitted
    code only.
    """
    raise NotImplementedError("jitted code only")


@overload(input_row_pass, prefer_literal=True, jit_options={"fastmath": {"contract"}})
def _input_row_pass_overload(m, src, s0, extra, e0, row_tiles, dst, d0, d_l, n):
    if not isinstance(m, types.IntegerLiteral):
        return None
    ways = m.literal_value
    one_d, taps_of, row_end_taps_of, alpha = {
        4: (_input_1d_f4, _deinterleaved_taps4, _row_end_taps4, 6),
        2: (_input_1d_f2, _deinterleaved_taps2, _row_end_taps2, 4)}[ways]
    lanes = lanes_per_register(src.dtype)
    pitch = PASS_BLOCK + lanes  # the taps of PASS_BLOCK + 1 tiles, in whole registers
    taps_size = ways * pitch  # a constant for the stack buffer (a product in the body is not)

    def impl(m, src, s0, extra, e0, row_tiles, dst, d0, d_l, n):
        taps = stack_array_1d(taps_size, dst.dtype)
        block = stack_array_2d(alpha, PASS_BLOCK, dst.dtype)
        s0, e0, row_tiles = uintp(s0), uintp(e0), uintp(row_tiles)
        d0, d_l = uintp(d0), uintp(d_l)
        for t0 in range(uintp(0), uintp(n), uintp(PASS_BLOCK)):
            width = min(uintp(PASS_BLOCK), uintp(n) - t0)
            for g in range(uintp(0), width + uintp(1), uintp(lanes)):
                deinterleave_run(taps, g, uintp(pitch), src, s0 + uintp(ways) * (t0 + g), ways)
            for t in range(width):
                _store_column(block, t, one_d(taps_of(taps, t, uintp(pitch))))
            r = t0 // row_tiles
            end = r * row_tiles + row_tiles - uintp(1)  # the block's first row-end tile
            while end < t0 + width:
                _store_column(block, end - t0, one_d(row_end_taps_of(taps, end - t0, uintp(pitch), extra,
                                                                     e0 + uintp(2) * r)))
                r += uintp(1)
                end += row_tiles
            for l in range(alpha):
                for t in range(width):
                    dst[d0 + uintp(l) * d_l + t0 + t] = block[l, t]

    return impl


# -- filter transform ---------------------------------------------------------------------------
def transform_filter(m, w_flat, src, Cg, rows, u_flat, u_off, pos_stride):
    """``u_flat[u_off + (i*alpha + j)*pos_stride + c] = (G f_c G^T)[i, j]`` for the ``Cg`` filters
    ``f_c`` (3x3 each) of one output channel, starting at ``w_flat[src]``; computed in float64 in
    ``rows`` (``>= alpha*3*Cg`` float64 scratch) and rounded once. ``m`` a compile-time constant.
    Jitted code only."""
    raise NotImplementedError("jitted code only")


@overload(transform_filter, prefer_literal=True, jit_options={"fastmath": {"contract"}})
def _transform_filter_overload(m, w_flat, src, Cg, rows, u_flat, u_off, pos_stride):
    if not isinstance(m, types.IntegerLiteral):
        return None
    alpha = m.literal_value + 2

    def impl(m, w_flat, src, Cg, rows, u_flat, u_off, pos_stride):
        zero64 = np.float64(0.0)
        # G along every filter row (c, r) first, then down the columns: both passes read their
        # taps 1 apart and their columns 3 apart, which LLVM vectorises as interleaved loads
        # (columns first read taps 3 and filters 9 apart: gathers, and ResNet-50's 512x512
        # filters took 2.1-2.6 ms to transform on Zen 5).
        transform_pass("filter", m, False, w_flat, src, 1, 3, rows, 0, 3 * Cg, 1, 3 * Cg, zero64)
        for j in range(alpha):  # rows[j, c, r] = (f G^T)[r, j]; then (G f G^T)[i, j]
            transform_pass("filter", m, False, rows, j * 3 * Cg, 1, 3,
                           u_flat, u_off + j * pos_stride, alpha * pos_stride, 1, Cg, zero64)

    return impl


@functools.lru_cache(maxsize=None)
def filter_transform_kernel(m: int, dtype: str):
    """The filter transform of F(m x m, 3 x 3) for ``dtype`` (``m`` is compiled in)::

        filter_transform(w, U, threads)

    ``U[i*alpha + j, g, k, c] = (G w[g*Kg + k, c] G^T)[i, j]``, in float64, rounded once.

    w : (K, Cg, 3, 3)                 IN
    U : (alpha**2, groups, Kpad, Cg)  OUT rows ``k >= Kg = K / groups`` are zero

    Each part's body is compiled once (:mod:`.compiled_once`).
    """
    alpha = m + 2
    filters = array_type(dtype, 4)
    ARGUMENTS = declare(types.Tuple((filters, filters, types.int64)))  # w, U, parts

    def part_body(w, U, parts, part):
        groups, Kpad, Cg = U.shape[1], U.shape[2], U.shape[3]
        Kg = w.shape[0] // groups
        w_flat, u_flat = w.ravel(), U.ravel()
        pos_stride = groups * Kpad * Cg
        rows = np.empty(alpha * 3 * Cg)  # (f G^T)[r, j] for every c, float64
        gk_lo, gk_hi = part_range(part, parts, groups * Kpad)
        for gk in range(gk_lo, gk_hi):
            g = gk // Kpad
            k = gk - g * Kpad
            if k >= Kg:
                for pos in range(alpha * alpha):
                    U[pos, g, k, :] = 0
                continue
            transform_filter(m, w_flat, (g * Kg + k) * Cg * 9, Cg, rows, u_flat, gk * Cg, pos_stride)

    @njit(parallel=True, cache=True)
    def filter_transform(w, U, threads, body):
        parts = _parts(U.shape[1] * U.shape[2], threads)
        shared = share((w, U, parts), ARGUMENTS)
        for part in prange(parts):
            call_body(body, shared, part, ARGUMENTS)
        release(shared, ARGUMENTS)

    return CompiledOnce(filter_transform, part_body, ARGUMENTS, fastmath={"contract"})


# -- input transform ----------------------------------------------------------------------------
@njit(inline="always")
def _fill_run(dst, d0, n):
    d0 = uintp(d0)
    for u in range(uintp(n)):
        dst[d0 + u] = 0


@njit(inline="always")
def _copy_padded_row(x_flat, x_row, W, w_first, dst, d0, n):
    """``dst[d0 + u] = x[row, w_first + u]`` for ``u < n``, zero outside ``0 <= column < W``.

    ``x_row`` is the flat offset of the image row, or -1 for a row of the padding.
    """
    lo = min(max(0, -w_first), n)
    hi = max(min(n, W - w_first), lo)
    if x_row < 0:
        lo = hi = n
    _fill_run(dst, d0, lo)
    copy_row(x_flat, x_row + w_first + lo, dst, d0 + lo, hi - lo)
    _fill_run(dst, d0 + hi, n - hi)


@functools.lru_cache(maxsize=None)
def input_transform_kernel(m: int, dtype: str):
    """The input transform of F(m x m, 3 x 3) for one chunk of tiles of ``dtype`` (``m`` is
    compiled in)::

        input_transform(x, V, tiles_h, row0, nrows, tx0, ntiles, top, left, threads)

    ``V[i*alpha + j, c, r*ntiles + t] = (B^T d B)[i, j]`` for tile ``t`` of chunk row ``r``.

    x : (N, C, H, W)          IN  the image, unpadded (padding is read as zeros)
    V : (alpha**2, C, Tpad)   OUT columns from ``nrows * ntiles`` on are zeros (padding of the GEMM)

    The chunk is global tile rows ``row0 .. row0+nrows-1`` (global row ``n*tiles_h + ty``)
    and tile columns ``tx0 .. tx0+ntiles-1``; ``top``, ``left``: padding before the image.

    The ``alpha`` input rows of every tile row of the chunk are laid end to end, ``m*ntiles``
    columns each ("main"), so that tile ``T = r*ntiles + t`` starts at column ``m*T`` of the
    whole chunk and both passes run along all of its tiles at once, however narrow the image.
    The last 2 columns of each row ("extra") go to a side buffer, from which the pass along the
    rows (:func:`input_row_pass`) takes the taps ``m``, ``m+1`` of each row's last tile. Each
    part's body is compiled once (:mod:`.compiled_once`).
    """
    alpha = m + 2
    i64 = types.int64
    ARGUMENTS = declare(types.Tuple((array_type(dtype, 4), array_type(dtype, 3)) + (i64,) * 8))

    def part_body(x, V, tiles_h, row0, nrows, tx0, ntiles, top, left, parts, part):
        N, C, H, W = x.shape
        Tpad = V.shape[2]
        v_flat, x_flat = V.ravel(), x.ravel()
        row_len = m * ntiles
        L = nrows * row_len  # main columns of the chunk
        E = 2 * nrows  # extra columns of the chunk
        w_first = m * tx0 - left  # image column of a row's first main column
        zero = _as_type_of(x[0, 0, 0, 0], 0.0)
        src_main = np.empty(alpha * L, x.dtype)
        src_extra = np.empty(alpha * E, x.dtype)
        # + the row pass's overrun: it reads whole registers past the last row's main columns.
        rows_main = np.empty(alpha * L + m * register_lanes(x), x.dtype)
        rows_extra = np.empty(alpha * E, x.dtype)
        rows_main[alpha * L:] = 0
        c_lo, c_hi = part_range(part, parts, C)
        for c in range(c_lo, c_hi):
            # The padding columns go through the GEMM (their results are never read): zeros
            # keep stale NaNs or denormals of an earlier call out of it.
            for pos in range(alpha * alpha):
                _fill_run(v_flat, (pos * C + c) * Tpad + nrows * ntiles, Tpad - nrows * ntiles)
            for r in range(nrows):
                n, ty = divmod(row0 + r, tiles_h)
                for j in range(alpha):
                    h = m * ty - top + j
                    x_row = ((n * C + c) * H + h) * W if h >= 0 and h < H else -1
                    _copy_padded_row(x_flat, x_row, W, w_first, src_main, j * L + r * row_len, row_len)
                    _copy_padded_row(x_flat, x_row, W, w_first + row_len, src_extra, j * E + 2 * r, 2)
            # B^T d: along the columns of every tile row at once.
            transform_pass("input", m, False, src_main, 0, L, 1, rows_main, 0, L, 1, L, zero)
            transform_pass("input", m, False, src_extra, 0, E, 1, rows_extra, 0, E, 1, E, zero)
            # (B^T d) B: along the rows, tile T reading main columns m*T .. m*T + alpha - 1.
            for i in range(alpha):
                input_row_pass(m, rows_main, i * L, rows_extra, i * E, ntiles, v_flat, (alpha * i * C + c) * Tpad,
                               C * Tpad, nrows * ntiles)

    @njit(parallel=True, cache=True)
    def input_transform(x, V, tiles_h, row0, nrows, tx0, ntiles, top, left, threads, body):
        parts = _parts(x.shape[1], threads)
        shared = share((x, V, tiles_h, row0, nrows, tx0, ntiles, top, left, parts), ARGUMENTS)
        for part in prange(parts):
            call_body(body, shared, part, ARGUMENTS)
        release(shared, ARGUMENTS)

    return CompiledOnce(input_transform, part_body, ARGUMENTS, fastmath={"contract"})


# -- output transform ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def output_transform_kernel(m: int, dtype: str):
    """The output transform of F(m x m, 3 x 3) for one chunk of tiles of ``dtype`` (``m`` is
    compiled in)::

        output_transform(M, y, bias, tiles_h, row0, nrows, tx0, ntiles, threads, nonfinite)

    ``y[n, k, m*ty + a, m*tx + b] = (A^T M_tile A)[a, b] + bias[k]`` for the chunk's tiles.

    M : (alpha**2, K, Tpad)  IN  GEMM results, laid out like ``V`` of the input transform
    y : (N, K, P, Q)         OUT only the (existing) outputs of this chunk's tiles
    bias : (K,)              IN  (zeros when the call has no bias)
    nonfinite : (1,) int64   OUT set to 1 when an output of the chunk is not finite

    Each part's body is compiled once (:mod:`.compiled_once`).
    """
    alpha = m + 2
    i64 = types.int64
    ARGUMENTS = declare(types.Tuple(
        (array_type(dtype, 3), array_type(dtype, 4), array_type(dtype, 1)) + (i64,) * 6 + (array_type(np.int64, 1),)))

    def part_body(M, y, bias, tiles_h, row0, nrows, tx0, ntiles, parts, nonfinite, part):
        K, P, Q = y.shape[1], y.shape[2], y.shape[3]
        Tpad = M.shape[2]
        m_flat, y_flat = M.ravel(), y.ravel()
        row_len = m * ntiles
        L = nrows * row_len
        q0 = m * tx0
        width = min(Q, q0 + row_len) - q0  # output columns of a chunk row (its last tile may be cut)
        rows = np.empty(alpha * L, y.dtype)
        out = np.empty(m * L, y.dtype)
        k_lo, k_hi = part_range(part, parts, K)
        for k in range(k_lo, k_hi):
            zero = _as_type_of(bias[k], 0.0)
            # M A: along the tiles of the whole chunk, each tile's m outputs side by side.
            for i in range(alpha):
                transform_pass("output", m, True, m_flat, (alpha * i * K + k) * Tpad, K * Tpad, 1,
                               rows, i * L, 1, m, nrows * ntiles, zero)
            # A^T (M A) + bias: along every output column of the chunk.
            transform_pass("output", m, False, rows, 0, L, 1, out, 0, L, 1, L, bias[k])
            # v - v is 0 for a finite v and NaN otherwise: one vectorised pass over values
            # still in cache tells whether this channel needs the exact repair.
            bad = False
            for i in range(m * L):
                bad |= (out[i] - out[i]) != zero
            if bad:
                nonfinite[0] = 1
            for r in range(nrows):
                n, ty = divmod(row0 + r, tiles_h)
                for a in range(min(m, P - m * ty)):  # the bottom tile row may be cut
                    copy_row(out, a * L + r * row_len, y_flat, ((n * K + k) * P + m * ty + a) * Q + q0, width)

    @njit(parallel=True, cache=True)
    def output_transform(M, y, bias, tiles_h, row0, nrows, tx0, ntiles, threads, nonfinite, body):
        parts = _parts(y.shape[1], threads)
        shared = share((M, y, bias, tiles_h, row0, nrows, tx0, ntiles, parts, nonfinite), ARGUMENTS)
        for part in prange(parts):
            call_body(body, shared, part, ARGUMENTS)
        release(shared, ARGUMENTS)

    return CompiledOnce(output_transform, part_body, ARGUMENTS, fastmath={"contract"})
