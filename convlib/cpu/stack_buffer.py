"""Fixed-size stack buffers for numba kernels, so accumulators can live in registers.

LLVM keeps an MR x NR accumulator block in vector registers across a reduction loop only when it
can prove the block aliases nothing else. A heap array (``np.zeros``) never qualifies: every
iteration then loads, FMAs and stores it (~75 GFLOP/s for a 14x32 micro-kernel here, against
~250 with a stack buffer). An ``alloca`` of constant size does qualify, and after SROA/mem2reg the
buffer disappears into registers. numba has no public way to allocate on the stack, hence this
intrinsic around ``numba.core.cgutils.alloca_once``.

Usage inside an ``@njit`` function (the size must be a compile-time constant: a literal, a module
global or a closure variable of a kernel factory)::

    acc = stack_array_2d(MR, NR, np.float32)   # uninitialised (MR, NR) C-ordered array
"""

from __future__ import annotations

from numba import carray, njit, types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def _alloca(typingctx, rows, cols, dtype):
    literal = (types.IntegerLiteral, types.BooleanLiteral)
    if not (isinstance(rows, literal) and isinstance(cols, literal)):
        return None  # a runtime size cannot go in the entry block, and would defeat the point
    elem = dtype.dtype

    def codegen(context, builder, signature, args):
        count = context.get_constant(types.intp, rows.literal_value * cols.literal_value)
        return cgutils.alloca_once(builder, context.get_value_type(elem), size=count)

    return types.CPointer(elem)(rows, cols, dtype), codegen


@njit(inline="always")
def stack_array_1d(n, dtype):
    """An uninitialised 1-D array of ``n`` elements on the stack (``n`` a compile-time constant)."""
    return carray(_alloca(n, 1, dtype), (n,))


@njit(inline="always")
def stack_array_2d(rows, cols, dtype):
    """An uninitialised C-ordered ``(rows, cols)`` array on the stack (constant sizes)."""
    return carray(_alloca(rows, cols, dtype), (rows, cols))
