"""Autograd semantics inside `@tg.compile` are eager semantics (issue 20, classes 1, 5, 7,
9 and 13): which tensors are leaves, where gradients stop, retained gradients, custom
Functions, in-place ops on tensors with history, and gradients flowing into graphs
recorded eagerly outside the call.

Each pattern runs eagerly and compiled on twin states: calls 1, 2 and 3 with the same
values (a followed call and the backward templates take over from the second), then calls
with new values; every result and gradient must be the eager one.
"""

import gc
import weakref

import numpy as np
import pytest

import tracegrad as tg

SEEDS = (0, 0, 0, 1, 2)  # per call: the values of its state


def _arrays(things) -> list:
    """Results and gradients as arrays (None stays None), flattened."""
    flat = []
    for thing in things:
        if isinstance(thing, (list, tuple)):
            flat.extend(_arrays(thing))
        elif hasattr(thing, "detach"):  # a tracegrad (or PyTorch) tensor
            flat.append(np.array(thing.detach().numpy(), copy=True))
        else:
            flat.append(thing)
    return flat


def _assert_same(got: list, want: list) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        if w is None or g is None:
            assert g is None and w is None, f"item {i}: compiled {g!r}, eager {w!r}"
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"item {i}")


def _check(step, make):
    """Run `step` eagerly and compiled on the states `make(seed)` builds, one per call;
    `make` returns (arguments, a function giving the tensors to compare after the call)."""
    compiled = tg.compile(step)
    for seed in SEEDS:
        outcomes = []
        for fn in (step, compiled):
            args, watched = make(seed)
            result = fn(*args)
            outcomes.append(_arrays([result, watched()]))
        _assert_same(outcomes[1], outcomes[0])
    return compiled


