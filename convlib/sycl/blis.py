"""BLIS-style convolution on a SYCL device: B panels packed straight from the image, no im2col matrix.

The GEMM view per group ``g``: ``C (Kg x N*P*Q) = A (Kg x Kgemm) @ B (Kgemm x N*P*Q)``, with A the
filters and B the *implicit* im2col matrix, ``Kgemm = C/groups * R * S``. The five BLIS loops map
onto the device as follows (names as in :mod:`convlib.sycl.tables` and BLIS itself):

``jc`` (host loop)
    over blocks of at most ``NC`` columns of B (output pixels of the whole batch), cut at
    output-row boundaries (:func:`panel_blocks`): a segment of one row when ``Q > NC``, whole
    rows of one image, or whole images when an image has fewer than ``NC`` pixels.
``pc`` (host loop)
    over blocks of ``KC`` rows of B (``c, r, s`` taps). :func:`pack_b_kernel` gathers the
    ``KC x NC`` panel ``Bc`` straight from the (zero-padded) NCHW image: packing *is* the im2col,
    one panel at a time.
``ic``, ``ir`` (work-item grid, dimension 0)
    over ``MR``-row micro-panels of A. A is packed once per call (:func:`pack_a_kernel`) into
    ``(groups, Kg/MR, Kgemm, MR)`` (zero rows pad ``Kg`` up to whole panels), so a work-item's
    ``MR`` filter values for one tap are adjacent; A is the filter tensor, independent of N, H, W.
``jr`` (work-item grid, dimension 1)
    over the ``NC`` columns of the panel: adjacent work-items take adjacent columns, the
    runtime's vectoriser packs them into SIMD lanes (the device's ``NR``).

The micro-kernel (:func:`gemm_packed_kernel`) keeps an ``MR x 1`` tile per work-item in registers
and accumulates into C across ``pc`` blocks (bias in the first block's prologue).

Workspace: ``Ac`` = ``groups * ceil(Kg/MR)*MR * Kgemm`` values (the filters' size), ``Bc`` of at
most ``blis_kc * blis_nc`` values (a panel narrower than ``NC`` gets a deeper ``KC``), and one
zero-padded copy of ``x`` when padding is asked for. Neither ``Ac`` nor ``Bc`` depends on N, H
or W.

Compile cost (first launch in a process, 0.2-1 s each, no on-disk cache): the B packing kernel
once per dtype, the A packing kernel and the micro-kernel per ``(MR, dtype)``. Every size,
stride, padding, dilation and group count is a run-time argument: a new shape costs nothing.
"""

from __future__ import annotations

import functools

from ..core.problem import ConvProblem
from . import runtime
from .launch import element_type, fused_multiply_add, launch
from .memory import bias_or_zeros, device_empty, padded_input_bytes, zero_padded_input
from .tables import blocking_for


def supports(problem: ConvProblem) -> str | None:
    """blis serves every valid problem."""
    return None


@functools.lru_cache(maxsize=None)
def pack_b_kernel():
    """The kernel gathering one ``KC x NC`` panel of the implicit im2col matrix from the image.

    A panel covers ``nrows`` whole output rows ``(n, p)`` (or one segment of a row wider than
    ``NC``), ``ncols`` pixels each: its column ``j = row * ncols + q``. One work-item per
    (tap, output row) copies the row's ``ncols`` values in a loop: 5x faster on the OpenCL CPU
    device than one work-item per value (the runtime's per-item cost dwarfs a copy).
    """
    mods = runtime.load()
    dpex, kapi = mods.dpex, mods.kapi

    @dpex.kernel
    def pack_b_from_image(
        nd: kapi.NdItem,
        x,  # IN  (N, C, Hp, Wp) zero-padded input
        panel,  # OUT (KC, NC): rows pc .. pc+kc-1 of B for group g, columns (row0 + row, q0 + q)
        c0_arg, pc_arg, row0_arg, q0_arg, kc, nrows, ncols, R_arg, S_arg, P_arg,
        stride_h_arg, stride_w_arg, dil_h_arg, dil_w_arg,
    ):
        # Clamped so the compiler can prove every index and divisor positive: numba's floor
        # division and negative-index wraparound then compile to plain unsigned arithmetic.
        c0, pc, row0, q0 = max(c0_arg, 0), max(pc_arg, 0), max(row0_arg, 0), max(q0_arg, 0)
        R, S, P = max(R_arg, 1), max(S_arg, 1), max(P_arg, 1)
        stride_h, stride_w = max(stride_h_arg, 1), max(stride_w_arg, 1)
        dil_h, dil_w = max(dil_h_arg, 1), max(dil_w_arg, 1)
        kk = nd.get_global_id(0)
        row = nd.get_global_id(1)
        if kk < kc and row < nrows:
            tap = pc + kk
            c = tap // (R * S)
            rs = tap - c * (R * S)
            r = rs // S
            s = rs - r * S
            n = (row0 + row) // P
            h = ((row0 + row) - n * P) * stride_h + r * dil_h
            w0 = q0 * stride_w + s * dil_w
            for q in range(ncols):
                panel[kk, row * ncols + q] = x[n, c0 + c, h, w0 + q * stride_w]

    return pack_b_from_image


