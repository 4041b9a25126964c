"""`optim.Adam` and `optim.AdamW`: PyTorch's update rules (bias correction, AMSGrad, L2 and
decoupled weight decay, maximize), step by step against a NumPy reference and torch."""

import math

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn, optim
from tracegrad.optim import optimizer as optimizer_module

STEPS = 6
CURVATURE = np.array([0.5, 1.0, 2.0, 4.0])
SHIFT = np.array([1.0, -1.0, 0.5, 0.0])
START = np.array([1.0, 2.0, -3.0, 0.5])


def _quadratic_loss(p):
    """0.5 * sum(c * p**2) + sum(s * p): gradient c * p + s, which depends on p."""
    return (tg.tensor(CURVATURE) * p * p * 0.5 + tg.tensor(SHIFT) * p).sum()


def reference_adam(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False,
                   maximize=False, decoupled=False, steps=STEPS):
    """The parameter after each step, for the quadratic loss, written out in NumPy."""
    beta1, beta2 = betas
    p = START.copy()
    m, v, v_max = np.zeros_like(p), np.zeros_like(p), np.zeros_like(p)
    history = []
    for t in range(1, steps + 1):
        g = CURVATURE * p + SHIFT
        if maximize:
            g = -g
        if decoupled:
            p = p * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * p
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        v_max = np.maximum(v_max, v)
        second = v_max if amsgrad else v
        m_hat, v_hat = m / (1 - beta1 ** t), second / (1 - beta2 ** t)
        p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
        history.append(p.copy())
    return history


def run(optimizer_class, steps=STEPS, **options):
    p = nn.Parameter(tg.tensor(START))
    optimizer = optimizer_class([p], **options)
    history = []
    for _ in range(steps):
        optimizer.zero_grad()
        _quadratic_loss(p).backward()
        optimizer.step()
        history.append(p.detach().numpy().copy())
    return history


ADAM_CASES = {
    "plain": dict(lr=0.1),
    "betas": dict(lr=0.05, betas=(0.5, 0.9)),
    "eps": dict(lr=0.1, eps=0.5),
    "weight_decay": dict(lr=0.1, weight_decay=0.3),
    "amsgrad": dict(lr=0.1, betas=(0.9, 0.5), amsgrad=True),
    "maximize": dict(lr=0.1, maximize=True),
}


@pytest.mark.parametrize("options", ADAM_CASES.values(), ids=ADAM_CASES.keys())
def test_adam_steps_match_the_numpy_reference(options):
    for step, (got, want) in enumerate(zip(run(optim.Adam, **options), reference_adam(**options))):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15, err_msg=f"step {step}")


ADAMW_CASES = {
    "default_weight_decay": dict(lr=0.1),
    "weight_decay": dict(lr=0.1, weight_decay=0.5),
    "amsgrad": dict(lr=0.1, weight_decay=0.1, betas=(0.9, 0.5), amsgrad=True),
}


@pytest.mark.parametrize("options", ADAMW_CASES.values(), ids=ADAMW_CASES.keys())
def test_adamw_steps_match_the_numpy_reference(options):
    want = reference_adam(decoupled=True, **{"weight_decay": 1e-2, **options})
    for step, (got, expected) in enumerate(zip(run(optim.AdamW, **options), want)):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15, err_msg=f"step {step}")


def test_amsgrad_changes_the_trajectory():
    # Guards the amsgrad case: with beta2 = 0.5, v shrinks and the running maximum matters.
    options = dict(lr=0.1, betas=(0.9, 0.5))
    assert not np.allclose(run(optim.Adam, amsgrad=True, **options)[-1], run(optim.Adam, **options)[-1])


def test_adamw_weight_decay_differs_from_adam_l2_penalty():
    options = dict(lr=0.1, weight_decay=0.5)
    assert not np.allclose(run(optim.AdamW, **options)[-1], run(optim.Adam, **options)[-1])


