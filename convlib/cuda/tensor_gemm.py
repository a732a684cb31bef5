"""The implicit GEMM on tensor cores: ``blis`` in TF32 (when ``allow_tf32`` permits), float16
and bfloat16.

The same product as :mod:`convlib.cuda.gemm` with ``b_source="image"`` (A the filters, B the
column matrix of the image, C written to ``y`` in NCHW), multiplied by the warps' ``mma.sync``
instead of each thread's FMAs (:mod:`convlib.cuda.ptx` has the instructions and their operand
layout):

* Operands are 32-bit *words*: a TF32 value (float32 rounded by ``cvt.rna.tf32.f32``), or two
  half-precision values of consecutive taps. A block stages ``BM x BKW`` words of A and
  ``BKW x BN`` of B per step in one shared array, double-buffered, the next step's words fetched
  into registers while the current ones are multiplied (one barrier a step); with a tile of 3
  or more ``stages`` the channels-last kernel copies its chunks by ``cp.async`` straight into
  shared memory, ``stages - 1`` steps ahead (:func:`_copy_pipeline`). Row strides
  (:class:`~convlib.cuda.tables.MmaTile`) put the words a fragment reads in distinct banks.
* Each warp owns a ``WM x WN`` tile of C: ``WM/16 x WN/8`` products of 16 x 8, four float32
  accumulators each per lane. Per 8 words of depth it loads its A and B fragments from shared
  memory and issues every product.
* The epilogue adds the bias in float32, stages each warp's tile 16 rows at a time in shared
  memory and stores rows of 32 pixels, rounded once to the output dtype.
* Split-K (channels-last kernel only; :func:`convlib.cuda.tiles.choose_mma_split` decides, the
  ``mma_split*`` knobs of :data:`~convlib.cuda.tables.KNOBS` steer it): where a tile's grid
  fills too little of one wave of blocks, ``splits`` blocks along grid ``z`` (part ``z %
  splits`` of group ``z // splits``) each run a contiguous run of whole steps (part ``p``
  starts at step ``p * K_TILES // splits``) and the epilogue stores their float32 sums as they
  are, without bias, to a float32 workspace of ``splits`` outputs laid out as ``y``
  (``blis.workspace_bytes`` counts it). :func:`split_sum_kernel` then adds the parts in order
  (part 0 first: the same result every run), adds the bias in float32 and rounds once, as the
  unsplit epilogue does. With ``splits == 1`` the source is the unsplit kernel's, unchanged.
  On an H200 at batch 128 the rule cuts ResNet-50's stage-5 7x7 3x3 layers (196 blocks of
  128 x 128 for 264 slots) into 4 parts (784 blocks, three full waves): float16 3x3 0.189 ->
  0.155 ms, 3x3/2 0.206 -> 0.185 (against 64 x 128 whole tiles before; whole 128 x 128 tiles
  gave 0.155 and 0.192), TF32 0.374 -> 0.259 and 0.403 -> 0.317 (whole 128 x 128: 0.286,
  0.351); 2 or 3 parts were slower than whole tiles (``docs/gpu.md``).

How the operands are read (:func:`operand_layout`) is the difference between three kernels:

``"pixels"`` (:func:`channels_last_source` with ``pixels=True``)
    1x1, stride-1, unpadded layers whose pixel counts and channels fill 16-byte chunks: B is the
    image itself, read in 16-byte chunks of pixels, A the filters as they are.
``"channels_last"`` (:func:`channels_last_source`)
    Channels per group a multiple of 8 (4 in TF32): :func:`layout_kernels` copy the image to
    NHWC words and the filters to ``(K, R, S, C/groups)``; 16-byte chunks of channels, one tap
    decode per chunk, fragments by ``ldmatrix``.
``"nchw"`` (:func:`mma_source`)
    Anything else: B gathered from the NCHW image element by element, as the FP32 kernel does.

So the half precisions are multiplied exactly (a product of two half values is exact in float32)
and summed in float32, as cuDNN does; TF32 rounds each operand to 10 mantissa bits (relative
error about 3e-4, like cuDNN's TF32).

Under numba-cuda's simulator the same kernels run with the warp instructions emulated
(:func:`convlib.cuda.ptx.simulated_mma`, :func:`~convlib.cuda.ptx.simulated_ldmatrix`): each
first stores every lane's operand words in shared memory and synchronises.

Cost of a new shape: every size except the batch is a compile-time constant, so a new layer shape
compiles a new kernel, plus the two small layout kernels for channels-last. numba's own passes
dominate (its SSA pass grows with the branches of the unrolled code): for 64 x 64 warp tiles about
3 s for the chunked kernels and 15 s for the element-by-element ``"nchw"`` kernel on the
development machine's CPU (``cuda.compile_ptx``, no GPU needed), 3-17 s per layer measured as
first calls on the GPU machine before the epilogue's rows became a loop.
"""

from __future__ import annotations

import functools

import numpy as np

from .codegen import compile_kernel, indent, unsigned_constants
from .gemm import build_tap_table, gather_lines, image_column_setup, image_constants
from .launch import scalar_type
from .ptx import ELEMENTS_PER_WORD, FRAGMENT_WORDS, instructions
from .tables import MmaTile


def precision_of(dtype: str, allow_tf32: bool) -> str | None:
    """The tensor-core precision a problem of ``dtype`` runs in: ``"float16"`` and
    ``"bfloat16"`` for those dtypes, ``"tf32"`` for float32 when TF32 is allowed, else None."""
    if dtype in ("float16", "bfloat16"):
        return dtype
    if dtype == "float32" and allow_tf32:
        return "tf32"
    return None


