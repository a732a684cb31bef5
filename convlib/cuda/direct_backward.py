"""The backward passes of the convolution by their definitions, on the GPU: ``direct``.

* :data:`DATA` (``conv2d_backward_data``, and ``conv_transpose2d`` with its bias of ``C``): the
  gather form, one ``dx`` value per thread. A block's threads take consecutive pixels of one
  channel ``c`` of one image (grid ``(C * pixel blocks, images)``), so the filter values they read
  are the same for the whole block (broadcast loads) and, at stride 1, a warp's ``dy`` reads are
  consecutive. For a filter row ``r`` a thread's row ``h`` reads the ``dy`` row
  ``p = (h + top - r*dil_h) / stride_h`` when that divides and lies in ``[0, P)``, likewise the
  column ``q`` for a filter column ``s``; every other tap is skipped, not multiplied by zeros:
  no zero is inserted into ``dy``, no multiplication is wasted at stride > 1, and a NaN or inf
  of ``dy``/``w`` reaches exactly the ``dx`` values the definition says.
* :data:`WEIGHT` (``conv2d_backward_weight``): one thread per ``dw[k, c, r, s]`` (consecutive
  threads on consecutive taps, so their ``x`` reads are neighbours and their ``dy`` reads one
  broadcast), summing ``dy[n, k, p, q] * x[n, c, p*sh - top + r*dh, q*sw - left + s*dw]`` row by
  row: per output row, the columns whose input pixel lies inside the image are computed once
  per element, so no bounds test in the inner loop; the products with padding (``dy * 0``, NaN
  where ``dy`` is inf or NaN, as in the definition) are loops over the padding alone; each
  row's sum is added to the thread's total (two-level summation keeps float32 sums over large
  batches accurate). When ``dw`` has too few elements to fill the
  GPU (a stem, few channels), the batch's ``N * P`` output rows are split among more threads
  (grid y, the ``backward_weight_parallelism`` knob) whose sums go to a workspace that a second
  kernel adds in a fixed order: deterministic, no atomics. Neither kernel synchronises a block
  (under numba-cuda's simulator each ``syncthreads`` costs milliseconds, which made a
  block-per-element tree reduction too slow to test there).

Cost of a new shape: like the forward kernels, every size except the batch is a compile-time
constant (closures over the problem's shape, :func:`convlib.cuda.gemm.shape_key`), so a new
layer shape compiles its kernel once; a new batch size costs nothing.
"""

from __future__ import annotations

import functools

import numpy as np

from .gemm import shape_key
from .launch import MAX_GRID_Y, cuda, flat, placeholder_bias
from .tables import launch_knob


