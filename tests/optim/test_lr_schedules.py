"""The schedules of `tg.optim.lr_scheduler` beyond StepLR and CosineAnnealingLR: each one's
sequence of rates (and cycled momentum) against its closed form, against torch's scheduler
epoch by epoch (when installed), `step(epoch)`, combinators, and state dicts."""

import math

import pytest

import tracegrad as tg
from tracegrad import nn, optim
from tracegrad.optim import lr_scheduler as sched


def _optimizer(lr=0.1, second_lr=None, kind="sgd"):
    groups = [{"params": [nn.Parameter(tg.ones(1))]}]
    if second_lr is not None:
        groups.append({"params": [nn.Parameter(tg.ones(1))], "lr": second_lr})
    if kind == "adam":
        return optim.Adam(groups, lr=lr)
    return optim.SGD(groups, lr=lr, momentum=0.9)


def _rates(scheduler, epochs, group=0):
    """The group's rate for epochs 0..epochs-1 (read before each scheduler.step())."""
    rates = []
    for _ in range(epochs):
        rates.append(scheduler.optimizer.param_groups[group]["lr"])
        scheduler.optimizer.step()
        scheduler.step()
    return rates


# --- closed forms --------------------------------------------------------------------------

def test_lambda_lr_scales_the_initial_rate_by_the_lambda_of_the_epoch():
    rates = _rates(sched.LambdaLR(_optimizer(0.5), lambda epoch: 1 / (epoch + 1)), 6)
    assert rates == pytest.approx([0.5 / (epoch + 1) for epoch in range(6)], rel=1e-12)


def test_lambda_lr_takes_one_lambda_per_group():
    scheduler = sched.LambdaLR(_optimizer(0.1, second_lr=1.0), [lambda e: 0.5 ** e, lambda e: e + 1])
    _rates(scheduler, 3)
    assert scheduler.get_last_lr() == pytest.approx([0.1 * 0.125, 4.0])


def test_lambda_lr_with_the_wrong_number_of_lambdas_raises():
    with pytest.raises(ValueError, match="Expected 2 lr_lambdas, but got 1"):
        sched.LambdaLR(_optimizer(0.1, second_lr=1.0), [lambda e: 1.0])


def test_multiplicative_lr_multiplies_the_current_rate_from_epoch_one_on():
    rates = _rates(sched.MultiplicativeLR(_optimizer(1.0), lambda epoch: 0.5), 5)
    assert rates == pytest.approx([1.0, 0.5, 0.25, 0.125, 0.0625], rel=1e-12)


def test_multistep_lr_multiplies_at_each_milestone():
    rates = _rates(sched.MultiStepLR(_optimizer(1.0), milestones=[2, 5, 5], gamma=0.1), 7)
    assert rates == pytest.approx([1.0, 1.0, 0.1, 0.1, 0.1, 0.001, 0.001], rel=1e-12)


def test_exponential_lr_is_initial_times_gamma_to_the_epoch():
    assert _rates(sched.ExponentialLR(_optimizer(0.2), gamma=0.9), 8) == pytest.approx(
        [0.2 * 0.9 ** epoch for epoch in range(8)], rel=1e-12)


def test_constant_lr_scales_until_total_iters():
    rates = _rates(sched.ConstantLR(_optimizer(0.3), factor=0.5, total_iters=3), 6)
    assert rates == pytest.approx([0.15, 0.15, 0.15, 0.3, 0.3, 0.3], rel=1e-12)


def test_linear_lr_ramps_the_factor_linearly_then_holds():
    rates = _rates(sched.LinearLR(_optimizer(1.0), start_factor=0.25, end_factor=1.0, total_iters=3), 6)
    assert rates == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0], rel=1e-12)


def test_polynomial_lr_decays_to_zero_at_total_iters():
    rates = _rates(sched.PolynomialLR(_optimizer(1.0), total_iters=4, power=2.0), 6)
    assert rates == pytest.approx([(1 - min(e, 4) / 4) ** 2 for e in range(6)], abs=1e-12)


