"""The shapes ``convlib.tune`` measures on: few, small, and like the layers people run.

Each is ``(name, N, C, H, W, K, R, S, stride, padding, groups)``, float32. The sets are small
enough for the quick mode to finish in about two minutes on two cores, and cover what each knob
is about: GEMM-shaped layers for the BLIS blocks, deep 3x3 layers for direct's register blocks
and Winograd, MobileNetV2's depthwise layers for depthwise's channel blocks, and for ``auto``'s
thresholds one of each kind of layer the rules tell apart (ResNet-50's, MobileNetV2's depthwise
and pointwise, single-channel image filters at strides 1 and 2, the seed thesis' few-channel
images).
"""

from __future__ import annotations

#: GEMM-shaped layers (ResNet-50 v1.5) for the BLIS block sizes.
BLIS_SHAPES = (
    ("3x3 128>128 28^2", 2, 128, 28, 28, 128, 3, 3, 1, 1, 1),
    ("3x3 256>256 14^2", 2, 256, 14, 14, 256, 3, 3, 1, 1, 1),
    ("1x1 1024>256 14^2", 2, 1024, 14, 14, 256, 1, 1, 1, 0, 1),
    ("1x1 128>512 28^2", 2, 128, 28, 28, 512, 1, 1, 1, 0, 1),
)

#: Deep reductions with enough filters for every register block of direct.
DIRECT_SHAPES = (
    ("3x3 64>96 28^2", 2, 64, 28, 28, 96, 3, 3, 1, 1, 1),
    ("3x3 32>48 56^2", 1, 32, 56, 56, 48, 3, 3, 1, 1, 1),
)

#: Few-channel images of growing size, for the one-thread threshold of direct.
SERIAL_LADDER = tuple(
    (f"3x3 4>4 {n}^2", 1, 4, n, n, 4, 3, 3, 1, 1, 1) for n in (24, 48, 96, 192, 384)
)

#: A large stride-1 unpadded input (32 MiB: more than half of most last-level caches), for whether
#: direct reads such inputs in place or gathers each work item's rows (the seed thesis' images).
IN_PLACE_SHAPES = (("3x3 4>4 1024^2 unpadded", 2, 4, 1024, 1024, 4, 3, 3, 1, 0, 1),)

#: A padded input of 12 MiB (under the 16 MiB that direct gathers whole at most by default), for
#: whether direct gathers such inputs whole once or each work item its own rows.
WHOLE_SHAPES = (("3x3 16>16 256^2 padded", 3, 16, 256, 256, 16, 3, 3, 1, 1, 1),)

#: ResNet-50's 3x3 stride-1 layers, for Winograd's register tile and chunk size.
WINOGRAD_SHAPES = (
    ("3x3 64>64 56^2", 1, 64, 56, 56, 64, 3, 3, 1, 1, 1),
    ("3x3 128>128 28^2", 2, 128, 28, 28, 128, 3, 3, 1, 1, 1),
    ("3x3 256>256 14^2", 2, 256, 14, 14, 256, 3, 3, 1, 1, 1),
    ("3x3 512>512 7^2", 4, 512, 7, 7, 512, 3, 3, 1, 1, 1),
)

#: MobileNetV2's depthwise layers (groups == C, 3x3) at strides 1 and 2, batch 1, for the small
#: stride-1 planes that take whole planes, then the band size and output positions per step of
#: the channel-blocked way: the kernels are bound by memory, so a call takes 0.1-3 ms.
DEPTHWISE_SHAPES = (
    ("dw 3x3 144 56^2", 1, 144, 56, 56, 144, 3, 3, 1, 1, 144),
    ("dw 3x3/2 144 56^2", 1, 144, 56, 56, 144, 3, 3, 2, 1, 144),
    ("dw 3x3 192 28^2", 1, 192, 28, 28, 192, 3, 3, 1, 1, 192),
    ("dw 3x3/2 576 14^2", 1, 576, 14, 14, 576, 3, 3, 2, 1, 576),
    ("dw 3x3 384 14^2", 1, 384, 14, 14, 384, 3, 3, 1, 1, 384),
)

