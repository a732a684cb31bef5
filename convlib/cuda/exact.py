"""Outputs computed by the definition on the GPU: the repair path for non-finite results of the
algorithms that transform their inputs (Winograd), as :mod:`convlib.cpu.exact` and
:mod:`convlib.sycl.exact` are on the other backends (why recomputing the non-finite outputs
suffices: :mod:`convlib.cpu.exact`).

The algorithm raises ``flag[0]`` on the device when it stores a non-finite output; the repair
launch reads the flag first, so the usual case costs one small launch and no host
synchronisation.
"""

from __future__ import annotations

import functools

import numpy as np

from .codegen import compile_kernel, unsigned_constants
from .tables import launch_knob


@functools.lru_cache(maxsize=None)
def repair_kernel(key, simulator: bool):
    """``kernel(x, w, bias, y, flag, count)``: when ``flag[0]`` is raised, every non-finite output
    among the first ``count`` of the flat ``y`` recomputed by the definition (zero padding
    included: ``0 * inf`` is NaN there too). A grid-stride loop, so that the usual case (flag
    down) costs one small launch. ``key`` is the problem with the batch erased (any stride,
    padding, dilation and groups).
    """
    bias = "bias[k]" if key.has_bias else "zero"
    source = f'''
def repair(x, w, bias, y, flag, count):
    # IN x (N*C*H*W), IN w (K*Cg*R*S), IN bias (K,), INOUT y (N*K*P*Q), IN flag (1,)
    if flag[0] == 0:
        return
    e = U(cuda.grid(1))
    step = U(cuda.gridsize(1))
    while e < U(count):
        value = y[e]
        if not (value - value == zero):
            n = e // KPQ
            rest = e - n * KPQ
            k = rest // PQ
            pq = rest - k * PQ
            p = pq // Q
            q = pq - p * Q
            g = k // KG
            acc = {bias}
            for c in range(CG):
                plane = ((n * C + g * CG + U(c)) * H) * W
                for r in range(R):
                    ih = I(p * SH + U(r) * DH) - TOP
                    for s in range(S):
                        iw = I(q * SW + U(s) * DW) - LEFT
                        inside = U(ih) < H and U(iw) < W
                        xv = x[plane + U(ih) * W + U(iw)] if inside else zero
                        acc += xv * w[((k * CG + U(c)) * R + U(r)) * S + U(s)]
            y[e] = acc
        e += step
'''
    namespace = unsigned_constants(
        KPQ=key.K * key.P * key.Q, PQ=key.P * key.Q, Q=key.Q, KG=key.K_per_group, CG=key.C_per_group,
        C=key.C, H=key.H, W=key.W, R=key.R, S=key.S, SH=key.stride[0], SW=key.stride[1],
        DH=key.dilation[0], DW=key.dilation[1],
    )
    namespace.update(TOP=np.int64(key.pad_top), LEFT=np.int64(key.pad_left), zero=np.dtype(key.dtype).type(0))
    return compile_kernel(source, "repair", namespace, simulator=simulator)


def repair_flagged_outputs(key, x, w, bias, y, flag, target) -> None:
    """Launch :func:`repair_kernel` over the flat ``y`` on ``target``'s stream: a grid of at most
    four blocks per multiprocessor, which does nothing unless ``flag[0]`` is raised."""
    threads = launch_knob("elementwise_threads", target.simulator)
    blocks = min(-(-y.size // threads), 4 * target.multiprocessors)
    repair_kernel(key, target.simulator)[blocks, threads, target.stream](x, w, bias, y, flag, y.size)
