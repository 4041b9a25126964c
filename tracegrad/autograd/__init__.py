"""Autograd: `backward`/`grad`, the reverse-mode transform (`backward_graph`), custom
`Function`, gradcheck, `Variable`, and grad mode (defined below tensors, in
`tracegrad.grad_mode`, and named here as in PyTorch: `tg.autograd.no_grad`,
`tracegrad.autograd.grad_mode`).

Names are loaded on first use (then bound here), so importing the package stays cheap.
"""

import importlib
import sys
import types

from tracegrad import grad_mode

sys.modules[__name__ + ".grad_mode"] = grad_mode  # `from torch.autograd.grad_mode import ...`

_EXPORTS = {
    "backward": "engine", "grad": "engine",
    "Function": "function", "FunctionCtx": "function",
    "GradcheckError": "gradcheck", "gradcheck": "gradcheck", "gradgradcheck": "gradcheck",
    "enable_grad": "grad_mode", "inference_mode": "grad_mode", "is_grad_enabled": "grad_mode",
    "no_grad": "grad_mode", "set_grad_enabled": "grad_mode",
    "backward_graph": "autodiff",
    "Variable": "variable",
}


class _AutogradModule(types.ModuleType):
    """`gradcheck` names a submodule and a function, as in PyTorch. Importing the submodule
    would bind the module over the function; keep the function reachable instead."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and _EXPORTS.get(name) == name:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _AutogradModule


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tracegrad.autograd' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"tracegrad.autograd.{module}"), name)
    # Bound in the module's namespace (past the submodule guard above), so later lookups,
    # `tg.autograd.grad` in a training loop, skip this loader: it costs about a microsecond.
    globals()[name] = value
    return value


def __dir__():
    return sorted(_EXPORTS)
