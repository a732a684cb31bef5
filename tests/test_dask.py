"""convlib on Dask arrays (convlib.dask): every lazy result equals the in-memory result of the same
numpy array (the in-memory path is checked against the reference elsewhere), on a real
``distributed`` cluster with worker processes and on the threaded scheduler.

One module-scoped ``LocalCluster`` (2 worker processes, 1 dask thread and 1 numba thread each)
serves every distributed test: starting one and compiling the kernels in its workers is most of
this module's time. Shapes are small and ``algo="direct"`` so the workers compile few kernels.
"""

from __future__ import annotations

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import convlib  # noqa: E402
from convlib.dask import ChunkPlan, chunk_plan  # noqa: E402

TOL = {"float32": dict(rtol=1e-5, atol=1e-5), "float64": dict(rtol=1e-12, atol=1e-12)}


@pytest.fixture(scope="module")
def client():
    # NUMBA_NUM_THREADS: each worker's share of the host's cores (distributed does not set it).
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  env={"NUMBA_NUM_THREADS": "1", "CONVLIB_PROFILE": "off"},
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        yield client


def _data(rng, x_shape, w_shape, dtype, bias=True):
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype) if bias else None
    return x, w, b


# (name, x shape, x chunks, w shape, arguments): batch, spatial and channel chunks with stride,
# dilation, padding ("same" too), groups, odd chunk sizes and a last chunk too small to stand alone.
FORWARD_CASES = [
    ("batch", (5, 3, 12, 11), (2, -1, -1, -1), (4, 3, 3, 3), dict(padding=1)),
    ("spatial-stride2", (2, 3, 21, 19), (1, -1, 6, 7), (4, 3, 3, 3), dict(stride=2, padding=1)),
    ("spatial-dilated-same", (2, 2, 17, 18), (2, -1, 5, 7), (3, 2, 3, 3), dict(padding="same", dilation=2)),
    ("spatial-odd-stride3", (1, 2, 23, 20), (1, -1, (9, 7, 5, 2), (6, 6, 6, 2)), (2, 2, 4, 3),
     dict(stride=3, padding=(1, 2, 0, 1))),
    ("channels", (2, 8, 13, 12), (1, 3, -1, 5), (4, 8, 3, 3), dict(padding=1, stride=(1, 2))),
    ("groups", (2, 8, 14, 13), (2, 4, 6, -1), (6, 4, 3, 3), dict(groups=2, padding="same")),
    ("depthwise-mixed-groups", (2, 6, 11, 11), (1, (2, 4), 4, 4), (6, 1, 3, 3), dict(groups=6, padding=1,
                                                                                      dilation=(1, 2))),
]


def _forward(rng, dtype, x_shape, chunks, w_shape, arguments, w_chunks=None):
    x, w, b = _data(rng, x_shape, w_shape, dtype)
    expected = convlib.conv2d(x, w, b, algo="direct", **arguments)
    dw = w if w_chunks is None else da.from_array(w, chunks=w_chunks)
    y = convlib.conv2d(da.from_array(x, chunks=chunks), dw, b, algo="direct", **arguments)
    assert isinstance(y, da.Array) and y.shape == expected.shape and y.dtype == expected.dtype
    return y, expected


@pytest.mark.parametrize("name, x_shape, chunks, w_shape, arguments", FORWARD_CASES, ids=[c[0] for c in FORWARD_CASES])
def test_forward_on_a_cluster(client, rng, name, x_shape, chunks, w_shape, arguments):
    for dtype in ("float64", "float32"):
        y, expected = _forward(rng, dtype, x_shape, chunks, w_shape, arguments)
        got = client.compute(y).result()
        assert isinstance(got, np.ndarray) and got.shape == expected.shape
        np.testing.assert_allclose(got, expected, **TOL[dtype])


def test_filters_chunked_along_k_on_a_cluster(client, rng):
    y, expected = _forward(rng, "float64", (2, 4, 10, 9), (1, 2, 5, -1), (6, 4, 3, 3), dict(padding=1),
                           w_chunks=(4, -1, -1, -1))
    assert y.chunks[1] == (4, 2)
    np.testing.assert_allclose(client.compute(y).result(), expected, **TOL["float64"])


