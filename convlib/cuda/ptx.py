"""PTX instructions numba-cuda has no name for: the tensor cores' ``mma.sync`` and the conversions
around it, as numba intrinsics that emit inline PTX, and the same instructions emulated in
Python for numba-cuda's simulator.

Kernels call them by name from the namespace of their generated source (:mod:`.codegen`):
:func:`instructions` gives the device intrinsics on a GPU and the emulations under the simulator,
so one generated kernel runs in both places. Inline PTX keeps the kernel language numba's: no
CUDA C++ is compiled or linked (``docs/gpu.md`` compares the two ways).

The matrix product of one warp (``m16n8k8`` in TF32, ``m16n8k16`` in float16 / bfloat16, float32
accumulators) takes its operands in 32-bit *words*: one TF32 value, or two half-precision values
of consecutive ``k`` (the lower ``k`` in the low 16 bits). In words, both shapes are the same
16 x 8 by 8 x 8 product, and so are the fragments. With lane ``l``, ``g = l >> 2``, ``t = l & 3``:

========  ===================================================================================
A (16x8)  ``a0 = A[g][t]``, ``a1 = A[g + 8][t]``, ``a2 = A[g][t + 4]``, ``a3 = A[g + 8][t + 4]``
B (8x8)   ``b0 = B[t][g]``, ``b1 = B[t + 4][g]``
C (16x8)  ``c0 = C[g][2t]``, ``c1 = C[g][2t + 1]``, ``c2 = C[g + 8][2t]``, ``c3 = C[g + 8][2t + 1]``
========  ===================================================================================

(PTX ISA, "Matrix fragments for mma.m16n8k8" and "mma.m16n8k16"; checked on an H100 against
float64 products, ``docs/gpu.md``.)

Moving to another kernel compiler (numba-cuda-mlir) means rewriting this module's intrinsics,
which are LLVM IR; :mod:`.launch` hands it numba's extension API.
"""

from __future__ import annotations

import functools

import numpy as np

#: The precisions of the tensor-core products: the operand type, and float32 accumulation.
PRECISIONS = ("tf32", "float16", "bfloat16")

#: Elements per 32-bit operand word.
ELEMENTS_PER_WORD = {"tf32": 1, "float16": 2, "bfloat16": 2}

_MMA = {
    "tf32": "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
    "float16": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    "bfloat16": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
}

#: Words each lane hands to one product: four of A, then two of B.
FRAGMENT_WORDS = 6

#: ``copy_wait_0`` .. ``copy_wait_{n - 1}``: the ``cp.async.wait_group`` counts the kernels may
#: name (the count is an immediate operand, so each is its own instruction).
COPY_GROUPS_IN_FLIGHT = 4


def instructions(simulator: bool) -> dict:
    """The names generated kernels call: ``mma_tf32``, ``mma_float16``, ``mma_bfloat16`` (each
    ``(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> (d0, d1, d2, d3)``), ``tf32_word(f32)``,
    ``float16_bits(f32)``, ``bfloat16_bits(f32)`` (round to nearest even), ``float16_value(bits)``,
    ``bits_value(u32)`` (a float32 from its bits) and ``float_bits(f32)`` (its bits);
    ``load4(array, i)`` and ``store4(array, i, w0, w1, w2, w3)``: four uint32 words at
    ``array[i:i + 4]`` in one 16-byte access (``i`` a multiple of 4 and the array 16-byte
    aligned: the caller's promise), ``store2(array, i, w0, w1)`` the same for two words (8 bytes);
    ``ldmatrix4(array, i)``: the warp's ``ldmatrix.x4`` from a
    shared array, each lane naming one row of four words (lanes
    ``8j..8j + 7`` the rows of matrix ``j``; 16-byte aligned) and receiving word ``l & 3`` of row
    ``l >> 2`` of each of the four matrices.

    ``copy16(shared, i, source, j, nbytes)``: ``cp.async.cg``, the four words ``source[j:j + 4]``
    (global) to ``shared[i:i + 4]`` without registers, or four zero words when ``nbytes`` is 0
    (both 16-byte aligned); ``copy_commit()`` closes this thread's group of copies
    (``cp.async.commit_group``) and ``copy_wait_{n}()`` (``n`` below
    :data:`COPY_GROUPS_IN_FLIGHT`) waits until at most ``n`` of its groups are in flight. A
    barrier must still follow before other threads read what was copied.

    Under the simulator, ``mma_lane(precision, words, base, lane, c0, c1, c2, c3)`` replaces the
    products and ``ldmatrix_lane(array, words, base, lane)`` the ``ldmatrix4``: the kernel first
    stores each lane's six operand words at ``words[base + 6 * lane ...]`` (or its row's index at
    ``words[base + lane]``) and synchronises (see :func:`simulated_mma`). Copies are done at once
    there and their groups are nothing to wait for: the barrier after the wait orders them as on
    the GPU.
    """
    return _simulated() if simulator else _device()


