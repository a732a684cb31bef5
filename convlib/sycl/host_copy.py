"""Zero padding into host-accessible USM on a CPU device, done by the host's threads.

On the OpenCL CPU device, shared USM is ordinary host RAM that numpy can address
(:func:`convlib.sycl.memory.host_view`), so moving data into it needs no device kernel.
Measured on the seed shape (8 x 4 x 1024 x 1024 float32, 128 MiB, 2 threads):

- numpy's ``np.copyto`` into fresh shared USM: ~19 ms (one thread, page faults included);
- dpctl.tensor's ``zeros`` + strided assignment for a one-pixel zero border: ~210 ms;
- :func:`pad_into` over both threads: a padded `direct` call ends ~8 ms after an unpadded one
  (70 vs 62 ms, numpy in and out; ``docs/devices.md``).

It takes numpy views of the USM memory; the caller waits for the queue first. (A parallel copy
for numpy inputs was tried as well: no faster than ``np.copyto``, page faults dominate.)
"""

from __future__ import annotations

from numba import njit, prange


@njit(parallel=True, cache=True)
def pad_into(source, top, left, target):
    """``target`` = ``source`` (N, C, H, W) inside a zero border; ``target`` is (N, C, Hp, Wp).

    Parameters
    ----------
    source : (N, C, H, W) numpy.ndarray     # IN
    top, left : int                         # IN rows above / columns left of the image
    target : (N, C, Hp, Wp) numpy.ndarray   # OUT every element written
    """
    N, C, H, W = source.shape
    Hp, Wp = target.shape[2], target.shape[3]
    for plane in prange(N * C):
        n = plane // C
        c = plane - n * C
        for h in range(Hp):
            row = h - top
            if row < 0 or row >= H:
                target[n, c, h, :] = 0
            else:
                target[n, c, h, :left] = 0
                target[n, c, h, left:left + W] = source[n, c, row, :]
                target[n, c, h, left + W:] = 0
