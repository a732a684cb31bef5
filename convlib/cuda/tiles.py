"""Which tile a CUDA launch uses: :func:`choose_gemm_tile` and :func:`choose_direct_tile`, from
the knobs of :data:`convlib.cuda.tables.KNOBS`."""

from __future__ import annotations

from .tables import KNOBS, SHARED_MEMORY_LIMIT, DirectTile, GemmTile, MmaTile


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def choose_gemm_tile(problem, multiprocessors: int, simulator: bool = False, ngemm: int | None = None) -> GemmTile:
    """The GEMM tile for ``problem`` on a GPU with ``multiprocessors`` SMs.

    Parameters
    ----------
    problem : ConvProblem
    multiprocessors : int
        Streaming multiprocessors of the device (the simulator passes 1).
    simulator : bool
        Use the ``simulator_gemm_tiles`` knob.
    ngemm : int, optional
        Columns of C per launch (im2col launches once per batch chunk); default ``problem.gemm_n``.
    """
    if KNOBS.gemm_tile is not None:
        return KNOBS.gemm_tile.check()
    tiles = KNOBS.simulator_gemm_tiles if simulator else KNOBS.lookup("gemm_tiles", problem.dtype)
    return _preferred(tiles, problem, multiprocessors, problem.gemm_n if ngemm is None else ngemm)


def choose_mma_tile(problem, precision: str, multiprocessors: int, simulator: bool = False,
                    copies: bool = False) -> MmaTile:
    """The tensor-core tile for ``problem`` in ``precision`` (``"tf32"``, ``"float16"``,
    ``"bfloat16"``), by the rule of :func:`choose_gemm_tile` among the tiles its kernel runs as
    listed: those of 3 or more stages only where the kernel copies its chunks by ``cp.async``
    (``copies``: :func:`convlib.cuda.tensor_gemm.copies_chunks`)."""
    if KNOBS.mma_tile is not None:
        return KNOBS.mma_tile.check()
    tiles = KNOBS.simulator_mma_tiles if simulator else KNOBS.lookup("mma_tiles", precision)
    tiles = [t for t in tiles if copies or t.stages == 2]
    return _preferred(tiles, problem, multiprocessors, problem.gemm_n)


def _preferred(tiles, problem, multiprocessors: int, n: int):
    """The first of ``tiles`` whose BM fits M (rounded up to 16) and that gives every SM two
    blocks, else the fitting tile with the most blocks."""
    m = _round_up(problem.gemm_m, 16)
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
    tile = KNOBS.direct_tile or (
        KNOBS.simulator_direct_tile if simulator else KNOBS.lookup("direct_tiles", problem.dtype))
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
