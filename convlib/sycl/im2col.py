"""im2col + GEMM on a SYCL device: a column-matrix kernel, then oneMKL or our own GEMM kernel.

For a chunk of ``nb`` images the column matrix has shape ``(nb, C*R*S, P*Q)``: row ``(c, r, s)``
holds, for every output pixel, the input value that filter tap meets (zero in the padding). The
rows of group ``g`` are adjacent, so per image and group ``y[n, g] = W_g @ cols[n, g]`` with
``W_g`` the ``(K/groups, C/groups*R*S)`` filter matrix: one batched GEMM per chunk, written
straight into the NCHW result (no transpose).

The GEMM is the ``im2col_gemm`` knob of :data:`convlib.sycl.tables.KNOBS`
(``KNOBS.override(im2col_gemm="kernel")``):

``"onemkl"``
    ``dpnp.matmul`` (oneMKL's batched GEMM for SYCL), bias added afterwards.
``"kernel"``
    Our numba-dpex kernel: adjacent work-items take adjacent output pixels (columns of the
    column matrix), each keeps ``gemm_mb`` output channels in registers; bias in the epilogue.

Workspace: the column matrix is ``R*S/(stride_h*stride_w)`` times the input; the batch is cut
into chunks whose column matrix fits ``convlib.options.workspace_cap`` (at least one image),
as on the CPU. A padded input adds one zero-padded copy of ``x``.

Compile cost (first launch in a process, 0.2-1 s each, no on-disk cache): the column kernel per
dtype; the GEMM kernel per ``(MB, dtype)``, ``MB`` a power of two <= 8. Sizes,
padding, dilation, groups and the vertical stride are run-time arguments. oneMKL needs no compile
of ours.
"""

from __future__ import annotations

import functools

from ..core.options import options
from ..core.problem import ConvProblem
from . import runtime
from .launch import element_type, fused_multiply_add, launch, register_block
from .memory import bias_or_zeros, device_empty, padded_input_bytes, zero_padded_input
from .tables import KNOBS, blocking_for

def supports(problem: ConvProblem) -> str | None:
    """im2col serves every valid problem."""
    return None


def batch_chunk(problem: ConvProblem) -> int:
    """Images per chunk: their column matrices fit what the workspace cap leaves beside the
    zero-padded copy of ``x`` (at least one image)."""
    return problem.im2col_batch_chunk(max(1, options.workspace_cap - padded_input_bytes(problem)))


def workspace_bytes(problem: ConvProblem, device=None) -> int:
    """One batch chunk's column matrix plus the zero-padded copy of ``x`` (when padded)."""
    return batch_chunk(problem) * problem.im2col_image_bytes + padded_input_bytes(problem)


@functools.lru_cache(maxsize=None)
def column_kernel():
    """The im2col kernel: one work-item per (column-matrix row, output row ``p``).

    Each work-item copies the ``Q`` values of its output row in a loop. One work-item per value
    was 2-5x slower on the OpenCL CPU device: its per-item cost dwarfs a copy.
    """
    mods = runtime.load()
    dpex, kapi = mods.dpex, mods.kapi

    @dpex.kernel
    def fill_columns(
        nd: kapi.NdItem,
        x,  # IN  (N, C, Hp, Wp) zero-padded input
        cols,  # OUT (nb, C*R*S, P*Q): column matrix of images n0 .. n0+nb-1
        n0_arg, R_arg, S_arg, P_arg, Q_arg, stride_h_arg, stride_w_arg, dil_h_arg, dil_w_arg,
    ):
        # max(., 1): provably non-negative indices and divisors, so plain unsigned arithmetic
        # instead of numba's floor-division and wraparound fix-ups (see direct.py).
        n0, R, S, P, Q = max(n0_arg, 0), max(R_arg, 1), max(S_arg, 1), max(P_arg, 1), max(Q_arg, 1)
        stride_h, stride_w = max(stride_h_arg, 1), max(stride_w_arg, 1)
        dil_h, dil_w = max(dil_h_arg, 1), max(dil_w_arg, 1)
        row_id = nd.get_global_id(0)
        p = nd.get_global_id(1)
        rows = cols.shape[1]
        if row_id < cols.shape[0] * rows and p < P:
            b = row_id // rows
            row = row_id - b * rows
            c = row // (R * S)
            rs = row - c * (R * S)
            r = rs // S
            s = rs - r * S
            h = p * stride_h + r * dil_h
            w0 = s * dil_w
            for q in range(Q):
                cols[b, row, p * Q + q] = x[n0 + b, c, h, w0 + q * stride_w]

    return fill_columns


