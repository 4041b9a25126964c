"""`functional/counting.py` (unique, nonzero, count_nonzero, bincount, histc) and the
searches of `functional/sorting.py` (searchsorted, bucketize): values as NumPy's and
PyTorch's, data-dependent shapes eagerly and inside `tg.compile` (each call realizes its
own input: never a result of an earlier call), size-0 inputs, PyTorch's errors."""

import numpy as np
import pytest

import tracegrad as tg


def _ints(shape, seed, high=4):
    return tg.tensor(np.random.default_rng(seed).integers(0, high, shape))


def test_unique_sorts_and_gives_inverse_and_counts():
    x = tg.tensor([[3, 1], [2, 3], [1, 1]])
    values, inverse, counts = tg.unique(x, return_inverse=True, return_counts=True)
    assert values.tolist() == [1, 2, 3] and counts.tolist() == [3, 1, 2]
    assert inverse.tolist() == [[2, 0], [1, 2], [0, 0]]
    assert x.unique(sorted=False).tolist() == [1, 2, 3]
    assert tg.unique(x, return_counts=True)[1].tolist() == [3, 1, 2]


def test_unique_along_a_dim_compares_whole_slices():
    x = tg.tensor([[1, 2], [1, 2], [0, 5]])
    values, inverse, counts = tg.unique(x, dim=0, return_inverse=True, return_counts=True)
    assert values.tolist() == [[0, 5], [1, 2]] and inverse.tolist() == [1, 1, 0] and counts.tolist() == [1, 2]
    assert tg.unique(x.t(), dim=1).tolist() == [[0, 1], [5, 2]]


def test_unique_keeps_every_nan_and_has_no_history():
    x = tg.tensor([float("nan"), 1.0, float("nan")], requires_grad=True)
    values, counts = tg.unique(x, return_counts=True)
    assert values.numpy()[0] == 1.0 and np.isnan(values.numpy()[1:]).all() and counts.tolist() == [1, 1, 1]
    assert not values.requires_grad and values.grad_fn is None


def test_nonzero_lists_indices_as_rows_or_as_one_tensor_per_dim():
    x = tg.tensor([[0.0, 1.5], [2.0, 0.0]]).t()  # (transposed: the order is the view's)
    assert tg.nonzero(x).tolist() == [[0, 1], [1, 0]]
    rows, cols = x.nonzero(as_tuple=True)
    assert rows.tolist() == [0, 1] and cols.tolist() == [1, 0]
    assert tg.nonzero(tg.tensor(3.0)).shape == (1, 0) and tg.nonzero(tg.tensor(0.0)).shape == (0, 0)
    assert [t.tolist() for t in tg.nonzero(tg.tensor(3.0), as_tuple=True)] == [[0]]
    assert tg.nonzero(tg.zeros(0, 3)).shape == (0, 2) and tg.nonzero(tg.tensor([True, False])).tolist() == [[0]]


def test_count_nonzero_over_all_or_some_dims():
    x = tg.tensor([[0, 1, 2], [0, 0, 3]])
    assert tg.count_nonzero(x).item() == 3 and x.count_nonzero(0).tolist() == [0, 1, 2]
    assert x.count_nonzero((0, 1)).item() == 3 and x.count_nonzero(dim=-1).dtype is tg.int64
    assert tg.count_nonzero(tg.zeros(0, 2), 0).tolist() == [0, 0]


def test_bincount_counts_or_sums_weights_with_pytorchs_dtypes():
    x = tg.tensor([0, 2, 2, 5])
    assert tg.bincount(x).tolist() == [1, 0, 2, 0, 0, 1] and x.bincount(minlength=8).shape == (8,)
    weighted = tg.bincount(x, tg.tensor([1.0, 0.5, 0.25, 2.0]))
    assert weighted.tolist() == [1.0, 0.0, 0.75, 0.0, 0.0, 2.0] and weighted.dtype is tg.float32
    assert tg.bincount(x, tg.tensor([1, 2, 3, 4])).dtype is tg.float64
    assert tg.bincount(tg.tensor([], dtype=tg.int64)).shape == (0,)