def test_backward_passes_on_a_cluster(client, rng):
    arguments = dict(stride=2, padding=1, groups=2)
    x, w, b = _data(rng, (5, 4, 11, 10), (6, 2, 3, 3), "float64")
    dy = rng.standard_normal(convlib.conv2d(x, w, **arguments).shape)
    x_d, dy_d = da.from_array(x, chunks=(2, -1, -1, -1)), da.from_array(dy, chunks=(3, -1, -1, -1))
    lazy = {
        "data": (convlib.conv2d_backward_data(dy_d, w, x.shape, algo="direct", **arguments),
                 convlib.conv2d_backward_data(dy, w, x.shape, algo="direct", **arguments)),
        "weight": (convlib.conv2d_backward_weight(x_d, dy_d, w.shape, algo="direct", **arguments),
                   convlib.conv2d_backward_weight(x, dy, w.shape, algo="direct", **arguments)),
        "bias": (convlib.conv2d_backward_bias(da.from_array(dy, chunks=(2, 4, -1, -1))),
                 convlib.conv2d_backward_bias(dy)),
        "transpose": (convlib.conv_transpose2d(x_d, w[:4], b[:4], output_padding=1, algo="direct", **arguments),
                      convlib.conv_transpose2d(x, w[:4], b[:4], output_padding=1, algo="direct", **arguments)),
    }
    spatial = dict(padding=1, groups=2)  # stride 1: dy chunked along K, H and W, as a forward convolution
    dy1 = convlib.conv2d(x, w, **spatial)
    lazy["data-spatial"] = (
        convlib.conv2d_backward_data(da.from_array(dy1, chunks=(2, 3, 4, 6)), w, x.shape, algo="direct", **spatial),
        convlib.conv2d_backward_data(dy1, w, x.shape, algo="direct", **spatial))
    lazy["weight-spatial"] = (  # x cut by the forward plan (stride 2, halo 1), dy rechunked to its outputs
        convlib.conv2d_backward_weight(da.from_array(x, chunks=(2, -1, 4, 6)), dy_d, w.shape, algo="direct",
                                       **arguments),
        lazy["weight"][1])
    results = client.compute({k: v[0] for k, v in lazy.items()}, sync=True)
    for name, (y, expected) in lazy.items():
        assert y.shape == expected.shape, name
        np.testing.assert_allclose(results[name], expected, **TOL["float64"], err_msg=name)


def test_zarr_round_trip_on_a_cluster(client, rng, tmp_path):
    zarr = pytest.importorskip("zarr")
    x, w, b = _data(rng, (3, 2, 30, 28), (3, 2, 3, 3), "float32")
    da.from_array(x, chunks=(1, 2, 10, 14)).to_zarr(str(tmp_path / "x.zarr"))
    y = convlib.conv2d(da.from_zarr(str(tmp_path / "x.zarr")), w, b, padding="same", algo="direct")
    y.to_zarr(str(tmp_path / "y.zarr"))  # computes on the cluster: the client is the default scheduler
    got = zarr.open(str(tmp_path / "y.zarr"), mode="r")[...]
    np.testing.assert_allclose(got, convlib.conv2d(x, w, b, padding="same", algo="direct"), **TOL["float32"])


def test_worker_numba_threads(client):
    """Each task runs with NUMBA_NUM_THREADS // dask threads of its worker numba threads, on a
    thread-safe layer."""
    from convlib.dask import task_threads

    def probe():
        import numba

        with task_threads():
            return numba.get_num_threads(), numba.config.NUMBA_NUM_THREADS

    assert client.submit(probe, pure=False).result() == (1, 1)


# -- the threaded scheduler -----------------------------------------------------------------------

@pytest.mark.parametrize("name, x_shape, chunks, w_shape, arguments", FORWARD_CASES[1::2], ids=[c[0] for c in FORWARD_CASES[1::2]])
def test_forward_threaded_scheduler(rng, name, x_shape, chunks, w_shape, arguments):
    y, expected = _forward(rng, "float64", x_shape, chunks, w_shape, arguments)
    np.testing.assert_allclose(y.compute(scheduler="threads"), expected, **TOL["float64"])


