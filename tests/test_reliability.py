"""Reliability: bounded memory for any problem, non-finite inputs, result kinds, faults, threads.

Every registered (backend, algorithm) pair is held to the definition on inputs holding ``inf``
and ``NaN``; memory is measured, not assumed (tracemalloc here, the process's peak resident set in
the slow test); failures mid-call are forced and the library checked afterwards.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import tracemalloc
from dataclasses import replace

import numpy as np
import pytest

import convlib
from convlib.core import output_cache
from convlib.core.host_memory import available_memory_bytes
from convlib.cpu.tables import KNOBS
from convlib.dispatch import registry
from convlib.testing import (
    TOLERANCE,
    backward_reference_for,
    conv2d_reference,
    conv2d_reference_for,
    conv2d_reference_nonfinite,
    relative_error,
)

from .conftest import all_pairs, device_for


# -- bounded memory --------------------------------------------------------------------------------
@pytest.mark.parametrize("algo, stride, padding, knobs", [
    ("im2col", 1, 1, {}), ("im2col", 2, (2, 0, 1, 3), {}), ("direct", 1, 1, {}), ("direct", (2, 1), 0, {}),
    ("blis", 1, 1, {}), ("winograd", 1, 1, {}),
    # A 16-core machine: blis's partitions, each with its panels, are no more than a piece's tiles.
    ("blis", 1, 1, {"blis_partitions": 16}),
], ids=lambda v: "16-partitions" if v == {"blis_partitions": 16} else None)
def test_one_image_runs_under_the_workspace_cap(rng, algo, stride, padding, knobs):
    """One image whose column matrix is over 10x the cap: peak memory growth (numpy allocations) stays
    under the output plus the cap plus a small constant, and the answer is right."""
    x = rng.standard_normal((1, 4, 300, 310)).astype(np.float32)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    problem = convlib.build_problem(x, w, b, stride=stride, padding=padding)
    cap = 256 * 2**10
    columns = problem.C * problem.R * problem.S * problem.P * problem.Q * problem.itemsize
    assert columns > 10 * cap
    output = problem.N * problem.K * problem.P * problem.Q * problem.itemsize
    with convlib.option_context(workspace_cap=cap), KNOBS.override(**knobs):
        # Once outside the count: compilation and first-call bookkeeping are not workspace.
        convlib.conv2d(x, w, b, stride=stride, padding=padding, algo=algo)
        gc.collect()
        tracemalloc.start()
        try:
            y = convlib.conv2d(x, w, b, stride=stride, padding=padding, algo=algo)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak <= output + cap + 256 * 2**10, f"{algo}: peak {peak} > output {output} + cap {cap}"
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE["float32"]


@pytest.mark.parametrize("backend, algo", all_pairs())
def test_pieces_of_every_shape_give_the_same_answer(backend, algo, rng):
    """Tiny caps cut problems into groups of images, bands of rows and bands that read only
    padding (with a NaN weight, whose 0 * NaN the definition keeps)."""
    device = device_for(backend)
    cases = [
        dict(x=(3, 5, 17, 13), w=(6, 5, 3, 3), stride=1, padding=1, dilation=1),
        dict(x=(2, 4, 15, 11), w=(4, 2, 3, 2), stride=(2, 1), padding=(3, 0, 1, 2), dilation=(1, 2), groups=2),
        dict(x=(2, 2, 4, 5), w=(3, 2, 3, 3), stride=1, padding=(6, 5, 1, 1), dilation=1),
        # Depthwise (every algorithm of the CPU serves it; the depthwise one serves only it).
        dict(x=(2, 3, 16, 9), w=(6, 1, 3, 3), stride=1, padding=1, dilation=1, groups=3),
    ]
    for case in cases:
        shape_x, shape_w = case.pop("x"), case.pop("w")
        x = rng.standard_normal(shape_x).astype(np.float64)
        w = rng.standard_normal(shape_w).astype(np.float64)
        b = rng.standard_normal(shape_w[0]).astype(np.float64)
        problem = convlib.build_problem(x, w, b, **case)
        if registry.unsupported_reason("conv2d", backend, algo, problem) is not None:
            continue
        ref = conv2d_reference_for(problem, x, w, b)
        for cap in (1, 2000, 30000):
            with convlib.option_context(workspace_cap=cap):
                y = np.asarray(convlib.conv2d(x, w, b, algo=algo, device=device, **case))
            assert relative_error(y, ref) <= TOLERANCE["float64"], (case, cap)
        if case["padding"] == (6, 5, 1, 1):  # the first rows of output read only padding
            w_nan = w.copy()
            w_nan[1, 0, 0, 0] = np.nan
            with convlib.option_context(workspace_cap=1):
                y = np.asarray(convlib.conv2d(x, w_nan, b, algo=algo, device=device, **case))
            assert np.isnan(y[:, 1]).all() and np.isfinite(np.delete(y, 1, axis=1)).all()


def test_pieces_are_what_the_cap_allows():
    from convlib.core.problem import ConvProblem
    from convlib.dispatch.pieces import conv2d_pieces

    problem = ConvProblem(4, 2, 30, 20, 3, 3, 3, padding=(1, 1, 1, 1))
    per_image = 2 * 9 * 30 * 20 * 4

    def columns(p):
        return p.N * p.C * p.R * p.S * p.P * p.Q * p.itemsize

    assert conv2d_pieces(problem, columns, 4 * per_image) is None
    groups = conv2d_pieces(problem, columns, 2 * per_image + 2 * 3 * 30 * 20 * 4)
    assert [(p.n0, p.n1, p.p0, p.p1, p.banded) for p in groups] == [(0, 2, 0, 30, False), (2, 4, 0, 30, False)]
    bands = conv2d_pieces(problem, columns, per_image // 3)
    assert all(p.banded and p.n1 - p.n0 == 1 for p in bands)
    covered = {(p.n0, row) for p in bands for row in range(p.p0, p.p1)}
    assert covered == {(n, row) for n in range(4) for row in range(30)} and len(covered) == sum(
        p.p1 - p.p0 for p in bands)


@pytest.mark.parametrize("device", ["cpu", "sycl"])
def test_a_result_too_large_is_a_memory_error_before_any_work(device):
    if device != "cpu":
        device = device_for(device)
    x = np.ones((8, 4, 8, 8), np.float32)
    w = np.ones((4, 4, 3, 3), np.float32)
    with pytest.raises(MemoryError, match=r"shape \(8, 4, 2000006, 2000006\) float32, needs 465\.7 TiB"):
        convlib.conv2d(x, w, padding=10**6, device=device)


@pytest.mark.slow
def test_several_gib_of_columns_in_bounded_resident_memory(tmp_path):
    """The process's peak resident memory while im2col convolves one 16000^2 image (a 9.2 GB
    column matrix): at most the output plus the cap plus 300 MB."""
    script = textwrap.dedent("""
        import resource, numpy as np, convlib
        x = np.ones((1, 1, 16000, 16000), np.float32)
        w = np.full((1, 1, 3, 3), 0.5, np.float32)
        small = convlib.conv2d(x[:, :, :20, :20], w, algo="im2col")   # compile first
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        y = convlib.conv2d(x, w, algo="im2col")
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        assert float(y[0, 0, 0, 0]) == 4.5 and float(y[0, 0, -1, -1]) == 4.5
        print(after - before, y.nbytes, convlib.options.workspace_cap)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "CONVLIB_OUTPUT_CACHE_MB": "0"})
    assert out.returncode == 0, out.stderr
    growth, output, cap = map(int, out.stdout.split())
    assert growth <= output + cap + 300 * 2**20, (growth, output, cap)


