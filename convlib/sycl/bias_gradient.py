"""The bias gradient ``db = dy.sum((0, 2, 3))`` as a numba-dpex kernel: ``direct``.

One work-group per channel ``k``: its work-items split the channel's planes as images ``n`` x
pixels (``dy`` seen as ``(N, K, P*Q)``, adjacent work-items on adjacent pixels), each sums its
share of one plane, adds that to its own total (two-level summation: float32 sums over large
batches stay accurate), and the work-group adds its work-items' totals by a tree in local memory
(the work-group shape is :func:`convlib.sycl.direct_backward.reduction_work_group`'s, the
``reduce_wg`` knob). Memory-bound: ``dy`` is read once.

Compile cost: one kernel per dtype (0.2-1 s on first launch in a process).
"""

from __future__ import annotations

import functools

import numpy as np

from ..core.problem import ConvProblem
from . import runtime
from .direct_backward import reduction_work_group
from .launch import element_type, launch
from .memory import device_empty


def supports(problem: ConvProblem) -> str | None:
    """Every ``dy`` is served."""
    return None


def workspace_bytes(problem: ConvProblem, device=None) -> int:
    """Nothing beyond the result (one work-group's local memory)."""
    return 0


@functools.lru_cache(maxsize=None)
def bias_kernel(dtype: str):
    """``kernel(dy, db, partial)``: ``db[k] = dy[:, k].sum()`` for ``dy`` ``(N, K, P*Q)``; launch
    over ``(K, A, B)`` in work-groups ``(1, A, B)`` with a local accessor of ``A * B`` elements."""
    mods = runtime.load()
    dpex, kapi = mods.dpex, mods.kapi
    acc_type = element_type(dtype)

    @dpex.kernel
    def bias_gradient(
        nd: kapi.NdItem,
        dy,  # IN  (N, K, P*Q)
        db,  # OUT (K,)
        partial,  # LOCAL (A * B,)
    ):
        group = nd.get_group()
        k = group.get_group_id(0)
        a = nd.get_local_id(1)
        b = nd.get_local_id(2)
        A = max(nd.get_local_range(1), 1)
        B = max(nd.get_local_range(2), 1)
        N, PQ = dy.shape[0], dy.shape[2]
        total = acc_type(0)
        for n in range(a, N, A):
            part = acc_type(0)
            for i in range(b, PQ, B):
                part += dy[n, k, i]
            total += part
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
            db[k] = partial[0]

    return bias_gradient


def run(problem: ConvProblem, dy, device):
    """``dy.sum((0, 2, 3))`` of ``dy`` ``(N, K, P, Q)`` (the problem's ``x_shape``) on ``device``
    (a ``dpctl.SyclQueue``); the result ``(K,)`` stays there."""
    mods = runtime.load()
    N, K, P, Q = problem.x_shape
    db = device_empty((K,), problem.dtype, device, result=True)
    local = reduction_work_group(device.sycl_device, problem.dtype, P * Q)
    launch(
        bias_kernel(problem.dtype),
        (K,) + local[1:],  # exactly one work-group per channel
        local,
        device,
        mods.dpt.reshape(dy, (N, K, P * Q)), db, mods.kapi.LocalAccessor(local[1] * local[2], np.dtype(problem.dtype)),
    )
    return db
