"""Winograd F(2x2,3x3) and F(4x4,3x3) convolution on the CPU (numba transforms + batched GEMM).

The method (Lavin & Gray 2015; matrices in :mod:`convlib.winograd_math`), per chunk of tiles:

1. **Input transform** ``V[pos, c, t] = (B^T d B)[pos]`` for every ``alpha x alpha`` input tile
   ``d`` (tiles overlap by 2), written tile-innermost so the GEMM reads contiguous rows.
   Separable: a vertical pass over whole image rows (contiguous, vectorised along the width) into
   an ``alpha x width`` row buffer whose borders are the zero padding, then a horizontal pass
   vectorised along the tiles of the row.
2. **Filter transform** ``U[pos, k, c] = (G g G^T)[pos]``, once per call, in float64 and rounded
   once to the working dtype.
3. **Batched GEMM**, one per tile position and group:
   ``M[pos, g] (K/G x T) = U[pos, g] (K/G x C/G) @ V[pos, g] (C/G x T)``.
4. **Output transform** ``y = A^T m A + bias`` per tile, horizontal pass first (vectorised along
   the tiles), then vertical (vectorised along the output row); partial tiles at the bottom and
   right edges write only their valid outputs.

Tiles are processed in chunks of whole tile rows (or of part of one row when a single row is too
big) so the workspace ``V + M`` stays near :data:`CHUNK_BYTES` whatever N, H and W are.

The 1-D transforms are written out by hand below (numba cannot constant-fold a multiplication by
a zero matrix entry without fast-math); ``tests/test_winograd.py`` checks them against the
matrices of :mod:`convlib.winograd_math`.

Compilation: the kernels depend only on the dtype (shapes are runtime arguments), so each dtype
compiles once per machine (``cache=True``); a new shape costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from ..winograd_math import transform_matrices

#: Target bytes of one chunk's transformed input plus GEMM output (V + M).
CHUNK_BYTES = 4 * 2**20


# -- 1-D transforms, written out from winograd_math's matrices ----------------------------------
@njit(inline="always")
def _input_1d_f4(d0, d1, d2, d3, d4, d5):
    # B^T of F(4,3): rows 1/2 and 3/4 share their even and odd parts.
    even12 = d4 - 4.0 * d2
    odd12 = d3 - 4.0 * d1
    even34 = d4 - d2
    odd34 = 2.0 * (d3 - d1)
    return (
        4.0 * d0 - 5.0 * d2 + d4,
        even12 + odd12,
        even12 - odd12,
        even34 + odd34,
        even34 - odd34,
        4.0 * d1 - 5.0 * d3 + d5,
    )


@njit(inline="always")
def _output_1d_f4(m0, m1, m2, m3, m4, m5):
    s12 = m1 + m2
    d12 = m1 - m2
    s34 = m3 + m4
    d34 = m3 - m4
    return (m0 + s12 + s34, d12 + 2.0 * d34, s12 + 4.0 * s34, d12 + 8.0 * d34 + m5)


@njit(inline="always")
def _filter_1d_f4(g0, g1, g2):
    even = g0 + g2
    return (
        g0 / 4.0,
        -(even + g1) / 6.0,
        -(even - g1) / 6.0,
        (g0 + 4.0 * g2) / 24.0 + g1 / 12.0,
        (g0 + 4.0 * g2) / 24.0 - g1 / 12.0,
        g2,
    )


@njit(inline="always")
def _input_1d_f2(d0, d1, d2, d3):
    return (d0 - d2, d1 + d2, d2 - d1, d1 - d3)


@njit(inline="always")
def _output_1d_f2(m0, m1, m2, m3):
    return (m0 + m1 + m2, m1 - m2 - m3)


@njit(inline="always")
def _filter_1d_f2(g0, g1, g2):
    return (g0, (g0 + g1 + g2) / 2.0, (g0 - g1 + g2) / 2.0, g2)


# -- filter transform ---------------------------------------------------------------------------
@njit(parallel=True, cache=True)
def filter_transform_f4(w, U):
    """``U[i*6 + j, k, c] = (G w[k, c] G^T)[i, j]`` for F(4x4,3x3), computed in float64.

    w : (K, Cg, 3, 3)  IN
    U : (36, K, Cg)    OUT, any float dtype
    """
    K, Cg = w.shape[0], w.shape[1]
    for k in prange(K):
        for c in range(Cg):
            g = w[k, c]
            # Rows first: t[r] = G applied along the filter columns of filter row r.
            t0 = _filter_1d_f4(np.float64(g[0, 0]), np.float64(g[1, 0]), np.float64(g[2, 0]))
            t1 = _filter_1d_f4(np.float64(g[0, 1]), np.float64(g[1, 1]), np.float64(g[2, 1]))
            t2 = _filter_1d_f4(np.float64(g[0, 2]), np.float64(g[1, 2]), np.float64(g[2, 2]))
            for i in range(6):
                u = _filter_1d_f4(t0[i], t1[i], t2[i])
                for j in range(6):
                    U[i * 6 + j, k, c] = u[j]


@njit(parallel=True, cache=True)
def filter_transform_f2(w, U):
    """``U[i*4 + j, k, c] = (G w[k, c] G^T)[i, j]`` for F(2x2,3x3), computed in float64.

    w : (K, Cg, 3, 3)  IN
    U : (16, K, Cg)    OUT
    """
    K, Cg = w.shape[0], w.shape[1]
    for k in prange(K):
        for c in range(Cg):
            g = w[k, c]
            t0 = _filter_1d_f2(np.float64(g[0, 0]), np.float64(g[1, 0]), np.float64(g[2, 0]))
            t1 = _filter_1d_f2(np.float64(g[0, 1]), np.float64(g[1, 1]), np.float64(g[2, 1]))
            t2 = _filter_1d_f2(np.float64(g[0, 2]), np.float64(g[1, 2]), np.float64(g[2, 2]))
            for i in range(4):
                u = _filter_1d_f2(t0[i], t1[i], t2[i])
                for j in range(4):
                    U[i * 4 + j, k, c] = u[j]


# -- input transform ----------------------------------------------------------------------------
@njit(inline="always")
def _input_row_or_zeros(x, n, c, h, zeros):
    """Image row ``h`` of channel ``c``, or the zero row when ``h`` falls in the padding."""
    H = x.shape[2]
    if h >= 0 and h < H:
        return x[n, c, h]
    return zeros


@njit(parallel=True, cache=True)
def input_transform_f4(x, V, tiles_h, row0, nrows, tx0, ntiles, top, left):
    """Transformed input tiles of one chunk, F(4x4,3x3).

    x : (N, C, H, W)       IN  the image (unpadded; padding is read as zeros)
    V : (36, C, >= nrows*ntiles)  OUT  ``V[i*6 + j, c, r*ntiles + t]`` for tile ``t`` of row ``r``
    tiles_h : tile rows per image; the chunk is global tile rows ``row0 .. row0+nrows-1``
    (``n * tiles_h + ty``), tile columns ``tx0 .. tx0+ntiles-1``; ``top``, ``left``: padding.
    """
    C, W = x.shape[1], x.shape[3]
    width = 4 * ntiles + 2
    zeros = np.zeros(W, x.dtype)
    w_first = 4 * tx0 - left  # image column of buffer column 0
    u_lo = min(max(0, -w_first), width)
    u_hi = max(min(width, W - w_first), u_lo)
    for item in prange(C * nrows):
        c = item // nrows
        r = item - c * nrows
        n, ty = divmod(row0 + r, tiles_h)
        h = 4 * ty - top
        x0 = _input_row_or_zeros(x, n, c, h, zeros)
        x1 = _input_row_or_zeros(x, n, c, h + 1, zeros)
        x2 = _input_row_or_zeros(x, n, c, h + 2, zeros)
        x3 = _input_row_or_zeros(x, n, c, h + 3, zeros)
        x4 = _input_row_or_zeros(x, n, c, h + 4, zeros)
        x5 = _input_row_or_zeros(x, n, c, h + 5, zeros)
        rows = np.empty((6, width), x.dtype)
        rows[:, :u_lo] = 0
        rows[:, u_hi:] = 0
        for u in range(u_lo, u_hi):
            w = w_first + u
            v = _input_1d_f4(x0[w], x1[w], x2[w], x3[w], x4[w], x5[w])
            rows[0, u] = v[0]
            rows[1, u] = v[1]
            rows[2, u] = v[2]
            rows[3, u] = v[3]
            rows[4, u] = v[4]
            rows[5, u] = v[5]
        t_first = r * ntiles
        for i in range(6):
            row = rows[i]
            for t in range(ntiles):
                u = 4 * t
                v = _input_1d_f4(row[u], row[u + 1], row[u + 2], row[u + 3], row[u + 4], row[u + 5])
                V[i * 6, c, t_first + t] = v[0]
                V[i * 6 + 1, c, t_first + t] = v[1]
                V[i * 6 + 2, c, t_first + t] = v[2]
                V[i * 6 + 3, c, t_first + t] = v[3]
                V[i * 6 + 4, c, t_first + t] = v[4]
                V[i * 6 + 5, c, t_first + t] = v[5]


@njit(parallel=True, cache=True)
def input_transform_f2(x, V, tiles_h, row0, nrows, tx0, ntiles, top, left):
    """As :func:`input_transform_f4` for F(2x2,3x3): ``V`` is (16, C, >= nrows*ntiles)."""
    C, W = x.shape[1], x.shape[3]
    width = 2 * ntiles + 2
    zeros = np.zeros(W, x.dtype)
    w_first = 2 * tx0 - left
    u_lo = min(max(0, -w_first), width)
    u_hi = max(min(width, W - w_first), u_lo)
    for item in prange(C * nrows):
        c = item // nrows
        r = item - c * nrows
        n, ty = divmod(row0 + r, tiles_h)
        h = 2 * ty - top
        x0 = _input_row_or_zeros(x, n, c, h, zeros)
        x1 = _input_row_or_zeros(x, n, c, h + 1, zeros)
        x2 = _input_row_or_zeros(x, n, c, h + 2, zeros)
        x3 = _input_row_or_zeros(x, n, c, h + 3, zeros)
        rows = np.empty((4, width), x.dtype)
        rows[:, :u_lo] = 0
        rows[:, u_hi:] = 0
        for u in range(u_lo, u_hi):
            w = w_first + u
            v = _input_1d_f2(x0[w], x1[w], x2[w], x3[w])
            rows[0, u] = v[0]
            rows[1, u] = v[1]
            rows[2, u] = v[2]
            rows[3, u] = v[3]
        t_first = r * ntiles
        for i in range(4):
            row = rows[i]
            for t in range(ntiles):
                u = 2 * t
                v = _input_1d_f2(row[u], row[u + 1], row[u + 2], row[u + 3])
                V[i * 4, c, t_first + t] = v[0]
                V[i * 4 + 1, c, t_first + t] = v[1]
                V[i * 4 + 2, c, t_first + t] = v[2]
                V[i * 4 + 3, c, t_first + t] = v[3]


# -- output transform ---------------------------------------------------------------------------
@njit(inline="always")
def _store_edge_rows(y, n, k, p0, q0, q1, rows, AT, bias_k):
    """Bottom-edge tile row: only ``P - p0`` of its ``m`` output rows exist (generic, slow path)."""
    P = y.shape[2]
    m, alpha = AT.shape
    for a in range(min(m, P - p0)):
        out = y[n, k, p0 + a]
        for q in range(q0, q1):
            s = bias_k
            for i in range(alpha):
                s += AT[a, i] * rows[i, q - q0]
            out[q] = s


@njit(parallel=True, cache=True)
def output_transform_f4(M, y, bias, AT, tiles_h, row0, nrows, tx0, ntiles):
    """Outputs of one chunk, F(4x4,3x3): ``y[n, k, tile] = A^T m A + bias[k]``.

    M : (36, K, >= nrows*ntiles)  IN  GEMM results, laid out like ``V`` of the input transform
    y : (N, K, P, Q)              OUT only the outputs of this chunk's tiles are written
    bias : (K,)                   IN  (zeros when the call has no bias)
    AT : (4, 6) float64           IN  A^T, for the partial bottom tile rows
    """
    K, P, Q = y.shape[1], y.shape[2], y.shape[3]
    q0 = 4 * tx0
    q1 = min(Q, q0 + 4 * ntiles)
    for item in prange(K * nrows):
        k = item // nrows
        r = item - k * nrows
        n, ty = divmod(row0 + r, tiles_h)
        t_first = r * ntiles
        rows = np.empty((6, 4 * ntiles), y.dtype)
        for i in range(6):
            m0 = M[i * 6, k]
            m1 = M[i * 6 + 1, k]
            m2 = M[i * 6 + 2, k]
            m3 = M[i * 6 + 3, k]
            m4 = M[i * 6 + 4, k]
            m5 = M[i * 6 + 5, k]
            row = rows[i]
            for t in range(ntiles):
                tt = t_first + t
                v = _output_1d_f4(m0[tt], m1[tt], m2[tt], m3[tt], m4[tt], m5[tt])
                row[4 * t] = v[0]
                row[4 * t + 1] = v[1]
                row[4 * t + 2] = v[2]
                row[4 * t + 3] = v[3]
        p0 = 4 * ty
        b = bias[k]
        if p0 + 4 <= P:
            y0 = y[n, k, p0]
            y1 = y[n, k, p0 + 1]
            y2 = y[n, k, p0 + 2]
            y3 = y[n, k, p0 + 3]
            for q in range(q0, q1):
                u = q - q0
                v = _output_1d_f4(rows[0, u], rows[1, u], rows[2, u], rows[3, u], rows[4, u], rows[5, u])
                y0[q] = v[0] + b
                y1[q] = v[1] + b
                y2[q] = v[2] + b
                y3[q] = v[3] + b
        else:
            _store_edge_rows(y, n, k, p0, q0, q1, rows, AT, b)


@njit(parallel=True, cache=True)
def output_transform_f2(M, y, bias, AT, tiles_h, row0, nrows, tx0, ntiles):
    """As :func:`output_transform_f4` for F(2x2,3x3): ``M`` is (16, K, >= nrows*ntiles)."""
    K, P, Q = y.shape[1], y.shape[2], y.shape[3]
    q0 = 2 * tx0
    q1 = min(Q, q0 + 2 * ntiles)
    for item in prange(K * nrows):
        k = item // nrows
        r = item - k * nrows
        n, ty = divmod(row0 + r, tiles_h)
        t_first = r * ntiles
        rows = np.empty((4, 2 * ntiles), y.dtype)
        for i in range(4):
            m0 = M[i * 4, k]
            m1 = M[i * 4 + 1, k]
            m2 = M[i * 4 + 2, k]
            m3 = M[i * 4 + 3, k]
            row = rows[i]
            for t in range(ntiles):
                tt = t_first + t
                v = _output_1d_f2(m0[tt], m1[tt], m2[tt], m3[tt])
                row[2 * t] = v[0]
                row[2 * t + 1] = v[1]
        p0 = 2 * ty
        b = bias[k]
        if p0 + 2 <= P:
            y0 = y[n, k, p0]
            y1 = y[n, k, p0 + 1]
            for q in range(q0, q1):
                u = q - q0
                v = _output_1d_f2(rows[0, u], rows[1, u], rows[2, u], rows[3, u])
                y0[q] = v[0] + b
                y1[q] = v[1] + b
        else:
            _store_edge_rows(y, n, k, p0, q0, q1, rows, AT, b)


_KERNELS = {
    2: (filter_transform_f2, input_transform_f2, output_transform_f2),
    4: (filter_transform_f4, input_transform_f4, output_transform_f4),
}


# -- the algorithm objects ----------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkPlan:
    """How the tiles of one call are split into chunks.

    A chunk is ``rows`` consecutive global tile rows (tile row ``ty`` of image ``n`` is global
    row ``n * tiles_h + ty``) and, within each, tile columns ``tx0 .. tx0 + cols - 1``. Either
    ``cols == tiles_w`` (whole rows) or ``rows == 1`` (one row split in pieces).
    """

    tiles_h: int
    tiles_w: int
    rows: int
    cols: int

    @property
    def tiles(self) -> int:
        """Tiles per (full) chunk: the T of the GEMMs."""
        return self.rows * self.cols

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
        self._kernels = _KERNELS[m]

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

        ``chunk_bytes`` defaults to :data:`CHUNK_BYTES`; at least one tile per chunk.
        """
        chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
        m = self.m
        tiles_h = -(-problem.P // m)
        tiles_w = -(-problem.Q // m)
        per_tile = self.alpha**2 * (problem.C + problem.K) * problem.itemsize
        budget = max(1, chunk_bytes // per_tile)
        if budget >= tiles_w:
            rows = min(budget // tiles_w, max(problem.N, 1) * tiles_h)
            return ChunkPlan(tiles_h, tiles_w, rows, tiles_w)
        return ChunkPlan(tiles_h, tiles_w, 1, budget)

    def workspace_bytes(self, problem, chunk_bytes: int | None = None) -> int:
        """Bytes allocated beyond x, w, bias and y: ``U`` plus one chunk's ``V`` and ``M``."""
        plan = self.chunk_plan(problem, chunk_bytes)
        a2, isz = self.alpha**2, problem.itemsize
        return a2 * (problem.K * problem.C_per_group + (problem.C + problem.K) * plan.tiles) * isz

    def conv2d(self, problem, x, w, bias, device=None):
        """The convolution of ``x`` with ``w`` (see :mod:`convlib.registry` for the contract)."""
        filter_transform, input_transform, output_transform = self._kernels
        dtype = np.dtype(problem.dtype)
        a2 = self.alpha**2
        G = problem.groups
        Kg, Cg = problem.K_per_group, problem.C_per_group
        y = np.empty(problem.y_shape, dtype)
        if y.size == 0:
            return y
        U = np.empty((a2, problem.K, Cg), dtype)
        filter_transform(w, U)
        U_groups = U.reshape(a2, G, Kg, Cg)
        plan = self.chunk_plan(problem)
        # Flat buffers: each chunk views their first a2*C*T elements as contiguous (a2, C, T).
        V_buffer = np.empty(a2 * problem.C * plan.tiles, dtype)
        M_buffer = np.empty(a2 * problem.K * plan.tiles, dtype)
        bias_or_zeros = bias if bias is not None else np.zeros(problem.K, dtype)
        AT = transform_matrices(self.m).AT
        for row0, nrows, tx0, ncols in plan.chunks(problem.N):
            T = nrows * ncols
            V = V_buffer[: a2 * problem.C * T].reshape(a2, problem.C, T)
            M = M_buffer[: a2 * problem.K * T].reshape(a2, problem.K, T)
            input_transform(x, V, plan.tiles_h, row0, nrows, tx0, ncols, problem.pad_top, problem.pad_left)
            np.matmul(U_groups, V.reshape(a2, G, Cg, T), out=M.reshape(a2, G, Kg, T))
            output_transform(M, y, bias_or_zeros, AT, plan.tiles_h, row0, nrows, tx0, ncols)
        return y


def _pair(v) -> str:
    return str(v[0]) if v[0] == v[1] else f"{v[0]}x{v[1]}"


#: F(2x2,3x3): 16 tile positions, 2.25x fewer multiplications than direct.
F2 = WinogradAlgorithm(2)
#: F(4x4,3x3): 36 tile positions, 4x fewer multiplications than direct.
F4 = WinogradAlgorithm(4)
