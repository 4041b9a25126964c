"""`functional/sampling.py`: multinomial, bernoulli, normal, poisson and the in-place random
fills. Distributions are checked by their moments on many draws with a fixed seed; shapes,
dtypes, generators, PyTorch's errors, and the in-place rules (a leaf that requires grad is
refused; a saved tensor's version moves) as PyTorch's."""

import numpy as np
import pytest

import tracegrad as tg


@pytest.fixture(autouse=True)
def _seeded():
    tg.manual_seed(0)


def test_multinomial_with_replacement_follows_the_weights():
    weights = tg.tensor([1.0, 3.0, 0.0, 4.0])
    draws = tg.multinomial(weights, 20000, replacement=True)
    assert draws.dtype == tg.int64 and draws.shape == (20000,)
    counts = np.bincount(draws.numpy(), minlength=4) / 20000
    np.testing.assert_allclose(counts, [0.125, 0.375, 0.0, 0.5], atol=0.015)


def test_multinomial_without_replacement_draws_distinct_categories_zero_weights_last():
    rows = tg.tensor([[1.0, 2.0, 3.0, 0.0], [0.0, 0.0, 5.0, 1.0]])
    out = tg.multinomial(rows, 3)
    assert out.shape == (2, 3)
    for row in out.numpy():
        assert len(set(row)) == 3
    assert out.numpy()[0, :3].tolist().count(3) == 0  # three non-zero categories come first
    assert sorted(out.numpy()[1, :2].tolist()) == [2, 3]
    # GPT sampling: the method form, one sample per row of probabilities.
    probs = tg.softmax(tg.randn(5, 7), dim=-1)
    assert probs.multinomial(num_samples=1).shape == (5, 1)


def test_multinomial_without_replacement_favours_heavy_categories():
    first = [tg.multinomial(tg.tensor([1.0, 9.0]), 2)[0].item() for _ in range(2000)]
    assert 0.85 < np.mean(first) < 0.95


@pytest.mark.parametrize("weights, count, replacement, message", [
    ([[[1.0]]], 1, False, "prob_dist must be 1 or 2 dim"),
    ([1.0, -1.0], 1, True, "element < 0"),
    ([1.0, float("nan")], 1, True, "`inf`, `nan`"),
    ([0.0, 0.0], 1, True, "sum of probabilities <= 0"),
    ([1.0, 2.0], 3, False, "cannot sample n_sample > prob_dist.size"),
])
def test_multinomial_errors(weights, count, replacement, message):
    with pytest.raises(RuntimeError, match=message):
        tg.multinomial(tg.tensor(weights), count, replacement)


def test_bernoulli_draws_ones_with_the_given_probabilities():
    p = tg.tensor([0.0, 0.25, 1.0]).expand(20000, 3)
    out = tg.bernoulli(p)
    assert out.dtype == tg.float32 and set(np.unique(out.numpy())) <= {0.0, 1.0}
    np.testing.assert_allclose(out.numpy().mean(0), [0.0, 0.25, 1.0], atol=0.015)
    assert tg.bernoulli(tg.zeros(4, dtype=tg.float64), p=1.0).dtype == tg.float64
    assert tg.bernoulli(tg.zeros(4), p=1.0).sum().item() == 4
    with pytest.raises(RuntimeError, match=r"\[0, 1\]"):
        tg.bernoulli(tg.tensor([1.5]))


def test_normal_broadcasts_tensor_means_and_stds_or_takes_a_size():
    out = tg.normal(tg.tensor([0.0, 10.0]).expand(20000, 2), tg.tensor([1.0, 0.1]))
    np.testing.assert_allclose(out.numpy().mean(0), [0.0, 10.0], atol=0.03)
    np.testing.assert_allclose(out.numpy().std(0), [1.0, 0.1], rtol=0.03)
    assert tg.normal(2.0, 3.0, size=(4, 5)).shape == (4, 5)
    assert tg.normal(0.0, tg.ones(3, dtype=tg.float64)).dtype == tg.float64
    with pytest.raises(RuntimeError, match="std >= 0.0"):
        tg.normal(tg.zeros(2), -1.0)


