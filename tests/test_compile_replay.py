"""A compiled call following the previous call's trace (tracegrad/jit/replay.py):
same results, gradients, errors and side effects as a full trace, and it diverges into a
full trace wherever the call does something else."""

import threading

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.jit import replay as compile_replay


def _followed(compiled, *args, **kwargs):
    """Call `compiled`; its result and whether the call followed a recording to the end."""
    result, trace = compiled._traced_call(args, kwargs)
    return result, trace.replay is not None


def _chain(x, w, scale):
    y = (x * w + scale).tanh()
    return (y * y).sigmoid().sum()


def _eager_grads(x, w, scale):
    x = tg.tensor(x.detach().numpy(), requires_grad=True)
    w = tg.tensor(w.detach().numpy(), requires_grad=True)
    loss = _chain(x, w, scale)
    gx, gw = tg.autograd.grad(loss, [x, w])
    return loss.detach().numpy(), gx.numpy(), gw.numpy()


def test_repeated_calls_follow_the_recording_with_each_calls_data():
    def fn(x, w, scale):
        loss = _chain(x, w, scale)
        return (loss, *tg.autograd.grad(loss, [x, w]))

    compiled = tg.compile(fn)
    rng = np.random.default_rng(0)
    followed = []
    for i in range(4):
        x = tg.tensor(rng.standard_normal(5), requires_grad=True)
        w = tg.tensor(rng.standard_normal(5), requires_grad=True)
        scale = 0.5 + i  # a Python scalar: a captured input, its value read on every call
        (loss, gx, gw), replayed = _followed(compiled, x, w, scale)
        followed.append(replayed)
        want = _eager_grads(x, w, scale)
        for got, expected in zip((loss.detach().numpy(), gx.numpy(), gw.numpy()), want):
            np.testing.assert_allclose(got, expected, rtol=1e-12)
        assert gx.grad_fn is None and not gx.requires_grad
        del loss, gx, gw  # (a loss kept alive would make the next call trace afresh)
    assert followed == [False, True, True, True]
    assert compiled.cache_info().misses == 1


def test_the_replay_is_switched_off_by_its_flag(monkeypatch):
    monkeypatch.setattr(compile_replay, "ENABLED", False)
    compiled = tg.compile(lambda x: (x * 2).sum())
    x = tg.ones(3)
    assert [_followed(compiled, x)[1] for _ in range(3)] == [False, False, False]


def test_control_flow_diverges_where_the_paths_part():
    def fn(x, flag):
        y = x.sin() * 2.0
        y = y.exp() if flag else y.cos()
        return tg.autograd.grad(y.sum(), [x])[0]

    compiled = tg.compile(fn)
    x = tg.tensor([0.1, -0.7, 1.3], dtype=tg.float64, requires_grad=True)
    for flag in [True, True, False, True, False, False, True]:
        got, _ = _followed(compiled, x, flag)
        np.testing.assert_allclose(got.numpy(), fn(x, flag).numpy(), rtol=1e-12)
    assert compiled.cache_info().graphs == 2


def test_a_call_doing_less_or_more_than_the_recorded_one():
    def fn(x, n):
        y = x
        for _ in range(n):
            y = (y * 0.9).sin()
        return y.sum()

    compiled = tg.compile(fn)
    x = tg.tensor([0.3, 0.4], dtype=tg.float64)
    for n in [3, 3, 1, 4, 4, 2]:
        np.testing.assert_allclose(compiled(x, n).numpy(), fn(x, n).numpy(), rtol=1e-12)


def test_a_result_kept_from_an_earlier_call_keeps_its_own_graph():
    # Results with a grad_fn reference the recorded nodes: the next call must not reuse
    # them (it traces afresh), so each result's backward sees its own call's values.
    w = tg.tensor([0.5, -1.5, 2.0], dtype=tg.float64, requires_grad=True)
    compiled = tg.compile(lambda x: (x * w).sin().sum())
    xs = [tg.tensor(np.full(3, v), dtype=tg.float64) for v in (0.1, 0.2, 0.3, 0.4)]
    losses = [compiled(x) for x in xs]
    for x, loss in zip(xs, losses):
        w.grad = None
        loss.backward()
        np.testing.assert_allclose(w.grad.numpy(), x.numpy() * np.cos(x.numpy() * w.detach().numpy()),
                                   rtol=1e-12)


def test_a_result_dropped_before_the_next_call_lets_it_follow():
    # Until its backward frees them, the graph's saved tensors (traced tensors with a
    # grad_fn) count as references to its nodes too.
    w = tg.tensor([0.5, -1.5], dtype=tg.float64, requires_grad=True)
    compiled = tg.compile(lambda x: (x * w).sin().sum())
    x = tg.tensor([0.1, 0.2], dtype=tg.float64)
    first, _ = _followed(compiled, x)
    first.backward()
    del first
    w.grad = None
    loss, replayed = _followed(compiled, x)
    assert replayed
    loss.backward()
    np.testing.assert_allclose(w.grad.numpy(), x.numpy() * np.cos(x.numpy() * w.detach().numpy()), rtol=1e-12)


def test_a_backward_after_the_replayed_one_still_refuses_freed_saved_tensors():
    def fn(x, twice):
        loss = (x * x).sin().sum()
        g = tg.autograd.grad(loss, [x])[0]
        if twice:
            tg.autograd.grad(loss, [x])
        return g

    compiled = tg.compile(fn)
    x = tg.ones(2, requires_grad=True)
    compiled(x, False)
    compiled(x, False)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        compiled(x, True)
    np.testing.assert_allclose(compiled(x, False).numpy(), 2 * np.cos(1.0) * np.ones(2), rtol=1e-6)


