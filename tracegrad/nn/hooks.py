"""Module hooks: `RemovableHandle` (what `register_forward_hook` and friends return) and
`call_with_hooks`, which runs a module's forward between its forward-pre hooks and its
forward hooks with PyTorch's arguments, order (`prepend`) and return-value rules; backward
hooks pass the module's inputs and outputs through an identity `autograd.Function` whose
backward hands their gradients to the hooks (as PyTorch's `BackwardHook`)."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import Any

from tracegrad.autograd.function import Function
from tracegrad.grad_mode import is_grad_enabled
from tracegrad.tensor import Tensor

_ids = itertools.count()


class RemovableHandle:
    """Removes its hook from the dicts it was added to (`handle.remove()`, or leaving a
    `with handle:` block)."""

    def __init__(self, *hooks_dicts: OrderedDict, extra_dicts: tuple[dict, ...] = ()):
        self.id = next(_ids)
        self._dicts = hooks_dicts + extra_dicts

    def remove(self) -> None:
        for hooks in self._dicts:
            hooks.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc_info) -> None:
        self.remove()


def add_hook(hooks: OrderedDict, hook, prepend: bool, flags: dict[int, Any] | None = None,
             flag: Any = None) -> RemovableHandle:
    """Put `hook` in `hooks` (first if `prepend`), and its option in `flags`."""
    handle = RemovableHandle(hooks, extra_dicts=(flags,) if flags is not None else ())
    hooks[handle.id] = hook
    if prepend:
        hooks.move_to_end(handle.id, last=False)
    if flags is not None and flag:
        flags[handle.id] = flag
    return handle


def call_with_hooks(module, args: tuple, kwargs: dict) -> Any:
    """Forward-pre hooks may replace the arguments (a non-tuple result becomes the one
    argument; with `with_kwargs`, a pair (args, kwargs)); forward hooks may replace the
    result. A hook registered with `always_call` runs even if forward raises."""
    for hook_id, hook in list(module._forward_pre_hooks.items()):
        if hook_id in module._forward_pre_hooks_with_kwargs:
            result = hook(module, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise RuntimeError("forward pre-hook must return None or a tuple of (new_args, new_kwargs), "
                                       f"but got {result}.")
                args, kwargs = result
        else:
            result = hook(module, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    called = set()
    try:
        if module._backward_hooks or module._backward_pre_hooks:
            output = _with_backward_hooks(module, args, lambda new_args: module.forward(*new_args, **kwargs))
        else:
            output = module.forward(*args, **kwargs)
        for hook_id, hook in list(module._forward_hooks.items()):
            called.add(hook_id)
            if hook_id in module._forward_hooks_with_kwargs:
                result = hook(module, args, kwargs, output)
            else:
                result = hook(module, args, output)
            if result is not None:
                output = result
    except Exception:
        for hook_id, hook in list(module._forward_hooks.items()):
            if hook_id in module._forward_hooks_always_called and hook_id not in called:
                try:
                    if hook_id in module._forward_hooks_with_kwargs:
                        hook(module, args, kwargs, None)
                    else:
                        hook(module, args, None)
                except Exception:  # noqa: BLE001 - the forward's own error is the one to raise
                    pass
        raise
    return output


class _BackwardHookBoundary(Function):
    """Identity on its tensors; in backward it hands their gradients to `on_backward`,
    which may replace them. One node for all the tensors, so the callback sees every
    gradient of a module's inputs (or outputs) at once."""

    @staticmethod
    def forward(ctx, on_backward, *tensors):
        ctx.on_backward = on_backward
        return tensors if len(tensors) > 1 else tensors[0]

    @staticmethod
    def backward(ctx, *grads):
        return (None,) + tuple(ctx.on_backward(grads))


def _with_backward_hooks(module, args: tuple, run_forward) -> Any:
    """Run `run_forward(args)` with the module's inputs and outputs passed through
    boundaries: the outputs' gradients go through the backward-pre hooks, then, once the
    inputs' gradients are known, the backward hooks get (grad_input, grad_output)."""
    positions = [i for i, arg in enumerate(args) if isinstance(arg, Tensor)]
    differentiable = [i for i in positions if args[i].requires_grad]
    state: dict[str, Any] = {}

    def call_hooks(grad_input: tuple) -> tuple:
        for hook in list(module._backward_hooks.values()):
            result = hook(module, grad_input, state["grad_output"])
            if result is not None:
                result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
                if len(result) != len(grad_input):
                    raise RuntimeError(f"Backward hook returned an invalid number of grad_input, got "
                                       f"{len(result)}, but expected {len(grad_input)}")
                grad_input = result
        return grad_input

    def on_input_grads(grads: tuple) -> tuple:
        by_position = dict(zip(differentiable, grads))
        grad_input = call_hooks(tuple(by_position.get(i) for i in positions))
        return tuple(grad_input[positions.index(i)] for i in differentiable)

    def on_output_grads(grads: tuple) -> tuple:
        for hook in list(module._backward_pre_hooks.values()):
            result = hook(module, grads)
            if result is not None:
                grads = tuple(result) if isinstance(result, (tuple, list)) else (result,)
        state["grad_output"] = grads
        if not differentiable:  # no input gradient will come: call the hooks now, as PyTorch
            call_hooks(tuple(None for _ in positions))
        return grads

    if differentiable and is_grad_enabled():
        wrapped = _BackwardHookBoundary.apply(on_input_grads, *[args[i] for i in differentiable])
        wrapped = wrapped if isinstance(wrapped, tuple) else (wrapped,)
        args = list(args)
        for i, tensor in zip(differentiable, wrapped):
            args[i] = tensor
        args = tuple(args)
    output = run_forward(args)
    single = isinstance(output, Tensor)
    outputs = (output,) if single else output
    if not (isinstance(outputs, tuple) and is_grad_enabled()):
        return output
    tracked = [i for i, out in enumerate(outputs) if isinstance(out, Tensor) and out.requires_grad]
    if not tracked:
        return output
    wrapped = _BackwardHookBoundary.apply(on_output_grads, *[outputs[i] for i in tracked])
    wrapped = wrapped if isinstance(wrapped, tuple) else (wrapped,)
    outputs = list(outputs)
    for i, tensor in zip(tracked, wrapped):
        outputs[i] = tensor
    return outputs[0] if single else tuple(outputs)
