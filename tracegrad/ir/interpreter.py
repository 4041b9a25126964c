"""The NumPy interpreter: run a Graph on arrays with each primitive's NumPy implementation."""

from __future__ import annotations

import numpy as np

from tracegrad.ir.graph import Graph, Value


def interpret(graph: Graph, inputs: dict[Value, np.ndarray] | list[np.ndarray]) -> list[np.ndarray]:
    """Evaluate `graph`; `inputs` maps input values to arrays (or lists them in order)."""
    env: dict[Value, np.ndarray] = {}
    if isinstance(inputs, dict):
        env.update(inputs)
    else:
        if len(inputs) != len(graph.inputs):
            raise ValueError(f"interpret: graph {graph.name} takes {len(graph.inputs)} inputs, "
                             f"got {len(inputs)}")
        env.update(zip(graph.inputs, inputs))
    for value in graph.inputs:
        if value not in env:
            raise ValueError(f"interpret: no array bound to input {value.name or value}")
    for node in graph.nodes:
        result = node.op.impl(*(env[v] for v in node.inputs), **node.attrs)
        if node.op.num_outputs == 1:
            result = (result,)
        for index, array in enumerate(result):
            env[node.output(index)] = np.asarray(array)
    return [env[v] for v in graph.outputs]
