"""BLIS/GotoBLAS five-loop GEMM convolution with implicit im2col (numba, CPU).

The GEMM view, per group ``g``: ``Y_g (M x Ngemm) = A_g (M x Kgemm) @ B_g (Kgemm x Ngemm)`` with

* ``M = K/groups`` rows: output channels of the group; ``A_g`` is the filters, row ``k`` being
  ``w[g*M + k]`` flattened in ``(c, r, s)`` order (``w`` is already laid out that way);
* ``Ngemm = N*P*Q`` columns: output pixels ``(n, p, q)`` of the whole batch, in that order;
* ``Kgemm = C/groups*R*S`` taps ``(c, r, s)``; ``B_g[(c, r, s), (n, p, q)]`` is the input value
  ``x[n, g*C/groups + c, p*sh - top + r*dh, q*sw - left + s*dw]``, zero in the padding.

``B_g`` is the im2col matrix, but it is never built: the packing routine reads its blocks
straight from the NCHW image. The five loops (names and sizes from :mod:`convlib.cpu.blocking`)::

    for jc in 0..Ngemm step NC:            # columns (pixels) of this thread
      for pc in 0..Kgemm step KC:
        pack_b_from_image  -> Bc (KC x NC)   # implicit im2col
        for ic in 0..M step MC:            # rows (output channels) of this thread
          pack_a_from_filters -> Ac (MC x KC)
          for jr in 0..NC step NR:
            for ir in 0..MC step MR:
              micro_kernel: Y[ir:ir+MR, jr:jr+NR] (+)= Ac sliver @ Bc sliver

Packed layouts (both zero-padded to whole register tiles):

* ``Bc``: ``NC/NR`` panels one after another, each ``kc x NR`` row-major: element
  ``(p, jr + j)`` at ``(jr/NR)*kc*NR + p*NR + j``; the micro-kernel reads one NR-row per
  reduction step with NR/lanes vector loads. :func:`pack_b_from_image` first tabulates the kc
  taps (channel plane, row and column offsets, and the output rows and columns that read inside
  the image), then fills the panels one by one: it cuts the panel's pixels into runs (pixels of
  one output row; or, when the input address is linear in the pixel index -- stride 1 and
  ``W == Q``, the 'same' layers -- all the panel's pixels of one image), and for every tap copies
  each run's clipped in-image range with whole 32-byte vector moves and zero-fills the rest: no
  per-element padding test, no division in the inner loops (stride-2 columns: two vector loads,
  even lanes shuffled into one store). The vector moves may write up to one vector past a run;
  the panels are written in an order where that spill is always overwritten later, and ``Bc`` has
  one vector of slack. 1x1 layers that read only inside the image have their own routines,
  :func:`pack_b_pointwise` (stride 1: a GEMM's packing) and :func:`pack_b_pointwise_strided`,
  which pack blocks of 16 taps at a time so that few channel streams are read at once.
* ``Ac``: ``MC/MR`` panels, each ``kc x MR``: element ``(ir + i, p)`` at
  ``(ir/MR)*MR*kc + p*MR + i``; the micro-kernel broadcasts ``MR`` consecutive values per step.
  :func:`pack_a_from_filters` is generated with its MR rows unrolled (7x faster than a loop).

The micro-kernel (generated per ``(MR, NR, lanes)`` from :data:`_MICRO_KERNEL_TEMPLATE`, rows and
vectors unrolled in the source) is written with explicit vector intrinsics (:func:`vector_fma`,
...) on a stack buffer (:func:`~convlib.cpu.stack_buffer.stack_array_1d`) that LLVM keeps in
registers. Explicit vectors fix the register tile: on Intel AVX-512 parts LLVM's loop vectoriser
prefers 256-bit vectors, which doubled the accumulators of a 6x64 tile and spilled them (~110
GF/s instead of ~300 on the GPU machine). Per reduction step: NR/lanes vector loads of B, MR
broadcasts of A, MR*NR/lanes FMAs (6x64 float32 on AVX-512: 24 zmm accumulators; 3x32 on
AVX2: 12 ymm, the one AVX2 shape whose loop LLVM schedules without spilling). The tile is stored
straight into ``y`` (its rows are NR contiguous pixels of one image), adding the bias on the
first ``pc`` block and accumulating on the others; before its reduction loop the kernel prefetches
the tile's rows of ``y`` (``prefetch_for_write``), so that the accumulating store does not wait
for them (on 14x14 and 7x7 images, where rows are short and the hardware prefetchers lose them,
that wait cost 5-10%). A whole tile whose columns run into the next
image is stored by :func:`micro_kernel_split` (:data:`_SPLIT_MICRO_KERNEL_TEMPLATE`): each vector
goes to its image, masked stores only for the vector that straddles the boundary. A tile that is
not whole (last rows or columns of the thread's range) or spans more than two images goes through
a per-thread ``MR x NR`` edge tile that :func:`store_edge_tile` copies out in runs of one image.

Threads: one ``prange`` iteration per thread, each owning a rectangle of the ``M x Ngemm`` output
(of every group) and its own ``Ac``, ``Bc``, edge tile and packing tables, so the threads never
wait for each other: one parallel region per call, no barrier inside the loops (a ``prange`` per
``pc`` block would cost a fork/join hundreds of times per layer; with a shared ``Bc`` every
block would also need a barrier). :func:`thread_split` picks the rectangle grid (``m_parts x
n_parts``) that minimises the busiest thread's micro-tile FLOPs plus packing: columns for large
images (each thread packs only its own pixels; A is small and re-packed), rows when the image is
small (e.g. 7x7x512, where splitting 392 pixels would leave half-empty tiles; each thread then
packs all of B, which is small). Workspace: ``threads * (MC*KC + KC*NC + MR*NR)`` elements
(clipped to the problem) plus small int64 tables, whatever N, H, W are;
:meth:`~convlib.cpu.blocking.BlisBlocking.workspace_bytes` reports exactly what
:func:`allocate_workspace` allocates.

Compile cost: the driver is specialised (``lru_cache``) on the block sizes of
:mod:`convlib.cpu.blocking` and, through the array types, on the dtype; shapes, strides, padding,
dilation and groups are run-time values, so a new problem shape costs nothing. Everything is
compiled with ``cache=True``. The micro-kernel and the A packer are ``exec``-generated inside
``@overload`` implementations (no source file), so they have no cache of their own: they are
compiled into, and cached with, the driver that calls them; a new process loads the driver from
the disk cache (~1 s) instead of compiling it (~20-40 s per dtype on the 2-core machine). Editing
a template does not invalidate that cache (numba checks only the caller's bytecode): clear
``__pycache__`` after.
"""

