"""The ops of `ops/binary_math.py` (atan2, hypot, copysign, fmod, remainder, floor_divide,
fmax, fmin, signbit): values against NumPy (float32 and float64), gradients against finite
differences (first and second order, float64) on broadcast, transposed, size-0 and size-1
inputs, compiled equal to eager, in-place forms, PyTorch's integer and promotion rules and
errors, and PyTorch itself where it is installed."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

CHECKS = [pytest.param(gradcheck, id="grad"), pytest.param(gradgradcheck, id="gradgrad")]


def _signed(low, high):
    """Values of either sign with magnitude in [low, high]."""
    return lambda rng, shape: rng.uniform(low, high, shape) * rng.choice([-1.0, 1.0], shape)


# name -> (NumPy reference, first operand's values, second operand's values). fmod and
# remainder: |a / b| in (2.3, 2.7), away from the integers where their gradients jump.
OPS = {
    "atan2": (np.arctan2, _signed(0.3, 2.0), _signed(0.3, 2.0)),
    "hypot": (np.hypot, _signed(0.3, 2.0), _signed(0.3, 2.0)),
    "copysign": (np.copysign, _signed(0.3, 2.0), _signed(0.3, 2.0)),
    "fmod": (np.fmod, _signed(5.1, 5.4), lambda rng, shape: rng.uniform(2.0, 2.2, shape)),
    "remainder": (np.remainder, _signed(5.1, 5.4), _signed(2.0, 2.2)),
    "floor_divide": (np.floor_divide, _signed(5.1, 5.4), _signed(2.0, 2.2)),
    "fmax": (np.fmax, _signed(0.3, 2.0), _signed(0.3, 2.0)),
    "fmin": (np.fmin, _signed(0.3, 2.0), _signed(0.3, 2.0)),
}
IN_PLACE = ["atan2", "hypot", "copysign", "fmod", "remainder", "floor_divide"]  # PyTorch has no fmax_/fmin_


def _operands(name, shape_a, shape_b, seed, transposed=False):
    rng = np.random.default_rng(seed)
    _, first, second = OPS[name]
    a = first(rng, shape_a[::-1] if transposed else shape_a)
    return (a.T if transposed else a), second(rng, shape_b)


def _leaf(array):
    return tg.from_numpy(np.asarray(array, dtype=np.float64)).requires_grad_()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", OPS)
def test_values_match_numpy_as_function_and_method_with_broadcasting(name, dtype):
    a, b = _operands(name, (3, 4), (4,), seed=0)
    a, b = a.astype(dtype), b.astype(dtype)
    reference = OPS[name][0](a, b)
    x, y = tg.from_numpy(a), tg.from_numpy(b)
    for out in (getattr(tg, name)(x, y), getattr(x, name)(y)):
        assert out.dtype == tg.from_numpy(a).dtype and out.shape == (3, 4)
        np.testing.assert_array_equal(out.numpy(), reference)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", OPS)
def test_gradients_match_finite_differences_with_broadcasting(name, check):
    a, b = _operands(name, (2, 3), (3,), seed=1)
    assert check(lambda x, y: getattr(tg, name)(x, y) * x, (_leaf(a), _leaf(b)))


@pytest.mark.parametrize("shapes", [((), (2,)), ((), (1,)), ((3,), (2, 3))], ids=str)
@pytest.mark.parametrize("name", OPS)
def test_gradients_when_the_first_operand_broadcasts_eager_and_compiled(name, shapes):
    """A 0-d first operand against a shaped second one (copysign's rule built a `where`
    whose 0-d operands met a shaped condition: fuzz seed 84821318)."""
    a, b = _operands(name, *shapes, seed=6)

    def fn(s, t):
        out = getattr(tg, name)(s, t) * t
        return out, tg.autograd.grad(out.sum(), [s, t])

    assert gradcheck(lambda s, t: getattr(tg, name)(s, t) * t, (_leaf(a), _leaf(b)))
    assert gradgradcheck(lambda s, t: getattr(tg, name)(s, t) * t, (_leaf(a), _leaf(b)))
    eager_out, eager_grads = fn(_leaf(a), _leaf(b))
    assert eager_grads[0].shape == shapes[0]
    compiled = tg.compile(fn)
    for _ in range(2):
        out, grads = compiled(_leaf(a), _leaf(b))
        np.testing.assert_allclose(out.detach().numpy(), eager_out.detach().numpy(), rtol=1e-13, atol=1e-13)
        for got, want in zip(grads, eager_grads):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", OPS)
def test_gradients_on_a_transposed_input(name, check):
    a, b = _operands(name, (2, 3), (2, 3), seed=2, transposed=True)
    x = _leaf(a)
    assert not x.is_contiguous()
    assert check(lambda s, t: getattr(tg, name)(s, t).sum(0), (x, _leaf(b)))


@pytest.mark.parametrize("shape", [(0, 3), (1, 1), (3, 0, 1)], ids=str)
@pytest.mark.parametrize("name", OPS)
def test_size_zero_and_size_one_dims_eager_and_compiled(name, shape):
    def fn(s, t):
        out = getattr(tg, name)(s, t)
        return (out, *tg.autograd.grad((out * 2.0).sum(), [s, t]))

    a, b = _operands(name, shape, shape, seed=3)
    eager = fn(_leaf(a), _leaf(b))
    compiled = tg.compile(fn)(_leaf(a), _leaf(b))
    for got, want in zip(compiled, eager):
        assert got.shape == want.shape == shape
        np.testing.assert_array_equal(got.detach().numpy(), want.detach().numpy())


@pytest.mark.parametrize("name", OPS)
def test_compiled_values_and_gradients_equal_eager(name):
    def fn(s, t, w):
        out = getattr(tg, name)(s * 1.0, t) * w + getattr(tg, name)(s.T.contiguous().T, t)
        return out, tg.autograd.grad(out.sum(), [s, t, w])

    a, b = _operands(name, (4, 5), (4, 5), seed=4)
    w = np.random.default_rng(5).standard_normal((4, 5))
    compiled = tg.compile(fn)
    eager_out, eager_grads = fn(_leaf(a), _leaf(b), _leaf(w))
    for _ in range(2):  # traced, then a call following the recording
        out, grads = compiled(_leaf(a), _leaf(b), _leaf(w))
        np.testing.assert_allclose(out.detach().numpy(), eager_out.detach().numpy(), rtol=1e-13, atol=1e-13)
        for got, want in zip(grads, eager_grads):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("name", IN_PLACE)
def test_in_place_form_on_a_non_leaf_writes_and_differentiates(name):
    a, b = _operands(name, (2, 3), (3,), seed=6)
    x, other = _leaf(a), tg.from_numpy(b)
    y = x * 1.0
    assert getattr(y, name + "_")(other) is y and y._version == 1
    np.testing.assert_array_equal(y.detach().numpy(), OPS[name][0](a, b))
    y.sum().backward()
    x_ref = _leaf(a)
    getattr(tg, name)(x_ref, other).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), x_ref.grad.numpy())


def test_arctan2_is_atan2_with_its_in_place_form():
    y, x = tg.tensor([1.0, -1.0]), tg.tensor([-1.0, -1.0])
    assert tg.arctan2(y, x).tolist() == tg.atan2(y, x).tolist() == y.arctan2(x).tolist()
    z = y.clone()
    z.arctan2_(x)
    assert z.tolist() == tg.atan2(y, x).tolist()


def test_float_ops_make_integer_and_bool_operands_float32_and_promote_mixed_ones():
    ints = tg.tensor([3, -4])
    for name in ("atan2", "hypot", "copysign"):
        assert getattr(tg, name)(ints, ints).dtype is tg.float32
        assert getattr(tg, name)(ints, tg.tensor([1.0, 2.0], dtype=tg.float64)).dtype is tg.float64
        assert getattr(tg, name)(tg.tensor([True]), tg.tensor([False])).dtype is tg.float32
    assert tg.hypot(ints, ints).tolist() == pytest.approx([np.hypot(3, 3), np.hypot(4, 4)])
    assert tg.copysign(ints, -1).tolist() == [-3.0, -4.0]


def test_integer_fmod_remainder_floor_divide_keep_int64_with_their_sign_rules():
    a, b = tg.tensor([7, -7, 7, -7]), tg.tensor([2, 2, -2, -2])
    assert tg.fmod(a, b).tolist() == [1, -1, 1, -1]  # the dividend's sign (C)
    assert tg.remainder(a, b).tolist() == [1, 1, -1, -1]  # the divisor's sign (Python)
    assert tg.floor_divide(a, b).tolist() == [3, -4, -4, 3]
    assert tg.fmod(a, b).dtype is tg.remainder(a, b).dtype is tg.floor_divide(a, b).dtype is tg.int64
    assert tg.remainder(-3, tg.tensor(2)).item() == 1  # a Python number first
    assert tg.fmod(a, 2.5).dtype is tg.float32


def test_float_remainder_and_floor_divide_follow_python_exactly():
    a = np.array([1.0, -1.0, 5.5, -5.5, 0.0, -0.0])
    b = np.array([0.1, 0.1, -2.0, 2.0, -3.0, 3.0])
    assert tg.floor_divide(tg.tensor(a), tg.tensor(b)).tolist() == [x // y for x, y in zip(a, b)]
    got = tg.remainder(tg.tensor(a), tg.tensor(b)).tolist()
    assert got == [x % y for x, y in zip(a, b)]
    assert [np.copysign(1, v) for v in got] == [np.copysign(1, x % y) for x, y in zip(a, b)]


@pytest.mark.parametrize("name", ["fmod", "remainder", "floor_divide"])
def test_integer_division_by_zero_raises_and_float_gives_nan_or_inf(name):
    with pytest.raises(RuntimeError, match=f"ZeroDivisionError: {name} of an integer tensor by zero"):
        getattr(tg, name)(tg.tensor([5, 3]), tg.tensor([1, 0]))
    x = tg.tensor([5, 3])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        getattr(x, name + "_")(0)
    assert x.tolist() == [5, 3] and x._version == 0
    out = getattr(tg, name)(tg.tensor([1.0, -1.0, 0.0]), 0.0).numpy()
    assert np.isnan(out[2]) and (np.isnan(out[0]) or np.isinf(out[0]))


@pytest.mark.parametrize("name", ["fmod", "remainder", "floor_divide"])
def test_bool_operands_are_refused_with_the_ops_name(name):
    with pytest.raises(TypeError, match=f"{name}: not implemented for bool tensors"):
        getattr(tg, name)(tg.tensor([True]), tg.tensor([True]))


def test_fmod_and_remainder_gradients_are_one_and_minus_the_rounded_quotient():
    a, b = _leaf([5.3, -5.3, 5.3]), _leaf([2.0, 2.0, -2.0])
    tg.fmod(a, b).sum().backward()
    assert a.grad.tolist() == [1.0, 1.0, 1.0] and b.grad.tolist() == [-2.0, 2.0, 2.0]
    a.grad = b.grad = None
    tg.remainder(a, b).sum().backward()
    assert a.grad.tolist() == [1.0, 1.0, 1.0] and b.grad.tolist() == [-2.0, 3.0, 3.0]


def test_floor_divide_gradient_is_zero_as_pytorchs_floor_rounding_division():
    a, b = _leaf([5.3, -5.3]), _leaf([2.0, 2.0])
    tg.floor_divide(a, b).sum().backward()
    assert a.grad.tolist() == [0.0, 0.0] and b.grad.tolist() == [0.0, 0.0]


def test_fmax_fmin_ignore_nan_and_send_ties_and_nan_cases_to_the_number():
    nan = float("nan")
    a, b = _leaf([nan, 1.0, 2.0, nan, 3.0]), _leaf([1.0, nan, 2.0, nan, 4.0])
    out = tg.fmax(a, b)
    np.testing.assert_array_equal(out.detach().numpy(), [1.0, 1.0, 2.0, nan, 4.0])
    out.sum().backward()
    assert a.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0] and b.grad.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]
    np.testing.assert_array_equal(tg.fmin(a, b).detach().numpy(), [1.0, 1.0, 2.0, nan, 3.0])
    assert tg.compile(tg.fmax)(a.detach(), b.detach()).numpy()[:3].tolist() == [1.0, 1.0, 2.0]


def test_fmax_fmin_on_integers_and_bools_compiled_and_eager():
    for a, b in ((tg.tensor([1, 5, -2]), tg.tensor([3, 2, -2])), (tg.tensor([True, False]), tg.tensor([False, False]))):
        for fn in (tg.fmax, tg.fmin):
            want = (np.fmax if fn is tg.fmax else np.fmin)(a.numpy(), b.numpy())
            assert fn(a, b).dtype is a.dtype
            np.testing.assert_array_equal(fn(a, b).numpy(), want)
            np.testing.assert_array_equal(tg.compile(lambda s, t, fn=fn: fn(s, t) == fn(s, t))(a, b).numpy(), True)
            np.testing.assert_array_equal(tg.compile(fn)(a, b).numpy(), want)


def test_copysign_gradient_is_the_sign_ratio_and_zero_at_zero_and_for_the_sign_source():
    a, b = _leaf([2.0, -3.0, 0.0]), _leaf([-1.0, -1.0, -1.0])
    tg.copysign(a, b).sum().backward()
    assert a.grad.tolist() == [-1.0, 1.0, 0.0] and b.grad.tolist() == [0.0, 0.0, 0.0]


def test_signbit_sees_negative_zero_and_nan_signs_eager_and_compiled():
    x = tg.from_numpy(np.array([-0.0, 0.0, -1.5, 2.0, np.nan, -np.nan, -np.inf], dtype=np.float32))
    want = [True, False, True, False, False, True, True]
    assert tg.signbit(x).tolist() == x.signbit().tolist() == want
    assert tg.compile(lambda t: tg.signbit(t * 1.0))(x).tolist() == want
    ints = tg.tensor([-2, 0, 3])
    assert tg.signbit(ints).tolist() == tg.compile(tg.signbit)(ints).tolist() == [True, False, False]
    assert tg.signbit(tg.tensor([True])).tolist() == [False]
    assert not tg.signbit(_leaf([-1.0])).requires_grad


def test_hypot_does_not_overflow_where_the_square_would():
    big = tg.tensor([1e20], dtype=tg.float32)
    assert tg.hypot(big, big).item() == pytest.approx(1e20 * np.sqrt(2), rel=1e-6)


def test_in_place_float_op_on_an_integer_tensor_is_refused_before_any_change():
    x = tg.tensor([1, 2])
    with pytest.raises(RuntimeError, match="result type float32 can't be cast to the desired output type int64"):
        x.atan2_(tg.tensor([1, 1]))
    assert x.tolist() == [1, 2] and x._version == 0


def test_shapes_that_do_not_broadcast_are_refused_with_the_ops_name():
    with pytest.raises(RuntimeError, match=r"remainder: shapes \[2, 3\], \[4\] cannot be broadcast"):
        tg.remainder(tg.ones(2, 3), tg.ones(4))


try:
    import torch
except ImportError:
    torch = None


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("name", OPS)
def test_values_and_gradients_match_torch(name):
    a, b = _operands(name, (3, 4), (4,), seed=7)
    ours, theirs = (_leaf(a), _leaf(b)), (torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True))
    out, expected = getattr(tg, name)(*ours), getattr(torch, name)(*theirs)
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=1e-14, atol=1e-14)
    if name == "floor_divide":  # PyTorch has no derivative for it (ours is zero, as its floor-rounding div's)
        return
    weights = np.linspace(-1.0, 1.0, 12).reshape(3, 4)
    (out * tg.tensor(weights)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    for got, want in zip(ours, theirs):
        np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-13, atol=1e-13)


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("name", ["fmod", "remainder", "floor_divide", "fmax", "fmin", "atan2", "copysign"])
def test_integer_results_and_dtypes_match_torch(name):
    a, b = np.array([7, -7, 7, -7, 0]), np.array([2, 2, -3, -3, 5])
    out = getattr(tg, name)(tg.tensor(a), tg.tensor(b))
    expected = getattr(torch, name)(torch.tensor(a), torch.tensor(b))
    assert out.dtype.name == str(expected.dtype).removeprefix("torch.")
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-6)
