"""The dtypes convlib convolves, and how the two 16-bit ones are held and rounded.

float32 and float64 are computed in their own precision on every backend. float16 and bfloat16
are *widened*: a backend that accepts them (CUDA) converts the inputs to float32, runs its float32
kernels (so every product and sum is float32, as cuDNN's half-precision convolutions accumulate)
and rounds the result once to the input's dtype. The other backends refuse them with a
``TypeError`` that names the devices that accept them.

numpy has no bfloat16 of its own. Where one is installed, ``ml_dtypes.bfloat16`` (which JAX
brings) is the host dtype; PyTorch tensors carry their own. On a device a bfloat16 array is held
as ``uint16`` bit patterns, and :func:`bfloat16_bits` / :func:`from_bfloat16_bits` convert on the
host exactly as the device kernels do (round to nearest even; a NaN stays a NaN).
"""

from __future__ import annotations

import numpy as np

#: Every dtype a problem may have, in the order messages list them.
DTYPES = ("float32", "float64", "float16", "bfloat16")

#: The dtype each problem dtype is computed in.
COMPUTE_DTYPE = {"float32": "float32", "float64": "float64", "float16": "float32", "bfloat16": "float32"}

ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}


def dtype_name(dtype) -> str:
    """The name of ``dtype``: a numpy dtype or type, a string, or a PyTorch dtype (``torch.bfloat16``
    -> ``"bfloat16"``). Unknown kinds give their string form, which no check accepts."""
    if isinstance(dtype, str):
        return dtype
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype).rpartition(".")[2]


def bfloat16_bits(values) -> np.ndarray:
    """The bfloat16 nearest to each of ``values`` (rounded to nearest even), as ``uint16`` bits."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)


def from_bfloat16_bits(bits) -> np.ndarray:
    """The float32 values of bfloat16 ``uint16`` bit patterns (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def host_bfloat16():
    """``ml_dtypes.bfloat16`` as a numpy dtype, or None when ml_dtypes is not installed."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)
