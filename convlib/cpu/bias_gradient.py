"""The bias gradient ``db = dy.sum((0, 2, 3))`` (numba, CPU): ``direct``.

One task per channel (the threads share the channels); each plane is summed in float64, so a
float32 sum over a large batch keeps float32's precision in the result rather than losing it
in the additions, with several partial sums at once (vectorised). Memory-bound: ``dy`` is read
once.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..core.problem import ConvProblem


def supports(problem: ConvProblem) -> str | None:
    """Every ``dy`` is served."""
    return None


def workspace_bytes(problem: ConvProblem, device=None) -> int:
    """Nothing beyond the result."""
    return 0


@njit(fastmath={"reassoc"}, cache=True)
def plane_sum(plane):  # IN plane (P*Q,): its sum, in float64
    # Reassociation lets LLVM keep several partial sums in vector registers: in order, each
    # addition waited for the previous one (4 cycles), and the bias gradient of a 32x32x8x8 dy
    # took longer than the layer's forward pass. Only reassociation: inf and NaN keep their
    # meaning (no "fast" flags that assume finite values).
    total = 0.0
    for i in range(plane.shape[0]):
        total += np.float64(plane[i])
    return total


@njit(parallel=True, cache=True)
def channel_sums(dy, db):  # IN dy (N, K, P*Q); OUT db (K,)
    N, K, PQ = dy.shape
    for k in prange(K):
        total = 0.0
        for n in range(N):
            total += plane_sum(dy[n, k])
        db[k] = total


def run(problem: ConvProblem, dy, device=None):
    """``dy.sum((0, 2, 3))`` of ``dy`` ``(N, K, P, Q)`` (the problem's ``x_shape``)."""
    N, K, P, Q = problem.x_shape
    db = np.empty(K, problem.dtype)
    channel_sums(dy.reshape(N, K, P * Q), db)
    return db
