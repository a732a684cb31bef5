"""The CUDA backend: contract, device handling and result kinds.

Runs in three places:

* without numba-cuda (e.g. numba < 0.60): only the test that asking for CUDA says how to install
  it runs; everything else skips;
* under numba-cuda's simulator on any CPU (``NUMBA_ENABLE_CUDASIM=1 pytest tests/test_cuda.py``):
  tiny shapes, tiny blocks (the ``simulator_gemm_tiles`` knob of :mod:`convlib.cuda.tables`), a
  few seconds;
* on a GPU (``python -m convlib.bench.gpu_check``): the same tests with larger shapes, plus CuPy,
  PyTorch and numba device arrays, streams, non-contiguous inputs and both im2col GEMM engines.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import numpy as np
import pytest

import convlib
from convlib import BackendUnavailable
from convlib.dispatch.devices import get_backend
from convlib.core.precision import dtype_name, from_bfloat16_bits, host_bfloat16
from convlib.core.problem import ConvProblem
from convlib.cuda.tables import MmaTile

from convlib.testing import TOLERANCE, conv2d_reference_for, relative_error

HAS_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None
ALGOS = ("direct", "im2col", "blis")
WINOGRAD = ("winograd2", "winograd4")


def _cuda_state() -> str:
    """"none" (numba-cuda missing or no device), "simulator" or "gpu"."""
    if not HAS_NUMBA_CUDA or get_backend("cuda").unavailable_reason() is not None:
        return "none"
    from convlib.cuda.backend import simulator_active

    return "simulator" if simulator_active() else "gpu"


STATE = _cuda_state()
needs_cuda = pytest.mark.skipif(STATE == "none", reason="numba-cuda with a GPU or NUMBA_ENABLE_CUDASIM=1 needed")
needs_gpu = pytest.mark.skipif(STATE != "gpu", reason="needs a real CUDA GPU")
pytestmark = pytest.mark.cuda

# (N, C, H, W, K, R, S, stride, padding (top, bottom, left, right), dilation, groups, bias, dtype)
SIMULATOR_CASES = {
    "stride-asympad-dilation-groups-bias": (2, 4, 6, 5, 4, 3, 2, (2, 1), (1, 0, 2, 1), (1, 2), 2, True, "float32"),
    "depthwise-pad-f64": (1, 3, 5, 4, 3, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 3, False, "float64"),
    "1x1-stride2": (2, 3, 5, 5, 5, 1, 1, (2, 2), (0, 0, 0, 0), (1, 1), 1, True, "float32"),
    "1x1-padded-f64": (1, 2, 3, 4, 3, 1, 1, (1, 1), (1, 0, 0, 1), (1, 1), 1, False, "float64"),
    "unpadded-odd-K-f64": (1, 3, 5, 6, 5, 2, 3, (1, 1), (0, 0, 0, 0), (1, 1), 1, True, "float64"),
}
GPU_CASES = {
    **SIMULATOR_CASES,
    "3x3-pad1-many-tiles": (3, 20, 37, 45, 70, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, True, "float32"),
    "3x3-pad1-many-tiles-f64": (2, 20, 19, 33, 70, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, True, "float64"),
    "stem-7x7-s2": (2, 3, 45, 38, 64, 7, 7, (2, 2), (3, 3, 3, 3), (1, 1), 1, True, "float32"),
    "1x1-deep": (2, 256, 14, 14, 130, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1, False, "float32"),
    "1x1-s2-projection": (2, 64, 15, 15, 256, 1, 1, (2, 2), (0, 0, 0, 0), (1, 1), 1, True, "float32"),
    "groups4-dilation2": (2, 16, 21, 19, 32, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2), 4, True, "float32"),
    "depthwise-wide": (2, 40, 33, 131, 40, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 40, False, "float32"),
    "seed-like": (2, 4, 130, 260, 4, 3, 3, (1, 1), (0, 0, 0, 0), (1, 1), 1, False, "float32"),
    "huge-dilation-unstaged": (1, 2, 300, 300, 3, 3, 3, (1, 1), (0, 0, 0, 0), (140, 140), 1, True, "float32"),
    "filter-as-large-as-padded-input": (2, 2, 5, 4, 3, 5, 6, (1, 1), (0, 0, 1, 1), (1, 1), 1, True, "float64"),
}
# Winograd's shapes (3x3, stride 1): partial tiles at the bottom and right, asymmetric padding,
# groups, bias, both dtypes.
WINOGRAD_SIMULATOR_CASES = {
    "wino-pad1-bias-partial-tiles": (2, 3, 7, 9, 4, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, True, "float32"),
    "wino-asympad-groups-f64": (1, 4, 6, 5, 6, 3, 3, (1, 1), (0, 2, 1, 0), (1, 1), 2, False, "float64"),
}
WINOGRAD_GPU_CASES = {
    **WINOGRAD_SIMULATOR_CASES,
    "wino-resnet-like": (4, 64, 28, 28, 64, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, True, "float32"),
    "wino-odd-sizes-f64": (3, 20, 37, 45, 70, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, True, "float64"),
    "wino-unpadded-groups": (2, 16, 21, 19, 32, 3, 3, (1, 1), (0, 0, 0, 0), (1, 1), 4, False, "float32"),
}
CASES = GPU_CASES if STATE == "gpu" else SIMULATOR_CASES
WINOGRAD_CASES = WINOGRAD_GPU_CASES if STATE == "gpu" else WINOGRAD_SIMULATOR_CASES


def make_problem(name) -> ConvProblem:
    N, C, H, W, K, R, S, stride, padding, dilation, groups, bias, dtype = {**CASES, **WINOGRAD_CASES}[name]
    return ConvProblem(N, C, H, W, K, R, S, stride, padding, dilation, groups, dtype, bias)


def random_inputs(problem, seed=0):
    rng = np.random.default_rng(seed)
    dt = host_bfloat16() if problem.dtype == "bfloat16" else problem.dtype
    x = rng.standard_normal(problem.x_shape).astype(dt)
    w = rng.standard_normal(problem.w_shape).astype(dt)
    b = rng.standard_normal(problem.K).astype(dt) if problem.has_bias else None
    return x, w, b


def call(problem, x, w, b, algo, device="cuda"):
    return convlib.conv2d(
        x, w, b, stride=problem.stride, padding=problem.padding, dilation=problem.dilation,
        groups=problem.groups, algo=algo, device=device,
    )


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every array the CUDA algorithms allocate starts as NaN: an unwritten output cannot pass."""
    from convlib.cuda.backend import CudaTarget

    plain_empty = CudaTarget.empty

    def nan_empty(self, shape, dtype):
        arr = plain_empty(self, shape, dtype)
        if arr.size and dtype_name(dtype) == "bfloat16":  # held as bits: a quiet NaN's
            arr.copy_to_device(np.full(arr.shape, 0x7FC0, dtype=np.uint16))
        elif arr.size and np.dtype(dtype).kind == "f":  # integer workspaces (flags) hold no result
            arr.copy_to_device(np.full(arr.shape, np.nan, dtype=dtype))
        return arr

    monkeypatch.setattr(CudaTarget, "empty", nan_empty)


# -- contract -----------------------------------------------------------------------------------
@needs_cuda
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("algo", ALGOS)
def test_matches_reference(algo, case, poisoned_outputs):
    check_against_reference(algo, case)


def check_against_reference(algo, case):
    """numpy in, numpy out, within the dtype's tolerance of the float64 reference; inputs kept."""
    problem = make_problem(case)
    x, w, b = random_inputs(problem, seed=len(case))
    copies = [None if a is None else a.copy() for a in (x, w, b)]
    y = call(problem, x, w, b, algo)
    assert isinstance(y, np.ndarray) and y.shape == problem.y_shape and y.dtype == np.dtype(problem.dtype)
    err = relative_error(y, conv2d_reference_for(problem, x, w, b))
    assert err <= TOLERANCE[problem.dtype], f"cuda/{algo} {problem.describe()}: relative error {err:.3e}"
    for original, copy in zip((x, w, b), copies):
        assert original is None or np.array_equal(original, copy), "an input was modified"


