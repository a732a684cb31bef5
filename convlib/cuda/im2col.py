"""im2col + GEMM on the GPU: an explicit column matrix per batch chunk, then a tiled GEMM.

For a chunk of images an elementwise kernel writes the column matrix ``(images, C*R*S, P*Q)``
(row ``(c, r, s)`` of image ``n`` holds ``x[n, c, p*sh - top + r*dh, q*sw - left + s*dw]``, zero
outside the padded image); one GEMM per chunk then multiplies each group's ``K/groups x Cg*R*S``
filter matrix by its ``Cg*R*S x P*Q`` slice of every image and writes ``y`` in NCHW directly.

The workspace is the column matrix of one chunk: ``C*R*S*P*Q*itemsize`` bytes per image, chunks
sized by :meth:`ConvProblem.im2col_batch_chunk` (256 MiB by default), allocated by the input's own
library (PyTorch's or CuPy's pool for their arrays). A 1x1 convolution at stride 1 without padding
has no column matrix to build (:attr:`~convlib.core.problem.ConvProblem.columns_are_the_image`):
the GEMM reads ``x`` where it lies and there is no workspace.

GEMM engines (the ``im2col_gemm`` knob of :data:`convlib.cuda.tables.KNOBS`):

``"own"``
    :func:`convlib.cuda.gemm.gemm_kernel` with ``b_source="columns"``: our tiled shared-memory
    GEMM (bias added in its epilogue).
``"cublas"``
    cuBLAS through CuPy (``cupy.matmul``, a strided batched SGEMM/DGEMM over images and groups,
    written straight into ``y``), then a bias kernel. Needs CuPy; float32 runs in full FP32
    (set explicitly, whatever ``CUPY_TF32`` says) unless ``convlib.options.allow_tf32`` (or
    the ``allow_tf32`` keyword) permits TF32 tensor cores (:func:`cublas_math`).
``"auto"`` (default)
    ``"cublas"`` when CuPy can be imported and the kernels run on a real GPU, else ``"own"``.

Cost of a new shape: every size except the batch is a compile-time constant, so a new shape
compiles new kernels (about a second each); the batch size is a run-time argument.
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np

from ..core.options import options
from .tables import gemm_is_cublas, launch_knob, resolved_engine
from .tiles import choose_gemm_tile
from .codegen import compile_kernel, unsigned_constants
from .gemm import COLUMNS, gemm_kernel, gemm_launch_shape, shape_key
from .half import gemm_of_widened_inputs
from .launch import MAX_GRID_Y, flat, placeholder_bias, simulator_enabled

#: The GEMM multiplies a copy of ``x`` (the column matrix) by ``w``: widened float16 / bfloat16
#: inputs are exact in TF32, so :mod:`convlib.cuda.half` lets it use tensor cores without loss.
GEMM_OF_INPUTS = True


def supports(problem) -> str | None:
    """None unless the groups or the column rows outnumber CUDA's grid limit (direct serves those)."""
    if problem.groups > MAX_GRID_Y:
        return f"groups={problem.groups} exceeds the {MAX_GRID_Y} groups one launch can address"
    if problem.C * problem.R * problem.S > MAX_GRID_Y:
        return f"C*R*S={problem.C * problem.R * problem.S} column rows exceed the {MAX_GRID_Y} one launch can address"
    if problem.K > MAX_GRID_Y:
        return f"K={problem.K} exceeds the {MAX_GRID_Y} channels one bias launch can address"
    return None


def pixels_per_block(simulator: bool) -> int:
    """Output pixels per thread block of the column and bias kernels (blockIdx.x runs over P*Q)."""
    return launch_knob("pixels_per_block", simulator)


@functools.lru_cache(maxsize=None)
def im2col_kernel(key, simulator: bool, threads: int):
    """The column-matrix kernel for the problem shape ``key``.

    Returns
    -------
    kernel(x, columns, image0)
        Writes ``columns`` (``images x C*R*S x P*Q``, flat) from images ``image0 ..`` of the flat
        ``x``. Grid ``(P*Q / pixels per block, C*R*S, images)``: a block's row ``(c, r, s)`` is
        uniform, so each thread decodes one pixel, reads one input value and writes one column
        entry (consecutive threads, consecutive pixels).
    """
    padded = any(key.padding)
    source = f'''
def im2col(x, columns, image0):
    # IN x (N*C*H*W), OUT columns (images*C*R*S*P*Q)
    pq = U(cuda.blockIdx.x) * THREADS + U(cuda.threadIdx.x)
    row = U(cuda.blockIdx.y)
    img = U(cuda.blockIdx.z)
    if pq < PQ:
        c = row // RS
        rs = row - c * RS
        r = rs // S
        p = pq // Q
        q = pq - p * Q
        ih = I(p * SH + r * DH) - TOP
        iw = I(q * SW + (rs - r * S) * DW) - LEFT
        src = ((U(image0) + img) * C + c) * HW
        out = (img * ROWS + row) * PQ + pq
        {"columns[out] = x[src + U(ih) * W + U(iw)] if U(ih) < H and U(iw) < W else zero" if padded else "columns[out] = x[src + U(ih) * W + U(iw)]"}
'''
    constants = unsigned_constants(
        THREADS=threads, PQ=key.P * key.Q, RS=key.R * key.S, S=key.S, Q=key.Q, SH=key.stride[0],
        SW=key.stride[1], DH=key.dilation[0], DW=key.dilation[1], C=key.C, HW=key.H * key.W, W=key.W,
        H=key.H, ROWS=key.C * key.R * key.S,
    )
    dtype = np.dtype(key.dtype)
    constants.update(TOP=np.int64(key.pad_top), LEFT=np.int64(key.pad_left), zero=dtype.type(0))
    return compile_kernel(source, "im2col", constants, simulator=simulator)


