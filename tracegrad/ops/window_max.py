"""Max pooling as two primitives over the windows of the last two dims (..., H, W):
`window_select(x, v)`, each window's element of `v` where `x` has its first maximum, and
its transpose `window_scatter(x, g)`, each window's `g` put back at that element (summed
where windows overlap).

`max_pool2d(x)` is `window_select(x, x)`. Both ops are linear in their second operand
and constant in `x` (which element wins changes only where `x` ties), so each is the
other's gradient and `x` gets none from either: second derivatives are exact. The winner
is PyTorch's: the first maximum in window order (rows, then columns), a NaN over any
number (the last NaN when several), the first element inside the input when all are
-inf. Padding (`padding` elements before and after each of H and W) takes part in no
window's choice: it is no element.

Neither makes the index of the winner: compiled, `window_select` reads each window once
and `window_scatter` finds the winner again from `x` (4 reads per pixel of a 2x2 pool),
so no int64 index array is written and read back (W9's 2x2 pool: 4.7 MB each way), and
both fuse with what computes `x` (a convolution's bias and ReLU) and what reads their
results. A window is kernel (dilated) offsets from (oh*stride, ow*stride) of the padded
input.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from tracegrad.ir import types
from tracegrad.ir.primitive import OTHER, Primitive
from tracegrad.ir.types import TensorType
from tracegrad.ops.dispatch import bind
from tracegrad.ops.window import window_count

# window_scatter's element is the sum over the windows that may cover a pixel, each
# found again from k*k reads of x: lowered while that is at most this many reads (a
# 2x2 pool of stride 2: 4; 3x3 of stride 2: 36), else it runs as NumPy.
MAX_LOWERED_READS = 40

DTYPES = (types.float32, types.float64)


def _counts(shape: tuple[int, ...], kernel, stride, dilation, padding) -> tuple[int, int]:
    return tuple(window_count(n + 2 * p, k, s, d)
                 for n, k, s, d, p in zip(shape[-2:], kernel, stride, dilation, padding))


def _check(name: str, x: TensorType, other: TensorType, kernel, stride, dilation, padding) -> tuple[int, int]:
    for label, pair in (("kernel", kernel), ("stride", stride), ("dilation", dilation)):
        if len(pair) != 2 or min(pair) <= 0:
            raise RuntimeError(f"{name}: {label} must be two positive ints, got {list(pair)}")
    if len(padding) != 2 or any(not 0 <= p <= ((k - 1) * d + 1) // 2 for p, k, d in zip(padding, kernel, dilation)):
        raise RuntimeError(f"{name}: padding must be two ints from 0 to half the dilated kernel "
                           f"{list(kernel)} (dilation {list(dilation)}), got {list(padding)}")
    if x.ndim < 2 or x.dtype not in DTYPES or other.dtype is not x.dtype:
        raise RuntimeError(f"{name}: expected float32 or float64 tensors of one dtype with at least 2 dims "
                           f"(..., H, W), got {x} and {other}")
    counts = _counts(x.shape, kernel, stride, dilation, padding)
    if 0 in counts:
        raise RuntimeError(f"{name}: kernel {list(kernel)} with dilation {list(dilation)} does not fit in "
                           f"{x.shape[-2]}x{x.shape[-1]} padded by {list(padding)} (input {x})")
    return counts


def _select_rule(x: TensorType, v: TensorType, kernel, stride, dilation, padding):
    counts = _check("window_select", x, v, kernel, stride, dilation, padding)
    if v.shape != x.shape:
        raise RuntimeError(f"window_select: expected values of the shape of the input {x}, got {v}")
    return (TensorType(x.shape[:-2] + counts, x.dtype),)


def _scatter_rule(x: TensorType, g: TensorType, kernel, stride, dilation, padding):
    counts = _check("window_scatter", x, g, kernel, stride, dilation, padding)
    if g.shape != x.shape[:-2] + counts:
        raise RuntimeError(f"window_scatter: expected one value per window of {x}, "
                           f"{list(x.shape[:-2] + counts)}, got {g}")
    return (TensorType(x.shape, x.dtype),)


def _windows(x: np.ndarray, kernel, stride, dilation, padding, fill: float) -> np.ndarray:
    """(..., OH, OW, KH*KW): every window of x padded with `fill`, flattened in window
    order (a copy)."""
    if any(padding):
        pad = [(0, 0)] * (x.ndim - 2) + [(padding[0], padding[0]), (padding[1], padding[1])]
        x = np.pad(x, pad, constant_values=fill)
    out_h, out_w = _counts(x.shape, kernel, stride, dilation, (0, 0))
    *lead, s_h, s_w = x.strides
    view = as_strided(x, (*x.shape[:-2], out_h, out_w, *kernel),
                      (*lead, s_h * stride[0], s_w * stride[1], s_h * dilation[0], s_w * dilation[1]),
                      writeable=False)
    return view.reshape(*x.shape[:-2], out_h, out_w, kernel[0] * kernel[1])


def _winners(x: np.ndarray, kernel, stride, dilation, padding) -> tuple[np.ndarray, np.ndarray]:
    """(x's windows, per window the offset number of PyTorch's winner: the first maximum,
    among NaNs the last, and where the maximum is -inf the first offset inside x)."""
    windows = _windows(x, kernel, stride, dilation, padding, -np.inf)
    winners = np.argmax(windows, axis=-1)  # (NumPy: the first maximum, and the first NaN)
    nan = np.isnan(windows)
    if nan.any():
        last_nan = windows.shape[-1] - 1 - np.argmax(nan[..., ::-1], axis=-1)
        winners = np.where(nan.any(axis=-1), last_nan, winners)
    if any(padding):  # (a window of -inf only would otherwise choose its padding)
        inside = _windows(np.ones(x.shape[-2:], bool), kernel, stride, dilation, padding, False)
        first_inside = np.argmax(inside, axis=-1)
        all_low = np.take_along_axis(windows, winners[..., None], axis=-1)[..., 0] == -np.inf
        winners = np.where(all_low, first_inside, winners)
    return windows, winners


def _select_impl(x, v, kernel, stride, dilation, padding):
    windows, winners = _winners(x, kernel, stride, dilation, padding)
    values = windows if v is x else _windows(v, kernel, stride, dilation, padding, 0)
    return np.ascontiguousarray(np.take_along_axis(values, winners[..., None], axis=-1)[..., 0])


def _scatter_impl(x, g, kernel, stride, dilation, padding):
    _, winners = _winners(x, kernel, stride, dilation, padding)
    out_h, out_w = winners.shape[-2:]
    (top, left), (height, width) = padding, x.shape[-2:]
    out = np.zeros(x.shape[:-2] + (height + 2 * top, width + 2 * left), x.dtype)
    zero = x.dtype.type(0)
    # Offset after offset, from the last: a pixel several windows cover sums their values
    # in the windows' order (rows, then columns), as PyTorch's loop and the lowered kernel do.
    for i in reversed(range(kernel[0])):
        for j in reversed(range(kernel[1])):
            row, column = i * dilation[0], j * dilation[1]
            won = np.where(winners == i * kernel[1] + j, g, zero)
            out[..., row:row + stride[0] * (out_h - 1) + 1:stride[0],
                column:column + stride[1] * (out_w - 1) + 1:stride[1]] += won
    return np.ascontiguousarray(out[..., top:top + height, left:left + width])


def _window_reads(b, read, lead: list, row, column, in_type: TensorType, kernel, dilation, padding) -> list:
    """Per element of the window starting at (row, column) of the padded input, in window
    order: (whether it lies inside the input, None when it always does; a function reading
    input k there)."""
    height, width = in_type.shape[-2:]
    top, left = padding
    reads = []
    for i in range(kernel[0]):
        r = b.affine(row, i * dilation[0] - top, 1)
        for j in range(kernel[1]):
            c = b.affine(column, j * dilation[1] - left, 1)
            inside = None
            if top or left:
                inside = b.ir.and_(b.ir.and_(b.ir.icmp_signed(">=", r, b.index_const(0)),
                                             b.ir.icmp_signed("<", r, b.index_const(height))),
                                   b.ir.and_(b.ir.icmp_signed(">=", c, b.index_const(0)),
                                             b.ir.icmp_signed("<", c, b.index_const(width))))
                at = [*lead, b.wrap_index(r, height), b.wrap_index(c, width)]  # (clamped: read, then unused)
            else:
                at = [*lead, r, c]
            reads.append((inside, lambda k, at=at: read(k, at)))
    return reads


def _choose(b, reads: list, values: list):
    """Fold one window's reads into its winner: a list, per entry of `values` (a function
    of the offset number and the element's reader giving a scalar), of the winner's. The
    first element inside the input is taken whatever it is; each later one takes over when
    greater than the best so far, or NaN (PyTorch's rule)."""
    best, chosen, found = None, None, None
    for number, (inside, reader) in enumerate(reads):
        value = reader(0)
        candidates = [make(number, reader) for make in values]
        if best is None:  # (the window's first element: inside the input unless padded)
            best, chosen = value, candidates
            found = inside
            continue
        takes = b.ir.or_(b.compare(">", value, best), b.is_nan(value))
        if found is not None:
            takes = b.ir.and_(inside, b.ir.or_(takes, b.ir.not_(found)))
            found = b.ir.or_(found, inside)
        best = b.select(takes, value, best)
        chosen = [b.select(takes, new, old) for new, old in zip(candidates, chosen)]
    return chosen


def _select_lower(b, read, index, in_types, out_type, kernel, stride, dilation, padding):
    *lead, oh, ow = index
    reads = _window_reads(b, read, lead, b.affine(oh, 0, stride[0]), b.affine(ow, 0, stride[1]), in_types[0],
                          kernel, dilation, padding)
    (chosen,) = _choose(b, reads, [lambda number, reader: reader(1)])
    return chosen


def _covering(b, position, kernel: int, stride: int, dilation: int, count: int) -> list:
    """The windows along one axis that may cover `position` (of the padded input), in
    window order: (whether one does, the window clamped into [0, count), the number of the
    offset at which it holds `position`)."""
    extent = (kernel - 1) * dilation + 1
    last = position if stride == 1 else b.ir.sdiv(position, b.index_const(stride))  # (position >= 0: floor)
    found = []
    for k in range(-(-extent // stride)):  # the window k before the last one starting at or before position
        window = b.ir.sub(last, b.index_const(k)) if k else last
        offset = b.ir.sub(position, b.affine(window, 0, stride))
        inside = b.ir.and_(b.ir.and_(b.ir.icmp_signed(">=", window, b.index_const(0)),
                                     b.ir.icmp_signed("<", window, b.index_const(count))),
                           b.ir.icmp_signed("<", offset, b.index_const(extent)))
        if dilation != 1:
            inside = b.ir.and_(inside, b.ir.icmp_signed("==", b.ir.srem(offset, b.index_const(dilation)),
                                                        b.index_const(0)))
        number = offset if dilation == 1 else b.ir.sdiv(offset, b.index_const(dilation))
        found.append((inside, b.ir.select(inside, window, b.index_const(0)), number))
    return found[::-1]


def _scatter_lower(b, read, index, in_types, out_type, kernel, stride, dilation, padding):
    """pixel (h, w) = the sum, over the windows covering it in window order (as
    `_scatter_impl` and PyTorch add), of the window's g where the pixel is the window's
    winner (found again from x)."""
    *lead, h, w = index
    out_h, out_w = in_types[1].shape[-2:]
    rows = _covering(b, b.affine(h, padding[0], 1), kernel[0], stride[0], dilation[0], out_h)
    columns = _covering(b, b.affine(w, padding[1], 1), kernel[1], stride[1], dilation[1], out_w)
    zero = b.const(0, out_type.dtype)
    total = zero
    for row_inside, row, row_number in rows:
        for column_inside, column, column_number in columns:
            reads = _window_reads(b, read, lead, b.affine(row, 0, stride[0]), b.affine(column, 0, stride[1]),
                                  in_types[0], kernel, dilation, padding)
            (winner,) = _choose(b, reads, [lambda number, reader: b.index_const(number)])
            mine = b.ir.add(b.ir.mul(row_number, b.index_const(kernel[1])), column_number)
            hit = b.ir.and_(b.ir.and_(row_inside, column_inside), b.ir.icmp_signed("==", winner, mine))
            total = b.add(total, b.select(hit, read(1, [*lead, row, column]), zero))
    return total


def _scatter_lowers(node) -> bool:
    attrs = node.attrs
    windows = 1
    for kernel, stride, dilation in zip(attrs["kernel"], attrs["stride"], attrs["dilation"]):
        windows *= -(-((kernel - 1) * dilation + 1) // stride)
    return windows * attrs["kernel"][0] * attrs["kernel"][1] <= MAX_LOWERED_READS


def _select_probe(k: int, offsets: np.ndarray, kernel, stride, dilation, padding) -> np.ndarray:
    """Each window's first element inside the input (a window's reads run as it does)."""
    height, width = offsets.shape[-2:]
    out_h, out_w = _counts(offsets.shape, kernel, stride, dilation, padding)
    rows = np.clip(np.arange(out_h) * stride[0] - padding[0], 0, height - 1)
    columns = np.clip(np.arange(out_w) * stride[1] - padding[1], 0, width - 1)
    return offsets[..., rows[:, None], columns[None, :]]


def _scatter_probe(k: int, offsets: np.ndarray, **attrs) -> np.ndarray | None:
    """A pixel reads x around itself (its windows); g's reads stand for nothing here."""
    return offsets if k == 0 else None


WINDOW_SELECT = Primitive(
    "window_select", shape_rule=_select_rule, impl=_select_impl, kind=OTHER, lower_indexed=_select_lower,
    read_probe=_select_probe, saves_inputs=(0,), saved_for={1: (0,)}, backward_name="MaxPool2DWithIndicesBackward",
    vjp=lambda ctx, g: (None, window_scatter(ctx.inputs[0], g, **ctx.attrs)))

WINDOW_SCATTER = Primitive(
    "window_scatter", shape_rule=_scatter_rule, impl=_scatter_impl, kind=OTHER, lower_indexed=_scatter_lower,
    lowers=_scatter_lowers, read_probe=_scatter_probe, saves_inputs=(0,), saved_for={1: (0,)},
    backward_name="MaxPool2DWithIndicesBackwardBackward",
    vjp=lambda ctx, g: (None, window_select(ctx.inputs[0], g, **ctx.attrs)))


def window_select(x, v, kernel, stride, dilation, padding=(0, 0)):
    """Per window of x's last two dims (padded), v's element where x has its winner."""
    return bind(WINDOW_SELECT, (x, v), {"kernel": tuple(kernel), "stride": tuple(stride),
                                        "dilation": tuple(dilation), "padding": tuple(padding)})


def window_scatter(x, g, kernel, stride, dilation, padding=(0, 0)):
    """x's shape, with each window's g at x's winner of the window (summed where windows overlap)."""
    return bind(WINDOW_SCATTER, (x, g), {"kernel": tuple(kernel), "stride": tuple(stride),
                                         "dilation": tuple(dilation), "padding": tuple(padding)})
