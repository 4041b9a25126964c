"""A compiled call that raises: the exception goes on unchanged, and every tensor, `.grad`,
optimizer state, module buffer and version counter is what eager execution leaves at the
raise (the graph up to the raise runs, as at a call's end), or, when even that cannot
run, what it was before the call. No later call follows the trace of a failed one."""

import traceback

import numpy as np
import pytest

import tracegrad as tg


class Boom(Exception):
    pass


class Interrupt(BaseException):  # as KeyboardInterrupt: not an Exception
    pass


class FailingBackward(tg.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        raise Boom("custom backward")


def _model_and_optimizer(optimizer: str = "adam"):
    tg.manual_seed(0)
    # No bias before the batch norm: its gradient would be rounding noise, which Adam's
    # normalized step turns into different parameters eagerly and compiled.
    model = tg.nn.Sequential(tg.nn.Linear(3, 4, bias=False), tg.nn.BatchNorm1d(4), tg.nn.Tanh(),
                             tg.nn.Linear(4, 2)).double()
    if optimizer == "adam":
        return model, tg.optim.Adam(model.parameters(), lr=0.1)
    return model, tg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _raise_at(point: str, where: str):
    if point == where:
        raise Interrupt("stop") if point == "base exception" else Boom(point)


def _training_step(model, optimizer, point: str):
    """A step that raises at `point` when it is called with `fail=True`."""
    def step(x, fail):
        out = model(x)
        loss = (out * out).mean()
        if fail and point == "custom backward":
            loss = loss + FailingBackward.apply(out).sum()
        if fail and point == "backward hook":
            out.register_hook(lambda grad: _raise_at(point, point))
        optimizer.zero_grad()
        loss.backward()
        if fail:
            _raise_at(point, "after backward")
        optimizer.step()
        if fail:
            _raise_at(point, "after step")
        x.add_(1.0)
        with tg.no_grad():
            model[3].bias.mul_(0.5)
        if fail:
            _raise_at(point, "after in-place writes")
            if point == "after item" and loss.item() > -1.0:
                raise Boom(point)
            if point == "shape error":
                out @ tg.ones(5, 5, dtype=tg.float64)
            _raise_at(point, "base exception")
        return loss
    return step


def _state(model, optimizer, x) -> dict:
    """Everything a step can change, as arrays and numbers (it raises on a lazy tensor)."""
    state = {"x": (x.numpy().copy(), x._version)}
    for name, p in model.named_parameters():
        grad = None if p.grad is None else p.grad.numpy().copy()
        state[name] = (p.detach().numpy().copy(), p._version, grad)
    for name, b in model.named_buffers():
        state[name] = (b.numpy().copy(), b._version)
    for i, per_parameter in enumerate(optimizer.state.values()):
        for key, value in per_parameter.items():
            state[f"optimizer.{i}.{key}"] = value.numpy().copy() if isinstance(value, tg.Tensor) else value
    return state


def _assert_same_state(actual: dict, expected: dict, context) -> None:
    assert actual.keys() == expected.keys(), context
    for key, value in expected.items():
        entry = actual[key]
        for got, want in zip(entry, value) if isinstance(value, tuple) else [(entry, value)]:
            if isinstance(want, np.ndarray) or isinstance(got, np.ndarray):
                assert got is not None and want is not None, (context, key)
                np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12, err_msg=f"{context} {key}")
            else:
                assert got == want, (context, key)


def _calls(point: str, fail_on: int, compiled: bool, optimizer: str = "adam") -> list:
    """Per call of four (call `fail_on` raising at `point`): the error and the state after;
    then the state after an eager backward."""
    model, opt = _model_and_optimizer(optimizer)
    x = tg.tensor(np.random.default_rng(1).normal(size=(5, 3)))
    step = _training_step(model, opt, point)
    fn = tg.compile(step) if compiled else step
    results = []
    for call in range(1, 5):
        try:
            fn(x, call == fail_on)
            error = None
        except (Exception, Interrupt) as raised:
            error = (type(raised), str(raised))
        results.append((error, _state(model, opt, x)))
    model(x).sum().backward()
    results.append((None, _state(model, opt, x)))
    return results


POINTS = ["after backward", "after step", "after in-place writes", "after item", "shape error",
          "base exception", "backward hook"]


@pytest.mark.parametrize("fail_on", [1, 3], ids=["first call", "followed call"])
@pytest.mark.parametrize("point", POINTS)
def test_a_compiled_call_that_raises_leaves_the_state_eager_leaves(point, fail_on):
    eager, compiled = _calls(point, fail_on, False), _calls(point, fail_on, True)
    for call, ((error_e, state_e), (error_c, state_c)) in enumerate(zip(eager, compiled), 1):
        assert error_c == error_e, (point, call)
        _assert_same_state(state_c, state_e, (point, call))


