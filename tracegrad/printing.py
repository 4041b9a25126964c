"""`repr` of tensors in PyTorch's format: `tensor([1., 2.], requires_grad=True)`."""

from __future__ import annotations

import numpy as np

from tracegrad.ir import types


def _format_values(array: np.ndarray, dtype: types.DType) -> str:
    if dtype in types.REDUCED_FLOATS:  # (shown through float32, which holds their values exactly)
        array = array.astype(np.float32)
    if array.dtype == np.bool_:
        formatter = {"bool": lambda v: "True" if v else "False"}
    elif array.dtype.kind == "f":
        finite = array[np.isfinite(array)]
        integral = finite.size == 0 or bool(np.all(finite == np.round(finite)))
        large = finite.size and (np.abs(finite).max() >= 1e8 or
                                 (np.abs(finite[finite != 0]).min() < 1e-4 if np.any(finite) else False))
        if integral and not large:
            formatter = {"float_kind": lambda v: f"{v:.0f}." if np.isfinite(v) else _special(v)}
        elif large:
            formatter = {"float_kind": lambda v: f"{v:.4e}" if np.isfinite(v) else _special(v)}
        else:
            formatter = {"float_kind": lambda v: f"{v:.4f}" if np.isfinite(v) else _special(v)}
    else:
        formatter = None
    return np.array2string(array, separator=", ", prefix="tensor(", formatter=formatter,
                           threshold=1000, edgeitems=3)


def _special(v) -> str:
    return "nan" if np.isnan(v) else ("inf" if v > 0 else "-inf")


def tensor_repr(t) -> str:
    parts = [_format_values(t._concrete(), t.dtype)]
    if t.dtype not in (types.default_float, types.int64, types.bool_):
        parts.append(f"dtype=tracegrad.{t.dtype.name}")
    if t.numel() == 0:
        parts.append(f"size={tuple(t.shape)}")
    if t._grad_fn is not None:
        parts.append(f"grad_fn=<{t._grad_fn.name()}>")
    elif t._requires_grad:
        parts.append("requires_grad=True")
    return "tensor(" + ", ".join(parts) + ")"
