"""``algo="auto"``: which algorithm serves a problem best, and why.

Rules first (what can serve at all), then a winner measured on this device earlier
(:mod:`convlib.dispatch.tuning`), then a cost model calibrated on this project's benchmarks
(``python -m convlib.bench``); :func:`convlib.choose_algorithm` lists the rules themselves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from ..core.options import options
from ..core.problem import ConvProblem, rotated_problem, runs_as_forward, sums_wide_rows
from ..cpu.tables import KNOBS as CPU_KNOBS
from . import registry, tuning
from .devices import ResolvedDevice


@dataclass(frozen=True)
class Choice:
    """What ``algo="auto"`` picks for one problem on one backend.

    Attributes
    ----------
    algo : str
        The algorithm picked.
    reason : str
        Why, in one sentence.
    candidates : tuple of str
        Every algorithm of the backend that can serve the problem.
    timings : dict
        Seconds per candidate when the choice was measured, else empty.
    """

    algo: str
    reason: str
    candidates: tuple[str, ...]
    timings: dict = field(default_factory=dict, compare=False)


def _is_thin(problem: ConvProblem, filters: int = 16, reduction: int = 32) -> bool:
    # Few filters or a short reduction: the GEMM is too thin to amortise packing, and the problem
    # is bound by memory traffic, which direct convolution keeps near its floor (x read once per
    # block of output channels, y written once). The seed thesis' C=K=4 images and depthwise
    # layers are here; ResNet's 1x1 64->64 (reduction 64) is not: blis beat direct 1.7x there.
    return problem.gemm_m < filters or problem.gemm_k < reduction


def _winograd_pays(problem: ConvProblem, channels: int = 32, pixels: int = 256, image: int = 1) -> bool:
    # Measured on ResNet-50 v1.5's 3x3 stride-1 layers at batch 8 (docs/benchmarks.md): F(4x4,3x3)
    # beat the best GEMM-based algorithm by 1.3-2x. It needs enough channels for the GEMMs to
    # dominate the transforms, enough tiles to amortise the filter transform, and (where the
    # GEMM-based algorithms run near the FMA peak) images large enough for its tiles.
    return (problem.is_winograd_shape and problem.C_per_group >= channels and problem.K_per_group >= channels
            and problem.gemm_n >= pixels and min(problem.P, problem.Q) >= image)


def _cpu_rules(problem: ConvProblem) -> list[tuple[str, str]]:
    # The thresholds are knobs of the CPU table (auto_*): built-in values measured on this
    # project's benchmarks, or this machine's profile (python -m convlib.tune fits them).
    # Measured (AVX-512, 2 threads): depthwise beats direct on 3x3 to 7x7 single-channel filters and
    # on MobileNetV2's layers 1.7-3x.
    if problem.groups == problem.C and problem.R * problem.S <= CPU_KNOBS.auto_depthwise_max_taps:
        return [("depthwise", "depthwise: one input channel per output plane, streamed once (memory-bound)")]
    # A pointwise layer's packing is a plain copy of channel rows, so blis pays for a shorter
    # reduction there: MobileNetV2's 1x1 16>96 and 24>144 expansions (Zen 5, batch 8) took blis
    # 0.36-0.47x direct's time, whose blocks of a 56- or 112-wide image are mostly stores that wrap
    # rows; with 8 channels (8>64) direct still won, 1.2x.
    reduction = CPU_KNOBS.auto_thin_pointwise_reduction if problem.columns_are_the_image else CPU_KNOBS.auto_thin_reduction
    if _is_thin(problem, CPU_KNOBS.auto_thin_filters, reduction):
        return [("direct", f"thin GEMM (M={problem.gemm_m}, K={problem.gemm_k}): memory-bound, "
                           "direct streams the image once")]
    rules = []
    if _winograd_pays(problem, CPU_KNOBS.auto_winograd_min_channels, CPU_KNOBS.auto_winograd_min_pixels,
                      CPU_KNOBS.auto_winograd_min_image):
        rules.append(("winograd", "3x3 stride-1 layer with many channels: F(4x4,3x3) does 4x fewer multiplications"))
    # Measured on ResNet-50 v1.5 at batch 8 (docs/benchmarks.md): blis wins every pointwise (1x1,
    # stride-1, unpadded) layer, whose packing is a plain copy of channel rows. Elsewhere, with at
    # most 256 filters per group and a reduction of at most 512, packing B costs blis more than
    # direct's re-reads of the image (the stem); past that, blis' register blocking wins.
    # Small images included: direct's blocks along the output channels (direct.py) compute no
    # padding columns (the digits CNN's 8x8 layers at batch 32: direct 0.55-0.8x blis' time, Zen 3;
    # blis had won there while direct's blocks ran along the padded rows only).
    if (not problem.columns_are_the_image and problem.K_per_group <= CPU_KNOBS.auto_direct_max_filters
            and problem.gemm_k <= CPU_KNOBS.auto_direct_max_reduction):
        rules.append(("direct", "few filters and a short reduction: direct beats packing for a GEMM"))
    rules.append(("blis", "GEMM-shaped problem: the packed BLIS GEMM reads the image directly, with bounded workspace"))
    return rules


#: Every algorithm :func:`_cpu_rules` can name: what ``auto`` may run for a CPU ``conv2d``
#: (``im2col`` and ``winograd2`` run only when asked for by name).
CPU_RULE_ALGORITHMS = ("depthwise", "direct", "winograd", "blis")


def _sycl_rules(problem: ConvProblem) -> list[tuple[str, str]]:
    if _is_thin(problem):
        return [("direct", f"thin GEMM (M={problem.gemm_m}, K={problem.gemm_k}): memory-bound, "
                           "direct streams the image once")]
    rules = []
    if _winograd_pays(problem):
        # On the OpenCL CPU device F(4x4) won on 56^2 and 28^2 images, F(2x2) on 14^2 and 7^2,
        # where F(4x4)'s 6x6 tiles are mostly padding (docs/benchmarks.md).
        if problem.P * problem.Q >= 28 * 28:
            rules.append(("winograd", "3x3 stride-1 layer on a large image: F(4x4,3x3), 4x fewer multiplications"))
        rules.append(("winograd2", "3x3 stride-1 layer on a small image: F(2x2,3x3) wastes less on partial tiles"))
    rules.append(("im2col", "GEMM-shaped problem: explicit im2col then a tuned device GEMM"))
    return rules


def _cuda_rules(problem: ConvProblem) -> list[tuple[str, str]]:
    # Measured on an H200 (docs/benchmarks.md): direct wins only on depthwise and very thin
    # layers; the implicit GEMM beats im2col (even with cuBLAS) on every ResNet-50 layer.
    if problem.groups == problem.C == problem.K or (problem.C_per_group <= 16 and problem.K_per_group <= 32):
        return [("direct", "depthwise or few channels per group: direct keeps the image tile in shared memory")]
    if problem.dtype in ("float16", "bfloat16"):
        # blis multiplies half values on tensor cores; Winograd would widen them to float32
        # copies first (H200, batch 128, 28^2 3x3 layer: 0.14 against 0.47 ms; docs/gpu.md).
        # A 1x1 stride-1 layer without a bias is one cuBLAS GEMM on the half values where they lie
        # (convlib.cuda.im2col.run_half_in_place): 0.99-1.02x cuDNN on ResNet-50's 1x1 layers with
        # 14x14 and larger outputs (blis 0.32-1.18x), 0.25x on 7x7 ones (blis 0.64-0.91x), H200.
        rules = []
        if problem.columns_are_the_image and not problem.has_bias and _cublas_pointwise(problem):
            rules.append(("im2col", f"{problem.dtype} 1x1 layer on a 14x14 or larger output: one cuBLAS GEMM "
                                    "on the half values in place"))
        return rules + [("blis", f"{problem.dtype} GEMM-shaped problem: the implicit GEMM on tensor cores")]
    rules = []
    # Measured on an H100 at batch 128 (docs/benchmarks.md): F(4x4,3x3) beat blis 1.9-3.3x on
    # ResNet-50's four 3x3 stride-1 layers (64-512 channels, 6272-401408 output pixels), with
    # cuBLAS and with our own GEMM alike. Smaller problems were not measured: blis keeps them.
    if _winograd_pays(problem, channels=64, pixels=6272):
        if problem.dtype == "float32" and options.allow_tf32:
            # Where TF32 is permitted, F(4x4,3x3) stays exact (TF32 would amplify to 10x cuDNN
            # TF32's error) and loses to the TF32 paths. H200, batch 128, same call
            # (docs/benchmarks.md, "1x1 layers through cuBLAS"), ms: on 14x14 and 7x7 images
            # F(2x2,3x3) with cuBLAS TF32 GEMMs 0.146 / 0.126 against F(4x4) exact 0.311 / 0.303 and
            # tensor-core blis 0.304 / 0.260; on 56x56 and 28x28 tensor-core blis 0.410 / 0.263
            # against F(4x4) 0.454 / 0.293.
            if problem.P * problem.Q < 28 * 28 and _cublas_expected():
                rules.append(("winograd2", "3x3 stride-1 layer on a small image with TF32 permitted: F(2x2,3x3) "
                                           "with cuBLAS TF32 GEMMs"))
            else:
                rules.append(("blis", "3x3 stride-1 layer with TF32 permitted: the implicit GEMM on tensor cores"))
        rules.append(("winograd", "3x3 stride-1 layer with many channels: F(4x4,3x3) does 4x fewer multiplications"))
    # Measured on an H200 at batch 128 (docs/benchmarks.md): on ResNet-50's 1x1 layers with output
    # images of 14x14 and up, cuBLAS's strided batched GEMM (on the image itself at stride 1, on a
    # column matrix a quarter of x at stride 2) beat blis in exact FP32 and with TF32 alike: FP32
    # 0.90-1.37x cuDNN against blis' 0.80-1.07x; on 7x7 outputs (49 columns an image) blis stayed
    # ahead, with TF32 by 1.2-2x. Our own GEMM (without CuPy, or under the simulator) does not win:
    # blis keeps those, and float64 (not measured).
    if problem.dtype == "float32" and _cublas_pointwise(problem):
        rules.append(("im2col", "1x1 layer on a 14x14 or larger output: a plain GEMM per image (on the image "
                                "itself at stride 1), for cuBLAS"))
    rules.append(("blis", "GEMM-shaped problem: the implicit GEMM gathers image tiles straight into shared memory"))
    return rules


def _cublas_pointwise(problem: ConvProblem) -> bool:
    """A 1x1 unpadded layer with outputs of 14x14 or more, where im2col's GEMM is cuBLAS: the
    shapes on which cuBLAS's batched GEMM beat blis (H200; the measurements are at the rules)."""
    return ((problem.R, problem.S) == (1, 1) and not any(problem.padding) and problem.P * problem.Q >= 14 * 14
            and _cublas_expected())


