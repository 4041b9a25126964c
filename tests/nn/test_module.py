"""`nn.Module`: registration of parameters and submodules by attribute assignment,
traversal (names as in PyTorch), train/eval, zero_grad, and `Sequential`."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(tg.ones(2))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = Block()
        self.offset = nn.Parameter(tg.zeros(1))
        self.second = Block()
        self.first.inner = Block()


def _mlp():
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


def test_assigning_a_parameter_registers_it():
    block = Block()
    assert list(block._parameters) == ["scale"]
    assert block.scale is block._parameters["scale"]


def test_assigning_a_module_registers_it_as_a_submodule():
    net = Net()
    assert list(net._modules) == ["first", "second"]
    assert net.first is net._modules["first"]


def test_assigning_a_plain_value_does_not_register_it():
    block = Block()
    block.note = tg.zeros(2)
    block.factor = 3
    assert list(block._parameters) == ["scale"] and not block._modules
    assert block.factor == 3


def test_assigning_a_plain_tensor_to_a_parameter_name_raises_type_error():
    block = Block()
    with pytest.raises(TypeError, match="cannot assign 'Tensor' as parameter 'scale'"):
        block.scale = tg.zeros(2)


def test_assigning_none_to_a_parameter_keeps_the_name_registered_and_unlisted():
    block = Block()
    block.scale = None
    assert block.scale is None
    assert "scale" in block._parameters
    assert list(block.parameters()) == []


def test_deleting_an_attribute_unregisters_it():
    net = Net()
    del net.offset
    del net.second
    assert [name for name, _ in net.named_parameters()] == ["first.scale", "first.inner.scale"]


def test_assigning_before_init_raises():
    class Broken(nn.Module):
        def __init__(self):
            self.weight = nn.Parameter(tg.zeros(1))

    with pytest.raises(AttributeError, match=r"before Module.__init__\(\) call"):
        Broken()


def test_named_parameters_are_depth_first_with_dotted_names_like_pytorch():
    names = [name for name, _ in Net().named_parameters()]
    assert names == ["offset", "first.scale", "first.inner.scale", "second.scale"]


def test_sequential_parameters_are_named_by_index():
    names = [name for name, _ in _mlp().named_parameters()]
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_parameters_lists_the_same_tensors_as_named_parameters():
    net = _mlp()
    assert [id(p) for p in net.parameters()] == [id(p) for _, p in net.named_parameters()]


def test_parameters_without_recurse_lists_only_own_parameters():
    assert [p.shape for p in Net().parameters(recurse=False)] == [(1,)]


def test_a_shared_parameter_is_listed_once():
    net = Net()
    net.second.scale = net.first.scale
    assert len(list(net.parameters())) == 3


def test_a_shared_submodule_is_listed_once():
    shared = nn.Linear(2, 2)
    net = nn.Sequential(shared, shared)
    assert [name for name, _ in net.named_modules()] == ["", "0"]
    assert len(list(net.parameters())) == 2


def test_named_modules_include_the_root_and_nested_modules_depth_first():
    names = [name for name, _ in Net().named_modules()]
    assert names == ["", "first", "first.inner", "second"]


def test_children_are_the_direct_submodules_only():
    net = Net()
    assert list(net.children()) == [net.first, net.second]


def test_parameters_require_grad():
    assert all(p.requires_grad and p.is_leaf for p in _mlp().parameters())


def test_modules_start_in_training_mode():
    assert all(m.training for m in _mlp().modules())


def test_eval_propagates_to_every_submodule():
    net = Net()
    assert net.eval() is net
    assert [m.training for m in net.modules()] == [False] * 4


def test_train_propagates_to_every_submodule():
    net = Net().eval()
    net.train()
    assert all(m.training for m in net.modules())


def test_train_false_is_eval():
    net = Net()
    net.train(False)
    assert not net.first.inner.training


def _backward_through(net):
    net(tg.randn(5, 4)).sum().backward()


def test_zero_grad_sets_grads_to_none_by_default():
    net = _mlp()
    _backward_through(net)
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_zero_grad_without_set_to_none_fills_grads_with_zeros():
    net = _mlp()
    _backward_through(net)
    net.zero_grad(set_to_none=False)
    for p in net.parameters():
        np.testing.assert_array_equal(p.grad.numpy(), np.zeros(p.shape))


def test_sequential_applies_modules_in_order():
    net = _mlp()
    x = tg.randn(5, 4)
    expected = net[2](net[1](net[0](x)))
    np.testing.assert_array_equal(net(x).detach().numpy(), expected.detach().numpy())


def test_sequential_indexing_returns_the_module_at_a_position():
    modules = [nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)]
    net = nn.Sequential(*modules)
    assert net[0] is modules[0] and net[2] is modules[2] and net[-1] is modules[2]


def test_sequential_slice_is_a_sequential_of_the_same_modules():
    net = _mlp()
    head = net[:2]
    assert isinstance(head, nn.Sequential)
    assert list(head.children()) == [net[0], net[1]]


def test_sequential_len_counts_modules():
    assert len(_mlp()) == 3


def test_sequential_setitem_replaces_a_module():
    net = _mlp()
    replacement = nn.Linear(3, 2)
    net[2] = replacement
    assert net[2] is replacement
    assert id(replacement.weight) in {id(p) for p in net.parameters()}


def test_module_without_forward_raises_not_implemented():
    with pytest.raises(NotImplementedError, match="missing the required \"forward\""):
        nn.Module()(tg.zeros(1))


def test_calling_a_module_calls_forward():
    class Double(nn.Module):
        def forward(self, x):
            return x * 2

    np.testing.assert_array_equal(Double()(tg.ones(2)).numpy(), [2.0, 2.0])


def test_repr_shows_children():
    assert repr(_mlp()).splitlines()[1] == "  (0): Linear(in_features=4, out_features=3, bias=True)"
