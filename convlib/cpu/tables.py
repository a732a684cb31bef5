"""Every tuning knob of the CPU backend, in one table (:data:`KNOBS`), and the types of its rows.

Change knobs for a while with ``KNOBS.override(...)`` (see :mod:`convlib.core.knobs`); read them
with ``KNOBS.<name>``, or through :func:`blis_blocking` and :func:`direct_blockings` for the
per-ISA rows. ``python -c "from convlib.cpu.tables import KNOBS; print(KNOBS.describe())"``
prints the table.

BLIS block sizes
----------------
The five loops of BLIS (Van Zee & van de Geijn, 2015) partition C = A @ B, with A the
``M x Kgemm`` filter matrix of one group and B the ``Kgemm x Ngemm`` (implicit) im2col matrix:

========  =====================================================================================
``NC``    columns of B (output pixels) per outer ``jc`` block; the packed ``Bc`` panel is KC x NC
``KC``    depth (``c, r, s`` taps) per ``pc`` block; ``Bc`` and ``Ac`` share it
``MC``    rows of A (output channels) per ``ic`` block; the packed ``Ac`` panel is MC x KC
``MR``    rows of the register tile the micro-kernel keeps in accumulators
``NR``    columns of that register tile; a multiple of the SIMD width
========  =====================================================================================

The driver's two inner loops take one ``KC x NR`` sliver of ``Bc`` and run it against every
``KC x MR`` sliver of ``Ac`` in turn: that sliver of ``Bc`` is meant to stay in L1 (32 KiB for
128 x 64 float32), ``Ac`` (MC x KC) in L2 and ``Bc`` (KC x NC) in L2 or L3. MR x NR sets the register tile: MR*NR/16
zmm accumulators for float32 (24 of the 32 for 6x64), NR/16 vector loads and MR broadcasts per
reduction step. The AVX-512 rows were measured on the Zen 5 measurement machine and the GPU
machine's Xeon host, the AVX2 rows on the AVX2 development machine (docs/benchmarks.md).

Those rows hold for the caches they were measured with (:data:`REFERENCE_CACHES`). On another
machine :func:`machine_derived_knobs` scales them to the caches the OS reports
(:func:`convlib.cpu.isa.cache_sizes`): KC with the L1 data cache (the ``KC x NR`` sliver of
``Bc`` stays in L1), MC so that ``Ac`` and one ``KC x NR`` sliver of ``Bc`` keep the same share
of L2, NC so that ``Bc`` keeps its size. ``python -m convlib.tune`` measures around them and
stores what wins in the machine's profile (:mod:`convlib.cpu.profile`), which takes precedence.

Direct register blocks
----------------------
:class:`DirectBlocking` rows: ``KB`` output channels x ``QB`` wide output positions per register
block of :mod:`convlib.cpu.direct`, per instruction set (:func:`direct_isa`) and dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.knobs import Knob, KnobTable
from .isa import FALLBACK_CACHES, cache_sizes, host_isa, simd_bytes
from .profile import load_profile_knobs


@dataclass(frozen=True)
class BlisBlocking:
    """One row of the BLIS block-size table (see the module docstring for the names).

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

    def panel_sizes(self, problem, m_parts: int = 1, n_parts: int = 1) -> tuple[int, int, int]:
        """``(mc, kc, nc)``: the block sizes clipped to ``problem``, as the panels are allocated;
        with ``m_parts x n_parts`` threads sharing the output, clipped to one thread's share of its
        register tiles (a small piece's panels on many threads would otherwise each be sized for
        the whole piece: 16 partitions of a 310-column row took 3x a 256 KiB workspace cap).

        ``mc`` and ``nc`` are rounded up to whole register tiles (the packing routines pad the
        last tile with zeros). ``kc`` is the step of the ``pc`` loop: the reduction length cut into
        equal blocks of at most KC (576 = 2 x 288, not 384 + 192), so no block is so short that
        the micro-kernel's load and store of its tile dominates it.
        """
        m_tiles = -(-problem.gemm_m // self.MR)
        n_tiles = -(-max(problem.gemm_n, 1) // self.NR)
        mc = min(self.MC, -(-m_tiles // m_parts) * self.MR)
        blocks = -(-problem.gemm_k // self.KC)
        kc = -(-problem.gemm_k // blocks)
        nc = min(self.NC, -(-n_tiles // n_parts) * self.NR)
        return mc, kc, nc

    def workspace_bytes(self, problem, threads: int, m_parts: int = 1, n_parts: int = 1) -> int:
        """Bytes of the packed panels for ``problem``: O(MC*KC + KC*NC), whatever N, H, W are.

        Every thread owns an ``Ac`` (mc x kc), a ``Bc`` (kc x nc, plus :data:`VECTOR_SLACK_BYTES`),
        an MR x NR edge tile and two int64 tables for the packing of B, kc x 9 (taps) and NR x 4
        (pixel runs); see :mod:`convlib.cpu.blis` for why the threads share nothing. ``mc`` and
        ``nc`` are one thread's share of an ``m_parts x n_parts`` grid (:meth:`panel_sizes`).
        """
        mc, kc, nc = self.panel_sizes(problem, m_parts, n_parts)
        per_thread = (mc * kc + kc * nc + self.MR * self.NR) * problem.itemsize
        per_thread += VECTOR_SLACK_BYTES + (kc * 9 + self.NR * 4) * 8
        return threads * per_thread


#: Bytes of slack after each thread's ``Bc``: the packing's whole-vector writes may run one
#: 32-byte vector past the last panel.
VECTOR_SLACK_BYTES = 32


@dataclass(frozen=True)
class DirectBlocking:
    """One register block of the direct kernel.

    Attributes
    ----------
    KB : int
        Output channels per block (weights broadcast, one accumulator row each).
    QB : int
        Consecutive wide output positions per block; a multiple of the SIMD width.
        ``KB * QB / lanes`` accumulators, ``KB`` broadcast weights and one input vector must
        fit in the vector registers (32 zmm with AVX-512, 16 ymm with AVX2).
    speed : float
        Measured multiply-adds per second relative to the table's best block, on a deep
        reduction; :func:`convlib.cpu.direct.choose_blocking` divides the padded work by it.
    along : str
        What the vector lanes hold. ``"positions"``: ``QB`` consecutive wide positions (a
        multiple of the SIMD width), ``KB`` weights broadcast per tap. ``"channels"``: ``KB``
        output channels (a multiple of the SIMD width) of ``QB`` output positions taken anywhere
        (an input value broadcast per position and tap): no wide-row columns thrown away, the
        block for small planes (an 8x8 image padded to pitch 10 keeps 64 of every 96
        positions a 32-wide block computes).
    """

    KB: int
    QB: int
    speed: float = 1.0
    along: str = "positions"

    @property
    def label(self) -> str:
        """``"3x32"``, or ``"16c x6"`` for a block along the channels."""
        return f"{self.KB}x{self.QB}" if self.along == "positions" else f"{self.KB}c x{self.QB}"


#: Register tiles per (instruction set, dtype), like BLIS's per-target configurations. The tile
#: fills about three quarters of the vector registers with accumulators: 6 rows x 4 zmm for
#: AVX-512 (32 registers), 3 rows x 4 ymm for AVX2 (16 registers; 3x32 is the one AVX2 shape whose
#: loop LLVM schedules without spilling). float64 halves NR (same bytes per vector register row).
#: AVX2's MC=192, KC=512 (from 96, 384): on a Zen 3 (32 KiB L1d, 512 KiB L2), 2 threads, nine of
#: ResNet-50's GEMM-shaped layers took 0.905x and 0.980x the time in geomean, two interleaved runs
#: of blis under ``KNOBS.override(blis_blocking=...)`` (a git-ignored script, docs/benchmarks.md),
#: and ``python -m convlib.tune`` chose KC=512 there twice.
#: AVX-512's KC=128 (from 384): the micro-kernel's ``KC x NR`` sliver of ``Bc``, reused across the
#: MC/MR slivers of ``Ac``, then fits a 48 KiB L1 (32 KiB of it). On an Intel Xeon with AVX-512
#: (48 KiB L1d, 2 MiB L2, 2 threads) eighteen of ResNet-50's blis layers took 0.941x the time in
#: geomean (0.86-1.07 per layer; the micro-kernel alone 218 against 155 GFLOP/s on one core); on
#: Zen 5, KC 128-704 had been within 3% (docs/benchmarks.md, "Zen 5 (AVX-512), 2026-11-27" and "session 39").
_BLIS_BLOCKING = {
    ("avx512", "float32"): BlisBlocking(MC=96, KC=128, NC=1024, MR=6, NR=64),
    ("avx512", "float64"): BlisBlocking(MC=96, KC=256, NC=1024, MR=6, NR=32),
    ("avx2", "float32"): BlisBlocking(MC=192, KC=512, NC=1024, MR=3, NR=32),
    ("avx2", "float64"): BlisBlocking(MC=96, KC=256, NC=512, MR=3, NR=16),
}

#: Direct candidates per instruction set (see :func:`direct_isa`) and dtype. float64 halves QB.
#: The kernel is written in explicit vectors of the widest registers: AVX-512, 24 zmm accumulators
#: (on Intel's AVX-512 parts too, where LLVM's loop vectoriser prefers ymm: the ymm blocks 4x48, 6x32
#: and 3x64 it had there took 1.1-1.5x the time of these, Xeon host, 2 threads). AVX2: 12 ymm
#: accumulators + KB broadcasts + 1 input vector <= 16 registers (4 x 24 would need 17 and spills;
#: 4 x 16 has too few accumulators for its broadcasts). The single-channel blocks serve depthwise
#: convolution. AVX-512's 4 x 5 vectors (20 accumulators) fits the wide rows of 8x8 images padded by
#: one (78 positions) and rows of 65-80 outputs, which every other block pads to 96: 0.90-0.94x the
#: time on the digits CNN's 16->32 layer, 8x8 64->64 and 80x80 16->32 layers (Zen 5, 2 threads).
#: The blocks along the channels (last in each row) and their speeds: on a Zen 3 (AVX2) they beat the
#: rows' blocks on ResNet-50's 14x14 layers and the digits CNN's 8x8 ones by more than the padding
#: they save (0.40-0.86x the time); on the Xeon host (AVX-512) they took 1.25-1.52x the time of the
#: rows' blocks on the same ResNet layers and 0.86-0.94x on the digits CNN's (2 pinned cores), so there
#: their speed, 0.6, leaves them to the tuner (docs/benchmarks.md, 2026-11-29, session 33).
_DIRECT_BLOCKINGS = {
    ("avx512", "float32"): (
        DirectBlocking(KB=4, QB=96), DirectBlocking(KB=8, QB=48), DirectBlocking(KB=12, QB=32),
        DirectBlocking(KB=4, QB=80), DirectBlocking(KB=1, QB=128, speed=0.5),
        DirectBlocking(KB=32, QB=12, speed=0.6, along="channels"), DirectBlocking(KB=16, QB=24, speed=0.6, along="channels"),
    ),
    ("avx512", "float64"): (
        DirectBlocking(KB=4, QB=48), DirectBlocking(KB=8, QB=24), DirectBlocking(KB=12, QB=16),
        DirectBlocking(KB=4, QB=40), DirectBlocking(KB=1, QB=64, speed=0.5),
        DirectBlocking(KB=16, QB=12, speed=0.6, along="channels"), DirectBlocking(KB=8, QB=24, speed=0.6, along="channels"),
    ),
    ("avx2", "float32"): (
        DirectBlocking(KB=3, QB=32), DirectBlocking(KB=2, QB=48, speed=0.9), DirectBlocking(KB=1, QB=96, speed=0.5),
        DirectBlocking(KB=16, QB=6, speed=0.9, along="channels"),
    ),
    ("avx2", "float64"): (
        DirectBlocking(KB=3, QB=16), DirectBlocking(KB=2, QB=24, speed=0.9), DirectBlocking(KB=1, QB=48, speed=0.5),
        DirectBlocking(KB=8, QB=6, speed=0.9, along="channels"),
    ),
}

#: The caches the built-in rows and byte budgets were measured with, per instruction set: the
#: AVX-512 rows on cores with a 48 KiB L1 data cache and a 1-2 MiB L2 (Zen 5, Sapphire Rapids),
#: the AVX2 rows on a Zen 3 core (32 KiB, 512 KiB). The byte budgets of direct and depthwise
#: (``direct_l2_input_budget``, ``depthwise_*_bytes``) were set on 32 KiB / 1 MiB cores.
REFERENCE_CACHES = {
    "avx512": {"L1d": 48 * 1024, "L2": 1024 * 1024},
    "avx2": {"L1d": 32 * 1024, "L2": 512 * 1024},
    "budgets": {"L1d": 32 * 1024, "L2": 1024 * 1024},
}


#: Winograd's GEMM tile (MR, NR) per instruction set and dtype (the ``winograd_register_tile`` knob).
_WINOGRAD_REGISTER_TILE = {
    "avx512": {"float32": (8, 32), "float64": (8, 16)},
    "avx2": {"float32": (5, 16), "float64": (5, 8)},
}


_DIRECT_L2_INPUT_BUDGET = 512 * 1024
#: The most ``direct_whole_input_max_bytes`` is derived to, whatever L3 the OS reports: half of the
#: 32 MiB L3 of the Zen machines it was set on. A virtual machine reports its host socket's L3
#: (260 MiB on an Intel Xeon of 2 vCPUs), of which its cores hold a small share: there, gathering
#: padded inputs whole took 1.04-1.27x the time of gathering per work item at 12-20 MiB and
#: 1.25-4.8x at 24-98 MiB (docs/benchmarks.md, session 41).
_DIRECT_WHOLE_INPUT_MAX_BYTES = 16 * 2**20
#: A byte limit that no array reaches (a knob's "no limit").
UNLIMITED_BYTES = 2**62
_DEPTHWISE_BAND_BYTES = 512 * 1024
_DEPTHWISE_PLANE_MASK_BYTES = 256 * 1024
_DEPTHWISE_CHANNEL_BLOCK_BYTES = 192 * 1024


def fit_blis_to_caches(row: BlisBlocking, itemsize: int, caches: dict, reference: dict) -> BlisBlocking:
    """``row`` (measured with the caches ``reference``) rescaled to the caches ``caches``.

    The register tile stays. KC scales with the L1 data cache (rounded down to 32, within
    128..1024); MC keeps ``(MC + NR) * KC`` -- ``Ac`` plus one sliver of ``Bc`` -- the same share of
    L2 (whole register tiles, at least 4); NC keeps ``KC * NC``, the size of ``Bc`` (whole tiles,
    at least 4). With ``caches == reference`` the row comes back unchanged.
    """
    kc = min(1024, max(128, row.KC * caches["L1d"] // reference["L1d"] // 32 * 32))
    mc = (row.MC + row.NR) * row.KC * caches["L2"] // (reference["L2"] * kc) - row.NR
    mc = max(4 * row.MR, mc // row.MR * row.MR)
    nc = max(4 * row.NR, row.NC * row.KC // kc // row.NR * row.NR)
    return BlisBlocking(MC=mc, KC=kc, NC=nc, MR=row.MR, NR=row.NR)


def machine_derived_knobs(caches: dict | None = None) -> dict:
    """The knob values this machine's caches imply (the knob table's derived layer).

    ``caches`` defaults to :func:`convlib.cpu.isa.cache_sizes`. Byte budgets keep their ratio to
    the cache they are meant for; BLIS rows are rescaled by :func:`fit_blis_to_caches`; direct's
    thresholds between cache-resident and streaming inputs and outputs follow the last-level cache
    (the one for gathering inputs whole at most up to :data:`_DIRECT_WHOLE_INPUT_MAX_BYTES`).
    """
    caches = cache_sizes() if caches is None else caches
    budgets = REFERENCE_CACHES["budgets"]
    last_level = caches.get("L3", FALLBACK_CACHES["L3"])
    return {
        "blis_blocking": {
            (isa, dtype): fit_blis_to_caches(row, 4 if dtype == "float32" else 8, caches, REFERENCE_CACHES[isa])
            for (isa, dtype), row in _BLIS_BLOCKING.items()
        },
        "direct_l2_input_budget": _DIRECT_L2_INPUT_BUDGET * caches["L2"] // budgets["L2"],
        "direct_stream_min_bytes": last_level // 2,
        "winograd_register_tile": _WINOGRAD_REGISTER_TILE[host_isa()],
        "direct_whole_input_max_bytes": min(last_level // 2, _DIRECT_WHOLE_INPUT_MAX_BYTES),
        "winograd_chunk_bytes": min(8 * 2**20, max(2 * 2**20, last_level // 4)),
        "depthwise_band_bytes": _DEPTHWISE_BAND_BYTES * caches["L2"] // budgets["L2"],
        "depthwise_plane_mask_bytes": _DEPTHWISE_PLANE_MASK_BYTES * caches["L2"] // budgets["L2"],
        "depthwise_channel_block_bytes": _DEPTHWISE_CHANNEL_BLOCK_BYTES * caches["L2"] // budgets["L2"],
    }


#: The dataclasses knob values are made of (what a profile may hold).
VALUE_TYPES = {"BlisBlocking": BlisBlocking, "DirectBlocking": DirectBlocking}


def _load_profile() -> dict:
    return load_profile_knobs(KNOBS.knobs(), VALUE_TYPES)


KNOBS = KnobTable("cpu", [
    # -- every algorithm -------------------------------------------------------------------
    Knob("serial_below_flops", 0, "problems of any operation with fewer FLOPs run on the calling thread "
         "alone (the CPU backend's execution): a parallel region costs more than it saves there, and its "
         "OpenMP threads spin against those of the caller's other runtimes (PyTorch's, BLAS's)"),
    # -- blis ------------------------------------------------------------------------------
    Knob("blis_blocking", _BLIS_BLOCKING, "BLIS block sizes MC, KC, NC and register tile MR x NR "
         "(see the module docstring)", keyed_by=("isa", "dtype")),
    Knob("blis_partitions", None, "work partitions of the blis driver, each with its own workspace; "
         "None = numba's thread count (more than the threads reaches other thread grids, for tests)"),
    Knob("blis_pack_cost_flops", 16, "cost of packing one element by a plain copy (A; B of a 1x1 stride-1 "
         "layer), in FLOP-equivalents of micro-kernel work, for the thread split"),
    Knob("blis_image_pack_cost_flops", 40, "cost of packing one element of B from the image (general and "
         "strided routines), per element ..."),
    Knob("blis_image_pack_run_cost_flops", 1300, "... plus this much per run of pixels a tap copies at once, "
         "spread over the run (Zen 5, one thread, 0.21-0.31 ns per element on 28-pixel rows, 0.49 on 14, 0.82 "
         "on 7: ResNet-50's s5 3x3/2 and s4 1x1/2 layers then split by columns, 0.95x and 0.93x the time)"),
    Knob("blis_gather_pack_cost_flops", 90, "cost of packing one element of B by gathers (AVX-512, output rows "
         "narrower than blis_gather_below_width), per element whatever the rows: 0.35-0.39 ns on an Intel Xeon, "
         "as by rows on 28-pixel rows (40 + 1300/28). ResNet-50's s5 3x3/2 then splits by rows on two threads, "
         "0.933x the time of the column split"),
    Knob("blis_weight_dot_tile", {"avx512": (4, 6), "avx2": (2, 6)}, "(MR, NT) of the backward weight pass's "
         "inner-product micro-kernel per ISA: MR*NT vector accumulators + MR + 1 registers (29 of 32 zmm; "
         "15 of 16 ymm)", keyed_by=("isa",)),
    Knob("blis_weight_dot_blocks", (66, 768, 68), "(taps, pixels, filters) per block of the backward weight "
         "pass's inner-product form: its pixel-major panels of x (taps x pixels) and dy (filters x pixels) stay in L2. "
         "Row counts that are not multiples of 16 keep the panels' stride (rows x 64 pixels x 4 bytes) off multiples "
         "of 4 KiB, which put every panel's tile rows in the same L1 sets (Xeon host, 12 inner-product layers of "
         "ResNet-50: geomean 1.39x torch against 1.46x for (64, 1536, 64))"),
    Knob("blis_weight_dot_min_pixels", 784, "the backward weight pass runs in inner-product form (both operands "
         "packed pixel-major by vector copies) for images of at least this many output pixels, where packing "
         "Cols^T tap by tap costs most (prototype on the Xeon host: 1.1-1.5x faster on 28x28 to 112x112 "
         "layers, 1.2-2.2x slower on 14x14 and 7x7)"),
    Knob("blis_weight_taps_min_filters", 16, "the backward weight pass runs in taps form (x read in place "
         "as broadcasts, dy transposed into panels of filters) from this many filters per group: below a vector of "
         "them the panels are mostly padding, and the inner- or outer-product forms serve (depthwise layers)"),
    Knob("blis_weight_taps_pixels", 512, "output pixels per block of the taps form's reduction (whole output rows): "
         "each tile sums a block in registers, and a filter panel of the block (pixels x NR) is reread from L2 by "
         "every tap block (ResNet-50's 23 layers on the Xeon host, 2 threads, x torch in geomean: 128 pixels 1.004, 256 0.930, "
         "512 0.890, 1024 0.881; Zen 4: 512 5-15% faster than 128 on 15 layers)"),
    Knob("blis_pointwise_tap_block", 16, "taps (channel streams) packed together by the pointwise packing "
         "routines", compile_time=True),
    Knob("blis_gather_below_width", 24, "with AVX-512, B is packed from the image by masked gathers when the "
         "output rows are narrower than this (runs of one row cost their clipping and a partial vector each): "
         "one thread, Intel Xeon, 0.35-0.39 ns an element whatever the width, against 0.86-0.89 by rows on 7-wide "
         "rows, 0.55 on 14, 0.36 on 28 and 0.20-0.23 on 56-112", compile_time=True),
    # -- direct ----------------------------------------------------------------------------
    Knob("direct_blockings", _DIRECT_BLOCKINGS, "candidate register blocks of direct "
         "(DirectBlocking rows), per loop-vectoriser width and dtype", keyed_by=("isa", "dtype")),
    Knob("direct_l2_input_budget", _DIRECT_L2_INPUT_BUDGET, "input bytes one direct work item (whole images or a band of rows) may "
         "read: about half of a 1 MB L2, leaving the rest to the weights streaming past"),
    Knob("direct_stream_min_bytes", 16 * 2**20, "direct and depthwise's bands write outputs of at least this many "
         "bytes with non-temporal stores (no read for ownership of each line, caches left alone): half the last-level "
         "cache, which such an output and its input cannot share (Zen 5, 32 MiB L3: the seed shape 9.0 ms against 10.2 "
         "with plain stores; single-channel 3x3 filters 0.80x the time on 2048^2, a 16 MiB output, 0.82x on 4096^2 and "
         "8192^2, 5x5 and 7x7 0.88-0.97x)"),
    Knob("direct_whole_input_max_bytes", 16 * 2**20, "direct gathers padded or strided inputs up to this many bytes "
         "once into padded planes that every work item reads from cache; larger ones are gathered by each work item "
         "into an L2-sized buffer, which needs no copy of the tensor: half the last-level cache, at most 16 MiB"),
    Knob("direct_in_place_max_bytes", UNLIMITED_BYTES, "direct reads stride-1 unpadded inputs up to this many bytes "
         "in place (by default at any size); larger ones are gathered by each work item into an L2-sized buffer. "
         "In place took 0.69-0.91x the time of gathering on 32-128 MiB inputs on a Zen 4 and 0.76-0.88x on 256 MiB "
         "ones on the Xeon host (docs/benchmarks.md, session 40); on Zen 5 gathering had won at 32 MiB (10.3 against "
         "12.5 ms, an earlier kernel): python -m convlib.tune measures both and lowers the limit where gathering wins"),
    Knob("direct_weight_wide_max_row", 64, "the widest output row whose weight pass direct sums as wide rows at "
         "stride 1 and dilation 1 (convlib.cpu.direct_backward) rather than row by row: on rows this short a row's "
         "dot product is mostly its loop's overhead (Intel Xeon, session 42: 0.28-0.64x the time on 7x7 to 56x56 "
         "images with 3x3 filters, 1.06x on MobileNetV2's 112x112 depthwise layer)"),
    Knob("direct_serial_below_flops", 10_000_000, "direct problems with fewer FLOPs (~0.2 ms on one core) "
         "run on one thread: waking the others costs more than it saves"),
    # -- depthwise -------------------------------------------------------------------------
    Knob("depthwise_band_bytes", _DEPTHWISE_BAND_BYTES, "bytes of a depthwise band's gathered input (its phase planes): "
         "half an L2, so a band holds many rows and few are gathered twice (an L1-sized band of a 4096-wide "
         "image held one output row and gathered R input rows for it: 1.1-1.5x slower on the Xeon host); "
         "a tap's run reads L1 within a block and L2 across rows"),
    Knob("depthwise_plane_mask_bytes", _DEPTHWISE_PLANE_MASK_BYTES, "largest tap masks (R*S bytes per output position) of "
         "depthwise's whole-plane way; past it, bands: the masks are read once per plane and should stay in L2"),
    Knob("depthwise_channel_block_min_filters", 16, "depthwise runs channel-blocked (a vector register's width of "
         "channels, transposed in and out of a padded band buffer) from this many filters K; below it, the ways "
         "that vectorise along the width (one-channel image filters)"),
    # Until 2026-11-29 14x14 planes (256, with zmm) and 28x28 too (1024, with ymm) went whole: in
    # session 23 the channel blocks took twice their time there. Re-measured back to back (MobileNetV2's
    # 14x14, 28x28 and 7x7 stride-1 layers at batch 8 and 1, interleaved, `.device/s32/ab_rules.py`),
    # the channel blocks now take 0.58-1.0x the whole planes' time: Zen 5 0.66x (384x14^2) and 0.58x
    # (576x14^2), held to AVX2 0.33-0.72x, the Xeon host at 2, 8 and 16 threads 0.79-1.08x. After a
    # gc.collect() before each call (the bench's cold caches) the two are within 5% on Zen 5, and the
    # Xeon's whole planes won at 2 threads by 10-25%. Layers run back to back in a network, so none is
    # computed whole on either instruction set; the tuner still tries 256, 1024 and 4096.
    Knob("depthwise_whole_plane_max_positions", 0, "depthwise layers of many filters whose planes have more than "
         "one block (64 positions) and at most this many positions (H*W) take the whole-plane way where it applies "
         "(stride 1, output the size of the image) instead of channel blocks: a plane is then a few blocks of "
         "positions, each tap one run read in place, where channel blocks transpose every element in and out "
         "(MobileNetV2's 14x14 stride-1 layers took 0.47-0.53x the time on Zen 5 in 2026-11-27's kernels; back to "
         "back on 2026-11-29's, the channel blocks 0.58-1.0x the whole planes' time, so none by default)"),
    Knob("depthwise_channel_block_bytes", _DEPTHWISE_CHANNEL_BLOCK_BYTES, "bytes of a channel-blocked depthwise "
         "band's input and output buffers together: a fraction of L2, so the R*S taps reread the band from L2"),
    Knob("depthwise_channel_block_window", True, "channel-blocked depthwise steps at column strides 1 and 2 load "
         "each filter row's input vectors once for all their taps and positions (3x3 filters, 4 positions: 18 or 27 "
         "loads for 36 FMAs, against 63 loads and stack reloads; MobileNetV2's layers 0.61-0.98x the time on Zen 5); "
         "False: the general step everywhere", allowed=(True, False)),
    Knob("depthwise_channel_block_ways", 4, "output positions a channel-blocked depthwise step computes "
         "together: independent chains of R*S FMAs hide the FMA latency (a key of the kernel's factory)"),
    Knob("depthwise_gather_bytes", 8 * 1024, "largest phase buffer (one whole plane, de-interleaved) of "
         "depthwise's gathered way; past it, bands. Its masked gathers beat the bands' short row copies on "
         "MobileNetV2's 14x14/2 planes (1.8x) and tie on 28x28/2; on 56x56/2 the bands were 1.3x faster"),
    # -- auto (the CPU rules of convlib.dispatch.select) ---------------------------------------
    Knob("auto_depthwise_max_taps", 49, "auto runs depthwise for groups == C up to this many taps R*S "
         "(its bands' explicit vector FMAs beat direct on 3x3 to 7x7 single-channel filters, 1.1-2.7x on the Xeon "
         "host; larger filters are direct's, whose register blocks reuse each loaded row across the filter's columns)"),
    Knob("auto_thin_filters", 16, "auto runs direct below this many filters per group (GEMM M): too thin "
         "a GEMM to amortise packing"),
    Knob("auto_thin_reduction", 32, "auto runs direct below this reduction C/groups*R*S (GEMM K)"),
    Knob("auto_thin_pointwise_reduction", 16, "... of a pointwise (1x1, stride 1, unpadded) layer, whose packing "
         "for blis is a plain copy (MobileNetV2's 1x1 16>96 and 24>144 expansions on Zen 5: blis 0.36-0.47x "
         "direct's time; 8>64: direct 1.2x faster)"),
    Knob("auto_winograd_min_channels", 32, "auto runs winograd on 3x3 stride-1 layers with at least this "
         "many input and output channels per group"),
    Knob("auto_winograd_min_pixels", 256, "... and at least this many output pixels (GEMM N) to amortise "
         "the filter transform"),
    Knob("auto_winograd_min_image", 1, "... and output images at least this many rows and columns (F(4x4,3x3)'s "
         "tiles cover a 7x7 image as 8x8). 1: ResNet-50's 7x7 layer (s5 3x3 512>512, batch 8) runs faster by "
         "winograd on AVX-512 too since its GEMM is in explicit vectors and its filter transform reads rows "
         "first (Zen 5, 2 threads: 4.9-5.0 ms against blis' 5.5-5.7; before, 6.7 against 5.4), and on AVX2 "
         "(178 against 129 GFLOP/s); the tuner fits it per machine"),
    Knob("auto_direct_max_filters", 256, "auto prefers direct over blis (not pointwise layers) up to this "
         "many filters per group ..."),
    Knob("auto_direct_max_reduction", 512, "... and up to this reduction: packing B costs blis more than "
         "direct's re-reads of the image (ResNet-50's stem)"),
    Knob("auto_direct_weight_max_filters", 8, "auto runs the weight pass of a 3x3 stride-1 layer whose output rows "
         "direct sums as wide rows (direct_weight_wide_max_row) by direct up to this many filters per group, "
         "and with one channel per group at any count: blis's GEMM has few rows there, direct's nine taps share "
         "each dy load (Intel Xeon, session 43: up to 8 filters 0.19-0.84x blis' time on 8x8 to 56x56 images "
         "with 1-16 channels; one channel 0.35-0.92x up to 64 filters; 16 filters over 3-16 channels 0.78-2.3x)"),
    # -- winograd --------------------------------------------------------------------------
    Knob("winograd_chunk_bytes", 4 * 2**20, "target bytes of one chunk's transformed input plus GEMM output "
         "(V + M), derived as a quarter of the last-level cache within 2-8 MiB, so both stay in it between "
         "the three passes; fewer, larger chunks cost fewer parallel regions (8 MiB against 4 on Zen 5's "
         "32 MiB: 0.91x the time on ResNet-50's 28^2 layer, 0.93-0.95x on 112^2x32, 0.98x on 56^2)"),
    Knob("winograd_register_tile", _WINOGRAD_REGISTER_TILE["avx2"], "(MR, NR) of Winograd's GEMM "
         "micro-kernel, derived per instruction set: on AVX-512 8 rows of two zmm (16 accumulators; "
         "Zen 5: 0.79-0.88x the time of the 5x16 tile on ResNet-50's 3x3 stride-1 layers, 12x32 and 8x48 "
         "slower), on AVX2 5 rows of two ymm (10 accumulators and 5 broadcasts in 16 registers)",
         keyed_by=("dtype",)),
    Knob("winograd_filter_block_bytes", 2 * 2**20, "transformed filters one thread computes and multiplies at "
         "a time when the filter transform is fused into the GEMM (calls whose tiles make one chunk), instead of "
         "the whole U going to memory and back (ResNet-50's s5 3x3 512>512 at batch 8 on Zen 5: 0.81x the time "
         "with 1-2 MiB, 0.84x with 4; s4 3x3 256>256 0.96x)"),
    Knob("winograd_keep_workspace_bytes", 64 * 2**20, "Winograd workspace buffers up to this size are kept "
         "per thread between calls (fresh pages cost a fault per 4 KiB)"),
    Knob("winograd_gemm_schedule_chunk", 4, "GEMM items a thread takes at a time under dynamic scheduling"),
    Knob("winograd_parts_per_thread", 4, "work parts per thread in the transforms", compile_time=True),
    Knob("winograd_pass_block", 64, "columns a 1-D transform pass computes into its stack buffer before "
         "storing them", compile_time=True),
], derive=machine_derived_knobs, load_profile=_load_profile)


def blis_blocking(dtype: str) -> BlisBlocking:
    """The :class:`BlisBlocking` for ``dtype`` on this machine's instruction set."""
    return KNOBS.lookup("blis_blocking", (host_isa(), dtype))


def direct_isa() -> str:
    """The key of the direct table for this machine: ``"avx512"`` (32 zmm registers) or ``"avx2"``
    (16 ymm registers; also what a hypervisor that hides AVX-512 leaves)."""
    return host_isa()


def direct_vector_bytes() -> int:
    """Bytes of the vectors direct's kernel is written in: the widest registers (:func:`simd_bytes`),
    whatever width LLVM's loop vectoriser prefers."""
    return simd_bytes()


def direct_blockings(dtype: str) -> tuple[DirectBlocking, ...]:
    """The :class:`DirectBlocking` candidates for ``dtype`` on this machine."""
    return KNOBS.lookup("direct_blockings", (direct_isa(), dtype))


def all_direct_blockings() -> dict:
    """Every row of the direct table (tests run them all, whatever the host)."""
    return dict(_DIRECT_BLOCKINGS)


def all_blis_blockings() -> dict:
    """Every row of the BLIS table (tests check them all, whatever the host)."""
    return dict(_BLIS_BLOCKING)
