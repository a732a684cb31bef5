"""Measured algorithm choices, remembered per device: the tuning cache.

``choose_algorithm(..., measure=True)`` times every algorithm that can serve a problem
(:mod:`convlib.dispatch.measure`) and stores the winner here, in a small JSON file, so that later
``algo="auto"`` calls -- in this process and the next ones -- ask the file instead of the clock.

Keys: the device's stable identity (:meth:`convlib.core.contracts.Backend.identity`: CPU model,
instruction set and thread count; SYCL backend, device name and driver; GPU index, name and
compute capability), the operation and the problem. A choice measured on one device is never
applied to another, and a device is found again in a new process whatever object named it
(a ``dpctl.SyclQueue``, a filter string, ``device=None`` following the data).

The file is ``$CONVLIB_CACHE_DIR/tuning.json`` (default ``$XDG_CACHE_HOME/convlib`` or
``~/.cache/convlib``). It is versioned: entries of another format version or another convlib
version are ignored. A corrupt or unreadable file is ignored too (with a warning), never trusted,
and replaced on the next write; writes are atomic (a temporary file renamed over the old one).
"""

from __future__ import annotations

import functools
import json
import warnings
from dataclasses import asdict
from pathlib import Path

from ..core.cache_files import cache_root, write_json_atomically
from ..core.version import __version__

#: Version 2: keys hold the device identity and the operation (version 1 keyed a device by
#: ``str(device)``, which for a SYCL queue held a memory address).
FORMAT_VERSION = 2


def cache_path() -> Path:
    """Where measured choices are kept."""
    return cache_root() / "tuning.json"


@functools.lru_cache(maxsize=1024)
def problem_key(operation: str, problem, identity: str) -> str:
    """A stable text key for (device identity, operation, problem). Memoised: every
    ``algo="auto"`` call asks for it, and building it (``asdict`` and ``json.dumps``) took half of
    auto's 60 us per call."""
    fields = asdict(problem)
    fields.pop("_checked", None)
    fields.pop("operation", None)  # already in the key, ahead of the fields
    return f"{identity}|{operation}|{json.dumps(fields, sort_keys=True)}"


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
        or data.get("convlib") != __version__
        or not isinstance(data.get("entries"), dict)
    ):
        return {}
    return {k: v for k, v in data["entries"].items() if isinstance(v, dict) and isinstance(v.get("algo"), str)}


_REMEMBERED: dict | None = None
#: Bumped whenever this process' copy of the cache changes or is dropped (:func:`generation`).
_GENERATION = 0


def generation() -> int:
    """A number that changes whenever the remembered choices may have changed (a store, a
    forget): caches of ``auto``'s choices key on it."""
    return _GENERATION


def remembered() -> dict:
    """This process's copy of the cache (read from the file once; :func:`store` keeps it current)."""
    global _REMEMBERED
    if _REMEMBERED is None:
        _REMEMBERED = load()
    return _REMEMBERED


def forget_measurements() -> None:
    """Drop this process' copy of the tuning cache (it is read again on next use)."""
    global _REMEMBERED, _GENERATION
    _REMEMBERED = None
    _GENERATION += 1


def lookup(operation: str, problem, identity: str) -> dict | None:
    """The remembered entry for ``problem`` on the device ``identity``, or None."""
    return remembered().get(problem_key(operation, problem, identity))


def store(key: str, algo: str, timings: dict[str, float]) -> None:
    """Remember one measured choice, in this process and in the cache file (written atomically;
    a failure to write only warns)."""
    global _GENERATION
    entry = {"algo": algo, "timings": dict(timings)}
    remembered()[key] = entry
    _GENERATION += 1
    path = cache_path()
    entries = load()
    entries[key] = entry
    payload = {"format": FORMAT_VERSION, "convlib": __version__, "entries": entries}
    try:
        write_json_atomically(path, payload)
    except OSError as exc:
        warnings.warn(f"convlib: could not write tuning cache {path}: {exc}", RuntimeWarning, stacklevel=2)