def test_histc_bins_like_pytorch():
    assert tg.histc(tg.tensor([1.0, 2.0, 1.0]), bins=4, min=0, max=3).tolist() == [0.0, 2.0, 1.0, 0.0]
    assert tg.tensor([1.0, 1.0]).histc(bins=4).tolist() == [0.0, 0.0, 2.0, 0.0]  # one point: widened by 1
    assert tg.histc(tg.tensor([1.0, 5.0, 7.0, 6.0]), bins=3, min=2, max=6).tolist() == [0.0, 0.0, 2.0]
    assert tg.histc(tg.ones(0), bins=3).tolist() == [0.0, 0.0, 0.0]
    assert tg.histc(tg.tensor([0.0, 1.0, float("nan")], dtype=tg.float64), bins=2).dtype is tg.float64


def test_searchsorted_left_right_rows_sorter_and_scalars():
    sequence = tg.tensor([1, 3, 5, 7])
    values = tg.tensor([[3, 6, 9]])
    assert tg.searchsorted(sequence, values).tolist() == [[1, 3, 4]]
    assert tg.searchsorted(sequence, values, right=True).tolist() == [[2, 3, 4]]
    assert tg.searchsorted(sequence, values, side="right").tolist() == [[2, 3, 4]]
    assert tg.searchsorted(sequence, 3.5).item() == 2 and tg.searchsorted(sequence, 3.5).shape == ()
    rows = tg.tensor([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]])
    assert tg.searchsorted(rows, tg.tensor([[2.5], [5.0]])).tolist() == [[2], [0]]
    unsorted = tg.tensor([5, 1, 3])
    assert tg.searchsorted(unsorted, tg.tensor([2, 4]), sorter=unsorted.argsort()).tolist() == [1, 2]


def test_bucketize_uses_boundaries_as_pytorch():
    boundaries = tg.tensor([1, 3, 5, 7])
    assert tg.bucketize(tg.tensor([1, 5, 7]), boundaries).tolist() == [0, 2, 3]
    assert tg.bucketize(tg.tensor([1, 5, 7]), boundaries, right=True).tolist() == [1, 3, 4]
    assert tg.bucketize(tg.tensor([[0.5], [8.0]]), boundaries).tolist() == [[0], [4]]


@pytest.mark.parametrize("call, error, message", [
    (lambda: tg.bincount(tg.tensor([-1, 2])), RuntimeError, "bincount only supports 1-d non-negative integral"),
    (lambda: tg.bincount(tg.tensor([[1, 2]])), RuntimeError, "bincount only supports 1-d non-negative integral"),
    (lambda: tg.bincount(tg.tensor([1.0])), RuntimeError, "bincount only supports 1-d non-negative integral"),
    (lambda: tg.bincount(tg.tensor([1, 2]), tg.ones(3)), RuntimeError, "weights should be 1-d and have the same"),
    (lambda: tg.histc(tg.tensor([1, 2])), RuntimeError, "\"histogram_cpu\" not implemented for 'Long'"),
    (lambda: tg.histc(tg.ones(2), bins=3, min=2, max=1), RuntimeError, "max must be larger than min"),
    (lambda: tg.histc(tg.ones(2), bins=0), RuntimeError, "bins must be > 0"),
    (lambda: tg.searchsorted(tg.ones(2, 4), tg.ones(3, 3)), RuntimeError,
     r"first N-1 dimensions of boundaries tensor and input value tensor must match.*\[2, 4\].*\[3, 3\]"),
    (lambda: tg.searchsorted(tg.ones(2), tg.ones(2), side="left", right=True), RuntimeError,
     "side and right can't be set to opposites"),
    (lambda: tg.searchsorted(tg.ones(2), tg.ones(2), out_int32=True), TypeError, "no int32 dtype"),
    (lambda: tg.bucketize(tg.ones(2), tg.ones(2, 2)), RuntimeError,
     r"boundaries tensor must be 1 dimension, but got dim\(2\)"),
    (lambda: tg.unique(tg.ones(2, 2), dim=2), IndexError, "unique: Dimension out of range"),
])
def test_bad_input_is_refused_with_the_ops_message(call, error, message):
    with pytest.raises(error, match=message):
        call()