@functools.cache
def _device() -> dict:
    from llvmlite import ir

    from .launch import kernel_extension_api

    intrinsic, types = kernel_extension_api()
    f32, i32, i16 = ir.FloatType(), ir.IntType(32), ir.IntType(16)

    def asm(builder, result, operands, text, constraints, args, side_effect=False):
        function = ir.FunctionType(result, operands)
        return builder.call(ir.InlineAsm(function, text, constraints, side_effect=side_effect), args)

    def element_pointer(context, builder, array_type, array, index):
        return builder.gep(context.make_array(array_type)(context, builder, array).data, [index])

    def product(precision):
        # The four accumulators are tied to the results ("0".."3"): NVVM keeps them in place.
        text = f"{_MMA[precision]} {{$0,$1,$2,$3}}, {{$4,$5,$6,$7}}, {{$8,$9}}, {{$0,$1,$2,$3}};"
        constraints = "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3"
        signature = types.UniTuple(types.float32, 4)(*([types.uint32] * 6 + [types.float32] * 4))

        def typer(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            def codegen(context, builder, sig, args):
                result = asm(builder, ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4, text, constraints, args)
                values = [builder.extract_value(result, i) for i in range(4)]
                return context.make_tuple(builder, sig.return_type, values)

            return signature, codegen

        typer.__name__ = f"mma_{precision}"
        return intrinsic(typer)

    def conversion(name, restype, argtype, result, operand, text, constraints):
        def typer(typingctx, value):
            def codegen(context, builder, sig, args):
                return asm(builder, result, [operand], text, constraints, args)

            return restype(argtype), codegen

        typer.__name__ = name
        return intrinsic(typer)

    def bitcast(name, restype, argtype, result):
        def typer(typingctx, value):
            def codegen(context, builder, sig, args):
                return builder.bitcast(args[0], result)

            return restype(argtype), codegen

        typer.__name__ = name
        return intrinsic(typer)

    def word_pointer(context, builder, array_type, array, index, words=4):
        pointer = element_pointer(context, builder, array_type, array, index)
        return builder.bitcast(pointer, ir.VectorType(i32, words).as_pointer())

    def load4_typer(typingctx, array, index):
        def codegen(context, builder, sig, args):
            vector = builder.load(word_pointer(context, builder, sig.args[0], *args), align=16)
            words = [builder.extract_element(vector, ir.Constant(i32, j)) for j in range(4)]
            return context.make_tuple(builder, sig.return_type, words)

        return types.UniTuple(types.uint32, 4)(array, types.uint64), codegen

    def store_words(words):
        """The codegen of a store of ``words`` uint32 words in one aligned access."""
        def codegen(context, builder, sig, args):
            vector = ir.Constant(ir.VectorType(i32, words), None)
            for j, word in enumerate(args[2:]):
                vector = builder.insert_element(vector, word, ir.Constant(i32, j))
            pointer = word_pointer(context, builder, sig.args[0], args[0], args[1], words)
            builder.store(vector, pointer, align=4 * words)
            return context.get_dummy_value()

        return codegen

    def store4_typer(typingctx, array, index, w0, w1, w2, w3):
        return types.none(array, types.uint64, *([types.uint32] * 4)), store_words(4)

    def store2_typer(typingctx, array, index, w0, w1):
        return types.none(array, types.uint64, types.uint32, types.uint32), store_words(2)

    def ldmatrix4_typer(typingctx, array, index):
        # ldmatrix takes a shared-window address; numba's shared arrays hand out generic ones.
        text = ("{ .reg .u64 shared_address; cvta.to.shared.u64 shared_address, $4; "
                "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0,$1,$2,$3}, [shared_address]; }")

        def codegen(context, builder, sig, args):
            pointer = element_pointer(context, builder, sig.args[0], *args)
            address = builder.ptrtoint(pointer, ir.IntType(64))
            # side_effect: the read must stay between the barriers that order the stage's writes.
            result = asm(builder, ir.LiteralStructType([i32] * 4), [ir.IntType(64)], text, "=r,=r,=r,=r,l",
                         [address], side_effect=True)
            words = [builder.extract_value(result, j) for j in range(4)]
            return context.make_tuple(builder, sig.return_type, words)

        return types.UniTuple(types.uint32, 4)(array, types.uint64), codegen

    def copy16_typer(typingctx, shared, shared_index, source, source_index, source_bytes):
        # cp.async: 16 bytes from global to shared memory without passing through registers;
        # src-size 0 writes 16 zero bytes (and reads nothing). The memory clobber keeps the
        # compiler from moving shared accesses across it.
        text = ("{ .reg .u64 shared_address; cvta.to.shared.u64 shared_address, $0; "
                "cp.async.cg.shared.global [shared_address], [$1], 16, $2; }")

        def codegen(context, builder, sig, args):
            i64 = ir.IntType(64)
            target = builder.ptrtoint(element_pointer(context, builder, sig.args[0], args[0], args[1]), i64)
            origin = builder.ptrtoint(element_pointer(context, builder, sig.args[2], args[2], args[3]), i64)
            asm(builder, ir.VoidType(), [i64, i64, i32], text, "l,l,r,~{memory}", [target, origin, args[4]],
                side_effect=True)
            return context.get_dummy_value()

        return types.none(shared, types.uint64, source, types.uint64, types.uint32), codegen

    def statement(name, text):
        def typer(typingctx):
            def codegen(context, builder, sig, args):
                asm(builder, ir.VoidType(), [], text, "~{memory}", [], side_effect=True)
                return context.get_dummy_value()

            return types.none(), codegen

        typer.__name__ = name
        return intrinsic(typer)

    load4_typer.__name__, store4_typer.__name__, ldmatrix4_typer.__name__ = "load4", "store4", "ldmatrix4"
    store2_typer.__name__ = "store2"
    copy16_typer.__name__ = "copy16"
    table = {f"mma_{p}": product(p) for p in PRECISIONS}
    table.update(
        tf32_word=conversion("tf32_word", types.uint32, types.float32, i32, f32,
                             "cvt.rna.tf32.f32 $0, $1;", "=r,f"),
        float16_bits=conversion("float16_bits", types.uint16, types.float32, i16, f32,
                                "cvt.rn.f16.f32 $0, $1;", "=h,f"),
        bfloat16_bits=conversion("bfloat16_bits", types.uint16, types.float32, i16, f32,
                                 "cvt.rn.bf16.f32 $0, $1;", "=h,f"),
        float16_value=conversion("float16_value", types.float32, types.uint16, f32, i16,
                                 "cvt.f32.f16 $0, $1;", "=f,h"),
        bits_value=bitcast("bits_value", types.float32, types.uint32, f32),
        float_bits=bitcast("float_bits", types.uint32, types.float32, i32),
        load4=intrinsic(load4_typer),
        store4=intrinsic(store4_typer),
        store2=intrinsic(store2_typer),
        ldmatrix4=intrinsic(ldmatrix4_typer),
        copy16=intrinsic(copy16_typer),
        copy_commit=statement("copy_commit", "cp.async.commit_group;"),
    )
    table.update({f"copy_wait_{n}": statement(f"copy_wait_{n}", f"cp.async.wait_group {n};")
                  for n in range(COPY_GROUPS_IN_FLIGHT)})
    return table


# -- the simulator's emulations ---------------------------------------------------------------
def _as_bits32(value) -> int:
    return int(np.array(value, dtype=np.float32).view(np.uint32))


def _value32(bits) -> float:
    return float(np.array(int(bits) & 0xFFFFFFFF, dtype=np.uint32).view(np.float32))


def simulated_tf32_word(value) -> np.uint32:
    """``cvt.rna.tf32.f32``: float32 rounded to 10 mantissa bits, ties away from zero, as bits
    (NaN and infinity kept)."""
    bits = _as_bits32(value)
    if (bits & 0x7F800000) == 0x7F800000:
        return np.uint32(bits)
    return np.uint32((bits + 0x1000) & 0xFFFFE000)


def simulated_float16_bits(value) -> np.uint16:
    return np.array(value, dtype=np.float32).astype(np.float16).view(np.uint16)[()]


def simulated_bfloat16_bits(value) -> np.uint16:
    from ..core.precision import bfloat16_bits

    return bfloat16_bits(np.array([value], dtype=np.float32))[0]


def simulated_float16_value(bits) -> np.float32:
    return np.float32(np.array(int(bits) & 0xFFFF, dtype=np.uint16).view(np.float16))


def simulated_bits_value(bits) -> np.float32:
    return np.float32(_value32(bits))


def _word_values(precision: str, word) -> tuple[float, ...]:
    word = int(word)
    if precision == "tf32":
        return (_value32(word),)
    halves = (word & 0xFFFF, word >> 16)
    if precision == "float16":
        return tuple(float(simulated_float16_value(h)) for h in halves)
    return tuple(_value32(h << 16) for h in halves)


def simulated_mma(precision: str, words, base: int, lane: int, c0, c1, c2, c3):
    """One lane's result of a warp's ``mma.sync``, read from every lane's operand words.

    ``words[base + 6 * l + r]`` holds lane ``l``'s register ``r`` (``a0..a3, b0, b1``); the
    lanes' layouts are the module docstring's. The products are summed in float64 and rounded
    once to float32 (the tensor cores' own order and rounding are unspecified within float32).
    """
    base, lane = int(base), int(lane)
    g, t = lane >> 2, lane & 3

    def a(row, k):  # A[row][k], in words
        return words[base + FRAGMENT_WORDS * ((row % 8) * 4 + k % 4) + (row >= 8) + 2 * (k >= 4)]

    def b(k, col):  # B[k][col], in words
        return words[base + FRAGMENT_WORDS * (col * 4 + k % 4) + 4 + (k >= 4)]

    out = []
    for c, row, col in ((c0, g, 2 * t), (c1, g, 2 * t + 1), (c2, g + 8, 2 * t), (c3, g + 8, 2 * t + 1)):
        total = float(c)
        for k in range(8):
            total += sum(x * y for x, y in zip(_word_values(precision, a(row, k)), _word_values(precision, b(k, col))))
        out.append(np.float32(total))
    return tuple(out)


def simulated_float_bits(value) -> np.uint32:
    return np.uint32(_as_bits32(value))


def simulated_load4(array, index):
    index = int(index)
    assert index % 4 == 0, f"load4 at word {index}: not 16-byte aligned"
    if np.dtype(array.dtype) == np.float32:  # a float32 array's words are its values' bits
        return tuple(np.uint32(_as_bits32(array[index + j])) for j in range(4))
    return tuple(np.uint32(array[index + j]) for j in range(4))


def _simulated_store(array, index, words):
    index = int(index)
    assert index % len(words) == 0, f"store{len(words)} at word {index}: not {4 * len(words)}-byte aligned"
    as_values = np.dtype(array.dtype) == np.float32
    for j, word in enumerate(words):
        array[index + j] = _value32(word) if as_values else word


def simulated_store4(array, index, w0, w1, w2, w3):
    _simulated_store(array, index, (w0, w1, w2, w3))


def simulated_store2(array, index, w0, w1):
    _simulated_store(array, index, (w0, w1))


def simulated_ldmatrix(array, words, base: int, lane: int):
    """One lane's four words of a warp's ``ldmatrix.x4``: ``words[base + l]`` holds the row index
    lane ``l`` named."""
    base, lane = int(base), int(lane)
    rows = [int(words[base + 8 * j + (lane >> 2)]) for j in range(4)]
    assert all(row % 4 == 0 for row in rows), "ldmatrix rows must be 16-byte aligned"
    return tuple(np.uint32(array[row + (lane & 3)]) for row in rows)


def simulated_copy16(shared, index, source, source_index, nbytes):
    """``cp.async`` of 16 bytes, done at once: four words, or four zeros when ``nbytes`` is 0."""
    index, source_index = int(index), int(source_index)
    assert index % 4 == 0 and source_index % 4 == 0, f"copy16 {source_index} -> {index}: not 16-byte aligned"
    assert int(nbytes) in (0, 16), f"copy16 of {nbytes} bytes"
    for j in range(4):
        shared[index + j] = source[source_index + j] if nbytes else 0


def _no_wait():
    """``cp.async.commit_group`` / ``wait_group`` under the simulator, whose copies are done."""


@functools.cache
def _simulated() -> dict:
    return dict(
        copy16=simulated_copy16,
        copy_commit=_no_wait,
        **{f"copy_wait_{n}": _no_wait for n in range(COPY_GROUPS_IN_FLIGHT)},
        ldmatrix_lane=simulated_ldmatrix,
        load4=simulated_load4,
        store4=simulated_store4,
        store2=simulated_store2,
        mma_lane=simulated_mma,
        tf32_word=simulated_tf32_word,
        float16_bits=simulated_float16_bits,
        bfloat16_bits=simulated_bfloat16_bits,
        float16_value=simulated_float16_value,
        bits_value=simulated_bits_value,
        float_bits=simulated_float_bits,
    )
