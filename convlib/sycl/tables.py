"""Every tuning knob of the SYCL backend, in one table (:data:`KNOBS`).

Every kernel of the SYCL backend lays its work-items out the same way, the shape that ran fastest
on the OpenCL CPU device (``docs/devices.md``): the last (fastest) dimension of the range walks
output columns (adjacent work-items touch adjacent addresses, so the runtime's vectoriser packs
them into SIMD lanes) and each work-item keeps a block of outputs along the *other* axis in
private registers. Local-memory tiling was 2-4x slower on the CPU device, so no kernel uses it;
``local_mem_size`` is still checked (:func:`convlib.sycl.launch.work_group`) for kernels that would.

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

The fields above are knobs of :data:`KNOBS` keyed by ``(device kind, dtype)`` (``"cpu"`` for
the OpenCL CPU device, ``"gpu"`` for GPUs and accelerators); :func:`blocking_for` gathers one
device's row as a :class:`SyclBlocking`. Override any of them for a while with
``KNOBS.override(direct_wg=1, ...)`` (one value for every device kind and dtype); the other knobs:

=======================  ===========================================================================
``im2col_gemm``          the GEMM behind ``im2col`` and Winograd: ``"onemkl"`` (``dpnp.matmul``) or
                         ``"kernel"`` (this backend's numba-dpex GEMM)
``winograd_chunk_bytes`` most bytes of one Winograd chunk's padded input, ``V`` and ``M``
``winograd_transform_wg`` work-group size along the tiles of the Winograd transform kernels
``huge_page_min_bytes``  device arrays at least this large are advised to use huge pages (CPU device)
``backward_cb``          channels of ``dx`` per work-item of the backward-data kernel (register block;
                         compile-time), keyed like the blocking knobs
``backward_wg``          work-items per work-group of the backward-data kernel, over rows x columns of ``dx``
``reduce_wg``            work-items per work-group of the backward-weight and bias-gradient kernels
                         (one work-group per ``dw`` element or bias channel, reducing in local memory)
=======================  ===========================================================================

Two-dimensional work-groups over output rows x columns are shaped by
:func:`convlib.sycl.launch.row_work_group` from the item count in the table and the row length. Register blocks (``direct_kb``, ``gemm_mb``) are
compile-time constants of the kernels (a new value compiles a new kernel, 0.2-1 s); work-group and
panel sizes are launch parameters and never recompile. Every work-group is clamped to the device's ``max_work_group_size`` and
``max_work_item_sizes`` (a larger one runs *silently wrong* on the OpenCL CPU runtime), and the
global range is padded up to a multiple of it, the kernels guarding the padding.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..core.knobs import Knob, KnobTable


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
_BLOCKING = {
    ("cpu", "float32"): SyclBlocking(direct_kb=8, direct_wg=2048, im2col_wg=8, gemm_mb=8, gemm_wg=64,
                                     blis_kc=512, blis_nc=8192, blis_mc=1, pack_wg=8),
    ("cpu", "float64"): SyclBlocking(direct_kb=8, direct_wg=512, im2col_wg=8, gemm_mb=4, gemm_wg=64,
                                     blis_kc=512, blis_nc=4096, blis_mc=1, pack_wg=8),
    ("gpu", "float32"): SyclBlocking(direct_kb=8, direct_wg=256, im2col_wg=32, gemm_mb=8, gemm_wg=128,
                                     blis_kc=256, blis_nc=8192, blis_mc=1, pack_wg=32),
    ("gpu", "float64"): SyclBlocking(direct_kb=8, direct_wg=128, im2col_wg=32, gemm_mb=8, gemm_wg=128,
                                     blis_kc=256, blis_nc=4096, blis_mc=1, pack_wg=32),
}

#: What each field of :class:`SyclBlocking` controls (see the module docstring).
_FIELD_DOCS = {
    "direct_kb": "output channels per work-item in direct (register block; compile-time constant of the kernel)",
    "direct_wg": "work-items per work-group of direct, over output rows x columns",
    "im2col_wg": "work-group size along the output rows of the im2col kernel (an item copies a row)",
    "gemm_mb": "rows of C per work-item in the GEMM kernels of im2col and blis (compile-time constant)",
    "gemm_wg": "work-group size along the columns of C in those GEMM kernels",
    "blis_kc": "depth of a packed B panel of blis (KC)",
    "blis_nc": "columns of a packed B panel of blis (NC)",
    "blis_mc": "MR-row micro-panels of A per work-group of blis' micro-kernel",
    "pack_wg": "work-group size along the output rows of blis' packing kernel",
}

#: The GEMM engines of im2col and Winograd.
GEMM_ENGINES = ("onemkl", "kernel")

KNOBS = KnobTable("sycl", [
    *(Knob(f.name, {key: getattr(row, f.name) for key, row in _BLOCKING.items()}, _FIELD_DOCS[f.name],
           keyed_by=("device kind", "dtype")) for f in fields(SyclBlocking)),
    Knob("im2col_gemm", "onemkl", "the GEMM of im2col and Winograd: 'onemkl' (dpnp.matmul, oneMKL's batched "
         "GEMM) or 'kernel' (our numba-dpex kernel: adjacent work-items on adjacent output pixels, gemm_mb "
         "output channels in registers)", allowed=GEMM_ENGINES),
    Knob("winograd_chunk_bytes", 64 * 2**20, "most bytes of one Winograd chunk's padded input, V and M "
         "(whole images; at least one image)"),
    Knob("winograd_transform_wg", 64, "work-group size along the tiles (the vectorised dimension) of the "
         "Winograd transform kernels"),
    Knob("huge_page_min_bytes", 4 * 2**20, "device arrays at least this large are advised to use "
         "transparent huge pages on CPU devices"),
    # The backward passes (convlib/sycl/direct_backward.py, bias_gradient.py). Starting values by
    # analogy with direct's (the same layout for backward data); not tuned: no timing was run yet.
    Knob("backward_cb", {("cpu", "float32"): 8, ("cpu", "float64"): 8, ("gpu", "float32"): 8,
                         ("gpu", "float64"): 8},
         "channels of dx per work-item of the backward-data kernel (register block, a power of two dividing "
         "C / groups; compile-time constant of the kernel)", keyed_by=("device kind", "dtype")),
    Knob("backward_wg", {("cpu", "float32"): 2048, ("cpu", "float64"): 512, ("gpu", "float32"): 256,
                         ("gpu", "float64"): 128},
         "work-items per work-group of the backward-data kernel, over rows x columns of dx",
         keyed_by=("device kind", "dtype")),
    Knob("reduce_wg", {("cpu", "float32"): 64, ("cpu", "float64"): 64, ("gpu", "float32"): 256,
                       ("gpu", "float64"): 256},
         "work-items per work-group of the backward-weight and bias-gradient kernels: one work-group per "
         "dw element (or bias channel) sums its products over rows x columns, then reduces in local memory",
         keyed_by=("device kind", "dtype")),
])


def device_kind(device) -> str:
    """``"cpu"`` for a CPU device (or None), ``"gpu"`` for GPUs and accelerators."""
    return "cpu" if device is None or device.is_cpu else "gpu"


def blocking_for(device, dtype: str) -> SyclBlocking:
    """The blocking knobs for a ``dpctl.SyclDevice`` and dtype, as one :class:`SyclBlocking`."""
    key = (device_kind(device), dtype)
    return SyclBlocking(**{f.name: KNOBS.lookup(f.name, key) for f in fields(SyclBlocking)})
