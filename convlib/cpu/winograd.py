"""Winograd F(2x2,3x3) and F(4x4,3x3) convolution on the CPU, all in numba.

The method (Lavin & Gray 2015; matrices in :mod:`convlib.winograd_math`), ``alpha = m + 2``:

1. **Filter transform**, once per call: ``U[pos, g, k, c] = (G w[g*Kg + k, c] G^T)[pos]`` for the
   ``alpha**2`` tile positions ``pos``, computed in float64 and rounded once to the working dtype.
   Rows ``k`` are padded with zeros to a multiple of the micro-kernel's ``MR``.
2. Then per chunk of tiles (``T`` tiles, padded to a multiple of ``NR``):

   a. **Input transform** ``V[pos, c, t] = (B^T d_t B)[pos]`` for the ``alpha x alpha`` input tile
      ``d_t`` of every tile (tiles overlap by 2; padding is read as zeros). The input rows of all
      tile rows of the chunk are laid end to end, so both 1-D passes (down the columns, then
      along the rows) run along every tile of the chunk at once, however narrow the image.
   b. **Batched GEMM**, one per tile position and group:
      ``M[pos, g] (Kg x T) = U[pos, g] (Kg x Cg) @ V[pos, g] (Cg x T)``, by an ``MR x NR``
      register-tiled micro-kernel (:data:`REGISTER_TILE`) whose accumulators stay in registers.
   c. **Output transform** ``y = A^T m_t A + bias`` per tile, along every tile of the chunk; the
      partial tiles at the bottom and right edges store only their existing outputs.

Every 1-D pass (:func:`transform_pass`) computes blocks of columns into a stack buffer and then
stores them, which is what lets LLVM vectorise it (see :func:`_transform_pass`).

Chunks are whole tile rows (or part of one row when a single row is too big), sized so that
``V + M`` stays near :data:`CHUNK_BYTES` (or the size of ``U`` when larger) whatever N, H and W
are: the workspace is ``U`` plus one chunk (:meth:`WinogradAlgorithm.workspace_bytes`), kept per
thread between calls up to :data:`KEEP_WORKSPACE_BYTES`. No BLAS is called: numba's and
OpenBLAS's thread pools fight when they alternate, and the per-position GEMMs are small.

The 1-D transforms are written out by hand below (numba cannot drop a product with a zero matrix
entry without fast-math); ``tests/test_winograd.py`` checks them against the matrices of
:mod:`convlib.winograd_math`. ``docs/algorithms.md`` has the measured accuracy and speed.

Compilation: the transform kernels are specialised (``lru_cache``) per tile size ``m``, the GEMM
per register tile, and all of them through the array types per dtype; shapes are run-time
arguments, so a new problem shape costs nothing. Everything is compiled with ``cache=True``: a
cold compile of both tile sizes and dtypes takes minutes, a new process then loads the kernels
from the disk cache in about a second. The micro-kernel and the passes are compiled into their
callers' cache entries; numba invalidates those when this file changes (it checks the file's
time stamp), but not when :mod:`convlib.cpu.stack_buffer` does: clear ``__pycache__`` then.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import numpy as np
from numba import get_num_threads, njit, parallel_chunksize, prange, types
from numba.extending import overload
from numba.np import numpy_support

from ..winograd_math import WinogradTile
from .. import output_cache
from .stack_buffer import stack_array_2d

uintp = np.uintp

#: Target bytes of one chunk's transformed input plus GEMM output (V + M): a few MB, so both
#: stay in the last-level cache between the three passes of a chunk.
CHUNK_BYTES = 4 * 2**20

#: Register tile of the GEMM micro-kernel per dtype: ``(MR, NR)`` = output channels x tiles.
#: Five rows of two AVX2 vectors (10 accumulators, 2 loads of V, the broadcasts of U) fit the
#: 16 ymm registers; 6 x 2 vectors spilled and ran several times slower (docs/algorithms.md, Winograd section).
REGISTER_TILE = {"float32": (5, 16), "float64": (5, 8)}

#: Workspace buffers up to this size are kept per thread between calls: a fresh multi-MB
#: buffer costs a page fault per 4 KiB on first touch, which for the 37 MB of ``U`` of a
#: 512-channel layer took longer than transforming the filters.
KEEP_WORKSPACE_BYTES = 64 * 2**20

#: GEMM items (one ``MR``-row block of one tile position and group each) a thread takes at a
#: time under dynamic scheduling.
GEMM_SCHEDULE_CHUNK = 4


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
#: a few parts per thread even out threads slowed by others on a shared machine.
PARTS_PER_THREAD = 4


@njit(inline="always")
def _parts(total, threads):
    """How many ``prange`` parts to split ``total`` items into (see :data:`PARTS_PER_THREAD`).

    ``threads`` comes from the caller: ``numba.get_num_threads()`` inside a kernel is a dynamic
    global, which would stop the kernel from being cached.
    """
    return max(1, min(total, PARTS_PER_THREAD * threads))


@njit(inline="always")
def _part_range(part, parts, total):
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


#: Columns a transform pass computes into its stack block before storing them.
PASS_BLOCK = 64


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


# -- filter transform ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def filter_transform_kernel(m: int):
    """The filter transform of F(m x m, 3 x 3) (``m`` is compiled in)."""
    alpha = m + 2

    @njit(parallel=True, cache=True, fastmath={"contract"})
    def filter_transform(w, U, threads):
        """``U[i*alpha + j, g, k, c] = (G w[g*Kg + k, c] G^T)[i, j]``, in float64, rounded once.

        w : (K, Cg, 3, 3)                IN
        U : (alpha**2, groups, Kpad, Cg)  OUT rows ``k >= Kg = K / groups`` are zero
        """
        groups, Kpad, Cg = U.shape[1], U.shape[2], U.shape[3]
        Kg = w.shape[0] // groups
        w_flat, u_flat = w.ravel(), U.ravel()
        pos_stride = groups * Kpad * Cg
        zero64 = np.float64(0.0)
        parts = _parts(groups * Kpad, threads)
        for part in prange(parts):
            columns = np.empty(alpha * 3 * Cg)  # (G f)[i, s] for every c, float64
            gk_lo, gk_hi = _part_range(part, parts, groups * Kpad)
            for gk in range(gk_lo, gk_hi):
                g = gk // Kpad
                k = gk - g * Kpad
                if k >= Kg:
                    for pos in range(alpha * alpha):
                        U[pos, g, k, :] = 0
                    continue
                src = (g * Kg + k) * Cg * 9
                for s in range(3):  # G along each filter column s: taps 3 apart, filters 9 apart
                    transform_pass("filter", m, False, w_flat, src + s, 3, 9, columns, s * Cg, 3 * Cg, 1, Cg,
                                   zero64)
                for i in range(alpha):  # then along the rows: (G f G^T)[i, j]
                    transform_pass("filter", m, False, columns, i * 3 * Cg, Cg, 1,
                                   u_flat, alpha * i * pos_stride + gk * Cg, pos_stride, 1, Cg, zero64)

    return filter_transform


# -- input transform ----------------------------------------------------------------------------
@njit(inline="always")
def _copy_run(src, s0, dst, d0, n):
    """``dst[d0:d0+n] = src[s0:s0+n]`` as a plain loop (numba's slice assignment checks overlap)."""
    s0, d0 = uintp(s0), uintp(d0)
    for u in range(uintp(n)):
        dst[d0 + u] = src[s0 + u]


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
    _copy_run(x_flat, x_row + w_first + lo, dst, d0 + lo, hi - lo)
    _fill_run(dst, d0 + hi, n - hi)


@functools.lru_cache(maxsize=None)
def input_transform_kernel(m: int):
    """The input transform of F(m x m, 3 x 3) for one chunk of tiles (``m`` is compiled in)."""
    alpha = m + 2

    @njit(parallel=True, cache=True, fastmath={"contract"})
    def input_transform(x, V, tiles_h, row0, nrows, tx0, ntiles, top, left, threads):
        """``V[i*alpha + j, c, r*ntiles + t] = (B^T d B)[i, j]`` for tile ``t`` of chunk row ``r``.

        x : (N, C, H, W)          IN  the image, unpadded (padding is read as zeros)
        V : (alpha**2, C, Tpad)   OUT columns from ``nrows * ntiles`` on are left as they are
        The chunk is global tile rows ``row0 .. row0+nrows-1`` (global row ``n*tiles_h + ty``)
        and tile columns ``tx0 .. tx0+ntiles-1``; ``top``, ``left``: padding before the image.

        The ``alpha`` input rows of every tile row of the chunk are laid end to end, ``m*ntiles``
        columns each ("main"), so that tile ``T = r*ntiles + t`` starts at column ``m*T`` of the
        whole chunk and both passes run along all of its tiles at once, however narrow the image.
        The last 2 columns of each row ("extra") go to a side buffer; the last tile of each row,
        whose taps ``m``, ``m+1`` are those columns, is redone from it at the end.
        """
        N, C, H, W = x.shape
        Tpad = V.shape[2]
        v_flat, x_flat = V.ravel(), x.ravel()
        row_len = m * ntiles
        L = nrows * row_len  # main columns of the chunk
        E = 2 * nrows  # extra columns of the chunk
        w_first = m * tx0 - left  # image column of a row's first main column
        zero = _as_type_of(x[0, 0, 0, 0], 0.0)
        parts = _parts(C, threads)
        for part in prange(parts):
            # + m: the horizontal pass reads past the last row's main columns (tile redone later).
            src_main = np.empty(alpha * L + m, x.dtype)
            src_extra = np.empty(alpha * E, x.dtype)
            rows_main = np.empty(alpha * L + m, x.dtype)
            rows_extra = np.empty(alpha * E, x.dtype)
            last = np.empty(alpha * alpha * nrows, x.dtype)
            src_main[alpha * L:] = 0
            rows_main[alpha * L:] = 0
            c_lo, c_hi = _part_range(part, parts, C)
            for c in range(c_lo, c_hi):
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
                    transform_pass("input", m, False, rows_main, i * L, 1, m, v_flat, (alpha * i * C + c) * Tpad,
                                   C * Tpad, 1, nrows * ntiles, zero)
                # The last tile of each row, whose taps m and m+1 are the row's extra columns: the
                # columns of all rows' last tiles side by side (last[i, j, r]), then one pass per i
                # storing tile r*ntiles + ntiles - 1 of each row.
                for r in range(nrows):
                    T = r * ntiles + ntiles - 1
                    for i in range(alpha):
                        for j in range(m):
                            last[(i * alpha + j) * nrows + r] = rows_main[i * L + m * T + j]
                        last[(i * alpha + m) * nrows + r] = rows_extra[i * E + 2 * r]
                        last[(i * alpha + m + 1) * nrows + r] = rows_extra[i * E + 2 * r + 1]
                for i in range(alpha):
                    transform_pass("input", m, False, last, i * alpha * nrows, nrows, 1, v_flat,
                                   (alpha * i * C + c) * Tpad + ntiles - 1, C * Tpad, ntiles, nrows, zero)

    return input_transform


# -- batched GEMM -------------------------------------------------------------------------------
_PER_ROW = "#: per row"

_GEMM_TILE_TEMPLATE = f'''
def gemm_tile_{{MR}}x{{NR}}(depth, a, a_off, lda, b, b_off, ldb, c, c_off, ldc, rows, MR, NR):
    # Unsigned indices: a signed one gets a negative-index wraparound test, which turns the
    # vector loads of b into gathers and keeps the accumulators in memory.
    acc = stack_array_2d({{MR}}, {{NR}}, c.dtype)
    for j in range({{NR}}):
        acc[{{i}}, j] = 0                                                  {_PER_ROW}
    lda_u, ldb_u = uintp(lda), uintp(ldb)
    a{{i}}p = uintp(a_off) + uintp({{i}}) * lda_u                              {_PER_ROW}
    bp = uintp(b_off)
    for p in range(uintp(depth)):
        a{{i}} = a[a{{i}}p + p]                                                {_PER_ROW}
        for j in range(uintp({{NR}})):
            bj = b[bp + j]
            acc[{{i}}, j] += a{{i}} * bj                                     {_PER_ROW}
        bp += ldb_u
    cp, ldc_u = uintp(c_off), uintp(ldc)
    for i in range(rows):
        for j in range(uintp({{NR}})):
            c[cp + j] = acc[i, j]
        cp += ldc_u
'''


def render_gemm_tile(MR: int, NR: int) -> str:
    """Source of the ``MR x NR`` micro-kernel: the lines marked per row repeated for each row."""
    lines = []
    for line in _GEMM_TILE_TEMPLATE.splitlines():
        if line.endswith(_PER_ROW):
            body = line[: -len(_PER_ROW)].rstrip()
            lines.extend(body.format(i=i, MR=MR, NR=NR) for i in range(MR))
        else:
            lines.append(line.format(MR=MR, NR=NR))
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=None)
def _gemm_tile_function(MR: int, NR: int):
    namespace = {"stack_array_2d": stack_array_2d, "uintp": np.uintp}
    exec(compile(render_gemm_tile(MR, NR), f"<convlib winograd gemm_tile_{MR}x{NR}>", "exec"), namespace)
    return namespace[f"gemm_tile_{MR}x{NR}"]


