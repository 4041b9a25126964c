"""Side effects of compiled functions: optimizer updates, .grad fields, parameters read by
identity, Python scalars as runtime arguments, graphs kept for a later eager backward."""

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F


class MLP(tg.nn.Module):
    def __init__(self, seed):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.fc = tg.nn.Linear(4, 8)
        self.out = tg.nn.Linear(8, 3)
        for layer in (self.fc, self.out):  # float64 parameters, so results compare tightly
            layer.weight = tg.nn.Parameter(tg.from_numpy(rng.uniform(-0.5, 0.5, layer.weight.shape)))
            layer.bias = tg.nn.Parameter(tg.from_numpy(rng.uniform(-0.5, 0.5, layer.bias.shape)))

    def forward(self, x):
        return self.out(self.fc(x).tanh())


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return tg.from_numpy(rng.normal(size=(16, 4))), tg.from_numpy(rng.integers(0, 3, 16))


def _train_step(model, opt):
    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    return step


def _sgd(model, lr=0.1):
    return tg.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=0.01)


def _params(model):
    return [p.detach().numpy().copy() for p in model.parameters()]


def _assert_all_close(actual, expected, rtol=1e-10, atol=1e-12):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)


def test_50_sgd_momentum_weight_decay_steps_end_with_eager_parameters():
    x, y = _data()
    model_c, model_e = MLP(1), MLP(1)
    step_c = tg.compile(_train_step(model_c, _sgd(model_c)))
    step_e = _train_step(model_e, _sgd(model_e))
    for _ in range(50):
        step_c(x, y)
        step_e(x, y)
    _assert_all_close(_params(model_c), _params(model_e), rtol=1e-9)
    assert _params(model_c)[0].dtype == np.float64


def test_several_steps_in_one_compiled_call_end_with_eager_parameters():
    # The second step's forward reads parameters the first step updated under no_grad: its
    # gradients must reach their .grad and its rules must read the updated values.
    x, y = _data()
    model_c, model_e = MLP(1), MLP(1)
    step_c, step_e = _train_step(model_c, _sgd(model_c)), _train_step(model_e, _sgd(model_e))

    def three_steps(step):
        return [step(x, y) for _ in range(3)]

    compiled = tg.compile(lambda: three_steps(step_c))
    for _ in range(3):
        losses_c, losses_e = compiled(), three_steps(step_e)
        np.testing.assert_allclose([t.item() for t in losses_c], [t.item() for t in losses_e], rtol=1e-10)
    _assert_all_close(_params(model_c), _params(model_e), rtol=1e-9)
    # The first call creates the momentum buffers; later calls repeat the second's graph.
    assert (compiled.cache_info().misses, compiled.cache_info().hits) == (2, 1)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_gradient_reads_a_tensor_updated_earlier_in_the_call(requires_grad):
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    w_c, w_e = (tg.tensor([3.0, 4.0], requires_grad=requires_grad) for _ in range(2))

    def fn(x, w):
        with tg.no_grad():
            w.mul_(10)
        loss = (x * w).sum()
        return tg.autograd.grad(loss, [x])[0]

    np.testing.assert_array_equal(tg.compile(lambda x: fn(x, w_c))(x).numpy(), fn(x, w_e).numpy())
    np.testing.assert_array_equal(w_c.detach().numpy(), [30.0, 40.0])


def test_backward_after_an_update_of_an_argument_leaf_reaches_its_grad():
    def fn(w):
        with tg.no_grad():
            w.sub_(1.0)
        (w * w).sum().backward()

    w_c, w_e = (tg.tensor([3.0, 4.0], requires_grad=True) for _ in range(2))
    tg.compile(fn)(w_c)
    fn(w_e)
    np.testing.assert_array_equal(w_c.grad.numpy(), w_e.grad.numpy())
    np.testing.assert_array_equal(w_c.grad.numpy(), [4.0, 6.0])


def test_compiled_training_reuses_the_cached_step():
    x, y = _data()
    model = MLP(1)
    step = tg.compile(_train_step(model, _sgd(model)))
    for _ in range(5):
        step(x, y)
    # the first step creates the momentum buffers; every later step is the same graph
    assert step.cache_info().misses == 2


