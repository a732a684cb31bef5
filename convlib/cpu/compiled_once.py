"""Parallel kernels whose per-thread body numba compiles once.

numba compiles the body of a ``prange`` loop into a gufunc, wraps it twice and links the three
libraries into the kernel, and every library optimises and emits machine code for what it links
in again: the body goes through LLVM four times. On a Zen 3 the blis driver's first call took
72 s, 52 of them in LLVM, three quarters of that on the copies (``docs/benchmarks.md``, session
35). A body called through its address is never linked, so it is compiled once: the general
depthwise kernel's first call took 5.8-6.8 s instead of 12.6-16.4 s on the Xeon host, at the same
speed (0.96-1.03x, alternated in one process) and with bit-identical results.

A kernel written this way has three parts, made by its factory:

* ``ARGUMENTS = declare(types.Tuple(...))``: the types of what every thread shares;
* the body, ``body(arguments, thread)``: one thread's work, a plain function whose first line is
  ``(a, b, ...) = unpack(arguments, ARGUMENTS)``, compiled as a C function (cached on disk like
  the kernels) when the kernel first runs;
* the launcher, ``@njit(parallel=True)``, whose last argument is the body's address: it computes
  what every thread shares, packs it into one tuple, ``shared = share(arguments, ARGUMENTS)``,
  and runs ``call_body(address, shared, t)`` in a ``prange`` over the threads.

The factory returns ``CompiledOnce(launcher, body, **options)``, called like the launcher without
the address. The tuple travels by address: it stays in the launcher's stack frame, which outlives
the parallel region, and each thread's body reads it from there. Its type is checked when the
launcher compiles.
"""

from __future__ import annotations

from llvmlite import ir
from numba import cfunc, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic, typeof_impl


def _name_only(name: str) -> str:
    return name


class Declared:
    """A numba type held in a kernel's closure, typed by numba as a reference to that type.

    numba's disk-cache key hashes the pickled cells of a kernel's closure, and a numba type's own
    pickle holds a counter of the types its process made before it: a body whose closure held the
    tuple type itself missed the cache in every process that had made its types in another order
    (the tuner's own process recompiled what its workers had compiled, 45-53 s instead of 13).
    Pickled, a ``Declared`` is its type's name, the same in every process; it is pickled only for
    that key.
    """

    __slots__ = ("type",)

    def __init__(self, numba_type: types.Type):
        self.type = numba_type

    def __reduce__(self):
        return _name_only, (str(self.type),)

    def __repr__(self) -> str:
        return f"Declared({self.type})"


@typeof_impl.register(Declared)
def _typeof_declared(value, context):
    return types.TypeRef(value.type)


def declare(numba_type: types.Type) -> Declared:
    """``numba_type`` as a body's arguments' type, for a kernel's closure (see :class:`Declared`)."""
    return Declared(numba_type)


@intrinsic
def unpack(typingctx, address, arguments_type):
    """The tuple of type ``arguments_type`` (a :class:`Declared`) stored at ``address`` (a
    ``voidptr``): inside a body, its arguments."""
    tuple_type = arguments_type.instance_type

    def codegen(context, builder, signature, args):
        value = builder.load(builder.bitcast(args[0], context.get_value_type(tuple_type).as_pointer()))
        context.nrt.incref(builder, tuple_type, value)  # the caller's decref at the end balances it
        return value

    return tuple_type(address, arguments_type), codegen


@intrinsic
def share(typingctx, arguments, arguments_type):
    """The address of ``arguments``, a tuple that must be of the type ``arguments_type`` (a
    :class:`Declared`), stored in the launcher's stack frame: it stays there, read by every
    thread, until the launcher returns. (A tuple holding a named tuple cannot itself go into a
    ``prange``: numba's gufunc wrapper takes it for an array.)"""
    if arguments != arguments_type.instance_type:
        raise TypingError(f"the body's arguments are {arguments}, not the declared {arguments_type.instance_type}")

    def codegen(context, builder, signature, args):
        slot = cgutils.alloca_once_value(builder, args[0])
        return builder.ptrtoint(slot, context.get_value_type(types.intp))

    return types.intp(arguments, arguments_type), codegen


@intrinsic
def call_body(typingctx, address, shared, thread):
    """Call the body at ``address`` for ``thread`` with the arguments at ``shared`` (from
    :func:`share`)."""

    def codegen(context, builder, signature, args):
        location, where, index = args
        function_type = ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t, index.type])
        function = builder.inttoptr(location, function_type.as_pointer())
        builder.call(function, [builder.inttoptr(where, cgutils.voidptr_t), index])
        return context.get_dummy_value()

    return types.void(address, shared, thread), codegen


#: The C signature of every body: the address of its arguments' tuple, the thread's index.
BODY_SIGNATURE = types.void(types.voidptr, types.int64)


class CompiledOnce:
    """A parallel kernel: ``launcher(*arguments, address)`` with the address of ``body`` compiled
    as a C function of :data:`BODY_SIGNATURE` (or loaded from numba's disk cache) at the first
    call, not when the factory builds the kernel; ``options`` are numba's (``fastmath`` ...).

    ``signatures`` and ``inspect_asm`` are the body's, where the work is
    (``python -m convlib.bench.asm_check`` reads them as a dispatcher's).
    """

    def __init__(self, launcher, body, **options):
        self.launcher = launcher
        self.body = body
        # numba compiles a prange body with numpy's error model (no ZeroDivisionError branch on
        # each integer division) and so does this.
        self.options = {"error_model": "numpy", **options}
        self._compiled = None
        self._address = 0

    def __call__(self, *arguments):
        if not self._address:
            self._compiled = cfunc(BODY_SIGNATURE, cache=True, **self.options)(self.body)
            self._address = self._compiled.address
        return self.launcher(*arguments, self._address)

    @property
    def signatures(self) -> list:
        """The body's one signature once compiled, else none."""
        return [BODY_SIGNATURE.args] if self._compiled is not None else []

    def inspect_asm(self, signature=None) -> str:
        """The body's assembly (compiled in this process, not loaded from the disk cache)."""
        return self._compiled._library.get_asm_str()
