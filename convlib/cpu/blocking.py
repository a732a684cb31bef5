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
        last tile with zeros). ``kc`` is the step of the ``pc`` loop: the reduction length cut into
        equal blocks of at most KC (576 = 2 x 288, not 384 + 192), so no block is so short that
        the micro-kernel's load and store of its tile dominates it.
        """
        mc = min(self.MC, _round_up(problem.gemm_m, self.MR))
        blocks = -(-problem.gemm_k // self.KC)
        kc = -(-problem.gemm_k // blocks)
        nc = min(self.NC, _round_up(max(problem.gemm_n, 1), self.NR))
        return mc, kc, nc

    def workspace_bytes(self, problem, threads: int | None = None) -> int:
        """Bytes of the packed panels for ``problem``: O(MC*KC + KC*NC), whatever N, H, W are.

        Every thread owns an ``Ac`` (mc x kc), a ``Bc`` (kc x nc, plus :data:`VECTOR_SLACK_BYTES`),
        an MR x NR edge tile and two int64 tables for the packing of B, kc x 7 (taps) and NR x 4
        (pixel runs); see :mod:`convlib.cpu.blis` for why the threads share nothing. ``threads``
        defaults to ``numba.get_num_threads()``, the count :func:`convlib.cpu.blis.conv2d`
        allocates for.
        """
        if threads is None:
            from numba import get_num_threads

            threads = get_num_threads()
        mc, kc, nc = self.panel_sizes(problem)
        per_thread = (mc * kc + kc * nc + self.MR * self.NR) * problem.itemsize
        per_thread += VECTOR_SLACK_BYTES + (kc * 7 + self.NR * 4) * 8
        return threads * per_thread


#: Bytes of slack after each thread's ``Bc``: the packing's whole-vector writes may run one
#: 32-byte vector past the last panel.
VECTOR_SLACK_BYTES = 32


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


#: Block sizes per (instruction set, dtype), like BLIS's per-target configurations. The register
#: tile fills about three quarters of the vector registers with accumulators: 6 rows x 4 zmm for
#: AVX-512 (32 registers), 6 rows x 2 ymm for AVX2 (16 registers, as BLIS's Haswell kernels).
#: float64 halves NR (same bytes per vector register row).
BLIS_BLOCKING = {
    ("avx512", "float32"): BlisBlocking(MC=96, KC=384, NC=1024, MR=6, NR=64),
    ("avx512", "float64"): BlisBlocking(MC=96, KC=256, NC=1024, MR=6, NR=32),
    ("avx2", "float32"): BlisBlocking(MC=96, KC=384, NC=1024, MR=3, NR=32),
    ("avx2", "float64"): BlisBlocking(MC=96, KC=256, NC=512, MR=3, NR=16),
}


def host_isa() -> str:
    """``"avx512"`` when the CPU numba compiles for has AVX-512F, else ``"avx2"``.

    Follows ``NUMBA_CPU_FEATURES`` when it is set (as numba does), else the host's features as
    LLVM sees them (a virtual machine may hide AVX-512 from a CPU that has it).
    """
    from numba.core import config

    features = config.CPU_FEATURES
    if not features:
        import llvmlite.binding as llvm

        features = llvm.get_host_cpu_features().flatten()
    return "avx512" if "+avx512f" in features.split(",") else "avx2"


def blis_blocking(dtype: str, isa: str | None = None) -> BlisBlocking:
    """The :class:`BlisBlocking` for ``dtype`` (``"float32"`` or ``"float64"``) on ``isa``
    (``"avx512"`` or ``"avx2"``; default: :func:`host_isa`)."""
    return BLIS_BLOCKING[(isa or _host_isa_cached()), dtype]


_HOST_ISA = []


def _host_isa_cached() -> str:
    if not _HOST_ISA:
        _HOST_ISA.append(host_isa())
    return _HOST_ISA[0]
