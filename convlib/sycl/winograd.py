"""Winograd F(2x2,3x3) and F(4x4,3x3) on a SYCL device: three transform kernels and a batched GEMM.

The method (Lavin & Gray 2015; matrices from :mod:`convlib.core.winograd_math`), ``alpha = m + 2``, the
same steps as :mod:`convlib.cpu.winograd`:

1. **Filter transform**, once per call, one work-item per ``(k, c)``:
   ``U[pos, k, c] = (G w[k, c] G^T)[pos]`` for the ``alpha**2`` tile positions ``pos``.
2. Then per chunk of whole images (the batch cut so that one chunk's ``V + M`` stays under
   the ``winograd_chunk_bytes`` knob, at least one image):

   a. The chunk's images are copied into a buffer of ``tiles_h*m + 2`` rows by ``tiles_w*m + 2``
      columns by :func:`pad_images_kernel`, with zeros for the problem's padding and under the
      partial tiles at the bottom and right edges, so the input transform tests no bounds.
      (Reading ``x`` with bounds tests in the transform instead was 5x slower there;
      ``dpt.zeros`` plus dpctl's strided copy took 20 ms for ResNet's 56x56x64 layer at batch 8.)
   b. **Input transform**, one work-item per ``(c, tile)``, adjacent work-items on adjacent
      tiles: ``V[pos, c, t] = (B^T d_t B)[pos]`` for the ``alpha x alpha`` tile ``d_t`` (tiles
      overlap by 2).
   c. **Batched GEMM** over the tile positions, per group:
      ``M[pos, g] (Kg x T) = U[pos, g] (Kg x Cg) @ V[pos, g] (Cg x T)``, by oneMKL
      (``dpnp.matmul``) or by the backend's own GEMM kernel (:func:`convlib.sycl.im2col.gemm_kernel`,
      one launch per position), chosen like im2col's (the ``im2col_gemm`` knob).
   d. **Output transform**, one work-item per ``(k, tile)``: ``y = A^T M_t A + bias``. One kernel
      over all tiles stores the whole tiles without per-output tests; a second, over the right
      column and bottom row of partial tiles only (:meth:`WinogradAlgorithm.edge_blocks`),
      stores only their valid outputs. (One kernel testing every store was 5x slower on the
      OpenCL CPU device: the tests turn the stores into masked scatters.)

Non-finite values: as on the CPU (:mod:`convlib.cpu.winograd`), one ``inf`` or ``NaN`` input
would spread over its tiles; after the output transform the call looks for non-finite outputs and
recomputes them by the definition (:mod:`convlib.sycl.exact`). (A flag raised inside the output
kernels instead made them 26-35% slower on 56x56 images: the conditional store changed how the
OpenCL CPU runtime vectorises them; one pass over the result costs ~0.5 ms per 6.4 MB.)

The 1-D transforms are generated as straight-line source from the matrices of
:mod:`convlib.core.winograd_math` (zero entries dropped, +-1 entries as additions, other entries as
FMAs with constants of the working dtype), so every product the matrices do not need is gone
and float32 kernels stay in float32.

Workspace: ``U`` (``alpha**2 * K * C/groups`` values, the filters' size times ``alpha**2 / 9``)
plus one chunk's padded input, ``V`` and ``M``; never more than ``winograd_chunk_bytes`` for the
chunk unless a single image needs more.

Compile cost (first launch in a process, 0.2-1 s each, no on-disk cache): four transform kernels
per ``(m, dtype)`` (filter, input, output of whole tiles, output of partial tiles) and the
padding copy; the GEMM kernel per ``(MB, dtype)`` is im2col's (shared with it), oneMKL needs
none. Every size, padding and group count is a run-time argument: a new shape costs nothing.
"""

from __future__ import annotations

import functools

import numpy as np

from ..core.problem import ConvProblem
from ..core.winograd_math import WinogradTile, transform_matrices
from ..core.winograd_source import TransformSource, indent
from . import im2col, runtime
from .exact import repair_nonfinite
from .launch import fused_multiply_add, launch, register_block
from .memory import bias_or_zeros, device_empty
from .tables import KNOBS, blocking_for


