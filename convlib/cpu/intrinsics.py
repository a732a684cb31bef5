"""Vector intrinsics for the CPU kernels: whole-vector loads, stores and FMAs at an element
index of a 1-D array, written as LLVM IR through ``numba.extending.intrinsic``.

Why not numpy slices: the micro-kernels need a fixed register tile (LLVM's loop vectoriser picks
its own vector width, 256 bits on Intel AVX-512 parts, which doubled a 6x64 tile's accumulators
and spilled them), and the packing routines move short runs that a plain loop spends in LLVM's
scalar remainder. None of these intrinsics checks bounds: callers keep their indices inside the
arrays (or inside the slack they allocated for it).

Four families:

* ``lanes``-wide vectors (a literal argument) for the micro-kernels: :func:`vector_zero`,
  :func:`vector_fma`, :func:`vector_fma_lanes`, :func:`vector_sum`, :func:`vector_add_into`,
  :func:`vector_store_plus`, :func:`vector_stream_plus` (with :func:`store_fence`),
  :func:`vector_store_split`, :func:`vector_copy`,
  :func:`transpose_block` and :func:`prefetch_for_write`;
* 32-byte vectors for the packing routines: :func:`copy_vector`, :func:`copy_vector_stride2`,
  :func:`deinterleave_vector`, :func:`zero_vector`, :func:`copy_row` and :func:`vector_lanes` (elements per 32 bytes, a compile-time constant);
* whole registers of the widest kind for Winograd's input transform: :func:`deinterleave_run` and
  :func:`register_lanes` (elements per register, a compile-time constant);
* masked 64-byte gathers for packing B from the image with AVX-512: :func:`gather_vector`.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .isa import simd_bytes
from .tables import VECTOR_SLACK_BYTES


def _vector_at(context, builder, array_type, array, index, lanes):
    """``(pointer, vector type, element alignment)`` for ``lanes`` elements at ``array[index]``."""
    elem = context.get_value_type(array_type.dtype)
    vec = ir.VectorType(elem, lanes)
    data = context.make_array(array_type)(context, builder, array).data
    pointer = builder.bitcast(builder.gep(data, [index]), vec.as_pointer())
    return pointer, vec, context.get_abi_sizeof(elem)


def _splat(builder, vec, value):
    lanes = vec.count
    one = builder.insert_element(ir.Constant(vec, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    zeros = ir.Constant(ir.VectorType(ir.IntType(32), lanes), None)
    return builder.shuffle_vector(one, ir.Constant(vec, ir.Undefined), zeros)


def _fma(builder, vec, a, b, c):
    """``a * b + c`` on vectors of type ``vec`` (float or double lanes), one fused multiply-add
    (``llvm.fma``)."""
    bits = 64 if isinstance(vec.element, ir.DoubleType) else 32
    fma = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.v{vec.count}f{bits}")
    return builder.call(fma, [a, b, c])


def _literal_lanes(lanes):
    return lanes.literal_value if isinstance(lanes, types.IntegerLiteral) else None


@intrinsic
def vector_zero(typingctx, dst, index, lanes):
    """``dst[index : index + lanes] = 0``."""
    L = _literal_lanes(lanes)
    if L is None:
        return None

    def codegen(context, builder, signature, args):
        pointer, vec, align = _vector_at(context, builder, signature.args[0], args[0], args[1], L)
        builder.store(ir.Constant(vec, None), pointer, align=align)
        return context.get_dummy_value()

    return types.void(dst, index, lanes), codegen


@intrinsic
def vector_fma(typingctx, acc, acc_index, a, a_index, b, b_index, lanes):
    """``acc[acc_index : +lanes] += a[a_index] * b[b_index : +lanes]`` (one fused multiply-add)."""
    L = _literal_lanes(lanes)
    if L is None:
        return None

    def codegen(context, builder, signature, args):
        acc_ptr, vec, align = _vector_at(context, builder, signature.args[0], args[0], args[1], L)
        b_ptr, _, _ = _vector_at(context, builder, signature.args[4], args[4], args[5], L)
        a_data = context.make_array(signature.args[2])(context, builder, args[2]).data
        a_value = builder.load(builder.gep(a_data, [args[3]]), align=align)
        total = _fma(builder, vec, builder.load(b_ptr, align=align), _splat(builder, vec, a_value),
                     builder.load(acc_ptr, align=align))
        builder.store(total, acc_ptr, align=align)
        return context.get_dummy_value()

    return types.void(acc, acc_index, a, a_index, b, b_index, lanes), codegen


@intrinsic
def vector_fma_lanes(typingctx, acc, acc_index, a, a_index, b, b_index, lanes):
    """``acc[acc_index : +lanes] += a[a_index : +lanes] * b[b_index : +lanes]`` (lane by lane,
    one fused multiply-add): the step of an inner-product micro-kernel."""
    L = _literal_lanes(lanes)
    if L is None:
        return None

    def codegen(context, builder, signature, args):
        acc_ptr, vec, align = _vector_at(context, builder, signature.args[0], args[0], args[1], L)
        a_ptr, _, _ = _vector_at(context, builder, signature.args[2], args[2], args[3], L)
        b_ptr, _, _ = _vector_at(context, builder, signature.args[4], args[4], args[5], L)
        total = _fma(builder, vec, builder.load(a_ptr, align=align), builder.load(b_ptr, align=align),
                     builder.load(acc_ptr, align=align))
        builder.store(total, acc_ptr, align=align)
        return context.get_dummy_value()

    return types.void(acc, acc_index, a, a_index, b, b_index, lanes), codegen


@intrinsic
def vector_copy(typingctx, dst, dst_index, src, src_index, lanes):
    """``dst[dst_index : +lanes] = src[src_index : +lanes]``: one vector load and store."""
    L = _literal_lanes(lanes)
    if L is None:
        return None

    def codegen(context, builder, signature, args):
        d, vec, align = _vector_at(context, builder, signature.args[0], args[0], args[1], L)
        s_, _, _ = _vector_at(context, builder, signature.args[2], args[2], args[3], L)
        builder.store(builder.load(s_, align=align), d, align=align)
        return context.get_dummy_value()

    return types.void(dst, dst_index, src, src_index, lanes), codegen


def _transpose_vectors(builder, rows):
    """The transpose of the square matrix whose rows are the vectors ``rows`` (a power of two of
    them, each as long as their count): one stage per bit of the index, each stage swapping that
    bit between row and column by one two-source shuffle per row (``log2(L) * L`` shuffles)."""
    lanes = len(rows)
    rows = list(rows)
    bit = 1
    while bit < lanes:
        for i in range(lanes):
            if i & bit:
                continue
            j = i | bit
            low = [c if not c & bit else lanes + c - bit for c in range(lanes)]
            high = [c + bit if not c & bit else lanes + c for c in range(lanes)]
            picks = ir.VectorType(ir.IntType(32), lanes)
            rows[i], rows[j] = (builder.shuffle_vector(rows[i], rows[j], ir.Constant(picks, low)),
                                builder.shuffle_vector(rows[i], rows[j], ir.Constant(picks, high)))
        bit *= 2
    return rows


@intrinsic
def transpose_block(typingctx, dst, dst_index, dst_stride, src, src_index, src_stride, lanes):
    """The ``lanes x lanes`` block of ``src`` whose row ``i`` starts at ``src_index + i *
    src_stride`` stored transposed into ``dst`` (row ``j`` at ``dst_index + j * dst_stride``):
    ``lanes`` vector loads, ``log2(lanes) * lanes`` shuffles, ``lanes`` vector stores.
    ``lanes`` is a power of two. It turns channel planes (NCHW) into channel-interleaved
    positions and back, where an element-by-element copy cost more than the convolution."""
    L = _literal_lanes(lanes)
    if L is None or L & (L - 1):
        return None

    def codegen(context, builder, signature, args):
        src_data = context.make_array(signature.args[3])(context, builder, args[3]).data
        dst_data = context.make_array(signature.args[0])(context, builder, args[0]).data
        elem = context.get_value_type(signature.args[0].dtype)
        vec = ir.VectorType(elem, L)
        align = context.get_abi_sizeof(elem)
        dst_at, dst_step, src_at, src_step = (context.cast(builder, args[k], signature.args[k], types.intp)
                                              for k in (1, 2, 4, 5))
        rows = []
        for i in range(L):
            at = builder.add(src_at, builder.mul(src_step, ir.Constant(src_step.type, i)))
            rows.append(builder.load(builder.bitcast(builder.gep(src_data, [at]), vec.as_pointer()), align=align))
        for j, row in enumerate(_transpose_vectors(builder, rows)):
            at = builder.add(dst_at, builder.mul(dst_step, ir.Constant(dst_step.type, j)))
            builder.store(row, builder.bitcast(builder.gep(dst_data, [at]), vec.as_pointer()), align=align)
        return context.get_dummy_value()

    return types.void(dst, dst_index, dst_stride, src, src_index, src_stride, lanes), codegen


@intrinsic
def vector_sum(typingctx, src, index, lanes):
    """The sum of ``src[index : +lanes]``: halves added pairwise (log2(lanes) shuffles and adds)."""
    L = _literal_lanes(lanes)
    if L is None:
        return None

    def codegen(context, builder, signature, args):
        pointer, vec, align = _vector_at(context, builder, signature.args[0], args[0], args[1], L)
        value = builder.load(pointer, align=align)
        i32 = ir.IntType(32)
        width = L
        while width > 1:
            half = width // 2
            low = ir.Constant(ir.VectorType(i32, half), [ir.Constant(i32, k) for k in range(half)])
            high = ir.Constant(ir.VectorType(i32, half), [ir.Constant(i32, half + k) for k in range(half)])
            undef = ir.Constant(value.type, ir.Undefined)
            value = builder.fadd(builder.shuffle_vector(value, undef, low), builder.shuffle_vector(value, undef, high))
            width = half
        return builder.extract_element(value, ir.Constant(i32, 0))

    return src.dtype(src, index, lanes), codegen


@intrinsic
def vector_add_into(typingctx, dst, dst_index, src, src_index, lanes):
    """``dst[dst_index : +lanes] += src[src_index : +lanes]``."""
    L = _literal_lanes(lanes)
    if L is None:
        return None

    def codegen(context, builder, signature, args):
        d, vec, align = _vector_at(context, builder, signature.args[0], args[0], args[1], L)
        s_, _, _ = _vector_at(context, builder, signature.args[2], args[2], args[3], L)
        total = builder.fadd(builder.load(d, align=align), builder.load(s_, align=align))
        builder.store(total, d, align=align)
        return context.get_dummy_value()

    return types.void(dst, dst_index, src, src_index, lanes), codegen


def _store_plus(scalar, lanes, nontemporal):
    """The codegen of ``dst[dst_index : +lanes] = src[src_index : +lanes] + scalar``, a plain or a
    non-temporal store (then aligned to the whole vector), or None for arguments it does not take."""
    L = _literal_lanes(lanes)
    if L is None or not isinstance(scalar, (types.Float, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        d, vec, align = _vector_at(context, builder, signature.args[0], args[0], args[1], L)
        s_, _, _ = _vector_at(context, builder, signature.args[2], args[2], args[3], L)
        value = context.cast(builder, args[4], signature.args[4], signature.args[0].dtype)
        total = builder.fadd(builder.load(s_, align=align), _splat(builder, vec, value))
        if nontemporal:
            store = builder.store(total, d, align=align * L)
            store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        else:
            builder.store(total, d, align=align)
        return context.get_dummy_value()

    return codegen


@intrinsic
def vector_store_plus(typingctx, dst, dst_index, src, src_index, scalar, lanes):
    """``dst[dst_index : +lanes] = src[src_index : +lanes] + scalar``."""
    codegen = _store_plus(scalar, lanes, nontemporal=False)
    return None if codegen is None else (types.void(dst, dst_index, src, src_index, scalar, lanes), codegen)


@intrinsic
def vector_stream_plus(typingctx, dst, dst_index, src, src_index, scalar, lanes):
    """``dst[dst_index : +lanes] = src[src_index : +lanes] + scalar`` as a non-temporal store.

    The line goes to memory without being read first (a plain store reads it for ownership:
    a third more traffic for an output that no cache can hold) and without displacing the
    caches. ``dst[dst_index]`` must lie on a ``lanes * itemsize``-byte boundary (the store
    faults otherwise); callers check the address. Follow a kernel's streaming stores with
    :func:`store_fence` before other threads read what they wrote.
    """
    codegen = _store_plus(scalar, lanes, nontemporal=True)
    return None if codegen is None else (types.void(dst, dst_index, src, src_index, scalar, lanes), codegen)


@intrinsic
def store_fence(typingctx):
    """A full memory fence (``mfence`` on x86): orders this thread's streaming stores before
    whatever it does next, such as leaving a parallel region whose results others read."""

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def vector_store_split(typingctx, dst, index0, index1, split, src, src_index, scalar, accumulate,
                       lanes):
    """Write the vector ``v = src[src_index : +lanes]`` (``+ scalar``, or ``+`` what is there when
    ``accumulate``) with its lanes ``l < split`` at ``dst[index0 + l]`` and the others at
    ``dst[index1 + l]``: a register tile whose columns continue in the next image.

    Plain vector loads and stores when all lanes go to one side; masked ones (which touch no
    memory in their masked-off lanes) only for the vector that straddles the split.
    """
    L = _literal_lanes(lanes)
    if L is None or not isinstance(scalar, (types.Float, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        dst_t, src_t = signature.args[0], signature.args[4]
        dst_a, i0, i1, cut, src_a, s_index, value, acc_flag = args[:8]
        p0, vec, align = _vector_at(context, builder, dst_t, dst_a, i0, L)
        p1, _, _ = _vector_at(context, builder, dst_t, dst_a, i1, L)
        sp, _, _ = _vector_at(context, builder, src_t, src_a, s_index, L)
        tile = builder.load(sp, align=align)
        addend = _splat(builder, vec, context.cast(builder, value, signature.args[6], dst_t.dtype))
        accumulate = context.cast(builder, acc_flag, signature.args[7], types.boolean)
        cut = context.cast(builder, cut, signature.args[3], types.int64)
        i32, i1t = ir.IntType(32), ir.IntType(1)
        lane_ids = ir.Constant(ir.VectorType(ir.IntType(64), L), list(range(L)))
        cut_vec = _splat(builder, ir.VectorType(ir.IntType(64), L), cut)
        low_mask = builder.icmp_signed("<", lane_ids, cut_vec)
        high_mask = builder.not_(low_mask)
        zero = ir.Constant(vec, None)
        bits = dst_t.dtype.bitwidth
        masked_load = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vec, [vec.as_pointer(), i32, ir.VectorType(i1t, L), vec]),
            f"llvm.masked.load.v{L}f{bits}.p0v{L}f{bits}")
        masked_store = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [vec, vec.as_pointer(), i32, ir.VectorType(i1t, L)]),
            f"llvm.masked.store.v{L}f{bits}.p0v{L}f{bits}")
        align_c = ir.Constant(i32, align)

        def plain(pointer):
            with builder.if_else(accumulate) as (then, otherwise):
                with then:
                    builder.store(builder.fadd(tile, builder.load(pointer, align=align)), pointer, align=align)
                with otherwise:
                    builder.store(builder.fadd(tile, addend), pointer, align=align)

        all_low = builder.icmp_signed(">=", cut, ir.Constant(ir.IntType(64), L))
        all_high = builder.icmp_signed("<=", cut, ir.Constant(ir.IntType(64), 0))
        with builder.if_else(all_low) as (low_only, rest):
            with low_only:
                plain(p0)
            with rest:
                with builder.if_else(all_high) as (high_only, mixed):
                    with high_only:
                        plain(p1)
                    with mixed:
                        there = builder.select(
                            low_mask, builder.call(masked_load, [p0, align_c, low_mask, zero]),
                            builder.call(masked_load, [p1, align_c, high_mask, zero]))
                        total = builder.fadd(tile, builder.select(accumulate, there, addend))
                        builder.call(masked_store, [total, p0, align_c, low_mask])
                        builder.call(masked_store, [total, p1, align_c, high_mask])
        return context.get_dummy_value()

    return types.void(dst, index0, index1, split, src, src_index, scalar, accumulate, lanes), codegen


@intrinsic
def prefetch_for_write(typingctx, array, index):
    """Ask for the cache line holding ``array[index]`` (for writing), no bounds check."""
    if not isinstance(array, types.Array):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        address = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32]),
            "llvm.prefetch.p0i8")
        builder.call(fn, [address, ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(array, index), codegen


# Packing B moves short runs (a few to NR pixels): a plain loop spends them in LLVM's scalar
# remainder (its vector body is 32+ elements wide). These copy whole 32-byte vectors instead and
# may write up to one vector past the run: pack_b_from_image writes every panel row left to right,
# rows and panels in increasing order, so whatever a vector writes past its run is written again
# later, and Bc has one vector of slack at its end (VECTOR_SLACK_BYTES).
VECTOR_BYTES = VECTOR_SLACK_BYTES


def _packing_lanes(context, array_type):
    return VECTOR_BYTES // context.get_abi_sizeof(context.get_value_type(array_type.dtype))


@intrinsic
def copy_vector(typingctx, dst, dst_index, src, src_index):
    """``dst[dst_index : dst_index + V] = src[src_index : src_index + V]``, V = 32 bytes of
    elements, as one unaligned vector load and store (no bounds check)."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.dtype == src.dtype):
        return None

    def codegen(context, builder, signature, args):
        lanes = _packing_lanes(context, signature.args[0])
        d, _, align = _vector_at(context, builder, signature.args[0], args[0], args[1], lanes)
        s_, _, _ = _vector_at(context, builder, signature.args[2], args[2], args[3], lanes)
        builder.store(builder.load(s_, align=align), d, align=align)
        return context.get_dummy_value()

    return types.void(dst, dst_index, src, src_index), codegen


