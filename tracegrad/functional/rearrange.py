"""Rearrangements with PyTorch's names, composed of movement primitives (no gradient code):
`movedim`/`moveaxis`, `swapaxes`/`swapdims`, `unflatten`, `tensor_split` and
`hsplit`/`vsplit`/`dsplit`, `hstack`/`vstack`/`dstack`/`column_stack`, `broadcast_tensors`,
`broadcast_shapes`, `meshgrid`, `roll`, `rot90`, `tile`, `repeat_interleave`,
`atleast_1d/2d/3d`, `block_diag`, `cartesian_prod`.

Views where PyTorch makes views (movedim, swapaxes, unflatten, tensor_split's pieces,
broadcast_tensors, meshgrid), copies elsewhere. Diagonals live in `diagonals.py`."""

from __future__ import annotations

import numpy as np

from tracegrad.functional._util import broadcast_shapes as _broadcast_shapes
from tracegrad.functional._util import normalize_dim, result_dtype
from tracegrad.functional.pieces import _piece, flip, repeat
from tracegrad.functional.index import getitem
from tracegrad.functional.shape import _shape_arg, cat, expand, permute, reshape, stack, transpose
from tracegrad.ir import types
from tracegrad.ops import elementwise as ew
from tracegrad.ops import movement as mv
from tracegrad.tensor import Tensor


def _dims(name: str, dims, ndim: int) -> list[int]:
    dims = [dims] if isinstance(dims, int) else list(dims)
    axes = [normalize_dim(name, d, ndim) for d in dims]
    if len(set(axes)) != len(axes):
        raise RuntimeError(f"{name}: repeated dim in `source` ({dims})")
    return axes


def movedim(input: Tensor, source, destination) -> Tensor:
    sources, destinations = _dims("movedim", source, input.ndim), _dims("movedim", destination, input.ndim)
    if len(sources) != len(destinations):
        raise RuntimeError(f"movedim: Invalid source or destination dims: source ({list(sources)} dims) "
                           f"should contain the same number of dims as destination ({list(destinations)} dims)")
    order = [None] * input.ndim
    for s, d in zip(sources, destinations):
        order[d] = s
    rest = iter(d for d in range(input.ndim) if d not in sources)
    return permute(input, tuple(s if s is not None else next(rest) for s in order))


moveaxis = movedim


def swapaxes(input: Tensor, axis0: int, axis1: int) -> Tensor:
    return transpose(input, axis0, axis1)


swapdims = swapaxes


def unflatten(input: Tensor, dim: int, sizes) -> Tensor:
    axis = normalize_dim("unflatten", dim, input.ndim)
    sizes = [int(s) for s in sizes]
    if not sizes:
        raise RuntimeError("unflatten: sizes must be non-empty")
    if sizes.count(-1) > 1:
        raise RuntimeError("unflatten: only one dimension can be inferred")
    known = int(np.prod([s for s in sizes if s != -1]))
    size = input.shape[axis]
    if -1 in sizes:
        if known == 0 or size % known:
            raise RuntimeError(f"unflatten: Provided sizes {sizes} don't multiply up to the size of dim {dim} "
                               f"({size}) in the input tensor")
        sizes[sizes.index(-1)] = size // known
    elif known != size:
        raise RuntimeError(f"unflatten: Provided sizes {sizes} don't multiply up to the size of dim {dim} "
                           f"({size}) in the input tensor")
    return reshape(input, input.shape[:axis] + tuple(sizes) + input.shape[axis + 1:])


