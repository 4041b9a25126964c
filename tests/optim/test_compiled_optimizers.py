"""Optimizers inside `tg.compile`: compiled training steps end where eager ones do, state
created in the first compiled call becomes real tensors, and hyperparameters that change
between calls (learning rate schedules, Adam's step count) are runtime scalars, not
recompiles."""

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad import nn, optim
from tracegrad.functional._util import composite
from tracegrad.optim.lr_scheduler import CosineAnnealingLR, StepLR

OPTIMIZERS = {
    "sgd": lambda params: optim.SGD(params, lr=0.1),
    "sgd_momentum_weight_decay": lambda params: optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "sgd_nesterov_dampening": lambda params: optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda params: optim.Adam(params, lr=0.01, weight_decay=1e-3),
    "adam_amsgrad": lambda params: optim.Adam(params, lr=0.01, amsgrad=True),
    "adamw": lambda params: optim.AdamW(params, lr=0.01, weight_decay=0.1),
}


def _mlp(seed=0):
    tg.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return tg.tensor(rng.normal(size=(32, 4)).astype(np.float32)), tg.tensor(rng.integers(0, 3, 32))


def _train_step(model, optimizer):
    def step(x, y):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss
    return step


def _params(model):
    return [p.detach().numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize("make_optimizer", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_50_compiled_steps_end_with_the_eager_parameters(make_optimizer):
    x, y = _data()
    model_c, model_e = _mlp(), _mlp()
    step_c = tg.compile(_train_step(model_c, make_optimizer(model_c.parameters())))
    step_e = _train_step(model_e, make_optimizer(model_e.parameters()))
    for _ in range(50):
        loss_c, loss_e = step_c(x, y), step_e(x, y)
    assert loss_c.item() == pytest.approx(loss_e.item(), rel=1e-4)
    for compiled, eager in zip(_params(model_c), _params(model_e), strict=True):
        np.testing.assert_allclose(compiled, eager, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("make_optimizer", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_compiled_steps_reuse_one_graph_once_the_state_exists(make_optimizer):
    x, y = _data()
    model = _mlp()
    step = tg.compile(_train_step(model, make_optimizer(model.parameters())))
    for _ in range(2):  # SGD's momentum buffer appears in the first call: a second graph
        step(x, y)
    misses = step.cache_info().misses
    for _ in range(5):
        step(x, y)
    assert step.cache_info().misses == misses


@pytest.mark.parametrize("name", ["sgd_momentum_weight_decay", "adam_amsgrad"])
def test_state_created_in_a_compiled_call_is_materialized(name):
    x, y = _data()
    model = _mlp()
    optimizer = OPTIMIZERS[name](model.parameters())
    tg.compile(_train_step(model, optimizer))(x, y)
    tensors = [value for state in optimizer.state.values() for value in state.values() if isinstance(value, tg.Tensor)]
    assert len(optimizer.state) == 4 and tensors
    assert all(isinstance(t.numpy(), np.ndarray) and np.isfinite(t.numpy()).all() for t in tensors)
    assert any(np.abs(t.numpy()).sum() > 0 for t in tensors)


def test_compiled_adam_counts_steps_in_its_state():
    x, y = _data()
    model = _mlp()
    optimizer = optim.Adam(model.parameters(), lr=0.01)
    step = tg.compile(_train_step(model, optimizer))
    for _ in range(3):
        step(x, y)
    assert [state["step"] for state in optimizer.state.values()] == [3, 3, 3, 3]


@pytest.mark.parametrize("make_scheduler", [
    lambda opt: StepLR(opt, step_size=2, gamma=0.5),
    lambda opt: CosineAnnealingLR(opt, T_max=5, eta_min=1e-4),
], ids=["step_lr", "cosine"])
@pytest.mark.parametrize("name", ["sgd_momentum_weight_decay", "adamw"])
def test_scheduled_learning_rate_does_not_recompile(name, make_scheduler):
    x, y = _data()
    model = _mlp()
    optimizer = OPTIMIZERS[name](model.parameters())
    scheduler = make_scheduler(optimizer)
    step = tg.compile(_train_step(model, optimizer))
    for _ in range(2):
        step(x, y)
        scheduler.step()
    misses, rates = step.cache_info().misses, set()
    for _ in range(8):
        rates.add(optimizer.param_groups[0]["lr"])
        step(x, y)
        scheduler.step()
    assert len(rates) >= 4  # the schedule did change the rate
    assert step.cache_info().misses == misses


@pytest.mark.parametrize("name", ["sgd_momentum_weight_decay", "adam"])
def test_scheduled_compiled_steps_end_with_the_eager_parameters(name):
    x, y = _data()
    model_c, model_e = _mlp(), _mlp()
    opt_c, opt_e = OPTIMIZERS[name](model_c.parameters()), OPTIMIZERS[name](model_e.parameters())
    sched_c, sched_e = CosineAnnealingLR(opt_c, T_max=10), CosineAnnealingLR(opt_e, T_max=10)
    step_c, step_e = tg.compile(_train_step(model_c, opt_c)), _train_step(model_e, opt_e)
    for _ in range(10):
        step_c(x, y)
        step_e(x, y)
        sched_c.step()
        sched_e.step()
    for compiled, eager in zip(_params(model_c), _params(model_e), strict=True):
        np.testing.assert_allclose(compiled, eager, rtol=1e-4, atol=1e-5)


def test_param_groups_with_different_learning_rates_compile_to_the_eager_result():
    x, y = _data()
    models = _mlp(), _mlp()
    steps = []
    for model in models:
        first, last = model[0], model[2]
        optimizer = optim.SGD([{"params": first.parameters(), "lr": 0.01},
                               {"params": last.parameters()}], lr=0.2, momentum=0.5)
        steps.append(_train_step(model, optimizer))
    step_c, step_e = tg.compile(steps[0]), steps[1]
    for _ in range(10):
        step_c(x, y)
        step_e(x, y)
    for compiled, eager in zip(_params(models[0]), _params(models[1]), strict=True):
        np.testing.assert_allclose(compiled, eager, rtol=1e-4, atol=1e-5)


def test_learning_rate_reaches_the_compiled_graph_as_a_runtime_input():
    x, y = _data()
    model = _mlp()
    step = tg.compile(_train_step(model, optim.SGD(model.parameters(), lr=0.125)))
    report = step.explain(x, y)
    graph = report.graphs[-1].graph
    baked = [node for node in graph.nodes if any(np.isin(value, (0.125, -0.125)).any()
                                                 for value in node.attrs.values() if isinstance(value, float))]
    assert baked == []
    assert any(v.type.shape == () for v in graph.inputs)


def _write(values, p, q):
    from tracegrad.optim.optimizer import write_new_values
    with tg.no_grad():
        write_new_values(values, (p, q), p, q)


@pytest.mark.parametrize("values", [
    lambda p, q: (p * 2, q + 1),  # new values: written as they are
    lambda p, q: (q, p),          # the arguments themselves: copied (p takes q's old values)
    lambda p, q: ((p * 2,) * 2),  # one new value for both: each gets a copy of its own
], ids=["new", "arguments", "shared"])
def test_written_new_values_are_the_tensors_own_eager_and_compiled(values):
    def run(p, q):
        before = (p._version, q._version)
        _write(values, p, q)
        assert (p._version, q._version) == (before[0] + 1, before[1] + 1)
        (p.sum() + (q * 2).sum()).backward()  # (each keeps its own identity: its own .grad)
        with tg.no_grad():
            p.add_(100.0)  # (a later write to one changes neither the other nor the values' sources)
        return p.detach() * 1, q.detach() * 1

    start = (np.arange(6.0).reshape(2, 3), np.arange(6.0, 12.0).reshape(2, 3))
    p, q = (tg.tensor(a) for a in start)
    for target, value in zip((p, q), values(p, q)):  # (copy_ after copy_: the contract)
        target.copy_(value)
    want = (p.numpy() + 100.0, q.numpy())
    for fn in (run, tg.compile(run), tg.compile(run)):
        p, q = (tg.tensor(a, requires_grad=True) for a in start)
        got = fn(p, q)
        for tensor, result, wanted, grad in zip((p, q), got, want, (1.0, 2.0)):
            np.testing.assert_array_equal(result.detach().numpy(), wanted)
            np.testing.assert_array_equal(tensor.detach().numpy(), wanted)
            np.testing.assert_array_equal(tensor.grad.numpy(), np.full((2, 3), grad))


# The optimizers whose updates are composites (`write_new_values`); Adamax, NAdam and RAdam
# update in place op by op.
GROUPED = {
    "sgd_momentum": (lambda params: optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3), "_sgd_values"),
    "adamw": (lambda params: optim.AdamW(params, lr=0.01), "_adam_values"),
    "rmsprop_centered": (lambda params: optim.RMSprop(params, lr=0.01, momentum=0.5, centered=True), None),
    "adagrad": (lambda params: optim.Adagrad(params, lr=0.1), None),
    "adadelta": (lambda params: optim.Adadelta(params, lr=1.0), None),
}


def _compiled_run(make, steps=4):
    model = _mlp().double()
    optimizer = make(model.parameters())
    compiled = tg.compile(_train_step(model, optimizer))
    losses = [float(compiled(x.double(), y)) for x, y in (_data(seed) for seed in range(steps))]
    return losses, [p.detach().numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize("name", GROUPED)
def test_a_traced_step_runs_its_parameters_updates_as_one_composite_with_the_same_bits(name, composite_jumps,
                                                                                      monkeypatch):
    from tracegrad.optim import optimizer as optimizer_module
    make, function = GROUPED[name]
    losses, params = _compiled_run(make)
    jumps = list(composite_jumps)
    monkeypatch.setattr(optimizer_module, "GROUP_UPDATES", False)  # a composite per parameter
    per_parameter = _compiled_run(make)
    assert losses == per_parameter[0]
    for got, want in zip(params, per_parameter[1]):
        np.testing.assert_array_equal(got, want)
    grouped = [n for n in jumps if n.endswith("_group")]
    assert grouped and (function is None or f"{function}_group" in grouped)


class _SharedStateSGD(optim.optimizer.PerParameterOptimizer):
    """Every parameter's update reads and writes one tensor shared by all (a running sum):
    each update must see the one before it."""

    def __init__(self, params):
        super().__init__(params, {"lr": 0.1, "maximize": False})
        self.total = tg.zeros(())

    def _update(self, p, grad, group):
        optim.optimizer.write_new_values(_shared_values, (p, self.total), p, grad, self.total)


@composite
def _shared_values(p, grad, total):
    step = grad * (0.1 + total)
    return p - step, total + step.sum()


def test_an_update_reading_what_an_earlier_one_writes_sees_it_written(monkeypatch):
    from tracegrad.optim import optimizer as optimizer_module

    def run(compiled: bool, grouped: bool = True):
        monkeypatch.setattr(optimizer_module, "GROUP_UPDATES", grouped)
        model = _mlp().double()
        optimizer = _SharedStateSGD(model.parameters())
        step = _train_step(model, optimizer)
        step = tg.compile(step) if compiled else step
        for seed in range(3):
            x, y = _data(seed)
            step(x.double(), y)
        return [p.detach().numpy().copy() for p in model.parameters()] + [optimizer.total.numpy().copy()]

    eager, grouped, ungrouped = run(False), run(True), run(True, grouped=False)
    for a, b, c in zip(eager, grouped, ungrouped):
        np.testing.assert_array_equal(b, c)
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)


def test_the_composite_at_which_a_followed_call_diverges_is_taken_whole_by_the_calls_after(composite_jumps,
                                                                                            monkeypatch):
    # The first momentum step has no buffer (an in-place add): the second call follows the
    # first until the first parameter's update, diverges inside that composite and records
    # it with the numbers the replay made before; from the third call on, every parameter's
    # update is taken whole, the first one's included.
    from tracegrad.optim import optimizer as optimizer_module
    monkeypatch.setattr(optimizer_module, "GROUP_UPDATES", False)
    model = _mlp().double()
    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    compiled = tg.compile(_train_step(model, optimizer))
    for seed in range(2):
        x, y = _data(seed)
        compiled(x.double(), y)
    composite_jumps.clear()
    x, y = _data(2)
    compiled(x.double(), y)
    assert composite_jumps.count("_sgd_values") == len(list(model.parameters()))


SHARED_NUMBERS = {
    "sgd_momentum_weight_decay": OPTIMIZERS["sgd_momentum_weight_decay"],
    "sgd_dampening": lambda params: optim.SGD(params, lr=0.05, momentum=0.9, dampening=0.25),
    "sgd_nesterov": OPTIMIZERS["sgd_nesterov_dampening"],
    "adam": OPTIMIZERS["adam"],
    "adamw": OPTIMIZERS["adamw"],
    "rmsprop_centered_momentum": lambda params: optim.RMSprop(params, lr=0.01, momentum=0.5, centered=True,
                                                              weight_decay=1e-3),
    "adagrad": lambda params: optim.Adagrad(params, lr=0.1, lr_decay=0.01, weight_decay=1e-3),
    "adadelta": lambda params: optim.Adadelta(params, lr=0.5, weight_decay=1e-3),
}


@pytest.mark.parametrize("name", list(SHARED_NUMBERS))
def test_a_compiled_step_reads_its_numbers_once_whatever_the_parameters(name):
    # The numbers of a group's updates (step sizes, betas, eps, decay factors) are one 0-d
    # input each, so a deeper model's step reads no more of them (`update_scalar`); its
    # parameters end as eagerly.
    def scalar_inputs(depth: int) -> int:
        tg.manual_seed(0)
        layers = [nn.Linear(3, 3) for _ in range(depth)]
        model_c, model_e = nn.Sequential(*layers), nn.Sequential(*[nn.Linear(3, 3) for _ in range(depth)])
        model_e.load_state_dict(model_c.state_dict())
        x = tg.randn(4, 3)
        steps = []
        for model in (model_c, model_e):
            optimizer = SHARED_NUMBERS[name](model.parameters())

            def train(x, model=model, optimizer=optimizer):
                optimizer.zero_grad()
                model(x).square().sum().backward()
                optimizer.step()
            steps.append(train)
        compiled = tg.compile(steps[0])
        for _ in range(3):
            compiled(x)
            steps[1](x)
        for got, want in zip(model_c.parameters(), model_e.parameters()):
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
        steady = list(compiled._programs.values())[-1]  # (SGD's first step makes the buffers op by op)
        return sum(t.shape == () for t in steady.input_types)
    assert scalar_inputs(4) == scalar_inputs(1)