def _two_vectors(builder, pointer, align):
    """The vector at ``pointer`` and the one after it (2*V consecutive elements)."""
    low = builder.load(pointer, align=align)
    high = builder.load(builder.gep(pointer, [ir.Constant(ir.IntType(64), 1)]), align=align)
    return low, high


def _every_other_lane(builder, low, high, lanes, first):
    """Lanes ``first, first + 2, ...`` of ``low`` followed by ``high``: one shuffle."""
    picks = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [2 * i + first for i in range(lanes)])
    return builder.shuffle_vector(low, high, picks)


@intrinsic
def copy_vector_stride2(typingctx, dst, dst_index, src, src_index):
    """``dst[dst_index : dst_index + V] = src[src_index : src_index + 2*V : 2]``, V = 32 bytes of
    elements: two vector loads, one shuffle of their even lanes, one store (no bounds check).
    Stride-2 layers read every other input column; element by element that was most of their
    packing time."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.dtype == src.dtype):
        return None

    def codegen(context, builder, signature, args):
        lanes = _packing_lanes(context, signature.args[0])
        d, vec, align = _vector_at(context, builder, signature.args[0], args[0], args[1], lanes)
        s_, _, _ = _vector_at(context, builder, signature.args[2], args[2], args[3], lanes)
        low, high = _two_vectors(builder, s_, align)
        builder.store(_every_other_lane(builder, low, high, lanes, 0), d, align=align)
        return context.get_dummy_value()

    return types.void(dst, dst_index, src, src_index), codegen


@intrinsic
def deinterleave_vector(typingctx, dst, even_index, odd_index, src, src_index):
    """``dst[even_index : +V] = src[src_index : +2*V : 2]`` and ``dst[odd_index : +V] =
    src[src_index + 1 : +2*V : 2]``, V = 32 bytes of elements: two vector loads, two shuffles,
    two stores (no bounds check). A stride-2 depthwise band splits each input row into its two
    column phases with it; the plain loop stayed scalar (two store streams into one array)."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.dtype == src.dtype):
        return None

    def codegen(context, builder, signature, args):
        lanes = _packing_lanes(context, signature.args[0])
        even, vec, align = _vector_at(context, builder, signature.args[0], args[0], args[1], lanes)
        odd, _, _ = _vector_at(context, builder, signature.args[0], args[0], args[2], lanes)
        s_, _, _ = _vector_at(context, builder, signature.args[3], args[3], args[4], lanes)
        low, high = _two_vectors(builder, s_, align)
        for target, first in ((even, 0), (odd, 1)):
            builder.store(_every_other_lane(builder, low, high, lanes, first), target, align=align)
        return context.get_dummy_value()

    return types.void(dst, even_index, odd_index, src, src_index), codegen


