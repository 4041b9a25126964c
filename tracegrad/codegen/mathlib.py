"""Vectorizable math functions emitted as plain LLVM IR (no libm calls, which would
scalarize the loop): range reduction and polynomials, with branch-free special cases.

Accuracy is tested against NumPy in tests/codegen/test_mathlib.py. Each function takes a
`ScalarBuilder` and a float (f32 or f64) value and returns a value of the same type.
"""

from __future__ import annotations

import math

from tracegrad.codegen.llvm import F32, F64, I32, I64

LN2_HI_F64, LN2_LO_F64 = 6.93147180369123816490e-01, 1.90821492927058770002e-10
LN2_HI_F32, LN2_LO_F32 = 0.693359375, -2.12194440e-4


def _horner(b, x, coefficients):
    """c0 + c1 x + c2 x^2 + ... (coefficients in increasing order)."""
    result = b.like(coefficients[-1], x)
    for c in reversed(coefficients[:-1]):
        result = b.add(b.mul(result, x), b.like(c, x))
    return result


def _pow2(b, n, is_f64):
    """2**n for integer n (as float type) in the normal exponent range, built from bits."""
    if is_f64:
        bits = b.ir.shl(b.ir.add(n, I64(1023)), I64(52))
        return b.ir.bitcast(bits, F64)
    bits = b.ir.shl(b.ir.add(n, I32(127)), I32(23))
    return b.ir.bitcast(bits, F32)


def exp(b, x):
    is_f64 = x.type == F64
    int_type = I64 if is_f64 else I32
    low, high = (-746.0, 710.0) if is_f64 else (-104.0, 89.0)
    clamped = b.intrinsic("minnum", b.intrinsic("maxnum", x, b.like(low, x)), b.like(high, x))
    n = b.intrinsic("rint", b.mul(clamped, b.like(1 / math.log(2), x)))
    hi, lo = (LN2_HI_F64, LN2_LO_F64) if is_f64 else (LN2_HI_F32, LN2_LO_F32)
    r = b.sub(b.sub(clamped, b.mul(n, b.like(hi, x))), b.mul(n, b.like(lo, x)))
    degree = 13 if is_f64 else 7
    p = _horner(b, r, [1.0 / math.factorial(k) for k in range(degree + 1)])
    # 2**n as two factors so that subnormal results and overflow to inf come out right.
    k = b.ir.fptosi(n, int_type)
    k1 = b.ir.ashr(k, int_type(1))
    k2 = b.ir.sub(k, k1)
    result = b.mul(b.mul(p, _pow2(b, k1, is_f64)), _pow2(b, k2, is_f64))
    return b.select(b.is_nan(x), x, result)


def log(b, x):
    is_f64 = x.type == F64
    int_type = I64 if is_f64 else I32
    mantissa_bits, bias = (52, 1023) if is_f64 else (23, 127)
    tiny = 2.0 ** (-1022 if is_f64 else -126)
    # Subnormals: scale into the normal range first, then correct the exponent.
    subnormal = b.compare("<", x, b.like(tiny, x))
    scale = 54 if is_f64 else 25
    scaled = b.select(subnormal, b.mul(x, b.like(2.0 ** scale, x)), x)
    bits = b.ir.bitcast(scaled, int_type)
    exponent = b.ir.sub(b.ir.and_(b.ir.lshr(bits, int_type(mantissa_bits)), int_type(2 * bias + 1)),
                        int_type(bias))
    exponent = b.ir.sub(exponent, b.ir.select(subnormal, int_type(scale), int_type(0)))
    mantissa_mask = (1 << mantissa_bits) - 1
    m = b.ir.bitcast(b.ir.or_(b.ir.and_(bits, int_type(mantissa_mask)), int_type(bias << mantissa_bits)),
                     x.type)
    # m in [1, 2); move to [sqrt(1/2), sqrt(2)) so that f = m - 1 is small.
    big = b.compare(">", m, b.like(math.sqrt(2.0), x))
    m = b.select(big, b.mul(m, b.like(0.5, x)), m)
    exponent = b.ir.add(exponent, b.ir.zext(big, int_type))
    f = b.sub(m, b.like(1.0, x))
    s = b.div(f, b.add(f, b.like(2.0, x)))
    z = b.mul(s, s)
    terms = 12 if is_f64 else 6
    series = _horner(b, z, [1.0 / (2 * k + 3) for k in range(terms)])
    log1p_f = b.add(b.add(s, s), b.mul(b.add(s, s), b.mul(z, series)))
    e = b.ir.sitofp(exponent, x.type)
    hi, lo = (LN2_HI_F64, LN2_LO_F64) if is_f64 else (LN2_HI_F32, LN2_LO_F32)
    result = b.add(b.mul(e, b.like(hi, x)), b.add(log1p_f, b.mul(e, b.like(lo, x))))
    # Special values as NumPy: log(0) = -inf, log(x<0) = nan, log(inf) = inf, log(nan) = nan.
    result = b.select(b.compare("==", x, b.like(0.0, x)), b.like(-math.inf, x), result)
    result = b.select(b.compare("<", x, b.like(0.0, x)), b.like(math.nan, x), result)
    result = b.select(b.compare("==", x, b.like(math.inf, x)), x, result)
    return b.select(b.is_nan(x), x, result)


