"""What ``convlib.tune`` measures, one search per group of knobs.

Every search times candidate knob values against the value in force (built-in or
machine-derived) on the shapes of :mod:`convlib.tune.shapes`, interleaved in one run
(:func:`convlib.core.timing.time_interleaved`), and keeps a candidate only when it beats the value
in force by :data:`MIN_GAIN` in geometric mean over the shapes: tuning must never trade a sure
default for noise. Each candidate's first result is compared with the value in force's, so a
block size that computed a wrong answer could never be chosen.

A search returns a :class:`Found`: the knob values it chose (only those that differ from what is
in force) and what it measured, for the profile and the report.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..api import build_problem
from ..core.timing import time_interleaved
from ..cpu.depthwise import uses_channel_blocks
from ..cpu.isa import cache_sizes, host_isa
from ..cpu.tables import UNLIMITED_BYTES, KNOBS, BlisBlocking, blis_blocking, direct_blockings, direct_isa
from ..dispatch import registry
from ..dispatch.plan import make_plan
from ..dispatch.select import CPU_RULE_ALGORITHMS, rule_choice

#: The least geometric-mean gain over the value in force for a candidate to replace it.
MIN_GAIN = 0.03

#: Register tiles the full mode tries for BLIS, per instruction set (float32); each costs one
#: compile of the driver (~20-60 s on two cores).
BLIS_TILES = {
    "avx512": ((6, 64), (8, 48), (12, 32), (4, 96)),
    "avx2": ((3, 32), (4, 24), (6, 16), (2, 48)),
}

#: Register tiles tried for Winograd's batched GEMM (float32). Each is a key of the batched GEMM
#: (~1 s to compile) and of the fused filter-transform GEMM (~20 s on a 2-core Zen 3).
WINOGRAD_TILES = {
    "avx512": ((5, 16), (6, 32), (8, 32), (4, 32), (4, 48)),
    "avx2": ((5, 16), (4, 16), (6, 16), (3, 24)),
}

#: Output positions per step tried for depthwise's channel-blocked way (independent chains of
#: ``R*S`` vector FMAs; the kernel takes any count, the rest of a row one position at a time).
#: Each is a key of the kernel's factory: a compile each (~13 s on two cores, cached on disk after),
#: so the quick mode tries only the value in force and its double.
DEPTHWISE_WAYS = (1, 2, 4, 8)

#: Factors of the band budget ``depthwise_channel_block_bytes`` tried, per mode (a run-time value:
#: no compile).
DEPTHWISE_BAND_FACTORS = {"quick": (0.5, 2.0, 4.0), "full": (0.25, 0.5, 2.0, 4.0)}

#: Values of ``depthwise_whole_plane_max_positions`` tried (which small stride-1 planes leave the
#: channel blocks for the whole-plane way): none, 16x16, 32x32 and 64x64 planes.
DEPTHWISE_WHOLE_PLANE_POSITIONS = (0, 256, 1024, 4096)


def whole_plane_shapes(shapes) -> list:
    """The depthwise shapes whose way those values decide: stride 1, at most the largest value's
    positions."""
    return [s for s in shapes if s[8] == 1 and s[3] * s[4] <= max(DEPTHWISE_WHOLE_PLANE_POSITIONS)]


@dataclass
class Found:
    """What one search chose and measured."""

    knobs: dict = field(default_factory=dict)
    record: dict = field(default_factory=dict)
    lines: list = field(default_factory=list)


@dataclass
class Measurer:
    """Times variants (algorithm + knob overrides) of one shape at a time.

    Attributes
    ----------
    repeats : int
        Timed calls per variant (the median is used).
    max_seconds : float
        Time budget per variant and shape (fewer repeats for slow variants).
    tick : callable
        ``tick(n)`` after ``n`` calls: a progress bar's update.
    """

    repeats: int
    max_seconds: float
    tick: Callable[[int], None] = lambda n: None
    seed: int = 0
    _arrays: dict = field(default_factory=dict)

    def calls_per_variant(self) -> int:
        return 2 + self.repeats  # the first call, one warm-up, the timed ones

    def arrays(self, shape):
        if shape not in self._arrays:
            _, N, C, H, W, K, R, S, stride, pad, groups = shape
            rng = np.random.default_rng(self.seed)
            x = rng.uniform(-1, 1, (N, C, H, W)).astype(np.float32)
            w = rng.uniform(-1, 1, (K, C // groups, R, S)).astype(np.float32)
            problem = build_problem(x, w, None, stride=stride, padding=pad, groups=groups)
            self._arrays = {shape: (problem, x, w)}  # one shape's arrays at a time
        return self._arrays[shape]

    def time(self, shape, variants: dict[str, tuple[str, dict]]) -> dict[str, float]:
        """Median seconds per variant (``label -> (algo, knob overrides)``); ``nan`` for a variant
        that raised or whose result differs from the first variant's."""
        problem, x, w = self.arrays(shape)
        calls = {}
        for label, (algo, overrides) in variants.items():
            plan = make_plan("conv2d", problem, "cpu", algo)
            with KNOBS.override(**overrides):
                call = plan.timed_call(*plan.prepare(x, w, None))

            def run(call=call, overrides=overrides):
                with KNOBS.override(**overrides):
                    return call()
            calls[label] = run
        reference = {}

        def check(label, result):
            y = np.asarray(result)
            if not reference:
                reference["y"] = y.copy()
                reference["scale"] = float(np.abs(y).max()) or 1.0
                return
            error = float(np.abs(y - reference["y"]).max()) / reference["scale"]
            if not error <= 1e-3:
                raise ArithmeticError(f"{label}: relative error {error:.2e} against the first variant")

        timings = time_interleaved(calls, self.repeats, 1, max_seconds=self.max_seconds, on_first=check,
                                   tick=self.tick)
        return {label: (t.median_s if t.error is None and t.times_s else math.nan) for label, t in timings.items()}


