"""`tensor_methods.py`: the operators bound to Tensor where their definition differs from
the op they call, as PyTorch's do (number / tensor is tensor.reciprocal() * number; flip
takes its dims one by one too), and in-place arithmetic that only writes data (NumPy in
place, as the recorded path would leave it)."""

import numpy as np
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


# --- in-place arithmetic on data: the NumPy path (tensor_methods._writes_data_only) --------------

def _in_place_cases():
    """(name, function of a fresh setup returning what to compare)."""
    def overlapping_views():
        a = tg.tensor(np.arange(6.0))
        with tg.no_grad():
            a[1:].add_(a[:-1])
        return a, a._version

    def transposed_operand():
        b = tg.tensor(np.arange(6.0)).view(2, 3)
        with tg.no_grad():
            b.add_(b.t().contiguous().t() * 1.0)
        return b, b._version

    def self_operand_and_alpha():
        c = tg.tensor(np.arange(6.0, dtype=np.float32)).view(2, 3)
        c.sub_(tg.tensor(np.ones(3, np.float32)), alpha=0.3)
        c.mul_(c)
        c.div_(3)
        c += 1
        return c, c._version

    def optimizer_style_update():
        p = tg.nn.Parameter(tg.tensor(np.linspace(-1, 1, 5)))
        p.grad = tg.tensor(np.linspace(0, 2, 5))
        p.data.add_(p.grad.data, alpha=-0.1)
        with tg.no_grad():
            p.mul_(0.5)
        return p.detach(), p._version

    def strided_view_under_no_grad():
        e = tg.tensor(np.arange(6.0))
        with tg.no_grad():
            e[::2].div_(2)
        return e, e._version

    return {f.__name__: f for f in (overlapping_views, transposed_operand, self_operand_and_alpha,
                                    optimizer_style_update, strided_view_under_no_grad)}


@pytest.mark.parametrize("name", sorted(_in_place_cases()))
def test_in_place_arithmetic_on_data_leaves_what_the_recorded_path_leaves(name, monkeypatch):
    import tracegrad.tensor_methods as methods
    case = _in_place_cases()[name]
    fast, fast_version = case()
    monkeypatch.setattr(methods, "_NUMPY_INPLACE_MAX", -1)  # every call through _apply_inplace
    slow, slow_version = case()
    np.testing.assert_array_equal(fast.numpy(), slow.numpy())
    assert fast.dtype == slow.dtype and fast_version == slow_version


def test_in_place_arithmetic_takes_the_numpy_path_only_where_nothing_is_recorded():
    from tracegrad.tensor_methods import _writes_data_only
    p = tg.nn.Parameter(tg.ones(3))
    assert _writes_data_only(p.data, tg.ones(3), {"alpha": -0.1})
    assert _writes_data_only(p.data, 2.0, {})
    assert not _writes_data_only(p, tg.ones(3), {})  # grad on: recorded (here: raises)
    with tg.no_grad():
        assert _writes_data_only(p, tg.ones(3), {})
    assert not _writes_data_only(p.data, tg.ones(2, 3), {})  # broadcasts beyond self: raises
    assert not _writes_data_only(p.data, tg.ones(3, dtype=tg.float64), {})  # promotion rules
    assert not _writes_data_only(tg.ones(3, dtype=tg.int64), 2, {})
    assert not _writes_data_only(tg.ones(3, dtype=tg.float16), 2.0, {})  # its ops round as PyTorch's


def test_in_place_arithmetic_that_involves_grad_still_records_or_raises():
    leaf = tg.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        leaf.add_(1.0)
    x = tg.ones(3, requires_grad=True) * 2.0
    x.mul_(tg.tensor([1.0, 2.0, 3.0]))
    assert x.grad_fn is not None
    x.sum().backward()
    base = tg.ones(4, requires_grad=True).clone()
    base[:2].add_(1.0)  # a view of a tensor with history: rebased, as PyTorch's CopySlices
    assert base.grad_fn is not None
