"""convlib in PyTorch: convolution ops that autograd, ``torch.compile`` and ``torch.library``
know, and :class:`Conv2d`, a drop-in :class:`torch.nn.Conv2d` that computes with convlib.

>>> import torch, convlib.torch
>>> layer = convlib.torch.Conv2d(3, 8, 3, padding=1)      # nn.Conv2d's arguments, plus algo=
>>> y = layer(torch.randn(2, 3, 16, 16))                   # forward through convlib
>>> y.sum().backward()                                     # both backward passes through convlib

Four operators are registered with :func:`torch.library.custom_op` under the ``convlib``
namespace (``torch.ops.convlib.*``), each computing with the public function of the same name:

========================================  ===============================================
``convlib::conv2d``                       :func:`convlib.conv2d` (input, weight, bias)
``convlib::conv2d_backward_data``         :func:`convlib.conv2d_backward_data`
``convlib::conv2d_backward_weight``       :func:`convlib.conv2d_backward_weight`
``convlib::conv2d_backward_bias``         :func:`convlib.conv2d_backward_bias`
========================================  ===============================================

Each has a fake (meta) implementation, so shapes propagate under ``torch.compile`` and
``torch.export``, and an autograd formula made of the others: the forward's gradient is the three
backward ops, and the backward ops, being linear in each argument, have gradients that are again
the three convolutions, so gradients of any order go through convlib. Tensors on the CPU are
computed by convlib's numba kernels without a copy; CUDA tensors by its numba-cuda backend.

In eager mode, :func:`conv2d` and :class:`Conv2d` run an ``autograd.Function`` that calls the
ops' bodies directly (a custom op's dispatch costs more Python than a small layer's kernel);
``torch.compile``, ``torch.export``, ``torch.func``'s transforms and ``create_graph`` backwards
run the ops themselves.

This module imports ``torch`` (``import convlib`` never does): import it as ``convlib.torch``.
Inside it, ``torch`` is PyTorch (imports are absolute), never this module.
"""

from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .api import (
    check_algo, conv2d as _convlib_conv2d, conv2d_backward_bias as _convlib_backward_bias,
    conv2d_backward_data as _convlib_backward_data, conv2d_backward_weight as _convlib_backward_weight,
    plan_backward_bias, plan_backward_data, plan_backward_weight, plan_conv2d,
)
from .core.problem import padding_sides
from .dispatch.plan import host_state

__all__ = ["Conv2d", "conv2d"]


# ------------------------------------------------------------------------------------------
# The arguments: what PyTorch accepts, as the ops' fixed schema takes it.
# ------------------------------------------------------------------------------------------
def _pair(name: str, value) -> tuple[int, int]:
    """An int or a pair of ints as a pair; anything else goes through unchanged, for convlib's
    validation (inside the op) to reject with its own message."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 1:  # PyTorch accepts (3,) for 3
        return (value[0], value[0])
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return (value[0], value[1])
    raise TypeError(f"{name}={value!r}: {name} must be an int or a pair of ints")


def _padding(padding, kernel_size, stride, dilation) -> tuple[int, int, int, int]:
    """``padding`` as ``(top, bottom, left, right)``.

    The ops take four ints (their schema is fixed), so the strings are resolved here by
    :func:`convlib.core.problem.padding_sides`, as :func:`convlib.conv2d` resolves them
    (``"same"`` puts an odd remainder at the bottom and right, as PyTorch does). Values are
    checked by convlib.
    """
    if isinstance(padding, str):
        return padding_sides(padding, kernel_size[0], kernel_size[1], tuple(stride), tuple(dilation))
    if isinstance(padding, (tuple, list)) and len(padding) == 4:
        return tuple(padding)
    h, w = _pair("padding", padding)
    return (h, h, w, w)


def _output_size(size, pad_before, pad_after, kernel, stride, dilation):
    """One spatial size of conv2d's output (SymInts welcome: fake tensors call this)."""
    return (size + pad_before + pad_after - dilation * (kernel - 1) - 1) // stride + 1


def _geometry(stride, padding, dilation, groups):
    """The keyword arguments of convlib's functions, from the ops' list arguments."""
    return dict(stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation), groups=groups)


