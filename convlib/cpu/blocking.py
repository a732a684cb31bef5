"""Block sizes of the BLIS GEMM, as data.

The five loops of BLIS (Van Zee & van de Geijn, 2015) partition C = A @ B, with A the
``M x Kgemm`` filter matrix of one group and B the ``Kgemm x Ngemm`` (implicit) im2col matrix:

========  =====================================================================================
``NC``    columns of B (output pixels) per outer ``jc`` block; the packed ``Bc`` panel is KC x NC
``KC``    depth (``c, r, s`` taps) per ``pc`` block; ``Bc`` and ``Ac`` share it
``MC``    rows of A (output channels) per ``ic`` block; the packed ``Ac`` panel is MC x KC
``MR``    rows of the register tile the micro-kernel keeps in accumulators
``NR``    columns of that register tile; a multiple of the SIMD width
========  =====================================================================================

``Ac`` (MC x KC) is meant to stay in L2 and a KC x MR sliver of it in L1 while the micro-kernel
streams KC x NR slivers of ``Bc`` (KC x NC) from L2. MR x NR sets the register tile: MR*NR/16
zmm accumulators for float32 (24 of the 32 for 6x64), NR/16 vector loads and MR broadcasts per
reduction step. The values below were measured on the development machine (Zen 5, AVX-512,
48 KB L1d and 1 MB L2 per core, 2 threads); see the report in ``convlib/cpu/blis.py``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlisBlocking:
    """One row of the block-size table (see the module docstring for the names).

    ``MC`` must be a multiple of ``MR`` and ``NC`` a multiple of ``NR``, so that every packed
    panel is a whole number of register tiles.
    """

    MC: int
    KC: int
    NC: int
    MR: int
    NR: int

    def __post_init__(self):
        if self.MC % self.MR or self.NC % self.NR:
            raise ValueError(f"{self}: MC must be a multiple of MR and NC a multiple of NR")

    def panel_sizes(self, problem) -> tuple[int, int, int]:
        """``(mc, kc, nc)``: the block sizes clipped to ``problem``, as the panels are allocated.

        ``mc`` and ``nc`` are rounded up to whole register tiles (the packing routines pad the
        last tile with zeros), ``kc`` is at most the reduction length.
        """
        mc = min(self.MC, _round_up(problem.gemm_m, self.MR))
        kc = min(self.KC, problem.gemm_k)
        nc = min(self.NC, _round_up(max(problem.gemm_n, 1), self.NR))
        return mc, kc, nc

    def workspace_bytes(self, problem, threads: int | None = None) -> int:
        """Bytes of the packed panels for ``problem``: O(MC*KC + KC*NC), whatever N, H, W are.

        Every thread owns an ``Ac`` (mc x kc), a ``Bc`` (kc x nc) and an MR x NR edge tile (see
        :mod:`convlib.cpu.blis` for why the threads share nothing). ``threads`` defaults to
        ``numba.get_num_threads()``, the count :func:`convlib.cpu.blis.conv2d` allocates for.
        """
        if threads is None:
            from numba import get_num_threads

            threads = get_num_threads()
        mc, kc, nc = self.panel_sizes(problem)
        return threads * (mc * kc + kc * nc + self.MR * self.NR) * problem.itemsize


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


#: Block sizes per dtype. float64 halves NR (same bytes per vector register row).
BLIS_BLOCKING = {
    "float32": BlisBlocking(MC=96, KC=384, NC=512, MR=6, NR=64),
    "float64": BlisBlocking(MC=96, KC=256, NC=512, MR=6, NR=32),
}


def blis_blocking(dtype: str) -> BlisBlocking:
    """The :class:`BlisBlocking` for ``dtype`` (``"float32"`` or ``"float64"``)."""
    return BLIS_BLOCKING[dtype]
