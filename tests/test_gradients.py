"""The backward passes and the transposed convolution against independent references.

Every registered (operation, backend, algorithm) of the three backward operations runs the
awkward shapes of the forward contract (:mod:`tests.test_contract`) in both dtypes and is
compared with the float64 definitions of :mod:`convlib.testing`; the adjoint identity
``<conv2d(x, w), dy> == <x, dx> == <w, dw>`` ties the three passes together without any other
library; PyTorch (``torch.nn.grad`` and ``F.conv_transpose2d`` in float64) checks the
definitions themselves when it is installed.
"""

from __future__ import annotations

import gc
import tracemalloc
from dataclasses import replace

import numpy as np
import pytest

import convlib
from convlib.core.problem import ConvProblem
from convlib.dispatch import registry
from convlib.testing import (
    TOLERANCE, backward_reference_for, conv2d_backward_data_reference, conv2d_backward_weight_reference,
    conv2d_reference, relative_error,
)

from .conftest import device_for
from .test_contract import CASES, make_case

BACKWARD_OPERATIONS = ("conv2d_backward_data", "conv2d_backward_weight", "conv2d_backward_bias")


def backward_entries():
    return [pytest.param(op, b, a, id=f"{op.removeprefix('conv2d_backward_')}-{b}-{a}")
            for op in BACKWARD_OPERATIONS for _, b, a in registry.entries(op)]


def geometry(problem):
    return dict(stride=problem.stride, padding=problem.padding, dilation=problem.dilation, groups=problem.groups)


def run_operation(op, backend, algo, problem, rng, with_bias=False):
    """The operation's inputs (random), convlib's result, and the float64 reference."""
    dt = problem.dtype
    x = rng.standard_normal(problem.x_shape).astype(dt)
    w = rng.standard_normal(problem.w_shape).astype(dt)
    dy = rng.standard_normal(problem.y_shape).astype(dt)
    originals = {id(a): a.copy() for a in (x, w, dy)}
    device = device_for(backend)
    kw = dict(algo=algo, device=device)
    if op == "conv2d_backward_data":
        if with_bias:  # conv_transpose2d: dy is its input, w its filters, and a bias of C
            bias = rng.standard_normal(problem.C).astype(dt)
            bwd = replace(problem, operation=op, has_bias=True)
            out = convlib.conv_transpose2d(dy, w, bias, stride=problem.stride, padding=problem.padding,
                                           dilation=problem.dilation, groups=problem.groups,
                                           output_padding=_output_padding(problem), **kw)
            ref = backward_reference_for(bwd, dy, w, bias)
        else:
            out = convlib.conv2d_backward_data(dy, w, problem.x_shape, **geometry(problem), **kw)
            ref = conv2d_backward_data_reference(dy, w, problem.x_shape, **geometry(problem))
    elif op == "conv2d_backward_weight":
        out = convlib.conv2d_backward_weight(x, dy, problem.w_shape, **geometry(problem), **kw)
        ref = conv2d_backward_weight_reference(x, dy, problem.w_shape, **geometry(problem))
    else:
        out = convlib.conv2d_backward_bias(dy, **kw)
        ref = dy.astype(np.float64).sum(axis=(0, 2, 3))
    for a in (x, w, dy):  # inputs are never modified
        np.testing.assert_array_equal(a, originals[id(a)])
    return out, ref


def _output_padding(problem):
    """The output_padding that makes conv_transpose2d's result the forward problem's x."""
    top, bottom, left, right = problem.padding
    sh, sw = problem.stride
    dh, dw = problem.dilation
    oh = problem.H - ((problem.P - 1) * sh - top - bottom + dh * (problem.R - 1) + 1)
    ow = problem.W - ((problem.Q - 1) * sw - left - right + dw * (problem.S - 1) + 1)
    return oh, ow


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("op, backend, algo", backward_entries())
def test_matches_reference(op, backend, algo, case, dtype, rng):
    problem = make_case(case, dtype)
    probe = replace(problem, operation=op, has_bias=False)
    reason = registry.unsupported_reason(op, backend, algo, probe)
    if reason is not None:
        with pytest.raises(NotImplementedError, match="Algorithms that can: "):
            run_operation(op, backend, algo, problem, rng)
        return
    out, ref = run_operation(op, backend, algo, problem, rng)
    out = np.asarray(out)
    assert out.shape == ref.shape and out.dtype == np.dtype(dtype)
    err = relative_error(out, ref)
    assert err <= TOLERANCE[dtype], f"{op} {backend}/{algo} {problem.describe()}: relative error {err:.3e}"


