"""SYCL speed checks against PyTorch and the CPU backend (a benchmark, not a test).

Run under the project's timing lock, with the thread count fixed::

    NUMBA_NUM_THREADS=2 flock /tmp/convlib-bench.lock python -m convlib.sycl.benchmark seed
    NUMBA_NUM_THREADS=2 flock /tmp/convlib-bench.lock python -m convlib.sycl.benchmark resnet3x3

``seed``: N=8, C=K=4, H=W=1024, 3x3, float32: SYCL ``direct`` against
``torch.nn.functional.conv2d``. ``resnet3x3``: the 3x3 layers of ResNet-50 v1.5 at batch 8: SYCL
``im2col`` (both GEMMs) and ``blis`` against the same algorithm on the CPU backend. ``compile``:
first-call (kernel compile) times of each algorithm in a fresh process. Every figure
is the median of interleaved repeats after a warm-up call, so ratios within one run are
comparable on a noisy machine. SYCL times are given twice: with the data already on the device
(``usm_ndarray`` in and out, as a dpnp user would call it) and with numpy in and out (copies
included). First-call times (kernel compiles) are printed before the loop.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _median_times(fns: dict, repeats: int) -> dict:
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in times.items()}


def _first_calls(fns: dict) -> dict:
    out = {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        fn()
        out[name] = time.perf_counter() - t0
    return out


def _sycl_callables(problem, x, w, queue, algo, **kwargs):
    """(device-resident call, numpy call) for one SYCL algorithm."""
    import convlib
    from convlib import registry

    dpt = __import__("convlib.sycl.runtime", fromlist=["load"]).load().dpt
    xd, wd = dpt.asarray(x, sycl_queue=queue), dpt.asarray(w, sycl_queue=queue)
    impl = registry.implementation("sycl", algo)
    conv_args = dict(stride=problem.stride, padding=problem.padding, dilation=problem.dilation, groups=problem.groups)

    def resident():
        impl.conv2d(problem, xd, wd, None, queue, **kwargs)
        queue.wait()

    def numpy_in_out():
        if kwargs:
            from convlib.sycl import im2col

            with im2col.use_gemm(kwargs["gemm"]):
                convlib.conv2d(x, w, algo=algo, device=queue, **conv_args)
        else:
            convlib.conv2d(x, w, algo=algo, device=queue, **conv_args)

    return resident, numpy_in_out


def seed(repeats: int) -> None:
    """SYCL direct vs PyTorch on the seed thesis' shape."""
    import torch

    import convlib
    from convlib.problem import ConvProblem

    torch.set_num_threads(2)
    problem = ConvProblem(8, 4, 1024, 1024, 4, 3, 3)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(problem.x_shape).astype(np.float32)
    w = rng.standard_normal(problem.w_shape).astype(np.float32)
    queue = convlib.backends.get_backend("sycl").resolve("sycl", [])
    resident, numpy_in_out = _sycl_callables(problem, x, w, queue, "direct")
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    fns = {
        "torch": lambda: torch.nn.functional.conv2d(xt, wt),
        "sycl direct (usm in/out)": resident,
        "sycl direct (numpy in/out)": numpy_in_out,
    }
    first = _first_calls(fns)
    med = _median_times(fns, repeats)
    print(f"{problem.describe()}  ({problem.flops / 1e9:.2f} GFLOP), medians of {repeats}")
    for name in fns:
        print(f"  {name:28s} {med[name] * 1e3:9.1f} ms  x{med[name] / med['torch']:.3f} of torch"
              f"  {problem.flops / med[name] / 1e9:6.1f} GFLOP/s  first call {first[name]:.2f} s")


def resnet3x3(repeats: int, batch: int) -> None:
    """SYCL im2col / blis vs the CPU backend's on ResNet-50 v1.5's 3x3 layers."""
    import convlib
    from convlib import registry
    from convlib.bench.suites import RESNET50_V15_LAYERS
    from convlib.problem import ConvProblem

    queue = convlib.backends.get_backend("sycl").resolve("sycl", [])
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
        cpu_im2col = registry.implementation("cpu", "im2col")
        cpu_blis = registry.implementation("cpu", "blis")
        fns = {
            "cpu im2col": lambda: cpu_im2col.conv2d(problem, x, w, None, None),
            "sycl im2col mkl": _sycl_callables(problem, x, w, queue, "im2col", gemm="onemkl")[0],
            "sycl im2col kern": _sycl_callables(problem, x, w, queue, "im2col", gemm="kernel")[0],
            "cpu blis": lambda: cpu_blis.conv2d(problem, x, w, None, None),
            "sycl blis": _sycl_callables(problem, x, w, queue, "blis")[0],
        }
        first = _first_calls(fns)
        med = _median_times(fns, repeats)
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
    from convlib.sycl import runtime

    mods = runtime.load()
    load_s = time.perf_counter() - t0
    import convlib
    from convlib.sycl import im2col

    queue = convlib.backends.get_backend("sycl").resolve("sycl", [])
    print(f"load the SYCL stack (import dpctl, dpnp, numba_dpex; relocation check): {load_s:.2f} s "
          f"on {queue.sycl_device.filter_string} ({queue.sycl_device.name})")
    rng = np.random.default_rng(0)
    x = mods.dpt.asarray(rng.standard_normal((2, 16, 20, 20)).astype(np.float32), sycl_queue=queue)
    w = mods.dpt.asarray(rng.standard_normal((32, 16, 3, 3)).astype(np.float32), sycl_queue=queue)
    runs = [("direct", {}), ("im2col", {"gemm": "onemkl"}), ("im2col", {"gemm": "kernel"}), ("blis", {})]
    for algo, extra in runs:
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            if extra:
                with im2col.use_gemm(extra["gemm"]):
                    convlib.conv2d(x, w, padding=1, algo=algo)
            else:
                convlib.conv2d(x, w, padding=1, algo=algo)
            queue.wait()
            times.append(time.perf_counter() - t0)
        label = algo + (f" ({extra['gemm']})" if extra else "")
        print(f"  {label:18s} first call {times[0]:.2f} s, second {times[1] * 1e3:.1f} ms")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m convlib.sycl.benchmark", description=__doc__.split("\n")[0])
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
