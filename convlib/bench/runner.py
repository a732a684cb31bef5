"""Timing: warm every candidate up, then interleave their repeats, and check every answer.

Method, per shape:

1. Random inputs (uniform in [-1, 1)) are made once and put on each device once; data transfers
   are not timed.
2. A reference answer is computed (:func:`reference_for`): float64 PyTorch when the shape is
   small enough, else PyTorch in the problem's dtype, else the float64 scipy reference for small
   shapes. Every candidate's first answer is compared with it, so a fast wrong kernel is flagged
   (``status="wrong"``) rather than celebrated.
3. Each candidate is called once (its *first* call: compilation or cache loading, first-touch
   page faults) and ``warmup`` more times, then the ``repeats`` timed calls run round-robin over
   the candidates, starting one candidate later each round, so that a noisy, shared machine
   disturbs all of them alike. A short sleep before each call lets the OpenMP threads of the
   previous candidate stop spinning.
4. The median, minimum and interquartile range of the timed calls are reported; the "compile"
   time is the first call minus the median.

Device calls are synchronised before the clock stops (``backend.synchronize(handle)`` when the
backend has it, else ``queue.wait()`` for SYCL and ``numba.cuda.synchronize()`` for CUDA).

:func:`time_candidates` is the small reusable piece: median seconds per algorithm for one problem,
for callers such as ``choose_algorithm(..., measure=True)``.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..problem import ConvProblem

#: Relative (Frobenius) error allowed against a float64 reference, per dtype (the project's bar).
TOLERANCE = {"float32": 1e-5, "float64": 1e-12}
#: Extra factor allowed when the reference itself is computed in the problem's dtype (PyTorch in
#: float32 has rounding errors of its own, of the same order as ours).
SAME_PRECISION_SLACK = 4.0
#: Largest x + y (elements) for which a float64 PyTorch reference is computed (1 GiB of float64).
FLOAT64_REFERENCE_MAX_ELEMENTS = 2**27
#: Largest problem (FLOPs) for which the slow scipy float64 reference is used when PyTorch is absent.
SCIPY_REFERENCE_MAX_FLOPS = 2e9
#: A CPU algorithm is skipped when its workspace plus its output would take more than this share of
#: the memory available (Winograd's workspace on the 4096^2 seed shape is ~10-17 GB): an out-of-
#: memory kill would end the whole run, and hurt whoever else uses the machine.
MEMORY_HEADROOM = 0.8


# ------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------
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

    Returns
    -------
    dict of str to Timing
        In the order of ``calls``. A candidate that raised has ``error`` set and no times.
    """
    tick = tick or (lambda n: None)
    repeats = max(1, int(repeats))
    timings = {name: Timing() for name in calls}
    planned: dict[str, int] = {}
    for name, call in calls.items():
        timing = timings[name]
        try:
            timing.first_s, result = _timed_call(call, gap_s)
            if on_first is not None:
                on_first(name, result)
            del result
            for _ in range(warmup):
                seconds, _ = _timed_call(call, gap_s)
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
                seconds, _ = _timed_call(calls[name], gap_s)
            except Exception as exc:  # failed after succeeding once: still report it
                timing.error = exc
                tick(planned[name] - len(timing.times_s))
                continue
            timing.times_s.append(seconds)
            tick(1)
    return timings


def _timed_call(call, gap_s: float) -> tuple[float, Any]:
    if gap_s > 0:
        time.sleep(gap_s)
    enabled = gc.isenabled()
    gc.disable()  # a collection inside a timed call would be charged to whoever is running
    try:
        t0 = time.perf_counter()
        result = call()
        seconds = time.perf_counter() - t0
    finally:
        if enabled:
            gc.enable()
    return seconds, result


