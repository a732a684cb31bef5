"""Input layouts and kinds: every algorithm reads them right and never writes to them."""

from __future__ import annotations

import numpy as np
import pytest

import convlib
from convlib.core.problem import ConvProblem

from .conftest import all_pairs, device_for, groups_for
from convlib.testing import TOLERANCE, conv2d_reference, relative_error


def _arrays(rng, dtype="float32", groups=1):
    """5 filters of 4 channels; for a depthwise-only algorithm (``groups=4``), 4 of 1."""
    K = 5 if groups == 1 else 4
    x = rng.standard_normal((2, 4, 10, 9)).astype(dtype)
    w = rng.standard_normal((K, 4 // groups, 3, 3)).astype(dtype)
    b = rng.standard_normal(K).astype(dtype)
    return x, w, b


def _check(y, x, w, b, padding=1, groups=1):
    ref = conv2d_reference(x, w, b, padding=(padding,) * 4, groups=groups)
    assert relative_error(y, ref) <= TOLERANCE[y.dtype.name]


@pytest.mark.early
@pytest.mark.parametrize("backend, algo", all_pairs())
def test_inputs_unchanged_and_layouts(backend, algo, rng):
    device = device_for(backend)
    groups = groups_for(backend, algo, 4)
    x, w, b = _arrays(rng, groups=groups)
    K = w.shape[0]
    # Fortran order, a strided view, a transposed view and read-only arrays, all at once.
    x_f = np.asfortranarray(x)
    big = np.zeros((2, 8, 10, 18), np.float32)
    big[:, ::2, :, ::2] = x
    x_view = big[:, ::2, :, ::2]
    w_t = np.ascontiguousarray(w.transpose(2, 3, 0, 1)).transpose(2, 3, 0, 1)
    b_ro = b.copy()
    b_ro.flags.writeable = False
    for xin in (x_f, x_view):
        before = (xin.copy(), w_t.copy(), b_ro.copy())
        y = convlib.conv2d(xin, w_t, b_ro, padding=1, groups=groups, algo=algo, device=device)
        _check(y, x, w, b, groups=groups)
        np.testing.assert_array_equal(xin, before[0])
        np.testing.assert_array_equal(w_t, before[1])
        np.testing.assert_array_equal(b_ro, before[2])
    x_ro = x.copy()
    x_ro.flags.writeable = False
    y = convlib.conv2d(x_ro, w, b, padding=1, groups=groups, algo=algo, device=device)
    _check(y, x, w, b, groups=groups)
    assert y.shape[1] == K


def test_array_likes_become_numpy(rng):
    x, w, b = _arrays(rng, "float64")
    y = convlib.conv2d(x.tolist(), w.tolist(), b.tolist(), padding=1)
    assert isinstance(y, np.ndarray) and y.dtype == np.float64
    _check(y, x, w, b)


def test_result_is_a_new_array(rng):
    x, w, b = _arrays(rng)
    y1 = convlib.conv2d(x, w, b, padding=1, algo="direct")
    y2 = convlib.conv2d(x, w, b, padding=1, algo="direct")
    assert not np.shares_memory(y1, y2) and not np.shares_memory(y1, x)


def test_problem_sizes():
    p = ConvProblem(8, 64, 56, 56, 64, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, "float32", False)
    assert (p.P, p.Q) == (56, 56)
    assert (p.gemm_m, p.gemm_n, p.gemm_k) == (64, 8 * 56 * 56, 64 * 9)
    assert p.flops == 2 * 64 * 8 * 56 * 56 * 64 * 9
    assert p.bytes_moved == 4 * (8 * 64 * 56 * 56 * 2 + 64 * 64 * 9)
    s = ConvProblem(1, 3, 224, 224, 64, 7, 7, (2, 2), (3, 3, 3, 3), (1, 1), 1, "float64", True)
    assert (s.P, s.Q) == (112, 112) and s.itemsize == 8
    same = convlib.build_problem(np.zeros((1, 1, 9, 9)), np.zeros((1, 1, 4, 2)), padding="same", dilation=(1, 3))
    assert same.padding == (1, 2, 1, 2) and (same.P, same.Q) == (9, 9)
    with pytest.raises(ValueError, match="groups=3"):
        ConvProblem(1, 4, 8, 8, 6, 3, 3, groups=3)


def test_problem_is_a_hashable_value():
    a = ConvProblem(1, 4, 8, 8, 6, 3, 3)
    b = convlib.build_problem(np.zeros((1, 4, 8, 8), np.float32), np.zeros((6, 4, 3, 3), np.float32))
    assert a == b and hash(a) == hash(b)


def im2col_workspace(problem):
    from convlib.dispatch import registry

    return registry.implementation("conv2d", "cpu", "im2col").workspace_bytes(problem)


def test_workspace_cap_bounds_the_chunk(rng):
    x = rng.standard_normal((7, 3, 16, 16)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    p = convlib.build_problem(x, w)
    per_image = 3 * 9 * 14 * 14 * 4
    with convlib.option_context(workspace_cap=2 * per_image + 1):
        assert p.im2col_batch_chunk() == 2
        assert im2col_workspace(p) <= 2 * per_image + 1
        y = convlib.conv2d(x, w, algo="im2col")
    with convlib.option_context(workspace_cap=1):
        assert p.im2col_batch_chunk() == 1  # one image at least, never a failure
        y1 = convlib.conv2d(x, w, algo="im2col")
    ref = conv2d_reference(x, w)
    assert relative_error(y, ref) <= 1e-5 and relative_error(y1, ref) <= 1e-5


def test_large_batch_runs_in_bounded_memory(rng):
    """The seed thesis' im2col failed past N=56; chunking serves any batch."""
    x = rng.standard_normal((64, 1, 20, 20)).astype(np.float32)
    w = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
    with convlib.option_context(workspace_cap=10_000):
        y = convlib.conv2d(x, w, algo="im2col")
    assert relative_error(y, conv2d_reference(x, w)) <= 1e-5


@pytest.mark.parametrize("operation", ["conv2d", "conv2d_backward_data", "conv2d_backward_weight"])
def test_im2col_of_a_pointwise_layer_multiplies_the_image_where_it_lies(rng, monkeypatch, operation):
    """1x1, stride 1, no padding: the column matrix is the image, so none is built (no workspace,
    no fill); with groups, a bias, and against the reference."""
    from convlib.cpu import im2col
    from convlib.dispatch import registry
    from convlib.testing import (
        conv2d_backward_data_reference, conv2d_backward_weight_reference, conv2d_reference_for,
    )

    x = rng.standard_normal((3, 6, 5, 7)).astype(np.float32)
    w = rng.standard_normal((8, 3, 1, 1)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    p = convlib.build_problem(x, w, b, groups=2)
    assert p.columns_are_the_image
    assert not convlib.build_problem(x, w, b, groups=2, padding=(0, 1, 0, 0)).columns_are_the_image
    assert not convlib.build_problem(x, w, b, groups=2, stride=(1, 2)).columns_are_the_image
    impl = registry.implementation(operation, "cpu", "im2col")
    assert impl.workspace_bytes(p) == 0

    def no_fill(*args):
        raise AssertionError("a column matrix was built")

    monkeypatch.setattr(im2col, "fill_columns", no_fill)
    monkeypatch.setattr("convlib.cpu.im2col_backward.fill_columns", no_fill)
    monkeypatch.setattr("convlib.cpu.im2col_backward.fold_columns", no_fill)
    ref = conv2d_reference_for(p, x, w, b)
    if operation == "conv2d":
        y = convlib.conv2d(x, w, b, groups=2, algo="im2col")
        assert relative_error(y, ref) <= 1e-5
        return
    dy = rng.standard_normal(ref.shape).astype(np.float32)
    if operation == "conv2d_backward_data":
        got = convlib.conv2d_backward_data(dy, w, x.shape, groups=2, algo="im2col")
        want = conv2d_backward_data_reference(dy, w, x.shape, groups=2)
    else:
        got = convlib.conv2d_backward_weight(x, dy, w.shape, groups=2, algo="im2col")
        want = conv2d_backward_weight_reference(x, dy, w.shape, groups=2)
    assert relative_error(got, want) <= 1e-5
