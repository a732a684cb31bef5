"""Smoke and consistency tests of ``python -m convlib.bench`` (no timing is asserted)."""

from __future__ import annotations

import csv
import json
import math
import sys
import types
from dataclasses import replace

import numpy as np
import pytest

from convlib import testing
from convlib.bench import check, runner, suites
from convlib.bench.__main__ import main
from convlib.core.timing import time_interleaved
from convlib.dispatch import registry
from convlib.core.problem import ConvProblem, make_problem

pytest.importorskip("torch")


def test_resnet50_layers_are_the_network():
    cases = suites.resnet50(batch=1)
    assert len(cases) == 23
    assert len({(c.problem.C, c.problem.H, c.problem.K, c.problem.R, c.problem.stride) for c in cases}) == 23
    assert sum(c.weight for c in cases) == 53  # 49 convolutions in the blocks, 3 projections + stage 2's, the stem
    # torchvision's resnet50 (v1.5): 4.09 G multiply-adds, of which the fc layer is 2 M.
    macs = sum(c.weight * c.problem.flops for c in cases) / 2
    assert 4.08e9 < macs < 4.09e9
    # v1.5: the strided 3x3 layers read the stage's input size and halve it.
    for c in cases:
        if c.problem.stride == (2, 2) and c.problem.R == 3:
            assert c.problem.P == c.problem.H // 2
    assert {c.label for c in suites.resnet50(quick=True)} == set(suites.RESNET50_QUICK)
    assert all(c.problem.N == 8 for c in suites.resnet50())


def test_seed_suites():
    batch = suites.seed_batch()
    assert [c.problem.N for c in batch] == list(range(8, 81, 8))
    assert all((c.problem.C, c.problem.K, c.problem.H, c.problem.R, c.problem.padding) == (4, 4, 1024, 3, (0,) * 4)
               for c in batch)
    assert [c.sweep_value for c in suites.seed_size()] == [64, 128, 256, 512, 1024, 2048, 4096]
    with pytest.raises(ValueError, match="--shape"):
        suites.build("custom")


