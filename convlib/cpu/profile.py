"""The machine's tuned profile: knob values ``python -m convlib.tune`` measured on this machine.

A profile is one JSON file per machine, ``$CONVLIB_CACHE_DIR/profiles/cpu-<digest>.json``
(default ``~/.cache/convlib``), where ``<digest>`` is a hash of :func:`machine_identity`: the CPU
model, the instruction set and loop-vector width numba compiles for, the cache sizes, numba's
thread count, the convlib version and a digest of the CPU kernels' and selection rules' source
(:func:`kernels_digest`). A profile measured with 2 threads is not used with 16, nor after an
upgrade of convlib or an edit of its kernels, rules or built-in knob values (a value tuned against
other kernels, or chosen against another default, is stale), nor on a copy of the home directory
mounted on another machine.

The CPU knob table (:data:`convlib.cpu.tables.KNOBS`) loads it on first use, between the
built-in and machine-derived defaults and the ``override`` in force (see
:mod:`convlib.core.knobs`). A profile that cannot be read, has another format, or was measured
on another machine is ignored with a :class:`RuntimeWarning` that says why, never trusted.

``CONVLIB_PROFILE=<file>`` uses that file instead (still checked against this machine);
``CONVLIB_PROFILE=off`` uses none.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
import warnings
from pathlib import Path

from ..core.cache_files import cache_root, write_json_atomically
from ..core.knobs import Knob
from ..core.version import __version__
from .isa import cache_sizes, cpu_model, host_isa, loop_vector_bytes

#: Bumped when the file's layout changes; files of another format are ignored.
FORMAT_VERSION = 1

_KIND = "convlib-cpu-profile"
_OFF = {"off", "0", "none", "no", "false"}


def thread_count() -> int:
    """The thread count a profile is measured for: numba's (``NUMBA_NUM_THREADS``)."""
    from numba import config

    return int(config.NUMBA_NUM_THREADS)


#: The packages whose source a profile's values depend on: the CPU kernels with their knob table,
#: and the selection rules ``auto`` applies with the ``auto_*`` knobs.
_TUNED_PACKAGES = ("cpu", "dispatch")


@functools.lru_cache(maxsize=None)
def kernels_digest() -> str:
    """A hash of the source of :data:`_TUNED_PACKAGES` (every ``.py`` file, in name order)."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for package in _TUNED_PACKAGES:
        for path in sorted((root / package).glob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def machine_identity() -> dict:
    """What a profile must match to be used: CPU, instruction set, caches, threads, convlib and
    its kernels' source."""
    caches = cache_sizes()
    return {
        "cpu": cpu_model(),
        "isa": host_isa(),
        "loop_vector_bytes": loop_vector_bytes(),
        "caches": {k: caches[k] for k in ("L1d", "L2", "L3")},
        "threads": thread_count(),
        "convlib": __version__,
        "kernels": kernels_digest(),
    }


def profile_dir() -> Path:
    """The folder of the profiles (beside the tuning cache of :mod:`convlib.dispatch.tuning`)."""
    return cache_root() / "profiles"


def profile_path(identity: dict | None = None) -> Path | None:
    """The profile file for this machine (``CONVLIB_PROFILE`` when set), or None when profiles
    are switched off."""
    chosen = os.environ.get("CONVLIB_PROFILE")
    if chosen is not None:
        return None if chosen.strip().lower() in _OFF else Path(chosen)
    identity = machine_identity() if identity is None else identity
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return profile_dir() / f"cpu-{digest}.json"


# -- values <-> JSON -------------------------------------------------------------------------
def _encode(value):
    if dataclasses.is_dataclass(value):
        return {"type": type(value).__name__, **dataclasses.asdict(value)}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    raise TypeError(f"a profile cannot hold {value!r}")


def _decode(data, types: dict):
    if isinstance(data, dict):
        if "tuple" in data:
            return tuple(_decode(v, types) for v in data["tuple"])
        fields = dict(data)
        cls = types.get(fields.pop("type", None))
        if cls is None:
            raise ValueError(f"unknown value {data!r}")
        return cls(**fields)  # the dataclass checks its own invariants
    if isinstance(data, (int, float, str, bool)) or data is None:
        return data
    raise ValueError(f"unexpected value {data!r}")


