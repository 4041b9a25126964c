"""`functional/conv.py`'s results as tensors: like PyTorch's, a convolution's output is a
fresh contiguous tensor (never a view of its matmul), so a program may write into it."""

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F

CONVS = {
    "conv2d": lambda x, w: F.conv2d(x, w, None, stride=2, padding=1),
    "conv2d_bias": lambda x, w: F.conv2d(x, w, tg.ones(4, dtype=tg.float64), padding=1),
    "conv_transpose2d": lambda x, w: F.conv_transpose2d(x, w.transpose(0, 1), None, stride=2, padding=1),
}


def _inputs():
    rng = np.random.default_rng(0)
    x = tg.tensor(rng.standard_normal((2, 3, 5, 5)), requires_grad=True)
    w = tg.tensor(rng.standard_normal((4, 3, 3, 3)), requires_grad=True)
    return x, w


@pytest.mark.parametrize("name", CONVS)
def test_a_convolutions_output_is_contiguous_and_no_view(name):
    out = CONVS[name](*_inputs())
    assert out.is_contiguous() and out._base is None


@pytest.mark.parametrize("name", CONVS)
def test_an_in_place_activation_of_a_convolutions_output_gives_the_out_of_place_gradients(name):
    x, w = _inputs()
    expected = tg.autograd.grad(F.leaky_relu(CONVS[name](x, w), 0.2).sum(), [x, w])
    out = CONVS[name](x, w)
    assert F.leaky_relu(out, 0.2, inplace=True) is out
    got = tg.autograd.grad(out.sum(), [x, w])
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-13)


def test_an_in_place_activation_of_a_convolution_compiled_equals_eager():
    def step(x, w):
        out = F.conv2d(x, w, None, stride=2, padding=1)
        F.leaky_relu(out, 0.2, inplace=True)
        return tg.autograd.grad(out.square().sum(), [x, w])

    eager = step(*_inputs())
    compiled = tg.compile(step)(*_inputs())
    for c, e in zip(compiled, eager):
        np.testing.assert_allclose(c.numpy(), e.numpy(), rtol=1e-12)
