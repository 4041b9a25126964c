"""Convolution products that read their image where it is (implicit im2col).

A convolution is im2col (every window of a channels-last image as a row) and one GEMM; its
weight gradient is a GEMM of the same windows. Written out, the windows are KH*KW times
the image: W9's second convolution writes 42 MB of them per step, and its two products
read them back. `gather_windows` rewrites a program's graph, before fusion, so that each
such product (a matmul of `reshape(im2col(x))`, on its left or its right) becomes one
`window_product(x, other)` node (`ops/window.py`), and `WindowProductStep` runs it with the
generated GEMM reading x through two offset tables (`gemm.Gathered`: a window row's start,
a (kh, kw, channel) column's offset). The image gets a buffer of its own, in its own
channels-last order (`Primitive.own_layout_inputs`), so each window row is runs of
contiguous channels that packing loads as vectors. The values are those of the GEMM on the
written-out windows: packing copies the same elements into the same panels.

A product is rewritten only where that pays and the packing reads the image in runs:
float32/float64, at least MIN_WORK multiply-adds, a window's columns in a channels-last
buffer running through consecutive elements in the groups the packing loads as vectors
(`gemm.columns_in_runs`), and every reader of the windows such a product (else they are
written out anyway, and read in order where they are).
"""

from __future__ import annotations

import math

import numpy as np

from tracegrad.codegen import gemm
from tracegrad.ir import types
from tracegrad.ir.graph import Graph, Node, Value
from tracegrad.ir.primitive import MATMUL
from tracegrad.ops.movement import RESHAPE
from tracegrad.ops.window import IM2COL, WINDOW_PRODUCT, window_count, window_matrix
from tracegrad.runtime.buffers import take_buffer
from tracegrad.runtime.program import NumpyStep

MIN_WORK = 1 << 22  # multiply-adds from which a product of windows reads its image in place
DTYPES = (types.float32, types.float64)
TABLES_KEPT = 8  # image geometries whose offset tables a step keeps
OPERAND = {"left": "a", "right": "b"}  # the GEMM operand the windows are, by their side


def gather_windows(graph: Graph) -> Graph:
    """`graph` as the fusion planner sees it: each product of convolution windows that
    qualifies made a `window_product` node standing in for the matmul (its output is the
    matmul's value, so every other node reads it unchanged), and the im2col and its
    reshapes dropped; the graph itself when no product qualifies."""
    readers: dict[Value, list[Node]] = {}
    for node in graph.nodes:
        for value in node.inputs:
            readers.setdefault(value, []).append(node)
    outputs = set(graph.outputs)
    products: dict[int, Node] = {}  # id(matmul) -> its window_product
    dropped: set[int] = set()
    for node in graph.nodes:
        if node.op is IM2COL:
            found = _window_products(node, readers, outputs)
            if found is not None:
                dropped.update(found[0])
                products.update(found[1])
    if not products:
        return graph
    nodes = [products.get(id(node), node) for node in graph.nodes if id(node) not in dropped]
    return Graph(list(graph.inputs), nodes, list(graph.outputs), graph.name)


class _ProductNode(Node):
    """A `window_product` node standing in for the matmul it computes: its output is the
    matmul's value (`output`), so the nodes reading the product are the graph's own."""

    __slots__ = ("product",)

    def __init__(self, product: Node, inputs: tuple[Value, ...], attrs: dict):
        super().__init__(WINDOW_PRODUCT, inputs, attrs, product.out_types, product._location)
        self.product = product

    def output(self, index: int = 0) -> Value:
        return self.product.output(index)


def _window_products(im2col: Node, readers: dict, outputs: set) -> tuple[set, dict] | None:
    """(ids of the nodes dropped: im2col and its reshapes; {id(matmul): its window_product})
    when every reader of the windows is a reshape to the window matrix read only by 2-D
    products that qualify; None otherwise."""
    windows = im2col.output(0)
    dtype = windows.type.dtype
    if dtype not in DTYPES or windows in outputs or not readers.get(windows):
        return None
    batch, out_h, out_w, kernel_h, kernel_w, channels = windows.type.shape
    matrix = (batch * out_h * out_w, kernel_h * kernel_w * channels)
    columns = _column_offsets(im2col.inputs[0].type.shape, im2col.attrs)  # (of a channels-last buffer)
    products, every = {}, True
    for reshape in readers[windows]:
        view = reshape.output(0)
        if reshape.op is not RESHAPE or view.type.shape != matrix or view in outputs:
            every = False
            continue
        for product in readers.get(view, []):
            side = _side(product, view)
            if (side is None or product.output(0) in outputs
                    or not gemm.columns_in_runs(columns, dtype.np, OPERAND[side])):
                every = False
                continue
            depth = matrix[1] if side == "left" else matrix[0]
            if math.prod(product.out_types[0].shape) * depth < MIN_WORK:
                every = False
                continue
            other = product.inputs[1] if side == "left" else product.inputs[0]
            products[id(product)] = _ProductNode(product, (im2col.inputs[0], other), dict(im2col.attrs, side=side))
    if not products or not every:
        return None  # (the windows are written out for another reader: products read them in place)
    return {id(im2col)} | {id(reshape) for reshape in readers[windows]}, products