@pytest.mark.parametrize("fail_on", [1, 3], ids=["first call", "followed call"])
def test_a_compiled_call_whose_custom_backward_raises_leaves_the_state_eager_leaves(fail_on):
    eager, compiled = _calls("custom backward", fail_on, False), _calls("custom backward", fail_on, True)
    for call, ((error_e, state_e), (error_c, state_c)) in enumerate(zip(eager, compiled), 1):
        assert error_c == error_e, call
        _assert_same_state(state_c, state_e, call)


def test_the_leaf_grad_after_a_raise_after_backward_is_a_real_tensor():
    x = tg.ones(3, requires_grad=True)

    @tg.compile
    def f(x):
        (x * x).sum().backward()
        raise Boom("after backward")

    with pytest.raises(Boom):
        f(x)
    assert "tensor([2., 2., 2.])" in repr(x.grad)
    (x * 2).sum().backward()  # an eager backward accumulates into it
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 4.0, 4.0])
    x.grad = None
    f2 = tg.compile(lambda x: (x * 3).sum().backward())
    f2(x)
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0, 3.0])


def test_an_in_place_write_before_a_raise_is_applied_with_its_version():
    x = tg.ones(3)

    @tg.compile
    def f(x):
        x.add_(1)
        raise Boom("after the write")

    with pytest.raises(Boom):
        f(x)
    assert x._version == 1  # as eager: one in-place op, and its value
    np.testing.assert_allclose(x.numpy(), [2.0, 2.0, 2.0])


def _failing_builder(graph, **options):
    raise RuntimeError("the compiler failed")


@pytest.mark.parametrize("compiler", ["working", "failing"])
def test_the_exception_propagates_unchanged(compiler):
    # With a failing compiler the graph up to the raise cannot run: that error is dropped.
    raised = []

    def f(x):
        x.add_(1)  # (something for the call to apply)
        error = Boom("the message")
        raised.append(error)
        raise error

    compiled = tg.compile(f) if compiler == "working" else tg.compile(f, builder=_failing_builder)
    for _ in range(3):
        with pytest.raises(Boom) as info:
            compiled(tg.ones(2))
        assert info.value is raised[-1] and str(info.value) == "the message"
        assert info.value.__context__ is None and info.value.__cause__ is None
        innermost = traceback.extract_tb(info.value.__traceback__)[-1]
        assert innermost.name == "f" and innermost.line == "raise error"


def test_a_recording_of_a_failed_call_is_never_followed():
    # The failing call follows the recording of the calls before it; the calls after it
    # trace again (a cut trace of the failed call would give them its graph).
    calls = []

    def f(x, fail):
        y = (x * 2).sum()
        calls.append(fail)
        if fail:
            raise Boom("stop")
        return y * 3

    compiled = tg.compile(f)
    x = tg.tensor([1.0, 2.0])
    for fail in (False, False, True, False, False):
        if fail:
            with pytest.raises(Boom):
                compiled(x, True)
        else:
            assert compiled(x, False).item() == 18.0


# --- a call whose graph cannot run: everything as it was before the call -----------------


def _gather_step(model, opt, late: bool, computed: bool = False):
    def step(x, index):
        out = model(x)
        loss = (out * out).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        x.add_(1.0)
        if computed:  # (then checked when its step comes, which may follow the updates)
            index = index + 0
        picked = out.detach().reshape(-1).gather(0, index)  # out of bounds: raises when it runs
        if not late:
            picked.sum().item()  # (a realization point: it runs inside the call)
        return picked
    return step


@pytest.mark.parametrize("computed", [False, True], ids=["index argument", "index computed"])
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("late", [False, True], ids=["raised inside the call", "raised at its end"])
@pytest.mark.parametrize("fail_on", [1, 3], ids=["first call", "followed call"])
def test_a_call_whose_graph_cannot_run_changes_nothing(fail_on, late, optimizer, computed):
    model, opt = _model_and_optimizer(optimizer)
    compiled = tg.compile(_gather_step(model, opt, late, computed))
    x = tg.tensor(np.random.default_rng(1).normal(size=(5, 3)))
    good, bad = tg.tensor([0, 1, 2]), tg.tensor([0, 1, 50])
    for _ in range(fail_on - 1):
        compiled(x, good)
    before = _state(model, opt, x)
    with pytest.raises(IndexError, match="gather: index 50 is out of bounds for dimension 0 with size 10"):
        compiled(x, bad)
    _assert_same_state(_state(model, opt, x), before, "after the failed call")
    # The next calls go on as if the failed one had not happened: as eager's.
    compiled(x, good)
    model_e, opt_e = _model_and_optimizer(optimizer)
    x_e = tg.tensor(np.random.default_rng(1).normal(size=(5, 3)))
    step_e = _gather_step(model_e, opt_e, late, computed)
    for _ in range(fail_on):
        step_e(x_e, good)
    _assert_same_state(_state(model, opt, x), _state(model_e, opt_e, x_e), "after the next call")