def test_momentum_buffers_after_compiled_steps_equal_eager():
    x, y = _data()
    model_c, model_e = MLP(1), MLP(1)
    opt_c, opt_e = _sgd(model_c), _sgd(model_e)
    step_c, step_e = tg.compile(_train_step(model_c, opt_c)), _train_step(model_e, opt_e)
    for _ in range(3):
        step_c(x, y)
        step_e(x, y)
    buffers_c = [opt_c.state[p]["momentum_buffer"].numpy() for p in model_c.parameters()]
    buffers_e = [opt_e.state[p]["momentum_buffer"].numpy() for p in model_e.parameters()]
    _assert_all_close(buffers_c, buffers_e)


def test_leaf_grads_after_compiled_backward_equal_eager():
    x, y = _data()
    x.requires_grad_()
    model = MLP(2)

    def backward(x, y):
        F.cross_entropy(model(x), y).backward()

    backward(x, y)
    expected = [x.grad.numpy().copy()] + [p.grad.numpy().copy() for p in model.parameters()]
    x.grad = None
    for p in model.parameters():
        p.grad = None
    tg.compile(backward)(x, y)
    _assert_all_close([x.grad.numpy()] + [p.grad.numpy() for p in model.parameters()], expected)


def test_grads_are_real_tensors_without_grad_fn_after_compiled_backward():
    x, y = _data()
    model = MLP(2)
    tg.compile(lambda x, y: F.cross_entropy(model(x), y).backward())(x, y)
    for p in model.parameters():
        assert p.grad.grad_fn is None
        assert p.grad.shape == p.shape
        assert isinstance(p.grad.numpy(), np.ndarray)


def test_changing_learning_rate_does_not_recompile():
    x, y = _data()
    model = MLP(1)
    opt = _sgd(model)
    step = tg.compile(_train_step(model, opt))
    step(x, y)
    step(x, y)
    misses = step.cache_info().misses
    for lr in (0.05, 0.01, 0.2):
        opt.param_groups[0]["lr"] = lr
        step(x, y)
    assert step.cache_info().misses == misses


def test_changed_learning_rate_is_used():
    x, y = _data()
    model_c, model_e = MLP(1), MLP(1)
    opt_c, opt_e = _sgd(model_c), _sgd(model_e)
    step_c, step_e = tg.compile(_train_step(model_c, opt_c)), _train_step(model_e, opt_e)
    for lr in (0.1, 0.1, 0.5, 0.02):
        opt_c.param_groups[0]["lr"] = opt_e.param_groups[0]["lr"] = lr
        step_c(x, y)
        step_e(x, y)
    _assert_all_close(_params(model_c), _params(model_e))


def test_replaced_parameter_is_read_by_compiled_function():
    x, _ = _data()
    model = MLP(3)
    forward = tg.compile(lambda x: model(x))
    forward(x)
    model.fc.weight = tg.nn.Parameter(tg.from_numpy(np.full((8, 4), 0.25)))
    np.testing.assert_allclose(forward(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-12)


def test_replaced_parameter_is_read_by_compiled_module():
    x, _ = _data()
    model = MLP(3)
    compiled = tg.compile(model)
    compiled(x)
    compiled.fc.weight = tg.nn.Parameter(tg.from_numpy(np.full((8, 4), -0.5)))
    assert model.fc.weight is compiled.fc.weight
    np.testing.assert_allclose(compiled(x).detach().numpy(), model(x).detach().numpy(), rtol=1e-12)


def test_replaced_parameter_is_trained_by_compiled_step():
    x, y = _data()
    model = MLP(3)
    step = tg.compile(_train_step(model, tg.optim.SGD(model.parameters(), lr=0.1)))
    step(x, y)
    new = tg.nn.Parameter(tg.from_numpy(np.full((8, 4), 0.25)))
    model.fc.weight = new
    opt = tg.optim.SGD(model.parameters(), lr=0.1)
    step = tg.compile(_train_step(model, opt))
    step(x, y)
    assert new.grad is not None
    assert not np.allclose(new.detach().numpy(), 0.25)


def test_forward_only_result_has_grad_fn_and_eager_backward_gives_eager_grads():
    x, _ = _data()
    x.requires_grad_()
    model = MLP(4)
    forward = tg.compile(lambda x: (model(x) ** 2).sum())
    out = forward(x)
    assert out.grad_fn is not None
    out.backward()
    compiled_grads = [x.grad.numpy().copy()] + [p.grad.numpy().copy() for p in model.parameters()]
    expected = tg.autograd.grad((model(x) ** 2).sum(), [x] + list(model.parameters()))
    _assert_all_close(compiled_grads, [g.numpy() for g in expected])


def test_forward_only_result_backward_twice_with_retain_graph_accumulates():
    w = tg.from_numpy(np.array([0.5, -1.0, 2.0])).requires_grad_()
    out = tg.compile(lambda x: (x * w).exp().sum())(tg.from_numpy(np.array([1.0, 2.0, 3.0])))
    out.backward(retain_graph=True)
    out.backward()
    expected = 2 * np.array([1.0, 2.0, 3.0]) * np.exp(np.array([0.5, -2.0, 6.0]))
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-12)


