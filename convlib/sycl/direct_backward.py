"""The backward passes of the convolution by their definitions, as numba-dpex kernels: ``direct``.

* :data:`DATA` (``conv2d_backward_data``, and ``conv_transpose2d`` with its bias of ``C``): the
  gather form, laid out like the forward ``direct`` kernel. The range is ``(N * C / CB, H, W)``:
  adjacent work-items take adjacent columns ``v`` of ``dx`` (the runtime vectorises across them)
  and each keeps ``CB`` channels of one group in private registers, so every ``dy`` value it loads
  is used ``CB`` times. For a filter row ``r`` the work-item's row ``h`` reads the ``dy`` row
  ``p = (h + top - r*dil_h) / stride_h`` when that divides and lies in ``[0, P)``; for a filter
  column ``s`` likewise the column ``q``. Taps that do not divide or fall outside ``dy`` are
  skipped, not multiplied by zeros: no zero is inserted into ``dy``, no multiplication is wasted
  at stride > 1, and a NaN or inf of ``dy``/``w`` reaches exactly the ``dx`` values the
  definition says.
* :data:`WEIGHT` (``conv2d_backward_weight``): one work-group per ``dw[k, c, r, s]``. Its work-items
  split the sum over the batch and the output pixels as rows ``(n, p)`` x columns ``q`` (adjacent
  work-items on adjacent columns); the rows and columns whose input pixel lies inside the
  image are computed per element, so no bounds test in the inner loop. The products with
  padding (``dy * 0``, NaN where ``dy`` is inf or NaN, as in the definition) are a second loop
  over the padding positions alone. Each work-item sums one row's products, adds the row's sum to its own
  total (two-level summation keeps float32 sums over large batches accurate), and the
  work-group adds its work-items' totals by a tree in local memory.

Compile cost: the data kernel per ``(R, S, stride_w, CB, dtype)``, like the forward ``direct``
(``stride_w`` fixes the step between adjacent work-items' addresses, so the vectoriser emits
plain vector loads); the weight kernel per ``(stride_w, dtype)``. Everything else is a run-time
argument. 0.2-1 s per kernel on first launch in a process (numba-dpex has no on-disk cache).
"""

from __future__ import annotations

import functools

import numpy as np

from ..core.problem import ConvProblem
from . import runtime
from .launch import element_type, fused_multiply_add, launch, register_block, row_work_group, work_group
from .memory import bias_or_zeros, device_empty
from .tables import KNOBS, device_kind


