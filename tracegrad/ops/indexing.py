"""Data-dependent indexing primitives: gather/scatter_add along one axis (torch.gather),
and NumPy-style integer-array indexing of consecutive axes with its transpose.

`index(x, *indices, axis)` reads `x[..., i0, i1, ...]` where the index tensors (already
broadcast to one shape) select along axes `axis, axis+1, ...`; `index_add` writes the
transpose (summing repeated indices).
"""

from __future__ import annotations

import math

import numpy as np

from tracegrad import reference
from tracegrad.ir import types
from tracegrad.ir.types import TensorType
from tracegrad.ops.dispatch import bind
from tracegrad.ir.primitive import OTHER, Primitive


def _check_index_dtype(name, index: TensorType):
    if index.dtype is not types.int64:
        raise TypeError(f"{name}: index must be an int64 tensor, got {index.dtype.name} "
                        f"{list(index.shape)}")


def _check_axis(name, shape: tuple[int, ...], axis):
    if not 0 <= axis < len(shape):
        raise IndexError(f"{name}: axis {axis} out of range for a tensor of shape {list(shape)}")


def _gather_rule(x: TensorType, index: TensorType, axis, target_of=None):
    _check_index_dtype("gather", index)
    _check_axis("gather", x.shape, axis)
    if index.ndim != x.ndim:
        raise RuntimeError(f"gather: index {list(index.shape)} and input {list(x.shape)} must have "
                           "the same number of dimensions")
    for d, (i, s) in enumerate(zip(index.shape, x.shape)):
        if d != axis and i > s:
            raise RuntimeError(f"gather: size of index {list(index.shape)} exceeds input "
                               f"{list(x.shape)} at dimension {d}")
    return (TensorType(index.shape, x.dtype),)


def check_bounds(name, index, size, dim, negative=False, target=False):
    """Raise PyTorch's IndexError unless every entry of `index` lies in [0, size) along
    `dim` ([-size, size) when `negative`: advanced indexing counts those from the end;
    gather and scatter_add do not). `target`: the entries are class labels, and the
    message is cross_entropy's "Target 7 is out of bounds."."""
    if not index.size:
        return
    # (The ufuncs' reduce directly: index.min() goes through two Python layers per call.)
    low, high = np.minimum.reduce(index, axis=None), np.maximum.reduce(index, axis=None)
    least = -size if negative else 0
    if low < least or high >= size:
        bad = int(low if low < least else high)
        if target:
            raise IndexError(f"{name}: Target {bad} is out of bounds.")
        raise IndexError(f"{name}: index {bad} is out of bounds for dimension {dim} with size {size}")


class BoundsCheck:
    """The bounds check of one index operand, as a primitive's `index_checks` lists it:
    calling it on the index array raises the op's eager error (`check_bounds`). `bounds`
    says what it accepts, so two checks of one index can be compared (jit.undo)."""

    __slots__ = ("name", "size", "dim", "negative", "target")

    def __init__(self, name: str, size: int, dim: int, negative: bool = False, target: bool = False):
        self.name, self.size, self.dim, self.negative, self.target = name, size, dim, negative, target

    def __call__(self, index: np.ndarray) -> None:
        check_bounds(self.name, index, self.size, self.dim, self.negative, self.target)

    @property
    def bounds(self) -> tuple[int, int]:
        return (-self.size if self.negative else 0, self.size)


def _gather_check(size, axis, target_of):
    """The check of gather's index: a position in a row of `size` along `axis`, never
    negative (PyTorch's gather). `target_of` names a loss whose class labels the index
    holds (cross_entropy), whose error the check raises."""
    if target_of is None:
        return BoundsCheck("gather", size, axis)
    return BoundsCheck(target_of, size, axis, target=True)


def _gather_checks(in_types, out_type, axis, target_of=None):
    return [(1, _gather_check(in_types[0].shape[axis], axis, target_of))]


def _gather_impl(x, index, axis, target_of=None):
    _gather_check(x.shape[axis], axis, target_of)(index)
    # take_along_axis needs equal non-axis sizes; torch.gather allows smaller index sizes.
    view = x[tuple(slice(0, n) if d != axis else slice(None) for d, n in enumerate(index.shape))]
    return np.take_along_axis(view, index, axis=axis)


def _gather_lower(b, read, index, in_types, out_type, axis, target_of=None):
    source = list(index)
    source[axis] = b.wrap_index(read(1, index), in_types[0].shape[axis])
    return read(0, source)


