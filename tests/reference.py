"""The plain reference every test compares against: scipy.signal.correlate in float64.

Deliberately independent of convlib's kernels and written for obviousness, not speed:
padding by ``np.pad``, dilation by spreading the filter with zeros, stride by slicing the
stride-1 result, groups by slicing channels.
"""

from __future__ import annotations

import numpy as np
from scipy import signal


def dilate_filter(w2d: np.ndarray, dil_h: int, dil_w: int) -> np.ndarray:
    """Spread the taps of ``w2d`` (..., R, S) with zeros: the dilated filter as a dense one."""
    R, S = w2d.shape[-2:]
    out = np.zeros(w2d.shape[:-2] + ((R - 1) * dil_h + 1, (S - 1) * dil_w + 1), dtype=w2d.dtype)
    out[..., ::dil_h, ::dil_w] = w2d
    return out


def conv2d_reference(x, w, bias=None, *, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """Reference convolution in float64.

    Parameters
    ----------
    x : (N, C, H, W) array
    w : (K, C // groups, R, S) array
    bias : (K,) array or None
    stride, dilation : (int, int)
    padding : (top, bottom, left, right)
    groups : int

    Returns
    -------
    (N, K, P, Q) float64 array
    """
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    N, C, H, W = x.shape
    K, Cg, R, S = w.shape
    top, bottom, left, right = padding
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    wd = dilate_filter(w, *dilation)
    full_p = xp.shape[2] - wd.shape[2] + 1
    full_q = xp.shape[3] - wd.shape[3] + 1
    P = (full_p - 1) // stride[0] + 1
    Q = (full_q - 1) // stride[1] + 1
    y = np.zeros((N, K, P, Q))
    Kg = K // groups
    for n in range(N):
        for k in range(K):
            g = k // Kg
            planes = xp[n, g * Cg:(g + 1) * Cg]
            # A 3-D 'valid' correlation over (Cg, Hp, Wp) with (Cg, R', S') sums over channels.
            full = signal.correlate(planes, wd[k], mode="valid")[0]
            y[n, k] = full[::stride[0], ::stride[1]]
    if bias is not None:
        y += np.asarray(bias, dtype=np.float64)[None, :, None, None]
    return y


def conv2d_reference_for(problem, x, w, bias=None):
    """:func:`conv2d_reference` with the parameters of a ``ConvProblem``."""
    return conv2d_reference(
        x, w, bias, stride=problem.stride, padding=problem.padding,
        dilation=problem.dilation, groups=problem.groups,
    )


def relative_error(y, ref) -> float:
    """Relative Frobenius error ``||y - ref|| / ||ref||`` (absolute when ``ref`` is zero)."""
    y = np.asarray(y, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    denom = np.linalg.norm(ref)
    err = np.linalg.norm(y - ref)
    return float(err / denom) if denom > 0 else float(err)


#: Relative (Frobenius) error bound against the float64 reference, per dtype.
TOLERANCE = {"float32": 1e-5, "float64": 1e-12}
