"""convlib in JAX: :func:`conv2d`, differentiable (reverse mode, any order) and usable under
``jax.jit`` and ``jax.vmap``, computed by convlib's CPU kernels.

>>> import jax, jax.numpy as jnp, convlib.jax
>>> x, w = jnp.ones((2, 3, 8, 8)), jnp.ones((4, 3, 3, 3))
>>> convlib.jax.conv2d(x, w, padding=1).shape
(2, 4, 8, 8)
>>> jax.grad(lambda w: convlib.jax.conv2d(x, w, padding=1).sum())(w).shape
(4, 3, 3, 3)

How it works: the convolution and its two backward passes are host functions called through
:func:`jax.pure_callback`, so XLA sees an opaque call with a known result shape (``jit`` works,
and the arrays reach convlib as numpy arrays on the host). Each of the three is a
:func:`jax.custom_vjp` whose gradient is made of the other two (all three are linear in each
argument), so ``jax.grad`` of ``jax.grad`` goes through convlib too. The geometry (stride,
padding, dilation, groups) and the algorithms are ``nondiff_argnums``: static, hashable values.
Under ``vmap`` the callbacks get the vmapped axes in front (``vmap_method="expand_dims"``): images
vmapped over one set of filters join the batch axis ``N`` and run as one call; otherwise each
element runs in turn.

Limits: reverse mode only (``jax.jvp``/``jax.jacfwd`` cannot go through a ``custom_vjp``); the
computation runs on the host CPU whatever JAX's default device (a GPU array is copied to the host
and back); the bias is added by JAX (``y + bias[:, None, None]``), and so is its gradient.

This module imports ``jax`` (``import convlib`` never does): import it as ``convlib.jax``.
JAX needs numpy >= 2, which the ``sycl`` extra cannot load: install the ``jax`` extra into an
environment without it.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np

from .api import (
    check_algo, conv2d as _convlib_conv2d, conv2d_backward_data as _convlib_backward_data,
    conv2d_backward_weight as _convlib_backward_weight,
)
from .core.problem import array_dtype, make_problem

__all__ = ["conv2d"]


def conv2d(x, w, bias=None, *, stride=1, padding=0, dilation=1, groups=1, algo="auto", backward_algo="auto"):
    """Batched 2-D convolution (NCHW) of JAX arrays, computed by convlib; :func:`convlib.conv2d`'s
    semantics, differentiable in reverse mode.

    Parameters
    ----------
    x : jax.Array, shape (N, C, H, W)
        float32, or float64 with ``jax_enable_x64``.
    w : jax.Array, shape (K, C // groups, R, S)
    bias : jax.Array, shape (K,), optional
    stride, padding, dilation, groups
        As in :func:`convlib.conv2d` (``padding`` also ``(top, bottom, left, right)``, ``"valid"``
        or ``"same"``). Static: Python values, not traced arrays.
    algo : str, default "auto"
        The forward pass's algorithm, as :func:`convlib.conv2d`'s ``algo``.
    backward_algo : str, default "auto"
        The algorithm of the gradients with respect to ``x`` and ``w``
        (:func:`convlib.algorithms` with ``op="conv2d_backward_data"`` lists them); gradients of
        higher order use ``"auto"``.

    Returns
    -------
    jax.Array, shape (N, K, P, Q)
        Of ``x``'s dtype.

    Raises
    ------
    TypeError, ValueError
        Invalid arguments, when the function is called (or traced): the message names the
        argument, its value and what is allowed.
    """
    check_algo(algo)
    check_algo(backward_algo)
    problem = make_problem(
        tuple(x.shape), tuple(w.shape), None if bias is None else tuple(bias.shape), array_dtype("x", x),
        array_dtype("w", w), None if bias is None else array_dtype("bias", bias),
        stride=stride, padding=padding, dilation=dilation, groups=groups)
    y = _conv2d(x, w, problem.stride, problem.padding, problem.dilation, problem.groups, algo, backward_algo)
    if bias is not None:
        y = y + bias[:, None, None]
    return y


# ------------------------------------------------------------------------------------------
# The three passes, each a custom_vjp over a host callback; the gradient of each is the others.
# ------------------------------------------------------------------------------------------
def _output_shape(x_shape, w_shape, stride, padding, dilation, groups):
    return make_problem(x_shape, w_shape, None, np.float32, np.float32, stride=stride, padding=padding,
                        dilation=dilation, groups=groups).y_shape


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6, 7))
def _conv2d(x, w, stride, padding, dilation, groups, algo, backward_algo):
    geometry = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)

    def host(x, w):
        return _convlib_conv2d(x, w, **geometry, algo=algo)

    y_shape = _output_shape(x.shape, w.shape, stride, padding, dilation, groups)
    return _callback(host, y_shape, x.dtype, x, w, images_first=True)


def _conv2d_fwd(x, w, stride, padding, dilation, groups, algo, backward_algo):
    return _conv2d(x, w, stride, padding, dilation, groups, algo, backward_algo), (x, w)


def _conv2d_bwd(stride, padding, dilation, groups, algo, backward_algo, saved, dy):
    x, w = saved
    geometry = (stride, padding, dilation, groups)
    return (_backward_data(dy, w, x.shape, *geometry, backward_algo),
            _backward_weight(x, dy, w.shape, *geometry, backward_algo))


_conv2d.defvjp(_conv2d_fwd, _conv2d_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6, 7))
def _backward_data(dy, w, x_shape, stride, padding, dilation, groups, algo):
    geometry = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)

    def host(dy, w):
        # dy.shape[0], not x_shape[0]: vmapped images arrive joined to the batch axis
        return _convlib_backward_data(dy, w, (dy.shape[0],) + tuple(x_shape[1:]), **geometry, algo=algo)

    return _callback(host, tuple(x_shape), dy.dtype, dy, w, images_first=True)


def _backward_data_fwd(dy, w, x_shape, stride, padding, dilation, groups, algo):
    return _backward_data(dy, w, x_shape, stride, padding, dilation, groups, algo), (dy, w)


def _backward_data_bwd(x_shape, stride, padding, dilation, groups, algo, saved, g):
    # dx is linear in dy and in w: <dx(dy, w), g> = <dy, conv2d(g, w)> = <w, dw(g, dy)>.
    dy, w = saved
    geometry = (stride, padding, dilation, groups)
    return (_conv2d(g, w, *geometry, "auto", "auto"), _backward_weight(g, dy, w.shape, *geometry, "auto"))


_backward_data.defvjp(_backward_data_fwd, _backward_data_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6, 7))
def _backward_weight(x, dy, w_shape, stride, padding, dilation, groups, algo):
    geometry = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)

    def host(x, dy):
        return _convlib_backward_weight(x, dy, tuple(w_shape), **geometry, algo=algo)

    # dw sums over the batch: vmapped images cannot join it
    return _callback(host, tuple(w_shape), x.dtype, x, dy, images_first=False)


def _backward_weight_fwd(x, dy, w_shape, stride, padding, dilation, groups, algo):
    return _backward_weight(x, dy, w_shape, stride, padding, dilation, groups, algo), (x, dy)


def _backward_weight_bwd(w_shape, stride, padding, dilation, groups, algo, saved, g):
    # dw is linear in x and in dy: <dw(x, dy), g> = <dy, conv2d(x, g)> = <x, dx(dy, g)>.
    x, dy = saved
    geometry = (stride, padding, dilation, groups)
    return (_backward_data(dy, g, x.shape, *geometry, "auto"), _conv2d(x, g, *geometry, "auto", "auto"))


_backward_weight.defvjp(_backward_weight_fwd, _backward_weight_bwd)


# ------------------------------------------------------------------------------------------
# The host side.
# ------------------------------------------------------------------------------------------
def _callback(host, shape, dtype, a, b, *, images_first):
    """``host(a, b)`` (two 4-D arrays) through :func:`jax.pure_callback`, for any vmapped axes.

    Parameters
    ----------
    host : callable
        Computes the result of two 4-D numpy arrays; never raises for arrays of the traced
        shapes (arguments are validated when traced, as ``pure_callback`` requires).
    shape, dtype
        The result's, without vmapped axes.
    a, b : jax.Array, 4-D each (when traced)
    images_first : bool
        Whether ``a``'s first axis is a batch of images that ``host`` treats independently, so
        that vmapped axes of ``a`` alone can join it (not so for the weight gradient, a sum).
    """
    def on_host(a, b):
        a, b = np.asarray(a), np.asarray(b)
        vmapped = np.broadcast_shapes(a.shape[:-4], b.shape[:-4])
        if not vmapped:
            return host(a, b)
        if images_first and math.prod(b.shape[:-4]) == 1:
            # one set of filters for every element: one call over N * (vmapped) images
            joined = np.broadcast_to(a, vmapped + a.shape[-4:]).reshape((-1,) + a.shape[-3:])
            y = host(joined, b.reshape(b.shape[-4:]))
            return y.reshape(vmapped + (a.shape[-4],) + y.shape[1:])
        out = np.empty(vmapped + tuple(shape), dtype)
        for index in np.ndindex(vmapped):
            out[index] = host(_element(a, index), _element(b, index))
        return out

    return jax.pure_callback(on_host, jax.ShapeDtypeStruct(shape, dtype), a, b, vmap_method="expand_dims")


def _element(arr, index):
    """The 4-D array of one vmapped element, where ``arr`` has size-1 axes for those it is not
    vmapped over."""
    return arr[tuple(i if n > 1 else 0 for i, n in zip(index, arr.shape))]
