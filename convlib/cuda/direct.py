"""Direct convolution on the GPU: shared-memory input tiles with their halo, several outputs per thread.

One thread block computes a ``TH x TW`` tile of output pixels of one image for ``KB`` output
channels of one group (:class:`~convlib.cuda.tables.DirectTile`). It walks the group's input
channels ``CB`` at a time: the block stages their input tile, halo included
(``(TH-1)*sh + (R-1)*dh + 1`` rows by ``(TW-1)*sw + (S-1)*dw + 1`` columns, warps copying rows,
lanes consecutive columns), and the matching ``KB x CB x R x S`` filters in shared memory; then
every thread accumulates ``KB x RPT x JPT`` outputs in registers: ``RPT`` consecutive rows (so each
staged input value it reads feeds up to ``R`` of them) times ``JPT`` columns ``TW/JPT`` apart (so a
warp reads consecutive shared words and writes consecutive output words). Each input value is read
from device memory about once, each output written once: for few channels the kernel runs near
the memory floor.

The per-tap step is generated source (:mod:`convlib.cuda.codegen`): the ``RPT x JPT`` pixels and
the ``KB`` channels are unrolled into named accumulators, each shared read is one load at a
constant offset from the tap's base, and the taps are a loop.

When even the smallest tile's halo outgrows shared memory (very large dilations or filters), a
plain kernel without staging, one output per thread, reads ``x`` and ``w`` through the cache.

Cost of a new shape: every size except the batch is a compile-time constant, so a new shape
compiles a new kernel (one to a few seconds); the batch size is a run-time argument.
"""

from __future__ import annotations

import functools

import numpy as np

from . import direct_strips
from .tables import KNOBS, DirectStrip, DirectTile
from .tiles import choose_direct_tile
from .codegen import compile_kernel, indent, unsigned_constants
from .gemm import shape_key
from .launch import MAX_GRID_Y, cuda, flat, placeholder_bias


def supports(problem) -> str | None:
    """Every valid problem is served (see the module docstring for the unstaged fallback)."""
    return None