def test_the_replayed_backward_checks_the_version_of_a_concrete_saved_input():
    w = tg.tensor([2.0, 3.0])
    bump = []

    def fn(x):
        loss = (x * w).sum()
        if bump:
            w._version_counter.value += 1  # a change the trace does not see
        return tg.autograd.grad(loss, [x])[0]

    compiled = tg.compile(fn)
    x = tg.ones(2, requires_grad=True)
    compiled(x)
    assert _followed(compiled, x)[1]
    bump.append(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        compiled(x)


def test_hooks_put_in_one_call_do_not_stay_on_the_recorded_nodes():
    seen = []

    def fn(x, hook):
        y = x.exp()
        if hook:
            y.register_hook(lambda g: seen.append(1) or g * 2)
        return tg.autograd.grad(y.sum(), [x])[0]

    compiled = tg.compile(fn)
    x = tg.tensor([0.0, 1.0], dtype=tg.float64, requires_grad=True)
    for hook in [False, True, False, False, True]:
        got = compiled(x, hook)
        np.testing.assert_allclose(got.numpy(), np.exp([0.0, 1.0]) * (2 if hook else 1), rtol=1e-12)
    assert len(seen) == 2


def test_a_value_python_needs_and_in_place_updates_diverge_and_stay_correct():
    rng = np.random.default_rng(1)
    data = [rng.standard_normal((4, 3)), rng.standard_normal(3)]
    x = tg.tensor(rng.standard_normal((2, 4)))

    def make_step(params):
        def step():
            loss = ((x @ params[0]).tanh() * params[1]).sum()
            loss.backward()
            with tg.no_grad():
                for p in params:
                    p -= 0.1 * p.grad
                    p.grad = None
            return loss.item()
        return step

    params = [tg.tensor(d, requires_grad=True) for d in data]
    twins = [tg.tensor(d, requires_grad=True) for d in data]
    compiled, eager = tg.compile(make_step(params)), make_step(twins)
    for _ in range(4):
        assert compiled() == pytest.approx(eager(), rel=1e-12)
        for p, t in zip(params, twins):
            np.testing.assert_allclose(p.detach().numpy(), t.detach().numpy(), rtol=1e-12)


def test_a_changed_requires_grad_or_grad_mode_diverges():
    w = tg.tensor([1.0, 2.0], dtype=tg.float64)

    def fn(x):
        return (x * w).exp().sum()

    compiled = tg.compile(fn)
    x = tg.tensor([0.5, 0.25], dtype=tg.float64, requires_grad=True)
    compiled(x)
    compiled(x)
    w.requires_grad_(True)
    loss = compiled(x)
    loss.backward()
    np.testing.assert_allclose(w.grad.numpy(), x.detach().numpy() * np.exp(x.detach().numpy() * [1, 2]),
                               rtol=1e-12)
    with tg.no_grad():
        assert compiled(x).grad_fn is None


def test_changed_attributes_and_shapes_diverge():
    compiled = tg.compile(lambda x, axis: (x * 2.0).sum(axis))
    for shape, axis in [((2, 3), 0), ((2, 3), 0), ((2, 3), 1), ((3, 3), 1), ((3, 3), 1)]:
        x = tg.tensor(np.arange(np.prod(shape), dtype=np.float64).reshape(shape))
        np.testing.assert_allclose(compiled(x, axis).numpy(), 2 * x.numpy().sum(axis), rtol=1e-12)


def test_an_error_in_a_followed_call_leaves_later_calls_correct():
    def fn(x, fail):
        y = x.sin()
        if fail:
            raise ValueError("boom")
        return tg.autograd.grad(y.sum(), [x])[0]

    compiled = tg.compile(fn)
    x = tg.tensor([0.2, 0.4], dtype=tg.float64, requires_grad=True)
    compiled(x, False)
    compiled(x, False)
    with pytest.raises(ValueError, match="boom"):
        compiled(x, True)
    np.testing.assert_allclose(compiled(x, False).numpy(), np.cos([0.2, 0.4]), rtol=1e-12)


def test_threads_calling_one_compiled_function_get_their_own_results():
    def fn(x):
        loss = (x * x).sin().sum()
        return tg.autograd.grad(loss, [x])[0]

    compiled = tg.compile(fn)
    errors = []

    def worker(seed):
        try:
            rng = np.random.default_rng(seed)
            for _ in range(30):
                x = tg.tensor(rng.standard_normal(8), dtype=tg.float64, requires_grad=True)
                want = 2 * x.detach().numpy() * np.cos(x.detach().numpy() ** 2)
                np.testing.assert_allclose(compiled(x).numpy(), want, rtol=1e-12)
        except Exception as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_an_error_from_the_shape_rule_is_still_raised_when_shapes_change():
    compiled = tg.compile(lambda a, b: (a + b).sum())
    compiled(tg.ones(3), tg.ones(3))
    compiled(tg.ones(3), tg.ones(3))
    with pytest.raises(Exception, match="add"):
        compiled(tg.ones(3), tg.ones(4))


def test_an_in_place_update_of_a_saved_tensor_is_caught_in_a_followed_call():
    # The replay makes saved tensors late (jit.replay.Replay.save), with the versions
    # their tensors had when the op ran: the update after it must still be seen.
    def fn(x, update):
        y = x.exp()
        z = (y * y).sum()
        if update:
            y.add_(1.0)
        return tg.autograd.grad(z, [x])[0]

    compiled = tg.compile(fn)
    x = tg.tensor([0.5, 1.0], dtype=tg.float64, requires_grad=True)
    compiled(x, False)
    assert _followed(compiled, x, False)[1]
    for _ in range(2):
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            compiled(x, True)
    np.testing.assert_allclose(compiled(x, False).numpy(), 2 * np.exp(2 * np.array([0.5, 1.0])), rtol=1e-12)


@pytest.mark.parametrize("make_optimizer", [lambda p: tg.optim.SGD(p, lr=0.1, momentum=0.9),
                                            lambda p: tg.optim.Adam(p, lr=0.05)])
def test_a_training_step_with_optimizer_updates_is_followed_to_the_end(make_optimizer):
    def make(seed):
        tg.manual_seed(seed)
        model = tg.nn.Sequential(tg.nn.Linear(3, 5), tg.nn.Tanh(), tg.nn.Linear(5, 2))
        for p in model.parameters():
            p.data = p.detach().to(tg.float64)
        return model, make_optimizer(model.parameters())

    model, opt = make(0)
    twin, twin_opt = make(0)
    rng = np.random.default_rng(3)

    def step(m, o, x, y):
        loss = ((m(x) - y) ** 2).mean()
        o.zero_grad()
        loss.backward()
        o.step()
        return loss.detach()

    compiled = tg.compile(lambda x, y: step(model, opt, x, y))
    followed = []
    for _ in range(5):
        x, y = (tg.tensor(rng.standard_normal(s)) for s in ((4, 3), (4, 2)))
        loss, replayed = _followed(compiled, x, y)
        followed.append(replayed)
        assert loss.item() == pytest.approx(step(twin, twin_opt, x, y).item(), rel=1e-12)
        for p, q in zip(model.parameters(), twin.parameters()):
            np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert followed[2:] == [True, True, True]  # (the second step may differ: momentum buffers appear)


def test_custom_functions_double_backward_and_explicit_seeds_in_followed_calls():
    class Cube(tg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return 3 * x * x * grad

    def fn(x, seed):
        y = Cube.apply(x.sin())
        (g,) = tg.autograd.grad(y, [x], grad_outputs=[seed], create_graph=True)
        (h,) = tg.autograd.grad(g.sum(), [x])
        return g.detach(), h

    compiled = tg.compile(fn)
    for i in range(4):
        x = tg.tensor([0.3, -0.8, 1.1], dtype=tg.float64, requires_grad=True)
        seed = tg.tensor([1.0, 2.0, 0.5 + i], dtype=tg.float64)
        want = fn(x, seed)
        got = compiled(x, seed)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-12)


def test_keyword_arguments_nested_compiled_functions_and_module_modes():
    tg.manual_seed(0)
    model = tg.nn.Sequential(tg.nn.Linear(4, 6), tg.nn.Dropout(0.5), tg.nn.Linear(6, 1))
    inner = tg.compile(lambda h, scale=1.0: (h * scale).tanh())

    def fn(x, *, scale):
        return inner(model(x), scale=scale).sum()

    compiled = tg.compile(fn)
    x = tg.tensor(np.random.default_rng(0).standard_normal((3, 4)))
    model.eval()
    for scale in (1.0, 1.0, 2.0, 2.0):
        np.testing.assert_allclose(compiled(x, scale=scale).item(), fn(x, scale=scale).item(), rtol=1e-6)
    model.train()  # dropout: a random mask per call, so results differ from call to call
    first, second = compiled(x, scale=1.0).item(), compiled(x, scale=1.0).item()
    assert np.isfinite(first) and np.isfinite(second)
    model.eval()
    np.testing.assert_allclose(compiled(x, scale=2.0).item(), fn(x, scale=2.0).item(), rtol=1e-6)


def test_gradients_accumulated_into_grad_fields_across_followed_calls():
    w = tg.tensor([0.5, -1.0, 2.0], dtype=tg.float64, requires_grad=True)
    twin = tg.tensor([0.5, -1.0, 2.0], dtype=tg.float64, requires_grad=True)

    def step(p, x):
        loss = (p * x).sin().sum()
        loss.backward()
        return loss.detach()

    compiled = tg.compile(lambda x: step(w, x))
    for i in range(5):
        x = tg.tensor([0.1, 0.2, 0.3], dtype=tg.float64) * (i + 1)
        np.testing.assert_allclose(compiled(x).item(), step(twin, x).item(), rtol=1e-12)
        np.testing.assert_allclose(w.grad.numpy(), twin.grad.numpy(), rtol=1e-12)


def test_autograd_grad_in_a_followed_call_takes_the_short_path_with_the_general_results(monkeypatch):
    taken = []
    short = compile_replay.Replay.grad

    def spy(self, *args):
        answer = short(self, *args)
        taken.append(answer is not None)
        return answer

    monkeypatch.setattr(compile_replay.Replay, "grad", spy)

    def fn(x, w):
        y = (x * w).tanh()
        loss = (y * y).sum()
        gx, gw, gy = tg.autograd.grad(loss, [x, w, y])
        return loss, gx, gw, gy

    compiled = tg.compile(fn)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = tg.tensor(rng.standard_normal(4), requires_grad=True)
        w = tg.tensor(rng.standard_normal(4), requires_grad=True)
        got = compiled(x, w)
        expected = fn(x, w)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g.detach().numpy(), e.detach().numpy(), rtol=1e-12)
        for g in got[1:]:  # fresh tensors, as the general path's detach makes them
            assert g.grad_fn is None and not g.requires_grad
        del got  # (a result with a grad_fn alive would keep the next call from following)
    assert taken == [True, True]  # the second and third calls followed the first


