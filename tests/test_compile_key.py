"""The compile cache key: the key a trace builds while recording equals the structural key
of the graph it recorded, and programs of pruned graphs are fed the right inputs."""

import numpy as np

import tracegrad as tg
from tracegrad.jit.function import CompiledFunction, key_with_donations
from tracegrad.ir.structural_key import alias_pattern, structural_key

W = tg.randn(3, dtype=tg.float64, requires_grad=True)


def _with_captures_and_backward(x):
    y = (x * W).tanh()          # W is captured after x's first op
    z = y.sum() * W.sum()
    z.backward()                # gradient inputs (the seed) join the graph late
    return z


def _with_dead_code(x, unused):
    _ = (unused * 2.0).exp()
    return x.exp()


def _with_realization(x):
    if x.sum() > 0:
        return x * 2.0
    return x.sin()


def _keys_checked(compiled: CompiledFunction) -> list:
    checked = []

    def program(graph, inputs, trace=None, key=None, donations=()):
        if key is not None:
            assert key == key_with_donations(structural_key(graph, inputs), donations)
            checked.append(key)
        return CompiledFunction._program(compiled, graph, inputs, trace, key, donations)

    def run_hit(program, graph, inputs, trace, key):  # a followed recording's last program
        assert key == structural_key(graph, inputs)
        checked.append(key)
        return CompiledFunction._run_hit(compiled, program, graph, inputs, trace, key)

    compiled._program = program
    compiled._run_hit = run_hit
    return checked


def test_the_traced_key_equals_the_structural_key():
    cases = [(_with_captures_and_backward, (tg.randn(3, dtype=tg.float64, requires_grad=True),)),
             (_with_dead_code, (tg.randn(2), tg.randn(4))),
             (_with_realization, (tg.ones(3),)),
             (_with_realization, (-tg.ones(3),))]
    for fn, args in cases:
        compiled = tg.compile(fn)
        checked = _keys_checked(compiled)
        compiled(*args)
        assert checked


def _gradient_used_again(x):
    y = (x * 1.5 + 0.25).sin() * x / 2.0
    (grad,) = tg.autograd.grad(y.sum(), [x])
    return x - 0.1 * grad  # nodes after the replayed backward read its results


def test_the_key_after_a_replayed_backward_equals_the_structural_key():
    for fn in (_with_captures_and_backward, _gradient_used_again):
        compiled = tg.compile(fn)
        checked = _keys_checked(compiled)
        for _ in range(3):  # the first call records the backward template, the others replay it
            compiled(tg.randn(3, dtype=tg.float64, requires_grad=True))
        assert len(checked) == 3 and checked[0] == checked[1] == checked[2]
        assert compiled.cache_info().misses == 1


def test_inputs_that_only_feed_dead_code_are_not_read():
    compiled = tg.compile(_with_dead_code)
    x = tg.tensor([0.0, 1.0])
    for unused in (tg.ones(4), tg.ones(5)):  # a new shape of a dead input: a new key, same answer
        np.testing.assert_allclose(compiled(x, unused).numpy(), np.exp([0.0, 1.0]), rtol=1e-6)
    program = next(iter(compiled._programs.values()))
    assert program.feeds == (0,)
    assert compiled.cache_info().misses == 2


def test_equal_structure_with_other_aliasing_is_another_key():
    compiled = tg.compile(lambda a, b: a + b)
    x = tg.arange(4.0)
    np.testing.assert_allclose(compiled(x, x).numpy(), 2 * np.arange(4.0))
    np.testing.assert_allclose(compiled(x, x + 1).numpy(), 2 * np.arange(4.0) + 1)
    assert compiled.cache_info().misses == 2


def test_the_alias_pattern_groups_inputs_by_the_memory_they_view():
    a, c = np.zeros(4), np.zeros(3)
    inputs = [a, a[1:], c, a[1:][1:], a, np.float32(2.0), c.T]
    assert alias_pattern(inputs) == (0, 0, 2, 0, 0, 5, 2)


def test_the_alias_pattern_takes_objects_other_than_arrays_as_their_own_memory():
    a, one = np.zeros(4), 1.0
    assert alias_pattern([a, one, a[1:], one, 2.0]) == (0, 1, 0, 1, 4)


def test_a_function_calling_two_graphs_of_one_key_length_hits_both():
    compiled = tg.compile(lambda x, scale: x * 2.0 if scale else x + 2.0)
    x = tg.arange(4.0)
    for scale in [True, False, True, False]:
        want = np.arange(4.0) * 2.0 if scale else np.arange(4.0) + 2.0
        np.testing.assert_allclose(compiled(x, scale).numpy(), want)
    assert (compiled.cache_info().hits, compiled.cache_info().misses) == (2, 2)
