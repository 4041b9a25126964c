"""The examples of PyTorch's "Autograd mechanics" note that overlap our API, written as the
note writes them, with tracegrad imported as torch."""

import numpy as np
import pytest

import tracegrad as torch
from tracegrad import nn, optim


# --- Locally disabling gradient computation: setting requires_grad ----------------------

def test_requires_grad_propagates_from_any_input():
    x = torch.randn(5, 5)  # requires_grad=False by default
    y = torch.randn(5, 5)  # requires_grad=False by default
    z = torch.randn((5, 5), requires_grad=True)
    a = x + y
    assert a.requires_grad is False
    b = a + z
    assert b.requires_grad is True


def _pretrained_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def test_frozen_model_with_new_head_only_trains_the_head():
    model = _pretrained_model()
    for param in model.parameters():
        param.requires_grad = False
    # Replace the last fully-connected layer; parameters of new modules require grad by default.
    model[4] = nn.Linear(16, 10)
    optimizer = optim.SGD(model[4].parameters(), lr=1e-2, momentum=0.9)

    loss = model(torch.randn(3, 8)).pow(2).mean()
    loss.backward()
    head = list(model[4].parameters())
    frozen = [p for p in model.parameters() if all(p is not h for h in head)]
    assert all(p.grad is not None for p in head)
    assert all(p.grad is None for p in frozen)

    before = [p.detach().numpy().copy() for p in frozen]
    optimizer.step()
    for p, old in zip(frozen, before):
        np.testing.assert_array_equal(p.detach().numpy(), old)


def test_frozen_body_records_nothing_before_the_head():
    model = _pretrained_model()
    for param in model.parameters():
        param.requires_grad = False
    body_output = model[:4](torch.randn(3, 8))
    assert not body_output.requires_grad and body_output.grad_fn is None


def test_module_requires_grad_underscore_freezes_all_parameters():
    model = _pretrained_model()
    model.requires_grad_(False)
    assert not any(p.requires_grad for p in model.parameters())


# --- Grad modes ---------------------------------------------------------------------------

def test_no_grad_mode_outputs_do_not_require_grad_even_with_requires_grad_inputs():
    x = torch.ones(2, requires_grad=True)
    with torch.no_grad():
        y = x * 2
    assert y.requires_grad is False


def test_no_grad_mode_for_optimizer_style_updates():
    w = torch.ones(3, requires_grad=True)
    (w * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    with torch.no_grad():
        w.sub_(0.1 * w.grad)
    np.testing.assert_allclose(w.detach().numpy(), [0.9, 0.8, 0.7], rtol=1e-6)
    assert w.is_leaf


def test_inference_mode_tensors_cannot_be_used_in_autograd_later():
    model = _pretrained_model()
    with torch.inference_mode():
        features = model[:2](torch.randn(3, 8))
    assert features.is_inference() and not features.requires_grad
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        model[2](features)


def test_eval_mode_is_not_a_grad_mode():
    model = _pretrained_model()
    model.eval()
    assert model(torch.randn(1, 8)).requires_grad


# --- How autograd encodes the history ------------------------------------------------------

def test_grad_fn_of_output_is_the_root_of_the_recorded_graph():
    x = torch.randn(5, requires_grad=True)
    y = x.exp()
    assert y.grad_fn is not None and y.grad_fn.name() == "ExpBackward"
    assert y.grad_fn.next_functions[0][0].variable is x


def test_saved_tensors_are_freed_after_backward():
    x = torch.randn(5, requires_grad=True)
    y = x.exp()
    y.sum().backward()
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        y.sum().backward()


# --- detach -------------------------------------------------------------------------------

def test_detach_excludes_a_subgraph_from_gradient_computation():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    target = (x * 3).detach()
    ((x - target) ** 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * (np.array([1.0, 2.0]) - 3 * np.array([1.0, 2.0])))


# --- In-place correctness checks ---------------------------------------------------------

def test_version_counter_is_incremented_when_marked_dirty():
    x = torch.ones(3)
    assert x._version == 0
    x.add_(1)
    x.mul_(2)
    assert x._version == 2


def test_saved_value_modified_in_place_is_detected_at_backward():
    a = torch.randn(4, requires_grad=True)
    b = a.sigmoid()  # saves its result for backward
    b.mul_(2)
    with pytest.raises(RuntimeError, match="one of the variables needed for gradient computation has "
                                           "been modified by an inplace operation"):
        b.sum().backward()


def test_if_no_error_is_raised_the_gradients_are_correct():
    a = torch.tensor([0.5, -1.0], dtype=torch.float64, requires_grad=True)
    b = a * 2
    b.add_(a)  # nothing saved is modified: fine
    b.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [3.0, 3.0])


# --- Backward hooks execution -------------------------------------------------------------

def test_tensor_hook_then_retain_grad_order():
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    y.retain_grad()
    y.register_hook(lambda grad: grad * 5)
    y.sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), [5.0, 5.0])
    np.testing.assert_allclose(x.grad.numpy(), [10.0, 10.0])
