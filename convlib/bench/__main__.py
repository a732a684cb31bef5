"""``python -m convlib.bench SUITE [options]``: time convlib's algorithms beside PyTorch.

Examples
--------
Wrap timing runs in ``flock /tmp/convlib-bench.lock`` on a shared machine, and fix the threads::

    NUMBA_NUM_THREADS=2 flock /tmp/convlib-bench.lock python -m convlib.bench seed-batch --ceilings --plot
    NUMBA_NUM_THREADS=2 flock /tmp/convlib-bench.lock python -m convlib.bench resnet50 --batch 8 --plot
    python -m convlib.bench custom --shape 8,64,56,56,64,3,3 --padding 1 --algo direct,blis --repeats 3
    python -m convlib.bench --replot bench-results/resnet50-20261121-101500.json --plot
    python -m convlib.bench dask --repeats 5   # Dask arrays on a LocalCluster (convlib/bench/dask_bench.py)
    python -m convlib.bench thesis --experiment A --batches 8,40,80   # beside the thesis' tables (convlib/bench/thesis.py)

A long suite can be run in parts (``--limit 0:5``, ``--limit 5:10``, with ``--ceilings-from`` the
first part's file) and drawn as one: ``--replot part1.json part2.json --plot``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys
from pathlib import Path

from ..core.problem import make_backward_bias_problem
from . import suites
from .candidates import BASELINES

DEFAULT_OUT = "bench-results"


def _ints(text: str, name: str, lengths) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name} {text!r}: expected comma-separated integers") from None
    if len(values) not in lengths:
        raise argparse.ArgumentTypeError(f"{name} {text!r}: expected {' or '.join(map(str, lengths))} integers")
    return values


def _shape(text):
    return _ints(text, "--shape", (7,))


def _pair(name):
    def parse(text):
        v = _ints(text, name, (1, 2))
        return v[0] if len(v) == 1 else v
    return parse


def _padding(text):
    if text in ("same", "valid"):
        return text
    v = _ints(text, "--padding", (1, 2, 4))
    return v[0] if len(v) == 1 else v


def _names(values) -> list[str]:
    """``--x a,b --x c`` -> ``[a, b, c]`` (order kept, duplicates dropped)."""
    out = []
    for value in values or ():
        for name in value.split(","):
            name = name.strip()
            if name and name not in out:
                out.append(name)
    return out


def _limit(text):
    """``--limit 3`` keeps the first three cases; ``--limit 2:5`` keeps cases 2, 3 and 4 (from 0)."""
    try:
        if ":" in text:
            start, stop = text.split(":")
            return slice(int(start) if start else None, int(stop) if stop else None)
        return slice(None, int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--limit {text!r}: expected an int or start:stop") from None


#: ``--op`` values: the forward convolution and its backward passes (short names).
OPERATION_NAMES = ("conv2d", "backward_data", "backward_weight", "backward_bias")


def operation_case(case, op: str):
    """``case`` with its problem turned into the backward pass ``op`` of the same layer."""
    problem = case.problem
    if op == "backward_bias":
        problem = make_backward_bias_problem(problem.y_shape, problem.dtype)
    else:
        problem = dataclasses.replace(problem, operation=f"conv2d_{op}", has_bias=False)
    return dataclasses.replace(case, problem=problem)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m convlib.bench",
        description="Benchmark convlib's convolution algorithms beside PyTorch (and scipy).",
        epilog="On a shared machine wrap the command in `flock /tmp/convlib-bench.lock` and set NUMBA_NUM_THREADS.",
    )
    p.add_argument("suite", nargs="?", choices=suites.SUITES,
                   help="seed-batch: N=8..80, C=K=4, 1024^2, 3x3; seed-size: N=8, C=K=4, H=W=64..4096, 3x3; "
                        "resnet50: the distinct conv layers of ResNet-50 v1.5; mobilenet: the distinct depthwise "
                        "(dw) and pointwise (pw) layers of MobileNetV2; filters: single-channel 3x3-7x7 filters "
                        "on 2048^2-8192^2 images; custom: --shape")
    g = p.add_argument_group("what to time")
    g.add_argument("--device", action="append", metavar="DEV",
                   help="device(s) for convlib: cpu (default), a SYCL filter string, cuda:0, or 'all' "
                        "(every device convlib.devices() lists); repeat or comma-separate")
    g.add_argument("--algo", action="append", metavar="ALGO",
                   help="algorithm(s), e.g. direct,blis,auto (default: every algorithm of the device, "
                        "aliases once, plus auto)")
    g.add_argument("--baseline", default=None, metavar="LIST",
                   help="comma-separated baselines: torch, opencv (cv2.filter2D, for one-channel and per-channel "
                        "filters), scipy, or none (default: opencv,torch for the filters suite, torch otherwise)")
    g.add_argument("--op", default="conv2d", choices=OPERATION_NAMES,
                   help="the operation timed on each shape: the forward convolution (default) or one of its "
                        "backward passes (against torch.nn.grad's)")
    g.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    g.add_argument("--batch", type=int, default=8, help="the batch size of resnet50 and mobilenet (default 8)")
    g.add_argument("--quick", action="store_true",
                   help="a few cases per suite and 3 repeats unless --repeats says otherwise (smoke runs)")
    g.add_argument("--limit", type=_limit, metavar="N|A:B", help="keep the first N cases, or cases A..B-1")
    g.add_argument("--match", metavar="TEXT", help="keep the cases whose label contains TEXT (e.g. 'dw ')")
    g = p.add_argument_group("custom shapes")
    g.add_argument("--shape", type=_shape, action="append", metavar="N,C,H,W,K,R,S", help="repeatable")
    g.add_argument("--stride", type=_pair("--stride"), default=1, metavar="S|SH,SW")
    g.add_argument("--padding", type=_padding, default=0, metavar="P|PH,PW|T,B,L,R|same|valid")
    g.add_argument("--dilation", type=_pair("--dilation"), default=1, metavar="D|DH,DW")
    g.add_argument("--groups", type=int, default=1)
    g.add_argument("--bias", action="store_true", help="add a bias")
    g = p.add_argument_group("method")
    g.add_argument("--repeats", type=int, help="timed, interleaved calls per candidate (default 5; 3 with --quick)")
    g.add_argument("--warmup", type=int, default=1, help="untimed calls after the first one (default 1)")
    g.add_argument("--threads", type=int,
                   help="numba threads (<= NUMBA_NUM_THREADS); PyTorch gets the same number (default: numba's)")
    g.add_argument("--max-seconds", type=float, default=60.0,
                   help="time budget per candidate and shape: fewer repeats for slow candidates (default 60)")
    g.add_argument("--scipy-max-seconds", type=float, default=10.0,
                   help="skip scipy on a shape when one call is estimated to take longer (default 10)")
    g.add_argument("--gap-ms", type=float, default=10.0,
                   help="sleep before each call so the previous candidate's threads go idle (default 10)")
    g.add_argument("--no-check", action="store_true", help="skip the correctness check against a reference")
    g.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    g.add_argument("--ceilings", action="store_true",
                   help="measure the FMA peak, memory bandwidth and numpy SGEMM rate first (~10 s)")
    g.add_argument("--ceilings-from", type=Path, metavar="JSON", help="reuse the ceilings of an earlier results file")
    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help=f"results folder (default {DEFAULT_OUT}/)")
    g.add_argument("--tag", default="", help="added to the file names")
    g.add_argument("--plot", action="store_true", help="write PNG figures")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--replot", type=Path, nargs="+", metavar="JSON",
                   help="print the tables and draw the figures of earlier results files (several: parts of "
                        "one suite, merged); time nothing")
    return p


def _set_threads(requested: int | None) -> int:
    import numba

    if requested is not None:
        if not 1 <= requested <= numba.config.NUMBA_NUM_THREADS:
            raise SystemExit(f"--threads {requested}: numba allows 1..{numba.config.NUMBA_NUM_THREADS} here "
                             f"(set NUMBA_NUM_THREADS before starting Python for more)")
        numba.set_num_threads(requested)
    threads = numba.get_num_threads()
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:
        pass
    try:
        import cv2

        cv2.setNumThreads(threads)
    except ImportError:
        pass
    return threads


def _replot(args) -> int:
    from . import plots, report

    parts = [report.read_json(path) for path in args.replot]
    data = parts[0]
    suites_seen = {part["suite"] for part in parts}
    if len(suites_seen) > 1:
        build_parser().error(f"--replot: the files hold different suites ({', '.join(sorted(suites_seen))})")
    records = [r for part in parts for r in part["records"]]
    ceilings = next((part["ceilings"] for part in parts if part.get("ceilings")), None)
    show_device = len({r["device"] for r in records if r["kind"] == "convlib"}) > 1
    print(report.machine_lines(data["machine"], ceilings))
    for case in dict.fromkeys(r["case"] for r in records):
        print()
        print(report.case_table([r for r in records if r["case"] == case], show_device=show_device))
    print()
    print(report.summary_table(report.summarize(records), show_device=show_device))
    for warning in report.warnings_for(records, ceilings):
        print(f"WARNING: {warning}", file=sys.stderr)
    if args.plot:
        stem = args.replot[0].with_suffix("")
        if len(parts) > 1:
            stem = stem.with_name(stem.name + "-merged")
        for path in plots.plot_run(stem, data["suite"], records, data["machine"], ceilings):
            print(f"wrote {path}")
    return 0


def main(argv=None) -> int:
    given = sys.argv[1:] if argv is None else list(argv)
    if given[:1] == ["dask"]:
        # Its own options (a cluster, not candidates): convlib/bench/dask_bench.py.
        from .dask_bench import main as dask_main
        return dask_main(given[1:])
    if given[:1] == ["thesis"]:
        # Its own options (two sweeps, whole processes): convlib/bench/thesis.py.
        from .thesis import main as thesis_main
        return thesis_main(given[1:])
    args = build_parser().parse_args(argv)
    if args.replot:
        return _replot(args)
    if args.suite is None:
        build_parser().error("a suite is needed (or --replot FILE)")
    repeats = args.repeats if args.repeats is not None else (3 if args.quick else 5)
    if repeats < 1 or args.warmup < 0:
        build_parser().error("--repeats must be >= 1 and --warmup >= 0")
    if args.baseline is None:
        args.baseline = "opencv,torch" if args.suite == "filters" else "torch"
    baselines = [] if args.baseline.strip() == "none" else _names([args.baseline])
    for b in baselines:
        if b not in BASELINES:
            build_parser().error(f"--baseline {b!r}: known baselines are {', '.join(BASELINES)}, none")
    try:
        cases = suites.build(args.suite, dtype=args.dtype, quick=args.quick, batch=args.batch, shapes=args.shape or (),
                             stride=args.stride, padding=args.padding, dilation=args.dilation, groups=args.groups,
                             bias=args.bias)
    except (TypeError, ValueError) as exc:
        build_parser().error(str(exc))
    if args.op != "conv2d":
        cases = [operation_case(c, args.op) for c in cases]
    if args.match is not None:
        cases = [c for c in cases if args.match in c.label]
    if args.limit is not None:
        cases = cases[args.limit]
    if not cases:
        build_parser().error("--match and --limit leave no case to run")

    # Heavy imports only once the arguments are known to be good.
    import convlib
    from tqdm import tqdm

    from ..dispatch import registry
    from . import machine, plots, report, runner

    threads = _set_threads(args.threads)
    devices = _names(args.device) or ["cpu"]
    if devices == ["all"]:
        devices = convlib.devices()
    algos = None
    if args.algo:
        wanted = _names(args.algo)
        known = set(registry.ALGORITHM_NAMES) | {"auto"}
        unknown = [a for a in wanted if a not in known]
        if unknown:
            build_parser().error(f"--algo {','.join(unknown)}: known algorithms are {', '.join(sorted(known))}")
        algos = {d: wanted for d in devices}
    per_device = {}
    for d in devices:
        try:
            per_device[d] = algos[d] if algos else runner.default_algorithms(d, cases[0].problem.operation)
        except (ValueError, ImportError) as exc:
            build_parser().error(f"--device {d}: {exc}")

    desc = machine.describe()
    ceilings = None
    if args.ceilings_from:
        ceilings = report.read_json(args.ceilings_from).get("ceilings")
    if args.ceilings:
        ceilings = machine.measure_ceilings(threads, progress=lambda m: print(m, file=sys.stderr))
    print(report.machine_lines(desc, ceilings))

    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    op_tag = "" if args.op == "conv2d" else f"-{args.op}"
    stem = args.out / f"{args.suite}{op_tag}{'-' + args.tag if args.tag else ''}-{stamp}"
    config = {
        "suite": args.suite, "operation": cases[0].problem.operation, "cases": [c.label for c in cases], "devices": devices, "algorithms": per_device,
        "baselines": baselines, "dtype": args.dtype, "batch": args.batch if args.suite in ("resnet50", "mobilenet") else None,
        "repeats": repeats, "warmup": args.warmup, "threads": threads, "max_seconds": args.max_seconds,
        "scipy_max_seconds": args.scipy_max_seconds, "gap_ms": args.gap_ms, "check": not args.no_check,
        "seed": args.seed, "quick": args.quick,
    }
    n_candidates = sum(len(a) for a in per_device.values()) + len(baselines)
    show_device = len(devices) > 1
    records: list[dict] = []
    interrupted = False
    bar = tqdm(total=len(cases) * runner.planned_calls(n_candidates, repeats, args.warmup), unit="call",
               disable=True if args.no_progress else None, dynamic_ncols=True, file=sys.stderr)
    try:
        for case in cases:
            bar.set_postfix_str(case.label)
            raw = runner.run_problem(case.problem, devices=devices, algos=per_device, baselines=baselines,
                                     repeats=repeats, warmup=args.warmup, max_seconds=args.max_seconds,
                                     scipy_max_seconds=args.scipy_max_seconds, gap_s=args.gap_ms / 1e3,
                                     check=not args.no_check, seed=args.seed, tick=bar.update)
            mine = report.case_records(args.suite, case, raw, ceilings)
            records += mine
            bar.write("\n" + report.case_table(mine, show_device=show_device))
    except KeyboardInterrupt:
        interrupted = True
        bar.write("interrupted: writing the cases finished so far")
    finally:
        bar.close()

    summary = report.summarize(records) if records else []
    if summary:
        print()
        print(report.summary_table(summary, show_device=show_device))
    payload = {"suite": args.suite, "command": " ".join(["python -m convlib.bench", *(argv or sys.argv[1:])]),
               "interrupted": interrupted, "config": config, "machine": desc, "ceilings": ceilings,
               "records": records, "summary": summary}
    report.write_json(Path(f"{stem}.json"), payload)
    report.write_csv(Path(f"{stem}.csv"), records)
    print(f"\nwrote {stem}.json and {stem}.csv")
    if args.plot and records:
        for path in plots.plot_run(stem, args.suite, records, desc, ceilings):
            print(f"wrote {path}")
    for warning in report.warnings_for(records, ceilings):
        print(f"WARNING: {warning}", file=sys.stderr)
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
