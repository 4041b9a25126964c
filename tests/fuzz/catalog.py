"""The op catalogue: elementwise math, comparisons and where, reductions, and the table of
every op family with its weight (`OPS`). Each entry emits one statement through the
`Builder` (or returns False when the program has no operands it can use); shape ops,
indexing and matmul live in `catalog_shape.py`, neural-network functions in
`catalog_nn.py`, in-place and autograd constructs in `catalog_autograd.py`.

Discontinuous ops (comparisons, relu, abs, clamp, maximum, argmax, ...) only take exact
operands (see `model.py`); singular ones (log, sqrt, division) take an inexact operand only
through `x * x + 0.5`, which keeps it away from the singularity.
"""

from __future__ import annotations

import math

from .model import FLOATS, add_bits, broadcast, exact_bits, mul_bits, normalize_dim, promote_tensors, \
    promote_with_scalar, sum_bits

SCALARS = [0.5, 2, -1.5, 3, 0.25, 1, -2, 1.5]


def scalar_bits(value) -> tuple[int, int]:
    """(integer bits, fraction bits) of a Python scalar."""
    magnitude = abs(float(value))
    frac = 0
    while magnitude * 2 ** frac != int(magnitude * 2 ** frac):
        frac += 1
    return (int(magnitude).bit_length(), frac)


def guarded(var, always: bool = False) -> str:
    """`var` as the operand of a singular op: itself when exact (unless `always`), else
    kept >= 0.5."""
    return var.name if var.exact and not always else f"({var.name} * {var.name} + 0.5)"


def make_inputs(b) -> None:
    """The arguments every program starts with: a few floats, sometimes ints and masks."""
    for _ in range(b.rng.randint(1, 3)):
        b.float_input()
    if b.chance(0.3):
        b.int_input()
    if b.chance(0.2):
        b.bool_input()
    if b.allows("eager_history_input") and b.chance(0.3):
        from .catalog_autograd import eager_history_input
        eager_history_input(b)
    if b.allows("aliased_arguments") and b.chance(0.2):
        from .catalog_autograd import aliased_argument
        aliased_argument(b)


# --- elementwise ---------------------------------------------------------------------------


def unary_smooth(b) -> bool:
    x = b.pick(lambda v: v.dtype != "bool")
    if x is None:
        return False
    fn = b.rng.choice(["exp", "tanh", "sigmoid", "sin", "cos", "erf", "neg", "gelu", "gelu_tanh", "silu",
                       "atan", "sinh", "asinh", "expm1"])
    if fn in ("gelu", "gelu_tanh", "silu") and not x.is_float:
        fn = "tanh"
    dtype = x.dtype if x.is_float or fn == "neg" else "float32"
    if fn == "neg":
        line, bits = (f"-{x.name}" if b.chance(0.5) else f"torch.neg({x.name})"), x.bits
    elif fn.startswith("gelu"):
        approximate = ', approximate="tanh"' if fn == "gelu_tanh" else ""
        line, bits = f"torch.nn.functional.gelu({x.name}{approximate})", None
    elif fn == "silu":
        line, bits = f"torch.nn.functional.silu({x.name})", None
    else:
        operand = x.name
        if fn in ("tanh", "sigmoid") and x.is_float:
            # Kept off saturation: their gradients cancel there (1 - y*y for tanh(5.5)
            # loses 3 of float32's 7 digits), and one ulp of difference upstream (NumPy's
            # expm1 against the kernel's) became a 2e-3 difference (fuzz seed 84101477).
            # (Bounds no grid value reaches: no kink at an operand.)
            operand = f"{x.name}.clamp(-3.0625, 3.0625)"
        line, bits = (f"torch.{fn}({operand})" if b.chance(0.5) else f"{operand}.{fn}()"), None
    out = b.result(x.shape, dtype, x.requires_grad, bits)
    b.emit(f"{out.name} = {line}", "unary", out)
    return True


