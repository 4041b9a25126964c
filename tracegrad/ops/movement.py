"""Movement primitives: reshape, permute, expand, slice, select, pad_slice, concat.

They change how elements are laid out, never their values, so the compiler lowers them
to index mappings that fuse into their consumers. In eager mode they return NumPy views
where NumPy can (reshape of a contiguous array, permute, expand, slice).
"""

from __future__ import annotations

import numpy as np

from tracegrad.ir.graph import Node
from tracegrad.ir import types
from tracegrad.ir.types import TensorType
from tracegrad.ops import elementwise, reduction
from tracegrad.ops.layout import reshape_strides
from tracegrad.ops.dispatch import bind
from tracegrad.ir.passes import constant_of
from tracegrad.ir.primitive import MATMUL, MOVEMENT, Primitive
from tracegrad.tensor import Tensor


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _view_of_view(value, prim, shape):
    """view(view(x)) -> view(x) for reshape and expand; a view to x's own shape -> x.
    Only rewrites to an existing value: a new node would need the pass to emit it."""
    if tuple(shape) == value.type.shape:
        return value
    node = value.node
    if node is not None and node.op is prim and tuple(shape) == node.inputs[0].type.shape:
        return node.inputs[0]
    return None


def _unit_reshape_map(source, target):
    """For a reshape that only adds or drops size-1 dims: for each source dim, the target
    dim it corresponds to (None for size-1 dims); None for any other reshape."""
    if [n for n in source if n != 1] != [n for n in target if n != 1]:
        return None
    wide = iter([d for d, n in enumerate(target) if n != 1])
    return [next(wide) if n != 1 else None for n in source]


def _reshape_carried_dim(x: TensorType, out: TensorType, dim: int) -> int | None:
    """A reshape keeps row-major order: the source's last dim advances with the result's
    last dim of more than one element."""
    if dim != x.ndim - 1 or x.shape[dim] == 1:
        return None
    return next((d for d in reversed(range(out.ndim)) if out.shape[d] > 1), None)


def _reshape_rule(x: TensorType, shape):
    if _numel(shape) != x.numel:
        raise RuntimeError(f"reshape: shape {list(shape)} is invalid for input of size {x.numel} "
                           f"(input shape {list(x.shape)})")
    return (TensorType(tuple(shape), x.dtype),)


RESHAPE = Primitive("reshape", shape_rule=_reshape_rule, kind=MOVEMENT,
                    impl=lambda x, shape: np.reshape(x, shape),
                    vjp=lambda ctx, g: (reshape(g, ctx.in_types[0].shape),), backward_name="ViewBackward",
                index_map=lambda b, index, src, dst, shape: b.reshape_index(index, src.shape, dst.shape),
                simplify=lambda inputs, attrs: _view_of_view(inputs[0], RESHAPE, attrs['shape']),
                aligned=lambda src, dst: _unit_reshape_map(src.shape, dst.shape),
                view_strides=lambda x, strides, shape: reshape_strides(x.shape, strides, tuple(shape)),
                view_may_copy=True, write_back=lambda new, source, shape: reshape(new, source.shape),
                carried_dim=lambda x, out, dim, shape: _reshape_carried_dim(x, out, dim))


def _permute_rule(x: TensorType, perm):
    if sorted(perm) != list(range(x.ndim)):
        raise RuntimeError(f"permute: {list(perm)} is not a permutation of the {x.ndim} dims of a "
                           f"tensor of shape {list(x.shape)}")
    return (TensorType(tuple(x.shape[p] for p in perm), x.dtype),)


def _permute_vjp(ctx, g):
    perm = ctx.attrs["perm"]
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return (permute(g, tuple(inverse)),)


def _inverse_permutes(value, perm) -> bool:
    node = value.node
    return node is not None and node.op is PERMUTE and [node.attrs["perm"][p] for p in perm] == list(range(len(perm)))


def _permute_simplify(inputs, attrs):
    """permute(x, identity) -> x; permute(permute(x, p), inverse of p) -> x."""
    (value,) = inputs
    perm = list(attrs["perm"])
    if perm == list(range(len(perm))):
        return value
    return value.node.inputs[0] if _inverse_permutes(value, perm) else None


