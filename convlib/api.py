"""The public entry points: :func:`conv2d`, its backward passes (:func:`conv2d_backward_data`,
:func:`conv2d_backward_weight`, :func:`conv2d_backward_bias`), :func:`conv_transpose2d`,
:func:`choose_algorithm`, :func:`algorithms`, :func:`devices` and :func:`build_problem`.

Each validates its arguments first, in one place (:func:`convlib.core.problem.make_problem` for
the problem, :func:`convlib.dispatch.registry.check_operation` and :func:`check_algo` for the
names), then hands a :class:`~convlib.dispatch.plan.Plan` the work. The plans of
:func:`conv2d` and its backward passes are kept by call signature
(:data:`convlib.dispatch.plan.PLANS`): a call repeated with the same shapes, dtypes and
arguments skips the validation and the choice, which were done when its plan was built.
"""

from __future__ import annotations

import numpy as np

from .core.options import option_context, options
from .core.problem import (
    ConvProblem, array_dtype, make_backward_bias_problem, make_backward_data_problem, make_backward_weight_problem,
    make_problem, make_transpose_problem,
)
from .dispatch import registry
from .dispatch.devices import devices as _devices, host_array, resolve_device
from .dispatch.measure import choose_by_measuring
from .dispatch.plan import PLANS, call_signature, make_plan
from .dispatch.select import Choice, choose

_ALGO_CHOICES = ("auto",) + registry.ALGORITHM_NAMES


def _arrays(**named):
    """The named arguments as arrays (host ones as numpy), or a ``TypeError`` naming the one
    that is not an array; None stays None."""
    out = []
    for name, arr in named.items():
        arr = host_array(name, arr)
        if arr is not None and not hasattr(arr, "shape"):
            raise TypeError(f"{name} of type {type(arr).__name__} is not an array")
        out.append(arr)
    return out


def _dask(*arrays):
    """:mod:`convlib.dask` when one of ``arrays`` is a Dask array (judged from its type's module,
    so dask is imported only by those who pass one), else None."""
    for a in arrays:
        if a is not None and type(a) is not np.ndarray and type(a).__module__.split(".")[0] == "dask":
            from . import dask as dask_arrays
            return dask_arrays
    return None


def _required(**named) -> None:
    for name, arr in named.items():
        if arr is None:
            raise TypeError(f"{name}=None is not an array; pass a numpy (or device) array")


def build_problem(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1) -> ConvProblem:
    """The validated :class:`~convlib.core.problem.ConvProblem` for these arguments (no computation).

    Parameters
    ----------
    x, w, bias, stride, padding, dilation, groups
        As in :func:`conv2d`; only shapes and dtypes are read.

    Returns
    -------
    ConvProblem

    Raises
    ------
    TypeError, ValueError
        Invalid arguments; the message names the argument, its value and what is allowed.
    """
    _required(x=x, w=w)
    x, w, bias = _arrays(x=x, w=w, bias=bias)
    return make_problem(
        tuple(x.shape), tuple(w.shape), None if bias is None else tuple(bias.shape),
        array_dtype("x", x), array_dtype("w", w), None if bias is None else array_dtype("bias", bias),
        stride=stride, padding=padding, dilation=dilation, groups=groups,
    )


def check_algo(algo) -> str:
    """``algo`` when it names an algorithm or ``"auto"``, else a ``ValueError`` listing them."""
    if not isinstance(algo, str) or algo not in _ALGO_CHOICES:
        raise ValueError(f"algo={algo!r}: allowed are {', '.join(map(repr, _ALGO_CHOICES))}")
    return algo


def _plan(operation: str, arrays, device, algo, build_problem_of, key=None, **arguments):
    """The plan of one call: the one built for the same call signature before
    (:data:`~convlib.dispatch.plan.PLANS`), else ``algo`` checked, ``build_problem_of()``
    validated and a new plan made. ``arguments`` are the call's other arguments as given; ``key``,
    when given, replaces their :func:`~convlib.dispatch.plan.call_signature` (see :func:`plan_conv2d`)."""

    def build():
        checked_algo = check_algo(algo)
        problem = build_problem_of()
        return make_plan(operation, problem, device, checked_algo, arrays)

    if key is None:
        key = call_signature(operation, arrays, device, algo, **arguments)
    return PLANS.get(key, build)


