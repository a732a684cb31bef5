"""The depthwise kernel's edges: its ways (channel blocks, whole planes, gathered planes, bands), channel multipliers,
strides (de-interleaved), dilations, padding never copied (masked taps, clipped runs, whole padding
rows), and the padding's 0 * w terms for non-finite w."""

from __future__ import annotations

import numpy as np
import pytest

import convlib
from convlib.core.problem import ConvProblem
from convlib.cpu import depthwise
from convlib.cpu.tables import KNOBS
from convlib.testing import TOLERANCE, conv2d_reference_for, relative_error

from .conftest import random_arrays

# (N, C, H, W, multiplier, R, S, stride, padding, dilation)
CASES = {
    "mobilenet-like": (2, 8, 12, 12, 1, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    "stride2-odd-width": (2, 6, 13, 11, 1, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),
    "multiplier3-stride3x2": (1, 4, 17, 19, 3, 5, 3, (3, 2), (2, 0, 1, 3), (1, 1)),
    "dilated": (3, 5, 10, 14, 2, 3, 3, (1, 2), (0, 2, 2, 0), (2, 2)),
    "padding-wider-than-image": (1, 3, 4, 5, 1, 7, 7, (1, 1), (6, 5, 6, 5), (1, 1)),
    "one-by-one-strided": (2, 4, 9, 9, 1, 1, 1, (2, 2), (0, 0, 0, 0), (1, 1)),
    "one-column": (2, 3, 8, 1, 1, 3, 1, (1, 1), (1, 1, 0, 0), (1, 1)),
    # Output the size of the image at stride 1: the whole-plane way.
    "same-7x7-plane": (3, 5, 7, 7, 1, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    "same-asymmetric-4x2": (2, 3, 9, 6, 2, 4, 2, (1, 1), (1, 2, 0, 1), (1, 1)),
    "same-dilated-5x5": (1, 4, 11, 13, 1, 5, 5, (1, 1), (4, 4, 4, 4), (2, 2)),
    "same-one-row": (2, 3, 1, 70, 1, 1, 5, (1, 1), (0, 0, 2, 2), (1, 1)),
}

#: The cases the whole-plane way serves (the others are gathered, or go by bands).
WHOLE_PLANE_CASES = ("mobilenet-like", "one-column", "same-7x7-plane", "same-asymmetric-4x2", "same-dilated-5x5", "same-one-row")


def problem_for(name, dtype) -> ConvProblem:
    N, C, H, W, m, R, S, stride, padding, dilation = CASES[name]
    return ConvProblem(N, C, H, W, C * m, R, S, stride, padding, dilation, C, dtype, True)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(case, dtype, rng):
    problem = problem_for(case, dtype)
    x, w, b = random_arrays(rng, problem)
    copies = x.copy(), w.copy(), b.copy()
    y = depthwise.run(problem, x, w, b)
    assert y.shape == problem.y_shape and y.dtype == np.dtype(dtype)
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE[dtype]
    assert all(np.array_equal(a, c) for a, c in zip((x, w, b), copies))


def test_each_case_takes_the_way_it_is_meant_to():
    for name in CASES:
        problem = problem_for(name, "float32")
        assert depthwise.uses_whole_planes(problem) == (name in WHOLE_PLANE_CASES), name
        assert not (depthwise.uses_whole_planes(problem) and depthwise.uses_gathered_planes(problem))
    assert depthwise.uses_gathered_planes(problem_for("stride2-odd-width", "float32"))


@pytest.mark.parametrize("case", [c for c in CASES if c not in WHOLE_PLANE_CASES])
def test_gathered_planes_and_bands_agree(case, rng):
    """The gathered way against the bands (a zero buffer budget forces bands) on every other case."""
    problem = problem_for(case, "float64")
    x, w, b = random_arrays(rng, problem)
    with KNOBS.override(depthwise_gather_bytes=1 << 30):
        assert depthwise.uses_gathered_planes(problem)
        gathered = depthwise.run(problem, x, w, b)
    with KNOBS.override(depthwise_gather_bytes=0):
        bands = depthwise.run(problem, x, w, b)
    np.testing.assert_allclose(gathered, bands, rtol=1e-12, atol=1e-12)
    assert relative_error(gathered, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE["float64"]


@pytest.mark.parametrize("case", WHOLE_PLANE_CASES)
def test_whole_planes_and_bands_agree(case, rng):
    """The same problem both ways (the mask budget at 0 forces bands); bands are checked against
    the reference above, and the two must agree to rounding."""
    problem = problem_for(case, "float64")
    x, w, b = random_arrays(rng, problem)
    planes = depthwise.run(problem, x, w, b)
    with KNOBS.override(depthwise_plane_mask_bytes=0):
        assert not depthwise.uses_whole_planes(problem)
        bands = depthwise.run(problem, x, w, b)
    np.testing.assert_allclose(planes, bands, rtol=1e-12, atol=1e-12)


#: Bands whose output rows are at least a block long: stored straight into y (in pairs of rows where
#: the row stride is a whole number of dilated filter rows), the last block of a row moved back to end at Q. (C, H, W, multiplier, R, S, stride, padding, dilation); W is set
#: per dtype where it says None (one block exactly).
WIDE_ROW_CASES = {
    "5x5-same": (2, 9, 300, 1, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1)),
    "7x7-stride2-dilated-multiplier2": (1, 20, 301, 2, 7, 3, (2, 2), (3, 1, 0, 4), (1, 2)),
    "one-block-exactly": (1, 6, None, 1, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    # Unit row stride: rows in pairs (an odd band leaves one row alone), here with column phases.
    "5x3-column-stride2-dilated": (1, 11, 280, 1, 5, 3, (1, 2), (2, 2, 1, 1), (1, 2)),
    # Row stride 3 = 3 filter rows: row p + 1 shares filter rows 3..6 of row p's (pairs); row stride
    # 2 at row dilation 2: one filter row (pairs); row stride 2 at row dilation 3: none shared.
    "7x5-row-stride3": (1, 23, 260, 1, 7, 5, (3, 1), (3, 3, 2, 2), (1, 1)),
    "5x3-stride2-dilated2": (1, 19, 270, 1, 5, 3, (2, 1), (4, 4, 1, 1), (2, 1)),
    "3x3-stride2-dilated3": (1, 19, 270, 1, 3, 3, (2, 1), (3, 3, 1, 1), (3, 1)),
}


@pytest.mark.parametrize("stream_min_bytes", [1 << 62, 0], ids=["plain-stores", "streaming-stores"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("band_bytes", [None, 1], ids=["bands-as-built", "one-row-bands"])
@pytest.mark.parametrize("case", list(WIDE_ROW_CASES))
def test_bands_of_wide_rows_match_reference(case, band_bytes, dtype, stream_min_bytes, rng):
    """Streaming stores go to the vectors that start on a vector boundary (every one where Q is a
    multiple of the vector, some rows' where it is not: 300 and 280 columns), plain ones elsewhere."""
    C, H, W, m, R, S, stride, padding, dilation = WIDE_ROW_CASES[case]
    block = depthwise.band_block(np.dtype(dtype).itemsize)[1]
    W = block if W is None else W
    problem = ConvProblem(1, C, H, W, C * m, R, S, stride, padding, dilation, C, dtype, True)
    assert problem.Q >= block
    x, w, b = random_arrays(rng, problem)
    overrides = {"depthwise_plane_mask_bytes": 0, "depthwise_gather_bytes": 0,
                 "direct_stream_min_bytes": stream_min_bytes}
    if band_bytes is not None:
        overrides["depthwise_band_bytes"] = band_bytes
    with KNOBS.override(**overrides):
        assert not (depthwise.uses_channel_blocks(problem) or depthwise.uses_whole_planes(problem)
                    or depthwise.uses_gathered_planes(problem))
        y = depthwise.run(problem, x, w, b)
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE[dtype]


def test_serves_depthwise_only():
    assert depthwise.supports(ConvProblem(1, 4, 5, 5, 8, 3, 3, groups=4)) is None
    assert "groups == C" in depthwise.supports(ConvProblem(1, 4, 5, 5, 8, 3, 3, groups=2))
    x, w = np.ones((1, 4, 5, 5), np.float32), np.ones((8, 2, 3, 3), np.float32)
    with pytest.raises(NotImplementedError, match="groups == C.*Algorithms that can: direct"):
        convlib.conv2d(x, w, groups=2, algo="depthwise")


def test_auto_picks_it_for_depthwise_layers_and_small_image_filters():
    x, w = np.ones((8, 96, 112, 112), np.float32), np.ones((96, 1, 3, 3), np.float32)
    assert convlib.choose_algorithm(x, w, stride=2, padding=1, groups=96).algo == "depthwise"
    image = np.ones((1, 1, 64, 64), np.float32)
    assert convlib.choose_algorithm(image, np.ones((1, 1, 5, 5), np.float32), padding=2).algo == "depthwise"
    assert convlib.choose_algorithm(image, np.ones((1, 1, 7, 7), np.float32), padding=3).algo == "depthwise"
    assert convlib.choose_algorithm(image, np.ones((1, 1, 9, 9), np.float32), padding=4).algo == "direct"


@pytest.mark.parametrize("case, gather_bytes", [("same-7x7-plane", None), ("stride2-odd-width", None),
                                                ("stride2-odd-width", 0)], ids=["whole", "gathered", "bands"])
@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_padding_terms_of_a_non_finite_weight(bad, case, gather_bytes, rng):
    """The definition multiplies the padding's zeros by every weight: 0 * inf and 0 * NaN are NaN.
    With tap (0, 0) of channel 2 infinite and x positive, channel 2 is +inf where that tap reads
    the image and NaN where it reads padding; a NaN weight makes the whole channel NaN."""
    problem = problem_for(case, "float64")
    x, w, b = random_arrays(rng, problem)
    x = np.abs(x) + 0.5
    finite_w = w.copy()
    finite_w[2, 0, 0, 0] = 0.0
    expected = conv2d_reference_for(problem, x, finite_w, b)
    p = np.arange(problem.P)[:, None] * problem.stride[0] - problem.pad_top
    q = np.arange(problem.Q)[None, :] * problem.stride[1] - problem.pad_left
    reads_padding = (p < 0) | (p >= problem.H) | (q < 0) | (q >= problem.W)
    expected[:, 2] = np.where(reads_padding, np.nan, np.inf) if bad == np.inf else np.nan
    w[2, 0, 0, 0] = bad
    if gather_bytes is None:
        y = depthwise.run(problem, x, w, b)
    else:
        with KNOBS.override(depthwise_gather_bytes=gather_bytes):
            y = depthwise.run(problem, x, w, b)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(expected))
    np.testing.assert_array_equal(np.isposinf(y), np.isposinf(expected))
    finite = np.isfinite(expected)
    assert finite[:, 2].sum() == 0 and relative_error(y[finite], expected[finite]) <= TOLERANCE["float64"]


#: The channel-blocked way: every case above, forced (a minimum of one filter), with the band
#: budget as built and at its minimum (one output row per band), so partial channel blocks, the
#: multiplier's gathered lanes, padding rows per band and every geometry go through it; with the
#: windowed steps of column strides 1 and 2 and without (the general step then serves them too).
@pytest.mark.parametrize("window", [True, False], ids=["windowed", "general-steps"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("band_bytes", [None, 1], ids=["bands-as-built", "one-row-bands"])
@pytest.mark.parametrize("case", list(CASES))
def test_channel_blocks_match_reference(case, band_bytes, dtype, window, rng):
    problem = problem_for(case, dtype)
    x, w, b = random_arrays(rng, problem)
    copies = x.copy(), w.copy(), b.copy()
    knobs = {"depthwise_channel_block_min_filters": 1, "depthwise_whole_plane_max_positions": 0,
             "depthwise_channel_block_window": window}
    if band_bytes is not None:
        knobs["depthwise_channel_block_bytes"] = band_bytes
    with KNOBS.override(**knobs):
        assert depthwise.uses_channel_blocks(problem)
        y = depthwise.run(problem, x, w, b)
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE[dtype]
    assert all(np.array_equal(a, c) for a, c in zip((x, w, b), copies))


# (C, H, W, stride, padding): whole channel blocks, planes not a multiple of a block of positions.
WIDE_CASES = {
    "mobilenet-7x7": (32, 7, 7, (1, 1), (1, 1, 1, 1)),
    "mobilenet-14x14-stride2": (48, 14, 14, (2, 2), (1, 1, 1, 1)),
    "odd-plane-and-channels": (37, 9, 13, (1, 2), (2, 0, 1, 1)),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", list(WIDE_CASES))
def test_channel_blocks_serve_wide_layers(case, dtype, rng):
    """Enough filters for whole blocks: the transposed copies in and out, and their remainders."""
    C, H, W, stride, padding = WIDE_CASES[case]
    problem = ConvProblem(3, C, H, W, C, 3, 3, stride, padding, (1, 1), C, dtype, True)
    x, w, b = random_arrays(rng, problem)
    with KNOBS.override(depthwise_whole_plane_max_positions=0):
        assert depthwise.uses_channel_blocks(problem)
        y = depthwise.run(problem, x, w, b)
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE[dtype]
    with KNOBS.override(depthwise_channel_block_min_filters=1 << 30):
        assert not depthwise.uses_channel_blocks(problem)
        np.testing.assert_allclose(depthwise.run(problem, x, w, b), y, rtol=1e-5 if dtype == "float32" else 1e-12,
                                   atol=1e-5 if dtype == "float32" else 1e-12)


# (C, H, W, stride, padding) -> the way that serves it with depthwise_whole_plane_max_positions at
# 256 (AVX-512's derived value; the test pins it so that it holds under AVX2's 1024 too).
WAY_CASES = {
    "mobilenet-14x14": ((96, 14, 14, (1, 1), (1, 1, 1, 1)), "whole planes"),
    "mobilenet-9x9": ((40, 9, 9, (1, 1), (1, 1, 1, 1)), "whole planes"),
    "mobilenet-7x7": ((40, 7, 7, (1, 1), (1, 1, 1, 1)), "channel blocks"),  # one block of positions
    "mobilenet-14x14-stride2": ((48, 14, 14, (2, 2), (1, 1, 1, 1)), "channel blocks"),
    "mobilenet-56x56": ((16, 56, 56, (1, 1), (1, 1, 1, 1)), "channel blocks"),
    "14x14-valid": ((32, 14, 14, (1, 1), (0, 0, 0, 0)), "channel blocks"),  # output smaller than the image
}


@pytest.mark.parametrize("case", list(WAY_CASES))
def test_small_stride_one_planes_take_whole_planes(case, rng):
    """Many filters on small stride-1 planes (more than a block of positions, up to
    ``depthwise_whole_plane_max_positions``) take the whole-plane way, the rest channel blocks;
    both match the reference and each other."""
    (C, H, W, stride, padding), way = WAY_CASES[case]
    problem = ConvProblem(2, C, H, W, C, 3, 3, stride, padding, (1, 1), C, "float64", True)
    x, w, b = random_arrays(rng, problem)
    with KNOBS.override(depthwise_whole_plane_max_positions=256):  # AVX-512's value (AVX2 derives 1024)
        assert depthwise.uses_channel_blocks(problem) == (way == "channel blocks")
        assert depthwise.uses_whole_planes(problem) == (way == "whole planes" or stride == (1, 1) and padding[0] == 1)
        y = depthwise.run(problem, x, w, b)
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE["float64"]
    with KNOBS.override(depthwise_whole_plane_max_positions=0):
        assert depthwise.uses_channel_blocks(problem)
        np.testing.assert_allclose(depthwise.run(problem, x, w, b), y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_channel_blocks_padding_terms_of_a_non_finite_weight(bad, rng):
    """As above for the channel-blocked way: its padding is zeros in the buffer, multiplied too."""
    C = 20
    problem = ConvProblem(2, C, 6, 7, C, 3, 3, (2, 1), (1, 1, 1, 1), (1, 1), C, "float64", True)
    x, w, b = random_arrays(rng, problem)
    x = np.abs(x) + 0.5
    finite_w = w.copy()
    finite_w[17, 0, 0, 0] = 0.0
    expected = conv2d_reference_for(problem, x, finite_w, b)
    p = np.arange(problem.P)[:, None] * problem.stride[0] - problem.pad_top
    q = np.arange(problem.Q)[None, :] * problem.stride[1] - problem.pad_left
    reads_padding = (p < 0) | (p >= problem.H) | (q < 0) | (q >= problem.W)
    expected[:, 17] = np.where(reads_padding, np.nan, np.inf) if bad == np.inf else np.nan
    w[17, 0, 0, 0] = bad
    assert depthwise.uses_channel_blocks(problem)
    y = depthwise.run(problem, x, w, b)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(expected))
    np.testing.assert_array_equal(np.isposinf(y), np.isposinf(expected))
    finite = np.isfinite(expected)
    assert relative_error(y[finite], expected[finite]) <= TOLERANCE["float64"]
