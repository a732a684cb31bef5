"""float16 and bfloat16 on the GPU: widened to float32, computed by the float32 algorithms,
rounded back once (:mod:`convlib.core.precision` says why every backend that accepts them does
it this way). Two computations are their own: ``blis`` on tensor cores
(:mod:`convlib.cuda.tensor_gemm`) and ``im2col`` of a 1x1 stride-1 layer without a bias, one
cuBLAS GEMM on the half values in place (:func:`convlib.cuda.im2col.run_half_in_place`), which
:class:`Widened` hands the call to where the inner implementation says it can
(``runs_half_in_place``).

:class:`Widened` wraps any CUDA implementation of float32 problems and keeps the implementation
contract (:mod:`convlib.core.contracts`) for problems of a 16-bit dtype, so each algorithm serves
the half precisions without a kernel of its own. A bfloat16 array is held on the device as
``uint16`` bit patterns (:class:`convlib.cuda.backend.CudaBackend` views PyTorch's bfloat16
tensors that way); the conversions below work on those bits, rounding to nearest even as
:func:`convlib.core.precision.bfloat16_bits` does on the host.

Tensor cores: a widened float16 or bfloat16 value has at most 11 significant bits, so it is exact
in TF32 (10 stored mantissa bits, float32's exponent range), and the product of two of them is
exact too. A GEMM whose operands are the inputs themselves (im2col's: its column matrix is a copy
of ``x``) therefore runs on TF32 tensor cores with float32 accumulation and no other rounding,
which is what cuDNN's half-precision convolutions do. Algorithms that transform their operands
first (Winograd) keep exact float32 GEMMs unless ``allow_tf32`` asks otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading

import numpy as np

from .launch import cuda, flat, scalar_type
from .tables import launch_knob

# Per thread, not in convlib.options: another thread's exact float32 call must never see it.
_GEMM_OF_WIDENED_INPUTS = threading.local()


def gemm_of_widened_inputs() -> bool:
    """Whether the GEMM this thread is running multiplies widened float16 / bfloat16 inputs
    themselves (exact in TF32: the module docstring)."""
    return getattr(_GEMM_OF_WIDENED_INPUTS, "active", False)


@contextlib.contextmanager
def _widened_inputs(active: bool):
    saved = gemm_of_widened_inputs()
    _GEMM_OF_WIDENED_INPUTS.active = active
    try:
        yield
    finally:
        _GEMM_OF_WIDENED_INPUTS.active = saved


@functools.cache
def _kernel(name: str):
    """The elementwise conversion kernel ``name``; each is ``kernel(src, dst)`` over flat arrays."""
    F16, F32, U16, U32 = (scalar_type(t) for t in ("float16", "float32", "uint16", "uint32"))

    def widen_float16(src, dst):  # IN float16 (n,), OUT float32 (n,)
        i = cuda.grid(1)
        if i < dst.size:
            dst[i] = F32(src[i])

    def widen_bfloat16(src, dst):  # IN bfloat16 bits uint16 (n,), OUT float32 bits uint32 (n,)
        i = cuda.grid(1)
        if i < dst.size:
            dst[i] = U32(src[i]) << U32(16)

    def narrow_float16(src, dst):  # IN float32 (n,), OUT float16 (n,), rounded to nearest even
        i = cuda.grid(1)
        if i < dst.size:
            dst[i] = F16(src[i])

    def narrow_bfloat16(src, dst):  # IN float32 bits uint32 (n,), OUT bfloat16 bits uint16 (n,)
        i = cuda.grid(1)
        if i < dst.size:
            b = U32(src[i])
            if (b & U32(0x7FFFFFFF)) > U32(0x7F800000):  # NaN: keep it one, quiet
                dst[i] = U16((b >> U32(16)) | U32(0x40))
            else:  # round to nearest even; overflow rounds to infinity, as it should
                dst[i] = U16((b + U32(0x7FFF) + ((b >> U32(16)) & U32(1))) >> U32(16))

    return cuda.jit(locals()[name])


def _launch(name: str, src, dst, target) -> None:
    if dst.size:
        threads = launch_knob("elementwise_threads", target.simulator)
        _kernel(name)[-(-dst.size // threads), threads, target.stream](flat(src), flat(dst))


def widen(arr, dtype: str, target):
    """A new float32 device array holding the values of the ``dtype`` array ``arr``."""
    wide = target.empty(arr.shape, np.float32)
    if dtype == "bfloat16":
        _launch("widen_bfloat16", arr, wide.view(np.uint32), target)
    else:
        _launch("widen_float16", arr, wide, target)
    return wide


def narrow(wide, dtype: str, target):
    """A new ``dtype`` device array holding the float32 array ``wide`` rounded to nearest even."""
    out = target.empty(wide.shape, dtype)
    if dtype == "bfloat16":
        _launch("narrow_bfloat16", wide.view(np.uint32), out, target)
    else:
        _launch("narrow_float16", wide, out, target)
    return out


class Widened:
    """A CUDA implementation of float32 problems serving float16 / bfloat16 problems of the same
    geometry: the module docstring says how.

    Parameters
    ----------
    inner : implementation
        The float32 implementation (a module or object of the contract). Its attribute
        ``GEMM_OF_INPUTS`` (default False) says that its GEMM multiplies copies of the inputs,
        which lets it run on TF32 tensor cores without loss here.
    """

    def __init__(self, inner):
        self.inner = inner
        self.tf32_is_exact = bool(getattr(inner, "GEMM_OF_INPUTS", False))

    def supports(self, problem) -> str | None:
        return self.inner.supports(problem.widened())

    def _in_place(self, problem) -> bool:
        runs = getattr(self.inner, "runs_half_in_place", None)
        return runs is not None and runs(problem)

    def workspace_bytes(self, problem, device=None) -> int:
        """The inner implementation's workspace plus the float32 copies of the three tensors
        (every operation reads two of x, w, y and writes the third) and of the bias; none where
        the inner implementation computes the half precision itself."""
        if self._in_place(problem):
            return 0
        elements = sum(math.prod(shape) for shape in (problem.x_shape, problem.w_shape, problem.y_shape))
        return self.inner.workspace_bytes(problem.widened(), device) + 4 * (elements + problem.K + problem.C)

    def run(self, problem, *arrays_and_device):
        """The contract's ``run``: the arrays (of ``problem.dtype``, bfloat16 as bits) widened,
        the float32 problem solved, its result rounded back to ``problem.dtype``; or, where the
        inner implementation computes the half precision itself (``runs_half_in_place``), that."""
        *arrays, target = arrays_and_device
        if self._in_place(problem):
            return self.inner.run_half_in_place(problem, arrays[0], arrays[1], target)
        with target.activate():
            wide = [None if a is None else widen(a, problem.dtype, target) for a in arrays]
            with _widened_inputs(self.tf32_is_exact):
                result = self.inner.run(problem.widened(), *wide, target)
            return narrow(result, problem.dtype, target)

    def __repr__(self) -> str:
        return f"Widened({getattr(self.inner, '__name__', self.inner)!r})"


@functools.cache
def widened(inner) -> Widened:
    """The one :class:`Widened` of each float32 implementation."""
    return Widened(inner)
