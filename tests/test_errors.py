"""Invalid arguments get a TypeError/ValueError naming the argument, the value and what is allowed."""

from __future__ import annotations

import numpy as np
import pytest

import convlib

X = np.zeros((2, 4, 8, 8), np.float32)
W = np.zeros((6, 4, 3, 3), np.float32)


def conv(x=X, w=W, bias=None, **kw):
    return convlib.conv2d(x, w, bias, **kw)


@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        (dict(x=np.zeros((4, 8, 8), np.float32)), ValueError, r"x must be 4-D .*got 3-D"),
        (dict(w=np.zeros((6, 4, 3), np.float32)), ValueError, r"w must be 4-D .*got 3-D"),
        (dict(w=np.zeros((6, 3, 3, 3), np.float32)), ValueError, r"w has shape \(6, 3, 3, 3\).*C/groups = 4/1 = 4, got 3"),
        (dict(groups=3), ValueError, r"groups=3 must divide both the input channels C=4 and the output channels K=6"),
        (dict(w=np.zeros((5, 2, 3, 3), np.float32), groups=2), ValueError, r"groups=2 must divide .*K=5"),
        (dict(groups=0), ValueError, r"groups=0 must be an int >= 1"),
        (dict(groups=1.5), TypeError, r"groups=1.5 must be an int"),
        (dict(stride=0), ValueError, r"stride=0: stride must be an int >= 1 or a pair"),
        (dict(stride=(1, 0)), ValueError, r"stride=\(1, 0\): stride must be"),
        (dict(stride=1.0), TypeError, r"stride=1.0: stride must be an int >= 1"),
        (dict(stride=(1, 2, 3)), TypeError, r"stride=\(1, 2, 3\)"),
        (dict(stride=True), TypeError, r"stride=True is a bool"),
        (dict(dilation=0), ValueError, r"dilation=0: dilation must be an int >= 1"),
        (dict(dilation="2"), TypeError, r"dilation='2': dilation must be"),
        (dict(padding=-1), ValueError, r"padding=-1: padding must be an int >= 0"),
        (dict(padding=(1, -2)), ValueError, r"padding=\(1, -2\)"),
        (dict(padding=(1, 0, -1, 0)), ValueError, r"padding=\(1, 0, -1, 0\)"),
        (dict(padding=1.5), TypeError, r"padding=1.5"),
        (dict(padding="full"), ValueError, r"padding='full': allowed strings are 'valid' and 'same'"),
        (dict(padding="same", stride=2), ValueError, r"padding='same' needs stride 1, got stride=\(2, 2\)"),
        (dict(w=np.zeros((6, 4, 9, 3), np.float32)), ValueError, r"filter 9x3 is larger than the padded input 8x8"),
        (dict(w=np.zeros((6, 4, 3, 3), np.float32), dilation=4), ValueError, r"filter 9x9 is larger"),
        (dict(bias=np.zeros(5, np.float32)), ValueError, r"bias has shape \(5,\); it must be \(K,\) = \(6,\)"),
        (dict(bias=np.zeros((6, 1), np.float32)), ValueError, r"bias has shape \(6, 1\)"),
        (dict(x=X.astype(np.int32)), TypeError, r"x has dtype int32; allowed dtypes are float32 and float64"),
        (dict(w=W.astype(np.int64)), TypeError, r"w has dtype int64"),
        (dict(x=X.astype(np.complex64)), TypeError, r"x has dtype complex64"),
        (dict(x=X.astype(bool)), TypeError, r"x has dtype bool"),
        (dict(x=X.astype(np.float16)), TypeError, r"x has dtype float16"),
        (dict(x=X.astype(object)), TypeError, r"x has dtype object"),
        (dict(x=np.full((2, 4, 8, 8), "a")), TypeError, r"x has dtype <U1|x has dtype str"),
        (dict(x="not an array"), TypeError, r"x .*"),
        (dict(x=None), TypeError, r"x=None is not an array"),
        (dict(w=W.astype(np.float64)), TypeError, r"x has dtype float32 but w has dtype float64"),
        (dict(bias=np.zeros(6, np.float64)), TypeError, r"bias has dtype float64 but x has dtype float32"),
        (dict(algo="fft"), ValueError, r"algo='fft': allowed are 'auto', 'direct', 'im2col', 'blis'"),
        (dict(algo=None), ValueError, r"algo=None: allowed are"),
        (dict(device="tpu"), ValueError, r"tpu"),
        (dict(device=3), TypeError, r"device=3 of type int: allowed are None, 'cpu', 'sycl'"),
        (dict(x=np.zeros((2, 0, 8, 8), np.float32)), ValueError, r"C, H and W must be >= 1"),
    ],
)
def test_invalid_arguments(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        conv(**kwargs)


def test_unknown_device_lists_available():
    with pytest.raises(ValueError) as info:
        conv(device="level_zero:gpu:7")
    # Either the SYCL backend lists the devices that exist, or it says how to install it.
    assert "level_zero:gpu:7" in str(info.value)


def test_unsupported_algorithm_names_the_ones_that_can():
    w5 = np.zeros((6, 4, 5, 5), np.float32)
    with pytest.raises(NotImplementedError, match=r"winograd.*3x3.*Algorithms that can: direct, im2col, blis"):
        conv(w=w5, padding=2, algo="winograd")
    with pytest.raises(NotImplementedError, match=r"stride"):
        conv(stride=2, algo="winograd2")


def test_errors_come_before_any_work():
    """A bad argument is reported even when the arrays are huge: nothing is computed first."""
    big = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (64, 64, 4096, 4096), (0, 0, 0, 0))
    with pytest.raises(ValueError, match="stride"):
        conv(x=big, w=np.zeros((64, 64, 3, 3), np.float32), stride=0)