def test_in_place_update_of_an_argument_is_written_back():
    x = tg.from_numpy(np.array([1.0, 2.0, 3.0]))

    @tg.compile
    def bump(t):
        t.mul_(2).add_(1)
        return t.sum()

    total = bump(x)
    np.testing.assert_array_equal(x.numpy(), [3.0, 5.0, 7.0])
    assert total.item() == 15.0


def test_in_place_update_is_visible_to_views_of_the_argument():
    base = tg.from_numpy(np.arange(6.0).reshape(2, 3))
    row = base[1]
    tg.compile(lambda t: t.add_(10))(base)
    np.testing.assert_array_equal(row.numpy(), [13.0, 14.0, 15.0])


def test_in_place_update_through_a_view_of_an_argument_is_written_back():
    def f(t):
        t[0].add_(10)
        return t.sum()

    x_c, x_e = (tg.from_numpy(np.arange(6.0).reshape(2, 3)) for _ in range(2))
    total = tg.compile(f)(x_c)
    expected = f(x_e)
    np.testing.assert_array_equal(x_c.numpy(), x_e.numpy())
    assert total.item() == expected.item()


def test_in_place_update_through_a_view_of_a_captured_tensor_is_written_back():
    state = tg.from_numpy(np.arange(3.0))

    @tg.compile
    def f(t):
        state[1:].mul_(2)
        return (t * state).sum()

    total = f(tg.from_numpy(np.ones(3)))
    np.testing.assert_array_equal(state.numpy(), [0.0, 2.0, 4.0])
    assert total.item() == 6.0


def test_in_place_update_of_a_captured_tensor_is_written_back():
    state = tg.from_numpy(np.arange(3.0))

    @tg.compile
    def f(t):
        state.mul_(2)
        return (t * state).sum()

    total = f(tg.from_numpy(np.ones(3)))
    np.testing.assert_array_equal(state.numpy(), [0.0, 2.0, 4.0])
    assert total.item() == 6.0


def test_returning_an_argument_unchanged_returns_its_values():
    x = tg.from_numpy(np.array([1.0, 2.0]))
    out = tg.compile(lambda t: t)(x)
    np.testing.assert_array_equal(out.numpy(), [1.0, 2.0])


def test_no_grad_fn_kept_when_no_input_requires_grad():
    out = tg.compile(lambda t: (t * 2).exp().sum())(tg.from_numpy(np.ones(3)))
    assert out.grad_fn is None
    assert not out.requires_grad


def test_same_tensor_passed_twice_matches_eager():
    def f(a, b):
        return a * b + a

    x = tg.from_numpy(np.arange(3.0))
    np.testing.assert_array_equal(tg.compile(f)(x, x).numpy(), f(x, x).numpy())


def test_in_place_update_of_a_tensor_passed_twice_is_seen_through_both_names():
    def f(a, b):
        a.add_(b)
        return b.sum()

    x_c, x_e = tg.from_numpy(np.arange(3.0)), tg.from_numpy(np.arange(3.0))
    assert tg.compile(f)(x_c, x_c).item() == f(x_e, x_e).item()
    np.testing.assert_array_equal(x_c.numpy(), x_e.numpy())