def sqrt(b, x):
    return b.intrinsic("sqrt", x)


def sigmoid(b, x):
    # 1 / (1 + exp(-x)): exp(-x) overflows to inf for very negative x, giving exactly 0.
    one = b.like(1.0, x)
    return b.div(one, b.add(one, exp(b, b.neg(x))))


def _in_f64(b, x, fn):
    """Evaluate `fn` in float64 for a float32 input: simple and accurate to well within
    float32's 4-ulp budget, at half the vector width."""
    if x.type == F64:
        return fn(b, x)
    return b.ir.fptrunc(fn(b, b.ir.fpext(x, F64)), F32)


def _tanh_taylor(terms: int) -> list[float]:
    """Taylor coefficients of tanh(x)/x in powers of x^2, from Bernoulli numbers."""
    from fractions import Fraction
    bernoulli = [Fraction(1)]
    for m in range(1, 2 * terms + 1):
        bernoulli.append(-sum(Fraction(math.comb(m + 1, k)) * bernoulli[k] for k in range(m)) / (m + 1))
    return [float(Fraction(2 ** (2 * n) * (2 ** (2 * n) - 1)) * bernoulli[2 * n] / math.factorial(2 * n))
            for n in range(1, terms + 1)]


TANH_SMALL = 0.55
_TANH_COEFFICIENTS = {F64: _tanh_taylor(20), F32: _tanh_taylor(9)}


def tanh(b, x):
    ax = b.intrinsic("fabs", x)
    # Near zero, the odd Taylor series (alternating, so no cancellation trouble); elsewhere
    # 1 - 2 / (exp(2|x|) + 1), which saturates to 1 when exp overflows.
    small = b.mul(x, _horner(b, b.mul(x, x), _TANH_COEFFICIENTS[x.type]))
    two = b.like(2.0, x)
    large = b.sub(b.like(1.0, x), b.div(two, b.add(exp(b, b.mul(ax, two)), b.like(1.0, x))))
    large = b.intrinsic("copysign", large, x)
    result = b.select(b.compare("<", ax, b.like(TANH_SMALL, x)), small, large)
    return b.select(b.is_nan(x), x, result)


# Cephes' erf/erfc rational approximations (S. Moshier, public domain), as in ops/mathfn.py.
def _erf64(b, x):
    from tracegrad.ops import mathfn
    ax = b.intrinsic("minnum", b.intrinsic("fabs", x), b.like(30.0, x))
    z = b.mul(x, x)
    inner = b.div(b.mul(x, _horner(b, z, mathfn._T[::-1])), _horner(b, z, mathfn._U[::-1]))
    mid = b.compare("<", ax, b.like(8.0, x))
    p = b.select(mid, _horner(b, ax, mathfn._P[::-1]), _horner(b, ax, mathfn._R[::-1]))
    q = b.select(mid, _horner(b, ax, mathfn._Q[::-1]), _horner(b, ax, mathfn._S[::-1]))
    erfc = b.div(b.mul(exp(b, b.neg(b.mul(ax, ax))), p), q)
    outer = b.intrinsic("copysign", b.sub(b.like(1.0, x), erfc), x)
    result = b.select(b.compare("<=", ax, b.like(1.0, x)), inner, outer)
    return b.select(b.is_nan(x), x, result)


def erf(b, x):
    return _in_f64(b, x, _erf64)
