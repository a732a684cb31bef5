"""Measured algorithm choice: time the candidates once per problem, remember the winner.

``choose_algorithm(..., measure=True)`` runs every algorithm that can serve a problem on random
data of its shape (interleaved repeats after a warm-up call, median), picks the fastest and stores
the result in a small JSON file, so the next process asks the file instead of the clock.

The file is ``$CONVLIB_CACHE_DIR/tuning.json`` (default ``$XDG_CACHE_HOME/convlib`` or
``~/.cache/convlib``). It is versioned: entries of another format version or another convlib
version are ignored. A corrupt or unreadable file is ignored too (with a warning), never trusted,
and replaced on the next write; writes are atomic (a temporary file renamed over the old one).
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import tempfile
import time
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .problem import ConvProblem

FORMAT_VERSION = 1


def cache_path() -> Path:
    """Where measured choices are kept."""
    root = os.environ.get("CONVLIB_CACHE_DIR")
    if root is None:
        root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "convlib"
    return Path(root) / "tuning.json"


@functools.lru_cache(maxsize=1024)
def problem_key(problem: ConvProblem, device: str) -> str:
    """A stable text key for (problem, device). Memoised: every ``algo="auto"`` call asks for it,
    and building it (``asdict`` and ``json.dumps``) took half of auto's 60 us per call."""
    fields = asdict(problem)
    fields.pop("_checked", None)
    return device + "|" + json.dumps(fields, sort_keys=True)


def _library_version() -> str:
    from . import __version__

    return __version__


def load() -> dict:
    """The cached entries ``{key: {"algo": ..., "timings": {...}}}``; empty when absent or not trusted."""
    path = cache_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        warnings.warn(f"convlib: ignoring unreadable tuning cache {path}: {exc}", RuntimeWarning, stacklevel=2)
        return {}
    if (
        not isinstance(data, dict)
        or data.get("format") != FORMAT_VERSION
        or data.get("convlib") != _library_version()
        or not isinstance(data.get("entries"), dict)
    ):
        return {}
    return {k: v for k, v in data["entries"].items() if isinstance(v, dict) and isinstance(v.get("algo"), str)}


def store(key: str, algo: str, timings: dict[str, float]) -> None:
    """Add one measured choice to the cache file (atomically; failures only warn)."""
    path = cache_path()
    entries = load()
    entries[key] = {"algo": algo, "timings": timings}
    payload = {"format": FORMAT_VERSION, "convlib": _library_version(), "entries": entries}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tuning-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as exc:
        warnings.warn(f"convlib: could not write tuning cache {path}: {exc}", RuntimeWarning, stacklevel=2)


def time_algorithms(problem: ConvProblem, algos, device="cpu", repeats: int = 5) -> dict[str, float]:
    """Median seconds per call of each algorithm on random data of ``problem``'s shape.

    Every algorithm is called once first (compilation, caches), then the calls are interleaved
    (round-robin) ``repeats`` times so that a noisy machine disturbs all of them alike.
    """
    from .api import conv2d

    rng = np.random.default_rng(0)
    x = rng.standard_normal(problem.x_shape).astype(problem.dtype)
    w = rng.standard_normal(problem.w_shape).astype(problem.dtype)
    b = rng.standard_normal(problem.K).astype(problem.dtype) if problem.has_bias else None
    kwargs = dict(stride=problem.stride, padding=problem.padding, dilation=problem.dilation,
                  groups=problem.groups, device=device)
    samples: dict[str, list[float]] = {a: [] for a in algos}
    for algo in algos:
        conv2d(x, w, b, algo=algo, **kwargs)
    for _ in range(repeats):
        for algo in algos:
            t0 = time.perf_counter()
            conv2d(x, w, b, algo=algo, **kwargs)
            samples[algo].append(time.perf_counter() - t0)
    return {a: statistics.median(t) for a, t in samples.items()}
