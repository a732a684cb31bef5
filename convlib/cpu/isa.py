"""What the CPU numba compiles for: its instruction set, its vector widths, its name.

The block tables of :mod:`convlib.cpu.tables` are keyed by what is read here. Everything is read
once per process.
"""

from __future__ import annotations

import functools
import platform


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