@needs_cuda
@pytest.mark.parametrize("engine", ["own", "cublas"])
def test_im2col_engines(engine, poisoned_outputs):
    from convlib.cuda import tables
    from convlib.cuda.tables import KNOBS

    if engine == "cublas" and (STATE != "gpu" or not tables.cupy_available()):
        pytest.skip("cuBLAS through CuPy needs a GPU and CuPy")
    problem = make_problem("stride-asympad-dilation-groups-bias")
    x, w, b = random_inputs(problem, seed=3)
    with KNOBS.override(im2col_gemm=engine):
        assert tables.resolved_engine(STATE == "simulator") == engine
        y = call(problem, x, w, b, "im2col")
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE[problem.dtype]


@needs_cuda
@pytest.mark.parametrize("case", list(WINOGRAD_CASES))
@pytest.mark.parametrize("algo", WINOGRAD)
def test_winograd_matches_reference(algo, case, poisoned_outputs):
    check_against_reference(algo, case)


@needs_cuda
@pytest.mark.parametrize("engine", ["own", "cublas"])
def test_winograd_engines_and_chunks(engine, poisoned_outputs):
    """Both GEMM engines, with one chunk per image (a workspace cap of one byte)."""
    from convlib.cuda import tables
    from convlib.cuda.tables import KNOBS
    from convlib.cuda.winograd import F2

    if engine == "cublas" and (STATE != "gpu" or not tables.cupy_available()):
        pytest.skip("cuBLAS through CuPy needs a GPU and CuPy")
    problem = make_problem("wino-pad1-bias-partial-tiles")
    x, w, b = random_inputs(problem, seed=13)
    with KNOBS.override(im2col_gemm=engine), convlib.option_context(workspace_cap=1):
        assert F2.batch_chunk(problem) == 1
        y = call(problem, x, w, b, "winograd2")
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE[problem.dtype]


@needs_gpu
@pytest.mark.parametrize("algo", ["im2col", "winograd2"])
def test_allow_tf32_opts_into_tensor_cores(algo):
    """With CuPy's cuBLAS: exact FP32 by default, TF32's ~3e-4 error only when allowed -- so the
    opt-in demonstrably reaches the tensor cores."""
    from convlib.cuda import tables

    if not tables.cupy_available():
        pytest.skip("the TF32 path is cuBLAS through CuPy")
    problem = make_problem("wino-resnet-like")
    x, w, b = random_inputs(problem, seed=14)
    reference = conv2d_reference_for(problem, x, w, b)
    exact = relative_error(call(problem, x, w, b, algo), reference)
    tf32 = relative_error(convlib.conv2d(x, w, b, padding=1, algo=algo, device="cuda", allow_tf32=True), reference)
    assert exact <= TOLERANCE["float32"], f"exact FP32 by default: {exact:.2e}"
    assert 2e-5 < tf32 < 3e-3, f"TF32 error {tf32:.2e} outside its expected range"
    assert convlib.options.allow_tf32 is False


@needs_gpu
def test_allow_tf32_leaves_winograd4_exact():
    """F(4x4,3x3) would amplify TF32's rounding tenfold (3e-3): it keeps exact FP32 GEMMs."""
    problem = make_problem("wino-resnet-like")
    x, w, b = random_inputs(problem, seed=15)
    y = convlib.conv2d(x, w, b, padding=1, algo="winograd4", device="cuda", allow_tf32=True)
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE["float32"]


@needs_cuda
def test_winograd_refuses_what_it_cannot_serve():
    x, w = np.ones((1, 2, 9, 9), np.float32), np.ones((3, 2, 3, 3), np.float32)
    with pytest.raises(NotImplementedError, match="stride 1"):
        convlib.conv2d(x, w, stride=2, algo="winograd", device="cuda")
    assert convlib.conv2d(x, w, stride=2, algo="auto", device="cuda").shape == (1, 3, 4, 4)


def test_auto_rules_on_cuda():
    """ResNet-sized 3x3 stride-1 layers go to Winograd, other GEMM-shaped ones to blis, thin ones
    to direct (the rules alone: no GPU needed)."""
    from convlib.dispatch.select import rule_choice

    everything = ["direct", "im2col", "blis", "winograd", "winograd2", "winograd4"]
    resnet_3x3 = ConvProblem(128, 128, 28, 28, 128, 3, 3, padding=(1, 1, 1, 1))
    strided = ConvProblem(128, 128, 28, 28, 128, 3, 3, stride=(2, 2), padding=(1, 1, 1, 1))
    small_batch = ConvProblem(1, 128, 7, 7, 128, 3, 3, padding=(1, 1, 1, 1))
    thin = ConvProblem(8, 4, 64, 64, 4, 3, 3)
    assert rule_choice(resnet_3x3, "cuda", everything)[0] == "winograd"
    assert rule_choice(resnet_3x3, "cuda", ["direct", "im2col", "blis"])[0] == "blis"
    assert rule_choice(strided, "cuda", ["direct", "im2col", "blis"])[0] == "blis"
    assert rule_choice(small_batch, "cuda", everything)[0] == "blis"
    assert rule_choice(thin, "cuda", everything)[0] == "direct"
    # half precisions: tensor-core blis, not Winograd's widened float32 copies
    assert rule_choice(replace(resnet_3x3, dtype="float16"), "cuda", everything)[0] == "blis"
    assert rule_choice(replace(thin, dtype="bfloat16"), "cuda", everything)[0] == "direct"


@pytest.mark.parametrize("cublas", [True, False])
def test_auto_takes_the_tf32_paths_of_3x3_layers_only_when_permitted(monkeypatch, cublas):
    """With ``allow_tf32`` a float32 3x3 stride-1 layer leaves exact F(4x4) for F(2x2) with cuBLAS
    TF32 GEMMs (14x14 and 7x7 images, cuBLAS present) or tensor-core blis (larger images, or no
    cuBLAS); without it, and for float64, Winograd F(4x4) as before. The permission keys the plans."""
    from convlib.dispatch import select

    monkeypatch.setattr(select, "_cublas_expected", lambda: cublas)
    everything = ["direct", "im2col", "blis", "winograd", "winograd2", "winograd4"]
    large = ConvProblem(128, 128, 28, 28, 128, 3, 3, padding=(1, 1, 1, 1))
    small = ConvProblem(128, 256, 14, 14, 256, 3, 3, padding=(1, 1, 1, 1))
    before = select.selection_state()
    with convlib.option_context(allow_tf32=True):
        assert select.selection_state() != before
        assert select.rule_choice(large, "cuda", everything)[0] == "blis"
        assert select.rule_choice(small, "cuda", everything)[0] == ("winograd2" if cublas else "blis")
        assert select.rule_choice(replace(small, dtype="float64"), "cuda", everything)[0] == "winograd"
        assert select.rule_choice(replace(small, dtype="float16"), "cuda", everything)[0] == "blis"
        thin = ConvProblem(8, 4, 64, 64, 4, 3, 3)
        assert select.rule_choice(thin, "cuda", everything)[0] == "direct"
    assert select.selection_state() == before
    assert select.rule_choice(large, "cuda", everything)[0] == "winograd"
    assert select.rule_choice(small, "cuda", everything)[0] == "winograd"


@pytest.mark.parametrize("cublas", [True, False])
def test_auto_multiplies_pointwise_layers_with_cublas_where_it_runs(monkeypatch, cublas):
    """1x1 layers with 14x14 or larger outputs go to im2col (at stride 1 its column matrix is the
    image; in float16 / bfloat16 only then, and without a bias) when im2col's GEMM is cuBLAS; to
    blis otherwise (our own GEMM, the simulator) and on 7x7 outputs."""
    from convlib.dispatch import select

    monkeypatch.setattr(select, "_cublas_expected", lambda: cublas)
    everything = ["direct", "im2col", "blis", "winograd", "winograd2", "winograd4"]
    pointwise = ConvProblem(128, 256, 28, 28, 128, 1, 1)
    assert select.rule_choice(pointwise, "cuda", everything)[0] == ("im2col" if cublas else "blis")
    for half in ("float16", "bfloat16"):
        # the half values multiplied in place by cuBLAS: not with a bias (a second rounding)
        assert select.rule_choice(replace(pointwise, dtype=half), "cuda", everything)[0] == ("im2col" if cublas else "blis")
        assert select.rule_choice(replace(pointwise, dtype=half, has_bias=True), "cuda", everything)[0] == "blis"
    projection = ConvProblem(128, 256, 56, 56, 512, 1, 1, stride=(2, 2))
    assert select.rule_choice(projection, "cuda", everything)[0] == ("im2col" if cublas else "blis")
    stage5 = ConvProblem(128, 2048, 7, 7, 512, 1, 1)
    assert select.rule_choice(stage5, "cuda", everything)[0] == "blis"
    assert select.rule_choice(replace(stage5, dtype="float16"), "cuda", everything)[0] == "blis"
    assert select.rule_choice(replace(projection, dtype="float16"), "cuda", everything)[0] == "blis"
    padded = ConvProblem(128, 256, 28, 28, 128, 1, 1, padding=(1, 1, 1, 1))
    assert select.rule_choice(padded, "cuda", everything)[0] == "blis"


