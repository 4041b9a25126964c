"""ops.layout: the strides and contiguity eager execution gives a traced tensor, so that
`contiguous()` and `is_contiguous()` answer the same eagerly and when compiled."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ops import layout


def _random_view(rng, array):
    if rng.random() < 0.5 and array.ndim > 1:
        array = array.transpose(*rng.permutation(array.ndim))
    if rng.random() < 0.5:
        array = array[tuple(slice(0, None, int(rng.integers(1, 3))) for _ in array.shape)]
    return array


def test_reshape_strides_match_numpy_views_and_copies():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        shape = tuple(int(n) for n in rng.integers(1, 4, rng.integers(1, 4)))
        a = _random_view(rng, np.zeros(shape))
        new = list(a.shape)
        rng.shuffle(new)
        if rng.random() < 0.5:
            new = [int(np.prod(new))]
        if rng.random() < 0.3:
            new = [1, *new, 1]
        b = np.reshape(a, new)
        strides = layout.reshape_strides(a.shape, layout.array_strides(a), tuple(new))
        assert (strides is not None) == np.shares_memory(a, b), (a.shape, a.strides, new)
        if strides is not None:
            wide = [d for d, n in enumerate(b.shape) if n != 1]  # (size-1 dims: any stride)
            assert [strides[d] for d in wide] == [layout.array_strides(b)[d] for d in wide]
            assert layout.is_contiguous(b.shape, strides) == b.flags.c_contiguous


def _views(x):
    return [x, x.t(), x[0], x[:, 0], x[:, 1:], x[:1], x.reshape(6), x.t().reshape(6),
            x.unsqueeze(0).expand(2, 2, 3), x[:, ::2], x * 2, (x * 2).t()]


@pytest.mark.parametrize("layout_name", ["c", "transposed", "strided"])
def test_is_contiguous_and_contiguous_agree_eager_and_compiled(layout_name):
    base = {"c": lambda: tg.ones(2, 3),
            "transposed": lambda: tg.ones(3, 2).t(),
            "strided": lambda: tg.ones(2, 6)[:, ::2]}[layout_name]

    def probe(x):
        views = _views(x)
        return [v.is_contiguous() for v in views], [v.contiguous() is v for v in views]

    eager = probe(base())
    assert tg.compile(probe)(base()) == eager


def test_retain_grad_on_contiguous_result_reaches_the_tensor_when_compiled():
    # fuzz seed 106337: a traced `contiguous()` copied a contiguous tensor, so its retained
    # grad stayed None
    def step(a):
        t = a + 0.5
        c = t.contiguous()
        c.retain_grad()
        (t * t).sum().backward()
        return c is t, c.grad

    a = tg.ones(4, dtype=tg.float64, requires_grad=True)
    same, grad = tg.compile(step)(a)
    assert same and grad is not None
    np.testing.assert_array_equal(grad.numpy(), np.full(4, 3.0))


def test_inplace_write_to_contiguous_copy_matches_eager_when_compiled():
    def write(x):
        col = x[:, 0].contiguous()  # strided: a copy, so the write stays in it
        col.add_(10)
        return x * 1, col

    eager_x, compiled_x = tg.zeros(2, 3), tg.zeros(2, 3)
    expected = write(eager_x)
    got = tg.compile(write)(compiled_x)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g.numpy(), e.numpy())
    np.testing.assert_array_equal(compiled_x.numpy(), eager_x.numpy())


def test_inplace_write_through_contiguous_view_reaches_the_base_when_compiled():
    # `x[0].contiguous()` is the view itself, as eagerly: its write reaches x. (A compiled
    # call used to copy it and write the copy.)
    def write(x):
        row = x[0].contiguous()
        row.add_(1)
        return x * 1

    eager_x, compiled_x = tg.zeros(2, 3), tg.zeros(2, 3)
    expected = write(eager_x)
    got = tg.compile(write)(compiled_x)
    np.testing.assert_array_equal(got.numpy(), expected.numpy())
    np.testing.assert_array_equal(compiled_x.numpy(), eager_x.numpy())