@intrinsic
def zero_vector(typingctx, dst, dst_index):
    """``dst[dst_index : dst_index + V] = 0`` as one vector store (no bounds check)."""
    if not isinstance(dst, types.Array):
        return None

    def codegen(context, builder, signature, args):
        lanes = _packing_lanes(context, signature.args[0])
        d, vec, align = _vector_at(context, builder, signature.args[0], args[0], args[1], lanes)
        builder.store(ir.Constant(vec, None), d, align=align)
        return context.get_dummy_value()

    return types.void(dst, dst_index), codegen


def vector_lanes(array):
    """Elements of ``array``'s dtype in one 32-byte vector, as a compile-time constant (jitted
    code only; ``array.itemsize`` would be a run-time load, and a loop stepping by it a division).
    """
    raise NotImplementedError("vector_lanes is called from numba-compiled code only")


@overload(vector_lanes)
def _vector_lanes_overload(array):
    lanes = VECTOR_BYTES // (array.dtype.bitwidth // 8)
    return lambda array: lanes


@njit(inline="always")
def copy_row(src, start, dst, dst_start, count):
    """``dst[dst_start : dst_start + count] = src[start : start + count]`` in whole vectors, the
    last one shifted back to end at ``count``: nothing is read or written outside the two ranges
    (indices are taken as unsigned; with ``count`` 0 nothing is touched). A plain loop became a
    vector loop whose unrolled step outran short rows, which went through its scalar remainder:
    gathering the digits CNN's 32 images of 16x8x8 for direct took 150 us this way against 47
    (Zen 3, 2 threads); Winograd's 56-wide rows likewise."""
    start, dst_start, count = np.uint64(start), np.uint64(dst_start), np.uint64(count)
    lanes = np.uint64(vector_lanes(dst))
    if count >= lanes:
        v = np.uint64(0)
        while v + lanes < count:
            copy_vector(dst, dst_start + v, src, start + v)
            v += lanes
        copy_vector(dst, dst_start + count - lanes, src, start + count - lanes)
    else:
        for j in range(count):
            dst[dst_start + j] = src[start + j]



