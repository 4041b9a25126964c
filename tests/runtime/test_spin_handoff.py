"""The native hand-off of a call to a spinning worker (`runtime/spin_handoff.py`): a post only
succeeds while a worker spins and no other caller owns the mailbox, and a posted call runs
exactly once, on the worker or (withdrawn by `reclaim`) on the caller."""

import ctypes
import threading
import time

import numpy as np
import pytest

from tracegrad.codegen import gemm
from tracegrad.runtime import spin_handoff, threads

pytestmark = pytest.mark.skipif(not spin_handoff.available(), reason="the hand-off is x86 only")

_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int64)


class _Recorder:
    """A foreign function of one i64 that records its arguments."""

    def __init__(self):
        self.arguments = []
        self.function = _CALLBACK(self.arguments.append)
        self.address = ctypes.cast(self.function, ctypes.c_void_p).value


@pytest.fixture
def spinning():
    """A mailbox with a thread serving it for up to `seconds` (joined at the end)."""
    spin_handoff.prepare()
    started = []

    def start(seconds: float = 5.0):
        mailbox, address = spin_handoff.new_mailbox()
        thread = threading.Thread(target=spin_handoff.serve, args=(address, seconds))
        thread.start()
        deadline = time.monotonic() + 5
        while mailbox[0] != spin_handoff.WATCHING and time.monotonic() < deadline:
            time.sleep(0.001)
        started.append(thread)
        return mailbox, address
    yield start
    for thread in started:
        thread.join()


def test_a_post_fails_while_no_worker_spins():
    spin_handoff.prepare()
    _, address = spin_handoff.new_mailbox()
    assert not spin_handoff.post(address, _Recorder().address, 1)


def test_a_posted_call_runs_on_the_worker(spinning):
    mailbox, address = spinning(seconds=0.2)
    recorder = _Recorder()
    assert spin_handoff.post(address, recorder.address, 42)
    deadline = time.monotonic() + 5
    while mailbox[0] != spin_handoff.DONE and time.monotonic() < deadline:
        time.sleep(0.001)
    assert spin_handoff.reclaim(address)
    assert recorder.arguments == [42]
    assert mailbox[0] == spin_handoff.WATCHING


def test_a_caller_waiting_long_sleeps_and_is_woken_when_the_call_is_done(spinning):
    mailbox, address = spinning(seconds=0.2)
    arguments = []
    slow = _CALLBACK(lambda argument: (time.sleep(0.05), arguments.append(argument)))
    assert spin_handoff.post(address, ctypes.cast(slow, ctypes.c_void_p).value, 7)
    deadline = time.monotonic() + 5
    while mailbox[0] == spin_handoff.POSTED and time.monotonic() < deadline:
        time.sleep(0.001)
    start = time.monotonic()
    assert spin_handoff.reclaim(address)  # past its spin: asleep on the futex until DONE
    assert arguments == [7] and mailbox[0] == spin_handoff.WATCHING
    assert time.monotonic() - start < 2


def test_a_call_reclaimed_at_once_runs_once_on_one_side(spinning):
    _, address = spinning(seconds=0.2)
    recorder = _Recorder()
    for argument in range(20):
        assert spin_handoff.post(address, recorder.address, argument)
        if not spin_handoff.reclaim(address):
            recorder.function(argument)  # withdrawn: the caller runs it
    assert recorder.arguments == list(range(20))


def test_a_second_post_fails_while_the_first_owns_the_mailbox(spinning):
    _, address = spinning(seconds=0.2)
    first, second = _Recorder(), _Recorder()
    assert spin_handoff.post(address, first.address, 1)
    assert not spin_handoff.post(address, second.address, 2)
    if not spin_handoff.reclaim(address):
        first.function(1)
    assert first.arguments == [1] and second.arguments == []


def test_a_pair_fails_with_nothing_run_while_no_worker_spins():
    spin_handoff.prepare()
    _, address = spin_handoff.new_mailbox()
    recorder = _Recorder()
    assert not spin_handoff.pair(address, recorder.address, spin_handoff.pair_block(1, 2))
    assert recorder.arguments == []


def test_a_pair_runs_each_of_its_two_calls_once(spinning):
    _, address = spinning(seconds=0.2)
    recorder = _Recorder()
    for first in range(0, 40, 2):
        assert spin_handoff.pair(address, recorder.address, spin_handoff.pair_block(first, first + 1))
    assert sorted(recorder.arguments) == list(range(40))


def _spy_on(monkeypatch, name: str) -> list:
    """What every call of `spin_handoff.<name>` returned (whether the hand-off took), with
    the worker spinning long enough for the test."""
    monkeypatch.setattr(threads, "SPIN_SECONDS", 1.0)
    results = []
    original = getattr(spin_handoff, name)
    monkeypatch.setattr(spin_handoff, name, lambda *args: results.append(original(*args)) or results[-1])
    return results


def _operands(seed: int, n: int) -> tuple:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((256, 300)).astype(np.float32)
    b = rng.standard_normal((300, n)).astype(np.float32)
    return a, b, gemm.matmul(a, b, threads=1)


def test_a_bound_two_thread_product_is_handed_off_as_a_pair(monkeypatch):
    pairs = _spy_on(monkeypatch, "pair")
    a, b, expected = _operands(1, 600)
    out = np.empty_like(expected)
    bound = gemm.bind(a, b, out)
    assert bound is not None and bound.second is not None  # two calls
    for _ in range(50):  # the first goes through the queue; the worker then spins
        out[...] = np.nan
        assert bound.run(*(x.__array_interface__["data"][0] for x in (a, b, out)))
        np.testing.assert_array_equal(out, expected)
        if any(pairs):
            break
        time.sleep(0.01)
    assert any(pairs)


