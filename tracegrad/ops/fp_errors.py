"""`quiet(fn)`: run a NumPy function with floating-point error reports off (inf and nan
results are the answer, as in PyTorch); `quiet_keywords(fn)` for one taking keywords.

`np.errstate(all="ignore")` costs ~2 µs per use, more than a small eager op itself. It
sets NumPy's error-state context variable; setting that variable directly costs ~0.3 µs.
The variable is private to NumPy, so when it is missing (another NumPy version) this
falls back to `np.errstate`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

try:
    from numpy._core._ufunc_config import _extobj_contextvar, _make_extobj
    _IGNORE = _make_extobj(all="ignore")
except (ImportError, AttributeError, TypeError):  # pragma: no cover - other NumPy versions
    _extobj_contextvar = None


def quiet(fn: Callable) -> Callable:
    """`fn` with NumPy's floating-point warnings off while it runs."""
    if _extobj_contextvar is None:  # pragma: no cover - other NumPy versions
        def run_with_errstate(*args):
            with np.errstate(all="ignore"):
                return fn(*args)
        return run_with_errstate
    set_state, reset_state = _extobj_contextvar.set, _extobj_contextvar.reset

    def run(*args):
        token = set_state(_IGNORE)
        try:
            return fn(*args)
        finally:
            reset_state(token)
    run.__wrapped__ = fn
    return run


def quiet_keywords(fn: Callable) -> Callable:
    """`quiet(fn)` for an implementation taking its attributes by keyword
    (`impl(*arrays, **attrs)`, as a primitive's is called)."""
    quiet_fn = quiet(lambda arrays, attrs: fn(*arrays, **attrs))
    return lambda *arrays, **attrs: quiet_fn(arrays, attrs)