def _counting_step(x):
    y = x * 2
    values, inverse, counts = tg.unique(y, return_inverse=True, return_counts=True)
    positions = tg.nonzero(y, as_tuple=True)
    return (values + 1, inverse, counts, tg.nonzero(y), positions[1], tg.bincount(y.flatten(), minlength=3),
            tg.count_nonzero(y, 0), tg.histc(y.double(), bins=5), tg.searchsorted(values, y),
            tg.bucketize(y, values, right=True), y.double()[positions].sum(), tg.unique(y, dim=1))


def test_compiled_data_dependent_results_equal_eager_on_every_call():
    compiled = tg.compile(_counting_step)
    for seed in range(6):  # values change every call, the shapes of some results too
        x = _ints((3, 4), seed, high=2 + seed)
        for got, want in zip(compiled(x), _counting_step(x)):
            assert got.shape == want.shape and got.dtype is want.dtype
            np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_compiled_results_of_one_shape_are_not_reused_across_calls():
    compiled = tg.compile(lambda x: (tg.unique(x * 1.0), tg.nonzero(x > 0).sum()))
    first = compiled(tg.tensor([1.0, 2.0, 0.0]))
    second = compiled(tg.tensor([5.0, 0.0, 4.0]))
    assert first[0].tolist() == [0.0, 1.0, 2.0] and second[0].tolist() == [0.0, 4.0, 5.0]
    assert first[1].item() == 1 and second[1].item() == 2


def test_compiled_gradient_flows_through_an_index_made_by_nonzero():
    def step(x):
        picked = x[tg.nonzero(x > 0, as_tuple=True)]
        return tg.autograd.grad((picked * picked).sum(), [x])[0]

    compiled = tg.compile(step)
    for seed in range(3):
        x = tg.tensor(np.random.default_rng(seed).standard_normal((3, 3)), requires_grad=True)
        np.testing.assert_array_equal(compiled(x).numpy(), step(x).numpy())


def test_compiled_data_dependent_ops_are_realization_points_at_the_users_line():
    def step(x):
        y = x * 2
        return tg.unique(y), tg.nonzero(y), tg.bincount(y)  # the realizing line

    line = step.__code__.co_firstlineno + 2
    report = tg.compile(step).explain(tg.tensor([0, 2, 1]))
    assert len(report.realizations) >= 1
    assert all(point.location.endswith(f"test_counting_and_searching.py:{line}") for point in report.realizations)


try:
    import torch
except ImportError:
    torch = None


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("seed", range(4))
def test_values_match_torch(seed):
    array = np.random.default_rng(seed).integers(0, 5, (4, 5))
    floats = np.random.default_rng(seed).standard_normal((4, 5)).round(1)
    calls = [
        lambda m, a, f: m.unique(a, return_inverse=True, return_counts=True),
        lambda m, a, f: m.unique(a, dim=1, return_inverse=True, return_counts=True),
        lambda m, a, f: m.nonzero(a), lambda m, a, f: m.nonzero(a, as_tuple=True),
        lambda m, a, f: m.count_nonzero(a, 1), lambda m, a, f: m.bincount(a[0], f[0], minlength=7),
        lambda m, a, f: m.histc(f, bins=7), lambda m, a, f: m.histc(f, bins=4, min=-1, max=1),
        lambda m, a, f: m.searchsorted(m.sort(f, 1).values, f),
        lambda m, a, f: m.searchsorted(m.sort(f[0]).values, f, right=True),
        lambda m, a, f: m.bucketize(f, m.sort(f[1]).values),
    ]
    for call in calls:
        ours = call(tg, tg.tensor(array), tg.tensor(floats))
        theirs = call(torch, torch.tensor(array), torch.tensor(floats))
        ours, theirs = (ours, theirs) if isinstance(ours, tuple) else ((ours,), (theirs,))
        for got, want in zip(ours, theirs):
            np.testing.assert_allclose(got.numpy(), want.numpy())
            assert got.shape == tuple(want.shape)
