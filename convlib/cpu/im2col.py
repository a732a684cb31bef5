"""im2col + GEMM on the CPU: an explicit column matrix per batch chunk, multiplied by BLAS.

For a chunk of ``nb`` images the column matrix has shape ``(nb, groups, C/groups*R*S, P*Q)``:
row ``(c, r, s)`` of image ``n`` holds, for every output pixel ``(p, q)``, the input value that
filter tap meets (zero in the padding). The filters, viewed as ``(groups, K/groups, C/groups*R*S)``,
multiply it in one batched ``numpy.matmul`` (OpenBLAS SGEMM/DGEMM per (image, group)) whose output
is already the NCHW result chunk ``(nb, groups, K/groups, P*Q)``: no transpose afterwards.

Memory: the column matrix is ``R*S/(stride_h*stride_w)`` times the input, the method's known cost.
The batch is cut into chunks whose column matrix fits ``convlib.options.workspace_cap``
(default 256 MiB; at least one image per chunk), so large batches run in bounded memory instead of
failing (the seed thesis' version failed past N=56 on a 1024^2 image). A 1x1 convolution at
stride 1 without padding has the image itself as its column matrix
(:attr:`~convlib.core.problem.ConvProblem.columns_are_the_image`): it is multiplied where it lies,
with no workspace (ResNet-50's s4 1x1 1024>256 layer at batch 8 copied 6.4 MB for nothing).

Compile cost: one numba specialisation per dtype, cached on disk (``cache=True``); shapes,
strides, padding and dilation are run-time arguments, so a new shape costs nothing.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..core import output_cache
from ..core.problem import ConvProblem
from .clipping import positions_inside


def supports(problem: ConvProblem) -> str | None:
    """im2col serves every valid problem."""
    return None


def workspace_bytes(problem: ConvProblem, device=None) -> int:
    """Bytes of one batch chunk's column matrix (the chunk sized by
    ``convlib.options.workspace_cap``); none when the columns are the image itself."""
    if problem.columns_are_the_image:
        return 0
    return problem.im2col_batch_chunk() * problem.im2col_image_bytes


@njit(parallel=True, cache=True)
def fill_columns(
    x,  # IN  (N, C, H, W)
    cols,  # OUT (nb, C, R, S, P, Q): the column matrix of images n0 .. n0+nb-1
    n0, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w,
):
    nb, C, R, S, P, Q = cols.shape
    H, W = x.shape[2], x.shape[3]
    # One task per (image, channel, filter row): enough tasks for both threads on any shape.
    for task in prange(nb * C * R):
        r = task % R
        c = (task // R) % C
        n = task // (R * C)
        for s in range(S):
            col_off = s * dil_w - pad_left
            # Output columns q whose input column q*stride_w + col_off lies inside [0, W):
            # the loop over them has no bounds test, so it vectorises (stride 1 is a plain copy).
            q_lo, q_hi = positions_inside(col_off, stride_w, W, Q)
            for p in range(P):
                out = cols[n, c, r, s, p]
                h = p * stride_h - pad_top + r * dil_h
                if h < 0 or h >= H:
                    out[:] = 0
                    continue
                row = x[n0 + n, c, h]
                out[:q_lo] = 0
                for q in range(q_lo, q_hi):
                    out[q] = row[q * stride_w + col_off]
                out[q_hi:] = 0


@njit(parallel=True, cache=True)
def add_bias(y, bias):  # INOUT y (n, K, P, Q); IN bias (K,)
    n_img, K = y.shape[0], y.shape[1]
    for task in prange(n_img * K):
        plane = y[task // K, task % K]
        b = bias[task % K]
        for p in range(plane.shape[0]):
            plane[p] += b


def run(problem: ConvProblem, x: np.ndarray, w: np.ndarray, bias, device=None) -> np.ndarray:
    """Convolve by im2col + BLAS GEMM, the batch in chunks that bound the workspace.

    Parameters
    ----------
    problem : ConvProblem
    x : ndarray (N, C, H, W), C-contiguous
    w : ndarray (K, C // groups, R, S), C-contiguous
    bias : ndarray (K,) or None
    device : None
        Unused on the CPU.

    Returns
    -------
    ndarray (N, K, P, Q)
    """
    p = problem
    G, Kg, PQ = p.groups, p.K_per_group, p.P * p.Q
    y = output_cache.empty(p.y_shape, p.dtype)
    filters = w.reshape(G, Kg, p.gemm_k)
    if p.columns_are_the_image:
        with np.errstate(invalid="ignore", over="ignore"):
            np.matmul(filters, x.reshape(p.N, G, p.gemm_k, PQ), out=y.reshape(p.N, G, Kg, PQ))
        if bias is not None:
            add_bias(y, bias)
        return y
    chunk = p.im2col_batch_chunk()
    cols_buf = np.empty((chunk, p.C, p.R, p.S, p.P, p.Q), dtype=p.dtype)
    for n0 in range(0, p.N, chunk):
        nb = min(chunk, p.N - n0)
        cols = cols_buf[:nb]
        fill_columns(x, cols, n0, p.stride[0], p.stride[1], p.pad_top, p.pad_left, p.dilation[0], p.dilation[1])
        # (nb, G, Cg*R*S, PQ): channels of a group are adjacent in C, so this is a free reshape.
        out = y[n0:n0 + nb].reshape(nb, G, Kg, PQ)
        # inf - inf is NaN here as in the definition: not a condition to warn the caller about.
        with np.errstate(invalid="ignore", over="ignore"):
            np.matmul(filters, cols.reshape(nb, G, p.gemm_k, PQ), out=out)
    if bias is not None:
        add_bias(y, bias)
    return y
