"""Which tile a CUDA launch uses: :func:`choose_gemm_tile` and :func:`choose_direct_tile`, from
the knobs of :data:`convlib.cuda.tables.KNOBS`."""

from __future__ import annotations

from .launch import MAX_GRID_Y
from .ptx import ELEMENTS_PER_WORD
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
                    copies: bool = False, splits: bool = False) -> MmaTile:
    """The tensor-core tile for ``problem`` in ``precision`` (``"tf32"``, ``"float16"``,
    ``"bfloat16"``), by the rule of :func:`choose_gemm_tile` among the tiles its kernel runs as
    listed: those of 3 or more stages only where the kernel copies its chunks by ``cp.async``
    (``copies``: :func:`convlib.cuda.tensor_gemm.copies_chunks`). Where the kernel can split
    its reduction (``splits``), a tile's blocks count those of its split
    (:func:`choose_mma_split`): a preferred tile split rather than a smaller one whole."""
    if KNOBS.mma_tile is not None:
        return KNOBS.mma_tile.check()
    tiles = KNOBS.simulator_mma_tiles if simulator else KNOBS.lookup("mma_tiles", precision)
    tiles = [t for t in tiles if copies or t.stages == 2]
    split = (lambda t: choose_mma_split(problem, t, precision, multiprocessors)) if splits else None
    return _preferred(tiles, problem, multiprocessors, problem.gemm_n, split)


def mma_blocks(problem, tile: MmaTile, n: int | None = None) -> int:
    """Blocks of the tensor-core kernel's grid for ``problem`` with ``tile``, without split-K
    (``n`` columns of C: default ``problem.gemm_n``)."""
    n = problem.gemm_n if n is None else n
    return -(-problem.gemm_m // tile.BM) * -(-n // tile.BN) * problem.groups


def reduction_steps(problem, tile: MmaTile, precision: str) -> int:
    """Steps of the channels-last tensor-core kernel's reduction: ``BKW`` words each, over the
    filter taps times the channels of a group in words (two half channels a word)."""
    words = problem.R * problem.S * problem.C_per_group // ELEMENTS_PER_WORD[precision]
    return -(-words // tile.BKW)


def most_mma_parts(problem, tile: MmaTile, precision: str) -> int:
    """The most parts :func:`choose_mma_split` may cut ``problem``'s reduction into with
    ``tile``, whatever the SMs (a bound on split-K's workspace)."""
    steps, limit, forced = _split_bounds(problem, tile, precision)
    return forced or _allowed_parts(steps, limit)[-1]


def _split_bounds(problem, tile: MmaTile, precision: str) -> tuple[int, int, int | None]:
    """``(steps, limit, forced)``: the reduction's steps, the most parts it may be cut into (a
    part keeps a step; the grid's ``groups x parts`` stay within CUDA's limit) and the count
    the ``mma_split`` knob imposes within that limit (None: the rule decides)."""
    steps = reduction_steps(problem, tile, precision)
    limit = max(1, min(steps, MAX_GRID_Y // problem.groups))
    forced = None if KNOBS.mma_split is None else max(1, min(int(KNOBS.mma_split), limit))
    return steps, limit, forced


def _allowed_parts(steps: int, limit: int) -> list[int]:
    """The counts of parts split-K's rule may take: 1, and those up to ``mma_split_max`` (and
    ``limit``) that leave every part ``mma_split_min_steps`` of the ``steps``."""
    return [s for s in range(1, min(KNOBS.mma_split_max, limit) + 1)
            if s == 1 or steps // s >= KNOBS.mma_split_min_steps]


def choose_mma_split(problem, tile: MmaTile, precision: str, multiprocessors: int) -> int:
    """How many parts the channels-last tensor-core kernel cuts its reduction into (split-K;
    1: none), by the knobs ``mma_split*`` of :data:`~convlib.cuda.tables.KNOBS`.

    Only a grid of fewer blocks than one wave (``mma_split_blocks_per_sm`` blocks on every SM)
    is split. Of the counts up to ``mma_split_max`` whose parts keep ``mma_split_min_steps``
    steps each, the rule takes the one that fills its last wave best (the fewest parts among
    equals), if that fills more than ``mma_split_min_gain`` more of the waves' slots than the
    whole grid does: on an H200, 196 blocks of 128 x 128 ran as fast cut in 2 or 3 parts (two
    waves of 392 or three of 588 blocks for 264 slots, each as full as one wave of 196) as whole,
    plus the partial sums' traffic, and faster cut in 4 (784 blocks: three full waves).
    ``mma_split`` imposes a count instead. Either way a part keeps at least one step and the
    grid's ``groups x parts`` stay within CUDA's limit."""
    steps, limit, forced = _split_bounds(problem, tile, precision)
    if forced is not None:
        return forced
    blocks = mma_blocks(problem, tile)
    slots = KNOBS.mma_split_blocks_per_sm * multiprocessors
    if blocks >= slots:
        return 1

    def filled(parts):  # the share of the waves' slots the grid's blocks fill
        return blocks * parts / (-(-blocks * parts // slots) * slots)

    allowed = _allowed_parts(steps, limit)
    best = max(allowed, key=lambda s: (filled(s), -s))
    return best if filled(best) >= filled(1) + KNOBS.mma_split_min_gain else 1


def _preferred(tiles, problem, multiprocessors: int, n: int, split=None):
    """The first of ``tiles`` whose BM fits M (rounded up to 16) and that gives every SM two
    blocks, else the fitting tile with the most blocks; a tile's blocks times its ``split``
    (a function of the tile) where given."""
    m = _round_up(problem.gemm_m, 16)
    fitting = [t for t in tiles if t.BM <= m] or [min(tiles, key=lambda t: t.BM)]

    def blocks(tile):
        whole = mma_blocks(problem, tile, n)
        return whole * split(tile) if split else whole

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