@pytest.mark.parametrize("case", ["3x3-pad1-bias", "RneS-stride-2x1-asympad", "dilation-1x3-stride3", "groups3",
                                  "stem-7x7-s2"])
@pytest.mark.parametrize("backend, algo", [pytest.param(b, a, id=f"{b}-{a}")
                                           for _, b, a in registry.entries("conv2d_backward_data")])
def test_conv_transpose2d_matches_reference(backend, algo, case, rng):
    problem = make_case(case, "float64")
    probe = replace(problem, operation="conv2d_backward_data")
    if registry.unsupported_reason("conv2d_backward_data", backend, algo, probe) is not None:
        pytest.skip(f"{algo} does not serve {case}")
    out, ref = run_operation("conv2d_backward_data", backend, algo, problem, rng, with_bias=True)
    assert relative_error(np.asarray(out), ref) <= TOLERANCE["float64"]


@pytest.mark.parametrize("case", list(CASES))
def test_adjoint_identity(case, rng):
    """``<conv2d(x, w), dy> == <x, dx> == <w, dw>``: the three passes are one linear map's
    three faces, checked with convlib alone (auto's choices) in float64."""
    problem = make_case(case, "float64")
    x = rng.standard_normal(problem.x_shape)
    w = rng.standard_normal(problem.w_shape)
    dy = rng.standard_normal(problem.y_shape)
    g = geometry(problem)
    y = convlib.conv2d(x, w, **g)
    dx = convlib.conv2d_backward_data(dy, w, problem.x_shape, **g)
    dw = convlib.conv2d_backward_weight(x, dy, problem.w_shape, **g)
    forward = np.vdot(y, dy)
    scale = np.linalg.norm(y) * np.linalg.norm(dy)
    assert abs(np.vdot(x, dx) - forward) <= 1e-12 * scale
    assert abs(np.vdot(w, dw) - forward) <= 1e-12 * scale


@pytest.mark.parametrize("case", ["3x3-pad1-bias", "RneS-stride-2x1-asympad", "dilation2", "groups3", "depthwise",
                                  "same-even-2x2", "stem-7x7-s2"])
