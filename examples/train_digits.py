"""Train a small CNN whose convolutions run on convlib, forward and backward, and time its step.

The data are scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes; read from
inside the installed package, no download). The network is two ``convlib.torch.Conv2d`` layers
(3x3, 16 and 32 channels), a max-pool and a linear classifier, trained with Adam for 15 epochs
from a fixed seed on three quarters of the images and tested on the rest. The same network built
from ``torch.nn.Conv2d`` (same seed, so the same initial weights) is trained alike for comparison,
then one training step (forward, backward, optimiser step on one batch) of each is timed with
convlib's timing loop (warm-up, interleaved repeats, medians), over runs of 10 consecutive steps.

Prints the test accuracy and the wall time of both, and the two step times. Exits non-zero if the
convlib network's test accuracy is below 95%.

Run from the repository root (needs the ``bench`` extra: PyTorch and scikit-learn)::

    .venv/bin/python examples/train_digits.py
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import convlib.torch
from convlib.core.timing import time_interleaved

SEED = 0
EPOCHS = 15
BATCH = 32
LEARNING_RATE = 3e-3
REQUIRED_ACCURACY = 0.95


def digits():
    """Train and test tensors: images (N, 1, 8, 8) in [0, 1], labels (N,)."""
    data = load_digits()
    images = (data.images / 16.0).astype(np.float32)[:, None]
    x_train, x_test, y_train, y_test = train_test_split(
        images, data.target, test_size=0.25, random_state=SEED, stratify=data.target)
    return (torch.from_numpy(x_train), torch.from_numpy(y_train), torch.from_numpy(x_test),
            torch.from_numpy(y_test))


def network(conv):
    """The CNN with ``conv`` as its convolution layer class; the same weights for either class."""
    torch.manual_seed(SEED)
    return torch.nn.Sequential(
        conv(1, 16, 3, padding=1), torch.nn.ReLU(),           # 16 x 8 x 8
        conv(16, 32, 3, padding=1), torch.nn.ReLU(),          # 32 x 8 x 8
        torch.nn.MaxPool2d(2), torch.nn.Flatten(),            # 32 x 4 x 4
        torch.nn.Linear(32 * 4 * 4, 10),
    )


def train(net, x, y):
    """Adam over shuffled batches, the same shuffles for every network; returns the number of steps."""
    opt = torch.optim.Adam(net.parameters(), lr=LEARNING_RATE)
    order = torch.Generator().manual_seed(SEED)
    steps = 0
    for _ in range(EPOCHS):
        for batch in torch.randperm(len(x), generator=order).split(BATCH):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x[batch]), y[batch]).backward()
            opt.step()
            steps += 1
    return steps


@torch.no_grad()
def accuracy(net, x, y) -> float:
    return (net(x).argmax(1) == y).float().mean().item()


def step_timings(x, y, repeats=9, steps_per_call=50):
    """Seconds of one training step on one batch, for each convolution class: the median of
    ``repeats`` timed calls of ``steps_per_call`` consecutive steps each, divided by the steps.

    A timed call is many steps because the timing loop collects garbage before each call (a
    tenth of a second with PyTorch and scikit-learn loaded), which leaves caches and thread pools
    cold: one step after it measured 2-3x its time inside a training loop, for either network.
    And a training loop is long: with runs of 10 steps the timing missed that convlib's first call
    had made every later step of either network 7x slower (numba's OpenMP layer had switched
    nested parallelism on in PyTorch's OpenMP runtime; see ``convlib/cpu/threads.py``).
    """
    batch_x, batch_y = x[:BATCH], y[:BATCH]
    calls = {}
    for name, conv in [("convlib.torch.Conv2d", convlib.torch.Conv2d), ("torch.nn.Conv2d", torch.nn.Conv2d)]:
        net = network(conv)
        opt = torch.optim.Adam(net.parameters(), lr=LEARNING_RATE)

        def steps(net=net, opt=opt):
            for _ in range(steps_per_call):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(net(batch_x), batch_y).backward()
                opt.step()

        calls[name] = steps
    timings = time_interleaved(calls, repeats, warmup=2)
    return {name: t.median_s / steps_per_call for name, t in timings.items()}


def main() -> int:
    x_train, y_train, x_test, y_test = digits()
    print(f"digits: {len(x_train)} training and {len(x_test)} test images of 8x8; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")

    results = {}
    for name, conv in [("convlib.torch.Conv2d", convlib.torch.Conv2d), ("torch.nn.Conv2d", torch.nn.Conv2d)]:
        net = network(conv)
        t0 = time.perf_counter()
        steps = train(net, x_train, y_train)
        seconds = time.perf_counter() - t0
        results[name] = accuracy(net, x_test, y_test)
        print(f"{name:<22} test accuracy {results[name]:.2%} after {EPOCHS} epochs, trained in {seconds:.1f} s "
              f"({steps} steps, {seconds / steps * 1e3:.1f} ms each; first calls' compilation included)")

    step_s = step_timings(x_train, y_train)
    ours, theirs = step_s["convlib.torch.Conv2d"], step_s["torch.nn.Conv2d"]
    print(f"one training step (batch {BATCH}, median over runs of 50): convlib {ours * 1e3:.2f} ms, "
          f"torch.nn.Conv2d {theirs * 1e3:.2f} ms (convlib/torch = {ours / theirs:.2f})")

    if results["convlib.torch.Conv2d"] < REQUIRED_ACCURACY:
        print(f"FAILED: convlib's network reached {results['convlib.torch.Conv2d']:.2%} < {REQUIRED_ACCURACY:.0%}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
