"""The convolution problem as a value: every argument checked once, every derived size computed once.

:class:`ConvProblem` is what every backend, algorithm, selector and benchmark receives. It is
frozen and hashable, so it doubles as the cache key for compiled kernels and tuning results.
:func:`make_problem` is the single place where user arguments are validated; nothing downstream
re-checks them.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass, field, fields, replace
from functools import cached_property

import numpy as np

from .options import options
from .precision import COMPUTE_DTYPE, DTYPES, ITEMSIZE, dtype_name

#: The operations a problem can describe, each on the same forward geometry:
#:
#: * ``conv2d``: ``y = conv2d(x, w) (+ bias of K)``, result ``(N, K, P, Q)``;
#: * ``conv2d_backward_data``: ``dx`` from ``dy`` and ``w``, result ``x_shape`` (``+ bias of C``
#:   is ``conv_transpose2d``, the same computation under its other name);
#: * ``conv2d_backward_weight``: ``dw`` from ``x`` and ``dy``, result ``w_shape``;
#: * ``conv2d_backward_bias``: ``db = dy.sum((0, 2, 3))``, result ``(K,)``; its problem is ``dy``
#:   seen as the input of a 1x1 convolution (``C = K``, ``H = P``, ``W = Q``).
OPERATIONS = ("conv2d", "conv2d_backward_data", "conv2d_backward_weight", "conv2d_backward_bias")


@dataclass(frozen=True)
class ConvProblem:
    """One batched 2-D convolution (cross-correlation), NCHW in, NCHW out.

    Parameters
    ----------
    N, C, H, W : int
        Batch, input channels, input height and width of ``x``.
    K, R, S : int
        Output channels, filter height and filter width of ``w`` (shape ``(K, C // groups, R, S)``).
    stride : tuple of int
        ``(stride_h, stride_w)``, each >= 1.
    padding : tuple of int
        ``(top, bottom, left, right)`` zero padding, each >= 0. Symmetric for integer padding;
        ``"same"`` with an even effective filter pads one more at the bottom/right, as PyTorch does.
    dilation : tuple of int
        ``(dil_h, dil_w)``, each >= 1.
    groups : int
        Number of groups; divides both ``C`` and ``K``.
    dtype : str
        ``"float32"``, ``"float64"``, ``"float16"`` or ``"bfloat16"``, shared by x, w, bias and
        the result. The 16-bit ones are computed in float32 (:attr:`compute_dtype`).
    has_bias : bool
        Whether a bias is added to the result: shape ``(K,)`` for ``conv2d``, ``(C,)`` for
        ``conv2d_backward_data`` (``conv_transpose2d``).
    operation : str
        What is computed on this geometry, one of :data:`OPERATIONS`; the arrays it reads and
        the shape of its result follow from it (:attr:`output_shape`).

    Notes
    -----
    Derived sizes (``P``, ``Q``, the GEMM sizes, FLOPs, bytes) are properties, so the
    dataclass stays a plain value: two equal problems hash equal whatever was asked of them.
    The ones a call reads many times are cached on the instance (``functools.cached_property``:
    not fields, so neither compared nor hashed): a call's plan reads ``P`` a score of times, and
    a small layer's convolution takes a few microseconds.
    The GEMM view is per group: ``M = K / groups`` rows of filters, ``Ngemm = N * P * Q`` output
    pixels, ``Kgemm = C / groups * R * S`` reduction length.
    """

    N: int
    C: int
    H: int
    W: int
    K: int
    R: int
    S: int
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    dtype: str = "float32"
    has_bias: bool = False
    operation: str = "conv2d"
    _checked: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self):
        # A problem built by hand (tests, benchmarks) gets the same checks as one built from
        # arrays; make_problem has already done them and says so through _checked.
        if not self._checked:
            _check_sizes(self)

    def __hash__(self) -> int:
        # The dataclass' own hash builds the tuple of fields on every call; problems key the
        # caches of every layer (plans, blockings, layouts), several lookups per call.
        return self._hash

    @cached_property
    def _hash(self) -> int:
        return hash(tuple(getattr(self, f.name) for f in fields(self) if f.compare))

    # -- output size -----------------------------------------------------------------------
    @cached_property
    def P(self) -> int:
        """Output height."""
        top, bottom = self.padding[0], self.padding[1]
        return (self.H + top + bottom - self.dilation[0] * (self.R - 1) - 1) // self.stride[0] + 1

    @cached_property
    def Q(self) -> int:
        """Output width."""
        left, right = self.padding[2], self.padding[3]
        return (self.W + left + right - self.dilation[1] * (self.S - 1) - 1) // self.stride[1] + 1

    @cached_property
    def x_shape(self) -> tuple[int, int, int, int]:
        return (self.N, self.C, self.H, self.W)

    @cached_property
    def x_bytes(self) -> int:
        """Bytes of the forward input ``x``."""
        return math.prod(self.x_shape) * self.itemsize

    @cached_property
    def w_shape(self) -> tuple[int, int, int, int]:
        return (self.K, self.C // self.groups, self.R, self.S)

    @cached_property
    def y_shape(self) -> tuple[int, int, int, int]:
        return (self.N, self.K, self.P, self.Q)

    @cached_property
    def output_shape(self) -> tuple[int, ...]:
        """The shape of the operation's result: ``y``, ``dx``, ``dw`` or ``db``."""
        return {
            "conv2d": self.y_shape,
            "conv2d_backward_data": self.x_shape,
            "conv2d_backward_weight": self.w_shape,
            "conv2d_backward_bias": (self.K,),
        }[self.operation]

    @cached_property
    def input_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shapes of the arrays the operation reads, in the order its ``run`` takes them."""
        return {
            "conv2d": (self.x_shape, self.w_shape),
            "conv2d_backward_data": (self.y_shape, self.w_shape),
            "conv2d_backward_weight": (self.x_shape, self.y_shape),
            "conv2d_backward_bias": (self.x_shape,),
        }[self.operation]

    @property
    def bias_shape(self) -> tuple[int]:
        """The shape of the bias the operation adds (when ``has_bias``): its result's channels."""
        return (self.C,) if self.operation == "conv2d_backward_data" else (self.K,)

    @cached_property
    def output_bytes(self) -> int:
        """Bytes of the operation's result."""
        return math.prod(self.output_shape) * self.itemsize

    @property
    def forward(self) -> "ConvProblem":
        """The forward convolution of the same geometry (no bias)."""
        return replace(self, operation="conv2d", has_bias=False)

    @property
    def im2col_image_bytes(self) -> int:
        """Bytes of one image's column matrix (``C*R*S`` rows by ``P*Q`` columns)."""
        return self.C * self.R * self.S * self.P * self.Q * self.itemsize

    @property
    def columns_are_the_image(self) -> bool:
        """1x1 filters at stride 1 without padding: each image's column matrix (``C`` rows of
        ``P*Q = H*W`` pixels) is the image itself, so im2col multiplies the image where it lies
        (as Caffe's ``is_1x1`` does) and blis packs its panels by a plain copy."""
        return (self.R, self.S) == (1, 1) and self.stride == (1, 1) and not any(self.padding)

    @property
    def pad_top(self) -> int:
        return self.padding[0]

    @property
    def pad_left(self) -> int:
        return self.padding[2]

    @property
    def C_per_group(self) -> int:
        return self.C // self.groups

    @property
    def K_per_group(self) -> int:
        return self.K // self.groups

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def compute_dtype(self) -> str:
        """The dtype the arithmetic runs in: float32 for float16 and bfloat16, else :attr:`dtype`."""
        return COMPUTE_DTYPE[self.dtype]

    def widened(self) -> "ConvProblem":
        """This problem in :attr:`compute_dtype`: what the kernels solve for a float16 or
        bfloat16 problem (itself for float32 and float64)."""
        return self if self.compute_dtype == self.dtype else replace(self, dtype=self.compute_dtype)

    # -- GEMM view (per group) -------------------------------------------------------------
    @property
    def gemm_m(self) -> int:
        """Rows of the filter matrix: output channels per group."""
        return self.K_per_group

    @cached_property
    def gemm_n(self) -> int:
        """Columns of the image matrix: output pixels of the whole batch."""
        return self.N * self.P * self.Q

    @cached_property
    def gemm_k(self) -> int:
        """Reduction length: input channels per group times filter taps."""
        return self.C_per_group * self.R * self.S

    # -- cost ------------------------------------------------------------------------------
    @cached_property
    def flops(self) -> int:
        """Multiply-adds counted as two FLOPs (bias not counted); the same for both backward
        passes, which do the forward's multiplications in another order. The bias gradient:
        one addition per element of ``dy``."""
        if self.operation == "conv2d_backward_bias":
            return self.N * self.C * self.H * self.W
        return 2 * self.groups * self.gemm_m * self.gemm_n * self.gemm_k

    @cached_property
    def bytes_moved(self) -> int:
        """Compulsory memory traffic: read the operation's inputs (and bias) once, write its
        result once."""
        elems = sum(math.prod(shape) for shape in self.input_shapes + (self.output_shape,))
        if self.has_bias:
            elems += self.bias_shape[0]
        return elems * self.itemsize

    @property
    def is_winograd_shape(self) -> bool:
        """3x3 filter, stride 1, dilation 1: the shapes Winograd F(m x m, 3x3) serves."""
        return (self.R, self.S) == (3, 3) and self.stride == (1, 1) and self.dilation == (1, 1)

    def im2col_batch_chunk(self, cap_bytes: int | None = None) -> int:
        """Images per im2col chunk so that one chunk's column matrix fits in ``cap_bytes``.

        ``cap_bytes`` defaults to ``convlib.options.workspace_cap`` (256 MiB). Always at
        least 1: a single image whose column matrix exceeds the cap is still served.
        """
        if cap_bytes is None:
            cap_bytes = options.workspace_cap
        per_image = self.im2col_image_bytes
        if per_image == 0 or self.N == 0:
            return max(self.N, 1)
        return max(1, min(self.N, cap_bytes // per_image))

    def describe(self) -> str:
        """A one-line human description, e.g. for benchmark tables."""
        if self.operation == "conv2d_backward_bias":
            return f"{self.operation} dy=({self.N}, {self.C}, {self.H}, {self.W}) {self.dtype}"
        s = "" if self.operation == "conv2d" else f"{self.operation} "
        s += f"N={self.N} C={self.C} H={self.H} W={self.W} K={self.K} {self.R}x{self.S}"
        if self.stride != (1, 1):
            s += f" stride={self.stride[0]}x{self.stride[1]}"
        if any(self.padding):
            s += f" pad={','.join(map(str, self.padding))}"
        if self.dilation != (1, 1):
            s += f" dil={self.dilation[0]}x{self.dilation[1]}"
        if self.groups != 1:
            s += f" groups={self.groups}"
        return s + f" {self.dtype}"


# ------------------------------------------------------------------------------------------
# Validation: the one place user arguments are checked.
# ------------------------------------------------------------------------------------------
def _int_pair(name: str, value, minimum: int) -> tuple[int, int]:
    allowed = f"an int >= {minimum} or a pair of ints >= {minimum}"
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}={value!r} is a bool; {name} must be {allowed}")
    if isinstance(value, numbers.Integral):
        pair = (int(value), int(value))
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        if not all(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in value):
            raise TypeError(f"{name}={value!r}: {name} must be {allowed}")
        pair = (int(value[0]), int(value[1]))
    else:
        raise TypeError(f"{name}={value!r}: {name} must be {allowed}")
    if min(pair) < minimum:
        raise ValueError(f"{name}={value!r}: {name} must be {allowed}")
    return pair


def padding_sides(value, R: int, S: int, stride, dilation) -> tuple[int, int, int, int]:
    """``padding`` (an int, a pair, four ints, ``"valid"`` or ``"same"``) as ``(top, bottom, left,
    right)`` for an ``R x S`` filter; ``stride`` and ``dilation`` are pairs. ``"same"`` puts an
    odd remainder at the bottom and right, as PyTorch does."""
    if isinstance(value, str):
        if value == "valid":
            return (0, 0, 0, 0)
        if value == "same":
            if stride != (1, 1):
                raise ValueError(
                    f"padding='same' needs stride 1, got stride={stride}; "
                    "use an explicit padding with stride > 1"
                )
            th, tw = dilation[0] * (R - 1), dilation[1] * (S - 1)
            return (th // 2, th - th // 2, tw // 2, tw - tw // 2)
        raise ValueError(f"padding={value!r}: allowed strings are 'valid' and 'same'")
    if isinstance(value, (tuple, list)) and len(value) == 4:
        allowed = "an int >= 0, a pair (pad_h, pad_w), four ints (top, bottom, left, right) >= 0, 'valid' or 'same'"
        if not all(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in value):
            raise TypeError(f"padding={value!r}: padding must be {allowed}")
        if min(value) < 0:
            raise ValueError(f"padding={value!r}: padding must be {allowed}")
        return tuple(int(v) for v in value)
    top_left = _int_pair("padding", value, 0)
    return (top_left[0], top_left[0], top_left[1], top_left[1])


def _check_sizes(p: ConvProblem) -> None:
    """Checks that concern the sizes alone (also run for problems built by hand)."""
    for name in ("N", "C", "H", "W", "K", "R", "S", "groups"):
        v = getattr(p, name)
        if not isinstance(v, numbers.Integral) or isinstance(v, bool):
            raise TypeError(f"{name}={v!r} must be an int")
    if min(p.C, p.H, p.W, p.K, p.R, p.S) < 1 or p.N < 0:
        raise ValueError(f"sizes must be positive (N may be 0), got {p.x_shape} x {p.w_shape}")
    if p.groups < 1 or p.C % p.groups or p.K % p.groups:
        raise ValueError(
            f"groups={p.groups} must be >= 1 and divide both the input channels C={p.C} "
            f"and the output channels K={p.K}"
        )
    if p.operation not in OPERATIONS:
        raise ValueError(f"operation={p.operation!r}: allowed are {', '.join(map(repr, OPERATIONS))}")
    if p.dtype not in DTYPES:
        raise TypeError(f"dtype={p.dtype!r}: allowed dtypes are {', '.join(DTYPES)}")
    eff_h = p.dilation[0] * (p.R - 1) + 1
    eff_w = p.dilation[1] * (p.S - 1) + 1
    padded_h = p.H + p.padding[0] + p.padding[1]
    padded_w = p.W + p.padding[2] + p.padding[3]
    if eff_h > padded_h or eff_w > padded_w:
        raise ValueError(
            f"w: the (dilated) filter {eff_h}x{eff_w} is larger than the padded input "
            f"{padded_h}x{padded_w}; it must fit"
        )


def _groups(groups) -> int:
    if isinstance(groups, (bool, np.bool_)) or not isinstance(groups, numbers.Integral):
        raise TypeError(f"groups={groups!r} must be an int >= 1")
    if groups < 1:
        raise ValueError(f"groups={groups} must be an int >= 1")
    return int(groups)


def array_dtype(name: str, arr) -> str:
    """The dtype name of any supported array kind (numpy, ``ml_dtypes.bfloat16`` arrays, PyTorch
    tensors, CUDA and SYCL arrays), or a ``TypeError`` naming ``name``."""
    dt = getattr(arr, "dtype", None)
    if dt is None:
        raise TypeError(f"{name} of type {type(arr).__name__} is not an array; pass a numpy (or device) array")
    dt = dtype_name(dt)
    if dt not in DTYPES:
        raise TypeError(
            f"{name} has dtype {dt}; allowed dtypes are float32 and float64 (every device), float16 and "
            "bfloat16 (CUDA); integer, bool, complex and object arrays are not convolved"
        )
    return dt


def make_problem(
    x_shape,
    w_shape,
    bias_shape,
    x_dtype,
    w_dtype,
    bias_dtype=None,
    *,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
    x_name="x",
    w_name="w",
) -> ConvProblem:
    """Validate convolution arguments and build the :class:`ConvProblem`.

    Parameters
    ----------
    x_shape, w_shape : tuple of int
        Shapes of the input ``(N, C, H, W)`` and the filters ``(K, C // groups, R, S)``.
    bias_shape : tuple of int or None
        Shape of the bias, ``(K,)``, or None.
    x_dtype, w_dtype, bias_dtype : str or numpy.dtype
        Dtypes (already checked by :func:`array_dtype`).
    stride, padding, dilation, groups
        As in :func:`convlib.conv2d`.
    x_name, w_name : str
        What the messages call the input and the filters (``"x_shape"``, ``"w_shape"`` when the
        caller gave shapes rather than arrays).

    Returns
    -------
    ConvProblem

    Raises
    ------
    TypeError, ValueError
        With a message naming the argument, the value and what is allowed.
    """
    if len(x_shape) != 4:
        raise ValueError(f"{x_name} must be 4-D (N, C, H, W); got {len(x_shape)}-D with shape {tuple(x_shape)}")
    if len(w_shape) != 4:
        raise ValueError(f"{w_name} must be 4-D (K, C/groups, R, S); got {len(w_shape)}-D with shape {tuple(w_shape)}")
    groups = _groups(groups)
    N, C, H, W = (int(v) for v in x_shape)
    K, Cg, R, S = (int(v) for v in w_shape)
    if min(C, H, W) < 1:
        raise ValueError(f"{x_name} has shape {tuple(x_shape)}; C, H and W must be >= 1 (only N may be 0)")
    if min(K, Cg, R, S) < 1:
        raise ValueError(f"{w_name} has shape {tuple(w_shape)}; every dimension must be >= 1")
    if C % groups or K % groups:
        raise ValueError(
            f"groups={groups} must divide both the input channels C={C} and the output channels K={K}"
        )
    if Cg * groups != C:
        raise ValueError(
            f"{w_name} has shape {tuple(w_shape)}: its second dimension must be C/groups = {C}/{groups} = "
            f"{C // groups}, got {Cg}"
        )
    x_dtype, w_dtype = dtype_name(x_dtype), dtype_name(w_dtype)
    if x_dtype != w_dtype:
        raise TypeError(f"{x_name} has dtype {x_dtype} but {w_name} has dtype {w_dtype}; they (and bias) must share one dtype")
    if bias_shape is not None:
        bias_dtype = dtype_name(bias_dtype)
        if tuple(bias_shape) != (K,):
            raise ValueError(f"bias has shape {tuple(bias_shape)}; it must be (K,) = ({K},)")
        if bias_dtype != x_dtype:
            raise TypeError(f"bias has dtype {bias_dtype} but {x_name} has dtype {x_dtype}; they must share one dtype")
    stride_p = _int_pair("stride", stride, 1)
    dilation_p = _int_pair("dilation", dilation, 1)
    padding_p = padding_sides(padding, R, S, stride_p, dilation_p)
    problem = ConvProblem(
        N, C, H, W, K, R, S, stride_p, padding_p, dilation_p, groups,
        x_dtype, bias_shape is not None, _checked=True,
    )
    _check_sizes(problem)
    return problem



# ------------------------------------------------------------------------------------------
# The backward passes and the transposed convolution: the forward geometry, checked by
# make_problem, plus what each operation adds.
# ------------------------------------------------------------------------------------------
def shape_argument(name: str, value) -> tuple[int, ...]:
    """A shape given as an argument (``x_shape``, ``w_shape``): a sequence of ints >= 0."""
    allowed = "a tuple of 4 ints >= 0"
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        raise TypeError(f"{name}={value!r}: {name} must be {allowed}")
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in value):
        raise TypeError(f"{name}={value!r}: {name} must be {allowed}")
    if len(value) != 4 or min(value) < 0:
        raise ValueError(f"{name}={tuple(value)!r}: {name} must be {allowed}")
    return tuple(int(v) for v in value)


def _check_dy_is_4d(dy_shape) -> None:
    if len(dy_shape) != 4:
        raise ValueError(f"dy must be 4-D (N, K, P, Q); got {len(dy_shape)}-D with shape {tuple(dy_shape)}")


def _check_dy_shape(dy_shape, problem: ConvProblem, given: str) -> None:
    if tuple(dy_shape) != problem.y_shape:
        raise ValueError(
            f"dy has shape {tuple(dy_shape)}; conv2d's output for {given} has shape {problem.y_shape}, "
            "and dy must have that shape"
        )


def make_backward_data_problem(dy_shape, w_shape, x_shape, dy_dtype, w_dtype, *, stride=1, padding=0,
                               dilation=1, groups=1) -> ConvProblem:
    """The validated problem of ``conv2d_backward_data(dy, w, x_shape, ...)``: the forward
    geometry of ``x_shape`` and ``w``, with ``dy`` of its output's shape."""
    x_shape = shape_argument("x_shape", x_shape)
    _check_dy_is_4d(dy_shape)
    if dtype_name(dy_dtype) != dtype_name(w_dtype):
        raise TypeError(f"dy has dtype {dy_dtype} but w has dtype {w_dtype}; they must share one dtype")
    problem = make_problem(x_shape, w_shape, None, dy_dtype, w_dtype, stride=stride, padding=padding,
                           dilation=dilation, groups=groups, x_name="x_shape")
    _check_dy_shape(dy_shape, problem, f"x_shape={x_shape} and w of shape {tuple(w_shape)}")
    return replace(problem, operation="conv2d_backward_data")


def make_backward_weight_problem(x_shape, dy_shape, w_shape, x_dtype, dy_dtype, *, stride=1, padding=0,
                                 dilation=1, groups=1) -> ConvProblem:
    """The validated problem of ``conv2d_backward_weight(x, dy, w_shape, ...)``."""
    w_shape = shape_argument("w_shape", w_shape)
    _check_dy_is_4d(dy_shape)
    if dtype_name(x_dtype) != dtype_name(dy_dtype):
        raise TypeError(f"x has dtype {x_dtype} but dy has dtype {dy_dtype}; they must share one dtype")
    problem = make_problem(x_shape, w_shape, None, x_dtype, dy_dtype, stride=stride, padding=padding,
                           dilation=dilation, groups=groups, w_name="w_shape")
    _check_dy_shape(dy_shape, problem, f"x of shape {tuple(x_shape)} and w_shape={w_shape}")
    return replace(problem, operation="conv2d_backward_weight")


def make_backward_bias_problem(dy_shape, dy_dtype) -> ConvProblem:
    """The validated problem of ``conv2d_backward_bias(dy)``: ``dy`` as the input of a 1x1
    convolution (``C = K``, ``H = P``, ``W = Q``), its result ``(K,)``."""
    _check_dy_is_4d(dy_shape)
    N, K, P, Q = (int(v) for v in dy_shape)
    if min(K, P, Q) < 1:
        raise ValueError(f"dy has shape {tuple(dy_shape)}; K, P and Q must be >= 1 (only N may be 0)")
    return ConvProblem(N, K, P, Q, K, 1, 1, dtype=dtype_name(dy_dtype), operation="conv2d_backward_bias")


def make_transpose_problem(x_shape, w_shape, bias_shape, x_dtype, w_dtype, bias_dtype=None, *, stride=1,
                           padding=0, output_padding=0, groups=1, dilation=1) -> ConvProblem:
    """The validated problem of ``conv_transpose2d(x, w, bias, ...)`` (PyTorch's semantics):
    the backward data pass of the convolution whose output has ``x``'s shape, with a bias of
    its input channels.

    ``x`` is ``(N, C_in, H_in, W_in)`` and ``w`` ``(C_in, C_out / groups, R, S)``; the result is
    ``(N, C_out, H_out, W_out)`` with ``H_out = (H_in - 1) * stride - (top + bottom) + dilation *
    (R - 1) + output_padding + 1``. In the returned problem ``K = C_in`` and ``C = C_out``; its
    ``P`` exceeds ``H_in`` by ``output_padding // stride`` (rows the caller pads with zeros), which
    is non-zero only where ``output_padding`` is allowed by a dilation larger than the stride.
    """
    if len(x_shape) != 4:
        raise ValueError(f"x must be 4-D (N, C_in, H, W); got {len(x_shape)}-D with shape {tuple(x_shape)}")
    if len(w_shape) != 4:
        raise ValueError(
            f"w must be 4-D (C_in, C_out/groups, R, S); got {len(w_shape)}-D with shape {tuple(w_shape)}")
    groups = _groups(groups)
    N, C_in, H_in, W_in = (int(v) for v in x_shape)
    K, C_out_g, R, S = (int(v) for v in w_shape)
    if min(C_in, H_in, W_in) < 1:
        raise ValueError(f"x has shape {tuple(x_shape)}; C, H and W must be >= 1 (only N may be 0)")
    if min(K, C_out_g, R, S) < 1:
        raise ValueError(f"w has shape {tuple(w_shape)}; every dimension must be >= 1")
    if K != C_in:
        raise ValueError(
            f"w has shape {tuple(w_shape)}: its first dimension must be x's channels C_in = {C_in} "
            "(conv_transpose2d's weight layout is (C_in, C_out/groups, R, S), as PyTorch's)")
    if C_in % groups:
        raise ValueError(f"groups={groups} must divide the input channels C_in={C_in}")
    if dtype_name(x_dtype) != dtype_name(w_dtype):
        raise TypeError(f"x has dtype {x_dtype} but w has dtype {w_dtype}; they (and bias) must share one dtype")
    stride_p = _int_pair("stride", stride, 1)
    dilation_p = _int_pair("dilation", dilation, 1)
    padding_p = padding_sides(padding, R, S, stride_p, dilation_p)
    out_pad = _int_pair("output_padding", output_padding, 0)
    for i, dim in enumerate(("height", "width")):
        if out_pad[i] >= max(stride_p[i], dilation_p[i]):
            raise ValueError(
                f"output_padding={output_padding!r}: in the {dim} it must be smaller than the stride "
                f"({stride_p[i]}) or the dilation ({dilation_p[i]})")
    H_out = (H_in - 1) * stride_p[0] - padding_p[0] - padding_p[1] + dilation_p[0] * (R - 1) + out_pad[0] + 1
    W_out = (W_in - 1) * stride_p[1] - padding_p[2] - padding_p[3] + dilation_p[1] * (S - 1) + out_pad[1] + 1
    if H_out < 1 or W_out < 1:
        raise ValueError(
            f"padding={padding!r} is too large: the output would be {H_out}x{W_out}; conv_transpose2d's output is "
            "(H - 1) * stride - (top + bottom) + dilation * (R - 1) + output_padding + 1 per dimension")
    C_out = C_out_g * groups
    if bias_shape is not None:
        if tuple(bias_shape) != (C_out,):
            raise ValueError(f"bias has shape {tuple(bias_shape)}; it must be (C_out,) = ({C_out},)")
        if dtype_name(bias_dtype) != dtype_name(x_dtype):
            raise TypeError(f"bias has dtype {bias_dtype} but x has dtype {x_dtype}; they must share one dtype")
    problem = make_problem((N, C_out, H_out, W_out), w_shape, None, x_dtype, w_dtype, stride=stride_p,
                           padding=padding_p, dilation=dilation_p, groups=groups, x_name="the output")
    return replace(problem, operation="conv2d_backward_data", has_bias=bias_shape is not None)


# The backward data pass of a stride-1 convolution as a forward one. At stride 1 and dilation 1
# the gradient with respect to the input is a convolution of ``dy`` (N, K, P, Q) with the filters
# rotated by 180 degrees and their channel axes swapped per group (``w'[g*Cg + c, k] =
# w[g*Kg + k, c, ::-1, ::-1]``, shape (C, K/groups, R, S); convlib.cpu.rotation), padded by
# ``R-1-top`` rows above, ``R-1-bottom`` below and likewise columns, which gives exactly ``x``'s
# H x W; conv_transpose2d's bias is that forward's bias. The CPU's winograd, direct and depthwise
# run their data passes so, on their forward kernels.
def runs_as_forward(problem: ConvProblem) -> bool:
    """Whether the data pass of ``problem`` is the forward convolution of :func:`rotated_problem`
    (stride 1, dilation 1, a rotated padding that is not negative)."""
    top, bottom, left, right = problem.padding
    return (problem.stride == (1, 1) and problem.dilation == (1, 1)
            and max(top, bottom) <= problem.R - 1 and max(left, right) <= problem.S - 1)


def sums_wide_rows(problem: ConvProblem, max_row: int) -> bool:
    """Whether direct's weight pass sums ``problem``'s products over *wide rows*
    (:mod:`convlib.cpu.direct_backward`): stride 1, dilation 1, a filter of more than one tap and
    output rows of at most ``max_row`` columns. Here because ``auto``'s rules ask it too."""
    return (problem.stride == (1, 1) and problem.dilation == (1, 1) and problem.R * problem.S > 1
            and problem.Q <= max_row)


@functools.lru_cache(maxsize=256)
def rotated_problem(problem: ConvProblem) -> ConvProblem:
    """The forward convolution whose output is the data pass's ``dx``: input ``dy``, filters
    ``w'`` (see above). Kept per problem: building and validating one takes longer than a small
    layer's kernel."""
    p = problem
    R, S = p.R, p.S
    top, bottom, left, right = p.padding
    return make_problem(
        (p.N, p.K, p.P, p.Q), (p.C, p.K_per_group, R, S), (p.C,) if p.has_bias else None, p.dtype, p.dtype,
        p.dtype if p.has_bias else None, stride=1,
        padding=(R - 1 - top, R - 1 - bottom, S - 1 - left, S - 1 - right), dilation=1, groups=p.groups)