def test_a_compiler_failure_changes_nothing():
    model, opt = _model_and_optimizer("sgd")
    x = tg.tensor(np.random.default_rng(1).normal(size=(5, 3)))
    before = _state(model, opt, x)
    compiled = tg.compile(_training_step(model, opt, "none"), builder=_failing_builder)
    with pytest.raises(RuntimeError, match="the compiler failed"):
        compiled(x, False)
    after = _state(model, opt, x)  # no lazy tensor left in .grad, the optimizer, the buffers
    _assert_same_state(after, before, "after the failed call")
    assert not opt.state and all(p.grad is None for p in model.parameters())


def test_a_call_that_cannot_finish_puts_back_rebound_buffers_and_assigned_grads():
    class Smoother(tg.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("average", tg.zeros(3, dtype=tg.float64))

        def forward(self, x):
            self.average = self.average * 0.5 + x  # a buffer rebound to a new tensor
            return self.average

    smoother = Smoother()
    w = tg.tensor([1.0, 2.0, 3.0], dtype=tg.float64, requires_grad=True)
    buffer, grad = smoother.average, tg.ones(3, dtype=tg.float64)
    w.grad = grad

    def step(x, index):
        w.grad = tg.zeros(3, dtype=tg.float64)  # an assigned .grad
        return smoother(x).gather(0, index)

    compiled = tg.compile(step)
    with pytest.raises(IndexError, match="gather: index 7 is out of bounds"):
        compiled(tg.ones(3, dtype=tg.float64), tg.tensor([7]))
    assert smoother.average is buffer and w.grad is grad
    np.testing.assert_allclose(buffer.numpy(), [0.0, 0.0, 0.0])
    compiled(tg.ones(3, dtype=tg.float64), tg.tensor([2]))
    np.testing.assert_allclose(smoother.average.numpy(), [1.0, 1.0, 1.0])
    np.testing.assert_allclose(w.grad.numpy(), [0.0, 0.0, 0.0])


def test_a_call_that_cannot_finish_puts_back_the_history_an_in_place_op_gave_a_real_tensor():
    buffer = tg.zeros(3, dtype=tg.float64)  # a real tensor the function captures
    w = tg.tensor([1.0, 2.0, 3.0], dtype=tg.float64, requires_grad=True)

    def step(index):
        buffer.add_(w * 2)  # buffer now requires grad, through this call's graph
        return buffer.gather(0, index)

    compiled = tg.compile(step)
    with pytest.raises(IndexError, match="gather: index 5 is out of bounds"):
        compiled(tg.tensor([5]))
    assert buffer.grad_fn is None and not buffer.requires_grad and buffer._version == 0
    np.testing.assert_allclose(buffer.numpy(), [0.0, 0.0, 0.0])
    picked = compiled(tg.tensor([2]))
    picked.sum().backward()
    np.testing.assert_allclose(picked.detach().numpy(), [6.0])
    np.testing.assert_allclose(w.grad.numpy(), [0.0, 0.0, 2.0])


def test_an_error_inside_the_tracer_changes_nothing(monkeypatch):
    from tracegrad.ir.structural_key import KeyedGraph
    model, opt = _model_and_optimizer("sgd")
    x = tg.tensor(np.random.default_rng(1).normal(size=(5, 3)))
    compiled = tg.compile(_training_step(model, opt, "none"))
    compiled(x, False)
    add_node = KeyedGraph.add_node
    appended = []

    def counting_add_node(graph, node):
        appended.append(node)
        add_node(graph, node)

    def failing_add_node(graph, node):  # fails half-way: the node appended, not keyed
        appended.append(node)
        if len(appended) == failing_at:
            graph.nodes.append(node)
            raise KeyError("inside the tracer")
        add_node(graph, node)

    monkeypatch.setattr(KeyedGraph, "add_node", counting_add_node)
    tg.compile(_training_step(model, opt, "none")).explain(x, False)  # (a call: apply it, then count)
    failing_at = len(appended) - 1  # the last parameter update's
    before = _state(model, opt, x)
    appended.clear()
    monkeypatch.setattr(KeyedGraph, "add_node", failing_add_node)
    with pytest.raises(KeyError, match="inside the tracer"):
        tg.compile(_training_step(model, opt, "none"))(x, False)
    monkeypatch.setattr(KeyedGraph, "add_node", add_node)
    _assert_same_state(_state(model, opt, x), before, "after the failed call")
    compiled(x, False)
    model_e, opt_e = _model_and_optimizer("sgd")
    x_e = tg.tensor(np.random.default_rng(1).normal(size=(5, 3)))
    step_e = _training_step(model_e, opt_e, "none")
    for _ in range(3):
        step_e(x_e, False)
    _assert_same_state(_state(model, opt, x), _state(model_e, opt_e, x_e), "after the next call")


def test_an_argument_made_to_require_grad_in_a_call_that_cannot_finish_is_put_back(monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("no program")

    def step(x):
        x.requires_grad_()
        (x * x).sum().backward()
        return x * 1

    compiled = tg.compile(step)
    monkeypatch.setattr(compiled, "_program", fail)
    x = tg.ones(3)
    with pytest.raises(RuntimeError, match="no program"):
        compiled(x)
    assert not x.requires_grad and x.grad is None
