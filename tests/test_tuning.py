"""choose_algorithm(measure=True) and the tuning cache: remembered, versioned, never trusted blindly."""

from __future__ import annotations

import json

import numpy as np
import pytest

import convlib
from convlib.core.problem import make_backward_data_problem, make_backward_weight_problem
from convlib.dispatch import tuning
from convlib.dispatch.select import rule_choice
from convlib.dispatch.devices import resolve_device


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVLIB_CACHE_DIR", str(tmp_path))
    tuning.forget_measurements()
    yield tmp_path
    tuning.forget_measurements()


def cpu_key(problem):
    """The tuning cache's key for ``problem`` on this machine's CPU."""
    return tuning.problem_key("conv2d", problem, resolve_device("cpu").identity)


def _arrays():
    return np.ones((1, 4, 10, 10), np.float32), np.ones((8, 4, 3, 3), np.float32)


def test_measure_times_candidates_and_remembers(cache_dir):
    x, w = _arrays()
    choice = convlib.choose_algorithm(x, w, padding=1, measure=True, repeats=1)
    assert set(choice.timings) == set(choice.candidates) and choice.algo in choice.candidates
    assert choice.timings[choice.algo] == min(choice.timings.values())
    data = json.loads((cache_dir / "tuning.json").read_text())
    assert data["format"] == tuning.FORMAT_VERSION and len(data["entries"]) == 1
    # A new process (simulated by forgetting the in-memory copy) reads the winner from the file.
    tuning.forget_measurements()
    again = convlib.choose_algorithm(x, w, padding=1)
    assert again.algo == choice.algo and "tuning cache" in again.reason


def test_auto_follows_the_remembered_choice(cache_dir):
    x, w = _arrays()
    problem = convlib.build_problem(x, w, padding=1)
    tuning.store(cpu_key(problem), "im2col", {"im2col": 1.0})
    tuning.forget_measurements()
    assert convlib.choose_algorithm(x, w, padding=1).algo == "im2col"
    assert convlib.choose_algorithm(x, w, padding=2).reason != "measured fastest on this machine (tuning cache)"


def test_a_half_precision_measurement_is_found_through_the_float32_twin(cache_dir):
    """``choose_algorithm(measure=True)`` on float16 data stores the float16 problem; ``conv2d``'s
    ``auto`` plans the float32 twin and passes the caller's dtype: both must meet at one key."""
    from dataclasses import replace
    from convlib.dispatch.select import choose
    x, w = _arrays()
    twin = convlib.build_problem(x, w, padding=1)
    half = replace(twin, dtype="float16")
    target = resolve_device("cpu")
    tuning.store(tuning.problem_key("conv2d", half, target.identity), "im2col", {"im2col": 1.0})
    tuning.forget_measurements()
    assert choose("conv2d", twin, target, dtype="float16").algo == "im2col"
    assert choose("conv2d", twin, target).reason != "measured fastest on this machine (tuning cache)"


@pytest.mark.parametrize("content", ["{not json", json.dumps([1, 2]), json.dumps({"format": 999, "entries": {}})])
def test_corrupt_or_foreign_cache_is_ignored(cache_dir, content):
    (cache_dir / "tuning.json").write_text(content)
    x, w = _arrays()
    with pytest.warns(RuntimeWarning) if content.startswith("{not") else _no_warning():
        choice = convlib.choose_algorithm(x, w, padding=1)
    assert "tuning cache" not in choice.reason
    # ... and a measurement replaces it with a valid file.
    convlib.choose_algorithm(x, w, padding=1, measure=True, repeats=1)
    assert json.loads((cache_dir / "tuning.json").read_text())["format"] == tuning.FORMAT_VERSION


def test_remembered_algo_that_cannot_serve_is_not_used(cache_dir):
    x, w = _arrays()
    problem = convlib.build_problem(x, w, stride=2)
    tuning.store(cpu_key(problem), "winograd", {"winograd": 1.0})
    tuning.forget_measurements()
    assert convlib.choose_algorithm(x, w, stride=2).algo != "winograd"


class _no_warning:
    def __enter__(self):
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


@pytest.mark.parametrize(
    "C, H, K, R, stride, padding, expected",
    [
        (256, 56, 64, 1, 1, 0, "blis"),  # pointwise: blis' packing is a plain copy
        (64, 56, 64, 1, 1, 0, "blis"),
        (3, 224, 64, 7, 2, 3, "direct"),  # the stem: few filters, short reduction
        (128, 56, 128, 3, 2, 1, "blis"),  # strided 3x3
        (64, 56, 64, 3, 1, 1, "winograd"),  # 3x3 stride 1 with many channels
        (24, 56, 144, 1, 1, 0, "blis"),  # MobileNetV2's pointwise expansion: short, but a plain copy to pack
        (8, 112, 64, 1, 1, 0, "direct"),  # ... with 8 channels, direct
        (3, 56, 64, 3, 1, 1, "direct"),  # a 3x3 layer with a reduction of 27: thin
    ],
)
def test_cpu_rules_on_resnet_layers(C, H, K, R, stride, padding, expected):
    """The rules of convlib.dispatch.select._cpu_rules, as measured on ResNet-50 v1.5 (docs/benchmarks.md)."""
    x = np.zeros((8, C, H, H), np.float32)
    w = np.zeros((K, C, R, R), np.float32)
    assert convlib.choose_algorithm(x, w, stride=stride, padding=padding).algo == expected


