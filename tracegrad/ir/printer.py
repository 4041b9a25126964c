"""The text format of the IR: one line per node, SSA names, types like `f32[32,784]`,
attributes, and the user's `file:line` that created the node.

`format_graph` prints a graph; `tracegrad.ir.parser.parse` reads the same text back, so
every attribute prints in a form that parses to an equal value (see docs/ir.md).
"""

from __future__ import annotations

import json
import re

import numpy as np

from tracegrad.ir.graph import Graph, Value

# Column where the `# file:line` comment starts (node text is padded to this width).
LOCATION_COLUMN = 60
_NAME_CHARS = re.compile(r"[^\w.]")


def format_attr(value) -> str:
    """An attribute value as text: `[1,0]`, `f32`, `true`, `none`, `1.0`, `inf`, `"text"`."""
    if isinstance(value, (tuple, list)):
        return "[" + ",".join(format_attr(v) for v in value) + "]"
    if hasattr(value, "short") and hasattr(value, "np"):  # a DType
        return value.short
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


class _Names:
    def __init__(self):
        self.names: dict[Value, str] = {}
        self.taken: set[str] = set()
        self.counter = 0

    def define(self, value: Value, hint: str | None = None) -> str:
        if hint is None:
            while str(self.counter) in self.taken:  # an input may be named like a result
                self.counter += 1
            name = str(self.counter)
            self.counter += 1
        else:
            hint = _NAME_CHARS.sub("_", hint) or "_"
            name, suffix = hint, 1
            while name in self.taken:
                name, suffix = f"{hint}.{suffix}", suffix + 1
        self.taken.add(name)
        self.names[value] = "%" + name
        return self.names[value]

    def __getitem__(self, value: Value) -> str:
        return self.names[value]


def input_hint(graph: Graph, position: int) -> str:
    value = graph.inputs[position]
    return value.name or (f"leaf{position}" if value.leaf is not None else f"in{position}")


def value_names(graph: Graph) -> dict[Value, str]:
    """The printed name (`%x`, `%3`) of every input and node output of `graph`."""
    names = _Names()
    for i, value in enumerate(graph.inputs):
        names.define(value, input_hint(graph, i))
    for node in graph.nodes:
        for i in range(len(node.out_types)):
            names.define(node.output(i))
    return names.names


def format_node(node, names) -> str:
    """One node line (without the leading indent and location), e.g. `%2: f32[4] = exp(%1)`."""
    lhs = ", ".join(f"{names[node.output(i)]}: {t}" for i, t in enumerate(node.out_types))
    args = [names[v] for v in node.inputs]
    args += [f"{key}={format_attr(val)}" for key, val in node.attrs.items()]
    return f"{lhs} = {node.op.name}({', '.join(args)})"


def format_graph(graph: Graph) -> str:
    names = value_names(graph)
    params = ", ".join(f"{names[v]}: {v.type}" for v in graph.inputs)
    lines = [f"graph {graph.name}({params}) {{"]
    for node in graph.nodes:
        line = "  " + format_node(node, names)
        if node.location:
            line = f"{line:<{LOCATION_COLUMN}} # {node.location}"
        lines.append(line)
    line = f"  return ({', '.join(names[v] for v in graph.outputs)})"
    output_names = getattr(graph, "output_names", None)
    if output_names:  # what each output is: `result`, `model.fc.weight.grad`, ...
        line = f"{line:<{LOCATION_COLUMN}} # {', '.join(_NAME_CHARS.sub('_', n) or '-' for n in output_names)}"
    lines.append(line)
    lines.append("}")
    return "\n".join(lines)
