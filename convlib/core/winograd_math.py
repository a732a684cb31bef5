"""Winograd minimal-filtering transforms F(m x m, 3 x 3), shared by every backend.

Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks" (CVPR 2016, arXiv 1509.09308,
2015) compute an ``m x m`` block of outputs of a 3x3 correlation from an ``alpha x alpha`` input
tile, ``alpha = m + 2``, as::

    Y = A^T [ (G g G^T) * (B^T d B) ] A          (* = elementwise)

with ``g`` the 3x3 filter and ``d`` the input tile; neighbouring tiles overlap by 2. Summed over
input channels, the elementwise products become ``alpha**2`` independent GEMMs, one per tile
position, which is where the multiplication count drops: ``alpha**2 / (m**2 * 9)`` of direct,
i.e. 16/36 (2.25x fewer) for F(2x2,3x3) and 36/144 (4x fewer) for F(4x4,3x3).

How the matrices are built
--------------------------
The 1-D algorithm F(m, 3) is the Toom-Cook method on ``alpha - 1`` finite interpolation points
``a_j`` plus the point at infinity. Written for correlation (the transpose of polynomial
multiplication), with ``f_j = prod_{l != j} (a_j - a_l)``:

* ``A^T[i, j] = a_j ** i`` (m x alpha): evaluate the output polynomial; the infinity column is
  ``e_{m-1}`` (its leading coefficient).
* ``G[j, k] = a_j ** k / f_j`` (alpha x 3): the filter's values at the points, with the Lagrange
  denominators folded in; the infinity row is ``e_2`` (the filter's last tap).
* ``B^T`` (alpha x alpha) is then the unique matrix for which the identity
  ``sum_j A^T[i, j] G[j, k] B^T[j, l] = [l == i + k]`` holds, i.e. ``y_i = sum_k d_{i+k} g_k``;
  :func:`transform_matrices` solves it exactly in rationals.

A scaling ``s_j`` of row ``j`` of ``G`` together with ``1 / s_j`` on row ``j`` of ``B^T`` (or of
column ``j`` of ``A^T``) leaves the algorithm exact; it only moves rounding error around. The
matrices used here are the ones of Lavin & Gray (also those of NNPACK, cuDNN's documentation and
``wincnn``):

==============  ======================  =====================================================
tile            points                  scaling
==============  ======================  =====================================================
F(2x2,3x3)      0, 1, -1, inf           row 0 of ``G`` and column 3 (inf) of ``A^T`` negated,
                                        so that ``G`` row 0 is ``[1, 0, 0]`` and ``A^T`` is
                                        ``[[1, 1, 1, 0], [0, 1, -1, -1]]``; ``B^T`` is all 0/±1
F(4x4,3x3)      0, 1, -1, 2, -2, inf    none: the Lagrange denominators 4, -6, -6, 24, 24 stay
                                        in ``G`` (entries 1/4, 1/6, 1/12, 1/24), so ``B^T`` and
                                        ``A^T`` are small integers (at most 5 and 8)
==============  ======================  =====================================================

Accuracy: the integer ``B^T``/``A^T`` of F(4x4,3x3) amplify the rounding error of the GEMM by the
growth of their entries (up to 8 and 5, squared in 2-D); ``docs/algorithms.md`` (Winograd section) has the measured
figures. Everything in this module is plain Python/numpy, usable by every backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

#: Filter size served by every Winograd algorithm here.
FILTER_SIZE = 3

#: Finite interpolation points per output tile size ``m`` (the point at infinity is implied).
INTERPOLATION_POINTS = {
    2: (0, 1, -1),
    4: (0, 1, -1, 2, -2),
}

#: Lavin & Gray's sign/scale conventions on top of the plain Toom-Cook matrices:
#: ``{m: (g_row_scale, a_col_scale)}``, each a tuple of alpha factors (see the module docstring).
CONVENTIONAL_SCALING = {
    2: ((-1, 1, 1, 1), (1, 1, 1, -1)),
    4: ((1,) * 6, (1,) * 6),
}


@dataclass(frozen=True)
class WinogradTransforms:
    """The three matrices of F(m x m, 3 x 3) as read-only float64 arrays.

    Attributes
    ----------
    m : int
        Output tile size (2 or 4).
    alpha : int
        Input tile size, ``m + 2``.
    BT : ndarray, shape (alpha, alpha)
        Input transform: ``V = BT @ d @ BT.T``.
    G : ndarray, shape (alpha, 3)
        Filter transform: ``U = G @ g @ G.T``.
    AT : ndarray, shape (m, alpha)
        Output transform: ``Y = AT @ M @ AT.T``.
    points : tuple
        The finite interpolation points (infinity is the last one).
    """

    m: int
    alpha: int
    BT: np.ndarray
    G: np.ndarray
    AT: np.ndarray
    points: tuple

    def filter_taps_to_positions(self) -> np.ndarray:
        """``kron(G, G)``, shape (alpha**2, 9): ``U.ravel() = T @ g.ravel()`` for one filter.

        Row ``i * alpha + j`` is tile position ``(i, j)``; column ``r * 3 + s`` is tap ``(r, s)``.
        """
        return np.kron(self.G, self.G)


def _solve_exact(rows: list[list[Fraction]], rhs: list[Fraction]) -> list[Fraction]:
    """Least-squares-free exact solve of a consistent, full-column-rank system (Gauss-Jordan)."""
    n = len(rows[0])
    aug = [list(r) + [b] for r, b in zip(rows, rhs)]
    pivot_row = 0
    for col in range(n):
        pivot = next((i for i in range(pivot_row, len(aug)) if aug[i][col] != 0), None)
        if pivot is None:
            raise ValueError("the Winograd identity has no unique solution: points are not distinct")
        aug[pivot_row], aug[pivot] = aug[pivot], aug[pivot_row]
        p = aug[pivot_row][col]
        aug[pivot_row] = [v / p for v in aug[pivot_row]]
        for i in range(len(aug)):
            if i != pivot_row and aug[i][col] != 0:
                f = aug[i][col]
                aug[i] = [a - f * b for a, b in zip(aug[i], aug[pivot_row])]
        pivot_row += 1
    if any(row[-1] != 0 for row in aug[n:]):
        raise ValueError("the Winograd identity is inconsistent for these points")
    return [aug[i][-1] for i in range(n)]


def toom_cook_matrices(m: int, points, r: int = FILTER_SIZE):
    """Exact (Fraction) ``AT, G, BT`` of the 1-D F(m, r) on ``points`` plus infinity, unscaled.

    Parameters
    ----------
    m : int
        Outputs per tile.
    points : sequence of int or Fraction
        ``m + r - 2`` distinct finite interpolation points.
    r : int
        Filter length.

    Returns
    -------
    AT, G, BT : list of list of Fraction
        Shapes (m, alpha), (alpha, r), (alpha, alpha) with ``alpha = m + r - 1``.
    """
    alpha = m + r - 1
    pts = [Fraction(p) for p in points]
    if len(pts) != alpha - 1 or len(set(pts)) != len(pts):
        raise ValueError(f"F({m},{r}) needs {alpha - 1} distinct finite points, got {points!r}")
    AT = [[p**i for p in pts] + [Fraction(int(i == m - 1))] for i in range(m)]
    G = []
    for j, a in enumerate(pts):
        f = Fraction(1)
        for l, b in enumerate(pts):
            if l != j:
                f *= a - b
        G.append([a**k / f for k in range(r)])
    G.append([Fraction(int(k == r - 1)) for k in range(r)])
    # Solve column l of BT from sum_j AT[i][j] G[j][k] BT[j][l] = [l == i + k].
    system = [[AT[i][j] * G[j][k] for j in range(alpha)] for i in range(m) for k in range(r)]
    BT_cols = [
        _solve_exact(system, [Fraction(int(l == i + k)) for i in range(m) for k in range(r)])
        for l in range(alpha)
    ]
    BT = [[BT_cols[l][j] for l in range(alpha)] for j in range(alpha)]
    return AT, G, BT


@lru_cache(maxsize=None)
def transform_matrices(m: int) -> WinogradTransforms:
    """The conventional (Lavin & Gray) matrices of F(m x m, 3 x 3) for ``m`` in (2, 4).

    Parameters
    ----------
    m : int
        Output tile size: 2 or 4.

    Returns
    -------
    WinogradTransforms
        float64 arrays; read-only.
    """
    if m not in INTERPOLATION_POINTS:
        raise ValueError(f"Winograd tile size m={m!r}: allowed are {sorted(INTERPOLATION_POINTS)}")
    AT, G, BT = toom_cook_matrices(m, INTERPOLATION_POINTS[m])
    g_scale, a_scale = CONVENTIONAL_SCALING[m]
    alpha = m + 2
    for j in range(alpha):
        # Scaling G row j by s and A^T column j by t needs B^T row j divided by s * t.
        G[j] = [v * g_scale[j] for v in G[j]]
        for i in range(m):
            AT[i][j] *= a_scale[j]
        BT[j] = [v / (g_scale[j] * a_scale[j]) for v in BT[j]]

    def as_array(rows):
        arr = np.array([[float(v) for v in row] for row in rows])
        arr.setflags(write=False)
        return arr

    return WinogradTransforms(
        m=m, alpha=alpha, BT=as_array(BT), G=as_array(G), AT=as_array(AT),
        points=tuple(INTERPOLATION_POINTS[m]) + ("inf",),
    )


def winograd_correlate_tile(d: np.ndarray, g: np.ndarray, m: int) -> np.ndarray:
    """One tile the slow, obvious way: ``AT [(G g G^T) * (BT d B)] A`` (for tests and docs).

    Parameters
    ----------
    d : ndarray, shape (alpha, alpha)
    g : ndarray, shape (3, 3)
    m : int

    Returns
    -------
    ndarray, shape (m, m)
        Equals ``scipy.signal.correlate(d, g, "valid")`` up to rounding.
    """
    t = transform_matrices(m)
    U = t.G @ g @ t.G.T
    V = t.BT @ d @ t.BT.T
    return t.AT @ (U * V) @ t.AT.T


def tile_grid(problem, m: int) -> tuple[int, int]:
    """``(ceil(P / m), ceil(Q / m))``: the rows and columns of ``m x m`` output tiles per image."""
    return -(-problem.P // m), -(-problem.Q // m)


class WinogradTile:
    """What every backend's Winograd F(m x m, 3 x 3) object shares: its tile and which problems it serves.

    Backends subclass it and add ``run`` and ``workspace_bytes`` (the implementation contract of
    :mod:`convlib.core.contracts`).

    Parameters
    ----------
    m : int
        Output tile size: 2 (F(2x2,3x3), alpha = 4) or 4 (F(4x4,3x3), alpha = 6).
    """

    def __init__(self, m: int):
        self.m = m
        self.alpha = m + 2
        self.title = f"Winograd F({m}x{m},3x3)"

    def tiles(self, problem) -> tuple[int, int]:
        """Tile rows and columns per image: ``ceil(P / m)``, ``ceil(Q / m)``."""
        return tile_grid(problem, self.m)

    def supports(self, problem) -> str | None:
        """None for 3x3 filters with stride 1 and dilation 1, else the reason."""
        if problem.is_winograd_shape:
            return None
        return (
            f"{self.title} needs a 3x3 filter with stride 1 and dilation 1; got "
            f"{problem.R}x{problem.S} stride {_pair(problem.stride)} dilation {_pair(problem.dilation)}"
        )


def _pair(v) -> str:
    return str(v[0]) if v[0] == v[1] else f"{v[0]}x{v[1]}"
