"""`Optimizer`: parameter groups, per-parameter state, `zero_grad`, `state_dict` and
`load_state_dict` (PyTorch's structure). The update rules live in `sgd.py`, `adam.py`,
`adam_variants.py`, `rmsprop.py` and `lbfgs.py`.

PyTorch's keywords that choose how an update runs (`foreach`, `fused`, `capturable`) are
accepted and kept in each group as PyTorch keeps them (`implementation_options`).

Update rules read hyperparameters as Python floats and pass them to tensor ops as operands
(`p.add_(d_p, alpha=-lr)`), never as op attributes: inside `tg.compile` a Python scalar
operand becomes a 0-d runtime input, so a learning rate schedule does not recompile.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from itertools import chain
from typing import Any

from tracegrad.functional._util import composite, scalar_tensor
from tracegrad.functional.fused_update import update_in_place
from tracegrad.grad_mode import MODE, enable_grad, no_grad
from tracegrad.tensor import Tensor

ParamsT = Iterable[Tensor] | Iterable[dict[str, Any]]


class Optimizer:
    """Base class: holds `param_groups` (dicts with `params` and hyperparameters) and
    `state` (a dict per parameter, keyed by the parameter itself as in PyTorch)."""

    def __init__(self, params: ParamsT, defaults: dict[str, Any]):
        self.defaults = defaults
        # Keyed by the parameter itself, as PyTorch (`optimizer.state[p]`); Tensor hashes by id.
        self.state: dict[Tensor, dict[str, Any]] = {}
        self.param_groups: list[dict[str, Any]] = []
        if isinstance(params, Tensor):  # list(tensor) would iterate its rows
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            f"Tensors or dicts, but got {type(params).__name__}")
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        for group in groups:
            self.add_param_group(dict(group))

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {key}: {value}" for key, value in sorted(group.items()) if key != "params"]
        return "\n".join(lines + [")"])

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters, with hyperparameters that default to the optimizer's."""
        params = param_group["params"]
        param_group["params"] = [params] if isinstance(params, Tensor) else list(params)
        for p in param_group["params"]:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, but one of the params is {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        present = {id(p) for other in self.param_groups for p in other["params"]}
        if any(id(p) in present for p in param_group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        for key, value in self.defaults.items():
            param_group.setdefault(key, value)
        self.param_groups.append(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of all parameters: to None (default) or to zeros."""
        tracer = MODE.tracer
        for group in self.param_groups:
            for p in group["params"]:
                if p._grad is None:
                    continue
                if set_to_none:
                    if tracer is not None:
                        tracer.note_grad(p)
                    p._grad = None
                else:
                    p._grad.zero_()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update the parameters once; `closure` re-evaluates the loss and returns it."""
        raise NotImplementedError

    def _state_of(self, p: Tensor) -> dict[str, Any]:
        """`state[p]` (made empty if new), about to be updated. Inside a compiled call the
        trace notes it as it was, to put back if the call fails and cannot be finished."""
        tracer = MODE.tracer
        if tracer is not None:
            tracer.note_change(self.state, p)
        return self.state.setdefault(p, {})

    @staticmethod
    def _evaluate_closure(closure: Callable[[], Any] | None) -> Any:
        if closure is None:
            return None
        with enable_grad():  # the closure calls backward(): it needs grad mode
            return closure()

    # --- checkpoints ---------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state as PyTorch lays it out: `{'state': {index: {...}},
        'param_groups': [{..., 'params': [indices]}]}`, parameters numbered in group order.
        The state tensors are the optimizer's own (not copies), as in PyTorch."""
        index: dict[int, int] = {}
        packed_groups = []
        for group in self.param_groups:
            packed = {key: value for key, value in group.items() if key != "params"}
            for p in group["params"]:
                index.setdefault(id(p), len(index))
            packed["params"] = [index[id(p)] for p in group["params"]]
            packed_groups.append(packed)
        packed_state = {index[id(p)]: state for p, state in self.state.items() if id(p) in index}
        return {"state": packed_state, "param_groups": packed_groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a `state_dict()`: hyperparameters per group and per-parameter state. State
        tensors are copied (cast to their parameter's dtype), so the optimizer never writes
        into the dict it was given."""
        saved_groups = copy.deepcopy(state_dict["param_groups"])
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        for group, saved in zip(self.param_groups, saved_groups):
            if len(group["params"]) != len(saved["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't match "
                                 "the size of optimizer's group")
        params_by_index = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                                   chain.from_iterable(g["params"] for g in self.param_groups)))
        self.state = {}
        for index, saved_state in state_dict["state"].items():
            param = params_by_index.get(index)
            if param is None:
                raise ValueError(f"loaded state dict has state for parameter {index}, which no group holds")
            self.state[param] = {key: _cast_state(param, key, value) for key, value in saved_state.items()}
        for group, saved in zip(self.param_groups, saved_groups):
            saved["params"] = group["params"]
            group.clear()
            group.update(saved)


class PerParameterOptimizer(Optimizer):
    """`step()` calls `_update(p, grad, group)` for every parameter that has a gradient,
    with the gradient negated when the group maximizes."""

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = self._evaluate_closure(closure)
        with grouped_updates():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        self._update(p, -p.grad if group["maximize"] else p.grad, group)
        return loss

    def _update(self, p, grad, group: dict[str, Any]) -> None:
        raise NotImplementedError


def implementation_options(name: str, **options: Any) -> dict[str, Any]:
    """PyTorch's keywords that choose how an optimizer's update runs, not what it computes
    (`foreach`, `fused`, `capturable`, as `name`'s constructor takes them), as the entries
    PyTorch keeps in each parameter group. tracegrad has one implementation for all of them
    (fused where that pays: `write_new_values`), so they change nothing else;
    `differentiable=True` (autograd through the update) is refused, as are `fused` and
    `foreach` both True (PyTorch's error)."""
    if options.get("differentiable"):
        raise NotImplementedError(f"{name}: differentiable=True (a step that autograd differentiates through) is "
                                  "not supported; tracegrad's optimizer steps run under no_grad")
    if options.get("fused") and options.get("foreach"):
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
    return options


def write_new_values(values: Callable[..., tuple], targets: tuple, *args: Any) -> None:
    """Write `values(*args)`, new values of `targets` (tensors among `args`: a parameter
    and its state), over those tensors. On large eager tensors one fused program stores
    them in place (`functional/fused_update.py`); otherwise they are computed op by op and
    copied (a compiled step fuses those copies into its kernels' stores). Inside
    `grouped_updates` in a trace, the call waits for the block's end, to run in a group."""
    calls = _GROUPING.calls
    if calls is not None and MODE.tracer is not None:
        written = _GROUPING.written
        if written and not written.isdisjoint(map(id, args)):  # (only tensors' ids are in it)
            _run_calls(calls)  # (it reads what an earlier update writes: those are written first)
            calls.clear()
            _GROUPING.written.clear()
        calls.append((values, targets, args))
        _GROUPING.written.update(id(target) for target in targets)
        return
    if update_in_place(values, args, targets):
        return
    write_values(targets, values(*args), args)


# Whether a traced optimizer step runs its parameters' updates as one composite per update
# function (`grouped_updates`): a followed compiled call then takes each in one step.
GROUP_UPDATES = True


class _Grouping(threading.local):
    def __init__(self):
        self.calls: list | None = None  # the `write_new_values` calls of the open block
        self.written: set[int] = set()  # ids of the tensors they write
        self.scalars: dict = {}  # the open block's 0-d tensors of numbers (`update_scalar`)


_GROUPING = _Grouping()


@contextmanager
def grouped_updates():
    """In a trace, collect the block's `write_new_values` calls and run them at its end, one
    composite per run of calls of one update function (`_grouped`), the new values then
    written tensor by tensor: a compiled step following an earlier one takes a whole group
    of parameters' updates in one step instead of one composite per parameter (W7's AdamW,
    28 parameters in two groups: 1.37 -> 0.8 ms). A call that reads a tensor an earlier
    collected call writes runs after those are written. Outside a trace: nothing."""
    if MODE.tracer is None or _GROUPING.calls is not None or not GROUP_UPDATES:
        yield
        return
    calls = _GROUPING.calls = []
    try:
        yield
        _run_calls(calls)
    finally:
        _GROUPING.calls = None
        _GROUPING.written.clear()
        _GROUPING.scalars.clear()


def update_scalar(value: float, dtype, group: dict, role: str) -> Tensor:
    """The 0-d tensor of a number an update of `group`'s parameters reads in place `role`
    (a step size, a bias correction, a beta: `scalar_tensor`), one per (group, role,
    number, dtype) within a traced `grouped_updates` block: a group's parameters share
    their step's numbers, so the step's composite reads each once instead of once per
    parameter (W7's AdamW: 8 numbers instead of 224 inputs to follow and feed per step).
    Numbers of different roles or groups stay apart even when equal (AdamW's decay
    1 - 0.01 * 0.1 is beta2 = 0.999 until a scheduler changes the lr), so the step's
    graph does not change with their values. Outside such a block, a new one each time."""
    scalars = _GROUPING.scalars if _GROUPING.calls is not None else None
    if scalars is None:
        return scalar_tensor(value, dtype)
    key = (id(group), role, value.__class__, value if value else str(value), dtype)  # (0.0 and -0.0 apart)
    found = scalars.get(key)
    if found is None:
        found = scalars[key] = scalar_tensor(value, dtype)
    return found


_TENSOR = ("tensor",)  # a tensor argument's place in a call's pattern (a constant: ("constant", value))


def _run_calls(calls: list) -> None:
    """Run collected `write_new_values` calls: each run of calls of one update function
    whose constant arguments are the same objects in the same places (a group's
    hyperparameters) as one grouped composite (`_grouped`), then their new values written
    in order."""
    start = 0
    while start < len(calls):
        values, _, first = calls[start]
        end = start + 1
        while end < len(calls) and calls[end][0] is values and _alike(calls[end][2], first):
            end += 1
        if end - start == 1:
            _, targets, args = calls[start]
            write_values(targets, values(*args), args)
        else:
            run = calls[start:end]
            pattern = tuple(_TENSOR if isinstance(arg, Tensor) else ("constant", arg) for arg in first)
            tensors = [arg for _, _, args in run for arg in args if isinstance(arg, Tensor)]
            new = _grouped(values)(end - start, pattern, *tensors)
            position = 0
            for _, targets, args in run:
                write_values(targets, new[position:position + len(targets)], args)
                position += len(targets)
        start = end


def _alike(args: tuple, first: tuple) -> bool:
    """Whether an update call's arguments are `first`'s but for its tensors: each constant
    the same object (so the same value to the bit), each tensor in a tensor's place."""
    if len(args) != len(first):
        return False
    for arg, other in zip(args, first):
        if arg is not other and not (isinstance(arg, Tensor) and isinstance(other, Tensor)):
            return False
    return True


_GROUPED: dict = {}  # update function -> its grouped composite (one identity per function)


def _grouped(values: Callable[..., tuple]) -> Callable[..., tuple]:
    """The composite running `values` (a composite's body) `count` times, each call's
    arguments laid out by `pattern` (`_TENSOR` where the next of `tensors` goes, else the
    constant); the results in turn."""
    grouped = _GROUPED.get(values)
    if grouped is None:
        body = getattr(values, "__wrapped__", values)

        def run(count: int, pattern: tuple, *tensors: Tensor) -> tuple:
            results: list = []
            position = 0
            for _ in range(count):
                args = []
                for entry in pattern:
                    if entry is _TENSOR:
                        args.append(tensors[position])
                        position += 1
                    else:
                        args.append(entry[1])
                results += body(*args)
            return tuple(results)

        run.__name__ = run.__qualname__ = f"{body.__name__}_group"
        grouped = _GROUPED.setdefault(values, composite(run))
    return grouped


def update_factors(group: dict, dtype, factors: dict[str, float]) -> tuple:
    """An update's factors by role (a momentum, 1 - rho, a weight decay: what PyTorch's
    `add(x, alpha=factor)` multiplies by), each None where PyTorch multiplies by nothing (a
    factor of 1) and, inside a traced `grouped_updates` block, the group's one 0-d tensor
    of the number (`update_scalar`); else the number. `scaled` applies one."""
    traced = _GROUPING.calls is not None
    return tuple(None if factor == 1 else update_scalar(factor, dtype, group, role) if traced else factor
                 for role, factor in factors.items())


def update_number(group: dict, dtype, role: str, number: float):
    """A number an update adds (an eps): the group's 0-d tensor of it inside a traced
    `grouped_updates` block (`update_scalar`), else the number."""
    return update_scalar(number, dtype, group, role) if _GROUPING.calls is not None else number


def scaled(x: Tensor, factor) -> Tensor:
    """x * factor, x itself for a None factor (`update_factors`)."""
    return x if factor is None else x * factor


def write_values(targets: tuple, new: tuple, args) -> None:
    """Write the new values `new` over `targets` (`write_new_values`); `args`: what they
    were computed from."""
    for target, value in zip(targets, new):
        if (value.__class__ is Tensor and value._type == target._type and value._base is None
                and not any(value is arg for arg in args) and sum(value is other for other in new) == 1):
            target._assign_new_value(value)  # (a new value nothing else holds: no copy of it first)
        else:
            target.copy_(value)


def state_number(value: Any) -> float | int:
    """A step count (or NAdam's momentum product) kept in the state as a Python number; a
    state loaded from PyTorch holds it as a 0-d tensor."""
    return value.item() if isinstance(value, Tensor) else value


def _cast_state(param: Tensor, key: str, value: Any) -> Any:
    if not isinstance(value, Tensor):
        return copy.deepcopy(value)
    if key == "step":  # PyTorch keeps step counters as they are
        return value.detach().clone()
    return value.detach().to(param.dtype).clone()