def test_first_adam_step_moves_each_coordinate_by_lr_against_the_gradient_sign():
    # With bias correction, m_hat / sqrt(v_hat) = g / |g| on the first step.
    got = run(optim.Adam, steps=1, lr=0.01, eps=0.0)[0]
    np.testing.assert_allclose(got, START - 0.01 * np.sign(CURVATURE * START + SHIFT), rtol=1e-12)


def test_adam_state_holds_step_and_moments():
    p = nn.Parameter(tg.tensor(START))
    optimizer = optim.Adam([p], lr=0.1, amsgrad=True)
    for _ in range(2):
        optimizer.zero_grad()
        _quadratic_loss(p).backward()
        optimizer.step()
    state = optimizer.state[p]
    assert state["step"] == 2
    assert sorted(state) == ["exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"]
    assert all(state[key].shape == p.shape for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"))


def test_adam_skips_parameters_without_grad():
    used, unused = nn.Parameter(tg.ones(2)), nn.Parameter(tg.ones(2))
    optimizer = optim.AdamW([used, unused], lr=0.5)
    (used * 2.0).sum().backward()
    optimizer.step()
    np.testing.assert_array_equal(unused.detach().numpy(), [1.0, 1.0])
    assert unused not in optimizer.state


def test_adam_param_groups_use_their_own_learning_rate():
    a, b = nn.Parameter(tg.ones(1)), nn.Parameter(tg.ones(1))
    optimizer = optim.Adam([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1)
    (a + b).sum().backward()
    optimizer.step()  # first Adam step: each parameter moves by its group's lr
    assert a.item() == pytest.approx(0.9) and b.item() == pytest.approx(0.5)


def test_adam_param_groups_keep_their_own_betas():
    a, b = nn.Parameter(tg.ones(1)), nn.Parameter(tg.ones(1))
    optimizer = optim.Adam([{"params": [a]}, {"params": [b], "betas": (0.5, 0.9)}], lr=0.1)
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.999)
    assert optimizer.param_groups[1]["betas"] == (0.5, 0.9)


@pytest.mark.parametrize("options, message", [
    (dict(lr=-0.1), "Invalid learning rate"),
    (dict(eps=-1.0), "Invalid epsilon value"),
    (dict(betas=(1.0, 0.999)), "Invalid beta parameter at index 0"),
    (dict(betas=(0.9, -0.1)), "Invalid beta parameter at index 1"),
    (dict(weight_decay=-1.0), "Invalid weight_decay value"),
], ids=["lr", "eps", "beta1", "beta2", "weight_decay"])
def test_invalid_adam_hyperparameters_raise_value_error(options, message):
    with pytest.raises(ValueError, match=message):
        optim.Adam([nn.Parameter(tg.ones(1))], **options)


@pytest.mark.parametrize("name, options", [
    ("Adam", dict(lr=0.01, weight_decay=0.01)),
    ("Adam", dict(lr=0.01, amsgrad=True)),
    ("AdamW", dict(lr=0.01, weight_decay=0.1)),
    ("AdamW", dict(lr=0.01, amsgrad=True, betas=(0.8, 0.9))),
], ids=["adam_l2", "adam_amsgrad", "adamw", "adamw_amsgrad"])
def test_training_an_mlp_matches_torch(name, options):
    torch = pytest.importorskip("torch")
    tg.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    with torch.no_grad():
        for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
            theirs.copy_(torch.from_numpy(ours.detach().numpy().copy()))
    ours_opt = getattr(optim, name)(model.parameters(), **options)
    theirs_opt = getattr(torch.optim, name)(reference.parameters(), **options)
    rng = np.random.default_rng(0)
    x, target = rng.normal(size=(16, 4)).astype(np.float32), rng.integers(0, 3, 16)
    for _ in range(10):
        ours_opt.zero_grad()
        tg.nn.functional.cross_entropy(model(tg.tensor(x)), tg.tensor(target)).backward()
        ours_opt.step()
        theirs_opt.zero_grad()
        torch.nn.functional.cross_entropy(reference(torch.from_numpy(x)), torch.from_numpy(target)).backward()
        theirs_opt.step()
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=1e-4, atol=1e-5)


