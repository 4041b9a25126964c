"""Scans, products, sorting, binary and special math, and narrow dtypes for the op
catalogue (`catalog.py`).

Sorting and the running maximum pick one element among equal ones, and their gradients
go to the element picked: their operands are exact and made tie-free first by `untie`
(the prelude's), which adds distinct multiples of a power of two finer than the operand's
resolution (so the order of distinct values is kept and every value is exact still).
Rounding to a narrow dtype (float16, bfloat16) or truncating to int32 is a discontinuity:
only exact operands are cast, and back to their dtype in the same statement, so no
narrow tensor is compared with float32's tolerance.
"""

from __future__ import annotations

from .catalog import guarded, scalar_bits
from .model import MANTISSA, add_bits, broadcast, exact_bits, mul_bits, promote_tensors, sum_bits


def _dim(b, x) -> tuple[int, str]:
    """A dim of x (0 for a 0-d tensor) and how it is written (maybe negative)."""
    d = b.rng.randrange(x.ndim) if x.ndim else 0
    return d, str(d - max(x.ndim, 1) if b.chance(0.4) else d)


def untied(b, x) -> tuple[str, tuple[int, int]] | None:
    """`untie(x, shift)` and its bits: x's values made distinct, or None when x is inexact
    or the tie-breaker would not fit x's dtype."""
    if not x.exact or not x.is_float or not x.static:
        return None
    shift = x.bits[1] + 1 + max(1, x.numel).bit_length()
    bits = (x.bits[0] + 1, shift)
    if bits[0] + bits[1] > MANTISSA[x.dtype]:
        return None
    return f"untie({x.name}, {shift})", bits


# --- scans and products -----------------------------------------------------------------


def scan(b) -> bool:
    x = b.pick(lambda v: v.static and v.dtype != "bool" and (v.ndim or b.chance(0.2)))
    if x is None:
        return False
    kind = b.rng.choice(["cumsum", "cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"])
    d, written = _dim(b, x)
    size = x.shape[d] if x.ndim else 1
    if kind == "logcumsumexp" and not x.is_float:
        kind = "cumsum"
    if kind in ("cummax", "cummin"):
        operand = untied(b, x)
        if operand is None:
            return False
        source, bits = operand
        field = b.rng.choice(["values", "indices", "values"])
        line = f"torch.{kind}({source}, {written}).{field}" if b.chance(0.5) else \
            f"{source}.{kind}(dim={written})[{0 if field == 'values' else 1}]"
        if field == "indices":
            out = b.result(x.shape, "int64", False, (8, 0))
        else:
            out = b.result(x.shape, x.dtype, x.requires_grad, bits)
        b.emit(f"{out.name} = {line}", kind, out)
        return True
    dtype = x.dtype if x.is_float else "int64"
    if kind == "cumsum":
        bits = sum_bits(x.bits, size)
    elif kind == "cumprod":
        bits = None if x.bits is None else (x.bits[0] * size, x.bits[1] * size)
    else:
        bits = None
    line = f"torch.{kind}({x.name}, {written})" if b.chance(0.5) else f"{x.name}.{kind}(dim={written})"
    if kind == "cumsum" and x.is_float and b.chance(0.2):
        other = "float64" if x.dtype == "float32" else "float32"
        line = f"torch.cumsum({x.name}, {written}, dtype=torch.{other})"
        dtype = other
    out = b.result(x.shape, dtype, x.requires_grad, exact_bits(dtype, bits))
    b.emit(f"{out.name} = {line}", kind, out)
    return True


def prod(b) -> bool:
    x = b.pick(lambda v: v.static and v.dtype in ("float32", "float64", "int64") and (v.numel or 0) <= 12)
    if x is None:
        return False
    if x.ndim and b.chance(0.7):
        d, written = _dim(b, x)
        keepdim = b.chance(0.3)
        count = x.shape[d]
        shape = tuple(1 if i == d else s for i, s in enumerate(x.shape) if keepdim or i != d)
        line = f"{x.name}.prod({written}{', keepdim=True' if keepdim else ''})" if b.chance(0.5) else \
            f"torch.prod({x.name}, {written}{', keepdim=True' if keepdim else ''})"
    else:
        count, shape, line = x.numel, (), f"torch.prod({x.name})" if b.chance(0.5) else f"{x.name}.prod()"
    bits = None if x.bits is None else (x.bits[0] * count, x.bits[1] * count)
    out = b.result(shape, x.dtype, x.requires_grad, exact_bits(x.dtype, bits))
    b.emit(f"{out.name} = {line}", "prod", out)
    return True