@pytest.mark.slow
@pytest.mark.skipif((available_memory_bytes() or 0) < 20 * 2**30, reason="needs ~20 GB of free memory")
@pytest.mark.parametrize("algo, stride", [("direct", 2), ("im2col", 2), ("blis", 2), ("winograd", 1)])
def test_tensors_past_two_to_the_31_elements(algo, stride):
    """A 46400^2 single-channel image (2.15e9 elements, past int32 indexing): the outputs at both
    ends of the result are right."""
    n = 46400
    x = np.empty((1, 1, n, n), np.float32)
    x[...] = 1.0
    x[0, 0, -3:, -3:] = np.arange(9, dtype=np.float32).reshape(3, 3)
    x[0, 0, :3, :3] = 2.0
    w = np.arange(1, 10, dtype=np.float32).reshape(1, 1, 3, 3)
    y = convlib.conv2d(x, w, stride=stride, algo=algo)
    assert x.size > 2**31 and (y.size > 2**31 or stride == 2)
    last_h, last_w = (y.shape[2] - 1) * stride, (y.shape[3] - 1) * stride
    for window, out in ((x[0, 0, :3, :3], y[0, 0, 0, 0]),
                        (x[0, 0, last_h:last_h + 3, last_w:last_w + 3], y[0, 0, -1, -1])):
        assert np.isclose(float(out), float((window * w[0, 0]).sum()), rtol=1e-5)
    assert np.isclose(float(y[0, 0, y.shape[2] // 2, y.shape[3] // 2]), 45.0, rtol=1e-5)


# -- non-finite inputs -----------------------------------------------------------------------------
NONFINITE_CASES = {
    "3x3-pad1": dict(x=(2, 6, 14, 13), w=(8, 6, 3, 3), stride=1, padding=1, dilation=1, groups=1),
    "stride2-dil-groups": dict(x=(2, 4, 13, 15), w=(6, 2, 3, 2), stride=(2, 1), padding=(1, 2, 0, 1),
                               dilation=(1, 2), groups=2),
    # Depthwise at stride 1, output the image's size: the depthwise algorithm reads neighbouring
    # planes in place and must select their inf/NaN away.
    "depthwise-same": dict(x=(2, 6, 14, 13), w=(12, 1, 3, 3), stride=1, padding=1, dilation=1, groups=6),
    # One filter per channel: the data pass's rotated problem is depthwise again, which the depthwise
    # algorithm's data pass runs on the forward kernels (a non-finite w meets its padding).
    "depthwise-one-filter": dict(x=(2, 6, 14, 13), w=(6, 1, 3, 3), stride=1, padding=1, dilation=1, groups=6),
}


def _plant(x, rng):
    """inf, -inf and NaN at corners, edges and interiors of several images and channels."""
    N, C, H, W = x.shape
    spots = [(0, 0), (H - 1, W - 1), (0, W // 2), (H // 2, 0), (H - 1, 3), (H // 2, W // 2), (3, W - 1)]
    values = [np.inf, -np.inf, np.nan]
    for i, (h, col) in enumerate(spots):
        x[i % N, (3 * i) % C, h, col] = values[i % 3]
    x[1 % N, C - 1, H // 2 + 1, W // 2 - 2] = np.inf  # an inf and a -inf meeting in some windows
    x[1 % N, C - 1, H // 2 + 2, W // 2 - 2] = -np.inf
    return x


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", list(NONFINITE_CASES))
@pytest.mark.parametrize("backend, algo", all_pairs())
def test_non_finite_inputs_follow_the_definition(backend, algo, case, dtype, rng):
    """An output is non-finite exactly where the definition's is -- NaN where it is NaN, inf of the
    same sign where it is inf -- and every other output equals the finite computation."""
    spec = dict(NONFINITE_CASES[case])
    shape_x, shape_w = spec.pop("x"), spec.pop("w")
    x = _plant(rng.standard_normal(shape_x), rng).astype(dtype)
    w = rng.uniform(0.5, 1.5, shape_w) * rng.choice([-1.0, 1.0], shape_w)
    w = w.astype(dtype)
    b = rng.standard_normal(shape_w[0]).astype(dtype)
    problem = convlib.build_problem(x, w, b, **spec)
    if registry.unsupported_reason("conv2d", backend, algo, problem) is not None:
        pytest.skip(f"{algo} does not serve {case}")
    expected = conv2d_reference_nonfinite(x, w, b, stride=problem.stride, padding=problem.padding,
                                          dilation=problem.dilation, groups=problem.groups)
    y = np.asarray(convlib.conv2d(x, w, b, algo=algo, device=device_for(backend), **spec))
    assert np.isnan(expected).any() and np.isposinf(expected).any() and np.isneginf(expected).any()
    assert_follows_definition(y, expected, dtype)


def assert_follows_definition(out, expected, dtype):
    """NaN, +inf and -inf exactly where ``expected`` has them; the finite values within ten
    times the dtype's tolerance."""
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    np.testing.assert_array_equal(np.isposinf(out), np.isposinf(expected))
    np.testing.assert_array_equal(np.isneginf(out), np.isneginf(expected))
    finite = np.isfinite(expected)
    assert relative_error(out[finite], expected[finite]) <= 10 * TOLERANCE[dtype]


# Each backward pass with inf/NaN in each of its inputs, under every registered algorithm.
BACKWARD_PLANTS = {"conv2d_backward_data": ("dy", "w"), "conv2d_backward_weight": ("x", "dy"),
                   "conv2d_backward_bias": ("dy",)}
BACKWARD_NONFINITE = [pytest.param(op, planted, b, a, id=f"{op.removeprefix('conv2d_backward_')}-{planted}-{b}-{a}")
                      for op, plants in BACKWARD_PLANTS.items() for planted in plants
                      for _, b, a in registry.entries(op)]


def _plant_sparse(a):
    """+inf, -inf and NaN in three channels (a corner, an interior, the opposite corner), so
    that the other channels' results stay finite; a corner's value is read through the padding
    taps of the weight pass."""
    N, Ch, H, W = a.shape
    a[0, 0, H // 2, W // 2] = np.inf
    a[N - 1, 1 % Ch, 0, 0] = -np.inf
    a[0, 2 % Ch, H - 1, W - 1] = np.nan
    return a


def _backward_nonfinite_case(op, planted, case, dtype, rng):
    """The problem, the arguments of ``op``'s public function, and the arrays its reference takes."""
    spec = dict(NONFINITE_CASES[case])
    shape_x, shape_w = spec.pop("x"), spec.pop("w")
    x = rng.standard_normal(shape_x)
    w = rng.uniform(0.5, 1.5, shape_w) * rng.choice([-1.0, 1.0], shape_w)
    problem = replace(convlib.build_problem(x, w, **spec), operation=op)
    dy = rng.standard_normal(problem.y_shape)
    arrays = {"x": x, "w": w, "dy": dy}
    for name, a in arrays.items():
        if name == planted:
            _plant_sparse(a)
        elif a.ndim == 4:
            # Exact zeros beside the planted values: 0 * inf is NaN by IEEE, and a kernel
            # that skips zero operands would hide it.
            a[0, 0, 0, 0] = a[0, 0, a.shape[2] // 2, a.shape[3] // 2] = 0.0
    x, w, dy = (arrays[k].astype(dtype) for k in ("x", "w", "dy"))
    inputs = {"conv2d_backward_data": (dy, w), "conv2d_backward_weight": (x, dy),
              "conv2d_backward_bias": (dy,)}[op]
    return problem, spec, inputs


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", list(NONFINITE_CASES))
@pytest.mark.parametrize("op, planted, backend, algo", BACKWARD_NONFINITE)
def test_backward_non_finite_inputs_follow_the_definition(op, planted, backend, algo, case, dtype, rng):
    """The backward passes with inf/NaN in one input: non-finite exactly where the float64
    definition (:func:`convlib.testing.backward_reference_for`) is, with the same sign, and every
    other value equal to the finite computation.

    The definitions are those of the forward pass, whose zero padding is a value that is
    multiplied (the forward keeps a NaN weight's ``0 * NaN`` where a tap reads only padding,
    ``test_pieces_of_every_shape_give_the_same_answer``). So ``dw[k, c, r, s]`` sums
    ``dy * x_padded`` over every output pixel, and an inf of ``dy`` at a pixel whose tap ``(r, s)``
    reads padding gives ``0 * inf = NaN`` there, as the reference's ``np.pad`` does. ``dx`` has no
    padding to multiply: it is the forward's adjoint, each ``dy * w`` product landing on the input
    pixel that the forward read (those landing on padding are dropped), so an input pixel that no
    output read is 0 even beside an infinite filter tap. Which results are NaN or inf does not
    depend on the order of a sum (NaN when a term is, or when +inf and -inf meet, else the
    infinities' sign) and N(0, 1) values cannot overflow float32, so the float64 reference gives
    the pattern of every algorithm.
    """
    problem, spec, inputs = _backward_nonfinite_case(op, planted, case, dtype, rng)
    if registry.unsupported_reason(op, backend, algo, problem) is not None:
        pytest.skip(f"{algo} does not serve {case}")
    expected = backward_reference_for(problem, *inputs)
    kw = dict(algo=algo, device=device_for(backend))
    if op == "conv2d_backward_data":
        out = convlib.conv2d_backward_data(*inputs, problem.x_shape, **spec, **kw)
    elif op == "conv2d_backward_weight":
        out = convlib.conv2d_backward_weight(*inputs, problem.w_shape, **spec, **kw)
    else:
        out = convlib.conv2d_backward_bias(*inputs, **kw)
    out = np.asarray(out)
    assert np.isnan(expected).any() and np.isinf(expected).any() and np.isfinite(expected).any()
    assert_follows_definition(out, expected, dtype)
    finite = np.isfinite(expected)
    assert np.allclose(out, expected, rtol=10 * TOLERANCE[dtype],
                       atol=10 * TOLERANCE[dtype] * float(np.abs(expected[finite]).max()), equal_nan=True)


# -- result kinds ----------------------------------------------------------------------------------
@pytest.mark.parametrize("device", ["cpu", "sycl"])
def test_torch_cpu_tensors_in_torch_tensors_out(device, rng):
    torch = pytest.importorskip("torch")
    if device != "cpu":
        device = device_for(device)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(2, 3, 9, 8, dtype=dtype)
        w = torch.randn(4, 3, 3, 3, dtype=dtype)
        b = torch.randn(4, dtype=dtype)
        for xin in (x, x.clone().requires_grad_(True), x.transpose(2, 3).contiguous().transpose(2, 3)):
            before = xin.detach().clone()
            y = convlib.conv2d(xin, w, b, padding=1, device=device)
            assert isinstance(y, torch.Tensor) and y.dtype == dtype and y.device.type == "cpu"
            ref = torch.nn.functional.conv2d(xin.detach().double(), w.double(), b.double(), padding=1)
            assert relative_error(y.numpy(), ref.numpy()) <= TOLERANCE[str(dtype).split(".")[1]]
            assert torch.equal(xin.detach(), before)


def test_other_host_array_likes_give_numpy():
    y = convlib.conv2d([[[[1.0, 2.0], [3.0, 4.0]]]], [[[[1.0]]]])
    assert isinstance(y, np.ndarray) and y.dtype == np.float64
    np.testing.assert_array_equal(y[0, 0], [[1.0, 2.0], [3.0, 4.0]])


# -- faults and threads ----------------------------------------------------------------------------
@pytest.mark.parametrize("algo, where", [("blis", "convlib.cpu.blis.allocate_workspace"),
                                         ("direct", "convlib.cpu.direct.pack_weights"),
                                         ("winograd", "convlib.cpu.winograd._workspace")])
def test_a_failure_mid_call_leaves_nothing_behind(algo, where, rng, monkeypatch, tmp_path):
    """A MemoryError forced inside an implementation reaches the caller; afterwards the output
    cache hands out no memory a live result uses, the tuning cache holds nothing of it, and the
    same call is right."""
    from convlib.dispatch import tuning

    monkeypatch.setenv("CONVLIB_CACHE_DIR", str(tmp_path))
    tuning.forget_measurements()
    x = rng.standard_normal((2, 16, 40, 40)).astype(np.float32)
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    ref = conv2d_reference(x, w, padding=(1, 1, 1, 1))
    with convlib.option_context(output_cache_bytes=64 * 2**20):
        monkeypatch.setattr(output_cache, "MIN_BYTES", 1)
        output_cache.clear()
        live = convlib.conv2d(x, w, padding=1, algo=algo)
        module, _, name = where.rpartition(".")

        def fail(*args, **kwargs):
            raise MemoryError("forced by the test")

        with monkeypatch.context() as patch:
            patch.setattr(f"{module}.{name}", fail)
            with pytest.raises(MemoryError, match="forced"):
                convlib.conv2d(x, w, padding=1, algo=algo)
            choice = convlib.choose_algorithm(x, w, padding=1, measure=True, repeats=1)
            assert algo not in choice.timings and choice.algo != algo
        gc.collect()
        after = convlib.conv2d(x, w, padding=1, algo=algo)
        assert not np.shares_memory(after, live)
        for y in (live, after):
            assert relative_error(y, ref) <= TOLERANCE["float32"]
        assert tuning.remembered()[next(iter(tuning.remembered()))]["algo"] != algo
    output_cache.clear()
    tuning.forget_measurements()


def test_concurrent_calls_from_eight_threads(rng):
    problems = []
    for i in range(8):
        algo = ("direct", "im2col", "blis", "winograd", "auto")[i % 5]
        x = rng.standard_normal((1 + i % 3, 8, 12 + i, 10 + 2 * i)).astype(np.float32)
        w = rng.standard_normal((4 + 4 * (i % 2), 8, 3, 3)).astype(np.float32)
        problems.append((algo, x, w, conv2d_reference(x, w, padding=(1, 1, 1, 1))))
    errors = []
    start = threading.Barrier(8)

    def work(algo, x, w, ref):
        start.wait()
        for _ in range(5):
            y = convlib.conv2d(x, w, padding=1, algo=algo)
            if relative_error(y, ref) > TOLERANCE["float32"]:
                errors.append(algo)

    threads = [threading.Thread(target=work, args=p) for p in problems]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