def test_the_short_grad_path_leaves_hooks_unused_inputs_and_the_output_itself_to_the_general_one():
    def fn(x, hook, unused):
        y = (x * 2.0).exp()
        loss = y.sum()
        if hook:
            x.register_hook(lambda g: g * 10.0)
        inputs = [x, unused] if unused is not None else [x, loss]
        return tg.autograd.grad(loss, inputs, allow_unused=unused is not None)

    compiled = tg.compile(fn)
    x = tg.tensor([0.5, -1.0], dtype=tg.float64, requires_grad=True)
    expected = 2.0 * np.exp(2.0 * x.detach().numpy())
    gx, gloss = compiled(x, False, None)
    gx, gloss = compiled(x, False, None)  # followed: the loss's own gradient is the seed
    np.testing.assert_allclose(gx.numpy(), expected, rtol=1e-12)
    assert gloss.numpy() == 1.0 and gloss.grad_fn is None
    gloss.add_(1.0)  # a copy of the seed, the caller's to change
    assert compiled(x, False, None)[1].numpy() == 1.0
    gx, _ = compiled(x, True, None)
    np.testing.assert_allclose(gx.numpy(), 10.0 * expected, rtol=1e-12)
    other = tg.tensor([1.0], dtype=tg.float64, requires_grad=True)
    for _ in range(2):
        gx, gother = compiled(x, False, other)
        np.testing.assert_allclose(gx.numpy(), expected, rtol=1e-12)
        assert gother is None


def test_followed_calls_reuse_the_tensors_of_unchanged_python_numbers_and_stay_correct():
    def fn(x, a, b):
        y = x * a + b            # numbers that may change between calls
        z = tg.where(y > 0, 1.5, 1.5) * y  # two equal numbers given before either is captured
        return (z * 0.5 - 2).sum()

    def eager(x, a, b):
        y = x.numpy() * a + b
        return (1.5 * y * 0.5 - 2).sum()

    compiled = tg.compile(fn)
    x = tg.tensor([1.0, -2.0, 3.0], dtype=tg.float64)
    followed = []
    for a, b in [(2.0, 1.0), (2.0, 1.0), (2.0, 1.0), (3.0, 1.0), (3.0, 1.0), (2, 1.0), (-0.0, 0.0), (0.0, -0.0)]:
        result, was_followed = _followed(compiled, x, a, b)
        followed.append(was_followed)
        np.testing.assert_allclose(result.numpy(), eager(x, a, b), rtol=1e-12)
    assert all(followed[1:])  # changed numbers are other values, not another graph
    recording = compiled._recordings[0]
    kept = [t for _, t in recording.scalars.values()]
    assert kept and all(not t.numpy().flags.writeable for t in kept)
    assert len({id(t) for t in kept}) == len(kept)


