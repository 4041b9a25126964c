"""Layers of neural networks for the op catalogue (`catalog.py`): activations, norms,
losses, padding, pooling, convolutions (and transposed ones), group/instance/batch norm
and scaled dot-product attention.

Piecewise activations and losses (leaky_relu, hardtanh, huber, ...) and max pooling take
exact operands only; max pooling's operand is made tie-free (`catalog_math.untied`).
Norms whose gradient is singular at zero take an operand kept away from it; normalizing
layers take `spread(x)` (so no group is near constant) and groups of at least three values.
Weights and the like are new arguments of the right shape."""

from __future__ import annotations

import math
import re

from .catalog_math import untied
from .model import add_bits, exact_bits, mul_bits, sum_bits

F = "torch.nn.functional"

SMOOTH = {"softplus": "", "mish": "", "logsigmoid": "", "softsign": "", "elu": "", "celu": "", "softplus_beta":
          "", "glu": ""}
PIECEWISE = {"leaky_relu": ", 0.125", "hardtanh": ", -0.5, 1.5", "relu6": "", "hardswish": "", "hardsigmoid": "",
             "selu": "", "elu_alpha": "", "prelu": "", "threshold": ""}


def _float(b, predicate=lambda v: True):
    return b.pick(lambda v: v.static and v.is_float and predicate(v))


def _arg(b, shape, dtype, requires_grad=None, positive: bool = False) -> str:
    """A new argument of `shape` (an expression keeping it positive when asked)."""
    var = b.float_input(tuple(shape), dtype=dtype, layout="plain", requires_grad=requires_grad)
    return f"({var.name} * {var.name} + 0.5)" if positive else var.name


def _emit(b, shape, dtype, grad: bool, bits, line: str, tag: str) -> bool:
    out = b.result(shape, dtype, grad, exact_bits(dtype, bits) if bits else None)
    b.emit(f"{out.name} = {line}", tag, out)
    return True


def _grad_of(b, sources: list[str]) -> bool:
    """Whether a variable named in the `sources` (expressions) requires grad."""
    names = set(re.findall(r"\b[a-z]\d+\b", " ".join(sources)))
    return any(v.requires_grad for v in b.pool if v.name in names)


