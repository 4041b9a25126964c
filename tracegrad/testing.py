"""`tg.testing`: `assert_close` (PyTorch's default tolerances per dtype, shapes and dtypes
checked) and the older `assert_allclose`."""

from __future__ import annotations

import numpy as np

from tracegrad.ir import types
from tracegrad.tensor import Tensor

# PyTorch's defaults (rtol, atol) by dtype; integers and bool compare exactly.
_TOLERANCES = {types.float16: (1e-3, 1e-5), types.bfloat16: (1.6e-2, 1e-5), types.float32: (1.3e-6, 1e-5),
               types.float64: (1e-7, 1e-7)}


def _array(value) -> tuple[np.ndarray, types.DType | None]:
    if isinstance(value, Tensor):
        return np.asarray(value.detach().numpy()).astype(np.float64 if value.dtype.is_floating else value.dtype.np), \
            value.dtype
    return np.asarray(value), None


def assert_close(actual, expected, *, rtol: float | None = None, atol: float | None = None,
                 equal_nan: bool = False, check_dtype: bool = True, msg: str | None = None, **_) -> None:
    """Raise AssertionError unless `actual` and `expected` (tensors, numbers, or sequences and
    mappings of them) are close: |a - e| <= atol + rtol * |e| elementwise."""
    if (rtol is None) != (atol is None):
        raise ValueError("Both 'rtol' and 'atol' must be either specified or omitted, but got "
                         f"rtol={rtol} and atol={atol}")
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), msg or \
            f"The mappings have different keys: {sorted(actual)} and {sorted(expected)}"
        for key in expected:
            assert_close(actual[key], expected[key], rtol=rtol, atol=atol, equal_nan=equal_nan,
                         check_dtype=check_dtype, msg=msg)
        return
    if isinstance(expected, (list, tuple)) and not isinstance(actual, Tensor):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected), msg or \
            f"The sequences have different lengths: {len(actual)} and {len(expected)}"
        for a, e in zip(actual, expected):
            assert_close(a, e, rtol=rtol, atol=atol, equal_nan=equal_nan, check_dtype=check_dtype, msg=msg)
        return
    a, a_dtype = _array(actual)
    e, e_dtype = _array(expected)
    if a.shape != e.shape:
        raise AssertionError(msg or f"The values for attribute 'shape' do not match: {tuple(a.shape)} != "
                                    f"{tuple(e.shape)}.")
    if check_dtype and a_dtype is not None and e_dtype is not None and a_dtype is not e_dtype:
        raise AssertionError(msg or f"The values for attribute 'dtype' do not match: {a_dtype} != {e_dtype}.")
    if rtol is None:
        dtype = a_dtype if a_dtype is not None else e_dtype
        rtol, atol = _TOLERANCES.get(dtype, (0.0, 0.0)) if dtype is not None else (1.3e-6, 1e-5)
    if not np.allclose(a, e, rtol=rtol, atol=atol, equal_nan=equal_nan):
        difference = np.abs(a.astype(np.float64) - e.astype(np.float64))
        mismatched = ~np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=equal_nan)
        raise AssertionError(msg or (
            f"Tensor-likes are not close!\n\nMismatched elements: {int(mismatched.sum())} / {a.size} "
            f"({100.0 * mismatched.sum() / max(a.size, 1):.1f}%)\nGreatest absolute difference: "
            f"{np.nanmax(difference) if difference.size else 0} (up to {atol} allowed)"))


def assert_allclose(actual, expected, rtol: float | None = None, atol: float | None = None,
                    equal_nan: bool = True, msg: str = "") -> None:
    """The deprecated form: no dtype check, NaN equal to NaN by default."""
    assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=equal_nan, check_dtype=False, msg=msg or None)
