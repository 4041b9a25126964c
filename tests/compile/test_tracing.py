"""@tg.compile: tracing, realization points, control flow, side effects, cache reuse."""

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F


def _branchy(x, w):
    y = (x * w).tanh().sum()
    if y > 0:
        return y * 2
    return -y


def test_data_dependent_branch_matches_eager_on_both_paths():
    compiled = tg.compile(_branchy)
    x, w = tg.randn(5, dtype=tg.float64), tg.randn(5, dtype=tg.float64)
    for sign in (1.0, -1.0, 1.0, -1.0):
        np.testing.assert_allclose(compiled(x * sign, w).item(), _branchy(x * sign, w).item(), rtol=1e-12)


def test_each_path_is_compiled_once():
    compiled = tg.compile(_branchy)
    x, w = tg.ones(4), tg.ones(4)
    for sign in (1.0, -1.0) * 3:
        compiled(x * sign, w)
    info = compiled.cache_info()
    # one realization graph for `y > 0`, one graph per branch
    assert info.graphs == 3
    assert info.misses == 3


def test_while_loop_on_tensor_value_matches_eager():
    def newton_sqrt(a):
        x = a
        while ((x * x - a).abs() > 1e-6).any_true():
            x = (x + a / x) * 0.5
        return x

    tg.Tensor.any_true = lambda self: bool(self.sum().item() > 0)
    compiled = tg.compile(newton_sqrt)
    a = tg.tensor([2.0, 9.0, 0.25], dtype=tg.float64)
    np.testing.assert_allclose(compiled(a).numpy(), np.sqrt([2.0, 9.0, 0.25]), rtol=1e-9)
    np.testing.assert_allclose(compiled(a).numpy(), newton_sqrt(a).numpy(), rtol=0)


def test_shape_change_recompiles_and_same_shape_hits():
    compiled = tg.compile(lambda x: (x * 2).exp().sum())
    compiled(tg.ones(3))
    compiled(tg.ones(3))
    compiled(tg.ones(4))
    info = compiled.cache_info()
    assert (info.hits, info.misses) == (1, 2)


def test_dtype_change_recompiles():
    compiled = tg.compile(lambda x: (x * 2).sum())
    compiled(tg.ones(3))
    compiled(tg.ones(3, dtype=tg.float64))
    assert compiled.cache_info().misses == 2


def test_python_scalar_is_a_runtime_argument_not_a_recompile():
    compiled = tg.compile(lambda x, s: (x * s).sum())
    assert compiled(tg.ones(3), 0.5).item() == 1.5
    assert compiled(tg.ones(3), 2.0).item() == 6.0
    assert compiled.cache_info().misses == 1


def test_rebound_global_tensor_is_read_fresh():
    state = {"w": tg.ones(3)}
    compiled = tg.compile(lambda x: (x * state["w"]).sum())
    assert compiled(tg.ones(3)).item() == 3.0
    state["w"] = tg.full((3,), 2.0)
    assert compiled(tg.ones(3)).item() == 6.0


def _mlp(seed):
    tg.manual_seed(seed)
    return tg.nn.Sequential(tg.nn.Linear(4, 8), tg.nn.ReLU(), tg.nn.Linear(8, 3))


