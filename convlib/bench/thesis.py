"""``python -m convlib.bench thesis``: the oneAPI thesis' two experiments, beside its published tables.

The thesis this project started from ("Implementación do algoritmo da convolución por lotes usando
Intel oneAPI", A Coruña, 2021) timed two sweeps, C = K = 4, 3x3 filters, stride 1, no padding,
float32:

* experiment ``A``: N = 8, 16, ..., 80 images of 1024 x 1024;
* experiment ``B``: N = 8 images of H = W = 64, 128, ..., 4096.

Its tables (``data/thesis_oneapi_batched_conv.csv``, :func:`load_thesis`) are **whole-process**
times: a built binary started, initialised its data, convolved once and exited, 4 runs, mean. This
module measures convlib both ways:

* ``kernel``: the rest of the bench's figure (:func:`convlib.bench.runner.run_problem`: data on the
  device, a first call, a warm-up, interleaved repeats, the median), checked against a reference;
* ``process``: as the thesis did (:func:`process_time`): a fresh ``python -c`` process imports
  convlib, builds the arrays, convolves once and exits, timed from this process around
  ``subprocess.run``; numba's cache is warmed by one untimed run first (a built binary has no JIT
  to pay for either, but the SYCL runtime's start and its kernel build are paid, as in the thesis),
  then :data:`PROCESS_RUNS` runs, mean.

The machines differ (the thesis: a 6-core AVX2 Xeon E-2176G and its UHD P630; ours is read from
``/proc/cpuinfo``); every plot names both. Compare the shapes of the curves and the ratios between
programs, not seconds alone.

Example (on a shared machine, under the benchmark lock)::

    NUMBA_NUM_THREADS=2 flock /tmp/convlib-bench.lock python -m convlib.bench thesis \\
        --experiment A --batches 8,40,80 --devices cpu,opencl:cpu:0 --out bench-results/thesis
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, fields
from importlib import resources
from pathlib import Path

from ..core.host_memory import available_memory_bytes
from ..core.problem import ConvProblem
from . import suites

#: The package file of the thesis' tables (a copy of ``shared/reference/``; ``data/README.md``).
THESIS_CSV = "thesis_oneapi_batched_conv.csv"
#: The thesis' machines, for titles and legends.
THESIS_MACHINES = {"cpu": "Intel Xeon E-2176G (6 cores/12 threads, AVX2)",
                   "gpu": "Intel UHD Graphics P630 (24 EUs)"}
#: The thesis programs drawn beside convlib: its best own program, its direct SYCL kernel, its
#: explicit-matrix GEMM (which ran out of memory past N=56 on the CPU) and oneDNN's two.
THESIS_PROGRAMS = ("blis_parallel", "direct_parallel", "gemm_parallel", "direct_onednn", "gemm_onednn")
#: convlib's counterpart of each thesis program in the speed-up table: the same algorithm for the
#: thesis' own kernels; for oneDNN (a library choosing its own kernel) convlib's ``auto``.
COUNTERPART = {"blis_parallel": "blis", "direct_parallel": "direct", "gemm_parallel": "im2col",
               "direct_onednn": "auto", "gemm_onednn": "auto"}
#: convlib's algorithms that serve the thesis' shapes.
ALGORITHMS = ("direct", "im2col", "blis", "winograd", "auto")
#: Timed whole-process runs per cell (the thesis' 4).
PROCESS_RUNS = 4
#: A cell is skipped when its arrays would take more than this share of the available memory.
MEMORY_HEADROOM = 0.7


@dataclass(frozen=True)
class ThesisRow:
    """One cell of the thesis' tables.

    Attributes
    ----------
    experiment : str
        ``"A"`` (batch sweep) or ``"B"`` (image-size sweep).
    device : str
        ``"cpu"`` or ``"gpu"`` (see :data:`THESIS_MACHINES`).
    program : str
        The thesis' program (``"blis_parallel"``, ``"direct_onednn"``, ...).
    N, C, K, H, W, R, S : int
        The shape.
    mean_time_s : float or None
        Whole-process seconds, mean of 4 runs; None where the run did not fit in memory.
    """

    experiment: str
    device: str
    program: str
    N: int
    C: int
    K: int
    H: int
    W: int
    R: int
    S: int
    mean_time_s: float | None


@dataclass(frozen=True)
class Measurement:
    """One figure of ours.

    Attributes
    ----------
    experiment : str
        ``"A"`` or ``"B"``.
    device : str
        convlib's device (``"cpu"``, ``"opencl:cpu:0"``, ...).
    algo : str
        convlib's algorithm (``"auto"`` included).
    N, H : int
        The swept sizes (W = H, C = K = 4, 3x3).
    measure : str
        ``"kernel"`` (median of warm calls) or ``"process"`` (mean whole-process time).
    time_s : float
        Seconds; NaN when not timed.
    status : str
        ``ok``, ``wrong``, ``error``, ``unsupported``, ``skipped``, ``unavailable``.
    note : str
        Why a cell was not timed, what ``auto`` ran, the single runs of a process figure.
    """

    experiment: str
    device: str
    algo: str
    N: int
    H: int
    measure: str
    time_s: float
    status: str
    note: str = ""


def load_thesis() -> list[ThesisRow]:
    """The thesis' 238 published cells (package data ``convlib/bench/data/thesis_oneapi_batched_conv.csv``).

    Returns
    -------
    list of ThesisRow
    """
    text = resources.files(__package__).joinpath("data", THESIS_CSV).read_text(encoding="utf-8")
    rows = []
    for rec in csv.DictReader(io.StringIO(text)):
        sizes = {k: int(rec[k]) for k in ("N", "C", "K", "H", "W", "R", "S")}
        value = rec["mean_time_s"].strip()
        rows.append(ThesisRow(rec["experiment"], rec["device"], rec["program"], **sizes,
                              mean_time_s=float(value) if value else None))
    return rows


def cases(experiment: str, *, batches=None, sizes=None) -> list[suites.Case]:
    """The shapes of ``experiment`` (``"A"`` or ``"B"``), the bench's seed suites, optionally a subset.

    Parameters
    ----------
    experiment : {"A", "B"}
    batches : sequence of int, optional
        Batch sizes of experiment A to keep (any positive N may be given).
    sizes : sequence of int, optional
        Image sizes H = W of experiment B to keep.

    Returns
    -------
    list of convlib.bench.suites.Case
    """
    if experiment == "A":
        if batches:
            return [suites.Case(f"N={n}", ConvProblem(n, 4, 1024, 1024, 4, 3, 3), sweep="N") for n in batches]
        return suites.seed_batch()
    if experiment == "B":
        if sizes:
            return [suites.Case(f"H=W={s}", ConvProblem(8, 4, s, s, 4, 3, 3), sweep="H") for s in sizes]
        return suites.seed_size()
    raise ValueError(f"experiment {experiment!r}: expected 'A' or 'B'")


def memory_note(problem: ConvProblem, device: str, *, copies: int = 1) -> str | None:
    """Why the cell should not run for lack of memory, or None.

    ``copies`` host copies of the input and output are counted (the kernel timing also holds a
    reference answer; a SYCL device on the CPU holds its own copies in the same memory).
    """
    need = (problem.x_bytes + problem.output_bytes) * copies * (1 if device == "cpu" else 2)
    available = available_memory_bytes()
    if available is None or need <= MEMORY_HEADROOM * available:
        return None
    return (f"skipped: needs ~{need / 1e9:.1f} GB of arrays, more than {MEMORY_HEADROOM:.0%} of the "
            f"{available / 1e9:.1f} GB available")


def process_script(problem: ConvProblem, device: str, algo: str) -> str:
    """The program one whole-process run executes: import, build the arrays, convolve once, exit."""
    return (
        "import numpy as np, convlib\n"
        "rng = np.random.default_rng(0)\n"
        f"x = rng.random({problem.x_shape!r}, dtype=np.float32)\n"
        f"w = rng.random({problem.w_shape!r}, dtype=np.float32)\n"
        f"y = convlib.conv2d(x, w, algo={algo!r}, device={device!r})\n"
        f"assert y.shape == {problem.y_shape!r}\n"
    )


def process_time(problem: ConvProblem, device: str, algo: str, *, runs: int = PROCESS_RUNS,
                 warm: bool = True, timeout_s: float = 600.0, tick=None) -> list[float]:
    """Whole-process seconds of ``runs`` fresh interpreters convolving ``problem`` once, as the thesis timed.

    Parameters
    ----------
    problem : ConvProblem
    device, algo : str
        As in :func:`convlib.conv2d`.
    runs : int
        Timed runs (the thesis: 4; report their mean).
    warm : bool
        Run once untimed first, so numba's on-disk cache holds the kernels.
    timeout_s : float
        Limit of one run.
    tick : callable, optional
        Called with 1 after each run (warm-up included), for a progress bar.

    Returns
    -------
    list of float
        The ``runs`` wall times, from ``subprocess.run``'s start to its return.

    Raises
    ------
    RuntimeError
        A run exited non-zero (its last lines of stderr say why).
    """
    command = [sys.executable, "-c", process_script(problem, device, algo)]
    times = []
    for i in range(runs + (1 if warm else 0)):
        t0 = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        elapsed = time.perf_counter() - t0
        if tick is not None:
            tick(1)
        if done.returncode != 0:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise RuntimeError(f"the process exited with {done.returncode}: {tail}")
        if i > 0 or not warm:
            times.append(elapsed)
    return times


def _thesis_device(device: str) -> str:
    """The thesis' device our ``device`` is compared with: its GPU for a GPU, else its CPU."""
    return "gpu" if ("gpu" in device or device.startswith("cuda")) else "cpu"


