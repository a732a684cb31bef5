"""Do the CPU kernels' hot loops use the machine's vectors? Read it in their assembly.

For each kernel (the BLIS driver with its micro-kernel, Winograd's batched GEMM, direct's
register block, depthwise's whole-plane and band kernels), compiled here for this machine's
instruction set, the tool finds the hot loop -- the basic block with the most FMAs -- and
counts in it:

``width``      the FMAs' vector registers (zmm: 512-bit AVX-512; ymm: 256-bit)
``fma``        FMA instructions per pass of the loop (unrolled passes included)
``acc``        distinct FMA destinations: the register tile's accumulators
``bcast``      broadcasts: ``separate`` vbroadcastss (one load, the value reused by several FMAs)
               and ``folded`` ({1toN} memory operands: one load per FMA)
``loads``      vector loads outside FMAs
``stack``      stack accesses (``rsp``) inside the loop: spilled registers or a stack buffer's
               loads (depthwise keeps its taps' weights there); 0 means neither

Run::

    python -m convlib.bench.asm_check [--tiles]      # --tiles: every BLIS/Winograd tile of the table

Numba cannot show the assembly of a kernel loaded from its disk cache, so the tool compiles into
a fresh cache folder (1-3 minutes). A separate ``vbroadcastss`` is what a tile wants when each
broadcast value feeds NR/lanes > 1 FMAs (BLIS 6x64: 4): folding it would load it 4 times.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections import Counter

_LABEL = re.compile(r"^\.?[A-Za-z0-9_$.]+:")


def hot_loop(asm: str) -> list[str]:
    """The instructions of the basic block of ``asm`` (split at labels and branches) with the most FMAs."""
    blocks, current = [], None
    for line in asm.splitlines():
        s = line.strip()
        if _LABEL.match(s):
            current = []
            blocks.append(current)
        elif current is not None and s and not s.startswith((".", "#")):
            current.append(s.split("#")[0].strip())
            if s.startswith("j"):  # a branch ends the block (a loop's body ends at its back edge)
                current = []
                blocks.append(current)
    return max(blocks, key=lambda b: sum("vfmadd" in i for i in b), default=[])


def loop_summary(block: list[str]) -> dict:
    """What :func:`hot_loop`'s block does (see the module docstring)."""
    fmas = [i for i in block if i.startswith("vfmadd") or i.startswith("vfnmadd")]
    widths = Counter("zmm" if "zmm" in i else "ymm" if "ymm" in i else "xmm" for i in fmas)
    acc = {i.rsplit(",", 1)[-1].strip() for i in fmas}
    return {
        "width": "/".join(f"{w}:{n}" for w, n in widths.most_common()) or "-",
        "fma": len(fmas),
        "acc": len(acc),
        "bcast separate": sum(i.startswith("vbroadcasts") for i in block),
        "bcast folded": sum("{1to" in i for i in fmas),
        "loads": sum(i.startswith(("vmovups", "vmovaps", "vmovdqu")) and "(" in i.split(",")[0] for i in block),
        "stack": sum("rsp" in i for i in block),
    }


def _compiled_kernels(tiles: bool):
    """(name, dispatcher) for every kernel, each compiled once by an ordinary call."""
    import numpy as np

    import convlib
    from convlib.cpu import blis, depthwise, direct, winograd
    from convlib.cpu.isa import host_isa, simd_bytes
    from convlib.cpu.tables import (
        KNOBS,
        all_blis_blockings,
        blis_blocking,
        direct_blockings,
        direct_isa,
        direct_vector_bytes,
    )

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 16, 20, 20)).astype(np.float32)
    w = rng.standard_normal((24, 16, 3, 3)).astype(np.float32)
    out = []
    rows = [blis_blocking("float32")]
    if tiles:
        rows += [r for (isa, dt), r in all_blis_blockings().items() if isa == host_isa() and dt == "float32"
                 and r != rows[0]]
    for row in rows:
        with KNOBS.override(blis_blocking=row):
            convlib.conv2d(x, w, padding=1, algo="blis")
        out.append((f"blis {row.MR}x{row.NR}", blis.blis_kernel(row.MR, row.NR)))
    wino_tiles = [KNOBS.lookup("winograd_register_tile", "float32")]
    if tiles:
        from convlib.tune.search import WINOGRAD_TILES

        wino_tiles += [t for t in WINOGRAD_TILES[host_isa()] if t != wino_tiles[0]]
    for tile in wino_tiles:
        # Many chunks: the batched GEMM; one chunk: the GEMM with the filter transform fused in.
        with KNOBS.override(winograd_register_tile=tile, winograd_chunk_bytes=1):
            convlib.conv2d(x, w, padding=1, algo="winograd")
        out.append((f"winograd gemm {tile[0]}x{tile[1]}", winograd.batched_gemm_kernel(*tile, "float32")))
        with KNOBS.override(winograd_register_tile=tile):
            convlib.conv2d(x, w, padding=1, algo="winograd")
        out.append((f"winograd fused {tile[0]}x{tile[1]}", winograd.fused_filter_gemm_kernel(4, *tile, "float32")))
    for block in direct_blockings("float32")[: None if tiles else 1]:
        with KNOBS.override(direct_blockings=(block,)):
            convlib.conv2d(x, w, padding=1, algo="direct")
        out.append((f"direct {block.label} ({direct_isa()})", direct.kernel_for("float32", block, direct_vector_bytes())))
    # Two channels: 16 or more would take the channel-blocked way.
    xd = rng.standard_normal((1, 2, 64, 64)).astype(np.float32)
    wd = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
    convlib.conv2d(xd, wd, padding=1, groups=2, algo="depthwise")
    out.append(("depthwise whole-plane 3x3", depthwise.whole_plane_kernel(3, 3, "float32")))
    xb = rng.standard_normal((1, 2, 600, 600)).astype(np.float32)
    wb = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
    convlib.conv2d(xb, wb, padding=1, stride=2, groups=2, algo="depthwise")
    out.append(("depthwise bands 3x3", depthwise.depthwise_kernel(3, 3, "float32", simd_bytes())))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m convlib.bench.asm_check", description=__doc__.split("\n")[0])
    parser.add_argument("--tiles", action="store_true", help="every BLIS and Winograd tile and direct block")
    args = parser.parse_args(argv)
    # Before numba is imported: a fresh cache, so every kernel is compiled here and inspectable.
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="convlib-asm-")
    from convlib.cpu.isa import cpu_model, host_isa, loop_vector_bytes

    print(f"{cpu_model()}: {host_isa()}, loop vectors {loop_vector_bytes() * 8} bits", flush=True)
    header = ("kernel", "width", "fma", "acc", "bcast separate", "bcast folded", "loads", "stack")
    print(" | ".join(header))
    missing = []
    for name, kernel in _compiled_kernels(args.tiles):
        if not kernel.signatures:  # the call took another kernel: a row would silently go missing
            missing.append(name)
            continue
        s = loop_summary(hot_loop(kernel.inspect_asm(kernel.signatures[0])))
        print(" | ".join([name] + [str(s[h]) for h in header[1:]]), flush=True)
    for name in missing:
        print(f"{name}: not compiled by its call (the tool's call no longer reaches it)", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
