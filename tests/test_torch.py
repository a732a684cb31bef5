"""``convlib.torch``: the custom ops against autograd's numerical derivatives, their registration
against ``torch.library.opcheck``, and ``convlib.torch.Conv2d`` against ``torch.nn.Conv2d``.

Skipped when PyTorch is not installed (the ``torch`` or ``bench`` extra).
"""

from __future__ import annotations

import itertools
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import convlib  # noqa: E402
import convlib.torch as ct  # noqa: E402
from convlib.cpu.tables import KNOBS  # noqa: E402

OPS = torch.ops.convlib

#: (stride, padding, dilation, groups): every value of each argument meets every value of the
#: others, padding as an int, a pair and (top, bottom, left, right).
GEOMETRIES = list(itertools.product((1, 2), (0, 1, (0, 1, 2, 1)), (1, 2), (1, 2)))


def geometry_id(g):
    stride, padding, dilation, groups = g
    return f"s{stride}-p{padding}-d{dilation}-g{groups}".replace(" ", "")


def tensors(dtype=torch.float64, *, groups=1, bias=True, N=2, C=4, K=4, H=7, W=6, R=3, S=2, seed=0):
    """x, w, bias (or None), all requiring gradients; an odd H and a non-square filter so that
    rows the stride skips and mixed-up axes show."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, C, H, W, dtype=dtype, generator=gen, requires_grad=True)
    w = torch.randn(K, C // groups, R, S, dtype=dtype, generator=gen, requires_grad=True)
    b = torch.randn(K, dtype=dtype, generator=gen, requires_grad=True) if bias else None
    return x, w, b


# ------------------------------------------------------------------------------------------
# The math: numerical derivatives in float64.
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=geometry_id)
def test_gradcheck(geometry):
    stride, padding, dilation, groups = geometry
    bias = GEOMETRIES.index(geometry) % 2 == 0  # half the cases with a bias
    x, w, b = tensors(groups=groups, bias=bias)

    def f(x, w, b):
        return ct.conv2d(x, w, b, stride, padding, dilation, groups)

    assert torch.autograd.gradcheck(f, (x, w, b))


@pytest.mark.parametrize("algo", sorted(set(convlib.algorithms("cpu", op="conv2d_backward_data"))
                                        & set(convlib.algorithms("cpu", op="conv2d_backward_weight"))))
def test_gradcheck_each_backward_algorithm(algo):
    x, w, b = tensors(groups=2)

    def f(x, w, b):
        return ct.conv2d(x, w, b, 2, 1, 2, 2, algo="direct", backward_algo=algo)

    assert torch.autograd.gradcheck(f, (x, w, b))


@pytest.mark.parametrize("geometry", [(1, 1, 1, 1), (2, (0, 1, 2, 1), 2, 2)], ids=geometry_id)
def test_second_order_gradients(geometry):
    """The backward ops have gradients too (double backward, e.g. gradient penalties)."""
    stride, padding, dilation, groups = geometry
    x, w, b = tensors(groups=groups, N=1, H=6, W=5)

    def f(x, w, b):
        return ct.conv2d(x, w, b, stride, padding, dilation, groups)

    assert torch.autograd.gradgradcheck(f, (x, w, b), fast_mode=True)


def test_string_paddings_resolve_as_convlib_does():
    """The ops take (top, bottom, left, right); convlib.torch resolves 'same' and 'valid' itself."""
    x = np.zeros((1, 2, 16, 16), np.float32)
    for R, S, dilation, padding in itertools.product((1, 2, 3, 4), (1, 2, 5), (1, 2, (1, 3)), ("same", "valid")):
        w = np.zeros((2, 2, R, S), np.float32)
        d = ct._pair("dilation", dilation)
        expected = convlib.build_problem(x, w, padding=padding, dilation=dilation).padding
        assert ct._padding(padding, (R, S), (1, 1), d) == expected, (R, S, dilation, padding)
    with pytest.raises(ValueError, match="stride 1"):
        ct.conv2d(torch.zeros(1, 1, 5, 5), torch.zeros(1, 1, 3, 3), stride=2, padding="same")


def test_against_torch_functional_float64():
    """The same numbers as ``F.conv2d`` and its autograd, to float64 rounding."""
    for stride, padding, dilation, groups in GEOMETRIES:
        x, w, b = tensors(groups=groups)
        if isinstance(padding, tuple):  # (top, bottom, left, right): F.conv2d pads symmetrically only
            top, bottom, left, right = padding
            y_ref = torch.nn.functional.conv2d(torch.nn.functional.pad(x, (left, right, top, bottom)), w, b,
                                               stride, 0, dilation, groups)
        else:
            y_ref = torch.nn.functional.conv2d(x, w, b, stride, padding, dilation, groups)
        y = ct.conv2d(x, w, b, stride, padding, dilation, groups)
        torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
        dy = torch.randn_like(y)
        grads_ref = torch.autograd.grad(y_ref, (x, w, b), dy)
        grads = torch.autograd.grad(y, (x, w, b), dy)
        for got, want in zip(grads, grads_ref):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------
# The registration: torch.library.opcheck (schema, autograd, fake tensors, AOT dispatch).
# ------------------------------------------------------------------------------------------
def op_cases():
    cases = []
    for dtype in (torch.float32, torch.float64):
        for stride, padding, dilation, groups in [(1, 1, 1, 1), (2, (1, 0, 2, 1), 2, 2), ((2, 1), 0, (1, 2), 4)]:
            x, w, b = tensors(dtype, groups=groups)
            geo = (list(ct._pair("stride", stride)), list(ct._padding(padding, w.shape[2:], (1, 1), (1, 1))),
                   list(ct._pair("dilation", dilation)), groups)
            y = OPS.conv2d(x, w, b, *geo, "auto", "auto")
            dy = torch.randn_like(y).requires_grad_()
            name = f"{str(dtype).removeprefix('torch.')}-{geometry_id((stride, padding, dilation, groups))}"
            cases += [
                pytest.param(OPS.conv2d, (x, w, b, *geo, "auto", "auto"), id=f"conv2d-{name}"),
                pytest.param(OPS.conv2d, (x, w, None, *geo, "direct", "im2col"), id=f"conv2d-nobias-{name}"),
                pytest.param(OPS.conv2d_backward_data, (dy, w, list(x.shape), *geo, "auto"), id=f"data-{name}"),
                pytest.param(OPS.conv2d_backward_weight, (x, dy, list(w.shape), *geo, "auto"), id=f"weight-{name}"),
                pytest.param(OPS.conv2d_backward_bias, (dy, "auto"), id=f"bias-{name}"),
            ]
    return cases


@pytest.mark.parametrize("op, args", op_cases())
def test_opcheck(op, args):
    torch.library.opcheck(op, args)


# ------------------------------------------------------------------------------------------
# The eager path: the same numbers as the ops, without their dispatch.
# ------------------------------------------------------------------------------------------
def _refuse(*args):
    raise AssertionError("the eager path called a custom op")


@pytest.mark.parametrize("geometry", [(1, 1, 1, 1), (2, (0, 1, 2, 1), 2, 2)], ids=geometry_id)
def test_eager_path_matches_the_ops_without_calling_them(geometry, monkeypatch):
    """First-order gradients in eager mode call convlib directly (the ops refused here), and give
    exactly what the ops give."""
    stride, padding, dilation, groups = geometry
    x, w, b = tensors(groups=groups)
    geo = (list(ct._pair("stride", stride)), list(ct._padding(padding, w.shape[2:], (1, 1), (1, 1))),
           list(ct._pair("dilation", dilation)), groups)
    y_ops = OPS.conv2d(x, w, b, *geo, "auto", "auto")
    dy = torch.randn_like(y_ops)
    grads_ops = torch.autograd.grad(y_ops, (x, w, b), dy)
    for name in ("_conv2d_op", "_backward_data_op", "_backward_weight_op", "_backward_bias_op"):
        monkeypatch.setattr(ct, name, _refuse)
    y = ct.conv2d(x, w, b, stride, padding, dilation, groups)
    grads = torch.autograd.grad(y, (x, w, b), dy)
    torch.testing.assert_close(y, y_ops, rtol=0, atol=0)
    for got, want in zip(grads, grads_ops):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # A backward that records its own graph needs the ops' formulas: it calls them.
    y = ct.conv2d(x, w, b, stride, padding, dilation, groups)
    with pytest.raises(AssertionError, match="called a custom op"):
        torch.autograd.grad(y, (x, w, b), dy, create_graph=True)


def test_layers_run_their_plans_only_on_what_the_key_describes():
    # The eager path runs a plan under a key of its own for contiguous float32/float64 CPU
    # tensors and int arguments; anything else goes through the public function and its checks.
    x, w, b = (t.detach() for t in tensors())
    ints = (1, 1, 1, 1, 1, 1, 1, 1, 1)
    assert ct._plan_key("conv2d", (x, w, b), ints, "auto") is not None
    assert ct._plan_key("conv2d", (x, w, None), ints, "auto") != ct._plan_key("conv2d", (x, w, b), ints, "auto")
    assert ct._plan_key("conv2d", (x.float(), w.float(), b.float()), ints, "auto") != \
        ct._plan_key("conv2d", (x, w, b), ints, "auto")
    channels_last = x.to(memory_format=torch.channels_last)
    assert ct._plan_key("conv2d", (channels_last, w, b), ints, "auto") is None
    assert ct._plan_key("conv2d", (x, w, b), (1.0,) + ints[1:], "auto") is None
    assert ct._plan_key("conv2d", (x, w, b), (True,) + ints[1:], "auto") is None
    assert ct._plan_key("conv2d", (x.to(torch.bfloat16), w, b), ints, "auto") is None
    with KNOBS.override(auto_direct_max_filters=1):  # the knob state is part of the key
        overridden = ct._plan_key("conv2d", (x, w, b), ints, "auto")
    assert overridden != ct._plan_key("conv2d", (x, w, b), ints, "auto")
    expected = torch.nn.functional.conv2d(x, w, b, 1, 1)
    for inp in (x, channels_last, x, channels_last):  # each path twice: built, then cached
        torch.testing.assert_close(ct.conv2d(inp, w, b, 1, 1), expected)
    with pytest.raises(TypeError, match="stride"):  # a float stride reaches convlib's validation
        ct.conv2d(x, w, b, (1.0, 1.0), 1)


def test_vmap_takes_the_op():
    """torch.func.vmap over conv2d (per-image calls, PyTorch's batching fallback) gives the
    batched convolution: the eager Function would be refused there, so the op runs."""
    x, w, b = (t.detach() for t in tensors())
    batched = torch.func.vmap(lambda xi: ct.conv2d(xi[None], w, b, 1, 1)[0])(x)
    torch.testing.assert_close(batched, ct.conv2d(x, w, b, 1, 1), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------
# The drop-in module.
# ------------------------------------------------------------------------------------------
MODULE_CONFIGS = [
    dict(in_channels=3, out_channels=8, kernel_size=3),
    dict(in_channels=4, out_channels=6, kernel_size=(3, 2), stride=2, padding=(1, 0), groups=2, bias=False),
    dict(in_channels=4, out_channels=4, kernel_size=3, padding="same", dilation=2, groups=4),
    dict(in_channels=3, out_channels=5, kernel_size=3, padding="valid"),
    dict(in_channels=2, out_channels=4, kernel_size=3, stride=2, padding=1, padding_mode="reflect"),
    dict(in_channels=2, out_channels=4, kernel_size=3, padding="same", padding_mode="circular"),
    dict(in_channels=2, out_channels=4, kernel_size=(2, 3), padding=(1, 2), padding_mode="replicate"),
]


@pytest.mark.parametrize("config", MODULE_CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_conv2d_module_is_a_drop_in(config):
    torch.manual_seed(7)
    reference = torch.nn.Conv2d(**config)
    torch.manual_seed(7)
    layer = ct.Conv2d(**config)
    assert isinstance(layer, torch.nn.Conv2d)
    # The same initialisation from the same seed, and the same checkpoint format.
    assert list(layer.state_dict()) == list(reference.state_dict())
    for key, value in reference.state_dict().items():
        assert torch.equal(layer.state_dict()[key], value), key

    x = torch.randn(3, config["in_channels"], 11, 10, requires_grad=True)
    y_ref, y = reference(x), layer(x)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    dy = torch.randn_like(y)
    ref_grads = torch.autograd.grad(y_ref, [x, *reference.parameters()], dy)
    grads = torch.autograd.grad(y, [x, *layer.parameters()], dy)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_unbatched_input_and_a_summed_output():
    """A 3-D input (one image) as nn.Conv2d takes it; y.sum()'s gradient is an expanded tensor
    (stride 0) and channels_last a permuted one: convlib reads both as they are."""
    torch.manual_seed(1)
    reference = torch.nn.Conv2d(3, 4, 3, padding=1)
    layer = ct.Conv2d(3, 4, 3, padding=1)
    layer.load_state_dict(reference.state_dict())
    image = torch.randn(3, 6, 5)
    torch.testing.assert_close(layer(image), reference(image))
    x = torch.randn(2, 3, 6, 5).to(memory_format=torch.channels_last).requires_grad_()
    got = torch.autograd.grad(layer(x).sum(), [x, layer.weight])
    want = torch.autograd.grad(reference(x).sum(), [x, reference.weight])
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-4)


def test_conv2d_module_loads_a_torch_checkpoint_and_takes_algo():
    reference = torch.nn.Conv2d(3, 8, 3, padding=1)
    layer = ct.Conv2d(3, 8, 3, padding=1, algo="im2col", backward_algo="direct")
    layer.load_state_dict(reference.state_dict())
    x = torch.randn(2, 3, 9, 9)
    torch.testing.assert_close(layer(x), reference(x), rtol=1e-5, atol=1e-5)
    assert "algo='im2col'" in repr(layer) and "backward_algo='direct'" in repr(layer)
    with pytest.raises(ValueError, match="algo='fastest'"):
        ct.Conv2d(3, 8, 3, algo="fastest")
    with pytest.raises(TypeError, match="float16"):
        ct.Conv2d(3, 8, 3, dtype=torch.float16)(torch.zeros(1, 3, 5, 5, dtype=torch.float16))


def test_conv2d_module_in_a_training_step():
    """An optimiser step through Sequential changes the weights exactly as nn.Conv2d's would."""
    def model(conv):
        torch.manual_seed(3)
        return torch.nn.Sequential(conv(1, 4, 3, padding=1), torch.nn.ReLU(), conv(4, 4, 3, stride=2),
                                   torch.nn.Flatten(), torch.nn.LazyLinear(3))

    x, target = torch.randn(5, 1, 8, 8), torch.tensor([0, 1, 2, 1, 0])
    after = []
    for conv in (torch.nn.Conv2d, ct.Conv2d):
        net = model(conv)
        net(x)  # materialise the lazy layer
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), target).backward()
            opt.step()
        after.append(net.state_dict())
    for key in after[0]:
        torch.testing.assert_close(after[1][key], after[0][key], rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------
# torch.compile: dynamo, AOT autograd and the fake implementations, in one graph.
# ------------------------------------------------------------------------------------------
def _compiled_matches_eager(backend):
    torch.manual_seed(0)
    net = torch.nn.Sequential(ct.Conv2d(3, 8, 3, padding="same"), torch.nn.ReLU(),
                              ct.Conv2d(8, 4, 3, stride=2, padding=1, padding_mode="reflect"))
    compiled = torch.compile(net, backend=backend, fullgraph=True)
    for shape in [(2, 3, 10, 10), (3, 3, 12, 9)]:  # a second shape: recompiled, dynamic or not
        x = torch.randn(*shape, requires_grad=True)
        y_ref = net(x)
        ref_grads = torch.autograd.grad(y_ref.square().sum(), [x, net[0].weight, net[2].bias])
        y = compiled(x)
        grads = torch.autograd.grad(y.square().sum(), [x, net[0].weight, net[2].bias])
        torch.testing.assert_close(y, y_ref)
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, want)


