"""The tiled shared-memory GEMM kernel that ``im2col`` and ``blis`` are built from.

One thread block computes a ``BM x BN`` tile of ``C = A @ B`` for one group: A is the filter matrix
(``w`` viewed as ``K x Cg*R*S``, already row-major), B the column matrix. Every ``BK`` steps of the
reduction the block stages a ``BK x BM`` slice of A (transposed) and a ``BK x BN`` slice of B in
shared memory; the next slice is fetched into registers while the current one is multiplied, and
the two shared stages alternate (one barrier per step). Each thread accumulates a ``TM x TN``
register tile whose rows and columns come in runs of ``VM``/``VN`` consecutive elements (16-byte
shared-memory reads), the runs ``BM/(TM/VM)`` and ``BN/(TN/VN)`` apart (conflict-free reads,
coalesced stores).

Where B comes from is the only difference between the two algorithms (``b_source``):

``"image"`` (blis, implicit GEMM)
    B is gathered straight from the NCHW image: each thread owns one column of the B tile (one
    output pixel, decoded once) and, per step, decodes its rows ``k -> (c, r, s)`` with
    compile-time divisors, reading zero outside the padded image (no bounds checks at all when the
    problem has no padding). No column matrix exists.
``"columns"`` (im2col)
    B is read from an explicit column buffer laid out ``(images, groups, Cg*R*S, P*Q)``.

The epilogue adds the bias and writes ``y`` in NCHW directly (column ``n`` of C is pixel
``n % (P*Q)`` of image ``n // (P*Q)``).

The kernel source is generated (:mod:`convlib.cuda.codegen`): the register tile and the ``BK``
steps are unrolled in Python, so every accumulator is a named scalar.

Cost of a new shape: every size except the batch is a compile-time constant, so a new layer shape
(or tile) compiles a new kernel (one to a few seconds); the batch size is a run-time argument.
"""

from __future__ import annotations

import functools

import numpy as np

from .tables import GemmTile
from .codegen import compile_kernel, indent, unsigned_constants

IMAGE = "image"
COLUMNS = "columns"


@functools.lru_cache(maxsize=1024)
def shape_key(problem):
    """``problem`` with the batch size erased: the cache key of every CUDA kernel factory."""
    from dataclasses import replace

    return replace(problem, N=1)


