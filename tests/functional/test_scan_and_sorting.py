"""`functional/scan.py` (cumsum, cumprod, cummax, cummin, logcumsumexp, prod) and
`functional/sorting.py` (sort, argsort, msort, topk, kthvalue, median): values as
PyTorch's, gradients against finite differences (first and second order, float64, with
zeros in the input for the products), compiled equal to eager, size-0/1 dims, transposed
inputs, ties and NaN as documented; compared with PyTorch itself where it is installed."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck

CHECKS = [pytest.param(gradcheck, id="grad"), pytest.param(gradgradcheck, id="gradgrad")]


def _array(shape, seed, zeros=False):
    """Distinct values (no ties, so every order and index is unique), with some exact zeros
    when asked."""
    rng = np.random.default_rng(seed)
    data = rng.permutation(np.arange(1, int(np.prod(shape)) + 1)).reshape(shape) * 0.37 - 2.0
    data = data + rng.uniform(-0.05, 0.05, shape)
    if zeros:
        data.reshape(-1)[::3] = 0.0
    return data


def _leaf(shape, seed=0, zeros=False, transposed=False):
    data = _array(shape[::-1] if transposed else shape, seed, zeros)
    return tg.from_numpy(data.T if transposed else data).requires_grad_()


# name -> (function of a module `m` and a float64 input, input shape, zeros in the input);
# the same text runs with PyTorch as `m`.
CASES = {
    "cumsum": (lambda m, a: m.cumsum(a, 1), (3, 4), False),
    "cumsum_dim0_method": (lambda m, a: a.cumsum(0) * a, (3, 4), False),
    "cumprod": (lambda m, a: m.cumprod(a, 1), (3, 5), False),
    "cumprod_with_zeros": (lambda m, a: a.cumprod(-1), (3, 5), True),
    "cumprod_dim0_with_zeros": (lambda m, a: m.cumprod(a, 0) * 1.5, (5, 2), True),
    "prod_all": (lambda m, a: a.prod(), (2, 3), False),
    "prod_all_with_zeros": (lambda m, a: m.prod(a), (2, 3), True),
    "prod_dim_keepdim_with_zeros": (lambda m, a: a.prod(1, keepdim=True) * a, (3, 4), True),
    "logcumsumexp": (lambda m, a: m.logcumsumexp(a, 1), (3, 4), False),
    "logcumsumexp_dim0": (lambda m, a: a.logcumsumexp(0) * a, (4, 2), False),
    "cummax": (lambda m, a: m.cummax(a, 1).values, (3, 5), False),
    "cummin": (lambda m, a: a.cummin(0).values * 2.0, (4, 3), False),
    "sort": (lambda m, a: m.sort(a, 1).values * m.arange(4.0, dtype=m.float64), (3, 4), False),
    "sort_descending": (lambda m, a: a.sort(0, descending=True).values, (4, 3), False),
    "msort": (lambda m, a: m.msort(a), (4, 3), False),
    "topk": (lambda m, a: m.topk(a, 2).values, (3, 5), False),
    "topk_smallest_dim0": (lambda m, a: a.topk(3, 0, largest=False).values, (4, 3), False),
    "kthvalue": (lambda m, a: m.kthvalue(a, 2, 1).values, (3, 4), False),
    "kthvalue_keepdim": (lambda m, a: a.kthvalue(3, 0, keepdim=True).values * a, (4, 2), False),
    "median_all": (lambda m, a: a.median() * a, (3, 3), False),
    "median_dim": (lambda m, a: m.median(a, 1).values, (3, 4), False),
    "median_dim_keepdim": (lambda m, a: a.median(0, keepdim=True).values, (5, 2), False),
}

TRANSPOSED = ["cumsum", "cumprod_with_zeros", "prod_dim_keepdim_with_zeros", "logcumsumexp", "cummax",
              "sort", "topk", "median_dim"]


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", CASES)
def test_gradients_match_finite_differences(name, check):
    fn, shape, zeros = CASES[name]
    assert check(lambda x: fn(tg, x), (_leaf(shape, zeros=zeros),))


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", TRANSPOSED)
def test_gradients_on_transposed_inputs(name, check):
    fn, shape, zeros = CASES[name]
    x = _leaf(shape, zeros=zeros, transposed=True)
    assert not x.is_contiguous()
    assert check(lambda x: fn(tg, x), (x,))


@pytest.mark.parametrize("name", CASES)
def test_compiled_values_and_gradients_equal_eager(name):
    fn, shape, zeros = CASES[name]

    def step(x):
        out = fn(tg, x)
        return out, tg.autograd.grad((out * out).sum(), [x])[0]

    compiled = tg.compile(step)
    for seed in range(3):  # new values each call: the program is reused, not its results
        eager_out, eager_grad = step(_leaf(shape, seed, zeros))
        out, grad = compiled(_leaf(shape, seed, zeros))
        np.testing.assert_allclose(out.detach().numpy(), eager_out.detach().numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(grad.numpy(), eager_grad.numpy(), rtol=1e-12, atol=1e-12)


def test_cumprod_gradient_with_zeros_equals_the_products_of_the_other_elements():
    x = tg.tensor([2.0, 0.0, 3.0, 0.0, 5.0], dtype=tg.float64, requires_grad=True)
    x.cumprod(0).sum().backward()
    data = x.detach().numpy()
    expected = [sum(np.prod(np.delete(data[:i + 1], k)) for i in range(k, 5)) for k in range(5)]
    np.testing.assert_array_equal(x.grad.numpy(), expected)


def test_prod_second_derivative_with_one_zero_is_the_product_of_the_remaining_elements():
    x = tg.tensor([2.0, 0.0, 3.0], dtype=tg.float64, requires_grad=True)
    (grad,) = tg.autograd.grad(x.prod(), [x], create_graph=True)
    assert grad.tolist() == [0.0, 6.0, 0.0]
    (second,) = tg.autograd.grad(grad[1], [x])
    assert second.tolist() == [3.0, 0.0, 2.0]


def test_integer_and_bool_inputs_accumulate_in_int64_unless_dtype_is_given():
    x = tg.tensor([[1, 2], [3, 4]])
    assert x.cumsum(0).dtype is tg.int64 and x.cumsum(1).tolist() == [[1, 3], [3, 7]]
    assert tg.tensor([True, False, True]).cumsum(0).tolist() == [1, 1, 2]
    assert x.prod().item() == 24 and x.prod().dtype is tg.int64 and x.prod(0).tolist() == [3, 8]
    assert x.cumprod(1, dtype=tg.float64).dtype is tg.float64
    assert tg.tensor([True, True]).prod().dtype is tg.int64
    assert tg.cumsum(tg.ones(3), 0, dtype=tg.float64).dtype is tg.float64


def test_logcumsumexp_is_stable_where_exp_overflows():
    x = tg.tensor([1000.0, 0.0, 1000.0, -1000.0], dtype=tg.float64)
    np.testing.assert_allclose(tg.logcumsumexp(x, 0).numpy(), [1000.0, 1000.0, 1000.0 + np.log(2.0)] * 1
                               + [1000.0 + np.log(2.0)], rtol=1e-15)
    with pytest.raises(NotImplementedError, match="logcumsumexp.*Long"):
        tg.logcumsumexp(tg.tensor([1, 2]), 0)


def test_cummax_and_cummin_keep_the_last_of_tied_positions_and_a_nan_once_seen():
    x = tg.tensor([1.0, 3.0, 3.0, 2.0, 3.0, float("nan"), 1.0, float("nan")])
    values, indices = tg.cummax(x, 0)
    assert indices.tolist() == [0, 1, 2, 2, 4, 5, 5, 7]
    assert values.tolist()[:5] == [1.0, 3.0, 3.0, 3.0, 3.0] and np.isnan(values.numpy()[5:]).all()
    assert tg.tensor([3.0, 1.0, 1.0, 2.0, 1.0]).cummin(0).indices.tolist() == [0, 1, 2, 2, 4]
    assert tg.tensor([True, False, True]).cummax(0).indices.tolist() == [0, 0, 2]


def test_cummax_gradient_goes_to_the_element_each_value_came_from():
    x = tg.tensor([1.0, 3.0, 2.0, 3.0], requires_grad=True)
    x.cummax(0).values.sum().backward()
    assert x.grad.tolist() == [1.0, 2.0, 0.0, 1.0]


def test_sort_is_stable_for_ties_and_puts_nan_above_every_number():
    x = tg.tensor([2.0, 1.0, 2.0, float("nan"), 1.0])
    assert x.sort().indices.tolist() == [1, 4, 0, 2, 3]
    assert x.sort(descending=True).indices.tolist() == [3, 0, 2, 1, 4]
    assert tg.argsort(x, stable=True).tolist() == [1, 4, 0, 2, 3]
    assert x.topk(2).indices.tolist() == [3, 0]


def test_median_and_kthvalue_take_the_lower_middle_and_the_first_nan():
    assert tg.tensor([4.0, 1.0, 2.0, 3.0]).median().item() == 2.0
    ties = tg.tensor([2.0, 2.0, 1.0, 3.0, 2.0])
    assert ties.median(0).indices.item() == 1 and ties.kthvalue(2).indices.item() == 0
    with_nan = tg.tensor([3.0, 1.0, float("nan"), 2.0, float("nan")])
    assert np.isnan(with_nan.median().item()) and with_nan.median(0).indices.item() == 2
    assert tg.tensor([5, 1, 3, 2]).median().item() == 2 and np.isnan(tg.ones(0).median().item())


def test_median_over_all_elements_shares_the_gradient_among_equal_elements():
    x = tg.tensor([2.0, 2.0, 1.0, 3.0, 2.0], requires_grad=True)
    x.median().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1 / 3, 1 / 3, 0.0, 0.0, 1 / 3])
    y = tg.tensor([2.0, 2.0, 1.0, 3.0, 2.0], requires_grad=True)
    y.median(0).values.backward()
    assert y.grad.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]


def test_results_are_named_tuples_with_values_and_indices():
    x = tg.tensor([[3.0, 1.0, 2.0]])
    for result, name in [(x.sort(), "sort"), (x.topk(1), "topk"), (x.kthvalue(1), "kthvalue"),
                         (x.median(1), "median"), (x.cummax(1), "cummax"), (x.cummin(1), "cummin")]:
        assert type(result).__name__ == name and result._fields == ("values", "indices")
        values, indices = result
        assert values is result.values and indices.dtype is tg.int64


def test_size_zero_and_size_one_dims():
    empty = tg.ones(0, 3)
    assert empty.cumsum(0).shape == (0, 3) and empty.cumprod(1).shape == (0, 3)
    assert empty.prod(0).tolist() == [1.0, 1.0, 1.0] and empty.prod().item() == 1.0
    assert empty.prod(1).shape == (0,) and tg.logcumsumexp(empty, 0).shape == (0, 3)
    assert empty.cummax(0).values.shape == (0, 3) and empty.sort(0).indices.shape == (0, 3)
    assert empty.topk(0, 0).values.shape == (0, 3) and tg.ones(2, 0).topk(0).values.shape == (2, 0)
    assert empty.median(1).values.shape == (0,) and empty.argsort(1).shape == (0, 3)
    one = tg.tensor([[2.5]], requires_grad=True)
    assert one.cumprod(1).tolist() == [[2.5]] and one.prod().item() == 2.5 and one.median().item() == 2.5
    assert one.sort(0).indices.tolist() == [[0]] and one.kthvalue(1, 1).values.tolist() == [2.5]
    scalar = tg.tensor(1.5)
    assert scalar.cumsum(0).shape == () and scalar.sort().values.shape == () and scalar.topk(1).values.item() == 1.5
    assert scalar.prod(0).item() == 1.5 and scalar.cummax(-1).indices.item() == 0
    assert scalar.median(0).values.item() == 1.5 and scalar.argsort().shape == ()


def test_in_place_cumsum_and_cumprod_on_non_leaves():
    x = _leaf((2, 3))
    y = x * 1.0
    y.cumsum_(1).cumprod_(0)
    y.sum().backward()
    expected = tg.cumprod(tg.cumsum(x.detach() * 1.0, 1), 0)
    np.testing.assert_allclose(y.detach().numpy(), expected.numpy())
    z = x.detach().clone().requires_grad_()
    z.cumsum(1).cumprod(0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), z.grad.numpy())


@pytest.mark.parametrize("call, error, message", [
    (lambda: tg.ones(2, 3).cumsum(2), IndexError, r"Dimension out of range \(expected to be in range of \[-2, 1\]"),
    (lambda: tg.ones(3).topk(4), RuntimeError, "selected index k out of range"),
    (lambda: tg.ones(3).kthvalue(4), RuntimeError, "selected number k out of range for dimension 0"),
    (lambda: tg.ones(3).kthvalue(0), RuntimeError, "selected number k out of range"),
    (lambda: tg.ones(0, 3).median(0), IndexError, "median.*Expected reduction dim 0 to have non-zero size"),
    (lambda: tg.ones(2).sort(1), IndexError, "sort: Dimension out of range"),
])
def test_bad_input_is_refused_with_the_ops_message(call, error, message):
    with pytest.raises(error, match=message):
        call()


try:
    import torch
except ImportError:
    torch = None


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("name", CASES)
def test_values_and_gradients_match_torch(name):
    fn, shape, zeros = CASES[name]
    array = _array(shape, 20, zeros)
    ours, theirs = tg.tensor(array, requires_grad=True), torch.tensor(array, requires_grad=True)
    out, expected = fn(tg, ours), fn(torch, theirs)
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    weights = np.linspace(-1.0, 1.0, int(np.prod(out.shape))).reshape(out.shape)
    (out * tg.tensor(weights)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("op", ["sort", "topk", "kthvalue", "median", "cummax", "cummin"])
def test_indices_match_torch_without_ties(op):
    array = _array((4, 6), 3)
    calls = {"sort": lambda m, a: m.sort(a, 1, descending=True), "topk": lambda m, a: m.topk(a, 3, 0),
             "kthvalue": lambda m, a: m.kthvalue(a, 2, 1), "median": lambda m, a: m.median(a, 0),
             "cummax": lambda m, a: m.cummax(a, 1), "cummin": lambda m, a: m.cummin(a, 0)}
    ours, theirs = calls[op](tg, tg.tensor(array)), calls[op](torch, torch.tensor(array))
    assert ours.indices.tolist() == theirs.indices.tolist()
    np.testing.assert_array_equal(ours.values.numpy(), theirs.values.numpy())


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
def test_integer_scans_and_products_match_torch():
    array = np.random.default_rng(5).integers(-3, 4, (3, 4))
    for fn in [lambda m, a: m.cumsum(a, 0), lambda m, a: m.cumprod(a, 1), lambda m, a: m.prod(a, 1),
               lambda m, a: m.prod(a), lambda m, a: m.cummax(a, 1).values, lambda m, a: m.sort(a, 0).values,
               lambda m, a: m.median(a)]:
        ours, theirs = fn(tg, tg.tensor(array)), fn(torch, torch.tensor(array))
        assert ours.tolist() == theirs.tolist() and str(ours.dtype).split(".")[-1] == str(theirs.dtype).split(".")[-1]


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
def test_float32_running_sums_and_products_accumulate_in_float64_as_torch():
    array = np.random.default_rng(6).standard_normal((3, 2000)).astype(np.float32)
    factors = 1.0 + 0.01 * array[:, :300]
    np.testing.assert_array_equal(tg.tensor(array).cumsum(1).numpy(), torch.tensor(array).cumsum(1).numpy())
    np.testing.assert_array_equal(tg.tensor(factors).cumprod(1).numpy(), torch.tensor(factors).cumprod(1).numpy())


@pytest.mark.parametrize("kwargs,shape", [({}, ()), ({"dim": 0}, (3,)), ({"dim": 0, "keepdim": True}, (1, 3)),
                                          ({"dim": 1}, (0,))])
def test_the_empty_product_is_one_and_requires_grad_as_its_input(kwargs, shape):
    x = tg.zeros(0, 3, dtype=tg.float64, requires_grad=True)
    for fn in (lambda x: x.prod(**kwargs), tg.compile(lambda x: x.prod(**kwargs))):
        out = fn(x)
        assert out.requires_grad and out.grad_fn is not None
        np.testing.assert_array_equal(out.detach().numpy(), np.ones(shape))
        (out.sum() * 2).backward()
        assert x.grad.shape == (0, 3) and not x.grad.numpy().any()
        x.grad = None
