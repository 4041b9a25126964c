"""Movement and copy ops: reshape/view/flatten, transpose/permute/T, unsqueeze/squeeze,
expand/broadcast_to, cat/stack, clone/contiguous, dtype conversion. Forward values
against NumPy; gradients against finite differences (first and second order, float64)."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck

CHECKS = [pytest.param(gradcheck, id="grad"), pytest.param(gradgradcheck, id="gradgrad")]


def leaf(*shape):
    return tg.from_numpy(np.random.standard_normal(shape)).requires_grad_()


def transposed_leaf(*shape):
    """A non-contiguous float64 leaf of `shape`: the transpose of a NumPy array."""
    return tg.from_numpy(np.random.standard_normal(shape[::-1]).T).requires_grad_()


# name -> (tracegrad function, NumPy reference, input shape)
MOVEMENT = {
    "reshape": (lambda x: x.reshape(3, 2), lambda a: a.reshape(3, 2), (2, 3)),
    "reshape_infer": (lambda x: x.reshape(-1, 2), lambda a: a.reshape(-1, 2), (2, 3)),
    "reshape_tuple": (lambda x: x.reshape((6,)), lambda a: a.reshape(6), (2, 3)),
    "view": (lambda x: x.view(1, 6), lambda a: a.reshape(1, 6), (2, 3)),
    "flatten": (lambda x: x.flatten(), lambda a: a.reshape(-1), (2, 3, 2)),
    "flatten_range": (lambda x: x.flatten(1, -1), lambda a: a.reshape(2, 6), (2, 3, 2)),
    "transpose": (lambda x: x.transpose(0, -1), lambda a: np.swapaxes(a, 0, -1), (2, 3, 2)),
    "permute": (lambda x: x.permute(2, 0, 1), lambda a: np.transpose(a, (2, 0, 1)), (2, 3, 2)),
    "permute_negative": (lambda x: x.permute(-1, 0, 1), lambda a: np.transpose(a, (2, 0, 1)), (2, 3, 2)),
    "T": (lambda x: x.T, lambda a: a.T, (2, 3)),
    "mT": (lambda x: x.mT, lambda a: np.swapaxes(a, -1, -2), (2, 3, 2)),
    "t": (lambda x: x.t(), lambda a: a.T, (2, 3)),
    "unsqueeze": (lambda x: x.unsqueeze(1), lambda a: np.expand_dims(a, 1), (2, 3)),
    "unsqueeze_negative": (lambda x: x.unsqueeze(-1), lambda a: np.expand_dims(a, -1), (2, 3)),
    "squeeze": (lambda x: x.squeeze(), lambda a: np.squeeze(a), (2, 1, 3, 1)),
    "squeeze_dim": (lambda x: x.squeeze(-1), lambda a: np.squeeze(a, -1), (2, 1, 3, 1)),
    "squeeze_non_singleton": (lambda x: x.squeeze(0), lambda a: a, (2, 1, 3, 1)),
    "expand": (lambda x: x.expand(4, 2, 3), lambda a: np.broadcast_to(a, (4, 2, 3)), (2, 1)),
    "expand_minus_one": (lambda x: x.expand(-1, 3), lambda a: np.broadcast_to(a, (2, 3)), (2, 1)),
    "broadcast_to": (lambda x: x.broadcast_to((2, 2, 3)), lambda a: np.broadcast_to(a, (2, 2, 3)), (3,)),
    "clone": (lambda x: x.clone(), lambda a: a.copy(), (2, 3)),
    "contiguous": (lambda x: x.contiguous(), lambda a: a, (2, 3)),
    "double": (lambda x: x.double(), lambda a: a, (2, 3)),
    "to_float64": (lambda x: x.to(tg.float64), lambda a: a, (2, 3)),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", MOVEMENT)
def test_movement_forward_matches_numpy(name, dtype):
    fn, reference, shape = MOVEMENT[name]
    data = np.random.standard_normal(shape).astype(dtype)
    out = fn(tg.from_numpy(data))
    expected = reference(data)
    assert out.shape == expected.shape
    np.testing.assert_array_equal(out.numpy(), expected)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", MOVEMENT)
def test_movement_gradients(name, check):
    fn, _, shape = MOVEMENT[name]
    assert check(fn, (leaf(*shape),))


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", ["reshape", "view", "flatten", "T", "unsqueeze", "permute", "contiguous"])
def test_movement_gradients_on_transposed_input(name, check):
    fn, _, shape = MOVEMENT[name]
    x = transposed_leaf(*shape)
    assert not x.is_contiguous()
    assert check(fn, (x,))


def test_contiguous_of_a_transposed_tensor_is_a_contiguous_copy():
    x = tg.tensor(np.arange(6.0).reshape(2, 3)).T
    assert not x.is_contiguous()
    y = x.contiguous()
    assert y.is_contiguous()
    np.testing.assert_array_equal(y.numpy(), np.arange(6.0).reshape(2, 3).T)


def test_contiguous_of_a_contiguous_tensor_is_itself():
    x = tg.ones(2, 3)
    assert x.contiguous() is x


def test_clone_does_not_share_memory():
    x = tg.zeros(3)
    y = x.clone()
    x.add_(1.0)
    np.testing.assert_array_equal(y.numpy(), [0.0, 0.0, 0.0])


def test_view_shares_memory_with_its_base():
    x = tg.zeros(2, 3)
    y = x.view(6)
    x.add_(1.0)
    np.testing.assert_array_equal(y.numpy(), np.ones(6))


def test_reshape_to_the_same_shape_is_a_new_tensor():
    x = tg.ones(2, 3)
    assert x.reshape(2, 3) is not x


def test_transpose_of_a_0d_tensor_is_itself():
    x = tg.tensor(1.0)
    assert x.transpose(0, 0) is x


def test_flatten_of_a_0d_tensor_has_one_element():
    assert tg.tensor(2.0).flatten().shape == (1,)


def test_flatten_of_no_dims_returns_the_input_itself():
    # Fuzz seed 31000126: PyTorch returns the same tensor, so `retain_grad()` on the result
    # is the input's, and its .grad holds every gradient reaching either name.
    h = tg.ones(3, requires_grad=True) * 2
    for same in (h.flatten(), tg.flatten(h), h.flatten(0, 0), h.flatten(-1, 0)):
        assert same is h
    t = h.flatten()
    t.retain_grad()
    (t * 3 + h).sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), [4.0, 4.0, 4.0])
    x = tg.ones(2, 3)
    assert x.flatten(1, 1) is x and x.flatten(0, 1) is not x


# --- dtype conversion ----------------------------------------------------------------------


@pytest.mark.parametrize("method,dtype", [("float", tg.float32), ("double", tg.float64), ("long", tg.int64),
                                          ("bool", tg.bool)])
def test_dtype_conversion_methods(method, dtype):
    out = getattr(tg.tensor([0.0, 1.5, -2.0]), method)()
    assert out.dtype == dtype
    np.testing.assert_array_equal(out.numpy(), np.array([0.0, 1.5, -2.0]).astype(dtype.np))


def test_to_the_same_dtype_returns_the_tensor_itself():
    x = tg.ones(2)
    assert x.to(tg.float32) is x


def test_to_another_tensor_takes_its_dtype():
    assert tg.ones(2).to(tg.zeros(1, dtype=tg.float64)).dtype == tg.float64


def test_gradient_through_float32_conversion_comes_back_as_float64():
    x = tg.tensor(np.array([1.0, 2.0]), requires_grad=True)
    (x.float() * 3.0).sum().backward()
    assert x.grad.dtype == tg.float64
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])


def test_conversion_to_integer_carries_no_grad():
    out = tg.tensor(np.array([1.5, 2.5]), requires_grad=True).long()
    assert out.dtype == tg.int64 and not out.requires_grad


# --- cat and stack -------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_matches_numpy_concatenate(dim):
    arrays = [np.random.standard_normal((2, 3)) for _ in range(3)]
    out = tg.cat([tg.tensor(a) for a in arrays], dim)
    np.testing.assert_array_equal(out.numpy(), np.concatenate(arrays, axis=dim))


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_stack_matches_numpy_stack(dim):
    arrays = [np.random.standard_normal((2, 3)) for _ in range(3)]
    out = tg.stack([tg.tensor(a) for a in arrays], dim)
    np.testing.assert_array_equal(out.numpy(), np.stack(arrays, axis=dim))


def test_cat_promotes_dtypes():
    out = tg.cat([tg.tensor([1, 2]), tg.tensor([0.5])])
    assert out.dtype == tg.float32
    np.testing.assert_array_equal(out.numpy(), [1.0, 2.0, 0.5])


def test_cat_of_transposed_tensors_is_contiguous_so_its_reshape_is_a_view_eager_and_compiled():
    # As PyTorch's cat (NumPy's concatenate keeps the inputs' transposed order): a matmul
    # of the batch against a matrix saves a reshape of it, which a later in-place write
    # then makes stale, eagerly as compiled (fuzz seed 84101043: only compiled raised).
    def run(a, w):
        t = tg.cat([a.transpose(3, 1), a.transpose(3, 1)], 0)
        assert t.is_contiguous() and t.reshape(-1, t.shape[-1])._base is t
        out = t.matmul(w)
        t.add_(0.5)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()
        return t.detach()

    a = tg.tensor(np.random.default_rng(0).standard_normal((2, 5, 4, 3)), requires_grad=True)
    w = tg.tensor(np.random.default_rng(1).standard_normal((5, 2)), requires_grad=True)
    want = np.concatenate([a.detach().numpy().transpose(0, 3, 2, 1)] * 2, 0) + 0.5
    for fn in (run, tg.compile(run)):
        np.testing.assert_array_equal(fn(a, w).numpy(), want)


@pytest.mark.parametrize("shapes", [[(2, 3), (2,)], [(2, 3), (2, 3, 1)], [(2, 3), (3, 3)]],
                         ids=["fewer_dims", "more_dims", "other_size_off_the_dim"])
def test_cat_of_mismatched_tensors_names_both_before_anything_is_recorded(shapes):
    tensors = [tg.zeros(s, requires_grad=True) for s in shapes]
    with pytest.raises((RuntimeError, IndexError), match="cat"):
        tg.cat(tensors, 1)
    assert all(t.grad_fn is None and t._version == 0 for t in tensors)


def test_cat_of_one_tensor_is_a_copy():
    x = tg.zeros(2)
    out = tg.cat([x])
    x.add_(1.0)
    np.testing.assert_array_equal(out.numpy(), [0.0, 0.0])


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("dim", [0, -1])
def test_cat_gradients_split_back_to_each_input(dim, check):
    shapes = [(2, 3), (2, 3)] if dim == -1 else [(1, 3), (2, 3)]
    a, b = (leaf(*s) for s in shapes)
    c = transposed_leaf(*shapes[1])
    assert check(lambda x, y, z: tg.cat([x, y, z], dim), (a, b, c))


def test_cat_gradient_only_for_inputs_that_require_it():
    a = tg.tensor(np.ones((1, 2)), requires_grad=True)
    b = tg.tensor(np.ones((2, 2)))
    (tg.cat([a, b]) * 2.0).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [[2.0, 2.0]])
    assert b.grad is None


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_stack_gradients(dim, check):
    assert check(lambda x, y: tg.stack([x, y], dim), (leaf(2, 3), transposed_leaf(2, 3)))


# --- select: x[i] --------------------------------------------------------------------------


@pytest.mark.parametrize("index", [0, 2, -1])
def test_an_int_index_is_one_select_view_as_pytorchs(index):
    x = leaf(4, 3, 2)
    row = x[index]
    assert row.shape == (3, 2) and row._base is x and "SelectBackward" in repr(row.grad_fn)
    assert row.grad_fn.next_functions[0][0] is not None and row._version_counter is x._version_counter
    np.testing.assert_array_equal(row.detach().numpy(), x.detach().numpy()[index])
    assert tg.arange(5.0)[3].shape == ()  # (a 0-d view of a vector, not a NumPy scalar)


@pytest.mark.parametrize("check", CHECKS)
def test_select_gradients_eager_and_compiled(check):
    x = transposed_leaf(3, 4)  # (a strided input)
    assert check(lambda t: t[1] * t[-1], (x,))
    assert check(tg.compile(lambda t: t[1] * t[-1]), (x,))
    assert check(lambda t: t[0][2] * t[2], (leaf(3, 3),))


def _backward_names(tensor) -> list[str]:
    seen, names, stack = set(), [], [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        names.append(node.name())
        stack.extend(fn for fn, _ in node.next_functions)
    return names


def test_select_in_a_loop_is_one_node_per_step_and_compiled_equals_eager():
    def run(seq, h):
        for i in range(seq.shape[0]):
            h = (seq[i] + h).tanh()
        return h

    seq, h = leaf(5, 2, 3), leaf(2, 3)
    names = _backward_names(run(seq, h))
    assert names.count("SelectBackward") == 5 and "SliceBackward" not in names and "ViewBackward" not in names
    compiled = tg.compile(run)
    for _ in range(2):
        np.testing.assert_allclose(compiled(seq, h).detach().numpy(), run(seq, h).detach().numpy(), rtol=1e-15)


def test_a_write_through_a_selected_row_reaches_its_base_eager_and_compiled():
    def run(w, g):
        w[1].add_(g)  # (a view written in place: the base changes, as PyTorch's CopySlices)
        return w * 1

    g = leaf(3)
    for fn in (run, tg.compile(run)):
        w = tg.zeros(2, 3, dtype=tg.float64)
        out = fn(w, g)
        np.testing.assert_array_equal(w.detach().numpy()[1], g.detach().numpy())
        np.testing.assert_array_equal(out.detach().numpy(), w.detach().numpy())
        out.sum().backward()
        np.testing.assert_array_equal(g.grad.numpy(), np.ones(3))
        g.grad = None


@pytest.mark.parametrize("index", [3, -4])
def test_an_int_index_out_of_range_is_pytorchs_index_error(index):
    with pytest.raises(IndexError, match=f"index {index} is out of bounds for dimension 0 with size 3"):
        tg.zeros(3, 2)[index]