def test_references_agree_with_pytorch(case, rng):
    """The float64 definitions of :mod:`convlib.testing` against ``torch.nn.grad`` and
    ``F.conv_transpose2d`` (padding given to PyTorch by ``F.pad`` where it is asymmetric)."""
    torch = pytest.importorskip("torch")
    problem = make_case(case, "float64")
    x = rng.standard_normal(problem.x_shape)
    w = rng.standard_normal(problem.w_shape)
    dy = rng.standard_normal(problem.y_shape)
    top, bottom, left, right = problem.padding
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(w, requires_grad=True)
    yt = torch.nn.functional.conv2d(torch.nn.functional.pad(xt, (left, right, top, bottom)), wt,
                                    stride=problem.stride, dilation=problem.dilation, groups=problem.groups)
    yt.backward(torch.tensor(dy))
    g = geometry(problem)
    np.testing.assert_allclose(conv2d_backward_data_reference(dy, w, problem.x_shape, **g), xt.grad.numpy(),
                               rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(conv2d_backward_weight_reference(x, dy, problem.w_shape, **g), wt.grad.numpy(),
                               rtol=1e-10, atol=1e-10)
    if top == bottom and left == right:
        np.testing.assert_allclose(
            convlib.conv2d_backward_data(dy, w, problem.x_shape, **g),
            torch.nn.grad.conv2d_input(problem.x_shape, wt.detach(), torch.tensor(dy), stride=problem.stride,
                                       padding=(top, left), dilation=problem.dilation, groups=problem.groups),
            rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(
            convlib.conv2d_backward_weight(x, dy, problem.w_shape, **g),
            torch.nn.grad.conv2d_weight(torch.tensor(x), problem.w_shape, torch.tensor(dy), stride=problem.stride,
                                        padding=(top, left), dilation=problem.dilation, groups=problem.groups),
            rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("stride, padding, output_padding, dilation, groups", [
    (2, 1, 1, 1, 1), ((1, 2), (0, 1), (0, 1), 1, 1), (1, 1, 1, 2, 1), (3, 0, 2, 1, 2), (2, "valid", 0, 1, 2),
    (1, "same", 0, (2, 1), 1),
])
def test_conv_transpose2d_matches_pytorch(stride, padding, output_padding, dilation, groups, rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((2, 4, 5, 6))
    w = rng.standard_normal((4, 6 // groups, 3, 2))
    b = rng.standard_normal(6)
    y = convlib.conv_transpose2d(x, w, b, stride=stride, padding=padding, output_padding=output_padding,
                                 dilation=dilation, groups=groups)
    if padding == "valid":
        padding = 0
    if padding == "same":
        padding = (2, 0)  # what 'same' is for this filter and dilation: (3-1)*2/2 rows, (2-1)/2 columns
        # PyTorch has no 'same' for transposed convolutions; ours crops as conv2d's 'same' pads:
        # the even-width filter's extra column comes off the right.
        t = torch.nn.functional.conv_transpose2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), stride=stride,
                                                 padding=padding, dilation=dilation, groups=groups).numpy()
        np.testing.assert_allclose(y, t[:, :, :, :y.shape[3]], rtol=1e-10, atol=1e-10)
        return
    t = torch.nn.functional.conv_transpose2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), stride=stride,
                                             padding=padding, output_padding=output_padding, dilation=dilation,
                                             groups=groups).numpy()
    assert y.shape == t.shape
    np.testing.assert_allclose(y, t, rtol=1e-10, atol=1e-10)


# -- results in the kind of the input, empty batches ------------------------------------------
def test_results_follow_the_input_kind():
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64)
    dy = torch.randn(2, 4, 4, 4, dtype=torch.float64)
    assert isinstance(convlib.conv2d_backward_data(dy, w, (2, 3, 6, 6)), torch.Tensor)
    assert isinstance(convlib.conv2d_backward_weight(x, dy, (4, 3, 3, 3)), torch.Tensor)
    assert isinstance(convlib.conv2d_backward_bias(dy), torch.Tensor)
    assert isinstance(convlib.conv_transpose2d(dy, w), torch.Tensor)
    assert isinstance(convlib.conv2d_backward_data(dy.numpy().tolist(), w.numpy(), (2, 3, 6, 6)), np.ndarray)


@pytest.mark.parametrize("op, backend, algo", backward_entries())
def test_empty_batch(op, backend, algo):
    device = device_for(backend)
    # A depthwise layer for the algorithm that serves only those, two filters of four channels else.
    groups = 4 if algo == "depthwise" else 1
    K = 4 if algo == "depthwise" else 2
    x = np.zeros((0, 4, 6, 6), np.float32)
    w = np.ones((K, 4 // groups, 3, 3), np.float32)
    dy = np.zeros((0, K, 4, 4), np.float32)
    if op == "conv2d_backward_data":
        out = convlib.conv2d_backward_data(dy, w, x.shape, groups=groups, algo=algo, device=device)
        assert out.shape == x.shape
    elif op == "conv2d_backward_weight":
        out = convlib.conv2d_backward_weight(x, dy, w.shape, groups=groups, algo=algo, device=device)
        np.testing.assert_array_equal(np.asarray(out), np.zeros(w.shape, np.float32))
    else:
        np.testing.assert_array_equal(np.asarray(convlib.conv2d_backward_bias(dy, algo=algo, device=device)),
                                      np.zeros(K, np.float32))


# -- errors --------------------------------------------------------------------------------
def f32(*shape):
    return np.zeros(shape, np.float32)


@pytest.mark.parametrize("call, error, match", [
    (lambda: convlib.conv2d_backward_data(f32(2, 4, 5, 5), f32(4, 3, 3, 3), (2, 3, 8, 8)), ValueError,
     r"dy has shape \(2, 4, 5, 5\).*\(2, 4, 6, 6\)"),
    (lambda: convlib.conv2d_backward_data(f32(2, 4, 6, 6), f32(4, 3, 3, 3), (2, 3, 8)), ValueError, "x_shape="),
    (lambda: convlib.conv2d_backward_data(f32(2, 4, 6, 6), f32(4, 3, 3, 3), "2,3,8,8"), TypeError, "x_shape="),
    (lambda: convlib.conv2d_backward_data(f32(2, 4, 6, 6), f32(4, 3, 3, 3), (2, 3.0, 8, 8)), TypeError, "x_shape="),
    (lambda: convlib.conv2d_backward_data(f32(2, 4, 6, 6), np.zeros((4, 3, 3, 3)), (2, 3, 8, 8)), TypeError,
     "dy has dtype float32 but w has dtype float64"),
    (lambda: convlib.conv2d_backward_data(f32(2, 4, 6, 6), f32(4, 2, 3, 3), (2, 3, 8, 8)), ValueError,
     "second dimension must be C/groups"),
    (lambda: convlib.conv2d_backward_data(None, f32(4, 3, 3, 3), (2, 3, 8, 8)), TypeError, "dy=None"),
    (lambda: convlib.conv2d_backward_data(f32(2, 4, 6, 6), f32(4, 3, 3, 3), (2, 3, 8, 8), stride=0), ValueError,
     "stride=0"),
    (lambda: convlib.conv2d_backward_data(f32(2, 4, 6, 6), f32(4, 3, 3, 3), (2, 3, 8, 8), algo="fft"), ValueError,
     "algo='fft'"),
    (lambda: convlib.conv2d_backward_weight(f32(2, 3, 8, 8), f32(2, 4, 6, 5), (4, 3, 3, 3)), ValueError,
     r"dy has shape \(2, 4, 6, 5\)"),
    (lambda: convlib.conv2d_backward_weight(f32(2, 3, 8, 8), f32(2, 4, 6, 6), (4, 3, 3)), ValueError, "w_shape="),
    (lambda: convlib.conv2d_backward_weight(f32(2, 3, 8, 8), np.zeros((2, 4, 6, 6)), (4, 3, 3, 3)), TypeError,
     "x has dtype float32 but dy has dtype float64"),
    (lambda: convlib.conv2d_backward_weight(f32(2, 3, 8, 8), f32(2, 4, 6, 6), (4, 3, 3, 3), groups=2), ValueError,
     "groups=2"),
    (lambda: convlib.conv2d_backward_weight(np.zeros((2, 3, 8, 8), np.int32), f32(2, 4, 6, 6), (4, 3, 3, 3)),
     TypeError, "x has dtype int32"),
    (lambda: convlib.conv2d_backward_bias(f32(2, 4, 6)), ValueError, "dy must be 4-D"),
    (lambda: convlib.conv2d_backward_bias(np.zeros((2, 4, 6, 6), np.float16)), TypeError, "dy has dtype float16"),
    (lambda: convlib.conv_transpose2d(f32(1, 4, 5, 5), f32(4, 2, 3, 3), stride=2, output_padding=2), ValueError,
     r"output_padding=2: .*smaller than the stride \(2\) or the dilation \(1\)"),
    (lambda: convlib.conv_transpose2d(f32(1, 4, 5, 5), f32(3, 2, 3, 3)), ValueError, "first dimension must be x's"),
    (lambda: convlib.conv_transpose2d(f32(1, 4, 5, 5), f32(4, 2, 3, 3), groups=3), ValueError, "groups=3"),
    (lambda: convlib.conv_transpose2d(f32(1, 4, 1, 1), f32(4, 2, 1, 1), padding=1), ValueError, "padding=1 is too large"),
    (lambda: convlib.conv_transpose2d(f32(1, 4, 5, 5), f32(4, 2, 3, 3), f32(4)), ValueError, r"bias has shape \(4,\)"),
    (lambda: convlib.conv_transpose2d(f32(1, 4, 5, 5), f32(4, 2, 3, 3), output_padding=-1), ValueError,
     "output_padding=-1"),
])
def test_invalid_arguments_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_algorithms_lists_each_operation():
    for op in BACKWARD_OPERATIONS:
        assert "direct" in convlib.algorithms("cpu", op=op)
    with pytest.raises(ValueError, match="op='conv3d'"):
        convlib.algorithms("cpu", op="conv3d")


def test_gradients_of_a_forward_convolution_by_finite_differences(rng):
    """A check of the calculus itself: the directional derivative of ``0.5*|conv2d(x, w)|^2``
    along random directions of x and w matches ``<dx, u>`` and ``<dw, v>`` (central differences
    in float64)."""
    x = rng.standard_normal((2, 3, 7, 6))
    w = rng.standard_normal((4, 3, 3, 2))
    kw = dict(stride=(2, 1), padding=(1, 0, 1, 1), dilation=(1, 2))

    def loss(x_, w_):
        return 0.5 * float(np.sum(conv2d_reference(x_, w_, **kw) ** 2))

    dy = conv2d_reference(x, w, **kw)
    dx = convlib.conv2d_backward_data(dy, w, x.shape, **kw)
    dw = convlib.conv2d_backward_weight(x, dy, w.shape, **kw)
    u, v, eps = rng.standard_normal(x.shape), rng.standard_normal(w.shape), 1e-6
    assert np.isclose((loss(x + eps * u, w) - loss(x - eps * u, w)) / (2 * eps), np.vdot(dx, u), rtol=1e-6)
    assert np.isclose((loss(x, w + eps * v) - loss(x, w - eps * v)) / (2 * eps), np.vdot(dw, v), rtol=1e-6)


# -- accuracy of long reductions, bounded workspace -------------------------------------------
@pytest.mark.parametrize("N, size", [(16, 128), (64, 64)])
@pytest.mark.parametrize("backend, algo", [pytest.param(b, a, id=f"{b}-{a}")
                                           for _, b, a in registry.entries("conv2d_backward_weight")])
def test_weight_gradient_of_a_large_batch_in_float32(backend, algo, N, size, rng):
    """Each ``dw`` element of N=16 128x128 images (or 64 of 64x64, where the CPU's direct pass sums
    wide rows in blocks of 1024 products: ``u*sqrt(1024/6)`` = 7.8e-7) sums M = 262144 products.

    With N(0, 1) inputs each product has variance 1, so ``|dw| ~ sqrt(M)``. A single float32
    running sum rounds its j-th addition by up to ``u*|s_j|`` (``u = eps/2 = 2**-24``) with
    ``|s_j| ~ sqrt(j)``: an error of ``~ u*M/sqrt(6)``, a relative error of ``u*sqrt(M/6)`` =
    1.2e-5 (8e-6 measured before the CPU direct pass summed by rows), past ``TOLERANCE``. Summed
    by blocks of B products (an output row, B = Q = 128) whose sums are then added accurately,
    the error is that of the blocks, ``u*sqrt(B/6)`` = 2.8e-7, plus the result's rounding. The
    bound ``4*u*sqrt(B)`` = 2.7e-6 is ten times what a blocked sum makes and three times below
    what the running sum makes; a BLAS or a GEMM's KC-blocked sum is inside it too.
    """
    device = device_for(backend)
    x = rng.standard_normal((N, 2, size, size)).astype(np.float32)
    dy = rng.standard_normal((N, 2, size, size)).astype(np.float32)
    w_shape = (2, 2, 3, 3)
    dw = np.asarray(convlib.conv2d_backward_weight(x, dy, w_shape, padding=1, algo=algo, device=device))
    ref = conv2d_backward_weight_reference(x, dy, w_shape, padding=(1, 1, 1, 1))
    u = np.finfo(np.float32).eps / 2
    assert relative_error(dw, ref) <= 4 * u * np.sqrt(128)


@pytest.mark.parametrize("filter_shape, groups", [((3, 3), 1), ((3, 3), 4), ((5, 5), 1), ((2, 3), 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_direct_weight_wide_rows_across_partly_filled_buffers(filter_shape, groups, dtype, monkeypatch, rng):
    """direct's wide weight pass holds a few images per buffer; with buffers of two images, five
    images make two full buffers and one holding a single image over the last's stale planes. The
    nine-tap pass (3x3) and the tap-by-tap one (other filters) against the float64 reference."""
    from convlib.core.problem import make_backward_weight_problem
    from convlib.cpu import direct_backward

    R, S = filter_shape
    x = rng.standard_normal((5, 4, 11, 13))
    problem = make_backward_weight_problem(x.shape, (5, 8, 11 + 2 - R + 1, 13 + 2 - S + 1), (8, 4 // groups, R, S),
                                           dtype, dtype, padding=1, groups=groups)
    dy = rng.standard_normal(problem.y_shape)
    wide = direct_backward._wide_rows(problem)
    monkeypatch.setattr(direct_backward, "WIDE_BUFFER_ELEMENTS", 2 * wide.L)
    assert direct_backward._sums_wide_rows(problem) and direct_backward._wide_rows(problem).chunk_images == 2
    dw = direct_backward.WEIGHT.run(problem, x.astype(dtype), dy.astype(dtype))
    ref = conv2d_backward_weight_reference(x, dy, problem.w_shape, padding=(1, 1, 1, 1), groups=groups)
    assert relative_error(dw, ref) <= TOLERANCE[np.dtype(dtype).name]


def _blis_cpu_operations():
    return [op for op in BACKWARD_OPERATIONS if ("cpu", "blis") in {(b, a) for _, b, a in registry.entries(op)}]


def _operation_inputs(op, problem, rng):
    """The arrays ``op``'s public function takes, and the function applied to them."""
    x = rng.standard_normal(problem.x_shape).astype(problem.dtype)
    w = rng.standard_normal(problem.w_shape).astype(problem.dtype)
    dy = rng.standard_normal(problem.y_shape).astype(problem.dtype)
    g = geometry(problem)
    if op == "conv2d_backward_data":
        return lambda **kw: convlib.conv2d_backward_data(dy, w, problem.x_shape, **g, **kw)
    if op == "conv2d_backward_weight":
        return lambda **kw: convlib.conv2d_backward_weight(x, dy, problem.w_shape, **g, **kw)
    return lambda **kw: convlib.conv2d_backward_bias(dy, **kw)


@pytest.mark.parametrize("op", _blis_cpu_operations())
def test_blis_workspace_does_not_grow_with_the_batch_or_the_image(op):
    """The packed panels are per thread and blocked by MC, KC, NC: once a problem fills them,
    more images or larger images need no more workspace (64 images of 512x512 no more than one,
    or than 64 of 8x8)."""
    impl = registry.implementation(op, "cpu", "blis")

    def workspace(N, H):
        problem = ConvProblem(N, 64, H, H, 64, 3, 3, padding=(1, 1, 1, 1), dtype="float32")
        return impl.workspace_bytes(replace(problem, operation=op))

    largest = workspace(64, 512)
    assert largest <= workspace(1, 512) and largest <= workspace(64, 8)
    assert workspace(1, 8) <= largest
    one_image_columns = 64 * 9 * 512 * 512 * 4
    assert largest < one_image_columns / 100


@pytest.mark.parametrize("op", _blis_cpu_operations())
def test_blis_allocates_no_more_than_its_workspace(op, rng):
    """Traced memory (numpy allocations) of one blis call whose column matrix would be 302 MB
    (8 images, 64 channels of 128x128, 3x3 taps): beyond the result, at most twice the
    workspace it reports plus 1 MiB of bookkeeping."""
    impl = registry.implementation(op, "cpu", "blis")
    problem = replace(ConvProblem(8, 64, 128, 128, 64, 3, 3, padding=(1, 1, 1, 1), dtype="float32"), operation=op)
    columns = problem.N * problem.C * problem.R * problem.S * problem.P * problem.Q * problem.itemsize
    call = _operation_inputs(op, problem, rng)
    workspace = impl.workspace_bytes(problem)
    assert workspace < columns / 100
    # Run once untraced: the compiler's own allocations would count otherwise, and which kernels a
    # call compiles depends on its shape (the weight pass's inner-product form serves only images of
    # >= 784 pixels), so a small warm-up problem can miss some (under pytest-xdist no earlier test in
    # the worker had compiled them: 42 MB traced).
    call(algo="blis")
    with convlib.option_context(output_cache_bytes=0):
        gc.collect()
        tracemalloc.start()
        try:
            out = call(algo="blis")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    result = np.asarray(out).nbytes
    assert peak >= result  # tracemalloc sees numpy's allocations on this numpy
    assert peak - result <= 2 * workspace + 2**20, (peak, result, workspace)


#: (split, partitions, problem) that put the taps form's threads on each of its splits; K = 130
#: leaves the last filter panel one vector wide, and 3 partitions split unevenly.
TAPS_SPLITS = [
    ("taps", 2, ConvProblem(2, 7, 9, 11, 20, 3, 3, padding=(1, 1, 1, 1))),
    ("taps", 3, ConvProblem(5, 4, 19, 23, 34, 3, 2, stride=(2, 3), padding=(2, 0, 1, 1), dilation=(1, 2),
                            groups=2)),
    ("filters", 1, ConvProblem(2, 5, 9, 10, 130, 3, 3, padding=(1, 2, 0, 1))),
    ("filters", 3, ConvProblem(1, 4, 8, 8, 400, 2, 3, stride=(2, 1))),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("split, partitions, shape", TAPS_SPLITS,
                         ids=[f"{s}-{n}-{i}" for i, (s, n, _) in enumerate(TAPS_SPLITS)])
def test_blis_weight_taps_form_thread_splits_match_reference(split, partitions, shape, dtype, rng):
    """The taps form with its threads on the filter panels or on the tap blocks, on uneven
    splits and a narrow last panel."""
    from convlib.cpu import blis_backward
    from convlib.cpu.tables import KNOBS

    problem = replace(shape, dtype=dtype)
    with KNOBS.override(blis_partitions=partitions, blis_weight_taps_pixels=24):
        assert blis_backward.taps_layout(problem, partitions).split_filters == (split == "filters")
        out, ref = run_operation("conv2d_backward_weight", "cpu", "blis", problem, rng)
    err = relative_error(np.asarray(out), ref)
    assert err <= TOLERANCE[dtype], f"{problem.describe()}: relative error {err:.3e}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [
    ConvProblem(2, 7, 9, 11, 40, 3, 3, padding=(1, 1, 1, 1)),
    ConvProblem(3, 2, 10, 8, 20, 5, 3, stride=(2, 1), padding=(2, 1, 0, 1)),
    ConvProblem(2, 6, 7, 9, 36, 3, 3, padding=(1, 1, 1, 1), groups=3),
], ids=["3x3", "2-channels-strided", "groups"])
def test_blis_weight_taps_form_with_the_avx2_tile_matches_reference(shape, dtype, rng):
    """The taps form with AVX2's register tile (3 rows, 4 vectors there; here on this host's
    vectors), its half-height tile for 1-2 channels and a narrower last filter panel."""
    from convlib.cpu.tables import KNOBS, BlisBlocking

    problem = replace(shape, dtype=dtype)
    tile = BlisBlocking(MC=96, KC=256, NC=512, MR=3, NR=32 if dtype == "float32" else 16)
    with KNOBS.override(blis_blocking=tile, blis_weight_taps_min_filters=1):
        out, ref = run_operation("conv2d_backward_weight", "cpu", "blis", problem, rng)
    err = relative_error(np.asarray(out), ref)
    assert err <= TOLERANCE[dtype], f"{problem.describe()}: relative error {err:.3e}"


#: Knob settings that force each form of the blis weight pass (see convlib.cpu.blis_backward).
WEIGHT_FORMS = {
    "taps": dict(blis_weight_taps_min_filters=1),
    "inner": dict(blis_weight_taps_min_filters=2**62, blis_weight_dot_min_pixels=0),
    "outer": dict(blis_weight_taps_min_filters=2**62, blis_weight_dot_min_pixels=2**62),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("form", list(WEIGHT_FORMS))
@pytest.mark.parametrize("case", list(CASES))
def test_blis_weight_forms_match_reference(case, form, dtype, rng):
    """Each form of the blis weight pass on every contract shape, forced by its knobs (the
    contract test above runs whichever the shape selects)."""
    from convlib.cpu import blis_backward
    from convlib.cpu.tables import KNOBS

    problem = make_case(case, dtype)
    with KNOBS.override(**WEIGHT_FORMS[form]):
        assert blis_backward.weight_form(problem) == form
        out, ref = run_operation("conv2d_backward_weight", "cpu", "blis", problem, rng)
    err = relative_error(np.asarray(out), ref)
    assert err <= TOLERANCE[dtype], f"{problem.describe()}: relative error {err:.3e}"


#: Stride 1 with Q == W: the data pass adds each tile row as one run per image (wrapped columns
#: zeroed in the tile). Small images so that one tile spans several images; asymmetric padding,
#: dilation, groups.
WHOLE_ROW_SHAPES = [
    ConvProblem(5, 4, 5, 5, 6, 3, 3, padding=(1, 1, 1, 1)),
    ConvProblem(3, 3, 6, 7, 8, 3, 3, padding=(0, 2, 1, 1)),
    ConvProblem(2, 4, 9, 8, 4, 3, 3, padding=(2, 2, 2, 2), dilation=(2, 2)),
    ConvProblem(4, 6, 4, 6, 6, 3, 5, padding=(1, 1, 3, 1), groups=2),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("partitions", [1, 3])
@pytest.mark.parametrize("shape", WHOLE_ROW_SHAPES, ids=["5x5-images", "asymmetric", "dilated", "groups"])
def test_blis_data_pass_whole_rows_match_reference(shape, partitions, dtype, rng):
    """The blis data pass's whole-row store, with and without a bias (conv_transpose2d), and a
    NaN in ``dy`` at the first and last output column: it reaches exactly the elements of ``dx``
    the definition sends it to, none in a neighbouring row."""
    from convlib.cpu.tables import KNOBS

    problem = replace(shape, dtype=dtype)
    assert problem.stride == (1, 1) and problem.Q == problem.W
    with KNOBS.override(blis_partitions=partitions):
        for with_bias in (False, True):
            out, ref = run_operation("conv2d_backward_data", "cpu", "blis", problem, rng, with_bias=with_bias)
            err = relative_error(np.asarray(out), ref)
            assert err <= TOLERANCE[dtype], f"{problem.describe()}: relative error {err:.3e}"
        dy = rng.standard_normal(problem.y_shape).astype(dtype)
        w = rng.standard_normal(problem.w_shape).astype(dtype)
        dy[1, 0, 1, 0] = np.nan
        dy[-1, -1, -1, problem.Q - 1] = np.nan
        out = convlib.conv2d_backward_data(dy, w, problem.x_shape, algo="blis", **geometry(problem))
    ref = conv2d_backward_data_reference(dy, w, problem.x_shape, **geometry(problem))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    finite = ~np.isnan(ref)
    assert relative_error(np.asarray(out)[finite], ref[finite]) <= TOLERANCE[dtype]
