"""`ops/window_max.py`: max pooling's window_select and window_scatter. Values and
gradients against loops written out in NumPy with PyTorch's choice of the winner (ties,
NaN, windows of -inf beside padding), each op the other's transpose, gradients of first
and second order (float64, eager and compiled, a strided view and size-0/1 dims),
compiled equal to eager with both ops lowered into kernels (a channels-last product
pooled channels innermost, no index written), saved-tensor semantics and the errors."""

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck
from tracegrad.ops import window_max

CHECKS = [pytest.param(gradcheck, id="grad"), pytest.param(gradgradcheck, id="gradgrad")]

# name -> (input shape, kernel, stride, padding, dilation): max_pool2d's arguments
GEOMETRIES = {
    "2x2": ((2, 3, 6, 8), (2, 2), (2, 2), (0, 0), (1, 1)),
    "overlapping_padded": ((2, 2, 7, 7), (3, 3), (2, 2), (1, 1), (1, 1)),
    "stride_1": ((1, 2, 5, 6), (3, 2), (1, 1), (1, 0), (1, 1)),
    "dilated": ((1, 3, 9, 8), (2, 3), (1, 2), (1, 0), (2, 1)),
    "gaps_between_windows": ((1, 1, 9, 9), (2, 2), (3, 4), (0, 1), (1, 1)),
    "unbatched": ((3, 5, 5), (2, 2), (1, 2), (1, 0), (1, 1)),
    "size_1_dims": ((1, 1, 1, 5), (1, 2), (1, 1), (0, 1), (1, 1)),
}


