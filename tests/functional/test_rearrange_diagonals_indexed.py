"""`functional/rearrange.py` (movedim, tensor_split, stacks, meshgrid, roll, rot90, tile,
repeat_interleave, block_diag, ...), `functional/diagonals.py` (diagonal, diag, diag_embed,
trace, triangle indices) and `functional/indexed.py` (index_*, scatter*, masked_select/
scatter, take, put, take_along_dim): values as PyTorch's, gradients against finite differences
(first and second order, float64), compiled equal to eager, views where PyTorch makes views,
PyTorch's errors raised before anything is written; compared with PyTorch where installed."""

import numpy as np
import pytest

import tracegrad as tg
from tests.functional.case_table import (
    CHECKS, assert_compiled_equals_eager, assert_gradients_check, assert_matches_torch,
)
from tests.functional.case_table import leaf as _leaf


def _scatter_index(m):
    return m.tensor([[0, 0, 2], [1, 3, 1]])  # (duplicates in row 0; smaller than self's rows)


# name -> (function of a module `m` and float64 inputs, input shapes); the same text runs
# with PyTorch as `m`.
CASES = {
    # rearrange.py
    "movedim": (lambda m, a: m.movedim(a, (0, 1), (2, 0)) * 2.0, [(2, 3, 4)]),
    "swapaxes": (lambda m, a: a.swapaxes(0, 2) * a.swapdims(2, 0), [(2, 3, 4)]),
    "unflatten": (lambda m, a: a.unflatten(1, (2, -1)) * 3.0, [(3, 4)]),
    "tensor_split": (lambda m, a: m.cat([p * (i + 1.0) for i, p in enumerate(m.tensor_split(a, [1, 3], 1))], 1),
                     [(3, 5)]),
    "tensor_split_sections": (lambda m, a: m.cat([p.sum(1) * (i + 1.0) for i, p in enumerate(a.tensor_split(3, 1))]),
                              [(2, 7)]),
    "vsplit": (lambda m, a: m.stack([p.sum() * (i + 1.0) for i, p in enumerate(m.vsplit(a, 2))]), [(4, 3)]),
    "hsplit": (lambda m, a: m.hsplit(a, [1])[1] * 2.0, [(2, 3)]),
    "hstack": (lambda m, a, b: m.hstack([a, b, a]), [(3, 2), (3, 4)]),
    "vstack": (lambda m, a, b: m.vstack([a, b]), [(3,), (2, 3)]),
    "dstack": (lambda m, a, b: m.dstack([a, b]), [(2, 3), (2, 3)]),
    "column_stack": (lambda m, a, b: m.column_stack([a, b]), [(3,), (3, 2)]),
    "broadcast_tensors": (lambda m, a, b: m.mul(*m.broadcast_tensors(a, b)), [(3, 1), (4,)]),
    "meshgrid_xy": (lambda m, a, b: m.stack(m.meshgrid(a, b, indexing="xy")) * 2.0, [(3,), (2,)]),
    "meshgrid_ij": (lambda m, a, b, c: (lambda g: g[0] * g[1] * g[2])(m.meshgrid(a, b, c, indexing="ij")),
                    [(2,), (3,), (2,)]),
    "roll": (lambda m, a: m.roll(a, (1, -2), (0, 1)) * a, [(3, 4)]),
    "roll_flat": (lambda m, a: a.roll(5), [(3, 4)]),
    "rot90": (lambda m, a: m.rot90(a, 1, (0, 1)) + m.rot90(a, 3, (1, 0)) * 2.0, [(3, 3)]),
    "rot90_two": (lambda m, a: a.rot90(2, (1, 2)), [(2, 3, 4)]),
    "tile": (lambda m, a: a.tile((2, 1, 2)), [(2, 3)]),
    "repeat_interleave": (lambda m, a: a.repeat_interleave(2, 1), [(3, 2)]),
    "repeat_interleave_tensor": (lambda m, a: a.repeat_interleave(m.tensor([1, 0, 2]), 0), [(3, 4)]),
    "repeat_interleave_flat": (lambda m, a: m.repeat_interleave(a, 2), [(2, 2)]),
    "atleast_3d": (lambda m, a: m.atleast_3d(a) * 1.0, [(3,)]),
    "block_diag": (lambda m, a, b: m.block_diag(a, b), [(2, 3), (1, 2)]),
    "cartesian_prod": (lambda m, a, b: m.cartesian_prod(a, b), [(3,), (2,)]),
    # diagonals.py
    "diagonal": (lambda m, a: a.diagonal(1, 0, 2) * 2.0, [(3, 2, 4)]),
    "diagonal_below": (lambda m, a: m.diagonal(a, -1) * a.diagonal(1), [(3, 3)]),
    "diag_of_vector": (lambda m, a: m.diag(a, -1), [(3,)]),
    "diag_of_matrix": (lambda m, a: m.diag(a, 1), [(3, 4)]),
    "diag_embed": (lambda m, a: m.diag_embed(a, 1, 0, 2), [(2, 3)]),
    "trace": (lambda m, a: m.trace(a) * a, [(3, 4)]),
    # scatter.py
    "index_select": (lambda m, a: a.index_select(1, m.tensor([2, 0, 2])), [(3, 4)]),
    "index_add": (lambda m, a, b: a.index_add(0, m.tensor([1, 0, 1]), b, alpha=2.0), [(2, 3), (3, 3)]),
    "index_copy": (lambda m, a, b: a.index_copy(1, m.tensor([2, 0]), b), [(3, 4), (3, 2)]),
    "index_fill": (lambda m, a: a.index_fill(1, m.tensor([1, 3]), -2.0), [(3, 4)]),
    "scatter": (lambda m, a, b: a.scatter(1, m.tensor([[0, 2], [3, 1], [1, 0]]), b), [(3, 4), (3, 2)]),
    "scatter_src_larger": (lambda m, a, b: a.scatter(1, m.tensor([[0, 2], [3, 1], [1, 0]]), b), [(3, 4), (3, 3)]),
    "scatter_value": (lambda m, a: a.scatter(0, m.tensor([[1, 0, 2, 1]]), 1.5), [(3, 4)]),
    "scatter_add": (lambda m, a, b: a.scatter_add(0, m.tensor([[0, 1, 0], [0, 0, 1]]), b), [(2, 3), (2, 3)]),
    "scatter_reduce_sum": (lambda m, a, b: a.scatter_reduce(1, _scatter_index(m), b, "sum"), [(3, 4), (2, 3)]),
    "scatter_reduce_mean": (lambda m, a, b: a.scatter_reduce(1, _scatter_index(m), b, "mean", include_self=False),
                            [(3, 4), (2, 3)]),
    "scatter_reduce_prod": (lambda m, a, b: a.scatter_reduce(1, _scatter_index(m), b, "prod"), [(3, 4), (2, 3)]),
    "scatter_reduce_prod_no_self": (lambda m, a, b: a.scatter_reduce(1, _scatter_index(m), b, "prod",
                                                                     include_self=False), [(3, 4), (2, 4)]),
    "scatter_reduce_amax": (lambda m, a, b: a.scatter_reduce(1, _scatter_index(m), b, "amax"), [(2, 4), (2, 3)]),
    "scatter_reduce_amin": (lambda m, a, b: a.scatter_reduce(0, m.tensor([[1, 0], [1, 1]]), b, "amin",
                                                            include_self=False), [(2, 3), (2, 2)]),
    "masked_select": (lambda m, a: a.masked_select(a > 0) * 2.0, [(3, 4)]),
    "masked_scatter": (lambda m, a, b: a.masked_scatter(a > 0, b), [(3, 4), (13,)]),
    "take": (lambda m, a: m.take(a, m.tensor([[0, -1], [5, 5]])), [(3, 4)]),
    "put": (lambda m, a, b: a.put(m.tensor([[0, -1], [5, 2]]), b), [(3, 4), (2, 2)]),
    "put_accumulate": (lambda m, a, b: m.put(a, m.tensor([1, 1, -12]), b, accumulate=True), [(3, 4), (3,)]),
    "take_along_dim": (lambda m, a: m.take_along_dim(a, m.tensor([[2], [0], [1]]), 1), [(3, 4)]),
    "take_along_dim_flat": (lambda m, a: m.take_along_dim(a, m.tensor([3, 0, 3])), [(2, 2)]),
}


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", CASES)
def test_gradients_match_finite_differences(name, check):
    assert_gradients_check(check, *CASES[name])


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", ["roll", "rot90", "diagonal_below", "diag_of_matrix", "trace", "index_select",
                                  "scatter", "scatter_reduce_amax", "take_along_dim", "hstack"])
