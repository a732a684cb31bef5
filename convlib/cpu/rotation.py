"""The backward data pass of a stride-1 convolution as a forward convolution.

At stride 1 and dilation 1 the gradient of a convolution with respect to its input is itself a
convolution: of ``dy`` (N, K, P, Q) with the filters rotated by 180 degrees and with their
channel axes swapped per group, ``w'[g*Cg + c, k] = w[g*Kg + k, c, ::-1, ::-1]`` (C, K/groups, R,
S), padded by ``R-1-top`` rows above, ``R-1-bottom`` below (and likewise columns), which gives
exactly ``x``'s H x W; ``conv_transpose2d``'s bias is the forward's bias. Served when that padding
is not negative (``padding <= R - 1`` on every side, and ``S - 1`` for the columns).

Two algorithms compute their data pass so, on their own forward kernels: ``winograd``
(:mod:`convlib.cpu.winograd_backward`) and ``direct`` (:mod:`convlib.cpu.direct_backward`).
The rotated problem multiplies ``w`` by the zeros of ``dy``'s padding, where the data pass has
no product at all: with a non-finite ``w`` (``0 * inf`` is NaN) the elements that come out
non-finite are recomputed by the pass's own definition
(:func:`convlib.cpu.exact.repair_nonfinite_input_gradient`).
"""

from __future__ import annotations

import functools

import numpy as np

from ..core.problem import ConvProblem, make_problem


def runs_as_forward(problem: ConvProblem) -> bool:
    """Whether the data pass of ``problem`` is the forward convolution of :func:`rotated_problem`."""
    top, bottom, left, right = problem.padding
    return (problem.stride == (1, 1) and problem.dilation == (1, 1)
            and max(top, bottom) <= problem.R - 1 and max(left, right) <= problem.S - 1)


@functools.lru_cache(maxsize=256)
def rotated_problem(problem: ConvProblem) -> ConvProblem:
    """The forward convolution whose output is ``dx``: input ``dy``, filters ``w'`` (see the
    module docstring). Kept per problem: building and validating one is longer than a small
    layer's kernel."""
    p = problem
    R, S = p.R, p.S
    top, bottom, left, right = p.padding
    return make_problem(
        (p.N, p.K, p.P, p.Q), (p.C, p.K_per_group, R, S), (p.C,) if p.has_bias else None, p.dtype, p.dtype,
        p.dtype if p.has_bias else None, stride=1,
        padding=(R - 1 - top, R - 1 - bottom, S - 1 - left, S - 1 - right), dilation=1, groups=p.groups)


def rotated_filters(w: np.ndarray, groups: int) -> np.ndarray:
    """``w'`` (C, K/groups, R, S) from ``w`` (K, C/groups, R, S)."""
    K, Cg, R, S = w.shape
    per_group = w.reshape(groups, K // groups, Cg, R, S)[:, :, :, ::-1, ::-1]
    return np.ascontiguousarray(per_group.transpose(0, 2, 1, 3, 4).reshape(groups * Cg, K // groups, R, S))
