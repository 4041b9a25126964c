"""The order of a map kernel's inner loops: the domain's axes after the first (which
stays outermost: threads split it), innermost last.

A map loop visits its domain in C order, so its outputs are written contiguously along
the last axis. A leaf read through a transpose (a convolution's product (N*H*W, C) read
as NCHW, a gradient NCHW read as NHWC for the weight's product) is then read with a
stride along that axis: one element per cache line, gathered, at a few GB/s. When more
of the kernel's full-size buffers (leaves read, and outputs written) run contiguously
along another axis than along the last, that axis becomes the innermost loop: the
transposed reads turn contiguous and the stores strided, which the core absorbs far
better than gathered loads (W9's NHWC->NCHW bias add: 0.99 -> 0.3 ms). The order never
changes what a kernel computes (each element is computed alone), and a kernel that
folds a reduction keeps C order (the order of its sums).

How a leaf is read is found by running the kernel's view ops on arrays of offsets: each
full-size leaf as `arange` through the movement ops' own NumPy implementations, to the
domain's shape; a stride is the offset difference between neighbours along an axis.
"""

from __future__ import annotations

import math

import numpy as np

from tracegrad.codegen.fusion import FusedKernel
from tracegrad.ir.primitive import ELEMENTWISE, MOVEMENT

PROBE_LIMIT = 1 << 23  # domains of more elements keep C order (the probe's arrays are that large)


def inner_order(kernel: FusedKernel) -> list[int]:
    """The domain's axes after the first, outermost loop first."""
    shape = kernel.domain
    order = list(range(1, len(shape)))
    if len(shape) < 3 or kernel.folded or math.prod(shape) > PROBE_LIMIT or shape[-1] == 1:
        return order
    last = len(shape) - 1
    votes = {axis: 0 for axis in order if shape[axis] > 1}
    votes[last] = len(kernel.outputs)  # outputs are stored in C order
    for offsets in _read_offsets(kernel):
        axis = _unit_stride_axis(offsets, shape)
        if axis in votes:
            votes[axis] += 1
    best = max(votes, key=lambda axis: (votes[axis], axis != last))
    if best == last or best == 0:
        return order
    order.remove(best)
    return order + [best]


def _unit_stride_axis(offsets: np.ndarray, shape: tuple[int, ...]) -> int | None:
    """The axis along which neighbouring elements of the domain read neighbouring elements
    of the leaf, if any."""
    origin = (0,) * len(shape)
    for axis, size in enumerate(shape):
        if size > 1:
            step = list(origin)
            step[axis] = 1
            if offsets[tuple(step)] - offsets[origin] == 1:
                return axis
    return None


def _read_offsets(kernel: FusedKernel) -> list[np.ndarray]:
    """For each way an output reads a full-size leaf through views and elementwise ops,
    the leaf's flat offset read at each element of the domain; and a larger leaf too
    where an op that reads it at other elements says which one stands for its reads
    (`Primitive.read_probe`: max pooling's windows)."""
    shape = kernel.domain
    size = math.prod(shape)
    # value -> {leaf: (offsets, whether they came through a read_probe)}
    carried: dict = {leaf: {leaf: (np.arange(leaf.type.numel, dtype=np.int64).reshape(leaf.type.shape), False)}
                     for leaf in kernel.leaves if leaf.type.shape and size <= leaf.type.numel <= PROBE_LIMIT}
    for node in kernel.nodes:
        if len(node.out_types) != 1:
            continue
        out = node.output(0)
        op = node.op
        if op.kind == MOVEMENT and op.lower_indexed is None:
            source = carried.get(node.inputs[0])
            if source:
                carried[out] = {leaf: (np.asarray(op.impl(offsets, **node.attrs)), probed)
                                for leaf, (offsets, probed) in source.items()}
        elif op.kind == ELEMENTWISE and op.lower_indexed is None:
            merged: dict = {}
            for value in node.inputs:
                if value.type.shape == out.type.shape:
                    merged.update(carried.get(value, {}))
            if merged:
                carried[out] = merged
        elif op.lower_indexed is not None and op.read_probe is not None:
            merged = {}
            for k, value in enumerate(node.inputs):
                for leaf, (offsets, _) in carried.get(value, {}).items():
                    read = op.read_probe(k, offsets, **node.attrs)
                    if read is not None:
                        merged[leaf] = (np.asarray(read), True)
            if merged:
                carried[out] = merged
    found = []
    for output in kernel.outputs:
        if output.type.shape == shape:
            found.extend(offsets for leaf, (offsets, probed) in carried.get(output, {}).items()
                         if offsets.shape == shape and (probed or leaf.type.numel == size))
    return found
