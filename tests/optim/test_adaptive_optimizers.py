"""RMSprop, Adagrad, Adadelta, Adamax, NAdam and RAdam: each update rule step by step against
a NumPy transcription of its formula, against torch.optim (when installed), inside
`tg.compile` (equal to eager, no recompiles), and their state and hyperparameter checks."""

import math

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad import nn, optim

STEPS = 8
CURVATURE = np.array([0.5, 1.0, 2.0, 4.0])
SHIFT = np.array([1.0, -1.0, 0.5, 0.0])
START = np.array([1.0, 2.0, -3.0, 0.5])


def _loss(p):
    """0.5 * sum(c * p**2) + sum(s * p): gradient c * p + s."""
    return (tg.tensor(CURVATURE) * p * p * 0.5 + tg.tensor(SHIFT) * p).sum()


def _grad(p):
    return CURVATURE * p + SHIFT


def run(optimizer_class, steps=STEPS, **options):
    p = nn.Parameter(tg.tensor(START))
    optimizer = optimizer_class([p], **options)
    history = []
    for _ in range(steps):
        optimizer.zero_grad()
        _loss(p).backward()
        optimizer.step()
        history.append(p.detach().numpy().copy())
    return history


# --- NumPy transcriptions of the papers' / PyTorch docs' formulas ------------------------

def reference_rmsprop(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False,
                      maximize=False):
    p, v, m, buf, history = START.copy(), 0.0, 0.0, 0.0, []
    for _ in range(STEPS):
        g = -_grad(p) if maximize else _grad(p)
        g = g + weight_decay * p
        v = alpha * v + (1 - alpha) * g * g
        m = alpha * m + (1 - alpha) * g
        avg = np.sqrt(v - m * m if centered else v) + eps
        if momentum > 0:
            buf = momentum * buf + g / avg
            p = p - lr * buf
        else:
            p = p - lr * g / avg
        history.append(p)
    return history


def reference_adagrad(lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10,
                      maximize=False):
    p, s, history = START.copy(), initial_accumulator_value, []
    for t in range(1, STEPS + 1):
        g = (-_grad(p) if maximize else _grad(p)) + weight_decay * p
        s = s + g * g
        p = p - lr / (1 + (t - 1) * lr_decay) * g / (np.sqrt(s) + eps)
        history.append(p)
    return history


def reference_adadelta(lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, maximize=False):
    p, v, u, history = START.copy(), 0.0, 0.0, []
    for _ in range(STEPS):
        g = (-_grad(p) if maximize else _grad(p)) + weight_decay * p
        v = rho * v + (1 - rho) * g * g
        delta = np.sqrt(u + eps) / np.sqrt(v + eps) * g
        u = rho * u + (1 - rho) * delta * delta
        p = p - lr * delta
        history.append(p)
    return history


def reference_adamax(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, maximize=False):
    (b1, b2), p, m, u, history = betas, START.copy(), 0.0, 0.0, []
    for t in range(1, STEPS + 1):
        g = (-_grad(p) if maximize else _grad(p)) + weight_decay * p
        m = b1 * m + (1 - b1) * g
        u = np.maximum(b2 * u, np.abs(g) + eps)
        p = p - lr / (1 - b1 ** t) * m / u
        history.append(p)
    return history


def reference_nadam(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, momentum_decay=4e-3,
                    decoupled_weight_decay=False):
    (b1, b2), p, m, v, product, history = betas, START.copy(), 0.0, 0.0, 1.0, []

    def mu(t):
        return b1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))
    for t in range(1, STEPS + 1):
        g = _grad(p)
        if decoupled_weight_decay:
            p = p * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * p
        product *= mu(t)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        denom = np.sqrt(v / (1 - b2 ** t)) + eps
        p = p - lr * (1 - mu(t)) / (1 - product) * g / denom - lr * mu(t + 1) / (1 - product * mu(t + 1)) * m / denom
        history.append(p)
    return history


def reference_radam(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled_weight_decay=False,
                    steps=STEPS):
    (b1, b2), p, m, v, history = betas, START.copy(), 0.0, 0.0, []
    rho_inf = 2 / (1 - b2) - 1
    for t in range(1, steps + 1):
        g = _grad(p)
        if decoupled_weight_decay:
            p = p * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1 ** t)
        rho_t = rho_inf - 2 * t * b2 ** t / (1 - b2 ** t)
        if rho_t > 5:
            rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
            p = p - lr * m_hat * rect * math.sqrt(1 - b2 ** t) / (np.sqrt(v) + eps)
        else:
            p = p - lr * m_hat
        history.append(p)
    return history


