"""Random programs as Python source text written against a module named `torch`.

A program is two functions: `inputs(seed)` makes the argument tensors from a NumPy
generator (so a new seed gives new values of the same shapes and dtypes) and returns them
with the leaves whose `.grad` is compared; `program(*args)` runs a random sequence of ops
from `catalog.py`, then a loss and its backward, and returns a list of tensors. The same
text runs with `torch` bound to tracegrad or to PyTorch. `Builder` holds the state while a
program is generated; everything is drawn from one `random.Random(seed)`, so a seed gives
the same text on every run.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import re

from .model import FLOATS, Var

PRELUDE = '''\
def grid(rng, shape):
    """Multiples of 1/8 in [-2, 2]: their sums and small products are exact in float32."""
    return np.asarray(rng.integers(-16, 17, shape) / 8)


def spread(t):
    """t plus a ramp as large as t's finite values: no row is near constant, so layer_norm
    and std are well conditioned (a ramp of 1/16 on values near 1000 left one rounding of
    the mean as a 3e-12 error in float64)."""
    if t.numel() == 0:
        return t
    size = t.detach().abs()
    scale = 1 + torch.where(size < float("inf"), size, 0.0).max()
    return t + torch.arange(t.numel(), dtype=t.dtype).reshape(t.shape) * (scale / 16)


def untie(t, shift):
    """t plus distinct multiples of 2**-shift in a scrambled order, finer than the spacing
    of t's values (multiples of 2**(1 - shift) / numel): no two values tie, none passes
    another (sort, topk and max_pool pick one element and their gradients go to it)."""
    n = t.numel()
    step = next((p for p in (5, 7, 3, 11, 13) if n % p), 1)
    ramp = (torch.arange(n) * step % max(n, 1)).to(t.dtype) * 2.0 ** -shift
    return t + ramp.reshape(t.shape)


def unique_index(rng, shape, size, dim):
    """Indices in [0, size) of `shape`, distinct along `dim` (scatter writes each place once)."""
    keys = rng.random(shape[:dim] + (size,) + shape[dim + 1:])
    return torch.tensor(np.argsort(keys, axis=dim).take(range(shape[dim]), axis=dim))



def lstm(x, weights, layers, bidirectional, state=None):
    """nn.LSTM over x (L, N, I) with `weights` (arguments: their gradients are compared) in
    place of its parameters; the output plus the last layer's h_n and c_n (every result
    reaches the loss)."""
    module = torch.nn.LSTM(x.shape[-1], weights[1].shape[1], layers, bidirectional=bidirectional, dtype=x.dtype)
    for (name, _), weight in zip(list(module.named_parameters()), weights):
        delattr(module, name)
        setattr(module, name, weight)
    out, (h, c) = module(x, state)
    last = 2 if bidirectional else 1
    return out + torch.cat(list(h[-last:]), -1) * 0.5 + torch.cat(list(c[-last:]), -1) * 0.25

def labels(rng, n, classes, ignored):
    """Class indices in [0, classes); every third from the second is ignore_index when asked."""
    out = rng.integers(0, classes, n)
    if ignored:
        out[1::3] = -100
    return out
'''

FUNCTIONS = {
    "Square": '''\
class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad
''',
    "MulAdd": '''\
class MulAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, y, alpha):
        ctx.save_for_backward(x, y)
        return x * y + alpha

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        return grad * y, grad * x, None
''',
}

TORCH_DTYPE = {"float32": "torch.float32", "float64": "torch.float64", "int64": "torch.int64", "bool": "torch.bool"}


class Skip(Exception):
    """The op being generated would use a disabled feature: it is dropped."""


@dataclasses.dataclass(frozen=True)
class Program:
    """A generated program: its source (without imports), the seed it came from and the
    features and ops it uses (in order), to bucket failures by."""

    seed: int
    source: str
    features: frozenset[str]
    ops: tuple[str, ...]


class Builder:
    """The state of one program being generated."""

    def __init__(self, seed: int, disabled: frozenset[str]):
        self.rng = random.Random(seed)
        self.disabled = disabled
        self.input_lines: list[str] = []
        self.args: list[Var] = []
        self.leaves: list[str] = []
        self.pool: list[Var] = []
        self.body: list[str] = []
        self.tags: list[str] = []
        self.functions: set[str] = set()
        self.fresh_leaves: list[str] = []  # leaves made inside the program: their .grad is returned
        self.used: set[str] = set()  # variables some statement read
        self.written: set[str] = set()  # variables written in place
        self.aliased_pairs: list = []  # (argument, another argument sharing its memory)
        self.contiguous_aliases: set[str] = set()  # results of contiguous(): maybe the tensor itself
        self.detached_aliases: set[str] = set()  # results of detach(): sharing memory, no view for autograd
        # Results tracegrad makes as views though PyTorch does not (logsumexp, max(dim), a
        # product with a 1-D operand, ...): written in place, they are `inplace_on_internal_view`.
        self.internal_views: set[str] = set()
        self.aliases: dict[str, set[str]] = {}  # name -> names sharing its memory
        self._names = itertools.count()
        self.universe = self._universe()
        self.main_dtype = self.rng.choices(FLOATS, [0.8, 0.2])[0]

    # --- features and names -----------------------------------------------------------

    def allows(self, feature: str) -> bool:
        return feature not in self.disabled

    def needs(self, feature: str, condition: bool = True) -> bool:
        """False when `condition` makes the statement use a disabled `feature`; else True,
        and the feature is noted when used."""
        if not condition:
            return True
        if feature in self.disabled:
            return False
        self.tags.append(feature)
        return True

    def name(self, prefix: str = "t") -> str:
        return f"{prefix}{next(self._names)}"

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    # --- shapes -----------------------------------------------------------------------

    def _universe(self) -> tuple[int, ...]:
        """The shape the inputs' shapes are drawn from (so that they broadcast together)."""
        sizes = [1, 2, 3, 4, 5]
        shape = [self.rng.choice(sizes) for _ in range(self.rng.choice([1, 2, 2, 3, 3, 4]))]
        if self.chance(0.2):
            shape[self.rng.randrange(len(shape))] = 0
        return tuple(shape)

    def sub_shape(self) -> tuple[int, ...]:
        """A shape that broadcasts against the universe: a suffix with some dims made 1."""
        n = len(self.universe)
        k = self.rng.randint(0, n) if self.chance(0.15) else n - self.rng.randint(0, 1)
        shape = self.universe[len(self.universe) - k:]
        return tuple(1 if self.chance(0.2) else s for s in shape)

    # --- inputs -----------------------------------------------------------------------

    def add_input(self, var: Var, make: str, leaf: bool = True) -> Var:
        """An argument `var` made by the expression `make` in `inputs()`."""
        self.input_lines.append(f"    {var.name} = {make}")
        self.args.append(var)
        self.pool.append(var)
        if leaf and var.is_float:
            self.leaves.append(var.name)
        return var

    def float_input(self, shape: tuple[int, ...] | None = None, dtype: str | None = None,
                    requires_grad: bool | None = None, layout: str | None = None) -> Var:
        shape = self.sub_shape() if shape is None else tuple(shape)
        dtype = dtype or self.float_dtype()
        requires_grad = self.chance(0.65) if requires_grad is None else requires_grad
        name = self.name("a")
        layout = layout or self._layout(shape)
        torch_dtype = TORCH_DTYPE[dtype]
        if layout == "transposed":
            stored = shape[:-2] + (shape[-1], shape[-2])
            make = f"torch.tensor(grid(rng, {stored}), dtype={torch_dtype}).transpose(-1, -2)"
        elif layout == "strided":
            stored = (shape[0] * 2,) + shape[1:]
            make = f"torch.tensor(grid(rng, {stored}), dtype={torch_dtype})[::2]"
        elif layout == "expanded":
            stored = tuple(1 for _ in shape)
            make = f"torch.tensor(grid(rng, {stored}), dtype={torch_dtype}).expand{shape}"
        else:
            make = f"torch.tensor(grid(rng, {shape}), dtype={torch_dtype})"
        if requires_grad:
            make = (make[:-1] + ", requires_grad=True)") if layout == "plain" else make + ".requires_grad_()"
        var = Var(name, shape, dtype, requires_grad, leaf=True, contiguous=layout == "plain")
        if layout != "plain":
            self.tags.append(f"input_{layout}")
            var.base = "<input>" if layout != "expanded" else "<expanded>"
        return self.add_input(var, make)

    def _layout(self, shape: tuple[int, ...]) -> str:
        options = ["plain"] * 6
        if len(shape) >= 2:
            options.append("transposed")
        if len(shape) >= 1:
            options.append("strided")
            options.append("expanded")
        return self.rng.choice(options)

    def float_dtype(self) -> str:
        return self.main_dtype if not self.chance(0.1) else self.rng.choice(FLOATS)

    def int_input(self, shape: tuple[int, ...] | None = None, low: int = -4, high: int = 4) -> Var:
        shape = self.sub_shape() if shape is None else tuple(shape)
        bits = (max(abs(low), abs(high)).bit_length(), 0)
        return self.add_input(Var(self.name("i"), shape, "int64", leaf=True, bits=bits),
                              f"torch.tensor(rng.integers({low}, {high + 1}, {shape}))")

    def bool_input(self, shape: tuple[int, ...] | None = None) -> Var:
        shape = self.sub_shape() if shape is None else tuple(shape)
        return self.add_input(Var(self.name("m"), shape, "bool", leaf=True, bits=(1, 0)),
                              f"torch.tensor(rng.random({shape}) < 0.5)")

    def label_input(self, n: int | None, classes: int) -> Var:
        """Class indices for cross_entropy: (n,) or () when n is None; with the
        `negative_index` feature sometimes in [-classes, -1] (PyTorch raises)."""
        ignored = n is not None and n >= 2 and self.chance(0.3)
        shape = (n,) if n is not None else ()
        low = -classes if self.allows("negative_index") and self.chance(0.15) else 0
        if low:
            self.tags.append("negative_index")
            make = f"torch.tensor(rng.integers({low}, 0, {shape}))"
        elif n is not None:
            make = f"torch.tensor(labels(rng, {n}, {classes}, {ignored}))"
        else:
            make = f"torch.tensor(rng.integers(0, {classes}))"
        return self.add_input(Var(self.name("y"), shape, "int64", leaf=True, bits=(8, 0)), make)

    def index_input(self, shape: tuple[int, ...], bound: int, low: int = 0) -> Var:
        """Indices in [low, bound)."""
        return self.add_input(Var(self.name("j"), shape, "int64", leaf=True, bits=(8, 0)),
                              f"torch.tensor(rng.integers({low}, {bound}, {shape}))")

    # --- the program body -------------------------------------------------------------

    def pick(self, predicate=lambda v: True) -> Var | None:
        candidates = [v for v in self.pool if predicate(v)]
        if not candidates:
            return None
        # Recent results more often: programs then chain ops instead of fanning out.
        weights = [1.0 + i for i in range(len(candidates))]
        return self.rng.choices(candidates, weights)[0]

    def emit(self, line: str, tag: str, *results: Var, checked: bool = True) -> None:
        """Append a statement; `Skip` if it would use a disabled feature the op could not
        see: a gradient flowing from an empty tensor into a non-empty one is a reduction
        over a size-0 axis in backward (`size0_reduce`)."""
        names = set(re.findall(r"\b[a-z]\d+\b", line))
        made = {v.name for v in results}
        operands = [v for v in self.pool if v.name in names and v.name not in made]
        empty_grad = any(v.numel == 0 and v.requires_grad for v in operands)
        fills = not results or any(v.numel != 0 for v in results)  # (an in-place op fills its target)
        if checked and not self.needs("size0_reduce", empty_grad and fills):
            raise Skip
        self.used.update(names)
        self.body.append(f"    {line}")
        self.tags.append(tag)
        self.pool.extend(results)

    def result(self, shape, dtype: str, requires_grad: bool, bits, base: str | None = None,
               contiguous: bool = True) -> Var:
        return Var(self.name(), tuple(shape), dtype, requires_grad and dtype in FLOATS, base=base,
                   contiguous=contiguous, bits=bits)

    def note_alias(self, view: Var, of: Var) -> None:
        """`view` shares memory with `of` (a view, a detached alias)."""
        group = self.aliases.setdefault(of.name, {of.name}) | self.aliases.get(view.name, {view.name})
        for name in group:
            self.aliases[name] = group

    def aliases_of(self, var: Var) -> set[str]:
        return self.aliases.get(var.name, {var.name}) - {var.name}

    # --- assembling -------------------------------------------------------------------

    def source(self, returned: list[str]) -> str:
        classes = "\n\n".join(FUNCTIONS[name] for name in sorted(self.functions))
        args = ", ".join(v.name for v in self.args)
        parts = [PRELUDE]
        if classes:
            parts.append(classes)
        parts.append("def inputs(seed):\n    rng = np.random.default_rng(seed)\n" + "\n".join(self.input_lines)
                     + f"\n    return [{args}], [{', '.join(self.leaves)}]\n")
        body = "\n".join(self.body) if self.body else "    pass"
        parts.append(f"def program({args}):\n{body}\n    return [{', '.join(returned)}]\n")
        return "\n\n".join(parts)


def generate(seed: int, disabled: frozenset[str]) -> Program:
    """The program of `seed` with the `disabled` features left out."""
    from . import catalog, finish

    builder = Builder(seed, disabled)
    catalog.make_inputs(builder)
    n_ops = builder.rng.randint(3, 12)
    emitted = attempts = 0
    while emitted < n_ops and attempts < n_ops * 20:
        attempts += 1
        if catalog.emit_random_op(builder):
            emitted += 1
    returned = finish.loss_and_outputs(builder)
    features = set(builder.tags)
    if any(v.dtype == "float32" for v in builder.pool) and any(v.dtype == "float64" for v in builder.pool):
        features.add("mixed_precision")  # float64 results may carry float32 rounding: compared loosely
    features = frozenset(features)
    return Program(seed, builder.source(returned), features, tuple(builder.tags))