@functools.lru_cache(maxsize=None)
def bias_kernel(key, simulator: bool, threads: int):
    """``kernel(y, bias)``: adds ``bias[k]`` to channel ``k`` of the flat NCHW ``y``.

    Grid ``(P*Q / pixels per block, K, images)``: the channel is uniform per block.
    """
    source = '''
def add_bias(y, bias):
    # INOUT y (images*K*P*Q), IN bias (K,)
    pq = U(cuda.blockIdx.x) * THREADS + U(cuda.threadIdx.x)
    k = U(cuda.blockIdx.y)
    if pq < PQ:
        e = (U(cuda.blockIdx.z) * K + k) * PQ + pq
        y[e] = y[e] + bias[k]
'''
    constants = unsigned_constants(THREADS=threads, PQ=key.P * key.Q, K=key.K)
    return compile_kernel(source, "add_bias", constants, simulator=simulator)


def _cublas_chunk(problem, w, columns, y_chunk, images, target):
    """``y_chunk = w @ columns`` per image and group, through cuBLAS (CuPy)."""
    import cupy

    G, M, KK, PQ = problem.groups, problem.gemm_m, problem.gemm_k, problem.P * problem.Q
    with cupy.cuda.Device(target.ordinal), cupy_stream(cupy, target), cublas_math(cupy, problem.dtype):
        a = cupy.asarray(w).reshape(G, M, KK)
        b = cupy.asarray(columns).reshape(images, G, KK, PQ)
        out = cupy.asarray(y_chunk).reshape(images, G, M, PQ)
        if G == 1:
            a, b, out = a[0], b[:, 0], out[:, 0]
        cupy.matmul(a, b, out=out)


#: cuBLAS's ``cudaDataType`` codes of the half precisions and its float32 compute type
#: (library_types.h, cublas_api.h).
_CUDA_R_16F, _CUDA_R_16BF, _CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT = 2, 14, 68, -1


def runs_half_in_place(problem) -> bool:
    """Whether :func:`run_half_in_place` computes this float16 / bfloat16 convolution: a 1x1
    stride-1 unpadded layer (its column matrix is the image), no bias (a bias would be a second
    rounding after the GEMM's), and cuBLAS available (CuPy, a real GPU)."""
    return (problem.operation == "conv2d" and problem.dtype in ("float16", "bfloat16")
            and problem.columns_are_the_image and not problem.has_bias and gemm_is_cublas(simulator_enabled()))


def run_half_in_place(problem, x, w, target):
    """``y = w @ x`` per image and group, float16 or bfloat16 in and out, by one strided batched
    cuBLAS GEMM per group on the tensors where they lie: products and sums in float32 on tensor
    cores, each result rounded once to the input's dtype (``CUBLAS_COMPUTE_32F``), as cuDNN's
    half-precision convolutions do. Widening the inputs to float32 copies first took 3-10x cuDNN's
    time on ResNet-50's 1x1 layers (H200); bfloat16 arrays are their ``uint16`` bits here, which
    cuBLAS reads as ``CUDA_R_16BF``."""
    import cupy
    from cupy_backends.cuda.libs import cublas

    p = problem
    G, Kg, Cg, HW = p.groups, p.K_per_group, p.C_per_group, p.H * p.W
    kind = _CUDA_R_16BF if p.dtype == "bfloat16" else _CUDA_R_16F
    with target.activate():
        y = target.empty(p.y_shape, p.dtype)
        if p.N == 0:
            return y
        with cupy.cuda.Device(target.ordinal), cupy_stream(cupy, target) as stream:
            handle = cupy.cuda.device.get_cublas_handle()
            cublas.setStream(handle, stream.ptr)
            one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
            px, pw, py = (a.__cuda_array_interface__["data"][0] for a in (x, w, y))
            size = 2  # bytes of a half element
            for g in range(G):
                # Column-major view: Y[n]^T (HW x Kg) = X[n]^T (HW x Cg) @ W_g^T (Cg x Kg).
                cublas.gemmStridedBatchedEx(
                    handle, cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N, HW, Kg, Cg,
                    one.ctypes.data, px + g * Cg * HW * size, kind, HW, p.C * HW,
                    pw + g * Kg * Cg * size, kind, Cg, 0,
                    zero.ctypes.data, py + g * Kg * HW * size, kind, HW, p.K * HW,
                    p.N, _CUBLAS_COMPUTE_32F, _CUBLAS_GEMM_DEFAULT)
    return y


