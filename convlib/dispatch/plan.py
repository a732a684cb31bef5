"""A :class:`Plan` is one resolved call: the operation, its problem, the device, the algorithm and
the implementation that computes it. It is the one way a convolution runs.

``convlib.conv2d`` builds a plan and runs it; ``choose_algorithm(measure=True)``, the benchmarks
(``python -m convlib.bench``, its SYCL benchmark and GPU check) build plans and time them. So
what runs when a user calls the library is exactly what is measured, and the steps exist once:

========================  =======================================================================
:func:`make_plan`         resolve the device (``device=`` or the data), then :func:`plan_for`
:func:`plan_for`          pick the algorithm (``"auto"``: :func:`convlib.dispatch.select.choose`;
                          else check that it can serve, or ``NotImplementedError`` naming those
                          that can) and its implementation
:meth:`Plan.prepare`      the arrays on the device, contiguous, in the problem's dtype (copies
                          only where needed; inputs are never modified)
:meth:`Plan.execute`      the implementation on prepared arrays; the result stays on the device.
                          Before any work, a result larger than the device's free memory is a
                          ``MemoryError``; a problem whose workspace would pass
                          ``convlib.options.workspace_cap`` runs in pieces
                          (:mod:`convlib.dispatch.pieces`)
:meth:`Plan.run`          prepare, execute, and hand the result back in the kind of the first
                          array (numpy in, numpy out; dpnp in, dpnp out; a PyTorch tensor in, a
                          PyTorch tensor out; other host array-likes: numpy)
:meth:`Plan.timed_call`   what every timing measures: one execution on prepared arrays, then a
                          synchronisation of the device (copies in and out are not timed)
:data:`PLANS`             the plans of recent calls by call signature (:class:`PlanCache`): a
                          call repeated with the same shapes, dtypes and arguments runs the plan
                          built the first time, without validating and choosing again
========================  =======================================================================
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..core.contracts import RUN_AS_IS
from ..core.options import options
from ..core.problem import ConvProblem
from . import registry
from .devices import ResolvedDevice, dtype_refusal, get_backend, resolve_device, result_kind
from .pieces import conv2d_pieces
from .select import choose, selection_state


#: How an operation is cut into pieces under the workspace cap (:mod:`convlib.dispatch.pieces`).
#: The backward passes are not cut: their implementations bound their own workspace (the blis
#: ones need none that grows with N, H, W; im2col chunks its column matrix under the cap).
SPLITTERS = {"conv2d": conv2d_pieces}

#: Operations whose result sums over the batch: an empty batch gives zeros, not an empty array.
REDUCE_OVER_BATCH = ("conv2d_backward_weight", "conv2d_backward_bias")


@dataclass(frozen=True)
class Plan:
    """One resolved call (see the module docstring).

    Attributes
    ----------
    operation : str
        One of :data:`convlib.core.problem.OPERATIONS` (the problem's own ``operation``).
    problem : ConvProblem
        The validated problem.
    target : ResolvedDevice
        The backend and its device handle.
    algorithm : str
        The algorithm that runs (``"auto"`` resolved).
    implementation : object
        Its implementation (the contract of :mod:`convlib.core.contracts`).
    reason : str
        Why this algorithm: ``"auto"``'s reason, or that it was asked for.
    """

    operation: str
    problem: ConvProblem
    target: ResolvedDevice
    algorithm: str
    implementation: Any
    reason: str
    # (workspace cap, selection state) -> what a CPU execution decides before its kernels (_cpu_steps).
    _steps_seen: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def backend(self):
        """The :class:`~convlib.core.contracts.Backend` the plan runs on."""
        return self.target.backend

    @property
    def handle(self):
        """The backend's device handle (None on the CPU)."""
        return self.target.handle

    def prepare(self, *arrays) -> tuple:
        """The operation's arrays on the device: C-contiguous, of the problem's dtype (None stays None)."""
        backend, dtype, handle = self.target.backend, self.problem.dtype, self.target.handle
        return tuple(None if a is None else backend.prepare(a, dtype, handle) for a in arrays)

    def execute(self, *device_arrays):
        """The result of the operation on prepared arrays, on the device (maybe still computing).

        Raises
        ------
        MemoryError
            Before any work, when the result cannot fit in the device's free memory.
        """
        problem, backend, handle = self.problem, self.target.backend, self.target.handle
        if problem.N == 0:  # no kernel runs: an empty result, or the zero sum over no images
            if self.operation in REDUCE_OVER_BATCH:
                return backend.prepare(np.zeros(problem.output_shape, problem.compute_dtype), problem.dtype, handle)
            return backend.empty(problem.output_shape, problem.dtype, handle)
        if self.target.name == "cpu":
            # What the steps below decide is kept per workspace cap and knob state (see _cpu_steps).
            check_fit, pieces, serial = self._cpu_steps(options.workspace_cap)
            if check_fit:
                check_result_fits(self.operation, problem, self.target)
            if pieces is None and not serial:
                return self.implementation.run(problem, *device_arrays, handle)
        else:
            check_result_fits(self.operation, problem, self.target)
            pieces = self.pieces(options.workspace_cap)
        with backend.execution(problem):
            if pieces is None:
                return self.implementation.run(problem, *device_arrays, handle)
            return self._execute_in_pieces(pieces, *device_arrays)

    def _cpu_steps(self, cap: int) -> tuple:
        """``(check_fit, pieces, serial)`` of a CPU execution under a workspace cap of ``cap``:
        whether the result's size must be checked against free memory (only results of at least
        a sixteenth of the machine's memory are), :meth:`pieces`, and whether the problem runs on
        the calling thread alone (the ``serial_below_flops`` knob). Kept on the plan per cap and
        knob state: in a training step, where the interpreter's caches are cold between calls,
        deciding them again took ~10 us of a small layer's call. The plan's signature holds the
        thread count, so a plan is never asked about another."""
        key = (cap, selection_state())
        steps = self._steps_seen.get(key)
        if steps is None:
            backend = self.target.backend
            check_fit = backend.memory_available(None, self.problem.output_bytes) is not None
            serial = backend.execution(self.problem) is not RUN_AS_IS
            if len(self._steps_seen) >= 8:
                self._steps_seen.clear()
            steps = self._steps_seen[key] = (check_fit, self.pieces(cap), serial)
        return steps

    def pieces(self, cap: int):
        """The pieces :meth:`execute` cuts the problem into under a workspace cap of ``cap`` bytes
        (:mod:`convlib.dispatch.pieces`), or None when it runs whole. (Asking the implementation
        for its workspace takes longer than a small layer's kernel: on the CPU :meth:`execute`
        keeps the answer, see :meth:`_cpu_steps`.)"""
        splitter = SPLITTERS.get(self.operation)
        if splitter is None:
            return None
        return splitter(self.problem, lambda p: self.implementation.workspace_bytes(p, self.target.handle), cap)

    def _execute_in_pieces(self, pieces, x, w, bias):
        backend, handle = self.target.backend, self.target.handle
        y = backend.empty(self.problem.output_shape, self.problem.dtype, handle)
        for piece in pieces:
            part = self._run_piece(piece, x, w, bias)
            backend.write(y, (slice(piece.n0, piece.n1), slice(None), slice(piece.p0, piece.p1)), part, handle)
        return y

    def _run_piece(self, piece, x, w, bias):
        """One piece's result (its input band is freed on return, before the next is copied)."""
        backend, handle, dtype = self.target.backend, self.target.handle, self.problem.dtype
        if not piece.banded:
            part = x[piece.n0:piece.n1]
        elif piece.h1 > piece.h0:
            part = backend.prepare(x[piece.n0:piece.n1, :, piece.h0:piece.h1], dtype, handle)
        else:  # the band reads only padding: a zero image of its height
            part = backend.prepare(np.zeros(piece.problem.x_shape, piece.problem.compute_dtype), dtype, handle)
        return self.implementation.run(piece.problem, part, w, bias, handle)

    def run(self, *arrays, like=None):
        """Prepare, execute, and return the result in the kind of ``like`` (the user's first
        array before it was read as numpy; default ``arrays[0]``)."""
        out = self.execute(*self.prepare(*arrays))
        out = self.target.backend.finish(out, arrays[0], self.target.handle)
        return result_kind(out, arrays[0] if like is None else like)

    def timed_call(self, *device_arrays) -> Callable[[], Any]:
        """A zero-argument callable for :func:`convlib.core.timing.time_interleaved`: one
        :meth:`execute` on ``device_arrays`` (from :meth:`prepare`), then a synchronisation."""
        backend, handle = self.target.backend, self.target.handle

        def call():
            out = self.execute(*device_arrays)
            backend.synchronize(handle)
            return out

        return call

    def workspace_bytes(self) -> int:
        """Temporary memory the implementation allocates beyond its inputs and result."""
        return self.implementation.workspace_bytes(self.problem, self.target.handle)

    def describe(self) -> str:
        """One line: algorithm, device and problem (with its operation unless ``conv2d``)."""
        return f"{self.algorithm} on {self.target.name}: {self.problem.describe()}"


def _human(nbytes: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} bytes"


def check_result_fits(operation: str, problem: ConvProblem, target: ResolvedDevice) -> None:
    """A ``MemoryError`` naming the result's shape and bytes when it cannot fit in the memory the
    device has free (:meth:`~convlib.core.contracts.Backend.memory_available`)."""
    shape, nbytes = problem.output_shape, problem.output_bytes
    available = target.backend.memory_available(target.handle, nbytes)
    if available is not None and nbytes > available:
        raise MemoryError(
            f"the result of {operation}, shape {shape} {problem.dtype}, needs {_human(nbytes)}: more than "
            f"the {_human(available)} of memory free on {target.name}; compute fewer images (or a smaller "
            f"image, or less padding) per call"
        )


def plan_for(operation: str, problem: ConvProblem, target: ResolvedDevice, algo: str = "auto") -> Plan:
    """The :class:`Plan` for ``problem`` on an already resolved device.

    Raises
    ------
    NotImplementedError
        ``algo`` cannot serve ``problem`` on this backend; the message lists the algorithms that
        can.
    TypeError
        The backend does not compute the problem's dtype (float16 and bfloat16 off CUDA); the
        message names the backends that do.
    """
    if operation != problem.operation:
        raise ValueError(f"operation={operation!r} but the problem describes {problem.operation!r}")
    backend = target.name
    if problem.dtype not in target.backend.dtypes:
        raise TypeError(dtype_refusal(problem.dtype, backend, operation))
    # A float16 / bfloat16 problem is chosen for and solved as its float32 twin
    # (convlib.core.precision); the backend wraps the implementation to widen and round back.
    solved = problem.widened()
    if algo == "auto":
        choice = choose(operation, solved, target, dtype=problem.dtype)
        algo, reason = choice.algo, choice.reason
    else:
        why_not = registry.unsupported_reason(operation, backend, algo, solved)
        if why_not is not None:
            able = registry.serving_algorithms(operation, backend, solved)
            raise NotImplementedError(
                f"algo={algo!r} cannot serve this problem on {backend}: {why_not}. "
                f"Algorithms that can: {', '.join(able) or 'none'}"
            )
        reason = "asked for"
    implementation = registry.implementation(operation, backend, algo)
    if solved is not problem:
        implementation = target.backend.widened(implementation)
    return Plan(operation, problem, target, algo, implementation, reason)


def make_plan(operation: str, problem: ConvProblem, device=None, algo: str = "auto", arrays=()) -> Plan:
    """Resolve ``device`` (None: where ``arrays`` live) and build the :class:`Plan`."""
    return plan_for(operation, problem, resolve_device(device, *arrays), algo)


# ------------------------------------------------------------------------------------------
# The plans of recent calls.
# ------------------------------------------------------------------------------------------
#: The argument types a call signature may hold (and tuples or lists of them). Types are part of
#: the signature: ``1``, ``1.0``, ``True`` and ``np.int64(1)`` compare equal, yet ``stride=1.0``
#: and ``stride=True`` are errors that a cached ``stride=1`` must not hide.
_SIGNATURE_SCALARS = (type(None), bool, int, float, str, np.integer, np.bool_)


class _Uncacheable(Exception):
    """An argument a signature cannot hold (an array-like, an object): build the plan afresh."""


def _typed(value):
    kind = type(value)
    if kind is int or kind is str:
        return (kind, value)
    if (kind is tuple or kind is list) and all(type(v) is int for v in value):
        # The common shapes and geometries, in one step: a sequence of ints keys as itself (no
        # other form of key holds bare ints inside a sequence, so no two values share a key).
        return (kind, tuple(value))
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_typed(v) for v in value))
    if isinstance(value, _SIGNATURE_SCALARS):
        return (type(value), value)
    raise _Uncacheable


