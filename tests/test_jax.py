"""``convlib.jax.conv2d`` against ``jax.lax.conv_general_dilated``: values, gradients
(``jax.test_util.check_grads`` in float64, first and second order), under ``jit`` and ``vmap``.

Skipped when JAX is not installed (the ``jax`` extra; it needs numpy >= 2, so CI runs these in
``.venv-newest``).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import convlib.jax as cj  # noqa: E402

# float64 for the numerical derivatives; the process is this module's alone in what touches JAX.
jax.config.update("jax_enable_x64", True)

#: (stride, padding, dilation, groups): every value of each argument meets every value of the
#: others; padding as an int and as (top, bottom, left, right).
GEOMETRIES = list(itertools.product((1, (2, 1)), (1, (0, 1, 2, 1)), (1, (1, 2)), (1, 2)))


def geometry_id(g):
    return "s{}-p{}-d{}-g{}".format(*g).replace(" ", "")


def arrays(rng, dtype=np.float64, *, groups=1, N=2, C=4, K=6, H=7, W=6, R=3, S=2):
    x = jnp.asarray(rng.standard_normal((N, C, H, W)), dtype)
    w = jnp.asarray(rng.standard_normal((K, C // groups, R, S)), dtype)
    b = jnp.asarray(rng.standard_normal(K), dtype)
    return x, w, b


def functions(stride, padding, dilation, groups):
    """convlib's conv2d and lax's, with a bias, as functions of (x, w, b)."""
    pair = lambda v: (v, v) if isinstance(v, int) else v  # noqa: E731
    pads = ((padding, padding), (padding, padding)) if isinstance(padding, int) else (padding[:2], padding[2:])

    def ours(x, w, b):
        return cj.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)

    def reference(x, w, b):
        y = lax.conv_general_dilated(x, w, pair(stride), pads, rhs_dilation=pair(dilation),
                                     feature_group_count=groups, dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return y + b[:, None, None]

    return ours, reference


@pytest.fixture
def rng():
    return np.random.default_rng(20261121)


def assert_close(got, want, tol=1e-12):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=geometry_id)
def test_values_and_gradients_match_lax(geometry, rng):
    ours, reference = functions(*geometry)
    x, w, b = arrays(rng, groups=geometry[3])
    assert_close(ours(x, w, b), reference(x, w, b))
    assert_close(jax.jit(ours)(x, w, b), reference(x, w, b))

    def loss(f):
        return lambda x, w, b: (f(x, w, b) ** 2).sum()

    grads = jax.jit(jax.grad(loss(ours), argnums=(0, 1, 2)))(x, w, b)
    for got, want in zip(grads, jax.grad(loss(reference), argnums=(0, 1, 2))(x, w, b)):
        assert_close(got, want)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=geometry_id)
def test_check_grads(geometry, rng):
    ours, _ = functions(*geometry)
    check_grads(ours, arrays(rng, groups=geometry[3]), order=1, modes=["rev"])


@pytest.mark.parametrize("geometry", [(1, 1, 1, 1), ((2, 1), (0, 1, 2, 1), (1, 2), 2)], ids=geometry_id)
def test_second_order(geometry, rng):
    """The backward passes are custom_vjps too: grad of grad goes through convlib."""
    ours, reference = functions(*geometry)
    x, w, b = arrays(rng, groups=geometry[3], N=1, H=6, W=5)
    check_grads(ours, (x, w, b), order=2, modes=["rev"])
    # a gradient penalty's gradient, against lax's
    def penalty(f):
        return lambda w: (jax.grad(lambda x: (f(x, w, b) ** 2).sum())(x) ** 2).sum()

    assert_close(jax.jit(jax.grad(penalty(ours)))(w), jax.grad(penalty(reference))(w), tol=1e-10)


@pytest.mark.parametrize("backward_algo", ["direct", "im2col"])
def test_each_backward_algorithm(backward_algo, rng):
    x, w, b = arrays(rng, groups=2)

    def f(x, w, b):
        return cj.conv2d(x, w, b, stride=2, padding=1, dilation=2, groups=2, algo="direct",
                         backward_algo=backward_algo)

    check_grads(f, (x, w, b), order=1, modes=["rev"])


def test_vmap(rng):
    ours, reference = functions((2, 1), (0, 1, 2, 1), (1, 2), 2)
    x, w, b = arrays(rng, groups=2)
    xs, ws, bs = jnp.stack([x, -2 * x, x[::-1]]), jnp.stack([w, 3 * w, -w]), jnp.stack([b, b, -b])
    for in_axes, args in [((0, None, None), (xs, w, b)),  # images only: joined into one call
                          ((None, 0, None), (x, ws, b)),  # filters only: one call per element
                          ((0, 0, 0), (xs, ws, bs))]:
        assert_close(jax.jit(jax.vmap(ours, in_axes))(*args), jax.vmap(reference, in_axes)(*args))
    # nested: two vmapped axes
    xss = jnp.stack([xs, 2 * xs])
    nested = jax.vmap(jax.vmap(ours, (0, None, None)), (0, None, None))
    assert_close(nested(xss, w, b), jax.vmap(jax.vmap(reference, (0, None, None)), (0, None, None))(xss, w, b))

    # per-example gradients: vmap of grad, which vmaps the two backward passes
    def loss(f):
        return lambda x, w, b: (f(x[None], w, b) ** 2).sum()

    per_example = jax.jit(jax.vmap(jax.grad(loss(ours), argnums=(0, 1, 2)), (0, None, None)))(x, w, b)
    expected = jax.vmap(jax.grad(loss(reference), argnums=(0, 1, 2)), (0, None, None))(x, w, b)
    for got, want in zip(per_example, expected):
        assert_close(got, want)


def test_float32_and_string_paddings(rng):
    x, w, b = arrays(rng, np.float32, R=3, S=4)
    for padding, lax_padding in [("same", "SAME"), ("valid", "VALID")]:
        y = cj.conv2d(x, w, padding=padding, dilation=(2, 1))
        y_ref = lax.conv_general_dilated(x, w, (1, 1), lax_padding, rhs_dilation=(2, 1),
                                         dimension_numbers=("NCHW", "OIHW", "NCHW"))
        assert y.dtype == jnp.float32
        assert_close(y, y_ref, tol=1e-5)
    dw = jax.grad(lambda w: cj.conv2d(x, w, padding="same").sum())(w)
    assert dw.dtype == jnp.float32 and dw.shape == w.shape


def test_errors_when_traced(rng):
    x, w, _ = arrays(rng)
    with pytest.raises(ValueError, match="groups=3"):
        jax.jit(lambda x, w: cj.conv2d(x, w, groups=3))(x, w)
    with pytest.raises(ValueError, match="stride"):
        cj.conv2d(x, w, stride=0)
    with pytest.raises(ValueError, match="algo='fast'"):
        cj.conv2d(x, w, algo="fast")
    with pytest.raises(TypeError, match="int32"):
        cj.conv2d(x.astype(jnp.int32), w.astype(jnp.int32))
