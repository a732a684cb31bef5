"""SYCL devices: how ``device=`` resolves, which array kind comes back, and the error cases.

Skipped only when dpctl / numba_dpex are not importable; with the ``sycl`` extra installed a
missing SYCL device fails. Every call here uses the direct algorithm on one 3x3 shape, so the
whole module compiles one kernel per dtype.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import convlib
from convlib import BackendUnavailable

from convlib.testing import TOLERANCE, conv2d_reference, conv2d_reference_for, relative_error

pytestmark = [
    pytest.mark.sycl,
    pytest.mark.skipif(
        importlib.util.find_spec("dpctl") is None or importlib.util.find_spec("numba_dpex") is None,
        reason="the sycl extra (dpctl, numba-dpex) is not installed",
    ),
]


@pytest.fixture(scope="module")
def mods():
    from convlib.sycl import runtime

    loaded = runtime.load()
    assert loaded.dpctl.get_devices(), "the sycl extra is installed but no SYCL device was found"
    return loaded


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    problem = convlib.build_problem(x, w, b, padding=1)
    return x, w, b, conv2d_reference_for(problem, x, w, b)


def conv(x, w, b, **kw):
    return convlib.conv2d(x, w, b, padding=1, algo="direct", **kw)


def check(y, ref, dtype="float32"):
    assert relative_error(np.asarray(y), ref) <= TOLERANCE[dtype]


# -- discovery ---------------------------------------------------------------------------------
def test_devices_lists_sycl_devices(mods):
    names = convlib.devices()
    sycl_names = [d.filter_string for d in mods.dpctl.get_devices()]
    assert names[0] == "cpu" and sycl_names and all(n in names for n in sycl_names)


@pytest.mark.parametrize("device", ["sycl", "opencl:cpu", "opencl:cpu:0"])
def test_algorithms_per_device(mods, device):
    if not mods.dpctl.get_devices(device.split(":")[0], "cpu") and device != "sycl":
        pytest.skip(f"no {device} device here")
    assert convlib.algorithms(device) == ["direct", "im2col", "blis", "winograd", "winograd2", "winograd4"]


# -- device= forms and result kinds --------------------------------------------------------------
def test_numpy_in_numpy_out_on_every_device_form(mods, data):
    x, w, b, ref = data
    dev = mods.dpctl.select_default_device()
    for device in ("sycl", dev.filter_string, dev, mods.dpctl.SyclQueue(dev)):
        y = conv(x, w, b, device=device)
        assert type(y) is np.ndarray and y.dtype == np.float32
        check(y, ref)


def test_dpnp_in_dpnp_out_same_queue(mods, data):
    x, w, b, ref = data
    dpnp = mods.dpnp
    xd, wd, bd = dpnp.asarray(x), dpnp.asarray(w), dpnp.asarray(b)
    y = conv(xd, wd, bd)
    assert isinstance(y, dpnp.ndarray) and y.sycl_queue == xd.sycl_queue
    check(dpnp.asnumpy(y), ref)
    # device= naming the data's own device or queue is not a contradiction
    assert isinstance(conv(xd, wd, bd, device=xd.sycl_device), dpnp.ndarray)
    assert isinstance(conv(xd, wd, bd, device=xd.sycl_queue), dpnp.ndarray)
    assert isinstance(conv(xd, wd, bd, device="sycl"), dpnp.ndarray)


def test_usm_ndarray_in_usm_ndarray_out(mods, data):
    x, w, b, ref = data
    dpt = mods.dpt
    q = mods.dpctl.SyclQueue()
    y = conv(dpt.asarray(x, sycl_queue=q), dpt.asarray(w, sycl_queue=q), dpt.asarray(b, sycl_queue=q))
    assert isinstance(y, dpt.usm_ndarray) and y.sycl_queue == q
    check(dpt.asnumpy(y), ref)


def test_mixed_dpnp_and_usm_on_one_queue(mods, data):
    x, w, b, ref = data
    xd = mods.dpnp.asarray(x)
    y = conv(xd, mods.dpt.asarray(w, sycl_queue=xd.sycl_queue), None)
    assert isinstance(y, mods.dpnp.ndarray)


def test_non_contiguous_and_inputs_untouched(mods, data):
    x, w, b, ref = data
    dpnp = mods.dpnp
    xt = dpnp.asarray(np.ascontiguousarray(x.transpose(0, 1, 3, 2))).transpose(0, 1, 3, 2)  # a view
    before = dpnp.asnumpy(xt).copy()
    y = conv(xt, dpnp.asarray(w), dpnp.asarray(b))
    check(dpnp.asnumpy(y), ref)
    np.testing.assert_array_equal(dpnp.asnumpy(xt), before)
    x_fortran = np.asfortranarray(x)
    check(conv(x_fortran, w, b, device="sycl"), ref)
    np.testing.assert_array_equal(x_fortran, x)


def test_float64(mods, data):
    x, w, b, _ = data
    x64, w64, b64 = x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)
    ref = conv2d_reference_for(convlib.build_problem(x64, w64, b64, padding=1), x64, w64, b64)
    y = conv(mods.dpnp.asarray(x64), mods.dpnp.asarray(w64), mods.dpnp.asarray(b64))
    assert y.dtype == np.float64
    check(mods.dpnp.asnumpy(y), ref, "float64")


def test_empty_batch_keeps_the_kind(mods):
    x = mods.dpnp.zeros((0, 3, 6, 6), dtype=mods.dpnp.float32)
    w = mods.dpnp.ones((2, 3, 3, 3), dtype=mods.dpnp.float32)
    y = convlib.conv2d(x, w, algo="direct")
    assert isinstance(y, mods.dpnp.ndarray) and y.shape == (0, 2, 4, 4)


# -- errors --------------------------------------------------------------------------------------
def test_inputs_on_different_queues(mods, data):
    x, w, b, _ = data
    dpnp = mods.dpnp
    other = mods.dpctl.SyclQueue(mods.dpctl.select_default_device())
    with pytest.raises(ValueError, match="different SYCL queues"):
        conv(dpnp.asarray(x), dpnp.asarray(w, sycl_queue=other), None)


def test_device_contradicting_the_data(mods, data):
    x, w, b, _ = data
    xd, wd = mods.dpnp.asarray(x), mods.dpnp.asarray(w)
    with pytest.raises(ValueError, match="contradicts where the data lives"):
        conv(xd, wd, None, device="cpu")
    with pytest.raises(ValueError, match="contradicts where the data lives"):
        conv(xd, wd, None, device=mods.dpctl.SyclQueue(xd.sycl_device))  # another queue


def test_filter_string_matching_nothing_lists_devices(mods, data):
    x, w, b, _ = data
    present = mods.dpctl.get_devices()[0].filter_string
    for spec in ("level_zero:gpu:0", "opencl:gpu:3", "not-a-backend"):
        if spec == "level_zero:gpu:0" and mods.dpctl.get_devices("level_zero", "gpu"):
            continue
        with pytest.raises(ValueError, match=rf"device='{spec}' matches no SYCL device.*{present}"):
            conv(x, w, b, device=spec)


def test_float64_without_fp64_is_a_type_error(mods, data, monkeypatch):
    from convlib.sycl import backend

    x, w, b, ref = data
    monkeypatch.setattr(backend, "supports_fp64", lambda device: False)
    with pytest.raises(TypeError, match="no fp64 support"):
        conv(x.astype(np.float64), w.astype(np.float64), None, device="sycl")
    check(conv(x, w, b, device="sycl"), ref)  # float32 still runs


def test_unavailable_backend_message(monkeypatch, data):
    from convlib.sycl import backend

    x, w, b, _ = data
    fake = backend.SyclBackend()
    fake._checked, fake._reason = True, 'the sycl extra is not installed: pip install -e ".[sycl]"'
    monkeypatch.setattr(backend, "BACKEND", fake)
    with pytest.raises(BackendUnavailable, match=r'pip install -e "\.\[sycl\]"'):
        conv(x, w, b, device="sycl")


def test_cpu_device_results_reuse_dropped_memory(mods, monkeypatch):
    """Shared-USM results on a CPU device go through convlib.output_cache: memory still reachable
    from any array (a usm_ndarray slice, a numpy view) is never handed out again; dropped memory
    is, and results stay right through the reuse."""
    import gc

    from convlib.core import output_cache
    from convlib.sycl import memory

    monkeypatch.setattr(output_cache, "MIN_BYTES", 1)
    output_cache.clear()
    try:
        q = mods.dpt.empty(1).sycl_queue  # the default queue, which device="sycl" uses
        if not q.sycl_device.is_cpu:
            pytest.skip("the default SYCL device is not a CPU")

        def address(a):
            return a.__sycl_usm_array_interface__["data"][0]

        a = memory.device_empty((64, 64), "float32", q, result=True)
        where = address(a)
        view = memory.host_view(a)
        view[...] = 5
        row = a[3]
        del a
        gc.collect()
        b = memory.device_empty((64, 64), "float32", q, result=True)
        assert address(b) != where
        assert float(mods.dpt.asnumpy(row)[0]) == 5 and (view == 5).all()
        del row, view
        gc.collect()
        c = memory.device_empty((16, 256), "float32", q, result=True)
        assert address(c) == where

        rng = np.random.default_rng(1)
        x1, x2 = (rng.standard_normal((2, 8, 12, 12)).astype(np.float32) for _ in range(2))
        w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
        for algo in convlib.algorithms("sycl"):
            y1 = convlib.conv2d(x1, w, padding=1, algo=algo, device="sycl")
            y2 = convlib.conv2d(x2, w, padding=1, algo=algo, device="sycl")
            assert not np.shares_memory(y1, y2)
            for x, y in ((x1, y1), (x2, y2)):
                ref = conv2d_reference(x, w, padding=(1, 1, 1, 1))
                assert relative_error(y, ref) <= 10 * TOLERANCE["float32"]
    finally:
        output_cache.clear()


# -- the tuning cache's key: the device, not the object that named it --------------------------
def test_a_measured_choice_follows_the_device_not_the_queue_object(mods, data, tmp_path, monkeypatch):
    """A SyclQueue's str() holds its address, and device=None once keyed every SYCL device as
    "sycl": now one device has one identity, found again from any queue or name of it, and a
    choice made on one device is not applied to another."""
    from convlib.dispatch import tuning
    from convlib.dispatch.devices import resolve_device

    monkeypatch.setenv("CONVLIB_CACHE_DIR", str(tmp_path))
    tuning.forget_measurements()
    try:
        x, w, b, _ = data
        dpctl, dpnp = mods.dpctl, mods.dpnp
        device = dpctl.SyclDevice("opencl:cpu:0")
        q1, q2 = dpctl.SyclQueue(device), dpctl.SyclQueue(device)
        assert str(q1) != str(q2) or q1 is not q2
        names = [q1, q2, device, "opencl:cpu:0", "opencl:cpu"]
        identities = {resolve_device(d).identity for d in names}
        on_data = resolve_device(None, dpnp.asarray(x, sycl_queue=q2)).identity
        assert len(identities) == 1 and on_data in identities
        (identity,) = identities
        assert "0x" not in identity and identity != resolve_device("cpu").identity

        problem = convlib.build_problem(x, w, b, padding=1)
        tuning.store(tuning.problem_key("conv2d", problem, identity), "blis", {"blis": 1.0})
        tuning.forget_measurements()  # as a new process would
        for d in (q2, "opencl:cpu:0"):
            choice = convlib.choose_algorithm(x, w, b, padding=1, device=d)
            assert choice.algo == "blis" and "tuning cache" in choice.reason
        # Not on the CPU, nor on another SYCL device (another name or driver).
        assert "tuning cache" not in convlib.choose_algorithm(x, w, b, padding=1, device="cpu").reason
        tuning.store(tuning.problem_key("conv2d", problem, identity + " (another driver)"), "im2col", {})
        assert convlib.choose_algorithm(x, w, b, padding=1, device=q1).algo == "blis"
    finally:
        tuning.forget_measurements()