def test_mobilenet_and_filters_suites():
    mobilenet = suites.mobilenet(batch=1)
    depthwise = [c for c in mobilenet if c.label.startswith("dw ")]
    pointwise = [c for c in mobilenet if c.label.startswith("pw ")]
    assert len(depthwise) + len(pointwise) == len(mobilenet)
    assert all(c.problem.groups == c.problem.C == c.problem.K and c.problem.R == 3 for c in depthwise)
    assert all(c.problem.groups == 1 and c.problem.R == 1 for c in pointwise)
    # torchvision's mobilenet_v2: 17 blocks, each a depthwise 3x3 and a projection, 16 of them with
    # an expansion (the first widens by 1, so has none), then the last 1x1 layer.
    assert sum(c.weight for c in depthwise) == 17
    assert sum(c.weight for c in pointwise) == 16 + 17 + 1
    assert {c.label for c in suites.mobilenet(quick=True)} == set(suites.MOBILENET_QUICK)
    filters = suites.filters()
    assert all((c.problem.N, c.problem.C, c.problem.K) == (1, 1, 1) for c in filters)
    assert all((c.problem.P, c.problem.Q) == (-(-c.problem.H // c.problem.stride[0]),) * 2 for c in filters)


@pytest.mark.parametrize("C, K, groups, stride, padding, dilation, bias", [
    (1, 1, 1, 1, 1, 1, False),      # 'same': filter2D's own zero border
    (1, 1, 1, 2, 1, 1, True),       # strided: every other output
    (1, 1, 1, 1, (0, 2, 1, 0), 1, False),  # asymmetric padding: explicit border, corner anchor
    (3, 3, 3, 2, 2, 2, True),       # per-channel, dilated
])
def test_opencv_baseline_matches_the_reference(C, K, groups, stride, padding, dilation, bias):
    pytest.importorskip("cv2")
    from convlib.bench.candidates import baseline_candidates
    from convlib.core.problem import make_problem

    dt = np.dtype("float32")
    problem = make_problem((2, C, 13, 11), (K, C // groups, 3, 3), (K,) if bias else None, dt, dt,
                           dt if bias else None, stride=stride, padding=padding, dilation=dilation, groups=groups)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(problem.x_shape).astype(dt)
    w = rng.standard_normal(problem.w_shape).astype(dt)
    b = rng.standard_normal(K).astype(dt) if bias else None
    [candidate] = baseline_candidates(problem, ["opencv"], x, w, b)
    y = candidate.call()
    ref = testing.conv2d_reference_for(problem, x, w, b, "float64")
    assert y.shape == ref.shape
    assert testing.relative_error(y, ref) <= testing.TOLERANCE["float32"]


def test_opencv_baseline_skips_what_filter2d_cannot_express():
    from convlib.bench.candidates import baseline_candidates

    problem = ConvProblem(1, 2, 8, 8, 3, 3, 3)
    x = np.zeros(problem.x_shape, np.float32)
    w = np.zeros(problem.w_shape, np.float32)
    [skipped] = baseline_candidates(problem, ["opencv"], x, w, None)
    assert skipped.status == "unsupported" and "C == K == 1" in skipped.note


def test_time_interleaved_round_robin_budget_and_errors():
    order = []

    def make(name):
        def call():
            order.append(name)
            return name
        return call

    def broken():
        raise NotImplementedError("not for this shape")

    ticks = []
    firsts = {}
    timings = time_interleaved({"a": make("a"), "b": make("b"), "bad": broken}, repeats=3, warmup=1,
                                      on_first=lambda n, r: firsts.setdefault(n, r), tick=ticks.append)
    assert sum(ticks) == runner.planned_calls(3, 3, 1)
    assert firsts == {"a": "a", "b": "b"}
    assert isinstance(timings["bad"].error, NotImplementedError) and not timings["bad"].times_s
    # first + warm-up of each, then rounds that start one candidate later each time
    assert order == ["a", "a", "b", "b", "a", "b", "b", "a", "a", "b"]
    assert all(len(timings[n].times_s) == 3 for n in "ab")
    t = timings["a"]
    assert t.min_s <= t.median_s and t.quartiles_s[0] <= t.median_s <= t.quartiles_s[1]
    # A budget smaller than one call leaves one timed call.
    slow = time_interleaved({"a": make("a")}, repeats=5, warmup=1, max_seconds=0.0)
    assert len(slow["a"].times_s) == 1


def test_relative_error_in_chunks():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((70, 3, 5, 5))
    y = (ref * (1 + 1e-6)).astype(np.float32)
    expected = np.linalg.norm(y.astype(np.float64) - ref) / np.linalg.norm(ref)
    assert math.isclose(testing.relative_error(y, ref), expected, rel_tol=1e-9)
    with pytest.raises(ValueError, match="shape"):
        testing.relative_error(y[:1], ref)


@pytest.fixture
def wrong_algorithm(monkeypatch):
    """A registered CPU algorithm that answers quickly and wrongly."""
    module = types.ModuleType("convlib_test_wrong_algorithm")
    module.supports = lambda problem: None
    module.run = lambda problem, x, w, bias, device: np.ones(problem.y_shape, problem.dtype)
    module.workspace_bytes = lambda problem, device=None: 0
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(registry._IMPLEMENTATIONS, ("conv2d", "cpu", "wrong"), module.__name__)
    return "wrong"


def test_run_problem_flags_wrong_answers_and_skips_unsupported(wrong_algorithm):
    problem = ConvProblem(2, 3, 9, 8, 4, 3, 3, stride=(2, 1), padding=(1, 0, 2, 1), has_bias=True)
    ticks = []
    records = runner.run_problem(problem, algos={"cpu": ["direct", "winograd", wrong_algorithm, "auto"]},
                                 baselines=("torch",), repeats=2, warmup=0, gap_s=0, tick=ticks.append)
    assert sum(ticks) == runner.planned_calls(5, 2, 0)
    status = {r["name"]: r["status"] for r in records}
    assert status == {"direct": "ok", "winograd": "unsupported", "wrong": "wrong", "auto": "ok", "torch": "ok"}
    by_name = {r["name"]: r for r in records}
    assert "stride" in by_name["winograd"]["note"]
    assert by_name["wrong"]["note"].startswith("WRONG")
    assert by_name["auto"]["picked"] in registry.algorithm_names("cpu")
    assert by_name["direct"]["reference"] == "torch-float64"
    assert by_name["direct"]["rel_error"] <= check.TOLERANCE["float32"]


def test_time_candidates_for_the_selector():
    from convlib.dispatch.devices import resolve_device
    from convlib.dispatch.measure import time_algorithms

    problem = ConvProblem(1, 2, 6, 6, 2, 3, 3)
    timings = time_algorithms("conv2d", problem, resolve_device("cpu"), ["direct", "im2col", "auto"], repeats=1)
    assert set(timings) == {"direct", "im2col", "auto"}
    assert all(t > 0 for t in timings.values())


def test_cli_custom_smoke(tmp_path, capsys):
    out = tmp_path / "results"
    rc = main(["custom", "--shape", "2,4,10,9,6,3,3", "--stride", "2,1", "--padding", "1,0,1,2", "--bias",
               "--repeats", "1", "--warmup", "0", "--gap-ms", "0", "--baseline", "torch,scipy",
               "--out", str(out), "--no-progress", "--plot", "--tag", "smoke"])
    assert rc == 0
    [json_path] = out.glob("custom-smoke-*.json")
    [csv_path] = out.glob("custom-smoke-*.csv")
    [png] = out.glob("custom-smoke-*-gflops.png")
    assert png.stat().st_size > 0
    data = json.loads(json_path.read_text())  # strict JSON: NaN would have failed to parse here
    assert data["format"] == 1 and data["suite"] == "custom" and not data["interrupted"]
    assert data["machine"]["cpu"]["logical_cpus"] >= 1
    assert data["machine"]["versions"]["numba"] and data["machine"]["numba"]["threading_layer"]
    assert isinstance(data["machine"]["env"], dict)
    records = data["records"]
    expected = runner.default_algorithms("cpu") + ["torch", "scipy"]
    assert [r["name"] for r in records] == expected
    torch_rec = next(r for r in records if r["name"] == "torch")
    for r in records:
        assert r["status"] in ("ok", "unsupported", "unavailable", "skipped", "error"), r
        assert (r["N"], r["C"], r["H"], r["W"], r["K"], r["stride"], r["padding"]) == (2, 4, 10, 9, 6, "2x1", "1,0,1,2")
        if r["status"] != "ok":
            assert r["note"]
            continue
        assert r["repeats"] == 1 and len(r["times_s"]) == 1
        assert r["min_s"] == r["median_s"] == r["times_s"][0] > 0
        assert r["first_s"] > 0 and r["compile_s"] >= 0
        assert math.isclose(r["gflops"], r["flops"] / r["median_s"] / 1e9)
        assert math.isclose(r["ratio_vs_torch"], r["median_s"] / torch_rec["median_s"])
        assert r["rel_error"] <= 1e-5
    # Winograd cannot serve stride 2: reported, not timed.
    assert all(r["status"] == "unsupported" for r in records if r["name"].startswith("winograd"))
    assert torch_rec["ratio_vs_torch"] == 1.0
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(row["name"], row["status"]) for row in rows] == [(r["name"], r["status"]) for r in records]
    assert {s["name"] for s in data["summary"]} == set(expected)
    printed = capsys.readouterr().out
    assert "summary" in printed and "torch" in printed

    # The saved file redraws and reprints without timing anything.
    png.unlink()
    assert main(["--replot", str(json_path), "--plot"]) == 0
    assert png.exists()


@pytest.mark.parametrize("op", ["backward_data", "backward_weight", "backward_bias"])
def test_cli_times_the_backward_passes_against_pytorch(op, tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "results"
    rc = main(["custom", "--shape", "2,4,10,9,6,3,3", "--stride", "2,1", "--padding", "1", "--op", op,
               "--repeats", "1", "--warmup", "0", "--gap-ms", "0", "--baseline", "torch,scipy",
               "--out", str(out), "--no-progress"])
    assert rc == 0
    [json_path] = out.glob(f"custom-{op}-*.json")
    data = json.loads(json_path.read_text())
    assert data["config"]["operation"] == f"conv2d_{op}"
    records = {r["name"]: r for r in data["records"]}
    assert set(records) == set(runner.default_algorithms("cpu", f"conv2d_{op}")) | {"torch", "scipy"}
    assert records["scipy"]["status"] == "unsupported"
    x_shape, w_shape = (2, 4, 10, 9), (6, 4, 3, 3)
    forward = make_problem(x_shape, w_shape, None, "float32", "float32", stride=(2, 1), padding=1)
    problem = replace(forward, operation=f"conv2d_{op}")
    for name, r in records.items():
        if name == "scipy":
            continue
        if name != "auto" and name != "torch" and registry.unsupported_reason(f"conv2d_{op}", "cpu", name, problem):
            assert r["status"] == "unsupported", r  # e.g. Winograd's data pass at stride 2
            continue
        assert r["status"] == "ok" and r["reference"] == "torch-float64" and r["rel_error"] <= 1e-5, r


def test_gemm_check_times_the_same_product_three_ways():
    """The "blis gemm" candidate is the layer's GEMM (M x K by K x N) through the blis driver:
    its answer is numpy's ``a @ b``, and the conv candidate answers the layer itself."""
    from convlib.bench import gemm_check

    calls, (M, N, K), flops = gemm_check.layer_calls("s5 3x3 512>512", batch=1)
    assert (M, N, K) == (512, 49, 4608) and flops == 2 * M * N * K
    product = calls["numpy matmul"]()
    via_blis = calls["blis gemm"]()
    assert via_blis.shape == (1, M, 1, N)
    np.testing.assert_allclose(via_blis.reshape(M, N), product, rtol=1e-4, atol=1e-3)
    assert calls["blis conv"]().shape == (1, 512, 7, 7)


def test_winograd_rates_above_the_fma_peak_are_not_a_ceiling_warning():
    from convlib.bench.report import warnings_for

    ceilings = {"fma_peak_gflops": 100.0, "load_average": [0.1, 0.1, 0.1]}
    base = {"status": "ok", "device": "cpu", "case": "s2 3x3 64>64"}
    records = [dict(base, name="winograd", frac_fma_peak=1.4), dict(base, name="auto", picked="winograd", frac_fma_peak=1.3)]
    assert warnings_for(records, ceilings) == []
    records.append(dict(base, name="blis", frac_fma_peak=1.2))
    (warning,) = warnings_for(records, ceilings)
    assert warning.startswith("1 rate(s) exceed the measured FMA peak")


def test_asm_check_finds_the_hot_loop_and_counts_it():
    from convlib.bench.asm_check import hot_loop, loop_summary

    asm = """
    entry:
        movq 8(%rsp), %rax
    .LBB0_1:
        vbroadcastss (%rdi), %zmm0
        vmovups (%rsi), %zmm1
        vfmadd231ps %zmm0, %zmm1, %zmm2
        vfmadd231ps %zmm0, %zmm3, %zmm4
        vfmadd231ps (%rdx){1to16}, %zmm1, %zmm5
        addq $4, %rdi
        jne .LBB0_1
        vmovups %zmm2, 16(%rsp)
        vfmadd231ps %zmm6, %zmm6, %zmm7
    """
    block = hot_loop(asm)
    assert block[-1].startswith("jne") and len(block) == 7  # the loop body, not what follows its branch
    assert loop_summary(block) == {"width": "zmm:3", "fma": 3, "acc": 3, "bcast separate": 1, "bcast folded": 1,
                                   "loads": 1, "stack": 0}


@pytest.mark.parametrize("bias", [False, True])
def test_large_per_channel_problems_are_checked_by_fft_in_float64(bias, monkeypatch):
    """The image filters' reference (PyTorch's float64 column matrix would not fit): plane by plane
    by FFT, against the definition on an awkward per-channel problem (multiplier 2, stride, dilation,
    asymmetric padding), and chosen by reference_for once the column matrix is over budget."""
    problem = make_problem((2, 3, 23, 19), (6, 1, 4, 3), (6,) if bias else None, np.float32, np.float32,
                           np.float32 if bias else None, stride=(2, 3), padding=(3, 1, 0, 2), dilation=(2, 1),
                           groups=3)
    rng = np.random.default_rng(5)
    x = rng.standard_normal(problem.x_shape).astype(np.float32)
    w = rng.standard_normal(problem.w_shape).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32) if bias else None
    expected = testing.conv2d_reference_for(problem, x, w, b, "float64")
    assert testing.relative_error(check.planes_reference(problem, x, w, b), expected) < 1e-12
    monkeypatch.setattr(check, "FLOAT64_REFERENCE_MAX_COLUMN_BYTES", 1)
    reference = check.reference_for(problem, x, w, b)
    assert reference.label == "fft-float64"
    assert testing.relative_error(reference.y, expected) < 1e-12


def test_auto_within_ten_percent_judges_the_algorithm_it_picked():
    """The share of shapes where auto's choice is within 10% of the fastest explicit algorithm: the
    picked algorithm's own timing decides (auto's timing of the same kernel differs by noise), and
    auto's own where its pick was not timed."""
    from convlib.bench.report import summarize

    def rec(case, name, median, picked=None, kind="convlib"):
        return {"case": case, "name": name, "device": "cpu", "kind": kind, "status": "ok", "median_s": median,
                "picked": picked, "weight": 1, "ratio_vs_torch": math.nan}

    records = [
        # picked direct, which was within 10% of blis; auto's own timing was slow (noise)
        rec("a", "auto", 2.0, "direct"), rec("a", "direct", 1.05), rec("a", "blis", 1.0),
        # picked direct, 20% slower than blis: a miss
        rec("b", "auto", 1.5, "direct"), rec("b", "direct", 1.2), rec("b", "blis", 1.0),
        # picked winograd, not timed: auto's own timing against the fastest timed
        rec("c", "auto", 1.08, "winograd"), rec("c", "direct", 1.0),
    ]
    (auto,) = [row for row in summarize(records) if row["name"] == "auto"]
    assert auto["within_10pct_of_best"] == pytest.approx(2 / 3)


def test_gpu_report_gives_auto_against_cudnn_in_the_same_precision():
    """gpu_check's tables say what a user gets: ``auto`` against cuDNN FP32 and ``auto-tf32``
    against cuDNN TF32, each as a geometric mean of time ratios over the layers both ran."""
    from convlib.bench.gpu_report import auto_geomeans, resnet_table

    def row(label, cudnn, tf32, auto, auto_tf32):
        results = {"cudnn": {"gpu_ms": cudnn}, "cudnn-tf32": {"gpu_ms": tf32}, "auto": {"gpu_ms": auto}}
        if auto_tf32 is not None:
            results["auto-tf32"] = {"gpu_ms": auto_tf32}
        return {"label": label, "gflop": 1.0, "results": results}

    rows = [row("a", 1.0, 0.5, 0.5, 1.0), row("b", 1.0, 0.25, 2.0, 0.25), row("c", 3.0, 1.0, 3.0, None)]
    geo = auto_geomeans(rows)
    assert geo["auto"]["layers"] == 3 and abs(geo["auto"]["geomean"] - 1.0) < 1e-12  # 2, 0.5, 1
    assert geo["auto-tf32"]["layers"] == 2 and abs(geo["auto-tf32"]["geomean"] - 0.5 ** 0.5) < 1e-12  # 0.5, 1
    table, summary = resnet_table(rows)
    assert summary["auto"] == geo and "auto-tf32 against cudnn-tf32" in table
