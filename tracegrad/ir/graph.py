"""The IR: `Value`, `Node` and `Graph`.

One IR serves every stage. Eager execution records `Node`s (a tensor's `grad_fn` is
one); tracing (the backward transform, later the compiler) appends nodes to an explicit
`Graph`. A node names its primitive, its input values, its attributes, its output types
and the user's source line that created it. Nodes do not reference their outputs, so an
eager graph has no reference cycles and is freed as soon as its tensors die.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any
from collections.abc import Iterable

from tracegrad.ir.types import TensorType


class Value:
    """An SSA value: output `index` of `node`, or a graph input when `node` is None.

    Two values are equal when they are the same output of the same node, so a node's
    output can be re-created (e.g. from a saved tensor) without losing its identity.
    """

    __slots__ = ("type", "node", "index", "name", "leaf", "origin", "strides")

    def __init__(self, type: TensorType, node: Node | None = None, index: int = 0,
                 name: str | None = None, leaf: Any = None):
        self.type = type
        self.node = node
        self.index = index
        self.name = name
        self.leaf = leaf  # a weakref to the leaf tensor whose .grad this input feeds
        # The autograd value this value stands for, where the gradients reaching it go on
        # (`autodiff.reverse_mode`): for a graph input reading a real tensor with a recorded
        # history (a compiled call's argument computed eagerly), that tensor's; for a
        # tensor's new value after an in-place update without grad, the tensor's before.
        # Never itself a value with an origin.
        self.origin = None
        # The strides (in elements) eager execution gives the tensor this value stands for,
        # where they are not the ones its op makes: a tensor written in place keeps its
        # layout (`ops.layout.value_strides`). None: its op's.
        self.strides = None

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if self.node is None or not isinstance(other, Value):
            return False
        return self.node is other.node and self.index == other.index

    def __hash__(self) -> int:
        if self.node is None:
            return id(self)
        return hash((id(self.node), self.index))

    def __repr__(self) -> str:
        where = f"{self.node.op.name}#{self.index}" if self.node is not None else "input"
        return f"Value({self.type}, {where})"


class Node:
    """One primitive application. `saved` and `needs_input_grad` are set when the node is
    recorded for autograd (eager `grad_fn`); `saved` is freed after backward."""

    __slots__ = ("op", "inputs", "attrs", "out_types", "_location", "saved",
                 "needs_input_grad", "hooks", "__weakref__")

    def __init__(self, op, inputs: tuple[Value, ...], attrs: dict, out_types: tuple[TensorType, ...],
                 location: str | tuple = ""):
        self.op = op
        self.inputs = inputs
        self.attrs = attrs
        self.out_types = out_types
        self._location = location  # `file:line`, or `user_line`'s parts of it (formatted when read)
        self.saved = None
        self.needs_input_grad: tuple[bool, ...] = ()
        self.hooks = None

    @property
    def location(self) -> str:
        """`file:line` of the user's code that made this node ("" when unknown)."""
        location = self._location
        if location.__class__ is not str:
            location = self._location = _format_line(*location)
        return location

    @location.setter
    def location(self, location: str) -> None:
        self._location = location

    def output(self, index: int = 0) -> Value:
        return Value(self.out_types[index], self, index)

    def name(self) -> str:
        """PyTorch-style grad_fn name, e.g. `MulBackward`."""
        return self.op.backward_name

    def __repr__(self) -> str:
        return f"<{self.name()} object>"

    # PyTorch users walk graphs with grad_fn.next_functions; give them the same view.
    @property
    def next_functions(self) -> tuple:
        result = []
        for value, needed in zip(self.inputs, self.needs_input_grad or (False,) * len(self.inputs)):
            if not needed:
                result.append((None, 0))
            elif value.node is not None:
                result.append((value.node, value.index))
            else:
                result.append((AccumulateGrad(value), 0))
        return tuple(result)


class AccumulateGrad:
    """What `next_functions` shows for a leaf, as in PyTorch."""

    next_functions: tuple = ()  # (a leaf's gradient goes nowhere further)

    def __init__(self, value: Value):
        self.variable = value.leaf() if value.leaf is not None else None

    def name(self) -> str:
        return "AccumulateGrad"

    def __repr__(self) -> str:
        return "<AccumulateGrad object>"


