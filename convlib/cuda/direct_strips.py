"""Direct convolution of thin layers (few channels, stride 1): each block streams a strip of rows.

On a layer with few channels (the seed shape: 4 in, 4 out, 3x3) the staged kernel of
:mod:`convlib.cuda.direct` loads a tile, waits at a barrier, computes, and loads the next: its
loads and multiply-adds take turns, and it rereads each tile's halo rows. Here a block owns a
band of ``threads x JPT`` output columns of ``KB`` output channels and walks down a strip of
``rows`` output rows. Input rows ``t + 1`` to ``t + rows_ahead`` (every channel of the group, the
band's columns plus the filter's overhang) are being copied into shared memory by ``cp.async``
while the block computes with row ``t``, so each input value crosses from device memory once and
the copies overlap the arithmetic; one barrier per row hands the next row over. One row ahead
suits rows of four channels; single-channel rows (2 KiB a band) keep two in flight.

Each thread adds an input row to the ``R`` output rows it feeds: ``JPT`` consecutive columns,
read from the staged row as aligned 16-byte words, times ``KB`` filter channels. Those output rows'
accumulators rotate through ``R`` named slots: the row loop is unrolled ``R`` times, so input row
``t`` always meets slot ``(t - r) mod R`` under a compile-time name, and after row ``t`` the slot
of output row ``t - R + 1`` is complete: stored and cleared for row ``t + 1``. The channels are a
loop (its body the ``R x S`` taps), which keeps the generated source, and numba's compile time,
small; a layout may unroll them instead (``unroll_channels``). The block's filters sit in shared
memory with the ``KB`` channels of a tap together, read as one vector per tap. Outputs leave as
16-byte words when rows are a multiple of 4 long, as 8-byte ones when their length is even.

How many rows a strip has is a launch argument: :func:`strip_rows` picks the shortest strips
that let the whole grid run in one round of the GPU's block slots, or short strips when no
allowed length does.

Served (:func:`serves`): stride 1, dilation 1, any padding and groups, float32 with rows of a
multiple of 4 columns (so every row starts on a 16-byte word) and an input at a 16-byte aligned
address (checked at each call); the staged kernel serves the rest. Every size but the batch and the
strip length is a compile-time constant, as there.
"""

from __future__ import annotations

import functools

import numpy as np

from . import ptx
from .codegen import compile_kernel, indent, unsigned_constants
from .tables import SHARED_MEMORY_LIMIT, DirectStrip

def serves(problem, strip: DirectStrip) -> bool:
    """Whether the strip kernel with ``strip`` computes ``problem`` (the input's alignment aside):
    stride 1 and dilation 1, float32 rows of a multiple of 4 columns, a copy depth the PTX
    table has a wait for, and its ``rows_ahead + 1`` staged rows and filters within shared
    memory."""
    return (problem.stride == (1, 1) and problem.dilation == (1, 1) and problem.dtype == "float32"
            and problem.W % 4 == 0 and strip.JPT % 4 == 0
            and 1 <= strip.rows_ahead <= ptx.COPY_GROUPS_IN_FLIGHT  # waits for rows_ahead - 1 groups
            and shared_bytes(problem, strip) <= SHARED_MEMORY_LIMIT)