def test_torch_compile_aot_eager():
    """The graph torch.compile captures (fullgraph: no break), run without code generation."""
    torch._dynamo.reset()
    _compiled_matches_eager("aot_eager")


@pytest.mark.slow
def test_torch_compile_inductor():
    """Inductor's generated C++ around the convlib ops (tens of seconds of compilation)."""
    torch._dynamo.reset()
    _compiled_matches_eager("inductor")



@pytest.mark.parametrize("torch_first", [True, False], ids=["torch-imported-first", "torch-imported-after"])
def test_convlib_leaves_pytorch_openmp_runtime_unnested(torch_first):
    """numba's OpenMP layer turns nested parallelism on in the runtime its pool binds to, which is
    PyTorch's when PyTorch is loaded: every PyTorch parallel region after a convlib call then ran
    without its spinning team (a training step 7x slower on 2 cores). convlib turns it off again;
    checked in a fresh process, in both import orders, in the runtimes numba may have used."""
    import json
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import ctypes, json, numpy as np
        {'import torch' if torch_first else ''}
        import convlib, numba
        x = np.ones((1, 2, 8, 8), np.float32)
        convlib.conv2d(x, np.ones((2, 2, 3, 3), np.float32), padding=1)
        import torch
        if numba.threading_layer() != "omp":
            raise SystemExit(print(json.dumps(numba.threading_layer())))
        from numba.np.ufunc import omppool
        nested = [ctypes.CDLL(omppool.__file__).omp_get_nested()]
        if hasattr(ctypes.CDLL(None), "omp_get_nested"):  # PyTorch's runtime, in the global scope
            nested.append(ctypes.CDLL(None).omp_get_nested())
        y = torch.nn.functional.conv2d(torch.ones(1, 2, 8, 8), torch.ones(2, 2, 3, 3), padding=1)
        assert float(y[0, 0, 4, 4]) == 18.0
        print(json.dumps(nested))
    """)
    out = json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                    check=True).stdout)
    if isinstance(out, str):
        pytest.skip(f"numba's threading layer is {out}, not OpenMP")
    assert out and out == [0] * len(out), out