def _side(product: Node, view: Value) -> str | None:
    """Which operand of a 2-D matmul the window matrix `view` is ("left": A, "right": B),
    or None (not a 2-D matmul, or the windows on both sides)."""
    if product.op.kind != MATMUL or len(product.inputs) != 2 or len(product.out_types[0].shape) != 2:
        return None
    left, right = product.inputs
    if left == view and right != view and right.type.ndim == 2:
        return "left"
    if right == view and left != view and left.type.ndim == 2:
        return "right"
    return None


def _column_offsets(image_shape: tuple, attrs: dict, strides: tuple | None = None) -> np.ndarray:
    """The window matrix's column offsets (per kh, kw, channel) in an image of `strides`
    (elements; by default a C-ordered, channels-last buffer)."""
    _, height, width, channels = image_shape
    _, s_h, s_w, s_c = strides if strides is not None else (height * width * channels, width * channels, channels, 1)
    (kernel_h, kernel_w), (dilation_h, dilation_w) = attrs["kernel"], attrs["dilation"]
    return (np.arange(kernel_h)[:, None, None] * (dilation_h * s_h)
            + np.arange(kernel_w)[None, :, None] * (dilation_w * s_w)
            + np.arange(channels)[None, None, :] * s_c).ravel()


class WindowProductStep(NumpyStep):
    """A `window_product` node: the generated GEMM reading the image through offset tables
    when the image's layout lets it (its channels in contiguous runs, `gemm.gatherable`),
    else the op's NumPy implementation (im2col, then the product)."""

    __slots__ = ("side", "out_shape", "out_dtype", "tables")
    uses_threads = True  # (at least MIN_WORK multiply-adds: `runtime.program.Program.wakes_worker`)
    owns_outputs = True

    def __init__(self, node: Node, inputs: tuple[int, ...], outputs: tuple[int, ...]):
        super().__init__(node, inputs, outputs)
        self.side = node.attrs["side"]
        out_type = node.out_types[0]
        self.out_shape, self.out_dtype = out_type.shape, out_type.dtype.np
        # For the timings' FLOP count (`runtime.program._traffic`): A's type gives K.
        self.op_kind = MATMUL
        image = node.inputs[0].type
        matrix = window_matrix(image, node.attrs["kernel"], node.attrs["stride"], node.attrs["dilation"])
        a_type = types.TensorType(matrix, image.dtype) if self.side == "left" else node.inputs[1].type
        self.flop_types = (out_type, a_type)
        self.tables: dict[tuple, gemm.Gathered | None] = {}  # image geometry -> its window matrix

    def run(self, slots: list, pool: dict | None = None) -> None:
        image, other = slots[self.inputs[0]], slots[self.inputs[1]]
        windows = self._windows(image)
        if windows is None:
            slots[self.outputs[0]] = self.impl(image, other, **self.attrs)
            return
        out = take_buffer(pool, self.out_shape, self.out_dtype)
        if self.side == "left":
            gemm.matmul_gathered(windows, other, out=out)
        else:
            gemm.matmul_gathered(other, windows, out=out)
        slots[self.outputs[0]] = out

    def _windows(self, image: np.ndarray) -> gemm.Gathered | None:
        """The window matrix of `image` as a gathered operand (its tables made once per
        geometry), or None when the GEMM cannot read it so."""
        key = (image.shape, image.strides, image.dtype)
        if key not in self.tables:
            if len(self.tables) >= TABLES_KEPT:
                self.tables.clear()  # (a step sees one geometry run after run: bounded all the same)
            self.tables[key] = _gathered(image, self.attrs, self.side)
        windows = self.tables[key]
        if windows is None:
            return None
        return windows.with_source(image)


def _gathered(image: np.ndarray, attrs: dict, side: str) -> gemm.Gathered | None:
    """The window matrix of `image` (B, H, W, C) read through offset tables, or None when
    its strides are not whole non-negative elements or the packing cannot load its runs."""
    size = image.itemsize
    if image.dtype not in gemm.SUPPORTED_DTYPES or any(s % size or s < 0 for s in image.strides):
        return None
    batch, height, width, _ = image.shape
    s_b, s_h, s_w, s_c = (s // size for s in image.strides)
    stride_h, stride_w = attrs["stride"]
    out_h, out_w = (window_count(n, k, s, d) for n, k, s, d in
                    zip((height, width), attrs["kernel"], attrs["stride"], attrs["dilation"]))
    rows = (np.arange(batch)[:, None, None] * s_b + np.arange(out_h)[None, :, None] * (stride_h * s_h)
            + np.arange(out_w)[None, None, :] * (stride_w * s_w)).ravel()
    windows = gemm.Gathered(image, rows, _column_offsets(image.shape, attrs, (s_b, s_h, s_w, s_c)))
    return windows if gemm.gatherable(windows, OPERAND[side]) else None
