"""The public entry points: :func:`conv2d`, :func:`algorithms`, :func:`devices`."""

from __future__ import annotations

import numpy as np

from . import registry
from .backends import _array_backend, devices as _devices, get_backend, resolve_device
from .problem import ConvProblem, array_dtype, make_problem

_ALGO_CHOICES = ("auto",) + registry.ALGORITHM_NAMES


def _as_array(name, arr):
    """Array-likes (lists, scalars) become numpy arrays; device arrays are left where they are."""
    if arr is None or _array_backend(arr) != "cpu" or isinstance(arr, np.ndarray):
        return arr
    try:
        return np.asarray(arr)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} of type {type(arr).__name__} cannot be read as an array: {exc}") from None


def build_problem(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1) -> ConvProblem:
    """The validated :class:`~convlib.problem.ConvProblem` for these arguments (no computation)."""
    for name, arr in (("x", x), ("w", w)):
        if arr is None:
            raise TypeError(f"{name}=None is not an array; pass a numpy (or device) array")
    x, w, bias = _as_array("x", x), _as_array("w", w), _as_array("bias", bias)
    for name, arr in (("x", x), ("w", w), ("bias", bias)):
        if arr is not None and not hasattr(arr, "shape"):
            raise TypeError(f"{name} of type {type(arr).__name__} is not an array")
    return make_problem(
        tuple(x.shape), tuple(w.shape), None if bias is None else tuple(bias.shape),
        array_dtype("x", x), array_dtype("w", w), None if bias is None else array_dtype("bias", bias),
        stride=stride, padding=padding, dilation=dilation, groups=groups,
    )


def _check_algo(algo) -> str:
    if not isinstance(algo, str) or algo not in _ALGO_CHOICES:
        raise ValueError(f"algo={algo!r}: allowed are {', '.join(map(repr, _ALGO_CHOICES))}")
    return algo


def unsupported_reason(backend: str, algo: str, problem: ConvProblem) -> str | None:
    """Why ``algo`` on ``backend`` cannot serve ``problem``, or None when it can."""
    if algo not in registry.algorithm_names(backend):
        return f"algo={algo!r} is not implemented on the {backend} backend"
    return registry.implementation(backend, algo).supports(problem)


def serving_algorithms(backend: str, problem: ConvProblem) -> list[str]:
    """The algorithms of ``backend`` that can serve ``problem``."""
    return [a for a in registry.algorithm_names(backend) if unsupported_reason(backend, a, problem) is None]


