"""`tg.testing.assert_close` with PyTorch's default tolerances per dtype, shape and dtype
checks, nested structures, and `assert_allclose`."""

import pytest

import tracegrad as tg


def test_close_values_pass_and_far_values_fail_with_a_report():
    tg.testing.assert_close(tg.ones(3), tg.ones(3) + 1e-7)
    with pytest.raises(AssertionError, match="Mismatched elements: 3 / 3"):
        tg.testing.assert_close(tg.ones(3), tg.ones(3) + 1e-3)
    tg.testing.assert_close(tg.ones(3), tg.ones(3) + 1e-3, rtol=1e-2, atol=0.0)
    with pytest.raises(ValueError, match="Both 'rtol' and 'atol'"):
        tg.testing.assert_close(tg.ones(1), tg.ones(1), rtol=1e-3)


def test_shapes_dtypes_and_structures_are_checked():
    with pytest.raises(AssertionError, match="'shape' do not match"):
        tg.testing.assert_close(tg.ones(3), tg.ones(4))
    with pytest.raises(AssertionError, match="'dtype' do not match"):
        tg.testing.assert_close(tg.ones(3), tg.ones(3, dtype=tg.float64))
    tg.testing.assert_close({"a": [tg.ones(2), 1.0]}, {"a": [tg.ones(2), 1.0]})
    tg.testing.assert_allclose(tg.ones(3), tg.ones(3, dtype=tg.float64))
    tg.testing.assert_close(tg.tensor([float("nan")]), tg.tensor([float("nan")]), equal_nan=True)
    with pytest.raises(AssertionError):
        tg.testing.assert_close(tg.tensor([float("nan")]), tg.tensor([float("nan")]))
