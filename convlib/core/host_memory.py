"""How much memory the host has, and how much of it is free (for the result-size check).

Read from ``os.sysconf`` and Linux's ``/proc/meminfo``; elsewhere the free memory is unknown.
"""

from __future__ import annotations

import functools
import os


@functools.lru_cache(maxsize=1)
def physical_memory_bytes() -> int | None:
    """The host's physical memory, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def available_memory_bytes() -> int | None:
    """``MemAvailable`` plus ``SwapFree`` of ``/proc/meminfo`` (None where there is no such file):
    what can still be allocated and touched without the out-of-memory killer stepping in."""
    fields = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("MemAvailable", "SwapFree"):
                    fields[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        return None
    if "MemAvailable" not in fields:
        return None
    return fields["MemAvailable"] + fields.get("SwapFree", 0)


def host_memory_available(nbytes: int) -> int | None:
    """Free host memory for a request of ``nbytes``: None (not asked) for requests under a
    sixteenth of the physical memory, which reading ``/proc/meminfo`` on every call would slow."""
    total = physical_memory_bytes()
    if total is not None and nbytes < total // 16:
        return None
    return available_memory_bytes() or total
