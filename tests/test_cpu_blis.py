"""blis-specific tests: workspace bound, edge tiles, block loops, thread grids, the micro-kernel source.

The contract test (tests/test_contract.py) covers the shapes every algorithm must serve; these
drive the blis loops through small block sizes so that every loop runs several blocks with ragged
ends on small problems, and check that the workspace is what the blocking reports.
"""

from __future__ import annotations

import numpy as np
import pytest

from convlib.core.problem import ConvProblem
from convlib.cpu import blis, isa, micro_kernels, packing, tables
from convlib.cpu.tables import KNOBS, BlisBlocking, blis_blocking

from .conftest import random_arrays
from convlib.testing import TOLERANCE, conv2d_reference_for, relative_error

#: Tiny blocks: several jc, pc, ic, jr, ir iterations with ragged ends on small problems.
SMALL = {dtype: BlisBlocking(MC=6, KC=7, NC=16, MR=3, NR=8) for dtype in ("float32", "float64")}

# (N, C, H, W, K, R, S, stride, padding, dilation, groups, bias)
EDGE_CASES = {
    # PQ = 35: NR tiles straddle images; K = 7 leaves a 1-row tile; Kgemm = 45 a short pc block.
    "straddling-tiles": (3, 5, 7, 5, 7, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, True),
    "one-pixel-images": (5, 4, 3, 3, 5, 3, 3, (1, 1), (0, 0, 0, 0), (1, 1), 1, True),
    "one-column-images": (2, 3, 9, 1, 4, 3, 1, (1, 1), (1, 1, 0, 0), (1, 1), 1, False),
    "stride-dilation-asym-pad": (2, 3, 11, 13, 5, 3, 2, (2, 3), (2, 0, 1, 3), (2, 1), 1, True),
    "groups-odd-K": (2, 6, 6, 9, 9, 2, 3, (1, 1), (0, 1, 1, 0), (1, 1), 3, True),
    "depthwise": (2, 5, 8, 7, 5, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 5, False),
    "filter-fills-padded-input": (2, 2, 4, 5, 3, 6, 7, (1, 1), (1, 1, 1, 1), (1, 1), 1, True),
    "wide-padding": (1, 2, 3, 4, 3, 3, 3, (1, 1), (4, 3, 5, 6), (1, 1), 1, False),
    # W == Q with stride 1: the linear packing path (one copy per image and tap, padding columns
    # zeroed after), including reads that would fall before the start or past the end of x.
    "same-3x3-linear": (3, 3, 5, 5, 5, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, True),
    "same-5x4-dilated-linear": (2, 2, 6, 5, 4, 5, 4, (1, 1), (4, 4, 2, 1), (2, 1), 1, False),
    "same-asym-rows-linear": (2, 3, 5, 6, 6, 2, 3, (1, 1), (0, 2, 2, 0), (1, 1), 3, True),
    "linear-stride-h2-wide-pad": (2, 2, 4, 3, 3, 2, 2, (2, 1), (1, 0, 2, 2), (1, 1), 1, True),
    # 1x1, stride 1, no padding: the pointwise packing (taps outer); images of 35 and 1 pixels so
    # panels straddle images, groups so each group starts at another channel.
    "pointwise-straddling": (3, 6, 7, 5, 9, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 3, True),
    "pointwise-one-pixel": (11, 4, 1, 1, 5, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1, False),
    "pointwise-whole-panels": (2, 5, 4, 8, 3, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1, True),
    # 1x1 whose pixels all read inside the image, strided: the strided pointwise packing; the
    # declared bottom/right padding of the second is never read. The third reads its padding
    # (general packing).
    "pointwise-stride2": (3, 6, 7, 9, 9, 1, 1, (2, 2), (0, 0, 0, 0), (1, 1), 3, True),
    "pointwise-stride2x3-unread-pad": (2, 4, 9, 10, 5, 1, 1, (2, 3), (0, 1, 0, 2), (1, 1), 1, False),
    "pointwise-stride2-read-pad": (2, 3, 8, 8, 4, 1, 1, (2, 2), (0, 1, 0, 1), (1, 1), 1, True),
    # Stride 2 with output rows of 19 pixels: whole stride-2 vector copies, and scalar ones where
    # two vectors would read past the end of x.
    "stride2-3x3-long-rows": (2, 3, 12, 37, 5, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), 1, True),
}

