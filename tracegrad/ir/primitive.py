"""The `Primitive` record: one entry of the primitive table.

An entry holds everything about one op: its shape/dtype rule (abstract evaluation, which
raises the clear error for bad input), its NumPy implementation, its gradient rule (a VJP
written with primitive calls, so it works on NumPy tensors, recording tensors and IR
values alike), which inputs/output that rule reads, and its kind, which tells the
compiler how the op fuses. Interpreters look ops up here and never special-case a name.
"""

from __future__ import annotations

from collections.abc import Callable

from tracegrad.ir.types import TensorType

ELEMENTWISE = "elementwise"
REDUCTION = "reduction"
MOVEMENT = "movement"
MATMUL = "matmul"
OTHER = "other"

REGISTRY: dict[str, Primitive] = {}


class Primitive:
    """One op. `vjp(ctx, *output_grads)` returns one gradient (or None) per input."""

    __slots__ = ("name", "shape_rule", "impl", "vjp", "saves_inputs", "saves_output", "saves_copies", "saved_for",
                 "saves_by_needs",
                 "kind", "num_outputs", "backward_name", "lower", "index_map", "reduction",
                 "simplify", "rewrite", "constant", "aligned", "lower_indexed", "lowers",
                 "index_checks", "view_strides", "view_may_copy", "write_back", "api", "effect", "carried_dim",
                 "reads_aligned", "index_range", "read_probe", "own_layout_inputs", "element_cost", "__dict__")

    # False for a custom Function's primitive (its backward is user code, its node holds the
    # call's ctx): never cached or replayed. (A class default: read per node per backward.)
    replayable = True

    def __init__(self, name: str, *, shape_rule: Callable[..., tuple[TensorType, ...]],
                 impl: Callable, vjp: Callable | None = None,
                 saves_inputs: tuple[int, ...] = (), saves_output: bool = False, saves_copies: tuple = (),
                 saved_for: dict[int | str, tuple[int, ...]] | None = None,
                 kind: str = OTHER, api: str | None = None, num_outputs: int = 1, backward_name: str | None = None,
                 lower: Callable | None = None, index_map: Callable | None = None,
                 reduction: Reduction | None = None, simplify: Callable | None = None,
                 rewrite: Callable | None = None, constant: Callable | None = None, aligned: Callable | None = None,
                 lower_indexed: Callable | None = None, lowers: Callable | None = None,
                 index_checks: Callable | None = None, view_strides: Callable | None = None,
                 view_may_copy: bool = False, write_back: Callable | None = None, effect: bool = False,
                 carried_dim: Callable | None = None, reads_aligned: tuple[int, ...] = (),
                 index_range: Callable | None = None, read_probe: Callable | None = None,
                 own_layout_inputs: tuple[int, ...] = (), element_cost: int = 1):
        if name in REGISTRY:
            raise ValueError(f"primitive {name!r} is defined twice")
        self.name = name
        self.shape_rule = shape_rule
        self.impl = impl
        self.vjp = vjp
        self.saves_inputs = saves_inputs
        self.saves_output = saves_output
        # Which of what it saves (input indices, "out" for the output) are kept as copies
        # nobody else sees (`SavedTensor.keep_private`): an in-place update of that input or
        # of the result then neither fails the backward nor changes it, as for the composite
        # of other primitives the op also is (ops/neural.py), which saves intermediates
        # computed from them instead.
        self.saves_copies = saves_copies
        # Which inputs' gradients read each saved value (input index, or "out" for the
        # output); a value not listed is read by every gradient. A value is saved only when
        # one of its readers needs grad, as PyTorch does (`a * 3` keeps nothing of `a`, so an
        # in-place update of `a` afterwards is allowed).
        self.saved_for = saved_for
        self.saves_by_needs: dict[tuple, tuple] = {}  # needs_input_grad -> what is saved (dispatch)
        self.kind = kind
        self.num_outputs = num_outputs
        self.backward_name = backward_name or _camel(name) + "Backward"
        # Code generation (tracegrad.codegen): `lower(b, *scalars, **attrs)` builds an
        # elementwise op's scalar; `index_map(b, out_index, in_type, out_type, **attrs)`
        # maps a movement op's output index to its input index; `reduction` is a
        # reduction's spec (`Reduction`). None: the op runs through its NumPy
        # implementation inside compiled programs.
        self.lower = lower
        self.index_map = index_map
        self.reduction = reduction
        # IR passes (tracegrad.ir.passes): `simplify(inputs, attrs)` returns an existing value
        # equal to the result (or None); `rewrite(inputs, attrs, uses)` returns new nodes
        # whose last output replaces the result (or None), where `uses(value)` counts the
        # value's readers; `constant(**attrs)` is the scalar a constant holds.
        self.simplify = simplify
        self.rewrite = rewrite
        self.constant = constant
        # Fusion of row loops: `aligned(src, dst)` says, for each dim of the view's source,
        # which dim of its result passes its index through unchanged (None: the dim is
        # broadcast or size 1); None when the view moves indices around otherwise.
        self.aligned = aligned
        # Data-dependent reads (gather, scatter_add): `lower_indexed(b, read, index,
        # in_types, out_type, **attrs)` builds one element, where `read(k, index)` gives
        # input k at any index; `lowers(node)` says whether this instance lowers; and
        # `index_checks(in_types, out_type, **attrs)` lists (input, BoundsCheck) pairs: `check(array)`
        # raises the op's eager error for an index operand out of bounds, before the kernel runs.
        self.lower_indexed = lower_indexed
        self.lowers = lowers
        self.index_checks = index_checks
        # `reads_aligned`: the inputs `lower_indexed` reads at the element it makes (gather's
        # index), which a fused loop may hand over from the same iteration; `index_range(
        # in_types, **attrs)`: (low, high) such that every value the op makes lies in
        # [low, high) (argmax's positions along its axis), so an index operand it makes
        # passes a check accepting that range without being looked at.
        self.reads_aligned = reads_aligned
        self.index_range = index_range
        # `read_probe(k, offsets, **attrs)`: for an op with `lower_indexed`, given an array
        # (input k's shape) of where each element of input k lies in a buffer, the same for
        # one element of input k that each element of the result reads (a window's first),
        # in the result's shape; None when no read stands for the others. The loop-order
        # planner finds the buffers a kernel reads contiguously through it (max pooling's
        # windows of a channels-last product: codegen/loop_order.py).
        self.read_probe = read_probe
        # The inputs an op without lowering reads best in their own C order (a convolution's
        # image read through offset tables, `ops.window.WINDOW_PRODUCT`): the fusion planner
        # gives such a value a buffer of its own, written in its layout, rather than make it
        # a NumPy view of another buffer (which may be a transposed one).
        self.own_layout_inputs = own_layout_inputs
        # What its lowering costs per element, in elements of a plain load-add-store
        # (a transcendental's polynomial: 2-8): a fused kernel of few elements but much work
        # per element is worth splitting over threads too (`codegen.kernels.KernelStep`).
        self.element_cost = element_cost
        # Layout (codegen.fusion): `carried_dim(in_type, out_type, dim, **attrs)` of an op
        # of one input read at other elements than the current one (a view, im2col): the
        # dim of its result along which its input's dim `dim` advances one element per
        # step, or None. The fusion planner reads it to keep an expensive indexed result
        # from being computed in a transposed order.
        self.carried_dim = carried_dim
        # A movement op eager execution runs as a NumPy view: `view_strides(in_type,
        # in_strides, **attrs)` gives the view's strides in elements, or None where NumPy
        # copies (ops.layout tells a traced tensor's layout from it).
        self.view_strides = view_strides
        # Whether `view_strides` may say None (reshape: NumPy copies some layouts): then a
        # traced result is a view of its input only where the input's layout allows it.
        self.view_may_copy = view_may_copy
        # `write_back(new, source, **attrs)`: `source` with `new` written where the view
        # shows it (an in-place write through a traced view reaching its base), or None
        # where the view repeats elements of `source` (expand): the write is then made by
        # address (`jit.alias.base_update`).
        self.write_back = write_back
        # The user-facing function `tg.<name>` and method `Tensor.<name>` (with its in-place
        # `<name>_` for a unary op) are generated from the entry by `functional.arith` when
        # `api` names their calling convention: "float_unary" (an integer input becomes
        # float first), "unary", "binary" (broadcasting, type promotion), "float_binary"
        # (as "binary", integer operands becoming float). None: written by
        # hand in `functional/` and listed in `tensor_methods.py`.
        self.api = api
        # Whether running the op acts beyond its result (a collective: every other rank
        # takes part in each run). Its result is still a function of its inputs, so passes
        # may merge two equal nodes or drop an unused one (every rank compiles the same
        # graph); but a compiled call runs each node at most once, so a realization that
        # ran it hands its result on to the rest of the call (`jit.function`).
        self.effect = effect
        REGISTRY[name] = self

    def add_rewrite(self, rule: Callable) -> None:
        """Give the op one more `rewrite` rule, defined beside the primitives it reads (`add`
        has one per kind of sum it restructures); rules are tried in the order added."""
        first = self.rewrite
        if first is None:
            self.rewrite = rule
            return

        def either(inputs, attrs, uses):
            return first(inputs, attrs, uses) or rule(inputs, attrs, uses)
        self.rewrite = either

    def __repr__(self) -> str:
        return f"<primitive {self.name}>"

    def __reduce__(self):
        return (REGISTRY.__getitem__, (self.name,))


