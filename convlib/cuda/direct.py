"""Direct convolution on the GPU: shared-memory input tiles with their halo, several outputs per thread.

One thread block computes a ``TH x TW`` tile of output pixels of one image for ``KB`` output
channels of one group (:class:`~convlib.cuda.blocking.DirectTile`). It walks the group's input
channels ``CB`` at a time: the block stages their input tile, halo included
(``(TH-1)*sh + (R-1)*dh + 1`` rows by ``(TW-1)*sw + (S-1)*dw + 1`` columns), and the matching
``KB x CB x R x S`` filters in shared memory, then every thread accumulates ``KB x RPT x JPT``
outputs in registers: ``RPT`` consecutive rows (so each staged input value feeds up to ``R`` of
them) times ``JPT`` columns ``TW/JPT`` apart (so a warp reads consecutive shared words and writes
consecutive output words). Each staged input value is read from device memory once per block,
each output written once: for few channels this keeps the kernel at the memory floor.

When even the smallest tile's halo outgrows shared memory (very large dilations or filters), the
same kernel is built without staging and reads ``x`` and ``w`` through the cache.

Cost of a new shape: every size except the batch is a compile-time constant, so a new shape
compiles a new kernel (about a second); the batch size is a run-time argument.
"""

from __future__ import annotations

import functools

import numpy as np

from .blocking import SIMULATOR_DIRECT_TILE, DirectTile, choose_direct_tile
from .gemm import shape_key
from .launch import MAX_GRID_Y, cuda, flat, placeholder_bias


def supports(problem) -> str | None:
    """Every valid problem is served (see the module docstring for the unstaged fallback)."""
    return None


