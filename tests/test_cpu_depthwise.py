"""The depthwise kernel's edges: channel multipliers, strides (de-interleaved), dilations, padding
never copied (clipped runs, whole padding rows), and the padding's 0 * w terms for non-finite w."""

from __future__ import annotations

import numpy as np
import pytest

import convlib
from convlib.core.problem import ConvProblem
from convlib.cpu import depthwise
from convlib.testing import TOLERANCE, conv2d_reference_for, relative_error

from .conftest import random_arrays

# (N, C, H, W, multiplier, R, S, stride, padding, dilation)
CASES = {
    "mobilenet-like": (2, 8, 12, 12, 1, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    "stride2-odd-width": (2, 6, 13, 11, 1, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),
    "multiplier3-stride3x2": (1, 4, 17, 19, 3, 5, 3, (3, 2), (2, 0, 1, 3), (1, 1)),
    "dilated": (3, 5, 10, 14, 2, 3, 3, (1, 2), (0, 2, 2, 0), (2, 2)),
    "padding-wider-than-image": (1, 3, 4, 5, 1, 7, 7, (1, 1), (6, 5, 6, 5), (1, 1)),
    "one-by-one-strided": (2, 4, 9, 9, 1, 1, 1, (2, 2), (0, 0, 0, 0), (1, 1)),
    "one-column": (2, 3, 8, 1, 1, 3, 1, (1, 1), (1, 1, 0, 0), (1, 1)),
}


def problem_for(name, dtype) -> ConvProblem:
    N, C, H, W, m, R, S, stride, padding, dilation = CASES[name]
    return ConvProblem(N, C, H, W, C * m, R, S, stride, padding, dilation, C, dtype, True)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(case, dtype, rng):
    problem = problem_for(case, dtype)
    x, w, b = random_arrays(rng, problem)
    copies = x.copy(), w.copy(), b.copy()
    y = depthwise.run(problem, x, w, b)
    assert y.shape == problem.y_shape and y.dtype == np.dtype(dtype)
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE[dtype]
    assert all(np.array_equal(a, c) for a, c in zip((x, w, b), copies))


def test_serves_depthwise_only():
    assert depthwise.supports(ConvProblem(1, 4, 5, 5, 8, 3, 3, groups=4)) is None
    assert "groups == C" in depthwise.supports(ConvProblem(1, 4, 5, 5, 8, 3, 3, groups=2))
    x, w = np.ones((1, 4, 5, 5), np.float32), np.ones((8, 2, 3, 3), np.float32)
    with pytest.raises(NotImplementedError, match="groups == C.*Algorithms that can: direct"):
        convlib.conv2d(x, w, groups=2, algo="depthwise")


def test_auto_picks_it_for_depthwise_layers():
    x, w = np.ones((8, 96, 112, 112), np.float32), np.ones((96, 1, 3, 3), np.float32)
    assert convlib.choose_algorithm(x, w, stride=2, padding=1, groups=96).algo == "depthwise"


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_padding_terms_of_a_non_finite_weight(bad, rng):
    """The definition multiplies the padding's zeros by every weight: 0 * inf and 0 * NaN are NaN.
    With tap (0, 0) of channel 2 infinite and x positive, channel 2 is +inf where that tap reads
    the image and NaN where it reads padding; a NaN weight makes the whole channel NaN."""
    problem = problem_for("stride2-odd-width", "float64")
    x, w, b = random_arrays(rng, problem)
    x = np.abs(x) + 0.5
    finite_w = w.copy()
    finite_w[2, 0, 0, 0] = 0.0
    expected = conv2d_reference_for(problem, x, finite_w, b)
    p = np.arange(problem.P)[:, None] * problem.stride[0] - problem.pad_top
    q = np.arange(problem.Q)[None, :] * problem.stride[1] - problem.pad_left
    reads_padding = (p < 0) | (p >= problem.H) | (q < 0) | (q >= problem.W)
    expected[:, 2] = np.where(reads_padding, np.nan, np.inf) if bad == np.inf else np.nan
    w[2, 0, 0, 0] = bad
    y = depthwise.run(problem, x, w, b)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(expected))
    np.testing.assert_array_equal(np.isposinf(y), np.isposinf(expected))
    finite = np.isfinite(expected)
    assert finite[:, 2].sum() == 0 and relative_error(y[finite], expected[finite]) <= TOLERANCE["float64"]
