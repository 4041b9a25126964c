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


# --- buffers -------------------------------------------------------------------------------


def test_register_buffer_lists_the_tensor_in_buffers_not_parameters():
    block = Block()
    block.register_buffer("count", tg.zeros(1))
    assert list(dict(block.named_buffers())) == ["count"]
    assert [name for name, _ in block.named_parameters()] == ["scale"]


def test_assigning_a_tensor_to_a_buffer_name_replaces_the_buffer():
    block = Block()
    block.register_buffer("count", tg.zeros(1))
    replacement = tg.ones(1)
    block.count = replacement
    assert block.count is replacement and block._buffers["count"] is replacement


def test_named_buffers_are_prefixed_with_the_submodule_path():
    net = Net()
    net.first.inner.register_buffer("stat", tg.zeros(1))
    assert [name for name, _ in net.named_buffers()] == ["first.inner.stat"]


def test_register_buffer_rejects_a_non_tensor():
    with pytest.raises(TypeError, match="cannot assign 'list' object to buffer 'stat'"):
        Block().register_buffer("stat", [1.0])


def test_register_buffer_rejects_a_dotted_name():
    with pytest.raises(KeyError, match="contain"):
        Block().register_buffer("a.b", tg.zeros(1))


# --- traversal -----------------------------------------------------------------------------


def test_modules_lists_a_shared_submodule_once():
    shared = nn.Linear(2, 2)
    net = nn.Sequential(shared, nn.ReLU(), shared)
    assert [type(m).__name__ for m in net.modules()] == ["Sequential", "Linear", "ReLU"]
    assert len(list(net.parameters())) == 2


def test_apply_visits_children_before_the_module_itself():
    net = Net()
    visited = []
    net.apply(lambda module: visited.append(module))
    assert visited == [net.first.inner, net.first, net.second, net]


def test_get_submodule_follows_a_dotted_path():
    net = Net()
    assert net.get_submodule("first.inner") is net.first.inner
    with pytest.raises(AttributeError, match="has no attribute `missing`"):
        net.get_submodule("first.missing")


def test_train_with_a_non_bool_raises():
    with pytest.raises(ValueError, match="training mode is expected to be boolean"):
        Net().train("no")


# --- freezing ------------------------------------------------------------------------------


def test_requires_grad_false_freezes_every_parameter():
    net = _mlp().requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())
    assert not net(tg.randn(2, 4)).requires_grad


def test_a_frozen_submodule_gets_no_gradient_while_the_rest_does():
    net = _mlp()
    net[0].requires_grad_(False)
    net(tg.randn(2, 4)).sum().backward()
    assert net[0].weight.grad is None and net[2].weight.grad is not None


# --- dtype ---------------------------------------------------------------------------------


def test_double_converts_parameters_in_place_keeping_the_same_objects():
    net = _mlp()
    params = list(net.parameters())
    net.double()
    assert list(net.parameters()) == params
    assert all(p.dtype is tg.float64 and p.requires_grad for p in params)


def test_double_converts_float_buffers_but_not_integer_ones():
    norm = nn.BatchNorm1d(3).double()
    assert norm.running_mean.dtype is tg.float64 and norm.running_var.dtype is tg.float64
    assert norm.num_batches_tracked.dtype is tg.int64


def test_float_after_double_restores_float32_values():
    net = _mlp()
    weight = net[0].weight.detach().numpy().copy()
    net.double().float()
    assert net[0].weight.dtype is tg.float32
    np.testing.assert_array_equal(net[0].weight.detach().numpy(), weight)


def test_to_with_a_dtype_converts_and_a_device_other_than_cpu_raises():
    assert _mlp().to(tg.float64)[0].weight.dtype is tg.float64
    assert _mlp().to("cpu")[0].weight.dtype is tg.float32
    with pytest.raises(RuntimeError, match="Module.to: tracegrad runs on the CPU only"):
        _mlp().to("cuda")


def test_a_converted_model_trains_in_float64():
    net = _mlp().double()
    net(tg.randn(2, 4, dtype=tg.float64)).sum().backward()
    assert net[0].weight.grad.dtype is tg.float64


def test_double_after_a_backward_records_the_parameters_as_float64():
    net = nn.Linear(3, 2)
    net(tg.randn(4, 3)).sum().backward()
    out = net.double()(tg.randn(4, 3, dtype=tg.float64)).sum()
    assert "f32" not in tg.ir.dump(out)


def test_deepcopy_gives_independent_parameters():
    import copy
    net = _mlp()
    twin = copy.deepcopy(net)
    assert all(isinstance(p, nn.Parameter) for p in twin.parameters())
    with tg.no_grad():
        twin[0].weight.fill_(0.0)
    assert np.abs(net[0].weight.detach().numpy()).sum() > 0


# --- repr ----------------------------------------------------------------------------------


def test_repr_nests_children_with_their_extra_repr():
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Sequential(nn.ReLU(), nn.Flatten()))
    assert repr(net) == (
        "Sequential(\n"
        "  (0): Conv2d(1, 2, kernel_size=(3, 3), stride=(1, 1))\n"
        "  (1): Sequential(\n"
        "    (0): ReLU()\n"
        "    (1): Flatten(start_dim=1, end_dim=-1)\n"
        "  )\n"
        ")")


def test_repr_of_a_module_without_children_or_extra_repr_is_its_name():
    assert repr(nn.Tanh()) == "Tanh()"


# --- containers ----------------------------------------------------------------------------


def test_module_list_registers_its_modules_by_position():
    layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 1)])
    assert [name for name, _ in layers.named_parameters()] == ["0.weight", "0.bias", "1.weight", "1.bias"]


def test_module_list_append_extend_and_insert_renumber_positions():
    first, second, third = nn.ReLU(), nn.Tanh(), nn.Sigmoid()
    layers = nn.ModuleList([first])
    layers.append(third)
    layers.insert(1, second)
    assert list(layers) == [first, second, third] and list(layers._modules) == ["0", "1", "2"]
    layers.extend([nn.ReLU()])
    assert len(layers) == 4


def test_module_list_del_renumbers_the_remaining_modules():
    first, second, third = nn.ReLU(), nn.Tanh(), nn.Sigmoid()
    layers = nn.ModuleList([first, second, third])
    del layers[0]
    assert list(layers._modules.items()) == [("0", second), ("1", third)]


def test_module_list_inside_a_module_is_reached_by_parameters_and_train():
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(2, 2), nn.Dropout()])

    stack = Stack().eval()
    assert [name for name, _ in stack.named_parameters()] == ["layers.0.weight", "layers.0.bias"]
    assert not stack.layers[1].training


def test_module_list_has_no_forward():
    with pytest.raises(NotImplementedError):
        nn.ModuleList([nn.ReLU()])(tg.zeros(1))


def test_sequential_from_an_ordered_dict_uses_its_names():
    from collections import OrderedDict
    net = nn.Sequential(OrderedDict([("fc", nn.Linear(2, 2)), ("act", nn.ReLU())]))
    assert [name for name, _ in net.named_parameters()] == ["fc.weight", "fc.bias"]
    assert isinstance(net[1], nn.ReLU)


def test_sequential_append_adds_a_module_at_the_end():
    net = _mlp().append(nn.Tanh())
    assert len(net) == 4 and isinstance(net[-1], nn.Tanh)


def test_sequential_index_out_of_range_raises_index_error():
    with pytest.raises(IndexError):
        _mlp()[3]