CASES = {
    "rmsprop": (optim.RMSprop, reference_rmsprop, dict(lr=0.05)),
    "rmsprop_momentum": (optim.RMSprop, reference_rmsprop, dict(lr=0.05, momentum=0.9, alpha=0.9)),
    "rmsprop_centered": (optim.RMSprop, reference_rmsprop, dict(lr=0.05, centered=True, alpha=0.8)),
    "rmsprop_all": (optim.RMSprop, reference_rmsprop,
                    dict(lr=0.01, momentum=0.5, centered=True, weight_decay=0.1, maximize=True)),
    "adagrad": (optim.Adagrad, reference_adagrad, dict(lr=0.5)),
    "adagrad_decay": (optim.Adagrad, reference_adagrad,
                      dict(lr=0.5, lr_decay=0.1, weight_decay=0.2, initial_accumulator_value=0.3)),
    "adagrad_maximize": (optim.Adagrad, reference_adagrad, dict(lr=0.1, eps=0.5, maximize=True)),
    "adadelta": (optim.Adadelta, reference_adadelta, dict()),
    "adadelta_options": (optim.Adadelta, reference_adadelta, dict(lr=0.5, rho=0.5, eps=1e-3, weight_decay=0.1)),
    "adadelta_maximize": (optim.Adadelta, reference_adadelta, dict(maximize=True)),
    "adamax": (optim.Adamax, reference_adamax, dict(lr=0.1)),
    "adamax_options": (optim.Adamax, reference_adamax, dict(lr=0.1, betas=(0.5, 0.8), weight_decay=0.3)),
    "adamax_maximize": (optim.Adamax, reference_adamax, dict(lr=0.1, maximize=True)),
    "nadam": (optim.NAdam, reference_nadam, dict(lr=0.1)),
    "nadam_l2": (optim.NAdam, reference_nadam, dict(lr=0.1, weight_decay=0.2, momentum_decay=0.1)),
    "nadam_decoupled": (optim.NAdam, reference_nadam, dict(lr=0.1, weight_decay=0.2, decoupled_weight_decay=True)),
    "radam": (optim.RAdam, reference_radam, dict(lr=0.1)),
    "radam_never_rectified": (optim.RAdam, reference_radam, dict(lr=0.1, betas=(0.9, 0.5))),
    "radam_decoupled": (optim.RAdam, reference_radam,
                        dict(lr=0.1, betas=(0.8, 0.6), weight_decay=0.1, decoupled_weight_decay=True)),
}


@pytest.mark.parametrize("name", CASES)
def test_steps_match_the_numpy_transcription_of_the_rule(name):
    optimizer_class, reference, options = CASES[name]
    for step, (got, want) in enumerate(zip(run(optimizer_class, **options), reference(**options), strict=True)):
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-13, err_msg=f"{name} step {step}")


@pytest.mark.parametrize("name", CASES)
def test_steps_match_torch_step_by_step(name):
    torch = pytest.importorskip("torch")
    optimizer_class, _, options = CASES[name]
    theirs = torch.tensor(START, requires_grad=True)
    # torch keeps NAdam's momentum product as a 0-d tensor of the default dtype; float64 makes
    # it the Python float tracegrad keeps.
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        theirs_optimizer = getattr(torch.optim, optimizer_class.__name__)([theirs], **options)
        for step, got in enumerate(run(optimizer_class, **options)):
            theirs_optimizer.zero_grad()
            (torch.tensor(CURVATURE) * theirs * theirs * 0.5 + torch.tensor(SHIFT) * theirs).sum().backward()
            theirs_optimizer.step()
            np.testing.assert_allclose(got, theirs.detach().numpy(), rtol=1e-11, atol=1e-13,
                                       err_msg=f"{name} step {step}")
    finally:
        torch.set_default_dtype(default_dtype)


def test_radam_switches_to_the_rectified_rule_after_the_variance_is_tractable():
    # With beta2 = 0.999, rho_t exceeds 5 from step 6 on: steps 1-5 are plain bias-corrected
    # momentum (p - lr * m_hat), step 6 is not.
    got = run(optim.RAdam, steps=6, lr=0.1)
    p, m, momentum_only = START.copy(), 0.0, []
    for t in range(1, 7):
        m = 0.9 * m + 0.1 * _grad(p)
        p = p - 0.1 * m / (1 - 0.9 ** t)
        momentum_only.append(p)
    np.testing.assert_allclose(got[:5], momentum_only[:5], rtol=1e-12)
    assert not np.allclose(got[5], momentum_only[5])