from __future__ import annotations

import functools
from collections import namedtuple

import numpy as np
from llvmlite import ir
from numba import get_num_threads, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from ..problem import ConvProblem
from .. import output_cache
from .blocking import VECTOR_SLACK_BYTES, BlisBlocking, blis_blocking, host_isa
from .stack_buffer import stack_array_1d

#: The sizes the kernels need, as one numba-friendly (homogeneous int) named tuple.
ConvGeometry = namedtuple(
    "ConvGeometry",
    "batch channels height width out_channels filter_h filter_w out_h out_w "
    "stride_h stride_w pad_top pad_left dil_h dil_w groups gemm_m gemm_k gemm_n",
)


def geometry_of(problem: ConvProblem) -> ConvGeometry:
    """The :class:`ConvGeometry` of ``problem``."""
    p = problem
    return ConvGeometry(
        p.N, p.C, p.H, p.W, p.K, p.R, p.S, p.P, p.Q, p.stride[0], p.stride[1],
        p.pad_top, p.pad_left, p.dilation[0], p.dilation[1], p.groups, p.gemm_m, p.gemm_k, p.gemm_n,
    )


def supports(problem: ConvProblem) -> str | None:
    """blis serves every valid problem."""
    return None


# ------------------------------------------------------------------------------------------
# Vector intrinsics: unaligned loads and stores of whole vectors at an element index of a 1-D
# array, no bounds check. ``lanes`` (a literal) is the vector length in elements.
# ------------------------------------------------------------------------------------------
def simd_bytes() -> int:
    """Bytes of a vector register on :func:`~convlib.cpu.blocking.host_isa` (64 or 32)."""
    return 64 if host_isa() == "avx512" else 32


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
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vec, [vec, vec, vec]),
            f"llvm.fma.v{L}f{signature.args[0].dtype.bitwidth}",
        )
        total = builder.call(fma, [builder.load(b_ptr, align=align), _splat(builder, vec, a_value),
                                   builder.load(acc_ptr, align=align)])
        builder.store(total, acc_ptr, align=align)
        return context.get_dummy_value()

    return types.void(acc, acc_index, a, a_index, b, b_index, lanes), codegen


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