def test_a_signed_zero_is_not_taken_for_the_other():
    compiled = tg.compile(lambda x, z: 1.0 / (x * z))
    x = tg.tensor([1.0, 2.0])
    for z in (0.0, -0.0, -0.0, 0.0, 0.0):
        got = compiled(x, z).numpy()
        assert np.all(np.signbit(got) == (np.copysign(1.0, z) < 0)), (z, got)


def test_forward_only_calls_with_parameters_that_require_grad_follow_once_their_results_are_dropped():
    w = tg.tensor([0.5, -1.0, 2.0], dtype=tg.float64, requires_grad=True)

    def forward(x):
        return (tg.sin(x * w) * x).sum()  # sin saves its input, mul its inputs: nodes hold tensors

    compiled = tg.compile(forward)
    x = tg.tensor([1.0, 2.0, 3.0], dtype=tg.float64)
    followed = []
    for _ in range(3):
        loss, was_followed = _followed(compiled, x)
        followed.append(was_followed)
        del loss
    assert followed == [False, True, True]
    # A result kept past the call still differentiates (through saved data, as in eager),
    # and sees an in-place update made since.
    loss = compiled(x)
    loss.backward()
    expected = np.cos(x.numpy() * w.detach().numpy()) * x.numpy() ** 2
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-12)
    loss = compiled(x)
    x.mul_(2.0)  # saved by `x * w` for w's gradient (w itself is not saved: x needs none)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_a_followed_result_keeping_its_graph_backpropagates_through_saved_outputs():
    # exp saves its output: after a followed call, that saved tensor is an alias of a lazy
    # output, and it must be materialized with the call's results.
    w = tg.tensor(np.random.default_rng(4).standard_normal((3, 4)), requires_grad=True)
    compiled = tg.compile(lambda x: ((x * w).exp() * 2.0).sum(1))
    x = tg.tensor(np.random.default_rng(5).standard_normal((3, 4)))
    expected = tg.autograd.grad(((x * w).exp() * 2.0).sum(), [w])[0].numpy()
    followed = []
    for _ in range(3):
        w.grad = None
        result, replayed = _followed(compiled, x)
        followed.append(replayed)
        result.sum().backward()
        del result
        np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-12)
    assert followed == [False, True, True]


def test_a_value_python_reads_after_a_saved_write_diverges_without_a_false_version_error():
    # t is written (a real tensor: its write is followed), then saved by t * t as its new
    # value; `.item()` makes the followed call diverge, which makes the saved tensors then.
    def fn(w):
        t = tg.tensor([1.0, 2.0], dtype=tg.float64).requires_grad_()
        with tg.no_grad():
            t.mul_(w)
        y = t * t
        total = y.sum().item()
        y.sum().backward()
        return t.grad, total

    compiled = tg.compile(fn)
    w = tg.tensor([1.0, 2.0], dtype=tg.float64)
    want_grad, want_total = fn(w)
    for _ in range(3):
        grad, total = compiled(w)
        np.testing.assert_array_equal(grad.numpy(), want_grad.numpy())
        assert total == want_total


def test_a_view_saved_by_a_followed_op_then_gone_stale_is_saved_as_the_op_read_it():
    # fuzz seed 1001304: a followed call makes its saved tensors late; a view read by a
    # node (the 1-D matmul operand) whose base was written since must not be brought up to
    # date then (it was: a node outside the graph, a KeyError in the cache key)
    def program(a5, a9):
        t4 = tg.tensor([-4.0]).requires_grad_()
        t6 = t4 @ a5
        t7 = t4[[-1, 0, 0, -1]]
        t8 = t4 + -1.5
        t10 = tg.matmul(t6, a9)
        with tg.no_grad():
            t4.pow_(2)
        t11 = t10.log_softmax(-1)
        loss = (t8 * t8).mean() + (t7 * t7).sum() * 0.5 + (t4 * t4).mean()
        loss.backward()
        return [t7, t8, t10, t11, loss, t4.grad]

    def run(fn):
        a5 = tg.ones(1, 1, requires_grad=True)
        return [t.detach().numpy().tolist() for t in fn(a5, tg.ones(1, 4))]

    expected = run(program)
    compiled = tg.compile(program)
    for _ in range(3):
        assert run(compiled) == expected


def test_a_step_detaching_an_argument_with_history_follows_its_backward_too():
    # A recurrent state carried between calls (word_language_model's `repackage_hidden`):
    # the argument has a history from the previous call, the step detaches it at once, so
    # its backward stays inside the graph and later calls follow the whole recording.
    w = tg.tensor(np.linspace(-0.5, 0.5, 12).reshape(3, 4), requires_grad=True)
    w_eager = tg.tensor(w.detach().numpy(), requires_grad=True)

    def step(x, hidden, weight):
        hidden = hidden.detach()
        hidden = tg.tanh(x @ weight + hidden)
        loss = (hidden * hidden).sum()
        loss.backward()
        return loss, hidden

    compiled = tg.compile(step)
    rng = np.random.default_rng(1)
    hidden = hidden_eager = tg.zeros(2, 4, requires_grad=True) * 1  # (has a history)
    followed = []
    for _ in range(6):
        x = tg.tensor(rng.standard_normal((2, 3)))
        (loss, hidden), replayed = _followed(compiled, x, hidden, w)
        followed.append(replayed)
        want_loss, hidden_eager = step(x, hidden_eager, w_eager)
        np.testing.assert_allclose(loss.detach().numpy(), want_loss.detach().numpy(), rtol=1e-6)
        np.testing.assert_allclose(w.grad.numpy(), w_eager.grad.numpy(), rtol=1e-6)
        assert hidden.grad_fn is not None
        del loss
    # (The second call cannot follow the first: the first's result, this call's argument,
    # still references its recording. The third diverges where `.grad` is first accumulated
    # into, not assigned; from the fourth on, every call follows a recording of its own kind.)
    assert followed == [False, False, False, True, True, True]


