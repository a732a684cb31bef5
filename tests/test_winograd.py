"""Winograd F(2x2,3x3) and F(4x4,3x3): the transform matrices, the CPU kernels, the accuracy bounds.

The accuracy bounds enforced here are the ones documented in ``docs/algorithms.md`` (Winograd section) (relative
Frobenius error against the float64 reference).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from scipy import signal

from convlib.core.problem import ConvProblem
from convlib.core.winograd_math import toom_cook_matrices, transform_matrices, winograd_correlate_tile

from convlib.testing import conv2d_reference_for, relative_error

cpu_winograd = pytest.importorskip("convlib.cpu.winograd")
cpu_winograd_transforms = pytest.importorskip("convlib.cpu.winograd_transforms")
KNOBS = pytest.importorskip("convlib.cpu.tables").KNOBS

#: Documented bounds (docs/algorithms.md, Winograd section): float32 on N(0, 1) data, and float64.
BOUND_FLOAT32 = {2: 1e-5, 4: 1e-4}
BOUND_FLOAT64 = 1e-11
#: float32 on log-uniform magnitudes 1e-3..1e3 with random signs (measured: see the Winograd section of docs/algorithms.md).
BOUND_FLOAT32_WIDE_RANGE = {2: 1e-5, 4: 1e-4}

ALGOS = [pytest.param(cpu_winograd.F2, id="F2"), pytest.param(cpu_winograd.F4, id="F4")]


# -- the matrices ------------------------------------------------------------------------------
LAVIN_GRAY = {
    2: dict(
        BT=[[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
        G=[[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]],
        AT=[[1, 1, 1, 0], [0, 1, -1, -1]],
    ),
    4: dict(
        BT=[[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
            [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]],
        G=[[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
           [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]],
        AT=[[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
    ),
}


@pytest.mark.parametrize("m", [2, 4])
def test_matrices_are_lavin_and_grays(m):
    t = transform_matrices(m)
    for name, expected in LAVIN_GRAY[m].items():
        np.testing.assert_allclose(getattr(t, name), expected, rtol=0, atol=1e-15, err_msg=name)


@pytest.mark.parametrize("m, points", [(2, (0, 1, -1)), (4, (0, 1, -1, 2, -2)), (3, (0, 1, -1, 2))])
def test_toom_cook_identity_is_exact(m, points):
    AT, G, BT = toom_cook_matrices(m, points)
    alpha = m + 2
    for i in range(m):
        for k in range(3):
            for l in range(alpha):
                total = sum(AT[i][j] * G[j][k] * BT[j][l] for j in range(alpha))
                assert total == Fraction(int(l == i + k))


def test_repeated_points_are_refused():
    with pytest.raises(ValueError, match="distinct"):
        toom_cook_matrices(2, (0, 1, 1))


@pytest.mark.parametrize("m", [2, 4])
def test_one_tile_matches_correlation(m, rng):
    d = rng.standard_normal((m + 2, m + 2))
    g = rng.standard_normal((3, 3))
    np.testing.assert_allclose(winograd_correlate_tile(d, g, m), signal.correlate(d, g, "valid"), atol=1e-13)


@pytest.mark.parametrize("m", [2, 4])
def test_hand_written_1d_transforms_match_the_matrices(m):
    t = transform_matrices(m)
    mod = cpu_winograd_transforms
    input_1d, output_1d, filter_1d = (
        (mod._input_1d_f2, mod._output_1d_f2, mod._filter_1d_f2) if m == 2
        else (mod._input_1d_f4, mod._output_1d_f4, mod._filter_1d_f4)
    )
    for fn, matrix in ((input_1d, t.BT), (output_1d, t.AT), (filter_1d, t.G)):
        columns = [np.array(fn(tuple(np.eye(matrix.shape[1])[j]))) for j in range(matrix.shape[1])]
        np.testing.assert_allclose(np.stack(columns, axis=1), matrix, rtol=1e-15, atol=1e-15)


# -- the CPU kernels ---------------------------------------------------------------------------
def _arrays(rng, problem, scale=None):
    dt = problem.dtype
    x = rng.standard_normal(problem.x_shape)
    if scale == "wide":
        # Magnitudes log-uniform over 1e-3..1e3 with random signs.
        x = np.sign(x) * 10.0 ** rng.uniform(-3, 3, problem.x_shape)
    w = rng.standard_normal(problem.w_shape) / np.sqrt(9 * problem.C_per_group)
    b = rng.standard_normal(problem.K) if problem.has_bias else None
    return x.astype(dt), w.astype(dt), None if b is None else b.astype(dt)


def _run(algo, problem, x, w, b):
    x0, w0 = x.copy(), w.copy()
    y = algo.run(problem, x, w, b, None)
    assert y.shape == problem.y_shape and y.dtype == np.dtype(problem.dtype)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(w, w0)
    return y


SMALL_PROBLEMS = [
    ConvProblem(1, 1, 3, 3, 1, 3, 3),
    ConvProblem(1, 1, 1, 1, 1, 3, 3, padding=(1, 1, 1, 1)),
    ConvProblem(2, 3, 7, 9, 5, 3, 3, padding=(1, 1, 1, 1), has_bias=True),
    ConvProblem(1, 4, 10, 11, 6, 3, 3, padding=(0, 2, 3, 1), has_bias=True),
    ConvProblem(2, 6, 9, 8, 4, 3, 3, padding=(2, 0, 0, 2), groups=2),
    ConvProblem(3, 5, 6, 13, 5, 3, 3, padding=(1, 1, 1, 1), groups=5, has_bias=True),  # depthwise
    ConvProblem(1, 4, 5, 5, 8, 3, 3, groups=4),  # channel multiplier 2
    ConvProblem(2, 8, 17, 19, 16, 3, 3, padding=(3, 3, 3, 3)),
    ConvProblem(1, 2, 4, 30, 3, 3, 3, padding=(0, 0, 1, 1)),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("problem", SMALL_PROBLEMS, ids=lambda p: p.describe())
@pytest.mark.parametrize("algo", ALGOS)
def test_small_problems_match_reference(algo, problem, dtype, rng):
    problem = ConvProblem(**{**problem.__dict__, "dtype": dtype, "_checked": False})
    x, w, b = _arrays(rng, problem)
    err = relative_error(_run(algo, problem, x, w, b), conv2d_reference_for(problem, x, w, b))
    assert err <= (BOUND_FLOAT32[algo.m] / 10 if dtype == "float32" else BOUND_FLOAT64), err


@pytest.mark.parametrize("chunk_bytes", [1, 3000, 40000])
@pytest.mark.parametrize("algo", ALGOS)
def test_chunking_changes_nothing(algo, chunk_bytes, rng):
    problem = ConvProblem(3, 3, 13, 27, 4, 3, 3, padding=(1, 2, 0, 1), dtype="float64", has_bias=True)
    x, w, b = _arrays(rng, problem)
    whole = _run(algo, problem, x, w, b)
    with KNOBS.override(winograd_chunk_bytes=chunk_bytes):
        plan = algo.chunk_plan(problem)
        assert plan.padded_tiles >= 1
        chunked = _run(algo, problem, x, w, b)
    np.testing.assert_allclose(chunked, whole, rtol=1e-13, atol=1e-13)
    assert relative_error(chunked, conv2d_reference_for(problem, x, w, b)) <= BOUND_FLOAT64


@pytest.mark.parametrize("block_bytes", [1, 10**9])
@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("algo", ALGOS)
def test_filters_fused_into_the_gemm_match_the_whole_transform(algo, groups, block_bytes, rng):
    # 19 filters per group: register tiles whose last rows are dropped; block_bytes=1 makes one
    # tile a block, so each thread's range runs through several blocks.
    problem = ConvProblem(2, 2 * groups, 11, 9, 19 * groups, 3, 3, padding=(1, 1, 1, 1), groups=groups, dtype="float64",
                          has_bias=True)
    x, w, b = _arrays(rng, problem)
    with KNOBS.override(winograd_filter_block_bytes=block_bytes):
        assert algo.fuses_filters(problem, algo.chunk_plan(problem))
        fused = _run(algo, problem, x, w, b)
    with KNOBS.override(winograd_chunk_bytes=1):  # many chunks: the whole U, then the batched GEMM
        assert not algo.fuses_filters(problem, algo.chunk_plan(problem))
        whole = _run(algo, problem, x, w, b)
    np.testing.assert_allclose(fused, whole, rtol=1e-13, atol=1e-13)
    assert relative_error(fused, conv2d_reference_for(problem, x, w, b)) <= BOUND_FLOAT64


@pytest.mark.parametrize("chunk_bytes", [1, None])
@pytest.mark.parametrize("algo", ALGOS)
def test_workspace_bytes_is_what_is_allocated(algo, chunk_bytes, monkeypatch):
    problem = ConvProblem(3, 8, 13, 27, 12, 3, 3, padding=(1, 1, 1, 1), dtype="float32")
    allocated = []
    real = cpu_winograd._workspace

    def spy(name, shape, dtype):
        array = real(name, shape, dtype)
        allocated.append(array.nbytes)
        return array

    monkeypatch.setattr(cpu_winograd, "_workspace", spy)
    overrides = {} if chunk_bytes is None else {"winograd_chunk_bytes": chunk_bytes}
    with KNOBS.override(**overrides):
        x = np.ones(problem.x_shape, np.float32)
        algo.run(problem, x, np.ones(problem.w_shape, np.float32), None)
        assert sum(allocated) == algo.workspace_bytes(problem)


@pytest.mark.parametrize("total_rows, tiles_w, most, NR", [
    (56, 7, 16, 32), (56, 7, 16, 16), (1, 3, 1, 32), (7, 2, 3, 8), (100, 1, 40, 32), (32, 2, 64, 32),
])
def test_chunk_rows_waste_the_least_padding(total_rows, tiles_w, most, NR):
    from convlib.cpu.winograd import _rows_per_chunk

    def padded(rows):  # the GEMM columns of all chunks, each padded to whole NR
        sizes = [min(rows, total_rows - r0) * tiles_w for r0 in range(0, total_rows, rows)]
        return sum(-(-s // NR) * NR for s in sizes)

    most = min(most, total_rows)
    rows = _rows_per_chunk(total_rows, tiles_w, most, NR)
    assert max(1, (most + 1) // 2) <= rows <= most
    assert padded(rows) == min(padded(r) for r in range(max(1, (most + 1) // 2), most + 1))
    even = -(-total_rows // -(-total_rows // most))  # the even split chunk_plan made before
    assert padded(rows) <= padded(even)


@pytest.mark.parametrize("algo", ALGOS)
def test_random_problems_match_reference(algo, rng):
    for _ in range(25):
        N, G = int(rng.integers(1, 3)), int(rng.choice([1, 2, 3]))
        Cg, Kg = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        H, W = int(rng.integers(1, 14)), int(rng.integers(1, 14))
        pad = tuple(int(v) for v in rng.integers(0, 4, size=4))
        if H + pad[0] + pad[1] < 3 or W + pad[2] + pad[3] < 3:
            continue
        dtype = str(rng.choice(["float32", "float64"]))
        problem = ConvProblem(N, G * Cg, H, W, G * Kg, 3, 3, padding=pad, groups=G, dtype=dtype,
                              has_bias=bool(rng.integers(0, 2)))
        x, w, b = _arrays(rng, problem)
        err = relative_error(_run(algo, problem, x, w, b), conv2d_reference_for(problem, x, w, b))
        assert err <= (1e-5 if dtype == "float32" else BOUND_FLOAT64), (problem.describe(), err)


@pytest.mark.parametrize("algo", ALGOS)
def test_supports(algo):
    assert algo.supports(ConvProblem(1, 1, 5, 5, 1, 3, 3, padding=(2, 0, 1, 1), groups=1)) is None
    reason = algo.supports(ConvProblem(1, 1, 9, 9, 1, 5, 5))
    assert reason == f"Winograd F({algo.m}x{algo.m},3x3) needs a 3x3 filter with stride 1 and dilation 1; " \
                     "got 5x5 stride 1 dilation 1"
    assert "stride 2" in algo.supports(ConvProblem(1, 1, 9, 9, 1, 3, 3, stride=(2, 2)))
    assert "dilation 1x2" in algo.supports(ConvProblem(1, 1, 9, 9, 1, 3, 3, dilation=(1, 2)))
    assert algo.supports(ConvProblem(1, 1, 9, 9, 1, 3, 1)) is not None


@pytest.mark.parametrize("algo", ALGOS)
def test_empty_batch(algo):
    problem = ConvProblem(0, 2, 5, 5, 3, 3, 3, padding=(1, 1, 1, 1))
    y = algo.run(problem, np.zeros(problem.x_shape, np.float32), np.zeros(problem.w_shape, np.float32),
                    None, None)
    assert y.shape == (0, 3, 5, 5)


# -- accuracy bounds (docs/algorithms.md, Winograd section) --------------------------------------------------------
ACCURACY_LAYERS = [
    ConvProblem(1, 64, 56, 56, 64, 3, 3, padding=(1, 1, 1, 1)),
    ConvProblem(1, 256, 14, 14, 256, 3, 3, padding=(1, 1, 1, 1)),
]


@pytest.mark.parametrize("scale", ["normal", "wide"])
@pytest.mark.parametrize("problem", ACCURACY_LAYERS, ids=lambda p: p.describe())
@pytest.mark.parametrize("algo", ALGOS)
def test_accuracy_float32(algo, problem, scale, rng):
    x, w, b = _arrays(rng, problem, scale)
    err = relative_error(algo.run(problem, x, w, b, None), conv2d_reference_for(problem, x, w, b))
    bound = (BOUND_FLOAT32 if scale == "normal" else BOUND_FLOAT32_WIDE_RANGE)[algo.m]
    assert err <= bound, err


@pytest.mark.parametrize("algo", ALGOS)
def test_accuracy_float64(algo, rng):
    problem = ConvProblem(1, 128, 28, 28, 128, 3, 3, padding=(1, 1, 1, 1), dtype="float64")
    for scale in ("normal", "wide"):
        x, w, b = _arrays(rng, problem, scale)
        err = relative_error(algo.run(problem, x, w, b, None), conv2d_reference_for(problem, x, w, b))
        assert err <= BOUND_FLOAT64, (scale, err)


# -- the accuracy table of the Winograd section of docs/algorithms.md -----------------------------------------------------
def accuracy_table(batch: int = 2, algos=("winograd2", "winograd4", "direct")) -> str:
    """Markdown table of relative errors on the ResNet-50 v1.5 3x3 layers (see the Winograd section of docs/algorithms.md).

    Errors are against the float64 reference of the *rounded* inputs, so they measure the
    algorithm, not the rounding of x and w to float32. The last columns are the largest
    ``|y - ref| / (|x| * |w|)`` over the outputs: the error relative to what an output's terms
    could contribute, which shows small outputs next to large inputs.
    """
    from convlib.dispatch import registry

    header = (f"| layer (N={batch}, pad 1) | data | dtype | " + " | ".join(algos) + " | "
              + " | ".join(f"{a}: max err/(abs x * abs w)" for a in algos) + " |")
    lines = [header, "|---|---|---|" + "---|" * (2 * len(algos))]
    for kind in ("normal", "wide-x", "wide-both"):
        for C, H in ((64, 56), (128, 28), (256, 14), (512, 7)):
            rng = np.random.default_rng(C)
            p64 = ConvProblem(batch, C, H, H, C, 3, 3, padding=(1, 1, 1, 1), dtype="float64")
            x = rng.standard_normal(p64.x_shape)
            w = rng.standard_normal(p64.w_shape) / np.sqrt(9 * C)
            wide = lambda a: np.sign(a) * 10.0 ** rng.uniform(-3, 3, a.shape)  # noqa: E731
            if kind != "normal":
                x = wide(x)
            if kind == "wide-both":
                w = wide(w)
            for dtype in ("float32", "float64"):
                p = ConvProblem(batch, C, H, H, C, 3, 3, padding=(1, 1, 1, 1), dtype=dtype)
                xs, ws = x.astype(dtype), w.astype(dtype)
                ref = conv2d_reference_for(p64, xs.astype(np.float64), ws.astype(np.float64))
                scale = conv2d_reference_for(p64, np.abs(xs.astype(np.float64)), np.abs(ws.astype(np.float64)))
                ys = [registry.implementation("conv2d", "cpu", a).run(p, xs, ws, None, None) for a in algos]
                rel = " | ".join(f"{relative_error(y, ref):.2e}" for y in ys)
                worst = " | ".join(f"{np.max(np.abs(y - ref) / scale):.1e}" for y in ys)
                lines.append(f"| {H}x{H}x{C}->{C} | {kind} | {dtype} | {rel} | {worst} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m tests.test_winograd
    print(accuracy_table())
