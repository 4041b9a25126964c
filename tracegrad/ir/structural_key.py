"""The compile cache's key: the exact structure of a graph, as a tuple.

    (input types, one part per node..., output references, input aliasing)

A node's part is (op name, attributes, input references); a reference to graph input k
is -(k + 1) (inputs are numbered in the order they were added), the j-th node output
is j. `structural_key` computes it for any graph; `KeyedGraph`, the graph a compile
trace records into, builds the same key while ops are recorded ("hash as you build"), so
looking a traced call up costs no walk over its graph.
"""

from __future__ import annotations

import numpy as np

from tracegrad.ir.graph import Graph, Node, Value, attr_key
from tracegrad.ir.types import TensorType


def _attrs_part(attrs: dict) -> tuple:
    return attr_key(attrs) if attrs else ()


def structural_key(graph: Graph, inputs: list[np.ndarray]) -> tuple:
    """Everything that changes the program: ops, attributes, wiring, input types, which
    inputs share memory, outputs. Used as the exact cache key (no hash-only matching)."""
    number: dict[int, int] = {id(v): -(i + 1) for i, v in enumerate(graph.inputs)}
    parts: list = [tuple((v.type.shape, v.type.dtype.name) for v in graph.inputs)]
    serial = 0
    for node in graph.nodes:
        parts.append((node.op.name, _attrs_part(node.attrs), tuple([_reference(number, v) for v in node.inputs])))
        number[id(node)] = serial
        serial += len(node.out_types)
    parts.append(tuple([_reference(number, v) for v in graph.outputs]))
    parts.append(alias_pattern(inputs))
    return tuple(parts)


def _reference(number: dict[int, int], value: Value) -> int:
    node = value.node
    if node is None:
        return number[id(value)]
    return number[id(node)] + value.index


def alias_pattern(arrays: list[np.ndarray]) -> tuple:
    """Groups of inputs backed by the same memory (by base buffer): for each input, the
    index of the first input with the same base."""
    owners: dict[int, int] = {}
    pattern = []
    try:
        for i, a in enumerate(arrays):
            if a.base is not None:  # a view (most inputs are not: one attribute read)
                a = owner(a)
            pattern.append(owners.setdefault(id(a), i))
    except AttributeError:  # not an ndarray nor a NumPy scalar: its own base
        owners.clear()
        pattern = [owners.setdefault(id(owner(a)), i) for i, a in enumerate(arrays)]
    return tuple(pattern)


def owner(array):
    """The array whose memory `array` views (`array` itself if it is not a view)."""
    while isinstance(array, np.ndarray) and array.base is not None:
        array = array.base
    return array


class KeyedGraph(Graph):
    """A graph that keeps its structural key up to date as inputs and nodes are added.
    Only `add_input` and `add_node` may grow it (the key would not see other changes)."""

    def __init__(self, name: str = "graph"):
        super().__init__(name=name)
        self._input_types: list[tuple] = []
        self._parts: list[tuple] = []
        self._number: dict[int, int] = {}
        self._serial = 0
        # Per node recorded for autograd: (its number, which inputs need grad, which saved
        # tensors are concrete); with the key above, all a traced backward depends on.
        self._grad_parts: list[tuple] = []

    def add_input(self, type: TensorType, name: str | None = None) -> Value:
        value = super().add_input(type, name)
        self._number[id(value)] = -len(self.inputs)
        self._input_types.append((type.shape, type.dtype.name))
        return value

    def add_node(self, node: Node) -> None:
        """Append `node`, after `bind` recorded it for autograd if it did."""
        self.nodes.append(node)
        number = self._number
        refs = []
        for value in node.inputs:
            source = value.node
            refs.append(number[id(value)] if source is None else number[id(source)] + value.index)
        attrs = node.attrs
        self._parts.append((node.op.name, attr_key(attrs) if attrs else (), tuple(refs)))
        serial = self._serial
        number[id(node)] = serial
        self._serial = serial + len(node.out_types)
        needs = node.needs_input_grad
        if needs:  # recorded for autograd
            saved = node.saved
            kinds = None
            if saved is not None:
                kinds = []
                for entry in saved:
                    kinds.append(None if entry is None else entry.lazy is None)
                kinds = tuple(kinds)
            self._grad_parts.append((serial, needs, kinds))

    def add_block(self, nodes: list[Node], parts: tuple) -> None:
        """Append `nodes` whose key parts are known already: `parts` must be what
        `add_node` would compute for them here (a replayed backward template, recorded
        against a graph with this same key so far, so its references come out the same)."""
        self.nodes.extend(nodes)
        self._parts.extend(parts)
        number = self._number
        serial = self._serial
        for node in nodes:
            number[id(node)] = serial
            serial += len(node.out_types)
        self._serial = serial

    def prefix(self, n_inputs: int, n_nodes: int) -> KeyedGraph:
        """A graph of this one's first `n_inputs` inputs and `n_nodes` nodes (the same
        objects), keyed as if only those had been added (where a replay that diverged from
        a recorded graph goes on: `jit.replay`)."""
        graph = KeyedGraph(self.name)
        graph.inputs = self.inputs[:n_inputs]
        graph.nodes = self.nodes[:n_nodes]
        graph._input_types = self._input_types[:n_inputs]
        graph._parts = self._parts[:n_nodes]
        number = graph._number
        for i, value in enumerate(graph.inputs):
            number[id(value)] = -(i + 1)
        serial = 0
        for node in graph.nodes:
            number[id(node)] = serial
            serial += len(node.out_types)
        graph._serial = serial
        graph._grad_parts = [part for part in self._grad_parts if part[0] < serial]
        return graph

    def key(self, outputs: list[Value], inputs: list[np.ndarray]) -> tuple:
        """`structural_key` of this graph with these outputs, fed with `inputs`."""
        number = self._number
        references = []
        for value in outputs:  # `_reference`, inlined: this runs on every compiled call
            node = value.node
            references.append(number[id(value)] if node is None else number[id(node)] + value.index)
        return (tuple(self._input_types), *self._parts, tuple(references), alias_pattern(inputs))