def gemm_tile(depth, a, a_off, lda, b, b_off, ldb, c, c_off, ldc, rows, MR, NR):
    """``c[c_off + i*ldc + j] = sum_p a[a_off + i*lda + p] * b[b_off + p*ldb + j]``.

    For ``i < rows <= MR`` (rows ``rows..MR-1`` of ``a`` are read but not stored), ``j < NR``,
    ``p < depth``. ``MR`` and ``NR`` must be compile-time constants. Jitted code only; the source
    is generated (:func:`render_gemm_tile`) and compiled into, and cached with, its caller.
    """
    raise NotImplementedError("gemm_tile is called from numba-compiled code only")


@overload(gemm_tile, prefer_literal=True, jit_options={"fastmath": {"contract"}})
def _gemm_tile_overload(depth, a, a_off, lda, b, b_off, ldb, c, c_off, ldc, rows, MR, NR):
    if not (isinstance(MR, types.IntegerLiteral) and isinstance(NR, types.IntegerLiteral)):
        return None  # numba retries with the literal types
    return _gemm_tile_function(MR.literal_value, NR.literal_value)


@functools.lru_cache(maxsize=None)
def batched_gemm_kernel(MR: int, NR: int):
    """The batched GEMM ``M[pos, g] = U[pos, g] @ V[pos, g]`` for the register tile ``MR x NR``."""

    @njit(parallel=True, cache=True, fastmath={"contract"})
    def batched_gemm(U, V, M, Kg):
        """U : (positions, groups, Kpad, Cg)  IN   Kpad a multiple of MR, zero rows past Kg
        V : (positions, C, Tpad)             IN   Tpad a multiple of NR
        M : (positions, K, Tpad)             OUT  rows of group g at g*Kg .. g*Kg + Kg - 1
        """
        positions, groups, Kpad, Cg = U.shape
        Tpad = V.shape[2]
        row_blocks = Kpad // MR
        u_flat, v_flat, m_flat = U.ravel(), V.ravel(), M.ravel()
        C, K = V.shape[1], M.shape[1]
        for item in prange(positions * groups * row_blocks):
            pg = item // row_blocks
            kb = item - pg * row_blocks
            pos = pg // groups
            g = pg - pos * groups
            rows = min(MR, Kg - kb * MR)
            a_off = (pg * Kpad + kb * MR) * Cg
            b_off = (pos * C + g * Cg) * Tpad
            c_off = (pos * K + g * Kg + kb * MR) * Tpad
            for j0 in range(0, Tpad, NR):
                gemm_tile(Cg, u_flat, a_off, Cg, v_flat, b_off + j0, Tpad, m_flat, c_off + j0, Tpad,
                          rows, MR, NR)

    return batched_gemm