def _sweep(experiment: str) -> tuple[str, str]:
    return ("N", "batch size N (C=K=4, H=W=1024, 3x3)") if experiment == "A" else \
        ("H", "image size H=W (N=8, C=K=4, 3x3)")


def run(experiments=("A", "B"), *, devices=("cpu",), algos=ALGORITHMS, batches=None, sizes=None,
        repeats: int = 3, process: bool = True, runs: int = PROCESS_RUNS, check: bool = True,
        progress: bool = True) -> list[Measurement]:
    """Time every (experiment, size, device, algorithm) cell, kernel and (unless ``process=False``) whole process.

    Parameters
    ----------
    experiments : sequence of {"A", "B"}
    devices : sequence of str
        convlib devices; those :func:`convlib.devices` does not list come back ``unavailable``.
    algos : sequence of str
        Algorithms (``"auto"`` allowed); those that cannot serve a device are ``unsupported``.
    batches, sizes : sequence of int, optional
        Subsets of the sweeps (:func:`cases`).
    repeats : int
        Timed warm calls per kernel figure (median).
    process : bool
        Also time whole processes (:func:`process_time`).
    runs : int
        Timed processes per cell.
    check : bool
        Check each kernel's first answer against a reference.
    progress : bool
        Show a progress bar (tqdm) on stderr.

    Returns
    -------
    list of Measurement
    """
    import convlib
    from tqdm import tqdm

    from .candidates import default_algorithms
    from .runner import planned_calls, run_problem

    listed = convlib.devices()
    usable = {}
    for device in devices:
        if device in listed:
            offered = set(default_algorithms(device)) | {"auto"}
            usable[device] = [a for a in algos if a in offered]
    plan = [(e, case) for e in experiments for case in cases(e, batches=batches, sizes=sizes)]
    per_cell = sum(planned_calls(len(a), repeats, 1) + (len(a) * (runs + 1) if process else 0)
                   for a in usable.values())
    bar = tqdm(total=len(plan) * per_cell, unit="call", disable=not progress or None, dynamic_ncols=True,
               file=sys.stderr)
    out: list[Measurement] = []

    def record(e, p, device, algo, measure, time_s, status, note=""):
        out.append(Measurement(e, device, algo, p.N, p.H, measure, time_s, status, note))

    try:
        for e, case in plan:
            p = case.problem
            bar.set_postfix_str(f"{e} {case.label}")
            for device in devices:
                if device not in usable:
                    for algo in algos:
                        record(e, p, device, algo, "kernel", math.nan, "unavailable",
                               f"{device} is not among convlib.devices() here: {', '.join(listed)}")
                    continue
                device_algos = usable[device]
                for algo in algos:
                    if algo not in device_algos:
                        record(e, p, device, algo, "kernel", math.nan, "unsupported", f"not an algorithm of {device}")
                short = memory_note(p, device, copies=3 if check else 2)
                if short is not None:
                    for algo in device_algos:
                        record(e, p, device, algo, "kernel", math.nan, "skipped", short)
                    bar.update(planned_calls(len(device_algos), repeats, 1))
                else:
                    raw = run_problem(p, devices=[device], algos={device: device_algos}, baselines=(),
                                      repeats=repeats, warmup=1, check=check, tick=bar.update)
                    for r in raw:
                        note = r["note"] or (f"ran {r['picked']}" if r.get("picked") else "")
                        record(e, p, device, r["name"], "kernel", r.get("median_s", math.nan), r["status"], note)
                if not process:
                    continue
                short = memory_note(p, device)
                for algo in device_algos:
                    if short is not None:
                        record(e, p, device, algo, "process", math.nan, "skipped", short)
                        bar.update(runs + 1)
                        continue
                    try:
                        times = process_time(p, device, algo, runs=runs, tick=bar.update)
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:
                        record(e, p, device, algo, "process", math.nan, "error", str(exc)[:300])
                        continue
                    record(e, p, device, algo, "process", statistics.fmean(times), "ok",
                           "runs " + " ".join(f"{t:.3f}" for t in times))
            bar.write(table([m for m in out if (m.experiment, m.N, m.H) == (e, p.N, p.H)]))
    finally:
        bar.close()
    return out