def test_gradients_on_transposed_inputs(name, check):
    assert_gradients_check(check, *CASES[name], transposed=True)


@pytest.mark.parametrize("name", CASES)
def test_compiled_values_and_gradients_equal_eager(name):
    assert_compiled_equals_eager(*CASES[name])


def test_scatter_reduce_amax_shares_the_gradient_among_ties_self_included():
    src = tg.tensor([1.0, 2.0, 2.0], dtype=tg.float64, requires_grad=True)
    input = tg.tensor([2.0, 0.0], dtype=tg.float64, requires_grad=True)
    out = input.scatter_reduce(0, tg.tensor([0, 0, 0]), src, "amax")
    out.sum().backward()
    assert out.tolist() == [2.0, 0.0]
    np.testing.assert_allclose(src.grad.numpy(), [0.0, 1 / 3, 1 / 3])
    np.testing.assert_allclose(input.grad.numpy(), [1 / 3, 1.0])


def test_scatter_with_repeated_indices_writes_their_mean():
    out = tg.zeros(2).scatter(0, tg.tensor([1, 1, 0]), tg.tensor([1.0, 2.0, 3.0]))
    assert out.tolist() == [3.0, 1.5]


def test_diagonal_is_a_view_of_contiguous_and_transposed_inputs():
    x = tg.arange(12.0).reshape(3, 4)
    x.diagonal(1).mul_(-1.0)
    assert x[0, 1].item() == -1.0 and x[2, 3].item() == -11.0 and x[0, 0].item() == 0.0
    xt = tg.arange(12.0).reshape(4, 3).t()
    d = xt.diagonal(-1)
    assert d._base is not None
    d.fill_(100.0)
    assert xt[1, 0].item() == 100.0 and xt[2, 1].item() == 100.0 and xt[0, 0].item() == 0.0


