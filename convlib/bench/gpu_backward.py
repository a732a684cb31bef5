"""The CUDA backward passes against cuDNN: ``python -m convlib.bench.gpu_backward``.

convlib's ``conv2d_backward_data`` and ``conv2d_backward_weight`` on the GPU (``device="cuda"``)
and cuDNN's through ``torch.nn.grad.conv2d_input`` / ``conv2d_weight`` on the same CUDA tensors,
on ResNet-50 v1.5 layers, float32 with TF32 off (exact FP32 on both sides). Each call is timed
to a ``torch.cuda.synchronize``; medians of interleaved repeats; every result is checked against
PyTorch in float64 on the CPU. Needs PyTorch with CUDA and numba-cuda (the GPU machine).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

#: (name, C, H (= W), K, R (= S), stride, padding): ResNet-50 v1.5 layers of every stage.
LAYERS = (
    ("stem 7x7/2 3>64", 3, 224, 64, 7, 2, 3),
    ("s2 3x3 64>64", 64, 56, 64, 3, 1, 1),
    ("s2 1x1 256>64", 256, 56, 64, 1, 1, 0),
    ("s3 3x3/2 128>128", 128, 56, 128, 3, 2, 1),
    ("s4 3x3 256>256", 256, 14, 256, 3, 1, 1),
    ("s4 1x1 1024>256", 1024, 14, 256, 1, 1, 0),
    ("s5 3x3 512>512", 512, 7, 512, 3, 1, 1),
)


def _median_ms(calls: dict, repeats: int) -> dict:
    import torch

    for call in calls.values():  # compile and warm up
        call()
    torch.cuda.synchronize()
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) * 1e3 for name, t in times.items()}


def _relative_error(result, reference) -> float:
    import torch

    got = torch.as_tensor(result).double().cpu()
    return float((got - reference).abs().max() / reference.abs().max())


def measure_layer(layer, batch: int, repeats: int) -> dict:
    """Times (ms) and relative errors of both passes for one layer."""
    import torch

    import convlib

    _, C, H, K, R, stride, padding = layer
    gen = torch.Generator().manual_seed(0)
    dev = torch.device("cuda")
    x = torch.randn(batch, C, H, H, generator=gen).to(dev)
    w = torch.randn(K, C, R, R, generator=gen).to(dev)
    y = torch.nn.functional.conv2d(x, w, stride=stride, padding=padding)
    dy = torch.randn(y.shape, generator=gen).to(dev)
    geometry = dict(stride=stride, padding=padding)
    calls = {
        "data convlib": lambda: convlib.conv2d_backward_data(dy, w, x.shape, device="cuda", **geometry),
        "data cudnn": lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, **geometry),
        "weight convlib": lambda: convlib.conv2d_backward_weight(x, dy, w.shape, device="cuda", **geometry),
        "weight cudnn": lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, **geometry),
    }
    xd, wd, dyd = x.double().cpu(), w.double().cpu(), dy.double().cpu()
    out = _median_ms(calls, repeats)
    out["data error"] = _relative_error(calls["data convlib"](), torch.nn.grad.conv2d_input(x.shape, wd, dyd, **geometry))
    out["weight error"] = _relative_error(calls["weight convlib"](), torch.nn.grad.conv2d_weight(xd, w.shape, dyd, **geometry))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m convlib.bench.gpu_backward", description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)

    import torch

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    print(torch.cuda.get_device_name(), f"batch {args.batch}, float32, TF32 off")
    ratios = {"data": [], "weight": []}
    for layer in LAYERS:
        m = measure_layer(layer, args.batch, args.repeats)
        line = f"{layer[0]:18s}"
        for p in ("data", "weight"):
            ratio = m[f"{p} convlib"] / m[f"{p} cudnn"]
            ratios[p].append(ratio)
            line += (f"  {p}: convlib {m[f'{p} convlib']:7.3f} ms, cuDNN {m[f'{p} cudnn']:6.3f} ms"
                     f" ({ratio:5.1f}x, error {m[f'{p} error']:.1e})")
        print(line, flush=True)
    print("geomean convlib / cuDNN: " + ", ".join(
        f"{p} {float(np.exp(np.mean(np.log(r)))):.2f}" for p, r in ratios.items()))


if __name__ == "__main__":
    main()