#: cuBLAS's ``cublasMath_t`` values (cublas_api.h; CuPy 14 names only the older ones).
_CUBLAS_DEFAULT_MATH = 0
_CUBLAS_TF32_TENSOR_OP_MATH = 3


@contextlib.contextmanager
def cublas_math(cupy, dtype: str, tf32_tolerated: bool = True):
    """cuBLAS's math for the float32 GEMMs inside the block: TF32 tensor cores when
    ``convlib.options.allow_tf32`` is set and the caller's result tolerates it
    (``tf32_tolerated``), or when the GEMM multiplies widened float16 / bfloat16 inputs, which
    TF32 holds exactly (:func:`convlib.cuda.half.gemm_of_widened_inputs`); else exact FP32.

    Both of CuPy's float32 paths are set: the handle's math mode (``sgemmStridedBatched``, which
    ``cupy.matmul`` calls for stacks, follows it) and CuPy's compute type (its ``gemmEx`` path),
    each explicitly, because CuPy's defaults follow the environment variable ``CUPY_TF32``, which
    would otherwise make convlib's exact default silently TF32. Restored on exit (process-wide
    CuPy state: calls from several threads at once may see each other's setting).
    """
    if dtype != "float32":
        yield
        return
    from cupy._core import _routines_linalg as linalg
    from cupy_backends.cuda.libs import cublas

    handle = cupy.cuda.device.get_cublas_handle()
    tf32 = (options.allow_tf32 and tf32_tolerated) or gemm_of_widened_inputs()
    previous_mode = cublas.getMathMode(handle)
    previous_type = linalg.get_compute_type(np.float32)
    cublas.setMathMode(handle, _CUBLAS_TF32_TENSOR_OP_MATH if tf32 else _CUBLAS_DEFAULT_MATH)
    linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_TF32 if tf32 else linalg.COMPUTE_TYPE_FP32)
    try:
        yield
    finally:
        cublas.setMathMode(handle, previous_mode)
        linalg.set_compute_type(np.float32, previous_type)


def cupy_stream(cupy, target):
    """The CuPy stream object of ``target``'s stream (CuPy's null stream for the legacy default)."""
    handle = target.stream_handle
    return cupy.cuda.Stream.null if handle == 0 else cupy.cuda.ExternalStream(handle)


def workspace_bytes(problem, device=None) -> int:
    """One batch chunk's column matrix (chunks sized by ``convlib.options.workspace_cap``); none
    when the columns are the image itself."""
    if problem.columns_are_the_image:
        return 0
    return min(problem.im2col_batch_chunk(), MAX_GRID_Y) * problem.im2col_image_bytes


def run(problem, x, w, bias, device):
    """im2col + GEMM convolution of device arrays (the contract of :mod:`convlib.core.contracts`)."""
    target = device
    with target.activate():
        y = target.empty(problem.y_shape, problem.dtype)
        if problem.N == 0:
            return y
        engine = resolved_engine(target.simulator)
        key = shape_key(problem)
        in_place = problem.columns_are_the_image
        chunk = min(problem.N if in_place else problem.im2col_batch_chunk(), MAX_GRID_Y)
        rows, PQ = problem.C * problem.R * problem.S, problem.P * problem.Q
        columns = None if in_place else target.empty((chunk * rows * PQ,), problem.dtype)
        threads = pixels_per_block(target.simulator)
        pixel_blocks = -(-PQ // threads)
        make_columns = None if in_place else im2col_kernel(key, target.simulator, threads)
        xf, wf = flat(x), flat(w)
        stream = target.stream
        if engine == "own":
            tile = choose_gemm_tile(problem, target.multiprocessors, target.simulator, ngemm=chunk * PQ)
            gemm = gemm_kernel(key, tile, COLUMNS, target.simulator)
            b = bias if bias is not None else placeholder_bias(problem.dtype, target)
        for image0 in range(0, problem.N, chunk):
            images = min(chunk, problem.N - image0)
            if in_place:
                used = xf[image0 * rows * PQ:(image0 + images) * rows * PQ]
            else:
                used = columns[: images * rows * PQ]
                make_columns[(pixel_blocks, rows, images), threads, stream](xf, used, image0)
            y_chunk = flat(y[image0:image0 + images])
            if engine == "own":
                grid, block = gemm_launch_shape(problem, tile, images)
                gemm[grid, block, stream](used, wf, b, y_chunk, images)
            else:
                _cublas_chunk(problem, w, used, y_chunk, images, target)
                if bias is not None:
                    bias_kernel(key, target.simulator, threads)[(pixel_blocks, problem.K, images), threads, stream](y_chunk, bias)
    return y
