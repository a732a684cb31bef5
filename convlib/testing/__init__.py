"""The plain references every test, example and benchmark compares against: scipy.signal.correlate
for the forward convolution, and the definitions of its gradients written with numpy slices.

Deliberately independent of convlib's kernels and written for obviousness, not speed:
padding by ``np.pad``, dilation by spreading the filter with zeros, stride by slicing the
stride-1 result, groups by slicing channels. Computed in float64 by default (the reference); the
benchmarks also time it in the problem's dtype as the scipy baseline.

Needs scipy (the ``test`` extra); importing this module does not.
"""

from __future__ import annotations

import math

import numpy as np


def dilate_filter(w2d: np.ndarray, dil_h: int, dil_w: int) -> np.ndarray:
    """Spread the taps of ``w2d`` (..., R, S) with zeros: the dilated filter as a dense one."""
    R, S = w2d.shape[-2:]
    out = np.zeros(w2d.shape[:-2] + ((R - 1) * dil_h + 1, (S - 1) * dil_w + 1), dtype=w2d.dtype)
    out[..., ::dil_h, ::dil_w] = w2d
    return out


def conv2d_reference(x, w, bias=None, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1,
                     dtype=np.float64):
    """Reference convolution, in float64 unless ``dtype`` says otherwise.

    Parameters
    ----------
    x : (N, C, H, W) array
    w : (K, C // groups, R, S) array
    bias : (K,) array or None
    stride, dilation : (int, int)
    padding : (top, bottom, left, right)
    groups : int
    dtype : numpy dtype, default float64
        The precision it computes in.

    Returns
    -------
    (N, K, P, Q) array of ``dtype``
    """
    from scipy import signal

    x = np.asarray(x, dtype=dtype)
    w = np.asarray(w, dtype=dtype)
    N, C, H, W = x.shape
    K, Cg, R, S = w.shape
    top, bottom, left, right = padding
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    wd = dilate_filter(w, *dilation)
    full_p = xp.shape[2] - wd.shape[2] + 1
    full_q = xp.shape[3] - wd.shape[3] + 1
    P = (full_p - 1) // stride[0] + 1
    Q = (full_q - 1) // stride[1] + 1
    y = np.zeros((N, K, P, Q), dtype=dtype)
    Kg = K // groups
    for n in range(N):
        for k in range(K):
            g = k // Kg
            planes = xp[n, g * Cg:(g + 1) * Cg]
            # A 3-D 'valid' correlation over (Cg, Hp, Wp) with (Cg, R', S') sums over channels.
            full = signal.correlate(planes, wd[k], mode="valid")[0]
            y[n, k] = full[::stride[0], ::stride[1]]
    if bias is not None:
        y += np.asarray(bias, dtype=dtype)[None, :, None, None]
    return y


def conv2d_reference_for(problem, x, w, bias=None, dtype=np.float64):
    """:func:`conv2d_reference` with the parameters of a ``ConvProblem``."""
    return conv2d_reference(
        x, w, bias, stride=problem.stride, padding=problem.padding,
        dilation=problem.dilation, groups=problem.groups, dtype=dtype,
    )


def conv2d_reference_nonfinite(x, w, bias=None, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                               groups=1):
    """The definition's answer when ``x`` holds ``inf`` or ``NaN`` (``w`` and ``bias`` finite).

    An output whose window holds no non-finite input is the finite convolution (computed with
    those inputs zeroed, which no such output reads). Otherwise the sum decides: ``NaN`` when a
    term is ``NaN`` (a ``NaN`` input, or an infinite one times a zero weight) or when ``+inf`` and
    ``-inf`` terms meet; else the sign of the infinite terms. The classes are counted by
    correlating indicator arrays, so no ``inf`` or ``NaN`` ever enters scipy (whose FFT path would
    spread them).
    """
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    geometry = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)

    def count(indicator, weights):
        return conv2d_reference(indicator.astype(np.float64), weights.astype(np.float64), **geometry) > 0.5

    pos, neg, nan = x == np.inf, x == -np.inf, np.isnan(x)
    plus = count(pos, w > 0) | count(neg, w < 0)
    minus = count(pos, w < 0) | count(neg, w > 0)
    nan_terms = count(nan, np.ones_like(w)) | count(pos | neg, w == 0)
    y = conv2d_reference(np.where(np.isfinite(x), x, 0.0), w, bias, **geometry)
    y[plus] = np.inf
    y[minus] = -np.inf
    y[nan_terms | (plus & minus)] = np.nan
    return y


def _tap_window(r: int, s: int, P: int, Q: int, stride, dilation):
    """The slices of the padded input that tap ``(r, s)`` reads for the ``P x Q`` outputs."""
    h0, w0 = r * dilation[0], s * dilation[1]
    return (slice(h0, h0 + (P - 1) * stride[0] + 1, stride[0]), slice(w0, w0 + (Q - 1) * stride[1] + 1, stride[1]))