def test_cosine_warm_restarts_restart_with_growing_periods():
    eta_min, base = 0.01, 0.1
    rates = _rates(sched.CosineAnnealingWarmRestarts(_optimizer(base), T_0=2, T_mult=2, eta_min=eta_min), 14)
    positions = [(0, 2), (1, 2), (0, 4), (1, 4), (2, 4), (3, 4)] + [(t, 8) for t in range(8)]
    expected = [eta_min + (base - eta_min) * (1 + math.cos(math.pi * t / period)) / 2 for t, period in positions]
    assert rates == pytest.approx(expected, rel=1e-12)


def test_cosine_warm_restarts_anneal_within_an_epoch_given_fractional_epochs():
    scheduler = sched.CosineAnnealingWarmRestarts(_optimizer(1.0), T_0=4)
    scheduler.step(1.5)
    assert scheduler.get_last_lr() == pytest.approx([(1 + math.cos(math.pi * 1.5 / 4)) / 2])
    assert scheduler.last_epoch == 1


def test_one_cycle_rises_to_max_lr_then_anneals_below_the_start():
    optimizer = _optimizer(0.1)
    scheduler = sched.OneCycleLR(optimizer, max_lr=1.0, total_steps=10)
    rates, momenta = [], []
    for _ in range(10):
        rates.append(optimizer.param_groups[0]["lr"])
        momenta.append(optimizer.param_groups[0]["momentum"])
        optimizer.step()
        scheduler.step()
    assert rates[0] == pytest.approx(1.0 / 25) and max(rates) == pytest.approx(1.0)
    assert rates.index(max(rates)) == 2 and rates[-1] == pytest.approx(1.0 / 25 / 1e4)
    assert momenta[0] == pytest.approx(0.95) and momenta[2] == pytest.approx(0.85)


def test_one_cycle_cycles_adams_beta1():
    optimizer = _optimizer(0.1, kind="adam")
    scheduler = sched.OneCycleLR(optimizer, max_lr=0.5, total_steps=10)
    _rates(scheduler, 1)  # step 1 of the rise: beta1 between max_momentum and base_momentum
    beta1, beta2 = optimizer.param_groups[0]["betas"]
    assert 0.85 < beta1 < 0.95 and beta2 == 0.999


def test_one_cycle_past_total_steps_raises():
    scheduler = sched.OneCycleLR(_optimizer(0.1), max_lr=1.0, total_steps=3)
    _rates(scheduler, 3)
    with pytest.raises(ValueError, match="Tried to step 4 times. The specified number of total steps is 3"):
        scheduler.step()


def test_cyclic_lr_triangle_between_base_and_max():
    rates = _rates(sched.CyclicLR(_optimizer(0.1), base_lr=0.1, max_lr=0.5, step_size_up=2), 9)
    assert rates == pytest.approx([0.1, 0.3, 0.5, 0.3, 0.1, 0.3, 0.5, 0.3, 0.1], rel=1e-12)


def test_cyclic_lr_triangular2_halves_the_amplitude_each_cycle():
    rates = _rates(sched.CyclicLR(_optimizer(0.1), base_lr=0.0, max_lr=1.0, step_size_up=1,
                                  mode="triangular2"), 7)
    assert rates == pytest.approx([0.0, 1.0, 0.0, 0.5, 0.0, 0.25, 0.0], abs=1e-12)


def test_reduce_on_plateau_waits_patience_epochs_then_reduces():
    optimizer = _optimizer(1.0)
    scheduler = sched.ReduceLROnPlateau(optimizer, factor=0.5, patience=2)
    rates = []
    for metric in [1.0, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.5]:
        scheduler.step(metric)
        rates.append(optimizer.param_groups[0]["lr"])
    assert rates == [1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5]


def test_reduce_on_plateau_respects_min_lr_and_cooldown():
    optimizer = _optimizer(1.0)
    scheduler = sched.ReduceLROnPlateau(optimizer, mode="max", factor=0.1, patience=0, cooldown=1, min_lr=0.05)
    rates = []
    for _ in range(5):
        scheduler.step(1.0)
        rates.append(optimizer.param_groups[0]["lr"])
    # epoch 1 sets best; then bad epochs reduce, with a cooldown epoch after each reduction
    assert rates == pytest.approx([1.0, 0.1, 0.1, 0.05, 0.05])
    assert scheduler.get_last_lr() == pytest.approx([0.05])