def mma_source(key, tile: MmaTile, precision: str, simulator: bool = False,
               tap_table_bytes: int = 0) -> tuple[str, dict]:
    """The ``"nchw"`` kernel's source and constants: B gathered element by element from the NCHW
    image (the FP32 kernel's gather lines, with the tap table), staged ``[k word][n]``; A from
    the filters element by element."""
    epw = ELEMENTS_PER_WORD[precision]
    half = epw == 2
    BM, BN, BKW, WM, WN = tile.BM, tile.BN, tile.BKW, tile.WM, tile.WN
    BK = BKW * epw  # taps per step
    AS, BS = tile.a_stride, tile.b_stride
    threads = tile.threads
    a_row_step, b_row_step = threads // BKW, threads // BN
    M, KK = key.gemm_m, key.gemm_k
    check_m = M % BM != 0
    check_k = KK % BK != 0
    tap_table = build_tap_table(key, BK, tap_table_bytes) if key.R * key.S > 1 else None
    # Half values are loaded as their bits (the arrays are passed as uint16), TF32 words rounded.
    convert = "U32({})" if half else "tf32_word({})"

    fetch = []
    for i in range(tile.a_per_thread):
        parts = []
        for e in range(epw):
            cond = []
            if check_m:
                cond.append(f"a_m + U({a_row_step * i}) < M_LEFT")
            if check_k:
                cond.append(f"a_k + k0 + U({e}) < KK")
            load = convert.format(f"w[a_src + k0 + U({a_row_step * i * KK + e})]")
            parts.append(f"({load} if {' and '.join(cond)} else ZERO32)" if cond else load)
        word = parts[0] if not half else f"U32({parts[0]} | ({parts[1]} << U32(16)))"
        fetch.append(f"a_next_{i} = {word}")
    for i in range(tile.b_per_thread):
        for e in range(epw):
            fetch.append(f"k = k0 + b_k + U({b_row_step * i * epw + e})")
            fetch += gather_lines(key, tap_table, check_k, f"b_elt_{e}", "b", convert, "ZERO32")
        fetch.append(f"b_next_{i} = U32(b_elt_0 | (b_elt_1 << U32(16)))" if half else f"b_next_{i} = b_elt_0")

    store = [f"a_stage[a_write + U({a_row_step * i * AS})] = a_next_{i}" for i in range(tile.a_per_thread)]
    store += [f"b_stage[b_write + U({b_row_step * i * BS})] = b_next_{i}" for i in range(tile.b_per_thread)]

    multiply = _products(tile, precision, simulator, a_ldmatrix=False, b_mode="words")
    epilogue = _epilogue(key, tile, precision, check_m, simulator)

    setup = [
        f"# This thread's share of each A step: word column a_kw, rows a_m + {a_row_step}*i.",
        "a_kw = tid % BKW",
        "a_m = tid // BKW",
        "a_k = a_kw * EPW",
        "a_src = (g * M + m0 + a_m) * KK + a_k",
        "a_store = a_m * A_STRIDE + a_kw",
        f"# Its share of each B step: column b_n (one output pixel), word rows b_kw + {b_row_step}*i.",
        "b_n = tid % BN",
        "b_kw = tid // BN",
        "b_k = b_kw * EPW",
        "b_store = B_BASE + b_kw * B_STRIDE + b_n",
        "n = n0 + b_n",
        "col_ok = n < ngemm",
        "img = n // PQ",
        "pq = n - img * PQ",
        *image_column_setup(key, tap_table),
    ]
    fragments = ["a_read = stage * A_STAGE + (warp_m + lg) * A_STRIDE + lt",
                 "b_read = B_BASE + stage * B_STAGE + lt * B_STRIDE + warp_n + lg"]
    source = _assemble(tile, simulator, "IN b: flat x (N*C*H*W; uint16 bits for half dtypes); IN w (K*KK, likewise)",
                       "2 stages x BKW rows x B_STRIDE words of B", setup, fetch, store, fragments, multiply, epilogue,
                       tap=tap_table is not None)
    constants = unsigned_constants(
        BM=BM, BN=BN, STEP=BK, BKW=BKW, WM=WM, WN=WN, WARPS_N=BN // WN, EPW=epw, M=M, KK=KK,
        PQ=key.P * key.Q, KPQ=key.K * key.P * key.Q, ONE=1, K_TILES=-(-KK // BK),
        A_STRIDE=AS, B_STRIDE=BS, A_STAGE=BM * AS, B_STAGE=BKW * BS,
    )
    constants.update(image_constants(key))
    constants.update(_word_constants(simulator, precision))
    constants.update(SHARED_WORDS=tile.shared_words, B_BASE=np.uint64(tile.stages * BM * AS), TAP=tap_table)
    return source, constants


def channels_last_eligible(problem, precision: str) -> bool:
    """Whether the channels-last kernel serves ``problem``: each group's channels fill whole
    16-byte chunks (4 float32 or 8 half channels). Every :class:`~convlib.cuda.tables.MmaTile`
    that passes its ``check`` divides its chunks among its threads."""
    return problem.C_per_group % (4 * ELEMENTS_PER_WORD[precision]) == 0


def operand_layout(problem, precision: str) -> str:
    """How the tensor-core kernel for ``problem`` reads its operands: ``"pixels"`` (in place,
    16-byte chunks of pixels), ``"channels_last"`` (16-byte chunks of channels of copies the
    layout kernels make) or ``"nchw"`` (element by element)."""
    if contiguous_pixels_eligible(problem, precision):
        return "pixels"
    return "channels_last" if channels_last_eligible(problem, precision) else "nchw"


def contiguous_pixels_eligible(problem, precision: str) -> bool:
    """Whether B's columns are the image's own pixels in chunks: a 1x1, stride-1, unpadded
    convolution whose images' pixel counts and channels per group fill 16-byte chunks. Then the
    column matrix of an image is the image itself (``C x H*W``) and the filters' rows are already
    ``k``-contiguous: the chunked kernel reads both in place, with no layout kernels."""
    chunk = 4 * ELEMENTS_PER_WORD[precision]
    return (problem.R == problem.S == 1 and problem.stride == (1, 1) and not any(problem.padding)
            and (problem.H * problem.W) % chunk == 0 and problem.C_per_group % chunk == 0)


def channels_last_source(key, tile: MmaTile, precision: str, simulator: bool = False,
                         pixels: bool = False, splits: int = 1) -> tuple[str, dict]:
    """The chunked kernels' source and constants: channels-last, or (``pixels``) in place for
    the problems of :func:`contiguous_pixels_eligible`.

    Channels-last:

    Its operands come prepared (:func:`layout_kernels`): the image as NHWC words and the filters
    as ``(K, R, S, C/groups)`` words, TF32 already rounded. The reduction runs over ``k = (r, s,
    c)``, so a 16-byte chunk of four words is four (TF32) or eight (half) channels of one pixel
    and one tap: one aligned vector load, one tap decode and one bounds check per chunk, where the
    NCHW kernel pays a load, a decode and a check per element. B is staged ``[n][k word]`` with
    A's stride, so its fragments read like A's.

    In place (``pixels``): A is the filters as they are; B's unit is one word row (two channels
    in half precision) of 8 (4 for TF32) consecutive pixels of one image: two 16-byte loads whose
    halves interleave into 8 words (one load of 4 words rounded for TF32), staged ``[k word][n]``
    like the NCHW kernel's.

    Split-K (``splits`` > 1, channels-last only): block ``z`` of the grid is part ``z % splits``
    of group ``z // splits``; the part runs its own contiguous run of whole steps and stores its
    float32 sums, without bias, to ``y`` (then a float32 workspace of ``splits`` outputs, one per
    part, each laid out as ``y``), for :func:`split_sum_kernel` to add up.
    """
    if splits > 1 and pixels:
        raise ValueError("split-K serves the channels-last kernel only")
    epw = ELEMENTS_PER_WORD[precision]
    BM, BN, BKW = tile.BM, tile.BN, tile.BKW
    AS = tile.a_stride
    CPR = BKW // 4  # chunks per staged row
    threads = tile.threads
    row_step = threads // CPR
    M = key.gemm_m
    CGW = key.C_per_group // epw
    KKW = key.R * key.S * CGW
    check_m = M % BM != 0
    check_k = KKW % BKW != 0
    copying = tile.stages > 2
    if copying and pixels:
        raise ValueError("the in-place kernel stages its operands through registers (two stages)")

    # A: chunk j4/4 of filter rows a_row + row_step*i.
    a_chunks = [(([f"a_row + U({row_step * i}) < M_LEFT"] if check_m else []) + (["kw < KKW"] if check_k else []),
                 f"(a_src + U({row_step * i})) * KKW + kw", f"a_write + U({row_step * i * AS})")
                for i in range(BM * CPR // threads)]
    fetch, store = ["kw = k0 + j4"], []
    for i, (cond, index, target) in enumerate(a_chunks):
        names = [f"a_next_{i}_{j}" for j in range(4)]
        if copying:
            fetch += _copy_lines(target, "w", index, cond)
            continue
        rounding = ([f"{name} = tf32_word(bits_value({name}))" for name in names]  # the filters as they are
                    if pixels and precision == "tf32" else [])
        fetch += _chunk_load(names, "w", index, cond, rounding)
        store.append(f"store4(a_stage, {target}, {', '.join(names)})")
    if pixels:
        fetch_b, store_b, columns = _pixel_units(key, tile, precision, check_k)
    else:
        fetch_b, store_b, columns = _channel_chunks(key, tile, check_k, copying)
    fetch += fetch_b
    store += store_b
    multiply = _products(tile, precision, simulator, a_ldmatrix=True, b_mode="words" if pixels else "ldmatrix")
    epilogue = _epilogue(key, tile, precision, check_m, simulator, partial=splits > 1)
    # B's fragments: ldmatrix rows of pixels (channels-last), or words read [k word][n] (pixels)
    b_fragments = ("b_read = B_BASE + stage * B_STAGE + lt * B_STRIDE + warp_n + lg" if pixels else
                   "b_matrix_rows = (B_BASE + stage * B_STAGE + (warp_n + (lane & U(7)) + (lane >> U(4)) * U(8))"
                   " * A_STRIDE + ((lane >> U(3)) & U(1)) * U(4))")
    setup = [
        f"# This thread's chunks of each step: chunk j4/4 of rows a_row + {row_step}*i of A"
        + ("." if pixels else f" and of pixels b_row + {row_step}*i of B."),
        "j4 = (tid % CPR) * U(4)",
        "a_row = tid // CPR",
        "b_row = a_row",
        "a_src = g * M + m0 + a_row",
        "a_store = a_row * A_STRIDE + j4",
        "b_store = " + ("B_BASE + (tid // PIXEL_UNITS) * B_STRIDE + (tid % PIXEL_UNITS) * (BN // PIXEL_UNITS)"
                        if pixels else "B_BASE + b_row * A_STRIDE + j4"),
        *columns,
    ]
    fragments = [
        "# ldmatrix rows: lane l names row (l & 7) + 8 * ((l >> 3) & 1), words 4 * (l >> 4) of",
        "# A's 16 x 8 fragment, and pixel (l & 7) + 8 * (l >> 4), words 4 * ((l >> 3) & 1) of two",
        "# products' B (see convlib.cuda.ptx).",
        "a_matrix_rows = stage * A_STAGE + (warp_m + (lane & U(7)) + (lane & U(8))) * A_STRIDE + (lane >> U(4)) * U(4)",
        b_fragments,
    ]
    operands = ("IN b: the image as uint32 words (pairs of pixels in half precision); IN w: the filters likewise"
                if pixels else "IN b: the image as NHWC words (N*H*W*C/EPW); IN w: filters as (K, R, S, C/groups) words")
    b_stage = (f"{tile.stages} stages x BKW rows x B_STRIDE words of B" if pixels
               else f"{tile.stages} stages x BN pixels x A_STRIDE words of B")
    source = _assemble(tile, simulator, operands, b_stage, setup, fetch, store, fragments, multiply, epilogue,
                       splits=splits)
    constants = unsigned_constants(
        BM=BM, BN=BN, STEP=BKW, BKW=BKW, WM=tile.WM, WN=tile.WN, WARPS_N=BN // tile.WN, M=M, KKW=KKW, CGW=CGW,
        CW=key.C // epw, HWCW=key.H * key.W * key.C // epw, CPR=CPR, PQ=key.P * key.Q,
        KPQ=key.K * key.P * key.Q, ONE=1, K_TILES=-(-KKW // BKW), A_STRIDE=AS, A_STAGE=BM * AS,
        B_STAGE=BKW * tile.b_stride if pixels else BN * AS, B_STRIDE=tile.b_stride,
        PIXEL_UNITS=BN // (4 * epw), CGHW_WORDS=key.C_per_group * key.H * key.W // epw,
        CHW_WORDS=key.C * key.H * key.W // epw, HW_WORDS=key.H * key.W // epw,
        STAGES=tile.stages, AHEAD=tile.stages - 1,
    )
    constants.update(image_constants(key))
    constants.update(_word_constants(simulator, precision))
    constants.update(SHARED_WORDS=tile.shared_words, B_BASE=np.uint64(tile.stages * BM * AS), SIXTEEN=np.uint32(16))
    if splits > 1:
        constants.update(SPLITS=np.uint64(splits))
    return source, constants


def copies_chunks(layout: str) -> bool:
    """Whether the kernel of ``layout`` (:func:`operand_layout`) copies its operands to shared
    memory by ``cp.async`` (tiles of 3 or more stages): the channels-last kernel, whose chunks
    move as they are. (The in-place kernel interleaves its B in registers, and rounds its
    filters in TF32; staging its B as it lies, read by ``ldmatrix.trans``, was slower on an
    H200: ``docs/gpu.md``.)"""
    return layout == "channels_last"


def _chunk_load(names: list[str], array: str, index: str, cond: list[str], after=()) -> list[str]:
    """Generated lines loading the chunk ``array[index:index + 4]`` into the registers ``names``
    (then the lines ``after``), or zeros unless every condition of ``cond`` holds."""
    load = [f"{', '.join(names)} = load4({array}, {index})", *after]
    if not cond:
        return load
    return [f"if {' and '.join(cond)}:", *("    " + line for line in load), "else:",
            f"    {' = '.join(names)} = ZERO32"]


def _copy_lines(target: str, array: str, index: str, cond: list[str]) -> list[str]:
    """Generated lines copying the chunk ``array[index:index + 4]`` to ``a_stage[target...]``
    by ``cp.async``, or zeros unless every condition of ``cond`` holds (then the index is 0,
    so no address outside the array is formed)."""
    if not cond:
        return [f"copy16(a_stage, {target}, {array}, {index}, SIXTEEN)"]
    return [f"ok = {' and '.join(cond)}",
            f"copy16(a_stage, {target}, {array}, ({index}) if ok else U(0), SIXTEEN if ok else ZERO32)"]


def _channel_chunks(key, tile: MmaTile, check_k: bool, copying: bool):
    """Generated fetch, store and setup lines of the channels-last kernel's B (see
    :func:`channels_last_source`): this thread's chunks are chunk ``j4 / 4`` of pixels
    ``b_row + step * i``, read from the NHWC words at the step's tap, into registers and then
    the stage, or (``copying``) copied straight to the stage by ``cp.async`` (no store lines)."""
    chunks_per_row = tile.BKW // 4
    step = tile.threads // chunks_per_row
    padded = any(key.padding)
    fetch = ["tap = kw // CGW", "cw = kw - tap * CGW", "r = tap // S", "s = tap - r * S",
             "ih_shift = I(r * DH)", "iw_shift = I(s * DW)"]
    store, columns = [], []
    for i in range(tile.BN * chunks_per_row // tile.threads):
        cond = [f"col_ok_{i}"] + (["kw < KKW"] if check_k else []) + (["U(ih) < H", "U(iw) < W"] if padded else [])
        index = f"pix_{i} + (U(ih) * W + U(iw)) * CW + cw"
        target = f"b_write + U({step * i * tile.a_stride})"
        fetch += [f"ih = ih0_{i} + ih_shift", f"iw = iw0_{i} + iw_shift"]
        if copying:
            fetch += _copy_lines(target, "b", index, cond)
        else:
            names = [f"b_next_{i}_{j}" for j in range(4)]
            fetch += _chunk_load(names, "b", index, cond)
            store.append(f"store4(b_stage, {target}, {', '.join(names)})")
        columns += [
            f"n = n0 + b_row + U({step * i})",
            f"col_ok_{i} = n < ngemm",
            "img = n // PQ",
            "pq = n - img * PQ",
            "p = pq // Q",
            "q = pq - p * Q",
            f"ih0_{i} = I(p * SH) - TOP",
            f"iw0_{i} = I(q * SW) - LEFT",
            f"pix_{i} = img * HWCW + g * CGW",
        ]
    return fetch, store, columns


def _pixel_units(key, tile: MmaTile, precision: str, check_k: bool):
    """Generated fetch, store and setup lines of the in-place kernel's B (see
    :func:`channels_last_source`): this thread's units are word rows ``b_kw + step * i`` of its
    pixel group (``pixels`` consecutive pixels of one image)."""
    half = ELEMENTS_PER_WORD[precision] == 2
    pixels = 8 if half else 4
    units_per_row = tile.BN // pixels
    if (tile.BKW * units_per_row) % tile.threads or tile.threads % units_per_row:
        # Each thread loads whole units of B; a remainder would be left unloaded (a wrong product).
        raise ValueError(f"{tile}: the in-place kernel needs BKW * BN / {pixels} units of {pixels} pixels to divide "
                         f"among its {tile.threads} threads; choose another tile (the mma_tile knob)")
    step = tile.threads // units_per_row
    units = tile.BKW * units_per_row // tile.threads
    BS = tile.b_stride
    columns = [
        "b_group = tid % PIXEL_UNITS",
        "b_kw = tid // PIXEL_UNITS",
        f"n = n0 + b_group * U({pixels})",
        "b_ok = n < ngemm",  # the whole group: the images' pixel counts are multiples of it
        "img = n // PQ",
        # the group's first pixel, in words: images C*H*W apart, channel pairs (k words) H*W apart
        f"b_src = img * CHW_WORDS + g * CGHW_WORDS + (n - img * PQ) // U({2 if half else 1})",
    ]
    fetch, store = [], []
    for i in range(units):
        cond = ["b_ok"] + ([f"k0 + b_kw + U({step * i}) < KKW"] if check_k else [])
        names = [f"b_next_{i}_{j}" for j in range(pixels)]
        row = f"k0 + b_kw + U({step * i})"
        fetch.append(f"if {' and '.join(cond)}:")
        if half:
            # word row kw holds channels 2kw (low halves) and 2kw + 1 (high) of 8 pixels
            fetch += [f"    lo0, lo1, lo2, lo3 = load4(b, b_src + ({row}) * U(2) * HW_WORDS)",
                      f"    hi0, hi1, hi2, hi3 = load4(b, b_src + (({row}) * U(2) + U(1)) * HW_WORDS)"]
            for j in range(4):
                fetch += [f"    {names[2 * j]} = U32((lo{j} & U32(0xFFFF)) | (hi{j} << U32(16)))",
                          f"    {names[2 * j + 1]} = U32((lo{j} >> U32(16)) | (hi{j} & U32(0xFFFF0000)))"]
        else:
            fetch.append(f"    v0, v1, v2, v3 = load4(b, b_src + ({row}) * HW_WORDS)")
            fetch += [f"    {names[j]} = tf32_word(bits_value(v{j}))" for j in range(4)]
        fetch += ["else:", f"    {' = '.join(names)} = ZERO32"]
        for half_unit in range(pixels // 4):
            words = ", ".join(names[4 * half_unit:4 * half_unit + 4])
            store.append(f"store4(b_stage, b_write + U({step * i * BS + 4 * half_unit}), {words})")
    return fetch, store, columns


def _assemble(tile: MmaTile, simulator: bool, operands: str, b_stage: str, setup, fetch, store, fragments,
              multiply, epilogue, tap: bool = False, splits: int = 1) -> str:
    """The kernel every tensor-core source shares, around its generated parts: ``setup`` (this
    thread's share of the steps), ``fetch`` (the next step into registers, from ``k0``; a step
    is ``STEP`` taps or words), ``store`` (registers to the stage ``a_write`` / ``b_write``),
    ``fragments`` (the stage's fragment addresses), ``multiply`` and ``epilogue``. With more
    than two stages ``fetch`` holds the step's ``cp.async`` copies and ``store`` nothing. With
    ``splits`` > 1 (split-K) block ``z`` is part ``z % SPLITS`` of group ``z // SPLITS`` and runs
    steps ``kt_first..`` (``steps`` of them: part ``p`` of ``SPLITS`` starts at step
    ``p * K_TILES // SPLITS``)."""
    MT, NT = tile.WM // 16, tile.WN // 8
    align = "" if simulator else ", alignment=16"
    exchange = []
    if simulator:  # the emulated warp instructions exchange operands here (convlib.cuda.ptx)
        exchange = [f"words = cuda.shared.array({tile.warps * 32 * FRAGMENT_WORDS}, uint32)",
                    f"warp_words = warp * U({32 * FRAGMENT_WORDS})",
                    f"lane_words = warp_words + lane * U({FRAGMENT_WORDS})"]
    split = splits > 1
    loop = (_copy_pipeline(tile.stages, fetch, fragments, multiply, split) if tile.stages > 2
            else _register_pipeline(fetch, store, fragments, multiply, split))
    group = "g = U(cuda.blockIdx.z)"
    if split:
        group = "\n    ".join([
            "part = U(cuda.blockIdx.z) % SPLITS",
            "g = U(cuda.blockIdx.z) // SPLITS",
            "# this part's steps: a contiguous run of whole steps",
            "kt_first = part * K_TILES // SPLITS",
            "steps = (part + ONE) * K_TILES // SPLITS - kt_first"])
    tap_line = "    tap = cuda.const.array_like(TAP)   # (c*H*W + r*dh*W + s*dw, r*dh << 16 | s*dw) per k" if tap else ""
    return f'''
def mma_gemm(b, w, bias, y, n_images):
    # {operands}; IN bias (K,); OUT y (N*K*P*Q)
    # {tile.stages} stages x BM rows x A_STRIDE words of A, then {b_stage}
    a_stage = cuda.shared.array(SHARED_WORDS, uint32{align})
    b_stage = a_stage
{tap_line}
    tid = U(cuda.threadIdx.x)
    n0 = U(cuda.blockIdx.x) * BN
    m0 = U(cuda.blockIdx.y) * BM
    {group}
    ngemm = U(n_images) * PQ
    M_LEFT = M - m0
    lane = tid % U(32)
    warp = tid // U(32)
    lg = lane >> U(2)
    lt = lane & U(3)
{indent(exchange, 1)}
    # The warp's tile of C: rows warp_m.., columns warp_n.. of the block's.
    warp_m = (warp // WARPS_N) * WM
    warp_n = (warp % WARPS_N) * WN
{indent(setup, 1)}
{indent([f"acc_{mi}_{nj}_{r} = zero" for mi in range(MT) for nj in range(NT) for r in range(4)], 1)}
{indent(loop, 1)}
    m_row = warp_m + lg
    bias_row = g * M + m0 + m_row
{indent(epilogue, 1)}
'''


def _register_pipeline(fetch, store, fragments, multiply, split: bool = False) -> list[str]:
    """The main loop of two stages: the next step fetched into registers during the products
    and stored into the other stage after them; one barrier a step. ``split``: over the steps
    ``kt_first..`` (``steps`` of them) instead of all ``K_TILES``."""
    count, first = ("steps", "kt_first + ") if split else ("K_TILES", "")
    return [
        "k0 = kt_first * STEP" if split else "k0 = U(0)",
        *fetch,
        "a_write = a_store",
        "b_write = b_store",
        *store,
        "cuda.syncthreads()",
        f"for kt in range({count}):",
        f"    has_next = kt + ONE < {count}",
        "    if has_next:",
        f"        k0 = ({first}kt + ONE) * STEP",
        *("        " + line for line in fetch),
        "    stage = kt & ONE",
        *("    " + line for line in fragments),
        *("    " + line for line in multiply),
        "    if has_next:",
        "        a_write = (stage ^ ONE) * A_STAGE + a_store",
        "        b_write = (stage ^ ONE) * B_STAGE + b_store",
        *("        " + line for line in store),
        "    cuda.syncthreads()",
    ]


def _copy_pipeline(stages: int, copies, fragments, multiply, split: bool = False) -> list[str]:
    """The main loop of ``stages`` stages: ``copies`` (issued from ``k0`` into ``a_write`` /
    ``b_write``) run ``stages - 1`` steps ahead as one ``cp.async`` group per step. Step ``kt``
    waits for its own group (at most ``stages - 2`` younger ones still in flight), and the
    barrier after the wait both publishes every thread's copies and tells that step ``kt - 1``'s
    stage, which the copies of step ``kt + stages - 1`` overwrite, has been read. One barrier a
    step, as with two stages; the last one before the epilogue reuses the stages. ``split``:
    over the steps ``kt_first..`` (``steps`` of them) instead of all ``K_TILES``."""
    count, first = ("steps", "kt_first + ") if split else ("K_TILES", "")
    lines = []
    for s in range(stages - 1):
        lines += [
            f"if U({s}) < {count}:",
            f"    k0 = ({first}U({s})) * STEP" if split else f"    k0 = U({s}) * STEP",
            f"    a_write = U({s}) * A_STAGE + a_store",
            f"    b_write = U({s}) * B_STAGE + b_store",
            *("    " + line for line in copies),
            "copy_commit()",
        ]
    return lines + [
        f"for kt in range({count}):",
        f"    copy_wait_{stages - 2}()",
        "    cuda.syncthreads()",
        "    ahead = kt + AHEAD",
        f"    if ahead < {count}:",
        f"        k0 = ({first}ahead) * STEP" if split else "        k0 = ahead * STEP",
        "        slot = ahead % STAGES",
        "        a_write = slot * A_STAGE + a_store",
        "        b_write = slot * B_STAGE + b_store",
        *("        " + line for line in copies),
        "    copy_commit()",  # every step commits, empty or not: the wait counts groups
        "    stage = kt % STAGES",
        *("    " + line for line in fragments),
        *("    " + line for line in multiply),
        "copy_wait_0()",
        "cuda.syncthreads()",
    ]


def _word_constants(simulator: bool, precision: str) -> dict:
    """Names every tensor-core kernel's source uses: word and float types, zeros, the
    instructions (:func:`convlib.cuda.ptx.instructions`)."""
    uint32 = np.uint32 if simulator else scalar_type("uint32")
    constants = dict(uint32=uint32, U32=uint32, zero=np.float32(0), ZERO32=np.uint32(0), PRECISION=precision)
    constants.update(instructions(simulator))
    return constants


@functools.lru_cache(maxsize=None)
def layout_kernels(key, precision: str, simulator: bool = False):
    """The two kernels that prepare the channels-last kernel's operands, for the problem shape
    ``key`` in ``precision``.

    Returns
    -------
    to_channels_last(x, xt, n_images)
        ``x`` (N, C, H*W) flat -> ``xt`` (N, H*W, C) flat: 32 x 32 tiles through shared memory,
        so both sides are read and written along rows. Launch with grid ``(ceil(HW/32),
        ceil(C/32), min(N, 65535))`` and block ``(32, 8)``.
    filters_channels_last(w, wt)
        ``w`` (K, C/groups, R*S) flat -> ``wt`` (K, R*S, C/groups) flat; one thread per element.

    TF32 values are rounded (``cvt.rna.tf32.f32``) as they are written, as words; half values
    move as bits.
    """
    tf32 = precision == "tf32"
    convert = "tf32_word({})" if tf32 else "{}"
    source = f'''
def to_channels_last(x, xt, n_images):
    tile = cuda.shared.array(1056, word)   # 32 x 33: a column read across rows hits 32 banks
    tx = U(cuda.threadIdx.x)
    ty = U(cuda.threadIdx.y)
    p0 = U(cuda.blockIdx.x) * U(32)
    c0 = U(cuda.blockIdx.y) * U(32)
    img = U(cuda.blockIdx.z)
    while img < U(n_images):
        for i in range(4):
            c = c0 + ty + U(8) * U(i)
            p = p0 + tx
            if c < C and p < HW:
                tile[(ty + U(8) * U(i)) * U(33) + tx] = {convert.format("x[img * CHW + c * HW + p]")}
        cuda.syncthreads()
        for i in range(4):
            p = p0 + ty + U(8) * U(i)
            c = c0 + tx
            if p < HW and c < C:
                xt[img * CHW + p * C + c] = tile[tx * U(33) + ty + U(8) * U(i)]
        cuda.syncthreads()
        img += U(cuda.gridDim.z)


def filters_channels_last(w, wt):
    i = U(cuda.grid(1))
    if i < FILTER_ELEMENTS:
        c = i % CG
        rest = i // CG
        rs = rest % RS
        k = rest // RS
        wt[i] = {convert.format("w[(k * CG + c) * RS + rs]")}
'''
    constants = unsigned_constants(C=key.C, HW=key.H * key.W, CHW=key.C * key.H * key.W, CG=key.C_per_group,
                                   RS=key.R * key.S, FILTER_ELEMENTS=key.K * key.C_per_group * key.R * key.S)
    constants.update(_word_constants(simulator, precision))
    constants["word"] = constants["uint32"] if tf32 else (np.uint16 if simulator else scalar_type("uint16"))
    return (compile_kernel(source, "to_channels_last", constants, simulator=simulator),
            compile_kernel(source, "filters_channels_last", constants, simulator=simulator))


def _products(tile: MmaTile, precision: str, simulator: bool, a_ldmatrix: bool, b_mode: str) -> list[str]:
    """Generated lines of one staged step: each warp's fragments read from shared memory and
    every product issued. A is staged ``[m][k word]``, its fragments read by ``ldmatrix`` (rows
    set up in ``a_matrix_rows``) or word by word (from ``a_read``). B (``b_mode``) is staged
    ``[n][k word]`` with A's stride and read by ``ldmatrix`` (``"ldmatrix"``, from
    ``b_matrix_rows``; the channels-last kernel), or staged ``[k word][n]`` and read word by
    word (``"words"``, from ``b_read``)."""
    AS = tile.a_stride
    BS = {"ldmatrix": tile.a_stride, "words": tile.b_stride}[b_mode]
    MT, NT = tile.WM // 16, tile.WN // 8
    lines = []

    def ldmatrix(names, index):
        if simulator:
            return [f"words[warp_words + lane] = U32({index})", "cuda.syncthreads()",
                    f"{', '.join(names)} = ldmatrix_lane(a_stage, words, warp_words, lane)", "cuda.syncthreads()"]
        return [f"{', '.join(names)} = ldmatrix4(a_stage, {index})"]

    for ks in range(tile.BKW // 8):
        for mi in range(MT):
            base = mi * 16 * AS + ks * 8
            names = [f"a{mi}_{r}" for r in range(4)]
            if a_ldmatrix:  # the whole 16 x 8 fragment in one ldmatrix
                lines += ldmatrix(names, f"a_matrix_rows + U({base})")
            else:
                lines += [f"{name} = a_stage[a_read + U({base + offset})]"
                          for name, offset in zip(names, (0, 8 * AS, 4, 8 * AS + 4))]
        if b_mode == "ldmatrix":  # two products' B per ldmatrix
            for pair in range(0, NT, 2):
                names = [f"b{pair}_0", f"b{pair}_1", f"b{pair + 1}_0", f"b{pair + 1}_1"]
                lines += ldmatrix(names, f"b_matrix_rows + U({pair * 8 * BS + ks * 8})")
        else:
            for nj in range(NT):
                base = ks * 8 * BS + nj * 8
                lines += [f"b{nj}_{r} = b_stage[b_read + U({base + offset})]" for r, offset in enumerate((0, 4 * BS))]
        for mi in range(MT):
            for nj in range(NT):
                acc = ", ".join(f"acc_{mi}_{nj}_{r}" for r in range(4))
                operands = [f"a{mi}_{r}" for r in range(4)] + [f"b{nj}_{r}" for r in range(2)]
                if simulator:
                    lines += [f"words[lane_words + U({r})] = {op}" for r, op in enumerate(operands)]
                    lines += ["cuda.syncthreads()",
                              f"{acc} = mma_lane(PRECISION, words, warp_words, lane, {acc})",
                              "cuda.syncthreads()"]
                else:
                    lines.append(f"{acc} = mma_{precision}({', '.join(operands)}, {acc})")
    return lines


#: A bias element as a float32 value, per precision (half biases are stored as their bits).
_BIAS_VALUE = {"float16": "float16_value(bias[{}])", "bfloat16": "bits_value(U32(bias[{}]) << U32(16))",
               "tf32": "bias[{}]"}
#: A float32 value rounded once to the output dtype's bits (TF32 outputs stay float32).
_ROUNDED = {"float16": "float16_bits({})", "bfloat16": "bfloat16_bits({})"}


def _epilogue(key, tile: MmaTile, precision: str, check_m: bool, simulator: bool, partial: bool = False) -> list[str]:
    """Generated lines adding the bias to each lane's accumulators and storing them, rounded to
    the output dtype, in NCHW.

    A lane's accumulators are scattered over 16 rows (two values per row 8 columns apart per
    product): stored as they are, a warp's store would write 8 rows x 4 pairs of 2-byte values.
    So each warp stages 16 rows of its tile at a time in shared memory (the operand stages are
    free by then) and writes them back row by row, each lane on a column: 32 consecutive pixels
    per store. Expects ``m_row`` and ``bias_row`` (this lane's first row).

    ``partial`` (split-K): the float32 sums as they are (no bias, no rounding) to part ``part``'s
    output of the float32 workspace ``y`` (``SPLITS`` outputs of ``n_images`` images)."""
    MT, NT = tile.WM // 16, tile.WN // 8
    OS = tile.output_stride
    bias_value = _BIAS_VALUE[precision]
    if partial or precision not in _ROUNDED:
        staged, result = "float_bits({})", "bits_value({})"
    else:
        staged, result = f"U32({_ROUNDED[precision]})", "{}"
    sync = "cuda.syncthreads()" if simulator else "cuda.syncwarp()"  # the simulator has no syncwarp
    lines = [
        f"slice_base = warp * U({16 * OS})",
        f"lane_slot = slice_base + lg * U({OS}) + lt * U(2)",
        "out_rows = g * M + m0 + warp_m",
    ]
    if partial:
        lines.append("part_base = part * U(n_images) * KPQ")
    for c in range(tile.WN // 32):
        lines += [
            f"n = n0 + warp_n + lane + U({32 * c})",
            f"col_ok_{c} = n < ngemm",
            "img = n // PQ",
            f"out_col_{c} = " + ("part_base + " if partial else "") + "img * KPQ + (n - img * PQ)",
        ]
    for mi in range(MT if not partial else 0):
        for h in range(2):
            row = 16 * mi + 8 * h
            guard = f"m_row + U({row}) < M_LEFT" if check_m else "True"
            value = bias_value.format(f"bias_row + U({row})") if key.has_bias else "zero"
            lines.append(f"bias_{mi}_{h} = {value} if {guard} else zero")
    for mi in range(MT):
        if mi:
            lines.append(sync)  # the previous slice is read before this one overwrites it
        for nj in range(NT):
            for r in range(4):
                offset = (8 * (r >> 1)) * OS + 8 * nj + (r & 1)
                value = staged.format(f"acc_{mi}_{nj}_{r}" if partial else f"acc_{mi}_{nj}_{r} + bias_{mi}_{r >> 1}")
                lines.append(f"a_stage[lane_slot + U({offset})] = {value}")
        lines.append(sync)
        # The rows as a loop (NVVM unrolls it): unrolled here, their branches made numba's SSA
        # pass half of the compile time (6.8 -> 3.2 s for a 64 x 64 warp tile).
        stores = []
        for c in range(tile.WN // 32):
            value = result.format(f"a_stage[slice_base + lane + row * U({OS}) + U({32 * c})]")
            stores += [f"if col_ok_{c}:", f"    y[out_col_{c} + (out_rows + U({16 * mi}) + row) * PQ] = {value}"]
        lines += ["for step in range(16):", "    row = U(step)"]
        if check_m:
            lines.append(f"    if warp_m + U({16 * mi}) + row < M_LEFT:")
            lines += ["        " + line for line in stores]
        else:
            lines += ["    " + line for line in stores]
    return lines


@functools.lru_cache(maxsize=None)
def mma_kernel(key, tile: MmaTile, precision: str, layout: str, simulator: bool = False,
               tap_table_bytes: int = 0, splits: int = 1):
    """The tensor-core implicit-GEMM kernel for the problem shape ``key``
    (:func:`convlib.cuda.gemm.shape_key`) in ``precision``.

    Returns
    -------
    kernel(b, w, bias, y, n_images)
        ``layout`` (:func:`operand_layout`) ``"channels_last"``: ``b`` and ``w`` the words
        :func:`layout_kernels` prepares; ``"pixels"``: the image and the filters as they are,
        viewed as flat uint32 words; ``"nchw"``: ``b`` the flat image and ``w`` the flat filters
        (float32, or float16 / bfloat16 as their ``uint16`` bits). ``bias``: ``(K,)`` (ignored without
        bias; half values as bits); ``y``: flat output of ``n_images`` images (half values as
        bits). Launch it with :func:`mma_launch_shape`.

        ``splits`` > 1 (split-K, ``"channels_last"`` only): ``y`` is a float32 workspace of
        ``splits`` outputs, each part's sums without bias; :func:`split_sum_kernel` adds them.
    """
    if not copies_chunks(layout):  # its operands go through registers: two stages
        tile = tile.with_stages(2)
    if splits > 1 and layout != "channels_last":
        raise ValueError(f"split-K serves the channels-last kernel, not {layout!r}")
    if layout in ("channels_last", "pixels"):
        source, constants = channels_last_source(key, tile, precision, simulator, pixels=layout == "pixels",
                                                 splits=splits)
    else:
        source, constants = mma_source(key, tile, precision, simulator, tap_table_bytes)
    return compile_kernel(source, "mma_gemm", constants, simulator=simulator,
                          launch_bounds=(tile.threads, tile.min_blocks))


def mma_launch_shape(problem, tile: MmaTile, n_images: int, splits: int = 1) -> tuple[tuple[int, int, int], int]:
    """Grid and block of :func:`mma_kernel` for ``n_images`` images (``splits`` parts of the
    reduction per group along ``z``)."""
    ngemm = n_images * problem.P * problem.Q
    grid = (-(-ngemm // tile.BN), -(-problem.gemm_m // tile.BM), problem.groups * splits)
    return grid, tile.threads


#: Threads per block of :func:`split_sum_kernel` (one output element each).
SPLIT_SUM_THREADS = 256


def split_workspace_elements(problem, splits: int, n_images: int | None = None) -> int:
    """float32 elements of split-K's workspace: one output per part (none unsplit)."""
    n = problem.N if n_images is None else n_images
    return 0 if splits <= 1 else splits * n * problem.K * problem.P * problem.Q


@functools.lru_cache(maxsize=None)
def split_sum_kernel(key, precision: str, splits: int, simulator: bool = False):
    """The second kernel of split-K: ``kernel(parts, bias, y, n_images)`` sums the ``splits``
    float32 outputs of ``parts`` in order (part 0 first: the same result on every run), adds the
    bias in float32 and rounds once to the output dtype, writing ``y`` as :func:`mma_kernel`'s
    epilogue does (half values as bits). One thread per output element; launch with
    :func:`split_sum_launch_shape`."""
    result = _ROUNDED.get(precision, "{}")
    adds = [f"    total += parts[U({p}) * size + i]" for p in range(1, splits)]
    bias_lines = ["    k = (i // PQ) % K", f"    total += {_BIAS_VALUE[precision].format('k')}"] if key.has_bias else []
    source = "\n".join([
        "def split_sum(parts, bias, y, n_images):",
        "    i = U(cuda.grid(1))",
        "    size = U(n_images) * KPQ",
        "    if i >= size:",
        "        return",
        "    total = parts[i]",
        *adds,
        *bias_lines,
        f"    y[i] = {result.format('total')}",
    ]) + "\n"
    constants = unsigned_constants(PQ=key.P * key.Q, K=key.K, KPQ=key.K * key.P * key.Q)
    constants.update(_word_constants(simulator, precision))
    return compile_kernel(source, "split_sum", constants, simulator=simulator)


def split_sum_launch_shape(problem, n_images: int, simulator: bool = False) -> tuple[int, int]:
    """Grid and block of :func:`split_sum_kernel` for ``n_images`` images."""
    threads = 8 if simulator else SPLIT_SUM_THREADS
    return -(-n_images * problem.K * problem.P * problem.Q // threads), threads
