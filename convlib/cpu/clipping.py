"""The output positions of a row (or column) that read inside the image, as one range.

A tap with input offset ``offset`` reads position ``t*stride + offset`` for output position
``t``; the kernels loop only over the ``t`` whose read lies inside ``[0, size)``, so their inner
loops need no bounds test (and vectorise) and the padding is handled by what lies outside the
range. Every CPU kernel that clips this way (im2col and col2im, BLIS packing, the backward
passes) takes the range from :func:`positions_inside`.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True, inline="always")
def positions_inside(offset, stride, size, count):
    """``(lo, hi)``: the output positions ``t`` of ``[0, count)`` whose input position
    ``t*stride + offset`` lies inside ``[0, size)`` are exactly ``lo <= t < hi`` (``lo == hi``
    when there are none; both within ``[0, count]``)."""
    lo = min(count, max(0, (-offset + stride - 1) // stride))
    hi = max(lo, min(count, (size - 1 - offset) // stride + 1))
    return lo, hi
