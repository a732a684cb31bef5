"""(backend, algorithm) -> implementation module, imported lazily.

Every implementation (a module, or an object named ``"module:attribute"``) exposes the same two
names:

``supports(problem) -> str | None``
    None when the module can serve ``problem``, else the reason it cannot (one sentence).
``conv2d(problem, x, w, bias, device) -> y``
    ``x``, ``w`` and ``bias`` are C-contiguous arrays of ``problem.dtype`` already on the
    backend's device (numpy arrays for ``cpu``); ``bias`` may be None; ``device`` is the backend's
    resolved device handle (None on the CPU). Returns a new ``(N, K, P, Q)`` array there and never
    writes to its inputs.

Importing this module imports no backend: a backend's kernels are loaded on first use, so
``import convlib`` works without numba-dpex or numba-cuda.
"""

from __future__ import annotations

import importlib

#: Algorithm names in the order they are listed to users. ``winograd`` is F(4x4,3x3);
#: ``winograd2`` and ``winograd4`` name the two tile sizes explicitly.
ALGORITHM_NAMES = ("direct", "im2col", "blis", "winograd", "winograd2", "winograd4")

BACKENDS = ("cpu", "sycl", "cuda")

_IMPLEMENTATIONS: dict[tuple[str, str], str] = {
    ("cpu", "direct"): "convlib.cpu.direct",
    ("cpu", "im2col"): "convlib.cpu.im2col",
    ("cpu", "blis"): "convlib.cpu.blis",
    ("sycl", "direct"): "convlib.sycl.direct",
    ("sycl", "im2col"): "convlib.sycl.im2col",
    ("sycl", "blis"): "convlib.sycl.blis",
    ("cuda", "direct"): "convlib.cuda.direct",
    ("cuda", "im2col"): "convlib.cuda.im2col",
    ("cuda", "blis"): "convlib.cuda.blis",
    ("cpu", "winograd"): "convlib.cpu.winograd:F4",
    ("cpu", "winograd2"): "convlib.cpu.winograd:F2",
    ("cpu", "winograd4"): "convlib.cpu.winograd:F4",
    ("sycl", "winograd"): "convlib.sycl.winograd:F4",
    ("sycl", "winograd2"): "convlib.sycl.winograd:F2",
    ("sycl", "winograd4"): "convlib.sycl.winograd:F4",
}


def register(backend: str, algo: str, module: str) -> None:
    """Add (or replace) the module that implements ``algo`` on ``backend``."""
    _IMPLEMENTATIONS[(backend, algo)] = module


def algorithm_names(backend: str) -> list[str]:
    """Algorithms registered for ``backend``, in :data:`ALGORITHM_NAMES` order."""
    names = [a for (b, a) in _IMPLEMENTATIONS if b == backend]
    return sorted(names, key=lambda a: ALGORITHM_NAMES.index(a) if a in ALGORITHM_NAMES else 99)


def pairs() -> list[tuple[str, str]]:
    """Every registered (backend, algorithm) pair."""
    return sorted(_IMPLEMENTATIONS, key=lambda p: (BACKENDS.index(p[0]), algorithm_names(p[0]).index(p[1])))


def implementation(backend: str, algo: str):
    """The implementation of ``algo`` on ``backend`` (imported on first use)."""
    module, _, attr = _IMPLEMENTATIONS[(backend, algo)].partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attr) if attr else loaded
