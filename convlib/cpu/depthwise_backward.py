"""The backward data pass of depthwise layers by the depthwise kernels (numba, CPU): ``depthwise``.

At stride 1 and dilation 1 the data pass is a forward convolution of ``dy`` with the rotated
filters (:func:`convlib.core.problem.rotated_problem`, :mod:`convlib.cpu.rotation`). For a
depthwise layer with one filter per channel that problem is depthwise again (``K`` channels of
``dy``, one filter each), so it runs the forward depthwise kernels of :mod:`convlib.cpu.depthwise`
(the same ways, bands and workspace bound), and ``conv_transpose2d``'s bias is the forward's bias.
Served when the rotated problem is depthwise and its padding is not negative (``padding <= R - 1``,
``S - 1`` on every side); a channel multiplier above one makes the rotated problem's groups hold
several channels of ``dy``, which the depthwise kernels do not serve.

Non-finite filters: the rotated problem's padding multiplies ``w`` by zeros where the data pass
has no product at all (``0 * inf`` would be NaN); when ``w`` holds an inf or NaN, every element of
``dx`` that comes out non-finite is recomputed by the data pass's own definition
(:func:`convlib.cpu.exact.repair_nonfinite_input_gradient`). A non-finite ``dy`` meets only the
products the definition has.
"""

from __future__ import annotations

from ..core.problem import ConvProblem, rotated_problem, runs_as_forward
from . import depthwise
from .rotation import data_pass_as_forward, rotated_filter_bytes


class _DepthwiseData:
    """The implementation contract of the depthwise backward data pass."""

    def supports(self, problem: ConvProblem) -> str | None:
        """None for a depthwise layer with one filter per channel at stride 1 and dilation 1, with
        padding of at most ``R - 1``, ``S - 1``; else the reason."""
        if not runs_as_forward(problem):
            return ("depthwise's data pass needs stride 1, dilation 1 and padding <= filter size - 1 on every side; "
                    f"got stride={problem.stride}, dilation={problem.dilation}, padding={problem.padding}")
        reason = depthwise.supports(rotated_problem(problem))
        if reason is not None:
            return (f"depthwise's data pass needs one filter per channel (groups == C == K); got C={problem.C}, "
                    f"K={problem.K}, groups={problem.groups}")
        return None

    def workspace_bytes(self, problem: ConvProblem, device=None) -> int:
        """The forward depthwise kernels' workspace on the rotated problem, and the rotated
        filters."""
        return depthwise.workspace_bytes(rotated_problem(problem)) + rotated_filter_bytes(problem)

    def run(self, problem: ConvProblem, dy, w, bias, device=None):
        return data_pass_as_forward(problem, depthwise.run, dy, w, bias)


#: ``conv2d_backward_data`` (and ``conv_transpose2d``) of depthwise layers by the depthwise kernels.
DATA = _DepthwiseData()
