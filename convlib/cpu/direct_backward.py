"""The backward passes of the convolution by their definitions (numba, CPU): ``direct``.

* :data:`DATA` (``conv2d_backward_data``, and ``conv_transpose2d`` with its bias): the gather
  form. Each row of ``dx`` collects the ``dy`` rows it fed: for a filter row ``r`` the output
  row is ``p = (h + top - r*dil_h) / stride_h`` when that divides, and for a filter column ``s``
  the input columns with ``(v + left - s*dil_w) % stride_w == 0`` are one arithmetic sequence
  ``v0, v0 + stride_w, ...`` meeting ``dy`` columns ``q0, q0 + 1, ...``. So no zero is ever
  inserted into ``dy`` and at stride > 1 no multiplication is wasted: exactly the forward's
  multiply-adds. A block of :data:`CHANNEL_BLOCK` rows of ``dx`` (channels of one group)
  shares every ``dy`` row it reads; a task is one (image, channel block), and the threads share
  the tasks. At stride 1 and dilation 1 (padding at most ``R - 1``, ``S - 1``) the gather form
  is the forward convolution of ``dy`` with the rotated filters
  (:func:`convlib.core.problem.rotated_problem`),
  and runs the forward's register-blocked kernel (:mod:`convlib.cpu.direct`) instead; a
  non-finite ``w`` meets the rotated problem's padding zeros there, and the elements that come
  out non-finite are recomputed by the definition.
* :data:`WEIGHT` (``conv2d_backward_weight``): each ``dw[k, c, r, s]`` is a sum over the batch
  and the output pixels of ``dy[n, k, p, q] * x[n, c, p*sh - top + r*dh, q*sw - left + s*dw]``;
  per output row, the columns that read inside the image form one range, so the inner loop is a
  dot product without bounds tests, which LLVM vectorises (unsigned indices, and ``reassoc``
  so the sum may be split into vector lanes). Each row's dot product is summed on its own and
  the rows in float64 (two-level summation: float32 keeps its accuracy over any batch). A task
  is one (k, c) pair and all its taps; it takes every tap of one (``dy`` row, ``x`` row) pair
  before the next, so both rows come from L1. No two threads write the same ``dw`` element,
  and no per-thread copy of ``dw`` is needed. At stride 1 and dilation 1, on output rows of at
  most ``direct_weight_wide_max_row`` columns (a knob), the dot products run over *wide rows* instead: ``dy``'s
  planes laid out at the pitch of ``x``'s zero-padded planes, a few images one after another, so
  each tap is one dot product over all of them (:func:`backward_weight_wide_kernel`; a 3x3
  filter's nine in one pass); its results, when not all finite,
  are computed again row by row (its extra products, zeros of ``dy`` times ``x``, are NaN where
  ``x`` is inf). The products with padding (``dy * 0``) are skipped
  unless a channel of ``dy`` holds an inf or NaN; then they are added, so ``0 * inf`` is NaN
  there as in the definition (the forward pass multiplies its padding too).

The data pass allocates nothing beyond its result, but at stride 1, where it has the forward
direct kernel's workspace and the rotated filters; the weight pass allocates its float64 row
totals (``dw``'s elements, in float64), one flag per channel of ``dy`` and, over wide rows, each
task's two buffers (a few images' planes). Compile cost: one
specialisation per dtype (``cache=True``); shapes and the geometry are run-time values.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange

from ..core.problem import ConvProblem, rotated_problem, runs_as_forward, sums_wide_rows
from . import direct
from .clipping import positions_inside
from .rotation import data_pass_as_forward, rotated_filter_bytes
from .tables import KNOBS
from .threads import thread_count

#: Rows of ``dx`` (channels of one group) computed together, sharing each ``dy`` row they read.
CHANNEL_BLOCK = 4
#: The widest output row whose products the float32 weight pass sums in float32 (wider rows:
#: in float64, about 10% slower on small images, where rows are short).
FLOAT32_ROW_LIMIT = 1024
#: Products a wide dot product sums in the input's dtype before adding them to its float64 total.
WIDE_CHUNK = 1024
#: Elements of each of a task's two wide-row buffers (as many images as fit, at least one): with
#: float32 both stay in a 48 KiB L1 while their dot products run.
WIDE_BUFFER_ELEMENTS = 4096


@njit(cache=True, inline="always")
def _first_in_phase(s_off, pad_left, stride_w, W, Q):
    """For the filter column at offset ``s_off = s * dil_w``: the first input column ``v0`` and
    output column ``q0`` it pairs, and how many pairs ``(v0 + j*stride_w, q0 + j)`` lie in range."""
    # v + pad_left - s_off = q * stride_w with 0 <= q < Q and 0 <= v < W.
    q0 = max(0, -((s_off - pad_left) // stride_w))  # smallest q with v = q*sw - pad_left + s_off >= 0
    v0 = q0 * stride_w - pad_left + s_off
    if v0 >= W or q0 >= Q:
        return 0, 0, 0
    count = min(Q - q0, (W - 1 - v0) // stride_w + 1)
    return v0, q0, count


@njit(parallel=True, cache=True)
def backward_data_kernel(dy, w, bias, has_bias, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w, groups,
                         CB, dx):
    N, C, H, W = dx.shape
    K, Cg, R, S = w.shape
    P, Q = dy.shape[2], dy.shape[3]
    Kg = K // groups
    blocks = (Cg + CB - 1) // CB  # channel blocks per group
    for task in prange(N * groups * blocks):
        n = task // (groups * blocks)
        g = (task // blocks) % groups
        cl0 = (task % blocks) * CB
        nc = min(CB, Cg - cl0)
        rows = np.zeros((CB, W), dx.dtype)
        for h in range(H):
            rows[:, :] = 0
            for r in range(R):
                num = h + pad_top - r * dil_h
                if num < 0 or num % stride_h:
                    continue
                p = num // stride_h
                if p >= P:
                    continue
                for kl in range(Kg):
                    k = g * Kg + kl
                    dy_row = dy[n, k, p]
                    for s in range(S):
                        v0, q0, count = _first_in_phase(s * dil_w, pad_left, stride_w, W, Q)
                        for i in range(nc):
                            wv = w[k, cl0 + i, r, s]
                            out = rows[i]
                            for j in range(count):
                                out[v0 + j * stride_w] += wv * dy_row[q0 + j]
            for i in range(nc):
                c = g * Cg + cl0 + i
                b = bias[c] if has_bias else 0.0
                for v in range(W):
                    dx[n, c, h, v] = rows[i, v] + b


@njit(cache=True)
def _padding_products(dy, k, h_off, stride_h, H, q_lo, q_hi):
    """The sum of tap ``(r, s)``'s products with padding for channel ``k`` of ``dy``: 0, or NaN when
    one of the ``dy`` values they multiply is inf or NaN (the definition multiplies the padding's
    zeros, as the forward pass does). The tap reads input row ``p*stride_h + h_off`` and, of the
    output columns, only ``q_lo .. q_hi`` inside the image."""
    N, _, P, Q = dy.shape
    total = 0.0
    for n in range(N):
        for p in range(P):
            h = p * stride_h + h_off
            inside = h >= 0 and h < H
            for q in range(Q):
                if not inside or q < q_lo or q >= q_hi:
                    total += np.float64(dy[n, k, p, q]) * 0.0
    return total


@njit(parallel=True, cache=True, fastmath={"reassoc", "contract"})
def backward_weight_kernel(x, dy, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w, groups, row_zero, dw):
    N, C, H, W = x.shape
    K, Cg, R, S = dw.shape
    P, Q = dy.shape[2], dy.shape[3]
    Kg = K // groups
    q_lo = np.empty(S, np.int64)
    q_hi = np.empty(S, np.int64)
    for s in range(S):
        q_lo[s], q_hi[s] = positions_inside(s * dil_w - pad_left, stride_w, W, Q)
    # Two levels: each output row's products summed in row_zero's dtype, the rows in float64
    # (one row of totals per task). A float32 running sum over all N*P*Q products loses
    # accuracy as the sum grows (relative error ~ eps32 * sqrt(N*P*Q / 6), 1e-5 at N=16,
    # 128x128); a row's sum has ~ eps32 * sqrt(Q / 6) whatever the batch and the image's height,
    # and rows wider than FLOAT32_ROW_LIMIT are summed in float64.
    totals = np.zeros((K * Cg, R * S))
    for task in prange(K * Cg):
        k = task // Cg
        c = (k // Kg) * Cg + task % Cg
        # Every tap of a (dy row, x row) pair before the next pair, so both rows are read from
        # L1 for all R*S taps rather than from memory once per tap.
        for n in range(N):
            for p in range(P):
                dy_row = dy[n, k, p]
                for r in range(R):
                    h = p * stride_h - pad_top + r * dil_h
                    if h < 0 or h >= H:
                        continue
                    x_row = x[n, c, h]
                    for s in range(S):
                        # Unsigned indices (the sum wraps to the column inside the row): with
                        # signed ones numba tests each for a negative index, and the loop stays
                        # scalar. reassoc lets LLVM split the sum into vector lanes.
                        off = np.uintp(s * dil_w - pad_left)
                        part = row_zero[0]
                        if stride_w == 1:
                            for q in range(np.uintp(q_lo[s]), np.uintp(q_hi[s])):
                                part += dy_row[q] * x_row[q + off]
                        else:
                            for q in range(np.uintp(q_lo[s]), np.uintp(q_hi[s])):
                                part += dy_row[q] * x_row[q * np.uintp(stride_w) + off]
                        totals[task, r * S + s] += part
        for r in range(R):
            for s in range(S):
                dw[k, task % Cg, r, s] = totals[task, r * S + s]


@njit(inline="always")
def _copy_wide_dy(dy_flat, K, P, Q, k, n0, n1, L, Ws, dy_wide):
    """Channel ``k`` of images ``n0 .. n1`` of ``dy`` into ``dy_wide``: image ``n`` from ``(n - n0)
    * L`` on, its rows at pitch ``Ws``. Only the rows' ``Q`` columns are written: the rest of the
    buffer stays as it was zeroed."""
    for n in range(n0, n1):
        for p in range(P):
            dst = np.uintp((n - n0) * L + p * Ws)
            src = np.uintp(((n * K + k) * P + p) * Q)
            for q in range(np.uintp(Q)):
                dy_wide[dst + q] = dy_flat[src + q]


@njit(inline="always")
def _copy_wide_x(x_flat, C, H, W, c, n0, n1, L, Ws, pad_top, pad_left, x_wide):
    """Channel ``c`` of images ``n0 .. n1`` of ``x`` into ``x_wide`` as zero-padded planes of pitch
    ``Ws`` (image ``n`` from ``(n - n0) * L`` on): only the image's own elements are written, the
    padding around them stays as it was zeroed."""
    for n in range(n0, n1):
        for h in range(H):
            dst = np.uintp((n - n0) * L + (h + pad_top) * Ws + pad_left)
            src = np.uintp(((n * C + c) * H + h) * W)
            for v in range(np.uintp(W)):
                x_wide[dst + v] = x_flat[src + v]


@njit(inline="always")
def _sum_nine_taps(dy_wide, x_wide, length, Ws, row_zero, totals, row):
    """A 3x3 filter's nine dot products at once: one pass over ``dy_wide`` with every tap's sum in
    the loop, so each ``dy`` vector is loaded once for nine FMAs (tap by tap it was loaded nine
    times, and each dot product ended in a reduction of its own). In chunks of
    :data:`WIDE_CHUNK`, each chunk's sums added to the float64 ``totals``."""
    o3, o4, o5 = np.uintp(Ws), np.uintp(Ws + 1), np.uintp(Ws + 2)
    o6, o7, o8 = np.uintp(2 * Ws), np.uintp(2 * Ws + 1), np.uintp(2 * Ws + 2)
    one, two = np.uintp(1), np.uintp(2)
    for j0 in range(0, length, WIDE_CHUNK):
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = row_zero[0]
        for j in range(np.uintp(j0), np.uintp(min(j0 + WIDE_CHUNK, length))):
            d = dy_wide[j]
            a0 += d * x_wide[j]
            a1 += d * x_wide[j + one]
            a2 += d * x_wide[j + two]
            a3 += d * x_wide[j + o3]
            a4 += d * x_wide[j + o4]
            a5 += d * x_wide[j + o5]
            a6 += d * x_wide[j + o6]
            a7 += d * x_wide[j + o7]
            a8 += d * x_wide[j + o8]
        totals[row, 0] += a0
        totals[row, 1] += a1
        totals[row, 2] += a2
        totals[row, 3] += a3
        totals[row, 4] += a4
        totals[row, 5] += a5
        totals[row, 6] += a6
        totals[row, 7] += a7
        totals[row, 8] += a8


