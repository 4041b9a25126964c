"""Module forward hooks and forward-pre hooks (arguments, replacement, order, removal,
`with_kwargs`, `always_call`), full backward hooks and backward-pre hooks (the gradients
they see, replacing them, as torch's), `get_parameter` / `get_buffer`, and the containers
`ModuleDict`, `ParameterList`, `ParameterDict` (registration, state dict, optimizer, repr)."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn, optim


def _net():
    tg.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def test_forward_hook_sees_the_inputs_and_output_and_can_replace_the_output():
    layer = nn.Linear(3, 2)
    seen = []

    def hook(module, args, output):
        seen.append((module, args, output))
        return output * 0.0
    x = tg.ones(1, 3)
    layer.register_forward_hook(hook)
    out = layer(x)
    assert seen[0][0] is layer and seen[0][1][0] is x and seen[0][2].shape == (1, 2)
    np.testing.assert_array_equal(out.detach().numpy(), np.zeros((1, 2)))


def test_forward_pre_hook_can_replace_the_arguments_with_a_single_value():
    layer = nn.Identity()
    layer.register_forward_pre_hook(lambda module, args: args[0] + 1.0)
    assert layer(tg.zeros(2)).tolist() == [1.0, 1.0]


def test_hooks_run_in_registration_order_or_first_with_prepend():
    layer = nn.Identity()
    order = []
    layer.register_forward_hook(lambda *a: order.append("first"))
    layer.register_forward_hook(lambda *a: order.append("second"))
    layer.register_forward_hook(lambda *a: order.append("prepended"), prepend=True)
    layer(tg.ones(1))
    assert order == ["prepended", "first", "second"]


def test_removing_a_handle_stops_its_hook():
    layer = nn.Identity()
    calls = []
    handle = layer.register_forward_hook(lambda *a: calls.append(1))
    layer(tg.ones(1))
    handle.remove()
    layer(tg.ones(1))
    with layer.register_forward_pre_hook(lambda *a: calls.append(2)):
        layer(tg.ones(1))
    layer(tg.ones(1))
    assert calls == [1, 2]


def test_hooks_with_kwargs_receive_and_replace_keyword_arguments():
    class Scale(nn.Module):
        def forward(self, x, *, factor=1.0):
            return x * factor
    module = Scale()
    module.register_forward_pre_hook(lambda m, args, kwargs: (args, {"factor": 3.0}), with_kwargs=True)
    seen = []
    module.register_forward_hook(lambda m, args, kwargs, out: seen.append(kwargs), with_kwargs=True)
    assert module(tg.ones(1), factor=2.0).item() == 3.0 and seen == [{"factor": 3.0}]


def test_always_call_hook_runs_when_forward_raises():
    class Broken(nn.Module):
        def forward(self, x):
            raise ValueError("broken")
    module, calls = Broken(), []
    module.register_forward_hook(lambda m, a, out: calls.append(out), always_call=True)
    module.register_forward_hook(lambda m, a, out: calls.append("never"))
    with pytest.raises(ValueError, match="broken"):
        module(tg.ones(1))
    assert calls == [None]


def test_forward_hooks_collect_activations_inside_compile():
    net = _net().eval()
    activations = []
    net[0].register_forward_hook(lambda m, a, out: activations.append(out.detach()))
    x = tg.ones(2, 3)
    tg.compile(lambda x: net(x))(x)
    net(x)
    np.testing.assert_allclose(activations[0].numpy(), activations[-1].numpy(), rtol=1e-6)


def test_full_backward_hook_sees_input_and_output_gradients():
    layer = nn.Linear(3, 2)
    seen = []
    layer.register_full_backward_hook(lambda module, grad_input, grad_output: seen.append((grad_input, grad_output)))
    x = tg.randn(4, 3, requires_grad=True)
    (layer(x) * 3.0).sum().backward()
    (grad_input,), (grad_output,) = seen[0]
    np.testing.assert_allclose(grad_input.numpy(), x.grad.numpy())
    np.testing.assert_array_equal(grad_output.numpy(), np.full((4, 2), 3.0))


def test_full_backward_hook_gets_none_for_inputs_without_grad_and_parameters_still_train():
    layer = nn.Linear(3, 2)
    seen = []
    layer.register_full_backward_hook(lambda module, grad_input, grad_output: seen.append(grad_input))
    layer(tg.randn(4, 3)).sum().backward()
    assert seen == [(None,)] and layer.weight.grad is not None


def test_full_backward_hook_can_replace_the_input_gradient():
    layer = nn.Linear(3, 2)
    layer.register_full_backward_hook(lambda module, grad_input, grad_output: (grad_input[0] * 0.0,))
    x = tg.randn(4, 3, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad.abs().sum().item() == 0.0


def test_backward_pre_hook_can_replace_the_output_gradient():
    layer = nn.Linear(3, 2)
    x = tg.randn(4, 3, requires_grad=True)
    (layer(x) * 2.0).sum().backward()
    doubled = x.grad.numpy().copy()
    x.grad = None
    layer.register_full_backward_pre_hook(lambda module, grad_output: (grad_output[0] * 2.0,))
    layer(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), doubled, rtol=1e-6)


def test_backward_hook_gradients_match_torch():
    torch = pytest.importorskip("torch")
    ours, theirs = nn.Linear(3, 2).double(), torch.nn.Linear(3, 2).double()
    with torch.no_grad():
        theirs.weight.copy_(torch.from_numpy(ours.weight.detach().numpy()))
        theirs.bias.copy_(torch.from_numpy(ours.bias.detach().numpy()))
    seen = {"ours": [], "theirs": []}
    ours.register_full_backward_hook(lambda m, gi, go: seen["ours"].append((gi[0].numpy(), go[0].numpy())))
    theirs.register_full_backward_hook(lambda m, gi, go: seen["theirs"].append((gi[0].numpy(), go[0].numpy())))
    x = np.random.default_rng(0).normal(size=(4, 3))
    (ours(tg.tensor(x, requires_grad=True)) ** 2).sum().backward()
    (theirs(torch.tensor(x, requires_grad=True)) ** 2).sum().backward()
    for got, want in zip(seen["ours"][0], seen["theirs"][0]):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_get_parameter_and_get_buffer_follow_dotted_paths():
    net = _net()
    assert net.get_parameter("2.bias") is net[2].bias
    assert net.get_buffer("1.running_mean") is net[1].running_mean
    with pytest.raises(AttributeError, match="`running_mean` is not an nn.Parameter"):
        net.get_parameter("1.running_mean")
    with pytest.raises(AttributeError, match="`weight` is not a buffer"):
        net.get_buffer("0.weight")
    with pytest.raises(AttributeError, match="Linear has no attribute `nope`"):
        net.get_parameter("0.nope")


def test_module_dict_registers_its_modules_in_order():
    heads = nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.Linear(2, 1)})
    heads["c"] = nn.Identity()
    assert list(heads) == ["a", "b", "c"] and len(heads) == 3 and "b" in heads
    assert list(heads.state_dict()) == ["a.weight", "a.bias", "b.weight", "b.bias"]
    assert heads.pop("a") is not None and list(heads.keys()) == ["b", "c"]
    heads.update([("d", nn.ReLU())])
    assert [name for name, _ in heads.named_children()] == ["b", "c", "d"]


def test_module_dict_update_refuses_bad_pairs():
    with pytest.raises(ValueError, match="ModuleDict update sequence element #0 has length 1; 2 is required"):
        nn.ModuleDict([("a",)])


def test_parameter_list_wraps_tensors_as_parameters_and_trains():
    params = nn.ParameterList([tg.ones(2), nn.Parameter(tg.zeros(3))])
    params.append(tg.full((1,), 2.0))
    assert len(params) == 3 and all(isinstance(p, nn.Parameter) for p in params)
    assert [name for name, _ in params.named_parameters()] == ["0", "1", "2"]
    assert params[-1].tolist() == [2.0] and len(params[1:]) == 2
    optimizer = optim.SGD(params.parameters(), lr=0.5)
    sum((p * p).sum() for p in params).backward()
    optimizer.step()
    assert params[0].tolist() == [0.0, 0.0]


def test_parameter_dict_keeps_insertion_order_and_state_dict():
    params = nn.ParameterDict({"w": tg.ones(2, 2), "b": tg.zeros(2)})
    params["scale"] = nn.Parameter(tg.ones(1))
    assert list(params) == ["w", "b", "scale"] and isinstance(params["w"], nn.Parameter)
    assert list(params.state_dict()) == ["w", "b", "scale"]
    del params["b"]
    assert list(params.keys()) == ["w", "scale"] and "b" not in params and params.get("b") is None


def test_container_reprs_match_torch():
    torch = pytest.importorskip("torch")
    ours = nn.ParameterList([tg.ones(2, 3)])
    theirs = torch.nn.ParameterList([torch.ones(2, 3)])
    assert repr(ours).replace("tracegrad", "torch") == repr(theirs)
    ours_dict = nn.ParameterDict({"w": tg.ones(4)})
    theirs_dict = torch.nn.ParameterDict({"w": torch.ones(4)})
    assert repr(ours_dict).replace("tracegrad", "torch") == repr(theirs_dict)


@pytest.mark.parametrize("method, dtype", [("half", "float16"), ("bfloat16", "bfloat16")])
def test_half_precision_conversions_convert_parameters_and_buffers(method, dtype):
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    layer = nn.BatchNorm1d(2)
    assert getattr(layer, method)() is layer
    assert layer.weight.dtype == getattr(tg, dtype) and layer.running_mean.dtype == getattr(tg, dtype)
    assert isinstance(layer.weight, nn.Parameter) and layer.weight.requires_grad
    assert layer.num_batches_tracked.dtype == tg.int64  # integer buffers keep their dtype, as in PyTorch
