"""Is a benchmarked answer right? The best reference a shape affords, and how far off we may be.

Every candidate's first answer is compared with :func:`reference_for`: float64 PyTorch when the
shape is small enough, else PyTorch in the problem's dtype, else the float64 scipy reference
(:mod:`convlib.testing`) for small shapes. Large per-channel problems (``groups == C``: the image
filters) are checked plane by plane in float64 by scipy's overlap-add FFT convolution: PyTorch's
float64 path builds a column matrix of ``R*S`` copies of the image (26 GB for a 7x7 filter on an
8192^2 image). A fast wrong kernel is then flagged (``status="wrong"``) rather than celebrated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.problem import ConvProblem
from ..testing import TOLERANCE, backward_reference_for, conv2d_reference_for, relative_error
from .candidates import torch_conv, torch_gradient, torch_gradient_unsupported

#: Extra factor allowed when the reference itself is computed in the problem's dtype (PyTorch in
#: float32 has rounding errors of its own, of the same order as ours).
SAME_PRECISION_SLACK = 4.0
#: Largest x + y (elements) for which a float64 PyTorch reference is computed (1 GiB of float64).
FLOAT64_REFERENCE_MAX_ELEMENTS = 2**27
#: Largest problem (FLOPs) for which the slow scipy float64 reference is used when PyTorch is absent.
SCIPY_REFERENCE_MAX_FLOPS = 2e9
#: Largest column matrix (bytes, float64, one image) of PyTorch's float64 reference; past it a
#: per-channel problem is checked by FFT (:func:`planes_reference`).
FLOAT64_REFERENCE_MAX_COLUMN_BYTES = 2**30


@dataclass
class Reference:
    """A reference answer and how far a result may be from it.

    Attributes
    ----------
    y : numpy.ndarray or None
        The answer (None: no check possible).
    label : str
        How it was computed (``"torch-float64"``, ``"torch-float32"``, ``"scipy-float64"``, ``"none"``).
    tolerance : float
        Largest relative Frobenius error accepted.
    """

    y: np.ndarray | None
    label: str
    tolerance: float


def reference_for(problem: ConvProblem, *inputs) -> Reference:
    """The best reference affordable for ``problem`` (see the module docstring); a backward pass
    is checked against PyTorch's in float64 or, without PyTorch, the definitions of
    :mod:`convlib.testing`."""
    tol = TOLERANCE[problem.dtype]
    if problem.operation != "conv2d":
        return _gradient_reference(problem, *inputs)
    x, w, bias = inputs
    small = (problem.N * (problem.C * problem.H * problem.W + problem.K * problem.P * problem.Q)
             <= FLOAT64_REFERENCE_MAX_ELEMENTS)
    columns = problem.C // problem.groups * problem.R * problem.S * problem.P * problem.Q * 8
    if problem.groups == problem.C and (columns > FLOAT64_REFERENCE_MAX_COLUMN_BYTES or not small):
        return Reference(planes_reference(problem, x, w, bias), "fft-float64", tol)
    try:
        import torch  # noqa: F401
    except ImportError:
        if problem.flops <= SCIPY_REFERENCE_MAX_FLOPS:
            return Reference(conv2d_reference_for(problem, x, w, bias), "scipy-float64", tol)
        return Reference(None, "none", math.inf)
    if small or problem.dtype == "float64":
        return Reference(torch_conv(problem, x, w, bias, dtype="float64")().numpy(), "torch-float64", tol)
    y = torch_conv(problem, x, w, bias)().numpy()
    return Reference(y, f"torch-{problem.dtype}", tol * SAME_PRECISION_SLACK)


def planes_reference(problem: ConvProblem, x, w, bias) -> np.ndarray:
    """The float64 result of a per-channel problem (``groups == C``), one plane at a time by
    overlap-add FFT (:func:`scipy.signal.oaconvolve`; memory: a few planes, whatever the filter)."""
    from scipy.signal import oaconvolve

    top, bottom, left, right = problem.padding
    (sh, sw), (dh, dw) = problem.stride, problem.dilation
    multiplier = problem.K // problem.C
    y = np.empty(problem.y_shape, np.float64)
    for n in range(problem.N):
        for k in range(problem.K):
            plane = np.pad(np.asarray(x[n, k // multiplier], np.float64), ((top, bottom), (left, right)))
            kernel = np.zeros(((problem.R - 1) * dh + 1, (problem.S - 1) * dw + 1))
            kernel[::dh, ::dw] = w[k, 0]
            # Correlation is convolution with the flipped kernel; "valid" keeps the windows inside.
            full = oaconvolve(plane, kernel[::-1, ::-1], mode="valid")
            y[n, k] = full[::sh, ::sw][:problem.P, :problem.Q] + (0.0 if bias is None else float(bias[k]))
    return y


def _gradient_reference(problem: ConvProblem, *inputs) -> Reference:
    tol = TOLERANCE[problem.dtype]
    try:
        import torch  # noqa: F401
    except ImportError:
        if problem.flops <= SCIPY_REFERENCE_MAX_FLOPS:
            return Reference(backward_reference_for(problem, *inputs), "definition-float64", tol)
        return Reference(None, "none", math.inf)
    if torch_gradient_unsupported(problem) is None:
        return Reference(torch_gradient(problem, *inputs, dtype="float64")().numpy(), "torch-float64", tol)
    return Reference(backward_reference_for(problem, *inputs), "definition-float64", tol)


__all__ = ["Reference", "reference_for", "relative_error", "TOLERANCE"]