def _geomean_ratio(times: list[dict], label: str, base: str) -> float:
    """Geometric mean over shapes of ``times[label] / times[base]`` (inf when a shape failed)."""
    logs = []
    for t in times:
        if not (t.get(label, math.nan) > 0 and t.get(base, math.nan) > 0):
            return math.inf
        logs.append(math.log(t[label] / t[base]))
    return math.exp(sum(logs) / len(logs))


def _pick(measurer: Measurer, shapes, algo: str, knob: str, candidates: dict, current_label: str,
          found: Found, what: str) -> str:
    """Time ``candidates`` (label -> knob value) of one knob on ``shapes``; return the winning
    label (``current_label`` unless another beats it by :data:`MIN_GAIN`)."""
    times = []
    for shape in shapes:
        times.append(measurer.time(shape, {label: (algo, {knob: value}) for label, value in candidates.items()}))
    ratios = {label: _geomean_ratio(times, label, current_label) for label in candidates}
    best = min(ratios, key=ratios.get)
    chosen = best if ratios[best] <= 1 - MIN_GAIN else current_label
    found.record.setdefault(what, []).append({
        "shapes": [s[0] for s in shapes],
        "seconds": [{k: (round(v, 6) if math.isfinite(v) else None) for k, v in t.items()} for t in times],
        "ratio_to_current": {k: (round(v, 4) if math.isfinite(v) else None) for k, v in ratios.items()},
        "chosen": chosen,
    })
    gain = 1 / ratios[chosen] if math.isfinite(ratios[chosen]) else 1.0
    found.lines.append(f"{what}: {chosen}" + ("" if chosen == current_label else f" (was {current_label}, "
                                              f"{gain:.2f}x faster in geomean)"))
    return chosen


# -- BLIS ------------------------------------------------------------------------------------
def _blocking_label(b: BlisBlocking) -> str:
    return f"MR{b.MR} NR{b.NR} MC{b.MC} KC{b.KC} NC{b.NC}"