def call_signature(operation: str, arrays, device, algo, **arguments):
    """The key of one call in :data:`PLANS`, or None when the call is not cached.

    It holds everything the call's plan is built from: the operation, each array's shape and
    dtype, every other argument with its type, ``device``, ``algo``, and what ``auto``'s choice
    reads besides the problem: the CPU's identity (its thread count included), which keys the
    tuning cache, and :func:`convlib.dispatch.select.selection_state` (the knob overrides and
    profile, the tuning cache's generation). Only calls on host
    (numpy) arrays with ``device`` None or a string are cached: a device array's plan holds the
    queue or GPU it lives on, which its signature does not say.

    Parameters
    ----------
    operation : str
    arrays : sequence of numpy arrays or None
        The call's arrays, already read as numpy where they live in host memory.
    device, algo
        As given to the public function (validated when the plan is built).
    **arguments
        The other arguments as given (``stride``, ``padding``, ``x_shape``, ...).
    """
    if not (device is None or isinstance(device, str)):
        return None
    described = []
    for arr in arrays:
        if arr is None:
            described.append(None)
        elif type(arr) is np.ndarray:
            described.append((arr.shape, arr.dtype))
        else:
            return None
    try:
        typed = tuple([(name, _typed(value)) for name, value in arguments.items()])
        return (operation, tuple(described), _typed(device), _typed(algo), typed, *host_state())
    except _Uncacheable:
        return None


