"""What machine a benchmark ran on, and what that machine can do at best.

:func:`describe` gathers the facts a result needs to be read later (CPU model and features,
threads, library versions, numba's threading layer, the environment variables that change BLAS
and OpenMP behaviour). :func:`measure_ceilings` measures three ceilings once per run: the fp32
FMA peak, the memory bandwidth and numpy's SGEMM rate, against which kernels are judged.

The ceiling kernels are compiled at each measurement (a second or two; never cached: they are
built by a factory per accumulator count).
"""

from __future__ import annotations

import datetime
import functools
import math
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np

#: Environment variables that change how BLAS, OpenMP, numba, oneDNN or convlib behave.
ENV_PREFIXES = ("OPENBLAS_", "OMP_", "GOMP_", "KMP_", "MKL_", "NUMBA_", "DNNL_", "ONEDNN_", "CONVLIB_",
                "SYCL_", "ONEAPI_", "CUDA_VISIBLE_DEVICES", "TORCH_", "XDG_CACHE_HOME")

#: CPU feature flags worth reporting (vector width and FMA decide the peak).
CPU_FLAGS = ("fma", "avx", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile")

#: Accumulator counts tried for the FMA peak (float32 elements; the best one is kept). 64-96
#: floats are 8-12 AVX2 registers or 4-6 AVX-512 ones: enough independent chains to cover the
#: FMA latency on two pipes, few enough to stay in registers.
FMA_ACCUMULATOR_SIZES = (64, 96, 128, 192)


def _cpuinfo() -> dict:
    info = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "flags", "cpu family", "model", "vendor_id") and key not in info:
            info[key] = value.strip()
    return info


def _cache_sizes() -> dict:
    """Cache sizes of CPU 0 in bytes, as :func:`convlib.cpu.isa.cache_sizes` reads them."""
    from ..cpu.isa import cache_sizes

    return dict(cache_sizes())


def _cpu_knobs() -> dict:
    """What the CPU kernels run with: the tuned profile (if any) and the BLIS blocking in force."""
    from ..cpu.profile import profile_path
    from ..cpu.tables import KNOBS, blis_blocking

    profile = KNOBS.profile()
    return {
        "profile": str(profile_path()) if profile else None,
        "profile_knobs": {name: repr(value) for name, value in profile.items()},
        "blis_blocking_float32": repr(blis_blocking("float32")),
    }


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git_revision() -> str | None:
    """The commit of the convlib checkout (with ``-dirty`` when files differ), if it is one."""
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return rev.stdout.strip() or None


def numba_threading_layer() -> str | None:
    """The threading layer numba uses (runs a tiny parallel function first, as numba requires)."""
    import numba

    try:
        _touch_parallel(np.zeros(4))
        return numba.threading_layer()
    except Exception as exc:  # numba raises ValueError when no layer could be loaded
        return f"unknown ({exc})"


@functools.cache
def _parallel_touch_kernel():
    from numba import njit, prange

    @njit(parallel=True)
    def touch(a):
        for i in prange(a.size):
            a[i] += 1.0

    return touch


def _touch_parallel(a):
    _parallel_touch_kernel()(a)


