"""The benchmark suites as data: named lists of convolution shapes.

``seed-batch`` and ``seed-size`` are the two sweeps of the oneAPI batched-convolution thesis this
project started from (C = K = 4, 3x3 filters, no padding); ``resnet50`` is every distinct
convolution of ResNet-50 v1.5 with the number of times it occurs; ``custom`` is whatever
``--shape`` says. A suite is a list of :class:`Case`; building one costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.problem import ConvProblem, make_problem

#: Batch sizes of the ``seed-batch`` sweep (H = W = 1024).
SEED_BATCH_SIZES = tuple(range(8, 81, 8))
#: Image sizes H = W of the ``seed-size`` sweep (N = 8).
SEED_IMAGE_SIZES = (64, 128, 256, 512, 1024, 2048, 4096)
#: What ``--quick`` keeps of the seed sweeps.
SEED_BATCH_SIZES_QUICK = (8, 16)
SEED_IMAGE_SIZES_QUICK = (64, 128, 256, 512, 1024)

#: The distinct convolutions of ResNet-50 v1.5 (torchvision's ``resnet50``) on a 224x224 image:
#: ``(name, C, H, W, K, R, S, stride, pad, count)`` where ``count`` is how many of the network's
#: 53 convolutions have that shape. v1.5 puts a bottleneck's stride on its 3x3 convolution (v1
#: put it on the first 1x1); the first block of stages 3-5 also has a 1x1 stride-2 projection
#: ("proj") of its input, while stage 2's projection has stride 1 and the same shape as that
#: stage's expanding 1x1 (so ``s2 1x1 64>256`` counts 3 + 1).
RESNET50_V15_LAYERS = (
    ("stem 7x7/2 3>64", 3, 224, 224, 64, 7, 7, 2, 3, 1),
    # stage 2 (conv2_x): 3 blocks at 56x56, width 64, out 256
    ("s2 1x1 64>64", 64, 56, 56, 64, 1, 1, 1, 0, 1),
    ("s2 3x3 64>64", 64, 56, 56, 64, 3, 3, 1, 1, 3),
    ("s2 1x1 64>256", 64, 56, 56, 256, 1, 1, 1, 0, 4),
    ("s2 1x1 256>64", 256, 56, 56, 64, 1, 1, 1, 0, 2),
    # stage 3 (conv3_x): 4 blocks, 56x56 -> 28x28, width 128, out 512
    ("s3 1x1 256>128", 256, 56, 56, 128, 1, 1, 1, 0, 1),
    ("s3 3x3/2 128>128", 128, 56, 56, 128, 3, 3, 2, 1, 1),
    ("s3 proj 1x1/2 256>512", 256, 56, 56, 512, 1, 1, 2, 0, 1),
    ("s3 1x1 128>512", 128, 28, 28, 512, 1, 1, 1, 0, 4),
    ("s3 1x1 512>128", 512, 28, 28, 128, 1, 1, 1, 0, 3),
    ("s3 3x3 128>128", 128, 28, 28, 128, 3, 3, 1, 1, 3),
    # stage 4 (conv4_x): 6 blocks, 28x28 -> 14x14, width 256, out 1024
    ("s4 1x1 512>256", 512, 28, 28, 256, 1, 1, 1, 0, 1),
    ("s4 3x3/2 256>256", 256, 28, 28, 256, 3, 3, 2, 1, 1),
    ("s4 proj 1x1/2 512>1024", 512, 28, 28, 1024, 1, 1, 2, 0, 1),
    ("s4 1x1 256>1024", 256, 14, 14, 1024, 1, 1, 1, 0, 6),
    ("s4 1x1 1024>256", 1024, 14, 14, 256, 1, 1, 1, 0, 5),
    ("s4 3x3 256>256", 256, 14, 14, 256, 3, 3, 1, 1, 5),
    # stage 5 (conv5_x): 3 blocks, 14x14 -> 7x7, width 512, out 2048
    ("s5 1x1 1024>512", 1024, 14, 14, 512, 1, 1, 1, 0, 1),
    ("s5 3x3/2 512>512", 512, 14, 14, 512, 3, 3, 2, 1, 1),
    ("s5 proj 1x1/2 1024>2048", 1024, 14, 14, 2048, 1, 1, 2, 0, 1),
    ("s5 1x1 512>2048", 512, 7, 7, 2048, 1, 1, 1, 0, 3),
    ("s5 1x1 2048>512", 2048, 7, 7, 512, 1, 1, 1, 0, 2),
    ("s5 3x3 512>512", 512, 7, 7, 512, 3, 3, 1, 1, 2),
)

#: What ``--quick`` keeps of ResNet-50: the stem and one layer of each kind (1x1, 3x3, strided
#: 3x3, projection) spread over the stages.
RESNET50_QUICK = (
    "stem 7x7/2 3>64", "s2 3x3 64>64", "s3 3x3/2 128>128", "s3 proj 1x1/2 256>512",
    "s4 1x1 1024>256", "s5 3x3 512>512",
)

#: The distinct depthwise convolutions of MobileNetV2 (torchvision's ``mobilenet_v2``) on a 224x224
#: image: ``(name, C, H, stride, count)``, 3x3, padding 1, ``groups = C``. Each inverted-residual
#: block widens its input by 6 (the first block by 1) and its depthwise 3x3 carries the block's stride.
MOBILENET_V2_DEPTHWISE = (
    ("dw 32 112", 32, 112, 1, 1),
    ("dw 96 112/2", 96, 112, 2, 1),
    ("dw 144 56", 144, 56, 1, 1),
    ("dw 144 56/2", 144, 56, 2, 1),
    ("dw 192 28", 192, 28, 1, 2),
    ("dw 192 28/2", 192, 28, 2, 1),
    ("dw 384 14", 384, 14, 1, 4),
    ("dw 576 14", 576, 14, 1, 2),
    ("dw 576 14/2", 576, 14, 2, 1),
    ("dw 960 7", 960, 7, 1, 3),
)
#: MobileNetV2's distinct pointwise (1x1) convolutions on a 224x224 image: ``(name, C, H, K, count)``,
#: stride 1: each block's expansion (``C -> 6C``) and projection (``6C -> C'``), and the last layer.
MOBILENET_V2_POINTWISE = (
    ("pw 32>16 112", 32, 112, 16, 1),
    ("pw 16>96 112", 16, 112, 96, 1),
    ("pw 96>24 56", 96, 56, 24, 1),
    ("pw 24>144 56", 24, 56, 144, 2),
    ("pw 144>24 56", 144, 56, 24, 1),
    ("pw 144>32 28", 144, 28, 32, 1),
    ("pw 32>192 28", 32, 28, 192, 3),
    ("pw 192>32 28", 192, 28, 32, 2),
    ("pw 192>64 14", 192, 14, 64, 1),
    ("pw 64>384 14", 64, 14, 384, 4),
    ("pw 384>64 14", 384, 14, 64, 3),
    ("pw 384>96 14", 384, 14, 96, 1),
    ("pw 96>576 14", 96, 14, 576, 3),
    ("pw 576>96 14", 576, 14, 96, 2),
    ("pw 576>160 7", 576, 7, 160, 1),
    ("pw 160>960 7", 160, 7, 960, 3),
    ("pw 960>160 7", 960, 7, 160, 2),
    ("pw 960>320 7", 960, 7, 320, 1),
    ("pw 320>1280 7", 320, 7, 1280, 1),
)
MOBILENET_QUICK = ("dw 32 112", "dw 144 56/2", "dw 576 14", "dw 960 7", "pw 24>144 56", "pw 960>160 7")

#: Single-channel image filters (N = C = K = 1, ``padding = R // 2``): ``(name, size, R, stride)``,
#: the shapes an image-processing user runs through OpenCV's ``filter2D``.
FILTERS = tuple(
    (f"{r}x{r} {size}^2", size, r, 1) for size in (2048, 4096, 8192) for r in (3, 5, 7)
) + (("3x3 8192^2/2", 8192, 3, 2), ("7x7 8192^2/2", 8192, 7, 2))
FILTERS_QUICK = ("3x3 2048^2", "7x7 2048^2", "3x3 8192^2/2")

SUITES = ("seed-batch", "seed-size", "resnet50", "mobilenet", "filters", "custom")


@dataclass(frozen=True)
class Case:
    """One shape of a suite.

    Attributes
    ----------
    label : str
        Short name for tables and plots (``"N=16"``, ``"s3 3x3 128>128"``).
    problem : ConvProblem
        The convolution.
    weight : int
        How many times the shape occurs (ResNet-50's per-network count; 1 elsewhere).
    sweep : str or None
        The parameter the suite varies (``"N"`` or ``"H"``), for plots against it.
    """

    label: str
    problem: ConvProblem
    weight: int = 1
    sweep: str | None = None

    @property
    def sweep_value(self) -> int | None:
        """The value of :attr:`sweep` for this case."""
        return None if self.sweep is None else getattr(self.problem, self.sweep)


def seed_batch(*, dtype="float32", quick=False) -> list[Case]:
    """The thesis' batch sweep: N = 8, 16, ..., 80; C = K = 4, H = W = 1024, 3x3, no padding."""
    sizes = SEED_BATCH_SIZES_QUICK if quick else SEED_BATCH_SIZES
    return [Case(f"N={n}", ConvProblem(n, 4, 1024, 1024, 4, 3, 3, dtype=dtype), sweep="N") for n in sizes]


def seed_size(*, dtype="float32", quick=False) -> list[Case]:
    """The thesis' image-size sweep: N = 8, C = K = 4, H = W = 64, 128, ..., 4096, 3x3, no padding."""
    sizes = SEED_IMAGE_SIZES_QUICK if quick else SEED_IMAGE_SIZES
    return [Case(f"H=W={s}", ConvProblem(8, 4, s, s, 4, 3, 3, dtype=dtype), sweep="H") for s in sizes]


def resnet50(*, batch=8, dtype="float32", quick=False) -> list[Case]:
    """The distinct convolutions of ResNet-50 v1.5 at batch ``batch``, weighted by occurrence."""
    cases = []
    for name, C, H, W, K, R, S, stride, pad, count in RESNET50_V15_LAYERS:
        if quick and name not in RESNET50_QUICK:
            continue
        problem = ConvProblem(batch, C, H, W, K, R, S, stride=(stride, stride), padding=(pad,) * 4, dtype=dtype)
        cases.append(Case(name, problem, weight=count))
    return cases


def mobilenet(*, batch=8, dtype="float32", quick=False) -> list[Case]:
    """The distinct depthwise (``dw ...``) then pointwise (``pw ...``) convolutions of MobileNetV2
    at batch ``batch``, weighted by occurrence."""
    cases = []
    for name, C, H, stride, count in MOBILENET_V2_DEPTHWISE:
        problem = ConvProblem(batch, C, H, H, C, 3, 3, stride=(stride, stride), padding=(1, 1, 1, 1), groups=C,
                              dtype=dtype)
        cases.append(Case(name, problem, weight=count))
    for name, C, H, K, count in MOBILENET_V2_POINTWISE:
        cases.append(Case(name, ConvProblem(batch, C, H, H, K, 1, 1, dtype=dtype), weight=count))
    return [c for c in cases if not quick or c.label in MOBILENET_QUICK]


def filters(*, dtype="float32", quick=False) -> list[Case]:
    """Single-channel 3x3, 5x5 and 7x7 filters on 2048^2 to 8192^2 images, ``padding = R // 2``
    (the output keeps the image's size), and two strided ones."""
    cases = []
    for name, size, r, stride in FILTERS:
        if quick and name not in FILTERS_QUICK:
            continue
        problem = ConvProblem(1, 1, size, size, 1, r, r, stride=(stride, stride), padding=(r // 2,) * 4, dtype=dtype)
        cases.append(Case(name, problem))
    return cases


def custom(shapes, *, stride=1, padding=0, dilation=1, groups=1, bias=False, dtype="float32") -> list[Case]:
    """One case per ``(N, C, H, W, K, R, S)`` of ``shapes``, all with the same parameters.

    ``stride``, ``padding``, ``dilation`` and ``groups`` take every form :func:`convlib.conv2d`
    accepts (``padding="same"``, ``(top, bottom, left, right)``, ...) and are validated as it does.
    """
    cases = []
    dt = np.dtype(dtype)
    for N, C, H, W, K, R, S in shapes:
        if groups < 1 or C % groups:
            raise ValueError(f"groups={groups} must be >= 1 and divide C={C}")
        problem = make_problem((N, C, H, W), (K, C // groups, R, S), (K,) if bias else None, dt, dt,
                               dt if bias else None, stride=stride, padding=padding, dilation=dilation,
                               groups=groups)
        cases.append(Case(problem.describe().rsplit(" ", 1)[0], problem))
    return cases


def build(name: str, *, dtype="float32", quick=False, batch=8, shapes=(), stride=1, padding=0, dilation=1,
          groups=1, bias=False) -> list[Case]:
    """The cases of suite ``name`` (one of :data:`SUITES`).

    Parameters
    ----------
    name : str
        ``"seed-batch"``, ``"seed-size"``, ``"resnet50"``, ``"mobilenet"``, ``"filters"`` or ``"custom"``.
    dtype : str
        ``"float32"`` or ``"float64"``.
    quick : bool
        Keep a few representative cases only (smoke runs).
    batch : int
        The batch size of ResNet-50 and MobileNetV2.
    shapes, stride, padding, dilation, groups, bias
        The custom suite's shapes ``(N, C, H, W, K, R, S)`` and parameters (see :func:`custom`).

    Returns
    -------
    list of Case
    """
    if name == "seed-batch":
        return seed_batch(dtype=dtype, quick=quick)
    if name == "seed-size":
        return seed_size(dtype=dtype, quick=quick)
    if name == "resnet50":
        return resnet50(batch=batch, dtype=dtype, quick=quick)
    if name == "mobilenet":
        return mobilenet(batch=batch, dtype=dtype, quick=quick)
    if name == "filters":
        return filters(dtype=dtype, quick=quick)
    if name == "custom":
        if not shapes:
            raise ValueError("the custom suite needs at least one --shape N,C,H,W,K,R,S")
        return custom(shapes, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias,
                      dtype=dtype)
    raise ValueError(f"unknown suite {name!r}; known suites are {', '.join(SUITES)}")
