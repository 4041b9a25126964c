"""Vectorizable math functions emitted as plain LLVM IR (no libm calls, which would
scalarize the loop): range reduction and polynomials, with branch-free special cases.

Accuracy is tested against NumPy in tests/codegen/test_mathlib.py. Each function takes a
`ScalarBuilder` and a float (f32 or f64) value and returns a value of the same type.
"""

from __future__ import annotations

import functools
import math
import struct
from fractions import Fraction

from llvmlite import ir

from tracegrad.codegen.ir_builder import F32, F64, I32, I64

LN2_HI_F64, LN2_LO_F64 = 6.93147180369123816490e-01, 1.90821492927058770002e-10
LN2_HI_F32, LN2_LO_F32 = 0.693359375, -2.12194440e-4


def _horner(b, x, coefficients):
    """c0 + c1 x + c2 x^2 + ... (coefficients in increasing order), with fused multiply-adds."""
    result = b.like(coefficients[-1], x)
    for c in reversed(coefficients[:-1]):
        result = b.fmuladd(result, x, b.like(c, x))
    return result


# exp(x) = 2**n * exp(r) with n = rint(x / ln2) and |r| <= ln2/2. exp(r) is a polynomial:
# for float64 the Taylor series to r**13 (error below 2**-60); for float32 a degree-5
# polynomial with c0 = c1 = 1 and the rest minimax for the relative error on
# [-ln2/2, ln2/2] (Remez exchange; 1.05e-7, 0.9 ulp before rounding; measured on every
# float32 input: at most 2 ulp). 2**n scales with one rounding (`ldexp`), so subnormal
# results and overflow to inf come out right.
_EXP_F32 = (1.0, 1.0, 0.4999923149666023, 0.16667114655751075, 0.04189015672112246, 0.008312519677182582)
_EXP_F64 = tuple(1.0 / math.factorial(k) for k in range(14))
# rint(v) for |v| < 2**22 (2**51): v + SHIFT rounds to an integer held in the low mantissa
# bits, so n is read from the bits of the sum (no float-to-int conversion, and a NaN
# stays a NaN through the scaling instead of becoming an out-of-range conversion).
_SHIFT_F32, _SHIFT_F64 = 1.5 * 2.0 ** 23, 1.5 * 2.0 ** 52


def _float_bits(value: float, is_f64: bool) -> int:
    """The bits of `value` as a float64 or float32, as an unsigned integer."""
    return int.from_bytes(struct.pack("<d" if is_f64 else "<f", value), "little")


def exp(b, x, sign: int = 0):
    """exp(x). `sign`: -1 when the caller knows x <= 0 (or NaN), 1 when x >= 0 (or NaN), which
    leaves out the clamp at the other end (one max or min instruction of the loop)."""
    is_f64 = x.type == F64
    int_type = I64 if is_f64 else I32
    # Beyond these bounds exp is 0 or inf in the type; NaN passes the clamp.
    low, high = (-746.0, 710.0) if is_f64 else (-104.0, 89.0)
    if sign < 0:
        clamped = b.ir.select(b.ir.fcmp_ordered("<", x, b.like(low, x)), b.like(low, x), x)
    elif sign > 0:
        clamped = b.ir.select(b.ir.fcmp_ordered(">", x, b.like(high, x)), b.like(high, x), x)
    else:
        clamped = b.clamp(x, low, high)
    shift = b.like(_SHIFT_F64 if is_f64 else _SHIFT_F32, x)
    shifted = b.fmuladd(clamped, b.like(1 / math.log(2), x), shift)
    n = b.sub(shifted, shift)
    hi, lo = (LN2_HI_F64, LN2_LO_F64) if is_f64 else (LN2_HI_F32, LN2_LO_F32)
    # ln2 = hi + lo with hi's few bits making n*hi exact, with or without an fma.
    r = b.fmuladd(n, b.like(-lo, x), b.fmuladd(n, b.like(-hi, x), clamped))
    p = _horner(b, r, _EXP_F64 if is_f64 else _EXP_F32)
    k = b.ir.sub(b.ir.bitcast(shifted, int_type), int_type(_float_bits(shift.constant, is_f64)))
    return b.ldexp(p, k)


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
    # With z = exp(-|x|) in (0, 1]: 1 / (1 + z) for x >= 0, z / (1 + z) below, as the NumPy
    # implementation does. 1 / (1 + exp(-x)) alone would give 0 below -88.7 (float32),
    # where exp(-x) overflows, instead of the subnormal results down to -103.9.
    one = b.like(1.0, x)
    z = exp(b, b.neg(b.intrinsic("fabs", x)), sign=-1)
    return b.div(b.select(b.compare(">=", x, b.like(0.0, x)), one, z), b.add(one, z))


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
# tanh(x)/x as a polynomial in x**2 below TANH_SMALL: for float64 20 terms of the Taylor
# series; for float32 degree 5 with c0 = 1, minimax for the relative error (Remez exchange;
# 1.0e-9, 0.02 ulp), where the Taylor series needs degree 9.
_TANH_COEFFICIENTS = {F64: _tanh_taylor(20),
                      F32: (1.0, -0.3333331755963387, 0.13332586137710592, -0.05385230986000507,
                            0.021071678934966358, -0.006274239440280872)}