def test_centered_rmsprop_differs_from_plain():
    assert not np.allclose(run(optim.RMSprop, lr=0.05, centered=True, alpha=0.8)[-1],
                           run(optim.RMSprop, lr=0.05, alpha=0.8)[-1])


@pytest.mark.parametrize("optimizer_class, keys", [
    (optim.RMSprop, ["grad_avg", "momentum_buffer", "square_avg", "step"]),
    (optim.Adagrad, ["step", "sum"]),
    (optim.Adadelta, ["acc_delta", "square_avg", "step"]),
    (optim.Adamax, ["exp_avg", "exp_inf", "step"]),
    (optim.NAdam, ["exp_avg", "exp_avg_sq", "mu_product", "step"]),
    (optim.RAdam, ["exp_avg", "exp_avg_sq", "step"]),
])
def test_state_holds_pytorchs_keys(optimizer_class, keys):
    options = dict(momentum=0.9, centered=True) if optimizer_class is optim.RMSprop else {}
    p = nn.Parameter(tg.tensor(START))
    optimizer = optimizer_class([p], **options)
    for _ in range(2):
        optimizer.zero_grad()
        _loss(p).backward()
        optimizer.step()
    assert sorted(optimizer.state[p]) == keys
    assert optimizer.state[p]["step"] == 2


def test_adagrad_state_exists_before_the_first_step():
    p = nn.Parameter(tg.ones(3))
    optimizer = optim.Adagrad([p], initial_accumulator_value=0.25)
    assert optimizer.state[p]["step"] == 0
    np.testing.assert_array_equal(optimizer.state[p]["sum"].numpy(), [0.25] * 3)


@pytest.mark.parametrize("optimizer_class", [optim.RMSprop, optim.Adagrad, optim.Adadelta, optim.Adamax,
                                             optim.NAdam, optim.RAdam])
def test_parameters_without_grad_are_left_alone(optimizer_class):
    used, unused = nn.Parameter(tg.ones(2)), nn.Parameter(tg.ones(2))
    optimizer = optimizer_class([used, unused], lr=0.5)
    (used * 2.0).sum().backward()
    optimizer.step()
    np.testing.assert_array_equal(unused.detach().numpy(), [1.0, 1.0])
    assert not np.allclose(used.detach().numpy(), [1.0, 1.0])


def test_param_groups_use_their_own_hyperparameters():
    a, b = nn.Parameter(tg.tensor(START)), nn.Parameter(tg.tensor(START))
    optimizer = optim.RMSprop([{"params": [a]}, {"params": [b], "lr": 0.01, "centered": True}], lr=0.05)
    for _ in range(STEPS):
        optimizer.zero_grad()
        (_loss(a) + _loss(b)).backward()
        optimizer.step()
    np.testing.assert_allclose(a.detach().numpy(), reference_rmsprop(lr=0.05)[-1], rtol=1e-11)
    np.testing.assert_allclose(b.detach().numpy(), reference_rmsprop(lr=0.01, centered=True)[-1], rtol=1e-11)


@pytest.mark.parametrize("make, message", [
    (lambda p: optim.RMSprop(p, lr=-1.0), "Invalid learning rate: -1.0"),
    (lambda p: optim.RMSprop(p, alpha=-0.1), "Invalid alpha value: -0.1"),
    (lambda p: optim.RMSprop(p, momentum=-0.1), "Invalid momentum value: -0.1"),
    (lambda p: optim.Adagrad(p, lr_decay=-0.1), "Invalid lr_decay value: -0.1"),
    (lambda p: optim.Adagrad(p, initial_accumulator_value=-1.0), "Invalid initial_accumulator_value value"),
    (lambda p: optim.Adadelta(p, rho=1.5), "Invalid rho value: 1.5"),
    (lambda p: optim.Adadelta(p, eps=-1.0), "Invalid epsilon value: -1.0"),
    (lambda p: optim.Adamax(p, betas=(1.0, 0.9)), "Invalid beta parameter at index 0: 1.0"),
    (lambda p: optim.NAdam(p, momentum_decay=-1.0), "Invalid momentum_decay value: -1.0"),
    (lambda p: optim.RAdam(p, weight_decay=-1.0), "Invalid weight_decay value: -1.0"),
])
def test_invalid_hyperparameters_raise_value_error(make, message):
    with pytest.raises(ValueError, match=message):
        make([nn.Parameter(tg.ones(1))])


# --- inside tg.compile ----------------------------------------------------------------------