def _in_place_adam_step(p, grad, state, lr, betas, eps, weight_decay, amsgrad, maximize, decoupled):
    """PyTorch's single-tensor update, written with in-place ops as PyTorch writes it."""
    beta1, beta2 = betas
    grad = -grad if maximize else grad
    state["step"] += 1
    step = state["step"]
    if weight_decay != 0:
        if decoupled:
            p.mul_(1 - lr * weight_decay)
        else:
            grad = grad.add(p, alpha=weight_decay)
    state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)
    state["exp_avg_sq"].mul_(beta2).add_(grad * grad, alpha=1 - beta2)
    second = state["exp_avg_sq"]
    if amsgrad:
        second = state["max_exp_avg_sq"].copy_(tg.maximum(state["max_exp_avg_sq"], second))
    denom = second.sqrt().div(math.sqrt(1 - beta2 ** step)).add(eps)
    p.add_(state["exp_avg"] / denom, alpha=-(lr / (1 - beta1 ** step)))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("options", [dict(), dict(weight_decay=0.1, amsgrad=True),
                                     dict(weight_decay=0.05, maximize=True), dict(decoupled=True, weight_decay=0.1)])
def test_updates_are_bitwise_those_of_pytorchs_in_place_operations(options, compiled):
    # (`_adam_values` computes new values written over the old: the same operations in the
    # same order, so the same float32 roundings.)
    decoupled = options.pop("decoupled", False)
    settings = dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0, amsgrad=False, maximize=False)
    settings.update(options)
    rng = np.random.default_rng(3)
    start = rng.standard_normal((5, 7)).astype(np.float32)
    grads = [rng.standard_normal((5, 7)).astype(np.float32) for _ in range(4)]
    p = tg.tensor(start.copy(), requires_grad=True)
    optimizer = (optim.AdamW if decoupled else optim.Adam)([p], **settings)
    step = tg.compile(optimizer.step) if compiled else optimizer.step
    q = tg.tensor(start.copy())
    state = {"step": 0, "exp_avg": tg.zeros(5, 7), "exp_avg_sq": tg.zeros(5, 7), "max_exp_avg_sq": tg.zeros(5, 7)}
    for grad in grads:
        p.grad = tg.tensor(grad)
        step()
        _in_place_adam_step(q, tg.tensor(grad), state, decoupled=decoupled, **settings)
        np.testing.assert_array_equal(p.detach().numpy(), q.numpy())
        np.testing.assert_array_equal(optimizer.state[p]["exp_avg_sq"].numpy(), state["exp_avg_sq"].numpy())


def _squares_step(model, optimizer):
    """A training step minimizing the sum of the model's squared outputs."""
    def train(x):
        optimizer.zero_grad()
        loss = model(x).square().sum()
        loss.backward()
        optimizer.step()
        return loss
    return train


def test_a_followed_compiled_step_takes_each_groups_update_whole(composite_jumps):
    tg.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    optimizer = optim.AdamW(model.parameters(), lr=0.01)
    scheduler = optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)  # lr changes every step
    compiled = tg.compile(_squares_step(model, optimizer))
    for _ in range(4):
        compiled(tg.randn(5, 3))
        scheduler.step()
    assert compiled.cache_info().graphs <= 2  # (the state appears in the first call)
    # One composite for the four parameters of the group, taken whole in two followed calls at least.
    assert composite_jumps.count("_adam_values_group") >= 2 and "_adam_values" not in composite_jumps


@pytest.mark.parametrize("options", [dict(), dict(amsgrad=True, weight_decay=0.1), dict(maximize=True)],
                         ids=["plain", "amsgrad_decayed", "maximize"])