def tanh(b, x):
    ax = b.intrinsic("fabs", x)
    # Near zero, the odd Taylor series (alternating, so no cancellation trouble); elsewhere
    # 1 - 2 / (exp(2|x|) + 1), which saturates to 1 when exp overflows.
    small = b.mul(x, _horner(b, b.mul(x, x), _TANH_COEFFICIENTS[x.type]))
    two = b.like(2.0, x)
    large = b.sub(b.like(1.0, x), b.div(two, b.add(exp(b, b.mul(ax, two), sign=1), b.like(1.0, x))))
    large = b.intrinsic("copysign", large, x)
    result = b.select(b.compare("<", ax, b.like(TANH_SMALL, x)), small, large)
    return b.select(b.is_nan(x), x, result)


# Cephes' erf/erfc rational approximations (S. Moshier, public domain), as in ops/numpy_special.py.
def _erf64(b, x):
    from tracegrad.ops import numpy_special
    ax = b.intrinsic("minnum", b.intrinsic("fabs", x), b.like(30.0, x))
    z = b.mul(x, x)
    inner = b.div(b.mul(x, _horner(b, z, numpy_special._T[::-1])), _horner(b, z, numpy_special._U[::-1]))
    mid = b.compare("<", ax, b.like(8.0, x))
    p = b.select(mid, _horner(b, ax, numpy_special._P[::-1]), _horner(b, ax, numpy_special._R[::-1]))
    q = b.select(mid, _horner(b, ax, numpy_special._Q[::-1]), _horner(b, ax, numpy_special._S[::-1]))
    erfc = b.div(b.mul(exp(b, b.neg(b.mul(ax, ax)), sign=-1), p), q)
    outer = b.intrinsic("copysign", b.sub(b.like(1.0, x), erfc), x)
    result = b.select(b.compare("<=", ax, b.like(1.0, x)), inner, outer)
    return b.select(b.is_nan(x), x, result)


# erf of a float32, computed in float32 (full vector width): erf(x) = x * P(2x^2 - 1) for |x| <= 1,
# else 1 - exp(-x^2) * Q((2|x| - 5) / 3) with Q(t) ~ erfcx = erfc(x) exp(x^2) on [1, 4]
# (beyond 4, erf rounds to +-1 in float32; Q stays at its value at 4). No division.
# P and Q are Chebyshev least-squares fits in those variables, of relative error 3.7e-11
# and 7.6e-9 (numpy.polynomial.chebyshev on 6000 nodes against math.erf and math.erfc), so
# the error is float32's rounding: within 1.9 ulp of math.erf (mean 0.29) over 10.4M
# samples in [-7, 7], tiny and special values included. The float64 algorithm in float64
# (`_erf64`: three divisions, six rational pieces) was 2.5x as slow in a GELU kernel
# (W7's (8, 64, 512): 725-878 -> 288 µs) for bits float32 does not keep.
_ERF32_SMALL = (0.9654687386375508, -0.14053608901552975, 0.019852497722780072, -0.0022854856569529923,
                0.00021751198975673708, -1.753682468932486e-05, 1.2316401736321656e-06, -7.557492730104546e-08)