def conv2d(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, algo="auto", device=None):
    """Batched 2-D convolution (cross-correlation, as in deep learning) over NCHW tensors.

    ``y[n, k, p, q] = bias[k] + sum_{c, r, s} x[n, g*C/G + c, p*sh - pt + r*dh, q*sw - pl + s*dw]
    * w[k, c, r, s]`` where ``g = k // (K/G)``, out-of-range input reads are zero (padding).

    Parameters
    ----------
    x : array, shape (N, C, H, W)
        Input, float32 or float64. A numpy array (or array-like), a dpnp / dpctl.tensor array, or a
        CUDA array (CuPy, numba device array, PyTorch CUDA tensor). Never modified.
    w : array, shape (K, C // groups, R, S)
        Filters, same dtype and kind as ``x``.
    bias : array, shape (K,), optional
        Added to every output of channel k.
    stride : int or (int, int), default 1
        Step between output pixels, each >= 1.
    padding : int or (int, int) or (int, int, int, int) or {"valid", "same"}, default 0
        Zero padding: the same on every side, ``(pad_h, pad_w)``, or ``(top, bottom, left,
        right)``. ``"same"`` (stride 1 only) keeps ``P = H`` and ``Q = W``, padding one more at the
        bottom/right when the total is odd (as PyTorch does).
    dilation : int or (int, int), default 1
        Spacing between filter taps, each >= 1.
    groups : int, default 1
        Split channels into ``groups`` independent convolutions; must divide C and K.
        ``groups == C == K`` is a depthwise convolution.
    algo : {"auto", "direct", "im2col", "blis", "winograd", "winograd2", "winograd4"}
        ``"direct"``: the definition, register-blocked over output channels and vectorised along
        the output width. ``"im2col"``: an explicit column matrix per batch chunk, then BLAS GEMM.
        ``"blis"``: a five-loop BLIS GEMM whose B panels are packed straight from the image (no
        column matrix; workspace independent of N, H, W). ``"winograd"`` (= ``"winograd4"``,
        F(4x4,3x3)) and ``"winograd2"`` (F(2x2,3x3)): 3x3, stride 1, dilation 1 only.
        ``"auto"``: what :func:`choose_algorithm` picks.
    device : None or str or dpctl.SyclDevice or dpctl.SyclQueue
        None follows the data; ``"cpu"``; ``"sycl"`` or a dpctl filter string; ``"cuda"``/``"cuda:N"``.
        :func:`devices` lists what this machine offers.

    Returns
    -------
    y : array, shape (N, K, P, Q)
        Same dtype as ``x`` and the same kind (numpy in, numpy out, even when computed on a device).

    Raises
    ------
    TypeError, ValueError
        Invalid arguments; the message names the argument, its value and what is allowed.
    NotImplementedError
        A valid request the chosen algorithm cannot serve; the message lists those that can.

    Examples
    --------
    >>> import numpy as np, convlib
    >>> x = np.ones((1, 1, 4, 4), np.float32); w = np.ones((1, 1, 3, 3), np.float32)
    >>> convlib.conv2d(x, w, padding=1)[0, 0]
    array([[4., 6., 6., 4.],
           [6., 9., 9., 6.],
           [6., 9., 9., 6.],
           [4., 6., 6., 4.]], dtype=float32)
    """
    algo = _check_algo(algo)
    x, w, bias = _as_array("x", x), _as_array("w", w), _as_array("bias", bias)
    problem = build_problem(x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)
    target = resolve_device(device, x, w, bias)
    backend = target.backend
    if algo == "auto":
        from .select import choose_algorithm_for

        algo = choose_algorithm_for(problem, backend.name, backend.name if device is None else str(device)).algo
    else:
        reason = unsupported_reason(backend.name, algo, problem)
        if reason is not None:
            able = serving_algorithms(backend.name, problem)
            raise NotImplementedError(
                f"algo={algo!r} cannot serve this problem on {backend.name}: {reason}. "
                f"Algorithms that can: {', '.join(able) or 'none'}"
            )
    if problem.N == 0:
        return backend.finish(backend.empty(problem.y_shape, problem.dtype, target.handle), x, target.handle)
    impl = registry.implementation(backend.name, algo)
    xd = backend.prepare(x, problem.dtype, target.handle)
    wd = backend.prepare(w, problem.dtype, target.handle)
    bd = None if bias is None else backend.prepare(bias, problem.dtype, target.handle)
    y = impl.conv2d(problem, xd, wd, bd, target.handle)
    return backend.finish(y, x, target.handle)


def algorithms(device="cpu") -> list[str]:
    """The algorithms offered on ``device`` (see :func:`conv2d` for each one).

    Parameters
    ----------
    device : str or dpctl.SyclDevice or dpctl.SyclQueue, default "cpu"
        As the ``device=`` of :func:`conv2d` (None means ``"cpu"``).

    Returns
    -------
    list of str
        Registered algorithm names, ``"auto"`` excluded.
    """
    if device is None:
        device = "cpu"
    target = resolve_device(device, None, None, None)
    return registry.algorithm_names(target.backend.name)


def devices() -> list[str]:
    """The devices this machine offers, as values for ``device=``.

    Returns
    -------
    list of str
        ``"cpu"`` always; SYCL filter strings (e.g. ``"opencl:cpu:0"``) when the ``sycl`` extra is
        installed and a device is found; ``"cuda:N"`` per NVIDIA GPU when numba-cuda finds one.
    """
    return _devices()


__all__ = ["conv2d", "algorithms", "devices", "build_problem", "get_backend"]
