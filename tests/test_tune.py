"""Self-tuning: the knob layers, cache-derived block sizes, the machine profile, and convlib.tune."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import pytest

import convlib
from convlib.core.knobs import Knob, KnobTable
from convlib.cpu import profile as cpu_profile
from convlib.cpu.isa import _read_sysfs_caches, cache_sizes
from convlib.cpu.tables import (
    KNOBS,
    REFERENCE_CACHES,
    VALUE_TYPES,
    BlisBlocking,
    DirectBlocking,
    all_blis_blockings,
    fit_blis_to_caches,
    machine_derived_knobs,
)
from convlib.dispatch.select import rule_choice
from convlib.testing import TOLERANCE, conv2d_reference, relative_error
from convlib.tune import precompile, search


@pytest.fixture
def table():
    return KnobTable("test", [
        Knob("block", 8, "a block size"),
        Knob("rows", {("x", "f4"): 1, ("y", "f4"): 2}, "a per-ISA row", keyed_by=("isa", "dtype")),
        Knob("chunk", 100, "a chunk size"),
    ], derive=lambda: {"block": 16, "rows": {("x", "f4"): 10}}, load_profile=lambda: {"chunk": 50})


@pytest.fixture
def profile_env(tmp_path, monkeypatch):
    """A private profile folder; the CPU table's profile layer restored afterwards."""
    monkeypatch.setenv("CONVLIB_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CONVLIB_PROFILE", raising=False)
    before = KNOBS.profile()
    yield tmp_path
    KNOBS.apply_profile(before)


# -- the layers --------------------------------------------------------------------------------
def test_layers_override_then_profile_then_derived_then_default(table):
    assert (table.block, table.chunk) == (16, 50)
    assert table.lookup("rows", ("x", "f4")) == 10 and table.lookup("rows", ("y", "f4")) == 2
    assert [table.source("block"), table.source("chunk")] == ["derived", "profile"]
    assert [table.source("rows", ("x", "f4")), table.source("rows", ("y", "f4"))] == ["derived", "default"]
    table.apply_profile({"block": 32, "rows": {("y", "f4"): 20}})
    assert (table.block, table.chunk) == (32, 100)  # the new profile replaces the old one whole
    assert table.lookup("rows", ("y", "f4")) == 20 and table.lookup("rows", ("x", "f4")) == 10
    with table.override(block=4):
        assert table.block == 4 and table.source("block") == "override"
    assert table.block == 32


def test_a_new_profile_is_a_new_state(table):
    # Caches key on state(): a profile applied later must never meet an entry made before it.
    assert table.state() == ()
    table.apply_profile({"block": 32})
    first = table.state()
    table.apply_profile({"block": 64})
    assert first != table.state() != ()


def test_layers_refuse_unknown_and_compile_time_knobs():
    bad = KnobTable("test", [Knob("baked", 1, "x", compile_time=True)], load_profile=lambda: {"baked": 2})
    with pytest.raises(ValueError, match="compile-time"):
        bad.baked  # noqa: B018
    unknown = KnobTable("test", [Knob("a", 1, "x")], derive=lambda: {"b": 2})
    with pytest.raises(ValueError, match="unknown knob 'b'"):
        unknown.a  # noqa: B018