def test_diag_of_a_matrix_is_a_copy():
    x = tg.ones(3, 3)
    tg.diag(x).zero_()
    assert x.sum().item() == 9.0


def test_views_and_copies_as_in_pytorch():
    x = tg.arange(24.0).reshape(2, 3, 4)
    for view in (x.movedim(0, 2), x.swapaxes(0, 1), x.unflatten(2, (2, 2)), x.tensor_split(2, 2)[1],
                 tg.broadcast_tensors(x, tg.ones(4))[0], tg.meshgrid(tg.arange(3.0), tg.arange(2.0))[0]):
        assert view._base is not None
    x.tensor_split([1], 1)[0].zero_()
    assert x[:, 0].sum().item() == 0.0 and x[:, 1].sum().item() != 0.0
    for copy in (x.roll(1, 0), x.rot90(), x.tile((2,)), x.repeat_interleave(2, 0), tg.hstack([x, x])):
        assert copy._base is None


@pytest.mark.parametrize("make", [
    lambda x: x.repeat(1, 1), lambda x: x.tile((1,)), lambda x: x.repeat(2, 1), lambda x: x.tile((1, 2)),
    lambda x: x.repeat_interleave(1, dim=0), lambda x: x.repeat_interleave(1), lambda x: x.repeat_interleave(2, 1),
    lambda x: x.repeat_interleave(2, dim=0),
], ids=["repeat_ones", "tile_ones", "repeat_rows", "tile_last", "interleave_one", "interleave_flat",
        "interleave_last", "interleave_rows"])
def test_repeat_tile_and_repeat_interleave_give_fresh_tensors_a_write_into_which_leaves_the_input(make):
    # (fuzz seed 30000424: tile((2,)) of an int (3, 1) tensor returned an expansion, so a
    # setitem into it raised; repeat(1, 1) returned the input's memory, so writes went through)
    x = tg.tensor([[1.0, 2.0]])
    out = make(x)
    out[0] = 9.0
    out.add_(1.0)
    assert x.tolist() == [[1.0, 2.0]]
    assert out._base is None and out[0].eq(10.0).all().item()


