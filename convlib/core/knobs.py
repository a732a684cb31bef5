"""Tuning knobs as data: one table per backend, one way to change them for a while.

Every block size, work-group size, chunk size and engine switch of a backend is a :class:`Knob`
of that backend's :class:`KnobTable` (``convlib/<backend>/tables.py``): a name, a default and a
sentence saying what it does and how the default was measured. Kernels read knobs through the
table, never through module globals, so that one mechanism changes them everywhere::

    from convlib.cpu.tables import KNOBS
    with KNOBS.override(direct_serial_below_flops=0, winograd_chunk_bytes=2**20):
        convlib.conv2d(x, w, algo="winograd")      # these values here, the defaults again after

Overrides live in a :class:`contextvars.ContextVar`, so they apply to the ``with`` block of the
thread (or task) that set them and to nothing else: two threads tuning different knobs never see
each other's values.

Some knobs depend on the instruction set or the dtype. Their default is a dict keyed by that
(``keyed_by`` names the key's parts: a tuple of them, or the bare value when there is one) and
:meth:`KnobTable.lookup` picks the row; an override is a single value that replaces every row.

A cache of something computed from knobs (a compiled kernel, a launch plan) keys on the values it
read, or on :meth:`KnobTable.state` (the overrides in force, hashable): an override can then never
meet a stale entry, and no cache needs clearing. Knobs baked into numba's on-disk kernel cache are
marked ``compile_time``: they are documented here with the rest, but overriding them raises (edit
the table and clear ``__pycache__`` instead).
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterable

_MISSING = object()


@dataclass(frozen=True)
class Knob:
    """One tuning value of a backend.

    Attributes
    ----------
    name : str
        How code and overrides refer to it.
    default : object
        The value used unless overridden; a dict when ``keyed_by`` is set.
    doc : str
        What it controls and where the default comes from.
    keyed_by : tuple of str
        For a per-ISA or per-dtype knob, the parts of the default's keys (e.g. ``("isa",
        "dtype")``); empty for a single value.
    allowed : tuple, optional
        The values an override may take (checked); None accepts any hashable value.
    compile_time : bool
        Baked into compiled (disk-cached) kernels: listed for the reader, not overridable.
    """

    name: str
    default: Any
    doc: str
    keyed_by: tuple[str, ...] = ()
    allowed: tuple | None = None
    compile_time: bool = False


class KnobTable:
    """The knobs of one backend, their current values, and :meth:`override`.

    Parameters
    ----------
    backend : str
        ``"cpu"``, ``"sycl"`` or ``"cuda"`` (for messages).
    knobs : iterable of Knob
    """

    def __init__(self, backend: str, knobs: Iterable[Knob]):
        self.backend = backend
        self._knobs = {k.name: k for k in knobs}
        self._overrides: ContextVar[dict] = ContextVar(f"convlib_{backend}_knobs", default={})

    # -- reading ---------------------------------------------------------------------------
    def __getattr__(self, name: str):
        knobs = self.__dict__.get("_knobs")
        if knobs is None or name not in knobs:
            raise AttributeError(f"the {self.__dict__.get('backend', '?')} backend has no knob {name!r}")
        knob = knobs[name]
        if knob.keyed_by:
            raise TypeError(f"knob {name!r} is keyed by {knob.keyed_by}: use .lookup({name!r}, key)")
        value = self._overrides.get().get(name, _MISSING)
        return knob.default if value is _MISSING else value

    def lookup(self, name: str, key):
        """The value of a keyed knob for ``key``: a tuple with one part per ``keyed_by`` entry
        (``("avx512", "float32")``), or the bare part when there is one (``"float32"``)."""
        knob = self._knob(name)
        value = self._overrides.get().get(name, _MISSING)
        if value is not _MISSING:
            return value
        if not knob.keyed_by:
            return knob.default
        if len(knob.keyed_by) == 1 and isinstance(key, tuple) and len(key) == 1:
            key = key[0]
        try:
            return knob.default[key]
        except KeyError:
            parts = key if isinstance(key, tuple) else (key,)
            raise KeyError(f"knob {name!r} has no row for {dict(zip(knob.keyed_by, parts))}") from None

    def state(self) -> tuple:
        """The overrides in force, as a hashable value (a cache key part)."""
        return tuple(sorted(self._overrides.get().items()))

    def knobs(self) -> list[Knob]:
        """Every knob, in table order."""
        return list(self._knobs.values())

    def describe(self) -> str:
        """One line per knob: name, current value (or the keyed rows) and what it does."""
        lines = []
        for knob in self._knobs.values():
            value = self._overrides.get().get(knob.name, knob.default)
            flag = " (compile-time)" if knob.compile_time else ""
            lines.append(f"{knob.name} = {value!r}{flag}: {knob.doc}")
        return "\n".join(lines)

    # -- changing --------------------------------------------------------------------------
    @contextlib.contextmanager
    def override(self, **values):
        """Within the ``with`` block (this thread or task only), use these knob values.

        A keyed knob gets one value for every key. Raises ``ValueError`` for an unknown knob, a
        compile-time knob or a value outside the knob's ``allowed`` ones, and ``TypeError`` for an
        unhashable value (caches key on the overrides).
        """
        for name, value in values.items():
            knob = self._knob(name)
            if knob.compile_time:
                raise ValueError(
                    f"knob {name!r} of the {self.backend} backend is compiled into its kernels and cannot be "
                    "overridden at run time; change its default in the table (and clear __pycache__)"
                )
            if knob.allowed is not None and value not in knob.allowed:
                raise ValueError(f"{name}={value!r}: allowed are {', '.join(map(repr, knob.allowed))}")
            try:
                hash(value)
            except TypeError:
                raise TypeError(f"{name}={value!r}: knob values must be hashable (caches key on them)") from None
        token = self._overrides.set({**self._overrides.get(), **values})
        try:
            yield self
        finally:
            self._overrides.reset(token)

    def _knob(self, name: str) -> Knob:
        try:
            return self._knobs[name]
        except KeyError:
            known = ", ".join(sorted(self._knobs))
            raise ValueError(f"unknown knob {name!r} of the {self.backend} backend; known knobs: {known}") from None


__all__ = ["Knob", "KnobTable"]