def test_poisson_has_its_rates_as_means():
    out = tg.poisson(tg.tensor([0.5, 4.0]).expand(20000, 2))
    np.testing.assert_allclose(out.numpy().mean(0), [0.5, 4.0], rtol=0.03)


@pytest.mark.parametrize("fill, args, mean, std", [
    ("normal_", (2.0, 0.5), 2.0, 0.5), ("uniform_", (-1.0, 3.0), 1.0, 4 / 12 ** 0.5),
    ("exponential_", (2.0,), 0.5, 0.5), ("log_normal_", (0.0, 0.25), np.exp(0.25 ** 2 / 2), None),
    ("bernoulli_", (0.3,), 0.3, None), ("geometric_", (0.5,), 2.0, None),
])
def test_in_place_fills_draw_from_their_distribution_and_return_self(fill, args, mean, std):
    t = tg.empty(40000, dtype=tg.float64)
    assert getattr(t, fill)(*args) is t
    assert t.numpy().mean() == pytest.approx(mean, rel=0.03, abs=0.01)
    if std is not None:
        assert t.numpy().std() == pytest.approx(std, rel=0.03)


def test_cauchy_median_and_random_integer_ranges():
    t = tg.empty(40000).cauchy_(median=3.0, sigma=0.5)
    assert np.median(t.numpy()) == pytest.approx(3.0, abs=0.03)
    r = tg.empty(1000).random_(2, 5)
    assert set(np.unique(r.numpy())) == {2.0, 3.0, 4.0}
    assert set(np.unique(tg.zeros(1000, dtype=tg.int64).random_(3).numpy())) == {0, 1, 2}
    assert tg.zeros(1000, dtype=tg.int64).random_().numpy().max() > 2 ** 40
    assert tg.empty(10).uniform_(**{"from": 5.0, "to": 6.0}).min().item() >= 5.0


def test_a_generator_makes_fills_reproducible():
    a = tg.empty(5).normal_(generator=tg.Generator().manual_seed(7))
    b = tg.empty(5).normal_(generator=tg.Generator().manual_seed(7))
    assert np.array_equal(a.numpy(), b.numpy())
    m = tg.multinomial(tg.ones(10), 4, generator=tg.Generator().manual_seed(3))
    assert np.array_equal(m.numpy(), tg.multinomial(tg.ones(10), 4, generator=tg.Generator().manual_seed(3)).numpy())


def test_in_place_fills_follow_the_in_place_rules():
    leaf = tg.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        leaf.normal_()
    assert np.array_equal(leaf.detach().numpy(), np.zeros(3))
    with tg.no_grad():
        leaf.uniform_(-0.1, 0.1)  # (nn.init's way: allowed under no_grad)
    assert np.abs(leaf.detach().numpy()).max() <= 0.1
    x = tg.ones(3, requires_grad=True)
    y = x * 2
    z = y * y  # saves y
    y.normal_()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()
    with pytest.raises(NotImplementedError, match='"normal_" not implemented for int64'):
        tg.zeros(3, dtype=tg.int64).normal_()
    with pytest.raises(RuntimeError, match="from=2.0 > to=1.0"):
        tg.empty(3).uniform_(2.0, 1.0)


def test_fills_inside_a_compiled_function_draw_anew_each_call():
    def init(w):
        with tg.no_grad():
            w.normal_()
        return w * 1

    compiled = tg.compile(init)
    w = tg.zeros(4)
    first, second = compiled(w).numpy().copy(), compiled(w).numpy().copy()
    assert not np.array_equal(first, second)


def test_shapes_dtypes_and_errors_match_pytorch():
    torch = pytest.importorskip("torch")
    for module in (tg, torch):
        probs = module.tensor([[0.2, 0.8], [0.5, 0.5]])
        assert tuple(module.multinomial(probs, 4, replacement=True).shape) == (2, 4)
        assert str(module.bernoulli(probs).dtype).endswith("float32")
        assert tuple(module.normal(0.0, 1.0, size=(2, 3)).shape) == (2, 3)
    with pytest.raises(RuntimeError, match="sum of probabilities <= 0"):
        torch.multinomial(torch.zeros(2), 1)
