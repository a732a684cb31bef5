"""SYCL speed checks against PyTorch and the CPU backend (a benchmark, not a test).

Run under the project's timing lock, with the thread count fixed::

    NUMBA_NUM_THREADS=2 flock /tmp/convlib-bench.lock python -m convlib.bench.sycl seed
    NUMBA_NUM_THREADS=2 flock /tmp/convlib-bench.lock python -m convlib.bench.sycl resnet3x3

``seed``: N=8, C=K=4, H=W=1024, 3x3, float32: SYCL ``direct`` against
``torch.nn.functional.conv2d``. ``resnet3x3``: the 3x3 layers of ResNet-50 v1.5 at batch 8: SYCL
``im2col`` (both GEMMs) and ``blis`` against the same algorithm on the CPU backend. ``compile``:
first-call (kernel compile) times of each algorithm in a fresh process.

Every convlib figure is a :class:`~convlib.dispatch.plan.Plan` timed by
:func:`convlib.core.timing.time_interleaved` (data already on the device, each call
synchronised; medians of interleaved repeats after a warm-up call), so ratios within one run are
comparable on a noisy machine. The seed shape is also timed with numpy in and out (the copies
into and out of USM included): that is ``Plan.run``, what ``convlib.conv2d`` costs a numpy user.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ..core.problem import ConvProblem
from ..core.timing import time_interleaved
from ..dispatch.devices import resolve_device
from ..dispatch.plan import plan_for
from .candidates import torch_conv
from .suites import RESNET50_V15_LAYERS


def _with_engine(call, engine: str | None):
    """``call`` run with the SYCL ``im2col_gemm`` knob set to ``engine`` (None: unchanged)."""
    if engine is None:
        return call
    from ..sycl.tables import KNOBS

    def wrapped():
        with KNOBS.override(im2col_gemm=engine):
            return call()

    return wrapped


def plan_call(problem, device, algo, x, w, engine: str | None = None):
    """A timed call of ``algo`` on ``device`` with ``x`` and ``w`` already placed there."""
    plan = plan_for("conv2d", problem, resolve_device(device), algo)
    return _with_engine(plan.timed_call(*plan.prepare(x, w, None)), engine)


def _report(fns, repeats):
    """Medians and first calls of ``fns``, timed together (any failure is raised)."""
    timings = time_interleaved(fns, repeats, warmup=0)
    for timing in timings.values():
        if timing.error is not None:
            raise timing.error
    return {k: t.median_s for k, t in timings.items()}, {k: t.first_s for k, t in timings.items()}


def seed(repeats: int) -> None:
    """SYCL direct vs PyTorch on the seed thesis' shape."""
    import torch

    torch.set_num_threads(2)
    problem = ConvProblem(8, 4, 1024, 1024, 4, 3, 3)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(problem.x_shape).astype(np.float32)
    w = rng.standard_normal(problem.w_shape).astype(np.float32)
    numpy_plan = plan_for("conv2d", problem, resolve_device("sycl"), "direct")
    fns = {
        "torch": torch_conv(problem, x, w, None),
        "sycl direct (usm in/out)": plan_call(problem, "sycl", "direct", x, w),
        "sycl direct (numpy in/out)": lambda: numpy_plan.run(x, w, None),
    }
    med, first = _report(fns, repeats)
    print(f"{problem.describe()}  ({problem.flops / 1e9:.2f} GFLOP), medians of {repeats}")
    for name in fns:
        print(f"  {name:28s} {med[name] * 1e3:9.1f} ms  x{med[name] / med['torch']:.3f} of torch"
              f"  {problem.flops / med[name] / 1e9:6.1f} GFLOP/s  first call {first[name]:.2f} s")


def resnet3x3(repeats: int, batch: int) -> None:
    """SYCL im2col / blis vs the CPU backend's on ResNet-50 v1.5's 3x3 layers."""
    rng = np.random.default_rng(0)
    print(f"ResNet-50 v1.5 3x3 layers, batch {batch}, float32, medians of {repeats} (ms; ratio = sycl / cpu)")
    header = ("layer", "cpu im2col", "sycl im2col mkl", "sycl im2col kern", "cpu blis", "sycl blis")
    print("  ".join(f"{h:>17s}" for h in header))
    totals = {}
    for name, C, H, W, K, R, S, stride, pad, count in RESNET50_V15_LAYERS:
        if (R, S) != (3, 3):
            continue
        problem = ConvProblem(batch, C, H, W, K, R, S, stride=(stride, stride), padding=(pad,) * 4)
        x = rng.standard_normal(problem.x_shape).astype(np.float32)
        w = rng.standard_normal(problem.w_shape).astype(np.float32)
        fns = {
            "cpu im2col": plan_call(problem, "cpu", "im2col", x, w),
            "sycl im2col mkl": plan_call(problem, "sycl", "im2col", x, w, "onemkl"),
            "sycl im2col kern": plan_call(problem, "sycl", "im2col", x, w, "kernel"),
            "cpu blis": plan_call(problem, "cpu", "blis", x, w),
            "sycl blis": plan_call(problem, "sycl", "blis", x, w),
        }
        med, first = _report(fns, repeats)
        for k, v in med.items():
            totals[k] = totals.get(k, 0.0) + v * count
        cells = [f"{med[k] * 1e3:17.1f}" for k in fns]
        print(f"{name:>17s}  " + "  ".join(cells))
        print(f"{'ratio / first s':>17s}  " + "  ".join(
            f"{'':>6s}x{med[k] / med['cpu im2col' if 'im2col' in k else 'cpu blis']:.2f} {first[k]:5.2f}s" for k in fns))
    print("weighted total (ms): " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in totals.items()))
    print(f"  sycl im2col mkl / cpu im2col = {totals['sycl im2col mkl'] / totals['cpu im2col']:.2f}, "
          f"sycl im2col kern / cpu im2col = {totals['sycl im2col kern'] / totals['cpu im2col']:.2f}, "
          f"sycl blis / cpu blis = {totals['sycl blis'] / totals['cpu blis']:.2f}")


def compile_costs() -> None:
    """First-call (kernel compile) and second-call times of each algorithm, in this fresh process."""
    t0 = time.perf_counter()
    from ..sycl import runtime

    runtime.load()
    load_s = time.perf_counter() - t0
    target = resolve_device("sycl")
    device = target.handle.sycl_device
    print(f"load the SYCL stack (import dpctl, dpnp, numba_dpex; relocation check): {load_s:.2f} s "
          f"on {device.filter_string} ({device.name})")
    rng = np.random.default_rng(0)
    problem = ConvProblem(2, 16, 20, 20, 32, 3, 3, padding=(1, 1, 1, 1))
    x = rng.standard_normal(problem.x_shape).astype(np.float32)
    w = rng.standard_normal(problem.w_shape).astype(np.float32)
    for algo, engine in [("direct", None), ("im2col", "onemkl"), ("im2col", "kernel"), ("blis", None)]:
        call = plan_call(problem, "sycl", algo, x, w, engine)
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        label = algo + (f" ({engine})" if engine else "")
        print(f"  {label:18s} first call {times[0]:.2f} s, second {times[1] * 1e3:.1f} ms")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m convlib.bench.sycl", description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("seed", "resnet3x3", "compile"))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args(argv)
    if args.what == "seed":
        seed(args.repeats)
    elif args.what == "compile":
        compile_costs()
    else:
        resnet3x3(args.repeats, args.batch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
