"""Rearrangements, indexed reads and writes, and contractions for the op catalogue
(`catalog.py`): flip, roll, rot90, tril/triu, diagonal, diag_embed, repeat_interleave,
movedim, unflatten, narrow, tile, chunk/split/unbind, diff, trace; index_select,
index_add, scatter, scatter_add, masked_fill, masked_scatter, take_along_dim; einsum,
tensordot, bmm, baddbmm, addmm, outer, kron.

Results PyTorch makes as views are noted as views of their base (so in-place ops know
what else they change); scatter's indices are distinct along the scattered dim (a place
written twice keeps either value)."""

from __future__ import annotations

import math

from .model import add_bits, exact_bits, mul_bits, sum_bits


def _dims(b, x, count: int = 1) -> list[int]:
    return b.rng.sample(range(x.ndim), count)


def _w(b, d: int, ndim: int) -> int:
    """Dim d as written: sometimes negative."""
    return d - ndim if b.chance(0.4) else d


def _out(b, x, shape, line: str, tag: str, bits="same", view: bool = False, grad: bool | None = None) -> bool:
    out = b.result(shape, x.dtype, x.requires_grad if grad is None else grad, x.bits if bits == "same" else bits,
                   base=x.name if view else None, contiguous=not view)
    if view:
        b.note_alias(out, x)
    b.emit(f"{out.name} = {line}", tag, out)
    return True


