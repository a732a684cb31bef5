"""The implicit GEMM on tensor cores: ``blis`` in TF32 (when ``allow_tf32`` permits), float16
and bfloat16.

The same product as :mod:`convlib.cuda.gemm` with ``b_source="image"`` (A the filters, B the
column matrix gathered straight from the NCHW image, C written to ``y`` in NCHW), multiplied by
the warps' ``mma.sync`` instead of each thread's FMAs (:mod:`convlib.cuda.ptx` has the
instructions and their operand layout):

* Operands are 32-bit *words*: a TF32 value (float32 rounded by ``cvt.rna.tf32.f32`` as it is
  staged), or two half-precision values of consecutive taps. A block stages ``BM x BKW`` words of
  A (row-major, rows :attr:`~convlib.cuda.tables.MmaTile.a_stride` apart) and ``BKW x BN`` of B
  (rows :attr:`~convlib.cuda.tables.MmaTile.b_stride` apart) per step, double-buffered, the next
  step's words fetched into registers while the current ones are multiplied (one barrier a step).
  The strides put the words a fragment reads in 32 distinct banks.
* Each warp owns a ``WM x WN`` tile of C: ``WM/16 x WN/8`` products of 16 x 8, four float32
  accumulators each per lane. Per 8 words of depth it reads its A and B fragments from shared
  memory (one 32-bit load per register) and issues every product.
* The epilogue adds the bias in float32 and rounds once to the output dtype (float32 for TF32).

So the half precisions are multiplied exactly (a product of two half values is exact in float32)
and summed in float32, as cuDNN does; TF32 rounds each operand to 10 mantissa bits (relative
error about 3e-4, like cuDNN's TF32).

Under numba-cuda's simulator the same kernel runs with the products emulated
(:func:`convlib.cuda.ptx.simulated_mma`): each product first stores every lane's fragment words
in shared memory and synchronises.
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
    """The generated kernel source and its constants (see the module docstring)."""
    epw = ELEMENTS_PER_WORD[precision]
    half = epw == 2
    BM, BN, BKW, WM, WN = tile.BM, tile.BN, tile.BKW, tile.WM, tile.WN
    BK = BKW * epw  # taps per step
    AS, BS = tile.a_stride, tile.b_stride
    MT, NT = WM // 16, WN // 8
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

    multiply = []
    for ks in range(BKW // 8):
        for mi in range(MT):
            base = mi * 16 * AS + ks * 8
            for r, offset in enumerate((0, 8 * AS, 4, 8 * AS + 4)):
                multiply.append(f"a{mi}_{r} = a_stage[a_read + U({base + offset})]")
        for nj in range(NT):
            base = ks * 8 * BS + nj * 8
            for r, offset in enumerate((0, 4 * BS)):
                multiply.append(f"b{nj}_{r} = b_stage[b_read + U({base + offset})]")
        for mi in range(MT):
            for nj in range(NT):
                acc = ", ".join(f"acc_{mi}_{nj}_{r}" for r in range(4))
                operands = ", ".join([f"a{mi}_{r}" for r in range(4)] + [f"b{nj}_{r}" for r in range(2)])
                if simulator:
                    multiply += [f"words[lane_words + U({r})] = {op}" for r, op in enumerate(operands.split(", "))]
                    multiply += ["cuda.syncthreads()",
                                 f"{acc} = mma_lane(PRECISION, words, warp_words, lane, {acc})",
                                 "cuda.syncthreads()"]
                else:
                    multiply.append(f"{acc} = mma_{precision}({operands}, {acc})")

    if precision == "float16":
        bias_value, result = "float16_value(bias[{}])", "float16_bits({})"
    elif precision == "bfloat16":
        bias_value, result = "bits_value(U32(bias[{}]) << U32(16))", "bfloat16_bits({})"
    else:
        bias_value, result = "bias[{}]", "{}"
    epilogue = []
    for mi in range(MT):
        for h in range(2):
            row = 16 * mi + 8 * h
            guard = f"m_row + U({row}) < M_LEFT" if check_m else "True"
            value = bias_value.format(f"bias_row + U({row})") if key.has_bias else "zero"
            epilogue.append(f"bias_{mi}_{h} = {value} if {guard} else zero")
    for nj in range(NT):
        for cc in range(2):
            epilogue += [
                f"n = n_col + U({8 * nj + cc})",
                "if n < ngemm:",
                "    img = n // PQ",
                "    out = img * KPQ + out_rows + (n - img * PQ)",
            ]
            for mi in range(MT):
                for h in range(2):
                    row = 16 * mi + 8 * h
                    value = result.format(f"acc_{mi}_{nj}_{2 * h + cc} + bias_{mi}_{h}")
                    line = f"y[out + U({row * key.P * key.Q})] = {value}"
                    if check_m:
                        epilogue += [f"    if m_row + U({row}) < M_LEFT:", f"        {line}"]
                    else:
                        epilogue.append(f"    {line}")

    align = "" if simulator else ", alignment=16"
    exchange = ""
    if simulator:
        exchange = (f"    words = cuda.shared.array({tile.warps * 32 * FRAGMENT_WORDS}, uint32)\n"
                    f"    warp_words = warp * U({32 * FRAGMENT_WORDS})\n"
                    f"    lane_words = warp_words + lane * U({FRAGMENT_WORDS})\n")
    source = f'''
def mma_gemm(b, w, bias, y, n_images):
    # IN b: flat x (N*C*H*W; uint16 bits for half dtypes); IN w (K*KK, likewise); IN bias (K,);
    # OUT y (N*K*P*Q)
    a_stage = cuda.shared.array(A_STAGE_LEN, uint32{align})   # 2 stages x BM rows x A_STRIDE words
    b_stage = cuda.shared.array(B_STAGE_LEN, uint32{align})   # 2 stages x BKW rows x B_STRIDE words
{"    tap = cuda.const.array_like(TAP)   # (c*H*W + r*dh*W + s*dw, r*dh << 16 | s*dw) per k" if tap_table is not None else ""}
    tid = U(cuda.threadIdx.x)
    n0 = U(cuda.blockIdx.x) * BN
    m0 = U(cuda.blockIdx.y) * BM
    g = U(cuda.blockIdx.z)
    ngemm = U(n_images) * PQ
    M_LEFT = M - m0
    lane = tid % U(32)
    warp = tid // U(32)
    lg = lane >> U(2)
    lt = lane & U(3)
{exchange}    # The warp's tile of C: rows warp_m.., columns warp_n.. of the block's.
    warp_m = (warp // WARPS_N) * WM
    warp_n = (warp % WARPS_N) * WN
    # This thread's share of each A step: word column a_kw, rows a_m + {a_row_step}*i.
    a_kw = tid % BKW
    a_m = tid // BKW
    a_k = a_kw * EPW
    a_src = (g * M + m0 + a_m) * KK + a_k
    a_store = a_m * A_STRIDE + a_kw
    # Its share of each B step: column b_n (one output pixel), word rows b_kw + {b_row_step}*i.
    b_n = tid % BN
    b_kw = tid // BN
    b_k = b_kw * EPW
    b_store = b_kw * B_STRIDE + b_n
    n = n0 + b_n
    col_ok = n < ngemm
    img = n // PQ
    pq = n - img * PQ
{indent(image_column_setup(key, tap_table), 1)}
{indent([f"acc_{mi}_{nj}_{r} = zero" for mi in range(MT) for nj in range(NT) for r in range(4)], 1)}
    k0 = U(0)
{indent(fetch, 1)}
    a_write = a_store
    b_write = b_store
{indent(store, 1)}
    cuda.syncthreads()
    for kt in range(K_TILES):
        has_next = kt + ONE < K_TILES
        if has_next:
            k0 = (kt + ONE) * BK
{indent(fetch, 3)}
        stage = kt & ONE
        a_read = stage * A_STAGE + (warp_m + lg) * A_STRIDE + lt
        b_read = stage * B_STAGE + lt * B_STRIDE + warp_n + lg
{indent(multiply, 2)}
        if has_next:
            a_write = (stage ^ ONE) * A_STAGE + a_store
            b_write = (stage ^ ONE) * B_STAGE + b_store
{indent(store, 3)}
        cuda.syncthreads()
    m_row = warp_m + lg
    bias_row = g * M + m0 + m_row
    out_rows = (g * M + m0 + m_row) * PQ
    n_col = n0 + warp_n + lt * U(2)
{indent(epilogue, 1)}
'''
    constants = unsigned_constants(
        BM=BM, BN=BN, BK=BK, BKW=BKW, WM=WM, WN=WN, WARPS_N=BN // WN, EPW=epw, M=M, KK=KK,
        PQ=key.P * key.Q, KPQ=key.K * key.P * key.Q, ONE=1, K_TILES=-(-KK // BK),
        A_STRIDE=AS, B_STRIDE=BS, A_STAGE=BM * AS, B_STAGE=BKW * BS,
    )
    constants.update(image_constants(key))
    constants.update(
        uint32=np.uint32, zero=np.float32(0), ZERO32=np.uint32(0), PRECISION=precision,
        A_STAGE_LEN=2 * BM * AS, B_STAGE_LEN=2 * BKW * BS, TAP=tap_table,
    )
    if not simulator:
        constants["uint32"] = scalar_type("uint32")
    constants["U32"] = constants["uint32"]
    constants.update(instructions(simulator))
    return source, constants


@functools.lru_cache(maxsize=None)
def mma_kernel(key, tile: MmaTile, precision: str, simulator: bool = False, tap_table_bytes: int = 0):
    """The tensor-core implicit-GEMM kernel for the problem shape ``key``
    (:func:`convlib.cuda.gemm.shape_key`) in ``precision``.

    Returns
    -------
    kernel(b, w, bias, y, n_images)
        ``b``: the flat image; ``w``: flat filters; ``bias``: ``(K,)`` (ignored without bias);
        ``y``: flat output of ``n_images`` images. float16 and bfloat16 arrays are passed as
        their ``uint16`` bits. Launch it with :func:`mma_launch_shape`.
    """
    source, constants = mma_source(key, tile, precision, simulator, tap_table_bytes)
    return compile_kernel(source, "mma_gemm", constants, simulator=simulator, launch_bounds=(tile.threads, 1))


def mma_launch_shape(problem, tile: MmaTile, n_images: int) -> tuple[tuple[int, int, int], int]:
    """Grid and block of :func:`mma_kernel` for ``n_images`` images."""
    ngemm = n_images * problem.P * problem.Q
    grid = (-(-ngemm // tile.BN), -(-problem.gemm_m // tile.BM), problem.groups)
    return grid, tile.threads
