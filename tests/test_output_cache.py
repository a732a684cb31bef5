"""The CPU output cache: dropped outputs are reused, live ones never are, and the cap holds."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import convlib
from convlib.core import output_cache

from convlib.testing import TOLERANCE, conv2d_reference, relative_error

MiB = 2**20


@pytest.fixture
def small_blocks(monkeypatch):
    """Cache every output (not only those of >= 32 MiB), starting from an empty pool."""
    monkeypatch.setattr(output_cache, "MIN_BYTES", 1)
    output_cache.clear()
    yield
    output_cache.clear()


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_a_dropped_output_is_reused(small_blocks):
    a = output_cache.empty((4, 1000), np.float32)
    assert a.flags.c_contiguous and a.flags.writeable and a.shape == (4, 1000) and a.dtype == np.float32
    where = _address(a)
    del a
    gc.collect()
    assert output_cache.cached_bytes() == 16000
    b = output_cache.empty((1000, 4), np.float32)  # same bytes, another shape
    assert _address(b) == where and output_cache.cached_bytes() == 0


def test_memory_reachable_through_a_view_is_not_reused(small_blocks):
    a = output_cache.empty((4, 1000), np.float32)
    a[...] = 7
    row = a[1]  # keeps a's memory alive after a is gone
    reshaped = a.reshape(-1)[::2]
    del a
    gc.collect()
    b = output_cache.empty((4, 1000), np.float32)
    b[...] = -1
    assert not np.shares_memory(b, row) and not np.shares_memory(b, reshaped)
    assert (row == 7).all() and (reshaped == 7).all()
    del row, reshaped
    gc.collect()
    assert output_cache.cached_bytes() == 16000


def test_cap_and_switching_off(small_blocks):
    with convlib.option_context(output_cache_bytes=20000):
        arrays = [output_cache.empty((1000,), np.float64) for _ in range(3)]  # 8000 bytes each
        del arrays
        gc.collect()
        assert output_cache.cached_bytes() == 16000  # the third would pass the cap
    with convlib.option_context(output_cache_bytes=0):
        plain = output_cache.empty((1000,), np.float64)
        assert not isinstance(plain.base, output_cache._Owner)
        assert output_cache.cached_bytes() == 0  # switching off released the pool


def test_option_is_validated():
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="output_cache_bytes"):
            convlib.options.output_cache_bytes = bad


def test_large_outputs_only_by_default():
    output_cache.clear()
    small = output_cache.empty((10, 10), np.float32)
    assert not isinstance(small.base, output_cache._Owner)
    big = output_cache.empty((output_cache.MIN_BYTES // 4,), np.float32)
    assert isinstance(big.base, output_cache._Owner)
    del small, big
    gc.collect()
    output_cache.clear()


@pytest.mark.parametrize("algo", ["direct", "im2col", "blis", "winograd", "winograd2"])
def test_every_cpu_algorithm_through_the_cache(small_blocks, algo):
    """Two results of the same size alive at once are distinct and both right; a dropped
    one's memory serves the next call."""
    rng = np.random.default_rng(3)
    x1, x2 = (rng.standard_normal((2, 8, 12, 12)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    y1 = convlib.conv2d(x1, w, padding=1, algo=algo)
    y2 = convlib.conv2d(x2, w, padding=1, algo=algo)
    assert not np.shares_memory(y1, y2)
    for x, y in ((x1, y1), (x2, y2)):
        assert relative_error(y, conv2d_reference(x, w, padding=(1, 1, 1, 1))) <= TOLERANCE["float32"]
    where = _address(y1)
    del y1
    gc.collect()
    y3 = convlib.conv2d(x1, w, padding=1, algo=algo)
    assert _address(y3) == where
    assert relative_error(y3, conv2d_reference(x1, w, padding=(1, 1, 1, 1))) <= TOLERANCE["float32"]