def unary_singular(b) -> bool:
    x = b.pick(lambda v: v.dtype in FLOATS or v.dtype == "int64")
    if x is None:
        return False
    fn = b.rng.choice(["log", "sqrt", "rsqrt", "pow_half", "reciprocal"])
    operand = guarded(x)
    dtype = x.dtype if x.is_float else "float32"
    if fn == "pow_half":
        line = f"{operand} ** 0.5"
    elif fn == "reciprocal":
        line = f"1 / {operand}"
    else:
        line = f"torch.{fn}({operand})" if b.chance(0.5) else f"{operand}.{fn}()"
    out = b.result(x.shape, dtype, x.requires_grad, None)
    b.emit(f"{out.name} = {line}", "unary_singular", out)
    return True


def unary_nonsmooth(b) -> bool:
    x = b.pick(lambda v: v.exact and v.dtype in ("float32", "float64", "int64"))
    if x is None:
        return False
    fn = b.rng.choice(["abs", "relu", "sign", "clamp", "clamp_min", "clamp_max", "floor", "ceil", "trunc",
                       "round"])
    if fn == "clamp":
        low, high = (-1, 1) if x.dtype == "int64" else (-0.5, 1.25)
        line = f"torch.clamp({x.name}, {low}, {high})" if b.chance(0.5) else f"{x.name}.clamp(min={low}, max={high})"
    elif fn == "clamp_min":
        line = f"{x.name}.clamp(min={0 if x.dtype == 'int64' else 0.25})"
    elif fn == "clamp_max":
        line = f"{x.name}.clamp(max={1 if x.dtype == 'int64' else -0.25})"
    else:
        line = f"torch.{fn}({x.name})" if b.chance(0.5) else f"{x.name}.{fn}()"
    out = b.result(x.shape, x.dtype, x.requires_grad and fn != "sign", x.bits)
    b.emit(f"{out.name} = {line}", "unary_nonsmooth", out)
    return True


def _partner(b, a, need_exact: bool = False, allow_bool: bool = False):
    return b.pick(lambda v: v.static and v is not a and broadcast(a.shape, v.shape) is not None
                  and (allow_bool or v.dtype != "bool") and (v.exact or not need_exact))


def binary(b) -> bool:
    a = b.pick(lambda v: v.static and v.dtype != "bool")
    if a is None:
        return False
    op = b.rng.choice(["+", "-", "*", "*", "/", "maximum", "minimum", "pow", "add_alpha"])
    exact_needed = op in ("maximum", "minimum")
    if exact_needed and not a.exact:
        op = "+"
        exact_needed = False
    other = None if b.chance(0.35) or op == "pow" else _partner(b, a, exact_needed)
    if other is None:
        return _binary_scalar(b, a, op)
    shape = broadcast(a.shape, other.shape)
    dtype = promote_tensors(a, other)
    requires_grad = a.requires_grad or other.requires_grad
    if op == "/":
        # An exact denominator may be exactly 0: the same inf or NaN on every side when the
        # numerator is exact too, but an inexact one's rounding turns 0 into -inf or NaN
        # (fuzz seed 53004430: kl_div's 0 as -1.5e-8 eagerly, 0.0 compiled, over 0).
        line, bits = f"{a.name} / {guarded(other) if a.exact else guarded(other, always=True)}", None
        dtype = dtype if dtype in FLOATS else "float32"
    elif op in ("maximum", "minimum"):
        line, bits = f"torch.{op}({a.name}, {other.name})", add_bits(a.bits, other.bits)
    elif op == "add_alpha":
        line, bits = f"torch.add({a.name}, {other.name}, alpha=2)", add_bits(a.bits, mul_bits(other.bits, (2, 0)))
    else:
        bits = mul_bits(a.bits, other.bits) if op == "*" else add_bits(a.bits, other.bits)
        line = f"{a.name} {op} {other.name}" if b.chance(0.7) else \
            f"torch.{ {'+': 'add', '-': 'sub', '*': 'mul'}[op]}({a.name}, {other.name})"
    if op in ("maximum", "minimum") and a.dtype != other.dtype:
        return False  # torch.maximum promotes, but keep the model simple
    out = b.result(shape, dtype, requires_grad, exact_bits(dtype, bits))
    b.emit(f"{out.name} = {line}", "binary", out)
    return True


