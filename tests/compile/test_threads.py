"""One compiled function called from several threads at once."""

import threading

import numpy as np

import tracegrad as tg

THREADS = 4
CALLS = 6


def _step(x, w):
    y = ((x @ w).tanh() * x.sum(-1, keepdim=True).sigmoid()).softmax(-1)
    loss = (y * y).sum()
    return loss, tg.autograd.grad(loss, [x, w])


def _inputs(seed):
    rng = np.random.default_rng(seed)
    return (tg.from_numpy(rng.normal(size=(6, 5))).requires_grad_(),
            tg.from_numpy(rng.normal(size=(5, 4))).requires_grad_())


def _run_in_threads(target):
    barrier = threading.Barrier(THREADS)
    errors = []

    def worker(index):
        try:
            barrier.wait()
            target(index)
        except BaseException as error:  # noqa: BLE001 - reported in the main thread
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def test_concurrent_calls_give_each_thread_its_own_results():
    compiled = tg.compile(_step)
    results = {}

    def target(index):
        for call in range(CALLS):
            seed = index * 100 + call
            loss, grads = compiled(*_inputs(seed))
            results[seed] = (loss.detach().numpy(), [g.numpy() for g in grads])

    _run_in_threads(target)
    assert len(results) == THREADS * CALLS
    for seed, (loss, grads) in results.items():
        loss_e, grads_e = _step(*_inputs(seed))
        np.testing.assert_allclose(loss, loss_e.detach().numpy(), rtol=1e-12)
        for g, g_e in zip(grads, grads_e):
            np.testing.assert_allclose(g, g_e.numpy(), rtol=1e-12, atol=1e-14)


def test_concurrent_calls_share_one_cached_program():
    compiled = tg.compile(_step)
    _run_in_threads(lambda index: [compiled(*_inputs(index * 100 + c)) for c in range(CALLS)])
    info = compiled.cache_info()
    assert info.graphs == 1
    # (two threads building one graph at once count a recompile: a function that counts two
    # runs a call eagerly, jit.backoff)
    assert info.hits + info.misses + info.eager_calls == THREADS * CALLS


def test_concurrent_calls_with_a_realization_point_take_each_threads_branch():
    @tg.compile
    def branchy(x):
        if x.sum() > 0:
            return x.exp().sum()
        return (-x).exp().sum()

    results = {}

    def target(index):
        sign = 1.0 if index % 2 else -1.0
        for call in range(CALLS):
            x = tg.from_numpy(np.abs(np.random.default_rng(index * 100 + call).normal(size=7)) * sign)
            results[(index, call)] = (x.numpy(), branchy(x).item())

    _run_in_threads(target)
    for x, value in results.values():
        np.testing.assert_allclose(value, np.exp(np.abs(x)).sum(), rtol=1e-12)


def test_concurrent_backward_writes_grad_to_each_threads_own_leaves():
    @tg.compile
    def train(x, w):
        (x @ w).tanh().sum().backward()

    leaves = {}

    def target(index):
        for call in range(CALLS):
            x, w = _inputs(index * 100 + call)
            train(x, w)
            leaves[(index, call)] = (x, w)

    _run_in_threads(target)
    for x, w in leaves.values():
        gx, gw = tg.autograd.grad((x @ w).tanh().sum(), [x, w])
        np.testing.assert_allclose(x.grad.numpy(), gx.numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(w.grad.numpy(), gw.numpy(), rtol=1e-12, atol=1e-14)
