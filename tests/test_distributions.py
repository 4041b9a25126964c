"""`tg.distributions`: Categorical, Normal and Bernoulli give PyTorch's log_prob, entropy
and moments, their densities differentiate (gradcheck), samples follow the distribution,
and Normal's rsample carries the gradient (REINFORCE and VAE programs use these)."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck
from tracegrad.distributions import Bernoulli, Categorical, Normal


def _leaf(*shape, seed=0):
    return tg.from_numpy(np.random.default_rng(seed).standard_normal(shape)).requires_grad_()


@pytest.mark.parametrize("check", [gradcheck, gradgradcheck])
def test_densities_differentiate_with_respect_to_parameters(check):
    logits = _leaf(3, 4)
    index = tg.tensor([0, 3, 1])
    assert check(lambda t: Categorical(logits=t).log_prob(index) + Categorical(logits=t).entropy(), (logits,))
    probs = tg.from_numpy(np.random.default_rng(1).uniform(0.2, 1.0, (2, 3))).requires_grad_()
    assert check(lambda p: Categorical(probs=p).log_prob(tg.tensor([2, 0])), (probs,))
    loc, scale = _leaf(3, seed=2), tg.from_numpy(np.array([0.5, 1.0, 2.0])).requires_grad_()
    value = tg.from_numpy(np.array([0.1, -0.3, 1.2]))
    assert check(lambda m, s: Normal(m, s).log_prob(value) + Normal(m, s).entropy(), (loc, scale))
    assert check(lambda t: Bernoulli(logits=t).log_prob(tg.tensor([1.0, 0.0, 1.0], dtype=tg.float64))
                 + Bernoulli(logits=t).entropy(), (loc,))


def test_samples_follow_the_distribution():
    tg.manual_seed(0)
    draws = Categorical(probs=tg.tensor([0.1, 0.6, 0.3])).sample((20000,))
    assert draws.shape == (20000,) and draws.dtype == tg.int64
    np.testing.assert_allclose(np.bincount(draws.numpy(), minlength=3) / 20000, [0.1, 0.6, 0.3], atol=0.015)
    batch = Categorical(logits=tg.zeros(4, 5))
    assert batch.sample().shape == (4,) and batch.sample((2, 3)).shape == (2, 3, 4)
    normal = Normal(tg.tensor([1.0, -2.0]), tg.tensor([0.5, 2.0])).sample((20000,))
    np.testing.assert_allclose(normal.numpy().mean(0), [1.0, -2.0], atol=0.05)
    np.testing.assert_allclose(normal.numpy().std(0), [0.5, 2.0], rtol=0.03)
    coin = Bernoulli(probs=tg.tensor([0.2, 0.9])).sample((20000,))
    np.testing.assert_allclose(coin.numpy().mean(0), [0.2, 0.9], atol=0.015)


def test_rsample_carries_the_gradient_and_sample_does_not():
    loc = tg.zeros(3, requires_grad=True)
    dist = Normal(loc, 1.0)
    dist.rsample().sum().backward()
    assert loc.grad.tolist() == [1.0, 1.0, 1.0]
    assert not dist.sample().requires_grad


def test_reinforce_loss_as_the_rl_examples_write_it():
    policy = tg.nn.Linear(4, 2)
    probs = tg.softmax(policy(tg.ones(1, 4)), dim=1)
    m = Categorical(probs)
    action = m.sample()
    loss = -m.log_prob(action) * 1.5
    loss.sum().backward()
    assert policy.weight.grad is not None and np.isfinite(policy.weight.grad.numpy()).all()


def test_errors():
    with pytest.raises(ValueError, match="Either `probs` or `logits`"):
        Categorical()
    with pytest.raises(ValueError, match="Either `probs` or `logits`"):
        Bernoulli(probs=tg.ones(1), logits=tg.ones(1))


def test_matches_pytorch():
    torch = pytest.importorskip("torch")
    logits = np.random.default_rng(3).standard_normal((3, 5))
    index = np.array([4, 0, 2])
    ours, theirs = Categorical(logits=tg.tensor(logits)), torch.distributions.Categorical(logits=torch.tensor(logits))
    np.testing.assert_allclose(ours.log_prob(tg.tensor(index)).numpy(),
                               theirs.log_prob(torch.tensor(index)).numpy(), rtol=1e-12)
    np.testing.assert_allclose(ours.entropy().numpy(), theirs.entropy().numpy(), rtol=1e-12)
    np.testing.assert_allclose(ours.probs.numpy(), theirs.probs.numpy(), rtol=1e-12)
    probs = np.array([0.2, 0.3, 0.5])
    np.testing.assert_allclose(Categorical(probs=tg.tensor(probs)).entropy().numpy(),
                               torch.distributions.Categorical(probs=torch.tensor(probs)).entropy().numpy(), rtol=1e-12)
    loc, scale, value = np.array([0.0, 1.0]), np.array([2.0, 0.5]), np.array([0.3, 1.7])
    ours, theirs = Normal(tg.tensor(loc), tg.tensor(scale)), torch.distributions.Normal(torch.tensor(loc),
                                                                                        torch.tensor(scale))
    np.testing.assert_allclose(ours.log_prob(tg.tensor(value)).numpy(), theirs.log_prob(torch.tensor(value)).numpy(),
                               rtol=1e-12)
    np.testing.assert_allclose(ours.entropy().numpy(), theirs.entropy().numpy(), rtol=1e-12)
    logits = np.array([-3.0, 0.0, 40.0])
    ours, theirs = Bernoulli(logits=tg.tensor(logits)), torch.distributions.Bernoulli(logits=torch.tensor(logits))
    outcome = np.array([1.0, 0.0, 0.0])
    np.testing.assert_allclose(ours.log_prob(tg.tensor(outcome)).numpy(),
                               theirs.log_prob(torch.tensor(outcome)).numpy(), rtol=1e-12)
    np.testing.assert_allclose(ours.entropy().numpy(), theirs.entropy().numpy(), rtol=1e-10, atol=1e-15)
