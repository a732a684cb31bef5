"""``convlib.torch`` on CUDA tensors: autograd through convlib's CUDA backend, against PyTorch's own
convolution (cuDNN) and its derivatives in float64, and in float16 / bfloat16 against the float64
result of the same half-precision values.

Runs on a machine with a CUDA GPU and PyTorch built for it (``python -m convlib.bench.gpu_check``
runs it); skipped elsewhere.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU for PyTorch")

import convlib.torch as ct  # noqa: E402

#: Half an ulp of each precision: the result's own rounding, which convlib (float32 products and
#: sums, rounded once) and PyTorch share; doubled for the float32 sums beneath.
HALF_TOLERANCE = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


def _randn(*shape, dtype=torch.float64, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, dtype=dtype, device="cuda", generator=gen)


@pytest.mark.parametrize("algo", ["direct", "im2col", "blis", "auto"])
def test_conv2d_module_on_cuda_trains_like_nn_conv2d(algo):
    reference = torch.nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2, dtype=torch.float64, device="cuda")
    # the backward passes by auto: CUDA has direct only for the data pass
    layer = ct.Conv2d(4, 6, 3, stride=2, padding=1, groups=2, dtype=torch.float64, device="cuda", algo=algo)
    layer.load_state_dict(reference.state_dict())
    x = _randn(3, 4, 11, 10).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    g = _randn(3, 6, 6, 5, seed=1)
    y, y_ref = layer(x), reference(x_ref)
    assert y.device == x.device and y.dtype == torch.float64
    (y * g).sum().backward()
    (y_ref * g).sum().backward()
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    for got, want in ((x.grad, x_ref.grad), (layer.weight.grad, reference.weight.grad),
                      (layer.bias.grad, reference.bias.grad)):
        assert got.device == x.device
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_gradcheck_on_cuda():
    x = _randn(2, 3, 7, 6).requires_grad_()
    w = _randn(4, 3, 3, 2, seed=1).requires_grad_()
    b = _randn(4, seed=2).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w, b: ct.conv2d(x, w, b, stride=(2, 1), padding=1, dilation=(1, 2)),
                                    (x, w, b))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_half_precision_autograd_on_cuda(dtype):
    x = _randn(2, 4, 9, 8).to(dtype).requires_grad_()
    w = _randn(6, 4, 3, 3, seed=1).to(dtype).requires_grad_()
    b = _randn(6, seed=2).to(dtype).requires_grad_()
    g = _randn(2, 6, 9, 8, seed=3).to(dtype)
    y = ct.conv2d(x, w, b, padding=1)
    assert y.dtype == dtype and y.device == x.device
    (y * g).sum().backward()
    # the float64 reference from the same half-precision values
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    y64 = torch.nn.functional.conv2d(x64, w64, b64, padding=1)
    y64.backward(g.double())
    eps = HALF_TOLERANCE[dtype]
    for got, want in ((y, y64), (x.grad, x64.grad), (w.grad, w64.grad), (b.grad, b64.grad)):
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), want.detach(), rtol=eps, atol=eps * float(want.abs().max()))


def test_an_expanded_gradient_on_cuda():
    """``y.sum().backward()`` hands the backward passes a stride-0 (expanded) ``dy``."""
    x = _randn(2, 3, 8, 7).requires_grad_()
    w = _randn(5, 3, 3, 3, seed=1).requires_grad_()
    x_ref, w_ref = (t.detach().clone().requires_grad_() for t in (x, w))
    ct.conv2d(x, w, None, stride=2, padding=1).sum().backward()
    torch.nn.functional.conv2d(x_ref, w_ref, None, stride=2, padding=1).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(w.grad, w_ref.grad, rtol=1e-10, atol=1e-10)
