"""`optim.SGD`: PyTorch's update rule (momentum, dampening, nesterov, weight decay),
checked step by step against a NumPy reference, and `Optimizer` bookkeeping."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn, optim

STEPS = 5
CURVATURE = np.array([0.5, 1.0, 2.0, 4.0])
SHIFT = np.array([1.0, -1.0, 0.5, 0.0])
START = np.array([1.0, 2.0, -3.0, 0.5])


def _quadratic_loss(p):
    """0.5 * sum(c * p**2) + sum(s * p): gradient c * p + s, which depends on p."""
    return (tg.tensor(CURVATURE) * p * p * 0.5 + tg.tensor(SHIFT) * p).sum()


def reference_sgd(start, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                  maximize=False, steps=STEPS):
    """The parameter after each step, for the quadratic loss, written out in NumPy."""
    p, buf, history = start.copy(), None, []
    for _ in range(steps):
        d_p = (-1 if maximize else 1) * (CURVATURE * p + SHIFT) + weight_decay * p
        if momentum:
            buf = d_p.copy() if buf is None else momentum * buf + (1 - dampening) * d_p
            d_p = d_p + momentum * buf if nesterov else buf
        p = p - lr * d_p
        history.append(p.copy())
    return history


def run_sgd(steps=STEPS, **options):
    p = nn.Parameter(tg.tensor(START))
    optimizer = optim.SGD([p], **options)
    history = []
    for _ in range(steps):
        optimizer.zero_grad()
        _quadratic_loss(p).backward()
        optimizer.step()
        history.append(p.detach().numpy().copy())
    return history


@pytest.mark.parametrize("options", [
    dict(lr=0.1),
    dict(lr=0.1, momentum=0.9),
    dict(lr=0.1, weight_decay=0.01),
    dict(lr=0.05, momentum=0.9, weight_decay=0.1),
    dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.1),
    dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    dict(lr=0.05, momentum=0.9, weight_decay=0.01, maximize=True),
], ids=["plain", "momentum", "weight_decay", "momentum_weight_decay", "dampening", "nesterov", "maximize"])
def test_steps_match_the_numpy_reference(options):
    for step, (got, want) in enumerate(zip(run_sgd(**options), reference_sgd(START, **options))):
        np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=f"step {step}")


def test_momentum_changes_the_trajectory():
    # Guards the reference test: with momentum the second step differs from plain SGD.
    assert not np.allclose(run_sgd(lr=0.1, momentum=0.9)[1], run_sgd(lr=0.1)[1])


def test_default_momentum_and_weight_decay_are_zero():
    np.testing.assert_allclose(run_sgd(lr=0.1)[-1], reference_sgd(START, lr=0.1)[-1], rtol=1e-12)


def test_step_updates_the_parameter_in_place_and_keeps_it_a_leaf():
    p = nn.Parameter(tg.tensor(START))
    data = p._data
    optimizer = optim.SGD([p], lr=0.1)
    _quadratic_loss(p).backward()
    optimizer.step()
    assert p._data is data
    assert p.is_leaf and p.requires_grad and p.grad_fn is None


def test_step_skips_parameters_without_grad():
    used, unused = nn.Parameter(tg.ones(2)), nn.Parameter(tg.ones(2))
    optimizer = optim.SGD([used, unused], lr=0.5, momentum=0.9, weight_decay=0.1)
    (used * 2.0).sum().backward()
    optimizer.step()
    np.testing.assert_array_equal(unused.detach().numpy(), [1.0, 1.0])
    assert unused not in optimizer.state


def test_momentum_buffer_is_in_state_keyed_by_the_parameter():
    p = nn.Parameter(tg.tensor(START))
    optimizer = optim.SGD([p], lr=0.1, momentum=0.9)
    _quadratic_loss(p).backward()
    optimizer.step()
    np.testing.assert_allclose(optimizer.state[p]["momentum_buffer"].numpy(), CURVATURE * START + SHIFT)


def test_step_with_closure_returns_its_loss_and_uses_its_gradients():
    p = nn.Parameter(tg.tensor(START))
    optimizer = optim.SGD([p], lr=0.1)

    def closure():
        optimizer.zero_grad()
        loss = _quadratic_loss(p)
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    assert loss.item() == pytest.approx(_quadratic_loss(tg.tensor(START)).item())
    np.testing.assert_allclose(p.detach().numpy(), reference_sgd(START, lr=0.1, steps=1)[0], rtol=1e-12)


def test_param_groups_use_their_own_learning_rate():
    a, b = nn.Parameter(tg.ones(1)), nn.Parameter(tg.ones(1))
    optimizer = optim.SGD([{"params": [a]}, {"params": [b], "lr": 1.0}], lr=0.1)
    (a + b).sum().backward()
    optimizer.step()
    assert a.item() == pytest.approx(0.9) and b.item() == pytest.approx(0.0)


def test_zero_grad_sets_grads_to_none_by_default():
    p = nn.Parameter(tg.tensor(START))
    optimizer = optim.SGD([p], lr=0.1)
    _quadratic_loss(p).backward()
    optimizer.zero_grad()
    assert p.grad is None


def test_zero_grad_without_set_to_none_fills_grads_with_zeros():
    p = nn.Parameter(tg.tensor(START))
    optimizer = optim.SGD([p], lr=0.1)
    _quadratic_loss(p).backward()
    optimizer.zero_grad(set_to_none=False)
    np.testing.assert_array_equal(p.grad.numpy(), np.zeros(4))


def test_without_zero_grad_gradients_accumulate_into_the_step():
    p = nn.Parameter(tg.tensor(START))
    optimizer = optim.SGD([p], lr=0.1)
    _quadratic_loss(p).backward()
    _quadratic_loss(p).backward()
    optimizer.step()
    np.testing.assert_allclose(p.detach().numpy(), START - 0.1 * 2 * (CURVATURE * START + SHIFT))


def test_a_single_tensor_instead_of_an_iterable_raises_type_error():
    with pytest.raises(TypeError, match="should be an iterable of Tensors or dicts"):
        optim.SGD(nn.Parameter(tg.ones(3)), lr=0.1)


def test_an_empty_parameter_list_raises():
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([], lr=0.1)


def test_a_non_leaf_parameter_raises():
    p = nn.Parameter(tg.ones(2))
    with pytest.raises(ValueError, match="can't optimize a non-leaf Tensor"):
        optim.SGD([p * 2.0], lr=0.1)


def test_a_parameter_in_two_groups_raises():
    p = nn.Parameter(tg.ones(2))
    with pytest.raises(ValueError, match="more than one parameter group"):
        optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)


@pytest.mark.parametrize("options, message", [
    (dict(lr=-0.1), "Invalid learning rate"),
    (dict(lr=0.1, momentum=-0.5), "Invalid momentum value"),
    (dict(lr=0.1, weight_decay=-1.0), "Invalid weight_decay value"),
    (dict(lr=0.1, nesterov=True), "Nesterov momentum requires a momentum"),
], ids=["lr", "momentum", "weight_decay", "nesterov"])
def test_invalid_hyperparameters_raise_value_error(options, message):
    with pytest.raises(ValueError, match=message):
        optim.SGD([nn.Parameter(tg.ones(1))], **options)


def test_training_an_mlp_matches_torch_sgd():
    torch = pytest.importorskip("torch")
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    with torch.no_grad():
        for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
            theirs.copy_(torch.from_numpy(ours.detach().numpy().copy()))
    options = dict(lr=0.1, momentum=0.9, weight_decay=0.01)
    ours_opt, theirs_opt = optim.SGD(model.parameters(), **options), torch.optim.SGD(reference.parameters(), **options)
    x, target = np.random.randn(16, 4).astype(np.float32), np.random.randint(0, 3, 16)
    for _ in range(STEPS):
        ours_opt.zero_grad()
        tg.nn.functional.cross_entropy(model(tg.tensor(x)), tg.tensor(target)).backward()
        ours_opt.step()
        theirs_opt.zero_grad()
        torch.nn.functional.cross_entropy(reference(torch.from_numpy(x)), torch.from_numpy(target)).backward()
        theirs_opt.step()
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=1e-4, atol=1e-5)
