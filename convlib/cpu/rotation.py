"""The filters of a stride-1 convolution's data pass run as a forward one
(:func:`convlib.core.problem.rotated_problem`): rotated by 180 degrees, their channel axes swapped
per group. ``winograd`` (:mod:`convlib.cpu.winograd_backward`), ``direct``
(:mod:`convlib.cpu.direct_backward`) and ``depthwise`` (:mod:`convlib.cpu.depthwise_backward`) run
their data passes on them, each through :func:`data_pass_as_forward`.

The rotated problem multiplies ``w`` by the zeros of ``dy``'s padding, where the data pass has no
product at all: with a non-finite ``w`` (``0 * inf`` is NaN) the elements that come out
non-finite are recomputed by the pass's own definition
(:func:`convlib.cpu.exact.repair_nonfinite_input_gradient`). So the rotation also says whether
every filter value is finite: one pass over ``w`` (numpy's transpose, copy and finiteness test
took longer than a small layer's kernel).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..core.problem import ConvProblem, rotated_problem
from .exact import repair_nonfinite_input_gradient


@njit(cache=True)
def _rotate(w, groups, out):  # IN w (K, C/groups, R, S); OUT out (C, K/groups, R, S); whether w is finite
    K, Cg, R, S = w.shape
    Kg = K // groups
    finite = True
    for g in range(groups):
        for k in range(Kg):
            for c in range(Cg):
                for r in range(R):
                    for s in range(S):
                        v = w[g * Kg + k, c, r, s]
                        finite = finite and np.isfinite(v)
                        out[g * Cg + c, k, R - 1 - r, S - 1 - s] = v
    return finite


def rotated_filters(w: np.ndarray, groups: int) -> tuple[np.ndarray, bool]:
    """``(w', finite)``: ``w'[g*Cg + c, k] = w[g*Kg + k, c, ::-1, ::-1]`` (C, K/groups, R, S) from
    ``w`` (K, C/groups, R, S), and whether every element of ``w`` is finite."""
    K, Cg, R, S = w.shape
    out = np.empty((groups * Cg, K // groups, R, S), w.dtype)
    return out, bool(_rotate(w, groups, out))


def rotated_filter_bytes(problem: ConvProblem) -> int:
    """Bytes of the rotated filters: the workspace a data pass run as a forward one adds to its
    forward kernel's."""
    return problem.K * problem.gemm_k * problem.itemsize


def data_pass_as_forward(problem: ConvProblem, run_forward, dy, w, bias, *, always_repair: bool = False):
    """``dx`` of ``problem``'s stride-1 data pass by ``run_forward(rotated_problem, dy, w', bias,
    None)`` (a forward implementation's ``run``; no device on the CPU) on the rotated filters
    ``w'``. Its elements that come out non-finite are recomputed by the pass's definition when
    ``w`` is not finite (``0 * inf`` in the rotated problem's padding), or always with
    ``always_repair`` (Winograd's transforms spread an inf of ``dy`` over its tiles)."""
    w_rotated, finite = rotated_filters(w, problem.groups)
    dx = run_forward(rotated_problem(problem), dy, w_rotated, bias, None)
    if always_repair or not finite:
        repair_nonfinite_input_gradient(problem, dy, w, bias, dx)
    return dx
