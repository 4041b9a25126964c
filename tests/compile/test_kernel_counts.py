"""Fusion budgets: how many LLVM kernels a graph compiles to (`cache_info().kernels`).

Each test compiles a fresh function, so the count is the kernels of exactly one graph.
"""

import numpy as np

import tracegrad as tg

# Twenty elementwise ops with code generation (`lower`), applied in turn.
_CHAIN = [
    lambda x: x * 1.5, lambda x: x.tanh(), lambda x: x + 0.25, lambda x: x.sigmoid(), lambda x: -x,
    lambda x: x.exp(), lambda x: x - 0.5, lambda x: x.abs(), lambda x: x * x, lambda x: (x + 1).log(),
]


def _chain(x):
    for i in range(20):
        x = _CHAIN[i % len(_CHAIN)](x)
    return x


def _input():
    return tg.from_numpy(np.random.default_rng(0).uniform(-1, 1, (32, 16))).requires_grad_()


def test_elementwise_chain_forward_and_backward_is_at_most_3_kernels():
    @tg.compile
    def step(x):
        y = _chain(x)
        return y, tg.autograd.grad(y.sum(), x)[0]

    step(_input())
    info = step.cache_info()
    assert info.graphs == 1
    assert info.kernels <= 3, info


def test_elementwise_chain_kernels_compute_eager_values():
    @tg.compile
    def step(x):
        y = _chain(x)
        return y, tg.autograd.grad(y.sum(), x)[0]

    x = _input()
    y, g = step(x)
    y_e = _chain(x)
    g_e = tg.autograd.grad(y_e.sum(), x)[0]
    np.testing.assert_allclose(y.detach().numpy(), y_e.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(g.numpy(), g_e.numpy(), rtol=1e-10, atol=1e-12)


def test_elementwise_chain_forward_without_grad_is_one_kernel():
    step = tg.compile(_chain)
    step(_input().detach())
    assert step.cache_info().kernels == 1


def test_elementwise_chain_forward_saving_values_for_eager_backward_is_one_kernel():
    # the values saved for a later eager backward are extra outputs of the same loop
    step = tg.compile(_chain)
    step(_input())
    assert step.cache_info().kernels == 1, step.cache_info()


def _softmax_step(x, g):
    y = tg.softmax(x, -1)
    return y, tg.autograd.grad(y, x, grad_outputs=g)[0]


def _softmax_inputs():
    rng = np.random.default_rng(1)
    x = tg.from_numpy(rng.normal(size=(8, 32))).requires_grad_()
    return x, tg.from_numpy(rng.normal(size=(8, 32)))


def test_softmax_forward_and_backward_is_at_most_4_kernels():
    step = tg.compile(_softmax_step)
    step(*_softmax_inputs())
    assert step.cache_info().kernels <= 4, step.cache_info()


def test_softmax_forward_and_backward_kernels_compute_eager_values():
    step = tg.compile(_softmax_step)
    x, g = _softmax_inputs()
    y, dx = step(x, g)
    y_e, dx_e = _softmax_step(x, g)
    np.testing.assert_allclose(y.detach().numpy(), y_e.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(dx.numpy(), dx_e.numpy(), rtol=1e-10, atol=1e-13)


def test_cache_hit_compiles_no_new_kernels():
    step = tg.compile(_softmax_step)
    step(*_softmax_inputs())
    before = step.cache_info().kernels
    step(*_softmax_inputs())
    info = step.cache_info()
    assert (info.hits, info.kernels) == (1, before)
