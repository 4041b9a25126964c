"""Elementwise ops: forward values against NumPy, gradients against finite differences
(first and second order, float64), and PyTorch's choices at non-differentiable points."""

import math

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck

# inf/nan results are answers, as in PyTorch: NumPy's floating-point warnings must not leak.
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

CHECKS = [pytest.param(gradcheck, id="grad"), pytest.param(gradgradcheck, id="gradgrad")]


def leaf(*shape, positive=False):
    """A float64 leaf that requires grad; `positive` keeps it in [0.5, 2.5] (log, sqrt, ...)."""
    data = np.random.standard_normal(shape)
    if positive:
        data = np.asarray(np.abs(data) % 2.0 + 0.5)
    return tg.from_numpy(data).requires_grad_()


def distinct_leaf(*shape, offset=0.0):
    """A float64 leaf without ties and with |x| >= 0.2: safe for abs, relu, max, ...
    Values are multiples of 0.3 plus `offset`, so leaves with different offsets never tie."""
    n = int(np.prod(shape))
    magnitudes = (np.random.permutation(n) + 1) * 0.3
    signs = np.random.choice([-1.0, 1.0], size=n)
    return tg.from_numpy((magnitudes * signs + offset).reshape(shape)).requires_grad_()


def transposed_leaf(rows, cols, positive=False):
    """A non-contiguous float64 leaf of shape (rows, cols): a transposed NumPy array."""
    data = np.random.standard_normal((cols, rows))
    if positive:
        data = np.abs(data) % 2.0 + 0.5
    return tg.from_numpy(data.T).requires_grad_()


def strided_leaf(rows, cols):
    """A non-contiguous float64 leaf of shape (rows, cols): every other row and column."""
    return tg.from_numpy(np.random.standard_normal((2 * rows, 2 * cols))[::2, ::2]).requires_grad_()


def erf_reference(x):
    return np.vectorize(math.erf)(x)


def sigmoid_reference(x):
    return 1.0 / (1.0 + np.exp(-x))


# name -> (tracegrad function, NumPy reference, needs positive input)
UNARY = {
    "neg": (lambda x: -x, np.negative, False),
    "abs": (lambda x: x.abs(), np.abs, False),
    "exp": (lambda x: x.exp(), np.exp, False),
    "log": (lambda x: x.log(), np.log, True),
    "sqrt": (lambda x: x.sqrt(), np.sqrt, True),
    "rsqrt": (lambda x: x.rsqrt(), lambda x: 1.0 / np.sqrt(x), True),
    "sin": (lambda x: x.sin(), np.sin, False),
    "cos": (lambda x: x.cos(), np.cos, False),
    "tanh": (lambda x: x.tanh(), np.tanh, False),
    "sigmoid": (lambda x: x.sigmoid(), sigmoid_reference, False),
    "erf": (lambda x: x.erf(), erf_reference, False),
    "relu": (lambda x: x.relu(), lambda x: np.maximum(x, 0), False),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", UNARY)
def test_unary_forward_matches_numpy(name, dtype):
    fn, reference, positive = UNARY[name]
    data = np.random.standard_normal((3, 4)).astype(dtype)
    if positive:
        data = np.abs(data) + dtype(0.5)
    out = fn(tg.from_numpy(data))
    assert out.dtype == tg.from_numpy(data).dtype
    tol = 1e-6 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out.numpy(), reference(data.astype(np.float64)), rtol=tol, atol=tol)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", UNARY)
def test_unary_gradients_match_finite_differences(name, check):
    fn, _, positive = UNARY[name]
    x = leaf(2, 3, positive=True) if positive else distinct_leaf(2, 3)
    assert check(fn, (x,))


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", ["exp", "log", "tanh", "abs"])
def test_unary_gradients_on_transposed_input(name, check):
    fn, _, positive = UNARY[name]
    x = transposed_leaf(2, 3, positive=True) if positive or name == "abs" else transposed_leaf(2, 3)
    assert not x.is_contiguous()
    assert check(fn, (x,))


