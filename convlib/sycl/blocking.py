"""Work-group sizes and register blocks of the SYCL kernels, as data.

Every kernel of the SYCL backend lays its work-items out the same way, the shape that ran fastest
on the OpenCL CPU device (``docs/devices.md``): the last (fastest) dimension of the range walks
output columns (adjacent work-items touch adjacent addresses, so the runtime's vectoriser packs
them into SIMD lanes) and each work-item keeps a block of outputs along the *other* axis in
private registers. Local-memory tiling was 2-4x slower on the CPU device, so no kernel uses it;
``local_mem_size`` is still checked (:func:`work_group`) for kernels that would.

=================  ==================================================================================
``direct_kb``      output channels per work-item in ``direct`` (register block; compile-time)
``direct_wg``      work-items per work-group of ``direct``, over output rows ``p`` x columns ``q``
``im2col_wg``      work-group size along the output rows ``p`` of the im2col kernel (an item copies a row)
``gemm_mb``        rows of C per work-item in our GEMM kernels (im2col's and blis'); compile-time
``gemm_wg``        work-group size along the columns of C in those GEMM kernels
``blis_kc``        depth of a packed B panel (``KC``: ``c, r, s`` taps per ``pc`` block)
``blis_nc``        columns of a packed B panel (``NC``: output pixels per ``jc`` block)
``blis_mc``        ``MR``-row micro-panels of A per work-group of blis' micro-kernel (``MC = blis_mc * MR``):
                   the work-group's items sharing a strip of ``Bc`` run on one core, so the strip
                   is read from L2 once per ``MC`` rows instead of once per ``MR``
``pack_wg``        work-group size along the output rows of blis' packing kernel (an item copies a row)
=================  ==================================================================================

Two-dimensional work-groups over output rows x columns are shaped by :func:`row_work_group` from
the item count in the table and the row length. Register blocks (``direct_kb``, ``gemm_mb``) are
compile-time constants of the kernels (a new value compiles a new kernel, 0.2-1 s); work-group and
panel sizes are launch parameters and never recompile. Every work-group is clamped to the device's ``max_work_group_size`` and
``max_work_item_sizes`` (a larger one runs *silently wrong* on the OpenCL CPU runtime), and the
global range is padded up to a multiple of it, the kernels guarding the padding.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class SyclBlocking:
    """One row of the table (see the module docstring for the fields)."""

    direct_kb: int
    direct_wg: int
    im2col_wg: int
    gemm_mb: int
    gemm_wg: int
    blis_kc: int
    blis_nc: int
    blis_mc: int
    pack_wg: int


#: (device kind, dtype) -> blocking. "cpu": the OpenCL CPU device, measured on the 2-core AMD EPYC
#: of docs/devices.md (AVX2 target: 8 float32 lanes, 16 vector registers; with FMA, 8 accumulators
#: per work-item fit, float64 takes 4). Bc = KC x NC is 16 MiB. "gpu": untested starting values for
#: an Intel GPU (larger work-groups, no copy-loop per item needed but harmless).
BLOCKING = {
    ("cpu", "float32"): SyclBlocking(direct_kb=8, direct_wg=2048, im2col_wg=8, gemm_mb=8, gemm_wg=64,
                                     blis_kc=512, blis_nc=8192, blis_mc=1, pack_wg=8),
    ("cpu", "float64"): SyclBlocking(direct_kb=8, direct_wg=512, im2col_wg=8, gemm_mb=4, gemm_wg=64,
                                     blis_kc=512, blis_nc=4096, blis_mc=1, pack_wg=8),
    ("gpu", "float32"): SyclBlocking(direct_kb=8, direct_wg=256, im2col_wg=32, gemm_mb=8, gemm_wg=128,
                                     blis_kc=256, blis_nc=8192, blis_mc=1, pack_wg=32),
    ("gpu", "float64"): SyclBlocking(direct_kb=8, direct_wg=128, im2col_wg=32, gemm_mb=8, gemm_wg=128,
                                     blis_kc=256, blis_nc=4096, blis_mc=1, pack_wg=32),
}

#: Set by tests and experiments (:func:`override`): replaces fields of every looked-up row.
_overrides: dict = {}


def blocking_for(device, dtype: str) -> SyclBlocking:
    """The table row for a ``dpctl.SyclDevice`` (GPUs and accelerators use the "gpu" rows)."""
    kind = "cpu" if device is None or device.is_cpu else "gpu"
    row = BLOCKING[(kind, dtype)]
    return replace(row, **_overrides) if _overrides else row


class override:
    """Context manager replacing table fields for a while, e.g. ``with override(direct_wg=1)``."""

    def __init__(self, **fields):
        unknown = set(fields) - set(SyclBlocking.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown blocking field(s) {sorted(unknown)}")
        self.fields = fields

    def __enter__(self):
        self.saved = dict(_overrides)
        _overrides.update(self.fields)
        return self

    def __exit__(self, *exc):
        _overrides.clear()
        _overrides.update(self.saved)


def work_group(device, wanted: tuple[int, ...], local_bytes_per_item: int = 0) -> tuple[int, ...]:
    """``wanted`` clamped to what ``device`` allows.

    Each dimension is clamped to ``max_work_item_sizes``, then the largest dimension is halved
    until the product fits ``max_work_group_size`` and, when the kernel uses local memory,
    ``local_bytes_per_item * product <= local_mem_size``.
    """
    if device is not None:
        limits = getattr(device, f"max_work_item_sizes{len(wanted)}d")
    else:
        limits = (1 << 30,) * len(wanted)
    sizes = [max(1, min(int(w), int(lim))) for w, lim in zip(wanted, limits)]
    max_items = device.max_work_group_size if device is not None else 1 << 30
    if local_bytes_per_item and device is not None:
        max_items = min(max_items, max(1, device.local_mem_size // local_bytes_per_item))

    def product():
        out = 1
        for v in sizes:
            out *= v
        return out

    while product() > max_items:
        i = max(range(len(sizes)), key=lambda d: sizes[d])
        sizes[i] = max(1, sizes[i] // 2)
    return tuple(sizes)


def padded(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (global ranges must divide evenly)."""
    return -(-n // multiple) * multiple


def register_block(extent: int, table_value: int) -> int:
    """Outputs per work-item along an axis of length ``extent``: the largest power of two that
    divides ``extent`` and is at most ``table_value``.

    Dividing exactly keeps bounds tests out of the inner loop (a clamped index there cost 2x);
    powers of two keep the number of compiled variants at four per kernel (depthwise gets 1).
    """
    block = 1
    while block * 2 <= table_value and extent % (block * 2) == 0:
        block *= 2
    return block


def row_work_group(device, items: int, row_length: int) -> tuple[int, int]:
    """A work-group ``(rows, columns)`` of about ``items`` work-items over rows of ``row_length``.

    Columns (the vectorised dimension) get the smallest power of two covering the row, up to
    ``items``; the remaining factor goes to rows. So a 7-wide output (ResNet's last stage) runs
    8 x 8 groups with 7 of 8 lanes busy instead of 1 x 64 groups with 7 of 64 busy.
    """
    columns = 1
    while columns < min(row_length, items):
        columns *= 2
    rows = max(1, items // columns)
    return work_group(device, (rows, columns))