@functools.lru_cache(maxsize=None)
def data_kernel(key, threads: int):
    """``kernel(dy, w, bias, dx, image0)`` for the problem shape ``key`` (flat ``dy``, ``w``,
    ``dx``; ``bias`` of ``C``); grid ``(C * ceil(H*W / threads), images)``, ``threads`` per block."""
    dtype = np.dtype(key.dtype)
    zero = dtype.type(0)
    C, K, H, W, R, S = key.C, key.K, key.H, key.W, key.R, key.S
    Cg, Kg = key.C_per_group, key.K_per_group
    SH, SW = key.stride
    DH, DW = key.dilation
    TOP, LEFT = key.pad_top, key.pad_left
    P, Q = key.P, key.Q
    PQ, HW, CgRS = P * Q, H * W, Cg * R * S
    TILES = -(-HW // threads)
    THREADS = threads
    HAS_BIAS = key.has_bias

    def backward_data(dy, w, bias, dx, image0):
        # IN dy (N*K*P*Q), IN w (K*Cg*R*S), IN bias (C,), OUT dx (N*C*H*W)
        bx = cuda.blockIdx.x
        c = bx // TILES
        hv = (bx - c * TILES) * THREADS + cuda.threadIdx.x
        if hv < HW:
            n = image0 + cuda.blockIdx.y
            h = hv // W
            v = hv - h * W
            g = c // Cg
            k0 = g * Kg
            total = bias[c] if HAS_BIAS else zero
            for r in range(R):
                num_h = h + TOP - r * DH
                if num_h >= 0:
                    p = num_h // SH
                    if p * SH == num_h and p < P:
                        for s in range(S):
                            num_w = v + LEFT - s * DW
                            if num_w >= 0:
                                q = num_w // SW
                                if q * SW == num_w and q < Q:
                                    dy_at = ((n * K + k0) * P + p) * Q + q
                                    w_at = ((k0 * Cg + c - g * Cg) * R + r) * S + s
                                    for kl in range(Kg):
                                        total += dy[dy_at + kl * PQ] * w[w_at + kl * CgRS]
            dx[((n * C + c) * H + h) * W + v] = total

    return cuda.jit(backward_data)


@functools.lru_cache(maxsize=None)
def weight_kernel(key, threads: int):
    """``kernel(x, dy, out, n_images, rows_per_split)`` for the problem shape ``key`` (flat arrays);
    grid ``(ceil(E / threads), splits)`` with ``E = K * Cg * R * S``: thread ``e`` of split ``j``
    writes ``out[j * E + e]``, the sum over the output rows ``j * rows_per_split ..`` (of the
    ``n_images * P`` rows of the batch) of tap ``e``'s products. One split: ``out`` is ``dw``."""
    dtype = np.dtype(key.dtype)
    zero = dtype.type(0)
    C, K, H, W, R, S = key.C, key.K, key.H, key.W, key.R, key.S
    Cg, Kg = key.C_per_group, key.K_per_group
    SH, SW = key.stride
    DH, DW = key.dilation
    TOP, LEFT = key.pad_top, key.pad_left
    P, Q = key.P, key.Q
    RS, CgRS = R * S, Cg * R * S
    E = K * CgRS
    THREADS = threads

    def backward_weight(x, dy, out, n_images, rows_per_split):
        # IN x (N*C*H*W), IN dy (N*K*P*Q), OUT out (splits*E)
        e = cuda.blockIdx.x * THREADS + cuda.threadIdx.x
        if e < E:
            split = cuda.blockIdx.y
            k = e // CgRS
            rest = e - k * CgRS
            cl = rest // RS
            rs = rest - cl * RS
            r = rs // S
            s = rs - r * S
            c = (k // Kg) * Cg + cl
            # The columns q whose input column q*SW + w_off lies inside the image; rows are
            # tested once per row.
            h_off = r * DH - TOP
            w_off = s * DW - LEFT
            q_lo = max(0, (SW - 1 - w_off) // SW)
            q_hi = min(Q, (W - 1 - w_off) // SW + 1)
            t = split * rows_per_split
            t_end = min(t + rows_per_split, n_images * P)
            n = t // P
            p = t - n * P
            # The rows' sums added in float64: a float32 total of N*P rows would lose ~ eps32 *
            # sqrt(N*P) of relative accuracy as the batch grows.
            total = 0.0
            while t < t_end:
                h = p * SH + h_off
                dy_row = ((n * K + k) * P + p) * Q
                part = zero
                if h >= 0 and h < H:
                    x_row = ((n * C + c) * H + h) * W + w_off
                    for q in range(q_lo, q_hi):
                        part += dy[dy_row + q] * x[x_row + q * SW]
                    # The products with padding, dy * 0: zero unless dy is inf or NaN there,
                    # where the definition (the forward multiplies its padding too) has NaN.
                    for q in range(0, min(q_lo, Q)):
                        part += dy[dy_row + q] * zero
                    for q in range(max(q_hi, q_lo), Q):
                        part += dy[dy_row + q] * zero
                else:
                    for q in range(Q):
                        part += dy[dy_row + q] * zero
                total += part
                t += 1
                p += 1
                if p == P:
                    p = 0
                    n += 1
            out[split * E + e] = total

    return cuda.jit(backward_weight)


@functools.lru_cache(maxsize=None)
def split_sum_kernel(key, threads: int):
    """``kernel(parts, dw, splits)``: ``dw[e] = parts[0*E + e] + parts[1*E + e] + ...`` in order
    (deterministic); grid ``ceil(E / threads)``."""
    E = key.K * key.C_per_group * key.R * key.S
    THREADS = threads

    def split_sum(parts, dw, splits):
        # IN parts (splits*E), OUT dw (E,)
        e = cuda.blockIdx.x * THREADS + cuda.threadIdx.x
        if e < E:
            total = 0.0  # in float64, as each split's own rows
            for j in range(splits):
                total += parts[j * E + e]
            dw[e] = total

    return cuda.jit(split_sum)


def weight_splits(problem, simulator: bool) -> tuple[int, int]:
    """``(splits, rows per split)`` of the batch's ``N * P`` output rows for the backward-weight
    launch: enough splits that ``elements * splits`` reaches the ``backward_weight_parallelism``
    knob (at most one split per row, at most 65535)."""
    elements = problem.K * problem.C_per_group * problem.R * problem.S
    target = launch_knob("backward_weight_parallelism", simulator)
    rows = problem.N * problem.P
    wanted = min(rows, MAX_GRID_Y, max(1, -(-target // elements)))
    per_split = -(-rows // wanted)
    return -(-rows // per_split), per_split


class _DirectBackward:
    """The implementation contract for one backward pass (see the module docstring)."""

    def __init__(self, operation: str):
        self.operation = operation

    def supports(self, problem) -> str | None:
        """``direct`` serves every valid problem."""
        return None

    def workspace_bytes(self, problem, device=None) -> int:
        """The weight pass split over the batch's rows: one partial ``dw`` per split (at most
        about ``backward_weight_parallelism`` elements in all); otherwise none."""
        if self.operation != "conv2d_backward_weight":
            return 0
        splits, _ = weight_splits(problem, getattr(device, "simulator", False))
        elements = problem.K * problem.C_per_group * problem.R * problem.S
        return 0 if splits == 1 else splits * elements * problem.itemsize

    def run(self, problem, *arrays):
        if self.operation == "conv2d_backward_data":
            return _run_data(problem, *arrays)
        return _run_weight(problem, *arrays)


def _run_data(problem, dy, w, bias, device):
    """``dx`` (plus ``bias`` of ``C``) from device arrays ``dy`` and ``w``."""
    target = device
    with target.activate():
        dx = target.empty(problem.x_shape, problem.dtype)
        threads = launch_knob("backward_data_threads", target.simulator)
        kernel = data_kernel(shape_key(problem), threads)
        b = bias if bias is not None else placeholder_bias(problem.dtype, target)
        blocks = problem.C * -(-(problem.H * problem.W) // threads)
        dyf, wf, dxf = flat(dy), flat(w), flat(dx)
        for image0 in range(0, problem.N, MAX_GRID_Y):
            images = min(MAX_GRID_Y, problem.N - image0)
            kernel[(blocks, images), threads, target.stream](dyf, wf, b, dxf, image0)
    return dx


def _run_weight(problem, x, dy, device):
    """``dw`` from device arrays ``x`` and ``dy``."""
    target = device
    with target.activate():
        dw = target.empty(problem.w_shape, problem.dtype)
        threads = launch_knob("backward_weight_threads", target.simulator)
        key = shape_key(problem)
        elements = problem.K * problem.C_per_group * problem.R * problem.S
        blocks = -(-elements // threads)
        splits, rows_per_split = weight_splits(problem, target.simulator)
        kernel = weight_kernel(key, threads)
        if splits == 1:
            kernel[(blocks, 1), threads, target.stream](flat(x), flat(dy), flat(dw), problem.N, rows_per_split)
        else:
            parts = target.empty((splits * elements,), problem.dtype)
            kernel[(blocks, splits), threads, target.stream](flat(x), flat(dy), parts, problem.N, rows_per_split)
            split_sum_kernel(key, threads)[blocks, threads, target.stream](parts, flat(dw), splits)
    return dw


#: ``conv2d_backward_data`` (and ``conv_transpose2d``) by the gather form.
DATA = _DirectBackward("conv2d_backward_data")
#: ``conv2d_backward_weight`` by its definition, one thread block per element.
WEIGHT = _DirectBackward("conv2d_backward_weight")
