"""NumPy implementations of math functions NumPy lacks: erf, erfc, erfinv, lgamma,
digamma and polygamma. Each takes and returns an array of one float dtype, computed in
float64.

erf and erfc use Cephes' rational approximations (S. Moshier, public domain): erf on
|x| <= 1, erfc on 1 < |x| < 8 and |x| >= 8, with exp(-x*x) taken in two parts so that the
rounding of x*x is not amplified for large x (Cephes' expx2). Accurate to a few ulp in
float64. erfinv starts from Giles' single-precision approximation and refines it with
Newton steps on erf (or erfc near +-1, where 1 - |y| is exact). lgamma is Python's
`math.lgamma` per element (correctly rounded nearly everywhere, but a Python call per
element). digamma and polygamma shift x up by their recurrences and sum asymptotic
series; digamma reflects negative x.
"""

from __future__ import annotations

import math

import numpy as np

_T = (9.60497373987051638749e0, 9.00260197203842689217e1, 2.23200534594684319226e3,
      7.00332514112805075473e3, 5.55923013010394962768e4)
_U = (1.0, 3.35617141647503099647e1, 5.21357949780152679795e2, 4.59432382970980127987e3,
      2.26290000613890934246e4, 4.92673942608635921086e4)
_P = (2.46196981473530512524e-10, 5.64189564831068821977e-1, 7.46321056442269912687e0,
      4.86371970985681366614e1, 1.96520832956077098242e2, 5.26445194995477358631e2,
      9.34528527171957607540e2, 1.02755188689515710272e3, 5.57535335369399327526e2)
_Q = (1.0, 1.32281951154744992508e1, 8.67072140885989742329e1, 3.54937778887819891062e2,
      9.75708501743205489753e2, 1.82390916687909736289e3, 2.24633760818710981792e3,
      1.65666309194161350182e3, 5.57535340817727675546e2)
_R = (5.64189583547755073984e-1, 1.27536670759978104416e0, 5.01905042251180477414e0,
      6.16021097993053585195e0, 7.40974269950448939160e0, 2.97886665372100240670e0)
_S = (1.0, 2.26052863220117276590e0, 9.39603524938001434673e0, 1.20489539808096656605e1,
      1.70814450747565897222e1, 9.60896809063285878198e0, 3.36907645100081516050e0)


def _polyval(coefficients, x):
    result = np.full_like(x, coefficients[0])
    for c in coefficients[1:]:
        result = result * x + c
    return result


def _exp_minus_square(ax: np.ndarray) -> np.ndarray:
    """exp(-ax*ax) for ax >= 0, with ax*ax split as m*m + (2*m*f + f*f), m a multiple of
    1/128: m*m is exact, so the rounding of the square is not multiplied by ax*ax."""
    m = np.floor(ax * 128.0 + 0.5) / 128.0
    f = ax - m
    return np.exp(-m * m) * np.exp(-(2.0 * m * f + f * f))


def _erf_parts(x64: np.ndarray):
    """(|x| <= 1, erf there, erfc(|x|) elsewhere) by Cephes' three approximations."""
    # Beyond |x| = 30, erfc underflows; clipping keeps the rational terms finite at inf.
    ax = np.minimum(np.abs(x64), 30.0)
    small = ax <= 1.0
    z = x64 * x64
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        erf_small = x64 * _polyval(_T, z) / _polyval(_U, z)
        mid = ax < 8.0
        p = np.where(mid, _polyval(_P, ax), _polyval(_R, ax))
        q = np.where(mid, _polyval(_Q, ax), _polyval(_S, ax))
        erfc_large = _exp_minus_square(ax) * p / q
    return small, erf_small, erfc_large


def erfc(x: np.ndarray) -> np.ndarray:
    """Elementwise erfc = 1 - erf, without the cancellation of that difference for large x."""
    x = np.asarray(x)
    x64 = x.astype(np.float64)
    small, erf_small, erfc_large = _erf_parts(x64)
    result = np.where(small, 1.0 - erf_small, np.where(x64 > 0, erfc_large, 2.0 - erfc_large))
    result = np.where(np.isnan(x64), np.nan, result)
    return result.astype(x.dtype, copy=False)