@pytest.mark.parametrize("check", CHECKS)
def test_unary_gradients_on_strided_input(check):
    x = strided_leaf(2, 3)
    assert not x.is_contiguous()
    assert check(lambda t: t.sin() * t, (x,))


def test_integer_input_to_float_unary_op_gives_float32():
    out = tg.tensor([1, 2, 3]).exp()
    assert out.dtype == tg.float32
    np.testing.assert_allclose(out.numpy(), np.exp([1.0, 2.0, 3.0]), rtol=1e-6)


def test_sigmoid_of_large_magnitudes_does_not_overflow():
    x = tg.tensor(np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0]))
    out = x.sigmoid().numpy()
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, [0.0, sigmoid_reference(-50.0), 0.5, 1.0, 1.0], atol=1e-15)


@pytest.mark.parametrize("dtype", [tg.float32, tg.float64, tg.float16])
def test_sigmoid_is_within_three_ulps_wherever_the_true_value_is_a_normal_number(dtype):
    finfo = np.finfo(dtype.np)
    x = np.concatenate([np.linspace(-800.0, 800.0, 40001), [np.inf, -np.inf, np.nan]]).astype(dtype.np)
    got = tg.tensor(x).sigmoid().numpy()
    exact = 1.0 / (1.0 + np.exp(-x.astype(np.longdouble)))
    normal = exact >= finfo.smallest_normal
    ulp = np.spacing(exact[normal].astype(dtype.np)).astype(np.longdouble)
    assert np.all(np.abs(got[normal] - exact[normal]) <= 3 * ulp)  # (exp's error, scaled: 2.3 ulps at most)
    assert np.all((got[~normal & ~np.isnan(x)] >= 0) & (got[~normal & ~np.isnan(x)] < finfo.smallest_normal))
    assert got[-3] == 1.0 and got[-2] == 0.0 and np.isnan(got[-1]) and got.dtype == dtype.np
    for value in (-3.0, 0.0, 100.0):  # (0-d: NumPy gives its exp a scalar)
        zero_d = tg.tensor(value, dtype=dtype).sigmoid()
        assert zero_d.shape == () and zero_d.dtype is dtype
        np.testing.assert_allclose(zero_d.item(), 1 / (1 + np.exp(-value)), rtol=2e-3)


def test_erf_matches_math_erf_across_its_range():
    data = np.array([-40.0, -6.0, -2.5, -1.0, -0.3, 0.0, 1e-8, 0.7, 1.0, 3.0, 9.0, np.inf])
    np.testing.assert_allclose(tg.tensor(data).erf().numpy(), erf_reference(data), rtol=1e-14, atol=1e-15)


# --- binary arithmetic ---------------------------------------------------------------------

BINARY = {
    "add": (lambda a, b: a + b, np.add),
    "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply),
    "div": (lambda a, b: a / b, np.divide),
    "pow": (lambda a, b: a ** b, np.power),
    "maximum": (tg.maximum, np.maximum),
    "minimum": (tg.minimum, np.minimum),
}
BROADCAST_SHAPES = [((2, 3), (2, 3)), ((2, 3), (3,)), ((2, 1), (1, 3)), ((3,), (2, 3)), ((2, 3), ())]


def binary_operands(name, shape_a, shape_b):
    if name in ("div", "pow"):  # positive base; denominator away from zero
        return leaf(*shape_a, positive=True), leaf(*shape_b, positive=True)
    return distinct_leaf(*shape_a), distinct_leaf(*shape_b, offset=0.1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=str)
@pytest.mark.parametrize("name", BINARY)
def test_binary_forward_broadcasts_like_numpy(name, shapes, dtype):
    fn, reference = BINARY[name]
    a, b = (np.asarray(np.abs(np.random.standard_normal(s)) + 0.5, dtype=dtype) for s in shapes)
    out = fn(tg.from_numpy(a), tg.from_numpy(b))
    expected = reference(a, b)
    assert out.shape == expected.shape
    assert out.dtype.np == np.dtype(dtype)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=str)
