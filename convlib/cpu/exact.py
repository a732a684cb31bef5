"""A few outputs computed by the definition: the repair path for non-finite Winograd outputs.

Winograd's transforms mix every input of a tile into every output of the tile, so one ``inf`` or
``NaN`` input turns outputs whose own receptive field is finite into ``NaN`` (``inf - inf``,
``0 * inf``). Every output the definition makes non-finite is non-finite there too (its window's
non-finite input reaches it through a non-zero transform coefficient), so the outputs to repair
are among the non-finite ones: :func:`recompute_outputs` computes exactly those by the definition,
accumulating in float64 (the window's ``inf``/``NaN`` come out as the sum makes them, the rest is
the finite answer). :func:`repair_nonfinite_input_gradient` does the same for the backward data
pass run by Winograd (:mod:`convlib.cpu.winograd_backward`), by that pass's own definition.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, inline="always")
def unravel_nchw(i, C, H, W):
    """``(n, c, h, w)`` of flat index ``i`` of a C-ordered (N, C, H, W) array."""
    return i // (W * H * C), (i // (W * H)) % C, (i // W) % H, i % W


@njit(parallel=True, cache=True)
def _recompute(x, w, bias, has_bias, stride_h, stride_w, top, left, dil_h, dil_w, groups, flat, y):
    """``y.flat[i] = bias[k] + sum_{c,r,s} x[...] * w[k, c, r, s]`` for every ``i`` of ``flat``.

    x : (N, C, H, W) IN;  w : (K, C/groups, R, S) IN;  bias : (K,) IN;  flat : int64 IN;
    y : (N, K, P, Q) INOUT
    """
    N, C, H, W = x.shape
    K, Cg, R, S = w.shape
    P, Q = y.shape[2], y.shape[3]
    Kg = K // groups
    yf = y.reshape(-1)
    for t in prange(flat.size):
        i = flat[t]
        n, k, p, q = unravel_nchw(i, K, P, Q)
        acc = np.float64(bias[k]) if has_bias else np.float64(0.0)
        c0 = (k // Kg) * Cg
        for c in range(Cg):
            for r in range(R):
                h = p * stride_h - top + r * dil_h
                for s in range(S):
                    col = q * stride_w - left + s * dil_w
                    # Padding reads zero, and 0 * w is part of the sum (NaN for a non-finite w).
                    v = np.float64(x[n, c0 + c, h, col]) if 0 <= h < H and 0 <= col < W else 0.0
                    acc += v * np.float64(w[k, c, r, s])
        yf[i] = acc


def recompute_outputs(problem, x, w, bias, y, flat_indices) -> None:
    """Overwrite the outputs ``y.flat[flat_indices]`` with the definition's values (zero padding
    included: ``0 * w`` is ``NaN`` for a non-finite weight, as in the definition)."""
    if flat_indices.size == 0:
        return
    b = bias if bias is not None else np.zeros(1, y.dtype)
    _recompute(x, w, b, bias is not None, problem.stride[0], problem.stride[1], problem.pad_top,
               problem.pad_left, problem.dilation[0], problem.dilation[1], problem.groups,
               np.ascontiguousarray(flat_indices, dtype=np.int64), y)


def repair_nonfinite(problem, x, w, bias, y) -> int:
    """Recompute every non-finite output of ``y`` by the definition; returns how many there were."""
    flat = np.flatnonzero(~np.isfinite(y.reshape(-1)))
    recompute_outputs(problem, x, w, bias, y, flat)
    return int(flat.size)


@njit(parallel=True, cache=True)
def _recompute_dx(dy, w, bias, has_bias, top, left, groups, flat, dx):
    """``dx.flat[i] = bias[c] + sum_{k,r,s} dy[n, k, h + top - r, v + left - s] * w[k, c, r, s]``
    over the ``dy`` positions that exist (stride 1, dilation 1), for every ``i`` of ``flat``: the
    backward data pass's definition, which has no padding products."""
    N, K, P, Q = dy.shape
    _, Cg, R, S = w.shape
    C, H, W = dx.shape[1], dx.shape[2], dx.shape[3]
    Kg = K // groups
    dxf = dx.reshape(-1)
    for t in prange(flat.size):
        i = flat[t]
        n, c, h, v = unravel_nchw(i, C, H, W)
        acc = np.float64(bias[c]) if has_bias else np.float64(0.0)
        g = c // Cg
        for k in range(g * Kg, (g + 1) * Kg):
            for r in range(R):
                p = h + top - r
                if p < 0 or p >= P:
                    continue
                for s in range(S):
                    q = v + left - s
                    if 0 <= q < Q:
                        acc += np.float64(dy[n, k, p, q]) * np.float64(w[k, c - g * Cg, r, s])
        dxf[i] = acc


def repair_nonfinite_input_gradient(problem, dy, w, bias, dx) -> int:
    """Recompute every non-finite element of ``dx`` (a stride-1, dilation-1 backward data pass)
    by the definition; returns how many there were."""
    flat = np.flatnonzero(~np.isfinite(dx.reshape(-1)))
    if flat.size:
        b = bias if bias is not None else np.zeros(1, dx.dtype)
        _recompute_dx(dy, w, b, bias is not None, problem.pad_top, problem.pad_left, problem.groups,
                      flat.astype(np.int64), dx)
    return int(flat.size)
