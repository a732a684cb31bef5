"""Tune convlib's CPU kernels on this machine: ``convlib.tune()`` or ``python -m convlib.tune``.

The built-in block sizes, register tiles and ``auto`` thresholds were measured on a few machines
and scaled to this one's caches (:mod:`convlib.cpu.tables`); the best values still differ per
processor. Tuning measures, on this machine and with numba's thread count, on small shapes like
the layers people run (:mod:`convlib.tune.shapes`):

==========================  ===============================================================
BLIS                        the cache block sizes KC and MC (NC and the register tile MR x NR
                            too in the full mode: each tile is a 20-60 s compile)
direct                      the relative speed of each register block (which its choice weighs
                            against padding waste), and below how many FLOPs it runs on one thread
Winograd                    its GEMM's register tile and the chunk size of its three passes
depthwise                   the channel-blocked way's band size and its output positions per
                            step (the value in force and its double; 1, 2, 4, 8 in the full mode)
``auto``                    the thresholds of its rules (``auto_*`` knobs), fitted to the time of
                            every algorithm on 20-25 layers of ResNet-50, MobileNetV2, image
                            filters and few-channel images
==========================  ===============================================================

A value replaces the one in force only when it is 3% faster in geometric mean over its shapes
(:data:`convlib.tune.search.MIN_GAIN`). What wins is written to the machine's profile
(:mod:`convlib.cpu.profile`: keyed by CPU model, instruction set, caches, thread count and
convlib version) and used from then on by the kernels and ``auto``, in this process and the
next; ``python -m convlib.tune --show`` prints it, ``--forget`` deletes it.

The quick mode (default) takes one to two minutes on two cores once the kernels are compiled.
A first run also compiles them, into numba's disk cache, before it times anything: worker
processes call every variant the stages will time once, two at a time
(:mod:`convlib.tune.precompile`); on a 2-core Zen 5 with an empty numba cache that run took
123-137 s in all, against 321-374 s compiling in the tuning process as it went.
``python -m convlib.tune`` prints what each stage spent; ``mode="full"`` tries more values and
takes longer. Only float32 is tuned; float64 keeps the table's rows.

``convlib.tune`` is this module, and calling it runs :func:`tune`.
"""

from __future__ import annotations

import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

from ..cpu import profile as cpu_profile
from ..cpu.tables import KNOBS, VALUE_TYPES
from . import precompile, search, shapes

MODES = ("quick", "full")


@dataclass
class TuneResult:
    """What :func:`tune` chose.

    Attributes
    ----------
    knobs : dict
        The knob values that differ from the built-in and machine-derived defaults.
    path : Path or None
        Where the profile was written (None with ``save=False``).
    seconds : float
        How long tuning took.
    lines : list of str
        One line per decision, for people.
    measurements : dict
        Every time measured, as stored in the profile.
    stage_seconds : dict
        Seconds each stage took (``"blis"``, ``"direct"``, ...), first kernel compilations
        included: where a first run's time went.
    """

    knobs: dict
    path: Path | None
    seconds: float
    lines: list = field(default_factory=list)
    measurements: dict = field(default_factory=dict)
    stage_seconds: dict = field(default_factory=dict)

    def report(self) -> str:
        """The decisions, one per line, the time of each stage, and where they were saved."""
        where = f"profile: {self.path}" if self.path else "not saved (save=False)"
        stages = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in self.stage_seconds.items())
        return "\n".join([*self.lines, f"tuned in {self.seconds:.0f} s ({stages}); {where}"])