@functools.lru_cache(maxsize=None)
def gemm_packed_kernel(MR: int, dtype: str):
    """The micro-kernel: an ``MR x 1`` tile of C per work-item over packed ``Ac`` and ``Bc``."""
    mods = runtime.load()
    dpex, kapi = mods.dpex, mods.kapi
    acc_type = element_type(dtype)
    fma = fused_multiply_add()

    @dpex.kernel
    def gemm_packed(
        nd: kapi.NdItem,
        a_panels,  # IN  (groups, Kg_padded // MR, Kgemm, MR): packed filters
        b_panel,  # IN  (KC, NC): packed image panel
        bias,  # IN  (K,)
        y,  # INOUT (N, K, PQ): C; read back when first == 0
        g_arg, pc_arg, n0_arg, pq0_arg, kc, nc, Kg_arg, single_image, first,
    ):
        # Clamped: provably positive indices and divisors (see pack_b_from_image).
        g, pc, n0, pq0, Kg = max(g_arg, 0), max(pc_arg, 0), max(n0_arg, 0), max(pq0_arg, 0), max(Kg_arg, 1)
        PQ = max(y.shape[2], 1)
        micro_panel = nd.get_global_id(0)
        j = nd.get_global_id(1)
        m0 = micro_panel * MR
        k0 = g * Kg + m0
        if micro_panel < a_panels.shape[1] and j < nc:
            # Where column j of C lives in y. Within one image it is pq0 + j, contiguous across
            # work-items (vector loads and stores); a panel of several small images divides.
            n = n0
            pq = pq0 + j
            if not single_image:
                n = n0 + j // PQ
                pq = j - (n - n0) * PQ
            acc = kapi.PrivateArray(MR, acc_type)
            for i in range(MR):
                acc[i] = 0
                if m0 + i < Kg:
                    acc[i] = bias[k0 + i] if first else y[n, k0 + i, pq]
            for kk in range(kc):
                bv = b_panel[kk, j]
                for i in range(MR):
                    acc[i] = fma(a_panels[g, micro_panel, pc + kk, i], bv, acc[i])
            for i in range(MR):
                if m0 + i < Kg:
                    y[n, k0 + i, pq] = acc[i]

    return gemm_packed


@functools.lru_cache(maxsize=None)
def pack_a_kernel(MR: int):
    """The kernel packing the filters into ``MR``-row micro-panels (zero rows pad ``Kg``)."""
    mods = runtime.load()
    dpex, kapi = mods.dpex, mods.kapi

    @dpex.kernel
    def pack_a_micro_panels(
        nd: kapi.NdItem,
        filters,  # IN  (K, Kgemm): filter k flattened over (c, r, s)
        a_panels,  # OUT (groups, Kg_padded // MR, Kgemm, MR)
        Kg_arg,
    ):
        Kg = max(Kg_arg, 1)  # provably positive (see pack_b_from_image)
        panels = max(a_panels.shape[1], 1)
        group_panel = nd.get_global_id(0)
        k = nd.get_global_id(1)
        if group_panel < a_panels.shape[0] * panels and k < filters.shape[1]:
            g = group_panel // panels
            panel = group_panel - g * panels
            for i in range(MR):
                m = panel * MR + i
                a_panels[g, panel, k, i] = filters[g * Kg + min(m, Kg - 1), k] if m < Kg else 0

    return pack_a_micro_panels


