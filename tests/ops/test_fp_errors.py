"""Floating-point errors in eager ops: no warnings, inf/nan results (as PyTorch), and the
caller's NumPy error state is left as it was."""

import warnings

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ops.fp_errors import quiet


@pytest.mark.parametrize("op, value, expected", [
    (lambda t: t.log(), 0.0, -np.inf),
    (lambda t: t.exp(), 1000.0, np.inf),
    (lambda t: t / 0.0, 1.0, np.inf),
    (lambda t: t.sqrt(), -1.0, np.nan),
])
def test_eager_op_gives_inf_or_nan_without_a_warning(op, value, expected):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = op(tg.tensor([value])).numpy()
    np.testing.assert_array_equal(result, [expected])


def test_callers_error_state_is_restored_after_an_op():
    with np.errstate(divide="raise"):
        tg.tensor([0.0]).log()
        with pytest.raises(FloatingPointError):
            np.log(np.zeros(1))


def test_quiet_restores_the_state_when_the_function_raises():
    @quiet
    def fails(x):
        raise ValueError("boom")
    with np.errstate(divide="raise"):
        with pytest.raises(ValueError):
            fails(1)
        with pytest.raises(FloatingPointError):
            np.log(np.zeros(1))