#: Pointwise problems packed in several blocks of taps (C/groups > POINTWISE_TAP_BLOCK), with
#: panels straddling images at many offsets, run with the table's blocking (KC covers every tap).
POINTWISE_DEEP = {
    "14x14-like": ConvProblem(3, 40, 7, 7, 7, 1, 1, has_bias=True),
    "straddle-by-1": ConvProblem(4, 37, 3, 11, 5, 1, 1),
    "groups": ConvProblem(2, 68, 5, 9, 6, 1, 1, groups=2),
    "stride2-14x14-like": ConvProblem(3, 40, 14, 14, 9, 1, 1, stride=(2, 2), has_bias=True),
    "stride2-odd": ConvProblem(4, 37, 7, 11, 5, 1, 1, stride=(2, 2)),
    "stride2-groups": ConvProblem(2, 68, 9, 9, 6, 1, 1, stride=(2, 2), groups=2),
}


def _problem(case, dtype):
    N, C, H, W, K, R, S, stride, padding, dilation, groups, bias = EDGE_CASES[case]
    return ConvProblem(N, C, H, W, K, R, S, stride, padding, dilation, groups, dtype, bias)


def _check(problem, y, x, w, b):
    assert y.shape == problem.y_shape and y.dtype == np.dtype(problem.dtype)
    err = relative_error(y, conv2d_reference_for(problem, x, w, b))
    assert err <= TOLERANCE[problem.dtype], f"{problem.describe()}: relative error {err:.3e}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_small_blocks_match_reference(case, dtype, rng):
    problem = _problem(case, dtype)
    x, w, b = random_arrays(rng, problem)
    x0, w0 = x.copy(), w.copy()
    with KNOBS.override(blis_blocking=SMALL[dtype]):
        y = blis.run(problem, x, w, b)
    _check(problem, y, x, w, b)
    assert np.array_equal(x, x0) and np.array_equal(w, w0)


@pytest.mark.parametrize("threads", [1, 3, 4])
def test_thread_grids(threads, rng):
    # More partitions than threads is allowed; 3 and 4 reach the 3x1 / 1x3 / 2x2 grids.
    for case in ("straddling-tiles", "groups-odd-K", "same-3x3-linear", "pointwise-straddling"):
        problem = _problem(case, "float64")
        x, w, b = random_arrays(rng, problem)
        with KNOBS.override(blis_blocking=SMALL["float64"], blis_partitions=threads):
            y = blis.run(problem, x, w, b)
        _check(problem, y, x, w, b)


def test_thread_split_prefers_columns_for_large_images_and_rows_for_small():
    b = BlisBlocking(MC=96, KC=384, NC=1024, MR=3, NR=32)
    big = ConvProblem(8, 64, 56, 56, 64, 3, 3, padding=(1, 1, 1, 1))
    small = ConvProblem(8, 512, 7, 7, 512, 3, 3, padding=(1, 1, 1, 1))
    assert blis.thread_split(big, b, 2) == (1, 2)
    assert blis.thread_split(small, b, 2) == (2, 1)
    assert blis.thread_split(big, b, 1) == (1, 1)


def test_thread_split_weighs_packing_from_the_image():
    """B packed from the image costs ~4x a plain copy: a strided projection, where splitting the
    rows would make both threads pack all of B, is split by columns; the stride-1 1x1 layer of
    the same GEMM size (plain-GEMM packing) by rows."""
    b = BlisBlocking(MC=96, KC=384, NC=1024, MR=3, NR=32)
    projection = ConvProblem(8, 512, 28, 28, 1024, 1, 1, stride=(2, 2))
    pointwise = ConvProblem(8, 512, 14, 14, 1024, 1, 1)
    assert not projection.columns_are_the_image and pointwise.columns_are_the_image
    assert (projection.gemm_m, projection.gemm_n, projection.gemm_k) == (
        pointwise.gemm_m, pointwise.gemm_n, pointwise.gemm_k)
    assert blis.thread_split(projection, b, 2) == (1, 2)
    assert blis.thread_split(pointwise, b, 2) == (2, 1)