def test_a_step_whose_backward_reaches_an_argument_with_history_still_sends_it_there():
    # Not detached: the gradient goes on into the argument's history, outside the call.
    a = tg.tensor([0.5, -1.0, 2.0], requires_grad=True)
    compiled = tg.compile(lambda h: (h * h).sum().backward())
    for calls in range(1, 4):
        compiled(a * 2)
        np.testing.assert_allclose(a.grad.numpy(), calls * 8 * a.detach().numpy())


def test_in_place_updates_of_traced_tensors_are_followed_and_stay_correct():
    # Gradient clipping scales the traced gradients in place, `relu_` updates a traced
    # activation before the backward, `+=` updates an argument's stand-in: each is an op
    # of the recording like any other, so later calls follow it (they used to diverge).
    rng = np.random.default_rng(2)
    data = [rng.standard_normal((4, 3)), rng.standard_normal(3)]

    def make_step(params):
        def step(x, acc):
            h = x @ params[0]
            h.relu_()
            loss = (h * params[1]).sum()
            loss.backward()
            tg.nn.utils.clip_grad_norm_(params, 0.5)
            with tg.no_grad():
                for p in params:
                    p.data.add_(p.grad, alpha=-0.1)
                    p.grad = None
            acc += loss.detach()
            return loss
        return step

    params = [tg.tensor(d, requires_grad=True) for d in data]
    twins = [tg.tensor(d, requires_grad=True) for d in data]
    compiled, eager = tg.compile(make_step(params)), make_step(twins)
    acc, acc_eager = tg.zeros(()), tg.zeros(())
    followed = []
    for _ in range(5):
        x = tg.tensor(rng.standard_normal((2, 4)))
        loss, replayed = _followed(compiled, x, acc)
        followed.append(replayed)
        want = eager(x, acc_eager)
        np.testing.assert_allclose(loss.detach().numpy(), want.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(acc.numpy(), acc_eager.numpy(), rtol=1e-12)
        for p, t in zip(params, twins):
            np.testing.assert_allclose(p.detach().numpy(), t.detach().numpy(), rtol=1e-12)
        del loss
    assert followed[0] is False and all(followed[2:])


def test_an_in_place_update_of_a_traced_saved_tensor_in_a_followed_call_still_raises():
    def fn(x, update):
        y = x * 2
        z = y.exp()
        if update:
            z.mul_(2)  # (exp saved its output)
        return tg.autograd.grad(z.sum(), [x])[0]

    compiled = tg.compile(fn)
    x = tg.tensor([0.5, 1.0], dtype=tg.float64, requires_grad=True)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            compiled(x, True)
    np.testing.assert_allclose(compiled(x, False).numpy(), 2 * np.exp(2 * np.array([0.5, 1.0])), rtol=1e-12)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        compiled(x, True)


def test_calls_with_arguments_of_varying_shapes_follow_a_recording_of_their_own_shapes():
    # A per-example loop over sequences of varying length (the char-RNN tutorial): each
    # length keeps its recording, instead of every call diverging from the last one's.
    w = tg.tensor(np.linspace(-1.0, 1.0, 6).reshape(2, 3), requires_grad=True)

    def step(sequence):
        h = tg.zeros(3)
        for row in sequence:
            h = tg.tanh(row @ w + h)
        loss = h.sum()
        loss.backward()
        return loss.detach()

    compiled = tg.compile(step)
    rng = np.random.default_rng(3)
    followed = {}
    for length in [3, 4, 5] * 3:
        x = tg.tensor(rng.standard_normal((length, 2)))
        w.grad = None
        loss, replayed = _followed(compiled, x)
        got = w.grad.numpy().copy()
        w.grad = None
        np.testing.assert_allclose(loss.numpy(), step(x).numpy(), rtol=1e-12)
        np.testing.assert_allclose(got, w.grad.numpy(), rtol=1e-12)
        followed.setdefault(length, []).append(replayed)
    assert followed == {3: [False, True, True], 4: [False, True, True], 5: [False, True, True]}


def test_a_value_python_asks_for_is_followed_when_the_recording_asked_for_the_same():
    # A training step ending in `loss.item()` (the char-RNN tutorial) and one stopping
    # early on a value (a data-dependent loop): calls follow the recorded realizations and
    # diverge only where Python takes another path; every result is eager's.
    w = tg.tensor(np.linspace(-0.5, 0.5, 6).reshape(2, 3), requires_grad=True)
    w_eager = tg.tensor(w.detach().numpy(), requires_grad=True)

    def make_step(weight):
        def step(x, limit):
            h = tg.zeros(3)
            for row in x:
                h = tg.tanh(row @ weight + h)
                if h.abs().sum().item() > limit:  # (a value Python needs, per row)
                    break
            loss = (h * h).sum()
            loss.backward()
            with tg.no_grad():
                weight.sub_(0.1 * weight.grad)
                weight.grad = None
            return h, loss.item()
        return step

    compiled, eager = tg.compile(make_step(w)), make_step(w_eager)
    rng = np.random.default_rng(4)
    followed = []
    for limit in [10.0, 10.0, 10.0, 10.0, 0.1, 10.0]:
        x = tg.tensor(rng.standard_normal((3, 2)))
        (h, loss), replayed = _followed(compiled, x, limit)
        want_h, want_loss = eager(x, limit)
        followed.append(replayed)
        assert loss == pytest.approx(want_loss, rel=1e-12)
        np.testing.assert_allclose(h.detach().numpy(), want_h.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(w.detach().numpy(), w_eager.detach().numpy(), rtol=1e-12)
        del h
    assert followed[2:4] == [True, True] and followed[4] is False


def _stop_tested_step(inp, rec, momentum):
    """W11's step in small: iterate h <- tanh(u + h @ rec) until the change is small (an
    `.item()` per iteration), backpropagate through every iteration, SGD with momentum."""
    def step(x):
        u = x @ inp
        h = tg.zeros_like(u)
        for _ in range(30):
            h_next = tg.tanh(u + h @ rec)
            converged = (h_next - h).abs().max().item() < 1e-3
            h = h_next
            if converged:
                break
        loss = (h * h).sum()
        loss.backward()
        with tg.no_grad():
            for p, buffer in ((inp, momentum[0]), (rec, momentum[1])):
                buffer.mul_(0.9).add_(p.grad)
                p.sub_(0.002 * buffer)  # (small: each batch takes 12 iterations on every call)
                p.grad = None
        return h, loss
    return step


def _stop_tested_state(seed):
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    return [tg.tensor(rng.standard_normal((3, 4)) * 0.5, requires_grad=True),
            tg.tensor(0.6 * q, requires_grad=True)], [tg.zeros(3, 4), tg.zeros(4, 4)]


def test_a_call_finishes_from_its_realized_values_without_computing_them_again():
    # The iterations a stop test realized are not run again by the call's last program:
    # it holds the backward and the updates only (no forward tanh), and every call,
    # followed or traced, matches eager execution, in-place updates of the parameters and
    # their momentum buffers (written into their buffers: donated) included.
    (inp, rec), momentum = _stop_tested_state(5)
    (inp_e, rec_e), momentum_e = _stop_tested_state(5)
    compiled = tg.compile(_stop_tested_step(inp, rec, momentum))
    eager = _stop_tested_step(inp_e, rec_e, momentum_e)
    rng = np.random.default_rng(6)
    batches = [tg.tensor(rng.standard_normal((2, 3))) for _ in range(2)]
    followed = []
    for call in range(5):
        x = batches[call % 2]
        (h, loss), replayed = _followed(compiled, x)
        followed.append(replayed)
        want_h, want_loss = eager(x)
        np.testing.assert_allclose(h.detach().numpy(), want_h.detach().numpy(), rtol=1e-10)
        np.testing.assert_allclose(loss.detach().numpy(), want_loss.detach().numpy(), rtol=1e-10)
        for got, want in zip([inp, rec, *momentum], [inp_e, rec_e, *momentum_e]):
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-10)
        del h, loss  # (results referencing its nodes: the recording is not followed while they live)
    assert followed == [False, True, True, True, True]
    final = compiled.explain(batches[0]).graphs[-1].graph
    ops = [node.op.name for node in final.nodes]
    assert "tanh" not in ops and ops.count("matmul") >= 2  # (backward products only)
    assert len(final.inputs) > len(compiled.explain(batches[0]).graphs[0].graph.inputs)


def _follow_stop_tested(scales: list) -> tuple[list, list]:
    """Call the stop-tested step compiled and eagerly on one batch scaled by each of
    `scales` (a scale sets the iterations it takes), checking every result and update;
    per call, whether it followed a recording to the end and how many stop tests the most
    recent recording holds."""
    (inp, rec), momentum = _stop_tested_state(5)
    (inp_e, rec_e), momentum_e = _stop_tested_state(5)
    compiled = tg.compile(_stop_tested_step(inp, rec, momentum))
    eager = _stop_tested_step(inp_e, rec_e, momentum_e)
    x = np.random.default_rng(6).standard_normal((2, 3))
    followed, counts = [], []
    for scale in scales:
        (h, loss), replayed = _followed(compiled, tg.tensor(x * scale))
        followed.append(replayed)
        counts.append(len(compiled._recordings[0].realizations))
        want_h, want_loss = eager(tg.tensor(x * scale))
        np.testing.assert_allclose(h.detach().numpy(), want_h.detach().numpy(), rtol=1e-10)
        np.testing.assert_allclose(loss.detach().numpy(), want_loss.detach().numpy(), rtol=1e-10)
        for got, want in zip([inp, rec, *momentum], [inp_e, rec_e, *momentum_e]):
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-10)
        del h, loss
    return followed, counts


