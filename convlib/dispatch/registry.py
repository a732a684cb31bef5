"""``(operation, backend, algorithm) -> implementation``, imported lazily.

Every implementation (a module, or an object named ``"module:attribute"``) keeps the contract of
:mod:`convlib.core.contracts`: ``supports(problem)``, ``run(problem, *arrays, device)`` and
``workspace_bytes(problem, device)``. Registering one here is all it takes for dispatch, the
selector, the benchmarks and the contract tests (which iterate over :func:`entries`) to use it.

Importing this module imports no backend: a backend's kernels are loaded on first use, so
``import convlib`` works without numba-dpex or numba-cuda.
"""

from __future__ import annotations

import importlib

from ..core.problem import OPERATIONS

#: The operations convlib computes (:data:`convlib.core.problem.OPERATIONS`): the forward
#: convolution and its three backward passes; ``conv_transpose2d`` runs ``conv2d_backward_data``.
__all__ = ["OPERATIONS"]

#: Algorithm names in the order they are listed to users. ``winograd`` is F(4x4,3x3);
#: ``winograd2`` and ``winograd4`` name the two tile sizes explicitly.
ALGORITHM_NAMES = ("direct", "im2col", "blis", "winograd", "winograd2", "winograd4", "depthwise")

BACKENDS = ("cpu", "sycl", "cuda")

_IMPLEMENTATIONS: dict[tuple[str, str, str], str] = {
    ("conv2d", "cpu", "direct"): "convlib.cpu.direct",
    ("conv2d", "cpu", "im2col"): "convlib.cpu.im2col",
    ("conv2d", "cpu", "blis"): "convlib.cpu.blis",
    ("conv2d", "cpu", "winograd"): "convlib.cpu.winograd:F4",
    ("conv2d", "cpu", "winograd2"): "convlib.cpu.winograd:F2",
    ("conv2d", "cpu", "winograd4"): "convlib.cpu.winograd:F4",
    ("conv2d", "cpu", "depthwise"): "convlib.cpu.depthwise",
    ("conv2d", "sycl", "direct"): "convlib.sycl.direct",
    ("conv2d", "sycl", "im2col"): "convlib.sycl.im2col",
    ("conv2d", "sycl", "blis"): "convlib.sycl.blis",
    ("conv2d", "sycl", "winograd"): "convlib.sycl.winograd:F4",
    ("conv2d", "sycl", "winograd2"): "convlib.sycl.winograd:F2",
    ("conv2d", "sycl", "winograd4"): "convlib.sycl.winograd:F4",
    ("conv2d", "cuda", "direct"): "convlib.cuda.direct",
    ("conv2d", "cuda", "im2col"): "convlib.cuda.im2col",
    ("conv2d", "cuda", "blis"): "convlib.cuda.blis",
    ("conv2d", "cuda", "winograd"): "convlib.cuda.winograd:F4",
    ("conv2d", "cuda", "winograd2"): "convlib.cuda.winograd:F2",
    ("conv2d", "cuda", "winograd4"): "convlib.cuda.winograd:F4",
    ("conv2d_backward_data", "cpu", "direct"): "convlib.cpu.direct_backward:DATA",
    ("conv2d_backward_data", "cpu", "im2col"): "convlib.cpu.im2col_backward:DATA",
    ("conv2d_backward_data", "cpu", "blis"): "convlib.cpu.blis_backward:DATA",
    ("conv2d_backward_data", "cpu", "winograd"): "convlib.cpu.winograd_backward:DATA_F4",
    ("conv2d_backward_data", "cpu", "winograd2"): "convlib.cpu.winograd_backward:DATA_F2",
    ("conv2d_backward_data", "cpu", "winograd4"): "convlib.cpu.winograd_backward:DATA_F4",
    ("conv2d_backward_data", "cpu", "depthwise"): "convlib.cpu.depthwise_backward:DATA",
    ("conv2d_backward_weight", "cpu", "direct"): "convlib.cpu.direct_backward:WEIGHT",
    ("conv2d_backward_weight", "cpu", "im2col"): "convlib.cpu.im2col_backward:WEIGHT",
    ("conv2d_backward_weight", "cpu", "blis"): "convlib.cpu.blis_backward:WEIGHT",
    ("conv2d_backward_bias", "cpu", "direct"): "convlib.cpu.bias_gradient",
    ("conv2d_backward_data", "sycl", "direct"): "convlib.sycl.direct_backward:DATA",
    ("conv2d_backward_weight", "sycl", "direct"): "convlib.sycl.direct_backward:WEIGHT",
    ("conv2d_backward_bias", "sycl", "direct"): "convlib.sycl.bias_gradient",
    ("conv2d_backward_data", "cuda", "direct"): "convlib.cuda.direct_backward:DATA",
    ("conv2d_backward_weight", "cuda", "direct"): "convlib.cuda.direct_backward:WEIGHT",
    ("conv2d_backward_bias", "cuda", "direct"): "convlib.cuda.bias_gradient",
}


def check_operation(operation) -> str:
    """``operation`` when it is one of :data:`OPERATIONS`, else a ``ValueError``."""
    if operation not in OPERATIONS:
        raise ValueError(f"op={operation!r}: allowed are {', '.join(map(repr, OPERATIONS))}")
    return operation


def algorithm_names(backend: str, operation: str = "conv2d") -> list[str]:
    """Algorithms registered for ``operation`` on ``backend``, in :data:`ALGORITHM_NAMES` order."""
    names = [a for (op, b, a) in _IMPLEMENTATIONS if op == operation and b == backend]
    return sorted(names, key=lambda a: ALGORITHM_NAMES.index(a) if a in ALGORITHM_NAMES else len(ALGORITHM_NAMES))


def distinct_algorithm_names(backend: str, operation: str = "conv2d") -> list[str]:
    """:func:`algorithm_names` with each implementation once: of two names served by the same
    implementation (``winograd`` and ``winograd4``), the first is kept. Imports nothing."""
    names, locations = [], set()
    for algo in algorithm_names(backend, operation):
        location = _IMPLEMENTATIONS[(operation, backend, algo)]
        if location not in locations:
            locations.add(location)
            names.append(algo)
    return names


def entries(operation: str | None = None) -> list[tuple[str, str, str]]:
    """Every registered ``(operation, backend, algorithm)`` (of ``operation`` when given)."""
    keys = [k for k in _IMPLEMENTATIONS if operation is None or k[0] == operation]
    return sorted(keys, key=lambda k: (OPERATIONS.index(k[0]), BACKENDS.index(k[1]),
                                       algorithm_names(k[1], k[0]).index(k[2])))


def implementation(operation: str, backend: str, algo: str):
    """The implementation of ``algo`` for ``operation`` on ``backend`` (imported on first use)."""
    module, _, attr = _IMPLEMENTATIONS[(operation, backend, algo)].partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attr) if attr else loaded


def unsupported_reason(operation: str, backend: str, algo: str, problem) -> str | None:
    """Why ``algo`` on ``backend`` cannot serve ``problem``, or None when it can."""
    if algo not in algorithm_names(backend, operation):
        return f"algo={algo!r} is not implemented for {operation} on the {backend} backend"
    return implementation(operation, backend, algo).supports(problem)


def serving_algorithms(operation: str, backend: str, problem) -> list[str]:
    """The algorithms of ``backend`` that can serve ``problem``."""
    return [a for a in algorithm_names(backend, operation)
            if implementation(operation, backend, a).supports(problem) is None]
