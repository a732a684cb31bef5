"""Edge detection, blur and sharpening of real photographs: a batch of images, several filters, one call.

The photographs bundled with scikit-image (``skimage.data``): the camera man (grey), the astronaut
(its grey version and each of its red, green and blue planes as a grey image) and, at full size
only, the Hubble deep field (its three planes; the image may need a download, and is left out with
a message when it does not load). Each same-sized set of images is one batch ``(N, 1, H, W)``
convolved by **one** :func:`convlib.conv2d` call with four filters as ``K = 4`` output channels:
Sobel x and Sobel y (edges, drawn as the gradient magnitude), a 5x5 Gaussian blur and a 3x3
sharpening filter. The 3x3 filters sit in the middle of 5x5 ones (zeros around), so one weight
tensor ``(4, 1, 5, 5)`` and ``padding="same"`` serve all four.

Every output plane is checked against ``scipy.ndimage.correlate`` in float64 (convlib computes a
cross-correlation, like PyTorch and ``cv2.filter2D``; zero padding) to float32 tolerance: the
script exits 1 on a mismatch. It times the convlib call (warm, median) beside ``cv2.filter2D``
and ``scipy.ndimage.correlate`` applied to every image and filter, when they import, and writes
the results as PNG files into ``--out`` (a temporary folder by default).

    python examples/image_filters.py                     # full size: 512^2 photographs and the Hubble field
    python examples/image_filters.py --smoke             # 128^2 crops, seconds (CI)
    python examples/image_filters.py --out filtered/ --device opencl:cpu:0
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import convlib

#: Relative tolerance of the check (of the largest magnitude of each plane): float32 sums of 25 taps.
TOLERANCE = 1e-5


def filters() -> tuple[list[str], np.ndarray]:
    """The four filters as one ``(4, 1, 5, 5)`` float32 weight tensor, and their names."""
    sobel_x = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], dtype=np.float64)
    sharpen = np.array([[0, -1, 0], [-1, 5, -1], [0, -1, 0]], dtype=np.float64)
    g = np.exp(-0.5 * (np.arange(-2, 3) / 1.0) ** 2)
    gaussian = np.outer(g, g) / np.outer(g, g).sum()
    w = np.zeros((4, 1, 5, 5))
    w[0, 0, 1:4, 1:4] = sobel_x
    w[1, 0, 1:4, 1:4] = sobel_x.T
    w[2, 0] = gaussian
    w[3, 0, 1:4, 1:4] = sharpen
    return ["sobel_x", "sobel_y", "gaussian_blur", "sharpen"], w.astype(np.float32)


def photographs(smoke: bool) -> list[tuple[str, list[str], np.ndarray]]:
    """Same-sized batches ``(title, names, (N, 1, H, W) float32 in [0, 1])`` of scikit-image's photographs."""
    from skimage import color, data

    astronaut = data.astronaut()
    planes = [("camera", data.camera()), ("astronaut_grey", color.rgb2gray(astronaut) * 255)]
    planes += [(f"astronaut_{c}", astronaut[..., i]) for i, c in enumerate("rgb")]
    step = 4 if smoke else 1  # 128^2 crops of the 512^2 photographs at smoke size
    batches = [("512^2 photographs" if not smoke else "128^2 crops",
                [n for n, _ in planes],
                np.stack([np.asarray(p, dtype=np.float32)[::step, ::step] / 255 for _, p in planes])[:, None])]
    if not smoke:
        try:
            hubble = data.hubble_deep_field()
        except Exception as exc:  # noqa: BLE001 -- a download that failed, no network, no pooch
            print(f"hubble_deep_field not loaded ({type(exc).__name__}: {exc}); left out")
        else:
            batches.append((f"Hubble deep field {hubble.shape[0]}x{hubble.shape[1]}",
                            [f"hubble_{c}" for c in "rgb"],
                            np.ascontiguousarray(hubble.transpose(2, 0, 1)[:, None], dtype=np.float32) / 255))
    return batches


