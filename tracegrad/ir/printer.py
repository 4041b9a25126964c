"""The text format of the IR: one line per node, SSA names, types like `f32[32,784]`,
attributes, and the user's `file:line` that created the node."""

from __future__ import annotations

from tracegrad.ir.graph import Graph, Value


def _format_attr(value) -> str:
    if isinstance(value, tuple):
        return "[" + ",".join(_format_attr(v) for v in value) + "]"
    if hasattr(value, "short") and hasattr(value, "np"):  # a DType
        return value.short
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


class _Names:
    def __init__(self):
        self.names: dict[Value, str] = {}
        self.taken: set[str] = set()
        self.counter = 0

    def define(self, value: Value, hint: str | None = None) -> str:
        if hint is None:
            name = str(self.counter)
            self.counter += 1
        else:
            name, suffix = hint, 1
            while name in self.taken:
                name, suffix = f"{hint}.{suffix}", suffix + 1
        self.taken.add(name)
        self.names[value] = "%" + name
        return self.names[value]

    def __getitem__(self, value: Value) -> str:
        return self.names[value]


def format_graph(graph: Graph) -> str:
    names = _Names()
    params = []
    for i, value in enumerate(graph.inputs):
        hint = value.name or (f"leaf{i}" if value.leaf is not None else f"in{i}")
        params.append(f"{names.define(value, hint)}: {value.type}")
    lines = [f"graph {graph.name}({', '.join(params)}) {{"]
    for node in graph.nodes:
        outs = [node.output(i) for i in range(len(node.out_types))]
        lhs = ", ".join(f"{names.define(v)}: {v.type}" for v in outs)
        args = [names[v] for v in node.inputs]
        args += [f"{key}={_format_attr(val)}" for key, val in node.attrs.items()]
        line = f"  {lhs} = {node.op.name}({', '.join(args)})"
        if node.location:
            line = f"{line:<60} # {node.location}"
        lines.append(line)
    lines.append(f"  return ({', '.join(names[v] for v in graph.outputs)})")
    lines.append("}")
    return "\n".join(lines)