def test_a_call_that_diverged_after_following_realizations_is_followed_from_its_first():
    # A batch stopping after fewer iterations than the recorded one follows the recorded
    # stop tests, then diverges. Its recording keeps those followed stop tests too, so the
    # next call on that batch follows it to the end (it used to diverge at its first
    # `.item()`: the recording held only the stop tests traced after the divergence).
    followed, counts = _follow_stop_tested([0.1, 3.0, 3.0])
    assert counts[0] > counts[1] == counts[2]  # (one stop test per iteration, all kept)
    assert followed == [False, False, True]


def _branchy_step(w):
    """A training step whose path a value decides (`.item()`): tanh for a positive batch sum,
    exp of a third otherwise."""
    def step(x):
        h = x @ w
        if h.sum().item() > 0:
            y = tg.tanh(h) * 2.0
        else:
            y = tg.exp(h / 3.0)
        loss = (y * y).sum()
        loss.backward()
        with tg.no_grad():
            w.sub_(0.01 * w.grad)
            w.grad = None
        return loss.detach()
    return step


def test_calls_that_alternate_between_paths_follow_the_recording_of_each():
    # The second path's recording was cut from the first's where the paths part; both are
    # kept (one family), and a call follows the one it starts with until the paths part,
    # then the other (`Replay.switch`): every call from the third on follows to the end.
    w = tg.tensor(np.linspace(-0.5, 0.5, 6).reshape(3, 2), requires_grad=True)
    w_eager = tg.tensor(w.detach().numpy(), requires_grad=True)
    compiled, eager = tg.compile(_branchy_step(w)), _branchy_step(w_eager)
    x = np.random.default_rng(7).standard_normal((4, 3))
    followed = []
    for call in range(8):
        batch = tg.tensor(x if call % 2 == 0 else -x)
        loss, replayed = _followed(compiled, batch)
        followed.append(replayed)
        np.testing.assert_allclose(loss.numpy(), eager(batch).numpy(), rtol=1e-12)
        np.testing.assert_allclose(w.detach().numpy(), w_eager.detach().numpy(), rtol=1e-12)
    assert followed == [False, False] + [True] * 6
    assert compiled.cache_info().misses == 3  # (the branch's realization, a graph per path)


def test_a_loop_of_lengths_seen_before_follows_the_recording_of_each():
    # W11 in small: batches stopping after different numbers of iterations, in turn.
    followed, counts = _follow_stop_tested([0.1, 3.0, 1.0, 0.1, 3.0, 1.0, 0.1])
    assert len(set(counts)) == 3 and followed[3:] == [True] * 4


