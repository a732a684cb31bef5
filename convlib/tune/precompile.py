"""Compile the kernels the tuner will time before it times anything, in several processes at once.

A first run on a machine spends most of its time in numba compiling kernels, one after the other
(about 300 of 364 s on a 2-core Zen 5 with an empty numba cache: some 100 specialisations of the
drivers, register blocks and filter sizes the stages try), while the other cores wait. The
kernels are cached on disk (``cache=True``), and a process that looks for a specialisation reads
the cache's index at that moment, so other processes can fill the cache for the tuning process:
each runs stages with :class:`FirstCalls`, a measurer that calls every variant once and times
nothing, which compiles exactly what the stage's real run will call. The tuning process then loads
the kernels instead of compiling them (the variants that a stage's *choice* brings into later
stages, e.g. another Winograd tile in the ``auto`` stage, are still compiled there).

The work is cut into units (a stage, or one ``auto`` shape: :func:`work_units`) that the workers
take one at a time as they finish the last, so that the slowest compiler is not left with a fixed
half. Each worker is a fresh interpreter (``python -m convlib.tune.precompile``: the shape sets as
a JSON line on stdin, then one unit per line, a line back for each), not a fork or spawn of the
caller: a script that calls ``convlib.tune()`` without a ``__main__`` guard is not run again, and
no thread pool is copied mid-flight. A unit that fails only costs its time: whatever it did not
compile, the tuning process compiles itself.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time

from ..cpu.tables import KNOBS
from ..dispatch.plan import make_plan
from . import search
from .search import Measurer

#: The units of work, handed out in this order to whichever worker is free: the stages whose
#: kernels the others share first (the drivers of Winograd, blis, direct and depthwise, the slowest
#: to compile leading), then ResNet's ``auto`` shapes (the same drivers: found in the cache by
#: then), then every other ``auto`` shape on its own, the single-channel filters first (each
#: compiles kernels of its own filter size: 30-45 s apiece on a Zen 3). With two fixed halves
#: instead, on that Zen 3 one worker finished at 157 s and the other at 291 s.
LEADING_UNITS = ("winograd", "blis", "direct", "depthwise", "auto:resnet")


#: Worker processes at most: each compiles with one core, and the units are few.
MAX_WORKERS = 4


def _is_resnet(shape) -> bool:
    """Whether an ``auto`` shape is one of ResNet's (they make up the one unit ``"auto:resnet"``)."""
    return shape[0].startswith("resnet")


def work_units(sets: dict) -> list:
    """The units of :func:`precompile` for the shape ``sets``: :data:`LEADING_UNITS`, then
    ``"auto:<shape name>"`` for each ``auto`` shape not of ResNet, filters first."""
    others = [s[0] for s in sets["auto"] if not _is_resnet(s)]
    return [*LEADING_UNITS, *(f"auto:{name}" for name in sorted(others, key=lambda name: not name.startswith("filter")))]


class FirstCalls(Measurer):
    """A :class:`~convlib.tune.search.Measurer` that makes every variant's first call (compiling its
    kernels) and reports the same time for all, so that every search keeps the values in force and
    later calls stay on the path a real run starts on."""

    def __init__(self):
        super().__init__(repeats=0, max_seconds=0.0)

    def time(self, shape, variants):
        problem, x, w = self.arrays(shape)
        for algo, overrides in variants.values():
            try:
                with KNOBS.override(**overrides):
                    plan = make_plan("conv2d", problem, "cpu", algo)
                    plan.execute(*plan.prepare(x, w, None))
            except Exception:  # noqa: BLE001 -- the tuning process will meet and report it
                pass
        return {label: 1.0 for label in variants}


def _auto_part(shapes, part: str):
    """The ``auto`` shapes of one unit: ResNet's layers (``"resnet"``) or the shape named ``part``."""
    if part == "resnet":
        return [s for s in shapes if _is_resnet(s)]
    return [s for s in shapes if s[0] == part]