def encode_knobs(values: dict) -> dict:
    """``values`` (knob name -> value, or rows keyed by tuples) as JSON-ready data."""
    out = {}
    for name, value in values.items():
        if isinstance(value, dict):
            out[name] = {"rows": [[list(k) if isinstance(k, tuple) else [k], _encode(v)] for k, v in value.items()]}
        else:
            out[name] = {"value": _encode(value)}
    return out


def decode_knobs(data: dict, knobs: list[Knob], types: dict) -> dict:
    """The inverse of :func:`encode_knobs` for the table ``knobs`` whose values may be of the
    dataclasses ``types`` (name -> class); raises ``ValueError``/``TypeError`` on anything else."""
    if not isinstance(data, dict):
        raise ValueError("'knobs' is not an object")
    out = {}
    known = {k.name: k for k in knobs}
    for name, entry in data.items():
        knob = known.get(name)
        if knob is None:
            raise ValueError(f"unknown knob {name!r}")
        if knob.keyed_by:
            rows = {}
            for key, value in entry["rows"]:
                key = tuple(key) if len(knob.keyed_by) > 1 else key[0]
                rows[key] = _decode(value, types)
            out[name] = rows
        else:
            value = _decode(entry["value"], types)
            if type(value) is not type(knob.default) and not (isinstance(knob.default, (int, float))
                                                               and isinstance(value, (int, float))):
                raise ValueError(f"knob {name!r}: {value!r} is not of type {type(knob.default).__name__}")
            out[name] = value
    return out


# -- reading and writing ------------------------------------------------------------------
def read_profile(path: Path) -> dict:
    """The whole profile at ``path`` (raises ``OSError`` or ``ValueError`` when it is not one)."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or data.get("kind") != _KIND:
        raise ValueError("not a convlib CPU profile")
    if data.get("format") != FORMAT_VERSION:
        raise ValueError(f"format {data.get('format')!r}, this convlib reads format {FORMAT_VERSION}")
    return data


def load_profile_knobs(knobs: list[Knob], types: dict) -> dict:
    """The knob values of this machine's profile for the table ``knobs`` (see
    :func:`decode_knobs`); ``{}`` when there is none or it is not to be trusted (with a warning
    saying why)."""
    try:
        identity = machine_identity()
        path = profile_path(identity)
    except Exception as exc:  # noqa: BLE001 -- a profile is an optimisation, never a failure
        warnings.warn(f"convlib: no tuned profile used ({exc})", RuntimeWarning, stacklevel=3)
        return {}
    if path is None or not path.exists():
        return {}
    try:
        data = read_profile(path)
        if data.get("machine") != identity:
            theirs = data.get("machine") or {}
            diff = sorted(k for k in set(identity) | set(theirs) if identity.get(k) != theirs.get(k))
            raise ValueError(f"it was measured on another machine or setup (differs in {', '.join(diff)}); "
                             "run `python -m convlib.tune` here")
        return decode_knobs(data.get("knobs"), knobs, types)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        warnings.warn(f"convlib: ignoring the tuned profile {path}: {exc}", RuntimeWarning, stacklevel=3)
        return {}


def save_profile(values: dict, measurements: dict, *, table: tuple[list[Knob], dict], mode: str, seconds: float,
                 path: Path | None = None) -> Path:
    """Write a profile of ``knobs`` for this machine (atomically) and return its path.

    Parameters
    ----------
    values : dict
        Knob name -> value (rows keyed by tuples for a keyed knob).
    measurements : dict
        What was measured to choose them (JSON-ready), kept for the reader.
    mode : str
        ``"quick"`` or ``"full"``.
    seconds : float
        How long tuning took.
    table : (list of Knob, dict)
        The knob table and value types the values must read back as (:func:`decode_knobs`).
    path : Path, optional
        Where to write; default :func:`profile_path` (``CONVLIB_PROFILE`` when set).
    """
    identity = machine_identity()
    path = profile_path(identity) if path is None else Path(path)
    if path is None:
        raise ValueError("CONVLIB_PROFILE=off: set it to a file, or unset it, to save a profile")
    payload = {
        "kind": _KIND, "format": FORMAT_VERSION, "machine": identity, "mode": mode,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": round(seconds, 1),
        "knobs": encode_knobs(values), "measurements": measurements,
    }
    decode_knobs(payload["knobs"], *table)  # what is written must read back
    write_json_atomically(path, payload)
    return path
