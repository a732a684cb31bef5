"""The OpenCL runtime's environment variables, set before anything imports dpctl.

Separate from :mod:`convlib.sycl.runtime` so that ``import convlib`` (which calls
:func:`configure_environment_if_installed`) imports nothing heavy. See that module for the
workarounds; this one holds ``WORKAROUND(intel-opencl-rt-2024.2-icd)`` and
``WORKAROUND(intel-opencl-rt-2024.2-cpu-target)``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
import warnings
from pathlib import Path

#: Packages whose wheels carry placeholder RPATHs (import names).
RELOCATED_PACKAGES = ("dpctl", "dpnp", "numba_dpex")


# ------------------------------------------------------------------------------------------
# Where things are
# ------------------------------------------------------------------------------------------
def venv_prefix() -> Path:
    """The environment whose ``lib/`` holds the Intel runtime libraries (wheel data files)."""
    return Path(sysconfig.get_paths()["data"])


def venv_lib() -> Path:
    """``<venv>/lib``, where the intel-* and mkl wheels put their shared libraries."""
    return venv_prefix() / "lib"


def package_dir(name: str) -> Path | None:
    """The directory of installed package ``name``, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def missing_packages() -> list[str]:
    """Which of the SYCL extra's importable packages are not installed."""
    return [name for name in RELOCATED_PACKAGES if package_dir(name) is None]


# ------------------------------------------------------------------------------------------
# WORKAROUND(intel-opencl-rt-2024.2-icd) and WORKAROUND(intel-opencl-rt-2024.2-cpu-target)
# ------------------------------------------------------------------------------------------
def cpu_flags() -> set[str]:
    """The CPU feature flags of this host (``/proc/cpuinfo``; empty where unreadable)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_target_arch(flags: set[str] | None = None) -> str:
    """The ``CL_CONFIG_CPU_TARGET_ARCH`` for a CPU with these feature ``flags``.

    ``skx`` needs the AVX-512 subsets Skylake-X has (F, CD, BW, DQ, VL); it was ~2x faster than
    ``core-avx2`` on a Zen 5 and both gave exact results where the default target did not.
    """
    flags = cpu_flags() if flags is None else flags
    if {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        return "skx"
    if "avx2" in flags:
        return "core-avx2"
    if "avx" in flags:
        return "corei7-avx"
    return "corei7"


def configure_environment() -> dict[str, str]:
    """Set the OpenCL runtime's environment variables that are unset; return what was set.

    Has an effect only before the SYCL runtime starts (before ``dpctl`` is first imported).
    """
    changed = {}
    icd = venv_lib() / "libintelocl.so"
    # WORKAROUND(intel-opencl-rt-2024.2-icd): the wheel's .icd file names a conda placeholder.
    # An empty value counts as unset: the runtime treats CL_CONFIG_CPU_TARGET_ARCH="" as an error.
    if not os.environ.get("OCL_ICD_FILENAMES") and icd.is_file():
        changed["OCL_ICD_FILENAMES"] = str(icd)
    # WORKAROUND(intel-opencl-rt-2024.2-cpu-target): the default target miscompiles on CPUs the
    # runtime does not know.
    if not os.environ.get("CL_CONFIG_CPU_TARGET_ARCH"):
        changed["CL_CONFIG_CPU_TARGET_ARCH"] = cpu_target_arch()
    if changed and "dpctl" in sys.modules:
        warnings.warn(
            f"convlib: dpctl was imported before convlib could set {', '.join(changed)}; the SYCL "
            "CPU device may be missing or miscompile. Import convlib first, or export "
            + " ".join(f"{k}={v}" for k, v in changed.items()),
            RuntimeWarning,
            stacklevel=3,
        )
    os.environ.update(changed)
    return changed


def configure_environment_if_installed() -> None:
    """:func:`configure_environment` when the sycl extra is installed and dpctl not yet imported.

    Run by ``import convlib``, so that ``import convlib, dpnp`` finds a correct device even
    before convlib's first SYCL call. Silent; never raises.
    """
    try:
        if "dpctl" not in sys.modules and package_dir("dpctl") is not None:
            configure_environment()
    except Exception:  # an import-time hook must never break ``import convlib``
        pass
