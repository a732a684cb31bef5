"""Parallel kernels whose per-thread body numba compiles once.

numba compiles the body of a ``prange`` loop into a gufunc, wraps it twice and links the three
libraries into the kernel, and every library optimises and emits machine code for what it links
in again: the body goes through LLVM four times. On a Zen 3 the blis driver's first call took
72 s, 52 of them in LLVM, three quarters of that on the copies (``docs/benchmarks.md``, session
35). A body called through its address is never linked, so it is compiled once: the blis
driver's first call took 18-21 s instead of 66-71 s on that machine.

Where it is used: the general depthwise kernel and Winograd's GEMMs and transforms, at their
prange bodies' speed (0.95-1.09x, alternated in one process, on a Zen 3 and an AVX-512 Xeon;
``docs/benchmarks.md``, session 36). The blis driver and direct's blocks stay ``prange`` bodies:
compiled this way, LLVM spilled direct's weights-outer accumulators on AVX-512 (2.7-3.1x slower)
and the blis driver ran 1.4-2.8x slower there, for reasons not yet found; the channel-blocked
depthwise kernel ran 1.01-1.09x slower there.

A kernel written this way has three parts, made by its factory:

* ``ARGUMENTS = declare(types.Tuple(...))``: the types of what every thread shares;
* the body, ``body(a, b, ..., thread)``: one thread's (or part's) work, a plain function of those
  arguments and its index, compiled on its own (cached on disk like the kernels) when the kernel
  first runs, as numba compiles a ``prange`` body: numpy's error model, and its array arguments
  marked as aliasing nothing (without that the blis driver ran 1.08-1.13x slower on a Zen 3);
* the launcher, ``@njit(parallel=True)``, whose last argument is the body's address: it computes
  what every thread shares, ``shared = share((a, b, ...), ARGUMENTS)``, runs
  ``call_body(address, shared, t, ARGUMENTS)`` in a ``prange`` and then ``release(shared,
  ARGUMENTS)``.

The factory returns ``CompiledOnce(launcher, body, ARGUMENTS, **options)``, called like the
launcher without the address. The arguments stay in the launcher's stack frame, which outlives
the parallel region; each thread loads them from there and calls the body. Their type is checked
when the launcher compiles.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic, typeof_impl
from numba.np import numpy_support


def _name_only(name: str) -> str:
    return name


class Declared:
    """A numba type held in a kernel's closure, typed by numba as a reference to that type.

    numba's disk-cache key hashes the pickled cells of a kernel's closure, and a numba type's own
    pickle holds a counter of the types its process made before it: a kernel whose closure held
    the tuple type itself missed the cache in every process that had made its types in another
    order (the tuner's own process recompiled what its workers had compiled). Pickled, a
    ``Declared`` is its type's name, the same in every process; it is pickled only for that key.
    """

    __slots__ = ("type",)

    def __init__(self, numba_type: types.BaseTuple):
        self.type = numba_type

    def __reduce__(self):
        return _name_only, (str(self.type),)

    def __repr__(self) -> str:
        return f"Declared({self.type})"


@typeof_impl.register(Declared)
def _typeof_declared(value, context):
    return types.TypeRef(value.type)


def declare(numba_type: types.BaseTuple) -> Declared:
    """``numba_type``, a tuple type, as a body's arguments' type for a kernel's closure (see
    :class:`Declared`)."""
    return Declared(numba_type)


def array_type(dtype, ndim: int) -> types.Array:
    """The numba type of a C-contiguous ``ndim``-dimensional array of ``dtype``, as a declared
    tuple names its arrays."""
    return types.Array(numpy_support.from_dtype(np.dtype(dtype)), ndim, "C")


def _writable(numba_type):
    # A read-only array (a caller's input) has the data model of a writable one: the body
    # compiled for the declared, writable type reads it alike, and never writes an input.
    if isinstance(numba_type, types.Array) and not numba_type.mutable:
        return numba_type.copy(readonly=False)
    return numba_type


def _check(arguments, arguments_type):
    declared = arguments_type.instance_type
    if len(arguments) != len(declared) or any(_writable(a) != d for a, d in zip(arguments, declared)):
        raise TypingError(f"the body's arguments are {arguments}, not the declared {declared}")


@intrinsic
def share(typingctx, arguments, arguments_type):
    """The address of ``arguments``, a tuple that must be of the type ``arguments_type`` (a
    :class:`Declared`), stored in the launcher's stack frame, with a reference to each of its
    arrays: they stay there, read by every thread, until :func:`release`. (A tuple holding a
    named tuple cannot itself go into a ``prange``: numba's gufunc wrapper takes it for an array.)"""
    _check(arguments, arguments_type)

    def codegen(context, builder, signature, args):
        # numba drops its own references after their last use, here: an array the launcher made
        # would be freed before the threads read it.
        context.nrt.incref(builder, arguments, args[0])
        slot = cgutils.alloca_once_value(builder, args[0])
        return builder.ptrtoint(slot, context.get_value_type(types.intp))

    return types.intp(arguments, arguments_type), codegen


@intrinsic
def release(typingctx, shared, arguments_type):
    """Drop the references :func:`share` took on the arguments at ``shared``: after the
    ``prange`` loop of the bodies."""
    tuple_type = arguments_type.instance_type

    def codegen(context, builder, signature, args):
        value = builder.load(builder.inttoptr(args[0], context.get_value_type(tuple_type).as_pointer()))
        context.nrt.decref(builder, tuple_type, value)
        return context.get_dummy_value()

    return types.void(shared, arguments_type), codegen


@intrinsic
def call_body(typingctx, address, shared, index, arguments_type):
    """Call the body at ``address`` (numba's calling convention) with the arguments at
    ``shared`` (from :func:`share`, of the type ``arguments_type``) and ``index``."""
    tuple_type = arguments_type.instance_type
    argument_types = tuple(tuple_type.types) + (types.int64,)

    def codegen(context, builder, signature, args):
        location, where, thread, _ = args
        value = builder.load(builder.inttoptr(where, context.get_value_type(tuple_type).as_pointer()))
        values = [builder.extract_value(value, i) for i in range(len(tuple_type))]
        values.append(context.cast(builder, thread, signature.args[2], types.int64))
        call_conv = context.call_conv
        function_type = call_conv.get_function_type(types.none, argument_types)
        function = builder.inttoptr(location, function_type.as_pointer())
        status_slot = cgutils.alloca_once(builder, function_type.args[0].pointee)
        builder.store(cgutils.get_null_value(function_type.args[0].pointee), status_slot)
        exception_slot = cgutils.alloca_once(builder, function_type.args[1].pointee)
        packed = list(call_conv._get_arg_packer(argument_types).as_arguments(builder, values))
        builder.call(function, [status_slot, exception_slot] + packed)
        return context.get_dummy_value()

    return types.void(address, shared, index, arguments_type), codegen


def _aliasing_nothing(flags):
    # What numba's parfor lowering sets for a prange body whose arrays it finds distinct.
    flags.noalias = True
    return flags


class CompiledOnce:
    """A parallel kernel: ``launcher(*arguments, address)`` with the address of ``body``
    compiled for ``arguments`` (a :class:`Declared` tuple type) and an ``int64`` index, or loaded
    from numba's disk cache, at the first call, not when the factory builds the kernel;
    ``options`` are numba's (``fastmath`` ...).

    ``signatures`` and ``inspect_asm`` are the body's, where the work is
    (``python -m convlib.bench.asm_check`` reads them as a dispatcher's).
    """

    def __init__(self, launcher, body, arguments: Declared, **options):
        self.launcher = launcher
        self.body = njit(cache=True, error_model="numpy", **options)(body)
        self.body._compiler._customize_flags = _aliasing_nothing
        self.signature = tuple(arguments.type.types) + (types.int64,)
        self._address = 0

    def __call__(self, *arguments):
        if not self._address:
            self.body.compile(self.signature)
            compiled = self.body.overloads[self.signature]
            self._address = compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name)
            if not self._address:
                raise RuntimeError(f"numba compiled {self.body} but exported no {compiled.fndesc.llvm_func_name}")
        return self.launcher(*arguments, self._address)

    @property
    def signatures(self) -> list:
        """The body's one signature once compiled, else none."""
        return self.body.signatures

    def inspect_asm(self, signature=None) -> str:
        """The body's assembly."""
        return self.body.inspect_asm(signature or self.signature)
