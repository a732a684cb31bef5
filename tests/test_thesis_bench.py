"""``python -m convlib.bench thesis``: the thesis' tables, the whole-process timer, the plots (no timing asserted)."""

from __future__ import annotations

import math

import pytest

from convlib.bench import thesis
from convlib.bench.__main__ import main
from convlib.core.problem import ConvProblem


def test_thesis_tables_load_whole():
    from importlib import resources

    header = resources.files("convlib.bench").joinpath("data", thesis.THESIS_CSV).read_text().splitlines()[0]
    assert header.split(",") == ["experiment", "device", "program", "N", "C", "K", "H", "W", "R", "S", "mean_time_s"]
    rows = thesis.load_thesis()
    assert len(rows) == 238
    assert {r.experiment for r in rows} == {"A", "B"}
    assert {r.device for r in rows} == {"cpu", "gpu"}
    assert set(thesis.THESIS_PROGRAMS) <= {r.program for r in rows}
    assert all((r.C, r.K, r.R, r.S) == (4, 4, 3, 3) for r in rows)
    assert sorted({r.N for r in rows if r.experiment == "A"}) == list(range(8, 81, 8))
    assert sorted({r.H for r in rows if r.experiment == "B"}) == [64, 128, 256, 512, 1024, 2048, 4096]
    # The figures its README quotes, and the explicit matrix that did not fit past N = 56.
    cell = {(r.experiment, r.device, r.program, r.N, r.H): r.mean_time_s for r in rows}
    assert cell["A", "cpu", "blis_parallel", 8, 1024] == pytest.approx(0.629)
    assert cell["A", "cpu", "blis_parallel", 80, 1024] == pytest.approx(3.547)
    assert cell["B", "cpu", "blis_parallel", 8, 4096] == pytest.approx(5.324)
    assert cell["A", "cpu", "direct_onednn", 80, 1024] == pytest.approx(2.890)
    assert cell["A", "cpu", "gemm_parallel", 56, 1024] is not None
    assert all(cell["A", "cpu", "gemm_parallel", n, 1024] is None for n in (64, 72, 80))


def test_cases_are_the_seed_sweeps():
    assert [c.problem.N for c in thesis.cases("A")] == list(range(8, 81, 8))
    assert [c.problem.H for c in thesis.cases("B", sizes=[64, 96])] == [64, 96]
    assert all(c.problem.x_shape == (8, 4, 1024, 1024) for c in thesis.cases("A", batches=[8]))
    with pytest.raises(ValueError, match="experiment"):
        thesis.cases("C")


def test_process_timer_runs_a_tiny_shape():
    times = thesis.process_time(ConvProblem(1, 4, 16, 16, 4, 3, 3), "cpu", "direct", runs=1, warm=False)
    assert len(times) == 1 and 0 < times[0] < 120


def test_process_timer_reports_a_failing_run():
    with pytest.raises(RuntimeError, match="exited"):
        thesis.process_time(ConvProblem(1, 4, 16, 16, 4, 3, 3), "no-such-device", "direct", runs=1, warm=False)


def test_memory_note_skips_what_cannot_fit():
    assert thesis.memory_note(ConvProblem(8, 4, 64, 64, 4, 3, 3), "cpu") is None
    note = thesis.memory_note(ConvProblem(10**6, 4, 1024, 1024, 4, 3, 3), "cpu")
    assert note is not None and note.startswith("skipped")


def _fake_measurements():
    out = []
    for n in (8, 16):
        for measure, t in (("process", 1.0 + n / 8), ("kernel", 0.01 * n)):
            out.append(thesis.Measurement("A", "cpu", "blis", n, 1024, measure, t, "ok"))
    out.append(thesis.Measurement("A", "cpu", "winograd", 8, 1024, "kernel", math.nan, "skipped", "too big"))
    return out


def test_speedups_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    rows = thesis.load_thesis()
    ms = _fake_measurements()
    table = thesis.speedups(ms, rows)
    blis = [r for r in table if r["program"] == "blis_parallel"]
    assert [r["size"] for r in blis] == [8, 16]
    assert blis[0]["process_speedup"] == pytest.approx(0.629 / 2.0)
    assert "blis_parallel" in thesis.speedup_markdown(table)
    assert "skipped" in thesis.table(ms)
    machine = {"cpu": {"model": "Test CPU", "usable_cpus": 2}, "date": "2026-11-24"}
    path = thesis.plot(tmp_path / "a.png", "A", "cpu", ms, rows, machine)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_csv_round_trip_and_replot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    ms = _fake_measurements()
    path = thesis.write_csv(tmp_path / "run.csv", ms)
    back = thesis.read_csv(path)
    assert [m.time_s for m in back if m.status == "ok"] == [m.time_s for m in ms if m.status == "ok"]
    assert main(["thesis", "--replot", str(path), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "run-A-cpu.png").exists()
    assert "blis_parallel" in capsys.readouterr().out


def test_cli_kernel_only_tiny(tmp_path, capsys):
    pytest.importorskip("tqdm")
    pytest.importorskip("matplotlib")
    assert main(["thesis", "--experiment", "B", "--sizes", "16", "--algo", "direct,auto", "--devices", "cpu",
                 "--no-process", "--repeats", "1", "--no-progress", "--no-check", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "direct" in out and list(tmp_path.glob("thesis-*.csv"))