def _values(seed: int, *shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# --- class 1: detach().requires_grad_() and requires_grad_() on traced results ----------------


def _encoder_and_head(seed: int):
    tg.manual_seed(seed)
    return tg.nn.Linear(3, 3), tg.nn.Linear(3, 1)


def test_detach_requires_grad_of_a_module_output_cuts_the_graph_when_compiled():
    def make(seed):
        enc, head = _encoder_and_head(seed)
        x = tg.tensor(_values(seed, 2, 3))
        return (enc, head, x), lambda: [enc.weight.grad, enc.bias.grad, head.weight.grad, head.bias.grad]

    def step(enc, head, x):
        f = enc(x).detach().requires_grad_()
        head(f).pow(2).mean().backward()
        return f.grad

    _check(step, make)


def test_detached_product_made_a_leaf_then_multiplied_by_its_source_when_compiled():
    def make(seed):
        x = tg.tensor(_values(seed, 3), requires_grad=True)
        return (x,), lambda: [x.grad]

    def step(x):
        y = (2 * x).detach().requires_grad_() * x
        y.sum().backward()
        return y.detach()

    _check(step, make)


def test_requires_grad_on_a_no_grad_result_makes_a_leaf_when_compiled():
    def make(seed):
        x = tg.tensor(_values(seed, 3), requires_grad=True)
        return (x,), lambda: [x.grad]

    def step(x):
        with tg.no_grad():
            y = x * 2
        y.requires_grad_()
        (y * x).sum().backward()
        return y.grad

    _check(step, make)


@pytest.mark.parametrize("make_leaf", [lambda: tg.tensor([-4.0]).double().requires_grad_(),
                                       lambda: tg.tensor([-4.0, 1.5]).clone().requires_grad_()],
                         ids=["double", "clone"])
def test_a_constant_made_a_leaf_inside_a_compiled_function_gets_its_grad(make_leaf):
    def step(x):
        t = make_leaf()
        (t * t * x.sum()).sum().backward()
        return t.grad

    def make(seed):
        x = tg.tensor(_values(seed, 2), requires_grad=True)
        return (x,), lambda: [x.grad]

    _check(step, make)


def test_a_leaf_made_inside_a_compiled_function_is_a_leaf_with_its_grad_after_the_call():
    def step():
        t = tg.tensor([-4.0]).double().requires_grad_()
        (t * t).sum().backward()
        return t

    compiled = tg.compile(step)
    for _ in range(3):
        t = compiled()
        assert t.is_leaf and t.requires_grad
        np.testing.assert_allclose(t.grad.numpy(), [-8.0])


# --- class 5: retain_grad ------------------------------------------------------------------


def test_retain_grad_of_an_intermediate_gives_its_gradient_when_compiled():
    def make(seed):
        x = tg.tensor(_values(seed, 3), requires_grad=True)
        z = tg.tensor(_values(seed + 10, 3), requires_grad=True)
        return (x, z), lambda: [x.grad, z.grad]

    def step(x, z):
        y = x + z  # (add passes its gradient on: y's and x's must not be one buffer)
        y.retain_grad()
        (y * y).sum().backward()
        w = y * 2
        w.retain_grad()
        (w + x).sum().backward()  # y's gradient accumulates
        return y, y.grad, w.grad

    compiled = _check(step, make)
    x, z = tg.tensor(_values(0, 3), requires_grad=True), tg.tensor(_values(10, 3), requires_grad=True)
    y = compiled(x, z)[0]
    assert y.grad.numpy().dtype == np.float32


def test_a_retained_gradient_is_a_buffer_of_its_own_when_compiled():
    def step(x, z):
        y = x + z  # add passes its gradient on to x and z unchanged
        y.retain_grad()
        (y * 3).sum().backward()
        return y

    compiled = tg.compile(step)
    for seed in SEEDS:
        x, z = tg.tensor(_values(seed, 3), requires_grad=True), tg.tensor(_values(seed + 10, 3), requires_grad=True)
        y = compiled(x, z)
        x.grad.add_(100.0)  # another tensor's .grad, updated in place
        np.testing.assert_allclose(y.grad.numpy(), np.full(3, 3.0, np.float32))


# --- class 7: custom autograd.Function -----------------------------------------------------


class _Square(tg.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class _Scale(tg.autograd.Function):  # saves no tensor
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x * factor

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


class _ProductAndSum(tg.autograd.Function):  # several outputs, one not differentiable
    @staticmethod
    def forward(ctx, x, y):
        product = x * y
        ctx.save_for_backward(x, y, product)
        positive = (x > 0).long()
        ctx.mark_non_differentiable(positive)
        return product, x + y, positive

    @staticmethod
    def backward(ctx, grad_product, grad_sum, grad_positive):
        x, y, _ = ctx.saved_tensors
        return grad_product * y + grad_sum, grad_product * x + grad_sum


def _custom_state(seed):
    x = tg.tensor(_values(seed, 3), requires_grad=True)
    y = tg.tensor(_values(seed + 10, 3), requires_grad=True)
    w = tg.tensor(_values(seed + 20, 3))  # does not require grad
    return (x, y, w), lambda: [x.grad, y.grad]


def test_a_custom_function_whose_input_requires_grad_differentiates_when_compiled():
    def step(x, y, w):
        _Square.apply(x).sum().backward()
        return x.grad

    compiled = _check(step, _custom_state)
    assert compiled.cache_info().graphs == 1  # one program for every call of the Function


def test_custom_functions_with_and_without_saved_tensors_and_inputs_without_grad_when_compiled():
    def step(x, y, w):
        a = _Scale.apply(_Square.apply(x), 3.0)
        product, total, positive = _ProductAndSum.apply(a, y)
        unrecorded = _Square.apply(w)
        assert not positive.requires_grad and not unrecorded.requires_grad
        loss = (product * total).sum() + unrecorded.sum() + positive.sum()
        loss.backward()
        return loss.detach(), product.detach(), positive

    compiled = _check(step, _custom_state)
    assert compiled.cache_info().graphs == 1


class _SignAndDouble(tg.autograd.Function):  # the first output is not floating
    @staticmethod
    def forward(ctx, x):
        return (x > 0).long(), x * 2

    @staticmethod
    def backward(ctx, grad_sign, grad_double):
        return grad_double * 2


def test_a_custom_function_whose_first_output_is_an_integer_differentiates_when_compiled():
    def step(x, y, w):
        sign, doubled = _SignAndDouble.apply(x)
        (doubled * sign).sum().backward()

    _check(step, _custom_state)


def test_backward_after_a_compiled_call_goes_through_its_custom_function():
    def step(x, y, w):
        return _ProductAndSum.apply(_Square.apply(x), y)[0]

    compiled = tg.compile(step)
    for seed in SEEDS:
        grads = []
        for fn in (step, compiled):
            (x, y, w), watched = _custom_state(seed)
            fn(x, y, w).sum().backward()
            grads.append(_arrays(watched()))
        _assert_same(grads[1], grads[0])


# --- class 9: in-place ops on arguments with history ---------------------------------------


def _argument_with_history(seed):
    w = tg.tensor(_values(seed, 3), requires_grad=True)
    return w, w * 2


@pytest.mark.parametrize("update", ["add_", "sub_", "mul_", "div_"])
def test_an_inplace_op_on_a_non_leaf_argument_then_backward_outside_the_call(update):
    def step(v):
        getattr(v, update)(3.0)
        return (v * v).sum()

    _assert_backward_from_outside_reaches_the_argument_s_history(step)


def _assert_backward_from_outside_reaches_the_argument_s_history(step):
    """A backward after the call, eager and compiled (first and followed calls), sends the
    same gradients into the history of the argument."""
    compiled = tg.compile(step)
    for seed in SEEDS:
        grads = []
        for fn in (step, compiled):
            w, v = _argument_with_history(seed)
            fn(v).backward()
            grads.append(_arrays([w.grad]))
        _assert_same(grads[1], grads[0])


def test_a_non_leaf_argument_updated_in_place_keeps_the_new_history_after_the_call():
    def step(v):
        v.exp_()
        return v.is_leaf

    compiled = tg.compile(step)
    for seed in SEEDS:
        grads = []
        for fn in (step, compiled):
            w, v = _argument_with_history(seed)
            assert fn(v) is False
            (v * v).sum().backward()  # through the in-place op, then through w * 2
            grads.append(_arrays([w.grad, v]))
        _assert_same(grads[1], grads[0])


def test_a_non_leaf_argument_updated_without_grad_keeps_its_history_when_compiled():
    def step(v):
        with tg.no_grad():
            v.mul_(2.0)
        (v * v).sum().backward()

    compiled = tg.compile(step)
    for seed in SEEDS:
        grads = []
        for fn in (step, compiled):
            w, v = _argument_with_history(seed)
            fn(v)
            grads.append(_arrays([w.grad, v]))
        _assert_same(grads[1], grads[0])


def test_a_traced_result_updated_without_grad_keeps_its_history():
    def make(seed):
        x = tg.tensor(_values(seed, 3), requires_grad=True)
        return (x,), lambda: [x.grad]

    def step(x):
        y = x * 2
        with tg.no_grad():
            y.mul_(3.0)
        (y * x).sum().backward()
        return y.detach()

    _check(step, make)


def test_autograd_grad_wrt_a_leaf_updated_without_grad_sums_every_path_when_compiled():
    def make(seed):
        w = tg.tensor(_values(seed, 3), requires_grad=True)
        return (w, w * 2), lambda: [w]

    def step(w, x):
        with tg.no_grad():
            w.add_(1.0)
        y = w * 2  # (reads the first update; `x` the value before the call)
        with tg.no_grad():
            w.mul_(2.0)
        return tg.autograd.grad((x * x).sum() + (w * w).sum() + (y * y).sum(), [w, x])

    _check(step, make)


# --- class 13: losses built from tensors recorded outside the call --------------------------


def _outside_outputs(lin, seed: int, n: int = 4) -> list:
    x = tg.tensor(_values(seed, n, 3))
    return [lin(x[i]).sum() for i in range(n)]


def test_backward_inside_a_compiled_call_reaches_leaves_of_tensors_recorded_outside():
    def step(lin, outs):
        tg.stack(outs).sum().backward()

    def make(seed):
        tg.manual_seed(0)
        lin = tg.nn.Linear(3, 1)
        return (lin, _outside_outputs(lin, seed)), lambda: [lin.weight.grad, lin.bias.grad]

    _check(step, make)


def test_a_compiled_call_reading_outside_tensors_by_closure_differentiates_into_them():
    state = {}

    def step():
        (tg.stack(state["outs"]) * 3).sum().backward()

    def make(seed):
        tg.manual_seed(0)
        lin = tg.nn.Linear(3, 1)
        state["outs"] = _outside_outputs(lin, seed)
        return (), lambda: [lin.weight.grad, lin.bias.grad]

    _check(step, make)


def test_autograd_grad_inside_a_compiled_call_wrt_a_parameter_and_an_outside_tensor():
    def step(lin, outs):
        loss = tg.stack(outs).pow(2).sum()
        return tg.autograd.grad(loss, [lin.weight, outs[1]])

    def make(seed):
        tg.manual_seed(0)
        lin = tg.nn.Linear(3, 1)
        return (lin, _outside_outputs(lin, seed)), lambda: [lin.weight.grad]

    _check(step, make)


def test_backward_after_a_compiled_call_goes_on_into_its_arguments_history():
    def step(v):
        return (v * v).sum()

    _assert_backward_from_outside_reaches_the_argument_s_history(step)


def _actor_critic(seed: int):
    tg.manual_seed(seed)
    actor, critic = tg.nn.Linear(3, 2), tg.nn.Linear(3, 1)
    optimizer = tg.optim.Adam([*actor.parameters(), *critic.parameters()], lr=1e-2)
    return actor, critic, optimizer


def _update(optimizer, log_probs, values, returns):
    log_probs, values = tg.stack(log_probs), tg.stack(values)
    advantage = returns - values.detach()
    loss = -(log_probs * advantage).mean() + ((returns - values) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach()


def _train_actor_critic(update, episodes: int = 25) -> tuple[list, list]:
    """One compiled update per episode, on log-probs and values collected eagerly during
    it (a new list of tensors every call)."""
    actor, critic, optimizer = _actor_critic(0)
    rng = np.random.default_rng(1)
    losses = []
    for _ in range(episodes):
        log_probs, values = [], []
        for t in range(5):
            state = tg.tensor(rng.standard_normal(3).astype(np.float32))
            log_probs.append(tg.log_softmax(actor(state), 0)[t % 2])
            values.append(critic(state).sum())
        returns = tg.tensor(rng.standard_normal(5).astype(np.float32))
        losses.append(update(optimizer, log_probs, values, returns).item())
    return losses, _arrays([*actor.parameters(), *critic.parameters()])


def test_actor_critic_updates_on_outside_tensors_train_as_eager_with_one_graph():
    want_losses, want_parameters = _train_actor_critic(_update)
    compiled = tg.compile(_update)
    losses, parameters = _train_actor_critic(compiled)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-4, atol=1e-6)
    _assert_same(parameters, want_parameters)
    assert compiled.cache_info().graphs == 1  # not one per list of outside tensors


def test_a_compiled_call_alternating_leaf_and_non_leaf_arguments_sends_gradients_to_each():
    def step(v):
        (v * 3).sum().backward()

    compiled = tg.compile(step)
    for seed in SEEDS:
        for with_history in (False, True, True, False):  # (one backward structure, two meanings)
            grads = []
            for fn in (step, compiled):
                w = tg.tensor(_values(seed, 3), requires_grad=True)
                fn(w + 1 if with_history else w)
                grads.append(_arrays([w.grad]))
            _assert_same(grads[1], grads[0])


def test_a_compiled_call_does_not_keep_the_history_of_its_arguments_alive():
    compiled = tg.compile(lambda v: (v * 3).detach())
    for seed in SEEDS:
        w = tg.tensor(_values(seed, 3), requires_grad=True)
        v = w * 2
        node = weakref.ref(v.grad_fn)
        compiled(v)
        del v
        gc.collect()
        assert node() is None


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_backward_with_inputs_inside_a_compiled_call_fills_the_arguments_grads():
    def step(v, w):
        (v * v * w).sum().backward(inputs=[v, w])

    compiled = tg.compile(step)
    for seed in SEEDS:
        grads = []
        for fn in (step, compiled):
            w = tg.tensor(_values(seed, 3), requires_grad=True)
            v = w * 2  # an argument with history, and a leaf one
            fn(v, w)
            grads.append(_arrays([v.grad, w.grad]))
        _assert_same(grads[1], grads[0])


# --- the same patterns against PyTorch ------------------------------------------------------


def _leaf(lib, seed: int, n: int = 3):
    return lib.tensor(_values(seed, n), requires_grad=True)


def _detached_product(lib, seed):
    x = _leaf(lib, seed)

    def step(x):
        y = (2 * x).detach().requires_grad_() * x
        y.sum().backward()
    return step, (x,), lambda: [x.grad]


def _no_grad_result_made_leaf(lib, seed):
    x = _leaf(lib, seed)

    def step(x):
        with lib.no_grad():
            y = x * 2
        y.requires_grad_()
        (y * x).sum().backward()
        return y.grad
    return step, (x,), lambda: [x.grad]


def _retained(lib, seed):
    x = _leaf(lib, seed)

    def step(x):
        y = x * 2 + 1
        y.retain_grad()
        (y * y).sum().backward()
        return y.grad
    return step, (x,), lambda: [x.grad]


def _inplace_on_history(lib, seed):
    w = _leaf(lib, seed)
    v = w * 2

    def step(v):
        v.add_(3.0)
        with lib.no_grad():
            v.mul_(0.5)
        (v * v).sum().backward()
    return step, (v,), lambda: [w.grad]


def _outside_outputs_loss(lib, seed):
    w = _leaf(lib, seed)
    x = lib.tensor(_values(seed + 1, 4, 3))
    outs = [(x[i] * w).sum().tanh() for i in range(4)]

    def step(outs):
        lib.stack(outs).pow(2).sum().backward()
    return step, (outs,), lambda: [w.grad]


@pytest.mark.parametrize("pattern", [_detached_product, _no_grad_result_made_leaf, _retained,
                                     _inplace_on_history, _outside_outputs_loss])
def test_compiled_autograd_patterns_give_pytorchs_gradients(pattern):
    torch = pytest.importorskip("torch")
    compiled = {}
    for seed in SEEDS:
        step, args, watched = pattern(torch, seed)
        want = _arrays([step(*args), watched()])
        step, args, watched = pattern(tg, seed)
        compiled.setdefault("fn", tg.compile(step))  # (one compiled function: the first call's)
        got = _arrays([compiled["fn"](*args), watched()])
        _assert_same(got, want)


def _argument_made_to_require_grad(x):
    view = x[0:2, None]  # (a view taken before: the argument is known to the trace by then)
    x.requires_grad_()
    loss = (x * x).sum() * 0.5 + view.sum()
    loss.backward()
    return loss


def test_requires_grad_on_an_argument_inside_a_compiled_call_gives_the_argument_its_grad():
    # (Found by tests/fuzz: the stand-in became a leaf of its own, and the argument's .grad
    # stayed None.)
    compiled = tg.compile(_argument_made_to_require_grad)
    for scale in (1.0, 2.0, 3.0):  # the first call, then followed ones
        eager_x, compiled_x = tg.ones(4) * scale, tg.ones(4) * scale
        expected = _argument_made_to_require_grad(eager_x)
        result = compiled(compiled_x)
        np.testing.assert_allclose(result.detach().numpy(), expected.detach().numpy())
        assert compiled_x.requires_grad and compiled_x.is_leaf
        np.testing.assert_allclose(compiled_x.grad.numpy(), eager_x.grad.numpy())


def _argument_written_then_made_to_require_grad(x):
    with tg.no_grad():
        x.div_(0.25)
    x.requires_grad_()
    loss = (x.softmax(0) * x).sum()
    loss.backward()
    return loss


def test_requires_grad_on_an_argument_written_in_the_call_gives_the_argument_its_grad():
    # (Found by tests/fuzz: the gradient went to a copy of the written value.)
    compiled = tg.compile(_argument_written_then_made_to_require_grad)
    for scale in (1.0, 2.0, 3.0):
        eager_x, compiled_x = tg.arange(3.0) * scale, tg.arange(3.0) * scale
        _argument_written_then_made_to_require_grad(eager_x)
        compiled(compiled_x)
        np.testing.assert_allclose(compiled_x.detach().numpy(), eager_x.detach().numpy())
        np.testing.assert_allclose(compiled_x.grad.numpy(), eager_x.grad.numpy(), rtol=1e-6)


def _backward_from_a_leaf_made_in_the_call(x):
    leaf = (x * 2).detach().requires_grad_()
    leaf.backward(tg.ones_like(leaf) * 3)
    return leaf.grad


def test_backward_from_a_leaf_made_in_a_compiled_call_fills_its_own_grad():
    # (Found by tests/fuzz: the walk went into the copy that made the leaf; .grad None.)
    compiled = tg.compile(_backward_from_a_leaf_made_in_the_call)
    for _ in range(3):
        expected = _backward_from_a_leaf_made_in_the_call(tg.ones(3))
        np.testing.assert_array_equal(compiled(tg.ones(3)).numpy(), expected.numpy())


# --- autograd.grad w.r.t. a leaf the call updated without grad --------------------------------


def _grad_wrt_a_leaf_read_before_and_after_an_update(x):
    before = x * 2
    with tg.no_grad():
        x.add_(1.0)
    after = x * 3
    return tg.autograd.grad((before + after).sum(), [x])


def test_autograd_grad_wrt_a_leaf_updated_without_grad_sums_reads_before_and_after_the_update():
    # (Found by tests/fuzz, seed 105410: the gradient through the read before the update
    # was lost; the target was the updated value, the read its old graph input.)
    def make(seed):
        return (tg.tensor(_values(seed, 3), requires_grad=True),), lambda: []

    _check(_grad_wrt_a_leaf_read_before_and_after_an_update, make)


def _grad_wrt_a_leaf_updated_and_read_through_a_view_argument(x, view):
    with tg.no_grad():
        x.add_(1.0)
    loss = (view * view).sum()
    return tg.autograd.grad(loss, [x], allow_unused=True)


def test_autograd_grad_wrt_an_empty_leaf_updated_in_the_call_and_read_through_its_view_when_compiled():
    # (Found by tests/fuzz, seed 104156: the view argument's history reaches the leaf as it
    # was before the update, so compiled gave None where eager gives an empty gradient.)
    def make(seed):
        x = tg.tensor(_values(seed, 2, 0), requires_grad=True)
        return (x, x.transpose(0, 1)), lambda: []

    _check(_grad_wrt_a_leaf_updated_and_read_through_a_view_argument, make)
