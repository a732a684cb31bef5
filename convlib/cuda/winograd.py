"""Winograd F(2x2,3x3) and F(4x4,3x3) on the GPU: three transform kernels and a batched GEMM.

The method (Lavin & Gray 2015; matrices from :mod:`convlib.core.winograd_math`), ``alpha = m + 2``,
the steps of the CPU and SYCL versions:

1. **Filter transform**, once per call, one thread per ``(k, c)``:
   ``U[pos, k, c] = (G w[k, c] G^T)[pos]`` for the ``alpha**2`` tile positions, computed in
   float64 and rounded once (as on the CPU: ``G`` of F(4x4) holds 1/6, 1/12 and 1/24).
2. Then per chunk of whole images (the batch cut so that one chunk's ``V + M`` stays under
   ``convlib.options.workspace_cap``, at least one image):

   a. **Input transform**, one thread per ``(c, tile)``, consecutive threads on consecutive
      tiles: ``V[pos, c, t] = (B^T d_t B)[pos]`` for the ``alpha x alpha`` tile ``d_t`` read
      straight from ``x``, zero outside the image (a predicated load: no padded copy).
   b. **Batched GEMM** over the tile positions and groups:
      ``M[pos, g] (Kg x T) = U[pos, g] (Kg x Cg) @ V[pos, g] (Cg x T)``, ``T`` the chunk's
      tiles. Engines as im2col's (the ``im2col_gemm`` knob): cuBLAS through CuPy (one strided
      batched SGEMM/DGEMM, exact FP32 unless ``allow_tf32`` permits TF32 tensor cores), or our
      tiled GEMM (always exact)
      (:func:`convlib.cuda.gemm.gemm_kernel`) in one launch, the ``alpha**2 * groups`` products
      as its groups.
   c. **Output transform**, one thread per ``(k, tile)``: ``y = A^T M_t A + bias``, storing only
      the outputs inside ``y`` (partial tiles at the bottom and right edges), each output row of
      a warp's tiles staged in shared memory so that the stores are coalesced.

3. **Non-finite outputs** are recomputed by the definition, as on the CPU and SYCL
   (:mod:`convlib.cpu.exact` says why that suffices): an ``inf`` input spreads over its whole tile
   as ``inf - inf = NaN``, and an intermediate may overflow where direct does not. The output
   transform raises a flag on the device when it stores a non-finite value; a last small launch
   (:func:`convlib.cuda.exact.repair_flagged_outputs`) reads the flag and, only when it is
   raised, tests every output and recomputes the non-finite ones. (Testing every output
   unconditionally cost 10% of the layer: one more read of ``y``.)

The 1-D transforms are generated as straight-line source (:mod:`convlib.core.winograd_source`),
so every product the matrices do not need is gone.

Workspace: ``U`` (the filters' size times ``alpha**2 / 9``) plus one chunk's ``V`` and ``M``.

Compile cost: the transforms are compiled per ``(m, dtype, shape without the batch)`` (every size
is a compile-time constant, so index arithmetic is by constants); our GEMM per chunk size.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np

from ..core.options import options
from ..core.problem import ConvProblem
from ..core.winograd_math import WinogradTile, tile_grid, transform_matrices
from ..core.winograd_source import TransformSource
from .codegen import compile_kernel, indent, unsigned_constants
from .exact import repair_flagged_outputs
from .gemm import COLUMNS, gemm_kernel, gemm_launch_shape, shape_key
from .im2col import cublas_math, cupy_stream
from .launch import MAX_GRID_Y, flat, placeholder_bias, scalar_type
from .tables import launch_knob, resolved_engine
from .tiles import choose_gemm_tile


# -- generated kernels ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def filter_transform_kernel(m: int, dtype: str, simulator: bool):
    """``kernel(w, u, flag, count)``: ``u[pos * K*Cg + k*Cg + c] = (G w[k, c] G^T)[pos]`` (flat
    arrays), and ``flag[0] = 0`` (the output transform raises it on a non-finite output).

    One thread per filter ``(k, c)``, ``count = K*Cg`` of them.
    """
    t = transform_matrices(m)
    a = t.alpha
    src = TransformSource("float64", fma="cuda.fma")
    src.lines += [f"g{r}_{s} = f64(w[base + U({3 * r + s})])" for r in range(3) for s in range(3)]
    src.two_sided(t.G, t.G, lambda r, s: f"g{r}_{s}", lambda i, s: f"h{i}_{s}", lambda i, j: f"v{i}_{j}")
    src.lines += [f"u[U({i * a + j}) * count + i] = cast(v{i}_{j})" for i in range(a) for j in range(a)]
    source = f'''
def winograd_filter(w, u, flag, count_arg):
    # IN w (K*Cg*9), OUT u (alpha**2 * K*Cg), OUT flag (1,)
    i = U(cuda.grid(1))
    count = U(count_arg)
    if i == U(0):
        flag[0] = 0
    if i < count:
        base = i * U(9)
{indent(src.lines, 2)}
'''
    namespace = dict(src.constants, f64=scalar_type("float64"), cast=scalar_type(dtype))
    return compile_kernel(source, "winograd_filter", namespace, simulator=simulator)


@functools.lru_cache(maxsize=None)
def input_transform_kernel(m: int, key: ConvProblem, simulator: bool, threads: int):
    """``kernel(x, v, n0, tiles)``: ``v[pos, c, t] = (B^T d_t B)[pos]`` for the ``tiles`` tiles of
    images ``n0 ..`` (flat arrays; tile ``t = (n * tiles_h + ty) * tiles_w + tx``).

    Grid ``(tiles / threads, C)``: the channel is uniform per block and the tile decodes by
    compile-time divisors; consecutive threads take consecutive tiles (coalesced stores).
    """
    t = transform_matrices(m)
    a = t.alpha
    src = TransformSource(key.dtype, fma="cuda.fma")
    for i in range(a):
        src.lines.append(f"row = h0 + I({i})")
        src.lines.append("row_ok = U(row) < H")
        src.lines.append("row_base = plane + row * W_SIGNED")
        for j in range(a):
            src.lines.append(
                f"d{i}_{j} = x[U(row_base + w0 + I({j}))] if row_ok and U(w0 + I({j})) < W else zero"
            )
    src.two_sided(t.BT, t.BT, lambda i, j: f"d{i}_{j}", lambda i, j: f"e{i}_{j}", lambda i, j: f"v{i}_{j}")
    src.lines += [f"v[U({i * a + j}) * CT + out] = v{i}_{j}" for i in range(a) for j in range(a)]
    source = f'''
def winograd_input(x, v, n0, tiles_arg):
    # IN x (N*C*H*W), OUT v (alpha**2 * C * tiles)
    t = U(cuda.blockIdx.x) * THREADS + U(cuda.threadIdx.x)
    c = U(cuda.blockIdx.y)
    tiles = U(tiles_arg)
    if t < tiles:
        CT = C * tiles
        n = t // TILES_PER_IMAGE
        rest = t - n * TILES_PER_IMAGE
        ty = rest // TILES_W
        tx = rest - ty * TILES_W
        h0 = I(ty * M_TILE) - TOP
        w0 = I(tx * M_TILE) - LEFT
        plane = I(((U(n0) + n) * C + c) * HW)
        out = c * tiles + t
{indent(src.lines, 2)}
'''
    tiles_h, tiles_w = tile_grid(key, m)
    namespace = unsigned_constants(
        C=key.C, H=key.H, W=key.W, HW=key.H * key.W, TILES_PER_IMAGE=tiles_h * tiles_w,
        TILES_W=tiles_w, M_TILE=m, THREADS=threads,
    )
    namespace.update(src.constants, TOP=np.int64(key.pad_top), LEFT=np.int64(key.pad_left),
                     W_SIGNED=np.int64(key.W), zero=np.dtype(key.dtype).type(0))
    return compile_kernel(source, "winograd_input", namespace, simulator=simulator)


@functools.lru_cache(maxsize=None)
def output_transform_kernel(m: int, key: ConvProblem, simulator: bool, threads: int):
    """``kernel(mm, bias, y, flag, n0, tiles)``: ``y[n0 + n, k, tile] = A^T M_t A + bias[k]`` for the
    ``tiles`` tiles of the chunk (flat arrays), only the outputs inside ``y``; ``flag[0] = 1``
    when one of them is not finite.

    Grid ``(tiles / threads, K)``, one thread per tile. A thread's outputs are ``m`` runs of ``m``
    consecutive values, and its neighbours' runs follow them: stored directly, a warp's store
    would touch ``m`` times the cache sectors it fills. So each output row of the warp's tiles
    goes through shared memory, and lane ``l`` stores values ``l, l + 32, ...`` of it: consecutive
    lanes, consecutive addresses (each decodes its value's tile by compile-time divisors). Every
    thread reaches every barrier: no early return.
    """
    t = transform_matrices(m)
    a = t.alpha
    warp = min(32, threads)
    src = TransformSource(key.dtype, fma="cuda.fma")
    src.lines += [f"s{i}_{j} = mm[U({i * a + j}) * KT + src] if live else zero" for i in range(a) for j in range(a)]
    src.two_sided(t.AT, t.AT, lambda i, j: f"s{i}_{j}", lambda i, j: f"r{i}_{j}", lambda i, j: f"o{i}_{j}")
    stores = []
    for i in range(m):
        stores += [f"stage[slots + lane * M_TILE + U({j})] = o{i}_{j} + b" for j in range(m)]
        stores.append("cuda.syncthreads()")
        for u in range(m):
            stores += [
                f"s = lane + U({warp * u})",
                "st = t_warp + s // M_TILE",
                "if st < tiles:",
                "    n = st // TILES_PER_IMAGE",
                "    rest = st - n * TILES_PER_IMAGE",
                "    ty = rest // TILES_W",
                f"    p = ty * M_TILE + U({i})",
                "    q = (rest - ty * TILES_W) * M_TILE + s % M_TILE",
                "    if p < P and q < Q:",
                "        value = stage[slots + s]",
                "        y[image_k + n * KPQ + p * Q + q] = value",
                "        if not (value - value == zero):",
                "            flag[0] = 1",
            ]
        stores.append("cuda.syncthreads()")
    bias = "bias[k]" if key.has_bias else "zero"
    source = f'''
def winograd_output(mm, bias, y, flag, n0, tiles_arg):
    # IN mm (alpha**2 * K * tiles), IN bias (K,), OUT y (N*K*P*Q), OUT flag (1,)
    stage = cuda.shared.array(STAGE_LEN, dtype)
    tid = U(cuda.threadIdx.x)
    t = U(cuda.blockIdx.x) * THREADS + tid
    k = U(cuda.blockIdx.y)
    tiles = U(tiles_arg)
    live = t < tiles
    KT = K * tiles
    src = k * tiles + t
    b = {bias}
{indent(src.lines, 1)}
    lane = tid % WARP
    slots = (tid - lane) * M_TILE
    t_warp = t - lane
    image_k = (U(n0) * K + k) * PQ
{indent(stores, 1)}
'''
    tiles_h, tiles_w = tile_grid(key, m)
    namespace = unsigned_constants(
        K=key.K, P=key.P, Q=key.Q, PQ=key.P * key.Q, KPQ=key.K * key.P * key.Q,
        TILES_PER_IMAGE=tiles_h * tiles_w, TILES_W=tiles_w, M_TILE=m, THREADS=threads, WARP=warp,
    )
    dtype = np.dtype(key.dtype)
    namespace.update(src.constants, zero=dtype.type(0), dtype=dtype, STAGE_LEN=threads * m)
    return compile_kernel(source, "winograd_output", namespace, simulator=simulator)


# -- the algorithm objects --------------------------------------------------------------------------
class WinogradAlgorithm(WinogradTile):
    """Winograd F(m x m, 3 x 3) on an NVIDIA GPU; an implementation (:mod:`convlib.core.contracts`).

    Parameters
    ----------
    m : int
        Output tile size: 2 (F(2x2,3x3), alpha = 4) or 4 (F(4x4,3x3), alpha = 6).
    """

    def __init__(self, m: int):
        super().__init__(m)
        # Whether its GEMMs may run in TF32 when allow_tf32 permits. Measured on ResNet-50's 3x3
        # layers (H100, docs/gpu.md): TF32 GEMMs gave F(4x4,3x3) 2.5e-3 to 3.2e-3 relative
        # error, 10x cuDNN TF32's 2.9e-4 (the transforms amplify the inputs' rounding), so
        # F(4x4) stays exact FP32; F(2x2)'s transforms are additions and keep TF32's level.
        self.tf32_tolerated = m == 2

    def __repr__(self) -> str:
        return f"<convlib.cuda.winograd {self.title}>"

    def supports(self, problem: ConvProblem) -> str | None:
        reason = super().supports(problem)
        if reason is None and self.alpha**2 * problem.groups > MAX_GRID_Y:
            return (f"{self.title} runs {self.alpha**2} GEMMs per group; {problem.groups} groups exceed "
                    f"the {MAX_GRID_Y} one launch can address (direct serves them)")
        if reason is None and max(problem.C, problem.K) > MAX_GRID_Y:
            return (f"{self.title} launches one block row per channel; C={problem.C}, K={problem.K} exceed "
                    f"the {MAX_GRID_Y} one launch can address (direct serves them)")
        return reason

    def image_bytes(self, problem: ConvProblem) -> int:
        """One image's share of ``V`` and ``M``."""
        tiles_h, tiles_w = self.tiles(problem)
        return self.alpha**2 * (problem.C + problem.K) * tiles_h * tiles_w * problem.itemsize

    def batch_chunk(self, problem: ConvProblem, cap_bytes: int | None = None) -> int:
        """Images per chunk so that one chunk's ``V`` and ``M`` fit ``cap_bytes``
        (``convlib.options.workspace_cap`` by default); at least one."""
        cap_bytes = options.workspace_cap if cap_bytes is None else cap_bytes
        return max(1, min(problem.N, cap_bytes // max(self.image_bytes(problem), 1)))

    def workspace_bytes(self, problem: ConvProblem, device=None) -> int:
        """``U`` plus one chunk's ``V`` and ``M`` (see :meth:`batch_chunk`)."""
        filters = self.alpha**2 * problem.K * problem.C_per_group * problem.itemsize
        return filters + self.batch_chunk(problem) * self.image_bytes(problem)

    def run(self, problem: ConvProblem, x, w, bias, device):
        """Winograd convolution of device arrays (the contract of :mod:`convlib.core.contracts`)."""
        target, p, m, a2 = device, problem, self.m, self.alpha**2
        simulator, stream = device.simulator, device.stream
        threads = launch_knob("elementwise_threads", simulator)
        with target.activate():
            y = target.empty(p.y_shape, p.dtype)
            key = shape_key(p)
            G, Kg, Cg = p.groups, p.K_per_group, p.C_per_group
            u = target.empty((a2 * p.K * Cg,), p.dtype)
            flag = target.empty((1,), "int32")
            filters = p.K * Cg
            filter_transform_kernel(m, p.dtype, simulator)[-(-filters // threads), threads, stream](flat(w), u, flag, filters)

            tiles_h, tiles_w = self.tiles(p)
            per_image = tiles_h * tiles_w
            chunk = self.batch_chunk(p)
            v_buf = target.empty((a2 * p.C * chunk * per_image,), p.dtype)
            m_buf = target.empty((a2 * p.K * chunk * per_image,), p.dtype)
            forward = input_transform_kernel(m, key, simulator, threads)
            backward = output_transform_kernel(m, key, simulator, threads)
            no_bias = placeholder_bias(p.dtype, target)
            b = bias if bias is not None else no_bias
            engine = resolved_engine(simulator)
            xf, yf = flat(x), flat(y)
            for n0 in range(0, p.N, chunk):
                images = min(chunk, p.N - n0)
                tiles = images * per_image
                v, mm = v_buf[: a2 * p.C * tiles], m_buf[: a2 * p.K * tiles]
                forward[(-(-tiles // threads), p.C), threads, stream](xf, v, n0, tiles)
                if engine == "cublas":
                    _cublas_products(a2 * G, Kg, Cg, tiles, u, v, mm, target, p.dtype, self.tf32_tolerated)
                else:
                    gemm, grid, block = _own_gemm(p, a2, tiles, target.multiprocessors, simulator)
                    gemm[grid, block, stream](v, u, no_bias, mm, 1)
                backward[(-(-tiles // threads), p.K), threads, stream](mm, b, yf, flag, n0, tiles)
            repair_flagged_outputs(key, xf, flat(w), b, yf, flag, target)
        return y


def _products_problem(problem: ConvProblem, a2: int, tiles: int) -> ConvProblem:
    """The batched GEMM ``M = U @ V`` dressed as a 1x1 convolution our GEMM kernel serves: one
    "image" of ``alpha**2 * C`` channels by ``tiles`` pixels, ``alpha**2 * groups`` groups, so the
    kernel's per-group filter, column and output offsets land on ``U[pos, g]``, ``V[pos, g]`` and
    ``M[pos, g]``."""
    return replace(
        problem, N=1, C=a2 * problem.C, H=1, W=tiles, K=a2 * problem.K, R=1, S=1, stride=(1, 1),
        padding=(0, 0, 0, 0), dilation=(1, 1), groups=a2 * problem.groups, has_bias=False,
    )


@functools.lru_cache(maxsize=256)
def _own_gemm(problem: ConvProblem, a2: int, tiles: int, multiprocessors: int, simulator: bool):
    products = _products_problem(problem, a2, tiles)
    tile = choose_gemm_tile(products, multiprocessors, simulator)
    kernel = gemm_kernel(shape_key(products), tile, COLUMNS, simulator)
    grid, block = gemm_launch_shape(products, tile, 1)
    return kernel, grid, block


def _cublas_products(batch: int, rows: int, depth: int, tiles: int, u, v, mm, target, dtype: str,
                     tf32_tolerated: bool) -> None:
    """``M[b] = U[b] @ V[b]`` for ``batch`` products of ``rows x depth`` by ``depth x tiles``
    (one strided batched cuBLAS GEMM through CuPy; TF32 only when allowed and tolerated)."""
    import cupy

    with (cupy.cuda.Device(target.ordinal), cupy_stream(cupy, target),
          cublas_math(cupy, dtype, tf32_tolerated)):
        cupy.matmul(
            cupy.asarray(u).reshape(batch, rows, depth),
            cupy.asarray(v).reshape(batch, depth, tiles),
            out=cupy.asarray(mm).reshape(batch, rows, tiles),
        )


#: F(2x2,3x3): 16 tile positions, 2.25x fewer multiplications than direct.
F2 = WinogradAlgorithm(2)
#: F(4x4,3x3): 36 tile positions, 4x fewer multiplications than direct.
F4 = WinogradAlgorithm(4)
