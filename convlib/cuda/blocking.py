"""Block sizes of the CUDA kernels, as data.

Nothing here imports numba: the tables are plain values, so docs, tests and the selector can read
them without a GPU. Each kernel factory receives one row and turns its fields into compile-time
constants.

GEMM tiles (``im2col``'s own GEMM and ``blis``' implicit GEMM) partition ``C = A @ B`` with A the
``M x Kgemm`` filter matrix of one group and B the ``Kgemm x Ngemm`` (explicit or implicit) column
matrix:

======  ===========================================================================================
``BM``  rows of C (output channels) per thread block; the block's A tile is ``BK x BM`` in shared
``BN``  columns of C (output pixels of the batch) per thread block; its B tile is ``BK x BN``
``BK``  depth (``c, r, s`` taps) of one shared-memory stage; two stages alternate (double buffer)
``TM``  rows of the register tile each thread accumulates
``TN``  columns of that register tile
======  ===========================================================================================

A block runs ``(BM // TM) * (BN // TN)`` threads; each loads ``BM*BK/threads`` elements of A and
``BK*BN/threads`` of B per stage, so both must divide evenly, and ``threads % BN == 0`` keeps every
thread on one column of B (one pixel decode per thread for the whole reduction).

Direct tiles (``direct``): a block computes ``TH x TW`` output pixels of one image for ``KB``
output channels of one group; it stages ``CB`` input channels at a time (their tile plus halo) and
the matching ``KB x CB x R x S`` filters in shared memory. Each thread keeps ``KB x RPT x JPT``
accumulators: ``RPT`` consecutive output rows times ``JPT`` columns ``TW / JPT`` apart (so a warp
reads consecutive shared words and writes consecutive output words).

The simulator (``NUMBA_ENABLE_CUDASIM=1``) runs each thread as a Python thread, so it gets tiny
blocks of its own; they exercise the same code paths (several blocks, several stages, edges).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

#: Static shared memory a numba-cuda kernel may declare (bytes), without the dynamic opt-in.
SHARED_MEMORY_LIMIT = 48 * 1024


@dataclass(frozen=True)
class GemmTile:
    """One GEMM tile shape (see the module docstring for the names)."""

    BM: int
    BN: int
    BK: int
    TM: int
    TN: int

    @property
    def threads(self) -> int:
        return (self.BM // self.TM) * (self.BN // self.TN)

    @property
    def a_per_thread(self) -> int:
        return self.BM * self.BK // self.threads

    @property
    def b_per_thread(self) -> int:
        return self.BK * self.BN // self.threads

    def shared_bytes(self, itemsize: int) -> int:
        return 2 * self.BK * (self.BM + self.BN) * itemsize

    def check(self) -> "GemmTile":
        """Raise ``ValueError`` unless the tile's loads divide evenly among its threads."""
        t = self.threads
        ok = (
            self.BM % self.TM == 0 and self.BN % self.TN == 0
            and (self.BM * self.BK) % t == 0 and (self.BK * self.BN) % t == 0
            and t % self.BN == 0 and self.BK % (t // self.BN) == 0
            and t % self.BK == 0
        )
        if not ok:
            raise ValueError(f"{self}: loads do not divide evenly among {t} threads")
        return self


@dataclass(frozen=True)
class DirectTile:
    """One direct-convolution tile shape (see the module docstring for the names)."""

    TH: int
    TW: int
    RPT: int
    JPT: int
    KB: int
    CB: int

    @property
    def threads(self) -> int:
        return (self.TH // self.RPT) * (self.TW // self.JPT)

    def input_tile(self, problem) -> tuple[int, int]:
        """Rows and columns of the input tile (with halo) one block stages per channel."""
        sh, sw = problem.stride
        dh, dw = problem.dilation
        return (self.TH - 1) * sh + (problem.R - 1) * dh + 1, (self.TW - 1) * sw + (problem.S - 1) * dw + 1

    def shared_bytes(self, problem) -> int:
        rows, cols = self.input_tile(problem)
        kb = min(self.KB, problem.K_per_group)
        cb = min(self.CB, problem.C_per_group)
        return (cb * rows * cols + kb * cb * problem.R * problem.S) * problem.itemsize


#: GEMM tiles per dtype, in order of preference. The selector takes the first whose BM fits M
#: (rounded up to 16) and that gives every SM two blocks, else the fitting tile with the most
#: blocks. 64x128 (128 threads, 8x8 each) beat 128x128 and 128x64 on 5 of 6 ResNet-50 layers at
#: batch 128 on an H200 (docs/gpu.md, tile sweep); 128x128 won only on the strided 3x3.
GEMM_TILES = {
    "float32": (
        GemmTile(BM=64, BN=128, BK=8, TM=8, TN=8),
        GemmTile(BM=128, BN=64, BK=8, TM=8, TN=8),
        GemmTile(BM=64, BN=64, BK=8, TM=4, TN=8),
        GemmTile(BM=32, BN=128, BK=8, TM=4, TN=8),
        GemmTile(BM=16, BN=128, BK=8, TM=2, TN=8),
        GemmTile(BM=128, BN=128, BK=8, TM=8, TN=8),
    ),
    "float64": (
        GemmTile(BM=64, BN=64, BK=8, TM=4, TN=4),
        GemmTile(BM=32, BN=64, BK=8, TM=4, TN=4),
        GemmTile(BM=64, BN=32, BK=8, TM=4, TN=4),
        GemmTile(BM=16, BN=64, BK=8, TM=2, TN=4),
    ),
}

#: Direct tiles per dtype. For float32, 8x256 outputs of 4 channels with 1x8 per thread ran the
#: seed shape (N=8, C=K=4, 1024x1024, 3x3) fastest of eight tiles on an H200 (docs/gpu.md).
DIRECT_TILES = {
    "float32": DirectTile(TH=8, TW=256, RPT=1, JPT=8, KB=4, CB=4),
    "float64": DirectTile(TH=16, TW=64, RPT=2, JPT=2, KB=4, CB=4),
}

#: Tiny blocks for the CUDA simulator: many blocks and stages on tiny problems.
SIMULATOR_GEMM_TILES = (GemmTile(BM=4, BN=8, BK=4, TM=2, TN=2),)
SIMULATOR_DIRECT_TILE = DirectTile(TH=4, TW=4, RPT=2, JPT=2, KB=2, CB=2)

#: Threads per block of the elementwise kernels (im2col, bias, strided copies).
ELEMENTWISE_THREADS = 256
SIMULATOR_ELEMENTWISE_THREADS = 8


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


_forced: dict = {}


def forced_key() -> tuple:
    """The tiles :func:`forced_tiles` imposes now, as a hashable key for cached launch plans."""
    return tuple(sorted(_forced.items()))


@contextlib.contextmanager
def forced_tiles(gemm: GemmTile | None = None, direct: DirectTile | None = None):
    """Within the block, every GEMM / direct launch uses these tiles (tile sweeps in benchmarks).

    A forced direct tile still shrinks to fit shared memory.
    """
    previous = dict(_forced)
    _forced.update({k: v for k, v in (("gemm", gemm), ("direct", direct)) if v is not None})
    try:
        yield
    finally:
        _forced.clear()
        _forced.update(previous)


def choose_gemm_tile(problem, multiprocessors: int, simulator: bool = False, ngemm: int | None = None) -> GemmTile:
    """The GEMM tile for ``problem`` on a GPU with ``multiprocessors`` SMs.

    Parameters
    ----------
    problem : ConvProblem
    multiprocessors : int
        Streaming multiprocessors of the device (the simulator passes 1).
    simulator : bool
        Use :data:`SIMULATOR_GEMM_TILES`.
    ngemm : int, optional
        Columns of C per launch (im2col launches once per batch chunk); default ``problem.gemm_n``.
    """
    if "gemm" in _forced:
        return _forced["gemm"].check()
    tiles = SIMULATOR_GEMM_TILES if simulator else GEMM_TILES[problem.dtype]
    m = _round_up(problem.gemm_m, 16)
    n = problem.gemm_n if ngemm is None else ngemm
    fitting = [t for t in tiles if t.BM <= m] or [min(tiles, key=lambda t: t.BM)]

    def blocks(tile):
        return -(-problem.gemm_m // tile.BM) * -(-n // tile.BN) * problem.groups

    # Two blocks per SM keep the FMA pipes busy while the other block waits on its loads.
    enough = [t for t in fitting if blocks(t) >= 2 * multiprocessors]
    return (enough[0] if enough else max(fitting, key=blocks)).check()


def choose_direct_tile(problem, simulator: bool = False) -> DirectTile | None:
    """The direct tile for ``problem``, shrunk until its shared memory fits; None if none fits.

    Large dilations make the halo outgrow shared memory even for one output row; the direct module
    then falls back on a kernel that reads the input through the cache instead.
    """
    tile = _forced.get("direct") or (SIMULATOR_DIRECT_TILE if simulator else DIRECT_TILES[problem.dtype])
    while tile.shared_bytes(problem) > SHARED_MEMORY_LIMIT:
        th, tw, rpt, jpt, kb, cb = tile.TH, tile.TW, tile.RPT, tile.JPT, tile.KB, tile.CB
        if cb > 1:
            cb //= 2
        elif kb > 1:
            kb //= 2
        elif th > rpt:
            th //= 2
        elif tw > jpt * (1 if simulator else 32):
            tw //= 2
        elif rpt > 1:
            th, rpt = th // 2, rpt // 2
        else:
            return None
        tile = DirectTile(th, tw, rpt, jpt, kb, cb)
    return tile