def _binary_scalar(b, a, op: str) -> bool:
    value = b.rng.choice(SCALARS)
    dtype = promote_with_scalar(a.dtype, value)
    sbits = scalar_bits(value)
    if op in ("maximum", "minimum", "add_alpha"):
        op = "+"
    if op == "pow":
        exponent = b.rng.choice([2, 3, 0.5, -1, 1.5] if a.is_float else [2, 3])
        if exponent == 2 or exponent == 3:
            square = mul_bits(a.bits, a.bits)
            line, bits = f"{a.name} ** {exponent}", mul_bits(square, a.bits) if exponent == 3 else square
        else:
            # (0.5 and -1: a gradient singular at an exact 0, multiplied by an upstream
            # gradient that may be 0 in one evaluation order and 1e-9 in another: NaN
            # against inf; fuzz seed 83000705, softmax's backward over equal values)
            line, bits = f"{guarded(a, always=exponent != 1.5)} ** {exponent}", None
        dtype = a.dtype
    elif op == "/":
        power = value in (2, 0.5, 0.25, -2, 1)
        line = f"{a.name} / {value}"
        bits = (a.bits[0] + 2, a.bits[1] + 2) if power and a.bits else None  # (a power of two: exact)
        dtype = dtype if dtype in FLOATS else "float32"
    elif op == "-" and b.chance(0.4):
        line, bits = f"{value} - {a.name}", add_bits(a.bits, sbits)
    elif op == "*":
        line = f"{a.name} * {value}" if b.chance(0.6) else f"{value} * {a.name}"
        bits = mul_bits(a.bits, sbits)
    else:
        line, bits = f"{a.name} {op} {value}", add_bits(a.bits, sbits)
    out = b.result(a.shape, dtype, a.requires_grad, exact_bits(dtype, bits))
    b.emit(f"{out.name} = {line}", "binary_scalar", out)
    return True


def compare(b) -> bool:
    a = b.pick(lambda v: v.static and v.exact)
    if a is None:
        return False
    op = b.rng.choice(["<", "<=", ">", ">=", "==", "!="])
    other = _partner(b, a, need_exact=True, allow_bool=True) if b.chance(0.6) else None
    rhs = other.name if other is not None else str(b.rng.choice([0, 0.5, -0.25, 1]))
    shape = broadcast(a.shape, other.shape) if other is not None else a.shape
    names = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}
    line = f"{a.name} {op} {rhs}" if b.chance(0.7) else f"torch.{names[op]}({a.name}, {rhs})"
    out = b.result(shape, "bool", False, (1, 0))
    b.emit(f"{out.name} = {line}", "compare", out)
    return True


def logical(b) -> bool:
    a = b.pick(lambda v: v.static and v.dtype == "bool")
    if a is None:
        return False
    other = b.pick(lambda v: v.static and v.dtype == "bool" and broadcast(a.shape, v.shape) is not None)
    kind = b.rng.choice(["and", "or", "not"])
    if kind == "not" or other is None:
        line, shape = (f"~{a.name}" if b.chance(0.5) else f"torch.logical_not({a.name})"), a.shape
    else:
        line = f"torch.logical_{kind}({a.name}, {other.name})" if b.chance(0.5) else \
            f"{a.name} {'&' if kind == 'and' else '|'} {other.name}"
        shape = broadcast(a.shape, other.shape)
    out = b.result(shape, "bool", False, (1, 0))
    b.emit(f"{out.name} = {line}", "logical", out)
    return True


def where(b) -> bool:
    a = b.pick(lambda v: v.static and v.dtype != "bool")
    if a is None:
        return False
    cond = b.pick(lambda v: v.static and v.dtype == "bool" and broadcast(a.shape, v.shape) is not None)
    if cond is None:
        cond = b.bool_input(tuple(1 if b.chance(0.3) else s for s in a.shape))
    other = _partner(b, a) if b.chance(0.6) else None
    shape = broadcast(a.shape, cond.shape)
    if other is not None:
        shape = broadcast(shape, other.shape)
        if shape is None:
            return False
        rhs, dtype = other.name, promote_tensors(a, other)
        bits, requires_grad = add_bits(a.bits, other.bits), a.requires_grad or other.requires_grad
    else:
        value = b.rng.choice([0.0, 1.5, -1])
        rhs, dtype = str(value), promote_with_scalar(a.dtype, value)
        bits, requires_grad = add_bits(a.bits, scalar_bits(value)), a.requires_grad
    line = f"torch.where({cond.name}, {a.name}, {rhs})" if b.chance(0.7) or other is None else \
        f"{a.name}.where({cond.name}, {rhs})"
    out = b.result(shape, dtype, requires_grad, exact_bits(dtype, bits))
    b.emit(f"{out.name} = {line}", "where", out)
    return True


