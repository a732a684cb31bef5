"""convlib on Dask arrays of CuPy chunks: the blocks are computed by the CUDA backend where they
live, the result's chunks are CuPy arrays, and numpy filters and biases are accepted (copied to the
GPU once, in the graph). Every result equals convlib's in-memory float64 result on the CPU.

Runs on a machine with a GPU, CuPy, dask and distributed (``python -m convlib.bench.gpu_check``
runs it); skipped elsewhere, the CUDA simulator included (CuPy needs a GPU).
"""

from __future__ import annotations

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
cupy = pytest.importorskip("cupy")

import convlib  # noqa: E402

try:
    _GPU = cupy.cuda.runtime.getDeviceCount() > 0
except Exception:  # noqa: BLE001 -- no driver, no device: CuPy raises its own errors
    _GPU = False
pytestmark = pytest.mark.skipif(not _GPU, reason="needs a CUDA GPU for CuPy")

TOL = dict(rtol=1e-11, atol=1e-11)


def _on_gpu(arr, chunks):
    """A Dask array of CuPy chunks holding ``arr``."""
    return da.from_array(arr, chunks=chunks).map_blocks(cupy.asarray, dtype=arr.dtype,
                                                        meta=cupy.empty((0,) * arr.ndim, arr.dtype))


def _host(y):
    assert isinstance(y, cupy.ndarray), type(y)
    return cupy.asnumpy(y)


# (x shape, x chunks, w shape, arguments): batch, spatial (stride, dilation, "same") and channel chunks.
CASES = [
    ((4, 3, 12, 11), (2, -1, -1, -1), (5, 3, 3, 3), dict(padding=1)),
    ((2, 3, 21, 19), (1, -1, 6, 7), (4, 3, 3, 3), dict(stride=2, padding=1)),
    ((2, 2, 17, 18), (2, -1, 5, 7), (3, 2, 3, 3), dict(padding="same", dilation=2)),
    ((2, 8, 13, 12), (1, 3, -1, 5), (4, 8, 3, 3), dict(padding=1, stride=(1, 2))),
    ((2, 8, 14, 13), (2, 4, 6, -1), (6, 4, 3, 3), dict(groups=2, padding="same")),
]


@pytest.mark.parametrize("x_shape, chunks, w_shape, arguments", CASES)
@pytest.mark.parametrize("scheduler", ["threads", "sync"])
def test_forward_of_cupy_chunks_with_numpy_filters(rng, x_shape, chunks, w_shape, arguments, scheduler):
    x = rng.standard_normal(x_shape)
    w = rng.standard_normal(w_shape)
    b = rng.standard_normal(w_shape[0])
    y = convlib.conv2d(_on_gpu(x, chunks), w, b, **arguments)
    assert isinstance(y, da.Array) and isinstance(y._meta, cupy.ndarray)
    expected = convlib.conv2d(x, w, b, algo="direct", **arguments)
    assert y.shape == expected.shape and y.dtype == expected.dtype
    np.testing.assert_allclose(_host(y.compute(scheduler=scheduler)), expected, **TOL)


def test_cupy_filters_and_a_dask_bias_too(rng):
    x, w, b = rng.standard_normal((3, 4, 10, 9)), rng.standard_normal((6, 4, 3, 3)), rng.standard_normal(6)
    y = convlib.conv2d(_on_gpu(x, (1, 2, 5, -1)), cupy.asarray(w), da.from_array(b, chunks=3), padding=1,
                       algo="blis")
    np.testing.assert_allclose(_host(y.compute(scheduler="threads")), convlib.conv2d(x, w, b, padding=1), **TOL)


def test_backward_passes_of_cupy_chunks(rng):
    x, w, b = rng.standard_normal((4, 4, 11, 10)), rng.standard_normal((6, 2, 3, 3)), rng.standard_normal(6)
    arguments = dict(stride=2, padding=1, groups=2)
    dy = convlib.conv2d(x, w, **arguments)
    same = dict(padding=1, groups=2)
    dy1 = convlib.conv2d(x, w, **same)
    lazy = {
        "data": (convlib.conv2d_backward_data(_on_gpu(dy, (2, -1, -1, -1)), w, x.shape, **arguments),
                 convlib.conv2d_backward_data(dy, w, x.shape, **arguments)),
        "data-spatial": (convlib.conv2d_backward_data(_on_gpu(dy1, (2, 3, 4, 6)), w, x.shape, **same),
                         convlib.conv2d_backward_data(dy1, w, x.shape, **same)),
        # stride 2, K chunks of whole groups and H/W chunks: the gathered plan (a near-side halo)
        "data-strided": (convlib.conv2d_backward_data(_on_gpu(dy, (2, 3, 2, 3)), w, x.shape, **arguments),
                         convlib.conv2d_backward_data(dy, w, x.shape, **arguments)),
        "weight": (convlib.conv2d_backward_weight(_on_gpu(x, (2, -1, 4, 6)), dy, w.shape, **arguments),
                   convlib.conv2d_backward_weight(x, dy, w.shape, **arguments)),
        "bias": (convlib.conv2d_backward_bias(_on_gpu(dy, (1, 3, -1, -1))), convlib.conv2d_backward_bias(dy)),
        "transpose": (convlib.conv_transpose2d(_on_gpu(x, (2, -1, -1, -1)), w[:4], b[:4], output_padding=1, **arguments),
                      convlib.conv_transpose2d(x, w[:4], b[:4], output_padding=1, **arguments)),
    }
    for name, (lazy_result, expected) in lazy.items():
        assert isinstance(lazy_result._meta, cupy.ndarray), name
        np.testing.assert_allclose(_host(lazy_result.compute(scheduler="threads")), expected, **TOL, err_msg=name)


def test_half_precision_chunks(rng):
    """float16 chunks are computed on the GPU (the CPU would refuse them) and stay float16."""
    x = rng.standard_normal((4, 3, 16, 16)).astype(np.float16)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float16)
    y = convlib.conv2d(_on_gpu(x, (2, -1, 8, -1)), w, padding=1)
    assert y.dtype == np.float16 and y._meta.dtype == np.float16
    expected = convlib.conv2d(x.astype(np.float64), w.astype(np.float64), padding=1)
    got = _host(y.compute(scheduler="threads")).astype(np.float64)
    np.testing.assert_allclose(got, expected, rtol=2.0**-10, atol=1e-3 * np.abs(expected).max())


def test_cupy_chunks_on_a_cluster_of_worker_processes(rng):
    """One worker process holding the GPU: the graph, its CuPy blocks and the filters travel to it."""
    x, w, b = rng.standard_normal((4, 3, 20, 18)), rng.standard_normal((5, 3, 3, 3)), rng.standard_normal(5)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0",
                                  env={"NUMBA_NUM_THREADS": "2", "CONVLIB_PROFILE": "off"},
                                  silence_logs=40) as cluster, distributed.Client(cluster) as client:
        y = convlib.conv2d(_on_gpu(x, (2, -1, 7, -1)), w, b, stride=2, padding="valid")
        got = client.compute(y).result()
        dw = client.compute(convlib.conv2d_backward_weight(_on_gpu(x, (1, -1, -1, -1)),
                                                           convlib.conv2d(x, w), w.shape)).result()
    np.testing.assert_allclose(_host(got), convlib.conv2d(x, w, b, stride=2), **TOL)
    np.testing.assert_allclose(_host(dw), convlib.conv2d_backward_weight(x, convlib.conv2d(x, w), w.shape), **TOL)