def pack_a_panels(problem: ConvProblem, w, MR: int, queue):
    """Filters as ``(groups, ceil(Kg/MR), Kgemm, MR)`` micro-panels, zero rows padding ``Kg``.

    One kernel (dpctl.tensor's zeros + copy + permute took 49 ms for ResNet's 512x512x3x3
    filters, 20x longer); the result is as large as ``w``.
    """
    dpt = runtime.load().dpt
    p = problem
    Kg, Kgemm = p.K_per_group, p.gemm_k
    panels = -(-Kg // MR)
    a_panels = device_empty((p.groups, panels, Kgemm, MR), p.dtype, queue)
    blk = blocking_for(queue.sycl_device, p.dtype)
    launch(
        pack_a_kernel(MR), (p.groups * panels, Kgemm), (1, blk.gemm_wg), queue,
        dpt.reshape(w, (p.K, Kgemm)), a_panels, Kg,
    )
    return a_panels


def panel_plan(problem: ConvProblem, blk) -> tuple[list, int, int]:
    """``(panels, widest, KC)``: the ``jc`` blocks (:func:`panel_blocks`), the widest one's columns
    and the depth of a packed B panel.

    Bc holds ``blis_kc * blis_nc`` values; panels narrower than NC (small images) take a deeper
    KC instead, so y is read back fewer times (ResNet's 7x7 layer: 1 pass instead of 9).
    """
    NC = min(blk.blis_nc, max(problem.gemm_n, 1))
    panels = list(panel_blocks(problem, NC))
    widest = max(nrows * ncols for _, _, nrows, ncols in panels)
    KC = min(problem.gemm_k, max(blk.blis_kc, blk.blis_kc * blk.blis_nc // widest))
    return panels, widest, KC


def workspace_bytes(problem: ConvProblem, device=None) -> int:
    """``Ac`` (the filters, padded to whole micro-panels), one ``Bc`` panel and the zero-padded
    copy of ``x`` (when padded), on ``device`` (a queue; None: a CPU device's table)."""
    p = problem
    blk = blocking_for(None if device is None else device.sycl_device, p.dtype)
    MR = blk.gemm_mb
    _, widest, KC = panel_plan(p, blk)
    a_panels = p.groups * -(-p.K_per_group // MR) * MR * p.gemm_k
    return (a_panels + KC * widest) * p.itemsize + padded_input_bytes(p)


def run(problem: ConvProblem, x, w, bias, device):
    """Convolve with the packed BLIS GEMM on ``device`` (a ``dpctl.SyclQueue``).

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
    dpt = runtime.load().dpt
    blk = blocking_for(device.sycl_device, p.dtype)
    MR = blk.gemm_mb
    Kg, Kgemm, PQ = p.K_per_group, p.gemm_k, p.P * p.Q
    panels, widest, KC = panel_plan(p, blk)
    y = device_empty(p.y_shape, p.dtype, device, result=True)
    y3 = dpt.reshape(y, (p.N, p.K, PQ))
    x_padded = zero_padded_input(p, x)
    a_panels = pack_a_panels(p, w, MR, device)
    b_panel = device_empty((KC, widest), p.dtype, device)
    bias_full = bias_or_zeros(p, bias, device)
    pack_b = pack_b_kernel()
    micro = gemm_packed_kernel(MR, p.dtype)
    micro_panels = a_panels.shape[1]
    for g in range(p.groups):
        for row0, q0, nrows, ncols in panels:
            n0, pq0 = row0 // p.P, (row0 % p.P) * p.Q + q0
            single_image = nrows <= p.P
            for pc in range(0, Kgemm, KC):
                kc = min(KC, Kgemm - pc)
                launch(
                    pack_b, (kc, nrows), (1, blk.pack_wg), device,
                    x_padded, b_panel, g * p.C_per_group, pc, row0, q0, kc, nrows, ncols,
                    p.R, p.S, p.P, p.stride[0], p.stride[1], p.dilation[0], p.dilation[1],
                )
                launch(
                    micro, (micro_panels, nrows * ncols), (min(blk.blis_mc, micro_panels), blk.gemm_wg), device,
                    a_panels, b_panel, bias_full, y3, g, pc, n0, pq0, kc, nrows * ncols, Kg,
                    1 if single_image else 0, 1 if pc == 0 else 0,
                )
    return y


def panel_blocks(problem: ConvProblem, NC: int):
    """The ``jc`` loop: ``(row0, q0, nrows, ncols)`` of each B panel of at most ``NC`` columns.

    ``row0`` counts output rows over the batch (``n * P + p``). A panel is a segment of one
    output row when ``Q > NC``; else whole rows of one image when ``P * Q > NC``; else whole
    images. Panels inside one image keep y's columns contiguous for the micro-kernel.
    """
    N, P, Q = problem.N, problem.P, problem.Q
    if Q > NC:
        for row in range(N * P):
            for q0 in range(0, Q, NC):
                yield row, q0, 1, min(NC, Q - q0)
    elif P * Q > NC:
        rows = NC // Q
        for n in range(N):
            for p0 in range(0, P, rows):
                yield n * P + p0, 0, min(rows, P - p0), Q
    else:
        images = NC // (P * Q)
        for n0 in range(0, N, images):
            yield n0 * P, 0, min(images, N - n0) * P, Q
