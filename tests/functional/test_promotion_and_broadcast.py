"""Type promotion and broadcasting of the user-facing ops, following PyTorch: tensors with
dims outrank 0-d tensors, which outrank Python scalars, and a lower-ranked operand only
matters when its category (bool < int < float) is higher."""

import numpy as np
import pytest

import tracegrad as tg

# name -> (expression, expected dtype)
PROMOTION = {
    "float32_tensor_times_python_float": (lambda: tg.ones(2) * 2.5, tg.float32),
    "python_float_times_float32_tensor": (lambda: 2.5 * tg.ones(2), tg.float32),
    "float64_tensor_times_python_float": (lambda: tg.ones(2, dtype=tg.float64) * 2.5, tg.float64),
    "int_tensor_div_int": (lambda: tg.tensor([3, 4]) / 2, tg.float32),
    "int_tensor_div_int_tensor": (lambda: tg.tensor([3, 4]) / tg.tensor([2, 2]), tg.float32),
    "int_tensor_plus_float": (lambda: tg.tensor([1, 2]) + 0.5, tg.float32),
    "int_tensor_plus_int": (lambda: tg.tensor([1, 2]) + 3, tg.int64),
    "bool_tensor_plus_int": (lambda: tg.tensor([True, False]) + 1, tg.int64),
    "bool_tensor_plus_bool": (lambda: tg.tensor([True, False]) + True, tg.bool),
    "float32_plus_float64_tensor": (lambda: tg.ones(2) + tg.ones(2, dtype=tg.float64), tg.float64),
    "int_plus_float32_tensor": (lambda: tg.tensor([1, 2]) + tg.ones(2), tg.float32),
    "float32_tensor_times_0d_float64": (lambda: tg.ones(2) * tg.tensor(np.float64(2.0)), tg.float32),
    "int_tensor_times_0d_float64": (lambda: tg.tensor([1, 2]) * tg.tensor(np.float64(2.0)), tg.float64),
    "int_tensor_times_0d_float32": (lambda: tg.tensor([1, 2]) * tg.tensor(2.0), tg.float32),
    "0d_float64_plus_0d_float32": (lambda: tg.tensor(np.float64(1.0)) + tg.tensor(1.0), tg.float64),
    "0d_int_plus_python_float": (lambda: tg.tensor(3) + 2.5, tg.float32),
    "float32_tensor_times_numpy_float64_scalar": (lambda: tg.ones(2) * np.float64(2.0), tg.float32),
    "int_tensor_times_numpy_int_scalar": (lambda: tg.tensor([1, 2]) * np.int64(3), tg.int64),
    "int_tensor_pow_int": (lambda: tg.tensor([2, 3]) ** 2, tg.int64),
    "int_tensor_pow_float": (lambda: tg.tensor([2, 3]) ** 0.5, tg.float32),
    "float_pow_int_tensor": (lambda: 2.0 ** tg.tensor([2, 3]), tg.float32),
    "maximum_int_and_float32": (lambda: tg.maximum(tg.tensor([1]), tg.tensor([2.0])), tg.float32),
    "where_int_and_python_float": (lambda: tg.where(tg.tensor([True]), tg.tensor([1]), 2.5), tg.float32),
    "matmul_float32_float64": (lambda: tg.ones(2, 2) @ tg.ones(2, 2, dtype=tg.float64), tg.float64),
}


@pytest.mark.parametrize("name", PROMOTION)
def test_result_dtype_follows_pytorch_promotion(name):
    expression, expected = PROMOTION[name]
    assert expression().dtype == expected


def test_int_tensor_division_is_true_division():
    np.testing.assert_allclose((tg.tensor([3, 4]) / 2).numpy(), [1.5, 2.0])


def test_float32_tensor_times_python_float_computes_in_float32():
    out = tg.tensor(np.array([1 / 3], dtype=np.float32)) * 3.0
    assert out.numpy().dtype == np.float32


# --- creation dtypes ---------------------------------------------------------------------------


def test_numpy_float64_array_keeps_float64():
    assert tg.tensor(np.zeros(2)).dtype == tg.float64
    assert tg.from_numpy(np.zeros(2)).dtype == tg.float64


def test_python_floats_default_to_float32():
    assert tg.tensor([1.0, 2.0]).dtype == tg.float32


def test_python_ints_give_int64_and_bools_give_bool():
    assert tg.tensor([1, 2]).dtype == tg.int64
    assert tg.tensor([True]).dtype == tg.bool


def test_from_numpy_shares_memory():
    array = np.zeros(3)
    tensor = tg.from_numpy(array)
    array[0] = 5.0
    assert tensor[0].item() == 5.0


def test_gradient_has_the_dtype_of_its_leaf_after_promotion():
    x = tg.tensor(np.ones(2, dtype=np.float32), requires_grad=True)
    (x * tg.ones(2, dtype=tg.float64)).sum().backward()
    assert x.grad.dtype == tg.float32


# --- broadcasting ---------------------------------------------------------------------------

BROADCASTS = [((2, 3), (3,)), ((2, 1), (1, 3)), ((4, 1, 3), (2, 1)), ((), (2, 3)), ((1,), (3, 1)), ((0, 3), (3,))]


@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_broadcast_shape_matches_numpy(shapes):
    a, b = (np.ones(s) for s in shapes)
    assert (tg.tensor(a) + tg.tensor(b)).shape == np.broadcast_shapes(*shapes)


@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
def test_gradient_of_a_broadcast_operand_is_summed_back_to_its_shape(shapes):
    a = tg.tensor(np.ones(shapes[0]), requires_grad=True)
    b = tg.tensor(np.ones(shapes[1]), requires_grad=True)
    (a * b).sum().backward()
    out_numel = int(np.prod(np.broadcast_shapes(*shapes)))
    for operand in (a, b):
        assert operand.grad.shape == operand.shape
        expected = out_numel // max(1, operand.numel()) if operand.numel() else 0
        np.testing.assert_array_equal(operand.grad.numpy(), np.full(operand.shape, float(expected)))


def test_python_scalar_broadcasts_against_any_shape():
    out = 1.0 - tg.zeros(2, 3)
    np.testing.assert_array_equal(out.numpy(), np.ones((2, 3)))


def test_expand_adds_leading_dims():
    out = tg.tensor([1.0, 2.0]).expand(3, 2)
    np.testing.assert_array_equal(out.numpy(), np.broadcast_to([1.0, 2.0], (3, 2)))


def test_python_floats_convert_straight_to_a_requested_dtype():
    assert tg.tensor([0.3], dtype=tg.float64).numpy()[0] == 0.3
    assert tg.tensor(0.1, dtype=tg.float64).item() == 0.1
    assert tg.tensor([0.3]).dtype is tg.float32
    np.testing.assert_array_equal(tg.tensor([0.3]).numpy(), np.float32([0.3]))


def test_where_between_two_numbers_takes_the_conditions_shape_in_eager_and_compiled_mode():
    condition = tg.tensor([True, False, True])
    for where in (lambda c: tg.where(c, 1.5, 2.5), tg.compile(lambda c: tg.where(c, 1.5, 2.5))):
        result = where(condition)
        assert result.shape == (3,) and result.dtype is tg.float32
        np.testing.assert_array_equal(result.numpy(), [1.5, 2.5, 1.5])
    assert tg.where(tg.tensor(False), 1, 2).shape == ()