@intrinsic
def vector_store_plus(typingctx, dst, dst_index, src, src_index, scalar, lanes):
    """``dst[dst_index : +lanes] = src[src_index : +lanes] + scalar``."""
    L = _literal_lanes(lanes)
    if L is None or not isinstance(scalar, (types.Float, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        d, vec, align = _vector_at(context, builder, signature.args[0], args[0], args[1], L)
        s_, _, _ = _vector_at(context, builder, signature.args[2], args[2], args[3], L)
        value = context.cast(builder, args[4], signature.args[4], signature.args[0].dtype)
        total = builder.fadd(builder.load(s_, align=align), _splat(builder, vec, value))
        builder.store(total, d, align=align)
        return context.get_dummy_value()

    return types.void(dst, dst_index, src, src_index, scalar, lanes), codegen


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


# ------------------------------------------------------------------------------------------
# Micro-kernel: generated per (MR, NR) from a template whose per-row lines are repeated MR times.
# ------------------------------------------------------------------------------------------
_PER_ROW = "#: per row"
_PER_VECTOR_ROW = "#: per vector, row"
_PER_ROW_VECTOR = "#: per row, vector"

_MICRO_KERNEL_TEMPLATE = f'''
def micro_kernel_{{MR}}x{{NR}}(kc, a, a_off, b, b_off, c, c_off, ldc, mode, bias, bias_off, MR, NR):
    # Explicit {{L}}-lane vectors (NR/{{L}} per row): the register tile does not depend on the
    # width LLVM's loop vectoriser prefers (256 bits on Intel AVX-512 parts, which would double
    # the accumulators and spill them), and no index goes through numba's wraparound test.
    acc = stack_array_1d({{MR}} * {{NR}}, c.dtype)
    vector_zero(acc, {{o}}, {{L}})  {_PER_ROW_VECTOR}
    prefetch_for_write(c, c_off + {{i}} * ldc + {{j}})  {_PER_ROW_VECTOR}
    for p in range(kc):
        ap = a_off + p * {{MR}}
        bp = b_off + p * {{NR}}
        vector_fma(acc, {{o}}, a, ap + {{i}}, b, bp + {{j}}, {{L}})  {_PER_VECTOR_ROW}
    if mode == ACCUMULATE:
        vector_add_into(c, c_off + {{i}} * ldc + {{j}}, acc, {{o}}, {{L}})  {_PER_ROW_VECTOR}
    else:
        bias{{i}} = bias[bias_off + {{i}}] if mode == STORE_WITH_BIAS else 0.0  {_PER_ROW}
        vector_store_plus(c, c_off + {{i}} * ldc + {{j}}, acc, {{o}}, bias{{i}}, {{L}})  {_PER_ROW_VECTOR}
'''

#: The same tile for columns that continue in the next image: those from ``head`` on go to
#: ``c_off2`` (the next image's first pixel of row 0) instead of following ``c_off``'s row.
_SPLIT_MICRO_KERNEL_TEMPLATE = _MICRO_KERNEL_TEMPLATE.split("    if mode == ACCUMULATE:")[0].replace(
    "def micro_kernel_{MR}x{NR}(kc, a, a_off, b, b_off, c, c_off, ldc,",
    "def micro_kernel_split_{MR}x{NR}(kc, a, a_off, b, b_off, c, c_off, c_off2, head, ldc,",
).replace(
    "    for p in range(kc):",
    "    prefetch_for_write(c, c_off2 + {i} * ldc)  " + _PER_ROW + "\n    for p in range(kc):",
) + f'''    accumulate = mode == ACCUMULATE
    bias{{i}} = bias[bias_off + {{i}}] if mode == STORE_WITH_BIAS else 0.0  {_PER_ROW}
    vector_store_split(c, c_off + {{i}} * ldc + {{j}}, c_off2 + {{i}} * ldc + {{j}} - head, head - {{j}}, acc, {{o}}, bias{{i}}, accumulate, {{L}})  {_PER_ROW_VECTOR}
'''

#: How the micro-kernel writes its tile: the first ``pc`` block stores (adding the bias when there
#: is one), the later ones accumulate.
STORE, STORE_WITH_BIAS, ACCUMULATE = 0, 1, 2


def render(template: str, MR: int, NR: int = 0, L: int = 1) -> str:
    """Source from ``template``: lines marked ``#: per row`` repeated for each row ``i`` in
    ``range(MR)``, ``#: per vector, row`` for each vector ``v`` in ``range(NR // L)`` and row,
    ``#: per row, vector`` likewise rows outer. ``{MR}``, ``{NR}``, ``{L}`` are replaced, and in
    the repeated lines ``{i}``, ``{j} = v*L`` (the vector's first column) and ``{o} = i*NR + v*L``
    (its offset in the MR x NR tile)."""
    sizes = dict(MR=MR, NR=NR, L=L)

    def at(i, v):
        return dict(i=i, j=v * L, o=i * NR + v * L)

    repeats = {
        _PER_ROW: [dict(i=i) for i in range(MR)],
        _PER_VECTOR_ROW: [at(i, v) for v in range(NR // L) for i in range(MR)],
        _PER_ROW_VECTOR: [at(i, v) for i in range(MR) for v in range(NR // L)],
    }
    lines = []
    for line in template.splitlines():
        marker = next((m for m in repeats if line.endswith(m)), None)
        if marker is None:
            lines.append(line.format(**sizes))
        else:
            body = line[: -len(marker)].rstrip()
            lines.extend(body.format(**sizes, **index) for index in repeats[marker])
    return "\n".join(lines) + "\n"


def micro_kernel_lanes(MR: int, NR: int, itemsize: int) -> int:
    """Lanes of the micro-kernel's vectors: the SIMD width of :func:`~convlib.cpu.blocking.host_isa`
    for this itemsize, halved until it divides NR."""
    lanes = simd_bytes() // itemsize
    while NR % lanes:
        lanes //= 2
    return lanes


def render_micro_kernel(MR: int, NR: int, L: int) -> str:
    """Source of the ``MR x NR`` micro-kernel with ``L``-lane vectors."""
    return render(_MICRO_KERNEL_TEMPLATE, MR, NR, L)


def render_split_micro_kernel(MR: int, NR: int, L: int) -> str:
    """Source of the ``MR x NR`` micro-kernel whose tile continues in the next image."""
    return render(_SPLIT_MICRO_KERNEL_TEMPLATE, MR, NR, L)


def _exec_function(source: str, name: str):
    namespace = {
        "vector_store_split": vector_store_split,
        "prefetch_for_write": prefetch_for_write,
        "stack_array_1d": stack_array_1d,
        "vector_zero": vector_zero,
        "vector_fma": vector_fma,
        "vector_add_into": vector_add_into,
        "vector_store_plus": vector_store_plus,
        "uintp": np.uintp,
        "ACCUMULATE": ACCUMULATE,
        "STORE_WITH_BIAS": STORE_WITH_BIAS,
    }
    exec(compile(source, f"<convlib blis {name}>", "exec"), namespace)
    return namespace[name]


@functools.lru_cache(maxsize=None)
def _micro_kernel_function(MR: int, NR: int, L: int):
    return _exec_function(render_micro_kernel(MR, NR, L), f"micro_kernel_{MR}x{NR}")


@functools.lru_cache(maxsize=None)
def _split_micro_kernel_function(MR: int, NR: int, L: int):
    return _exec_function(render_split_micro_kernel(MR, NR, L), f"micro_kernel_split_{MR}x{NR}")


def micro_kernel(kc, a, a_off, b, b_off, c, c_off, ldc, mode, bias, bias_off, MR, NR):
    """``c[c_off + i*ldc + j] (+)= sum_p a[a_off + p*MR + i] * b[b_off + p*NR + j]`` (+ bias).

    For ``i < MR``, ``j < NR``, ``p < kc``; ``mode`` is :data:`STORE`, :data:`STORE_WITH_BIAS`
    (adds ``bias[bias_off + i]``) or :data:`ACCUMULATE`. ``MR`` and ``NR`` must be compile-time
    constants (literals or closure constants of a jitted caller). Callable from jitted code only.
    """
    raise NotImplementedError("micro_kernel is called from numba-compiled code only")


@overload(micro_kernel, prefer_literal=True, jit_options={"fastmath": {"contract"}})
def _micro_kernel_overload(kc, a, a_off, b, b_off, c, c_off, ldc, mode, bias, bias_off, MR, NR):
    if not (isinstance(MR, types.IntegerLiteral) and isinstance(NR, types.IntegerLiteral)):
        return None  # numba retries with the literal types
    mr, nr = MR.literal_value, NR.literal_value
    return _micro_kernel_function(mr, nr, micro_kernel_lanes(mr, nr, c.dtype.bitwidth // 8))


def micro_kernel_split(kc, a, a_off, b, b_off, c, c_off, c_off2, head, ldc, mode, bias, bias_off,
                       MR, NR):
    """:func:`micro_kernel` for a tile whose columns ``j >= head`` continue in the next image:
    they go to ``c[c_off2 + i*ldc + j - head]``, the others to ``c[c_off + i*ldc + j]``.
    Callable from jitted code only."""
    raise NotImplementedError("micro_kernel_split is called from numba-compiled code only")


@overload(micro_kernel_split, prefer_literal=True, jit_options={"fastmath": {"contract"}})
def _micro_kernel_split_overload(kc, a, a_off, b, b_off, c, c_off, c_off2, head, ldc, mode, bias,
                                 bias_off, MR, NR):
    if not (isinstance(MR, types.IntegerLiteral) and isinstance(NR, types.IntegerLiteral)):
        return None
    mr, nr = MR.literal_value, NR.literal_value
    return _split_micro_kernel_function(mr, nr, micro_kernel_lanes(mr, nr, c.dtype.bitwidth // 8))


# ------------------------------------------------------------------------------------------
# Packing
# ------------------------------------------------------------------------------------------
_PACK_A_TEMPLATE = f'''
def pack_a_{{MR}}(w, row0, mc, pc, kc, gemm_k, Ac, MR):
    # Rows unrolled: the MR stores of one tap are contiguous, and MR streams of w are read.
    k = uintp(gemm_k)
    for ip in range((mc + {{MR}} - 1) // {{MR}}):
        panel = uintp(ip * {{MR}} * kc)
        src = uintp((row0 + ip * {{MR}}) * gemm_k + pc)
        if ip * {{MR}} + {{MR}} <= mc:
            for p in range(uintp(kc)):
                dst = panel + p * uintp({{MR}})
                Ac[dst + uintp({{i}})] = w[src + uintp({{i}}) * k + p]  {_PER_ROW}
        else:  # the last, partial panel: rows past mc are zero
            for i in range({{MR}}):
                for p in range(kc):
                    row = ip * {{MR}} + i
                    Ac[panel + p * {{MR}} + i] = w[(row0 + row) * gemm_k + pc + p] if row < mc else 0
'''


@functools.lru_cache(maxsize=None)
def _pack_a_function(MR: int):
    return _exec_function(render(_PACK_A_TEMPLATE, MR), f"pack_a_{MR}")


def pack_a_from_filters(w, row0, mc, pc, kc, gemm_k, Ac, MR):
    """Pack rows ``row0 .. row0+mc`` and taps ``pc .. pc+kc`` of the filter matrix (``w`` flat,
    rows of ``gemm_k``) into ``Ac``: panels of ``kc x MR``, ``Ac[ip*MR*kc + p*MR + i] =
    w[(row0 + ip*MR + i)*gemm_k + pc + p]``, zero for rows past ``mc``. ``MR`` a compile-time
    constant, as for :func:`micro_kernel`. Callable from jitted code only."""
    raise NotImplementedError("pack_a_from_filters is called from numba-compiled code only")


@overload(pack_a_from_filters, prefer_literal=True)
def _pack_a_overload(w, row0, mc, pc, kc, gemm_k, Ac, MR):
    if not isinstance(MR, types.IntegerLiteral):
        return None
    return _pack_a_function(MR.literal_value)


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
        low = builder.load(s_, align=align)
        high = builder.load(builder.gep(s_, [ir.Constant(ir.IntType(64), 1)]), align=align)
        evens = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [2 * i for i in range(lanes)])
        builder.store(builder.shuffle_vector(low, high, evens), d, align=align)
        return context.get_dummy_value()

    return types.void(dst, dst_index, src, src_index), codegen


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


@njit(cache=True, inline="always")
def fill_zeros_over(dst, start, count):
    """Zero ``dst[start : start + count]``, maybe writing up to one vector more."""
    lanes = vector_lanes(dst)
    for v in range((count + lanes - 1) // lanes):
        zero_vector(dst, start + v * lanes)


@njit(cache=True, inline="always")
def copy_run_over(src, src_start, src_step, dst, dst_start, count):
    """``dst[dst_start + t] = src[src_start + t*src_step]`` for ``t < count``, maybe writing up to
    one vector more. Whole vectors when ``src_step`` is 1 or 2 and they stay inside ``src``."""
    lanes = vector_lanes(dst)
    vectors = (count + lanes - 1) // lanes
    if src_step == 1 and src_start + vectors * lanes <= src.size:
        for v in range(vectors):
            copy_vector(dst, dst_start + v * lanes, src, src_start + v * lanes)
    elif src_step == 2 and src_start + 2 * vectors * lanes <= src.size:
        for v in range(vectors):
            copy_vector_stride2(dst, dst_start + v * lanes, src, src_start + 2 * v * lanes)
    else:
        s, d, step = np.uintp(src_start), np.uintp(dst_start), np.uintp(src_step)
        for t in range(np.uintp(count)):
            dst[d + t] = src[s + t * step]


#: Columns of the per-tap table of pack_b_from_image: the tap's channel plane, input row and
#: column offsets, and the output columns [q_lo, q_hi) and rows [p_lo, p_hi) that read inside
#: the image.
TAP_PLANE, TAP_ROW_OFFSET, TAP_COL_OFFSET, TAP_Q_LO, TAP_Q_HI, TAP_P_LO, TAP_P_HI = range(7)
TAP_COLUMNS = 7
#: Columns of the per-panel table of pixel runs of pack_b_from_image: the image's offset in x,
#: the output row and column of the run's first pixel, its length.
RUN_IMAGE, RUN_ROW, RUN_COL, RUN_LENGTH = range(4)
RUN_COLUMNS = 4


@njit(cache=True)
def pack_b_from_image(
    x,  # IN  (N * C * H * W,) the image, flat NCHW
    geo,  # IN  ConvGeometry
    group, jc, nc, pc, kc, NR,
    taps,  # SCRATCH (>= kc, TAP_COLUMNS) int64
    runs,  # SCRATCH (NR, RUN_COLUMNS) int64
    Bc,  # OUT (>= ceil(nc/NR)*kc*NR + one vector,) panels of kc x NR
):
    """Pack columns ``jc .. jc+nc`` (output pixels) and rows ``pc .. pc+kc`` (taps) of the
    implicit im2col matrix of ``group`` into ``Bc``, reading the image directly.

    First a table of the kc taps (``taps``), then panel by panel: the panel's pixels are cut into
    runs (``runs``), and every tap copies each run's part that reads inside the image and
    zero-fills the rest: clipped ranges, no per-element test, no division in the inner loops.

    Runs are pixels of one output row in general. When the input address is linear in the pixel
    index (stride 1 and ``W == Q``, e.g. 'same' padding), a run is all the panel's pixels of one
    image: one contiguous copy per image and tap, then the few padding columns of each output
    row are zeroed, instead of one short copy per output row (7 pixels on a 7x7 layer).
    """
    H, W, P, Q = geo.height, geo.width, geo.out_h, geo.out_w
    sh, sw = geo.stride_h, geo.stride_w
    plane = H * W
    image = geo.channels * plane
    PQ = P * Q
    channel0 = group * (geo.channels // geo.groups)
    if (geo.filter_h == 1 and geo.filter_w == 1 and sh == 1 and sw == 1
            and geo.pad_top == 0 and geo.pad_left == 0 and PQ == plane):
        pack_b_pointwise(x, image, plane, channel0 + pc, jc, nc, kc, NR, Bc)
        return
    if (geo.filter_h == 1 and geo.filter_w == 1 and geo.pad_top == 0 and geo.pad_left == 0
            and (P - 1) * sh < H and (Q - 1) * sw < W):
        pack_b_pointwise_strided(x, image, plane, W, P, Q, sh, sw, channel0 + pc, jc, nc, kc, NR,
                                 runs, Bc)
        return
    # Worth it when a panel holds several output rows; otherwise the per-row clipping is cheaper.
    linear = sw == 1 and sh * W == Q and Q < NR
    RS = geo.filter_h * geo.filter_w
    c = pc // RS
    r = (pc - c * RS) // geo.filter_w
    s = pc - c * RS - r * geo.filter_w
    for p in range(kc):
        row_off = r * geo.dil_h - geo.pad_top
        col_off = s * geo.dil_w - geo.pad_left
        taps[p, TAP_PLANE] = (channel0 + c) * plane
        taps[p, TAP_ROW_OFFSET] = row_off
        taps[p, TAP_COL_OFFSET] = col_off
        # Output columns q whose input column q*sw + col_off lies inside [0, W), rows likewise.
        q_lo = min(Q, max(0, (-col_off + sw - 1) // sw))
        taps[p, TAP_Q_LO] = q_lo
        taps[p, TAP_Q_HI] = max(q_lo, min(Q, (W - 1 - col_off) // sw + 1))
        p_lo = min(P, max(0, (-row_off + sh - 1) // sh))
        taps[p, TAP_P_LO] = p_lo
        taps[p, TAP_P_HI] = max(p_lo, min(P, (H - 1 - row_off) // sh + 1))
        s += 1
        if s == geo.filter_w:
            s = 0
            r += 1
            if r == geo.filter_h:
                r = 0
                c += 1
    n = jc // PQ
    pq = jc - n * PQ
    for panel_start in range(0, nc, NR):
        width = min(NR, nc - panel_start)
        n_runs, n, pq = cut_into_runs(runs, n, pq, width, PQ, Q, image, linear)
        row_start = panel_start * kc  # row 0 of this panel
        for p in range(kc):
            dst = row_start + p * NR
            if linear:
                pack_tap_linear(x, W, Q, taps[p], runs, n_runs, Bc, dst)
            else:
                pack_tap_by_rows(x, H, W, sh, sw, taps[p], runs, n_runs, Bc, dst)
            if width < NR:  # zero the columns past nc in the last panel
                fill_zeros_over(Bc, dst + width, NR - width)


@njit(cache=True, inline="always")
def cut_into_runs(runs, n, pq, width, PQ, Q, image, linear):
    """Cut ``width`` consecutive output pixels, from pixel ``pq`` of image ``n`` on, into runs of
    one output row (of one image when ``linear``): ``runs[i]`` = the image's offset in x, the
    first pixel's output row and column, the length. Returns ``(runs used, n, pq)``, ``n`` and
    ``pq`` advanced past the pixels."""
    n_runs = 0
    done = 0
    while done < width:
        oh = pq // Q
        ow = pq - oh * Q
        run = min(PQ - pq if linear else Q - ow, width - done)
        runs[n_runs, RUN_IMAGE] = n * image
        runs[n_runs, RUN_ROW] = oh
        runs[n_runs, RUN_COL] = ow
        runs[n_runs, RUN_LENGTH] = run
        n_runs += 1
        done += run
        pq += run
        if pq == PQ:
            pq = 0
            n += 1
    return n_runs, n, pq


#: Taps packed together by :func:`pack_b_pointwise`: that many channel streams read at once.
POINTWISE_TAP_BLOCK = 16


@njit(cache=True, inline="always")
def pack_b_pointwise(x, image, plane, first_channel, jc, nc, kc, NR, Bc):
    """:func:`pack_b_from_image` for a 1x1, stride-1, unpadded convolution, where B's row ``p`` is
    channel ``first_channel + p`` of the images, pixel after pixel: a plain GEMM packing.

    Blocks of :data:`POINTWISE_TAP_BLOCK` taps, panels inside, taps innermost: a few channel
    streams that the prefetcher follows, each panel written in runs of a block's rows, no
    per-tap bookkeeping. (The general routine, one short copy per panel and tap with its
    clipping, packed ResNet-50's 1x1 layers at 0.6-2.1 ns per element, 10-150% of the
    micro-kernel's time on them; all taps outer and panels inner wrote ``Bc`` at a stride of
    ``kc * NR`` elements, 32 KiB for ``kc = 256``, and thrashed L1's sets.)
    """
    lanes = vector_lanes(Bc)
    for p0 in range(0, kc, POINTWISE_TAP_BLOCK):
        p1 = min(kc, p0 + POINTWISE_TAP_BLOCK)
        n = jc // plane
        pq = jc - n * plane
        for panel_start in range(0, nc, NR):
            width = min(NR, nc - panel_start)
            row0 = panel_start * kc
            if width == NR and pq + NR <= plane:  # whole panel inside one image: vector copies
                src = n * image + first_channel * plane + pq
                for p in range(p0, p1):
                    for v in range(NR // lanes):
                        copy_vector(Bc, row0 + p * NR + v * lanes, x, src + p * plane + v * lanes)
                pq += NR
                if pq == plane:
                    pq = 0
                    n += 1
            elif width == NR and NR - (plane - pq) <= plane:  # the panel spans two images
                head = plane - pq
                src = n * image + first_channel * plane + pq
                tail = NR - head
                whole = tail // lanes * lanes
                for p in range(p0, p1):
                    # The head copy may write up to a vector past its end, which the tail copy
                    # then overwrites; the tail is copied in whole vectors and then element by
                    # element, so that nothing is written past the row (the next panel's rows
                    # of earlier tap blocks are already packed).
                    dst = row0 + p * NR
                    copy_run_over(x, src + p * plane, 1, Bc, dst, head)
                    tail_src = src + image - pq + p * plane
                    copy_run_over(x, tail_src, 1, Bc, dst + head, whole)
                    for t in range(whole, tail):
                        Bc[dst + head + t] = x[tail_src + t]
                pq = NR - head
                n += 1
                if pq == plane:
                    pq = 0
                    n += 1
            else:
                for p in range(p0, p1):
                    n_t, pq_t = n, pq
                    dst = row0 + p * NR
                    for t in range(width):
                        Bc[dst + t] = x[n_t * image + (first_channel + p) * plane + pq_t]
                        pq_t += 1
                        if pq_t == plane:
                            pq_t = 0
                            n_t += 1
                    if width < NR:
                        fill_zeros_over(Bc, dst + width, NR - width)
                pq += width
                while pq >= plane:
                    pq -= plane
                    n += 1


@njit(cache=True, inline="always")
def pack_b_pointwise_strided(x, image, plane, W, P, Q, sh, sw, first_channel, jc, nc, kc, NR, runs,
                             Bc):
    """:func:`pack_b_from_image` for a 1x1 convolution whose pixels all read inside the image
    (no padding on the top and left, none used on the bottom and right), any stride: the
    projection shortcuts (1x1, stride 2) of ResNets.

    B's row ``p`` is channel ``first_channel + p`` read at a stride. As in
    :func:`pack_b_pointwise`, blocks of :data:`POINTWISE_TAP_BLOCK` taps with panels inside and
    taps innermost, so that a few channel streams are read at a time (the general routine, every
    tap of a panel in turn, read up to KC channel planes at once and packed these layers at
    1.3 ns per element); each panel's pixels are cut into runs of one output row once per block
    (:func:`cut_into_runs`; ``runs``' first column then holds the run's first input address), and
    copied with :func:`copy_run_over`.
    """
    PQ = P * Q
    for p0 in range(0, kc, POINTWISE_TAP_BLOCK):
        p1 = min(kc, p0 + POINTWISE_TAP_BLOCK)
        n = jc // PQ
        pq = jc - n * PQ
        for panel_start in range(0, nc, NR):
            width = min(NR, nc - panel_start)
            n_runs, n, pq = cut_into_runs(runs, n, pq, width, PQ, Q, image, False)
            for i in range(n_runs):  # the runs' first input addresses, channel first_channel
                runs[i, RUN_IMAGE] += (first_channel * plane + runs[i, RUN_ROW] * sh * W
                                       + runs[i, RUN_COL] * sw)
            row0 = panel_start * kc
            lanes = vector_lanes(Bc)
            for p in range(p0, p1):
                dst = row0 + p * NR
                row_end = dst + NR
                for i in range(n_runs):
                    run = runs[i, RUN_LENGTH]
                    src = runs[i, RUN_IMAGE] + p * plane
                    if p == kc - 1 and dst + (run + lanes - 1) // lanes * lanes > row_end:
                        # The panel's last row: what a vector writes past it would land in the
                        # next panel's first rows, packed by the first block of taps already.
                        whole = run - run % lanes
                        copy_run_over(x, src, sw, Bc, dst, whole)
                        for t in range(whole, run):
                            Bc[dst + t] = x[src + t * sw]
                    else:
                        copy_run_over(x, src, sw, Bc, dst, run)
                    dst += run
                if width < NR:
                    fill_zeros_over(Bc, dst, NR - width)


@njit(cache=True, inline="always")
def pack_tap_by_rows(x, H, W, sh, sw, tap, runs, n_runs, Bc, dst):
    """One tap's row of a Bc panel, from runs of pixels within one output row."""
    tap_plane, row_off, col_off = tap[TAP_PLANE], tap[TAP_ROW_OFFSET], tap[TAP_COL_OFFSET]
    q_lo, q_hi = tap[TAP_Q_LO], tap[TAP_Q_HI]
    for i in range(n_runs):
        run = runs[i, RUN_LENGTH]
        ih = runs[i, RUN_ROW] * sh + row_off
        if ih < 0 or ih >= H:
            fill_zeros_over(Bc, dst, run)
        else:
            q0 = runs[i, RUN_COL]
            lo = min(run, max(0, q_lo - q0))
            hi = max(lo, min(run, q_hi - q0))
            if lo > 0:
                fill_zeros_over(Bc, dst, lo)
            copy_run_over(x, runs[i, RUN_IMAGE] + tap_plane + ih * W + (q0 + lo) * sw + col_off, sw,
                          Bc, dst + lo, hi - lo)
            if hi < run:
                fill_zeros_over(Bc, dst + hi, run - hi)
        dst += run


@njit(cache=True, inline="always")
def pack_tap_linear(x, W, Q, tap, runs, n_runs, Bc, dst):
    """One tap's row of a Bc panel when the input address is ``pixel + const`` (stride 1,
    ``W == Q``), from runs of pixels within one image."""
    tap_plane, row_off, col_off = tap[TAP_PLANE], tap[TAP_ROW_OFFSET], tap[TAP_COL_OFFSET]
    q_lo, q_hi = tap[TAP_Q_LO], tap[TAP_Q_HI]
    pix_lo, pix_hi = tap[TAP_P_LO] * Q, tap[TAP_P_HI] * Q  # pixels of the rows inside the image
    for i in range(n_runs):
        run = runs[i, RUN_LENGTH]
        pq0 = runs[i, RUN_ROW] * Q + runs[i, RUN_COL]
        src = runs[i, RUN_IMAGE] + tap_plane + pq0 + row_off * W + col_off  # address of pixel pq0
        a = min(run, max(0, pix_lo - pq0))
        b = max(a, min(run, pix_hi - pq0))
        # Reads outside x can only be padding columns (zeroed below): clip them off.
        a_in = min(b, max(a, -src))
        b_in = max(a_in, min(b, x.size - src))
        if a_in > 0:
            fill_zeros_over(Bc, dst, a_in)
        copy_run_over(x, src + a_in, 1, Bc, dst + a_in, b_in - a_in)
        if b_in < run:
            fill_zeros_over(Bc, dst + b_in, run - b_in)
        if q_lo > 0 or q_hi < Q:
            # The copy read the neighbouring row's pixels for the padding columns: zero them.
            pos = a
            ow = runs[i, RUN_COL] if a == 0 else 0
            while pos < b:
                in_row = min(Q - ow, b - pos)
                for t in range(pos, pos + min(in_row, q_lo - ow)):
                    Bc[dst + t] = 0
                for t in range(pos + max(0, q_hi - ow), pos + in_row):
                    Bc[dst + t] = 0
                pos += in_row
                ow = 0
        dst += run


def store_edge_tile(tile, NR, geo, row0, mr, col0, nr, mode, bias, y):
    """Write rows ``< mr`` and columns ``< nr`` of ``tile`` (the micro-kernel's ``MR x NR`` result,
    rows of ``NR``) to output channels ``row0 + i`` and pixels ``col0 + j`` of ``y`` (flat NCHW),
    in runs that stay in one image; ``mode`` as for :func:`micro_kernel`. Whole vectors, then a
    scalar tail (never past a run: the neighbouring pixels may belong to another thread).
    ``NR`` a compile-time constant. Callable from jitted code only."""
    raise NotImplementedError("store_edge_tile is called from numba-compiled code only")


@overload(store_edge_tile, prefer_literal=True)
def _store_edge_tile_overload(tile, NR, geo, row0, mr, col0, nr, mode, bias, y):
    if not isinstance(NR, types.IntegerLiteral):
        return None
    L = micro_kernel_lanes(1, NR.literal_value, y.dtype.bitwidth // 8)

    def store_edge_tile_impl(tile, NR, geo, row0, mr, col0, nr, mode, bias, y):
        PQ = geo.out_h * geo.out_w
        K = geo.out_channels
        n = col0 // PQ
        pq = col0 - n * PQ
        done = 0
        while done < nr:
            run = min(nr - done, PQ - pq)
            whole = run - run % L
            for i in range(mr):
                dst = (n * K + row0 + i) * PQ + pq
                src = i * NR + done
                if mode == ACCUMULATE:
                    for v in range(0, whole, L):
                        vector_add_into(y, dst + v, tile, src + v, L)
                    for t in range(whole, run):
                        y[np.uintp(dst + t)] += tile[np.uintp(src + t)]
                else:
                    b = bias[row0 + i] if mode == STORE_WITH_BIAS else 0.0
                    for v in range(0, whole, L):
                        vector_store_plus(y, dst + v, tile, src + v, b, L)
                    for t in range(whole, run):
                        y[np.uintp(dst + t)] = tile[np.uintp(src + t)] + b
            done += run
            pq = 0
            n += 1

    return store_edge_tile_impl


# ------------------------------------------------------------------------------------------
# The five loops
# ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def blis_kernel(MC: int, KC: int, NC: int, MR: int, NR: int):
    """The jitted driver for one row of the block-size table (any dtype, any problem shape)."""

    @njit(parallel=True, cache=True)
    def blis_conv2d(
        x,  # IN  (N*C*H*W,) flat NCHW
        w,  # IN  (K*C/groups*R*S,) flat
        bias, has_bias,  # IN  (K,) or a dummy when has_bias is False
        geo,  # IN  ConvGeometry
        kc_step,  # the pc loop's step (<= KC), from BlisBlocking.panel_sizes
        m_parts, n_parts,  # the threads' grid over the (M x Ngemm) output of each group
        Ac_ws,  # SCRATCH (threads, >= mc*kc)
        Bc_ws,  # SCRATCH (threads, >= kc*nc)
        tile_ws,  # SCRATCH (threads, MR*NR)
        taps_ws,  # SCRATCH (threads, kc, TAP_COLUMNS) int64
        runs_ws,  # SCRATCH (threads, NR, RUN_COLUMNS) int64
        y,  # OUT (N*K*P*Q,) flat NCHW
    ):
        M, Kg, Ng = geo.gemm_m, geo.gemm_k, geo.gemm_n
        PQ = geo.out_h * geo.out_w
        K = geo.out_channels
        m_tiles = (M + MR - 1) // MR
        n_tiles = (Ng + NR - 1) // NR
        first_mode = STORE_WITH_BIAS if has_bias else STORE
        for t in prange(Ac_ws.shape[0]):
            Ac, Bc, tile, taps, runs = Ac_ws[t], Bc_ws[t], tile_ws[t], taps_ws[t], runs_ws[t]
            mp, np_ = t // n_parts, t % n_parts
            # Whole register tiles per thread; threads beyond the grid get an empty range.
            m_lo = min(M, m_tiles * mp // m_parts * MR)
            m_hi = min(M, m_tiles * (mp + 1) // m_parts * MR)
            n_lo = min(Ng, n_tiles * np_ // n_parts * NR)
            n_hi = min(Ng, n_tiles * (np_ + 1) // n_parts * NR)
            for g in range(geo.groups):
                for jc in range(n_lo, n_hi, NC):
                    nc = min(NC, n_hi - jc)
                    for pc in range(0, Kg, kc_step):
                        kc = min(kc_step, Kg - pc)
                        pack_b_from_image(x, geo, g, jc, nc, pc, kc, NR, taps, runs, Bc)
                        mode = first_mode if pc == 0 else ACCUMULATE
                        for ic in range(m_lo, m_hi, MC):
                            mc = min(MC, m_hi - ic)
                            pack_a_from_filters(w, g * M + ic, mc, pc, kc, Kg, Ac, MR)
                            for jr in range(0, nc, NR):
                                nr = min(NR, nc - jr)
                                col = jc + jr
                                n = col // PQ
                                pq = col - n * PQ
                                whole_columns = nr == NR and pq + NR <= PQ
                                # Whole columns running into the next image (and no further).
                                two_images = nr == NR and not whole_columns and pq + NR <= 2 * PQ
                                for ir in range(0, mc, MR):
                                    mr = min(MR, mc - ir)
                                    row = g * M + ic + ir
                                    if whole_columns and mr == MR:
                                        y_off = (n * K + row) * PQ + pq
                                        micro_kernel(kc, Ac, ir * kc, Bc, jr * kc, y, y_off, PQ, mode,
                                                     bias, row, MR, NR)
                                    elif two_images and mr == MR:
                                        micro_kernel_split(kc, Ac, ir * kc, Bc, jr * kc, y,
                                                           (n * K + row) * PQ + pq,
                                                           ((n + 1) * K + row) * PQ, PQ - pq, PQ,
                                                           mode, bias, row, MR, NR)
                                    else:
                                        micro_kernel(kc, Ac, ir * kc, Bc, jr * kc, tile, 0, NR, STORE,
                                                     bias, 0, MR, NR)
                                        store_edge_tile(tile, NR, geo, row, mr, col, nr, mode, bias, y)

    return blis_conv2d


# ------------------------------------------------------------------------------------------
# Host side
# ------------------------------------------------------------------------------------------
#: Cost of packing one element, in FLOP-equivalents of micro-kernel work (for thread_split): a
#: plain copy (A; B of a 1x1 stride-1 layer) and B packed from the image through the general or
#: the strided routine (0.7-1 ns per element against 0.16-0.25 measured on the 2-core machine).
PACK_COST_FLOPS = 16
IMAGE_PACK_COST_FLOPS = 64


def packs_as_plain_gemm(problem: ConvProblem) -> bool:
    """Whether :func:`pack_b_from_image` takes its plain-GEMM path (:func:`pack_b_pointwise`)."""
    p = problem
    return (p.R == 1 and p.S == 1 and p.stride == (1, 1) and p.pad_top == 0 and p.pad_left == 0
            and p.P * p.Q == p.H * p.W)


def thread_split(problem: ConvProblem, blocking: BlisBlocking, threads: int) -> tuple[int, int]:
    """``(m_parts, n_parts)``, ``m_parts * n_parts == threads``: the grid of per-thread output
    rectangles that minimises the busiest thread's micro-kernel FLOPs plus packing."""
    b = blocking
    m_tiles = -(-problem.gemm_m // b.MR)
    n_tiles = -(-problem.gemm_n // b.NR)
    b_cost = PACK_COST_FLOPS if packs_as_plain_gemm(problem) else IMAGE_PACK_COST_FLOPS
    best = None
    for m_parts in range(1, threads + 1):
        if threads % m_parts:
            continue
        n_parts = threads // m_parts
        rows = -(-m_tiles // m_parts) * b.MR
        cols = -(-n_tiles // n_parts) * b.NR
        k = problem.gemm_k
        compute = 2 * rows * cols * k
        cost = compute + b_cost * k * cols + PACK_COST_FLOPS * rows * k * -(-cols // b.NC)
        if best is None or cost < best[0]:
            best = (cost, m_parts, n_parts)
    return best[1], best[2]


def allocate_workspace(problem: ConvProblem, blocking: BlisBlocking, threads: int) -> dict:
    """The per-thread scratch arrays of the driver, in its argument order (``Ac_ws``, ``Bc_ws``,
    ``tile_ws``, ``taps_ws``, ``runs_ws``); their bytes are ``blocking.workspace_bytes(problem,
    threads)``."""
    dtype = np.dtype(problem.dtype)
    mc, kc, nc = blocking.panel_sizes(problem)
    return {
        "Ac_ws": np.empty((threads, mc * kc), dtype),
        "Bc_ws": np.empty((threads, kc * nc + VECTOR_SLACK_BYTES // dtype.itemsize), dtype),
        "tile_ws": np.empty((threads, blocking.MR * blocking.NR), dtype),
        "taps_ws": np.empty((threads, kc, TAP_COLUMNS), np.int64),
        "runs_ws": np.empty((threads, blocking.NR, RUN_COLUMNS), np.int64),
    }


def conv2d(problem: ConvProblem, x, w, bias, device=None, *, blocking: BlisBlocking | None = None,
           threads: int | None = None):
    """Convolution by the BLIS five-loop GEMM with implicit im2col (see the module docstring).

    Parameters
    ----------
    problem : ConvProblem
    x : numpy.ndarray, shape (N, C, H, W)
    w : numpy.ndarray, shape (K, C // groups, R, S)
    bias : numpy.ndarray, shape (K,), or None
    device : None
        Unused on the CPU.
    blocking : BlisBlocking, optional
        Block sizes to use instead of the table's (for tuning and tests).
    threads : int, optional
        Work partitions (each with its own workspace); default ``numba.get_num_threads()``. More
        partitions than threads is allowed (tests use it to reach other thread grids).

    Returns
    -------
    numpy.ndarray, shape (N, K, P, Q)
    """
    dtype = np.dtype(problem.dtype)
    if problem.N == 0:
        return np.empty(problem.y_shape, dtype)
    b = blocking or blis_blocking(problem.dtype)
    threads = threads or get_num_threads()
    workspace = allocate_workspace(problem, b, threads)
    m_parts, n_parts = thread_split(problem, b, threads)
    y = output_cache.empty(problem.y_shape, dtype)
    has_bias = bias is not None
    bias_arr = np.ascontiguousarray(bias, dtype) if has_bias else np.zeros(1, dtype)
    kernel = blis_kernel(b.MC, b.KC, b.NC, b.MR, b.NR)
    kernel(
        np.ascontiguousarray(x, dtype).reshape(-1), np.ascontiguousarray(w, dtype).reshape(-1),
        bias_arr, has_bias, geometry_of(problem), b.panel_sizes(problem)[1], m_parts, n_parts,
        *workspace.values(), y.reshape(-1),
    )
    return y