def conv2d_backward_data_reference(dy, w, x_shape, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                                   groups=1, dtype=np.float64):
    """The gradient of the convolution with respect to ``x``, in float64, by its definition:
    every tap ``(r, s)`` scatters ``w[:, :, r, s]^T dy`` into the padded ``dx`` at the input
    positions it read; the padding is cut off at the end.

    Parameters
    ----------
    dy : (N, K, P, Q) array
    w : (K, C // groups, R, S) array
    x_shape : (N, C, H, W)
    stride, dilation : (int, int)
    padding : (top, bottom, left, right)
    groups : int
    dtype : numpy dtype, default float64

    Returns
    -------
    (N, C, H, W) array of ``dtype``
    """
    dy = np.asarray(dy, dtype=dtype)
    w = np.asarray(w, dtype=dtype)
    N, C, H, W = x_shape
    K, Cg, R, S = w.shape
    _, _, P, Q = dy.shape
    top, bottom, left, right = padding
    dxp = np.zeros((N, C, H + top + bottom, W + left + right), dtype)
    Kg = K // groups
    for g in range(groups):
        dy_g, w_g = dy[:, g * Kg:(g + 1) * Kg], w[g * Kg:(g + 1) * Kg]
        for r in range(R):
            for s in range(S):
                rows, cols = _tap_window(r, s, P, Q, stride, dilation)
                dxp[:, g * Cg:(g + 1) * Cg, rows, cols] += np.einsum("nkpq,kc->ncpq", dy_g, w_g[:, :, r, s])
    return dxp[:, :, top:top + H, left:left + W].copy()


def conv2d_backward_weight_reference(x, dy, w_shape, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1),
                                     groups=1, dtype=np.float64):
    """The gradient of the convolution with respect to ``w``, in float64, by its definition:
    ``dw[:, :, r, s]`` is ``dy`` contracted with the window of the padded ``x`` that tap
    ``(r, s)`` read, over the batch and the output pixels.

    Returns
    -------
    (K, C // groups, R, S) array of ``dtype``
    """
    x = np.asarray(x, dtype=dtype)
    dy = np.asarray(dy, dtype=dtype)
    K, Cg, R, S = w_shape
    _, _, P, Q = dy.shape
    top, bottom, left, right = padding
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    dw = np.zeros(w_shape, dtype)
    Kg = K // groups
    for g in range(groups):
        dy_g = dy[:, g * Kg:(g + 1) * Kg]
        for r in range(R):
            for s in range(S):
                rows, cols = _tap_window(r, s, P, Q, stride, dilation)
                dw[g * Kg:(g + 1) * Kg, :, r, s] = np.einsum("nkpq,ncpq->kc", dy_g, xp[:, g * Cg:(g + 1) * Cg, rows, cols])
    return dw


def conv2d_backward_bias_reference(dy, dtype=np.float64):
    """``dy.sum((0, 2, 3))`` in float64: the gradient with respect to the bias."""
    return np.asarray(dy, dtype=dtype).sum(axis=(0, 2, 3))


def backward_reference_for(problem, *arrays, dtype=np.float64):
    """The float64 reference of ``problem``'s operation on its arrays (those its ``run`` takes:
    ``x, w, bias`` / ``dy, w, bias`` / ``x, dy`` / ``dy``)."""
    geometry = dict(stride=problem.stride, padding=problem.padding, dilation=problem.dilation,
                    groups=problem.groups, dtype=dtype)
    op = problem.operation
    if op == "conv2d":
        return conv2d_reference_for(problem, *arrays, dtype=dtype)
    if op == "conv2d_backward_data":
        dy, w = arrays[:2]
        bias = arrays[2] if len(arrays) > 2 else None
        dx = conv2d_backward_data_reference(dy, w, problem.x_shape, **geometry)
        if bias is not None:
            dx += np.asarray(bias, dtype)[None, :, None, None]
        return dx
    if op == "conv2d_backward_weight":
        return conv2d_backward_weight_reference(*arrays, problem.w_shape, **geometry)
    return conv2d_backward_bias_reference(*arrays, dtype=dtype)


def relative_error(y, ref) -> float:
    """Relative Frobenius error ``||y - ref|| / ||ref||`` (absolute when ``ref`` is zero).

    Accumulated in float64 a few images at a time, so gigabyte results need no float64 copy;
    ``inf`` when the error is not finite. Raises ``ValueError`` when the shapes differ.
    """
    y = np.asarray(y)
    ref = np.asarray(ref)
    if y.shape != ref.shape:
        raise ValueError(f"result has shape {y.shape}, expected {ref.shape}")
    if ref.ndim == 0:
        y, ref = y.reshape(1), ref.reshape(1)
    per_image = max(1, int(np.prod(ref.shape[1:])))
    step = max(1, 2**24 // per_image)
    err = norm = 0.0
    for n in range(0, max(ref.shape[0], 1), step):
        r = ref[n:n + step].astype(np.float64)
        d = y[n:n + step].astype(np.float64) - r
        err += float(np.vdot(d, d))
        norm += float(np.vdot(r, r))
    if not math.isfinite(err):
        return math.inf
    return math.sqrt(err / norm) if norm > 0 else math.sqrt(err)


#: Relative (Frobenius) error bound against the float64 reference, per dtype. float16 and
#: bfloat16 results are float32 results rounded once to 11 and 8 significant bits: at most half
#: an ulp (2**-11, 2**-8 of each value) plus float32's error. A half-precision accumulation, or a
#: second rounding, would not stay within them on reductions of a few dozen terms.
TOLERANCE = {"float32": 1e-5, "float64": 1e-12, "float16": 2**-11 + 1e-5, "bfloat16": 2**-8 + 1e-5}