def tensor_split(input: Tensor, indices_or_sections, dim: int = 0) -> tuple[Tensor, ...]:
    """Views of `input` along `dim`: `sections` nearly equal pieces (the first ones one
    longer), or pieces between the given indices (clamped to the dim, as Python slices)."""
    if input.ndim == 0:
        raise RuntimeError("tensor_split expected at least a 1-dimensional tensor, but got a tensor with 0 dims")
    axis = normalize_dim("tensor_split", dim, input.ndim)
    size = input.shape[axis]
    if isinstance(indices_or_sections, Tensor):
        if indices_or_sections.dtype is not types.int64 or indices_or_sections.ndim > 1:
            raise RuntimeError("tensor_split expected tensor_indices_or_sections to be a zero-dimensional or "
                               "one-dimensional tensor of dtype long")
        indices_or_sections = indices_or_sections.tolist()
    if isinstance(indices_or_sections, int):
        sections = indices_or_sections
        if sections <= 0:
            raise RuntimeError(f"number of sections must be larger than 0, got {sections}")
        small, extra = divmod(size, sections)
        bounds = np.cumsum([0] + [small + (k < extra) for k in range(sections)])
    else:
        points = [min(max(int(i) + (size if int(i) < 0 else 0), 0), size) for i in indices_or_sections]
        bounds = [0] + points + [size]
    pieces = []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        start = min(int(start), size)
        pieces.append(_piece(input, axis, start, max(int(stop) - start, 0)))
    return tuple(pieces)


def _split_along(name: str, input: Tensor, indices_or_sections, dim: int, least: int):
    if input.ndim < least:
        raise RuntimeError(f"torch.{name} requires a tensor with at least {least} dimension, but got a tensor "
                           f"with {input.ndim} dimensions!")
    if isinstance(indices_or_sections, int) and (
            indices_or_sections <= 0 or input.shape[dim] % indices_or_sections):
        raise RuntimeError(f"torch.{name} attempted to split along dimension {dim}, but the size of the "
                           f"dimension {input.shape[dim]} is not divisible by the split_size "
                           f"{indices_or_sections}!")
    return tensor_split(input, indices_or_sections, dim)


def hsplit(input: Tensor, indices_or_sections) -> tuple[Tensor, ...]:
    return _split_along("hsplit", input, indices_or_sections, 1 if input.ndim > 1 else 0, 1)


def vsplit(input: Tensor, indices_or_sections) -> tuple[Tensor, ...]:
    return _split_along("vsplit", input, indices_or_sections, 0, 2)


def dsplit(input: Tensor, indices_or_sections) -> tuple[Tensor, ...]:
    return _split_along("dsplit", input, indices_or_sections, 2, 3)


def _atleast(least: int, tensors):
    def grow(t: Tensor) -> Tensor:
        if t.ndim >= least:
            return t
        if least == 3 and t.ndim == 2:
            return reshape(t, t.shape + (1,))
        if least == 3 and t.ndim == 1:
            return reshape(t, (1,) + t.shape + (1,))
        return reshape(t, (1,) * (least - t.ndim) + t.shape)
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        return tuple(grow(t) for t in tensors[0])
    if len(tensors) == 1:
        return grow(tensors[0])
    return tuple(grow(t) for t in tensors)


def atleast_1d(*tensors):
    return _atleast(1, tensors)


def atleast_2d(*tensors):
    return _atleast(2, tensors)


def atleast_3d(*tensors):
    return _atleast(3, tensors)


def hstack(tensors) -> Tensor:
    tensors = atleast_1d(list(tensors))
    return cat(tensors, 0 if tensors and tensors[0].ndim == 1 else 1)


def vstack(tensors) -> Tensor:
    return cat(atleast_2d(list(tensors)), 0)


row_stack = vstack


def dstack(tensors) -> Tensor:
    return cat(atleast_3d(list(tensors)), 2)


def column_stack(tensors) -> Tensor:
    columns = [reshape(t, (t.numel(), 1)) if t.ndim <= 1 else t for t in tensors]
    return cat(columns, 1)


def broadcast_shapes(*shapes) -> tuple[int, ...]:
    shapes = [(s,) if isinstance(s, int) else tuple(s) for s in shapes]
    if any(n < 0 for s in shapes for n in s):
        raise RuntimeError("Trying to create tensor with negative dimension")
    return _broadcast_shapes("broadcast_shapes", *shapes) if shapes else ()


