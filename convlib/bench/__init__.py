"""Benchmarks: ``python -m convlib.bench SUITE [options]``.

Suites (:mod:`convlib.bench.suites`): ``seed-batch``, ``seed-size``, ``resnet50`` and ``custom``.
Each shape is timed for every algorithm of the chosen devices (plus ``auto``) beside PyTorch's
``conv2d`` (and scipy), with warm-up, interleaved repeats and a correctness check
(:mod:`convlib.bench.runner`); results go to JSON and CSV with a description of the machine
(:mod:`convlib.bench.machine`, :mod:`convlib.bench.report`) and, with ``--plot``, to PNG figures
(:mod:`convlib.bench.plots`). ``python -m convlib.bench --help`` lists the options.

Benchmarks are not tests: compare ratios measured in one run, on a quiet machine.
"""

from .runner import time_candidates

__all__ = ["time_candidates"]