def test_cublas_is_expected_only_with_cupy_outside_the_simulator(monkeypatch):
    from convlib.cuda import tables
    from convlib.dispatch import select

    monkeypatch.setattr(tables, "cupy_available", lambda: True)
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    assert not select._cublas_expected()
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")
    assert select._cublas_expected()
    with tables.KNOBS.override(im2col_gemm="own"):
        assert not select._cublas_expected()
    monkeypatch.setattr(tables, "cupy_available", lambda: False)
    assert not select._cublas_expected()
    with tables.KNOBS.override(im2col_gemm="cublas"):
        assert not select._cublas_expected()  # the call itself will say why it cannot run


@needs_cuda
def test_blis_without_tap_table():
    """Reductions too long for the constant-memory tap table decode taps by division instead."""
    from convlib.cuda import gemm
    from convlib.cuda.tables import KNOBS

    problem = make_problem("stride-asympad-dilation-groups-bias")
    assert gemm.build_tap_table(problem, 4, KNOBS.tap_table_bytes) is not None
    assert gemm.build_tap_table(problem, 4, 0) is None
    x, w, b = random_inputs(problem, seed=12)
    with KNOBS.override(tap_table_bytes=0):
        y = call(problem, x, w, b, "blis")
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE[problem.dtype]


#: Stride-1 float32 layers of few channels, which direct runs on its strip kernel: partial
#: strips and bands, filter channels in chunks that do not divide them, asymmetric padding (a
#: staged row starting before the image), groups, bias, a 1x1 and a 5x5 filter, outputs stored
#: as 16-byte words (rows of a multiple of 4), 8-byte ones (even rows) or one by one.
STRIP_CASES = {
    "strips-even-rows-no-pad": (2, 3, 9, 8, 3, 3, 3, (1, 1), (0, 0, 0, 0), (1, 1), 1, False),
    "strips-odd-K-asympad-bias": (2, 3, 11, 8, 3, 3, 3, (1, 1), (1, 0, 2, 1), (1, 1), 1, True),
    "strips-groups-words-out": (1, 4, 9, 8, 4, 3, 2, (1, 1), (0, 1, 1, 0), (1, 1), 2, False),
    "strips-5x5-one-channel": (2, 1, 8, 12, 1, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1), 1, True),
    "strips-1x1-tall": (1, 2, 13, 4, 3, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1, True),
}


@needs_cuda
@pytest.mark.parametrize("case", list(STRIP_CASES))
def test_direct_strip_and_staged_kernels_match_reference(case, poisoned_outputs):
    """direct's two kernels for stride-1 layers, the strip kernel (few channels; three layouts) and
    the staged one (the strip kernel turned off), each against the reference."""
    from convlib.cuda.direct import choose_strip
    from convlib.cuda.tables import KNOBS, DirectStrip

    problem = ConvProblem(*STRIP_CASES[case][:-1], "float32", STRIP_CASES[case][-1])
    x, w, b = random_inputs(problem, seed=len(case))
    reference = conv2d_reference_for(problem, x, w, b)
    simulator = STATE == "simulator"
    everywhere = {"direct_strip_min_width": 0, "direct_strip_min_work": 0}  # these shapes are tiny
    with KNOBS.override(**everywhere):
        assert choose_strip(problem, simulator) is not None
        results = {"strips": call(problem, x, w, b, "direct")}
    wide = DirectStrip(JPT=8, KB=4, threads=2, min_rows=1, max_rows=4)
    knob = "simulator_direct_strip" if simulator else "direct_strip"  # an override replaces every row
    with KNOBS.override(**everywhere, **{knob: wide}):
        assert choose_strip(problem, simulator) == wide
        results["strips, 8 columns"] = call(problem, x, w, b, "direct")
    two_ahead = DirectStrip(JPT=4, KB=2, threads=2, min_rows=2, max_rows=3, rows_ahead=2, unroll_channels=True)
    with KNOBS.override(**everywhere, **{knob: two_ahead}):
        assert choose_strip(problem, simulator) == two_ahead
        results["strips, two rows copied ahead, channels unrolled"] = call(problem, x, w, b, "direct")
    assert choose_strip(problem, simulator) is None  # narrower than direct_strip_min_width
    results["staged"] = call(problem, x, w, b, "direct")
    for kernel, y in results.items():
        err = relative_error(y, reference)
        assert err <= TOLERANCE[problem.dtype], f"direct ({kernel}) {problem.describe()}: relative error {err:.3e}"


@needs_cuda
def test_direct_strip_rule():
    """The strip kernel takes wide stride-1 float32 layers of few channels with enough work per
    pixel; the staged kernel the rest, and inputs off a 16-byte boundary (the strips' copies)."""
    from convlib.cuda import direct
    from convlib.cuda.direct_strips import strip_rows
    from convlib.cuda.tables import KNOBS

    seed_wide = ConvProblem(8, 4, 2048, 2048, 4, 3, 3)
    seed = ConvProblem(8, 4, 1024, 1024, 4, 3, 3)
    assert direct.choose_strip(seed_wide) == direct.choose_strip(seed) == KNOBS.lookup("direct_strip", "few")
    for refused in (ConvProblem(8, 4, 256, 256, 4, 3, 3),  # narrower than 512
                    ConvProblem(1, 1, 4096, 4096, 1, 3, 3, padding=(1, 1, 1, 1)),  # 9 multiply-adds a pixel
                    ConvProblem(8, 8, 2048, 2048, 8, 3, 3),  # more channels
                    ConvProblem(8, 4, 2048, 2048, 4, 3, 3, stride=(2, 2)),
                    ConvProblem(8, 4, 2048, 2046, 4, 3, 3),  # rows not of whole 16-byte words
                    ConvProblem(8, 4, 2048, 2048, 4, 3, 3, dtype="float64")):
        assert direct.choose_strip(refused) is None, refused.describe()
    filter5 = ConvProblem(1, 1, 4096, 4096, 1, 5, 5, padding=(2, 2, 2, 2))
    assert direct.choose_strip(filter5) == KNOBS.lookup("direct_strip", "one")
    depthwise5 = ConvProblem(2, 8, 1024, 1024, 8, 5, 5, padding=(2, 2, 2, 2), groups=8)
    assert direct.choose_strip(depthwise5) == KNOBS.lookup("direct_strip", "one")
    # An H100 or H200: 132 SMs x 6 blocks of the default layout. The seed shape, 1022 output rows
    # in 8 images x 4 bands of 256 columns: one round holds 792 // 32 = 24 strips a band, so
    # strips of 43 rows (24 x 32 = 768 blocks; 42 rows would need 25 strips, two rounds).
    few = KNOBS.lookup("direct_strip", "few")
    assert strip_rows(seed, few, 8, 792) == 43
    # 2046 output rows, 8 images x 8 bands: one round holds 12 strips a band, which would be 171
    # rows, longer than max_rows: many rounds of the shortest strips, min_rows.
    assert strip_rows(seed_wide, few, 8, 792) == few.min_rows == 16
    # Shorter than min_rows, the strip is the image.
    assert strip_rows(ConvProblem(8, 4, 12, 1024, 4, 3, 3), few, 8, 792) == 10
    # A 5x5 filter on 4096^2 padded by 2 (4096 rows, 8 bands of 512 columns; 132 SMs x 4 blocks):
    # one round holds 66 strips a band, of 63 rows.
    assert strip_rows(filter5, KNOBS.lookup("direct_strip", "one"), 1, 528) == 63
    if STATE == "gpu":
        _, launches = direct._plan(seed_wide, False, 132, KNOBS.state(), False)
        assert len(launches[0][2]) == 1, "an unaligned input must take the staged kernel"


@needs_cuda
def test_im2col_batch_chunks():
    """A workspace cap of one image forces one chunk per image."""
    problem = make_problem("1x1-stride2")
    x, w, b = random_inputs(problem, seed=4)
    with convlib.option_context(workspace_cap=1):
        assert problem.im2col_batch_chunk() == 1
        y = call(problem, x, w, b, "im2col")
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE[problem.dtype]


