"""`codegen/native_loop.py`: a table of native calls run for every step of a sequence in one
foreign call, with pointers moved from step to step."""

import ctypes

import numpy as np
import pytest

from tracegrad.codegen import gemm
from tracegrad.codegen.native_loop import EVEN_ODD, ODD_EVEN, PREVIOUS, STEP, StepLoop
from tracegrad.runtime import threads
from tracegrad.runtime.buffers import data_address


def _copy_rows(loop, dst: np.ndarray, src_address: int, row_bytes: int) -> int:
    return loop.copy(data_address(dst), src_address, 1, row_bytes, 0, 0)


@pytest.mark.parametrize("reverse", [False, True])
def test_each_step_copies_from_and_to_the_rows_its_updates_point_at(reverse):
    # Step s copies source row s (STEP) into out row s, and the row the step before wrote
    # (PREVIOUS, the fallback row at the first step) into before row s.
    steps, width = 5, 3
    source = np.arange(steps * width, dtype=np.float64).reshape(steps, width)
    out, before = np.zeros_like(source), np.zeros_like(source)
    fallback = np.full(width, -1.0)
    row = width * 8
    loop = StepLoop()
    copy = loop.copy(0, 0, 1, row, 0, 0)
    previous = loop.copy(0, 0, 1, row, 0, 0)
    loop.update_call(copy, 1, data_address(out), row, STEP)
    loop.update_call(copy, 2, data_address(source), row, STEP)
    loop.update_call(previous, 1, data_address(before), row, STEP)
    loop.update_call(previous, 2, data_address(out), row, PREVIOUS, data_address(fallback))
    loop.run(steps, reverse)
    np.testing.assert_array_equal(out, source)
    order = range(steps - 1, -1, -1) if reverse else range(steps)
    want, last = np.zeros_like(source), fallback
    for s in order:
        want[s], last = last, source[s]
    np.testing.assert_array_equal(before, want)


def test_even_and_odd_steps_alternate_between_two_buffers():
    # A ping-pong: step t reads buffer t & 1 and writes buffer (t + 1) & 1 (each step
    # writes into the other buffer what it read plus one row of increments).
    steps, width = 6, 4
    buffers = np.zeros((2, width))
    increments = np.ones((steps, width))
    seen = np.zeros((steps, width))
    row = width * 8
    loop = StepLoop()
    read = loop.copy(0, 0, 1, row, 0, 0)
    loop.update_call(read, 1, data_address(seen), row, STEP)
    loop.update_call(read, 2, data_address(buffers), row, EVEN_ODD)
    write = loop.copy(0, 0, 1, row, 0, 0)
    loop.update_call(write, 1, data_address(buffers), row, ODD_EVEN)
    loop.update_call(write, 2, data_address(increments), row, STEP)
    loop.run(steps)
    # (each write copies increments over the buffer: what step t reads is what step t - 1 wrote)
    np.testing.assert_array_equal(seen[0], np.zeros(width))
    np.testing.assert_array_equal(seen[1:], np.ones((steps - 1, width)))


def test_strided_copies_take_rows_of_their_own_length():
    source = np.arange(24, dtype=np.float32).reshape(4, 6)
    out = np.zeros((4, 9), np.float32)
    loop = StepLoop()
    loop.copy(data_address(out) + 3 * 4, data_address(source), 4, 6 * 4, 9 * 4, 6 * 4)
    loop.run(1)
    np.testing.assert_array_equal(out[:, 3:], source)
    assert not out[:, :3].any()


def test_a_rebased_update_points_the_next_run_at_another_array():
    row = 2 * 8
    first, second = np.array([[1.0, 2.0]]), np.array([[3.0, 4.0]])
    out = np.zeros((1, 2))
    loop = StepLoop()
    copy = loop.copy(data_address(out), 0, 1, row, 0, 0)
    update = loop.update_call(copy, 2, data_address(first), row, STEP)
    loop.run(1)
    np.testing.assert_array_equal(out, first)
    loop.rebase(update, data_address(second))
    loop.run(1)
    np.testing.assert_array_equal(out, second)


@pytest.mark.parametrize("hand_off", [True, False])
def test_a_recurrence_of_bound_products_equals_numpys(hand_off, monkeypatch):
    # h_s = h_(s-1) @ W through a bound GEMM (A from the step before's row, C by step), its
    # counter reset before each product; on two threads handed off natively, or both
    # halves on the caller's thread when no worker spins.
    monkeypatch.setattr(threads, "NUM_THREADS", 2)
    rng = np.random.default_rng(0)
    steps, n, k = 6, 64, 256  # (big enough for two threads)
    w = (rng.standard_normal((k, k)) / np.sqrt(k)).astype(np.float32)
    h0 = rng.standard_normal((n, k)).astype(np.float32)
    out = np.zeros((steps, n, k), np.float32)
    scratch = np.empty((n, k), np.float32)
    bound = gemm.bind(h0, w, scratch, prepack=True)
    assert bound is not None and bound.after is None and bound.second is not None
    loop = StepLoop()
    row = n * k * 4
    for params, a_field, _, c_field, a_offset, _, c_offset in bound.blocks:
        loop.update(ctypes.addressof(params) + 8 * a_field, data_address(out) + a_offset, row, PREVIOUS,
                    data_address(h0) + a_offset)
        loop.update(ctypes.addressof(params) + 8 * c_field, data_address(out) + c_offset, row, STEP)
    loop.product(bound, hand_off)
    threads.wake()
    loop.run(steps)
    h = h0
    for s in range(steps):
        want = np.empty((n, k), np.float32)
        assert bound.run(data_address(h), data_address(w), data_address(want))  # (the same kernel, B packed alike)
        np.testing.assert_array_equal(out[s], want)
        h = want
