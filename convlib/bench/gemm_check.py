"""Does ``blis`` lose to packing from the image? Its time beside a plain GEMM of the same size.

For each layer, three candidates are timed round-robin in one process (see
:func:`convlib.core.timing.time_interleaved`):

``blis conv``
    the convolution through :mod:`convlib.cpu.blis` (B panels gathered from the NCHW image);
``blis gemm``
    the same five-loop driver and micro-kernel on an ordinary ``M x K`` by ``K x N`` product: a
    1x1, stride-1 convolution of one image with ``C = K_gemm`` channels and ``H x W = N_gemm``
    pixels, whose B packing is a plain row copy, as in any BLIS GEMM (our best GEMM);
``numpy matmul``
    numpy's BLAS on the same matrices, for reference.

``conv / gemm`` above 1 is what packing from the image costs. Run::

    NUMBA_NUM_THREADS=2 python -m convlib.bench.gemm_check [--batch 8] [--repeats 7]
"""

from __future__ import annotations

import argparse

import numpy as np

from ..api import build_problem
from ..core.timing import time_interleaved
from ..dispatch.plan import make_plan
from .suites import RESNET50_V15_LAYERS

#: The 3x3 layers of ResNet-50 v1.5 and two 1x1 layers (names as in the ``resnet50`` suite).
DEFAULT_LAYERS = (
    "s2 3x3 64>64", "s3 3x3 128>128", "s4 3x3 256>256", "s5 3x3 512>512",
    "s3 3x3/2 128>128", "s4 1x1 1024>256",
)


def layer_calls(name: str, batch: int, seed: int = 0) -> tuple[dict, tuple[int, int, int], float]:
    """The three zero-argument calls for one layer, its ``(M, N, K)`` and its FLOPs."""
    _, C, H, W, K, R, S, stride, pad, _ = next(layer for layer in RESNET50_V15_LAYERS if layer[0] == name)
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (batch, C, H, W)).astype(np.float32)
    w = rng.uniform(-1, 1, (K, C, R, S)).astype(np.float32)
    conv = build_problem(x, w, None, stride=stride, padding=pad)
    M, N, Kg = conv.gemm_m, conv.gemm_n, conv.gemm_k
    a = rng.uniform(-1, 1, (M, Kg)).astype(np.float32)
    b = rng.uniform(-1, 1, (Kg, N)).astype(np.float32)
    # The GEMM as a 1x1 convolution: B's Kg rows are channels, its N columns one image's pixels.
    b_image = b.reshape(1, Kg, 1, N)
    a_filters = a.reshape(M, Kg, 1, 1)
    gemm = build_problem(b_image, a_filters, None)
    conv_plan = make_plan("conv2d", conv, "cpu", "blis")
    gemm_plan = make_plan("conv2d", gemm, "cpu", "blis")
    calls = {
        "blis conv": conv_plan.timed_call(*conv_plan.prepare(x, w, None)),
        "blis gemm": gemm_plan.timed_call(*gemm_plan.prepare(b_image, a_filters, None)),
        "numpy matmul": lambda: a @ b,
    }
    return calls, (M, N, Kg), conv.flops


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m convlib.bench.gemm_check", description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--layer", action="append", help="a resnet50 layer name (repeatable)")
    args = parser.parse_args(argv)
    print("layer                 M     N      K     blis conv  blis gemm  numpy    conv/gemm  GFLOP/s conv/gemm/numpy")
    for name in args.layer or DEFAULT_LAYERS:
        calls, (M, N, K), flops = layer_calls(name, args.batch)
        t = time_interleaved(calls, args.repeats, warmup=1, gap_s=0.01)
        med = {key: timing.median_s for key, timing in t.items()}
        rates = "/".join(f"{flops / med[key] / 1e9:.0f}" for key in calls)
        print(f"{name:20s} {M:4d} {N:6d} {K:5d}   {med['blis conv'] * 1e3:8.2f}  {med['blis gemm'] * 1e3:8.2f}"
              f"  {med['numpy matmul'] * 1e3:7.2f}   {med['blis conv'] / med['blis gemm']:6.2f}     {rates}")


if __name__ == "__main__":
    main()