def _transpose_of_matmul(inputs, attrs, uses):
    """(a @ b)^T -> b^T @ a^T when nothing else reads the product. The product is then
    made in the layout its reader wants: a linear layer's weight gradient, read by the
    optimizer, would otherwise be read transposed, one cache line per element."""
    (value,) = inputs
    node = value.node
    perm = list(attrs["perm"])
    n = len(perm)
    if node is None or node.op.kind != MATMUL or n < 2 or perm != [*range(n - 2), n - 1, n - 2]:
        return None
    if uses(value) != 1:
        return None
    new_nodes = []

    def transposed(operand):
        if _inverse_permutes(operand, perm):
            return operand.node.inputs[0]
        swap = Node(PERMUTE, (operand,), {"perm": perm}, _permute_rule(operand.type, perm), node.location)
        new_nodes.append(swap)
        return swap.output(0)

    a, b = node.inputs
    operands = (transposed(b), transposed(a))
    new_nodes.append(Node(node.op, operands, node.attrs, node.op.shape_rule(*(v.type for v in operands)),
                          node.location))
    return new_nodes


PERMUTE = Primitive("permute", shape_rule=_permute_rule, kind=MOVEMENT, vjp=_permute_vjp,
                    impl=lambda x, perm: np.transpose(x, perm),
                    simplify=_permute_simplify, rewrite=_transpose_of_matmul,
                index_map=lambda b, index, src, dst, perm: [index[perm.index(d)] for d in range(len(perm))],
                view_strides=lambda x, strides, perm: [strides[p] for p in perm],
                write_back=lambda new, source, perm: permute(new, [perm.index(d) for d in range(len(perm))]),
                carried_dim=lambda x, out, dim, perm: list(perm).index(dim))


def _expand_rule(x: TensorType, shape):
    if len(shape) != x.ndim or any(s != t and s != 1 for s, t in zip(x.shape, shape)):
        raise RuntimeError(f"expand: the expanded size {list(shape)} must match the existing size "
                           f"{list(x.shape)} at each non-singleton dimension")
    return (TensorType(tuple(shape), x.dtype),)


# A write into an expanded view (NumPy's broadcast is read-only), as PyTorch says it.
OVERLAPPING_WRITE_MESSAGE = (
    "unsupported operation: more than one element of the written-to tensor refers to a single "
    "memory location. Please clone() the tensor before performing the operation.")


def _expanded(x: np.ndarray, shape) -> np.ndarray:
    """NumPy's broadcast view of `x`, writable where `x` is: a view of it that repeats no
    element may be written, as PyTorch writes a row of an expanded tensor, into the memory
    every row shares (`layout.overlaps_itself` refuses a write into the rest)."""
    view = np.broadcast_to(x, shape)
    if x.flags.writeable and view is not x:
        view.flags.writeable = True
    return view


def _expand_write_back(new, source, shape):
    if 0 in new.shape:  # an empty view: nothing written, nothing repeated (PyTorch takes it)
        return source
    if source.shape != new.shape:
        return None  # (which of the copies was written is not in `new`: written by address)
    return new


def _expand_vjp(ctx, g):
    source = ctx.in_types[0].shape
    axes = tuple(i for i, (s, t) in enumerate(zip(source, g.shape)) if s != t)
    return (reduction.sum_(g, axes, keepdim=True) if axes else g,)


EXPAND = Primitive("expand", shape_rule=_expand_rule, kind=MOVEMENT, vjp=_expand_vjp,
                   impl=lambda x, shape: _expanded(x, shape),
                index_map=lambda b, index, src, dst, shape: [b.index_const(0) if s == 1 and t != 1 else i
                                                             for i, s, t in zip(index, src.shape, dst.shape)],
                simplify=lambda inputs, attrs: _view_of_view(inputs[0], EXPAND, attrs['shape']),
                aligned=lambda src, dst: [None if s == 1 and t != 1 else d
                                          for d, (s, t) in enumerate(zip(src.shape, dst.shape))],
                view_strides=lambda x, strides, shape: [0 if s == 1 and t != 1 else stride
                                                        for s, t, stride in zip(x.shape, shape, strides)],
                write_back=_expand_write_back,
                carried_dim=lambda x, out, dim, shape: dim if x.shape[dim] == out.shape[dim] else None)


