"""convlib's main job: one batch, every algorithm on every device, checked and timed.

Convolves a batch with every algorithm each available device offers, checks that they agree with
each other and with an independent float64 reference (scipy.signal.correlate), and prints a table
(algorithm, device, time, GFLOP/s, error). Exits non-zero if any result is wrong.

Run from the repository root::

    .venv/bin/python examples/quickstart.py
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import convlib
from convlib.testing import TOLERANCE, conv2d_reference_for, relative_error


def best_time(fn, repeats=5):
    """First-call time (includes compilation) and the median of ``repeats`` further calls."""
    t0 = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return out, first, statistics.median(times)


def main() -> int:
    rng = np.random.default_rng(0)
    # A ResNet-like layer: big enough to mean something, small enough to finish in seconds.
    x = rng.standard_normal((8, 32, 28, 28)).astype(np.float32)
    w = rng.standard_normal((64, 32, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(64).astype(np.float32)
    problem = convlib.build_problem(x, w, bias, padding=1)
    reference = conv2d_reference_for(problem, x, w, bias)
    print(f"convlib {convlib.__version__}: {problem.describe()}, {problem.flops / 1e9:.2f} GFLOP per call")
    print(f"devices: {', '.join(convlib.devices())}\n")

    header = f"{'algorithm':<10} {'device':<14} {'first call':>10} {'time':>9} {'GFLOP/s':>8} {'rel. error':>10}  picked by auto"
    print(header)
    print("-" * len(header))
    failures = []
    results = {}
    for device in convlib.devices():
        auto = convlib.choose_algorithm(x, w, bias, padding=1, device=device)
        # Only the algorithms that can serve this layer (depthwise, e.g., serves groups == C alone).
        for algo in auto.candidates:
            def call():
                return convlib.conv2d(x, w, bias, padding=1, algo=algo, device=device)

            y, first, t = best_time(call)
            err = relative_error(y, reference)
            results[(algo, device)] = y
            ok = err <= TOLERANCE["float32"]
            if not ok:
                failures.append(f"{algo} on {device}: relative error {err:.2e}")
            mark = "  <- auto" if algo == auto.algo else ""
            print(f"{algo:<10} {device:<14} {first * 1e3:>8.0f}ms {t * 1e3:>7.2f}ms {problem.flops / t / 1e9:>8.1f}"
                  f" {err:>10.1e}{'' if ok else ' WRONG'}{mark}")
        print(f"{'':<10} {device:<14} auto picks {auto.algo!r}: {auto.reason}")
        others = [a for a in convlib.algorithms(device) if a not in auto.candidates]
        if others:
            print(f"{'':<10} {device:<14} not for this layer: {', '.join(others)}")

    ys = list(results.values())
    spread = max(relative_error(y, ys[0]) for y in ys)
    print(f"\nlargest relative difference between any two algorithms: {spread:.1e}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("all algorithms agree with the scipy float64 reference.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
