"""``algo="auto"``: which algorithm serves a problem best, and why.

Rules first (what can serve at all), then a cost model calibrated on this project's benchmarks
(``python -m convlib.bench``); see :func:`choose_algorithm` for the rules themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import tuning
from .problem import ConvProblem


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


def _is_thin(problem: ConvProblem) -> bool:
    # Few filters or a short reduction: the GEMM is too thin to amortise packing, and the problem
    # is bound by memory traffic, which direct convolution keeps near its floor (x read once per
    # block of output channels, y written once). The seed thesis' C=K=4 images and depthwise
    # layers are here; ResNet's 1x1 64->64 (reduction 64) is not: blis beat direct 1.7x there.
    return problem.gemm_m < 16 or problem.gemm_k < 32


def _winograd_pays(problem: ConvProblem) -> bool:
    # Measured on ResNet-50 v1.5's 3x3 stride-1 layers at batch 8 (docs/benchmarks.md): F(4x4,3x3)
    # beat the best GEMM-based algorithm by 1.3-2x. It needs enough channels for the GEMMs to
    # dominate the transforms, and enough tiles to amortise the filter transform.
    return (problem.is_winograd_shape and problem.C_per_group >= 32 and problem.K_per_group >= 32
            and problem.gemm_n >= 256)


def _is_pointwise(problem: ConvProblem) -> bool:
    """A 1x1, stride-1, unpadded convolution: a plain GEMM over each image's pixels."""
    return (problem.R, problem.S) == (1, 1) and problem.stride == (1, 1) and not any(problem.padding)


def _cpu_rules(problem: ConvProblem) -> list[tuple[str, str]]:
    if _is_thin(problem):
        return [("direct", f"thin GEMM (M={problem.gemm_m}, K={problem.gemm_k}): memory-bound, "
                           "direct streams the image once")]
    rules = []
    if _winograd_pays(problem):
        rules.append(("winograd", "3x3 stride-1 layer with many channels: F(4x4,3x3) does 4x fewer multiplications"))
    # Measured on ResNet-50 v1.5 at batch 8 (docs/benchmarks.md): blis wins every pointwise (1x1,
    # stride-1, unpadded) layer, whose packing is a plain copy of channel rows. Elsewhere, with at
    # most 256 filters per group and a reduction of at most 512, packing B costs blis more than
    # direct's re-reads of the image (the stem); past that, blis' register blocking wins.
    if not _is_pointwise(problem) and problem.K_per_group <= 256 and problem.gemm_k <= 512:
        rules.append(("direct", "few filters and a short reduction: direct beats packing for a GEMM"))
    rules.append(("blis", "GEMM-shaped problem: the packed BLIS GEMM reads the image directly, with bounded workspace"))
    return rules


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
    return [("blis", "GEMM-shaped problem: the implicit GEMM gathers image tiles straight into shared memory")]


_RULES = {"cpu": _cpu_rules, "sycl": _sycl_rules, "cuda": _cuda_rules}


def _cost_model(problem: ConvProblem, backend: str, candidates: list[str]) -> tuple[str, str]:
    for algo, why in _RULES.get(backend, lambda p: [])(problem):
        if algo in candidates:
            return algo, why
    return candidates[0], "the first algorithm that can serve this problem"


def choose_algorithm_for(problem: ConvProblem, backend: str, device_key: str | None = None) -> Choice:
    """:func:`choose_algorithm` for a validated problem and a backend name.

    A choice measured earlier for this problem and device (``measure=True``) wins over the model.
    """
    from .api import serving_algorithms

    candidates = serving_algorithms(backend, problem)
    if not candidates:
        raise NotImplementedError(f"no algorithm of the {backend} backend serves {problem.describe()}")
    remembered = _remembered().get(tuning.problem_key(problem, device_key or backend))
    if remembered is not None and remembered["algo"] in candidates:
        return Choice(remembered["algo"], "measured fastest on this machine (tuning cache)",
                      tuple(candidates), dict(remembered.get("timings", {})))
    algo, reason = _cost_model(problem, backend, candidates)
    return Choice(algo, reason, tuple(candidates))


_REMEMBERED: dict | None = None


def _remembered() -> dict:
    # Read the tuning file once per process; measure=True keeps this copy current.
    global _REMEMBERED
    if _REMEMBERED is None:
        _REMEMBERED = tuning.load()
    return _REMEMBERED


def forget_measurements() -> None:
    """Drop this process' copy of the tuning cache (it is read again on next use)."""
    global _REMEMBERED
    _REMEMBERED = None


def choose_algorithm(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, device=None,
                     measure=False, repeats=5) -> Choice:
    """What ``conv2d(..., algo="auto")`` would run for these arguments, and why.

    Parameters
    ----------
    x, w, bias, stride, padding, dilation, groups, device
        As in :func:`convlib.conv2d`. Only shapes, dtypes and where the data lives are read.
    measure : bool, default False
        Time every candidate on random data of this shape (``repeats`` interleaved calls after a
        warm-up, median), pick the fastest and remember it in the tuning cache
        (:mod:`convlib.tuning`): later ``algo="auto"`` calls on this problem and device, in this
        process and later ones, use the measured winner.
    repeats : int, default 5
        Timed calls per candidate when measuring.

    Returns
    -------
    Choice
        The algorithm, the reason, the candidates and (when measured) the median timings.

    Notes
    -----
    Rules, in order:

    1. Only algorithms that can serve the problem are candidates (Winograd needs 3x3, stride 1,
       dilation 1).
    2. A winner measured earlier for this problem and device (``measure=True``) is used.
    3. Thin GEMMs (reduction ``C/groups * R * S < 32`` or fewer than 16 output channels per
       group, e.g. the seed thesis' C=K=4 images or depthwise layers) go to ``direct``: they are
       bound by memory traffic and direct convolution reads the image once and writes the output
       once.
    4. On the CPU, 3x3 stride-1 layers with at least 32 input and output channels per group and at
       least 256 output pixels go to Winograd F(4x4,3x3), which measured 1.3-2x faster than the
       best GEMM-based algorithm on ResNet-50's 3x3 layers. On SYCL devices the same layers go to
       F(4x4,3x3) from 28x28 outputs up and to F(2x2,3x3) below.
    5. On the CPU, other layers with at most 256 output channels per group and a reduction
       ``C/groups * R * S <= 512`` go to ``direct`` (ResNet's stem and most 1x1 layers).
    6. Otherwise the GEMM-based algorithm that measured fastest on the backend: ``blis`` on the
       CPU, ``im2col`` on SYCL devices, ``blis`` (implicit GEMM) on CUDA GPUs, where ``direct`` is
       kept for depthwise layers and for ``C/groups <= 16`` with ``K/groups <= 32``.
    """
    from .api import build_problem
    from .backends import resolve_device

    problem = build_problem(x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)
    target = resolve_device(device, x, w, bias)
    device_key = target.backend.name if device is None else str(device)
    if not measure:
        return choose_algorithm_for(problem, target.backend.name, device_key)
    from .api import serving_algorithms

    candidates = serving_algorithms(target.backend.name, problem)
    timings = tuning.time_algorithms(problem, candidates, device if device is not None else target.backend.name,
                                     repeats=repeats)
    best = min(timings, key=timings.get)
    key = tuning.problem_key(problem, device_key)
    tuning.store(key, best, timings)
    _remembered()[key] = {"algo": best, "timings": timings}
    return Choice(best, f"measured fastest of {len(candidates)} candidates ({timings[best] * 1e3:.3g} ms)",
                  tuple(candidates), timings)