@njit(inline="always")
def zero_row(dst, dst_start, count):
    """``dst[dst_start : dst_start + count] = 0`` in whole vectors, the last one shifted back to
    end at ``count`` (as :func:`copy_row`; nothing outside the range is written)."""
    dst_start, count = np.uint64(dst_start), np.uint64(count)
    lanes = np.uint64(vector_lanes(dst))
    if count >= lanes:
        v = np.uint64(0)
        while v + lanes < count:
            zero_vector(dst, dst_start + v)
            v += lanes
        zero_vector(dst, dst_start + count - lanes)
    else:
        for j in range(count):
            dst[dst_start + j] = 0

# -- masked gathers for packing from the image ------------------------------------------------
class _VectorGEP(ir.instructions.Instruction):
    """``getelementptr elem, elem* base, <L x i32> index``: a vector of ``L`` pointers (llvmlite's
    own ``gep`` types scalar indices only). Written out by hand; LLVM turns ``base + sext(i32
    index)`` feeding a gather into one ``vgatherdps`` with 32-bit indices."""

    def __init__(self, parent, base, element, index):
        super().__init__(parent, ir.VectorType(element.as_pointer(), index.type.count), "getelementptr",
                         [base, index])
        self.element = element

    def descr(self, buf):
        base, index = self.operands
        buf.append(f"getelementptr {self.element}, {base.type} {base.get_reference()}, "
                   f"{index.type} {index.get_reference()}\n")