# --- reductions ----------------------------------------------------------------------------

REDUCTIONS = ["sum", "sum", "mean", "amax", "amin", "std", "var", "logsumexp", "argmax", "argmin",
              "any", "all", "max_dim"]


def reduce(b) -> bool:
    x = b.pick(lambda v: v.static)
    if x is None:
        return False
    kind = b.rng.choice(REDUCTIONS)
    exact_only = kind in ("amax", "amin", "argmax", "argmin", "any", "all", "max_dim")
    float_only = kind in ("mean", "std", "var", "logsumexp")
    if (exact_only and not x.exact) or (float_only and not x.is_float) or (x.dtype == "bool" and not exact_only
                                                                           and kind != "sum") \
            or (x.dtype == "bool" and kind in ("argmax", "argmin")):  # (PyTorch refuses bool there)
        return False
    dims = _reduced_dims(b, x, kind)
    if dims is False:
        return False
    keepdim = b.chance(0.35)
    if dims is None and keepdim:  # keepdim needs the dims written out (torch.sum has no dim=None form)
        dims = tuple(range(x.ndim)) if kind in ("sum", "mean", "amax", "amin") and x.ndim else None
        keepdim = dims is not None
    reduced = range(x.ndim) if dims is None else [normalize_dim(d, x.ndim) for d in dims]
    count = math.prod(x.shape[d] for d in reduced)
    if not b.needs("size0_reduce", count == 0):
        return False
    shape = tuple(1 if i in reduced else s for i, s in enumerate(x.shape) if keepdim or i not in reduced)
    if dims is None and not keepdim:
        shape = ()
    line, dtype, bits, grad = _reduction_line(b, x, kind, dims, keepdim, count)
    out = b.result(shape, dtype, grad and x.requires_grad, exact_bits(dtype, bits) if bits else None)
    b.emit(f"{out.name} = {line}", f"reduce_{kind}", out)
    if kind in ("logsumexp", "max_dim") and not keepdim:
        b.internal_views.add(out.name)
    return True


def _reduced_dims(b, x, kind):
    """None (every dim), or a tuple of dims as written; False when `kind` cannot reduce x."""
    if x.ndim == 0:
        return False if kind in ("logsumexp", "max_dim") else None
    single = [b.rng.choice([d, d - x.ndim]) for d in [b.rng.randrange(x.ndim)]]
    if kind in ("logsumexp", "max_dim"):
        return tuple(single)
    if kind in ("sum", "mean", "amax", "amin") and x.ndim >= 2 and b.chance(0.25):
        dims = sorted(b.rng.sample(range(x.ndim), 2))
        return tuple(b.rng.choice([d, d - x.ndim]) for d in dims)
    return None if b.chance(0.35) else tuple(single)


def _reduction_line(b, x, kind: str, dims, keepdim: bool, count: int):
    """(source, dtype, bits, differentiable) of one reduction."""
    args = ""
    if dims is not None:
        args = str(dims[0]) if len(dims) == 1 and (kind in ("std", "var", "argmax", "argmin", "any", "all",
                                                            "max_dim", "logsumexp") or b.chance(0.5)) else str(dims)
    if keepdim:
        args += ", keepdim=True"
    if kind in ("sum", "mean", "amax", "amin", "logsumexp"):
        line = f"{x.name}.{kind}({args})" if b.chance(0.6) else f"torch.{kind}({x.name}{', ' + args if args else ''})"
        if kind == "sum":
            dtype = "int64" if x.dtype in ("int64", "bool") else x.dtype
            return line, dtype, sum_bits(x.bits, count), True
        if kind == "mean":
            power = count > 0 and count & (count - 1) == 0
            bits = (x.bits[0], x.bits[1] + count.bit_length()) if power and x.bits else None
            return line, x.dtype, bits, True
        if kind == "logsumexp":
            return line, x.dtype, None, True
        return line, x.dtype, x.bits, True
    if kind in ("std", "var"):
        correction = b.rng.choice(["", "unbiased=False", "correction=0", "correction=1"])
        extra = ", ".join(a for a in (args, correction) if a)
        return f"spread({x.name}).{kind}({extra})", x.dtype, None, True
    if kind in ("argmax", "argmin"):
        return f"torch.{kind}({x.name}{', ' + args if args else ''})", "int64", (8, 0), False
    if kind in ("any", "all"):
        return f"{x.name}.{kind}({args})", "bool", (1, 0), False
    field = b.rng.choice(["values", "indices"])
    line = f"{x.name}.{b.rng.choice(['max', 'min'])}({args}).{field}"
    if field == "indices":
        return line, "int64", (8, 0), False
    return line, x.dtype, x.bits, True


