"""The ordering primitives of `ops/sorting.py`: argsort's stable order (ascending and
descending, ties, NaN, transposed inputs) against Python's sorted, searchsorted on rows
against NumPy's per row, histc's binning against PyTorch's (elements on bin edges), their
shape rules' errors, and their nodes in compiled programs."""

import math

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ops import sorting


def _stable_order(row, descending):
    """Python's sort (stable), NaN above every number."""
    def key(i):
        value = row[i]
        rank = (1, 0.0) if math.isnan(value) else (0, value)
        return (-rank[0], -rank[1]) if descending else rank
    return sorted(range(len(row)), key=key)


@pytest.mark.parametrize("descending", [False, True])
def test_argsort_is_the_stable_order_with_nan_largest(descending):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 4, (5, 9)).astype(float)
    data[rng.random((5, 9)) < 0.15] = np.nan
    got = sorting.argsort(tg.tensor(data), 1, descending).tolist()
    assert got == [_stable_order(list(row), descending) for row in data]


def test_argsort_along_a_leading_axis_of_a_transposed_input():
    data = np.random.default_rng(1).integers(0, 3, (4, 6))
    got = sorting.argsort(tg.tensor(data.T.copy()).t(), 0, True).numpy()
    assert got.T.tolist() == [_stable_order(list(row.astype(float)), True) for row in data.T]


def test_argsort_of_bools_and_size_zero_axes():
    assert sorting.argsort(tg.tensor([True, False, True]), 0).tolist() == [1, 0, 2]
    assert sorting.argsort(tg.ones(3, 0), 1, True).shape == (3, 0)


def test_searchsorted_on_rows_searches_each_row_of_its_own():
    rng = np.random.default_rng(2)
    sequences = np.sort(rng.integers(0, 20, (2, 3, 6)), axis=-1)
    values = rng.integers(-1, 22, (2, 3, 4))
    for right in (False, True):
        got = sorting.searchsorted(tg.tensor(sequences), tg.tensor(values), right).numpy()
        side = "right" if right else "left"
        expected = [[np.searchsorted(s, v, side) for s, v in zip(ss, vv)] for ss, vv in zip(sequences, values)]
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("call, error, message", [
    (lambda: sorting.argsort(tg.ones(2), 1), IndexError, r"argsort: axis 1 out of range for a tensor of shape \[2\]"),
    (lambda: sorting.searchsorted(tg.ones(3), tg.tensor([1])), TypeError,
     r"boundaries \(float32\) and input value \(int64\) tensors must have the same dtype"),
    (lambda: sorting.searchsorted(tg.tensor(1.0), tg.ones(2)), RuntimeError, "should have positive dimension"),
    (lambda: sorting.histc(tg.ones(2) > 0, 3, 0.0, 0.0), RuntimeError, "not implemented for 'Bool'"),
])
def test_shape_rules_refuse_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_compiled_argsort_searchsorted_and_histc_run_as_numpy_steps_equal_to_eager():
    def step(x):
        order = sorting.argsort(x, 1, True)
        edges = tg.sort(x[0]).values
        return order, sorting.searchsorted(edges, x, True), sorting.histc(x * 2.0, 6, 0.0, 0.0)

    compiled = tg.compile(step)
    for seed in range(3):
        x = tg.tensor(np.random.default_rng(seed).standard_normal((3, 5)).round(1))
        for got, want in zip(compiled(x), step(x)):
            np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_histc_puts_elements_on_edges_in_pytorchs_bins(dtype):
    torch = pytest.importorskip("torch")
    for seed in range(30):
        data = np.random.default_rng(seed).standard_normal(25).round(1).astype(dtype)
        for bins, low, high in [(7, 0.0, 0.0), (4, -1.0, 1.0), (3, -0.3, 0.9), (5, 0.1, 0.1)]:
            ours = sorting.histc(tg.tensor(data), bins, low, high).numpy()
            theirs = torch.histc(torch.tensor(data), bins=bins, min=low, max=high).numpy()
            np.testing.assert_array_equal(ours, theirs, err_msg=f"seed {seed}, bins {bins}, [{low}, {high}]")