@functools.lru_cache(maxsize=None)
def gemm_kernel(MB: int, dtype: str):
    """``y[n, g*Kg + m, j] = bias + sum_k A[g*Kg + m, k] * cols[b, g*Kgemm + k, j]``, ``MB`` rows per item."""
    mods = runtime.load()
    dpex, kapi = mods.dpex, mods.kapi
    acc_type = element_type(dtype)
    fma = fused_multiply_add()

    @dpex.kernel
    def gemm_rows_block(
        nd: kapi.NdItem,
        filters,  # IN  (K, Kgemm): row k = filter k flattened over (c, r, s)
        cols,  # IN  (nb, C*R*S, PQ)
        bias,  # IN  (K,)
        y,  # OUT (N, K, PQ)
        n0_arg, Kg_arg,
    ):
        n0, Kg = max(n0_arg, 0), max(Kg_arg, 1)  # provably non-negative: no wraparound selects
        block_id = nd.get_global_id(0)
        j = nd.get_global_id(1)
        K, PQ = max(y.shape[1], 1), y.shape[2]
        Kgemm = max(filters.shape[1], 1)
        blocks_per_image = max(K // MB, 1)
        b = block_id // blocks_per_image
        m0 = (block_id % blocks_per_image) * MB
        row0 = (m0 // Kg) * Kgemm  # the group's first row of the column matrix
        if j < PQ:
            acc = kapi.PrivateArray(MB, acc_type)
            for i in range(MB):
                acc[i] = bias[m0 + i]
            for k in range(Kgemm):
                bv = cols[b, row0 + k, j]
                for i in range(MB):
                    acc[i] = fma(filters[m0 + i, k], bv, acc[i])
            for i in range(MB):
                y[n0 + b, m0 + i, j] = acc[i]

    return gemm_rows_block


def run(problem: ConvProblem, x, w, bias, device):
    """Convolve by im2col + GEMM on ``device`` (a ``dpctl.SyclQueue``), the batch in chunks.

    Parameters
    ----------
    problem : ConvProblem
    x : usm_ndarray (N, C, H, W), C-contiguous, on ``device``
    w : usm_ndarray (K, C // groups, R, S)
    bias : usm_ndarray (K,) or None
    device : dpctl.SyclQueue

    Returns
    -------
    usm_ndarray (N, K, P, Q) on ``device``
    """
    p = problem
    engine = KNOBS.im2col_gemm
    mods = runtime.load()
    dpt = mods.dpt
    blk = blocking_for(device.sycl_device, p.dtype)
    G, Kg, Kgemm, PQ = p.groups, p.K_per_group, p.gemm_k, p.P * p.Q
    y = device_empty(p.y_shape, p.dtype, device, result=True)
    x_padded = zero_padded_input(p, x)
    filters = dpt.reshape(w, (p.K, Kgemm))
    y3 = dpt.reshape(y, (p.N, p.K, PQ))
    chunk = batch_chunk(p)
    rows = p.C * p.R * p.S
    cols_buf = device_empty((chunk, rows, PQ), p.dtype, device)
    fill = column_kernel()
    if engine == "kernel":
        mb = register_block(Kg, blk.gemm_mb)
        multiply = gemm_kernel(mb, p.dtype)
        bias_full = bias_or_zeros(p, bias, device)
    else:
        dpnp = mods.dpnp
        filters_g = dpnp.asarray(dpt.reshape(filters, (G, Kg, Kgemm)))
    for n0 in range(0, p.N, chunk):
        nb = min(chunk, p.N - n0)
        cols = cols_buf[:nb]
        launch(
            fill, (nb * rows, p.P), (1, blk.im2col_wg), device,
            x_padded, cols, n0, p.R, p.S, p.P, p.Q, p.stride[0], p.stride[1], p.dilation[0], p.dilation[1],
        )
        if engine == "kernel":
            launch(
                multiply, (nb * (p.K // mb), PQ), (1, blk.gemm_wg), device,
                filters, cols, bias_full, y3, n0, Kg,
            )
        else:
            out = dpnp.asarray(dpt.reshape(y3[n0:n0 + nb], (nb, G, Kg, PQ)))
            dpnp.matmul(filters_g, dpnp.asarray(dpt.reshape(cols, (nb, G, Kgemm, PQ))), out=out)
    if engine == "onemkl" and bias is not None:
        y3 += bias[None, :, None]
    return y
