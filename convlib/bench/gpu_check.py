"""Everything the CUDA backend needs from a GPU machine, in one command.

    pip install --no-deps --no-build-isolation -e . && python -m convlib.bench.gpu_check --out "$OUT"

Steps (each can be skipped):

1. the environment: GPU, driver, numba / numba-cuda / CuPy / PyTorch / cuDNN versions;
2. the two ceilings, measured: device-to-device copy bandwidth (bytes read + written) and an FP32
   matrix product through PyTorch with TF32 off (the FMA ceiling cuDNN also lives under);
3. the test suite on the GPU: ``tests/test_cuda.py``, ``tests/test_dask_cuda.py`` (Dask arrays
   of CuPy chunks; skipped where dask is missing), ``tests/test_torch_cuda.py`` (``convlib.torch``
   autograd on CUDA tensors) and the CUDA pairs of ``tests/test_contract.py``
   (pytest-xdist workers when available);
4. the benchmark, float32: the seed shape (N=8, C=K=4, 1024x1024, 3x3) and the distinct layers
   of ResNet-50 v1.5 at batch 128 (:func:`convlib.bench.suites.resnet50`; Winograd on its 3x3
   stride-1 layers, with cuBLAS and with our GEMM), each against cuDNN
   through PyTorch with TF32 off (the fair FP32 baseline) and on (for reference). Every result
   is checked against cuDNN in float64 first.

Timing: inputs are PyTorch CUDA tensors, so nothing crosses to the host; every convlib candidate
is a :class:`~convlib.dispatch.plan.Plan` run on them. Each measurement is
:func:`convlib.core.timing.time_interleaved`: warm-up calls (compilation included), then
``--reps`` timed calls, clocked by :class:`CudaEventClock`: CUDA events around the call on the
stream the kernels run on, queued behind a GPU sleep long enough for the host to enqueue it, so
the events time the GPU alone (every kernel of one call, launch gaps included); the figure is
their median. The host's own cost per call (Python, argument checks, launches) is reported
separately as ``wall_ms``: the host wall time of one call followed by a synchronisation.

Writes ``gpu-check.json`` (every number), ``gpu-check.md`` (the tables) and ``tests.log`` under
``--out`` and prints the tables last.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..core.precision import DTYPES, dtype_name
from ..core.problem import ConvProblem
from ..core.timing import time_interleaved
from ..dispatch.devices import resolve_device
from ..dispatch.plan import plan_for
from .gpu_report import HALF_TABLES, OUR_ALGOS, render



# -- environment and ceilings -----------------------------------------------------------------------
def environment() -> dict:
    import torch

    from convlib.cuda.launch import cuda  # first: its numpy workaround must precede numba-cuda's target

    dev = cuda.get_current_device()
    env = {
        "gpu": torch.cuda.get_device_name(0),
        "multiprocessors": int(dev.MULTIPROCESSOR_COUNT),
        "compute_capability": ".".join(map(str, dev.compute_capability)),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": _version("numba"),
        "numba_cuda": _version("numba-cuda"),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "cupy": _version("cupy-cuda13x") or _version("cupy-cuda12x") or _version("cupy"),
    }
    try:
        env["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        env["driver"] = "?"
    return env


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def ceilings() -> dict:
    """Measured device-to-device copy bandwidth and FP32 (no TF32) matrix-product rate."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    src = torch.empty(2**28, dtype=torch.float32, device="cuda").uniform_()  # 1 GiB
    dst = torch.empty_like(src)
    copy_ms = statistics.median(gpu_times(lambda: dst.copy_(src), reps=10, warmup=2))
    n = 8192
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    mm_ms = statistics.median(gpu_times(lambda: torch.mm(a, b), reps=5, warmup=2))
    return {
        "copy_GBps": 2 * 2**30 / (copy_ms * 1e-3) / 1e9,
        "sgemm_TFLOPs": 2 * n**3 / (mm_ms * 1e-3) / 1e12,
    }