def _row_words(problem, strip: DirectStrip) -> tuple[int, int]:
    """``(ahead, words)``: a band's staged row starts ``ahead`` columns (the left padding rounded up
    to a multiple of 4) before its first output column and is ``words`` 16-byte words long."""
    ahead = -(-problem.pad_left // 4) * 4
    skip = ahead - problem.pad_left
    return ahead, -(-(skip + strip.threads * strip.JPT + problem.S - 1) // 4)


def shared_bytes(problem, strip: DirectStrip) -> int:
    """Shared memory of one block: the staged rows of every channel of the group, and filters."""
    words = _row_words(problem, strip)[1]
    kb = min(strip.KB, problem.K_per_group)
    buffers = strip.rows_ahead + 1  # one computed from, the rest being filled
    return (buffers * problem.C_per_group * 4 * words + kb * problem.C_per_group * problem.R * problem.S) * 4


def strip_rows(problem, strip: DirectStrip, n_images: int, slots: int) -> int:
    """The output rows per strip for ``n_images`` images when ``slots`` blocks run at once.

    If the grid fits in one round of ``slots`` blocks with strips of at most ``strip.max_rows``
    rows, the shortest strips that do (at least ``strip.min_rows``): every block starts at once
    and none waits for a second round. Otherwise ``strip.min_rows``: many short strips, handed to
    the SMs as others finish, balance best. Measured on both GPUs (``docs/gpu.md``): on an H100
    the seed shape (one round of 43 rows) took 0.122 ms against 0.134 in strips of 16, while
    N=32 at 1024^2 took 0.483 ms in strips of 16 against 0.551 in three rounds of 57 rows (the
    rule before, which counted rounds times rows walked: a bandwidth-bound round that is not
    full runs faster, so few long rounds were not what they seemed), 2048^2 0.440 against 0.517.
    """
    top = min(strip.max_rows, problem.P)
    low = min(strip.min_rows, problem.P)
    per_strip = n_images * _bands(problem, strip) * _group_chunks(problem, strip)
    strips = slots // per_strip  # strips of each band that one round holds
    if strips >= 1:
        one_round = max(low, -(-problem.P // strips))
        if one_round <= top:
            return one_round
    return low


def _bands(problem, strip: DirectStrip) -> int:
    return -(-problem.Q // (strip.threads * strip.JPT))


def _group_chunks(problem, strip: DirectStrip) -> int:
    return problem.groups * -(-problem.K_per_group // min(strip.KB, problem.K_per_group))


def strip_source(key, strip: DirectStrip, simulator: bool = False) -> tuple[str, dict]:
    """The generated kernel's source and constants (see the module docstring)."""
    R, S = key.R, key.S
    Cg, Kg = key.C_per_group, key.K_per_group
    JPT, NT = strip.JPT, strip.threads
    KB = min(strip.KB, Kg)
    check_k = Kg % KB != 0
    AHEAD, WORDS = _row_words(key, strip)
    SKIP = AHEAD - key.pad_left
    STAGE_W = 4 * WORDS
    # A thread's window (JPT + S - 1 columns from SKIP past its first column) in aligned words.
    WIN = JPT + S - 1
    NV = -(-(SKIP + WIN) // 4)
    COPIES = Cg * WORDS
    # float32 outputs of rows whose length is a multiple of 4 leave as 16-byte words, of an even
    # length as 8-byte ones (our own allocation is aligned; a thread's JPT columns start at a
    # multiple of 4). One element at a time, the unpadded seed's 1022-wide rows took 0.131 ms
    # (H200; 0.098 as 8-byte words, the padded seed's 1024-wide ones 0.099 as 16-byte words).
    vector_words = 4 if key.Q % 4 == 0 else 2 if key.Q % 2 == 0 else 0
    align = "" if simulator else ", alignment=16"
    ROWS_AHEAD = strip.rows_ahead
    BUFFERS = ROWS_AHEAD + 1  # staged input rows: one computed from, ROWS_AHEAD being filled

    # This thread's copies of a row, words tid, tid + NT, ...: the same words of every row, so
    # where each goes in the buffer and comes from in the row is worked out once, before the rows
    # (per copy and row that was ~30 integer instructions of 64-bit arithmetic, as many issue
    # slots as a quarter of the row's multiply-adds; docs/gpu.md).
    COPY_SLOTS = -(-COPIES // NT)
    copy_setup = []
    for m in range(COPY_SLOTS):
        copy_setup += [
            f"e = tid + U({m} * NT)",
            f"live_{m} = e < COPIES",
            "c = e // WORDS",
            "v = e - c * WORDS",
            "col = word_col + I(v * U(4))",
            f"col_ok_{m} = U(col) < W",
            f"to_{m} = c * STAGE_W + v * U(4)",
            f"from_{m} = c * HW + U(col) if col_ok_{m} else U(0)",
        ]

    def copy_row(t: str, base: str) -> list[str]:
        """Input row ``t`` of every channel of the group into the buffer at ``base`` (zeros off the
        image), as this thread's share of the block's ``cp.async`` copies."""
        lines = [
            f"ih = ih_first + I({t})",
            f"copy_ok = U(ih) < H and {t} < rows_here + U({R - 1})",
            "x_row = x_image + U(ih) * W if copy_ok else U(0)",
        ]
        for m in range(COPY_SLOTS):
            lines += [
                f"if live_{m}:",
                f"    ok = copy_ok and col_ok_{m}",
                f"    copy16(stage, {base} + to_{m}, x, x_row + from_{m} if ok else U(0), U(16) if ok else U(0))",
            ]
        return lines + ["copy_commit()"]

    # Without a bias nothing is added (x + 0.0 is not folded away: it turns -0.0 into 0.0).
    plus_bias = [f" + b_{k}" if key.has_bias else "" for k in range(KB)]
    bias_lines = []
    for k in range(KB) if key.has_bias else ():
        value = f"bias[g * KG + k0 + U({k})]"
        bias_lines.append(f"b_{k} = {value} if k0 + U({k}) < KG else zero" if check_k else f"b_{k} = {value}")

    def row_step(i: int) -> list[str]:
        """Input row ``t = u * R + i`` (``i`` static): row ``t + ROWS_AHEAD`` set copying into the
        buffer row ``t - 1`` left, then per channel the window and the multiply-adds into the
        slots of the output rows ``t - r`` it feeds; output row ``t - R + 1`` stored and its slot
        cleared; row ``t + 1`` waited for."""
        lines = [f"t = u * U({R}) + U({i})", f"current = (t % U({BUFFERS})) * BUFFER",
                 f"following = ((t + U({ROWS_AHEAD})) % U({BUFFERS})) * BUFFER"]
        lines += copy_row(f"t + U({ROWS_AHEAD})", "following")
        # Output row t - r exists when 0 <= t - r < rows_here; t >= r always holds past u = 0.
        guards = [" and ".join([f"t < rows_here + U({r})"] + ([] if i >= r else ["u > U(0)"])) for r in range(R)]

        def channel(window: str, wc: str, pad: str) -> list[str]:
            """The multiply-adds of one input channel: its window in the staged row at ``window``,
            its filters at ``wc``; lines indented by ``pad``."""
            out = [f"{pad}v_{v}_{e} = stage[{window} + U({4 * v + e})]" for v in range(NV) for e in range(4)]
            out += [f"{pad}x_{m} = v_{(SKIP + m) // 4}_{(SKIP + m) % 4}" for m in range(WIN)]
            for r in range(R):
                slot = (i - r) % R
                out.append(f"{pad}if feeds_{r}:")
                for s in range(S):
                    tap = (r * S + s) * KB
                    out += [f"{pad}    w_{k} = w_stage[{wc} + U({tap + k})]" for k in range(KB)]
                    out += [f"{pad}    acc_{slot}_{k}_{j} += x_{j + s} * w_{k}" for k in range(KB) for j in range(JPT)]
            return out

        lines += [f"feeds_{r} = {guards[r]}" for r in range(R)]  # output row t - r
        lines.append("window0 = current + tid * JPT")
        if strip.unroll_channels:
            for c in range(Cg):
                lines += channel(f"window0 + U({c * STAGE_W})", f"U({c * R * S * KB})", "")
        else:
            lines += ["for c in range(CG):", "    window = window0 + c * STAGE_W", "    wc = c * RSK"]
            lines += channel("window", "wc", "    ")
        done = (i + 1) % R  # the slot of output row t - R + 1
        lines += [
            f"o = I(t) - I({R - 1})",
            "if o >= I(0) and o < I(rows_here):",
            "    y_row = y_first + U(o) * Q",
        ]
        for k in range(KB):
            guard = f"k0 + U({k}) < KG" if check_k else "True"
            lines.append(f"    if {guard}:")
            if vector_words:
                store = {4: "store4", 2: "store2"}[vector_words]
                for j0 in range(0, JPT, vector_words):
                    values = ", ".join(f"float_bits(acc_{done}_{k}_{j}{plus_bias[k]})"
                                       for j in range(j0, j0 + vector_words))
                    lines += [f"        if q_ok_{j0}:", f"            {store}(y, y_row + U({k} * PQ + {j0}), {values})"]
            else:
                for j in range(JPT):
                    lines += [f"        if q_ok_{j}:",
                              f"            y[y_row + U({k} * PQ + {j})] = acc_{done}_{k}_{j}{plus_bias[k]}"]
        lines += [f"acc_{done}_{k}_{j} = zero" for k in range(KB) for j in range(JPT)]
        # Every thread's copies of row t + 1 have landed (those of the ROWS_AHEAD - 1 rows after it
        # may still be in flight), and every thread is done with row t's buffer, which the next
        # step refills.
        lines += [f"copy_wait_{ROWS_AHEAD - 1}()", "cuda.syncthreads()"]
        return lines

    source = f'''
def direct_strips(x, w, bias, y, image0, rows):
    # IN x (N*C*H*W), IN w (K*Cg*R*S), IN bias (K,), OUT y (N*K*P*Q); rows: output rows per strip
    stage = cuda.shared.array(STAGE_LEN, dtype{align})     # {BUFFERS} x CG x STAGE_W: staged input rows
    w_stage = cuda.shared.array(W_STAGE_LEN, dtype{align})  # [c][r][s][k]: KB channels of a tap together
    tid = U(cuda.threadIdx.x)
    block = U(cuda.blockIdx.x)
    place = block // GROUP_CHUNKS   # consecutive blocks share one place's input rows (in L2)
    group_chunk = block - place * GROUP_CHUNKS
    strip = place // BANDS
    q0 = (place - strip * BANDS) * (NT * JPT)
    q = q0 + tid * JPT
    g = group_chunk // K_CHUNKS
    k0 = (group_chunk - g * K_CHUNKS) * KB
    img = U(image0) + U(cuda.blockIdx.y)
    e = tid
    while e < FILTER_VALUES:
        k = e % KB
        tap = e // KB
        ok = {"k0 + k < KG" if check_k else "True"}
        w_stage[e] = w[(g * KG + k0 + k) * (CG * RS) + tap] if ok else zero
        e += NT
    rows_u = U(rows)
    p0 = strip * rows_u
    rows_here = min(rows_u, P - p0)
    ih_first = I(p0) - TOP
    word_col = I(q0) - I({AHEAD})
    x_image = (img * C + g * CG) * HW
    y_first = ((img * K + g * KG + k0) * P + p0) * Q + q
{indent([f"q_ok_{j} = q + U({j}) < Q" for j in range(JPT)], 1)}
{indent(bias_lines, 1)}
{indent([f"acc_{s}_{k}_{j} = zero" for s in range(R) for k in range(KB) for j in range(JPT)], 1)}
{indent(copy_setup, 1)}
{indent(sum((copy_row(f"U({t})", f"U({t} * BUFFER)") for t in range(ROWS_AHEAD)), []), 1)}
    copy_wait_{ROWS_AHEAD - 1}()
    cuda.syncthreads()
    for u in range((rows_here + U({2 * R - 2})) // U({R})):
{indent(sum((row_step(i) for i in range(R)), []), 2)}
'''
    constants = unsigned_constants(
        C=key.C, K=key.K, H=key.H, W=key.W, HW=key.H * key.W, P=key.P, Q=key.Q, PQ=key.P * key.Q, RS=R * S,
        RSK=R * S * KB, CG=Cg, KG=Kg, KB=KB, NT=NT, JPT=JPT, BANDS=_bands(key, strip),
        K_CHUNKS=-(-Kg // KB), GROUP_CHUNKS=_group_chunks(key, strip), FILTER_VALUES=KB * Cg * R * S,
        WORDS=WORDS, STAGE_W=STAGE_W, COPIES=COPIES, BUFFER=Cg * STAGE_W,
    )
    dtype = np.dtype(np.float32)
    constants.update(STAGE_LEN=BUFFERS * Cg * STAGE_W, W_STAGE_LEN=KB * Cg * R * S, TOP=np.int64(key.pad_top),
                     dtype=dtype, zero=dtype.type(0), **ptx.instructions(simulator))
    return source, constants


@functools.lru_cache(maxsize=None)
def strip_kernel(key, strip: DirectStrip, simulator: bool = False):
    """The strip kernel for the problem shape ``key``: ``kernel(x, w, bias, y, image0, rows)`` with
    flat ``x``, ``w``, ``y`` and ``bias`` ``(K,)``, computing images ``image0 + blockIdx.y`` in
    strips of ``rows`` output rows; launch with :func:`strip_launch_shape`."""
    source, constants = strip_source(key, strip, simulator)
    bounds = None if strip.blocks_per_sm is None else (strip.threads, strip.blocks_per_sm)
    return compile_kernel(source, "direct_strips", constants, simulator=simulator, launch_bounds=bounds)


def strip_launch_shape(problem, strip: DirectStrip, n_images: int, rows: int) -> tuple[tuple[int, int], int]:
    """Grid and block of :func:`strip_kernel` for ``n_images`` images in strips of ``rows`` rows."""
    strips = -(-problem.P // rows)
    return (_group_chunks(problem, strip) * strips * _bands(problem, strip), n_images), strip.threads
