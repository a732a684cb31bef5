"""What the CPU numba compiles for: its instruction set, its vector widths, its caches, its name.

The block tables of :mod:`convlib.cpu.tables` are keyed by what is read here, and its
machine-derived block sizes are scaled to :func:`cache_sizes`. Everything is read once per process.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path


@functools.lru_cache(maxsize=None)
def host_isa() -> str:
    """``"avx512"`` when the CPU numba compiles for has AVX-512F, else ``"avx2"``.

    Follows ``NUMBA_CPU_FEATURES`` when it is set (as numba does), else the host's features as
    LLVM sees them (a virtual machine may hide AVX-512 from a CPU that has it).
    """
    from numba.core import config

    features = config.CPU_FEATURES
    if not features:
        import llvmlite.binding as llvm

        features = llvm.get_host_cpu_features().flatten()
    return "avx512" if "+avx512f" in features.split(",") else "avx2"


def simd_bytes() -> int:
    """Bytes of the widest vector register: 64 with AVX-512, else 32."""
    return 64 if host_isa() == "avx512" else 32


def _vectorise_probe(out, a):
    for i in range(64):
        out[i] += a[i] * out[i]


@functools.lru_cache(maxsize=None)
def loop_vector_bytes() -> int:
    """Bytes of the vectors LLVM's loop vectoriser emits here (kernels without explicit vectors).

    32 on AVX2, and also on Intel AVX-512 server cores, whose tuning prefers 256-bit vectors
    (``prefer-256-bit``); 64 on AVX-512 parts without that preference (AMD Zen 4/5). Read off the
    assembly of a tiny probe loop, compiled once per process (~0.1 s) and only on AVX-512 hosts.
    """
    if host_isa() != "avx512":
        return 32
    from numba import njit

    probe = njit(_vectorise_probe)
    probe.compile("(float32[::1], float32[::1])")
    return 64 if "zmm" in probe.inspect_asm(probe.signatures[0]) else 32


@functools.lru_cache(maxsize=None)
def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), or what ``platform`` says elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


#: What :func:`cache_sizes` assumes where the OS says nothing: a common x86 core of 2020-2025.
FALLBACK_CACHES = {"L1d": 32 * 1024, "L2": 1024 * 1024, "L3": 8 * 1024 * 1024, "L3_cpus": 4}

_SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def _cpu_count(cpu_list: str) -> int:
    """CPUs in a sysfs list such as ``0-3,8-11``."""
    count = 0
    for part in cpu_list.strip().split(","):
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1 if lo else 0
    return count


def _read_sysfs_caches(root: Path) -> dict:
    caches = {}
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _parse_size((index / "size").read_text())
            shared = (index / "shared_cpu_list").read_text() if (index / "shared_cpu_list").exists() else "0"
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        name = "L1d" if level == 1 else f"L{level}"
        caches[name] = size
        if level == 3:
            caches["L3_cpus"] = max(1, _cpu_count(shared))
    return caches


def _read_sysconf_caches() -> dict:
    caches = {}
    for name, key in (("L1d", "SC_LEVEL1_DCACHE_SIZE"), ("L2", "SC_LEVEL2_CACHE_SIZE"),
                      ("L3", "SC_LEVEL3_CACHE_SIZE")):
        try:
            value = os.sysconf(key)
        except (ValueError, OSError, AttributeError):
            continue
        if value and value > 0:
            caches[name] = int(value)
    return caches


@functools.lru_cache(maxsize=None)
def cache_sizes(root: Path = _SYSFS_CACHE) -> dict:
    """The data caches of one core, in bytes, as the OS reports them.

    Returns ``{"L1d", "L2", "L3", "L3_cpus", "source"}``: the L1 data cache, L2 and L3 sizes of
    CPU 0 (``L3`` is the whole shared cache, ``L3_cpus`` how many CPUs share it) and where they
    were read (``"sysfs"`` on Linux, ``"sysconf"``, or ``"fallback"`` for values the OS did not
    give: :data:`FALLBACK_CACHES`). A virtual machine reports what its hypervisor passes on.
    """
    found, source = _read_sysfs_caches(root), "sysfs"
    if "L1d" not in found or "L2" not in found:
        found, source = _read_sysconf_caches(), "sysconf"
    if "L1d" not in found or "L2" not in found:
        found, source = {}, "fallback"
    caches = {**FALLBACK_CACHES, **found, "source": source}
    if "L3" not in found:
        caches["L3_cpus"] = FALLBACK_CACHES["L3_cpus"]
    return caches
