"""The plans of recent calls (convlib.dispatch.plan.PLANS): the same results as plans built afresh,
keys that follow everything a plan depends on, errors that are never cached away."""

from __future__ import annotations

import numba
import numpy as np
import pytest

import convlib
from convlib.cpu.tables import KNOBS
from convlib.dispatch import tuning
from convlib.dispatch.devices import resolve_device
from convlib.dispatch.plan import PLANS, PlanCache, call_signature, make_plan
from convlib.testing import conv2d_reference_for


def conv2d_reference(x, w, **kw):
    return conv2d_reference_for(convlib.build_problem(x, w, **kw), x, w)


def _fail():
    raise AssertionError("the plan was built again: the signature was not found")


def _arrays(shape=(2, 3, 9, 9), filters=(8, 3, 3, 3), seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32), rng.standard_normal(filters).astype(np.float32)


def _signature(x, w, **kw):
    kw = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, **kw}
    return call_signature("conv2d", (x, w, None), None, "auto", **kw)


def test_a_repeated_call_runs_the_cached_plan_and_gives_the_same_result():
    x, w = _arrays()
    first = convlib.conv2d(x, w, padding=1)
    plan = PLANS.get(_signature(x, w, padding=1), _fail)  # cached by the first call
    second = convlib.conv2d(x, w, padding=1)
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(second, conv2d_reference(x, w, padding=1), rtol=1e-4, atol=1e-4)
    assert plan.problem.x_shape == x.shape and plan.algorithm in convlib.algorithms("cpu")


def test_different_shapes_and_arguments_do_not_collide():
    calls = [
        (_arrays((2, 3, 9, 9), (8, 3, 3, 3)), {"padding": 1}),
        (_arrays((2, 3, 9, 9), (8, 3, 3, 3)), {"padding": 0}),
        (_arrays((2, 3, 9, 9), (8, 3, 3, 3)), {"padding": (1, 0, 2, 1), "stride": 2}),
        (_arrays((2, 3, 11, 9), (8, 3, 3, 3)), {"padding": 1}),
        (_arrays((2, 4, 9, 9), (8, 2, 3, 3)), {"padding": 1, "groups": 2}),
    ]
    for _ in range(2):  # the second round runs every call from the cache
        for (x, w), kw in calls:
            np.testing.assert_allclose(convlib.conv2d(x, w, **kw), conv2d_reference(x, w, **kw), rtol=1e-4, atol=1e-4)
    x64, w64 = (a.astype(np.float64) for a in calls[0][0])
    y64 = convlib.conv2d(x64, w64, padding=1)
    assert y64.dtype == np.float64
    assert len({_signature(x, w, **kw) for (x, w), kw in calls} | {_signature(x64, w64, padding=1)}) == len(calls) + 1


def test_invalid_arguments_equal_to_cached_valid_ones_still_raise():
    x, w = _arrays()
    convlib.conv2d(x, w, stride=1, padding=1)
    with pytest.raises(TypeError, match="stride"):
        convlib.conv2d(x, w, stride=True, padding=1)  # True == 1, but a bool is not a stride
    with pytest.raises(TypeError, match="stride"):
        convlib.conv2d(x, w, stride=1.0, padding=1)
    with pytest.raises(TypeError, match="padding"):
        convlib.conv2d(x, w, stride=1, padding=(1, 1.0))
    with pytest.raises(ValueError, match="algo"):
        convlib.conv2d(x, w, stride=1, padding=1, algo="fastest")


def test_a_knob_override_reaches_auto_through_the_cache():
    # 3 -> 8 channels on 9x9: the thin-GEMM rule sends it to direct; with no filter count thin
    # enough the next rules apply. A cached plan must not keep the first choice.
    x, w = _arrays()
    convlib.conv2d(x, w, padding=1)
    assert PLANS.get(_signature(x, w, padding=1), _fail).algorithm == "direct"
    with KNOBS.override(auto_thin_filters=1, auto_thin_reduction=1, auto_direct_max_filters=0):
        y = convlib.conv2d(x, w, padding=1)
        assert PLANS.get(_signature(x, w, padding=1), _fail).algorithm != "direct"
    np.testing.assert_allclose(y, conv2d_reference(x, w, padding=1), rtol=1e-4, atol=1e-4)
    assert PLANS.get(_signature(x, w, padding=1), _fail).algorithm == "direct"


