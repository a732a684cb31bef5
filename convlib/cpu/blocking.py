"""Block sizes of the BLIS GEMM, as data.

The five loops of BLIS (Van Zee & van de Geijn, 2015) partition C = A @ B, with A the
``M x Kg`` filter matrix and B the ``Kg x Ngemm`` (implicit) im2col matrix:

========  =====================================================================================
``NC``    columns of B (output pixels) per outer ``jc`` block; the packed ``Bc`` panel is KC x NC
``KC``    depth (``c, r, s`` taps) per ``pc`` block; ``Bc`` and ``Ac`` share it
``MC``    rows of A (output channels) per ``ic`` block; the packed ``Ac`` panel is MC x KC
``MR``    rows of the register tile the micro-kernel keeps in accumulators
``NR``    columns of that register tile; a multiple of the SIMD width
========  =====================================================================================

``Ac`` is meant to stay in L2, a KC x NR sliver of ``Bc`` in L1, and ``Bc`` in L2/L3. The values
below were measured on the development machine (Zen 5, 48 KB L1d, 1 MB L2 per core); see
``docs/algorithms.md``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlisBlocking:
    """One row of the block-size table (see the module docstring for the names)."""

    MC: int
    KC: int
    NC: int
    MR: int
    NR: int

    def workspace_bytes(self, problem) -> int:
        """Bytes of the packed panels for ``problem``: O(MC*KC + KC*NC), whatever N, H, W are.

        Each thread packs its own Ac; Bc is shared. Block sizes are clipped to the problem and
        rounded up to whole register tiles, as the packing routines allocate them.
        """
        from numba import get_num_threads

        mc = min(self.MC, _round_up(problem.gemm_m, self.MR))
        kc = min(self.KC, problem.gemm_k)
        nc = min(self.NC, _round_up(max(problem.gemm_n, 1), self.NR))
        isz = problem.itemsize
        return (get_num_threads() * mc * kc + kc * nc) * isz


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


#: Block sizes per dtype. float64 halves NR (same bytes per vector register row).
BLIS_BLOCKING = {
    "float32": BlisBlocking(MC=96, KC=384, NC=3072, MR=6, NR=64),
    "float64": BlisBlocking(MC=96, KC=256, NC=1536, MR=6, NR=32),
}


def blis_blocking(dtype: str) -> BlisBlocking:
    """The :class:`BlisBlocking` for ``dtype`` (``"float32"`` or ``"float64"``)."""
    return BLIS_BLOCKING[dtype]
