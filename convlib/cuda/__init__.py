"""The CUDA backend: numba-cuda kernels for NVIDIA GPUs (optional; ``pip install 'convlib[cuda]'``).

Rooms: :mod:`.backend` (devices, streams, where arrays live and come back), :mod:`.tables` (every
tuning knob, and the tile types) and :mod:`.tiles` (which tile a launch uses); the algorithms
:mod:`.direct`, :mod:`.im2col`, :mod:`.blis` and :mod:`.winograd`; the toolkit :mod:`.gemm` (the
tiled shared-memory FP32 GEMM kernel the GEMM algorithms are built from), :mod:`.tensor_gemm`
(``blis`` on tensor cores: float16, bfloat16, TF32), :mod:`.ptx` (the PTX instructions numba-cuda
lacks), :mod:`.half` (widened half precisions), :mod:`.codegen` and :mod:`.launch`. The GPU
machine's suite and benchmark is :mod:`convlib.bench.gpu_check`.

Importing this package imports nothing from numba; :mod:`.backend` does, on first use.
"""