@functools.lru_cache(maxsize=None)
def direct_kernel(key, tile: DirectTile, staged: bool):
    """The direct kernel for the problem shape ``key`` and ``tile``.

    Returns
    -------
    kernel(x, w, bias, y, image0)
        Flat ``x``, ``w``, ``y``; ``bias`` ``(K,)``; computes images ``image0 + blockIdx.y``.
        Launch with :func:`direct_launch_shape`.
    """
    dtype = np.dtype(key.dtype)
    zero = dtype.type(0)
    has_bias = key.has_bias
    C, K, H, W, R, S = key.C, key.K, key.H, key.W, key.R, key.S
    Cg, Kg = key.C_per_group, key.K_per_group
    sh, sw = key.stride
    dh, dw = key.dilation
    top, left = key.pad_top, key.pad_left
    P, Q = key.P, key.Q
    RS = R * S
    TH, TW, RPT, JPT = tile.TH, tile.TW, tile.RPT, tile.JPT
    KB, CB = min(tile.KB, Kg), min(tile.CB, Cg)
    TX = TW // JPT
    NT = tile.threads
    IN_H, IN_W = tile.input_tile(key)
    STAGE = IN_H * IN_W
    K_CHUNKS, C_CHUNKS = -(-Kg // KB), -(-Cg // CB)
    TILES_Q = -(-Q // TW)
    TILES = -(-P // TH) * TILES_Q
    # An unstaged kernel still declares (tiny) shared arrays: numba needs a constant shape.
    X_SHAPE = (CB, IN_H, IN_W) if staged else (1, 1, 1)
    W_SHAPE = (KB, CB, R, S) if staged else (1, 1, 1, 1)

    def kernel(x, w, bias, y, image0):
        # IN x (N*C*H*W), IN w (K*Cg*R*S), IN bias (K,), OUT y (N*K*P*Q)
        x_stage = cuda.shared.array(X_SHAPE, dtype)
        w_stage = cuda.shared.array(W_SHAPE, dtype)
        acc = cuda.local.array((KB, RPT, JPT), dtype)

        tid = cuda.threadIdx.x
        block = cuda.blockIdx.x
        group_chunk = block // TILES
        tile_id = block - group_chunk * TILES
        g = group_chunk // K_CHUNKS
        k0 = (group_chunk - g * K_CHUNKS) * KB
        img = image0 + cuda.blockIdx.y
        tp = tile_id // TILES_Q
        p0 = tp * TH
        q0 = (tile_id - tp * TILES_Q) * TW
        ih_base = p0 * sh - top
        iw_base = q0 * sw - left
        tx = tid % TX
        ty = tid // TX
        x_image = (img * C + g * Cg) * (H * W)
        w_group = (g * Kg + k0) * (Cg * RS)

        for k in range(KB):
            for i in range(RPT):
                for j in range(JPT):
                    acc[k, i, j] = zero

        for cc in range(C_CHUNKS):
            c0 = cc * CB
            if staged:
                for e in range(tid, CB * STAGE, NT):
                    c = e // STAGE
                    rest = e - c * STAGE
                    row = rest // IN_W
                    col = rest - row * IN_W
                    ih = ih_base + row
                    iw = iw_base + col
                    value = zero
                    if c0 + c < Cg and 0 <= ih < H and 0 <= iw < W:
                        value = x[x_image + (c0 + c) * (H * W) + ih * W + iw]
                    x_stage[c, row, col] = value
                for e in range(tid, KB * CB * RS, NT):
                    k = e // (CB * RS)
                    rest = e - k * (CB * RS)
                    c = rest // RS
                    rs = rest - c * RS
                    r = rs // S
                    value = zero
                    if k0 + k < Kg and c0 + c < Cg:
                        value = w[w_group + k * (Cg * RS) + (c0 + c) * RS + rs]
                    w_stage[k, c, r, rs - r * S] = value
                cuda.syncthreads()
            for c in range(CB):
                for r in range(R):
                    for s in range(S):
                        for i in range(RPT):
                            for j in range(JPT):
                                row = (ty * RPT + i) * sh + r * dh
                                col = (tx + TX * j) * sw + s * dw
                                if staged:
                                    xv = x_stage[c, row, col]
                                else:
                                    ih = ih_base + row
                                    iw = iw_base + col
                                    xv = zero
                                    if c0 + c < Cg and 0 <= ih < H and 0 <= iw < W:
                                        xv = x[x_image + (c0 + c) * (H * W) + ih * W + iw]
                                for k in range(KB):
                                    if staged:
                                        wv = w_stage[k, c, r, s]
                                    else:
                                        wv = zero
                                        if k0 + k < Kg and c0 + c < Cg:
                                            wv = w[w_group + k * (Cg * RS) + (c0 + c) * RS + r * S + s]
                                    acc[k, i, j] += xv * wv
            if staged:
                cuda.syncthreads()

        for k in range(KB):
            ko = g * Kg + k0 + k
            if k0 + k < Kg:
                b = bias[ko] if has_bias else zero
                for i in range(RPT):
                    p = p0 + ty * RPT + i
                    if p < P:
                        for j in range(JPT):
                            q = q0 + tx + TX * j
                            if q < Q:
                                y[((img * K + ko) * P + p) * Q + q] = acc[k, i, j] + b

    return cuda.jit(kernel)


def direct_launch_shape(problem, tile: DirectTile, n_images: int) -> tuple[tuple[int, int], int]:
    """Grid and block of :func:`direct_kernel` for ``n_images`` images."""
    Kg = problem.K_per_group
    k_chunks = -(-Kg // min(tile.KB, Kg))
    tiles = -(-problem.P // tile.TH) * -(-problem.Q // tile.TW)
    return (problem.groups * k_chunks * tiles, n_images), tile.threads


def conv2d(problem, x, w, bias, device):
    """Direct convolution of device arrays (module contract: see :mod:`convlib.registry`)."""
    target = device
    with target.activate():
        y = target.empty(problem.y_shape, problem.dtype)
        if problem.N == 0:
            return y
        tile = choose_direct_tile(problem, target.simulator)
        staged = tile is not None
        if tile is None:
            tile = SIMULATOR_DIRECT_TILE if target.simulator else DirectTile(TH=4, TW=64, RPT=1, JPT=2, KB=1, CB=1)
        kernel = direct_kernel(shape_key(problem), tile, staged)
        b = bias if bias is not None else placeholder_bias(problem.dtype, target)
        xf, wf, yf = flat(x), flat(w), flat(y)
        for image0 in range(0, problem.N, MAX_GRID_Y):
            grid, block = direct_launch_shape(problem, tile, min(MAX_GRID_Y, problem.N - image0))
            kernel[grid, block, target.stream](xf, wf, b, yf, image0)
    return y
