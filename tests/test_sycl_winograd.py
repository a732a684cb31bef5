"""Winograd F(2x2,3x3) and F(4x4,3x3) on the SYCL backend: accuracy bounds, agreement with the CPU
Winograd, both GEMM engines, batch chunking, dpnp in -> dpnp out.

Skipped only when dpctl / numba_dpex are not importable (the contract test covers the awkward
shapes). Each (tile size, dtype) compiles three transform kernels once per process (0.3-2 s
each), so the tests share a few dtypes and tile sizes.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import convlib
from convlib.core.problem import ConvProblem

from .conftest import random_arrays
from convlib.testing import conv2d_reference_for, relative_error

pytestmark = [
    pytest.mark.sycl,
    pytest.mark.skipif(
        importlib.util.find_spec("dpctl") is None or importlib.util.find_spec("numba_dpex") is None,
        reason="the sycl extra (dpctl, numba-dpex) is not installed",
    ),
]

#: The documented bounds (issue 5): relative Frobenius error vs the float64 reference.
BOUNDS = {("winograd2", "float32"): 1e-5, ("winograd4", "float32"): 1e-4,
          ("winograd2", "float64"): 1e-11, ("winograd4", "float64"): 1e-11}


@pytest.fixture(scope="module")
def mods():
    from convlib.sycl import runtime

    loaded = runtime.load()
    assert loaded.dpctl.get_devices(), "the sycl extra is installed but no SYCL device was found"
    return loaded


def conv(problem, x, w, b, algo, device="sycl"):
    return convlib.conv2d(x, w, b, stride=problem.stride, padding=problem.padding, dilation=problem.dilation,
                          groups=problem.groups, algo=algo, device=device)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("algo", ["winograd2", "winograd4"])
def test_accuracy_on_a_resnet_layer(mods, rng, algo, dtype):
    problem = ConvProblem(1, 64, 14, 14, 64, 3, 3, padding=(1, 1, 1, 1), dtype=dtype, has_bias=True)
    x, w, b = random_arrays(rng, problem)
    err = relative_error(np.asarray(conv(problem, x, w, b, algo)), conv2d_reference_for(problem, x, w, b))
    assert err <= BOUNDS[(algo, dtype)], f"{algo} {dtype}: relative error {err:.3e}"


@pytest.mark.parametrize("engine", ["onemkl", "kernel"])
@pytest.mark.parametrize("algo", ["winograd2", "winograd4"])
def test_agrees_with_cpu_winograd(mods, rng, algo, engine):
    from convlib.sycl.tables import KNOBS

    # Partial tiles at both edges, asymmetric padding, groups, bias.
    problem = ConvProblem(2, 8, 11, 13, 12, 3, 3, padding=(2, 0, 1, 3), groups=2, dtype="float32", has_bias=True)
    x, w, b = random_arrays(rng, problem)
    with KNOBS.override(im2col_gemm=engine):
        y_sycl = np.asarray(conv(problem, x, w, b, algo))
    y_cpu = conv(problem, x, w, b, algo, device="cpu")
    assert relative_error(y_sycl, y_cpu) <= 1e-5
    assert relative_error(y_sycl, conv2d_reference_for(problem, x, w, b)) <= BOUNDS[(algo, "float32")]


@pytest.mark.parametrize("algo", ["winograd2", "winograd4"])
def test_batch_chunks(mods, rng, algo):
    from convlib.sycl import winograd
    from convlib.sycl.tables import KNOBS

    problem = ConvProblem(5, 3, 9, 7, 4, 3, 3, padding=(1, 2, 0, 1), dtype="float32", has_bias=True)
    impl = winograd.F2 if algo == "winograd2" else winograd.F4
    # About two images per chunk: three chunks, the last one short.
    chunk_bytes = 2 * impl.workspace_bytes(problem, chunk_bytes=1) // problem.itemsize * problem.itemsize
    x, w, b = random_arrays(rng, problem)
    with KNOBS.override(winograd_chunk_bytes=chunk_bytes):
        assert 1 < impl.batch_chunk(problem) < problem.N
        y = np.asarray(conv(problem, x, w, b, algo))
    err = relative_error(y, conv2d_reference_for(problem, x, w, b))
    assert err <= BOUNDS[(algo, "float32")]


def test_workspace_is_bounded():
    from convlib.sycl import winograd
    from convlib.sycl.tables import KNOBS

    small = ConvProblem(1, 64, 56, 56, 64, 3, 3, padding=(1, 1, 1, 1))
    large = ConvProblem(1024, 64, 56, 56, 64, 3, 3, padding=(1, 1, 1, 1))
    assert winograd.F4.batch_chunk(large) < large.N
    assert winograd.F4.workspace_bytes(large) <= KNOBS.winograd_chunk_bytes + winograd.F4.workspace_bytes(small)


def test_dpnp_in_dpnp_out(mods, rng):
    dpnp = mods.dpnp
    problem = ConvProblem(1, 4, 10, 10, 6, 3, 3, padding=(1, 1, 1, 1), dtype="float32", has_bias=True)
    x, w, b = random_arrays(rng, problem)
    y = convlib.conv2d(dpnp.asarray(x), dpnp.asarray(w), dpnp.asarray(b), padding=1, algo="winograd")
    assert isinstance(y, dpnp.ndarray) and y.shape == problem.y_shape and y.dtype == np.float32
    assert relative_error(dpnp.asnumpy(y), conv2d_reference_for(problem, x, w, b)) <= 1e-4


def test_unsupported_shapes_say_why():
    from convlib.sycl import winograd

    for problem in (ConvProblem(1, 2, 8, 8, 2, 3, 3, stride=(2, 2)),
                    ConvProblem(1, 2, 8, 8, 2, 5, 5),
                    ConvProblem(1, 2, 8, 8, 2, 3, 3, dilation=(2, 1))):
        for impl in (winograd.F2, winograd.F4):
            reason = impl.supports(problem)
            assert reason and "3x3" in reason and "stride 1" in reason
    with pytest.raises(NotImplementedError):
        convlib.conv2d(np.ones((1, 2, 8, 8), np.float32), np.ones((2, 2, 3, 3), np.float32), stride=2,
                       algo="winograd", device="sycl")


def test_generated_transforms_use_working_dtype_constants():
    from convlib.sycl.winograd import render_input_transform, render_output_transform

    # F(2x2,3x3)'s B^T and A^T are all 0/+-1: additions only, no constant but the padding's
    # zero. F(4x4,3x3)'s constants are of the working dtype (a Python float would turn float32
    # code into float64).
    for render in (render_input_transform, render_output_transform):
        assert all(v == 0 for v in render(2, "float32")[1].values())
        for dtype in ("float32", "float64"):
            constants = render(4, dtype)[1]
            assert constants and all(type(v) is np.dtype(dtype).type for v in constants.values())
