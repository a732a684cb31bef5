"""convlib on Dask arrays: a :class:`dask.array.Array` in, a lazy :class:`dask.array.Array` out.

:func:`convlib.conv2d` and its backward passes call into this module when an argument is a Dask
array (:func:`is_dask_array`, judged from the type's module, so ``import convlib`` never imports
dask). The whole problem is validated once, on shapes, by the same functions as for numpy
input, so the errors are the same; then every block runs the in-memory function that ``api``
passes in (validation, ``algo=`` and ``device=`` apply per block; CuPy chunks run on the CUDA
backend where they live).

How a forward convolution is cut (:class:`ChunkPlan`, docs/dask.md has the figure):

* batch chunks map block by block;
* along H and W the whole image is padded once, the input chunk boundaries are moved down to
  multiples of the stride, and each block gets the ``dilation*(R-1)+1-stride`` rows (columns)
  of its successor that its last output rows read: a far-side-only halo, no padding at inner
  borders;
* chunks along C give partial sums, added by a tree reduction (``split_every``), as dask's own
  matmul does; with ``groups > 1`` a C chunk must hold whole groups and then maps to the K range
  of those groups (no sum);
* chunks of ``w`` along K (``groups == 1``) split the filters and the output channels;
* the bias is added once, after the sum.

The backward passes reuse that plan: the weight pass cuts ``x`` by it (N, H, W) and reduces one
partial ``dw`` per block by a tree reduction; the data pass and ``conv_transpose2d`` map batch
chunks block by block and, at stride 1, run chunks along channels, H and W as the equivalent
forward convolution (flipped, transposed filters). A chunking a pass cannot serve is a
``NotImplementedError`` that says what can.

Options: blocks run later, in dask's threads or worker processes, which a caller's
``option_context`` (per thread) does not reach; every block runs under the ``workspace_cap``
and ``allow_tf32`` in force where the graph was built (:func:`_with_options`).

Threads: each block limits numba to ``NUMBA_NUM_THREADS // dask threads of its worker`` threads
(:func:`task_threads`), so numba threads x dask threads <= the cores a worker was given.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from itertools import accumulate

import dask
import dask.array as da
import numpy as np
from dask.array.overlap import overlap

from .core.options import option_context, options
from .core.problem import (
    ConvProblem, array_dtype, make_backward_bias_problem, make_backward_data_problem, make_backward_weight_problem,
    make_problem, make_transpose_problem,
)
from .dispatch.devices import array_backend, host_array
from .dispatch.plan import make_plan

__all__ = ["ChunkPlan", "chunk_plan", "forward_plan", "is_dask_array", "task_threads", "conv2d", "conv2d_backward_data",
           "conv2d_backward_weight", "conv2d_backward_bias", "conv_transpose2d"]

#: How many partial sums one task of the tree reduction adds (dask's default is 4 for sums;
#: 8 halves the depth for the few C chunks a convolution has, at most 8 blocks in memory per task).
SPLIT_EVERY = 8


def is_dask_array(arr) -> bool:
    """Whether ``arr`` is a Dask array, judged from its type alone (dask is not imported)."""
    return arr is not None and type(arr).__module__.split(".")[0] == "dask" and hasattr(arr, "chunks")


# -- threads -------------------------------------------------------------------------------------

def _dask_threads_here() -> int:
    """The number of dask threads that may run tasks at once in this process."""
    try:
        from distributed import get_worker
        worker = get_worker()
    except (ImportError, ValueError):
        worker = None
    if worker is not None:
        return int(getattr(getattr(worker, "state", worker), "nthreads", 1))
    if threading.current_thread() is threading.main_thread():
        return 1  # the synchronous scheduler, or a direct call
    return int(dask.config.get("num_workers", None) or os.cpu_count() or 1)


#: Serialises the kernels of concurrent tasks when numba's ``workqueue`` layer was already
#: launched in this process (it aborts when two threads enter it at once).
_WORKQUEUE_LOCK = threading.Lock()


def _layer_guard():
    """A context that makes concurrent parallel kernels safe: before numba launches its threading
    layer, ask for a thread-safe one (``tbb`` or ``omp``: numba's error, not an abort, if neither
    loads); once ``workqueue`` runs, a lock."""
    import numba
    from numba.np.ufunc import parallel

    if not parallel._is_initialized:
        if numba.config.THREADING_LAYER == "default":
            numba.config.THREADING_LAYER = "threadsafe"
        return nullcontext()
    return _WORKQUEUE_LOCK if numba.threading_layer() == "workqueue" else nullcontext()


@contextmanager
def task_threads():
    """Run the body with ``max(1, cores // dask threads)`` numba threads on this thread.

    ``numba.set_num_threads`` is a per-thread setting, so concurrent tasks of one worker each
    set their own; the previous value is restored. ``cores`` is ``NUMBA_NUM_THREADS`` (the
    machine's cores unless set), which distributed does not lower in its workers: on a host
    with several workers, give each its share (``env={"NUMBA_NUM_THREADS": ...}`` of the worker).
    """
    import numba

    guard = _layer_guard()  # first: get_num_threads launches the threading layer
    cores = numba.config.NUMBA_NUM_THREADS
    wanted = max(1, cores // max(1, _dask_threads_here()))
    before = numba.get_num_threads()
    numba.set_num_threads(min(wanted, cores))
    try:
        with guard:
            yield
    finally:
        numba.set_num_threads(before)


# -- the chunk plan ------------------------------------------------------------------------------

@dataclass(frozen=True)
class AxisPlan:
    """How one spatial axis (H or W) of a forward convolution is cut.

    Parameters
    ----------
    name : str
        ``"H"`` or ``"W"``.
    input_chunks : tuple of int
        The padded input's chunks: every boundary a multiple of the stride; the padding before
        the image is in the first chunk, the padding after it in the last.
    halo : int
        Rows (columns) of the next chunk each block reads: ``dilation*(R-1)+1-stride``, at least 0.
    output_chunks : tuple of int
        The output rows (columns) of each block.
    pad : (int, int)
        Zeros added before and after the whole image, once.
    """

    name: str
    input_chunks: tuple[int, ...]
    halo: int
    output_chunks: tuple[int, ...]
    pad: tuple[int, int]

    @property
    def extra_reads(self) -> int:
        """Halo rows read a second time (every block but the last reads one halo)."""
        return self.halo * (len(self.input_chunks) - 1)


def _axis_plan(name, chunks, pad, stride, dilation, taps, n_out) -> AxisPlan:
    size = sum(chunks) + pad[0] + pad[1]
    span = dilation * (taps - 1) + 1
    halo = max(0, span - stride)
    # A block that starts on a multiple of the stride in the padded image computes its rows with
    # no offset. Boundary b of the input becomes padded row b - b % stride: output block i then
    # starts at output row b // stride, so the output chunks are the input's divided by the
    # stride (equal to them at stride 1, "same" padding included), which zarr needs regular.
    aligned = sorted({b - b % stride for b in accumulate(chunks[:-1])})
    aligned = [b for b in aligned if 0 < b < size]
    pieces = [b - a for a, b in zip([0] + aligned, aligned + [size])]
    # A last chunk shorter than the filter's span yields no output row of its own: its rows
    # join the chunk before (its predecessor's halo already covers them).
    while len(pieces) > 1 and pieces[-1] < span:
        pieces[-2:] = [pieces[-2] + pieces[-1]]
    # dask's overlap needs every block, the first too, at least as long as the halo it lends.
    while len(pieces) > 1 and pieces[0] < halo:
        pieces[:2] = [pieces[0] + pieces[1]]
    for i in range(1, len(pieces)):
        if pieces[i] < halo:
            start = sum(pieces[:i]) - pad[0]
            raise ValueError(
                f"x's chunk {i} along {name} (rows {max(start, 0)}..{start + pieces[i] - 1} of the input, "
                f"after aligning chunk starts to the stride {stride}) has {pieces[i]} rows, fewer than the "
                f"halo of {halo} rows (dilation*(R-1)+1-stride) that the chunk before it reads; rechunk {name} "
                f"to chunks of at least {halo + stride - 1}")
    outputs = [p // stride for p in pieces[:-1]]
    outputs.append(n_out - sum(outputs))
    assert outputs[-1] >= 1, (name, pieces, outputs)
    return AxisPlan(name, tuple(pieces), halo, tuple(outputs), tuple(pad))


@dataclass(frozen=True)
class ChunkPlan:
    """How a forward convolution of a chunked input is cut into blocks; a value, computed once.

    Parameters
    ----------
    problem : ConvProblem
        The whole convolution.
    batch_chunks : tuple of int
        Batch chunks, input and output alike (no halo).
    channel_chunks : tuple of int
        ``x``'s chunks along C.
    partial_sums : bool
        Whether the C chunks give partial sums added by a tree reduction (``groups == 1`` and
        more than one C chunk); otherwise each C chunk holds whole groups (``groups > 1``).
    filter_chunks : tuple of int
        Output channel chunks (``w``'s chunks along K, or the K range of each C chunk's groups).
    h, w : AxisPlan
        The spatial axes.
    """

    problem: ConvProblem
    batch_chunks: tuple[int, ...]
    channel_chunks: tuple[int, ...]
    partial_sums: bool
    filter_chunks: tuple[int, ...]
    h: AxisPlan
    w: AxisPlan

    @property
    def output_chunks(self) -> tuple[tuple[int, ...], ...]:
        """The result's chunks, ``(N, K, P, Q)``."""
        return (self.batch_chunks, self.filter_chunks, self.h.output_chunks, self.w.output_chunks)

    @property
    def input_chunks(self) -> tuple[tuple[int, ...], ...]:
        """The padded, stride-aligned input's chunks before the halo, ``(N, C, H + pads, W + pads)``."""
        return (self.batch_chunks, self.channel_chunks, self.h.input_chunks, self.w.input_chunks)

    def reads(self, i: int, j: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The input blocks (along H, along W) that output block ``(i, j)`` reads."""
        def along(axis: AxisPlan, b: int):
            return (b, b + 1) if axis.halo and b + 1 < len(axis.input_chunks) else (b,)
        return along(self.h, i), along(self.w, j)

    @property
    def read_factor(self) -> float:
        """Input elements read (halos included, padding included) over the input's elements."""
        p = self.problem
        read = (p.H + sum(self.h.pad) + self.h.extra_reads) * (p.W + sum(self.w.pad) + self.w.extra_reads)
        return read * (len(self.filter_chunks) if self.partial_sums or self.problem.groups == 1 else 1) / (p.H * p.W)

    @property
    def tasks(self) -> int:
        """Convolution tasks (blocks computed), before the reduction."""
        return (len(self.batch_chunks) * len(self.channel_chunks) * len(self.h.output_chunks)
                * len(self.w.output_chunks) * (len(self.filter_chunks) if self.problem.groups == 1 else 1))

    def describe(self) -> str:
        """A few lines for people: the blocks, the halo, what the cut costs."""
        p = self.problem
        def chunks(c):
            if len(set(c)) == 1:
                return f"{len(c)} x {c[0]}"
            if len(set(c[:-1])) == 1:
                return f"{len(c) - 1} x {c[0]} + {c[-1]}"
            return str(c)
        lines = [
            p.describe(),
            f"  batch chunks {chunks(self.batch_chunks)}; C chunks {chunks(self.channel_chunks)}"
            + (f" (partial sums, tree reduction split_every={SPLIT_EVERY})" if self.partial_sums else "")
            + f"; K chunks {chunks(self.filter_chunks)}",
        ]
        for a in (self.h, self.w):
            lines.append(f"  {a.name}: pad {a.pad[0]}+{a.pad[1]} once; input chunks {chunks(a.input_chunks)} "
                         f"(stride-aligned); halo {a.halo} on the far side; output chunks {chunks(a.output_chunks)}")
        lines.append(f"  {self.tasks} convolution tasks; input read {self.read_factor:.3f}x its size "
                     f"(halos, padding{', once per K chunk' if len(self.filter_chunks) > 1 and p.groups == 1 else ''})")
        return "\n".join(lines)

    __str__ = describe


def chunk_plan(problem: ConvProblem, x_chunks, w_filter_chunks=None) -> ChunkPlan:
    """The :class:`ChunkPlan` of a forward ``problem`` for an input chunked as ``x_chunks``.

    Parameters
    ----------
    problem : ConvProblem
        The validated forward convolution.
    x_chunks : tuple of 4 tuples of int
        ``x.chunks``.
    w_filter_chunks : tuple of int, optional
        ``w.chunks[0]`` when ``w`` is a Dask array (``groups == 1`` only).

    Raises
    ------
    ValueError
        A spatial chunk smaller than the halo (naming it), or, with ``groups > 1``, a C chunk that
        does not hold whole groups.
    """
    p = problem
    n_chunks, c_chunks, h_chunks, w_chunks = (tuple(int(c) for c in axis) for axis in x_chunks)
    if p.groups == 1:
        filter_chunks = tuple(w_filter_chunks) if w_filter_chunks is not None else (p.K,)
        partial = len(c_chunks) > 1
    else:
        per_group = p.C // p.groups
        bad = [i for i, c in enumerate(c_chunks) if c % per_group]
        if bad:
            raise ValueError(
                f"x's chunk {bad[0]} along C has {c_chunks[bad[0]]} channels: with groups={p.groups} every C chunk "
                f"must hold whole groups (a multiple of C/groups = {per_group}); rechunk C to multiples of {per_group}")
        filter_chunks = tuple(c // per_group * p.K_per_group for c in c_chunks)
        partial = False
    h = _axis_plan("H", h_chunks, p.padding[:2], p.stride[0], p.dilation[0], p.R, p.P)
    w = _axis_plan("W", w_chunks, p.padding[2:], p.stride[1], p.dilation[1], p.S, p.Q)
    return ChunkPlan(p, n_chunks, c_chunks, partial, filter_chunks, h, w)


# -- helpers ---------------------------------------------------------------------------------------

def _with_options(run):
    """``run`` (an in-memory convlib function) under the options in force now, where the graph is
    built: its blocks run later, in dask's threads or in worker processes, which a caller's
    :func:`~convlib.core.options.option_context` (per thread) does not reach."""
    if run is None:
        return None
    return functools.partial(_run_with_options, run, {"workspace_cap": options.workspace_cap,
                                                       "allow_tf32": options.allow_tf32})


def _run_with_options(run, settings, *args, **kwargs):
    with option_context(**settings):
        return run(*args, **kwargs)


def _as_dask(arr, chunks=None):
    """A Dask array for ``arr`` (host arrays become one chunk, or ``chunks``)."""
    if is_dask_array(arr):
        return arr if chunks is None else arr.rechunk(chunks)
    return da.from_array(arr, chunks=chunks if chunks is not None else tuple(arr.shape))


def _meta(like, ndim: int, dtype):
    """An empty array of ``like``'s kind (numpy, CuPy, ...) with ``ndim`` dimensions."""
    meta = getattr(like, "_meta", None)
    if meta is None:
        return np.empty((0,) * ndim, dtype)
    return meta.astype(dtype).reshape((0,) * ndim)


def _shape_dtype(name, arr):
    if arr is not None and not hasattr(arr, "shape"):
        raise TypeError(f"{name} of type {type(arr).__name__} is not an array")
    return tuple(arr.shape), array_dtype(name, arr)


def _required(**named):
    for name, arr in named.items():
        if arr is None:
            raise TypeError(f"{name}=None is not an array; pass a numpy (or device) array")


def _host(name, arr):
    return arr if is_dask_array(arr) else host_array(name, arr)


def _array_module(arr):
    """The module of ``arr``'s type (numpy, CuPy), for making arrays of the same kind."""
    return sys.modules[type(arr).__module__.split(".")[0]]


def _device_module(arr):
    """The array module (CuPy) of ``arr``'s chunks when they live on a GPU, else None."""
    meta = getattr(arr, "_meta", arr)
    if meta is None or array_backend(meta) != "cuda":
        return None
    return _array_module(meta)


def _like_data(data, *arrays):
    """``arrays`` (the filters, a bias, ``dy``) in the kind of ``data``'s chunks.

    A Dask array of CuPy chunks may come with numpy filters: they are copied to the GPU once, in
    the graph, so every block gets arrays of one kind (the in-memory call refuses a mix)."""
    module = _device_module(data)
    if module is None:
        return arrays
    out = []
    for arr in arrays:
        if arr is None or array_backend(getattr(arr, "_meta", arr)) == "cuda":
            out.append(arr)
        elif is_dask_array(arr):
            out.append(arr.map_blocks(module.asarray, dtype=arr.dtype, meta=_meta(data, arr.ndim, arr.dtype)))
        else:
            out.append(module.asarray(arr))
    return tuple(out)


def _check_plan(operation, problem, device, algo, *arrays):
    """The checks the in-memory call makes before any work: the device and whether ``algo`` can
    serve the problem (``NotImplementedError`` naming those that can)."""
    metas = [getattr(a, "_meta", a) for a in arrays]
    make_plan(operation, problem, device, algo, tuple(metas))


# -- the forward convolution -----------------------------------------------------------------------

def _one_block(block):
    """The block of an index that a blockwise call contracts, where that index has one chunk.

    With ``concatenate=False`` dask passes the list of blocks along a contracted index; with
    ``concatenate=True`` it would concatenate them, which copies even a single block (a fresh
    array as large as the block, the seed batch's 167 MB per task)."""
    while isinstance(block, list):
        (block,) = block
    return block


def _forward_block(xb, wb, bb=None, *, run, partial, arguments):
    xb, wb = _one_block(xb), _one_block(wb)
    with task_threads():
        y = run(xb, wb, bb, padding=0, **arguments)
    return y[None] if partial else y


def forward_plan(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1) -> ChunkPlan:
    """The :class:`ChunkPlan` that :func:`convlib.conv2d` follows for the Dask array ``x`` (only
    shapes, dtypes and chunks are read; nothing is computed).

    Parameters
    ----------
    x : dask.array.Array, shape (N, C, H, W)
    w, bias, stride, padding, dilation, groups
        As in :func:`convlib.conv2d` (``w`` a numpy or Dask array).

    Returns
    -------
    ChunkPlan
    """
    _required(x=x, w=w)
    w, bias = _host("w", w), _host("bias", bias)
    (xs, xd), (ws, wd) = _shape_dtype("x", x), _shape_dtype("w", w)
    bs, bd = _shape_dtype("bias", bias) if bias is not None else (None, None)
    problem = make_problem(xs, ws, bs, xd, wd, bd, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return chunk_plan(problem, x.chunks, w.chunks[0] if is_dask_array(w) and groups == 1 else None)


def conv2d(run, check_algo, x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, algo="auto",
           device=None, allow_tf32=False):
    """:func:`convlib.conv2d` of a Dask array: a lazy Dask array of chunks :attr:`ChunkPlan.output_chunks`.

    ``run`` is the in-memory :func:`convlib.conv2d` (each block calls it), ``check_algo`` the API's
    check of ``algo``; the other arguments are :func:`convlib.conv2d`'s (``allow_tf32`` as it was
    when the graph was built: the blocks run later, outside any ``option_context``).
    """
    _required(x=x, w=w)
    x, w, bias = _host("x", x), _host("w", w), _host("bias", bias)
    w, bias = _like_data(x, w, bias)
    algo = check_algo(algo)
    run = _with_options(run)
    (xs, xd), (ws, wd) = _shape_dtype("x", x), _shape_dtype("w", w)
    bs, bd = _shape_dtype("bias", bias) if bias is not None else (None, None)
    problem = make_problem(xs, ws, bs, xd, wd, bd, stride=stride, padding=padding, dilation=dilation, groups=groups)
    _check_plan("conv2d", problem, device, algo, x, w, bias)
    x = _as_dask(x)
    plan = chunk_plan(problem, x.chunks, w.chunks[0] if is_dask_array(w) and groups == 1 else None)
    return _run_forward(run, plan, x, w, bias, algo=algo, device=device, allow_tf32=allow_tf32)


def _blocks_with_halo(x, plan: ChunkPlan):
    """``x`` padded once, cut at the plan's stride-aligned boundaries, each block with its halo:
    block ``(i, j)`` is everything output block ``(i, j)`` reads, convolved with no padding."""
    if any(plan.problem.padding):
        x = da.pad(x, ((0, 0), (0, 0), plan.h.pad, plan.w.pad), mode="constant")
    x = x.rechunk(plan.input_chunks)
    # The halo is a copy of each block with its neighbour's rows: only along axes cut in chunks.
    depth_h = plan.h.halo if len(plan.h.input_chunks) > 1 else 0
    depth_w = plan.w.halo if len(plan.w.input_chunks) > 1 else 0
    if depth_h or depth_w:
        x = overlap(x, depth={0: 0, 1: 0, 2: (0, depth_h), 3: (0, depth_w)},
                    boundary={0: "none", 1: "none", 2: "none", 3: "none"}, allow_rechunk=False)
    return x


def _run_forward(run, plan: ChunkPlan, x, w, bias, *, algo, device, allow_tf32=False):
    p = plan.problem
    dtype = np.dtype(p.dtype)
    x = _blocks_with_halo(x, plan)
    arguments = dict(stride=p.stride, dilation=p.dilation, algo=algo, device=device)
    if allow_tf32:
        arguments["allow_tf32"] = True
    adjust = {"y": plan.h.output_chunks, "x": plan.w.output_chunks}
    if p.groups == 1:
        w = _as_dask(w, (plan.filter_chunks, plan.channel_chunks, p.R, p.S))
        if plan.partial_sums:
            # One partial sum per C chunk on a new leading axis, added by a tree reduction: the
            # blocks of one output block meet a few at a time, never all at once in one task.
            y = da.blockwise(_forward_block, "cnkyx", x, "ncyx", w, "kcrs", dtype=dtype,
                             meta=_meta(x, 5, dtype), adjust_chunks={"c": 1, **adjust}, concatenate=True,
                             run=run, partial=True, arguments=arguments)
            y = y.sum(axis=0, split_every=SPLIT_EVERY, dtype=dtype)
            if bias is not None:
                y = y + _as_dask(bias, (plan.filter_chunks,))[None, :, None, None]
            return y
        blocks = [x, "ncyx", w, "kcrs"]
        if bias is not None:
            blocks += [_as_dask(bias, (plan.filter_chunks,)), "k"]
        return da.blockwise(_forward_block, "nkyx", *blocks, dtype=dtype, meta=_meta(x, 4, dtype),
                            adjust_chunks=adjust, concatenate=False, run=run, partial=False, arguments=arguments)
    # groups > 1: C chunk i holds whole groups, whose filters are w's K chunk i; the channel axis
    # of x and the K axis of w share a block index (their chunk sizes differ, so no alignment).
    w = _as_dask(w, (plan.filter_chunks, p.C // p.groups, p.R, p.S))
    blocks = [x, "nkyx", w, "kcrs"]
    if bias is not None:
        blocks += [_as_dask(bias, (plan.filter_chunks,)), "k"]
    # Each block takes its group count from its own channels: chunks may hold different counts.
    return da.blockwise(_grouped_block, "nkyx", *blocks, dtype=dtype, meta=_meta(x, 4, dtype),
                        adjust_chunks={"k": plan.filter_chunks, **adjust}, align_arrays=False, concatenate=False,
                        run=run, per_group=p.C // p.groups, arguments=arguments)


def _grouped_block(xb, wb, bb=None, *, run, per_group, arguments):
    wb = _one_block(wb)
    with task_threads():
        return run(xb, wb, bb, padding=0, groups=xb.shape[1] // per_group, **arguments)


# -- the backward passes and the transposed convolution --------------------------------------------

def _weight_block(xb, dyb, *, run, taps, groups, per_group, arguments):
    """One partial ``dw``: this block's channels of ``dw``, those of its C chunk (``groups == 1``)
    or its K chunk's whole groups (``groups > 1``, ``per_group`` input channels each)."""
    block_groups = 1 if groups == 1 else xb.shape[1] // per_group
    w_shape = (dyb.shape[1], xb.shape[1] // block_groups, *taps)
    with task_threads():
        return run(xb, dyb, w_shape, padding=0, groups=block_groups, **arguments)[None, None, None]


def _bias_block(dyb, *, run, arguments):
    with task_threads():
        return run(dyb, **arguments)[None, :, None, None]


def _data_pass_as_forward(problem: ConvProblem, in_h: int, in_w: int):
    """The padding ``(top, bottom, left, right)`` of the stride-1 forward convolution that computes
    ``problem``'s data pass from an input of ``in_h x in_w`` (``dy``, or ``conv_transpose2d``'s
    ``x``), or None when there is none (a stride above 1, or a padding past the filter's reach).

    At stride 1, ``dx = conv2d(dy, w flipped in R and S with K and C/groups swapped per group,
    padding dilation*(R-1) - padding)``: the identity the Winograd data pass uses. The bottom and
    right sides take what ``conv_transpose2d``'s ``output_padding`` adds."""
    if problem.stride != (1, 1):
        return None
    reach_h, reach_w = problem.dilation[0] * (problem.R - 1), problem.dilation[1] * (problem.S - 1)
    top, left = reach_h - problem.padding[0], reach_w - problem.padding[2]
    bottom, right = problem.H + reach_h - in_h - top, problem.W + reach_w - in_w - left
    pad = (top, bottom, left, right)
    return pad if min(pad) >= 0 else None


def _flipped_transposed(w, groups: int):
    """``w`` (K, C/groups, R, S) as the filters (C, K/groups, R, S) of the data pass's forward form."""
    k, c_per_group, r, s = w.shape
    wt = w.reshape(groups, k // groups, c_per_group, r, s).transpose(0, 2, 1, 3, 4)
    wt = wt.reshape(groups * c_per_group, k // groups, r, s)[:, :, ::-1, ::-1]
    return wt if is_dask_array(wt) else wt.copy()  # C order; numpy or CuPy alike


def _forward_form(forward, problem, arr, w, bias, *, algo, device):
    """The data pass of ``problem`` on the chunked ``arr`` as a forward convolution (stride 1), with
    the forward chunk plan, or None when it has no such form."""
    pad = _data_pass_as_forward(problem, arr.shape[2], arr.shape[3])
    if pad is None:
        return None
    wt = _flipped_transposed(w, problem.groups)
    fproblem = make_problem(tuple(arr.shape), tuple(wt.shape), None if bias is None else tuple(bias.shape),
                            arr.dtype, wt.dtype, None if bias is None else bias.dtype, padding=pad,
                            dilation=problem.dilation, groups=problem.groups)
    _check_plan("conv2d", fproblem, device, algo, arr, wt, bias)
    plan = chunk_plan(fproblem, arr.chunks)
    return _run_forward(forward, plan, arr, wt, bias, algo=algo, device=device)


@dataclass(frozen=True)
class DataAxisPlan:
    """How one spatial axis of the data pass (``dx`` from ``dy``) is cut, at any stride.

    Block ``i`` of ``dy`` (rows ``a_i .. b_i``) computes the ``dx`` rows whose padded index ``t``
    lies in ``[a_i * stride, b_i * stride)`` (the first block from 0, the last to the end): every
    ``dy`` row that reaches them is in the block or in the ``halo`` rows before it
    (``t = p*stride + r*dilation``, so ``p >= a_i - dilation*(R-1) // stride``). The halo is
    on the near side, the mirror of the forward plan's; the blocks' ``dx`` rows do not overlap, so
    nothing is added between blocks. Each block is an in-memory data pass with its own padding
    (:meth:`local`): no padding at inner borders beyond the rows that belong to a neighbour.

    Parameters
    ----------
    dy_chunks : tuple of int
        ``dy``'s chunks along the axis (a leading block that reaches only padding rows is merged
        into its successor, a trailing one into its predecessor).
    dx_chunks : tuple of int
        The ``dx`` rows of each block.
    halo : int
        ``dy`` rows each block (but the first) takes from its predecessor.
    before, size, stride, dilation, taps : int
        The axis' padding before the image, ``dx``'s length, and the convolution's geometry.
    """

    dy_chunks: tuple[int, ...]
    dx_chunks: tuple[int, ...]
    halo: int
    before: int
    size: int
    stride: int
    dilation: int
    taps: int

    def local(self, start: int, count: int) -> tuple[int, int, int, int]:
        """``(rows, before, after, zeros)`` of the block whose ``dy`` rows start at ``start`` (halo
        not counted) and number ``count`` (halo counted): its ``dx`` rows computed with that padding,
        then ``zeros`` rows of zeros (rows past every filter's reach, which ``conv_transpose2d``'s
        ``output_padding`` can ask for)."""
        s, reach = self.stride, self.dilation * (self.taps - 1)
        halo = self.halo if start > 0 else 0
        lo = 0 if start == 0 else start * s
        end = (start + count - halo) * s
        last = end >= self.before + self.size or start + count - halo == self._rows
        hi = self.before + self.size if last else end
        rows = min(hi, self.before + self.size) - max(lo, self.before)
        before = halo * s + max(0, self.before - lo)
        # the padding after that makes the block's dy exactly `count` rows long (at least 0)
        after = max(0, s * (count - 1) + reach + 1 - rows - before)
        zeros = max(0, rows + before + after - reach - 1 - (s * count - 1))
        return rows - zeros, before, after, zeros

    @property
    def _rows(self) -> int:
        return sum(self.dy_chunks)


def _data_axis(name, chunks, pad, size, stride, dilation, taps) -> DataAxisPlan:
    """The :class:`DataAxisPlan` of one spatial axis: ``chunks`` of ``dy``, ``pad`` the forward
    padding ``(before, after)``, ``size`` the length of ``dx``."""
    before = pad[0]
    chunks = list(chunks)
    ends = lambda: list(accumulate(chunks))  # noqa: E731
    while len(chunks) > 1 and chunks[0] * stride <= before:  # the first block would hold only padding
        chunks[:2] = [chunks[0] + chunks[1]]
    while len(chunks) > 1 and ends()[-2] * stride >= before + size:  # the last one too
        chunks[-2:] = [chunks[-2] + chunks[-1]]
    halo = dilation * (taps - 1) // stride
    while len(chunks) > 1 and chunks[-1] < halo:  # dask's overlap needs every block >= the halo: join
        chunks[-2:] = [chunks[-2] + chunks[-1]]
    for i, c in enumerate(chunks):
        if c < halo:
            raise ValueError(f"chunk {i} of dy along {name} has {c} rows, fewer than the halo of {halo} rows that "
                             f"the next block reads (dilation*(R-1)//stride): rechunk to at least {halo}")
    starts = [0, *ends()[:-1]]
    plan = DataAxisPlan(tuple(chunks), (), halo, before, size, stride, dilation, taps)
    dx = []
    for a, c in zip(starts, chunks):
        rows, _, _, zeros = plan.local(a, c + (halo if a else 0))
        dx.append(rows + zeros)
    return replace(plan, dx_chunks=tuple(dx))


def _data_block(dyb, wb, rows, cols, *, run, plans, groups, per_group, channels, arguments, partial):
    """One block of the data pass: ``dy``'s block with its near-side halo, the filters of its K
    channels, and the indices of its rows and columns (``rows``/``cols``: where it starts)."""
    dyb, wb = _one_block(dyb), _one_block(wb)
    blocks_groups = groups if partial else dyb.shape[1] // per_group
    h, top, bottom, h_zeros = plans[0].local(int(rows[0]), dyb.shape[2])
    w, left, right, w_zeros = plans[1].local(int(cols[0]), dyb.shape[3])
    c = channels if partial or groups == 1 else blocks_groups * (channels // groups)
    with task_threads():
        dx = run(dyb, wb, (dyb.shape[0], c, h, w), padding=(top, bottom, left, right), groups=blocks_groups,
                 **arguments)
    if h_zeros or w_zeros:
        full = _array_module(dx).zeros((dx.shape[0], c, h + h_zeros, w + w_zeros), dx.dtype)
        full[:, :, :h, :w] = dx
        dx = full
    return dx[None] if partial else dx


def _gathered_data_pass(run, problem, dy, w, bias, *, algo, device):
    """The data pass of ``problem`` on ``dy`` chunked along any axis, at any stride
    (:class:`DataAxisPlan` per spatial axis); K chunks give partial sums (``groups == 1``) or, holding
    whole groups, those groups' C channels. ``bias`` (``conv_transpose2d``'s) is added once."""
    p = problem
    dtype = np.dtype(p.dtype)
    per_group = p.K // p.groups
    for i, kc in enumerate(dy.chunks[1]):
        if p.groups > 1 and kc % per_group:
            raise ValueError(f"chunk {i} of dy along K has {kc} channels: with groups={p.groups} a chunk must hold "
                             f"whole groups, a multiple of {per_group} channels")
    plans = (_data_axis("H", dy.chunks[2], p.padding[:2], p.H, p.stride[0], p.dilation[0], p.R),
             _data_axis("W", dy.chunks[3], p.padding[2:], p.W, p.stride[1], p.dilation[1], p.S))
    dy = dy.rechunk((dy.chunks[0], dy.chunks[1], plans[0].dy_chunks, plans[1].dy_chunks))
    depth = {0: 0, 1: 0, 2: (plans[0].halo if len(plans[0].dy_chunks) > 1 else 0, 0),
             3: (plans[1].halo if len(plans[1].dy_chunks) > 1 else 0, 0)}
    halo_dy = dy
    if depth[2][0] or depth[3][0]:
        halo_dy = overlap(dy, depth=depth, boundary={0: "none", 1: "none", 2: "none", 3: "none"}, allow_rechunk=False)
    rows = da.arange(dy.shape[2], chunks=(plans[0].dy_chunks,))
    cols = da.arange(dy.shape[3], chunks=(plans[1].dy_chunks,))
    arguments = dict(stride=p.stride, dilation=p.dilation, algo=algo, device=device)
    partial = p.groups == 1 and len(dy.chunks[1]) > 1
    w = _as_dask(w, (dy.chunks[1], p.C // p.groups, p.R, p.S))
    common = dict(dtype=dtype, align_arrays=False, concatenate=False, run=run, plans=plans, groups=p.groups,
                  per_group=per_group, channels=p.C, arguments=arguments)
    adjust = {"y": plans[0].dx_chunks, "x": plans[1].dx_chunks}
    if partial:
        # One partial dx per K chunk on a new leading axis (w's c has one chunk), added by a tree
        # reduction, as the forward adds its C chunks.
        dx = da.blockwise(_data_block, "kncyx", halo_dy, "nkyx", w, "kcrs", rows, "y", cols, "x",
                          meta=_meta(dy, 5, dtype), adjust_chunks={"k": 1, **adjust}, partial=True, **common)
        dx = dx.sum(axis=0, split_every=SPLIT_EVERY, dtype=dtype)
    else:
        channel_chunks = ((p.C,) if p.groups == 1
                          else tuple(kc // per_group * (p.C // p.groups) for kc in dy.chunks[1]))
        dx = da.blockwise(_data_block, "nkyx", halo_dy, "nkyx", w, "kcrs", rows, "y", cols, "x",
                          meta=_meta(dy, 4, dtype), adjust_chunks={"k": channel_chunks, **adjust}, partial=False,
                          **common)
    if bias is not None:
        dx = dx + _as_dask(bias, (dx.chunks[1],))[None, :, None, None]
    return dx


def conv2d_backward_data(run, check_algo, dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1,
                         algo="auto", device=None, forward=None):
    """:func:`convlib.conv2d_backward_data` of a Dask ``dy``.

    Chunks along N only: every block runs ``run`` (the in-memory data pass); ``dx`` is chunked as
    ``dy`` along N, one chunk along C, H and W. Chunks along K, H or W (stride 1, padding at most
    ``dilation*(R-1)``): the forward form (:func:`_data_pass_as_forward`) run by ``forward`` (the
    in-memory :func:`convlib.conv2d`) under the forward chunk plan, K chunks giving partial sums.
    """
    _required(dy=dy, w=w)
    dy, w = _host("dy", dy), _host("w", w)
    (w,) = _like_data(dy, w)
    algo = check_algo(algo)
    run, forward = _with_options(run), _with_options(forward)
    (dys, dyd), (ws, wd) = _shape_dtype("dy", dy), _shape_dtype("w", w)
    problem = make_backward_data_problem(dys, ws, x_shape, dyd, wd, stride=stride, padding=padding,
                                         dilation=dilation, groups=groups)
    _check_plan("conv2d_backward_data", problem, device, algo, dy, w)
    dy = _as_dask(dy)
    if any(len(dy.chunks[axis]) > 1 for axis in (1, 2, 3)):
        dx = _forward_form(forward, problem, dy, w, None, algo=algo, device=device)
        return dx if dx is not None else _gathered_data_pass(run, problem, dy, w, None, algo=algo, device=device)
    w = _as_dask(w, w.shape)
    p = problem
    dtype = np.dtype(p.dtype)
    arguments = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, algo=algo, device=device)
    return da.map_blocks(_batch_block_shape, dy, w, dtype=dtype, meta=_meta(dy, 4, dtype),
                         chunks=(dy.chunks[0], (p.C,), (p.H,), (p.W,)), run=run, x_shape=p.x_shape,
                         arguments=arguments)


def _batch_block_shape(dyb, wb, *, run, x_shape, arguments):
    with task_threads():
        return run(dyb, wb, (dyb.shape[0],) + tuple(x_shape[1:]), **arguments)


def conv2d_backward_weight(run, check_algo, x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1,
                           algo="auto", device=None):
    """:func:`convlib.conv2d_backward_weight` of a Dask ``x`` chunked along N, C, H and W: a Dask
    array ``dw``, chunked as ``x`` along C (``groups == 1``) or along K by the groups of each C
    chunk (``groups > 1``: a C chunk must hold whole groups).

    ``x`` is cut by the forward chunk plan (padding once, stride-aligned blocks with their halo)
    and ``dy`` is rechunked to that plan's output chunks (along K, one chunk, or the filters of each
    C chunk's groups); each pair of blocks gives a partial ``dw`` (the in-memory weight pass with no
    padding), and the partial sums over N, H and W meet in a tree reduction.
    """
    _required(x=x, dy=dy)
    x, dy = _host("x", x), _host("dy", dy)
    (dy,) = _like_data(x, dy)
    algo = check_algo(algo)
    run = _with_options(run)
    (xs, xd), (dys, dyd) = _shape_dtype("x", x), _shape_dtype("dy", dy)
    problem = make_backward_weight_problem(xs, dys, w_shape, xd, dyd, stride=stride, padding=padding,
                                           dilation=dilation, groups=groups)
    _check_plan("conv2d_backward_weight", problem, device, algo, x, dy)
    x = _as_dask(x)
    plan = chunk_plan(problem.forward, x.chunks)  # C chunks must hold whole groups (ValueError)
    p = problem
    per_group = p.C // groups
    # groups > 1: C chunk i of x holds whole groups, whose filters are dy's K chunk i.
    k_chunks = (p.K,) if groups == 1 else tuple(c // per_group * (p.K // groups) for c in plan.channel_chunks)
    dy = _as_dask(dy, (plan.batch_chunks, k_chunks, plan.h.output_chunks, plan.w.output_chunks))
    dtype = np.dtype(p.dtype)
    arguments = dict(stride=p.stride, dilation=p.dilation, algo=algo, device=device)
    common = dict(dtype=dtype, meta=_meta(x, 7, dtype), align_arrays=False, concatenate=True, run=run,
                  taps=(p.R, p.S), groups=groups, per_group=per_group, arguments=arguments)
    x = _blocks_with_halo(x, plan)
    if groups == 1:
        partial = da.blockwise(_weight_block, "nyxkcrs", x, "ncyx", dy, "nkyx", new_axes={"r": p.R, "s": p.S},
                               adjust_chunks={"n": 1, "y": 1, "x": 1, "c": plan.channel_chunks}, **common)
    else:
        # x's channel axis and dy's K axis share a block index (their chunk sizes differ).
        partial = da.blockwise(_weight_block, "nyxkcrs", x, "nkyx", dy, "nkyx",
                               new_axes={"c": per_group, "r": p.R, "s": p.S},
                               adjust_chunks={"n": 1, "y": 1, "x": 1, "k": k_chunks}, **common)
    return partial.sum(axis=(0, 1, 2), split_every=SPLIT_EVERY, dtype=dtype)


def conv2d_backward_bias(run, check_algo, dy, *, algo="auto", device=None):
    """:func:`convlib.conv2d_backward_bias` of a Dask ``dy`` (any chunks along N and K): convlib's
    blocked sum per block, then a tree reduction."""
    _required(dy=dy)
    dy = _host("dy", dy)
    algo = check_algo(algo)
    run = _with_options(run)
    dys, dyd = _shape_dtype("dy", dy)
    problem = make_backward_bias_problem(dys, dyd)
    _check_plan("conv2d_backward_bias", problem, device, algo, dy)
    dy = _as_dask(dy)
    dtype = np.dtype(problem.dtype)
    # p and q stay in the output (one partial sum per block): a contracted index would make dask
    # concatenate dy's spatial blocks into one copy per task.
    partial = da.blockwise(_bias_block, "bkpq", dy, "bkpq", dtype=dtype, meta=_meta(dy, 4, dtype),
                           adjust_chunks={"b": 1, "p": 1, "q": 1}, run=run, arguments=dict(algo=algo, device=device))
    return partial.sum(axis=(0, 2, 3), split_every=SPLIT_EVERY, dtype=dtype)


def conv_transpose2d(run, check_algo, x, w, bias=None, *, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1, algo="auto", device=None, forward=None, data_pass=None):
    """:func:`convlib.conv_transpose2d` of a Dask ``x``: chunks along N as for
    :func:`conv2d_backward_data` (each block runs ``run``); chunks along C_in, H or W at stride 1
    through the forward form, run by ``forward`` (the bias added once, after the partial sums)."""
    algo = check_algo(algo)
    run, forward, data_pass = _with_options(run), _with_options(forward), _with_options(data_pass)
    _required(x=x, w=w)
    x, w, bias = _host("x", x), _host("w", w), _host("bias", bias)
    w, bias = _like_data(x, w, bias)
    (xs, xd), (ws, wd) = _shape_dtype("x", x), _shape_dtype("w", w)
    bs, bd = _shape_dtype("bias", bias) if bias is not None else (None, None)
    problem = make_transpose_problem(xs, ws, bs, xd, wd, bd, stride=stride, padding=padding,
                                     output_padding=output_padding, groups=groups, dilation=dilation)
    _check_plan(problem.operation, problem, device, algo, x, w, bias)
    x = _as_dask(x)
    if any(len(x.chunks[axis]) > 1 for axis in (1, 2, 3)):
        y = _forward_form(forward, problem, x, w, bias, algo=algo, device=device)
        return y if y is not None else _gathered_data_pass(data_pass, problem, x, w, bias, algo=algo, device=device)
    n, c, h, wd_ = problem.output_shape
    dtype = np.dtype(problem.dtype)
    arrays = [x, _as_dask(w, w.shape)] + ([_as_dask(bias, bias.shape)] if bias is not None else [])
    arguments = dict(stride=stride, padding=padding, output_padding=output_padding, groups=groups,
                     dilation=dilation, algo=algo, device=device)
    return da.map_blocks(_transpose_block, *arrays, dtype=dtype, meta=_meta(x, 4, dtype),
                         chunks=(x.chunks[0], (c,), (h,), (wd_,)), run=run, arguments=arguments)


def _transpose_block(xb, wb, bb=None, *, run, arguments):
    with task_threads():
        return run(xb, wb, bb, **arguments)
