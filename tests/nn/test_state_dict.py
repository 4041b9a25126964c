"""`state_dict()` / `load_state_dict()`: PyTorch's keys and order, memory sharing, and the
checks on loading (missing, unexpected, size mismatch, non-tensors) made before anything is
copied, so that a wrong checkpoint raises and leaves the model as it was."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn


def _net():
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


def _arrays(module):
    return {k: v.numpy().copy() for k, v in module.state_dict().items()}


def _assert_same_state(module, arrays):
    state = module.state_dict()
    assert list(state) == list(arrays)
    for key, array in arrays.items():
        np.testing.assert_array_equal(state[key].numpy(), array)


def test_keys_are_parameters_then_buffers_of_each_module_depth_first():
    assert list(_net().state_dict()) == [
        "0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
        "1.num_batches_tracked", "3.weight", "3.bias"]


def test_values_are_detached_and_share_memory_with_the_parameters():
    layer = nn.Linear(3, 2)
    weight = layer.state_dict()["weight"]
    assert not weight.requires_grad
    with tg.no_grad():
        layer.weight.fill_(2.0)
    np.testing.assert_array_equal(weight.numpy(), np.full((2, 3), 2.0))


def test_keep_vars_returns_the_parameters_themselves():
    layer = nn.Linear(3, 2)
    assert layer.state_dict(keep_vars=True)["weight"] is layer.weight


def test_non_persistent_buffers_are_left_out():
    module = nn.Module()
    module.register_buffer("kept", tg.zeros(1))
    module.register_buffer("scratch", tg.zeros(1), persistent=False)
    assert list(module.state_dict()) == ["kept"]


def test_round_trip_gives_a_model_with_equal_outputs():
    source, target = _net(), _net()
    source.train()(tg.randn(5, 3))  # move the running statistics away from their init
    source.eval()
    target.eval()
    assert target.load_state_dict(source.state_dict()) == ([], [])
    x = tg.randn(6, 3)
    np.testing.assert_array_equal(target(x).detach().numpy(), source(x).detach().numpy())
    assert int(target[1].num_batches_tracked) == 1


def test_loading_copies_into_the_existing_parameter_objects():
    layer = nn.Linear(3, 2)
    weight = layer.weight
    layer.load_state_dict(nn.Linear(3, 2).state_dict())
    assert layer.weight is weight and weight.requires_grad


def test_loading_converts_values_to_the_models_dtype():
    layer = nn.Linear(3, 2)
    layer.load_state_dict(nn.Linear(3, 2).double().state_dict())
    assert layer.weight.dtype is tg.float32


def test_missing_key_raises_with_pytorchs_message():
    state = nn.Linear(3, 2).state_dict()
    del state["bias"]
    with pytest.raises(RuntimeError) as error:
        nn.Linear(3, 2).load_state_dict(state)
    assert str(error.value) == ('Error(s) in loading state_dict for Linear:\n\t'
                                'Missing key(s) in state_dict: "bias". ')


def test_unexpected_key_raises_with_pytorchs_message():
    state = nn.Linear(3, 2).state_dict()
    state["scale"] = tg.ones(1)
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "scale". '):
        nn.Linear(3, 2).load_state_dict(state)


def test_size_mismatch_names_the_key_and_both_shapes():
    with pytest.raises(RuntimeError) as error:
        nn.Linear(3, 2).load_state_dict(nn.Linear(4, 2).state_dict())
    assert ("size mismatch for weight: copying a param with shape [2, 4] from checkpoint, the "
            "shape in current model is [2, 3].") in str(error.value)


def test_all_errors_are_reported_together_missing_then_unexpected_then_sizes():
    state = nn.Linear(4, 2, bias=False).state_dict()
    state["extra"] = tg.ones(1)
    with pytest.raises(RuntimeError) as error:
        nn.Linear(3, 2).load_state_dict(state)
    lines = str(error.value).split("\n\t")
    assert lines[0] == "Error(s) in loading state_dict for Linear:"
    assert [line.split(" ")[0] for line in lines[1:]] == ["Missing", "Unexpected", "size"]


def test_a_wrong_checkpoint_leaves_the_model_unchanged():
    model = _net()
    before = _arrays(model)
    wrong = _net().state_dict()
    wrong["3.weight"] = tg.zeros(2, 5)  # only the last entry is wrong
    with pytest.raises(RuntimeError, match="size mismatch for 3.weight"):
        model.load_state_dict(wrong)
    _assert_same_state(model, before)


def test_a_checkpoint_with_missing_keys_leaves_the_model_unchanged():
    model = _net()
    before = _arrays(model)
    partial = _net().state_dict()
    del partial["3.bias"]
    with pytest.raises(RuntimeError, match="Missing"):
        model.load_state_dict(partial)
    _assert_same_state(model, before)


def test_non_strict_loading_returns_missing_and_unexpected_keys_and_copies_the_rest():
    model = nn.Linear(3, 2)
    source = nn.Linear(3, 2)
    state = {"weight": source.state_dict()["weight"], "other": tg.ones(1)}
    result = model.load_state_dict(state, strict=False)
    assert result.missing_keys == ["bias"] and result.unexpected_keys == ["other"]
    np.testing.assert_array_equal(model.weight.detach().numpy(), source.weight.detach().numpy())


def test_non_strict_loading_still_rejects_a_size_mismatch():
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        nn.Linear(3, 2).load_state_dict(nn.Linear(4, 2).state_dict(), strict=False)


def test_a_non_tensor_value_raises():
    state = nn.Linear(3, 2).state_dict()
    state["bias"] = [0.0, 0.0]
    with pytest.raises(RuntimeError, match='While copying the parameter named "bias"'):
        nn.Linear(3, 2).load_state_dict(state)


def test_a_non_mapping_raises_type_error():
    with pytest.raises(TypeError, match="Expected state_dict to be dict-like"):
        nn.Linear(3, 2).load_state_dict([1, 2])