def test_packing_cost_counts_the_runs():
    """Each tap copies a run of pixels at a time: short output rows cost more per element (7x7
    outputs of a stride-2 layer, where splitting the rows makes both threads pack all of B, are
    split by columns), linear packing (whole images of a 'same' layer) less; gathered rows
    (AVX-512) cost the same whatever their width."""
    b = BlisBlocking(MC=96, KC=384, NC=1024, MR=6, NR=64)
    short = ConvProblem(8, 512, 14, 14, 512, 3, 3, stride=(2, 2), padding=(1, 1, 1, 1))
    long = ConvProblem(8, 128, 56, 56, 128, 3, 3, stride=(2, 2), padding=(1, 1, 1, 1))
    linear = ConvProblem(8, 512, 7, 7, 512, 3, 3, padding=(1, 1, 1, 1))
    assert blis.image_pack_cost(long, 64) > blis.image_pack_cost(linear, 64)
    by_rows_7 = KNOBS.blis_image_pack_cost_flops + KNOBS.blis_image_pack_run_cost_flops / 7
    if packing.host_gather_lanes(4):
        # AVX-512 gathers the 7-wide rows: a flat cost per element, cheap enough for both threads
        # to pack all of B; at the by-rows cost the columns would be split.
        assert blis.image_pack_cost(short, 64) == KNOBS.blis_gather_pack_cost_flops < by_rows_7
        assert blis.thread_split(short, b, 2) == (2, 1)
        with KNOBS.override(blis_gather_pack_cost_flops=by_rows_7):
            assert blis.thread_split(short, b, 2) == (1, 2)
    else:
        assert blis.image_pack_cost(short, 64) == by_rows_7 > blis.image_pack_cost(long, 64)
        assert blis.thread_split(short, b, 2) == (1, 2)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_table_blocking_matches_reference_on_many_tiles(dtype, rng):
    # The table's own blocking, with more than one jc block and a ragged last tile.
    problem = ConvProblem(3, 20, 23, 29, 37, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, dtype, True)
    x, w, b = random_arrays(rng, problem)
    _check(problem, blis.run(problem, x, w, b), x, w, b)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_last_tile_of_each_width(dtype, rng):
    """The table's blocking on images whose last column tile holds 1 column, one vector and one
    more, most of the tile, and all but one column: :func:`micro_kernel_columns` computes 1 to
    NR/lanes vectors of it (checked with threads splitting columns and rows)."""
    b = blis_blocking(dtype)
    lanes = micro_kernels.micro_kernel_lanes(b.MR, b.NR, np.dtype(dtype).itemsize)
    for tail in sorted({1, lanes + 1, b.NR - lanes + 1, b.NR - 1}):
        for N, C, K in ((1, 5, 2 * b.MR + 1), (3, 9, 5)):
            problem = ConvProblem(N, C, 2, b.NR + tail, K, 3, 3, padding=(0, 1, 1, 1), dtype=dtype,
                                  has_bias=True)
            assert problem.gemm_n // N % b.NR == tail
            x, w, bias = random_arrays(rng, problem)
            for threads in (1, 2):
                with KNOBS.override(blis_partitions=threads):
                    _check(problem, blis.run(problem, x, w, bias), x, w, bias)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_workspace_bytes_is_what_is_allocated(dtype, threads):
    problem = ConvProblem(4, 16, 30, 31, 24, 3, 3, padding=(1, 1, 1, 1), dtype=dtype)
    for blocking in (blis_blocking(dtype), SMALL[dtype]):
        arrays = blis.allocate_workspace(problem, blocking, threads)
        assert sum(a.nbytes for a in arrays.values()) == blocking.workspace_bytes(problem, threads)


@pytest.mark.parametrize("key", list(tables.all_blis_blockings()))
def test_workspace_is_independent_of_batch_and_image_size(key):
    blocking = tables.all_blis_blockings()[key]
    dtype = key[1]
    problems = [
        ConvProblem(n, 64, h, h, 128, 3, 3, padding=(1, 1, 1, 1), dtype=dtype) for n in (8, 64) for h in (64, 512)
    ]
    sizes = {blocking.workspace_bytes(problem, 2) for problem in problems}
    assert len(sizes) == 1
    (size,) = sizes
    itemsize = np.dtype(dtype).itemsize
    b = blocking
    panels = (b.MC * b.KC + b.KC * b.NC + b.MR * b.NR) * itemsize
    assert size <= 2 * (panels + 64 * blocking.KC + 64 * blocking.NR)