# ------------------------------------------------------------------------------------------
# Candidates: convlib algorithms on a device, and baselines
# ------------------------------------------------------------------------------------------
@dataclass
class Candidate:
    """Something to time on one shape.

    Attributes
    ----------
    name : str
        The algorithm (``"direct"``, ..., ``"auto"``) or baseline (``"torch"``, ``"scipy"``).
    device : str
        Where it runs (``"cpu"``, a SYCL filter string, ``"cuda:0"``).
    kind : str
        ``"convlib"`` or ``"baseline"``.
    call : callable
        Runs once and returns the result, synchronised.
    to_host : callable
        Turns a result into a numpy array (for the correctness check).
    picked : str or None
        For ``auto``: the algorithm it ran, and ``reason`` why.
    """

    name: str
    device: str
    kind: str
    call: Callable[[], Any]
    to_host: Callable[[Any], np.ndarray] = np.asarray
    picked: str | None = None
    reason: str | None = None

    @property
    def key(self) -> str:
        return f"{self.name}@{self.device}"


@dataclass
class Skipped:
    """A candidate that was not timed on a shape, and why (``status``: unsupported, unavailable, skipped)."""

    name: str
    device: str
    kind: str
    status: str
    note: str


def random_inputs(problem: ConvProblem, seed: int = 0):
    """x, w and bias (None unless ``problem.has_bias``) uniform in [-1, 1), in the problem's dtype."""
    rng = np.random.default_rng(seed)

    def uniform(shape):
        a = rng.random(shape, dtype=np.dtype(problem.dtype))
        a *= 2
        a -= 1  # in place: the seed suites' inputs are gigabytes
        return a

    return uniform(problem.x_shape), uniform(problem.w_shape), (uniform((problem.K,)) if problem.has_bias else None)


def _synchronizer(backend, handle) -> Callable[[], None]:
    sync = getattr(backend, "synchronize", None)
    if sync is not None:
        return lambda: sync(handle)
    if backend.name == "sycl" and hasattr(handle, "wait"):
        return handle.wait
    if backend.name == "cuda":
        from numba import cuda

        return cuda.synchronize
    return lambda: None