def table(measurements: list[Measurement]) -> str:
    """A text table: one row per (experiment, size, device, algorithm), kernel and process seconds."""
    rows = {}
    for m in measurements:
        key = (m.experiment, m.N, m.H, m.device, m.algo)
        cell = f"{m.time_s:.4f}" if m.status == "ok" else m.status
        rows.setdefault(key, {})[m.measure] = cell
        if m.status not in ("ok",) and m.note:
            rows[key]["note"] = m.note[:70]
    lines = [f"{'exp':3s} {'N':>3s} {'H=W':>5s} {'device':14s} {'algo':9s} {'kernel s':>10s} {'process s':>10s}  note"]
    for (e, n, h, device, algo), cells in rows.items():
        lines.append(f"{e:3s} {n:3d} {h:5d} {device:14s} {algo:9s} {cells.get('kernel', '-'):>10s} "
                     f"{cells.get('process', '-'):>10s}  {cells.get('note', '')}")
    return "\n".join(lines)


def speedups(measurements: list[Measurement], thesis: list[ThesisRow]) -> list[dict]:
    """Thesis time / ours for every thesis program of :data:`COUNTERPART` beside its convlib counterpart.

    Returns
    -------
    list of dict
        ``experiment, size, device, program, thesis_s, algo, process_s, kernel_s,
        process_speedup, kernel_speedup`` (above 1: ours is faster; NaN where either is missing).
    """
    ours = {(m.experiment, m.N, m.H, m.device, m.algo, m.measure): m.time_s for m in measurements
            if m.status == "ok"}
    out = []
    for device in dict.fromkeys(m.device for m in measurements):
        for e, n, h in dict.fromkeys((m.experiment, m.N, m.H) for m in measurements if m.device == device):
            for row in thesis:
                if (row.experiment, row.device, row.N, row.H) != (e, _thesis_device(device), n, h) \
                        or row.program not in COUNTERPART:
                    continue
                algo = COUNTERPART[row.program]
                proc = ours.get((e, n, h, device, algo, "process"), math.nan)
                kern = ours.get((e, n, h, device, algo, "kernel"), math.nan)
                if math.isnan(proc) and math.isnan(kern):
                    continue  # the counterpart was not run (--algo)
                ref = row.mean_time_s if row.mean_time_s is not None else math.nan
                out.append({"experiment": e, "size": n if e == "A" else h, "device": device,
                            "program": row.program, "thesis_s": ref, "algo": algo, "process_s": proc,
                            "kernel_s": kern, "process_speedup": ref / proc, "kernel_speedup": ref / kern})
    return out


