"""Winograd F(2x2,3x3) and F(4x4,3x3) convolution on the CPU, all in numba.

The method (Lavin & Gray 2015; matrices in :mod:`convlib.winograd_math`), ``alpha = m + 2``:

1. **Filter transform**, once per call: ``U[pos, g, k, c] = (G w[g*Kg + k, c] G^T)[pos]`` for the
   ``alpha**2`` tile positions ``pos``, computed in float64 and rounded once to the working dtype.
   Rows ``k`` are padded with zeros to a multiple of the micro-kernel's ``MR``.
2. Then per chunk of tiles (``T`` tiles, padded to a multiple of ``NR``):

   a. **Input transform** ``V[pos, c, t] = (B^T d_t B)[pos]`` for the ``alpha x alpha`` input tile
      ``d_t`` of every tile (tiles overlap by 2; padding is read as zeros). Separable: a vertical
      pass over whole image rows (contiguous, vectorised along the width) into an
      ``alpha x width`` row buffer whose borders hold the zero padding, then a horizontal pass
      vectorised along the tiles of the row.
   b. **Batched GEMM**, one per tile position and group:
      ``M[pos, g] (Kg x T) = U[pos, g] (Kg x Cg) @ V[pos, g] (Cg x T)``, by an ``MR x NR``
      register-tiled micro-kernel (:data:`REGISTER_TILE`) whose accumulators stay in registers.
   c. **Output transform** ``y = A^T m_t A + bias`` per tile: horizontal pass first (vectorised
      along the tiles), then vertical (vectorised along the output row); the partial tiles at the
      bottom and right edges write only their valid outputs.

Chunks are whole tile rows (or part of one row when a single row is too big), sized so that
``V + M`` stays near :data:`CHUNK_BYTES` whatever N, H and W are: the workspace is ``U`` plus one
chunk (:meth:`WinogradAlgorithm.workspace_bytes`). No BLAS is called: numba's and OpenBLAS's thread
pools fight when they alternate, and the per-position GEMMs are small.

The 1-D transforms are written out by hand below (numba cannot drop a product with a zero matrix
entry without fast-math); ``tests/test_winograd.py`` checks them against the matrices of
:mod:`convlib.winograd_math`.

Compilation: the transforms depend only on the dtype (shapes are run-time arguments); the GEMM is
specialised (``lru_cache``) on its register tile. Everything is compiled with ``cache=True``, so a
new process loads the kernels from the disk cache; a new problem shape costs nothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import njit, prange, types
from numba.extending import overload
from numba.np import numpy_support

from .stack_buffer import stack_array_2d

uintp = np.uintp

#: Target bytes of one chunk's transformed input plus GEMM output (V + M): a few MB, so both
#: stay in the last-level cache between the three passes of a chunk.
CHUNK_BYTES = 4 * 2**20

#: Register tile of the GEMM micro-kernel per dtype: ``(MR, NR)`` = output channels x tiles.
#: Five rows of two AVX2 vectors (10 accumulators, 2 loads of V, the broadcasts of U) fit the
#: 16 ymm registers; 6 x 2 vectors spilled and ran several times slower (docs/winograd.md).
REGISTER_TILE = {"float32": (5, 16), "float64": (5, 8)}


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
    even = g0 + g2
    outer = (g0 + 4.0 * g2) / 24.0
    return (g0 / 4.0, -(even + g1) / 6.0, -(even - g1) / 6.0, outer + g1 / 12.0, outer - g1 / 12.0, g2)


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
    return (g0, (g0 + g1 + g2) / 2.0, (g0 - g1 + g2) / 2.0, g2)


# -- 1-D passes over many columns at once -------------------------------------------------------
# A pass applies a 1-D transform to ``n`` columns: column ``t`` is read from
# ``src[s0 + j*s_j + t*s_t]`` (tap j) and output l is written to ``dst[d0 + l*d_l + t*d_t]``.
# The 2-D transforms are two passes (along the tile's columns, then its rows) with different
# strides; callers pass ``s_t`` and ``d_t`` as literals, so each inlined pass is a loop LLVM
# vectorises along t (stride 1, or an interleaved stride of m). One loop per output: a loop that
# writes several outputs needs more run-time alias checks than LLVM allows, and stays scalar.
@njit(inline="always")
def _taps3(src, s, s_j):
    return (np.float64(src[s]), np.float64(src[s + s_j]), np.float64(src[s + uintp(2) * s_j]))


@njit(inline="always")
def _taps4(src, s, s_j):
    return (src[s], src[s + s_j], src[s + uintp(2) * s_j], src[s + uintp(3) * s_j])


@njit(inline="always")
def _taps6(src, s, s_j):
    return (src[s], src[s + s_j], src[s + uintp(2) * s_j], src[s + uintp(3) * s_j],
            src[s + uintp(4) * s_j], src[s + uintp(5) * s_j])


@njit(inline="always")
def _input_pass_f4(src, s0, s_j, s_t, dst, d0, d_l, d_t, n):
    """``dst[d0 + l*d_l + t*d_t] = (B^T src_t)[l]`` for F(4,3), ``l < 6``, ``t < n``."""
    s0, s_j, s_t, d0, d_l, d_t = uintp(s0), uintp(s_j), uintp(s_t), uintp(d0), uintp(d_l), uintp(d_t)
    for t in range(uintp(n)):
        dst[d0 + t * d_t] = _input_1d_f4(_taps6(src, s0 + t * s_t, s_j))[0]
    for t in range(uintp(n)):
        dst[d0 + d_l + t * d_t] = _input_1d_f4(_taps6(src, s0 + t * s_t, s_j))[1]
    for t in range(uintp(n)):
        dst[d0 + uintp(2) * d_l + t * d_t] = _input_1d_f4(_taps6(src, s0 + t * s_t, s_j))[2]
    for t in range(uintp(n)):
        dst[d0 + uintp(3) * d_l + t * d_t] = _input_1d_f4(_taps6(src, s0 + t * s_t, s_j))[3]
    for t in range(uintp(n)):
        dst[d0 + uintp(4) * d_l + t * d_t] = _input_1d_f4(_taps6(src, s0 + t * s_t, s_j))[4]
    for t in range(uintp(n)):
        dst[d0 + uintp(5) * d_l + t * d_t] = _input_1d_f4(_taps6(src, s0 + t * s_t, s_j))[5]


@njit(inline="always")
def _input_pass_f2(src, s0, s_j, s_t, dst, d0, d_l, d_t, n):
    """``dst[d0 + l*d_l + t*d_t] = (B^T src_t)[l]`` for F(2,3), ``l < 4``, ``t < n``."""
    s0, s_j, s_t, d0, d_l, d_t = uintp(s0), uintp(s_j), uintp(s_t), uintp(d0), uintp(d_l), uintp(d_t)
    for t in range(uintp(n)):
        dst[d0 + t * d_t] = _input_1d_f2(_taps4(src, s0 + t * s_t, s_j))[0]
    for t in range(uintp(n)):
        dst[d0 + d_l + t * d_t] = _input_1d_f2(_taps4(src, s0 + t * s_t, s_j))[1]
    for t in range(uintp(n)):
        dst[d0 + uintp(2) * d_l + t * d_t] = _input_1d_f2(_taps4(src, s0 + t * s_t, s_j))[2]
    for t in range(uintp(n)):
        dst[d0 + uintp(3) * d_l + t * d_t] = _input_1d_f2(_taps4(src, s0 + t * s_t, s_j))[3]


@njit(inline="always")
def _output_pass_f4(src, s0, s_j, s_t, dst, d0, d_l, d_t, n, bias):
    """``dst[d0 + l*d_l + t*d_t] = (A^T src_t)[l] + bias`` for F(4,3), ``l < 4``, ``t < n``."""
    s0, s_j, s_t, d0, d_l, d_t = uintp(s0), uintp(s_j), uintp(s_t), uintp(d0), uintp(d_l), uintp(d_t)
    for t in range(uintp(n)):
        dst[d0 + t * d_t] = _output_1d_f4(_taps6(src, s0 + t * s_t, s_j))[0] + bias
    for t in range(uintp(n)):
        dst[d0 + d_l + t * d_t] = _output_1d_f4(_taps6(src, s0 + t * s_t, s_j))[1] + bias
    for t in range(uintp(n)):
        dst[d0 + uintp(2) * d_l + t * d_t] = _output_1d_f4(_taps6(src, s0 + t * s_t, s_j))[2] + bias
    for t in range(uintp(n)):
        dst[d0 + uintp(3) * d_l + t * d_t] = _output_1d_f4(_taps6(src, s0 + t * s_t, s_j))[3] + bias


@njit(inline="always")
def _output_pass_f2(src, s0, s_j, s_t, dst, d0, d_l, d_t, n, bias):
    """``dst[d0 + l*d_l + t*d_t] = (A^T src_t)[l] + bias`` for F(2,3), ``l < 2``, ``t < n``."""
    s0, s_j, s_t, d0, d_l, d_t = uintp(s0), uintp(s_j), uintp(s_t), uintp(d0), uintp(d_l), uintp(d_t)
    for t in range(uintp(n)):
        dst[d0 + t * d_t] = _output_1d_f2(_taps4(src, s0 + t * s_t, s_j))[0] + bias
    for t in range(uintp(n)):
        dst[d0 + d_l + t * d_t] = _output_1d_f2(_taps4(src, s0 + t * s_t, s_j))[1] + bias


@njit(inline="always")
def _filter_pass_f4(src, s0, s_j, s_t, dst, d0, d_l, d_t, n):
    """``dst[d0 + l*d_l + t*d_t] = (G src_t)[l]`` for F(4,3) in float64, ``l < 6``, ``t < n``."""
    s0, s_j, s_t, d0, d_l, d_t = uintp(s0), uintp(s_j), uintp(s_t), uintp(d0), uintp(d_l), uintp(d_t)
    for t in range(uintp(n)):
        dst[d0 + t * d_t] = _filter_1d_f4(_taps3(src, s0 + t * s_t, s_j))[0]
    for t in range(uintp(n)):
        dst[d0 + d_l + t * d_t] = _filter_1d_f4(_taps3(src, s0 + t * s_t, s_j))[1]
    for t in range(uintp(n)):
        dst[d0 + uintp(2) * d_l + t * d_t] = _filter_1d_f4(_taps3(src, s0 + t * s_t, s_j))[2]
    for t in range(uintp(n)):
        dst[d0 + uintp(3) * d_l + t * d_t] = _filter_1d_f4(_taps3(src, s0 + t * s_t, s_j))[3]
    for t in range(uintp(n)):
        dst[d0 + uintp(4) * d_l + t * d_t] = _filter_1d_f4(_taps3(src, s0 + t * s_t, s_j))[4]
    for t in range(uintp(n)):
        dst[d0 + uintp(5) * d_l + t * d_t] = _filter_1d_f4(_taps3(src, s0 + t * s_t, s_j))[5]


@njit(inline="always")
def _filter_pass_f2(src, s0, s_j, s_t, dst, d0, d_l, d_t, n):
    """``dst[d0 + l*d_l + t*d_t] = (G src_t)[l]`` for F(2,3) in float64, ``l < 4``, ``t < n``."""
    s0, s_j, s_t, d0, d_l, d_t = uintp(s0), uintp(s_j), uintp(s_t), uintp(d0), uintp(d_l), uintp(d_t)
    for t in range(uintp(n)):
        dst[d0 + t * d_t] = _filter_1d_f2(_taps3(src, s0 + t * s_t, s_j))[0]
    for t in range(uintp(n)):
        dst[d0 + d_l + t * d_t] = _filter_1d_f2(_taps3(src, s0 + t * s_t, s_j))[1]
    for t in range(uintp(n)):
        dst[d0 + uintp(2) * d_l + t * d_t] = _filter_1d_f2(_taps3(src, s0 + t * s_t, s_j))[2]
    for t in range(uintp(n)):
        dst[d0 + uintp(3) * d_l + t * d_t] = _filter_1d_f2(_taps3(src, s0 + t * s_t, s_j))[3]


# -- filter transform ---------------------------------------------------------------------------
@njit(parallel=True, cache=True, fastmath={"contract"})
def filter_transform_f4(w, U):
    """``U[i*6 + j, g, k, c] = (G w[g*Kg + k, c] G^T)[i, j]`` for F(4x4,3x3), in float64.

    w : (K, Cg, 3, 3)            IN
    U : (36, groups, Kpad, Cg)   OUT rows ``k >= Kg = K / groups`` are zero
    """
    groups, Kpad, Cg = U.shape[1], U.shape[2], U.shape[3]
    Kg = w.shape[0] // groups
    w_flat, u_flat = w.ravel(), U.ravel()
    pos_stride = groups * Kpad * Cg
    for gk in prange(groups * Kpad):
        g = gk // Kpad
        k = gk - g * Kpad
        if k >= Kg:
            for pos in range(36):
                U[pos, g, k, :] = 0
            continue
        columns = np.empty(6 * 3 * Cg)  # (G f)[i, s] for every c, float64
        src = (g * Kg + k) * Cg * 9
        for s in range(3):  # G along each filter column s; taps 3 apart, filters 9 apart
            _filter_pass_f4(w_flat, src + s, 3, 9, columns, s * Cg, 3 * Cg, 1, Cg)
        for i in range(6):  # then G along the rows: (G f G^T)[i, j]
            _filter_pass_f4(columns, i * 3 * Cg, Cg, 1, u_flat, 6 * i * pos_stride + gk * Cg, pos_stride, 1, Cg)


@njit(parallel=True, cache=True, fastmath={"contract"})
def filter_transform_f2(w, U):
    """As :func:`filter_transform_f4` for F(2x2,3x3): ``U`` is (16, groups, Kpad, Cg)."""
    groups, Kpad, Cg = U.shape[1], U.shape[2], U.shape[3]
    Kg = w.shape[0] // groups
    w_flat, u_flat = w.ravel(), U.ravel()
    pos_stride = groups * Kpad * Cg
    for gk in prange(groups * Kpad):
        g = gk // Kpad
        k = gk - g * Kpad
        if k >= Kg:
            for pos in range(16):
                U[pos, g, k, :] = 0
            continue
        columns = np.empty(4 * 3 * Cg)
        src = (g * Kg + k) * Cg * 9
        for s in range(3):
            _filter_pass_f2(w_flat, src + s, 3, 9, columns, s * Cg, 3 * Cg, 1, Cg)
        for i in range(4):
            _filter_pass_f2(columns, i * 3 * Cg, Cg, 1, u_flat, 4 * i * pos_stride + gk * Cg, pos_stride, 1, Cg)


# -- input transform ----------------------------------------------------------------------------
@njit(inline="always")
def _load_padded_rows(x, n, c, h, w_first, u_lo, u_hi, src, width):
    """``src[j*width + u] = x[n, c, h + j, w_first + u]``, zero outside the image (the padding)."""
    H = x.shape[2]
    for j in range(src.size // width):
        dst = src[j * width:(j + 1) * width]
        if h + j >= 0 and h + j < H:
            dst[:u_lo] = 0
            dst[u_lo:u_hi] = x[n, c, h + j, w_first + u_lo:w_first + u_hi]
            dst[u_hi:] = 0
        else:
            dst[:] = 0


@njit(parallel=True, cache=True, fastmath={"contract"})
def input_transform_f4(x, V, tiles_h, row0, nrows, tx0, ntiles, top, left):
    """Transformed input tiles of one chunk, F(4x4,3x3).

    x : (N, C, H, W)   IN  the image, unpadded (padding is read as zeros)
    V : (36, C, Tpad)  OUT ``V[i*6 + j, c, r*ntiles + t]`` for tile ``t`` of chunk row ``r``;
                       columns from ``nrows * ntiles`` on are left as they are
    The chunk is global tile rows ``row0 .. row0+nrows-1`` (global row ``n * tiles_h + ty``) and
    tile columns ``tx0 .. tx0+ntiles-1``; ``top``, ``left``: padding before the image.
    """
    C, W = x.shape[1], x.shape[3]
    Tpad = V.shape[2]
    v_flat = V.ravel()
    width = 4 * ntiles + 2
    w_first = 4 * tx0 - left  # image column of row-buffer column 0
    u_lo = min(max(0, -w_first), width)
    u_hi = max(min(width, W - w_first), u_lo)
    for c in prange(C):
        src = np.empty(6 * width, x.dtype)
        rows = np.empty(6 * width, x.dtype)
        for r in range(nrows):
            n, ty = divmod(row0 + r, tiles_h)
            _load_padded_rows(x, n, c, 4 * ty - top, w_first, u_lo, u_hi, src, width)
            _input_pass_f4(src, 0, width, 1, rows, 0, width, 1, width)  # B^T d, along the row
            for i in range(6):  # (B^T d) B, along the tiles
                _input_pass_f4(rows, i * width, 1, 4, v_flat, (6 * i * C + c) * Tpad + r * ntiles, C * Tpad, 1,
                               ntiles)


@njit(parallel=True, cache=True, fastmath={"contract"})
def input_transform_f2(x, V, tiles_h, row0, nrows, tx0, ntiles, top, left):
    """As :func:`input_transform_f4` for F(2x2,3x3): ``V`` is (16, C, Tpad)."""
    C, W = x.shape[1], x.shape[3]
    Tpad = V.shape[2]
    v_flat = V.ravel()
    width = 2 * ntiles + 2
    w_first = 2 * tx0 - left
    u_lo = min(max(0, -w_first), width)
    u_hi = max(min(width, W - w_first), u_lo)
    for c in prange(C):
        src = np.empty(4 * width, x.dtype)
        rows = np.empty(4 * width, x.dtype)
        for r in range(nrows):
            n, ty = divmod(row0 + r, tiles_h)
            _load_padded_rows(x, n, c, 2 * ty - top, w_first, u_lo, u_hi, src, width)
            _input_pass_f2(src, 0, width, 1, rows, 0, width, 1, width)
            for i in range(4):
                _input_pass_f2(rows, i * width, 1, 2, v_flat, (4 * i * C + c) * Tpad + r * ntiles, C * Tpad, 1,
                               ntiles)


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
@njit(inline="always")
def _store_partial_rows(y, n, k, p0, q0, out, width):
    """``y[n, k, p0 + a, q0:q0 + width] = out[a*width:(a+1)*width]`` for the rows ``< P``."""
    for a in range(min(out.size // width, y.shape[2] - p0)):
        y[n, k, p0 + a, q0:q0 + width] = out[a * width:(a + 1) * width]


@njit(parallel=True, cache=True, fastmath={"contract"})
def output_transform_f4(M, y, bias, tiles_h, row0, nrows, tx0, ntiles):
    """Outputs of one chunk, F(4x4,3x3): ``y[n, k, tile] = A^T m A + bias[k]``.

    M : (36, K, Tpad)  IN  GEMM results, laid out like ``V`` of :func:`input_transform_f4`
    y : (N, K, P, Q)   OUT only the outputs of this chunk's tiles are written
    bias : (K,)        IN  (zeros when the call has no bias)
    """
    K, P, Q = y.shape[1], y.shape[2], y.shape[3]
    Tpad = M.shape[2]
    m_flat, y_flat = M.ravel(), y.ravel()
    q0 = 4 * tx0
    width = min(Q, q0 + 4 * ntiles) - q0  # output columns of the chunk (the last tile may be partial)
    for k in prange(K):
        rows = np.empty(6 * 4 * ntiles, y.dtype)
        out = np.empty(4 * width, y.dtype)
        zero = _as_type_of(bias[k], 0.0)
        for r in range(nrows):
            n, ty = divmod(row0 + r, tiles_h)
            for i in range(6):  # m A, along the tiles (interleaved stores)
                _output_pass_f4(m_flat, (6 * i * K + k) * Tpad + r * ntiles, K * Tpad, 1,
                                rows, i * 4 * ntiles, 1, 4, ntiles, zero)
            p0 = 4 * ty
            if p0 + 4 <= P:  # A^T (m A) + bias, along the output rows, straight into y
                _output_pass_f4(rows, 0, 4 * ntiles, 1, y_flat, ((n * K + k) * P + p0) * Q + q0, Q, 1, width,
                                bias[k])
            else:  # the bottom tile row is cut by the edge
                _output_pass_f4(rows, 0, 4 * ntiles, 1, out, 0, width, 1, width, bias[k])
                _store_partial_rows(y, n, k, p0, q0, out, width)


@njit(parallel=True, cache=True, fastmath={"contract"})
def output_transform_f2(M, y, bias, tiles_h, row0, nrows, tx0, ntiles):
    """As :func:`output_transform_f4` for F(2x2,3x3): ``M`` is (16, K, Tpad)."""
    K, P, Q = y.shape[1], y.shape[2], y.shape[3]
    Tpad = M.shape[2]
    m_flat, y_flat = M.ravel(), y.ravel()
    q0 = 2 * tx0
    width = min(Q, q0 + 2 * ntiles) - q0
    for k in prange(K):
        rows = np.empty(4 * 2 * ntiles, y.dtype)
        out = np.empty(2 * width, y.dtype)
        zero = _as_type_of(bias[k], 0.0)
        for r in range(nrows):
            n, ty = divmod(row0 + r, tiles_h)
            for i in range(4):
                _output_pass_f2(m_flat, (4 * i * K + k) * Tpad + r * ntiles, K * Tpad, 1,
                                rows, i * 2 * ntiles, 1, 2, ntiles, zero)
            p0 = 2 * ty
            if p0 + 2 <= P:
                _output_pass_f2(rows, 0, 2 * ntiles, 1, y_flat, ((n * K + k) * P + p0) * Q + q0, Q, 1, width,
                                bias[k])
            else:
                _output_pass_f2(rows, 0, 2 * ntiles, 1, out, 0, width, 1, width, bias[k])
                _store_partial_rows(y, n, k, p0, q0, out, width)


_TRANSFORMS = {
    2: (filter_transform_f2, input_transform_f2, output_transform_f2),
    4: (filter_transform_f4, input_transform_f4, output_transform_f4),
}


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


class WinogradAlgorithm:
    """Winograd F(m x m, 3 x 3) on the CPU; exposes the module contract of :mod:`convlib.registry`.

    Parameters
    ----------
    m : int
        Output tile size: 2 (F(2x2,3x3), alpha = 4) or 4 (F(4x4,3x3), alpha = 6).
    """

    def __init__(self, m: int):
        self.m = m
        self.alpha = m + 2
        self.title = f"Winograd F({m}x{m},3x3)"
        self._transforms = _TRANSFORMS[m]

    def __repr__(self) -> str:
        return f"<convlib.cpu.winograd {self.title}>"

    def supports(self, problem) -> str | None:
        """None for 3x3 filters with stride 1 and dilation 1, else the reason."""
        if problem.is_winograd_shape:
            return None
        return (
            f"{self.title} needs a 3x3 filter with stride 1 and dilation 1; got "
            f"{problem.R}x{problem.S} stride {_pair(problem.stride)} dilation {_pair(problem.dilation)}"
        )

    def chunk_plan(self, problem, chunk_bytes: int | None = None) -> ChunkPlan:
        """The chunking of ``problem``'s tiles that keeps ``V + M`` near ``chunk_bytes``.

        ``chunk_bytes`` defaults to :data:`CHUNK_BYTES`. Chunks hold at least one tile, and the
        tile rows are spread evenly over the chunks (so the last one is not a stub).
        """
        chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
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

    def workspace_bytes(self, problem, chunk_bytes: int | None = None) -> int:
        """Bytes allocated beyond x, w, bias and y: ``U`` plus one chunk's ``V`` and ``M``.

        ``alpha**2 * (groups * Kpad * Cg + (C + K) * Tpad) * itemsize``, with ``Kpad`` the
        rows per group rounded up to the micro-kernel's ``MR`` and ``Tpad`` the chunk's tiles
        rounded up to its ``NR``; small per-thread row buffers not counted.
        """
        plan = self.chunk_plan(problem, chunk_bytes)
        MR = REGISTER_TILE[problem.dtype][0]
        Kpad = -(-problem.K_per_group // MR) * MR
        u_elems = problem.groups * Kpad * problem.C_per_group
        return self.alpha**2 * (u_elems + (problem.C + problem.K) * plan.padded_tiles) * problem.itemsize

    def conv2d(self, problem, x, w, bias, device=None):
        """The convolution of ``x`` with ``w`` (see :mod:`convlib.registry` for the contract)."""
        filter_transform, input_transform, output_transform = self._transforms
        dtype = np.dtype(problem.dtype)
        y = np.empty(problem.y_shape, dtype)
        if y.size == 0:
            return y
        a2 = self.alpha**2
        MR, NR = REGISTER_TILE[problem.dtype]
        Kg = problem.K_per_group
        U = np.empty((a2, problem.groups, -(-Kg // MR) * MR, problem.C_per_group), dtype)
        filter_transform(w, U)
        plan = self.chunk_plan(problem)
        # Flat buffers, zeroed once: each chunk views the front of them as (a2, C, Tpad), and
        # the padding columns then hold zeros or values of an earlier chunk, never garbage.
        V_buffer = np.zeros(a2 * problem.C * plan.padded_tiles, dtype)
        M_buffer = np.empty(a2 * problem.K * plan.padded_tiles, dtype)
        bias_or_zeros = bias if bias is not None else np.zeros(problem.K, dtype)
        batched_gemm = batched_gemm_kernel(MR, NR)
        for row0, nrows, tx0, ncols in plan.chunks(problem.N):
            Tpad = -(-nrows * ncols // NR) * NR
            V = V_buffer[: a2 * problem.C * Tpad].reshape(a2, problem.C, Tpad)
            M = M_buffer[: a2 * problem.K * Tpad].reshape(a2, problem.K, Tpad)
            input_transform(x, V, plan.tiles_h, row0, nrows, tx0, ncols, problem.pad_top, problem.pad_left)
            batched_gemm(U, V, M, Kg)
            output_transform(M, y, bias_or_zeros, plan.tiles_h, row0, nrows, tx0, ncols)
        return y


def _pair(v) -> str:
    return str(v[0]) if v[0] == v[1] else f"{v[0]}x{v[1]}"


#: F(2x2,3x3): 16 tile positions, 2.25x fewer multiplications than direct.
F2 = WinogradAlgorithm(2)
#: F(4x4,3x3): 36 tile positions, 4x fewer multiplications than direct.
F4 = WinogradAlgorithm(4)