def _host(tensor: Optional[Tensor]):
    """A CPU tensor as a numpy view of its memory (no copy; convlib never writes to its inputs);
    other tensors (CUDA) detached, which shares their memory: a tensor that requires grad refuses
    ``__cuda_array_interface__``, through which convlib's CUDA backend reads it. Done here rather
    than by convlib's array reading, which must first find out what kind of array it was given."""
    if tensor is None:
        return None
    if tensor.is_cpu:
        return tensor.detach().numpy()
    return tensor.detach()


def _tensor(result) -> Tensor:
    """convlib's result as a tensor: a numpy result (from CPU tensors) shares its memory."""
    return torch.from_numpy(result) if isinstance(result, np.ndarray) else result


# ------------------------------------------------------------------------------------------
# The plans of a layer's calls. A training step calls each layer's forward and backward passes
# with the same shapes again and again, and the interpreter's caches are cold by then (PyTorch's
# work between two calls evicts them): there the public functions' path (reading the arrays,
# the call signature, the plan's lookup and run) took ~30 us a call, 3-4x its time in a loop.
# For contiguous float32/float64 CPU tensors and int arguments (all that this module's own
# arguments are, once PyTorch's forms are resolved) the key below says everything a plan is
# built from, and the plan runs straight on the tensors' memory.
# ------------------------------------------------------------------------------------------
_INT = {int}


def _plan_key(operation: str, tensors, arguments: tuple, algo: str):
    """The key of :data:`convlib.dispatch.plan.PLANS` for this call, or None when it takes the
    public function's path (a tensor not on the CPU, not contiguous or of another dtype; an
    argument that is not an int, which convlib's validation must see). ``arguments``: every
    size and geometry value of the call, flat."""
    described = []
    for t in tensors:
        if t is None:
            described.append(None)
            continue
        dtype = t.dtype
        if not ((dtype is torch.float32 or dtype is torch.float64) and t.is_cpu and t.is_contiguous()):
            return None
        described.append((t.shape, dtype))
    if not _INT.issuperset(map(type, arguments)) or type(algo) is not str:
        return None
    return ("convlib.torch", operation, tuple(described), arguments, algo, *host_state())


#: Per operation: convlib's public function and the function of the plan it runs.
_OPERATIONS = {
    "conv2d": (_convlib_conv2d, plan_conv2d),
    "conv2d_backward_data": (_convlib_backward_data, plan_backward_data),
    "conv2d_backward_weight": (_convlib_backward_weight, plan_backward_weight),
    "conv2d_backward_bias": (_convlib_backward_bias, plan_backward_bias),
}


def _computed(operation: str, tensors, shape, geometry, algo: str) -> Tensor:
    """``operation`` on ``tensors`` (its arrays, None for a missing bias), ``shape`` (a backward
    pass's shape argument, else None) and the forward's ``geometry`` (``(stride, padding,
    dilation, groups)``; None for the bias gradient): by its plan straight on the tensors'
    memory where :func:`_plan_key` gives a key, else by the public function."""
    public, plan_of = _OPERATIONS[operation]
    sizes = () if shape is None else (tuple(shape),)
    keywords, flat = {}, ()
    if geometry is not None:
        stride, padding, dilation, groups = geometry
        keywords = _geometry(stride, padding, dilation, groups)
        flat = (*stride, *padding, *dilation, groups)
    key = _plan_key(operation, tensors, (*sizes[0], *flat) if sizes else flat, algo)
    if key is None:
        return _tensor(public(*map(_host, tensors), *sizes, **keywords, algo=algo))
    arrays = [None if t is None else t.detach().numpy() for t in tensors]
    plan = plan_of(*arrays, *sizes, algo=algo, device=None, key=key, **keywords)
    return torch.from_numpy(plan.execute(*arrays))


# ------------------------------------------------------------------------------------------
# The operators.
# ------------------------------------------------------------------------------------------
# The computations, as plain functions: the ops' bodies, and what the eager path calls directly.
def _forward_values(x, w, bias, stride, padding, dilation, groups, algo) -> Tensor:
    return _computed("conv2d", (x, w, bias), None, (stride, padding, dilation, groups), algo)


def _backward_data_values(dy, w, x_shape, stride, padding, dilation, groups, algo) -> Tensor:
    return _computed("conv2d_backward_data", (dy, w), x_shape, (stride, padding, dilation, groups), algo)


