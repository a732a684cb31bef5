"""The backward data pass by Winograd's minimal filtering (numba, CPU): ``winograd``,
``winograd2``, ``winograd4``.

At stride 1 and dilation 1 the data pass is a forward convolution of ``dy`` with the rotated
filters (:func:`convlib.core.problem.rotated_problem`, :mod:`convlib.cpu.rotation`), so a 3x3
layer's data pass runs the forward Winograd kernels of :mod:`convlib.cpu.winograd` (the same
transforms, GEMM and workspace bound) on that problem, and ``conv_transpose2d``'s bias is the
forward's bias. Served when the rotated padding is not negative (``padding <= R - 1`` on every
side).

Non-finite inputs: the rotated problem's padding multiplies ``w`` by zeros where the data pass
has no product at all (``0 * inf`` would be NaN), and Winograd's transforms spread an ``inf``
over its tiles; every element of ``dx`` that comes out non-finite is recomputed by the data
pass's own definition (:func:`convlib.cpu.exact.repair_nonfinite_input_gradient`), which covers
every element the definition makes non-finite.
"""

from __future__ import annotations

from ..core.problem import ConvProblem, rotated_problem
from .rotation import data_pass_as_forward, rotated_filter_bytes
from .winograd import F2, F4


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
        return self.forward.workspace_bytes(rotated_problem(problem)) + rotated_filter_bytes(problem)

    def run(self, problem: ConvProblem, dy, w, bias, device=None):
        return data_pass_as_forward(problem, self.forward.run, dy, w, bias, always_repair=True)


#: ``conv2d_backward_data`` by F(4x4,3x3) (``winograd`` and ``winograd4``) and F(2x2,3x3).
DATA_F4 = _WinogradData(F4)
DATA_F2 = _WinogradData(F2)
