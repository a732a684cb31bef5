"""Bounded memory for any problem: a convolution whose workspace would pass the cap runs in pieces.

``convlib.options.workspace_cap`` bounds the temporary memory of one call. An implementation
reports its workspace for a problem (``workspace_bytes``); when that passes the cap for the whole
problem, :meth:`~convlib.dispatch.plan.Plan.execute` computes it piece by piece and copies each
piece's result into the output:

1. groups of whole images (``x[n0:n1]`` is contiguous: read in place);
2. if one image is still too much, bands of output rows of one image. A band reads input rows
   ``p0*sh - top .. (p1-1)*sh - top + dh*(R-1)``; the part inside the image is copied out
   (contiguous, as implementations take), the rest becomes the band's own zero padding, so the
   band is an ordinary problem with ``P = p1 - p0``. A band that reads only padding convolves a
   zero image of its height (its result is the bias, or NaN where a weight is NaN, as the
   definition says).

A piece costs its implementation's workspace plus its result (and its input band, when banded);
pieces are the largest that cost at most the cap. A piece is never smaller than one output row of
one image: what an algorithm needs whatever the image (Winograd's transformed filters grow with
the filters, not the image) is not reduced by cutting, so the effective cap is at least the cost
of that smallest piece, and a problem within it is not cut at all.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from ..core.problem import ConvProblem


@dataclass(frozen=True)
class Piece:
    """One piece of a problem: output images ``n0:n1``, output rows ``p0:p1``.

    Attributes
    ----------
    problem : ConvProblem
        The piece as a problem of its own (``N = n1 - n0``, ``P = p1 - p0``).
    n0, n1, p0, p1 : int
        Where its result goes in the whole output.
    h0, h1 : int
        The input rows it reads (``h0 == h1`` when it reads only padding); ``None`` for a group
        of whole images, which reads ``x[n0:n1]`` in place.
    """

    problem: ConvProblem
    n0: int
    n1: int
    p0: int
    p1: int
    h0: int | None = None
    h1: int | None = None

    @property
    def banded(self) -> bool:
        """Whether the piece reads a band of rows (copied) rather than whole images."""
        return self.h0 is not None


def band(problem: ConvProblem, n0: int, n1: int, p0: int, p1: int) -> Piece:
    """Output rows ``p0:p1`` of images ``n0:n1`` as a :class:`Piece` (see the module docstring)."""
    sh, dh = problem.stride[0], problem.dilation[0]
    top, _, left, right = problem.padding
    first = p0 * sh - top                                    # first input row read (may be < 0)
    end = (p1 - 1) * sh - top + dh * (problem.R - 1) + 1     # one past the last
    h0, h1 = max(0, first), min(problem.H, end)
    if h1 <= h0:  # only padding: a zero image of the band's height
        h0 = h1 = 0
        sub = replace(problem, N=n1 - n0, H=end - first, padding=(0, 0, left, right))
    else:
        sub = replace(problem, N=n1 - n0, H=h1 - h0, padding=(h0 - first, end - h1, left, right))
    assert sub.P == p1 - p0, (problem, p0, p1, sub)
    return Piece(sub, n0, n1, p0, p1, h0, h1)


def _largest(fits: Callable[[int], bool], high: int) -> int:
    """The largest ``n`` in ``1..high`` with ``fits(n)`` (``fits`` monotone), or 1."""
    lo, hi = 1, high
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def conv2d_pieces(problem: ConvProblem, workspace_of: Callable[[ConvProblem], int], cap: int) -> list[Piece] | None:
    """The pieces ``problem`` runs in under ``cap`` bytes, or None when it runs whole.

    ``workspace_of(problem)`` is the implementation's workspace for a problem.
    """
    if workspace_of(problem) <= cap:
        return None

    def images_cost(n: int) -> int:
        sub = replace(problem, N=n)
        return workspace_of(sub) + sub.output_bytes

    def band_cost(rows: int) -> int:
        # The dearest of a band at the top, in the middle and at the bottom of the image.
        cost = 0
        for p0 in {0, max(0, (problem.P - rows) // 2), problem.P - rows}:
            piece = band(problem, 0, 1, p0, p0 + rows)
            sub = piece.problem
            cost = max(cost, workspace_of(sub) + sub.output_bytes + sub.N * sub.C * sub.H * sub.W * sub.itemsize)
        return cost

    limit = max(cap, band_cost(1))
    if images_cost(1) <= limit:
        n = _largest(lambda k: images_cost(k) <= limit, problem.N)
        if n >= problem.N:
            return None
        return [Piece(replace(problem, N=min(n, problem.N - n0)), n0, min(problem.N, n0 + n), 0, problem.P)
                for n0 in range(0, problem.N, n)]
    rows = _largest(lambda r: band_cost(r) <= limit, problem.P)
    return [band(problem, n, n + 1, p0, min(problem.P, p0 + rows))
            for n in range(problem.N) for p0 in range(0, problem.P, rows)]