def erf(x: np.ndarray) -> np.ndarray:
    """Elementwise erf, in the input's float dtype (computed in float64)."""
    x = np.asarray(x)
    out_dtype = x.dtype
    x64 = x.astype(np.float64)
    small, erf_small, erfc_large = _erf_parts(x64)
    erf_large = np.copysign(1.0 - erfc_large, x64)
    result = np.where(small, erf_small, erf_large)
    result = np.where(np.isnan(x64), np.nan, result)
    return result.astype(out_dtype, copy=False)


# Giles, "Approximating the erfinv function" (2010), single precision: a polynomial in
# w = -log(1 - y*y), on w < 5 and on sqrt(w) beyond. About 1e-7 relative error.
_GILES_CENTRAL = (1.50140941, 0.246640727, -0.00417768164, -0.00125372503, 0.00021858087,
                  -4.39150654e-06, -3.5233877e-06, 3.43273939e-07, 2.81022636e-08)
_GILES_TAIL = (2.83297682, 1.00167406, 0.00943887047, -0.0076224613, 0.00573950773,
               -0.00367342844, 0.00134934322, 0.000100950558, -0.000200214257)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def erfinv(y: np.ndarray) -> np.ndarray:
    """Elementwise inverse of erf: +-inf at +-1, NaN outside [-1, 1]."""
    y = np.asarray(y)
    y64 = y.astype(np.float64)
    a = np.abs(y64)
    with np.errstate(all="ignore"):
        w = -np.log((1.0 - a) * (1.0 + a))
        central = _polyval(_GILES_CENTRAL[::-1], w - 2.5)
        tail = _polyval(_GILES_TAIL[::-1], np.sqrt(w) - 3.0)
        x = np.where(w < 5.0, central, tail) * a
        # Newton on erf(x) = a, or on log erfc(x) = log(1 - a) (1 - a is exact for a >= 0.5)
        # where erf is too close to 1 to tell its neighbours apart; the logarithm keeps
        # the steps quadratic far out, where erfc falls off as exp(-x*x). The start is
        # good to ~1e-7 (a few 1e-4 at the last float64 below 1), so three steps reach
        # float64's precision.
        near_one = a >= 0.5
        log_tail = np.log(1.0 - a)
        for _ in range(3):
            slope = _TWO_OVER_SQRT_PI * _exp_minus_square(x)
            tail = erfc(x)
            step = np.where(near_one, (np.log(tail) - log_tail) * tail, erf(x) - a) / slope
            x = x - np.where(near_one, -step, step)
    x = np.where(a == 1.0, np.inf, x)
    x = np.where(a > 1.0, np.nan, x)  # (NaN stays NaN through every step above)
    result = np.copysign(x, y64)
    return result.astype(y.dtype, copy=False)


def _lgamma_scalar(v: float) -> float:
    try:
        return math.lgamma(v)
    except ValueError:  # a pole: 0 or a negative integer
        return math.inf


_lgamma_ufunc = np.frompyfunc(_lgamma_scalar, 1, 1)


def lgamma(x: np.ndarray) -> np.ndarray:
    """Elementwise log|gamma(x)|: inf at the poles and at +-inf, as PyTorch's."""
    x = np.asarray(x)
    result = _lgamma_ufunc(x.astype(np.float64))
    return np.asarray(result, dtype=np.float64).astype(x.dtype, copy=False)


# Asymptotic series of digamma: log x - 1/(2x) - sum B_2k / (2k x^2k), coefficients of
# x^-2k for k = 1..7, good to float64's precision for x >= 10.
_DIGAMMA_SERIES = (1.0 / 12, -1.0 / 120, 1.0 / 252, -1.0 / 240, 1.0 / 132, -691.0 / 32760, 1.0 / 12)
_DIGAMMA_SHIFT = 10.0