@pytest.mark.parametrize("min_image, expected", [(1, "winograd"), (14, "blis")])
def test_winograd_rule_respects_the_image_size(min_image, expected):
    """ResNet-50's 7x7 3x3 layer: F(4x4,3x3)'s tiles cover it as 8x8; where the knob asks for larger
    images (AVX-512 machines, measured) blis serves it, forward and backward data alike."""
    from convlib.cpu.tables import KNOBS

    x = np.zeros((8, 512, 7, 7), np.float32)
    w = np.zeros((512, 512, 3, 3), np.float32)
    with KNOBS.override(auto_winograd_min_image=min_image):
        assert convlib.choose_algorithm(x, w, padding=1).algo == expected
        problem = convlib.build_problem(x, w, padding=1)
        data_pass = make_backward_data_problem(problem.y_shape, w.shape, x.shape, np.float32, np.float32,
                                               padding=1)
        assert rule_choice(data_pass, "cpu", ["winograd", "blis"])[0] == expected


@pytest.mark.parametrize("C, expected", [(1, "blis"), (16, "direct")])
def test_data_pass_rule_into_one_channel(C, expected):
    """The data pass at stride 1 runs direct (the forward kernel on the rotated problem) where the
    forward's rules pick direct for that problem, but not into a single channel, where blis won."""
    problem = convlib.build_problem(np.zeros((32, C, 8, 8), np.float32), np.zeros((32, C, 3, 3), np.float32),
                                    padding=1)
    data_pass = make_backward_data_problem(problem.y_shape, (32, C, 3, 3), (32, C, 8, 8), np.float32, np.float32,
                                           padding=1)
    assert rule_choice(data_pass, "cpu", ["direct", "blis"])[0] == expected


@pytest.mark.parametrize("stride, expected", [(1, "depthwise"), (2, "blis")])
def test_data_pass_rule_for_depthwise_layers(stride, expected):
    """A depthwise layer's data pass at stride 1 runs the depthwise kernels (its rotated problem is
    depthwise, which the forward's rules give to depthwise); at stride 2, blis."""
    P = (56 + 2 - 3) // stride + 1
    data_pass = make_backward_data_problem((8, 144, P, P), (144, 1, 3, 3), (8, 144, 56, 56), np.float32, np.float32,
                                           stride=stride, padding=1, groups=144)
    assert rule_choice(data_pass, "cpu", ["direct", "blis", "depthwise"])[0] == expected


@pytest.mark.parametrize("C, K, groups, expected", [(96, 96, 96, "direct"), (3, 1, 1, "direct"), (1, 1, 1, "blis"),
                                                    (16, 32, 1, "blis"), (32, 64, 32, "direct"), (1, 16, 1, "direct"),
                                                    (1, 64, 1, "direct"), (16, 8, 1, "direct"), (3, 16, 1, "blis")])
def test_weight_pass_rule_for_few_filters_per_group(C, K, groups, expected):
    """The weight pass runs direct where each group has one filter, or (3x3 at stride 1 on short
    rows) few filters or one channel per group, and there are at least three (filter, channel)
    pairs for the threads to share; blis otherwise (many filters over several channels, or a single
    single-channel filter)."""
    problem = make_backward_weight_problem((8, C, 28, 28), (8, K, 28, 28), (K, C // groups, 3, 3), np.float32,
                                           np.float32, padding=1, groups=groups)
    assert rule_choice(problem, "cpu", ["direct", "blis"])[0] == expected


@pytest.mark.parametrize("stride, size, filter_size", [(2, 28, 3), (1, 112, 3), (1, 28, 5)])
def test_weight_pass_rule_keeps_few_filters_on_blis_off_the_wide_rows(stride, size, filter_size):
    """Few filters over several channels go to direct only where it sums a 3x3 filter's wide rows:
    not at stride 2, not on rows wider than the knob's, not for other filter sizes."""
    pad = filter_size // 2
    P = (size + 2 * pad - filter_size) // stride + 1
    problem = make_backward_weight_problem((8, 16, size, size), (8, 8, P, P), (8, 16, filter_size, filter_size),
                                           np.float32, np.float32, stride=stride, padding=pad)
    assert rule_choice(problem, "cpu", ["direct", "blis"])[0] == "blis"


# -- device identity: a measured choice is found again for the same device, never for another ----
def test_cpu_identity_is_stable_and_names_the_thread_count():
    import numba

    first, again = resolve_device("cpu").identity, resolve_device(None, np.ones(3)).identity
    assert first == again and "|" in first and "0x" not in first
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        one = resolve_device("cpu").identity
    finally:
        numba.set_num_threads(threads)
    assert (one == first) == (threads == 1)


def test_a_choice_measured_on_another_device_is_not_used(cache_dir):
    x, w = _arrays()
    problem = convlib.build_problem(x, w, padding=1)
    other = resolve_device("cpu").identity + "-but-another-machine"
    tuning.store(tuning.problem_key("conv2d", problem, other), "im2col", {"im2col": 1.0})
    tuning.forget_measurements()
    assert "tuning cache" not in convlib.choose_algorithm(x, w, padding=1).reason
    # ... while the same entry under this CPU's identity is used.
    tuning.store(cpu_key(problem), "im2col", {"im2col": 1.0})
    assert convlib.choose_algorithm(x, w, padding=1).algo == "im2col"


def test_an_old_format_cache_is_not_trusted(cache_dir):
    """Format 1 keyed devices by str(device): its entries are ignored, not misapplied."""
    x, w = _arrays()
    problem = convlib.build_problem(x, w, padding=1)
    fields = json.loads(tuning.problem_key("conv2d", problem, "cpu").split("|", 2)[2])
    old_key = "cpu|" + json.dumps(fields, sort_keys=True)
    (cache_dir / "tuning.json").write_text(json.dumps(
        {"format": 1, "convlib": convlib.__version__, "entries": {old_key: {"algo": "im2col", "timings": {}}}}))
    tuning.forget_measurements()
    assert "tuning cache" not in convlib.choose_algorithm(x, w, padding=1).reason
