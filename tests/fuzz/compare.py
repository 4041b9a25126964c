"""Comparing a mode's outcome with its reference: errors, keys, dtypes, shapes and values
with dtype-aware tolerances (NaN equals NaN, integers and booleans exactly). A difference is
a `Failure` with a class name, the mode and what differed."""

from __future__ import annotations

import dataclasses

import numpy as np

from .config import DOCUMENTED_COMPILE_LIMITS, DOCUMENTED_EAGER_ONLY_ERRORS, DOCUMENTED_TORCH_DIVERGENCES, \
    TOLERANCES, TORCH_TOLERANCES
from .runner import Outcome

WRONG_VALUE = "wrong value"
WRONG_GRAD = "wrong grad"
MISMATCH = "dtype or shape mismatch"
COMPILE_ONLY_ERROR = "compile-only error"
EAGER_ONLY_ERROR = "eager-only error"
SPEED_LAYER_ERROR = "eager speed-layer error"
CRASH = "crash in child"
# Not a failure: a documented limit (config.DOCUMENTED_COMPILE_LIMITS, DOCUMENTED_TORCH_DIVERGENCES).
DOCUMENTED_LIMIT = "documented limit"
# Not a failure either: a value differs from the float32 reference, but the float64
# program agrees with the mode and not with the reference (`rounding_only`).
REFERENCE_ROUNDING = "the reference's own rounding"
# Not a failure either: PyTorch refuses a backward through a tensor modified in place since
# it was saved, where tracegrad saved something else (a difference, a converted copy) and
# raised nothing; PyTorch saving a copy of everything it saves computes the reference's
# values (`runner.run_torch(saved_copies=True)`), so tracegrad's are right.
TORCH_SAVES_OTHERS = "PyTorch saves a tensor modified since, tracegrad saved another"
NOT_FAILING = (DOCUMENTED_LIMIT, REFERENCE_ROUNDING, TORCH_SAVES_OTHERS)
TORCH_RAISES = "torch raises, tracegrad does not"
# The start of PyTorch's error for a saved tensor modified in place since it was saved.
VERSION_ERROR = "RuntimeError: one of the variables needed for gradient computation has been modified by an inplace"
TRACEGRAD_RAISES = "tracegrad raises, torch does not"


@dataclasses.dataclass
class Failure:
    seed: int
    mode: str
    kind: str
    detail: str
    features: tuple[str, ...] = ()
    bisect: str = ""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def compare(seed: int, mode: str, got: Outcome, want: Outcome, loose: bool = False) -> Failure | None:
    """The first difference between `got` (mode `mode`) and its reference `want`, if any;
    `loose`: every float compared with float32's tolerance (a program mixing precisions,
    whose float64 results may be computed from float32 values rounded or not)."""
    torch_mode = mode == "torch"
    if want.error is not None or got.error is not None:
        if want.error is not None and got.error is not None:
            return None
        if got.error is not None:
            kind = TORCH_RAISES if torch_mode else (SPEED_LAYER_ERROR if mode.startswith("eager")
                                                    else COMPILE_ONLY_ERROR)
            if kind == COMPILE_ONLY_ERROR and got.error.startswith(DOCUMENTED_COMPILE_LIMITS):
                kind = DOCUMENTED_LIMIT
            return Failure(seed, mode, kind, f"{mode} raised {got.error}; the reference did not")
        kind = TRACEGRAD_RAISES if torch_mode else EAGER_ONLY_ERROR
        if torch_mode and any(text in want.error for text in DOCUMENTED_TORCH_DIVERGENCES):
            kind = DOCUMENTED_LIMIT
        if kind == EAGER_ONLY_ERROR and not mode.startswith("eager") and want.error.startswith(
                DOCUMENTED_EAGER_ONLY_ERRORS):
            kind = DOCUMENTED_LIMIT
        return Failure(seed, mode, kind, f"the reference raised {want.error}; {mode} did not")
    if list(got.values) != list(want.values):
        return Failure(seed, mode, MISMATCH, f"results {list(got.values)} != reference {list(want.values)}")
    tolerances = TORCH_TOLERANCES if torch_mode else TOLERANCES
    for key in want.values:
        failure = _compare_value(seed, mode, key, got, want, loose, tolerances)
        if failure is not None:
            return failure
    return None


