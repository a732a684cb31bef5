"""Shared fixtures: which (backend, algorithm) pairs can run here, and on which device."""

from __future__ import annotations

import os

import numpy as np
import pytest

from convlib.dispatch import registry
from convlib.dispatch.devices import get_backend

# The suite checks the built-in and machine-derived knob values, whatever profile
# `python -m convlib.tune` left on this machine (tests/test_tune.py sets its own).
os.environ.setdefault("CONVLIB_PROFILE", "off")


def device_for(backend: str) -> str:
    """The ``device=`` string tests use for ``backend``; skips when the backend is not installed.

    Each backend's own test module decides when absence is a failure (e.g. the SYCL tests fail
    when the ``sycl`` extra is installed but no device is found); here it is a skip.
    """
    if backend == "cpu":
        return "cpu"
    try:
        reason = get_backend(backend).unavailable_reason()
    except ImportError as exc:  # the backend module itself cannot import
        reason = str(exc)
    if reason is not None:
        pytest.skip(f"{backend} backend unavailable: {reason}")
    return get_backend(backend).device_names()[0]


def random_arrays(rng, problem, *, with_bias=None):
    """x, w, bias drawn from N(0, 1) for ``problem`` (bias per ``problem.has_bias``)."""
    dt = problem.dtype
    x = rng.standard_normal(problem.x_shape).astype(dt)
    w = rng.standard_normal(problem.w_shape).astype(dt)
    has_bias = problem.has_bias if with_bias is None else with_bias
    b = rng.standard_normal(problem.K).astype(dt) if has_bias else None
    return x, w, b


def groups_for(backend: str, algo: str, C: int) -> int:
    """1, or ``C`` for an algorithm that serves only depthwise convolutions: tests that run every
    pair on an ordinary problem run such an algorithm on the problem's depthwise form."""
    from convlib.core.problem import ConvProblem

    probe = ConvProblem(1, C, 8, 8, C, 3, 3, padding=(1, 1, 1, 1))
    return 1 if registry.unsupported_reason("conv2d", backend, algo, probe) is None else C


def all_pairs():
    """Every registered ``(backend, algorithm)`` of conv2d, each implementation once (``winograd``
    and ``winograd4`` are one object: only the first name is tested)."""
    return [pytest.param(b, a, id=f"{b}-{a}") for b in registry.BACKENDS
            for a in registry.distinct_algorithm_names(b)]


@pytest.fixture
def rng():
    return np.random.default_rng(20261121)


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true",
                     help="also run the tests marked slow (minutes and gigabytes each)")


def pytest_collection_modifyitems(config, items):
    # Tests marked early (minutes of cold numba compilation) go first: pytest-xdist hands tests out
    # in this order, so they run beside the rest instead of after it on one worker.
    items.sort(key=lambda item: "early" not in item.keywords)
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="slow (minutes, gigabytes): run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
