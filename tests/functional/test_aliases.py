"""`functional/aliases.py`: PyTorch's other names give the same results as the functions
they name; div's rounding modes, select, diff, nansum/nanmean, std_mean/var_mean, aminmax,
logical_xor, isin, argwhere and stride as PyTorch's; gradients of the composites check."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck

ALIASES = {"subtract": "sub", "multiply": "mul", "greater": "gt", "greater_equal": "ge", "less": "lt",
           "less_equal": "le", "not_equal": "ne"}
UNARY_ALIASES = {"absolute": "abs", "arcsin": "asin", "arccos": "acos", "arctan": "atan", "arcsinh": "asinh",
                 "arctanh": "atanh"}


@pytest.mark.parametrize("alias, name", ALIASES.items())
def test_binary_aliases_equal_their_functions(alias, name):
    a, b = tg.tensor([[0.5, -1.0], [2.0, 0.5]]), tg.tensor([0.5, 1.5])
    np.testing.assert_array_equal(getattr(tg, alias)(a, b).numpy(), getattr(tg, name)(a, b).numpy())
    np.testing.assert_array_equal(getattr(a, alias)(b).numpy(), getattr(tg, name)(a, b).numpy())


@pytest.mark.parametrize("alias, name", UNARY_ALIASES.items())
def test_unary_aliases_equal_their_functions(alias, name):
    x = tg.tensor([-0.5, 0.25, 0.75])
    np.testing.assert_array_equal(getattr(tg, alias)(x).numpy(), getattr(tg, name)(x).numpy())
    np.testing.assert_array_equal(getattr(x, alias)().numpy(), getattr(tg, name)(x).numpy())


def test_div_rounding_modes():
    a, b = tg.tensor([-7.0, 7.0, -7.5]), tg.tensor([2.0, -2.0, 2.0])
    assert tg.div(a, b, rounding_mode="trunc").tolist() == [-3.0, -3.0, -3.0]
    assert tg.div(a, b, rounding_mode="floor").tolist() == [-4.0, -4.0, -4.0]
    assert tg.div(a, b).tolist() == [-3.5, -3.5, -3.75]
    ints = tg.tensor([-7, 7])
    assert ints.div(2, rounding_mode="trunc").dtype == tg.int64
    assert ints.div(2, rounding_mode="trunc").tolist() == [-3, 3]
    assert (ints // 2).tolist() == [-4, 3] and (ints % 3).tolist() == [2, 1] and (7 // tg.tensor([2])).tolist() == [3]
    with pytest.raises(RuntimeError, match="rounding_mode to be one of None, 'trunc', or 'floor'"):
        tg.div(a, b, rounding_mode="round")


def test_select_ravel_flips_and_diff():
    x = tg.arange(12.0).reshape(3, 4)
    assert tg.select(x, 1, -1).tolist() == [3.0, 7.0, 11.0] and x.select(0, 1).tolist() == [4.0, 5.0, 6.0, 7.0]
    with pytest.raises(IndexError, match="index 3 out of range"):
        x.select(0, 3)
    with pytest.raises(IndexError, match="cannot be applied to a 0-dim tensor"):  # (as PyTorch's)
        tg.tensor(1.0).select(0, 0)
    y = tg.zeros(3, 4, requires_grad=True)
    assert y.select(1, 2)._base is y and "SelectBackward" in repr(y.select(1, 2).grad_fn)
    assert x.t().ravel().tolist() == x.numpy().T.ravel().tolist()
    assert tg.fliplr(x)[0].tolist() == [3.0, 2.0, 1.0, 0.0] and tg.flipud(x)[0].tolist() == [8.0, 9.0, 10.0, 11.0]
    np.testing.assert_array_equal(tg.diff(x ** 2, n=2, dim=1).numpy(), np.diff(x.numpy() ** 2, n=2, axis=1))
    np.testing.assert_array_equal(tg.diff(x, prepend=tg.zeros(3, 1), dim=1).numpy(),
                                  np.diff(x.numpy(), prepend=0, axis=1))
    assert tg.diff(tg.tensor([True, True, False])).tolist() == [False, True]


@pytest.mark.parametrize("check", [gradcheck, gradgradcheck])
def test_composite_gradients_check(check):
    x = tg.from_numpy(np.random.default_rng(0).standard_normal((4, 3)).T).requires_grad_()
    assert check(lambda t: tg.diff(t, dim=1) * tg.select(t, 0, 1).sum(), (x,))
    assert check(lambda t: tg.nansum(t * t, 1) + tg.std_mean(t, 0)[0].sum() + tg.var_mean(t)[1], (x,))


def test_nan_reductions_std_mean_aminmax_and_logic():
    x = tg.tensor([[1.0, float("nan")], [3.0, 5.0]])
    assert tg.nansum(x).item() == 9.0 and tg.nanmean(x, 0).tolist() == [2.0, 5.0]
    std, mean = tg.std_mean(tg.tensor([1.0, 2.0, 3.0]))
    assert (std.item(), mean.item()) == (1.0, 2.0)
    smallest, largest = tg.tensor([[3, 1], [4, 1]]).aminmax(dim=0)
    assert smallest.tolist() == [3, 1] and largest.tolist() == [4, 1]
    assert tg.logical_xor(tg.tensor([True, False, True]), tg.tensor([1, 0, 0])).tolist() == [False, False, True]
    assert tg.isin(tg.tensor([1, 2, 3]), tg.tensor([2, 9])).tolist() == [False, True, False]
    assert tg.argwhere(tg.tensor([[0, 1], [1, 0]])).tolist() == [[0, 1], [1, 0]]


def test_stride_is_the_eager_layout_also_inside_a_compiled_function():
    x = tg.zeros(2, 3, 4)
    assert x.stride() == (12, 4, 1) and x.transpose(0, 2).stride() == (1, 4, 12) and x.stride(-1) == 1
    seen = []

    def f(t):
        seen.append(t.permute(2, 0, 1).stride())
        return t * 2

    tg.compile(f)(x)
    assert seen == [(1, 12, 4)]


def test_tensor_conveniences():
    x = tg.arange(6).reshape(2, 3)
    assert (+x) is x and 4 in x and 9 not in x
    assert (x.nbytes, x.itemsize, x.ndimension(), x.is_complex()) == (48, 8, 2, False)
    assert x.pin_memory() is x and x.share_memory_() is x and not x.is_pinned()


def test_matches_pytorch():
    torch = pytest.importorskip("torch")
    data = np.array([[-7.5, 3.0, float("nan")], [2.0, -1.0, 4.0]])
    for mode in ("trunc", "floor"):
        np.testing.assert_array_equal(tg.div(tg.tensor(data), 2.0, rounding_mode=mode).numpy(),
                                      torch.div(torch.tensor(data), 2.0, rounding_mode=mode).numpy())
    np.testing.assert_array_equal(tg.nansum(tg.tensor(data), 1).numpy(), torch.nansum(torch.tensor(data), 1).numpy())
    np.testing.assert_allclose(tg.nanmean(tg.tensor(data), 1).numpy(), torch.nanmean(torch.tensor(data), 1).numpy())
    np.testing.assert_array_equal(tg.diff(tg.tensor(data), n=2, dim=1).numpy(),
                                  torch.diff(torch.tensor(data), n=2, dim=1).numpy())
    assert tg.zeros(2, 3, 4).permute(1, 2, 0).stride() == torch.zeros(2, 3, 4).permute(1, 2, 0).stride()