@pytest.mark.parametrize("name", BINARY)
def test_binary_gradients_with_broadcasting(name, shapes, check):
    fn, _ = BINARY[name]
    assert check(fn, binary_operands(name, *shapes))


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", BINARY)
def test_binary_gradients_on_non_contiguous_operands(name, check):
    fn, _ = BINARY[name]
    a = transposed_leaf(2, 3, positive=True)
    b = strided_leaf(2, 3) if name not in ("div", "pow") else transposed_leaf(2, 3, positive=True)
    assert check(fn, (a, b))


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("fn", [lambda x: x + 2.5, lambda x: 2.5 - x, lambda x: x * -1.5, lambda x: 3.0 / x,
                                lambda x: x / 4.0, lambda x: x ** 3, lambda x: x ** 0.5, lambda x: 2.0 ** x],
                         ids=["add", "rsub", "mul", "rdiv", "div", "pow_int", "pow_half", "rpow"])
def test_gradients_with_python_scalar_operand(fn, check):
    assert check(fn, (leaf(2, 3, positive=True),))


def test_sub_and_add_alpha_scale_the_other_operand():
    a, b = np.random.standard_normal((2, 3)), np.random.standard_normal((2, 3))
    np.testing.assert_allclose(tg.sub(tg.tensor(a), tg.tensor(b), alpha=2).numpy(), a - 2 * b)
    np.testing.assert_allclose(tg.add(tg.tensor(a), tg.tensor(b), alpha=3).numpy(), a + 3 * b)


def test_pow_gradient_with_respect_to_zero_exponent_is_zero():
    x = tg.tensor(np.array([0.0, 2.0]), requires_grad=True)
    (x ** 0.0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0])


def test_pow_gradient_with_respect_to_exponent_at_zero_base_is_zero():
    base = tg.tensor(np.array([0.0, 0.0]))
    exponent = tg.tensor(np.array([2.0, 3.0]), requires_grad=True)
    (base ** exponent).sum().backward()
    np.testing.assert_array_equal(exponent.grad.numpy(), [0.0, 0.0])


# --- PyTorch's choices at non-differentiable points ---------------------------------------------


def grad_of(fn, data):
    x = tg.tensor(np.asarray(data, dtype=np.float64), requires_grad=True)
    fn(x).sum().backward()
    return x.grad.numpy()


def test_relu_gradient_at_zero_is_zero():
    np.testing.assert_array_equal(grad_of(lambda x: x.relu(), [-1.0, 0.0, 2.0]), [0.0, 0.0, 1.0])


def test_abs_gradient_at_zero_is_zero():
    np.testing.assert_array_equal(grad_of(lambda x: x.abs(), [-1.0, 0.0, 2.0]), [-1.0, 0.0, 1.0])


@pytest.mark.parametrize("op", [tg.maximum, tg.minimum], ids=["maximum", "minimum"])
def test_maximum_and_minimum_ties_split_the_gradient_in_half(op):
    a = tg.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    b = tg.tensor(np.array([1.0, 5.0, 0.0]), requires_grad=True)
    op(a, b).sum().backward()
    a_wins = [0.5, 0.0, 1.0] if op is tg.maximum else [0.5, 1.0, 0.0]
    np.testing.assert_array_equal(a.grad.numpy(), a_wins)
    np.testing.assert_array_equal(b.grad.numpy(), 1.0 - np.array(a_wins))


def test_clamp_passes_the_gradient_at_the_bounds_and_blocks_it_outside():
    grad = grad_of(lambda x: x.clamp(-1.0, 1.0), [-2.0, -1.0, 0.0, 1.0, 2.0])
    np.testing.assert_array_equal(grad, [0.0, 1.0, 1.0, 1.0, 0.0])


# --- clamp and where ---------------------------------------------------------------------------