def test_a_result_alive_from_one_path_keeps_every_path_of_its_family_from_being_followed():
    # The paths share nodes: a call following the other path would set the saved tensors
    # the live result's backward reads. So it traces afresh, and both backwards are eager's.
    w = tg.tensor(np.linspace(-0.5, 0.5, 6).reshape(3, 2), requires_grad=True)

    def forward(x):
        h = x @ w
        return tg.tanh(h).sum() if h.sum().item() > 0 else tg.exp(h / 3.0).sum()

    compiled = tg.compile(forward)
    x = tg.tensor(np.random.default_rng(8).standard_normal((4, 3)))
    for batch in (x, -x):  # (two recordings, one family)
        compiled(batch).backward()
    w.grad = None
    kept, replayed = _followed(compiled, x)
    assert replayed
    other, replayed = _followed(compiled, -x)
    assert not replayed
    other.backward()
    kept.backward()
    got = w.grad.numpy().copy()
    w.grad = None
    forward(-x).backward()
    forward(x).backward()
    np.testing.assert_allclose(got, w.grad.numpy(), rtol=1e-12)


def test_a_call_that_fails_after_following_forgets_every_recording_of_the_family():
    w = tg.tensor(np.linspace(-0.5, 0.5, 6).reshape(3, 2), requires_grad=True)

    def forward(x, fail):
        h = x @ w
        y = tg.tanh(h) if h.sum().item() > 0 else tg.exp(h)
        if fail:
            raise ValueError("asked to")
        return y.sum().detach()

    compiled = tg.compile(forward)
    x = tg.tensor(np.random.default_rng(9).standard_normal((4, 3)))
    compiled(x, False)
    compiled(-x, False)
    assert len(compiled._recordings) == 2
    with pytest.raises(ValueError, match="asked to"):
        compiled(x, True)
    assert compiled._recordings == []
    np.testing.assert_allclose(compiled(-x, False).numpy(), forward(-x, False).numpy(), rtol=1e-12)


def test_a_result_realized_during_the_call_is_returned_beside_the_rest():
    # `h` was realized by the stop test (its value is a result as it is), the loss is not.
    w = tg.tensor(np.linspace(-0.4, 0.4, 4).reshape(2, 2), requires_grad=True)

    def step(x):
        h = tg.tanh(x @ w)
        if h.sum().item() > 100.0:
            h = h * 0.0
        loss = (h * x).sum()
        return h, loss, loss * 2

    compiled = tg.compile(step)
    for seed in range(3):
        x = tg.tensor(np.random.default_rng(seed).standard_normal((3, 2)))
        got, want = compiled(x), step(x)
        for g, e in zip(got, want):
            np.testing.assert_allclose(g.detach().numpy(), e.detach().numpy(), rtol=1e-12)
        assert all(g.requires_grad for g in got)
        got[1].backward()
        grad = w.grad.numpy().copy()
        w.grad = None
        want[1].backward()
        np.testing.assert_allclose(grad, w.grad.numpy(), rtol=1e-12)
        w.grad = None


def test_a_call_whose_results_were_all_realized_does_not_run_its_graph_again(monkeypatch):
    from tracegrad.jit import function as compile_function

    runs = []
    original = compile_function._run_program
    monkeypatch.setattr(compile_function, "_run_program", lambda program, inputs: runs.append(1) or
                        original(program, inputs))
    compiled = tg.compile(lambda x: (x * 2).sum().item())
    for _ in range(3):
        assert compiled(tg.arange(4.0)) == 12.0
    assert compiled.cache_info().graphs == 1  # the realization's graph, and no final one


def test_a_followed_realization_runs_its_program_without_keying_its_graph(monkeypatch):
    # `loss.item()` at a step's end: the followed realization's graph is the recorded one,
    # so its key is too (but for how the inputs share memory, checked on every call).
    from tracegrad.jit import function as compile_function

    w = tg.tensor(np.linspace(-1.0, 1.0, 6).reshape(2, 3), requires_grad=True)

    def step(x):
        loss = (tg.tanh(x @ w) ** 2).sum()
        loss.backward()
        return loss.item()

    compiled = tg.compile(step)
    x = tg.tensor(np.random.default_rng(1).standard_normal((4, 2)))
    keyed = []
    original = compile_function.structural_key
    monkeypatch.setattr(compile_function, "structural_key", lambda graph, inputs: keyed.append(graph.name) or
                        original(graph, inputs))
    followed = []
    for i in range(4):
        w.grad = None
        value, replayed = _followed(compiled, x)
        followed.append(replayed)
        got = w.grad.numpy()
        w.grad = None
        assert value == pytest.approx(step(x), rel=1e-12)
        np.testing.assert_allclose(got, w.grad.numpy(), rtol=1e-12)
        if i == 1:
            keyed.clear()  # (the first followed call keys it once)
    assert followed == [False, True, True, True]
    assert keyed == []
    assert compiled.cache_info().graphs == 1


def test_a_realization_whose_inputs_alias_otherwise_is_keyed_again():
    # The same argument passed twice, then two distinct tensors: one graph, two programs.
    compiled = tg.compile(lambda a, b: (a * b).sum().item())
    x, y = tg.arange(3.0), tg.arange(3.0) + 1.0
    for a, b in [(x, x), (x, x), (x, y), (x, y), (x, x)]:
        assert compiled(a, b) == float((a.numpy() * b.numpy()).sum())


def _recurrent_step(cell_w, head_w):
    """A char-RNN-like loop: every step makes an output, only the last one is returned."""
    def step(xs):
        h = tg.zeros(1, 3, dtype=tg.float64)
        for x in xs:
            combined = tg.cat((x, h), 1)
            h = tg.tanh(tg.nn.functional.linear(combined, cell_w))
            output = tg.nn.functional.log_softmax(tg.nn.functional.linear(combined, head_w), dim=1)
        return output
    return step


