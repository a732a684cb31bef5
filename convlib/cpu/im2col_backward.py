"""The backward passes by an explicit column matrix and BLAS (CPU): ``im2col``, the baseline of
the GEMM-based methods.

* :data:`DATA`: per batch chunk, the column matrix ``W_g^T dY_g`` (``C/groups*R*S`` rows by
  ``P*Q`` columns per image and group) in one batched ``numpy.matmul``, then folded back into
  ``dx`` (col2im: each column element is added at the input position its tap read).
* :data:`WEIGHT`: per batch chunk, the column matrix of ``x`` (:func:`convlib.cpu.im2col.fill_columns`,
  the forward's), and ``dW_g += dY_g cols_g^T`` image by image.

The batch is cut into chunks whose column matrix fits ``convlib.options.workspace_cap``, as for
the forward im2col (the same matrix size). Where the column matrix is the image itself (1x1,
stride 1, no padding) both passes are the GEMM alone, on ``x`` and into ``dx`` where they lie.
Compile cost: one specialisation per dtype
(``cache=True``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..core.problem import ConvProblem
from .clipping import positions_inside
from .im2col import add_bias, fill_columns


@njit(parallel=True, cache=True)
def fold_columns(
    cols,  # IN  (nb, C, R, S, P, Q): the column matrix of images n0 .. n0+nb-1
    n0, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w,
    dx,  # INOUT (N, C, H, W): the chunk's images receive the column matrix's sums
):
    nb, C, R, S, P, Q = cols.shape
    H, W = dx.shape[2], dx.shape[3]
    # One task per (image, channel): the only ones that write its plane, so no two threads meet.
    for task in prange(nb * C):
        n, c = task // C, task % C
        plane = dx[n0 + n, c]
        for r in range(R):
            for s in range(S):
                col_off = s * dil_w - pad_left
                q_lo, q_hi = positions_inside(col_off, stride_w, W, Q)
                for p in range(P):
                    h = p * stride_h - pad_top + r * dil_h
                    if h < 0 or h >= H:
                        continue
                    src = cols[n, c, r, s, p]
                    row = plane[h]
                    for q in range(q_lo, q_hi):
                        row[q * stride_w + col_off] += src[q]


@njit(parallel=True, cache=True)
def fill_channels(dx, bias, has_bias):  # OUT dx (N, C, H, W): bias[c] (or 0) everywhere
    N, C = dx.shape[0], dx.shape[1]
    for task in prange(N * C):
        dx[task // C, task % C] = bias[task % C] if has_bias else 0.0


class _Im2col:
    """The implementation contract for one backward pass (see the module docstring)."""

    def __init__(self, operation: str):
        self.operation = operation

    def supports(self, problem: ConvProblem) -> str | None:
        """im2col serves every valid problem."""
        return None

    def workspace_bytes(self, problem: ConvProblem, device=None) -> int:
        """Bytes of one batch chunk's column matrix (the chunk sized by ``workspace_cap``); none
        when the columns are the image itself (1x1, stride 1, no padding)."""
        if problem.columns_are_the_image:
            return 0
        return problem.im2col_batch_chunk() * problem.im2col_image_bytes

    def run(self, problem: ConvProblem, *arrays):
        p = problem
        if p.columns_are_the_image:
            return self._run_in_place(p, *arrays)
        G, Kg, PQ = p.groups, p.K_per_group, p.P * p.Q
        geometry = (p.stride[0], p.stride[1], p.pad_top, p.pad_left, p.dilation[0], p.dilation[1])
        chunk = p.im2col_batch_chunk()
        cols_buf = np.empty((chunk, p.C, p.R, p.S, p.P, p.Q), dtype=p.dtype)
        if self.operation == "conv2d_backward_data":
            dy, w, bias = arrays[:3]
            dx = np.empty(p.x_shape, p.dtype)
            has_bias = bias is not None
            fill_channels(dx, bias if has_bias else np.zeros(1, p.dtype), has_bias)
            filters_t = w.reshape(G, Kg, p.gemm_k).transpose(0, 2, 1)  # (G, Cg*R*S, Kg), a view
            for n0 in range(0, p.N, chunk):
                nb = min(chunk, p.N - n0)
                cols = cols_buf[:nb]
                with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is NaN, as defined
                    np.matmul(filters_t, dy[n0:n0 + nb].reshape(nb, G, Kg, PQ),
                              out=cols.reshape(nb, G, p.gemm_k, PQ))
                fold_columns(cols, n0, *geometry, dx)
            return dx
        x, dy = arrays[:2]
        dw = np.zeros((G, Kg, p.gemm_k), p.dtype)
        for n0 in range(0, p.N, chunk):
            nb = min(chunk, p.N - n0)
            cols = cols_buf[:nb]
            fill_columns(x, cols, n0, *geometry)
            grouped = cols.reshape(nb, G, p.gemm_k, PQ)
            with np.errstate(invalid="ignore", over="ignore"):
                for n in range(nb):
                    dw += np.matmul(dy[n0 + n].reshape(G, Kg, PQ), grouped[n].transpose(0, 2, 1))
        return dw.reshape(p.w_shape)

    def _run_in_place(self, p: ConvProblem, *arrays):
        """The pass whose column matrix is ``x`` (or ``dx``) itself: the GEMM alone."""
        G, Kg, PQ = p.groups, p.K_per_group, p.P * p.Q
        with np.errstate(invalid="ignore", over="ignore"):
            if self.operation == "conv2d_backward_data":
                dy, w, bias = arrays[:3]
                dx = np.empty(p.x_shape, p.dtype)
                filters_t = w.reshape(G, Kg, p.gemm_k).transpose(0, 2, 1)
                np.matmul(filters_t, dy.reshape(p.N, G, Kg, PQ), out=dx.reshape(p.N, G, p.gemm_k, PQ))
                if bias is not None:
                    add_bias(dx, bias)
                return dx
            x, dy = arrays[:2]
            dw = np.zeros((G, Kg, p.gemm_k), p.dtype)
            for n in range(p.N):
                dw += np.matmul(dy[n].reshape(G, Kg, PQ), x[n].reshape(G, p.gemm_k, PQ).transpose(0, 2, 1))
        return dw.reshape(p.w_shape)


#: ``conv2d_backward_data`` (and ``conv_transpose2d``) by BLAS and col2im.
DATA = _Im2col("conv2d_backward_data")
#: ``conv2d_backward_weight`` by im2col and BLAS.
WEIGHT = _Im2col("conv2d_backward_weight")
