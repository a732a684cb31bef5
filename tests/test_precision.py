"""float16 and bfloat16: refused with a message naming CUDA where they are not computed, and the
host bfloat16 rounding (:mod:`convlib.core.precision`) against an independent implementation.
Their results on CUDA are checked in ``tests/test_cuda.py`` (simulator and GPU)."""

from __future__ import annotations

import numpy as np
import pytest

import convlib
from convlib.core.precision import bfloat16_bits, from_bfloat16_bits
from convlib.dispatch.devices import dtype_refusal


@pytest.mark.parametrize("device", [None, "cpu"])
def test_half_precision_is_refused_off_cuda_naming_cuda(device):
    x, w = np.zeros((1, 2, 5, 5), np.float16), np.zeros((3, 2, 3, 3), np.float16)
    refusal = r"x has dtype float16, which the cpu backend does not compute .*float32, float64.*computed on: cuda"
    with pytest.raises(TypeError, match=refusal):
        convlib.conv2d(x, w, device=device)
    with pytest.raises(TypeError, match="dy has dtype float16, which the cpu backend"):
        convlib.conv2d_backward_bias(np.zeros((2, 3, 4, 4), np.float16), device=device)
    with pytest.raises(TypeError, match="x has dtype float16, which the cpu backend"):
        convlib.conv2d_backward_weight(x, np.zeros((1, 3, 3, 3), np.float16), (3, 2, 3, 3), device=device)


def test_sycl_refuses_half_precision_naming_cuda():
    message = dtype_refusal("bfloat16", "sycl", "conv2d_backward_data")
    assert message.startswith("dy has dtype bfloat16, which the sycl backend does not compute")
    assert "computed on: cuda" in message


def test_bfloat16_tensors_on_the_cpu_say_where_they_run():
    torch = pytest.importorskip("torch")
    x = torch.zeros(1, 2, 5, 5, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"bfloat16.*(CUDA|cuda)"):
        convlib.conv2d(x, torch.zeros(3, 2, 3, 3, dtype=torch.bfloat16))


def _float32_patterns() -> np.ndarray:
    """Random float32 bit patterns plus the hard ones: ties (even and odd), values that round up
    into the next binade and to infinity, subnormals, signed zeros, infinities, NaNs."""
    rng = np.random.default_rng(0)
    special = np.array([
        0x3F808000, 0x3F818000, 0x3F80C000, 0x3F807FFF, 0x3FFF8000, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF,
        0x00000001, 0x00008000, 0x00018000, 0x007FFFFF, 0x00000000, 0x80000000, 0x7F800000, 0xFF800000,
        0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0xBF808000, 0xFF7F8000,
    ], dtype=np.uint32)
    return np.concatenate([rng.integers(0, 2**32, 2**18, dtype=np.uint64).astype(np.uint32), special]).view(np.float32)


def _independent_bfloat16_bits(values):
    try:
        import ml_dtypes

        return values.astype(ml_dtypes.bfloat16).view(np.uint16)
    except ImportError:
        torch = pytest.importorskip("torch", reason="ml_dtypes or torch is the independent bfloat16")
        return torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def test_bfloat16_rounding_matches_an_independent_implementation():
    values = _float32_patterns()
    ours, theirs = bfloat16_bits(values), _independent_bfloat16_bits(values)
    nan = np.isnan(values)
    assert np.array_equal(ours[~nan], theirs[~nan])
    assert np.isnan(from_bfloat16_bits(ours[nan])).all(), "a NaN must stay a NaN"
    representable = from_bfloat16_bits(ours[~nan])
    assert np.array_equal(bfloat16_bits(representable), ours[~nan]), "bfloat16 values must convert exactly"


def test_dask_refuses_half_precision_chunks_when_the_graph_is_built():
    da = pytest.importorskip("dask.array")
    x = da.zeros((2, 3, 8, 8), chunks=(1, 3, 8, 8), dtype=np.float16)
    with pytest.raises(TypeError, match="x has dtype float16, which the cpu backend does not compute"):
        convlib.conv2d(x, np.zeros((4, 3, 3, 3), np.float16))
