"""Graphviz export: `to_dot(graph)` gives DOT text (one box per node, the fusion groups of
the code generator as clusters), `render(obj, "graph.svg")` runs Graphviz's `dot` on it.

The IR knows no code generator: the fusion planner registers itself here
(`set_kernel_planner`, done by `tracegrad.codegen.fusion` when it is imported).

Nothing here needs Graphviz except `render`, which says how to install it when the `dot`
program is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from tracegrad.ir.graph import Graph
from tracegrad.ir.printer import format_attr, value_names

INSTALL_HINT = ("tracegrad.ir.render needs Graphviz's `dot` program, which was not found on PATH. "
                "Install Graphviz (Debian/Ubuntu: `sudo apt-get install graphviz`; macOS: "
                "`brew install graphviz`; conda: `conda install -c conda-forge graphviz`; "
                "Windows: https://graphviz.org/download/), or write `graph.to_dot()` to a .dot "
                "file and render it elsewhere.")


class GraphvizNotFoundError(RuntimeError):
    """Graphviz's `dot` program is not installed."""


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


_kernel_planner = None  # graph -> its fused kernels (objects with nodes, reduction, name)


def set_kernel_planner(planner) -> None:
    """Register `planner(graph)`, which lists the fused kernels `to_dot` draws as clusters."""
    global _kernel_planner
    _kernel_planner = planner


def to_dot(graph: Graph, kernels=True) -> str:
    """DOT text of `graph`. `kernels`: True to cluster nodes by the fusion plan of `graph`,
    False for none, or the fused kernels to draw (objects with `nodes`, `reduction`, `name`)."""
    names = value_names(graph)
    ids = {id(node): f"n{i}" for i, node in enumerate(graph.nodes)}
    lines = [f"digraph {_quote(graph.name)} {{",
             '  node [shape=box, fontname="monospace", fontsize=10];',
             '  edge [fontname="monospace", fontsize=9];']
    for i, value in enumerate(graph.inputs):
        lines.append(f"  in{i} [shape=ellipse, label={_quote(f'{names[value]}: {value.type}')}];")
    outputs = set(graph.outputs)
    for node in graph.nodes:
        results = ", ".join(f"{names[node.output(i)]}: {t}" for i, t in enumerate(node.out_types))
        attrs = ", ".join(f"{k}={format_attr(v)}" for k, v in node.attrs.items())
        label = f"{results}\n{node.op.name}" + (f"({attrs})" if attrs else "")
        if node.location:
            label += f"\n{node.location}"
        is_output = any(node.output(i) in outputs for i in range(len(node.out_types)))
        style = ", penwidth=2" if is_output else ""
        lines.append(f"  {ids[id(node)]} [label={_quote(label)}{style}];")
    lines += _clusters(graph, kernels, ids)
    input_ids = {id(v): f"in{i}" for i, v in enumerate(graph.inputs)}
    for node in graph.nodes:
        for value in node.inputs:
            source = input_ids[id(value)] if value.node is None else ids.get(id(value.node))
            if source is not None:
                lines.append(f"  {source} -> {ids[id(node)]} [label={_quote(str(value.type))}];")
    lines.append(f"  return [shape=plaintext, label={_quote('return')}];")
    for position, value in enumerate(graph.outputs):
        source = input_ids.get(id(value)) if value.node is None else ids.get(id(value.node))
        if source is not None:
            lines.append(f"  {source} -> return [style=dashed, label={_quote(str(position))}];")
    lines.append("}")
    return "\n".join(lines)


def _clusters(graph: Graph, kernels, ids: dict[int, str]) -> list[str]:
    if kernels is False or kernels is None:
        return []
    if kernels is True:
        if _kernel_planner is None:
            return []
        kernels = _kernel_planner(graph)
    lines = []
    for position, step in enumerate(kernels):
        members = [ids[id(n)] for n in step.nodes if id(n) in ids]
        if step.reduction is not None and id(step.reduction) in ids and ids[id(step.reduction)] not in members:
            members.append(ids[id(step.reduction)])
        name = step.name or f"kernel{position}"
        lines.append(f"  subgraph cluster_{position} {{")
        lines.append(f"    label={_quote(name)}; style=rounded; color=blue;")
        lines.append(f"    {'; '.join(members)};")
        lines.append("  }")
    return lines


def dot_text(obj) -> str:
    """DOT text for a Graph, a tensor with a recorded graph, an explain report, or DOT text."""
    if isinstance(obj, str):
        return obj
    if isinstance(obj, Graph):
        return to_dot(obj)
    if hasattr(obj, "to_dot"):
        return obj.to_dot()
    if hasattr(obj, "_grad_fn"):
        if obj._value is None or obj._grad_fn is None:
            raise ValueError("render: the tensor has no recorded graph (it is a leaf or does not require grad)")
        return to_dot(Graph.from_outputs([obj._value], name="eager"))
    raise TypeError(f"render: cannot draw a {type(obj).__name__}; pass a Graph, a Tensor or an explain report")


def render(obj, path: str, format: str | None = None) -> str:  # noqa: A002 - Graphviz's word
    """Draw `obj` (see `dot_text`) to `path`; the format is the file extension (svg, png,
    pdf, ...) unless given. A `.dot` path gets the DOT text without running Graphviz.
    Returns `path`."""
    text = dot_text(obj)
    format = format or os.path.splitext(path)[1].lstrip(".") or "svg"
    if format == "dot":
        with open(path, "w") as f:
            f.write(text + "\n")
        return path
    program = shutil.which("dot")
    if program is None:
        raise GraphvizNotFoundError(INSTALL_HINT)
    completed = subprocess.run([program, f"-T{format}", "-o", path], input=text.encode(),
                               capture_output=True)
    if completed.returncode != 0:
        raise RuntimeError(f"Graphviz dot failed (exit {completed.returncode}): "
                           f"{completed.stderr.decode(errors='replace').strip()}")
    return path