def host_state() -> tuple:
    """What a host call's plan depends on besides the call itself, the last parts of every key
    of :data:`PLANS`: the CPU's identity (its thread count included), which keys the tuning
    cache, and :func:`convlib.dispatch.select.selection_state`."""
    return get_backend("cpu").identity(None), selection_state()


class PlanCache:
    """The plans of the last ``maxsize`` distinct call signatures (least recently used dropped).

    A plan is a value built from its signature alone (:func:`call_signature`), so a call whose
    signature was seen runs the plan built then: validation, device resolution and ``auto``'s
    selection are skipped (about 60 us of Python per call, more than the kernel of a small layer).
    Nothing needs invalidating: a change of what a plan depends on (a knob override, a new
    measurement, the thread count) changes the signature. Calls that raise are not cached.
    Safe to use from several threads.

    Parameters
    ----------
    maxsize : int
        Signatures kept.
    """

    def __init__(self, maxsize: int = 256):
        self.maxsize = maxsize
        self._plans: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, build: Callable[[], Plan]) -> Plan:
        """The plan of ``key`` (``build()`` when it is new, or when ``key`` is None: not cached)."""
        if key is None:
            return build()
        # A hit without the lock: each dictionary operation is atomic under the GIL, and one that
        # another thread's eviction overtakes only leaves the order approximate (in a training
        # step, where every call hits, the lock cost 1-4 us a call).
        plan = self._plans.get(key)
        if plan is not None:
            try:
                self._plans.move_to_end(key)
            except KeyError:
                pass
            return plan
        plan = build()
        if plan.target.name != "cpu":  # a device handle is not in the signature
            return plan
        with self._lock:
            self._plans[key] = plan
            if len(self._plans) > self.maxsize:
                self._plans.popitem(last=False)
        return plan

    def clear(self) -> None:
        """Forget every plan."""
        with self._lock:
            self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)


#: The plans of the public functions' recent calls (:func:`convlib.conv2d` and its backward passes).
PLANS = PlanCache()
