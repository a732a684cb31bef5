"""The backward data pass by the BLIS five-loop GEMM (numba, CPU): ``blis``.

Per group ``g`` the column matrix of ``dx`` is a GEMM, ``Cols_g (Cg*R*S x N*P*Q) = W_g^T
(Cg*R*S x Kg) @ dY_g (Kg x N*P*Q)``: row ``(c, r, s)`` and column ``(n, p, q)`` of it is what tap
``(r, s)`` of output pixel ``(n, p, q)`` sends back to input channel ``c``, at the position the
forward convolution read, ``(p*sh - top + r*dh, q*sw - left + s*dw)``. The column matrix is never
built. The loops are those of :mod:`convlib.cpu.blis` with its micro-kernel
(:mod:`convlib.cpu.micro_kernels`):

* ``B = dY_g`` is packed by the plain-GEMM packer (:func:`~convlib.cpu.packing.pack_b_pointwise`:
  ``dy``'s channels are the rows, its pixels the columns, as a 1x1 layer's image);
* ``A = W_g^T`` by :func:`pack_a_transposed`: the ``MR`` values of one reduction step (``MR``
  consecutive taps ``(c, r, s)`` of one filter) are contiguous in ``w``;
* the micro-kernel's ``MR x NR`` tile goes to a per-thread buffer, and :func:`add_tile_to_image`
  adds it into ``dx``: col2im folded into the store, row by row of the tile and in runs of one
  output row of pixels, each run a strided (stride 1: contiguous) add into one input row.

``dx`` starts as the bias (``conv_transpose2d``) or zero. Two threads add into the same ``dx``
element only if they hold taps of the same input channel and pixels of the same image, so each
thread owns a rectangle of whole channels by whole images (:func:`thread_grid`): no atomics, no
per-thread copy of ``dx``. Workspace: per thread ``Ac`` (mc x kc), ``Bc`` (kc x nc) and one
``MR x NR`` tile, whatever N, H and W are.

Compile cost: one driver per register tile ``MR x NR`` and dtype, cached on disk; block sizes and
shapes are run-time values.
"""

from __future__ import annotations

import functools
from collections import namedtuple

import numpy as np
from numba import njit, prange

from ..core.problem import ConvProblem
from .blis import geometry_of, partitions
from .im2col_backward import fill_channels
from .micro_kernels import STORE, micro_kernel
from .packing import pack_b_pointwise
from .tables import VECTOR_SLACK_BYTES, blis_blocking

#: The GEMM the blocking is sized for (``BlisBlocking.panel_sizes`` reads these fields).
GemmShape = namedtuple("GemmShape", "gemm_m gemm_k gemm_n itemsize")


def gemm_shape(problem: ConvProblem) -> GemmShape:
    """The per-group GEMM of the backward data pass: ``Cg*R*S`` rows, reduction ``Kg``,
    ``N*P*Q`` columns."""
    return GemmShape(problem.C_per_group * problem.R * problem.S, problem.K_per_group,
                     problem.N * problem.P * problem.Q, problem.itemsize)


