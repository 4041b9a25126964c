"""Hypothesis-generated random graphs: compiled vs eager, forward and gradients (float64).

A graph is a recipe of 1 to 30 steps. Each step reads a value of the pool (usually the
newest) and appends its result: a unary op with a safe domain, a binary op against an
earlier value or a new (smaller, broadcast) input, a reduction over random dims, or a
movement op (reshape, transpose, permute, slice, unsqueeze/squeeze, expand). Earlier values
are read again later, so the graphs have values with several consumers, which is where
fusion has to choose between recomputing and materializing.
"""

import numpy as np
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

import tracegrad as tg

UNARY = {
    "neg": lambda x: -x,
    "abs": lambda x: x.abs(),
    "relu": lambda x: x.relu(),
    "tanh": lambda x: x.tanh(),
    "sigmoid": lambda x: x.sigmoid(),
    "sin": lambda x: x.sin(),
    "cos": lambda x: x.cos(),
    "erf": lambda x: x.erf(),
    "exp_tanh": lambda x: x.tanh().exp(),
    "log1p_sq": lambda x: (x * x + 1).log(),
    "sqrt1p_sq": lambda x: (x * x + 1).sqrt(),
    "rsqrt1p_sq": lambda x: (x * x + 1).rsqrt(),
    "square": lambda x: x ** 2,
    "scale_shift": lambda x: x * 0.5 + 0.25,
    "clamp": lambda x: x.clamp(-0.7, 0.8),
    "gelu": lambda x: tg.nn.functional.gelu(x),
    "silu": lambda x: tg.nn.functional.silu(x),
}

BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div_safe": lambda a, b: a / (b * b + 1),
    "maximum": tg.maximum,
    "minimum": tg.minimum,
    "where_gt": lambda a, b: tg.where(a > b, a, b * 0.5),
}

REDUCE = {
    "sum": lambda x, dims, keep: x.sum(dims, keepdim=keep),
    "mean": lambda x, dims, keep: x.mean(dims, keepdim=keep),
    "amax": lambda x, dims, keep: x.amax(dims, keepdim=keep),
    "amin": lambda x, dims, keep: x.amin(dims, keepdim=keep),
    "logsumexp": lambda x, dims, keep: x.logsumexp(dims, keepdim=keep),
    "var": lambda x, dims, keep: x.var(dims, keepdim=keep),
}

MAX_DIM = 4
MAX_NDIM = 4


class Recipe:
    """Steps over a pool of values. Value 0 is the first input; inputs are appended as
    binary steps need them. Every step is ('kind', params, source index, ...)."""

    def __init__(self, first_shape):
        self.input_shapes = [first_shape]
        self.steps = []

    def run(self, inputs):
        pool = [inputs[0]]
        for step in self.steps:
            kind, name, src = step[0], step[1], pool[step[2]]
            if kind == "unary":
                out = UNARY[name](src)
            elif kind == "binary":
                other = inputs[step[3]] if step[4] == "input" else pool[step[3]]
                out = BINARY[name](src, other) if step[5] else BINARY[name](other, src)
            elif kind == "reduce":
                out = REDUCE[name](src, step[3], step[4])
            elif kind == "softmax":
                out = src.softmax(step[3]) if name == "softmax" else src.log_softmax(step[3])
            else:
                out = _MOVE[name](src, *step[3:])
            pool.append(out)
        return pool[-1]


def _slice(x, dim, start, stop, stride):
    key = [slice(None)] * x.ndim
    key[dim] = slice(start, stop, stride)
    return x[tuple(key)]


_MOVE = {
    "reshape": lambda x, shape: x.reshape(shape),
    "transpose": lambda x, a, b: x.transpose(a, b),
    "permute": lambda x, perm: x.permute(*perm),
    "slice": _slice,
    "unsqueeze": lambda x, dim: x.unsqueeze(dim),
    "squeeze": lambda x, dim: x.squeeze(dim),
    "expand": lambda x, shape: x.expand(*shape),
}


def _reshape_target(draw, shape):
    n = int(np.prod(shape, dtype=np.int64))
    factors = [d for d in range(1, n + 1) if n % d == 0 and d <= MAX_DIM * MAX_DIM]
    first = draw(st.sampled_from(factors))
    rest = n // first
    if rest == 1:
        return (first,) if draw(st.booleans()) else (first, 1)
    return (first, rest)


def _broadcast_operand_shape(draw, shape):
    """A shape that broadcasts against `shape` without changing it: a suffix, some dims 1."""
    keep = draw(st.integers(0, len(shape)))
    suffix = shape[len(shape) - keep:]
    return tuple(1 if draw(st.booleans()) else d for d in suffix)


def _broadcasts_into(small, big):
    if len(small) > len(big):
        return False
    return all(s in (1, b) for s, b in zip(small[::-1], big[::-1]))