@needs_cuda
def test_im2col_of_a_pointwise_layer_builds_no_columns(monkeypatch):
    """1x1, stride 1, no padding: the GEMM reads x where it lies (no workspace, no column kernel)."""
    from convlib.cuda import im2col

    x = np.random.default_rng(5).standard_normal((3, 6, 5, 7)).astype(np.float32)
    w = np.random.default_rng(6).standard_normal((8, 3, 1, 1)).astype(np.float32)
    b = np.random.default_rng(7).standard_normal(8).astype(np.float32)
    problem = convlib.build_problem(x, w, b, groups=2)
    assert im2col.workspace_bytes(problem) == 0

    def no_columns(*args, **kwargs):
        raise AssertionError("a column matrix was built")

    monkeypatch.setattr(im2col, "im2col_kernel", no_columns)
    y = convlib.conv2d(x, w, b, groups=2, algo="im2col", device="cuda")
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE["float32"]


@needs_cuda
@pytest.mark.parametrize("algo", ALGOS + WINOGRAD)
def test_empty_batch(algo):
    y = convlib.conv2d(np.zeros((0, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32), algo=algo, device="cuda")
    assert isinstance(y, np.ndarray) and y.shape == (0, 3, 3, 3)


# -- devices --------------------------------------------------------------------------------------
@needs_cuda
def test_devices_and_algorithms():
    assert "cuda:0" in convlib.devices()
    assert convlib.algorithms("cuda") == list(ALGOS) + ["winograd", *WINOGRAD]
    assert convlib.algorithms("cuda:0") == list(ALGOS) + ["winograd", *WINOGRAD]


@needs_cuda
@pytest.mark.parametrize("spec, message", [("cuda:99", "CUDA device"), ("cuda:x", "cuda:N")])
def test_bad_device_strings(spec, message):
    x, w = np.ones((1, 1, 4, 4), np.float32), np.ones((1, 1, 3, 3), np.float32)
    with pytest.raises(ValueError, match=message):
        convlib.conv2d(x, w, device=spec)


@needs_cuda
def test_auto_runs_on_cuda():
    problem = make_problem("1x1-stride2")
    x, w, b = random_inputs(problem, seed=5)
    y = call(problem, x, w, b, "auto", device="cuda:0")
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE[problem.dtype]


@needs_cuda
@pytest.mark.parametrize("algo", ALGOS)
def test_device_arrays_in_device_array_out(algo):
    """Below the API (which needs ``__cuda_array_interface__``, absent from the simulator's arrays):
    device arrays in, a device array out, no host copy."""
    from numba import cuda

    from convlib.dispatch import registry

    problem = make_problem("1x1-padded-f64")
    x, w, b = random_inputs(problem, seed=6)
    backend = get_backend("cuda")
    dx, dw = cuda.to_device(x), cuda.to_device(w)
    target = backend.resolve("cuda", [dx, dw])
    xd, wd = backend.prepare(dx, problem.dtype, target), backend.prepare(dw, problem.dtype, target)
    assert xd is dx or STATE == "gpu"  # the simulator's arrays pass through untouched
    y = registry.implementation("conv2d", "cuda", algo).run(problem, xd, wd, None, target)
    out = backend.finish(y, dx, target)
    assert not isinstance(out, np.ndarray) and out.shape == problem.y_shape
    assert relative_error(out.copy_to_host(), conv2d_reference_for(problem, x, w, None)) <= TOLERANCE[problem.dtype]


def test_missing_numba_cuda_says_how_to_install(monkeypatch):
    """Without numba-cuda (forced here), ``device="cuda"`` explains the install."""
    from convlib.cuda import backend

    monkeypatch.setattr(backend, "_numba_cuda_installed", lambda: False)
    with pytest.raises(BackendUnavailable, match=r"pip install 'convlib\[cuda\]'"):
        convlib.conv2d(np.ones((1, 1, 3, 3)), np.ones((1, 1, 2, 2)), device="cuda")


@pytest.mark.skipif(not HAS_NUMBA_CUDA, reason="numba-cuda not installed")
def test_row_stack_workaround_still_needed():
    """convlib.cuda.launch restores ``np.row_stack`` for numba-cuda; fails once that is pointless."""
    import inspect

    from convlib.cuda import launch

    if not launch.ROW_STACK_SHIM:
        pytest.skip("this numpy still has np.row_stack")
    from numba.cuda.np import arrayobj

    assert "np.row_stack" in inspect.getsource(arrayobj), (
        "numba-cuda no longer uses np.row_stack: remove ROW_STACK_SHIM from convlib/cuda/launch.py"
    )


# -- float16 and bfloat16 ------------------------------------------------------------------------
HALVES = ("float16", "bfloat16")


def half_problem(case, dtype) -> ConvProblem:
    """``case`` in ``dtype``; skips bfloat16 where numpy has no host bfloat16 (ml_dtypes)."""
    if dtype == "bfloat16" and host_bfloat16() is None:
        pytest.skip("bfloat16 host arrays need ml_dtypes")
    return replace(make_problem(case), dtype=dtype)


@needs_cuda
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("algo", ALGOS + WINOGRAD)
def test_half_precisions_match_reference(algo, dtype, poisoned_outputs):
    """float16 / bfloat16 in, the same dtype out, within half an ulp of the exact result of the
    half-precision inputs (float32 accumulation, one rounding); inputs kept."""
    gpu = STATE == "gpu"
    if algo in ALGOS:
        case = "3x3-pad1-many-tiles" if gpu else "stride-asympad-dilation-groups-bias"
    else:
        case = "wino-resnet-like" if gpu else "wino-pad1-bias-partial-tiles"
    problem = half_problem(case, dtype)
    x, w, b = random_inputs(problem, seed=21)
    copies = [a.copy() for a in (x, w, b) if a is not None]
    y = call(problem, x, w, b, algo)
    assert isinstance(y, np.ndarray) and y.dtype == x.dtype and y.shape == problem.y_shape
    err = relative_error(y, conv2d_reference_for(problem, x, w, b))
    assert err <= TOLERANCE[dtype], f"cuda/{algo} {problem.describe()}: relative error {err:.3e}"
    for original, copy in zip((a for a in (x, w, b) if a is not None), copies):
        assert np.array_equal(original.view(np.uint16), copy.view(np.uint16)), "an input was modified"


def _round_once(values32, dtype):
    """``values32`` (float32) rounded to ``dtype`` by numpy / ml_dtypes, as bits: the reference of
    one rounding, independent of convlib's own conversions."""
    host = host_bfloat16() if dtype == "bfloat16" else np.dtype(dtype)
    return values32.astype(host).view(np.uint16)


@needs_cuda
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("algo", ALGOS)
def test_half_results_are_float32_sums_rounded_once(algo, dtype):
    """A 1x1 convolution adding two channels: every output is the float32 sum of two half values
    rounded once to the dtype, bit for bit (a sum in half precision, or a second rounding, differ
    on these inputs); a sum past the dtype's range is inf, a NaN input gives NaN."""
    half_problem("1x1-stride2", dtype)  # skips bfloat16 without a host bfloat16
    host = host_bfloat16() if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 2, 4, 64)) * 8).astype(host)
    biggest = np.finfo(np.float16).max if dtype == "float16" else from_bfloat16_bits(np.uint16(0x7F7F))
    x[0, :, 0, 0] = biggest
    x[0, 0, 0, 1] = np.nan
    w = np.ones((1, 2, 1, 1), host)
    y = convlib.conv2d(x, w, algo=algo, device="cuda")
    expected = _round_once(x[:, :1].astype(np.float32) + x[:, 1:].astype(np.float32), dtype)
    got = y.view(np.uint16)
    assert y.dtype == x.dtype and np.isposinf(y[0, 0, 0, 0].astype(np.float32)) and np.isnan(y[0, 0, 0, 1].astype(np.float32))
    finite = np.isfinite(y.astype(np.float32))
    assert np.array_equal(got[finite], expected[finite]), f"cuda/{algo}: not float32 sums rounded once"