def _digamma_positive(x: np.ndarray) -> np.ndarray:
    """digamma for x > 0: psi(x) = psi(x + 1) - 1/x up to x >= 10, then the series."""
    shift = np.zeros_like(x)
    x = x.copy()
    while True:
        low = x < _DIGAMMA_SHIFT
        if not low.any():
            break
        shift -= np.where(low, 1.0 / np.where(low, x, 1.0), 0.0)
        x += low
    inverse_square = 1.0 / (x * x)
    series = inverse_square * _polyval(_DIGAMMA_SERIES[::-1], inverse_square)
    return shift + np.log(x) - 0.5 / x - series


def digamma(x: np.ndarray) -> np.ndarray:
    """Elementwise digamma (psi), as PyTorch's: -inf at +0, inf at -0, NaN at the negative
    integers and at -inf."""
    x = np.asarray(x)
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        negative = x64 < 0
        # psi(x) = psi(1 - x) - pi / tan(pi x); tan of the distance to the nearest
        # integer (exact) keeps pi*x's rounding out for large |x|.
        reflected = np.where(negative, 1.0 - x64, x64)
        value = _digamma_positive(np.where(np.isfinite(reflected) & (reflected > 0), reflected, 1.0))
        value = np.where(np.isfinite(reflected), value, reflected)  # inf -> inf, NaN -> NaN
        offset = x64 - np.round(x64)
        value = np.where(negative, value - np.pi / np.tan(np.pi * offset), value)
        value = np.where(negative & (offset == 0), np.nan, value)  # poles (and -inf)
        value = np.where(x64 == 0, -np.copysign(np.inf, x64), value)
    return value.astype(x.dtype, copy=False)


_BERNOULLI = (1.0 / 6, -1.0 / 30, 1.0 / 42, -1.0 / 30, 5.0 / 66, -691.0 / 2730, 7.0 / 6, -3617.0 / 510)


def _hurwitz_zeta(s: int, x: np.ndarray) -> np.ndarray:
    """zeta(s, x) = sum over k >= 0 of (x + k)^-s, for an integer s >= 2: terms summed
    until x + k >= 15 + s, then Euler-Maclaurin's tail with eight Bernoulli terms."""
    start = 15.0 + s
    total = np.zeros_like(x)
    a = x.copy()
    while True:
        low = a < start
        if not low.any():
            break
        total += np.where(low, np.where(low, a, 1.0) ** -s, 0.0)
        a += low
    tail = a ** (1.0 - s) / (s - 1) + 0.5 * a ** -s
    rising = float(s)  # s (s+1) ... (s+2j-2)
    power = a ** (-s - 1)  # a^(-s-2j+1)
    factorial = 2.0  # (2j)!
    for j, bernoulli in enumerate(_BERNOULLI, start=1):
        tail = tail + bernoulli / factorial * rising * power
        rising *= (s + 2 * j - 1) * (s + 2 * j)
        power = power / (a * a)
        factorial *= (2 * j + 1) * (2 * j + 2)
    return total + tail


def polygamma(x: np.ndarray, n: int) -> np.ndarray:
    """Elementwise polygamma(n, x) = d^n/dx^n digamma(x) for n >= 1:
    (-1)^(n+1) n! zeta(n + 1, x). +-inf at 0 and the negative integers, 0 at inf, NaN at -inf."""
    x = np.asarray(x)
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        finite = np.isfinite(x64)
        zeta = _hurwitz_zeta(n + 1, np.where(finite, x64, 1.0))
        pole = finite & (x64 <= 0) & (x64 == np.round(x64))
        zeta = np.where(pole, np.inf, zeta)
        zeta = np.where(x64 == np.inf, 0.0, np.where(finite | pole, zeta, np.nan))
        value = (-1.0) ** (n + 1) * math.factorial(n) * zeta
    return value.astype(x.dtype, copy=False)