def run_stages(stages, sets: dict, full: bool) -> None:
    """Run ``stages`` (names, ``"auto:<part>"`` for some of the ``auto`` shapes: see
    :func:`_auto_part`) with :class:`FirstCalls` on the shape ``sets`` of :func:`convlib.tune.tune`."""
    KNOBS.apply_profile({})  # the tuner starts from the built-in values too, whatever profile exists
    measurer = FirstCalls()
    runs = dict(search.STAGES)
    for stage in stages:
        name, _, part = stage.partition(":")
        if name not in runs:
            raise ValueError(f"unknown stage {stage!r}")
        stage_sets = {**sets, "auto": _auto_part(sets["auto"], part)} if part else sets
        if part and not stage_sets["auto"]:  # an empty part of the auto shapes compiles nothing
            continue
        runs[name](measurer, stage_sets, full)


def precompile(sets: dict, full: bool, workers: int | None = None) -> tuple[float, int, list]:
    """Fill numba's cache with the kernels the stages will call: :func:`work_units` in parallel,
    each unit to the next worker process that is free.

    Parameters
    ----------
    sets : dict
        The shape sets of :func:`convlib.tune.tune` (tuples of names and ints).
    full : bool
        The full mode's candidates.
    workers : int, optional
        Processes at once (default: one per CPU this process may run on, at most 4). With fewer
        than two nothing is done: the tuning process compiles as it goes, as fast as one worker
        would.

    Returns
    -------
    (seconds, workers, errors) : (float, int, list of str)
        Wall time spent, the processes run (0 when none was), and one line per unit that failed
        (or per worker that died).
    """
    from numba import config

    if workers is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cpus = os.cpu_count() or 1
        workers = min(MAX_WORKERS, cpus)
    if workers < 2 or config.DISABLE_JIT:
        return 0.0, 0, []
    started = time.perf_counter()
    units = queue.SimpleQueue()
    for unit in work_units(sets):
        units.put(unit)
    header = json.dumps({"sets": {k: [list(s) for s in v] for k, v in sets.items()}, "full": full})
    errors = []
    logs = [tempfile.TemporaryFile() for _ in range(workers)]
    procs = [subprocess.Popen([sys.executable, "-m", "convlib.tune.precompile"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1) for log in logs]
    threads = [threading.Thread(target=_feed, args=(proc, log, header, units, errors), daemon=True)
               for proc, log in zip(procs, logs)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for proc, log in zip(procs, logs):  # interrupted: leave no compiler running
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            log.close()
    return time.perf_counter() - started, workers, errors


def _feed(proc, log, header: str, units, errors: list) -> None:
    """Hand ``proc`` the next unit each time it reports the last one done, until none is left;
    append a line to ``errors`` for each unit it reports failed, or the last line of its ``log``
    (its stderr) if it dies."""
    try:
        proc.stdin.write(header + "\n")
        while True:
            try:
                unit = units.get_nowait()
            except queue.Empty:
                break
            proc.stdin.write(unit + "\n")
            reply = proc.stdout.readline()
            if not reply:
                raise BrokenPipeError
            if reply.startswith("error"):
                errors.append(f"{unit}: {reply[len('error '):].strip()}")
        proc.stdin.close()
        proc.wait()
    except (BrokenPipeError, OSError):
        proc.wait()
        log.seek(0)
        lines = log.read().decode(errors="replace").strip().splitlines()
        errors.append(lines[-1] if lines else f"exit status {proc.returncode}")


def main() -> int:
    """A worker: the shape sets as a JSON line, then one unit per line; a line back for each."""
    replies, sys.stdout = sys.stdout, sys.stderr  # whatever a stage prints stays out of the replies
    task = json.loads(sys.stdin.readline())
    sets = {k: tuple(tuple(s) for s in v) for k, v in task["sets"].items()}
    for line in sys.stdin:
        try:
            run_stages([line.strip()], sets, task["full"])
        except Exception as exc:  # noqa: BLE001 -- reported to the tuning process, which goes on
            print("error " + f"{type(exc).__name__}: {exc}".replace("\n", " "), file=replies, flush=True)
        else:
            print("ok", file=replies, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
