"""The eager backward cache's key (`backward_cache._describe`): one walk gives the forward
order the transform walks, a key equal for two recordings of one structure, and a
different key for any change of structure the backward program depends on."""

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad.autograd import backward_cache
from tracegrad.autograd.autodiff import forward_order


def _chain(x, w, c):
    y = x * 1.5 + 0.25
    return (tg.sigmoid(tg.tanh(tg.exp(tg.sin(y) * x) - 1.0) ** 2) / 2.0).sum()


GRAPHS = {  # name -> loss of leaves (x, w, c), each recorded anew per call
    "chain_reading_a_leaf_twice": _chain,
    "a_node_read_twice": lambda x, w, c: (tg.exp(x) * tg.exp(x).exp()).sum(),
    "one_value_squared": lambda x, w, c: (tg.tanh(x) * tg.tanh(x)).sum() + (x * x).sum(),
    "two_leaves_and_a_constant": lambda x, w, c: ((x * w + c) * w).sum(),
    "multi_output_and_views": lambda x, w, c: sum(p.sum() * k for k, p in enumerate(tg.split(x * w, 2), 1)),
    "broadcast_saved_view": lambda x, w, c: ((x.reshape(2, 3) * w[:3]) ** 2).sum(),
    "softmax_and_matmul": lambda x, w, c: F.log_softmax(x.reshape(2, 3) @ w.reshape(3, 2), 1).sum(),
    "max_and_mean": lambda x, w, c: x.max() + (w * c).mean(),
}


def _leaves():
    rng = np.random.default_rng(0)
    x = tg.tensor(rng.standard_normal(6), requires_grad=True)
    w = tg.tensor(rng.standard_normal(6), requires_grad=True)
    c = tg.tensor(rng.standard_normal(6))
    return x, w, c


def _description(loss, targets=None):
    roots = [loss._autograd_value()]
    values = [t._autograd_value() for t in targets] if targets is not None else None
    return backward_cache._describe(roots, values)


@pytest.mark.parametrize("name", GRAPHS)
def test_the_walk_gives_the_forward_order_of_the_transform(name):
    loss = GRAPHS[name](*_leaves())
    _, order, _, _, _ = _description(loss)
    assert order == forward_order([loss._autograd_value()])


@pytest.mark.parametrize("name", GRAPHS)
def test_two_recordings_of_one_structure_have_one_key(name):
    leaves = _leaves()
    first, second = _description(GRAPHS[name](*leaves)), _description(GRAPHS[name](*leaves))
    assert first[0] == second[0] and hash(first[0]) == hash(second[0])
    assert first[0] == _description(GRAPHS[name](*_leaves()))[0]  # other leaves of the same types


@pytest.mark.parametrize("name", GRAPHS)
def test_canonical_values_are_the_nodes_outputs_and_the_leaves(name):
    x, w, c = _leaves()
    loss = GRAPHS[name](x, w, c)
    _, order, canonical, _, _ = _description(loss, [x, w])
    values = [backward_cache._canonical_value(canonical, i) for i in range(len(canonical[0]))]
    assert x._autograd_value() in values and w._autograd_value() in values
    for node in order:
        outputs = [v for v in values if v.node is node]
        assert outputs == [node.output(i) for i in range(len(node.out_types))]


def test_keys_differ_between_graphs_of_other_structure():
    keys = {name: _description(loss(*_leaves()))[0] for name, loss in GRAPHS.items()}
    assert len(set(keys.values())) == len(keys)


def test_one_node_read_twice_and_two_equal_nodes_have_other_keys():
    x, w, c = _leaves()
    shared = tg.exp(x)
    assert _description((shared * shared).sum())[0] != _description((tg.exp(x) * tg.exp(x)).sum())[0]


def test_one_leaf_read_twice_and_two_leaves_have_other_keys():
    x, w, c = _leaves()
    assert _description((x * x).sum())[0] != _description((x * w).sum())[0]


def test_a_changed_constant_type_attribute_or_target_changes_the_key():
    x, w, c = _leaves()
    base = _description((x * c).sum())[0]
    assert base != _description((x * 2.0).sum())[0]      # a constant of another shape (0-d)
    assert base != _description((x * c[:1]).sum())[0]    # a broadcast constant (saved as its source)
    assert base == _description((x * c.float()).sum())[0]  # (converted to x's dtype: one graph)
    assert _description(x.sum(0))[0] != _description(x.sum(0, keepdim=True).sum())[0]
    assert _description((x * w).sum(), [x])[0] != _description((x * w).sum(), [w])[0]
    assert _description((x * w).sum(), [x])[0] != _description((x * w).sum())[0]


def test_saved_tensors_follow_what_the_rule_reads():
    x, w, c = _leaves()
    # mul saves the operand the other's gradient reads: with c constant, only c is saved.
    _, _, _, saved_const, _ = _description((x * c).sum())
    _, _, _, saved_both, _ = _description((x * w).sum())
    assert len(saved_const) == 1 and len(saved_both) == 2
    assert _description((x * c).sum())[0] != _description((x * w.detach()).sum() + 0 * w.sum())[0]


def test_graphs_the_key_cannot_describe_take_the_direct_path():
    x, w, c = _leaves()
    y = x.exp()
    y.register_hook(lambda g: g)
    assert _description((y * 2).sum()) is None
    z = x.exp()
    loss = (z * 2).sum()
    loss.backward(retain_graph=False)
    assert _description(loss) is None  # freed buffers


def test_cached_backwards_of_varied_graphs_equal_the_direct_path(monkeypatch):
    monkeypatch.setattr(backward_cache, "NUMPY_AFTER", 1)
    monkeypatch.setattr(backward_cache, "COMPILE_AFTER", 3)
    for name, loss_of in GRAPHS.items():
        results = []
        for _ in range(4):  # the direct path, cached NumPy programs, then fused kernels
            x, w, c = _leaves()
            x64, w64 = x.double().detach().requires_grad_(), w.double().detach().requires_grad_()
            grads = tg.autograd.grad(loss_of(x64, w64, c.double()), [x64, w64], allow_unused=True)
            results.append([g.numpy().copy() if g is not None else None for g in grads])
        with tg.reference_mode():
            x, w, c = _leaves()
            x64, w64 = x.double().detach().requires_grad_(), w.double().detach().requires_grad_()
            direct = tg.autograd.grad(loss_of(x64, w64, c.double()), [x64, w64], allow_unused=True)
        for grads in results:
            for got, expected in zip(grads, direct):
                if expected is None:
                    assert got is None, name
                else:
                    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-12, atol=1e-14, err_msg=name)