def test_sequential_lr_hands_over_at_the_milestone():
    optimizer = _optimizer(1.0)
    warmup = sched.LinearLR(optimizer, start_factor=0.5, total_iters=2)
    decay = sched.ExponentialLR(optimizer, gamma=0.5)
    rates = _rates(sched.SequentialLR(optimizer, [warmup, decay], milestones=[2]), 6)
    assert rates == pytest.approx([0.5, 0.75, 1.0, 0.5, 0.25, 0.125], rel=1e-12)


def test_chained_scheduler_composes_its_schedulers():
    optimizer = _optimizer(1.0)
    chained = sched.ChainedScheduler([sched.ConstantLR(optimizer, factor=0.5, total_iters=2),
                                      sched.ExponentialLR(optimizer, gamma=0.9)])
    assert _rates(chained, 4) == pytest.approx([0.5, 0.45, 0.81, 0.729], rel=1e-12)


def test_combinators_refuse_reduce_on_plateau():
    optimizer = _optimizer(1.0)
    with pytest.raises(ValueError, match="does not support `ReduceLROnPlateau`"):
        sched.ChainedScheduler([sched.ReduceLROnPlateau(optimizer)])


def test_step_with_an_epoch_uses_the_closed_form_and_warns():
    scheduler = sched.MultiStepLR(_optimizer(1.0), milestones=[2, 4], gamma=0.5)
    with pytest.warns(UserWarning, match="epoch parameter in `scheduler.step\\(\\)`"):
        scheduler.step(5)
    assert scheduler.get_last_lr() == pytest.approx([0.25]) and scheduler.last_epoch == 5


def test_scheduler_state_dict_round_trip_resumes_the_sequence():
    first = sched.ExponentialLR(_optimizer(1.0), gamma=0.5)
    _rates(first, 3)
    second = sched.ExponentialLR(_optimizer(1.0), gamma=0.9)
    second.load_state_dict(first.state_dict())
    second.optimizer.param_groups[0]["lr"] = first.optimizer.param_groups[0]["lr"]
    assert second.gamma == 0.5 and second.last_epoch == 3
    assert _rates(second, 2) == pytest.approx([0.125, 0.0625])


def test_lambda_lr_state_dict_saves_a_callable_objects_attributes_not_functions():
    class Warmup:
        def __init__(self, steps):
            self.steps = steps

        def __call__(self, epoch):
            return min(1.0, (epoch + 1) / self.steps)
    scheduler = sched.LambdaLR(_optimizer(1.0, second_lr=1.0), [Warmup(4), lambda e: 1.0])
    state = scheduler.state_dict()
    assert state["lr_lambdas"] == [{"steps": 4}, None]
    other = sched.LambdaLR(_optimizer(1.0, second_lr=1.0), [Warmup(10), lambda e: 1.0])
    other.load_state_dict(state)
    assert other.lr_lambdas[0].steps == 4


def test_sequential_lr_state_dict_holds_each_schedulers_state():
    optimizer = _optimizer(1.0)
    sequential = sched.SequentialLR(optimizer, [sched.ConstantLR(optimizer), sched.ExponentialLR(optimizer, 0.5)],
                                    milestones=[3])
    state = sequential.state_dict()
    assert [s["last_epoch"] for s in state["_schedulers"]] == [0, -1] and "optimizer" not in state


# --- against torch ---------------------------------------------------------------------------