def test_blocking_table_is_consistent():
    for blocking in tables.all_blis_blockings().values():
        assert blocking.MC % blocking.MR == 0 and blocking.NC % blocking.NR == 0
    with pytest.raises(ValueError):
        BlisBlocking(MC=10, KC=8, NC=16, MR=3, NR=8)


def test_micro_kernel_source_unrolls_rows_and_vectors():
    source = micro_kernels.render_micro_kernel(3, 32, 8)
    assert "def micro_kernel_3x32_of_32(" in source
    for i in range(3):
        for v in range(4):
            assert f"vector_fma(acc, {i * 32 + v * 8}, a, ap + {i}, b, bp + {v * 8}, 8)" in source
    assert "ap + 3," not in source and "bp + 32," not in source


def test_micro_kernel_fmas_go_rows_outer_where_the_registers_allow():
    # 6x64 in zmm: 24 accumulators + 4 vectors of B + 1 broadcast fit 32 registers, rows outer;
    # 3x32 in ymm (AVX2's 16 registers): 12 + 4 + 1 would not, vectors outer (12 + 3 + 1 do).
    assert micro_kernels.fma_rows_outer(6, 64, 16, registers=32)
    assert micro_kernels.fma_rows_outer(14, 32, 16, registers=32)
    assert not micro_kernels.fma_rows_outer(3, 32, 8, registers=16)
    assert not micro_kernels.fma_rows_outer(12, 32, 16, registers=16)
    source = micro_kernels.render_micro_kernel(6, 64, 16)
    fmas = [line.strip() for line in source.splitlines() if line.strip().startswith("vector_fma(")]
    rows = [int(line.split("ap + ")[1].split(",")[0]) for line in fmas]
    assert len(fmas) == 24
    if micro_kernels.fma_rows_outer(6, 64, 16):
        assert rows == sorted(rows)  # each row's four FMAs together
    else:
        assert rows[:6] == list(range(6))  # each vector's six rows together


def test_columns_micro_kernel_source_has_a_body_per_vector_count():
    source = micro_kernels.render_columns_micro_kernel(3, 32, 8)
    for v in (1, 2, 3, 4):
        assert f"def micro_kernel_3x{8 * v}_of_32(" in source
        # Each body reads rows of the 32-wide panel and only its own vectors.
        body = source.split(f"def micro_kernel_3x{8 * v}_of_32(")[1].split("\ndef ")[0]
        assert "bp = b_off + p * 32" in body and f"bp + {8 * (v - 1)}, 8)" in body and f"bp + {8 * v}, 8)" not in body
    assert "elif vectors == 3:" in source and "micro_kernel_3x32_of_32(kc" in source.split("else:")[-1]


def test_micro_kernel_lanes_divide_NR():
    for itemsize in (4, 8):
        for NR in (8, 12, 16, 32, 64):
            lanes = micro_kernels.micro_kernel_lanes(3, NR, itemsize)
            assert NR % lanes == 0 and lanes * itemsize <= isa.simd_bytes()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", list(POINTWISE_DEEP))
def test_pointwise_packing_in_tap_blocks(case, dtype, rng):
    """A panel's rows are packed one block of taps at a time: no copy may spill into rows that an
    earlier block already packed (a panel spanning two images once did)."""
    from dataclasses import replace

    problem = replace(POINTWISE_DEEP[case], dtype=dtype)
    assert problem.C_per_group > packing.POINTWISE_TAP_BLOCK
    x, w, b = random_arrays(rng, problem)
    _check(problem, blis.run(problem, x, w, b), x, w, b)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("stride", [(2, 2), (1, 2)])
def test_strided_rows_with_table_blocking(stride, dtype, rng):
    """Stride-2 columns packed with whole vectors (two loads, even lanes) at the table's NR:
    output rows longer than a panel, panels straddling images, reads up to the end of x."""
    problem = ConvProblem(3, 5, 21, 70, 7, 3, 3, stride=stride, padding=(1, 1, 1, 1),
                          dtype=dtype, has_bias=True)
    x, w, b = random_arrays(rng, problem)
    _check(problem, blis.run(problem, x, w, b), x, w, b)