def test_a_followed_call_makes_only_the_saved_tensors_its_results_can_reach(monkeypatch):
    # Each step's output but the last dies in the loop: their composites' saved tensors are
    # never made, while the returned output backpropagates through the whole recurrence
    # (tensors that only saved-tensor entries held are made anew for it).
    from tracegrad.jit import composite as compile_composite

    rng = np.random.default_rng(7)
    cell_w = tg.tensor(rng.standard_normal((3, 5)), requires_grad=True)
    head_w = tg.tensor(rng.standard_normal((4, 5)), requires_grad=True)
    eager_cell = tg.tensor(cell_w.detach().numpy(), requires_grad=True)
    eager_head = tg.tensor(head_w.detach().numpy(), requires_grad=True)
    compiled, eager = tg.compile(_recurrent_step(cell_w, head_w)), _recurrent_step(eager_cell, eager_head)
    made = []
    original = compile_composite.Deferred._make
    monkeypatch.setattr(compile_composite.Deferred, "_make",
                        lambda self: made.append(self.record.function.__name__) or original(self))
    followed = []
    for _ in range(3):
        xs = tg.tensor(rng.standard_normal((4, 1, 2)))
        made.clear()
        output, replayed = _followed(compiled, xs)
        followed.append(replayed)
        cell_w.grad = head_w.grad = eager_cell.grad = eager_head.grad = None
        (output * tg.arange(4.0, dtype=tg.float64)).sum().backward()
        want = eager(xs)
        (want * tg.arange(4.0, dtype=tg.float64)).sum().backward()
        np.testing.assert_allclose(output.detach().numpy(), want.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(cell_w.grad.numpy(), eager_cell.grad.numpy(), rtol=1e-12)
        np.testing.assert_allclose(head_w.grad.numpy(), eager_head.grad.numpy(), rtol=1e-12)
        del output
    assert followed == [False, True, True]
    assert made.count("log_softmax") == 1  # the last step's, of four


def test_a_followed_call_without_a_live_result_makes_no_saved_tensors(monkeypatch):
    # A step whose backward ran inside the call and returns nothing with a graph.
    from tracegrad.jit import replay as replay_module

    rng = np.random.default_rng(8)
    cell_w = tg.tensor(rng.standard_normal((3, 5)), requires_grad=True)
    head_w = tg.tensor(rng.standard_normal((4, 5)), requires_grad=True)
    recurrent = _recurrent_step(cell_w, head_w)

    def step(xs):
        output = recurrent(xs)
        output[0, 1].neg().backward()
        return output.detach()

    compiled = tg.compile(step)
    saved = []
    original = replay_module._save
    monkeypatch.setattr(replay_module, "_save", lambda *entry: saved.append(entry[0]) or original(*entry))
    xs = tg.tensor(rng.standard_normal((5, 1, 2)))
    for _ in range(3):
        saved.clear()
        cell_w.grad = head_w.grad = None
        got, replayed = _followed(compiled, xs)
        grads = cell_w.grad.numpy(), head_w.grad.numpy()
        cell_w.grad = head_w.grad = None
        want = step(xs)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
        np.testing.assert_allclose(grads[0], cell_w.grad.numpy(), rtol=1e-12)
        np.testing.assert_allclose(grads[1], head_w.grad.numpy(), rtol=1e-12)
    assert replayed and saved == []


def _fixed_point_step(w, iterations: int):
    """A loop with a convergence check per iteration (`.item()`): abs and max save their
    tensors, and no loss reaches them."""
    def step(x):
        h = x
        for _ in range(iterations):
            h_next = tg.tanh(h @ w)
            (h_next - h).abs().max().item()
            h = h_next
        loss = (h ** 2).sum()
        loss.backward()
        return loss
    return step


def test_a_full_trace_and_a_followed_call_of_one_path_share_one_program():
    # The full trace forgets the saved tensors of the convergence checks as the followed
    # call never makes them: both leave the same outputs, so the same key.
    rng = np.random.default_rng(12)
    w = tg.tensor(rng.standard_normal((3, 3)) * 0.5, requires_grad=True)
    eager_w = tg.tensor(w.detach().numpy(), requires_grad=True)
    compiled, eager = tg.compile(_fixed_point_step(w, 3)), _fixed_point_step(eager_w, 3)
    followed, graphs = [], []
    for _ in range(3):
        x = tg.tensor(rng.standard_normal((2, 3)))
        w.grad = eager_w.grad = None
        loss, replayed = _followed(compiled, x)
        followed.append(replayed)
        graphs.append(compiled.cache_info().graphs)
        want = eager(x)
        assert loss.item() == pytest.approx(want.item(), rel=1e-12)
        np.testing.assert_allclose(w.grad.numpy(), eager_w.grad.numpy(), rtol=1e-12)
        del loss  # (a result with a graph would keep the recording from being followed)
    assert followed == [False, True, True]
    assert graphs[1:] == graphs[:1] * 2  # (the second call's final graph is the first one's)


def test_a_full_trace_keeps_the_saved_tensors_a_returned_result_reaches():
    # The result keeps its graph: a backward after the call goes through every iteration,
    # its saved tensors made by the trace (and those only a saved tensor held, kept).
    rng = np.random.default_rng(13)
    w = tg.tensor(rng.standard_normal((3, 3)) * 0.5, requires_grad=True)
    eager_w = tg.tensor(w.detach().numpy(), requires_grad=True)

    def forward(w):
        def step(x):
            h = x
            for _ in range(3):
                h_next = tg.tanh(h @ w)
                (h_next - h).abs().max().item()
                h = h_next
            return (h ** 3).sum()
        return step

    compiled = tg.compile(forward(w))
    for _ in range(2):
        x = tg.tensor(rng.standard_normal((2, 3)))
        w.grad = eager_w.grad = None
        got, want = compiled(x), forward(eager_w)(x)
        got.backward()
        want.backward()
        assert got.item() == pytest.approx(want.item(), rel=1e-12)
        np.testing.assert_allclose(w.grad.numpy(), eager_w.grad.numpy(), rtol=1e-12)


def test_a_tensor_first_read_after_a_write_to_its_data_is_followed():
    # `p.data.add_(...)` writes p's memory before the call reads p itself (the parameters
    # held by the function, as an optimizer holds them): capturing p then makes its
    # refresh's nodes before the op that reads it, in the recorded call as in the following
    # ones (which used to diverge at that op on every call).
    def make():
        params = [tg.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True),
                  tg.tensor(np.linspace(-1.0, 1.0, 4), requires_grad=True)]
        for k, p in enumerate(params):
            p.grad = tg.full(p.shape, 0.25 * (k + 1), dtype=p.dtype)
        return params

    def stepper(params):
        def step():
            for p in params:
                p.data.add_(p.grad.data, alpha=-0.5)
            return params[0].sum() * 2 + params[1].mean()
        return step

    eager, traced = make(), make()
    compiled = tg.compile(stepper(traced))
    followed = []
    for _ in range(4):
        want = stepper(eager)()
        got, replayed = _followed(compiled)
        followed.append(replayed)
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12)
        assert got.requires_grad and want.requires_grad
        del got, want  # (a result kept alive would make the next call trace afresh)
        for p, q in zip(traced, eager):
            np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-12)
            assert p._version_counter.value == q._version_counter.value
    assert followed == [False, True, True, True]
    assert compiled.cache_info().misses == 1