@pytest.mark.parametrize("bounds", [(-0.5, 0.5), (-0.5, None), (None, 0.5)], ids=str)
def test_clamp_forward_matches_numpy_clip(bounds):
    data = np.random.standard_normal((3, 4))
    low, high = bounds
    out = tg.tensor(data).clamp(low, high)
    np.testing.assert_array_equal(out.numpy(), np.clip(data, low, high))


@pytest.mark.parametrize("check", CHECKS)
def test_clamp_gradients_away_from_the_bounds(check):
    x = tg.from_numpy(np.array([[-1.7, -0.3, 0.2], [0.45, 0.9, 2.1]])).requires_grad_()
    assert check(lambda t: t.clamp(-0.5, 0.5), (x,))


@pytest.mark.parametrize("check", CHECKS)
def test_clamp_with_tensor_bounds_differentiates_both(check):
    x = distinct_leaf(2, 3)
    low = tg.from_numpy(x.detach().numpy() + np.array([0.1, -0.1, 0.1])).requires_grad_()
    assert check(lambda t, lo: t.clamp(lo, None), (x, low))


def test_clamp_keeps_nan():
    out = tg.tensor([float("nan"), 3.0]).clamp(0.0, 1.0).numpy()
    assert np.isnan(out[0]) and out[1] == 1.0


NAN = float("nan")


def grads_eager_and_compiled(fn, *data):
    """fn's value and its inputs' gradients (of the sum), eagerly and compiled."""
    def step(*inputs):
        out = fn(*inputs)
        out.sum().backward()
        return out

    results = []
    for run in (step, tg.compile(step)):
        inputs = [tg.tensor(np.asarray(d, dtype=np.float64), requires_grad=True) for d in data]
        value = run(*inputs)
        results.append([value.detach().numpy()] + [x.grad.numpy() for x in inputs])
    return results


def assert_value_and_grads(fn, data, expected):
    for results in grads_eager_and_compiled(fn, *data):
        for got, want in zip(results, expected):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", [tg.maximum, tg.minimum], ids=["maximum", "minimum"])
def test_maximum_and_minimum_send_the_whole_gradient_to_both_operands_at_nan(op):
    # PyTorch's rule: a NaN is neither a tie nor a loss for either operand.
    assert_value_and_grads(op, ([NAN, 1.0, NAN], [1.0, NAN, NAN]),
                           [[NAN, NAN, NAN], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])


CLAMP_AT_NAN = {  # bounds -> (value, gradient) at [nan, 1, -1, 3]
    (0.0, 2.0): ([NAN, 1.0, 0.0, 2.0], [0.0, 1.0, 0.0, 0.0]),
    (0.0, None): ([NAN, 1.0, 0.0, 3.0], [0.0, 1.0, 0.0, 1.0]),
    (None, 2.0): ([NAN, 1.0, -1.0, 2.0], [0.0, 1.0, 1.0, 0.0]),
}


@pytest.mark.parametrize("bounds", CLAMP_AT_NAN, ids=str)
def test_clamp_sends_no_gradient_at_nan(bounds):
    low, high = bounds
    assert_value_and_grads(lambda x: x.clamp(low, high), ([NAN, 1.0, -1.0, 3.0],), CLAMP_AT_NAN[bounds])


def test_clamp_with_a_nan_tensor_bound_gives_nan_and_no_gradient():
    assert_value_and_grads(lambda x, low, high: x.clamp(low, high),
                           ([1.0, 0.0, -1.0, 3.0], [NAN, 0.0, 0.0, 0.0], [2.0, NAN, 2.0, 2.0]),
                           [[NAN, NAN, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0],
                            [0.0, 0.0, 0.0, 1.0]])


def test_sign_of_nan_is_zero_and_abs_sends_it_no_gradient():
    assert_value_and_grads(lambda x: x.sign(), ([NAN, -0.0, 2.0, -3.0],), [[0.0, 0.0, 1.0, -1.0]])
    assert_value_and_grads(lambda x: x.abs(), ([NAN, -0.0, 2.0, -3.0],),
                           [[NAN, 0.0, 2.0, 3.0], [0.0, 0.0, 1.0, -1.0]])


