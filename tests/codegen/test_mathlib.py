"""Accuracy of the vectorizable math library against NumPy: within 4 ulp on large sampled
ranges, special values (0, -0, inf, -inf, nan, subnormals) exactly as NumPy."""

import math

import numpy as np
import pytest

import tracegrad as tg

MAX_ULP = 4
SAMPLES = 400_000


def _ulp_error(got: np.ndarray, ref: np.ndarray, dtype) -> np.ndarray:
    same = (got == ref) | (np.isnan(got) & np.isnan(ref))
    spacing = np.spacing(np.abs(ref).astype(dtype)).astype(np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(same, 0.0, np.abs(got.astype(np.float64) - ref.astype(np.float64)) / spacing)


def _erf_reference(x: np.ndarray) -> np.ndarray:
    return np.array([math.erf(v) for v in x.astype(np.float64)])


def _log_samples(rng, dtype, n):
    finfo = np.finfo(dtype)
    exponents = rng.uniform(np.log(finfo.tiny), np.log(finfo.max), n)
    return np.exp(exponents).astype(dtype)


# name, NumPy reference, sampler(rng, dtype, n)
FUNCTIONS = [
    ("exp", np.exp, lambda rng, dt, n: rng.uniform(-105 if dt == np.float32 else -746,
                                                   89 if dt == np.float32 else 710, n).astype(dt)),
    ("log", np.log, _log_samples),
    ("tanh", np.tanh, lambda rng, dt, n: np.concatenate([rng.uniform(-20, 20, n // 2),
                                                         rng.uniform(-1, 1, n // 2)]).astype(dt)),
    ("erf", _erf_reference, lambda rng, dt, n: rng.uniform(-7, 7, n // 8).astype(dt)),
    ("sqrt", np.sqrt, _log_samples),
    ("sigmoid", lambda x: 1 / (1 + np.exp(-x)), lambda rng, dt, n: rng.uniform(-80, 80, n).astype(dt)),
]
SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e-30, 1.0, -1.0]


def _compiled(name):
    return tg.compile(lambda t: getattr(t, name)())


def _reference(reference, x, dtype):
    with np.errstate(all="ignore"):
        return np.asarray(reference(x.astype(np.float64))).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name,reference,sampler", FUNCTIONS, ids=[f[0] for f in FUNCTIONS])
def test_math_function_within_4_ulp_of_numpy(name, reference, sampler, dtype):
    x = sampler(np.random.default_rng(0), dtype, SAMPLES)
    got = _compiled(name)(tg.from_numpy(x)).numpy()
    errors = _ulp_error(got, _reference(reference, x, dtype), dtype)
    worst = int(np.argmax(errors))
    assert errors[worst] <= MAX_ULP, f"{name}({x[worst]!r}) = {got[worst]!r}: {errors[worst]} ulp"


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name,reference", [(f[0], f[1]) for f in FUNCTIONS], ids=[f[0] for f in FUNCTIONS])
def test_math_function_special_values_match_numpy_exactly(name, reference, dtype):
    tiny = np.finfo(dtype).smallest_subnormal
    x = np.array(SPECIALS + [tiny, -tiny, np.finfo(dtype).max, np.finfo(dtype).tiny], dtype=dtype)
    got = _compiled(name)(tg.from_numpy(x)).numpy()
    expected = _reference(reference, x, dtype)
    if name == "erf":  # math.erf of tiny inputs: 2/sqrt(pi)*x, rounded to the dtype
        tiny_inputs = np.abs(x) < 1e-20
        expected[tiny_inputs] = (2 / np.sqrt(np.pi) * x[tiny_inputs].astype(np.float64)).astype(dtype)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    finite = ~np.isnan(expected)
    np.testing.assert_array_equal(np.signbit(got[finite]), np.signbit(expected[finite]))
    errors = _ulp_error(got, expected, dtype)
    assert errors.max() <= 1, f"{name}: {dict(zip(x.tolist(), got.tolist()))}"
