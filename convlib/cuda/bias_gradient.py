"""The bias gradient ``db = dy.sum((0, 2, 3))`` on the GPU: ``direct``.

One thread block per channel ``k``: its threads walk the channel's ``N * P * Q`` values
(consecutive threads on consecutive pixels, coalesced), each folding every
:data:`FOLD` values into its own total (two-level summation: float32
sums over large batches stay accurate), then the block adds its threads' totals by a tree in shared
memory. Memory-bound: ``dy`` is read once.

Cost of a new shape: ``K`` and ``P * Q`` are compile-time constants, the batch size a run-time
argument.
"""

from __future__ import annotations

import functools

import numpy as np

from .gemm import shape_key
from .launch import cuda, flat
from .tables import launch_knob

#: Values a thread sums before adding them to its running total.
FOLD = 32

#: CUDA's limit on gridDim.x.
MAX_GRID_X = 2**31 - 1


def first_half(threads: int) -> int:
    """The first step of a tree reduction over ``threads`` values: half the smallest power of two
    that covers them (any ``threads`` works; the reduction guards the uneven top)."""
    half = 1
    while half < threads:
        half *= 2
    return half // 2


def supports(problem) -> str | None:
    """Every ``dy`` whose channels one launch can address (2^31 - 1)."""
    if problem.C > MAX_GRID_X:
        return f"dy has {problem.C} channels, more than the {MAX_GRID_X} blocks one launch can address"
    return None


def workspace_bytes(problem, device=None) -> int:
    """None: one block's shared memory."""
    return 0


@functools.lru_cache(maxsize=None)
def bias_kernel(key, threads: int):
    """``kernel(dy, db, n_images)`` for ``dy`` of the problem shape ``key`` (``x_shape``: ``(N, K,
    P, Q)`` as ``N, C, H, W``; flat); grid ``(K,)``, ``threads`` per block."""
    dtype = np.dtype(key.dtype)
    zero = dtype.type(0)
    K, PQ = key.C, key.H * key.W
    THREADS = threads
    HALF = first_half(threads)

    def bias_gradient(dy, db, n_images):
        # IN dy (N*K*P*Q), OUT db (K,)
        partial = cuda.shared.array(THREADS, dtype)
        tid = cuda.threadIdx.x
        k = cuda.blockIdx.x
        count = n_images * PQ
        total = zero
        i = tid
        while i < count:
            part = zero
            j = 0
            while j < FOLD and i < count:
                n = i // PQ
                part += dy[(n * K + k) * PQ + i - n * PQ]
                i += THREADS
                j += 1
            total += part
        partial[tid] = total
        cuda.syncthreads()
        half = HALF
        while half > 0:
            if tid < half and tid + half < THREADS:
                partial[tid] += partial[tid + half]
            cuda.syncthreads()
            half //= 2
        if tid == 0:
            db[k] = partial[0]

    return cuda.jit(bias_gradient)


def run(problem, dy, device):
    """``dy.sum((0, 2, 3))`` of the device array ``dy`` ``(N, K, P, Q)`` (the problem's
    ``x_shape``); the result ``(K,)`` stays on the device."""
    target = device
    with target.activate():
        db = target.empty((problem.C,), problem.dtype)
        threads = launch_knob("reduction_threads", target.simulator)
        bias_kernel(shape_key(problem), threads)[problem.C, threads, target.stream](flat(dy), db, problem.N)
    return db
