"""``python -m convlib.bench dask``: convlib on Dask arrays against one in-process call.

The seed batch sweep's largest case (N=80, C=K=4, 1024x1024, 3x3, float32) runs

* in process: one :func:`convlib.conv2d` call on a numpy array, with ``--threads`` numba threads;
* on Dask: the same convolution of a batch-chunked Dask array already held by the workers of a
  ``distributed.LocalCluster`` (``--workers`` processes, one dask thread and
  ``--threads // --workers`` numba threads each), the result kept on the workers (``persist``,
  then wait): scheduling, the tasks and the workers' memory, not the transfer to the client.

Both are timed in :func:`convlib.core.timing.time_interleaved`'s order (first call, warm-up,
interleaved repeats, medians), each Dask call after the previous result was forgotten by the
cluster (untimed): an identical graph has the same keys, and a result still held would be reused. The report: each median, the Dask path's overhead over the in-process time,
the compulsory traffic per second (``ConvProblem.bytes_moved``) and the chunk plan.

Example (on a shared machine, under the benchmark lock)::

    flock /tmp/convlib-bench.lock python -m convlib.bench dask --repeats 5
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np

from ..core.timing import Timing

#: The seed batch sweep's N=80 case.
SEED_SHAPE = (80, 4, 1024, 1024, 4, 3, 3)


def _task_count(dask_scheduler) -> int:
    return len(dask_scheduler.tasks)


def _interleaved(calls, repeats: int, warmup: int) -> dict:
    """:func:`convlib.core.timing.time_interleaved`'s order (first call, warm-up, round-robin repeats
    starting one candidate later each round, medians) with an untimed step before each call."""
    timings = {name: Timing() for name in calls}
    for name, (call, before) in calls.items():
        for i in range(1 + warmup):
            before()
            t0 = time.perf_counter()
            call()
            elapsed = time.perf_counter() - t0
            if i == 0:
                timings[name].first_s = elapsed
            else:
                timings[name].warmup_s.append(elapsed)
    names = list(calls)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            call, before = calls[name]
            before()
            gc.collect()
            time.sleep(0.2)
            t0 = time.perf_counter()
            call()
            timings[name].times_s.append(time.perf_counter() - t0)
    return timings


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m convlib.bench dask", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default=",".join(map(str, SEED_SHAPE)),
                   help="N,C,H,W,K,R,S (default: the seed batch sweep's N=80 case)")
    p.add_argument("--batch-chunk", type=int, default=10, help="images per Dask block (default 10)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=2, help="numba threads in process; split among the workers")
    p.add_argument("--algo", default="auto")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="folder of the JSON record")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import dask.array as da
    import distributed
    import numba

    import convlib
    from ..core.problem import ConvProblem
    from ..dask import forward_plan

    n, c, h, w_, k, r, s = (int(v) for v in args.shape.split(","))
    problem = ConvProblem(n, c, h, w_, k, r, s, dtype=args.dtype)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(problem.x_shape, dtype=np.float32).astype(args.dtype, copy=False)
    w = rng.standard_normal(problem.w_shape).astype(args.dtype)
    chunks = (args.batch_chunk, -1, -1, -1)
    per_worker = max(1, args.threads // args.workers)
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))

    with distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                  dashboard_address=":0", silence_logs=40,
                                  env={"NUMBA_NUM_THREADS": str(per_worker)}) as cluster, \
            distributed.Client(cluster) as client:
        # The input is made on the workers (as it would be read there), block by block.
        def block(b, block_info=None):
            start = block_info[None]["array-location"][0][0]
            return np.random.default_rng(start).standard_normal(b.shape, dtype=np.float32).astype(b.dtype)

        x_dask = da.empty(problem.x_shape, dtype=args.dtype, chunks=chunks).map_blocks(block, dtype=args.dtype)
        x_dask = client.persist(x_dask)
        distributed.wait(x_dask)
        plan = forward_plan(x_dask, w)
        baseline = client.run_on_scheduler(_task_count)

        def release():
            # Results of an identical graph would be found in the workers' memory (the keys are
            # deterministic): forget them first, untimed.
            held.clear()
            while client.run_on_scheduler(_task_count) > baseline:
                time.sleep(0.01)

        held = {}

        def on_dask():
            y = client.persist(convlib.conv2d(x_dask, w, algo=args.algo))
            distributed.wait(y)
            held["y"] = y

        def in_process():
            return convlib.conv2d(x, w, algo=args.algo)

        started = time.perf_counter()
        timings = _interleaved({"in-process": (in_process, lambda: None), "dask": (on_dask, release)},
                               repeats=args.repeats, warmup=args.warmup)
        check = convlib.conv2d(x_dask[:1], w, algo=args.algo).compute()
        expected = convlib.conv2d(np.asarray(x_dask[:1].compute()), w, algo=args.algo)
        np.testing.assert_allclose(check, expected, rtol=1e-5, atol=1e-5)
        elapsed = time.perf_counter() - started

    gb = problem.bytes_moved / 1e9
    base, mine = timings["in-process"].median_s, timings["dask"].median_s
    overhead = mine / base - 1
    print(f"{problem.describe()}; {args.workers} workers x 1 dask thread x {per_worker} numba thread(s) "
          f"against one call with {args.threads} numba threads")
    print(plan.describe())
    for name, t in timings.items():
        print(f"  {name:10s} median {t.median_s * 1e3:8.1f} ms  ({gb / t.median_s:5.2f} GB/s of compulsory traffic)"
              f"  times {', '.join(f'{v * 1e3:.0f}' for v in t.times_s)} ms")
    print(f"  Dask overhead: {overhead * 100:+.1f}% of the in-process time (target <= +20%); {elapsed:.0f} s in all")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"dask-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({
        "command": " ".join(["python -m convlib.bench dask", *(argv or [])]),
        "problem": problem.describe(), "plan": plan.describe(), "workers": args.workers,
        "numba_threads_per_worker": per_worker, "threads_in_process": args.threads,
        "median_s": {name: t.median_s for name, t in timings.items()},
        "times_s": {name: t.times_s for name, t in timings.items()},
        "gb_per_s": {name: gb / t.median_s for name, t in timings.items()}, "overhead": overhead,
    }, indent=1))
    print(f"  wrote {path}")
    return 0