def _progress_bar(total: int, enabled: bool):
    """A tqdm bar when tqdm is installed (the ``bench`` extra), else a plain line per stage."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="call", dynamic_ncols=True, file=sys.stderr, desc="tune")


def tune(mode: str = "quick", *, progress: bool = True, save: bool = True, path=None,
         shape_sets: dict | None = None) -> TuneResult:
    """Measure the CPU knobs on this machine and keep the fastest in its profile.

    Parameters
    ----------
    mode : {"quick", "full"}
        ``"quick"`` (about two minutes on two cores, compiled kernels) or ``"full"`` (more
        candidates, the BLIS register tiles among them; longer).
    progress : bool
        Show a progress bar (tqdm, when installed) and a line per decision on stderr.
    save : bool
        Write the profile (default). With False the values apply to this process only.
    path : str or Path, optional
        Where to write the profile; default this machine's file in
        ``$CONVLIB_CACHE_DIR/profiles/`` (or ``CONVLIB_PROFILE``).
    shape_sets : dict, optional
        Replace some shape sets of :mod:`convlib.tune.shapes` (keys ``"blis"``, ``"direct"``,
        ``"serial"``, ``"in place"``, ``"whole"``, ``"winograd"``, ``"depthwise"``, ``"auto"``);
        for tests and experiments.

    Returns
    -------
    TuneResult

    Notes
    -----
    Tuning starts from the built-in and machine-derived values (an earlier profile is set aside
    while it measures), times with numba's thread count, and applies what it found to this process
    as it goes; if it is interrupted, the earlier profile is put back.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: allowed are {', '.join(map(repr, MODES))}")
    from numba import config, get_num_threads, set_num_threads

    full = mode == "full"
    sets = {
        "blis": shapes.BLIS_SHAPES, "direct": shapes.DIRECT_SHAPES, "serial": shapes.SERIAL_LADDER,
        "in place": shapes.IN_PLACE_SHAPES, "whole": shapes.WHOLE_SHAPES, "winograd": shapes.WINOGRAD_SHAPES,
        "depthwise": shapes.DEPTHWISE_SHAPES,
        "auto": shapes.AUTO_SHAPES if full else shapes.QUICK_AUTO,
        **(shape_sets or {}),
    }
    started = time.perf_counter()
    previous = KNOBS.profile()
    threads_before = get_num_threads()
    set_num_threads(int(config.NUMBA_NUM_THREADS))  # what the profile is keyed by
    measurer = search.Measurer(repeats=9 if full else 5, max_seconds=2.0 if full else 0.4)
    say = (lambda line: print(f"tune: {line}", file=sys.stderr, flush=True)) if progress else (lambda line: None)
    found_knobs, measurements, lines, stage_seconds = {}, {}, [search.cache_line()], {}
    say(lines[0])
    bar = _progress_bar(_planned_calls(sets, measurer, full), progress)
    if bar is not None:
        measurer.tick = bar.update
    try:
        KNOBS.apply_profile({})
        if bar is not None:
            bar.set_description("tune compile")
        compile_seconds, workers, errors = precompile.precompile(sets, full)
        if workers:
            stage_seconds["compile"] = compile_seconds
            line = (f"kernels compiled (or found in numba's cache) in {compile_seconds:.0f} s, {workers} processes "
                    "at once" + (f"; {len(errors)} failed ({errors[0]}): the stages compile what is missing"
                                 if errors else ""))
            if bar is not None:
                bar.write(f"tune: {line}")
            else:
                say(line)
        for name, run in search.STAGES:
            if bar is not None:
                bar.set_description(f"tune {name}")
            stage_started = time.perf_counter()
            found = run(measurer, sets, full)
            stage_seconds[name] = time.perf_counter() - stage_started
            found_knobs.update(found.knobs)
            measurements.update(found.record)
            # Later stages measure with what the earlier ones chose (auto times the tuned kernels).
            KNOBS.apply_profile(found_knobs)
            for line in found.lines:
                lines.append(line)
                if bar is not None:
                    bar.write(f"tune: {line}")
                else:
                    say(line)
    except BaseException:
        KNOBS.apply_profile(previous)
        raise
    finally:
        if bar is not None:
            bar.close()
        set_num_threads(threads_before)
    seconds = time.perf_counter() - started
    saved = cpu_profile.save_profile(found_knobs, measurements, table=(KNOBS.knobs(), VALUE_TYPES),
                                     mode=mode, seconds=seconds, path=path) if save else None
    return TuneResult(found_knobs, saved, seconds, lines, measurements, stage_seconds)


def _planned_calls(sets: dict, measurer, full: bool) -> int:
    """Calls the stages will make (for the progress bar's total)."""
    from ..cpu.isa import host_isa
    from ..cpu.tables import blis_blocking, direct_blockings

    per = measurer.calls_per_variant()
    blis, tile = blis_blocking("float32"), KNOBS.lookup("winograd_register_tile", "float32")
    blis_tiles = len(set(search.BLIS_TILES[host_isa()]) | {(blis.MR, blis.NR)})
    blis_variants = (blis_tiles if full else 0) + 3 * (3 if full else 2)
    winograd_variants = len(set(search.WINOGRAD_TILES[host_isa()]) | {tile}) + (5 if full else 3)
    ways = KNOBS.depthwise_channel_block_ways
    depthwise_variants = (len(search.depthwise_ways_candidates(ways, full=full))
                          + 1 + len(search.DEPTHWISE_BAND_FACTORS["full" if full else "quick"]))
    # The plane-size pick runs first, on the stride-1 shapes it can tell apart (an estimate: the
    # channel-block picks then run on the shapes that stay channel-blocked, here counted whole).
    depthwise_small = len(search.whole_plane_shapes(sets["depthwise"]))
    whole_plane_variants = len({*search.DEPTHWISE_WHOLE_PLANE_POSITIONS, KNOBS.depthwise_whole_plane_max_positions})
    auto_variants = sum(len(search.auto_candidates(measurer.arrays(s)[0], full=full)) for s in sets["auto"])
    return per * (blis_variants * len(sets["blis"]) + len(direct_blockings("float32")) * len(sets["direct"])
                  + 2 * len(sets["serial"]) + 2 * len(sets["in place"]) + 2 * len(sets["whole"])
                  + winograd_variants * len(sets["winograd"])
                  + depthwise_variants * len(sets["depthwise"]) + whole_plane_variants * depthwise_small
                  + auto_variants)


def show() -> str:
    """This machine's profile: where it is, and the knob values it sets (or why there is none)."""
    try:
        path = cpu_profile.profile_path()
    except Exception as exc:  # noqa: BLE001
        return f"no profile: {exc}"
    if path is None:
        return "profiles are off (CONVLIB_PROFILE=off)"
    if not path.exists():
        return f"no profile at {path}: run `python -m convlib.tune`"
    knobs = KNOBS.profile()
    try:
        data = cpu_profile.read_profile(path)
    except (OSError, ValueError) as exc:
        return f"the profile {path} is not used: {exc}"
    if not knobs and data.get("knobs"):
        return f"the profile {path} is not used (measured on another machine or setup; see the warning)"
    lines = [f"profile {path} ({data.get('mode')} mode, {data.get('created')}, {data.get('seconds')} s)"]
    lines += [f"  {name} = {value!r}" for name, value in knobs.items()] or ["  (every value as built in)"]
    return "\n".join(lines)


def forget() -> Path | None:
    """Delete this machine's profile; the built-in and machine-derived values apply again."""
    path = cpu_profile.profile_path()
    if path is not None and path.exists():
        path.unlink()
    KNOBS.apply_profile({})
    return path


class _CallableModule(types.ModuleType):
    """``convlib.tune`` is both this module and a function: calling the module runs :func:`tune`."""

    def __call__(self, mode: str = "quick", **kwargs) -> TuneResult:
        return tune(mode, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["tune", "TuneResult", "show", "forget", "MODES"]