def _with_tile(row: BlisBlocking, MR: int, NR: int) -> BlisBlocking:
    """``row``'s cache blocks for another register tile (MC and NC rounded to whole tiles)."""
    return BlisBlocking(MC=max(MR, row.MC // MR * MR), KC=row.KC, NC=max(NR, row.NC // NR * NR), MR=MR, NR=NR)


def search_blis(measurer: Measurer, shapes, *, full: bool) -> Found:
    """The BLIS register tile (full mode) and block sizes MC, KC, NC (float32)."""
    found = Found()
    current = blis_blocking("float32")
    if full:
        tiles = {f"{MR}x{NR}": _with_tile(current, MR, NR) for MR, NR in BLIS_TILES[host_isa()]}
        tiles.setdefault(f"{current.MR}x{current.NR}", current)
        # Each tile's blocks rescaled as the table would scale them for this machine's caches.
        label = _pick(measurer, shapes, "blis", "blis_blocking", tiles, f"{current.MR}x{current.NR}", found,
                      "blis register tile")
        current = tiles[label]
    base = current
    for name, factors in (("KC", (2 / 3, 4 / 3)), ("MC", (0.5, 2.0)), ("NC", (0.5, 2.0))):
        if name == "NC" and not full:
            continue
        candidates = {_blocking_label(current): current}
        for f in factors:
            value = getattr(current, name) * f
            step = {"KC": 32, "MC": current.MR, "NC": current.NR}[name]
            value = max(step, int(round(value / step)) * step)
            row = BlisBlocking(**{**current.__dict__, name: value})
            candidates[_blocking_label(row)] = row
        label = _pick(measurer, shapes, "blis", "blis_blocking", candidates, _blocking_label(current), found,
                      f"blis {name}")
        current = candidates[label]
    if current != blis_blocking("float32"):
        found.knobs["blis_blocking"] = {(host_isa(), "float32"): current}
    if base != current or full:
        found.record["blis_blocking"] = _blocking_label(current)
    return found


# -- direct ------------------------------------------------------------------------------------
def search_direct(measurer: Measurer, shapes, ladder, large=(), padded=()) -> Found:
    """The relative speeds of direct's register blocks (float32), which its choice of block
    weighs against padding waste, the FLOPs below which it runs on one thread, whether it
    reads ``large`` stride-1 unpadded inputs in place, and up to which size it gathers ``padded``
    inputs whole."""
    found = Found()
    blocks = direct_blockings("float32")
    labels = {b.label: b for b in blocks}
    times = [measurer.time(s, {label: ("direct", {"direct_blockings": (b,)}) for label, b in labels.items()})
             for s in shapes]
    best = min(labels, key=lambda label: _geomean_ratio(times, label, next(iter(labels))))
    speeds = {label: 1 / _geomean_ratio(times, label, best) for label in labels}
    old = {label: b.speed for label, b in labels.items()}
    new = tuple(dataclasses.replace(b, speed=round(min(1.0, speeds[label]), 2) if math.isfinite(speeds[label])
                                    else b.speed) for label, b in labels.items())
    found.record["direct speeds"] = {"shapes": [s[0] for s in shapes], "measured": speeds, "was": old}
    if any(abs(n.speed - o.speed) >= 0.05 for n, o in zip(new, blocks)):
        found.knobs["direct_blockings"] = {(direct_isa(), "float32"): new}
    found.lines.append("direct block speeds: " + ", ".join(
        f"{label} {speeds[label]:.2f} (was {old[label]:.2f})" for label in labels))

    # One thread or all: the smallest problem of the ladder on which all threads win by MIN_GAIN.
    serial, parallel = {"direct_serial_below_flops": 2**62}, {"direct_serial_below_flops": 0}
    crossover = None
    rows = []
    for shape in ladder:
        t = measurer.time(shape, {"one thread": ("direct", serial), "all threads": ("direct", parallel)})
        flops = measurer.arrays(shape)[0].flops
        rows.append({"shape": shape[0], "flops": flops, **t})
        if crossover is None and t["all threads"] <= (1 - MIN_GAIN) * t["one thread"]:
            crossover = flops
    found.record["direct threads"] = rows
    if crossover is not None:
        below = [r["flops"] for r in rows if r["flops"] < crossover]
        threshold = int(math.sqrt(crossover * below[-1])) if below else crossover // 2
        current = KNOBS.direct_serial_below_flops
        # The ladder's steps are 4x apart: a threshold within 2x of the current one is the same step.
        if not (0.5 <= threshold / current <= 2):
            found.knobs["direct_serial_below_flops"] = threshold
            found.lines.append(f"direct runs on one thread below {threshold / 1e6:.1f} MFLOP (was {current / 1e6:.1f})")
        else:
            found.lines.append(f"direct runs on one thread below {current / 1e6:.1f} MFLOP (measured crossover "
                               f"{threshold / 1e6:.1f}: within a step of it)")
    _search_in_place(measurer, large, found)
    _search_whole(measurer, padded, found)
    return found


#: ``direct_in_place_max_bytes`` where reading in place wins at any size.
IN_PLACE_ANY_SIZE = UNLIMITED_BYTES


def _time_against_per_item(measurer: Measurer, shapes, knob: str, way: str) -> tuple[list, list, list]:
    """direct on each shape with ``knob`` (one of its byte limits on where its input planes come
    from) at no limit, labelled ``way``, and at 0 (``"per item"``: every work item gathers its own
    rows): the rows of times with the input's bytes, and the bytes of the inputs on which ``way``,
    then per item, is faster by MIN_GAIN."""
    rows, faster, slower = [], [], []
    for shape in shapes:
        t = measurer.time(shape, {"per item": ("direct", {knob: 0}), way: ("direct", {knob: UNLIMITED_BYTES})})
        nbytes = measurer.arrays(shape)[0].x_bytes
        rows.append({"shape": shape[0], "bytes": nbytes, **t})
        if t[way] <= (1 - MIN_GAIN) * t["per item"]:
            faster.append(nbytes)
        elif t["per item"] <= (1 - MIN_GAIN) * t[way]:
            slower.append(nbytes)
    return rows, faster, slower


def _search_in_place(measurer: Measurer, shapes, found: Found) -> None:
    """In place or gathered per work item, timed on large unpadded inputs: where in place wins
    by MIN_GAIN, at any size; where gathering wins, from half the smallest such input (if the
    limit in force is above it); otherwise the limit stays."""
    rows, faster, slower = _time_against_per_item(measurer, shapes, "direct_in_place_max_bytes", "in place")
    if not rows:
        return
    found.record["direct in place"] = rows
    current = KNOBS.direct_in_place_max_bytes
    ratios = ", ".join(f"{r['shape']} {r['in place'] / r['per item']:.2f}x" for r in rows)
    if faster and not slower:
        if current < IN_PLACE_ANY_SIZE:
            found.knobs["direct_in_place_max_bytes"] = IN_PLACE_ANY_SIZE
        found.lines.append(f"direct reads unpadded inputs in place at any size (in place / per item: {ratios})")
    elif slower and not faster and current >= min(slower):
        found.knobs["direct_in_place_max_bytes"] = min(slower) // 2
        found.lines.append(f"direct gathers unpadded inputs above {min(slower) // 2 / 2**20:g} MiB per work item "
                           f"(in place / per item: {ratios})")
    else:
        limit = "at any size" if current >= IN_PLACE_ANY_SIZE else f"up to {current / 2**20:g} MiB"
        found.lines.append(f"direct reads unpadded inputs in place {limit} (in place / per item: {ratios})")


def _search_whole(measurer: Measurer, shapes, found: Found) -> None:
    """Gathered whole once or per work item, timed on padded inputs: where per item wins by
    MIN_GAIN, inputs are gathered whole only up to half the smallest such input (if the limit in
    force is above it); otherwise the limit stays (a win at these sizes says nothing of larger
    inputs, where gathering whole has lost by up to 4.8x)."""
    rows, _, slower = _time_against_per_item(measurer, shapes, "direct_whole_input_max_bytes", "whole")
    if not rows:
        return
    found.record["direct whole"] = rows
    current = KNOBS.direct_whole_input_max_bytes
    ratios = ", ".join(f"{r['shape']} {r['whole'] / r['per item']:.2f}x" for r in rows)
    if slower and current >= min(slower):
        found.knobs["direct_whole_input_max_bytes"] = min(slower) // 2
        found.lines.append(f"direct gathers padded inputs whole up to {min(slower) // 2 / 2**20:g} MiB "
                           f"(whole / per item: {ratios})")
    else:
        found.lines.append(f"direct gathers padded inputs whole up to {current / 2**20:g} MiB "
                           f"(whole / per item: {ratios})")


# -- Winograd -----------------------------------------------------------------------------------
def search_winograd(measurer: Measurer, shapes, *, full: bool) -> Found:
    """Winograd's GEMM register tile and chunk size (float32)."""
    found = Found()
    current = KNOBS.lookup("winograd_register_tile", "float32")
    tiles = {f"{MR}x{NR}": (MR, NR) for MR, NR in WINOGRAD_TILES[host_isa()]}
    tiles.setdefault(f"{current[0]}x{current[1]}", current)
    label = _pick(measurer, shapes, "winograd", "winograd_register_tile", tiles, f"{current[0]}x{current[1]}",
                  found, "winograd register tile")
    tile = tiles[label]
    if tile != current:
        found.knobs["winograd_register_tile"] = {"float32": tile}
    chunk = KNOBS.winograd_chunk_bytes
    factors = (0.25, 0.5, 2.0, 4.0) if full else (0.5, 2.0)
    chunks = {f"{chunk >> 20} MiB": chunk, **{f"{int(chunk * f) / 2**20:g} MiB": int(chunk * f) for f in factors}}
    with KNOBS.override(winograd_register_tile=tile):
        label = _pick(measurer, shapes, "winograd", "winograd_chunk_bytes", chunks, f"{chunk >> 20} MiB", found,
                      "winograd chunk")
    if chunks[label] != chunk:
        found.knobs["winograd_chunk_bytes"] = chunks[label]
    return found


# -- depthwise ----------------------------------------------------------------------------------
def depthwise_ways_candidates(current: int, *, full: bool) -> tuple[int, ...]:
    """The output positions per step tried: :data:`DEPTHWISE_WAYS` in the full mode, else the
    value in force and its double (one compile)."""
    return tuple(sorted({*DEPTHWISE_WAYS, current} if full else {current, 2 * current}))


def search_depthwise(measurer: Measurer, shapes, *, full: bool) -> Found:
    """Which small stride-1 planes depthwise computes as whole planes, then the channel-blocked
    way's output positions per step and band size (float32).

    Parameters
    ----------
    measurer : Measurer
    shapes : sequence of shape tuples
        Depthwise layers (``groups == C``) with at least ``depthwise_channel_block_min_filters``
        filters; the positions per step and the band are measured on those the channel-blocked
        way serves once the plane size is chosen.
    full : bool
        Try every value of :data:`DEPTHWISE_WAYS` and the wider factors of
        :data:`DEPTHWISE_BAND_FACTORS`.

    Returns
    -------
    Found
        ``depthwise_whole_plane_max_positions``, ``depthwise_channel_block_ways`` and
        ``depthwise_channel_block_bytes`` where they beat the values in force.
    """
    found = Found()
    positions = KNOBS.depthwise_whole_plane_max_positions
    small = whole_plane_shapes(shapes)
    if small:
        candidates = {f"{v} positions": v for v in sorted({*DEPTHWISE_WHOLE_PLANE_POSITIONS, positions})}
        label = _pick(measurer, small, "depthwise", "depthwise_whole_plane_max_positions", candidates,
                      f"{positions} positions", found, "depthwise whole planes")
        if candidates[label] != positions:
            found.knobs["depthwise_whole_plane_max_positions"] = positions = candidates[label]
    with KNOBS.override(depthwise_whole_plane_max_positions=positions):
        shapes = [s for s in shapes if uses_channel_blocks(measurer.arrays(s)[0])] or shapes
        _search_channel_blocks(measurer, shapes, full, found)
    return found


def _search_channel_blocks(measurer: Measurer, shapes, full: bool, found: Found) -> None:
    """The channel-blocked way's positions per step, then its band size, into ``found``."""
    ways = KNOBS.depthwise_channel_block_ways
    candidates = {f"{v} ways": v for v in depthwise_ways_candidates(ways, full=full)}
    label = _pick(measurer, shapes, "depthwise", "depthwise_channel_block_ways", candidates, f"{ways} ways", found,
                  "depthwise ways")
    chosen_ways = candidates[label]
    if chosen_ways != ways:
        found.knobs["depthwise_channel_block_ways"] = chosen_ways
    band = KNOBS.depthwise_channel_block_bytes
    factors = DEPTHWISE_BAND_FACTORS["full" if full else "quick"]
    bands = {f"{band / 1024:g} KiB": band, **{f"{int(band * f) / 1024:g} KiB": int(band * f) for f in factors}}
    # The band is sized for the positions per step chosen above: both are measured together.
    with KNOBS.override(depthwise_channel_block_ways=chosen_ways):
        label = _pick(measurer, shapes, "depthwise", "depthwise_channel_block_bytes", bands, f"{band / 1024:g} KiB",
                      found, "depthwise band")
    if bands[label] != band:
        found.knobs["depthwise_channel_block_bytes"] = bands[label]


# -- auto ---------------------------------------------------------------------------------------
#: The thresholds of auto's CPU rules and the values tried for each.
AUTO_LADDERS = {
    "auto_depthwise_max_taps": (0, 9, 25, 49, 81),
    "auto_thin_filters": (4, 8, 16, 32, 64),
    "auto_thin_reduction": (9, 16, 32, 64, 128),
    "auto_thin_pointwise_reduction": (8, 16, 32, 64),
    "auto_winograd_min_channels": (16, 32, 64, 128, 1 << 30),
    "auto_winograd_min_pixels": (64, 256, 1024, 4096),
    "auto_winograd_min_image": (1, 8, 14, 28),
    "auto_direct_max_filters": (0, 64, 128, 256, 512),
    "auto_direct_max_reduction": (0, 256, 512, 1152, 2304),
}


def _auto_cost(table: list, values: dict) -> tuple[float, int]:
    """(geomean of auto's time over the fastest's, shapes within 10%) under ``values``."""
    logs, within = [], 0
    with KNOBS.override(**values):
        for problem, candidates, times in table:
            algo, _ = rule_choice(problem, "cpu", candidates)
            best = min(times.values())
            ratio = times.get(algo, math.inf) / best
            logs.append(math.log(ratio) if math.isfinite(ratio) else math.log(10.0))
            within += ratio <= 1.1
    return math.exp(sum(logs) / len(logs)), within


def fit_auto_thresholds(table: list) -> dict:
    """The threshold values (a coordinate descent over :data:`AUTO_LADDERS`, two passes) that
    minimise the geometric mean of auto's time over the fastest algorithm's on ``table``
    (``[(problem, candidates, {algo: seconds})]``). Only changes worth :data:`MIN_GAIN` / 3 each
    are taken, so the measured defaults stay where the shapes cannot tell values apart."""
    values = {name: getattr(KNOBS, name) for name in AUTO_LADDERS}
    cost, _ = _auto_cost(table, values)
    for _ in range(2):
        for name, ladder in AUTO_LADDERS.items():
            for value in ladder:
                trial = {**values, name: value}
                trial_cost, _ = _auto_cost(table, trial)
                if trial_cost < cost * (1 - MIN_GAIN / 3):
                    values, cost = trial, trial_cost
    return values


def auto_candidates(problem, *, full: bool) -> list[str]:
    """The algorithms the auto stage times on ``problem``: every one that serves it (full mode),
    or those auto's CPU rules can pick (quick mode). The fit is the same either way (an algorithm
    auto never runs only moves the fastest time of a shape, the same under every threshold), and
    the quick mode compiles and times neither ``im2col`` nor ``winograd2``."""
    serving = registry.serving_algorithms("conv2d", "cpu", problem)
    return serving if full else [a for a in serving if a in CPU_RULE_ALGORITHMS] or serving


def search_auto(measurer: Measurer, shapes, *, full: bool) -> Found:
    """Time the algorithms of :func:`auto_candidates` on each shape; fit auto's thresholds to the
    result."""
    found = Found()
    table, rows = [], []
    for shape in shapes:
        problem = measurer.arrays(shape)[0]
        candidates = auto_candidates(problem, full=full)
        times = measurer.time(shape, {algo: (algo, {}) for algo in candidates})
        times = {a: t for a, t in times.items() if math.isfinite(t)}
        if times:
            table.append((problem, [a for a in candidates if a in times], times))
            rows.append({"shape": shape[0], "seconds": times})
    before = {name: getattr(KNOBS, name) for name in AUTO_LADDERS}
    after = fit_auto_thresholds(table)
    (cost_before, within_before), (cost_after, within_after) = _auto_cost(table, before), _auto_cost(table, after)
    found.knobs.update({name: v for name, v in after.items() if v != before[name]})
    found.record["auto"] = {"shapes": rows, "before": {"geomean": cost_before, "within_10pct": within_before},
                            "after": {"geomean": cost_after, "within_10pct": within_after}}
    changed = ", ".join(f"{name}={after[name]} (was {before[name]})" for name in after if after[name] != before[name])
    found.lines.append(f"auto on {len(table)} shapes: {cost_before:.3f}x -> {cost_after:.3f}x the fastest (geomean), "
                       f"within 10% on {within_before} -> {within_after}; " + (changed or "thresholds unchanged"))
    return found


#: The stages of a tuning run, in their order: ``(name, run)`` with ``run(measurer, sets, full)``
#: searching the shape sets of :func:`convlib.tune.tune` and returning a :class:`Found`. Both the
#: tuning process and :mod:`convlib.tune.precompile`'s workers run them from here; the names of
#: the search functions are looked up at each call.
STAGES = (
    ("blis", lambda measurer, sets, full: search_blis(measurer, sets["blis"], full=full)),
    ("direct", lambda measurer, sets, full: search_direct(measurer, sets["direct"], sets["serial"],
                                                          sets["in place"], sets["whole"])),
    ("winograd", lambda measurer, sets, full: search_winograd(measurer, sets["winograd"], full=full)),
    ("depthwise", lambda measurer, sets, full: search_depthwise(measurer, sets["depthwise"], full=full)),
    ("auto", lambda measurer, sets, full: search_auto(measurer, sets["auto"], full=full)),
)


def cache_line() -> str:
    c = cache_sizes()
    return (f"caches ({c['source']}): L1d {c['L1d'] >> 10} KiB, L2 {c['L2'] >> 10} KiB, "
            f"L3 {c['L3'] >> 20} MiB; blocks scaled from them: {_blocking_label(blis_blocking('float32'))}")


__all__ = ["Measurer", "Found", "STAGES", "search_blis", "search_direct", "search_winograd", "search_depthwise",
           "search_auto", "auto_candidates", "fit_auto_thresholds"]