def _lazy(module: str, name: str):
    def emit(b) -> bool:
        from importlib import import_module
        return getattr(import_module(f".{module}", __package__), name)(b)
    emit.__name__ = name
    return emit


# (family, weight): what `emit_random_op` draws from.
OPS = [
    (unary_smooth, 8), (unary_singular, 4), (unary_nonsmooth, 5), (binary, 14), (compare, 4),
    (logical, 2), (where, 4), (reduce, 10),
    (_lazy("catalog_shape", "reshape"), 5), (_lazy("catalog_shape", "permute"), 4),
    (_lazy("catalog_shape", "squeeze_unsqueeze"), 3), (_lazy("catalog_shape", "expand"), 3),
    (_lazy("catalog_shape", "cat_stack"), 4), (_lazy("catalog_shape", "index_basic"), 5),
    (_lazy("catalog_shape", "index_int"), 3), (_lazy("catalog_shape", "index_mask"), 2),
    (_lazy("catalog_shape", "gather"), 3), (_lazy("catalog_shape", "matmul"), 6),
    (_lazy("catalog_shape", "convert"), 3),
    (_lazy("catalog_nn", "softmax"), 4), (_lazy("catalog_nn", "layer_norm"), 3),
    (_lazy("catalog_nn", "cross_entropy"), 3), (_lazy("catalog_nn", "mse_loss"), 1),
    (_lazy("catalog_nn", "linear"), 2), (_lazy("catalog_nn", "recurrence"), 2), (_lazy("catalog_nn", "lstm"), 1),
    (_lazy("catalog_nn", "creation"), 2),
    (_lazy("catalog_autograd", "inplace"), 8), (_lazy("catalog_autograd", "setitem"), 4),
    (_lazy("catalog_autograd", "detach_clone"), 3), (_lazy("catalog_autograd", "no_grad_block"), 2),
    (_lazy("catalog_autograd", "requires_grad_argument"), 2), (_lazy("catalog_autograd", "custom_function"), 3),
    (_lazy("catalog_autograd", "fresh_requires_grad"), 2), (_lazy("catalog_autograd", "item_and_branch"), 2),
    (_lazy("catalog_autograd", "invalid_op"), 0.5), (_lazy("catalog_autograd", "write_then_read_alias"), 3),
    (_lazy("catalog_math", "scan"), 3), (_lazy("catalog_math", "prod"), 1), (_lazy("catalog_math", "sorting"), 3),
    (_lazy("catalog_math", "binary_math"), 3), (_lazy("catalog_math", "special"), 2),
    (_lazy("catalog_math", "narrow_dtype"), 2),
    (_lazy("catalog_rearrange", "rearrange"), 5), (_lazy("catalog_rearrange", "indexed"), 3),
    (_lazy("catalog_rearrange", "contraction"), 3),
    (_lazy("catalog_layers", "activation"), 3), (_lazy("catalog_layers", "norm"), 2),
    (_lazy("catalog_layers", "loss"), 2), (_lazy("catalog_layers", "pad"), 2), (_lazy("catalog_layers", "pool"), 2),
    (_lazy("catalog_layers", "conv"), 2), (_lazy("catalog_layers", "normalization"), 2),
    (_lazy("catalog_layers", "attention"), 1),
]


def emit_random_op(b) -> bool:
    """Emit one op of a family drawn by weight; False if that family found nothing to use."""
    from .generator import Skip
    families, weights = zip(*OPS)
    try:
        return b.rng.choices(families, weights)[0](b)
    except Skip:
        return False
