"""The SYCL backend: numba-dpex 0.23 kernels on dpctl devices.

Rooms: :mod:`.backend` (queues, data in and out), :mod:`.tables` (every tuning knob),
:mod:`.runtime` and :mod:`.environment` (loading and configuring the SYCL stack); the algorithms
:mod:`.direct`, :mod:`.im2col`, :mod:`.blis` and :mod:`.winograd`; the toolkit :mod:`.launch`
(work-groups, the FMA intrinsic), :mod:`.memory` (device arrays, host views, padding) and
:mod:`.host_copy`. The SYCL benchmark is :mod:`convlib.bench.sycl`.

Nothing here imports dpctl, dpnp or numba-dpex at import time: :mod:`convlib.sycl.runtime`
configures the environment and loads them on first SYCL use (see ``docs/devices.md``).
"""