def broadcast_tensors(*tensors) -> tuple[Tensor, ...]:
    """Views of the tensors expanded to their common shape (as PyTorch: each a view)."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    shape = _broadcast_shapes("broadcast_tensors", *(t.shape for t in tensors))
    return tuple(expand(t, shape) for t in tensors)


def meshgrid(*tensors, indexing: str | None = None) -> tuple[Tensor, ...]:
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    indexing = "ij" if indexing is None else indexing
    if indexing not in ("ij", "xy"):
        raise RuntimeError(f"torch.meshgrid: indexing must be one of \"xy\" or \"ij\", but received: {indexing}")
    for t in tensors:
        if t.ndim > 1:
            raise RuntimeError(f"torch.meshgrid: Expected 0D or 1D tensor in the tensor list but got: {t.ndim}D")
    if len({t.dtype for t in tensors}) > 1:
        raise RuntimeError("torch.meshgrid: expects all tensors to have the same dtype")
    vectors = [reshape(t, (t.numel(),)) for t in tensors]
    swap = indexing == "xy" and len(vectors) >= 2
    if swap:  # "xy": the first two grids vary along dims 1 and 0 (Cartesian order)
        vectors[0], vectors[1] = vectors[1], vectors[0]
    shape = tuple(v.shape[0] for v in vectors)
    grids = []
    for k, v in enumerate(vectors):
        along = (1,) * k + v.shape + (1,) * (len(vectors) - k - 1)
        grids.append(expand(reshape(v, along), shape))
    if swap:  # (the grid of the first input is the one varying along dim 1)
        grids[0], grids[1] = grids[1], grids[0]
    return tuple(grids)


def roll(input: Tensor, shifts, dims=None) -> Tensor:
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    if dims is None:
        if len(shifts) != 1:
            raise RuntimeError(f"roll: `shifts` required to be of size 1 when `dims` is not given, got "
                               f"{len(shifts)}")
        flat = reshape(input, (input.numel(),))
        return reshape(roll(flat, shifts, 0), input.shape)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if len(shifts) != len(dims):
        raise RuntimeError(f"roll: shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")
    out = input
    for shift, dim in zip(shifts, dims):
        axis = normalize_dim("roll", dim, input.ndim)
        size = input.shape[axis]
        shift = shift % size if size else 0
        if shift:  # the last `shift` entries move to the front
            out = cat([_piece(out, axis, size - shift, shift), _piece(out, axis, 0, size - shift)], axis)
    return out if out is not input else ew.copy(input)


def rot90(input: Tensor, k: int = 1, dims=(0, 1)) -> Tensor:
    dims = tuple(dims)
    if len(dims) != 2:
        raise RuntimeError(f"expected total rotation dims == 2, but got dims = {len(dims)}")
    if input.ndim < 2:
        raise RuntimeError(f"expected total dims >= 2, but got total dims = {input.ndim}")
    a, b = (normalize_dim("rot90", d, input.ndim) for d in dims)
    if a == b:
        raise RuntimeError(f"expected rotation dims to be different, but got dim0 = {a} and dim1 = {b}")
    k %= 4
    if k == 1:  # (flipped last: the result is the flip's copy, not a view of one, as PyTorch's)
        return flip(transpose(input, a, b), [a])
    if k == 2:
        return flip(input, [a, b])
    if k == 3:
        return flip(transpose(input, a, b), [b])
    return ew.copy(input)


def tile(input: Tensor, dims) -> Tensor:
    dims = tuple(_shape_arg((dims,) if isinstance(dims, int) else tuple(dims)))
    dims = (1,) * (input.ndim - len(dims)) + dims
    return repeat(input, dims)


def repeat_interleave(input: Tensor, repeats=None, dim: int | None = None, *, output_size: int | None = None):
    """Each element (or slice along `dim`) repeated `repeats` times in place. With a tensor
    of repeats alone, the indices 0, 1, ... repeated by it."""
    if repeats is None:  # repeat_interleave(repeats): the positions, each repeated
        counts = input._concrete()
        if input.ndim > 1 or input.dtype is not types.int64:
            raise RuntimeError("repeat_interleave: repeats must be a 0-dim or 1-dim tensor of dtype long")
        return Tensor(np.repeat(np.arange(counts.size, dtype=np.int64), counts.reshape(-1)))
    if dim is None:
        input, axis = reshape(input, (input.numel(),)), 0
    else:
        axis = normalize_dim("repeat_interleave", dim, input.ndim)
    size = input.shape[axis] if input.ndim else 1
    if isinstance(repeats, Tensor) and repeats.numel() == 1 and repeats.ndim <= 1:
        repeats = int(repeats.item())
    if isinstance(repeats, int):
        if repeats < 0:
            raise RuntimeError("repeat_interleave: repeats can not be negative")
        if not input.ndim:
            input = reshape(input, (1,))
        # (n, s) -> (n, 1, s) -> expanded (n, k, s) -> (n*k, s): one expand, one reshape.
        spread = reshape(input, input.shape[:axis + 1] + (1,) + input.shape[axis + 1:])
        grown = expand(spread, input.shape[:axis + 1] + (repeats,) + input.shape[axis + 1:])
        # (a fresh tensor, as PyTorch's: the reshape can be a view of the input or of its expansion)
        out = ew.copy(reshape(grown, input.shape[:axis] + (size * repeats,) + input.shape[axis + 1:]))
    else:
        counts = repeats._concrete() if isinstance(repeats, Tensor) else np.asarray(repeats)
        counts = counts.reshape(-1)
        if counts.shape[0] != size:
            raise RuntimeError(f"repeats must have the same size as input along dim, but got repeats.size(0) = "
                               f"{counts.shape[0]} and input.size({axis}) = {size}")
        if (counts < 0).any():
            raise RuntimeError("repeats can not be negative")
        positions = Tensor(np.repeat(np.arange(size, dtype=np.int64), counts))
        out = getitem(input, (slice(None),) * axis + (positions,))
    if output_size is not None and out.shape[axis] != output_size:
        raise RuntimeError(f"repeat_interleave: output_size {output_size} does not match the total of repeats "
                           f"{out.shape[axis]}")
    return out


def block_diag(*tensors) -> Tensor:
    """A block-diagonal matrix of the tensors (0-d and 1-d ones as rows), zeros elsewhere."""
    blocks = []
    for k, t in enumerate(tensors):
        if t.ndim > 2:
            raise RuntimeError(f"torch.block_diag: Input tensors must have 2 or fewer dimensions. Input {k} has "
                               f"{t.ndim} dimensions")
        blocks.append(reshape(t, (1, t.numel())) if t.ndim < 2 else t)
    if not blocks:
        return Tensor(np.zeros((0, 0), dtype=np.float32))
    dtype = result_dtype(*blocks)
    width = sum(b.shape[1] for b in blocks)
    rows, left = [], 0
    for b in blocks:
        rows_here, cols = b.shape
        # The block placed in its band of columns, zeros elsewhere (pad_slice's transpose of a slice).
        rows.append(mv.pad_slice(ew.convert(b, dtype), (rows_here, width), (0, left), (rows_here, left + cols),
                                 (1, 1)))
        left += cols
    return cat(rows, 0)


def cartesian_prod(*tensors) -> Tensor:
    for t in tensors:
        if t.ndim != 1:
            raise RuntimeError(f"Expect a 1D vector, but got shape {list(t.shape)}")
    if len(tensors) == 1:
        return tensors[0]
    grids = meshgrid(*tensors, indexing="ij")
    return stack([reshape(g, (g.numel(),)) for g in grids], 1)
