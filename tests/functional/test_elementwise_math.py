"""`functional/elementwise_math.py`: the composites (logaddexp, xlogy, lerp, addcmul,
addcdiv, sinc, logit, nan_to_num, ...) in one CASES table run through gradcheck and
gradgradcheck (float64, normal and transposed inputs), compiled equal to eager and
PyTorch; then the predicates, comparisons, in-place forms, promotion and errors."""

import math

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

CHECKS = [pytest.param(gradcheck, id="grad"), pytest.param(gradgradcheck, id="gradgrad")]


def _away_from_integers(rng, shape):
    return rng.integers(-3, 3, shape) + rng.uniform(0.2, 0.8, shape)


def _unit(rng, shape):
    return rng.uniform(0.1, 0.9, shape)


def _positive(rng, shape):
    return rng.uniform(0.3, 2.0, shape)


def _normal(rng, shape):
    return rng.standard_normal(shape)


# name -> (function of a module `m` and float64 inputs, [(shape, values)] per input); the
# same text runs with PyTorch as `m`.
CASES = {
    "logaddexp": (lambda m, a, b: m.logaddexp(a, b), [((3, 4), _normal), ((4,), _normal)]),
    "logaddexp2": (lambda m, a, b: a.logaddexp2(b * 3.0), [((3, 4), _normal), ((3, 4), _normal)]),
    "xlogy": (lambda m, a, b: m.xlogy(a, b), [((3, 4), _normal), ((3, 4), _positive)]),
    "xlogy_scalar_first": (lambda m, b: m.xlogy(2.5, b) * b, [((3, 4), _positive)]),
    "float_power": (lambda m, a, b: m.float_power(a, b), [((3, 4), _positive), ((4,), _normal)]),
    "float_power_scalar": (lambda m, a: a.float_power(2.5), [((3, 4), _positive)]),
    "true_divide": (lambda m, a, b: m.true_divide(a, b), [((3, 4), _normal), ((3, 1), _positive)]),
    "frac": (lambda m, a: m.frac(a) * a, [((3, 4), _away_from_integers)]),
    "deg2rad": (lambda m, a: m.deg2rad(a) * a, [((3, 4), _normal)]),
    "rad2deg": (lambda m, a: a.rad2deg(), [((3, 4), _normal)]),
    "sinc": (lambda m, a: m.sinc(a) * a, [((3, 4), _normal)]),
    "logit": (lambda m, a: m.logit(a), [((3, 4), _unit)]),
    "logit_eps": (lambda m, a: a.logit(eps=0.25) * a, [((3, 4), _unit)]),
    "negative": (lambda m, a: m.negative(a) * a, [((3, 4), _normal)]),
    "positive": (lambda m, a: m.positive(a) * a, [((3, 4), _normal)]),
    "sgn": (lambda m, a: m.sgn(a) * a, [((3, 4), _normal)]),
    "nan_to_num": (lambda m, a: m.nan_to_num(m.log(a), nan=0.5) * a, [((3, 4), _normal)]),
    "clamp_min": (lambda m, a: m.clamp_min(a, 0.1) * a, [((3, 4), _normal)]),
    "clamp_max": (lambda m, a, b: a.clamp_max(b), [((3, 4), _normal), ((4,), _normal)]),
    "lerp_scalar_small": (lambda m, a, b: m.lerp(a, b, 0.3), [((3, 4), _normal), ((4,), _normal)]),
    "lerp_scalar_large": (lambda m, a, b: a.lerp(b, 0.8), [((3, 4), _normal), ((3, 4), _normal)]),
    "lerp_tensor": (lambda m, a, b, w: m.lerp(a, b, w * 2.0), [((3, 4), _normal), ((3, 4), _normal),
                                                                 ((4,), _unit)]),
    "addcmul": (lambda m, a, b, c: m.addcmul(a, b, c, value=0.5), [((3, 4), _normal), ((4,), _normal),
                                                                     ((3, 1), _normal)]),
    "addcdiv": (lambda m, a, b, c: a.addcdiv(b, c, value=-2.0), [((3, 4), _normal), ((3, 4), _normal),
                                                                   ((4,), _positive)]),
    "addcdiv_default_value": (lambda m, a, b, c: m.addcdiv(a, b, c), [((4,), _normal), ((3, 4), _normal),
                                                                       ((3, 4), _positive)]),
    # (PyTorch has no derivative for heaviside, even towards values: its input is detached)
    "heaviside": (lambda m, a: m.heaviside(m.round(a).detach(), m.ones_like(a) * 0.5) * a, [((3, 4), _normal)]),
    "polygamma_method": (lambda m, a: a.polygamma(2) * a, [((3, 4), _positive)]),
    "erfc_erfinv": (lambda m, a: m.erfinv(m.erfc(a) - 1.0), [((3, 4), _positive)]),
}


