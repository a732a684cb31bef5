"""SYCL backend: numba-dpex 0.23 kernels on dpctl devices, one module per algorithm.

Nothing here imports dpctl, dpnp or numba-dpex at import time: :mod:`convlib.sycl.runtime`
configures the environment and loads them on first SYCL use (see ``docs/devices.md``).
"""
