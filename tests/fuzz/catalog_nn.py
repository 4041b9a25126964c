"""Neural-network functions and tensor creation for the op catalogue (`catalog.py`):
softmax/log_softmax, layer_norm, cross_entropy, mse_loss, linear, a recurrent cell unrolled
over a few steps, and constants made inside the program. Weights these need are new arguments of the right shape."""

from __future__ import annotations

import math

from .model import exact_bits, mul_bits, sum_bits

F = "torch.nn.functional"


def softmax(b) -> bool:
    x = b.pick(lambda v: v.static and v.is_float and v.ndim >= 1)
    if x is None:
        return False
    dims = [d for d in range(x.ndim) if x.shape[d] > 0]
    if not dims:
        return False
    d = b.rng.choice(dims)
    written = d - x.ndim if b.chance(0.5) else d
    fn = b.rng.choice(["softmax", "log_softmax"])
    line = b.rng.choice([f"torch.{fn}({x.name}, dim={written})", f"{x.name}.{fn}({written})",
                         f"{F}.{fn}({x.name}, dim={written})"])
    out = b.result(x.shape, x.dtype, x.requires_grad, None)
    b.emit(f"{out.name} = {line}", fn, out)
    return True


def layer_norm(b) -> bool:
    x = b.pick(lambda v: v.static and v.is_float and v.ndim >= 1)
    if x is None:
        return False
    k = b.rng.randint(1, min(2, x.ndim))
    normalized = x.shape[x.ndim - k:]
    if math.prod(normalized) == 2:
        return False  # two values normalize to about +-1 whatever they are: a gradient of rounding noise
    if not b.needs("size0_reduce", 0 in normalized):
        return False
    args = [f"spread({x.name})", str(normalized)]
    requires_grad = x.requires_grad
    if b.chance(0.6):
        weight = b.float_input(normalized, dtype=x.dtype, layout="plain")
        args.append(weight.name)
        requires_grad |= weight.requires_grad
        if b.chance(0.7):
            bias = b.float_input(normalized, dtype=x.dtype, layout="plain")
            args.append(bias.name)
            requires_grad |= bias.requires_grad
    out = b.result(x.shape, x.dtype, requires_grad, None)
    b.emit(f"{out.name} = {F}.layer_norm({', '.join(args)})", "layer_norm", out)
    return True


def cross_entropy(b) -> bool:
    x = b.pick(lambda v: v.static and v.is_float and v.ndim in (1, 2) and 0 not in v.shape)
    if x is None:
        return False
    n = x.shape[0] if x.ndim == 2 else None
    target = b.label_input(n, x.shape[-1])
    reduction = b.rng.choice(["mean", "mean", "sum", "none"])
    extra = f", reduction={reduction!r}" if reduction != "mean" or b.chance(0.3) else ""
    shape = () if reduction != "none" or n is None else (n,)
    out = b.result(shape, x.dtype, x.requires_grad, None)
    b.emit(f"{out.name} = {F}.cross_entropy({x.name}, {target.name}{extra})", "cross_entropy", out)
    if n is None and reduction == "none":
        b.internal_views.add(out.name)
    return True


def mse_loss(b) -> bool:
    x = b.pick(lambda v: v.static and v.is_float and 0 not in v.shape)
    if x is None:
        return False
    other = b.pick(lambda v: v.static and v.shape == x.shape and v.dtype == x.dtype and v is not x)
    if other is None:
        other = b.float_input(x.shape, dtype=x.dtype, layout="plain")
    reduction = b.rng.choice(["mean", "sum", "none"])
    shape = x.shape if reduction == "none" else ()
    bits = mul_bits(x.bits, other.bits) if reduction == "none" else None
    out = b.result(shape, x.dtype, x.requires_grad or other.requires_grad, exact_bits(x.dtype, bits))
    b.emit(f"{out.name} = {F}.mse_loss({x.name}, {other.name}, reduction={reduction!r})", "mse_loss", out)
    return True


def linear(b) -> bool:
    x = b.pick(lambda v: v.static and v.is_float and v.ndim >= 1)
    if x is None:
        return False
    k = x.shape[-1]
    if not b.needs("size0_reduce", k == 0):
        return False
    m = b.rng.randint(1, 4)
    weight = b.float_input((m, k), dtype=x.dtype, layout="plain")
    args = [x.name, weight.name]
    requires_grad = x.requires_grad or weight.requires_grad
    bits = sum_bits(mul_bits(x.bits, weight.bits), k)
    if b.chance(0.6):
        bias = b.float_input((m,), dtype=x.dtype, layout="plain")
        args.append(bias.name)
        requires_grad |= bias.requires_grad
        bits = None if bits is None else (bits[0] + 1, bits[1])
    out = b.result(x.shape[:-1] + (m,), x.dtype, requires_grad, exact_bits(x.dtype, bits))
    b.emit(f"{out.name} = {F}.linear({', '.join(args)})", "linear", out)
    if x.ndim == 1:
        b.internal_views.add(out.name)
    return True


