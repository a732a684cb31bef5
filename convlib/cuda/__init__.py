"""The CUDA backend: numba-cuda kernels for NVIDIA GPUs (optional; ``pip install 'convlib[cuda]'``).

Modules: :mod:`.backend` (devices, streams, where arrays live and come back), :mod:`.blocking`
(tile sizes as data), :mod:`.direct`, :mod:`.im2col` and :mod:`.blis` (the algorithms),
:mod:`.gemm` (the tiled shared-memory GEMM kernel both GEMM algorithms are built from) and
:mod:`.gpu_check` (the suite and the benchmark in one command, for a GPU machine).

Importing this package imports nothing from numba; :mod:`.backend` does, on first use.
"""