_ERF32_LARGE = (0.210806364275941, -0.11152100469538175, 0.056110472584286704, -0.02700572528974308,
                0.012489703671451427, -0.005567332909510667, 0.0024017016955416564, -0.0010171177743453614,
                0.00041450809771261736, -0.00014394859785301815, 5.4947248315963936e-05,
                -3.692872358647591e-05, 1.3819088974739761e-05)


def _erf32(b, x):
    ax = b.intrinsic("fabs", x)
    z = b.mul(x, x)
    inner = b.mul(x, _horner(b, b.sub(b.add(z, z), b.like(1.0, x)), _ERF32_SMALL))
    a = b.intrinsic("minnum", ax, b.like(4.0, x))
    scaled = b.mul(b.sub(b.add(a, a), b.like(5.0, x)), b.like(1.0 / 3.0, x))
    erfc = b.mul(exp(b, b.neg(z), sign=-1), _horner(b, scaled, _ERF32_LARGE))
    outer = b.intrinsic("copysign", b.sub(b.like(1.0, x), erfc), x)
    result = b.select(b.compare("<=", ax, b.like(1.0, x)), inner, outer)
    return b.select(b.is_nan(x), x, result)


def erf(b, x):
    if x.type == F64:
        return _erf64(b, x)
    return _erf32(b, x)



# -- sin and cos --------------------------------------------------------------------------
# Both reduce a = |x| to a = n*pi/2 + r with |r| <= pi/4 (a hair more at the edges), evaluate
# sin(r) and cos(r), and pick one by n mod 4. There are two reductions, both always computed
# (the loop stays branch-free so that it vectorizes) and chosen by a select:
# - Cody-Waite below REDUCTION_SPLIT: n = rint(a * 2/pi), r = a - n*pi/2 with pi/2 split
#   into doubles, one fma each. The first step is exact (a - n*C1 is a multiple of 2**-52
#   below 2); the others round once each at about the size of r.
# - Payne-Hanek above it: a = M * 2**E with M an integer, and a table holds, for each E,
#   F = (2**E * 2/pi) mod 4 in doubles at fixed binary positions. a*2/pi = M*F (mod 4);
#   each M*f is split exactly by fma and integer parts are dropped as they appear, so the
#   fraction comes out with an absolute error near 2**-150. For doubles it can be as small
#   as 2**-62 (at a = 6381956970095103 * 2**797) and all 53 of its bits must be right.
# float32 runs in float64 with shorter polynomials and a lighter Payne-Hanek (7 table rows
# chosen by selects instead of a gather: `_reduce_payne_hanek_single`).

REDUCTION_SPLIT = 2.0 ** 30
# Chunk i of a table row holds the bits of F from 2**-(_CHUNK_ENDS[i-1] + 1) (from 2**1 for
# the first) to 2**-_CHUNK_ENDS[i]: 53 bits each, so that every chunk is an exact double.
_CHUNK_ENDS = (51, 104, 157, 210)