def rearrange(b) -> bool:
    x = b.pick(lambda v: v.static and v.ndim >= 1)
    if x is None:
        return False
    kind = b.rng.choice(["flip", "roll", "rot90", "tril", "diagonal", "diag_embed", "repeat_interleave",
                         "movedim", "unflatten", "narrow", "tile", "piece", "diff", "trace", "diag"])
    n, s = x.ndim, x.shape
    if kind == "flip":
        dims = _dims(b, x, b.rng.randint(1, n))
        written = tuple(_w(b, d, n) for d in dims)
        return _out(b, x, s, f"torch.flip({x.name}, {list(written)})" if b.chance(0.5) else
                    f"{x.name}.flip({', '.join(map(str, written))})", "flip")
    if kind == "roll":
        if b.chance(0.3):
            return _out(b, x, s, f"torch.roll({x.name}, {b.rng.randint(-3, 3)})", "roll")
        dims = _dims(b, x, b.rng.randint(1, min(2, n)))
        shifts = tuple(b.rng.randint(-6, 6) for _ in dims)
        written = tuple(_w(b, d, n) for d in dims)
        return _out(b, x, s, f"torch.roll({x.name}, {shifts}, {written})", "roll")
    if kind == "rot90":
        if n < 2:
            return False
        d0, d1 = _dims(b, x, 2)
        k = b.rng.randint(-2, 3)
        shape = list(s)
        if k % 2:
            shape[d0], shape[d1] = shape[d1], shape[d0]
        return _out(b, x, tuple(shape), f"torch.rot90({x.name}, {k}, [{_w(b, d0, n)}, {_w(b, d1, n)}])", "rot90")
    if kind == "tril":
        if n < 2:
            return False
        fn, diagonal = b.rng.choice(["tril", "triu"]), b.rng.randint(-2, 2)
        line = f"torch.{fn}({x.name}, {diagonal})" if b.chance(0.5) else f"{x.name}.{fn}(diagonal={diagonal})"
        return _out(b, x, s, line, fn)
    if kind == "diagonal":
        if n < 2:
            return False
        d0, d1 = _dims(b, x, 2)
        offset = b.rng.randint(-2, 2)
        length = max(0, min(s[d0] + min(offset, 0), s[d1] - max(offset, 0)))
        shape = tuple(v for i, v in enumerate(s) if i not in (d0, d1)) + (length,)
        line = f"torch.diagonal({x.name}, {offset}, {_w(b, d0, n)}, {_w(b, d1, n)})" if b.chance(0.6) else \
            f"{x.name}.diagonal(offset={offset}, dim1={d0}, dim2={d1})"
        return _out(b, x, shape, line, "diagonal", view=True)
    if kind == "diag_embed":
        if n > 3:
            return False
        offset = b.rng.randint(-1, 1)
        size = s[-1] + abs(offset)
        return _out(b, x, s[:-1] + (size, size), f"torch.diag_embed({x.name}, {offset})", "diag_embed")
    if kind == "repeat_interleave":
        repeats = b.rng.randint(0, 3)
        if b.chance(0.3):
            return _out(b, x, (x.numel * repeats,), f"{x.name}.repeat_interleave({repeats})", "repeat_interleave")
        d = b.rng.randrange(n)
        shape = tuple(v * repeats if i == d else v for i, v in enumerate(s))
        return _out(b, x, shape, f"torch.repeat_interleave({x.name}, {repeats}, dim={_w(b, d, n)})",
                    "repeat_interleave")
    if kind == "movedim":
        src = b.rng.randrange(n)
        dst = b.rng.randrange(n)
        order = [i for i in range(n) if i != src]
        order.insert(dst, src)
        fn = b.rng.choice(["movedim", "moveaxis"])
        return _out(b, x, tuple(s[i] for i in order), f"torch.{fn}({x.name}, {_w(b, src, n)}, {_w(b, dst, n)})",
                    "movedim", view=True, bits="same")
    if kind == "unflatten":
        d = b.rng.randrange(n)
        factors = [f for f in (2, 3) if s[d] % f == 0 and s[d] >= f]
        if not factors:
            return False
        f = b.rng.choice(factors)
        sizes = (f, -1) if b.chance(0.4) else (f, s[d] // f)
        shape = s[:d] + (f, s[d] // f) + s[d + 1:]
        return _out(b, x, shape, f"{x.name}.unflatten({_w(b, d, n)}, {sizes})", "unflatten", view=True)
    if kind == "narrow":
        d = b.rng.randrange(n)
        start = b.rng.randint(0, s[d])
        length = b.rng.randint(0, s[d] - start)
        shape = tuple(length if i == d else v for i, v in enumerate(s))
        return _out(b, x, shape, f"torch.narrow({x.name}, {_w(b, d, n)}, {start}, {length})", "narrow", view=True)
    if kind == "tile":
        reps = tuple(b.rng.randint(1, 2) for _ in range(b.rng.randint(1, n + 1)))
        full = (1,) * (n - len(reps)) + reps
        base = (1,) * (len(full) - n) + s
        return _out(b, x, tuple(a * r for a, r in zip(base, full)), f"{x.name}.tile({reps})", "tile")
    if kind == "piece":
        return _piece(b, x)
    if kind == "diff":
        d = b.rng.randrange(n)
        if s[d] == 0:
            return False
        shape = tuple(v - 1 if i == d else v for i, v in enumerate(s))
        return _out(b, x, shape, f"torch.diff({x.name}, dim={_w(b, d, n)})", "diff", bits=add_bits(x.bits, x.bits))
    if kind == "trace":
        if n != 2 or x.dtype == "bool":
            return False
        bits = exact_bits(x.dtype if x.dtype != "bool" else "int64", sum_bits(x.bits, min(s)))
        return _out(b, x, (), f"torch.trace({x.name})", "trace", bits=bits)
    if n > 2:
        return False
    if n == 1:
        k = s[0]
        return _out(b, x, (k, k), f"torch.diag({x.name})", "diag")
    return _out(b, x, (max(0, min(s)),), f"torch.diag({x.name})", "diag")


def _piece(b, x) -> bool:
    """One piece of chunk, split or unbind (a view)."""
    n, s = x.ndim, x.shape
    d = b.rng.randrange(n)
    kind = b.rng.choice(["chunk", "split", "unbind"])
    if kind == "unbind":
        if s[d] == 0:
            return False
        i = b.rng.randrange(s[d])
        shape = s[:d] + s[d + 1:]
        return _out(b, x, shape, f"torch.unbind({x.name}, {_w(b, d, n)})[{i}]", "unbind", view=True)
    if kind == "chunk":
        chunks = b.rng.randint(1, 3)
        size = -(-s[d] // chunks) if s[d] else 0
        sizes = [min(size, s[d] - k) for k in range(0, s[d], size)] if size else [0]
    else:
        size = b.rng.randint(1, 3)
        sizes = [min(size, s[d] - k) for k in range(0, s[d], size)] or [0]
    i = b.rng.randrange(len(sizes))
    shape = tuple(sizes[i] if j == d else v for j, v in enumerate(s))
    line = f"torch.chunk({x.name}, {chunks}, {_w(b, d, n)})[{i}]" if kind == "chunk" else \
        f"{x.name}.split({size}, dim={_w(b, d, n)})[{i}]"
    return _out(b, x, shape, line, kind, view=True)


# --- indexed reads and writes ---------------------------------------------------------------


def _index(b, shape, bound, dim=None, distinct_size=None):
    """An index argument: values in [0, bound), distinct along `dim` when asked."""
    if dim is None:
        return b.index_input(shape, bound)
    from .model import Var
    var = Var(b.name("j"), tuple(shape), "int64", leaf=True, bits=(8, 0))
    return b.add_input(var, f"unique_index(rng, {tuple(shape)}, {distinct_size}, {dim})")


def indexed(b) -> bool:
    x = b.pick(lambda v: v.static and v.ndim >= 1 and v.dtype != "bool")
    if x is None:
        return False
    n, s = x.ndim, x.shape
    d = b.rng.randrange(n)
    kind = b.rng.choice(["index_select", "index_add", "scatter", "scatter_add", "masked_fill", "masked_scatter",
                         "take_along_dim", "index_copy"])
    if kind == "index_select":
        if s[d] == 0:
            return False
        index = _index(b, (b.rng.randint(0, 4),), s[d])
        shape = tuple(index.shape[0] if i == d else v for i, v in enumerate(s))
        line = f"torch.index_select({x.name}, {_w(b, d, n)}, {index.name})" if b.chance(0.5) else \
            f"{x.name}.index_select({d}, {index.name})"
        return _out(b, x, shape, line, kind)
    if kind in ("index_add", "index_copy"):
        if s[d] == 0:
            return False
        count = b.rng.randint(0, s[d])
        index = _index(b, (count,), s[d]) if kind == "index_add" else _index(b, (count,), s[d], 0, s[d])
        source = _source(b, x, tuple(count if i == d else v for i, v in enumerate(s)))
        alpha = ", alpha=2" if kind == "index_add" and b.chance(0.3) else ""
        line = f"torch.{kind}({x.name}, {_w(b, d, n)}, {index.name}, {source.name}{alpha})" if b.chance(0.6) else \
            f"{x.name}.{kind}({d}, {index.name}, {source.name}{alpha})"
        if kind == "index_add":
            bits = add_bits(x.bits, sum_bits(mul_bits(source.bits, (2, 0)), count))
        else:
            bits = add_bits(x.bits, source.bits)
        return _out(b, x, s, line, kind, bits=exact_bits(x.dtype, bits), grad=x.requires_grad or source.requires_grad)
    if kind in ("scatter", "scatter_add"):
        if 0 in s:
            return False
        shape = tuple(b.rng.randint(1, v) for v in s)
        index = _index(b, shape, s[d], d, s[d]) if kind == "scatter" else _index(b, shape, s[d])
        if kind == "scatter" and b.chance(0.3):
            value = b.rng.choice([0.5, -1.5]) if x.is_float else 2
            line = f"torch.scatter({x.name}, {_w(b, d, n)}, {index.name}, {value})"
            return _out(b, x, s, line, "scatter_value", bits=add_bits(x.bits, (1, 1)))
        source = _source(b, x, shape)
        line = f"torch.{kind}({x.name}, {_w(b, d, n)}, {index.name}, {source.name})" if b.chance(0.6) else \
            f"{x.name}.{kind}({d}, {index.name}, {source.name})"
        bits = add_bits(x.bits, source.bits) if kind == "scatter" else add_bits(x.bits, sum_bits(source.bits, s[d]))
        return _out(b, x, s, line, kind, bits=exact_bits(x.dtype, bits), grad=x.requires_grad or source.requires_grad)
    if kind in ("masked_fill", "masked_scatter"):
        mask = b.pick(lambda v: v.dtype == "bool" and v.static and v.ndim <= n and
                      all(m in (1, t) for m, t in zip(reversed(v.shape), reversed(s))))
        mask = mask or b.bool_input(tuple(1 if b.chance(0.3) else v for v in s))
        if kind == "masked_fill":
            value = b.rng.choice([0.0, -1.5, 2.0]) if x.is_float else 3
            line = f"{x.name}.masked_fill({mask.name}, {value})" if b.chance(0.6) else \
                f"torch.masked_fill({x.name}, {mask.name}, {value})"
            return _out(b, x, s, line, kind, bits=add_bits(x.bits, (2, 1)))
        source = _source(b, x, s)
        line = f"{x.name}.masked_scatter({mask.name}, {source.name})"
        return _out(b, x, s, line, kind, bits=add_bits(x.bits, source.bits),
                    grad=x.requires_grad or source.requires_grad)
    if s[d] == 0:
        return False
    shape = tuple(b.rng.randint(0, 3) if i == d else v for i, v in enumerate(s))
    index = _index(b, shape, s[d])
    return _out(b, x, shape, f"torch.take_along_dim({x.name}, {index.name}, dim={_w(b, d, n)})", kind)


def _source(b, x, shape):
    """A source of values for x's writes: a variable of that shape and dtype, or a new argument."""
    found = b.pick(lambda v: v.static and v.shape == shape and v.dtype == x.dtype and v is not x)
    if found is not None:
        return found
    if x.is_float:
        return b.float_input(shape, dtype=x.dtype, layout="plain")
    return b.int_input(shape)


# --- contractions -----------------------------------------------------------------------------

EINSUM = [  # (equation, operand ranks)
    ("ij,jk->ik", (2, 2)), ("bij,bjk->bik", (3, 3)), ("ij->ji", (2,)), ("ii->i", (2,)), ("ij,ij->i", (2, 2)),
    ("i,j->ij", (1, 1)), ("...ij->...i", (3,)), ("bij,jk->bik", (3, 2)), ("ij,kj->ik", (2, 2)), ("i,i->", (1, 1)),
]


def contraction(b) -> bool:
    x = b.pick(lambda v: v.static and v.is_float and 1 <= v.ndim <= 3)
    if x is None:
        return False
    kind = b.rng.choice(["einsum", "einsum", "tensordot", "bmm", "baddbmm", "addmm", "outer", "kron", "dot_mv"])
    if kind == "einsum":
        return _einsum(b, x)
    s = x.shape
    new = lambda shape: b.pick(lambda v: v.static and v.shape == shape and v.dtype == x.dtype and v is not x) \
        or b.float_input(shape, dtype=x.dtype, layout="plain" if b.chance(0.7) else None)  # noqa: E731
    if kind == "tensordot":
        k = b.rng.randint(1, x.ndim)
        other = new(s[x.ndim - k:] + (b.rng.randint(1, 3),))
        bits = sum_bits(mul_bits(x.bits, other.bits), math.prod(s[x.ndim - k:]))
        dims = k if b.chance(0.6) else (list(range(x.ndim - k, x.ndim)), list(range(k)))
        return _pair(b, x, other, s[:x.ndim - k] + other.shape[k:], f"torch.tensordot({x.name}, {other.name}, "
                     f"dims={dims})", kind, bits)
    if kind in ("bmm", "baddbmm"):
        if x.ndim != 3:
            return False
        other = new((s[0], s[2], b.rng.randint(1, 3)))
        shape = (s[0], s[1], other.shape[2])
        bits = sum_bits(mul_bits(x.bits, other.bits), s[2])
        if kind == "bmm":
            return _pair(b, x, other, shape, f"torch.bmm({x.name}, {other.name})", kind, bits)
        added = new(shape)
        line = f"torch.baddbmm({added.name}, {x.name}, {other.name}, beta=0.5, alpha=2)"
        return _pair(b, x, other, shape, line, kind, None, added)
    if kind == "addmm":
        if x.ndim != 2:
            return False
        other = new((s[1], b.rng.randint(1, 3)))
        shape = (s[0], other.shape[1])
        added = new((shape[1],) if b.chance(0.5) else shape)
        bits = add_bits(added.bits, sum_bits(mul_bits(x.bits, other.bits), s[1]))
        return _pair(b, x, other, shape, f"torch.addmm({added.name}, {x.name}, {other.name})", kind, bits, added)
    if kind == "outer":
        if x.ndim != 1:
            return False
        other = new((b.rng.randint(1, 4),))
        return _pair(b, x, other, s + other.shape, f"torch.outer({x.name}, {other.name})", kind,
                     mul_bits(x.bits, other.bits))
    if kind == "kron":
        if x.ndim > 2:
            return False
        other = new(tuple(b.rng.randint(1, 2) for _ in range(x.ndim)))
        return _pair(b, x, other, tuple(p * q for p, q in zip(s, other.shape)), f"torch.kron({x.name}, {other.name})",
                     kind, mul_bits(x.bits, other.bits))
    if x.ndim == 1:
        other = new(s)
        return _pair(b, x, other, (), f"torch.dot({x.name}, {other.name})", "dot",
                     sum_bits(mul_bits(x.bits, other.bits), s[0]))
    if x.ndim == 2:
        other = new((s[1],))
        return _pair(b, x, other, (s[0],), f"torch.mv({x.name}, {other.name})", "mv",
                     sum_bits(mul_bits(x.bits, other.bits), s[1]))
    return False


def _pair(b, x, other, shape, line: str, tag: str, bits, added=None) -> bool:
    grad = x.requires_grad or other.requires_grad or (added is not None and added.requires_grad)
    out = b.result(shape, x.dtype, grad, exact_bits(x.dtype, bits))
    b.emit(f"{out.name} = {line}", tag, out)
    return True


def _einsum(b, x) -> bool:
    options = [(eq, ranks) for eq, ranks in EINSUM if ranks[0] == x.ndim]
    if not options:
        return False
    equation, ranks = b.rng.choice(options)
    inputs, output = equation.split("->")
    terms = inputs.split(",")
    sizes = {}
    for letter, size in zip(terms[0].replace("...", "."), x.shape):
        sizes[letter] = size
    if terms[0] == "ii" and x.shape[0] != x.shape[1]:
        return False
    operands = [x]
    if len(terms) == 2:
        shape = tuple(sizes.setdefault(letter, b.rng.randint(1, 3)) for letter in terms[1])
        other = b.pick(lambda v: v.static and v.shape == shape and v.dtype == x.dtype and v is not x)
        operands.append(other or b.float_input(shape, dtype=x.dtype))
    out_shape = tuple(sizes[letter] for letter in output.replace("...", "."))
    contracted = [letter for letter in sizes if letter not in output and letter != "."]
    count = math.prod(sizes[letter] for letter in contracted)
    bits = operands[0].bits if len(operands) == 1 else mul_bits(operands[0].bits, operands[1].bits)
    bits = sum_bits(bits, count) if contracted else bits
    names = ", ".join(v.name for v in operands)
    grad = any(v.requires_grad for v in operands)
    out = b.result(out_shape, x.dtype, grad, exact_bits(x.dtype, bits))
    b.emit(f"{out.name} = torch.einsum({equation!r}, {names})", "einsum", out)
    if terms[0] in ("ij", "ii") and len(terms) == 1:
        b.note_alias(out, x)  # (a transpose or a diagonal: PyTorch returns a view)
        out.base = x.name
    return True