# --- sorting ------------------------------------------------------------------------------


def sorting(b) -> bool:
    x = b.pick(lambda v: v.static and v.exact and v.is_float and v.ndim >= 1)
    if x is None:
        return False
    operand = untied(b, x)
    if operand is None:
        return False
    source, bits = operand
    d, written = _dim(b, x)
    size = x.shape[d]
    kind = b.rng.choice(["sort", "sort", "argsort", "topk", "topk", "kthvalue", "median", "median_all", "msort",
                         "searchsorted"])
    values = lambda shape: b.result(shape, x.dtype, x.requires_grad, bits)  # noqa: E731
    indices = lambda shape: b.result(shape, "int64", False, (8, 0))  # noqa: E731
    reduced = lambda keep: tuple(1 if i == d else s for i, s in enumerate(x.shape) if keep or i != d)  # noqa: E731
    if kind == "sort":
        descending = b.rng.choice(["", ", descending=True", ", descending=False"])
        field = b.rng.choice(["values", "indices", "values"])
        out = values(x.shape) if field == "values" else indices(x.shape)
        line = f"torch.sort({source}, dim={written}{descending}).{field}" if b.chance(0.5) else \
            f"{source}.sort({written}{descending})[{0 if field == 'values' else 1}]"
    elif kind == "argsort":
        out = indices(x.shape)
        line = f"torch.argsort({source}, dim={written}{b.rng.choice(['', ', descending=True'])})"
    elif kind == "msort":
        out, line = values(x.shape), f"torch.msort({source})"
    elif kind == "topk":
        k = b.rng.randint(0, size)
        largest = b.rng.choice(["", ", largest=False", ", largest=True"])
        field = b.rng.choice(["values", "indices", "values"])
        shape = tuple(k if i == d else s for i, s in enumerate(x.shape))
        out = values(shape) if field == "values" else indices(shape)
        line = f"torch.topk({source}, {k}, dim={written}{largest}).{field}" if b.chance(0.5) else \
            f"{source}.topk({k}, {written}{largest})[{0 if field == 'values' else 1}]"
    elif kind in ("kthvalue", "median"):
        if size == 0:
            return False
        keepdim = b.chance(0.3)
        field = b.rng.choice(["values", "indices", "values"])
        shape = reduced(keepdim)
        out = values(shape) if field == "values" else indices(shape)
        extra = ", keepdim=True" if keepdim else ""
        call = f"kthvalue({source}, {b.rng.randint(1, size)}, {written}{extra})" if kind == "kthvalue" else \
            f"median({source}, {written}{extra})"
        line = f"torch.{call}.{field}"
    elif kind == "median_all":
        if x.numel == 0:
            return False
        out, line = values(()), f"{source}.median()"
    else:
        if x.ndim != 1:
            return False
        queries = b.pick(lambda v: v.static and v.exact and v.dtype == x.dtype and v.ndim <= 2)
        if queries is None:
            return False
        right = b.rng.choice(["", ", right=True"])
        out = indices(queries.shape)
        line = f"torch.searchsorted(torch.sort({x.name}).values, {queries.name}{right})"
    b.emit(f"{out.name} = {line}", kind, out)
    if out.dtype != "int64" and kind in ("kthvalue", "median", "median_all"):
        b.internal_views.add(out.name)  # (tracegrad selects the element through a view)
    return True


# --- binary math ----------------------------------------------------------------------------


def _float_partner(b, x):
    from .catalog import _partner
    other = _partner(b, x)
    return other if other is not None and other.is_float else None


