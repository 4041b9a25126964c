"""Indexing: basic (ints, slices with steps, None, Ellipsis), advanced (integer arrays,
boolean masks), gather, and `t[key] = value`. Forward values against NumPy indexing;
gradients against finite differences (first and second order, float64)."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck

CHECKS = [pytest.param(gradcheck, id="grad"), pytest.param(gradgradcheck, id="gradgrad")]

MASK = np.array([[True, False, True, False], [False, True, True, False], [True, False, False, True]])

# name -> key (the same key indexes a NumPy array and a tensor of `source_shape(name)`)
KEYS = {
    "slice_with_step": (slice(1, None), slice(None, None, 2)),
    "negative_slice_bounds": (slice(-2, None), slice(None, -1)),
    "int": 1,
    "negative_int": -1,
    "int_then_slice": (0, slice(1, 3)),
    "none": (None, slice(None), 1),
    "ellipsis": (Ellipsis, 2),
    "ellipsis_none": (None, Ellipsis, None),
    "full_slice": slice(None),
    "empty_slice": slice(2, 1),
    "int_list": [0, 2, 0],
    "int_array_2d": np.array([[0, 1], [2, 2]]),
    "two_int_arrays": ([0, 2, 1], [3, 0, 0]),
    "int_array_after_slice": (slice(None), [3, 1]),
    "int_array_and_int": ([2, 0], 1),
    "non_adjacent_arrays": ([0, 2], slice(None), [1, 0]),
    "bool_mask": MASK,
    "bool_rows": np.array([True, False, True]),
    "bool_columns": (slice(None), np.array([False, True, True, False])),
}


def source_shape(name):
    return (3, 2, 4) if name == "non_adjacent_arrays" else (3, 4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", KEYS)
def test_getitem_matches_numpy(name, dtype):
    data = np.random.standard_normal(source_shape(name)).astype(dtype)
    key = KEYS[name]
    out = tg.from_numpy(data)[key]
    expected = data[key]
    assert out.shape == expected.shape
    assert out.dtype.np == np.dtype(dtype)
    np.testing.assert_array_equal(out.numpy(), expected)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", [name for name in KEYS if name != "empty_slice"])
def test_getitem_gradients(name, check):
    x = tg.from_numpy(np.random.standard_normal(source_shape(name))).requires_grad_()
    key = KEYS[name]
    assert check(lambda t: t[key], (x,))


def test_empty_slice_gradients():
    x = tg.from_numpy(np.random.standard_normal((3, 4))).requires_grad_()
    assert gradcheck(lambda t: t[2:1], (x,))


def test_empty_slice_second_order_gradients():
    x = tg.from_numpy(np.random.standard_normal((3, 4))).requires_grad_()
    assert gradgradcheck(lambda t: t[2:1], (x,))


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", ["slice_with_step", "int_list", "bool_mask"])
def test_getitem_gradients_on_transposed_input(name, check):
    x = tg.from_numpy(np.random.standard_normal((4, 3)).T).requires_grad_()
    assert not x.is_contiguous()
    key = KEYS[name]
    assert check(lambda t: t[key], (x,))


def test_indexing_with_a_tensor_of_indices():
    data = np.random.standard_normal((3, 4))
    out = tg.tensor(data)[tg.tensor([2, 0])]
    np.testing.assert_array_equal(out.numpy(), data[[2, 0]])


def test_indexing_with_a_bool_tensor_mask():
    data = np.random.standard_normal((3, 4))
    out = tg.tensor(data)[tg.tensor(data) > 0]
    np.testing.assert_array_equal(out.numpy(), data[data > 0])


def test_indexing_with_a_0d_integer_tensor_acts_like_an_int():
    data = np.random.standard_normal((3, 4))
    out = tg.tensor(data)[tg.tensor(1)]
    np.testing.assert_array_equal(out.numpy(), data[1])


def test_gradient_of_an_empty_slice_is_zero():
    x = tg.tensor(np.ones((3, 4)), requires_grad=True)
    y = x[2:1]
    assert y.shape == (0, 4)
    (y.sum() + x[0, 0]).backward()
    expected = np.zeros((3, 4))
    expected[0, 0] = 1.0
    np.testing.assert_array_equal(x.grad.numpy(), expected)


def test_repeated_indices_accumulate_their_gradients():
    x = tg.tensor(np.zeros(3), requires_grad=True)
    x[[0, 0, 2, 0]].sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 0.0, 1.0])


def test_full_slice_is_a_view_sharing_memory():
    x = tg.zeros(2, 3)
    y = x[:]
    x.add_(1.0)
    np.testing.assert_array_equal(y.numpy(), np.ones((2, 3)))


def test_iterating_a_tensor_yields_its_rows():
    data = np.random.standard_normal((3, 2))
    rows = [row.numpy() for row in tg.tensor(data)]
    np.testing.assert_array_equal(np.stack(rows), data)


# --- gather --------------------------------------------------------------------------------

GATHER_CASES = {  # name -> (dim, index)
    "dim1": (1, [[0, 2], [3, 3], [1, 0]]),
    "dim0": (0, [[2, 0, 1, 1]]),
    "negative_dim": (-1, [[1], [0], [3]]),
    "smaller_index_than_input": (1, [[0], [2]]),
}


def gather_reference(data, dim, index):
    view = data[tuple(slice(0, n) if d != dim % data.ndim else slice(None) for d, n in enumerate(index.shape))]
    return np.take_along_axis(view, index, axis=dim)


@pytest.mark.parametrize("name", GATHER_CASES)
def test_gather_matches_take_along_axis(name):
    dim, index = GATHER_CASES[name]
    index = np.array(index)
    data = np.random.standard_normal((3, 4))
    out = tg.tensor(data).gather(dim, tg.tensor(index))
    np.testing.assert_array_equal(out.numpy(), gather_reference(data, dim, index))


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", GATHER_CASES)
def test_gather_gradients(name, check):
    dim, index = GATHER_CASES[name]
    index = tg.tensor(index)
    x = tg.from_numpy(np.random.standard_normal((3, 4))).requires_grad_()
    assert check(lambda t: tg.gather(t, dim, index), (x,))


def test_gather_along_dim_0_of_a_0d_tensor_reads_its_element():
    x = tg.tensor(2.5, requires_grad=True)
    for dim in (0, -1):
        out = x.gather(dim, tg.tensor(0))
        assert out.detach().numpy().shape == () and out.item() == 2.5
    out.backward()
    assert x.grad.item() == 1.0


def test_gather_gradient_adds_up_repeated_indices():
    x = tg.tensor(np.zeros((1, 3)), requires_grad=True)
    x.gather(1, tg.tensor([[1, 1, 1]])).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0.0, 3.0, 0.0]])


# --- setitem -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["slice_with_step", "int", "int_list", "bool_mask", "ellipsis"])
def test_setitem_matches_numpy(name):
    data = np.random.standard_normal((3, 4))
    key = KEYS[name]
    x = tg.tensor(data.copy())
    x[key] = 7.0
    data[key] = 7.0
    np.testing.assert_array_equal(x.numpy(), data)


@pytest.mark.parametrize("dtype", [tg.float32, tg.int64])
def test_setitem_with_repeated_indices_writes_the_value_once(dtype):
    x = tg.zeros(4, dtype=dtype)
    x[[0, 2, 0, 0]] = 7
    np.testing.assert_array_equal(x.numpy(), [7, 0, 7, 0])


def test_setitem_with_a_broadcast_tensor_value():
    x = tg.zeros(3, 4)
    x[1:] = tg.tensor([1.0, 2.0, 3.0, 4.0])
    expected = np.zeros((3, 4))
    expected[1:] = [1.0, 2.0, 3.0, 4.0]
    np.testing.assert_array_equal(x.numpy(), expected)


def test_setitem_gradient_flows_to_the_written_value_and_the_kept_elements():
    value = tg.tensor(np.array([5.0, 6.0]), requires_grad=True)
    base = tg.tensor(np.ones(4), requires_grad=True)
    x = base * 1.0
    x[1:3] = value
    (x * tg.tensor(np.array([1.0, 2.0, 3.0, 4.0]))).sum().backward()
    np.testing.assert_array_equal(value.grad.numpy(), [2.0, 3.0])
    np.testing.assert_array_equal(base.grad.numpy(), [1.0, 0.0, 0.0, 4.0])


@pytest.mark.parametrize("key", [(slice(None), slice(None)), Ellipsis], ids=["all_slices", "ellipsis"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_setitem_of_every_element_keeps_the_old_history_with_a_zero_gradient(key, compiled):
    # fuzz seed 84801999 (PyTorch as oracle): `x[:, :] = v` with v requiring grad cut x's
    # old history off, so a leaf behind it got no .grad (None) where PyTorch's CopySlices
    # gives it zeros (and an optimizer's weight decay and momentum then update it).
    def step(leaf, other):
        x = leaf * tg.ones(1, 4, dtype=tg.float64)
        x[key] = other.sum()
        loss = (x * x).sum()
        return (loss, *tg.autograd.grad(loss, [leaf, other], allow_unused=True))

    leaf = tg.tensor([[0.5]], dtype=tg.float64, requires_grad=True)
    other = tg.tensor([1.0, -2.0, 0.25], dtype=tg.float64, requires_grad=True)
    fn = tg.compile(step) if compiled else step
    for _ in range(2 if compiled else 1):
        loss, leaf_grad, other_grad = fn(leaf, other)
    assert leaf_grad is not None and leaf_grad.tolist() == [[0.0]]
    np.testing.assert_array_equal(other_grad.numpy(), [-6.0, -6.0, -6.0])  # d/dv of 4 v^2 at v = -0.75
    assert loss.item() == 4 * 0.75 ** 2


_LONG, _DOUBLE = tg.tensor([1, 2]), tg.tensor(1.0, dtype=tg.float64)


@pytest.mark.parametrize("key, value, refused", [
    ([0, 1], _LONG, True), ([0, 1], tg.tensor(1), True), (tg.tensor([0, 1]), _DOUBLE, True),
    ((slice(None), [0, 1]), _DOUBLE, True), ((0, [1, 2]), _DOUBLE, True), ((Ellipsis, [1, 2]), _DOUBLE, True),
    (tg.tensor([True, False, True]), tg.ones(4, dtype=tg.float64), True),
    ([0], tg.tensor(1.0, dtype=tg.float64, requires_grad=True), True),
    (tg.tensor([True, False, True]), tg.tensor([2]), False),  # one mask, one element: masked_fill_ converts
    ((tg.tensor([True, False, True]), slice(0, 2)), _DOUBLE, False),
    (slice(0, 2), tg.tensor([[1, 2, 3, 4]]), False),  # no index tensor: copy_ converts
    (tg.tensor(1), _DOUBLE, False),  # a 0-d integer tensor is an int
    ([0, 1], 5, False), ([0], tg.tensor(1.0), False),
], ids=str)
def test_setitem_through_index_tensors_takes_a_tensor_value_only_of_its_dtype(key, value, refused):
    """PyTorch's index_put_ rule (fuzz seeds 84820946, 84820149, 84820849 with PyTorch):
    refused before anything changes, eagerly and compiled."""
    def write(x):
        x[key] = value
        return x

    for fn in (write, tg.compile(write)):
        x = tg.zeros(3, 4)
        if refused:
            source = "Double" if value.dtype == tg.float64 else "Long"
            with pytest.raises(RuntimeError, match="Index put requires the source and destination dtypes match, "
                                                   f"got Float for the destination and {source}"):
                fn(x)
            assert x.tolist() == [[0.0] * 4] * 3 and x._version == 0
        else:
            fn(x)
            assert x._version == 1


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_index_put_replaces_or_accumulates_at_index_tensors_as_pytorch(compiled):
    i, j = tg.tensor([0, 2, 0]), tg.tensor([1, 1, 1])

    def puts(x, values):
        return (x.index_put((i, j), values, accumulate=True), tg.index_put(x, (i,), values[:1], True),
                x.clone().index_put_([i[1:]], values[:1]), x.index_put((i[1:], j[1:]), values[1:]))

    fn = tg.compile(puts) if compiled else puts
    x, values = tg.arange(6.0).reshape(3, 2), tg.tensor([1.0, 2.0, 3.0])
    for _ in range(2 if compiled else 1):
        added, rows, put_, replaced = fn(x, values)
    assert added.tolist() == [[0.0, 5.0], [2.0, 3.0], [4.0, 7.0]]  # (0, 1) gets 1 + 3
    assert rows.tolist() == [[2.0, 3.0], [2.0, 3.0], [5.0, 6.0]]
    assert put_.tolist() == [[1.0, 1.0], [2.0, 3.0], [1.0, 1.0]]
    assert replaced.tolist() == [[0.0, 3.0], [2.0, 3.0], [4.0, 2.0]]
    with pytest.raises(TypeError, match="argument 'indices' must be tuple of Tensors"):
        x.index_put(i, values)


@pytest.mark.parametrize("check", [gradcheck, gradgradcheck], ids=["grad", "gradgrad"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_gradients_reach_the_tensor_and_the_values(accumulate, check):
    i = tg.tensor([0, 2, 0]) if accumulate else tg.tensor([0, 2])
    x = tg.tensor(np.random.default_rng(3).standard_normal((3, 2)), requires_grad=True)
    values = tg.tensor(np.random.default_rng(4).standard_normal((len(i), 2)), requires_grad=True)
    assert check(lambda a, v: a.index_put((i,), v, accumulate=accumulate) * a, (x, values))


@pytest.mark.parametrize("adder", ["generated_loop", "numpy_rounds"])
@pytest.mark.parametrize("repeats", ["few", "more_than_the_rounds", "some_more_than_the_rounds"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_index_add_of_rows_equals_numpys_add_at_to_the_bit(dtype, repeats, adder, monkeypatch):
    # Rows added at repeated indices (an embedding's gradient) are summed in order of
    # appearance, as np.add.at sums them: same bits, -0.0 and infinities included; also
    # where a few indices repeat more than the rounds take (a language model's frequent
    # words) and the others are added in rounds. Both ways: the code generator's loop
    # (codegen/row_adds.py; int64 has none and takes the rounds) and NumPy's rounds.
    from tracegrad.codegen import row_adds
    from tracegrad.ops import indexing
    monkeypatch.setattr(indexing, "_row_adder", row_adds.add_rows if adder == "generated_loop" else None)
    rng = np.random.default_rng(7)
    count = 3 * indexing.MAX_ADD_ROUNDS if repeats == "more_than_the_rounds" else 24
    if repeats == "some_more_than_the_rounds":
        count = 12 * indexing.MAX_ADD_ROUNDS
        index = np.minimum(rng.zipf(1.5, (count // 4, 4)) - 1, 9) - 5  # (0 and -5 the most repeated)
    else:
        index = rng.integers(-5, 5, (count // 4, 4)) if repeats == "few" else np.zeros((count // 4, 4), np.int64)
    src = (rng.standard_normal((count // 4, 4, 3)) * 1e3).astype(dtype)
    if dtype != np.int64:
        src[rng.random(src.shape) < 0.2] = -0.0
        src[0, 0, 0] = np.inf
    want = np.zeros((5, 3), dtype)
    np.add.at(want, (index,), src)
    got = indexing.index_add((5, 3), tg.from_numpy(src), [tg.from_numpy(index)], 0).numpy()
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_reference_mode_adds_rows_by_numpy(monkeypatch):
    from tracegrad.ops import indexing

    def adder(*args):
        raise AssertionError("the generated row loop ran in reference mode")
    monkeypatch.setattr(indexing, "_row_adder", adder)
    src = np.arange(12.0).reshape(4, 3)
    index = np.array([1, 0, 1, 1])
    want = np.zeros((2, 3))
    np.add.at(want, (index,), src)
    with tg.reference_mode():
        got = indexing.index_add((2, 3), tg.from_numpy(src), [tg.from_numpy(index)], 0).numpy()
    np.testing.assert_array_equal(got, want)