def _backward_weight_values(x, dy, w_shape, stride, padding, dilation, groups, algo) -> Tensor:
    return _computed("conv2d_backward_weight", (x, dy), w_shape, (stride, padding, dilation, groups), algo)


def _backward_bias_values(dy, algo) -> Tensor:
    return _computed("conv2d_backward_bias", (dy,), None, None, algo)


@torch.library.custom_op("convlib::conv2d", mutates_args=())
def _conv2d_op(x: Tensor, w: Tensor, bias: Optional[Tensor], stride: Sequence[int], padding: Sequence[int],
               dilation: Sequence[int], groups: int, algo: str, backward_algo: str) -> Tensor:
    """:func:`convlib.conv2d`; ``padding`` is ``(top, bottom, left, right)``, ``backward_algo``
    the algorithm of its backward passes."""
    return _forward_values(x, w, bias, stride, padding, dilation, groups, algo)


@_conv2d_op.register_fake
def _(x, w, bias, stride, padding, dilation, groups, algo, backward_algo):
    N, _, H, W = x.shape
    K, _, R, S = w.shape
    P = _output_size(H, padding[0], padding[1], R, stride[0], dilation[0])
    Q = _output_size(W, padding[2], padding[3], S, stride[1], dilation[1])
    return x.new_empty((N, K, P, Q))


@torch.library.custom_op("convlib::conv2d_backward_data", mutates_args=())
def _backward_data_op(dy: Tensor, w: Tensor, x_shape: Sequence[int], stride: Sequence[int],
                      padding: Sequence[int], dilation: Sequence[int], groups: int, algo: str) -> Tensor:
    """:func:`convlib.conv2d_backward_data`."""
    return _backward_data_values(dy, w, x_shape, stride, padding, dilation, groups, algo)


@_backward_data_op.register_fake
def _(dy, w, x_shape, stride, padding, dilation, groups, algo):
    return dy.new_empty(x_shape)


@torch.library.custom_op("convlib::conv2d_backward_weight", mutates_args=())
def _backward_weight_op(x: Tensor, dy: Tensor, w_shape: Sequence[int], stride: Sequence[int],
                        padding: Sequence[int], dilation: Sequence[int], groups: int, algo: str) -> Tensor:
    """:func:`convlib.conv2d_backward_weight`."""
    return _backward_weight_values(x, dy, w_shape, stride, padding, dilation, groups, algo)


@_backward_weight_op.register_fake
def _(x, dy, w_shape, stride, padding, dilation, groups, algo):
    return x.new_empty(w_shape)


@torch.library.custom_op("convlib::conv2d_backward_bias", mutates_args=())
def _backward_bias_op(dy: Tensor, algo: str) -> Tensor:
    """:func:`convlib.conv2d_backward_bias`."""
    return _backward_bias_values(dy, algo)


@_backward_bias_op.register_fake
def _(dy, algo):
    return dy.new_empty((dy.shape[1],))


# ------------------------------------------------------------------------------------------
# Their gradients. Every formula calls only these ops (and torch's expand), as
# torch.library requires. The second-order formulas use algo="auto": an algorithm chosen for one
# operation need not exist for another (conv2d_backward_bias has only "direct").
# ------------------------------------------------------------------------------------------
def _conv2d_setup(ctx, inputs, output):
    x, w, bias, stride, padding, dilation, groups, algo, backward_algo = inputs
    ctx.save_for_backward(x, w)
    ctx.geometry = (stride, padding, dilation, groups)
    ctx.backward_algo = backward_algo


def _conv2d_gradients(ctx, dy, backward_data, backward_weight, backward_bias):
    """The forward's gradients by the three given functions (the ops, or their plain bodies)."""
    x, w = ctx.saved_tensors
    dx = dw = db = None
    if ctx.needs_input_grad[0]:
        dx = backward_data(dy, w, x.shape, *ctx.geometry, ctx.backward_algo)
    if ctx.needs_input_grad[1]:
        dw = backward_weight(x, dy, w.shape, *ctx.geometry, ctx.backward_algo)
    if ctx.needs_input_grad[2]:
        db = backward_bias(dy, "auto")
    return dx, dw, db, None, None, None, None, None, None