@functools.lru_cache(maxsize=None)
def data_kernel(R: int, S: int, stride_w: int, CB: int, dtype: str):
    """The backward-data kernel for ``R x S`` filters, ``CB`` channels of ``dx`` per work-item
    (``CB`` divides ``C / groups``)."""
    mods = runtime.load()
    dpex, kapi = mods.dpex, mods.kapi
    acc_type = element_type(dtype)
    fma = fused_multiply_add()

    @dpex.kernel
    def conv_backward_data(
        nd: kapi.NdItem,
        dy,  # IN  (N, K, P, Q)
        w,  # IN  (K, Cg, R, S)
        bias,  # IN  (C,) (zeros without bias)
        dx,  # OUT (N, C, H, W)
        Cg_arg, Kg_arg, stride_h_arg, dil_h_arg, dil_w_arg, top_arg, left_arg,
    ):
        # max(., 1) / max(., 0): the compiler may then take indices and divisors as positive.
        Cg, Kg = max(Cg_arg, 1), max(Kg_arg, 1)
        stride_h = max(stride_h_arg, 1)
        dil_h = max(dil_h_arg, 1)
        dil_w = max(dil_w_arg, 1)
        top = max(top_arg, 0)
        left = max(left_arg, 0)
        block_id = nd.get_global_id(0)
        h = nd.get_global_id(1)
        v = nd.get_global_id(2)
        C, H, W = max(dx.shape[1], 1), dx.shape[2], dx.shape[3]
        P, Q = dy.shape[2], dy.shape[3]
        blocks_per_image = max(C // CB, 1)
        n = block_id // blocks_per_image
        c0 = (block_id % blocks_per_image) * CB
        g = c0 // Cg
        cl0 = c0 - g * Cg
        k0 = g * Kg
        if h < H and v < W:  # the global range is padded to whole work-groups
            acc = kapi.PrivateArray(CB, acc_type)
            for j in range(CB):
                acc[j] = bias[c0 + j]
            for r in range(R):
                num_h = h + top - r * dil_h
                if num_h >= 0:
                    p = num_h // stride_h
                    if p * stride_h == num_h and p < P:
                        for s in range(S):
                            num_w = v + left - s * dil_w
                            if num_w >= 0:
                                q = num_w // stride_w
                                if q * stride_w == num_w and q < Q:
                                    for kl in range(Kg):
                                        dv = dy[n, k0 + kl, p, q]
                                        for j in range(CB):
                                            acc[j] = fma(dv, w[k0 + kl, cl0 + j, r, s], acc[j])
            for j in range(CB):
                dx[n, c0 + j, h, v] = acc[j]

    return conv_backward_data


@functools.lru_cache(maxsize=None)
def weight_kernel(stride_w: int, dtype: str):
    """The backward-weight kernel: one work-group per ``dw`` element (see the module docstring).

    Launch over ``(K * Cg * R * S, A, B)`` in work-groups ``(1, A, B)`` with a local accessor of
    ``A * B`` elements."""
    mods = runtime.load()
    dpex, kapi = mods.dpex, mods.kapi
    acc_type = element_type(dtype)

    @dpex.kernel
    def conv_backward_weight(
        nd: kapi.NdItem,
        x,  # IN  (N, C, H, W)
        dy,  # IN  (N, K, P, Q)
        dw,  # OUT (K, Cg, R, S)
        partial,  # LOCAL (A * B,)
        Kg_arg, stride_h_arg, dil_h_arg, dil_w_arg, top_arg, left_arg,
    ):
        Kg = max(Kg_arg, 1)
        stride_h = max(stride_h_arg, 1)
        dil_h = max(dil_h_arg, 1)
        dil_w = max(dil_w_arg, 1)
        top = max(top_arg, 0)
        left = max(left_arg, 0)
        group = nd.get_group()
        e = group.get_group_id(0)
        a = nd.get_local_id(1)
        b = nd.get_local_id(2)
        A = max(nd.get_local_range(1), 1)
        B = max(nd.get_local_range(2), 1)
        N, H, W = x.shape[0], x.shape[2], x.shape[3]
        P, Q = dy.shape[2], dy.shape[3]
        Cg, R, S = max(dw.shape[1], 1), max(dw.shape[2], 1), max(dw.shape[3], 1)
        s = e % S
        rest = e // S
        r = rest % R
        rest = rest // R
        cl = rest % Cg
        k = rest // Cg
        c = (k // Kg) * Cg + cl
        # Rows p and columns q whose input pixel (p*sh + h_off, q*sw + w_off) lies inside the image.
        h_off = r * dil_h - top
        w_off = s * dil_w - left
        p_lo = max(0, (stride_h - 1 - h_off) // stride_h)
        p_hi = min(P, (H - 1 - h_off) // stride_h + 1)
        q_lo = max(0, (stride_w - 1 - w_off) // stride_w)
        q_hi = min(Q, (W - 1 - w_off) // stride_w + 1)
        rows = max(p_hi - p_lo, 0)
        total = acc_type(0)
        t = a
        while t < N * rows:
            n = t // rows
            p = p_lo + t - n * rows
            h = p * stride_h + h_off
            part = acc_type(0)
            q = q_lo + b
            while q < q_hi:
                # Unfused on purpose: through the fma intrinsic this reduction loop made the
                # OpenCL compiler print "loop not vectorized" on every first launch.
                part += dy[n, k, p, q] * x[n, c, h, q * stride_w + w_off]
                q += B
            total += part
            t += A
        # The products with padding, dy * 0: zero unless dy is inf or NaN there, where the
        # definition (the forward multiplies its padding too) has 0 * inf = NaN. Only the padding
        # positions are visited: whole rows outside [p_lo, p_hi), then the columns outside
        # [q_lo, q_hi) of the rows inside.
        zero = acc_type(0)
        pad_rows = P - rows
        inside_cols = max(q_hi - q_lo, 0)
        t = a
        while t < N * pad_rows:
            n = t // pad_rows
            p = t - n * pad_rows
            if p >= p_lo:
                p += rows
            q = b
            while q < Q:
                total += dy[n, k, p, q] * zero
                q += B
            t += A
        t = a
        while t < N * rows:
            n = t // rows
            p = p_lo + t - n * rows
            j = b
            while j < Q - inside_cols:
                q = j if j < q_lo else j + inside_cols
                total += dy[n, k, p, q] * zero
                j += B
            t += A
        # The work-group's sum: a tree over its work-items in local memory.
        lid = a * B + b
        size = A * B
        partial[lid] = total
        kapi.group_barrier(group)
        half = 1
        while half < size:
            half *= 2
        half //= 2
        while half > 0:
            if lid < half and lid + half < size:
                partial[lid] += partial[lid + half]
            kapi.group_barrier(group)
            half //= 2
        if lid == 0:
            dw[k, cl, r, s] = partial[0]

    return conv_backward_weight


def reduction_work_group(device, dtype: str, row_length: int) -> tuple[int, int, int]:
    """The work-group ``(1, A, B)`` of a reduction kernel (this module's weight kernel, the bias
    gradient's): about ``reduce_wg`` work-items over rows of ``row_length``, clamped to the
    device, local memory included (one element per work-item)."""
    items = KNOBS.lookup("reduce_wg", (device_kind(device), dtype))
    rows, columns = row_work_group(device, items, row_length)
    return work_group(device, (1, rows, columns), np.dtype(dtype).itemsize)


class _DirectBackward:
    """The implementation contract for one backward pass (see the module docstring)."""

    def __init__(self, operation: str):
        self.operation = operation

    def supports(self, problem: ConvProblem) -> str | None:
        """``direct`` serves every valid problem."""
        return None

    def workspace_bytes(self, problem: ConvProblem, device=None) -> int:
        """Nothing that grows with the problem: a zero bias of ``C`` without bias (data), one
        work-group's local memory (weight)."""
        return 0

    def run(self, problem: ConvProblem, *arrays):
        if self.operation == "conv2d_backward_data":
            return _run_data(problem, *arrays)
        return _run_weight(problem, *arrays)


def _run_data(problem: ConvProblem, dy, w, bias, device):
    """``dx`` ``(N, C, H, W)`` (plus ``bias`` of ``C``) from ``dy`` and ``w`` on ``device`` (a
    ``dpctl.SyclQueue``)."""
    p = problem
    key = (device_kind(device.sycl_device), p.dtype)
    cb = register_block(p.C_per_group, KNOBS.lookup("backward_cb", key))
    dx = device_empty(p.x_shape, p.dtype, device, result=True)
    kernel = data_kernel(p.R, p.S, p.stride[1], cb, p.dtype)
    launch(
        kernel,
        (p.N * (p.C // cb), p.H, p.W),
        (1,) + row_work_group(device.sycl_device, KNOBS.lookup("backward_wg", key), p.W),
        device,
        dy, w, bias_or_zeros(p, bias, device), dx,
        p.C_per_group, p.K_per_group, p.stride[0], p.dilation[0], p.dilation[1], p.pad_top, p.pad_left,
    )
    return dx


def _run_weight(problem: ConvProblem, x, dy, device):
    """``dw`` ``(K, C / groups, R, S)`` from ``x`` and ``dy`` on ``device``."""
    p = problem
    kapi = runtime.load().kapi
    dw = device_empty(p.w_shape, p.dtype, device, result=True)
    local = reduction_work_group(device.sycl_device, p.dtype, p.Q)
    elements = p.K * p.C_per_group * p.R * p.S
    launch(
        weight_kernel(p.stride[1], p.dtype),
        (elements,) + local[1:],  # exactly one work-group per element
        local,
        device,
        x, dy, dw, kapi.LocalAccessor(local[1] * local[2], np.dtype(p.dtype)),
        p.K_per_group, p.stride[0], p.dilation[0], p.dilation[1], p.pad_top, p.pad_left,
    )
    return dw


#: ``conv2d_backward_data`` (and ``conv_transpose2d``) by the gather form.
DATA = _DirectBackward("conv2d_backward_data")
#: ``conv2d_backward_weight`` by its definition, one work-group per element.
WEIGHT = _DirectBackward("conv2d_backward_weight")
