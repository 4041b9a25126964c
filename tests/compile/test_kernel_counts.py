"""Fusion budgets: how many LLVM kernels a graph compiles to (`cache_info().kernels`).

Each test compiles a fresh function, so the count is the kernels of exactly one graph.
"""

import numpy as np

import tracegrad as tg
import tracegrad.nn.functional as F

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


def _row_passes(fn, *args):
    """Kernels of a compiled call that loop over the full (rows, cols) domain."""
    compiled = tg.compile(fn)
    compiled(*args)
    report = compiled.explain(*args)
    domain = "[" + ",".join(map(str, args[0].shape)) + "]"
    return sum(1 for line in str(report).splitlines()
               if line.strip().startswith("kernel") and f"over {domain}" in line)


def _fwd_bwd(loss_fn):
    def step(*inputs):
        loss = loss_fn(*inputs)
        return loss, tg.autograd.grad(loss, [t for t in inputs if t.requires_grad])
    return step


def _rows(rows=32, cols=24):
    return tg.from_numpy(np.random.default_rng(0).standard_normal((rows, cols))).requires_grad_()


def test_softmax_forward_and_backward_is_one_pass_over_the_rows():
    assert _row_passes(_fwd_bwd(lambda x: (F.softmax(x, -1) * x).sum()), _rows()) == 1


def test_log_softmax_forward_and_backward_is_one_pass_over_the_rows():
    assert _row_passes(_fwd_bwd(lambda x: (F.log_softmax(x, -1) * x).sum()), _rows()) == 1


def test_layer_norm_forward_and_backward_is_one_pass_over_the_rows():
    x = _rows()
    gamma = tg.from_numpy(np.linspace(0.5, 1.5, 24)).requires_grad_()
    beta = tg.from_numpy(np.linspace(-1, 1, 24)).requires_grad_()
    loss = lambda x, g, b: (F.layer_norm(x, (24,), g, b) * F.layer_norm(x, (24,), g, b)).sum()  # noqa: E731
    assert _row_passes(_fwd_bwd(loss), x, gamma, beta) == 1


def test_cross_entropy_forward_and_backward_is_at_most_two_passes_over_the_logits():
    labels = tg.tensor(np.random.default_rng(1).integers(0, 24, 32))
    assert _row_passes(_fwd_bwd(lambda x: F.cross_entropy(x, labels)), _rows()) <= 2