def _conv2d_backward(ctx, dy):
    return _conv2d_gradients(ctx, dy, _backward_data_op, _backward_weight_op, _backward_bias_op)


_conv2d_op.register_autograd(_conv2d_backward, setup_context=_conv2d_setup)


def _backward_setup(ctx, inputs, output):
    # Both backward ops take (tensor, tensor, shape, stride, padding, dilation, groups, algo).
    first, second, _, stride, padding, dilation, groups, _ = inputs
    ctx.save_for_backward(first, second)
    ctx.geometry = (stride, padding, dilation, groups)


def _backward_data_backward(ctx, g):
    # dx is linear in dy and in w: <dx(dy, w), g> = <dy, conv2d(g, w)> = <w, dw(g, dy)>.
    dy, w = ctx.saved_tensors
    d_dy = d_w = None
    if ctx.needs_input_grad[0]:
        d_dy = _conv2d_op(g, w, None, *ctx.geometry, "auto", "auto")
    if ctx.needs_input_grad[1]:
        d_w = _backward_weight_op(g, dy, w.shape, *ctx.geometry, "auto")
    return d_dy, d_w, None, None, None, None, None, None


_backward_data_op.register_autograd(_backward_data_backward, setup_context=_backward_setup)


def _backward_weight_backward(ctx, g):
    # dw is linear in x and in dy: <dw(x, dy), g> = <dy, conv2d(x, g)> = <x, dx(dy, g)>.
    x, dy = ctx.saved_tensors
    d_x = d_dy = None
    if ctx.needs_input_grad[0]:
        d_x = _backward_data_op(dy, g, x.shape, *ctx.geometry, "auto")
    if ctx.needs_input_grad[1]:
        d_dy = _conv2d_op(x, g, None, *ctx.geometry, "auto", "auto")
    return d_x, d_dy, None, None, None, None, None, None


_backward_weight_op.register_autograd(_backward_weight_backward, setup_context=_backward_setup)


def _backward_bias_setup(ctx, inputs, output):
    ctx.dy_shape = inputs[0].shape


def _backward_bias_backward(ctx, g):
    return g[None, :, None, None].expand(ctx.dy_shape), None


_backward_bias_op.register_autograd(_backward_bias_backward, setup_context=_backward_bias_setup)


# ------------------------------------------------------------------------------------------
# The eager path. torch.library's dispatch of a custom op costs more Python than the convolution
# of a small layer: on the development machine (PyTorch 2.13), the forward op with autograd took
# 156 us where convlib.conv2d took 43 us and an autograd.Function around it 63 us (a 16-channel
# 4x4 depthwise layer). So outside torch.compile, conv2d runs this Function, which calls the
# ops' plain bodies; the ops stay what torch.compile, torch.export and opcheck see. A backward
# that records a graph of its own (create_graph=True: second derivatives) calls the ops, whose
# autograd formulas differentiate it again.
# ------------------------------------------------------------------------------------------
class _EagerConv2d(torch.autograd.Function):
    """``convlib::conv2d`` and its gradients without the custom ops' dispatch (see above)."""

    @staticmethod
    def forward(ctx, *inputs):
        # forward(ctx, ...) rather than a setup_context: with one, apply() binds the arguments
        # to forward's signature by inspect on every call (~40 us).
        _conv2d_setup(ctx, inputs, None)
        return _forward_values(*inputs[:-1])

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():  # create_graph=True: the ops, which have gradients of their own
            return _conv2d_backward(ctx, dy)
        return _conv2d_gradients(ctx, dy, _backward_data_values, _backward_weight_values, _backward_bias_values)


# torch.func's transforms (vmap, ...) take the op (an old-style autograd.Function is refused
# there); the check is private to PyTorch, so without it every call takes the op.
_functorch_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None)


def _conv2d_call(*arguments):
    """``convlib::conv2d`` under torch.compile (and export) and torch.func's transforms,
    :class:`_EagerConv2d` otherwise."""
    if torch.compiler.is_compiling() or _functorch_transforms_active is None or _functorch_transforms_active():
        return _conv2d_op(*arguments)
    return _EagerConv2d.apply(*arguments)


