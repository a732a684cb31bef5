"""What ``algo="auto"`` picks, and why: the rules, a measured choice, and this machine's tuned profile.

For a few shapes people run (the thesis' 4-channel 1024^2 images, ResNet-50 layers, a depthwise
layer, a single-channel image filter) it prints what :func:`convlib.choose_algorithm` picks by its
rules and the one-sentence reason; then, for the same shapes, ``measure=True``: every algorithm
that can serve is timed on random data of that shape (warm, interleaved, median) and the fastest
is remembered for later ``auto`` calls. Last, the tuned profile of this machine
(``python -m convlib.tune``, docs/tuning.md), if there is one.

Measured choices are kept in the tuning cache (``$CONVLIB_CACHE_DIR/tuning.json``), where every
later process's ``auto`` finds them. This example keeps them in a temporary cache unless given
``--remember`` (it still uses this machine's tuned profile), so running it changes nothing.

    python examples/choose_algorithm.py              # full size (about a minute on 2 cores)
    python examples/choose_algorithm.py --smoke      # small shapes, seconds (CI)
    python examples/choose_algorithm.py --device opencl:cpu:0
    python examples/choose_algorithm.py --remember   # keep the measured choices for later auto calls
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import numpy as np

import convlib

#: (label, x shape (N, C, H, W), w shape (K, C/groups, R, S), padding, groups) at full size.
SHAPES = (
    ("thesis seed 8x4x1024^2, 3x3", (8, 4, 1024, 1024), (4, 4, 3, 3), 0, 1),
    ("ResNet-50 s2 3x3 64>64, batch 8", (8, 64, 56, 56), (64, 64, 3, 3), 1, 1),
    ("ResNet-50 s4 1x1 1024>256, batch 8", (8, 1024, 14, 14), (256, 1024, 1, 1), 0, 1),
    ("MobileNetV2 dw 144 56, batch 8", (8, 144, 56, 56), (144, 1, 3, 3), 1, 144),
    ("5x5 blur of a 2048^2 image", (1, 1, 2048, 2048), (1, 1, 5, 5), 2, 1),
)
#: The same kinds of layer, small enough for CI.
SMOKE_SHAPES = (
    ("thesis-like 2x4x64^2, 3x3", (2, 4, 64, 64), (4, 4, 3, 3), 0, 1),
    ("3x3 32>32, 16^2", (2, 32, 16, 16), (32, 32, 3, 3), 1, 1),
    ("1x1 64>32, 8^2", (2, 64, 8, 8), (32, 64, 1, 1), 0, 1),
    ("dw 16 16^2", (2, 16, 16, 16), (16, 1, 3, 3), 1, 16),
    ("5x5 blur of a 128^2 image", (1, 1, 128, 128), (1, 1, 5, 5), 2, 1),
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="small shapes, seconds")
    p.add_argument("--device", default="cpu", help="a device of convlib.devices() (default cpu)")
    p.add_argument("--repeats", type=int, default=None, help="timed calls per candidate with measure=True")
    p.add_argument("--remember", action="store_true",
                   help="keep the measured choices in the real tuning cache (default: a temporary one)")
    args = p.parse_args(argv)
    profile_text = convlib.tune.show()
    if not args.remember:
        from convlib.cpu.profile import profile_path

        # The tuned profile lives in the same folder as the tuning cache: name it explicitly
        # before the cache moves to a temporary folder, so the kernels still use it.
        profile = profile_path()
        if "CONVLIB_PROFILE" not in os.environ and profile is not None and profile.exists():
            os.environ["CONVLIB_PROFILE"] = str(profile)
        os.environ["CONVLIB_CACHE_DIR"] = tempfile.mkdtemp(prefix="convlib-choose-")
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    repeats = args.repeats or (2 if args.smoke else 5)
    if args.device not in convlib.devices():
        print(f"--device {args.device}: not here; convlib.devices() lists {convlib.devices()}", file=sys.stderr)
        return 2
    print(f"devices here: {convlib.devices()}; algorithms on {args.device}: {convlib.algorithms(args.device)}\n")

    rng = np.random.default_rng(0)
    status = 0
    for label, x_shape, w_shape, padding, groups in shapes:
        x = rng.random(x_shape, dtype=np.float32)
        w = rng.random(w_shape, dtype=np.float32)
        kwargs = dict(padding=padding, groups=groups, device=args.device)
        ruled = convlib.choose_algorithm(x, w, **kwargs)
        print(f"{label}")
        print(f"  by the rules: {ruled.algo:9s} -- {ruled.reason}")
        print(f"  candidates:   {', '.join(ruled.candidates)}")
        measured = convlib.choose_algorithm(x, w, measure=True, repeats=repeats, **kwargs)
        ranked = sorted(measured.timings.items(), key=lambda kv: kv[1])
        print(f"  measured:     {measured.algo:9s} -- " + ", ".join(f"{a} {t * 1e3:.2f} ms" for a, t in ranked))
        # What auto now runs is the measured winner, and every algorithm gives the same answer.
        after = convlib.choose_algorithm(x, w, **kwargs)
        if after.algo != measured.algo:
            print(f"  ERROR: auto now picks {after.algo}, not the measured {measured.algo}", file=sys.stderr)
            status = 1
        y_auto = convlib.conv2d(x, w, **kwargs)
        y_rule = convlib.conv2d(x, w, algo=ruled.algo, **kwargs)
        if not np.allclose(y_auto, y_rule, rtol=1e-4, atol=1e-4 * float(np.abs(y_rule).max())):
            print(f"  ERROR: {measured.algo} and {ruled.algo} disagree", file=sys.stderr)
            status = 1
        print()
    print("This machine's tuned profile (python -m convlib.tune; docs/tuning.md):")
    print("  " + profile_text.replace("\n", "\n  "))
    if not args.remember:
        print("\n(measured choices were kept in a temporary tuning cache, now deleted; --remember keeps them)")
        shutil.rmtree(os.environ["CONVLIB_CACHE_DIR"], ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
