"""Tests particular to the CPU direct kernel: every block of the table, the edges of its blocking.

The contract test covers the public behaviour; these force each ``(KB, QB)`` candidate (of both
instruction-set tables: an AVX-512 block run on an AVX2 machine only spills, it must still be
right) through the cases where the blocking has edges: K not a multiple of KB, an image shorter
than one block, the last block shifted back, wide rows that wrap inside a block, long rows cut
block by block with streaming stores on and off cache lines.
"""

from __future__ import annotations

import numpy as np
import pytest

from convlib.core.problem import ConvProblem
from convlib.cpu import direct, tables
from convlib.cpu.tables import KNOBS

from .conftest import random_arrays
from convlib.testing import TOLERANCE, conv2d_reference_for, relative_error

ALL_BLOCKS = sorted(
    {(dtype, b) for (_, dtype), bs in tables.all_direct_blockings().items() for b in bs},
    key=lambda item: (item[0], item[1].KB, item[1].QB, item[1].along),
)

# (N, C, H, W, K, R, S, stride, padding, dilation, groups, bias)
EDGE_CASES = {
    # no copy: stride 1, no padding; image long enough for a shifted-back last block
    "no-copy-K7": (2, 3, 9, 40, 7, 3, 3, (1, 1), (0, 0, 0, 0), (1, 1), 1, True),
    # image shorter than any block: gathered planes with a zero tail
    "tiny-image": (2, 2, 3, 4, 5, 2, 3, (1, 1), (0, 0, 0, 0), (1, 1), 1, False),
    # wide rows of pitch 9 wrapping many times inside a block, padding and bias
    "wrapping-rows": (3, 5, 7, 7, 13, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, True),
    # stride phases and dilation together, asymmetric padding
    "phases": (2, 3, 17, 23, 4, 3, 4, (2, 3), (2, 0, 1, 3), (2, 1), 1, True),
    # groups with K/groups not a multiple of any KB
    "groups": (2, 6, 11, 13, 15, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 3, True),
    "depthwise": (2, 5, 12, 19, 5, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 5, False),
    # rows of ~10 blocks, cut row by row; 4000-byte rows start off cache lines (a peeled block)
    "long-rows": (2, 3, 4, 1000, 5, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, True),
    # rows on cache lines, a stride in the rows only
    "aligned-rows": (1, 2, 3, 1024, 3, 3, 3, (1, 2), (1, 1, 1, 1), (1, 1), 1, False),
}


def problem_for(name, dtype):
    N, C, H, W, K, R, S, stride, padding, dilation, groups, bias = EDGE_CASES[name]
    return ConvProblem(N, C, H, W, K, R, S, stride, padding, dilation, groups, dtype, bias)


#: Where the planes come from (module docstring): as the size decides ("in place" or "whole" for
#: these small shapes), or gathered by every work item as for inputs past the last-level cache.
SOURCES = {"by size": {}, "per item": {"direct_whole_input_max_bytes": 0, "direct_in_place_max_bytes": 0}}


@pytest.mark.parametrize("source", list(SOURCES))
@pytest.mark.parametrize("case", list(EDGE_CASES))
@pytest.mark.parametrize("dtype, block", ALL_BLOCKS, ids=lambda v: v.label if hasattr(v, "KB") else v)
def test_every_block_matches_reference(rng, dtype, block, case, source):
    problem = problem_for(case, dtype)
    x, w, b = random_arrays(rng, problem)
    copies = (x.copy(), w.copy(), None if b is None else b.copy())
    # The one candidate block, every thread taking work items, streaming stores wherever a row
    # allows them.
    with KNOBS.override(direct_blockings=(block,), direct_serial_below_flops=0, direct_stream_min_bytes=0,
                        **SOURCES[source]):
        if source == "per item":
            assert direct._planes(problem, block).source == "per item"
        assert direct.choose_blocking(problem) == block
        y = direct.run(problem, x, w, b, None)
    assert y.shape == problem.y_shape and y.dtype == np.dtype(dtype)
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE[dtype]
    assert np.array_equal(x, copies[0]) and np.array_equal(w, copies[1])
    if b is not None:
        assert np.array_equal(b, copies[2])


@pytest.mark.parametrize("source", list(SOURCES))
@pytest.mark.parametrize("case", ["groups", "phases", "no-copy-K7"])
@pytest.mark.parametrize("images, bands, k_ranges, rowwise, stream", [
    (1, 1, 1, False, False), (3, 2, 2, False, False), (1000, 1, 5, False, False), (1, 1000, 1000, False, False),
    (1, 3, 1, True, False), (2, 5, 2, True, True), (1, 1000, 1, True, True),
])
def test_any_schedule(monkeypatch, rng, case, images, bands, k_ranges, rowwise, stream, source):
    """Every way of cutting the work gives the reference's answer: several images or bands of rows
    per item (bands of one row and bands past the rows: empty), K split into ranges, blocks row by
    row (shifted back at each row's end) or along wide rows, streaming stores or plain ones."""
    problem = problem_for(case, "float32")
    if rowwise and problem.Q < max(b.QB for b in tables.direct_blockings("float32")):
        block = min(tables.direct_blockings("float32"), key=lambda b: b.QB)
        if problem.Q < block.QB:
            pytest.skip("rows narrower than every block")
        monkeypatch.setattr(direct, "choose_blocking", lambda p: block)
    plan = direct.Schedule(images, bands, k_ranges, rowwise, stream)
    monkeypatch.setattr(direct, "schedule", lambda p, b, threads=None: plan)
    x, w, b = random_arrays(rng, problem)
    with KNOBS.override(direct_serial_below_flops=0, direct_stream_min_bytes=0, **SOURCES[source]):
        y = direct.run(problem, x, w, b, None)
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE["float32"]