def _arrays(specs, seed=1, transposed=False):
    rng = np.random.default_rng(seed)
    arrays = []
    for shape, values in specs:
        swap = transposed and len(shape) == 2
        data = values(rng, shape[::-1] if swap else shape)
        arrays.append(data.T if swap else data)
    return arrays


def _leaves(specs, seed=1, transposed=False):
    return [tg.from_numpy(a).requires_grad_() for a in _arrays(specs, seed, transposed)]


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", CASES)
def test_gradients_match_finite_differences(name, check):
    fn, specs = CASES[name]
    assert check(lambda *xs: fn(tg, *xs), tuple(_leaves(specs)))


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", CASES)
def test_gradients_on_transposed_inputs(name, check):
    fn, specs = CASES[name]
    inputs = _leaves(specs, seed=2, transposed=True)
    assert any(not x.is_contiguous() for x in inputs)
    assert check(lambda *xs: fn(tg, *xs), tuple(inputs))


@pytest.mark.parametrize("name", CASES)
def test_compiled_values_and_gradients_equal_eager(name):
    fn, specs = CASES[name]

    def step(*xs):
        out = fn(tg, *xs)
        return out, tg.autograd.grad((out * out).sum(), list(xs))

    compiled = tg.compile(step)
    eager_out, eager_grads = step(*_leaves(specs, seed=3))
    for _ in range(2):  # traced, then a call following the recording
        out, grads = compiled(*_leaves(specs, seed=3))
        np.testing.assert_allclose(out.detach().numpy(), eager_out.detach().numpy(), rtol=1e-12, atol=1e-12)
        for got, want in zip(grads, eager_grads):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(0, 4), (1, 1)], ids=str)
@pytest.mark.parametrize("name", CASES)
def test_size_zero_and_size_one_dims_eager_and_compiled(name, shape):
    fn, specs = CASES[name]
    specs = [(shape if len(s) == 2 else shape[-1:], values) for s, values in specs]

    def step(*xs):
        out = fn(tg, *xs)
        return (out, *tg.autograd.grad(out.sum(), list(xs), allow_unused=True))

    eager = step(*_leaves(specs, seed=4))
    compiled = tg.compile(step)(*_leaves(specs, seed=4))
    assert eager[0].shape == shape
    for got, want in zip(compiled, eager):
        assert (got is None) == (want is None)
        if got is not None:
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-12)


# --- values at the edges --------------------------------------------------------------------


def test_logaddexp_handles_infinities_and_large_gaps_as_numpy():
    inf = float("inf")
    a = np.array([-inf, inf, -inf, 1000.0, -1000.0, 3.0, np.nan])
    b = np.array([-inf, inf, 2.0, 999.0, -1001.0, 3.0, 1.0])
    with np.errstate(invalid="ignore"):  # (NumPy's own warning at -inf, -inf)
        want, want2 = np.logaddexp(a, b), np.logaddexp2(a, b)
    np.testing.assert_array_equal(tg.logaddexp(tg.tensor(a), tg.tensor(b)).numpy()[[0, 1, 2, 6]], want[[0, 1, 2, 6]])
    np.testing.assert_allclose(tg.logaddexp(tg.tensor(a), tg.tensor(b)).numpy(), want, rtol=1e-15)
    np.testing.assert_allclose(tg.logaddexp2(tg.tensor(a), tg.tensor(b)).numpy(), want2, rtol=1e-15)