def describe() -> dict:
    """Facts about this machine and software stack, for the results file.

    Returns
    -------
    dict
        ``cpu`` (model, vendor, flags of :data:`CPU_FLAGS`, logical CPUs, CPUs this process may
        use, caches, LLVM's name for the CPU), ``memory_gib``, ``platform``, ``python``,
        ``versions`` (numba, llvmlite, numpy, scipy, torch, convlib, ...), ``numba`` (threading
        layer, threads), ``cpu_knobs`` (the tuned profile in use, if any, and the BLIS blocking),
        ``torch`` (threads), ``numpy_blas``, ``env`` (variables whose names
        start with one of :data:`ENV_PREFIXES`), ``git``, ``date`` and ``load_average``.
    """
    import numba

    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    try:
        import llvmlite.binding as llvm

        llvm_cpu = llvm.get_host_cpu_name()
    except Exception:  # only informative
        llvm_cpu = None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    desc = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": {
            "model": info.get("model name") or platform.processor() or None,
            "vendor": info.get("vendor_id"),
            "family_model": f"{info.get('cpu family', '?')}/{info.get('model', '?')}",
            "flags": [f for f in CPU_FLAGS if f in flags],
            "logical_cpus": os.cpu_count(),
            "usable_cpus": usable,
            "caches": _cache_sizes(),
            "llvm_cpu_name": llvm_cpu,
        },
        "memory_gib": _mem_total_gib(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {name: _version(name) for name in
                     ("convlib", "numba", "llvmlite", "numpy", "scipy", "torch", "numba-dpex", "dpctl", "dpnp",
                      "numba-cuda", "matplotlib", "tqdm")},
        "numba": {
            "threading_layer": numba_threading_layer(),
            "num_threads": numba.get_num_threads(),
            "NUMBA_NUM_THREADS": numba.config.NUMBA_NUM_THREADS,
        },
        "cpu_knobs": _cpu_knobs(),
        "torch": _torch_facts(),
        "numpy_blas": _numpy_blas(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
        "git": _git_revision(),
        "load_average": _load_average(),
    }
    return desc


def _load_average() -> list[float] | None:
    """1, 5 and 15-minute load averages: a busy shared machine shows here."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def _torch_facts() -> dict | None:
    try:
        import torch
    except ImportError:
        return None
    return {"num_threads": torch.get_num_threads(), "mkldnn": bool(torch.backends.mkldnn.is_available()),
            "parallel_info": torch.__config__.parallel_info().splitlines()[:6]}


def _numpy_blas() -> str | None:
    try:
        config = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # the layout of show_config changes between numpy versions
        return None


# ------------------------------------------------------------------------------------------
# Ceilings
# ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _fma_kernel(accumulators: int):
    """A kernel where each thread runs ``accumulators`` independent float32 FMA chains.

    The chains are vectors of the widest registers the CPU has (:func:`convlib.cpu.isa.simd_bytes`:
    zmm with AVX-512, written as explicit vectors, since LLVM's loop vectoriser stays at 256 bits on
    Intel's AVX-512 parts and measured half their peak there: 160 GFLOP/s on two Xeon cores), kept
    in a constant-size stack buffer that LLVM holds in registers (see
    :mod:`convlib.cpu.stack_buffer`); each iteration is ``accumulators / lanes`` independent vector
    FMAs and nothing else.
    """
    from numba import njit, prange

    from ..cpu.intrinsics import vector_fma
    from ..cpu.isa import simd_bytes
    from ..cpu.stack_buffer import stack_array_1d

    lanes = simd_bytes() // 4
    vectors = max(1, accumulators // lanes)
    size = vectors * lanes

    @njit(parallel=True, fastmath={"contract"})
    def fma_chains(iterations, a, b, out):  # out: (threads,) one sum per thread, so nothing is dead code
        for t in prange(out.size):
            acc = stack_array_1d(size, np.float32)
            step = stack_array_1d(lanes, np.float32)
            scale = stack_array_1d(1, np.float32)
            for j in range(size):
                acc[j] = np.float32(t + j) * np.float32(1e-3)
            for j in range(lanes):
                step[j] = b
            scale[0] = a
            for _ in range(iterations):
                for v in range(vectors):
                    vector_fma(acc, v * lanes, scale, 0, step, 0, lanes)  # acc += a * b, one FMA
            total = np.float32(0)
            for j in range(size):
                total += acc[j]
            out[t] = total

    return fma_chains, size


def fma_peak(threads: int | None = None, seconds: float = 0.3, trials: int = 3) -> tuple[float, int]:
    """Best float32 FMA rate in GFLOP/s over :data:`FMA_ACCUMULATOR_SIZES`, and the size that gave it.

    Parameters
    ----------
    threads : int, optional
        Threads (numba's current count by default); one task per thread.
    seconds : float
        Rough duration of one timed trial.
    trials : int
        Trials per accumulator size; the fastest counts.
    """
    import numba

    threads = threads or numba.get_num_threads()
    out = np.zeros(threads, np.float32)
    a, b = np.float32(0.999999), np.float32(1e-6)
    best = (0.0, 0)
    for accumulators in FMA_ACCUMULATOR_SIZES:
        kernel, size = _fma_kernel(accumulators)
        kernel(100, a, b, out)  # compile
        # Size the trial from a short one, so each trial runs about `seconds`.
        t0 = time.perf_counter()
        kernel(100_000, a, b, out)
        per_iter = max(time.perf_counter() - t0, 1e-6) / 100_000
        iterations = max(1000, int(seconds / per_iter))
        fastest = min(_timed(kernel, iterations, a, b, out) for _ in range(trials))
        rate = 2.0 * size * iterations * threads / fastest / 1e9
        if rate > best[0]:
            best = (rate, size)
    return best


@functools.cache
def _copy_kernel(streaming: bool):
    """A parallel copy in whole cache lines, each thread its share: with plain vector stores or
    with non-temporal ones (no read for ownership of the destination)."""
    from numba import njit, prange

    from ..cpu.intrinsics import store_fence, vector_copy, vector_stream_plus

    @njit(parallel=True)
    def parallel_copy(src, dst, threads):
        lines = src.size // 16
        for t in prange(threads):
            i = (lines * t // threads) * 16
            end = (lines * (t + 1) // threads) * 16
            while i < end:
                if streaming:
                    vector_stream_plus(dst, i, src, i, np.float32(0), 16)
                else:
                    vector_copy(dst, i, src, i, 16)
                i += 16
            if streaming:
                store_fence()

    return parallel_copy


def _line_aligned(n: int) -> np.ndarray:
    raw = np.ones(n + 16, np.float32)  # ones: the pages are touched before timing
    start = (-raw.__array_interface__["data"][0] % 64) // 4
    return raw[start:start + n]


def memory_bandwidth(megabytes: int = 512, trials: int = 5) -> float:
    """Copy bandwidth in GB/s (bytes read + bytes written) of a numba parallel copy: the faster of
    plain and non-temporal stores, on numba's thread count.

    Write-allocate traffic (reading the destination lines before writing them) is not counted,
    as in STREAM's copy; the figure is comparable to ``ConvProblem.bytes_moved / time``. (An
    element-by-element ``prange`` copy, this function until 2026-11-26, reached 45 GB/s on the Zen 5
    machine where plain vector stores reach 80 and streaming ones 110: floors computed from it
    were twice too lenient there.)
    """
    import numba

    threads = numba.get_num_threads()
    n = megabytes * 2**20 // 4 // 16 * 16
    src, dst = _line_aligned(n), _line_aligned(n)
    best = math.inf
    for streaming in (False, True):
        kernel = _copy_kernel(streaming)
        kernel(src[:1024], dst[:1024], threads)
        best = min(best, min(_timed(kernel, src, dst, threads) for _ in range(trials)))
    return 2.0 * src.nbytes / best / 1e9


def numpy_gemm(n: int = 2048, dtype="float32", trials: int = 3) -> float:
    """GFLOP/s of numpy's ``a @ b`` (the BLAS numpy is linked to) on ``n x n`` matrices."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32).astype(dtype)
    b = rng.standard_normal((n, n), dtype=np.float32).astype(dtype)
    a @ b
    fastest = min(_timed(np.matmul, a, b) for _ in range(trials))
    return 2.0 * n**3 / fastest / 1e9


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def measure_ceilings(threads: int | None = None, progress=print) -> dict:
    """Measure the machine's float32 ceilings once: FMA peak, memory bandwidth, numpy SGEMM.

    Parameters
    ----------
    threads : int, optional
        Threads for the FMA kernel (numba's current count by default; the copy kernel and BLAS
        use theirs).
    progress : callable
        Called with a one-line message before each measurement.

    Returns
    -------
    dict
        ``fma_peak_gflops`` (all threads), ``fma_peak_1thread_gflops``, ``fma_accumulators``,
        ``memory_bandwidth_gbs``, ``numpy_sgemm_gflops`` (2048^3), ``threads``, ``seconds`` (how
        long measuring took) and ``load_average`` (before measuring: a busy machine measures low).

    Notes
    -----
    On a shared machine the ceilings are only as good as the quiet moments they catch: when
    ``fma_peak_gflops`` is well under ``threads * fma_peak_1thread_gflops``, another process was
    competing for a core.
    """
    import numba

    threads = threads or numba.get_num_threads()
    start = time.perf_counter()
    load = _load_average()
    progress("ceilings: fp32 FMA peak ...")
    peak, accumulators = fma_peak(threads)
    single, _ = fma_peak(1)
    progress("ceilings: memory bandwidth ...")
    bandwidth = memory_bandwidth()
    progress("ceilings: numpy SGEMM 2048^3 ...")
    gemm = numpy_gemm()
    return {
        "fma_peak_gflops": round(peak, 1),
        "fma_peak_1thread_gflops": round(single, 1),
        "fma_accumulators": accumulators,
        "memory_bandwidth_gbs": round(bandwidth, 2),
        "numpy_sgemm_gflops": round(gemm, 1),
        "threads": threads,
        "seconds": round(time.perf_counter() - start, 1),
        "load_average": load,
    }
