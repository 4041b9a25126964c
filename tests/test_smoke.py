"""The README's first example, as a test."""

import numpy as np

import tracegrad as tg


def test_readme_example_gradient_matches_closed_form():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = (x * x).exp().sum()
    y.backward()
    expected = 2 * np.array([1.0, 2.0, 3.0]) * np.exp(np.array([1.0, 4.0, 9.0]))
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-6)


def test_dump_shows_one_line_per_recorded_op():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    text = tg.ir.dump((x * x).exp().sum())
    assert "mul(%leaf0, %leaf0)" in text
    assert "exp(" in text and "sum(" in text
    assert "f32[2]" in text