@intrinsic
def gather_vector(typingctx, dst, dst_index, src, src_base, offsets, offsets_index, mask, lanes):
    """``dst[dst_index + l] = src[src_base + offsets[offsets_index + l]]`` for the lanes ``l <
    lanes`` whose bit ``l`` of ``mask`` is set, 0 for the others: one masked gather (AVX-512's
    ``vgatherdps`` with 32-bit offsets) and one vector store. Masked-off lanes read nothing, so
    their addresses may lie outside ``src`` (padding). ``offsets`` is an int32 array."""
    L = _literal_lanes(lanes)
    if L is None or not (isinstance(offsets, types.Array) and offsets.dtype == types.int32):
        return None

    def codegen(context, builder, signature, args):
        dst_t, src_t = signature.args[0], signature.args[2]
        d, vec, align = _vector_at(context, builder, dst_t, args[0], args[1], L)
        index_ptr, _, _ = _vector_at(context, builder, signature.args[4], args[4], args[5], L)
        index = builder.load(index_ptr, align=4)
        src_data = context.make_array(src_t)(context, builder, args[2]).data
        base = builder.gep(src_data, [context.cast(builder, args[3], signature.args[3], types.intp)])
        pointers = _VectorGEP(builder.block, base, vec.element, index)
        builder._insert(pointers)
        bits = context.cast(builder, args[6], signature.args[6], types.uint64)
        lane_bits = builder.trunc(bits, ir.IntType(L))
        mask_vec = builder.bitcast(lane_bits, ir.VectorType(ir.IntType(1), L))
        width = dst_t.dtype.bitwidth
        gather = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(vec, [pointers.type, ir.IntType(32), mask_vec.type, vec]),
            f"llvm.masked.gather.v{L}f{width}.v{L}p0f{width}")
        value = builder.call(gather, [pointers, ir.Constant(ir.IntType(32), align), mask_vec, ir.Constant(vec, None)])
        builder.store(value, d, align=align)
        return context.get_dummy_value()

    return types.void(dst, dst_index, src, src_base, offsets, offsets_index, mask, lanes), codegen


