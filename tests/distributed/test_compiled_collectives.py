"""Collectives inside `tg.compile` against the compiler's passes and realization points:
no pass may drop a collective whose result is used or written back, or merge two whose
results differ, and a compiled call runs each collective once, as eager execution does.

In this process the group is simulated (`IdenticalRanks`: every rank holds the same
values, so a SUM multiplies by the world size) to count the collectives each call runs;
`test_collectives.py` checks the same programs on two real ranks."""

from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.distributed as dist
from tracegrad.distributed import process_group
from tracegrad.ops import collective

WORLD = 3


class IdenticalRanks:
    """A group of WORLD ranks that all hold this process's values; counts the collectives."""

    world_size = WORLD
    rank = 0

    def __init__(self):
        self.calls: list[str] = []

    def all_reduce(self, x: np.ndarray, out: np.ndarray, op: str) -> None:
        self.calls.append(f"all_reduce {op}")
        np.multiply(x, WORLD if op == "sum" else 1, out=out)

    def broadcast(self, x: np.ndarray, out: np.ndarray, src: int) -> None:
        self.calls.append("broadcast")
        np.copyto(out, x)

    def all_gather(self, x: np.ndarray, out: np.ndarray) -> None:
        self.calls.append("all_gather")
        out[...] = x


@pytest.fixture
def group(monkeypatch) -> IdenticalRanks:
    ranks = IdenticalRanks()
    monkeypatch.setattr(process_group, "_backend", ranks)
    monkeypatch.setattr(collective, "BACKEND", ranks)
    return ranks


def calls_per_call(fn, make_args, group: IdenticalRanks, n: int = 3) -> list[tuple[list, int]]:
    """(result as lists, collectives run) for n calls of `fn`, each on fresh arguments."""
    found = []
    for _ in range(n):
        group.calls.clear()
        args = make_args()
        result = fn(*args)
        results = result if isinstance(result, tuple) else () if result is None else (result,)
        found.append(([r.tolist() for r in results] + [a.tolist() for a in args], len(group.calls)))
    return found


def test_a_second_all_reduce_of_a_written_tensor_reduces_the_first_result(group):
    def reduce_twice(x):
        dist.all_reduce(x)
        once = x.clone()
        dist.all_reduce(x)
        return once
    eager = calls_per_call(reduce_twice, lambda: (tg.ones(2),), group)
    compiled = calls_per_call(tg.compile(reduce_twice), lambda: (tg.ones(2),), group)
    assert eager == compiled == [([[3.0, 3.0], [9.0, 9.0]], 2)] * 3


def test_equal_all_reduces_of_one_value_give_each_tensor_the_same_reduction(group):
    def reduce_copies(x):
        a, b, c = x.clone(), x.clone(), x.clone()
        dist.all_reduce(a)
        dist.all_reduce(b)
        dist.all_reduce(c, op=dist.ReduceOp.MAX)
        return a, b, c
    expected = [[3.0, 6.0], [3.0, 6.0], [1.0, 2.0], [1.0, 2.0]]
    eager = calls_per_call(reduce_copies, lambda: (tg.tensor([1.0, 2.0]),), group)
    assert eager == [(expected, 3)] * 3
    compiled = calls_per_call(tg.compile(reduce_copies), lambda: (tg.tensor([1.0, 2.0]),), group)
    # The two SUMs of one value are one node (every rank compiles the same graph, so every
    # rank merges them alike); the MAX is another.
    assert compiled == [(expected, 2)] * 3


def test_a_collective_written_into_an_argument_is_kept_when_nothing_returned_reads_it(group):
    def reduce_argument(x):
        dist.all_reduce(x)
        return None
    found = calls_per_call(tg.compile(reduce_argument), lambda: (tg.ones(2),), group)
    assert found == [([[3.0, 3.0]], 1)] * 3


def test_a_collective_written_into_a_captured_tensor_runs_in_every_call(group):
    total = tg.ones(2)

    @tg.compile
    def reduce_captured(x):
        dist.all_reduce(total)
        return x + 1
    seen = []
    for _ in range(3):
        group.calls.clear()
        reduce_captured(tg.zeros(2))
        seen.append((total.tolist(), len(group.calls)))
    assert seen == [([3.0, 3.0], 1), ([9.0, 9.0], 1), ([27.0, 27.0], 1)]


def test_a_collective_before_a_realization_point_runs_once_per_call(group):
    def reduce_then_item(x):
        y = x * 1
        dist.all_reduce(y)
        return y * y.sum().item()
    eager = calls_per_call(reduce_then_item, lambda: (tg.ones(2),), group)
    compiled = calls_per_call(tg.compile(reduce_then_item), lambda: (tg.ones(2),), group)
    assert eager == compiled == [([[18.0, 18.0], [1.0, 1.0]], 1)] * 3


def test_a_collective_on_an_argument_before_a_realization_point_reduces_it_once(group):
    def reduce_argument_then_item(x):
        dist.all_reduce(x)
        return x * x.sum().item()
    eager = calls_per_call(reduce_argument_then_item, lambda: (tg.ones(2),), group)
    compiled = calls_per_call(tg.compile(reduce_argument_then_item), lambda: (tg.ones(2),), group)
    assert eager == compiled == [([[18.0, 18.0], [3.0, 3.0]], 1)] * 3


def test_a_backward_after_a_realization_reads_the_collectives_result_without_running_it_again(group):
    w = tg.tensor([1.0, -2.0], requires_grad=True)

    def step(x):
        w.grad = None
        reduced = x * 1
        dist.all_reduce(reduced)
        loss = (reduced * w).sum()
        scale = loss.item()
        loss.backward()
        return w.grad * scale
    eager = calls_per_call(step, lambda: (tg.tensor([1.0, 2.0]),), group)
    compiled = calls_per_call(tg.compile(step), lambda: (tg.tensor([1.0, 2.0]),), group)
    # reduced = [3, 6], loss = 3 - 12 = -9, w.grad = reduced.
    assert eager == compiled == [([[-27.0, -54.0], [1.0, 2.0]], 1)] * 3
