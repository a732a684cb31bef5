"""numba CPU kernels, one module per algorithm (``direct``, ``im2col``, ``blis``, ``winograd``).

Every module exposes ``supports(problem)`` and ``conv2d(problem, x, w, bias, device)`` (see
:mod:`convlib.registry`). Kernels are compiled with ``cache=True`` where numba allows it, so a new
process pays the compile cost only once per machine.
"""
