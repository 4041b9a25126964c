"""`tensor_methods.py`: the operators bound to Tensor where their definition differs from
the op they call, as PyTorch's do (number / tensor is tensor.reciprocal() * number; flip
takes its dims one by one too)."""

import pytest

import tracegrad as tg


def test_number_over_tensor_survives_a_later_in_place_write_into_the_tensor():
    # (fuzz seed 30000693: `t2 = 1 / a0` then `a0.pow_(2)` under no_grad; backward raised a
    # version error PyTorch does not raise, since its backward reads the result)
    a = tg.tensor([1.5, -4.0], dtype=tg.float64, requires_grad=True)
    t = 2 / a
    with tg.no_grad():
        a.pow_(2)
    t.sum().backward()
    assert a.grad.tolist() == [-2 / 1.5 ** 2, -2 / 16.0]


@pytest.mark.parametrize("dtype", [tg.float32, tg.float64, tg.int64, tg.bool])
def test_number_over_tensor_has_pytorchs_values_and_dtypes(dtype):
    x = tg.tensor([1, 3, 0], dtype=dtype) if dtype is not tg.bool else tg.tensor([True, False])
    out = 3 / x
    assert out.dtype is (dtype if dtype.is_floating else tg.float32)
    recip = 1 / x.to(out.dtype)
    assert out.tolist() == (recip * 3).tolist()
    compiled = tg.compile(lambda v: 3 / v)(x)
    assert compiled.tolist() == out.tolist() and compiled.dtype is out.dtype


def test_number_over_tensor_matches_torch():
    torch = pytest.importorskip("torch")
    import numpy as np
    values = np.array([0.1, 3.0, -7.0, 1e-3], dtype=np.float32)
    ours = (0.3 / tg.tensor(values)).numpy()
    theirs = (0.3 / torch.tensor(values)).numpy()
    assert np.array_equal(ours, theirs)


def test_flip_takes_its_dims_as_one_sequence_or_one_by_one():
    # (fuzz seed 31000384: x.flip(0, 1) raised a TypeError; PyTorch takes it)
    x = tg.arange(6.0).reshape(2, 3)
    want = [[5.0, 4.0, 3.0], [2.0, 1.0, 0.0]]
    assert x.flip(0, 1).tolist() == x.flip([0, 1]).tolist() == x.flip((0, -1)).tolist() == want
    assert x.flip(1).tolist() == [[2.0, 1.0, 0.0], [5.0, 4.0, 3.0]]
    assert tg.compile(lambda v: v.flip(1, 0))(x).tolist() == want
