"""Programs: buffers of a run are reused only once nothing can read them."""

import numpy as np

import tracegrad as tg


def _with_late_view(x, w):
    h = (x * 2.0).exp()      # a kernel writes h
    a = h @ w                # h's own last reader
    return h.T @ (a * 3.0)   # a view of h read later, after other kernels ran


def test_a_buffer_read_through_a_later_view_is_not_reused_early():
    rng = np.random.default_rng(0)
    x = tg.from_numpy(rng.standard_normal((16, 8)))
    w = tg.from_numpy(rng.standard_normal((8, 8)))
    compiled = tg.compile(_with_late_view)
    for _ in range(2):
        np.testing.assert_allclose(compiled(x, w).numpy(), _with_late_view(x, w).numpy(), rtol=1e-12)


def test_dead_kernel_buffers_are_handed_to_later_kernels():
    rng = np.random.default_rng(1)
    x = tg.from_numpy(rng.standard_normal((32, 32)))

    def chain(x):
        a = (x * 2.0).exp() @ x          # matmul needs a buffer for its input
        b = (a * 0.5).tanh() @ x
        return (b + 1.0).sin() @ x

    compiled = tg.compile(chain)
    np.testing.assert_allclose(compiled(x).numpy(), chain(x).numpy(), rtol=1e-12)
    program = next(iter(compiled._programs.values()))
    assert sum(len(r) for r in program.recycles) >= 1
