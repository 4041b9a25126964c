"""`pad`: PyTorch's `F.pad` in its four modes. Constant padding is a `pad_slice` (zeros
around the input) after a `slice` for negative amounts (which crop); reflect, replicate
and circular padding read the input through one index array per padded dim, so each
border element's gradient is summed from every place it was copied to."""

from __future__ import annotations

import numpy as np

from tracegrad.ir import types
from tracegrad.ops import elementwise as ew
from tracegrad.ops import indexing
from tracegrad.ops import movement as mv
from tracegrad.tensor import Tensor

MODES = ("constant", "reflect", "replicate", "circular")


def _pairs(name: str, pad, ndim: int) -> list[tuple[int, int]]:
    """`pad` (last dim first, (before, after) per dim) as one pair per padded dim, first dim
    first."""
    pad = tuple(int(p) for p in pad)
    if len(pad) % 2:
        raise RuntimeError("Padding length must be divisible by 2")
    if len(pad) // 2 > ndim:
        raise RuntimeError(f"Padding length should be less than or equal to two times the input "
                           f"dimension but got padding length {len(pad)} and input of dimension {ndim}")
    return [(pad[i], pad[i + 1]) for i in range(len(pad) - 2, -1, -2)]


def _crop(x: Tensor, axis: int, before: int, after: int) -> Tensor:
    """x with -before / -after elements cut from the ends of `axis` (negative padding)."""
    cut_before, cut_after = max(-before, 0), max(-after, 0)
    if not cut_before and not cut_after:
        return x
    size = x.shape[axis]
    if cut_before + cut_after > size:
        raise RuntimeError(f"pad: the padding ({before}, {after}) would make dimension {axis} of size "
                           f"{size} negative")
    starts, stops = [0] * x.ndim, list(x.shape)
    starts[axis], stops[axis] = cut_before, size - cut_after
    return mv.slice_(x, starts, stops, [1] * x.ndim)


def _constant_pad(x: Tensor, pairs: list[tuple[int, int]], value: float) -> Tensor:
    first = x.ndim - len(pairs)
    for offset, (before, after) in enumerate(pairs):
        x = _crop(x, first + offset, before, after)
    before = [0] * first + [max(b, 0) for b, _ in pairs]
    after = [0] * first + [max(a, 0) for _, a in pairs]
    if not any(before) and not any(after):
        return ew.copy(x)  # (a new tensor, as PyTorch's pad returns)
    shape = tuple(n + b + a for n, b, a in zip(x.shape, before, after))
    stops = tuple(b + n for b, n in zip(before, x.shape))
    steps = (1,) * x.ndim
    padded = mv.pad_slice(x, shape, tuple(before), stops, steps)
    if value == 0:
        return padded
    inside = mv.pad_slice(ew.full(x.shape, True, types.bool_), shape, tuple(before), stops, steps)
    return ew.where(inside, padded, ew.full(shape, value, x.dtype))


def _source_positions(mode: str, size: int, before: int, after: int, axis: int, shape) -> np.ndarray:
    """For each position of the padded dim, the input position it copies."""
    positions = np.arange(-before, size + after)
    if mode == "replicate":
        return np.clip(positions, 0, size - 1)
    if mode == "circular":
        if before > size or after > size:
            raise RuntimeError("Padding value causes wrapping around more than once.")
        return positions % size
    if before >= size or after >= size:
        raise RuntimeError(f"Argument #4: Padding size should be less than the corresponding input "
                           f"dimension, but got: padding ({before}, {after}) at dimension {axis} of "
                           f"input {list(shape)}")
    positions = np.abs(positions)
    return np.where(positions >= size, 2 * (size - 1) - positions, positions)


def _check_non_constant(mode: str, pad_length: int, ndim: int) -> None:
    dims = pad_length // 2
    if dims in (1, 2, 3) and ndim in (dims + 1, dims + 2):
        return
    raise NotImplementedError(
        f"Padding size {pad_length} is not supported for {ndim}D input tensor.\n"
        "Supported combinations for non-constant padding:\n"
        "  - 2D or 3D input: padding size = 2 (pads last dimension)\n"
        "  - 3D or 4D input: padding size = 4 (pads last 2 dimensions)\n"
        "  - 4D or 5D input: padding size = 6 (pads last 3 dimensions)")


def pad(input: Tensor, pad, mode: str = "constant", value: float | None = None) -> Tensor:
    """Pad the last len(pad) // 2 dims of `input`; `pad` is (before, after) per dim, starting
    from the last dim, as PyTorch's."""
    if mode not in MODES:
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    pairs = _pairs("pad", pad, input.ndim)
    if mode == "constant":
        return _constant_pad(input, pairs, 0 if value is None else value)
    if value is not None and value != 0:
        raise RuntimeError(f"Padding mode \"{mode}\" doesn't take in value argument")
    _check_non_constant(mode, 2 * len(pairs), input.ndim)
    out = input
    first = input.ndim - len(pairs)
    for offset, (before, after) in enumerate(pairs):
        axis = first + offset
        if before == after == 0:
            continue
        positions = _source_positions(mode, input.shape[axis], before, after, axis, input.shape)
        out = indexing.index(out, [Tensor(positions.astype(np.int64))], axis)
    return out if out is not input else ew.copy(input)