def _reference(x, g, kernel, stride, padding, dilation):
    """(pooled x, x's gradient for the cotangent g): PyTorch's CPU loop, written out."""
    *lead, height, width = x.shape
    out_h = (height + 2 * padding[0] - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
    out_w = (width + 2 * padding[1] - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    flat_x = x.reshape(-1, height, width)
    flat_g = g.reshape(-1, out_h, out_w)
    values = np.zeros((flat_x.shape[0], out_h, out_w), x.dtype)
    grad = np.zeros_like(flat_x)
    for n in range(flat_x.shape[0]):
        for oh in range(out_h):
            for ow in range(out_w):
                best, where = -np.inf, None
                for i in range(kernel[0]):
                    for j in range(kernel[1]):
                        r = oh * stride[0] - padding[0] + i * dilation[0]
                        c = ow * stride[1] - padding[1] + j * dilation[1]
                        if 0 <= r < height and 0 <= c < width:
                            if where is None:
                                where = (r, c)
                            value = flat_x[n, r, c]
                            if value > best or np.isnan(value):
                                best, where = value, (r, c)
                values[n, oh, ow] = flat_x[n][where]
                grad[n][where] += flat_g[n, oh, ow]
    return values.reshape(*lead, out_h, out_w), grad.reshape(x.shape)


def _pool(x, name):
    _, kernel, stride, padding, dilation = GEOMETRIES[name]
    return F.max_pool2d(x, kernel, stride, padding, dilation)


def _inputs(shape, kind, seed):
    rng = np.random.default_rng(seed)
    if kind == "ties":
        return rng.integers(0, 3, shape).astype(np.float64)
    x = rng.standard_normal(shape)
    if kind == "nan":
        x[rng.random(shape) < 0.2] = np.nan
    if kind == "minus_inf":
        x[rng.random(shape) < 0.6] = -np.inf
    return x


@pytest.mark.parametrize("kind", ["random", "ties", "nan", "minus_inf"])
@pytest.mark.parametrize("name", GEOMETRIES)
def test_values_and_gradients_match_pytorchs_loop_eager_and_compiled(name, kind):
    shape, kernel, stride, padding, dilation = GEOMETRIES[name]

    def step(x, g):
        y = _pool(x, name)
        y.backward(g)
        return y.detach()

    compiled = tg.compile(step)
    for seed in range(2):
        x0 = _inputs(shape, kind, seed)
        g0 = np.random.default_rng(seed + 10).standard_normal(_pool(tg.tensor(x0), name).shape)
        want_values, want_grad = _reference(x0, g0, kernel, stride, padding, dilation)
        for run in (step, compiled):
            x = tg.tensor(x0, requires_grad=True)
            values = run(x, tg.tensor(g0))
            np.testing.assert_array_equal(values.numpy(), want_values)
            np.testing.assert_allclose(x.grad.numpy(), want_grad, rtol=1e-15, atol=0)


def test_float32_pooling_is_exact_and_compiled_equals_eager():
    x0 = np.random.default_rng(3).standard_normal((2, 4, 8, 6)).astype(np.float32)
    g0 = np.random.default_rng(4).standard_normal((2, 4, 4, 3)).astype(np.float32)
    want_values, want_grad = _reference(x0, g0, (3, 3), (2, 2), (1, 1), (1, 1))

    def step(x, g):
        y = F.max_pool2d(x, 3, stride=2, padding=1)
        (grad,) = tg.autograd.grad(y, [x], g)
        return y.detach(), grad

    compiled = tg.compile(step)
    for run in (step, compiled, compiled):
        values, grad = run(tg.tensor(x0, requires_grad=True), tg.tensor(g0))
        assert values.dtype == tg.float32 and grad.dtype == tg.float32
        np.testing.assert_array_equal(values.numpy(), want_values)
        np.testing.assert_array_equal(grad.numpy(), want_grad)


def test_grad_fns_are_named_as_pytorchs():
    x = _leaf((1, 1, 4, 4))
    pooled = F.max_pool2d(x, 2)
    (grad,) = tg.autograd.grad(pooled.sum(), [x], create_graph=True)
    assert pooled.grad_fn.name() == "MaxPool2DWithIndicesBackward"
    assert grad.grad_fn.name() == "MaxPool2DWithIndicesBackwardBackward"


def test_scatter_is_the_transpose_of_select():
    rng = np.random.default_rng(5)
    attrs = dict(kernel=(3, 2), stride=(1, 2), dilation=(2, 1), padding=(1, 1))
    x, v = tg.tensor(rng.standard_normal((2, 9, 7))), tg.tensor(rng.standard_normal((2, 9, 7)))
    selected = window_max.window_select(x, v, **attrs)
    g = tg.tensor(rng.standard_normal(selected.shape))
    scattered = window_max.window_scatter(x, g, **attrs)
    assert scattered.shape == x.shape
    np.testing.assert_allclose((selected * g).sum().item(), (v * scattered).sum().item(), rtol=1e-13)


def _leaf(shape, seed=0):
    # (distinct values far apart: no tie moves under gradcheck's perturbation)
    values = np.random.default_rng(seed).permutation(np.prod(shape)).reshape(shape) * 0.1
    return tg.tensor(values).requires_grad_()


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", ["2x2", "overlapping_padded", "dilated", "size_1_dims"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_gradients_of_first_and_second_order(name, check, compiled):
    fn = (lambda x: _pool(x, name))
    assert check(tg.compile(fn) if compiled else fn, (_leaf(GEOMETRIES[name][0]),))


@pytest.mark.parametrize("check", CHECKS)
def test_gradients_through_a_strided_view(check):
    x = _leaf((2, 6, 5, 3))
    assert check(lambda t: F.max_pool2d(t.permute(0, 3, 1, 2), 2, stride=1), (x,))
    assert check(tg.compile(lambda t: F.max_pool2d(t.permute(0, 3, 1, 2), 2, stride=1)), (x,))


def test_an_empty_batch_pools_to_an_empty_result_eager_and_compiled():
    def fn(x):
        y = F.max_pool2d(x, 2)
        y.sum().backward()
        return y
    for run in (fn, tg.compile(fn)):
        x = tg.zeros(0, 3, 4, 4, requires_grad=True)
        assert run(x).shape == (0, 3, 2, 2) and x.grad.shape == (0, 3, 4, 4)


def _program_steps(fn, *args):
    compiled = tg.compile(fn)
    compiled(*args)
    return next(iter(compiled._programs.values()))


def test_compiled_pooling_of_a_channels_last_product_loops_channels_innermost_without_an_index():
    # A convolution's product is (N*H*W, C): pooled as NCHW, its windows are read along C
    # (contiguous) with the channel loop innermost, and the backward finds each window's
    # winner again from the product instead of reading an index the forward wrote.
    product = tg.tensor(np.random.default_rng(6).standard_normal((2 * 8 * 8, 16)).astype(np.float32),
                        requires_grad=True)
    bias = tg.tensor(np.random.default_rng(7).standard_normal(16).astype(np.float32))

    def step(p, b):
        pooled = F.max_pool2d((p + b).relu().reshape(2, 8, 8, 16).permute(0, 3, 1, 2), 2)
        (grad,) = tg.autograd.grad((pooled * pooled).sum(), [p])
        return pooled.detach(), grad

    program = _program_steps(step, product, bias)
    kernels = [s for s in program.steps if hasattr(s, "kernel")]
    forward = next(k for k in kernels if "window_select" in k.label)
    backward = next(k for k in kernels if "window_scatter" in k.label)
    assert all(dtype != np.dtype(np.int64) for _, dtype in forward.out_specs + backward.out_specs)
    from tracegrad.codegen.loop_order import inner_order
    assert forward.kernel.domain == (2, 16, 4, 4) and inner_order(forward.kernel)[-1] == 1
    for got, want in zip(tg.compile(step)(product, bias), step(product, bias)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_a_scatter_over_too_many_reads_runs_as_numpy_compiled_and_equals_eager():
    # 3x3 windows of stride 1: 9 windows cover a pixel, 81 reads to find their winners.
    x = _leaf((1, 2, 6, 6))

    def fn(x):
        (grad,) = tg.autograd.grad(F.max_pool2d(x, 3, stride=1).square().sum(), [x])
        return grad
    assert ("numpy", "window_scatter") in _program_steps(fn, x)._describe()[1]
    np.testing.assert_array_equal(tg.compile(fn)(x).numpy(), fn(x).numpy())


def test_an_in_place_update_of_the_input_before_backward_raises_and_of_the_result_does_not():
    x = _leaf((1, 1, 4, 4))
    y = x * 1.0
    pooled = F.max_pool2d(y, 2)
    y.add_(1.0)  # (the input is saved, as PyTorch saves it)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        pooled.sum().backward()
    x.grad = None
    pooled = F.max_pool2d(x * 1.0, 2)
    pooled.relu_()  # (the result is not saved)
    pooled.sum().backward()
    assert x.grad.sum().item() == 4.0


@pytest.mark.parametrize("call, message", [
    (lambda: window_max.window_select(tg.zeros(3), tg.zeros(3), (1, 1), (1, 1), (1, 1)),
     r"window_select: expected float32 or float64 tensors .* at least 2 dims"),
    (lambda: window_max.window_select(tg.zeros(2, 3), tg.zeros(2, 3, dtype=tg.float64), (1, 1), (1, 1), (1, 1)),
     r"window_select: expected float32 or float64 tensors of one dtype"),
    (lambda: window_max.window_select(tg.zeros(2, 3), tg.zeros(3, 3), (1, 1), (1, 1), (1, 1)),
     r"window_select: expected values of the shape of the input"),
    (lambda: window_max.window_select(tg.zeros(2, 3), tg.zeros(2, 3), (3, 1), (1, 1), (1, 1)),
     r"window_select: kernel \[3, 1\] .* does not fit in 2x3"),
    (lambda: window_max.window_select(tg.zeros(4, 4), tg.zeros(4, 4), (2, 2), (1, 1), (1, 1), (2, 0)),
     r"window_select: padding must be two ints from 0 to half"),
    (lambda: window_max.window_scatter(tg.zeros(4, 4), tg.zeros(3, 3), (2, 2), (2, 2), (1, 1)),
     r"window_scatter: expected one value per window of .* \[2, 2\]"),
    (lambda: F.max_pool2d(tg.zeros(1, 1, 2, 2), 3), r"max_pool2d: kernel size 3 .* larger than the padded input"),
])
def test_bad_input_is_an_error_naming_the_op_and_shapes(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()


def test_matches_pytorch_on_ties_nans_and_padding():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    for kind in ("ties", "nan", "minus_inf"):
        for name in ("overlapping_padded", "dilated", "2x2"):
            shape, kernel, stride, padding, dilation = GEOMETRIES[name]
            x0 = _inputs(shape, kind, int(rng.integers(100)))
            tx = torch.tensor(x0, requires_grad=True)
            ty = torch.nn.functional.max_pool2d(tx, kernel, stride, padding, dilation)
            g0 = rng.standard_normal(tuple(ty.shape))
            ty.backward(torch.tensor(g0))
            x = tg.tensor(x0, requires_grad=True)
            y = _pool(x, name)
            y.backward(tg.tensor(g0))
            np.testing.assert_array_equal(y.detach().numpy(), ty.detach().numpy())
            np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-15, atol=1e-15)