def activation(b) -> bool:
    fn = b.rng.choice(sorted(SMOOTH) + sorted(PIECEWISE))
    x = _float(b, (lambda v: v.exact) if fn in PIECEWISE else (lambda v: True))
    if x is None:
        return False
    shape, bits = x.shape, None
    if fn == "glu":
        dims = [d for d in range(x.ndim) if x.shape[d] % 2 == 0]
        if not dims:
            return False
        d = b.rng.choice(dims)
        shape = tuple(s // 2 if i == d else s for i, s in enumerate(x.shape))
        line = f"{F}.glu({x.name}, {d - x.ndim if b.chance(0.5) else d})"
    elif fn == "softplus_beta":
        line = f"{F}.softplus({x.name}, beta=2, threshold={b.rng.choice([20, 1])})"
    elif fn == "elu_alpha":
        line = f"{F}.elu({x.name}, alpha=0.5)"
    elif fn == "prelu":
        channels = x.shape[1] if x.ndim >= 2 and b.chance(0.5) else 1
        weight = _arg(b, (channels,), x.dtype)
        return _emit(b, x.shape, x.dtype, _grad_of(b, [x.name, weight]), None, f"{F}.prelu({x.name}, {weight})",
                     "prelu")
    elif fn == "threshold":
        line = f"{F}.threshold({x.name}, 0.25, -1.0)"
        bits = add_bits(x.bits, (1, 0))
    elif fn in ("leaky_relu", "hardtanh", "relu6"):
        line = f"{F}.{fn}({x.name}{PIECEWISE[fn]})"
        bits = (x.bits[0], x.bits[1] + 3) if fn == "leaky_relu" else x.bits
    else:
        line = f"{F}.{fn}({x.name})"
    if fn in ("mish", "softsign", "elu", "selu", "hardswish") and b.chance(0.3):
        module = {"mish": "Mish", "softsign": "Softsign", "elu": "ELU", "selu": "SELU", "hardswish": "Hardswish"}[fn]
        line = f"torch.nn.{module}()({x.name})"
    return _emit(b, shape, x.dtype, x.requires_grad, bits, line, fn)


def norm(b) -> bool:
    x = _float(b, lambda v: v.ndim >= 1)
    if x is None:
        return False
    kind = b.rng.choice(["vector_norm", "vector_norm", "linalg_norm", "tensor_norm", "normalize"])
    ord_ = b.rng.choice([2, 2, 1, 3]) if kind != "linalg_norm" else None
    # |x| is singular at 0 for p = 1 (x exact: the side is the same everywhere); the other
    # orders divide by the norm: their operand is kept positive.
    operand = x.name if ord_ == 1 and x.exact else f"({x.name} * {x.name} + 0.5)"
    d = b.rng.randrange(x.ndim)
    if kind == "normalize":
        shape = x.shape
        line = f"{F}.normalize({operand}, p={ord_}, dim={d - x.ndim if b.chance(0.5) else d})"
    else:
        keepdim = b.chance(0.3)
        whole = b.chance(0.3)
        shape = () if whole and not keepdim else tuple(
            1 if (whole or i == d) else s for i, s in enumerate(x.shape) if keepdim or (not whole and i != d))
        dims = "" if whole else f", dim={d}"
        keep = ", keepdim=True" if keepdim else ""
        if whole and keepdim:
            dims = f", dim={tuple(range(x.ndim))}"
        if kind == "vector_norm":
            line = f"torch.linalg.vector_norm({operand}, {ord_}{dims}{keep})"
        elif kind == "linalg_norm":
            if whole and keepdim and x.ndim > 2:
                return False  # (a tuple of more than two dims: neither a vector nor a matrix norm)
            line = f"torch.linalg.norm({operand}{dims}{keep})"
        else:
            line = f"{operand}.norm(p={ord_}{dims}{keep})"
    return _emit(b, shape, x.dtype, x.requires_grad, None, line, kind)


def loss(b) -> bool:
    kind = b.rng.choice(["smooth_l1_loss", "huber_loss", "l1_loss", "kl_div", "bce_with_logits", "bce", "nll_loss"])
    exact = kind in ("smooth_l1_loss", "huber_loss", "l1_loss")
    x = _float(b, lambda v: (v.exact or not exact) and v.numel and (kind != "nll_loss" or v.ndim in (1, 2)))
    if x is None:
        return False
    reduction = b.rng.choice(["mean", "sum", "none"])
    shape = x.shape if reduction == "none" else ()
    if kind == "nll_loss":
        n = x.shape[0] if x.ndim == 2 else None
        target = b.label_input(n, x.shape[-1])
        weight = f", weight={_arg(b, (x.shape[-1],), x.dtype, False, positive=True)}" if b.chance(0.3) else ""
        shape = () if reduction != "none" or n is None else (n,)
        line = f"{F}.nll_loss({F}.log_softmax({x.name}, -1), {target.name}{weight}, reduction={reduction!r})"
        _emit(b, shape, x.dtype, x.requires_grad, None, line, kind)
        if n is None and reduction == "none":
            b.internal_views.add(b.pool[-1].name)
        return True
    other = b.pick(lambda v: v.static and v.shape == x.shape and v.dtype == x.dtype and v is not x
                   and (v.exact or not exact))
    other = other.name if other is not None else _arg(b, x.shape, x.dtype)
    grad = _grad_of(b, [x.name, other])
    if exact:
        extra = {"smooth_l1_loss": b.rng.choice(["", ", beta=0.5"]), "huber_loss": b.rng.choice(["", ", delta=0.5"]),
                 "l1_loss": ""}[kind]
        line = f"{F}.{kind}({x.name}, {other}, reduction={reduction!r}{extra})"
        bits = add_bits(x.bits, x.bits) if kind == "l1_loss" and reduction == "none" else None
        return _emit(b, shape, x.dtype, grad, bits, line, kind)
    if kind == "kl_div":
        if reduction == "mean" and b.chance(0.5):
            reduction = "batchmean"
        log_target = b.chance(0.4)
        d = -1
        target = f"{F}.log_softmax({other}, {d})" if log_target else f"{F}.softmax({other}, {d})"
        line = f"{F}.kl_div({F}.log_softmax({x.name}, {d}), {target}, reduction={reduction!r}" + \
            (", log_target=True)" if log_target else ")")
        return _emit(b, shape, x.dtype, grad, None, line, kind)
    if kind == "bce_with_logits":
        extra, names = "", [x.name, other]
        if b.chance(0.4) and x.ndim >= 1:
            # (without grad: PyTorch refuses a pos_weight or weight that requires it)
            names.append(_arg(b, x.shape[-1:], x.dtype, False, positive=True))
            extra = f", pos_weight={names[-1]}"
        if b.chance(0.3):
            extra += f", weight={_arg(b, x.shape[-1:], x.dtype, False)}"
        grad = _grad_of(b, names)
        line = f"{F}.binary_cross_entropy_with_logits({x.name}, torch.sigmoid({other}), reduction={reduction!r}{extra})"
        return _emit(b, shape, x.dtype, grad, None, line, kind)
    line = f"{F}.binary_cross_entropy(torch.sigmoid({x.name}.tanh()), torch.sigmoid({other}), reduction={reduction!r})"
    return _emit(b, shape, x.dtype, grad, None, line, kind)


# --- padding and pooling ----------------------------------------------------------------------


def _batched(b, spatial: int, exact: bool = False, nonempty: bool = True):
    """A float variable shaped (N, C, *spatial) or (C, *spatial)."""
    return _float(b, lambda v: v.ndim in (spatial + 1, spatial + 2) and (v.exact or not exact)
                  and (not nonempty or 0 not in v.shape))


def pad(b) -> bool:
    mode = b.rng.choice(["constant", "constant", "reflect", "replicate", "circular"])
    spatial = b.rng.choice([1, 2])
    if mode == "constant":
        x = _float(b, lambda v: v.ndim >= 1)
        if x is None:
            return False
        count = b.rng.randint(1, min(x.ndim, 3))
        widths = [b.rng.randint(0, 2) for _ in range(2 * count)]
        value = b.rng.choice(["", ", value=0.5", ", value=-1.0"])
        shape = list(x.shape)
        for i in range(count):
            shape[x.ndim - 1 - i] += widths[2 * i] + widths[2 * i + 1]
        line = f"{F}.pad({x.name}, {tuple(widths)}{value})"
        return _emit(b, shape, x.dtype, x.requires_grad, add_bits(x.bits, (1, 1)), line, "pad_constant")
    x = _batched(b, spatial)
    if x is None:
        return False
    widths = []
    shape = list(x.shape)
    for i in range(spatial):
        size = x.shape[x.ndim - 1 - i]
        limit = {"reflect": size - 1, "replicate": 2, "circular": size}[mode]
        pair = [b.rng.randint(0, min(2, limit)) for _ in range(2)]
        widths += pair
        shape[x.ndim - 1 - i] += sum(pair)
    line = f"{F}.pad({x.name}, {tuple(widths)}, mode={mode!r})"
    return _emit(b, shape, x.dtype, x.requires_grad, x.bits, line, f"pad_{mode}")


def _pool_size(size: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    span = size + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


def pool(b) -> bool:
    kind = b.rng.choice(["avg", "avg", "max", "max", "adaptive_avg", "adaptive_max"])
    spatial = b.rng.choice([1, 2])
    x = _batched(b, spatial, exact=kind in ("max", "adaptive_max"))
    if x is None:
        return False
    source, bits = x.name, None
    if kind in ("max", "adaptive_max"):
        found = untied(b, x)
        if found is None:
            return False
        source, bits = found
    sizes = x.shape[x.ndim - spatial:]
    lead = x.shape[:x.ndim - spatial]
    name = f"{kind}_pool{spatial}d"
    if kind.startswith("adaptive"):
        out = tuple(b.rng.randint(1, s) for s in sizes)
        written = out[0] if spatial == 1 else out
        return _emit(b, lead + out, x.dtype, x.requires_grad, bits, f"{F}.{name}({source}, {written})", name)
    k = b.rng.randint(1, min(3, min(sizes)))
    stride = b.rng.randint(1, 2)
    padding = b.rng.randint(0, k // 2)
    dilation = b.rng.choice([1, 1, 2]) if kind == "max" else 1
    ceil = False  # (tracegrad's pools have no ceil_mode: a documented limit)
    out = tuple(_pool_size(s, k, stride, padding, dilation, ceil) for s in sizes)
    if min(out) <= 0:
        return False
    args = f"{k}, stride={stride}, padding={padding}" + (", ceil_mode=True" if ceil else "")
    if kind == "max" and dilation > 1:
        args += f", dilation={dilation}"
    if kind == "avg" and b.chance(0.3):
        args += ", count_include_pad=False"
    return _emit(b, lead + out, x.dtype, x.requires_grad, bits, f"{F}.{name}({source}, {args})", name)


# --- convolutions -------------------------------------------------------------------------------


def conv(b) -> bool:
    transposed = b.chance(0.5)
    spatial = b.rng.choice([1, 2])
    x = _batched(b, spatial)
    if x is None or (spatial == 2 and x.ndim == 3 and not transposed):
        return False  # (tracegrad's conv2d takes no unbatched input: a documented limit)
    channels = x.shape[-spatial - 1]
    groups = b.rng.choice([g for g in (1, 2) if channels % g == 0])
    out_channels = groups * b.rng.randint(1, 2)
    k = b.rng.randint(1, 3)
    stride, padding = b.rng.randint(1, 2), b.rng.randint(0, 1)
    dilation = b.rng.choice([1, 1, 2])
    weight_shape = (channels, out_channels // groups) if transposed else (out_channels, channels // groups)
    weight = _arg(b, weight_shape + (k,) * spatial, x.dtype)
    names = [x.name, weight]
    args = [x.name, weight]
    bits = sum_bits(mul_bits(x.bits, (2, 3)), (channels // groups) * k ** spatial)
    if b.chance(0.5):
        bias = _arg(b, (out_channels,), x.dtype)
        args.append(bias)
        names.append(bias)
        bits = add_bits(bits, (2, 3))
    sizes = x.shape[x.ndim - spatial:]
    if transposed:
        output_padding = b.rng.randint(0, max(stride, dilation) - 1)
        out = tuple((s - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1 for s in sizes)
        args += [f"stride={stride}", f"padding={padding}", f"output_padding={output_padding}", f"groups={groups}",
                 f"dilation={dilation}"]
    else:
        out = tuple(_pool_size(s, k, stride, padding, dilation, False) for s in sizes)
        args += [f"stride={stride}", f"padding={padding}", f"dilation={dilation}", f"groups={groups}"]
    if min(out) <= 0:
        return False
    shape = x.shape[:x.ndim - spatial - 1] + (out_channels,) + out
    name = f"conv_transpose{spatial}d" if transposed else f"conv{spatial}d"
    return _emit(b, shape, x.dtype, _grad_of(b, names), bits, f"{F}.{name}({', '.join(args)})", name)


# --- normalization and attention -----------------------------------------------------------


def normalization(b) -> bool:
    kind = b.rng.choice(["group_norm", "instance_norm", "batch_norm", "batch_norm_eval"])
    x = _float(b, lambda v: v.ndim >= (3 if kind == "instance_norm" else 2) and 0 not in v.shape)
    if x is None:
        return False
    channels = x.shape[1]
    spatial = math.prod(x.shape[2:])
    dtype = x.dtype
    affine = []
    if b.chance(0.5):
        affine = [f"weight={_arg(b, (channels,), dtype)}", f"bias={_arg(b, (channels,), dtype)}"]
    if kind == "group_norm":
        groups = b.rng.choice([g for g in (1, 2, 3) if channels % g == 0])
        if channels // groups * spatial < 3:
            return False
        line = f"{F}.group_norm(spread({x.name}), {groups}{''.join(', ' + a for a in affine)})"
    elif kind == "instance_norm":
        if spatial < 3:
            return False
        line = f"{F}.instance_norm(spread({x.name}){''.join(', ' + a for a in affine)})"
    elif kind == "batch_norm":
        if x.shape[0] * spatial < 3:
            return False
        mean = b.float_input((channels,), dtype=dtype, requires_grad=False, layout="plain")
        var = b.float_input((channels,), dtype=dtype, requires_grad=False, layout="plain")
        line = f"{F}.batch_norm(spread({x.name}), {mean.name}, {var.name}{''.join(', ' + a for a in affine)}, " \
               f"training=True, momentum={b.rng.choice([0.1, 0.5])})"
        grad = _grad_of(b, [x.name] + [a.split("=")[1] for a in affine])
        _emit(b, x.shape, dtype, grad, None, line, kind)
        for stat in (mean, var):  # (updated in place: the arguments' values are compared too)
            stat.bits = None
            b.written.add(stat.name)
        return True
    else:
        mean = _arg(b, (channels,), dtype, False)
        var = _arg(b, (channels,), dtype, False, positive=True)
        line = f"{F}.batch_norm({x.name}, {mean}, {var}{''.join(', ' + a for a in affine)})"
    grad = _grad_of(b, [x.name] + [a.split("=")[1] for a in affine])
    return _emit(b, x.shape, dtype, grad, None, line, kind)


def attention(b) -> bool:
    q = _float(b, lambda v: 2 <= v.ndim <= 4 and v.shape[-1] > 0)
    if q is None:
        return False
    batch, length, embed = q.shape[:-2], q.shape[-2], q.shape[-1]
    source = b.rng.randint(1, 4)
    ev = b.rng.randint(1, 3)
    k = _arg(b, batch + (source, embed), q.dtype)
    v = _arg(b, batch + (source, ev), q.dtype)
    args = [q.name, k, v]
    if b.chance(0.3):
        args.append(f"attn_mask={_arg(b, (length, source), q.dtype, False)}")
    elif b.chance(0.4):
        args.append("is_causal=True")
    if b.chance(0.3):
        args.append("scale=0.5")
    grad = _grad_of(b, [q.name, k, v])
    return _emit(b, batch + (length, ev), q.dtype, grad, None, f"{F}.scaled_dot_product_attention({', '.join(args)})",
                 "attention")