class Reduction:
    """What code generation knows of a reduction primitive (kind REDUCTION), and all it
    reads of one: `axes(attrs)`, the dims of its one input it reduces (its output type
    keeps them as size 1 or drops them); `identity(dtype)`, the accumulator's first value;
    `combine(b, acc, x)`, one step, built with a scalar builder `b` whose `in_types` and
    `out_type` are the node's."""

    __slots__ = ("axes", "identity", "combine")

    def __init__(self, *, identity: Callable, combine: Callable,
                 axes: Callable[[dict], tuple[int, ...]] = lambda attrs: tuple(attrs["axes"])):
        self.axes = axes
        self.identity = identity
        self.combine = combine


def constant_primitive() -> Primitive:
    """The entry that makes a constant tensor: the one with a `constant` rule, whose attrs
    are (shape, dtype, value). Constant folding (`ir.passes`) makes its nodes."""
    for prim in REGISTRY.values():
        if prim.constant is not None:
            return prim
    raise LookupError("no primitive with a `constant` rule is registered (tracegrad.ops not imported)")


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


class VJPContext:
    """What a gradient rule sees: saved input/output tensors, attributes, input types."""

    __slots__ = ("inputs", "out", "attrs", "in_types", "out_types", "needs_input_grad")

    def __init__(self, inputs, out, attrs, in_types, out_types, needs_input_grad):
        self.inputs = inputs
        self.out = out
        self.attrs = attrs
        self.in_types = in_types
        self.out_types = out_types
        self.needs_input_grad = needs_input_grad