# The plans of the four operations' calls, for arrays already read as host (numpy) or device
# arrays, kept in PLANS under the call signature or a ``key`` given instead. The public functions
# run them; a caller that calls one layer many times with arguments of its own making
# (convlib.torch) keeps them under a key it builds faster than the call signature, which must
# then say everything the plan is built from and end with convlib.dispatch.plan.host_state().
def plan_conv2d(x, w, bias, *, stride, padding, dilation, groups, algo, device, key=None):
    """The :class:`~convlib.dispatch.plan.Plan` that :func:`conv2d` runs for these arrays and arguments."""
    return _plan("conv2d", (x, w, bias), device, algo,
                 lambda: build_problem(x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups),
                 key=key, stride=stride, padding=padding, dilation=dilation, groups=groups)


def plan_backward_data(dy, w, x_shape, *, stride, padding, dilation, groups, algo, device, key=None):
    """The plan that :func:`conv2d_backward_data` runs."""
    return _plan("conv2d_backward_data", (dy, w), device, algo,
                 lambda: make_backward_data_problem(
                     tuple(dy.shape), tuple(w.shape), x_shape, array_dtype("dy", dy), array_dtype("w", w),
                     stride=stride, padding=padding, dilation=dilation, groups=groups),
                 key=key, x_shape=x_shape, stride=stride, padding=padding, dilation=dilation, groups=groups)


def plan_backward_weight(x, dy, w_shape, *, stride, padding, dilation, groups, algo, device, key=None):
    """The plan that :func:`conv2d_backward_weight` runs."""
    return _plan("conv2d_backward_weight", (x, dy), device, algo,
                 lambda: make_backward_weight_problem(
                     tuple(x.shape), tuple(dy.shape), w_shape, array_dtype("x", x), array_dtype("dy", dy),
                     stride=stride, padding=padding, dilation=dilation, groups=groups),
                 key=key, w_shape=w_shape, stride=stride, padding=padding, dilation=dilation, groups=groups)


def plan_backward_bias(dy, *, algo, device, key=None):
    """The plan that :func:`conv2d_backward_bias` runs."""
    return _plan("conv2d_backward_bias", (dy,), device, algo,
                 lambda: make_backward_bias_problem(tuple(dy.shape), array_dtype("dy", dy)), key=key)