COMPILED = {
    "rmsprop_centered_momentum": lambda ps: optim.RMSprop(ps, lr=0.01, momentum=0.9, centered=True,
                                                          weight_decay=1e-3),
    "adagrad": lambda ps: optim.Adagrad(ps, lr=0.1, lr_decay=0.01),
    "adadelta": lambda ps: optim.Adadelta(ps, weight_decay=1e-3),
    "adamax": lambda ps: optim.Adamax(ps, lr=0.01),
    "nadam": lambda ps: optim.NAdam(ps, lr=0.01, weight_decay=1e-2, decoupled_weight_decay=True),
    "radam": lambda ps: optim.RAdam(ps, lr=0.01),
}


def _mlp():
    tg.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))


def _train_step(model, optimizer):
    def step(x, y):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss
    return step


def _data():
    rng = np.random.default_rng(0)
    return tg.tensor(rng.normal(size=(32, 4)).astype(np.float32)), tg.tensor(rng.integers(0, 3, 32))


@pytest.mark.parametrize("name", COMPILED)
def test_compiled_steps_end_with_the_eager_parameters(name):
    x, y = _data()
    model_c, model_e = _mlp(), _mlp()
    step_c = tg.compile(_train_step(model_c, COMPILED[name](model_c.parameters())))
    step_e = _train_step(model_e, COMPILED[name](model_e.parameters()))
    for _ in range(12):
        step_c(x, y)
        step_e(x, y)
    for compiled, eager in zip(model_c.parameters(), model_e.parameters(), strict=True):
        np.testing.assert_allclose(compiled.detach().numpy(), eager.detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", COMPILED)
def test_compiled_steps_do_not_recompile_as_the_step_count_grows(name):
    x, y = _data()
    model = _mlp()
    step = tg.compile(_train_step(model, COMPILED[name](model.parameters())))
    for _ in range(8):  # state appears in the first call; RAdam rectifies from step 6 on
        step(x, y)
    misses = step.cache_info().misses
    for _ in range(4):
        step(x, y)
    assert step.cache_info().misses == misses


# --- state dicts ------------------------------------------------------------------------------

def _steps(optimizer, p, count):
    for _ in range(count):
        optimizer.zero_grad()
        _loss(p).backward()
        optimizer.step()


@pytest.mark.parametrize("name", ["rmsprop_all", "adagrad_decay", "adadelta_options", "adamax_options", "nadam_l2",
                                  "radam"])
def test_state_dict_saved_and_loaded_resumes_the_same_trajectory(name, tmp_path):
    optimizer_class, _, options = CASES[name]
    p = nn.Parameter(tg.tensor(START))
    optimizer = optimizer_class([p], **options)
    _steps(optimizer, p, 3)
    tg.save(optimizer.state_dict(), tmp_path / "optimizer.pt")
    resumed_p = nn.Parameter(tg.tensor(p.detach().numpy().copy()))
    resumed = optimizer_class([resumed_p], lr=123.0)  # hyperparameters come from the state dict
    resumed.load_state_dict(tg.load(tmp_path / "optimizer.pt"))
    _steps(optimizer, p, 3)
    _steps(resumed, resumed_p, 3)
    np.testing.assert_array_equal(resumed_p.detach().numpy(), p.detach().numpy())


@pytest.mark.parametrize("name", ["rmsprop_all", "adagrad_decay", "adadelta_options", "adamax_options", "nadam_l2",
                                  "radam"])
def test_a_torch_state_dict_loads_and_continues_as_torch_does(name):
    torch = pytest.importorskip("torch")
    optimizer_class, _, options = CASES[name]
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        theirs = torch.tensor(START, requires_grad=True)
        theirs_optimizer = getattr(torch.optim, optimizer_class.__name__)([theirs], **options)

        def torch_steps(count):
            for _ in range(count):
                theirs_optimizer.zero_grad()
                (torch.tensor(CURVATURE) * theirs * theirs * 0.5 + torch.tensor(SHIFT) * theirs).sum().backward()
                theirs_optimizer.step()
        torch_steps(3)
        saved = theirs_optimizer.state_dict()
        state = {index: {key: tg.tensor(value.detach().numpy()) if isinstance(value, torch.Tensor) else value
                         for key, value in entry.items()} for index, entry in saved["state"].items()}
        p = nn.Parameter(tg.tensor(theirs.detach().numpy().copy()))
        ours = optimizer_class([p])
        ours.load_state_dict({"state": state, "param_groups": saved["param_groups"]})
        _steps(ours, p, 3)
        torch_steps(3)
        np.testing.assert_allclose(p.detach().numpy(), theirs.detach().numpy(), rtol=1e-11, atol=1e-13)
        assert sorted(ours.state[p]) == sorted(saved["state"][0])
    finally:
        torch.set_default_dtype(default_dtype)
