"""What the table-driven tests of `tests/functional/` share: float64 leaves (optionally laid
out transposed), the inputs of a case's shapes, the first- and second-order checks, and the
check that a case's compiled values and gradients equal eager's.

A case is `(fn, shapes)`: `fn(module, *inputs)` computes with `module` as the library (the
same text runs with PyTorch as `module`), on float64 leaves of `shapes`."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck

CHECKS = [pytest.param(gradcheck, id="grad"), pytest.param(gradgradcheck, id="gradgrad")]


def leaf(*shape, seed=0, transposed=False):
    """A float64 leaf of standard normal values; `transposed`: a transposed (non-contiguous) layout."""
    rng = np.random.default_rng(seed)
    data = rng.standard_normal(shape[::-1] if transposed else shape)
    return tg.from_numpy(data.T if transposed else data).requires_grad_()


def inputs(shapes, seed=1, transposed=False):
    """Leaves of `shapes` (seeds from `seed`); `transposed` lays out the 2-D ones transposed."""
    return [leaf(*s, seed=seed + i, transposed=transposed and len(s) == 2) for i, s in enumerate(shapes)]


def assert_compiled_equals_eager(fn, shapes, calls: int = 2) -> None:
    """`fn` and its input gradients (of sum(out**2)) compiled, over `calls` calls with new
    leaves, equal eager's."""
    def step(*xs):
        out = fn(tg, *xs)
        return out, tg.autograd.grad((out * out).sum(), list(xs))

    compiled = tg.compile(step)
    eager_out, eager_grads = step(*inputs(shapes))
    for _ in range(calls):
        out, grads = compiled(*inputs(shapes))
        np.testing.assert_allclose(out.detach().numpy(), eager_out.detach().numpy(), rtol=1e-12, atol=1e-12)
        for got, want in zip(grads, eager_grads):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)