def test_serve_returns_after_its_spin_time_and_the_mailbox_sleeps():
    spin_handoff.prepare()
    mailbox, address = spin_handoff.new_mailbox()
    start = time.monotonic()
    spin_handoff.serve(address, 0.01)
    assert time.monotonic() - start < 2
    assert mailbox[0] == spin_handoff.ASLEEP
    assert not spin_handoff.post(address, _Recorder().address, 1)


def test_two_thread_products_handed_off_match_one_thread(monkeypatch):
    posts = _spy_on(monkeypatch, "post")
    a, b, expected = _operands(0, 200)
    for _ in range(50):  # the first goes through the queue; the worker then spins
        np.testing.assert_array_equal(gemm.matmul(a, b, threads=2), expected)
        if any(posts):
            break
        time.sleep(0.01)
    assert any(posts)


def test_no_spin_sends_every_call_through_the_queue(monkeypatch):
    monkeypatch.setattr(threads, "SPIN_SECONDS", 0)
    monkeypatch.setattr(spin_handoff, "post", lambda *args: pytest.fail("posted with SPIN_SECONDS = 0"))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 300))
    b = rng.standard_normal((300, 200))
    np.testing.assert_array_equal(gemm.matmul(a, b, threads=2), gemm.matmul(a, b, threads=1))


def test_a_task_queued_for_a_spinning_worker_stops_its_spin(monkeypatch):
    monkeypatch.setattr(threads, "SPIN_SECONDS", 5.0)
    spin_handoff.prepare()
    threads.run_parallel([(lambda: None,), (lambda: None,)], 1)  # the worker then spins
    worker = threads._ensure_workers(1)[0]
    deadline = time.monotonic() + 5
    while worker.mailbox[0] != spin_handoff.WATCHING and time.monotonic() < deadline:
        time.sleep(0.001)
    assert worker.mailbox[0] == spin_handoff.WATCHING
    # Two calls that can only finish together, on two threads: the worker must leave its
    # spin for the queued task (else the caller runs both, and the first waits in vain).
    both = threading.Barrier(2, timeout=2)
    ran_on = []
    start = time.monotonic()
    threads.run_parallel([(lambda: ran_on.append(both.wait() is not None and threading.get_ident()),),
                          (lambda: ran_on.append(both.wait() is not None and threading.get_ident()),)], 1)
    assert len(set(ran_on)) == 2 and time.monotonic() - start < 2


def test_a_kernel_split_in_two_hands_its_second_chunk_off_as_a_pair(monkeypatch):
    # Its chunks as `range_call` blocks: one native hand-off, no chunk through the queue
    # once the worker spins; the values are those of one call.
    import tracegrad as tg
    from tracegrad.codegen.kernels import KernelStep
    pairs = _spy_on(monkeypatch, "pair")
    monkeypatch.setattr(threads, "NUM_THREADS", 2)
    monkeypatch.setattr(threads, "MIN_PARALLEL_ELEMENTS", 1)
    monkeypatch.setattr(threads, "MIN_CHUNK_ELEMENTS", 1)
    x = np.random.default_rng(3).standard_normal((64, 100))
    compiled = tg.compile(lambda x: ((x * 1.5).exp() + 1.0).tanh())
    for _ in range(50):  # the first goes through the queue; the worker then spins
        np.testing.assert_allclose(compiled(tg.from_numpy(x)).numpy(), np.tanh(np.exp(x * 1.5) + 1.0), rtol=1e-13)
        if any(pairs):
            break
        time.sleep(0.01)
    (kernel,) = [s for p in compiled._programs.values() for s in p.steps if isinstance(s, KernelStep)]
    assert kernel.chunk_count() == 2 and any(pairs)


def test_range_pair_runs_each_chunk_once_with_its_range():
    seen = []
    kernel = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(
        lambda buffers, start, end: seen.append((buffers, start, end)))
    for _ in range(20):
        seen.clear()
        threads.run_range_pair([(kernel, 1234, 0, 5), (kernel, 1234, 5, 9)])
        assert sorted(seen) == [(1234, 0, 5), (1234, 5, 9)]


def test_wake_has_a_sleeping_worker_spin(monkeypatch):
    monkeypatch.setattr(threads, "SPIN_SECONDS", 0.5)
    spin_handoff.prepare()
    worker = threads._ensure_workers(1)[0]
    spin_handoff.stop(worker.mailbox_address)  # (a spin left from an earlier test ends)
    deadline = time.monotonic() + 5
    while worker.mailbox[0] != spin_handoff.ASLEEP and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker.mailbox[0] == spin_handoff.ASLEEP
    threads.wake()
    while worker.mailbox[0] != spin_handoff.WATCHING and time.monotonic() < deadline:
        time.sleep(0.001)
    assert worker.mailbox[0] == spin_handoff.WATCHING


def test_a_program_wakes_the_worker_only_when_a_step_may_use_two_threads(monkeypatch):
    import tracegrad as tg
    woken = []
    monkeypatch.setattr(threads, "wake", lambda: woken.append(True))
    rng = np.random.default_rng(0)
    small = tg.compile(lambda x: (x * 2.0).exp())
    small(tg.from_numpy(rng.standard_normal((4, 4))))
    assert not woken
    big = tg.compile(lambda a, b: (a @ b).relu())
    a, b = (tg.from_numpy(rng.standard_normal((256, 256)).astype(np.float32)) for _ in range(2))
    np.testing.assert_allclose(big(a, b).numpy(), np.maximum(a.numpy() @ b.numpy(), 0), rtol=1e-4, atol=1e-4)
    assert woken
