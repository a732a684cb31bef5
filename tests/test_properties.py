"""Hypothesis: random small problems, every registered pair, against the reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import convlib
from convlib.dispatch import registry
from convlib.core.problem import ConvProblem

from .conftest import all_pairs, device_for
from convlib.testing import TOLERANCE, conv2d_reference_for, relative_error


@st.composite
def problems(draw):
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    C = groups * draw(st.integers(1, 3))
    K = groups * draw(st.integers(1, 4))
    R, S = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    pad = tuple(draw(st.integers(0, 2)) for _ in range(4))
    eff_h, eff_w = dil[0] * (R - 1) + 1, dil[1] * (S - 1) + 1
    H = draw(st.integers(max(1, eff_h - pad[0] - pad[1]), 12))
    W = draw(st.integers(max(1, eff_w - pad[2] - pad[3]), 12))
    N = draw(st.integers(1, 3))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    bias = draw(st.booleans())
    return ConvProblem(N, C, H, W, K, R, S, stride, pad, dil, groups, dtype, bias)


@pytest.mark.parametrize("backend, algo", all_pairs())
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=problems(), seed=st.integers(0, 2**32 - 1))
def test_random_problems(backend, algo, problem, seed):
    device = device_for(backend)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(problem.x_shape).astype(problem.dtype)
    w = rng.standard_normal(problem.w_shape).astype(problem.dtype)
    b = rng.standard_normal(problem.K).astype(problem.dtype) if problem.has_bias else None
    kwargs = dict(stride=problem.stride, padding=problem.padding, dilation=problem.dilation, groups=problem.groups)
    if registry.unsupported_reason("conv2d", backend, algo, problem) is not None:
        with pytest.raises(NotImplementedError):
            convlib.conv2d(x, w, b, algo=algo, device=device, **kwargs)
        return
    y = convlib.conv2d(x, w, b, algo=algo, device=device, **kwargs)
    assert y.shape == problem.y_shape
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE[problem.dtype]


@settings(max_examples=40, deadline=None)
@given(problem=problems())
def test_auto_always_serves(problem):
    x = np.ones(problem.x_shape, problem.dtype)
    w = np.ones(problem.w_shape, problem.dtype)
    choice = convlib.choose_algorithm(x, w, stride=problem.stride, padding=problem.padding,
                                      dilation=problem.dilation, groups=problem.groups)
    assert choice.algo in choice.candidates and choice.reason
