"""Winograd F(2x2,3x3) and F(4x4,3x3) convolution on the CPU, all in numba.

The method (Lavin & Gray 2015; matrices in :mod:`convlib.core.winograd_math`), ``alpha = m + 2``:

1. **Filter transform**, once per call: ``U[pos, g, k, c] = (G w[g*Kg + k, c] G^T)[pos]`` for the
   ``alpha**2`` tile positions ``pos``, computed in float64 and rounded once to the working dtype.
   Rows ``k`` are padded with zeros to a multiple of the micro-kernel's ``MR``.
2. Then per chunk of tiles (``T`` tiles, padded to a multiple of ``NR``):

   a. **Input transform** ``V[pos, c, t] = (B^T d_t B)[pos]`` for the ``alpha x alpha`` input tile
      ``d_t`` of every tile (tiles overlap by 2; padding is read as zeros). The input rows of all
      tile rows of the chunk are laid end to end, so both 1-D passes (down the columns, then
      along the rows) run along every tile of the chunk at once, however narrow the image.
   b. **Batched GEMM**, one per tile position and group:
      ``M[pos, g] (Kg x T) = U[pos, g] (Kg x Cg) @ V[pos, g] (Cg x T)``, by an ``MR x NR``
      register-tiled micro-kernel (the ``winograd_register_tile`` knob) whose accumulators stay
      in registers.
   c. **Output transform** ``y = A^T m_t A + bias`` per tile, along every tile of the chunk; the
      partial tiles at the bottom and right edges store only their existing outputs.

When all tiles make one chunk (deep layers with few tiles, such as ResNet-50's 7x7x512 layer,
whose ``U`` of 37.7 MB outgrows the last-level cache), steps 1 and 2b are one pass instead
(:func:`fused_filter_gemm_kernel`): each thread transforms a block of filters (the
``winograd_filter_block_bytes`` knob) into its own buffer and multiplies it at once, so ``U`` never
goes to memory and back.

The transforms live in :mod:`convlib.cpu.winograd_transforms`; this module holds the GEMM, the
chunking and the call.

Non-finite values: the transforms mix every input of a tile into every output of the tile, so one
``inf`` or ``NaN`` input would make outputs with a finite receptive field ``NaN``. The output
transform flags any non-finite output (a vectorised ``v - v != 0`` over values still in cache),
and the call then recomputes the non-finite outputs by the definition (:mod:`convlib.cpu.exact`):
the result is non-finite exactly where the definition's is.

Chunks are whole tile rows (or part of one row when a single row is too big), sized so that
``V + M`` stays near the ``winograd_chunk_bytes`` knob (or the size of ``U`` when larger)
whatever N, H and W are: the workspace is ``U`` (or one filter block per thread) plus one chunk
(:meth:`WinogradAlgorithm.workspace_bytes`), kept per thread between calls up to
``winograd_keep_workspace_bytes``. No BLAS is called: numba's and OpenBLAS's thread pools fight
when they alternate, and the per-position GEMMs are small. ``docs/algorithms.md`` has the
measured accuracy and speed.

Compilation: the GEMM is specialised (``lru_cache``) per register tile, the transforms per tile
size, and all of them through the array types per dtype; shapes are run-time arguments, so a new
problem shape costs nothing. Everything is compiled with ``cache=True``: a cold compile of both
tile sizes and dtypes takes minutes, a new process then loads the kernels from the disk cache in
about a second. The generated GEMM tile (:mod:`convlib.cpu.codegen`) is compiled into its
caller's cache entry.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass

import numpy as np
from numba import njit, parallel_chunksize, prange, types
from numba.extending import overload

from ..core import output_cache
from ..core.winograd_math import WinogradTile
from .codegen import PER_ROW, PER_ROW_VECTOR, PER_VECTOR_ROW, exec_function, render
from .compiled_once import CompiledOnce, array_type, call_body, declare, release, share
from .exact import repair_nonfinite
from .intrinsics import vector_copy, vector_fma, vector_zero
from .micro_kernels import micro_kernel_lanes
from .stack_buffer import stack_array_1d
from .tables import KNOBS
from .threads import thread_count
from .winograd_transforms import (
    part_range,
    filter_transform_kernel,
    input_transform_kernel,
    output_transform_kernel,
    transform_filter,
)


# -- batched GEMM -------------------------------------------------------------------------------
_GEMM_TILE_TEMPLATE = f'''
def gemm_tile_{{MR}}x{{NR}}(depth, a, a_off, lda, b, b_off, ldb, c, c_off, ldc, rows, MR, NR):
    # Explicit {{L}}-lane vectors on a stack tile that LLVM keeps in registers (as blis's
    # micro-kernel): per reduction step NR/{{L}} vector loads of b, MR broadcasts of a, MR*NR/{{L}}
    # FMAs. The loop-vectorised form built 5x16 with 5 accumulators and a broadcast folded into
    # every FMA, latency-bound at half the FMA peak.
    acc = stack_array_1d({{MR}} * {{NR}}, c.dtype)
    vector_zero(acc, {{o}}, {{L}})  {PER_ROW_VECTOR}
    a{{i}}p = a_off + {{i}} * lda  {PER_ROW}
    bp = b_off
    for p in range(depth):
        vector_fma(acc, {{o}}, a, a{{i}}p + p, b, bp + {{j}}, {{L}})  {PER_VECTOR_ROW}
        bp += ldb
    if {{i}} < rows: vector_copy(c, c_off + {{i}} * ldc + {{j}}, acc, {{o}}, {{L}})  {PER_ROW_VECTOR}
'''


def render_gemm_tile(MR: int, NR: int, L: int) -> str:
    """Source of the ``MR x NR`` micro-kernel with ``L``-lane vectors."""
    return render(_GEMM_TILE_TEMPLATE, MR, NR, L)


@functools.lru_cache(maxsize=None)
def _gemm_tile_function(MR: int, NR: int, L: int):
    namespace = {"stack_array_1d": stack_array_1d, "vector_zero": vector_zero, "vector_fma": vector_fma,
                 "vector_copy": vector_copy}
    return exec_function(render_gemm_tile(MR, NR, L), f"gemm_tile_{MR}x{NR}", namespace, "winograd")


def gemm_tile(depth, a, a_off, lda, b, b_off, ldb, c, c_off, ldc, rows, MR, NR):
    """``c[c_off + i*ldc + j] = sum_p a[a_off + i*lda + p] * b[b_off + p*ldb + j]``.

    For ``i < rows <= MR`` (rows ``rows..MR-1`` of ``a`` are read but not stored), ``j < NR``,
    ``p < depth``. ``MR`` and ``NR`` must be compile-time constants. Jitted code only; the source
    is generated (:func:`render_gemm_tile`) and compiled into, and cached with, its caller.
    """
    raise NotImplementedError("gemm_tile is called from numba-compiled code only")


@overload(gemm_tile, prefer_literal=True, jit_options={"fastmath": {"contract"}})
def _gemm_tile_overload(depth, a, a_off, lda, b, b_off, ldb, c, c_off, ldc, rows, MR, NR):
    if not (isinstance(MR, types.IntegerLiteral) and isinstance(NR, types.IntegerLiteral)):
        return None  # numba retries with the literal types
    mr, nr = MR.literal_value, NR.literal_value
    return _gemm_tile_function(mr, nr, micro_kernel_lanes(mr, nr, c.dtype.bitwidth // 8))


@functools.lru_cache(maxsize=None)
def batched_gemm_kernel(MR: int, NR: int, dtype: str):
    """The batched GEMM ``M[pos, g] = U[pos, g] @ V[pos, g]`` for the register tile ``MR x NR``
    and ``dtype``::

        batched_gemm(U, V, M, Kg)

    U : (positions, groups, Kpad, Cg)  IN   Kpad a multiple of MR, zero rows past Kg
    V : (positions, C, Tpad)           IN   Tpad a multiple of NR
    M : (positions, K, Tpad)           OUT  rows of group g at g*Kg .. g*Kg + Kg - 1

    The loop's body is compiled once (:mod:`.compiled_once`).
    """
    flat = array_type(dtype, 1)
    i64 = types.int64
    ARGUMENTS = declare(types.Tuple((flat, flat, flat) + (i64,) * 8))

    def item_body(u_flat, v_flat, m_flat, groups, row_blocks, Kpad, Cg, Tpad, C, K, Kg, item):
        pg = item // row_blocks
        kb = item - pg * row_blocks
        pos = pg // groups
        g = pg - pos * groups
        rows = min(MR, Kg - kb * MR)
        a_off = (pg * Kpad + kb * MR) * Cg
        b_off = (pos * C + g * Cg) * Tpad
        c_off = (pos * K + g * Kg + kb * MR) * Tpad
        for j0 in range(0, Tpad, NR):
            gemm_tile(Cg, u_flat, a_off, Cg, v_flat, b_off + j0, Tpad, m_flat, c_off + j0, Tpad,
                      rows, MR, NR)

    @njit(parallel=True, cache=True)
    def batched_gemm(U, V, M, Kg, body):
        positions, groups, Kpad, Cg = U.shape
        Tpad = V.shape[2]
        row_blocks = Kpad // MR
        C, K = V.shape[1], M.shape[1]
        shared = share((U.ravel(), V.ravel(), M.ravel(), groups, row_blocks, Kpad, Cg, Tpad, C, K, Kg), ARGUMENTS)
        for item in prange(positions * groups * row_blocks):
            call_body(body, shared, item, ARGUMENTS)
        release(shared, ARGUMENTS)

    return CompiledOnce(batched_gemm, item_body, ARGUMENTS, fastmath={"contract"})


@functools.lru_cache(maxsize=None)
def fused_filter_gemm_kernel(m: int, MR: int, NR: int, dtype: str):
    """The filter transform and the batched GEMM in one pass, for calls whose tiles make one
    chunk: each thread transforms a block of filters into its own buffer and multiplies it at
    once, so ``U`` is never written whole (ResNet-50's 7x7x512 layer: 37.7 MB that went to memory
    and came back)::

        fused_filter_gemm(w, V, M, blocks, block_tiles)

    w : (K, Cg, 3, 3)                                   IN
    V : (alpha**2, C, Tpad)                             IN   Tpad a multiple of NR
    M : (alpha**2, K, Tpad)                             OUT
    blocks : (parts, alpha**2 * block_tiles * MR * Cg)  SCRATCH one part's transformed filters,
        ``[pos, row, c]``: up to ``block_tiles`` register tiles of rows of one group at a time

    Part ``p`` takes a contiguous range of the groups' ``MR``-row tiles, in blocks. The part's
    body is compiled once (:mod:`.compiled_once`): as a ``prange`` body each tile took 17-26 s to
    compile on a Zen 3.
    """
    alpha = m + 2
    positions = alpha * alpha
    flat = array_type(dtype, 1)
    i64 = types.int64
    ARGUMENTS = declare(types.Tuple((flat, flat, flat, array_type(dtype, 2)) + (i64,) * 8))

    def part_body(w_flat, v_flat, m_flat, blocks, C, K, Tpad, Cg, groups, Kg, group_tiles, block_tiles, part):
        parts = blocks.shape[0]
        pos_stride = block_tiles * MR * Cg
        u = blocks[part]
        rows = np.empty(alpha * 3 * Cg)  # the filter transform's float64 scratch
        lo, hi = part_range(part, parts, groups * group_tiles)
        t = lo
        while t < hi:
            g = t // group_tiles
            first = t - g * group_tiles
            n_tiles = min(block_tiles, hi - t, group_tiles - first)
            k0 = first * MR
            nk = min(n_tiles * MR, Kg - k0)
            for i in range(nk):
                transform_filter(m, w_flat, (g * Kg + k0 + i) * Cg * 9, Cg, rows, u, i * Cg, pos_stride)
            for pos in range(positions):  # rows the last tile computes and drops: zeros, not garbage
                u[pos * pos_stride + nk * Cg: pos * pos_stride + n_tiles * MR * Cg] = 0
            for pos in range(positions):
                b_off = (pos * C + g * Cg) * Tpad
                for tile in range(n_tiles):
                    r0 = tile * MR
                    a_off = pos * pos_stride + r0 * Cg
                    c_off = (pos * K + g * Kg + k0 + r0) * Tpad
                    stored = min(MR, nk - r0)
                    for j0 in range(0, Tpad, NR):
                        gemm_tile(Cg, u, a_off, Cg, v_flat, b_off + j0, Tpad, m_flat, c_off + j0, Tpad,
                                  stored, MR, NR)
            t += n_tiles

    @njit(parallel=True, cache=True)
    def fused_filter_gemm(w, V, M, blocks, block_tiles, body):
        C, K, Tpad = V.shape[1], M.shape[1], V.shape[2]
        Cg = w.shape[1]
        groups = C // Cg
        Kg = K // groups
        group_tiles = -(-Kg // MR)
        shared = share((w.ravel(), V.ravel(), M.ravel(), blocks, C, K, Tpad, Cg, groups, Kg, group_tiles,
                        block_tiles), ARGUMENTS)
        for part in prange(blocks.shape[0]):
            call_body(body, shared, part, ARGUMENTS)
        release(shared, ARGUMENTS)

    return CompiledOnce(fused_filter_gemm, part_body, ARGUMENTS, fastmath={"contract"})


# -- workspace ----------------------------------------------------------------------------------
_kept = threading.local()


def _workspace(name: str, shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array, reusing this thread's buffer ``name`` when it fits.

    Buffers of at most ``winograd_keep_workspace_bytes`` (a knob) are kept for the next call (one per name and
    thread, so concurrent calls from several Python threads never share one).
    """
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > KNOBS.winograd_keep_workspace_bytes:
        return np.empty(shape, dtype)
    buffers = getattr(_kept, "buffers", None)
    if buffers is None:
        buffers = _kept.buffers = {}
    raw = buffers.get(name)
    if raw is None or raw.size < nbytes:
        raw = buffers[name] = np.empty(max(nbytes, 1), np.uint8)
    # The view starts where a fresh allocation of the buffer would: same alignment.
    return raw[:nbytes].view(dtype).reshape(shape)


