"""`functional/pieces.py` (narrow, split, chunk, unbind, flip, repeat), `functional/masking.py`
(masked_fill, tril, triu) and the named products of `functional/linalg.py` (bmm, mv, dot,
outer, addmm): shapes and values as PyTorch's, gradients against finite differences (first
and second order, float64), compiled equal to eager, views where PyTorch makes views, and
PyTorch's errors; compared with PyTorch itself where it is installed."""

import numpy as np
import pytest

import tracegrad as tg
from tests.functional.case_table import (
    CHECKS, assert_compiled_equals_eager, assert_gradients_check, assert_matches_torch,
)
from tests.functional.case_table import leaf as _leaf


def _mask(*shape):
    return tg.from_numpy(np.random.default_rng(9).random(shape) > 0.5)


# name -> (function of a module `m` and float64 inputs, input shapes); the same text runs
# with PyTorch as `m`.
CASES = {
    "narrow": (lambda m, a: a.narrow(1, 1, 2) * 2.0, [(3, 4)]),
    "split_size": (lambda m, a: m.cat([p * (i + 1.0) for i, p in enumerate(a.split(2, 1))], 1), [(3, 5)]),
    "split_sections": (lambda m, a: m.cat([p.sum(0) for p in m.split(a, [1, 0, 2], 0)]), [(3, 4)]),
    "chunk": (lambda m, a: m.stack([c.sum() for c in a.chunk(3, -1)]), [(2, 7)]),
    "unbind": (lambda m, a: m.stack([r * (i + 1.0) for i, r in enumerate(a.unbind(1))], 0), [(3, 4)]),
    "flip": (lambda m, a: m.flip(a, [0, 2]) * a, [(2, 3, 2)]),
    "repeat": (lambda m, a: a.repeat(2, 1, 3), [(2, 3)]),
    "masked_fill": (lambda m, a: a.masked_fill(a > 0.3, -1.5) * a, [(3, 4)]),
    "masked_fill_broadcast_mask": (lambda m, a: a.masked_fill((a.sum(0) > 0)[None], 2.0), [(3, 4)]),
    "tril": (lambda m, a: m.tril(a) + a.tril(-1) * 2.0, [(4, 3)]),
    "triu_batched": (lambda m, a: a.triu(1), [(2, 3, 4)]),
    "bmm": (lambda m, a, b: m.bmm(a, b), [(2, 3, 4), (2, 4, 2)]),
    "mv": (lambda m, a, b: a.mv(b), [(3, 4), (4,)]),
    "dot": (lambda m, a, b: m.dot(a, b) * a, [(5,), (5,)]),
    "outer": (lambda m, a, b: m.outer(a, b), [(3,), (4,)]),
    "addmm": (lambda m, a, b, c: m.addmm(a, b, c, beta=0.5, alpha=2.0), [(3,), (2, 4), (4, 3)]),
}


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", CASES)
def test_gradients_match_finite_differences(name, check):
    assert_gradients_check(check, *CASES[name])


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", ["narrow", "split_size", "repeat", "tril", "mv", "addmm"])
def test_gradients_on_transposed_inputs(name, check):
    assert_gradients_check(check, *CASES[name], transposed=True)


@pytest.mark.parametrize("name", CASES)
def test_compiled_values_and_gradients_equal_eager(name):
    assert_compiled_equals_eager(*CASES[name])


def test_pieces_are_views_that_share_writes_and_flip_repeat_are_copies():
    x = tg.arange(12.0).reshape(3, 4)
    first, _ = x.split([1, 3], 1)
    row = x.unbind(0)[1]
    first.mul_(-1.0)
    row.add_(100.0)
    assert x[:, 0].tolist() == [-0.0, 96.0, -8.0] and x[1, 3].item() == 107.0
    x.narrow(0, 2, 1).fill_(5.0)
    x.chunk(2, 1)[1].zero_()
    assert x[2].tolist() == [5.0, 5.0, 0.0, 0.0] and x[:, 3].tolist() == [0.0, 0.0, 0.0]
    flipped, repeated = x.flip(0), x.repeat(1, 2)
    flipped.zero_()
    repeated.zero_()
    assert x.sum().item() != 0.0