# -- generated straight-line transforms ---------------------------------------------------------
def render_filter_transform(m: int, dtype: str) -> tuple[str, dict]:
    """Source and constants of the filter-transform kernel ``winograd_filter_transform``."""
    t = transform_matrices(m)
    a = t.alpha
    src = TransformSource(dtype)
    src.lines += [f"g{r}_{s} = w[k, c, {r}, {s}]" for r in range(3) for s in range(3)]
    src.two_sided(t.G, t.G, lambda r, s: f"g{r}_{s}", lambda i, s: f"h{i}_{s}", lambda i, j: f"u{i}_{j}")
    src.lines += [f"U[{i * a + j}, k, c] = u{i}_{j}" for i in range(a) for j in range(a)]
    text = f'''
def winograd_filter_transform(
    nd: kapi.NdItem,
    w,  # IN  (K, Cg, 3, 3)
    U,  # OUT (alpha**2, K, Cg)
):
    k = nd.get_global_id(0)
    c = nd.get_global_id(1)
    if k < w.shape[0] and c < w.shape[1]:
{indent(src.lines, 2)}
'''
    return text, src.constants


def render_input_transform(m: int, dtype: str) -> tuple[str, dict]:
    """Source and constants of the input-transform kernel ``winograd_input_transform``."""
    t = transform_matrices(m)
    a = t.alpha
    src = TransformSource(dtype)
    src.lines += [f"d{i}_{j} = xp[n, c, h0 + {i}, w0 + {j}]" for i in range(a) for j in range(a)]
    src.two_sided(t.BT, t.BT, lambda i, j: f"d{i}_{j}", lambda i, j: f"e{i}_{j}", lambda i, j: f"v{i}_{j}")
    src.lines += [f"V[{i * a + j}, c, tile] = v{i}_{j}" for i in range(a) for j in range(a)]
    text = f'''
def winograd_input_transform(
    nd: kapi.NdItem,
    xp,  # IN  (nb, C, tiles_h*m + 2, tiles_w*m + 2) the chunk's zero-padded images
    V,   # OUT (alpha**2, C, T) T = nb * tiles_h * tiles_w, tile t = (n * tiles_h + ty) * tiles_w + tx
    tiles_h_arg, tiles_w_arg,
):
    # max(., 1): provably positive divisors, so plain unsigned division (see direct.py).
    tiles_h, tiles_w = max(tiles_h_arg, 1), max(tiles_w_arg, 1)
    c = nd.get_global_id(0)
    tile = nd.get_global_id(1)
    if c < V.shape[1] and tile < V.shape[2]:
        n = tile // (tiles_h * tiles_w)
        rest = tile - n * (tiles_h * tiles_w)
        ty = rest // tiles_w
        tx = rest - ty * tiles_w
        h0 = ty * {m}
        w0 = tx * {m}
{indent(src.lines, 2)}
'''
    return text, src.constants