def _tile_layout(tile: GemmTile, itemsize: int):
    """Offsets of a thread's register-tile rows and columns from its first row and column."""
    vec = 16 // itemsize
    VM, VN = min(vec, tile.TM), min(vec, tile.TN)
    m_run, n_run = tile.BM // (tile.TM // VM), tile.BN // (tile.TN // VN)
    rows = [(i // VM) * m_run + i % VM for i in range(tile.TM)]
    cols = [(j // VN) * n_run + j % VN for j in range(tile.TN)]
    return VM, VN, rows, cols


def gemm_source(key, tile: GemmTile, b_source: str, simulator: bool = False,
                tap_table_bytes: int = 0) -> tuple[str, dict]:
    """The generated kernel source and its constants (see the module docstring)."""
    # 16-byte aligned stages let NVVM merge a thread's run of reads into one vector load (the
    # simulator accepts no alignment).
    align = "" if simulator else ", alignment=16"
    implicit = b_source == IMAGE
    dtype = np.dtype(key.dtype)
    VM, VN, rows, cols = _tile_layout(tile, dtype.itemsize)
    TM, TN, BK, BM, BN = tile.TM, tile.TN, tile.BK, tile.BM, tile.BN
    NT = tile.threads
    a_row_step, b_row_step = NT // BK, NT // BN
    M, KK = key.gemm_m, key.gemm_k
    check_m = M % BM != 0
    check_k = KK % BK != 0

    fetch = []
    for i in range(tile.a_per_thread):
        cond = []
        if check_m:
            cond.append(f"a_m + U({a_row_step * i}) < M_LEFT")
        if check_k:
            cond.append("a_k + k0 < KK")
        load = f"w[a_src + k0 + U({a_row_step * i * KK})]"
        fetch.append(f"a_next_{i} = {load} if {' and '.join(cond)} else zero" if cond else f"a_next_{i} = {load}")
    tap_table = build_tap_table(key, BK, tap_table_bytes) if implicit and key.R * key.S > 1 else None
    for i in range(tile.b_per_thread):
        fetch.append(f"k = k0 + b_k + U({b_row_step * i})")
        fetch += gather_lines(key, tap_table, check_k, f"b_next_{i}", "b") if implicit else [
            f"b_next_{i} = b[b_src + k * PQ] if col_ok{' and k < KK' if check_k else ''} else zero"]

    store = [f"a_stage[a_write + U({a_row_step * i})] = a_next_{i}" for i in range(tile.a_per_thread)]
    store += [f"b_stage[b_write + U({b_row_step * BN * i})] = b_next_{i}" for i in range(tile.b_per_thread)]

    # The BK steps stay a (uint64) loop: unrolling them too multiplied numba's compile time by
    # BK for a few percent of loop overhead.
    multiply = ["a_step = a_read + kk * BM", "b_step = b_read + kk * BN"]
    multiply += [f"a_{i} = a_stage[a_step + U({rows[i]})]" for i in range(TM)]
    multiply += [f"b_{j} = b_stage[b_step + U({cols[j]})]" for j in range(TN)]
    multiply += [f"acc_{i}_{j} += a_{i} * b_{j}" for i in range(TM) for j in range(TN)]

    epilogue = []
    for i in range(TM):
        guard = f"m_row + U({rows[i]}) < M_LEFT" if check_m else "True"
        bias = f"bias[bias_row + U({rows[i]})]" if key.has_bias else "zero"
        epilogue.append(f"bias_{i} = {bias} if {guard} else zero")
    for j in range(TN):
        epilogue += [
            f"n = n_col + U({cols[j]})",
            "if n < ngemm:",
            "    img = n // PQ",
            "    out = img * KPQ + out_rows + (n - img * PQ)",
        ]
        for i in range(TM):
            store_line = f"y[out + U({rows[i] * key.P * key.Q})] = acc_{i}_{j} + bias_{i}"
            if check_m:
                epilogue += [f"    if m_row + U({rows[i]}) < M_LEFT:", f"        {store_line}"]
            else:
                epilogue.append(f"    {store_line}")

    if implicit:
        column_setup = image_column_setup(key, tap_table)
    else:
        column_setup = ["b_src = img * GKKPQ + g * KKPQ + pq"]

    source = f'''
def gemm(b, w, bias, y, n_images):
    # IN b: flat x (N*C*H*W) or columns (N*G*KK*PQ); IN w (K*KK); IN bias (K,); OUT y (N*K*P*Q)
    a_stage = cuda.shared.array(A_STAGE_LEN, dtype{align})   # 2 stages x BK x BM, k-major
    b_stage = cuda.shared.array(B_STAGE_LEN, dtype{align})   # 2 stages x BK x BN, k-major
{"    tap = cuda.const.array_like(TAP)   # (c*H*W + r*dh*W + s*dw, r*dh << 16 | s*dw) per k" if tap_table is not None else ""}
    tid = U(cuda.threadIdx.x)
    n0 = U(cuda.blockIdx.x) * BN
    m0 = U(cuda.blockIdx.y) * BM
    g = U(cuda.blockIdx.z)
    ngemm = U(n_images) * PQ
    M_LEFT = M - m0
    # This thread's share of each A slice: column a_k, rows a_m + {a_row_step}*i.
    a_k = tid % BK
    a_m = tid // BK
    a_src = (g * M + m0 + a_m) * KK + a_k
    a_store = a_k * BM + a_m
    # Its share of each B slice: column b_n (one output pixel), rows b_k + {b_row_step}*i.
    b_n = tid % BN
    b_k = tid // BN
    b_store = b_k * BN + b_n
    n = n0 + b_n
    col_ok = n < ngemm
    img = n // PQ
    pq = n - img * PQ
{indent(column_setup, 1)}
    # Its register tile: rows m0 + m_base + ROWS[i], columns n0 + n_base + COLS[j].
    m_base = (tid // THREADS_N) * U({VM})
    n_base = (tid % THREADS_N) * U({VN})
{indent([f"acc_{i}_{j} = zero" for i in range(TM) for j in range(TN)], 1)}
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
        a_read = stage * (BK * BM) + m_base
        b_read = stage * (BK * BN) + n_base
        for kk in range(BK):
{indent(multiply, 3)}
        if has_next:
            a_write = (stage ^ ONE) * (BK * BM) + a_store
            b_write = (stage ^ ONE) * (BK * BN) + b_store
{indent(store, 3)}
        cuda.syncthreads()
    m_row = m_base
    bias_row = g * M + m0 + m_base
    out_rows = (g * M + m0 + m_base) * PQ
    n_col = n0 + n_base
{indent(epilogue, 1)}
'''
    constants = unsigned_constants(
        BM=BM, BN=BN, BK=BK, M=M, KK=KK, PQ=key.P * key.Q, KPQ=key.K * key.P * key.Q,
        GKKPQ=key.groups * KK * key.P * key.Q, KKPQ=KK * key.P * key.Q, ONE=1, K_TILES=-(-KK // BK),
        THREADS_N=BN // TN,
    )
    constants.update(image_constants(key))
    constants.update(dtype=dtype, zero=dtype.type(0), A_STAGE_LEN=2 * BK * BM, B_STAGE_LEN=2 * BK * BN, TAP=tap_table)
    return source, constants


def gather_lines(key, tap_table, check_k: bool, target: str, array: str, convert: str = "{}",
                 zero: str = "zero") -> list[str]:
    """Generated lines that set ``target`` to element ``k`` of the implicit column matrix's
    current column (``convert`` applied), read from the flat image ``array``; zero outside the
    padded image, past ``KK`` when ``check_k``, and past the batch (``col_ok``). Expects the
    names :func:`image_column_setup` defines and ``k``.
    """
    padded = any(key.padding)
    lines = []
    cond = ["col_ok"] + (["k < KK"] if check_k and not (tap_table is not None and padded) else [])
    if tap_table is not None:
        # The tap of row k from the constant-memory table (uniform across a warp: a broadcast).
        lines += ["k2 = k * U(2)", "delta = I(tap[k2])"]
        if padded:
            lines += [
                "shifts = U(tap[k2 + U(1)])",
                "ih = ih0 + I(shifts >> U(16))",
                "iw = iw0 + I(shifts & U(65535))",
            ]
            cond += ["U(ih) < H", "U(iw) < W"]
            offset = "U(tap_base + delta)"
        else:
            offset = "pix_src + U(delta)"
    elif key.R * key.S == 1:
        lines.append("c = k")
        offset = "b_src + c * HW + U(ih0) * W + U(iw0)" if padded else "b_src + c * HW + pix"
        if padded:
            cond.append("inside")
    else:
        lines += ["c = k // RS", "rs = k - c * RS", "r = rs // S", "s = rs - r * S"]
        if padded:
            lines += ["ih = U(ih0 + I(r * DH))", "iw = U(iw0 + I(s * DW))"]
            cond += ["ih < H", "iw < W"]
            offset = "b_src + c * HW + ih * W + iw"
        else:
            offset = "b_src + c * HW + pix + r * DHW + s * DW"
    load = convert.format(f"{array}[{offset}]")
    lines.append(f"{target} = {load} if {' and '.join(cond)} else {zero}")
    return lines


def image_column_setup(key, tap_table) -> list[str]:
    """Generated lines decoding a thread's column of the implicit column matrix (one output
    pixel ``pq`` of image ``img`` in group ``g``) into what :func:`gather_lines` reads."""
    padded = any(key.padding)
    lines = [
        "p = pq // Q",
        "q = pq - p * Q",
        "ih0 = I(p * SH) - TOP",
        "iw0 = I(q * SW) - LEFT",
        "b_src = img * CHW + g * CGHW",
    ]
    if padded and key.R * key.S == 1:
        lines.append("inside = U(ih0) < H and U(iw0) < W")
    if not padded:
        lines.append("pix = p * SH * W + q * SW")
    if tap_table is not None:
        lines.append("tap_base = I(b_src) + ih0 * W_SIGNED + iw0" if padded else "pix_src = b_src + pix")
    return lines


def image_constants(key) -> dict:
    """The compile-time constants :func:`gather_lines` and :func:`image_column_setup` use."""
    constants = unsigned_constants(
        Q=key.Q, SH=key.stride[0], SW=key.stride[1], DH=key.dilation[0], DW=key.dilation[1],
        H=key.H, W=key.W, HW=key.H * key.W, RS=key.R * key.S, S=key.S, CHW=key.C * key.H * key.W,
        CGHW=key.C_per_group * key.H * key.W, DHW=key.dilation[0] * key.W,
    )
    constants.update(TOP=np.int64(key.pad_top), LEFT=np.int64(key.pad_left), W_SIGNED=np.int64(key.W))
    return constants


def build_tap_table(key, BK: int, limit_bytes: int):
    """Per reduction row ``k = (c, r, s)``: its image offset and its packed row and column shifts.

    Two int32 per row: ``c*H*W + r*dh*W + s*dw`` and ``(r*dh << 16) | s*dw``. Decoding ``k``
    takes two divisions per element and step; reading the decode from constant memory (one
    broadcast per warp, since a warp's threads share ``k``) takes two loads. Rows past ``Kgemm``
    (the last step's padding) get the largest row shift, which lands below any image the table
    is built for, so the bounds check zeroes them. None when the table (more than ``limit_bytes``,
    the ``tap_table_bytes`` knob) or its values do not fit.
    """
    R, S, KK = key.R, key.S, key.gemm_k
    rows = -(-KK // BK) * BK
    c, rs = np.divmod(np.arange(KK, dtype=np.int64), R * S)
    r, s = np.divmod(rs, S)
    dr, ds = r * key.dilation[0], s * key.dilation[1]
    delta = c * key.H * key.W + dr * key.W + ds
    limit = 2**15 - 1
    if (rows * 2 * 4 > limit_bytes or delta.max(initial=0) >= 2**31
            or max(dr.max(initial=0), ds.max(initial=0)) >= limit or key.H + key.pad_top >= limit):
        return None
    table = np.zeros((rows, 2), dtype=np.int32)
    table[:KK, 0] = delta
    table[:KK, 1] = (dr << 16) | ds
    table[KK:, 1] = limit << 16
    return table.reshape(-1)


@functools.lru_cache(maxsize=None)
def gemm_kernel(key, tile: GemmTile, b_source: str, simulator: bool = False, tap_table_bytes: int = 0):
    """The GEMM kernel for the problem shape ``key`` (see :func:`shape_key`); ``tap_table_bytes``
    bounds the implicit GEMM's tap table (0: none).

    Returns
    -------
    kernel(b, w, bias, y, n_images)
        ``b``: the flat image ``x`` (``b_source="image"``) or the flat column buffer; ``w``: flat
        filters; ``bias``: ``(K,)`` (ignored without bias); ``y``: flat output of ``n_images``
        images. Launch it with :func:`gemm_launch_shape`.
    """
    source, constants = gemm_source(key, tile, b_source, simulator, tap_table_bytes)
    # Two blocks per SM: caps registers at 65536 / (2 * threads), 128 for 256-thread tiles.
    return compile_kernel(source, "gemm", constants, simulator=simulator, launch_bounds=(tile.threads, 2))


def gemm_launch_shape(problem, tile: GemmTile, n_images: int) -> tuple[tuple[int, int, int], int]:
    """Grid and block of :func:`gemm_kernel` for ``n_images`` images."""
    ngemm = n_images * problem.P * problem.Q
    grid = (-(-ngemm // tile.BN), -(-problem.gemm_m // tile.BM), problem.groups)
    return grid, tile.threads