def test_logaddexp_of_equal_operands_splits_the_gradient():
    a, b = tg.tensor([2.0], requires_grad=True), tg.tensor([2.0], requires_grad=True)
    tg.logaddexp(a, b).backward()
    assert a.grad.item() == b.grad.item() == 0.5


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_xlogy_is_zero_where_x_is_zero_unless_y_is_nan_with_pytorchs_gradients(compiled):
    """d/dx is log(y) at x = 0 too (x log y is linear in x), 0 where x = 0 and y <= 0; d/dy
    is g x / y (0 / 0 at x = y = 0). The composite selecting 0 at x = 0 gave d/dx 0 there:
    a wrong gradient, found by the fuzzer with the PyTorch oracle (seed 84871665)."""
    x = tg.tensor([0.0, 0.0, 0.0, 2.0, 0.0, 0.0, -0.0], dtype=tg.float64, requires_grad=True)
    y = tg.tensor([0.0, np.nan, 3.0, 0.0, -1.0, np.inf, 2.0], dtype=tg.float64, requires_grad=True)
    fn = tg.compile(tg.xlogy) if compiled else tg.xlogy
    for _ in range(2 if compiled else 1):
        x.grad = y.grad = None
        out = fn(x, y)
        out.backward(tg.tensor([1.0, 1.0, 2.0, 1.0, 1.0, 1.0, 0.0], dtype=tg.float64))
    np.testing.assert_array_equal(out.detach().numpy(), [0.0, np.nan, 0.0, -np.inf, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(x.grad.numpy(), [0.0, np.nan, 2 * np.log(3.0), -np.inf, 0.0, np.inf, 0.0],
                               rtol=1e-15)
    np.testing.assert_array_equal(y.grad.numpy(), [np.nan, np.nan, 0.0, np.inf, -0.0, 0.0, 0.0])


@pytest.mark.parametrize("check", [gradcheck, gradgradcheck], ids=["grad", "gradgrad"])
def test_xlogy_gradients_match_finite_differences_with_zeros_in_x_and_broadcasting(check):
    x = tg.tensor([[0.0, 0.7, -1.2], [0.0, 0.0, 2.0]], dtype=tg.float64, requires_grad=True)
    y = tg.tensor([0.5, 1.5, 2.5], dtype=tg.float64, requires_grad=True)
    assert check(lambda a, b: tg.xlogy(a, b) * (b + 1.0), (x, y))


def test_sinc_is_one_at_zero_with_a_zero_gradient():
    x = tg.tensor([0.0, 0.5, 1.0], dtype=tg.float64, requires_grad=True)
    out = tg.sinc(x)
    np.testing.assert_allclose(out.detach().numpy(), np.sinc(x.detach().numpy()), rtol=1e-15, atol=1e-16)
    out.sum().backward()
    assert x.grad[0].item() == 0.0 and x.grad[2].item() == pytest.approx(-1.0)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("dtype", [tg.float32, tg.float64], ids=["float32", "float64"])
def test_sinc_gradient_near_zero_has_no_cancellation(dtype, compiled):
    """d/dx sinc = pi (u cos u - sin u) / u^2 (u = pi x) cancels as x shrinks: float32 gave
    -0.0061 at 1e-5 (true -3.3e-5) and -inf at 1e-30; below |u| = 0.5 it is the series."""
    points = np.array([1e-30, 1e-20, 1e-10, 1e-5, -1e-3, 0.1, 0.15, 0.2, -0.5, 2.0])
    u = np.pi * points
    # (the true derivative: the series where the quotient cancels, in float64 to the last term)
    series = sum((-1) ** k * 2 * k * u ** (2 * k - 1) / math.factorial(2 * k + 1) for k in range(1, 12))
    true = np.pi * np.where(np.abs(u) < 0.5, series, (u * np.cos(u) - np.sin(u)) / (u * u))
    x = tg.tensor(points, dtype=dtype, requires_grad=True)
    fn = tg.compile(tg.sinc) if compiled else tg.sinc
    for _ in range(2 if compiled else 1):
        x.grad = None
        fn(x).sum().backward()
    tolerance = 2e-6 if dtype is tg.float32 else 1e-14
    np.testing.assert_allclose(x.grad.numpy(), true, rtol=tolerance, atol=0)


@pytest.mark.parametrize("check", [gradcheck, gradgradcheck], ids=["grad", "gradgrad"])
def test_sinc_gradients_match_finite_differences_on_both_sides_of_the_series(check):
    x = tg.tensor([0.0, 0.05, -0.15, 0.159, 0.16, 0.3, -1.2], dtype=tg.float64, requires_grad=True)
    assert check(lambda t: tg.sinc(t) * (t + 2.0), (x,))


def test_logit_with_eps_clamps_and_zeroes_the_gradient_outside():
    p = tg.tensor([0.0, 0.5, 1.0, 0.05], dtype=tg.float64, requires_grad=True)
    out = tg.logit(p, eps=0.1)
    np.testing.assert_allclose(out.detach().numpy(), [math.log(1 / 9), 0.0, math.log(9), math.log(1 / 9)])
    out.sum().backward()
    assert p.grad.tolist() == [0.0, 4.0, 0.0, 0.0]
    assert tg.logit(tg.tensor([0.0, 1.0])).tolist() == [-math.inf, math.inf]


def test_nan_to_num_defaults_to_the_dtypes_extremes_and_zeroes_replaced_gradients():
    x = tg.tensor([np.nan, np.inf, -np.inf, 1.5], requires_grad=True)
    out = x.nan_to_num()
    info = np.finfo(np.float32)
    assert out.tolist() == [0.0, float(info.max), float(info.min), 1.5]
    assert tg.nan_to_num(x, nan=1.0, posinf=2.0, neginf=-2.0).tolist() == [1.0, 2.0, -2.0, 1.5]
    out.sum().backward()
    assert x.grad.tolist() == [0.0, 0.0, 0.0, 1.0]
    ints = tg.tensor([1, 2])
    assert tg.nan_to_num(ints).tolist() == [1, 2] and tg.nan_to_num(ints) is not ints


def test_frac_keeps_the_sign_and_deg2rad_rad2deg_invert_each_other():
    assert tg.frac(tg.tensor([1.25, -1.25, 3.0])).tolist() == [0.25, -0.25, 0.0]
    x = tg.tensor([90.0, -45.0, 0.0], dtype=tg.float64)
    np.testing.assert_allclose(tg.deg2rad(x).numpy(), [np.pi / 2, -np.pi / 4, 0.0], rtol=1e-15)
    np.testing.assert_allclose(tg.rad2deg(tg.deg2rad(x)).numpy(), x.numpy(), rtol=1e-15)


def test_lerp_hits_both_ends_exactly_and_accepts_a_weight_tensor():
    a, b = tg.tensor([1.0, -3.0]), tg.tensor([7.0, 0.1])
    assert tg.lerp(a, b, 0.0).tolist() == a.tolist() and tg.lerp(a, b, 1.0).tolist() == b.tolist()
    assert tg.lerp(a, b, tg.tensor([0.0, 1.0])).tolist() == [1.0, b.tolist()[1]]
    assert tg.lerp(a, b, 2).tolist() == [13.0, pytest.approx(3.2)]


def test_heaviside_takes_values_at_zero_and_zero_at_nan():
    x = tg.tensor([-1.5, 0.0, 2.0, np.nan])
    assert tg.heaviside(x, tg.tensor(0.5)).tolist() == [0.0, 0.5, 1.0, 0.0]
    assert tg.heaviside(tg.tensor([-2, 0, 3]), tg.tensor([7])).tolist() == [0, 7, 1]


def test_float_power_computes_in_float64_even_from_integers():
    out = tg.float_power(tg.tensor([2]), tg.tensor([-1]))
    assert out.dtype is tg.float64 and out.tolist() == [0.5]
    assert tg.float_power(tg.tensor([3.0]), 2).dtype is tg.float64


def test_addcmul_addcdiv_promote_and_keep_integers_integer():
    ints = tg.tensor([5, -5, 3])
    assert tg.addcmul(ints, ints, ints).tolist() == [30, 20, 12]
    assert tg.addcmul(ints, ints, tg.tensor([1.5, 1.5, 1.5])).dtype is tg.float32
    assert tg.addcdiv(ints, ints, tg.tensor([2.0, 2.0, 2.0])).tolist() == [7.5, -7.5, 4.5]


# --- predicates and comparisons ---------------------------------------------------------------


def test_predicates_on_floats_integers_and_bools():
    x = tg.tensor([1.0, np.inf, -np.inf, np.nan, -0.0])
    assert tg.isfinite(x).tolist() == [True, False, False, False, True]
    assert x.isposinf().tolist() == [False, True, False, False, False]
    assert tg.isneginf(x).tolist() == [False, False, True, False, False]
    assert x.isnan().tolist() == tg.isnan(x).tolist() == [False, False, False, True, False]
    assert x.isinf().tolist() == tg.isinf(x).tolist() == [False, True, True, False, False]
    assert tg.sgn(x).tolist()[:3] == [1.0, 1.0, -1.0] and tg.sgn(x).tolist()[3:] == [0.0, 0.0]
    for ints in (tg.tensor([1, -2]), tg.tensor([True, False])):
        assert tg.isfinite(ints).tolist() == [True, True]
        assert tg.isposinf(ints).tolist() == tg.isneginf(ints).tolist() == [False, False]
        assert tg.isinf(ints).tolist() == tg.isnan(ints).tolist() == [False, False]
    assert tg.sgn(tg.tensor([True, False])).tolist() == [True, False]


def test_predicates_compiled_equal_eager():
    x = tg.tensor([1.0, np.inf, -np.inf, np.nan, -0.0])
    for fn in (tg.isfinite, tg.isposinf, tg.isneginf, tg.signbit, tg.sgn):
        compiled = tg.compile(lambda t, fn=fn: fn(t * 1.0))
        np.testing.assert_array_equal(compiled(x).numpy(), fn(x).numpy())


def test_isclose_follows_pytorchs_rule_for_infinities_nans_and_tolerances():
    nan, inf = float("nan"), float("inf")
    a = tg.tensor([1.0, 1.0, inf, inf, nan, 100.0], dtype=tg.float64)
    b = tg.tensor([1.0 + 1e-9, 1.1, inf, -inf, nan, 100.001], dtype=tg.float64)
    assert tg.isclose(a, b).tolist() == [True, False, True, False, False, True]
    assert a.isclose(b, equal_nan=True).tolist()[4] is True
    assert tg.isclose(a, b, rtol=0, atol=0).tolist() == [False, False, True, False, False, False]
    assert tg.isclose(tg.tensor([1, 2]), tg.tensor([1, 3]), rtol=0.5, atol=0).tolist() == [True, True]
    assert tg.allclose(a[:1], b[:1]) is True and a.allclose(b) is False
    assert tg.allclose(a, b, rtol=0.01, equal_nan=True) is False  # inf vs -inf


def test_isclose_broadcasts_and_is_never_differentiable():
    a = tg.tensor([[1.0], [2.0]], requires_grad=True)
    out = tg.isclose(a, tg.tensor([1.0, 2.0]))
    assert out.shape == (2, 2) and not out.requires_grad
    assert out.tolist() == [[True, False], [False, True]]


def test_equal_needs_the_same_shape_and_values_across_dtypes():
    a = tg.tensor([5, -5, 3])
    assert tg.equal(a, a.double()) is True and a.equal(a) is True
    assert tg.equal(a, a[:2]) is False and tg.equal(a[None], a) is False
    assert tg.equal(tg.tensor([np.nan]), tg.tensor([np.nan])) is False


def test_names_are_the_same_functions_as_methods_and_aliases():
    x = tg.tensor([0.5, -2.0])
    assert tg.clip is tg.clamp and x.clip(0.0).tolist() == tg.clamp_min(x, 0.0).tolist()
    assert tg.arctan2(x, x).tolist() == x.atan2(x).tolist()
    assert tg.positive(x) is x and x.negative().tolist() == [-0.5, 2.0]


# --- in-place forms ---------------------------------------------------------------------------

# name -> (arguments after self, the out-of-place function)
IN_PLACE = {
    "lerp": ((tg.tensor([2.0, 4.0, 6.0], dtype=tg.float64), 0.25), tg.lerp),
    "addcmul": ((tg.tensor([2.0, 4.0, 6.0], dtype=tg.float64), tg.tensor(3.0, dtype=tg.float64)), tg.addcmul),
    "addcdiv": ((tg.tensor([2.0, 4.0, 6.0], dtype=tg.float64), tg.tensor(3.0, dtype=tg.float64)), tg.addcdiv),
    "xlogy": ((tg.tensor([2.0, 4.0, 6.0], dtype=tg.float64),), tg.xlogy),
    "clamp_min": ((0.3,), tg.clamp_min),
    "clamp_max": ((0.3,), tg.clamp_max),
    "logit": ((), tg.logit),
    "sinc": ((), tg.sinc),
    "frac": ((), tg.frac),
    "deg2rad": ((), tg.deg2rad),
    "rad2deg": ((), tg.rad2deg),
    "negative": ((), tg.negative),
    "sgn": ((), tg.sgn),
    "nan_to_num": ((), tg.nan_to_num),
    "true_divide": ((2.0,), tg.true_divide),
    "float_power": ((2.0,), tg.float_power),
}


@pytest.mark.parametrize("name", IN_PLACE)
def test_in_place_form_on_a_non_leaf_writes_and_differentiates(name):
    args, fn = IN_PLACE[name]
    data = np.array([0.2, 0.45, 0.7])
    x = tg.tensor(data, requires_grad=True)
    y = x * 1.0
    assert getattr(y, name + "_")(*args) is y and y._version == 1
    want = fn(tg.tensor(data), *args)
    np.testing.assert_array_equal(y.detach().numpy(), want.numpy())
    y.sum().backward()
    x_ref = tg.tensor(data, requires_grad=True)
    fn(x_ref, *args).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), x_ref.grad.numpy())


