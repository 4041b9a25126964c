"""A compiled function whose calls keep making new graphs runs calls eagerly (`jit.backoff`):
same results and side effects as eager execution, and traced again once its graphs settle."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.jit import backoff
from tracegrad.jit.backoff import EagerBackoff


def _state(seed):
    rng = np.random.default_rng(seed)
    w = tg.tensor(rng.standard_normal((3, 3)) * 0.4, requires_grad=True)
    return w, tg.zeros(3, 3)


def _rnn_step(w, momentum):
    """A per-sequence RNN step: one iteration per row, so each length is a graph of its own;
    `limit` stops the loop once the state's size passes it (a value Python asks for)."""
    def step(x, limit=None):
        h = tg.zeros(3)
        for row in x:
            h = tg.tanh(row + h @ w)
            if limit is not None and h.abs().sum().item() > limit.item():
                break
        loss = (h * h).sum()
        loss.backward()
        with tg.no_grad():
            momentum.mul_(0.9).add_(w.grad)
            w.sub_(0.05 * momentum)
            w.grad = None
        return loss
    return step


def _run_both(lengths, seed=0, **options):
    """Call the compiled step and its eager twin on sequences of `lengths`; check every
    result and the parameters after each call; the compiled function."""
    w, momentum = _state(seed)
    w_eager, momentum_eager = _state(seed)
    compiled = tg.compile(_rnn_step(w, momentum), **options)
    eager = _rnn_step(w_eager, momentum_eager)
    rng = np.random.default_rng(seed + 1)
    for length in lengths:
        x = rng.standard_normal((length, 3))
        got, want = compiled(tg.tensor(x)), eager(tg.tensor(x))
        np.testing.assert_allclose(got.item(), want.item(), rtol=1e-10)
        np.testing.assert_allclose(w.detach().numpy(), w_eager.detach().numpy(), rtol=1e-10)
        np.testing.assert_allclose(momentum.numpy(), momentum_eager.numpy(), rtol=1e-10)
    return compiled


def test_calls_that_keep_making_new_graphs_run_eagerly_with_eagers_results():
    compiled = _run_both(range(1, 25))  # a new length on every call
    info = compiled.cache_info()
    # The first three calls trace (the third is the second recompile: unsettled), the rest
    # have arguments of shapes no call had before: eager.
    assert (info.graphs, info.eager_calls) == (3, 21)
    assert compiled._backoff.unsettled


def test_shapes_that_come_back_trace_from_their_second_sighting_and_then_hit():
    lengths = [5, 7, 3, 12, 8, 6]  # a few sequences, one pass after the other (W10)
    compiled = _run_both(lengths * 4)
    info = compiled.cache_info()
    assert info.eager_calls == 3 and info.graphs == len(lengths)  # (the first pass's last three)
    before = compiled.cache_info()
    for length in lengths:
        compiled(tg.tensor(np.ones((length, 3))))
    after = compiled.cache_info()
    assert after.eager_calls == before.eager_calls and after.misses == before.misses
    assert after.hits >= before.hits + len(lengths)
    assert not compiled._backoff.unsettled


def test_a_graph_made_while_unsettled_gets_its_kernels_when_it_runs_again():
    compiled = _run_both(list(range(1, 12)) + [5])  # (length 5: run eagerly, then traced)
    (program,) = [p for p in compiled._programs.values() if p.interpreted]
    assert program.kernel_count == 0
    compiled(tg.tensor(np.ones((5, 3))))
    assert not any(p.interpreted for p in compiled._programs.values()) and program.kernel_count > 0


def test_a_graph_that_changes_with_the_data_traces_every_call():
    # A stop test per iteration (W11): the arguments' shapes never change, so every call
    # traces, unsettled or not, and matches eager execution.
    w, momentum = _state(3)
    w_eager, momentum_eager = _state(3)
    compiled, eager = tg.compile(_rnn_step(w, momentum)), _rnn_step(w_eager, momentum_eager)
    x = tg.tensor(np.random.default_rng(2).standard_normal((12, 3)))
    for call in range(16):
        limit = tg.tensor(0.4 + 0.15 * call)  # (a stop after ever more rows: a new graph per call)
        np.testing.assert_allclose(compiled(x, limit).item(), eager(x, limit).item(), rtol=1e-10)
        np.testing.assert_allclose(w.detach().numpy(), w_eager.detach().numpy(), rtol=1e-10)
    info = compiled.cache_info()
    assert info.eager_calls == 0 and info.misses > 3


def test_one_new_graph_now_and_then_never_runs_a_call_eagerly():
    lengths = [4 if call % 10 else 5 + call // 10 for call in range(1, 60)]  # a new length every 10th call
    compiled = _run_both(lengths)
    assert compiled.cache_info().eager_calls == 0 and not compiled._backoff.unsettled


def test_eager_fallback_false_traces_every_call():
    compiled = _run_both(range(1, 9), eager_fallback=False)
    info = compiled.cache_info()
    assert info.eager_calls == 0 and info.graphs == 8


def test_cache_clear_forgets_the_calls_so_the_next_call_traces():
    compiled = _run_both(range(1, 12))
    assert compiled._backoff.unsettled
    compiled.cache_clear()
    assert compiled.cache_info().eager_calls == 0 and not compiled._backoff.unsettled
    compiled(tg.tensor(np.ones((20, 3))))
    assert compiled.cache_info().misses == 1


def test_an_error_in_a_call_run_eagerly_is_the_functions_own():
    @tg.compile
    def picky(x):
        if x.shape[0] == 7:
            raise ValueError("seven rows")
        return (x * 2).sum()

    for n in range(1, 7):
        picky(tg.ones(n, 2))
    eager_calls = picky.cache_info().eager_calls
    assert eager_calls > 0
    with pytest.raises(ValueError, match="seven rows"):
        picky(tg.ones(7, 2))
    assert picky.cache_info().eager_calls == eager_calls + 1
    assert picky(tg.ones(3, 2)).item() == 12.0


def test_a_second_recompile_within_the_window_makes_the_function_unsettled():
    policy = EagerBackoff()
    policy.traced_call(None, False)  # the first call
    policy.traced_call(None, True)   # one recompile: settled still
    assert not policy.unsettled
    policy.traced_call(("a",), True)
    assert policy.unsettled
    assert not policy.take_eager(("a",))  # (the types of the call that recompiled: seen)
    assert policy.take_eager(("b",)) and not policy.take_eager(("b",))
    assert policy.eager_calls == 1
    policy.traced_call(("b",), False)  # no new graph: settled
    assert not policy.unsettled


def test_the_argument_types_remembered_are_the_most_recent():
    policy = EagerBackoff()
    policy.traced_call(None, True)
    policy.traced_call(None, True)
    for n in range(backoff.SIGNATURES + 1):
        assert policy.take_eager((n,))
    assert len(policy.seen) == backoff.SIGNATURES and (0,) not in policy.seen
    assert policy.take_eager((0,))


def test_recompiles_further_apart_than_the_window_never_make_a_function_unsettled():
    policy = EagerBackoff()
    for call in range(5 * backoff.WINDOW):
        policy.traced_call(None, call % (backoff.WINDOW + 1) == 0)
        assert not policy.unsettled