def _slice_rule(x: TensorType, starts, stops, steps):
    shape = []
    for axis, (start, stop, step, size) in enumerate(zip(starts, stops, steps, x.shape)):
        if step <= 0 or not 0 <= start <= size or not start <= stop <= size:
            raise IndexError(f"slice: invalid slice {start}:{stop}:{step} of axis {axis} with size "
                             f"{size} (tensor shape {list(x.shape)})")
        shape.append(max(0, (stop - start + step - 1) // step))
    return (TensorType(tuple(shape), x.dtype),)


def _slices(starts, stops, steps):
    return tuple(slice(a, b, c) for a, b, c in zip(starts, stops, steps))


def _slice_write_back(new, source, starts, stops, steps):
    shown = np.zeros(source.shape, dtype=bool)
    shown[_slices(starts, stops, steps)] = True
    mask = Tensor._make(shown, TensorType(shown.shape, types.bool_))
    return elementwise.where(mask, pad_slice(new, source.shape, starts, stops, steps), source)


SLICE = Primitive("slice", shape_rule=_slice_rule, kind=MOVEMENT,
                  impl=lambda x, starts, stops, steps: x[_slices(starts, stops, steps)],
                  vjp=lambda ctx, g: (pad_slice(g, ctx.in_types[0].shape, ctx.attrs["starts"],
                                                ctx.attrs["stops"], ctx.attrs["steps"]),),
                index_map=lambda b, index, src, dst, starts, stops, steps: [
                      b.affine(i, start, step) for i, start, step in zip(index, starts, steps)],
                view_strides=lambda x, strides, starts, stops, steps: [s * k for s, k in zip(strides, steps)],
                write_back=_slice_write_back,
                carried_dim=lambda x, out, dim, starts, stops, steps: dim if steps[dim] == 1 else None)


def _select_rule(x: TensorType, axis: int, at: int):
    if not 0 <= axis < x.ndim:
        raise IndexError(f"select: dimension {axis} out of range for a tensor of shape {list(x.shape)}")
    if not 0 <= at < x.shape[axis]:
        raise IndexError(f"index {at} is out of bounds for dimension {axis} with size {x.shape[axis]}")
    return (TensorType(x.shape[:axis] + x.shape[axis + 1:], x.dtype),)


def _select_bounds(shape: tuple[int, ...], axis: int, at: int) -> tuple[tuple, tuple, tuple]:
    """The slice (starts, stops, steps) of the one entry `at` along `axis`."""
    starts = tuple(at if d == axis else 0 for d in range(len(shape)))
    stops = tuple(at + 1 if d == axis else n for d, n in enumerate(shape))
    return starts, stops, (1,) * len(shape)


def _kept_dim(x, shape: tuple[int, ...], axis: int):
    """`x` (a selected entry) with the selected axis back, of size 1."""
    return reshape(x, shape[:axis] + (1,) + shape[axis + 1:])


def _select_vjp(ctx, g):
    shape = ctx.in_types[0].shape
    axis, at = ctx.attrs["axis"], ctx.attrs["at"]
    return (pad_slice(_kept_dim(g, shape, axis), shape, *_select_bounds(shape, axis, at)),)


def _select_write_back(new, source, axis, at):
    return _slice_write_back(_kept_dim(new, source.shape, axis), source, *_select_bounds(source.shape, axis, at))


# x[..., at, ...] along `axis`, the axis dropped: `x[i]` (a time step of a sequence) as one
# view op, where a slice and a reshape were two.
SELECT = Primitive("select", shape_rule=_select_rule, kind=MOVEMENT,
                   impl=lambda x, axis, at: x[at, ...] if axis == 0 else x[(slice(None),) * axis + (at, Ellipsis)],
                   vjp=_select_vjp, backward_name="SelectBackward",
                   index_map=lambda b, index, src, dst, axis, at: [*index[:axis], b.index_const(at), *index[axis:]],
                   view_strides=lambda x, strides, axis, at: [*strides[:axis], *strides[axis + 1:]],
                   write_back=_select_write_back,
                   carried_dim=lambda x, out, dim, axis, at: None if dim == axis else dim - (dim > axis))


def _pad_slice_rule(x: TensorType, shape, starts, stops, steps):
    (sliced,) = _slice_rule(TensorType(tuple(shape), x.dtype), starts, stops, steps)
    if sliced.shape != x.shape:
        raise RuntimeError(f"pad_slice: source of shape {list(x.shape)} does not fill slice of "
                           f"shape {list(sliced.shape)}")
    return (TensorType(tuple(shape), x.dtype),)


def _pad_slice_impl(x, shape, starts, stops, steps):
    out = np.zeros(shape, dtype=x.dtype)
    out[_slices(starts, stops, steps)] = x
    return out


# The transpose of slice: a zero tensor of `shape` with `x` written at the slice.
PAD_SLICE = Primitive("pad_slice", shape_rule=_pad_slice_rule, kind=MOVEMENT, impl=_pad_slice_impl,
                      vjp=lambda ctx, g: (slice_(g, ctx.attrs["starts"], ctx.attrs["stops"],
                                                 ctx.attrs["steps"]),))


def _concat_rule(*xs: TensorType, axis):
    first = xs[0]
    if first.ndim == 0:
        raise RuntimeError("cat: zero-dimensional tensor (at position 0) cannot be concatenated")
    if not 0 <= axis < first.ndim:
        raise IndexError(f"cat: axis {axis} out of range for tensors of shape {list(first.shape)}")
    # (Loops, not generators: every eager cat pays this.)
    outer, inner = first.shape[:axis], first.shape[axis + 1:]
    total = 0
    for other in xs:
        shape = other.shape
        if (len(shape) != len(first.shape) or shape[:axis] != outer or shape[axis + 1:] != inner
                or other.dtype is not first.dtype):
            raise RuntimeError(f"cat: sizes of tensors must match except in dimension {axis}: got "
                               f"{first} and {other}")
        total += shape[axis]
    return (TensorType(outer + (total,) + inner, first.dtype),)


def _concat_vjp(ctx, g):
    axis = ctx.attrs["axis"]
    grads, offset = [], 0
    for needed, typ in zip(ctx.needs_input_grad, ctx.in_types):
        size = typ.shape[axis]
        if needed:
            starts = [0] * g.ndim
            stops = list(g.shape)
            starts[axis], stops[axis] = offset, offset + size
            grads.append(slice_(g, starts, stops, [1] * g.ndim))
        else:
            grads.append(None)
        offset += size
    return tuple(grads)


def _concat_impl(*xs, axis):
    # C-ordered whatever the inputs' layouts, as PyTorch's cat and compiled code make it
    # (NumPy keeps transposed inputs' order): a reshape of the result is then a view
    # sharing its version counter in eager execution too (fuzz seed 84101043: a write into
    # a cat of transposes after a matmul saved its reshape raised compiled only).
    shape = list(xs[0].shape)
    total = 0
    for x in xs:
        total += x.shape[axis]
    shape[axis] = total
    return np.concatenate(xs, axis=axis, out=np.empty(shape, xs[0].dtype))


CONCAT = Primitive("concat", shape_rule=_concat_rule, kind=MOVEMENT, vjp=_concat_vjp,
                   impl=_concat_impl, backward_name="CatBackward")


def _sum_of_pad_slices(inputs, attrs, uses):
    """pad_slice(a) + pad_slice(b), their boxes apart along one axis -> the pieces
    concatenated, with zeros between (padded only if they do not fill the shape). The
    gradient of a tensor read one slice at a time (a recurrent loop over a sequence,
    `chunk` into gates) is a sum of such terms: as pad_slices and adds it writes and reads
    the whole tensor once per slice; as a concat, once. A chain of such sums folds into one
    concat: a term that is such a concat (padded or not) gives its pieces. Exact: an
    element is one piece's plus zeros, which a piece gets as `x + 0` (-0.0 becomes 0.0, as
    in the sum)."""
    left, right = inputs
    a, b = _box(left), _box(right)
    if a is None or b is None or uses(left) > 1 or uses(right) > 1:
        return None
    shape = left.type.shape
    differ = [k for k in range(len(shape)) if (a[1][k], a[2][k]) != (b[1][k], b[2][k])]
    if len(differ) != 1:
        return None
    (axis,) = differ
    location = left.node.location
    new_nodes: list[Node] = []
    segments = sorted(_segments(a, axis, new_nodes, location) + _segments(b, axis, new_nodes, location),
                      key=lambda segment: segment[0])
    if not segments or any(first[1] > second[0] for first, second in zip(segments, segments[1:])):
        return None  # (overlapping boxes, or all zeros: the nodes made are dropped unread)
    pieces, at = [], segments[0][0]
    for begin, end, piece in segments:
        if begin > at:
            pieces.append(_zeros(piece.type, axis, begin - at, new_nodes, location))
        pieces.append(piece)
        at = end
    joined = Node(CONCAT, tuple(pieces), {"axis": axis}, _concat_rule(*(p.type for p in pieces), axis=axis),
                  location)
    new_nodes.append(joined)
    starts, stops = list(a[1]), list(a[2])
    starts[axis], stops[axis] = segments[0][0], at
    if joined.out_types[0].shape != shape:
        steps = (1,) * len(shape)
        new_nodes.append(Node(PAD_SLICE, (joined.output(0),), {"shape": shape, "starts": tuple(starts),
                                                               "stops": tuple(stops), "steps": steps},
                              _pad_slice_rule(joined.out_types[0], shape, starts, stops, steps), location))
    return new_nodes


def _box(value):
    """(what is inside, box starts, box stops) of a pad_slice with unit steps (the padded
    value), or of a concat (itself, filling the shape); None for anything else."""
    node = value.node
    if node is None:
        return None
    if node.op is CONCAT:
        return value, (0,) * len(value.type.shape), value.type.shape
    if node.op is not PAD_SLICE or any(step != 1 for step in node.attrs["steps"]):
        return None
    return node.inputs[0], tuple(node.attrs["starts"]), tuple(node.attrs["stops"])


def _segments(box, axis: int, new_nodes: list, location) -> list:
    """(start, stop, piece) along `axis` of what a term holds that is not zero: the pieces
    of a concat of zeros and `x + 0` sums (made by an earlier `_sum_of_pad_slices`), else
    the whole box as one piece, `x + 0` (floating point)."""
    inside, starts, stops = box
    node = inside.node
    floating = inside.type.dtype.is_floating
    if node is not None and node.op is CONCAT and node.attrs["axis"] == axis:
        kinds = [_piece_kind(piece, floating) for piece in node.inputs]
        if None not in kinds:
            segments, at = [], starts[axis]
            for piece, kind in zip(node.inputs, kinds):
                size = piece.type.shape[axis]
                if kind == "piece":
                    segments.append((at, at + size, piece))
                at += size
            return segments
    piece = inside
    if floating:
        zero = _zeros(inside.type, axis, inside.type.shape[axis], new_nodes, location)
        plus = Node(elementwise.ADD, (inside, zero), {}, (inside.type,), location)
        new_nodes.append(plus)
        piece = plus.output(0)
    return [(starts[axis], stops[axis], piece)]


def _piece_kind(value, floating: bool) -> str | None:
    """"zeros" (a gap), "piece" (an `x + 0`, or any value of an exact dtype), or None."""
    node = value.node
    if node is not None and node.op is elementwise.FULL and _positive_zero(node.attrs["value"]):
        return "zeros"
    if not floating or (node is not None and node.op is elementwise.ADD
                        and _positive_zero(constant_of(node.inputs[1]))):
        return "piece"
    return None


def _positive_zero(number) -> bool:
    return number is not None and number == 0 and not np.signbit(number)


def _zeros(typ: TensorType, axis: int, size: int, new_nodes: list, location):
    shape = list(typ.shape)
    shape[axis] = size
    zero = Node(elementwise.FULL, (), {"shape": tuple(shape), "dtype": typ.dtype,
                                       "value": 0.0 if typ.dtype.is_floating else 0},
                (TensorType(tuple(shape), typ.dtype),), location)
    new_nodes.append(zero)
    return zero.output(0)


elementwise.ADD.add_rewrite(_sum_of_pad_slices)  # (defined here, beside the primitives it reads)


def reshape(x, shape):
    shape = tuple(shape)
    if x.shape == shape:
        return x
    return bind(RESHAPE, (x,), {"shape": shape})


def permute(x, perm):
    perm = tuple(perm)
    if perm == tuple(range(len(perm))):
        return x
    return bind(PERMUTE, (x,), {"perm": perm})


def expand(x, shape):
    shape = tuple(shape)
    if x.shape == shape:
        return x
    return bind(EXPAND, (x,), {"shape": shape})


def slice_(x, starts, stops, steps):
    return bind(SLICE, (x,), {"starts": tuple(starts), "stops": tuple(stops), "steps": tuple(steps)})


def select(x, axis: int, at: int):
    """x's entry `at` (in range) along `axis`, that axis dropped: a view."""
    return bind(SELECT, (x,), {"axis": axis, "at": at})


def pad_slice(x, shape, starts, stops, steps):
    return bind(PAD_SLICE, (x,), {"shape": tuple(shape), "starts": tuple(starts),
                                  "stops": tuple(stops), "steps": tuple(steps)})


def concat(xs, axis):
    return bind(CONCAT, tuple(xs), {"axis": axis})


def bind_alias(x):
    """A new tensor viewing all of `x` (what `x[...]` and `x[:]` return)."""
    return bind(RESHAPE, (x,), {"shape": x.shape})