def recurrence(b) -> bool:
    """h <- tanh(h @ W^T + x_t @ U^T) over 2-4 steps (an RNN cell written out, unrolled):
    each weight's gradient is a sum of one thin product per step, which compiled code
    joins into one product (`ops/linalg.py`)."""
    h = b.pick(lambda v: v.static and v.is_float and v.ndim == 2 and 0 not in v.shape)
    if h is None:
        return False
    batch, n = h.shape
    steps, m = b.rng.randint(2, 4), b.rng.randint(1, 4)
    w = b.float_input((n, n), dtype=h.dtype, layout="plain" if b.chance(0.7) else None)
    u = b.float_input((n, m), dtype=h.dtype, layout="plain" if b.chance(0.7) else None)
    xs = b.float_input((steps, batch, m), dtype=h.dtype)
    state = h.name
    for t in range(steps):
        state = f"torch.tanh({state} @ {w.name}.t() + {xs.name}[{t}] @ {u.name}.t())"
    requires_grad = h.requires_grad or w.requires_grad or u.requires_grad or xs.requires_grad
    out = b.result((batch, n), h.dtype, requires_grad, None)
    b.emit(f"{out.name} = {state}", "recurrence", out)
    return True



def lstm(b) -> bool:
    """nn.LSTM (1-2 layers, either direction, with or without an initial state) over a 3-D
    operand taken as (L, N, I), its weights new arguments (the prelude's `lstm`): eagerly
    and compiled, each layer of 2 or more steps is one op (`ops/lstm_layer.py`), checked
    against the reference interpreter's composite."""
    x = b.pick(lambda v: v.static and v.is_float and v.ndim == 3 and v.shape[0] > 0 and v.shape[2] > 0
               and v.dtype in ("float32", "float64"))
    if x is None:
        return False
    steps, batch, size = x.shape
    hidden, layers, directions = b.rng.randint(1, 3), b.rng.randint(1, 2), b.rng.choice([1, 2])
    weights = []
    for layer in range(layers):
        for _ in range(directions):
            inputs = size if layer == 0 else directions * hidden
            for shape in ((4 * hidden, inputs), (4 * hidden, hidden), (4 * hidden,), (4 * hidden,)):
                weights.append(b.float_input(shape, dtype=x.dtype, layout="plain"))
    state = "None"
    initial = []
    if b.chance(0.5):
        initial = [b.float_input((layers * directions, batch, hidden), dtype=x.dtype) for _ in range(2)]
        state = f"({initial[0].name}, {initial[1].name})"
    requires_grad = any(v.requires_grad for v in [x, *weights, *initial])
    out = b.result((steps, batch, directions * hidden), x.dtype, requires_grad, None)
    names = ", ".join(w.name for w in weights)
    b.emit(f"{out.name} = lstm({x.name}, [{names}], {layers}, {directions == 2}, {state})", "lstm", out)
    return True

def creation(b) -> bool:
    x = b.pick(lambda v: v.static)
    kind = b.rng.choice(["ones_like", "zeros_like", "full", "arange", "eye", "tensor"])
    if kind in ("ones_like", "zeros_like") and x is not None:
        line, shape, dtype, bits = f"torch.{kind}({x.name})", x.shape, x.dtype, (1, 0)
    elif kind == "full" and x is not None:
        line, shape, dtype, bits = f"torch.full({x.shape}, 0.5)", x.shape, "float32", (0, 1)
    elif kind == "arange":
        n = b.rng.randint(1, 5)
        if b.chance(0.5):
            line, dtype = f"torch.arange({n})", "int64"
        else:
            line, dtype = f"torch.arange({n}, dtype=torch.float32) / 4", "float32"
        shape, bits = (n,), (3, 2)
    elif kind == "eye":
        n = b.rng.randint(1, 4)
        line, shape, dtype, bits = f"torch.eye({n})", (n, n), "float32", (1, 0)
    else:
        values = [b.rng.choice([-1.5, 0.5, 2.0, 0.25]) for _ in range(b.rng.randint(1, 3))]
        line, shape, dtype, bits = f"torch.tensor({values})", (len(values),), "float32", (2, 2)
    out = b.result(shape, dtype, False, bits)
    b.emit(f"{out.name} = {line}", "creation", out)
    return True