def available_memory_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` (None where there is no such file)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_shortfall(problem: ConvProblem, algo: str) -> str | None:
    """Why a CPU ``algo`` should not run here for lack of memory, or None.

    Uses ``problem.workspace_bytes(algo)`` plus the output; algorithms it does not know are let
    through.
    """
    try:
        need = problem.workspace_bytes(algo) + problem.N * problem.K * problem.P * problem.Q * problem.itemsize
    except (ValueError, ImportError):
        return None
    available = available_memory_bytes()
    if available is None or need <= MEMORY_HEADROOM * available:
        return None
    return (f"needs ~{need / 1e9:.1f} GB (workspace + output) but only {available / 1e9:.1f} GB are available; "
            f"skipped rather than risk the out-of-memory killer")


def convlib_candidates(problem: ConvProblem, device: str, algos, x, w, bias) -> list[Candidate | Skipped]:
    """One candidate per algorithm of ``algos`` (``"auto"`` allowed) on ``device``.

    Inputs are placed on the device here, once. Algorithms that cannot serve the problem, or
    whose module cannot be imported, come back as :class:`Skipped`, and so do CPU algorithms
    whose workspace would not fit in memory (:func:`memory_shortfall`).
    """
    from .. import registry
    from ..api import unsupported_reason
    from ..backends import resolve_device
    from ..select import choose_algorithm_for

    target = resolve_device(device, None, None, None)
    backend, handle = target.backend, target.handle
    xd = backend.prepare(x, problem.dtype, handle)
    wd = backend.prepare(w, problem.dtype, handle)
    bd = None if bias is None else backend.prepare(bias, problem.dtype, handle)
    sync = _synchronizer(backend, handle)

    def to_host(y):
        return np.asarray(backend.finish(y, x, handle))

    def runner(impl):
        def call():
            y = impl.conv2d(problem, xd, wd, bd, handle)
            sync()
            return y

        return call

    out: list[Candidate | Skipped] = []
    for algo in algos:
        try:
            if algo == "auto":
                choice = choose_algorithm_for(problem, backend.name, str(device))

                def call_auto():
                    # What conv2d(algo="auto") does per call: choose, then run.
                    picked = choose_algorithm_for(problem, backend.name, str(device)).algo
                    y = registry.implementation(backend.name, picked).conv2d(problem, xd, wd, bd, handle)
                    sync()
                    return y

                registry.implementation(backend.name, choice.algo)  # import errors surface here
                short = memory_shortfall(problem, choice.algo) if backend.name == "cpu" else None
                if short is not None:
                    out.append(Skipped("auto", device, "convlib", "skipped", f"-> {choice.algo}: {short}"))
                    continue
                out.append(Candidate("auto", device, "convlib", call_auto, to_host, choice.algo, choice.reason))
                continue
            reason = unsupported_reason(backend.name, algo, problem)
            if reason is not None:
                out.append(Skipped(algo, device, "convlib", "unsupported", reason))
                continue
            short = memory_shortfall(problem, algo) if backend.name == "cpu" else None
            if short is not None:
                out.append(Skipped(algo, device, "convlib", "skipped", short))
                continue
            out.append(Candidate(algo, device, "convlib", runner(registry.implementation(backend.name, algo)), to_host))
        except NotImplementedError as exc:
            out.append(Skipped(algo, device, "convlib", "unsupported", str(exc)))
        except ImportError as exc:
            out.append(Skipped(algo, device, "convlib", "unavailable", f"cannot import: {exc}"))
    return out


def torch_conv(problem: ConvProblem, x, w, bias, dtype=None) -> Callable[[], Any]:
    """``torch.nn.functional.conv2d`` on the CPU for ``problem``; inputs shared with numpy, not copied.

    Asymmetric padding, which ``conv2d`` cannot express, is an explicit ``F.pad`` inside the call.
    ``dtype`` (e.g. ``"float64"``) converts the inputs first (reference answers).
    """
    import torch
    import torch.nn.functional as F

    def tensor(a):
        if a is None:
            return None
        return torch.from_numpy(a if dtype is None else a.astype(dtype))

    xt, wt, bt = tensor(x), tensor(w), tensor(bias)
    top, bottom, left, right = problem.padding
    if top == bottom and left == right:
        def call():
            with torch.no_grad():
                return F.conv2d(xt, wt, bt, problem.stride, (top, left), problem.dilation, problem.groups)
    else:
        def call():
            with torch.no_grad():
                return F.conv2d(F.pad(xt, (left, right, top, bottom)), wt, bt, problem.stride, 0,
                                problem.dilation, problem.groups)
    return call


def _scipy_parts(problem: ConvProblem, x, w, dtype):
    from scipy import signal

    top, bottom, left, right = problem.padding
    x = np.asarray(x, dtype=dtype)
    w = np.asarray(w, dtype=dtype)
    dil_h, dil_w = problem.dilation
    # A dilated filter is the dense filter with zeros between its taps.
    wd = np.zeros(w.shape[:2] + ((problem.R - 1) * dil_h + 1, (problem.S - 1) * dil_w + 1), dtype=dtype)
    wd[:, :, ::dil_h, ::dil_w] = w

    def one(xp, n, k):
        g = k // problem.K_per_group
        planes = xp[n, g * problem.C_per_group:(g + 1) * problem.C_per_group]
        full = signal.correlate(planes, wd[k], mode="valid")[0]
        return full[::problem.stride[0], ::problem.stride[1]][:problem.P, :problem.Q]

    def padded():
        return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right))) if any(problem.padding) else x

    return one, padded


def scipy_conv(problem: ConvProblem, x, w, bias, dtype=None) -> Callable[[], np.ndarray]:
    """The convolution as ``scipy.signal.correlate`` calls, one per (image, output channel).

    Zero padding by ``np.pad``, dilation by spreading the filter, stride by slicing the stride-1
    answer. ``dtype`` (default the problem's) is the precision it computes in.
    """
    dtype = dtype or problem.dtype
    one, padded = _scipy_parts(problem, x, w, dtype)

    def call():
        xp = padded()
        y = np.empty(problem.y_shape, dtype=dtype)
        for n in range(problem.N):
            for k in range(problem.K):
                y[n, k] = one(xp, n, k)
        if bias is not None:
            y += np.asarray(bias, dtype=dtype)[None, :, None, None]
        return y

    return call


def scipy_estimate_s(problem: ConvProblem, x, w) -> float:
    """Seconds :func:`scipy_conv` would take, extrapolated from one (image, channel) correlation."""
    one, padded = _scipy_parts(problem, x[:1], w, problem.dtype)
    t0 = time.perf_counter()
    xp = padded()
    pad_s = (time.perf_counter() - t0) * problem.N
    t0 = time.perf_counter()
    one(xp, 0, 0)
    return pad_s + (time.perf_counter() - t0) * problem.N * problem.K


def baseline_candidates(problem: ConvProblem, baselines, x, w, bias, *, scipy_max_seconds: float = 10.0
                        ) -> list[Candidate | Skipped]:
    """Candidates for the baselines named in ``baselines`` (``"torch"``, ``"scipy"``), on the CPU.

    scipy is skipped when one call is estimated to take more than ``scipy_max_seconds``.
    """
    out: list[Candidate | Skipped] = []
    for name in baselines:
        if name == "torch":
            try:
                out.append(Candidate("torch", "cpu", "baseline", torch_conv(problem, x, w, bias), lambda y: y.numpy()))
            except ImportError as exc:
                out.append(Skipped("torch", "cpu", "baseline", "unavailable", f"cannot import torch: {exc}"))
        elif name == "scipy":
            estimate = scipy_estimate_s(problem, x, w)
            if estimate > scipy_max_seconds:
                out.append(Skipped("scipy", "cpu", "baseline", "skipped",
                                   f"estimated {estimate:.3g} s per call > --scipy-max-seconds {scipy_max_seconds:g}"))
            else:
                out.append(Candidate("scipy", "cpu", "baseline", scipy_conv(problem, x, w, bias)))
        else:
            raise ValueError(f"unknown baseline {name!r}; known baselines are torch, scipy")
    return out


# ------------------------------------------------------------------------------------------
# Correctness
# ------------------------------------------------------------------------------------------
@dataclass
class Reference:
    """A reference answer and how far a result may be from it.

    Attributes
    ----------
    y : numpy.ndarray or None
        The answer (None: no check possible).
    label : str
        How it was computed (``"torch-float64"``, ``"torch-float32"``, ``"scipy-float64"``, ``"none"``).
    tolerance : float
        Largest relative Frobenius error accepted.
    """

    y: np.ndarray | None
    label: str
    tolerance: float


def reference_for(problem: ConvProblem, x, w, bias) -> Reference:
    """The best reference affordable for ``problem`` (see the module docstring)."""
    tol = TOLERANCE[problem.dtype]
    small = (problem.N * (problem.C * problem.H * problem.W + problem.K * problem.P * problem.Q)
             <= FLOAT64_REFERENCE_MAX_ELEMENTS)
    try:
        import torch  # noqa: F401
    except ImportError:
        if problem.flops <= SCIPY_REFERENCE_MAX_FLOPS:
            return Reference(scipy_conv(problem, x, w, bias, dtype="float64")(), "scipy-float64", tol)
        return Reference(None, "none", math.inf)
    if small or problem.dtype == "float64":
        return Reference(torch_conv(problem, x, w, bias, dtype="float64")().numpy(), "torch-float64", tol)
    y = torch_conv(problem, x, w, bias)().numpy()
    return Reference(y, f"torch-{problem.dtype}", tol * SAME_PRECISION_SLACK)


def relative_error(y: np.ndarray, ref: np.ndarray) -> float:
    """``||y - ref|| / ||ref||`` (Frobenius, accumulated in float64 a few images at a time).

    Raises ``ValueError`` when the shapes differ.
    """
    y = np.asarray(y)
    if y.shape != ref.shape:
        raise ValueError(f"result has shape {y.shape}, expected {ref.shape}")
    per_image = max(1, int(np.prod(ref.shape[1:])))
    step = max(1, 2**24 // per_image)
    err = norm = 0.0
    for n in range(0, max(ref.shape[0], 1), step):
        r = ref[n:n + step].astype(np.float64)
        d = y[n:n + step].astype(np.float64) - r
        err += float(np.vdot(d, d))
        norm += float(np.vdot(r, r))
    if not math.isfinite(err):
        return math.inf
    return math.sqrt(err / norm) if norm > 0 else math.sqrt(err)


# ------------------------------------------------------------------------------------------
# One shape, everything
# ------------------------------------------------------------------------------------------
def run_problem(
    problem: ConvProblem,
    *,
    devices=("cpu",),
    algos=None,
    baselines=("torch",),
    repeats: int = 5,
    warmup: int = 1,
    max_seconds: float | None = None,
    scipy_max_seconds: float = 10.0,
    gap_s: float = 0.01,
    check: bool = True,
    seed: int = 0,
    tick: Callable[[int], None] | None = None,
) -> list[dict]:
    """Time every candidate on one problem; one record (a flat dict) per candidate.

    Parameters
    ----------
    problem : ConvProblem
    devices : sequence of str
        Devices to run convlib's algorithms on.
    algos : dict of str to list of str, or None
        Algorithms per device (``"auto"`` allowed); None means every algorithm of the device plus
        ``auto``.
    baselines : sequence of str
        ``"torch"`` and/or ``"scipy"`` (run on the CPU, once per shape).
    repeats, warmup, max_seconds, gap_s
        As in :func:`time_interleaved`.
    scipy_max_seconds : float
        Skip the scipy baseline when one call is estimated to take longer.
    check : bool
        Compare every first result with :func:`reference_for`.
    seed : int
        Seed of the random inputs.
    tick : callable, optional
        Progress callback: :func:`planned_calls` ticks per candidate, skipped ones included.

    Returns
    -------
    list of dict
        Keys: ``name, device, kind, status`` (``ok``, ``wrong``, ``error``, ``unsupported``,
        ``unavailable``, ``skipped``), ``note``, ``picked`` and ``reason`` (auto), ``first_s,
        compile_s, median_s, min_s, q25_s, q75_s, iqr_s, repeats, times_s, rel_error,
        reference``.
    """
    x, w, bias = random_inputs(problem, seed)
    # The reference first, so the memory check of the candidates sees what it takes.
    reference = reference_for(problem, x, w, bias) if check else Reference(None, "none", math.inf)
    candidates: list[Candidate | Skipped] = []
    for device in devices:
        device_algos = algos.get(device) if algos else None
        if device_algos is None:
            device_algos = default_algorithms(device)
        try:
            candidates += convlib_candidates(problem, device, device_algos, x, w, bias)
        except (ValueError, ImportError) as exc:
            candidates += [Skipped(a, device, "convlib", "unavailable", str(exc)) for a in device_algos]
    candidates += baseline_candidates(problem, baselines, x, w, bias, scipy_max_seconds=scipy_max_seconds)
    runnable = {c.key: c for c in candidates if isinstance(c, Candidate)}
    if tick is not None:
        tick(planned_calls(len(candidates) - len(runnable), repeats, warmup))

    errors: dict[str, float] = {}

    def on_first(key, result):
        if reference.y is None:
            return
        errors[key] = relative_error(runnable[key].to_host(result), reference.y)

    timings = time_interleaved({k: c.call for k, c in runnable.items()}, repeats, warmup, max_seconds=max_seconds,
                               gap_s=gap_s, on_first=on_first, tick=tick)
    reference_label, tolerance = reference.label, reference.tolerance
    del reference  # gigabytes on the seed suites
    records = []
    for cand in candidates:
        rec = {"name": cand.name, "device": cand.device, "kind": cand.kind, "status": None, "note": "",
               "picked": None, "reason": None}
        if isinstance(cand, Skipped):
            rec.update(status=cand.status, note=cand.note)
            records.append(rec)
            continue
        timing = timings[cand.key]
        q25, q75 = timing.quartiles_s
        rec.update(picked=cand.picked, reason=cand.reason, first_s=timing.first_s, compile_s=timing.compile_s,
                   median_s=timing.median_s, min_s=timing.min_s, q25_s=q25, q75_s=q75, iqr_s=q75 - q25,
                   repeats=len(timing.times_s), times_s=list(timing.times_s),
                   rel_error=errors.get(cand.key, math.nan), reference=None)
        if timing.error is not None:
            exc = timing.error
            status = "skipped" if isinstance(exc, NotImplementedError) else "error"
            rec.update(status=status, note=f"{type(exc).__name__}: {exc}")
        elif cand.key in errors:
            rec["reference"] = reference_label
            ok = errors[cand.key] <= tolerance
            rec["status"] = "ok" if ok else "wrong"
            if not ok:
                rec["note"] = f"WRONG: relative error {errors[cand.key]:.3g} > {tolerance:.3g} vs {reference_label}"
        else:
            rec["status"] = "ok"
            rec["note"] = "not checked"
        records.append(rec)
    return records


def default_algorithms(device: str) -> list[str]:
    """Every algorithm ``device`` offers, aliases removed, then ``auto``.

    Two names served by the same implementation (``winograd`` and ``winograd4``) would be timed
    twice for nothing; the first name is kept.
    """
    import convlib
    from .. import registry
    from ..backends import resolve_device

    backend = resolve_device(device, None, None, None).backend.name
    names, seen = [], []
    for algo in convlib.algorithms(device):
        try:
            impl = registry.implementation(backend, algo)
        except ImportError:
            names.append(algo)  # reported as unavailable per shape
            continue
        if any(impl is other for other in seen):
            continue
        seen.append(impl)
        names.append(algo)
    return names + ["auto"]


def planned_calls(n_candidates: int, repeats: int, warmup: int) -> int:
    """Progress ticks :func:`time_interleaved` makes for ``n_candidates`` candidates."""
    return n_candidates * (1 + warmup + max(1, repeats))


# ------------------------------------------------------------------------------------------
# For the algorithm selector
# ------------------------------------------------------------------------------------------
def time_candidates(problem: ConvProblem, algos, device="cpu", repeats: int = 5, *, warmup: int = 1,
                    seed: int = 0) -> dict[str, float]:
    """Median seconds per call of each algorithm of ``algos`` on random data of ``problem``'s shape.

    Every algorithm is called once (compilation) and ``warmup`` more times, then ``repeats``
    interleaved timed calls are made. No correctness check, no baselines.

    Parameters
    ----------
    problem : ConvProblem
    algos : sequence of str
        Algorithm names of the device's backend (``"auto"`` allowed).
    device : str, default "cpu"
        As ``device=`` of :func:`convlib.conv2d`.
    repeats, warmup : int
        Timed and untimed calls per algorithm.
    seed : int
        Seed of the random inputs.

    Returns
    -------
    dict of str to float
        Median seconds per algorithm; algorithms that cannot serve the problem, cannot be imported
        or raised are left out.
    """
    x, w, bias = random_inputs(problem, seed)
    runnable = {c.name: c.call for c in convlib_candidates(problem, str(device), list(algos), x, w, bias)
                if isinstance(c, Candidate)}
    timings = time_interleaved(runnable, repeats, warmup)
    return {name: t.median_s for name, t in timings.items() if t.error is None and t.times_s}