# -- timing -------------------------------------------------------------------------------------------
#: A generous guess at the GPU clock: a slower clock only makes the sleep longer.
_CLOCK_HZ = 2.0e9


class CudaEventClock:
    """A clock for :func:`~convlib.core.timing.time_interleaved` that times a call on the GPU alone.

    The call is bracketed by CUDA events on PyTorch's current stream (where convlib launches for
    PyTorch inputs), queued behind a GPU sleep twice as long as the host took to enqueue the
    previous call, so the GPU never waits for the host in between.
    """

    def __init__(self):
        self.host_s = 1e-3

    def __call__(self, call):
        import torch

        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(min(1.0, 2.0 * self.host_s + 2e-3) * _CLOCK_HZ))
        t0 = time.perf_counter()
        start.record()
        result = call()
        end.record()
        self.host_s = time.perf_counter() - t0
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e-3, result


def gpu_times(fn, reps=20, warmup=3) -> list[float]:
    """Milliseconds of GPU time of each of ``reps`` calls of ``fn`` (see :class:`CudaEventClock`)."""
    timing = time_interleaved({"fn": fn}, reps, warmup, clock=CudaEventClock())["fn"]
    if timing.error is not None:
        raise timing.error
    return [t * 1e3 for t in timing.times_s]


def _synchronised(fn):
    """``fn`` followed by a device synchronisation (to time a call's host wall time)."""
    import torch

    def synchronised():
        out = fn()
        torch.cuda.synchronize()
        return out

    return synchronised


def _error_text(exc: BaseException) -> str:
    """How a failed variant is reported: its exception's type and message, cut short."""
    return f"{type(exc).__name__}: {exc}"[:300]


def _with_knobs(fn, overrides: dict | None):
    """``fn`` run under ``KNOBS.override(**overrides)`` (CUDA knobs), or ``fn`` itself."""
    if not overrides:
        return fn
    from convlib.cuda.tables import KNOBS

    def under_overrides():
        with KNOBS.override(**overrides):
            return fn()

    return under_overrides


# -- the runs -----------------------------------------------------------------------------------------
def _ours(problem, algo, tx, tw):
    """One call of our ``algo`` as a Plan on the tensors' GPU; returns a PyTorch tensor. Suffixes:
    a GEMM engine (``"im2col-own"``, ``"winograd4-cublas"``) and ``-tf32`` (``allow_tf32``).
    No synchronisation: the clock does that."""
    from convlib.core.options import option_context
    from convlib.cuda.tables import KNOBS

    name, *flags = algo.split("-")
    engine = next((f for f in flags if f in ("own", "cublas")), "auto")
    plan = plan_for("conv2d", problem, resolve_device(None, tx, tw), name)
    xd, wd, _ = plan.prepare(tx, tw, None)
    backend, handle = plan.backend, plan.handle

    def run():
        with KNOBS.override(im2col_gemm=engine), option_context(allow_tf32="tf32" in flags):
            return backend.finish(plan.execute(xd, wd, None), tx, handle)
    return run


def _cudnn(problem, tx, tw, tf32: bool):
    import torch
    import torch.nn.functional as F

    top, bottom, left, right = problem.padding
    symmetric = top == bottom and left == right

    def run():
        torch.backends.cudnn.allow_tf32 = tf32
        xin = tx if symmetric else F.pad(tx, (left, right, top, bottom))
        return F.conv2d(xin, tw, None, problem.stride, (top, left) if symmetric else 0, problem.dilation, problem.groups)
    return run