@needs_gpu
@pytest.mark.parametrize("dtype", HALVES)
def test_half_pointwise_im2col_multiplies_the_half_values_in_place(monkeypatch, dtype):
    """A float16 / bfloat16 1x1 stride-1 layer without a bias: im2col's cuBLAS GEMM reads the half
    values where they lie (no widened copies, no workspace) and matches the reference; with a bias
    it widens, as before."""
    from convlib.cuda import half, im2col, tables

    if not tables.cupy_available():
        pytest.skip("cuBLAS through CuPy")
    problem = half_problem("1x1-deep", dtype)
    x, w, _ = random_inputs(replace(problem, dtype="float32"), seed=21)
    host = host_bfloat16() if dtype == "bfloat16" else np.dtype(dtype)
    x, w = x.astype(host), w.astype(host)
    problem = convlib.build_problem(x, w)
    assert im2col.runs_half_in_place(problem) and half.widened(im2col).workspace_bytes(problem) == 0
    reference = conv2d_reference_for(problem, x.astype(np.float32), w.astype(np.float32), None)
    real_widen = half.widen

    def no_widening(*args):
        raise AssertionError("widened")

    monkeypatch.setattr(half, "widen", no_widening)
    y = convlib.conv2d(x, w, algo="im2col", device="cuda")
    assert y.dtype == x.dtype
    assert relative_error(y.astype(np.float32), reference) <= TOLERANCE[dtype]
    monkeypatch.setattr(half, "widen", real_widen)
    b = np.ones(problem.K, host)
    with_bias = convlib.conv2d(x, w, b, algo="im2col", device="cuda")
    assert relative_error(with_bias.astype(np.float32), reference + 1) <= TOLERANCE[dtype]


# -- tensor cores (blis on mma.sync) ---------------------------------------------------------------
# (N, C, H, W, K, R, S, stride, padding, dilation, groups, bias), and how the kernel reads the
# operands in half precision (convlib.cuda.tensor_gemm.operand_layout).
TENSOR_SIMULATOR_CASES = {
    "tc-groups-asympad-dilation": ((2, 16, 6, 5, 20, 3, 2, (2, 1), (1, 0, 2, 1), (1, 2), 2, True), "channels_last"),
    "tc-1x1-stride2": ((2, 8, 5, 5, 5, 1, 1, (2, 2), (0, 0, 0, 0), (1, 1), 1, True), "channels_last"),
    "tc-long-reduction-odd-K": ((1, 24, 4, 4, 17, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, False), "channels_last"),
    "tc-odd-channels-nchw": ((2, 5, 6, 5, 6, 3, 2, (1, 1), (1, 0, 0, 1), (1, 1), 1, True), "nchw"),
    "tc-1x1-pixels-in-place": ((3, 16, 4, 6, 20, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1, True), "pixels"),
    "tc-1x1-pixels-groups-long": ((2, 80, 4, 4, 12, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 2, False), "pixels"),
}
TENSOR_GPU_CASES = {
    **TENSOR_SIMULATOR_CASES,
    "tc-resnet-3x3": ((4, 64, 28, 28, 128, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, True), "channels_last"),
    "tc-1x1-deep-odd-K": ((2, 256, 14, 14, 130, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1, False), "channels_last"),
    "tc-1x1-resnet-pixels": ((3, 256, 28, 28, 130, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1, True), "pixels"),
    "tc-stem-7x7-s2": ((2, 3, 45, 38, 64, 7, 7, (2, 2), (3, 3, 3, 3), (1, 1), 1, True), "nchw"),
    "tc-many-tiles-odd": ((3, 20, 37, 45, 70, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, True), "nchw"),
}
TENSOR_CASES = TENSOR_GPU_CASES if STATE == "gpu" else TENSOR_SIMULATOR_CASES
#: TF32 keeps 10 of float32's 23 mantissa bits: errors of a few 1e-4 (cuDNN's TF32: 2.9e-4 on
#: ResNet-50's layers, docs/gpu.md); below 2e-5 the products were not rounded at all.
TF32_RANGE = (2e-5, 3e-3)


def tensor_problem(case, dtype, N=None) -> ConvProblem:
    """The problem of ``TENSOR_GPU_CASES[case]`` in ``dtype`` (with ``N`` images when given)."""
    (n, C, H, W, K, R, S, stride, padding, dilation, groups, bias), _ = TENSOR_GPU_CASES[case]
    return ConvProblem(N or n, C, H, W, K, R, S, stride, padding, dilation, groups, dtype, bias)


def tensor_call(problem, x, w, b, **kwargs):
    """``convlib.conv2d`` of blis on ``problem``'s geometry."""
    return convlib.conv2d(x, w, b, stride=problem.stride, padding=problem.padding, dilation=problem.dilation,
                          groups=problem.groups, algo="blis", **kwargs)


def assert_tensor_core_result(precision, problem, x, w, b, y, what=""):
    """``y`` has the problem's shape and the inputs' dtype and matches the float64 reference:
    within TF32's range of error (neither exact nor worse than TF32 rounding) in TF32, within
    the dtype's tolerance in half precision."""
    assert y.dtype == x.dtype and y.shape == problem.y_shape
    err = relative_error(y, conv2d_reference_for(problem, x, w, b))
    if precision == "tf32":
        assert TF32_RANGE[0] < err < TF32_RANGE[1], f"TF32 error {err:.2e} outside {TF32_RANGE}"
    else:
        assert err <= TOLERANCE[problem.dtype], f"blis {precision} {what} {problem.describe()}: relative error {err:.3e}"


@needs_cuda
@pytest.mark.parametrize("case", list(TENSOR_CASES))
@pytest.mark.parametrize("precision", ["tf32", "float16", "bfloat16"])
def test_tensor_cores_match_reference(precision, case, poisoned_outputs):
    """blis on tensor cores, each way of reading the operands (in place by chunks of pixels,
    channels-last copies, NCHW element by element): within half an ulp of the exact result of
    the half inputs, or within TF32's range when ``allow_tf32`` asks for TF32; inputs kept."""
    from convlib.cuda import blis
    from convlib.cuda.tensor_gemm import operand_layout

    _, half_layout = TENSOR_CASES[case]
    dtype = "float32" if precision == "tf32" else precision
    if dtype == "bfloat16" and host_bfloat16() is None:
        pytest.skip("bfloat16 host arrays need ml_dtypes")
    problem = tensor_problem(case, dtype)
    if precision != "tf32":
        assert operand_layout(problem, precision) == half_layout
    x, w, b = random_inputs(problem, seed=23)
    copies = [a.copy() for a in (x, w, b) if a is not None]
    y = tensor_call(problem, x, w, b, device="cuda", allow_tf32=precision == "tf32")
    assert_tensor_core_result(precision, problem, x, w, b, y)
    for original, copy in zip((a for a in (x, w, b) if a is not None), copies):
        assert np.array_equal(original.view(np.uint8), copy.view(np.uint8)), "an input was modified"
    expected_workspace = 0
    if operand_layout(problem, precision) == "channels_last":
        itemsize = 4 if precision == "tf32" else 2
        expected_workspace = itemsize * (x.size + w.size)
    with convlib.option_context(allow_tf32=precision == "tf32"):
        assert blis.workspace_bytes(problem) == expected_workspace


@needs_cuda
def test_half_precision_blis_runs_natively():
    """float16 / bfloat16 blis is the module itself (tensor cores), not a float32 twin behind
    widening copies; the other algorithms keep the widening wrapper."""
    from convlib.cuda import blis
    from convlib.cuda.half import Widened
    from convlib.dispatch.plan import make_plan

    problem = ConvProblem(1, 8, 6, 6, 8, 3, 3, dtype="float16")
    assert make_plan("conv2d", problem, "cuda", "blis").implementation is blis
    assert isinstance(make_plan("conv2d", problem, "cuda", "im2col").implementation, Widened)
    # auto's rules see the dtype behind the float32 twin it is chosen for
    resnet_3x3 = ConvProblem(2, 64, 56, 56, 64, 3, 3, padding=(1, 1, 1, 1))
    assert make_plan("conv2d", resnet_3x3, "cuda", "auto").algorithm == "winograd"
    assert make_plan("conv2d", replace(resnet_3x3, dtype="float16"), "cuda", "auto").algorithm == "blis"


#: Tiles of the cp.async pipeline (3 and 4 shared stages): two warps, small enough for the
#: simulator.
COPY_TILES = {
    "3-stages": MmaTile(BM=32, BN=32, BKW=16, WM=16, WN=32, stages=3),
    "4-stages": MmaTile(BM=32, BN=32, BKW=16, WM=16, WN=32, stages=4),
}


