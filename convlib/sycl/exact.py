"""A few outputs computed by the definition on a SYCL device: the repair path for non-finite
Winograd outputs (why it suffices: :mod:`convlib.cpu.exact`)."""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from . import runtime
from .launch import element_type, fused_multiply_add, launch
from .memory import host_view


@functools.lru_cache(maxsize=None)
def exact_kernel(dtype: str):
    """``y.flat[flat[t]] = bias[k] + sum_{c,r,s} x * w`` (zero padding included) per work-item ``t``."""
    mods = runtime.load()
    dpex, kapi = mods.dpex, mods.kapi
    acc_type = element_type(dtype)
    fma = fused_multiply_add()

    @dpex.kernel
    def exact_outputs(
        nd: kapi.NdItem,
        x,     # IN  (N, C, H, W)
        w,     # IN  (K, Cg, R, S)
        bias,  # IN  (K,)
        flat,  # IN  (count,) int64 flat indices into y
        y,     # INOUT (N, K, P, Q)
        stride_h, stride_w, top, left, dil_h, dil_w, groups_arg,
    ):
        t = nd.get_global_id(0)
        if t < flat.shape[0]:
            H, W = x.shape[2], x.shape[3]
            K, Cg, R, S = max(w.shape[0], 1), w.shape[1], w.shape[2], w.shape[3]
            P, Q = max(y.shape[2], 1), max(y.shape[3], 1)
            Kg = max(K // max(groups_arg, 1), 1)
            i = flat[t]
            q = i % Q
            p = (i // Q) % P
            k = (i // (Q * P)) % K
            n = i // (Q * P * K)
            c0 = (k // Kg) * Cg
            acc = acc_type(bias[k])
            zero = acc_type(0)
            for c in range(Cg):
                for r in range(R):
                    h = p * stride_h - top + r * dil_h
                    for s in range(S):
                        col = q * stride_w - left + s * dil_w
                        v = zero
                        if h >= 0 and h < H and col >= 0 and col < W:
                            v = x[n, c0 + c, h, col]
                        acc = fma(v, w[k, c, r, s], acc)  # 0 * w is part of the sum (NaN for w = inf)
            y[n, k, p, q] = acc

    return exact_outputs


@njit(cache=True)
def _any_nonfinite(flat):  # IN (n,) a host view of the result
    # One thread: the OpenCL runtime's own threads are still spinning after the kernels, and a
    # parallel region woken beside them cost more than the pass (~0.6 ms per 6.4 MB) it splits.
    found = False
    for i in range(flat.size):
        v = flat[i]
        found |= (v - v) != 0  # 0 for a finite v, NaN (unequal) otherwise
    return found


def has_nonfinite(y, queue) -> bool:
    """Whether the device array ``y`` holds an ``inf`` or ``NaN`` (waits for ``queue``): one
    single-threaded pass on the host over a host-accessible result (a CPU device), else dpctl's
    precompiled reductions on the device."""
    queue.wait()
    view = host_view(y)
    if view is not None:
        return bool(_any_nonfinite(view.reshape(-1)))
    dpt = runtime.load().dpt
    return bool(dpt.any(dpt.logical_not(dpt.isfinite(y))))


def repair_nonfinite(problem, x, w, bias, y, queue) -> int:
    """Recompute every non-finite output of the device array ``y`` by the definition; returns
    how many there were. ``bias`` is a device array (zeros without bias)."""
    if not has_nonfinite(y, queue):
        return 0
    dpt = runtime.load().dpt
    view = host_view(y)
    values = view if view is not None else dpt.asnumpy(y)
    flat = np.flatnonzero(~np.isfinite(values.reshape(-1)))
    if flat.size:
        launch(exact_kernel(problem.dtype), (flat.size,), (64,), queue,
               x, w, bias, dpt.asarray(flat.astype(np.int64), sycl_queue=queue), y,
               problem.stride[0], problem.stride[1], problem.pad_top, problem.pad_left,
               problem.dilation[0], problem.dilation[1], problem.groups)
        queue.wait()
    return int(flat.size)
