"""`Optimizer`: parameter groups, per-parameter state and `zero_grad`."""

from __future__ import annotations

from tracegrad.tensor import Tensor


class Optimizer:
    def __init__(self, params, defaults: dict):
        self.defaults = defaults
        # Keyed by the parameter itself, as PyTorch (`optimizer.state[p]`); Tensor hashes by id.
        self.state: dict[Tensor, dict] = {}
        self.param_groups: list[dict] = []
        if isinstance(params, Tensor):  # list(tensor) would iterate its rows
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            f"Tensors or dicts, but got {type(params).__name__}")
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        for group in groups:
            self.add_param_group(dict(group))

    def add_param_group(self, group: dict) -> None:
        params = group["params"]
        group["params"] = [params] if isinstance(params, Tensor) else list(params)
        for p in group["params"]:
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        present = {id(p) for other in self.param_groups for p in other["params"]}
        if any(id(p) in present for p in group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p._grad is None:
                    continue
                if set_to_none:
                    p._grad = None
                else:
                    p._grad.zero_()

    def step(self, closure=None):
        raise NotImplementedError
