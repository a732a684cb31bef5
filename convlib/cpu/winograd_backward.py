"""The backward data pass by Winograd's minimal filtering (numba, CPU): ``winograd``,
``winograd2``, ``winograd4``.

At stride 1 and dilation 1 the gradient of a convolution with respect to its input is itself a
convolution: of ``dy`` (N, K, P, Q) with the filters rotated by 180 degrees and with their
channel axes swapped per group, ``w'[g*Cg + c, k] = w[g*Kg + k, c, ::-1, ::-1]`` (C, K/groups, R,
S), padded by ``R-1-top`` rows above, ``R-1-bottom`` below (and likewise columns), which gives
exactly ``x``'s H x W. So a 3x3 layer's data pass runs the forward Winograd kernels of
:mod:`convlib.cpu.winograd` (the same transforms, GEMM and workspace bound) on that problem, and
``conv_transpose2d``'s bias is the forward's bias. Served when that padding is not negative
(``padding <= R - 1`` on every side).

Non-finite inputs: the rotated problem's padding multiplies ``w`` by zeros where the data pass
has no product at all (``0 * inf`` would be NaN), and Winograd's transforms spread an ``inf``
over its tiles; every element of ``dx`` that comes out non-finite is recomputed by the data
pass's own definition (:func:`convlib.cpu.exact.repair_nonfinite_input_gradient`), which covers
every element the definition makes non-finite.
"""

from __future__ import annotations

import numpy as np

from ..core.problem import ConvProblem, make_problem
from .exact import repair_nonfinite_input_gradient
from .winograd import F2, F4


def rotated_problem(problem: ConvProblem) -> ConvProblem:
    """The forward convolution whose output is ``dx``: input ``dy``, filters ``w'`` (see the
    module docstring)."""
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


class _WinogradData:
    """The implementation contract of the Winograd backward data pass for one tile size."""

    def __init__(self, forward):
        self.forward = forward

    def supports(self, problem: ConvProblem) -> str | None:
        """None for 3x3 filters at stride 1 and dilation 1 with padding of at most 2, else the
        reason."""
        if not problem.is_winograd_shape:
            return self.forward.supports(problem)
        if max(problem.padding) > problem.R - 1:
            return f"{self.forward.title} for the data pass needs padding <= {problem.R - 1}; got {problem.padding}"
        return None

    def workspace_bytes(self, problem: ConvProblem, device=None) -> int:
        """The forward Winograd's workspace on the rotated problem (bounded by its chunks) and the
        rotated filters."""
        return self.forward.workspace_bytes(rotated_problem(problem)) + problem.K * problem.gemm_k * problem.itemsize

    def run(self, problem: ConvProblem, dy, w, bias, device=None):
        dx = self.forward.run(rotated_problem(problem), dy, rotated_filters(w, problem.groups), bias)
        repair_nonfinite_input_gradient(problem, dy, w, bias, dx)
        return dx


#: ``conv2d_backward_data`` by F(4x4,3x3) (``winograd`` and ``winograd4``) and F(2x2,3x3).
DATA_F4 = _WinogradData(F4)
DATA_F2 = _WinogradData(F2)