def test_size_zero_and_size_one_inputs():
    empty = tg.ones(0, 3)
    assert empty.movedim(0, 1).shape == (3, 0) and empty.diagonal().shape == (0,)
    assert [p.shape for p in empty.tensor_split(2, 1)] == [(0, 2), (0, 1)]
    assert empty.roll(2, 1).shape == (0, 3) and empty.repeat_interleave(3, 0).shape == (0, 3)
    assert tg.diag_embed(tg.ones(0)).shape == (0, 0) and tg.trace(tg.ones(0, 0)).item() == 0.0
    assert empty.index_select(1, tg.tensor([2, 2])).shape == (0, 2)
    assert empty.scatter_add(0, tg.zeros(0, 3, dtype=tg.int64), empty).shape == (0, 3)
    assert tg.ones(2, 3).index_select(0, tg.tensor([], dtype=tg.int64)).shape == (0, 3)
    assert tg.ones(2, 3).masked_select(tg.zeros(2, 3) > 0).shape == (0,)
    one = tg.tensor([[5.0]])
    assert one.diagonal().tolist() == [5.0] and tg.diag(tg.tensor([5.0])).tolist() == [[5.0]]
    assert one.scatter_reduce(1, tg.tensor([[0]]), tg.tensor([[2.0]]), "prod").tolist() == [[10.0]]
    assert tg.triu_indices(0, 3).shape == (2, 0) and tg.tril_indices(1, 1).tolist() == [[0], [0]]


def test_in_place_forms_write_and_send_gradients():
    x = _leaf(3, 4)
    source = _leaf(2, 4, seed=5)
    y = x * 1.0
    y.index_add_(0, tg.tensor([2, 0]), source).scatter_(1, tg.tensor([[1], [0], [3]]), 0.0)
    y.index_fill_(0, tg.tensor([1]), 7.0)
    (y * y).sum().backward()
    expected = x.detach().numpy().copy()
    expected[[2, 0]] += source.detach().numpy()
    expected[[0, 1, 2], [1, 0, 3]] = 0.0
    expected[1] = 7.0
    np.testing.assert_allclose(y.detach().numpy(), expected)
    grad = 2 * expected
    grad[[0, 1, 2], [1, 0, 3]] = 0.0
    grad[1] = 0.0
    np.testing.assert_allclose(x.grad.numpy(), grad)
    np.testing.assert_allclose(source.grad.numpy(), grad[[2, 0]])


@pytest.mark.parametrize("call, message", [
    (lambda x: x.index_add_(0, tg.tensor([0, 5]), tg.ones(2, 4)), "index 5 is out of bounds for dimension 0"),
    (lambda x: x.index_add_(0, tg.tensor([0.0]), tg.ones(1, 4)), "Expected dtype int64 for index"),
    (lambda x: x.index_copy_(0, tg.tensor([0, 1]), tg.ones(2, 3)), r"source of shape \[2, 3\] does not match"),
    (lambda x: x.index_fill_(2, tg.tensor([0]), 1.0), "Dimension out of range"),
    (lambda x: x.scatter_(1, tg.tensor([[0, 4]]), 1.0), "index 4 is out of bounds for dimension 1 with size 4"),
    (lambda x: x.scatter_(1, tg.tensor([0, 1]), 1.0), "Index tensor must have the same number of dimensions"),
    (lambda x: x.scatter_add_(0, tg.tensor([[0, 1, 0, 1, 0]]), tg.ones(1, 5)), "to be smaller than self"),
    (lambda x: x.scatter_reduce_(0, tg.tensor([[0]]), tg.ones(1, 1), "max"), "reduce argument must be either sum"),
    (lambda x: x.scatter_(0, tg.tensor([[0]]), tg.ones(1, 1), reduce="mean"), "must be either add or multiply"),
    (lambda x: x.masked_scatter_(x > 0, tg.ones(2)), "expected source to have at least 12 elements"),
    (lambda x: x.masked_scatter_(tg.ones(3, 4), tg.ones(12)), "expected BoolTensor for mask"),
    (lambda x: x.put_(tg.tensor([0, 12]), tg.ones(2)), "index 12 is out of bounds for dimension 0 with size 12"),
    (lambda x: x.put_(tg.tensor([0, 1]), tg.ones(3)), "Expected source and index to have the same number"),
])
def test_bad_input_is_refused_before_anything_is_written(call, message):
    x = tg.ones(3, 4)
    version = x._version
    with pytest.raises((RuntimeError, IndexError), match=message):
        call(x)
    assert x.tolist() == tg.ones(3, 4).tolist() and x._version == version


