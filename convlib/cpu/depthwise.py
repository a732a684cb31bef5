"""Depthwise (per-channel) convolution on the CPU: ``groups == C``, any channel multiplier.

Each output channel ``k`` reads one input channel, ``c = k // (K / C)``: the convolution is
``N * K`` independent 2-D correlations of one plane with one small filter, about 2 R*S FLOPs per
output against one read of ``x`` and one write of ``y``: bound by memory, not by FMAs. So the
kernel's job is to touch each byte once, which the general algorithms do not do here: direct's
register block holds one channel (its blocks are built for many) and copies the whole input with
its padding first; blis and im2col pack or gather R*S copies of the image.

How the loops go. Work items are bands of output rows of one plane (``prange`` over them, a few
contiguous ranges per thread). A band's input rows are gathered into a small per-thread buffer
(tens of KB: it stays in L1/L2), with the zero padding its taps read and, at a stride, split into
the stride's phases (de-interleaved: phase ``(a, b)`` holds rows ``a, a + sh, ...`` and columns
``b, b + sw, ...``), as in :mod:`convlib.cpu.direct`'s source planes but one band at a time: no
padded copy of the tensor exists. In that buffer every tap ``(r, s)`` is a plain shift, so the
band's outputs are computed along *wide rows* (pitch ``Ws``, the columns past ``Q`` computed and
dropped): one long contiguous run per tap however narrow the image (a 7x7 plane is one run of 61
positions, not seven of 7). All ``R*S`` taps are unrolled (``R`` and ``S`` are compile-time
constants of :func:`depthwise_kernel`), so each output is one vector load of the accumulator-free
sum: ``R*S`` loads and FMAs, then one store; the valid columns are then copied into ``y``. Padding
enters as zeros, so a non-finite weight meeting it gives NaN, as the definition's sum does.

What a new shape costs: one compilation per ``(R, S, dtype)`` (``cache=True``); sizes,
strides, padding, dilation and the multiplier are run-time values.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import get_num_threads, njit, prange

from ..core import output_cache
from ..core.problem import ConvProblem
from .stack_buffer import stack_array_1d
from .tables import KNOBS

uintp = np.uintp

#: Wide positions computed per block (on the stack): four zmm vectors of float32.
BLOCK = 64


def supports(problem: ConvProblem) -> str | None:
    """None for a depthwise problem (one input channel per group), else why not."""
    if problem.groups == problem.C:
        return None
    return (f"depthwise needs groups == C (one input channel per group); got groups={problem.groups} "
            f"with C={problem.C}")


def geometry(problem: ConvProblem) -> tuple[int, int, int, int, int]:
    """``(rows_per_band, Hs_extra, Ws, phases_h, phases_w)``: output rows per band, the extra rows a
    band's phase planes hold, the pitch of a phase row and the number of phases."""
    sh, sw = problem.stride
    dh, dw = problem.dilation
    phases_h, phases_w = sh, sw  # room for every phase; only those the taps read are gathered
    extra = ((problem.R - 1) * dh) // sh
    Ws = problem.Q + ((problem.S - 1) * dw) // sw
    per_row = phases_h * phases_w * Ws * problem.itemsize
    rows = max(1, min(problem.P, KNOBS.depthwise_band_bytes // max(per_row, 1) - extra))
    return rows, extra, Ws, phases_h, phases_w


def workspace_bytes(problem: ConvProblem, device=None) -> int:
    """Per thread, one band's phase planes and its wide-row results (tens of KB)."""
    rows, extra, Ws, phases_h, phases_w = geometry(problem)
    per_thread = (phases_h * phases_w * (rows + extra) + rows) * Ws + Ws
    return get_num_threads() * per_thread * problem.itemsize


@functools.lru_cache(maxsize=None)
def depthwise_kernel(R: int, S: int, dtype: str):
    """The kernel for ``R x S`` filters of ``dtype`` (compile-time constants: the taps are unrolled)::

        kernel(x, w, bias, stride_h, stride_w, top, left, dil_h, dil_w, rows, threads, y)

    x : (N, C, H, W)     IN
    w : (K, 1, R, S)     IN
    bias : (K,)          IN  zeros when the call has no bias
    rows : int           IN  output rows per band (:func:`geometry`)
    y : (N, K, P, Q)     OUT every element written: ``y[n, k] = bias[k] + correlate(x[n, k // m], w[k, 0])``
    """
    taps = R * S
    scalar = np.dtype(dtype).type

    @njit(parallel=True, cache=True, fastmath={"contract"})
    def depthwise_conv(x, w, bias, stride_h, stride_w, top, left, dil_h, dil_w, rows, threads, y):
        N, C, H, W = x.shape
        K = w.shape[0]
        P, Q = y.shape[2], y.shape[3]
        multiplier = K // C
        nph, npw = stride_h, stride_w
        extra = ((R - 1) * dil_h) // stride_h
        Ws = Q + ((S - 1) * dil_w) // stride_w
        Hs = rows + extra  # rows of a band's phase plane
        plane_size = Hs * Ws
        # Where tap (r, s) reads in a band's buffer, relative to wide position 0 of the band.
        start = np.empty(taps, np.int64)
        used = np.zeros(nph * npw, np.bool_)  # the phases some tap reads
        for r in range(R):
            for s in range(S):
                a, b = (r * dil_h) % stride_h, (s * dil_w) % stride_w
                used[a * npw + b] = True
                start[r * S + s] = (a * npw + b) * plane_size + ((r * dil_h) // stride_h) * Ws + (s * dil_w) // stride_w
        bands = (P + rows - 1) // rows
        items = N * K * bands
        parts = max(1, min(items, 4 * threads))
        # Flat views made once: a view of x or y made inside the loops would touch their shared
        # reference counts, atomically, from every thread.
        xf, yf = x.reshape(-1), y.reshape(-1)
        for part in prange(parts):
            buf = np.zeros(nph * npw * plane_size + BLOCK, x.dtype)  # + BLOCK: the last block's overhang
            wide = np.empty(rows * Ws, y.dtype)
            # The taps' weights and offsets on the stack: LLVM knows they alias nothing, keeps
            # them in registers and vectorises the loop over the wide row (heap copies needed
            # more run-time alias checks than it makes, and the loop stayed scalar).
            wt = stack_array_1d(taps, scalar)
            off = stack_array_1d(taps, np.int64)
            acc = stack_array_1d(BLOCK, scalar)
            for t in range(taps):
                off[t] = start[t]
            for item in range(part * items // parts, (part + 1) * items // parts):
                band = item % bands
                plane = item // bands
                n = plane // K
                k = plane - n * K
                c = k // multiplier
                p0 = band * rows
                pb = min(rows, P - p0)
                for t in range(taps):
                    wt[t] = w[k, 0, t // S, t % S]
                # Gather the band's phase planes: row i of phase (a, b) is padded input row
                # (p0 + i)*sh + a, its column j padded input column j*sw + b (zero outside x).
                src_plane = uintp((n * C + c) * H * W)
                for a in range(nph):
                    for b in range(npw):
                        if not used[a * npw + b]:
                            continue
                        base = (a * npw + b) * plane_size
                        j_lo = min(Ws, max(0, (left - b + stride_w - 1) // stride_w))
                        j_hi = max(j_lo, min(Ws, (W + left - b + stride_w - 1) // stride_w))
                        for i in range(pb + extra):
                            dst = uintp(base + i * Ws)
                            h = (p0 + i) * stride_h + a - top
                            if h < 0 or h >= H:
                                for j in range(uintp(Ws)):
                                    buf[dst + j] = 0
                                continue
                            for j in range(uintp(j_lo)):
                                buf[dst + j] = 0
                            src = src_plane + uintp(h * W + j_lo * stride_w + b - left)
                            out = dst + uintp(j_lo)
                            if stride_w == 1:
                                for j in range(uintp(j_hi - j_lo)):
                                    buf[out + j] = xf[src + j]
                            else:
                                step = uintp(stride_w)
                                for j in range(uintp(j_hi - j_lo)):
                                    buf[out + j] = xf[src + j * step]
                            for j in range(uintp(j_hi), uintp(Ws)):
                                buf[dst + j] = 0
                # Every tap a shifted run of the buffer: the band's wide rows in one pass.
                length = (pb - 1) * Ws + Q
                bk = bias[k]
                for j0 in range(0, length, BLOCK):
                    # A block of results on the stack: its stores alias no load of buf, so the
                    # loop vectorises (stored straight into the heap row, it stayed scalar).
                    for jj in range(BLOCK):
                        v = bk
                        for t in range(taps):
                            v += wt[t] * buf[uintp(off[t] + j0) + uintp(jj)]
                        acc[jj] = v
                    for jj in range(uintp(min(BLOCK, length - j0))):
                        wide[uintp(j0) + jj] = acc[jj]
                for p in range(pb):
                    dst = uintp(((n * K + k) * P + p0 + p) * Q)
                    src_row = uintp(p * Ws)
                    for q in range(uintp(Q)):
                        yf[dst + q] = wide[src_row + q]

    return depthwise_conv


def run(problem: ConvProblem, x, w, bias, device=None):
    """Depthwise convolution of ``x`` with ``w`` (the implementation contract of
    :mod:`convlib.core.contracts`)."""
    y = output_cache.empty(problem.y_shape, problem.dtype)
    bias_or_zeros = bias if bias is not None else np.zeros(problem.K, problem.dtype)
    rows = geometry(problem)[0]
    depthwise_kernel(problem.R, problem.S, problem.dtype)(
        x, w, bias_or_zeros, problem.stride[0], problem.stride[1], problem.pad_top, problem.pad_left,
        problem.dilation[0], problem.dilation[1], rows, get_num_threads(), y)
    return y