def render_output_transform(m: int, dtype: str, guarded: bool = True) -> tuple[str, dict]:
    """Source and constants of the output-transform kernel ``winograd_output_transform``.

    ``guarded=False`` stores every output of a tile: only for launches over whole tiles.
    """
    t = transform_matrices(m)
    a = t.alpha
    src = TransformSource(dtype)
    src.lines += [f"s{i}_{j} = M[{i * a + j}, k, tile]" for i in range(a) for j in range(a)]
    src.two_sided(t.AT, t.AT, lambda i, j: f"s{i}_{j}", lambda i, j: f"r{i}_{j}", lambda i, j: f"o{i}_{j}")
    if not guarded:
        # Every tile of the chunk, the whole ones storing without per-output tests (5x faster
        # than testing each store, which makes them masked scatters; a branch between the two
        # inside one kernel, even on a uniform argument, was as slow). Work-item = tile, so the
        # loads of M stay contiguous across work-items.
        args = "n0_arg, tiles_h_arg, tiles_w_arg,"
        mapping = """
    n0, tiles_h, tiles_w = max(n0_arg, 0), max(tiles_h_arg, 1), max(tiles_w_arg, 1)
    P, Q = y.shape[2], y.shape[3]
    k = nd.get_global_id(0)
    tile = nd.get_global_id(1)
    if k < M.shape[1] and tile < M.shape[2]:
        n = tile // (tiles_h * tiles_w)
        rest = tile - n * (tiles_h * tiles_w)
        ty = rest // tiles_w
        tx = rest - ty * tiles_w"""
        stores = [f"if p0 + {m} <= P and q0 + {m} <= Q:"]
        stores += [f"    y[n0 + n, k, p0 + {i}, q0 + {j}] = o{i}_{j} + b" for i in range(m) for j in range(m)]
    else:
        # The partial tiles only: tile rows ty0 .. ty0 + block_h - 1, columns tx0 .. + block_w - 1
        # of every image of the chunk, each store tested.
        args = "n0_arg, tiles_h_arg, tiles_w_arg, ty0_arg, tx0_arg, block_h_arg, block_w_arg,"
        mapping = """
    n0, tiles_h, tiles_w = max(n0_arg, 0), max(tiles_h_arg, 1), max(tiles_w_arg, 1)
    ty0, tx0, block_h, block_w = max(ty0_arg, 0), max(tx0_arg, 0), max(block_h_arg, 1), max(block_w_arg, 1)
    P, Q = y.shape[2], y.shape[3]
    k = nd.get_global_id(0)
    item = nd.get_global_id(1)
    if k < M.shape[1] and item < (M.shape[2] // (tiles_h * tiles_w)) * (block_h * block_w):
        n = item // (block_h * block_w)
        rest = item - n * (block_h * block_w)
        ty = ty0 + rest // block_w
        tx = tx0 + rest - (rest // block_w) * block_w
        tile = (n * tiles_h + ty) * tiles_w + tx"""
        stores = []
        for i in range(m):
            stores.append(f"if p0 + {i} < P:")
            for j in range(m):
                stores.append(f"    if q0 + {j} < Q:")
                stores.append(f"        y[n0 + n, k, p0 + {i}, q0 + {j}] = o{i}_{j} + b")
    text = f'''
def winograd_output_transform(
    nd: kapi.NdItem,
    M,     # IN  (alpha**2, K, T) the GEMM results of the chunk
    bias,  # IN  (K,)
    y,     # OUT (N, K, P, Q) only the valid outputs of the chunk's tiles
    {args}
):{mapping}
        p0 = ty * {m}
        q0 = tx * {m}
        b = bias[k]
{indent(src.lines, 2)}
{indent(stores, 2)}
'''
    return text, src.constants


_RENDERERS = {
    "filter": render_filter_transform,
    "input": render_input_transform,
    "output": render_output_transform,
}


@functools.lru_cache(maxsize=None)
def transform_kernel(which: str, m: int, dtype: str, guarded: bool = True):
    """The compiled ``which`` ("filter", "input" or "output") transform of F(m x m, 3 x 3).

    ``guarded`` only matters for "output" (see :func:`render_output_transform`).
    """
    mods = runtime.load()
    if which == "output":
        text, constants = render_output_transform(m, dtype, guarded)
    else:
        text, constants = _RENDERERS[which](m, dtype)
    namespace = {"fma": fused_multiply_add(), "kapi": mods.kapi, **constants}
    name = f"winograd_{which}_transform"
    exec(compile(text, f"<convlib sycl {name} F({m}x{m},3x3) {dtype}>", "exec"), namespace)
    return mods.dpex.kernel(namespace[name])


@functools.lru_cache(maxsize=None)
def pad_images_kernel():
    """The kernel copying images ``n0 ..`` of ``x`` into the zero-padded chunk buffer ``xp``.

    One work-item per row of ``xp`` writes the whole row (zeros included), so the buffer needs
    no separate zero fill; a row per item, as in the backend's other copy kernels.
    """
    mods = runtime.load()
    dpex, kapi = mods.dpex, mods.kapi

    @dpex.kernel
    def pad_images(
        nd: kapi.NdItem,
        x,   # IN  (N, C, H, W)
        xp,  # OUT (nb, C, Hp, Wp): x[n0 + n] at rows top.., columns left.., zeros elsewhere
        n0_arg, top_arg, left_arg,
    ):
        # Clamped: provably non-negative indices and divisors (see direct.py).
        n0, top, left = max(n0_arg, 0), max(top_arg, 0), max(left_arg, 0)
        C, Hp, Wp = max(xp.shape[1], 1), xp.shape[2], xp.shape[3]
        H, W = x.shape[2], x.shape[3]
        image_channel = nd.get_global_id(0)
        h = nd.get_global_id(1)
        if image_channel < xp.shape[0] * C and h < Hp:
            n = image_channel // C
            c = image_channel - n * C
            inside = h >= top and h < top + H
            first = min(left, Wp) if inside else Wp
            last = min(left + W, Wp) if inside else Wp
            for j in range(first):
                xp[n, c, h, j] = 0
            for j in range(first, last):
                xp[n, c, h, j] = x[n0 + n, c, h - top, j - left]
            for j in range(last, Wp):
                xp[n, c, h, j] = 0

    return pad_images