#: One of each kind of layer auto's rules tell apart.
AUTO_SHAPES = (
    # ResNet-50 v1.5, batch 1
    ("resnet stem 7x7/2 3>64", 1, 3, 224, 224, 64, 7, 7, 2, 3, 1),
    ("resnet 3x3 64>64 56^2", 1, 64, 56, 56, 64, 3, 3, 1, 1, 1),
    ("resnet 1x1 64>256 56^2", 1, 64, 56, 56, 256, 1, 1, 1, 0, 1),
    ("resnet 1x1 256>64 56^2", 1, 256, 56, 56, 64, 1, 1, 1, 0, 1),
    ("resnet 3x3/2 128>128 56^2", 1, 128, 56, 56, 128, 3, 3, 2, 1, 1),
    ("resnet 3x3 128>128 28^2", 1, 128, 28, 28, 128, 3, 3, 1, 1, 1),
    ("resnet 1x1/2 256>512 56^2", 1, 256, 56, 56, 512, 1, 1, 2, 0, 1),
    ("resnet 3x3 256>256 14^2", 1, 256, 14, 14, 256, 3, 3, 1, 1, 1),
    ("resnet 1x1 1024>256 14^2", 1, 1024, 14, 14, 256, 1, 1, 1, 0, 1),
    ("resnet 3x3 512>512 7^2", 1, 512, 7, 7, 512, 3, 3, 1, 1, 1),
    ("resnet 1x1 512>2048 7^2", 1, 512, 7, 7, 2048, 1, 1, 1, 0, 1),
    # MobileNetV2, batch 2: depthwise and pointwise
    ("mobilenet dw 3x3 96 112^2/2", 2, 96, 112, 112, 96, 3, 3, 2, 1, 96),
    ("mobilenet dw 3x3 144 56^2", 2, 144, 56, 56, 144, 3, 3, 1, 1, 144),
    ("mobilenet dw 3x3 192 28^2", 2, 192, 28, 28, 192, 3, 3, 1, 1, 192),
    ("mobilenet dw 3x3 576 14^2/2", 2, 576, 14, 14, 576, 3, 3, 2, 1, 576),
    ("mobilenet pw 1x1 96>24 56^2", 2, 96, 56, 56, 24, 1, 1, 1, 0, 1),
    ("mobilenet pw 1x1 32>16 112^2", 2, 32, 112, 112, 16, 1, 1, 1, 0, 1),
    ("mobilenet pw 1x1 24>144 56^2", 2, 24, 56, 56, 144, 1, 1, 1, 0, 1),
    # Single-channel image filters
    ("filter 3x3 1024^2", 1, 1, 1024, 1024, 1, 3, 3, 1, 1, 1),
    ("filter 5x5 1024^2", 1, 1, 1024, 1024, 1, 5, 5, 1, 2, 1),
    ("filter 7x7 1024^2", 1, 1, 1024, 1024, 1, 7, 7, 1, 3, 1),
    ("filter 5x5/2 2048^2", 1, 1, 2048, 2048, 1, 5, 5, 2, 2, 1),
    # Few channels (the seed thesis' shape, smaller) and an RGB input layer
    ("seed 3x3 4>4 512^2", 2, 4, 512, 512, 4, 3, 3, 1, 1, 1),
    ("rgb 3x3 3>16 256^2", 1, 3, 256, 256, 16, 3, 3, 1, 1, 1),
    ("3x3 16>32 128^2", 1, 16, 128, 128, 32, 3, 3, 1, 1, 1),
)

#: The quick mode's subset of :data:`AUTO_SHAPES` (every kind of layer, fewer of each).
QUICK_AUTO = tuple(s for s in AUTO_SHAPES if not s[0].startswith((
    "resnet 1x1 256>64", "resnet 1x1 512>2048", "mobilenet dw 3x3 192", "mobilenet pw 1x1 32")))