def test_backward_through_a_leaf_passed_twice_accumulates_both_uses():
    def f(a, b):
        (a * b.exp()).sum().backward()

    x_c = tg.from_numpy(np.arange(3.0)).requires_grad_()
    x_e = tg.from_numpy(np.arange(3.0)).requires_grad_()
    tg.compile(f)(x_c, x_c)
    f(x_e, x_e)
    np.testing.assert_allclose(x_c.grad.numpy(), x_e.grad.numpy(), rtol=1e-12)


def test_in_place_update_of_an_argument_is_seen_through_an_aliasing_argument():
    def f(a, b):
        a.mul_(2)
        return b.sum(0)

    x_c = tg.from_numpy(np.arange(6.0).reshape(2, 3))
    x_e = tg.from_numpy(np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(tg.compile(f)(x_c, x_c.T).numpy(), f(x_e, x_e.T).numpy())


def test_tensor_keyword_argument_is_an_input():
    f = tg.compile(lambda x, *, scale: (x * scale).sum())
    x = tg.from_numpy(np.ones(3))
    assert f(x, scale=tg.from_numpy(np.full(3, 2.0))).item() == 6.0
    assert f(x, scale=tg.from_numpy(np.full(3, 3.0))).item() == 9.0
    assert f.cache_info().misses == 1


def test_an_in_place_update_of_a_saved_traced_tensor_raises_as_in_eager():
    # The backward would read the value from before the update (traced values do not
    # change), but eager refuses it, and so must the compiled function.
    def fn(x):
        y = x.exp()
        z = (y * y).sum()
        y.add_(1.0)
        return tg.autograd.grad(z, [x])[0]

    x = tg.tensor([0.5, 1.0], dtype=tg.float64, requires_grad=True)
    with pytest.raises(RuntimeError) as eager:
        fn(x)
    with pytest.raises(RuntimeError) as compiled:
        tg.compile(fn)(x)
    assert "modified by an inplace operation" in str(eager.value)
    assert str(compiled.value) == str(eager.value)


def test_grad_of_a_tensor_passed_as_argument_reads_and_writes_the_real_tensors_grad():
    # Inside the trace an argument is a stand-in; its .grad is the real tensor's, as in eager.
    def step(params, x):
        loss = ((x @ params[0]).tanh() * params[1]).sum()
        loss.backward()
        seen = [p.grad is not None for p in params]
        with tg.no_grad():
            for p in params:
                p -= 0.1 * p.grad
                p.grad = None
        return loss.detach(), seen

    rng = np.random.default_rng(2)
    data = [rng.standard_normal((4, 3)), rng.standard_normal(3)]
    params = [tg.tensor(d, requires_grad=True) for d in data]
    twins = [tg.tensor(d, requires_grad=True) for d in data]
    x = tg.tensor(rng.standard_normal((2, 4)))
    compiled = tg.compile(step)
    for _ in range(3):
        (loss, seen), (want, want_seen) = compiled(params, x), step(twins, x)
        assert seen == want_seen == [True, True]
        assert loss.item() == pytest.approx(want.item(), rel=1e-12)
        for p, t in zip(params, twins):
            np.testing.assert_allclose(p.detach().numpy(), t.detach().numpy(), rtol=1e-12)
            assert p.grad is None and t.grad is None


def test_a_leaf_copied_from_a_traced_tensor_under_no_grad_keeps_both_gradients_apart():
    # The value standing for the updated leaf must be one no other op reads: gradients
    # reaching it go to w.grad, while t's go on to s.
    def fn(w, s):
        t = s * 2.0
        with tg.no_grad():
            w.copy_(t)
            w.add_(1.0)
        ((w * 3.0).sum() + (t * t).sum()).backward()

    results = []
    for compiled in (False, True):
        w = tg.tensor([1.0, 2.0], requires_grad=True)
        s = tg.tensor([0.5, -1.5], requires_grad=True)
        (tg.compile(fn) if compiled else fn)(w, s)
        results.append((w.detach().numpy(), w.grad.numpy(), s.grad.numpy()))
    for got, want in zip(results[1], results[0]):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(results[0][1], [3.0, 3.0])
    np.testing.assert_array_equal(results[0][2], [4.0, -12.0])