@functools.cache
def _pi_scaled(scale: int) -> int:
    """pi * 2**scale to within a few units, from Machin's formula in integer arithmetic."""
    def arccot(n):
        total = term = (1 << scale) // n
        k, sign = 3, -1
        while term:
            term //= n * n
            total += sign * (term // k)
            k, sign = k + 2, -sign
        return total
    return 4 * (4 * arccot(5) - arccot(239))


def _pi_over_2_parts(count: int) -> list[float]:
    """pi/2 as a sum of `count` doubles, each the rounded remainder of those before."""
    remainder = Fraction(_pi_scaled(400), 1 << 401)
    parts = []
    for _ in range(count):
        parts.append(float(remainder))
        remainder -= Fraction(parts[-1])
    return parts


PI_OVER_2_PARTS = _pi_over_2_parts(3)


@functools.cache
def _reduction_table(e_low: int, e_high: int, chunks: int, stride: int) -> tuple[tuple[float, ...], ...]:
    """For E = e_low, e_low + stride, ... up to e_high: (2**E * 2/pi) mod 4, truncated, as
    `chunks` doubles."""
    window_end = _CHUNK_ENDS[chunks - 1]
    precision = e_high + window_end + 64  # 64 guard bits below the last one kept
    pi_scale = precision + 64
    two_over_pi = (1 << (precision + 1 + pi_scale)) // _pi_scaled(pi_scale)  # * 2**precision
    rows = []
    for e in range(e_low, e_high + 1, stride):
        # F * 2**window_end, as an integer below 4 * 2**window_end.
        window = (two_over_pi >> (precision - e - window_end)) & ((1 << (window_end + 2)) - 1)
        rows.append(tuple(math.ldexp((window >> (window_end - end)) & ((1 << 53) - 1), -end)
                          for end in _CHUNK_ENDS[:chunks]))
    return tuple(rows)


def _table_row(b, rows, index, name: str) -> list:
    """Row `index` of `rows`: by a tree of selects from a few rows (cheaper than a vector
    gather), else loaded from a constant global (index clamped into the table)."""
    if len(rows) <= 8:
        level = [[ir.Constant(F64, v) for v in row] for row in rows]
        bit = 0
        while len(level) > 1:
            level += level[-1:] * (len(level) % 2)
            odd = b.ir.icmp_unsigned("!=", b.ir.and_(index, I64(1 << bit)), I64(0))
            level = [[b.select(odd, high, low) for low, high in zip(level[i], level[i + 1])]
                     for i in range(0, len(level), 2)]
            bit += 1
        return level[0]
    table = b.module.globals.get(name)
    if table is None:
        row_type = ir.ArrayType(F64, len(rows[0]))
        table_type = ir.ArrayType(row_type, len(rows))
        table = ir.GlobalVariable(b.module, table_type, name)
        table.linkage = "internal"
        table.global_constant = True
        table.initializer = ir.Constant(table_type, [ir.Constant(row_type, list(row)) for row in rows])
    index = b.intrinsic("smin", b.intrinsic("smax", index, I64(0)), I64(len(rows) - 1))
    return [b.ir.load(b.ir.gep(table, [I64(0), index, I32(column)], inbounds=True))
            for column in range(len(rows[0]))]


def _split_integer(b, x):
    """(rint(x), x - rint(x)); the difference is exact for every double."""
    n = b.intrinsic("rint", x)
    return n, b.sub(x, n)


def _two_product(b, x, y):
    """x*y = hi + lo exactly."""
    hi = b.mul(x, y)
    return hi, b.intrinsic("fma", x, y, b.neg(hi))


def _two_sum(b, x, y):
    """x + y = s + e exactly (Knuth)."""
    s = b.add(x, y)
    v = b.sub(s, x)
    return s, b.add(b.sub(x, b.sub(s, v)), b.sub(y, v))


def _reduce_cody_waite(b, a, parts: int):
    """(n, r) with a = n*pi/2 + r for 0 <= a < REDUCTION_SPLIT."""
    # Clamped so that n converts to an integer on the lanes that take the other path.
    a = b.intrinsic("minnum", a, b.like(REDUCTION_SPLIT, a))
    k = b.intrinsic("rint", b.mul(a, b.like(2 / math.pi, a)))
    minus_k = b.neg(k)
    r = a
    for part in PI_OVER_2_PARTS[:parts]:
        r = b.intrinsic("fma", minus_k, b.like(part, a), r)
    return b.ir.fptosi(k, I64), r


def _scaled_mantissa(b, a, mantissa_bits: int, e_low: int, stride: int):
    """(M * 2**shift, row) with a = (M * 2**shift) * 2**(e_low + stride*row), where a = M * 2**E
    with M an integer of `mantissa_bits` bits and 0 <= shift < stride."""
    exponent_bias = 1023 + mantissa_bits - 1  # a = M * 2**(biased exponent - exponent_bias)
    bits = b.ir.bitcast(a, I64)
    offset = b.ir.sub(b.ir.lshr(bits, I64(52)), I64(exponent_bias + e_low))  # E - e_low
    shift = b.ir.and_(offset, I64(stride - 1))
    m = b.ir.bitcast(b.ir.or_(b.ir.and_(bits, I64((1 << 52) - 1)),
                              b.ir.shl(b.ir.add(shift, I64(exponent_bias)), I64(52))), F64)
    return m, b.ir.ashr(offset, I64(stride.bit_length() - 1))


def _reduce_payne_hanek(b, a):
    """(n, r) with a = n*pi/2 + r (mod 2*pi) for REDUCTION_SPLIT <= a < inf. The steps
    marked exact are proved in the notes above `REDUCTION_SPLIT` from where each value's
    lowest bit can lie."""
    e_low = math.frexp(REDUCTION_SPLIT)[1] - 53
    rows = _reduction_table(e_low, 1024 - 53, 4, 1)
    m, row = _scaled_mantissa(b, a, 53, e_low, 1)
    f = _table_row(b, rows, row, "tracegrad.two_over_pi")
    # M*f0 (a multiple of 2**-51 below 2**55) mod 1: h0's fraction and l0 add exactly.
    h0, l0 = _two_product(b, m, f[0])
    q0, fraction = _split_integer(b, h0)
    q1, fraction = _split_integer(b, b.add(fraction, l0))
    # M*f1 (a multiple of 2**-104 below 4) mod 1, and the sum of the two fractions.
    h1, l1 = _two_product(b, m, f[1])
    q2, fraction1 = _split_integer(b, h1)
    s, error = _two_sum(b, fraction, fraction1)
    q3, s = _split_integer(b, s)
    tail = b.add(error, l1)  # exact: multiples of 2**-104 below 2**-51
    # M*f2 and M*f3 (below 2**-51 and 2**-104) into a double-double tail, then into s.
    h2, l2 = _two_product(b, m, f[2])
    tail, tail_low = _two_sum(b, tail, h2)
    tail_low = b.add(tail_low, b.add(l2, b.mul(m, f[3])))
    s, low = _two_sum(b, s, tail)
    tail = b.add(low, tail_low)
    # a * 2/pi = n + s + tail (mod 4), |s + tail| <= 1/2 + 2**-50.
    n = b.ir.add(b.ir.fptosi(q0, I64), b.ir.fptosi(b.add(b.add(q1, q2), q3), I64))
    hi, lo = (b.like(part, a) for part in PI_OVER_2_PARTS[:2])
    r = b.intrinsic("fma", s, hi, b.intrinsic("fma", tail, hi, b.mul(s, lo)))
    return n, r


def _reduce_payne_hanek_single(b, a):
    """The same for `a` the float64 of a float32 (E from 7 to 104), with much less work:
    the fraction is never below 2**-29.8 here (by continued fractions of each F), so an
    absolute error of 2**-62 is harmless. With a = (M*2**shift) * 2**(7 + 16*row), M*2**shift
    < 2**39 and two chunks of F leave an error below 2**-64."""
    e_low, stride = math.frexp(REDUCTION_SPLIT)[1] - 24, 16
    rows = _reduction_table(e_low, 128 - 24, 2, stride)
    m, row = _scaled_mantissa(b, a, 24, e_low, stride)
    f = _table_row(b, rows, row, "tracegrad.two_over_pi_single")
    h0, l0 = _two_product(b, m, f[0])  # M*f0: a multiple of 2**-51 below 2**42
    q0, fraction = _split_integer(b, h0)
    q1, fraction = _split_integer(b, b.add(fraction, l0))  # exact, |l0| <= 2**-11
    # M*f1 < 2**-11 (rounded, error 2**-64): |fraction + M*f1| <= 1/2 + 2**-11.
    v = b.add(fraction, b.mul(m, f[1]))
    n = b.ir.add(b.ir.fptosi(q0, I64), b.ir.fptosi(q1, I64))
    return n, b.mul(v, b.like(math.pi / 2, a))


# fdlibm's __kernel_sin/__kernel_cos on [-pi/4, pi/4] (Sun Microsystems, freely
# redistributable), and FreeBSD's float kernels __kernel_sindf/__kernel_cosdf, which are
# evaluated in double and good to 2**-33 there.
_SIN64 = (-1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04,
          2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10)
_COS64 = (4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05,
          -2.75573143513906633035e-07, 2.08757232129817482790e-09, -1.13596475577881948265e-11)
_SIN32 = (-0x15555554cbac77 * 2.0 ** -55, 0x111110896efbb2 * 2.0 ** -59,
          -0x1a00f9e2cae774 * 2.0 ** -65, 0x16cd878c3b46a7 * 2.0 ** -71)
_COS32 = (-0x1ffffffd0c5e81 * 2.0 ** -54, 0x155553e1053a42 * 2.0 ** -57,
          -0x16c087e80f1e27 * 2.0 ** -62, 0x199342e0ee5069 * 2.0 ** -68)


def _sin_cos_kernels(b, r, single: bool):
    """(sin r, cos r) for |r| <= pi/4 (in double)."""
    z = b.mul(r, r)
    w = b.mul(z, z)
    s = b.mul(z, r)
    if single:
        sin_r = b.add(b.add(r, b.mul(s, _horner(b, z, _SIN32[:2]))), b.mul(b.mul(s, w), _horner(b, z, _SIN32[2:])))
        cos_r = b.add(b.add(b.add(b.like(1.0, r), b.mul(z, b.like(_COS32[0], r))), b.mul(w, b.like(_COS32[1], r))),
                      b.mul(b.mul(w, z), _horner(b, z, _COS32[2:])))
        return sin_r, cos_r
    # The arrangement of musl's __sin and __cos.
    p = b.add(_horner(b, z, _SIN64[1:4]), b.mul(b.mul(z, w), _horner(b, z, _SIN64[4:])))
    sin_r = b.add(r, b.mul(s, b.add(b.like(_SIN64[0], r), b.mul(z, p))))
    q = b.add(b.mul(z, _horner(b, z, _COS64[:3])), b.mul(b.mul(w, w), _horner(b, z, _COS64[3:])))
    half_z = b.mul(b.like(0.5, r), z)
    one = b.like(1.0, r)
    w = b.sub(one, half_z)
    cos_r = b.add(w, b.add(b.sub(b.sub(one, w), half_z), b.mul(z, q)))
    return sin_r, cos_r


def _sin_or_cos(b, x, cosine: bool, single: bool):
    """sin or cos of a double `x` (the float64 of a float32 if `single`)."""
    a = b.intrinsic("fabs", x)
    n_small, r_small = _reduce_cody_waite(b, a, parts=2 if single else 3)
    n_large, r_large = (_reduce_payne_hanek_single if single else _reduce_payne_hanek)(b, a)
    large = b.compare(">=", a, b.like(REDUCTION_SPLIT, a))
    n = b.select(large, n_large, n_small)
    sin_r, cos_r = _sin_cos_kernels(b, b.select(large, r_large, r_small), single)
    if cosine:  # cos(a) = sin(a + pi/2)
        n = b.ir.add(n, I64(1))
    value = b.select(b.ir.trunc(n, ir.IntType(1)), cos_r, sin_r)
    negate = b.ir.icmp_unsigned("!=", b.ir.and_(n, I64(2)), I64(0))
    if not cosine:  # sin(x) = -sin(|x|) when x's sign bit is set, -0.0 included
        negate = b.ir.xor(negate, b.ir.icmp_signed("<", b.ir.bitcast(x, I64), I64(0)))
    value = b.select(negate, b.neg(value), value)
    return b.select(b.compare("<", a, b.like(math.inf, a)), value, b.sub(x, x))  # inf, nan: nan


def sin(b, x):
    return _in_f64(b, x, functools.partial(_sin_or_cos, cosine=False, single=x.type == F32))


def cos(b, x):
    return _in_f64(b, x, functools.partial(_sin_or_cos, cosine=True, single=x.type == F32))
