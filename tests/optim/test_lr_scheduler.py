"""`tg.optim.lr_scheduler`: StepLR and CosineAnnealingLR write PyTorch's sequence of
learning rates into the optimizer's groups."""

import math

import pytest

import tracegrad as tg
from tracegrad import nn, optim
from tracegrad.optim.lr_scheduler import CosineAnnealingLR, StepLR


def _optimizer(lr=0.1, second_lr=None):
    groups = [{"params": [nn.Parameter(tg.ones(1))]}]
    if second_lr is not None:
        groups.append({"params": [nn.Parameter(tg.ones(1))], "lr": second_lr})
    return optim.SGD(groups, lr=lr, momentum=0.9)


def _rates(scheduler, epochs):
    """The first group's rate for epochs 0..epochs-1 (read before each scheduler.step())."""
    rates = []
    for _ in range(epochs):
        rates.append(scheduler.optimizer.param_groups[0]["lr"])
        scheduler.optimizer.step()
        scheduler.step()
    return rates


def test_step_lr_multiplies_by_gamma_every_step_size_epochs():
    rates = _rates(StepLR(_optimizer(lr=0.1), step_size=3, gamma=0.5), 10)
    assert rates == pytest.approx([0.1 * 0.5 ** (epoch // 3) for epoch in range(10)], rel=1e-12)


def test_cosine_annealing_follows_the_closed_form_over_two_periods():
    eta_min, t_max, base = 0.001, 5, 0.1
    rates = _rates(CosineAnnealingLR(_optimizer(lr=base), T_max=t_max, eta_min=eta_min), 21)
    expected = [eta_min + (base - eta_min) * (1 + math.cos(math.pi * epoch / t_max)) / 2 for epoch in range(21)]
    assert rates == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_cosine_annealing_reaches_eta_min_at_t_max():
    scheduler = CosineAnnealingLR(_optimizer(lr=0.1), T_max=4, eta_min=0.01)
    _rates(scheduler, 4)
    assert scheduler.get_last_lr() == pytest.approx([0.01])


def test_schedulers_scale_each_group_from_its_own_initial_rate():
    scheduler = StepLR(_optimizer(lr=0.1, second_lr=1.0), step_size=1, gamma=0.5)
    _rates(scheduler, 2)
    assert scheduler.get_last_lr() == pytest.approx([0.025, 0.25])


def test_creating_a_scheduler_records_initial_lr_and_keeps_the_rate():
    optimizer = _optimizer(lr=0.1)
    scheduler = CosineAnnealingLR(optimizer, T_max=10)
    assert optimizer.param_groups[0]["initial_lr"] == 0.1
    assert scheduler.get_last_lr() == [0.1] and scheduler.last_epoch == 0


def test_resuming_without_initial_lr_raises_key_error():
    with pytest.raises(KeyError, match="initial_lr"):
        StepLR(_optimizer(), step_size=2, last_epoch=3)


def test_scheduler_state_dict_round_trip_continues_the_sequence():
    optimizer = _optimizer(lr=0.1)
    scheduler = CosineAnnealingLR(optimizer, T_max=8, eta_min=0.01)
    _rates(scheduler, 3)
    checkpoint = scheduler.state_dict()
    assert "optimizer" not in checkpoint
    resumed_optimizer = _optimizer(lr=0.1)
    resumed_optimizer.load_state_dict(optimizer.state_dict())
    resumed = CosineAnnealingLR(resumed_optimizer, T_max=8, eta_min=0.01)
    resumed.load_state_dict(checkpoint)
    resumed_optimizer.param_groups[0]["lr"] = scheduler.get_last_lr()[0]
    assert _rates(resumed, 6) == pytest.approx(_rates(scheduler, 6), rel=1e-12)


def test_a_scheduler_needs_an_optimizer():
    with pytest.raises(TypeError, match="is not an Optimizer"):
        StepLR(object(), step_size=2)


@pytest.mark.parametrize("name, options", [
    ("StepLR", dict(step_size=3, gamma=0.7)),
    ("CosineAnnealingLR", dict(T_max=4, eta_min=0.002)),
    ("CosineAnnealingLR", dict(T_max=7)),
], ids=["step_lr", "cosine", "cosine_no_eta_min"])
def test_rates_match_torch_schedulers(name, options):
    torch = pytest.importorskip("torch")
    reference_optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1, momentum=0.9)
    reference = getattr(torch.optim.lr_scheduler, name)(reference_optimizer, **options)
    expected = []
    for _ in range(20):
        expected.append(reference_optimizer.param_groups[0]["lr"])
        reference_optimizer.step()
        reference.step()
    ours = getattr(optim.lr_scheduler, name)(_optimizer(lr=0.1), **options)
    assert _rates(ours, 20) == pytest.approx(expected, rel=1e-12, abs=1e-15)