@needs_cuda
@pytest.mark.parametrize("tile", list(COPY_TILES))
@pytest.mark.parametrize("case", ["tc-groups-asympad-dilation", "tc-long-reduction-odd-K", "tc-1x1-stride2",
                                  "tc-1x1-pixels-in-place"])
@pytest.mark.parametrize("precision", ["tf32", "float16", "bfloat16"])
def test_tensor_cores_copy_pipeline_matches_reference(precision, case, tile, poisoned_outputs):
    """blis on tensor cores with operands copied by cp.async into 3 or 4 shared stages (the
    channels-last kernel; the in-place one runs such a tile with two): the accuracy of
    test_tensor_cores_match_reference, over reductions of several steps, partial steps,
    partial tiles of filters and padding (chunks copied as zeros)."""
    from convlib.cuda.gemm import shape_key
    from convlib.cuda.tables import KNOBS
    from convlib.cuda.tensor_gemm import channels_last_source, copies_chunks, operand_layout

    dtype = "float32" if precision == "tf32" else precision
    if dtype == "bfloat16" and host_bfloat16() is None:
        pytest.skip("bfloat16 host arrays need ml_dtypes")
    problem = tensor_problem(case, dtype)
    layout = operand_layout(problem, precision)
    if copies_chunks(layout):  # the kernel really is the pipeline
        source, _ = channels_last_source(shape_key(problem), COPY_TILES[tile], precision, STATE != "gpu")
        assert "copy16(" in source and f"copy_wait_{COPY_TILES[tile].stages - 2}()" in source
    x, w, b = random_inputs(problem, seed=29)
    with KNOBS.override(mma_tile=COPY_TILES[tile]):
        y = tensor_call(problem, x, w, b, device="cuda", allow_tf32=precision == "tf32")
    err = relative_error(y, conv2d_reference_for(problem, x, w, b))
    if precision == "tf32":
        assert TF32_RANGE[0] < err < TF32_RANGE[1], f"TF32 error {err:.2e} outside {TF32_RANGE}"
    else:
        assert err <= TOLERANCE[dtype], f"blis {precision} {tile} {problem.describe()}: relative error {err:.3e}"


#: Split-K forced through the knobs: a count imposed (``mma_split``), or the rule pushed to split
#: (an aim of more blocks than the tiny problems have, one step a part at least).
SPLIT_KNOBS = {
    "3-parts": dict(mma_split=3),
    "rule": dict(mma_split_blocks_per_sm=10**6, mma_split_min_steps=1, mma_split_max=4, mma_split_min_gain=0),
}


#: Split-K's problems: channels-last reductions of 7 steps in half precision and 14 in TF32
#: (neither divides among 3 or 4 parts), with bias, groups, stride, padding and dilation, or
#: without bias and with a partial tile of filters.
SPLIT_CASES = {
    "groups-bias": ConvProblem(2, 48, 6, 5, 20, 3, 3, (2, 1), (1, 0, 2, 1), (1, 2), 2, has_bias=True),
    "odd-K-no-bias": tensor_problem("tc-long-reduction-odd-K", "float32"),
}


@needs_cuda
@pytest.mark.parametrize("split", list(SPLIT_KNOBS))
@pytest.mark.parametrize("tile", ["2-stages", "3-stages"])
@pytest.mark.parametrize("case", list(SPLIT_CASES))
@pytest.mark.parametrize("precision", ["tf32", "float16", "bfloat16"])
def test_tensor_cores_split_k_matches_reference(precision, case, tile, split, poisoned_outputs):
    """Split-K of the channels-last kernel: parts of the reduction (step counts that do not
    divide evenly among them: 7 steps in half precision, 14 in TF32, over 3 or 4 parts; with and
    without bias, groups) written as float32 partial outputs to a NaN-poisoned workspace, then
    summed in order, biased and rounded once into a NaN-poisoned output: the accuracy of
    test_tensor_cores_match_reference, and the workspace counted."""
    from convlib.cuda import blis
    from convlib.cuda.gemm import shape_key
    from convlib.cuda.tables import KNOBS
    from convlib.cuda.tensor_gemm import channels_last_source, operand_layout
    from convlib.cuda.tiles import choose_mma_split, reduction_steps

    dtype = "float32" if precision == "tf32" else precision
    if dtype == "bfloat16" and host_bfloat16() is None:
        pytest.skip("bfloat16 host arrays need ml_dtypes")
    problem = replace(SPLIT_CASES[case], dtype=dtype)
    assert operand_layout(problem, precision) == "channels_last"
    mma_tile = COPY_TILES["3-stages"] if tile == "3-stages" else KNOBS.simulator_mma_tiles[0]
    x, w, b = random_inputs(problem, seed=31)
    with KNOBS.override(mma_tile=mma_tile, **SPLIT_KNOBS[split]):
        splits = choose_mma_split(problem, mma_tile, precision, 1)
        steps = reduction_steps(problem, mma_tile, precision)
        assert splits == (3 if split == "3-parts" else 4) and steps % splits, (splits, steps)
        source, _ = channels_last_source(shape_key(problem), mma_tile, precision, STATE != "gpu", splits=splits)
        assert "kt_first" in source and "part_base" in source
        with convlib.option_context(allow_tf32=precision == "tf32"):
            copies = problem.itemsize * (x.size + w.size)
            assert blis.workspace_bytes(problem) == copies + 4 * splits * int(np.prod(problem.y_shape))
        y = tensor_call(problem, x, w, b, device="cuda", allow_tf32=precision == "tf32")
    assert_tensor_core_result(precision, problem, x, w, b, y, f"split {split}")


def test_split_k_rule():
    """Split-K's rule on an H200's 132 SMs (two 128 x 128 blocks an SM: 264 slots a wave):
    ResNet-50's stage-5 7x7 3x3 layers take 128 x 128 tiles cut in 4 parts (784 blocks: three
    full waves) rather than smaller whole tiles; 2 or 3 parts (no fuller waves), grids of a
    wave or more, parts of too few steps and mma_split_max=1 stay whole, and so does the
    source of a whole kernel (no part in it)."""
    from convlib.cuda.gemm import shape_key
    from convlib.cuda.tables import KNOBS
    from convlib.cuda.tensor_gemm import channels_last_source
    from convlib.cuda.tiles import choose_mma_split, choose_mma_tile

    big = MmaTile(BM=128, BN=128, BKW=16, WM=64, WN=64)
    s5 = ConvProblem(128, 512, 7, 7, 512, 3, 3, padding=(1, 1, 1, 1), dtype="float16")  # 196 blocks, 144 steps
    assert choose_mma_tile(s5, "float16", 132, copies=True, splits=True) == big
    assert choose_mma_split(s5, big, "float16", 132) == 4
    for knobs in (dict(mma_split_max=1), dict(mma_split_max=3), dict(mma_split_min_steps=100),
                  dict(mma_split_min_gain=0.5)):
        with KNOBS.override(**knobs):
            assert choose_mma_split(s5, big, "float16", 132) == 1, knobs
    with KNOBS.override(mma_split_max=1):
        assert choose_mma_tile(s5, "float16", 132, copies=True, splits=False) == MmaTile(128, 64, 16, 64, 32, stages=3)
    s4 = ConvProblem(128, 256, 14, 14, 256, 3, 3, padding=(1, 1, 1, 1), dtype="float16")
    assert choose_mma_split(s4, big, "float16", 132) == 1  # 392 blocks whole
    # 64 steps in float16: parts of 32 steps at most two, which fill no more: the tile stays
    # a smaller one (test_mma_tile_choice); 128 in TF32: four parts
    deep_1x1 = ConvProblem(128, 2048, 7, 7, 512, 1, 1, dtype="float16")
    assert choose_mma_split(deep_1x1, big, "float16", 132) == 1
    assert (choose_mma_tile(deep_1x1, "float16", 132, copies=True, splits=True)
            == choose_mma_tile(deep_1x1, "float16", 132, copies=True))
    assert choose_mma_split(replace(deep_1x1, dtype="float32"), big, "tf32", 132) == 4
    source, _ = channels_last_source(shape_key(s4), big, "float16", simulator=True)
    assert "SPLITS" not in source and "part" not in source