def conv2d(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, algo="auto", device=None,
           allow_tf32=None):
    """Batched 2-D convolution (cross-correlation, as in deep learning) over NCHW tensors.

    ``y[n, k, p, q] = bias[k] + sum_{c, r, s} x[n, g*C/G + c, p*sh - pt + r*dh, q*sw - pl + s*dw]
    * w[k, c, r, s]`` where ``g = k // (K/G)``, out-of-range input reads are zero (padding).

    Parameters
    ----------
    x : array, shape (N, C, H, W)
        Input, float32 or float64 (every device), float16 or bfloat16 (CUDA: products exact,
        sums in float32, the result rounded once; other devices raise ``TypeError``). A numpy array (or
        array-like), a PyTorch tensor, a dpnp /
        dpctl.tensor array, a CUDA array (CuPy, numba device array, PyTorch CUDA tensor), or a
        Dask array (the result is then a lazy Dask array, each block computed by this function:
        :mod:`convlib.dask`, docs/dask.md). Never modified.
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
    algo : {"auto", "direct", "im2col", "blis", "winograd", "winograd2", "winograd4", "depthwise"}
        ``"direct"``: the definition, register-blocked over output channels and vectorised along
        the output width. ``"im2col"``: an explicit column matrix per batch chunk, then BLAS GEMM.
        ``"blis"``: a five-loop BLIS GEMM whose B panels are packed straight from the image (no
        column matrix; workspace independent of N, H, W). ``"winograd"`` (= ``"winograd4"``,
        F(4x4,3x3)) and ``"winograd2"`` (F(2x2,3x3)): 3x3, stride 1, dilation 1 only.
        ``"depthwise"`` (CPU): ``groups == C``, each plane streamed once, no padded copy.
        ``"auto"``: what :func:`choose_algorithm` picks.
    device : None or str or dpctl.SyclDevice or dpctl.SyclQueue
        None follows the data; ``"cpu"``; ``"sycl"`` or a dpctl filter string; ``"cuda"``/``"cuda:N"``.
        :func:`devices` lists what this machine offers.
    allow_tf32 : bool, optional
        Let float32 GEMMs on an NVIDIA GPU use TF32 tensor cores (about 3e-4 relative error;
        ``blis``'s own tensor-core kernel and the cuBLAS GEMMs of ``im2col`` and ``winograd2``);
        everything else stays exact. None (default) follows ``convlib.options.allow_tf32``, which
        is False: exact FP32.

    Returns
    -------
    y : array, shape (N, K, P, Q)
        Same dtype as ``x`` and the same kind, wherever it was computed: numpy in, numpy out; a
        PyTorch tensor in, a PyTorch tensor out (CPU or CUDA, as ``x``); dpnp in, dpnp out; CuPy
        in, CuPy out. Other host array-likes (lists, objects with ``__array__``) give numpy.

    Raises
    ------
    TypeError, ValueError
        Invalid arguments; the message names the argument, its value and what is allowed.
    NotImplementedError
        A valid request the chosen algorithm cannot serve; the message lists those that can.
    MemoryError
        Before any work, when the result cannot fit in the device's free memory. (Temporary
        memory never passes ``convlib.options.workspace_cap``: larger problems run in pieces.)

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
    if allow_tf32 is not None:
        with option_context(allow_tf32=allow_tf32):
            return conv2d(x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups,
                          algo=algo, device=device)
    if (dask_arrays := _dask(x, w, bias)) is not None:
        return dask_arrays.conv2d(conv2d, check_algo, x, w, bias, stride=stride, padding=padding,
                                  dilation=dilation, groups=groups, algo=algo, device=device,
                                  allow_tf32=options.allow_tf32)
    like = x
    x, w, bias = host_array("x", x), host_array("w", w), host_array("bias", bias)
    plan = plan_conv2d(x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups, algo=algo,
                       device=device)
    return plan.run(x, w, bias, like=like)


_GRADIENT_NOTE = """
    The arrays may be numpy arrays (or array-likes), PyTorch tensors, dpnp / dpctl.tensor arrays
    or CUDA arrays, as for :func:`conv2d`; the result has the kind of the first array and is
    computed where the data lives (or on ``device``). Dask arrays give a lazy Dask array (the
    chunkings each pass serves: :mod:`convlib.dask`). Inputs are never modified."""


def conv2d_backward_data(dy, w, x_shape, *, stride=1, padding=0, dilation=1, groups=1, algo="auto",
                         device=None):
    """The gradient of :func:`conv2d` with respect to its input ``x``.

    ``dx[n, c, h, v] = sum over (k, r, s) with h = p*sh - pt + r*dh and v = q*sw - pl + s*dw of
    dy[n, k, p, q] * w[k, c', r, s]`` (``k`` in the group of ``c``): each input element collects
    the output gradients it fed. Several ``x`` shapes give one ``dy`` shape when the stride is
    above 1, so ``x_shape`` is an argument, as in ``torch.nn.grad.conv2d_input``.

    Parameters
    ----------
    dy : array, shape (N, K, P, Q)
        The gradient of the loss with respect to conv2d's output, float32 or float64 (float16 or bfloat16 on CUDA).
    w : array, shape (K, C // groups, R, S)
        The filters of the forward convolution, same dtype as ``dy``.
    x_shape : tuple of 4 ints
        ``(N, C, H, W)``, the shape of the forward convolution's input.
    stride, padding, dilation, groups
        Those of the forward convolution, as in :func:`conv2d` (``"same"`` and ``"valid"`` too).
    algo : {"auto", "direct", "im2col", "blis", ...}
        :func:`algorithms` with ``op="conv2d_backward_data"`` lists those of a device. ``"direct"``
        gathers, for each ``dx`` element, the ``dy`` elements it fed (no zero insertion: at stride
        > 1 no multiplication is wasted); ``"im2col"`` forms the column matrix ``W^T dY`` per
        batch chunk with BLAS and folds it back (col2im); ``"blis"`` is the same GEMM packed from
        the tensors, its col2im folded into the micro-kernel's store (no column matrix);
        ``"winograd"`` (``"winograd4"``, ``"winograd2"``), for 3x3 filters at stride 1 and dilation
        1 with padding of at most 2, runs the forward Winograd kernels on the filters rotated by
        180 degrees (the data pass is then a convolution of ``dy``); ``"depthwise"``, for
        depthwise layers (one filter per channel) at stride 1 and dilation 1, runs the forward
        depthwise kernels so.
    device
        As in :func:`conv2d`.

    Returns
    -------
    dx : array, shape ``x_shape``
    """ + _GRADIENT_NOTE + """

    Raises
    ------
    TypeError, ValueError
        Invalid arguments (a ``dy`` that does not have conv2d's output shape for ``x_shape`` and
        ``w`` included); the message names the argument, its value and what is allowed.
    NotImplementedError
        A valid request the chosen algorithm cannot serve; the message lists those that can.
    """
    if (dask_arrays := _dask(dy, w)) is not None:
        return dask_arrays.conv2d_backward_data(conv2d_backward_data, check_algo, dy, w, x_shape, stride=stride,
                                                padding=padding, dilation=dilation, groups=groups, algo=algo,
                                                device=device, forward=conv2d)
    like = dy
    _required(dy=dy, w=w)
    dy, w = _arrays(dy=dy, w=w)
    plan = plan_backward_data(dy, w, x_shape, stride=stride, padding=padding, dilation=dilation, groups=groups,
                              algo=algo, device=device)
    return plan.run(dy, w, None, like=like)


def conv2d_backward_weight(x, dy, w_shape, *, stride=1, padding=0, dilation=1, groups=1, algo="auto",
                           device=None):
    """The gradient of :func:`conv2d` with respect to its filters ``w``.

    ``dw[k, c, r, s] = sum over (n, p, q) of dy[n, k, p, q] * x[n, c_g, p*sh - pt + r*dh,
    q*sw - pl + s*dw]`` (``c_g`` the input channel ``c`` of ``k``'s group; zero in the padding),
    summed over the whole batch.

    Parameters
    ----------
    x : array, shape (N, C, H, W)
        The forward convolution's input, float32 or float64 (float16 or bfloat16 on CUDA).
    dy : array, shape (N, K, P, Q)
        The gradient with respect to its output, same dtype as ``x``.
    w_shape : tuple of 4 ints
        ``(K, C // groups, R, S)``, the shape of the filters.
    stride, padding, dilation, groups
        Those of the forward convolution, as in :func:`conv2d`.
    algo : {"auto", "direct", "im2col", "blis", ...}
        ``"direct"``: each ``dw`` element's sum, vectorised along the output width;
        ``"im2col"``: ``dY im2col(X)^T`` with BLAS per batch chunk; ``"blis"``: the same GEMM with
        both operands packed straight from ``dy`` and ``x``, reduced over the batch inside the
        GEMM (no per-image workspace).
    device
        As in :func:`conv2d`.

    Returns
    -------
    dw : array, shape ``w_shape``
    """ + _GRADIENT_NOTE + """

    Raises
    ------
    TypeError, ValueError, NotImplementedError
        As :func:`conv2d_backward_data`.
    """
    if (dask_arrays := _dask(x, dy)) is not None:
        return dask_arrays.conv2d_backward_weight(conv2d_backward_weight, check_algo, x, dy, w_shape, stride=stride,
                                                  padding=padding, dilation=dilation, groups=groups, algo=algo,
                                                  device=device)
    like = x
    _required(x=x, dy=dy)
    x, dy = _arrays(x=x, dy=dy)
    plan = plan_backward_weight(x, dy, w_shape, stride=stride, padding=padding, dilation=dilation, groups=groups,
                                algo=algo, device=device)
    return plan.run(x, dy, like=like)


def conv2d_backward_bias(dy, *, algo="auto", device=None):
    """The gradient of :func:`conv2d` with respect to its bias: ``dy.sum((0, 2, 3))``.

    Parameters
    ----------
    dy : array, shape (N, K, P, Q)
        The gradient with respect to conv2d's output, float32 or float64 (float16 or bfloat16 on CUDA).
    algo : {"auto", "direct"}
        ``"direct"``: a blocked sum per channel (float32 sums in blocks, so the error stays that
        of the block size, not of ``N * P * Q``).
    device
        As in :func:`conv2d`.

    Returns
    -------
    db : array, shape (K,)
    """ + _GRADIENT_NOTE + """
    """
    if (dask_arrays := _dask(dy)) is not None:
        return dask_arrays.conv2d_backward_bias(conv2d_backward_bias, check_algo, dy, algo=algo, device=device)
    like = dy
    _required(dy=dy)
    (dy,) = _arrays(dy=dy)
    plan = plan_backward_bias(dy, algo=algo, device=device)
    return plan.run(dy, like=like)


def conv_transpose2d(x, w, bias=None, *, stride=1, padding=0, output_padding=0, groups=1, dilation=1,
                     algo="auto", device=None):
    """Transposed convolution (PyTorch's ``conv_transpose2d``): the backward data pass of a
    convolution, plus a bias.

    It is :func:`conv2d_backward_data` with ``dy = x`` for the convolution whose input has the
    result's shape, and runs the same kernels.

    Parameters
    ----------
    x : array, shape (N, C_in, H, W)
        Input, float32 or float64 (float16 or bfloat16 on CUDA).
    w : array, shape (C_in, C_out // groups, R, S)
        Filters, in PyTorch's layout for transposed convolutions.
    bias : array, shape (C_out,), optional
    stride, padding, dilation, groups
        As PyTorch's: the forward convolution's, whose ``padding`` crops the result here.
        ``"valid"`` and ``"same"`` (stride 1) as in :func:`conv2d`.
    output_padding : int or (int, int), default 0
        Rows and columns added at the bottom and right of the result; each must be smaller than
        the stride or the dilation of its dimension.
    algo, device
        As in :func:`conv2d_backward_data`.

    Returns
    -------
    y : array, shape (N, C_out, H_out, W_out)
        ``H_out = (H - 1) * stride - (top + bottom) + dilation * (R - 1) + output_padding + 1``,
        and so for ``W_out``; the kind of ``x``.

    Raises
    ------
    TypeError, ValueError, NotImplementedError
        As :func:`conv2d`.
    """
    if (dask_arrays := _dask(x, w, bias)) is not None:
        return dask_arrays.conv_transpose2d(conv_transpose2d, check_algo, x, w, bias, stride=stride, padding=padding,
                                            output_padding=output_padding, groups=groups, dilation=dilation,
                                            algo=algo, device=device, forward=conv2d,
                                            data_pass=conv2d_backward_data)
    algo = check_algo(algo)
    _required(x=x, w=w)
    like = x
    x, w, bias = _arrays(x=x, w=w, bias=bias)
    problem = make_transpose_problem(
        tuple(x.shape), tuple(w.shape), None if bias is None else tuple(bias.shape), array_dtype("x", x),
        array_dtype("w", w), None if bias is None else array_dtype("bias", bias),
        stride=stride, padding=padding, output_padding=output_padding, groups=groups, dilation=dilation)
    plan = make_plan(problem.operation, problem, device, algo, (x, w, bias))
    if problem.y_shape != tuple(x.shape):
        # An output_padding of a stride or more (allowed by a larger dilation) adds output rows
        # that no input reaches; the convolution they are the gradient of has zero dy there.
        (x,) = plan.prepare(x)
        extended = plan.prepare(np.zeros(problem.y_shape, problem.dtype))[0]
        extended[:, :, :x.shape[2], :x.shape[3]] = x
        x = extended
    return plan.run(x, w, bias, like=like)


def choose_algorithm(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, device=None,
                     measure=False, repeats=5) -> Choice:
    """What ``conv2d(..., algo="auto")`` would run for these arguments, and why.

    Parameters
    ----------
    x, w, bias, stride, padding, dilation, groups, device
        As in :func:`convlib.conv2d`. Only shapes, dtypes and where the data lives are read.
    measure : bool, default False
        Time every candidate on random data of this shape, already on the device (``repeats``
        interleaved calls after a warm-up, each synchronised, median: :mod:`convlib.core.timing`),
        pick the fastest and remember it in the tuning cache (:mod:`convlib.dispatch.tuning`),
        keyed by the device's stable identity: later ``algo="auto"`` calls on this problem and
        device, in this process and later ones, use the measured winner.
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
    3. On the CPU, depthwise layers and one-channel filters (``groups == C``, any channel
       multiplier) up to 5x5 go to ``depthwise``, which streams each input plane once per output
       channel it feeds (larger filters go on to the rules below).
    4. Thin GEMMs (reduction ``C/groups * R * S < 32`` or fewer than 16 output channels per
       group, e.g. the seed thesis' C=K=4 images) go to ``direct``: they are bound by memory
       traffic and direct convolution reads the image once and writes the output once.
    5. On the CPU, 3x3 stride-1 layers with at least 32 input and output channels per group and at
       least 256 output pixels go to Winograd F(4x4,3x3), which measured 1.3-2x faster than the
       best GEMM-based algorithm on ResNet-50's 3x3 layers. On SYCL devices the same layers go to
       F(4x4,3x3) from 28x28 outputs up and to F(2x2,3x3) below.
    6. On the CPU, layers other than pointwise ones (1x1, stride 1, unpadded: ``blis``, whose
       packing is then a plain copy) with at most 256 output channels per group, a reduction
       ``C/groups * R * S <= 512`` and at least 4096 output pixels in the batch go to ``direct``
       (ResNet's stem; below 4096 pixels, e.g. 32 images of 8x8, ``blis`` won).
    7. Otherwise the GEMM-based algorithm that measured fastest on the backend: ``blis`` on the
       CPU, ``im2col`` on SYCL devices, ``blis`` (implicit GEMM) on CUDA GPUs, where ``direct`` is
       kept for depthwise layers and for ``C/groups <= 16`` with ``K/groups <= 32``.
    """
    problem = build_problem(x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)
    target = resolve_device(device, x, w, bias)
    if measure:
        return choose_by_measuring("conv2d", problem, target, repeats=repeats)
    return choose("conv2d", problem, target)


def algorithms(device="cpu", op="conv2d") -> list[str]:
    """The algorithms offered on ``device`` for the operation ``op`` (see :func:`conv2d` for each one).

    Parameters
    ----------
    device : str or dpctl.SyclDevice or dpctl.SyclQueue, default "cpu"
        As the ``device=`` of :func:`conv2d` (None means ``"cpu"``).
    op : {"conv2d", "conv2d_backward_data", "conv2d_backward_weight", "conv2d_backward_bias"}
        The operation (``conv_transpose2d`` runs ``conv2d_backward_data``).

    Returns
    -------
    list of str
        Registered algorithm names, ``"auto"`` excluded.
    """
    op = registry.check_operation(op)
    if device is None:
        device = "cpu"
    return registry.algorithm_names(resolve_device(device).name, op)


def devices() -> list[str]:
    """The devices this machine offers, as values for ``device=``.

    Returns
    -------
    list of str
        ``"cpu"`` always; SYCL filter strings (e.g. ``"opencl:cpu:0"``) when the ``sycl`` extra is
        installed and a device is found; ``"cuda:N"`` per NVIDIA GPU when numba-cuda finds one.
    """
    return _devices()


__all__ = ["conv2d", "conv2d_backward_data", "conv2d_backward_weight", "conv2d_backward_bias", "conv_transpose2d",
           "choose_algorithm", "algorithms", "devices", "build_problem", "check_algo"]
