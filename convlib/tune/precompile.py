"""Compile the kernels the tuner will time before it times anything, in several processes at once.

A first run on a machine spends most of its time in numba compiling kernels, one after the other
(about 300 of 364 s on a 2-core Zen 5 with an empty numba cache: some 100 specialisations of the
drivers, register blocks and filter sizes the stages try), while the other cores wait. The
kernels are cached on disk (``cache=True``), and a process that looks for a specialisation reads
the cache's index at that moment, so other processes can fill the cache for the tuning process:
each runs some stages with :class:`FirstCalls`, a measurer that calls every variant once and times
nothing, which compiles exactly what the stage's real run will call. The tuning process then loads
the kernels instead of compiling them (the variants that a stage's *choice* brings into later
stages, e.g. another Winograd tile in the ``auto`` stage, are still compiled there).

Each worker is a fresh interpreter (``python -m convlib.tune.precompile``, its task as JSON on
stdin), not a fork or spawn of the caller: a script that calls ``convlib.tune()`` without a
``__main__`` guard is not run again, and no thread pool is copied mid-flight. A worker that fails
only costs its time: whatever it did not compile, the tuning process compiles itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from ..cpu.tables import KNOBS
from ..dispatch.plan import make_plan
from . import search
from .search import Measurer

#: The stages each worker runs, in order: what every stage shares (the drivers of blis, direct,
#: Winograd and depthwise) is compiled early by one worker, so that when the ``auto`` halves run
#: (the other filter sizes, strides and ways of the same drivers) the shared kernels are already in
#: the cache; the ``auto`` shapes are split by kind so that no filter size is compiled twice.
WORKER_STAGES = (
    ("blis", "direct", "auto:resnet"),
    ("winograd", "depthwise", "auto:other"),
)


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
    """The ``auto`` shapes of one worker: ResNet's layers, or every other kind."""
    resnet = [s for s in shapes if s[0].startswith("resnet")]
    return resnet if part == "resnet" else [s for s in shapes if not s[0].startswith("resnet")]


def run_stages(stages, sets: dict, full: bool) -> None:
    """Run ``stages`` (names, ``"auto:<part>"`` for half of the ``auto`` shapes) with
    :class:`FirstCalls` on the shape ``sets`` of :func:`convlib.tune.tune`."""
    KNOBS.apply_profile({})  # the tuner starts from the built-in values too, whatever profile exists
    measurer = FirstCalls()
    runs = dict(search.STAGES)
    for stage in stages:
        name, _, part = stage.partition(":")
        if name not in runs:
            raise ValueError(f"unknown stage {stage!r}")
        stage_sets = {**sets, "auto": _auto_part(sets["auto"], part)} if part else sets
        if part and not stage_sets["auto"]:  # an empty half of the auto shapes compiles nothing
            continue
        runs[name](measurer, stage_sets, full)


def precompile(sets: dict, full: bool, workers: int | None = None) -> tuple[float, int, list]:
    """Fill numba's cache with the kernels the stages will call, :data:`WORKER_STAGES` in parallel.

    Parameters
    ----------
    sets : dict
        The shape sets of :func:`convlib.tune.tune` (tuples of names and ints).
    full : bool
        The full mode's candidates.
    workers : int, optional
        Processes at once (default: one per group of :data:`WORKER_STAGES`, at most the CPUs
        this process may run on). With fewer than two nothing is done: the tuning process
        compiles as it goes, as fast as one worker would.

    Returns
    -------
    (seconds, workers, errors) : (float, int, list of str)
        Wall time spent, the processes run (0 when none was), and the last line each failed one
        wrote to stderr.
    """
    from numba import config

    if workers is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cpus = os.cpu_count() or 1
        workers = min(len(WORKER_STAGES), cpus)
    if workers < 2 or config.DISABLE_JIT:
        return 0.0, 0, []
    groups = [list(g) for g in WORKER_STAGES[:workers]]
    for extra, stages in enumerate(WORKER_STAGES[workers:]):  # fewer workers: fold the rest in
        groups[extra % workers].extend(stages)
    started = time.perf_counter()
    procs = []
    for stages in groups:
        task = json.dumps({"stages": stages, "sets": {k: [list(s) for s in v] for k, v in sets.items()},
                           "full": full})
        log = tempfile.TemporaryFile()
        proc = subprocess.Popen([sys.executable, "-m", "convlib.tune.precompile"], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=log)
        proc.stdin.write(task.encode())
        proc.stdin.close()
        procs.append((proc, log))
    errors = []
    try:
        for proc, log in procs:
            if proc.wait() != 0:
                log.seek(0)
                lines = log.read().decode(errors="replace").strip().splitlines()
                errors.append(lines[-1] if lines else f"exit status {proc.returncode}")
            log.close()
    finally:
        for proc, _ in procs:  # interrupted: leave no compiler running
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return time.perf_counter() - started, workers, errors


def main() -> int:
    task = json.load(sys.stdin)
    sets = {k: tuple(tuple(s) for s in v) for k, v in task["sets"].items()}
    run_stages(task["stages"], sets, task["full"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