@pytest.mark.parametrize("stride, padding, dilation, groups, taps, chunks", [
    (1, "same", 2, 1, 3, (2, (2, 5, 1), 6, 6)),
    (3, (1, 0, 2, 1), 1, 4, 4, (2, -1, 5, 7)),
    (1, 2, 1, 1, 5, (3, -1, (5, 5, 5, 2), -1)),
])
def test_weight_pass_chunked_along_space_and_channels(rng, stride, padding, dilation, groups, taps, chunks):
    x = rng.standard_normal((3, 8, 17, 15))
    w = rng.standard_normal((8, 8 // groups, taps, taps))
    arguments = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, algo="direct")
    dy = convlib.conv2d(x, w, **arguments)
    x_dask = da.from_array(x, chunks=chunks)
    dw = convlib.conv2d_backward_weight(x_dask, da.from_array(dy, chunks=(1, 4, 3, 3)), w.shape, **arguments)
    # C chunks of x give those channels of dw (groups=1)
    assert dw.shape == w.shape and dw.chunks[1] == (x_dask.chunks[1] if groups == 1 else (w.shape[1],))
    np.testing.assert_allclose(dw.compute(scheduler="threads"), convlib.conv2d_backward_weight(x, dy, w.shape, **arguments),
                               **TOL["float64"])


@pytest.mark.parametrize("algo", ["im2col", "auto"])
def test_algo_device_and_a_dask_bias_apply_per_block(rng, algo):
    x, w, b = _data(rng, (2, 6, 13, 11), (5, 6, 3, 3), "float64")
    y = convlib.conv2d(da.from_array(x, chunks=(1, 3, 7, -1)), w, da.from_array(b, chunks=2), padding=1, algo=algo,
                       device="cpu")
    np.testing.assert_allclose(y.compute(scheduler="threads"), convlib.conv2d(x, w, b, padding=1, algo="direct"),
                               **TOL["float64"])


def test_backward_weight_tree_reduction_threaded(rng):
    x = rng.standard_normal((20, 3, 9, 9))
    dy = rng.standard_normal((20, 4, 9, 9))
    dw = convlib.conv2d_backward_weight(da.from_array(x, chunks=(1, -1, -1, -1)), da.from_array(dy, chunks=(1, -1, -1, -1)),
                                        (4, 3, 3, 3), padding=1, algo="direct")
    # 20 partial sums reduced 8 at a time: a tree of depth 2, not one task holding all 20.
    assert len(dw.dask.layers) >= 3
    np.testing.assert_allclose(dw.compute(scheduler="threads"),
                               convlib.conv2d_backward_weight(x, dy, (4, 3, 3, 3), padding=1, algo="direct"),
                               **TOL["float64"])


# -- laziness, plans and errors ---------------------------------------------------------------------

def _explodes(block):
    raise AssertionError("computed")


def test_result_is_lazy_with_shape_dtype_chunks_and_meta():
    x = da.zeros((4, 3, 20, 20), chunks=(2, 3, 10, 10), dtype="float32").map_blocks(_explodes, dtype="float32")
    y = convlib.conv2d(x, np.ones((5, 3, 3, 3), np.float32), stride=2, padding=1)
    assert y.shape == (4, 5, 10, 10) and y.dtype == np.float32
    assert y.chunks == ((2, 2), (5,), (5, 5), (5, 5))
    assert type(y._meta) is np.ndarray and y._meta.ndim == 4 and y._meta.dtype == np.float32


def test_chunk_plan_is_a_value_that_describes_itself():
    problem = convlib.build_problem(np.empty((80, 4, 64, 64), np.float32), np.empty((4, 4, 3, 3), np.float32),
                                    padding=1)
    plan = chunk_plan(problem, ((40, 40), (4,), (32, 32), (64,)))
    assert isinstance(plan, ChunkPlan) and plan == chunk_plan(problem, ((40, 40), (4,), (32, 32), (64,)))
    assert plan.h.input_chunks == (32, 34) and plan.h.halo == 2 and plan.output_chunks[2] == (32, 32)
    assert plan.reads(0, 0) == ((0, 1), (0,)) and plan.reads(1, 0) == ((1,), (0,))
    text = plan.describe()
    assert "halo 2" in text and "tasks" in text and str(plan) == text


def test_a_chunk_smaller_than_the_halo_is_named():
    x = da.zeros((1, 1, 30, 30), chunks=(1, 1, (12, 3, 15), 30))
    with pytest.raises(ValueError, match=r"chunk 1 along H .* 3 rows, fewer than the halo of 4 rows"):
        convlib.conv2d(x, np.zeros((1, 1, 5, 5)))


def test_a_last_chunk_too_small_for_the_filter_joins_its_predecessor(rng):
    x = rng.standard_normal((1, 1, 22, 9))
    w = rng.standard_normal((1, 1, 5, 5))
    y = convlib.conv2d(da.from_array(x, chunks=(1, 1, (10, 10, 2), 9)), w)
    assert y.chunks[2] == (10, 8)
    np.testing.assert_allclose(y.compute(scheduler="sync"), convlib.conv2d(x, w), **TOL["float64"])


def test_c_chunks_must_hold_whole_groups():
    with pytest.raises(ValueError, match=r"chunk 0 along C has 3 channels: with groups=2 .* multiple of .* 4"):
        convlib.conv2d(da.zeros((1, 8, 8, 8), chunks=(1, 3, 8, 8)), np.zeros((4, 4, 3, 3)), groups=2)


def test_a_first_chunk_shorter_than_the_halo_joins_its_successor(rng):
    x = rng.standard_normal((1, 2, 20, 9))
    w = rng.standard_normal((2, 2, 5, 5))
    y = convlib.conv2d(da.from_array(x, chunks=(1, 2, (2, 9, 9), 9)), w, padding=1)
    assert y.chunks[2] == (11, 7)
    np.testing.assert_allclose(y.compute(scheduler="sync"), convlib.conv2d(x, w, padding=1), **TOL["float64"])


def test_backward_chunkings_that_cannot_be_cut_are_named():
    with pytest.raises(ValueError, match=r"chunk 0 along C has 3 channels: with groups=2"):
        convlib.conv2d_backward_weight(da.zeros((2, 4, 10, 10), chunks=(1, 3, 5, 10)), da.zeros((2, 4, 8, 8)),
                                       (4, 2, 3, 3), groups=2)
    with pytest.raises(ValueError, match=r"chunk 0 of dy along K has 3 channels: with groups=2 .* multiple of 2"):
        convlib.conv2d_backward_data(da.zeros((2, 4, 5, 5), chunks=(1, 3, 5, 5)), np.zeros((4, 3, 3, 3)),
                                     (2, 6, 11, 11), stride=2, groups=2)
    # dilation*(R-1)//stride = 4 rows of the chunk before: a middle chunk of 2 cannot lend them
    with pytest.raises(ValueError, match=r"chunk 1 of dy along H has 2 rows, fewer than the halo of 4 rows"):
        convlib.conv2d_backward_data(da.zeros((1, 1, 16, 6), chunks=(1, 1, (6, 2, 8), 6)), np.zeros((1, 1, 3, 1)),
                                     (1, 1, 38, 10), stride=2, dilation=4, padding=1)


# (stride, padding, dilation, groups, filter size, chunks of dy): any stride, the gathered plan.
STRIDED_DATA_PASS_CASES = [
    (2, 1, 1, 1, 3, (1, -1, 1, 3)),                       # chunks of one row, halo 1
    (2, 0, 1, 2, 3, (2, 2, 3, (1, 5))),                   # K chunks of whole groups -> C chunks of dx
    ((3, 2), (2, 0, 1, 3), (1, 2), 1, 4, (1, 2, 2, 3)),   # K chunks of groups=1: partial sums
    (2, 3, 3, 1, 3, (1, -1, 3, 4)),                       # padding past the filter's reach, halo 3
    (1, (0, 3, 4, 0), 1, 1, 2, (1, -1, 4, 3)),            # stride 1 with padding past the reach
]


@pytest.mark.parametrize("stride, padding, dilation, groups, taps, chunks", STRIDED_DATA_PASS_CASES)
def test_data_pass_chunked_along_space_at_any_stride(rng, stride, padding, dilation, groups, taps, chunks):
    x = rng.standard_normal((2, 4, 15, 13))
    w = rng.standard_normal((4, 4 // groups, taps, taps))
    arguments = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, algo="direct")
    dy = convlib.conv2d(x, w, **arguments)
    dx = convlib.conv2d_backward_data(da.from_array(dy, chunks=chunks), w, x.shape, **arguments)
    assert dx.shape == x.shape and sum(dx.chunks[2]) == x.shape[2]
    np.testing.assert_allclose(dx.compute(scheduler="threads"), convlib.conv2d_backward_data(dy, w, x.shape, **arguments),
                               **TOL["float64"])


@pytest.mark.parametrize("stride, padding, output_padding, dilation, groups, chunks", [
    (2, 1, 1, 1, 1, (1, -1, (2, 3), (1, 2, 2))),
    (2, 0, 2, 3, 2, (2, 2, (3, 2), 5)),     # output_padding >= stride: rows past every filter's reach
    ((3, 2), (1, 2), (2, 0), 1, 1, (1, (1, 3), 2, 3)),
])
def test_transpose_chunked_along_space_at_any_stride(rng, stride, padding, output_padding, dilation, groups, chunks):
    x = rng.standard_normal((2, 4, 5, 5))
    w = rng.standard_normal((4, 6 // groups, 3, 3))
    bias = rng.standard_normal(6)
    arguments = dict(stride=stride, padding=padding, output_padding=output_padding, dilation=dilation, groups=groups,
                     algo="direct")
    y = convlib.conv_transpose2d(da.from_array(x, chunks=chunks), w, bias, **arguments)
    expected = convlib.conv_transpose2d(x, w, bias, **arguments)
    assert y.shape == expected.shape
    np.testing.assert_allclose(y.compute(scheduler="threads"), expected, **TOL["float64"])


def test_weight_pass_with_c_chunks_of_whole_groups(rng):
    x = rng.standard_normal((3, 8, 14, 13))
    w = rng.standard_normal((12, 2, 3, 3))
    arguments = dict(stride=2, padding=1, groups=4, algo="direct")
    dy = convlib.conv2d(x, w, **arguments)
    dw = convlib.conv2d_backward_weight(da.from_array(x, chunks=(2, (4, 2, 2), 7, -1)), dy, w.shape, **arguments)
    assert dw.chunks[0] == (6, 3, 3)  # the filters of each C chunk's groups
    np.testing.assert_allclose(dw.compute(scheduler="threads"), convlib.conv2d_backward_weight(x, dy, w.shape, **arguments),
                               **TOL["float64"])


# (padding, dilation, groups, filter size, chunks of dy / of conv_transpose2d's x): stride 1.
SPATIAL_DATA_PASS_CASES = [
    (1, 1, 2, 3, (1, 4, (7, 6, 4), 5)),
    ("same", 2, 1, 3, (2, 3, 6, 6)),
    ((1, 0, 2, 1), 1, 4, 4, (2, 4, 5, 7)),
]


@pytest.mark.parametrize("padding, dilation, groups, taps, chunks", SPATIAL_DATA_PASS_CASES)
def test_data_pass_and_transpose_chunked_along_channels_and_space(rng, padding, dilation, groups, taps, chunks):
    x = rng.standard_normal((3, 8, 17, 15))
    w = rng.standard_normal((8, 8 // groups, taps, taps))
    dy = convlib.conv2d(x, w, padding=padding, dilation=dilation, groups=groups, algo="direct")
    arguments = dict(padding=padding, dilation=dilation, groups=groups, algo="direct")
    dx = convlib.conv2d_backward_data(da.from_array(dy, chunks=chunks), w, x.shape, **arguments)
    # K chunks of whole groups give C chunks of dx; with groups=1 they are partial sums
    assert dx.chunks[1] == ((8,) if groups == 1 else (4, 4))
    np.testing.assert_allclose(dx.compute(scheduler="threads"), convlib.conv2d_backward_data(dy, w, x.shape, **arguments),
                               **TOL["float64"])
    transpose_padding = 1 if padding == "same" else padding
    bias = rng.standard_normal(8)
    for output_padding in (0, 1) if dilation > 1 else (0,):
        arguments = dict(padding=transpose_padding, dilation=dilation, groups=groups, output_padding=output_padding,
                         algo="direct")
        y = convlib.conv_transpose2d(da.from_array(dy, chunks=chunks), w, bias, **arguments)
        np.testing.assert_allclose(y.compute(scheduler="threads"), convlib.conv_transpose2d(dy, w, bias, **arguments),
                                   **TOL["float64"])


@pytest.mark.parametrize("arguments", [
    dict(stride=0), dict(padding="same", stride=2), dict(groups=3), dict(algo="fastest"),
    dict(algo="winograd", stride=2), dict(dilation=(1, 0)), dict(padding=(1, 2, 3)),
])
def test_errors_are_those_of_numpy_input(arguments):
    x, w = np.zeros((2, 4, 9, 9)), np.zeros((4, 4, 3, 3))
    with pytest.raises(Exception) as from_numpy:
        convlib.conv2d(x, w, **arguments)
    with pytest.raises(type(from_numpy.value)) as from_dask:
        convlib.conv2d(da.from_array(x, chunks=1), w, **arguments)
    assert str(from_dask.value) == str(from_numpy.value)
    assert type(from_dask.value) is type(from_numpy.value)


def test_dtype_and_shape_errors_name_the_argument():
    w = np.zeros((4, 4, 3, 3))
    for bad_x in (da.zeros((2, 4, 9, 9), dtype=np.int32), da.zeros((4, 9, 9))):
        with pytest.raises(Exception) as from_numpy:
            convlib.conv2d(bad_x.compute(), w)
        with pytest.raises(type(from_numpy.value), match=str(from_numpy.value).replace("(", r"\(").replace(")", r"\)")):
            convlib.conv2d(bad_x, w)


def test_the_dask_benchmark_runs(tmp_path, capsys):
    """``python -m convlib.bench dask`` on a tiny shape: its own cluster, both timings, the plan, a record."""
    from convlib.bench.__main__ import main

    assert main(["dask", "--shape", "4,2,64,64,2,3,3", "--batch-chunk", "2", "--repeats", "1", "--warmup", "0",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "in-process median" in out and "dask       median" in out and "halo 2" in out
    assert len(list(tmp_path.glob("dask-*.json"))) == 1