def test_a_measured_choice_reaches_auto_through_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVLIB_CACHE_DIR", str(tmp_path))
    tuning.forget_measurements()
    try:
        x, w = _arrays()
        convlib.conv2d(x, w, padding=1)
        before = _signature(x, w, padding=1)
        problem = convlib.build_problem(x, w, padding=1)
        identity = resolve_device("cpu").identity
        tuning.store(tuning.problem_key("conv2d", problem, identity), "im2col", {"im2col": 1.0})
        assert _signature(x, w, padding=1) != before
        convlib.conv2d(x, w, padding=1)
        assert PLANS.get(_signature(x, w, padding=1), _fail).algorithm == "im2col"
    finally:
        tuning.forget_measurements()


def test_the_thread_count_is_part_of_the_signature():
    x, w = _arrays()
    threads = numba.get_num_threads()
    if threads == 1:
        pytest.skip("one numba thread: no other count to compare with")
    before = _signature(x, w)
    numba.set_num_threads(1)
    try:
        assert _signature(x, w) != before
    finally:
        numba.set_num_threads(threads)
    assert _signature(x, w) == before


def test_a_smaller_workspace_cap_cuts_a_cached_plan_into_pieces():
    x, w = _arrays((4, 3, 16, 16), (8, 3, 3, 3))
    whole = convlib.conv2d(x, w, padding=1, algo="im2col")
    plan = PLANS.get(call_signature("conv2d", (x, w, None), None, "im2col", stride=1, padding=1, dilation=1,
                                    groups=1), _fail)
    assert plan.pieces(convlib.options.workspace_cap) is None
    with convlib.option_context(workspace_cap=8 * 1024):
        assert plan.pieces(convlib.options.workspace_cap) is not None
        pieced = convlib.conv2d(x, w, padding=1, algo="im2col")
    np.testing.assert_allclose(pieced, whole, rtol=1e-5, atol=1e-5)


def test_a_smaller_workspace_cap_reaches_a_plan_that_already_ran(monkeypatch):
    # A CPU plan keeps what its execution decides before the kernels per cap: the pieces must
    # follow a cap lowered after the plan ran whole.
    from convlib.dispatch.plan import Plan

    x, w = _arrays((4, 3, 16, 16), (8, 3, 3, 3))
    whole = convlib.conv2d(x, w, padding=1, algo="im2col")
    pieced_runs = []
    run_in_pieces = Plan._execute_in_pieces
    monkeypatch.setattr(Plan, "_execute_in_pieces", lambda self, *a: pieced_runs.append(1) or run_in_pieces(self, *a))
    convlib.conv2d(x, w, padding=1, algo="im2col")
    assert not pieced_runs
    with convlib.option_context(workspace_cap=8 * 1024):
        pieced = convlib.conv2d(x, w, padding=1, algo="im2col")
    assert pieced_runs
    np.testing.assert_allclose(pieced, whole, rtol=1e-5, atol=1e-5)


def test_the_thread_count_read_follows_numba():
    # convlib.cpu.threads reads numba's count without its locks: it must agree with numba on
    # this thread, after a change, and on another thread (the count is per thread).
    import threading

    from convlib.cpu.threads import thread_count

    threads = numba.get_num_threads()
    assert thread_count() == threads
    numba.set_num_threads(1)
    try:
        assert thread_count() == numba.get_num_threads() == 1
        seen = []
        worker = threading.Thread(target=lambda: seen.append((thread_count(), numba.get_num_threads())))
        worker.start()
        worker.join()
        assert seen[0][0] == seen[0][1]
    finally:
        numba.set_num_threads(threads)
    assert thread_count() == threads


def test_backward_passes_are_cached_by_their_own_signatures():
    x, w = _arrays()
    dy = np.random.default_rng(1).standard_normal((2, 8, 9, 9)).astype(np.float32)
    for _ in range(2):
        dx = convlib.conv2d_backward_data(dy, w, x.shape, padding=1)
        dw = convlib.conv2d_backward_weight(x, dy, w.shape, padding=1)
        db = convlib.conv2d_backward_bias(dy)
        # The adjoint identities: <conv(x, w), dy> = <x, dx> = <w, dw>.
        inner = float(np.vdot(conv2d_reference(x, w, padding=1), dy))
        assert np.isclose(float(np.vdot(x, dx)), inner, rtol=1e-4)
        assert np.isclose(float(np.vdot(w, dw)), inner, rtol=1e-4)
        np.testing.assert_allclose(db, dy.sum((0, 2, 3)), rtol=1e-5)
    with pytest.raises(ValueError, match="x_shape"):
        convlib.conv2d_backward_data(dy, w, (2, 3, 9, 9, 1), padding=1)
    with pytest.raises(TypeError, match="w_shape"):
        convlib.conv2d_backward_weight(x, dy, (8, 3, 3, 3.0), padding=1)