# -- the algorithm objects ----------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkPlan:
    """How the tiles of one call are split into chunks.

    A chunk is ``rows`` consecutive global tile rows (tile row ``ty`` of image ``n`` is global
    row ``n * tiles_h + ty``) and, within each, tile columns ``tx0 .. tx0 + cols - 1``. Either
    ``cols == tiles_w`` (whole rows) or ``rows == 1`` (one row split in pieces). ``NR`` is the
    micro-kernel's tile width, to which each chunk's tile count is padded.
    """

    tiles_h: int
    tiles_w: int
    rows: int
    cols: int
    NR: int

    @property
    def padded_tiles(self) -> int:
        """Tiles per chunk rounded up to whole micro-kernel tiles: the GEMMs' column count."""
        return -(-self.rows * self.cols // self.NR) * self.NR

    def chunks(self, n_images: int):
        """Yield ``(row0, nrows, tx0, ncols)`` covering every tile of ``n_images`` images once."""
        total_rows = n_images * self.tiles_h
        for row0 in range(0, total_rows, self.rows):
            nrows = min(self.rows, total_rows - row0)
            for tx0 in range(0, self.tiles_w, self.cols):
                yield row0, nrows, tx0, min(self.cols, self.tiles_w - tx0)

    def count(self, n_images: int) -> int:
        """How many chunks :meth:`chunks` yields for ``n_images`` images."""
        return -(-n_images * self.tiles_h // self.rows) * -(-self.tiles_w // self.cols)


def _rows_per_chunk(total_rows: int, tiles_w: int, most: int, NR: int) -> int:
    """Tile rows per chunk, at most ``most`` and at least half of it: the count whose chunks,
    each padded to whole ``NR`` columns, carry the fewest padding tiles through the GEMM (fewer
    chunks on a tie: each streams all of ``U``). ResNet-50's 28x28 layer at batch 8 has 56 rows of
    7 tiles: 14 rows a chunk pad 98 tiles to 128 for ``NR = 32``, 13 rows pad 91 to 96."""
    def padded(tiles):
        return -(-tiles // NR) * NR

    def padded_total(rows):
        whole, last = divmod(total_rows, rows)
        return whole * padded(rows * tiles_w) + padded(last * tiles_w), -(-total_rows // rows)

    return min(range(max(1, (most + 1) // 2), most + 1), key=padded_total)


def register_tile(dtype: str) -> tuple[int, int]:
    """``(MR, NR)`` of the GEMM micro-kernel for ``dtype`` (the ``winograd_register_tile`` knob)."""
    return KNOBS.lookup("winograd_register_tile", dtype)


class WinogradAlgorithm(WinogradTile):
    """Winograd F(m x m, 3 x 3) on the CPU; an implementation (:mod:`convlib.core.contracts`).

    Parameters
    ----------
    m : int
        Output tile size: 2 (F(2x2,3x3), alpha = 4) or 4 (F(4x4,3x3), alpha = 6).
    """

    def __repr__(self) -> str:
        return f"<convlib.cpu.winograd {self.title}>"

    def chunk_plan(self, problem, chunk_bytes: int | None = None) -> ChunkPlan:
        """The chunking of ``problem``'s tiles that keeps ``V + M`` near ``chunk_bytes``.

        ``chunk_bytes`` defaults to the ``winograd_chunk_bytes`` knob; it is raised to the size of ``U`` when
        that is larger, since every chunk streams all of ``U`` through the GEMM (so the chunk
        workspace never exceeds the filters' share and ``U`` is read at most twice per chunk's
        worth of ``V + M``). Chunks hold at least one tile, and the tile rows are spread evenly
        over the chunks (so the last one is not a stub).
        """
        chunk_bytes = KNOBS.winograd_chunk_bytes if chunk_bytes is None else chunk_bytes
        chunk_bytes = max(chunk_bytes, self.filter_bytes(problem))
        NR = register_tile(problem.dtype)[1]
        tiles_h, tiles_w = self.tiles(problem)
        per_tile = self.alpha**2 * (problem.C + problem.K) * problem.itemsize
        budget = max(1, chunk_bytes // per_tile)
        if budget < tiles_w:
            pieces = -(-tiles_w // budget)
            return ChunkPlan(tiles_h, tiles_w, 1, -(-tiles_w // pieces), NR)
        total_rows = max(problem.N, 1) * tiles_h
        most = min(total_rows, budget // tiles_w)
        return ChunkPlan(tiles_h, tiles_w, _rows_per_chunk(total_rows, tiles_w, most, NR), tiles_w, NR)

    def filter_bytes(self, problem) -> int:
        """Bytes of the transformed filters ``U`` (rows padded to the micro-kernel's ``MR``)."""
        MR = register_tile(problem.dtype)[0]
        Kpad = -(-problem.K_per_group // MR) * MR
        return self.alpha**2 * problem.groups * Kpad * problem.C_per_group * problem.itemsize

    def fuses_filters(self, problem, plan: ChunkPlan) -> bool:
        """Whether the call transforms the filters block by block inside the GEMM
        (:func:`fused_filter_gemm_kernel`) instead of into a whole ``U``: when its tiles make one
        chunk, so ``U`` would be read once."""
        return plan.count(max(problem.N, 1)) == 1

    def filter_block_tiles(self, problem) -> int:
        """Register tiles (``MR`` filters each) of one thread's block of transformed filters in
        the fused pass: as many as fit the ``winograd_filter_block_bytes`` knob, at least one."""
        MR = register_tile(problem.dtype)[0]
        per_tile = self.alpha**2 * MR * problem.C_per_group * problem.itemsize
        group_tiles = -(-problem.K_per_group // MR)
        return max(1, min(group_tiles, KNOBS.winograd_filter_block_bytes // per_tile))

    def filter_block_elements(self, problem) -> int:
        """Elements of one thread's block of transformed filters in the fused pass: ``alpha**2 *
        MR * Cg`` per register tile of :meth:`filter_block_tiles`."""
        MR = register_tile(problem.dtype)[0]
        return self.alpha**2 * self.filter_block_tiles(problem) * MR * problem.C_per_group

    def workspace_bytes(self, problem, device=None, *, chunk_bytes: int | None = None) -> int:
        """Bytes allocated beyond x, w, bias and y: the transformed filters plus one chunk's ``V``
        and ``M``.

        The filters are ``U``, ``alpha**2 * groups * Kpad * Cg`` elements (``Kpad`` the rows per
        group rounded up to the micro-kernel's ``MR``), or, when they are fused into the GEMM
        (:meth:`fuses_filters`), one block per thread (:meth:`filter_block_elements`). ``V`` and ``M`` are ``alpha**2 * (C + K) * Tpad``
        elements, ``Tpad`` the chunk's tiles rounded up to ``NR`` (see :meth:`chunk_plan`). The
        per-thread scratch rows of the transforms (``O(alpha * width of a chunk)``) are not counted.
        """
        plan = self.chunk_plan(problem, chunk_bytes)
        chunk = self.alpha**2 * (problem.C + problem.K) * plan.padded_tiles * problem.itemsize
        if self.fuses_filters(problem, plan):
            return thread_count() * self.filter_block_elements(problem) * problem.itemsize + chunk
        return self.filter_bytes(problem) + chunk

    def run(self, problem, x, w, bias, device=None):
        """The convolution of ``x`` with ``w`` (the implementation contract of
        :mod:`convlib.core.contracts`)."""
        dtype = np.dtype(problem.dtype)
        y = output_cache.empty(problem.y_shape, dtype)
        if y.size == 0:
            return y
        threads = thread_count()
        launch = _launch(self, problem, threads)
        U = _workspace("U", launch.u_shape, dtype)
        if not launch.fused:
            # Dynamic scheduling (chunks of one part) instead of numba's static split: on a shared
            # machine a thread that loses its core would otherwise hold up the whole pass.
            with parallel_chunksize(1):
                launch.filter_transform(w, U, threads)
        # Flat buffers: each chunk views the front of them as (a2, C, Tpad).
        V_buffer = _workspace("V", (launch.v_elements,), dtype)
        M_buffer = _workspace("M", (launch.m_elements,), dtype)
        bias_or_zeros = bias if bias is not None else launch.zero_bias
        nonfinite = np.zeros(1, np.int64)
        a2, C, K = self.alpha**2, problem.C, problem.K
        for row0, nrows, tx0, ncols, Tpad in launch.chunks:
            V = V_buffer[: a2 * C * Tpad].reshape(a2, C, Tpad)
            M = M_buffer[: a2 * K * Tpad].reshape(a2, K, Tpad)
            with parallel_chunksize(1):
                launch.input_transform(x, V, launch.tiles_h, row0, nrows, tx0, ncols, problem.pad_top,
                                       problem.pad_left, threads)
            if launch.fused:
                launch.gemm(w, V, M, U, launch.block_tiles)
            else:
                with parallel_chunksize(KNOBS.winograd_gemm_schedule_chunk):
                    launch.gemm(U, V, M, problem.K_per_group)
            with parallel_chunksize(1):
                launch.output_transform(M, y, bias_or_zeros, launch.tiles_h, row0, nrows, tx0, ncols, threads,
                                        nonfinite)
        if nonfinite[0]:
            # An inf or NaN input (or an overflow) spreads over its tiles: recompute the
            # non-finite outputs by the definition (module cpu/exact.py says why that suffices).
            repair_nonfinite(problem, x, w, bias, y)
        return y


@dataclass(frozen=True)
class _Launch:
    """Everything of a call of :meth:`WinogradAlgorithm.run` but its arrays, computed once per
    algorithm, problem, thread count and knob state (:func:`_launch`): recomputing it was most of
    the ~70 us of Python a call spent around its kernels."""

    tiles_h: int
    chunks: tuple  # (row0, nrows, tx0, ncols, Tpad) per chunk, Tpad its tiles padded to NR
    fused: bool  # filters transformed block by block inside the GEMM
    block_tiles: int  # register tiles of one thread's filter block (fused)
    u_shape: tuple  # of U, or of the threads' filter blocks (fused)
    v_elements: int
    m_elements: int
    filter_transform: object
    input_transform: object
    gemm: object  # fused_filter_gemm(w, V, M, U, block_tiles) or batched_gemm(U, V, M, Kg)
    output_transform: object
    zero_bias: np.ndarray  # the bias of a call without one


@KNOBS.cached
def _launch(algorithm: WinogradAlgorithm, problem, threads: int) -> _Launch:
    """The :class:`_Launch` of ``problem`` by ``algorithm`` on ``threads`` threads."""
    a2 = algorithm.alpha**2
    MR, NR = register_tile(problem.dtype)
    Kg = problem.K_per_group
    plan = algorithm.chunk_plan(problem)
    fused = algorithm.fuses_filters(problem, plan)
    block_tiles = algorithm.filter_block_tiles(problem) if fused else 0
    if fused:
        u_shape = (threads, algorithm.filter_block_elements(problem))
        gemm = fused_filter_gemm_kernel(algorithm.m, MR, NR, problem.dtype)
    else:
        u_shape = (a2, problem.groups, -(-Kg // MR) * MR, problem.C_per_group)
        gemm = batched_gemm_kernel(MR, NR, problem.dtype)
    chunks = tuple((row0, nrows, tx0, ncols, -(-nrows * ncols // NR) * NR)
                   for row0, nrows, tx0, ncols in plan.chunks(problem.N))
    return _Launch(
        tiles_h=plan.tiles_h, chunks=chunks, fused=fused, block_tiles=block_tiles, u_shape=u_shape,
        v_elements=a2 * problem.C * plan.padded_tiles, m_elements=a2 * problem.K * plan.padded_tiles,
        filter_transform=filter_transform_kernel(algorithm.m, problem.dtype),
        input_transform=input_transform_kernel(algorithm.m, problem.dtype),
        gemm=gemm, output_transform=output_transform_kernel(algorithm.m, problem.dtype),
        zero_bias=np.zeros(problem.K, np.dtype(problem.dtype)),
    )


#: F(2x2,3x3): 16 tile positions, 2.25x fewer multiplications than direct.
F2 = WinogradAlgorithm(2)
#: F(4x4,3x3): 36 tile positions, 4x fewer multiplications than direct.
F4 = WinogradAlgorithm(4)