def test_clamp_without_bounds_raises():
    with pytest.raises(RuntimeError, match="clamp: At least one of 'min' or 'max'"):
        tg.tensor([1.0]).clamp()


def test_where_forward_selects_and_broadcasts():
    cond = np.array([True, False, True])
    a, b = np.random.standard_normal((2, 3)), np.random.standard_normal((2, 1))
    out = tg.where(tg.tensor(cond), tg.tensor(a), tg.tensor(b))
    np.testing.assert_array_equal(out.numpy(), np.where(cond, a, b))


@pytest.mark.parametrize("check", CHECKS)
def test_where_gradients_flow_to_the_selected_operand(check):
    a, b = leaf(2, 3), leaf(3)
    cond = tg.tensor(np.array([[True, False, True], [False, False, True]]))
    assert check(lambda x, y: tg.where(cond, x, y), (a, b))


@pytest.mark.parametrize("check", CHECKS)
def test_where_of_0d_operands_takes_the_shape_of_its_condition(check):
    """The op itself (not `tg.where`, which broadcasts first): 0-d operands and a shaped
    condition give the condition's shape, and each operand's gradient sums over it."""
    from tracegrad.ops import elementwise
    cond = tg.tensor([True, False, True])
    x, y = leaf(), leaf()
    out = elementwise.where(cond, x, y)
    assert out.shape == (3,)
    np.testing.assert_array_equal(out.detach().numpy(), np.where(cond.numpy(), x.item(), y.item()))
    assert check(lambda s, t: elementwise.where(cond, s, t) * 1.5, (x, y))


def test_where_with_python_scalar_keeps_tensor_dtype():
    out = tg.where(tg.tensor([True, False]), tg.tensor([1.0, 2.0]), 0.0)
    assert out.dtype == tg.float32
    np.testing.assert_array_equal(out.numpy(), [1.0, 0.0])


# --- comparisons -------------------------------------------------------------------------------

COMPARISONS = {
    "lt": (lambda a, b: a < b, np.less), "le": (lambda a, b: a <= b, np.less_equal),
    "gt": (lambda a, b: a > b, np.greater), "ge": (lambda a, b: a >= b, np.greater_equal),
    "eq": (lambda a, b: a == b, np.equal), "ne": (lambda a, b: a != b, np.not_equal),
}


@pytest.mark.parametrize("name", COMPARISONS)
def test_comparison_returns_bool_matching_numpy(name):
    fn, reference = COMPARISONS[name]
    a = np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    b = np.array([2.0, 2.0, 2.0])
    out = fn(tg.tensor(a), tg.tensor(b))
    assert out.dtype == tg.bool
    np.testing.assert_array_equal(out.numpy(), reference(a, b))


@pytest.mark.parametrize("name", COMPARISONS)
def test_comparison_of_tensors_requiring_grad_carries_no_grad(name):
    fn, _ = COMPARISONS[name]
    out = fn(leaf(2, 3), leaf(2, 3))
    assert not out.requires_grad
    assert out.grad_fn is None


def test_comparison_with_python_scalar():
    np.testing.assert_array_equal((tg.tensor([1, 2, 3]) > 1.5).numpy(), [False, True, True])


def test_isnan_and_isinf():
    x = tg.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    np.testing.assert_array_equal(x.isnan().numpy(), [False, True, False, False])
    np.testing.assert_array_equal(x.isinf().numpy(), [False, False, True, True])


def test_logical_ops_on_bool_tensors():
    a, b = tg.tensor([True, True, False]), tg.tensor([True, False, False])
    np.testing.assert_array_equal((a & b).numpy(), [True, False, False])
    np.testing.assert_array_equal((a | b).numpy(), [True, True, False])
    np.testing.assert_array_equal((~a).numpy(), [False, False, True])