class Graph:
    """An explicit graph: input values, nodes in a valid execution order, output values."""

    def __init__(self, inputs: list[Value] | None = None, nodes: list[Node] | None = None,
                 outputs: list[Value] | None = None, name: str = "graph"):
        self.inputs = inputs if inputs is not None else []
        self.nodes = nodes if nodes is not None else []
        self.outputs = outputs if outputs is not None else []
        self.name = name

    def add_input(self, type: TensorType, name: str | None = None) -> Value:
        value = Value(type, None, 0, name)
        self.inputs.append(value)
        return value

    def add_node(self, node: Node) -> None:
        self.nodes.append(node)

    def __str__(self) -> str:
        from tracegrad.ir.printer import format_graph
        return format_graph(self)

    def __eq__(self, other: object) -> bool:
        """Structural equality: the two graphs print the same (see `tracegrad.ir.equality`)."""
        if not isinstance(other, Graph):
            return NotImplemented
        from tracegrad.ir.equality import graphs_equal
        return self is other or graphs_equal(self, other)

    # Graphs are mutable and hash by identity; `==` compares structure.
    __hash__ = object.__hash__

    def to_dot(self, kernels: bool = True) -> str:
        """Graphviz DOT text of this graph; with `kernels`, fusion groups are clusters."""
        from tracegrad.ir.dot import to_dot
        return to_dot(self, kernels=kernels)

    @staticmethod
    def from_outputs(outputs: Iterable[Value], name: str = "graph") -> Graph:
        """Collect the nodes that `outputs` depend on (an eager recorded graph) into a Graph."""
        outputs = list(outputs)
        order: list[Node] = []
        inputs: list[Value] = []
        expanded: set[int] = set()
        seen_inputs: set[int] = set()
        # Iterative post-order DFS: recorded graphs can be deeper than Python's recursion
        # limit. A node is appended after all of its inputs' producers (DAG, so a node that
        # is expanded but unfinished is always on the current path).
        stack: list[tuple[Value, bool]] = [(v, False) for v in reversed(outputs)]
        while stack:
            value, finished = stack.pop()
            node = value.node
            if finished:
                order.append(node)
                continue
            if node is None:
                if id(value) not in seen_inputs:
                    seen_inputs.add(id(value))
                    inputs.append(value)
                continue
            if id(node) in expanded:
                continue
            expanded.add(id(node))
            stack.append((value, True))
            for v in reversed(node.inputs):
                stack.append((v, False))
        return Graph(inputs, order, outputs, name)


def attr_key(attrs: dict) -> tuple:
    """A node's attributes as a hashable, order-independent key (lists become tuples).
    Floats that `==` cannot tell apart get a marker: -0.0 equals 0.0 but divides to -inf,
    and NaN equals nothing, so neither may be merged with, or miss, another node's key."""
    items = sorted(attrs.items())  # names are unique, so values are never compared
    for _, v in items:
        if isinstance(v, list) or (isinstance(v, float) and (v == 0.0 or v != v)):
            return tuple((k, _attr_part(v)) for k, v in items)
    return tuple(items)


def _attr_part(value):
    if isinstance(value, list):
        return tuple(_attr_part(v) for v in value)
    if isinstance(value, float):
        if value != value:
            return ("float", "nan")
        if value == 0.0 and math.copysign(1.0, value) < 0:
            return ("float", "-0.0")
    return value


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_file_labels: dict[str, str | None] = {}  # filename -> basename, or None inside tracegrad


def user_line(skip: int = 0) -> tuple | str:
    """`user_location(skip)` as the parts it is formatted from: (file label, code, offset of
    the frame's last instruction), or "". What every eager op records: the line number (a
    search of the code's line table) and the text are made only when the node's location
    is read (`Node.location`, `_format_line`)."""
    frame = sys._getframe(1 + skip)
    labels = _file_labels
    while frame is not None:
        filename = frame.f_code.co_filename
        label = labels.get(filename, "")
        if label == "":
            label = None if filename.startswith(_PACKAGE_DIR) else os.path.basename(filename)
            labels[filename] = label
        if label is not None:
            return (label, frame.f_code, frame.f_lasti)
        frame = frame.f_back
    return ""


def _format_line(label: str, code, offset: int) -> str:
    """`label:line` of the instruction at `offset` in `code`, the line `f_lineno` gives."""
    for start, end, line in code.co_lines():
        if start <= offset < end:
            return f"{label}:{line}"
    return f"{label}:None"


def user_location(skip: int = 0) -> str:
    """`file:line` of the innermost frame outside the tracegrad package. `skip`: how many
    frames above the caller's are tracegrad's for sure (`sys._getframe` passes over them
    without creating their frame objects, which is most of this function's cost)."""
    frame = sys._getframe(1 + skip)
    labels = _file_labels
    while frame is not None:
        filename = frame.f_code.co_filename
        label = labels.get(filename, "")
        if label == "":
            label = None if filename.startswith(_PACKAGE_DIR) else os.path.basename(filename)
            labels[filename] = label
        if label is not None:
            return f"{label}:{frame.f_lineno}"
        frame = frame.f_back
    return ""