SCHEDULES = {
    "lambda": lambda m, opt: m.LambdaLR(opt, lambda epoch: 0.95 ** epoch),
    "multiplicative": lambda m, opt: m.MultiplicativeLR(opt, lambda epoch: 0.9),
    "multistep": lambda m, opt: m.MultiStepLR(opt, milestones=[3, 7, 7], gamma=0.3),
    "exponential": lambda m, opt: m.ExponentialLR(opt, gamma=0.8),
    "constant": lambda m, opt: m.ConstantLR(opt, factor=0.25, total_iters=4),
    "linear": lambda m, opt: m.LinearLR(opt, start_factor=0.1, end_factor=0.9, total_iters=6),
    "polynomial": lambda m, opt: m.PolynomialLR(opt, total_iters=8, power=1.5),
    "warm_restarts": lambda m, opt: m.CosineAnnealingWarmRestarts(opt, T_0=3, T_mult=2, eta_min=1e-3),
    "one_cycle": lambda m, opt: m.OneCycleLR(opt, max_lr=[1.0, 2.0], total_steps=20),
    "one_cycle_linear_three_phase": lambda m, opt: m.OneCycleLR(
        opt, max_lr=1.0, epochs=4, steps_per_epoch=5, pct_start=0.4, anneal_strategy="linear", three_phase=True),
    "cyclic": lambda m, opt: m.CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=3, step_size_down=5),
    "cyclic_exp_range": lambda m, opt: m.CyclicLR(opt, base_lr=[0.01, 0.02], max_lr=0.1, step_size_up=2,
                                                  mode="exp_range", gamma=0.9),
    "sequential": lambda m, opt: m.SequentialLR(
        opt, [m.LinearLR(opt, start_factor=0.2, total_iters=4), m.CosineAnnealingLR(opt, T_max=10)], milestones=[4]),
    "chained": lambda m, opt: m.ChainedScheduler([m.ConstantLR(opt, factor=0.5, total_iters=3),
                                                  m.ExponentialLR(opt, gamma=0.9)]),
}


@pytest.mark.parametrize("name", SCHEDULES)
def test_rates_and_momenta_match_torch_epoch_by_epoch(name):
    torch = pytest.importorskip("torch")
    ours_opt = optim.SGD([{"params": [nn.Parameter(tg.ones(1))]},
                          {"params": [nn.Parameter(tg.ones(1))], "lr": 0.2}], lr=0.1, momentum=0.9)
    theirs_opt = torch.optim.SGD([{"params": [torch.ones(1, requires_grad=True)]},
                                  {"params": [torch.ones(1, requires_grad=True)], "lr": 0.2}], lr=0.1, momentum=0.9)
    ours, theirs = SCHEDULES[name](sched, ours_opt), SCHEDULES[name](torch.optim.lr_scheduler, theirs_opt)
    for epoch in range(20):
        for ours_group, theirs_group in zip(ours_opt.param_groups, theirs_opt.param_groups, strict=True):
            assert ours_group["lr"] == pytest.approx(theirs_group["lr"], rel=1e-12, abs=1e-15), f"epoch {epoch}"
            assert ours_group["momentum"] == pytest.approx(theirs_group["momentum"], rel=1e-12), f"epoch {epoch}"
        assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr(), rel=1e-12, abs=1e-15)
        ours_opt.step()
        theirs_opt.step()
        if epoch < 19 or "one_cycle" not in name:
            ours.step()
            theirs.step()


def test_reduce_on_plateau_matches_torch():
    torch = pytest.importorskip("torch")
    ours_opt = optim.SGD([nn.Parameter(tg.ones(1))], lr=1.0)
    theirs_opt = torch.optim.SGD([torch.ones(1, requires_grad=True)], lr=1.0)
    options = dict(factor=0.5, patience=1, threshold=0.05, threshold_mode="abs", cooldown=2, min_lr=0.01)
    ours = sched.ReduceLROnPlateau(ours_opt, **options)
    theirs = torch.optim.lr_scheduler.ReduceLROnPlateau(theirs_opt, **options)
    for metric in [5.0, 4.0, 3.98, 3.97, 3.5, 3.49, 3.49, 3.49, 3.49, 3.49, 3.49, 3.49, 3.49, 3.49, 3.49]:
        ours.step(metric)
        theirs.step(metric)
        assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr(), rel=1e-12)
        assert (ours.num_bad_epochs, ours.cooldown_counter) == (theirs.num_bad_epochs, theirs.cooldown_counter)


def test_state_dict_keys_match_torch():
    torch = pytest.importorskip("torch")
    ours_opt = optim.SGD([nn.Parameter(tg.ones(1))], lr=1.0, momentum=0.9)
    theirs_opt = torch.optim.SGD([torch.ones(1, requires_grad=True)], lr=1.0, momentum=0.9)
    for name in ["multistep", "linear", "one_cycle_linear_three_phase", "sequential"]:
        ours = set(SCHEDULES[name](sched, ours_opt).state_dict())
        theirs = set(SCHEDULES[name](torch.optim.lr_scheduler, theirs_opt).state_dict())
        assert ours <= theirs, name