def test_heaviside_in_place_writes_and_sends_the_gradient_to_the_values_at_zeros():
    x = tg.tensor([-1.0, 0.0, 2.0, 0.0], dtype=tg.float64)
    values = tg.tensor([0.5], dtype=tg.float64, requires_grad=True)
    assert x.heaviside_(values) is x and x.tolist() == [0.0, 0.5, 1.0, 0.5]
    x.sum().backward()
    assert values.grad.tolist() == [2.0]  # PyTorch has no derivative for heaviside


def test_in_place_on_a_leaf_that_requires_grad_raises_before_any_change():
    x = tg.tensor([0.5, 0.25], requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
        x.lerp_(tg.ones(2), 0.5)
    assert x.tolist() == [0.5, 0.25] and x._version == 0


def test_float_power_in_place_needs_a_float64_tensor():
    with pytest.raises(RuntimeError, match="the base given to float_power_ has dtype Float but the operation's "
                                           "result requires dtype Double"):
        tg.tensor([2.0]).float_power_(2)


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize("call, error, message", [
    (lambda: tg.frac(tg.tensor([1])), NotImplementedError, "\"frac\" not implemented for 'Long'"),
    (lambda: tg.logaddexp(tg.tensor([1]), tg.tensor([1])), NotImplementedError,
     "\"logaddexp\" not implemented for 'Long'"),
    (lambda: tg.lerp(tg.tensor([1]), tg.tensor([1]), 0.5), NotImplementedError, "\"lerp\" not implemented"),
    (lambda: tg.lerp(tg.ones(2), tg.ones(2, dtype=tg.float64), 0.5), RuntimeError,
     "lerp: expected dtype float32 for `end` but got dtype float64"),
    (lambda: tg.lerp(tg.ones(2), tg.ones(2), tg.ones(2, dtype=tg.float64)), RuntimeError,
     "lerp: expected dtype float32 for `weight` but got dtype float64"),
    (lambda: tg.lerp(tg.ones(2), tg.ones(3), 0.5), RuntimeError, r"lerp: shapes \[2\], \[3\] cannot be broadcast"),
    (lambda: tg.addcdiv(tg.ones(2), tg.tensor([1, 2]), tg.tensor([1, 2])), RuntimeError,
     "Integer division with addcdiv is no longer supported"),
    (lambda: tg.addcmul(tg.ones(3), tg.ones(2), tg.ones(2)), RuntimeError, r"addcmul: shapes \[3\], \[2\], \[2\]"),
    (lambda: tg.heaviside(tg.ones(2), tg.tensor(1)), RuntimeError,
     "heaviside is not yet implemented for tensors with different dtypes"),
    (lambda: tg.isclose(tg.tensor([1]), tg.ones(1)), RuntimeError, "isclose: int64 did not match float32"),
    (lambda: tg.isclose(tg.ones(1), tg.ones(1), rtol=-1), RuntimeError,
     "rtol must be greater than or equal to zero, but got -1"),
    (lambda: tg.isclose(tg.ones(1), tg.ones(1), atol=-1), RuntimeError,
     "atol must be greater than or equal to zero, but got -1"),
    (lambda: tg.negative(tg.tensor([True])), RuntimeError, "Negation, the `-` operator, on a bool tensor"),
    (lambda: tg.positive(tg.tensor([True])), RuntimeError, r"The `\+` operator, on a bool tensor is not supported"),
    (lambda: tg.xlogy(1.0, 2.0), TypeError, "xlogy\\(\\): expected at least one of 'input' and 'other'"),
    (lambda: tg.isfinite([1.0]), TypeError, "isfinite\\(\\): argument 'input' must be Tensor, not list"),
    (lambda: tg.logaddexp(tg.ones(1), 2.0), TypeError, "logaddexp\\(\\): argument 'other' must be Tensor, not float"),
])
def test_bad_input_is_refused_with_pytorchs_message(call, error, message):
    with pytest.raises(error, match=message):
        call()


try:
    import torch
except ImportError:
    torch = None


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("name", CASES)
def test_values_and_gradients_match_torch(name):
    fn, specs = CASES[name]
    arrays = _arrays(specs, seed=20)
    ours = [tg.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, expected = fn(tg, *ours), fn(torch, *theirs)
    assert out.dtype.name == str(expected.dtype).removeprefix("torch.")
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    weights = np.linspace(-1.0, 1.0, int(np.prod(out.shape))).reshape(out.shape)
    (out * tg.tensor(weights)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    for got, want in zip(ours, theirs):
        want_grad = want.grad.numpy() if want.grad is not None else np.zeros(want.shape)
        got_grad = got.grad.numpy() if got.grad is not None else np.zeros(got.shape)
        np.testing.assert_allclose(got_grad, want_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("expression", [
    "m.isfinite(x)", "m.isposinf(x)", "m.isneginf(x)", "m.signbit(x)", "m.sgn(x)", "m.nan_to_num(x)",
    "m.nan_to_num(x, nan=1.0, posinf=2.0)", "m.isclose(x, x * 1.0000001)", "m.isclose(x, x, equal_nan=True)",
    "m.frac(x)", "m.logit(x.abs() / 10)", "m.sinc(x)", "m.heaviside(m.round(x), m.ones(1))",
])
def test_edge_values_match_torch(expression):
    data = np.array([1.5, -0.0, 0.0, np.inf, -np.inf, np.nan, -2.25, 4.0], dtype=np.float32)
    ours = eval(expression, {"m": tg, "x": tg.tensor(data)})  # noqa: S307 - the test's own table
    theirs = eval(expression, {"m": torch, "x": torch.tensor(data)})  # noqa: S307
    assert ours.dtype.name == str(theirs.dtype).removeprefix("torch.")
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("expression", [
    "m.deg2rad(i)", "m.rad2deg(i)", "m.sinc(i)", "m.logit(i)", "m.xlogy(i, i)", "m.float_power(i, 2)",
    "m.addcmul(i, i, i, value=2)", "m.nan_to_num(i)", "m.sgn(i)", "m.isfinite(i)", "m.clamp_min(i, 1)",
    "m.heaviside(i, i)", "m.true_divide(i, 2)", "m.negative(i)", "m.atan2(i, i)", "m.hypot(i.float(), i)",
])
def test_integer_inputs_promote_as_in_torch(expression):
    data = np.array([3, -1, 0, 2])
    ours = eval(expression, {"m": tg, "i": tg.tensor(data)})  # noqa: S307 - the test's own table
    theirs = eval(expression, {"m": torch, "i": torch.tensor(data)})  # noqa: S307
    assert ours.dtype.name == str(theirs.dtype).removeprefix("torch.")
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)