def test_compiled_training_step_matches_eager_training():
    x, y = tg.randn(16, 4), tg.randint(0, 3, (16,))
    model_c, model_e = _mlp(1), _mlp(1)
    opt_c = tg.optim.SGD(model_c.parameters(), lr=0.1, momentum=0.9)
    opt_e = tg.optim.SGD(model_e.parameters(), lr=0.1, momentum=0.9)

    @tg.compile
    def step(inputs, labels):
        loss = F.cross_entropy(model_c(inputs), labels)
        opt_c.zero_grad()
        loss.backward()
        opt_c.step()
        return loss

    for _ in range(50):
        loss_c = step(x, y)
        loss_e = F.cross_entropy(model_e(x), y)
        opt_e.zero_grad()
        loss_e.backward()
        opt_e.step()
    np.testing.assert_allclose(loss_c.item(), loss_e.item(), rtol=1e-5)
    for p_c, p_e in zip(model_c.parameters(), model_e.parameters()):
        np.testing.assert_allclose(p_c.detach().numpy(), p_e.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(p_c.grad.numpy(), p_e.grad.numpy(), rtol=1e-5, atol=1e-6)
    assert step.cache_info().graphs == 2  # first step creates momentum buffers; later steps reuse


def test_compiled_forward_then_eager_backward_gives_eager_gradients():
    w = tg.randn(3, 3, dtype=tg.float64, requires_grad=True)
    x = tg.randn(3, dtype=tg.float64)
    forward = tg.compile(lambda inputs: (w @ inputs).tanh().sum())
    loss = forward(x)
    assert loss.grad_fn is not None
    loss.backward()
    expected = tg.autograd.grad((w @ x).tanh().sum(), w)[0]
    np.testing.assert_allclose(w.grad.numpy(), expected.numpy(), rtol=1e-12)


def test_item_inside_compiled_function_gives_the_value():
    seen = []

    @tg.compile
    def f(x):
        seen.append((x * 3).sum().item())
        return x + 1

    f(tg.ones(2))
    assert seen == [6.0]


def test_nested_compiled_function_inlines():
    inner = tg.compile(lambda x: x * 2)
    outer = tg.compile(lambda x: inner(x).sum())
    assert outer(tg.ones(3)).item() == 6.0
    assert inner.cache_info().misses == 0


@pytest.mark.parametrize("grad_mode", [True, False])
def test_compiled_call_inside_no_grad(grad_mode):
    w = tg.ones(3, requires_grad=True)
    f = tg.compile(lambda x: (x * w).sum())
    with tg.set_grad_enabled(grad_mode):
        out = f(tg.ones(3))
    assert out.requires_grad == grad_mode
    assert out.item() == 3.0


def test_in_place_update_of_an_argument_reaches_the_real_tensor():
    @tg.compile
    def bump(x):
        x.add_(1.0)
        return x * 2

    x = tg.zeros(3)
    out = bump(x)
    np.testing.assert_array_equal(x.numpy(), np.ones(3))
    np.testing.assert_array_equal(out.numpy(), 2 * np.ones(3))
    assert x._version == 1


def test_in_place_update_of_a_view_inside_compile_reaches_the_base():
    @tg.compile
    def bump_row(x):
        x[0].add_(1.0)
        return x

    x = tg.zeros(2, 3)
    result = bump_row(x)
    np.testing.assert_array_equal(x.numpy(), [[1.0] * 3, [0.0] * 3])
    np.testing.assert_array_equal(result.numpy(), x.numpy())


def test_printing_a_traced_tensor_shows_its_value(capsys):
    @tg.compile
    def show(x):
        print(x * 2)
        return x

    show(tg.tensor([1.0, 2.0]))
    assert "tensor([2., 4.])" in capsys.readouterr().out


def test_zero_grad_without_set_to_none_inside_compiled_step():
    model = _mlp(3)
    opt = tg.optim.SGD(model.parameters(), lr=0.1)
    x, y = tg.randn(8, 4), tg.randint(0, 3, (8,))
    F.cross_entropy(model(x), y).backward()

    @tg.compile
    def step(inputs, labels):
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(inputs), labels)
        loss.backward()
        return loss

    step(x, y)
    twin = _mlp(3)
    F.cross_entropy(twin(x), y).backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_autograd_grad_inside_compile_wrt_a_captured_tensor():
    w = tg.randn(3, 3, dtype=tg.float64, requires_grad=True)
    x = tg.randn(2, 3, dtype=tg.float64)
    compiled = tg.compile(lambda inputs: tg.autograd.grad((inputs @ w).tanh().sum(), [w])[0])
    expected = tg.autograd.grad((x @ w).tanh().sum(), [w])[0]
    np.testing.assert_allclose(compiled(x).numpy(), expected.numpy(), rtol=1e-12)
    assert w.grad is None


def test_loop_realizing_each_iteration_reuses_one_realization_graph():
    def halve_until_small(x):
        while (x.abs() > 1.0).any():
            x = x * 0.5
        return x

    compiled = tg.compile(halve_until_small)
    out = compiled(tg.tensor([100.0, -3.0]))
    np.testing.assert_allclose(out.numpy(), halve_until_small(tg.tensor([100.0, -3.0])).numpy())
    info = compiled.cache_info()
    # one graph for the first test, one for each later test (same structure every
    # iteration), one for the result: never one graph per iteration
    assert info.graphs <= 3
    assert info.hits >= 4


def test_any_and_all_compile_to_bool_reductions():
    x = tg.tensor([[0.0, 2.0], [0.0, 0.0]])
    compiled = tg.compile(lambda t: (t.any(dim=1), t.all(dim=0), (t > 1).any()))
    got = [r.numpy() for r in compiled(x)]
    np.testing.assert_array_equal(got[0], [True, False])
    np.testing.assert_array_equal(got[1], [False, False])
    assert bool(got[2]) is True


def test_view_taken_before_an_in_place_update_of_its_base_reads_the_update_when_compiled():
    def reads_view(p):
        view = p.reshape(6)
        p.mul_(2.0)
        return view.sum()

    assert tg.compile(reads_view)(tg.ones(2, 3)).item() == reads_view(tg.ones(2, 3)).item() == 12.0


