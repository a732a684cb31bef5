"""Benchmarks: ``python -m convlib.bench SUITE [options]``.

Suites (:mod:`convlib.bench.suites`): ``seed-batch``, ``seed-size``, ``resnet50`` and ``custom``.
Each shape is timed for every algorithm of the chosen devices (plus ``auto``) beside PyTorch's
``conv2d`` (and scipy), with warm-up, interleaved repeats and a correctness check
(:mod:`convlib.bench.runner`, :mod:`convlib.bench.candidates`, :mod:`convlib.bench.check`);
results go to JSON and CSV with a description of the machine (:mod:`convlib.bench.machine`,
:mod:`convlib.bench.report`) and, with ``--plot``, to PNG figures (:mod:`convlib.bench.plots`).
``python -m convlib.bench --help`` lists the options.

``python -m convlib.bench thesis`` (:mod:`convlib.bench.thesis`) runs the oneAPI thesis' two
experiments, kernel and whole-process time, beside its published tables (``bench/data/``).

Other benchmarks, each a ``python -m`` command: :mod:`convlib.bench.gemm_check` (blis beside
the same GEMM), :mod:`convlib.bench.sycl` (the SYCL backend against PyTorch and the CPU) and
:mod:`convlib.bench.gpu_check` (the GPU machine's tests and benchmark in one command). Every
convlib figure of every one of them is a :class:`~convlib.dispatch.plan.Plan` timed by
:func:`convlib.core.timing.time_interleaved`.

Benchmarks are not tests: compare ratios measured in one run, on a quiet machine.
"""