def rounding_only(seed: int, mode: str, got: Outcome, want: Outcome, truth: Outcome | None,
                  loose: bool = False) -> bool:
    """Whether the values of `got` that differ from its float32 reference `want` are the
    reference's rounding: the float64 run of the program (`runner.run_float64`, read at
    the declared dtypes) agrees with `got` everywhere, and not with `want`. An
    ill-conditioned computation (a gradient that cancels to 0, a normalisation of values
    that nearly tie) rounds differently in each order of the same operations; float64
    tells which order kept the value."""
    if truth is None or truth.error is not None or list(truth.values) != list(want.values):
        return False
    at_precision = Outcome(None)
    for key, value in truth.values.items():
        declared = want.dtypes.get(key)
        if value is not None and declared is not None and value.dtype.kind == "f" and declared in ("float32",
                                                                                                   "float64"):
            value = value.astype(declared)
        at_precision.values[key] = value
        at_precision.dtypes[key] = declared if declared is not None else truth.dtypes.get(key)
    return (compare(seed, mode, got, at_precision, loose) is None
            and compare(seed, mode, want, at_precision, loose) is not None)


def _kind(key: str) -> str:
    return WRONG_GRAD if key.startswith("grad:") else WRONG_VALUE


def _compare_value(seed: int, mode: str, key: str, got: Outcome, want: Outcome, loose: bool,
                   tolerances: dict) -> Failure | None:
    a, b = got.values[key], want.values[key]
    if a is None or b is None:
        if a is None and b is None:
            return None
        return Failure(seed, mode, _kind(key), f"{key}: {_describe(a)} vs reference {_describe(b)}")
    for outcome, array in ((got, a), (want, b)):
        declared = outcome.dtypes.get(key)
        if declared != array.dtype.name and not (declared == "bool" and array.dtype == np.bool_):
            who = mode if outcome is got else "reference"
            return Failure(seed, mode, MISMATCH, f"{key}: {who} has an array of {array.dtype} in a {declared} tensor")
    if got.dtypes[key] != want.dtypes[key] or a.shape != b.shape:
        return Failure(seed, mode, MISMATCH, f"{key}: {got.dtypes[key]}{list(a.shape)} vs reference "
                                             f"{want.dtypes[key]}{list(b.shape)}")
    if not close(a, b, loose, tolerances):
        return Failure(seed, mode, _kind(key), f"{key}: {_difference(a, b)}")
    return None


def close(a: np.ndarray, b: np.ndarray, loose: bool = False, tolerances: dict = TOLERANCES) -> bool:
    """Equal within the tolerance of the dtype (NaN equal to NaN, infinities exactly)."""
    if a.dtype.kind not in "fc":
        return bool(np.array_equal(a, b))
    rtol, atol = tolerances["float32" if loose else a.dtype.name]
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    nan_a, nan_b = np.isnan(a64), np.isnan(b64)
    if not np.array_equal(nan_a, nan_b):
        return False
    inf_a, inf_b = np.isinf(a64), np.isinf(b64)
    if not np.array_equal(inf_a, inf_b) or not np.array_equal(a64[inf_a], b64[inf_b]):
        return False
    finite = ~(nan_b | inf_b)
    if not finite.any():
        return True
    scale = max(1.0, float(np.abs(b64[finite]).max()))
    return bool(np.all(np.abs(a64[finite] - b64[finite]) <= atol * scale + rtol * np.abs(b64[finite])))


def _describe(array) -> str:
    if array is None:
        return "None"
    return f"{array.dtype}{list(array.shape)}"


def _difference(a: np.ndarray, b: np.ndarray) -> str:
    """Where and by how much two arrays of one shape differ, briefly."""
    if a.size == 0:
        return "empty arrays differ"
    with np.errstate(all="ignore"):
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    diff = np.where(np.isnan(diff), np.inf, diff)
    index = np.unravel_index(int(np.argmax(diff)), a.shape)
    text = f"at {list(index)}: {a[index]!r} vs reference {b[index]!r}"
    if a.size <= 8:
        text += f" (got {a.ravel().tolist()}, reference {b.ravel().tolist()})"
    return text
