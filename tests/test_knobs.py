"""The one knob mechanism: every backend's tuning values in one table, changed only by override()."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import convlib
from convlib.core.knobs import Knob, KnobTable
from convlib.cpu.tables import KNOBS as CPU
from convlib.testing import TOLERANCE, conv2d_reference, relative_error


@pytest.fixture
def table():
    return KnobTable("test", [
        Knob("block", 8, "a block size"),
        Knob("engine", "a", "an engine switch", allowed=("a", "b")),
        Knob("rows", {("x", "f4"): 1, ("y", "f4"): 2}, "a per-ISA row", keyed_by=("isa", "dtype")),
        Knob("baked", 3, "a compile-time constant", compile_time=True),
    ])


def test_override_is_scoped_and_nests(table):
    assert table.block == 8 and table.state() == ()
    with table.override(block=4):
        assert table.block == 4 and table.state() == (("block", 4),)
        with table.override(engine="b"):
            assert (table.block, table.engine) == (4, "b")
        assert (table.block, table.engine) == (4, "a")
    assert table.block == 8 and table.state() == ()


def test_override_is_undone_when_the_block_raises(table):
    with pytest.raises(RuntimeError):
        with table.override(block=2):
            raise RuntimeError("boom")
    assert table.block == 8


def test_keyed_knobs_take_one_value_for_every_row(table):
    assert table.lookup("rows", ("x", "f4")) == 1 and table.lookup("rows", ("y", "f4")) == 2
    with table.override(rows=7):
        assert table.lookup("rows", ("x", "f4")) == table.lookup("rows", ("y", "f4")) == 7
    with pytest.raises(KeyError, match="no row"):
        table.lookup("rows", ("z", "f8"))
    with pytest.raises(TypeError, match="lookup"):
        table.rows  # noqa: B018


def test_bad_overrides_say_what_is_allowed(table):
    with pytest.raises(ValueError, match="unknown knob 'blok'.*known knobs: baked, block, engine, rows"):
        with table.override(blok=1):
            pass
    with pytest.raises(ValueError, match="engine='c': allowed are 'a', 'b'"):
        with table.override(engine="c"):
            pass
    with pytest.raises(ValueError, match="compiled into its kernels"):
        with table.override(baked=4):
            pass
    with pytest.raises(TypeError, match="hashable"):
        with table.override(block=[1, 2]):
            pass
    assert table.state() == ()


def test_overrides_belong_to_the_thread_that_set_them(table):
    seen = {}
    inside, release = threading.Event(), threading.Event()

    def other():
        inside.wait()
        seen["other"] = table.block  # while the main thread's override is in force
        with table.override(block=16):
            seen["other-own"] = table.block
        release.set()

    thread = threading.Thread(target=other)
    thread.start()
    with table.override(block=1):
        inside.set()
        release.wait()
        seen["main"] = table.block
    thread.join()
    assert seen == {"other": 8, "other-own": 16, "main": 1}


def _tables():
    from convlib.cuda.tables import KNOBS as CUDA
    from convlib.sycl.tables import KNOBS as SYCL

    return {"cpu": CPU, "sycl": SYCL, "cuda": CUDA}


@pytest.mark.parametrize("backend", ["cpu", "sycl", "cuda"])
def test_every_backend_table_is_documented(backend):
    table = _tables()[backend]
    assert table.backend == backend
    for knob in table.knobs():
        assert len(knob.doc) > 20, f"{backend} knob {knob.name} needs a sentence of documentation"
        if knob.keyed_by:
            assert isinstance(knob.default, dict) and knob.default
            parts = len(knob.keyed_by)
            assert all(len(key) == parts if parts > 1 else not isinstance(key, tuple) for key in knob.default)
        assert knob.name in table.describe()


def test_knobs_reach_the_kernels(rng):
    """An override changes what runs (one register block for direct, tiny BLIS blocks) and a
    later call without it runs the table's values again: the kernel caches key on the values."""
    from convlib.cpu import direct
    from convlib.cpu.tables import BlisBlocking, DirectBlocking, direct_blockings

    x = rng.standard_normal((2, 5, 9, 11)).astype(np.float32)
    w = rng.standard_normal((7, 5, 3, 3)).astype(np.float32)
    ref = conv2d_reference(x, w, padding=(1, 1, 1, 1))
    problem = convlib.build_problem(x, w, padding=1)
    odd = DirectBlocking(KB=2, QB=16)
    with CPU.override(direct_blockings=(odd,)):
        assert direct.choose_blocking(problem) == odd
        y_direct = convlib.conv2d(x, w, padding=1, algo="direct")
    assert direct.choose_blocking(problem) in direct_blockings("float32")
    with CPU.override(blis_blocking=BlisBlocking(MC=6, KC=7, NC=16, MR=3, NR=8)):
        y_blis = convlib.conv2d(x, w, padding=1, algo="blis")
    y_after = convlib.conv2d(x, w, padding=1, algo="blis")
    for y in (y_direct, y_blis, y_after):
        assert relative_error(y, ref) <= TOLERANCE["float32"]
