"""Shape ops, indexing, gather, matmul and dtype conversions for the op catalogue
(`catalog.py`). A view's result is noted as an alias of its base, so in-place ops on
either know what else they change."""

from __future__ import annotations

import math

from .model import FLOATS, exact_bits, mul_bits, sum_bits


def _view(b, x, shape, line: str, tag: str, contiguous: bool = False, is_view: bool = True) -> bool:
    out = b.result(shape, x.dtype, x.requires_grad, x.bits, base=x.name if is_view else None,
                   contiguous=contiguous)
    if is_view:
        b.note_alias(out, x)
    b.emit(f"{out.name} = {line}", tag, out)
    return True


def _empty_reshape_allowed(b, x) -> bool:
    return b.needs("size0_reshape", x.numel == 0)


def reshape(b) -> bool:
    x = b.pick(lambda v: v.static and v.ndim >= 1 and v.numel == 0) if b.chance(0.7) else None
    x = x or b.pick(lambda v: v.static and v.ndim >= 1)
    if x is None or not _empty_reshape_allowed(b, x):
        return False
    shape = list(x.shape)
    kind = b.rng.choice(["flat", "merge", "split", "insert_one", "flatten_range"])
    if kind == "flat" or (kind == "merge" and len(shape) < 2):
        target, line = (x.numel,), b.rng.choice([f"{x.name}.reshape(-1)", f"{x.name}.flatten()",
                                                  f"torch.reshape({x.name}, (-1,))"])
    elif kind == "merge":
        i = b.rng.randrange(len(shape) - 1)
        target = tuple(shape[:i] + [shape[i] * shape[i + 1]] + shape[i + 2:])
        line = f"{x.name}.reshape({target})"
    elif kind == "split":
        i = b.rng.randrange(len(shape))
        factors = [f for f in (2, 3) if shape[i] % f == 0 and shape[i] > f]
        if not factors:
            return False
        f = b.rng.choice(factors)
        target = tuple(shape[:i] + [f, shape[i] // f] + shape[i + 1:])
        written = list(target)
        if b.chance(0.5) and 0 not in target:
            written[b.rng.randrange(len(written))] = -1
        line = f"{x.name}.reshape({tuple(written)})"
    elif kind == "insert_one":
        i = b.rng.randint(0, len(shape))
        target = tuple(shape[:i] + [1] + shape[i:])
        line = f"{x.name}.reshape({target})"
    else:
        if len(shape) < 2:
            return False
        start = b.rng.randrange(len(shape) - 1)
        end = b.rng.randrange(start + 1, len(shape))
        target = tuple(shape[:start] + [math.prod(shape[start:end + 1])] + shape[end + 1:])
        line = f"{x.name}.flatten({start}, {end - len(shape) if b.chance(0.5) else end})"
    if x.contiguous and b.chance(0.3) and line.startswith(f"{x.name}.reshape("):
        line = line.replace(".reshape(", ".view(", 1)
    return _view(b, x, target, line, "reshape", contiguous=True)  # (a view whenever strides allow)


def permute(b) -> bool:
    x = b.pick(lambda v: v.ndim >= 2)
    if x is None:
        return False
    n = x.ndim
    kind = b.rng.choice(["permute", "transpose", "t", "mT"])
    if kind == "t" and n != 2:
        kind = "transpose"
    if kind == "permute":
        perm = list(range(n))
        b.rng.shuffle(perm)
        shape, line = tuple(x.shape[p] for p in perm), f"{x.name}.permute{tuple(perm)}"
    elif kind == "transpose":
        d0, d1 = b.rng.sample(range(n), 2)
        perm = list(range(n))
        perm[d0], perm[d1] = perm[d1], perm[d0]
        shape = tuple(x.shape[p] for p in perm)
        line = f"{x.name}.transpose({d0 - n if b.chance(0.4) else d0}, {d1})" if b.chance(0.6) else \
            f"torch.transpose({x.name}, {d0}, {d1 - n})"
    elif kind == "t":
        shape, line = (x.shape[1], x.shape[0]), b.rng.choice([f"{x.name}.t()", f"{x.name}.T"])
    else:
        shape, line = x.shape[:-2] + (x.shape[-1], x.shape[-2]), f"{x.name}.mT"
    return _view(b, x, shape, line, "permute")


def squeeze_unsqueeze(b) -> bool:
    x = b.pick(lambda v: v.static)
    if x is None:
        return False
    if b.chance(0.5) or x.ndim == 0:
        d = b.rng.randint(0, x.ndim)
        written = d if b.chance(0.5) else d - x.ndim - 1
        shape = x.shape[:d] + (1,) + x.shape[d:]
        line = f"{x.name}.unsqueeze({written})" if b.chance(0.6) else f"torch.unsqueeze({x.name}, {written})"
        return _view(b, x, shape, line, "unsqueeze", contiguous=x.contiguous)
    ones = [i for i, s in enumerate(x.shape) if s == 1]
    if ones and b.chance(0.6):
        d = b.rng.choice(ones)
        shape = x.shape[:d] + x.shape[d + 1:]
        return _view(b, x, shape, f"{x.name}.squeeze({d - x.ndim if b.chance(0.5) else d})", "squeeze",
                     contiguous=x.contiguous)
    shape = tuple(s for s in x.shape if s != 1)
    return _view(b, x, shape, f"{x.name}.squeeze()", "squeeze", contiguous=x.contiguous)


def expand(b) -> bool:
    x = b.pick(lambda v: v.static and (1 in v.shape or v.ndim < len(b.universe)))
    if x is None:
        return False
    lead = max(0, len(b.universe) - x.ndim)
    offset = len(b.universe) - x.ndim  # universe dim of x's dim i: offset + i (if in range)
    target = tuple(b.universe[:lead]) + tuple(
        b.universe[offset + i] if s == 1 and 0 <= offset + i < len(b.universe) and b.chance(0.7) else s
        for i, s in enumerate(x.shape))
    written = list(target)
    for i in range(lead, len(target)):
        if target[i] == x.shape[i - lead] and b.chance(0.4):
            written[i] = -1
    kind = b.rng.choice(["expand", "broadcast_to"])
    line = f"{x.name}.expand{tuple(written)}" if kind == "expand" else f"torch.broadcast_to({x.name}, {target})"
    return _view(b, x, target, line, "expand")


def cat_stack(b) -> bool:
    x = b.pick(lambda v: v.static and v.ndim >= 1)
    if x is None:
        return False
    stack = b.chance(0.35)
    dim = b.rng.randrange(x.ndim + (1 if stack else 0))
    if stack:
        same = [v for v in b.pool if v.static and v.shape == x.shape and v.dtype == x.dtype]
    else:
        same = [v for v in b.pool if v.static and v.ndim == x.ndim and v.dtype == x.dtype
                and all(a == c for i, (a, c) in enumerate(zip(v.shape, x.shape)) if i != dim)]
    parts = [x] + b.rng.sample(same, min(len(same), b.rng.randint(1, 2)))
    b.rng.shuffle(parts)
    written_dim = dim - (x.ndim + 1 if stack else x.ndim) if b.chance(0.3) else dim
    names = ", ".join(p.name for p in parts)
    if stack:
        shape = x.shape[:dim] + (len(parts),) + x.shape[dim:]
        line = f"torch.stack([{names}], {written_dim})"
    else:
        shape = x.shape[:dim] + (sum(p.shape[dim] for p in parts),) + x.shape[dim + 1:]
        line = f"torch.cat([{names}], dim={written_dim})" if b.chance(0.7) else f"torch.cat(({names},), {written_dim})"
    bits = x.bits
    for p in parts:
        bits = None if bits is None or p.bits is None else (max(bits[0], p.bits[0]), max(bits[1], p.bits[1]))
    out = b.result(shape, x.dtype, any(p.requires_grad for p in parts), bits)
    b.emit(f"{out.name} = {line}", "stack" if stack else "cat", out)
    return True


def _basic_key(b, x):
    """A basic index (ints, slices, None, ...) of x and the resulting shape."""
    items, shape = [], []
    for size in x.shape:
        kind = b.rng.choice(["all", "all", "int", "slice", "step"])
        if kind == "int" and size > 0:
            i = b.rng.randrange(size)
            items.append(str(i if b.chance(0.6) else i - size))
        elif kind == "slice":
            start = b.rng.randint(0, size)
            stop = b.rng.randint(start, size)
            items.append(f"{start}:{stop}" if b.chance(0.7) else f"{start}:")
            shape.append(stop - start if ":" in items[-1] and not items[-1].endswith(":") else size - start)
        elif kind == "step":
            step = b.rng.choice([2, 3])
            items.append(f"::{step}")
            shape.append(-(-size // step))
        else:
            items.append(":")
            shape.append(size)
    if items and items[0] == ":" and b.chance(0.3):  # (every dim written: the ellipsis stands for one)
        items[0] = "..."
    if b.chance(0.2) and "..." not in items:
        at = b.rng.randint(0, len(items))
        items.insert(at, "None")
        shape.insert(sum(1 for item in items[:at] if not item.lstrip("-").isdigit()), 1)
    while items and items[-1] == ":" and "..." not in items and b.chance(0.7):
        items.pop()
    return items, tuple(shape)


def index_basic(b) -> bool:
    x = b.pick(lambda v: v.static and v.ndim >= 1)
    if x is None:
        return False
    items, shape = _basic_key(b, x)
    key = ", ".join(items) if items else "..."
    return _view(b, x, shape, f"{x.name}[{key}]", "index_basic")


def index_int(b) -> bool:
    x = b.pick(lambda v: v.static and v.ndim >= 1 and v.shape[0] > 0)
    if x is None:
        return False
    n = x.shape[0]
    if b.chance(0.4):
        values = [b.rng.randrange(-n, n) for _ in range(b.rng.randint(1, 4))]
        key, index_shape = str(values), (len(values),)
    else:
        index = b.index_input(tuple(b.rng.randint(1, 3) for _ in range(b.rng.randint(1, 2))), n)
        key, index_shape = index.name, index.shape
    if x.ndim >= 2 and b.chance(0.3) and x.shape[1] > 0:
        index = b.index_input((b.rng.randint(1, 3),), x.shape[1])
        key = f":, {index.name}"
        shape = (x.shape[0],) + index.shape + x.shape[2:]
    else:
        shape = index_shape + x.shape[1:]
    out = b.result(shape, x.dtype, x.requires_grad, x.bits)
    b.emit(f"{out.name} = {x.name}[{key}]", "index_int", out)
    return True


def index_mask(b) -> bool:
    x = b.pick(lambda v: v.static and v.ndim >= 1)
    if x is None:
        return False
    k = b.rng.randint(1, x.ndim)
    mask = b.pick(lambda v: v.dtype == "bool" and v.static and v.shape == x.shape[:k])
    if mask is None:
        mask = b.bool_input(x.shape[:k])
    out = b.result((None,) + x.shape[k:], x.dtype, x.requires_grad, x.bits)
    b.emit(f"{out.name} = {x.name}[{mask.name}]", "index_mask", out)
    return True


def gather(b) -> bool:
    x = b.pick(lambda v: v.static and v.ndim >= 1 and 0 not in v.shape)
    if x is None:
        return False
    d = b.rng.randrange(x.ndim)
    shape = tuple(b.rng.randint(1, 3) if i == d else b.rng.randint(1, s) for i, s in enumerate(x.shape))
    negative = b.allows("negative_index") and b.chance(0.2)
    index = b.index_input(shape, x.shape[d], low=-x.shape[d] if negative else 0)
    if negative:
        b.tags.append("negative_index")
    written = d - x.ndim if b.chance(0.4) else d
    line = f"torch.gather({x.name}, {written}, {index.name})" if b.chance(0.5) else \
        f"{x.name}.gather({written}, {index.name})"
    out = b.result(shape, x.dtype, x.requires_grad, x.bits)
    b.emit(f"{out.name} = {line}", "gather", out)
    return True


def matmul(b) -> bool:
    x = b.pick(lambda v: v.static and v.is_float and 1 <= v.ndim <= 4)
    if x is None:
        return False
    k = x.shape[-1]
    if not b.needs("size0_reduce", k == 0):
        return False
    m = b.rng.randint(1, 4)
    if x.ndim >= 3 and b.chance(0.5):
        batch = tuple(1 if b.chance(0.3) else s for s in x.shape[:-2])
        other_shape = batch + (k, m)
        tag = "bmm"
    else:
        other_shape = (k, m) if b.chance(0.8) else (k,)
        tag = "matmul"
    other = b.pick(lambda v: v.static and v.shape == other_shape and v.dtype == x.dtype and v is not x)
    if other is None:
        other = b.float_input(other_shape, dtype=x.dtype, layout="plain" if b.chance(0.7) else None)
    batch_x, batch_o = x.shape[:-2], other.shape[:-2]
    from .model import broadcast
    batch = broadcast(batch_x, batch_o) if len(other_shape) >= 2 else batch_x
    if batch is None:
        return False
    if x.ndim == 1:
        shape = batch_o + other_shape[-1:] if len(other_shape) >= 2 else ()
    else:
        shape = batch + x.shape[-2:-1] + (other_shape[-1:] if len(other_shape) >= 2 else ())
    forms = [f"{x.name} @ {other.name}", f"torch.matmul({x.name}, {other.name})", f"{x.name}.matmul({other.name})"]
    if x.ndim == 2 and len(other_shape) == 2:
        forms.append(f"torch.mm({x.name}, {other.name})")
    bits = sum_bits(mul_bits(x.bits, other.bits), k)
    out = b.result(shape, x.dtype, x.requires_grad or other.requires_grad, exact_bits(x.dtype, bits))
    b.emit(f"{out.name} = {b.rng.choice(forms)}", tag, out)
    if x.ndim == 1 or len(other_shape) == 1:
        b.internal_views.add(out.name)
    return True


def convert(b) -> bool:
    x = b.pick(lambda v: True)
    if x is None:
        return False
    target = b.rng.choice(["float32", "float64", "int64", "bool"])
    if target in ("int64", "bool") and not x.exact:
        target = "float64"
    if target == x.dtype:
        return False
    forms = {"float32": [".float()", ".to(torch.float32)"], "float64": [".double()", ".to(torch.float64)"],
             "int64": [".long()", ".to(torch.int64)"], "bool": [".bool()"]}
    line = x.name + b.rng.choice(forms[target])
    if target in FLOATS:
        bits = exact_bits(target, x.bits)
    elif target == "int64":
        bits = (x.bits[0], 0)
    else:
        bits = (1, 0)
    out = b.result(x.shape, target, x.requires_grad, bits)
    b.emit(f"{out.name} = {line}", "convert", out)
    return True