# -- output transform ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def output_transform_kernel(m: int):
    """The output transform of F(m x m, 3 x 3) for one chunk of tiles (``m`` is compiled in)."""
    alpha = m + 2

    @njit(parallel=True, cache=True, fastmath={"contract"})
    def output_transform(M, y, bias, tiles_h, row0, nrows, tx0, ntiles, threads):
        """``y[n, k, m*ty + a, m*tx + b] = (A^T M_tile A)[a, b] + bias[k]`` for the chunk's tiles.

        M : (alpha**2, K, Tpad)  IN  GEMM results, laid out like ``V`` of the input transform
        y : (N, K, P, Q)         OUT only the (existing) outputs of this chunk's tiles
        bias : (K,)              IN  (zeros when the call has no bias)
        """
        K, P, Q = y.shape[1], y.shape[2], y.shape[3]
        Tpad = M.shape[2]
        m_flat, y_flat = M.ravel(), y.ravel()
        row_len = m * ntiles
        L = nrows * row_len
        q0 = m * tx0
        width = min(Q, q0 + row_len) - q0  # output columns of a chunk row (its last tile may be cut)
        parts = _parts(K, threads)
        for part in prange(parts):
            rows = np.empty(alpha * L, y.dtype)
            out = np.empty(m * L, y.dtype)
            k_lo, k_hi = _part_range(part, parts, K)
            for k in range(k_lo, k_hi):
                zero = _as_type_of(bias[k], 0.0)
                # M A: along the tiles of the whole chunk, each tile's m outputs side by side.
                for i in range(alpha):
                    transform_pass("output", m, True, m_flat, (alpha * i * K + k) * Tpad, K * Tpad, 1,
                                   rows, i * L, 1, m, nrows * ntiles, zero)
                # A^T (M A) + bias: along every output column of the chunk.
                transform_pass("output", m, False, rows, 0, L, 1, out, 0, L, 1, L, bias[k])
                for r in range(nrows):
                    n, ty = divmod(row0 + r, tiles_h)
                    for a in range(min(m, P - m * ty)):  # the bottom tile row may be cut
                        _copy_run(out, a * L + r * row_len, y_flat, ((n * K + k) * P + m * ty + a) * Q + q0, width)

    return output_transform