def speedup_markdown(rows: list[dict]) -> str:
    """:func:`speedups` as a markdown table (``x`` = thesis time / ours; ``-`` where one is missing)."""
    def num(v, fmt):
        return format(v, fmt) if isinstance(v, float) and math.isfinite(v) else "-"

    lines = ["| exp | size | our device | thesis program | thesis s | ours | process s | x | kernel s | x |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['experiment']} | {r['size']} | {r['device']} | {r['program']} | {num(r['thesis_s'], '.3f')} "
                     f"| {r['algo']} | {num(r['process_s'], '.3f')} | {num(r['process_speedup'], '.2f')} "
                     f"| {num(r['kernel_s'], '.4f')} | {num(r['kernel_speedup'], '.1f')} |")
    return "\n".join(lines)


#: Line styles of the thesis' programs (greys and black, so convlib's colours stand out).
THESIS_STYLE = {"blis_parallel": dict(color="black", marker="s"), "direct_parallel": dict(color="dimgrey", marker="^"),
                "gemm_parallel": dict(color="darkgrey", marker="v"), "direct_onednn": dict(color="saddlebrown", marker="D"),
                "gemm_onednn": dict(color="peru", marker="P")}


def plot(path: Path, experiment: str, device: str, measurements: list[Measurement], thesis: list[ThesisRow],
         machine: dict) -> Path:
    """Time vs N (A) or H = W (B) for convlib on ``device`` (process: solid, kernel: dashed) beside the thesis.

    Parameters
    ----------
    path : Path
        The PNG to write.
    experiment : {"A", "B"}
    device : str
        convlib's device drawn; the thesis' figures are those of its own CPU, or its GPU for a GPU;
        beside a SYCL device that is a CPU, those of the thesis' GPU too (dotted).
    measurements : list of Measurement
    thesis : list of ThesisRow
    machine : dict
        :func:`convlib.bench.machine.describe` (our CPU's model names our machine).

    Returns
    -------
    Path
    """
    from .plots import ALGORITHM_COLORS, _pyplot

    plt = _pyplot()
    sweep, xlabel = _sweep(experiment)
    theirs = _thesis_device(device)
    # A SYCL device that is a CPU is compared with the thesis' CPU (solid); its SYCL programs also
    # ran on its integrated GPU, drawn dotted beside them.
    sides = [(theirs, "-", "")]
    if device != "cpu" and theirs == "cpu":
        sides.append(("gpu", ":", " on its GPU"))
    fig, ax = plt.subplots(figsize=(9, 5.6))
    for side, linestyle, where in sides:
        for program in THESIS_PROGRAMS:
            pts = sorted((getattr(r, sweep), r.mean_time_s) for r in thesis if r.experiment == experiment
                         and r.device == side and r.program == program and r.mean_time_s is not None)
            if pts:
                ax.plot(*zip(*pts), linewidth=1.2, linestyle=linestyle, label=f"thesis {program}{where} (process)",
                        **THESIS_STYLE[program])
    mine = [m for m in measurements if m.experiment == experiment and m.device == device and m.status == "ok"]
    for algo in dict.fromkeys(m.algo for m in mine):
        for measure, linestyle, fill in (("process", "-", None), ("kernel", "--", "none")):
            pts = sorted((getattr(m, sweep), m.time_s) for m in mine if m.algo == algo and m.measure == measure)
            if pts:
                ax.plot(*zip(*pts), linestyle=linestyle, marker="o", markerfacecolor=fill,
                        color=ALGORITHM_COLORS.get(algo, "C7"), label=f"convlib {algo} ({measure})")
    ax.set_yscale("log")
    if sweep == "H":
        ax.set_xscale("log", base=2)
    values = sorted({getattr(m, sweep) for m in mine} | {getattr(r, sweep) for r in thesis if r.experiment == experiment})
    ax.set_xticks(values, [str(v) for v in values])
    ax.set_xticks([], minor=True)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("seconds (process: whole run, mean of 4; kernel: warm median)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    cpu = machine.get("cpu", {})
    ours = f"{cpu.get('model') or 'unknown CPU'}, {cpu.get('usable_cpus')} CPUs, {machine.get('date', '')[:10]}"
    kind = "numba CPU" if device == "cpu" else f"SYCL {device}"
    theirs_text = f"its {theirs.upper()}: {THESIS_MACHINES[theirs]}"
    if len(sides) > 1:
        theirs_text += f" (solid) and its GPU: {THESIS_MACHINES['gpu']} (dotted)"
    ax.set_title(f"Experiment {experiment}, float32 -- convlib {kind} on {ours}\n"
                 f"vs the thesis on {theirs_text}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def write_csv(path: Path, measurements: list[Measurement]) -> Path:
    """Our figures, one row per :class:`Measurement`."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[fld.name for fld in fields(Measurement)])
        writer.writeheader()
        writer.writerows(asdict(m) for m in measurements)
    return path


def read_csv(path: Path) -> list[Measurement]:
    """The figures :func:`write_csv` wrote (for ``--replot``)."""
    with open(path, newline="") as f:
        return [Measurement(r["experiment"], r["device"], r["algo"], int(r["N"]), int(r["H"]), r["measure"],
                            float(r["time_s"]), r["status"], r["note"]) for r in csv.DictReader(f)]


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m convlib.bench thesis", description=__doc__.split("\n\n")[0])
    p.add_argument("--experiment", choices=("A", "B", "both"), default="both",
                   help="A: N=8..80 at 1024^2; B: H=W=64..4096 at N=8 (default both)")
    p.add_argument("--batches", type=_ints, metavar="N,N,...", help="experiment A's batch sizes (default 8..80 step 8)")
    p.add_argument("--sizes", type=_ints, metavar="H,H,...", help="experiment B's image sizes (default 64..4096)")
    p.add_argument("--algo", default=",".join(ALGORITHMS), help=f"algorithms (default {','.join(ALGORITHMS)})")
    p.add_argument("--devices", default=None,
                   help="comma-separated convlib devices (default: cpu and every SYCL device convlib.devices() lists)")
    p.add_argument("--no-process", action="store_true", help="kernel times only (no whole-process runs)")
    p.add_argument("--runs", type=int, default=PROCESS_RUNS, help=f"timed processes per cell (default {PROCESS_RUNS})")
    p.add_argument("--repeats", type=int, default=3, help="timed warm calls per kernel figure (default 3)")
    p.add_argument("--no-check", action="store_true", help="skip the kernels' correctness check")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", type=Path, default=Path("bench-results/thesis"), help="folder of the CSV and the plots")
    p.add_argument("--replot", type=Path, nargs="+", metavar="CSV",
                   help="print the tables and draw the plots of earlier runs' CSV files (merged); time nothing")
    return p


def report(measurements: list[Measurement], out: Path, stem: str, machine: dict) -> list[Path]:
    """Print the tables and write the plots (one per experiment and device) of ``measurements``."""
    thesis = load_thesis()
    print()
    print(table(measurements))
    print()
    print(speedup_markdown(speedups(measurements, thesis)))
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for e in dict.fromkeys(m.experiment for m in measurements):
        for device in dict.fromkeys(m.device for m in measurements):
            if any(m.experiment == e and m.device == device and m.status == "ok" for m in measurements):
                paths.append(plot(out / f"{stem}-{e}-{device.replace(':', '_')}.png", e, device, measurements,
                                  thesis, machine))
    return paths


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.repeats < 1 or args.runs < 1:
        build_parser().error("--repeats and --runs must be >= 1")
    import convlib

    from . import machine

    if args.replot:
        measurements = [m for path in args.replot for m in read_csv(path)]
        for path in report(measurements, args.out, args.replot[0].stem, machine.describe()):
            print(f"wrote {path}")
        return 0

    algos = [a.strip() for a in args.algo.split(",") if a.strip()]
    unknown = [a for a in algos if a not in ALGORITHMS]
    if unknown:
        build_parser().error(f"--algo {','.join(unknown)}: the thesis' shapes are served by {', '.join(ALGORITHMS)}")
    if args.devices:
        devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    else:
        # The numba CPU and every SYCL device; no SYCL stack: the CPU alone, said once.
        devices = [d for d in convlib.devices() if d == "cpu" or not d.startswith("cuda")]
        if devices == ["cpu"]:
            print("no SYCL device here (convlib.devices() lists only the CPU): timing the CPU alone", file=sys.stderr)
    experiments = ("A", "B") if args.experiment == "both" else (args.experiment,)
    desc = machine.describe()
    print(f"ours: {desc['cpu']['model']}, {desc['cpu']['usable_cpus']} CPUs, {desc['memory_gib']:.0f} GiB; "
          f"numba {desc['numba']['num_threads']} threads; devices {', '.join(devices)}")
    print(f"thesis: {THESIS_MACHINES['cpu']} and {THESIS_MACHINES['gpu']}")
    measurements = run(experiments, devices=devices, algos=algos, batches=args.batches, sizes=args.sizes,
                       repeats=args.repeats, process=not args.no_process, runs=args.runs,
                       check=not args.no_check, progress=not args.no_progress)
    stem = f"thesis-{time.strftime('%Y%m%d-%H%M%S')}"
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"wrote {write_csv(args.out / f'{stem}.csv', measurements)}")
    for path in report(measurements, args.out, stem, desc):
        print(f"wrote {path}")
    return 0