def _scatter_add_lower(b, read, index, in_types, out_type, shape, axis):
    """out[p] = sum over k of src[p with axis=k] where index[p with axis=k] == p[axis]."""
    extent = in_types[0].shape
    inside = None  # positions beyond the index's extent on other dims receive nothing
    position = list(index)
    for d, (n, m) in enumerate(zip(extent, shape)):
        if d != axis and n < m:
            within = b.ir.icmp_signed("<", index[d], b.index_const(n))
            inside = within if inside is None else b.ir.and_(inside, within)
            position[d] = b.ir.select(within, index[d], b.index_const(n - 1))
    total = b.const(0, out_type.dtype)
    for k in range(extent[axis]):
        position[axis] = b.index_const(k)
        target = b.wrap_index(read(0, position), shape[axis])
        hit = b.ir.icmp_signed("==", target, index[axis])
        total = b.add(total, b.select(hit, read(1, position), b.const(0, out_type.dtype)))
    return total if inside is None else b.select(inside, total, b.const(0, out_type.dtype))


GATHER = Primitive("gather", shape_rule=_gather_rule, impl=_gather_impl, kind=OTHER,
                   saves_inputs=(1,), lower_indexed=_gather_lower, reads_aligned=(1,),
                   index_checks=_gather_checks,
                   vjp=lambda ctx, g: (scatter_add(ctx.in_types[0].shape, ctx.inputs[1], g,
                                                   ctx.attrs["axis"]), None))


def _scatter_add_rule(index: TensorType, src: TensorType, shape, axis):
    _check_index_dtype("scatter_add", index)
    _check_axis("scatter_add", tuple(shape), axis)
    if index.shape != src.shape:
        raise RuntimeError(f"scatter_add: index {list(index.shape)} and src {list(src.shape)} differ")
    return (TensorType(tuple(shape), src.dtype),)


def _scatter_add_checks(in_types, out_type, shape, axis):
    return [(0, BoundsCheck("scatter_add", shape[axis], axis))]


def _scatter_add_impl(index, src, shape, axis):
    check_bounds("scatter_add", index, shape[axis], axis)
    out = np.zeros(shape, dtype=src.dtype)
    grids = list(np.indices(index.shape, sparse=True))
    grids[axis] = index
    np.add.at(out, tuple(grids), src)
    return out


# A zero tensor of `shape` with src added at index along axis (the transpose of gather).
SCATTER_ADD = Primitive("scatter_add", shape_rule=_scatter_add_rule, impl=_scatter_add_impl,
                        kind=OTHER, saves_inputs=(0,), lower_indexed=_scatter_add_lower,
                        # unrolled over the scattered axis: only for a few entries per line
                        lowers=lambda node: node.inputs[0].type.shape[node.attrs["axis"]] <= 8,
                        index_checks=_scatter_add_checks,
                        vjp=lambda ctx, g: (None, gather(g, ctx.inputs[0], ctx.attrs["axis"])))


def _index_rule(x: TensorType, *indices: TensorType, axis, negative=True):
    for index in indices:
        _check_index_dtype("index", index)
        if index.shape != indices[0].shape:
            raise IndexError(f"index: index tensors of shapes {list(indices[0].shape)} and "
                             f"{list(index.shape)} must be broadcast first")
    if axis + len(indices) > x.ndim:
        raise IndexError(f"index: too many indices for tensor of shape {list(x.shape)}")
    shape = x.shape[:axis] + indices[0].shape + x.shape[axis + len(indices):]
    return (TensorType(shape, x.dtype),)


def _index_key(axis, indices):
    return (slice(None),) * axis + tuple(indices)


def _index_impl(x, *indices, axis, negative=True):
    # `negative`: indices count from the end, as in x[i]; embedding's rows do not.
    for offset, index in enumerate(indices):
        check_bounds("index", index, x.shape[axis + offset], axis + offset, negative=negative)
    return np.asarray(x[_index_key(axis, indices)])


def _index_vjp(ctx, g):
    indices = ctx.inputs[1:]
    return (index_add(ctx.in_types[0].shape, g, indices, ctx.attrs["axis"]),) + (None,) * len(indices)


INDEX = Primitive("index", shape_rule=_index_rule, impl=_index_impl, kind=OTHER,
                  saves_inputs=tuple(range(1, 33)), vjp=_index_vjp,
                  index_checks=lambda in_types, out_type, axis, negative=True: [
                      (1 + k, BoundsCheck("index", in_types[0].shape[axis + k], axis + k, negative=negative))
                      for k in range(len(in_types) - 1)])


def _index_add_rule(src: TensorType, *indices: TensorType, shape, axis):
    (expected,) = _index_rule(TensorType(tuple(shape), src.dtype), *indices, axis=axis)
    if expected.shape != src.shape:
        raise RuntimeError(f"index_add: source {list(src.shape)} does not match indexed shape "
                           f"{list(expected.shape)}")
    return (TensorType(tuple(shape), src.dtype),)