def _cublas_expected() -> bool:
    """Whether CUDA's im2col will multiply with cuBLAS (CuPy importable, a real GPU): numba's
    simulator is read from the environment, as numba reads it, so that no numba module loads here."""
    from ..cuda.tables import gemm_is_cublas

    return gemm_is_cublas(os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1")


_RULES = {"cpu": _cpu_rules, "sycl": _sycl_rules, "cuda": _cuda_rules}


def _cpu_gradient_rules(problem: ConvProblem) -> list[tuple[str, str]]:
    # Measured on ResNet-50 v1.5's layers at batch 8 (python -m convlib.bench resnet50 --op ...,
    # docs/benchmarks.md, Xeon host): for the data pass blis 1.72x torch in geomean, im2col 1.87x
    # (im2col won some stage-5 layers), direct 5-20x slower than both; for the weight pass blis
    # beat im2col (BLAS on an explicit column matrix) on 22 of the 23 layers, by 1.14-2.39x, tied
    # on the stem, and direct was 5-20x slower than im2col. Winograd (the forward kernels on the
    # rotated filters) beat blis on all four 3x3 stride-1 layers, 1.06-1.6x. Since direct's data
    # pass at stride 1 runs the forward direct kernel on the rotated filters (Zen 5, 2026-11-27)
    # it took 0.935 / 1.10 / 1.50 / 1.69x torch's time on those four layers, blis 1.41 / 1.31 /
    # 1.22 / 1.38x (strided layers: the loops, 11-47x).
    if problem.operation == "conv2d_backward_data":
        rules = []
        if _winograd_pays(problem, CPU_KNOBS.auto_winograd_min_channels, CPU_KNOBS.auto_winograd_min_pixels,
                          CPU_KNOBS.auto_winograd_min_image):
            rules.append(("winograd", "backward data of a 3x3 stride-1 layer with many channels: the forward "
                                      "F(4x4,3x3) on the rotated filters"))
        # At stride 1 the data pass is a forward convolution of dy (core.problem.rotated_problem), which
        # direct runs on its forward kernel: where the forward's rules would run direct on that
        # problem, so does the data pass (the digits CNN's 16->32 layer: 0.91x blis' time, Zen 5).
        # Not into one channel (a grayscale image's gradient): that forward has one filter, a
        # register block of direct's mostly empty, while blis's GEMM has the 9 taps as its rows;
        # direct took 1.6-1.7x blis' time there (8x8 to 56x56, 16-32 channels of dy; 3 channels:
        # 0.74-1.22x; Intel Xeon, session 41).
        forward_choice = _cpu_rules(rotated_problem(problem))[0][0] if runs_as_forward(problem) else None
        if forward_choice == "direct" and not (problem.groups == 1 and problem.C == 1):
            rules.append(("direct", "backward data at stride 1: the forward direct kernel on dy and the rotated "
                                    "filters, where the forward's rules pick direct for that problem"))
        # A depthwise layer's rotated problem is depthwise again: its kernels, as for the forward
        # (MobileNetV2's stride-1 depthwise layers at batch 8: blis took 1.6-2.7x torch's time).
        if forward_choice == "depthwise":
            rules.append(("depthwise", "backward data of a depthwise layer at stride 1: the forward depthwise "
                                       "kernels on dy and the rotated filters"))
        return rules + [("blis", "backward data: the GEMM W^T dY with col2im in its store (no column matrix)")]
    if problem.operation == "conv2d_backward_weight":
        rules = []
        # One filter per group (depthwise layers; one filter over a few channels): blis's GEMM has
        # a single row per group there, while direct's row dot products are the whole work. On
        # MobileNetV2's depthwise layers at batch 8 direct took 0.17-1.14x blis' time (9 of 10
        # faster, 1.28x torch in geomean against 3.14x), one filter over 3-16 channels 0.31-0.46x
        # (Intel Xeon, session 42). With fewer than three (k, c) pairs direct has too few tasks
        # for the threads (one single-channel filter: 0.56-1.57x).
        if problem.K_per_group == 1 and problem.K * problem.C_per_group >= 3:
            rules.append(("direct", "backward weight with one filter per group: each (filter, channel) pair's "
                                    "row dot products"))
        # A 3x3 stride-1 layer on short rows, with few filters per group or one channel: direct sums
        # wide rows, all nine taps per load of dy, where blis's GEMM has few rows or a reduction of
        # nine (knob auto_direct_weight_max_filters, measured there).
        elif ((problem.R, problem.S) == (3, 3) and sums_wide_rows(problem, CPU_KNOBS.direct_weight_wide_max_row)
              and (problem.K_per_group <= CPU_KNOBS.auto_direct_weight_max_filters or problem.C_per_group == 1)
              and problem.K * problem.C_per_group >= 3):
            rules.append(("direct", "backward weight of a 3x3 stride-1 layer with few filters or one channel per "
                                    "group: all nine taps' dot products in one pass over wide rows"))
        return rules + [("blis", "backward weight: the GEMM dY Cols^T, both packed from the tensors, the batch "
                                 "summed inside it")]
    return []


_GRADIENT_RULES = {"cpu": _cpu_gradient_rules}


def rule_choice(problem: ConvProblem, backend: str, candidates: list[str]) -> tuple[str, str]:
    """``(algorithm, reason)`` by the backend's rules alone: the first rule whose algorithm is
    among ``candidates`` (what ``auto`` runs when nothing was measured for ``problem``)."""
    rules = _RULES if problem.operation == "conv2d" else _GRADIENT_RULES
    for algo, why in rules.get(backend, lambda p: [])(problem):
        if algo in candidates:
            return algo, why
    return candidates[0], "the first algorithm that can serve this problem"


def selection_state() -> tuple:
    """What :func:`choose` reads besides the problem and the device, as a hashable value: the CPU
    knobs in force (their ``auto_*`` thresholds; overrides and profile) and the tuning cache's
    generation, and ``convlib.options.allow_tf32`` (CUDA's float32 rules read it). A cache of
    choices keys on it (:data:`convlib.dispatch.plan.PLANS`)."""
    return (CPU_KNOBS.state(), tuning.generation(), options.allow_tf32)


def choose(operation: str, problem: ConvProblem, target: ResolvedDevice, dtype: str | None = None) -> Choice:
    """What ``algo="auto"`` runs for ``problem`` on ``target``, and why. ``dtype``: the caller's
    dtype where ``problem`` is its float32 twin (float16, bfloat16); the rules see the problem in
    it (on CUDA, half precisions go to tensor-core ``blis``).

    A choice measured earlier for this operation, problem and device (``measure=True``, kept by
    :mod:`convlib.dispatch.tuning` under the device's stable identity, for the problem in the
    caller's dtype, as ``choose_algorithm`` measured it) wins over the model.
    """
    backend = target.name
    candidates = registry.serving_algorithms(operation, backend, problem)
    if not candidates:
        raise NotImplementedError(f"no algorithm of the {backend} backend serves {problem.describe()}")
    ruled = problem if dtype in (None, problem.dtype) else replace(problem, dtype=dtype)
    remembered = tuning.lookup(operation, ruled, target.identity)
    if remembered is not None and remembered["algo"] in candidates:
        return Choice(remembered["algo"], "measured fastest on this machine (tuning cache)",
                      tuple(candidates), dict(remembered.get("timings", {})))
    algo, reason = rule_choice(ruled, backend, candidates)
    return Choice(algo, reason, tuple(candidates))
