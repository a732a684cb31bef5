"""The one timing loop: warm every candidate up, then interleave their timed calls.

Every figure convlib reports -- ``choose_algorithm(measure=True)``, ``python -m convlib.bench``,
the SYCL benchmark and the GPU check -- comes from :func:`time_interleaved`:

1. each candidate is called once (its *first* call: compilation or cache loading, first-touch
   page faults) and ``warmup`` more times;
2. then ``repeats`` timed calls run round-robin over the candidates, starting one candidate later
   each round, so that a noisy, shared machine disturbs all of them alike; a short sleep before
   each call (``gap_s``) lets the threads of the previous candidate stop spinning, and the garbage
   collector is kept out of the timed calls;
3. a :class:`Timing` per candidate keeps every call, and reports the median, the minimum, the
   quartiles and the compile time (first call minus median).

What a call *is* belongs to the caller: :meth:`convlib.dispatch.plan.Plan.timed_call` is one
execution on data already on the device, synchronised (the copies in and out are not timed),
which is what every convlib figure measures. How a call is *clocked* is the ``clock``: the host's
``time.perf_counter`` around the call by default; the GPU check passes a CUDA-event clock that
times the GPU alone.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

@dataclass
class Timing:
    """The calls of one candidate on one shape.

    Attributes
    ----------
    first_s : float
        The first call (compilation or cache load included).
    warmup_s : list of float
        The untimed warm-up calls that followed.
    times_s : list of float
        The timed, interleaved calls.
    error : BaseException or None
        What the candidate raised, if it did (it then has no times).
    """

    first_s: float = math.nan
    warmup_s: list[float] = field(default_factory=list)
    times_s: list[float] = field(default_factory=list)
    error: BaseException | None = None

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s) if self.times_s else math.nan

    @property
    def min_s(self) -> float:
        return min(self.times_s) if self.times_s else math.nan

    @property
    def quartiles_s(self) -> tuple[float, float]:
        """First and third quartile of the timed calls (equal to the median for one call)."""
        if len(self.times_s) < 2:
            return (self.median_s, self.median_s)
        q = statistics.quantiles(self.times_s, n=4, method="inclusive")
        return (q[0], q[2])

    @property
    def compile_s(self) -> float:
        """First call minus the steady (median) call: compilation, cache loading, first touches."""
        return max(0.0, self.first_s - self.median_s) if self.times_s else math.nan


def time_interleaved(
    calls: dict[str, Callable[[], Any]],
    repeats: int,
    warmup: int = 1,
    *,
    max_seconds: float | None = None,
    gap_s: float = 0.0,
    on_first: Callable[[str, Any], None] | None = None,
    tick: Callable[[int], None] | None = None,
    clock: Callable[[Callable[[], Any]], tuple[float, Any]] | None = None,
) -> dict[str, Timing]:
    """Time several zero-argument callables fairly: warm-up, then round-robin repeats.

    Parameters
    ----------
    calls : dict of str to callable
        What to time; each call must return once its work is finished (synchronised).
    repeats : int
        Timed calls per candidate (at least 1).
    warmup : int
        Untimed calls per candidate after the first one.
    max_seconds : float, optional
        Time budget per candidate: a candidate whose warm call takes ``t`` gets
        ``min(repeats, max(1, max_seconds // t))`` timed calls.
    gap_s : float
        Sleep before each call, so the previous candidate's threads go idle first.
    on_first : callable, optional
        ``on_first(name, result)`` with each candidate's first result (e.g. to check it). What it
        raises is recorded as the candidate's error.
    tick : callable, optional
        ``tick(n)`` after each ``n`` calls (progress bars). Called ``len(calls) * (1 + warmup +
        repeats)`` times in total, even when candidates drop out.
    clock : callable, optional
        ``clock(call) -> (seconds, result)``: runs ``call`` once and says how long it took;
        default :func:`wall_clock`.

    Returns
    -------
    dict of str to Timing
        In the order of ``calls``. A candidate that raised has ``error`` set and no times.
    """
    tick = tick or (lambda n: None)
    clock = clock or wall_clock
    repeats = max(1, int(repeats))
    timings = {name: Timing() for name in calls}
    planned: dict[str, int] = {}
    for name, call in calls.items():
        timing = timings[name]
        try:
            timing.first_s, result = _timed_call(clock, call, gap_s)
            if on_first is not None:
                on_first(name, result)
            del result
            for _ in range(warmup):
                seconds, _ = _timed_call(clock, call, gap_s)
                timing.warmup_s.append(seconds)
                tick(1)
        except Exception as exc:  # recorded; one failing candidate must not end the run
            timing.error = exc
            tick(1 + warmup + repeats - len(timing.warmup_s))
            continue
        tick(1)
        steady = timing.warmup_s[-1] if timing.warmup_s else timing.first_s
        planned[name] = repeats if max_seconds is None else min(repeats, max(1, int(max_seconds // max(steady, 1e-9))))
        tick(repeats - planned[name])
    order = list(planned)
    for round_index in range(repeats):
        shift = round_index % len(order) if order else 0
        for name in order[shift:] + order[:shift]:
            timing = timings[name]
            if timing.error is not None or len(timing.times_s) >= planned[name]:
                continue
            gc.collect()
            try:
                seconds, _ = _timed_call(clock, calls[name], gap_s)
            except Exception as exc:  # failed after succeeding once: still report it
                timing.error = exc
                tick(planned[name] - len(timing.times_s))
                continue
            timing.times_s.append(seconds)
            tick(1)
    return timings


def _timed_call(clock, call, gap_s: float) -> tuple[float, Any]:
    if gap_s > 0:
        time.sleep(gap_s)
    return clock(call)


def wall_clock(call: Callable[[], Any]) -> tuple[float, Any]:
    """Host seconds of one ``call`` (which must return once its work is done), with the garbage
    collector kept out: a collection inside a timed call would be charged to whoever is running."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        result = call()
        seconds = time.perf_counter() - t0
    finally:
        if enabled:
            gc.enable()
    return seconds, result