def median_seconds(call, repeats: int) -> float:
    """Median wall time of ``repeats`` calls after one untimed call."""
    call()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def check(x: np.ndarray, w: np.ndarray, y: np.ndarray) -> float:
    """The worst relative error of ``y`` against ``scipy.ndimage.correlate`` in float64 (zero padding)."""
    from scipy import ndimage

    worst = 0.0
    for n in range(x.shape[0]):
        for k in range(w.shape[0]):
            ref = ndimage.correlate(x[n, 0].astype(np.float64), w[k, 0].astype(np.float64), mode="constant")
            scale = max(float(np.abs(ref).max()), 1e-30)
            worst = max(worst, float(np.abs(y[n, k] - ref).max()) / scale)
    return worst


def baselines(x: np.ndarray, w: np.ndarray) -> dict:
    """Calls doing the same work with OpenCV and scipy (every image, every filter), those that import."""
    calls = {}
    try:
        import cv2

        def opencv():
            return [[cv2.filter2D(x[n, 0], -1, w[k, 0], borderType=cv2.BORDER_CONSTANT) for k in range(len(w))]
                    for n in range(len(x))]
        calls["cv2.filter2D"] = opencv
    except ImportError:
        pass
    try:
        from scipy import ndimage

        def scipy_ndimage():
            return [[ndimage.correlate(x[n, 0], w[k, 0], mode="constant") for k in range(len(w))]
                    for n in range(len(x))]
        calls["scipy.ndimage.correlate"] = scipy_ndimage
    except ImportError:
        pass
    return calls


def save(out: Path, names: list[str], filter_names: list[str], y: np.ndarray) -> list[Path]:
    """PNG files: each image's edge magnitude, blur and sharpened version (scaled to 0..255)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for n, name in enumerate(names):
        planes = {"edges": np.hypot(y[n, 0], y[n, 1]), filter_names[2]: y[n, 2], filter_names[3]: y[n, 3]}
        for what, plane in planes.items():
            path = out / f"{name}-{what}.png"
            plt.imsave(path, np.clip(plane, 0, None) if what != "edges" else plane, cmap="gray")
            paths.append(path)
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="128^2 crops, no Hubble field: seconds (CI)")
    p.add_argument("--full", action="store_true", help="full size (the default; for symmetry with the other examples)")
    p.add_argument("--device", default="cpu", help="a device of convlib.devices() (default cpu)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls of each method (median)")
    p.add_argument("--out", type=Path, default=None, help="folder of the PNG files (default: a new temporary folder)")
    args = p.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="convlib-filters-"))
    out.mkdir(parents=True, exist_ok=True)
    filter_names, w = filters()
    status = 0
    for title, names, x in photographs(args.smoke):
        n, _, h, width = x.shape
        y = convlib.conv2d(x, w, padding="same", device=args.device)
        choice = convlib.choose_algorithm(x, w, padding="same", device=args.device)
        error = check(x, w, y)
        ok = error <= TOLERANCE
        status |= not ok
        print(f"{title}: {n} images x {len(w)} filters ({', '.join(filter_names)}), one conv2d call on "
              f"{args.device} (auto: {choice.algo}); worst error vs scipy float64 {error:.1e} "
              f"{'ok' if ok else 'MISMATCH (tolerance %.0e)' % TOLERANCE}")
        times = {f"convlib.conv2d (one call, {choice.algo})":
                 median_seconds(lambda: convlib.conv2d(x, w, padding="same", device=args.device), args.repeats)}
        for label, call in baselines(x, w).items():
            times[f"{label} ({n * len(w)} calls)"] = median_seconds(call, args.repeats)
        fastest = min(times.values())
        for label, t in times.items():
            print(f"  {label:45s} {t * 1e3:8.2f} ms  ({t / fastest:.2f}x the fastest)")
        paths = save(out, names, filter_names, y)
        print(f"  wrote {len(paths)} PNG files to {out}")
    if status:
        print("FAILED: a result differs from scipy's beyond float32 tolerance", file=sys.stderr)
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
