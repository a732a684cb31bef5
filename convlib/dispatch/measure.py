"""``choose_algorithm(..., measure=True)``: time every candidate as a :class:`~.plan.Plan`, remember
the fastest in the tuning cache (:mod:`convlib.dispatch.tuning`).

Timing semantics are those of every convlib figure (:mod:`convlib.core.timing`): the candidates'
plans run on random data already on the device (uniform in [-1, 1), made once), each call
synchronised, copies in and out not timed; one warm-up call each, then interleaved repeats, and
the median per candidate.
"""

from __future__ import annotations

import numpy as np

from ..core.problem import ConvProblem
from ..core.timing import time_interleaved
from . import registry, tuning
from .devices import ResolvedDevice
from .plan import plan_for
from .select import Choice


def random_inputs(problem: ConvProblem, seed: int = 0) -> tuple:
    """The operation's arrays (``x, w, bias`` for ``conv2d``; ``dy, w, bias`` for the backward
    data pass; ``x, dy`` for the weight pass; ``dy`` for the bias pass), uniform in [-1, 1), in
    the problem's dtype (numpy arrays); the bias is None unless ``problem.has_bias``."""
    rng = np.random.default_rng(seed)

    def uniform(shape):
        a = rng.random(shape, dtype=np.dtype(problem.dtype))
        a *= 2
        a -= 1  # in place: the seed suites' inputs are gigabytes
        return a

    arrays = tuple(uniform(shape) for shape in problem.input_shapes)
    if problem.operation in ("conv2d", "conv2d_backward_data"):
        arrays += (uniform(problem.bias_shape) if problem.has_bias else None,)
    return arrays


def time_algorithms(operation: str, problem: ConvProblem, target: ResolvedDevice, algos, repeats: int = 5,
                    warmup: int = 1, seed: int = 0) -> dict[str, float]:
    """Median seconds per call of each algorithm of ``algos`` (``"auto"`` allowed) on ``target``.

    Algorithms that cannot serve the problem are left out; one that raises while timed is left
    out too (the others are still measured).
    """
    arrays = random_inputs(problem, seed)
    calls = {}
    for algo in algos:
        try:
            plan = plan_for(operation, problem, target, algo)
        except NotImplementedError:
            continue
        calls[algo] = plan.timed_call(*plan.prepare(*arrays))
    timings = time_interleaved(calls, repeats, warmup)
    return {name: t.median_s for name, t in timings.items() if t.error is None and t.times_s}


def choose_by_measuring(operation: str, problem: ConvProblem, target: ResolvedDevice, repeats: int = 5) -> Choice:
    """Time every algorithm that can serve ``problem`` on ``target``, remember and return the fastest."""
    candidates = registry.serving_algorithms(operation, target.name, problem)
    timings = time_algorithms(operation, problem, target, candidates, repeats=repeats)
    if not timings:
        raise RuntimeError(f"no candidate could be timed for {problem.describe()} on {target.name}")
    best = min(timings, key=timings.get)
    tuning.store(tuning.problem_key(operation, problem, target.identity), best, timings)
    return Choice(best, f"measured fastest of {len(candidates)} candidates ({timings[best] * 1e3:.3g} ms)",
                  tuple(candidates), timings)