def binary_math(b) -> bool:
    x = b.pick(lambda v: v.static and v.is_float)
    if x is None:
        return False
    kind = b.rng.choice(["atan2", "hypot", "copysign", "fmod", "remainder", "xlogy", "logaddexp", "logaddexp2",
                         "float_power", "lerp", "fmax", "fmin", "floor_divide"])
    exact_only = kind in ("copysign", "fmod", "remainder", "fmax", "fmin", "floor_divide")
    if exact_only and not x.exact:
        kind = b.rng.choice(["atan2", "hypot", "logaddexp", "xlogy"])
        exact_only = False
    other = _float_partner(b, x)
    if other is not None and exact_only and not other.exact:
        other = None
    if other is None:
        other = b.float_input(x.shape if b.chance(0.5) else tuple(1 if b.chance(0.3) else s for s in x.shape),
                              dtype=x.dtype)
    shape = broadcast(x.shape, other.shape)
    dtype = promote_tensors(x, other)
    grad = x.requires_grad or other.requires_grad
    bits = None
    if kind == "atan2":  # (atan2(0, 0) has no gradient: the second operand kept positive)
        line = f"torch.atan2({x.name}, {other.name} * {other.name} + 0.25)"
    elif kind == "hypot":
        line = f"torch.hypot({x.name}, {other.name} * {other.name} + 0.25)"
    elif kind == "copysign":
        line, bits = f"torch.copysign({x.name}, {other.name} + 0.0)", x.bits  # (+ 0.0: no negative zero)
    elif kind in ("fmod", "remainder", "floor_divide"):
        # Divisors of few bits kept away from 0: every quotient is far from a rounding tie.
        if x.bits[0] + x.bits[1] > 12 or other.bits[0] + other.bits[1] > 6:
            return False
        if b.chance(0.6):
            divisor, dbits = f"({other.name} * {other.name} + 0.5)", add_bits(mul_bits(other.bits, other.bits), (0, 1))
        else:
            value = b.rng.choice([0.75, -1.5, 2])
            divisor, dbits = str(value), scalar_bits(value)
        line = f"torch.{kind}({x.name}, {divisor})" if b.chance(0.6) else f"{x.name}.{kind}({divisor})"
        if kind == "floor_divide":  # (PyTorch has no derivative for it: operands without grad)
            line += ".detach()"
            bits, grad = (x.bits[0] + 2, 0), False  # (|divisor| >= 0.5)
        else:  # (|result| < |divisor|, a multiple of the finer resolution of the two)
            bits = (max(x.bits[0], dbits[0]), max(x.bits[1], dbits[1]))
        if divisor[0] != "(":
            shape, dtype, grad = x.shape, x.dtype, grad and x.requires_grad
    elif kind == "xlogy":
        line = f"torch.xlogy({x.name}, {other.name} * {other.name} + 0.5)"
    elif kind in ("logaddexp", "logaddexp2"):
        line = f"torch.{kind}({x.name}, {other.name})"
    elif kind == "float_power":
        exponent = b.rng.choice([2, 3, 0.5])
        base = x.name if exponent != 0.5 else guarded(x)
        line, shape, dtype, grad = f"torch.float_power({base}, {exponent})", x.shape, "float64", x.requires_grad
        bits = mul_bits(x.bits, x.bits) if exponent == 2 else None
    elif kind == "lerp":
        if other.shape != shape or other.dtype != x.dtype:
            return False
        weight = b.rng.choice(["0.25", "0.5", "0.75", "1.5"])
        line, shape, dtype = f"torch.lerp({x.name}, {other.name}, {weight})", x.shape, x.dtype
    else:  # fmax, fmin
        if other.dtype != x.dtype:
            return False
        line, bits = f"torch.{kind}({x.name}, {other.name})", add_bits(x.bits, other.bits)
    out = b.result(shape, dtype, grad, exact_bits(dtype, bits))
    b.emit(f"{out.name} = {line}", kind, out)
    return True


# --- special functions ------------------------------------------------------------------------