# -- workspace ----------------------------------------------------------------------------------
_kept = threading.local()


def _workspace(name: str, shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array, reusing this thread's buffer ``name`` when it fits.

    Buffers of at most :data:`KEEP_WORKSPACE_BYTES` are kept for the next call (one per name and
    thread, so concurrent calls from several Python threads never share one).
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if nbytes > KEEP_WORKSPACE_BYTES:
        return np.empty(shape, dtype)
    buffers = getattr(_kept, "buffers", None)
    if buffers is None:
        buffers = _kept.buffers = {}
    raw = buffers.get(name)
    if raw is None or raw.size < nbytes:
        raw = buffers[name] = np.empty(max(nbytes, 1), np.uint8)
    # The view starts where a fresh allocation of the buffer would: same alignment.
    return raw[:nbytes].view(dtype).reshape(shape)


# -- the algorithm objects ----------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkPlan:
    """How the tiles of one call are split into chunks.

    A chunk is ``rows`` consecutive global tile rows (tile row ``ty`` of image ``n`` is global
    row ``n * tiles_h + ty``) and, within each, tile columns ``tx0 .. tx0 + cols - 1``. Either
    ``cols == tiles_w`` (whole rows) or ``rows == 1`` (one row split in pieces). ``NR`` is the
    micro-kernel's tile width, to which each chunk's tile count is padded.
    """

    tiles_h: int
    tiles_w: int
    rows: int
    cols: int
    NR: int

    @property
    def padded_tiles(self) -> int:
        """Tiles per chunk rounded up to whole micro-kernel tiles: the GEMMs' column count."""
        return -(-self.rows * self.cols // self.NR) * self.NR

    def chunks(self, n_images: int):
        """Yield ``(row0, nrows, tx0, ncols)`` covering every tile of ``n_images`` images once."""
        total_rows = n_images * self.tiles_h
        for row0 in range(0, total_rows, self.rows):
            nrows = min(self.rows, total_rows - row0)
            for tx0 in range(0, self.tiles_w, self.cols):
                yield row0, nrows, tx0, min(self.cols, self.tiles_w - tx0)


class WinogradAlgorithm(WinogradTile):
    """Winograd F(m x m, 3 x 3) on the CPU; exposes the module contract of :mod:`convlib.registry`.

    Parameters
    ----------
    m : int
        Output tile size: 2 (F(2x2,3x3), alpha = 4) or 4 (F(4x4,3x3), alpha = 6).
    """

    def __repr__(self) -> str:
        return f"<convlib.cpu.winograd {self.title}>"

    def chunk_plan(self, problem, chunk_bytes: int | None = None) -> ChunkPlan:
        """The chunking of ``problem``'s tiles that keeps ``V + M`` near ``chunk_bytes``.

        ``chunk_bytes`` defaults to :data:`CHUNK_BYTES`; it is raised to the size of ``U`` when
        that is larger, since every chunk streams all of ``U`` through the GEMM (so the chunk
        workspace never exceeds the filters' share and ``U`` is read at most twice per chunk's
        worth of ``V + M``). Chunks hold at least one tile, and the tile rows are spread evenly
        over the chunks (so the last one is not a stub).
        """
        chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
        chunk_bytes = max(chunk_bytes, self.filter_bytes(problem))
        NR = REGISTER_TILE[problem.dtype][1]
        tiles_h = -(-problem.P // self.m)
        tiles_w = -(-problem.Q // self.m)
        per_tile = self.alpha**2 * (problem.C + problem.K) * problem.itemsize
        budget = max(1, chunk_bytes // per_tile)
        if budget < tiles_w:
            pieces = -(-tiles_w // budget)
            return ChunkPlan(tiles_h, tiles_w, 1, -(-tiles_w // pieces), NR)
        total_rows = max(problem.N, 1) * tiles_h
        n_chunks = -(-total_rows // (budget // tiles_w))
        return ChunkPlan(tiles_h, tiles_w, -(-total_rows // n_chunks), tiles_w, NR)

    def filter_bytes(self, problem) -> int:
        """Bytes of the transformed filters ``U`` (rows padded to the micro-kernel's ``MR``)."""
        MR = REGISTER_TILE[problem.dtype][0]
        Kpad = -(-problem.K_per_group // MR) * MR
        return self.alpha**2 * problem.groups * Kpad * problem.C_per_group * problem.itemsize

    def workspace_bytes(self, problem, chunk_bytes: int | None = None) -> int:
        """Bytes allocated beyond x, w, bias and y: ``U`` plus one chunk's ``V`` and ``M``.

        ``alpha**2 * (groups * Kpad * Cg + (C + K) * Tpad) * itemsize``, with ``Kpad`` the rows
        per group rounded up to the micro-kernel's ``MR`` and ``Tpad`` the chunk's tiles rounded
        up to its ``NR`` (see :meth:`chunk_plan`); the per-thread scratch rows of the transforms
        (``O(alpha * width of a chunk)``) are not counted.
        """
        plan = self.chunk_plan(problem, chunk_bytes)
        chunk = self.alpha**2 * (problem.C + problem.K) * plan.padded_tiles * problem.itemsize
        return self.filter_bytes(problem) + chunk

    def conv2d(self, problem, x, w, bias, device=None):
        """The convolution of ``x`` with ``w`` (see :mod:`convlib.registry` for the contract)."""
        filter_transform = filter_transform_kernel(self.m)
        input_transform = input_transform_kernel(self.m)
        output_transform = output_transform_kernel(self.m)
        dtype = np.dtype(problem.dtype)
        y = output_cache.empty(problem.y_shape, dtype)
        if y.size == 0:
            return y
        a2 = self.alpha**2
        MR, NR = REGISTER_TILE[problem.dtype]
        Kg = problem.K_per_group
        U = _workspace("U", (a2, problem.groups, -(-Kg // MR) * MR, problem.C_per_group), dtype)
        threads = get_num_threads()
        # Dynamic scheduling (chunks of one part) instead of numba's static split: on a shared
        # machine a thread that loses its core would otherwise hold up the whole pass.
        with parallel_chunksize(1):
            filter_transform(w, U, threads)
        plan = self.chunk_plan(problem)
        # Flat buffers: each chunk views the front of them as (a2, C, Tpad).
        V_buffer = _workspace("V", (a2 * problem.C * plan.padded_tiles,), dtype)
        M_buffer = _workspace("M", (a2 * problem.K * plan.padded_tiles,), dtype)
        bias_or_zeros = bias if bias is not None else np.zeros(problem.K, dtype)
        batched_gemm = batched_gemm_kernel(MR, NR)
        for row0, nrows, tx0, ncols in plan.chunks(problem.N):
            Tpad = -(-nrows * ncols // NR) * NR
            V = V_buffer[: a2 * problem.C * Tpad].reshape(a2, problem.C, Tpad)
            M = M_buffer[: a2 * problem.K * Tpad].reshape(a2, problem.K, Tpad)
            # The padding columns go through the GEMM (their results are never read): zeros keep
            # stale NaNs or denormals of an earlier call out of it.
            V[:, :, nrows * ncols:] = 0
            with parallel_chunksize(1):
                input_transform(x, V, plan.tiles_h, row0, nrows, tx0, ncols, problem.pad_top, problem.pad_left,
                                threads)
            with parallel_chunksize(GEMM_SCHEDULE_CHUNK):
                batched_gemm(U, V, M, Kg)
            with parallel_chunksize(1):
                output_transform(M, y, bias_or_zeros, plan.tiles_h, row0, nrows, tx0, ncols, threads)
        return y



#: F(2x2,3x3): 16 tile positions, 2.25x fewer multiplications than direct.
F2 = WinogradAlgorithm(2)
#: F(4x4,3x3): 36 tile positions, 4x fewer multiplications than direct.
F4 = WinogradAlgorithm(4)
