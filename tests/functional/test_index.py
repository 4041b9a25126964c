"""`x[i]` with a Python int (`functional/index.py: _select`): the slice and reshape the
general plan makes, with its values, views, errors and gradients, eager and compiled."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck
from tracegrad.functional import index

SHAPES = [(5,), (4, 3), (1, 3), (3, 1, 2), (2, 0)]


def _leaf(shape):
    return tg.tensor(np.random.default_rng(0).standard_normal(shape), requires_grad=True)


@pytest.mark.parametrize("shape, i", [(shape, i) for shape in SHAPES for i in (0, -1, 1) if i < shape[0]])
def test_an_int_key_gives_numpys_row_as_a_view_like_the_general_plan(shape, i):
    x = _leaf(shape)
    row = x[i]
    np.testing.assert_array_equal(row.detach().numpy(), x.detach().numpy()[i])
    planned = index._Plan(x, i).read(x)
    assert row.shape == planned.shape and row.grad_fn.name() == "SelectBackward"  # (PyTorch's: one op)
    np.testing.assert_array_equal(row.detach().numpy(), planned.detach().numpy())
    assert np.shares_memory(row.detach().numpy(), x.detach().numpy()) or row.numel() == 0
    assert row._version_counter is x._version_counter


def test_an_int_key_out_of_range_is_the_plans_error():
    x = tg.zeros(3, 2)
    for key in (3, -4):
        with pytest.raises(IndexError, match=f"index {key} is out of bounds for dimension 0 with size 3"):
            x[key]
    with pytest.raises(IndexError):
        tg.tensor(1.0)[0]  # a 0-d tensor has no dim to index: the plan's error


@pytest.mark.parametrize("check", [gradcheck, gradgradcheck])
@pytest.mark.parametrize("shape", [(4, 3), (1, 3), (3, 1, 2)])
def test_int_key_gradients_eager_and_compiled(shape, check):
    assert check(lambda x: x[-1] * x[0], (_leaf(shape),))
    assert check(tg.compile(lambda x: x[-1] * x[0]), (_leaf(shape),))


def test_writing_through_a_row_reaches_its_base():
    x = tg.zeros(3, 2)
    x[1].add_(5.0)
    np.testing.assert_array_equal(x.numpy(), [[0, 0], [5, 5], [0, 0]])


def test_a_row_of_a_transposed_view_and_an_int_subclass_key():
    x = _leaf((3, 4))
    np.testing.assert_array_equal(x.t()[2].detach().numpy(), x.detach().numpy()[:, 2])
    np.testing.assert_array_equal(x[np.int64(1)].detach().numpy(), x.detach().numpy()[1])
    np.testing.assert_array_equal(x[True].detach().numpy(), x.detach().numpy()[True])  # a new dim, as NumPy's
    np.testing.assert_array_equal(x[1, True].detach().numpy(), x.detach().numpy()[1, True])
    with pytest.raises(IndexError, match="a False key"):
        x[False]
