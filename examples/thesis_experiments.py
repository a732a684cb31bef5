"""The oneAPI thesis' two experiments, small enough for a minute, beside its published figures.

The thesis (A Coruña, 2021) timed batched 3x3 convolutions of 4-channel images into 4 channels:
experiment A sweeps the batch (N = 8..80 at 1024^2), B the image size (H = W = 64..4096 at N = 8),
each program's time being a whole process's (start, data, convolution, exit; mean of 4 runs).
This example runs both sweeps at a few sizes through :mod:`convlib.bench.thesis` (the functions
behind ``python -m convlib.bench thesis``): convlib's kernel time (warm median, checked against a
reference) and its whole-process time measured as the thesis did, then prints the table, the
speed-ups over the thesis' programs and writes one plot per experiment and device.

    python examples/thesis_experiments.py            # A: N=8,16; B: 128, 512, 1024; cpu (about a minute)
    python examples/thesis_experiments.py --sycl     # the SYCL device too, when there is one
    python examples/thesis_experiments.py --smoke    # B at 64^2 only, seconds (CI)
    python examples/thesis_experiments.py --full     # the thesis' whole sweeps, every algorithm (an hour or more)

The machines differ (the thesis: a 6-core AVX2 Xeon E-2176G and its UHD P630): compare the shapes
of the curves and ratios, and see docs/benchmarks.md for a run on this project's machine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import convlib
from convlib.bench import machine, thesis


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = p.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="experiment B at 64^2, one algorithm: seconds")
    size.add_argument("--full", action="store_true", help="both sweeps whole, every algorithm, 4 runs per cell")
    p.add_argument("--sycl", action="store_true", help="also time the SYCL device (always with --full)")
    p.add_argument("--out", type=Path, default=None, help="folder of the CSV and plots (default: a temporary folder)")
    args = p.parse_args(argv)

    devices = ["cpu"]
    if args.sycl or args.full:
        sycl = [d for d in convlib.devices() if d != "cpu" and not d.startswith("cuda")]
        if sycl:
            devices.append(sycl[0])
        else:
            print("no SYCL device here: the CPU alone")
    if args.smoke:
        plan = dict(experiments=("B",), sizes=[64], algos=("direct",), runs=1, repeats=1)
    elif args.full:
        plan = dict(experiments=("A", "B"), algos=thesis.ALGORITHMS, runs=thesis.PROCESS_RUNS, repeats=3)
    else:
        plan = dict(experiments=("A", "B"), batches=[8, 16], sizes=[128, 512, 1024], algos=("direct", "auto"),
                    runs=2, repeats=3)
    out = args.out or Path(tempfile.mkdtemp(prefix="convlib-thesis-"))
    measurements = thesis.run(devices=devices, progress=not args.smoke, **plan)
    thesis.write_csv(out / "thesis-example.csv", measurements)
    paths = thesis.report(measurements, out, "thesis-example", machine.describe())
    print(f"\nwrote {out / 'thesis-example.csv'} and {len(paths)} plot(s): {', '.join(p.name for p in paths)}")
    failed = [m for m in measurements if m.status in ("wrong", "error")]
    for m in failed:
        print(f"FAILED: {m.experiment} N={m.N} H={m.H} {m.device} {m.algo} {m.measure}: {m.status} {m.note}",
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