@st.composite
def recipes(draw):
    ndim = draw(st.integers(1, 3))
    first = tuple(draw(st.lists(st.integers(1, MAX_DIM), min_size=ndim, max_size=ndim)))
    recipe = Recipe(first)
    shapes = [first]
    for _ in range(draw(st.integers(1, 30))):
        # mostly continue from the newest value; sometimes branch from an older one
        src = len(shapes) - 1 if draw(st.integers(0, 3)) else draw(st.integers(0, len(shapes) - 1))
        shape = shapes[src]
        kind = draw(st.sampled_from(["unary", "unary", "binary", "binary", "reduce", "softmax", "move", "move"]))
        if kind == "unary":
            step, out = ("unary", draw(st.sampled_from(sorted(UNARY))), src), shape
        elif kind == "binary":
            name = draw(st.sampled_from(sorted(BINARY)))
            earlier = [i for i, s in enumerate(shapes) if i != src and _broadcasts_into(s, shape)]
            if earlier and draw(st.booleans()):
                step = ("binary", name, src, draw(st.sampled_from(earlier)), "pool", draw(st.booleans()))
            else:
                recipe.input_shapes.append(_broadcast_operand_shape(draw, shape))
                step = ("binary", name, src, len(recipe.input_shapes) - 1, "input", draw(st.booleans()))
            out = shape
        elif kind in ("reduce", "softmax") and len(shape) == 0:
            step, out = ("unary", "tanh", src), shape
        elif kind == "reduce":
            dims = tuple(sorted(draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
            keep = draw(st.booleans())
            name = draw(st.sampled_from(sorted(REDUCE)))
            if name == "var" and all(shape[d] == 1 for d in dims):
                name = "mean"  # var of one element is NaN (see _assume_finite)
            step = ("reduce", name, src, dims, keep)
            out = tuple(1 if d in dims else s for d, s in enumerate(shape)) if keep else tuple(
                s for d, s in enumerate(shape) if d not in dims)
        elif kind == "softmax":
            step = ("softmax", draw(st.sampled_from(["softmax", "log_softmax"])), src,
                    draw(st.integers(0, len(shape) - 1)))
            out = shape
        else:
            step, out = _draw_move(draw, src, shape)
        recipe.steps.append(step)
        shapes.append(out)
    return recipe


def _draw_move(draw, src, shape):
    options = ["reshape"]
    if len(shape) >= 2:
        options += ["transpose", "permute"]
    if any(s > 1 for s in shape):
        options.append("slice")
    if len(shape) < MAX_NDIM:
        options.append("unsqueeze")
    if 1 in shape:
        options += ["squeeze", "expand"]
    name = draw(st.sampled_from(options))
    if name == "reshape":
        target = _reshape_target(draw, shape)
        return ("move", "reshape", src, target), target
    if name == "transpose":
        a, b = draw(st.permutations(range(len(shape))))[:2]
        out = list(shape)
        out[a], out[b] = out[b], out[a]
        return ("move", "transpose", src, a, b), tuple(out)
    if name == "permute":
        perm = tuple(draw(st.permutations(range(len(shape)))))
        return ("move", "permute", src, perm), tuple(shape[p] for p in perm)
    if name == "slice":
        dim = draw(st.sampled_from([d for d, s in enumerate(shape) if s > 1]))
        size = shape[dim]
        start = draw(st.integers(0, size - 1))
        stop = draw(st.integers(start + 1, size))
        stride = draw(st.integers(1, 2))
        out = list(shape)
        out[dim] = len(range(start, stop, stride))
        return ("move", "slice", src, dim, start, stop, stride), tuple(out)
    if name == "unsqueeze":
        dim = draw(st.integers(0, len(shape)))
        return ("move", "unsqueeze", src, dim), shape[:dim] + (1,) + shape[dim:]
    ones = [d for d, s in enumerate(shape) if s == 1]
    if name == "squeeze":
        dim = draw(st.sampled_from(ones))
        return ("move", "squeeze", src, dim), shape[:dim] + shape[dim + 1:]
    out = tuple(draw(st.integers(2, 3)) if s == 1 else s for s in shape)
    return ("move", "expand", src, out), out


def _inputs(recipe, seed):
    rng = np.random.default_rng(seed)
    return [tg.from_numpy(rng.uniform(-2, 2, s)).requires_grad_() for s in recipe.input_shapes]


def _assume_finite(tensors):
    # NaN/inf results are covered by dedicated tests (test_equivalence.py); here they
    # would only make tolerance comparisons meaningless.
    assume(all(np.isfinite(t.detach().numpy()).all() for t in tensors))


def _assert_close(actual, expected):
    actual = actual.detach().numpy()
    expected = expected.detach().numpy()
    assert actual.shape == expected.shape
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=1e-10, atol=1e-10 * scale)


SETTINGS = settings(max_examples=40, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


@SETTINGS
@given(recipe=recipes(), seed=st.integers(0, 2**16))
def test_random_graph_forward_matches_eager(recipe, seed):
    note(repr(recipe.input_shapes) + "\n" + "\n".join(map(repr, recipe.steps)))
    inputs = _inputs(recipe, seed)
    expected = recipe.run(inputs)
    _assume_finite([expected])
    actual = tg.compile(lambda *xs: recipe.run(xs))(*inputs)
    _assert_close(actual, expected)


@SETTINGS
@given(recipe=recipes(), seed=st.integers(0, 2**16))
def test_random_graph_gradients_match_eager(recipe, seed):
    note(repr(recipe.input_shapes) + "\n" + "\n".join(map(repr, recipe.steps)))
    inputs = _inputs(recipe, seed)
    out_shape = recipe.run(inputs).shape
    weight = tg.from_numpy(np.random.default_rng(seed + 1).uniform(0.5, 1.5, out_shape))

    def grads(w, *xs):
        loss = (recipe.run(xs) * w).sum()
        return tg.autograd.grad(loss, xs, allow_unused=True, materialize_grads=True)

    expected = grads(weight, *inputs)
    _assume_finite(expected)
    compiled = tg.compile(grads)
    actual = compiled(weight, *inputs)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        _assert_close(a, e)
    # A second call with other values follows the first call's trace (jit.replay).
    inputs = _inputs(recipe, seed + 1)
    expected = grads(weight, *inputs)
    _assume_finite(expected)
    for a, e in zip(compiled(weight, *inputs), expected):
        _assert_close(a, e)