def direct_source(key, tile: DirectTile) -> tuple[str, dict]:
    """The generated staged kernel's source and constants (see the module docstring)."""
    dtype = np.dtype(key.dtype)
    R, S = key.R, key.S
    sh, sw = key.stride
    dh, dw = key.dilation
    Cg, Kg = key.C_per_group, key.K_per_group
    RPT, JPT = tile.RPT, tile.JPT
    KB, CB = min(tile.KB, Kg), min(tile.CB, Cg)
    TX = tile.TW // tile.JPT
    NT = tile.threads
    IN_H, IN_W = tile.input_tile(key)
    LANES = min(32, NT)
    ROWS_PER_PASS = NT // LANES
    COL_PASSES = -(-IN_W // LANES)
    check_c = Cg % CB != 0
    check_k = Kg % KB != 0

    # Staging: lane l copies columns l, l + LANES, ... of each row its warp takes.
    column_setup = []
    for t in range(COL_PASSES):
        column_setup += [
            f"iw_{t} = iw_base + I(lane + U({LANES * t}))",
            f"col_ok_{t} = lane + U({LANES * t}) < IN_W",
            f"src_ok_{t} = U(iw_{t}) < W",
        ]
    row_copy = []
    for t in range(COL_PASSES):
        row_copy += [
            f"if col_ok_{t}:",
            f"    x_stage[dst + U({LANES * t})] = x[src + U(iw_{t})] if row_ok and src_ok_{t} else zero",
        ]

    # One filter tap per iteration of two (uint64) loops over r and s: KB filter values, RPT x JPT
    # input values, KB x RPT x JPT multiply-adds. Unrolling the taps too would let taps share input
    # values, but it multiplied numba's compile time and spilled the accumulators.
    channel_step = [
        "for r in range(R):",
        "    for s in range(S):",
        "        x_tap = xc + r * (DH * IN_W) + s * DW",
        "        w_tap = wc + r * S + s",
    ]
    channel_step += [f"        w_{k} = w_stage[w_tap + U({k * CB * R * S})]" for k in range(KB)]
    channel_step += [
        f"        x_{i}_{j} = x_stage[x_tap + U({i * sh * IN_W + j * TX * sw})]" for i in range(RPT) for j in range(JPT)
    ]
    channel_step += [
        f"        acc_{k}_{i}_{j} += x_{i}_{j} * w_{k}" for k in range(KB) for i in range(RPT) for j in range(JPT)
    ]

    epilogue = []
    for k in range(KB):
        guard = [f"k0 + U({k}) < KG"] if check_k else []
        epilogue.append(f"if {' and '.join(guard) or 'True'}:")
        bias = f"bias[g * KG + k0 + U({k})]" if key.has_bias else "zero"
        epilogue.append(f"    b = {bias}")
        for i in range(RPT):
            epilogue.append(f"    if p_first + U({i}) < P:")
            for j in range(JPT):
                epilogue += [
                    f"        if q_first + U({j * TX}) < Q:",
                    f"            y[out + U({k * key.P * key.Q + i * key.Q + j * TX})] = acc_{k}_{i}_{j} + b",
                ]

    source = f'''
def direct(x, w, bias, y, image0):
    # IN x (N*C*H*W), IN w (K*Cg*R*S), IN bias (K,), OUT y (N*K*P*Q)
    x_stage = cuda.shared.array(X_STAGE_LEN, dtype)   # CB x IN_H x IN_W input tile with halo
    w_stage = cuda.shared.array(W_STAGE_LEN, dtype)   # KB x CB x R x S filters
    tid = U(cuda.threadIdx.x)
    block = U(cuda.blockIdx.x)
    group_chunk = block // TILES
    tile_id = block - group_chunk * TILES
    g = group_chunk // K_CHUNKS
    k0 = (group_chunk - g * K_CHUNKS) * KB
    img = U(image0) + U(cuda.blockIdx.y)
    tp = tile_id // TILES_Q
    p0 = tp * TH
    q0 = (tile_id - tp * TILES_Q) * TW
    ih_base = I(p0 * SH) - TOP
    iw_base = I(q0 * SW) - LEFT
    x_image = (img * C + g * CG) * HW
    w_group = (g * KG + k0) * (CG * RS)
    lane = tid % LANES
    warp = tid // LANES
{indent(column_setup, 1)}
    tx = tid % TX
    ty = tid // TX
    x_thread = ty * (RPT * SH * IN_W) + tx * SW
{indent([f"acc_{k}_{i}_{j} = zero" for k in range(KB) for i in range(RPT) for j in range(JPT)], 1)}
    for cc in range(C_CHUNKS):
        c0 = cc * CB
        for pass_ in range(ROW_PASSES):
            row_id = warp + pass_ * ROWS_PER_PASS
            if row_id < CB * IN_H:
                c = row_id // IN_H
                row = row_id - c * IN_H
                ih = ih_base + I(row)
                row_ok = {"c0 + c < CG and " if check_c else ""}U(ih) < H
                src = x_image + (c0 + c) * HW + U(ih) * W if row_ok else U(0)
                dst = row_id * IN_W + lane
{indent(row_copy, 4)}
        e = tid
        while e < KB * CB * RS:
            k = e // (CB * RS)
            rest = e - k * (CB * RS)
            c = rest // RS
            ok = {"k0 + k < KG and " if check_k else ""}{"c0 + c < CG" if check_c else "True"}
            w_stage[e] = w[w_group + k * (CG * RS) + (c0 + c) * RS + (rest - c * RS)] if ok else zero
            e += NT
        cuda.syncthreads()
        for c in range(CB):
            xc = x_thread + c * (IN_H * IN_W)
            wc = c * RS
{indent(channel_step, 3)}
        cuda.syncthreads()
    p_first = p0 + ty * RPT
    q_first = q0 + tx
    out = ((img * K + g * KG + k0) * P + p_first) * Q + q_first
{indent(epilogue, 1)}
'''
    P, Q = key.P, key.Q
    constants = unsigned_constants(
        C=key.C, K=key.K, H=key.H, W=key.W, HW=key.H * key.W, R=R, S=S, RS=R * S, SH=sh, SW=sw, DH=dh, DW=dw,
        CG=Cg, KG=Kg, KB=KB, CB=CB, P=P, Q=Q, TH=tile.TH, TW=tile.TW, TX=TX, RPT=RPT, NT=NT,
        IN_H=IN_H, IN_W=IN_W, LANES=LANES, ROWS_PER_PASS=ROWS_PER_PASS,
        ROW_PASSES=-(-(CB * IN_H) // ROWS_PER_PASS), C_CHUNKS=-(-Cg // CB), K_CHUNKS=-(-Kg // KB),
        TILES_Q=-(-Q // tile.TW), TILES=-(-P // tile.TH) * -(-Q // tile.TW),
    )
    constants.update(
        TOP=np.int64(key.pad_top), LEFT=np.int64(key.pad_left), dtype=dtype, zero=dtype.type(0),
        X_STAGE_LEN=CB * IN_H * IN_W, W_STAGE_LEN=KB * CB * R * S,
    )
    return source, constants


@functools.lru_cache(maxsize=None)
def direct_kernel(key, tile: DirectTile, simulator: bool = False):
    """The staged direct kernel for the problem shape ``key`` and ``tile``.

    Returns
    -------
    kernel(x, w, bias, y, image0)
        Flat ``x``, ``w``, ``y``; ``bias`` ``(K,)``; computes images ``image0 + blockIdx.y``.
        Launch with :func:`direct_launch_shape`.
    """
    source, constants = direct_source(key, tile)
    return compile_kernel(source, "direct", constants, simulator=simulator, launch_bounds=(tile.threads, 2))


@functools.lru_cache(maxsize=None)
def unstaged_kernel(key):
    """``kernel(x, w, bias, y, image0)``: one output per thread, no staging (huge halos only)."""
    dtype = np.dtype(key.dtype)
    zero = dtype.type(0)
    C, K, H, W, R, S = key.C, key.K, key.H, key.W, key.R, key.S
    Cg, Kg = key.C_per_group, key.K_per_group
    sh, sw = key.stride
    dh, dw = key.dilation
    top, left = key.pad_top, key.pad_left
    P, Q = key.P, key.Q
    has_bias = key.has_bias

    def unstaged(x, w, bias, y, image0):
        # IN x (N*C*H*W), IN w (K*Cg*R*S), IN bias (K,), OUT y (N*K*P*Q); grid (K*P*Q, images)
        e = cuda.grid(1)
        if e < K * P * Q:
            img = image0 + cuda.blockIdx.y
            ko = e // (P * Q)
            pq = e - ko * (P * Q)
            p = pq // Q
            q = pq - p * Q
            g = ko // Kg
            total = bias[ko] if has_bias else zero
            for c in range(Cg):
                for r in range(R):
                    ih = p * sh - top + r * dh
                    if 0 <= ih < H:
                        for s in range(S):
                            iw = q * sw - left + s * dw
                            if 0 <= iw < W:
                                total += (x[((img * C + g * Cg + c) * H + ih) * W + iw]
                                          * w[((ko * Cg + c) * R + r) * S + s])
            y[(img * K + ko) * (P * Q) + pq] = total

    return cuda.jit(unstaged)


def direct_launch_shape(problem, tile: DirectTile, n_images: int) -> tuple[tuple[int, int], int]:
    """Grid and block of :func:`direct_kernel` for ``n_images`` images."""
    Kg = problem.K_per_group
    k_chunks = -(-Kg // min(tile.KB, Kg))
    tiles = -(-problem.P // tile.TH) * -(-problem.Q // tile.TW)
    return (problem.groups * k_chunks * tiles, n_images), tile.threads


def workspace_bytes(problem, device=None) -> int:
    """None: input tiles are staged in shared memory."""
    return 0


def run(problem, x, w, bias, device):
    """Direct convolution of device arrays (the contract of :mod:`convlib.core.contracts`)."""
    target = device
    with target.activate():
        y = target.empty(problem.y_shape, problem.dtype)
        if problem.N == 0:
            return y
        xf, wf, yf = flat(x), flat(w), flat(y)
        kernel, launches = _plan(problem, target.simulator, target.multiprocessors, KNOBS.state(), _aligned16(xf))
        b = bias if bias is not None else placeholder_bias(problem.dtype, target)
        for grid, block, arguments in launches:
            kernel[grid, block, target.stream](xf, wf, b, yf, *arguments)
    return y


def strip_channels(problem) -> str:
    """The row of the ``direct_strip`` knob for ``problem``: ``"one"`` input and output channel
    per group (filters, depthwise layers ran fastest in wider bands) or ``"few"``."""
    return "one" if problem.C_per_group == 1 and problem.K_per_group == 1 else "few"


def choose_strip(problem, simulator: bool = False) -> DirectStrip | None:
    """The strip kernel's layout for ``problem``, or None where the staged kernel serves it.

    The strip kernel takes what :func:`~convlib.cuda.direct_strips.serves` accepts (stride-1
    float32 rows of a multiple of 4) where it measured faster than the staged kernel (the
    ``direct_strip_*`` knobs, docs/gpu.md): up to ``direct_strip_max_channels`` input and output
    channels per group, input rows of ``direct_strip_min_width`` or more, and
    ``direct_strip_min_work`` multiply-adds per output pixel or more; and at most
    ``direct_strip_max_products`` multiply-adds in its unrolled loop (compile time). The layout is
    the ``direct_strip`` row for the layer's channels (:func:`strip_channels`)."""
    strip = KNOBS.simulator_direct_strip if simulator else KNOBS.lookup("direct_strip", strip_channels(problem))
    most = KNOBS.direct_strip_max_channels
    work = problem.C_per_group * problem.K_per_group * problem.R * problem.S
    if (problem.C_per_group > most or problem.K_per_group > most or problem.W < KNOBS.direct_strip_min_width
            or work < KNOBS.direct_strip_min_work or not direct_strips.serves(problem, strip)):
        return None
    products = problem.R * problem.R * problem.S * min(strip.KB, problem.K_per_group) * strip.JPT
    return strip if products <= KNOBS.direct_strip_max_products else None


def _aligned16(arr) -> bool:
    """Whether the device array ``arr`` starts at a 16-byte boundary (a view may not). The
    simulator's arrays have no device address; its word reads need none."""
    interface = getattr(arr, "__cuda_array_interface__", None)
    return interface is None or interface["data"][0] % 16 == 0


@functools.lru_cache(maxsize=256)
def _plan(problem, simulator: bool, multiprocessors: int, knobs: tuple, x_aligned: bool):
    """Kernel and launches (at most 65535 images each) for ``problem`` on a GPU of
    ``multiprocessors`` SMs (cached per problem, GPU size, knob overrides in force, ``knobs``, and
    whether the input is 16-byte aligned, ``x_aligned``, which the strip kernel needs). A launch
    is ``(grid, block, arguments after the arrays)``."""
    key = shape_key(problem)
    strip = choose_strip(problem, simulator) if x_aligned else None
    if strip is not None:
        slots = multiprocessors * (strip.blocks_per_sm or 1)
        launches = []
        for image0 in range(0, problem.N, MAX_GRID_Y):
            images = min(MAX_GRID_Y, problem.N - image0)
            rows = direct_strips.strip_rows(problem, strip, images, slots)
            launches.append((*direct_strips.strip_launch_shape(problem, strip, images, rows), (image0, rows)))
        return direct_strips.strip_kernel(key, strip, simulator), tuple(launches)
    tile = choose_direct_tile(problem, simulator)
    kernel = direct_kernel(key, tile, simulator) if tile is not None else unstaged_kernel(key)
    threads = 8 if simulator else 128
    launches = []
    for image0 in range(0, problem.N, MAX_GRID_Y):
        images = min(MAX_GRID_Y, problem.N - image0)
        if tile is not None:
            grid, block = direct_launch_shape(problem, tile, images)
        else:
            grid, block = (-(-(problem.K * problem.P * problem.Q) // threads), images), threads
        launches.append((grid, block, (image0,)))
    return kernel, tuple(launches)
