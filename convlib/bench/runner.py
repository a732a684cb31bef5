"""One benchmark shape, everything: every candidate timed, every answer checked.

Method, per shape:

1. Random inputs (uniform in [-1, 1)) are made once and put on each device once; data transfers
   are not timed (:mod:`convlib.bench.candidates`).
2. A reference answer is computed (:func:`convlib.bench.check.reference_for`) and every
   candidate's first answer is compared with it.
3. The candidates are timed by the one timing loop of :mod:`convlib.core.timing`: a first call
   (compilation or cache loading), ``warmup`` more, then ``repeats`` interleaved timed calls,
   each after a short sleep that lets the previous candidate's threads go idle.
4. The median, minimum and interquartile range of the timed calls are reported; the "compile"
   time is the first call minus the median.
"""

from __future__ import annotations

import math
from typing import Callable

from ..core.problem import ConvProblem
from ..core.timing import time_interleaved
from ..dispatch.measure import random_inputs
from .candidates import Candidate, Skipped, baseline_candidates, convlib_candidates, default_algorithms
from .check import Reference, reference_for, relative_error


def run_problem(
    problem: ConvProblem,
    *,
    devices=("cpu",),
    algos=None,
    baselines=("torch",),
    repeats: int = 5,
    warmup: int = 1,
    max_seconds: float | None = None,
    scipy_max_seconds: float = 10.0,
    gap_s: float = 0.01,
    check: bool = True,
    seed: int = 0,
    tick: Callable[[int], None] | None = None,
) -> list[dict]:
    """Time every candidate on one problem; one record (a flat dict) per candidate.

    Parameters
    ----------
    problem : ConvProblem
    devices : sequence of str
        Devices to run convlib's algorithms on.
    algos : dict of str to list of str, or None
        Algorithms per device (``"auto"`` allowed); None means every algorithm of the device plus
        ``auto``.
    baselines : sequence of str
        ``"torch"`` and/or ``"scipy"`` (run on the CPU, once per shape).
    repeats, warmup, max_seconds, gap_s
        As in :func:`time_interleaved`.
    scipy_max_seconds : float
        Skip the scipy baseline when one call is estimated to take longer.
    check : bool
        Compare every first result with :func:`reference_for`.
    seed : int
        Seed of the random inputs.
    tick : callable, optional
        Progress callback: :func:`planned_calls` ticks per candidate, skipped ones included.

    Returns
    -------
    list of dict
        Keys: ``name, device, kind, status`` (``ok``, ``wrong``, ``error``, ``unsupported``,
        ``unavailable``, ``skipped``), ``note``, ``picked`` and ``reason`` (auto), ``first_s,
        compile_s, median_s, min_s, q25_s, q75_s, iqr_s, repeats, times_s, rel_error,
        reference``.
    """
    inputs = random_inputs(problem, seed)
    # The reference first, so the memory check of the candidates sees what it takes.
    reference = reference_for(problem, *inputs) if check else Reference(None, "none", math.inf)
    candidates: list[Candidate | Skipped] = []
    for device in devices:
        device_algos = algos.get(device) if algos else None
        if device_algos is None:
            device_algos = default_algorithms(device, problem.operation)
        try:
            candidates += convlib_candidates(problem, device, device_algos, *inputs)
        except (ValueError, ImportError) as exc:
            candidates += [Skipped(a, device, "convlib", "unavailable", str(exc)) for a in device_algos]
    candidates += baseline_candidates(problem, baselines, *inputs, scipy_max_seconds=scipy_max_seconds)
    runnable = {c.key: c for c in candidates if isinstance(c, Candidate)}
    if tick is not None:
        tick(planned_calls(len(candidates) - len(runnable), repeats, warmup))

    errors: dict[str, float] = {}
    answer = [reference.y]  # emptied after timing: gigabytes on the seed suites

    def on_first(key, result):
        if answer[0] is not None:
            errors[key] = relative_error(runnable[key].to_host(result), answer[0])

    timings = time_interleaved({k: c.call for k, c in runnable.items()}, repeats, warmup, max_seconds=max_seconds,
                               gap_s=gap_s, on_first=on_first, tick=tick)
    reference_label, tolerance = reference.label, reference.tolerance
    answer.clear()
    del reference
    records = []
    for cand in candidates:
        rec = {"name": cand.name, "device": cand.device, "kind": cand.kind, "status": None, "note": "",
               "picked": None, "reason": None}
        if isinstance(cand, Skipped):
            rec.update(status=cand.status, note=cand.note)
            records.append(rec)
            continue
        timing = timings[cand.key]
        q25, q75 = timing.quartiles_s
        rec.update(picked=cand.picked, reason=cand.reason, first_s=timing.first_s, compile_s=timing.compile_s,
                   median_s=timing.median_s, min_s=timing.min_s, q25_s=q25, q75_s=q75, iqr_s=q75 - q25,
                   repeats=len(timing.times_s), times_s=list(timing.times_s),
                   rel_error=errors.get(cand.key, math.nan), reference=None)
        if timing.error is not None:
            exc = timing.error
            status = "skipped" if isinstance(exc, NotImplementedError) else "error"
            rec.update(status=status, note=f"{type(exc).__name__}: {exc}")
        elif cand.key in errors:
            rec["reference"] = reference_label
            ok = errors[cand.key] <= tolerance
            rec["status"] = "ok" if ok else "wrong"
            if not ok:
                rec["note"] = f"WRONG: relative error {errors[cand.key]:.3g} > {tolerance:.3g} vs {reference_label}"
        else:
            rec["status"] = "ok"
            rec["note"] = "not checked"
        records.append(rec)
    return records


def planned_calls(n_candidates: int, repeats: int, warmup: int) -> int:
    """Progress ticks :func:`time_interleaved` makes for ``n_candidates`` candidates."""
    return n_candidates * (1 + warmup + max(1, repeats))