# fn -> how its operand is kept in the function's domain (and away from its poles). (The
# `torch.special` namespace is not generated: tracegrad has none.)
SPECIAL = {
    "erfc": "{x}", "erfinv": "({x}.tanh() * 0.875)", "lgamma": "({x} * {x} + 0.5)",
    "digamma": "({x} * {x} + 0.5)", "log1p": "({x} * {x})", "log2": "({x} * {x} + 0.5)",
    "log10": "({x} * {x} + 0.5)", "exp2": "{x}", "tan": "{x}.tanh()", "asin": "({x}.tanh() * 0.875)",
    "acos": "({x}.tanh() * 0.875)", "atanh": "({x}.tanh() * 0.875)", "acosh": "({x} * {x} + 1.5)",
    "cosh": "{x}", "logit": "torch.sigmoid({x})", "deg2rad": "{x}", "rad2deg": "{x}", "square": "{x}",
    "polygamma": "({x} * {x} + 0.5)", "sinc": "{x}", "frac": "{x}",
}


def special(b) -> bool:
    x = b.pick(lambda v: v.static and v.is_float)
    if x is None:
        return False
    fn = b.rng.choice(sorted(SPECIAL))
    if fn in ("sinc", "frac") and not x.exact:
        fn = "erfc"
    operand = SPECIAL[fn].format(x=x.name)
    bits = None
    if fn == "polygamma":
        line = f"torch.polygamma({b.rng.randint(0, 2)}, {operand})"
    elif fn == "square":
        line, bits = f"torch.square({operand})", mul_bits(x.bits, x.bits)
    elif fn == "frac":
        line, bits = f"torch.frac({operand})", x.bits
    else:
        line = f"torch.{fn}({operand})" if b.chance(0.5) else f"{operand}.{fn}()"
    out = b.result(x.shape, x.dtype, x.requires_grad, exact_bits(x.dtype, bits))
    b.emit(f"{out.name} = {line}", f"special_{fn}", out)
    return True


# --- narrow dtypes --------------------------------------------------------------------------

NARROW = {"float16": (11, 15, [".half()", ".to(torch.float16)"]),
          "bfloat16": (8, 127, [".bfloat16()", ".to(torch.bfloat16)"])}


def narrow_dtype(b) -> bool:
    """A short computation in float16, bfloat16 or int32, cast back in the same statement."""
    x = b.pick(lambda v: v.static and v.exact and v.dtype != "bool")
    if x is None:
        return False
    target = b.rng.choice(["float16", "bfloat16", "int32", "int32"])
    back = {"float32": ".float()", "float64": ".double()", "int64": ".long()"}[x.dtype]
    if target == "int32":
        if x.bits[0] > 30:
            return False
        cast = b.rng.choice([".int()", ".to(torch.int32)"])
        op = b.rng.choice(["", " * 2", " + 1", " // 2", " % 3"])
        int_bits = x.bits[0] + (2 if op else 0)
        expression = f"({x.name}{cast}{op}){back}"
        out = b.result(x.shape, x.dtype, False, exact_bits(x.dtype, (int_bits, 0)))
        b.emit(f"{out.name} = {expression}", "int32", out)
        return True
    if not x.is_float:
        return False
    mantissa, max_exponent, casts = NARROW[target]
    cast = b.rng.choice(casts)
    fits = x.bits[0] + x.bits[1] <= mantissa and x.bits[0] <= max_exponent
    op = b.rng.choice(["", " * 2", " + 0.5", " * 0.5", " - 1"])
    result_bits = {"": x.bits, " * 2": (x.bits[0] + 1, x.bits[1]), " * 0.5": (x.bits[0], x.bits[1] + 1),
                   " + 0.5": add_bits(x.bits, (0, 1)), " - 1": add_bits(x.bits, (1, 0))}[op]
    if not fits or result_bits[0] + result_bits[1] > mantissa:
        op, result_bits = "", x.bits  # (rounded once, by the cast: the same in every backend)
    if not fits and x.bits[0] >= max_exponent:
        return False  # (an overflow to infinity: its gradient is NaN)
    # x rounded (to a multiple of a power of two no finer than x's): the same in every
    # backend, as x is exact, and at most one integer bit larger.
    bits = result_bits if fits else (x.bits[0] + 1, x.bits[1])
    out = b.result(x.shape, x.dtype, x.requires_grad, exact_bits(x.dtype, bits))
    b.emit(f"{out.name} = ({x.name}{cast}{op}){back}", target, out)
    return True