# -- caches and derived block sizes -------------------------------------------------------------
def test_cache_sizes_read_from_sysfs(tmp_path):
    for i, (level, kind, size, shared) in enumerate([(1, "Data", "48K", "0"), (1, "Instruction", "32K", "0"),
                                                     (2, "Unified", "2048K", "0"), (3, "Unified", "105M", "0-15")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (d / name).write_text(f"{value}\n")
    assert _read_sysfs_caches(tmp_path) == {"L1d": 48 * 1024, "L2": 2 * 2**20, "L3": 105 * 2**20, "L3_cpus": 16}
    assert cache_sizes(tmp_path / "missing")["source"] in ("sysconf", "fallback")


@pytest.mark.parametrize("key", sorted(all_blis_blockings()))
def test_blis_rows_scale_to_caches_and_stay_valid(key):
    isa, dtype = key
    row = all_blis_blockings()[key]
    itemsize = 4 if dtype == "float32" else 8
    assert fit_blis_to_caches(row, itemsize, REFERENCE_CACHES[isa], REFERENCE_CACHES[isa]) == row
    previous = None
    for l1 in (16, 32, 48, 64, 128):
        for l2 in (256, 512, 1024, 2048, 4096):
            b = fit_blis_to_caches(row, itemsize, {"L1d": l1 * 1024, "L2": l2 * 1024}, REFERENCE_CACHES[isa])
            # BlisBlocking checks MC % MR and NC % NR itself; the tile never changes.
            assert (b.MR, b.NR) == (row.MR, row.NR) and 128 <= b.KC <= 1024 and b.MC >= 4 * b.MR
        assert previous is None or b.KC >= previous.KC  # a larger L1 never shrinks KC
        previous = b


def test_derived_knobs_follow_the_reported_caches():
    small = machine_derived_knobs({"L1d": 32 * 1024, "L2": 512 * 1024})
    large = machine_derived_knobs({"L1d": 48 * 1024, "L2": 2 * 2**20, "L3": 96 * 2**20})
    assert large["direct_l2_input_budget"] == 4 * small["direct_l2_input_budget"]
    assert large["direct_stream_min_bytes"] == 48 * 2**20
    # Gathering whole is capped: a VM reports its host's L3, of which it holds a small share.
    assert large["direct_whole_input_max_bytes"] == 16 * 2**20
    zen = machine_derived_knobs({"L1d": 48 * 1024, "L2": 2**20, "L3": 32 * 2**20})
    assert zen["direct_whole_input_max_bytes"] == 16 * 2**20
    small_l3 = machine_derived_knobs({"L1d": 32 * 1024, "L2": 2**20, "L3": 8 * 2**20})
    assert small_l3["direct_whole_input_max_bytes"] == 4 * 2**20
    assert small["direct_stream_min_bytes"] > 0  # no L3 reported: the fallback's
    assert large["depthwise_band_bytes"] > small["depthwise_band_bytes"]
    # KC follows L1 (never below 128: 32 and 48 KiB L1s both get AVX-512's 128).
    wide_l1 = machine_derived_knobs({"L1d": 96 * 1024, "L2": 2 * 2**20})
    assert wide_l1["blis_blocking"][("avx512", "float32")].KC > large["blis_blocking"][("avx512", "float32")].KC
    assert large["blis_blocking"][("avx2", "float32")].KC > small["blis_blocking"][("avx2", "float32")].KC


# -- the profile file ---------------------------------------------------------------------------
def _table():
    return KNOBS.knobs(), VALUE_TYPES


VALUES = {
    "blis_blocking": {("avx512", "float32"): BlisBlocking(MC=120, KC=320, NC=1024, MR=6, NR=64)},
    "direct_blockings": {("avx2", "float32"): (DirectBlocking(KB=3, QB=32), DirectBlocking(KB=1, QB=96, speed=0.7))},
    "winograd_register_tile": {"float32": (6, 32)},
    "direct_serial_below_flops": 4_000_000,
}


def test_profile_round_trip(profile_env):
    path = cpu_profile.save_profile(VALUES, {"note": "test"}, table=_table(), mode="quick", seconds=1.0)
    assert path.parent == profile_env / "profiles"
    assert cpu_profile.load_profile_knobs(*_table()) == VALUES


@pytest.mark.parametrize("damage, message", [
    (lambda d: "{not json", "ignoring the tuned profile"),
    (lambda d: {**d, "format": 99}, "format 99"),
    (lambda d: {**d, "machine": {**d["machine"], "cpu": "Some Other CPU"}}, "another machine.*cpu"),
    (lambda d: {**d, "machine": {**d["machine"], "threads": 64}}, "another machine.*threads"),
    # tuned against other kernels or rules (an earlier checkout): its values are stale
    (lambda d: {**d, "machine": {**d["machine"], "kernels": "0123456789abcdef"}}, "another machine.*kernels"),
    (lambda d: {**d, "knobs": {"no_such_knob": {"value": 1}}}, "unknown knob"),
    (lambda d: {**d, "knobs": {"blis_blocking": {"rows": [[["avx512", "float32"], {
        "type": "BlisBlocking", "MC": 100, "KC": 256, "NC": 1024, "MR": 6, "NR": 64}]]}}}, "multiple of MR"),
    (lambda d: {**d, "knobs": {"direct_serial_below_flops": {"value": "many"}}}, "is not of type int"),
])
def test_a_corrupt_or_foreign_profile_is_ignored_with_a_warning(profile_env, damage, message):
    path = cpu_profile.save_profile(VALUES, {}, table=_table(), mode="quick", seconds=1.0)
    damaged = damage(json.loads(path.read_text()))
    path.write_text(damaged if isinstance(damaged, str) else json.dumps(damaged))
    with pytest.warns(RuntimeWarning, match=message):
        assert cpu_profile.load_profile_knobs(*_table()) == {}


def test_profile_env_names_a_file_or_switches_profiles_off(profile_env, monkeypatch):
    elsewhere = profile_env / "mine.json"
    cpu_profile.save_profile(VALUES, {}, table=_table(), mode="quick", seconds=1.0, path=elsewhere)
    monkeypatch.setenv("CONVLIB_PROFILE", str(elsewhere))
    assert cpu_profile.profile_path() == elsewhere
    assert cpu_profile.load_profile_knobs(*_table()) == VALUES
    monkeypatch.setenv("CONVLIB_PROFILE", "off")
    assert cpu_profile.profile_path() is None and cpu_profile.load_profile_knobs(*_table()) == {}
    with pytest.raises(ValueError, match="CONVLIB_PROFILE=off"):
        cpu_profile.save_profile(VALUES, {}, table=_table(), mode="quick", seconds=1.0)


def test_profile_values_reach_the_kernels_and_stay_correct(profile_env, rng):
    # A profile with odd but valid values: every CPU algorithm still computes the right answer.
    odd = {
        "blis_blocking": {(isa, "float32"): _odd_blis(row) for (isa, dtype), row in all_blis_blockings().items()
                          if dtype == "float32"},
        "winograd_register_tile": {"float32": (4, 32)},
        "winograd_chunk_bytes": 64 * 1024,
        "direct_serial_below_flops": 0,
        "auto_direct_max_filters": 0,
    }
    KNOBS.apply_profile(odd)
    x = rng.standard_normal((2, 24, 13, 11)).astype(np.float32)
    w = rng.standard_normal((20, 24, 3, 3)).astype(np.float32)
    expected = conv2d_reference(x, w, None, padding=(1, 1, 1, 1))
    for algo in ("direct", "blis", "winograd", "im2col", "auto"):
        got = convlib.conv2d(x, w, padding=1, algo=algo, device="cpu")
        assert relative_error(got, expected) < TOLERANCE["float32"] * (4 if algo == "winograd" else 1), algo


def _odd_blis(row: BlisBlocking) -> BlisBlocking:
    return BlisBlocking(MC=2 * row.MR, KC=40, NC=2 * row.NR, MR=row.MR, NR=row.NR)


# -- fitting auto's thresholds ------------------------------------------------------------------
def test_auto_thresholds_fit_what_was_measured(profile_env):
    # Measured (made up here): depthwise loses to direct on 7x7 and wins on 3x3 -- the fit must keep
    # 3x3 and drop 7x7 whatever the built-in threshold says.
    from convlib.core.problem import ConvProblem

    table = []
    for r in (3, 5, 7):
        p = ConvProblem(1, 8, 256, 256, 8, r, r, padding=(r // 2,) * 4, groups=8)
        times = {"depthwise": 1.0, "direct": 2.0} if r < 7 else {"depthwise": 6.0, "direct": 1.0}
        table.append((p, ["depthwise", "direct"], times))
    with KNOBS.override(auto_depthwise_max_taps=81):
        assert rule_choice(table[2][0], "cpu", ["depthwise", "direct"])[0] == "depthwise"
        fitted = search.fit_auto_thresholds(table)
    assert 25 <= fitted["auto_depthwise_max_taps"] < 49
    with KNOBS.override(**fitted):
        assert [rule_choice(p, "cpu", c)[0] for p, c, _ in table] == ["depthwise", "depthwise", "direct"]


class _PresetTimes:
    """A measurer whose variants take the seconds given per label (the shapes' arrays are real)."""

    def __init__(self, seconds: dict):
        self.seconds = seconds
        self.real = search.Measurer(repeats=1, max_seconds=0.0)

    def time(self, shape, variants):
        return {label: self.seconds[label] for label in variants}

    def arrays(self, shape):
        return self.real.arrays(shape)


UNPADDED = ("3x3 2>2 64^2 unpadded", 1, 2, 64, 64, 2, 3, 3, 1, 0, 1)  # a 32 KiB input


@pytest.mark.parametrize("in_place, per_item, limit, chosen", [
    (0.8, 1.0, 2**20, search.IN_PLACE_ANY_SIZE),  # in place wins: at any size
    (0.8, 1.0, search.IN_PLACE_ANY_SIZE, None),  # ... which is the default already
    (1.0, 0.8, 2**20, 16 * 1024),  # gathering wins on 32 KiB: from half of it
    (1.0, 0.8, 8 * 1024, None),  # ... where the limit is already below it: unchanged
    (1.0, 0.99, 2**20, None),  # within MIN_GAIN: unchanged
])
def test_in_place_search_follows_the_faster_way(in_place, per_item, limit, chosen):
    found = search.Found()
    with KNOBS.override(direct_in_place_max_bytes=limit):
        search._search_in_place(_PresetTimes({"in place": in_place, "per item": per_item}), [UNPADDED], found)
    assert found.knobs.get("direct_in_place_max_bytes") == chosen
    assert found.record["direct in place"][0]["bytes"] == 2 * 64 * 64 * 4
    assert "in place" in found.lines[0]


PADDED = ("3x3 2>2 64^2 padded", 1, 2, 64, 64, 2, 3, 3, 1, 1, 1)  # a 32 KiB input


@pytest.mark.parametrize("whole, per_item, limit, chosen", [
    (1.0, 0.8, 2**20, 16 * 1024),  # gathering per item wins on 32 KiB: whole from half of it
    (1.0, 0.8, 8 * 1024, None),  # ... where the limit is already below it: unchanged
    (0.8, 1.0, 2**20, None),  # gathering whole wins: the limit stays (larger inputs were not timed)
    (1.0, 0.99, 2**20, None),  # within MIN_GAIN: unchanged
])
def test_whole_search_lowers_the_limit_where_per_item_wins(whole, per_item, limit, chosen):
    found = search.Found()
    with KNOBS.override(direct_whole_input_max_bytes=limit):
        search._search_whole(_PresetTimes({"whole": whole, "per item": per_item}), [PADDED], found)
    assert found.knobs.get("direct_whole_input_max_bytes") == chosen
    assert found.record["direct whole"][0]["bytes"] == 2 * 64 * 64 * 4
    assert "whole" in found.lines[0]


def test_quick_auto_stage_times_every_algorithm_auto_can_pick():
    # The quick mode times only what auto's CPU rules can name; under every threshold value the
    # tuner tries, auto's pick among those must be its pick among every serving algorithm, or the
    # fit would cost a choice it never timed.
    from convlib.dispatch import registry
    from convlib.tune.shapes import AUTO_SHAPES

    measurer = search.Measurer(repeats=1, max_seconds=0.0)
    for shape in AUTO_SHAPES:  # the full mode's 25; the quick mode's 21 are among them
        problem = measurer.arrays(shape)[0]
        quick = search.auto_candidates(problem, full=False)
        serving = registry.serving_algorithms("conv2d", "cpu", problem)
        assert search.auto_candidates(problem, full=True) == serving
        assert "im2col" not in quick and "winograd2" not in quick
        for name, ladder in search.AUTO_LADDERS.items():
            for value in ladder:
                with KNOBS.override(**{name: value}):
                    assert rule_choice(problem, "cpu", quick)[0] == rule_choice(problem, "cpu", serving)[0], (
                        shape[0], name, value)


# -- convlib.tune ---------------------------------------------------------------------------------
TINY = {
    "blis": (("3x3 16>24 12^2", 1, 16, 12, 12, 24, 3, 3, 1, 1, 1),),
    "direct": (("3x3 8>12 16^2", 1, 8, 16, 16, 12, 3, 3, 1, 1, 1),),
    "serial": (("3x3 2>2 8^2", 1, 2, 8, 8, 2, 3, 3, 1, 1, 1), ("3x3 2>2 64^2", 1, 2, 64, 64, 2, 3, 3, 1, 1, 1)),
    "in place": (UNPADDED,),
    "whole": (PADDED,),
    "winograd": (("3x3 8>8 12^2", 1, 8, 12, 12, 8, 3, 3, 1, 1, 1),),
    "depthwise": (("dw 3x3/2 16 10^2", 1, 16, 10, 10, 16, 3, 3, 2, 1, 16),),
    "auto": (("dw 3x3 8 20^2", 1, 8, 20, 20, 8, 3, 3, 1, 1, 8), ("3x3 8>16 10^2", 1, 8, 10, 10, 16, 3, 3, 2, 1, 1)),
}


@pytest.mark.early
def test_tune_writes_a_profile_that_the_next_process_uses(profile_env):
    assert callable(convlib.tune)
    result = convlib.tune("quick", progress=False, shape_sets=TINY)
    assert result.path is not None and result.path.exists()
    assert KNOBS.profile() == result.knobs
    saved = cpu_profile.read_profile(result.path)
    assert saved["mode"] == "quick" and saved["machine"] == cpu_profile.machine_identity()
    assert {"auto", "direct speeds", "direct in place", "direct whole", "winograd register tile",
            "depthwise ways"} <= set(saved["measurements"])
    assert "tuned in" in result.report()
    # The kernels are compiled first, in worker processes, where two CPUs or more are ours.
    stages = list(result.stage_seconds)
    assert stages[-5:] == ["blis", "direct", "winograd", "depthwise", "auto"] and stages[:-5] in ([], ["compile"])
    assert all(seconds > 0 for seconds in result.stage_seconds.values())
    assert sum(result.stage_seconds.values()) <= result.seconds
    # A new process finds the same values through the knob table.
    shown = subprocess.run([sys.executable, "-m", "convlib.tune", "--show"], capture_output=True, text=True,
                           check=True).stdout
    assert str(result.path) in shown
    probe = ("from convlib.cpu.tables import KNOBS; import json; "
             "print(json.dumps(sorted(n for n in KNOBS.profile())))")
    names = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                      check=True).stdout)
    assert names == sorted(result.knobs)
    assert convlib.tune.forget() == result.path and not result.path.exists() and KNOBS.profile() == {}


def test_precompile_workers_run_every_stage_and_report_failures():
    """The workers take the units one at a time and exit cleanly; a unit that fails is reported with
    its error, not raised, and the other units still run."""
    seconds, workers, errors = precompile.precompile(TINY, full=False, workers=2)
    assert workers == 2 and errors == [] and seconds > 0
    units = precompile.work_units(TINY)
    assert {u.partition(":")[0] for u in units} == {"blis", "direct", "winograd", "depthwise", "auto"}
    assert len(set(units)) == len(units)
    # The auto units cover its shapes once.
    parts = [precompile._auto_part(TINY["auto"], u.partition(":")[2]) for u in units if u.startswith("auto:")]
    assert sorted(tuple(s) for part in parts for s in part) == sorted(TINY["auto"])
    broken = {name: (("not a shape",),) for name in TINY}
    _, _, errors = precompile.precompile(broken, full=False, workers=2)
    # Every stage fails on its own; auto:resnet has no shape here and runs nothing.
    failed = {error.partition(":")[0] for error in errors}
    assert failed == {"blis", "winograd", "direct", "depthwise", "auto"}, errors
    assert len(errors) == 5 and all(("ValueError" in error or "IndexError" in error) for error in errors), errors
    assert precompile.precompile(TINY, full=False, workers=1) == (0.0, 0, [])


def test_a_worker_that_dies_is_reported_with_its_last_line():
    units = queue.SimpleQueue()
    units.put("blis")
    errors = []
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stderr.write('no compiler\\n'); sys.exit(3)"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1)
        precompile._feed(proc, log, "{}", units, errors)
    assert errors == ["no compiler"] and proc.returncode == 3


def test_depthwise_search_picks_among_its_candidates_and_stays_correct(profile_env, rng):
    # A small stride-1 layer (the plane-size pick) and a channel-blocked one (K >=
    # depthwise_channel_block_min_filters, stride 2; the other two picks), one timed call per variant.
    shapes = (("dw 3x3 32 9^2", 1, 32, 9, 9, 32, 3, 3, 1, 1, 32), ("dw 3x3/2 32 9^2", 1, 32, 9, 9, 32, 3, 3, 2, 1, 32))
    ways, band = KNOBS.depthwise_channel_block_ways, KNOBS.depthwise_channel_block_bytes
    positions = KNOBS.depthwise_whole_plane_max_positions
    tried_ways = search.depthwise_ways_candidates(ways, full=False)
    tried_bands = {band, *(int(band * f) for f in search.DEPTHWISE_BAND_FACTORS["quick"])}
    found = search.search_depthwise(search.Measurer(repeats=1, max_seconds=0.05), shapes, full=False)
    assert isinstance(found, search.Found)
    assert set(found.knobs) <= {"depthwise_whole_plane_max_positions", "depthwise_channel_block_ways",
                                "depthwise_channel_block_bytes"}
    assert found.knobs.get("depthwise_whole_plane_max_positions", positions) in {
        *search.DEPTHWISE_WHOLE_PLANE_POSITIONS, positions}
    assert found.record["depthwise whole planes"][0]["shapes"] == ["dw 3x3 32 9^2"]
    assert found.knobs.get("depthwise_channel_block_ways", ways) in tried_ways
    assert found.knobs.get("depthwise_channel_block_bytes", band) in tried_bands
    assert {"depthwise ways", "depthwise band"} <= set(found.record) and len(found.lines) == 3
    for shape in shapes:
        _, N, C, H, W, K, R, S, stride, pad, groups = shape
        x = rng.standard_normal((N, C, H, W)).astype(np.float32)
        w = rng.standard_normal((K, C // groups, R, S)).astype(np.float32)
        expected = conv2d_reference(x, w, None, stride=(stride, stride), padding=(pad,) * 4, groups=groups)
        with KNOBS.override(**found.knobs):
            got = convlib.conv2d(x, w, stride=stride, padding=pad, groups=groups, algo="depthwise", device="cpu")
        assert relative_error(got, expected) < TOLERANCE["float32"]


def test_tune_refuses_an_unknown_mode():
    with pytest.raises(ValueError, match="mode='fast': allowed are 'quick', 'full'"):
        convlib.tune("fast")


def test_an_interrupted_tune_puts_the_earlier_profile_back(profile_env, monkeypatch):
    KNOBS.apply_profile({"direct_serial_below_flops": 1234})

    applied = []

    def first_stage(*args, **kwargs):
        # What a finished stage does: its choice is applied before the next stage runs. (Canned, so
        # the test does not compile the candidates; the real searches run in the test above.)
        return search.Found(knobs={"direct_serial_below_flops": 99})

    def interrupted(*args, **kwargs):
        applied.append(KNOBS.profile())
        raise KeyboardInterrupt

    monkeypatch.setattr(precompile, "precompile", lambda *args, **kwargs: (0.0, 0, []))
    monkeypatch.setattr(search, "search_blis", first_stage)
    monkeypatch.setattr(search, "search_direct", interrupted)
    with warnings.catch_warnings(), pytest.raises(KeyboardInterrupt):
        convlib.tune("quick", progress=False, save=False, shape_sets=TINY)
    assert applied == [{"direct_serial_below_flops": 99}]  # the first stage's choice was in force
    assert KNOBS.profile() == {"direct_serial_below_flops": 1234}
