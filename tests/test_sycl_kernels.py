"""The SYCL kernels: every algorithm (both im2col GEMMs) against the reference and the CPU backend,
dpnp inputs, work-group and panel sweeps down to one work-item, batch chunking, table clamping.

Skipped only when dpctl / numba_dpex are not importable; with the ``sycl`` extra installed a
missing SYCL device fails. Shapes are the contract test's, so the kernels compiled there are
reused (numba-dpex compiles each kernel once per process, 0.2-1 s).
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest

import convlib
from convlib import option_context
from convlib.core.problem import ConvProblem

from .conftest import random_arrays
from convlib.testing import TOLERANCE, conv2d_reference_for, relative_error
from .test_contract import CASES, make_case

pytestmark = [
    pytest.mark.sycl,
    pytest.mark.skipif(
        importlib.util.find_spec("dpctl") is None or importlib.util.find_spec("numba_dpex") is None,
        reason="the sycl extra (dpctl, numba-dpex) is not installed",
    ),
]

#: (algorithm, im2col GEMM engine or None)
VARIANTS = [("direct", None), ("im2col", "onemkl"), ("im2col", "kernel"), ("blis", None)]


@pytest.fixture(scope="module")
def mods():
    from convlib.sycl import runtime

    loaded = runtime.load()
    assert loaded.dpctl.get_devices(), "the sycl extra is installed but no SYCL device was found"
    return loaded


def run(problem, x, w, b, algo, gemm=None, device="sycl"):
    from convlib.sycl.tables import KNOBS

    kwargs = dict(stride=problem.stride, padding=problem.padding, dilation=problem.dilation,
                  groups=problem.groups, algo=algo, device=device)
    if gemm is None:
        return convlib.conv2d(x, w, b, **kwargs)
    with KNOBS.override(im2col_gemm=gemm):
        return convlib.conv2d(x, w, b, **kwargs)


def assert_close(y, problem, x, w, b):
    err = relative_error(np.asarray(y), conv2d_reference_for(problem, x, w, b))
    assert err <= TOLERANCE[problem.dtype], f"{problem.describe()}: relative error {err:.3e}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("algo, gemm", VARIANTS, ids=[a if g is None else f"{a}-{g}" for a, g in VARIANTS])
def test_dpnp_inputs_match_reference_and_cpu(mods, algo, gemm, case, dtype, rng):
    problem = make_case(case, dtype)
    x, w, b = random_arrays(rng, problem)
    dpnp = mods.dpnp
    y = run(problem, dpnp.asarray(x), dpnp.asarray(w), None if b is None else dpnp.asarray(b), algo, gemm, device=None)
    assert isinstance(y, dpnp.ndarray) and y.shape == problem.y_shape and y.dtype == np.dtype(dtype)
    y = dpnp.asnumpy(y)
    assert_close(y, problem, x, w, b)
    y_cpu = run(problem, x, w, b, "im2col", device="cpu")
    assert relative_error(y, y_cpu) <= 2 * TOLERANCE[dtype]


# One awkward problem for the sweeps: asymmetric padding, strides, dilation, groups, bias, odd sizes.
SWEEP = ConvProblem(2, 6, 11, 13, 10, 3, 2, stride=(2, 1), padding=(1, 2, 0, 1), dilation=(1, 2),
                    groups=2, dtype="float32", has_bias=True)


@pytest.mark.parametrize(
    "table",
    [
        dict(direct_wg=1, im2col_wg=1, gemm_wg=1, pack_wg=1),  # one work-item per group
        dict(direct_wg=3, im2col_wg=5, gemm_wg=7, pack_wg=3),  # groups that divide nothing
        dict(direct_wg=8192, im2col_wg=8192, gemm_wg=8192, pack_wg=8192),  # clamped to the device
        dict(blis_kc=1, blis_nc=5),  # one tap per panel, row segments of 5, 5, 2 pixels
        dict(blis_kc=5, blis_nc=7),  # panels cutting rows and taps unevenly (Q=13 > NC)
        dict(blis_nc=30),  # several whole output rows per panel
    ],
    ids=["wg1", "wg-odd", "wg-huge", "panel1", "panel-odd", "panel-rows"],
)
@pytest.mark.parametrize("algo, gemm", VARIANTS, ids=[a if g is None else f"{a}-{g}" for a, g in VARIANTS])
def test_blocking_sweeps(mods, algo, gemm, table, rng):
    from convlib.sycl.tables import KNOBS

    x, w, b = random_arrays(rng, SWEEP)
    with KNOBS.override(**table):
        y = run(SWEEP, x, w, b, algo, gemm)
    assert_close(y, SWEEP, x, w, b)


@pytest.mark.parametrize("gemm", ["onemkl", "kernel"])
def test_im2col_chunks_the_batch(mods, gemm, rng, monkeypatch):
    from convlib.sycl import memory

    problem = ConvProblem(5, 3, 9, 8, 4, 3, 3, padding=(1, 1, 1, 1), has_bias=True)
    x, w, b = random_arrays(rng, problem)
    shapes = []
    real_empty = memory.device_empty

    def spy(shape, dtype, queue, **kwargs):
        shapes.append(tuple(shape))
        return real_empty(shape, dtype, queue, **kwargs)

    monkeypatch.setattr("convlib.sycl.im2col.device_empty", spy)
    per_image = problem.C * problem.R * problem.S * problem.P * problem.Q * 4
    padded_copy = problem.N * problem.C * (problem.H + 2) * (problem.W + 2) * 4
    with option_context(workspace_cap=2 * per_image + padded_copy):
        y = run(problem, x, w, b, "im2col", gemm)
    assert_close(y, problem, x, w, b)
    assert (2, problem.C * problem.R * problem.S, problem.P * problem.Q) in shapes  # 2-image chunks


def test_blis_workspace_does_not_grow_with_the_image(mods, rng, monkeypatch):
    from convlib.sycl import memory
    from convlib.sycl.tables import KNOBS

    sizes = []
    real_empty = memory.device_empty
    monkeypatch.setattr("convlib.sycl.blis.device_empty",
                        lambda shape, dtype, queue, **kw: sizes.append(tuple(shape)) or real_empty(shape, dtype, queue, **kw))
    with KNOBS.override(blis_kc=16, blis_nc=32):
        for n, h in ((1, 8), (3, 20)):
            problem = ConvProblem(n, 4, h, h, 8, 3, 3, padding=(1, 1, 1, 1))
            x, w, b = random_arrays(rng, problem)
            assert_close(run(problem, x, w, b, "blis"), problem, x, w, b)
    panels = [s for s in sizes if len(s) == 2]
    assert len(panels) == 2 and all(kc * nc <= 16 * 32 for kc, nc in panels)


def test_kernel_factories_are_cached(mods):
    from convlib.sycl import blis, direct, im2col

    assert direct.direct_kernel(3, 3, 1, 4, "float32") is direct.direct_kernel(3, 3, 1, 4, "float32")
    assert im2col.gemm_kernel(8, "float64") is im2col.gemm_kernel(8, "float64")
    assert blis.pack_b_kernel() is blis.pack_b_kernel()


def test_unknown_gemm_engine():
    from convlib.sycl.tables import KNOBS

    with pytest.raises(ValueError, match="gemm='cublas'"):
        with KNOBS.override(im2col_gemm="cublas"):
            pass


def test_work_group_clamping():
    from convlib.sycl.launch import padded, register_block, row_work_group, work_group

    device = SimpleNamespace(max_work_group_size=256, local_mem_size=4096,
                             max_work_item_sizes1d=(256,), max_work_item_sizes2d=(64, 256),
                             max_work_item_sizes3d=(16, 64, 256))
    assert work_group(device, (1024,)) == (256,)
    assert work_group(device, (128, 128)) == (64, 4) or np.prod(work_group(device, (128, 128))) <= 256
    assert all(a <= b for a, b in zip(work_group(device, (32, 32, 512)), (16, 64, 256)))
    assert np.prod(work_group(device, (64,), local_bytes_per_item=64)) <= 4096 // 64
    assert work_group(device, (0, 5)) == (1, 5)
    assert row_work_group(device, 64, 7) == (8, 8)
    assert row_work_group(device, 64, 1000) == (1, 64)
    assert padded(10, 4) == 12 and padded(12, 4) == 12
    assert [register_block(k, 8) for k in (1, 3, 6, 12, 64, 70)] == [1, 1, 2, 4, 8, 2]
