"""An op with an index operand whose result no one reads: eager execution runs it and
raises its out-of-bounds error, so a compiled call raises the same error although its
program drops the op, before anything the call did reaches a tensor, a `.grad` or the
optimizer state (`tracegrad/jit/checks.py`)."""

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F

BACKENDS = ["llvm", "interpret", "interpret-optimized", "reference"]


def _compiled(fn, backend: str):
    if backend == "reference":
        compiled = tg.compile(fn)

        def in_reference_mode(*args):
            with tg.reference_mode():
                return compiled(*args)
        return in_reference_mode
    return tg.compile(fn, backend=backend)


def _error(fn, *args) -> tuple[type, str] | None:
    try:
        fn(*args)
    except Exception as raised:  # noqa: BLE001 - the error itself is compared
        return type(raised), str(raised)
    return None


def _unused_gather(x, index):
    x.gather(1, index)
    return x * 2


def _unused_cross_entropy(logits, labels):
    F.cross_entropy(logits, labels)
    return logits.sum()


def _unused_computed_index(x, index):
    x[index - 10]
    return x + 1


def _unused_computed_embedding(x, index):
    F.embedding(index * 2, tg.ones(5, 2))
    return x.exp()


def _unused_cross_entropy_after_a_realization(logits, labels):
    scale = logits.sum().item()  # (the call's last program is its rest from here)
    F.cross_entropy(logits, labels)
    return logits * scale


def _gather_only_a_pass_drops(x, index):
    mask = x.gather(1, index) > 0  # read, but the IR passes drop it: where(c, a, a) is a
    return tg.where(mask, x[:, :1], x[:, :1])


CASES = {
    "gather negative index": (_unused_gather, lambda: (tg.ones(2, 3), tg.tensor([[-1], [0]]))),
    "gather index past the end": (_unused_gather, lambda: (tg.ones(2, 3), tg.tensor([[1], [3]]))),
    "cross_entropy label in [-C, -1]": (_unused_cross_entropy,
                                        lambda: (tg.ones(4, 3), tg.tensor([0, -3, 1, 2]))),
    "index computed in the call": (_unused_computed_index, lambda: (tg.ones(4), tg.tensor([1, 2]))),
    "embedding rows computed in the call": (_unused_computed_embedding,
                                            lambda: (tg.ones(3), tg.tensor([[0], [-1]]))),
    "gather the IR passes drop": (_gather_only_a_pass_drops, lambda: (tg.ones(2, 3), tg.tensor([[-1], [0]]))),
    "cross_entropy after a realization": (_unused_cross_entropy_after_a_realization,
                                          lambda: (tg.ones(4, 3), tg.tensor([0, -3, 1, 2]))),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_an_unused_op_with_an_index_out_of_bounds_raises_its_eager_error_when_compiled(case, backend):
    fn, arguments = CASES[case]
    expected = _error(fn, *arguments())
    assert expected is not None and expected[0] is IndexError
    assert _error(_compiled(fn, backend), *arguments()) == expected


@pytest.mark.parametrize("case", list(CASES))
def test_an_unused_op_with_an_index_out_of_bounds_raises_in_a_followed_call(case):
    fn, arguments = CASES[case]
    good = {"gather negative index": tg.tensor([[0], [2]]), "gather index past the end": tg.tensor([[0], [2]]),
            "cross_entropy label in [-C, -1]": tg.tensor([0, 2, 1, 2]),
            "index computed in the call": tg.tensor([9, 12]),
            "embedding rows computed in the call": tg.tensor([[0], [2]]),
            "gather the IR passes drop": tg.tensor([[0], [2]]),
            "cross_entropy after a realization": tg.tensor([0, 2, 1, 2])}[case]
    compiled = tg.compile(fn)
    first, bad = arguments()
    for _ in range(2):
        compiled(first, good)
    assert _error(compiled, first, bad) == _error(fn, first, bad)
    compiled(first, good)  # (and the next call goes on)


def _model_and_optimizer():
    tg.manual_seed(0)
    model = tg.nn.Linear(3, 2).double()
    return model, tg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _state(model, optimizer, x) -> list:
    state = [x.numpy().copy(), x._version]
    for p in model.parameters():
        state += [p.detach().numpy().copy(), p._version, None if p.grad is None else p.grad.numpy().copy()]
    for per_parameter in optimizer.state.values():
        state += [v.numpy().copy() if isinstance(v, tg.Tensor) else v for v in per_parameter.values()]
    return state


def _assert_same_state(actual: list, expected: list) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        if isinstance(want, np.ndarray) or isinstance(got, np.ndarray):
            np.testing.assert_array_equal(got, want)
        else:
            assert got == want


def _step_with_an_unused_check(model, optimizer, computed: bool):
    def step(x, labels):
        out = model(x)
        loss = (out * out).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        x.add_(1.0)
        if computed:
            labels = labels + 0
        F.cross_entropy(out.detach(), labels)  # unused: its labels are checked all the same
        return loss
    return step


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("computed", [False, True], ids=["labels argument", "labels computed"])
@pytest.mark.parametrize("fail_on", [1, 3], ids=["first call", "followed call"])
def test_an_unused_check_failing_leaves_the_state_as_before_the_call(fail_on, computed, backend):
    model, optimizer = _model_and_optimizer()
    compiled = _compiled(_step_with_an_unused_check(model, optimizer, computed), backend)
    x = tg.tensor(np.random.default_rng(1).normal(size=(5, 3)))
    good, bad = tg.tensor([0, 1, 1, 0, 1]), tg.tensor([0, 1, -2, 0, 1])
    for _ in range(fail_on - 1):
        compiled(x, good)
    before = _state(model, optimizer, x)
    with pytest.raises(IndexError, match=r"cross_entropy: Target -2 is out of bounds\."):
        compiled(x, bad)
    _assert_same_state(_state(model, optimizer, x), before)
    compiled(x, good)  # the next call goes on as if the failed one had not happened
    model_e, optimizer_e = _model_and_optimizer()
    x_e = tg.tensor(np.random.default_rng(1).normal(size=(5, 3)))
    step_e = _step_with_an_unused_check(model_e, optimizer_e, computed)
    for _ in range(fail_on):
        step_e(x_e, good)
    np.testing.assert_allclose(model.weight.detach().numpy(), model_e.weight.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(x.numpy(), x_e.numpy(), rtol=1e-12)


def test_results_realized_in_the_call_come_after_the_values_an_unused_index_check_reads():
    # The last program also returns the computed index its check reads (after its outputs),
    # and the values a realization computed are results too: each result is its own.
    def fn(x, index):
        h = x * 2
        scale = h.sum().item()  # (realizes h: alive)
        x[index - 10]  # (an unused op with a computed index)
        return h, x + scale, index * 1

    compiled = tg.compile(fn)
    for _ in range(3):
        x, index = tg.arange(4.0), tg.tensor([11, 12])
        got, want = compiled(x, index), fn(x, index)
        for g, w in zip(got, want):
            assert g.dtype is w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g.numpy(), w.numpy())
    assert _error(compiled, tg.arange(4.0), tg.tensor([11, 30])) == _error(fn, tg.arange(4.0), tg.tensor([11, 30]))