def test_mma_tile_choice():
    """The tensor-core tile on an H200's 132 SMs: 128 x 128 wherever its grid (split or not)
    gives every SM two blocks; where it does not, 128 x 64 before 64 x 128 (docs/gpu.md,
    "Tile choice"): ResNet-50's float16 7x7 1x1 2048>512 layer at batch 128 (196 blocks of
    128 x 128, 64 steps: too few to split) takes 128 x 64 whole, copied by cp.async in the
    channels-last kernel and register-staged where the kernel does not copy; 64 filters keep
    64 x 128, and a grid too small for two blocks an SM anyway takes the tile of most blocks."""
    from convlib.cuda.tiles import choose_mma_split, choose_mma_tile

    wide = MmaTile(BM=128, BN=64, BKW=16, WM=64, WN=32)
    deep_1x1 = ConvProblem(128, 2048, 7, 7, 512, 1, 1, dtype="float16")
    for precision in ("float16", "bfloat16"):
        problem = replace(deep_1x1, dtype=precision)
        assert choose_mma_tile(problem, precision, 132, copies=True, splits=True) == wide.with_stages(3)
        assert choose_mma_split(problem, wide.with_stages(3), precision, 132) == 1  # 392 blocks: a wave
        assert choose_mma_tile(problem, precision, 132) == wide
    # TF32: 128 steps, so 128 x 128 in 4 parts fills the waves
    assert choose_mma_tile(replace(deep_1x1, dtype="float32"), "tf32", 132, copies=True, splits=True).BM == 128
    # a grid of a wave or more keeps 128 x 128 (stage 4's 3x3: 392 blocks)
    s4 = ConvProblem(128, 256, 14, 14, 256, 3, 3, padding=(1, 1, 1, 1), dtype="float16")
    assert choose_mma_tile(s4, "float16", 132, copies=True, splits=True) == MmaTile(128, 128, 16, 64, 64)
    narrow = ConvProblem(128, 256, 56, 56, 64, 1, 1, dtype="float16")  # 64 filters: 3136 blocks of 64 x 128
    assert choose_mma_tile(narrow, "float16", 132, copies=True) == MmaTile(64, 128, 16, 32, 32, stages=3)
    tiny = ConvProblem(1, 512, 7, 7, 512, 1, 1, dtype="float16")  # one image: 16 blocks of 32 x 128, the most
    assert choose_mma_tile(tiny, "float16", 132, copies=True) == MmaTile(32, 128, 16, 32, 32, stages=3)


def test_in_place_kernel_rejects_a_tile_whose_pixel_units_do_not_divide():
    """A tile valid for the other kernels but whose units of B pixels leave threads without a
    whole share would leave part of B unloaded: generating it is an error, not a wrong product."""
    from convlib.cuda.tensor_gemm import _pixel_units
    tile = MmaTile(BM=128, BN=64, BKW=8, WM=64, WN=32).check()
    with pytest.raises(ValueError, match="units"):
        _pixel_units(("key",), tile, "float16", False)
    _pixel_units(("key",), MmaTile(BM=128, BN=128, BKW=16, WM=64, WN=64).check(), "float16", False)


def test_simulated_copies():
    """The simulator's cp.async copies four words, or writes four zeros for a copy of 0 bytes,
    and refuses chunks that are not 16-byte aligned."""
    from convlib.cuda.ptx import simulated_copy16

    source = np.arange(1, 9, dtype=np.uint32)
    shared = np.full(8, 99, np.uint32)
    simulated_copy16(shared, 4, source, 4, 16)
    simulated_copy16(shared, 0, source, 0, 0)
    assert shared.tolist() == [0, 0, 0, 0, 5, 6, 7, 8]
    with pytest.raises(AssertionError):
        simulated_copy16(shared, 2, source, 0, 16)


def test_simulated_mma_is_the_documented_fragment_layout():
    """The simulator's warp product, fed the fragments the PTX layout prescribes for random A
    (16 x 8 words) and B (8 x 8 words), gives each lane its elements of C + A @ B; in half
    precision each word is two consecutive k. (On a GPU the contract tests check the hardware
    against the same layout.)"""
    from convlib.cuda.ptx import FRAGMENT_WORDS, simulated_mma

    rng = np.random.default_rng(3)
    for precision in ("tf32", "float16", "bfloat16"):
        if precision == "tf32":
            a = rng.standard_normal((16, 8)).astype(np.float32)
            b = rng.standard_normal((8, 8)).astype(np.float32)
            a_words, b_words = a.view(np.uint32), b.view(np.uint32)
        else:
            a = rng.standard_normal((16, 16)).astype(np.float32)
            b = rng.standard_normal((16, 8)).astype(np.float32)
            if precision == "float16":
                a, b = a.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32)
                bits_a, bits_b = a.astype(np.float16).view(np.uint16), b.astype(np.float16).view(np.uint16)
            else:
                from convlib.core.precision import bfloat16_bits, from_bfloat16_bits

                bits_a, bits_b = bfloat16_bits(a), bfloat16_bits(b)
                a, b = from_bfloat16_bits(bits_a), from_bfloat16_bits(bits_b)
            a_words = bits_a[:, 0::2].astype(np.uint32) | (bits_a[:, 1::2].astype(np.uint32) << 16)
            b_words = bits_b[0::2, :].astype(np.uint32) | (bits_b[1::2, :].astype(np.uint32) << 16)
        c = rng.standard_normal((16, 8)).astype(np.float32)
        words = np.zeros(32 * FRAGMENT_WORDS, np.uint32)
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            words[lane * FRAGMENT_WORDS:(lane + 1) * FRAGMENT_WORDS] = [
                a_words[g, t], a_words[g + 8, t], a_words[g, t + 4], a_words[g + 8, t + 4], b_words[t, g], b_words[t + 4, g]]
        expected = c.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64)
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            cells = [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]
            d = simulated_mma(precision, words, 0, lane, *(c[cell] for cell in cells))
            np.testing.assert_allclose(d, [expected[cell] for cell in cells], rtol=1e-6, atol=1e-5)


def test_simulated_tf32_rounding():
    """``cvt.rna.tf32.f32`` as the simulator does it: 10 mantissa bits, ties away from zero,
    infinity and NaN kept."""
    from convlib.cuda.ptx import simulated_tf32_word

    def value(x):
        return float(np.array(simulated_tf32_word(np.float32(x)), np.uint32).view(np.float32))

    assert value(1 + 2**-11) == 1 + 2**-10  # a tie: away from zero
    assert value(-(1 + 2**-11)) == -(1 + 2**-10)
    assert value(1 + 2**-12) == 1.0
    assert value(1 + 3 * 2**-12) == 1 + 2**-10
    assert value(np.inf) == np.inf and np.isnan(value(np.nan))


@needs_cuda
@pytest.mark.parametrize("dtype", HALVES)
def test_half_precision_backward_passes(dtype):
    """The three gradients of a float16 / bfloat16 convolution, each in the input's dtype."""
    from convlib.testing import backward_reference_for

    problem = half_problem("stride-asympad-dilation-groups-bias", dtype)
    x, w, _ = random_inputs(problem, seed=22)
    rng = np.random.default_rng(23)
    dy = rng.standard_normal(problem.y_shape).astype(x.dtype)
    geometry = dict(stride=problem.stride, padding=problem.padding, dilation=problem.dilation, groups=problem.groups)
    results = {
        "conv2d_backward_data": (convlib.conv2d_backward_data(dy, w, problem.x_shape, device="cuda", **geometry), (dy, w)),
        "conv2d_backward_weight": (convlib.conv2d_backward_weight(x, dy, problem.w_shape, device="cuda", **geometry), (x, dy)),
        "conv2d_backward_bias": (convlib.conv2d_backward_bias(dy, device="cuda"), (dy,)),
    }
    for operation, (result, arrays) in results.items():
        reference = backward_reference_for(replace(problem, operation=operation, has_bias=False), *arrays)
        assert result.dtype == x.dtype, operation
        err = relative_error(result, reference)
        assert err <= TOLERANCE[dtype], f"cuda {operation} {dtype}: relative error {err:.3e}"


# -- GPU only: other libraries' arrays, streams, layouts ------------------------------------------
def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA")
    return torch


@needs_gpu
@pytest.mark.parametrize("algo", ALGOS + WINOGRAD)
def test_cupy_in_cupy_out(algo):
    cupy = pytest.importorskip("cupy")
    problem = make_problem("groups4-dilation2" if algo in ALGOS else "wino-unpadded-groups")
    x, w, b = random_inputs(problem, seed=7)
    y = call(problem, cupy.asarray(x), cupy.asarray(w), None if b is None else cupy.asarray(b), algo, device=None)
    assert isinstance(y, cupy.ndarray) and y.shape == problem.y_shape and y.dtype == np.float32
    assert relative_error(cupy.asnumpy(y), conv2d_reference_for(problem, x, w, b)) <= TOLERANCE["float32"]


