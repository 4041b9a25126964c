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


def assert_matches_torch(torch, fn, shapes) -> None:
    """`fn` run with tracegrad and with PyTorch (`torch`) on the same float64 inputs: equal
    values and equal input gradients of a weighted sum of the output."""
    arrays = [np.random.default_rng(20 + i).standard_normal(s) for i, s in enumerate(shapes)]
    ours = [tg.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, expected = fn(tg, *ours), fn(torch, *theirs)
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    weights = np.linspace(-1.0, 1.0, int(np.prod(out.shape))).reshape(out.shape)
    (out * tg.tensor(weights)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    for got, want in zip(ours, theirs):
        np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-12, atol=1e-12)


def assert_gradients_check(check, fn, shapes, transposed: bool = False) -> None:
    """`check` (gradcheck or gradgradcheck) of `fn` on leaves of `shapes`; `transposed`: on
    transposed (non-contiguous) 2-D leaves."""
    leaves = inputs(shapes, transposed=transposed)
    if transposed:
        assert any(not x.is_contiguous() for x in leaves)
    assert check(lambda *xs: fn(tg, *xs), tuple(leaves))