# -- whole-register runs for the Winograd transforms -------------------------------------------
def lanes_per_register(dtype) -> int:
    """Elements of the numba ``dtype`` in the widest vector register (64 bytes with AVX-512): the V
    of :func:`deinterleave_run` and :func:`register_lanes`, for overloads that size buffers by it."""
    return simd_bytes() // (dtype.bitwidth // 8)


def _as_intp(context, builder, signature, args, positions):
    return [context.cast(builder, args[i], signature.args[i], types.intp) for i in positions]


def _stride_picks(lanes, ways, first):
    """Lanes ``first, first + ways, first + 2*ways, ...`` of a ``ways * lanes`` vector."""
    return ir.Constant(ir.VectorType(ir.IntType(32), lanes), [ways * i + first for i in range(lanes)])


@intrinsic
def deinterleave_run(typingctx, dst, dst_index, dst_pitch, src, src_index, ways):
    """``dst[dst_index + k*dst_pitch + t] = src[src_index + ways*t + k]`` for every ``k < ways``
    and ``t < V``, V = :func:`register_lanes`: one load of ``ways`` registers, ``ways`` shuffles
    and stores (no bounds check; ``ways`` a literal). Winograd's input transform reads each tile's
    taps ``m`` apart along a row: left to LLVM that was a gather per tap."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.dtype == src.dtype
            and isinstance(ways, types.IntegerLiteral)):
        return None
    n = ways.literal_value

    def codegen(context, builder, signature, args):
        lanes = lanes_per_register(signature.args[0].dtype)
        d0, pitch, s0 = _as_intp(context, builder, signature, args, (1, 2, 4))
        s_, _, align = _vector_at(context, builder, signature.args[3], args[3], s0, lanes * n)
        whole = builder.load(s_, align=align)
        undef = ir.Constant(whole.type, ir.Undefined)
        for k in range(n):
            index = builder.add(d0, builder.mul(pitch, ir.Constant(pitch.type, k)))
            d, _, _ = _vector_at(context, builder, signature.args[0], args[0], index, lanes)
            builder.store(builder.shuffle_vector(whole, undef, _stride_picks(lanes, n, k)), d, align=align)
        return context.get_dummy_value()

    return types.void(dst, dst_index, dst_pitch, src, src_index, ways), codegen


def register_lanes(array):
    """Elements of ``array``'s dtype in the widest vector register, as a compile-time constant
    (jitted code only): the V of :func:`deinterleave_run`."""
    raise NotImplementedError("register_lanes is called from numba-compiled code only")


@overload(register_lanes)
def _register_lanes_overload(array):
    lanes = lanes_per_register(array.dtype)
    return lambda array: lanes
