"""Sliding-window primitives: `im2col` (every window of an image, as rows) and its
transpose `col2im` (windows summed back into the image); `window_product`, a product of
an image's windows (as im2col's rows) and a matrix, which only compiled programs make
(`codegen/window_products.py`: read through offset tables, the windows are never written).

Both work channels-last: an image is (B, H, W, C) and its windows are
(B, OH, OW, KH, KW, C), so the windows of one output position are one contiguous row of
KH*KW*C values (the operand of a convolution's single GEMM) and both ops read and write
along C, the contiguous axis. Window (oh, ow) at offset (kh, kw) reads the image at
(oh*stride + kh*dilation, ow*stride + kw*dilation) in H and W; padding is done before.

Both are linear and each is the other's gradient. Compiled, each element is one
expression of its index (`lower_indexed`), so im2col fuses the reads of its input (a
channels-first image permuted, an activation) and col2im sums the KH*KW overlapping
entries of each pixel in one pass instead of as KH*KW padded copies added up.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from tracegrad.ir.primitive import OTHER, Primitive
from tracegrad.ir.types import TensorType
from tracegrad.ops.dispatch import bind
from tracegrad.ops.linalg import _matmul_impl

# col2im unrolls its KH*KW window offsets per element; beyond this many it runs as NumPy.
MAX_UNROLLED_OFFSETS = 64


def window_count(size: int, kernel: int, stride: int, dilation: int) -> int:
    """How many windows fit along an axis of `size` (0 when none does)."""
    return max(0, (size - dilation * (kernel - 1) - 1) // stride + 1)


def _check_attrs(name: str, kernel, stride, dilation) -> None:
    for label, pair in (("kernel", kernel), ("stride", stride), ("dilation", dilation)):
        if len(pair) != 2 or min(pair) <= 0:
            raise RuntimeError(f"{name}: {label} must be two positive ints, got {list(pair)}")


def _im2col_rule(x: TensorType, kernel, stride, dilation):
    _check_attrs("im2col", kernel, stride, dilation)
    if x.ndim != 4:
        raise RuntimeError(f"im2col: expected a 4-D channels-last image (B, H, W, C), got "
                           f"{list(x.shape)}")
    batch, height, width, channels = x.shape
    out_h, out_w = (window_count(n, k, s, d) for n, k, s, d in zip((height, width), kernel, stride, dilation))
    if out_h == 0 or out_w == 0:
        raise RuntimeError(f"im2col: kernel {list(kernel)} with dilation {list(dilation)} does not fit "
                           f"in an image of {height}x{width} (input {list(x.shape)})")
    return (TensorType((batch, out_h, out_w, *kernel, channels), x.dtype),)


def _im2col_impl(x, kernel, stride, dilation):
    batch, height, width, channels = x.shape
    (kernel_h, kernel_w), (out_h, out_w) = kernel, (
        window_count(n, k, s, d) for n, k, s, d in zip((height, width), kernel, stride, dilation))
    x = np.ascontiguousarray(x)
    s_b, s_h, s_w, s_c = x.strides
    if channels >= 8:  # one strided copy: its inner loop runs along C
        windows = as_strided(x, (batch, out_h, out_w, kernel_h, kernel_w, channels),
                             (s_b, s_h * stride[0], s_w * stride[1], s_h * dilation[0], s_w * dilation[1], s_c),
                             writeable=False)
        return np.ascontiguousarray(windows)
    # Few channels (pooling, a first layer): one copy per offset runs along W instead.
    out = np.empty((batch, out_h, out_w, kernel_h, kernel_w, channels), x.dtype)
    for i in range(kernel_h):
        for j in range(kernel_w):
            top, left = i * dilation[0], j * dilation[1]
            out[:, :, :, i, j, :] = x[:, top:top + stride[0] * (out_h - 1) + 1:stride[0],
                                      left:left + stride[1] * (out_w - 1) + 1:stride[1], :]
    return out


def _im2col_lower(b, read, index, in_types, out_type, kernel, stride, dilation):
    batch, oh, ow, kh, kw, c = index
    row = b.ir.add(b.affine(oh, 0, stride[0]), b.affine(kh, 0, dilation[0]))
    column = b.ir.add(b.affine(ow, 0, stride[1]), b.affine(kw, 0, dilation[1]))
    return read(0, [batch, row, column, c])


def _col2im_rule(columns: TensorType, size, kernel, stride, dilation):
    _check_attrs("col2im", kernel, stride, dilation)
    if columns.ndim != 6:
        raise RuntimeError(f"col2im: expected 6-D windows (B, OH, OW, KH, KW, C), got "
                           f"{list(columns.shape)}")
    batch, out_h, out_w, kernel_h, kernel_w, channels = columns.shape
    expected = tuple(window_count(n, k, s, d) for n, k, s, d in zip(size, kernel, stride, dilation))
    if (kernel_h, kernel_w) != tuple(kernel) or (out_h, out_w) != expected:
        raise RuntimeError(f"col2im: windows {list(columns.shape)} do not match an image of "
                           f"{size[0]}x{size[1]} with kernel {list(kernel)}, stride {list(stride)}, "
                           f"dilation {list(dilation)} (expected {expected[0]}x{expected[1]} windows)")
    return (TensorType((batch, *size, channels), columns.dtype),)


def _col2im_impl(columns, size, kernel, stride, dilation):
    batch, out_h, out_w, kernel_h, kernel_w, channels = columns.shape
    out = np.zeros((batch, *size, channels), columns.dtype)
    for i in range(kernel_h):
        for j in range(kernel_w):
            top, left = i * dilation[0], j * dilation[1]
            out[:, top:top + stride[0] * (out_h - 1) + 1:stride[0],
                left:left + stride[1] * (out_w - 1) + 1:stride[1], :] += columns[:, :, :, i, j, :]
    return out


def _window_of(b, position, offset: int, step: int, count: int):
    """(whether window w = (position - offset) / step exists (0 <= w < count, exact
    division), w clamped into [0, count) so that the read stays in bounds)."""
    I64 = b.index_const
    shifted = b.ir.sub(position, I64(offset)) if offset else position
    window = shifted if step == 1 else b.ir.sdiv(shifted, I64(step))
    inside = b.ir.and_(b.ir.icmp_signed(">=", shifted, I64(0)), b.ir.icmp_signed("<", window, I64(count)))
    if step != 1:
        inside = b.ir.and_(inside, b.ir.icmp_signed("==", b.ir.srem(shifted, I64(step)), I64(0)))
    return inside, b.ir.select(inside, window, I64(0))


def _col2im_lower(b, read, index, in_types, out_type, size, kernel, stride, dilation):
    """pixel (h, w) = the sum over offsets (kh, kw) of window ((h - kh*d) / s, (w - kw*d) / s)
    where that window exists."""
    batch, h, w, c = index
    _, out_h, out_w, kernel_h, kernel_w, _ = in_types[0].shape
    zero = b.const(0, out_type.dtype)
    rows = [_window_of(b, h, i * dilation[0], stride[0], out_h) for i in range(kernel_h)]
    columns = [_window_of(b, w, j * dilation[1], stride[1], out_w) for j in range(kernel_w)]
    total = zero
    for i, (row_inside, row) in enumerate(rows):
        for j, (column_inside, column) in enumerate(columns):
            value = read(0, [batch, row, column, b.index_const(i), b.index_const(j), c])
            total = b.add(total, b.select(b.ir.and_(row_inside, column_inside), value, zero))
    return total


IM2COL = Primitive("im2col", shape_rule=_im2col_rule, impl=_im2col_impl, kind=OTHER,
                   lower_indexed=_im2col_lower, carried_dim=lambda x, out, dim, **attrs: {0: 0, 3: 5}.get(dim),
                   vjp=lambda ctx, g: (col2im(g, ctx.in_types[0].shape[1:3], **ctx.attrs),))

COL2IM = Primitive("col2im", shape_rule=_col2im_rule, impl=_col2im_impl, kind=OTHER,
                   lower_indexed=_col2im_lower, carried_dim=lambda x, out, dim, **attrs: {0: 0, 5: 3}.get(dim),
                   lowers=lambda node: node.attrs["kernel"][0] * node.attrs["kernel"][1] <= MAX_UNROLLED_OFFSETS,
                   vjp=lambda ctx, g: (im2col(g, ctx.attrs["kernel"], ctx.attrs["stride"], ctx.attrs["dilation"]),))


def im2col(x, kernel, stride, dilation):
    """Windows (B, OH, OW, KH, KW, C) of a channels-last image x (B, H, W, C)."""
    return bind(IM2COL, (x,), {"kernel": tuple(kernel), "stride": tuple(stride), "dilation": tuple(dilation)})


def col2im(columns, size, kernel, stride, dilation):
    """The image (B, H, W, C) of `size` (H, W) whose windows' entries `columns` add up."""
    return bind(COL2IM, (columns,), {"size": tuple(size), "kernel": tuple(kernel), "stride": tuple(stride),
                                     "dilation": tuple(dilation)})


