"""Programs: buffers of a run are reused only once nothing can read them."""

import numpy as np
import pytest

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


def _one_kernel(x, y):
    s = (x * y + 1.0).tanh()
    return s.sum(), s * 2.0, y.exp()  # results in another order than the kernel writes them


def test_a_one_kernel_program_runs_its_kernel_on_the_inputs_directly():
    rng = np.random.default_rng(2)
    x, y = (tg.from_numpy(rng.standard_normal((4, 5))) for _ in range(2))
    compiled = tg.compile(_one_kernel)
    for _ in range(3):  # the first call traces, the next ones follow it
        for got, expected in zip(compiled(x, y), _one_kernel(x, y)):
            np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-12)
    (program,) = compiled._programs.values()
    assert len(program.steps) == 1 and program._alone is not None
    # The same program run through its slots gives the same arrays.
    inputs = [x.numpy(), y.numpy(), *(np.array(v) for v in (1.0, 2.0))][:program.n_inputs]
    direct = program.run(inputs)
    program._alone = None
    for a, b in zip(direct, program.run(inputs)):
        np.testing.assert_array_equal(a, b)


def test_a_one_kernel_program_still_checks_indices():
    x = tg.from_numpy(np.arange(12.0).reshape(3, 4))
    compiled = tg.compile(lambda x, i: x.gather(1, i) * 2)
    compiled(x, tg.tensor([[0], [3], [1]]))
    (program,) = compiled._programs.values()
    assert program._alone is not None
    with pytest.raises(IndexError, match="gather: index 4 is out of bounds for dimension 1 with size 4"):
        compiled(x, tg.tensor([[0], [4], [1]]))