# -- the algorithm objects ----------------------------------------------------------------------
class WinogradAlgorithm(WinogradTile):
    """Winograd F(m x m, 3 x 3) on a SYCL device; an implementation (:mod:`convlib.core.contracts`).

    Parameters
    ----------
    m : int
        Output tile size: 2 (F(2x2,3x3), alpha = 4) or 4 (F(4x4,3x3), alpha = 6).
    """

    def __repr__(self) -> str:
        return f"<convlib.sycl.winograd {self.title}>"

    def padded_image_shape(self, problem: ConvProblem) -> tuple[int, int]:
        """Rows and columns of an image as the input transform reads it (zeros around)."""
        tiles_h, tiles_w = self.tiles(problem)
        return tiles_h * self.m + 2, tiles_w * self.m + 2

    def edge_blocks(self, problem: ConvProblem) -> list[tuple[int, int, int, int]]:
        """The partial tiles as ``(ty0, tx0, tile rows, tile columns)`` blocks of every image.

        The right column of tiles when ``Q`` is not a multiple of ``m``, the bottom row (less
        that column) when ``P`` is not; each is one launch of the guarded output transform.
        """
        tiles_h, tiles_w = self.tiles(problem)
        whole_h, whole_w = problem.P // self.m, problem.Q // self.m
        blocks = []
        if whole_w < tiles_w:
            blocks.append((0, whole_w, tiles_h, tiles_w - whole_w))
        if whole_h < tiles_h and whole_w:
            blocks.append((whole_h, 0, tiles_h - whole_h, whole_w))
        return blocks

    def batch_chunk(self, problem: ConvProblem, chunk_bytes: int | None = None) -> int:
        """Images per chunk so that one chunk's padded input, ``V`` and ``M`` fit ``chunk_bytes``."""
        chunk_bytes = KNOBS.winograd_chunk_bytes if chunk_bytes is None else chunk_bytes
        tiles_h, tiles_w = self.tiles(problem)
        hp, wp = self.padded_image_shape(problem)
        per_image = (problem.C * hp * wp + self.alpha**2 * (problem.C + problem.K) * tiles_h * tiles_w) * problem.itemsize
        return max(1, min(problem.N, chunk_bytes // max(per_image, 1)))

    def workspace_bytes(self, problem: ConvProblem, device=None, *, chunk_bytes: int | None = None) -> int:
        """Bytes allocated beyond x, w, bias and y: ``U`` plus one chunk (see :meth:`batch_chunk`)."""
        nb = self.batch_chunk(problem, chunk_bytes)
        tiles_h, tiles_w = self.tiles(problem)
        hp, wp = self.padded_image_shape(problem)
        a2 = self.alpha**2
        values = a2 * problem.K * problem.C_per_group + nb * (
            problem.C * hp * wp + a2 * (problem.C + problem.K) * tiles_h * tiles_w
        )
        return values * problem.itemsize

    def run(self, problem: ConvProblem, x, w, bias, device):
        """The convolution of ``x`` with ``w`` on ``device`` (a ``dpctl.SyclQueue``).

        Parameters
        ----------
        problem : ConvProblem
        x : usm_ndarray (N, C, H, W), C-contiguous, on ``device``
        w : usm_ndarray (K, C // groups, 3, 3)
        bias : usm_ndarray (K,) or None
        device : dpctl.SyclQueue

        Returns
        -------
        usm_ndarray (N, K, P, Q) on ``device``
        """
        p, m, a2 = problem, self.m, self.alpha**2
        engine = KNOBS.im2col_gemm
        mods = runtime.load()
        dpt = mods.dpt
        y = device_empty(p.y_shape, p.dtype, device, result=True)
        if y.size == 0:
            return y
        G, Kg, Cg = p.groups, p.K_per_group, p.C_per_group
        blk = blocking_for(device.sycl_device, p.dtype)
        U = device_empty((a2, p.K, Cg), p.dtype, device)
        launch(transform_kernel("filter", m, p.dtype), (p.K, Cg), (1, KNOBS.winograd_transform_wg), device, w, U)

        tiles_h, tiles_w = self.tiles(p)
        hp, wp = self.padded_image_shape(p)
        nb_max = self.batch_chunk(p)
        tiles_per_image = tiles_h * tiles_w
        xp_buf = device_empty((nb_max, p.C, hp, wp), p.dtype, device)
        V_buf = device_empty((a2 * p.C * nb_max * tiles_per_image,), p.dtype, device)
        M_buf = device_empty((a2 * p.K * nb_max * tiles_per_image,), p.dtype, device)
        pad_images = pad_images_kernel()
        edge_blocks = self.edge_blocks(p)
        input_transform = transform_kernel("input", m, p.dtype)
        output_whole = transform_kernel("output", m, p.dtype, False)
        output_edges = transform_kernel("output", m, p.dtype, True) if edge_blocks else None
        bias_full = bias_or_zeros(p, bias, device)
        if engine == "kernel":
            mb = register_block(Kg, blk.gemm_mb)
            multiply = im2col.gemm_kernel(mb, p.dtype)
            zero_bias = bias_or_zeros(p, None, device)
        else:
            dpnp = mods.dpnp
            U_groups = dpnp.asarray(dpt.reshape(U, (a2, G, Kg, Cg)))
        for n0 in range(0, p.N, nb_max):
            nb = min(nb_max, p.N - n0)
            T = nb * tiles_per_image
            xp = xp_buf[:nb]
            launch(pad_images, (nb * p.C, hp), (1, blk.im2col_wg), device, x, xp, n0, p.pad_top, p.pad_left)
            V = dpt.reshape(V_buf[: a2 * p.C * T], (a2, p.C, T))
            M = dpt.reshape(M_buf[: a2 * p.K * T], (a2, p.K, T))
            launch(input_transform, (p.C, T), (1, KNOBS.winograd_transform_wg), device, xp, V, tiles_h, tiles_w)
            if engine == "kernel":
                # im2col's GEMM kernel, one position at a time: filters U[pos] (K x Cg), the
                # "column matrix" V[pos] whose rows of group g start at g*Cg, as that kernel expects.
                for pos in range(a2):
                    launch(
                        multiply, (p.K // mb, T), (1, blk.gemm_wg), device,
                        U[pos], V[pos:pos + 1], zero_bias, M[pos:pos + 1], 0, Kg,
                    )
            else:
                dpnp.matmul(
                    U_groups,
                    dpnp.asarray(dpt.reshape(V, (a2, G, Cg, T))),
                    out=dpnp.asarray(dpt.reshape(M, (a2, G, Kg, T))),
                )
            launch(output_whole, (p.K, T), (1, KNOBS.winograd_transform_wg), device, M, bias_full, y,
                   n0, tiles_h, tiles_w)
            for ty0, tx0, block_h, block_w in edge_blocks:
                launch(output_edges, (p.K, nb * block_h * block_w), (1, KNOBS.winograd_transform_wg), device,
                       M, bias_full, y, n0, tiles_h, tiles_w, ty0, tx0, block_h, block_w)
        # An inf or NaN input (or an overflow) spreads over its tiles: recompute the non-finite
        # outputs by the definition.
        repair_nonfinite(p, x, w, bias_full, y, device)
        return y



#: F(2x2,3x3): 16 tile positions, 2.25x fewer multiplications than direct.
F2 = WinogradAlgorithm(2)
#: F(4x4,3x3): 36 tile positions, 4x fewer multiplications than direct.
F4 = WinogradAlgorithm(4)