def window_matrix(x: TensorType, kernel, stride, dilation) -> tuple[int, int]:
    """(rows, columns) of the windows of image `x` as a matrix: a row per output position
    (B*OH*OW), a column per (kh, kw, channel)."""
    batch, out_h, out_w, kernel_h, kernel_w, channels = _im2col_rule(x, kernel, stride, dilation)[0].shape
    return batch * out_h * out_w, kernel_h * kernel_w * channels


def _window_product_rule(x: TensorType, other: TensorType, kernel, stride, dilation, side: str):
    rows, columns = window_matrix(x, kernel, stride, dilation)
    if side == "left" and other.shape[:1] == (columns,) and other.ndim == 2 and other.dtype is x.dtype:
        return (TensorType((rows, other.shape[1]), x.dtype),)
    if side == "right" and other.shape[1:] == (rows,) and other.ndim == 2 and other.dtype is x.dtype:
        return (TensorType((other.shape[0], columns), x.dtype),)
    raise RuntimeError(f"window_product: expected the {side} operand of a ({rows}, {columns}) window matrix of "
                       f"{x} to be a 2-D {x.dtype.name} matrix that fits it, got {other}")


def _window_product_impl(x, other, kernel, stride, dilation, side):
    windows = _im2col_impl(x, kernel, stride, dilation)
    batch, out_h, out_w, kernel_h, kernel_w, channels = windows.shape
    windows = windows.reshape(batch * out_h * out_w, kernel_h * kernel_w * channels)
    return _matmul_impl(windows, other) if side == "left" else _matmul_impl(other, windows)


# reshape(im2col(x), (rows, columns)) @ other (side "left") or other @ that (side "right"):
# what a convolution's forward product and its weight gradient compute. Only a compiled
# program's graph holds it (`codegen/window_products.py` rewrites those products into it, after
# differentiation), so it has no gradient rule; its NumPy implementation is the reference.
WINDOW_PRODUCT = Primitive("window_product", shape_rule=_window_product_rule, impl=_window_product_impl,
                           kind=OTHER, own_layout_inputs=(0,))