def _index_add_impl(src, *indices, shape, axis):
    for offset, index in enumerate(indices):  # (index_put's write, when nothing read first)
        check_bounds("index", index, shape[axis + offset], axis + offset, negative=True)
    if axis == 0 and len(indices) == 1 and indices[0].size and src.dtype.kind in "fiuc" \
            and math.prod(shape[1:]) > 1:
        return _index_add_rows(src, indices[0], shape)
    out = np.zeros(shape, dtype=src.dtype)
    np.add.at(out, _index_key(axis, indices), src)
    return out


# The code generator's loop adding rows in index order (`codegen/row_adds.py`), installed
# with `set_row_adder`: `adder(table, rows, index) -> bool`, False for a dtype it has no
# loop for. Its values are the rounds' below to the bit; the reference mode runs the rounds.
_row_adder = None


def set_row_adder(adder) -> None:
    global _row_adder
    _row_adder = adder


# `_index_add_rows` adds one occurrence of every index at a time, for the indices repeated
# at most this many times; each index repeated more is summed on its own.
MAX_ADD_ROUNDS = 16


def _index_add_rows(src, index, shape):
    """np.add.at(zeros(shape), index, src) along axis 0 for rows of several elements (an
    embedding's gradient), the same to the bit at a fraction of add.at's per-element cost
    (W7's (512, 128) rows into 65: 600 -> 150 µs): in rounds, round k adding every index's
    k-th occurrence at once (one fancy-indexed add without repeats), so each row's terms
    are summed in order of appearance from 0, as add.at sums them; an index repeated more
    than MAX_ADD_ROUNDS times (a frequent word of a language model's batch: W8's 700 tokens
    repeat one 170 times) in one reduction of its rows, which adds them in that order too,
    from an initial 0."""
    flat = index.reshape(-1)
    flat = np.where(flat < 0, flat + shape[0], flat)
    rows = src.reshape(len(flat), -1)
    if _row_adder is not None and not reference.ACTIVE:
        out = np.zeros((shape[0], rows.shape[1]), dtype=src.dtype)
        if _row_adder(out, rows, flat):
            return out.reshape(shape)
    order = np.argsort(flat, kind="stable")
    targets = flat[order]
    first = np.concatenate(([True], targets[1:] != targets[:-1]))
    starts = np.flatnonzero(first)
    counts = np.diff(np.append(starts, len(flat)))
    occurrence = np.arange(len(flat)) - np.repeat(starts, counts)
    out = np.zeros((shape[0], rows.shape[1]), dtype=src.dtype)
    heavy = counts > MAX_ADD_ROUNDS
    if heavy.any():
        zero = src.dtype.type(0)
        for group in np.flatnonzero(heavy):
            begin = starts[group]
            out[targets[begin]] = np.add.reduce(rows[order[begin:begin + counts[group]]], axis=0, initial=zero)
        light = ~np.repeat(heavy, counts)
        order, occurrence = order[light], occurrence[light]
    rounds = int(occurrence.max(initial=-1)) + 1
    by_round = np.argsort(occurrence, kind="stable")
    bounds = np.searchsorted(occurrence[by_round], np.arange(rounds + 1))
    for begin, end in zip(bounds[:-1], bounds[1:]):
        picked = order[by_round[begin:end]]
        out[flat[picked]] += rows[picked]
    return out.reshape(shape)


INDEX_ADD = Primitive("index_add", shape_rule=_index_add_rule, impl=_index_add_impl, kind=OTHER,
                      saves_inputs=tuple(range(1, 33)),
                      index_checks=lambda in_types, out_type, shape, axis: [
                          (1 + k, BoundsCheck("index", shape[axis + k], axis + k, negative=True))
                          for k in range(len(in_types) - 1)],
                      vjp=lambda ctx, g: (index(g, ctx.inputs[1:], ctx.attrs["axis"]),)
                      + (None,) * (len(ctx.in_types) - 1))


def gather(x, index_tensor, axis, target_of=None):
    attrs = {"axis": axis} if target_of is None else {"axis": axis, "target_of": target_of}
    return bind(GATHER, (x, index_tensor), attrs)


def scatter_add(shape, index_tensor, src, axis):
    return bind(SCATTER_ADD, (index_tensor, src), {"shape": tuple(shape), "axis": axis})


def index(x, indices, axis, negative=True):
    attrs = {"axis": axis} if negative else {"axis": axis, "negative": False}
    return bind(INDEX, (x, *indices), attrs)


def index_add(shape, src, indices, axis):
    return bind(INDEX_ADD, (src, *indices), {"shape": tuple(shape), "axis": axis})
