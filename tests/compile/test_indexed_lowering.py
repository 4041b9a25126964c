"""gather and scatter_add lowered into kernels: same values as eager, same index errors."""

import numpy as np
import pytest

import tracegrad as tg


def _gather_rows(x, index):
    return x.gather(1, index)


def test_compiled_gather_matches_eager():
    x = tg.from_numpy(np.arange(12.0).reshape(3, 4))
    index = tg.tensor([[3, 0], [2, 0], [3, 1]])
    compiled = tg.compile(_gather_rows)
    np.testing.assert_array_equal(compiled(x, index).numpy(), _gather_rows(x, index).numpy())
    assert compiled.cache_info().kernels >= 1


@pytest.mark.parametrize("bad", [4, -1, -5])  # negative indices raise, as in PyTorch's gather
def test_compiled_gather_out_of_range_raises_like_eager(bad):
    x = tg.from_numpy(np.arange(12.0).reshape(3, 4))
    index = tg.tensor([[0], [bad], [1]])
    with pytest.raises(IndexError, match=f"gather: index {bad} is out of bounds for dimension 1 with size 4"):
        _gather_rows(x, index)
    with pytest.raises(IndexError, match=f"gather: index {bad} is out of bounds for dimension 1 with size 4"):
        tg.compile(lambda x, i: _gather_rows(x, i) * 2)(x, index)


def test_compiled_gather_gradient_sums_repeated_indices():
    x = tg.from_numpy(np.arange(8.0).reshape(2, 4)).requires_grad_()
    index = tg.tensor([[1, 1, 3], [0, 2, 0]])

    def grad(x, index):
        return tg.autograd.grad((_gather_rows(x, index) * 3).sum(), x)[0]

    expected = np.array([[0.0, 6.0, 0.0, 3.0], [6.0, 0.0, 3.0, 0.0]])
    np.testing.assert_array_equal(grad(x, index).numpy(), expected)
    np.testing.assert_array_equal(tg.compile(grad)(x, index).numpy(), expected)


def test_compiled_gather_of_a_smaller_index_than_the_input():
    x = tg.from_numpy(np.arange(20.0).reshape(4, 5))
    index = tg.tensor([[4, 0], [1, 1]])  # torch.gather allows index smaller than input
    compiled = tg.compile(_gather_rows)
    np.testing.assert_array_equal(compiled(x, index).numpy(), _gather_rows(x, index).numpy())
