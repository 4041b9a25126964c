"""Tensors with a size-0 dim, compiled: reductions over an empty axis give their identity
(sum 0, mean NaN, as PyTorch defines them), views of empty tensors compile, and every
call (cold, a cache hit, new values) agrees with eager execution."""

import numpy as np
import pytest

import tracegrad as tg


pytestmark = pytest.mark.usefixtures("poisoned_kernel_outputs")  # unwritten results show


def _three_calls(fn, *make_args):
    """fn's results on three calls of one compiled function: the first traces and
    compiles, the second follows the recorded trace, the third gets new arguments."""
    compiled = tg.compile(fn)
    results = []
    for _ in range(3):
        results.append(compiled(*[make() for make in make_args]).numpy().copy())
    return results


def _assert_each_call(fn, make_args, expected):
    for got in _three_calls(fn, *make_args):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("shape, dim", [((0, 300), 0), ((0, 3), 0), ((5, 0), 1), ((0,), None),
                                        ((2, 0, 3), 1), ((2, 0, 3), (0, 1))])
def test_sum_over_a_size_0_axis_is_zero_when_compiled(shape, dim):
    fn = (lambda x: x.sum()) if dim is None else (lambda x: x.sum(dim))
    eager = fn(tg.zeros(*shape)).numpy()
    np.testing.assert_array_equal(eager, np.zeros_like(eager))
    _assert_each_call(fn, [lambda: tg.randn(*shape)], eager)


@pytest.mark.parametrize("dtype", [tg.int64, tg.bool, tg.float64])
def test_sum_of_an_empty_tensor_of_any_dtype_is_zero_when_compiled(dtype):
    fn = lambda x: x.sum()  # noqa: E731
    eager = fn(tg.zeros(0, dtype=dtype)).numpy()
    assert eager == 0
    _assert_each_call(fn, [lambda: tg.zeros(0, dtype=dtype)], eager)


@pytest.mark.parametrize("fn", [lambda x: x[x > 5].sum(), lambda x: x[x > 5].sum(0) * 2])
def test_masked_sum_selecting_nothing_is_zero_when_compiled(fn):
    _assert_each_call(fn, [lambda: tg.ones(4, 3)], np.zeros(() if fn(tg.ones(4, 3)).ndim == 0 else 3, np.float32))


@pytest.mark.parametrize("dim", [0, None])
def test_mean_over_a_size_0_axis_is_nan_when_compiled(dim):
    fn = (lambda x: x.mean()) if dim is None else (lambda x: x.mean(dim))
    eager = fn(tg.zeros(0, 3)).numpy()
    assert np.isnan(eager).all()
    _assert_each_call(fn, [lambda: tg.zeros(0, 3)], eager)


def test_a_reduction_folded_after_an_empty_product_is_its_identity_when_compiled():
    fn = lambda a, b: (a @ b + 1.0).sum(0)  # noqa: E731
    _assert_each_call(fn, [lambda: tg.zeros(0, 5), lambda: tg.ones(5, 4)], np.zeros(4, np.float32))


@pytest.mark.parametrize("name, fn, shape, out_shape", [
    ("reshape_to_0", lambda x: x.reshape(0) * 2, (4, 0, 1), (0,)),
    ("reshape_split", lambda x: x.reshape(0, 3) + 1, (3, 0), (0, 3)),
    ("permute", lambda x: x.permute(1, 0) * 2, (3, 0), (0, 3)),
    ("expand", lambda x: x.expand(0, 3) * 2, (1, 3), (0, 3)),
    ("slice", lambda x: x[2:2] * 2, (4, 3), (0, 3)),
    ("index", lambda x: x[tg.tensor([], dtype=tg.int64)] * 2, (4, 3), (0, 3)),
    ("concat", lambda x: tg.cat([x, x[:0]]) * 2, (2, 3), (2, 3)),
])
def test_movement_of_empty_tensors_compiles_and_matches_eager(name, fn, shape, out_shape):
    eager = fn(tg.ones(*shape)).numpy()
    assert eager.shape == out_shape
    _assert_each_call(fn, [lambda: tg.ones(*shape)], eager)


def test_gradient_through_reshape_of_an_empty_tensor_when_compiled():
    @tg.compile
    def step(x, w):
        ((x.reshape(0, 3) * w).sum(0) * w).sum().backward()

    for _ in range(3):
        x = tg.zeros(2, 0, 3, requires_grad=True)
        w = tg.ones(3, requires_grad=True)
        step(x, w)
        assert x.grad.shape == (2, 0, 3)
        np.testing.assert_array_equal(w.grad.numpy(), np.zeros(3, np.float32))


@pytest.mark.parametrize("dtype", [tg.float32, tg.float64])
@pytest.mark.parametrize("a_shape, b_shape", [((0, 3), (3, 18)), ((0, 18), (18, 3)), ((3, 0), (0, 18)),
                                              ((5, 4), (4, 0))], ids=str)
def test_products_with_a_size_0_dim_match_eager_on_every_call(a_shape, b_shape, dtype):
    # (A product's generated GEMM is built at its step's third run; an epilogue joins it.)
    def product(a, b):
        return (a @ b + 1.0).relu()

    make_a = lambda: tg.ones(*a_shape, dtype=dtype)  # noqa: E731
    make_b = lambda: tg.ones(*b_shape, dtype=dtype)  # noqa: E731
    compiled = tg.compile(product)
    for _ in range(4):
        got = compiled(make_a(), make_b()).numpy()
        np.testing.assert_array_equal(got, product(make_a(), make_b()).numpy())