@njit(parallel=True, cache=True, fastmath={"reassoc", "contract"})
def backward_weight_wide_kernel(x, dy, pad_top, pad_left, groups, R, S, Ws, L, chunk_images, x_elements, c_parts,
                                row_zero, totals):
    """The weight pass at stride 1 and dilation 1 over *wide rows*: ``dy[n, k]`` laid out with rows
    of pitch ``Ws = Q + S - 1`` (zeros past column ``Q``) and ``x[n, c]`` zero-padded to ``P + R - 1``
    rows of that pitch, ``chunk_images`` images one after another (``L`` elements each; ``x``'s
    buffer ``x_elements`` long, the last image's taps reading past it: :class:`_WideRows`), so tap
    ``(r, s)`` is one dot product over all of them at offset ``r*Ws + s``, in chunks of
    :data:`WIDE_CHUNK` summed in float64 into ``totals[k*Cg + c, r*S + s]`` (a 3x3 filter's nine
    at once: :func:`_sum_nine_taps`). A task is one filter and a share (``c_parts``) of its
    group's channels, with its two buffers of its own, zeroed once: the copies write only the
    images' elements, so the padding between them stays zero.

    Every product of the definition is among them, padding included; the others multiply a zero
    of ``dy``'s padding, which makes them NaN where ``x`` is inf or NaN: a result that is not
    finite must be computed again by :func:`backward_weight_kernel`.
    """
    N, C, H, W = x.shape
    K, P, Q = dy.shape[1], dy.shape[2], dy.shape[3]
    Cg = C // groups
    Kg = K // groups
    x_flat = x.reshape(-1)
    dy_flat = dy.reshape(-1)
    for task in prange(K * c_parts):
        k = task // c_parts
        part = task - k * c_parts
        g = k // Kg
        dy_wide = np.zeros(chunk_images * L, dy.dtype)
        x_wide = np.zeros(x_elements, x.dtype)
        for n0 in range(0, N, chunk_images):
            n1 = min(N, n0 + chunk_images)
            _copy_wide_dy(dy_flat, K, P, Q, k, n0, n1, L, Ws, dy_wide)
            length = (n1 - n0) * L
            for cc in range(part * Cg // c_parts, (part + 1) * Cg // c_parts):
                _copy_wide_x(x_flat, C, H, W, g * Cg + cc, n0, n1, L, Ws, pad_top, pad_left, x_wide)
                row = k * Cg + cc
                if R == 3 and S == 3:
                    _sum_nine_taps(dy_wide, x_wide, length, Ws, row_zero, totals, row)
                    continue
                for r in range(R):
                    for s in range(S):
                        off = np.uintp(r * Ws + s)
                        for j0 in range(0, length, WIDE_CHUNK):
                            chunk = row_zero[0]
                            for j in range(np.uintp(j0), np.uintp(min(j0 + WIDE_CHUNK, length))):
                                chunk += dy_wide[j] * x_wide[j + off]
                            totals[row, r * S + s] += chunk


@njit(parallel=True, cache=True)
def add_padding_products(dy, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w, H, W, dw):
    """The products with padding that :func:`backward_weight_kernel` skips are zero unless dy is
    inf or NaN there (0 * inf is NaN): added to ``dw``, as NaN or 0, only for the channels of dy
    that hold such a value. (A kernel of its own: inside the weight loops their code got 5-20%
    slower, and there, compiled with the loops' ``reassoc``, they missed the non-finite channels of
    ``tests/test_reliability.py``.)"""
    N, K, P, Q = dy.shape
    Cg, R, S = dw.shape[1], dw.shape[2], dw.shape[3]
    nonfinite = np.zeros(K, np.bool_)
    for k in prange(K):
        for n in range(N):
            for p in range(P):
                for q in range(Q):
                    if not np.isfinite(dy[n, k, p, q]):
                        nonfinite[k] = True
    for task in prange(K * Cg):
        k = task // Cg
        if nonfinite[k]:
            for s in range(S):
                off = s * dil_w - pad_left
                q_lo, q_hi = positions_inside(off, stride_w, W, Q)
                for r in range(R):
                    dw[k, task % Cg, r, s] += _padding_products(dy, k, r * dil_h - pad_top, stride_h, H, q_lo, q_hi)


def _sums_wide_rows(problem: ConvProblem) -> bool:
    """Whether the weight pass runs :func:`backward_weight_wide_kernel`: stride 1, dilation 1, a
    filter of more than one tap and output rows of at most the ``direct_weight_wide_max_row`` knob's
    columns (a 1x1 filter's rows, and long rows, were faster row by row)."""
    return sums_wide_rows(problem, KNOBS.direct_weight_wide_max_row)


class _WideRows(NamedTuple):
    """The layout of :func:`backward_weight_wide_kernel`'s buffers, worked out once for the kernel
    and the workspace bound."""

    Ws: int  # the pitch of the rows: Q + S - 1
    L: int  # elements of one image's planes: (P + R - 1) rows and the last tap's reach
    chunk_images: int  # images a buffer holds: about WIDE_BUFFER_ELEMENTS of them, at least one
    x_elements: int  # of x's buffer: its images' planes and a zero tail the last taps read

    @property
    def buffer_elements(self) -> int:
        """Elements of one task's two buffers."""
        return self.chunk_images * self.L + self.x_elements


def _wide_rows(problem: ConvProblem) -> _WideRows:
    """:class:`_WideRows` of ``problem``."""
    Ws = problem.Q + problem.S - 1
    L = (problem.P + problem.R - 1) * Ws + problem.S
    chunk_images = max(1, min(problem.N, WIDE_BUFFER_ELEMENTS // L))
    return _WideRows(Ws, L, chunk_images, chunk_images * L + (problem.R - 1) * Ws + problem.S)


def _channel_parts(problem: ConvProblem) -> int:
    """Into how many shares of its channels the wide weight pass cuts each filter's task: enough
    for about 16 tasks (a depthwise layer, one channel a filter: none)."""
    return max(1, min(problem.C_per_group, -(-16 // problem.K)))


class _Direct:
    """The implementation contract for one backward pass (see the module docstring)."""

    def __init__(self, operation: str):
        self.operation = operation

    def supports(self, problem: ConvProblem) -> str | None:
        """``direct`` serves every valid problem."""
        return None

    def workspace_bytes(self, problem: ConvProblem, device=None) -> int:
        """Data at stride 1: the forward direct kernel's on the rotated problem, and the rotated
        filters; otherwise nothing. Weight: the float64 totals of every ``dw`` element, and for
        wide rows each thread's two planes."""
        if self.operation == "conv2d_backward_data":
            if runs_as_forward(problem):
                return direct.workspace_bytes(rotated_problem(problem)) + rotated_filter_bytes(problem)
            return 0
        totals = problem.K * problem.gemm_k * 8
        if _sums_wide_rows(problem):
            return totals + thread_count() * _wide_rows(problem).buffer_elements * problem.itemsize
        return totals

    def run(self, problem: ConvProblem, *arrays):
        p = problem
        geometry = (p.stride[0], p.stride[1], p.pad_top, p.pad_left, p.dilation[0], p.dilation[1], p.groups)
        if self.operation == "conv2d_backward_data":
            dy, w, bias = arrays[:3]
            if runs_as_forward(p):
                # The gather form is then the forward direct convolution of dy with the rotated
                # filters: its register-blocked kernel instead of the loops below (the digits
                # CNN's 16->32 layer: 0.91x blis' time, against 5-20x for the loops).
                return data_pass_as_forward(p, direct.run, dy, w, bias)
            dx = np.empty(p.x_shape, p.dtype)
            has_bias = bias is not None
            bias_arr = bias if has_bias else np.zeros(1, p.dtype)
            backward_data_kernel(dy, w, bias_arr, has_bias, *geometry, CHANNEL_BLOCK, dx)
            return dx
        x, dy = arrays[:2]
        if _sums_wide_rows(p):
            totals = np.zeros((p.K * p.C_per_group, p.R * p.S))
            wide = _wide_rows(p)
            backward_weight_wide_kernel(x, dy, p.pad_top, p.pad_left, p.groups, p.R, p.S, wide.Ws, wide.L,
                                        wide.chunk_images, wide.x_elements, _channel_parts(p), np.zeros(1, p.dtype),
                                        totals)
            dw = totals.reshape(p.w_shape).astype(p.dtype)
            if np.isfinite(dw).all():
                return dw
            # inf or NaN: maybe of a product no definition has (0 * inf past a row's end)
        dw = np.empty(p.w_shape, p.dtype)
        row_zero = np.zeros(1, np.float64 if p.Q > FLOAT32_ROW_LIMIT else p.dtype)
        backward_weight_kernel(x, dy, *geometry, row_zero, dw)
        add_padding_products(dy, *geometry[:6], p.H, p.W, dw)
        return dw


#: ``conv2d_backward_data`` (and ``conv_transpose2d``) by the gather form.
DATA = _Direct("conv2d_backward_data")
#: ``conv2d_backward_weight`` by its definition.
WEIGHT = _Direct("conv2d_backward_weight")