@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_pieces_under_a_small_workspace_cap(dtype, poisoned_outputs):
    """A cap far below the problem's workspace cuts it into pieces, each written into the result
    on the call's stream: the result is whole and right."""
    problem = replace(make_problem("wino-pad1-bias-partial-tiles"), dtype=dtype)
    x, w, b = random_inputs(problem, seed=26)
    plan = convlib.dispatch.plan.make_plan("conv2d", problem, "cuda", "im2col")
    with convlib.option_context(workspace_cap=plan.workspace_bytes() // 3):
        assert len(plan.pieces(convlib.options.workspace_cap)) > 1
        y = call(problem, x, w, b, "im2col")
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE[dtype]


@needs_cuda
def test_tensor_core_copies_come_in_pieces_under_a_small_workspace_cap(poisoned_outputs):
    """The channels-last copies are blis's workspace: a cap below them cuts the batch into pieces."""
    case = "tc-groups-asympad-dilation"
    problem = tensor_problem(case, "float16", N=3)
    x, w, b = random_inputs(problem, seed=27)
    plan = convlib.dispatch.plan.make_plan("conv2d", problem, "cuda", "blis")
    assert TENSOR_CASES[case][1] == "channels_last" and plan.workspace_bytes() > 0
    with convlib.option_context(workspace_cap=plan.workspace_bytes() // 2):
        assert len(plan.pieces(convlib.options.workspace_cap)) > 1
        y = tensor_call(problem, x, w, b, device="cuda")
    assert relative_error(y, conv2d_reference_for(problem, x, w, b)) <= TOLERANCE["float16"]


@needs_gpu
def test_pieces_on_a_side_stream():
    """Pieces of a PyTorch call on a side stream (non-blocking) are written on that stream."""
    torch = _torch_cuda()
    problem = make_problem("3x3-pad1-many-tiles")
    x, w, b = random_inputs(problem, seed=27)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), convlib.option_context(workspace_cap=2**20):
        tx, tw, tb = (torch.from_numpy(a).cuda() for a in (x, w, b))
        ty = call(problem, tx, tw, tb, "im2col", device=None)
        result = ty.cpu()
    assert relative_error(result.numpy(), conv2d_reference_for(problem, x, w, b)) <= TOLERANCE["float32"]


@needs_gpu
@pytest.mark.parametrize("algo", ALGOS + WINOGRAD)
def test_torch_in_torch_out_on_a_side_stream(algo):
    torch = _torch_cuda()
    problem = make_problem("3x3-pad1-many-tiles")
    x, w, b = random_inputs(problem, seed=8)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        tx, tw, tb = (torch.from_numpy(a).cuda() for a in (x, w, b))
        ty = call(problem, tx, tw, tb, algo, device=None)
        result = ty.cpu()  # ordered on the same stream
    assert isinstance(ty, torch.Tensor) and ty.is_cuda and tuple(ty.shape) == problem.y_shape
    assert relative_error(result.numpy(), conv2d_reference_for(problem, x, w, b)) <= TOLERANCE["float32"]


@needs_gpu
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("algo", ALGOS + WINOGRAD)
def test_torch_half_tensors_in_and_out(algo, dtype):
    """PyTorch CUDA float16 / bfloat16 tensors in, a tensor of the same dtype out, within the
    dtype's tolerance of the float64 result of the same half-precision values."""
    torch = _torch_cuda()
    problem = replace(make_problem("3x3-pad1-many-tiles" if algo in ALGOS else "wino-resnet-like"), dtype=dtype)
    x, w, b = random_inputs(replace(problem, dtype="float32"), seed=24)
    tx, tw, tb = (torch.from_numpy(a).cuda().to(getattr(torch, dtype)) for a in (x, w, b))
    ty = call(problem, tx, tw, tb, algo, device=None)
    assert isinstance(ty, torch.Tensor) and ty.is_cuda and ty.dtype == tx.dtype and tuple(ty.shape) == problem.y_shape
    halves = [t.double().cpu().numpy() for t in (tx, tw, tb)]
    err = relative_error(ty.double().cpu().numpy(), conv2d_reference_for(problem, *halves))
    assert err <= TOLERANCE[dtype], f"cuda/{algo} {dtype}: relative error {err:.3e}"


@needs_gpu
@pytest.mark.parametrize("case", ["tc-resnet-3x3", "tc-1x1-resnet-pixels", "tc-many-tiles-odd"])
@pytest.mark.parametrize("dtype", HALVES)
def test_torch_half_tensors_on_tensor_cores(case, dtype):
    """PyTorch half tensors through each of blis's tensor-core operand layouts (their views as
    bits and words, and the channels-last copies from PyTorch's allocator)."""
    torch = _torch_cuda()
    problem = tensor_problem(case, dtype)
    x, w, b = random_inputs(replace(problem, dtype="float32"), seed=28)
    tx, tw, tb = (torch.from_numpy(a).cuda().to(getattr(torch, dtype)) for a in (x, w, b))
    ty = tensor_call(problem, tx, tw, tb)
    assert isinstance(ty, torch.Tensor) and ty.dtype == tx.dtype and tuple(ty.shape) == problem.y_shape
    halves = [t.double().cpu().numpy() for t in (tx, tw, tb)]
    err = relative_error(ty.double().cpu().numpy(), conv2d_reference_for(problem, *halves))
    assert err <= TOLERANCE[dtype], f"blis {dtype} {case}: relative error {err:.3e}"


@needs_gpu
def test_cupy_float16_in_cupy_float16_out():
    cupy = pytest.importorskip("cupy")
    problem = replace(make_problem("3x3-pad1-many-tiles"), dtype="float16")
    x, w, b = random_inputs(problem, seed=25)
    y = call(problem, cupy.asarray(x), cupy.asarray(w), cupy.asarray(b), "im2col", device=None)
    assert isinstance(y, cupy.ndarray) and y.dtype == np.float16
    assert relative_error(cupy.asnumpy(y), conv2d_reference_for(problem, x, w, b)) <= TOLERANCE["float16"]


@needs_gpu
@pytest.mark.parametrize("algo", ALGOS)
def test_non_contiguous_torch_inputs(algo):
    torch = _torch_cuda()
    problem = make_problem("1x1-s2-projection")
    x, w, b = random_inputs(problem, seed=9)
    # x as a transposed view of an NHWC tensor, w as a slice with a stride.
    tx = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 2, 3, 1))).cuda().permute(0, 3, 1, 2)
    tw_big = torch.zeros((problem.K * 2,) + problem.w_shape[1:], dtype=torch.float32).cuda()
    tw_big[::2] = torch.from_numpy(w).cuda()
    tw = tw_big[::2]
    assert not tx.is_contiguous() and not tw.is_contiguous()
    ty = call(problem, tx, tw, torch.from_numpy(b).cuda(), algo, device=None)
    assert relative_error(ty.cpu().numpy(), conv2d_reference_for(problem, x, w, b)) <= TOLERANCE["float32"]


@needs_gpu
def test_numba_device_arrays_through_the_api():
    from numba import cuda

    problem = make_problem("stem-7x7-s2")
    x, w, b = random_inputs(problem, seed=10)
    y = call(problem, cuda.to_device(x), cuda.to_device(w), cuda.to_device(b), "blis", device=None)
    assert cuda.is_cuda_array(y) and not isinstance(y, np.ndarray)
    assert relative_error(y.copy_to_host(), conv2d_reference_for(problem, x, w, b)) <= TOLERANCE["float32"]


@needs_gpu
def test_data_on_gpu_with_device_cpu_is_refused():
    cupy = pytest.importorskip("cupy")
    x, w = cupy.ones((1, 1, 4, 4), cupy.float32), cupy.ones((1, 1, 3, 3), cupy.float32)
    with pytest.raises(ValueError, match="contradicts"):
        convlib.conv2d(x, w, device="cpu")


@needs_gpu
def test_numpy_in_numpy_out_and_repeatable():
    problem = make_problem("seed-like")
    x, w, b = random_inputs(problem, seed=11)
    first = call(problem, x, w, b, "direct")
    second = call(problem, x, w, b, "direct")
    assert np.array_equal(first, second), "two runs on the same inputs differ: a race"
