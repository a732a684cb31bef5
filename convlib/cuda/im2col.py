"""im2col + GEMM on the GPU: an explicit column matrix per batch chunk, then a tiled GEMM.

For a chunk of images an elementwise kernel writes the column matrix ``(images, C*R*S, P*Q)``
(row ``(c, r, s)`` of image ``n`` holds ``x[n, c, p*sh - top + r*dh, q*sw - left + s*dw]``, zero
outside the padded image); one GEMM per chunk then multiplies each group's ``K/groups x Cg*R*S``
filter matrix by its ``Cg*R*S x P*Q`` slice of every image and writes ``y`` in NCHW directly.

The workspace is the column matrix of one chunk: ``C*R*S*P*Q*itemsize`` bytes per image, chunks
sized by :meth:`ConvProblem.im2col_batch_chunk` (256 MiB by default), allocated by the input's own
library (PyTorch's or CuPy's pool for their arrays).

GEMM engines (:func:`set_gemm_engine`, or the environment variable ``CONVLIB_CUDA_GEMM``):

``"own"``
    :func:`convlib.cuda.gemm.gemm_kernel` with ``b_source="columns"``: our tiled shared-memory
    GEMM (bias added in its epilogue).
``"cublas"``
    cuBLAS through CuPy (``cupy.matmul``, a strided batched SGEMM/DGEMM over images and groups,
    written straight into ``y``), then a bias kernel. Needs CuPy; float32 runs in full FP32
    (CuPy's default; ``CUPY_TF32=1`` would allow TF32 and break the accuracy bar).
``"auto"`` (default)
    ``"cublas"`` when CuPy can be imported and the kernels run on a real GPU, else ``"own"``.

Cost of a new shape: every size except the batch is a compile-time constant, so a new shape
compiles new kernels (about a second each); the batch size is a run-time argument.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os

import numpy as np

from .blocking import ELEMENTWISE_THREADS, SIMULATOR_ELEMENTWISE_THREADS, choose_gemm_tile
from .gemm import COLUMNS, gemm_kernel, gemm_launch_shape, shape_key
from .launch import MAX_GRID_Y, cuda, flat, placeholder_bias

GEMM_ENGINES = ("auto", "own", "cublas")
_engine = os.environ.get("CONVLIB_CUDA_GEMM", "auto").strip().lower()


def set_gemm_engine(name: str) -> str:
    """Choose the GEMM behind ``algo="im2col"`` on CUDA; returns the previous choice.

    Parameters
    ----------
    name : {"auto", "own", "cublas"}
        See the module docstring.
    """
    global _engine
    if name not in GEMM_ENGINES:
        raise ValueError(f"gemm engine {name!r}: allowed are {', '.join(map(repr, GEMM_ENGINES))}")
    previous, _engine = _engine, name
    return previous


@contextlib.contextmanager
def gemm_engine(name: str):
    """``with gemm_engine("own"): ...`` runs im2col with that engine, then restores the last one."""
    previous = set_gemm_engine(name)
    try:
        yield
    finally:
        set_gemm_engine(previous)


@functools.cache
def cupy_available() -> bool:
    """Whether CuPy can be imported (it is never imported by convlib before it is used)."""
    return importlib.util.find_spec("cupy") is not None


def resolved_engine(simulator: bool) -> str:
    """The engine the next call will use: ``"own"`` or ``"cublas"``."""
    if _engine not in GEMM_ENGINES:
        raise ValueError(f"CONVLIB_CUDA_GEMM={_engine!r}: allowed are {', '.join(GEMM_ENGINES)}")
    if _engine == "cublas":
        if simulator or not cupy_available():
            raise RuntimeError("the cublas GEMM engine needs CuPy and a real GPU (not the simulator)")
        return "cublas"
    if _engine == "auto" and cupy_available() and not simulator:
        return "cublas"
    return "own"


def supports(problem) -> str | None:
    """None unless the groups outnumber CUDA's grid limit (direct serves those)."""
    if problem.groups > MAX_GRID_Y:
        return f"groups={problem.groups} exceeds the {MAX_GRID_Y} groups one launch can address"
    return None