#: Panels two 64-byte gathers wide for float32 (NR = 16) and float64 (NR = 16 = two of 8 lanes).
GATHERED = BlisBlocking(MC=6, KC=7, NC=32, MR=3, NR=16)
#: The edge cases packed by the general routine (not the linear or pointwise ones), all narrower
#: than ``blis_gather_below_width``.
GATHER_CASES = [c for c in EDGE_CASES if "linear" not in c and (not c.startswith("pointwise-") or "read-pad" in c)]


def _pack_both_ways():
    from numba import njit

    from convlib.cpu.packing import cut_into_runs, fill_zeros_over, pack_b_by_gathers, pack_tap_by_rows, tabulate_taps

    @njit
    def pack_both(x, geo, NC, KC, NR, taps, runs, by_rows, by_gathers, mismatches):
        H, W, P, Q = geo.height, geo.width, geo.out_h, geo.out_w
        image = geo.channels * H * W
        PQ = P * Q
        Cg = geo.channels // geo.groups
        for g in range(geo.groups):
            for jc in range(0, geo.gemm_n, NC):
                nc = min(NC, geo.gemm_n - jc)
                for pc in range(0, geo.gemm_k, KC):
                    kc = min(KC, geo.gemm_k - pc)
                    by_rows[:] = np.nan
                    by_gathers[:] = np.nan
                    tabulate_taps(geo, g * Cg, pc, kc, taps)
                    n = jc // PQ
                    pq = jc - n * PQ
                    for panel_start in range(0, nc, NR):
                        width = min(NR, nc - panel_start)
                        n_runs, n, pq = cut_into_runs(runs, n, pq, width, PQ, Q, image, False)
                        for p in range(kc):
                            dst = panel_start * kc + p * NR
                            pack_tap_by_rows(x, H, W, geo.stride_h, geo.stride_w, taps[p], runs, n_runs, by_rows, dst)
                            if width < NR:
                                fill_zeros_over(by_rows, dst + width, NR - width)
                    pack_b_by_gathers(x, geo, image, jc, nc, kc, NR, taps, by_gathers)
                    used = (nc + NR - 1) // NR * NR * kc
                    for i in range(used):
                        if not by_rows[i] == by_gathers[i]:  # NaN: not written
                            mismatches += 1
        return mismatches

    return pack_both


@pytest.mark.skipif(isa.simd_bytes() < 64, reason="B is packed by gathers only where the machine has 64-byte vectors")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", GATHER_CASES)
def test_panels_packed_by_gathers_are_the_panels_packed_by_rows(case, dtype, rng):
    """Every element of every panel, the padding and the columns past the last pixel included,
    is what the by-rows routine writes; and the whole convolution packed so is right."""
    problem = _problem(case, dtype)
    assert problem.Q < tables.KNOBS.blis_gather_below_width
    x, w, b = random_arrays(rng, problem)
    geo = blis.geometry_of(problem)
    B = GATHERED
    size = B.KC * B.NC + 64
    taps = np.zeros((B.KC, packing.TAP_COLUMNS), np.int64)
    runs = np.zeros((B.NR, packing.RUN_COLUMNS), np.int64)
    mismatches = _pack_both_ways()(x.reshape(-1), geo, B.NC, B.KC, B.NR, taps, runs, np.empty(size, dtype),
                                   np.empty(size, dtype), 0)
    assert mismatches == 0
    with KNOBS.override(blis_blocking=B):
        _check(problem, blis.run(problem, x, w, b), x, w, b)


def test_geometry_types_as_numba_would_type_it():
    # The registered shortcut must give the type numba's own tuple typing infers from the values
    # (else kernels would compile for a signature no caller reaches, or mistype a field).
    from numba import typeof
    from numba.core.typing.typeof import Purpose, _TypeofContext, typeof_impl

    problem = ConvProblem(3, 6, 17, 19, 4, 3, 2, stride=(2, 1), padding=(1, 0, 2, 1), dilation=(1, 2),
                          groups=2, dtype="float32")
    geometry = blis.geometry_of(problem)
    generic = typeof_impl.dispatch(tuple)(geometry, _TypeofContext(Purpose.argument))
    assert typeof(geometry) == generic == blis.GEOMETRY_TYPE