def test_workspace_is_what_is_allocated(monkeypatch):
    import numba

    threads = numba.get_num_threads()
    no_copy = ConvProblem(2, 4, 64, 64, 4, 3, 3)
    assert direct.workspace_bytes(no_copy) == 0
    # Small inputs are gathered whole: the padded planes and a zero tail of a block.
    padded = ConvProblem(2, 4, 64, 64, 4, 3, 3, padding=(1, 1, 1, 1))
    block = direct.choose_blocking(padded)
    assert direct.workspace_bytes(padded) == (2 * 4 * 66 * 66 + block.QB) * 4
    # stride 2 with a 1x1 filter touches one phase of four: a quarter of x, no padding
    strided = ConvProblem(1, 8, 32, 32, 8, 1, 1, stride=(2, 2))
    block = direct.choose_blocking(strided)
    assert direct.workspace_bytes(strided) == (8 * 16 * 16 + block.QB) * 4
    # Large inputs (and here every input) are gathered by each work item: about the L2 budget per
    # thread, whatever N, H and W are; a tail of a block and a 64-byte line.
    line = 16
    with KNOBS.override(direct_serial_below_flops=0, direct_whole_input_max_bytes=0):
        block = direct.choose_blocking(padded)
        plan = direct.schedule(padded, block, threads)
        assert direct.workspace_bytes(padded) == threads * (
            plan.images * 4 * (plan.band_rows(padded) + 2) * 66 + block.QB + line) * 4
        for n, size in ((1, 2048), (16, 4096)):
            big = ConvProblem(n, 4, size, size, 4, 3, 3, padding=(1, 1, 1, 1))
            assert direct.workspace_bytes(big) <= threads * 2 * KNOBS.direct_l2_input_budget
    big = ConvProblem(16, 4, 4096, 4096, 4, 3, 3, padding=(1, 1, 1, 1))
    assert direct._planes(big, direct.choose_blocking(big)).source == "per item"
    # A large unpadded input is read in place (the tuner sets a limit where gathering is faster),
    # above the limit gathered per item like the padded one.
    unpadded = ConvProblem(16, 4, 4096, 4096, 4, 3, 3)
    assert direct._planes(unpadded, direct.choose_blocking(unpadded)).source == "in place"
    assert direct.workspace_bytes(unpadded) == 0
    # The padded input is still gathered: in place reads x itself, which has no padding.
    assert direct._planes(big, direct.choose_blocking(big)).source == "per item"
    with KNOBS.override(direct_in_place_max_bytes=0):
        assert direct._planes(unpadded, direct.choose_blocking(unpadded)).source == "per item"

    # What is allocated is what is reported: the buffers run() asks numpy for.
    sizes = []
    real_zeros, real_empty = np.zeros, np.empty

    def spy(real):
        def allocate(shape, dtype=float, *args, **kwargs):
            array = real(shape, dtype, *args, **kwargs)
            sizes.append(array.nbytes)
            return array
        return allocate

    monkeypatch.setattr(direct.np, "zeros", spy(real_zeros))
    monkeypatch.setattr(direct.np, "empty", spy(real_empty))
    problem = ConvProblem(1, 3, 300, 200, 2, 3, 3, padding=(1, 1, 1, 1))
    x, w, _ = random_arrays(np.random.default_rng(0), problem)
    for knobs in ({}, {"direct_whole_input_max_bytes": 0, "direct_l2_input_budget": 64 * 1024}):
        with KNOBS.override(direct_serial_below_flops=0, **knobs):
            expected = direct.workspace_bytes(problem)
            sizes.clear()
            direct.run(problem, x, w, None, None)
        assert expected in sizes
    assert expected < problem.N * problem.C * 302 * 202 * 4 / 2


def test_blocking_choice():
    # C=K=4: a block that covers K exactly beats one that computes padded channels
    assert direct.choose_blocking(ConvProblem(8, 4, 256, 256, 4, 3, 3)).KB in (2, 4)
    # depthwise: one output channel per group
    assert direct.choose_blocking(ConvProblem(1, 8, 32, 32, 8, 3, 3, groups=8)).KB == 1


def test_empty_batch():
    problem = ConvProblem(0, 3, 8, 8, 4, 3, 3, padding=(1, 1, 1, 1))
    x = np.zeros(problem.x_shape, np.float32)
    w = np.ones(problem.w_shape, np.float32)
    assert direct.run(problem, x, w, None, None).shape == (0, 4, 8, 8)


def test_thread_count_does_not_change_the_result(rng):
    import numba

    problem = problem_for("wrapping-rows", "float64")
    x, w, b = random_arrays(rng, problem)
    threads = numba.get_num_threads()
    results = []
    for count in sorted({1, threads}):
        numba.set_num_threads(count)
        try:
            with KNOBS.override(direct_serial_below_flops=0):
                results.append(direct.run(problem, x, w, b, None))
        finally:
            numba.set_num_threads(threads)
        assert numba.get_num_threads() == threads
    assert all(np.array_equal(results[0], r) for r in results[1:])


def test_small_problems_leave_the_thread_count_alone(rng):
    import numba

    problem = problem_for("tiny-image", "float32")
    assert problem.flops < KNOBS.direct_serial_below_flops
    threads = numba.get_num_threads()
    x, w, b = random_arrays(rng, problem)
    direct.run(problem, x, w, b, None)
    assert numba.get_num_threads() == threads
