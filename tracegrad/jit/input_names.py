"""Names for the tensors a compiled function reads: Python parameter names for its
arguments, and attribute paths such as `model.fc.weight` for tensors it captured.

Argument names come from the function's signature once per compiled function. Captured
tensors are named only when a graph is shown (explain, TRACEGRAD_LOG, a cache-miss
reason): the modules, optimizers and tensors the function can reach through its closure
and globals are searched then, so tracing pays nothing for it.
"""

from __future__ import annotations

import inspect
import re

_AUTO_CAPTURE_NAME = re.compile(r"^c\d+$")
_UNSAFE = re.compile(r"[^\w.]")


def bound_module(fn):
    """The nn.Module whose method `fn` is, or None."""
    from tracegrad.nn.module import Module
    owner = getattr(fn, "__self__", None)
    return owner if isinstance(owner, Module) else None


def signature_target(fn):
    """The function whose signature names the arguments (`forward` for a module's call)."""
    module = bound_module(fn)
    return module.forward if module is not None else fn


class ArgumentNames:
    """Maps an argument's position or keyword to its graph input name."""

    def __init__(self, fn):
        self.positional: tuple[str, ...] = ()
        self.varargs: str | None = None
        self._first: dict[int, tuple[str, ...]] = {}
        try:
            parameters = inspect.signature(signature_target(fn)).parameters.values()
        except (TypeError, ValueError):
            return
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self.positional = tuple(p.name for p in parameters if p.kind in kinds)
        self.varargs = next((p.name for p in parameters if p.kind == inspect.Parameter.VAR_POSITIONAL), None)

    def first(self, count: int) -> tuple[str, ...]:
        """The names of the first `count` positional arguments (made once per count)."""
        names = self._first.get(count)
        if names is None:
            names = self._first[count] = tuple(self[i] for i in range(count))
        return names

    def __getitem__(self, position: int) -> str:
        if position < len(self.positional):
            return self.positional[position]
        if self.varargs is not None:
            return f"{self.varargs}.{position - len(self.positional)}"
        return f"arg{position}"


def _roots(fn) -> list[tuple[str, object]]:
    """(name, object) pairs the function can reach, most specific first."""
    owner = getattr(fn, "__self__", None)
    target = signature_target(fn)
    code_owner = getattr(target, "__func__", target)
    roots: list[tuple[str, object]] = []
    code = getattr(code_owner, "__code__", None)
    closure = getattr(code_owner, "__closure__", None) or ()
    if code is not None:
        for name, cell in zip(code.co_freevars, closure):
            try:
                roots.append((name, cell.cell_contents))
            except ValueError:  # an empty cell
                pass
    module_globals = getattr(code_owner, "__globals__", {})
    used = code.co_names if code is not None else ()
    roots += [(name, module_globals[name]) for name in used if name in module_globals]
    roots += [(name, value) for name, value in module_globals.items() if name not in used]
    if owner is not None:
        roots.append(("self", owner))
    return roots


def tensor_names(fn) -> dict[int, str]:
    """id(tensor) -> a readable path for the tensors reachable from `fn`."""
    from tracegrad.jit.function import CompiledModule
    from tracegrad.nn.module import Module
    from tracegrad.optim.optimizer import Optimizer
    from tracegrad.tensor import Tensor

    names: dict[int, str] = {}

    def name_tensor(tensor, path: str) -> None:
        names.setdefault(id(tensor), path)
        if isinstance(tensor._grad, Tensor):
            names.setdefault(id(tensor._grad), f"{path}.grad")

    optimizers = []
    for root, value in _roots(fn):
        if isinstance(value, CompiledModule):
            value = value._module
        if isinstance(value, Tensor):
            name_tensor(value, root)
        elif isinstance(value, Module):
            for path, param in value.named_parameters():
                name_tensor(param, f"{root}.{path}")
            for path, buffer in value.named_buffers():
                name_tensor(buffer, f"{root}.{path}")
        elif isinstance(value, Optimizer):
            optimizers.append((root, value))
        elif isinstance(value, (list, tuple)) and len(value) <= 64:
            for index, item in enumerate(value):
                if isinstance(item, Tensor):
                    name_tensor(item, f"{root}.{index}")
    for root, optimizer in optimizers:  # state is named after the parameter it belongs to
        for index, (param, state) in enumerate(optimizer.state.items()):
            owner = names.get(id(param), f"param{index}")
            for key, item in state.items():
                if isinstance(item, Tensor):
                    names.setdefault(id(item), f"{root}.state.{owner}.{key}")
    return names


def name_captured_inputs(trace) -> None:
    """Rename a trace's captured inputs (`%c0`, ...) after the tensors they are, when known."""
    unnamed = [(tensor, value) for tensor, value in trace.captured.values()
               if value.name is None or _AUTO_CAPTURE_NAME.match(value.name)]
    if not unnamed:
        return
    try:
        names = tensor_names(trace.compiled.fn)
    except Exception:  # noqa: BLE001 - names are a courtesy; never fail a compiled call over one
        return
    for tensor, value in unnamed:
        found = names.get(id(tensor))
        if found is not None:
            value.name = found


def _result_paths(value, path: str, found: dict[int, str]) -> None:
    from tracegrad.tensor import Tensor
    if isinstance(value, Tensor):
        found.setdefault(id(value), path)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _result_paths(item, f"{path}.{index}", found)
    elif isinstance(value, dict):
        for key, item in value.items():
            _result_paths(item, f"{path}.{key}", found)


def name_outputs(trace, graph) -> None:
    """Set `graph.output_names` (printed after `return`): `result`, `result.0` for what the
    function returned, `model.fc.weight.grad` for a gradient, the target's name for an
    in-place update. Only the graph run at the end of a call has them."""
    alive, writes = trace.output_tensors
    if not alive and not writes:
        return
    known: dict[int, str] = {}
    _result_paths(trace.result, "result", known)
    try:
        reachable = tensor_names(trace.compiled.fn)
    except Exception:  # noqa: BLE001 - names are a courtesy; never fail over one
        reachable = {}
    for tensor, _, value in trace.arguments:
        reachable.setdefault(id(tensor), value.name)
    by_value: dict = {}
    for target, value in writes:
        by_value.setdefault(value, reachable.get(id(target)))
    for tensor, value in alive:
        by_value.setdefault(value, known.get(id(tensor)) or reachable.get(id(tensor)))
    # (A graph cut from the traced one, the rest of a call that realized values, names the
    # traced values its outputs stand for.)
    outputs = getattr(graph, "traced_outputs", graph.outputs)
    names = [_UNSAFE.sub("_", by_value.get(value) or "") for value in outputs]
    graph.output_names = names if any(names) else None
