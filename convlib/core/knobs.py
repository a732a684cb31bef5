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

Where a value comes from
------------------------
A knob's value is looked up in four layers, the first that has it wins:

1. an :meth:`~KnobTable.override` in force in this thread or task;
2. the machine's **profile**: values ``python -m convlib.tune`` measured on this machine
   (:meth:`KnobTable.apply_profile`; the CPU backend loads its profile on first use);
3. the **machine-derived** defaults: values computed from what the machine reports, such as block
   sizes scaled to its cache sizes (the table's ``derive`` hook, called once on first use);
4. the table's built-in ``default``.

For a keyed knob, layers 2 and 3 hold rows (``{key: value}``) merged over the default rows; an
override still replaces every row. :meth:`KnobTable.source` says which layer a value came from.
"""

from __future__ import annotations

import contextlib
import functools
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Iterable

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

    def __init__(self, backend: str, knobs: Iterable[Knob], *, derive: Callable[[], dict] | None = None,
                 load_profile: Callable[[], dict] | None = None):
        self.backend = backend
        self._knobs = {k.name: k for k in knobs}
        self._overrides: ContextVar[dict] = ContextVar(f"convlib_{backend}_knobs", default={})
        self._derive = derive
        self._load_profile = load_profile
        self._layers: dict | None = None  # {"derived": {...}, "profile": {...}} once resolved
        self._base: dict = {}  # name -> value (or rows) after the profile and derived layers
        self._generation = 0  # bumped when the profile changes (part of state())

    # -- layers ------------------------------------------------------------------------------
    def _resolved_base(self) -> dict:
        if self._layers is None:
            derived = self._checked_layer(self._derive() if self._derive else {}, "derived")
            profile = self._checked_layer(self._load_profile() if self._load_profile else {}, "profile")
            self._set_layers(derived, profile)
        return self._base

    def _checked_layer(self, values: dict, what: str) -> dict:
        for name in values:
            knob = self._knob(name)
            if knob.compile_time:
                raise ValueError(f"the {what} values of the {self.backend} backend set the compile-time knob {name!r}")
            if knob.keyed_by and not isinstance(values[name], dict):
                raise TypeError(f"the {what} value of keyed knob {name!r} must be a dict of rows")
        return dict(values)

    def _set_layers(self, derived: dict, profile: dict) -> None:
        base = {}
        for knob in self._knobs.values():
            value = knob.default
            for layer in (derived, profile):
                if knob.name in layer:
                    value = {**value, **layer[knob.name]} if knob.keyed_by else layer[knob.name]
            base[knob.name] = value
        # The base first: a reader in another thread takes ``_layers`` being set as the sign
        # that ``_base`` is complete.
        self._base = base
        self._layers = {"derived": derived, "profile": profile}

    def apply_profile(self, values: dict | None) -> None:
        """Use ``values`` (knob name -> value; rows for a keyed knob) as this process' profile
        layer from now on, in every thread; None or ``{}`` removes it. Caches keyed on
        :meth:`state` see a new state."""
        self._resolved_base()
        self._set_layers(self._layers["derived"], self._checked_layer(values or {}, "profile"))
        self._generation += 1

    def profile(self) -> dict:
        """The profile layer in use (empty when none)."""
        self._resolved_base()
        return dict(self._layers["profile"])

    def source(self, name: str, key=None) -> str:
        """Where the value of ``name`` (for ``key``, when keyed) comes from: ``"override"``,
        ``"profile"``, ``"derived"`` or ``"default"``."""
        knob = self._knob(name)
        if name in self._overrides.get():
            return "override"
        self._resolved_base()
        if knob.keyed_by:
            key = self._row_key(knob, key)
        for layer in ("profile", "derived"):
            values = self._layers[layer]
            if name in values and (not knob.keyed_by or key in values[name]):
                return layer
        return "default"

    # -- reading ---------------------------------------------------------------------------
    def __getattr__(self, name: str):
        knobs = self.__dict__.get("_knobs")
        if knobs is None or name not in knobs:
            raise AttributeError(f"the {self.__dict__.get('backend', '?')} backend has no knob {name!r}")
        knob = knobs[name]
        if knob.keyed_by:
            raise TypeError(f"knob {name!r} is keyed by {knob.keyed_by}: use .lookup({name!r}, key)")
        value = self._overrides.get().get(name, _MISSING)
        if value is not _MISSING:
            return value
        return (self._base if self._layers is not None else self._resolved_base())[name]

    @staticmethod
    def _row_key(knob: Knob, key):
        if len(knob.keyed_by) == 1 and isinstance(key, tuple) and len(key) == 1:
            return key[0]
        return key

    def lookup(self, name: str, key):
        """The value of a keyed knob for ``key``: a tuple with one part per ``keyed_by`` entry
        (``("avx512", "float32")``), or the bare part when there is one (``"float32"``)."""
        knob = self._knob(name)
        value = self._overrides.get().get(name, _MISSING)
        if value is not _MISSING:
            return value
        base = self._base if self._layers is not None else self._resolved_base()
        if not knob.keyed_by:
            return base[name]
        key = self._row_key(knob, key)
        try:
            return base[name][key]
        except KeyError:
            parts = key if isinstance(key, tuple) else (key,)
            raise KeyError(f"knob {name!r} has no row for {dict(zip(knob.keyed_by, parts))}") from None

    def state(self) -> tuple:
        """The overrides in force and the profile's generation, as a hashable value (a cache key
        part); ``()`` when nothing overrides the defaults."""
        overrides = self._overrides.get()
        if not overrides and not self._generation:  # the common case, read on every call
            return ()
        return tuple(sorted(overrides.items())) + ((("<profile>", self._generation),) if self._generation else ())

    def cached(self, fn: Callable) -> Callable:
        """``fn`` memoised on its (hashable) arguments and :meth:`state`: for what a backend
        computes in Python from a problem and the knobs before its kernels (block sizes,
        layouts), which a small layer's call would otherwise redo each time. A change of knobs
        (an override, a new profile) is a new key, so nothing needs invalidating."""
        @functools.lru_cache(maxsize=256)
        def keyed(state, *args):
            return fn(*args)

        @functools.wraps(fn)
        def memoised(*args):
            return keyed(self.state(), *args)

        return memoised

    def knobs(self) -> list[Knob]:
        """Every knob, in table order."""
        return list(self._knobs.values())

    def describe(self) -> str:
        """One line per knob: name, current value (or the keyed rows), where it comes from when
        not the built-in default, and what it does."""
        lines = []
        base = self._resolved_base()
        for knob in self._knobs.values():
            overrides = self._overrides.get()
            value = overrides.get(knob.name, base[knob.name])
            flags = []
            if knob.compile_time:
                flags.append("compile-time")
            if knob.name in overrides:
                flags.append("override")
            else:
                flags += [layer for layer in ("profile", "derived") if knob.name in self._layers[layer]]
            flag = f" ({', '.join(flags)})" if flags else ""
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