@njit(cache=True, inline="always")
def pack_a_transposed(w, first_filter, row0, mc, kc, taps, Ac, MR):
    """Pack rows ``row0 .. row0+mc`` (taps ``(c, r, s)``) and reduction steps ``first_filter ..
    + kc`` (filters) of ``W^T`` into ``Ac`` (panels of ``kc x MR``, as the micro-kernel reads
    them): ``Ac[ip*MR*kc + p*MR + i] = w[(first_filter + p)*taps + row0 + ip*MR + i]``, zero for
    rows past ``mc``."""
    for ip in range((mc + MR - 1) // MR):
        panel = ip * MR * kc
        rows = min(MR, mc - ip * MR)
        for p in range(kc):
            src = (first_filter + p) * taps + row0 + ip * MR
            dst = panel + p * MR
            for i in range(rows):
                Ac[dst + i] = w[src + i]
            for i in range(rows, MR):
                Ac[dst + i] = 0


@njit(cache=True, inline="always")
def add_tile_to_image(tile, NR, geo, channel0, row0, mr, col0, nr, dx):
    """col2im of one tile: ``tile[i*NR + j]`` (tap ``row0 + i`` of the group whose first input
    channel is ``channel0``, pixel ``col0 + j``) is added to ``dx`` (flat NCHW) at the input
    position that tap read for that pixel; taps that read padding send nothing."""
    H, W, P, Q = geo.height, geo.width, geo.out_h, geo.out_w
    R, S = geo.filter_h, geo.filter_w
    sh, sw = geo.stride_h, geo.stride_w
    RS = R * S
    PQ = P * Q
    C = geo.channels
    n = col0 // PQ
    pq = col0 - n * PQ
    p = pq // Q
    q0 = pq - p * Q
    done = 0
    while done < nr:  # runs of pixels in one output row
        run = min(nr - done, Q - q0)
        for i in range(mr):
            row = row0 + i
            c = row // RS
            r = (row - c * RS) // S
            s = row - c * RS - r * S
            h = p * sh - geo.pad_top + r * geo.dil_h
            if h < 0 or h >= H:
                continue
            off = s * geo.dil_w - geo.pad_left
            # Pixels q of the run whose input column q*sw + off lies inside [0, W).
            q_lo = max(q0, (-off + sw - 1) // sw)
            q_hi = min(q0 + run, (W - 1 - off) // sw + 1)
            base = ((n * C + channel0 + c) * H + h) * W + off
            src = i * NR + done - q0
            for q in range(q_lo, q_hi):
                dx[base + q * sw] += tile[src + q]
        done += run
        q0 = 0
        p += 1
        if p == P:
            p = 0
            n += 1


@functools.lru_cache(maxsize=None)
def backward_data_kernel(MR: int, NR: int):
    """The jitted driver for one register tile (any block sizes, dtype and shape)."""

    @njit(parallel=True, cache=True)
    def blis_backward_data(
        dy,  # IN  (N*K*P*Q,) flat NCHW
        w,  # IN  (K*Cg*R*S,) flat
        geo,  # IN  the forward ConvGeometry
        MC, NC, kc_step,  # block sizes (BlisBlocking.panel_sizes of gemm_shape)
        m_parts, n_parts,  # the threads' grid: whole channels x whole images
        Ac_ws, Bc_ws, tile_ws,  # SCRATCH per thread
        dx,  # INOUT (N*C*H*W,) flat NCHW, holding the bias or zero
    ):
        RS = geo.filter_h * geo.filter_w
        Cg = geo.channels // geo.groups
        Kg = geo.gemm_m
        taps = geo.gemm_k  # Cg*R*S: the rows of W^T
        PQ = geo.out_h * geo.out_w
        image = geo.out_channels * PQ
        for t in prange(Ac_ws.shape[0]):
            Ac, Bc, tile = Ac_ws[t], Bc_ws[t], tile_ws[t]
            mp, np_ = t // n_parts, t % n_parts
            m_lo = Cg * mp // m_parts * RS
            m_hi = Cg * (mp + 1) // m_parts * RS
            n_lo = geo.batch * np_ // n_parts * PQ
            n_hi = geo.batch * (np_ + 1) // n_parts * PQ
            for g in range(geo.groups):
                for jc in range(n_lo, n_hi, NC):
                    nc = min(NC, n_hi - jc)
                    for pc in range(0, Kg, kc_step):
                        kc = min(kc_step, Kg - pc)
                        pack_b_pointwise(dy, image, PQ, g * Kg + pc, jc, nc, kc, NR, Bc)
                        for ic in range(m_lo, m_hi, MC):
                            mc = min(MC, m_hi - ic)
                            pack_a_transposed(w, g * Kg + pc, ic, mc, kc, taps, Ac, MR)
                            for jr in range(0, nc, NR):
                                nr = min(NR, nc - jr)
                                for ir in range(0, mc, MR):
                                    mr = min(MR, mc - ir)
                                    micro_kernel(kc, Ac, ir * kc, Bc, jr * kc, tile, 0, NR, STORE, tile, 0,
                                                 MR, NR)
                                    add_tile_to_image(tile, NR, geo, g * Cg, ic + ir, mr, jc + jr, nr, dx)

    return blis_backward_data


def thread_grid(problem: ConvProblem, threads: int) -> tuple[int, int]:
    """``(m_parts, n_parts)``: images split among as many threads as divide evenly (each thread
    then packs only its own pixels), the rest split the channels of every group."""
    n_parts = max(d for d in range(1, threads + 1) if threads % d == 0 and d <= max(problem.N, 1))
    return threads // n_parts, n_parts


class _BlisData:
    """The implementation contract of the blis backward data pass (see the module docstring)."""

    def supports(self, problem: ConvProblem) -> str | None:
        """blis serves every valid problem."""
        return None

    def workspace_bytes(self, problem: ConvProblem, device=None) -> int:
        """Bytes of the packed panels: O(MC*KC + KC*NC) per thread, independent of N, H, W."""
        b = blis_blocking(problem.dtype)
        mc, kc, nc = b.panel_sizes(gemm_shape(problem))
        per_thread = (mc * kc + kc * nc + b.MR * b.NR) * problem.itemsize + VECTOR_SLACK_BYTES
        return partitions() * per_thread

    def run(self, problem: ConvProblem, dy, w, bias, device=None):
        p = problem
        dtype = np.dtype(p.dtype)
        b = blis_blocking(p.dtype)
        threads = partitions()
        mc, kc, nc = b.panel_sizes(gemm_shape(p))
        Ac_ws = np.empty((threads, mc * kc), dtype)
        Bc_ws = np.empty((threads, kc * nc + VECTOR_SLACK_BYTES // dtype.itemsize), dtype)
        tile_ws = np.empty((threads, b.MR * b.NR), dtype)
        m_parts, n_parts = thread_grid(p, threads)
        dx = np.empty(p.x_shape, dtype)
        has_bias = bias is not None
        fill_channels(dx, bias if has_bias else np.zeros(1, dtype), has_bias)
        backward_data_kernel(b.MR, b.NR)(
            dy.reshape(-1), w.reshape(-1), geometry_of(p), b.MC, b.NC, kc, m_parts, n_parts,
            Ac_ws, Bc_ws, tile_ws, dx.reshape(-1))
        return dx


#: ``conv2d_backward_data`` (and ``conv_transpose2d``) by the BLIS GEMM with col2im in its store.
DATA = _BlisData()
