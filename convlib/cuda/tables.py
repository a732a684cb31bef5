"""Every tuning knob of the CUDA backend, in one table (:data:`KNOBS`), and the tile types.

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

Which tile a problem gets is decided in :mod:`convlib.cuda.tiles` from these knobs; the
``gemm_tile`` and ``direct_tile`` knobs impose one (tile sweeps in benchmarks):
``with KNOBS.override(gemm_tile=GemmTile(64, 128, 8, 8, 8)): ...``.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass, replace

from ..core.knobs import Knob, KnobTable

#: Static shared memory a numba-cuda kernel may declare (bytes), without the dynamic opt-in: a
#: property of the hardware and numba-cuda, not a knob.
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
class MmaTile:
    """One tile of the tensor-core implicit GEMM (:mod:`convlib.cuda.tensor_gemm`).

    A block computes ``BM x BN`` of C with ``(BM // WM) * (BN // WN)`` warps, each a ``WM x WN``
    warp tile of ``16 x 8`` tensor-core products; it stages ``BKW`` 32-bit words of the
    reduction per step (``BKW`` taps in TF32, ``2 * BKW`` in half precision).

    ``stages`` is how many steps shared memory holds. With 2, the next step is loaded into
    registers during the products and stored into the other stage after them. With 3 or more,
    the channels-last kernel copies each step straight into shared memory with ``cp.async``,
    ``stages - 1`` steps ahead (:mod:`convlib.cuda.tensor_gemm`); the other kernels run such a
    tile with 2.

    ``min_blocks`` is the kernel's launch bound of blocks per SM: ptxas caps the registers so
    that that many blocks fit (65536 registers an SM).
    """

    BM: int
    BN: int
    BKW: int
    WM: int
    WN: int
    stages: int = 2
    min_blocks: int = 1

    @property
    def warps(self) -> int:
        return (self.BM // self.WM) * (self.BN // self.WN)

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def a_per_thread(self) -> int:
        return self.BM * self.BKW // self.threads

    @property
    def b_per_thread(self) -> int:
        return self.BKW * self.BN // self.threads

    @property
    def a_stride(self) -> int:
        """Words between rows of a staged A tile: 4 (mod 8), so that the eight rows a warp's
        fragment reads fall in distinct banks."""
        return self.BKW + 4

    @property
    def b_stride(self) -> int:
        """Words between rows of a staged B tile: 8 (mod 32) when ``BN`` is a multiple of 32,
        so that the four rows a fragment reads fall in distinct banks."""
        return self.BN + 8

    @property
    def shared_words(self) -> int:
        """Every stage of A and B, B staged either way (``[k][n]`` or, channels-last, ``[n][k]``
        with A's stride); the epilogue reuses them for the output."""
        return self.stages * (self.BM * self.a_stride + max(self.BKW * self.b_stride, self.BN * self.a_stride))

    def with_stages(self, stages: int) -> "MmaTile":
        """This tile with ``stages`` shared stages."""
        return replace(self, stages=stages)

    @property
    def shared_bytes(self) -> int:
        return 4 * self.shared_words

    @property
    def output_stride(self) -> int:
        """Words between rows of a warp's staged 16-row slice of C in the epilogue."""
        return self.WN + 8

    def check(self) -> "MmaTile":
        """Raise ``ValueError`` unless the warps tile the block and the loads divide evenly."""
        t = self.threads
        ok = (
            self.WM % 16 == 0 and self.WN % 8 == 0 and self.BM % self.WM == 0 and self.BN % self.WN == 0
            # waits of up to 3 groups in flight (convlib.cuda.ptx.COPY_GROUPS_IN_FLIGHT)
            and 2 <= self.stages <= 5 and self.BKW % 8 == 0 and t % self.BKW == 0 and t % self.BN == 0
            and (self.BM * self.BKW) % t == 0 and (self.BKW * self.BN) % t == 0
            # the channels-last kernel's 16-byte chunks (four words) too
            and t % (self.BKW // 4) == 0 and (self.BM * self.BKW // 4) % t == 0 and (self.BN * self.BKW // 4) % t == 0
            and self.shared_bytes <= SHARED_MEMORY_LIMIT
            # the epilogue: every warp's 16 rows of C at once, lanes across its columns
            and self.WN % 32 == 0 and self.warps * 16 * self.output_stride <= self.shared_words
        )
        if not ok:
            raise ValueError(f"{self}: warps do not tile the block, or loads do not divide among {t} threads")
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


@dataclass(frozen=True)
class DirectStrip:
    """The thread layout of direct's strip kernel (:mod:`convlib.cuda.direct_strips`): each of a
    block's ``threads`` computes ``JPT`` consecutive output columns of ``KB`` output channels down
    a strip of ``min_rows`` to ``max_rows`` output rows (chosen per launch); ``blocks_per_sm``
    (or None) is the launch bound that caps a thread's registers so that many blocks fit;
    ``rows_ahead`` input rows are being copied while the block computes with one (each a buffer
    of shared memory); ``unroll_channels`` unrolls the loop over input channels (a larger kernel
    that compiles about twice as long)."""

    JPT: int
    KB: int
    threads: int
    blocks_per_sm: int | None = None
    min_rows: int = 16
    max_rows: int = 64
    rows_ahead: int = 1
    unroll_channels: bool = False


#: The strip kernel's layout by channels per group (``direct.strip_channels``). "few" (up to
#: ``direct_strip_max_channels``): of 14 layouts, 4 columns x 4 channels a thread, 64 threads
#: (bands of 256 columns), six blocks an SM ran the seed shape fastest (H200: 0.112 ms; 256
#: threads, two blocks: 0.131) and the batch sweep at 1024^2. "one" (one input and one output
#: channel): 128 threads, four blocks an SM ran a 5x5 filter on 4096^2 in 0.063 ms on an H200,
#: 256 threads 0.069, 64 threads 0.078; its rows are 2 KiB, and with two of them copied ahead
#: it took 0.0613 ms against 0.0714 on an H100 (two calls; the 4-channel layout copying two
#: rows ahead ran the seed 1.09x slower and the rest within 1%: it keeps one). Swept again on an
#: H200 after the copies' address arithmetic went (session 29; 12 layouts on the unpadded seed,
#: N=16-64 at 1024^2, 2048^2 and 4096^2, before the 8-byte stores): two rows ahead 0.4-1.9%
#: faster, 8 columns a thread 1.5x slower, 8-10 blocks an SM (capped registers) up to 23% slower.
#: With those stores (two more calls), channels unrolled and two rows ahead took the padded
#: seed in 0.090 ms against 0.099 and N=8 at 4096^2 in 1.405 against 1.461, but the unpadded
#: seed and N=16-64 at 1024^2 in 1.00-1.02x the time; unrolled alone or two rows ahead alone
#: 1.01-1.02x (4096^2 0.99x, 1.01x). So the layout stays.
_DIRECT_STRIPS = {
    "few": DirectStrip(JPT=4, KB=4, threads=64, blocks_per_sm=6),
    "one": DirectStrip(JPT=4, KB=4, threads=128, blocks_per_sm=4, rows_ahead=2),
}


#: GEMM tiles per dtype, in order of preference. The selector takes the first whose BM fits M
#: (rounded up to 16) and that gives every SM two blocks, else the fitting tile with the most
#: blocks. 64x128 (128 threads, 8x8 each) beat 128x128 and 128x64 on 5 of 6 ResNet-50 layers at
#: batch 128 on an H200 (docs/gpu.md, tile sweep); 128x128 won only on the strided 3x3.
_GEMM_TILES = {
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

#: Tensor-core tiles per precision, in order of preference (the same rule as ``gemm_tiles``).
#: On an H200 (docs/gpu.md), 4 warps of 64x64 (128 accumulators per thread) on 128x128 beat 8
#: warps of 64x32 on ResNet-50's 3x3 and 1x1 layers in TF32 and float16 (0.18 against 0.21 ms on
#: the 28^2 3x3 layer, float16); 64x128 serves 64 filters. Where 128 x 128 gives too few
#: blocks, 128 x 64 comes before 64 x 128: forced on ResNet-50's 19 layers of 128 or more
#: filters at batch 128 (H200, float16, 2026-11-27, .device/tile_choice.py), it ran 1.11x as
#: fast (geomean; 1x1 layers 1.15x, 3x3 1.03x, four 3x3 layers of stages 3-4 1-7% slower),
#: both staged by cp.async or both through registers; the one layer the chooser gives up
#: 128 x 128 on (float16 7x7 1x1 2048>512: 196 blocks, too few steps to split) 0.107 -> 0.098
#: ms (bfloat16 0.105 -> 0.096; whole 128 x 128 0.102; docs/gpu.md).
_REGISTER_STAGED_TILES = (
    MmaTile(BM=128, BN=128, BKW=16, WM=64, WN=64),
    MmaTile(BM=128, BN=128, BKW=16, WM=64, WN=32),
    MmaTile(BM=128, BN=64, BKW=16, WM=64, WN=32),
    MmaTile(BM=64, BN=128, BKW=16, WM=32, WN=32),
    MmaTile(BM=64, BN=64, BKW=16, WM=32, WN=32),
    MmaTile(BM=32, BN=128, BKW=16, WM=32, WN=32),
)
#: The tiles below 128 x 128 again for the channels-last kernel with cp.async (3 stages of 16
#: words; convlib.cuda.tiles.choose_mma_tile takes them only there, the register-staged twins
#: elsewhere). On an H200 in float16 they beat their twins on ResNet-50's 64-filter 3x3 layer
#: (0.231 against 0.244 ms), and 64 x 64 in TF32 on the 7x7 3x3 layer (0.373 against 0.452
#: ms); 128 x 128 stays register-staged: its cp.async version (4 stages of 8 words, to fit 48
#: KiB) was 0-30% slower (docs/gpu.md).
_COPYING_TILES = tuple(replace(t, stages=3) for t in _REGISTER_STAGED_TILES if t.BM * t.BN < 128 * 128)
_MMA_TILES = {precision: _REGISTER_STAGED_TILES[:2] + _COPYING_TILES + _REGISTER_STAGED_TILES[2:]
              for precision in ("tf32", "float16", "bfloat16")}

#: Direct tiles per dtype. For float32, 8x256 outputs of 4 channels with 1x8 per thread ran the
#: seed shape (N=8, C=K=4, 1024x1024, 3x3) fastest of eight tiles on an H200 (docs/gpu.md).
_DIRECT_TILES = {
    "float32": DirectTile(TH=8, TW=256, RPT=1, JPT=8, KB=4, CB=4),
    "float64": DirectTile(TH=16, TW=64, RPT=2, JPT=2, KB=4, CB=4),
}



#: The GEMM engines of ``im2col``: ``"own"`` (our tiled kernel), ``"cublas"`` (through CuPy) and
#: ``"auto"`` (cuBLAS when CuPy imports and the GPU is real).
GEMM_ENGINES = ("auto", "own", "cublas")

KNOBS = KnobTable("cuda", [
    Knob("gemm_tiles", _GEMM_TILES, "GEMM tiles in order of preference (see convlib.cuda.tiles."
         "choose_gemm_tile)", keyed_by=("dtype",)),
    Knob("mma_tiles", _MMA_TILES, "tensor-core GEMM tiles per precision (tf32, float16, bfloat16) in order "
         "of preference (see convlib.cuda.tiles.choose_mma_tile)", keyed_by=("precision",)),
    Knob("mma_tile", None, "an MmaTile every tensor-core launch uses instead of the chosen one (tile sweeps); "
         "None: chosen per problem"),
    Knob("simulator_mma_tiles", (MmaTile(BM=32, BN=32, BKW=16, WM=16, WN=32),), "tensor-core tiles under the "
         "simulator: two warps, several blocks and steps on tiny problems"),
    # Split-K of the channels-last tensor-core kernel (convlib.cuda.tiles.choose_mma_split;
    # docs/gpu.md, "Split-K": H200, batch 128, ResNet-50's stage-5 7x7 layers).
    Knob("mma_split_max", 4, "the most parts split-K cuts the channels-last tensor-core kernel's reduction into "
         "(contiguous runs of whole steps, summed in order by a second kernel); 1 turns split-K off. 4 parts of "
         "128 x 128 tiles ran the 7x7 3x3 layers 0-3% (float16) and 10% (TF32) faster than whole 128 x 128 tiles"),
    Knob("mma_split_min_steps", 32, "the fewest reduction steps (BKW words each) split-K leaves one part: 4 parts "
         "of 16 steps ran the float16 1x1 2048>512 layer 11% slower than whole, of 36 steps (3x3) no slower"),
    Knob("mma_split_blocks_per_sm", 2, "the blocks an SM runs at once in split-K's rule (a wave is this many "
         "times the SMs): two of the 128 x 128 tile (243 registers a thread); grids of a wave or more stay whole"),
    Knob("mma_split_min_gain", 0.1, "how much more of its waves' slots a split grid must fill than the whole "
         "one (a share, 0 to 1) before split-K is worth its partial sums: 196 blocks of 264 slots fill 0.74, "
         "cut in 4 parts 0.99"),
    Knob("mma_split", None, "a split count every channels-last tensor-core launch uses instead of the rule's "
         "(clamped to the steps and grid; sweeps and tests); None: the rule"),
    Knob("direct_tiles", _DIRECT_TILES, "the direct tile, shrunk per problem until its shared memory fits",
         keyed_by=("dtype",)),
    Knob("direct_strip", _DIRECT_STRIPS, "the thread layout of direct's strip kernel (stride-1 float32 layers of "
         "few channels), by channels per group: 'one' input and output channel (filters, depthwise) or 'few'",
         keyed_by=("channels",)),
    # Where the strip kernel runs (H200, .device/strips6.py, docs/gpu.md): 1.18-1.27x the staged
    # kernel's speed on 4-channel 3x3 layers 1024 wide (N=8..80), 1.46x 2048 wide, 1.64x 4096 wide,
    # 1.14x 512 wide, 1.29x on a 5x5 single-channel filter 4096 wide; 0.72x at 256 wide. On an
    # H100 the seed 1.24x, and since strips are 16 rows long wherever one round cannot hold the
    # grid (direct_strips.strip_rows), N=16-64 1024 wide 1.09-1.12x and 2048 wide 1.46x the staged
    # kernel's speed (docs/benchmarks.md, "Strip length").
    Knob("direct_strip_max_channels", 4, "the most input and the most output channels per group direct's strip "
         "kernel takes (the most measured); 0 turns it off"),
    Knob("direct_strip_min_width", 512, "the narrowest input rows direct's strip kernel takes"),
    Knob("direct_strip_min_work", 25, "the fewest multiply-adds per output pixel (input x output channels per group "
         "x R x S) direct's strip kernel takes: below, its barrier per row costs more than it saves"),
    Knob("direct_strip_max_products", 1600, "the most multiply-adds the strip kernel's unrolled row loop may "
         "name (R rows x R x S taps x KB x JPT): numba's compile time grows with them"),
    Knob("simulator_direct_strip", DirectStrip(JPT=4, KB=2, threads=2, min_rows=2, max_rows=3),
         "the strip layout under the CUDA simulator: several blocks, bands, strips and channel chunks on tiny "
         "problems"),
    Knob("gemm_tile", None, "a GemmTile every GEMM launch uses instead of the chosen one (tile sweeps); "
         "None: chosen per problem"),
    Knob("direct_tile", None, "a DirectTile every direct launch starts from instead of the table's (still "
         "shrunk to fit shared memory); None: the table's"),
    Knob("simulator_gemm_tiles", (GemmTile(BM=4, BN=8, BK=4, TM=2, TN=2),), "GEMM tiles under the CUDA "
         "simulator: many blocks and stages on tiny problems"),
    Knob("simulator_direct_tile", DirectTile(TH=4, TW=4, RPT=2, JPT=2, KB=2, CB=2), "the direct tile under "
         "the CUDA simulator"),
    Knob("elementwise_threads", 256, "threads per block of the elementwise kernels (strided copies)"),
    Knob("simulator_elementwise_threads", 8, "the same under the simulator"),
    Knob("pixels_per_block", 256, "output pixels per thread block of im2col's column and bias kernels"),
    Knob("simulator_pixels_per_block", 8, "the same under the simulator"),
    # The backward passes (convlib/cuda/direct_backward.py, bias_gradient.py): starting values, not
    # yet timed on a GPU.
    Knob("backward_data_threads", 256, "threads per block of the backward-data kernel (one dx value per thread, "
         "a block's threads on consecutive pixels of one channel)"),
    Knob("simulator_backward_data_threads", 8, "the same under the simulator"),
    Knob("backward_weight_threads", 256, "threads per block of the backward-weight kernel (one dw element per "
         "thread, consecutive threads on consecutive taps)"),
    Knob("simulator_backward_weight_threads", 8, "the same under the simulator"),
    Knob("backward_weight_parallelism", 2**20, "threads the backward-weight launch aims for: when dw has fewer "
         "elements, the batch's output rows are split into about this many / elements parts (at most 65535), "
         "each part's sums written to a workspace and added in order by a second kernel"),
    Knob("simulator_backward_weight_parallelism", 64, "the same under the simulator (small problems still "
         "split, so the second kernel runs)"),
    Knob("reduction_threads", 256, "threads per block of the bias-gradient kernel (one block per channel, "
         "summing in shared memory)"),
    Knob("simulator_reduction_threads", 8, "the same under the simulator"),
    Knob("tap_table_bytes", 48 * 1024, "constant memory the implicit GEMM's tap table may take (of the "
         "64 KiB a kernel can address); larger tables decode taps by division instead"),
    Knob("im2col_gemm", "auto", "the GEMM of im2col: 'own' (our tiled kernel), 'cublas' (through CuPy) "
         "or 'auto' (cuBLAS when CuPy imports and the GPU is real)", allowed=GEMM_ENGINES),
])


@functools.cache
def cupy_available() -> bool:
    """Whether CuPy can be imported (it is never imported by convlib before it is used)."""
    return importlib.util.find_spec("cupy") is not None


def resolved_engine(simulator: bool) -> str:
    """The GEMM engine im2col's next call will use: ``"own"`` or ``"cublas"`` (the ``im2col_gemm``
    knob; ``"auto"`` is cuBLAS when CuPy imports and the GPU is real)."""
    engine = KNOBS.im2col_gemm
    if engine == "cublas":
        if simulator or not cupy_available():
            raise RuntimeError("the cublas GEMM engine needs CuPy and a real GPU (not the simulator)")
        return "cublas"
    if engine == "auto" and cupy_available() and not simulator:
        return "cublas"
    return "own"


def gemm_is_cublas(simulator: bool) -> bool:
    """Whether im2col's next GEMM is cuBLAS (:func:`resolved_engine`); False where the knob asks
    for cuBLAS but it cannot run (the call itself then says why)."""
    try:
        return resolved_engine(simulator) == "cublas"
    except RuntimeError:
        return False


def launch_knob(name: str, simulator: bool):
    """The knob ``name`` (a block size, a parallelism), or its ``simulator_`` twin when numba-cuda's
    simulator runs the kernels: tiny values there still cross several blocks."""
    return getattr(KNOBS, f"simulator_{name}" if simulator else name)
