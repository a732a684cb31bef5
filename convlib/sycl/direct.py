"""Direct convolution as one numba-dpex kernel: columns across work-items, channels in registers.

Layout (the shape that ran at 100-150 GFLOP/s on the OpenCL CPU device, ``docs/devices.md``):
the 3-D range is ``(N * channel_blocks, P, Q)``; adjacent work-items take adjacent output
columns ``q`` (the runtime vectorises across them), and each work-item accumulates a block of
``KB`` output channels of one group in private registers, so every input value it loads is
used ``KB`` times. Filter taps are uniform across a work-group (loads broadcast).

Padding is made explicit first (one zero-padded copy of ``x`` with dpctl.tensor's precompiled
copy), so the kernel has no bounds test in its inner loop; work-items of the padded global
range beyond ``P x Q`` skip the whole body (a clamped read instead was 4x slower: gathers).

Compile cost: one kernel per ``(R, S, stride_w, KB, dtype)`` (0.3-1 s on first launch in a process; no
on-disk cache exists for numba-dpex). Sizes, vertical stride, dilation, groups and padding
are run-time arguments, so a new shape with the same filter size and horizontal stride costs
nothing. A new queue object also
recompiles (numba-dpex keys kernels on the queue); the backend reuses dpctl's cached queues.
"""

from __future__ import annotations

import functools

from ..core.problem import ConvProblem
from . import runtime
from .launch import element_type, fused_multiply_add, launch, register_block, row_work_group
from .memory import bias_or_zeros, device_empty, padded_input_bytes, zero_padded_input
from .tables import blocking_for


def supports(problem: ConvProblem) -> str | None:
    """Direct convolution serves every valid problem."""
    return None


@functools.lru_cache(maxsize=None)
def direct_kernel(R: int, S: int, stride_w: int, KB: int, dtype: str):
    """The direct-convolution kernel for ``R x S`` filters, ``KB`` channels per work-item.

    ``stride_w`` is a compile-time constant because it is the step between the addresses of
    adjacent work-items: known, the vectoriser emits contiguous (or strided) vector loads;
    unknown, it falls back on gathers (2.5x slower). ``KB`` must divide ``K / groups``.
    """
    mods = runtime.load()
    dpex, kapi = mods.dpex, mods.kapi
    acc_type = element_type(dtype)
    fma = fused_multiply_add()

    @dpex.kernel
    def conv_direct_channel_block(
        nd: kapi.NdItem,
        x,  # IN  (N, C, Hp, Wp) zero-padded input
        w,  # IN  (K, Cg, R, S)
        bias,  # IN  (K,)
        y,  # OUT (N, K, P, Q)
        Cg_arg, Kg_arg, stride_h_arg, dil_h_arg, dil_w_arg,
    ):
        # max(., 1) lets the compiler prove every index and divisor positive, so it drops numba's
        # negative-index wraparound selects and floor-division fix-ups (without: 2-3x slower).
        Cg, Kg = max(Cg_arg, 1), max(Kg_arg, 1)
        stride_h = max(stride_h_arg, 1)
        dil_h = max(dil_h_arg, 1)
        dil_w = max(dil_w_arg, 1)
        block_id = nd.get_global_id(0)
        p = nd.get_global_id(1)
        q = nd.get_global_id(2)
        K, P, Q = max(y.shape[1], 1), y.shape[2], y.shape[3]
        blocks_per_image = max(K // KB, 1)
        n = block_id // blocks_per_image
        k0 = (block_id % blocks_per_image) * KB
        c0 = (k0 // Kg) * Cg
        if p < P and q < Q:  # the global range is padded to whole work-groups
            acc = kapi.PrivateArray(KB, acc_type)
            for j in range(KB):
                acc[j] = bias[k0 + j]
            for c in range(Cg):
                for r in range(R):
                    h = p * stride_h + r * dil_h
                    for s in range(S):
                        xv = x[n, c0 + c, h, q * stride_w + s * dil_w]
                        for j in range(KB):
                            acc[j] = fma(xv, w[k0 + j, c, r, s], acc[j])
            for j in range(KB):
                y[n, k0 + j, p, q] = acc[j]

    return conv_direct_channel_block


def workspace_bytes(problem: ConvProblem, device=None) -> int:
    """Bytes of the zero-padded copy of ``x`` (none without padding)."""
    return padded_input_bytes(problem)


def run(problem: ConvProblem, x, w, bias, device):
    """Convolve on the SYCL device ``device`` (a ``dpctl.SyclQueue``).

    Parameters
    ----------
    problem : ConvProblem
    x : usm_ndarray (N, C, H, W), C-contiguous, on ``device``
    w : usm_ndarray (K, C // groups, R, S)
    bias : usm_ndarray (K,) or None
    device : dpctl.SyclQueue

    Returns
    -------
    usm_ndarray (N, K, P, Q) on ``device``
    """
    p = problem
    blk = blocking_for(device.sycl_device, p.dtype)
    kb = register_block(p.K_per_group, blk.direct_kb)
    y = device_empty(p.y_shape, p.dtype, device, result=True)
    kernel = direct_kernel(p.R, p.S, p.stride[1], kb, p.dtype)
    launch(
        kernel,
        (p.N * (p.K // kb), p.P, p.Q),
        (1,) + row_work_group(device.sycl_device, blk.direct_wg, p.Q),
        device,
        zero_padded_input(p, x), w, bias_or_zeros(p, bias, device), y,
        p.C_per_group, p.K_per_group, p.stride[0], p.dilation[0], p.dilation[1],
    )
    return y