def test_view_in_a_graph_taken_before_an_in_place_update_of_its_base_is_regenerated_as_in_eager():
    def regenerated(w):
        y = w * 1.0
        view = y.reshape(6)
        y.mul_(w)  # (with grad: the view reads y's new history, w * w)
        view.sum().backward()
        return w.grad

    expected = regenerated(tg.arange(6.0).reshape(2, 3).requires_grad_())
    np.testing.assert_array_equal(expected.numpy(), 2 * np.arange(6.0).reshape(2, 3))
    compiled = tg.compile(regenerated)
    for _ in range(3):
        got = compiled(tg.arange(6.0).reshape(2, 3).requires_grad_())
        np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_identical_graphs_share_one_compiled_kernel():
    first = tg.compile(lambda x: (x * 3.0).exp())
    second = tg.compile(lambda x: (x * 3.0).exp())
    first(tg.ones(5))
    second(tg.ones(5))
    symbols = [[s.symbol for s in p.steps if hasattr(s, "symbol")]
               for p in (next(iter(f._programs.values())) for f in (first, second))]
    assert symbols[0] == symbols[1] and symbols[0]


def test_grad_of_a_compiled_result_with_respect_to_its_arguments_outside_the_call():
    # The result's graph reads each argument through an input of the compiled graph; the
    # gradient w.r.t. the argument itself is what reaches that input.
    rng = np.random.default_rng(0)
    x = tg.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    w = tg.tensor(rng.standard_normal((2, 4)), requires_grad=True)
    unused = tg.tensor(rng.standard_normal((2, 4)), requires_grad=True)  # w's shape, not read
    forward = tg.compile(lambda x, w: (x @ w.T).tanh().sum())
    expected = tg.autograd.grad((x @ w.T).tanh().sum(), [x, w])
    for _ in range(4):  # (the eager backward cache keys repeated structures)
        out = forward(x, w)
        got = tg.autograd.grad(out, [x, w], retain_graph=True)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-12)
        (gw,) = tg.autograd.grad(out, [w], retain_graph=True)  # one target of unused's type
        np.testing.assert_allclose(gw.numpy(), expected[1].numpy(), rtol=1e-12)
        with pytest.raises(RuntimeError, match="appears to not have been used in the graph"):
            tg.autograd.grad(out, [unused], retain_graph=True)
        (zeros,) = tg.autograd.grad(out, [unused], allow_unused=True, materialize_grads=True)
        np.testing.assert_array_equal(zeros.numpy(), np.zeros((2, 4)))


def test_grad_through_a_compiled_result_and_an_eager_use_of_one_argument_sums_both():
    x = tg.tensor([0.5, -1.0, 2.0], requires_grad=True)
    forward = tg.compile(lambda x: (x * x).sum())
    (g,) = tg.autograd.grad(forward(x) + (3.0 * x).sum(), [x])
    np.testing.assert_allclose(g.numpy(), 2 * x.detach().numpy() + 3.0, rtol=1e-12)


def test_compiled_function_passes_gradcheck_through_its_arguments():
    rng = np.random.default_rng(1)
    inputs = [tg.tensor(rng.standard_normal(s), requires_grad=True) for s in [(3, 5), (4, 5), (4,)]]
    forward = tg.compile(lambda x, w, b: ((x @ w.T) + b).sigmoid().sum())
    assert tg.autograd.gradcheck(forward, inputs)


def test_a_realization_leaves_out_the_loop_steps_whose_results_were_dropped():
    # (each step's matmul saves its input: only those saved tensors kept the outputs of the
    # steps before the last, which no backward can reach)
    torch_nn = tg.nn
    layer = torch_nn.Linear(5, 3)

    def step(x, y):
        for i in range(4):
            out = layer(x[i]).log_softmax(1)
        loss = torch_nn.functional.nll_loss(out, y)
        loss.backward()
        return loss.item()

    x, y = tg.randn(4, 1, 5), tg.tensor([2])
    report = tg.compile(step).explain(x, y)
    realization = report.graphs[0]
    assert [node.op.name for node in realization.optimized.nodes].count("matmul") == 2  # (forward, weight grad)
    compiled = tg.compile(step)
    for _ in range(3):
        layer.zero_grad()
        want = step(x, y)
        want_grad = layer.weight.grad.numpy().copy()
        layer.zero_grad()
        assert compiled(x, y) == pytest.approx(want, rel=1e-6)
        np.testing.assert_allclose(layer.weight.grad.numpy(), want_grad, rtol=1e-6)
