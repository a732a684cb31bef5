"""The contract: every registered (backend, algorithm) gives the reference's answer.

One test, parametrised over every registered pair (each implementation once) and over awkward shapes,
both dtypes. Pairs that cannot serve a case must say so with ``NotImplementedError`` naming the
algorithms that can; pairs whose backend is not installed here are skipped (their own test
modules decide when that is a failure).
"""

from __future__ import annotations

import numpy as np
import pytest

import convlib
from convlib.dispatch import registry
from convlib.core.problem import ConvProblem

from .conftest import all_pairs, device_for, groups_for, random_arrays
from convlib.testing import TOLERANCE, conv2d_reference_for, relative_error

# (N, C, H, W, K, R, S, stride, padding (top, bottom, left, right), dilation, groups, bias)
CASES = {
    "3x3-pad1-bias": (2, 3, 9, 11, 5, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, True),
    "1x1": (2, 8, 7, 5, 16, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1, False),
    "RneS-stride-2x1-asympad": (1, 4, 13, 10, 6, 2, 5, (2, 1), (1, 0, 2, 1), (1, 1), 1, True),
    "dilation2": (2, 3, 12, 12, 4, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2), 1, False),
    "dilation-1x3-stride3": (1, 2, 11, 17, 3, 3, 2, (3, 3), (0, 1, 1, 0), (1, 3), 1, True),
    "groups3": (2, 6, 8, 9, 9, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 3, True),
    "depthwise": (2, 8, 10, 10, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 8, False),
    "N1-C1": (1, 1, 7, 7, 1, 3, 3, (1, 1), (0, 0, 0, 0), (1, 1), 1, False),
    "stem-7x7-s2": (1, 3, 20, 19, 8, 7, 7, (2, 2), (3, 3, 3, 3), (1, 1), 1, True),
    "filter-as-large-as-padded-input": (2, 2, 5, 4, 3, 5, 6, (1, 1), (0, 0, 1, 1), (1, 1), 1, True),
    "same-even-2x2": (2, 3, 8, 8, 4, 2, 2, (1, 1), (0, 1, 0, 1), (1, 1), 1, False),
    "many-K-odd-Q": (2, 16, 13, 21, 70, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, True),
    "deep-reduction": (1, 64, 12, 12, 20, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, False),
    "odd-tiles-3x3": (3, 5, 9, 7, 6, 3, 3, (1, 1), (1, 0, 0, 1), (1, 1), 1, True),
}


def make_case(name, dtype):
    N, C, H, W, K, R, S, stride, padding, dilation, groups, bias = CASES[name]
    return ConvProblem(N, C, H, W, K, R, S, stride, padding, dilation, groups, dtype, bias)


def run_pair(backend, algo, problem, x, w, b):
    return convlib.conv2d(
        x, w, b, stride=problem.stride, padding=problem.padding,
        dilation=problem.dilation, groups=problem.groups, algo=algo, device=device_for(backend),
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend, algo", all_pairs())
def test_matches_reference(backend, algo, case, dtype, rng):
    problem = make_case(case, dtype)
    x, w, b = random_arrays(rng, problem)
    reason = registry.unsupported_reason("conv2d", backend, algo, problem)
    if reason is not None:
        with pytest.raises(NotImplementedError, match="Algorithms that can: .*direct"):
            run_pair(backend, algo, problem, x, w, b)
        return
    y = run_pair(backend, algo, problem, x, w, b)
    assert isinstance(y, np.ndarray)
    assert y.shape == problem.y_shape and y.dtype == np.dtype(dtype)
    err = relative_error(y, conv2d_reference_for(problem, x, w, b))
    assert err <= TOLERANCE[dtype], f"{backend}/{algo} {problem.describe()}: relative error {err:.3e}"


@pytest.mark.parametrize("backend, algo", all_pairs())
def test_empty_batch(backend, algo):
    groups = groups_for(backend, algo, 4)
    x = np.zeros((0, 4, 6, 6), np.float32)
    w = np.ones((2 if groups == 1 else 4, 4 // groups, 3, 3), np.float32)
    y = convlib.conv2d(x, w, groups=groups, algo=algo, device=device_for(backend))
    assert y.shape == (0, w.shape[0], 4, 4) and y.dtype == np.float32


@pytest.mark.parametrize("backend, algo", all_pairs())
def test_nan_and_inf_propagate(backend, algo):
    groups = groups_for(backend, algo, 2)
    x = np.ones((1, 2, 8, 8), np.float64)
    x[0, 0, 1, 1] = np.nan
    x[0, 1, 6, 6] = np.inf
    w = np.ones((3 if groups == 1 else 2, 2 // groups, 3, 3), np.float64)
    y = convlib.conv2d(x, w, groups=groups, algo=algo, device=device_for(backend))
    # Exactly the outputs whose window holds the NaN are NaN, and those whose window holds the
    # inf are inf, under every algorithm (Winograd repairs what its transforms spread). A
    # depthwise output channel sees only its own input channel.
    nan_window = np.zeros((6, 6), bool)
    nan_window[0:2, 0:2] = True
    inf_window = np.zeros((6, 6), bool)
    inf_window[4:6, 4:6] = True
    for k in range(w.shape[0]):
        sees_nan = groups == 1 or k == 0
        sees_inf = groups == 1 or k == 1
        expected_nan = nan_window if sees_nan else np.zeros_like(nan_window)
        expected_inf = (inf_window & ~expected_nan) if sees_inf else np.zeros_like(inf_window)
        np.testing.assert_array_equal(np.isnan(y[0, k]), expected_nan)
        np.testing.assert_array_equal(np.isinf(y[0, k]), expected_inf)