# ------------------------------------------------------------------------------------------
# The public face.
# ------------------------------------------------------------------------------------------
def conv2d(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride=1, padding=0, dilation=1,
           groups: int = 1, *, algo: str = "auto", backward_algo: str = "auto") -> Tensor:
    """:func:`torch.nn.functional.conv2d`, computed by convlib, with gradients (of any order).

    Parameters
    ----------
    input : Tensor, shape (N, C, H, W) or (C, H, W)
        float32 or float64, on the CPU or a CUDA GPU (float16 and bfloat16 on a CUDA GPU only).
        A 3-D input is one image, as in PyTorch.
    weight : Tensor, shape (K, C // groups, R, S)
    bias : Tensor, shape (K,), optional
    stride, padding, dilation, groups
        As in :func:`torch.nn.functional.conv2d`; ``padding`` may also be ``(top, bottom, left,
        right)``, as in :func:`convlib.conv2d`.
    algo : str, default "auto"
        The forward pass's algorithm, as :func:`convlib.conv2d`'s ``algo``.
    backward_algo : str, default "auto"
        The algorithm of the data and weight gradients (:func:`convlib.algorithms` with
        ``op="conv2d_backward_data"`` or ``"conv2d_backward_weight"`` lists them). The bias
        gradient and gradients of higher order use ``"auto"``.

    Returns
    -------
    Tensor, shape (N, K, P, Q) or (K, P, Q)
        On the input's device, of its dtype.

    Raises
    ------
    TypeError, ValueError, NotImplementedError
        As :func:`convlib.conv2d` (float16 and bfloat16 off CUDA included).
    """
    check_algo(algo)
    check_algo(backward_algo)
    stride, dilation = _pair("stride", stride), _pair("dilation", dilation)
    padding = _padding(padding, weight.shape[2:], stride, dilation)
    if input.dim() == 3:  # one image (C, H, W), which torch.nn.functional.conv2d accepts too
        return _conv2d_call(input[None], weight, bias, stride, padding, dilation, groups, algo, backward_algo)[0]
    return _conv2d_call(input, weight, bias, stride, padding, dilation, groups, algo, backward_algo)


class Conv2d(torch.nn.Conv2d):
    """:class:`torch.nn.Conv2d` computed by convlib: the same constructor, parameters,
    initialisation and ``state_dict``, so it loads and saves the checkpoints of ``nn.Conv2d``.

    Parameters
    ----------
    in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode,
    device, dtype
        As :class:`torch.nn.Conv2d`. A ``padding_mode`` other than ``"zeros"`` pads with
        :func:`torch.nn.functional.pad` first, as ``nn.Conv2d`` does.
    algo : str, default "auto"
        The forward pass's algorithm (:func:`convlib.conv2d`'s ``algo``).
    backward_algo : str, default "auto"
        The algorithm of the input and weight gradients (see :func:`conv2d`).

    Notes
    -----
    Only the arithmetic changes: parameters are created and initialised by ``nn.Conv2d`` itself
    (the same random draws, so the same seed gives the same weights), and the convolution is
    :func:`conv2d` of this module. float32 and float64 (float16 and bfloat16 on CUDA).

    Examples
    --------
    >>> import torch, convlib.torch
    >>> _ = torch.manual_seed(0); a = torch.nn.Conv2d(3, 4, 3)
    >>> _ = torch.manual_seed(0); b = convlib.torch.Conv2d(3, 4, 3)
    >>> bool(torch.equal(a.weight, b.weight))
    True
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device=None, dtype=None, *,
                 algo: str = "auto", backward_algo: str = "auto"):
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding, dilation=dilation,
                         groups=groups, bias=bias, padding_mode=padding_mode, device=device, dtype=dtype)
        self.algo = check_algo(algo)
        self.backward_algo = check_algo(backward_algo)

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        if self.padding_mode != "zeros":
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            padding = 0
        else:
            padding = self.padding
        return conv2d(input, weight, bias, self.stride, padding, self.dilation, self.groups,
                      algo=self.algo, backward_algo=self.backward_algo)

    def extra_repr(self) -> str:
        s = super().extra_repr()
        if self.algo != "auto":
            s += f", algo={self.algo!r}"
        if self.backward_algo != "auto":
            s += f", backward_algo={self.backward_algo!r}"
        return s