def test_calls_on_objects_a_signature_cannot_hold_are_not_cached():
    x, w = _arrays()
    assert call_signature("conv2d", (x, w, None), object(), "auto") is None
    assert call_signature("conv2d", (x.tolist(), w, None), None, "auto") is None
    assert call_signature("conv2d", (x, w, None), None, "auto", padding={1: 1}) is None


def test_the_cache_is_bounded_least_recently_used_first():
    cache = PlanCache(maxsize=2)
    x, w = _arrays()
    plans = {}
    for padding in (0, 1, 2):
        key = _signature(x, w, padding=padding)
        plans[padding] = cache.get(key, lambda p=padding: make_plan(
            "conv2d", convlib.build_problem(x, w, padding=p), None, "auto", (x, w)))
    assert len(cache) == 2
    assert cache.get(_signature(x, w, padding=2), _fail) is plans[2]
    with pytest.raises(AssertionError, match="built again"):
        cache.get(_signature(x, w, padding=0), _fail)


def test_small_problems_run_on_the_calling_thread_under_the_serial_knob():
    from convlib.cpu.backend import BACKEND

    x, w = _arrays()
    problem = convlib.build_problem(x, w, padding=1)
    threads = numba.get_num_threads()
    with KNOBS.override(serial_below_flops=problem.flops + 1):
        with BACKEND.execution(problem):
            assert numba.get_num_threads() == 1
        assert numba.get_num_threads() == threads
        serial = convlib.conv2d(x, w, padding=1)
    with KNOBS.override(serial_below_flops=problem.flops):  # not below: as many threads as before
        with BACKEND.execution(problem):
            assert numba.get_num_threads() == threads
    np.testing.assert_allclose(serial, conv2d_reference(x, w, padding=1), rtol=1e-4, atol=1e-4)
    assert numba.get_num_threads() == threads


def test_a_new_process_loads_every_cpu_kernel_from_numbas_cache():
    """Each CPU algorithm's kernels, once compiled, are loaded from numba's disk cache by the next
    process, not compiled again. numba keys a closure's cache entry on its variables, pickled: a
    kernel closing over a jitted function (a dispatcher pickles with a fresh id) missed the cache
    in every process (depthwise's channel blocks until 2026-11-29: 7 s of every first call)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import numpy as np
        from numba.core import event
        compiled = []
        class Compiles(event.Listener):
            def on_start(self, e):
                compiled.append(e.data["dispatcher"].py_func.__qualname__)
            def on_end(self, e):
                pass
        import convlib
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2, 32, 12, 12)).astype(np.float32)
        calls = [(rng.standard_normal((32, 1, 3, 3)).astype(np.float32), dict(groups=32, algo="depthwise")),
                 (rng.standard_normal((16, 32, 3, 3)).astype(np.float32), dict(algo="direct")),
                 (rng.standard_normal((16, 32, 3, 3)).astype(np.float32), dict(algo="blis")),
                 (rng.standard_normal((16, 32, 3, 3)).astype(np.float32), dict(algo="winograd")),
                 (rng.standard_normal((16, 32, 1, 1)).astype(np.float32), dict(algo="im2col"))]
        import sys
        if sys.argv[1] == "count":
            event.register("numba:compile", Compiles())
        for w, kw in calls:
            convlib.conv2d(x, w, padding=w.shape[-1] // 2, **kw)
        print(sorted(set(q for q in compiled if ".<locals>." in q and "ol_" not in q and "impl" not in q)))
    """)
    subprocess.run([sys.executable, "-c", script, "fill"], capture_output=True, text=True, check=True)
    out = subprocess.run([sys.executable, "-c", script, "count"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"compiled again in a new process: {out.stdout}"