def test_size_zero_and_size_one_pieces():
    x = tg.ones(0, 3)
    assert [p.shape for p in x.split(2, 1)] == [(0, 2), (0, 1)]
    assert x.unbind(0) == () and x.flip(0).shape == (0, 3) and x.repeat(2, 1).shape == (0, 3)
    assert [p.shape for p in tg.ones(1, 3).chunk(4, 1)] == [(1, 1), (1, 1), (1, 1)]
    assert tg.ones(1, 1).tril().tolist() == [[1.0]] and tg.ones(0, 2).triu().shape == (0, 2)
    assert tg.ones(0, 2).masked_fill(tg.ones(0, 2) > 0, 3.0).shape == (0, 2)


def test_in_place_masked_fill_tril_triu_on_non_leaves():
    x = _leaf(3, 3)
    y = x * 1.0
    y.masked_fill_(y > 0, 0.0).tril_()
    y.sum().backward()
    expected = ((x.detach().numpy() <= 0) & np.tril(np.ones((3, 3), dtype=bool))).astype(float)
    np.testing.assert_array_equal(x.grad.numpy(), expected)


def test_masked_fill_with_a_value_that_requires_grad_sends_it_the_gradient():
    x, value = _leaf(2, 3), tg.tensor(0.5, dtype=tg.float64, requires_grad=True)
    mask = _mask(2, 3)
    x.masked_fill(mask, value).sum().backward()
    assert value.grad.item() == mask.sum().item()
    np.testing.assert_array_equal(x.grad.numpy(), (~mask.numpy()).astype(float))


@pytest.mark.parametrize("call, message", [
    (lambda: tg.ones(3).narrow(0, 2, 2), r"start \(2\) \+ length \(2\) exceeds dimension size \(3\)"),
    (lambda: tg.ones(4).split([1, 2]), "split_with_sizes expects split_sizes to sum exactly to 4"),
    (lambda: tg.ones(4).chunk(0), "chunk expects `chunks` to be greater than 0"),
    (lambda: tg.ones(2, 3).flip([0, 0]), "dims has duplicates"),
    (lambda: tg.ones(2, 3).repeat(2), "Number of dimensions of repeat dims can not be smaller"),
    (lambda: tg.ones(2, 3).masked_fill(tg.ones(2, 3), 0.0), "masked_fill_ only supports boolean masks"),
    (lambda: tg.ones(2, 3).masked_fill(tg.ones(3, 3) > 0, 0.0), r"masked_fill: shapes \[2, 3\], \[3, 3\] cannot be"),
    (lambda: tg.ones(2, 3).masked_fill(tg.ones(2, 1, 3) > 0, 0.0), "does not broadcast to the input's shape"),
    (lambda: tg.ones(3).tril(), "tril: input tensor must have at least 2 dimensions"),
    (lambda: tg.bmm(tg.ones(2, 3, 4), tg.ones(3, 4, 2)), "batch1 and batch2 must have the same batch size"),
    (lambda: tg.mv(tg.ones(3, 4), tg.ones(4, 1)), r"mv: vec must be a 1D tensor, got 2D"),
    (lambda: tg.dot(tg.ones(3), tg.ones(4)), "dot: inconsistent tensor size"),
    (lambda: tg.addmm(tg.ones(5), tg.ones(2, 4), tg.ones(4, 3)), r"addmm: shapes \[5\], \[2, 3\] cannot be"),
    (lambda: tg.addmm(tg.ones(2, 2, 3), tg.ones(2, 4), tg.ones(4, 3)), "does not broadcast to the product's shape"),
])
def test_bad_input_is_refused_with_the_ops_message(call, message):
    with pytest.raises((RuntimeError, IndexError), match=message):
        call()


def test_new_tensors_take_the_dtype_of_the_tensor_they_come_from():
    x = tg.ones(2, dtype=tg.float64)
    assert x.new_zeros(2, 3).dtype is tg.float64 and x.new_ones((4,)).shape == (4,)
    assert x.new_full((2,), 7).tolist() == [7.0, 7.0] and x.new_empty(3).shape == (3,)
    assert x.new_tensor([1, 2]).dtype is tg.float64 and x.new_zeros(2, dtype=tg.int64).dtype is tg.int64
    assert x.new_zeros(2, requires_grad=True).requires_grad
    assert x.type() == "torch.DoubleTensor" and x.type("torch.FloatTensor").dtype is tg.float32
    assert x.nelement() == 2 and x.element_size() == 8 and tg.ones(1).element_size() == 4


try:
    import torch
except ImportError:
    torch = None


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("name", CASES)
def test_values_and_gradients_match_torch(name):
    assert_matches_torch(torch, *CASES[name])