@functools.lru_cache(maxsize=None)
def im2col_kernel(key):
    """The column-matrix kernel for the problem shape ``key``.

    Returns
    -------
    kernel(x, columns, image0, n_images)
        Writes ``columns`` (``n_images x C*R*S x P*Q``, flat) from images ``image0 ..`` of the
        flat ``x``; one thread per element.
    """
    dtype = np.dtype(key.dtype)
    zero = dtype.type(0)
    C, H, W, R, S = key.C, key.H, key.W, key.R, key.S
    sh, sw = key.stride
    dh, dw = key.dilation
    top, left = key.pad_top, key.pad_left
    Q = key.Q
    PQ, RS = key.P * key.Q, R * S
    ROWS = C * RS

    def kernel(x, columns, image0, n_images):
        # IN x (N*C*H*W), OUT columns (n_images*C*R*S*P*Q)
        e = cuda.grid(1)
        if e < n_images * (ROWS * PQ):
            row_img = e // PQ
            pq = e - row_img * PQ
            img = row_img // ROWS
            row = row_img - img * ROWS
            c = row // RS
            rs = row - c * RS
            r = rs // S
            s = rs - r * S
            p = pq // Q
            q = pq - p * Q
            ih = p * sh - top + r * dh
            iw = q * sw - left + s * dw
            value = zero
            if 0 <= ih < H and 0 <= iw < W:
                value = x[((image0 + img) * C + c) * (H * W) + ih * W + iw]
            columns[e] = value

    return cuda.jit(kernel)


@functools.lru_cache(maxsize=None)
def bias_kernel(key):
    """``kernel(y, bias, n_images)``: adds ``bias[k]`` to channel ``k`` of the flat NCHW ``y``."""
    K, PQ = key.K, key.P * key.Q

    def kernel(y, bias, n_images):
        # INOUT y (n_images*K*P*Q), IN bias (K,)
        e = cuda.grid(1)
        if e < n_images * (K * PQ):
            y[e] += bias[(e // PQ) % K]

    return cuda.jit(kernel)


def _cublas_chunk(problem, w, columns, y_chunk, images, target):
    """``y_chunk = w @ columns`` per image and group, through cuBLAS (CuPy)."""
    import cupy

    G, M, KK, PQ = problem.groups, problem.gemm_m, problem.gemm_k, problem.P * problem.Q
    with cupy.cuda.Device(target.ordinal), _cupy_stream(cupy, target):
        a = cupy.asarray(w).reshape(G, M, KK)
        b = cupy.asarray(columns).reshape(images, G, KK, PQ)
        out = cupy.asarray(y_chunk).reshape(images, G, M, PQ)
        if G == 1:
            a, b, out = a[0], b[:, 0], out[:, 0]
        cupy.matmul(a, b, out=out)


def _cupy_stream(cupy, target):
    handle = target.stream_handle
    return cupy.cuda.Stream.null if handle == 0 else cupy.cuda.ExternalStream(handle)


def conv2d(problem, x, w, bias, device):
    """im2col + GEMM convolution of device arrays (module contract: see :mod:`convlib.registry`)."""
    target = device
    with target.activate():
        y = target.empty(problem.y_shape, problem.dtype)
        if problem.N == 0:
            return y
        engine = resolved_engine(target.simulator)
        key = shape_key(problem)
        chunk = problem.im2col_batch_chunk()
        rows, PQ = problem.C * problem.R * problem.S, problem.P * problem.Q
        columns = target.empty((chunk * rows * PQ,), problem.dtype)
        threads = SIMULATOR_ELEMENTWISE_THREADS if target.simulator else ELEMENTWISE_THREADS
        make_columns = im2col_kernel(key)
        xf, wf = flat(x), flat(w)
        stream = target.stream
        if engine == "own":
            tile = choose_gemm_tile(problem, target.multiprocessors, target.simulator, ngemm=chunk * PQ)
            gemm = gemm_kernel(key, tile, COLUMNS, target.simulator)
            b = bias if bias is not None else placeholder_bias(problem.dtype, target)
        for image0 in range(0, problem.N, chunk):
            images = min(chunk, problem.N - image0)
            used = columns[: images * rows * PQ]
            make_columns[-(-used.size // threads), threads, stream](xf, used, image0, images)
            y_chunk = flat(y[image0:image0 + images])
            if engine == "own":
                grid, block = gemm_launch_shape(problem, tile, images)
                gemm[grid, block, stream](used, wf, b, y_chunk, images)
            else:
                _cublas_chunk(problem, w, used, y_chunk, images, target)
                if bias is not None:
                    add_bias = bias_kernel(key)
                    add_bias[-(-y_chunk.size // threads), threads, stream](y_chunk, bias, images)
    return y