@pytest.mark.parametrize("call, message", [
    (lambda: tg.ones(3, 3).diagonal(0, 1, -1), "diagonal dimensions cannot be identical"),
    (lambda: tg.diag(tg.ones(2, 2, 2)), r"diag\(\): Supports 1D or 2D tensors"),
    (lambda: tg.trace(tg.ones(3)), "trace: expected a matrix"),
    (lambda: tg.movedim(tg.ones(2, 3), (0, 1), 0), "movedim: Invalid source or destination dims"),
    (lambda: tg.ones(2, 6).unflatten(1, (4, -1)), "don't multiply up to the size of dim 1"),
    (lambda: tg.ones(3).tensor_split(0), "number of sections must be larger than 0"),
    (lambda: tg.vsplit(tg.ones(3, 2), 2), "is not divisible by the split_size 2"),
    (lambda: tg.roll(tg.ones(2, 2), (1, 1)), "`shifts` required to be of size 1"),
    (lambda: tg.rot90(tg.ones(2, 2), 1, (0, 0)), "expected rotation dims to be different"),
    (lambda: tg.meshgrid(tg.ones(2), tg.ones(2), indexing="yx"), "indexing must be one of"),
    (lambda: tg.broadcast_tensors(tg.ones(2), tg.ones(3)), "cannot be broadcast"),
    (lambda: tg.ones(3).repeat_interleave(tg.tensor([1, 2]), 0), "repeats must have the same size as input"),
    (lambda: tg.block_diag(tg.ones(1, 1, 1)), "Input tensors must have 2 or fewer dimensions"),
    (lambda: tg.ones(2, 3).index_select(0, tg.tensor([[0]])), "Index is supposed to be a vector"),
    (lambda: tg.take_along_dim(tg.ones(2, 3), tg.tensor([0]), 1), "should have the same number of dimensions"),
])
def test_bad_shapes_and_dims_are_refused_with_the_ops_message(call, message):
    with pytest.raises((RuntimeError, IndexError), match=message):
        call()


def test_take_along_dim_keeps_its_indices_along_a_dim_and_reads_them_flattened_without_one():
    """As PyTorch's: along a dim it gathers with a copy of the (broadcast) indices, so an
    update of the indices before the backward changes no gradient; with dim=None it reads a
    view of them, and the backward raises (fuzz seed 84821112 with PyTorch)."""
    def run(dim):
        a = tg.arange(4.0).reshape(4, 1).requires_grad_()
        j = tg.tensor([[1], [0]])
        out = tg.take_along_dim(a, j, dim)
        j.fill_(3)
        out.sum().backward()
        return a.grad.flatten().tolist()

    assert run(0) == [1.0, 1.0, 0.0, 0.0]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        run(None)


def test_helpers_without_gradients_match_pytorchs_definitions():
    assert tg.broadcast_shapes((2, 1), (3,), 1) == (2, 3)
    assert tg.triu_indices(3, 4, 1).tolist() == [[0, 0, 0, 1, 1, 2], [1, 2, 3, 2, 3, 3]]
    assert tg.tril_indices(3, 3, -1).tolist() == [[1, 2, 2], [0, 0, 1]]
    assert tg.repeat_interleave(tg.tensor([2, 0, 1])).tolist() == [0, 0, 2]
    assert tg.atleast_2d(tg.tensor(1.0)).shape == (1, 1) and tg.atleast_3d(tg.ones(2, 3)).shape == (2, 3, 1)
    assert [t.shape for t in tg.atleast_1d(tg.tensor(1.0), tg.ones(2, 2))] == [(1,), (2, 2)]


try:
    import torch
except ImportError:
    torch = None


# PyTorch 2.13's own backward of scatter refuses a src larger than the index (its gradient
# has the index's shape): these are checked against finite differences only.
TORCH_BACKWARD_FAILS = {"scatter_src_larger", "scatter_reduce_prod_no_self"}


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("name", [name for name in CASES if name not in TORCH_BACKWARD_FAILS])
def test_values_and_gradients_match_torch(name):
    assert_matches_torch(torch, *CASES[name])


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("offset", [-2, 0, 1, 5])
@pytest.mark.parametrize("dims", [(0, 1), (2, 0), (1, -1)])
@pytest.mark.parametrize("transposed", [False, True])
def test_diagonal_and_diag_embed_match_torch_for_any_dims(offset, dims, transposed):
    data = np.random.default_rng(3).standard_normal((3, 4, 5))
    ours, theirs = tg.tensor(data), torch.tensor(data)
    if transposed:
        ours, theirs = ours.transpose(0, 2), theirs.transpose(0, 2)
    np.testing.assert_array_equal(ours.diagonal(offset, *dims).numpy(), theirs.diagonal(offset, *dims).numpy())
    np.testing.assert_array_equal(tg.diag_embed(ours, offset, *dims).numpy(),
                                  torch.diag_embed(theirs, offset, *dims).numpy())