@pytest.mark.parametrize("cls", [optim.Adam, optim.AdamW])
def test_a_compiled_steps_group_update_equals_its_per_parameter_updates_to_the_bit(cls, options, monkeypatch):
    def run(compiled: bool):
        tg.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
        optimizer = cls([{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.02}],
                        lr=0.01, **options)
        train = _squares_step(model, optimizer)
        step = tg.compile(train) if compiled else train
        xs = [tg.tensor(np.random.default_rng(i).standard_normal((5, 3))) for i in range(4)]
        losses = [float(step(x)) for x in xs]
        return losses, [p.detach().numpy().copy() for p in model.parameters()], optimizer.state_dict()

    grouped = run(True)
    with monkeypatch.context() as patch:  # each parameter's update a composite of its own, as before
        patch.setattr(optimizer_module, "GROUP_UPDATES", False)
        per_parameter = run(True)
    eager = run(False)
    assert grouped[0] == per_parameter[0]
    np.testing.assert_allclose(grouped[0], eager[0], rtol=1e-12)
    for got, want, eager_value in zip(grouped[1], per_parameter[1], eager[1]):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(got, eager_value, rtol=1e-12, atol=1e-14)
    for key, entry in per_parameter[2]["state"].items():
        for name, value in entry.items():
            np.testing.assert_array_equal(np.asarray(grouped[2]["state"][key][name]), np.asarray(value))


def test_an_eager_step_is_one_op_per_parameter(monkeypatch):
    from tracegrad.ops import adam as adam_op
    bound = []
    monkeypatch.setattr(adam_op, "bind", lambda prim, inputs, attrs: bound.append(prim.name) or _bind(prim, inputs,
                                                                                                      attrs))
    model = nn.Linear(3, 2)
    for options, name in ((dict(), "adam_update"), (dict(amsgrad=True, weight_decay=0.1), "amsgrad_update")):
        bound.clear()
        optimizer = optim.AdamW(model.parameters(), lr=0.01, **options)
        model(tg.randn(4, 3)).sum().backward()
        optimizer.step()
        assert bound == [name, name]  # the weight and the bias


def _bind(prim, inputs, attrs):
    from tracegrad.ops.dispatch import bind
    return bind(prim, inputs, attrs)


def test_a_half_precision_parameter_takes_the_composite():
    p = tg.zeros(3, dtype=tg.float16, requires_grad=True)
    p.grad = tg.ones(3, dtype=tg.float16)
    optim.Adam([p], lr=0.1).step()
    np.testing.assert_allclose(p.detach().float().numpy(), np.full(3, -0.1), rtol=1e-3)


def test_the_update_op_names_itself_and_the_types_on_bad_input():
    from tracegrad.ops import adam as adam_op
    p = tg.zeros(3)
    with pytest.raises(RuntimeError, match=r"adam_update: expected a float32 or float64 parameter"):
        adam_op.adam_update(p, tg.zeros(4), tg.zeros(3), tg.zeros(3), None, None, tg.tensor(1.0), tg.tensor(1.0),
                            0.9, 0.99, 1e-8, 0.0, False)


def test_a_compiled_steps_parameters_share_their_steps_numbers():
    # The step's numbers (step size, bias corrections, betas, eps) are the same for every
    # parameter of a group: the compiled step reads each as one 0-d input, not one per
    # parameter (`optimizer.update_scalar`), and the lr a scheduler changes still reaches
    # each step.
    def run(compiled: bool):
        tg.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
        optimizer = optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
        scheduler = optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        train = _squares_step(model, optimizer)
        step = tg.compile(train) if compiled else train
        for i in range(4):
            step(tg.tensor(np.random.default_rng(i).standard_normal((5, 3))))
            scheduler.step()
        return step, [p.detach().numpy().copy() for p in model.parameters()]
    compiled, got = run(True)
    _, want = run(False)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)
    scalar_inputs = max(sum(t.shape == () for t in program.input_types) for program in compiled._programs.values())
    # The backward's seed and 8 numbers (decay, step size, bias correction, beta1, 1 - beta1,
    # beta2, 1 - beta2, eps), against 33 with 8 per parameter.
    assert scalar_inputs == 9