def bench_case(label, problem, algos, reps, check=True, tiles=None, dtype="float32") -> dict:
    """Time ``algos`` and cuDNN (TF32 off/on; in ``dtype`` alone for float16 / bfloat16) on
    ``problem`` with ``dtype`` tensors (channels-first on both sides); returns a row of the tables."""
    import torch

    torch.backends.cudnn.benchmark = True
    gen = torch.Generator(device="cuda").manual_seed(0)
    tx = torch.randn(problem.x_shape, device="cuda", generator=gen).to(getattr(torch, dtype))
    tw = (torch.randn(problem.w_shape, device="cuda", generator=gen) / math.sqrt(problem.gemm_k)).to(getattr(torch, dtype))
    problem = replace(problem, dtype=dtype)
    ref = _cudnn(problem, tx.double(), tw.double(), False)() if check else None
    row = {"label": label, "problem": problem.describe(), "gflop": problem.flops / 1e9,
           "mbytes": problem.bytes_moved / 1e6, "results": {}}
    runs = {"cudnn": _cudnn(problem, tx, tw, False)}
    if dtype == "float32":
        runs["cudnn-tf32"] = _cudnn(problem, tx, tw, True)
    for algo in algos:
        runs[algo] = _ours(problem, algo, tx, tw)
    checked = {}
    for name, run in runs.items():
        entry = row["results"][name] = {}
        run = _with_knobs(run, tiles.get(name) if tiles else None)
        try:
            t0 = time.perf_counter()
            with _poisoned_allocations():
                y = run()
            torch.cuda.synchronize()
            entry["first_call_s"] = time.perf_counter() - t0
            if ref is not None:
                entry["rel_error"] = float(torch.linalg.norm(y.double() - ref) / torch.linalg.norm(ref))
            del y
            checked[name] = run
        except Exception as exc:  # noqa: BLE001 - a failing variant is reported, the run goes on
            entry["error"] = _error_text(exc)
    # Every variant's calls interleaved round by round, so a drift of the GPU's clocks or of a
    # neighbour's load falls on all of them alike.
    gpu = time_interleaved(checked, reps, warmup=3, clock=CudaEventClock())
    wall = time_interleaved({name: _synchronised(run) for name, run in checked.items()}, max(3, reps // 2), warmup=1)
    for name in runs:
        entry = row["results"][name]
        if name in checked:
            error = gpu[name].error or wall[name].error
            if error is not None:
                entry["error"] = _error_text(error)
            else:
                times = [t * 1e3 for t in gpu[name].times_s]
                entry["gpu_ms"] = statistics.median(times)
                entry["gpu_ms_min"] = min(times)
                entry["wall_ms"] = wall[name].median_s * 1e3
        print(f"  {label:28s} {name:22s} " + " ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in entry.items()), flush=True)
    return row


class _poisoned_allocations:
    """Within the block, every array convlib allocates on the GPU starts as NaN, so the error check
    after it proves that every output element was written (PyTorch's cache would otherwise hand
    back memory holding an earlier, correct result)."""

    def __enter__(self):
        from convlib.cuda.backend import CudaTarget

        self._plain = plain = CudaTarget.empty

        def nan_empty(target, shape, dtype):
            arr = plain(target, shape, dtype)
            owner = getattr(arr, "convlib_owner", None)
            if dtype_name(dtype) not in DTYPES:
                pass  # integer workspaces (flags) hold no result
            elif owner is not None:
                (owner.fill_ if hasattr(owner, "fill_") else owner.fill)(float("nan"))
            elif arr.size and dtype_name(dtype) == "bfloat16":  # held as bits
                arr.copy_to_device(np.full(arr.shape, 0x7FC0, dtype=np.uint16))
            elif arr.size:
                arr.copy_to_device(np.full(arr.shape, np.nan, dtype=dtype))
            return arr

        CudaTarget.empty = nan_empty
        return self

    def __exit__(self, *exc):
        from convlib.cuda.backend import CudaTarget

        CudaTarget.empty = self._plain
        return False


# -- main -------------------------------------------------------------------------------------------------
def run_tests(out: Path, workers: int, quick: bool) -> dict:
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cuda.py", "tests/test_dask_cuda.py",
           "tests/test_torch_cuda.py"]
    if not quick:
        cmd += ["tests/test_contract.py", "-k", "test_cuda or cuda-"]
    if importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", str(workers)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    (out / "tests.log").write_text(log)
    tail = [line for line in log.splitlines() if re.match(r"^=*\s*\d+ (passed|failed)", line)][-1:] or ["(no summary line)"]
    print("\n".join(log.splitlines()[-40:]), flush=True)
    return {"command": " ".join(cmd), "returncode": proc.returncode, "summary": tail[0], "seconds": time.perf_counter() - t0}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m convlib.bench.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-check-out"))
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--quick", action="store_true", help="fewer tests and ResNet layers")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--tile-sweep", action="store_true", help="also time every GEMM / direct tile on a few shapes")
    parser.add_argument("--no-seed-sweeps", action="store_true", help="skip the seed batch and image-size sweeps")
    parser.add_argument("--profile", action="store_true", help="profile the host side of 200 direct calls on the seed shape")
    parser.add_argument("--layers", default="", help="only the ResNet-50 layers whose labels contain one of these "
                        "comma-separated strings (e.g. '3x3,1x1 64'); default all")
    parser.add_argument("--precisions", default="float32", help="comma-separated dtypes of the ResNet-50 tables: "
                        "float32 (exact, and TF32 opt-in), float16, bfloat16 (each against cuDNN in that dtype)")
    parser.add_argument("--skip-seed", action="store_true", help="skip the seed shape and its sweeps")
    parser.add_argument("--algos", default="", help="comma-separated candidates of the ResNet-50 tables instead of "
                        "the full set (e.g. 'auto,auto-tf32': what a user gets, 23 layers in one short call); "
                        "'-tf32' names are timed in float32 only")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    report = {"environment": environment()}
    print(json.dumps(report["environment"], indent=1), flush=True)

    def save():  # after every step: a run cut short still leaves what it measured
        (out / "gpu-check.json").write_text(json.dumps(report, indent=1, default=str))

    if not args.skip_tests:
        report["tests"] = run_tests(out, args.workers, args.quick)
        save()
    if not args.skip_bench:
        run_bench(args, report, save)
    save()
    md = render(report)
    (out / "gpu-check.md").write_text(md)
    print(md)
    return 0 if report.get("tests", {}).get("returncode", 0) == 0 else 1


def run_bench(args, result: dict, save) -> None:
    from convlib.bench.suites import resnet50

    result["ceilings"] = ceilings()
    print("ceilings:", result["ceilings"], flush=True)
    seed = ConvProblem(8, 4, 1024, 1024, 4, 3, 3)
    result["seed"] = [] if args.skip_seed else [bench_case("N=8 C=K=4 1024^2 3x3", seed, OUR_ALGOS, args.reps)]
    save()
    if not args.no_seed_sweeps and not args.quick and not args.skip_seed:
        result["seed_sweeps"] = []
        for n, size in [(8, 256), (8, 512), (8, 2048), (8, 4096), (16, 1024), (32, 1024), (64, 1024), (80, 1024)]:
            problem = ConvProblem(n, 4, size, size, 4, 3, 3)
            result["seed_sweeps"].append(bench_case(f"N={n} {size}^2", problem, ("direct",), args.reps))
            save()
    cases = resnet50(batch=args.batch, quick=args.quick)
    wanted = [part.strip() for part in args.layers.split(",") if part.strip()]
    if wanted:
        cases = [case for case in cases if any(part in case.label for part in wanted)]
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    chosen = tuple(a.strip() for a in args.algos.split(",") if a.strip())
    unknown = set(precisions) - set(HALF_TABLES) - {"float32"}
    if unknown:
        raise SystemExit(f"--precisions: unknown {sorted(unknown)}; allowed are float32, {', '.join(HALF_TABLES)}")
    for dtype in (p for p in precisions if p != "float32"):
        result[HALF_TABLES[dtype]] = []
        for case in cases:
            # blis multiplies the half values on tensor cores; im2col and Winograd widen them to
            # float32 copies first (the candidates that led before blis had tensor cores).
            winograd = ("winograd4",) if case.problem.is_winograd_shape else ()
            algos = (tuple(a for a in chosen if not a.endswith("-tf32")) if chosen
                     else ("auto", "blis", "im2col-cublas") + winograd)
            row = bench_case(case.label, case.problem, algos, args.reps, dtype=dtype)
            row["weight"] = case.weight
            result[HALF_TABLES[dtype]].append(row)
            save()
    if "float32" not in precisions:
        return
    result["resnet50"] = []
    for case in cases:
        winograd = (("winograd2", "winograd4", "winograd4-own", "winograd4-cublas-tf32")
                    if case.problem.is_winograd_shape else ())
        algos = chosen or ("auto", "auto-tf32", "blis", "blis-tf32", "im2col-own", "im2col-cublas",
                           "im2col-cublas-tf32") + winograd
        row = bench_case(case.label, case.problem, algos, args.reps)
        row["weight"] = case.weight
        row["winograd_shape"] = case.problem.is_winograd_shape
        result["resnet50"].append(row)
        save()
    if args.tile_sweep:
        result["tile_sweep"] = tile_sweep(args, seed, cases)
    if args.profile:
        result["profile"] = profile_host(seed)


def profile_host(problem) -> str:
    """cProfile of the host side of 200 direct calls (GPU work queued, not waited for)."""
    import cProfile
    import io
    import pstats

    import torch

    tx = torch.randn(problem.x_shape, device="cuda")
    tw = torch.randn(problem.w_shape, device="cuda")
    run = _ours(problem, "direct", tx, tw)
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(200):
        run()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    print(text.getvalue(), flush=True)
    return text.getvalue()


def tile_sweep(args, seed, cases) -> list:
    from convlib.cuda.tables import KNOBS, DirectTile, GemmTile

    rows = []
    direct_tiles = [
        DirectTile(16, 256, 2, 8, 4, 2), DirectTile(16, 256, 2, 8, 4, 4), DirectTile(8, 256, 1, 8, 4, 4),
        DirectTile(32, 256, 4, 8, 4, 1), DirectTile(16, 512, 2, 16, 4, 1), DirectTile(8, 512, 2, 16, 4, 2),
        DirectTile(16, 256, 4, 8, 4, 2), DirectTile(32, 128, 2, 4, 4, 2),
    ]
    tiles = {f"direct {t.TH}x{t.TW} {t.RPT}x{t.JPT} KB{t.KB} CB{t.CB}": {"direct_tile": t} for t in direct_tiles}
    runs = {name: "direct" for name in tiles}
    rows.append(_sweep_case("seed", seed, runs, tiles, args.reps))
    gemm_tiles = list(KNOBS.lookup("gemm_tiles", "float32"))[:4] + [GemmTile(64, 256, 8, 8, 8), GemmTile(64, 32, 8, 4, 4)]
    tiles = {f"blis {t.BM}x{t.BN}x{t.BK} {t.TM}x{t.TN}": {"gemm_tile": t} for t in gemm_tiles}
    runs = {name: "blis" for name in tiles}
    picks = [c for c in cases if c.label in (
        "s2 3x3 64>64", "s2 1x1 64>256", "s3 1x1 512>128", "s4 1x1 256>1024", "s5 1x1 2048>512", "s3 3x3/2 128>128")]
    for case in picks:
        rows.append(_sweep_case(case.label, case.problem, runs, tiles, args.reps))
    return rows


def _sweep_case(label, problem, runs, tiles, reps):
    import torch

    from convlib.cuda.tables import KNOBS

    gen = torch.Generator(device="cuda").manual_seed(1)
    tx = torch.randn(problem.x_shape, device="cuda", generator=gen)
    tw = torch.randn(problem.w_shape, device="cuda", generator=gen)
    row = {"label": label, "gflop": problem.flops / 1e9, "results": {}}
    for name, algo in runs.items():
        try:
            with KNOBS.override(**tiles[name]):
                ms = statistics.median(gpu_times(_ours(problem, algo, tx, tw), reps=max(5, reps // 2)))
            row["results"][name] = {"gpu_ms": ms}
        except Exception as exc:  # noqa: BLE001
            row["results"][name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
        print(f"  sweep {label:20s} {name:34s} {row['results'][name]}", flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