def test_options_are_validated():
    with pytest.raises(ValueError, match="workspace_cap"):
        convlib.options.workspace_cap = 0
    with pytest.raises(ValueError, match="unknown option"):
        with convlib.option_context(nonsense=1):
            pass


def test_option_context_is_per_thread():
    """A call's ``allow_tf32=True`` (an option_context) must not make another thread's call, at the
    same moment, TF32: the context is this thread's; assignments stay process-wide."""
    import threading

    seen, inside, looked = [], threading.Event(), threading.Event()

    def other_thread():
        inside.wait()
        seen.append((convlib.options.allow_tf32, convlib.options.workspace_cap))
        looked.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    cap = convlib.options.workspace_cap
    with convlib.option_context(allow_tf32=True, workspace_cap=2**20):
        assert (convlib.options.allow_tf32, convlib.options.workspace_cap) == (True, 2**20)
        inside.set()
        looked.wait(10)
        with convlib.option_context(workspace_cap=2**21):  # nested: the inner value, then the outer
            assert (convlib.options.allow_tf32, convlib.options.workspace_cap) == (True, 2**21)
        assert convlib.options.workspace_cap == 2**20
    thread.join()
    assert seen == [(False, cap)]
    assert (convlib.options.allow_tf32, convlib.options.workspace_cap) == (False, cap)
    with pytest.raises(ValueError, match="workspace_cap"):  # checked before anything changes
        with convlib.option_context(allow_tf32=True, workspace_cap=0):
            pass
    assert convlib.options.allow_tf32 is False


def test_dask_blocks_run_under_the_options_of_the_graph(monkeypatch):
    """Blocks run later, in dask's threads (or worker processes) that a caller's option_context does
    not reach: they take the options in force where the graph was built (a spy on the in-memory
    call each block makes)."""
    da = pytest.importorskip("dask.array")
    import convlib.api

    seen, plain = [], convlib.api.conv2d

    def spy(*args, **kwargs):
        seen.append(convlib.options.workspace_cap)
        return plain(*args, **kwargs)

    monkeypatch.setattr(convlib.api, "conv2d", spy)  # what api hands convlib.dask as the block's call
    x = np.random.default_rng(2).standard_normal((2, 3, 10, 10))
    w = np.random.default_rng(3).standard_normal((4, 3, 3, 3))
    with convlib.option_context(workspace_cap=12345678):
        lazy = convlib.conv2d(da.from_array(x, chunks=(1, 3, 5, 10)), w, padding=1)
    seen.clear()
    y = lazy.compute(scheduler="threads")
    assert seen and set(seen) == {12345678}, f"blocks saw workspace_cap={seen}"
    np.testing.assert_allclose(y, plain(x, w, padding=1), rtol=1e-12, atol=1e-12)


def test_allow_tf32_is_a_validated_permission():
    """``allow_tf32`` takes True or False only; it is a permission, so where no TF32 path exists
    (the CPU) the result is the exact one, and the option is restored after the call."""
    x = np.random.default_rng(0).standard_normal((1, 3, 6, 6)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((4, 3, 3, 3)).astype(np.float32)
    with pytest.raises(TypeError, match="allow_tf32"):
        convlib.options.allow_tf32 = 1
    with pytest.raises(TypeError, match="allow_tf32"):
        convlib.conv2d(x, w, allow_tf32="yes")
    exact = convlib.conv2d(x, w, algo="im2col", device="cpu")
    assert np.array_equal(convlib.conv2d(x, w, algo="im2col", device="cpu", allow_tf32=True), exact)
    assert convlib.options.allow_tf32 is False


def test_allow_tf32_reaches_dask_blocks(monkeypatch):
    """Every block's call sets the permission (a spy on the option it sets: the CPU computes the
    same either way, so the result alone could not tell a dropped flag)."""
    da = pytest.importorskip("dask.array")
    import convlib.api

    x = np.random.default_rng(2).standard_normal((2, 3, 10, 10)).astype(np.float32)
    w = np.random.default_rng(3).standard_normal((4, 3, 3, 3)).astype(np.float32)
    permissions, plain = [], convlib.api.option_context

    def spy(**changes):
        permissions.append(changes.get("allow_tf32"))
        return plain(**changes)

    monkeypatch.setattr(convlib.api, "option_context", spy)
    lazy = convlib.conv2d(da.from_array(x, chunks=(1, 3, 5, 10)), w, padding=1, allow_tf32=True)
    permissions.clear()  # the call that built the graph
    y = lazy.compute(scheduler="synchronous")
    assert permissions == [True] * lazy.npartitions, f"blocks saw allow_tf32={permissions}"
    assert np.allclose(y, convlib.conv2d(x, w, padding=1), rtol=1e-5, atol=1e-5)
